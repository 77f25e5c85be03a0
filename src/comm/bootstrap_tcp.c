/*
 * zpp's TCP bootstrap (docs/design.md, "Bootstrap"): a star.  One process,
 * the root, listens; every other rank connects to it, says who it is
 * (HELLO), and is welcomed once all ranks arrived.  Every collective of
 * the table is then one round through the root: each rank sends its
 * contribution, the root concatenates them and sends the result back.
 * Metadata only (host identities, worker addresses, checks): small
 * messages, so O(n) at the root is fine.
 *
 * Every wait has a deadline; errors name the peer and the problem, and the
 * root forwards an error it sees to every rank (ERR message), so no rank
 * is left waiting for an exchange that will not happen.
 *
 * The id and its listeners are in tcp_id.c, the socket I/O under a
 * deadline in tcp_io.c; the wire format in comm/tcp.h.
 */
#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/tcp.h"
#include "transport/transport_impl.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the bootstrap state ------------------------------------------------ */

typedef struct {
  int rank, size;
  int is_root;
  int root_rank;
  int *fd;           /* root: [size] connection of each rank (-1 for itself) */
  int hub;           /* non-root: connection to the root */
  uint64_t seq;      /* rounds so far */
  uint32_t local_ip; /* the address others reach me by (for splits) */
  int broken;
  char broken_why[ZPP_TCP_ERRLEN];
  char peer_name[96];      /* "root 127.0.0.1:5000" */
  const atomic_int *abort; /* zpp_tcp_boot_watch */
} tcp_t;

/* ---- joining
 * ----------------------------------------------------------------- */

static void fill_hello(zpp_tcp_hello_t *h, uint64_t session, int rank,
                       int nranks) {
  memset(h, 0, sizeof *h);
  h->session = session;
  h->rank = rank;
  h->nranks = nranks;
  h->pid = (int32_t)getpid();
  if (gethostname(h->host, sizeof h->host) != 0)
    snprintf(h->host, sizeof h->host, "unknown");
  h->host[sizeof h->host - 1] = '\0';
}

static void tcp_close(tcp_t *b) {
  int r;
  if (b == NULL)
    return;
  if (b->fd != NULL)
    for (r = 0; r < b->size; r++)
      if (b->fd[r] >= 0)
        close(b->fd[r]);
  if (b->hub >= 0)
    close(b->hub);
  free(b->fd);
  free(b);
}

/* Sends ERR with `text` to every connected rank (best effort, short
 * deadline: they may be gone). */
static void root_fail_all(tcp_t *b, const char *text) {
  int r;
  int64_t d = zpp_time_ns() + 1000000000;
  for (r = 0; r < b->size; r++)
    if (b->fd[r] >= 0)
      zpp_tcp_send_msg(b->fd[r], ZPP_TCP_M_ERR, b->seq, text, strlen(text) + 1,
                       NULL, 0, d);
}

typedef struct {
  int fd;
  zpp_tcp_hello_t h;
} pending_t;

/* The root: accept until every rank said hello or the deadline passed. */
static zpp_status_t root_gather(tcp_t *b, int lfd, uint64_t session,
                                int64_t deadline, double timeout_s,
                                const char *func) {
  int n = b->size, arrived = 1, r;
  char err[ZPP_TCP_ERRLEN] = "";
  zpp_status_t st = ZPP_OK;
  int *pid = calloc((size_t)n, sizeof *pid);
  char(*host)[ZPP_TCP_HOSTLEN] = calloc((size_t)n, ZPP_TCP_HOSTLEN);
  if (pid == NULL || host == NULL) {
    free(pid);
    free(host);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "roster");
  }
  pid[b->rank] = (int)getpid();
  gethostname(host[b->rank], ZPP_TCP_HOSTLEN - 1);
  while (arrived < n) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    zpp_tcp_hello_t h;
    zpp_tcp_msg_hdr_t mh;
    int fd, w, rc;
    w = zpp_tcp_wait_fd(lfd, POLLIN, deadline);
    if (w != 0)
      break;
    fd = accept(lfd, (struct sockaddr *)&sa, &sl);
    if (fd < 0)
      continue;
    zpp_tcp_set_sockopts(fd);
    /* A hello is small and sent right after connecting. */
    rc = zpp_tcp_recv_all(fd, &mh, sizeof mh, deadline);
    if (rc == 0 && (mh.magic != ZPP_TCP_MSG_MAGIC ||
                    mh.type != ZPP_TCP_M_HELLO || mh.len != sizeof h))
      rc = -3;
    if (rc == 0)
      rc = zpp_tcp_recv_all(fd, &h, sizeof h, deadline);
    if (rc != 0) {
      close(fd);
      continue; /* not a zpp rank, or gone: ignore */
    }
    h.host[ZPP_TCP_HOSTLEN - 1] = '\0';
    h.why[ZPP_TCP_ERRLEN - 1] = '\0';
    if (h.session != session) {
      const char *m = "stale id: this root serves another session (the id "
                      "comes from an earlier zpp_get_unique_id)";
      zpp_tcp_send_msg(fd, ZPP_TCP_M_ERR, 0, m, strlen(m) + 1, NULL, 0,
                       deadline);
      close(fd);
      continue;
    }
    if (err[0] == '\0') {
      if (h.failed)
        snprintf(err, sizeof err, "rank %d (pid %d on %.40s) failed: %.300s",
                 h.rank, h.pid, h.host, h.why);
      else if (h.nranks != n)
        snprintf(err, sizeof err,
                 "nranks differ: rank %d (pid %d on %s) says %d, the root "
                 "(rank %d) says %d",
                 h.rank, h.pid, h.host, h.nranks, b->rank, n);
      else if (h.rank < 0 || h.rank >= n)
        snprintf(err, sizeof err,
                 "a process (pid %d on %s) claims rank %d: "
                 "must be in [0, %d)",
                 h.pid, h.host, h.rank, n);
      else if (b->fd[h.rank] >= 0 || h.rank == b->rank)
        snprintf(err, sizeof err,
                 "rank %d claimed by two processes (pid %d on %s and pid %d "
                 "on %s)",
                 h.rank, pid[h.rank], host[h.rank], h.pid, h.host);
      if (err[0] != '\0') {
        st = zpp_error(h.failed || h.rank < 0 || h.rank >= n
                           ? ZPP_ERR_INVALID_ARGUMENT
                           : ZPP_ERR_MISMATCH,
                       func, "%s", err);
        root_fail_all(b, err);
      }
    }
    if (err[0] != '\0') {
      /* Tell the newcomer; keep counting so late ranks hear it too. */
      zpp_tcp_send_msg(fd, ZPP_TCP_M_ERR, 0, err, strlen(err) + 1, NULL, 0,
                       deadline);
      close(fd);
      if (h.rank >= 0 && h.rank < n && h.rank != b->rank && pid[h.rank] == 0) {
        pid[h.rank] = h.pid;
        arrived++;
      }
      continue;
    }
    b->fd[h.rank] = fd;
    pid[h.rank] = h.pid;
    memcpy(host[h.rank], h.host, ZPP_TCP_HOSTLEN);
    arrived++;
  }
  if (err[0] == '\0' && arrived < n) {
    char missing[200] = "";
    size_t used = 0;
    int count = 0;
    for (r = 0; r < n; r++) {
      if (pid[r] != 0)
        continue;
      count++;
      if (used + 12 < sizeof missing)
        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                 count > 1 ? ", " : "", r);
    }
    snprintf(err, sizeof err,
             "rank%s %s never arrived at the bootstrap within %.3g s "
             "(ZPP_TIMEOUT_S); %d of %d ranks did",
             count > 1 ? "s" : "", missing, timeout_s, arrived, n);
    st = zpp_error(ZPP_ERR_TIMEOUT, func, "%s", err);
    root_fail_all(b, err);
  }
  if (st == ZPP_OK) {
    for (r = 0; r < n && st == ZPP_OK; r++) {
      int rc;
      if (r == b->rank)
        continue;
      rc = zpp_tcp_send_msg(b->fd[r], ZPP_TCP_M_WELCOME, 0, NULL, 0, NULL, 0,
                            deadline);
      if (rc != 0) {
        snprintf(err, sizeof err, "rank %d: sending the welcome: %s", r,
                 zpp_tcp_io_what(rc));
        st = zpp_error(zpp_tcp_io_status(rc), func, "%s", err);
        root_fail_all(b, err);
      }
    }
  }
  free(pid);
  free(host);
  return st;
}

static zpp_status_t client_join(tcp_t *b, const zpp_tcp_id_fields_t *f,
                                const zpp_tcp_hello_t *h, int64_t deadline,
                                double timeout_s, const char *func) {
  struct sockaddr_in sa;
  char addr[64];
  int fd = -1, refused = 0, rc;
  long pause_ms = 10;
  zpp_tcp_msg_hdr_t mh;
  zpp_tcp_id_addr(f, addr, sizeof addr);
  snprintf(b->peer_name, sizeof b->peer_name, "root %s", addr);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = f->ip;
  sa.sin_port = f->port;
  for (;;) {
    int e;
    /* Non-blocking: a blocking connect waits for the kernel's SYN retries
     * (about two minutes when the root's host drops SYNs, e.g. a full
     * accept queue or a firewall), past ZPP_TIMEOUT_S. */
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      return zpp_error(ZPP_ERR_SYSTEM, func, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
      break;
    e = errno;
    if (e == EINPROGRESS) {
      int w = zpp_tcp_wait_fd(fd, POLLOUT, deadline);
      socklen_t el = sizeof e;
      if (w == 1)
        e = ETIMEDOUT;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
        e = errno;
      else if (e == 0 && w == 0)
        break;
      else if (e == 0)
        e = EIO;
    }
    close(fd);
    fd = -1;
    if (e != ECONNREFUSED && e != EAGAIN && e != ETIMEDOUT && e != EINTR &&
        e != ENETUNREACH && e != EHOSTUNREACH)
      return zpp_error(ZPP_ERR_SYSTEM, func, "connect to the root at %s: %s",
                       addr, strerror(e));
    refused++;
    if (zpp_time_ns() >= deadline)
      return zpp_error(ZPP_ERR_TIMEOUT, func,
                       "no bootstrap root at %s within %.3g s (%s, %d "
                       "attempts): the id is stale, or the root rank failed "
                       "or never started",
                       addr, timeout_s, strerror(e), refused);
    {
      struct timespec ts = {0, pause_ms * 1000000};
      nanosleep(&ts, NULL);
      if (pause_ms < 200)
        pause_ms *= 2;
    }
  }
  zpp_tcp_set_sockopts(fd);
  b->hub = fd;
  {
    struct sockaddr_in me;
    socklen_t sl = sizeof me;
    if (getsockname(fd, (struct sockaddr *)&me, &sl) == 0)
      b->local_ip = me.sin_addr.s_addr;
  }
  rc =
      zpp_tcp_send_msg(fd, ZPP_TCP_M_HELLO, 0, h, sizeof *h, NULL, 0, deadline);
  if (rc != 0)
    return zpp_error(zpp_tcp_io_status(rc), func,
                     "saying hello to the root at %s: %s", addr,
                     zpp_tcp_io_what(rc));
  if (h->failed)
    return ZPP_OK; /* the caller reports its own error */
  rc = zpp_tcp_recv_all(fd, &mh, sizeof mh, deadline);
  if (rc == 1)
    return zpp_error(ZPP_ERR_TIMEOUT, func,
                     "the root at %s did not welcome rank %d within %.3g s "
                     "(other ranks missing, or the port belongs to a process "
                     "that is not a zpp bootstrap root)",
                     addr, h->rank, timeout_s);
  if (rc != 0)
    return zpp_error(ZPP_ERR_SYSTEM, func,
                     "the root at %s closed the connection before welcoming "
                     "rank %d (%s)",
                     addr, h->rank, zpp_tcp_io_what(rc));
  if (mh.magic != ZPP_TCP_MSG_MAGIC)
    return zpp_error(ZPP_ERR_SYSTEM, func,
                     "the process at %s is not a zpp bootstrap root (bad "
                     "reply)",
                     addr);
  if (mh.type == ZPP_TCP_M_ERR) {
    char text[ZPP_TCP_ERRLEN] = "";
    size_t k = mh.len < sizeof text ? mh.len : sizeof text - 1;
    zpp_tcp_recv_all(fd, text, k, deadline);
    text[sizeof text - 1] = '\0';
    return zpp_error(strstr(text, "never arrived") ? ZPP_ERR_TIMEOUT
                     : strstr(text, "stale") || strstr(text, "claimed") ||
                             strstr(text, "differ")
                         ? ZPP_ERR_MISMATCH
                         : ZPP_ERR_INVALID_ARGUMENT,
                     func, "bootstrap root at %s: %s", addr, text);
  }
  if (mh.type != ZPP_TCP_M_WELCOME)
    return zpp_error(ZPP_ERR_SYSTEM, func,
                     "the root at %s sent message type %u instead of a "
                     "welcome",
                     addr, mh.type);
  return ZPP_OK;
}

/* ---- one round through the root -------------------------------------------
 */

/* Every rank contributes `len` bytes (lengths may differ per rank); on
 * return *all (malloc'ed) holds the contributions concatenated by rank and
 * lens[r] each length.  Root: gathers, then sends everything to everyone. */
static zpp_status_t round_trip_(tcp_t *b, const void *mine, uint64_t len,
                                uint64_t *lens, char **all, double timeout_s,
                                const char *func);

static zpp_status_t round_trip(tcp_t *b, const void *mine, uint64_t len,
                               uint64_t *lens, char **all, double timeout_s,
                               const char *func) {
  zpp_status_t st;
  zpp_tcp_io_watch(b->abort);
  st = round_trip_(b, mine, len, lens, all, timeout_s, func);
  zpp_tcp_io_watch(NULL);
  return st;
}

static zpp_status_t round_trip_(tcp_t *b, const void *mine, uint64_t len,
                                uint64_t *lens, char **all, double timeout_s,
                                const char *func) {
  int64_t deadline = zpp_tcp_deadline_of(timeout_s);
  int n = b->size, r, rc;
  uint64_t total = 0;
  char *buf = NULL, **part = NULL;
  char err[ZPP_TCP_ERRLEN];
  zpp_status_t st = ZPP_OK;
  if (b->broken)
    return zpp_error(ZPP_ERR_SYSTEM, func,
                     "bootstrap unusable after an earlier error (%s)",
                     b->broken_why);
  b->seq++;
  if (!b->is_root) {
    zpp_tcp_msg_hdr_t mh;
    rc = zpp_tcp_send_msg(b->hub, ZPP_TCP_M_DATA, b->seq, mine, (size_t)len,
                          NULL, 0, deadline);
    if (rc == 0)
      rc = zpp_tcp_recv_all(b->hub, &mh, sizeof mh, deadline);
    if (rc != 0) {
      st = zpp_error(zpp_tcp_io_status(rc), func,
                     "rank %d: bootstrap exchange with the %s (rank %d): %s "
                     "after %.3g s",
                     b->rank, b->peer_name, b->root_rank, zpp_tcp_io_what(rc),
                     rc == 1 ? timeout_s : 0.0);
      goto err_broken;
    }
    if (mh.magic != ZPP_TCP_MSG_MAGIC || mh.len > ((uint64_t)1 << 40)) {
      st = zpp_error(ZPP_ERR_SYSTEM, func, "bad message from the %s",
                     b->peer_name);
      goto err_broken;
    }
    buf = malloc(mh.len + 1);
    if (buf == NULL) {
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "%llu bytes",
                     (unsigned long long)mh.len);
      goto err_broken;
    }
    rc = zpp_tcp_recv_all(b->hub, buf, (size_t)mh.len, deadline);
    if (rc != 0) {
      st = zpp_error(zpp_tcp_io_status(rc), func,
                     "rank %d: receiving from the %s: %s", b->rank,
                     b->peer_name, zpp_tcp_io_what(rc));
      goto err_broken;
    }
    if (mh.type == ZPP_TCP_M_ERR) {
      buf[mh.len] = '\0';
      st = zpp_error(
          strstr(buf, "did not take part") ? ZPP_ERR_TIMEOUT : ZPP_ERR_SYSTEM,
          func, "bootstrap (via the root, rank %d): %s", b->root_rank, buf);
      goto err_broken;
    }
    if (mh.type != ZPP_TCP_M_DATA || mh.seq != b->seq ||
        mh.len < (uint64_t)n * 8) {
      st = zpp_error(ZPP_ERR_SYSTEM, func,
                     "bootstrap out of step with the root (message %u, "
                     "round %llu, expected %llu): ranks called the "
                     "bootstrap in different orders",
                     mh.type, (unsigned long long)mh.seq,
                     (unsigned long long)b->seq);
      goto err_broken;
    }
    memcpy(lens, buf, (size_t)n * 8);
    memmove(buf, buf + (size_t)n * 8, (size_t)(mh.len - (uint64_t)n * 8));
    *all = buf;
    return ZPP_OK;
  }
  /* root */
  part = calloc((size_t)n, sizeof *part);
  if (part == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "%d parts", n);
  for (r = 0; r < n && st == ZPP_OK; r++) {
    zpp_tcp_msg_hdr_t mh;
    if (r == b->rank) {
      lens[r] = len;
      part[r] = malloc(len + 1);
      if (part[r] == NULL)
        st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "part");
      else if (len > 0)
        memcpy(part[r], mine, (size_t)len);
      continue;
    }
    rc = zpp_tcp_recv_all(b->fd[r], &mh, sizeof mh, deadline);
    if (rc == 0 && (mh.magic != ZPP_TCP_MSG_MAGIC ||
                    mh.type != ZPP_TCP_M_DATA || mh.len > ((uint64_t)1 << 40)))
      rc = -3;
    if (rc == 0 && mh.seq != b->seq)
      rc = -4;
    if (rc == 0) {
      part[r] = malloc(mh.len + 1);
      lens[r] = mh.len;
      rc = part[r] == NULL
               ? -5
               : zpp_tcp_recv_all(b->fd[r], part[r], mh.len, deadline);
    }
    if (rc != 0) {
      if (rc == 1)
        snprintf(err, sizeof err,
                 "rank %d did not take part in bootstrap round %llu within "
                 "%.3g s (ZPP_TIMEOUT_S)",
                 r, (unsigned long long)b->seq, timeout_s);
      else if (rc == -4)
        snprintf(err, sizeof err,
                 "rank %d is out of step (round %llu, the root is at %llu): "
                 "ranks called the bootstrap in different orders",
                 r, (unsigned long long)mh.seq, (unsigned long long)b->seq);
      else
        snprintf(err, sizeof err, "rank %d: %s", r,
                 rc == -2   ? "closed its bootstrap connection (exited?)"
                 : rc == -3 ? "sent a malformed message"
                 : rc == -5 ? "out of memory"
                 : rc == -6 ? "the root was aborted (zpp_comm_abort)"
                            : strerror(errno));
      st = zpp_error(zpp_tcp_io_status(rc), func, "bootstrap: %s", err);
      root_fail_all(b, err);
    }
  }
  if (st == ZPP_OK) {
    for (r = 0; r < n; r++)
      total += lens[r];
    buf = malloc((size_t)total + (size_t)n * 8 + 1);
    if (buf == NULL) {
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "%llu bytes",
                     (unsigned long long)total);
      root_fail_all(b, "the root ran out of memory");
    }
  }
  if (st == ZPP_OK) {
    uint64_t off = (uint64_t)n * 8;
    memcpy(buf, lens, (size_t)n * 8);
    for (r = 0; r < n; r++) {
      if (lens[r] > 0)
        memcpy(buf + off, part[r], (size_t)lens[r]);
      off += lens[r];
    }
    for (r = 0; r < n && st == ZPP_OK; r++) {
      if (r == b->rank)
        continue;
      rc = zpp_tcp_send_msg(b->fd[r], ZPP_TCP_M_DATA, b->seq, buf, (size_t)off,
                            NULL, 0, deadline);
      if (rc != 0) {
        snprintf(err, sizeof err, "rank %d: %s", r,
                 rc == -2 ? "closed its bootstrap connection (exited?)"
                          : zpp_tcp_io_what(rc));
        st = zpp_error(zpp_tcp_io_status(rc), func, "bootstrap: %s", err);
        root_fail_all(b, err);
      }
    }
    if (st == ZPP_OK)
      memmove(buf, buf + (size_t)n * 8, (size_t)total);
  }
  for (r = 0; r < n; r++)
    free(part[r]);
  free(part);
  if (st != ZPP_OK) {
    free(buf);
    goto err_broken;
  }
  *all = buf;
  return ZPP_OK;
err_broken:
  free(buf);
  b->broken = 1;
  snprintf(b->broken_why, sizeof b->broken_why, "%s", zpp_get_last_error());
  return st;
}

static zpp_status_t tcp_allgather(void *ctx, const void *mine, size_t bytes,
                                  void *all, double timeout_s) {
  tcp_t *b = ctx;
  uint64_t *lens = malloc((size_t)b->size * sizeof *lens);
  char *got = NULL;
  zpp_status_t st;
  int r;
  if (lens == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "bootstrap allgather", "lengths");
  st = round_trip(b, mine, bytes, lens, &got, timeout_s, "bootstrap allgather");
  for (r = 0; st == ZPP_OK && r < b->size; r++)
    if (lens[r] != bytes)
      st = zpp_error(ZPP_ERR_MISMATCH, "bootstrap allgather",
                     "rank %d contributed %llu bytes, rank %d %zu", r,
                     (unsigned long long)lens[r], b->rank, bytes);
  if (st == ZPP_OK && bytes > 0)
    memcpy(all, got, bytes * (size_t)b->size);
  free(got);
  free(lens);
  return st;
}

static zpp_status_t tcp_bcast(void *ctx, void *buf, size_t bytes, int root,
                              double timeout_s) {
  tcp_t *b = ctx;
  uint64_t *lens;
  char *got = NULL;
  zpp_status_t st;
  int r;
  uint64_t off = 0;
  if (root < 0 || root >= b->size)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, "bootstrap bcast",
                     "root %d: must be in [0, %d)", root, b->size);
  lens = malloc((size_t)b->size * sizeof *lens);
  if (lens == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "bootstrap bcast", "lengths");
  st = round_trip(b, buf, b->rank == root ? bytes : 0, lens, &got, timeout_s,
                  "bootstrap bcast");
  if (st == ZPP_OK && lens[root] != bytes)
    st = zpp_error(ZPP_ERR_MISMATCH, "bootstrap bcast",
                   "root %d sent %llu bytes, rank %d expects %zu", root,
                   (unsigned long long)lens[root], b->rank, bytes);
  for (r = 0; st == ZPP_OK && r < root; r++)
    off += lens[r];
  if (st == ZPP_OK && bytes > 0 && b->rank != root)
    memcpy(buf, got + off, bytes);
  free(got);
  free(lens);
  return st;
}

static zpp_status_t tcp_barrier(void *ctx, double timeout_s) {
  tcp_t *b = ctx;
  uint64_t *lens = malloc((size_t)b->size * sizeof *lens);
  char *got = NULL;
  zpp_status_t st;
  if (lens == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "bootstrap barrier", "lengths");
  st = round_trip(b, NULL, 0, lens, &got, timeout_s, "bootstrap barrier");
  free(got);
  free(lens);
  return st;
}

void zpp_tcp_boot_free(void *ctx) { tcp_close(ctx); }

void zpp_tcp_boot_watch(void *ctx, const atomic_int *flag) {
  if (ctx != NULL)
    ((tcp_t *)ctx)->abort = flag;
}

uint32_t zpp_tcp_boot_ip(void *ctx) { return ((tcp_t *)ctx)->local_ip; }

zpp_status_t zpp_tcp_boot_create(const zpp_unique_id_t *id, int nranks,
                                 int rank, double timeout_s,
                                 const char *rank_error, zpp_bootstrap_t *out,
                                 const char *func) {
  zpp_tcp_id_fields_t f;
  tcp_t *b;
  zpp_tcp_hello_t h;
  int lfd, r;
  int64_t deadline = zpp_tcp_deadline_of(timeout_s);
  zpp_status_t st;
  ZPP_CHECK(zpp_tcp_id_unpack(id, &f, func));
  lfd = zpp_tcp_reg_take(f.session);
  if (lfd >= 0 && rank_error != NULL) {
    close(lfd);
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func, "%s", rank_error);
  }
  b = calloc(1, sizeof *b);
  if (b == NULL) {
    if (lfd >= 0)
      close(lfd);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "bootstrap");
  }
  b->rank = rank;
  b->size = nranks;
  b->hub = -1;
  b->local_ip = f.ip;
  if (lfd >= 0) {
    b->is_root = 1;
    b->root_rank = rank;
    b->fd = malloc((size_t)nranks * sizeof *b->fd);
    if (b->fd == NULL) {
      close(lfd);
      tcp_close(b);
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "bootstrap");
    }
    for (r = 0; r < nranks; r++)
      b->fd[r] = -1;
    /* The root stops waiting for late ranks a little before the others
     * give up on it, so its verdict ("rank 3 never arrived") reaches them
     * within their timeout. */
    int64_t root_deadline =
        deadline == INT64_MAX
            ? deadline
            : zpp_time_ns() + (int64_t)(timeout_s * 0.85 * 1e9);
    st = root_gather(b, lfd, f.session, root_deadline, timeout_s * 0.85, func);
    close(lfd);
  } else {
    fill_hello(&h, f.session, rank, nranks);
    if (rank_error != NULL) {
      h.failed = 1;
      snprintf(h.why, sizeof h.why, "%s", rank_error);
      /* Tell the root (so every rank hears it), then fail. */
      client_join(b, &f, &h, zpp_time_ns() + (int64_t)2e9, timeout_s, func);
      tcp_close(b);
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func, "%s", rank_error);
    }
    st = client_join(b, &f, &h, deadline, timeout_s, func);
  }
  if (st != ZPP_OK) {
    tcp_close(b);
    return st;
  }
  {
    /* Learn who the root is (one round; also checks that all are in). */
    int32_t flag = b->is_root, *all = malloc((size_t)nranks * sizeof *all);
    if (all == NULL) {
      tcp_close(b);
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "roster");
    }
    st = tcp_allgather(b, &flag, sizeof flag, all, timeout_s);
    for (r = 0; st == ZPP_OK && r < nranks; r++)
      if (all[r])
        b->root_rank = r;
    free(all);
    if (st != ZPP_OK) {
      tcp_close(b);
      return st;
    }
  }
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->name = "tcp";
  out->rank = rank;
  out->size = nranks;
  out->ctx = b;
  out->allgather = tcp_allgather;
  out->bcast = tcp_bcast;
  out->barrier = tcp_barrier;
  return ZPP_OK;
}
