/*
 * hpZ: the secondary copy of the weights inside each node, so that the
 * backward gather stays on the node's links.  A forward gather runs over
 * the world (optionally quantized) and keeps this rank's CROSS group's
 * shards; a backward gather gathers them over the node.  docs/design.md,
 * "Collectives".
 */
#include "coll/coll.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "quant/quant.h"

struct zpp_hpz {
  zpp_comm_t comm;
  zpp_hpz_config_t cfg;
  size_t count;
  zpp_dtype_t dtype;
  int hierarchical;  /* uniform nodes: backward gathers stay in the node */
  int nnodes;        /* members of my CROSS group (= nodes when uniform) */
  size_t unit;       /* bytes of one rank's shard as stored: encoded size
                        (quantized) or count * dtype size */
  void *secondary;   /* nnodes units: the shards of my CROSS group, in
                        group order; in the communicator's memory space */
  uint64_t generation;
  uint64_t secondary_generation; /* set when a forward gather completed */
  uint64_t planned_generation;   /* set when one was started */
  /* Device memory: the secondary copy is written on the stream of one
   * call and read on another's.  kept marks its last write (a forward
   * gather's copy), read its last read (a backward gather's transfer):
   * readers wait for kept, writers for read. */
  void *kept, *read;
  uint64_t last_ticket; /* the engine's ticket of the last gather queued */
  /* Gathers started and not yet released by the engine hold a reference:
   * zpp_hpz_destroy with gathers still queued on the engine thread frees
   * the handle and the secondary copy when the last one is done. */
  pthread_mutex_t mu;
  int refs, destroyed;
};

/* Frees the secondary copy and the handle (no gather holds it). */
static void hpz_free(zpp_hpz_t h) {
  zpp_exec_t ex;
  /* Not zpp_exec_init: it fails on a broken communicator (the copy would
   * leak) and may make an engine while the communicator is destroyed. */
  memset(&ex, 0, sizeof ex);
  ex.comm = h->comm;
  ex.t = zpp_comm_transport(h->comm);
  if (zpp_comm_memory(h->comm, &ex.mem) == ZPP_OK) {
    /* A device synchronisation (cudaFree) on the engine's thread would
     * wait for streams that wait for the engine: only the caller's
     * thread frees device memory (zpp_hpz_destroy waits for the queued
     * gathers first); past that bound the copy is leaked, not freed. */
    if (ex.mem == ZPP_MEMORY_DEVICE && zpp_engine_on_thread(h->comm)) {
      ZPP_WARN(ZPP_SUBSYS_COLL,
               "zpp_hpz_destroy: the secondary copy (%zu bytes) is leaked: "
               "its last gather ended after destroy stopped waiting",
               (size_t)h->nnodes * h->unit);
    } else {
      zpp_k_free_persistent(&ex, h->secondary);
      zpp_k_order_free(&ex, h->kept);
      zpp_k_order_free(&ex, h->read);
    }
  }
  pthread_mutex_destroy(&h->mu);
  free(h);
}

/* Drops a gather's reference; the last one after destroy frees h. */
static void hpz_put(zpp_hpz_t h) {
  int last;
  pthread_mutex_lock(&h->mu);
  last = --h->refs == 0 && h->destroyed;
  pthread_mutex_unlock(&h->mu);
  if (last)
    hpz_free(h);
}

zpp_status_t zpp_hpz_create(zpp_comm_t comm, const zpp_hpz_config_t *cfg,
                            size_t count, zpp_dtype_t dtype, zpp_hpz_t *hpz) {
  zpp_exec_t ex;
  struct zpp_hpz *h;
  int uniform;
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(__func__, comm, NULL, &ex));
  if (cfg == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_NULL_POINTER, __func__,
                                         "cfg is NULL"));
  if (hpz == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_NULL_POINTER, __func__,
                                         "hpz is NULL"));
  /* 0.1 structs embed the smaller 0.1 quant config (its last field) */
  if (cfg->struct_size <
      offsetof(zpp_hpz_config_t, quant) + ZPP_QUANT_CONFIG_V1_SIZE)
    return zpp_comm_fail(
        comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                        "cfg->struct_size %zu: initialise with "
                        "ZPP_HPZ_CONFIG_INIT",
                        cfg->struct_size));
  if (cfg->quantized != 0 && cfg->quantized != 1)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                                         "cfg->quantized %d: must be 0 or 1",
                                         cfg->quantized));
  if (cfg->quantized)
    ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_quant(__func__, "cfg->quant",
                                                      "cfg->quant.",
                                                      &cfg->quant)));
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_dtype(__func__, dtype)));
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_count(__func__, &ex, count,
                                                    dtype)));
  ZPP_CHECK(zpp_comm_topo_uniform(comm, &uniform));
  h = (struct zpp_hpz *)calloc(1, sizeof *h);
  if (h == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                         "hpz handle"));
  h->comm = comm;
  h->cfg.struct_size = sizeof h->cfg;
  h->cfg.quantized = cfg->quantized;
  {
    zpp_quant_config_t dq = ZPP_QUANT_CONFIG_INIT;
    h->cfg.quant = dq;
    if (cfg->quantized)
      zpp_quant_config_get(&cfg->quant, &h->cfg.quant);
  }
  h->count = count;
  h->dtype = dtype;
  h->hierarchical = uniform;
  h->nnodes = zpp_transport_group_size(ex.t, ZPP_GROUP_CROSS);
  h->unit = cfg->quantized ? zpp_coll_encoded_size(&cfg->quant, count)
                           : count * zpp_dtype_size(dtype);
  h->generation = 1;
  h->secondary_generation = 0;
  pthread_mutex_init(&h->mu, NULL);
  if (h->hierarchical) {
    st = zpp_k_alloc_persistent(&ex, (size_t)h->nnodes * h->unit,
                                &h->secondary);
    if (st != ZPP_OK) {
      pthread_mutex_destroy(&h->mu);
      free(h);
      return zpp_comm_fail(comm, st);
    }
  } else {
    ZPP_INFO(ZPP_SUBSYS_COLL,
             "hpZ: nodes have different numbers of ranks; backward gathers "
             "fall back to a world gather");
  }
  *hpz = h;
  return ZPP_OK;
}

zpp_status_t zpp_hpz_destroy(zpp_hpz_t hpz) {
  int last;
  zpp_memory_t mem = ZPP_MEMORY_HOST;
  if (hpz == NULL)
    return ZPP_OK;
  /* Device memory: wait (bounded) for the gathers queued on the engine,
   * so that the last reference drops here, on the caller's thread. */
  if (zpp_comm_memory(hpz->comm, &mem) == ZPP_OK && mem == ZPP_MEMORY_DEVICE)
    (void)zpp_engine_wait_ticket(hpz->comm, hpz->last_ticket,
                                 "zpp_hpz_destroy",
                                 "the secondary copy is leaked");
  pthread_mutex_lock(&hpz->mu);
  hpz->destroyed = 1;
  last = hpz->refs == 0;
  pthread_mutex_unlock(&hpz->mu);
  if (last)
    hpz_free(hpz);
  return ZPP_OK;
}

zpp_status_t zpp_hpz_invalidate(zpp_hpz_t hpz) {
  if (hpz == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "hpz is NULL");
  hpz->generation++;
  return ZPP_OK;
}

zpp_status_t zpp_hpz_get_info(zpp_hpz_t hpz, zpp_hpz_info_t *info) {
  if (hpz == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "hpz is NULL");
  if (info == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "info is NULL");
  if (info->struct_size < sizeof(zpp_hpz_info_t))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "info->struct_size %zu: initialise with "
                     "ZPP_HPZ_INFO_INIT",
                     info->struct_size);
  info->hierarchical = hpz->hierarchical;
  info->generation = hpz->generation;
  info->secondary_generation = hpz->secondary_generation;
  info->secondary_bytes = hpz->hierarchical ? (size_t)hpz->nnodes * hpz->unit
                                            : 0;
  return ZPP_OK;
}

/* What a gather does, decided when it is started (so a queued forward
 * gather counts), identically on every rank that made the same calls. */
enum { HPZ_FORWARD = 0, HPZ_BACKWARD_NODE = 1, HPZ_REFRESH = 2 };

typedef struct {
  zpp_exec_t ex;
  zpp_hpz_t h;
  const void *send;
  void *recv;
  uint64_t generation; /* of the parameters when the gather was started */
  uint8_t *all;        /* gathered encoded shards (scratch) */
} hpz_ctx_t;

static void hpz_release(void *p) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  zpp_hpz_t h = c->h;
  zpp_k_free(&c->ex, c->all);
  free(c);
  hpz_put(h);
}

static zpp_status_t hpz_encode(void *p, size_t arg) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  int me = zpp_transport_rank(c->ex.t);
  (void)arg;
  /* stochastic rounding draws at the element's index in the whole tensor */
  return zpp_k_encode_at(&c->ex, &c->h->cfg.quant, c->h->dtype, c->send,
                         c->h->count, (uint64_t)me * c->h->count,
                         c->all + (size_t)me * c->h->unit);
}

static zpp_status_t hpz_decode_world(void *p, size_t arg) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  zpp_hpz_t h = c->h;
  size_t ds = zpp_dtype_size(h->dtype);
  int n = zpp_transport_size(c->ex.t), r;
  (void)arg;
  for (r = 0; r < n; r++)
    ZPP_CHECK(zpp_k_decode(&c->ex, &h->cfg.quant, c->all + (size_t)r * h->unit,
                           h->count, h->dtype,
                           (uint8_t *)c->recv + (size_t)r * h->count * ds));
  return ZPP_OK;
}

/* The secondary copy is cut from what was gathered (the encoded shards, or
 * recv): no extra traffic. */
static zpp_status_t hpz_keep(void *p, size_t arg) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  zpp_hpz_t h = c->h;
  const uint8_t *src = h->cfg.quantized ? c->all : (const uint8_t *)c->recv;
  int i;
  (void)arg;
  if (!h->hierarchical)
    return ZPP_OK;
  /* after the last backward gathers' reads and the last write, on
   * whatever streams they ran */
  ZPP_CHECK(zpp_k_order_wait(&c->ex, h->read));
  ZPP_CHECK(zpp_k_order_wait(&c->ex, h->kept));
  for (i = 0; i < h->nnodes; i++) {
    int w = zpp_transport_group_member(c->ex.t, ZPP_GROUP_CROSS, i);
    ZPP_CHECK(zpp_k_copy(&c->ex, (uint8_t *)h->secondary + (size_t)i * h->unit,
                         src + (size_t)w * h->unit, h->unit));
  }
  return zpp_k_order_record(&c->ex, &h->kept);
}

/* Backward: the secondary copy is read after the forward gather that
 * wrote it, on whatever stream that ran. */
static zpp_status_t hpz_wait_kept(void *p, size_t arg) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  (void)arg;
  return zpp_k_order_wait(&c->ex, c->h->kept);
}

static zpp_status_t hpz_mark(void *p, size_t arg) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  (void)arg;
  if (c->h->hierarchical || c->h->count == 0)
    c->h->secondary_generation = c->generation;
  return ZPP_OK;
}

/* Every world rank's shard is held by exactly one rank of each node (its
 * local rank's CROSS group): decode (or copy) the node's gathered
 * secondary copies into recv. */
static zpp_status_t hpz_unpack_node(void *p, size_t arg) {
  hpz_ctx_t *c = (hpz_ctx_t *)p;
  zpp_hpz_t h = c->h;
  const zpp_topo_t *topo = zpp_transport_topo(c->ex.t);
  int s = zpp_transport_group_size(c->ex.t, ZPP_GROUP_NODE);
  int m = h->nnodes, l, node;
  size_t ds = zpp_dtype_size(h->dtype), per = (size_t)m * h->unit;
  (void)arg;
  /* the transfer read the secondary copy: the next forward may write it
   * once this read and the reads before it (on other streams) are done */
  ZPP_CHECK(zpp_k_order_wait(&c->ex, h->read));
  ZPP_CHECK(zpp_k_order_record(&c->ex, &h->read));
  for (l = 0; l < s; l++) {
    for (node = 0; node < m; node++) {
      int w = topo->node_ranks[topo->node_off[node] + l];
      const uint8_t *unit = c->all + (size_t)l * per + (size_t)node * h->unit;
      uint8_t *out = (uint8_t *)c->recv + (size_t)w * h->count * ds;
      ZPP_CHECK(h->cfg.quantized
                    ? zpp_k_decode(&c->ex, &h->cfg.quant, unit, h->count,
                                   h->dtype, out)
                    : zpp_k_copy(&c->ex, out, unit, h->unit));
    }
  }
  return ZPP_OK;
}

/* Forward (and refresh): world gather into recv, keeping the shards of my
 * CROSS group.  Backward: node-local gather of the secondary shards. */
static zpp_status_t hpz_plan(const char *func, hpz_ctx_t *c, int kind,
                             zpp_request_t *req) {
  zpp_hpz_t h = c->h;
  const zpp_exec_t *ex = &c->ex;
  size_t n = (size_t)zpp_transport_size(ex->t);
  zpp_plan_t *p;
  zpp_xfer_desc_t x;
  zpp_status_t st = ZPP_OK;
  int me = zpp_transport_rank(ex->t), s = zpp_transport_group_size(
                                             ex->t, ZPP_GROUP_NODE);
  if (h->count > 0) {
    if (kind == HPZ_BACKWARD_NODE)
      st = zpp_k_alloc(ex, (size_t)s * (size_t)h->nnodes * h->unit,
                       (void **)&c->all);
    else if (h->cfg.quantized)
      st = zpp_k_alloc(ex, n * h->unit, (void **)&c->all);
  }
  if (st != ZPP_OK) {
    hpz_release(c);
    return zpp_comm_fail(h->comm, st);
  }
  ZPP_CHECK(zpp_comm_fail(h->comm, zpp_plan_create(func, ex, c, hpz_release,
                                                   &p)));
  memset(&x, 0, sizeof x);
  if (h->count == 0) {
    if (kind != HPZ_BACKWARD_NODE)
      zpp_plan_kernel(p, hpz_mark, 0, ZPP_NO_STEP, ZPP_NO_STEP);
  } else if (kind == HPZ_BACKWARD_NODE) {
    int xs;
    x.kind = ZPP_XFER_ALLGATHER;
    x.group = ZPP_GROUP_NODE;
    x.send = h->secondary;
    x.recv = c->all;
    x.bytes = (size_t)h->nnodes * h->unit;
    xs = zpp_plan_kernel(p, hpz_wait_kept, 0, ZPP_NO_STEP, ZPP_NO_STEP);
    xs = zpp_plan_xfer(p, &x, xs, ZPP_NO_STEP);
    zpp_plan_kernel(p, hpz_unpack_node, 0, xs, ZPP_NO_STEP);
  } else {
    int e = ZPP_NO_STEP, xs, d = ZPP_NO_STEP, k;
    x.kind = ZPP_XFER_ALLGATHER;
    x.group = ZPP_GROUP_WORLD;
    x.bytes = h->unit;
    if (h->cfg.quantized) {
      e = zpp_plan_kernel(p, hpz_encode, 0, ZPP_NO_STEP, ZPP_NO_STEP);
      x.send = c->all + (size_t)me * h->unit;
      x.recv = c->all;
    } else {
      x.send = c->send;
      x.recv = c->recv;
    }
    xs = zpp_plan_xfer(p, &x, e, ZPP_NO_STEP);
    if (h->cfg.quantized)
      d = zpp_plan_kernel(p, hpz_decode_world, 0, xs, ZPP_NO_STEP);
    k = zpp_plan_kernel(p, hpz_keep, 0, xs, ZPP_NO_STEP);
    zpp_plan_kernel(p, hpz_mark, 0, k, d);
  }
  return zpp_plan_submit(p, req);
}

/* The prologue's first check: what this gather does, and whether it can
 * (decided from the generations at start, identically on every rank that
 * made the same calls). */
typedef struct {
  zpp_hpz_t h;
  int backward;
  int plan;
} hpz_args_t;

static zpp_status_t hpz_pre(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  hpz_args_t *g = (hpz_args_t *)a->ctx;
  zpp_hpz_t hpz = g->h;
  (void)ex;
  if (hpz->count > 0 && a->recv == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, a->func,
                     "recvbuf is NULL (count %zu)", hpz->count);
  if (!g->backward && hpz->count > 0 && a->send == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, a->func,
                     "sendbuf is NULL (count %zu)", hpz->count);
  if (!g->backward)
    return ZPP_OK;
  if (hpz->hierarchical && hpz->planned_generation == hpz->generation)
    g->plan = HPZ_BACKWARD_NODE;
  else if (a->send != NULL || hpz->count == 0)
    g->plan = HPZ_REFRESH;
  else if (!hpz->hierarchical)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, a->func,
                     "sendbuf is NULL: with uneven nodes hpZ keeps no "
                     "secondary copy, so the backward gather needs the "
                     "primary shard");
  else
    return zpp_error(ZPP_ERR_STALE, a->func,
                     "the secondary copy is from generation %llu but the "
                     "parameters are at generation %llu (invalidated, or no "
                     "forward gather yet); pass sendbuf to refresh it",
                     (unsigned long long)hpz->planned_generation,
                     (unsigned long long)hpz->generation);
  return ZPP_OK;
}

/* The prologue's last check: the buffers, and the words compared. */
static zpp_status_t hpz_post(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  hpz_args_t *g = (hpz_args_t *)a->ctx;
  zpp_hpz_t hpz = g->h;
  /* Device communicators: the caller's buffers are classified once here. */
  if (hpz->count > 0) {
    ZPP_CHECK(zpp_coll_check_device_buf(a->func, ex, "recvbuf", a->recv));
    ZPP_CHECK(zpp_coll_check_device_buf(a->func, ex, "sendbuf", a->send));
  }
  /* Whether the gather will read sendbuf depends on the generations, so
   * its overlap is checked whenever it is passed (zpp_coll.h); size *
   * count * dtype bytes fit size_t (checked by zpp_hpz_create). */
  ZPP_CHECK(zpp_coll_check_layout_overlap(a->func, ex, ZPP_BUFS_GATHER,
                                          a->send, a->recv, hpz->count,
                                          hpz->dtype));
  /* the plan travels as the op: ranks that invalidated differently differ */
  a->op_word = g->plan;
  return ZPP_OK;
}

static zpp_status_t hpz_start(const char *func, zpp_hpz_t hpz,
                              const void *sendbuf, void *recvbuf,
                              zpp_stream_t stream, zpp_request_t *req,
                              int backward) {
  zpp_coll_args_t a;
  hpz_args_t g;
  zpp_exec_t ex;
  hpz_ctx_t *c;
  uint64_t planned = 0;
  int plan;
  zpp_status_t st = ZPP_OK;
  if (hpz == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "hpz is NULL");
  g.h = hpz;
  g.backward = backward;
  g.plan = HPZ_FORWARD;
  a = zpp_coll_args_init(func, hpz->comm, stream, sendbuf, recvbuf,
                         hpz->count, hpz->dtype);
  a.op_word = HPZ_FORWARD;
  a.layout = ZPP_BUFS_NONE;
  a.pre = hpz_pre;
  a.post = hpz_post;
  a.ctx = &g;
  zpp_coll_quant_words(&hpz->cfg.quant, a.words);
  a.words[3] = (uint64_t)hpz->cfg.quantized;
  a.nwords = 4;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  plan = g.plan;
  c = (hpz_ctx_t *)calloc(1, sizeof *c);
  if (c == NULL)
    return zpp_comm_fail(hpz->comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                              "plan context"));
  c->ex = ex;
  c->h = hpz;
  pthread_mutex_lock(&hpz->mu);
  hpz->refs++; /* dropped by hpz_release */
  pthread_mutex_unlock(&hpz->mu);
  c->send = sendbuf;
  c->recv = recvbuf;
  c->generation = hpz->generation;
  if (plan == HPZ_REFRESH)
    ZPP_INFO(ZPP_SUBSYS_COLL,
             "hpZ backward gather: %s; running a world gather",
             hpz->hierarchical ? "secondary copy stale, refreshing"
                               : "uneven nodes");
  planned = hpz->planned_generation;
  if (plan != HPZ_BACKWARD_NODE && hpz->hierarchical)
    hpz->planned_generation = hpz->generation;
  st = hpz_plan(func, c, plan, req);
  if (st != ZPP_OK) /* the secondary copy was not refreshed */
    hpz->planned_generation = planned;
  hpz->last_ticket = zpp_engine_last_ticket(hpz->comm);
  return st;
}

zpp_status_t zpp_hpz_forward_gather(zpp_hpz_t hpz, const void *sendbuf,
                                    void *recvbuf, zpp_stream_t stream,
                                    zpp_request_t *req) {
  return hpz_start(__func__, hpz, sendbuf, recvbuf, stream, req, 0);
}

zpp_status_t zpp_hpz_backward_gather(zpp_hpz_t hpz, const void *sendbuf,
                                     void *recvbuf, zpp_stream_t stream,
                                     zpp_request_t *req) {
  return hpz_start(__func__, hpz, sendbuf, recvbuf, stream, req, 1);
}

zpp_status_t zpp_hpz_copy_of(zpp_hpz_t hpz, int owner, void *out, int *held) {
  int me, l, lo, i;
  const zpp_topo_t *topo;
  const zpp_transport_t *t;
  if (hpz == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "hpz is NULL");
  if (held == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "held is NULL");
  t = zpp_comm_transport(hpz->comm);
  topo = zpp_transport_topo(t);
  if (owner < 0 || owner >= zpp_transport_size(t))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "owner %d: must be in [0, %d)", owner,
                     zpp_transport_size(t));
  *held = ZPP_HPZ_COPY_NONE;
  me = zpp_transport_rank(t);
  l = topo->local_rank_of[owner];
  lo = topo->local_rank_of[me];
  /* my CROSS group: the ranks with my local rank, one per node, in node
   * order; the copy of owner is unit `node` when owner is one of them */
  if (!hpz->hierarchical || l != lo || hpz->secondary_generation == 0)
    return ZPP_OK;
  i = -1;
  for (int k = 0; k < hpz->nnodes; k++)
    if (zpp_transport_group_member(t, ZPP_GROUP_CROSS, k) == owner)
      i = k;
  if (i < 0)
    return ZPP_OK;
  *held = hpz->secondary_generation == hpz->generation ? ZPP_HPZ_COPY_CURRENT
                                                       : ZPP_HPZ_COPY_STALE;
  if (out == NULL || hpz->count == 0)
    return ZPP_OK;
  {
    const uint8_t *unit =
        (const uint8_t *)hpz->secondary + (size_t)i * hpz->unit;
    if (hpz->cfg.quantized)
      return zpp_quant_decode(&hpz->cfg.quant, unit, hpz->unit, hpz->count,
                              hpz->dtype, out);
    memcpy(out, unit, hpz->unit);
  }
  return ZPP_OK;
}
