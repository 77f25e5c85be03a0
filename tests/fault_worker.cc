// The job tests/fault_inject.sh injects faults into: every rank runs
// collectives back to back on one communicator (zpp_comm_create_mpi), and
// checks every result against a reference, until rank 0 sees the file
// $ZPP_FAULT_OUT/stop (the flag rides in the iteration's first collective,
// so every rank stops after the same iteration) or a collective fails.
//
// Per iteration, on random data (seed ZPP_TEST_SEED, printed):
//   - zpp_allgather of one flag (rank 0's stop flag), then of n floats:
//     the result must equal every rank's data bit for bit;
//   - zpp_reduce_scatter SUM of small integers (exact in fp32): every
//     element must equal the integer sum;
//   - zpp_qwz_allgather (int8, block 256): every rank's block must equal
//     zpp_quant_decode(zpp_quant_encode(its data)) bit for bit.
// Each rank regenerates every rank's data from the seed, so the reference
// is computed without communication.
//
// Files in $ZPP_FAULT_OUT: pid.<rank> once the communicator exists;
// result.<rank> at the end: status, the wall-clock time of the failure
// (CLOCK_REALTIME, s), iterations, wrong elements, whether destroy
// returned, and the error message.  A rank whose communicator failed
// skips MPI_Finalize (a dead peer may hang it) and exits 3 after 2 s;
// else 0 when nothing was wrong, 1 when something was.
#include <mpi.h>
#include <unistd.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

namespace {

double wall_s() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

std::vector<float> data_of(uint64_t seed, int rank, int iter, size_t n,
                           bool integers) {
  std::mt19937_64 rng(seed * 1000003ull + (uint64_t)rank * 7919ull +
                      (uint64_t)iter);
  std::vector<float> x(n);
  if (integers) {
    std::uniform_int_distribution<int> d(-1000, 1000);
    for (auto &v : x) v = (float)d(rng);
  } else {
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto &v : x) v = d(rng);
  }
  return x;
}

std::string out_path(const char *dir, const char *what, int rank) {
  return std::string(dir) + "/" + what + "." + std::to_string(rank);
}

}  // namespace

int main(int argc, char **argv) {
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *dir = std::getenv("ZPP_FAULT_OUT");
  const char *s = std::getenv("ZPP_TEST_SEED");
  uint64_t seed = s ? std::strtoull(s, nullptr, 10) : 20261203ull;
  const size_t n = 1u << 14;  // floats per rank
  if (dir == nullptr) {
    std::fprintf(stderr, "fault_worker: set ZPP_FAULT_OUT\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rank == 0)
    std::printf("fault_worker: %d ranks, seed ZPP_TEST_SEED=%llu\n", size,
                (unsigned long long)seed);
  zpp_comm_t c = nullptr;
  if (zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, &c) != ZPP_OK) {
    std::fprintf(stderr, "rank %d: %s\n", rank, zpp_get_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  {
    FILE *f = std::fopen(out_path(dir, "pid", rank).c_str(), "w");
    if (f) {
      std::fprintf(f, "%d\n", (int)getpid());
      std::fclose(f);
    }
  }
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  size_t enc = 0;
  zpp_quant_encoded_size(&q, n, &enc);
  std::vector<unsigned char> ebuf(enc);
  std::vector<float> all(n * (size_t)size), ref(n), rs(n);
  zpp_status_t st = ZPP_OK;
  double failed_at = 0.0;
  long wrong = 0;
  int iter = 0;
  std::string stop_file = std::string(dir) + "/stop";
  for (iter = 0; iter < 1000000; iter++) {
    int flag = rank == 0 && access(stop_file.c_str(), F_OK) == 0;
    std::vector<int> flags((size_t)size);
    st = zpp_allgather(c, &flag, flags.data(), 1, ZPP_FLOAT32, nullptr,
                       nullptr);
    if (st != ZPP_OK) break;
    if (flags[0] != 0) break;
    // exact all-gather
    std::vector<float> x = data_of(seed, rank, iter, n, false);
    st = zpp_allgather(c, x.data(), all.data(), n, ZPP_FLOAT32, nullptr,
                       nullptr);
    if (st != ZPP_OK) break;
    for (int r = 0; r < size; r++) {
      std::vector<float> xr = data_of(seed, r, iter, n, false);
      if (std::memcmp(xr.data(), all.data() + (size_t)r * n, n * 4) != 0)
        wrong++;
    }
    // exact reduce-scatter of integers: shard `rank` of the sum
    std::vector<float> g = data_of(seed, rank, iter + 500000, n * (size_t)size,
                                   true);
    st = zpp_reduce_scatter(c, g.data(), rs.data(), n, ZPP_FLOAT32,
                            ZPP_OP_SUM, nullptr, nullptr);
    if (st != ZPP_OK) break;
    {
      std::vector<double> sum(n, 0.0);
      for (int r = 0; r < size; r++) {
        std::vector<float> gr =
            data_of(seed, r, iter + 500000, n * (size_t)size, true);
        for (size_t i = 0; i < n; i++) sum[i] += gr[(size_t)rank * n + i];
      }
      for (size_t i = 0; i < n; i++)
        if ((double)rs[i] != sum[i]) wrong++;
    }
    // qwZ: every block is the quantizer's round trip of its rank's data
    st = zpp_qwz_allgather(c, &q, x.data(), all.data(), n, ZPP_FLOAT32,
                           nullptr, nullptr);
    if (st != ZPP_OK) break;
    for (int r = 0; r < size; r++) {
      std::vector<float> xr = data_of(seed, r, iter, n, false);
      zpp_quant_encode(&q, ZPP_FLOAT32, xr.data(), n, ebuf.data(), enc);
      zpp_quant_decode(&q, ebuf.data(), enc, n, ZPP_FLOAT32, ref.data());
      if (std::memcmp(ref.data(), all.data() + (size_t)r * n, n * 4) != 0)
        wrong++;
    }
  }
  if (st != ZPP_OK) failed_at = wall_s();
  std::string msg = st != ZPP_OK ? zpp_get_last_error() : "";
  int destroyed = zpp_comm_destroy(c) == ZPP_OK;
  {
    FILE *f = std::fopen(out_path(dir, "result", rank).c_str(), "w");
    if (f) {
      std::fprintf(f,
                   "status %d\nfailed_at %.3f\niters %d\nwrong %ld\n"
                   "destroyed %d\nmsg %s\n",
                   (int)st, failed_at, iter, wrong, destroyed, msg.c_str());
      std::fclose(f);
    }
  }
  std::printf("rank %d: %d iterations, %ld wrong, status %s%s%s\n", rank, iter,
              wrong, zpp_status_string(st), msg.empty() ? "" : ": ",
              msg.c_str());
  std::fflush(stdout);
  // Stay 2 s before exiting: a survivor that exits at once looks like a
  // second failure to the survivors still waiting (UCX sees a closed
  // connection within milliseconds), and they would name it instead.
  if (st != ZPP_OK) {
    sleep(2);
    _exit(3);
  }
  MPI_Finalize();
  return wrong != 0 ? 1 : 0;
}
