// Device transforms (transform.h): the same per-element rules as
// transform.c, through quant_math.h.  The Hadamard rotation performs, on
// every element, the operations of zpp_qm_fwht in its stage order, so it is
// bitwise equal to the host paths:
//   - convert_kernel writes fp32(src) to dst (skipped in place);
//   - groups of up to kSmemGroup elements: one thread per element, the
//     group in shared memory, one __syncthreads() per stage; the lower
//     element of a pair takes a + b, the upper a - b;
//   - larger groups: one launch per stage over the pairs, in global
//     memory, then one launch for the scaling.
#include <cuda_runtime.h>

#include <stdio.h>

#include "launch.cuh"
#include "quant_math.h"
#include "transform.h"

namespace {

using zpp_kl::grid_for;
using zpp_kl::kThreads;
using zpp_kl::launch;
using zpp_kl::report;

constexpr unsigned kSmemGroup = 1024; /* largest group done in one CTA */

__global__ void convert_kernel(int dtype, const void *src, size_t count,
                               float *dst) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = zpp_qm_load(src, i, dtype);
}

/* Groups of g <= kSmemGroup elements: a CTA of max(g, kThreads) threads
 * holds blockDim.x / g groups; ngroups whole groups in all. */
__global__ void hadamard_smem_kernel(float *x, size_t ngroups, unsigned g,
                                     float c) {
  __shared__ float s[kSmemGroup > kThreads ? kSmemGroup : kThreads];
  const unsigned t = threadIdx.x;
  const unsigned lane = t & (g - 1); /* position in the group */
  const size_t gpc = blockDim.x / g;
  for (size_t base = blockIdx.x * gpc; base < ngroups;
       base += (size_t)gridDim.x * gpc) {
    const size_t grp = base + t / g;
    const bool live = grp < ngroups;
    float v = live ? x[grp * g + lane] : 0.0f;
    for (unsigned h = 1; h < g; h *= 2) {
      s[t] = v;
      __syncthreads();
      v = (lane & h) == 0 ? zpp_qm_add(v, s[t + h])
                          : zpp_qm_add(s[t - h], -v);
      __syncthreads();
    }
    if (live)
      x[grp * g + lane] = v * c;
  }
}

/* One stage h of groups of g elements: pair p is (j, j + h) with j =
 * (p / h) * 2h + p % h, over the n whole-group elements. */
__global__ void hadamard_stage_kernel(float *x, size_t n, size_t h) {
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < n / 2;
       p += (size_t)gridDim.x * blockDim.x) {
    size_t j = p / h * 2 * h + p % h;
    float a = x[j], b = x[j + h];
    x[j] = zpp_qm_add(a, b);
    x[j + h] = zpp_qm_add(a, -b);
  }
}

__global__ void scale_kernel(float *x, size_t n, float c) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = x[i] * c;
}

__global__ void wdiff_kernel(int dtype, const void *recon, const float *target,
                             size_t count, float *out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = zpp_qm_add(target[i], -zpp_qm_load(recon, i, dtype));
}

}  // namespace

extern "C" int zpp_tf_hadamard_device(size_t g, int dtype, const void *src,
                                      size_t count, float *dst, void *stream,
                                      char *err, size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (count == 0) return 0;
  if (dtype != ZPP_QM_F32 || (const void *)dst != src) {
    if (report(launch(convert_kernel, (unsigned)grid_for(count), kThreads, st,
                      dtype, src, count, dst),
               "hadamard convert kernel launch", err, errlen))
      return 1;
  }
  size_t ngroups = g >= 2 ? count / g : 0;
  if (ngroups == 0) return 0;
  float c = zpp_qm_hadamard_scale(g);
  if (g <= kSmemGroup) {
    unsigned threads = g > (size_t)kThreads ? (unsigned)g : kThreads;
    size_t gpc = threads / g;
    size_t ctas = (ngroups + gpc - 1) / gpc;
    if (ctas > 65535 * 16) ctas = 65535 * 16;
    return report(launch(hadamard_smem_kernel, (unsigned)ctas, threads, st, dst,
                         ngroups, (unsigned)g, c),
                  "hadamard kernel launch", err, errlen);
  }
  size_t n = ngroups * g;
  for (size_t h = 1; h < g; h *= 2) {
    if (report(launch(hadamard_stage_kernel, (unsigned)grid_for(n / 2),
                      kThreads, st, dst, n, h),
               "hadamard stage kernel launch", err, errlen))
      return 1;
  }
  return report(
      launch(scale_kernel, (unsigned)grid_for(n), kThreads, st, dst, n, c),
      "hadamard scale kernel launch", err, errlen);
}

extern "C" int zpp_tf_wdiff_device(int dtype, const void *recon,
                                   const float *target, size_t count,
                                   float *out, void *stream, char *err,
                                   size_t errlen) {
  if (count == 0) return 0;
  return report(launch(wdiff_kernel, (unsigned)grid_for(count), kThreads,
                       (cudaStream_t)stream, dtype, recon, target, count, out),
                "weight-difference kernel launch", err, errlen);
}
