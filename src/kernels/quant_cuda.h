/*
 * Launchers of the CUDA block codec (quant_cuda.cu).  They
 * receive validated arguments from src/quant/quant.c and report a CUDA failure as
 * a non-zero return with the CUDA message copied into `err`.
 * Internal header: not installed.
 */
#ifndef ZPP_KERNELS_QUANT_CUDA_H
#define ZPP_KERNELS_QUANT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "quant_cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when a CUDA device can be used (driver present, at least one device). */
int zpp_quant_cuda_device_ok(void);

/* 1 when `p` is memory the device can address (device or managed); 0 for
 * plain host memory.  Writes the reason into err on 0.  *device (when not
 * NULL): the device that owns device memory, -1 for managed memory (any
 * device may address it). */
int zpp_quant_cuda_is_device_ptr(const void *p, int *device, char *err,
                                 size_t errlen);

int zpp_quant_cuda_encode(const zpp_qcfg_t *cfg, int dtype, const void *src,
                          size_t count, uint8_t *dst, void *stream, char *err,
                          size_t errlen);
/* out_kind: ZPP_QM_F32/F16/BF16 or ZPP_QM_OUT_ACC (dst is fp32 acc). */
int zpp_quant_cuda_decode(const zpp_qcfg_t *cfg, const uint8_t *src,
                          size_t count, int out_kind, void *dst, void *stream,
                          char *err, size_t errlen);

/* ---- batched launches (quant_batch_cuda.cu): tables of runs -------------- */

/* The residual of a batched encode's runs (error feedback). */
enum {
  ZPP_QB_RES_NONE = 0,
  ZPP_QB_RES_F32 = 1, /* count floats per run */
  ZPP_QB_RES_I8 = 2   /* per run: its blocks' INT8 scales and codes */
};

/* One run of a batched encode: count elements at src, encoded into dst
 * exactly as one zpp_quant_cuda_encode of them (docs/format.md). */
typedef struct {
  const void *src;    /* count elements of the batch's dtype */
  uint8_t *dst;       /* zpp_quant_bytes(q, count) bytes */
  void *res;          /* F32: count floats at any byte; I8: 4 bytes (the
                         fp32 scale) a block, block after block; NONE:
                         unused */
  uint8_t *res_codes; /* I8: the blocks' codes, block after block (count
                         bytes); otherwise unused */
  size_t count;
  uint64_t base; /* stochastic rounding: element i draws at base + i */
  uint64_t seed; /* ... with zpp_qm_rng_keys(seed) */
} zpp_qb_enc_run_t;

/* What every run of a batched encode shares. */
typedef struct {
  zpp_qcfg_t q;    /* bits, asym, block, sr (keys and base: per run) */
  int dtype;       /* of every src: ZPP_QM_F32/F16/BF16 */
  int res;         /* ZPP_QB_RES_* */
  int reset;       /* the residual reads as zero (it is not read) */
  float beta;      /* LoCo's moving average; 0: plain error feedback */
  size_t hadamard; /* rotate whole groups of this size first; 0: none */
} zpp_qb_enc_t;

/* Largest Hadamard group the batched encode rotates itself when a block
 * is longer than that (zpp_quant_cuda_encode_batch_fits). */
#define ZPP_QB_MAX_ROTATION 8192

/* 1 when zpp_quant_cuda_encode_batch runs this shape: the Hadamard group
 * divides the block and, for blocks above ZPP_QB_MAX_ROTATION elements,
 * is at most that. */
int zpp_quant_cuda_encode_batch_fits(size_t block, size_t hadamard);

/* Every run of the table, on `stream`, in one launch per 48 runs; element
 * i of a run:
 *   x = fp32(src[i]), rotated by the orthonormal Hadamard transform when
 *       b->hadamard is set (whole groups counted from the run's element 0,
 *       as zpp_tf_hadamard_device; the rest unrotated);
 *   x = x + r, r the residual's value (0 with reset, none without one;
 *       I8: its block's code times its scale);
 *   x encoded (block by block, the run's keys and base);
 *   the residual becomes e = x - decode (0 where not finite), or with
 *       beta > 0 zpp_qm_ema_residual(r, x, decode, beta, 1 - beta); I8:
 *       e encoded as INT8, symmetric, round to nearest, in the run's
 *       blocks (b->q.block elements each).
 * Per element bitwise the sequence zpp_tf_hadamard_device,
 * add-residual, encode, decode, residual update (and the INT8 encode of
 * the new error) run on each run alone.  Runs must not overlap each
 * other's outputs. */
int zpp_quant_cuda_encode_batch(const zpp_qb_enc_t *b,
                                const zpp_qb_enc_run_t *runs, size_t nruns,
                                void *stream, char *err, size_t errlen);

/* One output of a batched decode-sum: out[0, count) = fp32(init) (or out's
 * own values when init is NULL), then srcs[first .. first + n) added in
 * that order. */
typedef struct {
  float *out;
  const void *init; /* count elements of the init dtype at any byte, or
                       NULL */
  size_t count;
  size_t first, n;
} zpp_qb_sum_run_t;

/* Every output of the table, on `stream`, in one launch per 48 outputs or
 * 192 sources: each source is one encode of `count` elements with q, or
 * with q NULL count elements of src_dtype (added as fp32(src) + sum).
 * Per element bitwise the widen (or nothing) and the decode-accumulates
 * (or add-residuals) one after the other.  Outputs must not overlap each
 * other, their init or any source. */
int zpp_quant_cuda_sum_batch(const zpp_qcfg_t *q, int src_dtype, int init_dtype,
                             const zpp_qb_sum_run_t *runs, size_t nruns,
                             const void *const *srcs, void *stream, char *err,
                             size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_QUANT_CUDA_H */
