/*
 * zpp_comm_shrink: the survivors of a failure agree on who is alive and
 * build a communicator of exactly them (docs/api.md, "Shrinking after a
 * failure"; the guarantees are in <zpp/zpp_comm.h>).
 *
 * Why its own sockets: the old communicator's bootstrap may be a star
 * whose root died, its backend may hang on the dead peer, and MPI may
 * abort.  So every communicator keeps, from its creation, one listening
 * socket per rank (the rescue listener); the addresses travel in the first
 * creation exchange.  A dead process's socket refuses connections and
 * resets the ones it had: that is the proof of death the protocol uses.
 *
 * The protocol (one round, through a coordinator):
 *   - coordinator: the lowest rank whose listener accepts.  A survivor
 *     connects to ranks 0, 1, ... in turn; a refused or reset connection
 *     marks that rank dead.  It sends JOIN on the first that accepts and
 *     waits for the decision; a coordinator that closes before deciding
 *     is dead, and the next lowest takes over (it sees the same closing).
 *   - the coordinator probes every higher rank that has not joined (a
 *     connection carrying PROBE, held open: its reset says the rank died)
 *     until all are joined or dead, or its join window ends;
 *   - decision: members = the joined ranks in rank order (the coordinator
 *     first).  It listens on a new TCP star, sends DECIDE (members, the
 *     star's id) to each member and EXCLUDED on the probes of the live
 *     ranks that did not join (a late rank reads it from its listener's
 *     queue when it calls shrink, and fails instead of waiting);
 *   - commit: the members create the new communicator over that star; its
 *     creation exchanges agree on failure, so a member that dies from the
 *     decision on fails every member (ZPP_ERR_PEER_FAILED).
 * Messages: comm/tcp.h's header, then sh_who_t (and the decision).
 */
#include "comm/comm.h"

#include "comm/comm_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/tcp.h"
#include "core/core.h"
#include "transport/transport_impl.h"

struct zpp_rescue {
  int fd; /* the listener */
  int rank, size;
  uint64_t epoch;   /* the same on every rank of this communicator */
  uint32_t self_ip; /* the address other hosts reach me by */
  uint32_t *ip;     /* [size] network order (loopback for my host) */
  uint16_t *port;   /* [size] */
  int used;         /* zpp_comm_shrink was called on it */
};

void (*zpp_shrink_test_hook)(int rank, const char *point) = NULL;

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

typedef struct {
  uint64_t epoch;
  int32_t rank, pid;
} sh_who_t;

/* The address other hosts reach this process by: the TCP bootstrap's,
 * else the first IPv4 address of an interface that is up and not
 * loopback (no name lookup: creation must not wait for DNS), else
 * loopback (then only ranks of this host can reach it). */
static uint32_t host_ip(void *tcp) {
  struct ifaddrs *all = NULL, *a;
  uint32_t ip = htonl(INADDR_LOOPBACK);
  if (tcp != NULL)
    return zpp_tcp_boot_ip(tcp);
  if (getifaddrs(&all) != 0)
    return ip;
  for (a = all; a != NULL; a = a->ifa_next)
    if (a->ifa_addr != NULL && a->ifa_addr->sa_family == AF_INET &&
        (a->ifa_flags & IFF_UP) && !(a->ifa_flags & IFF_LOOPBACK)) {
      ip = ((struct sockaddr_in *)a->ifa_addr)->sin_addr.s_addr;
      break;
    }
  freeifaddrs(all);
  return ip;
}

void zpp_rescue_open(void *tcp, int *fd, uint32_t *ip, uint16_t *port) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  *fd = -1;
  *port = 0;
  *ip = 0;
  if (s < 0) {
    ZPP_WARN(ZPP_SUBSYS_INIT, "zpp_comm_shrink will be unsupported: socket: %s",
             strerror(errno));
    return;
  }
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 1024) != 0 ||
      getsockname(s, (struct sockaddr *)&sa, &sl) != 0) {
    ZPP_WARN(ZPP_SUBSYS_INIT,
             "zpp_comm_shrink will be unsupported: bind/listen: %s",
             strerror(errno));
    close(s);
    return;
  }
  *fd = s;
  *port = ntohs(sa.sin_port);
  *ip = host_ip(tcp);
}

zpp_status_t zpp_rescue_attach(zpp_comm_t c, int fd, int rank, int size,
                               uint32_t self_ip, const uint32_t *ip,
                               const uint16_t *port, uint64_t epoch,
                               const char *func) {
  struct zpp_rescue *rs;
  if (fd < 0)
    return ZPP_OK;
  rs = calloc(1, sizeof *rs);
  if (rs != NULL) {
    rs->ip = malloc((size_t)size * sizeof *rs->ip);
    rs->port = malloc((size_t)size * sizeof *rs->port);
  }
  if (rs == NULL || rs->ip == NULL || rs->port == NULL) {
    if (rs != NULL) {
      free(rs->ip);
      free(rs->port);
    }
    free(rs);
    close(fd);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "shrink addresses");
  }
  memcpy(rs->ip, ip, (size_t)size * sizeof *ip);
  memcpy(rs->port, port, (size_t)size * sizeof *port);
  rs->fd = fd;
  rs->rank = rank;
  rs->size = size;
  rs->epoch = epoch;
  rs->self_ip = self_ip;
  c->rescue = rs;
  return ZPP_OK;
}

void zpp_rescue_free(zpp_comm_t c) {
  struct zpp_rescue *rs = c->rescue;
  if (rs == NULL)
    return;
  close(rs->fd);
  free(rs->ip);
  free(rs->port);
  free(rs);
  c->rescue = NULL;
}

/* ---- one call's state --------------------------------------------------- */

enum {
  K_NEW,    /* accepted, no message read yet */
  K_JOIN,   /* a rank that joined me (peer) */
  K_PROBED, /* a coordinator's probe of me (peer: the coordinator) */
  K_PROBE   /* my probe of peer (connecting while `pending`) */
};

typedef struct {
  int fd, peer, kind, pending;
} conn_t;

typedef struct {
  struct zpp_rescue *rs;
  const char *func;
  int me, n;
  int64_t deadline;
  double bound_s, join_s;
  char *dead, *joined; /* [n] */
  conn_t *cv;
  int nc, cap;
  size_t msg_cap;
  char *msg; /* a received message's payload (msg_cap bytes) */
  /* the decision */
  int nmem;
  int *mem; /* [n] */
  zpp_unique_id_t id;
} sh_t;

static int64_t soon(const sh_t *s, double secs) {
  int64_t t = zpp_time_ns() + (int64_t)(secs * 1e9);
  return t < s->deadline ? t : s->deadline;
}

static void drop(sh_t *s, int i) {
  close(s->cv[i].fd);
  s->cv[i] = s->cv[--s->nc];
}

static int add_conn(sh_t *s, int fd, int peer, int kind, int pending) {
  if (s->nc == s->cap) {
    close(fd); /* more than 2n + 8 connections: none of ours */
    return -1;
  }
  s->cv[s->nc].fd = fd;
  s->cv[s->nc].peer = peer;
  s->cv[s->nc].kind = kind;
  s->cv[s->nc].pending = pending;
  return s->nc++;
}

/* Starts a non-blocking connection to rank r's listener: 0 connected, 1
 * in progress, -1 refused or failed at once. */
static int connect_start(const sh_t *s, int r, int *fd) {
  struct sockaddr_in sa;
  int f = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  *fd = -1;
  if (f < 0)
    return -1;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = s->rs->ip[r];
  sa.sin_port = htons(s->rs->port[r]);
  if (connect(f, (struct sockaddr *)&sa, sizeof sa) == 0) {
    zpp_tcp_set_sockopts(f);
    *fd = f;
    return 0;
  }
  if (errno == EINPROGRESS) {
    *fd = f;
    return 1;
  }
  close(f);
  return -1;
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

/* Accepts what waits on my listener. */
static void accept_all(sh_t *s) {
  for (;;) {
    int fd = accept4(s->rs->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
      return;
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

/* A message on an accepted connection (any role).  Returns an error only
 * for EXCLUDED (this rank is out). */
static zpp_status_t serve(sh_t *s, int i, int *removed) {
  zpp_tcp_msg_hdr_t h;
  sh_who_t w;
  size_t len = 0;
  conn_t *c = &s->cv[i];
  int rc;
  *removed = 0;
again:
  rc = recv_one(s, c->fd, &h, &w, &len);
  if (rc != 0) {
    /* closed: a joined rank that closes has died (a survivor never leaves
     * a coordinator it joined unless that one died first) */
    if (c->kind == K_JOIN && rc == -2) {
      s->joined[c->peer] = 0;
      s->dead[c->peer] = 1;
    }
    drop(s, i);
    *removed = 1;
    return ZPP_OK;
  }
  if (h.type == SH_EXCLUDED)
    return zpp_error(ZPP_ERR_EXCLUDED, s->func,
                     "rank %d decided the new communicator without this rank "
                     "%d: it called zpp_comm_shrink after the decision",
                     w.rank, s->me);
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

/* Polls my listener, the connections and `extra` (-1: none) up to 100 ms.
 * *ready: extra became readable (or writable, for ev POLLOUT).  Serves
 * the connections; an error only for EXCLUDED. */
static zpp_status_t step(sh_t *s, int extra, short ev, int *ready,
                         struct pollfd *pf) {
  int k = 0, i, ms;
  int64_t left = (s->deadline - zpp_time_ns()) / 1000000;
  ms = left < 0 ? 0 : left > 100 ? 100 : (int)left + 1;
  pf[k].fd = s->rs->fd;
  pf[k++].events = POLLIN;
  for (i = 0; i < s->nc; i++) {
    pf[k].fd = s->cv[i].fd;
    pf[k++].events = s->cv[i].pending ? POLLOUT : POLLIN;
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
    short re = pf[1 + i].revents;
    conn_t *c = &s->cv[i];
    int removed;
    if (re == 0)
      continue;
    if (c->kind == K_PROBE) {
      /* my probe: finished connecting, or the rank died (reset/closed) */
      if (c->pending) {
        if (connect_error(c->fd) != 0) {
          s->dead[c->peer] = 1;
          drop(s, i);
          continue;
        }
        c->pending = 0;
        zpp_tcp_set_sockopts(c->fd);
        if (send_who(s, c->fd, SH_PROBE, NULL, 0, soon(s, 2.0)) != 0) {
          s->dead[c->peer] = 1;
          drop(s, i);
        }
        continue;
      }
      {
        char b;
        ssize_t got = recv(c->fd, &b, 1, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          if (!s->joined[c->peer])
            s->dead[c->peer] = 1;
          drop(s, i);
        }
      }
      continue;
    }
    ZPP_CHECK(serve(s, i, &removed));
  }
  if (pf[0].revents & POLLIN)
    accept_all(s);
  return ZPP_OK;
}

/* ---- participant ----------------------------------------------------------
 * Joins rank c.  Returns ZPP_OK with *decided = 1 (the decision is in s),
 * or with s->dead[c] set (c refused, or closed before deciding), or an
 * error. */
static zpp_status_t follow(sh_t *s, int c, int *decided, struct pollfd *pf) {
  int fd, rc, ready = 0;
  *decided = 0;
  rc = connect_start(s, c, &fd);
  if (rc < 0) {
    s->dead[c] = 1;
    return ZPP_OK;
  }
  if (rc == 1) {
    /* a host that is up answers at once (accepted or refused); 2 s
     * without an answer: the host is gone */
    int64_t until = soon(s, 2.0);
    while (!ready && zpp_time_ns() < until) {
      zpp_status_t st = step(s, fd, POLLOUT, &ready, pf);
      if (st != ZPP_OK) {
        close(fd);
        return st;
      }
    }
    if (!ready || connect_error(fd) != 0) {
      close(fd);
      if (zpp_time_ns() >= s->deadline)
        return zpp_error(ZPP_ERR_TIMEOUT, s->func,
                         "no rank answered within %.3g s (the last tried: "
                         "rank %d)",
                         s->bound_s, c);
      s->dead[c] = 1;
      return ZPP_OK;
    }
    zpp_tcp_set_sockopts(fd);
  }
  if (send_who(s, fd, SH_JOIN, NULL, 0, soon(s, 2.0)) != 0) {
    close(fd);
    s->dead[c] = 1;
    return ZPP_OK;
  }
  hook(s->me, "joined");
  for (;;) {
    zpp_tcp_msg_hdr_t h;
    sh_who_t w;
    size_t len;
    zpp_status_t st;
    if (zpp_time_ns() >= s->deadline) {
      close(fd);
      return zpp_error(ZPP_ERR_TIMEOUT, s->func,
                       "rank %d, the lowest rank whose socket accepts, did "
                       "not decide within %.3g s: it is alive but did not "
                       "call zpp_comm_shrink (or called it more than %.3g s "
                       "after this rank)",
                       c, s->bound_s, s->bound_s - s->join_s);
    }
    st = step(s, fd, POLLIN, &ready, pf);
    if (st != ZPP_OK) {
      close(fd);
      return st;
    }
    if (!ready)
      continue;
    rc = recv_one(s, fd, &h, &w, &len);
    if (rc == 1)
      continue;
    if (rc != 0) {
      /* the coordinator died before its decision reached me */
      close(fd);
      s->dead[c] = 1;
      return ZPP_OK;
    }
    close(fd);
    if (h.type == SH_DECIDE) {
      ZPP_CHECK(take_decision(s, c, len));
      *decided = 1;
      return ZPP_OK;
    }
    if (h.type == SH_EXCLUDED)
      return zpp_error(ZPP_ERR_EXCLUDED, s->func,
                       "rank %d decided the new communicator without this "
                       "rank %d: it joined after the decision",
                       c, s->me);
    if (h.type == SH_FAIL) {
      s->msg[len < s->msg_cap ? len : s->msg_cap - 1] = '\0';
      return zpp_error(ZPP_ERR_PEER_FAILED, s->func,
                       "the coordinator, rank %d, failed: %s", c, s->msg);
    }
    return zpp_error(ZPP_ERR_INTERNAL, s->func,
                     "rank %d sent message type %u instead of a decision", c,
                     h.type);
  }
}

/* ---- coordinator ----------------------------------------------------------
 */

static zpp_status_t coordinate(sh_t *s, struct pollfd *pf) {
  int q, i, ready, all_local = 1;
  int64_t join_end = soon(s, s->join_s);
  zpp_status_t st = ZPP_OK;
  char *payload = NULL;
  size_t plen;
  uint32_t star_ip;
  s->joined[s->me] = 1;
  /* ranks that joined me while I followed a lower one */
  for (i = 0; i < s->nc; i++)
    if (s->cv[i].kind == K_JOIN && !s->dead[s->cv[i].peer])
      s->joined[s->cv[i].peer] = 1;
  /* probes of the higher ranks not joined (the lower ones are dead: that
   * is why I coordinate) */
  for (q = s->me + 1; q < s->n; q++) {
    int fd, rc;
    if (s->dead[q] || s->joined[q])
      continue;
    rc = connect_start(s, q, &fd);
    if (rc < 0)
      s->dead[q] = 1;
    else if (add_conn(s, fd, q, K_PROBE, rc == 1) >= 0 && rc == 0 &&
             send_who(s, fd, SH_PROBE, NULL, 0, soon(s, 2.0)) != 0)
      s->dead[q] = 1;
  }
  for (;;) {
    int open = 0;
    for (q = s->me + 1; q < s->n; q++)
      open += !s->dead[q] && !s->joined[q];
    if (open == 0 || zpp_time_ns() >= join_end)
      break;
    ZPP_CHECK(step(s, -1, 0, &ready, pf));
    for (i = 0; i < s->nc; i++)
      if (s->cv[i].kind == K_JOIN && !s->dead[s->cv[i].peer])
        s->joined[s->cv[i].peer] = 1;
  }
  /* the decision */
  s->nmem = 0;
  for (q = 0; q < s->n; q++)
    if (s->joined[q] && !s->dead[q]) {
      s->mem[s->nmem++] = q;
      all_local &= s->rs->ip[q] == htonl(INADDR_LOOPBACK);
    }
  hook(s->me, "deciding");
  star_ip = all_local ? htonl(INADDR_LOOPBACK) : s->rs->self_ip;
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
    plen =
        (size_t)snprintf(payload, ZPP_TCP_ERRLEN, "%s", zpp_get_last_error()) +
        1;
  }
  /* A member that died since joining fails the creation on every member;
   * sends are bounded and their failures need no answer here. */
  for (i = 0; i < s->nc; i++) {
    conn_t *c = &s->cv[i];
    if (c->kind == K_JOIN && s->joined[c->peer] && !s->dead[c->peer]) {
      if (payload != NULL)
        send_who(s, c->fd, st == ZPP_OK ? SH_DECIDE : SH_FAIL, payload, plen,
                 soon(s, 2.0));
    } else if (c->kind == K_PROBE && !c->pending && !s->dead[c->peer] &&
               !s->joined[c->peer]) {
      send_who(s, c->fd, SH_EXCLUDED, NULL, 0, soon(s, 1.0));
    }
  }
  free(payload);
  return st;
}

/* ---- the call --------------------------------------------------------------
 */

/* The new communicator's config: comm's, backend MPI replaced by UCX
 * (it needs MPI, which may not survive), an emulated node map restricted
 * to the members, the creation bounded by what is left of the call. */
static zpp_status_t new_config(zpp_comm_t comm, const sh_t *s,
                               zpp_comm_config_t *cfg, char *spec, size_t len) {
  const zpp_transport_t *t = comm->tr;
  double left = (double)(s->deadline - zpp_time_ns()) * 1e-9;
  *cfg = comm->cfg;
  cfg->backend = t->backend == ZPP_BACKEND_MPI ? ZPP_BACKEND_UCX : t->backend;
  cfg->algorithm = t->algorithm;
  cfg->timeout_s = left > 0.5 ? left : 0.5;
  cfg->topology = NULL;
  spec[0] = '\0';
  if (t->topo->emulated) {
    ZPP_CHECK(
        zpp_comm_child_spec(t->topo, s->mem, s->nmem, spec, len, s->func));
    cfg->topology = spec;
  }
  return ZPP_OK;
}

static zpp_status_t run(zpp_comm_t comm, sh_t *s, int *new_rank_of,
                        zpp_comm_t *newcomm) {
  struct pollfd *pf;
  zpp_status_t st = ZPP_OK;
  zpp_comm_config_t cfg;
  zpp_comm_t nc = NULL;
  char spec[128];
  int i, me_new = -1;
  pf = malloc(((size_t)s->cap + 2) * sizeof *pf);
  if (pf == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, s->func, "poll set");
  /* A rank excluded earlier finds the coordinator's EXCLUDED waiting. */
  accept_all(s);
  for (;;) {
    int c, decided = 0, ready;
    for (i = s->nc - 1; i >= 0 && st == ZPP_OK; i--)
      if (s->cv[i].kind == K_NEW) {
        int removed;
        struct pollfd p = {s->cv[i].fd, POLLIN, 0};
        if (poll(&p, 1, 0) > 0)
          st = serve(s, i, &removed);
      }
    if (st != ZPP_OK)
      break;
    for (c = 0; c < s->n && s->dead[c]; c++) {
    }
    if (c == s->me) {
      st = coordinate(s, pf);
      break;
    }
    st = follow(s, c, &decided, pf);
    if (st != ZPP_OK || decided)
      break;
    (void)ready;
  }
  for (i = s->nc - 1; i >= 0; i--)
    drop(s, i);
  free(pf);
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
  st = new_config(comm, s, &cfg, spec, sizeof spec);
  if (st == ZPP_OK)
    st = zpp_comm_create_tcp(&s->id, s->nmem, me_new, &cfg, NULL, s->func, &nc);
  else if (me_new == 0)
    zpp_tcp_unlisten(&s->id);
  if (st != ZPP_OK) {
    char why[ZPP_TCP_ERRLEN];
    snprintf(why, sizeof why, "%s", zpp_get_last_error());
    return zpp_error(ZPP_ERR_PEER_FAILED, s->func,
                     "the communicator of the %d survivors could not be "
                     "created (a member failed after the decision): %s",
                     s->nmem, why);
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
  if (comm->rescue == NULL)
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                        "this communicator has no listening socket for the "
                        "survivors (it could not open one at creation)"));
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
  s.cv = malloc((size_t)s.cap * sizeof *s.cv);
  s.msg = malloc(s.msg_cap);
  s.mem = malloc((size_t)s.n * sizeof *s.mem);
  if (s.dead == NULL || s.joined == NULL || s.cv == NULL || s.msg == NULL ||
      s.mem == NULL)
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "state of %d ranks", s.n);
  else
    st = run(comm, &s, new_rank_of, newcomm);
  free(s.dead);
  free(s.joined);
  free(s.cv);
  free(s.msg);
  free(s.mem);
  return zpp_comm_fail(comm, st);
}
