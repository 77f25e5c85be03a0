/*
 * Creating a communicator over any bootstrap (docs/design.md, "Bootstrap"):
 * exchange host identities, build the node map (or the ZPP_TOPO
 * emulation), pick the backend, describe the GPUs, then build the
 * transport.  Every rank takes the same path and the same bootstrap calls
 * whatever happened locally: each step's status is exchanged, so a failure
 * on one rank fails every rank with a message naming it, and nobody waits
 * for an exchange that will not happen.
 *
 * zpp's own ways in (a unique id, torchrun's environment) are in
 * comm_tcp.c, communicators of a subset (zpp_comm_split) in comm_split.c.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/comm_impl.h"
#include "algo/tune.h"
#include "transport/transport_impl.h"

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif


/* What each rank tells the others first. */
typedef struct {
  int32_t status; /* this rank's status so far */
  int32_t flags;  /* REC_* */
  int32_t want;   /* the backend asked for (cfg, else ZPP_BACKEND) */
  int32_t memory; /* cfg->memory */
  int64_t key;    /* launcher's host key (REC_KEY), else -1 */
  int32_t real_local_rank;
  int32_t spec_len;
  int32_t algo;       /* zpp_algorithm_t resolved (cfg, else ZPP_ALGO) */
  int32_t hier_chunk; /* ZPP_HIER_CHUNK (-1: unset): must match everywhere */
  int32_t probe;      /* ZPP_TUNER_PROBE resolved: -1 auto, 0 off, 1 on */
  uint64_t tuner_hash; /* of ZPP_TUNER_FILE's bytes (0: unset) */
  int32_t qgz_sum;    /* ZPP_QGZ_SUM resolved: 1 int, 0 float */
  uint64_t spec_hash;
  uint64_t host_id; /* hash of host name, boot id, network namespace */
  uint64_t kernel_id; /* hash of the boot id (0: unknown): equal ones run
                         on one kernel, so on its cores (containers and
                         network namespaces of one machine) */
  uint64_t pid_space; /* hash of boot id and pid namespace: equal ones see
                         each other's processes (error messages name a
                         peer that is gone or stopped) */
  int32_t pid;
  int32_t net_seg; /* ZPP_NET_SEGMENT as set (-1: unset): must match */
  int32_t net_rings;    /* ZPP_NET_RINGS resolved: the model prices it */
  uint32_t rescue_ip;   /* zpp_comm_shrink's listener (shrink.c): the */
  uint32_t rescue_port; /* address other hosts reach it by; port 0: none */
  char host[ZPP_TOPO_HOST_LEN];
  char msg[ZPP_COMM_MSGLEN];
} boot_rec_t;

enum { REC_KEY = 1, REC_NCCL = 2, REC_UCX = 4 };

typedef struct {
  int32_t status;
  char msg[ZPP_COMM_MSGLEN];
} agree_rec_t;

uint64_t zpp_comm_fnv_mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  while (n--)
    h = (h ^ *c++) * 1099511628211ull;
  return h;
}

static uint64_t hash_str(const char *s) {
  return zpp_comm_fnv_mix(1469598103934665603ull, s, strlen(s));
}

/* Host identity without a launcher: the host name, the kernel's boot id
 * (two containers of one host share it) and the network namespace (ranks
 * in different namespaces cannot share memory transports the same way). */
static void boot_id(char *boot, size_t len) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  boot[0] = '\0';
  if (f != NULL) {
    if (fgets(boot, (int)len, f) == NULL)
      boot[0] = '\0';
    fclose(f);
  }
}

static uint64_t host_identity(const char *host, const char *boot) {
  uint64_t h = hash_str(host);
  struct stat sb;
  h = zpp_comm_fnv_mix(h, boot, strlen(boot));
  if (stat("/proc/self/ns/net", &sb) == 0)
    h = zpp_comm_fnv_mix(h, &sb.st_ino, sizeof sb.st_ino);
  return h;
}

/* Processes with equal values run on one kernel; 0: unknown. */
static uint64_t kernel_identity(const char *boot) {
  return boot[0] == '\0' ? 0 : hash_str(boot);
}

int zpp_comm_ranks_on_kernel(const void *recs, size_t stride,
                             size_t kernel_off, size_t key_off, int n, int me) {
  const char *b = recs;
  uint64_t mk, rk;
  int64_t mkey, rkey;
  int r, k = 0;
  memcpy(&mk, b + (size_t)me * stride + kernel_off, sizeof mk);
  memcpy(&mkey, b + (size_t)me * stride + key_off, sizeof mkey);
  for (r = 0; r < n; r++) {
    memcpy(&rk, b + (size_t)r * stride + kernel_off, sizeof rk);
    memcpy(&rkey, b + (size_t)r * stride + key_off, sizeof rkey);
    k += mk != 0 && rk != 0 ? rk == mk : rkey == mkey;
  }
  return k;
}

/* Processes with equal values see each other's pids; 0: unknown. */
static uint64_t pid_space(const char *boot) {
  struct stat sb;
  if (boot[0] == '\0' || stat("/proc/self/ns/pid", &sb) != 0)
    return 0;
  return zpp_comm_fnv_mix(hash_str(boot), &sb.st_ino, sizeof sb.st_ino);
}

void zpp_comm_fill_msg(char *msg, zpp_status_t st) {
  if (st != ZPP_OK)
    snprintf(msg, ZPP_COMM_MSGLEN, "%s", zpp_get_last_error());
  else
    msg[0] = '\0';
}

/* Raises the first failing rank's error on every rank (the failing rank
 * keeps its own message).  recs: n records of `stride` bytes with an
 * int32 status at status_off and a message of ZPP_COMM_MSGLEN at msg_off. */
zpp_status_t zpp_comm_first_failure(const void *recs, size_t stride,
                                    size_t status_off, size_t msg_off, int n,
                                    zpp_status_t mine, const char *func) {
  const char *p = recs;
  int r;
  if (mine != ZPP_OK)
    return mine;
  for (r = 0; r < n; r++, p += stride) {
    int32_t s;
    memcpy(&s, p + status_off, sizeof s);
    if (s != ZPP_OK)
      return zpp_error((zpp_status_t)s, func, "rank %d failed: %.*s", r,
                       ZPP_COMM_MSGLEN - 1, p + msg_off);
  }
  return ZPP_OK;
}

/* Every rank learns whether any failed.  Called by every rank at the same
 * point, whatever its status. */
static zpp_status_t agree(const zpp_bootstrap_t *bs, double timeout,
                          zpp_status_t st, const char *func) {
  agree_rec_t mine, *all;
  zpp_status_t xs;
  int r;
  memset(&mine, 0, sizeof mine);
  mine.status = st;
  zpp_comm_fill_msg(mine.msg, st);
  all = malloc((size_t)bs->size * sizeof *all);
  if (all == NULL) {
    /* Cannot take part: the others time out in the exchange. */
    return st != ZPP_OK ? st
                        : zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "agreement");
  }
  xs = bs->allgather(bs->ctx, &mine, sizeof mine, all, timeout);
  if (xs != ZPP_OK) {
    free(all);
    return st != ZPP_OK ? st : xs;
  }
  if (st == ZPP_OK) {
    for (r = 0; r < bs->size; r++) {
      if (all[r].status != ZPP_OK) {
        all[r].msg[ZPP_COMM_MSGLEN - 1] = '\0';
        st = zpp_error((zpp_status_t)all[r].status, func, "rank %d failed: %s",
                       r, all[r].msg);
        break;
      }
    }
  }
  free(all);
  return st;
}

/* ---- topology ------------------------------------------------------------- */

static zpp_status_t build_topo(const boot_rec_t *rec, int size,
                               const char *spec, const char *boot_name,
                               zpp_topo_t **out) {
  zpp_status_t st;
  zpp_topo_t *t = NULL;
  char (*hosts)[ZPP_TOPO_HOST_LEN];
  int r;
  if (spec[0] != '\0') {
    int *node_of = NULL, n = 0;
    ZPP_CHECK(zpp_topo_parse(spec, size, &node_of, &n));
    st = zpp_topo_from_nodes(size, node_of, spec, "ZPP_TOPO", &t);
    free(node_of);
  } else {
    int64_t *keys = malloc((size_t)size * sizeof *keys);
    char source[64];
    if (keys == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%d keys", size);
    for (r = 0; r < size; r++)
      keys[r] = rec[r].key;
    if (rec[0].flags & REC_KEY)
      snprintf(source, sizeof source, "MPI shared-memory split");
    else
      snprintf(source, sizeof source, "host identity (%.20s bootstrap)",
               boot_name);
    st = zpp_topo_from_keys(size, keys, source, &t);
    free(keys);
  }
  if (st != ZPP_OK)
    return st;
  hosts = malloc((size_t)size * sizeof *hosts);
  if (hosts == NULL) {
    zpp_topo_free(t);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "host names");
  }
  for (r = 0; r < size; r++)
    memcpy(hosts[r], rec[r].host, ZPP_TOPO_HOST_LEN);
  st = zpp_topo_set_hosts(t, (const char(*)[ZPP_TOPO_HOST_LEN])hosts);
  free(hosts);
  if (st != ZPP_OK) {
    zpp_topo_free(t);
    return st;
  }
  *out = t;
  return ZPP_OK;
}

/* Picks and activates this rank's CUDA device. */
static zpp_status_t pick_device(const zpp_comm_config_t *cfg, int real_local,
                                int *device) {
#if ZPP_HAVE_CUDA
  int n = 0, d;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                     "cfg->memory ZPP_MEMORY_DEVICE: no usable CUDA device "
                     "(%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  d = cfg->cuda_device >= 0 ? cfg->cuda_device : real_local % n;
  if (d >= n)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "cfg->cuda_device %d: only %d devices are visible", d, n);
  e = cudaSetDevice(d);
  if (e != cudaSuccess)
    return zpp_error(ZPP_ERR_CUDA, __func__, "cudaSetDevice(%d): %s", d,
                     cudaGetErrorString(e));
  *device = d;
  return ZPP_OK;
#else
  (void)cfg;
  (void)real_local;
  (void)device;
  return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                   "cfg->memory ZPP_MEMORY_DEVICE: zpp was built without CUDA");
#endif
}

/* Attaches the GPU link matrix: each rank measures its row (only ranks on
 * its real machine can be related), then the rows are exchanged.  Every
 * rank takes part in both exchanges, also after a local failure. */
static zpp_status_t gpu_links(zpp_status_t st, const zpp_bootstrap_t *bs,
                              double timeout, zpp_topo_t *t,
                              const boot_rec_t *rec, int rank, int device,
                              const char *func) {
  int n = t->world_size, b;
  zpp_topo_gpu_t me, *all = NULL;
  uint8_t *row = NULL, *links = NULL, *cls = NULL;
  memset(&me, 0, sizeof me);
  if (st == ZPP_OK)
    st = zpp_topo_gpu_describe(device, &me);
  all = malloc((size_t)n * sizeof *all);
  row = calloc(2, (size_t)n);
  links = malloc(2 * (size_t)n * (size_t)n);
  cls = malloc(2 * (size_t)n * (size_t)n);
  if (st == ZPP_OK && (all == NULL || row == NULL || links == NULL ||
                       cls == NULL))
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "GPU link matrix");
  st = agree(bs, timeout, st, func);
  if (st == ZPP_OK)
    st = bs->allgather(bs->ctx, &me, sizeof me, all, timeout);
  for (b = 0; st == ZPP_OK && b < n; b++) {
    zpp_link_t l = ZPP_LINK_NET;
    int nv = 0;
    if (b == rank)
      l = ZPP_LINK_SELF;
    else if (rec[b].key == rec[rank].key)
      st = zpp_topo_gpu_link(&me, &all[b], &l, &nv);
    row[b] = (uint8_t)l;
    row[n + b] = (uint8_t)(nv > 255 ? 255 : nv);
  }
  st = agree(bs, timeout, st, func);
  if (st == ZPP_OK)
    st = bs->allgather(bs->ctx, row, 2 * (size_t)n, links, timeout);
  if (st == ZPP_OK) {
    /* links holds, per rank, [class row | NVLink-count row]. */
    for (b = 0; b < n; b++) {
      memcpy(cls + (size_t)b * n, links + (size_t)b * 2 * n, (size_t)n);
      memcpy(cls + (size_t)n * n + (size_t)b * n, links + (size_t)b * 2 * n + n,
             (size_t)n);
    }
    st = zpp_topo_set_gpus(t, all, cls, cls + (size_t)n * n);
  }
  free(cls);
  free(links);
  free(row);
  free(all);
  return st;
}

/* ---- backend -------------------------------------------------------------- */

static zpp_status_t requested_backend(const zpp_comm_config_t *cfg,
                                      zpp_backend_t *out, const char *func) {
  const char *env;
  *out = cfg->backend;
  if (cfg->backend != ZPP_BACKEND_AUTO)
    return ZPP_OK;
  env = zpp_setting("ZPP_BACKEND");
  if (env[0] == '\0' || strcmp(env, "auto") == 0)
    return ZPP_OK;
  if (strcmp(env, "mpi") == 0)
    *out = ZPP_BACKEND_MPI;
  else if (strcmp(env, "nccl") == 0)
    *out = ZPP_BACKEND_NCCL;
  else if (strcmp(env, "ucx") == 0)
    *out = ZPP_BACKEND_UCX;
  else
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "ZPP_BACKEND \"%s\": must be auto, mpi, nccl or ucx", env);
  if (*out == ZPP_BACKEND_NCCL && cfg->memory != ZPP_MEMORY_DEVICE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "ZPP_BACKEND=nccl needs cfg->memory ZPP_MEMORY_DEVICE");
  return ZPP_OK;
}

/* The setting ZPP_QGZ_SUM (qgZ's default reduction): float (0) or int
 * (1), either case. */
static zpp_status_t requested_qgz_sum(int *out, const char *func) {
  const char *env = zpp_setting("ZPP_QGZ_SUM");
  if (env[0] == '\0' || strcasecmp(env, "float") == 0)
    *out = 0;
  else if (strcasecmp(env, "int") == 0)
    *out = 1;
  else
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "ZPP_QGZ_SUM \"%s\": must be float or int", env);
  return ZPP_OK;
}

/* cfg->algorithm, else the setting ZPP_ALGO (auto when unset). */
static zpp_status_t requested_algorithm(const zpp_comm_config_t *cfg,
                                        zpp_algorithm_t *out,
                                        const char *func) {
  const char *env;
  *out = cfg->algorithm;
  if (cfg->algorithm != ZPP_ALGORITHM_DEFAULT)
    return ZPP_OK;
  env = zpp_setting("ZPP_ALGO");
  if (env[0] == '\0' || strcmp(env, "auto") == 0)
    *out = ZPP_ALGORITHM_AUTO;
  else if (strcmp(env, "hier") == 0)
    *out = ZPP_ALGORITHM_HIER;
  else if (strcmp(env, "flat") == 0)
    *out = ZPP_ALGORITHM_FLAT;
  else
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "ZPP_ALGO \"%s\": must be auto, hier or flat", env);
  return ZPP_OK;
}

static const char *algo_name(int32_t a) {
  return a == ZPP_ALGORITHM_FLAT   ? "flat"
         : a == ZPP_ALGORITHM_HIER ? "hier"
                                   : "auto";
}

/* ZPP_TUNER_PROBE: auto (-1: probe real multi-node links), 0, 1 (also an
 * emulated topology: tests). */
static zpp_status_t requested_probe(int32_t *out, const char *func) {
  const char *env = zpp_setting("ZPP_TUNER_PROBE");
  if (env[0] == '\0' || strcmp(env, "auto") == 0)
    *out = -1;
  else if (strcmp(env, "0") == 0 || strcmp(env, "1") == 0)
    *out = env[0] - '0';
  else
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "ZPP_TUNER_PROBE \"%s\": must be auto, 0 or 1", env);
  return ZPP_OK;
}

/* What each rank tells the others of the cost model's constants. */
typedef struct {
  int32_t status;
  char msg[ZPP_COMM_MSGLEN];
  zpp_link_model_t m;
  zpp_link_model_t def; /* the constants a rank measures none of: rank 0's */
} tune_rec_t;

/* ZPP_ALGO=auto: the cost model's constants, the same on every rank.
 * Defaults for the links (an emulated topology shares one machine's
 * memory; ZPP_EMU_INTER_GBIT and _LAT_US say what the emulation adds),
 * then the tuner file, or else (real nodes, or ZPP_TUNER_PROBE=1) what a
 * probe measures; then every rank's values, all-gathered, and their
 * median.  Every rank takes this path whatever its status (it decides on
 * agreed facts only), so nobody waits for an exchange that will not
 * happen. */
static zpp_status_t tune_model(const zpp_bootstrap_t *bs, double timeout,
                               zpp_transport_t *t, int32_t probe,
                               int host_ranks, zpp_status_t st,
                               const char *func) {
  zpp_link_model_t def, *ms;
  tune_rec_t mine, *all;
  double *scratch;
  const char *file = zpp_setting("ZPP_TUNER_FILE");
  zpp_status_t xs;
  uint64_t hash;
  int64_t t0 = zpp_time_ns();
  zpp_tune_start(&def, t->topo->emulated, t->emu_on, t->emu_gbit, t->emu_lat_us,
                 host_ranks, (int)sysconf(_SC_NPROCESSORS_ONLN));
  memset(&mine, 0, sizeof mine);
  mine.m = def;
  mine.def = def;
  /* everything the agreement needs, allocated before the exchange: a
   * failure here is this rank's status, which every rank then sees */
  all = malloc((size_t)bs->size * sizeof *all);
  ms = malloc((size_t)bs->size * sizeof *ms);
  scratch = malloc((size_t)bs->size * sizeof *scratch);
  if (st == ZPP_OK && (ms == NULL || scratch == NULL))
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "agreement of %d ranks",
                   bs->size);
  if (file[0] != '\0') {
    if (st == ZPP_OK)
      st = zpp_tune_read_file(file, &mine.m, &hash, func);
  } else if (t->backend != ZPP_BACKEND_NCCL && t->topo->nnodes > 1 &&
             (probe == 1 || (probe == -1 && !t->topo->emulated))) {
    /* every rank takes part (agreed facts decide), one that failed too */
    zpp_status_t ps = zpp_tune_probe(t, &mine.m, st == ZPP_OK);
    if (st == ZPP_OK)
      st = ps;
  }
  mine.status = st;
  zpp_comm_fill_msg(mine.msg, st);
  if (all == NULL) {
    /* Cannot take part: the others time out in the exchange. */
    free(ms);
    free(scratch);
    return st != ZPP_OK ? st
                        : zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "agreement");
  }
  xs = bs->allgather(bs->ctx, &mine, sizeof mine, all, timeout);
  if (xs != ZPP_OK) {
    free(all);
    free(ms);
    free(scratch);
    return st != ZPP_OK ? st : xs;
  }
  st = zpp_comm_first_failure(all, sizeof *all, offsetof(tune_rec_t, status),
                              offsetof(tune_rec_t, msg), bs->size, st, func);
  if (st == ZPP_OK) {
    int r;
    for (r = 0; r < bs->size; r++)
      ms[r] = all[r].m;
    zpp_tune_agree(ms, bs->size, &all[0].def, scratch, &t->model);
  }
  free(all);
  free(ms);
  free(scratch);
  if (st == ZPP_OK)
    ZPP_INFO(ZPP_SUBSYS_NET,
             "algorithm auto (%s, %.2f ms): intra %.3g us "
             "%.3g Gbit/s, inter %.3g us %.3g Gbit/s, round %.3g us, "
             "message %.3g us, sum %.3g Gbit/s, %.3g ranks per core%s",
             file[0] ? file : "defaults and probe",
             (double)(zpp_time_ns() - t0) / 1e6, t->model.intra_lat_us,
             t->model.intra_bw / 125.0, t->model.inter_lat_us,
             t->model.inter_bw / 125.0, t->model.round_us, t->model.msg_us,
             t->model.reduce_bw / 125.0, t->model.cpu,
             t->model.shared_path ? ", one shared path" : "");
  return st;
}

/* The same choice on every rank: it depends only on exchanged facts. */
/* Two ranks of one real machine on one GPU (NCCL refuses that); real
 * machines, not emulated nodes: two emulated nodes may share a GPU. */
static int shared_gpu(const zpp_topo_t *topo, const boot_rec_t *rec, int n,
                      int *device) {
  int a, b;
  if (topo->gpu == NULL)
    return 0;
  for (a = 0; a < n; a++) {
    if (topo->gpu[a].bus_id[0] == '\0')
      continue;
    for (b = a + 1; b < n; b++)
      if (rec[b].key == rec[a].key &&
          strcmp(topo->gpu[b].bus_id, topo->gpu[a].bus_id) == 0) {
        *device = topo->gpu[a].device;
        return 1;
      }
  }
  return 0;
}

static zpp_status_t resolve_backend(zpp_backend_t want,
                                    const zpp_comm_config_t *cfg,
                                    const zpp_creator_t *cr,
                                    const boot_rec_t *rec,
                                    const zpp_topo_t *topo, int n,
                                    const char *func, zpp_backend_t *out) {
  int r, nccl = 1, ucx = 1, dev = -1;
  for (r = 0; r < n; r++) {
    nccl &= (rec[r].flags & REC_NCCL) != 0;
    ucx &= (rec[r].flags & REC_UCX) != 0;
  }
  if (want == ZPP_BACKEND_AUTO && cfg->memory == ZPP_MEMORY_DEVICE && nccl &&
      shared_gpu(topo, rec, n, &dev)) {
    nccl = 0;
    ZPP_INFO(ZPP_SUBSYS_NET, "backend auto: ranks share GPU %d, and NCCL "
             "needs one GPU per rank", dev);
  }
  if (want == ZPP_BACKEND_AUTO) {
    if (cfg->memory == ZPP_MEMORY_DEVICE && nccl)
      want = ZPP_BACKEND_NCCL;
    else if (cr->mpi_transport != NULL)
      want = ZPP_BACKEND_MPI;
    else if (ucx)
      want = ZPP_BACKEND_UCX;
    else
      return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                       "backend auto: the %s bootstrap has no MPI backend and "
                       "UCX is not usable on every rank (%s)",
                       cr->name, zpp_get_last_error());
    if (cfg->memory == ZPP_MEMORY_DEVICE && want != ZPP_BACKEND_NCCL)
      ZPP_INFO(ZPP_SUBSYS_NET, "backend auto: NCCL not usable on every rank; "
               "device memory goes through %s staging",
               zpp_backend_name(want));
  }
  if (want == ZPP_BACKEND_MPI && cr->mpi_transport == NULL)
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "backend MPI needs an MPI bootstrap "
                     "(zpp_comm_create_mpi); this communicator's bootstrap "
                     "is %s: use ZPP_BACKEND_UCX",
                     cr->name);
  if (want == ZPP_BACKEND_UCX && !ucx) {
    for (r = 0; r < n && (rec[r].flags & REC_UCX); r++) {
    }
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "backend UCX: libucp.so.0 cannot be used on rank %d "
                     "(install libucx0; its log says why)",
                     r);
  }
  *out = want;
  return ZPP_OK;
}

/* ---- creation ------------------------------------------------------------- */

/* zpp_comm_shrink's addresses: each rank's listener where it is bound;
 * none unless every rank has a listener, and none (zpp_comm_shrink says
 * why) when ranks on different hosts could not reach each other: one of
 * them has only loopback, or two report the same address.  Every rank
 * decides alike (from the same records).  The epoch tells this
 * communicator's messages from another's that reuses a port. */
static zpp_status_t attach_rescue(zpp_comm_t c, const boot_rec_t *rec,
                                  const boot_rec_t *mine, int rank, int size,
                                  int fd, const char *func) {
  uint32_t *ip = malloc((size_t)size * sizeof *ip);
  uint16_t *port = malloc((size_t)size * sizeof *port);
  uint64_t epoch = 1469598103934665603ull;
  zpp_status_t st = ZPP_OK;
  char why[256] = "";
  int r, q, all = 1, one_host = 1;
  for (r = 0; r < size; r++)
    all &= rec[r].rescue_port != 0;
  if (fd < 0 || !all || ip == NULL || port == NULL) {
    free(ip);
    free(port);
    zpp_rescue_close(fd);
    return ZPP_OK; /* zpp_comm_shrink then says it is unsupported */
  }
  /* (hosts told apart by their identity hash: pairs of ranks on one host
   * are skipped cheaply) */
  for (r = 0; r < size; r++)
    one_host &= rec[r].host_id == rec[0].host_id;
  for (r = 0; r < size && !one_host && why[0] == '\0'; r++)
    for (q = 0; q < r && why[0] == '\0'; q++) {
      int same_host = rec[r].host_id == rec[q].host_id;
      int lo = rec[r].rescue_ip == htonl(INADDR_LOOPBACK)   ? r
               : rec[q].rescue_ip == htonl(INADDR_LOOPBACK) ? q
                                                            : -1;
      if (same_host)
        continue;
      if (lo >= 0)
        snprintf(why, sizeof why,
                 "ranks %d and %d are on different hosts and rank %d "
                 "listens on loopback only (set ZPP_BOOTSTRAP_ADDR to the "
                 "address each host is reached by, or use the TCP "
                 "bootstrap)",
                 q, r, lo);
      else if (rec[r].rescue_ip == rec[q].rescue_ip)
        snprintf(why, sizeof why,
                 "ranks %d and %d are on different hosts but both listen on "
                 "the same address (ZPP_BOOTSTRAP_ADDR must name each "
                 "host's own)",
                 q, r);
    }
  if (why[0] != '\0') {
    free(ip);
    free(port);
    zpp_rescue_close(fd);
    return zpp_rescue_none(c, why, func);
  }
  for (r = 0; r < size; r++) {
    ip[r] = rec[r].rescue_ip;
    port[r] = (uint16_t)rec[r].rescue_port;
    epoch = zpp_comm_fnv_mix(epoch, &rec[r].host_id, sizeof rec[r].host_id);
    epoch = zpp_comm_fnv_mix(epoch, &rec[r].pid, sizeof rec[r].pid);
    epoch =
        zpp_comm_fnv_mix(epoch, &rec[r].rescue_port, sizeof rec[r].rescue_port);
  }
  st = zpp_rescue_attach(c, fd, rank, size, mine->rescue_ip, ip, port, epoch,
                         func);
  free(ip);
  free(port);
  return st;
}

void zpp_comm_release_tcp(zpp_comm_t c) {
  zpp_tcp_boot_free(c->tcp);
  c->tcp = NULL;
}

zpp_status_t zpp_comm_create_with(const zpp_bootstrap_t *bs,
                                  const zpp_comm_config_t *cfg,
                                  const zpp_creator_t *cr, const char *func,
                                  zpp_comm_t *out) {
  zpp_comm_config_t def = ZPP_COMM_CONFIG_INIT, whole;
  zpp_comm_t c = NULL;
  boot_rec_t mine, *rec = NULL;
  char boot[64]; /* the kernel's boot id (empty: unknown) */
  zpp_topo_t *topo = NULL;
  const char *spec = "";
  zpp_backend_t want = ZPP_BACKEND_AUTO, backend = ZPP_BACKEND_MPI;
  zpp_algorithm_t algo = ZPP_ALGORITHM_AUTO;
  long hier_chunk = 0, net_seg = -1, net_rings = 1;
  int32_t probe = -1;
  uint64_t tuner_hash = 0;
  int qgz_sum = 0, rescue_fd = -1;
  uint16_t rescue_port = 0;
  double timeout;
  zpp_status_t st = cr->pre_status, xs;
  int rank = bs->rank, size = bs->size, r;
  char why[256];

  if (cfg == NULL) {
    cfg = &def;
  } else if (cfg->struct_size >= ZPP_COMM_CONFIG_V1_SIZE) {
    /* an older, smaller struct: the fields past it take their defaults
     * (and nothing past its struct_size is read) */
    zpp_comm_config_get(cfg, &whole);
    cfg = &whole;
  }
  timeout = zpp_timeout_clamp(
      (cfg->struct_size == sizeof *cfg && cfg->timeout_s > 0)
          ? cfg->timeout_s
          : zpp_setting_double("ZPP_TIMEOUT_S", 300.0));
  zpp_log_set_rank(rank);
  if (st == ZPP_OK)
    st = zpp_comm_config_check_as(func, cfg);
  if (st == ZPP_OK)
    st = requested_backend(cfg, &want, func);
  if (st == ZPP_OK)
    st = requested_algorithm(cfg, &algo, func);
  if (st == ZPP_OK)
    st = requested_qgz_sum(&qgz_sum, func);
  if (st == ZPP_OK)
    st = requested_probe(&probe, func);
  if (st == ZPP_OK && zpp_setting("ZPP_TUNER_FILE")[0] != '\0') {
    /* read here too, so a bad file fails every rank at the first exchange
     * and different files are a mismatch there */
    zpp_link_model_t scratch;
    zpp_tune_defaults(&scratch, 0);
    st = zpp_tune_read_file(zpp_setting("ZPP_TUNER_FILE"), &scratch,
                            &tuner_hash, func);
  }
  /* -1: unset (hier: 262144 bytes; auto: the model's chunks) */
  hier_chunk = zpp_setting_long("ZPP_HIER_CHUNK", -1);
  if (st == ZPP_OK && hier_chunk != -1 &&
      (hier_chunk < 0 || hier_chunk > (1L << 30)))
    st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                   "ZPP_HIER_CHUNK %ld: must be in [0, 2^30] bytes",
                   hier_chunk);
  /* LONG_MIN: unset (or not a number: warned), -1 in the record; an
   * explicit -1 is out of range like any other negative value */
  net_seg = zpp_setting_long("ZPP_NET_SEGMENT", LONG_MIN);
  if (net_seg == LONG_MIN)
    net_seg = -1;
  else if (st == ZPP_OK && net_seg != 0 &&
           (net_seg < 4096 || net_seg > (1L << 30)))
    st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                   "ZPP_NET_SEGMENT %ld: must be 0 (whole transfers) or in "
                   "[4096, 2^30] bytes (unset: %d on real inter-node links)",
                   net_seg, ZPP_NET_SEGMENT_AUTO);
  /* as the transport resolves it (transport.c): out of range is 1 */
  net_rings = zpp_setting_long("ZPP_NET_RINGS", 1);
  if (net_rings < 1 || net_rings > 64)
    net_rings = 1;
  /* Also after a failure here (a bad setting on this rank only): the
   * records are needed to take part in the first exchange, which tells
   * every rank of the failure instead of leaving them to time out in it
   * (bootstrap.h, pre_status). */
  c = calloc(1, sizeof *c);
  rec = malloc((size_t)size * sizeof *rec);
  if (st == ZPP_OK && (c == NULL || rec == NULL))
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "communicator of %d ranks",
                   size);
  if (st == ZPP_OK) {
    spec = (cfg->topology != NULL && cfg->topology[0] != '\0')
               ? cfg->topology
               : zpp_setting("ZPP_TOPO");
    if (strlen(spec) >= sizeof c->topo_spec)
      st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "topology \"%.40s...\": longer than %zu characters", spec,
                     sizeof c->topo_spec - 1);
  }

  /* First exchange: status, host identity, spec, what loads here.  A rank
   * that could not allocate the records cannot take part: the others time
   * out in this exchange (bounded) instead. */
  memset(&mine, 0, sizeof mine);
  if (gethostname(mine.host, sizeof mine.host) != 0)
    snprintf(mine.host, sizeof mine.host, "unknown");
  mine.host[sizeof mine.host - 1] = '\0';
  mine.key = -1;
  if (cr->has_host_key) {
    mine.flags |= REC_KEY;
    mine.key = cr->host_key;
    mine.real_local_rank = cr->real_local_rank;
  }
  boot_id(boot, sizeof boot); /* read once: the three identities below */
  mine.host_id = host_identity(mine.host, boot);
  mine.pid_space = pid_space(boot);
  mine.kernel_id = kernel_identity(boot);
  mine.pid = (int32_t)getpid();
  mine.spec_hash = hash_str(spec);
  mine.spec_len = (int32_t)strlen(spec);
  mine.want = (int32_t)want;
  mine.memory = (int32_t)cfg->memory;
  mine.algo = (int32_t)algo;
  mine.hier_chunk = (int32_t)hier_chunk;
  mine.probe = probe;
  mine.tuner_hash = tuner_hash;
  mine.qgz_sum = (int32_t)qgz_sum;
  mine.net_seg = (int32_t)net_seg;
  mine.net_rings = (int32_t)net_rings;
  if (st == ZPP_OK)
    zpp_rescue_open(cr->tcp, &rescue_fd, &mine.rescue_ip, &rescue_port);
  mine.rescue_port = rescue_port;
  if (st == ZPP_OK && cfg->memory == ZPP_MEMORY_DEVICE &&
      (want == ZPP_BACKEND_AUTO || want == ZPP_BACKEND_NCCL) &&
      zpp_transport_nccl_available(why, sizeof why))
    mine.flags |= REC_NCCL;
  if (st == ZPP_OK && (want == ZPP_BACKEND_UCX ||
                       (want == ZPP_BACKEND_AUTO && cr->mpi_transport == NULL))) {
    if (zpp_transport_ucx_available(why, sizeof why))
      mine.flags |= REC_UCX;
    else
      ZPP_WARN(ZPP_SUBSYS_NET, "UCX not usable: %s", why);
  }
  mine.status = st;
  zpp_comm_fill_msg(mine.msg, st);
  if (rec == NULL) {
    zpp_comm_destroy(c);
    return st != ZPP_OK ? st
                        : zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "records");
  }
  xs = bs->allgather(bs->ctx, &mine, sizeof mine, rec, timeout);
  if (xs != ZPP_OK) {
    st = st != ZPP_OK ? st : xs;
    goto err_comm;
  }
  ZPP_CHECK_GOTO(zpp_comm_first_failure(rec, sizeof *rec,
                                        offsetof(boot_rec_t, status),
                                        offsetof(boot_rec_t, msg), size, st,
                                        func),
                 st, err_comm);
  c->cfg = *cfg;
  c->cfg.topology = NULL;
  c->cuda_device = -1;
  st = attach_rescue(c, rec, &mine, rank, size, rescue_fd, func);
  rescue_fd = -1; /* the communicator's now (closed on failure) */
  if (st != ZPP_OK)
    goto err_comm;
  snprintf(c->topo_spec, sizeof c->topo_spec, "%s", spec);
  snprintf(c->boot_name, sizeof c->boot_name, "%s",
           cr->name != NULL ? cr->name
           : bs->name != NULL ? bs->name
                               : "user");

  /* Host keys without a launcher: the lowest rank of my host identity. */
  if (!(rec[0].flags & REC_KEY)) {
    for (r = 0; r < size; r++) {
      int q, local = 0;
      rec[r].key = r;
      for (q = 0; q < r; q++) {
        if (rec[q].host_id == rec[r].host_id &&
            strncmp(rec[q].host, rec[r].host, ZPP_TOPO_HOST_LEN) == 0) {
          if (local == 0)
            rec[r].key = rec[q].key;
          local++;
        }
      }
      rec[r].real_local_rank = local;
    }
  }
  for (r = 0; r < size && st == ZPP_OK; r++)
    if (rec[r].spec_hash != mine.spec_hash)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "topology: rank %d uses \"%s\" but rank %d uses another "
                     "(%d characters); set ZPP_TOPO alike on every rank",
                     rank, spec, r, (int)rec[r].spec_len);
  /* Ranks that asked for different backends or memory spaces would build
   * transports that cannot talk to each other (and wait for each other
   * until the timeout, or inside MPI). */
  for (r = 0; r < size && st == ZPP_OK; r++) {
    if (rec[r].want != mine.want)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "backend: rank %d asks for %s but rank %d for %s; pass "
                     "the same cfg->backend (or ZPP_BACKEND) on every rank",
                     rank, zpp_backend_name((zpp_backend_t)mine.want), r,
                     zpp_backend_name((zpp_backend_t)rec[r].want));
    else if (rec[r].memory != mine.memory)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "memory: rank %d uses %s memory but rank %d %s memory; "
                     "pass the same cfg->memory on every rank",
                     rank, mine.memory == ZPP_MEMORY_DEVICE ? "device" : "host",
                     r, rec[r].memory == ZPP_MEMORY_DEVICE ? "device" : "host");
    else if (rec[r].algo != mine.algo)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_ALGO: rank %d runs %s but rank %d %s; pass the "
                     "same cfg->algorithm (or ZPP_ALGO) on every rank",
                     rank, algo_name(mine.algo), r, algo_name(rec[r].algo));
    else if (rec[r].tuner_hash != mine.tuner_hash)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_TUNER_FILE: rank %d reads %s\"%s\" but rank %d "
                     "another file or none; give every rank the same file",
                     rank, mine.tuner_hash ? "" : "none ",
                     zpp_setting("ZPP_TUNER_FILE"), r);
    else if (rec[r].probe != mine.probe)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_TUNER_PROBE: rank %d uses %d but rank %d %d (-1: "
                     "auto); set it alike on every rank",
                     rank, (int)mine.probe, r, (int)rec[r].probe);
    else if (rec[r].hier_chunk != mine.hier_chunk)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_HIER_CHUNK: rank %d uses %d but rank %d %d; set it "
                     "alike on every rank",
                     rank, (int)mine.hier_chunk, r, (int)rec[r].hier_chunk);
    else if (rec[r].qgz_sum != mine.qgz_sum)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_QGZ_SUM: rank %d uses %s but rank %d %s; set it "
                     "alike on every rank",
                     rank, mine.qgz_sum ? "int" : "float", r,
                     rec[r].qgz_sum ? "int" : "float");
    else if (rec[r].net_seg != mine.net_seg)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_NET_SEGMENT: rank %d uses %d but rank %d %d (-1: "
                     "unset); set it alike on every rank",
                     rank, (int)mine.net_seg, r, (int)rec[r].net_seg);
    else if (rec[r].net_rings != mine.net_rings)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ZPP_NET_RINGS: rank %d uses %d but rank %d %d; set it "
                     "alike on every rank",
                     rank, (int)mine.net_rings, r, (int)rec[r].net_rings);
  }
  if (st == ZPP_OK)
    st = build_topo(rec, size, spec, c->boot_name, &topo);
  ZPP_CHECK_GOTO(agree(bs, timeout, st, func), st, err_topo);
  ZPP_INFO(ZPP_SUBSYS_TOPO, "%d ranks on %d nodes%s (%s%s%s); I am node %d, "
           "local rank %d of %d%s",
           size, topo->nnodes, topo->uniform ? "" : " of uneven sizes",
           topo->emulated ? "EMULATED by \"" : topo->source,
           topo->emulated ? topo->spec : "", topo->emulated ? "\"" : "",
           topo->node_of[rank], topo->local_rank_of[rank],
           topo->node_off[topo->node_of[rank] + 1] -
               topo->node_off[topo->node_of[rank]],
           topo->emulated ? "; real placement ignored for nodes" : "");

  if (cfg->memory == ZPP_MEMORY_DEVICE) {
    st = pick_device(cfg, rec[rank].real_local_rank, &c->cuda_device);
    ZPP_CHECK_GOTO(gpu_links(st, bs, timeout, topo, rec, rank,
                             c->cuda_device, func),
                   st, err_topo);
  }
  /* After the GPU map: AUTO must know whether ranks share a GPU.  The
   * choice depends on exchanged facts only, so it is the same everywhere. */
  ZPP_CHECK_GOTO(resolve_backend(want, cfg, cr, rec, topo, size, func,
                                 &backend),
                 st, err_topo);

  c->tr = calloc(1, sizeof *c->tr);
  if (c->tr == NULL) {
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "transport");
  } else {
    st = zpp_transport_init(c->tr, topo, rank, cfg->memory, timeout);
    c->tr->algorithm = algo;
    c->tr->hier_chunk_set = hier_chunk >= 0;
    c->tr->hier_chunk = hier_chunk >= 0 ? (size_t)hier_chunk : 262144;
    c->tr->qgz_sum_int = qgz_sum;
    /* unset: cut only real inter-node transfers (an emulated topology's
     * "network" is shared memory, where the cut only costs messages) */
    c->tr->net_seg = net_seg >= 0 ? (size_t)net_seg
                     : topo->emulated ? 0
                                      : (size_t)ZPP_NET_SEGMENT_AUTO;
    topo = NULL; /* owned by the transport now */
  }
  if (st == ZPP_OK && mine.pid_space != 0 &&
      (c->tr->pid = calloc((size_t)size, sizeof *c->tr->pid)) != NULL)
    for (r = 0; r < size; r++)
      if (rec[r].pid_space == mine.pid_space)
        c->tr->pid[r] = rec[r].pid;
  c->boot = *bs;
  c->boot.name = c->boot_name;
  c->thread_caps = cr->thread_caps;
  c->split = cr->split;
  /* A rank that failed here must not leave the others inside the
   * backend's creation exchanges. */
  ZPP_CHECK_GOTO(agree(bs, timeout, st, func), st, err_tr);
  if (backend == ZPP_BACKEND_UCX) {
    st = zpp_transport_ucx_create(c->tr, bs, c->cuda_device);
  } else if (backend == ZPP_BACKEND_NCCL) {
    st = zpp_transport_nccl_create(c->tr, bs, c->cuda_device);
  } else {
    st = cr->mpi_transport(c->tr, cr->state, c->cuda_device);
  }
  ZPP_CHECK_GOTO(agree(bs, timeout, st, func), st, err_tr);
  if (algo == ZPP_ALGORITHM_AUTO) {
    /* ranks on this machine's kernel (else on this host): they share its
     * cores, nodes in containers or namespaces of one machine included */
    int host_ranks = zpp_comm_ranks_on_kernel(
        rec, sizeof *rec, offsetof(boot_rec_t, kernel_id),
        offsetof(boot_rec_t, key), size, rank);
    ZPP_CHECK_GOTO(
        tune_model(bs, timeout, c->tr, probe, host_ranks, ZPP_OK, func), st,
        err_tr);
  }

  c->creator = cr->state;
  c->release = cr->release;
  c->tcp = cr->tcp;
  if (rank == 0) {
    const zpp_transport_t *t = c->tr;
    ZPP_INFO(ZPP_SUBSYS_INIT, "communicator: %d ranks, %d nodes%s, bootstrap "
             "%s, backend %s, memory %s%s",
             size, t->topo->nnodes,
             t->topo->emulated ? " (EMULATED topology)" : "", c->boot_name,
             zpp_backend_name(t->backend),
             cfg->memory == ZPP_MEMORY_DEVICE ? "device" : "host",
             t->emu_on ? ", EMULATED inter-node links" : "");
  }
  free(rec);
  *out = c;
  return ZPP_OK;

err_tr:
  zpp_transport_free(c->tr);
  c->tr = NULL;
err_topo:
  zpp_topo_free(topo);
err_comm:
  zpp_rescue_close(rescue_fd);
  free(rec);
  if (c != NULL) {
    /* The creator's state stays the caller's. */
    c->release = NULL;
    c->tcp = NULL;
    zpp_comm_destroy(c);
  }
  return st;
}

/* The caller's table, named as zpp_comm_create's argument `bs`. */
static zpp_status_t check_table(const zpp_bootstrap_t *bs, const char *func) {
  if (bs == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "bs is NULL");
  if (bs->struct_size != sizeof *bs)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "bs->struct_size %zu: must be sizeof(zpp_bootstrap_t) = "
                     "%zu (ZPP_BOOTSTRAP_INIT)",
                     bs->struct_size, sizeof *bs);
  if (bs->allgather == NULL || bs->bcast == NULL || bs->barrier == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "bs->%s is NULL",
                     bs->allgather == NULL ? "allgather"
                     : bs->bcast == NULL   ? "bcast"
                                           : "barrier");
  if (bs->size < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "bs->size %d: must be >= 1", bs->size);
  if (bs->rank < 0 || bs->rank >= bs->size)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "bs->rank %d: must be in [0, bs->size = %d)", bs->rank,
                     bs->size);
  return ZPP_OK;
}

zpp_status_t zpp_comm_create(const zpp_bootstrap_t *bs,
                             const zpp_comm_config_t *cfg, zpp_comm_t *out) {
  zpp_creator_t cr;
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  ZPP_CHECK(check_table(bs, __func__));
  memset(&cr, 0, sizeof cr);
  cr.name = bs->name != NULL ? bs->name : "user";
  cr.thread_caps = ZPP_THREADS_PROGRESS;
  return zpp_comm_create_with(bs, cfg, &cr, __func__, out);
}

zpp_status_t zpp_comm_get_bootstrap(zpp_comm_t comm, zpp_bootstrap_t *bs) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (bs == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "bs is NULL");
  *bs = comm->boot;
  return ZPP_OK;
}

const char *zpp_comm_bootstrap_name(zpp_comm_t comm) {
  return comm != NULL ? comm->boot_name : "";
}
