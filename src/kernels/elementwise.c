/* Host element-wise helpers of the collectives (elementwise.h). */
#include "elementwise.h"

#include "quant_math.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* bf16 -> fp32 is a shift of the bits: 16 elements per step. */
static __attribute__((target("avx2"))) size_t
bf16_to_f32_avx2(const unsigned char *s, size_t count, float *out) {
  size_t i;
  for (i = 0; i + 16 <= count; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
    __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
    __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
    _mm256_storeu_si256((__m256i *)(out + i), _mm256_slli_epi32(lo, 16));
    _mm256_storeu_si256((__m256i *)(out + i + 8), _mm256_slli_epi32(hi, 16));
  }
  return i;
}

/* fp32 -> bf16, zpp_qm_f32_to_bf16 bit for bit: round to nearest even
 * (add 0x7fff plus the kept lowest bit), NaN quietened ((u >> 16) |
 * 0x40).  16 elements per step; the 32 bytes of a step are stored after
 * its 64 are loaded, so out may be the fp32 input itself (in place). */
static __attribute__((target("avx2"))) size_t
f32_to_bf16_avx2(const float *acc, size_t count, unsigned char *d) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i absm = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i;
  for (i = 0; i + 16 <= count; i += 16) {
    __m256i r[2];
    int h;
    for (h = 0; h < 2; h++) {
      __m256i u = _mm256_loadu_si256((const __m256i *)(acc + i + 8 * h));
      __m256i hi = _mm256_srli_epi32(u, 16);
      __m256i rn = _mm256_add_epi32(
          u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one)));
      __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
      r[h] = _mm256_blendv_epi8(_mm256_srli_epi32(rn, 16),
                                _mm256_or_si256(hi, quiet), nan);
    }
    /* pack to 16 bits (every value < 2^16), lanes back in order */
    _mm256_storeu_si256((__m256i *)(d + 2 * i),
                        _mm256_permute4x64_epi64(
                            _mm256_packus_epi32(r[0], r[1]), 0xd8));
  }
  return i;
}
#define ZPP_EW_HAVE_AVX2 1
#endif

/* Element-wise loops in tiles (tile_in / tile_out below): per element the
 * arithmetic of a plain loop over zpp_qm_load / zpp_qm_store, bit for bit,
 * with the dtype decided once per tile so that the compiler vectorizes the
 * fp32 and bf16 loops. */
static void tile_in(float *acc, const void *p, size_t base, size_t m,
                    int dtype, int first);
static void tile_out(void *p, size_t base, size_t m, int dtype,
                     const float *acc, int simd);
#define ZPP_EW_TILE 512

void zpp_ew_finish_host(int simd, const float *acc, size_t count, float div,
                        int dtype, void *out) {
  float t[ZPP_EW_TILE];
  size_t base, j;
  for (base = 0; base < count; base += ZPP_EW_TILE) {
    size_t m = count - base < ZPP_EW_TILE ? count - base : ZPP_EW_TILE;
    if (div == 1.0f) {
      tile_out(out, base, m, dtype, acc + base, simd);
      continue;
    }
    for (j = 0; j < m; j++)
      t[j] = acc[base + j] / div;
    tile_out(out, base, m, dtype, t, simd);
  }
}

void zpp_ew_scale_host(int dtype, void *buf, size_t count, float div) {
  float t[ZPP_EW_TILE];
  size_t base, j;
  for (base = 0; base < count; base += ZPP_EW_TILE) {
    size_t m = count - base < ZPP_EW_TILE ? count - base : ZPP_EW_TILE;
    tile_in(t, buf, base, m, dtype, 1);
    for (j = 0; j < m; j++)
      t[j] = t[j] / div;
    tile_out(buf, base, m, dtype, t, 0);
  }
}


void zpp_ew_to_f32_host(int simd, int dtype, const void *x, size_t count,
                        float *out) {
  size_t base = 0;
#ifdef ZPP_EW_HAVE_AVX2
  if (simd && dtype == ZPP_QM_BF16)
    base = bf16_to_f32_avx2((const unsigned char *)x, count, out);
#else
  (void)simd;
#endif
  for (; base < count; base += ZPP_EW_TILE)
    tile_in(out + base, x, base,
            count - base < ZPP_EW_TILE ? count - base : ZPP_EW_TILE, dtype, 1);
}

void zpp_ew_add_residual_host(int dtype, const void *g, const float *res,
                              size_t count, float *out) {
  float t[ZPP_EW_TILE];
  size_t base, j;
  for (base = 0; base < count; base += ZPP_EW_TILE) {
    size_t m = count - base < ZPP_EW_TILE ? count - base : ZPP_EW_TILE;
    tile_in(t, g, base, m, dtype, 1);
    for (j = 0; j < m; j++)
      out[base + j] = zpp_qm_add(t[j], res[base + j]);
  }
}

/* The error to keep: e, or 0 when it is not finite. */
static float finite_error(float e) {
  return (zpp_qm_f32_bits(e) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK ? 0.0f : e;
}

void zpp_ew_residual_host(const float *x, size_t count, float *res) {
  size_t i;
  for (i = 0; i < count; i++)
    res[i] = finite_error(x[i] - res[i]);
}

void zpp_ew_ema_residual_host(const float *x, const float *dec, size_t count,
                              float beta, float *res) {
  float omega = 1.0f - beta;
  size_t i;
  for (i = 0; i < count; i++)
    res[i] = zpp_qm_ema_residual(res[i], x[i], dec[i], beta, omega);
}

/* ---- error feedback fused with the encode ------------------------------ */

/* Bytes of the encode of one tile: every block's meta, then the payloads
 * (at most ZPP_EW_EF_TILE blocks of one element, 8 bytes of meta each). */
#define EF_ENC_MAX (ZPP_EW_EF_TILE * 8 + ZPP_EW_EF_TILE)

/* The fused kernels' tiles: whole blocks, at most ZPP_EW_EF_TILE elements,
 * and where tile t's blocks sit in an encode of `count` elements (every
 * block's meta first, then the payloads: docs/format.md). */
typedef struct {
  size_t per, nb, mb, pb; /* blocks per tile; blocks; meta, payload bytes */
} ew_tiling_t;
typedef struct {
  size_t off, m;          /* first element, elements */
  size_t meta, pay;       /* the tile's meta and payload bytes */
  size_t at_meta, at_pay; /* their offsets in the call's encode */
} ew_tile_t;

/* 0, or -1 when a block is longer than a tile. */
static int ew_tiling(const zpp_qcfg_t *cfg, size_t count, ew_tiling_t *g) {
  if (cfg->block > ZPP_EW_EF_TILE)
    return -1;
  g->per = ZPP_EW_EF_TILE / cfg->block;
  g->nb = zpp_quant_nblocks(cfg, count);
  g->mb = zpp_qm_meta_bytes(cfg->asym);
  g->pb = zpp_qm_payload_bytes(cfg->block, cfg->bits);
  return 0;
}

/* The tile that starts at block b0 (< g->nb). */
static ew_tile_t ew_tile(const zpp_qcfg_t *cfg, const ew_tiling_t *g,
                         size_t count, size_t b0) {
  ew_tile_t t;
  size_t bs = cfg->block, tnb;
  t.off = b0 * bs;
  t.m = count - t.off < g->per * bs ? count - t.off : g->per * bs;
  tnb = (t.m + bs - 1) / bs;
  t.meta = tnb * g->mb;
  t.pay = (tnb - 1) * g->pb +
          zpp_qm_payload_bytes(t.m - (tnb - 1) * bs, cfg->bits);
  t.at_meta = b0 * g->mb;
  t.at_pay = g->nb * g->mb + b0 * g->pb;
  return t;
}

int zpp_ew_encode_ef_host(const zpp_quant_cpu_ops_t *ops, const zpp_qcfg_t *cfg,
                          int dtype, const void *g, size_t count, float *res,
                          float beta, uint8_t *dst) {
  float x[ZPP_EW_EF_TILE], dec[ZPP_EW_EF_TILE];
  uint8_t enc[EF_ENC_MAX];
  ew_tiling_t tl;
  size_t b0, es = zpp_qm_dtype_bytes(dtype), pg = 0, pr = 0;
  float omega = 1.0f - beta;
  if (ew_tiling(cfg, count, &tl) != 0)
    return -1;
  for (b0 = 0; b0 < tl.nb; b0 += tl.per) {
    ew_tile_t tt = ew_tile(cfg, &tl, count, b0);
    size_t off = tt.off, m = tt.m, j;
    zpp_qcfg_t t = *cfg;
    /* the gradient and the residual, a tile ahead (quant_cpu.h) */
    zpp_qcpu_prefetch(g, &pg, (off + 2 * m) * es, count * es);
    zpp_qcpu_prefetch(res, &pr, (off + 2 * m) * 4, count * 4);
    t.base = cfg->base + off; /* stochastic rounding: the element's index */
    tile_in(x, g, off, m, dtype, 1);
    for (j = 0; j < m; j++)
      x[j] = zpp_qm_add(x[j], res[off + j]);
    ops->encode(&t, ZPP_QM_F32, x, m, enc);
    /* the tile's layout (its metas, then its payloads) into the call's */
    memcpy(dst + tt.at_meta, enc, tt.meta);
    memcpy(dst + tt.at_pay, enc + tt.meta, tt.pay);
    ops->decode(&t, enc, m, ZPP_QM_F32, dec);
    if (beta == 0.0f) {
      for (j = 0; j < m; j++)
        res[off + j] = finite_error(x[j] - dec[j]);
    } else {
      for (j = 0; j < m; j++)
        res[off + j] =
            zpp_qm_ema_residual(res[off + j], x[j], dec[j], beta, omega);
    }
  }
  return 0;
}

/* ---- the own slice and the decoded messages, summed ---------------------- */

int zpp_ew_sum_decoded_host(const zpp_quant_cpu_ops_t *ops,
                            const zpp_qcfg_t *cfg, int simd, int dtype,
                            const void *own, const uint8_t *const *srcs, int n,
                            size_t count, float *out) {
  uint8_t enc[EF_ENC_MAX];
  ew_tiling_t tl;
  size_t b0, es = zpp_qm_dtype_bytes(dtype), pf = 0;
  int j;
  if (ew_tiling(cfg, count, &tl) != 0)
    return -1;
  for (b0 = 0; b0 < tl.nb; b0 += tl.per) {
    ew_tile_t tt = ew_tile(cfg, &tl, count, b0);
    /* own is the caller's input, read once: a tile ahead (quant_cpu.h);
     * the messages arrived just before and are left to the caches */
    zpp_qcpu_prefetch(own, &pf, (tt.off + 2 * tt.m) * es, count * es);
    zpp_ew_to_f32_host(simd, dtype, (const unsigned char *)own + tt.off * es,
                       tt.m, out + tt.off);
    for (j = 0; j < n; j++) { /* the tile's blocks as one encode */
      memcpy(enc, srcs[j] + tt.at_meta, tt.meta);
      memcpy(enc + tt.meta, srcs[j] + tt.at_pay, tt.pay);
      ops->decode(cfg, enc, tt.m, ZPP_QM_OUT_ACC, out + tt.off);
    }
  }
  return 0;
}

/* ---- reduction of blocks ------------------------------------------------ */

/* ZPP_EW_TILE (above): the fp32 accumulators of a tile (2 KiB) stay in L1
 * while every block streams through them. */

/* acc[j] = fp32(src[j]) (first) or acc[j] + fp32(src[j]), j < m; src is
 * element `base` of a buffer of `dtype`, at any byte alignment.  One loop
 * per dtype, without a branch on the dtype inside: the compiler vectorizes
 * the fp32 and bf16 ones. */
static void tile_in(float *acc, const void *p, size_t base, size_t m,
                    int dtype, int first) {
  size_t j;
  if (dtype == ZPP_QM_F32) {
    const unsigned char *s = (const unsigned char *)p + 4 * base;
    if (first) {
      memcpy(acc, s, 4 * m);
    } else {
      for (j = 0; j < m; j++) {
        float v;
        memcpy(&v, s + 4 * j, 4);
        acc[j] = zpp_qm_add(acc[j], v);
      }
    }
  } else if (dtype == ZPP_QM_BF16) {
    const unsigned char *s = (const unsigned char *)p + 2 * base;
    for (j = 0; j < m; j++) {
      uint16_t h;
      memcpy(&h, s + 2 * j, 2);
      float v = zpp_qm_bf16_to_f32(h);
      acc[j] = first ? v : zpp_qm_add(acc[j], v);
    }
  } else {
    for (j = 0; j < m; j++) {
      float v = zpp_qm_load(p, base + j, dtype);
      acc[j] = first ? v : zpp_qm_add(acc[j], v);
    }
  }
}

static void tile_out(void *p, size_t base, size_t m, int dtype,
                     const float *acc, int simd) {
  size_t j = 0;
  if (dtype == ZPP_QM_F32) {
    /* memmove: zpp_ew_finish_host may be called with out == acc, which the
     * per-element loop allowed (memcpy of a buffer onto itself is UB) */
    memmove((unsigned char *)p + 4 * base, acc, 4 * m);
  } else if (dtype == ZPP_QM_BF16) {
    unsigned char *d = (unsigned char *)p + 2 * base;
#ifdef ZPP_EW_HAVE_AVX2
    if (simd)
      j = f32_to_bf16_avx2(acc, m, d);
#else
    (void)simd;
#endif
    for (; j < m; j++) {
      uint16_t h = zpp_qm_f32_to_bf16(acc[j]);
      memcpy(d + 2 * j, &h, 2);
    }
  } else {
    for (; j < m; j++)
      zpp_qm_store(p, base + j, dtype, acc[j]);
  }
}

void zpp_ew_reduce_blocks_host(int simd, void *dst, int out_dtype,
                               const void *const *blocks, int in_dtype, int n,
                               size_t count, float div) {
  float acc[ZPP_EW_TILE];
  size_t base, es = zpp_qm_dtype_bytes(in_dtype);
  int i;
  for (base = 0; base < count; base += ZPP_EW_TILE) {
    size_t m = count - base < ZPP_EW_TILE ? count - base : ZPP_EW_TILE, j;
    /* every block's next tile (quant_cpu.h), while the n tiles fit in
     * L1 (16 KiB: 16 tiles of bf16); beyond, the requests would evict the
     * lines of the tile being summed */
    if ((size_t)n * m * es <= 16384)
      for (i = 0; i < n; i++) {
        size_t done = (base + m) * es;
        zpp_qcpu_prefetch(blocks[i], &done, (base + 2 * m) * es, count * es);
      }
    tile_in(acc, blocks[0], base, m, in_dtype, 1);
    for (i = 1; i < n; i++)
      tile_in(acc, blocks[i], base, m, in_dtype, 0);
    if (div > 0)
      for (j = 0; j < m; j++)
        acc[j] = acc[j] / div;
    tile_out(dst, base, m, out_dtype, acc, simd);
  }
}
