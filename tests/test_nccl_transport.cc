// zpp's NCCL transport (src/transport/transport_nccl.c) on the NCCL
// stand-in (tests/nccl_emu) and the emulated CUDA runtime, under mpirun
// with the layouts of tests/zpp_nccl_emu.cmake (ZPP_TOPO).  What the
// collectives' results alone do not show:
//   - which NCCL communicators a zpp communicator makes: WORLD, and NODE
//     and CROSS only where they are neither WORLD (same members, same
//     order) nor of one member, split from WORLD sharing its resources
//     (the stand-in's census, found with dlsym);
//   - that a reduction whose scratch grows frees and allocates it in
//     stream order, never with the device-synchronising cudaFree and
//     cudaMalloc (the emulator's call counters);
//   - that a call the stand-in keeps in progress ends in ZPP_ERR_TIMEOUT
//     after the communicator's timeout, not in a hang;
//   - that no NCCL communicator is called from two threads at once while a
//     caller enqueues and other threads wait and poll (the stand-in refuses
//     such a call, and every call dwells ZPP_NCCL_EMU_CALL_US in it).
// Every result is compared bit for bit with a reference computed here from
// every rank's inputs (integers: exact in any summation order).
//
// Seed: ZPP_TEST_SEED (default 20261129), printed by rank 0.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/core.h"
#include "cuda_runtime.h"
#include "nccl_emu/zpp_nccl_emu.h"
#include "scoped_env.h"
#include "transport/transport.h"
#include "xfer_blocking.h"
#include "zpp_cuda_emu.h"

namespace {

int g_rank = 0, g_size = 1;
uint64_t g_seed = 20261129ull;

// ---- the layout, from ZPP_TOPO, independently of src/topology/ ----------
struct Layout {
  std::vector<int> node_of;
  int nnodes = 1;
  int node_size(int n) const {
    return (int)std::count(node_of.begin(), node_of.end(), n);
  }
  int local_rank(int r) const {
    int l = 0;
    for (int q = 0; q < r; q++)
      l += node_of[q] == node_of[r];
    return l;
  }
};
Layout g_layout;

Layout make_layout(int size) {
  Layout L;
  L.node_of.assign(size, 0);
  const char *spec = std::getenv("ZPP_TOPO");
  if (spec && *spec) {
    std::string s(spec);
    size_t x = s.find_first_of("xX");
    if (x != std::string::npos) {
      int per = std::atoi(s.c_str() + x + 1);
      for (int r = 0; r < size; r++)
        L.node_of[r] = r / per;
    } else {
      size_t pos = 0;
      for (int r = 0; r < size; r++) {
        L.node_of[r] = std::atoi(s.c_str() + pos);
        pos = s.find(',', pos) + 1;
      }
    }
  }
  L.nnodes = *std::max_element(L.node_of.begin(), L.node_of.end()) + 1;
  return L;
}

// Members of group g seen from rank me, in group order: NODE by world
// rank, CROSS (my local rank on every node that has it) by node.
std::vector<int> members(zpp_group_t g, int me) {
  const Layout &L = g_layout;
  std::vector<int> m;
  if (g == ZPP_GROUP_WORLD) {
    for (int r = 0; r < g_size; r++)
      m.push_back(r);
  } else if (g == ZPP_GROUP_NODE) {
    for (int r = 0; r < g_size; r++)
      if (L.node_of[r] == L.node_of[me])
        m.push_back(r);
  } else {
    for (int n = 0; n < L.nnodes; n++)
      for (int r = 0; r < g_size; r++)
        if (L.node_of[r] == n && L.local_rank(r) == L.local_rank(me))
          m.push_back(r);
  }
  return m;
}

const zpp_group_t kGroups[] = {ZPP_GROUP_WORLD, ZPP_GROUP_NODE,
                               ZPP_GROUP_CROSS};

// The NCCL communicators a zpp communicator needs on this rank: WORLD; a
// group whose members are WORLD's in WORLD's order is served by WORLD; a
// group of one member here by local copies; any other by a communicator
// of its own.
int needed_communicators() {
  int n = 1;
  for (zpp_group_t g : {ZPP_GROUP_NODE, ZPP_GROUP_CROSS}) {
    std::vector<int> m = members(g, g_rank);
    bool world = (int)m.size() == g_size;
    for (int i = 0; world && i < g_size; i++)
      world = m[i] == i;
    n += !world && m.size() > 1;
  }
  return n;
}

// ---- the stand-in's hooks ------------------------------------------------
void *stand_in() {
  const char *lib = std::getenv("ZPP_NCCL_LIBRARY");
  return lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;
}
zpp_nccl_emu_census_fn census_hook() {
  void *h = stand_in();
  return h ? reinterpret_cast<zpp_nccl_emu_census_fn>(
                 dlsym(h, "zpp_nccl_emu_census"))
           : nullptr;
}
// A setting of the stand-in for one scope, through its hook (it reads the
// environment once); nothing where the library is not the stand-in.
struct EmuSetting {
  zpp_nccl_emu_set_fn set = nullptr;
  std::string name;
  EmuSetting(const char *n, const char *v) : name(n) {
    void *h = stand_in();
    set =
        h ? reinterpret_cast<zpp_nccl_emu_set_fn>(dlsym(h, "zpp_nccl_emu_set"))
          : nullptr;
    if (set != nullptr) {
      EXPECT_EQ(set(n, v), 0) << n;
    }
  }
  ~EmuSetting() {
    if (set != nullptr)
      set(name.c_str(), std::getenv(name.c_str()));
  }
  EmuSetting(const EmuSetting &) = delete;
  EmuSetting &operator=(const EmuSetting &) = delete;
};
using hold_fn = void (*)(int);
hold_fn hold_hook() {
  void *h = stand_in();
  return h ? reinterpret_cast<hold_fn>(dlsym(h, "zpp_nccl_emu_hold_issue"))
           : nullptr;
}

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
std::vector<uint8_t> bytes_of(uint64_t salt, int r, size_t n) {
  std::mt19937_64 g(g_seed * 1000003ull + salt * 131ull + (uint64_t)r);
  std::vector<uint8_t> v(n);
  for (auto &b : v)
    b = (uint8_t)g();
  return v;
}
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

// Every transport operation on every group, each result against the
// reference; salt makes each call's data its own.
void exact_ops(zpp_comm_t c, cudaStream_t s, uint64_t salt) {
  zpp_transport_t *t = zpp_comm_transport(c);
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    const int n = (int)m.size(),
              me = (int)(std::find(m.begin(), m.end(), g_rank) - m.begin());
    const std::string what =
        "group " + std::to_string((int)g) + " of " + std::to_string(n);
    const size_t B = 3001, count = 1001;
    Dev din(n * count * 4 + 64), dout(n * count * 4 + 64);
    // all-gather
    put(din.p, bytes_of(salt + g, g_rank, B).data(), B);
    ASSERT_EQ(blocking_allgather(t, g, din.p, B, dout.p, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
    sync(t, s);
    std::vector<uint8_t> got = get<uint8_t>(dout.p, n * B);
    for (int i = 0; i < n; i++)
      EXPECT_EQ(0, std::memcmp(got.data() + i * B,
                               bytes_of(salt + g, m[i], B).data(), B))
          << what << ": all-gather block of member " << i;
    // all-to-all
    put(din.p, bytes_of(salt + 10 + g, g_rank, n * B).data(), n * B);
    ASSERT_EQ(blocking_alltoall(t, g, din.p, B, dout.p, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
    sync(t, s);
    got = get<uint8_t>(dout.p, n * B);
    for (int i = 0; i < n; i++)
      EXPECT_EQ(0, std::memcmp(
                       got.data() + i * B,
                       bytes_of(salt + 10 + g, m[i], n * B).data() + me * B, B))
          << what << ": all-to-all block from member " << i;
    // reduce-scatter, fp32 and bf16
    std::vector<float> x = ints_of(salt + 20 + g, g_rank, n * count);
    put(din.p, x.data(), n * count * 4);
    ASSERT_EQ(blocking_reduce_scatter(t, g, din.p, dout.p, count, ZPP_FLOAT32,
                                      ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
    sync(t, s);
    std::vector<float> want(count, 0.0f);
    for (int r : m) {
      std::vector<float> xr = ints_of(salt + 20 + g, r, n * count);
      for (size_t e = 0; e < count; e++)
        want[e] += xr[me * count + e];
    }
    EXPECT_EQ(get<float>(dout.p, count), want)
        << what << ": fp32 reduce-scatter";
    std::vector<uint16_t> xb(n * count);
    for (size_t e = 0; e < xb.size(); e++)
      xb[e] = to_bf16(x[e]);
    put(din.p, xb.data(), n * count * 2);
    ASSERT_EQ(blocking_reduce_scatter(t, g, din.p, dout.p, count, ZPP_BFLOAT16,
                                      ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
    sync(t, s);
    std::vector<uint16_t> gb = get<uint16_t>(dout.p, count);
    int bad = 0;
    for (size_t e = 0; e < count; e++)
      bad += from_bf16(gb[e]) != want[e];
    EXPECT_EQ(bad, 0) << what << ": bf16 reduce-scatter";
    // all-reduce of count elements (padded when n does not divide it)
    x = ints_of(salt + 30 + g, g_rank, count);
    put(din.p, x.data(), count * 4);
    ASSERT_EQ(blocking_allreduce(t, g, din.p, dout.p, count, ZPP_FLOAT32,
                                 ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE, s),
              ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
    sync(t, s);
    std::fill(want.begin(), want.end(), 0.0f);
    for (int r : m) {
      std::vector<float> xr = ints_of(salt + 30 + g, r, count);
      for (size_t e = 0; e < count; e++)
        want[e] += xr[e];
    }
    EXPECT_EQ(get<float>(dout.p, count), want) << what << ": all-reduce";
    ASSERT_EQ(blocking_barrier(t, g), ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
  }
}

} // namespace

// One NCCL communicator owns resources per zpp communicator; NODE and
// CROSS are splits of it sharing them (WORLD's splitShare = 1 decides, as
// in NCCL), and only where needed: on
// one node NODE is WORLD and CROSS has one member; with one rank per node
// NODE has one member (the bug: every zpp communicator made three
// communicators, each with resources of its own).
TEST(NcclTransport, OneCommunicatorOwnsResourcesAndGroupsShareIt) {
  zpp_nccl_emu_census_fn census = census_hook();
  if (census == nullptr)
    GTEST_SKIP() << "ZPP_NCCL_LIBRARY is not the stand-in";
  int n0 = -1, o0 = -1, n1 = -1, o1 = -1;
  census(&n0, &o0);
  zpp_comm_t c = make_comm();
  ASSERT_NE(c, nullptr);
  census(&n1, &o1);
  EXPECT_EQ(n1 - n0, needed_communicators())
      << "communicators made by this rank";
  EXPECT_EQ(o1 - o0, 1) << "communicators owning resources";
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  exact_ops(c, s, 100);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK) << zpp_get_last_error();
  census(&n1, &o1);
  EXPECT_EQ(n1, n0) << "left after destroy";
  EXPECT_EQ(o1, o0);
}

// The reduction scratch (fp32 copies of 16-bit inputs, the accumulator,
// the all-reduce padding) grows with the requests: growing must not
// synchronise the device, so no cudaFree or cudaMalloc while the
// collectives run (the bug: both at every growth); it comes from zpp's
// scratch pool, leaving the application's current pool alone.
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
                async = zpp_emu_api_calls("cudaMallocAsync"),
                pooled = zpp_emu_api_calls("cudaMallocFromPoolAsync");
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
  // the scratch did grow (else the test proves nothing), from zpp's
  // scratch pool, not from the application's current pool
  EXPECT_GE(zpp_emu_api_calls("cudaMallocFromPoolAsync") - pooled, 5u);
  EXPECT_EQ(zpp_emu_api_calls("cudaMallocAsync") - async, 0u);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK) << zpp_get_last_error();
}

// A call that returns ncclInProgress and stays so (the stand-in's issuer
// held on every rank) ends after the communicator's timeout with
// ZPP_ERR_TIMEOUT and aborted communicators, not in a hang.
TEST(NcclTransport, ACallKeptInProgressTimesOut) {
  hold_fn hold = hold_hook();
  if (hold == nullptr)
    GTEST_SKIP() << "ZPP_NCCL_LIBRARY is not the stand-in";
  EmuSetting always("ZPP_NCCL_EMU_INPROGRESS", "1");
  zpp_comm_t c = make_comm(2.0);
  ASSERT_NE(c, nullptr);
  zpp_transport_t *t = zpp_comm_transport(c);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Dev din(64), dout(64 * (size_t)g_size);
  const zpp_group_t g = ZPP_GROUP_WORLD;
  MPI_Barrier(MPI_COMM_WORLD);
  hold(1);
  auto t0 = std::chrono::steady_clock::now();
  zpp_status_t st =
      blocking_allgather(t, g, din.p, 64, dout.p, ZPP_MEMORY_DEVICE, s);
  double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  hold(0);
  if (g_size > 1) {
    EXPECT_EQ(st, ZPP_ERR_TIMEOUT) << zpp_get_last_error();
    EXPECT_GE(took, 1.5);
    EXPECT_LT(took, 30.0);
    EXPECT_NE(std::string(zpp_get_last_error()).find("ZPP_TIMEOUT_S"),
              std::string::npos)
        << zpp_get_last_error();
  } else {
    EXPECT_EQ(st, ZPP_OK) << "one rank: a local copy, no NCCL call";
  }
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  MPI_Barrier(MPI_COMM_WORLD);
  zpp_comm_destroy(c);
}

// cudaStreamPerThread names the stream of the calling thread's current
// device: an operation on it while another device than the
// communicator's is current is refused, naming both devices, before
// anything is recorded on that stream.
TEST(NcclTransport, APerThreadStreamOperationOnAnotherDeviceIsRefused) {
  int ndev = 0;
  ASSERT_EQ(cudaGetDeviceCount(&ndev), cudaSuccess);
  if (ndev < 2)
    GTEST_SKIP() << "needs two devices";
  zpp_comm_t c = make_comm();
  ASSERT_NE(c, nullptr);
  zpp_transport_t *t = zpp_comm_transport(c);
  int dev = -1;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  Dev din(64), dout(64 * (size_t)g_size);
  const int other = (dev + 1) % ndev;
  ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
  zpp_status_t st =
      blocking_allgather(t, ZPP_GROUP_WORLD, din.p, 64, dout.p,
                         ZPP_MEMORY_DEVICE, (void *)cudaStreamPerThread);
  std::string msg = zpp_get_last_error();
  ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
  EXPECT_EQ(st, ZPP_ERR_INVALID_ARGUMENT) << msg;
  EXPECT_NE(msg.find("communicator's device is " + std::to_string(dev)),
            std::string::npos)
      << msg;
  // on the communicator's device the same call runs
  EXPECT_EQ(blocking_allgather(t, ZPP_GROUP_WORLD, din.p, 64, dout.p,
                               ZPP_MEMORY_DEVICE, (void *)cudaStreamPerThread),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK) << zpp_get_last_error();
}

// The caller starts collectives on device memory while another thread
// waits for the earlier ones (the wait polls the communicator's
// asynchronous error) and a third polls zpp_comm_get_async_error: no NCCL
// call overlaps another on one communicator (the stand-in would refuse it
// with ncclInvalidUsage, failing the collective), and every result is
// exact.
TEST(NcclTransport, NoCommunicatorIsCalledFromTwoThreadsAtOnce) {
  EmuSetting dwell("ZPP_NCCL_EMU_CALL_US", "300");
  zpp_comm_t c = make_comm();
  ASSERT_NE(c, nullptr);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const int rounds = 24;
  const size_t count = 777;
  std::vector<std::unique_ptr<Dev>> in, out;
  for (int k = 0; k < rounds; k++) {
    in.emplace_back(new Dev(count * 4 * (size_t)g_size));
    out.emplace_back(new Dev(count * 4 * (size_t)g_size));
    std::vector<float> x = ints_of(500 + k, g_rank, count * g_size);
    put(in.back()->p, x.data(), x.size() * 4);
  }
  std::vector<zpp_request_t> reqs(rounds, nullptr);
  std::atomic<int> started{0}, stop{0}, wait_failures{0}, poll_failures{0};
  std::thread waiter([&] {
    for (int k = 0; k < rounds; k++) {
      while (started.load() <= k)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (zpp_request_wait(reqs[k]) != ZPP_OK) {
        std::fprintf(stderr, "[rank %d] wait %d: %s\n", g_rank, k,
                     zpp_get_last_error());
        wait_failures++;
      }
    }
  });
  std::thread poller([&] {
    while (!stop.load()) {
      zpp_status_t as = ZPP_OK;
      if (zpp_comm_get_async_error(c, &as) != ZPP_OK || as != ZPP_OK)
        poll_failures++;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  for (int k = 0; k < rounds; k++) {
    zpp_status_t st =
        k % 2 ? zpp_allgather(c, in[k]->p, out[k]->p, count, ZPP_FLOAT32, s,
                              &reqs[k])
              : zpp_reduce_scatter(c, in[k]->p, out[k]->p, count, ZPP_FLOAT32,
                                   ZPP_OP_SUM, s, &reqs[k]);
    ASSERT_EQ(st, ZPP_OK) << "round " << k << ": " << zpp_get_last_error();
    started++;
  }
  waiter.join();
  stop = 1;
  poller.join();
  EXPECT_EQ(wait_failures.load(), 0);
  EXPECT_EQ(poll_failures.load(), 0);
  for (int k = 0; k < rounds; k++) {
    if (k % 2) {
      std::vector<float> got = get<float>(out[k]->p, count * g_size);
      for (int r = 0; r < g_size; r++) {
        std::vector<float> xr = ints_of(500 + k, r, count * g_size);
        xr.resize(count);
        EXPECT_EQ(std::vector<float>(got.begin() + r * count,
                                     got.begin() + (r + 1) * count),
                  xr)
            << "round " << k << ", block of rank " << r;
      }
    } else {
      std::vector<float> want(count, 0.0f);
      for (int r = 0; r < g_size; r++) {
        std::vector<float> xr = ints_of(500 + k, r, count * g_size);
        for (size_t e = 0; e < count; e++)
          want[e] += xr[g_rank * count + e];
      }
      EXPECT_EQ(get<float>(out[k]->p, count), want) << "round " << k;
    }
  }
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
  g_layout = make_layout(g_size);
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
