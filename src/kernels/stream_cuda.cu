// Stream ordering glue (stream.h): the runtime API, plus two driver
// functions reached through cudaGetDriverEntryPointByVersion, so that
// libzpp links the runtime alone.
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdio.h>

#include "launch.cuh"
#include "stream.h"

namespace {

using zpp_kl::report;

// The driver functions zpp uses, with plain C types: CUresult is an enum
// (0: CUDA_SUCCESS), CUstream is cudaStream_t, CUdeviceptr an unsigned
// 64-bit address, CUdevice an int.
typedef int (*wait_value32_fn)(cudaStream_t stream, unsigned long long addr,
                               unsigned int value, unsigned int flags);
typedef int (*primary_state_fn)(int dev, unsigned int *flags, int *active);
typedef int (*device_get_fn)(int *dev, int ordinal);

constexpr unsigned kWaitValueGeq = 0x0;  // CU_STREAM_WAIT_VALUE_GEQ
constexpr int kNotSupported = 801;       // CUDA_ERROR_NOT_SUPPORTED

struct Driver {
  wait_value32_fn wait_value32;
  primary_state_fn primary_state;
  device_get_fn device_get;
};

Driver g_driver;
pthread_once_t g_driver_once = PTHREAD_ONCE_INIT;

void *entry(const char *symbol, unsigned version) {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &q);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // a missing symbol is no error of a later call
    return nullptr;
  }
  return q == cudaDriverEntryPointSuccess ? fn : nullptr;
}

void load_driver() {
  // cuStreamWaitValue32 with the CUDA 11.7 semantics (_v2), the others
  // as they have been since CUDA 7
  g_driver.wait_value32 = (wait_value32_fn)entry("cuStreamWaitValue32", 12000);
  g_driver.primary_state =
      (primary_state_fn)entry("cuDevicePrimaryCtxGetState", 12000);
  g_driver.device_get = (device_get_fn)entry("cuDeviceGet", 12000);
}

const Driver &driver() {
  pthread_once(&g_driver_once, load_driver);
  return g_driver;
}

}  // namespace

extern "C" int zpp_st_wait_event(void *stream, void *ev, char *err,
                                 size_t errlen) {
  return report(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0),
                "cudaStreamWaitEvent", err, errlen);
}

extern "C" int zpp_st_capturing(void *stream, int *capturing, char *err,
                                size_t errlen) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &s);
  *capturing = 0;
  if (e == cudaErrorStreamCaptureImplicit) {
    // the legacy stream while another stream captures in global mode
    (void)cudaGetLastError();
    *capturing = 1;
    return 0;
  }
  if (e != cudaSuccess) return report(e, "cudaStreamIsCapturing", err, errlen);
  *capturing = s != cudaStreamCaptureStatusNone;
  return 0;
}

extern "C" int zpp_st_stream_create(void **stream, char *err, size_t errlen) {
  cudaStream_t s = nullptr;
  *stream = nullptr;
  int rc = report(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                  "cudaStreamCreateWithFlags", err, errlen);
  if (rc == 0) *stream = (void *)s;
  return rc;
}

extern "C" void zpp_st_stream_destroy(void *stream) {
  if (stream != nullptr) cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int zpp_st_counter_alloc(uint32_t **counter, char *err,
                                    size_t errlen) {
  void *p = nullptr;
  *counter = nullptr;
  int rc = report(cudaHostAlloc(&p, sizeof(uint32_t),
                                cudaHostAllocMapped | cudaHostAllocPortable),
                  "cudaHostAlloc", err, errlen);
  if (rc != 0) return rc;
  __atomic_store_n((uint32_t *)p, 0u, __ATOMIC_RELEASE);
  *counter = (uint32_t *)p;
  return 0;
}

extern "C" void zpp_st_counter_free(uint32_t *counter) {
  if (counter != nullptr) cudaFreeHost(counter);
}

extern "C" int zpp_st_wait_counter(void *stream, uint32_t *counter,
                                   uint32_t value, char *err, size_t errlen) {
  const Driver &d = driver();
  void *dev = nullptr;
  if (d.wait_value32 == nullptr) {
    snprintf(err, errlen,
             "the CUDA driver offers no cuStreamWaitValue32 "
             "(cudaGetDriverEntryPointByVersion)");
    return 2;
  }
  // mapped pinned memory: the device address of the counter
  if (report(cudaHostGetDevicePointer(&dev, counter, 0),
             "cudaHostGetDevicePointer", err, errlen) != 0)
    return 1;
  int r = d.wait_value32((cudaStream_t)stream, (unsigned long long)(uintptr_t)dev,
                         value, kWaitValueGeq);
  if (r == kNotSupported) {
    snprintf(err, errlen, "cuStreamWaitValue32: not supported on this device");
    return 2;
  }
  if (r != 0) {
    snprintf(err, errlen, "cuStreamWaitValue32 failed (CUresult %d)", r);
    return 1;
  }
  return 0;
}

extern "C" int zpp_st_relaxed_capture_mode(char *err, size_t errlen) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  return report(cudaThreadExchangeStreamCaptureMode(&mode),
                "cudaThreadExchangeStreamCaptureMode", err, errlen);
}

extern "C" int zpp_st_context_active(int dev, int *active, char *err,
                                     size_t errlen) {
  const Driver &d = driver();
  unsigned flags = 0;
  int cu = dev, a = 1;
  (void)err;
  (void)errlen;
  *active = 1;
  if (d.primary_state == nullptr) return 0;
  if (d.device_get != nullptr && d.device_get(&cu, dev) != 0) return 0;
  if (d.primary_state(cu, &flags, &a) != 0) return 0;
  *active = a != 0;
  return 0;
}
