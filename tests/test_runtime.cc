// Multi-rank tests of the runtime API (zpp_pgroup_*, include/zpp/zpp_runtime.h)
// under mpirun: see tests/runtime.cmake.  With ZPP_TEST_MEMORY=device
// (tests/test_memory.h; the emulated build runs it) the communicator is on
// device memory and every group's buffers are attached device buffers
// (Bufs below); the same references and bounds apply.
//
// Every rank regenerates every rank's data from (seed, rank), so each can
// compute the exact expectation locally.  Seed: ZPP_TEST_SEED (default
// 20261129), printed by rank 0.  Never return early before a collective:
// all ranks must make the same calls, so checks use EXPECT_*.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>
#include <zpp/zpp_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mpi_gtest_main.h"

extern "C" {
#include "kernels/quant_math.h"
}

namespace {

zpp_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;

using zpp_test::DeviceMemory;
using zpp_test::Mem;

#if ZPP_HAVE_CUDA
void cuda_check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "test_runtime: %s: %s\n", what, cudaGetErrorString(e));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}
#endif

// The buffers of a bf16 group in the suite's memory space.  On host memory
// the group's own (zpp_pgroup_shard, the full buffer of zpp_pgroup_wait);
// on device memory the caller's: zeroed device shard, full and residual
// buffers attached at construction, freed after the group (declare Bufs
// before the group is destroyed).  set_shard and full move the data
// between them and host vectors.
class Bufs {
 public:
  explicit Bufs(zpp_pgroup_t pg) : pg_(pg) {
    zpp_pgroup_info_t i = ZPP_PGROUP_INFO_INIT;
    EXPECT_EQ(zpp_pgroup_get_info(pg, &i), ZPP_OK);
    size_t rc = 0;
    EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
    shard_bytes_ = i.shard_numel * 2;
    full_bytes_ = i.padded_numel * 2;
    residual_bytes_ = rc * 4;
    if (!DeviceMemory()) return;
#if ZPP_HAVE_CUDA
    shard_ = zeroed(shard_bytes_);
    full_ = zeroed(full_bytes_);
    residual_ = residual_bytes_ ? zeroed(residual_bytes_) : nullptr;
    EXPECT_EQ(zpp_pgroup_attach(pg, shard_, full_, residual_), ZPP_OK)
        << zpp_get_last_error();
#endif
  }
  Bufs(const Bufs &) = delete;
  Bufs &operator=(const Bufs &) = delete;
  ~Bufs() {
#if ZPP_HAVE_CUDA
    for (void *p : {shard_, full_, residual_})
      if (p) cudaFree(p);
#endif
  }

  // Writes host bf16 values into this rank's shard.
  void set_shard(const std::vector<uint16_t> &v) {
    void *p = nullptr;
    EXPECT_EQ(zpp_pgroup_shard(pg_, &p), ZPP_OK) << zpp_get_last_error();
    if (p == nullptr) return;
    size_t n = std::min(shard_bytes_, v.size() * 2);
#if ZPP_HAVE_CUDA
    if (DeviceMemory()) {
      cuda_check(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice), "set_shard");
      return;
    }
#endif
    std::memcpy(p, v.data(), n);
  }
  // This rank's shard, read back.
  std::vector<uint16_t> shard() { return read(shard_or_null(), shard_bytes_); }
  // A full buffer returned by zpp_pgroup_wait, read back (empty when NULL).
  std::vector<uint16_t> full(const void *p) { return read(p, full_bytes_); }

 private:
  zpp_pgroup_t pg_;
  size_t shard_bytes_ = 0, full_bytes_ = 0, residual_bytes_ = 0;
  void *shard_ = nullptr, *full_ = nullptr, *residual_ = nullptr;

  void *shard_or_null() {
    void *p = nullptr;
    zpp_pgroup_shard(pg_, &p);
    return p;
  }
  static std::vector<uint16_t> read(const void *p, size_t bytes) {
    if (p == nullptr) return {};
    std::vector<uint16_t> h(bytes / 2);
#if ZPP_HAVE_CUDA
    if (DeviceMemory()) {
      cuda_check(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), "read back");
      return h;
    }
#endif
    std::memcpy(h.data(), p, bytes);
    return h;
  }
#if ZPP_HAVE_CUDA
  static void *zeroed(size_t bytes) {
    void *d = nullptr;
    cuda_check(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc");
    cuda_check(cudaMemset(d, 0, bytes ? bytes : 1), "cudaMemset");
    return d;
  }
#endif
};

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

float bf16_round(float v) { return zpp_qm_bf16_to_f32(zpp_qm_f32_to_bf16(v)); }

// n bf16 values of rank r for test `tag`.
std::vector<uint16_t> gen(int r, size_t n, uint64_t tag) {
  std::mt19937_64 rng(seed() * 7919ull + tag * 104729ull + (uint64_t)r);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(n);
  for (auto &v : x) v = zpp_qm_f32_to_bf16(nd(rng));
  return x;
}

uint64_t inter_sent() {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  zpp_comm_get_stats(g_comm, &s);
  return s.inter_bytes_sent;
}

uint64_t world_sum(uint64_t v) {
  uint64_t t = 0;
  MPI_Allreduce(&v, &t, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return t;
}

TEST(PGroup, LayoutPadsToTheWorldAndTheAlignment) {
  const size_t sizes[] = {5, 0, 1000, 37, 1};
  for (size_t align : {0, 1, 7, 256}) {
    zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
    cfg.align = align;
    zpp_pgroup_t pg = nullptr;
    ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 5, &pg), ZPP_OK)
        << zpp_get_last_error();
    zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
    ASSERT_EQ(zpp_pgroup_get_info(pg, &info), ZPP_OK);
    size_t a = align ? align : 1;  // no quantizer: auto alignment is 1
    size_t per = (1043 + g_size - 1) / g_size;
    per = (per + a - 1) / a * a;
    EXPECT_EQ(info.numel, 1043u);
    EXPECT_EQ(info.shard_numel, per) << "align " << align;
    EXPECT_EQ(info.padded_numel, per * g_size);
    EXPECT_EQ(info.shard_offset, per * g_rank);
    EXPECT_EQ(info.world_size, g_size);
    EXPECT_EQ(info.ntensors, 5);
    size_t off = 0;
    for (int t = 0; t < 5; t++) {
      size_t o = 99, n = 99;
      int fr = -1, lr = -1;
      ASSERT_EQ(zpp_pgroup_tensor(pg, t, &o, &n, &fr, &lr), ZPP_OK);
      EXPECT_EQ(o, off);
      EXPECT_EQ(n, sizes[t]);
      size_t last = n ? o + n - 1 : o;
      EXPECT_EQ(fr, std::min<int>((int)(o / per), g_size - 1)) << "tensor " << t;
      EXPECT_EQ(lr, std::min<int>((int)(last / per), g_size - 1)) << "tensor " << t;
      off += sizes[t];
    }
    // The shard starts zeroed (the padding must be zero).  On device
    // memory the shard is the caller's: it must be attached first.
    if (DeviceMemory()) {
      void *shard = nullptr;
      EXPECT_EQ(zpp_pgroup_shard(pg, &shard), ZPP_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(zpp_get_last_error()).find("zpp_pgroup_attach"),
                std::string::npos) << zpp_get_last_error();
      EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr), ZPP_ERR_INVALID_ARGUMENT);
    } else {
      Bufs b(pg);
      std::vector<uint16_t> zero(per, 0);
      EXPECT_EQ(b.shard(), zero);
    }
    EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  }
  // Auto alignment with quantizers: the lcm of the two blocks.
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.qwz_bits = 8;
  cfg.qwz_block = 96;
  cfg.qgz_bits = 4;
  cfg.qgz_block = 64;
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 5, &pg), ZPP_OK);
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  ASSERT_EQ(zpp_pgroup_get_info(pg, &info), ZPP_OK);
  EXPECT_EQ(info.shard_numel % 192, 0u);
  EXPECT_GE(info.padded_numel, 1043u);
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

// Fills my shard with gen(rank) and returns every rank's shard concatenated.
std::vector<uint16_t> fill_shard(Bufs &b, size_t shard, uint64_t tag) {
  b.set_shard(gen(g_rank, shard, tag));
  std::vector<uint16_t> all;
  for (int r = 0; r < g_size; r++) {
    auto x = gen(r, shard, tag);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

TEST(PGroup, FetchForwardAndBackwardGatherEveryShardExactly) {
  const size_t sizes[] = {333, 1200};
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, 2, &pg), ZPP_OK);
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  Bufs b(pg);
  auto want = fill_shard(b, info.shard_numel, 1);
  for (zpp_fetch_t k : {ZPP_FETCH_FORWARD, ZPP_FETCH_BACKWARD}) {
    void *full = nullptr;
    EXPECT_EQ(zpp_pgroup_fetch(pg, k, nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_pgroup_wait(pg, &full), ZPP_OK) << zpp_get_last_error();
    ASSERT_NE(full, nullptr);
    EXPECT_EQ(b.full(full), want) << "kind " << k;
    zpp_pgroup_info_t held = ZPP_PGROUP_INFO_INIT;
    zpp_pgroup_get_info(pg, &held);
    // full_bytes counts the group's own memory: an attached buffer is not.
    EXPECT_EQ(held.full_bytes, DeviceMemory() ? 0u : info.padded_numel * 2);
    EXPECT_EQ(zpp_pgroup_release(pg), ZPP_OK);
    zpp_pgroup_get_info(pg, &held);
    EXPECT_EQ(held.full_bytes, 0u) << "release frees the full buffer";
  }
  // Two groups in flight: the second is prefetched before the first waits.
  zpp_pgroup_t pg2 = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, 1, &pg2), ZPP_OK);
  zpp_pgroup_info_t info2 = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg2, &info2);
  Bufs b2(pg2);
  auto want2 = fill_shard(b2, info2.shard_numel, 2);
  void *f1 = nullptr, *f2 = nullptr;
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_fetch(pg2, ZPP_FETCH_FORWARD, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_wait(pg, &f1), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_wait(pg2, &f2), ZPP_OK);
  EXPECT_EQ(b.full(f1), want);
  EXPECT_EQ(b2.full(f2), want2);
  EXPECT_EQ(zpp_pgroup_destroy(pg2), ZPP_OK);  // destroy while held: frees
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

TEST(PGroup, HpzBackwardEqualsForwardStaysInTheNodeAndRefreshesWhenStale) {
  const size_t sizes[] = {4000, 100};
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.qwz_bits = 8;
  cfg.hpz = 1;
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 2, &pg), ZPP_OK)
      << zpp_get_last_error();
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  size_t padded = info.padded_numel;
  Bufs bufs(pg);
  fill_shard(bufs, info.shard_numel, 3);
  void *full = nullptr;
  std::vector<uint16_t> fwd(padded), bwd(padded);
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_wait(pg, &full), ZPP_OK);
  if (full) fwd = bufs.full(full);
  EXPECT_EQ(zpp_pgroup_release(pg), ZPP_OK);
  uint64_t before = world_sum(inter_sent());
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_BACKWARD, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_wait(pg, &full), ZPP_OK);
  if (full) bwd = bufs.full(full);
  EXPECT_EQ(zpp_pgroup_release(pg), ZPP_OK);
  uint64_t after = world_sum(inter_sent());
  EXPECT_EQ(std::memcmp(fwd.data(), bwd.data(), padded * 2), 0)
      << "hpZ backward output must equal the forward output bit for bit";
  bool uneven = !g_uniform;
  if (!uneven) {
    EXPECT_EQ(after - before, 0u) << "backward fetch crossed nodes";
  }
  zpp_pgroup_get_info(pg, &info);
  if (g_nnodes > 1 && g_uniform) {
    EXPECT_GT(info.hpz_bytes, 0u);
  }

  // New parameters: after params_changed a backward fetch must not serve
  // the stale secondary copy; it gathers the new values (a refresh).
  auto want = fill_shard(bufs, info.shard_numel, 4);
  EXPECT_EQ(zpp_pgroup_params_changed(pg), ZPP_OK);
  zpp_pgroup_info_t info2 = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info2);
  EXPECT_EQ(info2.generation, info.generation + 1);
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_BACKWARD, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_wait(pg, &full), ZPP_OK);
  if (full) bwd = bufs.full(full);
  EXPECT_EQ(zpp_pgroup_release(pg), ZPP_OK);
  // The INT8 code of a bf16 value is within half a step of its block's
  // absmax / 127 (docs/format.md); check against that generous bound and
  // that the values moved away from the stale ones.
  int bad = 0, changed = 0;
  for (size_t b0 = 0; b0 < padded; b0 += 256) {
    size_t b1 = std::min(padded, b0 + 256);
    // blocks are per shard; a shard is a multiple of 256 here (auto align)
    float amax = 0;
    for (size_t i = b0; i < b1; i++)
      amax = std::max(amax, std::fabs(zpp_qm_bf16_to_f32(want[i])));
    for (size_t i = b0; i < b1; i++) {
      float w = zpp_qm_bf16_to_f32(want[i]), g = zpp_qm_bf16_to_f32(bwd[i]);
      if (std::fabs(g - w) > amax / 127.0f * 0.51f + std::fabs(w) * 0.008f) bad++;
      if (bwd[i] != fwd[i]) changed++;
    }
  }
  EXPECT_EQ(bad, 0) << "refreshed backward fetch is not the new parameters";
  EXPECT_GT(changed, (int)(padded / 2)) << "stale secondary copy was used";
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

TEST(PGroup, ReduceGradientsBaselineIsTheExactOrderedMean) {
  const size_t sizes[] = {777, 3, 250};
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, 3, &pg), ZPP_OK);
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  size_t s = info.shard_numel, n = info.padded_numel;
  Bufs bufs(pg);
  auto mine = gen(g_rank, n, 5);
  std::vector<uint16_t> out(s + 1);
  {
    Mem m;
    EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, m.in(mine), m.out(out),
                                          ZPP_OP_MEAN, nullptr, nullptr),
              ZPP_OK)
        << zpp_get_last_error();
    m.back();
  }
  // fp32 sum in rank order; MEAN divides the fp32 sum and rounds once to
  // bf16 (docs/collectives.md, baselines).  Hierarchical (the default of
  // the host algorithms -- MPI, also staging device memory -- over several
  // nodes with more than one rank on some node): each node's fp32 sum in
  // rank order is rounded to bf16, then those are summed in node order in
  // fp32.  NCCL reduces flat in fp32 (one rounding).  ZPP_ALGO is read
  // here, independently of the library.
  zpp_backend_t be = ZPP_BACKEND_MPI;
  zpp_comm_backend(g_comm, &be);
  const char *algo = std::getenv("ZPP_ALGO");
  bool hier = be != ZPP_BACKEND_NCCL && !(algo && std::string(algo) == "flat") &&
              g_nnodes > 1 && g_nnodes < g_size;
  std::vector<float> acc(s, 0.0f);
  std::vector<double> sumabs(s, 0.0);  // sum of |x|: the fp32 order error
  for (int k = 0; k < (hier ? g_nnodes : 1); k++) {
    std::vector<float> part(s, 0.0f);
    for (int r = 0; r < g_size; r++) {
      int node = 0;
      zpp_comm_node_of(g_comm, r, &node);
      if (hier && node != k) continue;
      auto x = gen(r, n, 5);
      for (size_t i = 0; i < s; i++) {
        part[i] += zpp_qm_bf16_to_f32(x[g_rank * s + i]);
        sumabs[i] += std::fabs(zpp_qm_bf16_to_f32(x[g_rank * s + i]));
      }
    }
    for (size_t i = 0; i < s; i++) acc[i] += hier ? bf16_round(part[i]) : part[i];
  }
  // NCCL sums the fp32 values in its own order (not rank order).  Both
  // recursive fp32 sums are within (n-1) u sum|x| of the exact sum
  // (u = 2^-24), so after the division by n the two fp32 means differ by
  // at most d = 2 (n-1) u sum|x| / n plus one fp32 rounding each, and their
  // single bf16 roundings by at most d + 2 u max + one bf16 step of the
  // larger (half a step each).  Near cancellation d dominates.
  int bad = 0;
  for (size_t i = 0; i < s; i++) {
    float m = bf16_round(acc[i] / (float)g_size);
    float got = zpp_qm_bf16_to_f32(out[i]);
    bool ok = got == m;
    if (!ok && be == ZPP_BACKEND_NCCL) {
      double big = std::max(std::fabs((double)m), std::fabs((double)got));
      double u = std::ldexp(1.0, -24);
      double step = big > 0 ? std::ldexp(1.0, std::ilogb(big) - 7) : 0.0;
      double tol = step + 2.0 * (g_size - 1) * u * sumabs[i] / g_size + 2.0 * u * big;
      ok = std::fabs((double)got - (double)m) <= tol;
    }
    if (!ok && bad++ < 3)
      ADD_FAILURE() << "element " << i << ": " << zpp_qm_bf16_to_f32(out[i])
                    << " want " << m << (hier ? " (hierarchical)" : "");
  }
  // Asynchronous form gives the same bits.
  std::vector<uint16_t> out2(s + 1);
  zpp_request_t req = nullptr;
  {
    Mem m;
    EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, m.in(mine), m.out(out2),
                                          ZPP_OP_MEAN, nullptr, &req),
              ZPP_OK);
    EXPECT_EQ(zpp_request_wait(req), ZPP_OK);
    m.back();
  }
  EXPECT_EQ(std::memcmp(out.data(), out2.data(), s * 2), 0);
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

// With LoCo's options too (beta, reset): the group passes its reduction
// count as the step, so reduction k > 0 with k % reset == 0 starts from a
// zero residual, as the collective does with the same step.  With
// qgz_intra_bits 16 (ZPP_QGZ_INTRA_RAW) the group keeps only what the
// quantized stages need (zpp_qgz_residual_bytes): on one node (1x4) none,
// and reducing must still work there.
TEST(PGroup, ReduceGradientsQgzEqualsTheCollectiveWithTheGroupsResidual) {
  for (int run = 0; run < 3; run++) {
    int loco = run == 1, intra = run == 2 ? ZPP_QGZ_INTRA_RAW : 8;
    const size_t sizes[] = {3000};
    zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
    cfg.qgz_bits = 4;
    cfg.qgz_intra_bits = intra;
    cfg.qgz_block = 128;
    cfg.error_feedback = 1;
    if (loco) {
      cfg.error_feedback_beta = ZPP_QGZ_LOCO_BETA;
      cfg.error_feedback_reset = 2;
    }
    zpp_pgroup_t pg = nullptr;
    ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &pg), ZPP_OK)
        << zpp_get_last_error();
    zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
    zpp_pgroup_get_info(pg, &info);
    size_t s = info.shard_numel, n = info.padded_numel, rc = 0, want_rc = 0, want_b = 0;
    EXPECT_EQ(info.shard_numel % 128, 0u);
    zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
    q.inter_bits = 4;
    q.intra_bits = intra;
    q.block_size = 128;
    q.residual_beta = cfg.error_feedback_beta;
    q.residual_reset = cfg.error_feedback_reset;
    EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
    EXPECT_EQ(zpp_qgz_residual_count(g_comm, s, &want_rc), ZPP_OK);
    EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &q, s, &want_b), ZPP_OK);
    EXPECT_EQ(rc * 4, want_b) << "intra " << intra;
    if (intra == 8) {
      EXPECT_EQ(rc, want_rc);
    }
    if (intra == ZPP_QGZ_INTRA_RAW && g_nnodes == 1) {
      EXPECT_EQ(rc, 0u) << "one node: nothing quantized";
    }
    // residual_bytes counts the group's own memory (device: attached, 0).
    EXPECT_EQ(info.residual_bytes, DeviceMemory() ? 0 : rc * 4);
    // Reference: the collective itself with our own residual, same inputs,
    // five steps (the residual carries over between steps).
    {
      Bufs bufs(pg);  // device memory: the group's residual is attached
      std::vector<float> resid(rc, 0.0f);
      Mem rm;  // the reference residual lives across the steps
      float *resid_buf = rc ? rm.out(resid) : nullptr;
      for (int step = 0; step < 5; step++) {
        auto g = gen(g_rank, n, 10 + step);
        std::vector<uint16_t> a(s + 1), b(s + 1);
        Mem m;
        EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, m.in(g), m.out(a), ZPP_OP_MEAN,
                                              nullptr, nullptr),
                  ZPP_OK)
            << zpp_get_last_error() << " (intra " << intra << ")";
        q.step = (uint64_t)step;
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &q, m.in(g), m.out(b), s,
                                         ZPP_BFLOAT16, ZPP_OP_MEAN, resid_buf,
                                         nullptr, nullptr),
                  ZPP_OK);
        m.back();
        EXPECT_EQ(std::memcmp(a.data(), b.data(), s * 2), 0)
            << "loco " << loco << " intra " << intra << " step " << step;
      }
      EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);  // before bufs frees its buffers
    }
  }
}

// A group with error feedback whose quantized stages keep no error (an
// empty shard; qgz_intra_bits 16 on one node) has residual count 0: it
// reduces without one and refuses one given to it, naming why.  Elsewhere
// the count is the formula's (raw: M shards on two levels, W uneven), and
// on device memory a group that needs a residual refuses to reduce
// without one (the check is the same on every rank, before any transfer).
TEST(PGroup, ErrorFeedbackResidualIsKeptOnlyWhereSomethingIsQuantized) {
  auto msg = []() { return std::string(zpp_get_last_error()); };
  float x = 0.0f;
  {  // no tensors: an empty shard
    zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
    cfg.qgz_bits = 4;
    cfg.error_feedback = 1;
    zpp_pgroup_t pg = nullptr;
    ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, nullptr, 0, &pg), ZPP_OK) << msg();
    size_t rc = 1;
    EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
    EXPECT_EQ(rc, 0u);
    EXPECT_EQ(zpp_pgroup_attach(pg, nullptr, nullptr, &x), ZPP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(msg().find("the shard is empty"), std::string::npos) << msg();
    EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, nullptr, nullptr, ZPP_OP_MEAN, nullptr, nullptr),
              ZPP_OK)
        << msg();
    EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  }
  {  // qgz_intra_bits 16
    const size_t sizes[] = {3000};
    zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
    cfg.qgz_bits = 4;
    cfg.qgz_intra_bits = ZPP_QGZ_INTRA_RAW;
    cfg.qgz_block = 128;
    cfg.error_feedback = 1;
    zpp_pgroup_t pg = nullptr;
    ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &pg), ZPP_OK) << msg();
    zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
    zpp_pgroup_get_info(pg, &info);
    size_t rc = 0, s = info.shard_numel;
    EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
    size_t want = g_nnodes == 1 ? 0 : g_uniform ? (size_t)g_nnodes * s : (size_t)g_size * s;
    EXPECT_EQ(rc, want) << g_nnodes << " nodes, uniform " << g_uniform;
    if (g_nnodes == 1) {
      EXPECT_EQ(zpp_pgroup_attach(pg, nullptr, nullptr, &x), ZPP_ERR_INVALID_ARGUMENT);
      EXPECT_NE(msg().find("qgz_intra_bits 16 on one node"), std::string::npos) << msg();
    }
    EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  }
  if (DeviceMemory()) {  // needs a residual, none attached
    const size_t sizes[] = {3000};
    zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
    cfg.qgz_bits = 4;
    cfg.qgz_block = 128;
    cfg.error_feedback = 1;
    zpp_pgroup_t pg = nullptr;
    ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &pg), ZPP_OK) << msg();
    zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
    zpp_pgroup_get_info(pg, &info);
    std::vector<uint16_t> shard(info.shard_numel), full(info.padded_numel);
    std::vector<uint16_t> g(info.padded_numel), a(info.shard_numel);
    Mem m;
    EXPECT_EQ(zpp_pgroup_attach(pg, m.out(shard), m.out(full), nullptr), ZPP_OK) << msg();
    EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, m.in(g), m.out(a), ZPP_OP_MEAN, nullptr, nullptr),
              ZPP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(msg().find("attach a residual"), std::string::npos) << msg();
    EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);  // before m frees the buffers
  }
}

// A started reduction with error feedback reads and writes the group's
// residual until it has run: replacing the residual (zpp_pgroup_attach)
// meanwhile is refused, naming why, and works once it is waited for (the
// next reduction then uses the attached one); zpp_pgroup_destroy waits
// for it instead of freeing the residual under it.  Deterministic: rank 0
// starts its reduction and checks before any other rank calls (they wait
// at an MPI barrier that rank 0 enters after its checks), so rank 0's
// reduction cannot have finished; for the destroy the others sleep 300 ms
// after a barrier (a rank 0 descheduled that long could pass without the
// wait, never fail with it).
TEST(PGroup, ResidualIsNeitherReplacedNorFreedUnderAStartedReduction) {
  zpp_backend_t be = ZPP_BACKEND_AUTO;
  zpp_comm_backend(g_comm, &be);
  int level = 0;
  MPI_Query_thread(&level);
  const char *chk = std::getenv("ZPP_CHECK");
  if (g_size < 2 || level != MPI_THREAD_MULTIPLE || be == ZPP_BACKEND_NCCL ||
      (chk && std::atoi(chk) != 0))
    GTEST_SKIP() << "needs 2+ ranks, MPI_THREAD_MULTIPLE (started calls run on the "
                    "engine thread), a backend whose engine runs the reduction (NCCL "
                    "enqueues it on the stream at once; zpp_runtime.h) and no ZPP_CHECK (its "
                    "argument exchange would wait for the ranks held at the barrier)";
  const size_t sizes[] = {3000};
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.qgz_bits = 4;
  cfg.qgz_intra_bits = 8;
  cfg.qgz_block = 128;
  cfg.error_feedback = 1;
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  size_t s = info.shard_numel, n = info.padded_numel, rc = 0;
  EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
  ASSERT_GT(rc, 0u);  // the same on every rank
  zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
  q.inter_bits = 4;
  q.intra_bits = 8;
  q.block_size = 128;
  {
    Bufs bufs(pg);
    std::vector<float> zeros(rc, 0.0f), fresh(rc, 0.0f), ref_resid(rc, 0.0f);
    Mem rm;
    float *new_resid = rm.out(fresh), *ref_buf = rm.out(ref_resid);
    for (int step = 0; step < 2; step++) {
      auto g = gen(g_rank, n, 300 + step);
      std::vector<uint16_t> a(s + 1), b(s + 1);
      Mem m;
      const uint16_t *gin = m.in(g);
      uint16_t *aout = m.out(a);
      if (step == 0 && g_rank == 0) {
        zpp_request_t req = nullptr;
        EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, gin, aout, ZPP_OP_MEAN, nullptr, &req), ZPP_OK)
            << zpp_get_last_error();
        EXPECT_NE(req, nullptr);
        EXPECT_EQ(zpp_pgroup_attach(pg, nullptr, nullptr, new_resid), ZPP_ERR_INVALID_ARGUMENT);
        EXPECT_NE(std::string(zpp_get_last_error())
                      .find("residual: a zpp_pgroup_reduce_gradients of the group is in flight"),
                  std::string::npos)
            << zpp_get_last_error();
        MPI_Barrier(MPI_COMM_WORLD);  // the other ranks start now
        EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
      } else {
        if (step == 0) MPI_Barrier(MPI_COMM_WORLD);
        // on device memory the blocking form returns once queued: wait on
        // the host for the reduction before the attach below
        zpp_request_t req = nullptr;
        EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, gin, aout, ZPP_OP_MEAN, nullptr,
                                              DeviceMemory() ? &req : nullptr),
                  ZPP_OK)
            << zpp_get_last_error();
        EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
      }
      if (step == 0) {  // waited for: the new residual is taken (every rank)
        EXPECT_EQ(zpp_pgroup_attach(pg, nullptr, nullptr, new_resid), ZPP_OK)
            << zpp_get_last_error();
      }
      // Reference: the collective with a residual that is zero where the
      // group's is: at step 0 its first, at step 1 the freshly attached one.
      q.step = (uint64_t)step;
      Mem zm;
      float *rb = step == 0 ? ref_buf : zm.out(zeros);
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &q, gin, m.out(b), s, ZPP_BFLOAT16, ZPP_OP_MEAN,
                                       rb, nullptr, nullptr),
                ZPP_OK);
      m.back();
      EXPECT_EQ(std::memcmp(a.data(), b.data(), s * 2), 0) << "step " << step;
    }
    EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK) << zpp_get_last_error();
  }
  // Destroy under a started reduction, on a fresh group whose residual is
  // its own on host memory (an ASan build would see it freed under the
  // reduction): rank 0's reduction cannot finish before the others call,
  // 300 ms after the barrier; destroy returns only once it has run (its
  // request is then done at once).
  zpp_pgroup_t pg2 = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &pg2), ZPP_OK) << zpp_get_last_error();
  {
    Bufs bufs2(pg2);
    auto g = gen(g_rank, n, 302);
    std::vector<uint16_t> a(s + 1);
    Mem m;
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
      zpp_request_t req = nullptr;
      EXPECT_EQ(zpp_pgroup_reduce_gradients(pg2, m.in(g), m.out(a), ZPP_OP_MEAN, nullptr, &req),
                ZPP_OK)
          << zpp_get_last_error();
      EXPECT_EQ(zpp_pgroup_destroy(pg2), ZPP_OK) << zpp_get_last_error();
      int done = 0;
      EXPECT_EQ(zpp_request_test(req, &done), ZPP_OK);
      if (!DeviceMemory()) {
        EXPECT_EQ(done, 1) << "destroy returned before the reduction ran";
      }
      EXPECT_EQ(zpp_request_wait(req), ZPP_OK) << zpp_get_last_error();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_EQ(zpp_pgroup_reduce_gradients(pg2, m.in(g), m.out(a), ZPP_OP_MEAN, nullptr, nullptr),
                ZPP_OK)
          << zpp_get_last_error();
      EXPECT_EQ(zpp_pgroup_destroy(pg2), ZPP_OK) << zpp_get_last_error();
    }
  }
}

TEST(PGroup, BadArgumentsAreRejectedWithMessagesNamingThem) {
  const size_t sizes[] = {10};
  zpp_pgroup_t pg = nullptr;
  auto msg = []() { return std::string(zpp_get_last_error()); };
  EXPECT_EQ(zpp_pgroup_create(nullptr, nullptr, sizes, 1, &pg),
            ZPP_ERR_NULL_POINTER);
  EXPECT_NE(msg().find("comm"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_create(g_comm, nullptr, nullptr, 1, &pg),
            ZPP_ERR_NULL_POINTER);
  EXPECT_NE(msg().find("sizes"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, -1, &pg),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("ntensors"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, 1, nullptr),
            ZPP_ERR_NULL_POINTER);
  struct Bad { const char *field; void (*set)(zpp_pgroup_config_t *); };
  const Bad bads[] = {
      {"struct_size", [](zpp_pgroup_config_t *c) { c->struct_size = 8; }},
      {"dtype", [](zpp_pgroup_config_t *c) { c->dtype = (zpp_dtype_t)9; }},
      {"qwz_bits", [](zpp_pgroup_config_t *c) { c->qwz_bits = 3; }},
      {"qwz_block", [](zpp_pgroup_config_t *c) { c->qwz_bits = 8; c->qwz_block = 0; }},
      {"qgz_bits", [](zpp_pgroup_config_t *c) { c->qgz_bits = 2; }},
      {"qgz_intra_bits", [](zpp_pgroup_config_t *c) { c->qgz_bits = 4; c->qgz_intra_bits = 12; }},
      {"qgz_block", [](zpp_pgroup_config_t *c) { c->qgz_bits = 4; c->qgz_block = 0; }},
      {"hpz", [](zpp_pgroup_config_t *c) { c->hpz = 2; }},
      {"error_feedback", [](zpp_pgroup_config_t *c) { c->error_feedback = 1; }},
  };
  for (const Bad &b : bads) {
    zpp_pgroup_config_t c = ZPP_PGROUP_CONFIG_INIT;
    b.set(&c);
    pg = nullptr;
    EXPECT_EQ(zpp_pgroup_create(g_comm, &c, sizes, 1, &pg),
              ZPP_ERR_INVALID_ARGUMENT) << b.field;
    EXPECT_NE(msg().find(b.field), std::string::npos) << msg();
    EXPECT_EQ(pg, nullptr) << "output set on error";
  }
  ASSERT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, 1, &pg), ZPP_OK);
  Bufs bufs(pg);
  size_t o;
  EXPECT_EQ(zpp_pgroup_tensor(pg, 1, &o, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("t 1"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_wait(pg, nullptr), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("fetch"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_fetch(pg, (zpp_fetch_t)7, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("kind"), std::string::npos) << msg();
  // A second fetch while one is pending, and params_changed meanwhile.
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("pending"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_params_changed(pg), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_pgroup_wait(pg, nullptr), ZPP_OK);
  // params_changed makes the held copy stale: wait refuses it.
  EXPECT_EQ(zpp_pgroup_params_changed(pg), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_wait(pg, nullptr), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_pgroup_release(pg), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, nullptr, nullptr, ZPP_OP_MEAN,
                                        nullptr, nullptr),
            ZPP_ERR_NULL_POINTER);
  EXPECT_NE(msg().find("full_grad"), std::string::npos) << msg();
  EXPECT_EQ(zpp_pgroup_attach(pg, nullptr, nullptr, (float *)&o),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("residual"), std::string::npos) << msg();
  zpp_pgroup_info_t small = ZPP_PGROUP_INFO_INIT;
  small.struct_size = 4;
  EXPECT_EQ(zpp_pgroup_get_info(pg, &small), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_destroy(nullptr), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_fetch(nullptr, ZPP_FETCH_FORWARD, nullptr),
            ZPP_ERR_NULL_POINTER);
  EXPECT_NE(msg().find("pg"), std::string::npos) << msg();
}


// ---- transforms: qWD groups, INT8 error feedback, Hadamard, old structs -----------

uint64_t fnv64(const void *p, size_t n) {
  const uint8_t *c = (const uint8_t *)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

bool same_on_all_ranks(uint64_t v) {
  uint64_t mn, mx;
  MPI_Allreduce(&v, &mn, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&v, &mx, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return mn == mx;
}

// A ZeRO-2 style group with qWD: after each "optimizer step" on the fp32
// master shard, update_params leaves the same full buffer on every rank,
// each element within one quantization of this step's difference (plus
// the bf16 store) of its master value (docs/collectives.md, "qWD"), and
// the group's own full buffer stays between steps (it is the
// reconstruction the next difference is taken against).
// Sample correlation of two error vectors.
double correlation(const std::vector<double> &a, const std::vector<double> &b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 1.0;
}

// Two groups (two layers of one model) with the same configuration and
// seed, fed the same gradient and the same master weights: their
// stochastic rounding must draw independent bits, or every layer makes the
// same rounding error at the same step (the bug it catches: a seed of
// seed ^ call, the same for every layer's call k).  Given the data, the two errors are
// then independent and zero-mean, so the sample correlation of n pairs
// has a standard deviation of about 1/sqrt(n); the check allows 6 of them
// (with the bug it is exactly 1).  That a run repeats with the same
// seed is checked by tests/runtime/test_train.cc.
TEST(PGroup, GroupsWithOneSeedDrawIndependentStochasticRounding) {
  const size_t sizes[] = {4096 * 4};
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.dtype = ZPP_FLOAT32;  // no common final rounding to bf16
  cfg.qgz_bits = 4;
  cfg.qgz_block = 256;
  cfg.rounding = ZPP_ROUND_STOCHASTIC;
  cfg.seed = 7;
  zpp_pgroup_t a = nullptr, b = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &a), ZPP_OK) << zpp_get_last_error();
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &b), ZPP_OK) << zpp_get_last_error();
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(a, &info);
  size_t s = info.shard_numel, n = info.padded_numel;
  std::vector<std::vector<float>> all(g_size);
  for (int r = 0; r < g_size; r++) {
    auto g16 = gen(r, n, 60);
    all[r].resize(n);
    for (size_t i = 0; i < n; i++) all[r][i] = zpp_qm_bf16_to_f32(g16[i]);
  }
  std::vector<float> oa(s), ob(s);
  {
    Mem m;  // the suite's memory space
    EXPECT_EQ(zpp_pgroup_reduce_gradients(a, m.in(all[g_rank]), m.out(oa), ZPP_OP_SUM, nullptr,
                                          nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_pgroup_reduce_gradients(b, m.in(all[g_rank]), m.out(ob), ZPP_OP_SUM, nullptr,
                                          nullptr), ZPP_OK) << zpp_get_last_error();
    m.back();
  }
  std::vector<double> ea(s), eb(s);
  for (size_t i = 0; i < s; i++) {
    double exact = 0;
    for (int r = 0; r < g_size; r++) exact += all[r][info.shard_offset + i];
    ea[i] = oa[i] - exact;
    eb[i] = ob[i] - exact;
  }
  double rho = correlation(ea, eb), lim = 6.0 / std::sqrt((double)s);
  if (g_rank == 0)
    std::printf("[ info ] qgZ errors of two groups with one seed: correlation %.4f (limit %.4f)\n",
                rho, lim);
  EXPECT_LT(std::fabs(rho), lim) << "two groups drew correlated stochastic rounding";
  EXPECT_EQ(zpp_pgroup_destroy(a), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_destroy(b), ZPP_OK);

  // qWD: the same for the weight differences
  zpp_pgroup_config_t qc = ZPP_PGROUP_CONFIG_INIT;
  qc.dtype = ZPP_FLOAT32;
  qc.qwd_bits = 4;
  qc.qwd_block = 256;
  qc.rounding = ZPP_ROUND_STOCHASTIC;
  qc.seed = 7;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &qc, sizes, 1, &a), ZPP_OK) << zpp_get_last_error();
  ASSERT_EQ(zpp_pgroup_create(g_comm, &qc, sizes, 1, &b), ZPP_OK) << zpp_get_last_error();
  zpp_pgroup_get_info(a, &info);  // this layout (aligned to qwd_block's default)
  s = info.shard_numel;
  n = info.padded_numel;
  for (int r = 0; r < g_size; r++) all[r].resize(n, 0.0f);
  ea.assign(s, 0.0);
  eb.assign(s, 0.0);
  std::vector<float> master(all[g_rank].begin() + info.shard_offset,
                            all[g_rank].begin() + info.shard_offset + s);
  // full buffers attached (zero), in the suite's memory space, read back
  std::vector<float> fa_h(n, 0.0f), fb_h(n, 0.0f);
  void *fa = nullptr, *fb = nullptr;
  {
    Mem m;
    EXPECT_EQ(zpp_pgroup_attach(a, nullptr, m.out(fa_h), nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_pgroup_attach(b, nullptr, m.out(fb_h), nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_pgroup_update_params(a, m.in(master), nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_pgroup_wait(a, &fa), ZPP_OK);
    EXPECT_EQ(zpp_pgroup_update_params(b, m.in(master), nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_pgroup_wait(b, &fb), ZPP_OK);
    m.back();
  }
  if (fa != nullptr && fb != nullptr) {
    const float *ra = fa_h.data() + info.shard_offset;
    const float *rb = fb_h.data() + info.shard_offset;
    for (size_t i = 0; i < s; i++) {
      ea[i] = ra[i] - (double)master[i];
      eb[i] = rb[i] - (double)master[i];
    }
    rho = correlation(ea, eb);
    if (g_rank == 0)
      std::printf("[ info ] qWD errors of two groups with one seed: correlation %.4f\n", rho);
    EXPECT_LT(std::fabs(rho), lim) << "two qWD groups drew correlated stochastic rounding";
  }
  EXPECT_EQ(zpp_pgroup_destroy(a), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_destroy(b), ZPP_OK);
}

TEST(PGroup, QwdUpdateKeepsIdenticalFullParametersNearTheMasters) {
  const size_t sizes[] = {5000, 77};
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.qwd_bits = 4;
  cfg.qwd_block = 512;
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 2, &pg), ZPP_OK) << zpp_get_last_error();
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  size_t s = info.shard_numel, n = info.padded_numel;
  // On host memory the group holds its reconstruction from creation; on
  // device memory the caller attaches it (full_bytes counts own memory).
  EXPECT_EQ(info.full_bytes, DeviceMemory() ? 0 : n * 2)
      << "the qWD reconstruction is held from creation";
  EXPECT_EQ(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("update_params"), std::string::npos);
  std::mt19937_64 rng(seed() + 40 + (uint64_t)g_rank);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(s);
  for (size_t i = 0; i < s; i++)
    master[i] = info.shard_offset + i < info.numel ? nd(rng) : 0.0f;
  // The group's own buffer starts at zero; an attached one (device
  // memory) is what the caller put there: Bufs zeroes it.
  Bufs bufs(pg);
  std::vector<uint16_t> prev(n, 0);
  for (int step = 0; step < 20; step++) {
    for (size_t i = 0; i < s; i++)
      if (info.shard_offset + i < info.numel) master[i] += 0.01f * nd(rng);
    EXPECT_EQ(zpp_pgroup_params_changed(pg), ZPP_OK);
    Mem m;
    EXPECT_EQ(zpp_pgroup_update_params(pg, m.in(master), nullptr), ZPP_OK)
        << zpp_get_last_error();
    void *full = nullptr;
    EXPECT_EQ(zpp_pgroup_wait(pg, &full), ZPP_OK);
    if (full == nullptr) break;
    std::vector<uint16_t> fv = bufs.full(full);
    const uint16_t *f = fv.data();
    EXPECT_TRUE(same_on_all_ranks(fnv64(f, n * 2))) << "step " << step;
    const uint16_t *mine = f + info.shard_offset, *old = prev.data() + info.shard_offset;
    int bad = 0;
    for (size_t b0 = 0; b0 < s; b0 += 512) {
      size_t len = std::min<size_t>(512, s - b0);
      double D = 0;
      for (size_t i = b0; i < b0 + len; i++)
        D = std::max(D, std::fabs((double)(master[i] - zpp_qm_bf16_to_f32(old[i]))));
      for (size_t i = b0; i < b0 + len && bad < 3; i++) {
        double got = zpp_qm_bf16_to_f32(mine[i]);
        double bound = D / 7 * (1 + std::ldexp(1.0, -23)) * (0.5 + std::ldexp(1.0, -12)) +
                       std::ldexp(1.0, -21) * (D + std::fabs(got)) +
                       std::ldexp(1.0, -8) * std::fabs(got) + 1e-38;
        if (!(std::fabs(got - master[i]) <= bound) && bad++ < 3)
          ADD_FAILURE() << "step " << step << " element " << i << ": " << got << " vs master "
                        << master[i] << " bound " << bound;
      }
    }
    std::memcpy(prev.data(), f, n * 2);
    EXPECT_EQ(zpp_pgroup_release(pg), ZPP_OK);  // keeps the reconstruction
    zpp_pgroup_get_info(pg, &info);
    EXPECT_EQ(info.full_bytes, DeviceMemory() ? 0 : n * 2);
  }
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  // update_params needs qWD
  ASSERT_EQ(zpp_pgroup_create(g_comm, nullptr, sizes, 2, &pg), ZPP_OK);
  std::vector<float> m(4096);
  EXPECT_EQ(zpp_pgroup_update_params(pg, m.data(), nullptr), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("qwd_bits"), std::string::npos);
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

// INT8 error feedback and Hadamard through the group: the same bits as
// the collective with the same options and its own INT8 residual, in the
// memory zpp_qgz_residual_bytes gives (about a quarter of fp32's).
TEST(PGroup, Int8ErrorFeedbackWithHadamardEqualsTheCollective) {
  const size_t sizes[] = {3000};
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.qgz_bits = 4;
  cfg.qgz_intra_bits = 8;
  cfg.qgz_block = 128;
  cfg.qgz_hadamard = 32;
  cfg.error_feedback = 1;
  cfg.error_feedback_bits = 8;
  zpp_pgroup_t pg = nullptr;
  ASSERT_EQ(zpp_pgroup_create(g_comm, &cfg, sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  size_t s = info.shard_numel, n = info.padded_numel, rc = 0, fp32 = 0, bytes = 0;
  zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
  q.inter_bits = 4;
  q.intra_bits = 8;
  q.block_size = 128;
  q.hadamard = 32;
  q.residual_bits = 8;
  EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &q, s, &bytes), ZPP_OK);
  EXPECT_EQ(zpp_qgz_residual_count(g_comm, s, &fp32), ZPP_OK);
  EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
  EXPECT_EQ(info.residual_bytes, DeviceMemory() ? 0 : bytes);
  EXPECT_EQ(rc, (bytes + 3) / 4);
  EXPECT_LT(bytes * 3, fp32 * 4) << "INT8 residual not smaller";
  Bufs bufs(pg);
  std::vector<uint8_t> resid(bytes, 0);
  Mem rm;
  uint8_t *resid_buf = rm.out(resid);
  for (int step = 0; step < 3; step++) {
    auto g = gen(g_rank, n, 50 + step);
    std::vector<uint16_t> a(s + 1), b(s + 1);
    Mem m;
    EXPECT_EQ(zpp_pgroup_reduce_gradients(pg, m.in(g), m.out(a), ZPP_OP_MEAN, nullptr,
                                          nullptr), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &q, m.in(g), m.out(b), s, ZPP_BFLOAT16,
                                     ZPP_OP_MEAN, resid_buf, nullptr, nullptr), ZPP_OK);
    m.back();
    EXPECT_EQ(std::memcmp(a.data(), b.data(), s * 2), 0) << "step " << step;
  }
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
}

TEST(PGroup, OlderSmallerConfigStructStillWorksAndNewFieldsAreChecked) {
  struct v1 {  // zpp 0.1: the fields up to `align`
    size_t struct_size;
    zpp_dtype_t dtype;
    int qwz_bits;
    size_t qwz_block;
    int hpz, qgz_bits, qgz_intra_bits;
    size_t qgz_block;
    int error_feedback;
    size_t align;
  } old = {sizeof(v1), ZPP_BFLOAT16, 8, 256, 0, 4, 0, 256, 1, 0};
  const size_t sizes[] = {1000};
  zpp_pgroup_t pg = nullptr;
  EXPECT_EQ(zpp_pgroup_create(g_comm, reinterpret_cast<const zpp_pgroup_config_t *>(&old),
                              sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  size_t rc = 0, want = 0;
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  EXPECT_EQ(zpp_pgroup_residual_count(pg, &rc), ZPP_OK);
  EXPECT_EQ(zpp_qgz_residual_count(g_comm, info.shard_numel, &want), ZPP_OK);
  EXPECT_EQ(rc, want) << "defaults: an fp32 residual";
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  // a 0.2 struct (up to qwd_block): the 0.3 fields behind it are not read
  // (garbage there, an invalid beta, is ignored)
  zpp_pgroup_config_t v2 = ZPP_PGROUP_CONFIG_INIT;
  v2.struct_size = offsetof(zpp_pgroup_config_t, error_feedback_beta);
  v2.qgz_bits = 4;
  v2.error_feedback = 1;
  v2.error_feedback_beta = 7.0f;
  v2.error_feedback_reset = 1;
  pg = nullptr;
  EXPECT_EQ(zpp_pgroup_create(g_comm, &v2, sizes, 1, &pg), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(zpp_pgroup_destroy(pg), ZPP_OK);
  struct Bad { const char *field; void (*set)(zpp_pgroup_config_t *); };
  const Bad bads[] = {
      {"qwd_bits", [](zpp_pgroup_config_t *c) { c->qwd_bits = 3; }},
      {"qwd_block", [](zpp_pgroup_config_t *c) { c->qwd_bits = 4; c->qwd_block = 0; }},
      {"qwd_bits", [](zpp_pgroup_config_t *c) { c->qwd_bits = 4; c->qwz_bits = 8; }},
      {"qgz_hadamard", [](zpp_pgroup_config_t *c) { c->qgz_bits = 4; c->qgz_hadamard = 48; }},
      {"qgz_hadamard", [](zpp_pgroup_config_t *c) { c->qgz_hadamard = 32; }},
      {"rounding", [](zpp_pgroup_config_t *c) { c->rounding = (zpp_rounding_t)7; }},
      {"error_feedback_bits", [](zpp_pgroup_config_t *c) { c->error_feedback_bits = 16; }},
      {"error_feedback_beta", [](zpp_pgroup_config_t *c) { c->error_feedback_beta = 1.0f; }},
      {"error_feedback_beta", [](zpp_pgroup_config_t *c) { c->error_feedback_beta = -0.1f; }},
      {"error_feedback_beta", [](zpp_pgroup_config_t *c) { c->error_feedback_beta = NAN; }},
  };
  for (const Bad &b : bads) {
    zpp_pgroup_config_t c = ZPP_PGROUP_CONFIG_INIT;
    b.set(&c);
    pg = nullptr;
    EXPECT_EQ(zpp_pgroup_create(g_comm, &c, sizes, 1, &pg), ZPP_ERR_INVALID_ARGUMENT)
        << b.field;
    EXPECT_NE(std::string(zpp_get_last_error()).find(b.field), std::string::npos)
        << zpp_get_last_error();
    EXPECT_EQ(pg, nullptr);
  }
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
