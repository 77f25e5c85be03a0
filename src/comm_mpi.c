/*
 * Creating a communicator from an MPI communicator: duplicate it, find the
 * nodes (MPI's shared-memory split, or the ZPP_TOPO emulation), describe
 * the GPUs, then build the backend.  Every rank takes the same path; a
 * failure on one rank is agreed on by all, so no rank is left waiting.
 */
#include "transport_impl.h"

#if ZPP_HAVE_MPI

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zpp/zpp_mpi.h>

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef struct {
  MPI_Comm dup;
} mpi_creator_t;

/* What each rank tells the others at bootstrap. */
typedef struct {
  int64_t key;     /* lowest world rank of my shared-memory domain */
  int32_t real_local_rank;
  int32_t spec_len;
  uint64_t spec_hash;
  char host[ZPP_TOPO_HOST_LEN];
} boot_rec_t;

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void release_mpi(zpp_comm_t c) {
  mpi_creator_t *m = c->creator;
  int fin = 0;
  if (m == NULL)
    return;
  MPI_Finalized(&fin);
  if (!fin && m->dup != MPI_COMM_NULL)
    MPI_Comm_free(&m->dup);
  free(m);
  c->creator = NULL;
}

/* All ranks learn whether any failed; the failing rank keeps its message. */
static zpp_status_t agree(MPI_Comm comm, zpp_status_t st, const char *func) {
  int mine = (int)st, worst = 0;
  if (MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
    return st != ZPP_OK ? st
                        : zpp_error(ZPP_ERR_MPI, func,
                                    "MPI_Allreduce of the creation status");
  if (st != ZPP_OK)
    return st;
  if (worst != ZPP_OK)
    return zpp_error((zpp_status_t)worst, func,
                     "another rank failed to create the communicator (%s); "
                     "see its log",
                     zpp_status_string((zpp_status_t)worst));
  return ZPP_OK;
}

static zpp_status_t bs_bcast(void *ctx, void *buf, size_t bytes, int root) {
  int rc;
  if (bytes > (size_t)INT32_MAX)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__, "%zu bytes", bytes);
  rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, *(MPI_Comm *)ctx);
  return rc == MPI_SUCCESS ? ZPP_OK : zpp_mpi_error(rc, __func__, "MPI_Bcast");
}

static zpp_status_t bs_allgather(void *ctx, const void *mine, size_t bytes,
                                 void *all) {
  int rc;
  if (bytes > (size_t)INT32_MAX)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__, "%zu bytes", bytes);
  rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                     *(MPI_Comm *)ctx);
  return rc == MPI_SUCCESS ? ZPP_OK
                           : zpp_mpi_error(rc, __func__, "MPI_Allgather");
}

/* The node map: emulated from the spec, else one node per shared-memory
 * domain. */
static zpp_status_t build_topo(const boot_rec_t *rec, int size,
                               const char *spec, zpp_topo_t **out) {
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
    if (keys == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%d keys", size);
    for (r = 0; r < size; r++)
      keys[r] = rec[r].key;
    st = zpp_topo_from_keys(size, keys, "MPI shared-memory split", &t);
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
 * its real machine can be related), then the rows are exchanged. */
static zpp_status_t gpu_links(MPI_Comm comm, zpp_topo_t *t,
                              const boot_rec_t *rec, int rank, int device) {
  int n = t->world_size, b, rc;
  zpp_topo_gpu_t me, *all = NULL;
  uint8_t *row = NULL, *links = NULL;
  zpp_status_t st;
  ZPP_CHECK(zpp_topo_gpu_describe(device, &me));
  all = malloc((size_t)n * sizeof *all);
  row = malloc(2 * (size_t)n);
  links = malloc(2 * (size_t)n * (size_t)n);
  if (all == NULL || row == NULL || links == NULL) {
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "GPU link matrix");
    goto err_free;
  }
  rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me,
                     MPI_BYTE, comm);
  if (rc != MPI_SUCCESS) {
    st = zpp_mpi_error(rc, __func__, "MPI_Allgather of GPU descriptions");
    goto err_free;
  }
  for (b = 0; b < n; b++) {
    zpp_link_t l = ZPP_LINK_NET;
    int nv = 0;
    if (b == rank)
      l = ZPP_LINK_SELF;
    else if (rec[b].key == rec[rank].key) {
      st = zpp_topo_gpu_link(&me, &all[b], &l, &nv);
      if (st != ZPP_OK)
        goto err_free;
    }
    row[b] = (uint8_t)l;
    row[n + b] = (uint8_t)(nv > 255 ? 255 : nv);
  }
  rc = MPI_Allgather(row, 2 * n, MPI_BYTE, links, 2 * n, MPI_BYTE, comm);
  if (rc != MPI_SUCCESS) {
    st = zpp_mpi_error(rc, __func__, "MPI_Allgather of GPU links");
    goto err_free;
  }
  {
    /* links holds, per rank, [class row | NVLink-count row]: split them
     * into the two matrices (row is no longer needed: reuse it as the
     * count matrix only if it were large enough, which it is not). */
    uint8_t *cls = malloc(2 * (size_t)n * (size_t)n);
    if (cls == NULL) {
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "GPU link matrix");
      goto err_free;
    }
    for (b = 0; b < n; b++) {
      memcpy(cls + (size_t)b * n, links + (size_t)b * 2 * n, (size_t)n);
      memcpy(cls + (size_t)n * n + (size_t)b * n, links + (size_t)b * 2 * n + n,
             (size_t)n);
    }
    st = zpp_topo_set_gpus(t, all, cls, cls + (size_t)n * n);
    free(cls);
  }
err_free:
  free(links);
  free(row);
  free(all);
  return st;
}

/* Whether another rank of my real machine uses my GPU (NCCL refuses two
 * ranks on one device).  Real machines, not emulated nodes: two emulated
 * nodes on one machine may share a GPU. */
static int shares_gpu(const zpp_topo_t *topo, const boot_rec_t *rec,
                      int rank) {
  int b;
  if (topo->gpu == NULL || topo->gpu[rank].bus_id[0] == '\0')
    return 0;
  for (b = 0; b < topo->world_size; b++)
    if (b != rank && rec[b].key == rec[rank].key &&
        strcmp(topo->gpu[b].bus_id, topo->gpu[rank].bus_id) == 0)
      return 1;
  return 0;
}

static zpp_status_t resolve_backend(MPI_Comm comm, const zpp_comm_config_t *cfg,
                                    const zpp_topo_t *topo,
                                    const boot_rec_t *rec, int rank,
                                    zpp_backend_t *out) {
  zpp_backend_t b = cfg->backend;
  if (b == ZPP_BACKEND_UCX)
    return zpp_error(ZPP_ERR_UNSUPPORTED, "zpp_comm_create_mpi",
                     "cfg->backend UCX: not built yet (docs/design.md, "
                     "\"Transports\")");
  if (b == ZPP_BACKEND_AUTO) {
    int mine = 0, all = 0;
    char why[256];
    if (cfg->memory == ZPP_MEMORY_DEVICE) {
      mine = zpp_transport_nccl_available(why, sizeof why);
      if (mine && shares_gpu(topo, rec, rank)) {
        mine = 0;
        snprintf(why, sizeof why,
                 "ranks share GPU %d, and NCCL needs one GPU per rank",
                 topo->gpu != NULL ? topo->gpu[rank].device : -1);
      }
    }
    /* Every rank must pick the same backend. */
    if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, comm) != MPI_SUCCESS)
      return zpp_error(ZPP_ERR_MPI, "zpp_comm_create_mpi",
                       "MPI_Allreduce of the backend choice");
    b = all ? ZPP_BACKEND_NCCL : ZPP_BACKEND_MPI;
    if (cfg->memory == ZPP_MEMORY_DEVICE && !all)
      ZPP_INFO(ZPP_SUBSYS_NET, "backend auto: NCCL not usable on every rank "
               "(%s); device memory goes through MPI staging",
               mine ? "another rank" : why);
  }
  *out = b;
  return ZPP_OK;
}

zpp_status_t zpp_comm_create_mpi(MPI_Comm comm, const zpp_comm_config_t *cfg,
                                 zpp_comm_t *out) {
  zpp_comm_config_t def = ZPP_COMM_CONFIG_INIT;
  zpp_comm_t c = NULL;
  mpi_creator_t *mc = NULL;
  boot_rec_t mine, *rec = NULL;
  zpp_topo_t *topo = NULL;
  const char *spec;
  MPI_Comm shm = MPI_COMM_NULL;
  int init = 0, fin = 0, rank, size, rc, shm_rank = 0, key = 0, r;
  double timeout;
  zpp_status_t st;
  zpp_backend_t backend = ZPP_BACKEND_MPI;

  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (cfg == NULL)
    cfg = &def;
  ZPP_CHECK(zpp_comm_config_check(cfg));
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "comm: MPI is %s; call MPI_Init first",
                     fin ? "finalised" : "not initialised");
  if (comm == MPI_COMM_NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "comm is MPI_COMM_NULL");

  c = calloc(1, sizeof *c);
  mc = calloc(1, sizeof *mc);
  if (c == NULL || mc == NULL) {
    free(c);
    free(mc);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "communicator");
  }
  c->cfg = *cfg;
  c->cfg.topology = NULL;
  c->cuda_device = -1;
  c->creator = mc;
  c->release = release_mpi;
  mc->dup = MPI_COMM_NULL;
  rc = MPI_Comm_dup(comm, &mc->dup);
  if (rc != MPI_SUCCESS) {
    st = zpp_mpi_error(rc, __func__, "MPI_Comm_dup");
    goto err_comm;
  }
  MPI_Comm_set_errhandler(mc->dup, MPI_ERRORS_RETURN);
  MPI_Comm_rank(mc->dup, &rank);
  MPI_Comm_size(mc->dup, &size);
  zpp_log_set_rank(rank);
  {
    /* What the collectives may do with threads (transport.h,
     * zpp_comm_thread_caps): the engine thread that runs started
     * collectives calls MPI while the caller may call MPI too, which needs
     * MPI_THREAD_MULTIPLE.  Blocking collectives (and chunked, pipelined
     * ones) run on the calling thread and need nothing more. */
    int level = 0;
    MPI_Query_thread(&level);
    c->thread_caps = level >= MPI_THREAD_MULTIPLE ? ZPP_THREADS_PROGRESS : 0;
    if (level < MPI_THREAD_MULTIPLE)
      ZPP_INFO(ZPP_SUBSYS_NET,
               "MPI thread level %d: started collectives run to completion "
               "when started (asynchrony needs MPI_THREAD_MULTIPLE)",
               level);
  }

  /* Host identity: the launcher's shared-memory domains. */
  memset(&mine, 0, sizeof mine);
  rc = MPI_Comm_split_type(mc->dup, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                           &shm);
  if (rc == MPI_SUCCESS) {
    MPI_Comm_rank(shm, &shm_rank);
    rc = MPI_Allreduce(&rank, &key, 1, MPI_INT, MPI_MIN, shm);
    MPI_Comm_free(&shm);
  }
  if (rc != MPI_SUCCESS) {
    st = zpp_mpi_error(rc, __func__, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    goto err_comm;
  }
  mine.key = key;
  mine.real_local_rank = shm_rank;
  if (gethostname(mine.host, sizeof mine.host) != 0)
    snprintf(mine.host, sizeof mine.host, "unknown");
  mine.host[sizeof mine.host - 1] = '\0';
  spec = (cfg->topology != NULL && cfg->topology[0] != '\0')
             ? cfg->topology
             : zpp_setting("ZPP_TOPO");
  st = ZPP_OK;
  if (strlen(spec) >= sizeof c->topo_spec)
    st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                   "topology \"%.40s...\": longer than %zu characters", spec,
                   sizeof c->topo_spec - 1);
  snprintf(c->topo_spec, sizeof c->topo_spec, "%s", spec);
  mine.spec_hash = hash_str(spec);
  mine.spec_len = (int32_t)strlen(spec);
  rec = malloc((size_t)size * sizeof *rec);
  if (rec == NULL && st == ZPP_OK)
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%d bootstrap records",
                   size);
  /* Agree before the exchange, so a rank that failed never leaves the
   * others inside it. */
  ZPP_CHECK_GOTO(agree(mc->dup, st, __func__), st, err_comm);
  rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, rec, (int)sizeof mine,
                     MPI_BYTE, mc->dup);
  if (rc != MPI_SUCCESS) {
    st = zpp_mpi_error(rc, __func__, "MPI_Allgather of host identities");
    goto err_comm;
  }
  st = ZPP_OK;
  for (r = 0; r < size && st == ZPP_OK; r++)
    if (rec[r].spec_hash != mine.spec_hash)
      st = zpp_error(ZPP_ERR_MISMATCH, __func__,
                     "topology: rank %d uses \"%s\" but rank %d uses another "
                     "(%d characters); set ZPP_TOPO alike on every rank",
                     rank, spec, r, (int)rec[r].spec_len);
  if (st == ZPP_OK)
    st = build_topo(rec, size, spec, &topo);
  ZPP_CHECK_GOTO(agree(mc->dup, st, __func__), st, err_topo);
  ZPP_INFO(ZPP_SUBSYS_TOPO, "%d ranks on %d nodes%s (%s%s%s); I am node %d, "
           "local rank %d of %d%s",
           size, topo->nnodes, topo->uniform ? "" : " of uneven sizes",
           topo->emulated ? "EMULATED by \"" : topo->source,
           topo->emulated ? topo->spec : "", topo->emulated ? "\"" : "",
           topo->node_of[rank], topo->local_rank_of[rank],
           topo->node_off[topo->node_of[rank] + 1] -
               topo->node_off[topo->node_of[rank]],
           topo->emulated ? "; real placement ignored for nodes" : "");

  st = ZPP_OK;
  if (cfg->memory == ZPP_MEMORY_DEVICE) {
    st = pick_device(cfg, mine.real_local_rank, &c->cuda_device);
    ZPP_CHECK_GOTO(agree(mc->dup, st, __func__), st, err_topo);
    st = gpu_links(mc->dup, topo, rec, rank, c->cuda_device);
    ZPP_CHECK_GOTO(agree(mc->dup, st, __func__), st, err_topo);
  }
  /* After the GPU map: AUTO must know whether ranks share a GPU. */
  ZPP_CHECK_GOTO(resolve_backend(mc->dup, cfg, topo, rec, rank, &backend), st,
                 err_topo);

  timeout = cfg->timeout_s > 0 ? cfg->timeout_s
                               : zpp_setting_double("ZPP_TIMEOUT_S", 300.0);
  c->tr = calloc(1, sizeof *c->tr);
  if (c->tr == NULL) {
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "transport");
  } else {
    st = zpp_transport_init(c->tr, topo, rank, cfg->memory, timeout);
    topo = NULL; /* owned by the transport now */
  }
  /* A rank that failed here must not leave the others inside the
   * backend's creation exchanges. */
  ZPP_CHECK_GOTO(agree(mc->dup, st, __func__), st, err_tr);
  if (st == ZPP_OK) {
    c->boot.ctx = &mc->dup;
    c->boot.bcast = bs_bcast;
    c->boot.allgather = bs_allgather;
    if (backend == ZPP_BACKEND_NCCL) {
      zpp_bootstrap_t bs = {&mc->dup, bs_bcast, bs_allgather};
      st = zpp_transport_nccl_create(c->tr, &bs, c->cuda_device);
    } else {
      st = zpp_transport_mpi_create(c->tr, mc->dup, c->cuda_device);
    }
  }
  ZPP_CHECK_GOTO(agree(mc->dup, st, __func__), st, err_tr);

  if (rank == 0) {
    const zpp_transport_t *t = c->tr;
    ZPP_INFO(ZPP_SUBSYS_INIT, "communicator: %d ranks, %d nodes%s, backend %s, "
             "memory %s%s",
             size, t->topo->nnodes,
             t->topo->emulated ? " (EMULATED topology)" : "",
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
  free(rec);
  zpp_comm_destroy(c);
  return st;
}

zpp_status_t zpp_comm_get_mpi_comm(zpp_comm_t comm, MPI_Comm *out) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (comm->release != release_mpi)
    return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                     "comm was not created from MPI");
  *out = ((mpi_creator_t *)comm->creator)->dup;
  return ZPP_OK;
}

#endif /* ZPP_HAVE_MPI */
