/*
 * Host transforms (transform.h).  The AVX2 Hadamard performs, on every
 * element, the same IEEE operations as zpp_qm_fwht in the same stage order
 * (add and subtract of the same pairs, then one multiply), so it is bitwise
 * equal to the scalar definition: stages h = 1, 2, 4 pair lanes inside one
 * 8-float vector (a permute brings the partner, a blend keeps a + b in the
 * lower lane of each pair and a - b in the upper one), stages h >= 8 pair
 * whole vectors.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "transform.h"

#include "quant_math.h"

#include <string.h>

static void load_f32(int dtype, const void *src, size_t count, float *dst) {
  size_t i;
  if (dtype == ZPP_QM_F32) {
    if ((const void *)dst != src)
      memmove(dst, src, count * sizeof(float));
    return;
  }
  for (i = 0; i < count; i++)
    dst[i] = zpp_qm_load(src, i, dtype);
}

void zpp_tf_hadamard_scalar(size_t g, int dtype, const void *src,
                            size_t count, float *dst) {
  size_t i;
  load_f32(dtype, src, count, dst);
  for (i = 0; g >= 2 && i + g <= count; i += g)
    zpp_qm_fwht(dst + i, g);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TF_AVX2 __attribute__((target("avx2")))

/* Stages h = 1, 2, 4 on one vector of 8 consecutive elements. */
static inline __attribute__((always_inline)) TF_AVX2 __m256
fwht8(__m256 v) {
  __m256 s = _mm256_permute_ps(v, 0xb1); /* partner at distance 1 */
  v = _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xaa);
  s = _mm256_permute_ps(v, 0x4e); /* distance 2 */
  v = _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xcc);
  s = _mm256_permute2f128_ps(v, v, 0x01); /* distance 4 */
  return _mm256_blend_ps(_mm256_add_ps(v, s), _mm256_sub_ps(s, v), 0xf0);
}

static TF_AVX2 void fwht_group_avx2(float *x, size_t g) {
  const __m256 c = _mm256_set1_ps(zpp_qm_hadamard_scale(g));
  size_t h, i, j;
  for (i = 0; i < g; i += 8)
    _mm256_storeu_ps(x + i, fwht8(_mm256_loadu_ps(x + i)));
  for (h = 8; h < g; h *= 2)
    for (i = 0; i < g; i += 2 * h)
      for (j = i; j < i + h; j += 8) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
  for (i = 0; i < g; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), c));
}

TF_AVX2 void zpp_tf_hadamard_avx2(size_t g, int dtype, const void *src,
                                  size_t count, float *dst) {
  size_t i;
  if (g < 8) { /* below one vector: the definition itself */
    zpp_tf_hadamard_scalar(g, dtype, src, count, dst);
    return;
  }
  load_f32(dtype, src, count, dst);
  for (i = 0; i + g <= count; i += g)
    fwht_group_avx2(dst + i, g);
}

int zpp_tf_have_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#else
void zpp_tf_hadamard_avx2(size_t g, int dtype, const void *src, size_t count,
                          float *dst) {
  zpp_tf_hadamard_scalar(g, dtype, src, count, dst);
}
int zpp_tf_have_avx2(void) { return 0; }
#endif

void zpp_tf_hadamard_host(int simd, size_t g, int dtype, const void *src,
                          size_t count, float *dst) {
  if (simd)
    zpp_tf_hadamard_avx2(g, dtype, src, count, dst);
  else
    zpp_tf_hadamard_scalar(g, dtype, src, count, dst);
}

void zpp_tf_wdiff_host(int dtype, const void *recon, const float *target,
                       size_t count, float *out) {
  size_t i;
  for (i = 0; i < count; i++)
    out[i] = target[i] - zpp_qm_load(recon, i, dtype);
}
