// The execution engine (src/engine/engine.c), under mpirun: what it promises about
// threads and memory, which the collectives' results cannot show.
//
//   - a blocking collective, chunked (pipelined) or not, creates no thread:
//     the plan runs on the caller (no pipelined call starts a thread of
//     its own);
//   - started collectives share one engine thread per communicator;
//   - the host scratch cache belongs to the communicator and is freed by
//     zpp_comm_destroy (not per thread, outliving it).
//
// pthread_create is wrapped at link time (-Wl,--wrap=pthread_create) and
// counted.  ctest runs this with ZPP_PIPE_MIN_CHUNK=256, so the counts
// used below are cut into chunks (32 for qwZ, 8 for qgZ).  Seed: ZPP_TEST_SEED, printed by rank 0.
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>
#include <pthread.h>
#include <unistd.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_gtest_main.h"
#include "comm/comm.h"
#include "engine/plan.h"  // the engine's own interface (src/)
#include "scoped_env.h"

extern "C" void zpp_settings_reload(void);  // src/core/core.h

extern "C" {
int __real_pthread_create(pthread_t *, const pthread_attr_t *,
                          void *(*)(void *), void *);
static std::atomic<int> g_threads_created{0};
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg) {
  g_threads_created++;
  return __real_pthread_create(t, a, fn, arg);
}
}

namespace {

zpp_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

std::vector<float> gen(size_t n, uint64_t tag) {
  std::mt19937_64 rng(seed() * 31ull + tag * 977ull + (uint64_t)g_rank);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto &v : x) v = nd(rng);
  return x;
}

// Elements per rank: at ZPP_PIPE_MIN_CHUNK=256, block 256, qwZ cuts them in
// 32 chunks of 256 and qgZ in 8 of 1024.
constexpr size_t kCount = 8192;

TEST(EngineThreads, BlockingChunkedCollectivesCreateNoThread) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  std::vector<float> x = gen(kCount, 1), y(kCount * (size_t)g_size);
  std::vector<float> grad = gen(kCount * (size_t)g_size, 2), out(kCount);
  int before = g_threads_created.load();
  for (int it = 0; it < 3; it++) {
    EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, x.data(), y.data(), kCount,
                                ZPP_FLOAT32, nullptr, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, grad.data(), out.data(),
                                     kCount, ZPP_FLOAT32, ZPP_OP_MEAN, nullptr,
                                     nullptr, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
  }
  EXPECT_EQ(g_threads_created.load() - before, 0)
      << "blocking (chunked) collectives created threads";
}

TEST(EngineThreads, StartedCollectivesShareOneEngineThread) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  const int k = 6;
  std::vector<std::vector<float>> x(k), y(k);
  std::vector<zpp_request_t> req(k, nullptr);
  zpp_comm_t c = nullptr;
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  int before = g_threads_created.load();
  for (int i = 0; i < k; i++) {
    x[i] = gen(kCount, 10 + (uint64_t)i);
    y[i].assign(kCount * (size_t)g_size, 0.0f);
    EXPECT_EQ(zpp_qwz_allgather(c, &q, x[i].data(), y[i].data(), kCount,
                                ZPP_FLOAT32, nullptr, &req[i]),
              ZPP_OK)
        << zpp_get_last_error();
  }
  for (int i = 0; i < k; i++)
    EXPECT_EQ(zpp_request_wait(req[i]), ZPP_OK) << zpp_get_last_error();
  // MPI_THREAD_MULTIPLE (the suite's default): exactly the engine thread.
  EXPECT_EQ(g_threads_created.load() - before, 1);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
}

// Under a sanitizer (make test-asan-mpi, test-tsan) malloc is the
// sanitizer's: glibc's mallinfo2 and mallopt then see nothing, and the
// sanitizer's allocator answers instead.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZPP_TEST_SANITIZED 1
// <sanitizer/allocator_interface.h> (clang's; gcc ships no header for it)
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#else
#define ZPP_TEST_SANITIZED 0
#endif

size_t heap_in_use() {
#if ZPP_TEST_SANITIZED
  return __sanitizer_get_current_allocated_bytes();
#else
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#endif
}

TEST(EngineMemory, ScratchIsFreedByCommDestroy) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  // 1M elements per rank, not chunked (ZPP_PIPE_MIN_CHUNK=0 here): the
  // scratch of the call is one buffer of every rank's encoded shard,
  // size * (n codes + scales) bytes.  (Chunked at ctest's
  // ZPP_PIPE_MIN_CHUNK=256, it is 3 slots of 1/32 of that: 3/8 n at 4
  // ranks, too close to what MPI keeps for a bound.)
  const size_t n = (size_t)1 << 20;
  std::vector<float> x = gen(n, 3), y(n * (size_t)g_size);
  ScopedEnv unchunked("ZPP_PIPE_MIN_CHUNK", "0", zpp_settings_reload);
  size_t before = heap_in_use(), during;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  EXPECT_EQ(zpp_qwz_allgather(c, &q, x.data(), y.data(), n, ZPP_FLOAT32,
                              nullptr, nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  during = heap_in_use();
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  size_t after = heap_in_use();
  // The gather keeps size * n encoded bytes of scratch (> n bytes) cached;
  // destroy must give it back (what MPI keeps for the communicator is far
  // smaller).
  EXPECT_GT(during, before + n) << "expected cached scratch while alive";
  EXPECT_LT(after, before + n / 4)
      << "heap in use: before " << before << ", with the communicator "
      << during << ", after destroy " << after;
}

// hpZ: destroying the handle while started gathers are still queued on the
// engine thread must not free the secondary copy (or the handle) under
// them.  Rank 0's engine is held by an all-gather the others join only
// 300 ms later, so its backward gather runs after zpp_hpz_destroy
// returned.  Freed memory is filled (M_PERTURB), so a backward gather that
// reads a freed secondary copy differs from the forward gather; before the
// fix it did, and the handle's fields were read after free.
TEST(EngineHpz, DestroyWithStartedGathersQueued) {
  if (!g_uniform || g_nnodes < 2) GTEST_SKIP() << "needs uniform nodes";
  const size_t n = 4096;  // secondary copy > the malloc tcache sizes
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  ASSERT_EQ(zpp_hpz_create(g_comm, &hc, n, ZPP_FLOAT32, &h), ZPP_OK)
      << zpp_get_last_error();
  std::vector<float> x = gen(n, 20), y(n * (size_t)g_size),
                     z(n * (size_t)g_size, 0.0f), a = gen(n, 21),
                     b(n * (size_t)g_size), want(n * (size_t)g_size);
  // Freed memory is overwritten, so a gather that used the destroyed hpZ's
  // buffers reads garbage; ASan instead reports any such read itself.
  if (!ZPP_TEST_SANITIZED) {
    ASSERT_EQ(mallopt(M_PERTURB, 0x5a), 1);
  }
  EXPECT_EQ(zpp_hpz_forward_gather(h, x.data(), y.data(), nullptr, nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  if (g_rank != 0) usleep(300 * 1000);
  zpp_request_t ra = nullptr, rb = nullptr;
  EXPECT_EQ(zpp_allgather(g_comm, a.data(), b.data(), n, ZPP_FLOAT32, nullptr,
                          &ra),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, z.data(), nullptr, &rb),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_hpz_destroy(h), ZPP_OK);  // rb is still queued on rank 0
  EXPECT_EQ(zpp_request_wait(ra), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(zpp_request_wait(rb), ZPP_OK) << zpp_get_last_error();
  mallopt(M_PERTURB, 0);
  // the backward gather is bitwise the forward one, which is qwZ's (the
  // codec's bound is tested in test_coll; here the copy must be intact)
  zpp_quant_config_t q = hc.quant;
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, x.data(), want.data(), n,
                              ZPP_FLOAT32, nullptr, nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * 4), 0)
      << "forward gather differs from qwZ";
  size_t bad = 0;
  for (size_t i = 0; i < z.size(); i++) bad += z[i] != y[i];
  EXPECT_EQ(bad, 0u) << "backward gather differs from forward in " << bad
                     << " of " << z.size() << " elements";
}

// Plans of kernel steps only (no transfers, nothing shared between
// ranks), built with the engine's interface: one that sleeps `arg` ms and
// one that records that it ran.
zpp_status_t sleep_step(void *, size_t ms) {
  usleep((useconds_t)ms * 1000);
  return ZPP_OK;
}
zpp_status_t mark_step(void *ctx, size_t) {
  static_cast<std::atomic<int> *>(ctx)->store(1);
  return ZPP_OK;
}
zpp_status_t submit_kernel(zpp_comm_t c, zpp_kernel_fn fn, void *ctx,
                           size_t arg, zpp_request_t *req) {
  zpp_exec_t ex;
  zpp_plan_t *p = nullptr;
  zpp_status_t st = zpp_exec_init("test", c, nullptr, &ex);
  if (st == ZPP_OK) st = zpp_plan_create("test", &ex, ctx, nullptr, &p);
  if (st != ZPP_OK) return st;
  zpp_plan_kernel(p, fn, arg, ZPP_NO_STEP, ZPP_NO_STEP);
  return zpp_plan_submit(p, req);
}

// A wait that gives up (the engine finished nothing for 2 x timeout + 1 s)
// returns ZPP_ERR_TIMEOUT; the collective it waited for must then never
// run: the caller may free its buffers.  The bugs it catches: a blocking
// call queued behind a stuck plan freeing its request and returning while
// the engine later runs its plan and writes the freed request; a timed-out
// zpp_request_wait leaving its plan queued, to run at destroy.
TEST(EngineTimeout, GivingUpDropsTheQueuedPlan) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 0.3;  // waits give up after 1.6 s without progress
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  std::atomic<int> started_ran{0}, blocking_ran{0};
  zpp_request_t slow = nullptr, started = nullptr;
  // the engine thread is stuck for 3 s in a plan of this rank's own
  ASSERT_EQ(submit_kernel(c, sleep_step, nullptr, 3000, &slow), ZPP_OK)
      << zpp_get_last_error();
  ASSERT_EQ(submit_kernel(c, mark_step, &started_ran, 0, &started), ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(submit_kernel(c, mark_step, &blocking_ran, 0, nullptr),
            ZPP_ERR_TIMEOUT);
  EXPECT_EQ(zpp_request_wait(started), ZPP_ERR_TIMEOUT);
  EXPECT_NE(zpp_request_wait(slow), ZPP_OK);  // aborted by the timeouts
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);  // the engine drains first
  EXPECT_EQ(blocking_ran.load(), 0)
      << "a blocking call's plan ran after the call had timed out";
  EXPECT_EQ(started_ran.load(), 0)
      << "a started call's plan ran after its wait had timed out";
}

// A plan that keeps making progress is not a hung one: 8 steps of 0.4 s
// (3.2 s in all) against waits that give up after 1.6 s without progress.
// The bug it catches: only a finished plan counting as progress, so the
// wait returns ZPP_ERR_TIMEOUT (and breaks the communicator) mid-plan.
TEST(EngineTimeout, ALongPlanThatKeepsMovingIsNotTimedOut) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 0.3;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  zpp_exec_t ex;
  zpp_plan_t *p = nullptr;
  std::atomic<int> ran{0};
  ASSERT_EQ(zpp_exec_init("test", c, nullptr, &ex), ZPP_OK);
  ASSERT_EQ(zpp_plan_create("test", &ex, &ran, nullptr, &p), ZPP_OK);
  int prev = ZPP_NO_STEP;
  for (int i = 0; i < 8; i++) prev = zpp_plan_kernel(p, sleep_step, 400, prev, ZPP_NO_STEP);
  zpp_plan_kernel(p, mark_step, 0, prev, ZPP_NO_STEP);
  zpp_request_t req = nullptr;
  ASSERT_EQ(zpp_plan_submit(p, &req), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
}

// Creation where ranks ask for different backends fails on every rank,
// naming the field and a rank, within the timeout (before, rank 0 built a
// UCX transport and the others MPI ones, and they waited for each other).
TEST(Creation, DifferentBackendsAcrossRanksFailOnEveryRank) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.backend = g_rank == 0 ? ZPP_BACKEND_UCX : ZPP_BACKEND_MPI;
  cfg.timeout_s = 10;
  zpp_comm_t c = nullptr;
  double t0 = MPI_Wtime();
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  EXPECT_EQ(st, ZPP_ERR_MISMATCH) << zpp_get_last_error();
  EXPECT_EQ(c, nullptr);
  EXPECT_LT(MPI_Wtime() - t0, 15.0);
  EXPECT_NE(std::string(zpp_get_last_error()).find("backend"),
            std::string::npos)
      << zpp_get_last_error();
  if (c != nullptr) zpp_comm_destroy(c);
}

void setup() {
  zpp_test::OpenComm((unsigned long long)seed(), &g_comm, &g_rank, &g_size,
                     &g_nnodes, &g_uniform);
}

void teardown() { zpp_comm_destroy(g_comm); }

}  // namespace

int main(int argc, char **argv) {
  return zpp_test::RunAllRanks(argc, argv, setup, teardown);
}
