// Device transforms (transform.h): the same per-element rules as
// transform.c, through quant_math.h.  The Hadamard rotation performs, on
// every element, the operations of zpp_qm_fwht in its stage order (the
// lower element of a pair takes a + b, the upper a - b; then one multiply
// by the scale), so it is bitwise equal to the host paths:
//   - the butterflies run in tiles of kTile = 8192 floats of shared
//     memory.  A group's index bits are split into passes of at most 13
//     stage bits: pass 1 covers bits [0, 13) (a group of up to 8192: the
//     whole rotation in one launch), pass 2 bits [13, 26), and so on.  A
//     pass loads tiles of 8192 elements whose positions differ only in the
//     pass's bits (short lines: several side by side), runs its stages in
//     shared memory and stores the tile, so global memory is read and
//     written once per pass: one pass up to g = 8192, two up to 2^26.
//     Pass 1 reads the source in its dtype (the elements past the whole
//     groups are converted unrotated); the last pass multiplies by the
//     scale.  Positions come from shifts and masks of the power-of-two
//     sizes, never a division.
//   - In a tile each of the 512 threads holds 16 elements in registers
//     per round of 4 stages (one __syncthreads() a round: 13 stages in 4
//     rounds); global memory is read and written in the flat order
//     (element k * 512 + t of the tile by thread t), coalesced.
//   - wdiff_kernel moves its buffers in launch.cuh's chunks of 16-byte
//     accesses where the alignment allows, any alignment otherwise.
/* Device code: quant_math.h checks its accesses under the emulator. */
#define ZPP_QM_DEVICE_CODE 1

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

/* ---- Hadamard ------------------------------------------------------------ */

constexpr unsigned kTileBits = 13; /* 8192 floats: 32 KiB of shared memory */
constexpr unsigned kTile = 1u << kTileBits;
constexpr unsigned kHThreadBits = 9; /* 512 threads per CTA */
constexpr unsigned kHThreads = 1u << kHThreadBits;
constexpr unsigned kRoundBits = kTileBits - kHThreadBits; /* 4 */
constexpr unsigned kPer = 1u << kRoundBits; /* elements per thread: 16 */
constexpr unsigned kHBatch = 32;            /* entries per launch */

static_assert(kPer * kHThreads == kTile, "a tile is 16 elements a thread");

/* One float of padding every 32: a round's 16 elements of a thread lie
 * 2^b apart, which without it would put a warp on a few banks. */
__device__ __forceinline__ unsigned pad(unsigned u) { return u + (u >> 5); }

struct HadEntry {
  const void *src; /* count elements of the pass's dtype (pass 1) */
  float *dst;      /* count floats */
  size_t n;        /* elements in whole groups: a multiple of g */
  size_t count;
};

/* The entries of one launch; tiles [first[e], first[e + 1]) are entry
 * e's (n / kTile of them, or one per kTile / g groups). */
struct HadTable {
  unsigned n;
  size_t first[kHBatch + 1];
  HadEntry e[kHBatch];
};

/* One pass: the stages of the group's index bits [kh, kh + kl). */
struct HadPass {
  int dtype;    /* of src (pass 1); later passes read dst */
  unsigned kh;  /* bits done by the passes before */
  unsigned kl;  /* <= kTileBits */
  int first;    /* pass 1: read src, convert the tails */
  int last;     /* multiply by c */
  float c;      /* zpp_qm_hadamard_scale(g) */
};

static_assert(sizeof(HadTable) + sizeof(HadPass) <= 4096,
              "the kernel parameters fit 4 KiB");

__device__ __forceinline__ unsigned find_entry(const HadTable &t, size_t w) {
  unsigned lo = 0, hi = t.n; /* first[lo] <= w < first[hi] */
  while (hi - lo > 1) {
    unsigned mid = (lo + hi) / 2;
    if (t.first[mid] <= w)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* Element of the entry at flat position u of tile `tile`.  Pass 1 (kh 0):
 * the tile is kTile consecutive elements, lines of 2^kl side by side.
 * Later passes: 2^kc columns (kc = kTileBits - kl) of lines of 2^kl
 * elements 2^kh apart, u = i * 2^kc + c; column `col` of the entry is
 * line lo = col mod 2^kh of span a = col / 2^kh, which starts at element
 * a * 2^(kh + kl) + lo.  2^kc <= 2^kh, so a tile's columns are
 * consecutive elements of one span: coalesced. */
__device__ __forceinline__ size_t had_index(size_t tile, unsigned u,
                                            unsigned kc, const HadPass &p) {
  if (p.kh == 0)
    return (tile << kTileBits) + u;
  size_t col = (tile << kc) + (u & ((1u << kc) - 1));
  size_t i = u >> kc;
  return ((col >> p.kh) << (p.kh + p.kl)) + (i << p.kh) +
         (col & (((size_t)1 << p.kh) - 1));
}

/* Flat tile position of a thread's element q in a round of r stages at
 * tile bits [b0, b0 + r): the low r bits of q are those bits, the rest of
 * q (16 / 2^r lines) and the thread index fill the other bits. */
__device__ __forceinline__ unsigned round_pos(unsigned q, unsigned r,
                                              unsigned b0, unsigned tid) {
  unsigned v = ((q >> r) << kHThreadBits) | tid;
  return ((v >> b0) << (b0 + r)) | ((q & ((1u << r) - 1)) << b0) |
         (v & ((1u << b0) - 1));
}

/* Two CTAs per SM: 64 registers a thread, which the round's 16 elements
 * and their positions fit without a spill (tools/check_ptxas.sh); 32
 * would spill. */
__global__ void __launch_bounds__(kHThreads, 2)
    hadamard_pass_kernel(const HadTable t, const HadPass p) {
  __shared__ float s[kTile + kTile / 32];
  const unsigned tid = threadIdx.x;
  const unsigned kc = kTileBits - p.kl;
  const unsigned sb = p.kh == 0 ? 0 : kc; /* tile bit of stage bit 0 */
  const size_t total = t.first[t.n];
  for (size_t w = blockIdx.x; w < total; w += gridDim.x) {
    const unsigned e = find_entry(t, w);
    const size_t tile = w - t.first[e];
    const void *src = t.e[e].src;
    float *dst = t.e[e].dst;
    const size_t n = t.e[e].n;
    /* the caller's buffers may start at any byte */
    const bool src_al = zpp_kl::elems_aligned(src, p.dtype);
    const bool dst_al = zpp_kl::elems_aligned(dst, ZPP_QM_F32);
#pragma unroll
    for (unsigned k = 0; k < kPer; k++) {
      unsigned u = k * kHThreads + tid;
      size_t j = had_index(tile, u, kc, p);
      float v = 0.0f; /* past the last whole group: never stored */
      if (j < n)
        v = p.first
                ? zpp_kl::load_any<zpp_kl::kRead>(src, j, p.dtype, src_al)
                : zpp_kl::load_any<zpp_kl::kUpdate>(dst, j, ZPP_QM_F32, dst_al);
      s[pad(u)] = v;
    }
    __syncthreads();
    for (unsigned m0 = 0; m0 < p.kl; m0 += kRoundBits) {
      const unsigned r = p.kl - m0 < kRoundBits ? p.kl - m0 : kRoundBits;
      const unsigned b0 = sb + m0;
      float x[kPer];
#pragma unroll
      for (unsigned q = 0; q < kPer; q++)
        x[q] = s[pad(round_pos(q, r, b0, tid))];
#pragma unroll
      for (unsigned m = 0; m < kRoundBits; m++) {
        if (m < r) {
#pragma unroll
          for (unsigned q = 0; q < kPer; q++) {
            if ((q >> m) & 1u)
              continue;
            float a = x[q], b = x[q | (1u << m)];
            x[q] = zpp_qm_add(a, b);
            x[q | (1u << m)] = zpp_qm_add(a, -b);
          }
        }
      }
      /* each position is this thread's alone within the round */
#pragma unroll
      for (unsigned q = 0; q < kPer; q++)
        s[pad(round_pos(q, r, b0, tid))] = x[q];
      __syncthreads();
    }
#pragma unroll
    for (unsigned k = 0; k < kPer; k++) {
      unsigned u = k * kHThreads + tid;
      size_t j = had_index(tile, u, kc, p);
      if (j < n)
        zpp_kl::store_f32_any(dst, j, p.last ? s[pad(u)] * p.c : s[pad(u)],
                              dst_al);
    }
    __syncthreads(); /* s is refilled by the next tile */
  }
  if (!p.first)
    return;
  /* pass 1: the elements past the whole groups, converted (not in place
   * on fp32: nothing to do) */
  for (unsigned e = 0; e < t.n; e++) {
    const void *src = t.e[e].src;
    float *dst = t.e[e].dst;
    if (p.dtype == ZPP_QM_F32 && src == (const void *)dst)
      continue;
    const bool src_al = zpp_kl::elems_aligned(src, p.dtype);
    const bool dst_al = zpp_kl::elems_aligned(dst, ZPP_QM_F32);
    for (size_t i = t.e[e].n + (size_t)blockIdx.x * kHThreads + tid;
         i < t.e[e].count; i += (size_t)gridDim.x * kHThreads)
      zpp_kl::store_f32_any(
          dst, i, zpp_kl::load_any<zpp_kl::kRead>(src, i, p.dtype, src_al),
          dst_al);
  }
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

extern "C" int zpp_tf_hadamard_batch_device(size_t g, int dtype,
                                            const zpp_tf_run_t *runs,
                                            size_t nruns, void *stream,
                                            char *err, size_t errlen) {
  unsigned kg = 0; /* g = 2^kg; below 2: no group, a conversion */
  if (g >= 2 && (g & (g - 1)) != 0) {
    snprintf(err, errlen, "hadamard group %zu: must be a power of two", g);
    return 1;
  }
  while (g >= 2 && ((size_t)1 << kg) < g)
    kg++;
  for (size_t at = 0; at < nruns; at += kHBatch) {
    HadTable t = {};
    size_t tiles = 0, tail = 0; /* the longest tail to convert */
    for (size_t i = at; i < nruns && t.n < kHBatch; i++) {
      const zpp_tf_run_t *r = &runs[i];
      size_t n = kg ? r->count >> kg << kg : 0;
      if ((dtype != ZPP_QM_F32 || (const void *)r->dst != r->src) &&
          r->count - n > tail)
        tail = r->count - n;
      t.e[t.n].src = r->src;
      t.e[t.n].dst = r->dst;
      t.e[t.n].n = n;
      t.e[t.n].count = r->count;
      t.first[t.n] = tiles;
      tiles += (n + kTile - 1) >> kTileBits;
      t.first[++t.n] = tiles;
    }
    if (tiles == 0 && tail == 0)
      continue;
    size_t ctas = (tail + kHThreads - 1) / kHThreads;
    if (ctas < tiles)
      ctas = tiles;
    if (ctas > (size_t)65535 * 16)
      ctas = (size_t)65535 * 16;
    HadPass p = {};
    p.dtype = dtype;
    p.c = zpp_qm_hadamard_scale(g);
    unsigned kh = 0;
    do { /* pass 1 even without a whole group: it converts the tails */
      p.kh = kh;
      p.kl = kg - kh < kTileBits ? kg - kh : kTileBits;
      p.first = kh == 0;
      p.last = kh + p.kl == kg;
      if (report(launch(hadamard_pass_kernel, (unsigned)ctas, kHThreads,
                        (cudaStream_t)stream, t, p),
                 "hadamard kernel launch", err, errlen))
        return 1;
      kh += p.kl;
    } while (kh < kg && tiles > 0);
  }
  return 0;
}

extern "C" int zpp_tf_hadamard_device(size_t g, int dtype, const void *src,
                                      size_t count, float *dst, void *stream,
                                      char *err, size_t errlen) {
  zpp_tf_run_t r = {src, dst, count};
  if (count == 0) return 0;
  return zpp_tf_hadamard_batch_device(g, dtype, &r, 1, stream, err, errlen);
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
