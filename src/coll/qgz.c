/*
 * qgZ: hierarchical quantized reduce-scatter of gradients, written as
 * plans of transfer descriptors and kernel steps (src/engine/exec.h).
 *
 * World of M nodes of S ranks (uniform layout).  Rank (node n, local l)
 * owns slice w(n, l) of the result, where w(m, j) is the world rank with
 * local rank j on node m: the standard reduce-scatter layout, whatever the
 * rank-to-node map.
 *   stage 1: for each other local rank j, encode (intra_bits) the M
 *            slices w(0, j) .. w(M-1, j) into one contiguous message;
 *            all-to-all in the NODE group; acc[m] = my own slice w(m, l)
 *            from sendbuf in fp32, then the decoded messages added in
 *            local-rank order: the sum over my node of slice w(m, l).
 *   stage 2: encode (inter_bits) each acc[m] of another node; all-to-all
 *            in the CROSS group (acc[m] goes to node m); decode-accumulate
 *            them in node order into acc[n] of my own node (fp32): my
 *            slice.
 *   finish:  divide by the world size for MEAN, round once to dtype.
 * What a rank would send to itself (its own slices, its own node's
 * partial sum) skips the quantizer: less work, one error term less per
 * stage; its block of each all-to-all is empty (its part of the message
 * buffers is never written, sent or read), and its residual segments are
 * neither read nor written (integer sums: its own slices' hold the error
 * of their rounding to a unit).
 * Uneven nodes: one flat all-to-all over the world (stage 1 only, over
 * all ranks).  intra_bits ZPP_QGZ_INTRA_RAW: stage 1 sends the slices in
 * the dtype and sums them in fp32 (no codes, no error, no stage-1
 * residual); the flat stage of uneven nodes, which crosses the network,
 * then quantizes in inter_bits, and one node quantizes nothing.  Bytes and
 * the error bound: docs/collectives.md, "qgZ".
 * This file is the plan: the config, the layout, the chunks, the buffers
 * and the steps in their order.  The steps sum in fp32 (qgz_float.c) or,
 * with ZPP_QGZ_SUM_INT, in the compressed domain (qgz_int.c); what the
 * three share is in qgz_internal.h.
 */
#include "coll/qgz_internal.h"
#include "comm/comm.h"
#include "core/core.h"
#include "engine/plan.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

/* Stage 1 of a config with intra_bits ZPP_QGZ_INTRA_RAW is not quantized
 * on two levels and on one node; the flat stage of uneven nodes crosses the
 * network and quantizes in inter_bits. */
static int qgz_raw1(const zpp_transport_t *t, int intra_bits) {
  return intra_bits == ZPP_QGZ_INTRA_RAW &&
         (qgz_two_level(t) || zpp_transport_topo(t)->nnodes <= 1);
}

/* Residual segments: one per stage-1 slice (W, none when stage 1 is raw),
 * then one per stage-2 partial sum (M, two levels); those of the rank's
 * own share (not quantized) stay unused, but for the own slices' with
 * integer sums (their rounding to a unit). */
static size_t qgz_levels(const zpp_transport_t *t, int intra_bits) {
  return (qgz_raw1(t, intra_bits) ? 0 : (size_t)zpp_transport_size(t)) +
         (qgz_two_level(t) ? (size_t)zpp_transport_topo(t)->nnodes : 0);
}

/* The INT8 residual format: symmetric, nearest, the qgZ block. */
static zpp_quant_config_t residual_q8(size_t block) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  q.bits = 8;
  q.block_size = block;
  return q;
}

/* sizeof(zpp_qgz_config_t) of revision 2: the fields up to residual_bits
 * (residual_beta now sits in what was its tail padding). */
#define QGZ_CONFIG_V2_SIZE                                                     \
  ((offsetof(zpp_qgz_config_t, residual_bits) + sizeof(int) +                \
    sizeof(uint64_t) - 1) / sizeof(uint64_t) * sizeof(uint64_t))

/* sizeof(zpp_qgz_config_t) of revision 3: the fields up to step. */
#define QGZ_CONFIG_V3_SIZE (offsetof(zpp_qgz_config_t, step) + sizeof(uint64_t))

/* Reads a config of any accepted size (revision 1: fields up to `mode`;
 * 2: up to residual_bits; 3: up to step; 4: up to sum, include/zpp/
 * zpp_coll.h), field by field: an older struct's
 * padding is not read as a newer field. */
static void qgz_config_get(const zpp_qgz_config_t *in, zpp_qgz_config_t *out) {
  zpp_qgz_config_t d = ZPP_QGZ_CONFIG_INIT;
  if (in->struct_size >= sizeof(zpp_qgz_config_t)) {
    d = *in;
  } else if (in->struct_size >= QGZ_CONFIG_V3_SIZE) {
    memcpy(&d, in, QGZ_CONFIG_V3_SIZE);
    d.sum = ZPP_QGZ_SUM_DEFAULT;
  } else {
    d.intra_bits = in->intra_bits;
    d.inter_bits = in->inter_bits;
    d.block_size = in->block_size;
    d.mode = in->mode;
    if (in->struct_size >= QGZ_CONFIG_V2_SIZE) {
      d.hadamard = in->hadamard;
      d.rounding = in->rounding;
      d.seed = in->seed;
      d.residual_bits = in->residual_bits;
    }
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
  n = qgz_levels(zpp_comm_transport(comm), c.intra_bits);
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

/* Chunks of a call (zpp_plan_chunk).  qwZ takes 32; here 16 were within
 * the spread of an alternated run on the real 2x4 link at 1.6 Gbit/s, 16
 * MiB per rank (docs/benchmarks.md, section 9, "qwZ's chunks"). */
#define QGZ_PARTS 8

/* The steps of a chunk, by how the stages sum: in fp32 (qgz_float.c) or
 * in the compressed domain (qgz_int.c). */
static zpp_status_t stage1_encode(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  return p->a.isum ? zpp_qgz_int_encode(p, k) : zpp_qgz_float_encode(p, k);
}

static zpp_status_t stage1_reduce_x(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  return p->a.isum ? zpp_qgz_int_reduce_x(p, k) : zpp_qgz_float_reduce_x(p, k);
}

static zpp_status_t stage2_keep(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  return p->a.isum ? zpp_qgz_int_keep(p, k) : zpp_qgz_float_keep(p, k);
}

static void qgz_release(void *ctx) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const zpp_exec_t *ex = &p->a.ex;
  int i;
  for (i = 0; i < QGZ_DEPTH; i++) {
    zpp_k_free(ex, p->slot[i].s1);
    zpp_k_free(ex, p->slot[i].r1);
    zpp_k_free(ex, p->slot[i].accx);
    zpp_k_free(ex, p->slot[i].s2);
    zpp_k_free(ex, p->slot[i].r2);
    zpp_k_free(ex, p->slot[i].acco);
  }
  zpp_k_free(ex, p->tmp);
  zpp_k_free(ex, p->tmp2);
  zpp_k_free(ex, p->tmp3);
  zpp_k_free(ex, p->rs);
  free((void *)p->srcs);
  free((void *)p->fsrcs);
  zpp_k_free(ex, p->amax_mine);
  if (p->uexp != p->uexp_mine) /* else the same buffer (s1 == 1) */
    zpp_k_free(ex, p->uexp);
  zpp_k_free(ex, p->uexp_mine);
  zpp_k_free(ex, p->uexp_all);
  free(p->iabs);
  free(p->ienc);
  free(p->isr);
  free(p->ireq);
  free((void *)p->isrcs);
  free(p->eruns);
  free(p->sruns);
  free(p->hruns);
  free((void *)p->bsrcs);
  free(p->lay_mem);
  free(p);
}

/* An all-to-all in g with the blocks bytes/displs (send and recv alike). */
static zpp_xfer_desc_t a2a(zpp_group_t g, const uint8_t *send, uint8_t *recv,
                           const size_t *bytes, const size_t *displs) {
  zpp_xfer_desc_t x;
  memset(&x, 0, sizeof x);
  x.kind = ZPP_XFER_ALLTOALLV;
  x.group = g;
  x.send = send;
  x.recv = recv;
  x.send_bytes = x.recv_bytes = bytes;
  x.send_displs = x.recv_displs = displs;
  return x;
}

/* n blocks of b bytes back to back, but the block to member me: empty. */
static void a2a_layout(size_t *bytes, size_t *displs, int n, int me,
                       size_t b) {
  int i;
  for (i = 0; i < n; i++) {
    bytes[i] = i == me ? 0 : b;
    displs[i] = (size_t)i * b;
  }
}

/* The buffers of the plan (scratch as the config needs it). */
static zpp_status_t qgz_alloc(const char *func, qgz_ctx_t *p) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t e1 = qgz_s1_bytes(p, p->chunk), s1 = (size_t)p->s1;
  size_t e2 = zpp_coll_encoded_size(&a->q2, p->chunk), m1 = (size_t)p->m1;
  size_t nslots = p->nchunks < QGZ_DEPTH ? p->nchunks : QGZ_DEPTH, i;
  zpp_status_t st = ZPP_OK;
  for (i = 0; i < nslots && st == ZPP_OK; i++) {
    st = zpp_k_alloc(ex, s1 * m1 * e1, (void **)&p->slot[i].s1);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, s1 * m1 * e1, (void **)&p->slot[i].r1);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->slot[i].acco);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, (m1 - 1) * p->chunk * sizeof(float),
                       (void **)&p->slot[i].accx);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, m1 * e2, (void **)&p->slot[i].s2);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, m1 * e2, (void **)&p->slot[i].r2);
  }
  if (st == ZPP_OK && p->nchunks > 0) { /* the all-to-alls' layouts */
    size_t nl = 4 * (s1 + m1), last = qgz_chunk_len(p, p->nchunks - 1), t;
    p->lay_mem = (size_t *)malloc(nl * sizeof *p->lay_mem);
    if (p->lay_mem == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ all-to-all layouts");
    for (t = 0; t < 2 && st == ZPP_OK; t++) {
      size_t len = t == 0 ? p->chunk : last;
      p->lay1[t].bytes = p->lay_mem + t * 2 * s1;
      p->lay1[t].displs = p->lay1[t].bytes + s1;
      p->lay2[t].bytes = p->lay_mem + 4 * s1 + t * 2 * m1;
      p->lay2[t].displs = p->lay2[t].bytes + m1;
      a2a_layout(p->lay1[t].bytes, p->lay1[t].displs, p->s1, p->me1,
                 m1 * qgz_s1_bytes(p, len));
      a2a_layout(p->lay2[t].bytes, p->lay2[t].displs, p->m1, p->mo,
                 zpp_coll_encoded_size(&a->q2, len));
    }
  }
  if (st == ZPP_OK && p->s1 > 1 && qgz_sum_in_one_call(p)) { /* qgz_s1_srcs */
    p->srcs = (const void **)calloc(s1 - 1, sizeof *p->srcs);
    if (p->srcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ message table");
  }
  if (st == ZPP_OK && a->isum && p->nchunks > 0)
    st = zpp_qgz_int_alloc(func, p);
  if (st == ZPP_OK && p->idev && p->nchunks > 0) /* the tables, no scratch */
    return st;
  if (st == ZPP_OK && p->batch) { /* the tables; no per-slice scratch */
    size_t ne = (s1 - 1) * m1 > m1 ? (s1 - 1) * m1 : m1;
    p->eruns = (zpp_qb_enc_run_t *)calloc(ne, sizeof *p->eruns);
    p->sruns = (zpp_qb_sum_run_t *)calloc(m1, sizeof *p->sruns);
    p->hruns = (zpp_tf_run_t *)calloc(m1, sizeof *p->hruns);
    p->bsrcs = (const void **)calloc(s1 * m1, sizeof *p->bsrcs);
    if (p->eruns == NULL || p->sruns == NULL || p->hruns == NULL ||
        p->bsrcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ batch tables");
    if (st == ZPP_OK && a->residual != NULL && a->residual_bits == 8)
      p->res_seg = zpp_coll_encoded_size(&a->qr, a->count);
    return st;
  }
  if (st == ZPP_OK && (a->residual != NULL || a->hadamard) && p->nchunks > 0)
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp);
  if (st == ZPP_OK && a->residual != NULL && a->residual_bits == 8 &&
      p->nchunks > 0) {
    p->res_seg = zpp_coll_encoded_size(&a->qr, a->count);
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp2);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, zpp_coll_encoded_size(&a->qr, p->chunk),
                       (void **)&p->rs);
  }
  if (st == ZPP_OK && a->residual != NULL && a->beta != 0.0f &&
      p->nchunks > 0)
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp3);
  return st;
}

/* The plan.  Per chunk k in slot k % QGZ_DEPTH:
 *   E_k   stage 1 encode                 (after K_{k-3})
 *   N_k   all-to-all in g1               (after E_k)
 *   X_k   two levels: stage 1 reduce of the partial sums other nodes
 *         keep; stage 2 encode           (after N_k, C_{k-3}: the latter
 *                                         also follows from E_k, kept to
 *                                         name the s2 hazard)
 *   C_k   two levels: all-to-all in CROSS (after X_k)
 *   K_k   stage 1 reduce of the partial sum this node keeps; two levels:
 *         stage 2 reduce; the finish     (one level: after N_k; two:
 *                                         after C_k, so after N_k too)
 * appended in the order X_{k-1} C_{k-1} E_k N_k K_{k-1}, so transfers
 * start in the order N0 C0 N1 C1 N2 ..., the same on every rank.  Kernel
 * steps run in index order as soon as they are ready: a chunk's partial
 * sums for the other nodes go on the wire before its own node's is summed,
 * and the next chunk's encode comes before that sum too, so the engine
 * sums and finishes one chunk while the next ones cross the network.  Each
 * partial sum is made as in one step, in the same order: the bits do not
 * depend on the split. */
static zpp_status_t qgz_plan(const char *func, qgz_ctx_t *p,
                             zpp_request_t *req) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  zpp_comm_t comm = ex->comm; /* p (and ex) are freed on failure */
  zpp_plan_t *plan;
  zpp_status_t st;
  size_t k, n;
  int i, kfree[QGZ_DEPTH], cprev[QGZ_DEPTH], nstep[QGZ_DEPTH];
  p->topo = zpp_transport_topo(ex->t);
  p->two = qgz_two_level(ex->t);
  p->g1 = p->two ? ZPP_GROUP_NODE : ZPP_GROUP_WORLD;
  p->s1 = zpp_transport_group_size(ex->t, p->g1);
  p->m1 = p->two ? p->topo->nnodes : 1;
  p->raw1 = qgz_raw1(ex->t, a->q1.bits);
  if (a->q1.bits == ZPP_QGZ_INTRA_RAW && !p->raw1)
    p->a.q1.bits = a->q2.bits; /* uneven nodes: the flat stage crosses */
  /* the rotation only serves quantization: none on one rank */
  p->rot1 = a->hadamard && !p->raw1 && zpp_transport_size(ex->t) > 1;
  p->rot2 = a->hadamard && p->raw1 && p->two;
  p->seg2 = p->raw1 ? 0 : (size_t)zpp_transport_size(ex->t);
  p->me1 = zpp_transport_group_rank(ex->t, p->g1);
  p->mo = p->two ? zpp_transport_group_rank(ex->t, ZPP_GROUP_CROSS) : 0;
  p->chunk = a->count;
  if (ex->mem == ZPP_MEMORY_HOST && zpp_transport_size(ex->t) > 1 &&
      a->count > 0)
    p->chunk = zpp_plan_chunk(a->count, a->q1.block_size, QGZ_PARTS);
  p->nchunks = n = a->count == 0 ? 0 : (a->count + p->chunk - 1) / p->chunk;
  p->batch =
      ex->mem != ZPP_MEMORY_HOST &&
      zpp_k_encode_batch_ok(ex, a->q1.block_size, p->rot1 ? a->hadamard : 0);
  p->idev = a->isum && ex->mem != ZPP_MEMORY_HOST;
  st = qgz_alloc(func, p);
  if (st != ZPP_OK) {
    qgz_release(p);
    return zpp_comm_fail(comm, st);
  }
  ZPP_CHECK(zpp_comm_fail(comm,
                          zpp_plan_create(func, ex, p, qgz_release, &plan)));
  ZPP_TRACE(ZPP_SUBSYS_COLL, "qgZ: %s, %zu chunk(s) of %zu elements",
            p->two ? "two levels" : "one level", n, p->chunk);
  for (i = 0; i < QGZ_DEPTH; i++)
    kfree[i] = cprev[i] = nstep[i] = ZPP_NO_STEP;
  if (a->isum && n > 0) { /* the scale agreement, before every encode */
    int s =
        zpp_plan_kernel(plan, zpp_qgz_int_absmax, 0, ZPP_NO_STEP, ZPP_NO_STEP);
    /* an all-gather of the exponent bytes, (s1 - 1) W nb sent per rank;
     * a max all-reduce would send about 2 (s1 - 1) / s1 W nb, but the
     * transports reduce only SUM/MEAN of floating-point dtypes
     * (docs/collectives.md, "Compressed-domain sums") */
    if (p->s1 > 1) {
      zpp_xfer_desc_t x;
      memset(&x, 0, sizeof x);
      x.kind = ZPP_XFER_ALLGATHER;
      x.group = p->g1;
      x.send = p->uexp_mine;
      x.recv = p->uexp_all;
      x.bytes = (size_t)zpp_transport_size(ex->t) * p->nb;
      s = zpp_plan_xfer(plan, &x, s, ZPP_NO_STEP);
      s = zpp_plan_kernel(plan, zpp_qgz_int_agree, 0, s, ZPP_NO_STEP);
    }
    for (i = 0; i < QGZ_DEPTH; i++)
      kfree[i] = s;
  }
  for (k = 0; n > 0 && k <= n; k++) {
    size_t j = k - 1; /* the previous chunk (unused at k = 0) */
    int c = ZPP_NO_STEP;
    if (k >= 1 && p->two) {
      int sl = (int)(j % QGZ_DEPTH);
      int t = j + 1 == n;
      zpp_xfer_desc_t x = a2a(ZPP_GROUP_CROSS, p->slot[sl].s2, p->slot[sl].r2,
                              p->lay2[t].bytes, p->lay2[t].displs);
      int r = zpp_plan_kernel(plan, stage1_reduce_x, j, nstep[sl], cprev[sl]);
      c = cprev[sl] = zpp_plan_xfer(plan, &x, r, ZPP_NO_STEP); /* C_j */
    }
    if (k < n) {
      int sl = (int)(k % QGZ_DEPTH);
      int t = k + 1 == n;
      zpp_xfer_desc_t x = a2a(p->g1, p->slot[sl].s1, p->slot[sl].r1,
                              p->lay1[t].bytes, p->lay1[t].displs);
      int e = zpp_plan_kernel(plan, stage1_encode, k, kfree[sl], ZPP_NO_STEP);
      nstep[sl] = zpp_plan_xfer(plan, &x, e, ZPP_NO_STEP); /* N_k */
    }
    if (k >= 1) {
      int sl = (int)(j % QGZ_DEPTH); /* nstep[sl]: N_j (N_k is in another) */
      kfree[sl] = zpp_plan_kernel(plan, stage2_keep, j,
                                  p->two ? c : nstep[sl], ZPP_NO_STEP);
    }
  }
  return zpp_plan_submit(plan, req);
}

/* sizeof(zpp_qgz_config_t) of revision 1: the fields up to `mode`. */
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
  if (c->intra_bits != 4 && c->intra_bits != 8 &&
      c->intra_bits != ZPP_QGZ_INTRA_RAW)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->intra_bits %d: must be 4, 8 or 16 "
                     "(ZPP_QGZ_INTRA_RAW: not quantized inside the node)",
                     c->intra_bits);
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
  if (c->sum != ZPP_QGZ_SUM_DEFAULT && c->sum != ZPP_QGZ_SUM_FLOAT &&
      c->sum != ZPP_QGZ_SUM_INT)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->sum %d: must be ZPP_QGZ_SUM_DEFAULT, "
                     "ZPP_QGZ_SUM_FLOAT or ZPP_QGZ_SUM_INT",
                     c->sum);
  if (c->sum == ZPP_QGZ_SUM_INT && c->mode != ZPP_QUANT_SYMMETRIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->sum ZPP_QGZ_SUM_INT: needs cfg->mode "
                     "ZPP_QUANT_SYMMETRIC (integer sums share a scale, "
                     "not a zero point)");
  if (c->sum == ZPP_QGZ_SUM_INT && c->intra_bits == ZPP_QGZ_INTRA_RAW)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->sum ZPP_QGZ_SUM_INT: needs cfg->intra_bits 4 or "
                     "8 (ZPP_QGZ_INTRA_RAW has no codes to sum)");
  if (c->sum == ZPP_QGZ_SUM_INT && c->hadamard != 0)
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "cfg->sum ZPP_QGZ_SUM_INT with cfg->hadamard %zu: the "
                     "rotation is not implemented for integer sums",
                     c->hadamard);
  if (!(c->residual_beta >= 0.0f && c->residual_beta < 1.0f))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->residual_beta %g: must be in [0, 1) (0: plain "
                     "error feedback; LoCo: 0.8)",
                     (double)c->residual_beta);
  return ZPP_OK;
}

/* The ranks of stage 1, which sum together: the node on two levels, else
 * the world (one node, or the flat stage of uneven nodes). */
static int isum_stage_size(const zpp_transport_t *t) {
  return zpp_transport_group_size(t, qgz_two_level(t) ? ZPP_GROUP_NODE
                                                      : ZPP_GROUP_WORLD);
}

/* The most ranks per stage whose integer sums fit the kernels' range:
 * codes up to qmax1 times multipliers up to 255 (plus a unit of rounding
 * of the own share), s1 255 (qmax1 + 1) <= ZPP_QM_ISUM_MAX (INT8: 128
 * ranks per stage; INT4: 2056). */
static int isum_max_ranks(int intra_bits) {
  return ZPP_QM_ISUM_MAX /
         (ZPP_QM_UMULT_MAX * (zpp_qm_sym_qmax(intra_bits) + 1));
}

static int isum_fits(const zpp_transport_t *t, int intra_bits) {
  return (uint64_t)isum_stage_size(t) * ZPP_QM_UMULT_MAX *
             (uint64_t)(zpp_qm_sym_qmax(intra_bits) + 1) <=
         ZPP_QM_ISUM_MAX;
}

/* Whether a call of config c (checked) sums in the compressed domain:
 * ZPP_QGZ_SUM_INT, or DEFAULT with the setting ZPP_QGZ_SUM=int and a
 * config that allows it (host or device memory alike).  One rank
 * quantizes nothing either way. */
static int qgz_isum(const zpp_qgz_config_t *c, const zpp_transport_t *t) {
  int want = c->sum == ZPP_QGZ_SUM_INT;
  if (c->sum == ZPP_QGZ_SUM_DEFAULT)
    want = zpp_transport_qgz_sum_int(t) && c->mode == ZPP_QUANT_SYMMETRIC &&
           c->intra_bits != ZPP_QGZ_INTRA_RAW && c->hadamard == 0 &&
           isum_fits(t, c->intra_bits);
  return want && zpp_transport_size(t) > 1;
}

/* The residual is read and written between the encodes that read
 * sendbuf and the finish that writes recvbuf: it may share no byte with
 * either (cfg and the buffers already checked). */
static zpp_status_t check_residual_overlap(const char *func,
                                           const zpp_exec_t *ex,
                                           const zpp_qgz_config_t *cfg,
                                           const void *sendbuf,
                                           const void *recvbuf, size_t count,
                                           zpp_dtype_t dtype,
                                           const void *residual) {
  size_t rb, one = count * zpp_dtype_size(dtype);
  size_t all = one * (size_t)zpp_transport_size(ex->t);
  ZPP_CHECK(zpp_qgz_residual_bytes(ex->comm, cfg, count, &rb));
  ZPP_CHECK(zpp_coll_check_overlap(func, ex, "sendbuf", sendbuf, all,
                                   "residual", residual, rb, 0));
  return zpp_coll_check_overlap(func, ex, "recvbuf", recvbuf, one, "residual",
                                residual, rb, 0);
}

/* What qgZ's own checks read besides the common arguments. */
typedef struct {
  const zpp_qgz_config_t *cfg;
  void *residual;
} qgz_args_t;

/* The prologue's first check: the qgZ config. */
static zpp_status_t qgz_pre(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  (void)ex;
  return check_cfg(a->func, ((const qgz_args_t *)a->ctx)->cfg);
}

/* The prologue's last checks, in qgZ's order: the residual's size fits,
 * then the buffers (as ZPP_BUFS_SCATTER would check them), the residual in
 * device memory and apart from them; then the config words compared under
 * ZPP_CHECK. */
static zpp_status_t qgz_post(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  const zpp_qgz_config_t *cfg = ((const qgz_args_t *)a->ctx)->cfg;
  void *residual = ((const qgz_args_t *)a->ctx)->residual;
  zpp_qgz_config_t cf = ZPP_QGZ_CONFIG_INIT;
  uint32_t bb;
  size_t rc; /* only checked, so an overflowing residual size fails */
  /* its only failure here: the size overflows; named after the call */
  if (zpp_qgz_residual_count(a->comm, a->count, &rc) != ZPP_OK)
    return zpp_error(ZPP_ERR_OVERFLOW, a->func,
                     "count %zu: the residual (zpp_qgz_residual_count "
                     "floats) overflows size_t",
                     a->count);
  ZPP_CHECK(zpp_coll_check_bufs(a->func, ex, ZPP_BUFS_SCATTER, a->send,
                                a->recv, a->count, a->dtype));
  if (a->count > 0)
    ZPP_CHECK(zpp_coll_check_device_buf(a->func, ex, "residual", residual));
  if (residual != NULL)
    ZPP_CHECK(check_residual_overlap(a->func, ex, cfg, a->send, a->recv,
                                     a->count, a->dtype, residual));
  qgz_config_get(cfg, &cf);
  if (cf.sum == ZPP_QGZ_SUM_INT && !isum_fits(ex->t, cf.intra_bits))
    return zpp_error(ZPP_ERR_UNSUPPORTED, a->func,
                     "cfg->sum ZPP_QGZ_SUM_INT with cfg->intra_bits %d: "
                     "%d ranks sum in stage 1 (%s), more than the integer "
                     "sums hold (%d at most)",
                     cf.intra_bits, isum_stage_size(ex->t),
                     qgz_two_level(ex->t) ? "the node" : "the world",
                     isum_max_ranks(cf.intra_bits));
  /* packed so that every field is compared within the 5 words; the sum
   * as resolved (the setting may differ between ranks) */
  a->words[0] = (uint64_t)cf.intra_bits | (uint64_t)cf.inter_bits << 8 |
                (uint64_t)cf.mode << 16 | (uint64_t)cf.rounding << 24 |
                (uint64_t)cf.residual_bits << 32 |
                (uint64_t)qgz_isum(&cf, ex->t) << 40;
  a->words[1] = (uint64_t)cf.block_size;
  /* two fields per word where needed: a mismatch of either changes it */
  a->words[2] = (uint64_t)cf.hadamard ^ (uint64_t)cf.residual_reset << 32;
  a->words[3] = cf.seed ^ (cf.step * 0x9e3779b97f4a7c15ull);
  memcpy(&bb, &cf.residual_beta, sizeof bb);
  a->words[4] = (uint64_t)bb << 32 | (residual != NULL);
  return ZPP_OK;
}

zpp_status_t zpp_qgz_reduce_scatter(zpp_comm_t comm,
                                    const zpp_qgz_config_t *cfg,
                                    const void *sendbuf, void *recvbuf,
                                    size_t count, zpp_dtype_t dtype,
                                    zpp_redop_t op, void *residual,
                                    zpp_stream_t stream, zpp_request_t *req) {
  zpp_coll_args_t a;
  qgz_args_t g;
  zpp_exec_t ex;
  qgz_ctx_t *c;
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  zpp_qgz_config_t cf = ZPP_QGZ_CONFIG_INIT;
  a = zpp_coll_args_init(__func__, comm, stream, sendbuf, recvbuf, count,
                         dtype);
  a.op_word = (int)op;
  a.op = op;
  a.check_op = 1;
  a.layout = ZPP_BUFS_NONE; /* qgz_post, after the residual's size */
  a.pre = qgz_pre;
  a.post = qgz_post;
  g.cfg = cfg;
  g.residual = residual;
  a.ctx = &g;
  a.nwords = 5;
  a.words[4] = residual != NULL;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  qgz_config_get(cfg, &cf);
  c = (qgz_ctx_t *)calloc(1, sizeof *c);
  if (c == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                         "plan context"));
  q.block_size = cf.block_size;
  q.mode = cf.mode;
  q.rounding = cf.rounding;
  q.seed = cf.seed;
  c->a.ex = ex;
  c->a.q1 = q;
  c->a.q1.bits = cf.intra_bits;
  c->a.q2 = q;
  c->a.q2.bits = cf.inter_bits;
  c->a.qr = residual_q8(cf.block_size);
  c->a.hadamard = cf.hadamard;
  c->a.residual_bits = cf.residual_bits;
  c->a.beta = cf.residual_beta;
  c->a.reset = cf.residual_reset > 0 && cf.step > 0 &&
               cf.step % cf.residual_reset == 0;
  c->a.send = sendbuf;
  c->a.recv = recvbuf;
  c->a.count = count;
  c->a.dtype = dtype;
  c->a.op = op;
  c->a.residual = residual;
  c->a.isum = qgz_isum(&cf, ex.t);
  return qgz_plan(__func__, c, req);
}
