/*
 * qgZ: hierarchical quantized reduce-scatter of gradients, written against
 * the transport table and the kernel dispatch (coll_internal.h).
 *
 * World of M nodes of S ranks (uniform layout).  Rank (node n, local l)
 * owns slice w(n, l) of the result, where w(m, j) is the world rank with
 * local rank j on node m: the standard reduce-scatter layout, whatever the
 * rank-to-node map.
 *   stage 1: for each local rank j, encode (intra_bits) the M slices
 *            w(0, j) .. w(M-1, j) into one contiguous message; all-to-all
 *            in the NODE group; decode-accumulate in fp32 in local-rank
 *            order: acc[m] = sum over my node of slice w(m, l).
 *   stage 2: encode (inter_bits) each acc[m]; all-to-all in the CROSS
 *            group (acc[m] goes to node m); decode-accumulate in node
 *            order: the sum over the world of slice w(n, l) = my slice.
 *   finish:  divide by the world size for MEAN, round once to dtype.
 * Uneven nodes: one flat all-to-all over the world (stage 1 only, over
 * all ranks).  Bytes and the error bound: docs/design.md, "qgZ".
 */
#include "coll_internal.h"
#include "internal.h"
#include "quant_math.h"
#include "topo.h"

#include <stddef.h>

#include <stdlib.h>
#include <string.h>

typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q1, q2; /* stage 1 (intra) and stage 2 (inter) */
  zpp_quant_config_t qr;     /* INT8 residual storage (residual_bits 8) */
  const void *send;
  void *recv;
  size_t count;
  zpp_dtype_t dtype;
  zpp_redop_t op;
  void *residual;
  size_t hadamard;   /* rotation group, 0: off */
  int residual_bits; /* 32 or 8 */
} qgz_arg_t;

static int qgz_two_level(const zpp_transport_t *t) {
  const zpp_topo_t *topo = zpp_transport_topo(t);
  return topo->uniform && topo->nnodes > 1;
}

zpp_status_t zpp_qgz_residual_count(zpp_comm_t comm, size_t count,
                                    size_t *residual_count) {
  zpp_transport_t *t;
  size_t n, m = 0;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (residual_count == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "residual_count is NULL");
  t = zpp_comm_transport(comm);
  n = (size_t)zpp_transport_size(t);
  if (qgz_two_level(t))
    m = (size_t)zpp_transport_topo(t)->nnodes;
  if (count > SIZE_MAX / sizeof(float) / (n + m))
    return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                     "count %zu: residual size overflows size_t", count);
  *residual_count = (n + m) * count;
  return ZPP_OK;
}

static size_t qgz_levels(const zpp_transport_t *t) {
  return (size_t)zpp_transport_size(t) +
         (qgz_two_level(t) ? (size_t)zpp_transport_topo(t)->nnodes : 0);
}

/* The INT8 residual format: symmetric, nearest, the qgZ block. */
static zpp_quant_config_t residual_q8(size_t block) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  q.bits = 8;
  q.block_size = block;
  return q;
}

/* Reads a config of any accepted size (0.1: fields up to `mode`). */
static void qgz_config_get(const zpp_qgz_config_t *in, zpp_qgz_config_t *out) {
  zpp_qgz_config_t d = ZPP_QGZ_CONFIG_INIT;
  if (in->struct_size >= sizeof(zpp_qgz_config_t)) {
    d = *in;
  } else {
    d.intra_bits = in->intra_bits;
    d.inter_bits = in->inter_bits;
    d.block_size = in->block_size;
    d.mode = in->mode;
  }
  d.struct_size = sizeof(zpp_qgz_config_t);
  *out = d;
}

static zpp_status_t check_cfg(const char *func, const zpp_qgz_config_t *c);

zpp_status_t zpp_qgz_residual_bytes(zpp_comm_t comm,
                                    const zpp_qgz_config_t *cfg, size_t count,
                                    size_t *bytes) {
  zpp_qgz_config_t c;
  size_t n, per;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (bytes == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "bytes is NULL");
  ZPP_CHECK(check_cfg(__func__, cfg));
  qgz_config_get(cfg, &c);
  n = qgz_levels(zpp_comm_transport(comm));
  if (c.residual_bits == 8) {
    zpp_quant_config_t q = residual_q8(c.block_size);
    ZPP_CHECK(zpp_quant_encoded_size(&q, count, &per));
  } else {
    if (count > SIZE_MAX / sizeof(float))
      return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                       "count %zu: residual size overflows size_t", count);
    per = count * sizeof(float);
  }
  if (per != 0 && n > SIZE_MAX / per)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                     "count %zu: residual size overflows size_t", count);
  *bytes = n * per;
  return ZPP_OK;
}

/* One all-to-all step of the pipeline (run on the pipe thread, or at
 * once when the collective is not pipelined). */
typedef struct {
  const zpp_exec_t *ex;
  zpp_group_t g;
  const uint8_t *send;
  uint8_t *recv;
  size_t bytes; /* per peer */
} a2a_step_t;

static zpp_status_t a2a_step(void *p) {
  a2a_step_t *s = (a2a_step_t *)p;
  return zpp_transport_alltoall(s->ex->t, s->g, s->send, s->bytes, s->recv,
                                s->ex->mem, s->ex->stream);
}

static zpp_status_t post(zpp_pipe_t *pipe, a2a_step_t *s, int *ticket) {
  if (pipe == NULL) /* not pipelined: posting order is running order */
    return a2a_step(s);
  *ticket = zpp_pipe_post(pipe, a2a_step, s);
  return ZPP_OK;
}

static zpp_status_t wait_step(zpp_pipe_t *pipe, int ticket) {
  return pipe != NULL ? zpp_pipe_wait(pipe, ticket) : ZPP_OK;
}

#define QGZ_DEPTH 3 /* chunk slots in flight */

/* The plan of one call: stage 1 sends, to each member j of group g1, the
 * chunk of slices slice(j, 0..m1-1); stage 2 (two levels only) sends
 * partial sum m to CROSS member m. */
typedef struct {
  const qgz_arg_t *a;
  const zpp_topo_t *topo;
  zpp_group_t g1;
  int s1, m1, two;
  size_t chunk, nchunks;
  float *tmp;  /* one slice chunk: rotated and/or gradient + residual */
  float *tmp2; /* INT8 residual: the chunk's residual, then its new error */
  uint8_t *rs; /* INT8 residual: the chunk's encoded residual */
  size_t res_seg; /* INT8 residual: bytes of one segment (E8(count)) */
  struct {
    uint8_t *s1, *r1, *s2, *r2;
    float *acc; /* m1 partial sums of the chunk */
    a2a_step_t n, c;
    int tn, tc;
  } slot[QGZ_DEPTH];
  float *acc2;
} plan_t;

static int slice_of(const plan_t *p, int j, int m) {
  if (!p->two)
    return zpp_transport_group_member(p->a->ex.t, p->g1, j);
  return p->topo->node_ranks[p->topo->node_off[m] + j];
}

static size_t chunk_len(const plan_t *p, size_t k) {
  size_t off = k * p->chunk;
  return p->a->count - off < p->chunk ? p->a->count - off : p->chunk;
}

/* Stochastic rounding: the config of one encode, with a seed of its own
 * for each (stage, rank, slice or partial sum), so no two encodes of a
 * call share random bits; elements draw at their index in the slice. */
static zpp_quant_config_t stream_q(const zpp_quant_config_t *q, int stage,
                                   int rank, int slice) {
  zpp_quant_config_t r = *q;
  if (r.rounding == ZPP_ROUND_STOCHASTIC) {
    zpp_qm_keys_t k = zpp_qm_rng_keys(q->seed ^ ((uint64_t)stage << 62));
    r.seed = ((uint64_t)k.k1 << 32 | k.k0) ^
             ((uint64_t)(uint32_t)rank << 32 | (uint32_t)slice);
  }
  return r;
}

/* Error feedback around one encode of `len` elements at `off` of slice
 * (or partial sum) `seg`: x (fp32, may be p->tmp) += residual, encode x
 * into out, store the new error.  fp32 residual: seg * count + off floats
 * in; INT8: segment seg (E8(count) bytes, the format of docs/format.md),
 * the chunk's blocks gathered into p->rs and decoded, then re-encoded and
 * scattered back (chunks are whole blocks, so they own whole blocks). */
static zpp_status_t encode_ef(plan_t *p, const zpp_quant_config_t *q,
                              size_t seg, size_t off, size_t len,
                              zpp_dtype_t dt, const void *x, uint8_t *out) {
  const qgz_arg_t *a = p->a;
  const zpp_exec_t *ex = &a->ex;
  if (a->residual == NULL)
    return zpp_k_encode_at(ex, q, dt, x, len, off, out);
  if (a->residual_bits == 32) {
    float *res = (float *)a->residual + seg * a->count + off;
    ZPP_CHECK(zpp_k_add_residual(ex, dt, x, res, len, p->tmp));
    ZPP_CHECK(zpp_k_encode_at(ex, q, ZPP_FLOAT32, p->tmp, len, off, out));
    return zpp_k_update_residual(ex, q, p->tmp, out, len, res);
  }
  {
    size_t bs = a->qr.block_size, nbt = (a->count + bs - 1) / bs;
    size_t b0 = off / bs, nb = (len + bs - 1) / bs;
    uint8_t *segp = (uint8_t *)a->residual + seg * p->res_seg;
    ZPP_CHECK(zpp_k_copy(ex, p->rs, segp + b0 * 4, nb * 4));
    ZPP_CHECK(zpp_k_copy(ex, p->rs + nb * 4, segp + nbt * 4 + b0 * bs, len));
    ZPP_CHECK(zpp_k_decode(ex, &a->qr, p->rs, len, ZPP_FLOAT32, p->tmp2));
    ZPP_CHECK(zpp_k_add_residual(ex, dt, x, p->tmp2, len, p->tmp));
    ZPP_CHECK(zpp_k_encode_at(ex, q, ZPP_FLOAT32, p->tmp, len, off, out));
    ZPP_CHECK(zpp_k_update_residual(ex, q, p->tmp, out, len, p->tmp2));
    ZPP_CHECK(zpp_k_encode(ex, &a->qr, ZPP_FLOAT32, p->tmp2, len, p->rs));
    ZPP_CHECK(zpp_k_copy(ex, segp + b0 * 4, p->rs, nb * 4));
    return zpp_k_copy(ex, segp + nbt * 4 + b0 * bs, p->rs + nb * 4, len);
  }
}

/* Stage 1 encode of chunk k into its slot, residuals updated. */
static zpp_status_t stage1_encode(plan_t *p, size_t k) {
  const qgz_arg_t *a = p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e1 = zpp_coll_encoded_size(&a->q1, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(ex->t);
  for (j = 0; j < p->s1; j++) {
    for (m = 0; m < p->m1; m++, out += e1) {
      int sl = slice_of(p, j, m);
      size_t at = (size_t)sl * a->count + off;
      const void *g = (const uint8_t *)a->send + at * ds;
      zpp_dtype_t dt = a->dtype;
      zpp_quant_config_t q = stream_q(&a->q1, 1, me, sl);
      if (a->hadamard) { /* groups start at the slice's first element */
        ZPP_CHECK(zpp_k_hadamard(ex, a->hadamard, dt, g, len, p->tmp));
        g = p->tmp;
        dt = ZPP_FLOAT32;
      }
      ZPP_CHECK(encode_ef(p, &q, (size_t)sl, off, len, dt, g, out));
    }
  }
  return ZPP_OK;
}

/* Stage 1 decode-accumulate of chunk k (sources in member order). */
static zpp_status_t stage1_reduce(plan_t *p, size_t k) {
  const qgz_arg_t *a = p->a;
  size_t len = chunk_len(p, k), e1 = zpp_coll_encoded_size(&a->q1, len);
  const uint8_t *in = p->slot[k % QGZ_DEPTH].r1;
  float *acc = p->slot[k % QGZ_DEPTH].acc;
  int j, m;
  ZPP_CHECK(zpp_k_zero(&a->ex, acc, (size_t)p->m1 * len * sizeof(float)));
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1; m++, in += e1)
      ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q1, in, len, acc + (size_t)m * len));
  return ZPP_OK;
}

/* Stage 2 encode of the partial sums of chunk k (stage-2 residual after
 * the W * count stage-1 residual). */
static zpp_status_t stage2_encode(plan_t *p, size_t k) {
  const qgz_arg_t *a = p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  float *acc = p->slot[k % QGZ_DEPTH].acc;
  uint8_t *out = p->slot[k % QGZ_DEPTH].s2;
  size_t w = (size_t)zpp_transport_size(ex->t);
  int m, me = zpp_transport_rank(ex->t);
  for (m = 0; m < p->m1; m++, out += e2) {
    zpp_quant_config_t q = stream_q(&a->q2, 2, me, m);
    /* stage-2 residual segments follow the W stage-1 ones */
    ZPP_CHECK(encode_ef(p, &q, w + (size_t)m, off, len, ZPP_FLOAT32,
                        acc + (size_t)m * len, out));
  }
  return ZPP_OK;
}

static zpp_status_t finish(plan_t *p, size_t k, float *acc) {
  const qgz_arg_t *a = p->a;
  size_t off = k * p->chunk;
  float div = a->op == ZPP_OP_MEAN ? (float)zpp_transport_size(a->ex.t) : 1.0f;
  if (a->hadamard) /* back from the rotated domain, in place */
    ZPP_CHECK(zpp_k_hadamard(&a->ex, a->hadamard, ZPP_FLOAT32, acc,
                             chunk_len(p, k), acc));
  return zpp_k_finish(&a->ex, acc, chunk_len(p, k), div, a->dtype,
                      (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype));
}

/* The schedule.  Iteration k posts stage 1 of chunk k, reduces stage 1 of
 * chunk k - 1 and posts its stage 2, and finishes chunk k - 2, so the
 * transfers of two chunks overlap this thread's work on a third.  Posting
 * order (N0 N1 C0 N2 C1 ...) is the same on every rank. */
static zpp_status_t schedule(plan_t *p, zpp_pipe_t *pipe) {
  const qgz_arg_t *a = p->a;
  size_t k, last = p->nchunks + (p->two ? 2 : 1);
  for (k = 0; k < last; k++) {
    if (k < p->nchunks) {
      size_t len = chunk_len(p, k);
      a2a_step_t *n = &p->slot[k % QGZ_DEPTH].n;
      ZPP_CHECK(stage1_encode(p, k));
      n->ex = &a->ex;
      n->g = p->g1;
      n->send = p->slot[k % QGZ_DEPTH].s1;
      n->recv = p->slot[k % QGZ_DEPTH].r1;
      n->bytes = (size_t)p->m1 * zpp_coll_encoded_size(&a->q1, len);
      ZPP_CHECK(post(pipe, n, &p->slot[k % QGZ_DEPTH].tn));
    }
    if (k >= 1 && k - 1 < p->nchunks) {
      size_t j = k - 1;
      ZPP_CHECK(wait_step(pipe, p->slot[j % QGZ_DEPTH].tn));
      ZPP_CHECK(stage1_reduce(p, j));
      if (!p->two) {
        ZPP_CHECK(finish(p, j, p->slot[j % QGZ_DEPTH].acc));
      } else {
        a2a_step_t *c = &p->slot[j % QGZ_DEPTH].c;
        ZPP_CHECK(stage2_encode(p, j));
        c->ex = &a->ex;
        c->g = ZPP_GROUP_CROSS;
        c->send = p->slot[j % QGZ_DEPTH].s2;
        c->recv = p->slot[j % QGZ_DEPTH].r2;
        c->bytes = zpp_coll_encoded_size(&a->q2, chunk_len(p, j));
        ZPP_CHECK(post(pipe, c, &p->slot[j % QGZ_DEPTH].tc));
      }
    }
    if (p->two && k >= 2) {
      size_t j = k - 2, len = chunk_len(p, j);
      size_t e2 = zpp_coll_encoded_size(&a->q2, len);
      const uint8_t *in = p->slot[j % QGZ_DEPTH].r2;
      int m;
      ZPP_CHECK(wait_step(pipe, p->slot[j % QGZ_DEPTH].tc));
      ZPP_CHECK(zpp_k_zero(&a->ex, p->acc2, len * sizeof(float)));
      for (m = 0; m < p->m1; m++, in += e2) /* node order: deterministic */
        ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q2, in, len, p->acc2));
      ZPP_CHECK(finish(p, j, p->acc2));
    }
  }
  return ZPP_OK;
}

static zpp_status_t qgz_run(void *arg) {
  qgz_arg_t *a = (qgz_arg_t *)arg;
  const zpp_exec_t *ex = &a->ex;
  plan_t p;
  zpp_pipe_t *pipe = NULL;
  zpp_status_t st = ZPP_OK, fin;
  size_t e1, e2;
  int i, nslots;
  if (a->count == 0)
    return ZPP_OK;
  memset(&p, 0, sizeof p);
  p.a = a;
  p.topo = zpp_transport_topo(ex->t);
  p.two = qgz_two_level(ex->t);
  p.g1 = p.two ? ZPP_GROUP_NODE : ZPP_GROUP_WORLD;
  p.s1 = zpp_transport_group_size(ex->t, p.g1);
  p.m1 = p.two ? p.topo->nnodes : 1;
  p.chunk = ex->mem == ZPP_MEMORY_HOST && zpp_transport_size(ex->t) > 1
                ? zpp_pipe_chunk(a->count, a->q1.block_size)
                : a->count;
  p.nchunks = (a->count + p.chunk - 1) / p.chunk;
  nslots = p.nchunks < QGZ_DEPTH ? (int)p.nchunks : QGZ_DEPTH;
  e1 = zpp_coll_encoded_size(&a->q1, p.chunk);
  e2 = zpp_coll_encoded_size(&a->q2, p.chunk);
  for (i = 0; i < nslots; i++) {
    size_t w = (size_t)p.s1 * (size_t)p.m1;
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, w * e1, (void **)&p.slot[i].s1), st, out);
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, w * e1, (void **)&p.slot[i].r1), st, out);
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, (size_t)p.m1 * p.chunk * sizeof(float),
                               (void **)&p.slot[i].acc),
                   st, out);
    if (p.two) {
      ZPP_CHECK_GOTO(zpp_k_alloc(ex, (size_t)p.m1 * e2, (void **)&p.slot[i].s2),
                     st, out);
      ZPP_CHECK_GOTO(zpp_k_alloc(ex, (size_t)p.m1 * e2, (void **)&p.slot[i].r2),
                     st, out);
    }
  }
  if (p.two)
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, p.chunk * sizeof(float), (void **)&p.acc2),
                   st, out);
  if (a->residual != NULL || a->hadamard)
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, p.chunk * sizeof(float), (void **)&p.tmp),
                   st, out);
  if (a->residual != NULL && a->residual_bits == 8) {
    p.res_seg = zpp_coll_encoded_size(&a->qr, a->count);
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, p.chunk * sizeof(float), (void **)&p.tmp2),
                   st, out);
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, zpp_coll_encoded_size(&a->qr, p.chunk),
                               (void **)&p.rs),
                   st, out);
  }
  /* Without a pipe thread the same schedule runs each step when posted. */
  if (p.nchunks > 1 && (zpp_comm_thread_caps(ex->comm) & ZPP_THREADS_PIPE))
    ZPP_CHECK_GOTO(zpp_pipe_start("zpp_qgz_reduce_scatter", &pipe), st, out);
  ZPP_TRACE(ZPP_SUBSYS_COLL, "qgZ: %s, %zu chunk(s) of %zu elements",
            p.two ? "two levels" : "one level", p.nchunks, p.chunk);
  st = schedule(&p, pipe);
out:
  fin = zpp_pipe_finish(pipe); /* runs what was posted, joins */
  if (st == ZPP_OK)
    st = fin;
  for (i = 0; i < QGZ_DEPTH; i++) {
    zpp_k_free(ex, p.slot[i].s1);
    zpp_k_free(ex, p.slot[i].r1);
    zpp_k_free(ex, p.slot[i].acc);
    zpp_k_free(ex, p.slot[i].s2);
    zpp_k_free(ex, p.slot[i].r2);
  }
  zpp_k_free(ex, p.acc2);
  zpp_k_free(ex, p.tmp);
  zpp_k_free(ex, p.tmp2);
  zpp_k_free(ex, p.rs);
  return st;
}

/* sizeof(zpp_qgz_config_t) of zpp 0.1: the fields up to `mode`. */
#define QGZ_CONFIG_V1_SIZE                                                     \
  ((offsetof(zpp_qgz_config_t, mode) + sizeof(zpp_quant_mode_t) +            \
    sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t))

static zpp_status_t check_cfg(const char *func, const zpp_qgz_config_t *in) {
  zpp_qgz_config_t cc;
  const zpp_qgz_config_t *c = &cc;
  if (in == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "cfg is NULL");
  if (in->struct_size < QGZ_CONFIG_V1_SIZE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->struct_size %zu: initialise with "
                     "ZPP_QGZ_CONFIG_INIT",
                     in->struct_size);
  qgz_config_get(in, &cc);
  if (c->intra_bits != 4 && c->intra_bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->intra_bits %d: must be 4 or 8", c->intra_bits);
  if (c->inter_bits != 4 && c->inter_bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->inter_bits %d: must be 4 or 8", c->inter_bits);
  if (c->block_size < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->block_size 0: must be >= 1");
  if (c->mode != ZPP_QUANT_SYMMETRIC && c->mode != ZPP_QUANT_ASYMMETRIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->mode %d: must be ZPP_QUANT_SYMMETRIC or "
                     "ZPP_QUANT_ASYMMETRIC",
                     (int)c->mode);
  if (c->hadamard != 0 &&
      (c->hadamard < 2 || (c->hadamard & (c->hadamard - 1)) != 0 ||
       c->block_size % c->hadamard != 0))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->hadamard %zu: must be 0 (off) or a power of two "
                     ">= 2 that divides block_size %zu",
                     c->hadamard, c->block_size);
  if (c->rounding != ZPP_ROUND_NEAREST && c->rounding != ZPP_ROUND_STOCHASTIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->rounding %d: must be ZPP_ROUND_NEAREST or "
                     "ZPP_ROUND_STOCHASTIC",
                     (int)c->rounding);
  if (c->residual_bits != 32 && c->residual_bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->residual_bits %d: must be 32 (fp32) or 8 (INT8)",
                     c->residual_bits);
  return ZPP_OK;
}

zpp_status_t zpp_qgz_reduce_scatter(zpp_comm_t comm,
                                    const zpp_qgz_config_t *cfg,
                                    const void *sendbuf, void *recvbuf,
                                    size_t count, zpp_dtype_t dtype,
                                    zpp_redop_t op, void *residual,
                                    zpp_stream_t stream, zpp_request_t *req) {
  qgz_arg_t a;
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  zpp_qgz_config_t c = ZPP_QGZ_CONFIG_INIT;
  uint64_t w[5];
  size_t rc; /* only checked, so an overflowing residual size fails */
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &a.ex));
  st = check_cfg(__func__, cfg);
  if (st == ZPP_OK)
    st = zpp_coll_check_dtype(__func__, dtype);
  if (st == ZPP_OK)
    st = zpp_coll_check_op(__func__, op);
  if (st == ZPP_OK)
    st = zpp_qgz_residual_count(comm, count, &rc);
  if (st == ZPP_OK)
    st = zpp_coll_check_bufs(__func__, &a.ex, sendbuf, recvbuf, count, dtype);
  memset(w, 0, sizeof w);
  if (st == ZPP_OK) {
    qgz_config_get(cfg, &c);
    /* packed so that every field is compared within the 5 words */
    w[0] = (uint64_t)c.intra_bits | (uint64_t)c.inter_bits << 8 |
           (uint64_t)c.mode << 16 | (uint64_t)c.rounding << 24 |
           (uint64_t)c.residual_bits << 32;
    w[1] = (uint64_t)c.block_size;
    w[2] = (uint64_t)c.hadamard;
    w[3] = c.seed;
  }
  w[4] = residual != NULL;
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, (int)op, w, 5,
                                                    st)));
  q.block_size = c.block_size;
  q.mode = c.mode;
  q.rounding = c.rounding;
  q.seed = c.seed;
  a.q1 = q;
  a.q1.bits = c.intra_bits;
  a.q2 = q;
  a.q2.bits = c.inter_bits;
  a.qr = residual_q8(c.block_size);
  a.hadamard = c.hadamard;
  a.residual_bits = c.residual_bits;
  a.send = sendbuf;
  a.recv = recvbuf;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.residual = residual;
  return zpp_coll_submit_copy(__func__, comm, qgz_run, &a, sizeof a, stream,
                              req);
}
