/*
 * The TCP bootstrap's unique id (its 128 bytes: comm/tcp.h) and the
 * listeners zpp_get_unique_id leaves open in this process, found again by
 * session when zpp_tcp_boot_create joins as the root; the id from
 * torchrun's or srun's environment (with the first host of a Slurm
 * hostlist).
 */
#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/slurm.h"
#include "comm/tcp.h"
#include "core/core.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- listeners made by zpp_get_unique_id, found again by session -------- */

typedef struct listener {
  uint64_t session;
  int fd;
  struct listener *next;
} listener_t;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static listener_t *reg_head;

static void reg_add(uint64_t session, int fd, listener_t *l) {
  l->session = session;
  l->fd = fd;
  pthread_mutex_lock(&reg_lock);
  l->next = reg_head;
  reg_head = l;
  pthread_mutex_unlock(&reg_lock);
}

/* Removes and returns the listener of `session` (-1: not this process). */
int zpp_tcp_reg_take(uint64_t session) {
  listener_t **p, *l;
  int fd = -1;
  pthread_mutex_lock(&reg_lock);
  for (p = &reg_head; *p != NULL; p = &(*p)->next) {
    if ((*p)->session == session) {
      l = *p;
      *p = l->next;
      fd = l->fd;
      free(l);
      break;
    }
  }
  pthread_mutex_unlock(&reg_lock);
  return fd;
}

static uint64_t zpp_tcp_fnv(const void *p, size_t n) {
  const unsigned char *c = p;
  uint64_t h = 1469598103934665603ull;
  while (n--)
    h = (h ^ *c++) * 1099511628211ull;
  return h;
}

/* ---- the id -----------------------------------------------------------------
 */

static void zpp_tcp_id_pack(zpp_unique_id_t *id, uint32_t ip, uint16_t port,
                            uint64_t session) {
  zpp_tcp_id_fields_t f;
  memset(id, 0, sizeof *id);
  memset(&f, 0, sizeof f);
  memcpy(f.magic, ZPP_TCP_ID_MAGIC, 8);
  f.version = ZPP_TCP_ID_VERSION;
  f.ip = ip;
  f.port = port;
  f.session = session;
  f.sum = zpp_tcp_fnv(&f, offsetof(zpp_tcp_id_fields_t, sum));
  memcpy(id->internal, &f, sizeof f);
}

zpp_status_t zpp_tcp_id_unpack(const zpp_unique_id_t *id,
                               zpp_tcp_id_fields_t *f, const char *func) {
  size_t i;
  memcpy(f, id->internal, sizeof *f);
  if (memcmp(f->magic, ZPP_TCP_ID_MAGIC, 8) != 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "id: malformed (no zpp bootstrap magic; was it made by "
                     "zpp_get_unique_id and copied whole?)");
  if (f->version != ZPP_TCP_ID_VERSION)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "id: version %u, this zpp speaks %u", f->version,
                     ZPP_TCP_ID_VERSION);
  if (f->sum != zpp_tcp_fnv(f, offsetof(zpp_tcp_id_fields_t, sum)))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "id: malformed (checksum mismatch: truncated or "
                     "corrupted in transit)");
  for (i = sizeof *f; i < sizeof id->internal; i++)
    if (id->internal[i] != 0)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                       "id: malformed (non-zero padding at byte %zu)", i);
  if (f->port == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func, "id: malformed (port 0)");
  return ZPP_OK;
}

void zpp_tcp_id_addr(const zpp_tcp_id_fields_t *f, char *buf, size_t len) {
  char ip[INET_ADDRSTRLEN];
  struct in_addr a;
  a.s_addr = f->ip;
  inet_ntop(AF_INET, &a, ip, sizeof ip);
  snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(f->port));
}

/* IPv4 of a host name or dotted address. */
static zpp_status_t zpp_tcp_resolve(const char *host, uint32_t *ip,
                                    const char *func, const char *what) {
  struct addrinfo hints, *res = NULL;
  int rc;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || res == NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s \"%s\": cannot resolve to an IPv4 address (%s)", what,
                     host, gai_strerror(rc));
  *ip = ((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr;
  freeaddrinfo(res);
  return ZPP_OK;
}

zpp_status_t zpp_tcp_listen(uint32_t ip, int port, uint64_t session,
                            zpp_unique_id_t *id, const char *func) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  listener_t *l;
  int fd, one = 1;
  char addr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, addr, sizeof addr);
  if (port < 0 || port > 65535)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "port %d: must be in [0, 65535]", port);
  l = calloc(1, sizeof *l);
  if (l == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "listener");
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    free(l);
    return zpp_error(ZPP_ERR_SYSTEM, func, "socket: %s", strerror(errno));
  }
  /* A port in TIME_WAIT may be reused; one with a live listener may not. */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = ip;
  sa.sin_port = htons((uint16_t)port);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(fd, 1024) != 0) {
    int e = errno;
    close(fd);
    free(l);
    if (e == EADDRINUSE)
      return zpp_error(ZPP_ERR_SYSTEM, func,
                       "bootstrap port %s:%d is already in use by another "
                       "process (set ZPP_BOOTSTRAP_PORT or MASTER_PORT to a "
                       "free one)",
                       addr, port);
    return zpp_error(ZPP_ERR_SYSTEM, func, "bind/listen on %s:%d: %s", addr,
                     port, strerror(e));
  }
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  zpp_tcp_id_pack(id, ip, sa.sin_port, session);
  reg_add(session, fd, l);
  ZPP_INFO(ZPP_SUBSYS_INIT, "bootstrap root listening on %s:%u", addr,
           (unsigned)ntohs(sa.sin_port));
  return ZPP_OK;
}

uint64_t zpp_tcp_random_session(void) {
  uint64_t s = 0;
  if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
    s = (uint64_t)zpp_time_ns() ^ ((uint64_t)getpid() << 32);
  return s ? s : 1;
}

void zpp_tcp_unlisten(const zpp_unique_id_t *id) {
  zpp_tcp_id_fields_t f;
  int fd;
  memcpy(&f, id->internal, sizeof f);
  if (memcmp(f.magic, ZPP_TCP_ID_MAGIC, 8) != 0)
    return;
  fd = zpp_tcp_reg_take(f.session);
  if (fd >= 0)
    close(fd);
}

zpp_status_t zpp_tcp_listen_addr(const char *func, uint32_t *ip) {
  const char *a = zpp_setting("ZPP_BOOTSTRAP_ADDR");
  const char *what = "ZPP_BOOTSTRAP_ADDR";
  if (a[0] == '\0') {
    a = getenv("MASTER_ADDR");
    what = "MASTER_ADDR";
  }
  if (a == NULL || a[0] == '\0') {
    *ip = htonl(INADDR_LOOPBACK);
    return ZPP_OK;
  }
  return zpp_tcp_resolve(a, ip, func, what);
}

zpp_status_t zpp_get_unique_id(zpp_unique_id_t *id) {
  uint32_t ip = 0;
  long port;
  if (id == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "id is NULL");
  ZPP_CHECK(zpp_tcp_listen_addr(__func__, &ip));
  port = zpp_setting_long("ZPP_BOOTSTRAP_PORT", 0);
  if (port < 0 || port > 65535) /* before the cast to int */
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "ZPP_BOOTSTRAP_PORT %ld: must be in [0, 65535] (0: any "
                     "free port)",
                     port);
  return zpp_tcp_listen(ip, (int)port, zpp_tcp_random_session(), id, __func__);
}

zpp_status_t zpp_release_unique_id(const zpp_unique_id_t *id) {
  if (id == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "id is NULL");
  zpp_tcp_unlisten(id);
  return ZPP_OK;
}

/* ---- srun's environment -------------------------------------------------- */

int zpp_env_slurm(void) {
  const char *r = getenv("RANK"), *p = getenv("SLURM_PROCID");
  const char *pr = getenv("PMI_RANK"), *ps = getenv("PMI_SIZE");
  const char *n = getenv("SLURM_NTASKS"), *xr = getenv("PMIX_RANK");
  if ((r != NULL && r[0] != '\0') || p == NULL || p[0] == '\0')
    return 0;
  /* Open MPI's mpirun inside an allocation: the allocation's SLURM_* are
   * inherited. */
  if (getenv("OMPI_COMM_WORLD_SIZE") != NULL)
    return 0;
  /* MPICH's or Intel MPI's hydra inside an allocation starts its proxies
   * with srun, and their ranks inherit the proxy's SLURM_PROCID (the
   * node's index) beside hydra's PMI_RANK, PMI_SIZE and MPI_LOCALRANKID.
   * srun's own PMI plugins (--mpi=pmi2, pmix) set no MPI_LOCALRANKID and
   * the rank and size srun's variables say. */
  if (getenv("MPI_LOCALRANKID") != NULL)
    return 0;
  if ((pr != NULL || ps != NULL) &&
      (pr == NULL || strcmp(pr, p) != 0 ||
       (ps != NULL && (n == NULL || strcmp(ps, n) != 0))))
    return 0;
  if (xr != NULL && strcmp(xr, p) != 0)
    return 0;
  return 1;
}

/* ASCII letters, digits, '-', '.', '_' (not the locale's isalnum). */
static int host_char(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
}

/* Digits at s[*i..]: at most 18 (so that they compare as numbers). */
static int hostlist_number(const char *s, size_t *i, unsigned long long *v) {
  size_t n = 0;
  *v = 0;
  while (isdigit((unsigned char)s[*i]) && n < 19) {
    *v = *v * 10 + (unsigned long long)(s[*i] - '0');
    (*i)++;
    n++;
  }
  return n >= 1 && n <= 18;
}

zpp_status_t zpp_slurm_first_host(const char *name, const char *list, char *out,
                                  size_t len, const char *func) {
  size_t i = 0, o = 0, host_start = 0;
  int first = 1; /* still in the first host expression */
  const char *why = NULL;
  if (out == NULL || len == 0)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "out is NULL or empty");
  out[0] = '\0';
  if (list == NULL || list[0] == '\0')
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s is empty: no host to take as the bootstrap root",
                     name);
  /* The whole list is checked, though only its first host is used: a
   * malformed value is named at once. */
  for (;;) {
    unsigned char c = (unsigned char)list[i];
    if (c == '\0' || c == ',') {
      if (i == host_start) {
        why = "an empty host name";
        break;
      }
      if (c == '\0')
        break;
      first = 0;
      host_start = ++i;
    } else if (c == '[') {
      unsigned long long a, b;
      size_t digits = ++i;
      int item = 0;
      for (;;) {
        if (!hostlist_number(list, &i, &a)) {
          why = "a range must be NUMBER or NUMBER-NUMBER (up to 18 digits)";
          break;
        }
        if (first && item == 0) { /* the first number as written: padding */
          size_t n = i - digits;
          if (o + n >= len) {
            why = "the first host name is too long";
            break;
          }
          memcpy(out + o, list + digits, n);
          o += n;
        }
        if (list[i] == '-') {
          i++;
          if (!hostlist_number(list, &i, &b)) {
            why = "a range must be NUMBER or NUMBER-NUMBER (up to 18 digits)";
            break;
          }
          if (b < a) {
            why = "a range whose end is below its start";
            break;
          }
        }
        item++;
        if (list[i] == ']') {
          i++;
          break;
        }
        if (list[i] != ',') {
          why = list[i] == '\0' ? "'[' without ']'"
                                : "a range must be NUMBER or NUMBER-NUMBER "
                                  "(up to 18 digits)";
          break;
        }
        digits = ++i;
      }
      if (why != NULL)
        break;
    } else if (c == ']') {
      why = "']' without '['";
      break;
    } else if (host_char(c)) {
      if (first) {
        if (o + 1 >= len) {
          why = "the first host name is too long";
          break;
        }
        out[o++] = (char)c;
      }
      i++;
    } else {
      why = "a character that is not in a host name";
      break;
    }
  }
  if (why != NULL) {
    out[0] = '\0';
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s \"%.200s\": %s at character %zu (a Slurm hostlist "
                     "such as node[01-04,07],gpu3 was expected)",
                     name, list, why, i + 1);
  }
  out[o] = '\0';
  return ZPP_OK;
}

/* A job or step id of srun's environment: an integer in [0, 2^32). */
static zpp_status_t slurm_id(const char *name, unsigned long long *v,
                             const char *func) {
  const char *s = getenv(name);
  char *end = NULL;
  if (s == NULL || s[0] == '\0')
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s is not set (srun sets it; or set MASTER_PORT)", name);
  errno = 0;
  *v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || !isdigit((unsigned char)s[0]) ||
      *v > 0xffffffffull)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s \"%s\": must be an integer in [0, 2^32)", name, s);
  return ZPP_OK;
}

zpp_status_t zpp_slurm_port(const char *func, long *port) {
  unsigned long long job = 0, step = 0;
  ZPP_CHECK(slurm_id("SLURM_JOB_ID", &job, func));
  ZPP_CHECK(slurm_id("SLURM_STEP_ID", &step, func));
  *port = 10000 + 2 * (long)((job * 61 + step) % 11000);
  return ZPP_OK;
}

/* MASTER_ADDR, else (srun) the first host of SLURM_STEP_NODELIST, else of
 * SLURM_JOB_NODELIST; `what` names where it came from. */
static zpp_status_t env_addr(const char *func, int slurm, char *buf, size_t len,
                             const char **what) {
  const char *a = getenv("MASTER_ADDR"), *name = "SLURM_STEP_NODELIST";
  if (a != NULL && a[0] != '\0') {
    /* a host name is at most 253 characters: a longer value is not cut */
    if (strlen(a) >= len)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                       "MASTER_ADDR \"%.40s...\": %zu characters, longer than "
                       "the %zu of a host name or address",
                       a, strlen(a), len - 1);
    snprintf(buf, len, "%s", a);
    *what = "MASTER_ADDR";
    return ZPP_OK;
  }
  if (!slurm)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "MASTER_ADDR is not set (torchrun sets MASTER_ADDR, "
                     "MASTER_PORT, RANK and WORLD_SIZE)");
  a = getenv(name);
  if (a == NULL || a[0] == '\0') {
    name = "SLURM_JOB_NODELIST";
    a = getenv(name);
  }
  if (a == NULL || a[0] == '\0')
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "neither MASTER_ADDR nor SLURM_STEP_NODELIST nor "
                     "SLURM_JOB_NODELIST is set: no address for the "
                     "bootstrap root");
  *what = name;
  return zpp_slurm_first_host(name, a, buf, len, func);
}

zpp_status_t zpp_tcp_id_env(const char *func, int rank, zpp_unique_id_t *id) {
  const int slurm = zpp_env_slurm();
  const char *ps = getenv("MASTER_PORT"), *what = "MASTER_ADDR";
  const char *ws = getenv(slurm ? "SLURM_NTASKS" : "WORLD_SIZE");
  const char *run = getenv("TORCHELASTIC_RUN_ID");
  const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  char *end = NULL;
  long mport, port;
  uint32_t ip = 0;
  uint64_t session;
  char key[512], addr[256], resolved_what[64];
  ZPP_CHECK(env_addr(func, slurm, addr, sizeof addr, &what));
  if (ps != NULL && ps[0] != '\0') {
    errno = 0;
    mport = strtol(ps, &end, 10);
    if (errno != 0 || *end != '\0' || mport <= 0 || mport > 65535)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                       "MASTER_PORT \"%s\": must be a port number in [1, "
                       "65535]",
                       ps);
  } else if (slurm) {
    ZPP_CHECK(zpp_slurm_port(func, &mport));
  } else {
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func, "MASTER_PORT is not set");
  }
  port = zpp_setting_long("ZPP_BOOTSTRAP_PORT", 0);
  /* Checked on every rank: only rank 0 listens, and a non-root rank would
   * otherwise connect to the port's 16 low bits. */
  if (port < 0 || port > 65535)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "ZPP_BOOTSTRAP_PORT %ld: must be in [1, 65535] (0 or "
                     "unset: MASTER_PORT + 1)",
                     port);
  if (port == 0)
    port = mport + 1;
  if (port > 65535)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "bootstrap port %ld (MASTER_PORT + 1) is out of range; "
                     "set ZPP_BOOTSTRAP_PORT",
                     port);
  snprintf(resolved_what, sizeof resolved_what, "%s%s", what,
           strcmp(what, "MASTER_ADDR") == 0 ? "" : "'s first host");
  ZPP_CHECK(zpp_tcp_resolve(addr, &ip, func, resolved_what));
  /* Every rank derives the same session from the job's description. */
  if (slurm)
    snprintf(key, sizeof key, "%s|%ld|%s|slurm %s.%s", addr, port, ws ? ws : "",
             job ? job : "", step ? step : "");
  else
    snprintf(key, sizeof key, "%s|%ld|%s|%s", addr, port, ws ? ws : "",
             run ? run : "");
  session = zpp_tcp_fnv(key, strlen(key));
  if (rank == 0)
    return zpp_tcp_listen(ip, (int)port, session, id, func);
  zpp_tcp_id_pack(id, ip, htons((uint16_t)port), session);
  return ZPP_OK;
}
