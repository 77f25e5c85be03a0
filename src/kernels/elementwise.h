/*
 * Element-wise helpers of the collectives (fp32 accumulators, error
 * feedback), for host memory and, in elementwise_cuda.cu, device memory.
 * Each element follows the same rule on both sides, through quant_math.h.
 * Internal header: not installed.
 */
#ifndef ZPP_KERNELS_ELEMENTWISE_H
#define ZPP_KERNELS_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "quant_cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = dtype(acc[i] / div): div 1 for a sum, the world size for a
 * mean (one IEEE division, then one rounding to the dtype).  out may be
 * acc itself (in place; the narrower dtypes are written behind the reads).
 * simd (zpp_quant_cpu_simd): the bf16 rounding in AVX2, the same bits. */
void zpp_ew_finish_host(int simd, const float *acc, size_t count, float div,
                        int dtype, void *out);
/* buf[i] = dtype(fp32(buf[i]) / div), in place. */
void zpp_ew_scale_host(int dtype, void *buf, size_t count, float div);
/* out[i] = fp32(x[i]): one pass, no read of out; simd (zpp_quant_cpu_simd):
 * bf16 in AVX2 (the same bits). */
void zpp_ew_to_f32_host(int simd, int dtype, const void *x, size_t count,
                        float *out);
/* out[i] = fp32(g[i]) + res[i]: the gradient with last step's error. */
void zpp_ew_add_residual_host(int dtype, const void *g, const float *res,
                              size_t count, float *out);
/* res[i] = x[i] - res[i] (res holds the decoded x on entry); elements
 * whose error is not finite store 0, so a skipped step (NaN/Inf gradient)
 * does not poison the next one. */
void zpp_ew_residual_host(const float *x, size_t count, float *res);
/* res[i] = zpp_qm_ema_residual(res[i], x[i], dec[i], beta, fl(1 - beta)):
 * the moving-average residual of LoCo (res holds the old residual). */
void zpp_ew_ema_residual_host(const float *x, const float *dec, size_t count,
                              float beta, float *res);

/* Error feedback fused with the encode (qgZ): for every element i of the
 * call, x = fp32(g[i]) + res[i]; x is encoded with cfg through `ops`
 * (element i draws at cfg->base + i) into dst, in the layout of one encode
 * of all `count` elements (docs/format.md); res[i] becomes the new error,
 * x minus its decode (a non-finite error stores 0), or with beta > 0 its
 * moving average zpp_qm_ema_residual(res[i], x, dec, beta, 1 - beta).
 * Per element bitwise the unfused sequence zpp_ew_add_residual_host,
 * encode, decode, zpp_ew_residual_host (or zpp_ew_ema_residual_host), run
 * in tiles of whole blocks that stay in L1: g and res are read once, res
 * and dst written once.  g, res and dst must not overlap.  Returns 0, or
 * -1 with nothing written when a block is longer than ZPP_EW_EF_TILE
 * elements (the caller then runs the unfused sequence). */
#define ZPP_EW_EF_TILE 1024
int zpp_ew_encode_ef_host(const zpp_quant_cpu_ops_t *ops, const zpp_qcfg_t *cfg,
                          int dtype, const void *g, size_t count, float *res,
                          float beta, uint8_t *dst);

/* out[i] = fp32(own[i]) (own of dtype), then decode(srcs[j])[i] added for
 * j = 0..n-1 in that order: per element bitwise zpp_ew_to_f32_host and n
 * decode-accumulates through `ops`, run in tiles of whole blocks that stay
 * in L1 (out is written once; each tile's blocks of a source are gathered
 * into one encoded tile first).  Every srcs[j] is one encode of `count`
 * elements with cfg (docs/format.md).  out must not overlap own or any
 * srcs[j].  Returns 0, or -1 with nothing written when a block is longer
 * than ZPP_EW_EF_TILE elements (the caller then runs the passes). */
int zpp_ew_sum_decoded_host(const zpp_quant_cpu_ops_t *ops,
                            const zpp_qcfg_t *cfg, int simd, int dtype,
                            const void *own, const uint8_t *const *srcs, int n,
                            size_t count, float *out);

/* dst[e] = out_dtype(sum over i = 0..n-1 of fp32(blocks[i][e])), the sum
 * in block order with an fp32 accumulator, divided by div when div > 0
 * (MEAN: one IEEE division), rounded once: per element the arithmetic of
 * the scalar loop over zpp_qm_load / zpp_qm_add / zpp_qm_store, bit for
 * bit, in tiles that the compiler vectorizes (fp32 and bf16).  Buffers of
 * any byte alignment; n >= 1.  dst may be one of the blocks itself when
 * out_dtype is no wider than in_dtype (the in-place allreduce: send ==
 * recv); otherwise it must not overlap a block.  simd: as for finish. */
void zpp_ew_reduce_blocks_host(int simd, void *dst, int out_dtype,
                               const void *const *blocks, int in_dtype, int n,
                               size_t count, float div);

/* Device versions, enqueued on `stream` (a cudaStream_t).  Return 0, or
 * non-zero with the CUDA message in err.  Buffers may start at any byte.
 * In place as on the host, except that finish's out may be acc only for
 * fp32 (a narrower out overlapping acc is a race between threads). */
int zpp_ew_finish_device(const float *acc, size_t count, float div,
                         int dtype, void *out, void *stream, char *err,
                         size_t errlen);
int zpp_ew_scale_device(int dtype, void *buf, size_t count, float div,
                        void *stream, char *err, size_t errlen);
int zpp_ew_add_residual_device(int dtype, const void *g, const float *res,
                               size_t count, float *out, void *stream,
                               char *err, size_t errlen);
int zpp_ew_residual_device(const float *x, size_t count, float *res,
                           void *stream, char *err, size_t errlen);
int zpp_ew_ema_residual_device(const float *x, const float *dec, size_t count,
                               float beta, float *res, void *stream,
                               char *err, size_t errlen);
/* out[i] = fp32(src[i]) (src of `dtype`), enqueued on `stream`. */
int zpp_ew_widen_device(int dtype, const void *src, size_t count, float *out,
                        void *stream, char *err, size_t errlen);
/* Stream-ordered allocation, copy and fill of device memory. */
int zpp_ew_alloc_device(size_t bytes, void **p, void *stream, char *err,
                        size_t errlen);
void zpp_ew_free_device(void *p, void *stream);
int zpp_ew_copy_device(void *dst, const void *src, size_t bytes,
                       void *stream, char *err, size_t errlen);
int zpp_ew_zero_device(void *p, size_t bytes, void *stream, char *err,
                       size_t errlen);

/* Long-lived device memory (not stream-ordered: cudaMalloc / cudaFree),
 * for buffers that outlive one call and are used on several streams, such
 * as hpZ's secondary copy. */
int zpp_ew_alloc_persistent(size_t bytes, void **p, char *err, size_t errlen);
void zpp_ew_free_persistent(void *p);
/* The calling thread's current device. */
int zpp_ew_get_device(int *dev, char *err, size_t errlen);
int zpp_ew_set_device(int dev, char *err, size_t errlen);
/* An event recorded on `stream` now (timing disabled); query: *done = 1
 * once the work before it completed. */
int zpp_ew_event_record(void **ev, void *stream, char *err, size_t errlen);
int zpp_ew_event_query(void *ev, int *done, char *err, size_t errlen);
void zpp_ew_event_destroy(void *ev);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_ELEMENTWISE_H */
