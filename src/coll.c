/*
 * Baselines, qwZ and hpZ, written once against the transport table and the
 * kernel dispatch of coll_exec.c.  Algorithms and byte formulas:
 * docs/design.md, "Collectives".
 */
#include "coll_internal.h"
#include "internal.h"
#include "topo.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Config words compared across ranks under ZPP_CHECK. */
static void quant_words(const zpp_quant_config_t *q, uint64_t w[3]) {
  w[0] = (uint64_t)q->bits;
  w[1] = (uint64_t)q->block_size;
  w[2] = (uint64_t)q->mode;
}

/* ---- baselines ------------------------------------------------------------ */

typedef struct {
  zpp_exec_t ex;
  const void *send;
  void *recv;
  size_t count;
  zpp_dtype_t dtype;
  zpp_redop_t op;
} base_arg_t;

static zpp_status_t allgather_run(void *p) {
  base_arg_t *a = (base_arg_t *)p;
  return zpp_transport_allgather(a->ex.t, ZPP_GROUP_WORLD, a->send,
                                 a->count * zpp_dtype_size(a->dtype), a->recv,
                                 a->ex.mem, a->ex.stream);
}

zpp_status_t zpp_allgather(zpp_comm_t comm, const void *sendbuf, void *recvbuf,
                           size_t count, zpp_dtype_t dtype,
                           zpp_stream_t stream, zpp_request_t *req) {
  base_arg_t a;
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &a.ex));
  st = zpp_coll_check_dtype(__func__, dtype);
  if (st == ZPP_OK)
    st = zpp_coll_check_bufs(__func__, &a.ex, sendbuf, recvbuf, count, dtype);
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, -1, NULL, 0,
                                                    st)));
  a.send = sendbuf;
  a.recv = recvbuf;
  a.count = count;
  a.dtype = dtype;
  a.op = ZPP_OP_SUM;
  return zpp_coll_submit_copy(__func__, comm, allgather_run, &a, sizeof a, stream, req);
}

static zpp_status_t reduce_scatter_run(void *p) {
  base_arg_t *a = (base_arg_t *)p;
  ZPP_CHECK(zpp_transport_reduce_scatter(a->ex.t, ZPP_GROUP_WORLD, a->send,
                                         a->recv, a->count, a->dtype,
                                         ZPP_REDUCE_SUM, a->ex.mem,
                                         a->ex.stream));
  if (a->op == ZPP_OP_MEAN)
    return zpp_k_scale(&a->ex, a->dtype, a->recv, a->count,
                       (float)zpp_transport_size(a->ex.t));
  return ZPP_OK;
}

zpp_status_t zpp_reduce_scatter(zpp_comm_t comm, const void *sendbuf,
                                void *recvbuf, size_t count, zpp_dtype_t dtype,
                                zpp_redop_t op, zpp_stream_t stream,
                                zpp_request_t *req) {
  base_arg_t a;
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &a.ex));
  st = zpp_coll_check_dtype(__func__, dtype);
  if (st == ZPP_OK)
    st = zpp_coll_check_op(__func__, op);
  if (st == ZPP_OK)
    st = zpp_coll_check_bufs(__func__, &a.ex, sendbuf, recvbuf, count, dtype);
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, (int)op, NULL,
                                                    0, st)));
  a.send = sendbuf;
  a.recv = recvbuf;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  return zpp_coll_submit_copy(__func__, comm, reduce_scatter_run, &a, sizeof a, stream, req);
}

/* ---- qwZ -------------------------------------------------------------------- */

/* Encodes my shard into all + me * E, gathers every encoded shard into
 * `all` (n * E bytes, in place), and decodes them into recv when recv is
 * not NULL. */
static zpp_status_t qwz_gather(const zpp_exec_t *ex,
                               const zpp_quant_config_t *q, const void *send,
                               void *recv, size_t count, zpp_dtype_t dtype,
                               uint8_t *all) {
  int n = zpp_transport_size(ex->t), me = zpp_transport_rank(ex->t), r;
  size_t e = zpp_coll_encoded_size(q, count);
  size_t ds = zpp_dtype_size(dtype);
  /* stochastic rounding draws at the element's index in the whole tensor */
  ZPP_CHECK(zpp_k_encode_at(ex, q, dtype, send, count,
                            (uint64_t)me * (uint64_t)count,
                            all + (size_t)me * e));
  ZPP_CHECK(zpp_transport_allgather(ex->t, ZPP_GROUP_WORLD,
                                    all + (size_t)me * e, e, all, ex->mem,
                                    ex->stream));
  for (r = 0; recv != NULL && r < n; r++)
    ZPP_CHECK(zpp_k_decode(ex, q, all + (size_t)r * e, count, dtype,
                           (uint8_t *)recv + (size_t)r * count * ds));
  return ZPP_OK;
}

static zpp_status_t check_quant(const char *func, const zpp_quant_config_t *q) {
  zpp_status_t st;
  if (q == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "quant is NULL");
  st = zpp_quant_config_check(q);
  if (st != ZPP_OK) /* keep the field name, report under this function */
    return zpp_error(st, func, "quant: %s",
                     strchr(zpp_get_last_error(), ':') + 2);
  return ZPP_OK;
}

typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q;
  const void *send;
  void *recv;
  size_t count;
  zpp_dtype_t dtype;
} qwz_arg_t;

/* One in-place all-gather of a pipeline chunk, run on the pipe thread. */
typedef struct {
  const zpp_exec_t *ex;
  uint8_t *all; /* n * bytes; my block at me * bytes */
  size_t bytes;
} ag_step_t;

static zpp_status_t ag_step(void *p) {
  ag_step_t *s = (ag_step_t *)p;
  int me = zpp_transport_rank(s->ex->t);
  return zpp_transport_allgather(s->ex->t, ZPP_GROUP_WORLD,
                                 s->all + (size_t)me * s->bytes, s->bytes,
                                 s->all, s->ex->mem, s->ex->stream);
}

#define PIPE_DEPTH 3 /* chunk buffers in flight: gather k+2 while decoding k */

/* qwZ in chunks of whole blocks: the all-gather of chunk k + 2 and k + 1
 * run on the pipe thread while this thread decodes chunk k.  Each chunk is
 * encoded on its own; since chunks are whole blocks, every block, and so
 * every decoded value, is the one the unchunked path produces. */
static zpp_status_t qwz_pipelined(const qwz_arg_t *a, size_t chunk) {
  const zpp_exec_t *ex = &a->ex;
  int n = zpp_transport_size(ex->t), me = zpp_transport_rank(ex->t), r;
  size_t ds = zpp_dtype_size(a->dtype);
  size_t nchunks = (a->count + chunk - 1) / chunk, k;
  size_t ebuf = zpp_coll_encoded_size(&a->q, chunk);
  uint8_t *buf[PIPE_DEPTH] = {NULL, NULL, NULL};
  ag_step_t step[PIPE_DEPTH];
  int ticket[PIPE_DEPTH];
  zpp_pipe_t *pipe = NULL;
  zpp_status_t st = ZPP_OK;
  int i;
  for (i = 0; i < PIPE_DEPTH; i++)
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, (size_t)n * ebuf, (void **)&buf[i]), st,
                   out);
  ZPP_CHECK_GOTO(zpp_pipe_start("zpp_qwz_allgather", &pipe), st, out);
  ZPP_TRACE(ZPP_SUBSYS_COLL, "qwZ: %zu chunks of %zu elements", nchunks,
            chunk);
  for (k = 0; k < nchunks + 2 && st == ZPP_OK; k++) {
    /* post chunk k (encode first), then decode chunk k - 2 */
    if (k < nchunks) {
      size_t off = k * chunk, len = a->count - off < chunk ? a->count - off
                                                           : chunk;
      ag_step_t *sp = &step[k % PIPE_DEPTH];
      sp->ex = ex;
      sp->all = buf[k % PIPE_DEPTH];
      sp->bytes = zpp_coll_encoded_size(&a->q, len);
      st = zpp_k_encode_at(ex, &a->q, a->dtype,
                           (const uint8_t *)a->send + off * ds, len,
                           (uint64_t)me * a->count + off,
                           sp->all + (size_t)me * sp->bytes);
      if (st != ZPP_OK)
        break;
      ticket[k % PIPE_DEPTH] = zpp_pipe_post(pipe, ag_step, sp);
    }
    if (k >= 2) {
      size_t j = k - 2, off = j * chunk;
      size_t len = a->count - off < chunk ? a->count - off : chunk;
      ag_step_t *sp = &step[j % PIPE_DEPTH];
      st = zpp_pipe_wait(pipe, ticket[j % PIPE_DEPTH]);
      for (r = 0; st == ZPP_OK && r < n; r++)
        st = zpp_k_decode(ex, &a->q, sp->all + (size_t)r * sp->bytes, len,
                          a->dtype,
                          (uint8_t *)a->recv + ((size_t)r * a->count + off) * ds);
    }
    /* buffer k % 3 is reused by chunk k + 3, posted after chunk k was
     * decoded in iteration k + 2 */
  }
out:
  if (pipe != NULL) {
    zpp_status_t fin = zpp_pipe_finish(pipe);
    if (st == ZPP_OK)
      st = fin;
  }
  for (i = 0; i < PIPE_DEPTH; i++)
    zpp_k_free(ex, buf[i]);
  return st;
}

static zpp_status_t qwz_run(void *p) {
  qwz_arg_t *a = (qwz_arg_t *)p;
  size_t n = (size_t)zpp_transport_size(a->ex.t);
  size_t chunk;
  void *all;
  zpp_status_t st;
  if (a->count == 0)
    return ZPP_OK;
  chunk = zpp_pipe_chunk(a->count, a->q.block_size);
  if (a->ex.mem == ZPP_MEMORY_HOST && n > 1 && chunk < a->count &&
      (zpp_comm_thread_caps(a->ex.comm) & ZPP_THREADS_PIPE))
    return qwz_pipelined(a, chunk);
  ZPP_CHECK(zpp_k_alloc(&a->ex, n * zpp_coll_encoded_size(&a->q, a->count),
                        &all));
  st = qwz_gather(&a->ex, &a->q, a->send, a->recv, a->count, a->dtype,
                  (uint8_t *)all);
  zpp_k_free(&a->ex, all);
  return st;
}

zpp_status_t zpp_qwz_allgather(zpp_comm_t comm, const zpp_quant_config_t *quant,
                               const void *sendbuf, void *recvbuf,
                               size_t count, zpp_dtype_t dtype,
                               zpp_stream_t stream, zpp_request_t *req) {
  qwz_arg_t a;
  uint64_t w[3] = {0, 0, 0};
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &a.ex));
  st = check_quant(__func__, quant);
  if (st == ZPP_OK)
    st = zpp_coll_check_dtype(__func__, dtype);
  if (st == ZPP_OK)
    st = zpp_coll_check_bufs(__func__, &a.ex, sendbuf, recvbuf, count, dtype);
  if (quant != NULL)
    quant_words(quant, w);
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, -1, w, 3,
                                                    st)));
  zpp_quant_config_get(quant, &a.q); /* any accepted struct_size */
  a.send = sendbuf;
  a.recv = recvbuf;
  a.count = count;
  a.dtype = dtype;
  return zpp_coll_submit_copy(__func__, comm, qwz_run, &a, sizeof a, stream, req);
}

/* ---- hpZ ---------------------------------------------------------------------- */

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
};

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
    ZPP_CHECK(zpp_comm_fail(comm, check_quant(__func__, &cfg->quant)));
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_dtype(__func__, dtype)));
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_bufs(__func__, &ex, "", "", count,
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
  if (h->hierarchical) {
    st = zpp_k_alloc(&ex, (size_t)h->nnodes * h->unit, &h->secondary);
    if (st != ZPP_OK) {
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
  zpp_exec_t ex;
  if (hpz == NULL)
    return ZPP_OK;
  if (zpp_exec_init(__func__, hpz->comm, NULL, &ex) == ZPP_OK)
    zpp_k_free(&ex, hpz->secondary);
  free(hpz);
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

typedef struct {
  zpp_exec_t ex;
  zpp_hpz_t h;
  const void *send;
  void *recv;
  uint64_t generation; /* of the parameters when the gather was started */
  int backward; /* HPZ_FORWARD, HPZ_BACKWARD_NODE or HPZ_REFRESH */
} hpz_arg_t;

/* World gather into recv, keeping the shards of my CROSS group. */
static zpp_status_t hpz_forward(hpz_arg_t *a) {
  zpp_hpz_t h = a->h;
  const zpp_exec_t *ex = &a->ex;
  size_t n = (size_t)zpp_transport_size(ex->t);
  size_t ds = zpp_dtype_size(h->dtype);
  uint8_t *all = NULL;
  const uint8_t *src;
  zpp_status_t st = ZPP_OK;
  int i;
  if (h->count == 0) {
    h->secondary_generation = a->generation;
    return ZPP_OK;
  }
  if (h->cfg.quantized) {
    ZPP_CHECK(zpp_k_alloc(ex, n * h->unit, (void **)&all));
    st = qwz_gather(ex, &h->cfg.quant, a->send, a->recv, h->count, h->dtype,
                    all);
    src = all;
  } else {
    st = zpp_transport_allgather(ex->t, ZPP_GROUP_WORLD, a->send,
                                 h->count * ds, a->recv, ex->mem, ex->stream);
    src = (const uint8_t *)a->recv;
  }
  /* The secondary copy is cut from what was gathered: no extra traffic. */
  for (i = 0; st == ZPP_OK && h->hierarchical && i < h->nnodes; i++) {
    int w = zpp_transport_group_member(ex->t, ZPP_GROUP_CROSS, i);
    st = zpp_k_copy(ex, (uint8_t *)h->secondary + (size_t)i * h->unit,
                    src + (size_t)w * h->unit, h->unit);
  }
  zpp_k_free(ex, all);
  if (st == ZPP_OK && h->hierarchical)
    h->secondary_generation = a->generation;
  return st;
}

/* Node-local gather of the secondary shards; every world rank's shard is
 * held by exactly one rank of each node (its local rank's CROSS group). */
static zpp_status_t hpz_backward(hpz_arg_t *a) {
  zpp_hpz_t h = a->h;
  const zpp_exec_t *ex = &a->ex;
  const zpp_topo_t *topo = zpp_transport_topo(ex->t);
  int s = zpp_transport_group_size(ex->t, ZPP_GROUP_NODE);
  int m = h->nnodes, l, node;
  size_t ds = zpp_dtype_size(h->dtype), per = (size_t)m * h->unit;
  uint8_t *all;
  zpp_status_t st;
  if (h->count == 0)
    return ZPP_OK;
  ZPP_CHECK(zpp_k_alloc(ex, (size_t)s * per, (void **)&all));
  st = zpp_transport_allgather(ex->t, ZPP_GROUP_NODE, h->secondary, per, all,
                               ex->mem, ex->stream);
  for (l = 0; st == ZPP_OK && l < s; l++) {
    for (node = 0; st == ZPP_OK && node < m; node++) {
      int w = topo->node_ranks[topo->node_off[node] + l];
      const uint8_t *unit = all + (size_t)l * per + (size_t)node * h->unit;
      uint8_t *out = (uint8_t *)a->recv + (size_t)w * h->count * ds;
      st = h->cfg.quantized
               ? zpp_k_decode(ex, &h->cfg.quant, unit, h->count, h->dtype, out)
               : zpp_k_copy(ex, out, unit, h->unit);
    }
  }
  zpp_k_free(ex, all);
  return st;
}

/* What a gather does, decided when it is started (so a queued forward
 * gather counts), identically on every rank that made the same calls. */
enum { HPZ_FORWARD = 0, HPZ_BACKWARD_NODE = 1, HPZ_REFRESH = 2 };

static zpp_status_t hpz_run(void *p) {
  hpz_arg_t *a = (hpz_arg_t *)p;
  if (a->backward == HPZ_BACKWARD_NODE)
    return hpz_backward(a);
  if (a->backward == HPZ_REFRESH)
    ZPP_INFO(ZPP_SUBSYS_COLL,
             "hpZ backward gather: %s; running a world gather",
             a->h->hierarchical ? "secondary copy stale, refreshing"
                                : "uneven nodes");
  return hpz_forward(a);
}

static zpp_status_t hpz_start(const char *func, zpp_hpz_t hpz,
                              const void *sendbuf, void *recvbuf,
                              zpp_stream_t stream, zpp_request_t *req,
                              int backward) {
  hpz_arg_t a;
  uint64_t w[4];
  uint64_t planned = 0;
  int plan = HPZ_FORWARD;
  zpp_status_t st = ZPP_OK;
  if (hpz == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "hpz is NULL");
  ZPP_CHECK(zpp_exec_init(func, hpz->comm, stream, &a.ex));
  if (hpz->count > 0 && recvbuf == NULL)
    st = zpp_error(ZPP_ERR_NULL_POINTER, func, "recvbuf is NULL (count %zu)",
                   hpz->count);
  else if (!backward && hpz->count > 0 && sendbuf == NULL)
    st = zpp_error(ZPP_ERR_NULL_POINTER, func, "sendbuf is NULL (count %zu)",
                   hpz->count);
  else if (backward) {
    if (hpz->hierarchical && hpz->planned_generation == hpz->generation)
      plan = HPZ_BACKWARD_NODE;
    else if (sendbuf != NULL || hpz->count == 0)
      plan = HPZ_REFRESH;
    else if (!hpz->hierarchical)
      st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "sendbuf is NULL: with uneven nodes hpZ keeps no "
                     "secondary copy, so the backward gather needs the "
                     "primary shard");
    else
      st = zpp_error(ZPP_ERR_STALE, func,
                     "the secondary copy is from generation %llu but the "
                     "parameters are at generation %llu (invalidated, or no "
                     "forward gather yet); pass sendbuf to refresh it",
                     (unsigned long long)hpz->planned_generation,
                     (unsigned long long)hpz->generation);
  }
  quant_words(&hpz->cfg.quant, w);
  w[3] = (uint64_t)hpz->cfg.quantized;
  /* the plan travels as the op: ranks that invalidated differently differ */
  ZPP_CHECK(zpp_comm_fail(hpz->comm,
                          zpp_coll_check_args(func, &a.ex, hpz->count,
                                              (int)hpz->dtype, plan, w, 4,
                                              st)));
  a.h = hpz;
  a.send = sendbuf;
  a.recv = recvbuf;
  a.generation = hpz->generation;
  a.backward = plan;
  planned = hpz->planned_generation;
  if (plan != HPZ_BACKWARD_NODE && hpz->hierarchical)
    hpz->planned_generation = hpz->generation;
  st = zpp_coll_submit_copy(func, hpz->comm, hpz_run, &a, sizeof a, stream, req);
  if (st != ZPP_OK) /* the secondary copy was not refreshed */
    hpz->planned_generation = planned;
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
