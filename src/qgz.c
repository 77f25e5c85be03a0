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
#include "plan.h"
#include "internal.h"
#include "topo.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q1, q2; /* stage 1 (intra) and stage 2 (inter) */
  const void *send;
  void *recv;
  size_t count;
  zpp_dtype_t dtype;
  zpp_redop_t op;
  float *residual;
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

#define QGZ_DEPTH 3 /* chunk slots in flight */

/* The state of one call: stage 1 sends, to each member j of group g1, the
 * chunk of slices slice(j, 0..m1-1); stage 2 (two levels only) sends
 * partial sum m to CROSS member m. */
typedef struct {
  qgz_arg_t a;
  const zpp_topo_t *topo;
  zpp_group_t g1;
  int s1, m1, two;
  size_t chunk, nchunks;
  float *tmp; /* error feedback: one slice chunk of gradient + residual */
  struct {
    uint8_t *s1, *r1, *s2, *r2;
    float *acc;  /* m1 partial sums of the chunk */
    float *acc2; /* the chunk's final sum (two levels) */
  } slot[QGZ_DEPTH];
} qgz_ctx_t;

static int slice_of(const qgz_ctx_t *p, int j, int m) {
  if (!p->two)
    return zpp_transport_group_member(p->a.ex.t, p->g1, j);
  return p->topo->node_ranks[p->topo->node_off[m] + j];
}

static size_t chunk_len(const qgz_ctx_t *p, size_t k) {
  size_t off = k * p->chunk;
  return p->a.count - off < p->chunk ? p->a.count - off : p->chunk;
}

/* Stage 1 encode of chunk k into its slot, residuals updated. */
static zpp_status_t stage1_encode(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e1 = zpp_coll_encoded_size(&a->q1, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m;
  for (j = 0; j < p->s1; j++) {
    for (m = 0; m < p->m1; m++, out += e1) {
      size_t at = (size_t)slice_of(p, j, m) * a->count + off;
      zpp_plan_poll(); /* keep the transfers in flight moving */
      const uint8_t *g = (const uint8_t *)a->send + at * ds;
      if (a->residual == NULL) {
        ZPP_CHECK(zpp_k_encode(ex, &a->q1, a->dtype, g, len, out));
        continue;
      }
      ZPP_CHECK(zpp_k_add_residual(ex, a->dtype, g, a->residual + at, len,
                                   p->tmp));
      ZPP_CHECK(zpp_k_encode(ex, &a->q1, ZPP_FLOAT32, p->tmp, len, out));
      ZPP_CHECK(zpp_k_update_residual(ex, &a->q1, p->tmp, out, len,
                                      a->residual + at));
    }
  }
  return ZPP_OK;
}

static zpp_status_t finish(const qgz_ctx_t *p, size_t k, const float *acc) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk;
  float div = a->op == ZPP_OP_MEAN ? (float)zpp_transport_size(a->ex.t) : 1.0f;
  return zpp_k_finish(&a->ex, acc, chunk_len(p, k), div, a->dtype,
                      (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype));
}

/* Stage 2 encode of the partial sums of chunk k (stage-2 residual after
 * the W * count stage-1 residual). */
static zpp_status_t stage2_encode(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  float *acc = p->slot[k % QGZ_DEPTH].acc;
  uint8_t *out = p->slot[k % QGZ_DEPTH].s2;
  float *res2 = a->residual != NULL
                    ? a->residual + (size_t)zpp_transport_size(ex->t) * a->count
                    : NULL;
  int m;
  for (m = 0; m < p->m1; m++, out += e2) {
    float *part = acc + (size_t)m * len;
    zpp_plan_poll();
    float *res = res2 != NULL ? res2 + (size_t)m * a->count + off : NULL;
    if (res != NULL) /* add last step's stage-2 error, in place */
      ZPP_CHECK(zpp_k_add_residual(ex, ZPP_FLOAT32, part, res, len, part));
    ZPP_CHECK(zpp_k_encode(ex, &a->q2, ZPP_FLOAT32, part, len, out));
    if (res != NULL)
      ZPP_CHECK(zpp_k_update_residual(ex, &a->q2, part, out, len, res));
  }
  return ZPP_OK;
}

/* Stage 1 decode-accumulate of chunk k (sources in member order), then
 * stage 2's encode (two levels) or the finish (one level). */
static zpp_status_t stage1_reduce(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  size_t len = chunk_len(p, k), e1 = zpp_coll_encoded_size(&a->q1, len);
  const uint8_t *in = p->slot[k % QGZ_DEPTH].r1;
  float *acc = p->slot[k % QGZ_DEPTH].acc;
  int j, m;
  ZPP_CHECK(zpp_k_zero(&a->ex, acc, (size_t)p->m1 * len * sizeof(float)));
  for (j = 0; j < p->s1; j++) {
    for (m = 0; m < p->m1; m++, in += e1) {
      zpp_plan_poll();
      ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q1, in, len, acc + (size_t)m * len));
    }
  }
  return p->two ? stage2_encode(p, k) : finish(p, k, acc);
}

/* Stage 2 decode-accumulate of chunk k in node order (deterministic), then
 * the finish. */
static zpp_status_t stage2_reduce(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  size_t len = chunk_len(p, k), e2 = zpp_coll_encoded_size(&a->q2, len);
  const uint8_t *in = p->slot[k % QGZ_DEPTH].r2;
  float *acc2 = p->slot[k % QGZ_DEPTH].acc2;
  int m;
  ZPP_CHECK(zpp_k_zero(&a->ex, acc2, len * sizeof(float)));
  for (m = 0; m < p->m1; m++, in += e2) {
    zpp_plan_poll();
    ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q2, in, len, acc2));
  }
  return finish(p, k, acc2);
}

static void qgz_release(void *ctx) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const zpp_exec_t *ex = &p->a.ex;
  int i;
  for (i = 0; i < QGZ_DEPTH; i++) {
    zpp_k_free(ex, p->slot[i].s1);
    zpp_k_free(ex, p->slot[i].r1);
    zpp_k_free(ex, p->slot[i].acc);
    zpp_k_free(ex, p->slot[i].s2);
    zpp_k_free(ex, p->slot[i].r2);
    zpp_k_free(ex, p->slot[i].acc2);
  }
  zpp_k_free(ex, p->tmp);
  free(p);
}

static zpp_step_xfer_t a2a(zpp_group_t g, const uint8_t *send, uint8_t *recv,
                      size_t bytes) {
  zpp_step_xfer_t x;
  memset(&x, 0, sizeof x);
  x.kind = ZPP_XFER_ALLTOALL;
  x.group = g;
  x.send = send;
  x.recv = recv;
  x.bytes = bytes;
  return x;
}

/* The plan.  Per chunk k in slot k % QGZ_DEPTH:
 *   E_k  stage 1 encode                    (after the slot's last user)
 *   N_k  all-to-all in g1                  (after E_k)
 *   R_k  stage 1 reduce; stage 2 encode    (after N_k)
 *   C_k  all-to-all in CROSS (two levels)  (after R_k)
 *   F_k  stage 2 reduce and finish         (after C_k)
 * Steps are appended in the order N0 N1 C0 N2 C1 ..., which is the order
 * every rank starts its transfers in; the engine works on one chunk while
 * the transfers of the next two are on the wire. */
static zpp_status_t qgz_plan(const char *func, qgz_ctx_t *p,
                             zpp_request_t *req) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  zpp_plan_t *plan;
  zpp_status_t st = ZPP_OK;
  size_t e1, e2, k, last;
  int i, nslots, free_after[QGZ_DEPTH], red[QGZ_DEPTH];
  p->topo = zpp_transport_topo(ex->t);
  p->two = qgz_two_level(ex->t);
  p->g1 = p->two ? ZPP_GROUP_NODE : ZPP_GROUP_WORLD;
  p->s1 = zpp_transport_group_size(ex->t, p->g1);
  p->m1 = p->two ? p->topo->nnodes : 1;
  p->chunk = a->count;
  if (ex->mem == ZPP_MEMORY_HOST && zpp_transport_size(ex->t) > 1 &&
      a->count > 0)
    p->chunk = zpp_plan_chunk(a->count, a->q1.block_size);
  p->nchunks = a->count == 0 ? 0 : (a->count + p->chunk - 1) / p->chunk;
  nslots = p->nchunks < QGZ_DEPTH ? (int)p->nchunks : QGZ_DEPTH;
  e1 = zpp_coll_encoded_size(&a->q1, p->chunk);
  e2 = zpp_coll_encoded_size(&a->q2, p->chunk);
  for (i = 0; i < nslots && st == ZPP_OK; i++) {
    size_t w = (size_t)p->s1 * (size_t)p->m1;
    st = zpp_k_alloc(ex, w * e1, (void **)&p->slot[i].s1);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, w * e1, (void **)&p->slot[i].r1);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, (size_t)p->m1 * p->chunk * sizeof(float),
                       (void **)&p->slot[i].acc);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, (size_t)p->m1 * e2, (void **)&p->slot[i].s2);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, (size_t)p->m1 * e2, (void **)&p->slot[i].r2);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->slot[i].acc2);
  }
  if (st == ZPP_OK && a->residual != NULL && p->nchunks > 0)
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp);
  if (st != ZPP_OK) {
    qgz_release(p);
    return zpp_comm_fail(ex->comm, st);
  }
  ZPP_CHECK(zpp_comm_fail(ex->comm,
                          zpp_plan_create(func, ex, p, qgz_release, &plan)));
  ZPP_TRACE(ZPP_SUBSYS_COLL, "qgZ: %s, %zu chunk(s) of %zu elements",
            p->two ? "two levels" : "one level", p->nchunks, p->chunk);
  for (i = 0; i < QGZ_DEPTH; i++)
    free_after[i] = red[i] = ZPP_NO_STEP;
  last = p->nchunks + (p->two ? 2 : 1);
  for (k = 0; p->nchunks > 0 && k < last; k++) {
    if (k < p->nchunks) {
      int sl = (int)(k % QGZ_DEPTH), e;
      size_t len = chunk_len(p, k);
      zpp_step_xfer_t x = a2a(p->g1, p->slot[sl].s1, p->slot[sl].r1,
                         (size_t)p->m1 * zpp_coll_encoded_size(&a->q1, len));
      e = zpp_plan_kernel(plan, stage1_encode, k, free_after[sl], ZPP_NO_STEP);
      red[sl] = zpp_plan_xfer(plan, &x, e, ZPP_NO_STEP); /* N_k */
    }
    if (k >= 1 && k - 1 < p->nchunks) {
      size_t j = k - 1;
      int sl = (int)(j % QGZ_DEPTH);
      int r = zpp_plan_kernel(plan, stage1_reduce, j, red[sl], ZPP_NO_STEP);
      if (!p->two) {
        free_after[sl] = r;
      } else {
        zpp_step_xfer_t x = a2a(ZPP_GROUP_CROSS, p->slot[sl].s2, p->slot[sl].r2,
                           zpp_coll_encoded_size(&a->q2, chunk_len(p, j)));
        red[sl] = zpp_plan_xfer(plan, &x, r, ZPP_NO_STEP); /* C_j */
      }
    }
    if (p->two && k >= 2) {
      size_t j = k - 2;
      int sl = (int)(j % QGZ_DEPTH);
      free_after[sl] =
          zpp_plan_kernel(plan, stage2_reduce, j, red[sl], ZPP_NO_STEP);
    }
  }
  return zpp_plan_submit(plan, req);
}

static zpp_status_t check_cfg(const char *func, const zpp_qgz_config_t *c) {
  if (c == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "cfg is NULL");
  if (c->struct_size < sizeof(zpp_qgz_config_t))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->struct_size %zu: initialise with "
                     "ZPP_QGZ_CONFIG_INIT",
                     c->struct_size);
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
  return ZPP_OK;
}

zpp_status_t zpp_qgz_reduce_scatter(zpp_comm_t comm,
                                    const zpp_qgz_config_t *cfg,
                                    const void *sendbuf, void *recvbuf,
                                    size_t count, zpp_dtype_t dtype,
                                    zpp_redop_t op, float *residual,
                                    zpp_stream_t stream, zpp_request_t *req) {
  zpp_exec_t ex;
  qgz_ctx_t *c;
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  uint64_t w[5];
  size_t rc; /* only checked, so an overflowing residual size fails */
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &ex));
  st = check_cfg(__func__, cfg);
  if (st == ZPP_OK)
    st = zpp_coll_check_dtype(__func__, dtype);
  if (st == ZPP_OK)
    st = zpp_coll_check_op(__func__, op);
  if (st == ZPP_OK)
    st = zpp_qgz_residual_count(comm, count, &rc);
  if (st == ZPP_OK)
    st = zpp_coll_check_bufs(__func__, &ex, sendbuf, recvbuf, count, dtype);
  if (st == ZPP_OK && count > 0)
    st = zpp_coll_check_device_buf(__func__, &ex, "residual", residual);
  memset(w, 0, sizeof w);
  if (st == ZPP_OK) {
    w[0] = (uint64_t)cfg->intra_bits;
    w[1] = (uint64_t)cfg->inter_bits;
    w[2] = (uint64_t)cfg->block_size;
    w[3] = (uint64_t)cfg->mode;
  }
  w[4] = residual != NULL;
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &ex, count,
                                                    (int)dtype, (int)op, w, 5,
                                                    st)));
  c = (qgz_ctx_t *)calloc(1, sizeof *c);
  if (c == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                         "plan context"));
  q.block_size = cfg->block_size;
  q.mode = cfg->mode;
  c->a.ex = ex;
  c->a.q1 = q;
  c->a.q1.bits = cfg->intra_bits;
  c->a.q2 = q;
  c->a.q2.bits = cfg->inter_bits;
  c->a.send = sendbuf;
  c->a.recv = recvbuf;
  c->a.count = count;
  c->a.dtype = dtype;
  c->a.op = op;
  c->a.residual = residual;
  return qgz_plan(__func__, c, req);
}
