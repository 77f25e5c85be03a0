/* The listener every communicator keeps for zpp_comm_shrink
 * (comm/rescue.h): opened at creation, its addresses exchanged, closed at
 * destruction, and never kept by a forked child.  A dead process's socket
 * refuses connections: the only proof of death comm/shrink.c uses. */
#include "comm/comm.h"

#include "comm/comm_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/rescue.h"
#include "comm/tcp.h"
#include "core/core.h"

/* The address other hosts reach this process by: ZPP_BOOTSTRAP_ADDR when
 * set, else the TCP bootstrap's, else none (0: the listener takes
 * loopback, and a communicator spanning hosts gets no listener).  No guess
 * from the interfaces: a bridge such as docker0 has the same address on
 * every host. */
static zpp_status_t host_ip(void *tcp, uint32_t *ip) {
  *ip = 0;
  if (zpp_setting("ZPP_BOOTSTRAP_ADDR")[0] != '\0')
    return zpp_tcp_listen_addr("zpp_comm_shrink's listener", ip);
  if (tcp != NULL)
    *ip = zpp_tcp_boot_ip(tcp);
  return ZPP_OK;
}

/* The listeners of this process.  A process forked from a rank (a data
 * loader's worker) must not keep them: the rank's death would leave its
 * socket accepting, with no refusal to prove it.  In the fork's child each
 * becomes a socket that does not listen (the descriptor stays valid for
 * that process's own zpp_comm_destroy). */
static pthread_mutex_t lis_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t lis_once = PTHREAD_ONCE_INIT;
static int *lis_fd, lis_n, lis_cap, lis_hooked;

static void lis_prepare(void) { pthread_mutex_lock(&lis_lock); }

static void lis_parent(void) { pthread_mutex_unlock(&lis_lock); }

static void lis_child(void) {
  int i;
  for (i = 0; i < lis_n; i++) {
    int d = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (d < 0 || dup3(d, lis_fd[i], O_CLOEXEC) < 0)
      close(lis_fd[i]); /* no descriptor to spare: closed outright */
    if (d >= 0)
      close(d);
  }
  lis_n = 0;
  pthread_mutex_unlock(&lis_lock);
}

static void lis_init(void) {
  lis_hooked = pthread_atfork(lis_prepare, lis_parent, lis_child) == 0;
}

/* 0 when fd is registered (the fork handler is in place). */
static int lis_add(int fd) {
  int ok = 0;
  pthread_once(&lis_once, lis_init);
  pthread_mutex_lock(&lis_lock);
  if (lis_hooked && lis_n == lis_cap) {
    int cap = lis_cap > 0 ? 2 * lis_cap : 8;
    int *v = realloc(lis_fd, (size_t)cap * sizeof *v);
    if (v != NULL) {
      lis_fd = v;
      lis_cap = cap;
    }
  }
  if (lis_hooked && lis_n < lis_cap) {
    lis_fd[lis_n++] = fd;
    ok = 1;
  }
  pthread_mutex_unlock(&lis_lock);
  return ok ? 0 : -1;
}

void zpp_rescue_close(int fd) {
  int i;
  if (fd < 0)
    return;
  pthread_mutex_lock(&lis_lock);
  for (i = 0; i < lis_n; i++)
    if (lis_fd[i] == fd) {
      lis_fd[i] = lis_fd[--lis_n];
      break;
    }
  pthread_mutex_unlock(&lis_lock);
  close(fd);
}

void zpp_rescue_open(void *tcp, int *fd, uint32_t *ip, uint16_t *port) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  uint32_t at = 0;
  int s;
  *fd = -1;
  *port = 0;
  *ip = 0;
  if (host_ip(tcp, &at) != ZPP_OK) {
    ZPP_WARN(ZPP_SUBSYS_INIT, "zpp_comm_shrink will be unsupported: %s",
             zpp_get_last_error());
    return;
  }
  if (at == 0)
    at = htonl(INADDR_LOOPBACK);
  s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) {
    ZPP_WARN(ZPP_SUBSYS_INIT, "zpp_comm_shrink will be unsupported: socket: %s",
             strerror(errno));
    return;
  }
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = at;
  if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 1024) != 0 ||
      getsockname(s, (struct sockaddr *)&sa, &sl) != 0) {
    ZPP_WARN(ZPP_SUBSYS_INIT,
             "zpp_comm_shrink will be unsupported: bind/listen: %s",
             strerror(errno));
    close(s);
    return;
  }
  if (lis_add(s) != 0) {
    ZPP_WARN(ZPP_SUBSYS_INIT, "zpp_comm_shrink will be unsupported: no "
                              "memory or fork handler for its listener");
    close(s);
    return;
  }
  *fd = s;
  *port = ntohs(sa.sin_port);
  *ip = at;
}

zpp_status_t zpp_rescue_none(zpp_comm_t c, const char *why, const char *func) {
  struct zpp_rescue *rs = calloc(1, sizeof *rs);
  if (rs == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "shrink state");
  rs->fd = -1;
  snprintf(rs->why, sizeof rs->why, "%s", why);
  c->rescue = rs;
  return ZPP_OK;
}

int zpp_rescue_fd(zpp_comm_t c) {
  return c->rescue != NULL ? c->rescue->fd : -1;
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
    zpp_rescue_close(fd);
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
  zpp_rescue_close(rs->fd);
  free(rs->ip);
  free(rs->port);
  free(rs);
  c->rescue = NULL;
}
