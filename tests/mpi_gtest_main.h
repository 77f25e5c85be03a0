// Shared main for multi-rank GoogleTest suites run under mpirun.
//
// Rank 0 prints the usual gtest output; other ranks print only their
// failures, prefixed with their rank.  The process exit code is non-zero
// on every rank if any rank failed a test, so mpirun (and ctest) see it.
// Include this from exactly one .cc of a test executable and define
// ZPP_MPI_TEST_SETUP / ZPP_MPI_TEST_TEARDOWN hooks before including.
#ifndef ZPP_TESTS_MPI_GTEST_MAIN_H
#define ZPP_TESTS_MPI_GTEST_MAIN_H

#include <gtest/gtest.h>
#include <mpi.h>
#include <zpp/zpp_mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

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

// Creates the suite's communicator over MPI_COMM_WORLD (ZPP_TOPO applies)
// in the suite's memory space and backend (test_memory.h) and reads the
// layout; aborts the job when creation fails, since no test can run
// without it.  Rank 0 prints the seed, the layout and the memory space.
inline void OpenComm(unsigned long long seed, zpp_comm_t *comm, int *rank,
                     int *size, int *nnodes, int *uniform) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  ApplyMemoryConfig(&cfg);  // ZPP_TEST_MEMORY, ZPP_TEST_BACKEND
  int dev = UseSuiteDevice();
  if (zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, comm) != ZPP_OK) {
    std::fprintf(stderr, "zpp_comm_create_mpi: %s\n", zpp_get_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  zpp_comm_rank(*comm, rank);
  zpp_comm_size(*comm, size);
  zpp_comm_nnodes(*comm, nnodes);
  zpp_comm_topo_uniform(*comm, uniform);
  zpp_backend_t be = ZPP_BACKEND_AUTO;
  zpp_comm_backend(*comm, &be);
  if (*rank == 0)
    std::printf("seed ZPP_TEST_SEED=%llu; %d nodes, uniform %d; %s memory%s, backend %s\n",
                seed, *nnodes, *uniform, dev >= 0 ? "device" : "host",
                dev >= 0 ? " (ZPP_TEST_MEMORY)" : "", zpp_backend_name(be));
}

inline int RunAllRanks(int argc, char **argv, void (*setup)(),
                       void (*teardown)()) {
  int provided = 0, rank = 0, size = 1;
  // ZPP_TEST_MPI_THREAD=serialized runs a suite at the lower level, where
  // zpp must run started collectives inline instead of on a thread.
  const char *lvl = std::getenv("ZPP_TEST_MPI_THREAD");
  int want = lvl && std::string(lvl) == "serialized" ? MPI_THREAD_SERIALIZED
                                                     : MPI_THREAD_MULTIPLE;
  MPI_Init_thread(&argc, &argv, want, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  if (rank == 0) {
    const char *topo = std::getenv("ZPP_TOPO");
    std::printf("%d ranks; topology %s%s\n", size,
                topo && *topo ? "EMULATED by ZPP_TOPO=" : "discovered",
                topo && *topo ? topo : "");
  }
  if (setup) setup();
  int failed = RUN_ALL_TESTS() != 0;
  if (teardown) teardown();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any)
    std::printf("FAILED on at least one rank (see [rank N] lines)\n");
  MPI_Finalize();
  return any ? 1 : 0;
}

}  // namespace zpp_test

#endif  // ZPP_TESTS_MPI_GTEST_MAIN_H
