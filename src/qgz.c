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
  float *tmp; /* error feedback: one slice chunk of gradient + residual */
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

/* Stage 1 encode of chunk k into its slot, residuals updated. */
static zpp_status_t stage1_encode(plan_t *p, size_t k) {
  const qgz_arg_t *a = p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e1 = zpp_coll_encoded_size(&a->q1, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m;
  for (j = 0; j < p->s1; j++) {
    for (m = 0; m < p->m1; m++, out += e1) {
      size_t at = (size_t)slice_of(p, j, m) * a->count + off;
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
  float *res2 = a->residual != NULL
                    ? a->residual + (size_t)zpp_transport_size(ex->t) * a->count
                    : NULL;
  int m;
  for (m = 0; m < p->m1; m++, out += e2) {
    float *part = acc + (size_t)m * len;
    float *res = res2 != NULL ? res2 + (size_t)m * a->count + off : NULL;
    if (res != NULL) /* add last step's stage-2 error, in place */
      ZPP_CHECK(zpp_k_add_residual(ex, ZPP_FLOAT32, part, res, len, part));
    ZPP_CHECK(zpp_k_encode(ex, &a->q2, ZPP_FLOAT32, part, len, out));
    if (res != NULL)
      ZPP_CHECK(zpp_k_update_residual(ex, &a->q2, part, out, len, res));
  }
  return ZPP_OK;
}

static zpp_status_t finish(plan_t *p, size_t k, const float *acc) {
  const qgz_arg_t *a = p->a;
  size_t off = k * p->chunk;
  float div = a->op == ZPP_OP_MEAN ? (float)zpp_transport_size(a->ex.t) : 1.0f;
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
  if (a->residual != NULL)
    ZPP_CHECK_GOTO(zpp_k_alloc(ex, p.chunk * sizeof(float), (void **)&p.tmp),
                   st, out);
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
  if (st == ZPP_OK && count > 0)
    st = zpp_coll_check_device_buf(__func__, &a.ex, "residual", residual);
  memset(w, 0, sizeof w);
  if (st == ZPP_OK) {
    w[0] = (uint64_t)cfg->intra_bits;
    w[1] = (uint64_t)cfg->inter_bits;
    w[2] = (uint64_t)cfg->block_size;
    w[3] = (uint64_t)cfg->mode;
  }
  w[4] = residual != NULL;
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, (int)op, w, 5,
                                                    st)));
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
  return zpp_coll_submit_copy(__func__, comm, qgz_run, &a, sizeof a, stream,
                              req);
}
