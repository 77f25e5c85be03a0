// Shared main for multi-rank GoogleTest suites.
//
// Launch modes (ZPP_TEST_LAUNCH):
//   unset or "mpi": under mpirun; the communicator comes from
//     zpp_comm_create_mpi(MPI_COMM_WORLD) (the MPI bootstrap);
//   "env": started the way torchrun starts workers (RANK, WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT; tests/launch_env.py), with no MPI at all:
//     zpp_comm_create_from_env (zpp's TCP bootstrap, UCX transport).
// ZPP_TEST_SUBSET=1 runs the suite on communicators of rank lists instead
// of the whole job: the even ranks through zpp_comm_create_from_ranks, the
// odd ranks in reverse order through zpp_comm_split (so both halves run
// the suite at once, each on its own communicator).
// ZPP_BACKEND selects the transport as usual (e.g. ucx under mpirun).
//
// Helpers that need every rank (reductions over ranks for the checks)
// use the communicator's own bootstrap (zpp_comm_get_bootstrap), so they
// work in every mode and over subsets.
//
// Rank 0 prints the usual gtest output; other ranks print only their
// failures, prefixed with their rank.  The process exit code is non-zero
// on every rank if any rank failed a test, so the launcher (and ctest) see
// it.  Include this from exactly one .cc of a test executable.
#ifndef ZPP_TESTS_MPI_GTEST_MAIN_H
#define ZPP_TESTS_MPI_GTEST_MAIN_H

#include <gtest/gtest.h>
#include <mpi.h>
#include <zpp/zpp_mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_memory.h"

namespace zpp_test {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

inline bool EnvLaunch() {
  const char *m = std::getenv("ZPP_TEST_LAUNCH");
  return m != nullptr && std::string(m) == "env";
}
inline bool UsesMpi() { return !EnvLaunch(); }

struct State {
  zpp_comm_t world = nullptr;    // the whole job
  zpp_comm_t harness = nullptr;  // the communicator the suite runs on
};
inline State &state() {
  static State s;
  return s;
}

[[noreturn]] inline void Die(const char *what) {
  std::string msg = zpp_get_last_error();
  // The message already starts with the failing function's name.
  if (msg.rfind(what, 0) == 0)
    std::fprintf(stderr, "%s\n", msg.c_str());
  else
    std::fprintf(stderr, "%s: %s\n", what, msg.c_str());
  if (UsesMpi()) MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

// op: '+' sum, '<' min, '>' max of one value per rank of `comm`.
inline uint64_t Reduce(zpp_comm_t comm, uint64_t v, char op) {
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  if (zpp_comm_get_bootstrap(comm, &bs) != ZPP_OK) Die("zpp_comm_get_bootstrap");
  std::vector<uint64_t> all(bs.size);
  if (bs.allgather(bs.ctx, &v, sizeof v, all.data(), 120.0) != ZPP_OK)
    Die("bootstrap allgather of a test reduction");
  uint64_t r = op == '<' ? UINT64_MAX : 0;
  for (uint64_t x : all)
    r = op == '+' ? r + x : op == '<' ? std::min(r, x) : std::max(r, x);
  return r;
}
inline uint64_t Reduce(uint64_t v, char op) { return Reduce(state().harness, v, op); }
inline void Barrier() {
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  zpp_comm_get_bootstrap(state().harness, &bs);
  if (bs.barrier(bs.ctx, 120.0) != ZPP_OK) Die("bootstrap barrier");
}

// Creates the suite's communicator (see the modes above; ZPP_TOPO applies)
// and reads the layout; exits the job when creation fails, since no test
// can run without it.  Rank 0 prints the seed and the layout.
inline void OpenComm(unsigned long long seed, zpp_comm_t *comm, int *rank,
                     int *size, int *nnodes, int *uniform) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  ApplyMemoryConfig(&cfg);  // ZPP_TEST_MEMORY, ZPP_TEST_BACKEND (test_memory.h)
  int dev = UseSuiteDevice();
  State &s = state();
  zpp_status_t st = EnvLaunch() ? zpp_comm_create_from_env(&cfg, &s.world)
                                : zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &s.world);
  if (st != ZPP_OK) Die(EnvLaunch() ? "zpp_comm_create_from_env" : "zpp_comm_create_mpi");
  s.harness = s.world;
  const char *sub = std::getenv("ZPP_TEST_SUBSET");
  if (sub && std::atoi(sub) == 1) {
    int wr = 0, ws = 1;
    zpp_comm_rank(s.world, &wr);
    zpp_comm_size(s.world, &ws);
    std::vector<int> evens;
    for (int r = 0; r < ws; r += 2) evens.push_back(r);
    zpp_comm_t a = nullptr, b = nullptr;
    if (zpp_comm_create_from_ranks(s.world, (int)evens.size(), evens.data(), &a) != ZPP_OK)
      Die("zpp_comm_create_from_ranks");
    if (zpp_comm_split(s.world, wr % 2 ? 0 : ZPP_SPLIT_NONE, -wr, &b) != ZPP_OK)
      Die("zpp_comm_split");
    if ((a == nullptr) == (b == nullptr)) {
      std::fprintf(stderr, "rank %d: in %s of the subsets\n", wr, a ? "both" : "none");
      std::exit(2);
    }
    s.harness = a ? a : b;
  }
  *comm = s.harness;
  zpp_comm_rank(*comm, rank);
  zpp_comm_size(*comm, size);
  zpp_comm_nnodes(*comm, nnodes);
  zpp_comm_topo_uniform(*comm, uniform);
  if (*rank == 0) {
    zpp_backend_t b = ZPP_BACKEND_AUTO;
    zpp_comm_backend(*comm, &b);
    std::printf("seed ZPP_TEST_SEED=%llu; %d ranks, %d nodes, uniform %d; "
                "bootstrap %s, backend %s%s; %s memory%s\n",
                seed, *size, *nnodes, *uniform, zpp_comm_bootstrap_name(*comm),
                zpp_backend_name(b), s.harness != s.world ? " (a subset)" : "",
                dev >= 0 ? "device" : "host",
                dev >= 0 ? " (ZPP_TEST_MEMORY)" : "");
  }
}

// teardown() destroys the suite's communicator (and is called before the
// whole job's, which this function frees).
inline int RunAllRanks(int argc, char **argv, void (*setup)(),
                       void (*teardown)()) {
  int provided = 0, rank = 0, size = 1;
  // This suite's references follow one forced family (ZPP_ALGO=flat, else
  // hier); the per-call choice of ZPP_ALGO=auto, the library's default, is
  // tests/test_tuner.cc's.  Set before MPI or zpp start any thread.
  setenv("ZPP_ALGO", "hier", 0);
  if (UsesMpi()) {
    // ZPP_TEST_MPI_THREAD=serialized runs a suite at the lower level, where
    // zpp must run started collectives inline instead of on a thread.
    const char *lvl = std::getenv("ZPP_TEST_MPI_THREAD");
    int want = lvl && std::string(lvl) == "serialized" ? MPI_THREAD_SERIALIZED
                                                       : MPI_THREAD_MULTIPLE;
    MPI_Init_thread(&argc, &argv, want, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  } else {
    rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
    size = std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  if (rank == 0) {
    const char *topo = std::getenv("ZPP_TOPO");
    std::printf("%d ranks (%s); topology %s%s\n", size,
                UsesMpi() ? "mpirun" : "environment, no MPI",
                topo && *topo ? "EMULATED by ZPP_TOPO=" : "discovered",
                topo && *topo ? topo : "");
  }
  if (setup) setup();
  int failed = RUN_ALL_TESTS() != 0;
  // Over the whole job, before anything is torn down.
  uint64_t any = Reduce(state().world, (uint64_t)failed, '>');
  if (teardown) teardown();
  if (state().world != state().harness) zpp_comm_destroy(state().world);
  if (rank == 0 && any)
    std::printf("FAILED on at least one rank (see [rank N] lines)\n");
  if (UsesMpi()) MPI_Finalize();
  return any ? 1 : 0;
}

}  // namespace zpp_test

#endif  // ZPP_TESTS_MPI_GTEST_MAIN_H
