/*
 * Batched launches of the CUDA block codec (quant_cuda.h): a table of runs
 * (source, destination, length, residual, stochastic-rounding stream) in
 * one launch, so that a collective that encodes or sums one slice per
 * peer makes the same number of launches at any number of ranks.
 *
 * The table travels in the kernel's parameters (at most 48 runs, under 4
 * KiB: no copy of it to the device, nothing to free, capturable into a
 * graph); a launch's work items are the blocks of all its runs, run e's
 * from first[e] on, found by a binary search.  Each item is one block for
 * a group of G threads, with the decomposition, access paths and block
 * reduction of quant_cuda.cu (quant_cuda.cuh): blocks of up to 8192
 * elements in registers in one segment, longer ones by one CTA looping
 * over segments (the split path of quant_cuda.cu, several CTAs per block,
 * is not used: a batch has many blocks).
 *
 * The encode fuses what the collectives ran as separate kernels around
 * it, with the same per-element operations in the same order (quant_math.h),
 * so the bits are those of the separate kernels:
 *   - the Hadamard rotation (transform_cuda.cu): the group's segment goes
 *     through shared memory, one __syncthreads() per butterfly stage; a
 *     group's span of shared memory (G * 16 elements) holds whole
 *     rotation groups, as the rotation divides the block and is at most
 *     8192 (ZPP_QB_MAX_ROTATION) when blocks are longer;
 *   - error feedback: the residual is added as the block is loaded, and
 *     the new error is computed from each element's code as it is
 *     written; an INT8 residual takes a second block reduction (of the
 *     new errors) before its codes are written.  Blocks longer than one
 *     segment load each segment again for every pass (the source, the
 *     rotation and the old residual give the same values each time; the
 *     old INT8 residual is overwritten only in the last pass, segment by
 *     segment, by the threads that read it).
 *
 * The decode-sum adds any number of encoded (or raw) sources to each
 * output chunk in registers, in table order: init, then the sources one
 * after the other, as the decode-accumulates it replaces.
 */
/* Device code: quant_math.h checks its accesses under the emulator. */
#define ZPP_QM_DEVICE_CODE 1

#include "quant_cuda.cuh"

namespace {

constexpr unsigned kEncBatch = 48;          /* runs per encode launch */
constexpr unsigned kSumBatch = 48;          /* outputs per sum launch */
constexpr unsigned kSumSrcs = 192;          /* sources per sum launch */
constexpr unsigned kRot = kMaxGroup * kEpt; /* 8192 floats of rotation */
static_assert(kRot == ZPP_QB_MAX_ROTATION, "one CTA's segment");

/* The first run whose items reach past w (t.first[lo] <= w). */
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

/* ---- encode -------------------------------------------------------------- */

struct EncRun {
  const void *src;
  uint8_t *dst;
  void *res;
  uint8_t *res_codes;
  size_t count;
  uint64_t base;
  zpp_qm_keys_t keys;
};

struct EncTable {
  unsigned n;
  size_t first[kEncBatch + 1]; /* blocks of the runs before run e */
  EncRun r[kEncBatch];
};

struct EncOpts {
  size_t block;
  unsigned G;     /* threads per block */
  unsigned gbits; /* log2(G * kEpt): a group's span of s_rot */
  int sr;
  int res; /* ZPP_QB_RES_* */
  int reset;
  float beta, omega;
  unsigned hk; /* rotation group 2^hk; 0: none */
  float hc;    /* zpp_qm_hadamard_scale(2^hk) */
};

static_assert(sizeof(EncTable) + sizeof(EncOpts) <= 4000,
              "the kernel parameters stay within 4 KiB");

/* One block's residual. */
struct ResView {
  float *f;       /* F32: the run's residual, at any byte */
  bool f_al;      /* F32: f is 4-byte aligned */
  uint8_t *meta;  /* I8: the run's block scales */
  uint8_t *codes; /* I8: the run's codes */
  float scale;    /* I8: this block's old scale */
};

/* The residual's value at element idx of the run (before this call). */
__device__ __forceinline__ float old_res(const EncOpts &o, const ResView &rv,
                                         size_t idx) {
  if (o.reset)
    return 0.0f;
  if (o.res == ZPP_QB_RES_F32)
    return load_elem_dt(rv.f, idx, ZPP_QM_F32, rv.f_al);
  return zpp_qm_dequantize(zpp_qm_code_value(rv.codes[idx], 8, 0), rv.scale,
                           0.0f);
}

/* Rotates the whole rotation groups of segment s of each group's block in
 * place (x: the loaded elements).  Called by every thread of the CTA. */
template <int C, int R>
__device__ __forceinline__ void
rotate_segment(const EncOpts &o, size_t len, size_t s, unsigned t, size_t gic,
               float *s_rot, unsigned *s_lim, float (&x)[R][C]) {
  const unsigned G = o.G, span = 1u << o.gbits;
  float *mine = s_rot + gic * span;
  size_t whole = (len >> o.hk) << o.hk, s0 = s * span;
  const unsigned lim = whole > s0 ? (unsigned)min_sz(whole - s0, span) : 0u;
#pragma unroll
  for (int k = 0; k < R; k++)
#pragma unroll
    for (int i = 0; i < C; i++) {
      unsigned pos = (k * G + t) * C + i;
      if (pos < lim)
        mine[pos] = x[k][i];
    }
  if (t == 0)
    s_lim[gic] = lim;
  __syncthreads();
  const unsigned groups = blockDim.x / G, npairs = blockDim.x * (kEpt / 2);
  for (unsigned lh = 0; lh < o.hk; lh++) { /* stages h = 1, 2, 4, ... */
    const unsigned h = 1u << lh;
    for (unsigned p = threadIdx.x; p < npairs; p += blockDim.x) {
      unsigned j = ((p >> lh) << (lh + 1)) | (p & (h - 1));
      unsigned grp = j >> o.gbits;
      /* lim is a multiple of the rotation group: j below it means its
       * whole rotation group is */
      if (grp < groups && (j & (span - 1)) < s_lim[grp]) {
        float a = s_rot[j], b = s_rot[j + h];
        s_rot[j] = zpp_qm_add(a, b);
        s_rot[j + h] = zpp_qm_add(a, -b);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < R; k++)
#pragma unroll
    for (int i = 0; i < C; i++) {
      unsigned pos = (k * G + t) * C + i;
      if (pos < lim)
        x[k][i] = mine[pos] * o.hc;
    }
  __syncthreads(); /* s_rot and s_lim are refilled next */
}

/* Segment s of a block into x: the source, rotated, plus the residual. */
template <int DT, int BITS>
__device__ __forceinline__ void
load_x(const EncArgs &a, const EncOpts &o, const ResView &rv, size_t off,
       size_t len, size_t s, unsigned t, size_t gic, float *s_rot,
       unsigned *s_lim,
       float (&x)[EncChunk<DT, BITS>::R][EncChunk<DT, BITS>::C]) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  load_segment<DT, BITS>(a, off, len, s, t, x);
  if (o.hk)
    rotate_segment<C, R>(o, len, s, t, gic, s_rot, s_lim, x);
  if (o.res == ZPP_QB_RES_NONE)
    return;
#pragma unroll
  for (int k = 0; k < R; k++) {
    size_t j = (s * R + k) * a.G + t;
    int n = chunk_elems<C>(len, j);
#pragma unroll
    for (int i = 0; i < C; i++)
      if (i < n)
        x[k][i] = zpp_qm_add(x[k][i], old_res(o, rv, off + j * C + i));
  }
}

/* Codes of segment s (written when `write`), and with a residual each
 * element's new error: F32 stored (when `write`), I8 left in x and
 * reduced into re. */
template <int DT, int BITS, bool ASYM>
__device__ __forceinline__ void
quantize_ef(const EncArgs &a, const EncOpts &o, const ResView &rv, uint8_t *pay,
            size_t off, size_t len, size_t s, unsigned t,
            float (&x)[EncChunk<DT, BITS>::R][EncChunk<DT, BITS>::C],
            const zpp_qm_params_t &p, Red &re, bool write) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  constexpr int W = EncChunk<DT, BITS>::W;
#pragma unroll
  for (int k = 0; k < R; k++) {
    size_t j = (s * R + k) * a.G + t;
    int n = chunk_elems<C>(len, j);
    if (n == 0)
      continue;
    uint32_t word[W];
#pragma unroll
    for (int w = 0; w < W; w++)
      word[w] = 0;
#pragma unroll
    for (int i = 0; i < C; i++) {
      if (i >= n)
        continue;
      size_t idx = off + j * C + i;
      uint32_t code = zpp_qm_code_bits(
          a.sr ? zpp_qm_quantize_sr(x[k][i], &p,
                                    zpp_qm_rand24(a.keys, a.base + idx))
               : zpp_qm_quantize(x[k][i], &p));
      if (BITS == 4)
        code &= 0xfu;
      word[i * BITS / 32] |= code << (i * BITS % 32);
      if (o.res == ZPP_QB_RES_NONE)
        continue;
      /* the decode of the code just made: the stored scale and zero */
      float dec = zpp_qm_dequantize(zpp_qm_code_value(code, BITS, ASYM),
                                    p.scale, p.zero);
      float e;
      if (o.beta == 0.0f) {
        e = __fsub_rn(x[k][i], dec);
        if ((zpp_qm_f32_bits(e) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK)
          e = 0.0f;
      } else {
        e = zpp_qm_ema_residual(old_res(o, rv, idx), x[k][i], dec, o.beta,
                                o.omega);
      }
      if (o.res == ZPP_QB_RES_F32) {
        if (write)
          store_f32_elem(rv.f, idx, e, rv.f_al);
      } else {
        x[k][i] = e;
        red_add<false>(re, e);
      }
    }
    if (!write)
      continue;
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

/* The INT8 codes of the new errors of segment s (in x). */
template <int C, int R>
__device__ __forceinline__ void
store_res_codes(const ResView &rv, size_t off, size_t len, size_t s, unsigned G,
                unsigned t, const float (&x)[R][C], const zpp_qm_params_t &pe) {
#pragma unroll
  for (int k = 0; k < R; k++) {
    size_t j = (s * R + k) * G + t;
    int n = chunk_elems<C>(len, j);
#pragma unroll
    for (int i = 0; i < C; i++)
      if (i < n)
        rv.codes[off + j * C + i] =
            zpp_qm_code_bits(zpp_qm_quantize(x[k][i], &pe));
  }
}

__device__ __forceinline__ void store_f32(uint8_t *p, float v) {
  if (((uintptr_t)p & 3u) == 0)
    *reinterpret_cast<float *>(p) = v;
  else
    st_bytes(p, zpp_qm_f32_bits(v), 4);
}

__device__ __forceinline__ float load_f32(const uint8_t *p) {
  if (((uintptr_t)p & 3u) == 0)
    return *reinterpret_cast<const float *>(p);
  return zpp_qm_bits_f32(ld_bytes(p, 4));
}

template <int DT, int BITS, bool ASYM>
__global__ void __launch_bounds__(kMaxGroup)
    encode_batch_kernel(const EncTable tab, const EncOpts o) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  constexpr size_t es = elem_size(DT);
  __shared__ uint32_t s_red[2][kMaxGroup / 32];
  __shared__ float s_rot[kRot];
  __shared__ unsigned s_lim[kCta];
  const unsigned G = o.G;
  const unsigned t = threadIdx.x & (G - 1);
  const size_t gic = threadIdx.x / G, gpc = blockDim.x / G;
  const size_t mb = zpp_qm_meta_bytes(ASYM);
  const size_t pb = zpp_qm_payload_bytes(o.block, BITS);
  const size_t seg_chunks = (size_t)G * R;
  const size_t total = tab.first[tab.n];

  /* The loop bound is the same for the whole CTA: groups past the end
   * take part in the reductions and rotations with nothing to do. */
  for (size_t base = blockIdx.x * gpc; base < total;
       base += (size_t)gridDim.x * gpc) {
    const size_t w = base + gic;
    EncArgs a = {};
    ResView rv = {};
    size_t b = 0, len = 0, nseg = 0;
    a.G = G;
    a.block = o.block;
    a.sr = o.sr;
    if (w < total) {
      const unsigned e = find_run(tab, w);
      b = w - tab.first[e];
      a.src = tab.r[e].src;
      a.dst = tab.r[e].dst;
      a.count = tab.r[e].count;
      a.base = tab.r[e].base;
      a.keys = tab.r[e].keys;
      a.nb = ceil_div(a.count, o.block);
      const bool chunk_aligned = a.nb == 1 || o.block % C == 0;
      const uintptr_t sp = (uintptr_t)a.src, dp = (uintptr_t)a.dst;
      a.src_access = chunk_aligned && sp % min_sz(16, C * es) == 0 ? kAccessVec
                     : sp % es == 0                                ? kAccessElem
                                    : kAccessByte;
      a.meta_aligned = dp % 4 == 0;
      a.pay_vec = chunk_aligned && a.meta_aligned;
      len = min_sz(o.block, a.count - b * o.block);
      nseg = ceil_div(ceil_div(len, C), seg_chunks);
      rv.f = (float *)tab.r[e].res;
      rv.f_al = (uintptr_t)tab.r[e].res % 4 == 0;
      rv.meta = (uint8_t *)tab.r[e].res;
      rv.codes = tab.r[e].res_codes;
      if (o.res == ZPP_QB_RES_I8 && !o.reset)
        rv.scale = load_f32(rv.meta + 4 * b);
    }
    /* one group a CTA loops over its block's segments; several groups
     * a CTA hold blocks of one segment (nseg 0 past the end) */
    const size_t nloop = gpc == 1 ? nseg : 1;
    const size_t off = b * o.block;
    uint8_t *meta = a.dst + b * mb;
    uint8_t *pay = a.dst + a.nb * mb + b * pb;
    float x[R][C];

    Red r = red_init<ASYM>();
    for (size_t s = 0; s < nloop; s++) {
      load_x<DT, BITS>(a, o, rv, off, len, s, t, gic, s_rot, s_lim, x);
      reduce_segment<DT, BITS, ASYM>(a, len, s, t, x, r);
    }
    r = group_reduce<ASYM>(r, G, s_red);
    const zpp_qm_params_t p = red_params<BITS, ASYM>(r);
    if (t == 0 && len > 0) {
      store_f32(meta, p.scale);
      if (ASYM)
        store_f32(meta + 4, p.zero);
    }
    Red re = red_init<false>();
    for (size_t s = 0; s < nloop; s++) {
      if (nloop > 1)
        load_x<DT, BITS>(a, o, rv, off, len, s, t, gic, s_rot, s_lim, x);
      quantize_ef<DT, BITS, ASYM>(a, o, rv, pay, off, len, s, t, x, p, re,
                                  true);
    }
    if (o.res != ZPP_QB_RES_I8)
      continue;
    /* the new errors' INT8 block: reduce, then (again for each segment of
     * a long block) quantize */
    re = group_reduce<false>(re, G, s_red);
    const zpp_qm_params_t pe = red_params<8, false>(re);
    for (size_t s = 0; s < nloop; s++) {
      if (nloop > 1) {
        load_x<DT, BITS>(a, o, rv, off, len, s, t, gic, s_rot, s_lim, x);
        quantize_ef<DT, BITS, ASYM>(a, o, rv, pay, off, len, s, t, x, p, re,
                                    false);
      }
      store_res_codes<C, R>(rv, off, len, s, G, t, x, pe);
    }
    if (t == 0 && len > 0) /* every thread of the group read the old one */
      store_f32(rv.meta + 4 * b, pe.scale);
  }
}

/* ---- decode-sum ---------------------------------------------------------- */

struct SumRun {
  float *out;
  const void *init;
  size_t count;
  unsigned first, n; /* sources src[first, first + n) */
};

struct SumTable {
  unsigned n;
  size_t first[kSumBatch + 1]; /* work items of the runs before run e */
  SumRun r[kSumBatch];
  const void *src[kSumSrcs];
};

struct SumOpts {
  size_t block; /* of the sources; raw: a work item's span */
  size_t spb;   /* segments per block */
  unsigned G;
  int init_dtype, src_dtype;
};

static_assert(sizeof(SumTable) + sizeof(SumOpts) <= 4000,
              "the kernel parameters stay within 4 KiB");

/* Elements [e, e + n) of a buffer of run-time dtype dt that may start at
 * any byte (init: the caller's send buffer, qgZ's own slice; a raw
 * source), into x[0, n): plain accesses (zpp_qm_load) when the buffer is
 * aligned to its element, else byte by byte.  The path is chosen once for
 * the chunk, outside the unrolled loops (one per path: an access chosen per
 * element makes ptxas spill for sm_80). */
template <int C>
__device__ __forceinline__ void load_raw(const void *p, size_t e, int n, int dt,
                                         float (&x)[C]) {
  const int es = elem_size(dt);
  if ((uintptr_t)p % es == 0) {
#pragma unroll
    for (int i = 0; i < C; i++)
      if (i < n)
        x[i] = zpp_qm_load(p, e + i, dt);
    return;
  }
  const uint8_t *q = (const uint8_t *)p + e * es;
#pragma unroll
  for (int i = 0; i < C; i++)
    if (i < n) {
      uint32_t h = ld_bytes(q + i * es, es);
      x[i] = dt == ZPP_QM_F32 ? zpp_qm_bits_f32(h) : half_bits_to_f32(dt, h);
    }
}

/* BITS 0: the sources are raw elements of o.src_dtype. */
template <int BITS, bool ASYM>
__global__ void __launch_bounds__(kMaxGroup)
    sum_batch_kernel(const SumTable tab, const SumOpts o) {
  using K = Chunk<BITS == 0 ? 4 : BITS, 4>;
  constexpr int C = K::C, R = K::R, W = K::W;
  const unsigned G = o.G;
  const unsigned t = threadIdx.x & (G - 1);
  const size_t gic = threadIdx.x / G, gpc = blockDim.x / G;
  const size_t mb = zpp_qm_meta_bytes(ASYM);
  const size_t pb = BITS ? zpp_qm_payload_bytes(o.block, BITS) : 0;
  const size_t total = tab.first[tab.n];

  for (size_t w = blockIdx.x * gpc + gic; w < total;
       w += (size_t)gridDim.x * gpc) {
    const unsigned e = find_run(tab, w);
    const size_t item = w - tab.first[e];
    size_t b = item, seg = 0;
    if (o.spb > 1) {
      b = div_sz(item, o.spb);
      seg = item - b * o.spb;
    }
    float *out = tab.r[e].out;
    const void *init = tab.r[e].init;
    const size_t count = tab.r[e].count;
    const unsigned s0 = tab.r[e].first, s1 = s0 + tab.r[e].n;
    const size_t off = b * o.block, len = min_sz(o.block, count - off);
    const size_t nb = ceil_div(count, o.block);
    const bool chunk_aligned = nb == 1 || o.block % C == 0;
    const bool out_vec = chunk_aligned && (uintptr_t)out % 16 == 0;
#pragma unroll
    for (int k = 0; k < R; k++) {
      size_t j = (seg * R + k) * G + t;
      int n = chunk_elems<C>(len, j);
      if (n == 0)
        continue;
      const size_t e0 = off + j * C;
      float v[C];
      if (init != nullptr) {
        load_raw<C>(init, e0, n, o.init_dtype, v);
      } else if (n == C && out_vec) {
        load_chunk<ZPP_QM_F32, C>(out, e0, v);
      } else {
#pragma unroll
        for (int i = 0; i < C; i++)
          if (i < n)
            v[i] = out[e0 + i];
      }
      for (unsigned sj = s0; sj < s1; sj++) {
        const uint8_t *src = (const uint8_t *)tab.src[sj];
        if constexpr (BITS == 0) { /* fp32(src) + sum: the add-residual */
          float x[C];
          load_raw<C>(src, e0, n, o.src_dtype, x);
#pragma unroll
          for (int i = 0; i < C; i++)
            if (i < n)
              v[i] = zpp_qm_add(x[i], v[i]);
          continue;
        }
        const uint8_t *meta = src + b * mb;
        const uint8_t *q = src + nb * mb + b * pb + 4 * W * j;
        const bool meta_aligned = (uintptr_t)src % 4 == 0;
        float scale, zero;
        load_meta<ASYM>(meta, meta_aligned, scale, zero);
        uint32_t word[W];
        if (n == C && chunk_aligned && meta_aligned) {
#pragma unroll
          for (int w2 = 0; w2 < W; w2++)
            word[w2] = reinterpret_cast<const uint32_t *>(q)[w2];
        } else {
          ld_words<W>(q, word, BITS == 8 ? n : (n + 1) / 2);
        }
#pragma unroll
        for (int i = 0; i < C; i++) {
          if (i >= n)
            continue;
          uint32_t stored =
              (word[i * BITS / 32] >> (i * BITS % 32)) & ((1u << BITS) - 1u);
          v[i] = zpp_qm_add(
              v[i], zpp_qm_dequantize(zpp_qm_code_value(stored, BITS, ASYM),
                                      scale, zero));
        }
      }
      if (n == C && out_vec) {
        store_chunk<ZPP_QM_F32, C>(out, e0, v);
      } else {
#pragma unroll
        for (int i = 0; i < C; i++)
          if (i < n)
            out[e0 + i] = v[i];
      }
    }
  }
}

/* ---- launchers ----------------------------------------------------------- */

unsigned log2_of(size_t v) { /* v a power of two */
  unsigned k = 0;
  while (((size_t)1 << k) < v)
    k++;
  return k;
}

template <int DT, int BITS, bool ASYM>
int encode_batch_run(const zpp_qb_enc_t *b, const zpp_qb_enc_run_t *runs,
                     size_t nruns, cudaStream_t st, char *err, size_t errlen) {
  constexpr int C = EncChunk<DT, BITS>::C, R = EncChunk<DT, BITS>::R;
  size_t maxc = 0;
  for (size_t i = 0; i < nruns; i++)
    maxc = runs[i].count > maxc ? runs[i].count : maxc;
  if (maxc == 0)
    return 0;
  EncOpts o = {};
  o.block = b->q.block;
  const size_t nc = ceil_div(min_sz(o.block, maxc), C);
  o.G = nc <= kMaxGroup * R ? group_size(nc, R) : kMaxGroup;
  o.gbits = log2_of((size_t)o.G * kEpt);
  o.sr = b->q.sr;
  o.res = b->res;
  o.reset = b->reset;
  o.beta = b->beta;
  o.omega = 1.0f - b->beta; /* host fp32 subtraction: the host's omega */
  if (b->hadamard >= 2) {
    o.hk = log2_of(b->hadamard);
    o.hc = zpp_qm_hadamard_scale(b->hadamard);
  }
  EncTable t = {};
  size_t total = 0;
  for (size_t i = 0; i <= nruns; i++) {
    if (t.n == kEncBatch || (i == nruns && t.n > 0)) {
      if (launch("batched encode kernel", encode_batch_kernel<DT, BITS, ASYM>,
                 cta_count(total, o.G), cta_threads(o.G), st, err, errlen, t,
                 o))
        return -1;
      t = EncTable{};
      total = 0;
    }
    if (i == nruns || runs[i].count == 0)
      continue;
    EncRun &r = t.r[t.n];
    r.src = runs[i].src;
    r.dst = runs[i].dst;
    r.res = runs[i].res;
    r.res_codes = runs[i].res_codes;
    r.count = runs[i].count;
    r.base = runs[i].base;
    if (o.sr)
      r.keys = zpp_qm_rng_keys(runs[i].seed);
    t.first[t.n] = total;
    total += ceil_div(runs[i].count, o.block);
    t.first[++t.n] = total;
  }
  return 0;
}

template <int DT>
int encode_batch_dt(const zpp_qb_enc_t *b, const zpp_qb_enc_run_t *runs,
                    size_t nruns, cudaStream_t st, char *err, size_t errlen) {
  if (b->q.bits == 8)
    return b->q.asym
               ? encode_batch_run<DT, 8, true>(b, runs, nruns, st, err, errlen)
               : encode_batch_run<DT, 8, false>(b, runs, nruns, st, err,
                                                errlen);
  return b->q.asym
             ? encode_batch_run<DT, 4, true>(b, runs, nruns, st, err, errlen)
             : encode_batch_run<DT, 4, false>(b, runs, nruns, st, err, errlen);
}

template <int BITS, bool ASYM>
int sum_batch_run(const zpp_qcfg_t *q, int src_dtype, int init_dtype,
                  const zpp_qb_sum_run_t *runs, size_t nruns,
                  const void *const *srcs, cudaStream_t st, char *err,
                  size_t errlen) {
  constexpr int C = Chunk < BITS == 0 ? 4 : BITS, 4 > ::C;
  constexpr int R = Chunk < BITS == 0 ? 4 : BITS, 4 > ::R;
  size_t maxc = 0;
  for (size_t i = 0; i < nruns; i++)
    maxc = runs[i].count > maxc ? runs[i].count : maxc;
  if (maxc == 0)
    return 0;
  SumOpts o = {};
  o.init_dtype = init_dtype;
  o.src_dtype = src_dtype;
  if (BITS == 0) { /* raw: items of one full segment */
    o.G = kMaxGroup;
    o.block = (size_t)kMaxGroup * R * C;
    o.spb = 1;
  } else {
    o.block = q->block;
    const size_t nc = ceil_div(min_sz(o.block, maxc), C);
    if (nc <= kMaxGroup * R) {
      o.G = group_size(nc, R);
      o.spb = 1;
    } else {
      o.G = kMaxGroup;
      o.spb = ceil_div(nc, (size_t)kMaxGroup * R);
    }
  }
  SumTable t = {};
  size_t total = 0, nsrc = 0;
  auto flush = [&]() {
    int rc = t.n == 0
                 ? 0
                 : launch("batched decode-sum kernel",
                          sum_batch_kernel<BITS, ASYM>, cta_count(total, o.G),
                          cta_threads(o.G), st, err, errlen, t, o);
    t = SumTable{};
    total = nsrc = 0;
    return rc;
  };
  for (size_t i = 0; i < nruns; i++) {
    if (runs[i].count == 0)
      continue;
    const void *init = runs[i].init;
    size_t done = 0;
    do { /* a run whose sources do not fit goes on in the next launch,
          * accumulating onto what the earlier one wrote */
      if ((t.n == kSumBatch || (nsrc == kSumSrcs && done < runs[i].n)) &&
          flush())
        return -1;
      size_t take = runs[i].n - done;
      if (take > kSumSrcs - nsrc)
        take = kSumSrcs - nsrc;
      SumRun &r = t.r[t.n];
      r.out = runs[i].out;
      r.init = init;
      r.count = runs[i].count;
      r.first = (unsigned)nsrc;
      r.n = (unsigned)take;
      for (size_t k = 0; k < take; k++)
        t.src[nsrc + k] = srcs[runs[i].first + done + k];
      nsrc += take;
      done += take;
      init = nullptr;
      t.first[t.n] = total;
      total += ceil_div(runs[i].count, o.block) * o.spb;
      t.first[++t.n] = total;
    } while (done < runs[i].n);
  }
  return flush();
}

} // namespace

/* ---- quant_cuda.h -------------------------------------------------------- */

extern "C" int zpp_quant_cuda_encode_batch_fits(size_t block, size_t hadamard) {
  if (hadamard < 2)
    return 1;
  if ((hadamard & (hadamard - 1)) != 0 || block % hadamard != 0)
    return 0;
  return block <= (size_t)kRot || hadamard <= (size_t)kRot;
}

extern "C" int zpp_quant_cuda_encode_batch(const zpp_qb_enc_t *b,
                                           const zpp_qb_enc_run_t *runs,
                                           size_t nruns, void *stream,
                                           char *err, size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (!zpp_quant_cuda_encode_batch_fits(b->q.block, b->hadamard)) {
    snprintf(err, errlen,
             "batched encode: Hadamard group %zu with block %zu: the group "
             "must divide the block and be at most %u for blocks above that",
             b->hadamard, b->q.block, kRot);
    return -1;
  }
  switch (b->dtype) {
  case ZPP_QM_F32:
    return encode_batch_dt<ZPP_QM_F32>(b, runs, nruns, st, err, errlen);
  case ZPP_QM_F16:
    return encode_batch_dt<ZPP_QM_F16>(b, runs, nruns, st, err, errlen);
  case ZPP_QM_BF16:
    return encode_batch_dt<ZPP_QM_BF16>(b, runs, nruns, st, err, errlen);
  default:
    snprintf(err, errlen, "batched encode: unknown dtype %d", b->dtype);
    return -1;
  }
}

extern "C" int zpp_quant_cuda_sum_batch(const zpp_qcfg_t *q, int src_dtype,
                                        int init_dtype,
                                        const zpp_qb_sum_run_t *runs,
                                        size_t nruns, const void *const *srcs,
                                        void *stream, char *err,
                                        size_t errlen) {
  cudaStream_t st = (cudaStream_t)stream;
  if (q == nullptr)
    return sum_batch_run<0, false>(q, src_dtype, init_dtype, runs, nruns, srcs,
                                   st, err, errlen);
  if (q->bits == 8)
    return q->asym ? sum_batch_run<8, true>(q, src_dtype, init_dtype, runs,
                                            nruns, srcs, st, err, errlen)
                   : sum_batch_run<8, false>(q, src_dtype, init_dtype, runs,
                                             nruns, srcs, st, err, errlen);
  return q->asym ? sum_batch_run<4, true>(q, src_dtype, init_dtype, runs, nruns,
                                          srcs, st, err, errlen)
                 : sum_batch_run<4, false>(q, src_dtype, init_dtype, runs,
                                           nruns, srcs, st, err, errlen);
}
