// Device transforms (transform.h): the same per-element rules as
// transform.c, through quant_math.h.  The Hadamard rotation performs, on
// every element, the operations of zpp_qm_fwht in its stage order, so it is
// bitwise equal to the host paths:
//   - convert_kernel writes fp32(src) to dst (skipped in place), in
//     launch.cuh's chunks of 16-byte accesses;
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

/* dst overlaps src not (in place, fp32, the launcher skips it) */
template <int DT>
__device__ __forceinline__ void convert_body(const void *src, size_t count,
                                             float *dst) {
  using namespace zpp_kl;
  const unsigned head = pick_head(At{src, esize<DT>}, At{dst, 4});
  const int ws = width_at(src, head, esize<DT>), wd = width_at(dst, head, 4);
  for_chunks(
      count, head,
      [&](size_t e) {
        float x[kChunk];
        load_chunk<DT, kRead>(src, e, ws, x);
        store_chunk<ZPP_QM_F32>(dst, e, wd, x);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(dst, i, load_one<DT, kRead>(src, i));
      });
}

/* The element-wise kernels (convert, scale, wdiff) access memory through
 * launch.cuh's chunks: 16-byte accesses where the alignment allows, any
 * alignment otherwise; any grid covers every element. */
__global__ void convert_kernel(int dtype, const void *src, size_t count,
                               float *dst) {
  if (dtype == ZPP_QM_F32)
    convert_body<ZPP_QM_F32>(src, count, dst);
  else if (dtype == ZPP_QM_BF16)
    convert_body<ZPP_QM_BF16>(src, count, dst);
  else
    convert_body<ZPP_QM_F16>(src, count, dst);
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

/* x[i] * c, in place */
__global__ void scale_kernel(float *x, size_t n, float c) {
  using namespace zpp_kl;
  const unsigned head = pick_head(At{x, 4});
  const int w = width_at(x, head, 4);
  for_chunks(
      n, head,
      [&](size_t e) {
        float v[kChunk];
        load_chunk<ZPP_QM_F32, kUpdate>(x, e, w, v);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          v[j] = v[j] * c;
        store_chunk<ZPP_QM_F32>(x, e, w, v);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(x, i, load_one<ZPP_QM_F32, kUpdate>(x, i) * c);
      });
}

/* out may be target; recon overlaps neither */
template <int DT>
__device__ __forceinline__ void
wdiff_body(const void *recon, const float *target, size_t count, float *out) {
  using namespace zpp_kl;
  const unsigned head =
      pick_head(At{recon, esize<DT>}, At{target, 4}, At{out, 4});
  const int wr = width_at(recon, head, esize<DT>),
            wt = width_at(target, head, 4), wo = width_at(out, head, 4);
  for_chunks(
      count, head,
      [&](size_t e) {
        float r[kChunk], t[kChunk];
        load_chunk<DT, kRead>(recon, e, wr, r);
        load_chunk<ZPP_QM_F32, kUpdate>(target, e, wt, t);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          t[j] = zpp_qm_add(t[j], -r[j]);
        store_chunk<ZPP_QM_F32>(out, e, wo, t);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(
            out, i,
            zpp_qm_add(load_one<ZPP_QM_F32, kUpdate>(target, i),
                       -load_one<DT, kRead>(recon, i)));
      });
}

__global__ void wdiff_kernel(int dtype, const void *recon, const float *target,
                             size_t count, float *out) {
  if (dtype == ZPP_QM_F32)
    wdiff_body<ZPP_QM_F32>(recon, target, count, out);
  else if (dtype == ZPP_QM_BF16)
    wdiff_body<ZPP_QM_BF16>(recon, target, count, out);
  else
    wdiff_body<ZPP_QM_F16>(recon, target, count, out);
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
  return report(zpp_kl::launch_over(wdiff_kernel, count, stream, dtype, recon,
                                    target, count, out),
                "weight-difference kernel launch", err, errlen);
}
