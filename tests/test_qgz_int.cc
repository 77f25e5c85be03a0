// qgZ with compressed-domain sums (zpp_qgz_config_t.sum ZPP_QGZ_SUM_INT)
// under mpirun on emulated layouts (tests/qgz_int.cmake): agreed block
// scales, integer sums, one decode.  Each rank regenerates every rank's
// input from (seed, rank) and checks its slice against a float64 model of
// the algorithm's error: the bound of docs/format.md ("Integer sums").
// Seed: ZPP_TEST_SEED (default 20261129), printed by rank 0.
// With ZPP_TEST_MEMORY=device (tests/test_memory.h) the same tests run on
// device memory against the same model and bounds, and
// QgzInt.DeviceEqualsTheHostPathBitForBit compares the device results
// and residuals with a host-memory communicator's.
//
// Rules for multi-rank tests: never return early before a collective, so
// checks use EXPECT_*.
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_gtest_main.h"

extern "C" {
#include "kernels/quant_math.h"
}

namespace {

zpp_comm_t g_comm = nullptr;
zpp_comm_t g_host = nullptr; // device memory only: the job on host memory
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;
std::vector<int> g_node;  // node of each rank

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

float to_dtype(float v, zpp_dtype_t dt) {
  if (dt == ZPP_FLOAT32) return v;
  if (dt == ZPP_BFLOAT16) return zpp_qm_bf16_to_f32(zpp_qm_f32_to_bf16(v));
  return zpp_qm_f16_to_f32(zpp_qm_f32_to_f16(v));
}

enum Dist { NORMAL, LAPLACE, OUTLIER };
const char *dist_name(Dist d) {
  return d == NORMAL ? "normal" : d == LAPLACE ? "laplace" : "outlier";
}

// n values of rank r for test `tag`, representable in dt.
std::vector<float> gen(int r, size_t n, zpp_dtype_t dt, uint64_t tag, Dist d) {
  std::mt19937_64 rng(seed() * 7919ull + tag * 104729ull + (uint64_t)r);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::exponential_distribution<float> ed(1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto &v : x) {
    if (d == NORMAL) v = nd(rng);
    else if (d == LAPLACE) v = (ud(rng) < 0.5f ? -1.0f : 1.0f) * ed(rng);
    else v = nd(rng) * (ud(rng) < 0.01f ? 100.0f : 1.0f);
    v = to_dtype(v, dt);
  }
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

bool two_level() { return g_uniform && g_nnodes > 1; }

// The groups whose members agree on a scale and sum together: the ranks
// of each node (two levels), else the world.
std::vector<std::vector<int>> groups() {
  std::vector<std::vector<int>> g;
  if (!two_level()) {
    g.emplace_back();
    for (int r = 0; r < g_size; r++) g[0].push_back(r);
    return g;
  }
  g.resize(g_nnodes);
  for (int r = 0; r < g_size; r++) g[g_node[r]].push_back(r);
  return g;
}

// The float64 model of the error of ZPP_QGZ_SUM_INT without error feedback
// (docs/format.md, "Integer sums"), per element of this rank's slice:
// exact[i] (the sum, or the mean) and bound[i].
struct Model {
  std::vector<double> exact, bound;
};

Model model(const std::vector<std::vector<float>> &all, size_t count, size_t block,
            int bits1, int bits2, bool sr, zpp_redop_t op, zpp_dtype_t dt) {
  Model m;
  m.exact.assign(count, 0.0);
  m.bound.assign(count, 0.0);
  double q1 = (1 << (bits1 - 1)) - 1, q2 = (1 << (bits2 - 1)) - 1;
  double h = sr ? 1.0 : 0.5;  // a code's error, in steps
  auto gs = groups();
  int mynode = two_level() ? g_node[g_rank] : 0;
  std::vector<double> mag(count, 0.0);  // sum of |x| and decoded magnitudes
  for (size_t g = 0; g < gs.size(); g++) {
    for (size_t b0 = 0; b0 < count; b0 += block) {
      size_t b1 = std::min(count, b0 + block);
      // rank r's scale s_r = its absmax / qmax1; the unit u = 2^E < 2
      // max s_r / 255 (or 2^-126); rank r's step m_r u in [s_r, s_r + u)
      // (m_r = ceil(s_r / u): no code clamps): error <= h (s_r + u); the
      // own share, rounded to a unit: u / 2
      double smax = 0, pmax = 0, e1 = 0;
      for (int r : gs[g]) {
        double amax = 0;
        for (size_t i = b0; i < b1; i++)
          amax = std::max(amax, std::fabs((double)all[r][g_rank * count + i]));
        smax = std::max(smax, amax / q1);
        e1 += h * amax / q1;
      }
      double u = 2.0 * smax / 255.0 + std::ldexp(1.0, -126);
      e1 += gs[g].size() * h * u + u / 2;
      for (size_t i = b0; i < b1; i++) {
        double p = 0;
        for (int r : gs[g]) {
          p += all[r][g_rank * count + i];
          mag[i] += std::fabs((double)all[r][g_rank * count + i]);
        }
        pmax = std::max(pmax, std::fabs(p));
        m.exact[i] += p;
        m.bound[i] += e1;
      }
      if ((int)g != mynode) {  // crossed the network: re-quantized
        double scale2 = (pmax + e1) / q2 + u;
        for (size_t i = b0; i < b1; i++) {
          m.bound[i] += h * scale2;
          mag[i] += q2 * scale2;
        }
      }
    }
  }
  double div = op == ZPP_OP_MEAN ? g_size : 1.0;
  for (size_t i = 0; i < count; i++) {
    m.exact[i] /= div;
    // fp32 arithmetic on the way (each sum, the division): a few units of
    // 2^-24 of the magnitudes involved
    m.bound[i] = (m.bound[i] + mag[i] * std::ldexp(1.0, -20)) / div + 1e-30;
    double y = std::fabs(m.exact[i]) + m.bound[i];
    if (dt == ZPP_BFLOAT16) m.bound[i] += y * std::ldexp(1.0, -8);
    if (dt == ZPP_FLOAT16) m.bound[i] += y * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
  }
  return m;
}

zpp_qgz_config_t int_cfg(int intra, int inter, size_t block) {
  zpp_qgz_config_t c = ZPP_QGZ_CONFIG_INIT;
  c.intra_bits = intra;
  c.inter_bits = inter;
  c.block_size = block;
  c.sum = ZPP_QGZ_SUM_INT;
  return c;
}

TEST(QgzInt, MatchesFloat64ModelWithinTheIntegerSumBound) {
  const size_t count = 1000, block = 128;  // a tail block of 104
  const zpp_dtype_t dts[] = {ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16};
  const int widths[][2] = {{4, 4}, {8, 4}, {8, 8}};
  uint64_t tag = 100;
  // every distribution, dtype and width pair; the rounding and the
  // operation alternate (18 calls, each also in place)
  for (Dist d : {NORMAL, LAPLACE, OUTLIER})
    for (zpp_dtype_t dt : dts)
      for (auto w : widths) {
        {
          zpp_redop_t op = (tag & 1) ? ZPP_OP_SUM : ZPP_OP_MEAN;
          int sr = (int)((tag >> 1) & 1);
          tag++;
          std::vector<std::vector<float>> all(g_size);
          for (int r = 0; r < g_size; r++) all[r] = gen(r, g_size * count, dt, tag, d);
          zpp_qgz_config_t c = int_cfg(w[0], w[1], block);
          if (sr) {
            c.rounding = ZPP_ROUND_STOCHASTIC;
            c.seed = tag;
          }
          auto in = pack(all[g_rank], dt);
          std::vector<uint8_t> out(count * zpp_dtype_size(dt));
          {
            zpp_test::Mem mem;
            ASSERT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(in),
                                             mem.out(out), count, dt, op,
                                             nullptr, nullptr, nullptr),
                      ZPP_OK)
                << zpp_comm_get_last_error(g_comm);
            mem.back();
          }
          Model m = model(all, count, block, w[0], w[1], sr, op, dt);
          int bad = 0;
          for (size_t i = 0; i < count && bad < 3; i++) {
            double y = at(out, dt, i);
            if (!(std::fabs(y - m.exact[i]) <= m.bound[i])) {
              bad++;
              ADD_FAILURE() << dist_name(d) << " dtype " << dt << " INT" << w[0] << "/INT"
                            << w[1] << " sr " << sr << " op " << op << " element " << i
                            << ": " << y << " vs " << m.exact[i] << " bound " << m.bound[i];
            }
          }
          // in place: the same bits
          std::vector<uint8_t> inp = in;
          size_t ds = zpp_dtype_size(dt);
          {
            zpp_test::Mem mem;
            uint8_t *d = mem.out(inp);
            ASSERT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, d,
                                             d + g_rank * count * ds, count, dt,
                                             op, nullptr, nullptr, nullptr),
                      ZPP_OK);
            mem.back();
          }
          EXPECT_EQ(0, std::memcmp(inp.data() + g_rank * count * ds, out.data(), count * ds));
        }
      }
}

// The group (members agreeing on a unit) that holds rank o.
std::vector<int> group_of(int o) {
  for (auto &g : groups())
    for (int r : g)
      if (r == o)
        return g;
  return {};
}

// Inputs that isolate one contributor's error at the owner of each slice:
// slice o is nonzero only on its owner o (normal data: it sets the unit
// and enters unquantized, rounded to a unit) and on its partner, the next
// member of o's group (normal data times f); every other rank sends zeros
// for it (exact codes, zero partial sums on the other nodes, which stage 2
// sends exactly).  So the owner's error is its own rounding plus the
// partner's quantization error alone.
std::vector<std::vector<float>> owner_partner_inputs(size_t count, double f,
                                                     uint64_t tag) {
  std::vector<std::vector<float>> all(g_size,
                                      std::vector<float>(g_size * count, 0.0f));
  for (int o = 0; o < g_size; o++) {
    auto g = group_of(o);
    int partner =
        g[(std::find(g.begin(), g.end(), o) - g.begin() + 1) % g.size()];
    auto a = gen(o, count, ZPP_FLOAT32, tag * 1000 + o, NORMAL);
    auto b = gen(partner, count, ZPP_FLOAT32, tag * 1000 + g_size + o, NORMAL);
    for (size_t i = 0; i < count; i++) {
      all[o][o * count + i] = a[i];
      if (partner != o)
        all[partner][o * count + i] = (float)(b[i] * f);
    }
  }
  return all;
}

// Per block of this rank's slice: the unit u = 2^E agreed by the owner and
// its partner (zpp_qm_unit_exp of their absmaxes), and the partner's scale
// s = fl(absmax / qmax1).
struct UnitScale {
  double u, s;
};
std::vector<UnitScale>
unit_and_scale(const std::vector<std::vector<float>> &all, size_t count,
               size_t block, int bits) {
  auto g = group_of(g_rank);
  int partner =
      g[(std::find(g.begin(), g.end(), g_rank) - g.begin() + 1) % g.size()];
  std::vector<UnitScale> v;
  for (size_t b0 = 0; b0 < count; b0 += block) {
    uint32_t ao = 0, ap = 0;
    for (size_t i = b0; i < std::min(count, b0 + block); i++) {
      ao = std::max(ao, zpp_qm_f32_bits(all[g_rank][g_rank * count + i]) &
                            ZPP_QM_ABS_MASK);
      ap = std::max(ap, zpp_qm_f32_bits(all[partner][g_rank * count + i]) &
                            ZPP_QM_ABS_MASK);
    }
    int e = std::max(zpp_qm_unit_exp(ao, bits), zpp_qm_unit_exp(ap, bits));
    v.push_back({std::ldexp(1.0, e),
                 ap ? (double)zpp_qm_sym_params(ap, bits).scale : 0.0});
  }
  return v;
}

// A contributor whose scale is 1% or 10^-4 of the unit setter's: its step
// m u is at least its scale s (m = ceil(s / u)) and below s + u, so none of
// its codes clamps and its error is at most h (s + u) (h = 1/2 nearest, 1
// stochastic); the owner's own share adds at most u / 2 (docs/format.md,
// "Integer sums").  With m = rint(s / u) a step below s clamps the
// partner's largest elements: up to qmax (s - m u), 7 u / 2 for INT4.
TEST(QgzInt, SmallScaleContributorStaysWithinItsOwnStepBound) {
  const size_t count = 2048, block = 256;
  uint64_t tag = 300;
  for (double f : {0.01, 1e-4})
    for (int bits : {4, 8})
      for (int sr : {0, 1}) {
        tag++;
        auto all = owner_partner_inputs(count, f, tag);
        zpp_qgz_config_t c = int_cfg(bits, 4, block);
        if (sr) {
          c.rounding = ZPP_ROUND_STOCHASTIC;
          c.seed = tag;
        }
        std::vector<float> out(count);
        zpp_test::Mem mem;
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(all[g_rank]),
                                         mem.out(out), count, ZPP_FLOAT32,
                                         ZPP_OP_SUM, nullptr, nullptr, nullptr),
                  ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        mem.back();
        auto us = unit_and_scale(all, count, block, bits);
        double h = sr ? 1.0 : 0.5;
        int bad = 0;
        for (size_t i = 0; i < count && bad < 3; i++) {
          double x = 0, mag = 0;
          for (int r = 0; r < g_size; r++) {
            x += all[r][g_rank * count + i];
            mag += std::fabs(all[r][g_rank * count + i]);
          }
          const UnitScale &v = us[i / block];
          // fp32: the step's products and the sum, a few 2^-24 of mag
          double bound = v.u / 2 + h * (v.s + v.u) + mag * std::ldexp(1.0, -20);
          if (!(std::fabs(out[i] - x) <= bound)) {
            bad++;
            ADD_FAILURE() << "f " << f << " INT" << bits << " sr " << sr
                          << " element " << i << ": error " << out[i] - x
                          << " bound " << bound << " (unit " << v.u
                          << ", partner's scale " << v.s << ")";
          }
        }
      }
}

// Stochastic rounding stays unbiased for a small-scale contributor: over K
// calls with distinct seeds the partner's error d = out - rint(x_o / u) u -
// x_p (the owner's rounding is exact and known) has mean 0 (to 2^-24 of a
// step) and |d| < s + u, so T = the mean of sign(x_p) d / (s + u) over K N
// draws (independent: counter-based bits of distinct seeds) has standard
// deviation at most 1 / (2 sqrt(K N)); |T| <= 6 of them, plus 2^-20 for the
// bias and the fp32 roundings.  A clamping step biases every clipped
// element toward 0: T about -0.1 to -0.2.
TEST(QgzInt, StochasticRoundingOfASmallScaleContributorIsUnbiased) {
  const size_t count = 2048, block = 256, calls = 16;
  for (int bits : {4, 8}) {
    auto all = owner_partner_inputs(count, 0.01, 400 + bits);
    auto us = unit_and_scale(all, count, block, bits);
    auto g = group_of(g_rank);
    bool alone = g.size() == 1;
    double t = 0;
    size_t nt = 0;
    for (size_t k = 0; k < calls; k++) {
      zpp_qgz_config_t c = int_cfg(bits, 4, block);
      c.rounding = ZPP_ROUND_STOCHASTIC;
      c.seed = 1000 + k;
      std::vector<float> out(count);
      zpp_test::Mem mem;
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(all[g_rank]),
                                       mem.out(out), count, ZPP_FLOAT32,
                                       ZPP_OP_SUM, nullptr, nullptr, nullptr),
                ZPP_OK);
      mem.back();
      for (size_t i = 0; i < count && !alone; i++) {
        const UnitScale &v = us[i / block];
        double xo = all[g_rank][g_rank * count + i], xp = 0;
        for (int r = 0; r < g_size; r++)
          if (r != g_rank)
            xp += all[r][g_rank * count + i];
        if (xp == 0)
          continue;
        double d = out[i] - std::nearbyint(xo / v.u) * v.u - xp;
        t += (xp > 0 ? d : -d) / (v.s + v.u);
        nt++;
      }
    }
    if (alone)
      continue;
    t /= (double)nt;
    double lim = 6.0 * 0.5 / std::sqrt((double)nt) + std::ldexp(1.0, -20);
    EXPECT_LE(std::fabs(t), lim)
        << "INT" << bits << ": mean signed error " << t
        << " of the partner's step bound over " << nt << " draws";
  }
}

// The error against the FLOAT mode's on normal data: every rank quantizes
// with a step s <= m u < s + u, u < 2 s_max / 255 (ranks of one
// distribution: s_max / s about 1.2, so m u < 1.01 s), the own share is
// exact to a unit and stage 2's divisor is within a unit of FLOAT's
// scale, so the squared errors agree in expectation to about 2% (perf/
// qgz_error_table.py: 0.1411 vs 0.1409 relative, INT4/INT4 2x4).  The
// factor 1.1: each sum of squares over 4096 elements of near-uniform
// rounding errors has a relative spread of about sqrt(0.8 / 4096) = 1.4%
// (fourth moment 1.8 sigma^4 for uniform), and INT's and FLOAT's are
// correlated (same data, same stage-2 structure): 1.1 is over 5 spreads
// above the expected 1.02.
TEST(QgzInt, ErrorIsNearTheFloatSumsOnNormalData) {
  const size_t count = 4096;
  std::vector<std::vector<float>> all(g_size);
  for (int r = 0; r < g_size; r++) all[r] = gen(r, g_size * count, ZPP_FLOAT32, 7, NORMAL);
  std::vector<float> yi(count), yf(count);
  zpp_qgz_config_t c = int_cfg(4, 4, 256);
  zpp_test::Mem mem;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(all[g_rank]), mem.out(yi),
                                   count, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr, nullptr),
            ZPP_OK);
  c.sum = ZPP_QGZ_SUM_FLOAT;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(all[g_rank]), mem.out(yf),
                                   count, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                   nullptr, nullptr),
            ZPP_OK);
  mem.back();
  double ei = 0, ef = 0;
  for (size_t i = 0; i < count; i++) {
    double x = 0;
    for (int r = 0; r < g_size; r++) x += all[r][g_rank * count + i];
    ei += (yi[i] - x) * (yi[i] - x);
    ef += (yf[i] - x) * (yf[i] - x);
  }
  EXPECT_GT(ei, 0.0);
  EXPECT_LT(ei, 1.1 * ef) << "INT " << ei << " FLOAT " << ef;
}

// Error feedback (fp32 and INT8 residuals, plain and LoCo's moving
// average): repeated steps on the same gradient, the mean of the outputs
// approaches the exact sum far closer than without a residual.  Without
// feedback every step makes the same error (nearest rounding of the same
// input): the mean's squared error is one call's, E.  With plain feedback
// the sum of what was sent telescopes (ErrorFeedbackMeanErrorTelescopes-
// LikeFloat): the mean's error is the last residuals over T, errors of one
// encode each, so about E / T^2 in squares (measured 0.9-1.2 / T^2, fp32
// and INT8 storage alike: INT8 adds a 2^-8 relative rounding of each
// residual); with beta 0.5 the residual is a moving average of the errors
// (weights 1/2, 1/4, ...), whose last one is about twice as large in
// squares (measured 1.4-2.0 / T^2); bf16 rounding of each output varies
// with it and averages out.  8 / T^2 leaves a factor 4 over the largest.
TEST(QgzInt, ErrorFeedbackDrivesTheAverageErrorDown) {
  const size_t count = 777, steps = 16;
  std::vector<std::vector<float>> all(g_size);
  for (int r = 0; r < g_size; r++) all[r] = gen(r, g_size * count, ZPP_BFLOAT16, 9, LAPLACE);
  auto in = pack(all[g_rank], ZPP_BFLOAT16);
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < g_size; r++)
    for (size_t i = 0; i < count; i++) exact[i] += all[r][g_rank * count + i] / g_size;
  struct V {
    int bits;
    float beta;
  } vs[] = {{0, 0.0f}, {32, 0.0f}, {8, 0.0f}, {32, 0.5f}};
  double e_plain = 0;
  for (auto v : vs) {
    zpp_qgz_config_t c = int_cfg(4, 4, 64);
    c.rounding = ZPP_ROUND_NEAREST;
    c.residual_bits = v.bits ? v.bits : 32;
    c.residual_beta = v.beta;
    size_t rb = 0;
    EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &c, count, &rb), ZPP_OK);
    std::vector<uint8_t> res(std::max<size_t>(rb, 1), 0);
    std::vector<double> mean(count, 0.0);
    std::vector<uint8_t> out(count * 2);
    zpp_test::Mem mem; // the residual stays in the suite's memory
    uint8_t *dres = v.bits ? mem.out(res) : nullptr;
    for (size_t s = 0; s < steps; s++) {
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(in), mem.out(out),
                                       count, ZPP_BFLOAT16, ZPP_OP_MEAN, dres,
                                       nullptr, nullptr),
                ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      mem.back();
      for (size_t i = 0; i < count; i++) mean[i] += at(out, ZPP_BFLOAT16, i) / steps;
    }
    double e = 0;
    for (size_t i = 0; i < count; i++) e += (mean[i] - exact[i]) * (mean[i] - exact[i]);
    if (v.bits == 0) {
      e_plain = e;
      EXPECT_GT(e_plain, 0.0);
    } else {
      EXPECT_LT(e, 8.0 / (double)(steps * steps) * e_plain)
          << "residual bits " << v.bits << " beta " << v.beta;
    }
  }
}

// Error feedback makes the error of the mean over T steps of a constant
// gradient telescope: every quantizer q (a rank's stage-1 encode of a
// slice, the owner's rounding of its own slice to a unit, a node's stage-2
// re-quantization) sends sum_t q_t = T x - e_T in total (fp32 residuals,
// beta 0; e_0 = 0), so |mean_t y_t - sum x| <= R / T + fp32 terms, R the
// sum of |e_T| over the quantizers that reach the element: every rank's
// stage-1 residual of the slice (the owner's own included) and the stage-2
// residuals of the other nodes' partial sums of it (read from the
// residual buffers after the last step and summed over the ranks).  The
// fp32 terms: each step rounds fl(x + e) and the finish's sums, a few
// 2^-24 of the magnitudes; their mean stays within mag 2^-20.  An own share
// rounded to a unit without feedback keeps an error of up to u / 2 at
// every step, which the mean does not average out.
// Against FLOAT with error feedback: both errors are (the sum of the final
// residuals) / T, and INT's are quantization errors of steps within
// (1 + 2 / 255) of FLOAT's (equal-scale ranks), stage 2's within one unit,
// plus the own share's residual of at most u / 2 (FLOAT's own share is
// exact): their rms agree to a few % (a sampling spread of about
// 1 / sqrt(2 count) = 2% on top); 1.5 leaves room for that, not for a
// constant u / 2 (twice FLOAT's rms or more at these T).
TEST(QgzInt, ErrorFeedbackMeanErrorTelescopesLikeFloat) {
  const size_t count = 512, block = 128, steps = 512;
  std::vector<std::vector<float>> all(g_size);
  for (int r = 0; r < g_size; r++)
    all[r] = gen(r, g_size * count, ZPP_FLOAT32, 21, NORMAL);
  std::vector<double> exact(count, 0.0), mag(count, 0.0);
  for (int r = 0; r < g_size; r++)
    for (size_t i = 0; i < count; i++) {
      exact[i] += all[r][g_rank * count + i];
      mag[i] += std::fabs(all[r][g_rank * count + i]);
    }
  int S = 1, me_local = 0;
  zpp_comm_local_size(g_comm, &S);
  auto local_of = [&](int r) {
    int l = 0;
    for (int q = 0; q < r; q++)
      l += g_node[q] == g_node[r];
    return l;
  };
  me_local = local_of(g_rank);
  for (int bits : {4, 8}) {
    double err[2] = {0, 0};
    for (int sum : {ZPP_QGZ_SUM_FLOAT, ZPP_QGZ_SUM_INT}) {
      zpp_qgz_config_t c = int_cfg(bits, 4, block);
      c.sum = sum;
      size_t rb = 0;
      EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &c, count, &rb), ZPP_OK);
      std::vector<float> res(rb / sizeof(float) + 1, 0.0f);
      std::vector<double> mean(count, 0.0);
      std::vector<float> out(count);
      zpp_test::Mem mem;
      float *dres = mem.out(res);
      for (size_t t = 0; t < steps; t++) {
        EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(all[g_rank]),
                                         mem.out(out), count, ZPP_FLOAT32,
                                         ZPP_OP_SUM, dres, nullptr, nullptr),
                  ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        mem.back();
        for (size_t i = 0; i < count; i++)
          mean[i] += out[i];
      }
      // R per element of every slice, summed over the ranks
      std::vector<double> r(g_size * count, 0.0), rsum(g_size * count, 0.0);
      for (size_t k = 0; k < (size_t)g_size * count; k++)
        r[k] = std::fabs(res[k]);
      if (two_level())
        for (int o = 0; o < g_size; o++)
          if (g_node[o] != g_node[g_rank] && local_of(o) == me_local)
            for (size_t i = 0; i < count; i++)
              r[o * count + i] +=
                  std::fabs(res[((size_t)g_size + g_node[o]) * count + i]);
      MPI_Allreduce(r.data(), rsum.data(), (int)r.size(), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
      int bad = 0;
      for (size_t i = 0; i < count; i++) {
        double e = mean[i] / steps - exact[i];
        double bound =
            rsum[g_rank * count + i] / steps + mag[i] * std::ldexp(1.0, -20);
        err[sum == ZPP_QGZ_SUM_INT] += e * e;
        if (!(std::fabs(e) <= bound) && bad++ < 3)
          ADD_FAILURE() << (sum == ZPP_QGZ_SUM_INT ? "INT" : "FLOAT") << bits
                        << " element " << i << ": error of the mean " << e
                        << " bound " << bound;
      }
    }
    EXPECT_GT(err[0], 0.0);
    EXPECT_LE(std::sqrt(err[1]), 1.5 * std::sqrt(err[0]))
        << "INT" << bits << ": rms error of the mean over " << steps
        << " steps, INT " << std::sqrt(err[1] / count) << " FLOAT "
        << std::sqrt(err[0] / count);
  }
}

// Bytes: stage 1 sends codes and one multiplier byte per block, plus the
// all-gather of the unit exponents (1 byte per block of every slice)
// inside the stage's group;
// stage 2 is the format of docs/format.md, as in the FLOAT mode.
TEST(QgzInt, CountsEqualTheFormulas) {
  const size_t count = 4096 + 100, block = 256;
  size_t nb = (count + block - 1) / block;
  zpp_qgz_config_t c = int_cfg(4, 4, block);
  auto x = gen(g_rank, g_size * count, ZPP_BFLOAT16, 11, NORMAL);
  auto in = pack(x, ZPP_BFLOAT16);
  std::vector<uint8_t> out(count * 2);
  zpp_test::Mem mem;
  zpp_comm_reset_stats(g_comm);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(in), mem.out(out), count,
                                   ZPP_BFLOAT16, ZPP_OP_MEAN, nullptr, nullptr,
                                   nullptr),
            ZPP_OK);
  mem.back();
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  zpp_comm_get_stats(g_comm, &s);
  size_t codes = count / 2 + nb;                               // INT4, even block
  size_t e2 = nb * 4 + (count / block) * (block / 2) + (count % block + 1) / 2;
  size_t agree = (size_t)g_size * nb;                          // one member's exponents
  int S = 1;
  zpp_comm_local_size(g_comm, &S);
  if (two_level()) {
    EXPECT_EQ(s.intra_bytes_sent, (uint64_t)(S - 1) * (g_nnodes * codes + agree));
    EXPECT_EQ(s.inter_bytes_sent, (uint64_t)(g_nnodes - 1) * e2);
    EXPECT_EQ(s.inter_bytes_recv, (uint64_t)(g_nnodes - 1) * e2);
  } else if (g_uniform) {
    EXPECT_EQ(s.intra_bytes_sent, (uint64_t)(g_size - 1) * (codes + agree));
    EXPECT_EQ(s.inter_bytes_sent, 0u);
  } else {
    // the flat stage: codes to every other rank, and the world all-gather
    // of the exponents, whose bytes per rank depend on the all-gather's
    // algorithm on uneven nodes: those of zpp_allgather of the same size
    uint64_t codes_sent = s.intra_bytes_sent + s.inter_bytes_sent;
    std::vector<uint8_t> a(agree), all_a(g_size * agree);
    zpp_comm_reset_stats(g_comm);
    EXPECT_EQ(zpp_allgather(g_comm, mem.in(a), mem.out(all_a), a.size(),
                            ZPP_UINT8, nullptr, nullptr),
              ZPP_OK);
    mem.back();
    zpp_comm_get_stats(g_comm, &s);
    EXPECT_EQ(codes_sent, (uint64_t)(g_size - 1) * codes + s.intra_bytes_sent +
                              s.inter_bytes_sent);
  }
}

TEST(QgzInt, EdgeCasesAndErrors) {
  // count 0: nothing moves
  zpp_qgz_config_t c = int_cfg(4, 4, 256);
  std::vector<float> in(g_size * 8 + 1, 1.0f), out(9, 0.0f);
  zpp_test::Mem mem;
  const float *din = mem.in(in);
  float *dout = mem.out(out);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, dout, 0, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_OK);
  // a constant input: every rank's step m 2^E lies in [s, s + 2^E),
  // 2^E <= 2 s / 255, s = 1 / qmax, so the code qmax decodes within
  // 2 qmax / 255 s = 2 / 255 of 1 (no clamp); stage 2's divisor adds at
  // most a unit
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, dout, 8, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_OK);
  mem.back();
  for (int i = 0; i < 8; i++) EXPECT_NEAR(out[i], (float)g_size, g_size / 128.0) << i;
  // a NaN in one rank's gradient: the owning shard's block is NaN
  std::vector<float> nan_in(g_size * 8, 0.5f);
  if (g_rank == g_size - 1) nan_in[3] = NAN;  // slice 0, element 3
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(nan_in), dout, 8,
                                   ZPP_FLOAT32, ZPP_OP_SUM, nullptr, nullptr,
                                   nullptr),
            ZPP_OK);
  mem.back();
  if (g_rank == 0) {
    EXPECT_TRUE(std::isnan(out[3]));
  }
  // the combinations INT does not have
  c.mode = ZPP_QUANT_ASYMMETRIC;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, dout, 8, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  c = int_cfg(ZPP_QGZ_INTRA_RAW, 4, 256);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, dout, 8, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  c = int_cfg(4, 4, 256);
  c.hadamard = 32;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, dout, 8, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(zpp_get_last_error()).find("cfg->sum"), std::string::npos);
  c = int_cfg(4, 4, 256);
  c.sum = 7;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, dout, 8, ZPP_FLOAT32,
                                   ZPP_OP_SUM, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
}

// residual_reset in INT mode: a call whose step is a multiple of it
// starts from a zero residual, every segment it uses (the own slices'
// included): the same output bits and the same new residual as a call on
// a zeroed residual; a call that does not reset differs.
TEST(QgzInt, ResidualResetStartsFromAZeroResidual) {
  const size_t count = 700;
  auto x = gen(g_rank, g_size * count, ZPP_BFLOAT16, 17, LAPLACE);
  auto in = pack(x, ZPP_BFLOAT16);
  for (int bits : {32, 8}) {
    zpp_qgz_config_t c = int_cfg(4, 4, 128);
    c.residual_bits = bits;
    c.residual_reset = 2;
    size_t rb = 0;
    EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &c, count, &rb), ZPP_OK);
    std::vector<uint8_t> r(rb, 0), zero(rb, 0), out0(count * 2),
        outa(count * 2), outb(count * 2), outc(count * 2);
    c.step = 1; // a first step: r holds its errors
    {
      zpp_test::Mem m0;
      EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, m0.in(in), m0.out(out0),
                                       count, ZPP_BFLOAT16, ZPP_OP_MEAN,
                                       m0.out(r), nullptr, nullptr),
                ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      m0.back();
    }
    std::vector<uint8_t> ra = r, rc = r, rz = zero;
    zpp_test::Mem mem;
    const uint8_t *din = mem.in(in);
    c.step = 4; // resets
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, mem.out(outa), count,
                                     ZPP_BFLOAT16, ZPP_OP_MEAN, mem.out(ra),
                                     nullptr, nullptr),
              ZPP_OK);
    c.step = 3; // does not
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, mem.out(outb), count,
                                     ZPP_BFLOAT16, ZPP_OP_MEAN, mem.out(rz),
                                     nullptr, nullptr),
              ZPP_OK);
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, din, mem.out(outc), count,
                                     ZPP_BFLOAT16, ZPP_OP_MEAN, mem.out(rc),
                                     nullptr, nullptr),
              ZPP_OK);
    mem.back();
    EXPECT_EQ(outa, outb) << "residual bits " << bits
                          << ": a reset call vs a zero residual";
    EXPECT_EQ(ra, rz) << "residual bits " << bits << ": the new residuals";
    EXPECT_EQ(outb, out0) << "residual bits " << bits
                          << ": the first step's output again";
    int differs = outc != outa;
    int all = 0;
    MPI_Allreduce(&differs, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(all, 1) << "residual bits " << bits
                      << ": a call that carries r changes a result";
  }
}

// A NaN or Inf anywhere in a block, the owner's own (unquantized) slice
// included, makes the block's agreed unit non-finite: the whole block of
// the result is NaN (FLOAT mode: the element only), the other blocks stay
// finite.
TEST(QgzInt, NonFiniteValueMakesItsWholeBlockNaN) {
  const size_t count = 600, block = 256; // blocks 0, 1, 2 (88)
  for (float bad : {INFINITY, NAN}) {
    std::vector<float> in =
        gen(g_rank, g_size * count, ZPP_FLOAT32, 19, NORMAL);
    // slice 0 (rank 0's): rank 0's own share in block 0, the last rank's
    // in block 2
    if (g_rank == 0)
      in[3] = bad;
    if (g_rank == g_size - 1)
      in[2 * block + 5] = -bad;
    zpp_qgz_config_t c = int_cfg(4, 4, block);
    std::vector<float> out(count);
    zpp_test::Mem mem;
    EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &c, mem.in(in), mem.out(out),
                                     count, ZPP_FLOAT32, ZPP_OP_SUM, nullptr,
                                     nullptr, nullptr),
              ZPP_OK);
    mem.back();
    if (g_rank != 0)
      continue;
    int nan0 = 0, fin1 = 0, nan2 = 0;
    for (size_t i = 0; i < count; i++) {
      if (i < block)
        nan0 += std::isnan(out[i]);
      else if (i < 2 * block)
        fin1 += std::isfinite(out[i]);
      else
        nan2 += std::isnan(out[i]);
    }
    EXPECT_EQ(nan0, (int)block) << bad << " in the own slice";
    EXPECT_EQ(fin1, (int)block);
    EXPECT_EQ(nan2, g_size > 1 ? (int)(count - 2 * block) : 0)
        << bad << " in another rank's";
  }
}

// A revision-3 struct (up to `step`, include/zpp/zpp_coll.h) takes the
// default sum (the setting; FLOAT unless ZPP_QGZ_SUM=int): the bits of the
// current struct with ZPP_QGZ_SUM_DEFAULT.
TEST(QgzInt, OlderConfigStructTakesTheDefault) {
  const size_t count = 500;
  auto x = gen(g_rank, g_size * count, ZPP_FLOAT32, 13, NORMAL);
  std::vector<float> a(count), b(count);
  zpp_qgz_config_t v3 = ZPP_QGZ_CONFIG_INIT, cur = ZPP_QGZ_CONFIG_INIT;
  v3.struct_size = offsetof(zpp_qgz_config_t, step) + sizeof(uint64_t);
  v3.sum = 12345; // beyond a revision-3 struct: never read
  zpp_test::Mem mem;
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &v3, mem.in(x), mem.out(a), count,
                                   ZPP_FLOAT32, ZPP_OP_MEAN, nullptr, nullptr,
                                   nullptr),
            ZPP_OK)
      << zpp_comm_get_last_error(g_comm);
  EXPECT_EQ(zpp_qgz_reduce_scatter(g_comm, &cur, mem.in(x), mem.out(b), count,
                                   ZPP_FLOAT32, ZPP_OP_MEAN, nullptr, nullptr,
                                   nullptr),
            ZPP_OK);
  mem.back();
  EXPECT_EQ(a, b);
}

// ZPP_QGZ_SUM_DEFAULT follows the setting ZPP_QGZ_SUM, read when a
// communicator is created (docs/collectives.md): with ZPP_QGZ_SUM=int
// (the ctest entries qgz_int_sumenv_* of tests/qgz_int.cmake) a default
// config gives the bits of an explicit INT, else those of FLOAT; INT and
// FLOAT differ on this data (on some rank), so the comparison tells them
// apart.  On device memory both the suite's communicator and the
// host-memory one are checked.
TEST(QgzInt, DefaultSumFollowsTheSetting) {
  const char *env = std::getenv("ZPP_QGZ_SUM");
  const bool want_int = env != nullptr && std::string(env) == "int";
  if (g_rank == 0)
    std::printf("[ info ] ZPP_QGZ_SUM=%s: the default is %s\n",
                env ? env : "(unset)", want_int ? "INT" : "FLOAT");
  const size_t count = 1000;
  auto x = gen(g_rank, g_size * count, ZPP_BFLOAT16, 29, LAPLACE);
  auto in = pack(x, ZPP_BFLOAT16);
  for (int dev = 0; dev < 2; dev++) {
    zpp_comm_t comm = dev ? g_comm : g_host;
    if (!dev && g_host == nullptr)
      continue; // host memory: the suite's communicator is the host one
    const char *where =
        dev && zpp_test::DeviceMemory() ? "device memory" : "host memory";
    std::vector<uint8_t> y[3]; // DEFAULT, INT, FLOAT
    const int sums[3] = {ZPP_QGZ_SUM_DEFAULT, ZPP_QGZ_SUM_INT,
                         ZPP_QGZ_SUM_FLOAT};
    zpp_test::Mem mem;
    for (int k = 0; k < 3; k++) {
      zpp_qgz_config_t c = ZPP_QGZ_CONFIG_INIT;
      c.sum = sums[k];
      y[k].assign(count * 2, 0);
      const uint8_t *src = dev ? mem.in(in) : in.data();
      uint8_t *dst = dev ? mem.out(y[k]) : y[k].data();
      EXPECT_EQ(zpp_qgz_reduce_scatter(comm, &c, src, dst, count, ZPP_BFLOAT16,
                                       ZPP_OP_MEAN, nullptr, nullptr, nullptr),
                ZPP_OK)
          << where << ": " << zpp_comm_get_last_error(comm);
    }
    if (dev)
      mem.back();
    EXPECT_TRUE(y[0] == y[want_int ? 1 : 2])
        << where << ": DEFAULT is not " << (want_int ? "INT" : "FLOAT");
    int differs = y[1] != y[2], any = 0;
    MPI_Allreduce(&differs, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(any, 1) << where << ": INT and FLOAT gave the same bits";
  }
}

// On device memory (ZPP_TEST_MEMORY=device) the integer sums run the CUDA
// kernels of src/kernels/isum_cuda.cu over the whole input at once; a
// host-memory communicator runs the CPU kernels chunk by chunk.  Both
// follow docs/format.md ("Integer sums") to the bit, so the results and the
// residuals after each of four steps are equal (the third resets the
// residual, the second and the fourth update one that is not zero, which
// the moving average reads): every dtype, both widths at each stage, both
// roundings, no residual, fp32 and INT8 residuals with and without LoCo's
// moving average, blocks of a multiple of 8 elements and not, short last
// blocks.
TEST(QgzInt, DeviceEqualsTheHostPathBitForBit) {
  if (!zpp_test::DeviceMemory())
    GTEST_SKIP() << "compares device memory with host memory: run with "
                    "ZPP_TEST_MEMORY=device";
  struct V {
    zpp_dtype_t dt;
    int bits1, bits2;
    size_t block;
    int sr, residual_bits; // 0: no residual
    float beta;
    zpp_redop_t op;
    size_t count;
  };
  const V vs[] = {
      {ZPP_FLOAT32, 4, 4, 256, 0, 0, 0.0f, ZPP_OP_SUM, 1000},
      {ZPP_BFLOAT16, 8, 4, 128, 1, 32, 0.0f, ZPP_OP_MEAN, 2051},
      {ZPP_FLOAT16, 4, 8, 64, 0, 8, 0.0f, ZPP_OP_MEAN, 777},
      {ZPP_BFLOAT16, 4, 4, 100, 1, 32, 0.5f, ZPP_OP_SUM, 1500},
      {ZPP_FLOAT32, 8, 8, 256, 1, 8, 0.8f, ZPP_OP_SUM, 3001},
  };
  uint64_t tag = 600;
  for (const V &v : vs) {
    std::string what =
        std::string(zpp_dtype_name(v.dt)) + " INT" + std::to_string(v.bits1) +
        "/INT" + std::to_string(v.bits2) + " block " + std::to_string(v.block) +
        " sr " + std::to_string(v.sr) + " residual " +
        std::to_string(v.residual_bits) + " beta " + std::to_string(v.beta);
    zpp_qgz_config_t c = int_cfg(v.bits1, v.bits2, v.block);
    c.seed = 31 + tag;
    if (v.sr)
      c.rounding = ZPP_ROUND_STOCHASTIC;
    size_t rb = 0, ds = zpp_dtype_size(v.dt);
    if (v.residual_bits) {
      c.residual_bits = v.residual_bits;
      c.residual_beta = v.beta;
      c.residual_reset = 3;
      EXPECT_EQ(zpp_qgz_residual_bytes(g_comm, &c, v.count, &rb), ZPP_OK);
    }
    const int steps = 4;
    std::vector<std::vector<uint8_t>> in(steps);
    for (int step = 0; step < steps; step++)
      in[step] =
          pack(gen(g_rank, g_size * v.count, v.dt, ++tag, LAPLACE), v.dt);
    std::vector<uint8_t> res[2][steps], out[2][steps];
    for (int dev = 0; dev < 2; dev++) {
      zpp_comm_t comm = dev ? g_comm : g_host;
      zpp_test::Mem mem; // device copies (host pointers when !dev)
      std::vector<uint8_t> rcur(rb + 1, 0);
      uint8_t *r = nullptr;
      if (v.residual_bits)
        r = dev ? mem.out(rcur) : rcur.data();
      for (int step = 0; step < steps; step++) {
        out[dev][step].assign(v.count * ds, 0);
        c.step = (uint64_t)step + 1;
        const uint8_t *src = dev ? mem.in(in[step]) : in[step].data();
        uint8_t *dst = dev ? mem.out(out[dev][step]) : out[dev][step].data();
        EXPECT_EQ(zpp_qgz_reduce_scatter(comm, &c, src, dst, v.count, v.dt,
                                         v.op, r, nullptr, nullptr),
                  ZPP_OK)
            << what << ": " << zpp_comm_get_last_error(comm);
        if (dev)
          mem.back(); // this step's result and residual
        res[dev][step] = rcur;
      }
    }
    for (int step = 0; step < steps; step++) {
      EXPECT_TRUE(out[1][step] == out[0][step])
          << what << ": result of step " << step + 1;
      EXPECT_TRUE(res[1][step] == res[0][step])
          << what << ": residual after step " << step + 1;
    }
  }
}

void setup() {
  zpp_test::OpenComm((unsigned long long)seed(), &g_comm, &g_rank, &g_size, &g_nnodes,
                     &g_uniform);
  g_node.assign(g_size, 0);
  for (int r = 0; r < g_size; r++) zpp_comm_node_of(g_comm, r, &g_node[r]);
  if (zpp_test::DeviceMemory()) {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.backend = ZPP_BACKEND_MPI;
    cfg.memory = ZPP_MEMORY_HOST;
    if (zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &g_host) != ZPP_OK)
      zpp_test::Die("zpp_comm_create_mpi (host memory)");
  }
}

void teardown() {
  if (g_host != nullptr)
    zpp_comm_destroy(g_host);
  zpp_comm_destroy(g_comm);
}

}  // namespace

int main(int argc, char **argv) { return zpp_test::RunAllRanks(argc, argv, setup, teardown); }
