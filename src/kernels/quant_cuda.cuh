// Device helpers of the CUDA block codec, shared by its launchers
// (quant_cuda.cu: one encode or decode a call) and the batched ones
// (quant_batch_cuda.cu: tables of runs): the work decomposition, the
// access paths, the block reduction and the launch helpers, all described
// at the top of quant_cuda.cu; isum_cuda.cu (qgZ's integer sums) uses
// them too.  CUDA C++, for those files only (an anonymous namespace: each
// includes its own copy).
#ifndef ZPP_SRC_KERNELS_QUANT_CUDA_CUH
#define ZPP_SRC_KERNELS_QUANT_CUDA_CUH

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "quant_cuda.h"
#include "quant_math.h"

/* CTAs per launch; the kernels loop over the rest.  The CPU emulator test
 * (tests/test_quant_cuda_emu.cc) lowers it to run those loops. */
#ifndef ZPP_QUANT_CUDA_MAX_GRID
#define ZPP_QUANT_CUDA_MAX_GRID ((size_t)1 << 30)
#endif

namespace {

/* ---- geometry ------------------------------------------------------------ */

constexpr int kEpt = 16;            /* elements a thread holds per segment */
constexpr unsigned kCta = 256;      /* CTA size when groups are <= 256 threads */
constexpr unsigned kMaxGroup = 512; /* largest group: one CTA */
/* Blocks longer than one segment: from this many blocks on, one CTA per
 * block (two reads of the block, the second from L2) fills the GPU; below
 * it the block is split over CTAs with atomics. */
constexpr size_t kLoopMinBlocks = 1024;

enum { kFull = 0, kReduce = 1, kQuant = 2 }; /* encode kernel modes */
enum { kAccessVec = 0, kAccessElem = 1, kAccessByte = 2 };
enum { kOutAcc = ZPP_QM_OUT_ACC };

/* A chunk of a block: C elements (16 bytes of fp16/bf16, 16 or 32 of
 * fp32) whose codes fill W whole 32-bit payload words. */
template <int BITS, int ES> struct Chunk {
  static constexpr int C = BITS == 8 && ES == 4 ? 4 : 8;
  static constexpr int W = C * BITS / 32; /* payload words per chunk */
  static constexpr int R = kEpt / C;      /* chunks per thread per segment */
};

__host__ __device__ constexpr int elem_size(int kind) {
  return kind == ZPP_QM_F16 || kind == ZPP_QM_BF16 ? 2 : 4;
}

__host__ __device__ __forceinline__ size_t ceil_div(size_t a, size_t b) {
  return a / b + (a % b != 0);
}
__host__ __device__ __forceinline__ size_t min_sz(size_t a, size_t b) {
  return a < b ? a : b;
}
/* a / b, in 32 bits when both fit (a 64-bit division is a long software
 * routine on the GPU). */
__device__ __forceinline__ size_t div_sz(size_t a, size_t b) {
  return ((a | b) >> 32) == 0 ? (size_t)((uint32_t)a / (uint32_t)b) : a / b;
}
__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}
__device__ __forceinline__ uint32_t min_u32(uint32_t a, uint32_t b) {
  return a < b ? a : b;
}

/* Elements of chunk j of a block of `len` elements (0 past its end). */
template <int C>
__device__ __forceinline__ int chunk_elems(size_t len, size_t j) {
  size_t e0 = j * C;
  return e0 < len ? (int)min_sz(C, len - e0) : 0;
}

/* ---- byte access (pointers not aligned to their element) ---------------- */

__device__ __forceinline__ uint32_t ld_bytes(const uint8_t *p, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint32_t)p[i] << (8 * i);
  return v;
}

/* A block's metadata: the fp32 scale, then (ASYM) the fp32 zero point;
 * `aligned`: meta is 4-byte aligned (else read byte by byte). */
template <bool ASYM>
__device__ __forceinline__ void load_meta(const uint8_t *meta, bool aligned,
                                          float &scale, float &zero) {
  zero = 0.0f;
  if (aligned) {
    scale = reinterpret_cast<const float *>(meta)[0];
    if (ASYM)
      zero = reinterpret_cast<const float *>(meta)[1];
  } else {
    scale = zpp_qm_bits_f32(ld_bytes(meta, 4));
    if (ASYM)
      zero = zpp_qm_bits_f32(ld_bytes(meta + 4, 4));
  }
}
__device__ __forceinline__ void st_bytes(uint8_t *p, uint32_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* The first n bytes of a chunk's payload words (unrolled: the words stay
 * in registers). */
template <int W>
__device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t (&w)[W],
                                         int n) {
#pragma unroll
  for (int k = 0; k < W; k++)
    w[k] = 0;
#pragma unroll
  for (int k = 0; k < 4 * W; k++)
    if (k < n)
      w[k / 4] |= (uint32_t)p[k] << (8 * (k % 4));
}
template <int W>
__device__ __forceinline__ void st_words(uint8_t *p, const uint32_t (&w)[W],
                                         int n) {
#pragma unroll
  for (int k = 0; k < 4 * W; k++)
    if (k < n)
      p[k] = (uint8_t)(w[k / 4] >> (8 * (k % 4)));
}

__device__ __forceinline__ float half_bits_to_f32(int dt, uint32_t h) {
  return dt == ZPP_QM_BF16 ? zpp_qm_bf16_to_f32((uint16_t)h)
                           : zpp_qm_f16_to_f32((uint16_t)h);
}

/* Element i of a buffer of run-time dtype dt: one plain access
 * (zpp_qm_load) when `aligned` (the buffer starts at a multiple of the
 * element size: decided once per buffer), else byte by byte; the same
 * value either way. */
__device__ __forceinline__ float load_elem_dt(const void *p, size_t i, int dt,
                                              bool aligned) {
  if (aligned)
    return zpp_qm_load(p, i, dt);
  const uint8_t *q = (const uint8_t *)p + i * elem_size(dt);
  if (dt == ZPP_QM_F32)
    return zpp_qm_bits_f32(ld_bytes(q, 4));
  return half_bits_to_f32(dt, ld_bytes(q, 2));
}

/* v into fp32 element i of p, as load_elem_dt reads it. */
__device__ __forceinline__ void store_f32_elem(void *p, size_t i, float v,
                                               bool aligned) {
  if (aligned)
    zpp_qm_store(p, i, ZPP_QM_F32, v);
  else
    st_bytes((uint8_t *)p + 4 * i, zpp_qm_f32_bits(v), 4);
}

/* Element i of a DT buffer, through the shared conversions. */
template <int DT>
__device__ __forceinline__ float load_elem(const void *p, size_t i,
                                           bool bytes) {
  if (!bytes)
    return zpp_qm_load(p, i, DT);
  const uint8_t *q = (const uint8_t *)p + i * elem_size(DT);
  if (DT == ZPP_QM_F32)
    return zpp_qm_bits_f32(ld_bytes(q, 4));
  return half_bits_to_f32(DT, ld_bytes(q, 2));
}

/* Output element i: stored as OUT, or added to an fp32 accumulator. */
template <int OUT>
__device__ __forceinline__ void store_elem(void *p, size_t i, float v,
                                           bool bytes) {
  if (!bytes) {
    if (OUT == kOutAcc)
      zpp_qm_store(p, i, ZPP_QM_F32,
                   zpp_qm_add(zpp_qm_load(p, i, ZPP_QM_F32), v));
    else
      zpp_qm_store(p, i, OUT, v);
    return;
  }
  uint8_t *q = (uint8_t *)p + i * elem_size(OUT);
  if (OUT == kOutAcc)
    st_bytes(q, zpp_qm_f32_bits(zpp_qm_add(zpp_qm_bits_f32(ld_bytes(q, 4)), v)),
             4);
  else if (OUT == ZPP_QM_F32)
    st_bytes(q, zpp_qm_f32_bits(v), 4);
  else if (OUT == ZPP_QM_BF16)
    st_bytes(q, zpp_qm_f32_to_bf16(v), 2);
  else
    st_bytes(q, zpp_qm_f32_to_f16(v), 2);
}

/* ---- vector access of a whole chunk (aligned) ------------------------- */

/* C elements of a DT buffer from element e (e * size is 8- or 16-byte
 * aligned: see the access choice in the launchers). */
template <int DT, int C>
__device__ __forceinline__ void load_chunk(const void *src, size_t e,
                                           float (&x)[C]) {
  if constexpr (DT == ZPP_QM_F32) {
    const float4 *p = reinterpret_cast<const float4 *>((const float *)src + e);
#pragma unroll
    for (int q = 0; q < C / 4; q++) {
      float4 f = p[q];
      x[4 * q] = f.x;
      x[4 * q + 1] = f.y;
      x[4 * q + 2] = f.z;
      x[4 * q + 3] = f.w;
    }
  } else if constexpr (C == 4) {
    uint2 w = *reinterpret_cast<const uint2 *>((const uint16_t *)src + e);
    uint32_t u[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 4; i++)
      x[i] = half_bits_to_f32(DT, (u[i / 2] >> (16 * (i & 1))) & 0xffffu);
  } else {
    uint4 w = *reinterpret_cast<const uint4 *>((const uint16_t *)src + e);
    uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = half_bits_to_f32(DT, (u[i / 2] >> (16 * (i & 1))) & 0xffffu);
  }
}

/* The stores go through __stwb (st.global.wb, the default caching): a
 * plain vector store was merged with the element path's scalar stores to
 * the same addresses and split into 4-byte stores. */
template <int OUT, int C>
__device__ __forceinline__ void store_chunk(void *dst, size_t e,
                                            const float (&v)[C]) {
  if constexpr (OUT == ZPP_QM_F32 || OUT == kOutAcc) {
    float4 *p = reinterpret_cast<float4 *>((float *)dst + e);
#pragma unroll
    for (int q = 0; q < C / 4; q++) {
      float4 f;
      if (OUT == kOutAcc) {
        float4 a = p[q];
        f.x = zpp_qm_add(a.x, v[4 * q]);
        f.y = zpp_qm_add(a.y, v[4 * q + 1]);
        f.z = zpp_qm_add(a.z, v[4 * q + 2]);
        f.w = zpp_qm_add(a.w, v[4 * q + 3]);
      } else {
        f.x = v[4 * q];
        f.y = v[4 * q + 1];
        f.z = v[4 * q + 2];
        f.w = v[4 * q + 3];
      }
      __stwb(p + q, f);
    }
  } else {
    uint32_t u[C / 2];
#pragma unroll
    for (int i = 0; i < C / 2; i++) {
      uint32_t lo = OUT == ZPP_QM_BF16 ? zpp_qm_f32_to_bf16(v[2 * i])
                                       : zpp_qm_f32_to_f16(v[2 * i]);
      uint32_t hi = OUT == ZPP_QM_BF16 ? zpp_qm_f32_to_bf16(v[2 * i + 1])
                                       : zpp_qm_f32_to_f16(v[2 * i + 1]);
      u[i] = lo | hi << 16;
    }
    if constexpr (C == 4) {
      uint2 w;
      w.x = u[0];
      w.y = u[1];
      __stwb(reinterpret_cast<uint2 *>((uint16_t *)dst + e), w);
    } else {
      uint4 w;
      w.x = u[0];
      w.y = u[1];
      w.z = u[2];
      w.w = u[3];
      __stwb(reinterpret_cast<uint4 *>((uint16_t *)dst + e), w);
    }
  }
}

/* ---- block reduction ------------------------------------------------------ */

/* Symmetric: a = max of (bits & 0x7fffffff), which puts Inf/NaN on top.
 * Asymmetric: a = min and b = max of the ordered keys of the finite
 * elements; b = kNonFinite once a non-finite element is seen (it is above
 * every finite key, so max-merging keeps it). */
struct Red {
  uint32_t a, b;
};
constexpr uint32_t kNonFinite = 0xffffffffu;

/* Monotone map of finite floats to unsigned integers (-0 < +0, which is
 * harmless: zpp_qm_asym_params turns -0 into +0 and a zero range is the
 * same for both signs). */
__device__ __forceinline__ uint32_t f32_key(uint32_t u) {
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_f32(uint32_t k) {
  return zpp_qm_bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <bool ASYM> __device__ __forceinline__ Red red_init() {
  Red r;
  r.a = ASYM ? 0xffffffffu : 0u;
  r.b = 0;
  return r;
}

template <bool ASYM> __device__ __forceinline__ void red_add(Red &r, float x) {
  uint32_t u = zpp_qm_f32_bits(x);
  if (!ASYM) {
    r.a = max_u32(r.a, u & ZPP_QM_ABS_MASK);
  } else if ((u & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK) {
    r.b = kNonFinite;
  } else {
    uint32_t k = f32_key(u);
    r.a = min_u32(r.a, k);
    r.b = max_u32(r.b, k);
  }
}

template <bool ASYM>
__device__ __forceinline__ void red_merge(Red &r, uint32_t a, uint32_t b) {
  if (!ASYM) {
    r.a = max_u32(r.a, a);
  } else {
    r.a = min_u32(r.a, a);
    r.b = max_u32(r.b, b);
  }
}

/* Reduces r over each group of G threads; every thread of the group gets
 * the result.  Called by every thread of the CTA (the shuffles use the full
 * warp and G > 32 synchronises the CTA). */
template <bool ASYM>
__device__ __forceinline__ Red group_reduce(Red r, unsigned G,
                                            uint32_t (*s_red)[kMaxGroup / 32]) {
  unsigned width = G < 32 ? G : 32;
  for (unsigned o = width / 2; o > 0; o /= 2) {
    uint32_t a = __shfl_xor_sync(0xffffffffu, r.a, o);
    uint32_t b = ASYM ? __shfl_xor_sync(0xffffffffu, r.b, o) : 0u;
    red_merge<ASYM>(r, a, b);
  }
  if (G > 32) {
    unsigned warp = threadIdx.x / 32, first = (threadIdx.x / G) * (G / 32);
    if ((threadIdx.x & 31) == 0) {
      s_red[0][warp] = r.a;
      s_red[1][warp] = r.b;
    }
    __syncthreads();
    r.a = s_red[0][first];
    r.b = s_red[1][first];
    for (unsigned i = 1; i < G / 32; i++)
      red_merge<ASYM>(r, s_red[0][first + i], s_red[1][first + i]);
    __syncthreads(); /* s_red is reused by the next work item */
  }
  return r;
}

/* Block parameters from a reduction, by the shared rules. */
template <int BITS, bool ASYM>
__device__ __forceinline__ zpp_qm_params_t red_params(Red r) {
  if (!ASYM)
    return zpp_qm_sym_params(r.a, BITS);
  if (r.b == kNonFinite)
    return zpp_qm_asym_params(0.0f, 0.0f, 1, BITS);
  return zpp_qm_asym_params(key_f32(r.a), key_f32(r.b), 0, BITS);
}

/* ---- encode ---------------------------------------------------------------- */

struct EncArgs {
  const void *src;
  uint8_t *dst;
  size_t count, block, nb;
  size_t nwork; /* blocks (kFull) or block segments (kReduce, kQuant) */
  size_t spb;   /* segments per block (kReduce, kQuant) */
  unsigned G;   /* threads per group */
  int src_access;   /* kAccessVec, kAccessElem or kAccessByte */
  int pay_vec;      /* a full chunk's payload is aligned 32-bit stores */
  int meta_aligned; /* metadata slots are 4-byte aligned */
  /* stochastic rounding (docs/format.md): element e of the call draws
   * zpp_qm_rand24(keys, base + e); sr 0: round to nearest */
  int sr;
  zpp_qm_keys_t keys;
  uint64_t base;
};

template <int DT, int BITS> using EncChunk = Chunk<BITS, elem_size(DT)>;

template <int DT, int BITS>
__device__ __forceinline__ void load_segment(
    const EncArgs &a, size_t off, size_t len, size_t seg, unsigned t,
    float (&x)[EncChunk<DT, BITS>::R][EncChunk<DT, BITS>::C]) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
#pragma unroll
  for (int k = 0; k < R; k++) {
    size_t j = (seg * R + k) * a.G + t;
    int n = chunk_elems<C>(len, j);
    size_t e = off + j * C;
    if (n == C && a.src_access == kAccessVec) {
      load_chunk<DT, C>(a.src, e, x[k]);
    } else {
#pragma unroll
      for (int i = 0; i < C; i++)
        if (i < n)
          x[k][i] = load_elem<DT>(a.src, e + i, a.src_access == kAccessByte);
    }
  }
}

template <int DT, int BITS, bool ASYM>
__device__ __forceinline__ void reduce_segment(
    const EncArgs &a, size_t len, size_t seg, unsigned t,
    const float (&x)[EncChunk<DT, BITS>::R][EncChunk<DT, BITS>::C], Red &r) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
#pragma unroll
  for (int k = 0; k < R; k++) {
    int n = chunk_elems<C>(len, (seg * R + k) * a.G + t);
#pragma unroll
    for (int i = 0; i < C; i++)
      if (i < n)
        red_add<ASYM>(r, x[k][i]);
  }
}

template <int DT, int BITS>
__device__ __forceinline__ void quantize_segment(
    const EncArgs &a, uint8_t *pay, size_t off, size_t len, size_t seg,
    unsigned t,
    const float (&x)[EncChunk<DT, BITS>::R][EncChunk<DT, BITS>::C],
    const zpp_qm_params_t &p) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  constexpr int W = EncChunk<DT, BITS>::W;
#pragma unroll
  for (int k = 0; k < R; k++) {
    size_t j = (seg * R + k) * a.G + t;
    int n = chunk_elems<C>(len, j);
    if (n == 0)
      continue;
    uint32_t word[W];
#pragma unroll
    for (int w = 0; w < W; w++)
      word[w] = 0;
#pragma unroll
    for (int i = 0; i < C; i++) {
      if (i < n) {
        uint32_t code = zpp_qm_code_bits(
            a.sr ? zpp_qm_quantize_sr(
                       x[k][i], &p,
                       zpp_qm_rand24(a.keys, a.base + off + j * C + i))
                 : zpp_qm_quantize(x[k][i], &p));
        if (BITS == 4)
          code &= 0xfu;
        word[i * BITS / 32] |= code << (i * BITS % 32);
      }
    }
    /* chunk j holds 4 * W payload bytes; an odd INT4 tail leaves its high
     * nibble 0, as the format requires */
    uint8_t *q = pay + 4 * W * j;
    if (n == C && a.pay_vec) {
#pragma unroll
      for (int w = 0; w < W; w++)
        reinterpret_cast<uint32_t *>(q)[w] = word[w];
    } else {
      st_words<W>(q, word, BITS == 8 ? n : (n + 1) / 2);
    }
  }
}

/* ---- launch helpers ---------------------------------------------------------- */

int cuda_fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
  (void)cudaGetLastError(); /* leave no launch error behind for the caller */
  return -1;
}

/* Launches `kernel` with `ctas` CTAs (capped: the kernels loop) of
 * `threads` threads on stream s. */
template <typename... Exp, typename... Act>
int launch(const char *what, void (*kernel)(Exp...), size_t ctas,
           unsigned threads, cudaStream_t s, char *err, size_t errlen,
           Act &&...args) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3((unsigned)min_sz(ctas ? ctas : 1, ZPP_QUANT_CUDA_MAX_GRID), 1, 1);
  lc.blockDim = dim3(threads, 1, 1);
  lc.dynamicSmemBytes = 0;
  lc.stream = s;
  cudaError_t e = cudaLaunchKernelEx(&lc, kernel, static_cast<Act &&>(args)...);
  return e == cudaSuccess ? 0 : cuda_fail(e, what, err, errlen);
}

/* Smallest power of two >= ceil(nc / R): a group that holds nc chunks in
 * one segment (nc <= kMaxGroup * R). */
unsigned group_size(size_t nc, int R) {
  size_t per = ceil_div(nc, (size_t)R);
  unsigned g = 1;
  while (g < per)
    g *= 2;
  return g;
}

unsigned cta_threads(unsigned G) { return G < kCta ? kCta : G; }

size_t cta_count(size_t nwork, unsigned G) {
  return ceil_div(nwork, cta_threads(G) / G);
}

}  // namespace

#endif  // ZPP_SRC_KERNELS_QUANT_CUDA_CUH
