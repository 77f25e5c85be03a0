// zpp's NCCL transport (src/transport/transport_nccl.c) on the NCCL
// stand-in (tests/nccl_emu) and the emulated CUDA runtime, under mpirun
// with the layouts of tests/zpp_nccl_emu.cmake (ZPP_TOPO).  What the
// collectives' results alone do not show:
//   - that a reduction whose scratch grows frees and allocates it in
//     stream order, never with the device-synchronising cudaFree and
//     cudaMalloc (the emulator's call counters).
// Every result is compared bit for bit with a reference computed here from
// every rank's inputs (integers: exact in any summation order).
//
// Seed: ZPP_TEST_SEED (default 20261129), printed by rank 0.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/core.h"
#include "cuda_runtime.h"
#include "transport/transport.h"
#include "xfer_blocking.h"
#include "zpp_cuda_emu.h"

namespace {

int g_rank = 0, g_size = 1;
uint64_t g_seed = 20261129ull;

zpp_comm_t make_comm(double timeout_s = 120) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  cfg.backend = ZPP_BACKEND_NCCL;
  cfg.timeout_s = timeout_s;
  zpp_comm_t c = nullptr;
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  EXPECT_EQ(st, ZPP_OK) << zpp_get_last_error();
  return st == ZPP_OK ? c : nullptr;
}

// ---- data ----------------------------------------------------------------
// Integers in [-16, 16]: sums of up to 8 ranks are exact in fp32 and bf16.
std::vector<float> ints_of(uint64_t salt, int r, size_t n) {
  std::mt19937_64 g(g_seed * 1000003ull + salt * 131ull + (uint64_t)r);
  std::vector<float> v(n);
  for (auto &x : v)
    x = (float)((int)(g() % 33) - 16);
  return v;
}
uint16_t to_bf16(float f) { // exact for these integers
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Dev {
  void *p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
};

// Waits for stream s (bounded by the communicator's timeout): a transport
// operation on device memory is complete only then.
void sync(zpp_transport_t *t, cudaStream_t s) {
  ASSERT_EQ(zpp_transport_sync(t, s), ZPP_OK) << zpp_get_last_error();
}

void put(void *d, const void *h, size_t n) {
  ASSERT_EQ(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
}
template <class T> std::vector<T> get(const void *d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return h;
}

} // namespace

// The reduction scratch (fp32 copies of 16-bit inputs, the accumulator,
// the all-reduce padding) grows with the requests: growing must not
// synchronise the device, so no cudaFree or cudaMalloc while the
// collectives run (the bug: both at every growth).
TEST(NcclTransport, GrowingReductionsNeitherFreeNorAllocateSynchronously) {
  zpp_comm_t c = make_comm();
  ASSERT_NE(c, nullptr);
  zpp_transport_t *t = zpp_comm_transport(c);
  const zpp_group_t g = ZPP_GROUP_WORLD;
  const int n = g_size, me = g_rank;
  const size_t counts[] = {100, 1000, 5003, 30011, 120007};
  const size_t most = counts[4];
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Dev din((n * most + 1) * 4), dout((n * most + 1) * 4);
  unsigned long mallocs = zpp_emu_api_calls("cudaMalloc"),
                frees = zpp_emu_api_calls("cudaFree"),
                async = zpp_emu_api_calls("cudaMallocAsync");
  for (size_t count : counts) {
    // bf16 reduce-scatter: widened input (n * count floats), accumulator
    std::vector<float> x = ints_of(count, me, n * count);
    std::vector<uint16_t> xb(x.size());
    for (size_t e = 0; e < x.size(); e++)
      xb[e] = to_bf16(x[e]);
    put(din.p, xb.data(), xb.size() * 2);
    ASSERT_EQ(blocking_reduce_scatter(t, g, din.p, dout.p, count, ZPP_BFLOAT16,
                                      ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << zpp_comm_get_last_error(c);
    sync(t, s);
    std::vector<float> want(count, 0.0f);
    for (int r = 0; r < n; r++) {
      std::vector<float> xr = ints_of(count, r, n * count);
      for (size_t e = 0; e < count; e++)
        want[e] += xr[me * count + e];
    }
    std::vector<uint16_t> got = get<uint16_t>(dout.p, count);
    int bad = 0;
    for (size_t e = 0; e < count; e++)
      bad += from_bf16(got[e]) != want[e];
    EXPECT_EQ(bad, 0) << "bf16 reduce-scatter of " << count;
    // fp32 all-reduce of n * count + 1 elements: padded shards
    const size_t ac = n * count + (n > 1 ? 1 : 0);
    x = ints_of(count + 1, me, ac);
    put(din.p, x.data(), ac * 4);
    ASSERT_EQ(blocking_allreduce(t, g, din.p, dout.p, ac, ZPP_FLOAT32,
                                 ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << zpp_comm_get_last_error(c);
    sync(t, s);
    want.assign(ac, 0.0f);
    for (int r = 0; r < n; r++) {
      std::vector<float> xr = ints_of(count + 1, r, ac);
      for (size_t e = 0; e < ac; e++)
        want[e] += xr[e];
    }
    EXPECT_EQ(get<float>(dout.p, ac), want) << "fp32 all-reduce of " << ac;
  }
  EXPECT_EQ(zpp_emu_api_calls("cudaMalloc") - mallocs, 0u);
  EXPECT_EQ(zpp_emu_api_calls("cudaFree") - frees, 0u);
  // the scratch did grow (else the test proves nothing)
  EXPECT_GE(zpp_emu_api_calls("cudaMallocAsync") - async, 5u);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK) << zpp_get_last_error();
}

int main(int argc, char **argv) {
  int provided = 0, failed, any = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (const char *s = std::getenv("ZPP_TEST_SEED"))
    g_seed = std::strtoull(s, nullptr, 10);
  ::testing::InitGoogleTest(&argc, argv);
  if (g_rank == 0)
    std::printf("[ seed ] ZPP_TEST_SEED=%llu; %d ranks; ZPP_TOPO=%s\n",
                (unsigned long long)g_seed, g_size,
                std::getenv("ZPP_TOPO") ? std::getenv("ZPP_TOPO") : "");
  failed = RUN_ALL_TESTS() != 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
