/*
 * CPU block codecs: the scalar reference and the SIMD paths, behind one
 * table chosen at run time.  Every path writes bitwise identical output
 * (docs/format.md); the SIMD paths fall back to the shared scalar math of
 * quant_math.h for tails and short blocks.
 *
 * Internal header: not installed.  Inputs are validated by src/quant.c
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

typedef struct {
  const char *name; /* "scalar", "avx2", "avx512" */
  zpp_quant_encode_fn encode;
  zpp_quant_decode_fn decode;
} zpp_quant_cpu_ops_t;

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
 * ZPP_QCPU_PREFETCH bytes ahead overlaps that wait with the work on the
 * blocks before (perf/zpp-quant-bench --cold; docs/benchmarks.md). */
#define ZPP_QCPU_PREFETCH 2048u

/* Requests bytes [*done, min(upto, end)) of base, a 64-byte line at a
 * time, and moves *done past them.  Only addresses inside the buffer
 * (before base + end) are formed; prefetches have no visible effect. */
static inline void zpp_qcpu_prefetch(const void *base, size_t *done,
                                     size_t upto, size_t end) {
  const char *p = (const char *)base;
  if (upto > end)
    upto = end;
  for (; *done < upto; *done += 64) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p + *done, 0, 3);
#else
    (void)p;
#endif
  }
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
