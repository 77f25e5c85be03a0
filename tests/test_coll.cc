// Multi-rank tests of the collectives (baselines, qwZ, hpZ, qgZ), run under
// mpirun for several emulated layouts (ZPP_TOPO): see tests/coll.cmake.
//
// Every rank regenerates every rank's input from (seed, rank), so each can
// compute the exact expectation or the float64 reference locally.  Seed:
// ZPP_TEST_SEED (default 20261129), printed by rank 0.
//
// Rules for multi-rank tests: never return early before a collective
// (every rank must make the same calls), so checks use EXPECT_*.
//
// ZPP_TEST_MEMORY=device runs every test on device memory (test_memory.h):
// inputs and outputs are passed through zpp_test::Mem, which copies them
// to and from the device, and checked against the same references.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>
#include <zpp/zpp_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_gtest_main.h"
#include "test_memory.h"
#include "scoped_env.h"

extern "C" {
#include "core/core.h"
#include "quant/quant.h"
#include "kernels/quant_math.h"
}

namespace {

using zpp_test::Mem;

zpp_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;
// ZPP_ALGO (read here, independently of the library): hier unless "flat".
bool g_hier = true;

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

// ---- data -------------------------------------------------------------------

float to_dtype(float v, zpp_dtype_t dt) {
  if (dt == ZPP_FLOAT32) return v;
  if (dt == ZPP_BFLOAT16) return zpp_qm_bf16_to_f32(zpp_qm_f32_to_bf16(v));
  return zpp_qm_f16_to_f32(zpp_qm_f32_to_f16(v));
}

// n values of rank r for test `tag`, representable in dt.
std::vector<float> gen(int r, size_t n, zpp_dtype_t dt, uint64_t tag) {
  std::mt19937_64 rng(seed() * 7919ull + tag * 104729ull + (uint64_t)r);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto &v : x) v = to_dtype(nd(rng), dt);
  return x;
}

std::vector<uint8_t> pack(const std::vector<float> &x, zpp_dtype_t dt) {
  std::vector<uint8_t> b(std::max<size_t>(1, x.size() * zpp_dtype_size(dt)));
  for (size_t i = 0; i < x.size(); i++) zpp_qm_store(b.data(), i, (int)dt, x[i]);
  return b;
}

float at(const std::vector<uint8_t> &b, zpp_dtype_t dt, size_t i) {
  return zpp_qm_load(b.data(), i, (int)dt);
}

uint64_t fnv(const void *p, size_t n) {
  const uint8_t *c = (const uint8_t *)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

// True on every rank when every rank has the same 64-bit value.
bool same_on_all_ranks(uint64_t v) {
  return zpp_test::Reduce(v, '<') == zpp_test::Reduce(v, '>');
}

zpp_comm_stats_t stats() {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  zpp_comm_get_stats(g_comm, &s);
  return s;
}

// Per-element bound of docs/format.md for a block with the given scale and
// range, plus the output rounding of dt at |v|.
double block_bound(double scale, double range, double x, double out,
                   zpp_dtype_t dt) {
  double b = scale * (0.5 + std::ldexp(1.0, -12)) +
             std::ldexp(1.0, -22) * (std::fabs(x) + range) + std::ldexp(1.0, -149);
  if (dt == ZPP_BFLOAT16) b += std::fabs(out) * std::ldexp(1.0, -8) + 1e-38;
  if (dt == ZPP_FLOAT16) b += std::fabs(out) * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
  return b;
}

// Scale and range of the block of x[off, off+len) (docs/format.md).
void block_params(const float *x, size_t len, int bits, bool asym, double *scale,
                  double *range) {
  double mn = INFINITY, mx = -INFINITY, am = 0;
  for (size_t i = 0; i < len; i++) {
    mn = std::min(mn, (double)x[i]);
    mx = std::max(mx, (double)x[i]);
    am = std::max(am, std::fabs((double)x[i]));
  }
  *range = asym ? mx - mn : am;
  double levels = asym ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
  *scale = *range / levels * (1 + std::ldexp(1.0, -23));
}

struct Case {
  zpp_dtype_t dt;
  size_t count;
  int bits;
  size_t block;
};

std::string name(const Case &c) {
  return std::string(zpp_dtype_name(c.dt)) + " count " + std::to_string(c.count) +
         " int" + std::to_string(c.bits) + " block " + std::to_string(c.block);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16})
    for (size_t count : {(size_t)1, (size_t)7, (size_t)4097, (size_t)10007})
      for (int bits : {8, 4})
        v.push_back({dt, count, bits, count > 1000 ? (size_t)256 : (size_t)32});
  return v;
}

zpp_quant_config_t qcfg(int bits, size_t block, bool asym = false) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  q.bits = bits;
  q.block_size = block;
  q.mode = asym ? ZPP_QUANT_ASYMMETRIC : ZPP_QUANT_SYMMETRIC;
  return q;
}

size_t enc_size(const zpp_quant_config_t &q, size_t count) {
  size_t b = 0;
  zpp_quant_encoded_size(&q, count, &b);
  return b;
}

// ---- baselines ------------------------------------------------------------------

TEST(Baseline, AllgatherIsBitwiseExact) {
  for (const Case &c : cases()) {
    auto mine = pack(gen(g_rank, c.count, c.dt, 1), c.dt);
    std::vector<uint8_t> out(g_size * c.count * zpp_dtype_size(c.dt));
    Mem m;
    EXPECT_EQ(zpp_allgather(g_comm, m.in(mine), m.out(out), c.count, c.dt, nullptr,
                            nullptr),
              ZPP_OK)
        << zpp_comm_get_last_error(g_comm);
    m.back();
    for (int r = 0; r < g_size; r++) {
      auto want = pack(gen(r, c.count, c.dt, 1), c.dt);
      EXPECT_EQ(std::memcmp(out.data() + r * c.count * zpp_dtype_size(c.dt),
                            want.data(), c.count * zpp_dtype_size(c.dt)),
                0)
          << name(c) << " shard of rank " << r;
    }
  }
}

// Random bytes of rank r for test `tag` (every value 0..255 occurs).
std::vector<uint8_t> gen_bytes(int r, size_t n, uint64_t tag) {
  std::mt19937_64 rng(seed() * 7919ull + tag * 104729ull + (uint64_t)r);
  std::vector<uint8_t> b(std::max<size_t>(1, n));
  for (auto &v : b) v = (uint8_t)(rng() >> 56);
  return b;
}

// ZPP_UINT8: FSDP2 gathers a group of mixed dtypes as bytes.  Out of place
// and in place (sendbuf == recvbuf + rank * count, as FSDP2 calls it), every
// shard equal to its rank's bytes; bytes on the wire equal to a bf16 gather
// of half the elements (the same number of bytes).
TEST(Baseline, AllgatherOfBytesIsExactOutOfPlaceAndInPlace) {
  std::printf("seed %llu\n", (unsigned long long)seed());
  for (size_t count : {(size_t)1, (size_t)7, (size_t)4097, (size_t)10008}) {
    for (int in_place = 0; in_place < 2; in_place++) {
      auto mine = gen_bytes(g_rank, count, 11);
      std::vector<uint8_t> out(std::max<size_t>(1, g_size * count), 0xA5);
      if (in_place) std::memcpy(out.data() + g_rank * count, mine.data(), count);
      Mem m;
      uint8_t *o = m.out(out);
      const uint8_t *in = in_place ? o + g_rank * count : m.in(mine);
      zpp_comm_reset_stats(g_comm);
      EXPECT_EQ(zpp_allgather(g_comm, in, o, count, ZPP_UINT8, nullptr, nullptr), ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      zpp_comm_stats_t su8 = stats();
      m.back();
      for (int r = 0; r < g_size; r++) {
        auto want = gen_bytes(r, count, 11);
        EXPECT_EQ(std::memcmp(out.data() + r * count, want.data(), count), 0)
            << "u8 count " << count << (in_place ? " in place" : "") << ", shard of rank " << r;
      }
      if (count % 2 == 0) {
        std::vector<uint8_t> out2(g_size * count);
        Mem m2;
        zpp_comm_reset_stats(g_comm);
        EXPECT_EQ(zpp_allgather(g_comm, m2.in(mine), m2.out(out2), count / 2, ZPP_BFLOAT16,
                                nullptr, nullptr),
                  ZPP_OK);
        zpp_comm_stats_t sbf = stats();
        EXPECT_EQ(su8.inter_bytes_sent, sbf.inter_bytes_sent) << "count " << count;
        EXPECT_EQ(su8.intra_bytes_sent + su8.inter_bytes_sent,
                  sbf.intra_bytes_sent + sbf.inter_bytes_sent) << "count " << count;
      }
    }
  }
}

// Slice `me` (count elements) of every rank's input gen(r, g_size * count,
// dt, tag): the first (me + 1) * count values of each rank's sequence are
// the same whatever its length, so only those are drawn.
std::vector<std::vector<float>> slices_of(const Case &c, uint64_t tag, int me) {
  std::vector<std::vector<float>> x(g_size);
  for (int r = 0; r < g_size; r++) {
    auto full = gen(r, (size_t)(me + 1) * c.count, c.dt, tag);
    x[r].assign(full.begin() + (size_t)me * c.count, full.end());
  }
  return x;
}

TEST(Baseline, ReduceScatterSumAndMeanAreExact) {
  for (const Case &c : cases()) {
    size_t n = g_size * c.count;
    auto mine = pack(gen(g_rank, n, c.dt, 2), c.dt);
    std::vector<uint8_t> sum(c.count * zpp_dtype_size(c.dt) + 1),
        mean(c.count * zpp_dtype_size(c.dt) + 1);
    Mem m;
    EXPECT_EQ(zpp_reduce_scatter(g_comm, m.in(mine), m.out(sum), c.count, c.dt,
                                 ZPP_OP_SUM, nullptr, nullptr),
              ZPP_OK)
        << zpp_comm_get_last_error(g_comm);
    EXPECT_EQ(zpp_reduce_scatter(g_comm, m.in(mine), m.out(mean), c.count, c.dt,
                                 ZPP_OP_MEAN, nullptr, nullptr),
              ZPP_OK);
    m.back();
    // The promise (zpp_coll.h): an fp32 accumulator, rounded once to the
    // dtype; MEAN divides the fp32 sum before that one rounding.  Host
    // backends (MPI, UCX) with the flat algorithm add in rank order, so the
    // result is exact: the same fp32 additions here.  Hierarchical (the
    // default over several nodes, docs/collectives.md): each node's sum in
    // rank order (fp32) is rounded to the dtype (fp16: kept in fp32, so it
    // cannot overflow), then the nodes' sums are added in node order (fp32)
    // and rounded once more: also exact here, and within the bound of those
    // roundings of the float64 sum.  NCCL adds in
    // its ring order, so the fp32 sum may differ from rank order by
    // gamma_{n-1} * sum|x| (gamma_k = k u / (1 - k u), u = 2^-24), plus the
    // one rounding to the dtype (relative u_d = 2^-8 bf16, 2^-11 fp16, 2^-24
    // fp32): checked against a float64 reference with that bound.
    zpp_backend_t be = ZPP_BACKEND_AUTO;
    zpp_comm_backend(g_comm, &be);
    const bool hier = be != ZPP_BACKEND_NCCL && g_hier && g_nnodes > 1 && g_nnodes < g_size;
    std::vector<float> acc(c.count, 0.0f);
    std::vector<double> ref(c.count, 0.0), mag(c.count, 0.0), pmag(c.count, 0.0);
    std::vector<int> node(g_size);
    for (int r = 0; r < g_size; r++) zpp_comm_node_of(g_comm, r, &node[r]);
    const auto xs = slices_of(c, 2, g_rank);  // xs[r][i]: gen(r, n, ...)[g_rank * count + i]
    if (hier) {  // node order, then rank order inside each node
      for (int k = 0; k < g_nnodes; k++) {
        std::vector<float> part(c.count, 0.0f);
        bool first = true;
        for (int r = 0; r < g_size; r++) {
          if (node[r] != k) continue;
          const auto &x = xs[r];
          for (size_t i = 0; i < c.count; i++) part[i] = first ? x[i] : part[i] + x[i];
          first = false;
        }
        for (size_t i = 0; i < c.count; i++) {
          float p = c.dt == ZPP_FLOAT16 ? part[i] : to_dtype(part[i], c.dt);
          acc[i] = k == 0 ? p : acc[i] + p;
          pmag[i] += std::fabs((double)p);
        }
      }
    } else {
      for (int r = 0; r < g_size; r++)
        for (size_t i = 0; i < c.count; i++) acc[i] += xs[r][i];
    }
    for (int r = 0; r < g_size; r++)
      for (size_t i = 0; i < c.count; i++) {
        ref[i] += (double)xs[r][i];
        mag[i] += std::fabs((double)xs[r][i]);
      }
    const double u = std::ldexp(1.0, -24), k = (double)(g_size - 1);
    const double gamma = k * u / (1.0 - k * u);
    const double ud = c.dt == ZPP_BFLOAT16 ? std::ldexp(1.0, -8)
                      : c.dt == ZPP_FLOAT16 ? std::ldexp(1.0, -11) : u;
    const double pud = c.dt == ZPP_FLOAT16 ? 0.0 : ud;  // partials' rounding
    int bad = 0;
    for (size_t i = 0; i < c.count && bad < 3; i++) {
      float s = to_dtype(acc[i], c.dt);
      float mn = to_dtype(acc[i] / (float)g_size, c.dt);
      bool ok;
      if (hier) {
        // Bitwise the order above, and within its roundings of the float64
        // sum: the fp32 additions inside the nodes (gamma_{n-1} of sum |x|),
        // one rounding of each node's partial (u_d of |partial|, |P| at
        // most (1 + 2 u_d) times its rounded value; none for fp16, whose
        // partials travel in fp32), the fp32 additions of the partials
        // (gamma_{n-1} of their magnitudes), one rounding of the result.
        double bs = gamma * mag[i] + pud * pmag[i] * (1.0 + 2.0 * pud) +
                    gamma * pmag[i] + ud * std::fabs((double)s) * (1.0 + 2.0 * ud);
        ok = at(sum, c.dt, i) == s && at(mean, c.dt, i) == mn &&
             std::fabs((double)s - ref[i]) <= bs;
      } else if (be == ZPP_BACKEND_NCCL) {
        double bs = gamma * mag[i] * (1.0 + ud) + ud * std::fabs(ref[i]);
        double bm = bs / (double)g_size;
        ok = std::fabs((double)at(sum, c.dt, i) - ref[i]) <= bs &&
             std::fabs((double)at(mean, c.dt, i) - ref[i] / g_size) <= bm;
      } else {
        ok = at(sum, c.dt, i) == s && at(mean, c.dt, i) == mn;
      }
      if (!ok) {
        ADD_FAILURE() << name(c) << " element " << i << ": sum " << at(sum, c.dt, i)
                      << " want " << s << ", mean " << at(mean, c.dt, i) << " want " << mn
                      << " (backend " << zpp_backend_name(be) << ")";
        bad++;
      }
    }
  }
}

// ---- qwZ -----------------------------------------------------------------------

TEST(Qwz, WithinFormatBoundIdenticalOnAllRanksAndEqualToLocalCodec) {
  for (const Case &c : cases())
    for (bool asym : {false, true}) {
      zpp_quant_config_t q = qcfg(c.bits, c.block, asym);
      auto mine = pack(gen(g_rank, c.count, c.dt, 3), c.dt);
      size_t ds = zpp_dtype_size(c.dt);
      std::vector<uint8_t> out(g_size * c.count * ds);
      Mem m;
      EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, m.in(mine), m.out(out), c.count, c.dt,
                                  nullptr, nullptr),
                ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      m.back();
      EXPECT_TRUE(same_on_all_ranks(fnv(out.data(), out.size()))) << name(c);
      int bad = 0;
      for (int r = 0; r < g_size && bad < 3; r++) {
        auto x = gen(r, c.count, c.dt, 3);
        // exact: the local codec on the same shard
        auto in = pack(x, c.dt);
        std::vector<uint8_t> enc(enc_size(q, c.count)), dec(c.count * ds);
        zpp_quant_encode(&q, c.dt, in.data(), c.count, enc.data(), enc.size());
        zpp_quant_decode(&q, enc.data(), enc.size(), c.count, c.dt, dec.data());
        if (std::memcmp(dec.data(), out.data() + r * c.count * ds, dec.size()) != 0) {
          ADD_FAILURE() << name(c) << " shard " << r << " differs from the local codec";
          bad++;
        }
        // independent: the per-element bound of the format
        for (size_t b0 = 0; b0 < c.count; b0 += c.block) {
          size_t len = std::min(c.block, c.count - b0);
          double scale, range;
          block_params(&x[b0], len, c.bits, asym, &scale, &range);
          for (size_t i = b0; i < b0 + len; i++) {
            double got = zpp_qm_load(out.data(), r * c.count + i, (int)c.dt);
            if (std::fabs(got - x[i]) > block_bound(scale, range, x[i], got, c.dt) &&
                bad++ < 3)
              ADD_FAILURE() << name(c) << " shard " << r << " element " << i << ": "
                            << got << " vs " << x[i];
          }
        }
      }
    }
}

TEST(Qwz, InterNodeBytesScaleWithTheEncodedSize) {
  // Same transport algorithm, different message size: qwZ moves E bytes
  // where the baseline moves count * 2 (bf16), on every link class.
  const size_t count = 4096;
  for (int bits : {8, 4}) {
    zpp_quant_config_t q = qcfg(bits, 256);
    auto mine = pack(gen(g_rank, count, ZPP_BFLOAT16, 4), ZPP_BFLOAT16);
    std::vector<uint8_t> out(g_size * count * 2);
    Mem m;
    zpp_comm_reset_stats(g_comm);
    EXPECT_EQ(zpp_allgather(g_comm, m.in(mine), m.out(out), count, ZPP_BFLOAT16,
                            nullptr, nullptr),
              ZPP_OK);
    zpp_comm_stats_t base = stats();
    zpp_comm_reset_stats(g_comm);
    EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, m.in(mine), m.out(out), count,
                                ZPP_BFLOAT16, nullptr, nullptr),
              ZPP_OK);
    zpp_comm_stats_t qs = stats();
    size_t e = enc_size(q, count);  // count * bits / 8 + 4 * count / 256
    EXPECT_EQ(e, count * bits / 8 + 4 * (count / 256));
    EXPECT_EQ(qs.inter_bytes_sent * (count * 2), base.inter_bytes_sent * e);
    EXPECT_EQ(qs.intra_bytes_sent * (count * 2), base.intra_bytes_sent * e);
    EXPECT_EQ(qs.inter_bytes_recv * (count * 2), base.inter_bytes_recv * e);
    // some rank's traffic crosses nodes (a ring has quiet ranks)
    uint64_t mine_inter = base.inter_bytes_sent, world_inter = 0;
    world_inter = zpp_test::Reduce(mine_inter, '+');
    if (g_nnodes > 1) {
      EXPECT_GT(world_inter, 0u);
    }
    if (g_rank == 0 && bits == 8)
      std::printf("qwZ INT8 inter-node bytes sent by rank 0: %llu vs bf16 %llu (%.4f)\n",
                  (unsigned long long)qs.inter_bytes_sent,
                  (unsigned long long)base.inter_bytes_sent,
                  base.inter_bytes_sent ? (double)qs.inter_bytes_sent / base.inter_bytes_sent
                                        : 0.0);
  }
}

// ---- hpZ ---------------------------------------------------------------------------

TEST(Hpz, BackwardEqualsForwardBitwiseWithZeroInterNodeBytes) {
  for (const Case &c : cases())
    for (int quantized : {1, 0}) {
      zpp_hpz_config_t cfg = ZPP_HPZ_CONFIG_INIT;
      cfg.quantized = quantized;
      cfg.quant = qcfg(c.bits, c.block);
      zpp_hpz_t h = nullptr;
      EXPECT_EQ(zpp_hpz_create(g_comm, &cfg, c.count, c.dt, &h), ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      size_t ds = zpp_dtype_size(c.dt);
      auto mine = pack(gen(g_rank, c.count, c.dt, 5), c.dt);
      std::vector<uint8_t> fwd(g_size * c.count * ds), bwd(fwd.size(), 0xee);
      Mem m;
      EXPECT_EQ(zpp_hpz_forward_gather(h, m.in(mine), m.out(fwd), nullptr, nullptr),
                ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      zpp_comm_reset_stats(g_comm);
      zpp_hpz_info_t info = ZPP_HPZ_INFO_INIT;
      EXPECT_EQ(zpp_hpz_get_info(h, &info), ZPP_OK);
      size_t unit = quantized ? enc_size(cfg.quant, c.count) : c.count * ds;
      if (g_uniform) {
        EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, m.out(bwd), nullptr, nullptr),
                  ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        zpp_comm_stats_t s = stats();
        EXPECT_EQ(s.inter_bytes_sent + s.inter_bytes_recv, 0u) << name(c);
        EXPECT_EQ(info.hierarchical, 1);
        // a node all-gather of one unit per node from each rank
        EXPECT_EQ(info.secondary_bytes, (size_t)g_nnodes * unit);
      } else {
        // uneven nodes: documented fallback, a world gather from the
        // primary shard; without it the call says what is missing
        EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, m.out(bwd), nullptr, nullptr),
                  c.count ? ZPP_ERR_INVALID_ARGUMENT : ZPP_OK);
        EXPECT_EQ(zpp_hpz_backward_gather(h, m.in(mine), m.out(bwd), nullptr, nullptr),
                  ZPP_OK);
        EXPECT_EQ(info.hierarchical, 0);
        EXPECT_EQ(info.secondary_bytes, 0u);
      }
      m.back();
      EXPECT_EQ(std::memcmp(fwd.data(), bwd.data(), fwd.size()), 0) << name(c);
      if (!quantized) {  // full precision: the exact input of every rank
        for (int r = 0; r < g_size; r++) {
          auto want = pack(gen(r, c.count, c.dt, 5), c.dt);
          EXPECT_EQ(std::memcmp(bwd.data() + r * c.count * ds, want.data(),
                                c.count * ds),
                    0);
        }
      }
      zpp_hpz_destroy(h);
    }
}

TEST(Hpz, StaleSecondaryCopyIsRefusedOrRefreshed) {
  if (!g_uniform) GTEST_SKIP() << "uneven nodes keep no secondary copy (same on all ranks)";
  const size_t count = 333;
  zpp_hpz_config_t cfg = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  EXPECT_EQ(zpp_hpz_create(g_comm, &cfg, count, ZPP_FLOAT32, &h), ZPP_OK);
  std::vector<float> p1 = gen(g_rank, count, ZPP_FLOAT32, 6), p2 = gen(g_rank, count, ZPP_FLOAT32, 7);
  std::vector<float> out(g_size * count), fresh(g_size * count), again(g_size * count);
  std::vector<float> ref(g_size * count);
  Mem m;
  // no forward gather yet: refused without the primary shard
  EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, m.out(out), nullptr, nullptr),
            ZPP_ERR_STALE);
  EXPECT_NE(std::string(zpp_comm_get_last_error(g_comm)).find("generation"),
            std::string::npos);
  EXPECT_EQ(zpp_hpz_forward_gather(h, m.in(p1), m.out(out), nullptr, nullptr), ZPP_OK);
  // optimizer step: parameters change, the copy is stale
  EXPECT_EQ(zpp_hpz_invalidate(h), ZPP_OK);
  EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, m.out(out), nullptr, nullptr),
            ZPP_ERR_STALE);
  // with the new primary shard it refreshes (a world gather) ...
  EXPECT_EQ(zpp_hpz_backward_gather(h, m.in(p2), m.out(fresh), nullptr, nullptr),
            ZPP_OK);
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &cfg.quant, m.in(p2), m.out(ref), count,
                              ZPP_FLOAT32, nullptr, nullptr),
            ZPP_OK);
  m.back();
  EXPECT_EQ(std::memcmp(fresh.data(), ref.data(), ref.size() * 4), 0);
  // ... after which the node-local path serves the new parameters
  zpp_comm_reset_stats(g_comm);
  EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, m.out(again), nullptr, nullptr), ZPP_OK);
  EXPECT_EQ(stats().inter_bytes_sent, 0u);
  m.back();
  EXPECT_EQ(std::memcmp(again.data(), ref.data(), ref.size() * 4), 0);
  zpp_hpz_info_t info = ZPP_HPZ_INFO_INIT;
  zpp_hpz_get_info(h, &info);
  EXPECT_EQ(info.generation, 2u);
  EXPECT_EQ(info.secondary_generation, 2u);
  zpp_hpz_destroy(h);
}

TEST(Hpz, EmptyShardsWork) {
  zpp_hpz_config_t cfg = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  EXPECT_EQ(zpp_hpz_create(g_comm, &cfg, 0, ZPP_BFLOAT16, &h), ZPP_OK);
  EXPECT_EQ(zpp_hpz_forward_gather(h, nullptr, nullptr, nullptr, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_hpz_backward_gather(h, nullptr, nullptr, nullptr, nullptr), ZPP_OK);
  zpp_hpz_destroy(h);
}

// ---- qgZ -----------------------------------------------------------------------------

// float64 reference of slice `me` and the error bound of the two stages
// (docs/collectives.md, "qgZ"), for a call without a residual: the
// collector's own slices and its own node's partial sum are not quantized,
// so their terms are 0.
struct QgzRef {
  std::vector<double> sum, bound;
};

// x: slices_of(c, tag, me), drawn once per case for all its configs.
QgzRef qgz_reference(const Case &c, int intra_bits, int inter_bits, bool asym,
                     const std::vector<std::vector<float>> &x, int me) {
  int node_of_me, local_me;
  zpp_comm_node_of(g_comm, me, &node_of_me);
  zpp_comm_local_rank_of(g_comm, me, &local_me);
  bool two = g_uniform && g_nnodes > 1;
  QgzRef ref;
  ref.sum.assign(c.count, 0.0);
  ref.bound.assign(c.count, 0.0);
  std::vector<double> h1sum(c.count, 0.0), abssum(c.count, 0.0);
  std::vector<std::vector<double>> nodeU(g_nnodes, std::vector<double>(c.count, 0.0));
  // ZPP_QGZ_INTRA_RAW: stage 1 is exact on two levels and on one node; the
  // flat stage of uneven nodes quantizes in inter_bits
  int bits1 = intra_bits;
  if (intra_bits == ZPP_QGZ_INTRA_RAW) bits1 = two || g_nnodes == 1 ? 0 : inter_bits;
  for (int r = 0; r < g_size; r++) {
    int node, local;
    zpp_comm_node_of(g_comm, r, &node);
    zpp_comm_local_rank_of(g_comm, r, &local);
    // without a residual the collector's own share skips the quantizer:
    // slice `me` is collected on each node by its rank with local rank
    // local_me (two levels), or by `me` itself (one flat stage)
    bool own = two ? local == local_me : r == me;
    const float *xs = x[r].data();
    for (size_t b0 = 0; b0 < c.count; b0 += c.block) {
      size_t len = std::min(c.block, c.count - b0);
      double scale = 0, range = 0;
      if (bits1) block_params(xs + b0, len, bits1, asym, &scale, &range);
      for (size_t i = b0; i < b0 + len; i++) {
        double h1 = bits1 && !own ? block_bound(scale, range, xs[i], 0, ZPP_FLOAT32) : 0.0;
        ref.sum[i] += xs[i];
        h1sum[i] += h1;
        abssum[i] += std::fabs(xs[i]);
        nodeU[node][i] += std::fabs(xs[i]) + h1;
      }
    }
  }
  double levels2 = asym ? (1 << inter_bits) - 1 : (1 << (inter_bits - 1)) - 1;
  std::vector<double> umaxs(g_nnodes);
  for (size_t b0 = 0; b0 < c.count; b0 += c.block) {
    size_t len = std::min(c.block, c.count - b0);
    for (int m = 0; m < g_nnodes; m++) {
      umaxs[m] = 0;  // stage-2 input of node m in this block is bounded by U
      for (size_t j = b0; j < b0 + len; j++) umaxs[m] = std::max(umaxs[m], nodeU[m][j]);
    }
    for (size_t i = b0; i < b0 + len; i++) {
      double h2 = 0;
      if (two) {
        for (int m = 0; m < g_nnodes; m++) {
          if (m == node_of_me) continue;  // my node's partial sum stays fp32
          double range2 = (asym ? 2 : 1) * umaxs[m];
          double scale2 = range2 / levels2 * (1 + std::ldexp(1.0, -22));
          h2 += block_bound(scale2, range2, nodeU[m][i], 0, ZPP_FLOAT32);
        }
      }
      // fp32 accumulations: at most W + M additions of terms bounded by
      // sum |x| + the quantization errors
      double acc = (g_size + g_nnodes) * std::ldexp(1.0, -23) *
                   (abssum[i] + h1sum[i] + h2);
      ref.bound[i] = h1sum[i] + h2 + acc;
    }
  }
  return ref;
}

TEST(Qgz, MatchesFloat64ReferenceWithinTheTwoStageBound) {
  int me = g_rank;
  for (const Case &c : cases()) {
    const auto xs = slices_of(c, 8, me);
    const auto mine = pack(gen(g_rank, g_size * c.count, c.dt, 8), c.dt);
    for (int intra_bits : {4, 8, ZPP_QGZ_INTRA_RAW}) {
      if (c.bits == 8 && intra_bits == 4) continue;  // covers 4/4, 8/4... below
      int inter_bits = c.bits == 8 ? 8 : 4;
      if (c.bits == 4 && intra_bits == 8) inter_bits = 4;  // ZeRO++ 8 intra, 4 inter
      // raw inside the node: 16/4 and 16/8
      for (bool asym : {false, true}) {
        zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
        cfg.intra_bits = intra_bits;
        cfg.inter_bits = inter_bits;
        cfg.block_size = c.block;
        cfg.mode = asym ? ZPP_QUANT_ASYMMETRIC : ZPP_QUANT_SYMMETRIC;
        size_t ds = zpp_dtype_size(c.dt);
        std::vector<uint8_t> sum(c.count * ds), mean(c.count * ds);
        Mem m;
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(mine), m.out(sum), c.count,
                                         c.dt, ZPP_OP_SUM, nullptr, nullptr, nullptr),
                  ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(mine), m.out(mean), c.count,
                                         c.dt, ZPP_OP_MEAN, nullptr, nullptr, nullptr),
                  ZPP_OK);
        m.back();
        QgzRef ref = qgz_reference(c, intra_bits, inter_bits, asym, xs, me);
        int bad = 0;
        for (size_t i = 0; i < c.count && bad < 3; i++) {
          double s = at(sum, c.dt, i), m = at(mean, c.dt, i);
          double out_s = c.dt == ZPP_FLOAT32 ? std::ldexp(1.0, -24)
                         : c.dt == ZPP_BFLOAT16 ? std::ldexp(1.0, -8)
                                                : std::ldexp(1.0, -11);
          double bs = ref.bound[i] + out_s * std::fabs(s) + 1e-30;
          double bm = ref.bound[i] / g_size + out_s * std::fabs(m) +
                      std::ldexp(1.0, -24) * std::fabs(m) + 1e-30;
          if (std::fabs(s - ref.sum[i]) > bs || std::fabs(m - ref.sum[i] / g_size) > bm) {
            ADD_FAILURE() << name(c) << (asym ? " asym" : " sym") << " intra "
                          << intra_bits << " inter " << inter_bits << " element " << i
                          << ": sum " << s << " ref " << ref.sum[i] << " bound " << bs
                          << "; mean " << m << " bound " << bm;
            bad++;
          }
          // MEAN is the true mean: the same fp32 sum divided by the world size
          if (c.dt == ZPP_FLOAT32 && m != (double)((float)s / (float)g_size) && bad++ < 3)
            ADD_FAILURE() << "MEAN " << m << " != SUM / " << g_size << " = "
                          << (float)s / (float)g_size;
        }
      }
    }
  }
}

TEST(Qgz, NonFiniteGradientShowsUpInTheOwningShard) {
  const size_t count = 300;
  size_t n = g_size * count;
  zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
  auto x = gen(g_rank, n, ZPP_FLOAT32, 9);
  // the last rank poisons element 5 of the last rank's slice with NaN and
  // element 17 of rank 0's slice with Inf
  if (g_rank == g_size - 1) {
    x[(size_t)(g_size - 1) * count + 5] = NAN;
    x[17] = INFINITY;
  }
  std::vector<float> out(count);
  Mem m;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count,
                                   ZPP_FLOAT32, ZPP_OP_MEAN, nullptr, nullptr, nullptr),
            ZPP_OK);
  m.back();
  if (g_rank == g_size - 1) {
    EXPECT_TRUE(!std::isfinite(out[5]));
  }
  if (g_rank == 0) {
    EXPECT_TRUE(!std::isfinite(out[17]));
  }
  // elements in other blocks stay finite
  EXPECT_TRUE(std::isfinite(out[count - 1]));
}

TEST(Qgz, ErrorFeedbackDrivesTheAverageErrorDown) {
  // The same gradient every step: without feedback every step makes the
  // same error; with it, the errors cancel and the average over K steps
  // approaches the exact sum (its error shrinks like 1/K).
  const size_t count = 1000;
  const int steps = 8;
  size_t n = g_size * count;
  zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
  cfg.block_size = 128;
  auto x = gen(g_rank, n, ZPP_FLOAT32, 10);
  size_t rc = 0;
  EXPECT_EQ(zpp_qgz_residual_count(g_comm, count, &rc), ZPP_OK);
  EXPECT_EQ(rc, (size_t)(g_size + (g_uniform && g_nnodes > 1 ? g_nnodes : 0)) * count);
  std::vector<float> residual(rc, 0.0f), out(count);
  std::vector<double> avg_ef(count, 0.0), plain(count);
  Mem m;
  for (int k = 0; k < steps; k++) {
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count,
                                     ZPP_FLOAT32, ZPP_OP_SUM, m.out(residual), nullptr,
                                     nullptr),
              ZPP_OK);
    m.back();
    for (size_t i = 0; i < count; i++) avg_ef[i] += out[i] / (double)steps;
  }
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count,
                                   ZPP_FLOAT32, ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_OK);
  m.back();
  double e_ef = 0, e_plain = 0;
  for (size_t i = 0; i < count; i++) {
    double exact = 0;
    for (int r = 0; r < g_size; r++) exact += gen(r, n, ZPP_FLOAT32, 10)[g_rank * count + i];
    e_ef += (avg_ef[i] - exact) * (avg_ef[i] - exact);
    e_plain += (out[i] - exact) * (out[i] - exact);
    if (i == 20) break;  // the reference regeneration is O(W^2 n): sample
  }
  if (g_size == 1) {  // a rank's own share is not quantized: nothing is
    EXPECT_EQ(e_plain, 0.0) << "one rank: the result is the input";
    EXPECT_EQ(e_ef, 0.0) << "one rank: the result is the input";
    return;
  }
  EXPECT_LT(e_ef, 0.25 * e_plain) << "error feedback did not reduce the error";
}

// ZPP_QGZ_INTRA_RAW: stage 1 has no error, so the residual holds only the
// stage-2 errors (M segments, first); uneven nodes quantize the flat stage
// (W segments); one node quantizes nothing.  Error feedback on what is
// quantized still cancels the errors over steps, with the fp32 and the
// INT8 residual, with and without the Hadamard rotation (raw: of the
// partial sums), and nothing past zpp_qgz_residual_bytes is written (a
// sentinel fills the rest of a zpp_qgz_residual_count buffer; on uneven
// nodes the W segments fill an fp32 buffer, and only INT8 leaves a tail).
TEST(Qgz, RawIntraStageKeepsOnlyTheQuantizedStagesResidual) {
  const size_t count = 1000;
  const int steps = 8;
  size_t n = g_size * count;
  bool two = g_uniform && g_nnodes > 1;
  auto x = gen(g_rank, n, ZPP_FLOAT32, 12);
  std::vector<double> exact(count, 0.0), abssum(count, 0.0);
  for (int r = 0; r < g_size; r++) {
    auto xr = gen(r, n, ZPP_FLOAT32, 12);
    for (size_t i = 0; i < count; i++) {
      exact[i] += xr[(size_t)g_rank * count + i];
      abssum[i] += std::fabs(xr[(size_t)g_rank * count + i]);
    }
  }
  for (int rbits : {32, 8})
    for (size_t had : {(size_t)0, (size_t)32}) {
      zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
      cfg.intra_bits = ZPP_QGZ_INTRA_RAW;
      cfg.block_size = 128;
      cfg.residual_bits = rbits;
      cfg.hadamard = had;
      std::string what = "residual_bits " + std::to_string(rbits) + ", hadamard " +
                         std::to_string(had);
      size_t rc = 0, rb = 0, per = rbits == 32 ? count * 4 : enc_size(qcfg(8, 128), count);
      EXPECT_EQ(zpp_qgz_residual_count(g_comm, count, &rc), ZPP_OK);
      EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &rb), ZPP_OK);
      size_t segs = two ? (size_t)g_nnodes : g_nnodes > 1 ? (size_t)g_size : 0;
      EXPECT_EQ(rb, segs * per) << what;
      ASSERT_LE(rb, rc * sizeof(float)) << what;
      const uint8_t sentinel = 0xa7;
      std::vector<uint8_t> residual(rc * sizeof(float), sentinel);
      std::fill(residual.begin(), residual.begin() + rb, 0);
      std::vector<float> out(count), plain(count);
      std::vector<double> avg_ef(count, 0.0);
      Mem m;
      uint8_t *res = m.out(residual);
      for (int k = 0; k < steps; k++) {
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count, ZPP_FLOAT32,
                                         ZPP_OP_SUM, res, nullptr, nullptr),
                  ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        m.back();
        for (size_t i = 0; i < count; i++) avg_ef[i] += out[i] / (double)steps;
      }
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(plain), count, ZPP_FLOAT32,
                                       ZPP_OP_SUM, nullptr, nullptr, nullptr),
                ZPP_OK);
      m.back();
      size_t touched = 0;
      for (size_t i = rb; i < residual.size(); i++) touched += residual[i] != sentinel;
      EXPECT_EQ(touched, 0u) << "bytes past zpp_qgz_residual_bytes written: " << what;
      if (segs == 0) {  // one node: the fp32 sum, W additions of relative 2^-24
        // (counted, not ASSERTed: a rank must not leave before the next
        // variant's collectives)
        size_t off_bound = 0, changed = 0, first = count;
        for (size_t i = 0; i < count; i++) {
          double b = g_size * std::ldexp(1.0, -24) * abssum[i] + 1e-30;
          bool bad_b = !(std::fabs(plain[i] - exact[i]) <= b), bad_c = out[i] != plain[i];
          off_bound += bad_b;
          changed += bad_c;
          if ((bad_b || bad_c) && first == count) first = i;
        }
        EXPECT_EQ(off_bound, 0u) << "outside the fp32 sum's bound, first element " << first
                                 << ": " << what;
        EXPECT_EQ(changed, 0u) << "the residual changed an exact sum, first element " << first
                               << ": " << what;
        continue;
      }
      double e_ef = 0, e_plain = 0;
      for (size_t i = 0; i < count; i++) {
        e_ef += (avg_ef[i] - exact[i]) * (avg_ef[i] - exact[i]);
        e_plain += (plain[i] - exact[i]) * (plain[i] - exact[i]);
      }
      EXPECT_GT(e_plain, 0.0) << what;
      EXPECT_LT(e_ef, 0.25 * e_plain) << "error feedback did not reduce the error: " << what;
    }
}

TEST(Qgz, CountsEqualTheFormulas) {
  const size_t count = 4096;
  size_t n = g_size * count;
  zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;  // INT4 both stages, block 256
  cfg.intra_bits = 8;
  auto x = gen(g_rank, n, ZPP_BFLOAT16, 11);
  auto in = pack(x, ZPP_BFLOAT16);
  std::vector<uint8_t> out(count * 2);
  Mem m;
  zpp_comm_reset_stats(g_comm);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(in), m.out(out), count,
                                   ZPP_BFLOAT16, ZPP_OP_MEAN, nullptr, nullptr, nullptr),
            ZPP_OK);
  zpp_comm_stats_t s = stats();
  int local_size = 1;
  zpp_comm_local_size(g_comm, &local_size);
  size_t e1 = enc_size(qcfg(8, 256), count), e2 = enc_size(qcfg(4, 256), count);
  if (g_uniform && g_nnodes > 1) {
    // stage 1: M encoded slices to each of the S-1 other ranks of my node;
    // stage 2: one encoded slice to each of the M-1 other nodes
    EXPECT_EQ(s.intra_bytes_sent, (uint64_t)(local_size - 1) * g_nnodes * e1);
    EXPECT_EQ(s.inter_bytes_sent, (uint64_t)(g_nnodes - 1) * e2);
    EXPECT_EQ(s.inter_bytes_recv, (uint64_t)(g_nnodes - 1) * e2);
  } else if (g_uniform) {  // one node
    EXPECT_EQ(s.intra_bytes_sent, (uint64_t)(g_size - 1) * e1);
    EXPECT_EQ(s.inter_bytes_sent, 0u);
  } else {  // flat fallback: one encoded slice to every other rank
    EXPECT_EQ(s.intra_bytes_sent + s.inter_bytes_sent, (uint64_t)(g_size - 1) * e1);
  }
  // raw inside the node: stage 1 moves the bf16 slices (2 bytes each); the
  // flat stage of uneven nodes crosses the network in inter_bits
  cfg.intra_bits = ZPP_QGZ_INTRA_RAW;
  zpp_comm_reset_stats(g_comm);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(in), m.out(out), count,
                                   ZPP_BFLOAT16, ZPP_OP_MEAN, nullptr, nullptr, nullptr),
            ZPP_OK)
      << zpp_comm_get_last_error(g_comm);
  s = stats();
  size_t raw = count * 2;
  if (g_uniform && g_nnodes > 1) {
    EXPECT_EQ(s.intra_bytes_sent, (uint64_t)(local_size - 1) * g_nnodes * raw);
    EXPECT_EQ(s.inter_bytes_sent, (uint64_t)(g_nnodes - 1) * e2);
    EXPECT_EQ(s.inter_bytes_recv, (uint64_t)(g_nnodes - 1) * e2);
  } else if (g_uniform) {
    EXPECT_EQ(s.intra_bytes_sent, (uint64_t)(g_size - 1) * raw);
    EXPECT_EQ(s.inter_bytes_sent, 0u);
  } else {
    EXPECT_EQ(s.intra_bytes_sent + s.inter_bytes_sent, (uint64_t)(g_size - 1) * e2);
  }
}



// qwZ with stochastic rounding: rank r's shard draws at its index in the
// whole tensor (r * count + i), chunked or not, so the output equals the
// local codec run with that index base for every shard, on every rank.
TEST(Qwz, StochasticRoundingDrawsAtTheIndexInTheWholeTensor) {
  const size_t count = 5000;
  zpp_quant_config_t q = qcfg(4, 256);
  q.rounding = ZPP_ROUND_STOCHASTIC;
  q.seed = 11;
  auto x = gen(g_rank, count, ZPP_FLOAT32, 25);
  std::vector<float> out(count * g_size);
  Mem m;
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, m.in(x), m.out(out), count, ZPP_FLOAT32, nullptr,
                              nullptr), ZPP_OK) << zpp_comm_get_last_error(g_comm);
  m.back();
  size_t e = enc_size(q, count);
  std::vector<uint8_t> enc(e);
  std::vector<float> dec(count);
  for (int r = 0; r < g_size; r++) {
    auto xr = gen(r, count, ZPP_FLOAT32, 25);
    EXPECT_EQ(zpp_quant_encode_at(&q, ZPP_FLOAT32, xr.data(), count, (uint64_t)r * count,
                                  enc.data(), e), ZPP_OK);
    EXPECT_EQ(zpp_quant_decode(&q, enc.data(), e, count, ZPP_FLOAT32, dec.data()), ZPP_OK);
    EXPECT_EQ(0, std::memcmp(dec.data(), out.data() + (size_t)r * count, count * 4))
        << "shard of rank " << r;
  }
}

// ---- qgZ transforms: Hadamard, stochastic rounding, INT8 residual ---------

// float64 H x / sqrt(g) of one group (Sylvester order, as the butterflies).
void hadamard64(const double *x, size_t g, double *y) {
  for (size_t i = 0; i < g; i++) {
    double s = 0;
    for (size_t j = 0; j < g; j++) s += (__builtin_popcountll(i & j) & 1 ? -x[j] : x[j]);
    y[i] = s / std::sqrt((double)g);
  }
}

// Heavy-tailed gradients: normal, with one element in 64 multiplied by 40.
// Squared distance of this rank's `count` reduce-scatter outputs `got`
// from the exact sum (in double) of every rank's input slice for this
// rank; all[r] is rank r's whole input.
template <class V>
double sq_err_vs_exact_sum(const V &got, const std::vector<std::vector<float>> &all,
                           size_t count) {
  double e = 0;
  for (size_t i = 0; i < count; i++) {
    double exact = 0;
    for (int r = 0; r < g_size; r++) exact += all[r][(size_t)g_rank * count + i];
    e += (got[i] - exact) * (got[i] - exact);
  }
  return e;
}

std::vector<float> gen_outliers(int r, size_t n, zpp_dtype_t dt, uint64_t tag) {
  auto x = gen(r, n, dt, tag);
  for (size_t i = (size_t)r % 64; i < n; i += 64) x[i] = to_dtype(x[i] * 40.0f, dt);
  return x;
}

// The bound of docs/collectives.md, "qgZ with a Hadamard rotation": the
// two-stage bound B_j of the plain qgZ applied to the rotated inputs
// (computed from |y| + e, y = R x in float64 and e the bound of the fp32
// rotation, docs/format.md), carried back through the inverse rotation:
//   |out_i - sum_r x_r,i| <= c sum_{j in group} (B_j + sum_r e_r,j)
//       + k 2^-24 (1 + 2^-20) c sum_j |z_j| + 2^-22 |sum_r x_r,i|
// (the inverse's rounding, with |z_j| <= sum_r (|y_r,j| + e_r,j) + B_j, and
// the relative 2^-23 by which fl(1/sqrt(g))^2 g may miss 1), plus the final
// dtype rounding.  Elements of the last count % g are not rotated: the
// plain bound.  SR doubles the quantization term (one step, not half).
struct HadRef {
  std::vector<double> sum, bound;
};

// The owner's bound through the inverse rotation, shared by both
// references: B_j bounds the rotated accumulator's error (rotation errors
// included), zmag_j its magnitude; each whole group of g gets
// c sum_G B + k u (1 + 2^-20) c sum_G zmag + 2^-22 |sum|, the tail its own B.
void inverse_rotation_bound(const std::vector<double> &B, const std::vector<double> &zmag,
                            size_t count, size_t g, int k, double c, HadRef *ref) {
  size_t whole = count / g * g;
  double u = std::ldexp(1.0, -24);
  for (size_t b0 = 0; b0 < whole; b0 += g) {
    double sb = 0, sz = 0;
    for (size_t j = 0; j < g; j++) {
      sb += B[b0 + j];
      sz += zmag[b0 + j];
    }
    for (size_t i = b0; i < b0 + g; i++)
      ref->bound[i] = c * sb + k * u * (1 + std::ldexp(1.0, -20)) * c * sz +
                      std::ldexp(1.0, -22) * std::fabs(ref->sum[i]);
  }
  for (size_t i = whole; i < count; i++) ref->bound[i] = B[i];
}

HadRef qgz_hadamard_reference(size_t count, zpp_dtype_t dt, int intra_bits, int inter_bits,
                              size_t block, size_t g, bool sr, uint64_t tag, int me) {
  size_t n = g_size * count, whole = count / g * g;
  int k = 0;
  while (((size_t)1 << k) < g) k++;
  double c = 1.0 / std::sqrt((double)g), u = std::ldexp(1.0, -24);
  double half = sr ? 1.0 : 0.5;
  HadRef ref;
  ref.sum.assign(count, 0.0);
  ref.bound.assign(count, 0.0);
  std::vector<double> h1sum(count, 0.0), abssum(count, 0.0), esum(count, 0.0);
  std::vector<std::vector<double>> nodeU(g_nnodes, std::vector<double>(count, 0.0));
  bool two = g_uniform && g_nnodes > 1;
  int node_of_me = 0, local_me = 0;
  zpp_comm_node_of(g_comm, me, &node_of_me);
  zpp_comm_local_rank_of(g_comm, me, &local_me);
  for (int r = 0; r < g_size; r++) {
    auto x = gen_outliers(r, n, dt, tag);
    const float *xs = &x[(size_t)me * count];
    std::vector<double> y(count), mag(count);
    for (size_t i = 0; i < count; i++) {
      ref.sum[i] += xs[i];
      y[i] = xs[i];
      mag[i] = std::fabs((double)xs[i]);
    }
    for (size_t b0 = 0; b0 < whole; b0 += g) {
      std::vector<double> xd(xs + b0, xs + b0 + g);
      hadamard64(xd.data(), g, &y[b0]);
      double l1 = 0;
      for (size_t j = 0; j < g; j++) l1 += std::fabs(xd[j]);
      for (size_t j = 0; j < g; j++) {
        double e = k * u * (1 + std::ldexp(1.0, -20)) * l1 * c + 2 * u * std::fabs(y[b0 + j]) +
                   std::ldexp(1.0, -149);
        esum[b0 + j] += e;
        mag[b0 + j] = std::fabs(y[b0 + j]) + e;
      }
    }
    int node, local;
    zpp_comm_node_of(g_comm, r, &node);
    zpp_comm_local_rank_of(g_comm, r, &local);
    bool own = two ? local == local_me : r == me;  // not quantized (qgz_reference)
    for (size_t b0 = 0; b0 < count; b0 += block) {
      size_t len = std::min(block, count - b0);
      double range = 0;
      for (size_t i = b0; i < b0 + len; i++) range = std::max(range, mag[i]);
      double scale = range / ((1 << (intra_bits - 1)) - 1) * (1 + std::ldexp(1.0, -23));
      for (size_t i = b0; i < b0 + len; i++) {
        double h1 = own ? 0.0
                        : scale * (half + std::ldexp(1.0, -12)) +
                              std::ldexp(1.0, -22) * (mag[i] + range) + std::ldexp(1.0, -149);
        h1sum[i] += h1;
        abssum[i] += mag[i];
        nodeU[node][i] += mag[i] + h1;
      }
    }
  }
  std::vector<double> B(count, 0.0), zmag(count, 0.0);
  double levels2 = (1 << (inter_bits - 1)) - 1;
  for (size_t b0 = 0; b0 < count; b0 += block) {
    size_t len = std::min(block, count - b0);
    for (size_t i = b0; i < b0 + len; i++) {
      double h2 = 0;
      if (two)
        for (int m = 0; m < g_nnodes; m++) {
          if (m == node_of_me) continue;  // my node's partial sum stays fp32
          double umax = 0;
          for (size_t j = b0; j < b0 + len; j++) umax = std::max(umax, nodeU[m][j]);
          double scale2 = umax / levels2 * (1 + std::ldexp(1.0, -22));
          h2 += scale2 * (half + std::ldexp(1.0, -12)) +
                std::ldexp(1.0, -22) * (nodeU[m][i] + umax);
        }
      double acc = (g_size + g_nnodes) * std::ldexp(1.0, -23) * (abssum[i] + h1sum[i] + h2);
      B[i] = h1sum[i] + h2 + acc;
      zmag[i] = abssum[i] + B[i];
    }
  }
  // the rotations' own errors join B (esum is 0 on the unrotated tail)
  for (size_t i = 0; i < count; i++) B[i] += esum[i];
  inverse_rotation_bound(B, zmag, count, g, k, c, &ref);
  return ref;
}

// The same bound when stage 1 is raw (ZPP_QGZ_INTRA_RAW, two levels): the
// rotation moves to the node partial sums.  Node m's fp32 partial sum
// misses the exact P_m by d_m <= (S - 1) 2^-24 sum_{r on m} |x_r| (S - 1
// additions of terms bounded by that sum); it is rotated in fp32 (error
// e_m, the bound of the rotation of a vector with l1 norm
// sum_G (|P_m| + d_m)) and R carries d_m to at most c sum_G d_m; so the
// rotated partial sum is within E_m,j = c sum_G d_m + e_m,j of R P_m and
// its magnitude within |R P_m|_j + E_m,j, which bounds the stage-2 block
// range and error h2 as above.  In the rotated domain the owner's
// accumulator z misses R sum P_m by B_j = sum_m (E_m,j + h2_m,j) plus the
// M fp32 additions; the inverse rotation is as above.
HadRef qgz_hadamard_raw_reference(size_t count, zpp_dtype_t dt, int inter_bits, size_t block,
                                  size_t g, bool sr, uint64_t tag, int me) {
  size_t n = g_size * count, whole = count / g * g;
  int k = 0, local_size = 1;
  while (((size_t)1 << k) < g) k++;
  zpp_comm_local_size(g_comm, &local_size);
  double c = 1.0 / std::sqrt((double)g), u = std::ldexp(1.0, -24);
  double half = sr ? 1.0 : 0.5;
  HadRef ref;
  ref.sum.assign(count, 0.0);
  ref.bound.assign(count, 0.0);
  std::vector<std::vector<double>> P(g_nnodes, std::vector<double>(count, 0.0));
  std::vector<std::vector<double>> A(g_nnodes, std::vector<double>(count, 0.0));
  for (int r = 0; r < g_size; r++) {
    auto x = gen_outliers(r, n, dt, tag);
    int node;
    zpp_comm_node_of(g_comm, r, &node);
    for (size_t i = 0; i < count; i++) {
      double v = x[(size_t)me * count + i];
      ref.sum[i] += v;
      P[node][i] += v;
      A[node][i] += std::fabs(v);
    }
  }
  std::vector<double> B(count, 0.0), zmag(count, 0.0), h2sum(count, 0.0), magsum(count, 0.0);
  double levels2 = (1 << (inter_bits - 1)) - 1;
  int node_of_me = 0;
  zpp_comm_node_of(g_comm, me, &node_of_me);
  for (int m = 0; m < g_nnodes; m++) {
    std::vector<double> mag(count), E(count, 0.0);
    for (size_t i = 0; i < count; i++) {  // tail: not rotated
      E[i] = (local_size - 1) * u * (1 + std::ldexp(1.0, -20)) * A[m][i];
      mag[i] = std::fabs(P[m][i]) + E[i];
    }
    for (size_t b0 = 0; b0 < whole; b0 += g) {
      std::vector<double> y(g);
      hadamard64(&P[m][b0], g, y.data());
      double l1 = 0, dsum = 0;
      for (size_t j = 0; j < g; j++) {
        double d = (local_size - 1) * u * (1 + std::ldexp(1.0, -20)) * A[m][b0 + j];
        dsum += d;
        l1 += std::fabs(P[m][b0 + j]) + d;
      }
      for (size_t j = 0; j < g; j++) {
        double e = k * u * (1 + std::ldexp(1.0, -20)) * l1 * c +
                   2 * u * (std::fabs(y[j]) + c * dsum) + std::ldexp(1.0, -149);
        E[b0 + j] = c * dsum + e;
        mag[b0 + j] = std::fabs(y[j]) + E[b0 + j];
      }
    }
    for (size_t b0 = 0; b0 < count; b0 += block) {
      size_t len = std::min(block, count - b0);
      double umax = 0;
      for (size_t j = b0; j < b0 + len; j++) umax = std::max(umax, mag[j]);
      double scale2 = umax / levels2 * (1 + std::ldexp(1.0, -22));
      for (size_t i = b0; i < b0 + len; i++) {
        // my node's partial sum stays fp32: rotated, not quantized
        double h2 = m == node_of_me ? 0.0
                                    : scale2 * (half + std::ldexp(1.0, -12)) +
                                          std::ldexp(1.0, -22) * (mag[i] + umax);
        B[i] += E[i] + h2;
        h2sum[i] += h2;
        magsum[i] += mag[i];
      }
    }
  }
  for (size_t i = 0; i < count; i++) {
    B[i] += g_nnodes * std::ldexp(1.0, -23) * (magsum[i] + h2sum[i]);
    zmag[i] = magsum[i] + B[i];
  }
  inverse_rotation_bound(B, zmag, count, g, k, c, &ref);
  return ref;
}

TEST(Qgz, HadamardMatchesFloat64ReferenceWithinTheRotatedBound) {
  struct HC {
    zpp_dtype_t dt;
    size_t count, block, g;
    int intra, inter;
    bool sr;
  };
  const HC hcs[] = {{ZPP_FLOAT32, 4097, 256, 32, 4, 4, false},
                    {ZPP_BFLOAT16, 10007, 256, 32, 8, 4, false},
                    {ZPP_FLOAT32, 7, 32, 8, 4, 4, false},   // all tail
                    {ZPP_FLOAT16, 1000, 64, 64, 4, 4, true},
                    {ZPP_FLOAT32, 2048, 1024, 1024, 8, 4, false},
                    // raw inside the node: the partial sums are rotated
                    {ZPP_BFLOAT16, 10007, 256, 32, ZPP_QGZ_INTRA_RAW, 4, false},
                    {ZPP_FLOAT32, 4097, 256, 64, ZPP_QGZ_INTRA_RAW, 4, true}};
  for (const HC &h : hcs) {
    zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
    cfg.intra_bits = h.intra;
    cfg.inter_bits = h.inter;
    cfg.block_size = h.block;
    cfg.hadamard = h.g;
    cfg.rounding = h.sr ? ZPP_ROUND_STOCHASTIC : ZPP_ROUND_NEAREST;
    cfg.seed = 99;
    size_t n = g_size * h.count, ds = zpp_dtype_size(h.dt);
    auto mine = pack(gen_outliers(g_rank, n, h.dt, 21), h.dt);
    std::vector<uint8_t> sum(h.count * ds), plain(h.count * ds);
    Mem m;
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(mine), m.out(sum), h.count, h.dt,
                                     ZPP_OP_SUM, nullptr, nullptr, nullptr),
              ZPP_OK)
        << zpp_comm_get_last_error(g_comm);
    cfg.hadamard = 0;  // the same call unrotated gives other bits (the option does act)
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(mine), m.out(plain), h.count, h.dt,
                                     ZPP_OP_SUM, nullptr, nullptr, nullptr),
              ZPP_OK);
    m.back();
    bool raw = h.intra == ZPP_QGZ_INTRA_RAW, two = g_uniform && g_nnodes > 1;
    if ((raw && g_nnodes == 1) || g_size == 1) {  // nothing quantized, nothing rotated
      EXPECT_EQ(sum, plain) << "g " << h.g << ": one node, raw, or one rank: rotated anyway";
      continue;
    }
    if (h.count >= h.g) {
      EXPECT_NE(sum, plain) << "g " << h.g << ": the rotation changed nothing";
    }
    // (uneven nodes with raw: the flat stage quantizes in inter_bits)
    HadRef ref = raw && two ? qgz_hadamard_raw_reference(h.count, h.dt, h.inter, h.block, h.g,
                                                          h.sr, 21, g_rank)
                            : qgz_hadamard_reference(h.count, h.dt, raw ? h.inter : h.intra,
                                                     h.inter, h.block, h.g, h.sr, 21, g_rank);
    double out_u = h.dt == ZPP_FLOAT32 ? std::ldexp(1.0, -24)
                   : h.dt == ZPP_BFLOAT16 ? std::ldexp(1.0, -8)
                                          : std::ldexp(1.0, -11);
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < h.count; i++) {
      double s = at(sum, h.dt, i), b = ref.bound[i] + out_u * std::fabs(s) + 1e-30;
      worst = std::max(worst, std::fabs(s - ref.sum[i]) / b);
      if (!(std::fabs(s - ref.sum[i]) <= b) && bad++ < 3)
        ADD_FAILURE() << zpp_dtype_name(h.dt) << " count " << h.count << " g " << h.g
                      << " element " << i << ": " << s << " ref " << ref.sum[i] << " bound " << b;
    }
    if (g_rank == 0)
      std::printf("[ info ] hadamard %zu %s count %zu: largest error / bound %.3f\n", h.g,
                  zpp_dtype_name(h.dt), h.count, worst);
  }
}

TEST(Qgz, StochasticRoundingIsReproducibleAndSeedsDiffer) {
  const size_t count = 3001;
  size_t n = g_size * count;
  zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
  cfg.rounding = ZPP_ROUND_STOCHASTIC;
  cfg.seed = 5;
  auto x = gen(g_rank, n, ZPP_FLOAT32, 22);
  std::vector<float> a(count), b(count), c(count);
  Mem m;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(a), count, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(b), count, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr), ZPP_OK);
  cfg.seed = 6;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(c), count, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr), ZPP_OK);
  m.back();
  EXPECT_EQ(a, b) << "same seed, different result";
  if (g_size > 1) {
    EXPECT_NE(a, c) << "seeds 5 and 6 gave the same result";
  }
}

// The chunked plan (ZPP_PIPE_MIN_CHUNK small: several chunks and a short
// last one, each chunk's partial sums for other nodes sent before its own
// node's is summed, all-to-alls without the block to itself) gives the bits
// of the one-chunk plan (ZPP_PIPE_MIN_CHUNK=0): results and error-feedback
// residuals over two steps, for each stage-1 kind, rotation, stochastic
// rounding and both residual formats.  Device memory is never chunked, so
// there the two runs are the same plan.
TEST(Qgz, ChunkedPlanIsBitwiseTheOneChunkPlan) {
  ScopedEnv keep("ZPP_PIPE_MIN_CHUNK", "0", zpp_settings_reload);
  struct Cfg {
    int intra, inter;
    size_t block, hadamard;
    int residual_bits;  // 0: no residual
    zpp_quant_mode_t mode;
    zpp_rounding_t rounding;
    float beta;
  };
  const Cfg cfgs[] = {
      {4, 4, 256, 0, 0, ZPP_QUANT_SYMMETRIC, ZPP_ROUND_NEAREST, 0.0f},
      {8, 4, 64, 0, 32, ZPP_QUANT_ASYMMETRIC, ZPP_ROUND_NEAREST, 0.0f},
      {ZPP_QGZ_INTRA_RAW, 4, 64, 32, 32, ZPP_QUANT_SYMMETRIC, ZPP_ROUND_STOCHASTIC, 0.0f},
      {8, 8, 64, 32, 8, ZPP_QUANT_SYMMETRIC, ZPP_ROUND_STOCHASTIC, 0.8f},
  };
  // block 256: 4 chunks of 256 at ZPP_PIPE_MIN_CHUNK=256, the last one 232;
  // block 64: 8 chunks of 640, the last one 520
  for (size_t count : {(size_t)1000, (size_t)5000})
    for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16})
      for (const Cfg &k : cfgs) {
        zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
        cfg.intra_bits = k.intra;
        cfg.inter_bits = k.inter;
        cfg.block_size = k.block;
        cfg.hadamard = k.hadamard;
        cfg.mode = k.mode;
        cfg.rounding = k.rounding;
        cfg.seed = 41;
        if (k.residual_bits) {
          cfg.residual_bits = k.residual_bits;
          cfg.residual_beta = k.beta;
        }
        size_t ds = zpp_dtype_size(dt), rb = 0;
        if (k.residual_bits) {
          ASSERT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &rb), ZPP_OK);
        }
        auto mine = pack(gen(g_rank, g_size * count, dt, 61 + count), dt);
        std::vector<uint8_t> out[2][2], res[2];
        for (int chunked = 0; chunked < 2; chunked++) {
          setenv("ZPP_PIPE_MIN_CHUNK", chunked ? "256" : "0", 1);
          zpp_settings_reload();
          res[chunked].assign(rb + 1, 0);
          Mem m;
          uint8_t *r = k.residual_bits ? m.out(res[chunked]) : nullptr;
          for (int step = 0; step < 2; step++) {
            out[chunked][step].assign(count * ds, 0);
            cfg.step = (uint64_t)step;
            EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(mine),
                                             m.out(out[chunked][step]), count, dt,
                                             ZPP_OP_MEAN, r, nullptr, nullptr),
                      ZPP_OK)
                << zpp_comm_get_last_error(g_comm);
          }
          m.back();
        }
        std::string what = "count " + std::to_string(count) + " " +
                           zpp_dtype_name(dt) + " intra " + std::to_string(k.intra) +
                           " inter " + std::to_string(k.inter) + " residual " +
                           std::to_string(k.residual_bits);
        for (int step = 0; step < 2; step++)
          EXPECT_TRUE(out[1][step] == out[0][step]) << what << ": result of step " << step;
        EXPECT_TRUE(res[1] == res[0]) << what << ": residual";
      }
}

// INT8 residual: the same error feedback (the average of K steps on a
// fixed gradient approaches the exact sum) in about a quarter of the
// memory: (W + M) E8(count) bytes instead of 4 (W + M) count.
TEST(Qgz, Int8ResidualKeepsErrorFeedbackInAQuarterOfTheMemory) {
  const size_t count = 1000;
  const int steps = 8;
  size_t n = g_size * count;
  zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
  cfg.block_size = 128;
  cfg.residual_bits = 8;
  size_t bytes = 0, rc = 0;
  EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &bytes), ZPP_OK);
  EXPECT_EQ(zpp_qgz_residual_count(g_comm, count, &rc), ZPP_OK);
  size_t levels = rc / count;  // W + M
  EXPECT_EQ(bytes, levels * enc_size(qcfg(8, 128), count));
  EXPECT_LT(bytes * 3, rc * sizeof(float));
  auto x = gen(g_rank, n, ZPP_FLOAT32, 23);
  std::vector<uint8_t> residual(bytes, 0);
  std::vector<float> out(count);
  std::vector<double> avg(count, 0.0);
  Mem m;  // the residual stays in the suite's memory space across the steps
  for (int k = 0; k < steps; k++) {
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count, ZPP_FLOAT32,
                                     ZPP_OP_SUM, m.out(residual), nullptr, nullptr),
              ZPP_OK) << zpp_comm_get_last_error(g_comm);
    m.back();
    for (size_t i = 0; i < count; i++) avg[i] += out[i] / (double)steps;
  }
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr), ZPP_OK);
  m.back();
  std::vector<std::vector<float>> all(g_size);
  for (int r = 0; r < g_size; r++) all[r] = gen(r, n, ZPP_FLOAT32, 23);
  double e_ef = sq_err_vs_exact_sum(avg, all, count);
  double e_plain = sq_err_vs_exact_sum(out, all, count);
  if (g_size > 1) {
    EXPECT_LT(e_ef, 0.25 * e_plain) << "INT8 error feedback did not help";
  }
  // the fp32 residual on the same steps: the INT8 one loses only the
  // rounding of the stored error (1/254 of its block's largest), so the
  // two averages are close
  {
    zpp_qgz_config_t c32 = cfg;
    c32.residual_bits = 32;
    size_t rc32 = 0;
    EXPECT_EQ(zpp_qgz_residual_count(g_comm, count, &rc32), ZPP_OK);
    std::vector<float> r32(rc32, 0.0f);
    std::vector<double> avg32(count, 0.0);
    for (int k = 0; k < steps; k++) {
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c32, m.in(x), m.out(out), count, ZPP_FLOAT32,
                                       ZPP_OP_SUM, m.out(r32), nullptr, nullptr), ZPP_OK);
      m.back();
      for (size_t i = 0; i < count; i++) avg32[i] += out[i] / (double)steps;
    }
    double e32 = sq_err_vs_exact_sum(avg32, all, count);
    if (g_rank == 0)
      std::printf("[ info ] squared error of the %d-step average: no feedback %.4g, INT8 "
                  "residual %.4g, fp32 residual %.4g\n", steps, e_plain, e_ef, e32);
    if (g_size > 1) {
      EXPECT_LT(e_ef, 2 * e32 + 1e-12) << "the INT8 residual loses much more than its rounding";
    }
  }
  cfg.residual_bits = 16;
  EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &bytes), ZPP_ERR_INVALID_ARGUMENT);
  cfg.residual_bits = 32;
  cfg.hadamard = 48;
  EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &bytes), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("hadamard 48"), std::string::npos);
}

// Error feedback, with the Hadamard rotation and LoCo's moving average and
// reset, against a float64 reference of the rule of docs/collectives.md,
// one step at a time.  With e the stored residual before a step (0 on a
// reset step), e' after it and beta the moving average (0: plain error
// feedback), every encode of x = (rotated) input + e stores
//   e' = beta e + (1 - beta) (x - q),  q the decoded value sent,
// so q = x - (e' - beta e) / (1 - beta) is known from the residuals alone.
// Every rank gathers every rank's residual before and after the step and
// rebuilds, in float64, what its slice received:
//   stage 1  q1_r = R g_r + e1_r - (e1'_r - beta e1_r) / (1 - beta)
//            (segment `me` of every rank r; R the rotation, in float64),
//   stage 2  (two levels) on the rank of node n with my local rank:
//            q2_n = sum_{r on n} q1_r + e2_n - (e2'_n - beta e2_n) / (1 - beta)
//            (its segment W + my node), and
//   output   R (sum_n q2_n), or R (sum_r q1_r) on one level.
// The quantization errors cancel exactly in this identity, so what is
// left is fp32 rounding, bounded term by term (first order, times
// 1 + 2^-10; u = 2^-24): the rotation of g (docs/format.md's bound), u |x|
// for x, 2u |d| for d = x - q and omega = fl(1 - beta), and
// u (beta |e| + |d| + |e'|) / (1 - beta) for the update's three roundings;
// each fp32 sum of k terms adds k u times the sum of their magnitudes;
// the inverse rotation spreads an error over its group (c times the sum)
// and adds its own rounding plus 2^-22 of the value (fl(1/sqrt g)^2 g
// misses 1 by up to 2^-23).  A 4-bit quantization error (about 1/14 of a
// block's largest value) is some 10^5 times that: a residual stored wrong
// (a wrong beta, a reset at the wrong step, the stage-2 error dropped, the
// error of the unrotated value) fails it.
struct EfCase {
  size_t g;       // Hadamard group, 0: off
  float beta;     // LoCo moving average, 0: plain error feedback
  uint32_t reset; // LoCo reset period, 0: never
};

TEST(Qgz, ErrorFeedbackWithHadamardAndLoCoMatchesFloat64Identity) {
  const size_t count = 1000;
  const int steps = 7;
  const double u = std::ldexp(1.0, -24);
  // block 2048: longer than the fused host loop's tile (elementwise.h,
  // ZPP_EW_EF_TILE), so the residual takes the unfused passes
  struct BlockEf { size_t block; EfCase ef; };
  const BlockEf efs[] = {{128, {32, 0.0f, 0}}, {128, {32, 0.8f, 3}}, {128, {0, 0.8f, 3}},
                         {128, {8, 0.5f, 2}},  {2048, {0, 0.0f, 0}}, {2048, {8, 0.8f, 3}}};
  bool two = g_uniform && g_nnodes > 1;
  int me = g_rank, my_node = 0, my_local = 0;
  zpp_comm_node_of(g_comm, me, &my_node);
  zpp_comm_local_rank_of(g_comm, me, &my_local);
  // ranks by node, in local-rank order (stage-1 order) and node order
  std::vector<std::vector<int>> node_ranks(g_nnodes);
  for (int r = 0; r < g_size; r++) {
    int nd = 0;
    zpp_comm_node_of(g_comm, r, &nd);
    node_ranks[nd].push_back(r);  // world order = local-rank order
  }
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  ASSERT_EQ(zpp_comm_get_bootstrap(g_comm, &bs), ZPP_OK);
  size_t rc = 0;
  ASSERT_EQ(zpp_qgz_residual_count(g_comm, count, &rc), ZPP_OK);
  auto gather = [&](const std::vector<float> &mine) {
    std::vector<float> all(rc * g_size);
    EXPECT_EQ(bs.allgather(bs.ctx, mine.data(), rc * sizeof(float), all.data(), 60.0), ZPP_OK);
    return all;
  };
  for (const BlockEf &be : efs) {
    const EfCase &ec = be.ef;
    const size_t block = be.block;
    zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
    cfg.block_size = block;
    cfg.hadamard = ec.g;
    cfg.residual_beta = ec.beta;
    cfg.residual_reset = ec.reset;
    const double beta = ec.beta, om = 1.0 - beta;
    size_t g = ec.g ? ec.g : 1, whole = ec.g ? count / g * g : 0;
    int k = 0;
    while (((size_t)1 << k) < g) k++;
    const double c = 1.0 / std::sqrt((double)g);
    std::vector<float> residual(rc, 0.0f);
    double worst = 0;
    int bad = 0;
    for (int step = 0; step < steps; step++) {
      cfg.step = (uint64_t)step;
      bool reset = ec.reset && step > 0 && step % ec.reset == 0;
      auto before = gather(residual);
      auto x = gen(g_rank, (size_t)g_size * count, ZPP_FLOAT32, 40 + step);
      std::vector<float> out(count);
      {
        Mem m;
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count, ZPP_FLOAT32,
                                         ZPP_OP_SUM, m.out(residual), nullptr, nullptr),
                  ZPP_OK) << zpp_comm_get_last_error(g_comm);
        m.back();
      }
      auto after = gather(residual);
      // q = x - (e' - beta e) / (1 - beta) and its rounding bound
      auto decoded = [&](int r, size_t seg, size_t i, double xin, double xin_err, double *err) {
        double eo = reset ? 0.0 : before[(size_t)r * rc + seg * count + i];
        double en = after[(size_t)r * rc + seg * count + i];
        double xv = xin + eo, d = (en - beta * eo) / om;
        *err = xin_err + u * (std::fabs(xv) + xin_err) + 2 * u * std::fabs(d) +
               u * (beta * std::fabs(eo) + std::fabs(d) + std::fabs(en)) / om;
        return xv - d;
      };
      // stage 1: R g_r (float64) with the bound of the fp32 rotation
      std::vector<std::vector<double>> y(g_size, std::vector<double>(count)),
          rho(g_size, std::vector<double>(count, 0.0));
      for (int r = 0; r < g_size; r++) {
        auto xr = gen(r, (size_t)g_size * count, ZPP_FLOAT32, 40 + step);
        const float *xs = &xr[(size_t)me * count];
        for (size_t i = 0; i < count; i++) y[r][i] = xs[i];
        for (size_t b0 = 0; b0 < whole; b0 += g) {
          std::vector<double> xd(xs + b0, xs + b0 + g);
          hadamard64(xd.data(), g, &y[r][b0]);
          double l1 = 0;
          for (size_t j = 0; j < g; j++) l1 += std::fabs(xd[j]);
          for (size_t j = 0; j < g; j++)
            rho[r][b0 + j] = k * u * (1 + std::ldexp(1.0, -20)) * l1 * c +
                             2 * u * std::fabs(y[r][b0 + j]) + std::ldexp(1.0, -149);
        }
      }
      std::vector<double> z(count, 0.0), zerr(count, 0.0);
      for (size_t i = 0; i < count; i++) {
        std::vector<double> q1(g_size), e1(g_size);
        for (int r = 0; r < g_size; r++) q1[r] = decoded(r, (size_t)me, i, y[r][i], rho[r][i], &e1[r]);
        if (!two) {  // one level: sum over the world in member order
          double mag = 0;
          for (int r = 0; r < g_size; r++) {
            z[i] += q1[r];
            zerr[i] += e1[r];
            mag += std::fabs(q1[r]);
          }
          zerr[i] += g_size * u * mag;
          continue;
        }
        double mag2 = 0;
        for (int n = 0; n < g_nnodes; n++) {
          double acc = 0, accerr = 0, mag = 0;
          for (int r : node_ranks[n]) {
            acc += q1[r];
            accerr += e1[r];
            mag += std::fabs(q1[r]);
          }
          accerr += (double)node_ranks[n].size() * u * mag;
          double e2;
          double q2 = decoded(node_ranks[n][my_local], (size_t)g_size + my_node, i, acc, accerr,
                              &e2);
          z[i] += q2;
          zerr[i] += e2;
          mag2 += std::fabs(q2);
        }
        zerr[i] += g_nnodes * u * mag2;
      }
      // back from the rotated domain
      std::vector<double> want(z), bound(zerr);
      for (size_t b0 = 0; b0 < whole; b0 += g) {
        hadamard64(&z[b0], g, &want[b0]);
        double se = 0, sz = 0;
        for (size_t j = 0; j < g; j++) {
          se += zerr[b0 + j];
          sz += std::fabs(z[b0 + j]) + zerr[b0 + j];
        }
        for (size_t j = 0; j < g; j++)
          bound[b0 + j] = c * se + k * u * (1 + std::ldexp(1.0, -20)) * c * sz +
                          std::ldexp(1.0, -22) * std::fabs(want[b0 + j]) + std::ldexp(1.0, -149);
      }
      for (size_t i = 0; i < count; i++) {
        double b = bound[i] * (1 + std::ldexp(1.0, -10)) + 1e-30, err = std::fabs(out[i] - want[i]);
        worst = std::max(worst, err / b);
        if (!(err <= b) && bad++ < 3)
          ADD_FAILURE() << "block " << block << " g " << ec.g << " beta " << ec.beta
                        << " reset " << ec.reset << " step " << step << (reset ? " (reset)" : "") << " element " << i
                        << ": " << out[i] << " vs float64 " << want[i] << " bound " << b;
      }
    }
    if (g_rank == 0)
      std::printf("[ info ] error feedback block %zu g %zu beta %.2f reset %u: largest error / "
                  "bound %.3f\n",
                  block, ec.g, ec.beta, ec.reset, worst);
  }
}

// LoCo's moving average on the INT8 residual: the same steps as on the
// fp32 one (whose rule the float64 identity above checks), a fixed
// gradient for 8 steps with a reset at step 4; the INT8 residual adds only
// the rounding of the stored value (1/254 of its block's largest), so the
// squared error of the 8-step average stays within 2x the fp32 one's, and
// both beat no feedback.
TEST(Qgz, Int8ResidualWithLoCoTracksTheFp32One) {
  const size_t count = 1000;
  const int steps = 8;
  size_t n = g_size * count;
  auto x = gen(g_rank, n, ZPP_FLOAT32, 26);
  std::vector<std::vector<float>> all(g_size);
  for (int r = 0; r < g_size; r++) all[r] = gen(r, n, ZPP_FLOAT32, 26);
  auto sq_err_of_average = [&](int bits, bool ef) {
    zpp_qgz_config_t cfg = ZPP_QGZ_CONFIG_INIT;
    cfg.block_size = 128;
    cfg.residual_bits = bits;
    cfg.residual_beta = ZPP_QGZ_LOCO_BETA;
    cfg.residual_reset = 4;
    size_t bytes = 0;
    EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &cfg, count, &bytes), ZPP_OK);
    std::vector<uint8_t> residual(bytes, 0);
    std::vector<float> out(count);
    std::vector<double> avg(count, 0.0);
    for (int k = 0; k < steps; k++) {
      cfg.step = (uint64_t)k;
      Mem m;
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cfg, m.in(x), m.out(out), count, ZPP_FLOAT32,
                                       ZPP_OP_SUM, ef ? m.out(residual) : nullptr, nullptr,
                                       nullptr), ZPP_OK) << zpp_comm_get_last_error(g_comm);
      m.back();
      for (size_t i = 0; i < count; i++) avg[i] += out[i] / (double)steps;
    }
    return sq_err_vs_exact_sum(avg, all, count);
  };
  double e8 = sq_err_of_average(8, true), e32 = sq_err_of_average(32, true),
         e0 = sq_err_of_average(32, false);
  if (g_rank == 0)
    std::printf("[ info ] LoCo (beta 0.8, reset 4), squared error of the 8-step average: "
                "none %.4g, fp32 residual %.4g, INT8 residual %.4g\n", e0, e32, e8);
  if (g_size > 1) {
    EXPECT_LT(e32, e0) << "LoCo's feedback did not help";
    EXPECT_LT(e8, 2 * e32 + 1e-12) << "the INT8 residual loses much more than its rounding";
  }
}

// A qgZ config from zpp 0.1 (fields up to `mode`) still works, with the
// defaults for the rest: the same bytes as the current struct.
TEST(Qgz, OlderSmallerConfigStructStillWorks) {
  struct v1 {
    size_t struct_size;
    int intra_bits, inter_bits;
    size_t block_size;
    zpp_quant_mode_t mode;
  } old = {sizeof(v1), 8, 4, 128, ZPP_QUANT_SYMMETRIC};
  zpp_qgz_config_t cur = ZPP_QGZ_CONFIG_INIT;
  cur.intra_bits = 8;
  cur.block_size = 128;
  const size_t count = 777;
  auto x = gen(g_rank, g_size * count, ZPP_FLOAT32, 24);
  std::vector<float> a(count), b(count);
  Mem m;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, reinterpret_cast<const zpp_qgz_config_t *>(&old),
                                   m.in(x), m.out(a), count, ZPP_FLOAT32, ZPP_OP_MEAN, nullptr,
                                   nullptr, nullptr), ZPP_OK) << zpp_comm_get_last_error(g_comm);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cur, m.in(x), m.out(b), count, ZPP_FLOAT32,
                                   ZPP_OP_MEAN, nullptr, nullptr, nullptr), ZPP_OK);
  m.back();
  EXPECT_EQ(a, b);
  // a 0.2 struct (up to residual_bits): residual_beta, which sits in its
  // tail padding, and the later fields are not read (garbage there, an
  // invalid beta, is ignored): plain error feedback, as the current struct
  // with the defaults
  zpp_qgz_config_t v2 = cur, c3 = cur;
  v2.struct_size = (offsetof(zpp_qgz_config_t, residual_bits) + sizeof(int) + 7) / 8 * 8;
  v2.residual_beta = 7.0f;
  v2.residual_reset = 1;
  v2.step = 5;
  size_t rc = 0;
  EXPECT_EQ(zpp_qgz_residual_count(g_comm, count, &rc), ZPP_OK);
  std::vector<float> r2(rc, 0.0f), r3(rc, 0.0f);
  for (int step = 0; step < 2; step++) {
    Mem m2;
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &v2, m2.in(x), m2.out(a), count, ZPP_FLOAT32,
                                     ZPP_OP_MEAN, m2.out(r2), nullptr, nullptr), ZPP_OK)
        << zpp_comm_get_last_error(g_comm);
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c3, m2.in(x), m2.out(b), count, ZPP_FLOAT32,
                                     ZPP_OP_MEAN, m2.out(r3), nullptr, nullptr), ZPP_OK);
    m2.back();
    EXPECT_EQ(a, b) << "step " << step;
    EXPECT_EQ(r2, r3) << "step " << step;
  }
  c3.residual_beta = 1.0f;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c3, x.data(), b.data(), count, ZPP_FLOAT32,
                                   ZPP_OP_MEAN, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(zpp_get_last_error()),
            "zpp_qgz_reduce_scatter: cfg->residual_beta 1: must be in [0, 1) (0: plain error "
            "feedback; LoCo: 0.8)");
}

// ---- qWD ---------------------------------------------------------------------------------

// 100 optimizer steps of a random walk on fp32 master weights; after each,
// qWD brings every rank's reconstruction up to date.  Checked each step:
//   - the reconstruction is bitwise identical on all ranks;
//   - for every element, with r the previous reconstruction (fp32 of dt),
//     d = fl(t - r) the difference sent, D its block's range and s its
//     stored scale (<= D / qmax (1 + 2^-23)):
//       |recon - t| <= s (1/2 + 2^-12) + 2^-22 (|d| + D) + 2^-149   (codec)
//                      + 2^-24 |t - r|                               (fl of d)
//                      + 2^-24 |recon|                               (fp32 add)
//                      + half an ulp of dt at |recon|                (store)
//     a bound of this step alone, so the error does not accumulate.  That
//     bound is the real check: with differences taken against the previous
//     target instead of the reconstruction, every step would add one more
//     quantization error; those are independent and zero-mean, so the
//     error would grow like a random walk, about sqrt(steps) times one
//     step's (linearly only if the errors were biased), and leave the
//     one-step bound within a few steps.  As a second look, the largest
//     error over the last 50 steps stays within 1.25x that of the first 50
//     (measured: within 1%); a sqrt(steps) drift makes it about
//     sqrt(100 / 50) = 1.41x.
TEST(Qwd, ReconstructionIsIdenticalOnAllRanksAndItsErrorDoesNotAccumulate) {
  for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16})
    for (int bits : {4, 8}) {
      const size_t count = 3001, block = 512;
      const int steps = 100;
      size_t n = g_size * count, ds = zpp_dtype_size(dt);
      zpp_quant_config_t q = qcfg(bits, block);
      std::vector<std::vector<float>> truth(g_size);
      for (int r = 0; r < g_size; r++) truth[r] = gen(r, count, ZPP_FLOAT32, 30);
      std::vector<uint8_t> recon(n * ds);  // initial: the truth in dt, everywhere
      for (int r = 0; r < g_size; r++)
        for (size_t i = 0; i < count; i++)
          zpp_qm_store(recon.data(), r * count + i, (int)dt, truth[r][i]);
      double qmax = (1 << (bits - 1)) - 1;
      double worst_early = 0, worst_late = 0;
      int bad = 0;
      std::mt19937_64 walk(seed() + 31);
      std::normal_distribution<float> step_nd(0.0f, 1e-2f);
      for (int s = 0; s < steps; s++) {
        for (int r = 0; r < g_size; r++)  // every rank moves every truth alike
          for (size_t i = 0; i < count; i++) truth[r][i] += step_nd(walk);
        std::vector<uint8_t> prev = recon;
        {
          Mem m;  // this step's truth and reconstruction, in the suite's memory space
          EXPECT_EQ(zpp_qwd_allgather(g_comm, &q, m.in(truth[g_rank]), m.out(recon), count, dt,
                                      nullptr, nullptr),
                    ZPP_OK) << zpp_comm_get_last_error(g_comm);
          m.back();
        }
        EXPECT_TRUE(same_on_all_ranks(fnv(recon.data(), recon.size())))
            << "step " << s << ": reconstructions differ between ranks";
        for (int r = 0; r < g_size; r++)
          for (size_t b0 = 0; b0 < count; b0 += block) {
            size_t len = std::min(block, count - b0);
            double D = 0;
            std::vector<double> d(len);
            for (size_t i = 0; i < len; i++) {
              float rv = zpp_qm_load(prev.data(), r * count + b0 + i, (int)dt);
              d[i] = (double)(truth[r][b0 + i] - rv);  // fl(t - r), as sent
              D = std::max(D, std::fabs(d[i]));
            }
            double sc = D / qmax * (1 + std::ldexp(1.0, -23));
            for (size_t i = 0; i < len; i++) {
              double t = truth[r][b0 + i];
              double got = zpp_qm_load(recon.data(), r * count + b0 + i, (int)dt);
              double ulp = dt == ZPP_FLOAT32 ? 0 : std::fabs(got) * std::ldexp(1.0, -8) + 1e-38;
              double bound = sc * (0.5 + std::ldexp(1.0, -12)) +
                             std::ldexp(1.0, -22) * (std::fabs(d[i]) + D) +
                             std::ldexp(1.0, -149) + std::ldexp(1.0, -24) * std::fabs(d[i]) +
                             std::ldexp(1.0, -24) * std::fabs(got) + ulp;
              double err = std::fabs(got - t);
              (s < steps / 2 ? worst_early : worst_late) =
                  std::max(s < steps / 2 ? worst_early : worst_late, err);
              if (!(err <= bound) && bad++ < 3)
                ADD_FAILURE() << zpp_dtype_name(dt) << " int" << bits << " step " << s
                              << " rank " << r << " element " << b0 + i << ": error " << err
                              << " > bound " << bound;
            }
          }
      }
      EXPECT_LE(worst_late, 1.25 * worst_early + 1e-30)
          << "the error grows with the steps: " << worst_early << " then " << worst_late;
      if (g_rank == 0)
        std::printf("[ info ] qWD %s int%d: largest error steps 0-49 %.3g, 50-99 %.3g\n",
                    zpp_dtype_name(dt), bits, worst_early, worst_late);
    }
}

// Every bad argument of zpp_qwd_allgather is named as zpp_coll.h names it
// (target and recon, not the sendbuf/recvbuf of the other collectives),
// in the exact text, on the thread and on the communicator.
TEST(Qwd, BadArgumentsAreNamed) {
  float t[4] = {1, 2, 3, 4};
  std::vector<float> rec(4 * g_size);
  zpp_quant_config_t q = qcfg(4, 256);
  auto expect = [](zpp_status_t got, zpp_status_t want, const std::string &text) {
    EXPECT_EQ(got, want) << text;
    EXPECT_EQ(std::string(zpp_get_last_error()), text);
    EXPECT_EQ(std::string(zpp_comm_get_last_error(g_comm)), text);
  };
  expect(zpp_qwd_allgather(g_comm, nullptr, t, rec.data(), 4, ZPP_FLOAT32, nullptr, nullptr),
         ZPP_ERR_NULL_POINTER, "zpp_qwd_allgather: quant is NULL");
  q.bits = 3;
  expect(zpp_qwd_allgather(g_comm, &q, t, rec.data(), 4, ZPP_FLOAT32, nullptr, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "zpp_qwd_allgather: quant->bits 3: must be 8 or 4");
  q.bits = 4;
  expect(zpp_qwd_allgather(g_comm, &q, nullptr, rec.data(), 4, ZPP_FLOAT32, nullptr, nullptr),
         ZPP_ERR_NULL_POINTER, "zpp_qwd_allgather: target is NULL (count 4)");
  expect(zpp_qwd_allgather(g_comm, &q, t, nullptr, 4, ZPP_FLOAT32, nullptr, nullptr),
         ZPP_ERR_NULL_POINTER, "zpp_qwd_allgather: recon is NULL (count 4)");
  expect(zpp_qwd_allgather(g_comm, &q, t, rec.data(), 4, (zpp_dtype_t)7, nullptr, nullptr),
         ZPP_ERR_INVALID_ARGUMENT,
         "zpp_qwd_allgather: dtype 7: must be ZPP_FLOAT32, ZPP_FLOAT16 or ZPP_BFLOAT16");
}

// ---- asynchrony -----------------------------------------------------------------------------

TEST(Async, StartedCollectivesCompleteInOrderWithTheSameResults) {
  const size_t count = 2048;
  zpp_quant_config_t q = qcfg(8, 256);
  zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  auto w = gen(g_rank, count, ZPP_FLOAT32, 12);
  auto grad = gen(g_rank, g_size * count, ZPP_FLOAT32, 13);
  std::vector<float> w1(g_size * count), w2(g_size * count), g1(count), g2(count);
  zpp_request_t r1 = nullptr, r2 = nullptr;
  Mem m;
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, m.in(w), m.out(w1), count, ZPP_FLOAT32,
                              nullptr, &r1),
            ZPP_OK);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, m.in(grad), m.out(g1), count,
                                   ZPP_FLOAT32, ZPP_OP_SUM, nullptr, nullptr, &r2),
            ZPP_OK);
  int done = -1;
  EXPECT_EQ(zpp_request_test(r2, &done), ZPP_OK);
  EXPECT_TRUE(done == 0 || done == 1);
  int level = MPI_THREAD_MULTIPLE;
  if (zpp_test::UsesMpi()) MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    // no progress thread allowed: started collectives ran to completion
    EXPECT_EQ(done, 1) << "MPI thread level " << level;
  }
  EXPECT_EQ(zpp_request_wait(r2), ZPP_OK);
  EXPECT_EQ(zpp_request_wait(r1), ZPP_OK);
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, m.in(w), m.out(w2), count, ZPP_FLOAT32,
                              nullptr, nullptr),
            ZPP_OK);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, m.in(grad), m.out(g2), count,
                                   ZPP_FLOAT32, ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_OK);
  m.back();
  EXPECT_EQ(std::memcmp(w1.data(), w2.data(), w1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * 4), 0);
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(BadInput, NullBuffersAndBadConfigsGiveClearErrors) {
  float hx[8] = {0}, hy[64] = {0};
  Mem m;
  float *x = m.out(hx), *y = m.out(hy);  // in the suite's memory space
  zpp_quant_config_t q = qcfg(8, 4);
  zpp_quant_config_t q3 = qcfg(3, 4);
  auto has = [](const char *needle) {
    return std::string(zpp_comm_get_last_error(g_comm)).find(needle) != std::string::npos;
  };
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, nullptr, y, 8, ZPP_FLOAT32, nullptr, nullptr),
            ZPP_ERR_NULL_POINTER);
  EXPECT_TRUE(has("sendbuf")) << zpp_comm_get_last_error(g_comm);
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q3, x, y, 8, ZPP_FLOAT32, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has("bits 3")) << zpp_comm_get_last_error(g_comm);
  EXPECT_EQ(zpp_allgather(g_comm, x, nullptr, 8, ZPP_FLOAT32, nullptr, nullptr),
            ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_reduce_scatter(g_comm, x, y, 1, ZPP_FLOAT32, (zpp_redop_t)5, nullptr,
                               nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has("op 5"));
  zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  g.inter_bits = 2;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, x, y, 1, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has("inter_bits 2"));
  EXPECT_EQ(zpp_qwz_allgather(nullptr, &q, x, y, 8, ZPP_FLOAT32, nullptr, nullptr),
            ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_allgather(g_comm, x, y, 1, (zpp_dtype_t)9, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_allgather(g_comm, x, y, SIZE_MAX / 2, ZPP_FLOAT32, nullptr, nullptr),
            ZPP_ERR_OVERFLOW);
  // nothing was started: a valid collective still works afterwards
  EXPECT_EQ(zpp_allgather(g_comm, x, y, 1, ZPP_FLOAT32, nullptr, nullptr), ZPP_OK);
}

// Bytes are for the plain all-gather only: every call that computes on the
// data refuses ZPP_UINT8 and says why, and nothing is started.
TEST(BadInput, ByteDtypeIsRefusedByEveryComputingCall) {
  float hx[8] = {0}, hy[64] = {0};
  Mem m;
  float *x = m.out(hx), *y = m.out(hy);
  auto has_u8 = [](const char *msg) { return std::string(msg).find("ZPP_UINT8") != std::string::npos; };
  zpp_quant_config_t q = qcfg(8, 4);
  zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  EXPECT_EQ(zpp_reduce_scatter(g_comm, x, y, 1, ZPP_UINT8, ZPP_OP_SUM, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_comm_get_last_error(g_comm))) << zpp_comm_get_last_error(g_comm);
  EXPECT_EQ(zpp_qwz_allgather(g_comm, &q, x, y, 1, ZPP_UINT8, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_comm_get_last_error(g_comm))) << zpp_comm_get_last_error(g_comm);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &g, x, y, 1, ZPP_UINT8, ZPP_OP_SUM, nullptr,
                                   nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_comm_get_last_error(g_comm))) << zpp_comm_get_last_error(g_comm);
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  hc.quantized = 0;
  zpp_hpz_t h = nullptr;
  EXPECT_EQ(zpp_hpz_create(g_comm, &hc, 8, ZPP_UINT8, &h), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h, nullptr);
  EXPECT_TRUE(has_u8(zpp_comm_get_last_error(g_comm))) << zpp_comm_get_last_error(g_comm);
  uint8_t enc[256];
  EXPECT_EQ(zpp_quant_encode(&q, ZPP_UINT8, hx, 8, enc, sizeof enc), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_get_last_error())) << zpp_get_last_error();
  EXPECT_EQ(zpp_quant_decode(&q, enc, sizeof enc, 8, ZPP_UINT8, hy), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_get_last_error())) << zpp_get_last_error();
  EXPECT_EQ(zpp_quant_decode_device(&q, enc, sizeof enc, 8, ZPP_UINT8, hy, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_get_last_error())) << zpp_get_last_error();
  EXPECT_EQ(zpp_hadamard(8, ZPP_UINT8, hx, 8, hy), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_get_last_error())) << zpp_get_last_error();
  EXPECT_EQ(zpp_quant_encode_device(&q, ZPP_UINT8, hx, 8, enc, sizeof enc, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_get_last_error())) << zpp_get_last_error();
  EXPECT_EQ(zpp_qwd_allgather(g_comm, &q, hx, y, 1, ZPP_UINT8, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(has_u8(zpp_comm_get_last_error(g_comm))) << zpp_comm_get_last_error(g_comm);
  zpp_pgroup_config_t pc = ZPP_PGROUP_CONFIG_INIT;
  pc.dtype = ZPP_UINT8;
  size_t sizes[1] = {64};
  zpp_pgroup_t pg = nullptr;
  EXPECT_EQ(zpp_pgroup_create(g_comm, &pc, sizes, 1, &pg), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pg, nullptr);
  EXPECT_TRUE(has_u8(zpp_get_last_error())) << zpp_get_last_error();
  EXPECT_EQ(std::string(zpp_dtype_name(ZPP_UINT8)), "u8");
  zpp_dtype_t d = ZPP_FLOAT32;
  EXPECT_EQ(zpp_dtype_parse("uint8", &d), ZPP_OK);
  EXPECT_EQ(d, ZPP_UINT8);
  // nothing was started: a valid collective still works afterwards
  EXPECT_EQ(zpp_allgather(g_comm, x, y, 1, ZPP_FLOAT32, nullptr, nullptr), ZPP_OK);
}

TEST(BadInput, LengthsThatDifferAcrossRanksAreDetectedWithZppCheck) {
  const char *check = std::getenv("ZPP_CHECK");
  bool on = check && std::atoi(check) == 1;
  if (!on || g_size < 2) {
    // gtest_skip is per rank; all ranks take the same branch here
    GTEST_SKIP() << "needs ZPP_CHECK=1 and 2+ ranks (ctest runs it as coll_check)";
  }
  std::vector<float> hx(16, 1.0f), hy(16 * g_size, 0.0f);
  Mem m;
  float *x = m.out(hx), *y = m.out(hy);  // in the suite's memory space
  size_t count = g_rank == g_size - 1 ? 9 : 8;  // the last rank disagrees
  zpp_quant_config_t q = qcfg(8, 4);
  zpp_status_t st = zpp_qwz_allgather(g_comm, &q, x, y, count,
                                      ZPP_FLOAT32, nullptr, nullptr);
  EXPECT_EQ(st, ZPP_ERR_MISMATCH);
  EXPECT_NE(std::string(zpp_comm_get_last_error(g_comm)).find("count"), std::string::npos)
      << zpp_comm_get_last_error(g_comm);
  zpp_qgz_config_t g = ZPP_QGZ_CONFIG_INIT;
  st = zpp_qgz_reduce_scatter(g_comm, &g, y, x, count, ZPP_FLOAT32,
                              ZPP_OP_SUM, nullptr, nullptr, nullptr);
  EXPECT_EQ(st, ZPP_ERR_MISMATCH);
  // One rank fails its own checks (NULL buffer): it returns that error, the
  // others ZPP_ERR_MISMATCH naming it, and nobody waits in a collective.
  bool culprit = g_rank == g_size - 1;
  st = zpp_qwz_allgather(g_comm, &q, culprit ? nullptr : x, y, 8,
                         ZPP_FLOAT32, nullptr, nullptr);
  EXPECT_EQ(st, culprit ? ZPP_ERR_NULL_POINTER : ZPP_ERR_MISMATCH)
      << zpp_comm_get_last_error(g_comm);
  if (!culprit) {
    EXPECT_NE(std::string(zpp_comm_get_last_error(g_comm))
                  .find("rank " + std::to_string(g_size - 1) + " failed"),
              std::string::npos)
        << zpp_comm_get_last_error(g_comm);
  }
  // hpZ: only one rank invalidated its copy, so the ranks would take
  // different paths; the plan is compared and everyone fails instead.
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_t h = nullptr;
  EXPECT_EQ(zpp_hpz_create(g_comm, &hc, 8, ZPP_FLOAT32, &h), ZPP_OK);
  EXPECT_EQ(zpp_hpz_forward_gather(h, x, y, nullptr, nullptr), ZPP_OK);
  if (culprit) {
    EXPECT_EQ(zpp_hpz_invalidate(h), ZPP_OK);
  }
  st = zpp_hpz_backward_gather(h, nullptr, y, nullptr, nullptr);
  EXPECT_EQ(st, culprit ? ZPP_ERR_STALE : ZPP_ERR_MISMATCH);
  zpp_hpz_destroy(h);
}

void setup() {
  zpp_test::OpenComm((unsigned long long)seed(), &g_comm, &g_rank, &g_size,
                     &g_nnodes, &g_uniform);
  const char *a = std::getenv("ZPP_ALGO");
  g_hier = !(a && std::string(a) == "flat");
  zpp_algorithm_t al = ZPP_ALGORITHM_DEFAULT;
  zpp_comm_algorithm(g_comm, &al);
  if (al != (g_hier ? ZPP_ALGORITHM_HIER : ZPP_ALGORITHM_FLAT)) {
    std::fprintf(stderr, "rank %d: ZPP_ALGO=%s but the communicator runs %d\n",
                 g_rank, a ? a : "", (int)al);
    std::exit(2);
  }
}

void teardown() { zpp_comm_destroy(g_comm); }

}  // namespace

int main(int argc, char **argv) {
  return zpp_test::RunAllRanks(argc, argv, setup, teardown);
}
