/*
 * Memory-space dispatch of the kernels the collectives use: host memory
 * runs the CPU quantizer and element-wise loops; device memory enqueues the
 * CUDA kernels on the collective's stream.
 */
#include "engine/exec.h"

#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/plan.h" /* zpp_plan_poll */
#include "kernels/elementwise.h"
#include "kernels/stream.h"
#include "kernels/quant_math.h"
#include "kernels/transform.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A collective polls events, allocates memory and waits for peers on the
 * host: none of it can be captured into a CUDA graph, and a capture that
 * met one of those calls is invalidated.  Refuse before anything is
 * enqueued, so the capture stays valid. */
zpp_status_t zpp_exec_check_capture(const char *func, zpp_comm_t comm,
                                    void *stream) {
#if ZPP_HAVE_CUDA_KERNELS
  char err[256];
  int saved = -1, capturing = 0, rc;
  ZPP_CHECK(zpp_exec_device_enter(comm, &saved));
  rc = zpp_st_capturing(stream, &capturing, err, sizeof err);
  zpp_exec_device_leave(saved);
  if (rc != 0)
    return zpp_error(ZPP_ERR_CUDA, func, "stream: %s", err);
  if (capturing)
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "stream %p is capturing a CUDA graph "
                     "(cudaStreamBeginCapture), or the legacy stream while "
                     "another stream captures: zpp collectives cannot be "
                     "captured; call them outside the capture",
                     stream);
#else
  (void)func;
  (void)comm;
  (void)stream;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_exec_init(const char *func, zpp_comm_t comm, void *stream,
                           zpp_exec_t *ex) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "comm is NULL");
  ex->comm = comm;
  ex->t = zpp_comm_transport(comm);
  /* A communicator that failed (or was aborted) fails every later call at
   * once with its first error, before ZPP_CHECK's exchange. */
  ZPP_CHECK(zpp_transport_broken_error(ex->t, func));
  ZPP_CHECK(zpp_comm_memory(comm, &ex->mem));
  ex->stream = stream;
  ex->caller_stream = stream;
#if ZPP_HAVE_CUDA_KERNELS
  if (ex->mem == ZPP_MEMORY_DEVICE) {
    ZPP_CHECK(zpp_exec_check_capture(func, comm, stream));
    /* staged plans run on the engine's stream, ordered after the caller's
     * work by an event, and the caller's stream waits for the engine */
    if (zpp_engine_staged(comm, ex->mem))
      ZPP_CHECK(zpp_engine_device_stream(func, comm, &ex->stream));
  }
#endif
  return ZPP_OK;
}

zpp_status_t zpp_exec_device_enter(zpp_comm_t comm, int *saved) {
  *saved = -1;
#if ZPP_HAVE_CUDA_KERNELS
  {
    char err[256];
    int want = zpp_comm_device(comm), cur = -1;
    if (want < 0)
      return ZPP_OK;
    if (zpp_ew_get_device(&cur, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, "zpp_exec_device_enter", "%s", err);
    if (cur == want)
      return ZPP_OK;
    if (zpp_ew_set_device(want, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, "zpp_exec_device_enter",
                       "making the communicator's device %d current: %s",
                       want, err);
    *saved = cur;
  }
#else
  (void)comm;
#endif
  return ZPP_OK;
}

void zpp_exec_device_leave(int saved) {
#if ZPP_HAVE_CUDA_KERNELS
  char err[256];
  int active = 1;
  if (saved < 0)
    return;
  /* A thread that never chose a device reads device 0 as current, and
   * making device 0 current creates its context (cudaSetDevice since CUDA
   * 12): a context on a GPU the rank does not use.  Put back only a device
   * that has its context already. */
  if (zpp_st_context_active(saved, &active, err, sizeof err) != 0 || !active)
    return;
  zpp_ew_set_device(saved, err, sizeof err);
#else
  (void)saved;
#endif
}

size_t zpp_coll_encoded_size(const zpp_quant_config_t *q, size_t count) {
  size_t b = 0;
  if (zpp_quant_encoded_size(q, count, &b) != ZPP_OK)
    return 0;
  return b;
}

#if ZPP_HAVE_CUDA_KERNELS
#define DEVICE_CALL(func, call)                                                \
  do {                                                                         \
    char err_[256];                                                            \
    if ((call) != 0)                                                           \
      return zpp_error(ZPP_ERR_CUDA, func, "%s", err_);                        \
  } while (0)
#define DEVICE_ERRBUF err_, sizeof err_
#endif

#if !ZPP_HAVE_CUDA_KERNELS
static zpp_status_t no_device(const char *func) {
  return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                   "device memory needs zpp built with CUDA kernels");
}
#endif

#if ZPP_HAVE_CUDA_KERNELS
/* Plans allocate their device scratch while they are built, on the
 * caller's thread, whose current device may be another: allocate (and
 * free) on the communicator's device, restoring the thread's. */
static int dev_enter(const zpp_exec_t *ex, int *saved) {
  return zpp_exec_device_enter(ex->comm, saved) == ZPP_OK ? 0 : 1;
}

static void dev_leave(int saved) { zpp_exec_device_leave(saved); }

/* Device memory on the communicator's device: stream-ordered scratch, or
 * persistent (cudaMalloc) memory. */
static zpp_status_t device_alloc(const char *func, const zpp_exec_t *ex,
                                 size_t bytes, int persistent, void **p) {
  char err[256];
  int saved, rc = dev_enter(ex, &saved);
  if (rc == 0)
    rc = persistent ? zpp_ew_alloc_persistent(bytes, p, err, sizeof err)
                    : zpp_ew_alloc_device(bytes, p, ex->stream, err,
                                          sizeof err);
  else
    snprintf(err, sizeof err, "cudaSetDevice(%d) failed",
             zpp_comm_device(ex->comm));
  dev_leave(saved);
  if (rc != 0)
    return zpp_error(ZPP_ERR_CUDA, func, "%s", err);
  return ZPP_OK;
}
#endif

zpp_status_t zpp_k_alloc(const zpp_exec_t *ex, size_t bytes, void **p) {
  *p = NULL;
  if (bytes == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    *p = zpp_scratch_get(ex->t, bytes);
    if (*p == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                       "scratch of %zu bytes", bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  return device_alloc(__func__, ex, bytes, 0, p);
#else
  return no_device(__func__);
#endif
}

void zpp_k_free(const zpp_exec_t *ex, void *p) {
  if (p == NULL)
    return;
  if (ex->mem == ZPP_MEMORY_HOST)
    zpp_scratch_put(ex->t, p);
#if ZPP_HAVE_CUDA_KERNELS
  else {
    int saved;
    dev_enter(ex, &saved);
    zpp_ew_free_device(p, ex->stream);
    dev_leave(saved);
  }
#endif
}

zpp_status_t zpp_k_alloc_persistent(const zpp_exec_t *ex, size_t bytes,
                                    void **p) {
  *p = NULL;
  if (bytes == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    *p = malloc(bytes);
    if (*p == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%zu bytes", bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  return device_alloc(__func__, ex, bytes, 1, p);
#else
  return no_device(__func__);
#endif
}

void zpp_k_free_persistent(const zpp_exec_t *ex, void *p) {
  if (p == NULL)
    return;
  if (ex->mem == ZPP_MEMORY_HOST) {
    if (!zpp_scratch_hold(ex->t, p))
      free(p);
  }
#if ZPP_HAVE_CUDA_KERNELS
  else {
    int saved;
    dev_enter(ex, &saved);
    zpp_ew_free_persistent(p);
    dev_leave(saved);
  }
#endif
}

zpp_status_t zpp_k_order_record(const zpp_exec_t *ex, void **ev) {
  if (ex->mem != ZPP_MEMORY_DEVICE)
    return ZPP_OK;
#if ZPP_HAVE_CUDA_KERNELS
  {
    char err[256];
    void *e = NULL;
    if (zpp_ew_event_record(&e, ex->stream, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, "zpp_k_order_record", "%s", err);
    zpp_ew_event_destroy(*ev); /* a wait queued before keeps its record */
    *ev = e;
  }
  return ZPP_OK;
#else
  (void)ev;
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_order_wait(const zpp_exec_t *ex, void *ev) {
  if (ex->mem != ZPP_MEMORY_DEVICE || ev == NULL)
    return ZPP_OK;
#if ZPP_HAVE_CUDA_KERNELS
  {
    char err[256];
    if (zpp_st_wait_event(ex->stream, ev, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, "zpp_k_order_wait", "%s", err);
  }
#endif
  return ZPP_OK;
}

void zpp_k_order_free(const zpp_exec_t *ex, void *ev) {
  if (ex->mem != ZPP_MEMORY_DEVICE || ev == NULL)
    return;
#if ZPP_HAVE_CUDA_KERNELS
  zpp_ew_event_destroy(ev);
#endif
}

zpp_status_t zpp_k_copy(const zpp_exec_t *ex, void *dst, const void *src,
                        size_t bytes) {
  if (bytes == 0 || dst == src)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    memmove(dst, src, bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_copy_device(dst, src, bytes, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_zero(const zpp_exec_t *ex, void *p, size_t bytes) {
  if (bytes == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    memset(p, 0, bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_zero_device(p, bytes, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_encode(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                          zpp_dtype_t dtype, const void *src, size_t count,
                          void *dst) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_encode(q, dtype, src, count, dst, bytes);
  return zpp_quant_encode_device_trusted(q, dtype, src, count, 0, dst, bytes,
                                         ex->stream);
}

zpp_status_t zpp_k_decode(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                          const void *src, size_t count, zpp_dtype_t dtype,
                          void *dst) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_decode(q, src, bytes, count, dtype, dst);
  return zpp_quant_decode_device_trusted(q, src, bytes, count, 0, dtype, dst,
                                         ex->stream);
}

zpp_status_t zpp_k_decode_acc(const zpp_exec_t *ex,
                              const zpp_quant_config_t *q, const void *src,
                              size_t count, float *acc) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_decode_accumulate(q, src, bytes, count, acc);
  return zpp_quant_decode_device_trusted(q, src, bytes, count, 1, ZPP_FLOAT32,
                                         acc, ex->stream);
}

zpp_status_t zpp_k_finish(const zpp_exec_t *ex, const float *acc,
                          size_t count, float div, zpp_dtype_t dtype,
                          void *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_finish_host(zpp_quant_cpu_simd(), acc, count, div, (int)dtype, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_finish_device(acc, count, div, (int)dtype, out,
                                             ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_sum_decoded(const zpp_exec_t *ex,
                               const zpp_quant_config_t *q, zpp_dtype_t dtype,
                               const void *own, const void *const *srcs, int n,
                               size_t count, float *out) {
  int j, fused = 0;
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST)
    ZPP_CHECK(zpp_quant_sum_decoded(q, dtype, own, srcs, n, count, out,
                                    &fused));
  if (fused)
    return ZPP_OK;
  ZPP_CHECK(zpp_k_to_f32(ex, dtype, own, count, out));
  for (j = 0; j < n; j++) {
    zpp_plan_poll();
    ZPP_CHECK(zpp_k_decode_acc(ex, q, srcs[j], count, out));
  }
  return ZPP_OK;
}

zpp_status_t zpp_k_to_f32(const zpp_exec_t *ex, zpp_dtype_t dtype,
                          const void *x, size_t count, float *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_to_f32_host(zpp_quant_cpu_simd(), (int)dtype, x, count, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_widen_device((int)dtype, x, count, out,
                                            ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_add_residual(const zpp_exec_t *ex, zpp_dtype_t dtype,
                                const void *g, const float *res, size_t count,
                                float *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_add_residual_host((int)dtype, g, res, count, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_add_residual_device((int)dtype, g, res, count,
                                                   out, ex->stream,
                                                   DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_update_residual(const zpp_exec_t *ex,
                                   const zpp_quant_config_t *q,
                                   const float *x, const void *enc,
                                   size_t count, float *res) {
  if (count == 0)
    return ZPP_OK;
  ZPP_CHECK(zpp_k_decode(ex, q, enc, count, ZPP_FLOAT32, res));
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_residual_host(x, count, res);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_residual_device(x, count, res, ex->stream,
                                               DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_update_residual_ema(const zpp_exec_t *ex,
                                       const zpp_quant_config_t *q,
                                       const float *x, const void *enc,
                                       size_t count, float beta,
                                       float *scratch, float *res) {
  if (count == 0)
    return ZPP_OK;
  ZPP_CHECK(zpp_k_decode(ex, q, enc, count, ZPP_FLOAT32, scratch));
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_ema_residual_host(x, scratch, count, beta, res);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_ema_residual_device(x, scratch, count, beta,
                                                   res, ex->stream,
                                                   DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_encode_ef(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t dtype, const void *g, size_t count,
                             uint64_t index_base, float *res, float beta,
                             float *tmp, float *scratch, void *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    int fused = 0;
    ZPP_CHECK(zpp_quant_encode_ef_at(q, dtype, g, count, index_base, res,
                                     beta, out,
                                     zpp_coll_encoded_size(q, count), &fused));
    if (fused)
      return ZPP_OK;
  }
  ZPP_CHECK(zpp_k_add_residual(ex, dtype, g, res, count, tmp));
  ZPP_CHECK(zpp_k_encode_at(ex, q, ZPP_FLOAT32, tmp, count, index_base, out));
  if (beta == 0.0f)
    return zpp_k_update_residual(ex, q, tmp, out, count, res);
  return zpp_k_update_residual_ema(ex, q, tmp, out, count, beta, scratch,
                                   res);
}

/* ---- transforms (src/kernels/transform.h) ---------------------------------- */

zpp_status_t zpp_k_encode_at(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t dtype, const void *src, size_t count,
                             uint64_t index_base, void *dst) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_encode_at(q, dtype, src, count, index_base, dst, bytes);
  return zpp_quant_encode_device_trusted(q, dtype, src, count, index_base,
                                         dst, bytes, ex->stream);
}

zpp_status_t zpp_k_hadamard(const zpp_exec_t *ex, size_t group,
                            zpp_dtype_t dtype, const void *src, size_t count,
                            float *dst) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_tf_hadamard_host(zpp_quant_cpu_simd(), group, (int)dtype, src, count,
                         dst);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_tf_hadamard_device(group, (int)dtype, src, count,
                                               dst, ex->stream,
                                               DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_wdiff(const zpp_exec_t *ex, zpp_dtype_t dtype,
                         const void *recon, const float *target, size_t count,
                         float *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_tf_wdiff_host((int)dtype, recon, target, count, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_tf_wdiff_device((int)dtype, recon, target, count,
                                            out, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

/* ---- batched steps ------------------------------------------------------- */

#if ZPP_HAVE_CUDA_KERNELS
/* A config the collective checked, in the kernels' form (keys: per run). */
static zpp_qcfg_t kernel_cfg(const zpp_quant_config_t *q) {
  zpp_qcfg_t c;
  memset(&c, 0, sizeof c);
  c.bits = q->bits;
  c.asym = q->mode == ZPP_QUANT_ASYMMETRIC;
  c.block = q->block_size;
  c.sr = q->rounding == ZPP_ROUND_STOCHASTIC;
  return c;
}
#endif

int zpp_k_encode_batch_ok(const zpp_exec_t *ex, size_t block, size_t hadamard) {
#if ZPP_HAVE_CUDA_KERNELS
  return ex->mem != ZPP_MEMORY_HOST &&
         zpp_quant_cuda_encode_batch_fits(block, hadamard);
#else
  (void)ex;
  (void)block;
  (void)hadamard;
  return 0;
#endif
}

zpp_status_t zpp_k_encode_batch(const zpp_exec_t *ex,
                                const zpp_k_enc_batch_t *b,
                                const zpp_qb_enc_run_t *runs, size_t n) {
  if (n == 0)
    return ZPP_OK;
  if (!zpp_k_encode_batch_ok(ex, b->q->block_size, b->hadamard))
    return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                     "a batched encode runs on device memory, with a "
                     "Hadamard group (%zu) that divides the block (%zu)",
                     b->hadamard, b->q->block_size);
#if ZPP_HAVE_CUDA_KERNELS
  {
    zpp_qb_enc_t k;
    memset(&k, 0, sizeof k);
    k.q = kernel_cfg(b->q);
    k.dtype = (int)b->dtype;
    k.res = b->residual_bits == 32  ? ZPP_QB_RES_F32
            : b->residual_bits == 8 ? ZPP_QB_RES_I8
                                    : ZPP_QB_RES_NONE;
    k.reset = b->reset;
    k.beta = b->beta;
    k.hadamard = b->hadamard;
    DEVICE_CALL(__func__, zpp_quant_cuda_encode_batch(&k, runs, n, ex->stream,
                                                      DEVICE_ERRBUF));
  }
  return ZPP_OK;
#else
  (void)runs;
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_sum_batch(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t src_dtype, zpp_dtype_t init_dtype,
                             const zpp_qb_sum_run_t *runs, size_t n,
                             const void *const *srcs) {
  size_t i, j;
  if (n == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    for (i = 0; i < n; i++) {
      const zpp_qb_sum_run_t *r = &runs[i];
      if (r->init != NULL)
        ZPP_CHECK(zpp_k_to_f32(ex, init_dtype, r->init, r->count, r->out));
      for (j = r->first; j < r->first + r->n; j++) {
        zpp_plan_poll();
        if (q == NULL)
          ZPP_CHECK(zpp_k_add_residual(ex, src_dtype, srcs[j], r->out, r->count,
                                       r->out));
        else
          ZPP_CHECK(zpp_k_decode_acc(ex, q, srcs[j], r->count, r->out));
      }
    }
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  {
    zpp_qcfg_t c;
    if (q != NULL)
      c = kernel_cfg(q);
    DEVICE_CALL(__func__,
                zpp_quant_cuda_sum_batch(q != NULL ? &c : NULL, (int)src_dtype,
                                         (int)init_dtype, runs, n, srcs,
                                         ex->stream, DEVICE_ERRBUF));
  }
  return ZPP_OK;
#else
  (void)srcs;
  (void)src_dtype;
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_hadamard_batch(const zpp_exec_t *ex, size_t group,
                                  zpp_dtype_t dtype, const zpp_tf_run_t *runs,
                                  size_t n) {
  size_t i;
  if (n == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    for (i = 0; i < n; i++)
      ZPP_CHECK(zpp_k_hadamard(ex, group, dtype, runs[i].src, runs[i].count,
                               runs[i].dst));
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__,
              zpp_tf_hadamard_batch_device(group, (int)dtype, runs, n,
                                           ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  (void)group;
  return no_device(__func__);
#endif
}

/* ---- integer sums on device memory ------------------------------------ */

/* Host memory runs zpp_isum_ops_t in the collective's own steps. */
static zpp_status_t isum_not_here(const char *func, const zpp_exec_t *ex) {
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "device memory only (host plans call the CPU "
                     "integer-sum kernels)");
#if ZPP_HAVE_CUDA_KERNELS
  return ZPP_OK;
#else
  return no_device(func);
#endif
}

/* The limits of src/kernels/isum_cuda.h, checked before a launch so that a
 * bad argument is the caller's error, named, and not a ZPP_ERR_CUDA (the
 * kernels' -1 is then a failed launch only). */
static zpp_status_t isum_args(const char *func, const zpp_isum_cuda_t *c,
                              const void *runs, size_t n) {
  if (c == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "c NULL");
  if (runs == NULL && n > 0)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "runs NULL for %zu runs", n);
  if (c->bits != 4 && c->bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "c->bits %d: must be 4 or 8", c->bits);
  if (c->block == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "c->block 0: must be >= 1");
  if (c->dtype != ZPP_QM_F32 && c->dtype != ZPP_QM_F16 &&
      c->dtype != ZPP_QM_BF16)
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "c->dtype %d: the integer sums take fp32, fp16 or bf16",
                     c->dtype);
  if (c->res != ZPP_QB_RES_NONE && c->res != ZPP_QB_RES_F32 &&
      c->res != ZPP_QB_RES_I8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "c->res %d: must be ZPP_QB_RES_NONE, _F32 or _I8", c->res);
  return ZPP_OK;
}

zpp_status_t zpp_k_isum_absmax(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                               const zpp_isum_cuda_absmax_run_t *runs,
                               size_t n) {
  ZPP_CHECK(isum_not_here(__func__, ex));
  ZPP_CHECK(isum_args(__func__, c, runs, n));
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__,
              zpp_isum_cuda_absmax(c, runs, n, ex->stream, DEVICE_ERRBUF));
#else
  (void)c, (void)runs, (void)n;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_k_isum_agree(const zpp_exec_t *ex, const int8_t *all, size_t n,
                              int rows, int8_t *out) {
  ZPP_CHECK(isum_not_here(__func__, ex));
  if (rows < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "rows %d: must be >= 1", rows);
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_isum_cuda_agree(all, n, rows, out, ex->stream,
                                            DEVICE_ERRBUF));
#else
  (void)all, (void)n, (void)rows, (void)out;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_k_isum_encode(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                               const zpp_isum_cuda_encode_run_t *runs,
                               size_t n) {
  ZPP_CHECK(isum_not_here(__func__, ex));
  ZPP_CHECK(isum_args(__func__, c, runs, n));
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__,
              zpp_isum_cuda_encode(c, runs, n, ex->stream, DEVICE_ERRBUF));
#else
  (void)c, (void)runs, (void)n;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_k_isum_sum(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                            const zpp_isum_cuda_sum_run_t *runs, size_t n,
                            const uint8_t *const *srcs) {
  ZPP_CHECK(isum_not_here(__func__, ex));
  ZPP_CHECK(isum_args(__func__, c, runs, n));
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__,
              zpp_isum_cuda_sum(c, runs, n, srcs, ex->stream, DEVICE_ERRBUF));
#else
  (void)c, (void)runs, (void)n, (void)srcs;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_k_isum_requant(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                                const zpp_isum_cuda_requant_run_t *runs,
                                size_t n) {
  ZPP_CHECK(isum_not_here(__func__, ex));
  ZPP_CHECK(isum_args(__func__, c, runs, n));
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__,
              zpp_isum_cuda_requant(c, runs, n, ex->stream, DEVICE_ERRBUF));
#else
  (void)c, (void)runs, (void)n;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_k_isum_finish(const zpp_exec_t *ex, const zpp_isum_cuda_t *c,
                               const zpp_isum_cuda_finish_run_t *runs, size_t n,
                               const uint8_t *const *srcs, float div) {
  size_t i;
  ZPP_CHECK(isum_not_here(__func__, ex));
  ZPP_CHECK(isum_args(__func__, c, runs, n));
  for (i = 0; i < n; i++)
    if (runs[i].n > ZPP_ISUM_CUDA_SRCS && runs[i].part == NULL)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "runs[%zu].part NULL: a run of %zu messages (more "
                       "than ZPP_ISUM_CUDA_SRCS, %d) needs scratch for its "
                       "fp32 sums",
                       i, runs[i].n, ZPP_ISUM_CUDA_SRCS);
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_isum_cuda_finish(c, runs, n, srcs, div, ex->stream,
                                             DEVICE_ERRBUF));
#else
  (void)c, (void)runs, (void)n, (void)srcs, (void)div;
#endif
  return ZPP_OK;
}
