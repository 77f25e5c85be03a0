/*
 * AVX2 block codec.  Output is bitwise identical to the scalar reference
 * (quant_scalar.c, rules in docs/format.md) because every vector step is
 * one exact or correctly rounded IEEE operation that the scalar path also
 * performs:
 *   - absmax is an integer max of (bits & 0x7fffffff), as in the scalar path;
 *   - min/max are order-free (zero signs do not matter: asym_params
 *     canonicalises -0, and range = mx - mn is the same for either zero);
 *   - the block parameters come from zpp_qm_sym_params/zpp_qm_asym_params;
 *   - sub, mul, div, min, max and cvtps2dq run in the default MXCSR mode
 *     (round to nearest even), as the scalar magic-number rint does;
 *   - decode is mul then add (never fused: see the pragma below);
 *   - fp16 output uses vcvtps2ph imm 0, which zpp_qm_f32_to_f16 mirrors
 *     (checked on all 2^32 inputs, NaN quietening included); bf16 output
 *     uses the integer rounding of zpp_qm_f32_to_bf16;
 *   - INT4 to fp16/bf16 looks the 16 values of a block up in a table
 *     built with the same arithmetic;
 *   - the integer-sum encode packs INT4 codes through signed packs (exact:
 *     the codes fit in int8), 32 at a time, and for bf16 INT4 rounded to
 *     nearest without a residual widens by a shift and a mask (exact),
 *     64 at a time.
 * Blocks shorter than one vector, and the last (< 8) elements of a block,
 * go through the shared scalar code.
 *
 * Only the functions below carry the AVX2 target attribute: the rest of the
 * library stays baseline x86-64, and the table is handed out only when the
 * CPU (and OS) support AVX2, FMA and F16C.
 */
/* Bitwise equality needs mul and add kept apart, whatever the build flags:
 * with contraction allowed, GCC fuses the intrinsics (and quant_math.h's
 * zero + q * scale) into FMA under these targets.  Before any include, so
 * every function of this file is compiled alike. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant_cpu.h"
#include "quant_math.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <immintrin.h>

#define ZPP_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define ZPP_AVX2_INLINE static inline __attribute__((always_inline)) ZPP_AVX2_TARGET

/* Elements per vector step; shorter blocks take the scalar path. */
#define ZPP_AVX2_MIN_BLOCK 8u

/* ---- horizontal reductions ---------------------------------------------- */

ZPP_AVX2_INLINE uint32_t hmax_epu32(__m256i v) {
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(v),
                            _mm256_extracti128_si256(v, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX2_INLINE uint16_t hmax_epu16(__m256i v) {
  __m128i h = _mm_max_epu16(_mm256_castsi256_si128(v),
                            _mm256_extracti128_si256(v, 1));
  h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0xb1));
  h = _mm_max_epu16(h, _mm_shufflelo_epi16(h, 0xb1));
  return (uint16_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX2_INLINE int16_t hmin_epi16(__m256i v) {
  __m128i h = _mm_min_epi16(_mm256_castsi256_si128(v),
                            _mm256_extracti128_si256(v, 1));
  h = _mm_min_epi16(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_min_epi16(h, _mm_shuffle_epi32(h, 0xb1));
  h = _mm_min_epi16(h, _mm_shufflelo_epi16(h, 0xb1));
  return (int16_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX2_INLINE int16_t hmax_epi16(__m256i v) {
  __m128i h = _mm_max_epi16(_mm256_castsi256_si128(v),
                            _mm256_extracti128_si256(v, 1));
  h = _mm_max_epi16(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epi16(h, _mm_shuffle_epi32(h, 0xb1));
  h = _mm_max_epi16(h, _mm_shufflelo_epi16(h, 0xb1));
  return (int16_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX2_INLINE float hmin_ps(__m256 v) {
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_min_ps(h, _mm_shuffle_ps(h, h, 0x4e));
  h = _mm_min_ps(h, _mm_shuffle_ps(h, h, 0xb1));
  return _mm_cvtss_f32(h);
}

ZPP_AVX2_INLINE float hmax_ps(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_shuffle_ps(h, h, 0x4e));
  h = _mm_max_ps(h, _mm_shuffle_ps(h, h, 0xb1));
  return _mm_cvtss_f32(h);
}

/* ---- scalar element reads ------------------------------------------------ */

/* Buffers may have any alignment: scalar reads go through memcpy. */
ZPP_AVX2_INLINE uint32_t ld_bits32(const float *x, size_t i) {
  uint32_t u;
  memcpy(&u, (const unsigned char *)x + 4 * i, 4);
  return u;
}

ZPP_AVX2_INLINE float ld_f32(const float *x, size_t i) {
  float f;
  memcpy(&f, (const unsigned char *)x + 4 * i, 4);
  return f;
}

ZPP_AVX2_INLINE uint16_t ld_u16(const uint16_t *x, size_t i) {
  uint16_t h;
  memcpy(&h, (const unsigned char *)x + 2 * i, 2);
  return h;
}

/* ---- loads ---------------------------------------------------------------- */

/* Elements [i, i+8) of a `dtype` buffer as fp32 (exact conversions;
 * vcvtph2ps quietens a signalling NaN where zpp_qm_f16_to_f32 does not,
 * which cannot show: blocks holding a NaN are never quantized). */
ZPP_AVX2_INLINE __m256 load8(const void *src, size_t i, int dtype) {
  if (dtype == ZPP_QM_F32)
    return _mm256_loadu_ps((const float *)src + i);
  {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + i));
    if (dtype == ZPP_QM_F16)
      return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

/* ---- block statistics (pass 1) ------------------------------------------- */

/* Largest (bits & 0x7fffffff) over an fp32 block, as the scalar path. */
ZPP_AVX2_INLINE uint32_t absmax_f32(const float *x, size_t len) {
  const __m256i mask = _mm256_set1_epi32((int)ZPP_QM_ABS_MASK);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  uint32_t r;
  for (; i + 32 <= len; i += 32) {
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), mask));
    a1 = _mm256_max_epu32(a1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 8)), mask));
    a2 = _mm256_max_epu32(a2, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 16)), mask));
    a3 = _mm256_max_epu32(a3, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 24)), mask));
  }
  for (; i + 8 <= len; i += 8)
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), mask));
  r = hmax_epu32(_mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3)));
  for (; i < len; i++) {
    uint32_t u = ld_bits32(x, i) & ZPP_QM_ABS_MASK;
    r = u > r ? u : r;
  }
  return r;
}

/* Largest (bits & 0x7fff) over an fp16 or bf16 block.  Both are
 * sign-magnitude, so this is the element of largest |x| (NaN above Inf). */
ZPP_AVX2_INLINE uint16_t absmax_u16(const uint16_t *x, size_t len) {
  const __m256i mask = _mm256_set1_epi16(0x7fff);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  size_t i = 0;
  uint16_t r;
  for (; i + 32 <= len; i += 32) {
    a0 = _mm256_max_epu16(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), mask));
    a1 = _mm256_max_epu16(a1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 16)), mask));
  }
  for (; i + 16 <= len; i += 16)
    a0 = _mm256_max_epu16(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), mask));
  r = hmax_epu16(_mm256_max_epu16(a0, a1));
  for (; i < len; i++) {
    uint16_t h = ld_u16(x, i), u = (uint16_t)(h & 0x7fffu);
    r = u > r ? u : r;
  }
  return r;
}

/* fp32 bits of the largest |x| of a block, exactly as the scalar path
 * computes it (conversions to fp32 are exact and monotonic in |x|). */
ZPP_AVX2_INLINE uint32_t block_absmax(const void *src, size_t off, size_t len,
                                      int dtype) {
  uint16_t h;
  if (dtype == ZPP_QM_F32)
    return absmax_f32((const float *)src + off, len);
  h = absmax_u16((const uint16_t *)src + off, len);
  if (dtype == ZPP_QM_BF16)
    return (uint32_t)h << 16;
  return zpp_qm_f32_bits(zpp_qm_f16_to_f32(h));
}

/* Minimum and maximum over the finite elements and the non-finite flag
 * (the scalar path's loop).  When the block holds Inf or NaN the min/max
 * returned may be anything: asym_params ignores them then. */
ZPP_AVX2_INLINE void minmax_f32(const float *x, size_t len, float *mn_out,
                                float *mx_out, int *nonfinite) {
  const __m256i mask = _mm256_set1_epi32((int)ZPP_QM_ABS_MASK);
  __m256 v0 = _mm256_loadu_ps(x);
  __m256 mn0 = v0, mx0 = v0, mn1 = v0, mx1 = v0;
  __m256i a0 = _mm256_and_si256(_mm256_castps_si256(v0), mask), a1 = a0;
  size_t i = 8;
  float mn, mx;
  uint32_t amax;
  for (; i + 16 <= len; i += 16) {
    __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
    mn0 = _mm256_min_ps(mn0, v);
    mx0 = _mm256_max_ps(mx0, v);
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(v), mask));
    mn1 = _mm256_min_ps(mn1, w);
    mx1 = _mm256_max_ps(mx1, w);
    a1 = _mm256_max_epu32(a1, _mm256_and_si256(_mm256_castps_si256(w), mask));
  }
  for (; i + 8 <= len; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    mn0 = _mm256_min_ps(mn0, v);
    mx0 = _mm256_max_ps(mx0, v);
    a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(v), mask));
  }
  mn = hmin_ps(_mm256_min_ps(mn0, mn1));
  mx = hmax_ps(_mm256_max_ps(mx0, mx1));
  amax = hmax_epu32(_mm256_max_epu32(a0, a1));
  for (; i < len; i++) {
    uint32_t u = ld_bits32(x, i) & ZPP_QM_ABS_MASK;
    amax = u > amax ? u : amax;
    float f = ld_f32(x, i);
    mn = f < mn ? f : mn;
    mx = f > mx ? f : mx;
  }
  *nonfinite = amax >= ZPP_QM_EXP_MASK;
  *mn_out = mn;
  *mx_out = mx;
}

/* The same for fp16/bf16, on the 16-bit patterns: t = h ^ ((h >> 15) &
 * 0x7fff) maps sign-magnitude to two's complement order (only -0 < +0
 * differs from float order, which does not matter, see above).  In that
 * order +Inf/+NaN lie above every finite value and -Inf/-NaN below, so
 * the block holds a non-finite element iff its min or max is one. */
ZPP_AVX2_INLINE void minmax_u16(const uint16_t *x, size_t len, int dtype,
                                float *mn_out, float *mx_out, int *nonfinite) {
  const __m256i mag = _mm256_set1_epi16(0x7fff);
  __m256i mn = _mm256_set1_epi16(INT16_MAX), mx = _mm256_set1_epi16(INT16_MIN);
  size_t i = 0;
  int16_t tmn, tmx;
  uint16_t a, hmn, hmx;
  float fmn, fmx;
  for (; i + 16 <= len; i += 16) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
    __m256i t = _mm256_xor_si256(v, _mm256_and_si256(_mm256_srai_epi16(v, 15), mag));
    mn = _mm256_min_epi16(mn, t);
    mx = _mm256_max_epi16(mx, t);
  }
  if (i == 0) { /* shorter than one vector: start from element 0 */
    uint16_t h0 = ld_u16(x, 0);
    mn = mx = _mm256_set1_epi16((int16_t)(h0 ^ ((h0 & 0x8000u) ? 0x7fffu : 0u)));
  }
  tmn = hmin_epi16(mn);
  tmx = hmax_epi16(mx);
  hmn = (uint16_t)((uint16_t)tmn ^ (tmn < 0 ? 0x7fffu : 0u));
  hmx = (uint16_t)((uint16_t)tmx ^ (tmx < 0 ? 0x7fffu : 0u));
  a = (uint16_t)(hmn & 0x7fffu); /* largest |h| of the extremes */
  if ((hmx & 0x7fffu) > a)
    a = (uint16_t)(hmx & 0x7fffu);
  if (dtype == ZPP_QM_BF16) {
    fmn = zpp_qm_bf16_to_f32(hmn);
    fmx = zpp_qm_bf16_to_f32(hmx);
  } else {
    fmn = zpp_qm_f16_to_f32(hmn);
    fmx = zpp_qm_f16_to_f32(hmx);
  }
  for (; i < len; i++) {
    float f;
    uint16_t h = ld_u16(x, i), u = (uint16_t)(h & 0x7fffu);
    a = u > a ? u : a;
    f = dtype == ZPP_QM_BF16 ? zpp_qm_bf16_to_f32(h) : zpp_qm_f16_to_f32(h);
    fmn = f < fmn ? f : fmn;
    fmx = f > fmx ? f : fmx;
  }
  *nonfinite = a >= (dtype == ZPP_QM_BF16 ? 0x7f80u : 0x7c00u);
  *mn_out = fmn;
  *mx_out = fmx;
}

/* ---- quantize (pass 2) ------------------------------------------------------ */

typedef struct {
  __m256 zero, inv, scale, lo, hi;
} qvec_t;

ZPP_AVX2_INLINE void set_qvec(qvec_t *v, const zpp_qm_params_t *p) {
  v->zero = _mm256_set1_ps(p->zero);
  v->inv = _mm256_set1_ps(p->inv);
  v->scale = _mm256_set1_ps(p->scale);
  v->lo = _mm256_set1_ps(p->lo);
  v->hi = _mm256_set1_ps(p->hi);
}

/* Codes of 8 elements: zpp_qm_quantize lane by lane.  Symmetric blocks
 * skip the subtraction of zero (+0), which is exact.  max/min give the
 * scalar clamp's value (they differ only in the sign of a zero, and codes
 * are integers).
 *
 * The clamp is only needed for the DIV kind (scale raised to 2^-149).  For
 * the MUL kind it cannot change a code, so it is skipped (it costs about a
 * quarter of the in-cache encode time): with L = qmax (sym) or levels
 * (asym), R = absmax or range, inv = fl(L / R) is a normal float (L / R >=
 * 7 / FLT_MAX > FLT_MIN), so inv <= (L / R)(1 + 2^-24); every |v| <= R
 * (asym: 0 <= fl(x - zero) <= fl(mx - mn) = R, rounding is monotonic), so
 * |fl(v * inv)| <= fl(R * inv) <= L (1 + 2^-24)^2 < L + 1/2, and the
 * nearest-even integer is already within [-L, L] (sym) or [0, L] (asym).
 * The bitwise tests put elements at +-absmax in every block. */
ZPP_AVX2_INLINE __m256i quant8(__m256 x, const qvec_t *p, int asym, int div) {
  if (asym)
    x = _mm256_sub_ps(x, p->zero);
  x = div ? _mm256_div_ps(x, p->scale) : _mm256_mul_ps(x, p->inv);
  if (div)
    x = _mm256_min_ps(_mm256_max_ps(x, p->lo), p->hi);
  return _mm256_cvtps_epi32(x); /* MXCSR default: nearest even */
}

/* 32 codes (elements in order in q0..q3) to 32 bytes in order.  packs
 * works within 128-bit lanes; the permutation puts the dwords back. */
ZPP_AVX2_INLINE __m256i pack32(__m256i q0, __m256i q1, __m256i q2, __m256i q3,
                               int asym) {
  __m256i a = _mm256_packs_epi32(q0, q1);
  __m256i b = _mm256_packs_epi32(q2, q3);
  __m256i c = asym ? _mm256_packus_epi16(a, b) : _mm256_packs_epi16(a, b);
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 codes to 8 bytes in the low half. */
ZPP_AVX2_INLINE __m128i pack8(__m256i q, int asym) {
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  return asym ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
}

/* Code bytes -> INT4: in each 16-bit word (even element low byte, odd
 * element high byte) the packed byte (lo & 0xf) | (hi << 4). */
ZPP_AVX2_INLINE __m256i nibbles256(__m256i b) {
  return _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi16(0x000f)),
                         _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00f0)));
}

ZPP_AVX2_INLINE __m128i nibbles128(__m128i b) {
  return _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x000f)),
                      _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi16(0x00f0)));
}

/* Elements [i, i+32) as four fp32 vectors.  bf16 is widened by
 * interleaving with zero words, which leaves the elements in the lane
 * order [0-3 | 8-11], [4-7 | 12-15], [16-19 | 24-27], [20-23 | 28-31] that
 * packs_epi32 undoes (see pack32_loaded); the other dtypes are in order. */
ZPP_AVX2_INLINE void load32(const void *src, size_t i, int dtype, __m256 x[4]) {
  if (dtype == ZPP_QM_BF16) {
    const __m256i *p = (const __m256i *)((const uint16_t *)src + i);
    __m256i h0 = _mm256_loadu_si256(p), h1 = _mm256_loadu_si256(p + 1);
    __m256i z = _mm256_setzero_si256();
    x[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h0));
    x[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h0));
    x[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h1));
    x[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h1));
  } else {
    x[0] = load8(src, i, dtype);
    x[1] = load8(src, i + 8, dtype);
    x[2] = load8(src, i + 16, dtype);
    x[3] = load8(src, i + 24, dtype);
  }
}

/* The 32 codes of load32's vectors as 32 bytes in element order. */
ZPP_AVX2_INLINE __m256i pack32_loaded(__m256i q[4], int dtype, int asym) {
  if (dtype == ZPP_QM_BF16) {
    __m256i a = _mm256_packs_epi32(q[0], q[1]); /* elements 0-15 in order */
    __m256i b = _mm256_packs_epi32(q[2], q[3]); /* 16-31 */
    __m256i c = asym ? _mm256_packus_epi16(a, b) : _mm256_packs_epi16(a, b);
    return _mm256_permute4x64_epi64(c, 0xd8); /* qwords 0, 2, 1, 3 */
  }
  return pack32(q[0], q[1], q[2], q[3], asym);
}

/* Code bytes of elements [i, i+32), in order. */
ZPP_AVX2_INLINE __m256i codes32(const void *src, size_t i, int dtype,
                                const qvec_t *v, int asym, int div) {
  __m256 x[4];
  __m256i q[4];
  int k;
  load32(src, i, dtype, x);
  for (k = 0; k < 4; k++)
    q[k] = quant8(x[k], v, asym, div);
  return pack32_loaded(q, dtype, asym);
}

/* Payload of one finite block of len >= 8 elements. */
ZPP_AVX2_INLINE void quant_block(const void *src, size_t off, size_t len,
                                 int dtype, int bits, int asym, int div,
                                 const zpp_qm_params_t *p, uint8_t *out) {
  qvec_t v;
  size_t i = 0;
  set_qvec(&v, p);
  if (bits == 8) {
    for (; i + 32 <= len; i += 32)
      _mm256_storeu_si256((__m256i *)(out + i),
                          codes32(src, off + i, dtype, &v, asym, div));
    for (; i + 8 <= len; i += 8)
      _mm_storel_epi64((__m128i *)(out + i),
                       pack8(quant8(load8(src, off + i, dtype), &v, asym, div), asym));
    for (; i < len; i++)
      out[i] = zpp_qm_code_bits(zpp_qm_quantize(zpp_qm_load(src, off + i, dtype), p));
  } else {
    for (; i + 64 <= len; i += 64) {
      __m256i b0 = nibbles256(codes32(src, off + i, dtype, &v, asym, div));
      __m256i b1 = nibbles256(codes32(src, off + i + 32, dtype, &v, asym, div));
      /* packus works per lane: qwords come out as 0, 2, 1, 3 */
      _mm256_storeu_si256((__m256i *)(out + i / 2),
                          _mm256_permute4x64_epi64(_mm256_packus_epi16(b0, b1), 0xd8));
    }
    for (; i + 32 <= len; i += 32) {
      __m256i b0 = nibbles256(codes32(src, off + i, dtype, &v, asym, div));
      _mm_storeu_si128((__m128i *)(out + i / 2),
                       _mm_packus_epi16(_mm256_castsi256_si128(b0),
                                        _mm256_extracti128_si256(b0, 1)));
    }
    for (; i + 8 <= len; i += 8) {
      __m128i n = nibbles128(pack8(quant8(load8(src, off + i, dtype), &v, asym, div), asym));
      uint32_t w = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(n, n));
      memcpy(out + i / 2, &w, 4);
    }
    for (; i < len; i += 2) { /* i is even here */
      uint8_t lo = zpp_qm_code_bits(zpp_qm_quantize(zpp_qm_load(src, off + i, dtype), p));
      uint8_t hi = 0;
      if (i + 1 < len)
        hi = zpp_qm_code_bits(zpp_qm_quantize(zpp_qm_load(src, off + i + 1, dtype), p));
      out[i / 2] = (uint8_t)((lo & 0xfu) | (uint8_t)(hi << 4));
    }
  }
}

/* A whole block of exactly 32 elements, loaded once and kept in registers
 * (small blocks are dominated by per-block work).  The statistics are
 * taken on the fp32 values, which is exact: the conversions are exact and
 * keep Inf/NaN non-finite. */
ZPP_AVX2_INLINE void encode_block32(const void *src, size_t off, int dtype,
                                    int bits, int asym, uint8_t *meta,
                                    uint8_t *payload) {
  const __m256i mask = _mm256_set1_epi32((int)ZPP_QM_ABS_MASK);
  __m256 x[4];
  __m256i a;
  zpp_qm_params_t p;
  load32(src, off, dtype, x);
  a = _mm256_max_epu32(
      _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(x[0]), mask),
                       _mm256_and_si256(_mm256_castps_si256(x[1]), mask)),
      _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(x[2]), mask),
                       _mm256_and_si256(_mm256_castps_si256(x[3]), mask)));
  if (asym) {
    /* NaN lanes may leak into min/max: the block is non-finite then */
    float mn = hmin_ps(_mm256_min_ps(_mm256_min_ps(x[0], x[1]), _mm256_min_ps(x[2], x[3])));
    float mx = hmax_ps(_mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3])));
    p = zpp_qm_asym_params(mn, mx, hmax_epu32(a) >= ZPP_QM_EXP_MASK, bits);
  } else {
    p = zpp_qm_sym_params(hmax_epu32(a), bits);
  }
  memcpy(meta, &p.scale, 4);
  if (asym)
    memcpy(meta + 4, &p.zero, 4);
  if (p.kind <= ZPP_QM_KIND_DIV) {
    qvec_t v;
    __m256i q[4], c;
    int k, div = p.kind == ZPP_QM_KIND_DIV;
    set_qvec(&v, &p);
    for (k = 0; k < 4; k++)
      q[k] = div ? quant8(x[k], &v, asym, 1) : quant8(x[k], &v, asym, 0);
    c = pack32_loaded(q, dtype, asym);
    if (bits == 8) {
      _mm256_storeu_si256((__m256i *)payload, c);
    } else {
      c = nibbles256(c);
      _mm_storeu_si128((__m128i *)payload,
                       _mm_packus_epi16(_mm256_castsi256_si128(c),
                                        _mm256_extracti128_si256(c, 1)));
    }
  } else {
    memset(payload, 0, bits == 8 ? 32 : 16);
  }
}

/* One block of len >= 8 elements: parameters, metadata, payload. */
ZPP_AVX2_INLINE void encode_block(const void *src, size_t off, size_t len,
                                  int dtype, int bits, int asym, uint8_t *meta,
                                  uint8_t *payload) {
  zpp_qm_params_t p;
  if (asym) {
    float mn, mx;
    int nonfinite;
    if (dtype == ZPP_QM_F32)
      minmax_f32((const float *)src + off, len, &mn, &mx, &nonfinite);
    else
      minmax_u16((const uint16_t *)src + off, len, dtype, &mn, &mx, &nonfinite);
    p = zpp_qm_asym_params(mn, mx, nonfinite, bits);
  } else {
    p = zpp_qm_sym_params(block_absmax(src, off, len, dtype), bits);
  }
  memcpy(meta, &p.scale, 4);
  if (asym)
    memcpy(meta + 4, &p.zero, 4);
  if (p.kind == ZPP_QM_KIND_MUL)
    quant_block(src, off, len, dtype, bits, asym, 0, &p, payload);
  else if (p.kind == ZPP_QM_KIND_DIV)
    quant_block(src, off, len, dtype, bits, asym, 1, &p, payload);
  else /* constant or non-finite: every code 0 */
    memset(payload, 0, zpp_qm_payload_bytes(len, bits));
}

ZPP_AVX2_INLINE void encode_all(const zpp_qcfg_t *cfg, int dtype,
                                const void *src, size_t count, uint8_t *dst,
                                int bits, int asym) {
  size_t nb = zpp_quant_nblocks(cfg, count);
  size_t mb = zpp_qm_meta_bytes(asym);
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits);
  uint8_t *payload = dst + nb * mb;
  size_t es = zpp_qm_dtype_bytes(dtype), pf = 0, b;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    zpp_qcpu_prefetch(src, &pf, (off + len) * es + ZPP_QCPU_PREFETCH_AHEAD,
                      count * es);
    if (len < ZPP_AVX2_MIN_BLOCK) /* only the tail block can be here */
      zpp_quant_encode_blocks_scalar(cfg, dtype, src, count, b, b + 1, dst);
    else if (len == 32)
      encode_block32(src, off, dtype, bits, asym, dst + b * mb, payload + b * pb);
    else
      encode_block(src, off, len, dtype, bits, asym, dst + b * mb,
                   payload + b * pb);
  }
}

/* ---- stochastic rounding (docs/format.md) -------------------------------
 * zpp_qm_quantize_sr lane by lane: the same scaled value v as the scalar
 * path (always clamped: with the MUL kind v may exceed L by a few ulps,
 * which rounding to nearest absorbs but a floor plus one would not), the
 * exact floor (vroundps toward -inf = the scalar rint-minus-one), the
 * exact fraction v - f, and u = r24 * 2^-24 (exact: r24 < 2^24) compared
 * with it.  The random bits come from the same 32-bit integer mixing
 * (vpmulld is the low 32 bits of the product, as the scalar uint32_t
 * multiplication). */

ZPP_AVX2_INLINE __m256i mix32x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x7feb352du));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* zpp_qm_rand24 of indices idx0 .. idx0 + 7 (their high words equal). */
ZPP_AVX2_INLINE __m256i rand24x8(const zpp_qcfg_t *cfg, uint64_t idx0) {
  __m256i lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)idx0),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i x = mix32x8(_mm256_xor_si256(lo, _mm256_set1_epi32((int)cfg->k0)));
  x = _mm256_xor_si256(
      x, _mm256_set1_epi32((int)((uint32_t)(idx0 >> 32) ^ cfg->k1)));
  return _mm256_srli_epi32(mix32x8(x), 8);
}

ZPP_AVX2_INLINE __m256i quant8_sr(__m256 x, const qvec_t *p, int asym,
                                  int div, __m256i r24) {
  __m256 f, frac, u;
  __m256i up;
  if (asym)
    x = _mm256_sub_ps(x, p->zero);
  x = div ? _mm256_div_ps(x, p->scale) : _mm256_mul_ps(x, p->inv);
  x = _mm256_min_ps(_mm256_max_ps(x, p->lo), p->hi);
  f = _mm256_floor_ps(x);
  frac = _mm256_sub_ps(x, f);
  u = _mm256_mul_ps(_mm256_cvtepi32_ps(r24), _mm256_set1_ps(5.9604644775390625e-08f));
  up = _mm256_castps_si256(_mm256_cmp_ps(u, frac, _CMP_LT_OQ)); /* -1 or 0 */
  return _mm256_sub_epi32(_mm256_cvttps_epi32(f), up);
}

/* One block with stochastic rounding: parameters as encode_block, then
 * 8 elements at a time; the rest (and any 8 whose indices cross a 2^32
 * boundary) through the scalar code. */
ZPP_AVX2_INLINE void encode_block_sr(const zpp_qcfg_t *cfg, const void *src,
                                     size_t off, size_t len, int dtype,
                                     int bits, int asym, uint8_t *meta,
                                     uint8_t *payload) {
  zpp_qm_params_t p;
  zpp_qm_keys_t k = {cfg->k0, cfg->k1};
  qvec_t v;
  size_t i = 0;
  int div;
  if (asym) {
    float mn, mx;
    int nonfinite;
    if (dtype == ZPP_QM_F32)
      minmax_f32((const float *)src + off, len, &mn, &mx, &nonfinite);
    else
      minmax_u16((const uint16_t *)src + off, len, dtype, &mn, &mx, &nonfinite);
    p = zpp_qm_asym_params(mn, mx, nonfinite, bits);
  } else {
    p = zpp_qm_sym_params(block_absmax(src, off, len, dtype), bits);
  }
  memcpy(meta, &p.scale, 4);
  if (asym)
    memcpy(meta + 4, &p.zero, 4);
  if (p.kind > ZPP_QM_KIND_DIV) {
    memset(payload, 0, zpp_qm_payload_bytes(len, bits));
    return;
  }
  div = p.kind == ZPP_QM_KIND_DIV;
  set_qvec(&v, &p);
  for (; i + 8 <= len; i += 8) {
    uint64_t idx = cfg->base + off + i;
    __m128i c;
    if ((uint32_t)idx > 0xfffffff8u)
      break; /* the high word changes inside these 8: scalar below */
    c = pack8(quant8_sr(load8(src, off + i, dtype), &v, asym, div,
                        rand24x8(cfg, idx)),
              asym);
    if (bits == 8) {
      _mm_storel_epi64((__m128i *)(payload + i), c);
    } else {
      __m128i n = nibbles128(c);
      uint32_t w = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(n, n));
      memcpy(payload + i / 2, &w, 4);
    }
  }
  for (; i < len; i++) {
    uint8_t c = zpp_qm_code_bits(zpp_qm_quantize_sr(
        zpp_qm_load(src, off + i, dtype), &p,
        zpp_qm_rand24(k, cfg->base + off + i)));
    if (bits == 8)
      payload[i] = c;
    else if (i % 2 == 0)
      payload[i / 2] = (uint8_t)(c & 0xfu);
    else
      payload[i / 2] = (uint8_t)(payload[i / 2] | (uint8_t)(c << 4));
  }
}

ZPP_AVX2_INLINE void encode_all_sr(const zpp_qcfg_t *cfg, int dtype,
                                   const void *src, size_t count, uint8_t *dst,
                                   int bits, int asym) {
  size_t nb = zpp_quant_nblocks(cfg, count);
  size_t mb = zpp_qm_meta_bytes(asym);
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits);
  size_t es = zpp_qm_dtype_bytes(dtype), pf = 0, b;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    zpp_qcpu_prefetch(src, &pf, (off + len) * es + ZPP_QCPU_PREFETCH_AHEAD,
                      count * es);
    if (len < ZPP_AVX2_MIN_BLOCK)
      zpp_quant_encode_blocks_scalar(cfg, dtype, src, count, b, b + 1, dst);
    else
      encode_block_sr(cfg, src, off, len, dtype, bits, asym, dst + b * mb,
                      dst + nb * mb + b * pb);
  }
}

#define ZPP_AVX2_ENCODE_CASE(name, dt, bits, asym)                            \
  static ZPP_AVX2_TARGET void name(const zpp_qcfg_t *cfg, const void *src,    \
                                   size_t count, uint8_t *dst) {              \
    if (cfg->sr)                                                              \
      encode_all_sr(cfg, dt, src, count, dst, bits, asym);                    \
    else                                                                      \
      encode_all(cfg, dt, src, count, dst, bits, asym);                       \
  }
ZPP_AVX2_ENCODE_CASE(enc_f32_8s, ZPP_QM_F32, 8, 0)
ZPP_AVX2_ENCODE_CASE(enc_f32_8a, ZPP_QM_F32, 8, 1)
ZPP_AVX2_ENCODE_CASE(enc_f32_4s, ZPP_QM_F32, 4, 0)
ZPP_AVX2_ENCODE_CASE(enc_f32_4a, ZPP_QM_F32, 4, 1)
ZPP_AVX2_ENCODE_CASE(enc_f16_8s, ZPP_QM_F16, 8, 0)
ZPP_AVX2_ENCODE_CASE(enc_f16_8a, ZPP_QM_F16, 8, 1)
ZPP_AVX2_ENCODE_CASE(enc_f16_4s, ZPP_QM_F16, 4, 0)
ZPP_AVX2_ENCODE_CASE(enc_f16_4a, ZPP_QM_F16, 4, 1)
ZPP_AVX2_ENCODE_CASE(enc_bf16_8s, ZPP_QM_BF16, 8, 0)
ZPP_AVX2_ENCODE_CASE(enc_bf16_8a, ZPP_QM_BF16, 8, 1)
ZPP_AVX2_ENCODE_CASE(enc_bf16_4s, ZPP_QM_BF16, 4, 0)
ZPP_AVX2_ENCODE_CASE(enc_bf16_4a, ZPP_QM_BF16, 4, 1)

typedef void (*encode_case_fn)(const zpp_qcfg_t *, const void *, size_t,
                               uint8_t *);

/* Indexed [dtype][bits == 4][asym]. */
static const encode_case_fn encode_cases[3][2][2] = {
    {{enc_f32_8s, enc_f32_8a}, {enc_f32_4s, enc_f32_4a}},
    {{enc_f16_8s, enc_f16_8a}, {enc_f16_4s, enc_f16_4a}},
    {{enc_bf16_8s, enc_bf16_8a}, {enc_bf16_4s, enc_bf16_4a}}};

static void encode_avx2(const zpp_qcfg_t *cfg, int dtype, const void *src,
                        size_t count, uint8_t *dst) {
  if (cfg->block < ZPP_AVX2_MIN_BLOCK) {
    zpp_quant_encode_scalar(cfg, dtype, src, count, dst);
    return;
  }
  encode_cases[dtype][cfg->bits == 4][cfg->asym != 0](cfg, src, count, dst);
}

/* ---- decode ---------------------------------------------------------------- */

/* fp32 -> bf16 (zpp_qm_f32_to_bf16) of 8 lanes, as 32-bit lanes holding
 * the 16-bit result.  `nan` 0 when no lane can be NaN (see decode_block). */
ZPP_AVX2_INLINE __m256i bf16_lanes(__m256 v, int nan) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  if (nan) { /* NaN: quietened, sign and top payload kept */
    __m256i is_nan = _mm256_cmpgt_epi32(
        _mm256_and_si256(u, _mm256_set1_epi32((int)ZPP_QM_ABS_MASK)),
        _mm256_set1_epi32((int)ZPP_QM_EXP_MASK));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    r = _mm256_blendv_epi8(r, q, is_nan);
  }
  return r;
}

/* Stores decoded elements [i, i+8). */
ZPP_AVX2_INLINE void store8(void *dst, size_t i, int out_kind, int nan, __m256 v) {
  if (out_kind == ZPP_QM_F32) {
    _mm256_storeu_ps((float *)dst + i, v);
  } else if (out_kind == ZPP_QM_OUT_ACC) {
    float *a = (float *)dst + i;
    _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), v)); /* acc + v */
  } else if (out_kind == ZPP_QM_F16) {
    _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    __m256i r = bf16_lanes(v, nan);
    _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(r),
                                      _mm256_extracti128_si256(r, 1)));
  }
}

/* Stores decoded elements [i, i+16); bf16 packs both vectors at once
 * (packus works per lane: qwords come out as 0, 2, 1, 3). */
ZPP_AVX2_INLINE void store16(void *dst, size_t i, int out_kind, int nan,
                             __m256 v0, __m256 v1) {
  if (out_kind == ZPP_QM_BF16) {
    __m256i p = _mm256_packus_epi32(bf16_lanes(v0, nan), bf16_lanes(v1, nan));
    _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i),
                        _mm256_permute4x64_epi64(p, 0xd8));
  } else {
    store8(dst, i, out_kind, nan, v0);
    store8(dst, i + 8, out_kind, nan, v1);
  }
}

/* Codes (8 bytes, low half of c) to decoded values: zero + q * scale. */
ZPP_AVX2_INLINE __m256 dequant8(__m128i c, int asym, __m256 scale, __m256 zero) {
  __m256i q = asym ? _mm256_cvtepu8_epi32(c) : _mm256_cvtepi8_epi32(c);
  return _mm256_add_ps(zero, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
}

/* 16 INT4 codes (8 bytes, low half of b) to 16 code bytes in element
 * order; symmetric nibbles are sign-extended ((n ^ 8) - 8). */
ZPP_AVX2_INLINE __m128i unpack_nibbles(__m128i b, int asym, int hi_half) {
  const __m128i m = _mm_set1_epi8(0x0f);
  __m128i lo = _mm_and_si128(b, m);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  __m128i e = hi_half ? _mm_unpackhi_epi8(lo, hi) : _mm_unpacklo_epi8(lo, hi);
  if (!asym)
    e = _mm_sub_epi8(_mm_xor_si128(e, _mm_set1_epi8(8)), _mm_set1_epi8(8));
  return e;
}

/* The scalar loop body of zpp_quant_decode_blocks_scalar for one element. */
ZPP_AVX2_INLINE void decode_one(const uint8_t *payload, size_t i, int bits,
                                int asym, float scale, float zero, void *dst,
                                size_t j, int out_kind) {
  uint32_t stored = bits == 8 ? payload[i] : (payload[i / 2] >> (4 * (i & 1))) & 0xfu;
  float v = zpp_qm_dequantize(zpp_qm_code_value(stored, bits, asym), scale, zero);
  if (out_kind == ZPP_QM_OUT_ACC)
    zpp_qm_store(dst, j, ZPP_QM_F32, zpp_qm_add(zpp_qm_load(dst, j, ZPP_QM_F32), v));
  else
    zpp_qm_store(dst, j, out_kind, v);
}

/* INT4 to fp16/bf16: a block has only 16 decoded values, so they are
 * computed once per block with the same vector arithmetic (lane k holds
 * the value of stored nibble k) and the elements are looked up with
 * pshufb, low and high output bytes from two 16-byte tables. */
ZPP_AVX2_INLINE void decode_block_lut4(const uint8_t *in, size_t off,
                                       size_t len, int asym, int out_kind,
                                       __m256 vs, __m256 vz, void *dst) {
  /* stored nibble k -> code: k (asym), ((k ^ 8) & 0xf) - 8 (sym) */
  const __m128i k = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m128i codes = asym ? k : _mm_sub_epi8(_mm_xor_si128(k, _mm_set1_epi8(8)), _mm_set1_epi8(8));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i odd = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256 v0 = dequant8(codes, asym, vs, vz), v1 = dequant8(_mm_srli_si128(codes, 8), asym, vs, vz);
  __m128i h0, h1, tl, th;
  __m256i TL, TH;
  size_t i = 0;
  if (out_kind == ZPP_QM_F16) {
    h0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT);
    h1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT);
  } else { /* NaN-aware: built once per block */
    __m256i r0 = bf16_lanes(v0, 1), r1 = bf16_lanes(v1, 1);
    h0 = _mm_packus_epi32(_mm256_castsi256_si128(r0), _mm256_extracti128_si256(r0, 1));
    h1 = _mm_packus_epi32(_mm256_castsi256_si128(r1), _mm256_extracti128_si256(r1, 1));
  }
  tl = _mm_unpacklo_epi64(_mm_shuffle_epi8(h0, even), _mm_shuffle_epi8(h1, even));
  th = _mm_unpacklo_epi64(_mm_shuffle_epi8(h0, odd), _mm_shuffle_epi8(h1, odd));
  TL = _mm256_broadcastsi128_si256(tl);
  TH = _mm256_broadcastsi128_si256(th);
  for (; i + 32 <= len; i += 32) {
    __m128i b = _mm_loadu_si128((const __m128i *)(in + i / 2));
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    /* lane 0: elements 0-15, lane 1: 16-31 */
    __m256i idx = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)),
                                          _mm_unpackhi_epi8(lo, hi), 1);
    __m256i L = _mm256_shuffle_epi8(TL, idx), H = _mm256_shuffle_epi8(TH, idx);
    __m256i o0 = _mm256_unpacklo_epi8(L, H); /* 0-7 | 16-23 */
    __m256i o1 = _mm256_unpackhi_epi8(L, H); /* 8-15 | 24-31 */
    uint16_t *d = (uint16_t *)dst + off + i;
    _mm256_storeu_si256((__m256i *)d, _mm256_permute2x128_si256(o0, o1, 0x20));
    _mm256_storeu_si256((__m256i *)(d + 16), _mm256_permute2x128_si256(o0, o1, 0x31));
  }
  for (; i + 8 <= len; i += 8) {
    uint32_t w;
    __m128i b, idx;
    memcpy(&w, in + i / 2, 4);
    b = _mm_cvtsi32_si128((int)w);
    idx = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    _mm_storeu_si128((__m128i *)((uint16_t *)dst + off + i),
                     _mm_unpacklo_epi8(_mm_shuffle_epi8(tl, idx), _mm_shuffle_epi8(th, idx)));
  }
  for (; i < len; i++) {
    uint32_t stored = (in[i / 2] >> (4 * (i & 1))) & 0xfu;
    float v = zpp_qm_dequantize(zpp_qm_code_value(stored, 4, asym), _mm256_cvtss_f32(vs),
                                _mm256_cvtss_f32(vz));
    zpp_qm_store(dst, off + i, out_kind, v);
  }
}

ZPP_AVX2_INLINE void decode_block(const uint8_t *meta, const uint8_t *in,
                                  size_t off, size_t len, int bits, int asym,
                                  int out_kind, int nan, void *dst) {
  float scale, zero = 0.0f;
  __m256 vs, vz;
  size_t i = 0;
  memcpy(&scale, meta, 4);
  if (asym)
    memcpy(&zero, meta + 4, 4);
  vs = _mm256_set1_ps(scale);
  vz = _mm256_set1_ps(zero);
  if (bits == 4 && (out_kind == ZPP_QM_F16 || out_kind == ZPP_QM_BF16)) {
    decode_block_lut4(in, off, len, asym, out_kind, vs, vz, dst);
    return;
  }
  if (bits == 8) {
    for (; i + 32 <= len; i += 32) {
      __m128i c0 = _mm_loadu_si128((const __m128i *)(in + i));
      __m128i c1 = _mm_loadu_si128((const __m128i *)(in + i + 16));
      store16(dst, off + i, out_kind, nan, dequant8(c0, asym, vs, vz),
              dequant8(_mm_srli_si128(c0, 8), asym, vs, vz));
      store16(dst, off + i + 16, out_kind, nan, dequant8(c1, asym, vs, vz),
              dequant8(_mm_srli_si128(c1, 8), asym, vs, vz));
    }
    for (; i + 8 <= len; i += 8)
      store8(dst, off + i, out_kind, nan,
             dequant8(_mm_loadl_epi64((const __m128i *)(in + i)), asym, vs, vz));
  } else {
    for (; i + 32 <= len; i += 32) {
      __m128i b = _mm_loadu_si128((const __m128i *)(in + i / 2));
      __m128i e0 = unpack_nibbles(b, asym, 0), e1 = unpack_nibbles(b, asym, 1);
      store16(dst, off + i, out_kind, nan, dequant8(e0, asym, vs, vz),
              dequant8(_mm_srli_si128(e0, 8), asym, vs, vz));
      store16(dst, off + i + 16, out_kind, nan, dequant8(e1, asym, vs, vz),
              dequant8(_mm_srli_si128(e1, 8), asym, vs, vz));
    }
    for (; i + 8 <= len; i += 8) {
      uint32_t w;
      memcpy(&w, in + i / 2, 4);
      store8(dst, off + i, out_kind, nan,
             dequant8(unpack_nibbles(_mm_cvtsi32_si128((int)w), asym, 0), asym, vs, vz));
    }
  }
  for (; i < len; i++)
    decode_one(in, i, bits, asym, scale, zero, dst, off + i, out_kind);
}

/* A decoded value zero + q * scale can be NaN only when scale or zero is
 * not finite (finite * integer is finite or +-Inf; finite + Inf is Inf). */
ZPP_AVX2_INLINE int meta_finite(const uint8_t *meta, int asym) {
  uint32_t s, z = 0;
  memcpy(&s, meta, 4);
  if (asym)
    memcpy(&z, meta + 4, 4);
  return (s & ZPP_QM_ABS_MASK) < ZPP_QM_EXP_MASK &&
         (z & ZPP_QM_ABS_MASK) < ZPP_QM_EXP_MASK;
}

ZPP_AVX2_INLINE void decode_all(const zpp_qcfg_t *cfg, const uint8_t *src,
                                size_t count, void *dst, int bits, int asym,
                                int out_kind) {
  size_t nb = zpp_quant_nblocks(cfg, count);
  size_t mb = zpp_qm_meta_bytes(asym);
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits);
  const uint8_t *payload = src + nb * mb;
  size_t b;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    const uint8_t *meta = src + b * mb;
    if (out_kind != ZPP_QM_BF16 || meta_finite(meta, asym))
      decode_block(meta, payload + b * pb, off, len, bits, asym, out_kind, 0, dst);
    else
      decode_block(meta, payload + b * pb, off, len, bits, asym, out_kind, 1, dst);
  }
}

#define ZPP_AVX2_DECODE_CASE(name, bits, asym, kind)                          \
  static ZPP_AVX2_TARGET void name(const zpp_qcfg_t *cfg, const uint8_t *src, \
                                   size_t count, void *dst) {                 \
    decode_all(cfg, src, count, dst, bits, asym, kind);                       \
  }
#define ZPP_AVX2_DECODE_KINDS(p, bits, asym)                                  \
  ZPP_AVX2_DECODE_CASE(p##_f32, bits, asym, ZPP_QM_F32)                       \
  ZPP_AVX2_DECODE_CASE(p##_f16, bits, asym, ZPP_QM_F16)                       \
  ZPP_AVX2_DECODE_CASE(p##_bf16, bits, asym, ZPP_QM_BF16)                     \
  ZPP_AVX2_DECODE_CASE(p##_acc, bits, asym, ZPP_QM_OUT_ACC)
ZPP_AVX2_DECODE_KINDS(dec_8s, 8, 0)
ZPP_AVX2_DECODE_KINDS(dec_8a, 8, 1)
ZPP_AVX2_DECODE_KINDS(dec_4s, 4, 0)
ZPP_AVX2_DECODE_KINDS(dec_4a, 4, 1)

typedef void (*decode_case_fn)(const zpp_qcfg_t *, const uint8_t *, size_t,
                               void *);

/* Indexed [bits == 4][asym][out_kind]; out_kind order F32, F16, BF16, ACC
 * (the values 0..3 of quant_math.h and quant_cpu.h). */
static const decode_case_fn decode_cases[2][2][4] = {
    {{dec_8s_f32, dec_8s_f16, dec_8s_bf16, dec_8s_acc},
     {dec_8a_f32, dec_8a_f16, dec_8a_bf16, dec_8a_acc}},
    {{dec_4s_f32, dec_4s_f16, dec_4s_bf16, dec_4s_acc},
     {dec_4a_f32, dec_4a_f16, dec_4a_bf16, dec_4a_acc}}};

static void decode_avx2(const zpp_qcfg_t *cfg, const uint8_t *src,
                        size_t count, int out_kind, void *dst) {
  if (cfg->block < ZPP_AVX2_MIN_BLOCK) {
    zpp_quant_decode_scalar(cfg, src, count, out_kind, dst);
    return;
  }
  decode_cases[cfg->bits == 4][cfg->asym != 0][out_kind](cfg, src, count, dst);
}

/* ---- compressed-domain sums (quant_cpu.h; docs/format.md, "Integer
 * sums") ------------------------------------------------------------------
 * As in quant_avx512.c, on 8 lanes: the scalar kernels' IEEE operations in
 * the same order (fl(x + res), fl(x * inv) clamped with max/min,
 * vcvtps2dq's nearest even; units fl(x * 2^-E); int16 products m q summed
 * as exact int32; decoded values 0 + q * scale).  The last (< 8)
 * elements of a block, and 8 whose stochastic indices cross a 2^32
 * boundary, take the scalar formulas of quant_math.h. */

ZPP_AVX2_INLINE __m256 isum_load8(const void *src, const float *res, size_t i,
                                  int dtype) {
  __m256 x = load8(src, i, dtype);
  return res != NULL ? _mm256_add_ps(x, _mm256_loadu_ps(res + i)) : x;
}

/* 0 in the lanes whose value is Inf or NaN (zpp_qm_ef_residual). */
ZPP_AVX2_INLINE __m256 finite_or_zero(__m256 r) {
  __m256i bad = _mm256_cmpgt_epi32(
      _mm256_and_si256(_mm256_castps_si256(r),
                       _mm256_set1_epi32((int)ZPP_QM_ABS_MASK)),
      _mm256_set1_epi32((int)ZPP_QM_EXP_MASK - 1));
  return _mm256_andnot_ps(_mm256_castsi256_ps(bad), r);
}

/* zpp_qm_feedback of 8 lanes: e old residual, x compensated value. */
ZPP_AVX2_INLINE __m256 feedback8(__m256 e, __m256 x, __m256i q, __m256 scale,
                                 float beta, float omega) {
  __m256 dec = _mm256_add_ps(_mm256_setzero_ps(),
                             _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
  __m256 d = _mm256_sub_ps(x, dec);
  if (beta == 0.0f)
    return finite_or_zero(d);
  return finite_or_zero(_mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(beta), e),
                                      _mm256_mul_ps(_mm256_set1_ps(omega), d)));
}

/* zpp_qm_quantize of a MUL-kind block, clamp included. */
ZPP_AVX2_INLINE __m256i iquant8(__m256 x, const qvec_t *p) {
  x = _mm256_mul_ps(x, p->inv);
  x = _mm256_min_ps(_mm256_max_ps(x, p->lo), p->hi);
  return _mm256_cvtps_epi32(x);
}

/* Stores 8 codes (element i, a multiple of 8, of the block). */
ZPP_AVX2_INLINE void put8(uint8_t *pl, size_t i, int bits, __m256i q) {
  __m128i c = pack8(q, 0); /* exact: the codes fit in int8 */
  if (bits == 8) {
    _mm_storel_epi64((__m128i *)(pl + i), c);
  } else {
    int32_t w =
        _mm_cvtsi128_si32(_mm_packus_epi16(nibbles128(c), nibbles128(c)));
    memcpy(pl + i / 2, &w, 4);
  }
}

ZPP_AVX2_INLINE void put1(uint8_t *pl, size_t i, int bits, int q) {
  uint8_t c = zpp_qm_code_bits(q);
  if (bits == 8)
    pl[i] = c;
  else if (i % 2 == 0)
    pl[i / 2] = (uint8_t)(c & 0xfu);
  else
    pl[i / 2] = (uint8_t)(pl[i / 2] | (uint8_t)(c << 4));
}

ZPP_AVX2_INLINE int get1(const uint8_t *pl, size_t i, int bits) {
  uint32_t st = bits == 8 ? pl[i] : (pl[i / 2] >> (4 * (i & 1))) & 0xfu;
  return zpp_qm_code_value(st, bits, 0);
}

/* Codes [i, i+8) (i a multiple of 8) as 8 int8 in element order (low
 * half). */
ZPP_AVX2_INLINE __m128i get8(const uint8_t *pl, size_t i, int bits) {
  int32_t w;
  if (bits == 8)
    return _mm_loadl_epi64((const __m128i *)(pl + i));
  memcpy(&w, pl + i / 2, 4);
  return unpack_nibbles(_mm_cvtsi32_si128(w), 0, 0);
}

/* Codes [i, i+16) (i a multiple of 16) as 16 int8 in element order. */
ZPP_AVX2_INLINE __m128i get16(const uint8_t *pl, size_t i, int bits) {
  if (bits == 8)
    return _mm_loadu_si128((const __m128i *)(pl + i));
  return unpack_nibbles(_mm_loadl_epi64((const __m128i *)(pl + i / 2)), 0, 0);
}

ZPP_AVX2_INLINE void isum_absmax_all(const zpp_qcfg_t *cfg, int dtype,
                                     const void *src, const float *res,
                                     size_t count, uint32_t *amax) {
  const __m256i mask = _mm256_set1_epi32((int)ZPP_QM_ABS_MASK);
  size_t nb = zpp_quant_nblocks(cfg, count), es = zpp_qm_dtype_bytes(dtype);
  size_t pf = 0, b, i;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    uint32_t r;
    zpp_qcpu_prefetch(src, &pf, (off + len) * es + ZPP_QCPU_PREFETCH_AHEAD,
                      count * es);
    if (res == NULL) { /* the encoder's statistics, exact for every dtype */
      amax[b] = block_absmax(src, off, len, dtype);
      continue;
    }
    for (i = 0; i + 16 <= len; i += 16) {
      __m256 x0 = isum_load8(src, res, off + i, dtype);
      __m256 x1 = isum_load8(src, res, off + i + 8, dtype);
      a0 =
          _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(x0), mask));
      a1 =
          _mm256_max_epu32(a1, _mm256_and_si256(_mm256_castps_si256(x1), mask));
    }
    for (; i + 8 <= len; i += 8)
      a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(isum_load8(
                                                     src, res, off + i, dtype)),
                                                 mask));
    r = hmax_epu32(_mm256_max_epu32(a0, a1));
    for (; i < len; i++) {
      uint32_t a =
          zpp_qm_f32_bits(zpp_qm_load(src, off + i, dtype) + res[off + i]) &
          ZPP_QM_ABS_MASK;
      r = a > r ? a : r;
    }
    amax[b] = r;
  }
}

/* 32 INT4 codes in element order (q0: elements 0-7, ..., q3: 24-31) as
 * their 16 payload bytes.  The signed packs (exact: the codes fit in
 * int8) leave the elements in groups of 4 in order, [0-3 8-11 16-19 24-27
 * | 4-7 12-15 20-23 28-31], so each 16-bit word holds a pair (nibbles256);
 * the pair bytes of the two 128-bit halves interleave by 16 bits. */
ZPP_AVX2_INLINE __m128i nibbles32(__m256i q0, __m256i q1, __m256i q2,
                                  __m256i q3) {
  __m256i b = nibbles256(_mm256_packs_epi16(_mm256_packs_epi32(q0, q1),
                                            _mm256_packs_epi32(q2, q3)));
  b = _mm256_packus_epi16(b, b); /* every word <= 0xff: exact */
  return _mm_unpacklo_epi16(_mm256_castsi256_si128(b),
                            _mm256_extracti128_si256(b, 1));
}

/* INT4 codes of 64 bf16 elements (no residual, MUL block): 32 bytes of
 * payload.  A dword of the input holds elements 2 j (low half) and 2 j + 1
 * (high half); shifting the low half up and masking the high half widens
 * them to fp32 exactly, with no shuffle, into an even and an odd vector of
 * the same 8 pairs, each quantized as iquant8.  The signed packs (exact:
 * the codes fit in int8) put the even codes and the odd codes of the same
 * pairs at the same bytes, so the even code's low nibble and the odd one's
 * shifted up make the payload byte of the pair; a dword permutation
 * undoes the packs' 128-bit interleave (pair group 2 a + k, a the 16
 * elements, k the 128-bit lane, lies at dword 4 k + a). */
ZPP_AVX2_INLINE __m256i isum_bf16_nibbles64(const uint16_t *x,
                                            const qvec_t *v) {
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  __m256i qe[4], qo[4], e, o;
  int a;
  for (a = 0; a < 4; a++) {
    __m256i w = _mm256_loadu_si256((const __m256i *)(x + 16 * a));
    qe[a] = iquant8(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), v);
    qo[a] = iquant8(_mm256_castsi256_ps(_mm256_and_si256(w, hi)), v);
  }
  e = _mm256_packs_epi16(_mm256_packs_epi32(qe[0], qe[1]),
                         _mm256_packs_epi32(qe[2], qe[3]));
  o = _mm256_packs_epi16(_mm256_packs_epi32(qo[0], qo[1]),
                         _mm256_packs_epi32(qo[2], qo[3]));
  e = _mm256_or_si256(
      _mm256_and_si256(e, _mm256_set1_epi8(0x0f)),
      _mm256_and_si256(_mm256_slli_epi16(o, 4), _mm256_set1_epi8((char)0xf0)));
  return _mm256_permutevar8x32_epi32(e,
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

ZPP_AVX2_INLINE void isum_encode_all(const zpp_qcfg_t *cfg, int dtype, int bits,
                                     int sr, const void *src, float *res,
                                     float beta, const uint32_t *amax,
                                     const int8_t *uexp, size_t count,
                                     uint8_t *dst) {
  size_t nb = zpp_quant_nblocks(cfg, count), es = zpp_qm_dtype_bytes(dtype);
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits), pf = 0, b, i;
  uint8_t *mult = dst + zpp_isum_code_bytes(cfg, count);
  zpp_qm_keys_t k = {cfg->k0, cfg->k1};
  float omega = 1.0f - beta;
  zpp_qm_params_t pg[ZPP_QM_UNIT_GROUP];
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    zpp_qm_params_t p;
    uint8_t *pl = dst + b * pb;
    int live;
    qvec_t v;
    if (b % ZPP_QM_UNIT_GROUP == 0) /* the group's multipliers first */
      zpp_qm_unit_group(bits, amax, uexp, b, nb, mult, pg);
    p = pg[b % ZPP_QM_UNIT_GROUP];
    live = p.kind == ZPP_QM_KIND_MUL;
    zpp_qcpu_prefetch(src, &pf, (off + len) * es + ZPP_QCPU_PREFETCH_AHEAD,
                      count * es);
    set_qvec(&v, &p);
    i = 0;
    if (dtype == ZPP_QM_BF16 && bits == 4 && !sr && live && res == NULL)
      for (; i + 64 <= len; i += 64)
        _mm256_storeu_si256(
            (__m256i *)(pl + i / 2),
            isum_bf16_nibbles64((const uint16_t *)src + off + i, &v));
    if (bits == 4 && !sr && live) /* 32 codes at a time: nibbles32 */
      for (; i + 32 <= len; i += 32) {
        __m256 x[4];
        __m256i q[4];
        int a;
        for (a = 0; a < 4; a++) {
          x[a] = isum_load8(src, res, off + i + 8 * a, dtype);
          q[a] = iquant8(x[a], &v);
        }
        _mm_storeu_si128((__m128i *)(pl + i / 2),
                         nibbles32(q[0], q[1], q[2], q[3]));
        if (res != NULL)
          for (a = 0; a < 4; a++) {
            float *r = res + off + i + 8 * a;
            _mm256_storeu_ps(r, feedback8(_mm256_loadu_ps(r), x[a], q[a],
                                          v.scale, beta, omega));
          }
      }
    for (; i + 8 <= len; i += 8) {
      uint64_t idx = cfg->base + off + i;
      __m256 x;
      __m256i q = _mm256_setzero_si256();
      if (sr && (uint32_t)idx > 0xfffffff8u)
        break; /* the high word changes inside these 8: scalar below */
      x = isum_load8(src, res, off + i, dtype);
      if (live)
        q = sr ? quant8_sr(x, &v, 0, 0, rand24x8(cfg, idx)) : iquant8(x, &v);
      put8(pl, i, bits, q);
      if (res != NULL)
        _mm256_storeu_ps(res + off + i,
                         feedback8(_mm256_loadu_ps(res + off + i), x, q,
                                   v.scale, beta, omega));
    }
    for (; i < len; i++) {
      float x = zpp_qm_load(src, off + i, dtype);
      int q;
      if (res != NULL)
        x = x + res[off + i];
      q = sr ? zpp_qm_quantize_sr(x, &p, zpp_qm_rand24(k, cfg->base + off + i))
             : zpp_qm_quantize(x, &p);
      put1(pl, i, bits, q);
      if (res != NULL)
        res[off + i] =
            zpp_qm_feedback(res[off + i], x, q, p.scale, beta, omega);
    }
  }
}

/* The own share of 8 lanes in units, zpp_qm_unit_own(fl(own + res), E)
 * (unit: E finite; su = 2^-E), and with res non-NULL its new residual
 * (vu = zpp_qm_unit_value(E)). */
ZPP_AVX2_INLINE __m256i isum_own8(const void *own, float *res, size_t i,
                                  int dtype, int unit, __m256 su, __m256 vu,
                                  float beta, float omega) {
  __m256 e0, x;
  __m256i s;
  if (res == NULL)
    return unit ? _mm256_cvtps_epi32(_mm256_mul_ps(load8(own, i, dtype), su))
                : _mm256_setzero_si256();
  e0 = _mm256_loadu_ps(res + i);
  x = _mm256_add_ps(load8(own, i, dtype), e0);
  s = unit ? _mm256_cvtps_epi32(_mm256_mul_ps(x, su)) : _mm256_setzero_si256();
  _mm256_storeu_ps(res + i, feedback8(e0, x, s, vu, beta, omega));
  return s;
}

ZPP_AVX2_INLINE void isum_sum_all(const zpp_qcfg_t *cfg, int dtype, int bits,
                                  const void *own, float *res, float beta,
                                  const int8_t *uexp,
                                  const uint8_t *const *srcs, int n,
                                  size_t count, size_t b0, size_t b1, size_t ob,
                                  int32_t *out) {
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits);
  size_t cb = zpp_isum_code_bytes(cfg, count), b, i;
  float omega = 1.0f - beta;
  int j;
  /* INT4: the products of up to 16 messages sum exactly in int16 */
  int narrow = bits == 4 && n <= 16;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    int e = uexp[b];
    int unit = e != ZPP_QM_UEXP_NONFINITE && e != ZPP_QM_UEXP_ZERO;
    float uv = zpp_qm_unit_value(e);
    __m256 su = _mm256_set1_ps(unit ? zpp_qm_pow2(-e) : 0.0f);
    __m256 vu = _mm256_set1_ps(uv);
    for (i = 0; i + 16 <= len; i += 16) {
      __m256i s0 = _mm256_setzero_si256(), s1 = s0, w = s0;
      if (own != NULL) {
        s0 = isum_own8(own, res, off + i, dtype, unit, su, vu, beta, omega);
        s1 = isum_own8(own, res, off + i + 8, dtype, unit, su, vu, beta, omega);
      }
      for (j = 0; j < n; j++) {
        __m256i p = _mm256_mullo_epi16(
            _mm256_cvtepi8_epi16(get16(srcs[j] + b * pb, i, bits)),
            _mm256_set1_epi16((short)srcs[j][cb + b]));
        if (narrow) {
          w = _mm256_add_epi16(w, p);
        } else {
          s0 = _mm256_add_epi32(
              s0, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(p)));
          s1 = _mm256_add_epi32(
              s1, _mm256_cvtepi16_epi32(_mm256_extracti128_si256(p, 1)));
        }
      }
      if (narrow) {
        s0 = _mm256_add_epi32(s0,
                              _mm256_cvtepi16_epi32(_mm256_castsi256_si128(w)));
        s1 = _mm256_add_epi32(
            s1, _mm256_cvtepi16_epi32(_mm256_extracti128_si256(w, 1)));
      }
      _mm256_storeu_si256((__m256i *)(out + off - ob + i), s0);
      _mm256_storeu_si256((__m256i *)(out + off - ob + i + 8), s1);
    }
    for (; i < len; i++) {
      int32_t c = 0;
      if (own != NULL) {
        float x = zpp_qm_load(own, off + i, dtype);
        if (res != NULL)
          x = x + res[off + i];
        c = zpp_qm_unit_own(x, e);
        if (res != NULL)
          res[off + i] = zpp_qm_feedback(res[off + i], x, c, uv, beta, omega);
      }
      for (j = 0; j < n; j++)
        c += (int32_t)srcs[j][cb + b] * get1(srcs[j] + b * pb, i, bits);
      out[off - ob + i] = c;
    }
  }
}

/* zpp_qm_unit_res of 8 lanes (su = 2^-E). */
ZPP_AVX2_INLINE __m256i unit_res8(__m256 r, __m256 su) {
  const __m256 lim = _mm256_set1_ps((float)ZPP_QM_ISUM_MAX);
  __m256 v = _mm256_mul_ps(r, su);
  __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  v = _mm256_max_ps(_mm256_min_ps(v, lim),
                    _mm256_sub_ps(_mm256_setzero_ps(), lim));
  return _mm256_cvtps_epi32(_mm256_andnot_ps(nan, v));
}

ZPP_AVX2_INLINE void isum_requant_all(const zpp_qcfg_t *cfg2, int bits2, int sr,
                                      const int32_t *in, const int8_t *uexp,
                                      float *res, float beta, size_t count,
                                      size_t b0, size_t b1, size_t ob,
                                      uint8_t *dst) {
  size_t nb = zpp_quant_nblocks(cfg2, count), b, i;
  size_t pb = zpp_qm_payload_bytes(cfg2->block, bits2);
  int qmax2 = zpp_qm_sym_qmax(bits2);
  zpp_qm_keys_t k = {cfg2->k0, cfg2->k1};
  float omega = 1.0f - beta;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg2->block;
    size_t len = count - off < cfg2->block ? count - off : cfg2->block;
    int e = uexp[b];
    int ures =
        res != NULL && e != ZPP_QM_UEXP_NONFINITE && e != ZPP_QM_UEXP_ZERO;
    float unit = zpp_qm_unit_value(e);
    __m256 su = _mm256_set1_ps(ures ? zpp_qm_pow2(-e) : 0.0f);
    __m256 vu = _mm256_set1_ps(unit);
    uint8_t *pl = dst + nb * 4 + b * pb;
    __m256i a0 = _mm256_setzero_si256();
    uint32_t m;
    zpp_qm_params_t p;
    qvec_t v;
    int live;
    for (i = 0; i + 8 <= len; i += 8) {
      __m256i jv = _mm256_loadu_si256((const __m256i *)(in + off - ob + i));
      if (ures)
        jv =
            _mm256_add_epi32(jv, unit_res8(_mm256_loadu_ps(res + off + i), su));
      a0 = _mm256_max_epu32(a0, _mm256_abs_epi32(jv));
    }
    m = hmax_epu32(a0);
    for (; i < len; i++) {
      int32_t jj = in[off - ob + i];
      uint32_t a;
      if (res != NULL)
        jj += zpp_qm_unit_res(res[off + i], e);
      a = (uint32_t)(jj < 0 ? -jj : jj);
      m = a > m ? a : m;
    }
    p = zpp_qm_irequant_params(zpp_qm_idivisor(m, qmax2), e, bits2);
    memcpy(dst + b * 4, &p.scale, 4);
    live = p.kind == ZPP_QM_KIND_MUL;
    set_qvec(&v, &p);
    for (i = 0; i + 8 <= len; i += 8) {
      uint64_t idx = cfg2->base + off + i;
      __m256i iv, jv, q = _mm256_setzero_si256();
      __m256 x;
      if (sr && (uint32_t)idx > 0xfffffff8u)
        break;
      iv = _mm256_loadu_si256((const __m256i *)(in + off - ob + i));
      jv = iv;
      if (ures)
        jv =
            _mm256_add_epi32(jv, unit_res8(_mm256_loadu_ps(res + off + i), su));
      x = _mm256_cvtepi32_ps(jv);
      if (live)
        q = sr ? quant8_sr(x, &v, 0, 0, rand24x8(cfg2, idx)) : iquant8(x, &v);
      put8(pl, i, bits2, q);
      if (res != NULL) {
        __m256 e0 = _mm256_loadu_ps(res + off + i);
        __m256 xr =
            _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(iv), vu), e0);
        _mm256_storeu_ps(res + off + i,
                         feedback8(e0, xr, q, v.scale, beta, omega));
      }
    }
    for (; i < len; i++) {
      int32_t jj = in[off - ob + i];
      int q;
      if (res != NULL)
        jj += zpp_qm_unit_res(res[off + i], e);
      q = sr ? zpp_qm_quantize_sr((float)jj, &p,
                                  zpp_qm_rand24(k, cfg2->base + off + i))
             : zpp_qm_quantize((float)jj, &p);
      put1(pl, i, bits2, q);
      if (res != NULL) {
        float x = (float)in[off - ob + i] * unit + res[off + i];
        res[off + i] =
            zpp_qm_feedback(res[off + i], x, q, p.scale, beta, omega);
      }
    }
  }
}

ZPP_AVX2_INLINE void isum_finish_all(const zpp_qcfg_t *cfg2, int bits2,
                                     const int32_t *own, const int8_t *uexp,
                                     const uint8_t *const *srcs, int n,
                                     size_t count, size_t b0, size_t b1,
                                     size_t ob, float div, int dtype,
                                     void *dst) {
  size_t nb = zpp_quant_nblocks(cfg2, count), b, i;
  size_t pb = zpp_qm_payload_bytes(cfg2->block, bits2);
  /* div a power of two (MEAN over 2^k ranks): fl(x / div) equals
   * fl(x * (1 / div)), both the exact quotient rounded once */
  uint32_t db = zpp_qm_f32_bits(div), de = (db >> 23) & 0xffu;
  int p2 = (db & 0x7fffffu) == 0 && de >= 1 && de <= 253;
  __m256 vd = _mm256_set1_ps(div), vr = _mm256_set1_ps(1.0f / div);
  int j;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg2->block;
    size_t len = count - off < cfg2->block ? count - off : cfg2->block;
    float unit = zpp_qm_unit_value(uexp[b]);
    __m256 vu = _mm256_set1_ps(unit);
    for (i = 0; i + 8 <= len; i += 8) {
      __m256 acc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(
                                     (const __m256i *)(own + off - ob + i))),
                                 vu);
      for (j = 0; j < n; j++) {
        float sc;
        memcpy(&sc, srcs[j] + b * 4, 4);
        acc = _mm256_add_ps(
            acc, _mm256_add_ps(
                     _mm256_setzero_ps(),
                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(get8(
                                       srcs[j] + nb * 4 + b * pb, i, bits2))),
                                   _mm256_set1_ps(sc))));
      }
      store8(dst, off + i, dtype, 1,
             p2 ? _mm256_mul_ps(acc, vr) : _mm256_div_ps(acc, vd));
    }
    for (; i < len; i++) {
      float acc = (float)own[off - ob + i] * unit;
      for (j = 0; j < n; j++) {
        float sc;
        memcpy(&sc, srcs[j] + b * 4, 4);
        acc = zpp_qm_add(
            acc, zpp_qm_dequantize(get1(srcs[j] + nb * 4 + b * pb, i, bits2),
                                   sc, 0.0f));
      }
      zpp_qm_store(dst, off + i, dtype, acc / div);
    }
  }
}

/* Entry points: the dtype and width as constants of the inlined bodies. */
#define ZPP_ISUM_BY_DTYPE(dtype, call)                                         \
  do {                                                                         \
    if ((dtype) == ZPP_QM_F32) {                                               \
      const int dt_ = ZPP_QM_F32;                                              \
      call;                                                                    \
    } else if ((dtype) == ZPP_QM_F16) {                                        \
      const int dt_ = ZPP_QM_F16;                                              \
      call;                                                                    \
    } else {                                                                   \
      const int dt_ = ZPP_QM_BF16;                                             \
      call;                                                                    \
    }                                                                          \
  } while (0)
#define ZPP_ISUM_BY_BITS(bits, call)                                           \
  do {                                                                         \
    if ((bits) == 8) {                                                         \
      const int bt_ = 8;                                                       \
      call;                                                                    \
    } else {                                                                   \
      const int bt_ = 4;                                                       \
      call;                                                                    \
    }                                                                          \
  } while (0)

static ZPP_AVX2_TARGET void isum_absmax_avx2(const zpp_qcfg_t *cfg, int dtype,
                                             const void *src, const float *res,
                                             size_t count, uint32_t *amax) {
  ZPP_ISUM_BY_DTYPE(dtype, isum_absmax_all(cfg, dt_, src, res, count, amax));
}

static ZPP_AVX2_TARGET void isum_encode_avx2(const zpp_qcfg_t *cfg, int dtype,
                                             const void *src, float *res,
                                             float beta, const uint32_t *amax,
                                             const int8_t *uexp, size_t count,
                                             uint8_t *dst) {
  if (cfg->sr)
    ZPP_ISUM_BY_DTYPE(
        dtype, ZPP_ISUM_BY_BITS(cfg->bits,
                                isum_encode_all(cfg, dt_, bt_, 1, src, res,
                                                beta, amax, uexp, count, dst)));
  else
    ZPP_ISUM_BY_DTYPE(
        dtype, ZPP_ISUM_BY_BITS(cfg->bits,
                                isum_encode_all(cfg, dt_, bt_, 0, src, res,
                                                beta, amax, uexp, count, dst)));
}

static ZPP_AVX2_TARGET void isum_sum_avx2(const zpp_qcfg_t *cfg, int dtype,
                                          const void *own, float *res,
                                          float beta, const int8_t *uexp,
                                          const uint8_t *const *srcs, int n,
                                          size_t count, int32_t *out) {
  ZPP_ISUM_BY_DTYPE(
      dtype,
      ZPP_ISUM_BY_BITS(cfg->bits,
                       isum_sum_all(cfg, dt_, bt_, own, res, beta, uexp, srcs,
                                    n, count, 0, zpp_quant_nblocks(cfg, count),
                                    0, out)));
}

static ZPP_AVX2_TARGET void
isum_requant_avx2(const zpp_qcfg_t *cfg2, const int32_t *in, const int8_t *uexp,
                  float *res, float beta, size_t count, uint8_t *dst) {
  if (cfg2->sr)
    ZPP_ISUM_BY_BITS(cfg2->bits,
                     isum_requant_all(cfg2, bt_, 1, in, uexp, res, beta, count,
                                      0, zpp_quant_nblocks(cfg2, count), 0,
                                      dst));
  else
    ZPP_ISUM_BY_BITS(cfg2->bits,
                     isum_requant_all(cfg2, bt_, 0, in, uexp, res, beta, count,
                                      0, zpp_quant_nblocks(cfg2, count), 0,
                                      dst));
}

static ZPP_AVX2_TARGET void
isum_finish_avx2(const zpp_qcfg_t *cfg2, const int32_t *own, const int8_t *uexp,
                 const uint8_t *const *srcs, int n, size_t count, float div,
                 int dtype, void *dst) {
  ZPP_ISUM_BY_DTYPE(
      dtype,
      ZPP_ISUM_BY_BITS(cfg2->bits,
                       isum_finish_all(cfg2, bt_, own, uexp, srcs, n, count, 0,
                                       zpp_quant_nblocks(cfg2, count), 0, div,
                                       dt_, dst)));
}

/* The fused steps: the bodies above over one tile of blocks at a time. */
static ZPP_AVX2_TARGET void
isum_sum_requant_avx2(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2, int dtype,
                      const void *own, float *res1, const int8_t *uexp,
                      const uint8_t *const *srcs, int n, float *res, float beta,
                      size_t count, int32_t *tmp, uint8_t *dst) {
  size_t nb = zpp_quant_nblocks(cfg, count), tb = zpp_isum_tile_blocks(cfg);
  size_t b0, b1, ob;
  for (b0 = 0; b0 < nb; b0 = b1) {
    b1 = nb - b0 < tb ? nb : b0 + tb;
    ob = b0 * cfg->block;
    ZPP_ISUM_BY_DTYPE(
        dtype, ZPP_ISUM_BY_BITS(
                   cfg->bits, isum_sum_all(cfg, dt_, bt_, own, res1, beta, uexp,
                                           srcs, n, count, b0, b1, ob, tmp)));
    if (cfg2->sr)
      ZPP_ISUM_BY_BITS(cfg2->bits,
                       isum_requant_all(cfg2, bt_, 1, tmp, uexp, res, beta,
                                        count, b0, b1, ob, dst));
    else
      ZPP_ISUM_BY_BITS(cfg2->bits,
                       isum_requant_all(cfg2, bt_, 0, tmp, uexp, res, beta,
                                        count, b0, b1, ob, dst));
  }
}

static ZPP_AVX2_TARGET void
isum_sum_finish_avx2(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2, int dtype,
                     const void *own, float *res1, float beta,
                     const int8_t *uexp, const uint8_t *const *srcs, int n,
                     const uint8_t *const *srcs2, int n2, size_t count,
                     float div, int32_t *tmp, void *dst) {
  size_t nb = zpp_quant_nblocks(cfg, count), tb = zpp_isum_tile_blocks(cfg);
  size_t b0, b1, ob;
  for (b0 = 0; b0 < nb; b0 = b1) {
    b1 = nb - b0 < tb ? nb : b0 + tb;
    ob = b0 * cfg->block;
    ZPP_ISUM_BY_DTYPE(
        dtype, ZPP_ISUM_BY_BITS(
                   cfg->bits, isum_sum_all(cfg, dt_, bt_, own, res1, beta, uexp,
                                           srcs, n, count, b0, b1, ob, tmp)));
    ZPP_ISUM_BY_DTYPE(
        dtype,
        ZPP_ISUM_BY_BITS(cfg2->bits,
                         isum_finish_all(cfg2, bt_, tmp, uexp, srcs2, n2, count,
                                         b0, b1, ob, div, dt_, dst)));
  }
}

static const zpp_quant_cpu_ops_t avx2_ops = {
    "avx2",
    encode_avx2,
    decode_avx2,
    {isum_absmax_avx2, isum_encode_avx2, isum_sum_avx2, isum_requant_avx2,
     isum_finish_avx2, isum_sum_requant_avx2, isum_sum_finish_avx2}};

/* F16C is CPUID.1:ECX bit 29; __builtin_cpu_supports does not know it in
 * every compiler.  Its YMM state is covered by the AVX2 check. */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx2(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      cpu_has_f16c())
    return &avx2_ops;
  return NULL;
}

#else /* not x86-64 with GCC or Clang */

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx2(void) { return NULL; }

#endif
