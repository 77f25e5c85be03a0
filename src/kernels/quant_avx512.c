/*
 * AVX-512 block codec (F, BW, VL, DQ and F16C).  The same structure and the
 * same exactness argument as quant_avx2.c, on 16 lanes:
 *   - absmax is an integer max of (bits & 0x7fffffff), as in the scalar path;
 *   - min/max are order-free (zero signs do not matter: asym_params
 *     canonicalises -0, and range = mx - mn is the same for either zero);
 *   - the block parameters come from zpp_qm_sym_params/zpp_qm_asym_params;
 *   - sub, mul, div, min, max and cvtps2dq run in the default MXCSR mode
 *     (round to nearest even; no embedded rounding is used);
 *   - codes are narrowed with the truncating vpmovdb/vpmovqb, exact because
 *     they lie in [-127, 255] (see quant16); INT4 codes (in [-7, 15]) also
 *     through the saturating vpackssdw/vpacksswb, exact because they fit
 *     in int8 (nibbles64);
 *   - decode is mul then add (never fused: see the pragma below);
 *   - fp16 output uses vcvtps2ph imm 0, which zpp_qm_f32_to_f16 mirrors
 *     (checked on all 2^32 inputs, NaN quietening included); bf16 output
 *     uses the integer rounding of zpp_qm_f32_to_bf16;
 *   - INT4 decode (to fp32, fp16 or bf16, or accumulated) looks the 16
 *     values of a block up in a table built with the same arithmetic;
 *   - INT4 encode packs 64 codes at a time through signed packs (exact:
 *     the codes fit in int8); the integer-sum encode of bf16 INT4 rounded
 *     to nearest without a residual widens by a shift and a mask (exact)
 *     and packs 128 codes at a time (isum_bf16_nibbles128).
 * Blocks shorter than one vector, and the last (< 16) elements of a block,
 * go through the shared scalar code.
 *
 * Only the functions below carry the AVX-512 target attribute: the rest of
 * the library stays baseline x86-64, and the table is handed out only when
 * the CPU (and OS) support all of the extensions above.
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

#define ZPP_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define ZPP_AVX512_INLINE \
  static inline __attribute__((always_inline)) ZPP_AVX512_TARGET

/* Elements per vector step; shorter blocks take the scalar path. */
#define ZPP_AVX512_MIN_BLOCK 16u

/* ---- horizontal reductions ---------------------------------------------- */

ZPP_AVX512_INLINE uint32_t hmax_epu32(__m512i v) {
  __m256i y = _mm256_max_epu32(_mm512_castsi512_si256(v),
                               _mm512_extracti64x4_epi64(v, 1));
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(y),
                            _mm256_extracti128_si256(y, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX512_INLINE uint16_t hmax_epu16(__m512i v) {
  __m256i y = _mm256_max_epu16(_mm512_castsi512_si256(v),
                               _mm512_extracti64x4_epi64(v, 1));
  __m128i h = _mm_max_epu16(_mm256_castsi256_si128(y),
                            _mm256_extracti128_si256(y, 1));
  h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu16(h, _mm_shuffle_epi32(h, 0xb1));
  h = _mm_max_epu16(h, _mm_shufflelo_epi16(h, 0xb1));
  return (uint16_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX512_INLINE int16_t hmin_epi16(__m512i v) {
  __m256i y = _mm256_min_epi16(_mm512_castsi512_si256(v),
                               _mm512_extracti64x4_epi64(v, 1));
  __m128i h = _mm_min_epi16(_mm256_castsi256_si128(y),
                            _mm256_extracti128_si256(y, 1));
  h = _mm_min_epi16(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_min_epi16(h, _mm_shuffle_epi32(h, 0xb1));
  h = _mm_min_epi16(h, _mm_shufflelo_epi16(h, 0xb1));
  return (int16_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX512_INLINE int16_t hmax_epi16(__m512i v) {
  __m256i y = _mm256_max_epi16(_mm512_castsi512_si256(v),
                               _mm512_extracti64x4_epi64(v, 1));
  __m128i h = _mm_max_epi16(_mm256_castsi256_si128(y),
                            _mm256_extracti128_si256(y, 1));
  h = _mm_max_epi16(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epi16(h, _mm_shuffle_epi32(h, 0xb1));
  h = _mm_max_epi16(h, _mm_shufflelo_epi16(h, 0xb1));
  return (int16_t)_mm_cvtsi128_si32(h);
}

ZPP_AVX512_INLINE float hmin_ps(__m512 v) {
  __m256 y = _mm256_min_ps(_mm512_castps512_ps256(v),
                           _mm512_extractf32x8_ps(v, 1));
  __m128 h = _mm_min_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  h = _mm_min_ps(h, _mm_shuffle_ps(h, h, 0x4e));
  h = _mm_min_ps(h, _mm_shuffle_ps(h, h, 0xb1));
  return _mm_cvtss_f32(h);
}

ZPP_AVX512_INLINE float hmax_ps(__m512 v) {
  __m256 y = _mm256_max_ps(_mm512_castps512_ps256(v),
                           _mm512_extractf32x8_ps(v, 1));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  h = _mm_max_ps(h, _mm_shuffle_ps(h, h, 0x4e));
  h = _mm_max_ps(h, _mm_shuffle_ps(h, h, 0xb1));
  return _mm_cvtss_f32(h);
}

/* ---- scalar element reads ------------------------------------------------ */

/* Buffers may have any alignment: scalar reads go through memcpy. */
ZPP_AVX512_INLINE uint32_t ld_bits32(const float *x, size_t i) {
  uint32_t u;
  memcpy(&u, (const unsigned char *)x + 4 * i, 4);
  return u;
}

ZPP_AVX512_INLINE float ld_f32(const float *x, size_t i) {
  float f;
  memcpy(&f, (const unsigned char *)x + 4 * i, 4);
  return f;
}

ZPP_AVX512_INLINE uint16_t ld_u16(const uint16_t *x, size_t i) {
  uint16_t h;
  memcpy(&h, (const unsigned char *)x + 2 * i, 2);
  return h;
}

/* ---- loads ---------------------------------------------------------------- */

/* Elements [i, i+16) of a `dtype` buffer as fp32 (exact conversions;
 * vcvtph2ps quietens a signalling NaN where zpp_qm_f16_to_f32 does not,
 * which cannot show: blocks holding a NaN are never quantized). */
ZPP_AVX512_INLINE __m512 load16(const void *src, size_t i, int dtype) {
  if (dtype == ZPP_QM_F32)
    return _mm512_loadu_ps((const float *)src + i);
  {
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i));
    if (dtype == ZPP_QM_F16)
      return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

/* ---- block statistics (pass 1) ------------------------------------------- */

/* Largest (bits & 0x7fffffff) over an fp32 block, as the scalar path. */
ZPP_AVX512_INLINE uint32_t absmax_f32(const float *x, size_t len) {
  const __m512i mask = _mm512_set1_epi32((int)ZPP_QM_ABS_MASK);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  uint32_t r;
  for (; i + 64 <= len; i += 64) {
    a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    a1 = _mm512_max_epu32(a1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), mask));
    a2 = _mm512_max_epu32(a2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
    a3 = _mm512_max_epu32(a3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), mask));
  }
  for (; i + 16 <= len; i += 16)
    a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
  r = hmax_epu32(_mm512_max_epu32(_mm512_max_epu32(a0, a1), _mm512_max_epu32(a2, a3)));
  for (; i < len; i++) {
    uint32_t u = ld_bits32(x, i) & ZPP_QM_ABS_MASK;
    r = u > r ? u : r;
  }
  return r;
}

/* Largest (bits & 0x7fff) over an fp16 or bf16 block.  Both are
 * sign-magnitude, so this is the element of largest |x| (NaN above Inf). */
ZPP_AVX512_INLINE uint16_t absmax_u16(const uint16_t *x, size_t len) {
  const __m512i mask = _mm512_set1_epi16(0x7fff);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  size_t i = 0;
  uint16_t r;
  for (; i + 64 <= len; i += 64) {
    a0 = _mm512_max_epu16(a0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    a1 = _mm512_max_epu16(a1, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
  }
  for (; i + 32 <= len; i += 32)
    a0 = _mm512_max_epu16(a0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
  r = hmax_epu16(_mm512_max_epu16(a0, a1));
  for (; i < len; i++) {
    uint16_t h = ld_u16(x, i), u = (uint16_t)(h & 0x7fffu);
    r = u > r ? u : r;
  }
  return r;
}

/* fp32 bits of the largest |x| of a block, exactly as the scalar path
 * computes it (conversions to fp32 are exact and monotonic in |x|). */
ZPP_AVX512_INLINE uint32_t block_absmax(const void *src, size_t off, size_t len,
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
 * (the scalar path's loop); len >= 16.  When the block holds Inf or NaN
 * the min/max returned may be anything: asym_params ignores them then. */
ZPP_AVX512_INLINE void minmax_f32(const float *x, size_t len, float *mn_out,
                                  float *mx_out, int *nonfinite) {
  const __m512i mask = _mm512_set1_epi32((int)ZPP_QM_ABS_MASK);
  __m512 v0 = _mm512_loadu_ps(x);
  __m512 mn0 = v0, mx0 = v0, mn1 = v0, mx1 = v0;
  __m512i a0 = _mm512_and_si512(_mm512_castps_si512(v0), mask), a1 = a0;
  size_t i = 16;
  float mn, mx;
  uint32_t amax;
  for (; i + 32 <= len; i += 32) {
    __m512 v = _mm512_loadu_ps(x + i), w = _mm512_loadu_ps(x + i + 16);
    mn0 = _mm512_min_ps(mn0, v);
    mx0 = _mm512_max_ps(mx0, v);
    a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_castps_si512(v), mask));
    mn1 = _mm512_min_ps(mn1, w);
    mx1 = _mm512_max_ps(mx1, w);
    a1 = _mm512_max_epu32(a1, _mm512_and_si512(_mm512_castps_si512(w), mask));
  }
  for (; i + 16 <= len; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    mn0 = _mm512_min_ps(mn0, v);
    mx0 = _mm512_max_ps(mx0, v);
    a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_castps_si512(v), mask));
  }
  mn = hmin_ps(_mm512_min_ps(mn0, mn1));
  mx = hmax_ps(_mm512_max_ps(mx0, mx1));
  amax = hmax_epu32(_mm512_max_epu32(a0, a1));
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
ZPP_AVX512_INLINE void minmax_u16(const uint16_t *x, size_t len, int dtype,
                                  float *mn_out, float *mx_out, int *nonfinite) {
  const __m512i mag = _mm512_set1_epi16(0x7fff);
  __m512i mn = _mm512_set1_epi16(INT16_MAX), mx = _mm512_set1_epi16(INT16_MIN);
  size_t i = 0;
  int16_t tmn, tmx;
  uint16_t a, hmn, hmx;
  float fmn, fmx;
  for (; i + 32 <= len; i += 32) {
    __m512i v = _mm512_loadu_si512(x + i);
    __m512i t = _mm512_xor_si512(v, _mm512_and_si512(_mm512_srai_epi16(v, 15), mag));
    mn = _mm512_min_epi16(mn, t);
    mx = _mm512_max_epi16(mx, t);
  }
  if (i == 0) { /* shorter than one vector: start from element 0 */
    uint16_t h0 = ld_u16(x, 0);
    mn = mx = _mm512_set1_epi16((int16_t)(h0 ^ ((h0 & 0x8000u) ? 0x7fffu : 0u)));
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
  __m512 zero, inv, scale, lo, hi;
} qvec_t;

ZPP_AVX512_INLINE void set_qvec(qvec_t *v, const zpp_qm_params_t *p) {
  v->zero = _mm512_set1_ps(p->zero);
  v->inv = _mm512_set1_ps(p->inv);
  v->scale = _mm512_set1_ps(p->scale);
  v->lo = _mm512_set1_ps(p->lo);
  v->hi = _mm512_set1_ps(p->hi);
}

/* Codes of 16 elements: zpp_qm_quantize lane by lane.  Symmetric blocks
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
ZPP_AVX512_INLINE __m512i quant16(__m512 x, const qvec_t *p, int asym, int div) {
  if (asym)
    x = _mm512_sub_ps(x, p->zero);
  x = div ? _mm512_div_ps(x, p->scale) : _mm512_mul_ps(x, p->inv);
  if (div)
    x = _mm512_min_ps(_mm512_max_ps(x, p->lo), p->hi);
  return _mm512_cvtps_epi32(x); /* MXCSR default: nearest even */
}

/* 16 codes in [-127, 255] to 16 bytes (two's complement or unsigned alike). */
ZPP_AVX512_INLINE __m128i bytes16(__m512i q) { return _mm512_cvtepi32_epi8(q); }

/* 16 codes in [-8, 15] to 8 INT4 bytes: in each 64-bit lane (even element low
 * dword, odd element high dword) (lo & 0xf) | (hi << 4), then vpmovqb. */
ZPP_AVX512_INLINE __m128i nibbles16(__m512i q) {
  __m512i n = _mm512_or_si512(
      _mm512_and_si512(q, _mm512_set1_epi64(0x0f)),
      _mm512_and_si512(_mm512_srli_epi64(q, 28), _mm512_set1_epi64(0xf0)));
  return _mm512_cvtepi64_epi8(n);
}

/* 64 codes in [-8, 15] (elements 0-15 in q0, ..., 48-63 in q3) to 32 INT4
 * bytes, in fewer instructions than four nibbles16: signed packs to bytes
 * (exact: the codes fit in int8), each pair of bytes (even element low)
 * folded into its 16-bit lane as (lo & 0xf) | (hi << 4), the words put
 * back in element order, vpmovwb.  The packs work per 128-bit lane: lane L
 * holds, at byte 4 s + i, element 16 s + 4 L + i of q_s; so word 8 L + 2 s
 * + j (elements 16 s + 4 L + 2 j, + 1) belongs at word 8 s + 2 L + j. */
ZPP_AVX512_INLINE __m256i nibbles64(__m512i q0, __m512i q1, __m512i q2,
                                    __m512i q3) {
  static const uint16_t order[32] = {
      0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
      4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31};
  __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(q0, q1),
                                 _mm512_packs_epi32(q2, q3));
  __m512i w = _mm512_or_si512(
      _mm512_and_si512(b, _mm512_set1_epi16(0x000f)),
      _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi16(0x00f0)));
  return _mm512_cvtepi16_epi8(
      _mm512_permutexvar_epi16(_mm512_loadu_si512(order), w));
}

/* Payload of one finite block of len >= 16 elements. */
ZPP_AVX512_INLINE void quant_block(const void *src, size_t off, size_t len,
                                   int dtype, int bits, int asym, int div,
                                   const zpp_qm_params_t *p, uint8_t *out) {
  qvec_t v;
  size_t i = 0;
  set_qvec(&v, p);
  if (bits == 8) {
    for (; i + 64 <= len; i += 64) {
      __m512i q0 = quant16(load16(src, off + i, dtype), &v, asym, div);
      __m512i q1 = quant16(load16(src, off + i + 16, dtype), &v, asym, div);
      __m512i q2 = quant16(load16(src, off + i + 32, dtype), &v, asym, div);
      __m512i q3 = quant16(load16(src, off + i + 48, dtype), &v, asym, div);
      _mm_storeu_si128((__m128i *)(out + i), bytes16(q0));
      _mm_storeu_si128((__m128i *)(out + i + 16), bytes16(q1));
      _mm_storeu_si128((__m128i *)(out + i + 32), bytes16(q2));
      _mm_storeu_si128((__m128i *)(out + i + 48), bytes16(q3));
    }
    for (; i + 16 <= len; i += 16)
      _mm_storeu_si128((__m128i *)(out + i),
                       bytes16(quant16(load16(src, off + i, dtype), &v, asym, div)));
    for (; i < len; i++)
      out[i] = zpp_qm_code_bits(zpp_qm_quantize(zpp_qm_load(src, off + i, dtype), p));
  } else {
    for (; i + 64 <= len; i += 64) {
      __m512i q0 = quant16(load16(src, off + i, dtype), &v, asym, div);
      __m512i q1 = quant16(load16(src, off + i + 16, dtype), &v, asym, div);
      __m512i q2 = quant16(load16(src, off + i + 32, dtype), &v, asym, div);
      __m512i q3 = quant16(load16(src, off + i + 48, dtype), &v, asym, div);
      _mm256_storeu_si256((__m256i *)(out + i / 2), nibbles64(q0, q1, q2, q3));
    }
    for (; i + 16 <= len; i += 16)
      _mm_storel_epi64((__m128i *)(out + i / 2),
                       nibbles16(quant16(load16(src, off + i, dtype), &v, asym, div)));
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
ZPP_AVX512_INLINE void encode_block32(const void *src, size_t off, int dtype,
                                      int bits, int asym, uint8_t *meta,
                                      uint8_t *payload) {
  const __m512i mask = _mm512_set1_epi32((int)ZPP_QM_ABS_MASK);
  __m512 x0 = load16(src, off, dtype), x1 = load16(src, off + 16, dtype);
  __m512i a = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x0), mask),
                               _mm512_and_si512(_mm512_castps_si512(x1), mask));
  zpp_qm_params_t p;
  if (asym) {
    /* NaN lanes may leak into min/max: the block is non-finite then */
    float mn = hmin_ps(_mm512_min_ps(x0, x1));
    float mx = hmax_ps(_mm512_max_ps(x0, x1));
    p = zpp_qm_asym_params(mn, mx, hmax_epu32(a) >= ZPP_QM_EXP_MASK, bits);
  } else {
    p = zpp_qm_sym_params(hmax_epu32(a), bits);
  }
  memcpy(meta, &p.scale, 4);
  if (asym)
    memcpy(meta + 4, &p.zero, 4);
  if (p.kind <= ZPP_QM_KIND_DIV) {
    qvec_t v;
    __m512i q0, q1;
    int div = p.kind == ZPP_QM_KIND_DIV;
    set_qvec(&v, &p);
    q0 = div ? quant16(x0, &v, asym, 1) : quant16(x0, &v, asym, 0);
    q1 = div ? quant16(x1, &v, asym, 1) : quant16(x1, &v, asym, 0);
    if (bits == 8) {
      _mm_storeu_si128((__m128i *)payload, bytes16(q0));
      _mm_storeu_si128((__m128i *)(payload + 16), bytes16(q1));
    } else {
      _mm_storeu_si128((__m128i *)payload,
                       _mm_unpacklo_epi64(nibbles16(q0), nibbles16(q1)));
    }
  } else {
    memset(payload, 0, bits == 8 ? 32 : 16);
  }
}

/* One block of len >= 16 elements: parameters, metadata, payload. */
ZPP_AVX512_INLINE void encode_block(const void *src, size_t off, size_t len,
                                    int dtype, int bits, int asym,
                                    uint8_t *meta, uint8_t *payload) {
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

ZPP_AVX512_INLINE void encode_all(const zpp_qcfg_t *cfg, int dtype,
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
    if (len < ZPP_AVX512_MIN_BLOCK) /* only the tail block can be here */
      zpp_quant_encode_blocks_scalar(cfg, dtype, src, count, b, b + 1, dst);
    else if (len == 32)
      encode_block32(src, off, dtype, bits, asym, dst + b * mb, payload + b * pb);
    else
      encode_block(src, off, len, dtype, bits, asym, dst + b * mb,
                   payload + b * pb);
  }
}

/* ---- stochastic rounding (docs/format.md) -------------------------------
 * As in quant_avx2.c, on 16 lanes: the clamped scaled value, its exact
 * floor (vrndscaleps toward -inf), the exact fraction and u = r24 * 2^-24
 * compared with it; the bits from the same 32-bit mixing (vpmulld). */

ZPP_AVX512_INLINE __m512i mix32x16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x7feb352du));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x846ca68bu));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

/* zpp_qm_rand24 of indices idx0 .. idx0 + 15 (their high words equal). */
ZPP_AVX512_INLINE __m512i rand24x16(const zpp_qcfg_t *cfg, uint64_t idx0) {
  __m512i lo = _mm512_add_epi32(
      _mm512_set1_epi32((int)(uint32_t)idx0),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i x = mix32x16(_mm512_xor_si512(lo, _mm512_set1_epi32((int)cfg->k0)));
  x = _mm512_xor_si512(
      x, _mm512_set1_epi32((int)((uint32_t)(idx0 >> 32) ^ cfg->k1)));
  return _mm512_srli_epi32(mix32x16(x), 8);
}

ZPP_AVX512_INLINE __m512i quant16_sr(__m512 x, const qvec_t *p, int asym,
                                     int div, __m512i r24) {
  __m512 f, frac, u;
  __mmask16 up;
  __m512i q;
  if (asym)
    x = _mm512_sub_ps(x, p->zero);
  x = div ? _mm512_div_ps(x, p->scale) : _mm512_mul_ps(x, p->inv);
  x = _mm512_min_ps(_mm512_max_ps(x, p->lo), p->hi);
  f = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  frac = _mm512_sub_ps(x, f);
  u = _mm512_mul_ps(_mm512_cvtepi32_ps(r24), _mm512_set1_ps(5.9604644775390625e-08f));
  up = _mm512_cmp_ps_mask(u, frac, _CMP_LT_OQ);
  q = _mm512_cvttps_epi32(f);
  return _mm512_mask_add_epi32(q, up, q, _mm512_set1_epi32(1));
}

ZPP_AVX512_INLINE void encode_block_sr(const zpp_qcfg_t *cfg, const void *src,
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
  for (; i + 16 <= len; i += 16) {
    uint64_t idx = cfg->base + off + i;
    __m512i q;
    if ((uint32_t)idx > 0xfffffff0u)
      break; /* the high word changes inside these 16: scalar below */
    q = quant16_sr(load16(src, off + i, dtype), &v, asym, div,
                   rand24x16(cfg, idx));
    if (bits == 8)
      _mm_storeu_si128((__m128i *)(payload + i), bytes16(q));
    else
      _mm_storel_epi64((__m128i *)(payload + i / 2), nibbles16(q));
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

ZPP_AVX512_INLINE void encode_all_sr(const zpp_qcfg_t *cfg, int dtype,
                                     const void *src, size_t count,
                                     uint8_t *dst, int bits, int asym) {
  size_t nb = zpp_quant_nblocks(cfg, count);
  size_t mb = zpp_qm_meta_bytes(asym);
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits);
  size_t es = zpp_qm_dtype_bytes(dtype), pf = 0, b;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    zpp_qcpu_prefetch(src, &pf, (off + len) * es + ZPP_QCPU_PREFETCH_AHEAD,
                      count * es);
    if (len < ZPP_AVX512_MIN_BLOCK)
      zpp_quant_encode_blocks_scalar(cfg, dtype, src, count, b, b + 1, dst);
    else
      encode_block_sr(cfg, src, off, len, dtype, bits, asym, dst + b * mb,
                      dst + nb * mb + b * pb);
  }
}

#define ZPP_AVX512_ENCODE_CASE(name, dt, bits, asym)                          \
  static ZPP_AVX512_TARGET void name(const zpp_qcfg_t *cfg, const void *src,  \
                                     size_t count, uint8_t *dst) {            \
    if (cfg->sr)                                                              \
      encode_all_sr(cfg, dt, src, count, dst, bits, asym);                    \
    else                                                                      \
      encode_all(cfg, dt, src, count, dst, bits, asym);                       \
  }
ZPP_AVX512_ENCODE_CASE(enc_f32_8s, ZPP_QM_F32, 8, 0)
ZPP_AVX512_ENCODE_CASE(enc_f32_8a, ZPP_QM_F32, 8, 1)
ZPP_AVX512_ENCODE_CASE(enc_f32_4s, ZPP_QM_F32, 4, 0)
ZPP_AVX512_ENCODE_CASE(enc_f32_4a, ZPP_QM_F32, 4, 1)
ZPP_AVX512_ENCODE_CASE(enc_f16_8s, ZPP_QM_F16, 8, 0)
ZPP_AVX512_ENCODE_CASE(enc_f16_8a, ZPP_QM_F16, 8, 1)
ZPP_AVX512_ENCODE_CASE(enc_f16_4s, ZPP_QM_F16, 4, 0)
ZPP_AVX512_ENCODE_CASE(enc_f16_4a, ZPP_QM_F16, 4, 1)
ZPP_AVX512_ENCODE_CASE(enc_bf16_8s, ZPP_QM_BF16, 8, 0)
ZPP_AVX512_ENCODE_CASE(enc_bf16_8a, ZPP_QM_BF16, 8, 1)
ZPP_AVX512_ENCODE_CASE(enc_bf16_4s, ZPP_QM_BF16, 4, 0)
ZPP_AVX512_ENCODE_CASE(enc_bf16_4a, ZPP_QM_BF16, 4, 1)

typedef void (*encode_case_fn)(const zpp_qcfg_t *, const void *, size_t,
                               uint8_t *);

/* Indexed [dtype][bits == 4][asym]. */
static const encode_case_fn encode_cases[3][2][2] = {
    {{enc_f32_8s, enc_f32_8a}, {enc_f32_4s, enc_f32_4a}},
    {{enc_f16_8s, enc_f16_8a}, {enc_f16_4s, enc_f16_4a}},
    {{enc_bf16_8s, enc_bf16_8a}, {enc_bf16_4s, enc_bf16_4a}}};

static void encode_avx512(const zpp_qcfg_t *cfg, int dtype, const void *src,
                          size_t count, uint8_t *dst) {
  if (cfg->block < ZPP_AVX512_MIN_BLOCK) {
    zpp_quant_encode_scalar(cfg, dtype, src, count, dst);
    return;
  }
  encode_cases[dtype][cfg->bits == 4][cfg->asym != 0](cfg, src, count, dst);
}

/* ---- decode ---------------------------------------------------------------- */

/* fp32 -> bf16 (zpp_qm_f32_to_bf16) of 16 lanes.  `nan` 0 when no lane
 * can be NaN (see meta_finite). */
ZPP_AVX512_INLINE __m256i to_bf16x16(__m512 v, int nan) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  if (nan) { /* NaN: quietened, sign and top payload kept */
    __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32((int)ZPP_QM_ABS_MASK)),
        _mm512_set1_epi32((int)ZPP_QM_EXP_MASK));
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    r = _mm512_mask_blend_epi32(is_nan, r, q);
  }
  return _mm512_cvtepi32_epi16(r); /* every lane <= 0xffff: exact */
}

/* Stores decoded elements [i, i+16). */
ZPP_AVX512_INLINE void store16(void *dst, size_t i, int out_kind, int nan,
                               __m512 v) {
  if (out_kind == ZPP_QM_F32) {
    _mm512_storeu_ps((float *)dst + i, v);
  } else if (out_kind == ZPP_QM_OUT_ACC) {
    float *a = (float *)dst + i;
    _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), v)); /* acc + v */
  } else if (out_kind == ZPP_QM_F16) {
    _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i), to_bf16x16(v, nan));
  }
}

/* Codes (16 bytes) to decoded values: zero + q * scale. */
ZPP_AVX512_INLINE __m512 dequant16(__m128i c, int asym, __m512 scale,
                                   __m512 zero) {
  __m512i q = asym ? _mm512_cvtepu8_epi32(c) : _mm512_cvtepi8_epi32(c);
  return _mm512_add_ps(zero, _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
}

/* The scalar loop body of zpp_quant_decode_blocks_scalar for one element. */
ZPP_AVX512_INLINE void decode_one(const uint8_t *payload, size_t i, int bits,
                                  int asym, float scale, float zero, void *dst,
                                  size_t j, int out_kind) {
  uint32_t stored = bits == 8 ? payload[i] : (payload[i / 2] >> (4 * (i & 1))) & 0xfu;
  float v = zpp_qm_dequantize(zpp_qm_code_value(stored, bits, asym), scale, zero);
  if (out_kind == ZPP_QM_OUT_ACC)
    zpp_qm_store(dst, j, ZPP_QM_F32, zpp_qm_add(zpp_qm_load(dst, j, ZPP_QM_F32), v));
  else
    zpp_qm_store(dst, j, out_kind, v);
}

/* The 16 INT4 codes by stored nibble k: k (asym), ((k ^ 8) & 0xf) - 8
 * (sym, sign-extended), for the table decoders below. */
ZPP_AVX512_INLINE __m128i lut4_codes(int asym) {
  const __m128i k = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return asym ? k : _mm_sub_epi8(_mm_xor_si128(k, _mm_set1_epi8(8)), _mm_set1_epi8(8));
}

/* INT4 to fp16/bf16: a block has only 16 decoded values, so they are
 * computed once per block with the same vector arithmetic (lane k holds
 * the value of stored nibble k) and the elements are looked up with
 * vpermw from that 16-entry table of 16-bit results. */
ZPP_AVX512_INLINE void decode_block_lut4(const uint8_t *in, size_t off,
                                         size_t len, int asym, int out_kind,
                                         __m512 vs, __m512 vz, void *dst) {
  const __m128i codes = lut4_codes(asym);
  const __m128i m = _mm_set1_epi8(0x0f);
  __m512 v = dequant16(codes, asym, vs, vz);
  __m256i t16 = out_kind == ZPP_QM_F16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)
                                       : to_bf16x16(v, 1); /* once per block */
  __m512i tab = _mm512_castsi256_si512(t16);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m128i b = _mm_loadu_si128((const __m128i *)(in + i / 2));
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    __m256i idx8 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)),
                                           _mm_unpackhi_epi8(lo, hi), 1);
    _mm512_storeu_si512((uint16_t *)dst + off + i,
                        _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(idx8), tab));
  }
  for (; i + 16 <= len; i += 16) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(in + i / 2));
    __m128i idx8 = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    _mm256_storeu_si256((__m256i *)((uint16_t *)dst + off + i),
                        _mm512_castsi512_si256(_mm512_permutexvar_epi16(
                            _mm512_castsi256_si512(_mm256_cvtepu8_epi16(idx8)), tab)));
  }
  for (; i < len; i++) {
    uint32_t stored = (in[i / 2] >> (4 * (i & 1))) & 0xfu;
    float x = zpp_qm_dequantize(zpp_qm_code_value(stored, 4, asym), _mm512_cvtss_f32(vs),
                                _mm512_cvtss_f32(vz));
    zpp_qm_store(dst, off + i, out_kind, x);
  }
}

/* INT4 to fp32, stored or added: the same table of the block's 16 decoded
 * values (dequant16's arithmetic, lane k: stored nibble k), the elements
 * looked up with vpermps instead of converted and scaled one by one. */
ZPP_AVX512_INLINE void decode_block_lut4_f32(const uint8_t *in, size_t off,
                                             size_t len, int asym,
                                             int out_kind, __m512 vs,
                                             __m512 vz, void *dst) {
  const __m128i codes = lut4_codes(asym);
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m512 tab = dequant16(codes, asym, vs, vz);
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m128i b = _mm_loadu_si128((const __m128i *)(in + i / 2));
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    store16(dst, off + i, out_kind, 0,
            _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), tab));
    store16(dst, off + i + 16, out_kind, 0,
            _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), tab));
  }
  for (; i + 16 <= len; i += 16) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(in + i / 2));
    __m128i idx8 = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    store16(dst, off + i, out_kind, 0, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(idx8), tab));
  }
  for (; i < len; i++)
    decode_one(in, i, 4, asym, _mm512_cvtss_f32(vs), _mm512_cvtss_f32(vz), dst, off + i,
               out_kind);
}

ZPP_AVX512_INLINE void decode_block(const uint8_t *meta, const uint8_t *in,
                                    size_t off, size_t len, int bits, int asym,
                                    int out_kind, int nan, void *dst) {
  float scale, zero = 0.0f;
  __m512 vs, vz;
  size_t i = 0;
  memcpy(&scale, meta, 4);
  if (asym)
    memcpy(&zero, meta + 4, 4);
  vs = _mm512_set1_ps(scale);
  vz = _mm512_set1_ps(zero);
  if (bits == 4 && (out_kind == ZPP_QM_F16 || out_kind == ZPP_QM_BF16)) {
    decode_block_lut4(in, off, len, asym, out_kind, vs, vz, dst);
    return;
  }
  if (bits == 4) { /* fp32 or accumulate */
    decode_block_lut4_f32(in, off, len, asym, out_kind, vs, vz, dst);
    return;
  }
  /* INT8 from here: INT4 took a table path above */
  for (; i + 64 <= len; i += 64) {
    store16(dst, off + i, out_kind, nan,
            dequant16(_mm_loadu_si128((const __m128i *)(in + i)), asym, vs, vz));
    store16(dst, off + i + 16, out_kind, nan,
            dequant16(_mm_loadu_si128((const __m128i *)(in + i + 16)), asym, vs, vz));
    store16(dst, off + i + 32, out_kind, nan,
            dequant16(_mm_loadu_si128((const __m128i *)(in + i + 32)), asym, vs, vz));
    store16(dst, off + i + 48, out_kind, nan,
            dequant16(_mm_loadu_si128((const __m128i *)(in + i + 48)), asym, vs, vz));
  }
  for (; i + 16 <= len; i += 16)
    store16(dst, off + i, out_kind, nan,
            dequant16(_mm_loadu_si128((const __m128i *)(in + i)), asym, vs, vz));
  for (; i < len; i++)
    decode_one(in, i, bits, asym, scale, zero, dst, off + i, out_kind);
}

/* A decoded value zero + q * scale can be NaN only when scale or zero is
 * not finite (finite * integer is finite or +-Inf; finite + Inf is Inf). */
ZPP_AVX512_INLINE int meta_finite(const uint8_t *meta, int asym) {
  uint32_t s, z = 0;
  memcpy(&s, meta, 4);
  if (asym)
    memcpy(&z, meta + 4, 4);
  return (s & ZPP_QM_ABS_MASK) < ZPP_QM_EXP_MASK &&
         (z & ZPP_QM_ABS_MASK) < ZPP_QM_EXP_MASK;
}

ZPP_AVX512_INLINE void decode_all(const zpp_qcfg_t *cfg, const uint8_t *src,
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

#define ZPP_AVX512_DECODE_CASE(name, bits, asym, kind)                        \
  static ZPP_AVX512_TARGET void name(const zpp_qcfg_t *cfg,                   \
                                     const uint8_t *src, size_t count,        \
                                     void *dst) {                             \
    decode_all(cfg, src, count, dst, bits, asym, kind);                       \
  }
#define ZPP_AVX512_DECODE_KINDS(p, bits, asym)                                \
  ZPP_AVX512_DECODE_CASE(p##_f32, bits, asym, ZPP_QM_F32)                     \
  ZPP_AVX512_DECODE_CASE(p##_f16, bits, asym, ZPP_QM_F16)                     \
  ZPP_AVX512_DECODE_CASE(p##_bf16, bits, asym, ZPP_QM_BF16)                   \
  ZPP_AVX512_DECODE_CASE(p##_acc, bits, asym, ZPP_QM_OUT_ACC)
ZPP_AVX512_DECODE_KINDS(dec_8s, 8, 0)
ZPP_AVX512_DECODE_KINDS(dec_8a, 8, 1)
ZPP_AVX512_DECODE_KINDS(dec_4s, 4, 0)
ZPP_AVX512_DECODE_KINDS(dec_4a, 4, 1)

typedef void (*decode_case_fn)(const zpp_qcfg_t *, const uint8_t *, size_t,
                               void *);

/* Indexed [bits == 4][asym][out_kind]; out_kind order F32, F16, BF16, ACC
 * (the values 0..3 of quant_math.h and quant_cpu.h). */
static const decode_case_fn decode_cases[2][2][4] = {
    {{dec_8s_f32, dec_8s_f16, dec_8s_bf16, dec_8s_acc},
     {dec_8a_f32, dec_8a_f16, dec_8a_bf16, dec_8a_acc}},
    {{dec_4s_f32, dec_4s_f16, dec_4s_bf16, dec_4s_acc},
     {dec_4a_f32, dec_4a_f16, dec_4a_bf16, dec_4a_acc}}};

static void decode_avx512(const zpp_qcfg_t *cfg, const uint8_t *src,
                          size_t count, int out_kind, void *dst) {
  if (cfg->block < ZPP_AVX512_MIN_BLOCK) {
    zpp_quant_decode_scalar(cfg, src, count, out_kind, dst);
    return;
  }
  decode_cases[cfg->bits == 4][cfg->asym != 0][out_kind](cfg, src, count, dst);
}

/* ---- compressed-domain sums (quant_cpu.h; docs/format.md, "Integer
 * sums") ------------------------------------------------------------------
 * The scalar kernels' arithmetic on 16 lanes, lane by lane the same IEEE
 * operations in the same order (default MXCSR rounding, no FMA):
 *   - fl(x + res) is one vaddps; absmax an integer max of the abs bits;
 *   - codes: fl(x * inv), clamped with max/min (the scalar clamp's value
 *     for every non-NaN lane, and a block with a NaN or Inf has E = 127:
 *     no codes), vcvtps2dq (nearest even = zpp_qm_rint_small, |v| <= 255);
 *     stochastic rounding as quant16_sr;
 *   - units: fl(x * 2^-E) and vcvtps2dq (|v| <= 2^22, where the scalar
 *     magic-number rint is exact too); the residual's clamp to +-2^22
 *     takes NaN to 0 before min/max see it;
 *   - the products m q of the sum fit int16 (255 * 128), their sums are
 *     exact int32 adds in any order;
 *   - decoded values are 0 + q * scale (two roundings, the +0 kept: it
 *     turns -0 into +0 as the scalar zpp_qm_dequantize does).
 * The last (< 16) elements of a block, and 16 whose stochastic indices
 * cross a 2^32 boundary, take the scalar formulas of quant_math.h. */

ZPP_AVX512_INLINE __m512 isum_load16(const void *src, const float *res,
                                     size_t i, int dtype) {
  __m512 x = load16(src, i, dtype);
  return res != NULL ? _mm512_add_ps(x, _mm512_loadu_ps(res + i)) : x;
}

/* 0 in the lanes whose value is Inf or NaN (zpp_qm_ef_residual). */
ZPP_AVX512_INLINE __m512 finite_or_zero(__m512 r) {
  __mmask16 bad = _mm512_cmpge_epu32_mask(
      _mm512_and_si512(_mm512_castps_si512(r),
                       _mm512_set1_epi32((int)ZPP_QM_ABS_MASK)),
      _mm512_set1_epi32((int)ZPP_QM_EXP_MASK));
  return _mm512_maskz_mov_ps((__mmask16)~bad, r);
}

/* zpp_qm_feedback of 16 lanes: e old residual, x compensated value. */
ZPP_AVX512_INLINE __m512 feedback16(__m512 e, __m512 x, __m512i q, __m512 scale,
                                    float beta, float omega) {
  __m512 dec = _mm512_add_ps(_mm512_setzero_ps(),
                             _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
  __m512 d = _mm512_sub_ps(x, dec);
  if (beta == 0.0f)
    return finite_or_zero(d);
  return finite_or_zero(_mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(beta), e),
                                      _mm512_mul_ps(_mm512_set1_ps(omega), d)));
}

/* zpp_qm_quantize of a MUL-kind block, clamp included (fl(x inv) may
 * pass qmax by the roundings of the scale and of inv). */
ZPP_AVX512_INLINE __m512i iquant16(__m512 x, const qvec_t *p) {
  x = _mm512_mul_ps(x, p->inv);
  x = _mm512_min_ps(_mm512_max_ps(x, p->lo), p->hi);
  return _mm512_cvtps_epi32(x);
}

/* Stores 16 codes (element i, a multiple of 16, of the block). */
ZPP_AVX512_INLINE void put16(uint8_t *pl, size_t i, int bits, __m512i q) {
  if (bits == 8)
    _mm_storeu_si128((__m128i *)(pl + i), bytes16(q));
  else
    _mm_storel_epi64((__m128i *)(pl + i / 2), nibbles16(q));
}

/* One code into a packed payload, as the scalar kernels store it. */
ZPP_AVX512_INLINE void put1(uint8_t *pl, size_t i, int bits, int q) {
  uint8_t c = zpp_qm_code_bits(q);
  if (bits == 8)
    pl[i] = c;
  else if (i % 2 == 0)
    pl[i / 2] = (uint8_t)(c & 0xfu);
  else
    pl[i / 2] = (uint8_t)(pl[i / 2] | (uint8_t)(c << 4));
}

/* Code i of a packed payload (sign-extended). */
ZPP_AVX512_INLINE int get1(const uint8_t *pl, size_t i, int bits) {
  uint32_t st = bits == 8 ? pl[i] : (pl[i / 2] >> (4 * (i & 1))) & 0xfu;
  return zpp_qm_code_value(st, bits, 0);
}

/* Codes [i, i+16) (i a multiple of 16) as 16 int8 in element order. */
ZPP_AVX512_INLINE __m128i get16(const uint8_t *pl, size_t i, int bits) {
  __m128i b, lo, hi;
  if (bits == 8)
    return _mm_loadu_si128((const __m128i *)(pl + i));
  b = _mm_loadl_epi64((const __m128i *)(pl + i / 2));
  lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
  return _mm_sub_epi8(
      _mm_xor_si128(_mm_unpacklo_epi8(lo, hi), _mm_set1_epi8(8)),
      _mm_set1_epi8(8));
}

/* Codes [i, i+32) (i a multiple of 32) as 32 int8 in element order. */
ZPP_AVX512_INLINE __m256i get32(const uint8_t *pl, size_t i, int bits) {
  __m128i b, lo, hi;
  __m256i c;
  if (bits == 8)
    return _mm256_loadu_si256((const __m256i *)(pl + i));
  b = _mm_loadu_si128((const __m128i *)(pl + i / 2));
  lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
  hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
  c = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)),
                              _mm_unpackhi_epi8(lo, hi), 1);
  return _mm256_sub_epi8(_mm256_xor_si256(c, _mm256_set1_epi8(8)),
                         _mm256_set1_epi8(8));
}

ZPP_AVX512_INLINE void isum_absmax_all(const zpp_qcfg_t *cfg, int dtype,
                                       const void *src, const float *res,
                                       size_t count, uint32_t *amax) {
  const __m512i mask = _mm512_set1_epi32((int)ZPP_QM_ABS_MASK);
  size_t nb = zpp_quant_nblocks(cfg, count), es = zpp_qm_dtype_bytes(dtype);
  size_t pf = 0, b, i;
  for (b = 0; b < nb; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    uint32_t r;
    zpp_qcpu_prefetch(src, &pf, (off + len) * es + ZPP_QCPU_PREFETCH_AHEAD,
                      count * es);
    if (res == NULL) { /* the encoder's statistics, exact for every dtype */
      amax[b] = block_absmax(src, off, len, dtype);
      continue;
    }
    for (i = 0; i + 32 <= len; i += 32) {
      __m512 x0 = isum_load16(src, res, off + i, dtype);
      __m512 x1 = isum_load16(src, res, off + i + 16, dtype);
      a0 =
          _mm512_max_epu32(a0, _mm512_and_si512(_mm512_castps_si512(x0), mask));
      a1 =
          _mm512_max_epu32(a1, _mm512_and_si512(_mm512_castps_si512(x1), mask));
    }
    for (; i + 16 <= len; i += 16)
      a0 = _mm512_max_epu32(
          a0, _mm512_and_si512(
                  _mm512_castps_si512(isum_load16(src, res, off + i, dtype)),
                  mask));
    r = hmax_epu32(_mm512_max_epu32(a0, a1));
    for (; i < len; i++) {
      uint32_t a =
          zpp_qm_f32_bits(zpp_qm_load(src, off + i, dtype) + res[off + i]) &
          ZPP_QM_ABS_MASK;
      r = a > r ? a : r;
    }
    amax[b] = r;
  }
}

/* INT4 codes of 128 bf16 elements (no residual, MUL block): 64 bytes of
 * payload.  A dword of the input holds elements 2 j (low half) and 2 j + 1
 * (high half); shifting the low half up and masking the high half widens
 * them to fp32 exactly, with no shuffle, into an even and an odd vector of
 * the same 16 pairs, each quantized as iquant16.  The signed packs (exact:
 * the codes fit in int8) put the even codes and the odd codes of the same
 * pairs at the same bytes, so the even code's low nibble and the odd one's
 * shifted up make the payload byte of the pair; a dword permutation
 * undoes the packs' 128-bit interleave (pair group 4 a + k, a the 32
 * elements, k the 128-bit lane, lies at dword 4 k + a). */
ZPP_AVX512_INLINE __m512i isum_bf16_nibbles128(const uint16_t *x,
                                               const qvec_t *v) {
  static const int32_t order[16] = {0, 4, 8,  12, 1, 5, 9,  13,
                                    2, 6, 10, 14, 3, 7, 11, 15};
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  __m512i qe[4], qo[4], e, o;
  int a;
  for (a = 0; a < 4; a++) {
    __m512i w = _mm512_loadu_si512(x + 32 * a);
    qe[a] = iquant16(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), v);
    qo[a] = iquant16(_mm512_castsi512_ps(_mm512_and_si512(w, hi)), v);
  }
  e = _mm512_packs_epi16(_mm512_packs_epi32(qe[0], qe[1]),
                         _mm512_packs_epi32(qe[2], qe[3]));
  o = _mm512_packs_epi16(_mm512_packs_epi32(qo[0], qo[1]),
                         _mm512_packs_epi32(qo[2], qo[3]));
  e = _mm512_or_si512(
      _mm512_and_si512(e, _mm512_set1_epi8(0x0f)),
      _mm512_and_si512(_mm512_slli_epi16(o, 4), _mm512_set1_epi8((char)0xf0)));
  return _mm512_permutexvar_epi32(_mm512_loadu_si512(order), e);
}

ZPP_AVX512_INLINE void isum_encode_all(const zpp_qcfg_t *cfg, int dtype,
                                       int bits, int sr, const void *src,
                                       float *res, float beta,
                                       const uint32_t *amax, const int8_t *uexp,
                                       size_t count, uint8_t *dst) {
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
      for (; i + 128 <= len; i += 128)
        _mm512_storeu_si512(
            pl + i / 2,
            isum_bf16_nibbles128((const uint16_t *)src + off + i, &v));
    if (bits == 4 && !sr && live) /* 64 codes at a time: nibbles64 */
      for (; i + 64 <= len; i += 64) {
        __m512 x0 = isum_load16(src, res, off + i, dtype);
        __m512 x1 = isum_load16(src, res, off + i + 16, dtype);
        __m512 x2 = isum_load16(src, res, off + i + 32, dtype);
        __m512 x3 = isum_load16(src, res, off + i + 48, dtype);
        __m512i q0 = iquant16(x0, &v), q1 = iquant16(x1, &v);
        __m512i q2 = iquant16(x2, &v), q3 = iquant16(x3, &v);
        _mm256_storeu_si256((__m256i *)(pl + i / 2), nibbles64(q0, q1, q2, q3));
        if (res != NULL) {
          float *r = res + off + i;
          _mm512_storeu_ps(
              r, feedback16(_mm512_loadu_ps(r), x0, q0, v.scale, beta, omega));
          _mm512_storeu_ps(r + 16, feedback16(_mm512_loadu_ps(r + 16), x1, q1,
                                              v.scale, beta, omega));
          _mm512_storeu_ps(r + 32, feedback16(_mm512_loadu_ps(r + 32), x2, q2,
                                              v.scale, beta, omega));
          _mm512_storeu_ps(r + 48, feedback16(_mm512_loadu_ps(r + 48), x3, q3,
                                              v.scale, beta, omega));
        }
      }
    for (; i + 16 <= len; i += 16) {
      uint64_t idx = cfg->base + off + i;
      __m512 x;
      __m512i q = _mm512_setzero_si512();
      if (sr && (uint32_t)idx > 0xfffffff0u)
        break; /* the high word changes inside these 16: scalar below */
      x = isum_load16(src, res, off + i, dtype);
      if (live)
        q = sr ? quant16_sr(x, &v, 0, 0, rand24x16(cfg, idx)) : iquant16(x, &v);
      put16(pl, i, bits, q);
      if (res != NULL)
        _mm512_storeu_ps(res + off + i,
                         feedback16(_mm512_loadu_ps(res + off + i), x, q,
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

/* The own share of 16 lanes in units, zpp_qm_unit_own(fl(own + res), E)
 * (unit: E finite; su = 2^-E), and with res non-NULL its new residual
 * (vu = zpp_qm_unit_value(E)). */
ZPP_AVX512_INLINE __m512i isum_own16(const void *own, float *res, size_t i,
                                     int dtype, int unit, __m512 su, __m512 vu,
                                     float beta, float omega) {
  __m512 e0, x;
  __m512i s;
  if (res == NULL)
    return unit ? _mm512_cvtps_epi32(_mm512_mul_ps(load16(own, i, dtype), su))
                : _mm512_setzero_si512();
  e0 = _mm512_loadu_ps(res + i);
  x = _mm512_add_ps(load16(own, i, dtype), e0);
  s = unit ? _mm512_cvtps_epi32(_mm512_mul_ps(x, su)) : _mm512_setzero_si512();
  _mm512_storeu_ps(res + i, feedback16(e0, x, s, vu, beta, omega));
  return s;
}

ZPP_AVX512_INLINE void isum_sum_all(const zpp_qcfg_t *cfg, int dtype, int bits,
                                    const void *own, float *res, float beta,
                                    const int8_t *uexp,
                                    const uint8_t *const *srcs, int n,
                                    size_t count, size_t b0, size_t b1,
                                    size_t ob, int32_t *out) {
  size_t pb = zpp_qm_payload_bytes(cfg->block, bits);
  size_t cb = zpp_isum_code_bytes(cfg, count), b, i;
  float omega = 1.0f - beta;
  int j;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg->block;
    size_t len = count - off < cfg->block ? count - off : cfg->block;
    int e = uexp[b];
    int unit = e != ZPP_QM_UEXP_NONFINITE && e != ZPP_QM_UEXP_ZERO;
    float uv = zpp_qm_unit_value(e);
    __m512 su = _mm512_set1_ps(unit ? zpp_qm_pow2(-e) : 0.0f);
    __m512 vu = _mm512_set1_ps(uv);
    i = 0;
    /* INT4: the products of up to 16 messages sum exactly in int16
     * (16 * 255 * 8 < 2^15), widened once */
    if (bits == 4 && n <= 16)
      for (; i + 32 <= len; i += 32) {
        __m512i s0 = _mm512_setzero_si512(), s1 = s0, w = s0;
        for (j = 0; j < n; j++)
          w = _mm512_add_epi16(
              w, _mm512_mullo_epi16(
                     _mm512_cvtepi8_epi16(get32(srcs[j] + b * pb, i, 4)),
                     _mm512_set1_epi16((short)srcs[j][cb + b])));
        if (own != NULL) {
          s0 = isum_own16(own, res, off + i, dtype, unit, su, vu, beta, omega);
          s1 = isum_own16(own, res, off + i + 16, dtype, unit, su, vu, beta,
                          omega);
        }
        s0 = _mm512_add_epi32(s0,
                              _mm512_cvtepi16_epi32(_mm512_castsi512_si256(w)));
        s1 = _mm512_add_epi32(
            s1, _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w, 1)));
        _mm512_storeu_si512(out + off - ob + i, s0);
        _mm512_storeu_si512(out + off - ob + i + 16, s1);
      }
    for (; i + 32 <= len; i += 32) {
      __m512i s0 = _mm512_setzero_si512(), s1 = s0;
      if (own != NULL) {
        s0 = isum_own16(own, res, off + i, dtype, unit, su, vu, beta, omega);
        s1 = isum_own16(own, res, off + i + 16, dtype, unit, su, vu, beta,
                        omega);
      }
      for (j = 0; j < n; j++) {
        __m512i w = _mm512_mullo_epi16(
            _mm512_cvtepi8_epi16(get32(srcs[j] + b * pb, i, bits)),
            _mm512_set1_epi16((short)srcs[j][cb + b]));
        s0 = _mm512_add_epi32(s0,
                              _mm512_cvtepi16_epi32(_mm512_castsi512_si256(w)));
        s1 = _mm512_add_epi32(
            s1, _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w, 1)));
      }
      _mm512_storeu_si512(out + off - ob + i, s0);
      _mm512_storeu_si512(out + off - ob + i + 16, s1);
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

/* zpp_qm_unit_res of 16 lanes (su = 2^-E). */
ZPP_AVX512_INLINE __m512i unit_res16(__m512 r, __m512 su) {
  const __m512 lim = _mm512_set1_ps((float)ZPP_QM_ISUM_MAX);
  __m512 v = _mm512_mul_ps(r, su);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  v = _mm512_max_ps(_mm512_min_ps(v, lim),
                    _mm512_sub_ps(_mm512_setzero_ps(), lim));
  return _mm512_cvtps_epi32(_mm512_maskz_mov_ps((__mmask16)~nan, v));
}

ZPP_AVX512_INLINE void isum_requant_all(const zpp_qcfg_t *cfg2, int bits2,
                                        int sr, const int32_t *in,
                                        const int8_t *uexp, float *res,
                                        float beta, size_t count, size_t b0,
                                        size_t b1, size_t ob, uint8_t *dst) {
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
    __m512 su = _mm512_set1_ps(ures ? zpp_qm_pow2(-e) : 0.0f);
    __m512 vu = _mm512_set1_ps(unit);
    uint8_t *pl = dst + nb * 4 + b * pb;
    __m512i a0 = _mm512_setzero_si512();
    uint32_t m;
    zpp_qm_params_t p;
    qvec_t v;
    int live;
    for (i = 0; i + 16 <= len; i += 16) {
      __m512i jv = _mm512_loadu_si512(in + off - ob + i);
      if (ures)
        jv = _mm512_add_epi32(jv,
                              unit_res16(_mm512_loadu_ps(res + off + i), su));
      a0 = _mm512_max_epu32(a0, _mm512_abs_epi32(jv));
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
    for (i = 0; i + 16 <= len; i += 16) {
      uint64_t idx = cfg2->base + off + i;
      __m512i iv, jv, q = _mm512_setzero_si512();
      __m512 x;
      if (sr && (uint32_t)idx > 0xfffffff0u)
        break;
      iv = _mm512_loadu_si512(in + off - ob + i);
      jv = iv;
      if (ures)
        jv = _mm512_add_epi32(jv,
                              unit_res16(_mm512_loadu_ps(res + off + i), su));
      x = _mm512_cvtepi32_ps(jv);
      if (live)
        q = sr ? quant16_sr(x, &v, 0, 0, rand24x16(cfg2, idx))
               : iquant16(x, &v);
      put16(pl, i, bits2, q);
      if (res != NULL) {
        __m512 e0 = _mm512_loadu_ps(res + off + i);
        __m512 xr =
            _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(iv), vu), e0);
        _mm512_storeu_ps(res + off + i,
                         feedback16(e0, xr, q, v.scale, beta, omega));
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

ZPP_AVX512_INLINE void isum_finish_all(const zpp_qcfg_t *cfg2, int bits2,
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
  __m512 vd = _mm512_set1_ps(div), vr = _mm512_set1_ps(1.0f / div);
  int j;
  for (b = b0; b < b1; b++) {
    size_t off = b * cfg2->block;
    size_t len = count - off < cfg2->block ? count - off : cfg2->block;
    float unit = zpp_qm_unit_value(uexp[b]);
    __m512 vu = _mm512_set1_ps(unit);
    for (i = 0; i + 16 <= len; i += 16) {
      __m512 acc = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_loadu_si512(own + off - ob + i)), vu);
      for (j = 0; j < n; j++) {
        float sc;
        memcpy(&sc, srcs[j] + b * 4, 4);
        acc = _mm512_add_ps(
            acc,
            _mm512_add_ps(
                _mm512_setzero_ps(),
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                  get16(srcs[j] + nb * 4 + b * pb, i, bits2))),
                              _mm512_set1_ps(sc))));
      }
      store16(dst, off + i, dtype, 1,
              p2 ? _mm512_mul_ps(acc, vr) : _mm512_div_ps(acc, vd));
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

static ZPP_AVX512_TARGET void isum_absmax_avx512(const zpp_qcfg_t *cfg,
                                                 int dtype, const void *src,
                                                 const float *res, size_t count,
                                                 uint32_t *amax) {
  ZPP_ISUM_BY_DTYPE(dtype, isum_absmax_all(cfg, dt_, src, res, count, amax));
}

static ZPP_AVX512_TARGET void
isum_encode_avx512(const zpp_qcfg_t *cfg, int dtype, const void *src,
                   float *res, float beta, const uint32_t *amax,
                   const int8_t *uexp, size_t count, uint8_t *dst) {
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

static ZPP_AVX512_TARGET void isum_sum_avx512(const zpp_qcfg_t *cfg, int dtype,
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

static ZPP_AVX512_TARGET void isum_requant_avx512(const zpp_qcfg_t *cfg2,
                                                  const int32_t *in,
                                                  const int8_t *uexp,
                                                  float *res, float beta,
                                                  size_t count, uint8_t *dst) {
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

static ZPP_AVX512_TARGET void
isum_finish_avx512(const zpp_qcfg_t *cfg2, const int32_t *own,
                   const int8_t *uexp, const uint8_t *const *srcs, int n,
                   size_t count, float div, int dtype, void *dst) {
  ZPP_ISUM_BY_DTYPE(
      dtype,
      ZPP_ISUM_BY_BITS(cfg2->bits,
                       isum_finish_all(cfg2, bt_, own, uexp, srcs, n, count, 0,
                                       zpp_quant_nblocks(cfg2, count), 0, div,
                                       dt_, dst)));
}

/* The fused steps: the bodies above over one tile of blocks at a time. */
static ZPP_AVX512_TARGET void isum_sum_requant_avx512(
    const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2, int dtype, const void *own,
    float *res1, const int8_t *uexp, const uint8_t *const *srcs, int n,
    float *res, float beta, size_t count, int32_t *tmp, uint8_t *dst) {
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

static ZPP_AVX512_TARGET void
isum_sum_finish_avx512(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2, int dtype,
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

static const zpp_quant_cpu_ops_t avx512_ops = {
    "avx512",
    encode_avx512,
    decode_avx512,
    {isum_absmax_avx512, isum_encode_avx512, isum_sum_avx512,
     isum_requant_avx512, isum_finish_avx512, isum_sum_requant_avx512,
     isum_sum_finish_avx512}};

/* F16C is CPUID.1:ECX bit 29; __builtin_cpu_supports does not know it in
 * every compiler.  Its YMM state is covered by the AVX2 check. */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx512(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      cpu_has_f16c())
    return &avx512_ops;
  return NULL;
}

#else /* not x86-64 with GCC or Clang */

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx512(void) { return NULL; }

#endif
