/*
 * Scalar reference block codec.  It is the definition the SIMD and CUDA
 * paths are tested against, so it stays plain: one element at a time,
 * every step through quant_math.h.  Layout: docs/format.md.
 */
#include "quant_cpu.h"
#include "quant_math.h"

#include <string.h>

size_t zpp_quant_nblocks(const zpp_qcfg_t *cfg, size_t count) {
  return count / cfg->block + (count % cfg->block != 0);
}

size_t zpp_quant_bytes(const zpp_qcfg_t *cfg, size_t count, int *overflow) {
  size_t nb, tail, full_bytes, meta, total;
  *overflow = 0;
  if (count == 0)
    return 0;
  nb = zpp_quant_nblocks(cfg, count);
  tail = count - (nb - 1) * cfg->block;
  meta = zpp_qm_meta_bytes(cfg->asym);
  full_bytes = zpp_qm_payload_bytes(cfg->block, cfg->bits);
  /* total = nb * meta + (nb - 1) * full_bytes + payload(tail) */
  if (nb > SIZE_MAX / meta)
    goto overflow;
  total = nb * meta;
  if (nb - 1 != 0 && full_bytes > (SIZE_MAX - total) / (nb - 1))
    goto overflow;
  total += (nb - 1) * full_bytes;
  if (zpp_qm_payload_bytes(tail, cfg->bits) > SIZE_MAX - total)
    goto overflow;
  return total + zpp_qm_payload_bytes(tail, cfg->bits);
overflow:
  *overflow = 1;
  return 0;
}

static void store_meta(uint8_t *meta, const zpp_qm_params_t *p, int asym) {
  memcpy(meta, &p->scale, 4);
  if (asym)
    memcpy(meta + 4, &p->zero, 4);
}

static void encode_block(const zpp_qcfg_t *cfg, int dtype, const void *src,
                         size_t off, size_t len, uint8_t *meta,
                         uint8_t *payload) {
  zpp_qm_params_t p;
  size_t i;
  if (cfg->asym) {
    float mn = 0.0f, mx = 0.0f;
    int nonfinite = 0;
    for (i = 0; i < len; i++) {
      float x = zpp_qm_load(src, off + i, dtype);
      if ((zpp_qm_f32_bits(x) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK) {
        nonfinite = 1;
        continue;
      }
      if (i == 0 || x < mn)
        mn = x;
      if (i == 0 || x > mx)
        mx = x;
    }
    p = zpp_qm_asym_params(mn, mx, nonfinite, cfg->bits);
  } else {
    uint32_t amax = 0;
    for (i = 0; i < len; i++) {
      uint32_t a =
          zpp_qm_f32_bits(zpp_qm_load(src, off + i, dtype)) & ZPP_QM_ABS_MASK;
      amax = a > amax ? a : amax;
    }
    p = zpp_qm_sym_params(amax, cfg->bits);
  }
  store_meta(meta, &p, cfg->asym);
  if (cfg->sr) {
    zpp_qm_keys_t k = {cfg->k0, cfg->k1};
    uint64_t idx = cfg->base + off;
    for (i = 0; i < len; i++) {
      uint8_t c = zpp_qm_code_bits(zpp_qm_quantize_sr(
          zpp_qm_load(src, off + i, dtype), &p, zpp_qm_rand24(k, idx + i)));
      if (cfg->bits == 8)
        payload[i] = c;
      else if (i % 2 == 0)
        payload[i / 2] = (uint8_t)(c & 0xfu);
      else
        payload[i / 2] = (uint8_t)(payload[i / 2] | (uint8_t)(c << 4));
    }
    return;
  }
  if (cfg->bits == 8) {
    for (i = 0; i < len; i++)
      payload[i] = zpp_qm_code_bits(
          zpp_qm_quantize(zpp_qm_load(src, off + i, dtype), &p));
  } else {
    for (i = 0; i < len; i += 2) {
      uint8_t lo = zpp_qm_code_bits(
          zpp_qm_quantize(zpp_qm_load(src, off + i, dtype), &p));
      uint8_t hi = 0;
      if (i + 1 < len)
        hi = zpp_qm_code_bits(
            zpp_qm_quantize(zpp_qm_load(src, off + i + 1, dtype), &p));
      payload[i / 2] = (uint8_t)((lo & 0xfu) | (uint8_t)(hi << 4));
    }
  }
}

/* Offsets of block b: metadata and payload (docs/format.md). */
static void block_ptrs(const zpp_qcfg_t *cfg, size_t count, size_t b,
                       uint8_t *base, uint8_t **meta, uint8_t **payload) {
  size_t nb = zpp_quant_nblocks(cfg, count);
  size_t mb = zpp_qm_meta_bytes(cfg->asym);
  *meta = base + b * mb;
  *payload =
      base + nb * mb + b * zpp_qm_payload_bytes(cfg->block, cfg->bits);
}

void zpp_quant_encode_blocks_scalar(const zpp_qcfg_t *cfg, int dtype,
                                    const void *src, size_t count, size_t b0,
                                    size_t b1, uint8_t *dst) {
  size_t b;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    uint8_t *meta, *payload;
    block_ptrs(cfg, count, b, dst, &meta, &payload);
    encode_block(cfg, dtype, src, off, len, meta, payload);
  }
}

void zpp_quant_decode_blocks_scalar(const zpp_qcfg_t *cfg, const uint8_t *src,
                                    size_t count, size_t b0, size_t b1,
                                    int out_kind, void *dst) {
  size_t b, i;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    uint8_t *meta, *payload;
    float scale, zero = 0.0f;
    block_ptrs(cfg, count, b, (uint8_t *)src, &meta, &payload);
    memcpy(&scale, meta, 4);
    if (cfg->asym)
      memcpy(&zero, meta + 4, 4);
    for (i = 0; i < len; i++) {
      uint32_t stored =
          cfg->bits == 8 ? payload[i] : (payload[i / 2] >> (4 * (i & 1))) & 0xfu;
      float v = zpp_qm_dequantize(
          zpp_qm_code_value(stored, cfg->bits, cfg->asym), scale, zero);
      if (out_kind == ZPP_QM_OUT_ACC) {
        zpp_qm_store(dst, off + i, ZPP_QM_F32,
                     zpp_qm_add(zpp_qm_load(dst, off + i, ZPP_QM_F32), v));
      } else {
        zpp_qm_store(dst, off + i, out_kind, v);
      }
    }
  }
}

void zpp_quant_encode_scalar(const zpp_qcfg_t *cfg, int dtype, const void *src,
                             size_t count, uint8_t *dst) {
  zpp_quant_encode_blocks_scalar(cfg, dtype, src, count, 0,
                                 zpp_quant_nblocks(cfg, count), dst);
}

void zpp_quant_decode_scalar(const zpp_qcfg_t *cfg, const uint8_t *src,
                             size_t count, int out_kind, void *dst) {
  zpp_quant_decode_blocks_scalar(cfg, src, count, 0,
                                 zpp_quant_nblocks(cfg, count), out_kind, dst);
}

/* ---- compressed-domain sums (quant_cpu.h, docs/format.md) --------------- */

size_t zpp_isum_code_bytes(const zpp_qcfg_t *cfg, size_t count) {
  size_t full = count / cfg->block;
  return full * zpp_qm_payload_bytes(cfg->block, cfg->bits) +
         zpp_qm_payload_bytes(count - full * cfg->block, cfg->bits);
}

size_t zpp_isum_msg_bytes(const zpp_qcfg_t *cfg, size_t count) {
  return zpp_isum_code_bytes(cfg, count) + zpp_quant_nblocks(cfg, count);
}

static size_t blk_len(const zpp_qcfg_t *cfg, size_t count, size_t b) {
  size_t off = b * cfg->block;
  return count - off < cfg->block ? count - off : cfg->block;
}

void zpp_isum_absmax_scalar(const zpp_qcfg_t *cfg, int dtype, const void *src,
                            const float *res, size_t count, uint32_t *amax) {
  size_t b, i, nb = zpp_quant_nblocks(cfg, count);
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block, len = blk_len(cfg, count, b);
    uint32_t m = 0;
    for (i = off; i < off + len; i++) {
      float x = zpp_qm_load(src, i, dtype);
      uint32_t a;
      if (res != NULL)
        x = x + res[i];
      a = zpp_qm_f32_bits(x) & ZPP_QM_ABS_MASK;
      m = a > m ? a : m;
    }
    amax[b] = m;
  }
}

/* Stored code i of a packed payload. */
static int isum_code(const uint8_t *pl, size_t i, int bits) {
  uint32_t st = bits == 8 ? pl[i] : (pl[i / 2] >> (4 * (i & 1))) & 0xfu;
  return zpp_qm_code_value(st, bits, 0);
}

static void isum_put(uint8_t *pl, size_t i, int bits, int q) {
  uint8_t c = zpp_qm_code_bits(q);
  if (bits == 8)
    pl[i] = c;
  else if (i % 2 == 0)
    pl[i / 2] = (uint8_t)(c & 0xfu);
  else
    pl[i / 2] = (uint8_t)(pl[i / 2] | (uint8_t)(c << 4));
}

void zpp_isum_encode_scalar(const zpp_qcfg_t *cfg, int dtype, const void *src,
                            float *res, float beta, const uint32_t *amax,
                            const int8_t *uexp, size_t count, uint8_t *dst) {
  size_t b, i, nb = zpp_quant_nblocks(cfg, count);
  uint8_t *mult = dst + zpp_isum_code_bytes(cfg, count);
  zpp_qm_keys_t k = {cfg->k0, cfg->k1};
  float omega = 1.0f - beta;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block, len = blk_len(cfg, count, b);
    uint32_t m = zpp_qm_unit_mult(amax[b], cfg->bits, uexp[b]);
    zpp_qm_params_t p = zpp_qm_unit_params(uexp[b], m, cfg->bits);
    uint8_t *pl = dst + b * zpp_qm_payload_bytes(cfg->block, cfg->bits);
    mult[b] = (uint8_t)m;
    for (i = 0; i < len; i++) {
      float x = zpp_qm_load(src, off + i, dtype);
      int q;
      if (res != NULL)
        x = x + res[off + i];
      q = cfg->sr ? zpp_qm_quantize_sr(x, &p,
                                       zpp_qm_rand24(k, cfg->base + off + i))
                  : zpp_qm_quantize(x, &p);
      isum_put(pl, i, cfg->bits, q);
      if (res != NULL) {
        float dec = zpp_qm_dequantize(q, p.scale, 0.0f);
        res[off + i] = beta == 0.0f
                           ? zpp_qm_ef_residual(x, dec)
                           : zpp_qm_ema_residual(res[off + i], x, dec, beta,
                                                 omega);
      }
    }
  }
}

/* The kernels' bodies over blocks [b0, b1) of a call of `count` elements:
 * the messages keep the layout of the whole call, the int32 sums (out,
 * in, own) hold the elements from ob = b0 * block on (a tile), or from 0
 * (ob 0, the whole call). */
static void isum_sum_rng(const zpp_qcfg_t *cfg, int dtype, const void *own,
                         float *res, float beta, const int8_t *uexp,
                         const uint8_t *const *srcs, int n, size_t count,
                         size_t b0, size_t b1, size_t ob, int32_t *out) {
  size_t b, i;
  size_t pb = zpp_qm_payload_bytes(cfg->block, cfg->bits);
  size_t cb = zpp_isum_code_bytes(cfg, count);
  float omega = 1.0f - beta;
  int j;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg->block, len = blk_len(cfg, count, b);
    float unit = zpp_qm_unit_value(uexp[b]);
    for (i = 0; i < len; i++) {
      int32_t c = 0;
      if (own != NULL) {
        float x = zpp_qm_load(own, off + i, dtype);
        if (res != NULL)
          x = x + res[off + i];
        c = zpp_qm_unit_own(x, uexp[b]);
        if (res != NULL)
          res[off + i] = zpp_qm_feedback(res[off + i], x, c, unit, beta, omega);
      }
      for (j = 0; j < n; j++)
        c += (int32_t)srcs[j][cb + b] *
             isum_code(srcs[j] + b * pb, i, cfg->bits);
      out[off - ob + i] = c;
    }
  }
}

void zpp_isum_sum_scalar(const zpp_qcfg_t *cfg, int dtype, const void *own,
                         float *res, float beta, const int8_t *uexp,
                         const uint8_t *const *srcs, int n, size_t count,
                         int32_t *out) {
  isum_sum_rng(cfg, dtype, own, res, beta, uexp, srcs, n, count, 0,
               zpp_quant_nblocks(cfg, count), 0, out);
}

static void isum_requant_rng(const zpp_qcfg_t *cfg2, const int32_t *in,
                             const int8_t *uexp, float *res, float beta,
                             size_t count, size_t b0, size_t b1, size_t ob,
                             uint8_t *dst) {
  size_t b, i, nb = zpp_quant_nblocks(cfg2, count);
  size_t pb = zpp_qm_payload_bytes(cfg2->block, cfg2->bits);
  int qmax2 = zpp_qm_sym_qmax(cfg2->bits);
  zpp_qm_keys_t k = {cfg2->k0, cfg2->k1};
  float omega = 1.0f - beta;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg2->block, len = blk_len(cfg2, count, b);
    int e = uexp[b];
    float unit = zpp_qm_unit_value(e);
    uint8_t *pl = dst + nb * 4 + b * pb;
    uint32_t m = 0;
    zpp_qm_params_t p;
    for (i = 0; i < len; i++) {
      int32_t j = in[off - ob + i];
      uint32_t a;
      if (res != NULL)
        j += zpp_qm_unit_res(res[off + i], e);
      a = (uint32_t)(j < 0 ? -j : j);
      m = a > m ? a : m;
    }
    p = zpp_qm_irequant_params(zpp_qm_idivisor(m, qmax2), e, cfg2->bits);
    memcpy(dst + b * 4, &p.scale, 4);
    for (i = 0; i < len; i++) {
      int32_t j = in[off - ob + i];
      int q;
      if (res != NULL)
        j += zpp_qm_unit_res(res[off + i], e);
      q = cfg2->sr ? zpp_qm_quantize_sr((float)j, &p,
                                        zpp_qm_rand24(k, cfg2->base + off + i))
                   : zpp_qm_quantize((float)j, &p);
      isum_put(pl, i, cfg2->bits, q);
      if (res != NULL) {
        float x = (float)in[off - ob + i] * unit + res[off + i];
        float dec = zpp_qm_dequantize(q, p.scale, 0.0f);
        res[off + i] = beta == 0.0f
                           ? zpp_qm_ef_residual(x, dec)
                           : zpp_qm_ema_residual(res[off + i], x, dec, beta,
                                                 omega);
      }
    }
  }
}

void zpp_isum_requant_scalar(const zpp_qcfg_t *cfg2, const int32_t *in,
                             const int8_t *uexp, float *res, float beta,
                             size_t count, uint8_t *dst) {
  isum_requant_rng(cfg2, in, uexp, res, beta, count, 0,
                   zpp_quant_nblocks(cfg2, count), 0, dst);
}

static void isum_finish_rng(const zpp_qcfg_t *cfg2, const int32_t *own,
                            const int8_t *uexp, const uint8_t *const *srcs,
                            int n, size_t count, size_t b0, size_t b1,
                            size_t ob, float div, int dtype, void *dst) {
  size_t b, i, nb = zpp_quant_nblocks(cfg2, count);
  size_t pb = zpp_qm_payload_bytes(cfg2->block, cfg2->bits);
  int j;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg2->block, len = blk_len(cfg2, count, b);
    float unit = zpp_qm_unit_value(uexp[b]);
    for (i = 0; i < len; i++) {
      float acc = (float)own[off - ob + i] * unit;
      for (j = 0; j < n; j++) {
        float sc;
        memcpy(&sc, srcs[j] + b * 4, 4);
        acc = zpp_qm_add(
            acc, zpp_qm_dequantize(
                     isum_code(srcs[j] + nb * 4 + b * pb, i, cfg2->bits), sc,
                     0.0f));
      }
      zpp_qm_store(dst, off + i, dtype, acc / div);
    }
  }
}

void zpp_isum_finish_scalar(const zpp_qcfg_t *cfg2, const int32_t *own,
                            const int8_t *uexp, const uint8_t *const *srcs,
                            int n, size_t count, float div, int dtype,
                            void *dst) {
  isum_finish_rng(cfg2, own, uexp, srcs, n, count, 0,
                  zpp_quant_nblocks(cfg2, count), 0, div, dtype, dst);
}

size_t zpp_isum_tile_blocks(const zpp_qcfg_t *cfg) {
  size_t tb = ZPP_ISUM_TILE / cfg->block;
  return tb == 0 ? 1 : tb;
}

size_t zpp_isum_tile(const zpp_qcfg_t *cfg, size_t count) {
  size_t t = zpp_isum_tile_blocks(cfg) * cfg->block;
  return count < t ? count : t;
}

void zpp_isum_sum_requant_scalar(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2,
                                 int dtype, const void *own, float *res1,
                                 const int8_t *uexp, const uint8_t *const *srcs,
                                 int n, float *res, float beta, size_t count,
                                 int32_t *tmp, uint8_t *dst) {
  size_t nb = zpp_quant_nblocks(cfg, count), tb = zpp_isum_tile_blocks(cfg);
  size_t b0, b1;
  for (b0 = 0; b0 < nb; b0 = b1) {
    b1 = nb - b0 < tb ? nb : b0 + tb;
    isum_sum_rng(cfg, dtype, own, res1, beta, uexp, srcs, n, count, b0, b1,
                 b0 * cfg->block, tmp);
    isum_requant_rng(cfg2, tmp, uexp, res, beta, count, b0, b1, b0 * cfg->block,
                     dst);
  }
}

void zpp_isum_sum_finish_scalar(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2,
                                int dtype, const void *own, float *res1,
                                float beta, const int8_t *uexp,
                                const uint8_t *const *srcs, int n,
                                const uint8_t *const *srcs2, int n2,
                                size_t count, float div, int32_t *tmp,
                                void *dst) {
  size_t nb = zpp_quant_nblocks(cfg, count), tb = zpp_isum_tile_blocks(cfg);
  size_t b0, b1;
  for (b0 = 0; b0 < nb; b0 = b1) {
    b1 = nb - b0 < tb ? nb : b0 + tb;
    isum_sum_rng(cfg, dtype, own, res1, beta, uexp, srcs, n, count, b0, b1,
                 b0 * cfg->block, tmp);
    isum_finish_rng(cfg2, tmp, uexp, srcs2, n2, count, b0, b1, b0 * cfg->block,
                    div, dtype, dst);
  }
}
