/*
 * Stream ordering between the caller's CUDA streams and zpp's own work:
 * events, stream waits on a host-written counter, capture, and whether a
 * device has a CUDA context.  Each returns 0, or nonzero with a message
 * in err.  Only in builds with CUDA kernels (ZPP_HAVE_CUDA_KERNELS).
 */
#ifndef ZPP_KERNELS_STREAM_H
#define ZPP_KERNELS_STREAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `stream` waits for the work before `ev` (cudaStreamWaitEvent). */
int zpp_st_wait_event(void *stream, void *ev, char *err, size_t errlen);
/* *capturing = 1 when `stream` is capturing a graph, or when the legacy
 * stream cannot be used because another stream captures. */
int zpp_st_capturing(void *stream, int *capturing, char *err, size_t errlen);
/* A non-blocking stream on the current device. */
int zpp_st_stream_create(void **stream, char *err, size_t errlen);
void zpp_st_stream_destroy(void *stream);

/* A 32-bit counter in pinned host memory that streams can wait on: the
 * host stores it, the device reads it (cudaHostAllocMapped|Portable). */
int zpp_st_counter_alloc(uint32_t **counter, char *err, size_t errlen);
void zpp_st_counter_free(uint32_t *counter);
/* Later work on `stream` waits until (int32_t)(*counter - value) >= 0
 * (cuStreamWaitValue32, CU_STREAM_WAIT_VALUE_GEQ, through the runtime's
 * driver entry points).  Returns 2 when the driver or device offers no
 * stream wait on memory (the caller then waits on the host), 1 on an
 * error of the call (a bad stream). */
int zpp_st_wait_counter(void *stream, uint32_t *counter, uint32_t value,
                        char *err, size_t errlen);

/* The calling thread's capture mode becomes relaxed: its allocations and
 * synchronisations do not invalidate another thread's global-mode stream
 * capture (cudaThreadExchangeStreamCaptureMode).  For zpp's own threads. */
int zpp_st_relaxed_capture_mode(char *err, size_t errlen);

/* *active = 1 when device `dev` has its primary context already (setting
 * it current creates one otherwise: cudaSetDevice since CUDA 12).  When
 * the driver cannot say, *active = 1. */
int zpp_st_context_active(int dev, int *active, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_KERNELS_STREAM_H */
