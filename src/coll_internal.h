/*
 * Internals of the collectives (src/coll*.c, src/qgz.c): the memory-space
 * dispatch of the quantizer and element-wise kernels and the shared
 * argument checks.  The algorithms build plans (plan.h) of these kernels
 * and transport operations, never calling MPI, NCCL or CUDA directly.
 */
#ifndef ZPP_SRC_COLL_INTERNAL_H
#define ZPP_SRC_COLL_INTERNAL_H

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#include "quant_cpu.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a collective's buffers live and which stream orders its work. */
typedef struct {
  zpp_comm_t comm;
  zpp_transport_t *t;
  zpp_memory_t mem;
  void *stream;
} zpp_exec_t;

zpp_status_t zpp_exec_init(const char *func, zpp_comm_t comm, void *stream,
                           zpp_exec_t *ex);

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

/* With ZPP_CHECK=1: all ranks compare (count, dtype, op, config words) and
 * the result of their local argument checks (`local`) with one small
 * all-gather, and fail together: a rank whose own checks failed returns
 * its error, every other rank ZPP_ERR_MISMATCH naming it; differing
 * arguments give ZPP_ERR_MISMATCH naming the field and the first differing
 * rank.  So one rank's bad call never leaves the others hanging.  Without
 * ZPP_CHECK it returns `local`. */
zpp_status_t zpp_coll_check_args(const char *func, const zpp_exec_t *ex,
                                 size_t count, int dtype, int op,
                                 const uint64_t *words, int nwords,
                                 zpp_status_t local);

/* Argument checks shared by the collectives; the message names `func`. */
zpp_status_t zpp_coll_check_dtype(const char *func, zpp_dtype_t dtype);
/* The plain all-gather moves bytes: it takes ZPP_UINT8 as well. */
zpp_status_t zpp_coll_check_dtype_bytes(const char *func, zpp_dtype_t dtype);
zpp_status_t zpp_coll_check_op(const char *func, zpp_redop_t op);
/* size * count * dtype bytes must fit size_t. */
zpp_status_t zpp_coll_check_count(const char *func, const zpp_exec_t *ex,
                                  size_t count, zpp_dtype_t dtype);
/* On a device-memory communicator, p (if not NULL) must be device memory:
 * one pointer query per buffer and call (the kernels skip theirs). */
zpp_status_t zpp_coll_check_device_buf(const char *func, const zpp_exec_t *ex,
                                       const char *what, const void *p);
/* ZPP_ERR_INVALID_ARGUMENT when buffer b (b_bytes) shares a byte with
 * buffer a (a_bytes), naming both, their sizes and where b starts
 * relative to a; else ZPP_OK.  in_place: b is this rank's slot of a (the
 * per-rank buffer of an all-gather or reduce-scatter, a the whole one),
 * and b == a + rank * b_bytes, the collective's in-place form, is
 * accepted.  A local check of this rank's own pointers (docs/collectives.md,
 * "Buffers"), made before any transfer. */
zpp_status_t zpp_coll_check_overlap(const char *func, const zpp_exec_t *ex,
                                    const char *a_name, const void *a,
                                    size_t a_bytes, const char *b_name,
                                    const void *b, size_t b_bytes,
                                    int in_place);
/* The layouts of the two buffers of an all-gather or a reduce-scatter. */
typedef enum {
  ZPP_BUFS_GATHER = 0, /* send count, recv size * count elements; in place:
                          send == recv + rank * count */
  ZPP_BUFS_SCATTER = 1 /* send size * count, recv count elements; in place:
                          recv == send + rank * count */
} zpp_bufs_layout_t;
/* The overlap part of zpp_coll_check_bufs: send and recv (count elements
 * per rank of dtype, the sizes of `layout`) share bytes only in the
 * layout's in-place form.  size * count * dtype bytes must fit size_t. */
zpp_status_t zpp_coll_check_layout_overlap(const char *func,
                                           const zpp_exec_t *ex,
                                           zpp_bufs_layout_t layout,
                                           const void *send, const void *recv,
                                           size_t count, zpp_dtype_t dtype);
/* zpp_coll_check_count; buffers non-NULL when count > 0; overlapping only
 * in the in-place form of `layout` (zpp_coll_check_overlap); and on device
 * communicators classified as device memory once.  Messages name them
 * "sendbuf" and "recvbuf". */
zpp_status_t zpp_coll_check_bufs(const char *func, const zpp_exec_t *ex,
                                 zpp_bufs_layout_t layout, const void *send,
                                 const void *recv, size_t count,
                                 zpp_dtype_t dtype);
/* The count, NULL and device checks of zpp_coll_check_bufs (not the
 * overlap: its sizes differ by collective) with the names the public
 * declaration gives the two buffers (qWD: "target" and "recon"). */
zpp_status_t zpp_coll_check_bufs_named(const char *func, const zpp_exec_t *ex,
                                       const char *send_name, const void *send,
                                       const char *recv_name, const void *recv,
                                       size_t count, zpp_dtype_t dtype);
/* q non-NULL and valid (zpp_quant_config_check), reported under `func`
 * with the caller's names: ("quant", "quant->") gives "zpp_qwz_allgather:
 * quant->bits 3: must be 8 or 4". */
zpp_status_t zpp_coll_check_quant(const char *func, const char *name,
                                  const char *fp,
                                  const zpp_quant_config_t *q);

/* Elements per chunk of a chunked (pipelined) plan: a whole number of
 * blocks, about count / parts and at least ZPP_PIPE_MIN_CHUNK (below that,
 * per-message latency costs more than the overlap hides), so chunk
 * boundaries are block boundaries and the chunked result is bitwise the
 * unchunked one; the last chunk is what is left.  Returns count when the
 * collective should not be chunked: ZPP_PIPE_MIN_CHUNK 0, block 0, one
 * chunk holding it all, or a chunk that would overflow size_t.  parts is
 * the collective's (QWZ_PARTS, QGZ_PARTS); 0 counts as 1. */
size_t zpp_plan_chunk(size_t count, size_t block, size_t parts);

/* ---- transforms of issue 14 (kernels/quant/transform.h) ----------------- */

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

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COLL_INTERNAL_H */
