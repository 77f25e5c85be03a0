// Device element-wise helpers of the collectives (elementwise.h): the same
// per-element rules as elementwise.c, through quant_math.h.
/* Device code: quant_math.h checks its accesses under the emulator. */
#define ZPP_QM_DEVICE_CODE 1

#include <cuda_runtime.h>

#include <stdio.h>

#include "core/core.h" /* zpp_setting_long */
#include "elementwise.h"
#include "launch.cuh"
#include "quant_math.h"

namespace {

using zpp_kl::At;
using zpp_kl::esize;
using zpp_kl::for_chunks;
using zpp_kl::kChunk;
using zpp_kl::kRead;
using zpp_kl::kUpdate;
using zpp_kl::launch_over;
using zpp_kl::load_chunk;
using zpp_kl::load_one;
using zpp_kl::pick_head;
using zpp_kl::report;
using zpp_kl::store_chunk;
using zpp_kl::store_one;
using zpp_kl::width_at;

/* Each kernel takes the dtype at run time, as the host functions do, and
 * runs the body of that dtype (a branch every thread takes alike).  The
 * access pattern is launch.cuh's: chunks of kChunk elements through 16-byte
 * accesses where the alignment allows, any alignment otherwise.  A buffer
 * the kernel writes may be the one it reads (in place) only where the
 * comment says so, and then exactly, element for element. */

/* out may be acc when dtype is fp32 */
template <int DT>
__device__ __forceinline__ void finish_body(const float *acc, size_t count,
                                            float div, void *out) {
  constexpr auto K = DT == ZPP_QM_F32 ? kUpdate : kRead;
  const unsigned head = pick_head(At{acc, 4}, At{out, esize<DT>});
  const int wa = width_at(acc, head, 4), wo = width_at(out, head, esize<DT>);
  auto f = [div](float v) { return div == 1.0f ? v : __fdiv_rn(v, div); };
  for_chunks(
      count, head,
      [&](size_t e) {
        float x[kChunk];
        load_chunk<ZPP_QM_F32, K>(acc, e, wa, x);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          x[j] = f(x[j]);
        store_chunk<DT>(out, e, wo, x);
      },
      [&](size_t i) {
        store_one<DT>(out, i, f(load_one<ZPP_QM_F32, K>(acc, i)));
      });
}

__global__ void finish_kernel(const float *acc, size_t count, float div,
                              int dtype, void *out) {
  if (dtype == ZPP_QM_F32)
    finish_body<ZPP_QM_F32>(acc, count, div, out);
  else if (dtype == ZPP_QM_BF16)
    finish_body<ZPP_QM_BF16>(acc, count, div, out);
  else
    finish_body<ZPP_QM_F16>(acc, count, div, out);
}

/* in place */
template <int DT>
__device__ __forceinline__ void scale_body(void *buf, size_t count, float div) {
  const unsigned head = pick_head(At{buf, esize<DT>});
  const int w = width_at(buf, head, esize<DT>);
  for_chunks(
      count, head,
      [&](size_t e) {
        float x[kChunk];
        load_chunk<DT, kUpdate>(buf, e, w, x);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          x[j] = __fdiv_rn(x[j], div);
        store_chunk<DT>(buf, e, w, x);
      },
      [&](size_t i) {
        store_one<DT>(buf, i, __fdiv_rn(load_one<DT, kUpdate>(buf, i), div));
      });
}

__global__ void scale_kernel(int dtype, void *buf, size_t count, float div) {
  if (dtype == ZPP_QM_F32)
    scale_body<ZPP_QM_F32>(buf, count, div);
  else if (dtype == ZPP_QM_BF16)
    scale_body<ZPP_QM_BF16>(buf, count, div);
  else
    scale_body<ZPP_QM_F16>(buf, count, div);
}

/* out may be res; g overlaps neither */
template <int DT>
__device__ __forceinline__ void
add_residual_body(const void *g, const float *res, size_t count, float *out) {
  const unsigned head = pick_head(At{g, esize<DT>}, At{res, 4}, At{out, 4});
  const int wg = width_at(g, head, esize<DT>), wr = width_at(res, head, 4),
            wo = width_at(out, head, 4);
  for_chunks(
      count, head,
      [&](size_t e) {
        float x[kChunk], r[kChunk];
        load_chunk<DT, kRead>(g, e, wg, x);
        load_chunk<ZPP_QM_F32, kUpdate>(res, e, wr, r);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          x[j] = zpp_qm_add(x[j], r[j]);
        store_chunk<ZPP_QM_F32>(out, e, wo, x);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(
            out, i,
            zpp_qm_add(load_one<DT, kRead>(g, i),
                       load_one<ZPP_QM_F32, kUpdate>(res, i)));
      });
}

__global__ void add_residual_kernel(int dtype, const void *g, const float *res,
                                    size_t count, float *out) {
  if (dtype == ZPP_QM_F32)
    add_residual_body<ZPP_QM_F32>(g, res, count, out);
  else if (dtype == ZPP_QM_BF16)
    add_residual_body<ZPP_QM_BF16>(g, res, count, out);
  else
    add_residual_body<ZPP_QM_F16>(g, res, count, out);
}

/* The error to keep: e, or 0 when it is not finite. */
__device__ __forceinline__ float finite_error(float e) {
  return (zpp_qm_f32_bits(e) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK ? 0.0f : e;
}

/* res in place; x overlaps it not */
__global__ void residual_kernel(const float *x, size_t count, float *res) {
  const unsigned head = pick_head(At{x, 4}, At{res, 4});
  const int wx = width_at(x, head, 4), wr = width_at(res, head, 4);
  for_chunks(
      count, head,
      [&](size_t e) {
        float a[kChunk], r[kChunk];
        load_chunk<ZPP_QM_F32, kRead>(x, e, wx, a);
        load_chunk<ZPP_QM_F32, kUpdate>(res, e, wr, r);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          r[j] = finite_error(__fsub_rn(a[j], r[j]));
        store_chunk<ZPP_QM_F32>(res, e, wr, r);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(
            res, i,
            finite_error(__fsub_rn(load_one<ZPP_QM_F32, kRead>(x, i),
                                   load_one<ZPP_QM_F32, kUpdate>(res, i))));
      });
}

/* res in place; x and dec overlap it not */
__global__ void ema_residual_kernel(const float *x, const float *dec,
                                    size_t count, float beta, float omega,
                                    float *res) {
  const unsigned head = pick_head(At{x, 4}, At{dec, 4}, At{res, 4});
  const int wx = width_at(x, head, 4), wd = width_at(dec, head, 4),
            wr = width_at(res, head, 4);
  for_chunks(
      count, head,
      [&](size_t e) {
        float a[kChunk], d[kChunk], r[kChunk];
        load_chunk<ZPP_QM_F32, kRead>(x, e, wx, a);
        load_chunk<ZPP_QM_F32, kRead>(dec, e, wd, d);
        load_chunk<ZPP_QM_F32, kUpdate>(res, e, wr, r);
#pragma unroll
        for (int j = 0; j < kChunk; j++)
          r[j] = zpp_qm_ema_residual(r[j], a[j], d[j], beta, omega);
        store_chunk<ZPP_QM_F32>(res, e, wr, r);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(
            res, i,
            zpp_qm_ema_residual(load_one<ZPP_QM_F32, kUpdate>(res, i),
                                load_one<ZPP_QM_F32, kRead>(x, i),
                                load_one<ZPP_QM_F32, kRead>(dec, i), beta,
                                omega));
      });
}

/* out overlaps src not */
template <int DT>
__device__ __forceinline__ void widen_body(const void *src, size_t count,
                                           float *out) {
  const unsigned head = pick_head(At{src, esize<DT>}, At{out, 4});
  const int ws = width_at(src, head, esize<DT>), wo = width_at(out, head, 4);
  for_chunks(
      count, head,
      [&](size_t e) {
        float x[kChunk];
        load_chunk<DT, kRead>(src, e, ws, x);
        store_chunk<ZPP_QM_F32>(out, e, wo, x);
      },
      [&](size_t i) {
        store_one<ZPP_QM_F32>(out, i, load_one<DT, kRead>(src, i));
      });
}

__global__ void widen_kernel(int dtype, const void *src, size_t count,
                             float *out) {
  if (dtype == ZPP_QM_F32)
    widen_body<ZPP_QM_F32>(src, count, out);
  else if (dtype == ZPP_QM_BF16)
    widen_body<ZPP_QM_BF16>(src, count, out);
  else
    widen_body<ZPP_QM_F16>(src, count, out);
}

}  // namespace

extern "C" int zpp_ew_widen_device(int dtype, const void *src, size_t count,
                                   float *out, void *stream, char *err,
                                   size_t errlen) {
  if (count == 0) return 0;
  return report(
      launch_over(widen_kernel, count, stream, dtype, src, count, out),
      "widen kernel launch", err, errlen);
}

extern "C" int zpp_ew_finish_device(const float *acc, size_t count, float div,
                                    int dtype, void *out, void *stream,
                                    char *err, size_t errlen) {
  if (count == 0) return 0;
  return report(
      launch_over(finish_kernel, count, stream, acc, count, div, dtype, out),
      "finish kernel launch", err, errlen);
}

extern "C" int zpp_ew_scale_device(int dtype, void *buf, size_t count,
                                   float div, void *stream, char *err,
                                   size_t errlen) {
  if (count == 0) return 0;
  return report(
      launch_over(scale_kernel, count, stream, dtype, buf, count, div),
      "scale kernel launch", err, errlen);
}

extern "C" int zpp_ew_add_residual_device(int dtype, const void *g,
                                          const float *res, size_t count,
                                          float *out, void *stream, char *err,
                                          size_t errlen) {
  if (count == 0) return 0;
  return report(launch_over(add_residual_kernel, count, stream, dtype, g, res,
                            count, out),
                "add-residual kernel launch", err, errlen);
}

extern "C" int zpp_ew_residual_device(const float *x, size_t count, float *res,
                                      void *stream, char *err, size_t errlen) {
  if (count == 0) return 0;
  return report(launch_over(residual_kernel, count, stream, x, count, res),
                "residual kernel launch", err, errlen);
}

extern "C" int zpp_ew_ema_residual_device(const float *x, const float *dec,
                                          size_t count, float beta,
                                          float *res, void *stream, char *err,
                                          size_t errlen) {
  if (count == 0) return 0;
  float omega = 1.0f - beta;  // host fp32 subtraction: the host's omega
  return report(launch_over(ema_residual_kernel, count, stream, x, dec, count,
                            beta, omega, res),
                "moving-average residual kernel launch", err, errlen);
}

/* Stream-ordered scratch comes from a pool zpp makes per device (never
 * destroyed) whose release threshold, ZPP_SCRATCH_POOL_MB (read once),
 * keeps that much freed memory reserved: the device's default pool has
 * threshold 0 and returns its free memory to the OS at every stream,
 * event or device synchronisation, so scratch taken per call would be
 * mapped again at every step; above the threshold the memory goes back at
 * the next synchronisation, so one large call does not keep its scratch
 * from PyTorch's allocator for the life of the process.  The
 * application's default and current pools are left alone. */
namespace {

unsigned long long scratch_pool_threshold() { /* bytes */
  static const unsigned long long bytes =
      (unsigned long long)zpp_setting_long("ZPP_SCRATCH_POOL_MB", 256) << 20;
  return bytes;
}

constexpr int kScratchPoolDevices = 256;
cudaMemPool_t g_scratch_pool[kScratchPoolDevices]; /* set once per device */

cudaError_t scratch_pool(int dev, cudaMemPool_t *out) {
  cudaMemPool_t pool = __atomic_load_n(&g_scratch_pool[dev], __ATOMIC_ACQUIRE);
  if (pool != nullptr) {
    *out = pool;
    return cudaSuccess;
  }
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaError_t e = cudaMemPoolCreate(&pool, &props);
  if (e != cudaSuccess) return e;
  unsigned long long keep = scratch_pool_threshold();
  e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  cudaMemPool_t first = nullptr;
  if (e != cudaSuccess ||
      !__atomic_compare_exchange_n(&g_scratch_pool[dev], &first, pool, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    cudaMemPoolDestroy(pool); /* ours failed, or another thread's won */
    if (e != cudaSuccess) return e;
    pool = first;
  }
  *out = pool;
  return cudaSuccess;
}

}  // namespace

/* Scratch on the current device (the engine sets the communicator's). */
extern "C" int zpp_ew_alloc_device(size_t bytes, void **p, void *stream,
                                   char *err, size_t errlen) {
  *p = nullptr;
  if (bytes == 0) return 0;
  int dev = -1;
  if (report(cudaGetDevice(&dev), "cudaGetDevice", err, errlen) != 0) return 1;
  if (dev < 0 || dev >= kScratchPoolDevices) {
    snprintf(err, errlen, "device %d: scratch pools exist for devices 0..%d",
             dev, kScratchPoolDevices - 1);
    return 1;
  }
  cudaMemPool_t pool = nullptr;
  if (report(scratch_pool(dev, &pool), "cudaMemPoolCreate (scratch pool)", err,
             errlen) != 0)
    return 1;
  return report(cudaMallocFromPoolAsync(p, bytes, pool, (cudaStream_t)stream),
                "cudaMallocFromPoolAsync", err, errlen);
}

extern "C" void zpp_ew_free_device(void *p, void *stream) {
  if (p != nullptr) cudaFreeAsync(p, (cudaStream_t)stream);
}

extern "C" int zpp_ew_copy_device(void *dst, const void *src, size_t bytes,
                                  void *stream, char *err, size_t errlen) {
  if (bytes == 0) return 0;
  return report(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                (cudaStream_t)stream),
                "cudaMemcpyAsync", err, errlen);
}

extern "C" int zpp_ew_zero_device(void *p, size_t bytes, void *stream,
                                  char *err, size_t errlen) {
  if (bytes == 0) return 0;
  return report(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)stream),
                "cudaMemsetAsync", err, errlen);
}

/* ---- persistent memory, devices and events (the engine, src/engine) -- */

extern "C" int zpp_ew_alloc_persistent(size_t bytes, void **p, char *err,
                                       size_t errlen) {
  *p = nullptr;
  if (bytes == 0) return 0;
  return report(cudaMalloc(p, bytes), "cudaMalloc", err, errlen);
}

extern "C" void zpp_ew_free_persistent(void *p) {
  if (p != nullptr) cudaFree(p);
}

extern "C" int zpp_ew_get_device(int *dev, char *err, size_t errlen) {
  return report(cudaGetDevice(dev), "cudaGetDevice", err, errlen);
}

extern "C" int zpp_ew_set_device(int dev, char *err, size_t errlen) {
  return report(cudaSetDevice(dev), "cudaSetDevice", err, errlen);
}

extern "C" int zpp_ew_event_record(void **ev, void *stream, char *err,
                                   size_t errlen) {
  cudaEvent_t e = nullptr;
  int rc = report(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                  "cudaEventCreateWithFlags", err, errlen);
  if (rc != 0) return rc;
  rc = report(cudaEventRecord(e, (cudaStream_t)stream), "cudaEventRecord",
              err, errlen);
  if (rc != 0) {
    cudaEventDestroy(e);
    return rc;
  }
  *ev = (void *)e;
  return 0;
}

extern "C" int zpp_ew_event_query(void *ev, int *done, char *err,
                                  size_t errlen) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  *done = e == cudaSuccess;
  /* cudaErrorNotReady is recorded as the thread's last error (the runtime
   * records every error a call returns): clear it, as PyTorch's
   * CUDAEvent::query does, so that no later cudaGetLastError sees it */
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return 0;
  }
  return report(e, "cudaEventQuery", err, errlen);
}

extern "C" void zpp_ew_event_destroy(void *ev) {
  if (ev != nullptr) cudaEventDestroy((cudaEvent_t)ev);
}
