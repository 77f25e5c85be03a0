/*
 * qgZ's steps that sum in fp32 (ZPP_QGZ_SUM_FLOAT, src/coll/qgz.c has the
 * plan): stage 1 encodes each slice with error feedback (optionally
 * rotated), the collecting rank decodes and adds the messages to its own
 * slice in fp32, stage 2 re-encodes each partial sum another node keeps
 * with scales of its own, and the owner decodes and adds those, divides
 * for MEAN and rounds once to the dtype.  Host memory runs them slice by
 * slice, device memory one batched launch per kind of work.
 * docs/collectives.md, "qgZ".
 */
#include "coll/qgz_internal.h"
#include "core/core.h"
#include "engine/plan.h"

#include <stddef.h>
#include <string.h>

/* Error feedback around one encode of `len` elements at `off` of slice
 * (or partial sum) `seg`: x (fp32, may be p->tmp) += residual, encode x
 * into out, store the new error.  fp32 residual: seg * count + off floats
 * in; INT8: segment seg (E8(count) bytes, the format of docs/format.md),
 * the chunk's blocks gathered into p->rs and decoded, then re-encoded and
 * scattered back (chunks are whole blocks, so they own whole blocks).  A
 * call with a->reset uses a zero residual instead of the stored one. */
static zpp_status_t encode_ef(qgz_ctx_t *p, const zpp_quant_config_t *q,
                              size_t seg, size_t off, size_t len,
                              zpp_dtype_t dt, const void *x, uint8_t *out) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  if (a->residual == NULL)
    return zpp_k_encode_at(ex, q, dt, x, len, off, out);
  if (a->residual_bits == 32) {
    float *res = (float *)a->residual + seg * a->count + off;
    if (a->reset)
      ZPP_CHECK(zpp_k_zero(ex, res, len * sizeof(float)));
    return zpp_k_encode_ef(ex, q, dt, x, len, off, res, a->beta, p->tmp,
                           p->tmp3, out);
  }
  if (a->reset)
    ZPP_CHECK(zpp_k_zero(ex, p->tmp2, len * sizeof(float)));
  else
    ZPP_CHECK(qgz_res8_load(p, seg, off, len, p->tmp2));
  ZPP_CHECK(zpp_k_encode_ef(ex, q, dt, x, len, off, p->tmp2, a->beta, p->tmp,
                            p->tmp3, out));
  return qgz_res8_store(p, seg, off, len, p->tmp2);
}

/* Batched steps: what the encodes of one step share. */
static zpp_k_enc_batch_t batch_opts(const qgz_ctx_t *p,
                                    const zpp_quant_config_t *q, zpp_dtype_t dt,
                                    size_t hadamard) {
  zpp_k_enc_batch_t b;
  memset(&b, 0, sizeof b);
  b.q = q;
  b.dtype = dt;
  b.residual_bits = p->a.residual != NULL ? p->a.residual_bits : 0;
  b.reset = p->a.reset;
  b.beta = p->a.beta;
  b.hadamard = hadamard;
  return b;
}

/* Stage 1 encode of chunk k into its slot, residuals updated. */
zpp_status_t zpp_qgz_float_encode(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  size_t e1 = qgz_s1_bytes(p, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(ex->t);
  if (p->batch && !p->raw1) { /* every slice to every member: one table */
    zpp_k_enc_batch_t b =
        batch_opts(p, &a->q1, a->dtype, p->rot1 ? a->hadamard : 0);
    size_t n = 0;
    for (j = 0; j < p->s1; j++)
      for (m = 0; m < p->m1 && j != p->me1; m++) {
        int sl = qgz_slice_of(p, j, m);
        zpp_qb_enc_run_t *r = &p->eruns[n++];
        r->src = (const uint8_t *)a->send + ((size_t)sl * a->count + off) * ds;
        r->dst = out + qgz_s1_at(p, j, m, e1);
        qgz_residual_at(p, (size_t)sl, off, &r->res, &r->res_codes);
        r->count = len;
        r->base = off;
        r->seed = qgz_stream_q(&a->q1, 1, me, sl).seed;
      }
    return zpp_k_encode_batch(ex, &b, p->eruns, n);
  }
  for (j = 0; j < p->s1; j++) {
    if (j == p->me1) { /* not sent: summed from sendbuf by stage1_sum */
      out += (size_t)p->m1 * e1;
      continue;
    }
    for (m = 0; m < p->m1; m++, out += e1) {
      int sl = qgz_slice_of(p, j, m);
      zpp_plan_poll(); /* keep the transfers in flight moving */
      size_t at = (size_t)sl * a->count + off;
      const void *g = (const uint8_t *)a->send + at * ds;
      zpp_dtype_t dt = a->dtype;
      zpp_quant_config_t q;
      if (p->raw1) { /* the slice as it is, into its message */
        ZPP_CHECK(zpp_k_copy(ex, out, g, e1));
        continue;
      }
      q = qgz_stream_q(&a->q1, 1, me, sl);
      if (p->rot1) { /* groups start at the slice's first element */
        ZPP_CHECK(zpp_k_hadamard(ex, a->hadamard, dt, g, len, p->tmp));
        g = p->tmp;
        dt = ZPP_FLOAT32;
      }
      ZPP_CHECK(encode_ef(p, &q, (size_t)sl, off, len, dt, g, out));
    }
  }
  return ZPP_OK;
}

/* acc is the slot's (this chunk's until its last step, which this is), so
 * the inverse rotation may work in place. */
static zpp_status_t finish(const qgz_ctx_t *p, size_t k, float *acc) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk;
  if (p->rot1 || p->rot2) /* back from the rotated domain, in place */
    ZPP_CHECK(zpp_k_hadamard(&a->ex, a->hadamard, ZPP_FLOAT32, acc,
                             qgz_chunk_len(p, k), acc));
  return zpp_k_finish(&a->ex, acc, qgz_chunk_len(p, k), qgz_div(p), a->dtype,
                      (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype));
}

/* part = this rank's own slice of partial sum m, chunk k, in fp32, read
 * from sendbuf (rotated first when stage 1 rotates). */
static zpp_status_t own_slice(qgz_ctx_t *p, size_t k, int m, float *part) {
  const qgz_arg_t *a = &p->a;
  size_t len = qgz_chunk_len(p, k);
  const void *g = qgz_own_ptr(p, k, m);
  if (p->rot1) /* straight into part: the rotation writes fp32 */
    return zpp_k_hadamard(&a->ex, a->hadamard, a->dtype, g, len, part);
  return zpp_k_to_f32(&a->ex, a->dtype, g, len, part);
}

/* Stage 1 decode-accumulate (raw: convert-accumulate) of set h of chunk
 * k into acc (its partial sums one after the other): each partial sum starts as
 * this rank's own slice, then the other members' messages are added in
 * member order (unrotated and quantized: in one pass of L1 tiles on the
 * host, zpp_k_sum_decoded). */
static zpp_status_t stage1_sum(qgz_ctx_t *p, size_t k, int h, float *acc) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t len = qgz_chunk_len(p, k), e1 = qgz_s1_bytes(p, len);
  const uint8_t *r1 = p->slot[k % QGZ_DEPTH].r1;
  int i, j, np = qgz_half_parts(p, h);
  if (p->batch) { /* every partial sum of the set: one table */
    size_t ns = 0;
    for (i = 0; i < np && p->rot1; i++) { /* own slices, rotated, first */
      p->hruns[i].src = qgz_own_ptr(p, k, qgz_half_part(p, h, i));
      p->hruns[i].dst = acc + (size_t)i * len;
      p->hruns[i].count = len;
    }
    if (p->rot1)
      ZPP_CHECK(zpp_k_hadamard_batch(ex, a->hadamard, a->dtype, p->hruns,
                                     (size_t)np));
    for (i = 0; i < np; i++) {
      int m = qgz_half_part(p, h, i);
      zpp_qb_sum_run_t *r = &p->sruns[i];
      r->out = acc + (size_t)i * len;
      r->init = p->rot1 ? NULL : qgz_own_ptr(p, k, m);
      r->count = len;
      r->first = ns;
      r->n = (size_t)qgz_s1_srcs(p, k, m, p->bsrcs + ns);
      ns += r->n;
    }
    return zpp_k_sum_batch(ex, p->raw1 ? NULL : &a->q1, a->dtype, a->dtype,
                           p->sruns, (size_t)np, p->bsrcs);
  }
  for (i = 0; i < np; i++) {
    int m = qgz_half_part(p, h, i);
    float *part = acc + (size_t)i * len;
    if (qgz_sum_in_one_call(p)) { /* own slice and messages in one pass */
      int n = qgz_s1_srcs(p, k, m, p->srcs);
      zpp_plan_poll();
      ZPP_CHECK(zpp_k_sum_decoded(ex, &a->q1, a->dtype, qgz_own_ptr(p, k, m),
                                  p->srcs, n, len, part));
      continue;
    }
    ZPP_CHECK(own_slice(p, k, m, part));
    for (j = 0; j < p->s1; j++) {
      const uint8_t *in = r1 + qgz_s1_at(p, j, m, e1);
      if (j == p->me1)
        continue; /* already in part */
      zpp_plan_poll();
      if (p->raw1) /* part = part + fp32(slice), in place */
        ZPP_CHECK(zpp_k_add_residual(ex, a->dtype, in, part, len, part));
      else
        ZPP_CHECK(zpp_k_decode_acc(ex, &a->q1, in, len, part));
    }
  }
  return ZPP_OK;
}

/* Set X of chunk k (two levels): the partial sums other nodes keep, then
 * stage 2's encode of each into its part of s2 (stage-2 residual segments
 * from p->seg2; own part: not written).  A raw stage 1 leaves the rotation
 * to here: the partial sums are rotated in place, and the sum of rotated
 * partial sums is the rotated sum (zpp_qgz_float_keep rotates the kept
 * one). */
zpp_status_t zpp_qgz_float_reduce_x(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = qgz_chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  float *acc = p->slot[k % QGZ_DEPTH].accx;
  int i, me = zpp_transport_rank(ex->t);
  ZPP_CHECK(stage1_sum(p, k, QGZ_HALF_X, acc));
  if (p->batch) { /* every partial sum to send: one table */
    zpp_k_enc_batch_t b = batch_opts(p, &a->q2, ZPP_FLOAT32, 0);
    int np = qgz_half_parts(p, QGZ_HALF_X);
    for (i = 0; i < np; i++) {
      int m = qgz_half_part(p, QGZ_HALF_X, i);
      zpp_qb_enc_run_t *r = &p->eruns[i];
      p->hruns[i].src = p->hruns[i].dst = acc + (size_t)i * len;
      p->hruns[i].count = len;
      r->src = acc + (size_t)i * len;
      r->dst = p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2;
      qgz_residual_at(p, p->seg2 + (size_t)m, off, &r->res, &r->res_codes);
      r->count = len;
      r->base = off;
      r->seed = qgz_stream_q(&a->q2, 2, me, m).seed;
    }
    if (p->rot2) /* in place, before the encode */
      ZPP_CHECK(zpp_k_hadamard_batch(ex, a->hadamard, ZPP_FLOAT32, p->hruns,
                                     (size_t)np));
    return zpp_k_encode_batch(ex, &b, p->eruns, (size_t)np);
  }
  for (i = 0; i < qgz_half_parts(p, QGZ_HALF_X); i++) { /* part mo: not sent */
    int m = qgz_half_part(p, QGZ_HALF_X, i);
    float *part = acc + (size_t)i * len;
    uint8_t *out = p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2;
    zpp_quant_config_t q;
    zpp_plan_poll();
    q = qgz_stream_q(&a->q2, 2, me, m);
    if (p->rot2)
      ZPP_CHECK(zpp_k_hadamard(ex, a->hadamard, ZPP_FLOAT32, part, len, part));
    ZPP_CHECK(encode_ef(p, &q, p->seg2 + (size_t)m, off, len, ZPP_FLOAT32, part,
                        out));
  }
  return ZPP_OK;
}

/* Set O of chunk k: the partial sum this node keeps; one level: the
 * finish.  Two levels: rotated when stage 2 rotates, the other nodes'
 * partial sums decoded and added to it in node order (in place, fp32),
 * then the finish. */
zpp_status_t zpp_qgz_float_keep(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t len = qgz_chunk_len(p, k), e2 = zpp_coll_encoded_size(&a->q2, len);
  float *sum = p->slot[k % QGZ_DEPTH].acco;
  const uint8_t *in;
  int m;
  ZPP_CHECK(stage1_sum(p, k, QGZ_HALF_O, sum));
  if (!p->two)
    return finish(p, k, sum);
  if (p->rot2)
    ZPP_CHECK(zpp_k_hadamard(&a->ex, a->hadamard, ZPP_FLOAT32, sum, len, sum));
  in = p->slot[k % QGZ_DEPTH].r2;
  if (p->batch) { /* the other nodes' partial sums: one table */
    size_t n = 0;
    for (m = 0; m < p->m1; m++)
      if (m != p->mo)
        p->bsrcs[n++] = in + (size_t)m * e2;
    p->sruns[0].out = sum;
    p->sruns[0].init = NULL;
    p->sruns[0].count = len;
    p->sruns[0].first = 0;
    p->sruns[0].n = n;
    ZPP_CHECK(zpp_k_sum_batch(&a->ex, &a->q2, ZPP_FLOAT32, ZPP_FLOAT32,
                              p->sruns, 1, p->bsrcs));
    return finish(p, k, sum);
  }
  for (m = 0; m < p->m1; m++, in += e2) {
    if (m == p->mo)
      continue; /* the start of the sum */
    zpp_plan_poll();
    ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q2, in, len, sum));
  }
  return finish(p, k, sum);
}
