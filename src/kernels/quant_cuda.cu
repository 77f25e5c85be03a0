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
/* Device code: quant_math.h checks its accesses under the emulator. */
#define ZPP_QM_DEVICE_CODE 1

#include "quant_cuda.h"
#include "quant_math.h"

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "quant_cuda.cuh"

namespace {

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
        /* in 32 bits: the launcher splits blocks only while nwork fits
         * (a 64-bit division, a subroutine call, gives the fp16 reduce
         * kernels a stack frame and spills on sm_80) */
        b = (uint32_t)w / (uint32_t)a.spb;
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
    float scale, zero;
    load_meta<ASYM>(meta, a.meta_aligned, scale, zero);
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
  const size_t spb = ceil_div(nc, (size_t)kMaxGroup * R);
  if (!a.meta_aligned || a.nb >= kLoopMinBlocks ||
      a.nb * spb > UINT32_MAX) { /* one CTA per block */
    a.nwork = a.nb;
    a.spb = 1;
    return launch("encode kernel (looping)",
                  encode_kernel<DT, BITS, ASYM, kFull>, a.nwork, kMaxGroup, st,
                  err, errlen, a);
  }
  /* split blocks: reset, reduce, quantise, finish (stream ordered) */
  a.spb = spb; /* nwork < 2^32: the kernels divide in 32 bits */
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
