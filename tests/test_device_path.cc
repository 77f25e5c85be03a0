// The device path's contract on the emulated CUDA runtime (tests/cuda_emu)
// and the NCCL stand-in (tests/nccl_emu), under mpirun: one test per
// device-path bug that the collectives' results alone would not show.  Each
// fails when its bug is put back (the bug is said per test).
//
//   b  a started collective is not done before the device ran it
//   e  when one rank cannot create its NCCL communicator (here: its
//      ZPP_NCCL_LIBRARY does not exist), every rank fails creation,
//      naming the rank, within the timeout, instead of waiting for it
//   c  work runs on the communicator's device, whatever the calling or
//      engine thread's current device, and the caller's device is restored
//   d  hpZ's secondary copy survives destroy while its gathers are queued
//      on a non-blocking stream (not freed on the legacy stream)
//   f  AUTO picks MPI staging, not NCCL, when ranks share a GPU
//   h  one pointer query per user buffer per collective, not two per kernel
//
// Which tests run is chosen by ZPP_TEST_CASE (see tests/device_path.cmake:
// each needs its own backend, devices and rank count).  Seed: ZPP_TEST_SEED.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <algorithm>
#include <functional>
#include <cstring>
#include <string>
#include <atomic>
#include <thread>
#include <unistd.h>
#include <memory>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "core/core.h"
#include "quant/quant.h"
#include "comm/comm.h"
#include "transport/transport.h"
#include "xfer_blocking.h"
#include "zpp_cuda_emu.h"

namespace {

int g_rank = 0, g_size = 1;

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

std::vector<float> gen(int r, size_t n, uint64_t tag) {
  std::mt19937_64 rng(seed() * 131ull + tag * 7ull + (uint64_t)r);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto &v : x) v = nd(rng);
  return x;
}

struct DevBuf {
  void *p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t b) : bytes(b) { EXPECT_EQ(cudaMalloc(&p, b), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  float *f() { return (float *)p; }
};

// timeout_s > 0: the communicator's own timeout (zpp reads ZPP_TIMEOUT_S,
// 60 in these tests, only once per process)
zpp_comm_t make_comm(zpp_backend_t be, int device, double timeout_s = 0) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  cfg.backend = be;
  cfg.cuda_device = device;
  cfg.timeout_s = timeout_s;
  zpp_comm_t c = nullptr;
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  EXPECT_EQ(st, ZPP_OK) << zpp_get_last_error();
  return st == ZPP_OK ? c : nullptr;
}

bool run_case(const char *name) {
  const char *c = std::getenv("ZPP_TEST_CASE");
  return c != nullptr && std::strstr(c, name) != nullptr;
}

// b: the request reports done only after the device ran the collective
// (the bug: a NCCL request marked done when enqueued).
TEST(DevicePath, RequestIsNotDoneBeforeTheDeviceRanIt) {
  if (!run_case("request")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_NCCL, -1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 1000;
  std::vector<float> x = gen(g_rank, n, 1), y(n * (size_t)g_size, -1.0f);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);
  zpp_request_t req = nullptr;
  ASSERT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, &req), ZPP_OK)
      << zpp_get_last_error();
  int done = -1;
  EXPECT_EQ(zpp_request_test(req, &done), ZPP_OK);
  EXPECT_EQ(done, 0) << "done while the stream holding the work is held";
  ASSERT_EQ(zpp_emu_stream_release(s), cudaSuccess);
  EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
  // after the wait the output is there without synchronising the stream
  ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int r = 0; r < g_size; r++) {
    std::vector<float> want = gen(r, n, 1);
    EXPECT_EQ(std::memcmp(&y[(size_t)r * n], want.data(), n * 4), 0)
        << "block of rank " << r;
  }
  cudaStreamDestroy(s);
  zpp_comm_destroy(comm);
}

// The NCCL transport's barrier runs on a non-blocking stream of its own:
// work held on a blocking stream of the caller's (as a framework's default
// stream may be) does not hold it up (on the legacy stream, as before,
// the barrier waited for that work: here until ZPP_TIMEOUT_S).
TEST(DevicePath, NcclBarrierDoesNotWaitForTheCallersStreams) {
  if (!run_case("barrier")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_NCCL, -1);
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);  // a blocking stream
  DevBuf d(1024);
  ASSERT_EQ(cudaMemsetAsync(d.p, 0, 1024, s), cudaSuccess);
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.p, 1, 1024, s), cudaSuccess);  // held back
  EXPECT_EQ(blocking_barrier(zpp_comm_transport(comm), ZPP_GROUP_WORLD), ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the held work ran early";
  ASSERT_EQ(zpp_emu_stream_release(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  zpp_comm_destroy(comm);
}

// A device collective whose peer never comes: the wait returns
// ZPP_ERR_TIMEOUT and the NCCL communicators are aborted then, so the
// caller's stream drains (without the abort it held the stand-in's
// all-gather until the stand-in's own limit, ZPP_NCCL_EMU_TIMEOUT_S, set
// to 300 s here against the 20 s allowed below).
TEST(DevicePath, TimedOutDeviceWaitAbortsNcclSoTheStreamDrains) {
  if (!run_case("abort")) GTEST_SKIP() << "ZPP_TEST_CASE";
  ASSERT_EQ(g_size, 2);
  setenv("ZPP_TIMEOUT_S", "2", 1);
  zpp_comm_t comm = make_comm(ZPP_BACKEND_NCCL, -1);
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = 256;
  DevBuf dx(n * 4), dy(n * 4 * 2);
  if (g_rank == 0) {  // rank 1 never calls
    // queued: the call returns; the engine thread watches its event
    EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr), ZPP_OK)
        << zpp_get_last_error();
    auto t0 = std::chrono::steady_clock::now();
    cudaStreamSynchronize(s);  // the aborted work's status does not matter
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 20.0) << "the stream did not drain after the timeout";
    EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr), ZPP_ERR_TIMEOUT)
        << "a broken communicator must fail fast with its first error: "
        << zpp_get_last_error();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// Staged v-variants move only their blocks.  qgZ's all-to-alls leave the
// block to the rank itself empty, a gap no kernel wrote: staging copied the
// whole extent of the input (reading that gap: what compute-sanitizer
// initcheck reports on a GPU) and, to keep the output's gaps, read the
// whole output to host first.  Here every byte of the device buffers is
// accounted for from the emulator's copy log: each block byte of the input
// read once, each block byte of the output written once, no gap byte read
// or written, the output never read; adjacent blocks go as one copy; the
// output's gaps keep the caller's bytes and the blocks hold the peers'.
// The bug it catches: reads of the gaps and of the output.
struct Layout {
  std::vector<size_t> bytes, displs;  // displs empty: packed (NULL)
  size_t extent() const {
    size_t e = 0, acc = 0;
    for (size_t i = 0; i < bytes.size(); i++) {
      size_t o = displs.empty() ? acc : displs[i];
      e = std::max(e, o + bytes[i]);
      acc += bytes[i];
    }
    return e;
  }
  size_t off(size_t i) const {
    if (!displs.empty()) return displs[i];
    size_t acc = 0;
    for (size_t k = 0; k < i; k++) acc += bytes[k];
    return acc;
  }
  const size_t *d() const { return displs.empty() ? nullptr : displs.data(); }
};

// Block bytes from s to d: deterministic, of the seed.
std::vector<unsigned char> block_bytes(int s, int d, size_t n, uint64_t tag) {
  std::mt19937_64 rng(seed() * 977ull + tag * 31ull + (uint64_t)s * 7ull + (uint64_t)d);
  std::vector<unsigned char> v(n);
  for (auto &c : v) c = (unsigned char)(rng() & 0xff);
  return v;
}

// Checks the copy log against the device buffers: every byte of `in`'s
// blocks read exactly once and nothing else of `in` touched; every byte of
// `out`'s blocks written exactly once, nothing else of `out` written and
// nothing of it read.  Returns the number of copies that read `in`.
size_t check_copies(const DevBuf &in, const Layout &li, const DevBuf &out,
                    const Layout &lo, const char *what) {
  std::vector<zpp_emu_copy> log(4096);
  size_t nlog = zpp_emu_copy_log(log.data(), log.size());
  EXPECT_LE(nlog, log.size()) << what;
  log.resize(std::min(nlog, log.size()));
  auto inside = [](const void *p, const DevBuf &b, size_t n) {
    auto a = (uintptr_t)p, lo = (uintptr_t)b.p;
    return a < lo + b.bytes && a + n > lo;
  };
  std::vector<int> rd(in.bytes, 0), wr(out.bytes, 0);
  size_t reads = 0;
  for (const auto &c : log) {
    if (inside(c.src, in, c.bytes)) {
      reads++;
      size_t o = (uintptr_t)c.src - (uintptr_t)in.p;
      for (size_t k = 0; k < c.bytes && o + k < in.bytes; k++) rd[o + k]++;
    }
    EXPECT_FALSE(inside(c.dst, in, c.bytes)) << what << ": a copy wrote the input";
    EXPECT_FALSE(inside(c.src, out, c.bytes))
        << what << ": a copy read the output (" << c.bytes << " bytes)";
    if (inside(c.dst, out, c.bytes)) {
      size_t o = (uintptr_t)c.dst - (uintptr_t)out.p;
      for (size_t k = 0; k < c.bytes && o + k < out.bytes; k++) wr[o + k]++;
    }
  }
  auto expect_blocks = [&](const std::vector<int> &cnt, const Layout &l, const char *dir) {
    std::vector<int> want(cnt.size(), 0);
    for (size_t i = 0; i < l.bytes.size(); i++)
      for (size_t k = 0; k < l.bytes[i]; k++) want[l.off(i) + k] = 1;
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < cnt.size(); k++)
      if (cnt[k] != want[k] && bad++ == 0) first = k;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " byte(s) of the " << dir
                       << " copied a wrong number of times, the first at offset "
                       << first << " (" << cnt[first] << " times, block byte: " << want[first]
                       << ")";
  };
  expect_blocks(rd, li, "input");
  expect_blocks(wr, lo, "output");
  return reads;
}

// The output after the collective: gaps hold `fill`, block i holds
// expected(i).
void check_output(const DevBuf &out, const Layout &lo, unsigned char fill,
                  const std::function<std::vector<unsigned char>(int)> &expected,
                  const char *what) {
  std::vector<unsigned char> y(out.bytes), want(out.bytes, fill);
  ASSERT_EQ(cudaMemcpy(y.data(), out.p, y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < lo.bytes.size(); i++) {
    std::vector<unsigned char> b = expected((int)i);
    std::memcpy(&want[lo.off(i)], b.data(), b.size());
  }
  size_t bad = 0, first = 0;
  for (size_t k = 0; k < y.size(); k++)
    if (y[k] != want[k] && bad++ == 0) first = k;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " wrong byte(s), the first at offset "
                     << first;
}

TEST(DevicePath, StagedVariantsMoveOnlyTheirBlocks) {
  if (!run_case("vblocks")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1);
  ASSERT_NE(comm, nullptr);
  zpp_transport_t *t = zpp_comm_transport(comm);
  const int n = g_size, me = g_rank;
  const unsigned char fill = 0x5a;
  // bytes from s to d; self: 0 (qgZ's layout) or not, adjacent to the next
  for (int self_empty = 1; self_empty >= 0; self_empty--) {
    auto len = [&](int s, int d) -> size_t {
      return s == d ? (self_empty ? 0 : 4 * (size_t)(24 + s)) : 4 * (size_t)(40 + 11 * s + 5 * d);
    };
    Layout ls, lr;
    for (int j = 0; j < n; j++) {
      ls.bytes.push_back(len(me, j));
      lr.bytes.push_back(len(j, me));
    }
    if (self_empty) {
      // send blocks in reverse member order with 64-byte gaps; the empty
      // self block's displacement inside a gap
      size_t o = 64;
      ls.displs.assign(n, 0);
      for (int j = n - 1; j >= 0; j--) {
        ls.displs[j] = o;
        o += ls.bytes[j] + 64;
      }
    }  // else packed: one run, one copy
    size_t o = 160;
    for (int j = 0; j < n; j++) {
      lr.displs.push_back(o);
      o += lr.bytes[j] + 96;
    }
    DevBuf in(ls.extent() + 64), out(lr.extent() + 32);
    for (int j = 0; j < n; j++) {  // the blocks only: the gaps stay unwritten
      std::vector<unsigned char> b = block_bytes(me, j, ls.bytes[j], 1);
      if (!b.empty()) {
        ASSERT_EQ(cudaMemcpy((char *)in.p + ls.off(j), b.data(), b.size(),
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
    }
    ASSERT_EQ(cudaMemset(out.p, fill, out.bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    zpp_emu_copy_log_clear();
    const char *what = self_empty ? "alltoallv, empty self block, gaps" : "alltoallv, packed input";
    ASSERT_EQ(blocking_alltoallv(t, ZPP_GROUP_WORLD, in.p, ls.bytes.data(), ls.d(), out.p,
                                      lr.bytes.data(), lr.d(), ZPP_MEMORY_DEVICE, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    size_t reads = check_copies(in, ls, out, lr, what);
    if (!self_empty) {
      EXPECT_EQ(reads, 1u) << what << ": adjacent blocks not copied as one";
    }
    check_output(out, lr, fill, [&](int i) { return block_bytes(i, me, len(i, me), 1); }, what);
  }
  // packed output (recv_displs NULL): one copy back
  {
    auto len = [](int s, int d) { return 4 * (size_t)(17 + 3 * s + 2 * d); };
    Layout ls, lr;
    for (int j = 0; j < n; j++) {
      ls.bytes.push_back(len(me, j));
      lr.bytes.push_back(len(j, me));
    }
    DevBuf in(ls.extent()), out(lr.extent());
    for (int j = 0; j < n; j++) {
      std::vector<unsigned char> b = block_bytes(me, j, ls.bytes[j], 3);
      ASSERT_EQ(cudaMemcpy((char *)in.p + ls.off(j), b.data(), b.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    zpp_emu_copy_log_clear();
    ASSERT_EQ(blocking_alltoallv(t, ZPP_GROUP_WORLD, in.p, ls.bytes.data(), nullptr, out.p,
                                      lr.bytes.data(), nullptr, ZPP_MEMORY_DEVICE, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    check_copies(in, ls, out, lr, "alltoallv, packed");
    std::vector<zpp_emu_copy> log(64);
    size_t nlog = zpp_emu_copy_log(log.data(), log.size()), writes = 0;
    for (size_t k = 0; k < std::min(nlog, log.size()); k++)
      writes += (uintptr_t)log[k].dst >= (uintptr_t)out.p &&
                (uintptr_t)log[k].dst < (uintptr_t)out.p + out.bytes;
    EXPECT_EQ(writes, 1u) << "alltoallv, packed: adjacent output blocks not copied back as one";
    check_output(out, lr, 0, [&](int i) { return block_bytes(i, me, len(i, me), 3); },
                 "alltoallv, packed");
  }
  // nothing to move (every block empty, displacements past 0): no copy and
  // no wait for the caller's earlier work on its stream, which here is
  // held (a wait would end only at the timeout)
  {
    std::vector<size_t> zero(n, 0), displs(n, 64);
    DevBuf in(128), out(128), other(16);
    zpp_emu_copy_log_clear();
    ASSERT_EQ(zpp_emu_stream_hold(nullptr), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(other.p, 0, other.bytes, nullptr), cudaSuccess);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(blocking_alltoallv(t, ZPP_GROUP_WORLD, in.p, zero.data(), displs.data(), out.p,
                                      zero.data(), displs.data(), ZPP_MEMORY_DEVICE, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(zpp_emu_stream_release(nullptr), cudaSuccess);
    EXPECT_LT(waited, 10.0) << "an empty all-to-all waited for the caller's stream";
    EXPECT_EQ(zpp_emu_copy_log(nullptr, 0), 0u) << "an empty all-to-all copied";
  }
  // all-gatherv into an output with gaps
  {
    Layout lr, ls;
    size_t o = 48;
    for (int j = 0; j < n; j++) {
      lr.bytes.push_back(4 * (size_t)(30 + 9 * j));
      lr.displs.push_back(o);
      o += lr.bytes.back() + 80;
    }
    ls.bytes.push_back(lr.bytes[me]);
    DevBuf in(ls.bytes[0]), out(lr.extent() + 16);
    std::vector<unsigned char> b = block_bytes(me, -1, ls.bytes[0], 2);
    ASSERT_EQ(cudaMemcpy(in.p, b.data(), b.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(out.p, fill, out.bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    zpp_emu_copy_log_clear();
    ASSERT_EQ(blocking_allgatherv(t, ZPP_GROUP_WORLD, in.p, out.p, lr.bytes.data(),
                                       lr.d(), ZPP_MEMORY_DEVICE, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    check_copies(in, ls, out, lr, "allgatherv, gaps");
    check_output(out, lr, fill,
                 [&](int i) { return block_bytes(i, -1, lr.bytes[i], 2); }, "allgatherv, gaps");
  }
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// Staged device operations on the MPI backend whose stage-out copies wait
// on the caller's stream: when every pinned slot is busy (more than 8 in
// flight) the extra buffers are freed once their copies are done, never by
// synchronising the stream inside a test (which held up the engine on the
// caller's later work: here a held stream, so the test never returned).
TEST(DevicePath, StagingBeyondTheSlotsNeverSynchronisesTheStream) {
  if (!run_case("staging")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1);
  ASSERT_NE(comm, nullptr);
  zpp_transport_t *t = zpp_comm_transport(comm);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const int nops = 12;
  const size_t n = 300;
  std::vector<std::unique_ptr<DevBuf>> in, out;
  std::vector<zpp_xop_t *> ops(nops, nullptr);
  for (int i = 0; i < nops; i++) {
    std::vector<float> x = gen(g_rank, n, 100 + i);
    in.emplace_back(new DevBuf(n * 4));
    out.emplace_back(new DevBuf(n * 4 * (size_t)g_size));
    ASSERT_EQ(cudaMemcpy(in.back()->p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(start_allgather(t, ZPP_GROUP_WORLD, in.back()->p, n * 4,
                                            out.back()->p, ZPP_MEMORY_DEVICE, s, &ops[i]),
              ZPP_OK)
        << zpp_get_last_error();
  }
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);  // the stage-outs wait
  int left = nops;
  for (int round = 0; left > 0 && round < 200000; round++) {
    for (auto &op : ops) {
      int done = 0;
      if (op == nullptr) continue;
      EXPECT_EQ(zpp_xop_test(op, &done), ZPP_OK) << zpp_get_last_error();
      if (done) {
        zpp_xop_free(op);
        op = nullptr;
        left--;
      }
    }
    if (left > 0) usleep(100);
  }
  EXPECT_EQ(left, 0) << "operations did not complete";
  ASSERT_EQ(zpp_emu_stream_release(s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int i = 0; i < nops; i++) {
    std::vector<float> y(n * (size_t)g_size);
    ASSERT_EQ(cudaMemcpy(y.data(), out[i]->p, y.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int r = 0; r < g_size; r++) {
      std::vector<float> want = gen(r, n, 100 + i);
      EXPECT_EQ(std::memcmp(&y[(size_t)r * n], want.data(), n * 4), 0)
          << "op " << i << " block of rank " << r;
    }
  }
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
}

// A send that the timeout cancelled but MPI could not (Open MPI cancels
// no send) still reads its buffer when the peer posts the receive later:
// here the pinned staging copy of a device all-gather's input, long after
// rank 0's collective timed out and its communicator was destroyed.  The
// buffer must stay alive (it is leaked, with a warning): before, the slot
// went back to the pool and destroy freed it (cudaFreeHost unmaps it in
// the emulated runtime), so the late receive failed or got other bytes.
TEST(DevicePath, CancelledTransfersKeepTheirBuffersAlive) {
  if (!run_case("cancelled")) GTEST_SKIP() << "ZPP_TEST_CASE";
  ASSERT_EQ(g_size, 2);
  setenv("ZPP_TIMEOUT_S", "1", 1);
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1);
  ASSERT_NE(comm, nullptr);
  MPI_Comm wire = MPI_COMM_NULL;  // the transport's MPI communicator
  ASSERT_EQ(zpp_comm_get_mpi_comm(comm, &wire), ZPP_OK) << zpp_get_last_error();
  const size_t n = 1 << 18;  // 1 MiB per rank: a rendezvous send
  std::vector<float> x = gen(g_rank, n, 77);
  int late = 0;  // rank 1: the late receive matched
  if (g_rank == 0) {  // rank 1 never calls
    DevBuf dx(n * 4), dy(n * 4 * 2);
    ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    zpp_request_t req = nullptr;  // the host wait sees the timeout
    EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, nullptr, &req), ZPP_OK)
        << zpp_get_last_error();
    EXPECT_EQ(zpp_request_wait(req), ZPP_ERR_TIMEOUT) << zpp_get_last_error();
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(took, 10.0) << "destroy's wait for the cancelled transfers is bounded";
    comm = nullptr;
    MPI_Barrier(MPI_COMM_WORLD);  // 1: rank 0's collective failed, destroyed
  } else {
    MPI_Barrier(MPI_COMM_WORLD);  // 1
    // Now post the receive rank 0's send waits for (rank 0 progresses it
    // in barrier 2); bounded.
    std::vector<float> y(n, -1.0f);
    MPI_Request rq = MPI_REQUEST_NULL;
    MPI_Irecv(y.data(), (int)(n * 4), MPI_BYTE, 0, MPI_ANY_TAG, wire, &rq);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!late && std::chrono::steady_clock::now() < until) {
      MPI_Test(&rq, &late, MPI_STATUS_IGNORE);
      if (!late) usleep(1000);
    }
    if (!late) {
      MPI_Cancel(&rq);
      MPI_Wait(&rq, MPI_STATUS_IGNORE);
    } else {
      std::vector<float> want = gen(0, n, 77);
      EXPECT_EQ(std::memcmp(y.data(), want.data(), n * 4), 0)
          << "the late receive got other bytes: the send's buffer was freed or reused";
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // 2
  MPI_Bcast(&late, 1, MPI_INT, 1, MPI_COMM_WORLD);
  if (comm != nullptr) {
    EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
  }
  if (!late) GTEST_SKIP() << "this MPI cancelled the send: no transfer was left in doubt";
}

// A staged device collective on the MPI backend whose stream does not run
// (the caller's earlier work on it never finishes: a held stream) returns
// ZPP_ERR_TIMEOUT at the communicator's timeout (1 s here), on every rank.
// Before, the stage-in copy was waited for with cudaStreamSynchronize: here
// until the emulator's own limit (ZPP_EMU_TIMEOUT_S, 20 s in this case),
// then a CUDA error; on a GPU, for ever.  Once the stream runs again the
// copy still queued lands in a buffer that is still alive (the slot waited
// for it), and a collective on a new communicator is exact.  The timeout
// aborts the communicator: the next call on it fails fast.
TEST(DevicePath, StagingWaitsAreBoundedByTheTimeout) {
  if (!run_case("stallsync")) GTEST_SKIP() << "ZPP_TEST_CASE";
  const size_t n = 4096;
  // the timeout in the config: zpp reads ZPP_TIMEOUT_S (60 here) only once
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1, 1);  // makes its device current
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  std::vector<float> x = gen(g_rank, n, 91);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);
  auto t0 = std::chrono::steady_clock::now();
  zpp_request_t req = nullptr;  // the host wait sees the timeout
  ASSERT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, &req), ZPP_OK)
      << zpp_get_last_error();
  zpp_status_t st = zpp_request_wait(req);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string msg = zpp_get_last_error();
  EXPECT_EQ(st, ZPP_ERR_TIMEOUT) << msg;
  EXPECT_LT(took, 1.0 + 3.0) << "the wait for the stream is bounded by the timeout";
  EXPECT_NE(msg.find("ZPP_TIMEOUT_S"), std::string::npos) << msg;
  // A collective that failed part-way aborts the communicator (src/engine/engine.c):
  // the next call fails at once with the first error's status, queues no
  // copy and does not wait for the held stream again.
  t0 = std::chrono::steady_clock::now();
  st = zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr);
  took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  msg = zpp_get_last_error();
  EXPECT_EQ(st, ZPP_ERR_TIMEOUT) << msg;
  EXPECT_NE(msg.find("aborted earlier"), std::string::npos) << msg;
  EXPECT_LT(took, 1.0) << "a call on an aborted communicator fails, not waits a timeout";
  ASSERT_EQ(zpp_emu_stream_release(s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // the queued copy ran
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
  MPI_Barrier(MPI_COMM_WORLD);
  comm = make_comm(ZPP_BACKEND_MPI, -1);
  ASSERT_NE(comm, nullptr);
  ASSERT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr), ZPP_OK)
      << zpp_get_last_error();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // queued on s
  std::vector<float> y(n * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int r = 0; r < g_size; r++) {
    std::vector<float> want = gen(r, n, 91);
    EXPECT_EQ(std::memcmp(&y[(size_t)r * n], want.data(), n * 4), 0) << "block of rank " << r;
  }
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
  cudaStreamDestroy(s);
}

// zpp_comm_abort from another thread while a staged collective waits for
// its held stream (the MPI backend's stage-in copy): the call returns
// ZPP_ERR_ABORTED at its next poll, as zpp_comm_abort promises
// (include/zpp/zpp_comm.h), not at the communicator's timeout (10 s here).
// Before, the staging wait polled the stream only and ran to the timeout.
TEST(DevicePath, AbortEndsAStagingWait) {
  if (!run_case("stallsync")) GTEST_SKIP() << "ZPP_TEST_CASE";
  const size_t n = 1024;
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1, 10);  // makes its device current
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);
  std::atomic<double> aborted_at{0.0};
  auto now = [] {
    return std::chrono::duration<double>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    aborted_at = now();
    EXPECT_EQ(zpp_comm_abort(comm), ZPP_OK);
  });
  zpp_request_t req = nullptr;  // the host wait sees the abort
  zpp_status_t st = zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, &req);
  EXPECT_EQ(st, ZPP_OK) << zpp_get_last_error();
  if (st == ZPP_OK) st = zpp_request_wait(req);
  double back = now();
  std::string msg = zpp_get_last_error();
  killer.join();
  EXPECT_EQ(st, ZPP_ERR_ABORTED) << msg;
  EXPECT_LT(back - aborted_at.load(), 5.0) << "the staging wait ignored the abort: " << msg;
  ASSERT_EQ(zpp_emu_stream_release(s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // the queued copy ran
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
  MPI_Barrier(MPI_COMM_WORLD);
  cudaStreamDestroy(s);
}

// The collectives' trusted device decode takes the accumulate choice as
// its own argument: ZPP_UINT8 has the value of the kernels' accumulate
// kind, and before, a trusted decode to ZPP_UINT8 ran the accumulating
// kernel into dst (fp32 per element) without a dtype check.
TEST(DevicePath, TrustedDecodeNeverTakesADtypeForAccumulate) {
  if (!run_case("queries")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  const size_t n = 256;
  size_t bytes = 0;
  ASSERT_EQ(zpp_quant_encoded_size(&q, n, &bytes), ZPP_OK);
  DevBuf enc(bytes), out(n * 4);
  ASSERT_EQ(cudaMemset(enc.p, 0, bytes), cudaSuccess);
  EXPECT_EQ(zpp_quant_decode_device_trusted(&q, enc.p, bytes, n, 0, ZPP_UINT8, out.p, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("ZPP_UINT8"), std::string::npos)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_quant_decode_device_trusted(&q, enc.p, bytes, n, 1, ZPP_FLOAT32, out.p, nullptr),
            ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// c: a communicator on device 1 runs its kernels on device 1 from the
// engine thread (whose current device is 0) and from a caller whose
// current device is 0, which it leaves at 0 (the bug: the engine thread
// launching on device 0, an illegal address on device 1's buffers).
TEST(DevicePath, WorkRunsOnTheCommunicatorsDevice) {
  if (!run_case("device")) GTEST_SKIP() << "ZPP_TEST_CASE";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, 1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 5000;
  std::vector<float> x = gen(g_rank, n, 2), y(n * (size_t)g_size);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // the caller works on device 0
  zpp_request_t req = nullptr;
  // started: runs on the engine thread
  EXPECT_EQ(zpp_qwz_allgather(comm, &q, dx.p, dy.p, n, ZPP_FLOAT32, nullptr,
                              &req),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(zpp_emu_last_kernel_device(), 1) << zpp_emu_last_fault();
  // blocking: queued from this thread, whose device must come back to 0
  EXPECT_EQ(zpp_qwz_allgather(comm, &q, dx.p, dy.p, n, ZPP_FLOAT32, nullptr,
                              nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // it returned once queued
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(zpp_emu_last_kernel_device(), 1) << zpp_emu_last_fault();
  int cur = -1;
  EXPECT_EQ(cudaGetDevice(&cur), cudaSuccess);
  EXPECT_EQ(cur, 0) << "the caller's current device was not restored";
  EXPECT_STREQ(zpp_emu_last_fault(), "");
  // and the result is the codec's: every block decodes to within the
  // format's bound of its input (checked loosely: the codec is tested
  // elsewhere; here a kernel on the wrong device would leave garbage)
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int r = 0; r < g_size; r++) {
    std::vector<float> want = gen(r, n, 2);
    float amax = 0;
    for (float v : want) amax = std::max(amax, std::fabs(v));
    for (size_t i = 0; i < n; i++)
      if (std::fabs(y[(size_t)r * n + i] - want[i]) > amax / 127.0f) {
        ADD_FAILURE() << "rank " << r << " element " << i << ": "
                      << y[(size_t)r * n + i] << " vs " << want[i];
        break;
      }
  }
  zpp_comm_destroy(comm);
}

// d: destroying an hpZ handle while its gathers are still queued on a
// non-blocking stream must not free the secondary copy under them (the
// bug: freeing it with cudaFreeAsync on the legacy stream, which does not
// wait for non-blocking streams, a use after free).
TEST(DevicePath, HpzDestroyWaitsForQueuedGathers) {
  if (!run_case("hpz")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_NCCL, -1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 4096;
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  ASSERT_EQ(zpp_hpz_create(comm, &hc, n, ZPP_FLOAT32, &h), ZPP_OK)
      << zpp_get_last_error();
  std::vector<float> x = gen(g_rank, n, 3);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size), dz(n * 4 * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  unsigned old = zpp_emu_set_delay_us(20000);  // 20 ms per device operation
  zpp_request_t rf = nullptr, rb = nullptr;
  EXPECT_EQ(zpp_hpz_forward_gather(h, dx.p, dy.p, s, &rf), ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, dz.p, s, &rb), ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_hpz_destroy(h), ZPP_OK);  // the gathers are still queued
  EXPECT_EQ(zpp_request_wait(rf), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(zpp_request_wait(rb), ZPP_OK) << zpp_get_last_error();
  zpp_emu_set_delay_us(old);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess) << zpp_emu_last_fault();
  EXPECT_STREQ(zpp_emu_last_fault(), "");
  std::vector<float> y(n * (size_t)g_size), z(n * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(z.data(), dz.p, z.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(y.data(), z.data(), y.size() * 4), 0)
      << "backward gather differs from forward";
  cudaStreamDestroy(s);
  zpp_comm_destroy(comm);
}

// e: rank 0 cannot load NCCL (the ctest entry gives it a library that does
// not exist); every rank must fail creation, and quickly (the bug: the
// failing rank returning before broadcasting the unique id, the others
// waiting in the broadcast).
TEST(DevicePath, CreationFailsOnEveryRankWhenOneCannot) {
  if (!run_case("creation")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  cfg.backend = ZPP_BACKEND_NCCL;
  cfg.timeout_s = 20;
  zpp_comm_t c = nullptr;
  double t0 = MPI_Wtime();
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  double dt = MPI_Wtime() - t0;
  EXPECT_NE(st, ZPP_OK);
  EXPECT_EQ(c, nullptr);
  EXPECT_LT(dt, 25.0) << "creation took " << dt << " s";
  std::string msg = zpp_get_last_error();
  if (g_rank == 0)
    EXPECT_NE(msg.find("NCCL"), std::string::npos) << msg;
  else
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  if (c != nullptr) zpp_comm_destroy(c);
}

// f: with ranks sharing one GPU (ZPP_EMU_DEVICES=1), AUTO chooses MPI
// staging (the bug: choosing NCCL, which refuses two ranks per device).
TEST(DevicePath, AutoChoosesMpiWhenRanksShareAGpu) {
  if (!run_case("auto")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_AUTO, -1);
  ASSERT_NE(comm, nullptr) << "creation failed: " << zpp_get_last_error();
  zpp_backend_t be = ZPP_BACKEND_AUTO;
  EXPECT_EQ(zpp_comm_backend(comm, &be), ZPP_OK);
  EXPECT_EQ(be, ZPP_BACKEND_MPI);
  zpp_comm_destroy(comm);
}

// h: a qgZ call with error feedback classifies its three user buffers
// once each (the bug: every encode and decode querying both pointers,
// dozens of queries per call).
// A buffer of another device than the communicator's is refused by name
// before any work is queued (kernels of the communicator's device would
// otherwise be launched against it), on both backends; managed memory,
// which every device addresses, and the communicator's own device pass.
TEST(DevicePath, BuffersOfAnotherDeviceAreRefusedByName) {
  if (!run_case("wrongdev")) GTEST_SKIP() << "ZPP_TEST_CASE";
  const size_t n = 777;
  for (zpp_backend_t be : {ZPP_BACKEND_MPI, ZPP_BACKEND_NCCL}) {
    // each rank its own device (NCCL takes one rank per device), the
    // other one holds the wrong buffer
    const int dev = g_rank % 2, odev = 1 - dev;
    zpp_comm_t comm = make_comm(be, dev);
    ASSERT_NE(comm, nullptr);
    ASSERT_EQ(cudaSetDevice(odev), cudaSuccess);
    DevBuf other(n * 4 * (size_t)g_size);
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    DevBuf mine(n * 4), out(n * 4 * (size_t)g_size);
    std::vector<float> x = gen(g_rank, n, 7), y(n * (size_t)g_size);
    ASSERT_EQ(cudaMemcpy(mine.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(zpp_allgather(comm, other.p, out.p, n, ZPP_FLOAT32, nullptr, nullptr),
              ZPP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(zpp_get_last_error(), "sendbuf"), nullptr) << zpp_get_last_error();
    const std::string want = "device " + std::to_string(odev) +
                             ", but the communicator works on device " + std::to_string(dev);
    EXPECT_NE(std::strstr(zpp_get_last_error(), want.c_str()), nullptr) << zpp_get_last_error();
    zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
    EXPECT_EQ(zpp_qwz_allgather(comm, &q, mine.p, other.p, n, ZPP_FLOAT32, nullptr, nullptr),
              ZPP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(zpp_get_last_error(), "recvbuf"), nullptr) << zpp_get_last_error();
    // managed memory as the output: accepted, and the gather is exact
    void *managed = nullptr;
    ASSERT_EQ(cudaMallocManaged(&managed, n * 4 * (size_t)g_size), cudaSuccess);
    EXPECT_EQ(zpp_allgather(comm, mine.p, managed, n, ZPP_FLOAT32, nullptr, nullptr), ZPP_OK)
        << zpp_get_last_error();
    ASSERT_EQ(cudaMemcpy(y.data(), managed, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int r = 0; r < g_size; r++)
      EXPECT_EQ(std::memcmp(y.data() + (size_t)r * n, gen(r, n, 7).data(), n * 4), 0)
          << "backend " << (int)be << " block of rank " << r;
    cudaFree(managed);
    zpp_comm_destroy(comm);
  }
}

TEST(DevicePath, OnePointerQueryPerUserBuffer) {
  if (!run_case("queries")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 3000;
  size_t rc = 0;
  ASSERT_EQ(zpp_qgz_residual_count(comm, n, &rc), ZPP_OK);
  std::vector<float> g = gen(g_rank, n * (size_t)g_size, 4);
  DevBuf dg(g.size() * 4), dout(n * 4), dres(rc * 4);
  ASSERT_EQ(cudaMemcpy(dg.p, g.data(), g.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dres.p, 0, rc * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
  zpp_emu_reset_api_calls();
  EXPECT_EQ(zpp_qgz_reduce_scatter(comm, &q, dg.p, dout.p, n, ZPP_FLOAT32,
                                   ZPP_OP_MEAN, dres.f(), nullptr, nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_LE(zpp_emu_api_calls("cudaPointerGetAttributes"), 3ul)
      << "sendbuf, recvbuf and residual: one query each";
  zpp_comm_destroy(comm);
}

}  // namespace

// zpp_comm_abort from another thread on a NCCL communicator whose
// device work waits for a peer that never comes (rank 1): the NCCL
// communicators are aborted then, and the work they held ends on the
// stream -- which does not make it done.  A barrier waiting for its
// stream, and a started all-gather waited for after the abort, return
// ZPP_ERR_ABORTED, never ZPP_OK (both returned ZPP_OK before: the stream
// drained after the abort and the waits took that as completion).
TEST(DevicePath, NcclAbortFromAnotherThreadFailsTheWaits) {
  if (!run_case("ncclkill")) GTEST_SKIP() << "ZPP_TEST_CASE";
  ASSERT_EQ(g_size, 2);
  for (int round = 0; round < 2; round++) {
    zpp_comm_t comm = make_comm(ZPP_BACKEND_NCCL, -1);
    ASSERT_NE(comm, nullptr);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const size_t n = 256;
    DevBuf dx(n * 4), dy(n * 4 * 2);
    if (g_rank == 0) {  // rank 1 never calls
      std::atomic<double> aborted_at{0.0};
      auto now = [] {
        return std::chrono::duration<double>(
                   std::chrono::steady_clock::now().time_since_epoch())
            .count();
      };
      zpp_status_t st;
      if (round == 0) {
        std::thread killer([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          aborted_at = now();
          EXPECT_EQ(zpp_comm_abort(comm), ZPP_OK);
        });
        st = blocking_barrier(zpp_comm_transport(comm), ZPP_GROUP_WORLD);
        killer.join();
      } else {
        zpp_request_t req = nullptr;
        ASSERT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, &req), ZPP_OK)
            << zpp_get_last_error();
        std::thread killer([&] {
          aborted_at = now();
          EXPECT_EQ(zpp_comm_abort(comm), ZPP_OK);
        });
        killer.join();
        // the aborted all-gather's stream drains (its status does not
        // matter); the wait comes after that
        cudaStreamSynchronize(s);
        st = zpp_request_wait(req);
      }
      double back = now();
      EXPECT_EQ(st, ZPP_ERR_ABORTED) << "round " << round << ": " << zpp_get_last_error();
      EXPECT_LT(back - aborted_at.load(), 10.0) << "round " << round;
      zpp_status_t as = ZPP_OK;
      EXPECT_EQ(zpp_comm_get_async_error(comm, &as), ZPP_OK);
      EXPECT_EQ(as, ZPP_ERR_ABORTED) << zpp_get_last_error();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    cudaStreamDestroy(s);
    EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
  }
}

// An asynchronous NCCL error (here the stand-in's own limit,
// ZPP_NCCL_EMU_TIMEOUT_S=1, on an all-gather whose peer never comes, well
// inside ZPP_TIMEOUT_S): zpp_comm_get_async_error reports ZPP_ERR_NCCL,
// and it stays the communicator's first error for every later call and
// query (they answered ZPP_ERR_TIMEOUT before: the break kept no status).
TEST(DevicePath, NcclAsyncErrorStaysTheFirstError) {
  if (!run_case("ncclasync")) GTEST_SKIP() << "ZPP_TEST_CASE";
  ASSERT_EQ(g_size, 2);
  zpp_comm_t comm = make_comm(ZPP_BACKEND_NCCL, -1);
  ASSERT_NE(comm, nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = 256;
  DevBuf dx(n * 4), dy(n * 4 * 2);
  if (g_rank == 0) {  // rank 1 never calls
    zpp_request_t req = nullptr;
    ASSERT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, &req), ZPP_OK)
        << zpp_get_last_error();
    zpp_status_t as = ZPP_OK;
    for (int i = 0; i < 2000 && as == ZPP_OK; i++) {  // <= 20 s
      EXPECT_EQ(zpp_comm_get_async_error(comm, &as), ZPP_OK);
      if (as == ZPP_OK) usleep(10000);
    }
    EXPECT_EQ(as, ZPP_ERR_NCCL) << zpp_get_last_error();
    EXPECT_EQ(zpp_comm_get_async_error(comm, &as), ZPP_OK);
    EXPECT_EQ(as, ZPP_ERR_NCCL) << "second query: " << zpp_get_last_error();
    EXPECT_EQ(zpp_request_wait(req), ZPP_ERR_NCCL) << zpp_get_last_error();
    EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr), ZPP_ERR_NCCL)
        << zpp_get_last_error();
    cudaStreamSynchronize(s);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// ---- stream-ordered device collectives ------------------------------------
//
//   s  a device collective and the wait for it return while the caller's
//      stream is held (they queue work, the host does not wait), and the
//      result is exact once the stream runs (the bug: a host wait for the
//      device, which here blocks until the stream is released)
//   o  hpZ's secondary copy, written by a forward gather on one stream and
//      read by a backward gather on another, is read after it was written
//      (the bug: no event between the streams; the backward read the copy
//      of the previous generation)
//   g  a collective on a capturing stream is refused with
//      ZPP_ERR_UNSUPPORTED and leaves the capture valid (the bug: polls
//      and allocations that invalidate the capture, or a hang)
//   x  a thread that never chose a device gets no context on device 0 from
//      a collective on device 1 or 2 (the bug: "restoring" device 0)
//   t  cudaStreamPerThread is the calling thread's stream: a staged
//      collective ordered on it from one thread is exact (the bug: the
//      engine thread used the handle, i.e. its own per-thread stream)

// Runs f on a thread and waits at most `limit_s` for it: false when it did
// not return (the thread is then joined once `unblock` ran).
bool returns_within(double limit_s, const std::function<void()> &f,
                    const std::function<void()> &unblock) {
  std::atomic<bool> done{false};
  std::thread th([&] {
    f();
    done = true;
  });
  auto t0 = std::chrono::steady_clock::now();
  while (!done && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                          .count() < limit_s)
    usleep(1000);
  bool ok = done;
  if (!ok) unblock();
  th.join();
  return ok;
}

zpp_backend_t case_backend() {
  return run_case("staged") ? ZPP_BACKEND_MPI : ZPP_BACKEND_NCCL;
}

// s: the blocking form and zpp_request_wait_stream queue work and return.
TEST(DevicePath, DeviceCollectivesDoNotBlockTheHost) {
  if (!run_case("stream")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(case_backend(), -1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 3001;
  std::vector<float> x = gen(g_rank, n, 11);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size), dz(n * 4 * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr, s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  float *hy = nullptr, *hz = nullptr;
  ASSERT_EQ(cudaMallocHost((void **)&hy, dy.bytes), cudaSuccess);
  ASSERT_EQ(cudaMallocHost((void **)&hz, dz.bytes), cudaSuccess);
  std::fill(hy, hy + n * g_size, -1.0f);
  std::fill(hz, hz + n * g_size, -1.0f);
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);
  zpp_status_t st1 = ZPP_ERR_INTERNAL, st2 = ZPP_ERR_INTERNAL, st3 = ZPP_ERR_INTERNAL,
               st4 = ZPP_ERR_INTERNAL;
  zpp_request_t kept = nullptr;
  DevBuf dw(n * 4 * (size_t)g_size);
  cudaStream_t s3 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking), cudaSuccess);
  float *hw = nullptr;
  ASSERT_EQ(cudaMallocHost((void **)&hw, dw.bytes), cudaSuccess);
  std::fill(hw, hw + n * g_size, -1.0f);
  bool released = false;
  auto release = [&] {
    if (!released) zpp_emu_stream_release(s);
    released = true;
  };
  bool quick = returns_within(
      10.0,
      [&] {
        // blocking form on s, then its result read on s
        st1 = zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr);
        cudaMemcpyAsync(hy, dy.p, dy.bytes, cudaMemcpyDeviceToHost, s);
        // started form on s, waited for by s2, its result read on s2
        zpp_request_t req = nullptr;
        st2 = zpp_allgather(comm, dx.p, dz.p, n, ZPP_FLOAT32, s, &req);
        st3 = st2 == ZPP_OK ? zpp_request_wait_stream(req, s2) : st2;
        cudaMemcpyAsync(hz, dz.p, dz.bytes, cudaMemcpyDeviceToHost, s2);
        // started on s, ordered onto s3 and kept: not done while s is held
        st4 = zpp_allgather(comm, dx.p, dw.p, n, ZPP_FLOAT32, s, &kept);
        if (st4 == ZPP_OK) st4 = zpp_request_order_stream(kept, s3);
        cudaMemcpyAsync(hw, dw.p, dw.bytes, cudaMemcpyDeviceToHost, s3);
      },
      release);
  int kept_done = -1;
  if (quick && kept != nullptr) {
    EXPECT_EQ(zpp_request_test(kept, &kept_done), ZPP_OK);
    EXPECT_EQ(kept_done, 0) << "an ordered request said done while s was held";
  }
  EXPECT_TRUE(quick) << "a call or the stream wait blocked the host while the "
                        "caller's stream was held";
  EXPECT_EQ(st1, ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(st2, ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(st3, ZPP_OK) << zpp_get_last_error();
  if (quick) {
    usleep(50000);
    EXPECT_EQ(cudaStreamQuery(s2), cudaErrorNotReady)
        << "s2 did not wait for the collective held on s";
    (void)cudaGetLastError();
  }
  release();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s3), cudaSuccess);
  EXPECT_EQ(st4, ZPP_OK) << zpp_get_last_error();
  if (kept != nullptr) {  // s3 ran after it: the request is done, then freed
    EXPECT_EQ(zpp_request_test(kept, &kept_done), ZPP_OK);
    EXPECT_EQ(kept_done, 1);
    EXPECT_EQ(zpp_request_wait(kept), ZPP_OK) << zpp_get_last_error();
  }
  for (int r = 0; r < g_size; r++) {
    std::vector<float> want = gen(r, n, 11);
    EXPECT_EQ(std::memcmp(hw + (size_t)r * n, want.data(), n * 4), 0)
        << "ordered request, block of rank " << r;
    EXPECT_EQ(std::memcmp(hy + (size_t)r * n, want.data(), n * 4), 0)
        << "blocking form, block of rank " << r;
    EXPECT_EQ(std::memcmp(hz + (size_t)r * n, want.data(), n * 4), 0)
        << "started form, block of rank " << r;
  }
  cudaFreeHost(hy);
  cudaFreeHost(hz);
  cudaFreeHost(hw);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
  cudaStreamDestroy(s3);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// s: qgZ's integer sums (sum = ZPP_QGZ_SUM_INT, error feedback) on device
// memory queue their steps (absmax, the exponent all-gather and its max,
// encode, sums, re-quantization, finish) on the caller's stream and
// return: the call returns while the stream is held, nothing has run
// then, and after the release the result and the residual are those of a
// host-memory communicator (bit for bit).  The input holds NaN until a
// copy queued on the held stream just before the call writes it, so a
// step that ran off the stream (before the release, or on another stream
// not ordered after it) would read NaN and the comparison would fail.
TEST(DevicePath, QgzIntegerSumsDoNotBlockTheHost) {
  if (!run_case("stream"))
    GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(case_backend(), -1), host = nullptr;
  ASSERT_NE(comm, nullptr);
  zpp_comm_config_t hc = ZPP_COMM_CONFIG_INIT;
  hc.backend = ZPP_BACKEND_MPI;
  hc.memory = ZPP_MEMORY_HOST;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &hc, &host), ZPP_OK)
      << zpp_get_last_error();
  const size_t n = 3001;
  zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
  q.sum = ZPP_QGZ_SUM_INT;
  q.block_size = 128;
  size_t rb = 0;
  ASSERT_EQ(zpp_qgz_residual_bytes(comm, &q, n, &rb), ZPP_OK);
  std::vector<float> x = gen(g_rank, n * (size_t)g_size, 23), want(n),
                     res(rb / 4, 0.0f);
  DevBuf dx(x.size() * 4), dx0(x.size() * 4), dy(n * 4), dr(rb);
  ASSERT_EQ(cudaMemcpy(dx0.p, x.data(), dx0.bytes, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(dx.p, 0xff, dx.bytes), cudaSuccess); // NaN
  ASSERT_EQ(cudaMemset(dr.p, 0, rb), cudaSuccess);
  // before s (non-blocking: not ordered after the legacy stream) starts
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  float *hy = nullptr, *hr = nullptr;
  ASSERT_EQ(cudaMallocHost((void **)&hy, dy.bytes), cudaSuccess);
  ASSERT_EQ(cudaMallocHost((void **)&hr, rb), cudaSuccess);
  std::fill(hy, hy + n, -1.0f);
  ASSERT_EQ(zpp_emu_stream_hold(s), cudaSuccess);
  zpp_status_t st = ZPP_ERR_INTERNAL;
  bool released = false;
  auto release = [&] {
    if (!released)
      zpp_emu_stream_release(s);
    released = true;
  };
  bool quick = returns_within(
      10.0,
      [&] {
        cudaMemcpyAsync(dx.p, dx0.p, dx.bytes, cudaMemcpyDeviceToDevice, s);
        st = zpp_qgz_reduce_scatter(comm, &q, dx.p, dy.p, n, ZPP_FLOAT32,
                                    ZPP_OP_MEAN, dr.p, s, nullptr);
        cudaMemcpyAsync(hy, dy.p, dy.bytes, cudaMemcpyDeviceToHost, s);
        cudaMemcpyAsync(hr, dr.p, rb, cudaMemcpyDeviceToHost, s);
      },
      release);
  EXPECT_TRUE(quick)
      << "qgZ INT blocked the host while the caller's stream was held";
  EXPECT_EQ(st, ZPP_OK) << zpp_get_last_error();
  if (quick) {
    usleep(50000);
    EXPECT_EQ(hy[0], -1.0f)
        << "the result was written while the stream was held";
  }
  release();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(zpp_qgz_reduce_scatter(host, &q, x.data(), want.data(), n,
                                   ZPP_FLOAT32, ZPP_OP_MEAN, res.data(),
                                   nullptr, nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(std::memcmp(hy, want.data(), n * 4), 0)
      << "result against host memory's";
  EXPECT_EQ(std::memcmp(hr, res.data(), rb), 0)
      << "residual against host memory's";
  cudaFreeHost(hy);
  cudaFreeHost(hr);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(host), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// o: forward gather on a held stream a, backward on stream b: b must read
// the secondary copy the forward wrote (generation 2), not the one before.
TEST(DevicePath, HpzSecondaryCopyIsOrderedAcrossStreams) {
  if (!run_case("secorder")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(case_backend(), -1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 2048;
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  ASSERT_EQ(zpp_hpz_create(comm, &hc, n, ZPP_FLOAT32, &h), ZPP_OK)
      << zpp_get_last_error();
  zpp_hpz_info_t info;
  ASSERT_EQ(zpp_hpz_get_info(h, &info), ZPP_OK);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size), dz(n * 4 * (size_t)g_size);
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  // generation 1, all on a
  std::vector<float> x1 = gen(g_rank, n, 21), x2 = gen(g_rank, n, 22);
  ASSERT_EQ(cudaMemcpy(dx.p, x1.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(zpp_hpz_forward_gather(h, dx.p, dy.p, a, nullptr), ZPP_OK)
      << zpp_get_last_error();
  ASSERT_EQ(zpp_hpz_backward_gather(h, nullptr, dz.p, a, nullptr), ZPP_OK)
      << zpp_get_last_error();
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  // generation 2: forward on held a, backward on b
  ASSERT_EQ(cudaMemcpy(dx.p, x2.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(zpp_hpz_invalidate(h), ZPP_OK);
  ASSERT_EQ(zpp_emu_stream_hold(a), cudaSuccess);
  zpp_status_t sf = ZPP_ERR_INTERNAL, sb = ZPP_ERR_INTERNAL;
  bool quick = returns_within(
      10.0,
      [&] {
        sf = zpp_hpz_forward_gather(h, dx.p, dy.p, a, nullptr);
        sb = zpp_hpz_backward_gather(h, nullptr, dz.p, b, nullptr);
      },
      [&] { zpp_emu_stream_release(a); });
  EXPECT_TRUE(quick) << "a gather blocked the host";
  EXPECT_EQ(sf, ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(sb, ZPP_OK) << zpp_get_last_error();
  if (quick) {
    usleep(20000);  // b may run now if nothing orders it after a
    ASSERT_EQ(zpp_emu_stream_release(a), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  // the backward gather returns what the forward one of generation 2 did
  // (the secondary copy holds the same encoded shards), and that is
  // generation 2 within the codec's bound (INT8 by default: amax / 127)
  std::vector<float> y(n * (size_t)g_size), z(n * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(z.data(), dz.p, z.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int r = 0; r < g_size; r++) {
    std::vector<float> want = gen(r, n, 22);
    float amax = 0;
    for (float v : want) amax = std::max(amax, std::fabs(v));
    size_t far = 0;
    for (size_t i = 0; i < n; i++)
      far += std::fabs(y[(size_t)r * n + i] - want[i]) > amax / 127.0f;
    EXPECT_EQ(far, 0u) << "forward gather of generation 2, block of rank " << r;
    EXPECT_EQ(std::memcmp(&z[(size_t)r * n], &y[(size_t)r * n], n * 4), 0)
        << "backward gather, block of rank " << r << " (hierarchical "
        << info.hierarchical << "): not the secondary copy of generation 2";
  }
  EXPECT_EQ(zpp_hpz_destroy(h), ZPP_OK);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// g: refused on a capturing stream, before anything is queued.
TEST(DevicePath, CaptureIsRefusedAndLeftValid) {
  if (!run_case("capture")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(case_backend(), -1);
  ASSERT_NE(comm, nullptr);
  const size_t n = 100;
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr),
            ZPP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(zpp_get_last_error()).find("capturing"), std::string::npos)
      << zpp_get_last_error();
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  EXPECT_EQ(zpp_qwz_allgather(comm, &q, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr),
            ZPP_ERR_UNSUPPORTED);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess) << "the capture was invalidated";
  if (g != nullptr) cudaGraphDestroy(g);
  // a started collective waited for by a capturing stream: refused too
  // (the wait would be captured into the graph with a stale order)
  zpp_request_t req = nullptr;
  ASSERT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, &req), ZPP_OK)
      << zpp_get_last_error();
  cudaStream_t c = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(c, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(zpp_request_wait_stream(req, c), ZPP_ERR_UNSUPPORTED) << zpp_get_last_error();
  g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(c, &g), cudaSuccess) << "the capture was invalidated";
  if (g != nullptr) cudaGraphDestroy(g);
  cudaStreamDestroy(c);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  // the communicator is fine: a refused call queued nothing
  EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr), ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// x: a fresh thread, no device chosen, collectives on device 1 + rank.
TEST(DevicePath, NoContextOnAnotherDevice) {
  if (!run_case("context")) GTEST_SKIP() << "ZPP_TEST_CASE";
  const int dev = 1 + g_rank;
  bool ok = false;
  std::thread th([&] {
    zpp_comm_t comm = make_comm(case_backend(), dev);
    ASSERT_NE(comm, nullptr);
    const size_t n = 500;
    void *dx = nullptr, *dy = nullptr;
    zpp_request_t req = nullptr;
    // allocations on the communicator's device, from a thread of its own
    std::thread([&] {
      cudaSetDevice(dev);
      cudaMalloc(&dx, n * 4);
      cudaMalloc(&dy, n * 4 * (size_t)g_size);
      cudaMemset(dx, 0, n * 4);
      cudaDeviceSynchronize();
    }).join();
    // the calls from a thread that never chose a device (creation may
    // have made the communicator's device current on this one)
    std::thread([&] {
      EXPECT_EQ(zpp_allgather(comm, dx, dy, n, ZPP_FLOAT32, nullptr, nullptr), ZPP_OK)
          << zpp_get_last_error();
      EXPECT_EQ(zpp_allgather(comm, dx, dy, n, ZPP_FLOAT32, nullptr, &req), ZPP_OK)
          << zpp_get_last_error();
      EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
      EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
    }).join();
    std::thread([&] {
      cudaSetDevice(dev);
      cudaFree(dx);
      cudaFree(dy);
    }).join();
    ok = true;
  });
  th.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(zpp_emu_context_active(0), 0)
      << "device 0 got a CUDA context though no thread of this rank chose it";
  EXPECT_EQ(zpp_emu_context_active(dev), 1);
}

// t: the per-thread default stream names the calling thread's stream.
TEST(DevicePath, PerThreadStreamIsTheCallers) {
  if (!run_case("perthread")) GTEST_SKIP() << "ZPP_TEST_CASE";
  const int dev = g_rank;
  zpp_comm_t comm = make_comm(case_backend(), dev);
  ASSERT_NE(comm, nullptr);
  const size_t n = 777, all = n * (size_t)g_size;
  std::vector<float> x = gen(g_rank, n, 31);
  ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
  DevBuf dx(n * 4), dy(all * 4);
  float *hx = nullptr, *hy = nullptr;  // pinned: copies never block the host
  ASSERT_EQ(cudaMallocHost((void **)&hx, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMallocHost((void **)&hy, all * 4), cudaSuccess);
  std::copy(x.begin(), x.end(), hx);
  std::fill(hy, hy + all, -1.0f);
  std::thread th([&] {
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    // the input is written on this thread's stream, held: the collective
    // must come after it
    ASSERT_EQ(zpp_emu_stream_hold(cudaStreamPerThread), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(dx.p, hx, n * 4, cudaMemcpyHostToDevice, cudaStreamPerThread),
              cudaSuccess);
    zpp_request_t req = nullptr;
    EXPECT_EQ(zpp_allgather(comm, dx.p, dy.p, n, ZPP_FLOAT32, cudaStreamPerThread, &req),
              ZPP_OK)
        << zpp_get_last_error();
    EXPECT_EQ(zpp_request_wait_stream(req, cudaStreamPerThread), ZPP_OK)
        << zpp_get_last_error();
    ASSERT_EQ(cudaMemcpyAsync(hy, dy.p, all * 4, cudaMemcpyDeviceToHost, cudaStreamPerThread),
              cudaSuccess);
    ASSERT_EQ(zpp_emu_stream_release(cudaStreamPerThread), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  });
  th.join();
  for (int r = 0; r < g_size; r++) {
    std::vector<float> want = gen(r, n, 31);
    EXPECT_EQ(std::memcmp(hy + (size_t)r * n, want.data(), n * 4), 0) << "block of rank " << r;
  }
  cudaFreeHost(hx);
  cudaFreeHost(hy);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
}

// Review findings of the stream-ordered engine, each with the bug it
// catches:
//   destroy   hpz_destroy right after a queued staged gather returns, and
//             the stream drains (the bug: the engine thread freed the
//             secondary copy with cudaFree, a device synchronisation that
//             waited for the caller's stream, which waited for the engine)
//             and no second engine is made while the communicator goes
//             (the bug: a stream and a counter made during destroy)
//   queue     many queued staged calls, each slow on the device, do not
//             time out together (the bug: the device wait was timed from
//             the call, queue time included)
TEST(DevicePath, HpzDestroyUnderAQueuedStagedGatherDoesNotDeadlock) {
  if (!run_case("destroy")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1, 5);  // makes its device current
  ASSERT_NE(comm, nullptr);
  const size_t n = 4096;
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  ASSERT_EQ(zpp_hpz_create(comm, &hc, n, ZPP_FLOAT32, &h), ZPP_OK) << zpp_get_last_error();
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  ASSERT_EQ(cudaMemset(dx.p, 0, n * 4), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  unsigned old = zpp_emu_set_delay_us(20000);
  EXPECT_EQ(zpp_hpz_forward_gather(h, dx.p, dy.p, s, nullptr), ZPP_OK) << zpp_get_last_error();
  cudaError_t se = cudaErrorUnknown;
  bool quick = returns_within(
      20.0,
      [&] {
        EXPECT_EQ(zpp_hpz_destroy(h), ZPP_OK) << zpp_get_last_error();
        se = cudaStreamSynchronize(s);
      },
      [] {});
  zpp_emu_set_delay_us(old);
  ASSERT_TRUE(quick) << "hpz_destroy under a queued gather deadlocked the stream";
  EXPECT_EQ(se, cudaSuccess);
  zpp_emu_reset_api_calls();
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(zpp_emu_api_calls("cudaStreamCreateWithFlags"), 0u)
      << "a stream was made while the communicator was destroyed";
  EXPECT_EQ(zpp_emu_api_calls("cudaHostAlloc"), 0u)
      << "pinned memory was allocated while the communicator was destroyed";
  cudaStreamDestroy(s);
}

TEST(DevicePath, QueuedStagedCallsAreTimedFromTheirTurn) {
  if (!run_case("queue")) GTEST_SKIP() << "ZPP_TEST_CASE";
  zpp_comm_t comm = make_comm(ZPP_BACKEND_MPI, -1, 2);  // makes its device current
  ASSERT_NE(comm, nullptr);
  const size_t n = 2048;
  std::vector<float> x = gen(g_rank, n, 41);
  DevBuf dx(n * 4), dy(n * 4 * (size_t)g_size);
  ASSERT_EQ(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  unsigned old = zpp_emu_set_delay_us(20000);  // each device operation ~20 ms
  auto t0 = std::chrono::steady_clock::now();
  const int calls = 30;  // several timeouts' worth of device work in all
  for (int i = 0; i < calls; i++)
    ASSERT_EQ(zpp_qwz_allgather(comm, &q, dx.p, dy.p, n, ZPP_FLOAT32, s, nullptr), ZPP_OK)
        << "call " << i << ": " << zpp_get_last_error();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  zpp_emu_set_delay_us(old);
  zpp_status_t as = ZPP_OK;
  EXPECT_EQ(zpp_comm_get_async_error(comm, &as), ZPP_OK);
  EXPECT_EQ(as, ZPP_OK) << "queued calls timed out: " << zpp_get_last_error() << " (" << took
                        << " s for " << calls << " calls)";
  std::printf("rank %d: %d queued calls in %.2f s (timeout 2 s)\n", g_rank, calls, took);
  EXPECT_EQ(zpp_comm_destroy(comm), ZPP_OK);
  cudaStreamDestroy(s);
}

int main(int argc, char **argv) {
  int provided = 0, failed, any = 0;
  // This suite's references follow one forced family (ZPP_ALGO=flat, else
  // hier); the per-call choice of ZPP_ALGO=auto, the library's default, is
  // tests/test_tuner.cc's.  Set before MPI or zpp start any thread.
  setenv("ZPP_ALGO", "hier", 0);
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  ::testing::InitGoogleTest(&argc, argv);
  if (g_rank == 0)
    std::printf("seed ZPP_TEST_SEED=%llu; %d ranks; case %s\n",
                (unsigned long long)seed(), g_size,
                std::getenv("ZPP_TEST_CASE") ? std::getenv("ZPP_TEST_CASE") : "");
  failed = RUN_ALL_TESTS() != 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
