/*
 * CPU block codecs: the scalar reference and the SIMD paths, behind one
 * table chosen at run time.  Every path writes bitwise identical output
 * (docs/format.md); the SIMD paths fall back to the shared scalar math of
 * quant_math.h for tails and short blocks.
 *
 * Internal header: not installed.  Inputs are validated by src/quant/quant.c
 * before they reach these functions.
 */
#ifndef ZPP_KERNELS_QUANT_CPU_H
#define ZPP_KERNELS_QUANT_CPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Output kinds of a decode: a dtype (ZPP_QM_F32/F16/BF16) or
 * accumulation into fp32. */
#define ZPP_QM_OUT_ACC 3

/* A validated quantization config. */
typedef struct {
  int bits;     /* 8 or 4 */
  int asym;     /* 0 symmetric, 1 asymmetric */
  size_t block; /* elements per block, >= 1 */
  /* Stochastic rounding (docs/format.md): 0 off.  Element i of the call
   * draws zpp_qm_rand24({k0, k1}, base + i). */
  int sr;
  uint32_t k0, k1;
  uint64_t base;
} zpp_qcfg_t;

typedef void (*zpp_quant_encode_fn)(const zpp_qcfg_t *cfg, int dtype,
                                    const void *src, size_t count,
                                    uint8_t *dst);
/* out_kind: ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16 or ZPP_QM_OUT_ACC (dst is
 * then a float accumulator). */
typedef void (*zpp_quant_decode_fn)(const zpp_qcfg_t *cfg, const uint8_t *src,
                                    size_t count, int out_kind, void *dst);

/* ---- compressed-domain sums (qgZ sum INT; docs/format.md, "Integer
 * sums").  cfg: symmetric, `bits` the width of the codes, `block` the
 * block; a call covers `count` elements from the start of a block; uexp
 * holds the agreed exponent byte of each of its blocks (zpp_qm_unit_exp,
 * the max over the stage's ranks). */

/* amax[b] = the largest |fl(x + res)| of block b as fp32 bits (an integer
 * max: NaN and Inf above every finite value); res NULL: |x|. */
typedef void (*zpp_isum_absmax_fn)(const zpp_qcfg_t *cfg, int dtype,
                                   const void *src, const float *res,
                                   size_t count, uint32_t *amax);
/* The stage-1 message of fl(x + res): per block the multiplier
 * m = zpp_qm_unit_mult(amax[b], bits, uexp[b]) and the codes
 * zpp_qm_quantize (or _sr: element i draws at cfg->base + i) with
 * zpp_qm_unit_params(uexp[b], m); packed codes first (INT8: a byte; INT4:
 * two per byte, the even element in the low nibble; every block from a
 * byte boundary), then one multiplier byte per block.  res non-NULL: error
 * feedback, res = fl(x + res) - q m 2^E (beta 0: zpp_qm_ef_residual; else
 * zpp_qm_ema_residual).  amax: this rank's own absmax bits (the same
 * absmax kernel's output).  Bytes: zpp_isum_msg_bytes. */
typedef void (*zpp_isum_encode_fn)(const zpp_qcfg_t *cfg, int dtype,
                                   const void *src, float *res, float beta,
                                   const uint32_t *amax, const int8_t *uexp,
                                   size_t count, uint8_t *dst);
/* out = zpp_qm_unit_own(x, E) + the sum over the n messages of m q, in
 * int32 units of 2^E, with x = fl(own + res) (own NULL: no own share).
 * res non-NULL: the own slice's error feedback, as the encode's with
 * q the share and step 2^E: res = zpp_qm_feedback(res, x, share,
 * zpp_qm_unit_value(E), beta, fl(1 - beta)). */
typedef void (*zpp_isum_sum_fn)(const zpp_qcfg_t *cfg, int dtype,
                                const void *own, float *res, float beta,
                                const int8_t *uexp, const uint8_t *const *srcs,
                                int n, size_t count, int32_t *out);
/* Re-quantization of integer sums `in` (units 2^E, |in| <=
 * ZPP_QM_ISUM_MAX) to cfg2's width, in the format of docs/format.md (fp32
 * scale per block, then the codes): with error feedback (res non-NULL)
 * j = in + zpp_qm_unit_res(res, E), else j = in; per block
 * d = zpp_qm_idivisor(max |j|, qmax2), codes zpp_qm_quantize((float)j)
 * (or _sr) with p = zpp_qm_irequant_params(d, E), scale p.scale;
 * res = fl(fl(in 2^E) + res) - decoded.  uexp: the stage-1 exponents. */
typedef void (*zpp_isum_requant_fn)(const zpp_qcfg_t *cfg2, const int32_t *in,
                                    const int8_t *uexp, float *res, float beta,
                                    size_t count, uint8_t *dst);
/* The finish: acc = fl((float)own * zpp_qm_unit_value(E)), plus each of
 * the n messages (cfg2's format) decoded, in order, then fl(acc / div),
 * stored as dtype. */
typedef void (*zpp_isum_finish_fn)(const zpp_qcfg_t *cfg2, const int32_t *own,
                                   const int8_t *uexp,
                                   const uint8_t *const *srcs, int n,
                                   size_t count, float div, int dtype,
                                   void *dst);

/* The fused host steps: `sum` then `requant` (a partial sum another node
 * keeps), or `sum` then `finish` (the one this node keeps), tile by tile,
 * so that the int32 sums stay in the cache instead of going through
 * memory (cfg: stage 1, cfg2: stage 2, the same block).  Output,
 * residuals included, bitwise equal to the two calls.  res1: the own
 * slice's stage-1 residual (the sum's res), res: stage 2's (the
 * requant's); tmp: scratch of zpp_isum_tile(cfg, count) int32. */
typedef void (*zpp_isum_sum_requant_fn)(
    const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2, int dtype, const void *own,
    float *res1, const int8_t *uexp, const uint8_t *const *srcs, int n,
    float *res, float beta, size_t count, int32_t *tmp, uint8_t *dst);
/* srcs: the n stage-1 messages; srcs2: the n2 stage-2 messages. */
typedef void (*zpp_isum_sum_finish_fn)(
    const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2, int dtype, const void *own,
    float *res1, float beta, const int8_t *uexp, const uint8_t *const *srcs,
    int n, const uint8_t *const *srcs2, int n2, size_t count, float div,
    int32_t *tmp, void *dst);

typedef struct {
  zpp_isum_absmax_fn absmax;
  zpp_isum_encode_fn encode;
  zpp_isum_sum_fn sum;
  zpp_isum_requant_fn requant;
  zpp_isum_finish_fn finish;
  zpp_isum_sum_requant_fn sum_requant;
  zpp_isum_sum_finish_fn sum_finish;
} zpp_isum_ops_t;

/* Elements of a fused step's tile: whole blocks, about ZPP_ISUM_TILE
 * (8 KiB of int32: the tile's sums are written and read back in L1),
 * at least one block. */
#define ZPP_ISUM_TILE 2048u
size_t zpp_isum_tile_blocks(const zpp_qcfg_t *cfg);
/* int32 elements of a fused step's scratch: min(count, a tile). */
size_t zpp_isum_tile(const zpp_qcfg_t *cfg, size_t count);

typedef struct {
  const char *name; /* "scalar", "avx2", "avx512" */
  zpp_quant_encode_fn encode;
  zpp_quant_decode_fn decode;
  zpp_isum_ops_t isum;
} zpp_quant_cpu_ops_t;

/* Bytes of the packed codes of `count` elements, and of a stage-1
 * message (the codes, then a multiplier byte per block). */
size_t zpp_isum_code_bytes(const zpp_qcfg_t *cfg, size_t count);
size_t zpp_isum_msg_bytes(const zpp_qcfg_t *cfg, size_t count);

/* The scalar reference of the integer-sum kernels. */
void zpp_isum_absmax_scalar(const zpp_qcfg_t *cfg, int dtype, const void *src,
                            const float *res, size_t count, uint32_t *amax);
void zpp_isum_encode_scalar(const zpp_qcfg_t *cfg, int dtype, const void *src,
                            float *res, float beta, const uint32_t *amax,
                            const int8_t *uexp, size_t count, uint8_t *dst);
void zpp_isum_sum_scalar(const zpp_qcfg_t *cfg, int dtype, const void *own,
                         float *res, float beta, const int8_t *uexp,
                         const uint8_t *const *srcs, int n, size_t count,
                         int32_t *out);
void zpp_isum_requant_scalar(const zpp_qcfg_t *cfg2, const int32_t *in,
                             const int8_t *uexp, float *res, float beta,
                             size_t count, uint8_t *dst);
void zpp_isum_finish_scalar(const zpp_qcfg_t *cfg2, const int32_t *own,
                            const int8_t *uexp, const uint8_t *const *srcs,
                            int n, size_t count, float div, int dtype,
                            void *dst);
void zpp_isum_sum_requant_scalar(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2,
                                 int dtype, const void *own, float *res1,
                                 const int8_t *uexp, const uint8_t *const *srcs,
                                 int n, float *res, float beta, size_t count,
                                 int32_t *tmp, uint8_t *dst);
void zpp_isum_sum_finish_scalar(const zpp_qcfg_t *cfg, const zpp_qcfg_t *cfg2,
                                int dtype, const void *own, float *res1,
                                float beta, const int8_t *uexp,
                                const uint8_t *const *srcs, int n,
                                const uint8_t *const *srcs2, int n2,
                                size_t count, float div, int32_t *tmp,
                                void *dst);
#define ZPP_ISUM_OPS_SCALAR                                                    \
  {zpp_isum_absmax_scalar, zpp_isum_encode_scalar, zpp_isum_sum_scalar,        \
   zpp_isum_requant_scalar, zpp_isum_finish_scalar,                            \
   zpp_isum_sum_requant_scalar, zpp_isum_sum_finish_scalar}

/* Block count and byte offsets of the encoded layout (docs/format.md). */
size_t zpp_quant_nblocks(const zpp_qcfg_t *cfg, size_t count);
/* Encoded bytes, or 0 with *overflow set when it does not fit size_t. */
size_t zpp_quant_bytes(const zpp_qcfg_t *cfg, size_t count, int *overflow);

/* The scalar reference. */
void zpp_quant_encode_scalar(const zpp_qcfg_t *cfg, int dtype, const void *src,
                             size_t count, uint8_t *dst);
void zpp_quant_decode_scalar(const zpp_qcfg_t *cfg, const uint8_t *src,
                             size_t count, int out_kind, void *dst);

/* Encode / decode blocks [b0, b1) only (the SIMD paths use these for
 * blocks too short to vectorise). */
void zpp_quant_encode_blocks_scalar(const zpp_qcfg_t *cfg, int dtype,
                                    const void *src, size_t count, size_t b0,
                                    size_t b1, uint8_t *dst);
void zpp_quant_decode_blocks_scalar(const zpp_qcfg_t *cfg, const uint8_t *src,
                                    size_t count, size_t b0, size_t b1,
                                    int out_kind, void *dst);

/* Software prefetch of a source stream, for the SIMD encoders and the
 * element-wise kernels that read a collective's input.  An encode reads a
 * block twice (statistics, then codes): from memory, its first pass waits
 * on each line, because between blocks the core has too few misses in
 * flight for the hardware prefetcher to run ahead.  Requesting the lines
 * ZPP_QCPU_PREFETCH_AHEAD bytes ahead overlaps that wait with the work on
 * the blocks before (perf/zpp-quant-bench --cold; docs/benchmarks.md). */
#ifndef ZPP_QCPU_PREFETCH_AHEAD
#define ZPP_QCPU_PREFETCH_AHEAD 2048u
#endif

/* One line's request (tests define it before this header to record the
 * addresses of their own copy of zpp_qcpu_prefetch). */
#ifndef ZPP_QCPU_PREFETCH_LINE
#if defined(__GNUC__) || defined(__clang__)
#define ZPP_QCPU_PREFETCH_LINE(addr) __builtin_prefetch((addr), 0, 3)
#else
#define ZPP_QCPU_PREFETCH_LINE(addr) ((void)(addr))
#endif
#endif

/* Requests the bytes of base from *done up to min(upto, end), a 64-byte
 * step at a time, and moves *done past them; at most the last
 * 2 * ZPP_QCPU_PREFETCH_AHEAD of them (whole steps are skipped, so *done
 * stays on its grid), so that a long block is left to the hardware
 * prefetcher instead of swept into the cache ahead of its use.
 * Only addresses inside the buffer (before base + end) are formed;
 * prefetches have no visible effect. */
static inline void zpp_qcpu_prefetch(const void *base, size_t *done,
                                     size_t upto, size_t end) {
  const char *p = (const char *)base;
  if (upto > end)
    upto = end;
  if (upto > *done && upto - *done > 2 * (size_t)ZPP_QCPU_PREFETCH_AHEAD)
    *done += (upto - 2 * (size_t)ZPP_QCPU_PREFETCH_AHEAD - *done + 63) / 64 * 64;
  for (; *done < upto; *done += 64)
    ZPP_QCPU_PREFETCH_LINE(p + *done);
}

/* Table of a named path ("scalar", "avx2", "avx512"), or NULL when it was
 * not compiled in or this CPU cannot run it. */
const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_named(const char *name);
/* The path in use: ZPP_CPU_ISA, else the best this CPU runs. */
const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops(void);

/* Provided by the SIMD translation units (NULL table when not built). */
const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx2(void);
const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx512(void);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_QUANT_CPU_H */
