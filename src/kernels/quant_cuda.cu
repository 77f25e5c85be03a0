/*
 * CUDA block codec: the launchers of quant_cuda.h.  Layout and rounding are
 * specified in docs/format.md; every per-element and per-block rule comes
 * from quant_math.h, so the output equals the CPU path bit for bit.
 *
 * Work decomposition.  A *chunk* is C consecutive elements of one block:
 * 16 bytes of fp16/bf16 or fp32 (32 bytes for fp32 INT4), whose codes fill
 * one or two whole 32-bit payload words.  Chunks are counted from the start
 * of their block, so a chunk never straddles two blocks and INT4 pairs are
 * never split.  A *group* of G threads (a power of two, 1..512) works on
 * one block, or on one *segment* of G * R chunks (16 G elements) of a
 * block; thread t of the group takes chunks t, t + G, ..., t + (R - 1) G
 * of the segment, so consecutive threads touch consecutive 16-byte pieces
 * (coalesced) and each thread has R loads in flight.  G <= 32: several
 * groups share a warp and reduce with xor shuffles; G > 32: warp partials
 * meet in shared memory (a CTA holds max(G, 256) / G groups).
 *
 * Encode paths, chosen from the longest block (min(block, count)):
 *  - one segment per block (block <= 512 * 16 elements): the group loads
 *    its block into registers once, reduces, writes the metadata and the
 *    payload (kFull);
 *  - longer blocks and many of them (>= kLoopMinBlocks), or metadata not
 *    4-byte aligned: one CTA per block loops over its segments twice,
 *    reduce then quantise; the second read mostly hits L2 (kFull, looping);
 *  - longer blocks and few of them (1 << 20 elements, say): the block is
 *    split over many CTAs.  The metadata slots of dst serve as scratch:
 *    kernel 1 resets them, kernel 2 reduces each segment and merges it with
 *    one atomic per CTA (integer max of |x| bits; min/max of ordered float
 *    keys), kernel 3 quantises each segment from the merged value, kernel 4
 *    turns the merged value into the stored scale (and zero).  Integer
 *    max/min are exact and order-free, so the result is deterministic.
 * Decode needs no reduction: groups take segments of blocks directly.
 *
 * Memory access.  Whole chunks use vector accesses (16-byte loads and
 * stores of the elements, 32-bit payload words) when every block starts on
 * a chunk boundary and the pointers are aligned; otherwise element
 * accesses, and byte accesses when a pointer is not even aligned to its
 * element size, so any pointer works and gives the same bytes.
 *
 * Everything is asynchronous on the caller's stream: kernel launches only
 * (no allocation, no memset, no synchronisation), so the launchers can be
 * captured into a CUDA graph.
 */
#include "quant_cuda.h"
#include "quant_math.h"

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

template <int DT, int BITS, bool ASYM, int MODE>
__global__ void __launch_bounds__(kMaxGroup) encode_kernel(EncArgs a) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  __shared__ uint32_t s_red[2][kMaxGroup / 32];
  const unsigned G = a.G;
  const unsigned t = threadIdx.x & (G - 1);
  const size_t gic = threadIdx.x / G, gpc = blockDim.x / G;
  const size_t mb = zpp_qm_meta_bytes(ASYM);
  const size_t pb = zpp_qm_payload_bytes(a.block, BITS);
  const size_t seg_chunks = (size_t)G * R;

  /* The loop bound is the same for the whole CTA: groups past the end
   * still take part in the reductions, with nothing to reduce. */
  for (size_t base = blockIdx.x * gpc; base < a.nwork;
       base += (size_t)gridDim.x * gpc) {
    const size_t w = base + gic;
    size_t b = 0, s0 = 0, s1 = 0, len = 0;
    if (w < a.nwork) {
      size_t seg = 0;
      b = w;
      if (MODE != kFull) {
        b = div_sz(w, a.spb);
        seg = w - b * a.spb;
      }
      len = min_sz(a.block, a.count - b * a.block);
      size_t nseg = ceil_div(ceil_div(len, C), seg_chunks);
      s0 = MODE == kFull ? 0 : seg;
      s1 = MODE == kFull ? nseg : (seg < nseg ? seg + 1 : seg);
    }
    const size_t off = b * a.block;
    uint8_t *meta = a.dst + b * mb;
    uint8_t *pay = a.dst + a.nb * mb + b * pb;
    float x[R][C];
    zpp_qm_params_t p;

    if (MODE != kQuant) {
      Red r = red_init<ASYM>();
      for (size_t s = s0; s < s1; s++) {
        load_segment<DT, BITS>(a, off, len, s, t, x);
        reduce_segment<DT, BITS, ASYM>(a, len, s, t, x, r);
      }
      r = group_reduce<ASYM>(r, G, s_red);
      if (MODE == kReduce) {
        if (t == 0 && s1 > s0) {
          uint32_t *m = reinterpret_cast<uint32_t *>(meta);
          if (!ASYM) {
            atomicMax(m, r.a);
          } else {
            atomicMin(m, r.a);
            atomicMax(m + 1, r.b);
          }
        }
        continue;
      }
      p = red_params<BITS, ASYM>(r);
      if (t == 0 && s1 > s0) {
        if (a.meta_aligned) {
          reinterpret_cast<float *>(meta)[0] = p.scale;
          if (ASYM)
            reinterpret_cast<float *>(meta)[1] = p.zero;
        } else {
          st_bytes(meta, zpp_qm_f32_bits(p.scale), 4);
          if (ASYM)
            st_bytes(meta + 4, zpp_qm_f32_bits(p.zero), 4);
        }
      }
    } else {
      if (s1 == s0)
        continue;
      /* the merged reduction left by the kReduce launch */
      const uint32_t *m = reinterpret_cast<const uint32_t *>(meta);
      Red r;
      r.a = m[0];
      r.b = ASYM ? m[1] : 0u;
      p = red_params<BITS, ASYM>(r);
    }

    for (size_t s = s0; s < s1; s++) {
      if (MODE == kQuant || s1 - s0 > 1)
        load_segment<DT, BITS>(a, off, len, s, t, x);
      quantize_segment<DT, BITS>(a, pay, off, len, s, t, x, p);
    }
  }
}

/* Split path: the neutral reduction in every metadata slot... */
template <bool ASYM>
__global__ void reset_meta_kernel(uint8_t *dst, size_t nb) {
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb;
       b += (size_t)gridDim.x * blockDim.x) {
    uint32_t *m = reinterpret_cast<uint32_t *>(dst + b * zpp_qm_meta_bytes(ASYM));
    Red r = red_init<ASYM>();
    m[0] = r.a;
    if (ASYM)
      m[1] = r.b;
  }
}

/* ... and, once every segment is quantised, the stored scale (and zero). */
template <int BITS, bool ASYM>
__global__ void finish_meta_kernel(uint8_t *dst, size_t nb) {
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb;
       b += (size_t)gridDim.x * blockDim.x) {
    uint32_t *m = reinterpret_cast<uint32_t *>(dst + b * zpp_qm_meta_bytes(ASYM));
    Red r;
    r.a = m[0];
    r.b = ASYM ? m[1] : 0u;
    zpp_qm_params_t p = red_params<BITS, ASYM>(r);
    m[0] = zpp_qm_f32_bits(p.scale);
    if (ASYM)
      m[1] = zpp_qm_f32_bits(p.zero);
  }
}

/* ---- decode ---------------------------------------------------------------- */

struct DecArgs {
  const uint8_t *src;
  void *dst;
  size_t count, block, nb;
  size_t nwork; /* nb * spb */
  size_t spb;   /* segments per block */
  unsigned G;
  int pay_vec;      /* a full chunk's payload is one aligned 32-bit load */
  int meta_aligned; /* metadata slots are 4-byte aligned */
  int dst_access;   /* kAccessVec, kAccessElem or kAccessByte */
};

template <int BITS, bool ASYM, int OUT>
__global__ void __launch_bounds__(kMaxGroup) decode_kernel(DecArgs a) {
  using K = Chunk<BITS, elem_size(OUT)>;
  constexpr int C = K::C, R = K::R, W = K::W;
  const unsigned G = a.G;
  const unsigned t = threadIdx.x & (G - 1);
  const size_t gic = threadIdx.x / G, gpc = blockDim.x / G;
  const size_t mb = zpp_qm_meta_bytes(ASYM);
  const size_t pb = zpp_qm_payload_bytes(a.block, BITS);

  for (size_t w = blockIdx.x * gpc + gic; w < a.nwork;
       w += (size_t)gridDim.x * gpc) {
    size_t b = w, seg = 0;
    if (a.spb > 1) {
      b = div_sz(w, a.spb);
      seg = w - b * a.spb;
    }
    const size_t off = b * a.block;
    const size_t len = min_sz(a.block, a.count - off);
    const uint8_t *meta = a.src + b * mb;
    const uint8_t *pay = a.src + a.nb * mb + b * pb;
    float scale, zero = 0.0f;
    if (a.meta_aligned) {
      scale = reinterpret_cast<const float *>(meta)[0];
      if (ASYM)
        zero = reinterpret_cast<const float *>(meta)[1];
    } else {
      scale = zpp_qm_bits_f32(ld_bytes(meta, 4));
      if (ASYM)
        zero = zpp_qm_bits_f32(ld_bytes(meta + 4, 4));
    }
#pragma unroll
    for (int k = 0; k < R; k++) {
      size_t j = (seg * R + k) * G + t;
      int n = chunk_elems<C>(len, j);
      if (n == 0)
        continue;
      const uint8_t *q = pay + 4 * W * j;
      uint32_t word[W];
      if (n == C && a.pay_vec) {
#pragma unroll
        for (int w = 0; w < W; w++)
          word[w] = reinterpret_cast<const uint32_t *>(q)[w];
      } else {
        ld_words<W>(q, word, BITS == 8 ? n : (n + 1) / 2);
      }
      float v[C];
#pragma unroll
      for (int i = 0; i < C; i++) {
        uint32_t stored =
            (word[i * BITS / 32] >> (i * BITS % 32)) & ((1u << BITS) - 1u);
        v[i] = zpp_qm_dequantize(zpp_qm_code_value(stored, BITS, ASYM), scale,
                                 zero);
      }
      size_t e = off + j * C;
      if (n == C && a.dst_access == kAccessVec) {
        store_chunk<OUT, C>(a.dst, e, v);
      } else {
#pragma unroll
        for (int i = 0; i < C; i++)
          if (i < n)
            store_elem<OUT>(a.dst, e + i, v[i], a.dst_access == kAccessByte);
      }
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

template <int DT, int BITS, bool ASYM>
int encode_run(const zpp_qcfg_t *cfg, const void *src, size_t count,
               uint8_t *dst, cudaStream_t st, char *err, size_t errlen) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  constexpr size_t es = elem_size(DT);
  EncArgs a = {};
  a.src = src;
  a.dst = dst;
  a.count = count;
  a.block = cfg->block;
  a.nb = zpp_quant_nblocks(cfg, count);
  a.sr = cfg->sr;
  a.keys.k0 = cfg->k0;
  a.keys.k1 = cfg->k1;
  a.base = cfg->base;
  const bool chunk_aligned = a.nb == 1 || a.block % C == 0;
  const uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
  a.src_access = chunk_aligned && s % min_sz(16, C * es) == 0 ? kAccessVec
                 : s % es == 0                                ? kAccessElem
                                                              : kAccessByte;
  a.meta_aligned = d % 4 == 0;
  a.pay_vec = chunk_aligned && a.meta_aligned;
  const size_t nc = ceil_div(min_sz(a.block, count), C);

  if (nc <= kMaxGroup * R) { /* one segment per block */
    a.G = group_size(nc, R);
    a.nwork = a.nb;
    a.spb = 1;
    return launch("encode kernel", encode_kernel<DT, BITS, ASYM, kFull>,
                  cta_count(a.nwork, a.G), cta_threads(a.G), st, err, errlen,
                  a);
  }
  a.G = kMaxGroup;
  if (!a.meta_aligned || a.nb >= kLoopMinBlocks) { /* one CTA per block */
    a.nwork = a.nb;
    a.spb = 1;
    return launch("encode kernel (looping)",
                  encode_kernel<DT, BITS, ASYM, kFull>, a.nwork, kMaxGroup, st,
                  err, errlen, a);
  }
  /* split blocks: reset, reduce, quantise, finish (stream ordered) */
  a.spb = ceil_div(nc, (size_t)kMaxGroup * R);
  a.nwork = a.nb * a.spb;
  size_t meta_ctas = ceil_div(a.nb, kCta);
  if (launch("encode reset kernel", reset_meta_kernel<ASYM>, meta_ctas, kCta,
             st, err, errlen, dst, a.nb) ||
      launch("encode reduce kernel", encode_kernel<DT, BITS, ASYM, kReduce>,
             a.nwork, kMaxGroup, st, err, errlen, a) ||
      launch("encode quantize kernel", encode_kernel<DT, BITS, ASYM, kQuant>,
             a.nwork, kMaxGroup, st, err, errlen, a) ||
      launch("encode finish kernel", finish_meta_kernel<BITS, ASYM>, meta_ctas,
             kCta, st, err, errlen, dst, a.nb))
    return -1;
  return 0;
}

template <int BITS, bool ASYM, int OUT>
int decode_run(const zpp_qcfg_t *cfg, const uint8_t *src, size_t count,
               void *dst, cudaStream_t st, char *err, size_t errlen) {
  constexpr int C = Chunk<BITS, elem_size(OUT)>::C;
  constexpr int R = Chunk<BITS, elem_size(OUT)>::R;
  constexpr size_t os = elem_size(OUT);
  DecArgs a = {};
  a.src = src;
  a.dst = dst;
  a.count = count;
  a.block = cfg->block;
  a.nb = zpp_quant_nblocks(cfg, count);
  const bool chunk_aligned = a.nb == 1 || a.block % C == 0;
  const uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
  a.meta_aligned = s % 4 == 0;
  a.pay_vec = chunk_aligned && a.meta_aligned;
  a.dst_access = chunk_aligned && d % min_sz(16, C * os) == 0 ? kAccessVec
                 : d % os == 0                                ? kAccessElem
                                                              : kAccessByte;
  const size_t nc = ceil_div(min_sz(a.block, count), C);
  if (nc <= kMaxGroup * R) {
    a.G = group_size(nc, R);
    a.spb = 1;
  } else {
    a.G = kMaxGroup;
    a.spb = ceil_div(nc, (size_t)kMaxGroup * R);
  }
  a.nwork = a.nb * a.spb;
  return launch("decode kernel", decode_kernel<BITS, ASYM, OUT>,
                cta_count(a.nwork, a.G), cta_threads(a.G), st, err, errlen, a);
}

template <int DT>
int encode_dt(const zpp_qcfg_t *cfg, const void *src, size_t count,
              uint8_t *dst, cudaStream_t st, char *err, size_t errlen) {
  if (cfg->bits == 8)
    return cfg->asym ? encode_run<DT, 8, true>(cfg, src, count, dst, st, err, errlen)
                     : encode_run<DT, 8, false>(cfg, src, count, dst, st, err, errlen);
  return cfg->asym ? encode_run<DT, 4, true>(cfg, src, count, dst, st, err, errlen)
                   : encode_run<DT, 4, false>(cfg, src, count, dst, st, err, errlen);
}

template <int OUT>
int decode_out(const zpp_qcfg_t *cfg, const uint8_t *src, size_t count,
               void *dst, cudaStream_t st, char *err, size_t errlen) {
  if (cfg->bits == 8)
    return cfg->asym ? decode_run<8, true, OUT>(cfg, src, count, dst, st, err, errlen)
                     : decode_run<8, false, OUT>(cfg, src, count, dst, st, err, errlen);
  return cfg->asym ? decode_run<4, true, OUT>(cfg, src, count, dst, st, err, errlen)
                   : decode_run<4, false, OUT>(cfg, src, count, dst, st, err, errlen);
}

int bad_arg(const char *msg, char *err, size_t errlen) {
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "%s", msg);
  return -1;
}

} /* namespace */

/* ---- quant_cuda.h ---------------------------------------------------------- */

extern "C" int zpp_quant_cuda_device_ok(void) {
  /* -1: not probed yet.  Two threads probing at once compute the same
   * value, so a plain atomic store is enough. */
  static int cached = -1;
  int ok = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
  if (ok < 0) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      (void)cudaGetLastError(); /* no driver or no device: not an error here */
    ok = e == cudaSuccess && n > 0;
    __atomic_store_n(&cached, ok, __ATOMIC_RELEASE);
  }
  return ok;
}

extern "C" int zpp_quant_cuda_is_device_ptr(const void *p, int *device,
                                            char *err, size_t errlen) {
  cudaPointerAttributes at = {};
  cudaError_t e = cudaPointerGetAttributes(&at, p);
  if (device != NULL)
    *device = -1;
  if (e != cudaSuccess) {
    cuda_fail(e, "cudaPointerGetAttributes", err, errlen);
    return 0;
  }
  if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) {
    if (device != NULL && at.type == cudaMemoryTypeDevice)
      *device = at.device;
    return 1;
  }
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "%s",
             at.type == cudaMemoryTypeHost
                 ? "page-locked host memory; pass device or managed memory"
                 : "host memory unknown to CUDA; pass device or managed memory");
  return 0;
}

extern "C" int zpp_quant_cuda_encode(const zpp_qcfg_t *cfg, int dtype,
                                     const void *src, size_t count,
                                     uint8_t *dst, void *stream, char *err,
                                     size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (count == 0)
    return 0;
  switch (dtype) {
  case ZPP_QM_F32:
    return encode_dt<ZPP_QM_F32>(cfg, src, count, dst, st, err, errlen);
  case ZPP_QM_F16:
    return encode_dt<ZPP_QM_F16>(cfg, src, count, dst, st, err, errlen);
  case ZPP_QM_BF16:
    return encode_dt<ZPP_QM_BF16>(cfg, src, count, dst, st, err, errlen);
  default:
    return bad_arg("encode: unknown dtype", err, errlen);
  }
}

extern "C" int zpp_quant_cuda_decode(const zpp_qcfg_t *cfg,
                                     const uint8_t *src, size_t count,
                                     int out_kind, void *dst, void *stream,
                                     char *err, size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (count == 0)
    return 0;
  switch (out_kind) {
  case ZPP_QM_F32:
    return decode_out<ZPP_QM_F32>(cfg, src, count, dst, st, err, errlen);
  case ZPP_QM_F16:
    return decode_out<ZPP_QM_F16>(cfg, src, count, dst, st, err, errlen);
  case ZPP_QM_BF16:
    return decode_out<ZPP_QM_BF16>(cfg, src, count, dst, st, err, errlen);
  case ZPP_QM_OUT_ACC:
    return decode_out<kOutAcc>(cfg, src, count, dst, st, err, errlen);
  default:
    return bad_arg("decode: unknown output kind", err, errlen);
  }
}
