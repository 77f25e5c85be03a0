/*
 * CUDA kernels of qgZ's compressed-domain sums (isum_cuda.h): the five
 * steps of zpp_isum_ops_t over tables of runs, every per-element operation
 * through quant_math.h in the scalar reference's order, so the bits are
 * those of zpp_isum_*_scalar (docs/format.md, "Integer sums").
 *
 * Decomposition: a launch's work items are the blocks of all its runs (run
 * e's from first[e] on, found by a binary search), one block for a group of
 * G threads (a power of two, at most one CTA of kCta), thread t taking the
 * chunks t, t + G, ... of kC elements.  A chunk moves through one 16-byte
 * access per 16 bytes when its buffer allows it (chunks start at a multiple
 * of kC elements and the buffer at 16 bytes), else through element or byte
 * accesses, so buffers may start at any byte.
 *
 * The steps that need a block's statistic make passes over it, each thread
 * recomputing its own elements from the same inputs (the second read comes
 * from L1/L2): absmax (one reduction); encode, and the sum's own share,
 * with an INT8 residual (the new errors' absmax, then their codes);
 * requant (max |j|, then the codes; with an INT8 residual a third pass).  An
 * INT8 residual's old codes are overwritten only in the last pass, by the
 * thread that read them; its old block scale is read by every thread before the
 * reduction that precedes the new one's store.
 */
/* Device code: quant_math.h checks its accesses under the emulator. */
#define ZPP_QM_DEVICE_CODE 1

#include "isum_cuda.h"
#include "quant_cuda.cuh"

namespace {

constexpr unsigned kBatch = ZPP_ISUM_CUDA_BATCH;
constexpr unsigned kSrcs = ZPP_ISUM_CUDA_SRCS;
constexpr int kC = 8;                    /* elements per chunk */
enum { kVec = 0, kElem = 1, kByte = 2 }; /* access paths of a buffer */
/* The kernels' bounds: kCta threads, and at least one CTA per SM stated
 * explicitly.  Without the second argument ptxas chooses a register count
 * at an occupancy step of 256-thread CTAs (48, 64) and spills the few
 * values that do not fit (the group index, a loop-entry predicate: 4 to
 * 12 bytes of stack in sum, finish and encode on sm_80/sm_90), which
 * tools/check_ptxas.sh refuses; with it each kernel gets the registers it
 * needs and keeps its working set out of local memory. */
constexpr int kMinCtas = 1;

/* ---- tables -------------------------------------------------------------- */

struct AbsRun {
  const void *src;
  const uint8_t *res, *res_codes;
  uint32_t *amax;
  int8_t *uexp;
  size_t count, nb;
};

struct EncRun {
  const void *src;
  uint8_t *res, *res_codes;
  const uint32_t *amax;
  const int8_t *uexp;
  uint8_t *dst;
  size_t count, nb, cb; /* cb: bytes of the codes (the multipliers follow) */
  uint64_t base;
  zpp_qm_keys_t keys;
};

struct SumRun {
  const void *own;
  uint8_t *res, *res_codes; /* the own slice's residual */
  const int8_t *uexp;
  int32_t *out;
  size_t count, nb, cb;
  unsigned first, n; /* sources src[first, first + n) */
  int cont;          /* start from out (a run split over launches) */
};

struct ReqRun {
  const int32_t *in;
  const int8_t *uexp;
  uint8_t *res, *res_codes;
  uint8_t *dst;
  size_t count, nb;
  uint64_t base;
  zpp_qm_keys_t keys;
};

struct FinRun {
  const int32_t *own;
  const int8_t *uexp;
  void *dst;
  float *part; /* fp32 sums between the launches of a split run */
  size_t count, nb;
  unsigned first, n;
  int cont; /* start from part (not the first launch of the run) */
  int last; /* divide and round to dst (else store into part) */
};

template <typename Run> struct Table {
  unsigned n;
  size_t first[kBatch + 1]; /* blocks of the runs before run e */
  Run r[kBatch];
};

template <typename Run> struct SrcTable {
  unsigned n;
  size_t first[kBatch + 1];
  Run r[kBatch];
  const uint8_t *src[kSrcs];
};

struct Opts {
  size_t block;
  unsigned G; /* threads per block */
  int bits;   /* absmax: the exponents' width */
  int sr, res, reset;
  float beta, omega, div;
};

static_assert(sizeof(Table<EncRun>) + sizeof(Opts) <= 4000 &&
                  sizeof(Table<ReqRun>) + sizeof(Opts) <= 4000 &&
                  sizeof(SrcTable<SumRun>) + sizeof(Opts) <= 4000 &&
                  sizeof(SrcTable<FinRun>) + sizeof(Opts) <= 4000,
              "the kernel parameters stay within 4 KiB");

/* The run of work item w (t.first[lo] <= w < t.first[lo + 1]). */
template <typename T>
__device__ __forceinline__ unsigned find_run(const T &t, size_t w) {
  unsigned lo = 0, hi = t.n;
  while (hi - lo > 1) {
    unsigned mid = (lo + hi) / 2;
    if (t.first[mid] <= w)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* ---- access paths ------------------------------------------------------- */

/* Path of a buffer of es-byte elements whose chunks start at multiples of
 * kC elements when `chunked` (else anywhere). */
__device__ __forceinline__ int path_of(const void *p, int es, bool chunked) {
  const uintptr_t a = (uintptr_t)p;
  return chunked && a % 16 == 0 ? kVec : a % es == 0 ? kElem : kByte;
}

/* Elements [e, e + n) of a DT buffer as fp32. */
template <int DT>
__device__ __forceinline__ void ld_src(const void *p, size_t e, int n, int path,
                                       float (&x)[kC]) {
  if (n == kC && path == kVec) {
    load_chunk<DT, kC>(p, e, x);
    return;
  }
#pragma unroll
  for (int i = 0; i < kC; i++)
    x[i] = i < n ? load_elem<DT>(p, e + i, path == kByte) : 0.0f;
}

/* 32-bit elements [e, e + n) of p (fp32 or int32 bits). */
__device__ __forceinline__ void ld32(const void *p, size_t e, int n, int path,
                                     uint32_t (&w)[kC]) {
  if (n == kC && path == kVec) {
    const uint4 *q = reinterpret_cast<const uint4 *>((const uint32_t *)p + e);
#pragma unroll
    for (int k = 0; k < kC / 4; k++) {
      uint4 v = q[k];
      w[4 * k] = v.x;
      w[4 * k + 1] = v.y;
      w[4 * k + 2] = v.z;
      w[4 * k + 3] = v.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kC; i++)
    w[i] = i >= n          ? 0u
           : path == kByte ? ld_bytes((const uint8_t *)p + 4 * (e + i), 4)
                           : ((const uint32_t *)p)[e + i];
}

__device__ __forceinline__ void st32(void *p, size_t e, int n, int path,
                                     const uint32_t (&w)[kC]) {
  if (n == kC && path == kVec) {
    uint4 *q = reinterpret_cast<uint4 *>((uint32_t *)p + e);
#pragma unroll
    for (int k = 0; k < kC / 4; k++) {
      uint4 v;
      v.x = w[4 * k];
      v.y = w[4 * k + 1];
      v.z = w[4 * k + 2];
      v.w = w[4 * k + 3];
      __stwb(q + k, v);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kC; i++)
    if (i < n) {
      if (path == kByte)
        st_bytes((uint8_t *)p + 4 * (e + i), w[i], 4);
      else
        ((uint32_t *)p)[e + i] = w[i];
    }
}

/* One 32-bit value at any byte. */
__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
  if (((uintptr_t)p & 3u) == 0)
    return *reinterpret_cast<const uint32_t *>(p);
  return ld_bytes(p, 4);
}
__device__ __forceinline__ void st_u32(uint8_t *p, uint32_t v) {
  if (((uintptr_t)p & 3u) == 0)
    *reinterpret_cast<uint32_t *>(p) = v;
  else
    st_bytes(p, v, 4);
}

/* The W payload words of chunk j of a block's codes at pay. */
template <int W>
__device__ __forceinline__ void ld_codes(const uint8_t *pay, size_t j, int n,
                                         int bits, bool vec,
                                         uint32_t (&word)[W]) {
  const uint8_t *q = pay + 4 * W * j;
  if (n == kC && vec) {
#pragma unroll
    for (int k = 0; k < W; k++)
      word[k] = reinterpret_cast<const uint32_t *>(q)[k];
  } else {
    ld_words<W>(q, word, bits == 8 ? n : (n + 1) / 2);
  }
}
template <int W>
__device__ __forceinline__ void st_codes(uint8_t *pay, size_t j, int n,
                                         int bits, bool vec,
                                         const uint32_t (&word)[W]) {
  uint8_t *q = pay + 4 * W * j;
  if (n == kC && vec) {
#pragma unroll
    for (int k = 0; k < W; k++)
      reinterpret_cast<uint32_t *>(q)[k] = word[k];
  } else {
    /* an odd INT4 tail leaves its high nibble 0, as the format requires */
    st_words<W>(q, word, bits == 8 ? n : (n + 1) / 2);
  }
}

template <int BITS>
__device__ __forceinline__ int code_at(const uint32_t *word, int i) {
  uint32_t st = (word[i * BITS / 32] >> (i * BITS % 32)) & ((1u << BITS) - 1u);
  return zpp_qm_code_value(st, BITS, 0);
}

/* ---- residuals ----------------------------------------------------------- */

/* One run's residual as a block sees it. */
struct Res {
  uint8_t *p;     /* F32: the floats; I8: the blocks' scales; NULL: none */
  uint8_t *codes; /* I8: the codes */
  int path;       /* F32: access path */
  float scale;    /* I8: this block's old scale */
};

__device__ __forceinline__ Res res_view(const Opts &o, uint8_t *p,
                                        uint8_t *codes, size_t b,
                                        bool chunked) {
  Res r = {};
  r.p = o.res == ZPP_QB_RES_NONE ? nullptr : p;
  r.codes = codes;
  if (r.p != nullptr && o.res == ZPP_QB_RES_F32)
    r.path = path_of(p, 4, chunked);
  if (r.p != nullptr && o.res == ZPP_QB_RES_I8 && !o.reset)
    r.scale = zpp_qm_bits_f32(ld_u32(p + 4 * b));
  return r;
}

/* The old residual of elements [e, e + n) (0 with reset). */
__device__ __forceinline__ void old_res(const Opts &o, const Res &r, size_t e,
                                        int n, float (&v)[kC]) {
#pragma unroll
  for (int i = 0; i < kC; i++)
    v[i] = 0.0f;
  if (o.reset)
    return;
  if (o.res == ZPP_QB_RES_F32) {
    uint32_t w[kC];
    ld32(r.p, e, n, r.path, w);
#pragma unroll
    for (int i = 0; i < kC; i++)
      if (i < n)
        v[i] = zpp_qm_bits_f32(w[i]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kC; i++)
    if (i < n)
      v[i] = zpp_qm_dequantize(zpp_qm_code_value(r.codes[e + i], 8, 0), r.scale,
                               0.0f);
}

/* New errors of elements [e, e + n): F32 stored; I8 reduced into re (the
 * pass that reduces) or coded with pe (the last pass). */
__device__ __forceinline__ void new_res(const Opts &o, const Res &r, size_t e,
                                        int n, const float (&v)[kC], Red &re,
                                        bool last, const zpp_qm_params_t &pe) {
  if (o.res == ZPP_QB_RES_F32) {
    uint32_t w[kC];
#pragma unroll
    for (int i = 0; i < kC; i++)
      w[i] = zpp_qm_f32_bits(v[i]);
    st32(r.p, e, n, r.path, w);
    return;
  }
#pragma unroll
  for (int i = 0; i < kC; i++)
    if (i < n) {
      if (last)
        r.codes[e + i] = zpp_qm_code_bits(zpp_qm_quantize(v[i], &pe));
      else
        red_add<false>(re, v[i]);
    }
}

/* Per-work-item setup common to the kernels. */
struct Item {
  unsigned e;     /* run */
  size_t b, off;  /* block, its first element */
  size_t len, nb; /* elements of the block (0 past the end), blocks */
  bool chunked;   /* every chunk starts at a multiple of kC */
};

template <typename T>
__device__ __forceinline__ Item item_of(const T &tab, const Opts &o, size_t w,
                                        size_t total) {
  Item it = {};
  if (w >= total)
    return it;
  it.e = find_run(tab, w);
  it.b = w - tab.first[it.e];
  it.off = it.b * o.block;
  it.len = min_sz(o.block, tab.r[it.e].count - it.off);
  it.nb = tab.r[it.e].nb; /* from the host: no 64-bit division here */
  it.chunked = it.nb == 1 || o.block % kC == 0;
  return it;
}

/* ---- kernels ------------------------------------------------------------- */

/* The loop over work items is the same for every thread of a CTA: groups
 * past the end take part in the reductions with nothing to do. */
#define ISUM_FOR_ITEMS(tab)                                                    \
  const unsigned G = o.G;                                                      \
  const unsigned t = threadIdx.x & (G - 1);                                    \
  const size_t gic = threadIdx.x / G, gpc = blockDim.x / G;                    \
  const size_t total = (tab).first[(tab).n];                                   \
  for (size_t base_ = blockIdx.x * gpc; base_ < total;                         \
       base_ += (size_t)gridDim.x * gpc)

template <int DT>
__global__ void __launch_bounds__(kCta, kMinCtas)
    absmax_kernel(const Table<AbsRun> tab, const Opts o) {
  __shared__ uint32_t s_red[2][kMaxGroup / 32];
  ISUM_FOR_ITEMS(tab) {
    const Item it = item_of(tab, o, base_ + gic, total);
    const AbsRun &run = tab.r[it.e];
    const int sp = path_of(run.src, elem_size(DT), it.chunked);
    const bool has_res =
        it.len > 0 && o.res != ZPP_QB_RES_NONE && !o.reset && run.res;
    const Res rv = has_res
                       ? res_view(o, (uint8_t *)run.res,
                                  (uint8_t *)run.res_codes, it.b, it.chunked)
                       : Res{};
    Red r = red_init<false>();
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      const size_t e = it.off + j * kC;
      float x[kC];
      ld_src<DT>(run.src, e, n, sp, x);
      if (has_res) {
        float rr[kC];
        old_res(o, rv, e, n, rr);
#pragma unroll
        for (int i = 0; i < kC; i++)
          x[i] = zpp_qm_add(x[i], rr[i]);
      }
#pragma unroll
      for (int i = 0; i < kC; i++)
        if (i < n)
          red_add<false>(r, x[i]);
    }
    r = group_reduce<false>(r, G, s_red);
    if (t == 0 && it.len > 0) {
      st_u32((uint8_t *)(run.amax + it.b), r.a);
      if (run.uexp != nullptr)
        run.uexp[it.b] = (int8_t)zpp_qm_unit_exp(r.a, o.bits);
    }
  }
}

/* Chunk j of an encode: x = fl(src + old residual), its codes into word,
 * the new errors into x. */
template <int DT, int BITS>
__device__ __forceinline__ void
enc_chunk(const Opts &o, const EncRun &run, const Res &rv, int sp, size_t e,
          int n, const zpp_qm_params_t &p, float (&x)[kC],
          uint32_t (&word)[kC * BITS / 32]) {
  ld_src<DT>(run.src, e, n, sp, x);
  float rr[kC];
  if (rv.p != nullptr) {
    old_res(o, rv, e, n, rr);
#pragma unroll
    for (int i = 0; i < kC; i++)
      x[i] = zpp_qm_add(x[i], rr[i]);
  }
#pragma unroll
  for (int w = 0; w < kC * BITS / 32; w++)
    word[w] = 0;
#pragma unroll
  for (int i = 0; i < kC; i++) {
    if (i >= n)
      continue;
    const int q =
        o.sr ? zpp_qm_quantize_sr(x[i], &p,
                                  zpp_qm_rand24(run.keys, run.base + e + i))
             : zpp_qm_quantize(x[i], &p);
    uint32_t code = zpp_qm_code_bits(q);
    if (BITS == 4)
      code &= 0xfu;
    word[i * BITS / 32] |= code << (i * BITS % 32);
    if (rv.p != nullptr)
      x[i] = zpp_qm_feedback(rr[i], x[i], q, p.scale, o.beta, o.omega);
  }
}

template <int DT, int BITS>
__global__ void __launch_bounds__(kCta, kMinCtas)
    encode_kernel(const Table<EncRun> tab, const Opts o) {
  constexpr int W = kC * BITS / 32;
  __shared__ uint32_t s_red[2][kMaxGroup / 32];
  const size_t pb = zpp_qm_payload_bytes(o.block, BITS);
  ISUM_FOR_ITEMS(tab) {
    const Item it = item_of(tab, o, base_ + gic, total);
    const EncRun &run = tab.r[it.e];
    const int sp = path_of(run.src, elem_size(DT), it.chunked);
    const bool live = it.len > 0;
    const Res rv =
        live ? res_view(o, run.res, run.res_codes, it.b, it.chunked) : Res{};
    uint8_t *pay = live ? run.dst + it.b * pb : nullptr;
    const bool pay_vec = it.chunked && (uintptr_t)run.dst % 4 == 0;
    uint32_t m = 0;
    int ue = ZPP_QM_UEXP_ZERO;
    if (live) {
      ue = run.uexp[it.b];
      m = zpp_qm_unit_mult(ld_u32((const uint8_t *)(run.amax + it.b)), BITS,
                           ue);
    }
    const zpp_qm_params_t p = zpp_qm_unit_params(ue, m, BITS);
    if (t == 0 && live)
      run.dst[run.cb + it.b] = (uint8_t)m;
    const zpp_qm_params_t none = {};
    Red re = red_init<false>();
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      const size_t e = it.off + j * kC;
      float x[kC];
      uint32_t word[W];
      enc_chunk<DT, BITS>(o, run, rv, sp, e, n, p, x, word);
      st_codes<W>(pay, j, n, BITS, pay_vec, word);
      if (rv.p != nullptr)
        new_res(o, rv, e, n, x, re, false, none);
    }
    if (o.res != ZPP_QB_RES_I8)
      continue;
    re = group_reduce<false>(re, G, s_red);
    const zpp_qm_params_t pe = red_params<8, false>(re);
    if (rv.p == nullptr)
      continue;
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      const size_t e = it.off + j * kC;
      float x[kC];
      uint32_t word[W];
      enc_chunk<DT, BITS>(o, run, rv, sp, e, n, p, x, word);
      new_res(o, rv, e, n, x, re, true, pe);
    }
    if (t == 0) /* every thread of the group read the old one */
      st_u32(rv.p + 4 * it.b, zpp_qm_f32_bits(pe.scale));
  }
}

/* Chunk j of a sum's own share (a run's first launch): x = fl(own + old
 * residual), its units into c, the new errors into x (rv.p non-NULL). */
template <int DT>
__device__ __forceinline__ void
own_chunk(const Opts &o, const SumRun &run, const Res &rv, int wp, int ue,
          float unit, size_t e, int n, uint32_t (&c)[kC], float (&x)[kC]) {
  ld_src<DT>(run.own, e, n, wp, x);
  float rr[kC];
  if (rv.p != nullptr) {
    old_res(o, rv, e, n, rr);
#pragma unroll
    for (int i = 0; i < kC; i++)
      x[i] = zpp_qm_add(x[i], rr[i]);
  }
#pragma unroll
  for (int i = 0; i < kC; i++) {
    const int32_t u = zpp_qm_unit_own(x[i], ue);
    c[i] = (uint32_t)u;
    if (rv.p != nullptr)
      x[i] = zpp_qm_feedback(rr[i], x[i], u, unit, o.beta, o.omega);
  }
}

template <int DT, int BITS>
__global__ void __launch_bounds__(kCta, kMinCtas)
    sum_kernel(const SrcTable<SumRun> tab, const Opts o) {
  constexpr int W = kC * BITS / 32;
  __shared__ uint32_t s_red[2][kMaxGroup / 32];
  const size_t pb = zpp_qm_payload_bytes(o.block, BITS);
  ISUM_FOR_ITEMS(tab) {
    const Item it = item_of(tab, o, base_ + gic, total);
    const SumRun &run = tab.r[it.e];
    const bool live = it.len > 0;
    const int ue = live ? run.uexp[it.b] : ZPP_QM_UEXP_ZERO;
    const float unit = zpp_qm_unit_value(ue);
    const int op = path_of(run.out, 4, it.chunked);
    const int wp = run.own ? path_of(run.own, elem_size(DT), it.chunked) : 0;
    /* the own slice's residual: in the run's first launch only */
    const bool own = live && !run.cont && run.own != nullptr;
    const Res rv = own && run.res != nullptr
                       ? res_view(o, run.res, run.res_codes, it.b, it.chunked)
                       : Res{};
    const zpp_qm_params_t none = {};
    Red re = red_init<false>();
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      const size_t e = it.off + j * kC;
      uint32_t c[kC];
      if (run.cont) {
        ld32(run.out, e, n, op, c);
      } else if (run.own != nullptr) {
        float x[kC];
        own_chunk<DT>(o, run, rv, wp, ue, unit, e, n, c, x);
        if (rv.p != nullptr)
          new_res(o, rv, e, n, x, re, false, none);
      } else {
#pragma unroll
        for (int i = 0; i < kC; i++)
          c[i] = 0;
      }
      for (unsigned s = run.first; s < run.first + run.n; s++) {
        const uint8_t *src = tab.src[s];
        const int32_t mult = src[run.cb + it.b];
        uint32_t word[W];
        ld_codes<W>(src + it.b * pb, j, n, BITS,
                    it.chunked && (uintptr_t)src % 4 == 0, word);
#pragma unroll
        for (int i = 0; i < kC; i++)
          c[i] = (uint32_t)((int32_t)c[i] + mult * code_at<BITS>(word, i));
      }
      st32(run.out, e, n, op, c);
    }
    /* an INT8 residual: the new errors' scale, then their codes */
    if (o.res != ZPP_QB_RES_I8)
      continue;
    re = group_reduce<false>(re, G, s_red);
    const zpp_qm_params_t pe = red_params<8, false>(re);
    if (rv.p == nullptr)
      continue;
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      const size_t e = it.off + j * kC;
      uint32_t c[kC];
      float x[kC];
      own_chunk<DT>(o, run, rv, wp, ue, unit, e, n, c, x);
      new_res(o, rv, e, n, x, re, true, pe);
    }
    if (t == 0) /* every thread of the group read the old one */
      st_u32(rv.p + 4 * it.b, zpp_qm_f32_bits(pe.scale));
  }
}

/* Chunk j of a requant: the compensated integer sums j = in + res units. */
__device__ __forceinline__ void req_load(const Opts &o, const ReqRun &run,
                                         const Res &rv, int ip, int ue,
                                         size_t e, int n, uint32_t (&in)[kC],
                                         float (&rr)[kC], int32_t (&jv)[kC]) {
  ld32(run.in, e, n, ip, in);
  if (rv.p != nullptr)
    old_res(o, rv, e, n, rr);
#pragma unroll
  for (int i = 0; i < kC; i++) {
    jv[i] = (int32_t)in[i];
    if (rv.p != nullptr)
      jv[i] += zpp_qm_unit_res(rr[i], ue);
  }
}

template <int BITS>
__global__ void __launch_bounds__(kCta, kMinCtas)
    requant_kernel(const Table<ReqRun> tab, const Opts o) {
  constexpr int W = kC * BITS / 32;
  __shared__ uint32_t s_red[2][kMaxGroup / 32];
  const size_t pb = zpp_qm_payload_bytes(o.block, BITS);
  const int qmax = zpp_qm_sym_qmax(BITS);
  ISUM_FOR_ITEMS(tab) {
    const Item it = item_of(tab, o, base_ + gic, total);
    const ReqRun &run = tab.r[it.e];
    const bool live = it.len > 0;
    const int ip = path_of(run.in, 4, it.chunked);
    const Res rv =
        live ? res_view(o, run.res, run.res_codes, it.b, it.chunked) : Res{};
    const int ue = live ? run.uexp[it.b] : ZPP_QM_UEXP_ZERO;
    /* pass 1: the largest |j| */
    Red r = red_init<false>();
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      uint32_t in[kC];
      float rr[kC];
      int32_t jv[kC];
      req_load(o, run, rv, ip, ue, it.off + j * kC, n, in, rr, jv);
#pragma unroll
      for (int i = 0; i < kC; i++)
        if (i < n)
          r.a = max_u32(r.a, (uint32_t)(jv[i] < 0 ? -jv[i] : jv[i]));
    }
    r = group_reduce<false>(r, G, s_red);
    const zpp_qm_params_t p =
        zpp_qm_irequant_params(zpp_qm_idivisor(r.a, qmax), ue, BITS);
    const float unit = zpp_qm_unit_value(ue);
    uint8_t *pay = live ? run.dst + it.nb * 4 + it.b * pb : nullptr;
    const bool pay_vec = it.chunked && (uintptr_t)run.dst % 4 == 0;
    if (t == 0 && live)
      st_u32(run.dst + 4 * it.b, zpp_qm_f32_bits(p.scale));
    /* pass 2: codes and new errors; with an INT8 residual, pass 3 codes
     * the errors with the scale of their reduction */
    const int passes = o.res == ZPP_QB_RES_I8 ? 2 : 1;
    Red re = red_init<false>();
    zpp_qm_params_t pe = {};
    for (int pass = 0; pass < passes; pass++) {
      if (pass == 1) {
        re = group_reduce<false>(re, G, s_red);
        pe = red_params<8, false>(re);
      }
      for (size_t j = t; j * kC < it.len; j += G) {
        const int n = chunk_elems<kC>(it.len, j);
        const size_t e = it.off + j * kC;
        uint32_t in[kC];
        float rr[kC];
        int32_t jv[kC];
        req_load(o, run, rv, ip, ue, e, n, in, rr, jv);
        uint32_t word[W];
#pragma unroll
        for (int w = 0; w < W; w++)
          word[w] = 0;
        float x[kC] = {};
#pragma unroll
        for (int i = 0; i < kC; i++) {
          if (i >= n)
            continue;
          const int q = o.sr ? zpp_qm_quantize_sr(
                                   (float)jv[i], &p,
                                   zpp_qm_rand24(run.keys, run.base + e + i))
                             : zpp_qm_quantize((float)jv[i], &p);
          uint32_t code = zpp_qm_code_bits(q);
          if (BITS == 4)
            code &= 0xfu;
          word[i * BITS / 32] |= code << (i * BITS % 32);
          if (rv.p != nullptr) {
#if defined(__CUDA_ARCH__)
            float xi = __fadd_rn(__fmul_rn((float)(int32_t)in[i], unit), rr[i]);
#else
            float xi = (float)(int32_t)in[i] * unit + rr[i];
#endif
            x[i] = zpp_qm_feedback(rr[i], xi, q, p.scale, o.beta, o.omega);
          }
        }
        if (pass == 0)
          st_codes<W>(pay, j, n, BITS, pay_vec, word);
        if (rv.p != nullptr)
          new_res(o, rv, e, n, x, re, pass == 1, pe);
      }
    }
    if (t == 0 && rv.p != nullptr && o.res == ZPP_QB_RES_I8)
      st_u32(rv.p + 4 * it.b, zpp_qm_f32_bits(pe.scale));
  }
}

template <int DT, int BITS>
__global__ void __launch_bounds__(kCta, kMinCtas)
    finish_kernel(const SrcTable<FinRun> tab, const Opts o) {
  constexpr int W = kC * BITS / 32;
  const size_t pb = zpp_qm_payload_bytes(o.block, BITS);
  ISUM_FOR_ITEMS(tab) {
    const Item it = item_of(tab, o, base_ + gic, total);
    if (it.len == 0)
      continue;
    const FinRun &run = tab.r[it.e];
    const float unit = zpp_qm_unit_value(run.uexp[it.b]);
    const int ip = path_of(run.own, 4, it.chunked);
    const int pp = path_of(run.part, 4, it.chunked);
    const int dp = path_of(run.dst, elem_size(DT), it.chunked);
    for (size_t j = t; j * kC < it.len; j += G) {
      const int n = chunk_elems<kC>(it.len, j);
      const size_t e = it.off + j * kC;
      uint32_t w[kC];
      float acc[kC];
      if (run.cont) {
        ld32(run.part, e, n, pp, w);
#pragma unroll
        for (int i = 0; i < kC; i++)
          acc[i] = zpp_qm_bits_f32(w[i]);
      } else {
        ld32(run.own, e, n, ip, w);
#pragma unroll
        for (int i = 0; i < kC; i++)
#if defined(__CUDA_ARCH__)
          acc[i] = __fmul_rn((float)(int32_t)w[i], unit);
#else
          acc[i] = (float)(int32_t)w[i] * unit;
#endif
      }
      for (unsigned s = run.first; s < run.first + run.n; s++) {
        const uint8_t *src = tab.src[s];
        const float sc = zpp_qm_bits_f32(ld_u32(src + 4 * it.b));
        uint32_t word[W];
        ld_codes<W>(src + it.nb * 4 + it.b * pb, j, n, BITS,
                    it.chunked && (uintptr_t)src % 4 == 0, word);
#pragma unroll
        for (int i = 0; i < kC; i++)
          acc[i] = zpp_qm_add(
              acc[i], zpp_qm_dequantize(code_at<BITS>(word, i), sc, 0.0f));
      }
      if (!run.last) { /* the exact fp32 sums, for the next launch */
#pragma unroll
        for (int i = 0; i < kC; i++)
          w[i] = zpp_qm_f32_bits(acc[i]);
        st32(run.part, e, n, pp, w);
        continue;
      }
#pragma unroll
      for (int i = 0; i < kC; i++)
#if defined(__CUDA_ARCH__)
        acc[i] = __fdiv_rn(acc[i], o.div);
#else
        acc[i] = acc[i] / o.div;
#endif
      if (n == kC && dp == kVec) {
        store_chunk<DT, kC>(run.dst, e, acc);
      } else {
#pragma unroll
        for (int i = 0; i < kC; i++)
          if (i < n)
            store_elem<DT>(run.dst, e + i, acc[i], dp == kByte);
      }
    }
  }
}

/* The agreement: out[i] = the max over rows r of all[r n + i] (signed: the
 * all-zero marker -128 loses to every exponent, the non-finite 127 wins),
 * one thread per byte, grid-stride. */
__global__ void __launch_bounds__(kCta, kMinCtas)
    agree_kernel(const int8_t *all, size_t n, unsigned rows, int8_t *out) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int8_t m = all[i];
    for (unsigned r = 1; r < rows; r++) {
      const int8_t v = all[(size_t)r * n + i];
      m = v > m ? v : m;
    }
    out[i] = m;
  }
}

/* ---- launchers ----------------------------------------------------------- */

/* Threads per block: the smallest power of two >= the chunks of the
 * longest block, at most a CTA. */
unsigned group_for(size_t block, size_t maxc) {
  return group_size(min_sz(ceil_div(min_sz(block, maxc), kC), kCta), 1);
}

Opts opts_of(const zpp_isum_cuda_t *c, size_t maxc) {
  Opts o = {};
  o.block = c->block;
  o.G = group_for(c->block, maxc);
  o.bits = c->bits;
  o.sr = c->sr;
  o.res = c->res;
  o.reset = c->reset;
  o.beta = c->beta;
  o.omega = 1.0f - c->beta; /* host fp32 subtraction: the host's omega */
  return o;
}

size_t code_bytes(size_t count, size_t block, int bits) {
  const size_t full = count / block;
  return full * zpp_qm_payload_bytes(block, bits) +
         zpp_qm_payload_bytes(count - full * block, bits);
}

template <typename Run, typename K, typename Fill>
int run_table(const char *what, K kernel, const zpp_isum_cuda_t *c,
              const Opts &o, size_t nruns, Fill fill, cudaStream_t st,
              char *err, size_t errlen) {
  Table<Run> t = {};
  size_t total = 0;
  for (size_t i = 0; i <= nruns; i++) {
    if (t.n == kBatch || (i == nruns && t.n > 0)) {
      if (launch(what, kernel, cta_count(total, o.G), cta_threads(o.G), st, err,
                 errlen, t, o))
        return -1;
      t = Table<Run>{};
      total = 0;
    }
    if (i == nruns)
      break;
    size_t count = 0;
    if (!fill(i, t.r[t.n], count))
      continue;
    t.r[t.n].nb = ceil_div(count, c->block);
    t.first[t.n] = total;
    total += t.r[t.n].nb;
    t.first[++t.n] = total;
  }
  return 0;
}

template <typename R> size_t max_count(const R *runs, size_t nruns) {
  size_t m = 0;
  for (size_t i = 0; i < nruns; i++)
    m = runs[i].count > m ? runs[i].count : m;
  return m;
}

int bad_cfg(const zpp_isum_cuda_t *c, const char *what, char *err,
            size_t errlen) {
  if (c->bits != 4 && c->bits != 8) {
    snprintf(err, errlen, "%s: bits %d: must be 4 or 8", what, c->bits);
    return 1;
  }
  if (c->block == 0) {
    snprintf(err, errlen, "%s: block 0: must be >= 1", what);
    return 1;
  }
  if (c->dtype != ZPP_QM_F32 && c->dtype != ZPP_QM_F16 &&
      c->dtype != ZPP_QM_BF16) {
    snprintf(err, errlen, "%s: unknown dtype %d", what, c->dtype);
    return 1;
  }
  if (c->res != ZPP_QB_RES_NONE && c->res != ZPP_QB_RES_F32 &&
      c->res != ZPP_QB_RES_I8) {
    snprintf(err, errlen, "%s: residual kind %d: must be ZPP_QB_RES_*", what,
             c->res);
    return 1;
  }
  return 0;
}

template <int DT>
int absmax_dt(const zpp_isum_cuda_t *c, const zpp_isum_cuda_absmax_run_t *runs,
              size_t nruns, cudaStream_t st, char *err, size_t errlen) {
  const Opts o = opts_of(c, max_count(runs, nruns));
  return run_table<AbsRun>(
      "integer-sum absmax kernel", absmax_kernel<DT>, c, o, nruns,
      [&](size_t i, AbsRun &r, size_t &count) {
        r.src = runs[i].src;
        r.res = (const uint8_t *)runs[i].res;
        r.res_codes = runs[i].res_codes;
        r.amax = runs[i].amax;
        r.uexp = runs[i].uexp;
        r.count = count = runs[i].count;
        return count > 0;
      },
      st, err, errlen);
}

template <int DT, int BITS>
int encode_dt(const zpp_isum_cuda_t *c, const zpp_isum_cuda_encode_run_t *runs,
              size_t nruns, cudaStream_t st, char *err, size_t errlen) {
  const Opts o = opts_of(c, max_count(runs, nruns));
  return run_table<EncRun>(
      "integer-sum encode kernel", encode_kernel<DT, BITS>, c, o, nruns,
      [&](size_t i, EncRun &r, size_t &count) {
        r.src = runs[i].src;
        r.res = (uint8_t *)runs[i].res;
        r.res_codes = runs[i].res_codes;
        r.amax = runs[i].amax;
        r.uexp = runs[i].uexp;
        r.dst = runs[i].dst;
        r.count = count = runs[i].count;
        r.cb = code_bytes(count, c->block, BITS);
        r.base = runs[i].base;
        r.keys = c->sr ? zpp_qm_rng_keys(runs[i].seed) : zpp_qm_keys_t{0, 0};
        return count > 0;
      },
      st, err, errlen);
}

template <int BITS>
int requant_bits(const zpp_isum_cuda_t *c,
                 const zpp_isum_cuda_requant_run_t *runs, size_t nruns,
                 cudaStream_t st, char *err, size_t errlen) {
  const Opts o = opts_of(c, max_count(runs, nruns));
  return run_table<ReqRun>(
      "integer-sum requant kernel", requant_kernel<BITS>, c, o, nruns,
      [&](size_t i, ReqRun &r, size_t &count) {
        r.in = runs[i].in;
        r.uexp = runs[i].uexp;
        r.res = (uint8_t *)runs[i].res;
        r.res_codes = runs[i].res_codes;
        r.dst = runs[i].dst;
        r.count = count = runs[i].count;
        r.base = runs[i].base;
        r.keys = c->sr ? zpp_qm_rng_keys(runs[i].seed) : zpp_qm_keys_t{0, 0};
        return count > 0;
      },
      st, err, errlen);
}

/* The sum and the finish: tables of runs with their sources (Pub: the
 * public run, with count, first and n); a run whose sources do not fit
 * goes on in the next launch, from what the earlier one wrote (fill's
 * `cont`: not the run's first piece, `last`: its last).  With `whole`
 * (the finish) a run of at most kSrcs sources is never split, so only the
 * runs of more need scratch (zpp_isum_cuda_finish_run_t.part). */
template <typename Run, typename Pub, typename K, typename Fill>
int run_src_table(const char *what, K kernel, const zpp_isum_cuda_t *c,
                  const Opts &o, const Pub *runs, size_t nruns,
                  const uint8_t *const *srcs, bool whole, Fill fill,
                  cudaStream_t st, char *err, size_t errlen) {
  SrcTable<Run> t = {};
  size_t total = 0, nsrc = 0;
  auto flush = [&]() {
    int rc = t.n == 0 ? 0
                      : launch(what, kernel, cta_count(total, o.G),
                               cta_threads(o.G), st, err, errlen, t, o);
    t = SrcTable<Run>{};
    total = nsrc = 0;
    return rc;
  };
  for (size_t i = 0; i < nruns; i++) {
    if (runs[i].count == 0)
      continue;
    if (whole && runs[i].n <= kSrcs && nsrc + runs[i].n > kSrcs && flush())
      return -1;
    size_t done = 0;
    do {
      if ((t.n == kBatch || (nsrc == kSrcs && done < runs[i].n)) && flush())
        return -1;
      size_t take = runs[i].n - done;
      if (take > kSrcs - nsrc)
        take = kSrcs - nsrc;
      Run &r = t.r[t.n];
      fill(i, r, done > 0, done + take == runs[i].n);
      r.count = runs[i].count;
      r.nb = ceil_div(runs[i].count, c->block);
      r.first = (unsigned)nsrc;
      r.n = (unsigned)take;
      for (size_t k = 0; k < take; k++)
        t.src[nsrc + k] = srcs[runs[i].first + done + k];
      nsrc += take;
      done += take;
      t.first[t.n] = total;
      total += ceil_div(runs[i].count, c->block);
      t.first[++t.n] = total;
    } while (done < runs[i].n);
  }
  return flush();
}

template <int DT, int BITS>
int sum_dt(const zpp_isum_cuda_t *c, const zpp_isum_cuda_sum_run_t *runs,
           size_t nruns, const uint8_t *const *srcs, cudaStream_t st, char *err,
           size_t errlen) {
  const Opts o = opts_of(c, max_count(runs, nruns));
  return run_src_table<SumRun>(
      "integer-sum sum kernel", sum_kernel<DT, BITS>, c, o, runs, nruns, srcs,
      false,
      [&](size_t i, SumRun &r, bool cont, bool) {
        r.own = runs[i].own;
        r.res = (uint8_t *)runs[i].res;
        r.res_codes = runs[i].res_codes;
        r.uexp = runs[i].uexp;
        r.out = runs[i].out;
        r.cb = code_bytes(runs[i].count, c->block, BITS);
        r.cont = cont;
      },
      st, err, errlen);
}

template <int DT, int BITS>
int finish_dt(const zpp_isum_cuda_t *c, const zpp_isum_cuda_finish_run_t *runs,
              size_t nruns, const uint8_t *const *srcs, float div,
              cudaStream_t st, char *err, size_t errlen) {
  Opts o = opts_of(c, max_count(runs, nruns));
  o.div = div;
  return run_src_table<FinRun>(
      "integer-sum finish kernel", finish_kernel<DT, BITS>, c, o, runs, nruns,
      srcs, true,
      [&](size_t i, FinRun &r, bool cont, bool last) {
        r.own = runs[i].own;
        r.uexp = runs[i].uexp;
        r.dst = runs[i].dst;
        r.part = runs[i].part;
        r.cont = cont;
        r.last = last;
      },
      st, err, errlen);
}

/* f<DT, BITS>(args...) for the run-time dtype and width. */
#define ISUM_DISPATCH(f, c, ...)                                               \
  ((c)->dtype == ZPP_QM_F32 ? ((c)->bits == 8 ? f<ZPP_QM_F32, 8>(__VA_ARGS__)  \
                                              : f<ZPP_QM_F32, 4>(__VA_ARGS__)) \
   : (c)->dtype == ZPP_QM_F16                                                  \
       ? ((c)->bits == 8 ? f<ZPP_QM_F16, 8>(__VA_ARGS__)                       \
                         : f<ZPP_QM_F16, 4>(__VA_ARGS__))                      \
       : ((c)->bits == 8 ? f<ZPP_QM_BF16, 8>(__VA_ARGS__)                      \
                         : f<ZPP_QM_BF16, 4>(__VA_ARGS__)))

} // namespace

/* ---- isum_cuda.h ----------------------------------------------------------
 */

extern "C" int zpp_isum_cuda_absmax(const zpp_isum_cuda_t *c,
                                    const zpp_isum_cuda_absmax_run_t *runs,
                                    size_t nruns, void *stream, char *err,
                                    size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (bad_cfg(c, "integer-sum absmax", err, errlen))
    return -1;
  if (c->dtype == ZPP_QM_F32)
    return absmax_dt<ZPP_QM_F32>(c, runs, nruns, st, err, errlen);
  if (c->dtype == ZPP_QM_F16)
    return absmax_dt<ZPP_QM_F16>(c, runs, nruns, st, err, errlen);
  return absmax_dt<ZPP_QM_BF16>(c, runs, nruns, st, err, errlen);
}

extern "C" int zpp_isum_cuda_encode(const zpp_isum_cuda_t *c,
                                    const zpp_isum_cuda_encode_run_t *runs,
                                    size_t nruns, void *stream, char *err,
                                    size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (bad_cfg(c, "integer-sum encode", err, errlen))
    return -1;
  return ISUM_DISPATCH(encode_dt, c, c, runs, nruns, st, err, errlen);
}

extern "C" int zpp_isum_cuda_sum(const zpp_isum_cuda_t *c,
                                 const zpp_isum_cuda_sum_run_t *runs,
                                 size_t nruns, const uint8_t *const *srcs,
                                 void *stream, char *err, size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (bad_cfg(c, "integer-sum sum", err, errlen))
    return -1;
  return ISUM_DISPATCH(sum_dt, c, c, runs, nruns, srcs, st, err, errlen);
}

extern "C" int zpp_isum_cuda_requant(const zpp_isum_cuda_t *c,
                                     const zpp_isum_cuda_requant_run_t *runs,
                                     size_t nruns, void *stream, char *err,
                                     size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (bad_cfg(c, "integer-sum requant", err, errlen))
    return -1;
  return c->bits == 8 ? requant_bits<8>(c, runs, nruns, st, err, errlen)
                      : requant_bits<4>(c, runs, nruns, st, err, errlen);
}

extern "C" int zpp_isum_cuda_finish(const zpp_isum_cuda_t *c,
                                    const zpp_isum_cuda_finish_run_t *runs,
                                    size_t nruns, const uint8_t *const *srcs,
                                    float div, void *stream, char *err,
                                    size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (bad_cfg(c, "integer-sum finish", err, errlen))
    return -1;
  for (size_t i = 0; i < nruns; i++)
    if (runs[i].n > kSrcs && runs[i].part == NULL) {
      snprintf(err, errlen,
               "integer-sum finish: run %zu has %zu messages and part NULL: "
               "more than %u need scratch for the fp32 sums",
               i, runs[i].n, kSrcs);
      return -1;
    }
  return ISUM_DISPATCH(finish_dt, c, c, runs, nruns, srcs, div, st, err,
                       errlen);
}

extern "C" int zpp_isum_cuda_agree(const int8_t *all, size_t n, int rows,
                                   int8_t *out, void *stream, char *err,
                                   size_t errlen) {
  if (rows < 1) {
    snprintf(err, errlen, "integer-sum agreement: rows %d: must be >= 1", rows);
    return -1;
  }
  if (n == 0)
    return 0;
  return launch("integer-sum agreement kernel", agree_kernel,
                ceil_div(n, (size_t)kCta), kCta, (cudaStream_t)stream, err,
                errlen, all, n, (unsigned)rows, out);
}
