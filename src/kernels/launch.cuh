// Launch and memory-access helpers of the element-wise and transform
// kernels (elementwise_cuda.cu, transform_cuda.cu): CUDA C++, for .cu files
// only.  Kernels are launched with cudaLaunchKernelEx rather than <<<>>> so
// that the files also compile as C++ against the CPU emulator
// (tests/cuda_emu).
#ifndef ZPP_SRC_KERNELS_LAUNCH_CUH
#define ZPP_SRC_KERNELS_LAUNCH_CUH

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "quant_math.h"

namespace zpp_kl {

constexpr int kThreads = 256;

// CTAs of kThreads for count elements, capped: the kernels grid-stride.
inline int grid_for(size_t count) {
  size_t blocks = (count + kThreads - 1) / kThreads;
  return (int)(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// 0 for cudaSuccess; else 1 with "what: <CUDA's message>" in err.
inline int report(cudaError_t e, const char *what, char *err, size_t errlen) {
  if (e == cudaSuccess) return 0;
  snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return 1;
}

// kernel<<<ctas, threads, 0, stream>>>(args...).  Returns the launch's own
// error, never the thread's last error: that may hold an earlier call's (a
// cudaEventQuery's cudaErrorNotReady), which is no failure of this launch.
template <typename... Exp, typename... Act>
cudaError_t launch(void (*kernel)(Exp...), unsigned ctas, unsigned threads,
                   cudaStream_t stream, Act &&...args) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(ctas, 1, 1);
  lc.blockDim = dim3(threads, 1, 1);
  lc.dynamicSmemBytes = 0;
  lc.stream = stream;
  cudaError_t e = cudaLaunchKernelEx(&lc, kernel, static_cast<Act &&>(args)...);
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* reported by the caller; leave none behind */
  return e;
}

/* ---- element-wise kernels: chunks of 16-byte accesses --------------------
 *
 * An element-wise kernel over `count` elements splits them into a head of
 * fewer than kChunk elements, chunks of kChunk and a tail of fewer than
 * kChunk (for_chunks): one CUDA thread per chunk, grid-stride, and one per
 * head or tail element.  A chunk of a buffer is 32 bytes (fp32) or 16
 * (fp16, bf16), so every chunk of a buffer starts at the same offset modulo
 * 16, and the head (pick_head) makes as many bytes as it can start at a
 * 16-byte boundary.  Each buffer then moves its chunks through the widest
 * access its own alignment allows (width_at): 16-byte vectors, else 8, 4,
 * 2 or 1 bytes assembled into the elements, so any byte alignment works,
 * a 16-bit buffer at an odd address included.  Every access goes through
 * __ldg / __ldcg / __stwb, which the emulator checks for natural alignment
 * as the GPU requires (tests/cuda_emu/README.md).
 *
 * Loads: kRead for a buffer the kernel does not write (__ldg, the
 * read-only path); kUpdate for one it may also write, in place (__ldcg).
 * Stores use the default write-back policy (__stwb): the next kernel of a
 * collective usually reads the output back while it is still in L2. */
constexpr int kChunk = 8; /* elements per chunk */

enum LoadKind { kRead, kUpdate };

// CTAs of kThreads for an element-wise kernel over count elements: one
// thread per chunk, and at least one per head or tail element.
inline int grid_for_chunks(size_t count) {
  size_t threads = count / kChunk + 2 * kChunk;
  return grid_for(threads);
}

// launch over count elements: grid_for_chunks(count) CTAs of kThreads.
template <typename... Exp, typename... Act>
cudaError_t launch_over(void (*kernel)(Exp...), size_t count, void *stream,
                        Act &&...args) {
  return launch(kernel, (unsigned)grid_for_chunks(count), (unsigned)kThreads,
                (cudaStream_t)stream, static_cast<Act &&>(args)...);
}

// Bytes of one element of dtype DT.
template <int DT> constexpr int esize = DT == ZPP_QM_F32 ? 4 : 2;

template <LoadKind K, typename T> __device__ __forceinline__ T ld(const T *p) {
  if constexpr (K == kRead)
    return __ldg(p);
  else
    return __ldcg(p);
}

// Widest access (1, 2, 4, 8 or 16 bytes) that address a allows.
__device__ __forceinline__ int width_of(uintptr_t a) {
  return (a & 15u) == 0 ? 16 : (int)(a & (~a + 1u));
}

// Width of the chunk accesses of a buffer of `es`-byte elements whose
// chunks start at element `head` (the same for every chunk).
__device__ __forceinline__ int width_at(const void *p, unsigned head, int es) {
  return width_of((uintptr_t)p + (uintptr_t)head * (uintptr_t)es);
}

// A buffer as pick_head sees it: its address and element size in bytes.
struct At {
  const void *p;
  int es;
};

// Bytes of one element of buffer b that start 16-byte aligned when the
// chunks start at element h: b.es if they do, else 0.
__device__ __forceinline__ int aligned_bytes(At b, unsigned h) {
  return (((uintptr_t)b.p + h * (uintptr_t)b.es) & 15u) == 0 ? b.es : 0;
}

// The head in [0, kChunk) that puts the most bytes of the buffers in
// chunks starting at a 16-byte boundary; the smallest such head.  A pure
// function of the pointers: every thread computes the same.
template <typename... B>
__device__ __forceinline__ unsigned pick_head(B... bufs) {
  unsigned best = 0;
  int best_bytes = -1;
#pragma unroll
  for (unsigned h = 0; h < (unsigned)kChunk; h++) {
    int bytes = (aligned_bytes(bufs, h) + ...);
    if (bytes > best_bytes) {
      best_bytes = bytes;
      best = h;
    }
  }
  return best;
}

// NW little-endian 32-bit words from p, in accesses of `width` bytes (p a
// multiple of width; 4 * NW a multiple of 16).
template <LoadKind K, int NW>
__device__ __forceinline__ void ld_words(const unsigned char *p, int width,
                                         uint32_t (&w)[NW]) {
  if (width == 16) {
#pragma unroll
    for (int q = 0; q < NW / 4; q++) {
      uint4 v = ld<K>(reinterpret_cast<const uint4 *>(p) + q);
      w[4 * q] = v.x;
      w[4 * q + 1] = v.y;
      w[4 * q + 2] = v.z;
      w[4 * q + 3] = v.w;
    }
  } else if (width == 8) {
#pragma unroll
    for (int q = 0; q < NW / 2; q++) {
      uint2 v = ld<K>(reinterpret_cast<const uint2 *>(p) + q);
      w[2 * q] = v.x;
      w[2 * q + 1] = v.y;
    }
  } else if (width == 4) {
#pragma unroll
    for (int q = 0; q < NW; q++)
      w[q] = ld<K>(reinterpret_cast<const unsigned int *>(p) + q);
  } else if (width == 2) {
#pragma unroll
    for (int q = 0; q < NW; q++) {
      const unsigned short *s = reinterpret_cast<const unsigned short *>(p);
      w[q] = (uint32_t)ld<K>(s + 2 * q) | (uint32_t)ld<K>(s + 2 * q + 1) << 16;
    }
  } else {
#pragma unroll
    for (int q = 0; q < NW; q++)
      w[q] = (uint32_t)ld<K>(p + 4 * q) | (uint32_t)ld<K>(p + 4 * q + 1) << 8 |
             (uint32_t)ld<K>(p + 4 * q + 2) << 16 |
             (uint32_t)ld<K>(p + 4 * q + 3) << 24;
  }
}

// The words of ld_words back to p, in accesses of `width` bytes.
template <int NW>
__device__ __forceinline__ void st_words(unsigned char *p, int width,
                                         const uint32_t (&w)[NW]) {
  if (width == 16) {
#pragma unroll
    for (int q = 0; q < NW / 4; q++) {
      uint4 v;
      v.x = w[4 * q];
      v.y = w[4 * q + 1];
      v.z = w[4 * q + 2];
      v.w = w[4 * q + 3];
      __stwb(reinterpret_cast<uint4 *>(p) + q, v);
    }
  } else if (width == 8) {
#pragma unroll
    for (int q = 0; q < NW / 2; q++) {
      uint2 v;
      v.x = w[2 * q];
      v.y = w[2 * q + 1];
      __stwb(reinterpret_cast<uint2 *>(p) + q, v);
    }
  } else if (width == 4) {
#pragma unroll
    for (int q = 0; q < NW; q++)
      __stwb(reinterpret_cast<unsigned int *>(p) + q, (unsigned int)w[q]);
  } else if (width == 2) {
#pragma unroll
    for (int q = 0; q < NW; q++) {
      unsigned short *s = reinterpret_cast<unsigned short *>(p);
      __stwb(s + 2 * q, (unsigned short)w[q]);
      __stwb(s + 2 * q + 1, (unsigned short)(w[q] >> 16));
    }
  } else {
#pragma unroll
    for (int q = 0; q < NW; q++)
#pragma unroll
      for (int b = 0; b < 4; b++)
        __stwb(p + 4 * q + b, (unsigned char)(w[q] >> (8 * b)));
  }
}

// fp32 value of the bits of one element (h: the low 16 bits for fp16 and
// bf16).
template <int DT> __device__ __forceinline__ float from_bits(uint32_t h) {
  if constexpr (DT == ZPP_QM_F32)
    return zpp_qm_bits_f32(h);
  else if constexpr (DT == ZPP_QM_BF16)
    return zpp_qm_bf16_to_f32((uint16_t)h);
  else
    return zpp_qm_f16_to_f32((uint16_t)h);
}

// Bits of v rounded to DT (docs/format.md: round to nearest even).
template <int DT> __device__ __forceinline__ uint32_t to_bits(float v) {
  if constexpr (DT == ZPP_QM_F32)
    return zpp_qm_f32_bits(v);
  else if constexpr (DT == ZPP_QM_BF16)
    return zpp_qm_f32_to_bf16(v);
  else
    return zpp_qm_f32_to_f16(v);
}

// The kChunk elements of a DT buffer from element e, as fp32; `width` is
// width_at(p, head, esize<DT>).
template <int DT, LoadKind K>
__device__ __forceinline__ void load_chunk(const void *p, size_t e, int width,
                                           float (&x)[kChunk]) {
  constexpr int NW = kChunk * esize<DT> / 4;
  uint32_t w[NW];
  ld_words<K>((const unsigned char *)p + e * esize<DT>, width, w);
#pragma unroll
  for (int j = 0; j < kChunk; j++) {
    if constexpr (esize<DT> == 4)
      x[j] = from_bits<DT>(w[j]);
    else
      x[j] = from_bits<DT>((w[j / 2] >> (16 * (j & 1))) & 0xffffu);
  }
}

// x rounded to DT into the kChunk elements of p from element e.
template <int DT>
__device__ __forceinline__ void store_chunk(void *p, size_t e, int width,
                                            const float (&x)[kChunk]) {
  constexpr int NW = kChunk * esize<DT> / 4;
  uint32_t w[NW];
#pragma unroll
  for (int q = 0; q < NW; q++) {
    if constexpr (esize<DT> == 4)
      w[q] = to_bits<DT>(x[q]);
    else
      w[q] = to_bits<DT>(x[2 * q]) | to_bits<DT>(x[2 * q + 1]) << 16;
  }
  st_words((unsigned char *)p + e * esize<DT>, width, w);
}

// Element i of a DT buffer at any alignment (head and tail elements).
template <int DT, LoadKind K>
__device__ __forceinline__ float load_one(const void *p, size_t i) {
  const unsigned char *b = (const unsigned char *)p + i * esize<DT>;
  int width = width_of((uintptr_t)b);
  uint32_t v;
  if (width >= esize<DT>) {
    if constexpr (esize<DT> == 4)
      v = ld<K>(reinterpret_cast<const unsigned int *>(b));
    else
      v = ld<K>(reinterpret_cast<const unsigned short *>(b));
  } else if (width == 2) { /* fp32 at a 2-byte boundary */
    const unsigned short *s = reinterpret_cast<const unsigned short *>(b);
    v = (uint32_t)ld<K>(s) | (uint32_t)ld<K>(s + 1) << 16;
  } else {
    v = 0;
#pragma unroll
    for (int k = 0; k < esize<DT>; k++)
      v |= (uint32_t)ld<K>(b + k) << (8 * k);
  }
  return from_bits<DT>(v);
}

// x rounded to DT into element i of p, at any alignment.
template <int DT>
__device__ __forceinline__ void store_one(void *p, size_t i, float x) {
  unsigned char *b = (unsigned char *)p + i * esize<DT>;
  int width = width_of((uintptr_t)b);
  uint32_t v = to_bits<DT>(x);
  if (width >= esize<DT>) {
    if constexpr (esize<DT> == 4)
      __stwb(reinterpret_cast<unsigned int *>(b), (unsigned int)v);
    else
      __stwb(reinterpret_cast<unsigned short *>(b), (unsigned short)v);
  } else if (width == 2) {
    unsigned short *s = reinterpret_cast<unsigned short *>(b);
    __stwb(s, (unsigned short)v);
    __stwb(s + 1, (unsigned short)(v >> 16));
  } else {
#pragma unroll
    for (int k = 0; k < esize<DT>; k++)
      __stwb(b + k, (unsigned char)(v >> (8 * k)));
  }
}

// Whether every element of a buffer of run-time `dtype` is naturally
// aligned (the buffer starts at a multiple of the element size).
__device__ __forceinline__ bool elems_aligned(const void *p, int dtype) {
  return (uintptr_t)p % zpp_qm_dtype_bytes(dtype) == 0;
}

// Element i of a buffer of run-time dtype at any alignment: one plain
// access (zpp_qm_load) when `aligned` (elems_aligned, decided once per
// buffer), else load_one's narrower accesses; the same value either way.
template <LoadKind K>
__device__ __forceinline__ float load_any(const void *p, size_t i, int dtype,
                                          bool aligned) {
  if (aligned)
    return zpp_qm_load(p, i, dtype);
  if (dtype == ZPP_QM_F32)
    return load_one<ZPP_QM_F32, K>(p, i);
  if (dtype == ZPP_QM_BF16)
    return load_one<ZPP_QM_BF16, K>(p, i);
  return load_one<ZPP_QM_F16, K>(p, i);
}

// x into fp32 element i of p at any alignment (`aligned`: elems_aligned).
__device__ __forceinline__ void store_f32_any(float *p, size_t i, float x,
                                              bool aligned) {
  if (aligned)
    zpp_qm_store(p, i, ZPP_QM_F32, x);
  else
    store_one<ZPP_QM_F32>(p, i, x);
}

// Runs chunk(e) for the chunk at every element e = head + kChunk * c
// (grid-stride over c), and one(i) for every element i of the head and of
// the tail; every element of [0, count) is visited once, by one thread.
template <typename Chunk, typename One>
__device__ __forceinline__ void for_chunks(size_t count, unsigned head,
                                           Chunk chunk, One one) {
  const size_t h = head < count ? head : count;
  const size_t chunks = (count - h) / kChunk;
  const size_t body_end = h + chunks * kChunk;
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t c = tid; c < chunks; c += stride)
    chunk(h + c * kChunk);
  if (tid < h)
    one(tid);
  else if (tid - h < count - body_end)
    one(body_end + (tid - h));
}

}  // namespace zpp_kl

#endif  // ZPP_SRC_KERNELS_LAUNCH_CUH
