/*
 * CUDA kernels of qgZ's compressed-domain sums (sum = ZPP_QGZ_SUM_INT;
 * docs/format.md, "Integer sums"): the device versions of the five
 * zpp_isum_ops_t kernels of quant_cpu.h, bit for bit those of the scalar
 * reference (zpp_isum_*_scalar), and the agreement's max over the stage's
 * exponents; the five over a table of runs (one run: one
 * slice or message, as one call of the host kernel) so that a step makes
 * one launch per 32 runs whatever the number of ranks, on the caller's
 * stream.
 *
 * Every pointer is device memory at any byte (16-byte accesses where the
 * alignment allows, else narrower ones); runs must not overlap each
 * other's outputs.  A run covers `count` elements from the start of a
 * block; `uexp` holds the agreed exponent byte of each of its blocks.
 * Residuals (error feedback) follow zpp_qb_enc_run_t's layout: fp32,
 * `count` floats (ZPP_QB_RES_F32), or an INT8 encode of the run's blocks
 * (ZPP_QB_RES_I8: `res` the blocks' fp32 scales, `res_codes` their codes,
 * symmetric, round to nearest, block `block`), whose values are decoded
 * before use and whose new errors are encoded after, as the host path's
 * decode, kernel, encode.  A NULL `res` in a run: no residual for it.
 *
 * Return: 0, or -1 with a message in err: a failed launch (the CUDA
 * message), or arguments outside these limits (bits other than 4 or 8,
 * block 0, a dtype or residual kind not listed, rows < 1, a finish run of
 * more than ZPP_ISUM_CUDA_SRCS messages without `part`).  The callers in
 * the library, zpp_k_isum_* (engine/exec.h), check those limits first
 * and report them as the caller's error, so a -1 that reaches them is a
 * failed launch.
 * Internal header: not installed.
 */
#ifndef ZPP_KERNELS_ISUM_CUDA_H
#define ZPP_KERNELS_ISUM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "quant_cuda.h" /* ZPP_QB_RES_* */

#ifdef __cplusplus
extern "C" {
#endif

/* Runs per launch (the table travels in the kernel's parameters). */
#define ZPP_ISUM_CUDA_BATCH 32
/* Sources (messages) per launch of the sum and the finish; a run with
 * more goes on in the next launch, from what the earlier one wrote. */
#define ZPP_ISUM_CUDA_SRCS 128

/* What every run of a launch shares. */
typedef struct {
  int bits;     /* code width, 4 or 8: stage 1 (absmax's exponents,
                   encode, sum) or stage 2 (requant, finish) */
  size_t block; /* elements per block, >= 1 */
  int dtype;    /* ZPP_QM_F32/F16/BF16: the source (absmax, encode), the
                   own slice (sum), the output (finish) */
  int sr;       /* stochastic rounding (encode, requant): element i of a
                   run draws zpp_qm_rand24(zpp_qm_rng_keys(seed), base + i) */
  int res;      /* ZPP_QB_RES_* (absmax, encode, sum, requant) */
  int reset;    /* the residual reads as zero: absmax leaves it out,
                   encode, sum and requant add 0 (and store the new
                   errors) */
  float beta;   /* LoCo's moving average of the residual; 0: plain */
} zpp_isum_cuda_t;

/* absmax: amax[b] = max |fl(x + r)| of block b as fp32 bits (r: none
 * when res is NULL or reset), as zpp_isum_absmax_scalar; uexp (when not
 * NULL) = zpp_qm_unit_exp(amax[b], bits), this rank's exponents. */
typedef struct {
  const void *src;
  const void *res;
  const uint8_t *res_codes;
  size_t count;
  uint32_t *amax;
  int8_t *uexp;
} zpp_isum_cuda_absmax_run_t;

/* encode: the stage-1 message of fl(x + r) into dst
 * (zpp_isum_msg_bytes), the residual updated, as zpp_isum_encode_scalar
 * with this run's amax and agreed uexp. */
typedef struct {
  const void *src;
  void *res;
  uint8_t *res_codes;
  const uint32_t *amax;
  const int8_t *uexp;
  uint8_t *dst;
  size_t count;
  uint64_t base, seed;
} zpp_isum_cuda_encode_run_t;

/* sum: out = zpp_qm_unit_own(fl(own + r), E) (own NULL: 0) plus m q of
 * the messages srcs[first .. first + n), the own slice's residual r
 * updated, as zpp_isum_sum_scalar with this config's beta (res NULL, or
 * own NULL: no residual). */
typedef struct {
  const void *own;
  void *res; /* the own slice's stage-1 residual */
  uint8_t *res_codes;
  const int8_t *uexp;
  int32_t *out;
  size_t count;
  size_t first, n;
} zpp_isum_cuda_sum_run_t;

/* requant: the integer sums `in` re-quantized into dst (the format of
 * docs/format.md at `bits`), the residual updated, as
 * zpp_isum_requant_scalar. */
typedef struct {
  const int32_t *in;
  const int8_t *uexp;
  void *res;
  uint8_t *res_codes;
  uint8_t *dst;
  size_t count;
  uint64_t base, seed;
} zpp_isum_cuda_requant_run_t;

/* finish: dst (dtype) = fl(fl(own 2^E) + the decoded messages srcs[first
 * .. first + n) in order) / div, as zpp_isum_finish_scalar.  A run of more
 * than ZPP_ISUM_CUDA_SRCS messages goes on over launches: each but the last
 * stores its fp32 sums in `part` (count floats; it may be `own` itself,
 * each element is read before it is written), the next one adds on from
 * there, and only the last divides and rounds to the dtype, so the bits
 * are the host's; `part` may be NULL for a run of at most
 * ZPP_ISUM_CUDA_SRCS messages (never split). */
typedef struct {
  const int32_t *own;
  const int8_t *uexp;
  void *dst;
  float *part;
  size_t count;
  size_t first, n;
} zpp_isum_cuda_finish_run_t;

/* agree: out[i] = max over r < rows of all[r n + i], the stage's exponent
 * of each block from its members' exponents (rows of n bytes, all-gathered;
 * out must not overlap all). */
int zpp_isum_cuda_agree(const int8_t *all, size_t n, int rows, int8_t *out,
                        void *stream, char *err, size_t errlen);
int zpp_isum_cuda_absmax(const zpp_isum_cuda_t *c,
                         const zpp_isum_cuda_absmax_run_t *runs, size_t nruns,
                         void *stream, char *err, size_t errlen);
int zpp_isum_cuda_encode(const zpp_isum_cuda_t *c,
                         const zpp_isum_cuda_encode_run_t *runs, size_t nruns,
                         void *stream, char *err, size_t errlen);
int zpp_isum_cuda_sum(const zpp_isum_cuda_t *c,
                      const zpp_isum_cuda_sum_run_t *runs, size_t nruns,
                      const uint8_t *const *srcs, void *stream, char *err,
                      size_t errlen);
int zpp_isum_cuda_requant(const zpp_isum_cuda_t *c,
                          const zpp_isum_cuda_requant_run_t *runs, size_t nruns,
                          void *stream, char *err, size_t errlen);
int zpp_isum_cuda_finish(const zpp_isum_cuda_t *c,
                         const zpp_isum_cuda_finish_run_t *runs, size_t nruns,
                         const uint8_t *const *srcs, float div, void *stream,
                         char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_ISUM_CUDA_H */
