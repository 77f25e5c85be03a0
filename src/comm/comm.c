/*
 * The public communicator API that needs no MPI: queries, statistics,
 * reports and errors.  Creation lives in comm_create.c (any bootstrap)
 * and comm_mpi.c (the MPI adapter).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algo/tune.h"
#include "comm/comm.h"
#include "comm/comm_impl.h"
#include "transport/transport_impl.h"

const char *zpp_backend_name(zpp_backend_t backend) {
  switch (backend) {
  case ZPP_BACKEND_AUTO: return "auto";
  case ZPP_BACKEND_MPI: return "mpi";
  case ZPP_BACKEND_NCCL: return "nccl";
  case ZPP_BACKEND_UCX: return "ucx";
  }
  return "unknown";
}

void zpp_comm_config_get(const zpp_comm_config_t *in, zpp_comm_config_t *out) {
  zpp_comm_config_t d = ZPP_COMM_CONFIG_INIT;
  if (in->struct_size >= sizeof(zpp_comm_config_t))
    d = *in;
  else
    memcpy(&d, in, ZPP_COMM_CONFIG_V1_SIZE);
  d.struct_size = sizeof(zpp_comm_config_t);
  *out = d;
}

zpp_status_t zpp_comm_config_check_as(const char *func,
                                       const zpp_comm_config_t *in) {
  zpp_comm_config_t cc;
  const zpp_comm_config_t *cfg = &cc;
  if (in == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "cfg is NULL");
  if (in->struct_size < ZPP_COMM_CONFIG_V1_SIZE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->struct_size %zu: must be sizeof(zpp_comm_config_t) "
                     "= %zu (initialise with ZPP_COMM_CONFIG_INIT)",
                     in->struct_size, sizeof(zpp_comm_config_t));
  zpp_comm_config_get(in, &cc);
  if ((int)cfg->backend < ZPP_BACKEND_AUTO ||
      (int)cfg->backend > ZPP_BACKEND_UCX)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->backend %d: must be ZPP_BACKEND_AUTO, _MPI, _NCCL "
                     "or _UCX",
                     (int)cfg->backend);
  if (cfg->memory != ZPP_MEMORY_HOST && cfg->memory != ZPP_MEMORY_DEVICE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->memory %d: must be ZPP_MEMORY_HOST or "
                     "ZPP_MEMORY_DEVICE",
                     (int)cfg->memory);
  if (cfg->cuda_device < -1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->cuda_device %d: must be >= 0, or -1 for automatic",
                     cfg->cuda_device);
  if (cfg->backend == ZPP_BACKEND_NCCL && cfg->memory != ZPP_MEMORY_DEVICE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->backend NCCL needs cfg->memory ZPP_MEMORY_DEVICE");
  if ((int)cfg->algorithm < ZPP_ALGORITHM_DEFAULT ||
      (int)cfg->algorithm > ZPP_ALGORITHM_AUTO)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->algorithm %d: must be ZPP_ALGORITHM_DEFAULT, _HIER, "
                     "_FLAT or _AUTO",
                     (int)cfg->algorithm);
  if (cfg->topology != NULL && strlen(cfg->topology) >= 128)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->topology: longer than 127 characters");
  return ZPP_OK;
}

zpp_status_t zpp_comm_config_check(const zpp_comm_config_t *cfg) {
  return zpp_comm_config_check_as(__func__, cfg);
}

zpp_status_t zpp_comm_destroy(zpp_comm_t comm) {
  if (comm == NULL)
    return ZPP_OK;
  /* Upper layers (the collectives' progress thread) drain first: they may
   * still be using the transport. */
  if (comm->before_destroy != NULL)
    comm->before_destroy(comm);
  zpp_transport_free(comm->tr);
  comm->tr = NULL;
  if (comm->release != NULL)
    comm->release(comm);
  zpp_rescue_free(comm);
  free(comm);
  return ZPP_OK;
}

void zpp_comm_set_before_destroy(zpp_comm_t comm, void (*fn)(zpp_comm_t)) {
  if (comm != NULL)
    comm->before_destroy = fn;
}

void zpp_comm_set_on_abort(zpp_comm_t comm, void (*fn)(zpp_comm_t)) {
  if (comm != NULL)
    comm->on_abort = fn;
}

void zpp_comm_set_quiesce(zpp_comm_t comm,
                          zpp_status_t (*fn)(zpp_comm_t, const char *)) {
  if (comm != NULL)
    comm->quiesce = fn;
}

zpp_status_t zpp_comm_meta_allgather(zpp_comm_t comm, const void *mine,
                                     size_t bytes, void *all) {
  zpp_status_t st;
  if (comm == NULL || comm->boot.allgather == NULL)
    return zpp_error(ZPP_ERR_INTERNAL, __func__,
                     "communicator has no bootstrap channel");
  ZPP_CHECK(zpp_transport_broken_error(comm->tr, "ZPP_CHECK exchange"));
  st = comm->boot.allgather(comm->boot.ctx, mine, bytes, all,
                            comm->tr != NULL ? comm->tr->timeout_s : 0);
  if (st == ZPP_OK)
    return ZPP_OK;
  /* Aborted meanwhile: the communicator's first error stands. */
  if (comm->tr != NULL && atomic_load(&comm->tr->broken))
    return zpp_transport_broken_error(comm->tr, "ZPP_CHECK exchange");
  /* The bootstrap's message names the missing ranks; the exchange is out
   * of step on every rank now, so nothing can follow. */
  if (comm->tr != NULL) {
    zpp_transport_break_st(comm->tr, st, "ZPP_CHECK exchange failed: %.200s",
                           zpp_get_last_error());
    zpp_transport_fail(comm->tr, st);
  }
  return st;
}

zpp_status_t zpp_comm_abort(zpp_comm_t comm) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  zpp_transport_break_st(comm->tr, ZPP_ERR_ABORTED,
                         "zpp_comm_abort was called on rank %d",
                         comm->tr->rank);
  /* Device work in flight (NCCL kernels waiting for peers) stops now,
   * so the caller's streams drain. */
  zpp_transport_abort_device_work(comm->tr);
  /* Plans still queued never start: their requests complete now. */
  if (comm->on_abort != NULL)
    comm->on_abort(comm);
  return ZPP_OK;
}

zpp_status_t zpp_comm_get_async_error(zpp_comm_t comm, zpp_status_t *status) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (status == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "status is NULL");
  /* The communicator's first error (its message becomes this thread's
   * last error), else the backend's asynchronous one (NCCL). */
  *status = zpp_transport_check_async(comm->tr, __func__);
  return ZPP_OK;
}

int zpp_comm_device(zpp_comm_t comm) {
  return comm != NULL ? comm->cuda_device : -1;
}

int zpp_comm_thread_caps(zpp_comm_t comm) {
  return comm != NULL ? comm->thread_caps : 0;
}

uint64_t zpp_comm_next_object_id(zpp_comm_t comm) {
  return __atomic_fetch_add(&comm->objects, 1, __ATOMIC_RELAXED);
}

zpp_transport_t *zpp_comm_transport(zpp_comm_t comm) {
  return comm != NULL ? comm->tr : NULL;
}

zpp_status_t zpp_comm_fail(zpp_comm_t comm, zpp_status_t st) {
  return zpp_transport_fail(comm != NULL ? comm->tr : NULL, st);
}

const char *zpp_comm_get_last_error(zpp_comm_t comm) {
  if (comm == NULL || comm->tr == NULL)
    return "";
  /* The buffer only changes under err_lock; a reader racing a writer may
   * see a torn message, never an unterminated one (the last byte stays 0). */
  return comm->tr->last_error;
}

#define COMM_CHECK(comm, out)                                                  \
  do {                                                                         \
    if ((comm) == NULL)                                                        \
      return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");        \
    if ((out) == NULL)                                                         \
      return zpp_transport_fail(                                               \
          (comm)->tr,                                                          \
          zpp_error(ZPP_ERR_NULL_POINTER, __func__, #out " is NULL"));         \
  } while (0)

static zpp_status_t check_rank(zpp_comm_t comm, int rank, const char *func) {
  if (rank < 0 || rank >= comm->tr->size)
    return zpp_transport_fail(
        comm->tr, zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                            "rank %d: must be in [0, %d)", rank,
                            comm->tr->size));
  return ZPP_OK;
}

zpp_status_t zpp_comm_rank(zpp_comm_t comm, int *rank) {
  COMM_CHECK(comm, rank);
  *rank = comm->tr->rank;
  return ZPP_OK;
}

zpp_status_t zpp_comm_size(zpp_comm_t comm, int *size) {
  COMM_CHECK(comm, size);
  *size = comm->tr->size;
  return ZPP_OK;
}

zpp_status_t zpp_comm_backend(zpp_comm_t comm, zpp_backend_t *backend) {
  COMM_CHECK(comm, backend);
  *backend = comm->tr->backend;
  return ZPP_OK;
}

zpp_status_t zpp_comm_memory(zpp_comm_t comm, zpp_memory_t *memory) {
  COMM_CHECK(comm, memory);
  *memory = comm->tr->memory;
  return ZPP_OK;
}

zpp_status_t zpp_comm_algorithm(zpp_comm_t comm, zpp_algorithm_t *algorithm) {
  COMM_CHECK(comm, algorithm);
  *algorithm = comm->tr->algorithm;
  return ZPP_OK;
}

zpp_status_t zpp_comm_choose_algorithm(zpp_comm_t comm, zpp_algo_coll_t coll,
                                       size_t count, zpp_dtype_t dtype,
                                       zpp_algorithm_t *algorithm,
                                       int *chunks) {
  zpp_transport_t *t;
  int hier = 0, c_rs = 0, c_ag = 0, c;
  size_t es;
  COMM_CHECK(comm, algorithm);
  if ((int)coll < ZPP_ALGO_COLL_ALLGATHER || (int)coll > ZPP_ALGO_COLL_ALLREDUCE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "coll %d: must be ZPP_ALGO_COLL_ALLGATHER, "
                     "_REDUCE_SCATTER or _ALLREDUCE",
                     (int)coll);
  es = zpp_dtype_size(dtype);
  if (es == 0 || (coll != ZPP_ALGO_COLL_ALLGATHER && dtype != ZPP_FLOAT32 &&
                  dtype != ZPP_FLOAT16 && dtype != ZPP_BFLOAT16))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "dtype %d: must be a dtype the collective takes",
                     (int)dtype);
  if (count > SIZE_MAX / es)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__, "count %zu of %zu bytes",
                     count, es);
  t = comm->tr;
  pthread_mutex_lock(&t->lock); /* the group's cached shape */
  zpp_algo_choose(t, ZPP_GROUP_WORLD, (int)coll, count * es, dtype, &hier,
                  &c_rs, &c_ag);
  pthread_mutex_unlock(&t->lock);
  *algorithm = hier ? ZPP_ALGORITHM_HIER : ZPP_ALGORITHM_FLAT;
  if (chunks != NULL) {
    c = coll == ZPP_ALGO_COLL_ALLGATHER ? c_ag : c_rs;
    if (hier && c == 0) { /* ZPP_HIER_CHUNK's count, as hier.c takes it */
      size_t b = coll == ZPP_ALGO_COLL_ALLREDUCE
                     ? (count + (size_t)t->size - 1) / (size_t)t->size * es
                     : count * es;
      size_t k = t->hier_chunk == 0 || b <= t->hier_chunk
                     ? 1
                     : (b + t->hier_chunk - 1) / t->hier_chunk;
      c = k > 8 ? 8 : (int)k;
    }
    *chunks = hier ? c : 0;
  }
  return ZPP_OK;
}

zpp_status_t zpp_comm_nnodes(zpp_comm_t comm, int *nnodes) {
  COMM_CHECK(comm, nnodes);
  *nnodes = comm->tr->topo->nnodes;
  return ZPP_OK;
}

zpp_status_t zpp_comm_node_of(zpp_comm_t comm, int rank, int *node) {
  COMM_CHECK(comm, node);
  ZPP_CHECK(check_rank(comm, rank, __func__));
  *node = comm->tr->topo->node_of[rank];
  return ZPP_OK;
}

zpp_status_t zpp_comm_local_rank_of(zpp_comm_t comm, int rank,
                                    int *local_rank) {
  COMM_CHECK(comm, local_rank);
  ZPP_CHECK(check_rank(comm, rank, __func__));
  *local_rank = comm->tr->topo->local_rank_of[rank];
  return ZPP_OK;
}

zpp_status_t zpp_comm_node_size(zpp_comm_t comm, int node, int *size) {
  const zpp_topo_t *t;
  COMM_CHECK(comm, size);
  t = comm->tr->topo;
  if (node < 0 || node >= t->nnodes)
    return zpp_transport_fail(
        comm->tr, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                            "node %d: must be in [0, %d)", node, t->nnodes));
  *size = t->node_off[node + 1] - t->node_off[node];
  return ZPP_OK;
}

zpp_status_t zpp_comm_local_rank(zpp_comm_t comm, int *local_rank) {
  COMM_CHECK(comm, local_rank);
  *local_rank = comm->tr->topo->local_rank_of[comm->tr->rank];
  return ZPP_OK;
}

zpp_status_t zpp_comm_local_size(zpp_comm_t comm, int *local_size) {
  COMM_CHECK(comm, local_size);
  *local_size = comm->tr->grp[ZPP_GROUP_NODE].size;
  return ZPP_OK;
}

zpp_status_t zpp_comm_topo_emulated(zpp_comm_t comm, int *emulated) {
  COMM_CHECK(comm, emulated);
  *emulated = comm->tr->topo->emulated;
  return ZPP_OK;
}

zpp_status_t zpp_comm_topo_uniform(zpp_comm_t comm, int *uniform) {
  COMM_CHECK(comm, uniform);
  *uniform = comm->tr->topo->uniform;
  return ZPP_OK;
}

zpp_status_t zpp_comm_link(zpp_comm_t comm, int a, int b, zpp_link_t *link) {
  COMM_CHECK(comm, link);
  ZPP_CHECK(check_rank(comm, a, __func__));
  ZPP_CHECK(check_rank(comm, b, __func__));
  *link = zpp_topo_link(comm->tr->topo, a, b);
  return ZPP_OK;
}

zpp_status_t zpp_comm_print_topology(zpp_comm_t comm, FILE *out, int json) {
  const zpp_transport_t *t;
  char text[512], js[512];
  COMM_CHECK(comm, out);
  t = comm->tr;
  if (t->emu_on) {
    snprintf(text, sizeof text,
             "bootstrap: %s, backend: %s, memory: %s\n# EMULATED inter-node "
             "links (a simulation of a slower network): %g Gbit/s per rank, "
             "%g us latency per transfer; intra-node traffic is not slowed\n",
             comm->boot_name, zpp_backend_name(t->backend),
             t->memory == ZPP_MEMORY_DEVICE ? "device" : "host", t->emu_gbit,
             t->emu_lat_us);
  } else {
    snprintf(text, sizeof text,
             "bootstrap: %s, backend: %s, memory: %s, links: real\n",
             comm->boot_name, zpp_backend_name(t->backend),
             t->memory == ZPP_MEMORY_DEVICE ? "device" : "host");
  }
  snprintf(js, sizeof js,
           "\"bootstrap\": \"%s\", \"backend\": \"%s\", \"memory\": \"%s\", "
           "\"gpu_probe\": \"%s\", "
           "\"link_emulation\": {\"emulated\": %s, \"gbit_per_rank\": %g, "
           "\"latency_us\": %g}",
           comm->boot_name, zpp_backend_name(t->backend),
           t->memory == ZPP_MEMORY_DEVICE ? "device" : "host",
           t->topo->has_gpu ? zpp_topo_gpu_probe_source() : "none",
           t->emu_on ? "true" : "false", t->emu_gbit, t->emu_lat_us);
  return zpp_transport_fail(comm->tr,
                            zpp_topo_print(t->topo, out, json, text, js));
}

zpp_status_t zpp_comm_get_stats(zpp_comm_t comm, zpp_comm_stats_t *stats) {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  zpp_transport_counts_t c;
  const zpp_transport_t *t;
  size_t n;
  int g;
  COMM_CHECK(comm, stats);
  if (stats->struct_size < offsetof(zpp_comm_stats_t, intra_bytes_sent) +
                               sizeof(uint64_t))
    return zpp_transport_fail(
        comm->tr, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                            "stats->struct_size %zu: initialise with "
                            "ZPP_COMM_STATS_INIT",
                            stats->struct_size));
  t = comm->tr;
  if (comm->quiesce != NULL)
    ZPP_CHECK(comm->quiesce(comm, __func__));
  zpp_transport_get_counts(comm->tr, &c);
  s.intra_bytes_sent = c.sent[ZPP_LINKCLASS_INTRA];
  s.intra_bytes_recv = c.recv[ZPP_LINKCLASS_INTRA];
  s.inter_bytes_sent = c.sent[ZPP_LINKCLASS_INTER];
  s.inter_bytes_recv = c.recv[ZPP_LINKCLASS_INTER];
  for (g = 0; g < ZPP_NGROUPS; g++)
    s.calls[g] = c.calls[g];
  s.bytes_derived = t->bytes_derived;
  s.topo_emulated = t->topo->emulated;
  s.link_emulated = t->emu_on;
  s.emu_gbit = t->emu_gbit;
  s.emu_lat_us = t->emu_lat_us;
  s.emu_wait_s = (double)atomic_load(&comm->tr->emu_wait_ns) * 1e-9;
  n = stats->struct_size < sizeof s ? stats->struct_size : sizeof s;
  s.struct_size = stats->struct_size;
  memcpy(stats, &s, n);
  return ZPP_OK;
}

zpp_status_t zpp_comm_reset_stats(zpp_comm_t comm) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (comm->quiesce != NULL)
    ZPP_CHECK(comm->quiesce(comm, __func__));
  zpp_transport_reset_counts(comm->tr);
  return ZPP_OK;
}
