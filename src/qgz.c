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

/* Stage-1 source: the gradient itself, or gradient + residual in fp32. */
typedef struct {
  const void *data;
  zpp_dtype_t dtype;
} src_t;

/* Encodes slice `w` of src into dst, and updates that slice's residual. */
static zpp_status_t encode_slice(const qgz_arg_t *a,
                                 const zpp_quant_config_t *q, src_t src,
                                 int w, float *res, void *dst) {
  size_t off = (size_t)w * a->count;
  const uint8_t *p = (const uint8_t *)src.data + off * zpp_dtype_size(src.dtype);
  ZPP_CHECK(zpp_k_encode(&a->ex, q, src.dtype, p, a->count, dst));
  if (res != NULL)
    ZPP_CHECK(zpp_k_update_residual(&a->ex, q, (const float *)p, dst, a->count,
                                    res + off));
  return ZPP_OK;
}

static zpp_status_t qgz_flat(const qgz_arg_t *a, src_t src, float *acc,
                             uint8_t *sbuf, uint8_t *rbuf) {
  int n = zpp_transport_size(a->ex.t), r;
  size_t e = zpp_coll_encoded_size(&a->q1, a->count);
  for (r = 0; r < n; r++)
    ZPP_CHECK(encode_slice(a, &a->q1, src, r, a->residual, sbuf + (size_t)r * e));
  ZPP_CHECK(zpp_transport_alltoall(a->ex.t, ZPP_GROUP_WORLD, sbuf, e, rbuf,
                                   a->ex.mem, a->ex.stream));
  for (r = 0; r < n; r++)
    ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q1, rbuf + (size_t)r * e, a->count,
                               acc));
  return ZPP_OK;
}

/* Two levels; on return acc[0..count) holds my slice's world sum. */
static zpp_status_t qgz_hier(const qgz_arg_t *a, src_t src, float *acc,
                             uint8_t *sbuf, uint8_t *rbuf) {
  const zpp_exec_t *ex = &a->ex;
  const zpp_topo_t *topo = zpp_transport_topo(ex->t);
  int s = zpp_transport_group_size(ex->t, ZPP_GROUP_NODE);
  int m = topo->nnodes, j, node;
  size_t e1 = zpp_coll_encoded_size(&a->q1, a->count);
  size_t e2 = zpp_coll_encoded_size(&a->q2, a->count);
  size_t per = (size_t)m * e1;
  float *res2 = a->residual != NULL
                    ? a->residual + (size_t)zpp_transport_size(ex->t) * a->count
                    : NULL;

  /* stage 1: message j = slices w(0, j) .. w(M-1, j), each encoded alone */
  for (j = 0; j < s; j++)
    for (node = 0; node < m; node++)
      ZPP_CHECK(encode_slice(a, &a->q1, src,
                             topo->node_ranks[topo->node_off[node] + j],
                             a->residual,
                             sbuf + (size_t)j * per + (size_t)node * e1));
  ZPP_CHECK(zpp_transport_alltoall(ex->t, ZPP_GROUP_NODE, sbuf, per, rbuf,
                                   ex->mem, ex->stream));
  for (j = 0; j < s; j++) /* local-rank order: deterministic */
    for (node = 0; node < m; node++)
      ZPP_CHECK(zpp_k_decode_acc(ex, &a->q1,
                                 rbuf + (size_t)j * per + (size_t)node * e1,
                                 a->count, acc + (size_t)node * a->count));

  /* stage 2: partial sums of each node's slice, across nodes */
  if (res2 != NULL) /* add last step's stage-2 error (in place) */
    ZPP_CHECK(zpp_k_add_residual(ex, ZPP_FLOAT32, acc, res2,
                                 (size_t)m * a->count, acc));
  for (node = 0; node < m; node++) {
    size_t off = (size_t)node * a->count;
    ZPP_CHECK(zpp_k_encode(ex, &a->q2, ZPP_FLOAT32, acc + off, a->count,
                           sbuf + (size_t)node * e2));
    if (res2 != NULL)
      ZPP_CHECK(zpp_k_update_residual(ex, &a->q2, acc + off,
                                      sbuf + (size_t)node * e2, a->count,
                                      res2 + off));
  }
  ZPP_CHECK(zpp_transport_alltoall(ex->t, ZPP_GROUP_CROSS, sbuf, e2, rbuf,
                                   ex->mem, ex->stream));
  ZPP_CHECK(zpp_k_zero(ex, acc, a->count * sizeof(float)));
  for (node = 0; node < m; node++) /* node order: deterministic */
    ZPP_CHECK(zpp_k_decode_acc(ex, &a->q2, rbuf + (size_t)node * e2, a->count,
                               acc));
  return ZPP_OK;
}

static zpp_status_t qgz_run(void *p) {
  qgz_arg_t *a = (qgz_arg_t *)p;
  const zpp_exec_t *ex = &a->ex;
  size_t n = (size_t)zpp_transport_size(ex->t);
  int two = qgz_two_level(ex->t);
  size_t m = two ? (size_t)zpp_transport_topo(ex->t)->nnodes : 1;
  size_t e1 = zpp_coll_encoded_size(&a->q1, a->count);
  size_t e2 = zpp_coll_encoded_size(&a->q2, a->count);
  size_t sbytes = n * e1 > m * e2 ? n * e1 : m * e2;
  void *x = NULL, *acc = NULL, *sbuf = NULL, *rbuf = NULL;
  src_t src = {a->send, a->dtype};
  zpp_status_t st;
  if (a->count == 0)
    return ZPP_OK;
  ZPP_CHECK_GOTO(zpp_k_alloc(ex, sbytes, &sbuf), st, out);
  ZPP_CHECK_GOTO(zpp_k_alloc(ex, sbytes, &rbuf), st, out);
  ZPP_CHECK_GOTO(zpp_k_alloc(ex, m * a->count * sizeof(float), &acc), st, out);
  ZPP_CHECK_GOTO(zpp_k_zero(ex, acc, m * a->count * sizeof(float)), st, out);
  if (a->residual != NULL) { /* error feedback: encode gradient + residual */
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, n * a->count * sizeof(float), &x), st, out);
    ZPP_CHECK_GOTO(zpp_k_add_residual(ex, a->dtype, a->send, a->residual,
                                      n * a->count, (float *)x),
                   st, out);
    src.data = x;
    src.dtype = ZPP_FLOAT32;
  }
  if (two)
    st = qgz_hier(a, src, (float *)acc, (uint8_t *)sbuf, (uint8_t *)rbuf);
  else
    st = qgz_flat(a, src, (float *)acc, (uint8_t *)sbuf, (uint8_t *)rbuf);
  if (st == ZPP_OK)
    st = zpp_k_finish(ex, (const float *)acc, a->count,
                      a->op == ZPP_OP_MEAN ? (float)n : 1.0f, a->dtype,
                      a->recv);
out:
  zpp_k_free(ex, x);
  zpp_k_free(ex, acc);
  zpp_k_free(ex, rbuf);
  zpp_k_free(ex, sbuf);
  return st;
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
  qgz_arg_t a;
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  uint64_t w[5];
  size_t n, ds, rc; /* rc: only checked, so an overflowing size fails */
  void *copy;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &a.ex));
  ZPP_CHECK(zpp_comm_fail(comm, check_cfg(__func__, cfg)));
  if (zpp_dtype_size(dtype) == 0)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                                         "dtype %d: must be ZPP_FLOAT32, "
                                         "ZPP_FLOAT16 or ZPP_BFLOAT16",
                                         (int)dtype));
  if (op != ZPP_OP_SUM && op != ZPP_OP_MEAN)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                                         "op %d: must be ZPP_OP_SUM or "
                                         "ZPP_OP_MEAN",
                                         (int)op));
  n = (size_t)zpp_transport_size(a.ex.t);
  ds = zpp_dtype_size(dtype);
  ZPP_CHECK(zpp_comm_fail(comm, zpp_qgz_residual_count(comm, count, &rc)));
  if (count > SIZE_MAX / n / ds)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OVERFLOW, __func__,
                                         "count %zu: size x count overflows",
                                         count));
  if (count > 0 && sendbuf == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_NULL_POINTER, __func__,
                                         "sendbuf is NULL (count %zu)", count));
  if (count > 0 && recvbuf == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_NULL_POINTER, __func__,
                                         "recvbuf is NULL (count %zu)", count));
  w[0] = (uint64_t)cfg->intra_bits;
  w[1] = (uint64_t)cfg->inter_bits;
  w[2] = (uint64_t)cfg->block_size;
  w[3] = (uint64_t)cfg->mode;
  w[4] = residual != NULL;
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, (int)op, w,
                                                    5)));
  q.block_size = cfg->block_size;
  q.mode = cfg->mode;
  a.q1 = q;
  a.q1.bits = cfg->intra_bits;
  a.q2 = q;
  a.q2.bits = cfg->inter_bits;
  a.send = sendbuf;
  a.recv = recvbuf;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.residual = residual;
  copy = malloc(sizeof a);
  if (copy == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                         "request arguments"));
  memcpy(copy, &a, sizeof a);
  return zpp_coll_submit(__func__, comm, qgz_run, copy, stream, req);
}
