/*
 * qgZ's compressed-domain sums (ZPP_QGZ_SUM_INT, src/coll/qgz.c has the
 * plan), on host and device memory: the unit agreement before the chunks,
 * then stage 1's codes summed as integers, stage 2's re-quantization from
 * the integer sums and one decode in the finish.  docs/collectives.md,
 * "Compressed-domain sums"; formats and bound: docs/format.md, "Integer
 * sums".
 */
#include "coll/qgz_internal.h"
#include "core/core.h"
#include "engine/plan.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- compressed-domain sums (ZPP_QGZ_SUM_INT, host memory) ---------------
 * Before the chunks: every rank takes the absmax of each block of every
 * slice (data + stage-1 residual) and its unit exponent, the g1 members
 * all-gather the exponents and each takes the max, so all members of a
 * stage quantize a slice's block with steps that are integer multiples of
 * the same power-of-two unit.  Stage 1 then sends codes and one multiplier
 * per block and sums them as integers in units (the rank's own slice
 * rounded to a unit); stage 2 re-quantizes the integer sums into the
 * format of docs/format.md; the finish decodes once.  docs/collectives.md,
 * "Compressed-domain sums". */

/* The kernels' config: width, block, stochastic rounding of stream q
 * (qgz_stream_q) from element `base`. */
static zpp_qcfg_t isum_qcfg(const zpp_quant_config_t *q, uint64_t base) {
  zpp_qcfg_t c;
  memset(&c, 0, sizeof c);
  c.bits = q->bits;
  c.block = q->block_size;
  if (q->rounding == ZPP_ROUND_STOCHASTIC) {
    zpp_qm_keys_t k = zpp_qm_rng_keys(q->seed);
    c.sr = 1;
    c.k0 = k.k0;
    c.k1 = k.k1;
    c.base = base;
  }
  return c;
}

/* The fp32 residual of segment seg for `len` elements at `off`, for the
 * integer-sum kernels: fp32, in place (zeroed first when the call resets);
 * INT8, decoded into buf (p->tmp2, or p->tmp for the own slice's beside
 * stage 2's; zero when the call resets).  *r NULL: no error feedback. */
static zpp_status_t isum_res_load(qgz_ctx_t *p, size_t seg, size_t off,
                                  size_t len, float *buf, float **r) {
  const qgz_arg_t *a = &p->a;
  *r = NULL;
  if (a->residual == NULL)
    return ZPP_OK;
  if (a->residual_bits == 32) {
    *r = (float *)a->residual + seg * a->count + off;
    if (a->reset)
      memset(*r, 0, len * sizeof(float));
    return ZPP_OK;
  }
  *r = buf;
  if (a->reset)
    return zpp_k_zero(&a->ex, buf, len * sizeof(float));
  return qgz_res8_load(p, seg, off, len, buf);
}

/* INT8 residual: buf (the new errors) encoded back into segment seg. */
static zpp_status_t isum_res_store(qgz_ctx_t *p, size_t seg, size_t off,
                                   size_t len, const float *buf) {
  const qgz_arg_t *a = &p->a;
  if (a->residual == NULL || a->residual_bits == 32)
    return ZPP_OK;
  return qgz_res8_store(p, seg, off, len, buf);
}

/* The steps on device memory (after the host ones). */
static zpp_status_t isum_absmax_dev(qgz_ctx_t *p);
static zpp_status_t isum_encode_dev(qgz_ctx_t *p, size_t k);
static zpp_status_t isum_reduce_x_dev(qgz_ctx_t *p, size_t k);
static zpp_status_t isum_keep_dev(qgz_ctx_t *p, size_t k);

/* The absmax of every block of every slice: its data plus its stage-1
 * residual (the own slices' too: their rounding to a unit is fed back),
 * chunk by chunk. */
zpp_status_t zpp_qgz_int_absmax(void *ctx, size_t unused) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  size_t ds = zpp_dtype_size(a->dtype), k;
  zpp_qcfg_t c = isum_qcfg(&a->q1, 0);
  int j, m;
  (void)unused;
  if (p->idev)
    return isum_absmax_dev(p);
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1; m++) {
      size_t sl = (size_t)qgz_slice_of(p, j, m);
      for (k = 0; k < p->nchunks; k++) {
        size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
        float *r = NULL;
        if (!a->reset)
          ZPP_CHECK(isum_res_load(p, sl, off, len, p->tmp2, &r));
        size_t b0 = sl * p->nb + off / c.block, b;
        size_t nb = (len + c.block - 1) / c.block;
        p->iops->absmax(&c, (int)a->dtype,
                        (const uint8_t *)a->send + (sl * a->count + off) * ds,
                        r, len, p->amax_mine + b0);
        for (b = b0; b < b0 + nb; b++)
          p->uexp_mine[b] =
              (int8_t)zpp_qm_unit_exp(p->amax_mine[b], a->q1.bits);
        zpp_plan_poll();
      }
    }
  return ZPP_OK;
}

/* The agreed exponents: the max over the g1 members (s1 > 1; with one
 * member uexp is uexp_mine). */
zpp_status_t zpp_qgz_int_agree(void *ctx, size_t unused) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  size_t n = (size_t)zpp_transport_size(p->a.ex.t) * p->nb, i;
  int j;
  (void)unused;
  if (p->idev) /* on the stream, from the all-gathered bytes */
    return zpp_k_isum_agree(&p->a.ex, p->uexp_all, n, p->s1, p->uexp);
  /* member by member over contiguous bytes (the compiler vectorizes it) */
  memcpy(p->uexp, p->uexp_all, n);
  for (j = 1; j < p->s1; j++) {
    const int8_t *u = p->uexp_all + (size_t)j * n;
    for (i = 0; i < n; i++)
      p->uexp[i] = u[i] > p->uexp[i] ? u[i] : p->uexp[i];
  }
  return ZPP_OK;
}

/* The agreed exponents of chunk k of slice sl, and this rank's absmax. */
static const int8_t *isum_uexp(const qgz_ctx_t *p, int sl, size_t k) {
  return p->uexp + (size_t)sl * p->nb + k * p->chunk / p->a.q1.block_size;
}

static const uint32_t *isum_amax(const qgz_ctx_t *p, int sl, size_t k) {
  return p->amax_mine + (size_t)sl * p->nb + k * p->chunk / p->a.q1.block_size;
}

/* Stage 1 encode of chunk k on the agreed units (codes, multipliers). */
zpp_status_t zpp_qgz_int_encode(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  size_t e1 = qgz_s1_bytes(p, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(a->ex.t);
  if (p->idev)
    return isum_encode_dev(p, k);
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1; m++) {
      int sl = qgz_slice_of(p, j, m);
      zpp_quant_config_t q = qgz_stream_q(&a->q1, 1, me, sl);
      zpp_qcfg_t c = isum_qcfg(&q, off);
      float *r;
      uint8_t *o = out + qgz_s1_at(p, j, m, e1);
      if (j == p->me1)
        continue;
      zpp_plan_poll();
      ZPP_CHECK(isum_res_load(p, (size_t)sl, off, len, p->tmp2, &r));
      p->iops->encode(
          &c, (int)a->dtype,
          (const uint8_t *)a->send + ((size_t)sl * a->count + off) * ds, r,
          a->beta, isum_amax(p, sl, k), isum_uexp(p, sl, k), len, o);
      ZPP_CHECK(isum_res_store(p, (size_t)sl, off, len, p->tmp2));
    }
  return ZPP_OK;
}

/* The other nodes' stage-2 messages of chunk k, in node order, into
 * p->fsrcs; their number (none on one level). */
static size_t isum_s2_srcs(qgz_ctx_t *p, size_t k) {
  size_t e2 = zpp_coll_encoded_size(&p->a.q2, qgz_chunk_len(p, k)), n = 0;
  int m;
  for (m = 0; m < p->m1 && p->two; m++)
    if (m != p->mo)
      p->fsrcs[n++] = p->slot[k % QGZ_DEPTH].r2 + (size_t)m * e2;
  return n;
}

/* Set X of chunk k, integer sums: each partial sum (the own slice, plus
 * its stage-1 residual, in units plus the other members' multiplied codes)
 * re-quantized for stage 2 in the same pass, its int32 sums in a
 * cache-sized tile of accx. */
zpp_status_t zpp_qgz_int_reduce_x(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  int32_t *tmp = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].accx;
  zpp_qcfg_t c1 = isum_qcfg(&a->q1, 0);
  int i, me = zpp_transport_rank(a->ex.t);
  if (p->idev)
    return isum_reduce_x_dev(p, k);
  for (i = 0; i < qgz_half_parts(p, QGZ_HALF_X); i++) {
    int m = qgz_half_part(p, QGZ_HALF_X, i), n = qgz_s1_srcs(p, k, m, p->srcs);
    size_t own = (size_t)qgz_slice_of(p, p->me1, m);
    zpp_quant_config_t q = qgz_stream_q(&a->q2, 2, me, m);
    zpp_qcfg_t c = isum_qcfg(&q, off);
    float *r, *r1;
    zpp_plan_poll();
    ZPP_CHECK(isum_res_load(p, own, off, len, p->tmp, &r1));
    ZPP_CHECK(isum_res_load(p, p->seg2 + (size_t)m, off, len, p->tmp2, &r));
    p->iops->sum_requant(&c1, &c, (int)a->dtype, qgz_own_ptr(p, k, m), r1,
                         isum_uexp(p, (int)own, k),
                         (const uint8_t *const *)p->srcs, n, r, a->beta, len,
                         tmp, p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2);
    ZPP_CHECK(isum_res_store(p, own, off, len, p->tmp));
    ZPP_CHECK(isum_res_store(p, p->seg2 + (size_t)m, off, len, p->tmp2));
  }
  return ZPP_OK;
}

/* Set O of chunk k, integer sums: the kept partial sum and the other
 * nodes' messages, decoded once into recvbuf in the same pass (its int32
 * sums in a cache-sized tile of acco). */
zpp_status_t zpp_qgz_int_keep(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  int32_t *tmp = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].acco;
  zpp_qcfg_t c1 = isum_qcfg(&a->q1, 0), c = isum_qcfg(&a->q2, 0);
  size_t own = (size_t)qgz_slice_of(p, p->me1, p->mo);
  float *r1;
  int n, n1;
  if (p->idev)
    return isum_keep_dev(p, k);
  n1 = qgz_s1_srcs(p, k, p->mo, p->srcs);
  n = (int)isum_s2_srcs(p, k);
  zpp_plan_poll();
  ZPP_CHECK(isum_res_load(p, own, off, len, p->tmp, &r1));
  p->iops->sum_finish(&c1, &c, (int)a->dtype, qgz_own_ptr(p, k, p->mo), r1,
                      a->beta, isum_uexp(p, (int)own, k),
                      (const uint8_t *const *)p->srcs, n1, p->fsrcs, n, len,
                      qgz_div(p), tmp,
                      (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype));
  return isum_res_store(p, own, off, len, p->tmp);
}

/* ---- integer sums on device memory ------------------------------------------
 * The same steps as above on the plan's stream, one chunk (the whole
 * slices), each kind of work one batched launch over a table: bitwise the
 * host path's (tests/test_qgz_int.cc, QgzInt.DeviceEqualsTheHostPathBitFor-
 * Bit).  The residuals stay in their layout (fp32, or INT8 blocks the
 * kernels decode and re-encode themselves); the partial sums are int32 in
 * accx and acco, written by the sum kernel and read by the requant and the
 * finish. */

/* The kernels' config of stage q (width, block, rounding) on this call's
 * dtype and residual. */
static zpp_isum_cuda_t isum_dcfg(const qgz_ctx_t *p,
                                 const zpp_quant_config_t *q) {
  const qgz_arg_t *a = &p->a;
  zpp_isum_cuda_t c;
  memset(&c, 0, sizeof c);
  c.bits = q->bits;
  c.block = q->block_size;
  c.dtype = (int)a->dtype;
  c.sr = q->rounding == ZPP_ROUND_STOCHASTIC;
  c.res = a->residual == NULL      ? ZPP_QB_RES_NONE
          : a->residual_bits == 32 ? ZPP_QB_RES_F32
                                   : ZPP_QB_RES_I8;
  c.reset = a->reset;
  c.beta = a->beta;
  return c;
}

static zpp_status_t isum_absmax_dev(qgz_ctx_t *p) {
  const qgz_arg_t *a = &p->a;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q1);
  size_t w = (size_t)zpp_transport_size(a->ex.t), ds = zpp_dtype_size(a->dtype);
  size_t sl;
  for (sl = 0; sl < w; sl++) {
    zpp_isum_cuda_absmax_run_t *r = &p->iabs[sl];
    void *res;
    uint8_t *codes;
    qgz_residual_at(p, sl, 0, &res, &codes);
    r->src = (const uint8_t *)a->send + sl * a->count * ds;
    r->res = res;
    r->res_codes = codes;
    r->count = a->count;
    r->amax = p->amax_mine + sl * p->nb;
    r->uexp = p->uexp_mine + sl * p->nb;
  }
  return zpp_k_isum_absmax(&a->ex, &c, p->iabs, w);
}

static zpp_status_t isum_encode_dev(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k), n = 0;
  size_t e1 = qgz_s1_bytes(p, len), ds = zpp_dtype_size(a->dtype);
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q1);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(a->ex.t);
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1 && j != p->me1; m++) {
      int sl = qgz_slice_of(p, j, m);
      zpp_isum_cuda_encode_run_t *r = &p->ienc[n++];
      qgz_residual_at(p, (size_t)sl, off, &r->res, &r->res_codes);
      r->src = (const uint8_t *)a->send + ((size_t)sl * a->count + off) * ds;
      r->amax = isum_amax(p, sl, k);
      r->uexp = isum_uexp(p, sl, k);
      r->dst = out + qgz_s1_at(p, j, m, e1);
      r->count = len;
      r->base = off;
      r->seed = qgz_stream_q(&a->q1, 1, me, sl).seed;
    }
  return zpp_k_isum_encode(&a->ex, &c, p->ienc, n);
}

/* The integer sums of set h of chunk k, one after the other in acc: the
 * own slices (their stage-1 residuals updated) and the other members'
 * messages (p->isrcs). */
static zpp_status_t isum_sum_dev(qgz_ctx_t *p, size_t k, int h, int32_t *acc) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k), ns = 0;
  size_t e1 = qgz_s1_bytes(p, len);
  const uint8_t *r1 = p->slot[k % QGZ_DEPTH].r1;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q1);
  int i, j, np = qgz_half_parts(p, h);
  for (i = 0; i < np; i++) {
    int m = qgz_half_part(p, h, i);
    int own = qgz_slice_of(p, p->me1, m);
    zpp_isum_cuda_sum_run_t *r = &p->isr[i];
    qgz_residual_at(p, (size_t)own, off, &r->res, &r->res_codes);
    r->own = qgz_own_ptr(p, k, m);
    r->uexp = isum_uexp(p, own, k);
    r->out = acc + (size_t)i * len;
    r->count = len;
    r->first = ns;
    for (j = 0; j < p->s1; j++)
      if (j != p->me1)
        p->isrcs[ns++] = r1 + qgz_s1_at(p, j, m, e1);
    r->n = ns - r->first;
  }
  return zpp_k_isum_sum(&a->ex, &c, p->isr, (size_t)np, p->isrcs);
}

static zpp_status_t isum_reduce_x_dev(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  int32_t *acc = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].accx;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q2);
  int i, np = qgz_half_parts(p, QGZ_HALF_X), me = zpp_transport_rank(a->ex.t);
  ZPP_CHECK(isum_sum_dev(p, k, QGZ_HALF_X, acc));
  for (i = 0; i < np; i++) {
    int m = qgz_half_part(p, QGZ_HALF_X, i);
    zpp_isum_cuda_requant_run_t *r = &p->ireq[i];
    qgz_residual_at(p, p->seg2 + (size_t)m, off, &r->res, &r->res_codes);
    r->in = acc + (size_t)i * len;
    r->uexp = isum_uexp(p, qgz_slice_of(p, p->me1, m), k);
    r->dst = p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2;
    r->count = len;
    r->base = off;
    r->seed = qgz_stream_q(&a->q2, 2, me, m).seed;
  }
  return zpp_k_isum_requant(&a->ex, &c, p->ireq, (size_t)np);
}

static zpp_status_t isum_keep_dev(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  int32_t *acc = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].acco;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q2);
  zpp_isum_cuda_finish_run_t r;
  ZPP_CHECK(isum_sum_dev(p, k, QGZ_HALF_O, acc));
  memset(&r, 0, sizeof r);
  r.own = acc;
  /* more than ZPP_ISUM_CUDA_SRCS other nodes: the finish goes on over
   * launches, its fp32 sums in place of the int32 ones it has read */
  r.part = p->slot[k % QGZ_DEPTH].acco;
  r.uexp = isum_uexp(p, qgz_slice_of(p, p->me1, p->mo), k);
  r.dst = (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype);
  r.count = len;
  r.first = 0;
  r.n = isum_s2_srcs(p, k);
  return zpp_k_isum_finish(&a->ex, &c, &r, 1, p->fsrcs, qgz_div(p));
}

/* The buffers of integer sums (a.isum, nchunks > 0): this rank's absmax
 * and exponents of every block of every slice, the all-gathered and the
 * agreed exponents, the stage-2 message table; on device memory the
 * launch tables too (no scratch: the kernels keep their own). */
zpp_status_t zpp_qgz_int_alloc(const char *func, qgz_ctx_t *p) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t s1 = (size_t)p->s1, m1 = (size_t)p->m1;
  size_t w = (size_t)zpp_transport_size(ex->t);
  zpp_status_t st;
  p->nb = (a->count + a->q1.block_size - 1) / a->q1.block_size;
  p->iops = &zpp_quant_cpu_ops()->isum;
  st = zpp_k_alloc(ex, w * p->nb * 4, (void **)&p->amax_mine);
  if (st == ZPP_OK)
    st = zpp_k_alloc(ex, w * p->nb, (void **)&p->uexp_mine);
  if (st == ZPP_OK && s1 > 1)
    st = zpp_k_alloc(ex, w * p->nb, (void **)&p->uexp);
  if (st == ZPP_OK && s1 > 1)
    st = zpp_k_alloc(ex, s1 * w * p->nb, (void **)&p->uexp_all);
  if (s1 == 1) /* a stage of one rank agrees with itself */
    p->uexp = p->uexp_mine;
  if (st == ZPP_OK) {
    p->fsrcs = (const uint8_t **)calloc(m1, sizeof *p->fsrcs);
    if (p->fsrcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ message table");
  }
  if (st == ZPP_OK && p->idev) {
    p->iabs = (zpp_isum_cuda_absmax_run_t *)calloc(w, sizeof *p->iabs);
    p->ienc = (zpp_isum_cuda_encode_run_t *)calloc(s1 * m1, sizeof *p->ienc);
    p->isr = (zpp_isum_cuda_sum_run_t *)calloc(m1, sizeof *p->isr);
    p->ireq = (zpp_isum_cuda_requant_run_t *)calloc(m1, sizeof *p->ireq);
    p->isrcs = (const uint8_t **)calloc(s1 * m1, sizeof *p->isrcs);
    if (p->iabs == NULL || p->ienc == NULL || p->isr == NULL ||
        p->ireq == NULL || p->isrcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ integer-sum tables");
    if (st == ZPP_OK && a->residual != NULL && a->residual_bits == 8)
      p->res_seg = zpp_coll_encoded_size(&a->qr, a->count);
  }
  return st;
}
