// The contract of the emulated CUDA runtime (tests/cuda_emu): each rule it
// enforces has a test here that fails when the rule is not enforced.  The
// stand-in is worth something only if it rejects what the real runtime
// rejects and does not finish work early.  Waiting for "not done" uses
// zpp_emu_stream_hold, never timing, so the results are deterministic.
//
// Seed: ZPP_TEST_SEED (default 20261129), printed by the tests that use
// random data; the emulator prints its own delay seed (ZPP_EMU_SEED).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "zpp_cuda_emu.h"

namespace {

uint64_t test_seed() {
  const char *v = std::getenv("ZPP_TEST_SEED");
  return v ? std::strtoull(v, nullptr, 0) : 20261129ull;
}

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " \
                               << zpp_emu_last_fault();                        \
  } while (0)

// ---- kernels -------------------------------------------------------------------

__global__ void store_kernel(int *p, int v) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *p = v;
}

// p[i] = p[i] * 2 + v for every i < n (grid-stride)
__global__ void axpb_kernel(int *p, size_t n, int v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = p[i] * 2 + v;
}

// appends v to the log at p[0] (count) / p[1..]
__global__ void append_kernel(int *p, int v) {
  if (blockIdx.x == 0 && threadIdx.x == 0) p[1 + p[0]++] = v;
}

// only the first half of the CTA reaches the barrier: a deadlock
__global__ void half_barrier_kernel(int *p) {
  if (threadIdx.x < blockDim.x / 2) __syncthreads();
  if (threadIdx.x == 0) *p = 1;
}

// a sum over the CTA through shared memory and a barrier
__global__ void cta_sum_kernel(const int *in, int *out) {
  __shared__ int s[256];
  s[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (unsigned i = 0; i < blockDim.x; i++) t += s[i];
    out[blockIdx.x] = t;
  }
  __syncthreads();
}

// reads p[off] into *out (a device-side read at an arbitrary offset)
__global__ void read_at_kernel(const int *p, size_t off, int *out) {
  if (threadIdx.x == 0) *out = p[off];
}

template <typename... Exp, typename... Act>
cudaError_t launch(void (*k)(Exp...), unsigned grid, unsigned block, cudaStream_t s,
                   Act &&...args) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(grid, 1, 1);
  lc.blockDim = dim3(block, 1, 1);
  lc.stream = s;
  return cudaLaunchKernelEx(&lc, k, static_cast<Act &&>(args)...);
}

// Pinned memory that kernels may write and the host may read.
struct Pinned {
  int *p = nullptr;
  explicit Pinned(size_t n = 1) {
    if (cudaMallocHost(&p, n * sizeof(int)) == cudaSuccess) std::memset(p, 0, n * sizeof(int));
  }
  ~Pinned() {
    if (p) cudaFreeHost(p);
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(unsigned flags = cudaStreamDefault) {
    if (cudaStreamCreateWithFlags(&s, flags) != cudaSuccess) s = nullptr;
  }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

// Every test starts on device 0 with no sticky error and no held stream.
class Emu : public ::testing::Test {
 protected:
  void SetUp() override {
    cudaSetDevice(0);
    (void)cudaGetLastError();
  }
  void TearDown() override {
    zpp_emu_stream_release(0);
    zpp_emu_stream_release(cudaStreamPerThread);
    cudaDeviceSynchronize();
    for (int d = 0; d < 8; d++) zpp_emu_clear_sticky_error(d);
    cudaSetDevice(0);
    (void)cudaGetLastError();
  }
};

// ---- asynchrony and order ----------------------------------------------------------

TEST_F(Emu, WorkRunsAsynchronouslyFromTheHost) {
  Pinned h;
  Stream st;
  ASSERT_NE(h.p, nullptr);
  CUDA_OK(zpp_emu_stream_hold(st.s));
  CUDA_OK(launch(store_kernel, 1, 32, st.s, h.p, 7));
  // the launch returned; the kernel has not run
  EXPECT_EQ(*(volatile int *)h.p, 0);
  EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady);
  // Returned like any error, it is the thread's last error
  // (cuda_runtime_api.h, cudaGetLastError: "the last error that has been
  // produced by any of the runtime calls ... in the host thread"): peeking
  // keeps it, getting it clears it.
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaGetLastError clears it";
  CUDA_OK(zpp_emu_stream_release(st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(*h.p, 7);
  EXPECT_EQ(cudaStreamQuery(st.s), cudaSuccess);
}

TEST_F(Emu, AStreamRunsItsWorkInOrder) {
  Pinned log(65);
  Stream st;
  for (int i = 0; i < 64; i++) CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, i));
  CUDA_OK(cudaStreamSynchronize(st.s));
  ASSERT_EQ(log.p[0], 64);
  for (int i = 0; i < 64; i++) EXPECT_EQ(log.p[1 + i], i);
}

TEST_F(Emu, CopiesKernelsAndSetsAreOrderedOnTheDevice) {
  uint64_t seed = test_seed();
  std::printf("[ seed ] Emu copies: ZPP_TEST_SEED=%llu\n", (unsigned long long)seed);
  std::mt19937 rng((unsigned)seed);
  const size_t n = 5000;
  std::vector<int> in(n), out(n, -1);
  for (auto &v : in) v = (int)(rng() % 1000) - 500;
  int *d = nullptr;
  Stream st(cudaStreamNonBlocking);
  CUDA_OK(cudaMalloc(&d, n * sizeof(int)));
  CUDA_OK(cudaMemsetAsync(d, 0xff, n * sizeof(int), st.s));
  CUDA_OK(cudaMemcpyAsync(d, in.data(), n * sizeof(int), cudaMemcpyHostToDevice, st.s));
  CUDA_OK(launch(axpb_kernel, 3, 128, st.s, d, n, 5));
  CUDA_OK(launch(axpb_kernel, 7, 64, st.s, d, n, -1));
  CUDA_OK(cudaMemcpyAsync(out.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], (in[i] * 2 + 5) * 2 - 1) << i;
  CUDA_OK(cudaFree(d));
}

TEST_F(Emu, SharedMemoryAndBarriersWork) {
  const unsigned ctas = 4, threads = 256;
  std::vector<int> in(ctas * threads);
  for (size_t i = 0; i < in.size(); i++) in[i] = (int)(i * 7 % 31);
  int *d_in = nullptr, *d_out = nullptr;
  CUDA_OK(cudaMalloc(&d_in, in.size() * sizeof(int)));
  CUDA_OK(cudaMalloc(&d_out, ctas * sizeof(int)));
  CUDA_OK(cudaMemcpy(d_in, in.data(), in.size() * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(launch(cta_sum_kernel, ctas, threads, 0, (const int *)d_in, d_out));
  std::vector<int> out(ctas);
  CUDA_OK(cudaMemcpy(out.data(), d_out, ctas * sizeof(int), cudaMemcpyDeviceToHost));
  for (unsigned b = 0; b < ctas; b++) {
    int ref = 0;
    for (unsigned i = 0; i < threads; i++) ref += in[b * threads + i];
    EXPECT_EQ(out[b], ref) << "CTA " << b;
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_F(Emu, ABarrierNotReachedByEveryThreadFailsTheLaunch) {
  int *d = nullptr;
  CUDA_OK(cudaSetDevice(7));
  CUDA_OK(cudaMalloc(&d, sizeof(int)));
  CUDA_OK(launch(half_barrier_kernel, 1, 64, 0, d));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(zpp_emu_last_fault()).find("deadlock"), std::string::npos)
      << zpp_emu_last_fault();
}

// ---- the synchronous calls ------------------------------------------------------------

TEST_F(Emu, MemcpyWaitsForTheLegacyStreamExceptDeviceToDevice) {
  int *a = nullptr, *b = nullptr;
  CUDA_OK(cudaMalloc(&a, 64));
  CUDA_OK(cudaMalloc(&b, 64));
  CUDA_OK(zpp_emu_stream_hold(0));
  // device to device: returns before the copy ran ("no host-side
  // synchronization is performed"), and the legacy stream is still busy
  CUDA_OK(cudaMemcpy(b, a, 64, cudaMemcpyDeviceToDevice));
  EXPECT_EQ(cudaStreamQuery(0), cudaErrorNotReady);
  // memset of device memory: asynchronous too
  CUDA_OK(cudaMemset(a, 0, 64));
  EXPECT_EQ(cudaStreamQuery(0), cudaErrorNotReady);
  CUDA_OK(zpp_emu_stream_release(0));
  int h[16];
  CUDA_OK(cudaMemcpy(h, b, 64, cudaMemcpyDeviceToHost));  // returns after the copy
  EXPECT_EQ(cudaStreamQuery(0), cudaSuccess);
  cudaFree(a);
  cudaFree(b);
}

// The CUDA Runtime API, "API synchronization behavior", for the
// asynchronous copies: "For transfers between device memory and pageable
// host memory, the function might be synchronous with respect to host.",
// "If pageable memory must first be staged to pinned memory, the driver may
// synchronize with the stream and stage the copy into pinned memory." and
// "For transfers from any host memory to any host memory, the function is
// fully synchronous with respect to the host."  The emulator stages a
// pageable source at the call (the caller may reuse it at once) and
// returns from a copy to pageable memory once it completed.
TEST_F(Emu, AnAsyncCopyFromPageableMemoryIsStagedAtTheCall) {
  uint64_t seed = test_seed();
  std::printf("[ seed ] Emu staged copy: ZPP_TEST_SEED=%llu\n", (unsigned long long)seed);
  std::mt19937 rng((unsigned)seed);
  const size_t n = 3000;
  std::vector<int> src(n), want(n), got(n, -1);
  for (size_t i = 0; i < n; i++) want[i] = src[i] = (int)(rng() % 100000);
  int *d = nullptr;
  CUDA_OK(cudaMalloc(&d, n * sizeof(int)));
  Stream st(cudaStreamNonBlocking);
  CUDA_OK(zpp_emu_stream_hold(st.s));
  CUDA_OK(cudaMemcpyAsync(d, src.data(), n * sizeof(int), cudaMemcpyHostToDevice, st.s));
  for (auto &v : src) v = -7;  // reused as soon as the call returned
  CUDA_OK(zpp_emu_stream_release(st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  CUDA_OK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want) << "the copy read the source after the call returned";
  CUDA_OK(cudaFree(d));
}

TEST_F(Emu, AnAsyncCopyToPageableMemoryReturnsOnceItCompleted) {
  Pinned pinned;
  int *d = nullptr;
  CUDA_OK(cudaMalloc(&d, sizeof(int)));
  Stream st(cudaStreamNonBlocking);
  unsigned old = zpp_emu_set_delay_us(3000);  // the device is slow: an early return shows
  int pageable = 0;
  CUDA_OK(launch(store_kernel, 1, 1, st.s, d, 42));
  CUDA_OK(cudaMemcpyAsync(&pageable, d, sizeof(int), cudaMemcpyDeviceToHost, st.s));
  EXPECT_EQ(*(volatile int *)&pageable, 42) << "returned before the copy to pageable memory";
  // host to host: fully synchronous
  int a = 5, b = 0;
  CUDA_OK(launch(store_kernel, 1, 1, st.s, d, 43));
  CUDA_OK(cudaMemcpyAsync(&b, &a, sizeof(int), cudaMemcpyHostToHost, st.s));
  EXPECT_EQ(*(volatile int *)&b, 5) << "returned before the host-to-host copy";
  // to pinned memory the copy stays asynchronous
  CUDA_OK(zpp_emu_stream_hold(st.s));
  CUDA_OK(cudaMemcpyAsync(pinned.p, d, sizeof(int), cudaMemcpyDeviceToHost, st.s));
  EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady);
  (void)cudaGetLastError();
  CUDA_OK(zpp_emu_stream_release(st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(*pinned.p, 43);
  zpp_emu_set_delay_us(old);
  CUDA_OK(cudaFree(d));
}

TEST_F(Emu, CopyKindsAndRangesAreChecked) {
  int *d = nullptr;
  std::vector<int> h(16);
  CUDA_OK(cudaMalloc(&d, 16 * sizeof(int)));
  EXPECT_EQ(cudaMemcpy(h.data(), d, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue)
      << "a copy past the end of the allocation";
  EXPECT_EQ(cudaMemset(h.data(), 0, 4), cudaErrorInvalidValue) << "memset of pageable memory";
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a non-sticky error is cleared once read";
  CUDA_OK(cudaMemcpy(d, h.data(), 64, cudaMemcpyDefault));
  cudaFree(d);
}

// ---- events ---------------------------------------------------------------------

TEST_F(Emu, AnEventCompletesWhenTheWorkBeforeItDid) {
  Pinned h;
  Stream st;
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess) << "an event never recorded is complete";
  CUDA_OK(zpp_emu_stream_hold(st.s));
  CUDA_OK(launch(store_kernel, 1, 1, st.s, h.p, 3));
  CUDA_OK(cudaEventRecord(ev, st.s));
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_EQ(*(volatile int *)h.p, 0);
  CUDA_OK(zpp_emu_stream_release(st.s));
  CUDA_OK(cudaEventSynchronize(ev));
  EXPECT_EQ(*h.p, 3) << "the event completed before the kernel recorded before it";
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess);
  CUDA_OK(cudaEventDestroy(ev));
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorInvalidResourceHandle);
}

TEST_F(Emu, StreamWaitEventOrdersTwoStreams) {
  Pinned log(8);
  Stream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreate(&ev));
  CUDA_OK(zpp_emu_stream_hold(a.s));
  CUDA_OK(launch(append_kernel, 1, 1, a.s, log.p, 1));
  CUDA_OK(cudaEventRecord(ev, a.s));
  CUDA_OK(cudaStreamWaitEvent(b.s, ev, 0));
  CUDA_OK(launch(append_kernel, 1, 1, b.s, log.p, 2));
  // b waits for a's kernel, which waits for the hold
  CUDA_OK(zpp_emu_stream_hold(0));  // (nothing on the legacy stream: no effect)
  CUDA_OK(zpp_emu_stream_release(0));
  EXPECT_EQ(cudaStreamQuery(b.s), cudaErrorNotReady);
  EXPECT_EQ(*(volatile int *)log.p, 0);
  CUDA_OK(zpp_emu_stream_release(a.s));
  CUDA_OK(cudaStreamSynchronize(b.s));
  ASSERT_EQ(log.p[0], 2);
  EXPECT_EQ(log.p[1], 1);
  EXPECT_EQ(log.p[2], 2);
  cudaEventDestroy(ev);
}

// cuda_runtime_api.h, cudaEventRecord: "::cudaEventRecord() can be called
// multiple times on the same event and will overwrite the previously
// captured state. Other APIs such as ::cudaStreamWaitEvent() use the most
// recently captured state at the time of the API call, and are not affected
// by later calls to ::cudaEventRecord(). Before the first call to
// ::cudaEventRecord(), an event represents an empty set of work, so for
// example ::cudaEventQuery() would return ::cudaSuccess."; cudaStreamWaitEvent
// flags: "::cudaEventWaitDefault" and "::cudaEventWaitExternal: Event is
// captured in the graph as an external event node when performing stream
// capture."
TEST_F(Emu, AWaitTakesTheEventsStateAtTheCallAndANeverRecordedEventIsEmpty) {
  Pinned log(8);
  Stream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking), c(cudaStreamNonBlocking);
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_OK(cudaEventQuery(ev));  // empty set of work
  CUDA_OK(cudaEventSynchronize(ev));
  CUDA_OK(cudaStreamWaitEvent(b.s, ev, 0));  // waits for nothing
  CUDA_OK(launch(append_kernel, 1, 1, b.s, log.p, 1));
  CUDA_OK(cudaStreamSynchronize(b.s));
  ASSERT_EQ(log.p[0], 1);
  // b waits for a's record; c's later record of the same event changes
  // neither that wait nor anything but what the event examines
  CUDA_OK(zpp_emu_stream_hold(a.s));
  CUDA_OK(launch(append_kernel, 1, 1, a.s, log.p, 2));
  CUDA_OK(cudaEventRecord(ev, a.s));
  CUDA_OK(cudaStreamWaitEvent(b.s, ev, cudaEventWaitExternal));
  CUDA_OK(launch(append_kernel, 1, 1, b.s, log.p, 3));
  CUDA_OK(cudaEventRecord(ev, c.s));
  CUDA_OK(cudaStreamSynchronize(c.s));
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess) << "the query looked at the earlier record";
  EXPECT_EQ(cudaStreamQuery(b.s), cudaErrorNotReady) << "the wait took the later record";
  (void)cudaGetLastError();
  CUDA_OK(zpp_emu_stream_release(a.s));
  CUDA_OK(cudaStreamSynchronize(b.s));
  ASSERT_EQ(log.p[0], 3);
  EXPECT_EQ(log.p[2], 2);
  EXPECT_EQ(log.p[3], 3);
  EXPECT_EQ(cudaStreamWaitEvent(b.s, ev, 2), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  cudaEventDestroy(ev);
}

TEST_F(Emu, ElapsedTimeNeedsTimingEvents) {
  cudaEvent_t a, b, c;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  CUDA_OK(cudaEventCreateWithFlags(&c, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(a, 0));
  CUDA_OK(cudaEventRecord(b, 0));
  CUDA_OK(cudaEventRecord(c, 0));
  CUDA_OK(cudaEventSynchronize(c));
  float ms = -1;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, c), cudaErrorInvalidResourceHandle);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaEventDestroy(c);
}

// ---- the legacy stream ----------------------------------------------------------------

TEST_F(Emu, TheLegacyStreamWaitsForBlockingStreamsNotForNonBlockingOnes) {
  Pinned h(2);
  Stream blocking(cudaStreamDefault), nonblocking(cudaStreamNonBlocking);
  // a held non-blocking stream does not hold the legacy stream back
  CUDA_OK(zpp_emu_stream_hold(nonblocking.s));
  CUDA_OK(launch(store_kernel, 1, 1, nonblocking.s, h.p, 1));
  CUDA_OK(launch(store_kernel, 1, 1, 0, h.p + 1, 2));
  CUDA_OK(cudaStreamSynchronize(0));
  EXPECT_EQ(h.p[1], 2);
  EXPECT_EQ(*(volatile int *)h.p, 0);
  // a held blocking stream does
  CUDA_OK(zpp_emu_stream_hold(blocking.s));
  CUDA_OK(launch(store_kernel, 1, 1, blocking.s, h.p + 1, 3));
  CUDA_OK(launch(store_kernel, 1, 1, 0, h.p + 1, 4));
  EXPECT_EQ(cudaStreamQuery(0), cudaErrorNotReady);
  CUDA_OK(zpp_emu_stream_release(blocking.s));
  CUDA_OK(cudaStreamSynchronize(0));
  EXPECT_EQ(h.p[1], 4) << "the legacy stream ran before the blocking stream's earlier work";
  CUDA_OK(zpp_emu_stream_release(nonblocking.s));
  CUDA_OK(cudaStreamSynchronize(nonblocking.s));
  EXPECT_EQ(h.p[0], 1);
}

TEST_F(Emu, BlockingStreamsWaitForTheLegacyStream) {
  Pinned log(8);
  Stream blocking(cudaStreamDefault), nonblocking(cudaStreamNonBlocking);
  CUDA_OK(zpp_emu_stream_hold(0));
  CUDA_OK(launch(append_kernel, 1, 1, 0, log.p, 1));
  CUDA_OK(launch(append_kernel, 1, 1, nonblocking.s, log.p, 5));
  CUDA_OK(cudaStreamSynchronize(nonblocking.s));  // does not wait for the legacy stream
  EXPECT_EQ(*(volatile int *)log.p, 1);
  CUDA_OK(launch(append_kernel, 1, 1, blocking.s, log.p, 2));
  EXPECT_EQ(cudaStreamQuery(blocking.s), cudaErrorNotReady);
  // Time for the blocking stream to run early if it would: it must not.
  unsigned old = zpp_emu_set_delay_us(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  zpp_emu_set_delay_us(old);
  EXPECT_EQ(*(volatile int *)log.p, 1);
  CUDA_OK(zpp_emu_stream_release(0));
  CUDA_OK(cudaStreamSynchronize(blocking.s));
  ASSERT_EQ(log.p[0], 3);
  EXPECT_EQ(log.p[1], 5);
  EXPECT_EQ(log.p[2], 1);
  EXPECT_EQ(log.p[3], 2);
}

// ---- the per-thread default stream -----------------------------------------------------

// driver_types.h, cudaStreamPerThread: "Stream handle that can be passed as
// a cudaStream_t to use an implicit stream with per-thread synchronization
// behavior."; the CUDA Runtime API, "Stream synchronization behavior": "The
// per-thread default stream is an implicit stream local to both the thread
// and the CUcontext, and which does not synchronize with other streams
// (just like explicitly created streams). The per-thread default stream is
// not a non-blocking stream and will synchronize with the legacy default
// stream if both are used in a program."
TEST_F(Emu, PerThreadStreamsOfTwoThreadsAreNotOrderedBothAreOrderedWithTheLegacyStream) {
  Pinned log(8);
  CUDA_OK(zpp_emu_stream_hold(cudaStreamPerThread));  // this thread's one
  CUDA_OK(launch(append_kernel, 1, 1, cudaStreamPerThread, log.p, 1));
  cudaError_t b_sync = cudaErrorUnknown;
  std::thread b([&] {
    if (launch(append_kernel, 1, 1, cudaStreamPerThread, log.p, 2) == cudaSuccess)
      b_sync = cudaStreamSynchronize(cudaStreamPerThread);
  });
  b.join();
  EXPECT_EQ(b_sync, cudaSuccess) << "another thread's stream waited for this thread's";
  EXPECT_EQ(*(volatile int *)log.p, 1);
  // the legacy stream waits for this thread's (blocking) per-thread stream
  CUDA_OK(launch(append_kernel, 1, 1, 0, log.p, 3));
  EXPECT_EQ(cudaStreamQuery(0), cudaErrorNotReady);
  // and another thread's per-thread stream waits for the legacy stream
  cudaError_t c_query = cudaErrorUnknown;
  std::thread c([&] {
    if (launch(append_kernel, 1, 1, cudaStreamPerThread, log.p, 4) == cudaSuccess)
      c_query = cudaStreamQuery(cudaStreamPerThread);
  });
  c.join();
  EXPECT_EQ(c_query, cudaErrorNotReady);
  EXPECT_EQ(*(volatile int *)log.p, 1);
  (void)cudaGetLastError();
  CUDA_OK(zpp_emu_stream_release(cudaStreamPerThread));
  CUDA_OK(cudaDeviceSynchronize());  // the exited thread's work ran too
  ASSERT_EQ(log.p[0], 4);
  EXPECT_EQ(log.p[1], 2);
  EXPECT_EQ(log.p[2], 1);
  EXPECT_EQ(log.p[3], 3);
  EXPECT_EQ(log.p[4], 4);
  EXPECT_EQ(cudaStreamDestroy(cudaStreamPerThread), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

// A thread's per-thread stream goes with the thread as cudaStreamDestroy
// would take it: its queued work still runs, held or not.
TEST_F(Emu, APerThreadStreamsWorkRunsAfterItsThreadExited) {
  Pinned out;
  std::thread([&] {
    zpp_emu_stream_hold(cudaStreamPerThread);
    launch(store_kernel, 1, 1, cudaStreamPerThread, out.p, 9);
  }).join();
  unsigned old = zpp_emu_set_timeout_s(10);  // a stream left held fails, not hangs
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  zpp_emu_set_timeout_s(old);
  EXPECT_EQ(*out.p, 9);
}

TEST_F(Emu, APerThreadStreamBelongsToTheCurrentDevice) {
  Pinned out(2);
  CUDA_OK(zpp_emu_stream_hold(cudaStreamPerThread));
  CUDA_OK(launch(store_kernel, 1, 1, cudaStreamPerThread, out.p, 1));
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(launch(store_kernel, 1, 1, cudaStreamPerThread, out.p + 1, 2));
  CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
  EXPECT_EQ(out.p[1], 2);
  EXPECT_EQ(*(volatile int *)out.p, 0) << "device 0's per-thread stream is held";
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(zpp_emu_stream_release(cudaStreamPerThread));
  CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
  EXPECT_EQ(out.p[0], 1);
}

// ---- devices ------------------------------------------------------------------------

TEST_F(Emu, TheCurrentDeviceIsPerThread) {
  CUDA_OK(cudaSetDevice(3));
  int other = -1;
  std::thread t([&] { cudaGetDevice(&other); });
  t.join();
  EXPECT_EQ(other, 0);
  int mine = -1;
  CUDA_OK(cudaGetDevice(&mine));
  EXPECT_EQ(mine, 3);
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  EXPECT_EQ(cudaSetDevice(n), cudaErrorInvalidDevice);
}

TEST_F(Emu, PciBusIdsAreFixedPerDeviceAndRoundTrip) {
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  for (int d = 0; d < n; d++) {
    char id[32];
    CUDA_OK(cudaDeviceGetPCIBusId(id, sizeof id, d));
    char want[32];
    std::snprintf(want, sizeof want, "0000:%02X:00.0", d + 1);
    EXPECT_STREQ(id, want);
    int back = -1;
    CUDA_OK(cudaDeviceGetByPCIBusId(&back, id));
    EXPECT_EQ(back, d);
  }
  char small[4];
  EXPECT_EQ(cudaDeviceGetPCIBusId(small, sizeof small, 0), cudaErrorInvalidValue);
  int can = -1;
  CUDA_OK(cudaDeviceCanAccessPeer(&can, 0, 1));
  EXPECT_EQ(can, 1);
  CUDA_OK(cudaDeviceCanAccessPeer(&can, 1, 1));
  EXPECT_EQ(can, 0);
}

TEST_F(Emu, AKernelIntoAnotherDevicesStreamFailsACopyDoesNot) {
  CUDA_OK(cudaSetDevice(1));
  Stream s1;
  int *d1 = nullptr;
  CUDA_OK(cudaMalloc(&d1, 64));
  cudaEvent_t ev0;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaEventCreate(&ev0));
  EXPECT_EQ(launch(store_kernel, 1, 1, s1.s, d1, 1), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  int h = 9;
  EXPECT_EQ(cudaMemcpyAsync(d1, &h, sizeof h, cudaMemcpyHostToDevice, s1.s), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(ev0, s1.s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamWaitEvent(s1.s, ev0, 0), cudaSuccess);
  CUDA_OK(cudaStreamSynchronize(s1.s));
  int back = 0;
  CUDA_OK(cudaMemcpy(&back, d1, sizeof back, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, 9);
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(launch(store_kernel, 1, 1, s1.s, d1, 1));
  CUDA_OK(cudaStreamSynchronize(s1.s));
  EXPECT_EQ(zpp_emu_last_kernel_device(), 1);
  cudaFree(d1);
  cudaEventDestroy(ev0);
}

TEST_F(Emu, AKernelTouchingAnotherDevicesMemoryIsAnIllegalAddress) {
  int *d2 = nullptr;
  CUDA_OK(cudaSetDevice(2));
  CUDA_OK(cudaMalloc(&d2, 64));
  CUDA_OK(cudaSetDevice(3));
  CUDA_OK(launch(store_kernel, 1, 1, 0, d2, 1));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  EXPECT_NE(std::string(zpp_emu_last_fault()).find("device 2"), std::string::npos)
      << zpp_emu_last_fault();
  // sticky: every later call on the device fails, reading it does not clear it
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  int *x = nullptr;
  EXPECT_EQ(cudaMalloc(&x, 4), cudaErrorIllegalAddress);
  // other devices are not affected
  CUDA_OK(cudaSetDevice(2));
  CUDA_OK(launch(store_kernel, 1, 1, 0, d2, 1));
  CUDA_OK(cudaDeviceSynchronize());
  // with peer access the same kernel runs
  zpp_emu_clear_sticky_error(3);
  CUDA_OK(cudaSetDevice(3));
  CUDA_OK(cudaDeviceEnablePeerAccess(2, 0));
  EXPECT_EQ(cudaDeviceEnablePeerAccess(2, 0), cudaErrorPeerAccessAlreadyEnabled);
  (void)cudaGetLastError();
  CUDA_OK(launch(store_kernel, 1, 1, 0, d2, 5));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaSetDevice(2));
  int back = 0;
  CUDA_OK(cudaMemcpy(&back, d2, sizeof back, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, 5);
  cudaFree(d2);
}

TEST_F(Emu, AKernelGivenPageableHostMemoryIsAnIllegalAddress) {
  CUDA_OK(cudaSetDevice(4));
  int h = 0;
  CUDA_OK(launch(store_kernel, 1, 1, 0, &h, 1));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  EXPECT_EQ(h, 0);
}

TEST_F(Emu, ReadingPastAnAllocationIsAnIllegalAddress) {
  CUDA_OK(cudaSetDevice(5));
  int *d = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&d, 256));
  CUDA_OK(cudaMalloc(&out, 4));
  CUDA_OK(launch(read_at_kernel, 1, 1, 0, (const int *)d, (size_t)63, out));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(launch(read_at_kernel, 1, 1, 0, (const int *)d, (size_t)64, out));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
}

// ---- misaligned access --------------------------------------------------------
//
// The CUDA Programming Guide, "Device Memory Accesses": "Global memory
// instructions support reading or writing words of size equal to 1, 2, 4,
// 8, or 16 bytes. Any access (via a variable or a pointer) to data residing
// in global memory compiles to a single global memory instruction if and
// only if the size of the data type is 1, 2, 4, 8, or 16 bytes and the data
// is naturally aligned (i.e., its address is a multiple of that size)."
// driver_types.h, cudaErrorMisalignedAddress: "The device encountered a
// load or store instruction on a memory address which is not aligned. This
// leaves the process in an inconsistent state and any further CUDA work
// will return the same error."  The emulator checks the accesses of the
// load and store intrinsics (__ldg, __stcs, ...); vector_types.h gives the
// vector types their size as alignment.
static_assert(alignof(float4) == 16 && alignof(uint4) == 16 &&
                  alignof(int4) == 16 && alignof(double2) == 16 &&
                  alignof(ulonglong2) == 16,
              "16-byte vector types");
static_assert(alignof(float2) == 8 && alignof(uint2) == 8 &&
                  alignof(ushort4) == 8,
              "8-byte vector types");
static_assert(alignof(ushort2) == 4 && alignof(uchar4) == 4 &&
                  alignof(uchar2) == 2,
              "4- and 2-byte vector types");

// *out = __ldg((const V *)(p + off)) by one thread
template <typename V>
__global__ void ldg_at_kernel(const unsigned char *p, size_t off, V *out) {
  if (threadIdx.x == 0)
    *out = __ldg(reinterpret_cast<const V *>(p + off));
}

// stores v at p + off with one of the cache-hint stores, then *after = 1
template <typename V>
__global__ void store_at_kernel(unsigned char *p, size_t off, V v, int which,
                                int *after) {
  if (threadIdx.x != 0)
    return;
  V *q = reinterpret_cast<V *>(p + off);
  if (which == 0)
    __stcs(q, v);
  else if (which == 1)
    __stcg(q, v);
  else if (which == 2)
    __stwt(q, v);
  else
    __stwb(q, v);
  *after = 1;
}

class EmuMisaligned : public Emu {
protected:
  static constexpr int kDev = 6;
  unsigned char *d = nullptr; // 256 bytes of device kDev, random
  unsigned char *out = nullptr;
  int *after = nullptr;
  std::vector<unsigned char> host = std::vector<unsigned char>(256);
  void SetUp() override {
    Emu::SetUp();
    uint64_t seed = test_seed();
    std::printf("[ seed ] EmuMisaligned: ZPP_TEST_SEED=%llu\n",
                (unsigned long long)seed);
    std::mt19937_64 rng(seed);
    for (auto &b : host)
      b = (unsigned char)rng();
    ASSERT_EQ(cudaSetDevice(kDev), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d, 256), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, 16), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&after, sizeof(int)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, host.data(), 256, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void TearDown() override {
    zpp_emu_clear_sticky_error(kDev);
    cudaSetDevice(kDev);
    cudaFree(d);
    cudaFree(out);
    cudaFree(after);
    Emu::TearDown();
  }
  // A load of V at d + off: the bytes there when off is a multiple of
  // sizeof(V), else a sticky cudaErrorMisalignedAddress.
  template <typename V> void load_at(size_t off) {
    SCOPED_TRACE("load of " + std::to_string(sizeof(V)) + " bytes at offset " +
                 std::to_string(off));
    CUDA_OK(cudaMemset(out, 0, 16));
    CUDA_OK(launch(ldg_at_kernel<V>, 1, 32, 0, (const unsigned char *)d, off,
                   (V *)out));
    if (off % sizeof(V) == 0) {
      CUDA_OK(cudaDeviceSynchronize());
      unsigned char got[sizeof(V)];
      CUDA_OK(cudaMemcpy(got, out, sizeof(V), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(got, host.data() + off, sizeof(V)), 0);
      return;
    }
    expect_misaligned("__ldg");
  }
  // A store of V at d + off: written, and the thread goes on, when off is a
  // multiple of sizeof(V); else a sticky cudaErrorMisalignedAddress, the
  // memory unchanged and the thread stopped.
  template <typename V> void store_at(size_t off, int which) {
    static const char *const names[] = {"__stcs", "__stcg", "__stwt", "__stwb"};
    SCOPED_TRACE(std::string(names[which]) + " of " +
                 std::to_string(sizeof(V)) + " bytes at offset " +
                 std::to_string(off));
    V v;
    std::memset(&v, 0xa5, sizeof v);
    CUDA_OK(cudaMemcpy(d, host.data(), 256, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(after, 0, sizeof(int)));
    CUDA_OK(launch(store_at_kernel<V>, 1, 32, 0, d, off, v, which, after));
    std::vector<unsigned char> want = host;
    bool aligned = off % sizeof(V) == 0;
    if (aligned) {
      std::memset(want.data() + off, 0xa5, sizeof(V));
      CUDA_OK(cudaDeviceSynchronize());
    } else {
      expect_misaligned(names[which]);
      zpp_emu_clear_sticky_error(kDev);
      (void)cudaGetLastError();
    }
    std::vector<unsigned char> got(256);
    int went_on = -1;
    CUDA_OK(cudaMemcpy(got.data(), d, 256, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&went_on, after, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want);
    EXPECT_EQ(went_on, aligned ? 1 : 0);
  }
  void expect_misaligned(const char *op) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorMisalignedAddress);
    std::string f = zpp_emu_last_fault();
    EXPECT_NE(f.find("misaligned address"), std::string::npos) << f;
    EXPECT_NE(f.find(op), std::string::npos) << f;
    // sticky: every later call on the device fails, reading it does not clear
    // it
    EXPECT_EQ(cudaGetLastError(), cudaErrorMisalignedAddress);
    EXPECT_EQ(cudaGetLastError(), cudaErrorMisalignedAddress);
    void *x = nullptr;
    EXPECT_EQ(cudaMalloc(&x, 4), cudaErrorMisalignedAddress);
    EXPECT_STREQ(cudaGetErrorName(cudaErrorMisalignedAddress),
                 "cudaErrorMisalignedAddress");
    zpp_emu_clear_sticky_error(kDev);
    (void)cudaGetLastError();
  }
};

TEST_F(EmuMisaligned, AVectorLoadMustBeNaturallyAligned) {
  for (size_t off : {0, 2, 4, 6, 8, 14, 16, 32, 240}) {
    load_at<float4>(off);
    load_at<uint4>(off);
    load_at<float2>(off);
    load_at<uint2>(off);
    load_at<ushort2>(off);
  }
}

TEST_F(EmuMisaligned, AScalarLoadMustBeNaturallyAligned) {
  for (size_t off : {0, 1, 2, 3, 4, 6, 8, 13}) {
    load_at<unsigned char>(off);
    load_at<unsigned short>(off);
    load_at<float>(off);
    load_at<unsigned int>(off);
    load_at<double>(off);
  }
}

TEST_F(EmuMisaligned, ACacheHintStoreMustBeNaturallyAligned) {
  for (int which = 0; which < 4; which++)
    for (size_t off : {0, 1, 2, 4, 8, 12, 16, 48}) {
      store_at<uint4>(off, which);
      store_at<float2>(off, which);
      store_at<unsigned short>(off, which);
    }
}

TEST_F(EmuMisaligned, OtherDevicesAreNotAffected) {
  CUDA_OK(launch(ldg_at_kernel<float4>, 1, 1, 0, (const unsigned char *)d,
                 (size_t)4, (float4 *)out));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorMisalignedAddress);
  CUDA_OK(cudaSetDevice(kDev + 1));
  int *x = nullptr;
  CUDA_OK(cudaMalloc(&x, sizeof(int)));
  CUDA_OK(launch(store_kernel, 1, 1, 0, x, 7));
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(x);
}

// ---- memory: registry, use after free, host access --------------------------------------

TEST_F(Emu, PointerAttributesComeFromTheRegistry) {
  CUDA_OK(cudaSetDevice(2));
  void *dev = nullptr, *pinned = nullptr, *managed = nullptr;
  CUDA_OK(cudaMalloc(&dev, 100));
  CUDA_OK(cudaMallocHost(&pinned, 100));
  CUDA_OK(cudaMallocManaged(&managed, 100));
  int pageable = 0;
  cudaPointerAttributes a;
  CUDA_OK(cudaPointerGetAttributes(&a, (char *)dev + 50));
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 2);
  EXPECT_EQ(a.hostPointer, nullptr);
  CUDA_OK(cudaPointerGetAttributes(&a, pinned));
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(a.device, 2);
  CUDA_OK(cudaPointerGetAttributes(&a, managed));
  EXPECT_EQ(a.type, cudaMemoryTypeManaged);
  CUDA_OK(cudaPointerGetAttributes(&a, &pageable));
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  CUDA_OK(cudaFree(dev));
  CUDA_OK(cudaPointerGetAttributes(&a, dev));
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered) << "freed memory is no longer device memory";
  EXPECT_EQ(cudaFree(dev), cudaErrorInvalidValue) << "double free";
  EXPECT_EQ(cudaFreeHost(dev), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CUDA_OK(cudaFreeHost(pinned));
  CUDA_OK(cudaFree(managed));
}

TEST_F(Emu, DeviceWorkAfterAStreamOrderedFreeIsAnIllegalAddress) {
  CUDA_OK(cudaSetDevice(6));
  Stream st(cudaStreamNonBlocking);
  int *d = nullptr;
  CUDA_OK(cudaMallocAsync(&d, 256, st.s));
  CUDA_OK(launch(store_kernel, 1, 1, st.s, d, 1));  // inside its lifetime: fine
  CUDA_OK(cudaFreeAsync(d, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  CUDA_OK(launch(store_kernel, 1, 1, st.s, d, 2));  // after it
  EXPECT_EQ(cudaStreamSynchronize(st.s), cudaErrorIllegalAddress);
  EXPECT_NE(std::string(zpp_emu_last_fault()).find("freed"), std::string::npos)
      << zpp_emu_last_fault();
}

TEST_F(Emu, StreamOrderedMemoryDoesNotExistBeforeItsPointInTheStream) {
  CUDA_OK(cudaSetDevice(6));
  Stream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  CUDA_OK(zpp_emu_stream_hold(a.s));
  int *d = nullptr;
  CUDA_OK(cudaMallocAsync(&d, 64, a.s));
  CUDA_OK(launch(store_kernel, 1, 1, b.s, d, 1));  // b is not ordered after a
  EXPECT_EQ(cudaStreamSynchronize(b.s), cudaErrorIllegalAddress);
  CUDA_OK(zpp_emu_stream_release(a.s));
}

// Whether done became true within ms milliseconds.
bool returns_within(std::atomic<bool> &done, int ms) {
  for (int i = 0; i < ms && !done.load(); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done.load();
}

// cuda_runtime_api.h, cudaFree: "For all other pointers, this API may
// perform implicit synchronization." (all but those of cudaMallocAsync);
// the emulator synchronises the allocation's device, and cudaFreeHost every
// device, so that work queued on the memory finishes before it goes.
TEST_F(Emu, FreeWaitsForTheDevicesQueuedWork) {
  CUDA_OK(cudaSetDevice(2));
  Stream st(cudaStreamNonBlocking);
  int *d = nullptr, *h = nullptr;
  CUDA_OK(cudaMalloc(&d, 64));
  CUDA_OK(cudaMallocHost(&h, 64));
  CUDA_OK(zpp_emu_stream_hold(st.s));
  CUDA_OK(launch(store_kernel, 1, 1, st.s, d, 1));
  CUDA_OK(cudaMemcpyAsync(h, d, sizeof(int), cudaMemcpyDeviceToHost, st.s));
  std::atomic<bool> freed{false};
  cudaError_t rc = cudaErrorUnknown, rc_host = cudaErrorUnknown;
  std::thread t([&] {
    cudaSetDevice(2);
    rc = cudaFree(d);
    rc_host = cudaFreeHost(h);
    freed = true;
  });
  EXPECT_FALSE(returns_within(freed, 30)) << "cudaFree returned before the device's work";
  CUDA_OK(zpp_emu_stream_release(st.s));
  t.join();
  EXPECT_EQ(rc, cudaSuccess);
  EXPECT_EQ(rc_host, cudaSuccess);
  CUDA_OK(cudaStreamSynchronize(st.s));  // the kernel did not touch freed memory
}

// cuda_runtime_api.h, cudaFree: "This API will not perform any implicit
// synchronization when the pointer was allocated with ::cudaMallocAsync or
// ::cudaMallocFromPoolAsync. Callers must ensure that all accesses to these
// pointer have completed before invoking ::cudaFree."
TEST_F(Emu, FreeOfStreamOrderedMemoryDoesNotSynchronise) {
  CUDA_OK(cudaSetDevice(2));
  Stream st(cudaStreamNonBlocking);
  int *d = nullptr;
  CUDA_OK(cudaMallocAsync(&d, 64, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  CUDA_OK(zpp_emu_stream_hold(st.s));
  CUDA_OK(launch(store_kernel, 1, 1, st.s, d, 1));
  unsigned old = zpp_emu_set_timeout_s(5);  // a synchronising cudaFree fails, not hangs
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  zpp_emu_set_timeout_s(old);
  EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady) << "cudaFree waited for the stream";
  (void)cudaGetLastError();
  CUDA_OK(zpp_emu_stream_release(st.s));
  // the kernel ran after the memory was gone: the caller's error
  EXPECT_EQ(cudaStreamSynchronize(st.s), cudaErrorIllegalAddress);
}

// ---- memory pools --------------------------------------------------------------------

uint64_t pool_attr(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t v = ~0ull;
  if (cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess) return ~0ull;
  return v;
}

// driver_types.h, cudaMemPoolAttrReleaseThreshold: "Amount of reserved
// memory in bytes to hold onto before trying to release memory back to the
// OS. When more than the release threshold bytes of memory are held by the
// memory pool, the allocator will try to release memory back to the OS on
// the next call to stream, event or context synchronize. (default 0)"
TEST_F(Emu, TheDefaultPoolReturnsFreedMemoryAtTheNextSynchronize) {
  CUDA_OK(cudaSetDevice(4));
  Stream st(cudaStreamNonBlocking);
  cudaMemPool_t pool = nullptr, current = nullptr;
  CUDA_OK(cudaDeviceGetDefaultMemPool(&pool, 4));
  CUDA_OK(cudaDeviceGetMemPool(&current, 4));
  EXPECT_EQ(pool, current) << "the current pool is the default one";
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReleaseThreshold), 0u);
  CUDA_OK(cudaDeviceSynchronize());  // anything an earlier test left goes
  ASSERT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), 0u);
  const size_t mb = 1 << 20;
  unsigned long releases = zpp_emu_mempool_releases(4);
  void *p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, mb, st.s));
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemCurrent), mb);
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), mb);
  CUDA_OK(cudaFreeAsync(p, st.s));
  while (cudaStreamQuery(st.s) == cudaErrorNotReady)  // the free ran; no synchronize
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (void)cudaGetLastError();
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemCurrent), 0u);
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), mb)
      << "freed memory stays reserved until a synchronize";
  CUDA_OK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), 0u);
  EXPECT_EQ(zpp_emu_mempool_releases(4), releases + 1);
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemHigh), mb);
}

// cudaMemPoolTrimTo: "Releases memory back to the OS until the pool
// contains fewer than minBytesToKeep reserved bytes, or there is no more
// memory that the allocator can safely release. The allocator cannot
// release OS allocations that back outstanding asynchronous allocations."
TEST_F(Emu, APoolKeepsFreedMemoryBelowItsThresholdAndReusesIt) {
  CUDA_OK(cudaSetDevice(4));
  Stream st(cudaStreamNonBlocking);
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 4;
  cudaMemPool_t pool = nullptr;
  CUDA_OK(cudaMemPoolCreate(&pool, &props));
  uint64_t keep_all = UINT64_MAX;
  CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  const size_t mb = 1 << 20;
  unsigned long releases = zpp_emu_mempool_releases(4);
  void *a = nullptr, *b = nullptr;
  CUDA_OK(cudaMallocFromPoolAsync(&a, mb, pool, st.s));
  CUDA_OK(launch(store_kernel, 1, 1, st.s, (int *)a, 1));  // usable in stream order
  CUDA_OK(cudaFreeAsync(a, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), mb) << "released below threshold";
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemCurrent), 0u);
  EXPECT_EQ(zpp_emu_mempool_releases(4), releases);
  CUDA_OK(cudaMallocAsync(&b, mb / 2, pool, st.s));  // the C++ overload
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), mb) << "not reused";
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrUsedMemCurrent), mb / 2);
  CUDA_OK(cudaMemPoolTrimTo(pool, 0));
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), mb / 2)
      << "trimmed memory that backs a live allocation";
  EXPECT_EQ(zpp_emu_mempool_releases(4), releases + 1);
  CUDA_OK(cudaFreeAsync(b, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  CUDA_OK(cudaMemPoolTrimTo(pool, 0));
  EXPECT_EQ(pool_attr(pool, cudaMemPoolAttrReservedMemCurrent), 0u);
  CUDA_OK(cudaMemPoolDestroy(pool));
}

// cuda_runtime_api.h: cudaDeviceSetMemPool "The memory pool must be local to
// the specified device."; cudaMemPoolDestroy "Destroying the current mempool
// of a device sets the default mempool of that device as the current mempool
// for that device." and "A device's default memory pool cannot be
// destroyed."; cudaMemPoolSetAttribute, cudaMemPoolAttrReservedMemHigh "It
// is illegal to set this attribute to a non-zero value."
TEST_F(Emu, TheCurrentPoolOfADeviceAndWhatPoolsRefuse) {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 5;
  cudaMemPool_t mine = nullptr, dflt = nullptr, cur = nullptr;
  CUDA_OK(cudaMemPoolCreate(&mine, &props));
  CUDA_OK(cudaDeviceGetDefaultMemPool(&dflt, 5));
  EXPECT_EQ(cudaDeviceSetMemPool(4, mine), cudaErrorInvalidValue) << "a pool of device 5";
  CUDA_OK(cudaDeviceSetMemPool(5, mine));
  CUDA_OK(cudaDeviceGetMemPool(&cur, 5));
  EXPECT_EQ(cur, mine);
  CUDA_OK(cudaSetDevice(5));
  Stream st(cudaStreamNonBlocking);
  void *p = nullptr;
  CUDA_OK(cudaMallocAsync(&p, 4096, st.s));
  EXPECT_EQ(pool_attr(mine, cudaMemPoolAttrUsedMemCurrent), 4096u) << "not from the current pool";
  CUDA_OK(cudaFreeAsync(p, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  CUDA_OK(cudaMemPoolDestroy(mine));
  CUDA_OK(cudaDeviceGetMemPool(&cur, 5));
  EXPECT_EQ(cur, dflt);
  EXPECT_EQ(cudaMemPoolDestroy(dflt), cudaErrorInvalidValue);
  uint64_t one = 1;
  EXPECT_EQ(cudaMemPoolSetAttribute(dflt, cudaMemPoolAttrReservedMemHigh, &one),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemPoolSetAttribute(dflt, cudaMemPoolAttrUsedMemCurrent, &one),
            cudaErrorInvalidValue);
  props.reserved[0] = 1;
  EXPECT_EQ(cudaMemPoolCreate(&mine, &props), cudaErrorInvalidValue) << "reserved must be 0";
  (void)cudaGetLastError();
}

TEST_F(Emu, FreedDeviceMemoryIsNeverReused) {
  void *a = nullptr, *b = nullptr;
  CUDA_OK(cudaMalloc(&a, 4096));
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaMalloc(&b, 4096));
  EXPECT_NE(a, b);
  cudaFree(b);
}

TEST_F(Emu, HostCodeTouchingDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        int *d = nullptr;
        if (cudaMalloc(&d, 64) == cudaSuccess) *(volatile int *)d = 1;
      },
      "host code touched device memory at 0x");
  EXPECT_DEATH(
      {
        int *d = nullptr;
        if (cudaMalloc(&d, 64) == cudaSuccess) std::printf("%d\n", *(volatile int *)d);
      },
      "host code touched device memory");
}

// ---- host functions -----------------------------------------------------------------------

struct HostFnData {
  int *log;  // pinned
  cudaError_t api = cudaErrorUnknown;
};

void host_fn(void *p) {
  HostFnData *d = static_cast<HostFnData *>(p);
  int dev = -1;
  d->api = cudaGetDevice(&dev);  // not permitted in a host function
  d->log[1 + d->log[0]++] = 100;
}

TEST_F(Emu, HostFunctionsRunInStreamOrderAndMayNotCallCuda) {
  Pinned log(8);
  Stream st;
  HostFnData data{log.p};
  CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, 1));
  CUDA_OK(cudaLaunchHostFunc(st.s, host_fn, &data));
  CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, 2));
  CUDA_OK(cudaStreamSynchronize(st.s));
  ASSERT_EQ(log.p[0], 3);
  EXPECT_EQ(log.p[1], 1);
  EXPECT_EQ(log.p[2], 100);
  EXPECT_EQ(log.p[3], 2);
  EXPECT_EQ(data.api, cudaErrorNotPermitted);
}

// ---- graphs ------------------------------------------------------------------------------

TEST_F(Emu, CapturedWorkRunsOnlyWhenTheGraphIsLaunched) {
  Pinned log(8);
  Stream st(cudaStreamNonBlocking);
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeRelaxed));
  CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, 1));
  CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, 2));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_OK(cudaStreamIsCapturing(st.s, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamEndCapture(st.s, &g));
  CUDA_OK(cudaStreamIsCapturing(st.s, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(log.p[0], 0);
  cudaGraphExec_t x = nullptr;
  CUDA_OK(cudaGraphInstantiate(&x, g, 0));
  CUDA_OK(cudaGraphLaunch(x, st.s));
  CUDA_OK(cudaGraphLaunch(x, st.s));
  CUDA_OK(cudaStreamSynchronize(st.s));
  ASSERT_EQ(log.p[0], 4);
  EXPECT_EQ(log.p[3], 1);
  EXPECT_EQ(log.p[4], 2);
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
}

// Ends the capture on s and says how: cudaSuccess with a graph, or the
// error with none (the graph, if any, is destroyed).
cudaError_t end_capture(cudaStream_t s) {
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e == cudaSuccess && g == nullptr) return cudaErrorUnknown;
  if (e != cudaSuccess && g != nullptr) return cudaErrorUnknown;
  if (g != nullptr) cudaGraphDestroy(g);
  (void)cudaGetLastError();
  return e;
}

// cudaErrorStreamCaptureUnsupported: "The operation is not permitted when
// the stream is capturing." (driver_types.h); cudaStreamEndCapture: "If
// capture was invalidated, due to a violation of the rules of stream
// capture, then a NULL graph will be returned."; cudaStreamIsCapturing,
// cudaStreamCaptureStatusInvalidated: "The stream was capturing but an
// error has invalidated the capture sequence."
TEST_F(Emu, QueryingOrSynchronisingACapturingStreamInvalidatesTheCapture) {
  Pinned log(4);
  Stream st(cudaStreamNonBlocking);
  for (int sync = 0; sync < 2; sync++) {
    CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
    CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, 1));
    EXPECT_EQ(sync ? cudaStreamSynchronize(st.s) : cudaStreamQuery(st.s),
              cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDA_OK(cudaStreamIsCapturing(st.s, &status));
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(launch(append_kernel, 1, 1, st.s, log.p, 2), cudaErrorStreamCaptureInvalidated)
        << "work into an invalidated capture";
    EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  }
  // the stream works again, and nothing captured ran
  CUDA_OK(launch(append_kernel, 1, 1, st.s, log.p, 3));
  CUDA_OK(cudaStreamSynchronize(st.s));
  ASSERT_EQ(log.p[0], 1);
  EXPECT_EQ(log.p[1], 3);
}

// driver_types.h: cudaErrorCapturedEvent "The operation is not permitted on
// an event which was last recorded in a capturing stream."; cudaErrorStreamCaptureIsolation
// "A dependency would have been created which crosses the capture sequence
// boundary."
TEST_F(Emu, EventsOfACaptureAreNotQueriedAndOutsideEventsAreNotWaitedOn) {
  Stream st(cudaStreamNonBlocking), other(cudaStreamNonBlocking);
  cudaEvent_t inside, outside;
  CUDA_OK(cudaEventCreateWithFlags(&inside, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&outside, cudaEventDisableTiming));
  for (int sync = 0; sync < 2; sync++) {
    CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaEventRecord(inside, st.s));
    CUDA_OK(cudaStreamWaitEvent(st.s, inside, 0));  // an event of the same capture
    EXPECT_EQ(sync ? cudaEventSynchronize(inside) : cudaEventQuery(inside), cudaErrorCapturedEvent);
    EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  }
  CUDA_OK(cudaEventQuery(inside));  // after the capture: as if never recorded
  CUDA_OK(zpp_emu_stream_hold(other.s));
  CUDA_OK(cudaEventRecord(outside, other.s));
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  EXPECT_EQ(cudaStreamWaitEvent(st.s, outside, 0), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  CUDA_OK(zpp_emu_stream_release(other.s));
  CUDA_OK(cudaStreamSynchronize(other.s));
  cudaEventDestroy(inside);
  cudaEventDestroy(outside);
}

// cuda_runtime_api.h, cudaThreadExchangeStreamCaptureMode:
// "cudaStreamCaptureModeGlobal: This is the default mode. If the local
// thread has an ongoing capture sequence that was not initiated with
// cudaStreamCaptureModeRelaxed at cuStreamBeginCapture, or if any other
// thread has a concurrent capture sequence initiated with
// cudaStreamCaptureModeGlobal, this thread is prohibited from potentially
// unsafe API calls."; "cudaStreamCaptureModeThreadLocal: If the local
// thread has an ongoing capture sequence not initiated with
// cudaStreamCaptureModeRelaxed, it is prohibited from potentially unsafe API
// calls. Concurrent capture sequences in other threads are ignored.";
// "cudaStreamCaptureModeRelaxed: The local thread is not prohibited from
// potentially unsafe API calls."  cudaMalloc is the header's example;
// cudaMallocHost, cudaFree and the synchronous copy are the others.
TEST_F(Emu, PotentiallyUnsafeCallsDuringACaptureFollowTheThreadsMode) {
  Stream st(cudaStreamNonBlocking);
  auto malloc_free = [] {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, 64);
    if (e == cudaSuccess) e = cudaFree(p);
    (void)cudaGetLastError();
    return e;
  };
  auto on_thread = [](cudaStreamCaptureMode mode, const std::function<cudaError_t()> &f) {
    cudaError_t e = cudaErrorUnknown;
    std::thread([&] {
      cudaStreamCaptureMode m = mode;
      if (cudaThreadExchangeStreamCaptureMode(&m) == cudaSuccess) e = f();
    }).join();
    return e;
  };
  // this thread's own Global capture
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  EXPECT_EQ(malloc_free(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  // another thread's Global capture prohibits this thread in Global mode,
  // not in ThreadLocal or Relaxed mode
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  EXPECT_EQ(on_thread(cudaStreamCaptureModeThreadLocal, malloc_free), cudaSuccess);
  EXPECT_EQ(on_thread(cudaStreamCaptureModeRelaxed, malloc_free), cudaSuccess);
  EXPECT_EQ(end_capture(st.s), cudaSuccess);
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  EXPECT_EQ(on_thread(cudaStreamCaptureModeGlobal, malloc_free), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  // a ThreadLocal capture prohibits only its own thread
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(on_thread(cudaStreamCaptureModeGlobal, malloc_free), cudaSuccess);
  EXPECT_EQ(end_capture(st.s), cudaSuccess);
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  int *h = nullptr;
  EXPECT_EQ(cudaMallocHost(&h, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  // a Relaxed capture prohibits nothing
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeRelaxed));
  EXPECT_EQ(malloc_free(), cudaSuccess);
  EXPECT_EQ(end_capture(st.s), cudaSuccess);
  // the synchronous copy
  int *d = nullptr, x = 5;
  CUDA_OK(cudaMalloc(&d, sizeof x));
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  EXPECT_EQ(cudaMemcpy(d, &x, sizeof x, cudaMemcpyHostToDevice), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(st.s), cudaErrorStreamCaptureInvalidated);
  CUDA_OK(cudaFree(d));
}

// cuda_runtime_api.h, cudaStreamIsCapturing: "if this is called on
// ::cudaStreamLegacy (the "null stream") while a blocking stream on the same
// device is capturing, it will return ::cudaErrorStreamCaptureImplicit ...
// The blocking stream capture is not invalidated. When a blocking stream is
// capturing, the legacy stream is in an unusable state until the blocking
// stream capture is terminated."; driver_types.h,
// cudaErrorStreamCaptureImplicit: "The operation would have resulted in a
// disallowed implicit dependency on a current capture sequence from
// cudaStreamLegacy."
TEST_F(Emu, TheLegacyStreamIsUnusableWhileABlockingStreamCaptures) {
  Pinned out;
  Stream blocking(cudaStreamDefault), nonblocking(cudaStreamNonBlocking);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_OK(cudaStreamBeginCapture(blocking.s, cudaStreamCaptureModeRelaxed));
  EXPECT_EQ(cudaStreamIsCapturing(0, &status), cudaErrorStreamCaptureImplicit);
  CUDA_OK(cudaStreamIsCapturing(blocking.s, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusActive) << "invalidated by the query";
  EXPECT_EQ(launch(store_kernel, 1, 1, 0, out.p, 1), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(end_capture(blocking.s), cudaErrorStreamCaptureInvalidated);
  // a non-blocking stream's capture leaves the legacy stream alone
  CUDA_OK(cudaStreamBeginCapture(nonblocking.s, cudaStreamCaptureModeRelaxed));
  CUDA_OK(launch(store_kernel, 1, 1, 0, out.p, 2));
  CUDA_OK(cudaStreamSynchronize(0));
  EXPECT_EQ(*out.p, 2);
  EXPECT_EQ(end_capture(nonblocking.s), cudaSuccess);
}

// cuda_runtime_api.h, cudaStreamEndCapture: "If the \p mode argument to
// ::cudaStreamBeginCapture was not ::cudaStreamCaptureModeRelaxed, this call
// must be from the same thread as ::cudaStreamBeginCapture."; cudaStreamGetCaptureInfo:
// "an id for the capture sequence, which is unique over the lifetime of the
// process"
TEST_F(Emu, ACaptureEndsOnItsThreadUnlessRelaxedAndHasAUniqueId) {
  Stream st(cudaStreamNonBlocking);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id1 = 0, id2 = 0;
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal));
  CUDA_OK(cudaStreamGetCaptureInfo(st.s, &status, &id1, &g));
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  EXPECT_NE(g, nullptr);
  cudaError_t other = cudaErrorUnknown;
  std::thread([&] { other = end_capture(st.s); }).join();
  EXPECT_EQ(other, cudaErrorStreamCaptureWrongThread);
  EXPECT_EQ(end_capture(st.s), cudaSuccess);
  CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeRelaxed));
  CUDA_OK(cudaStreamGetCaptureInfo(st.s, &status, &id2));
  EXPECT_NE(id1, id2);
  std::thread([&] { other = end_capture(st.s); }).join();
  EXPECT_EQ(other, cudaSuccess);
  CUDA_OK(cudaStreamGetCaptureInfo(st.s, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
}

// ---- driver entry points ------------------------------------------------------------------

// The driver functions as a caller without cuda.h types them: CUresult as
// int, CUstream as cudaStream_t, CUdeviceptr as unsigned long long.
using WaitValue32Fn = int (*)(cudaStream_t, unsigned long long, uint32_t, unsigned);
using WriteValue32Fn = int (*)(cudaStream_t, unsigned long long, uint32_t, unsigned);
using PrimaryCtxGetStateFn = int (*)(int, unsigned *, int *);

// cuda.h, enum CUstreamWaitValue_flags_enum and CUstreamWriteValue_flags_enum
constexpr unsigned kWaitGeq = 0x0, kWaitEq = 0x1, kWaitAnd = 0x2, kWaitNor = 0x3,
                   kWaitFlush = 1u << 30, kWriteNoMemoryBarrier = 0x1;
// cuda.h, enum cudaError_enum
constexpr int kCuSuccess = 0, kCuInvalidValue = 1, kCuInvalidDevice = 101, kCuNotSupported = 801;

template <typename Fn> Fn driver_fn(const char *symbol) {
  void *p = nullptr;
  cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &r) != cudaSuccess ||
      r != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(p);
}

// cuda_runtime_api.h, cudaGetDriverEntryPointByVersion: "The API will
// return ::cudaSuccess and set the returned \p funcPtr to NULL if the
// requested driver function is not supported on the platform, no ABI
// compatible driver function exists for the requested version or if the
// driver symbol is invalid." and "If the specified CUDA version is greater
// than the driver version, the API will return ::cudaErrorInvalidValue."
TEST_F(Emu, DriverEntryPointsAreFoundByNameAndVersion) {
  for (const char *sym :
       {"cuStreamWaitValue32", "cuStreamWriteValue32", "cuDevicePrimaryCtxGetState"}) {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
    CUDA_OK(cudaGetDriverEntryPointByVersion(sym, &p, 12000, cudaEnableDefault, &r));
    EXPECT_EQ(r, cudaDriverEntryPointSuccess) << sym;
    EXPECT_NE(p, nullptr) << sym;
  }
  void *p = &p;
  cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSuccess;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &p, 12000, cudaEnableDefault, &r));
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(r, cudaDriverEntryPointSymbolNotFound);
  p = &p;
  CUDA_OK(
      cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 11000, cudaEnableDefault, &r));
  EXPECT_EQ(p, nullptr) << "the _v2 function exists since CUDA 11.7";
  EXPECT_EQ(r, cudaDriverEntryPointVersionNotSufficent);
  EXPECT_EQ(
      cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 99000, cudaEnableDefault, &r),
      cudaErrorInvalidValue)
      << "a version above the driver's";
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(nullptr, &p, 12000, cudaEnableDefault, &r),
            cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

// cuda.h, cuStreamWaitValue32: "Work ordered after the operation will block
// until the given condition on the memory is satisfied. By default, the
// condition is to wait for (int32_t)(*addr - value) >= 0, a cyclic
// greater-or-equal."; cuStreamWriteValue32 writes in stream order, after
// "a memory fence before the write" (CU_STREAM_WRITE_VALUE_DEFAULT).
TEST_F(Emu, StreamWaitValueHoldsLaterWorkUntilTheHostWritesTheWord) {
  auto wait = driver_fn<WaitValue32Fn>("cuStreamWaitValue32");
  ASSERT_NE(wait, nullptr);
  Pinned flag, out;
  Stream st(cudaStreamNonBlocking);
  CUDA_OK(zpp_emu_stream_hold(st.s));  // nothing runs before the checks below
  ASSERT_EQ(wait(st.s, (unsigned long long)flag.p, 5, kWaitGeq), kCuSuccess);
  CUDA_OK(launch(store_kernel, 1, 1, st.s, out.p, 7));
  CUDA_OK(zpp_emu_stream_release(st.s));
  unsigned old = zpp_emu_set_delay_us(0);
  __atomic_store_n(flag.p, 4, __ATOMIC_RELEASE);
  // time for the stream to run early if it would: it must not
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady);
  EXPECT_EQ(__atomic_load_n(out.p, __ATOMIC_ACQUIRE), 0) << "ran before the word reached 5";
  (void)cudaGetLastError();
  __atomic_store_n(flag.p, 5, __ATOMIC_RELEASE);
  CUDA_OK(cudaStreamSynchronize(st.s));
  zpp_emu_set_delay_us(old);
  EXPECT_EQ(*out.p, 7);
}

// The four conditions of cuda.h (CUstreamWaitValue_flags): GEQ
// "(int32_t)(*addr - value) >= 0 ... a cyclic comparison which ignores
// wraparound", EQ "*addr == value", AND "(*addr & value) != 0", NOR
// "~(*addr | value) != 0", each against a reference in 64-bit arithmetic
// on random words.
TEST_F(Emu, StreamWaitValueConditionsFollowCudaH) {
  auto wait = driver_fn<WaitValue32Fn>("cuStreamWaitValue32");
  ASSERT_NE(wait, nullptr);
  uint64_t seed = test_seed();
  std::printf("[ seed ] Emu wait value: ZPP_TEST_SEED=%llu\n", (unsigned long long)seed);
  std::mt19937 rng((unsigned)seed);
  auto reference = [](uint32_t w, uint32_t v, unsigned f) {
    uint64_t diff = ((uint64_t)w + (1ull << 32) - v) % (1ull << 32);
    switch (f) {
    case kWaitGeq:
      return diff < (1ull << 31);
    case kWaitEq:
      return w == v;
    case kWaitAnd:
      return ((uint64_t)w & v) != 0;
    default:
      return (~((uint64_t)w | v) & 0xffffffffull) != 0;
    }
  };
  Pinned word;
  Stream st(cudaStreamNonBlocking);
  unsigned old = zpp_emu_set_delay_us(0);
  unsigned old_timeout = zpp_emu_set_timeout_s(10);  // a wrong condition fails, not hangs
  int held = 0, passed = 0;
  for (int i = 0; i < 64; i++) {
    unsigned f = (unsigned)i % 4;
    uint32_t w = rng(), v = rng();
    if (i % 8 < 4) v = w + (uint32_t)(rng() % 5) - 2;  // near w, wraparound included
    if (i % 16 == 3) w = 0xffffffffu;                  // NOR holds for no value
    *(volatile uint32_t *)word.p = w;
    ASSERT_EQ(wait(st.s, (unsigned long long)word.p, v, f), kCuSuccess);
    if (reference(w, v, f)) {
      passed++;
      ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess)
          << "flags " << f << " w " << w << " v " << v;
      continue;
    }
    held++;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady)
        << "flags " << f << " word " << w << " value " << v << ": passed";
    (void)cudaGetLastError();
    // a word that satisfies it: v itself for GEQ and EQ, all ones for AND,
    // zero for NOR
    uint32_t ok = f == kWaitAnd ? 0xffffffffu : f == kWaitNor ? 0u : v;
    ASSERT_TRUE(reference(ok, v, f));
    __atomic_store_n((uint32_t *)word.p, ok, __ATOMIC_RELEASE);
    ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  }
  zpp_emu_set_delay_us(old);
  zpp_emu_set_timeout_s(old_timeout);
  EXPECT_GT(held, 8);
  EXPECT_GT(passed, 8);
}

TEST_F(Emu, StreamWriteValueOrdersAStreamWaitingOnDeviceMemory) {
  auto wait = driver_fn<WaitValue32Fn>("cuStreamWaitValue32");
  auto write = driver_fn<WriteValue32Fn>("cuStreamWriteValue32");
  ASSERT_NE(wait, nullptr);
  ASSERT_NE(write, nullptr);
  Pinned log(8), done;
  uint32_t *word = nullptr;
  CUDA_OK(cudaMalloc(&word, sizeof *word));
  CUDA_OK(cudaMemset(word, 0, sizeof *word));
  CUDA_OK(cudaDeviceSynchronize());
  Stream a(cudaStreamNonBlocking), b(cudaStreamNonBlocking);
  // b: wait for the word, then append 2; a: append 1, then write the word
  ASSERT_EQ(wait(b.s, (unsigned long long)word, 1, kWaitEq), kCuSuccess);
  CUDA_OK(launch(append_kernel, 1, 1, b.s, log.p, 2));
  CUDA_OK(zpp_emu_stream_hold(a.s));
  CUDA_OK(launch(append_kernel, 1, 1, a.s, log.p, 1));
  ASSERT_EQ(write(a.s, (unsigned long long)word, 1, 0), kCuSuccess);
  // and a pinned word written in stream order, after the kernel
  ASSERT_EQ(write(a.s, (unsigned long long)done.p, 9, 0), kCuSuccess);
  EXPECT_EQ(cudaStreamQuery(b.s), cudaErrorNotReady);
  EXPECT_EQ(*(volatile int *)done.p, 0);
  (void)cudaGetLastError();
  CUDA_OK(zpp_emu_stream_release(a.s));
  CUDA_OK(cudaStreamSynchronize(b.s));
  CUDA_OK(cudaStreamSynchronize(a.s));
  ASSERT_EQ(log.p[0], 2);
  EXPECT_EQ(log.p[1], 1);
  EXPECT_EQ(log.p[2], 2);
  EXPECT_EQ(*done.p, 9);
  CUDA_OK(cudaFree(word));
}

// cuda.h: "None of the operations accepts pointers to managed memory
// buffers"; "all memory pointers passed as parameters to these operations
// are device pointers" (pageable memory is none); CU_STREAM_WAIT_VALUE_FLUSH
// "is restricted to selected platforms" (not the emulated ones);
// CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER: "This flag is not supported in
// the v2 API".
TEST_F(Emu, StreamMemoryOperationsRejectWhatCudaHRejects) {
  auto wait = driver_fn<WaitValue32Fn>("cuStreamWaitValue32");
  auto write = driver_fn<WriteValue32Fn>("cuStreamWriteValue32");
  ASSERT_NE(wait, nullptr);
  ASSERT_NE(write, nullptr);
  uint32_t pageable = 0;
  void *managed = nullptr;
  CUDA_OK(cudaMallocManaged(&managed, 64));
  Pinned ok;
  EXPECT_EQ(wait(0, (unsigned long long)&pageable, 0, kWaitGeq), kCuInvalidValue);
  EXPECT_EQ(write(0, (unsigned long long)&pageable, 0, 0), kCuInvalidValue);
  EXPECT_EQ(wait(0, (unsigned long long)managed, 0, kWaitGeq), kCuInvalidValue);
  EXPECT_EQ(write(0, (unsigned long long)managed, 0, 0), kCuInvalidValue);
  EXPECT_EQ(wait(0, (unsigned long long)ok.p, 0, kWaitGeq | kWaitFlush), kCuNotSupported);
  EXPECT_EQ(write(0, (unsigned long long)ok.p, 0, kWriteNoMemoryBarrier), kCuNotSupported);
  EXPECT_EQ(wait(0, (unsigned long long)ok.p, 0, 0x7), kCuInvalidValue);
  CUDA_OK(cudaFree(managed));
}

// A GPU waits forever for a word nobody writes; the emulator bounds the
// wait by ZPP_EMU_TIMEOUT_S and then fails the device (sticky
// cudaErrorTimeout), so a test that forgot the write fails instead of
// hanging.
TEST_F(Emu, AStreamWaitValueNeverSatisfiedFailsTheDeviceAfterTheTimeout) {
  auto wait = driver_fn<WaitValue32Fn>("cuStreamWaitValue32");
  ASSERT_NE(wait, nullptr);
  CUDA_OK(cudaSetDevice(5));
  Pinned word, out;
  Stream st(cudaStreamNonBlocking);
  unsigned old = zpp_emu_set_timeout_s(1);
  ASSERT_EQ(wait(st.s, (unsigned long long)word.p, 1, kWaitEq), kCuSuccess);
  CUDA_OK(launch(store_kernel, 1, 1, st.s, out.p, 3));
  EXPECT_EQ(cudaStreamSynchronize(st.s), cudaErrorTimeout);
  zpp_emu_set_timeout_s(old);
  EXPECT_EQ(cudaStreamSynchronize(st.s), cudaErrorTimeout) << "sticky";
  EXPECT_NE(std::string(zpp_emu_last_fault()).find("cuStreamWaitValue32"), std::string::npos)
      << zpp_emu_last_fault();
  EXPECT_EQ(*out.p, 0) << "the work after the wait ran";
}

// cuda_runtime_api.h, cudaHostGetDevicePointer: "If all devices visible to
// the application have a non-zero value for the device attribute, the
// device pointer returned by ::cudaHostGetDevicePointer() will match the
// original pointer \p pHost."; "\p flags provides for future releases.
// For now, it must be set to 0."
TEST_F(Emu, TheDevicePointerOfPinnedMemoryIsItsHostPointer) {
  Pinned h(4);
  void *d = nullptr;
  CUDA_OK(cudaHostGetDevicePointer(&d, h.p + 1, 0));
  EXPECT_EQ(d, (void *)(h.p + 1));
  int pageable = 0;
  EXPECT_EQ(cudaHostGetDevicePointer(&d, &pageable, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaHostGetDevicePointer(&d, h.p, 1), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

// cuda_runtime_api.h, cudaGetDriverEntryPointByVersion,
// cudaEnablePerThreadDefaultStream: "This will enable the search for all
// driver symbols that match the requested driver symbol name including the
// per-thread versions."  In a per-thread version, stream 0 is the calling
// thread's per-thread default stream.
TEST_F(Emu, PerThreadDriverEntryPointsTakeStream0AsThePerThreadStream) {
  void *p = nullptr;
  cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 12000,
                                           cudaEnablePerThreadDefaultStream, &r));
  ASSERT_EQ(r, cudaDriverEntryPointSuccess);
  auto write_ptsz = reinterpret_cast<WriteValue32Fn>(p);
  auto write = driver_fn<WriteValue32Fn>("cuStreamWriteValue32");
  ASSERT_NE(write, nullptr);
  EXPECT_NE((void *)write, p);
  Pinned w(2);
  CUDA_OK(zpp_emu_stream_hold(0));  // the legacy stream (empty: nothing waits for it)
  ASSERT_EQ(write_ptsz(0, (unsigned long long)w.p, 5, 0), kCuSuccess);
  CUDA_OK(cudaStreamSynchronize(cudaStreamPerThread));
  EXPECT_EQ(w.p[0], 5) << "the _ptsz write went to the legacy stream";
  ASSERT_EQ(write(0, (unsigned long long)(w.p + 1), 6, 0), kCuSuccess);
  EXPECT_EQ(cudaStreamQuery(0), cudaErrorNotReady);
  EXPECT_EQ(*(volatile int *)(w.p + 1), 0);
  (void)cudaGetLastError();
  CUDA_OK(zpp_emu_stream_release(0));
  CUDA_OK(cudaStreamSynchronize(0));
  EXPECT_EQ(w.p[1], 6);
  // a function with no per-thread variant: the legacy one
  CUDA_OK(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &p, 12000,
                                           cudaEnablePerThreadDefaultStream, &r));
  EXPECT_EQ(p, (void *)driver_fn<PrimaryCtxGetStateFn>("cuDevicePrimaryCtxGetState"));
}

// ---- primary contexts ------------------------------------------------------------------

bool driver_says_active(int device) {
  auto get = driver_fn<PrimaryCtxGetStateFn>("cuDevicePrimaryCtxGetState");
  unsigned flags = 99;
  int active = -1;
  if (get == nullptr || get(device, &flags, &active) != kCuSuccess) return false;
  return active == 1;
}

// cuda_runtime_api.h, cudaSetDevice: "This function will also immediately
// initialize the runtime state on the primary context, and the context will
// be current on \p device immediately."; the CUDA Runtime API,
// "Interactions with the CUDA Driver API": "If no CUcontext is current to
// the calling thread when a CUDA Runtime API call which requires an active
// context is made, then the primary context for a device will be selected,
// made current to the calling thread, and initialized." (the thread's
// device, 0 until it sets one: cudaGetDevice answers 0 on a new thread)
TEST_F(Emu, AThreadThatWorksOnlyOnDevice3LeavesDevice0WithoutAContext) {
  zpp_emu_reset_contexts();
  std::thread t([] {
    int d = -1;
    cudaGetDevice(&d);  // needs no context
    cudaSetDevice(3);
    int *p = nullptr;
    cudaStream_t s = nullptr;
    cudaEvent_t ev = nullptr;
    cudaPointerAttributes a;
    cudaMalloc(&p, 64);
    cudaStreamCreate(&s);
    cudaEventCreate(&ev);
    launch(store_kernel, 1, 1, s, p, 1);
    cudaEventRecord(ev, s);
    cudaEventSynchronize(ev);
    cudaPointerGetAttributes(&a, p);
    cudaStreamSynchronize(s);
    cudaFree(p);
    cudaEventDestroy(ev);
    cudaStreamDestroy(s);
  });
  t.join();
  EXPECT_EQ(zpp_emu_context_active(0), 0);
  EXPECT_FALSE(driver_says_active(0));
  EXPECT_EQ(zpp_emu_context_active(3), 1);
  EXPECT_TRUE(driver_says_active(3));
  unsigned flags = 0;
  int active = 0;
  auto get = driver_fn<PrimaryCtxGetStateFn>("cuDevicePrimaryCtxGetState");
  ASSERT_NE(get, nullptr);
  EXPECT_EQ(get(99, &flags, &active), kCuInvalidDevice);
  EXPECT_EQ(get(0, nullptr, &active), kCuInvalidValue);
}

TEST_F(Emu, SetDeviceInitialisesTheContextGetDeviceDoesNot) {
  zpp_emu_reset_contexts();
  std::thread([] { cudaSetDevice(5); }).join();
  EXPECT_EQ(zpp_emu_context_active(5), 1) << "cudaSetDevice initialises at once";
  EXPECT_EQ(zpp_emu_context_active(0), 0);
  // Calls on a thread that never set a device: device queries need no
  // context, work does (on device 0).
  std::thread([] {
    int d = -1, n = 0;
    char id[32];
    void *p = nullptr;
    cudaGetDevice(&d);
    cudaGetDeviceCount(&n);
    cudaDeviceGetPCIBusId(id, sizeof id, 2);
    cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault);
    (void)cudaGetLastError();
  }).join();
  EXPECT_EQ(zpp_emu_context_active(0), 0);
  EXPECT_EQ(zpp_emu_context_active(2), 0);
  using Call = void (*)();
  const std::pair<const char *, Call> calls[] = {
      {"cudaFree(0)", [] { cudaFree(nullptr); }},
      {"cudaMalloc",
       [] {
         void *p = nullptr;
         if (cudaMalloc(&p, 4) == cudaSuccess) cudaFree(p);
       }},
      {"cudaMallocHost",
       [] {
         void *p = nullptr;
         if (cudaMallocHost(&p, 4) == cudaSuccess) cudaFreeHost(p);
       }},
      {"cudaStreamCreate",
       [] {
         cudaStream_t s = nullptr;
         if (cudaStreamCreate(&s) == cudaSuccess) cudaStreamDestroy(s);
       }},
      {"cudaEventCreate",
       [] {
         cudaEvent_t e = nullptr;
         if (cudaEventCreate(&e) == cudaSuccess) cudaEventDestroy(e);
       }},
      {"cudaLaunchKernelEx", [] { launch(axpb_kernel, 1, 1, 0, (int *)nullptr, (size_t)0, 0); }},
      {"cudaPointerGetAttributes",
       [] {
         int x = 0;
         cudaPointerAttributes a;
         cudaPointerGetAttributes(&a, &x);
       }},
      {"cudaDeviceSynchronize", [] { cudaDeviceSynchronize(); }},
  };
  for (const auto &c : calls) {
    zpp_emu_reset_contexts();
    std::thread(c.second).join();
    EXPECT_EQ(zpp_emu_context_active(0), 1) << c.first << " initialises device 0's context";
    EXPECT_EQ(zpp_emu_context_active(1), 0) << c.first;
  }
  CUDA_OK(cudaDeviceSynchronize());
}

// ---- test hooks -------------------------------------------------------------------------

TEST_F(Emu, ApiCallsAreCounted) {
  int x = 0;
  cudaPointerAttributes a;
  zpp_emu_reset_api_calls();
  for (int i = 0; i < 3; i++) CUDA_OK(cudaPointerGetAttributes(&a, &x));
  EXPECT_EQ(zpp_emu_api_calls("cudaPointerGetAttributes"), 3u);
  EXPECT_EQ(zpp_emu_api_calls("cudaMalloc"), 0u);
  EXPECT_EQ(zpp_emu_api_calls("noSuchFunction"), 0u);
  CUDA_OK(launch(axpb_kernel, 1, 1, 0, (int *)nullptr, (size_t)0, 0));
  EXPECT_EQ(zpp_emu_api_calls("cudaLaunchKernelEx"), 1u);
  CUDA_OK(cudaDeviceSynchronize());
}

TEST_F(Emu, CopiesAreLoggedInOrderEmptyOnesNot) {
  char *d = nullptr;
  char h[64] = {0};
  CUDA_OK(cudaMalloc((void **)&d, 64));
  zpp_emu_copy_log_clear();
  CUDA_OK(cudaMemcpy(d + 8, h, 16, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpyAsync(h + 4, d + 32, 8, cudaMemcpyDefault, 0));
  CUDA_OK(cudaMemcpy(d, h, 0, cudaMemcpyHostToDevice));  // not logged
  EXPECT_EQ(cudaMemcpy(d, h, 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  CUDA_OK(cudaDeviceSynchronize());
  zpp_emu_copy log[4] = {};
  ASSERT_EQ(zpp_emu_copy_log(log, 4), 2u);
  EXPECT_EQ(log[0].dst, (void *)(d + 8));
  EXPECT_EQ(log[0].src, (const void *)h);
  EXPECT_EQ(log[0].bytes, 16u);
  EXPECT_EQ(log[1].dst, (void *)(h + 4));
  EXPECT_EQ(log[1].src, (const void *)(d + 32));
  EXPECT_EQ(log[1].bytes, 8u);
  zpp_emu_copy_log_clear();
  EXPECT_EQ(zpp_emu_copy_log(log, 4), 0u);
  CUDA_OK(cudaFree(d));
}

// ---- cudaMemPoolSetAttribute: the size of the value -------------------------
//
// driver_types.h, cudaMemPoolAttr: each reuse attribute is documented
// "(value type = int)", the threshold and the watermarks "(value type =
// cuuint64_t)".  The int sits at the end of
// a page whose successor is unmapped: reading 8 bytes there faults.
TEST_F(Emu, APoolReuseAttributeReadsAnIntOnly) {
  const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  void *m = mmap(nullptr, 2 * pg, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(mprotect((char *)m + pg, pg, PROT_NONE), 0);
  int *v = reinterpret_cast<int *>((char *)m + pg - sizeof(int));
  cudaMemPool_t pool = nullptr;
  CUDA_OK(cudaDeviceGetDefaultMemPool(&pool, 0));
  for (cudaMemPoolAttr a : {cudaMemPoolReuseFollowEventDependencies,
                            cudaMemPoolReuseAllowOpportunistic,
                            cudaMemPoolReuseAllowInternalDependencies}) {
    int old = -1, back = -1;
    CUDA_OK(cudaMemPoolGetAttribute(pool, a, &old));
    *v = !old;
    CUDA_OK(cudaMemPoolSetAttribute(pool, a, v));
    CUDA_OK(cudaMemPoolGetAttribute(pool, a, &back));
    EXPECT_EQ(back, !old) << "attribute " << (int)a;
    *v = old;
    CUDA_OK(cudaMemPoolSetAttribute(pool, a, v));
  }
  munmap(m, 2 * pg);
}

// ---- a misaligned access in host code while a grid runs elsewhere
// -------------
//
// zpp_emu_misaligned stops the CUDA thread that made the access; host code
// has none, so it dies with "outside a kernel", also while another thread
// of the process runs a grid (whose fibers are not the host thread's).

__global__ void spin_until_kernel(int *flag) {
  __atomic_store_n(&flag[1], 1, __ATOMIC_RELEASE); // started
  while (__atomic_load_n(&flag[0], __ATOMIC_ACQUIRE) == 0) {
  }
}

TEST_F(Emu, HostMisalignedAccessWhileAGridRunsElsewhereDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        int *flag = nullptr;
        if (cudaMallocManaged(&flag, 2 * sizeof(int)) != cudaSuccess)
          std::abort();
        flag[0] = flag[1] = 0;
        std::thread t([flag] {
          cudaSetDevice(0);
          launch(spin_until_kernel, 1, 1, nullptr, flag);
          cudaDeviceSynchronize();
        });
        for (int i = 0;
             i < 10000 && !__atomic_load_n(&flag[1], __ATOMIC_ACQUIRE); i++)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        alignas(8) unsigned char buf[16] = {};
        zpp_emu_misaligned(buf + 1, 4, "host load");
        __atomic_store_n(&flag[0], 1, __ATOMIC_RELEASE);
        t.join();
        std::exit(0);
      },
      "outside a kernel");
}

}  // namespace
