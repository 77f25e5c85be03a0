/*
 * The codec layer (src/quant): the public quantizer API (zpp_quant_*) over
 * the kernels of src/kernels, and the entry points the collectives and the
 * transports' reductions use.  Not installed.
 */
#ifndef ZPP_SRC_QUANT_QUANT_H
#define ZPP_SRC_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- quantizer configs (src/quant/quant.c) ------------------------------------
 * sizeof(zpp_quant_config_t) of zpp 0.1 (fields up to `mode`): accepted,
 * the later fields take their defaults. */
#define ZPP_QUANT_CONFIG_V1_SIZE                                               \
  ((offsetof(zpp_quant_config_t, mode) + sizeof(zpp_quant_mode_t) +          \
    sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t))
/* zpp_quant_config_check reporting under `func`, the struct named `name`
 * and its fields `fp`-prefixed: ("zpp_qwz_allgather", "quant", "quant->")
 * gives "zpp_qwz_allgather: quant->bits 3: must be 8 or 4". */
zpp_status_t zpp_quant_config_check_named(const char *func, const char *name,
                                          const char *fp,
                                          const zpp_quant_config_t *cfg);
/* The full current config of a checked one of any accepted size. */
void zpp_quant_config_get(const zpp_quant_config_t *in,
                          zpp_quant_config_t *out);
/* 1 when the CPU path in use is a SIMD one (the host transforms then take
 * their AVX2 path; bitwise equal to the scalar one). */
int zpp_quant_cpu_simd(void);
/* zpp_quant_encode / zpp_quant_encode_device whose element i draws its
 * stochastic-rounding bits at index index_base + i (the position of the
 * element in the caller's whole tensor, so a split call gives the same
 * bytes as an unsplit one). */
zpp_status_t zpp_quant_encode_at(const zpp_quant_config_t *cfg,
                                 zpp_dtype_t dtype, const void *src,
                                 size_t count, uint64_t index_base, void *dst,
                                 size_t dst_bytes);
/* Host error feedback fused with zpp_quant_encode_at (elementwise.h,
 * zpp_ew_encode_ef_host): src (count of dtype) plus the fp32 residual res
 * encoded into dst, res replaced by the new error (beta > 0: its moving
 * average).  *fused = 0 with nothing written when the block is too long
 * for the fused loop: the caller runs the unfused sequence. */
zpp_status_t zpp_quant_encode_ef_at(const zpp_quant_config_t *cfg,
                                    zpp_dtype_t dtype, const void *src,
                                    size_t count, uint64_t index_base,
                                    float *res, float beta, void *dst,
                                    size_t dst_bytes, int *fused);
/* Host: out = fp32(own) (count of dtype) plus the decode of each of the n
 * encodes srcs[j] (cfg, count elements each), added in order, fused in
 * tiles (elementwise.h, zpp_ew_sum_decoded_host).  *fused = 0 with nothing
 * written when the block is too long for the tiles: the caller runs the
 * passes. */
zpp_status_t zpp_quant_sum_decoded(const zpp_quant_config_t *cfg,
                                   zpp_dtype_t dtype, const void *own,
                                   const void *const *srcs, int n,
                                   size_t count, float *out, int *fused);
zpp_status_t zpp_quant_encode_device_at(const zpp_quant_config_t *cfg,
                                        zpp_dtype_t dtype, const void *src,
                                        size_t count, uint64_t index_base,
                                        void *dst, size_t dst_bytes,
                                        zpp_stream_t stream);

/* ---- the device codec for the collectives (src/quant/quant.c) ----------------
 * The public device entry points classify src and dst with
 * cudaPointerGetAttributes on every call.  The collectives classify the
 * caller's buffers once per call (zpp_coll_check_bufs) and own their
 * scratch, so they call these, which skip that (decode: acc 1 for
 * decode-accumulate into fp32 dst, else dtype is checked and decoded to;
 * index_base as for zpp_quant_encode_device_at). */
zpp_status_t zpp_quant_encode_device_trusted(const zpp_quant_config_t *cfg,
                                             zpp_dtype_t dtype,
                                             const void *src, size_t count,
                                             uint64_t index_base, void *dst,
                                             size_t dst_bytes, void *stream);
zpp_status_t zpp_quant_decode_device_trusted(const zpp_quant_config_t *cfg,
                                             const void *src, size_t src_bytes,
                                             size_t count, int acc,
                                             zpp_dtype_t dtype, void *dst,
                                             void *stream);
/* ZPP_OK when p is device memory (of `device` when >= 0; managed memory
 * passes for any); else an error naming `what`. */
zpp_status_t zpp_quant_check_device_ptr(const char *func, const char *what,
                                        const void *p, int device);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_QUANT_QUANT_H */
