/*
 * zpp_comm_shrink: the survivors of a failure agree on who is alive and
 * build a communicator of exactly them (docs/api.md, "Shrinking after a
 * failure"; the guarantees are in <zpp/zpp_comm.h>).
 *
 * Why its own sockets: the old communicator's bootstrap may be a star
 * whose root died, its backend may hang on the dead peer, and MPI may
 * abort.  So every communicator keeps, from its creation, one listening
 * socket per rank (the rescue listener, comm/rescue.c); the addresses
 * travel in the first creation exchange.  A dead process's socket refuses connections: that
 * is the only proof of death the protocol uses.  No answer, a failure on
 * this host (EMFILE, EADDRNOTAVAIL, ENETUNREACH) or a closed connection
 * proves nothing: the connection is tried again until the deadline.
 *
 * The protocol (one round, through a coordinator):
 *   - coordinator: the lowest rank not proven dead.  A survivor connects
 *     to ranks 0, 1, ... in turn; a refusal marks that rank dead.  It
 *     sends JOIN on the first that accepts and waits for the decision; a
 *     connection that closes first is opened again (a coordinator that
 *     died refuses it, and the next lowest, which sees the same, takes
 *     over).  A rank that a lower rank probes never coordinates.
 *   - the coordinator probes every higher rank neither joined nor dead (a
 *     connection carrying PROBE, held open, opened again when it closes)
 *     until all are joined or dead, or its join window ends; it then reads
 *     whatever already waits before deciding;
 *   - decision: members = the joined ranks in rank order (the coordinator
 *     first).  It listens on a new TCP star, sends DECIDE (members, the
 *     star's id) to each member and EXCLUDED on the probes of the live
 *     ranks that did not join (a late rank reads it from its listener's
 *     queue when it calls shrink, and fails instead of waiting) and on
 *     JOINs of ranks it found dead.  Every rank answers the JOINs it holds
 *     when it leaves (EXCLUDED naming the coordinator, or FAIL with its
 *     error), so no survivor reads a silent close;
 *   - commit: the members create the new communicator over that star; its
 *     creation exchanges agree on failure, so a member that dies from the
 *     decision on fails every member (ZPP_ERR_PEER_FAILED).
 * Messages: comm/tcp.h's header, then sh_who_t (and the decision).
 */
#include "comm/comm.h"

#include "comm/comm_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/rescue.h"
#include "comm/shrink_report.h"
#include "comm/tcp.h"
#include "core/core.h"
#include "transport/transport_impl.h"

void (*zpp_shrink_test_hook)(int rank, const char *point) = NULL;
int (*zpp_shrink_test_connect)(int rank, int to) = NULL;

static void hook(int rank, const char *point) {
  if (zpp_shrink_test_hook != NULL)
    zpp_shrink_test_hook(rank, point);
}

enum {
  SH_JOIN = 32,     /* participant -> coordinator */
  SH_PROBE = 33,    /* coordinator -> a rank that has not joined */
  SH_DECIDE = 34,   /* coordinator -> member: members and the star's id */
  SH_EXCLUDED = 35, /* coordinator -> a live rank that did not join */
  SH_FAIL = 36      /* coordinator -> member: it could not decide (text) */
};

/* Seconds the probe of the members after a failed creation tries at most
 * (a refusal takes one round trip), and the creation ends that much before
 * the call's deadline: a creation that returns late on a loaded host
 * still leaves the probe time, and the probe never passes the deadline. */
#define SH_PROBE_S 0.3

typedef struct {
  uint64_t epoch;
  int32_t rank, pid;
} sh_who_t;

/* ---- one call's state --------------------------------------------------- */

enum {
  K_NEW,    /* accepted, no message read yet */
  K_JOIN,   /* a rank that joined me (peer) */
  K_PROBED, /* a coordinator's probe of me (peer: the coordinator) */
  K_PROBE   /* my probe of peer (connecting while `pending`) */
};

typedef struct {
  int fd, peer, kind, pending;
  int64_t t0; /* opened (a probe that connects for 2 s is tried again) */
} conn_t;

typedef struct {
  struct zpp_rescue *rs;
  const char *func;
  int me, n;
  int64_t deadline;
  double bound_s, join_s;
  char *dead, *joined; /* [n]; dead: its listener refused (the only proof) */
  int64_t *retry;      /* [n] a probe of that rank starts no sooner */
  conn_t *cv;
  struct pollfd *pf; /* [cap + 2] */
  int nc, cap;
  int64_t listen_rest; /* accept failed (no descriptor): not polled until */
  int err, err_rank;   /* the last connection that failed here (errno) */
  size_t msg_cap;
  char *msg; /* a received message's payload (msg_cap bytes) */
  int coord; /* the rank whose decision this rank took */
  int nmem;  /* the decision */
  int *mem;  /* [n] */
  zpp_unique_id_t id;
} sh_t;

static int64_t soon(const sh_t *s, double secs) {
  int64_t t = zpp_time_ns() + (int64_t)(secs * 1e9);
  return t < s->deadline ? t : s->deadline;
}

/* A connection refused, or reset while connecting: the rank's listener is
 * closed, so its process is gone.  Anything else (no answer, no local
 * port or descriptor, no route) proves nothing about the rank. */
static int refused(int e) { return e == ECONNREFUSED || e == ECONNRESET; }

static void drop(sh_t *s, int i) {
  close(s->cv[i].fd);
  s->cv[i] = s->cv[--s->nc];
}

static int add_conn(sh_t *s, int fd, int peer, int kind, int pending) {
  if (s->nc == s->cap) {
    int cap = 2 * s->cap;
    conn_t *cv = realloc(s->cv, (size_t)cap * sizeof *cv);
    struct pollfd *pf;
    if (cv != NULL)
      s->cv = cv;
    pf = cv != NULL ? realloc(s->pf, ((size_t)cap + 2) * sizeof *pf) : NULL;
    if (pf == NULL) {
      close(fd); /* out of memory: as if it never came */
      return -1;
    }
    s->pf = pf;
    s->cap = cap;
  }
  s->cv[s->nc].fd = fd;
  s->cv[s->nc].peer = peer;
  s->cv[s->nc].kind = kind;
  s->cv[s->nc].pending = pending;
  s->cv[s->nc].t0 = zpp_time_ns();
  return s->nc++;
}

/* Starts a non-blocking connection to rank r's listener: 0 connected, 1
 * in progress, -1 refused (r is dead), -2 failed here (s->err says why;
 * r may well be alive). */
static int connect_start(sh_t *s, int r, int *fd) {
  struct sockaddr_in sa;
  int f = -1, e = 0;
  *fd = -1;
  if (zpp_shrink_test_connect != NULL)
    e = zpp_shrink_test_connect(s->me, r);
  if (e == 0) {
    f = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (f < 0)
      e = errno;
  }
  if (e == 0) {
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = s->rs->ip[r];
    sa.sin_port = htons(s->rs->port[r]);
    if (connect(f, (struct sockaddr *)&sa, sizeof sa) == 0) {
      zpp_tcp_set_sockopts(f);
      *fd = f;
      return 0;
    }
    if (errno == EINPROGRESS || errno == EINTR) {
      *fd = f;
      return 1;
    }
    e = errno;
    close(f);
  }
  if (refused(e))
    return -1;
  s->err = e;
  s->err_rank = r;
  return -2;
}

static int connect_error(int fd) {
  int e = 0;
  socklen_t el = sizeof e;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
    return errno;
  return e;
}

static int send_who(const sh_t *s, int fd, uint32_t type, const void *extra,
                    size_t len, int64_t deadline) {
  sh_who_t w = {s->rs->epoch, s->me, (int32_t)getpid()};
  return zpp_tcp_send_msg(fd, type, 0, &w, sizeof w, extra, len, deadline);
}

/* EXCLUDED carries the rank that decided (int32). */
static void send_excluded(const sh_t *s, int fd, int coord) {
  int32_t c = coord;
  send_who(s, fd, SH_EXCLUDED, &c, sizeof c, soon(s, 1.0));
}

static zpp_status_t excluded(const sh_t *s, int from, size_t len) {
  int32_t c = from;
  if (len >= sizeof c)
    memcpy(&c, s->msg, sizeof c);
  return zpp_error(ZPP_ERR_EXCLUDED, s->func,
                   "rank %d decided the new communicator without this rank "
                   "%d (told by rank %d): this rank was not joined to it at "
                   "the decision (it called zpp_comm_shrink after the "
                   "decision, or could not reach rank %d in time)",
                   (int)c, s->me, from, (int)c);
}

/* One message: 0 ok (header in *h, who in *w, the rest in s->msg, its
 * length in *len), -2 closed, 1 timed out, -1 error or not ours (another
 * communicator's epoch, a bad header). */
static int recv_one(sh_t *s, int fd, zpp_tcp_msg_hdr_t *h, sh_who_t *w,
                    size_t *len) {
  int64_t dl = soon(s, 2.0);
  int rc = zpp_tcp_recv_all(fd, h, sizeof *h, dl);
  if (rc != 0)
    return rc;
  if (h->magic != ZPP_TCP_MSG_MAGIC || h->len < sizeof *w ||
      h->len - sizeof *w > s->msg_cap)
    return -1;
  rc = zpp_tcp_recv_all(fd, w, sizeof *w, dl);
  if (rc == 0)
    rc = zpp_tcp_recv_all(fd, s->msg, h->len - sizeof *w, dl);
  if (rc != 0)
    return rc;
  if (w->epoch != s->rs->epoch || w->rank < 0 || w->rank >= s->n)
    return -1;
  *len = h->len - sizeof *w;
  return 0;
}

/* Accepts what waits on my listener.  Out of descriptors, the listener
 * rests 100 ms (it stays readable: polling it would spin). */
static void accept_all(sh_t *s) {
  for (;;) {
    int fd = accept4(s->rs->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM)
        s->listen_rest = zpp_time_ns() + 100000000;
      return;
    }
    zpp_tcp_set_sockopts(fd);
    add_conn(s, fd, -1, K_NEW, 0);
  }
}

/* The decision as received (payload after sh_who_t): int32 n, n ranks,
 * the id.  Checked: ranks ascending, in range, mine among them. */
static zpp_status_t take_decision(sh_t *s, int from, size_t len) {
  int32_t n;
  int i, mine = 0;
  if (len < sizeof n)
    goto bad;
  memcpy(&n, s->msg, sizeof n);
  if (n < 1 || n > s->n ||
      len != sizeof n + (size_t)n * sizeof(int32_t) + sizeof s->id)
    goto bad;
  for (i = 0; i < n; i++) {
    int32_t r;
    memcpy(&r, s->msg + sizeof n + (size_t)i * sizeof r, sizeof r);
    if (r < 0 || r >= s->n || (i > 0 && r <= s->mem[i - 1]))
      goto bad;
    s->mem[i] = r;
    mine |= r == s->me;
  }
  if (!mine)
    goto bad;
  s->nmem = n;
  memcpy(&s->id, s->msg + sizeof n + (size_t)n * sizeof(int32_t), sizeof s->id);
  return ZPP_OK;
bad:
  return zpp_error(ZPP_ERR_INTERNAL, s->func,
                   "the decision of rank %d is malformed (%zu bytes)", from,
                   len);
}

/* A message on an accepted connection (any role).  A closed connection is
 * dropped and proves nothing (its rank may have moved on).  Returns an
 * error only for EXCLUDED (this rank is out). */
static zpp_status_t serve(sh_t *s, int i) {
  zpp_tcp_msg_hdr_t h;
  sh_who_t w;
  size_t len = 0;
  conn_t *c = &s->cv[i];
  int rc;
again:
  rc = recv_one(s, c->fd, &h, &w, &len);
  if (rc != 0) {
    drop(s, i);
    return ZPP_OK;
  }
  if (h.type == SH_EXCLUDED) {
    s->coord = w.rank;
    return excluded(s, w.rank, len);
  }
  if (h.type == SH_JOIN && c->kind == K_NEW) {
    c->kind = K_JOIN;
    c->peer = w.rank;
  } else if (h.type == SH_PROBE && c->kind == K_NEW) {
    c->kind = K_PROBED;
    c->peer = w.rank;
  }
  {
    /* a probe and the EXCLUDED after it may both be queued */
    struct pollfd p = {c->fd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0)
      goto again;
  }
  return ZPP_OK;
}

/* My probe of c->peer became ready: connected (PROBE sent), or it failed:
 * refused, the rank is dead; else tried again later.  An open probe that
 * reads end of file or a reset is tried again at once: its rank either
 * refuses (dead) or accepts a new probe. */
static void probe_ready(sh_t *s, int i) {
  conn_t *c = &s->cv[i];
  int q = c->peer;
  if (c->pending) {
    int e = connect_error(c->fd);
    if (e == 0) {
      c->pending = 0;
      zpp_tcp_set_sockopts(c->fd);
      if (send_who(s, c->fd, SH_PROBE, NULL, 0, soon(s, 2.0)) == 0)
        return;
      drop(s, i); /* tried again at once: a dead rank then refuses */
      s->retry[q] = 0;
      return;
    }
    drop(s, i);
    if (refused(e)) {
      s->dead[q] = 1;
    } else {
      s->err = e;
      s->err_rank = q;
      s->retry[q] = zpp_time_ns() + 100000000;
    }
    return;
  }
  {
    char b;
    ssize_t got = recv(c->fd, &b, 1, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      drop(s, i);
      s->retry[q] = 0;
    }
  }
}

/* Polls my listener, the connections and `extra` (-1: none) up to `ms`
 * (cut at the deadline).  *ready: extra became readable (or writable, for
 * ev POLLOUT).  Serves the connections; an error only for EXCLUDED. */
static zpp_status_t step_ms(sh_t *s, int extra, short ev, int *ready, int ms) {
  struct pollfd *pf = s->pf;
  int k = 0, i;
  int64_t now = zpp_time_ns(), left = (s->deadline - now) / 1000000;
  if (left < ms)
    ms = left < 0 ? 0 : (int)left + 1;
  pf[k].fd = now < s->listen_rest ? -1 : s->rs->fd;
  pf[k].events = POLLIN;
  pf[k++].revents = 0;
  for (i = 0; i < s->nc; i++) {
    pf[k].fd = s->cv[i].fd;
    pf[k].events = s->cv[i].pending ? POLLOUT : POLLIN;
    pf[k++].revents = 0;
  }
  pf[k].fd = extra;
  pf[k].events = ev;
  pf[k].revents = 0;
  if (extra >= 0)
    k++;
  *ready = 0;
  if (poll(pf, (nfds_t)k, ms) <= 0)
    return ZPP_OK;
  if (extra >= 0 && pf[k - 1].revents != 0)
    *ready = 1;
  /* connections first (pf[1 + i] is cv[i]; drop() reorders, so walk down) */
  for (i = s->nc - 1; i >= 0; i--) {
    if (pf[1 + i].revents == 0)
      continue;
    if (s->cv[i].kind == K_PROBE)
      probe_ready(s, i);
    else
      ZPP_CHECK(serve(s, i));
  }
  if (pf[0].revents & POLLIN)
    accept_all(s);
  return ZPP_OK;
}

static zpp_status_t step(sh_t *s, int extra, short ev, int *ready) {
  return step_ms(s, extra, ev, ready, 100);
}

/* Waits `ms` serving the connections (a pause before trying again). */
static zpp_status_t rest(sh_t *s, int ms) {
  int64_t until = soon(s, ms * 1e-3);
  int ready;
  while (zpp_time_ns() < until)
    ZPP_CHECK(step_ms(s, -1, 0, &ready,
                      (int)((until - zpp_time_ns()) / 1000000) + 1));
  return ZPP_OK;
}

/* Serves every input already waiting (accepts included), once. */
static zpp_status_t drain(sh_t *s) {
  int i;
  if (zpp_time_ns() >= s->listen_rest)
    accept_all(s);
  for (i = s->nc - 1; i >= 0; i--) {
    struct pollfd p = {s->cv[i].fd, s->cv[i].pending ? POLLOUT : POLLIN, 0};
    if (poll(&p, 1, 0) <= 0)
      continue;
    if (s->cv[i].kind == K_PROBE)
      probe_ready(s, i);
    else
      ZPP_CHECK(serve(s, i));
  }
  return ZPP_OK;
}

/* The call's end without a decision from rank c (the lowest rank not
 * proven dead). */
static zpp_status_t give_up(const sh_t *s, int c) {
  if (s->err != 0 && s->err != ETIMEDOUT && s->err_rank == c)
    return zpp_error(ZPP_ERR_SYSTEM, s->func,
                     "could not reach rank %d, the lowest rank not proven "
                     "dead, within %.3g s: connect: %s (a failure on this "
                     "host, no proof that rank %d died)",
                     c, s->bound_s, strerror(s->err), c);
  return zpp_error(ZPP_ERR_TIMEOUT, s->func,
                   "rank %d, the lowest rank not proven dead, did not decide "
                   "within %.3g s: it is alive but did not call "
                   "zpp_comm_shrink (or called it more than %.3g s after "
                   "this rank), or its host does not answer",
                   c, s->bound_s, s->bound_s - s->join_s);
}

/* ---- participant ----------------------------------------------------------
 * Joins rank c.  Returns ZPP_OK with *decided = 1 (the decision is in s),
 * with s->dead[c] set (c refused), or with neither (no answer, a failure
 * here, or c closed without a word: the caller tries c again), or an
 * error. */
static zpp_status_t follow(sh_t *s, int c, int *decided) {
  int fd, rc, ready = 0;
  *decided = 0;
  rc = connect_start(s, c, &fd);
  if (rc == -1) {
    s->dead[c] = 1;
    return ZPP_OK;
  }
  if (rc == -2)
    return rest(s, 50);
  if (rc == 1) {
    /* a host that is up answers at once (accepted or refused); 2 s
     * without an answer: tried again */
    int64_t until = soon(s, 2.0);
    int e;
    while (!ready && zpp_time_ns() < until) {
      zpp_status_t st = step(s, fd, POLLOUT, &ready);
      if (st != ZPP_OK) {
        close(fd);
        return st;
      }
    }
    e = ready ? connect_error(fd) : ETIMEDOUT;
    if (e != 0) {
      close(fd);
      if (refused(e)) {
        s->dead[c] = 1;
        return ZPP_OK;
      }
      s->err = e;
      s->err_rank = c;
      return rest(s, 50);
    }
    zpp_tcp_set_sockopts(fd);
  }
  if (send_who(s, fd, SH_JOIN, NULL, 0, soon(s, 2.0)) != 0) {
    close(fd); /* tried again: a dead rank then refuses */
    return rest(s, 50);
  }
  hook(s->me, "joined");
  for (;;) {
    zpp_tcp_msg_hdr_t h;
    sh_who_t w;
    size_t len;
    zpp_status_t st;
    if (zpp_time_ns() >= s->deadline) {
      close(fd);
      return give_up(s, c);
    }
    st = step(s, fd, POLLIN, &ready);
    if (st != ZPP_OK) {
      close(fd);
      return st;
    }
    if (!ready)
      continue;
    rc = recv_one(s, fd, &h, &w, &len);
    if (rc == 1)
      continue;
    close(fd);
    if (rc != 0) {
      /* closed before its decision reached me: died (then it refuses)
       * or dropped me (then it takes me again) */
      s->err = 0;
      return rest(s, 10);
    }
    if (h.type == SH_DECIDE) {
      ZPP_CHECK(take_decision(s, c, len));
      s->coord = c;
      *decided = 1;
      return ZPP_OK;
    }
    if (h.type == SH_EXCLUDED) {
      s->coord = c;
      return excluded(s, c, len);
    }
    if (h.type == SH_FAIL) {
      s->msg[len < s->msg_cap ? len : s->msg_cap - 1] = '\0';
      return zpp_error(ZPP_ERR_PEER_FAILED, s->func,
                       "rank %d, whom this rank joined, failed: %s", c, s->msg);
    }
    return zpp_error(ZPP_ERR_INTERNAL, s->func,
                     "rank %d sent message type %u instead of a decision", c,
                     h.type);
  }
}

/* ---- coordinator ----------------------------------------------------------
 */

/* joined[q]: q holds a JOIN connection to me and is not dead. */
static void count_joined(sh_t *s) {
  int i;
  memset(s->joined, 0, (size_t)s->n);
  s->joined[s->me] = 1;
  for (i = 0; i < s->nc; i++)
    if (s->cv[i].kind == K_JOIN && !s->dead[s->cv[i].peer])
      s->joined[s->cv[i].peer] = 1;
}

/* Probes of the higher ranks neither joined nor dead (the lower ones are
 * dead: that is why I coordinate): started where none is open, dropped
 * once their rank joined, tried again after 2 s without a connection. */
static void probe_all(sh_t *s) {
  int64_t now = zpp_time_ns();
  char *open = s->msg; /* [n] scratch: a probe of q is open */
  int q, i;
  memset(open, 0, (size_t)s->n);
  for (i = s->nc - 1; i >= 0; i--) {
    conn_t *c = &s->cv[i];
    if (c->kind != K_PROBE)
      continue;
    if (s->joined[c->peer] || s->dead[c->peer]) {
      drop(s, i);
    } else if (c->pending && now - c->t0 > 2000000000) {
      s->err = ETIMEDOUT;
      s->err_rank = c->peer;
      drop(s, i);
    } else {
      open[c->peer] = 1;
    }
  }
  for (q = s->me + 1; q < s->n; q++) {
    int fd, rc, k;
    if (s->dead[q] || s->joined[q] || open[q] || now < s->retry[q])
      continue;
    rc = connect_start(s, q, &fd);
    if (rc == -1) {
      s->dead[q] = 1;
    } else if (rc == -2) {
      s->retry[q] = now + 100000000;
    } else if ((k = add_conn(s, fd, q, K_PROBE, rc == 1)) >= 0 && rc == 0 &&
               send_who(s, fd, SH_PROBE, NULL, 0, soon(s, 2.0)) != 0) {
      drop(s, k);
      s->retry[q] = now + 100000000;
    }
  }
}

static zpp_status_t coordinate(sh_t *s) {
  int q, i, ready;
  /* the window, cut so that the creation keeps what the first coordinator
   * leaves it (a replacement starts late), yet at least 0.5 s */
  int64_t now = zpp_time_ns();
  int64_t join_end = soon(s, s->join_s);
  int64_t cut = s->deadline - (int64_t)((s->bound_s - s->join_s) * 1e9);
  int64_t least = soon(s, s->join_s < 0.5 ? s->join_s : 0.5);
  zpp_status_t st = ZPP_OK;
  char *payload = NULL;
  size_t plen;
  uint32_t star_ip;
  (void)now;
  if (join_end > cut)
    join_end = cut > least ? cut : least;
  for (;;) {
    int open = 0;
    count_joined(s);
    probe_all(s);
    for (q = s->me + 1; q < s->n; q++)
      open += !s->dead[q] && !s->joined[q];
    if (open == 0 || zpp_time_ns() >= join_end)
      break;
    ZPP_CHECK(step(s, -1, 0, &ready));
  }
  /* what came meanwhile (a JOIN queued, a joined rank that left) */
  ZPP_CHECK(drain(s));
  count_joined(s);
  /* the decision */
  s->nmem = 0;
  for (q = 0; q < s->n; q++)
    if (s->joined[q])
      s->mem[s->nmem++] = q;
  s->coord = s->me;
  hook(s->me, "deciding");
  star_ip = s->rs->self_ip; /* where every member reached my listener */
  st = zpp_tcp_listen(star_ip, 0, zpp_tcp_random_session(), &s->id, s->func);
  plen = sizeof(int32_t) + (size_t)s->nmem * sizeof(int32_t) + sizeof s->id;
  payload = malloc(plen > ZPP_TCP_ERRLEN ? plen : ZPP_TCP_ERRLEN);
  if (st == ZPP_OK && payload == NULL) {
    zpp_tcp_unlisten(&s->id);
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, s->func, "decision");
  }
  if (st == ZPP_OK) {
    int32_t n = s->nmem;
    memcpy(payload, &n, sizeof n);
    for (i = 0; i < s->nmem; i++) {
      int32_t r = s->mem[i];
      memcpy(payload + sizeof n + (size_t)i * sizeof r, &r, sizeof r);
    }
    memcpy(payload + sizeof n + (size_t)s->nmem * sizeof(int32_t), &s->id,
           sizeof s->id);
  } else if (payload != NULL) {
    int k = snprintf(payload, ZPP_TCP_ERRLEN, "%s", zpp_get_last_error());
    plen = (size_t)(k < 0                    ? 0
                    : k < ZPP_TCP_ERRLEN - 1 ? k
                                             : ZPP_TCP_ERRLEN - 1) +
           1;
  }
  /* A member that died since joining fails the creation on every member;
   * sends are bounded and their failures need no answer here.  In rank
   * order (if I die midway, the members reached are the lowest); answered
   * connections are closed. */
  for (q = 0; q < s->nmem; q++)
    for (i = s->nc - 1; i >= 0; i--) {
      conn_t *c = &s->cv[i];
      if (c->kind == K_JOIN && c->peer == s->mem[q]) {
        if (payload != NULL)
          send_who(s, c->fd, st == ZPP_OK ? SH_DECIDE : SH_FAIL, payload, plen,
                   soon(s, 2.0));
        drop(s, i);
        hook(s->me, "decide-one");
      }
    }
  hook(s->me, "decide-sent");
  /* the live ranks that did not join, and joins of ranks proven dead
   * (their listener refused: they cannot be members) */
  for (i = s->nc - 1; i >= 0; i--) {
    conn_t *c = &s->cv[i];
    if ((c->kind == K_PROBE && !c->pending && !s->dead[c->peer]) ||
        c->kind == K_JOIN) {
      send_excluded(s, c->fd, s->me);
      drop(s, i);
    }
  }
  free(payload);
  return st;
}

/* ---- the call --------------------------------------------------------------
 */

/* The new communicator's config: comm's, backend MPI replaced by UCX
 * (it needs MPI, which may not survive), the device comm resolved (a
 * member keeps its GPU though its local rank changes), an emulated node
 * map restricted to the members, the creation bounded by what is left of
 * the call less the reserve of the probe after a failure. */
static zpp_status_t new_config(zpp_comm_t comm, const sh_t *s,
                               zpp_comm_config_t *cfg, char *spec, size_t len) {
  const zpp_transport_t *t = comm->tr;
  double left = (double)(s->deadline - zpp_time_ns()) * 1e-9;
  /* the creation ends SH_PROBE_S before the call's deadline: a failed
   * creation's probe (gone_members) runs in the rest */
  double create_s = left > 2 * SH_PROBE_S ? left - SH_PROBE_S : left / 2;
  *cfg = comm->cfg;
  cfg->backend = t->backend == ZPP_BACKEND_MPI ? ZPP_BACKEND_UCX : t->backend;
  cfg->algorithm = t->algorithm;
  if (comm->cuda_device >= 0)
    cfg->cuda_device = comm->cuda_device;
  cfg->timeout_s = create_s > 0.001 ? create_s : 0.001;
  cfg->topology = NULL;
  spec[0] = '\0';
  if (t->topo->emulated) {
    ZPP_CHECK(
        zpp_comm_child_spec(t->topo, s->mem, s->nmem, spec, len, s->func));
    cfg->topology = spec;
  }
  return ZPP_OK;
}

/* After the agreement: the JOINs still held (ranks that joined me while I
 * followed another) get EXCLUDED naming the rank that decided, or, when
 * this rank failed, FAIL with its error; then every connection closes. */
static void answer_and_close(sh_t *s, zpp_status_t st) {
  int i;
  char why[ZPP_TCP_ERRLEN];
  int k = snprintf(why, sizeof why, "%s", zpp_get_last_error());
  size_t wl = (size_t)(k < 0                     ? 0
                       : k < (int)sizeof why - 1 ? k
                                                 : (int)sizeof why - 1) +
              1;
  /* JOINs that arrived meanwhile (read here, not served: the call's error
   * message stays) */
  if (zpp_time_ns() >= s->listen_rest)
    accept_all(s);
  for (i = s->nc - 1; i >= 0; i--) {
    conn_t *c = &s->cv[i];
    struct pollfd p = {c->fd, POLLIN, 0};
    zpp_tcp_msg_hdr_t h;
    sh_who_t w;
    size_t len;
    if (c->kind == K_NEW && poll(&p, 1, 0) > 0 &&
        recv_one(s, c->fd, &h, &w, &len) == 0 && h.type == SH_JOIN) {
      c->kind = K_JOIN;
      c->peer = w.rank;
    }
    if (c->kind == K_JOIN) {
      if (st == ZPP_OK || st == ZPP_ERR_EXCLUDED)
        send_excluded(s, c->fd, s->coord);
      else
        send_who(s, c->fd, SH_FAIL, why, wl, soon(s, 1.0));
    }
    drop(s, i);
  }
}

/* After a failed creation: the members whose listener now refuses, in
 * gone[] by old rank, ascending (dead, or done with comm: a member that
 * failed the creation sooner may have destroyed it); their count.  The
 * connections are tried together until `end` at most (a refusal takes
 * one round trip): a member that does not answer by then is not named. */
static int gone_members(sh_t *s, int64_t end, int *gone) {
  struct pollfd *pf = s->pf; /* cap + 2 > n entries, unused after the
                                agreement (every connection is closed) */
  int *peer = malloc((size_t)s->n * sizeof *peer);
  char *isgone = s->joined; /* [n] scratch, unused after the agreement */
  int i, k = 0, ng = 0;
  memset(isgone, 0, (size_t)s->n);
  for (i = 0; i < s->nmem; i++) {
    int fd = -1, rc, r = s->mem[i];
    if (r == s->me)
      continue;
    rc = connect_start(s, r, &fd);
    if (rc == -1) {
      isgone[r] = 1;
    } else if (rc == 1 && peer != NULL) {
      pf[k].fd = fd;
      pf[k].events = POLLOUT;
      pf[k].revents = 0;
      peer[k++] = r;
    } else if (fd >= 0) {
      close(fd);
    }
  }
  while (k > 0) {
    int64_t left = (end - zpp_time_ns()) / 1000000;
    int j = 0;
    if (left <= 0 || poll(pf, (nfds_t)k, (int)left) <= 0)
      break;
    for (i = 0; i < k; i++) {
      if (pf[i].revents == 0) {
        pf[j] = pf[i];
        peer[j++] = peer[i];
        continue;
      }
      isgone[peer[i]] = (char)refused(connect_error(pf[i].fd));
      close(pf[i].fd);
    }
    k = j;
  }
  for (i = 0; i < k; i++)
    close(pf[i].fd);
  free(peer);
  for (i = 0; i < s->n; i++)
    if (isgone[i])
      gone[ng++] = i;
  return ng;
}

static zpp_status_t run(zpp_comm_t comm, sh_t *s, int *new_rank_of,
                        zpp_comm_t *newcomm) {
  zpp_status_t st = ZPP_OK;
  zpp_comm_config_t cfg;
  zpp_comm_t nc = NULL;
  char *spec = NULL; /* the emulated node map: one label per member */
  int i, me_new = -1;
  s->coord = -1;
  /* A rank excluded earlier finds the coordinator's EXCLUDED waiting. */
  for (;;) {
    int c, p = s->n, decided = 0;
    st = drain(s);
    if (st != ZPP_OK)
      break;
    for (c = 0; c < s->n && s->dead[c]; c++) {
    }
    /* a lower rank that probes me coordinates: never coordinate past it */
    for (i = 0; i < s->nc; i++)
      if (s->cv[i].kind == K_PROBED && s->cv[i].peer < p)
        p = s->cv[i].peer;
    if (c == s->me && p < s->me)
      c = p;
    if (zpp_time_ns() >= s->deadline) {
      st = give_up(s, c);
      break;
    }
    if (c == s->me) {
      st = coordinate(s);
      break;
    }
    if (s->dead[c]) {
      st = rest(s, 50); /* its probe is open yet: wait for its reset */
      if (st != ZPP_OK)
        break;
    }
    st = follow(s, c, &decided);
    if (st != ZPP_OK || decided)
      break;
  }
  answer_and_close(s, st);
  if (st != ZPP_OK)
    return st;
  hook(s->me, "decided");
  for (i = 0; i < s->nmem; i++)
    if (s->mem[i] == s->me)
      me_new = i;
  ZPP_INFO(ZPP_SUBSYS_INIT,
           "zpp_comm_shrink: %d of %d ranks survive (rank "
           "%d becomes %d; coordinator rank %d)",
           s->nmem, s->n, s->me, me_new, s->mem[0]);
  spec = malloc(12 * (size_t)s->nmem + 2);
  st = spec == NULL ? zpp_error(ZPP_ERR_OUT_OF_MEMORY, s->func, "node map")
                    : new_config(comm, s, &cfg, spec, 12 * (size_t)s->nmem + 2);
  if (st == ZPP_OK)
    st = zpp_comm_create_tcp(&s->id, s->nmem, me_new, &cfg, NULL, s->func, &nc);
  else if (me_new == 0)
    zpp_tcp_unlisten(&s->id);
  free(spec);
  if (st != ZPP_OK) {
    /* the creation numbers the new ranks: written as the caller's; the
     * whole message fits an error message (512 bytes, core/error.c) */
    char why[512], cause[512], msg[512];
    int *gone = malloc((size_t)s->n * sizeof *gone), ng = 0;
    size_t room = 512 - strlen(s->func) - 80;
    const char *e = zpp_get_last_error();
    size_t fl = strlen(s->func);
    /* the creation's error, without the prefix of this same call */
    if (strncmp(e, s->func, fl) == 0 && strncmp(e + fl, ": ", 2) == 0)
      e += fl + 2;
    snprintf(why, sizeof why, "%s", e);
    zpp_shrink_old_ranks(why, s->mem, s->nmem, cause, sizeof cause);
    if (gone != NULL)
      ng = gone_members(s, soon(s, SH_PROBE_S), gone);
    zpp_shrink_commit_msg(cause, gone, ng, s->mem, s->nmem, msg, room);
    free(gone);
    return zpp_error(ZPP_ERR_PEER_FAILED, s->func,
                     "the communicator of the %d survivors could not be "
                     "created: %s",
                     s->nmem, msg);
  }
  /* the creation was bounded by the call; the communicator keeps comm's */
  nc->tr->timeout_s = comm->tr->timeout_s;
  nc->cfg.timeout_s = comm->cfg.timeout_s;
  if (new_rank_of != NULL) {
    for (i = 0; i < s->n; i++)
      new_rank_of[i] = -1;
    for (i = 0; i < s->nmem; i++)
      new_rank_of[s->mem[i]] = i;
  }
  *newcomm = nc;
  return ZPP_OK;
}

zpp_status_t zpp_comm_shrink(zpp_comm_t comm, const zpp_shrink_config_t *cfg,
                             int *new_rank_of, zpp_comm_t *newcomm) {
  const zpp_shrink_config_t def = ZPP_SHRINK_CONFIG_INIT;
  sh_t s;
  zpp_status_t st;
  double bound;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (newcomm == NULL)
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_NULL_POINTER, __func__, "newcomm is NULL"));
  if (cfg == NULL)
    cfg = &def;
  if (cfg->struct_size != sizeof *cfg)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                                         "cfg->struct_size %zu: must be "
                                         "sizeof(zpp_shrink_config_t) = %zu "
                                         "(ZPP_SHRINK_CONFIG_INIT)",
                                         cfg->struct_size, sizeof *cfg));
  if (isnan(cfg->timeout_s) || isnan(cfg->join_s))
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                        "cfg->%s is NaN: must be a number of seconds",
                        isnan(cfg->timeout_s) ? "timeout_s" : "join_s"));
  /* Survivors see the failure up to one timeout T apart (a collective
   * with the dead rank times out on one rank while another saw its
   * connection reset at once): the coordinator may call T after a
   * participant, and a participant T after the coordinator, so the join
   * window is 1.5 T and the bound 3 T (the creation needs the rest). */
  bound = cfg->timeout_s > 0        ? zpp_timeout_clamp(cfg->timeout_s)
          : comm->tr->timeout_s > 0 ? 3 * comm->tr->timeout_s
                                    : 900.0;
  if (cfg->join_s > 0 && cfg->join_s >= bound)
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                        "cfg->join_s %g: must be less than the bound of the "
                        "call, %g s (cfg->timeout_s, else the communicator's "
                        "timeout)",
                        cfg->join_s, bound));
  if (comm->rescue == NULL || comm->rescue->fd < 0)
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                        "this communicator has no listening socket for the "
                        "survivors: %s",
                        comm->rescue != NULL
                            ? comm->rescue->why
                            : "it could not open one at creation (the "
                              "warning said why)"));
  if (comm->tr->backend == ZPP_BACKEND_MPI) {
    char why[ZPP_TCP_ERRLEN];
    if (!zpp_transport_ucx_available(why, sizeof why))
      return zpp_comm_fail(
          comm, zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                          "the survivors of an MPI communicator continue on "
                          "UCX (MPI may not survive the death), and UCX is "
                          "not usable here: %s",
                          why));
  }
  if (comm->rescue->used)
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                        "comm: zpp_comm_shrink was called on it before; "
                        "shrink the communicator it gave"));
  comm->rescue->used = 1;
  /* comm is done with on this rank: its waits end, and it never sends
   * again (its peers' next calls with this rank fail or time out). */
  zpp_comm_abort(comm);
  memset(&s, 0, sizeof s);
  s.rs = comm->rescue;
  s.func = __func__;
  s.me = comm->tr->rank;
  s.n = comm->tr->size;
  s.bound_s = bound;
  s.join_s = cfg->join_s > 0 ? cfg->join_s : bound / 2;
  s.deadline = zpp_time_ns() + (int64_t)(bound * 1e9);
  s.cap = 2 * s.n + 8;
  s.msg_cap = sizeof(int32_t) * ((size_t)s.n + 1) + sizeof(zpp_unique_id_t) +
              ZPP_TCP_ERRLEN;
  s.dead = calloc((size_t)s.n, 1);
  s.joined = calloc((size_t)s.n, 1);
  s.retry = calloc((size_t)s.n, sizeof *s.retry);
  s.cv = malloc((size_t)s.cap * sizeof *s.cv);
  s.pf = malloc(((size_t)s.cap + 2) * sizeof *s.pf);
  s.msg = malloc(s.msg_cap);
  s.mem = malloc((size_t)s.n * sizeof *s.mem);
  if (s.dead == NULL || s.joined == NULL || s.retry == NULL || s.cv == NULL ||
      s.pf == NULL || s.msg == NULL || s.mem == NULL)
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "state of %d ranks", s.n);
  else
    st = run(comm, &s, new_rank_of, newcomm);
  free(s.dead);
  free(s.joined);
  free(s.retry);
  free(s.cv);
  free(s.pf);
  free(s.msg);
  free(s.mem);
  return zpp_comm_fail(comm, st);
}
