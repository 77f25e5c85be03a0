/*
 * Transforms applied around the block codec (docs/format.md):
 *   - the orthonormal Hadamard rotation of qgZ's Hadamard option, in groups
 *     of g = 2^k elements (zpp_qm_fwht is the per-group definition);
 *   - the weight difference of qWD, target - fp32(reconstruction).
 * Host versions in transform.c (scalar and AVX2, bitwise equal), device
 * versions in transform_cuda.cu.  Internal header: not installed.
 */
#ifndef ZPP_KERNELS_TRANSFORM_H
#define ZPP_KERNELS_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[0, count) = fp32(src) with every whole group of g elements (counted
 * from element 0) rotated by zpp_qm_fwht; the last count % g elements are
 * copied unrotated.  dst may equal src when dtype is fp32.  simd != 0
 * takes the AVX2 path (the caller checked the CPU runs it). */
void zpp_tf_hadamard_host(int simd, size_t g, int dtype, const void *src,
                          size_t count, float *dst);
/* The scalar definition and the AVX2 path (tests compare them). */
void zpp_tf_hadamard_scalar(size_t g, int dtype, const void *src,
                            size_t count, float *dst);
void zpp_tf_hadamard_avx2(size_t g, int dtype, const void *src, size_t count,
                          float *dst);
/* 1 when this CPU runs zpp_tf_hadamard_avx2. */
int zpp_tf_have_avx2(void);

/* out[i] = target[i] - fp32(recon[i]) (one fp32 subtraction). */
void zpp_tf_wdiff_host(int dtype, const void *recon, const float *target,
                       size_t count, float *out);

/* Device versions on `stream` (a cudaStream_t): 0, or non-zero with the
 * CUDA message in err (or a group that is not a power of two).  Their
 * buffers may start at any byte; wdiff's out may be target. */
int zpp_tf_hadamard_device(size_t g, int dtype, const void *src,
                           size_t count, float *dst, void *stream, char *err,
                           size_t errlen);
/* One run of a batched rotation: dst[0, count) = the rotation of src
 * (as zpp_tf_hadamard_device); dst may equal src for fp32. */
typedef struct {
  const void *src;
  float *dst;
  size_t count;
} zpp_tf_run_t;
/* The rotation of every run (one group size g, one dtype), in one launch
 * per pass over all of them (one pass up to g = 8192, two up to 2^26;
 * runs beyond 32 take further launches).  Runs must not overlap each
 * other. */
int zpp_tf_hadamard_batch_device(size_t g, int dtype, const zpp_tf_run_t *runs,
                                 size_t nruns, void *stream, char *err,
                                 size_t errlen);
int zpp_tf_wdiff_device(int dtype, const void *recon, const float *target,
                        size_t count, float *out, void *stream, char *err,
                        size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_TRANSFORM_H */
