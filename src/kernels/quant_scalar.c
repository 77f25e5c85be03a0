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
