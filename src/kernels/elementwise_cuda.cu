// Device element-wise helpers of the collectives (elementwise.h): the same
// per-element rules as elementwise.c, through quant_math.h.
#include <cuda_runtime.h>

#include <stdio.h>

#include "elementwise.h"
#include "launch.cuh"
#include "quant_math.h"

namespace {

using zpp_kl::launch_over;
using zpp_kl::report;

__global__ void finish_kernel(const float *acc, size_t count, float div,
                              int dtype, void *out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    zpp_qm_store(out, i, dtype, div == 1.0f ? acc[i] : __fdiv_rn(acc[i], div));
}

__global__ void scale_kernel(int dtype, void *buf, size_t count, float div) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    zpp_qm_store(buf, i, dtype, __fdiv_rn(zpp_qm_load(buf, i, dtype), div));
}

__global__ void add_residual_kernel(int dtype, const void *g, const float *res,
                                    size_t count, float *out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = zpp_qm_add(zpp_qm_load(g, i, dtype), res[i]);
}

__global__ void residual_kernel(const float *x, size_t count, float *res) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x) {
    float e = __fsub_rn(x[i], res[i]);
    res[i] = (zpp_qm_f32_bits(e) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK ? 0.0f : e;
  }
}

__global__ void ema_residual_kernel(const float *x, const float *dec,
                                    size_t count, float beta, float omega,
                                    float *res) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    res[i] = zpp_qm_ema_residual(res[i], x[i], dec[i], beta, omega);
}

__global__ void widen_kernel(int dtype, const void *src, size_t count,
                             float *out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = zpp_qm_load(src, i, dtype);
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
 * destroyed) whose release threshold keeps freed memory reserved.  The
 * device's default pool has threshold 0: it returns its free memory to
 * the OS at every stream, event or device synchronisation, so scratch
 * taken per call would be mapped again at every step.  The application's
 * default and current pools are left alone. */
namespace {

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
  unsigned long long keep = ~0ull; /* bytes: all of it */
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
