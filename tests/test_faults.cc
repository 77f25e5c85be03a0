// Faults on one communicator, under mpirun (ctest faults_2x2 and
// faults_check_2x2, the latter with ZPP_CHECK=1): a peer that never comes,
// zpp_comm_abort from another thread, an injected failure on the engine
// thread.  What must hold (include/zpp/zpp_comm.h, "faults"):
//   - abort ends a blocking call and every pending request with
//     ZPP_ERR_ABORTED promptly (here: within kPrompt of the abort, while
//     the communicator's own timeout is 60 s);
//   - a timeout names the rank that never came;
//   - after a failure, later calls fail at once with the *first* error,
//     zpp_comm_get_async_error reports it, and zpp_comm_destroy returns;
//   - every wait in creation (MPI_Comm_idup, the bootstrap's exchanges,
//     subsets) is bounded and names the missing rank where MPI lets it.
// Rank kAbsent (the last) plays the peer that never comes; the others
// must not depend on its MPI progress.  Needs at least 3 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mpi_gtest_main.h"
#include "core/core.h"  // zpp_error, for the injected failure
#include "comm/comm.h"
#include "engine/plan.h"      // the engine's interface, to inject a failing step

namespace {

zpp_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1, g_provided = 0;

// A prompt return: the engine polls every <= 200 us; the margin is for a
// loaded 2-core machine running 4 ranks.
constexpr double kPrompt = 2.0;

double now_s() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int absent() { return g_size - 1; }

bool check_mode() {
  const char *c = std::getenv("ZPP_CHECK");
  return c != nullptr && std::atoi(c) != 0;
}

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261202ull;
}

std::vector<float> gen(size_t n, uint64_t tag) {
  std::mt19937_64 rng(seed() * 131ull + tag * 7919ull + (uint64_t)g_rank);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto &v : x) v = nd(rng);
  return x;
}

zpp_comm_t make_comm(double timeout_s) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = timeout_s;
  zpp_comm_t c = nullptr;
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK)
      << zpp_get_last_error();
  return c;
}

// Whether any rank's flag is set (MPI, outside the communicators under
// test).
bool any_rank(bool ok) {
  int mine = ok ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any == 1;
}

// After the first error `first`: later calls fail at once with it, the
// asynchronous error is it, destroy returns.
void expect_dead(zpp_comm_t c, zpp_status_t first) {
  std::vector<float> x = gen(256, 99), y(256 * (size_t)g_size);
  double t0 = now_s();
  EXPECT_EQ(zpp_allgather(c, x.data(), y.data(), 256, ZPP_FLOAT32, nullptr,
                          nullptr),
            first);
  EXPECT_NE(std::string(zpp_get_last_error()).find("aborted earlier"),
            std::string::npos)
      << zpp_get_last_error();
  zpp_request_t req = nullptr;
  EXPECT_EQ(zpp_allgather(c, x.data(), y.data(), 256, ZPP_FLOAT32, nullptr,
                          &req),
            first);
  EXPECT_EQ(req, nullptr);
  zpp_comm_t sub = nullptr;
  EXPECT_EQ(zpp_comm_split(c, 0, g_rank, &sub), first);
  EXPECT_LT(now_s() - t0, 0.5) << "later calls did not fail at once";
  zpp_status_t as = ZPP_OK;
  EXPECT_EQ(zpp_comm_get_async_error(c, &as), ZPP_OK);
  EXPECT_EQ(as, first) << zpp_get_last_error();
  t0 = now_s();
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  EXPECT_LT(now_s() - t0, kPrompt) << "destroy took long";
}

TEST(Faults, StatusStringOfAborted) {
  EXPECT_EQ(std::string(zpp_status_string(ZPP_ERR_ABORTED))
                .rfind("ZPP_ERR_ABORTED: ", 0),
            0u);
  EXPECT_EQ(zpp_comm_abort(nullptr), ZPP_ERR_NULL_POINTER);
  zpp_status_t s;
  EXPECT_EQ(zpp_comm_get_async_error(nullptr, &s), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_comm_get_async_error(g_comm, nullptr), ZPP_ERR_NULL_POINTER);
  EXPECT_NE(std::string(zpp_get_last_error()).find("status is NULL"),
            std::string::npos);
  EXPECT_EQ(zpp_comm_get_async_error(g_comm, &s), ZPP_OK);
  EXPECT_EQ(s, ZPP_OK);
}

// A blocking collective waits for a peer that never comes; another thread
// aborts: the call returns ZPP_ERR_ABORTED long before the timeout.  With
// ZPP_CHECK=1 the wait is in the argument exchange (the bootstrap), else in
// the transfers.
TEST(Faults, AbortFromAnotherThreadEndsABlockingWait) {
  zpp_comm_t c = make_comm(60.0);
  ASSERT_NE(c, nullptr);
  if (g_rank != absent()) {
    const size_t n = 4096;
    std::vector<float> x = gen(n, 1), y(n * (size_t)g_size);
    std::atomic<double> aborted_at{0.0};
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      aborted_at = now_s();
      EXPECT_EQ(zpp_comm_abort(c), ZPP_OK);
    });
    zpp_status_t st = zpp_allgather(c, x.data(), y.data(), n, ZPP_FLOAT32,
                                    nullptr, nullptr);
    double back = now_s();
    killer.join();
    EXPECT_EQ(st, ZPP_ERR_ABORTED) << zpp_get_last_error();
    EXPECT_LT(back - aborted_at.load(), kPrompt);
    EXPECT_NE(std::string(zpp_comm_get_last_error(c)).find("zpp_comm_abort"),
              std::string::npos)
        << zpp_comm_get_last_error(c);
    expect_dead(c, ZPP_ERR_ABORTED);
  } else {
    EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Started collectives queued on the engine (the first waits for the absent
// peer, the others behind it); the caller waits on the first while another
// thread aborts: every request ends with ZPP_ERR_ABORTED promptly, the
// queued ones never run.
TEST(Faults, AbortEndsEveryPendingRequest) {
  if (g_provided < MPI_THREAD_MULTIPLE)
    GTEST_SKIP() << "started collectives need MPI_THREAD_MULTIPLE";
  zpp_comm_t c = make_comm(60.0);
  ASSERT_NE(c, nullptr);
  if (g_rank != absent()) {
    const size_t n = 2048;
    const int k = 3;
    zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
    std::vector<std::vector<float>> x(k), y(k);
    std::vector<zpp_request_t> req(k, nullptr);
    std::atomic<double> aborted_at{0.0};
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      aborted_at = now_s();
      zpp_comm_abort(c);
    });
    // With ZPP_CHECK=1 a start waits in the argument exchange (on the
    // caller's thread): the abort ends that wait, and the later starts
    // fail at once.
    std::vector<zpp_status_t> started(k);
    for (int i = 0; i < k; i++) {
      x[i] = gen(n, 10 + (uint64_t)i);
      y[i].assign(n * (size_t)g_size, -7.0f);
      started[i] = zpp_qwz_allgather(c, &q, x[i].data(), y[i].data(), n,
                                     ZPP_FLOAT32, nullptr, &req[i]);
    }
    double back = 0.0;
    if (check_mode()) {
      back = now_s();
      for (int i = 0; i < k; i++) {
        EXPECT_EQ(started[i], ZPP_ERR_ABORTED);
        EXPECT_EQ(req[i], nullptr);
      }
    } else {
      for (int i = 0; i < k; i++)
        EXPECT_EQ(started[i], ZPP_OK);
      EXPECT_EQ(zpp_request_wait(req[0]), ZPP_ERR_ABORTED)
          << zpp_get_last_error();
      back = now_s();
    }
    killer.join();
    EXPECT_LT(back - aborted_at.load(), kPrompt);
    for (int i = 1; i < k && !check_mode(); i++) {
      int done = 0;
      EXPECT_EQ(zpp_request_test(req[i], &done), ZPP_OK);
      EXPECT_EQ(done, 1) << "request " << i << " still pending after abort";
      EXPECT_EQ(zpp_request_wait(req[i]), ZPP_ERR_ABORTED) << zpp_get_last_error();
      // a queued plan never ran: its output is untouched
      EXPECT_EQ(y[i][0], -7.0f) << "request " << i << " wrote its output";
    }
    EXPECT_LT(now_s() - aborted_at.load(), kPrompt);
    expect_dead(c, ZPP_ERR_ABORTED);
  } else {
    EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The injected failure: a kernel step of a started plan fails on the
// engine thread, on every rank (local: no peer is involved).
zpp_status_t failing_step(void *, size_t) {
  return zpp_error(ZPP_ERR_IO, "injected", "injected failure on the engine");
}
zpp_status_t count_step(void *ctx, size_t) {
  static_cast<std::atomic<int> *>(ctx)->fetch_add(1);
  return ZPP_OK;
}

zpp_status_t submit_kernel(zpp_comm_t c, zpp_status_t (*fn)(void *, size_t),
                           void *ctx, zpp_request_t *req) {
  zpp_exec_t ex;
  zpp_plan_t *p = nullptr;
  zpp_status_t st = zpp_exec_init("test", c, nullptr, &ex);
  if (st == ZPP_OK) st = zpp_plan_create("test", &ex, ctx, nullptr, &p);
  if (st != ZPP_OK) return st;
  zpp_plan_kernel(p, fn, 0, ZPP_NO_STEP, ZPP_NO_STEP);
  return zpp_plan_submit(p, req);
}

TEST(Faults, AsyncErrorReportsAFailedStartedCollective) {
  zpp_comm_t c = make_comm(60.0);
  ASSERT_NE(c, nullptr);
  std::atomic<int> later{0};
  zpp_request_t bad = nullptr;
  ASSERT_EQ(submit_kernel(c, failing_step, nullptr, &bad), ZPP_OK)
      << zpp_get_last_error();
  // Without MPI_THREAD_MULTIPLE the plan ran inline and failed already.
  zpp_status_t as = ZPP_OK;
  double t0 = now_s();
  while (as == ZPP_OK && now_s() - t0 < 10.0) {
    EXPECT_EQ(zpp_comm_get_async_error(c, &as), ZPP_OK);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(as, ZPP_ERR_IO);
  EXPECT_NE(std::string(zpp_get_last_error()).find("test failed on this rank"),
            std::string::npos)
      << zpp_get_last_error();
  EXPECT_EQ(zpp_request_wait(bad), ZPP_ERR_IO);
  EXPECT_NE(std::string(zpp_get_last_error()).find("injected failure"),
            std::string::npos)
      << zpp_get_last_error();
  // a plan started after the failure never runs its steps
  zpp_request_t after = nullptr;
  EXPECT_EQ(submit_kernel(c, count_step, &later, &after), ZPP_ERR_IO);
  EXPECT_EQ(after, nullptr);
  // an abort now does not replace the first error
  EXPECT_EQ(zpp_comm_abort(c), ZPP_OK);
  EXPECT_EQ(later.load(), 0);
  expect_dead(c, ZPP_ERR_IO);
  MPI_Barrier(MPI_COMM_WORLD);
}

// A peer that never comes, no abort: the others get ZPP_ERR_TIMEOUT after
// the timeout; the error names it (ZPP_CHECK: every waiting rank does, from
// the bootstrap exchange; the transfers: the ranks that wait for it
// directly, and every rank on this machine sees that it is not gone).
TEST(Faults, TimeoutNamesTheMissingRank) {
  const double timeout = 1.0;
  zpp_comm_t c = make_comm(timeout);
  ASSERT_NE(c, nullptr);
  bool names = true;
  if (g_rank != absent()) {
    const size_t n = 1024;
    std::vector<float> x = gen(n, 3), y(n * (size_t)g_size);
    double t0 = now_s();
    zpp_status_t st = zpp_allgather(c, x.data(), y.data(), n, ZPP_FLOAT32,
                                    nullptr, nullptr);
    double s = now_s() - t0;
    std::string msg = zpp_get_last_error();
    EXPECT_EQ(st, ZPP_ERR_TIMEOUT) << msg;
    EXPECT_GE(s, timeout * 0.95);
    EXPECT_LT(s, timeout + kPrompt);
    std::string who = "rank " + std::to_string(absent());
    std::string peer = "from " + std::to_string(absent());
    names = msg.find(who) != std::string::npos ||
            msg.find(peer) != std::string::npos ||
            msg.find("to " + std::to_string(absent())) != std::string::npos;
    if (check_mode()) {
      EXPECT_TRUE(names) << msg;
      EXPECT_NE(msg.find(who + " did not take part"), std::string::npos) << msg;
    }
    expect_dead(c, ZPP_ERR_TIMEOUT);
  } else {
    names = false;
    EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  }
  EXPECT_TRUE(any_rank(names)) << "no rank named the missing rank";
  MPI_Barrier(MPI_COMM_WORLD);
}

// A subset made without the absent rank: the others' exchange over the
// parent's bootstrap times out naming it.
TEST(Faults, SplitWithAMissingRankNamesIt) {
  const double timeout = 1.0;
  zpp_comm_t c = make_comm(timeout);
  ASSERT_NE(c, nullptr);
  if (g_rank != absent()) {
    zpp_comm_t sub = nullptr;
    double t0 = now_s();
    EXPECT_EQ(zpp_comm_split(c, 0, g_rank, &sub), ZPP_ERR_TIMEOUT);
    double s = now_s() - t0;
    std::string msg = zpp_get_last_error();
    EXPECT_NE(msg.find("rank " + std::to_string(absent()) + " did not take part"),
              std::string::npos)
        << msg;
    EXPECT_LT(s, timeout + kPrompt);
    EXPECT_EQ(sub, nullptr);
  }
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Creation without one rank: MPI_Comm_idup is polled until the timeout
// (MPI cannot say who is missing there).  On a communicator of its own:
// the others' duplication stays pending in MPI for good.
TEST(Faults, CreationWithoutARankIsBounded) {
  MPI_Comm scratch;
  MPI_Comm_dup(MPI_COMM_WORLD, &scratch);
  if (g_rank != absent()) {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.timeout_s = 1.0;
    zpp_comm_t c = nullptr;
    double t0 = now_s();
    EXPECT_EQ(zpp_comm_create_mpi(scratch, &cfg, &c), ZPP_ERR_TIMEOUT);
    EXPECT_LT(now_s() - t0, 1.0 + kPrompt);
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::string(zpp_get_last_error()).find("MPI_Comm_idup"),
              std::string::npos)
        << zpp_get_last_error();
  }
  // scratch is left alone: a pending collective is on it
  MPI_Barrier(MPI_COMM_WORLD);
}

// Lists that differ: every rank fails with ZPP_ERR_MISMATCH naming a rank
// whose list differs, at once (no timeout).
TEST(Faults, CreateFromRanksListsMustAgree) {
  zpp_comm_t c = make_comm(30.0);
  ASSERT_NE(c, nullptr);
  std::vector<int> list;
  for (int r = 0; r < g_size - 1; r++) list.push_back(r);
  if (g_rank == 0) list.back() = g_size - 1;  // rank 0 differs
  zpp_comm_t sub = nullptr;
  double t0 = now_s();
  EXPECT_EQ(zpp_comm_create_from_ranks(c, (int)list.size(), list.data(), &sub),
            ZPP_ERR_MISMATCH);
  EXPECT_LT(now_s() - t0, kPrompt);
  EXPECT_EQ(sub, nullptr);
  std::string msg = zpp_get_last_error();
  EXPECT_NE(msg.find("passed another list"), std::string::npos) << msg;
  // rank 0 names rank 1; the others name rank 0
  std::string named = "rank " + std::to_string(g_rank == 0 ? 1 : 0) + " passed";
  EXPECT_NE(msg.find(named), std::string::npos) << msg;
  // an invalid list on one rank fails every rank, naming it
  std::vector<int> bad = {0, 0};
  EXPECT_NE(zpp_comm_create_from_ranks(c, g_rank == 1 ? 2 : 1,
                                       g_rank == 1 ? bad.data() : list.data(),
                                       &sub),
            ZPP_OK);
  if (g_rank != 1) {
    EXPECT_NE(std::string(zpp_get_last_error()).find("rank 1 failed"),
              std::string::npos)
        << zpp_get_last_error();
  }
  // the same list everywhere works
  for (int r = 0; r < g_size - 1; r++) list[(size_t)r] = r;
  ASSERT_EQ(zpp_comm_create_from_ranks(c, (int)list.size(), list.data(), &sub),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(sub == nullptr, g_rank == g_size - 1);
  EXPECT_EQ(zpp_comm_destroy(sub), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  MPI_Barrier(MPI_COMM_WORLD);
}

// A subset of a subset, split by its members only (the other half does
// something else).  Under MPI sibling subsets share their parent's
// duplicates, and a duplication is collective over all their ranks: the
// split must not wait for the other half until the timeout.  It fails at
// once, on every member, saying so.  A subset of all the ranks
// (reordered) has no siblings and splits again, with correct blocks; its
// MPI communicator is refused (MPI's rank order is not its own).
TEST(Faults, SplitOfASubsetFailsAtOnceOrWorks) {
  const double timeout = 5.0;
  zpp_comm_t c = make_comm(timeout);
  ASSERT_NE(c, nullptr);
  zpp_comm_t half = nullptr, inner = nullptr, rev = nullptr;
  ASSERT_EQ(zpp_comm_split(c, g_rank % 2, g_rank, &half), ZPP_OK)
      << zpp_get_last_error();
  if (g_rank % 2 == 0) {
    int hr = -1;
    zpp_comm_rank(half, &hr);
    double t0 = now_s();
    EXPECT_EQ(zpp_comm_split(half, 0, -hr, &inner), ZPP_ERR_UNSUPPORTED)
        << zpp_get_last_error();
    EXPECT_LT(now_s() - t0, kPrompt) << "the inner split waited";
    EXPECT_NE(std::string(zpp_get_last_error()).find("cannot be split again"),
              std::string::npos)
        << zpp_get_last_error();
    EXPECT_EQ(inner, nullptr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // every rank, reversed; then that again, reversed: the original order
  ASSERT_EQ(zpp_comm_split(c, 0, -g_rank, &rev), ZPP_OK) << zpp_get_last_error();
  MPI_Comm mc = MPI_COMM_NULL;
  EXPECT_EQ(zpp_comm_get_mpi_comm(rev, &mc), ZPP_ERR_UNSUPPORTED);
  int rr = -1;
  zpp_comm_rank(rev, &rr);
  EXPECT_EQ(rr, g_size - 1 - g_rank);
  ASSERT_EQ(zpp_comm_split(rev, 0, -rr, &inner), ZPP_OK) << zpp_get_last_error();
  int ir = -1;
  zpp_comm_rank(inner, &ir);
  EXPECT_EQ(ir, g_rank);
  const size_t n = 300;
  std::vector<float> x = gen(n, 40), all((size_t)g_size * n);
  std::vector<float> y(n * (size_t)g_size, -1.0f);
  MPI_Allgather(x.data(), (int)n, MPI_FLOAT, all.data(), (int)n, MPI_FLOAT,
                MPI_COMM_WORLD);
  EXPECT_EQ(zpp_allgather(inner, x.data(), y.data(), n, ZPP_FLOAT32, nullptr,
                          nullptr),
            ZPP_OK)
      << zpp_get_last_error();
  EXPECT_EQ(std::memcmp(y.data(), all.data(), y.size() * 4), 0);
  EXPECT_EQ(zpp_comm_destroy(inner), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(rev), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(half), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char **argv) {
  return zpp_test::RunAllRanks(
      argc, argv,
      [] {
        MPI_Query_thread(&g_provided);
        int nn = 0, un = 0;
        zpp_test::OpenComm(seed(), &g_comm, &g_rank, &g_size, &nn, &un);
        if (g_size < 3) {
          std::fprintf(stderr, "test_faults needs at least 3 ranks\n");
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
      },
      [] { zpp_comm_destroy(g_comm); });
}
