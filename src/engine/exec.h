/*
 * Kernel dispatch by memory space (src/engine/exec.c): the quantizer and
 * element-wise kernels of src/kernels on host or device memory, on a
 * plan's stream, and the scratch memory they work in.  The kernel steps of
 * every plan (src/coll) are written against these calls, never against
 * CUDA directly.  Not installed.
 */
#ifndef ZPP_SRC_ENGINE_EXEC_H
#define ZPP_SRC_ENGINE_EXEC_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#include "kernels/isum_cuda.h" /* zpp_isum_cuda_*_run_t */
#include "kernels/quant_cuda.h" /* zpp_qb_*_run_t */
#include "kernels/transform.h"  /* zpp_tf_run_t */
#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a collective's buffers live and which stream orders its work. */
typedef struct {
  zpp_comm_t comm;
  zpp_transport_t *t;
  zpp_memory_t mem;
  void *stream;        /* where the plan's device work goes */
  void *caller_stream; /* the caller's: the same, except for staged device
                          plans (the engine's stream then) */
} zpp_exec_t;

zpp_status_t zpp_exec_init(const char *func, zpp_comm_t comm, void *stream,
                           zpp_exec_t *ex);

/* Makes the communicator's device current on this thread; *saved gets the
 * device to put back (-1: none).  Leave puts it back only when that
 * device has a CUDA context already, so that a thread which never chose a
 * device (device 0 by default) does not get a context on GPU 0. */
zpp_status_t zpp_exec_device_enter(zpp_comm_t comm, int *saved);
/* ZPP_ERR_UNSUPPORTED when `stream` captures a CUDA graph (or is the
 * legacy stream while another stream captures): nothing of zpp's can be
 * captured.  Device memory only. */
zpp_status_t zpp_exec_check_capture(const char *func, zpp_comm_t comm,
                                    void *stream);
void zpp_exec_device_leave(int saved);

/* Scratch memory in the exec's space (device: stream-ordered). */
zpp_status_t zpp_k_alloc(const zpp_exec_t *ex, size_t bytes, void **p);
void zpp_k_free(const zpp_exec_t *ex, void *p);
/* Memory that outlives a call and is used on whatever stream later calls
 * pass (hpZ's secondary copy): cudaMalloc/cudaFree, never stream-ordered
 * on the legacy stream, which would not order with the non-blocking
 * streams frameworks use.  Host: malloc/free. */
zpp_status_t zpp_k_alloc_persistent(const zpp_exec_t *ex, size_t bytes,
                                    void **p);
void zpp_k_free_persistent(const zpp_exec_t *ex, void *p);
/* Order between the streams of different calls on memory that outlives
 * them (hpZ's secondary copy): record makes *ev (replacing the one it
 * held) mark the work queued so far on the exec's stream; wait makes the
 * exec's stream wait for the work *ev marked (NULL: none).  No-ops on host
 * memory, where the engine runs plans one after another. */
zpp_status_t zpp_k_order_record(const zpp_exec_t *ex, void **ev);
zpp_status_t zpp_k_order_wait(const zpp_exec_t *ex, void *ev);
void zpp_k_order_free(const zpp_exec_t *ex, void *ev);
zpp_status_t zpp_k_copy(const zpp_exec_t *ex, void *dst, const void *src,
                        size_t bytes);
zpp_status_t zpp_k_zero(const zpp_exec_t *ex, void *p, size_t bytes);

/* The quantizer on the exec's memory (dst sized by the encoded size). */
zpp_status_t zpp_k_encode(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                          zpp_dtype_t dtype, const void *src, size_t count,
                          void *dst);
zpp_status_t zpp_k_decode(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                          const void *src, size_t count, zpp_dtype_t dtype,
                          void *dst);
zpp_status_t zpp_k_decode_acc(const zpp_exec_t *ex,
                              const zpp_quant_config_t *q, const void *src,
                              size_t count, float *acc);
/* out = dtype(acc / div). */
zpp_status_t zpp_k_finish(const zpp_exec_t *ex, const float *acc,
                          size_t count, float div, zpp_dtype_t dtype,
                          void *out);
/* out = fp32(own) + decode(srcs[0]) + ... + decode(srcs[n - 1]) (each an
 * encode of count elements with q), added in that order: bitwise
 * zpp_k_to_f32 and n zpp_k_decode_acc, which is what a device (or a block
 * too long for the host's tiles) runs; host memory in one pass of L1
 * tiles (the passes poll the engine's transfers between sources).  out
 * must not overlap own or any srcs[j]. */
zpp_status_t zpp_k_sum_decoded(const zpp_exec_t *ex,
                               const zpp_quant_config_t *q, zpp_dtype_t dtype,
                               const void *own, const void *const *srcs, int n,
                               size_t count, float *out);
/* out = fp32(x), bit for bit (zpp_qm_load). */
zpp_status_t zpp_k_to_f32(const zpp_exec_t *ex, zpp_dtype_t dtype,
                          const void *x, size_t count, float *out);
/* out = fp32(g) + res. */
zpp_status_t zpp_k_add_residual(const zpp_exec_t *ex, zpp_dtype_t dtype,
                                const void *g, const float *res, size_t count,
                                float *out);
/* res = x - decode(enc), 0 where not finite. */
zpp_status_t zpp_k_update_residual(const zpp_exec_t *ex,
                                   const zpp_quant_config_t *q,
                                   const float *x, const void *enc,
                                   size_t count, float *res);
/* LoCo's moving average (docs/collectives.md): dec = decode(enc) into
 * `scratch` (count floats), then res = beta res + (1 - beta) (x - dec)
 * (zpp_qm_ema_residual); res holds the old residual on entry. */
zpp_status_t zpp_k_update_residual_ema(const zpp_exec_t *ex,
                                       const zpp_quant_config_t *q,
                                       const float *x, const void *enc,
                                       size_t count, float beta,
                                       float *scratch, float *res);

/* Error feedback around one encode with an fp32 residual: x = fp32(g) +
 * res is encoded as `count` elements at index_base into out, and res
 * becomes x - decode(out) (0 where not finite), or with beta > 0 LoCo's
 * moving average of it.  Host memory: one fused pass (zpp_quant_encode_ef_at)
 * where the block fits its tile; otherwise, and on a device, the three
 * steps above through tmp (count floats: x) and, with beta, scratch
 * (count floats).  Bitwise the same either way. */
zpp_status_t zpp_k_encode_ef(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t dtype, const void *g, size_t count,
                             uint64_t index_base, float *res, float beta,
                             float *tmp, float *scratch, void *out);
/* Encoded bytes of `count` elements (config already checked). */
size_t zpp_coll_encoded_size(const zpp_quant_config_t *q, size_t count);

/* ---- transforms (src/kernels/transform.h) -------------------------------- */

/* zpp_k_encode whose element i draws its stochastic-rounding bits at index
 * index_base + i (docs/format.md, "Stochastic rounding"). */
zpp_status_t zpp_k_encode_at(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t dtype, const void *src, size_t count,
                             uint64_t index_base, void *dst);
/* dst = fp32(src) with every whole group of `group` elements rotated by the
 * orthonormal Hadamard transform (its own inverse); the last count % group
 * elements copied.  dst may equal src for fp32. */
zpp_status_t zpp_k_hadamard(const zpp_exec_t *ex, size_t group,
                            zpp_dtype_t dtype, const void *src, size_t count,
                            float *dst);
/* out = target - fp32(recon) (qWD). */
zpp_status_t zpp_k_wdiff(const zpp_exec_t *ex, zpp_dtype_t dtype,
                         const void *recon, const float *target, size_t count,
                         float *out);

/* ---- batched steps: a table of runs in one launch ------------------------ */

/* What the runs of zpp_k_encode_batch share. */
typedef struct {
  const zpp_quant_config_t *q; /* bits, mode, block, rounding (its seed:
                                  per run, zpp_qb_enc_run_t.seed) */
  zpp_dtype_t dtype;           /* of every run's src */
  int residual_bits;           /* 0: none; 32: fp32; 8: INT8 blocks */
  int reset;                   /* the residual reads as zero */
  float beta;                  /* LoCo's moving average; 0: plain */
  size_t hadamard;             /* rotation group before the encode; 0 */
} zpp_k_enc_batch_t;

/* 1 when zpp_k_encode_batch runs this shape on the exec's memory: device
 * memory, and a rotation the batched kernel does itself
 * (zpp_quant_cuda_encode_batch_fits).  Otherwise the caller runs the
 * runs one by one (zpp_k_hadamard, zpp_k_encode_ef, ...). */
int zpp_k_encode_batch_ok(const zpp_exec_t *ex, size_t block, size_t hadamard);
/* Every run of the table encoded with error feedback
 * (zpp_quant_cuda_encode_batch: per element bitwise the separate steps);
 * a run's res is count floats (32) or its blocks' scales with res_codes
 * its codes (8: the format of docs/format.md split in its two parts). */
zpp_status_t zpp_k_encode_batch(const zpp_exec_t *ex,
                                const zpp_k_enc_batch_t *b,
                                const zpp_qb_enc_run_t *runs, size_t n);
/* runs[i].out = fp32(runs[i].init) (of init_dtype; NULL: out as it is),
 * then the sources srcs[first .. first + n) added in order: encodes of
 * count elements with q, or with q NULL elements of src_dtype (added as
 * zpp_k_add_residual does).  Bitwise zpp_k_to_f32 and zpp_k_decode_acc
 * (zpp_k_add_residual) one after the other; device memory in one launch
 * per 48 outputs. */
zpp_status_t zpp_k_sum_batch(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t src_dtype, zpp_dtype_t init_dtype,
                             const zpp_qb_sum_run_t *runs, size_t n,
                             const void *const *srcs);
/* zpp_k_hadamard of every run (one group size, one dtype); device memory
 * in one launch per pass for all of them. */
zpp_status_t zpp_k_hadamard_batch(const zpp_exec_t *ex, size_t group,
                                  zpp_dtype_t dtype, const zpp_tf_run_t *runs,
                                  size_t n);

/* ---- integer sums (qgZ sum INT) on device memory ------------------------- */

/* The kernels of src/kernels/isum_cuda.h on the exec's stream: each a table
 * of runs in one launch per ZPP_ISUM_CUDA_BATCH runs, bitwise the host's
 * zpp_isum_ops_t (kernels/quant_cpu.h), which host plans call themselves.
 * Device memory only (else ZPP_ERR_UNSUPPORTED).  The kernels' limits are
 * checked first, naming the argument: c NULL or runs NULL
 * (ZPP_ERR_NULL_POINTER), c->bits other than 4 or 8, c->block 0, c->res
 * not a ZPP_QB_RES_*, rows < 1, a finish run of more than
 * ZPP_ISUM_CUDA_SRCS messages with part NULL (ZPP_ERR_INVALID_ARGUMENT),
 * a c->dtype other than fp32/fp16/bf16 (ZPP_ERR_UNSUPPORTED); ZPP_ERR_CUDA
 * is a failed launch. */
zpp_status_t zpp_k_isum_absmax(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                               const zpp_isum_cuda_absmax_run_t *runs,
                               size_t n);
/* out[i] = max over r < rows of all[r n + i] (int8). */
zpp_status_t zpp_k_isum_agree(const zpp_exec_t *ex, const int8_t *all, size_t n,
                              int rows, int8_t *out);
zpp_status_t zpp_k_isum_encode(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                               const zpp_isum_cuda_encode_run_t *runs,
                               size_t n);
zpp_status_t zpp_k_isum_sum(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                            const zpp_isum_cuda_sum_run_t *runs, size_t n,
                            const uint8_t *const *srcs);
zpp_status_t zpp_k_isum_requant(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                                const zpp_isum_cuda_requant_run_t *runs,
                                size_t n);
zpp_status_t zpp_k_isum_finish(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                               const zpp_isum_cuda_finish_run_t *runs, size_t n,
                               const uint8_t *const *srcs, float div);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ENGINE_EXEC_H */
