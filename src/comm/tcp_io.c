/*
 * The TCP bootstrap's I/O: every socket read and write under a deadline,
 * and its framed messages (comm/tcp.h).
 */
#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/tcp.h"
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

int64_t zpp_tcp_deadline_of(double timeout_s) {
  return timeout_s > 0 ? zpp_time_ns() + (int64_t)(timeout_s * 1e9) : INT64_MAX;
}

static int zpp_tcp_ms_left(int64_t deadline) {
  int64_t left;
  if (deadline == INT64_MAX)
    return 1000;
  left = (deadline - zpp_time_ns()) / 1000000;
  if (left <= 0)
    return 0;
  return left > 1000 ? 1000 : (int)left + 1;
}

/* The communicator's broken flag while this thread runs one of its
 * exchanges (zpp_tcp_boot_watch): zpp_comm_abort ends the waits. */
static _Thread_local const atomic_int *tl_abort;

void zpp_tcp_io_watch(const atomic_int *flag) { tl_abort = flag; }

/* Waits until fd is readable/writable; 0 ok, 1 timeout, -1 error, -6
 * aborted. */
int zpp_tcp_wait_fd(int fd, short ev, int64_t deadline) {
  for (;;) {
    struct pollfd p = {fd, ev, 0};
    int ms = zpp_tcp_ms_left(deadline), rc;
    if (tl_abort != NULL && atomic_load(tl_abort))
      return -6;
    if (ms == 0 && zpp_time_ns() >= deadline)
      return 1;
    if (tl_abort != NULL && ms > 100)
      ms = 100;
    rc = poll(&p, 1, ms);
    if (rc > 0)
      return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & ev) ? -1 : 0;
    if (rc < 0 && errno != EINTR)
      return -1;
    if (deadline != INT64_MAX && zpp_time_ns() >= deadline)
      return 1;
  }
}

/* 0 ok; 1 timeout; -1 error (errno), -2 closed by the peer. */
static int zpp_tcp_send_all(int fd, const void *buf, size_t n,
                            int64_t deadline) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int w = zpp_tcp_wait_fd(fd, POLLOUT, deadline);
      if (w != 0)
        return w;
      continue;
    }
    return (k < 0 && (errno == EPIPE || errno == ECONNRESET)) ? -2 : -1;
  }
  return 0;
}

int zpp_tcp_recv_all(int fd, void *buf, size_t n, int64_t deadline) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0)
      return -2;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = zpp_tcp_wait_fd(fd, POLLIN, deadline);
      if (w != 0)
        return w;
      continue;
    }
    return errno == ECONNRESET ? -2 : -1;
  }
  return 0;
}

int zpp_tcp_send_msg(int fd, uint32_t type, uint64_t seq, const void *a,
                     size_t alen, const void *b, size_t blen,
                     int64_t deadline) {
  zpp_tcp_msg_hdr_t h = {ZPP_TCP_MSG_MAGIC, type, seq, (uint64_t)(alen + blen)};
  int rc = zpp_tcp_send_all(fd, &h, sizeof h, deadline);
  if (rc == 0 && alen > 0)
    rc = zpp_tcp_send_all(fd, a, alen, deadline);
  if (rc == 0 && blen > 0)
    rc = zpp_tcp_send_all(fd, b, blen, deadline);
  return rc;
}

const char *zpp_tcp_io_what(int rc) {
  return rc == 1    ? "timed out"
         : rc == -2 ? "connection closed"
         : rc == -6 ? "aborted (zpp_comm_abort)"
                    : strerror(errno);
}

zpp_status_t zpp_tcp_io_status(int rc) {
  return rc == 1    ? ZPP_ERR_TIMEOUT
         : rc == -6 ? ZPP_ERR_ABORTED
                    : ZPP_ERR_SYSTEM;
}

void zpp_tcp_set_sockopts(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}
