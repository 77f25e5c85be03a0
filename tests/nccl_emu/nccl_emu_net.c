/*
 * The NCCL stand-in's wire: one UNIX-domain stream socket per pair of
 * ranks, in the abstract namespace, named from the communicator's token
 * (so nothing is left on disk and only processes of this machine meet).
 * Rank r listens on "zpp-nccl-emu-<token>-<r>", connects to every lower
 * rank and accepts every higher one; a hello on each connection says who
 * is calling and with which device.
 *
 * Framing: a header (kind, tag, length) and the payload.  A receiver
 * thread per communicator reads every connection into per-peer inboxes of
 * host memory, so a send never waits for the peer's stream to reach the
 * matching operation; the operations take their messages from the inboxes
 * (emu_take) when their stream runs them.  Every wait has a deadline
 * (ZPP_NCCL_EMU_TIMEOUT_S) and ends early on abort.
 */
#include "nccl_emu_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EMU_HELLO_MAGIC 0x7a70686cu /* "zphl" */
#define EMU_FRAME_MAGIC 0x7a70666du /* "zpfm" */

typedef struct {
  uint32_t magic, kind;
  uint64_t tag, len;
} emu_frame_t;

static void nap_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

static int is_aborted(emu_comm_t *c) {
  int a;
  pthread_mutex_lock(&c->lock);
  a = c->aborted;
  pthread_mutex_unlock(&c->lock);
  return a;
}

static socklen_t sock_name(struct sockaddr_un *a, const uint64_t token[2],
                           int rank) {
  int n;
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  /* sun_path[0] == '\0': the abstract namespace */
  n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1,
               "zpp-nccl-emu-%016llx%016llx-%d", (unsigned long long)token[0],
               (unsigned long long)token[1], rank);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Writes all of buf before the deadline; the socket is non-blocking. */
static int write_all(emu_comm_t *c, int fd, const void *buf, size_t len,
                     int64_t deadline, const char **why) {
  const char *p = buf;
  while (len > 0) {
    ssize_t k = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      len -= (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pf = {fd, POLLOUT, 0};
      if (emu_now_ns() > deadline) {
        *why = "timed out (ZPP_NCCL_EMU_TIMEOUT_S)";
        return -1;
      }
      if (c != NULL && is_aborted(c)) {
        *why = "communicator aborted";
        return -1;
      }
      poll(&pf, 1, 50);
      continue;
    }
    *why = k < 0 ? strerror(errno) : "connection closed";
    return -1;
  }
  return 0;
}

/* Reads exactly len bytes before the deadline (0), or says why not: the
 * peer closed (1, with *got the bytes read), an error or timeout (-1). */
static int read_all(emu_comm_t *c, int fd, void *buf, size_t len,
                    int64_t deadline, size_t *got, const char **why) {
  char *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t k = recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (k > 0) {
      done += (size_t)k;
      continue;
    }
    if (k == 0) {
      if (got)
        *got = done;
      *why = "connection closed";
      return 1;
    }
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      struct pollfd pf = {fd, POLLIN, 0};
      if (emu_now_ns() > deadline) {
        *why = "timed out (ZPP_NCCL_EMU_TIMEOUT_S)";
        return -1;
      }
      if (c != NULL && is_aborted(c)) {
        *why = "communicator aborted";
        return -1;
      }
      poll(&pf, 1, 50);
      continue;
    }
    *why = strerror(errno);
    return -1;
  }
  if (got)
    *got = done;
  return 0;
}

static int nonblocking_socket(void) {
  return socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
}

/* ---- receiver thread ------------------------------------------------------ */

static void inbox_push_locked(emu_peer_t *p, emu_msg_t *m) {
  m->next = NULL;
  if (p->tail)
    p->tail->next = m;
  else
    p->head = m;
  p->tail = m;
}

/* Reads one message from peer q; 0 on success, else the peer is gone. */
static int rx_one(emu_comm_t *c, int q) {
  emu_peer_t *p = &c->peers[q];
  emu_frame_t f;
  emu_msg_t *m;
  const char *why = NULL;
  size_t got = 0;
  /* A message is written whole, so once its header is here the rest
   * follows; the deadline only guards against a peer dying mid-message. */
  int64_t deadline = emu_deadline();
  int rc = read_all(NULL, p->fd, &f, sizeof f, deadline, &got, &why);
  if (rc != 0 || f.magic != EMU_FRAME_MAGIC) {
    pthread_mutex_lock(&c->lock);
    if (p->gone == 0)
      p->gone = 2;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  if (f.kind == EMU_MSG_BYE) {
    pthread_mutex_lock(&c->lock);
    p->gone = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  m = calloc(1, sizeof *m);
  if (m != NULL && f.len > 0)
    m->data = malloc((size_t)f.len);
  if (m == NULL || (f.len > 0 && m->data == NULL)) {
    emu_msg_free(m);
    emu_set_async(c, ncclSystemError,
                  "stand-in: out of host memory for a %llu-byte message from "
                  "rank %d",
                  (unsigned long long)f.len, q);
    return -1;
  }
  m->kind = f.kind;
  m->tag = f.tag;
  m->len = (size_t)f.len;
  if (f.len > 0 &&
      read_all(NULL, p->fd, m->data, m->len, deadline, NULL, &why) != 0) {
    emu_msg_free(m);
    pthread_mutex_lock(&c->lock);
    if (p->gone == 0)
      p->gone = 2;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  pthread_mutex_lock(&c->lock);
  inbox_push_locked(p, m);
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  return 0;
}

static void *rx_main(void *arg) {
  emu_comm_t *c = arg;
  int n = c->nranks, i;
  struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
  int *who = calloc((size_t)n + 1, sizeof *who);
  if (pf == NULL || who == NULL) {
    emu_set_async(c, ncclSystemError, "stand-in: out of host memory");
    free(pf);
    free(who);
    return NULL;
  }
  for (;;) {
    int k = 0;
    pf[k].fd = c->wake[0];
    pf[k].events = POLLIN;
    who[k++] = -1;
    pthread_mutex_lock(&c->lock);
    for (i = 0; i < n; i++)
      if (c->peers[i].fd >= 0 && c->peers[i].gone == 0) {
        pf[k].fd = c->peers[i].fd;
        pf[k].events = POLLIN;
        who[k++] = i;
      }
    pthread_mutex_unlock(&c->lock);
    if (poll(pf, (nfds_t)k, 1000) < 0 && errno != EINTR)
      break;
    if (pf[0].revents)
      break; /* emu_mesh_close */
    for (i = 1; i < k; i++)
      if (pf[i].revents)
        rx_one(c, who[i]);
  }
  free(pf);
  free(who);
  return NULL;
}

/* ---- mesh ------------------------------------------------------------------ */

static ncclResult_t send_hello(emu_comm_t *c, int fd, const emu_hello_t *h,
                               int64_t deadline, int peer) {
  const char *why = NULL;
  if (write_all(c, fd, h, sizeof *h, deadline, &why) != 0)
    return emu_fail(ncclSystemError,
                    "stand-in bootstrap: rank %d could not greet rank %d: %s",
                    c->rank, peer, why);
  return ncclSuccess;
}

static ncclResult_t read_hello(emu_comm_t *c, int fd, emu_hello_t *h,
                               int64_t deadline) {
  const char *why = NULL;
  if (read_all(c, fd, h, sizeof *h, deadline, NULL, &why) != 0)
    return emu_fail(ncclSystemError,
                    "stand-in bootstrap: rank %d got no hello: %s", c->rank,
                    why);
  if (h->magic != EMU_HELLO_MAGIC || h->token[0] != c->token[0] ||
      h->token[1] != c->token[1])
    return emu_fail(ncclInvalidUsage,
                    "stand-in bootstrap: rank %d was reached by a process of "
                    "another communicator",
                    c->rank);
  if (h->nranks != c->nranks)
    return emu_fail(ncclInvalidUsage,
                    "ncclCommInitRank: rank %d was given nranks %d but rank "
                    "%d nranks %d for the same unique id",
                    c->rank, c->nranks, h->rank, h->nranks);
  if (h->rank < 0 || h->rank >= c->nranks || h->rank == c->rank)
    return emu_fail(ncclInvalidUsage,
                    "ncclCommInitRank: two processes claim rank %d of %d",
                    h->rank, c->nranks);
  return ncclSuccess;
}

ncclResult_t emu_mesh_connect(emu_comm_t *c, const emu_hello_t *mine,
                              emu_hello_t *all) {
  struct sockaddr_un a;
  socklen_t alen;
  int64_t deadline = emu_deadline();
  int n = c->nranks, me = c->rank, lfd = -1, j, accepted = 0;
  ncclResult_t r = ncclSuccess;
  all[me] = *mine;
  all[me].magic = EMU_HELLO_MAGIC;
  if (pipe2(c->wake, O_CLOEXEC) != 0)
    return emu_fail(ncclSystemError, "stand-in: pipe: %s", strerror(errno));
  if (n == 1)
    goto start_rx;
  lfd = nonblocking_socket();
  if (lfd < 0)
    return emu_fail(ncclSystemError, "stand-in: socket: %s", strerror(errno));
  alen = sock_name(&a, c->token, me);
  if (bind(lfd, (struct sockaddr *)&a, alen) != 0) {
    int e = errno;
    close(lfd);
    if (e == EADDRINUSE)
      return emu_fail(ncclInvalidUsage,
                      "ncclCommInitRank: rank %d of this unique id is already "
                      "taken (two ranks given the same rank, or the id reused "
                      "while its communicator lives)",
                      me);
    return emu_fail(ncclSystemError, "stand-in: bind: %s", strerror(e));
  }
  if (listen(lfd, n) != 0) {
    r = emu_fail(ncclSystemError, "stand-in: listen: %s", strerror(errno));
    goto out;
  }
  /* Lower ranks: connect (retrying until they listen), then greet. */
  for (j = 0; j < me && r == ncclSuccess; j++) {
    int fd = nonblocking_socket();
    struct sockaddr_un b;
    socklen_t blen = sock_name(&b, c->token, j);
    if (fd < 0) {
      r = emu_fail(ncclSystemError, "stand-in: socket: %s", strerror(errno));
      break;
    }
    for (;;) {
      if (connect(fd, (struct sockaddr *)&b, blen) == 0)
        break;
      if (errno == EINPROGRESS || errno == EAGAIN) {
        /* UNIX sockets: the backlog is full; wait for room. */
        struct pollfd pf = {fd, POLLOUT, 0};
        poll(&pf, 1, 10);
        continue;
      }
      if (errno != ECONNREFUSED && errno != ENOENT) {
        r = emu_fail(ncclSystemError, "stand-in: connect to rank %d: %s", j,
                     strerror(errno));
        break;
      }
      if (emu_now_ns() > deadline || is_aborted(c)) {
        r = emu_fail(ncclSystemError,
                     "ncclCommInitRank: rank %d of %d never appeared within "
                     "%.3g s (ZPP_NCCL_EMU_TIMEOUT_S)%s",
                     j, n, emu_timeout_s(),
                     is_aborted(c) ? "; communicator aborted" : "");
        break;
      }
      nap_ms(2);
    }
    if (r != ncclSuccess) {
      close(fd);
      break;
    }
    c->peers[j].fd = fd;
    r = send_hello(c, fd, &all[me], deadline, j);
  }
  /* Higher ranks: accept, read their hello, answer. */
  while (r == ncclSuccess && accepted < n - 1 - me) {
    struct pollfd pf = {lfd, POLLIN, 0};
    emu_hello_t h;
    int fd;
    if (emu_now_ns() > deadline || is_aborted(c)) {
      r = emu_fail(ncclSystemError,
                   "ncclCommInitRank: rank %d heard from only %d of the %d "
                   "higher ranks within %.3g s (ZPP_NCCL_EMU_TIMEOUT_S)%s",
                   me, accepted, n - 1 - me, emu_timeout_s(),
                   is_aborted(c) ? "; communicator aborted" : "");
      break;
    }
    if (poll(&pf, 1, 50) <= 0)
      continue;
    fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0)
      continue;
    r = read_hello(c, fd, &h, deadline);
    if (r == ncclSuccess && (h.rank < me || c->peers[h.rank].fd >= 0))
      r = emu_fail(ncclInvalidUsage,
                   "ncclCommInitRank: two processes claim rank %d of %d",
                   h.rank, n);
    if (r != ncclSuccess) {
      close(fd);
      break;
    }
    c->peers[h.rank].fd = fd;
    all[h.rank] = h;
    accepted++;
    r = send_hello(c, fd, &all[me], deadline, h.rank);
  }
  /* The answers of the lower ranks. */
  for (j = 0; j < me && r == ncclSuccess; j++) {
    emu_hello_t h;
    r = read_hello(c, c->peers[j].fd, &h, deadline);
    if (r == ncclSuccess && h.rank != j)
      r = emu_fail(ncclInvalidUsage,
                   "ncclCommInitRank: rank %d answered as rank %d", j, h.rank);
    if (r == ncclSuccess)
      all[j] = h;
  }
out:
  close(lfd);
  if (r != ncclSuccess)
    return r;
start_rx:
  if (pthread_create(&c->rx, NULL, rx_main, c) != 0)
    return emu_fail(ncclSystemError, "stand-in: pthread_create failed");
  c->rx_started = 1;
  return ncclSuccess;
}

/* ---- messages ------------------------------------------------------------- */

void emu_msg_free(emu_msg_t *m) {
  if (m == NULL)
    return;
  free(m->data);
  free(m);
}

ncclResult_t emu_send(emu_comm_t *c, int peer, uint32_t kind, uint64_t tag,
                      const void *data, size_t len) {
  emu_peer_t *p = &c->peers[peer];
  emu_frame_t f;
  const char *why = NULL;
  int64_t deadline = emu_deadline();
  int rc;
  if (peer == c->rank) {
    emu_msg_t *m = calloc(1, sizeof *m);
    if (m != NULL && len > 0 && (m->data = malloc(len)) == NULL) {
      free(m);
      m = NULL;
    }
    if (m == NULL) {
      emu_set_async(c, ncclSystemError, "stand-in: out of host memory");
      return ncclSystemError;
    }
    m->kind = kind;
    m->tag = tag;
    m->len = len;
    if (len > 0)
      memcpy(m->data, data, len);
    pthread_mutex_lock(&c->lock);
    inbox_push_locked(p, m);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return ncclSuccess;
  }
  f.magic = EMU_FRAME_MAGIC;
  f.kind = kind;
  f.tag = tag;
  f.len = len;
  pthread_mutex_lock(&p->send_lock);
  rc = write_all(c, p->fd, &f, sizeof f, deadline, &why);
  if (rc == 0 && len > 0)
    rc = write_all(c, p->fd, data, len, deadline, &why);
  pthread_mutex_unlock(&p->send_lock);
  if (rc != 0) {
    emu_set_async(c, ncclRemoteError,
                  "stand-in: rank %d could not send %zu bytes to rank %d: %s",
                  c->rank, len, peer, why);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

static const char *kind_name(uint32_t kind) {
  switch (kind) {
  case EMU_MSG_COLL: return "a collective's data";
  case EMU_MSG_P2P: return "ncclSend data";
  case EMU_MSG_CTS: return "the matching ncclRecv";
  case EMU_MSG_SPLIT: return "ncclCommSplit's colour";
  }
  return "a message";
}

ncclResult_t emu_take(emu_comm_t *c, int peer, uint32_t kind, uint64_t tag,
                      int64_t deadline, emu_msg_t **out) {
  emu_peer_t *p = &c->peers[peer];
  ncclResult_t r = ncclSuccess;
  struct timespec ts;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    emu_msg_t *m, *prev = NULL;
    for (m = p->head; m != NULL; prev = m, m = m->next)
      if (m->kind == kind && m->tag == tag)
        break;
    if (m != NULL) {
      if (prev)
        prev->next = m->next;
      else
        p->head = m->next;
      if (p->tail == m)
        p->tail = prev;
      m->next = NULL;
      *out = m;
      break;
    }
    if (c->aborted) {
      r = ncclInvalidUsage;
      emu_set_async_locked(c, r, "communicator aborted while rank %d waited "
                           "for %s from rank %d", c->rank, kind_name(kind),
                           peer);
      break;
    }
    if (c->async != ncclSuccess) {
      r = c->async;
      break;
    }
    if (p->gone) {
      r = ncclRemoteError;
      emu_set_async_locked(c, r, "rank %d waited for %s (#%llu) from rank %d, "
                           "which %s", c->rank, kind_name(kind),
                           (unsigned long long)tag, peer,
                           p->gone == 1 ? "destroyed its communicator"
                                        : "aborted or exited");
      break;
    }
    if (emu_now_ns() > deadline) {
      r = ncclRemoteError;
      emu_set_async_locked(c, r, "rank %d waited %.3g s for %s (#%llu) from "
                           "rank %d (ZPP_NCCL_EMU_TIMEOUT_S): a rank is "
                           "missing from the operation, or its stream never "
                           "reached it", c->rank, emu_timeout_s(),
                           kind_name(kind), (unsigned long long)tag, peer);
      break;
    }
    {
      int64_t wake = emu_now_ns() + 100000000; /* re-check every 100 ms */
      if (wake > deadline)
        wake = deadline;
      ts.tv_sec = (time_t)(wake / 1000000000);
      ts.tv_nsec = (long)(wake % 1000000000);
      pthread_cond_timedwait(&c->cond, &c->lock, &ts);
    }
  }
  pthread_mutex_unlock(&c->lock);
  return r;
}

void emu_mesh_bye(emu_comm_t *c) {
  int i;
  emu_frame_t f = {EMU_FRAME_MAGIC, EMU_MSG_BYE, 0, 0};
  for (i = 0; i < c->nranks; i++) {
    const char *why;
    if (c->peers[i].fd < 0)
      continue;
    pthread_mutex_lock(&c->peers[i].send_lock);
    write_all(c, c->peers[i].fd, &f, sizeof f, emu_now_ns() + 1000000000,
              &why);
    pthread_mutex_unlock(&c->peers[i].send_lock);
  }
}

void emu_mesh_shutdown(emu_comm_t *c) {
  int i;
  for (i = 0; i < c->nranks; i++)
    if (c->peers[i].fd >= 0)
      shutdown(c->peers[i].fd, SHUT_RDWR);
}

void emu_mesh_close(emu_comm_t *c) {
  int i;
  if (c->rx_started) {
    char b = 1;
    ssize_t k = write(c->wake[1], &b, 1);
    (void)k;
    pthread_join(c->rx, NULL);
    c->rx_started = 0;
  }
  if (c->wake[0] >= 0) {
    close(c->wake[0]);
    close(c->wake[1]);
    c->wake[0] = c->wake[1] = -1;
  }
  for (i = 0; c->peers != NULL && i < c->nranks; i++) {
    emu_msg_t *m = c->peers[i].head, *next;
    if (c->peers[i].fd >= 0)
      close(c->peers[i].fd);
    c->peers[i].fd = -1;
    for (; m != NULL; m = next) {
      next = m->next;
      emu_msg_free(m);
    }
    c->peers[i].head = c->peers[i].tail = NULL;
  }
}
