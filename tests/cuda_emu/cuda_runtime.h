/*
 * cuda_runtime.h of the CUDA emulator (libzpp_cudart_emu, tests only).
 *
 * Two parts:
 *  - the runtime API, usable from C and C++: the types, constants and
 *    functions of the real CUDA runtime that zpp, its tests and the NCCL
 *    stand-in call, with the real names, values and C linkage, implemented
 *    by tests/cuda_emu/cuda_emu.cc (what it models and what it does not is
 *    written at the top of that file);
 *  - the device language, C++ only (`#ifdef __cplusplus`): __global__ and
 *    friends, the built-in variables, __syncthreads, warp shuffles, the
 *    rounding intrinsics the kernels use, the loads and stores with a cache
 *    operator (__ldg, __stcs, ...), and cudaLaunchKernelEx, which
 *    packs a launch into a closure and queues it on the stream through
 *    zpp_emu_launch().  `<<<>>>` cannot be written in C++: kernels are
 *    launched with cudaLaunchKernelEx, which real CUDA has too.
 *
 * The emulator's test hooks are in zpp_cuda_emu.h.
 */
#ifndef ZPP_TESTS_CUDA_EMU_CUDA_RUNTIME_H
#define ZPP_TESTS_CUDA_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

/* The runtime version the API below follows (nccl.h tests it). */
#define CUDART_VERSION 13000
/* Set only by the emulator: code may say why it differs under emulation. */
#define ZPP_CUDA_EMU 1

#ifdef __cplusplus
#define ZPP_EMU_DEFAULT(v) = v
extern "C" {
#else
#define ZPP_EMU_DEFAULT(v)
#endif

/* ---- types and constants (values as in the real driver_types.h) -------- */

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorPeerAccessAlreadyEnabled = 704,
  cudaErrorPeerAccessNotEnabled = 705,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotPermitted = 800,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
  cudaErrorTimeout = 909,
  cudaErrorUnknown = 999
} cudaError_t;

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};

/* cudaGetDriverEntryPointByVersion: flags and the optional status. */
enum cudaGetDriverEntryPointFlags {
  cudaEnableDefault = 0x0,
  cudaEnableLegacyStream = 0x1,
  cudaEnablePerThreadDefaultStream = 0x2
};
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2
};

/* memory pools */
enum cudaMemPoolAttr {
  cudaMemPoolReuseFollowEventDependencies = 0x1,
  cudaMemPoolReuseAllowOpportunistic = 0x2,
  cudaMemPoolReuseAllowInternalDependencies = 0x3,
  cudaMemPoolAttrReleaseThreshold = 0x4,
  cudaMemPoolAttrReservedMemCurrent = 0x5,
  cudaMemPoolAttrReservedMemHigh = 0x6,
  cudaMemPoolAttrUsedMemCurrent = 0x7,
  cudaMemPoolAttrUsedMemHigh = 0x8
};
enum cudaMemLocationType {
  cudaMemLocationTypeInvalid = 0,
  cudaMemLocationTypeNone = 0,
  cudaMemLocationTypeDevice = 1,
  cudaMemLocationTypeHost = 2,
  cudaMemLocationTypeHostNuma = 3,
  cudaMemLocationTypeHostNumaCurrent = 4
};
struct cudaMemLocation {
  enum cudaMemLocationType type;
  int id;
};
enum cudaMemAllocationType {
  cudaMemAllocationTypeInvalid = 0x0,
  cudaMemAllocationTypePinned = 0x1,
  cudaMemAllocationTypeManaged = 0x2,
  cudaMemAllocationTypeMax = 0x7FFFFFFF
};
enum cudaMemAllocationHandleType {
  cudaMemHandleTypeNone = 0x0,
  cudaMemHandleTypePosixFileDescriptor = 0x1,
  cudaMemHandleTypeWin32 = 0x2,
  cudaMemHandleTypeWin32Kmt = 0x4,
  cudaMemHandleTypeFabric = 0x8
};
struct cudaMemPoolProps {
  enum cudaMemAllocationType allocType;
  enum cudaMemAllocationHandleType handleTypes;
  struct cudaMemLocation location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
  long reserved[8];
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04
#define cudaEventRecordDefault 0x00
#define cudaEventRecordExternal 0x01
#define cudaEventWaitDefault 0x00
#define cudaEventWaitExternal 0x01
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost 0x02
#define cudaCpuDeviceId ((int)-1)
#define cudaInvalidDeviceId ((int)-2)

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
typedef struct cudaGraphEdgeData_st {
  unsigned char from_port;
  unsigned char to_port;
  unsigned char type;
  unsigned char reserved[5];
} cudaGraphEdgeData;
typedef void (*cudaHostFn_t)(void *userData);

/* The per-device legacy default stream, also reached as stream 0. */
#define cudaStreamLegacy ((cudaStream_t)0x1)
/* The calling host thread's default stream of the current device: a
 * blocking stream, made at first use. */
#define cudaStreamPerThread ((cudaStream_t)0x2)

typedef struct dim3 {
  unsigned int x, y, z;
#ifdef __cplusplus
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
#endif
} dim3;

/* The vector types of the load and store intrinsics (__ldg, __stcs, ...),
 * with the alignment of vector_types.h: a vector is one access of its size,
 * which must be naturally aligned. */
#define ZPP_EMU_VEC2(name, t, a)                                               \
  typedef struct __attribute__((aligned(a))) name {                            \
    t x, y;                                                                    \
  } name
#define ZPP_EMU_VEC4(name, t, a)                                               \
  typedef struct __attribute__((aligned(a))) name {                            \
    t x, y, z, w;                                                              \
  } name
ZPP_EMU_VEC2(char2, signed char, 2);
ZPP_EMU_VEC2(uchar2, unsigned char, 2);
ZPP_EMU_VEC4(char4, signed char, 4);
ZPP_EMU_VEC4(uchar4, unsigned char, 4);
ZPP_EMU_VEC2(short2, short, 4);
ZPP_EMU_VEC2(ushort2, unsigned short, 4);
ZPP_EMU_VEC4(short4, short, 8);
ZPP_EMU_VEC4(ushort4, unsigned short, 8);
ZPP_EMU_VEC2(int2, int, 8);
ZPP_EMU_VEC2(uint2, unsigned int, 8);
ZPP_EMU_VEC4(int4, int, 16);
ZPP_EMU_VEC4(uint4, unsigned int, 16);
ZPP_EMU_VEC2(longlong2, long long, 16);
ZPP_EMU_VEC2(ulonglong2, unsigned long long, 16);
ZPP_EMU_VEC2(float2, float, 8);
ZPP_EMU_VEC4(float4, float, 16);
ZPP_EMU_VEC2(double2, double, 16);
#undef ZPP_EMU_VEC2
#undef ZPP_EMU_VEC4

/* Launch attributes are not modelled: numAttrs must be 0. */
typedef struct cudaLaunchAttribute_st cudaLaunchAttribute;
typedef struct cudaLaunchConfig_st {
  dim3 gridDim;
  dim3 blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute *attrs;
  unsigned int numAttrs;
} cudaLaunchConfig_t;

/* ---- the runtime API --------------------------------------------------- */

/* errors */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

/* devices */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId);
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device,
                                    int peerDevice);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);

/* memory */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device);
cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device);
cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool);
cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMallocManaged(void **devPtr, size_t size,
                              unsigned int flags ZPP_EMU_DEFAULT(cudaMemAttachGlobal));
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                     const void *ptr);
cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                       enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                            enum cudaMemcpyKind kind,
                            cudaStream_t stream ZPP_EMU_DEFAULT(0));
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
                            cudaStream_t stream ZPP_EMU_DEFAULT(0));

/* streams */
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags ZPP_EMU_DEFAULT(0));
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn,
                               void *userData);

/* events */
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event,
                            cudaStream_t stream ZPP_EMU_DEFAULT(0));
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* graphs: stream capture, instantiate, launch */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                   enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus);
/* No graph nodes are modelled: *dependencies_out is NULL and
 * *numDependencies_out 0. */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                     enum cudaStreamCaptureStatus *captureStatus_out,
                                     unsigned long long *id_out ZPP_EMU_DEFAULT(0),
                                     cudaGraph_t *graph_out ZPP_EMU_DEFAULT(0),
                                     const cudaGraphNode_t **dependencies_out ZPP_EMU_DEFAULT(0),
                                     const cudaGraphEdgeData **edgeData_out ZPP_EMU_DEFAULT(0),
                                     size_t *numDependencies_out ZPP_EMU_DEFAULT(0));
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags ZPP_EMU_DEFAULT(0));
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

/* driver entry points: the emulated driver functions that
 * cudaGetDriverEntryPointByVersion returns are listed in cuda_emu.cc */
cudaError_t cudaGetDriverEntryPointByVersion(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus ZPP_EMU_DEFAULT(NULL));

/* ---- the emulator's side of a kernel launch (not CUDA API) --------------- */

/* Queues a grid: run(closure) is the body of every CUDA thread,
 * destroy(closure) frees it once the launch (or the graph holding it) is
 * gone.  ptrs: the pointer arguments, checked when the kernel executes. */
cudaError_t zpp_emu_launch(const cudaLaunchConfig_t *cfg, const void *kernel,
                           void (*run)(void *), void (*destroy)(void *),
                           void *closure, const void *const *ptrs, size_t nptrs);

/* The built-in variables of the CUDA thread the emulator runs now. */
struct zpp_emu_builtins {
  dim3 threadIdx, blockIdx, blockDim, gridDim;
};
extern struct zpp_emu_builtins zpp_emu_builtin;
void zpp_emu_syncthreads(void);
uint64_t zpp_emu_shfl_xor(uint64_t bits, unsigned int mask, int lane_mask,
                          int width);

#ifdef __cplusplus
} /* extern "C" */
#endif
#undef ZPP_EMU_DEFAULT

#ifdef __cplusplus
/* ---- C++: typed allocation overloads, as the real header has ------------ */

template <class T>
inline cudaError_t cudaMalloc(T **p, size_t n) {
  return cudaMalloc(reinterpret_cast<void **>(p), n);
}
template <class T>
inline cudaError_t cudaMallocHost(T **p, size_t n) {
  return cudaMallocHost(reinterpret_cast<void **>(p), n);
}
template <class T>
inline cudaError_t cudaHostAlloc(T **p, size_t n, unsigned int flags) {
  return cudaHostAlloc(reinterpret_cast<void **>(p), n, flags);
}
template <class T>
inline cudaError_t cudaMallocManaged(T **p, size_t n,
                                     unsigned int flags = cudaMemAttachGlobal) {
  return cudaMallocManaged(reinterpret_cast<void **>(p), n, flags);
}
template <class T>
inline cudaError_t cudaMallocAsync(T **p, size_t n, cudaStream_t s) {
  return cudaMallocAsync(reinterpret_cast<void **>(p), n, s);
}
template <class T>
inline cudaError_t cudaMallocAsync(T **p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  return cudaMallocFromPoolAsync(reinterpret_cast<void **>(p), n, pool, s);
}
template <class T>
inline cudaError_t cudaMallocFromPoolAsync(T **p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  return cudaMallocFromPoolAsync(reinterpret_cast<void **>(p), n, pool, s);
}

/* ---- C++: the device language ------------------------------------------- */

#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* CTAs run one after another and one device operation at a time, so a
 * function-scope static is exactly __shared__ memory. */
#define __shared__ static
#define __launch_bounds__(...)

inline const dim3 &threadIdx = zpp_emu_builtin.threadIdx;
inline const dim3 &blockIdx = zpp_emu_builtin.blockIdx;
inline const dim3 &blockDim = zpp_emu_builtin.blockDim;
inline const dim3 &gridDim = zpp_emu_builtin.gridDim;

/* A barrier of the whole CTA: every thread must reach it. */
inline void __syncthreads() { zpp_emu_syncthreads(); }

/* Two barriers of the lanes of the warp; mask must be full. */
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "shuffle of a value wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = zpp_emu_shfl_xor(bits, mask, lane_mask, width);
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

/* Device atomics.  Fibers switch only at barriers and one CTA runs at a
 * time, so a read-modify-write is atomic. */
inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned atomicMin(unsigned *p, unsigned v) {
  unsigned old = *p;
  if (v < old) *p = v;
  return old;
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
  unsigned old = *p;
  *p = old + v;
  return old;
}

/* Round-to-nearest float intrinsics: IEEE operations of the host (the
 * build has no FMA contraction). */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- C++: global memory loads and stores with a cache operator ----------
 *
 * __ldg (sm_32_intrinsics.h), the loads __ldcg and __ldcs and the stores
 * __stwb, __stcg, __stcs and __stwt, for the scalar and vector types those
 * intrinsics take.  Each is one access of sizeof(T) bytes, which the CUDA
 * Programming Guide ("Device Memory Accesses") requires to be naturally
 * aligned; a misaligned one is a sticky cudaErrorMisalignedAddress of the
 * device, and the launch ends there (zpp_emu_last_fault says "misaligned
 * address").  Plain C++ accesses cannot be checked: kernels whose
 * alignment matters use these.  The cache operators themselves are not
 * modelled.  The access itself is a memcpy: no strict-aliasing
 * assumption about the buffer's element type. */
extern "C" void zpp_emu_misaligned(const void *p, size_t bytes, const char *op);

namespace zpp_emu_detail {

/* T in a parameter that does not take part in deduction, so that the
 * value converts to the pointer's type as with the real overloads. */
template <typename T> struct same { using type = T; };
template <typename T> using same_t = typename same<T>::type;

template <typename T, typename... U>
constexpr bool one_of = (std::is_same<T, U>::value || ...);

/* The types of the overloads of __ldg in sm_32_intrinsics.h (the other
 * loads and stores take the same ones). */
template <typename T>
constexpr bool ldst_type =
    one_of<T, char, signed char, short, int, long, long long, unsigned char,
           unsigned short, unsigned int, unsigned long, unsigned long long,
           float, double, char2, char4, short2, short4, int2, int4, longlong2,
           uchar2, uchar4, ushort2, ushort4, uint2, uint4, ulonglong2, float2,
           float4, double2>;

template <typename T> inline T load(const T *p, const char *op) {
  static_assert(ldst_type<T>, "no such overload in sm_32_intrinsics.h");
  if ((uintptr_t)p % alignof(T) != 0)
    zpp_emu_misaligned(p, sizeof(T), op);
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T> inline void store(T *p, const T &v, const char *op) {
  static_assert(ldst_type<T>, "no such overload in sm_32_intrinsics.h");
  if ((uintptr_t)p % alignof(T) != 0)
    zpp_emu_misaligned(p, sizeof(T), op);
  std::memcpy(p, &v, sizeof v);
}

} // namespace zpp_emu_detail

template <typename T> inline T __ldg(const T *p) {
  return zpp_emu_detail::load(p, "__ldg");
}
template <typename T> inline T __ldcg(const T *p) {
  return zpp_emu_detail::load(p, "__ldcg");
}
template <typename T> inline T __ldcs(const T *p) {
  return zpp_emu_detail::load(p, "__ldcs");
}
template <typename T> inline void __stwb(T *p, zpp_emu_detail::same_t<T> v) {
  zpp_emu_detail::store(p, v, "__stwb");
}
template <typename T> inline void __stcg(T *p, zpp_emu_detail::same_t<T> v) {
  zpp_emu_detail::store(p, v, "__stcg");
}
template <typename T> inline void __stcs(T *p, zpp_emu_detail::same_t<T> v) {
  zpp_emu_detail::store(p, v, "__stcs");
}
template <typename T> inline void __stwt(T *p, zpp_emu_detail::same_t<T> v) {
  zpp_emu_detail::store(p, v, "__stwt");
}

namespace zpp_emu_detail {

template <typename T>
inline void pointer_of(const T &v, const void **out, size_t *n) {
  if constexpr (std::is_pointer<T>::value)
    out[(*n)++] = reinterpret_cast<const void *>(v);
  (void)v;
  (void)out;
  (void)n;
}

template <typename K, typename Tuple>
struct Closure {
  K kernel;
  Tuple args;
  static void run(void *p) {
    Closure *c = static_cast<Closure *>(p);
    std::apply(c->kernel, c->args);
  }
  static void destroy(void *p) { delete static_cast<Closure *>(p); }
};

}  // namespace zpp_emu_detail

/* As the real template: the arguments are converted to the kernel's
 * parameter types and copied (a launch owns its arguments). */
template <typename... Exp, typename... Act>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config,
                                      void (*kernel)(Exp...), Act &&...args) {
  static_assert(sizeof...(Exp) == sizeof...(Act),
                "cudaLaunchKernelEx: wrong number of kernel arguments");
  using Tuple = std::tuple<std::decay_t<Exp>...>;
  using C = zpp_emu_detail::Closure<void (*)(Exp...), Tuple>;
  C *c = new C{kernel, Tuple(static_cast<Exp>(std::forward<Act>(args))...)};
  const void *ptrs[sizeof...(Exp) + 1] = {nullptr};
  size_t n = 0;
  std::apply([&](const auto &...a) { (zpp_emu_detail::pointer_of(a, ptrs, &n), ...); },
             c->args);
  return zpp_emu_launch(config, reinterpret_cast<const void *>(kernel), &C::run,
                        &C::destroy, c, ptrs, n);
}

#endif /* __cplusplus */

#endif /* ZPP_TESTS_CUDA_EMU_CUDA_RUNTIME_H */
