/*
 * Test hooks of the CUDA emulator (libzpp_cudart_emu): what a test needs to
 * see or steer that the CUDA runtime does not offer.  Not CUDA API; only
 * tests include this header.
 */
#ifndef ZPP_TESTS_CUDA_EMU_ZPP_CUDA_EMU_H
#define ZPP_TESTS_CUDA_EMU_ZPP_CUDA_EMU_H

#include <stddef.h>

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Work queued on a held stream waits (it does not start) until the stream
 * is released, so a test can see "not done" deterministically.  Stream 0
 * means the legacy stream of the current device, cudaStreamPerThread the
 * calling thread's per-thread stream of the current device.  A wait on a held stream
 * returns cudaErrorTimeout after ZPP_EMU_TIMEOUT_S. */
cudaError_t zpp_emu_stream_hold(cudaStream_t stream);
cudaError_t zpp_emu_stream_release(cudaStream_t stream);

/* Calls of the named runtime function ("cudaPointerGetAttributes") since
 * the last reset, by every thread of the process; 0 for an unknown name. */
unsigned long zpp_emu_api_calls(const char *name);
void zpp_emu_reset_api_calls(void);

/* The device the last executed kernel ran on (-1: none yet), and the
 * kernel (its function address). */
int zpp_emu_last_kernel_device(void);
const void *zpp_emu_last_kernel(void);
/* Kernels executed since the last clear, in order: copies up to max of
 * them into out and returns how many there were. */
size_t zpp_emu_kernel_log(const void **out, size_t max);
void zpp_emu_kernel_log_clear(void);
/* Copies (cudaMemcpy, cudaMemcpyAsync) of at least one byte queued since
 * the last clear, by every thread of the process, in the order they were
 * queued: copies up to max of them into out and returns how many there
 * were (at most 100000 are kept). */
struct zpp_emu_copy {
  void *dst;
  const void *src;
  size_t bytes;
};
size_t zpp_emu_copy_log(struct zpp_emu_copy *out, size_t max);
void zpp_emu_copy_log_clear(void);

/* The largest CTA (threads) executed so far. */
unsigned zpp_emu_max_block_threads(void);

/* What the last device fault was (illegal address, deadlock in a CTA,
 * ...), "" if none. */
const char *zpp_emu_last_fault(void);

/* Clears the sticky error of a device, so that one test's deliberate fault
 * does not fail the next test in the process.  Allocations and streams
 * stay (a real cudaDeviceReset would destroy them). */
void zpp_emu_clear_sticky_error(int device);

/* Sets the delay before each operation (microseconds, drawn uniformly
 * from [0, 2 us]); returns the previous one.  ZPP_EMU_DELAY_US sets it at
 * start. */
unsigned zpp_emu_set_delay_us(unsigned us);

/* Sets the bound of every wait (seconds; ZPP_EMU_TIMEOUT_S sets it at
 * start); returns the previous one. */
unsigned zpp_emu_set_timeout_s(unsigned s);

/* Whether the primary context of a device is initialised (1) or not (0):
 * cudaSetDevice initialises it, and so does every runtime call that needs
 * a context, on the calling thread's device (0 if it never set one).
 * cuDevicePrimaryCtxGetState answers from the same state.  Reset marks
 * every context not initialised (allocations and streams stay). */
int zpp_emu_context_active(int device);
void zpp_emu_reset_contexts(void);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_TESTS_CUDA_EMU_ZPP_CUDA_EMU_H */
