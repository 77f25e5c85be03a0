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

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_QUANT_CUDA_H */
