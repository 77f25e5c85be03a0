// The contract of the emulated CUDA runtime (tests/cuda_emu): each rule it
// enforces has a test here that fails when the rule is not enforced.  The
// stand-in is worth something only if it rejects what the real runtime
// rejects and does not finish work early.  Waiting for "not done" uses
// zpp_emu_stream_hold, never timing, so the results are deterministic.
//
// Seed: ZPP_TEST_SEED (default 20261129), printed by the tests that use
// random data; the emulator prints its own delay seed (ZPP_EMU_SEED).
#include <gtest/gtest.h>

#include <chrono>

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
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
  EXPECT_EQ(cudaStreamSynchronize(st.s), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamEndCapture(st.s, &g));
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

}  // namespace
