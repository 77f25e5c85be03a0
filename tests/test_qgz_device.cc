// qgZ on device memory (ZPP_TEST_MEMORY=device, the emulated build): the
// device path makes one batched launch per kind of work in each kernel
// step, so its kernel launches per call do not grow with the number of
// ranks; and its bits are those of the host path.
//
// Run under mpirun on an emulated layout of 8 ranks (ZPP_TOPO=2x4 or
// 4x2; tests/qgz_device.cmake): the launches of one call on the whole job
// are compared with those on a subset of half the ranks per node (2x4 vs
// 2x2) or half the nodes (4x2 vs 2x2), both two-level, and on one node of
// 4 ranks with one of 2 (one level).  The kernel log of the emulated
// runtime (zpp_emu_kernel_log) counts the kernels each process ran.
// Seed: ZPP_TEST_SEED (default 20261129), printed by rank 0.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h" // zpp_comm_device
#include "mpi_gtest_main.h"
#include "zpp_cuda_emu.h"

namespace {

zpp_comm_t g_comm = nullptr; // the job, device memory
zpp_comm_t g_host = nullptr; // the job, host memory (MPI backend)
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

struct Cfg {
  const char *name;
  int intra, inter;
  size_t block, hadamard;
  int residual_bits; // 0: no residual
  float beta;
  zpp_quant_mode_t mode;
  zpp_rounding_t rounding;
  int sum; // ZPP_QGZ_SUM_FLOAT or ZPP_QGZ_SUM_INT
};

// Every kind of stage the device path has: plain, error feedback in fp32
// and INT8 (with LoCo's moving average), the rotation before the stage-1
// encode, and a raw stage 1 (copies, then the rotation of the partial
// sums before the stage-2 encode); stochastic rounding and both modes; the
// integer sums (the unit agreement, integer sums, re-quantization) with
// fp32 and INT8 residuals.
const Cfg kCfgs[] = {
    {"plain", 4, 4, 256, 0, 0, 0.0f, ZPP_QUANT_SYMMETRIC, ZPP_ROUND_NEAREST,
     ZPP_QGZ_SUM_FLOAT},
    {"fp32 residual", 8, 4, 64, 0, 32, 0.0f, ZPP_QUANT_ASYMMETRIC,
     ZPP_ROUND_STOCHASTIC, ZPP_QGZ_SUM_FLOAT},
    {"int8 residual, LoCo, Hadamard", 4, 8, 128, 32, 8, 0.8f,
     ZPP_QUANT_SYMMETRIC, ZPP_ROUND_NEAREST, ZPP_QGZ_SUM_FLOAT},
    {"raw intra, Hadamard, fp32 LoCo", ZPP_QGZ_INTRA_RAW, 4, 64, 64, 32, 0.5f,
     ZPP_QUANT_SYMMETRIC, ZPP_ROUND_STOCHASTIC, ZPP_QGZ_SUM_FLOAT},
    {"int sums, fp32 residual", 4, 4, 256, 0, 32, 0.0f, ZPP_QUANT_SYMMETRIC,
     ZPP_ROUND_STOCHASTIC, ZPP_QGZ_SUM_INT},
    {"int sums, int8 LoCo", 8, 4, 128, 0, 8, 0.8f, ZPP_QUANT_SYMMETRIC,
     ZPP_ROUND_NEAREST, ZPP_QGZ_SUM_INT},
};

zpp_qgz_config_t make(const Cfg &k, uint64_t step) {
  zpp_qgz_config_t c = ZPP_QGZ_CONFIG_INIT;
  c.intra_bits = k.intra;
  c.inter_bits = k.inter;
  c.block_size = k.block;
  c.hadamard = k.hadamard;
  c.mode = k.mode;
  c.rounding = k.rounding;
  c.seed = 77;
  c.step = step;
  c.sum = k.sum;
  if (k.residual_bits) {
    c.residual_bits = k.residual_bits;
    c.residual_beta = k.beta;
  }
  return c;
}

// n values of dtype dt, uniform in [-2, 2) with magnitudes spread over
// 2^-3 .. 2^3, from (seed, rank).
std::vector<uint8_t> gradient(uint64_t s, int rank, size_t n, zpp_dtype_t dt) {
  std::vector<uint8_t> v(n * zpp_dtype_size(dt));
  uint64_t x =
      s * 0x9e3779b97f4a7c15ull + (uint64_t)rank * 0xbf58476d1ce4e5b9ull + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    uint64_t r = x * 0x2545f4914f6cdd1dull;
    float f = (float)((double)(r >> 11) * 0x1.0p-53 * 4.0 - 2.0);
    f = std::ldexp(f, (int)((r >> 3) % 7) - 3);
    if (dt == ZPP_FLOAT32) {
      std::memcpy(v.data() + 4 * i, &f, 4);
    } else { // bf16, round to nearest even
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      std::memcpy(v.data() + 2 * i, &h, 2);
    }
  }
  return v;
}

// Kernels this process runs for one qgZ call on `comm` (device memory),
// and the call's status.
size_t launches_of_one_call(zpp_comm_t comm, const Cfg &k, size_t count) {
  int size = 1, rank = 0;
  zpp_comm_size(comm, &size);
  zpp_comm_rank(comm, &rank);
  zpp_qgz_config_t cfg = make(k, 1);
  size_t rb = 0;
  if (k.residual_bits) {
    EXPECT_EQ(zpp_qgz_residual_bytes(comm, &cfg, count, &rb), ZPP_OK);
  }
  // a subset picks its device by its members' local ranks, and makes it
  // current when it is created: the buffers go to the one it works on
  EXPECT_EQ(cudaSetDevice(zpp_comm_device(comm)), cudaSuccess);
  auto in = gradient(seed(), rank, (size_t)size * count, ZPP_FLOAT32);
  std::vector<uint8_t> out(count * 4), res(rb + 1, 0);
  zpp_test::Mem m;
  const uint8_t *din = m.in(in);
  uint8_t *dout = m.out(out), *dres = k.residual_bits ? m.out(res) : nullptr;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  zpp_emu_kernel_log_clear();
  EXPECT_EQ(zpp_qgz_reduce_scatter(comm, &cfg, din, dout, count, ZPP_FLOAT32,
                                   ZPP_OP_MEAN, dres, nullptr, nullptr),
            ZPP_OK)
      << zpp_comm_get_last_error(comm);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return zpp_emu_kernel_log(nullptr, 0);
}

// The job's ranks (world rank order) with local rank < locals on nodes
// < nodes.
std::vector<int> ranks_of(int nodes, int locals) {
  std::vector<int> r;
  for (int i = 0; i < g_size; i++) {
    int node = 0, local = 0;
    zpp_comm_node_of(g_comm, i, &node);
    zpp_comm_local_rank_of(g_comm, i, &local);
    if (node < nodes && local < locals)
      r.push_back(i);
  }
  return r;
}

TEST(QgzDevice, LaunchesPerCallDoNotGrowWithTheRanks) {
  ASSERT_TRUE(g_uniform && g_nnodes >= 2 && g_size / g_nnodes >= 2)
      << "run on a uniform layout of at least 2 nodes of 2 ranks "
         "(ZPP_TOPO=2x4, 4x2)";
  const int nodes = g_nnodes, per = g_size / g_nnodes;
  // Layouts compared, (nodes, ranks per node) each: the whole job against
  // a half of it with two levels, and one node at two sizes (one level).
  struct Pair {
    int n1, s1, n2, s2;
  };
  std::vector<Pair> pairs;
  pairs.push_back(
      {nodes, per, per >= 4 ? nodes : nodes / 2, per >= 4 ? per / 2 : per});
  if (per >= 4)
    pairs.push_back({1, per, 1, per / 2});
  const size_t count = 3001; // odd: a short last block
  for (const Pair &pr : pairs) {
    auto big = ranks_of(pr.n1, pr.s1), small = ranks_of(pr.n2, pr.s2);
    ASSERT_GE(small.size(), 2u);
    zpp_comm_t cb = nullptr, cs = nullptr;
    ASSERT_EQ(
        zpp_comm_create_from_ranks(g_comm, (int)big.size(), big.data(), &cb),
        ZPP_OK)
        << zpp_get_last_error();
    ASSERT_EQ(zpp_comm_create_from_ranks(g_comm, (int)small.size(),
                                         small.data(), &cs),
              ZPP_OK)
        << zpp_get_last_error();
    for (const Cfg &k : kCfgs) {
      std::string what = std::string(k.name) + ": " + std::to_string(pr.n1) +
                         "x" + std::to_string(pr.s1) + " against " +
                         std::to_string(pr.n2) + "x" + std::to_string(pr.s2);
      size_t nb = cb ? launches_of_one_call(cb, k, count) : 0;
      size_t ns = cs ? launches_of_one_call(cs, k, count) : 0;
      if (cb && cs) {
        EXPECT_EQ(nb, ns) << what << ": kernel launches of one call";
        EXPECT_GT(ns, 0u) << what;
        if (g_rank == 0 && nb == ns)
          std::printf("%s: %zu kernel launches per call on both\n",
                      what.c_str(), ns);
      }
    }
    if (cb)
      zpp_comm_destroy(cb);
    if (cs)
      zpp_comm_destroy(cs);
  }
}

// The batched device path gives the host path's bits (the host runs each
// slice's steps one by one, in chunks): results and residuals after two
// steps, fp32 and bf16, a count with a short last block.
TEST(QgzDevice, ResultAndResidualAreTheHostPathBitForBit) {
  for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16})
    for (size_t count : {(size_t)1000, (size_t)2051})
      for (const Cfg &k : kCfgs) {
        std::string what = std::string(k.name) + ", " + zpp_dtype_name(dt) +
                           ", count " + std::to_string(count);
        size_t rb = 0, ds = zpp_dtype_size(dt);
        zpp_qgz_config_t cfg = make(k, 0);
        if (k.residual_bits) {
          ASSERT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &rb), ZPP_OK);
        }
        ASSERT_EQ(cudaSetDevice(zpp_comm_device(g_comm)), cudaSuccess);
        std::vector<uint8_t> out[2][2], res[2], in[2];
        for (int step = 0; step < 2;
             step++) // both alive: Mem keys copies by address
          in[step] = gradient(seed() + (uint64_t)step, g_rank,
                              (size_t)g_size * count, dt);
        for (int dev = 0; dev < 2; dev++) {
          zpp_comm_t comm = dev ? g_comm : g_host;
          res[dev].assign(rb + 1, 0);
          zpp_test::Mem m; // host pointers as they are when !dev: below
          uint8_t *r = nullptr;
          if (k.residual_bits)
            r = dev ? m.out(res[dev]) : res[dev].data();
          for (int step = 0; step < 2; step++) {
            out[dev][step].assign(count * ds, 0);
            cfg.step = (uint64_t)step;
            const uint8_t *src = dev ? m.in(in[step]) : in[step].data();
            uint8_t *dst = dev ? m.out(out[dev][step]) : out[dev][step].data();
            EXPECT_EQ(zpp_qgz_reduce_scatter(comm, &cfg, src, dst, count, dt,
                                             ZPP_OP_MEAN, r, nullptr, nullptr),
                      ZPP_OK)
                << what << ": " << zpp_comm_get_last_error(comm);
            if (dev) {
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            }
          }
          if (dev)
            m.back();
        }
        for (int step = 0; step < 2; step++)
          EXPECT_TRUE(out[1][step] == out[0][step])
              << what << ": result of step " << step;
        EXPECT_TRUE(res[1] == res[0]) << what << ": residual";
      }
}

void setup() {
  zpp_test::OpenComm((unsigned long long)seed(), &g_comm, &g_rank, &g_size,
                     &g_nnodes, &g_uniform);
  if (!zpp_test::DeviceMemory()) {
    std::fprintf(stderr, "test_qgz_device: run with ZPP_TEST_MEMORY=device\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.backend = ZPP_BACKEND_MPI;
  cfg.memory = ZPP_MEMORY_HOST;
  if (zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &g_host) != ZPP_OK)
    zpp_test::Die("zpp_comm_create_mpi (host memory)");
}

void teardown() {
  zpp_comm_destroy(g_host);
  zpp_comm_destroy(g_comm);
}

} // namespace

int main(int argc, char **argv) {
  return zpp_test::RunAllRanks(argc, argv, setup, teardown);
}
