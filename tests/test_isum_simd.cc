// The SIMD kernels of qgZ's compressed-domain sums (quant_cpu.h,
// zpp_isum_ops_t of the "avx2" and "avx512" tables) against the scalar
// reference, bit for bit: random data with a printed seed, every dtype,
// INT4 and INT8, odd counts and blocks (tails, blocks shorter than a
// vector), without and with error feedback (plain and moving average),
// nearest and stochastic rounding (indices crossing 2^32 too), all-zero
// and non-finite blocks, residuals beyond the unit clamp and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "kernels/quant_cpu.h"
#include "kernels/quant_math.h"
}

#include "isum_testdata.h"

namespace {

uint64_t test_seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261207ull;
}

std::mt19937_64 seeded_rng(const char *what, uint64_t salt) {
  uint64_t seed = test_seed();
  std::printf("[ seed ] %s: ZPP_TEST_SEED=%llu (salt %llu)\n", what,
              (unsigned long long)seed, (unsigned long long)salt);
  return std::mt19937_64(seed * 1000003ull + salt);
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

const char *const kIsas[] = {"avx2", "avx512"};
const int kDtypes[] = {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16};
const char *const kDtypeNames[] = {"fp32", "fp16", "bf16"};

struct Shape {
  size_t count, block;
};
// Tails of every length class, blocks below one vector of either ISA,
// blocks that are not a multiple of a vector, one element.
const Shape kShapes[] = {{1, 256},  {15, 16},   {37, 7},     {250, 33},
                         {517, 32}, {1000, 64}, {2063, 256}, {4099, 100}};

// Input elements stored as `dtype` (tests/isum_testdata.h).
std::vector<uint8_t> make_input(std::mt19937_64 &rng, int dtype, size_t count,
                                size_t block) {
  std::vector<uint8_t> v(count * zpp_qm_dtype_bytes(dtype));
  isum_fill_input(rng, dtype, count, block, v.data());
  return v;
}

// Residuals: none (empty), or of the input's order, with a few NaN.
std::vector<float> make_res(std::mt19937_64 &rng, size_t count, float mag) {
  std::vector<float> r(count);
  std::uniform_real_distribution<float> u(-mag, mag);
  for (size_t i = 0; i < count; i++)
    r[i] = (rng() % 97 == 0) ? NAN : u(rng);
  return r;
}

// Agreed exponents: this rank's own, or a larger one of another rank.
std::vector<int8_t> make_uexp(std::mt19937_64 &rng, const uint32_t *amax,
                              size_t nb, int bits) {
  std::vector<int8_t> e(nb);
  for (size_t b = 0; b < nb; b++) {
    int own = zpp_qm_unit_exp(amax[b], bits);
    int other = (int)(rng() % 30) - 20;
    if (own == ZPP_QM_UEXP_NONFINITE)
      e[b] = (int8_t)own;
    else if (rng() % 3 == 0)
      e[b] = (int8_t)std::max(own, other);
    else
      e[b] = (int8_t)own;
  }
  return e;
}

template <class T>
void expect_same(const std::vector<T> &ref, const std::vector<T> &got,
                 const std::string &what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  size_t bytes = ref.size() * sizeof(T);
  // empty vectors may hold null pointers, which memcmp may not be given
  if (bytes == 0 || std::memcmp(ref.data(), got.data(), bytes) == 0)
    return;
  const uint8_t *a = (const uint8_t *)ref.data(),
                *b = (const uint8_t *)got.data();
  size_t k = 0;
  while (a[k] == b[k])
    k++;
  ADD_FAILURE() << what << ": first differing byte " << k << " of " << bytes
                << " (element " << k / sizeof(T) << "): " << (int)a[k]
                << " (scalar) vs " << (int)b[k];
}

std::vector<uint32_t> f32_bits(const std::vector<float> &v) {
  std::vector<uint32_t> u(v.size());
  for (size_t i = 0; i < v.size(); i++)
    u[i] = to_bits(v[i]);
  return u;
}

struct Case {
  const zpp_quant_cpu_ops_t *ops;
  int di, bits, feedback, sr; // feedback 0 none, 1 plain, 2 beta 0.5
  Shape s;
  std::string name() const {
    return std::string(ops->name) + " " + kDtypeNames[di] + " INT" +
           std::to_string(bits) + " fb" + std::to_string(feedback) +
           (sr ? " sr" : " rne") + " count " + std::to_string(s.count) +
           " block " + std::to_string(s.block);
  }
};

template <class F>
void for_each_case(const char *test, F f,
                   std::vector<const char *> isas = {kIsas[0], kIsas[1]}) {
  int ran = 0;
  for (const char *isa : isas) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr) {
      std::printf("[ skip ] %s: not built or not supported here\n", isa);
      continue;
    }
    for (int di = 0; di < 3; di++)
      for (int bits : {4, 8})
        for (int fb = 0; fb < 3; fb++)
          for (int sr = 0; sr < 2; sr++)
            for (const Shape &s : kShapes) {
              Case c{ops, di, bits, fb, sr, s};
              uint64_t salt =
                  ((((uint64_t)di * 16 + bits) * 4 + fb) * 2 + sr) * 100000 +
                  s.count * 10 + (s.block & 7);
              auto rng = seeded_rng(test, salt);
              SCOPED_TRACE(c.name());
              f(c, rng);
              ran++;
            }
  }
  std::printf("[ info ] %s: %d cases\n", test, ran);
}

zpp_qcfg_t make_cfg(const Case &c, std::mt19937_64 &rng) {
  zpp_qcfg_t q{};
  q.bits = c.bits;
  q.asym = 0;
  q.block = c.s.block;
  q.sr = c.sr;
  q.k0 = (uint32_t)rng();
  q.k1 = (uint32_t)rng();
  // Sometimes just below 2^32, so that a vector's indices cross it.
  q.base = (rng() & 1) ? 0xffffffffull - c.s.count / 2 : rng() % 1000;
  return q;
}

float beta_of(const Case &c) { return c.feedback == 2 ? 0.5f : 0.0f; }

TEST(IsumSimd, AbsmaxEncodeAndSumAreBitwiseEqualToScalar) {
  for_each_case("IsumSimd.AbsmaxEncodeAndSum", [](const Case &c,
                                                  std::mt19937_64 &rng) {
    const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
    int dt = kDtypes[c.di];
    zpp_qcfg_t q = make_cfg(c, rng);
    size_t n = c.s.count, nb = zpp_quant_nblocks(&q, n);
    std::vector<uint8_t> x = make_input(rng, dt, n, c.s.block);
    std::vector<float> res = c.feedback ? make_res(rng, n, std::ldexp(1.0f, -8))
                                        : std::vector<float>();
    const float *rp = c.feedback ? res.data() : nullptr;

    std::vector<uint32_t> am_ref(nb), am(nb);
    ref->isum.absmax(&q, dt, x.data(), rp, n, am_ref.data());
    c.ops->isum.absmax(&q, dt, x.data(), rp, n, am.data());
    expect_same(am_ref, am, "absmax");

    std::vector<int8_t> ue = make_uexp(rng, am_ref.data(), nb, c.bits);
    size_t mb = zpp_isum_msg_bytes(&q, n);
    std::vector<uint8_t> m_ref(mb, 0xa5), m(mb, 0xa5);
    std::vector<float> r_ref = res, r = res;
    ref->isum.encode(&q, dt, x.data(), c.feedback ? r_ref.data() : nullptr,
                     beta_of(c), am_ref.data(), ue.data(), n, m_ref.data());
    c.ops->isum.encode(&q, dt, x.data(), c.feedback ? r.data() : nullptr,
                       beta_of(c), am_ref.data(), ue.data(), n, m.data());
    expect_same(m_ref, m, "encode message");
    expect_same(f32_bits(r_ref), f32_bits(r), "encode residual");

    // The sum: the own slice and three messages of random bytes (every
    // code and multiplier pattern, INT4 -8 included) plus the real one.
    // The own slice must be finite where E is: its own block exponents.
    std::vector<const uint8_t *> srcs;
    std::vector<std::vector<uint8_t>> msgs(3, std::vector<uint8_t>(mb));
    for (auto &mm : msgs) {
      for (auto &byte : mm)
        byte = (uint8_t)rng();
      srcs.push_back(mm.data());
    }
    srcs.push_back(m_ref.data());
    for (int with_own = 0; with_own < 2; with_own++) {
      std::vector<int32_t> s_ref(n, 7), s(n, 7);
      const void *own = with_own ? x.data() : nullptr;
      ref->isum.sum(&q, dt, own, nullptr, 0.0f, ue.data(), srcs.data(),
                    (int)srcs.size(), n, s_ref.data());
      c.ops->isum.sum(&q, dt, own, nullptr, 0.0f, ue.data(), srcs.data(),
                      (int)srcs.size(), n, s.data());
      expect_same(s_ref, s, with_own ? "sum with own" : "sum");
    }
    // The own slice with its residual (error feedback of its rounding to
    // a unit), on exponents whose absmax takes the residual in.
    if (c.feedback) {
      std::vector<float> ores = make_res(rng, n, std::ldexp(1.0f, -8));
      std::vector<uint32_t> am2(nb);
      ref->isum.absmax(&q, dt, x.data(), ores.data(), n, am2.data());
      std::vector<int8_t> ue2 = make_uexp(rng, am2.data(), nb, c.bits);
      std::vector<int32_t> s_ref(n, 7), s(n, 7);
      std::vector<float> o_ref = ores, o = ores;
      ref->isum.sum(&q, dt, x.data(), o_ref.data(), beta_of(c), ue2.data(),
                    srcs.data(), (int)srcs.size(), n, s_ref.data());
      c.ops->isum.sum(&q, dt, x.data(), o.data(), beta_of(c), ue2.data(),
                      srcs.data(), (int)srcs.size(), n, s.data());
      expect_same(s_ref, s, "sum with own and residual");
      expect_same(f32_bits(o_ref), f32_bits(o), "own residual");
    }
  });
}

// The encode of bf16 INT4 blocks of at least 128 elements (no residual,
// round to nearest), which the SIMD paths take 128 (avx512) or 64 (avx2)
// elements at a time: against the scalar encode, bit for bit, on blocks
// of every magnitude class: normal, all subnormal (codes of +-1: values
// of 2^-127 and up against a step of at least 2^-126), mixed normal and
// subnormal, +-0 among them, all zero or -0, one Inf or NaN, agreed
// exponents the own one or larger; blocks of 128 to 1024 elements, an
// odd one, more than 32 blocks (a second group of multipliers) and a
// last partial block.
TEST(IsumSimd, Bf16Int4EncodeOfWideBlocksIsBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  const size_t kBlocks[] = {128, 200, 256, 257, 384, 1024};
  int ran = 0;
  for (const char *isa : kIsas) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr) {
      std::printf("[ skip ] %s: not built or not supported here\n", isa);
      continue;
    }
    for (size_t block : kBlocks) {
      auto rng = seeded_rng("IsumSimd.Bf16Int4EncodeOfWideBlocks", block);
      SCOPED_TRACE(std::string(isa) + " block " + std::to_string(block));
      zpp_qcfg_t q{};
      q.bits = 4;
      q.block = block;
      size_t n = 40 * block + block / 2 + 37, nb = zpp_quant_nblocks(&q, n);
      std::vector<uint8_t> x(2 * n);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (size_t b = 0; b < nb; b++) {
        size_t off = b * block, len = std::min(block, n - off);
        int kind = (int)(b % 8);
        // below 2^-126: bf16 subnormals
        float mag = std::ldexp(1.0f, kind == 1   ? -126
                                     : kind == 2 ? -124
                                                 : (int)(rng() % 40) - 20);
        for (size_t i = 0; i < len; i++) {
          float v = u(rng) * mag;
          if (kind == 2 && i % 3 == 0) // subnormals beside normals
            v = u(rng) * std::ldexp(1.0f, -126);
          if (kind == 3 || (rng() % 11 == 0))
            v = (rng() & 1) ? -0.0f : 0.0f;
          if (kind == 4 && i == len / 2)
            v = (rng() & 1) ? INFINITY : -INFINITY;
          if (kind == 5 && i == len / 3)
            v = NAN;
          if (kind == 6 && i == (size_t)(rng() % len))
            v = (rng() & 1) ? mag : -mag; // the absmax exactly
          zpp_qm_store(x.data(), off + i, ZPP_QM_BF16, v);
        }
      }
      std::vector<uint32_t> am(nb);
      ref->isum.absmax(&q, ZPP_QM_BF16, x.data(), nullptr, n, am.data());
      std::vector<int8_t> ue = make_uexp(rng, am.data(), nb, 4);
      // the subnormal blocks at their own exponent: a larger agreed one
      // would round all their codes to 0
      for (size_t b = 1; b < nb; b += 8) {
        ue[b] = (int8_t)zpp_qm_unit_exp(am[b], 4);
        if (b + 1 < nb)
          ue[b + 1] = (int8_t)zpp_qm_unit_exp(am[b + 1], 4);
      }
      size_t mb = zpp_isum_msg_bytes(&q, n);
      std::vector<uint8_t> m_ref(mb, 0xa5), m(mb, 0xa5);
      ref->isum.encode(&q, ZPP_QM_BF16, x.data(), nullptr, 0.0f, am.data(),
                       ue.data(), n, m_ref.data());
      ops->isum.encode(&q, ZPP_QM_BF16, x.data(), nullptr, 0.0f, am.data(),
                       ue.data(), n, m.data());
      expect_same(m_ref, m, "encode message");
      ran++;
    }
  }
  std::printf("[ info ] IsumSimd.Bf16Int4EncodeOfWideBlocks: %d cases\n", ran);
  if (ran == 0)
    GTEST_SKIP() << "no SIMD path here: nothing compared";
}

// The sum with more messages than INT4's int16 accumulation takes (16)
// and far more: every path's int32 sums equal the scalar ones.  Messages
// of random bytes (every code, -8 included, and every multiplier).
TEST(IsumSimd, SumOfManyMessagesIsBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  for (const char *isa : kIsas) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr) {
      std::printf("[ skip ] %s: not built or not supported here\n", isa);
      continue;
    }
    for (int bits : {4, 8})
      for (int nmsg : {16, 17, 41, 301}) {
        SCOPED_TRACE(std::string(isa) + " INT" + std::to_string(bits) + " " +
                     std::to_string(nmsg) + " messages");
        auto rng = seeded_rng("IsumSimd.SumOfManyMessages",
                              (uint64_t)bits * 1000 + (uint64_t)nmsg);
        zpp_qcfg_t q{};
        q.bits = bits;
        q.block = 64;
        size_t n = 517, nb = zpp_quant_nblocks(&q, n);
        std::vector<uint8_t> x = make_input(rng, ZPP_QM_BF16, n, q.block);
        std::vector<float> ores = make_res(rng, n, std::ldexp(1.0f, -8));
        std::vector<uint32_t> am(nb);
        ref->isum.absmax(&q, ZPP_QM_BF16, x.data(), ores.data(), n, am.data());
        std::vector<int8_t> ue = make_uexp(rng, am.data(), nb, bits);
        size_t mb = zpp_isum_msg_bytes(&q, n);
        std::vector<std::vector<uint8_t>> msgs(nmsg, std::vector<uint8_t>(mb));
        std::vector<const uint8_t *> srcs;
        for (auto &mm : msgs) {
          for (auto &byte : mm)
            byte = (uint8_t)rng();
          srcs.push_back(mm.data());
        }
        std::vector<int32_t> s_ref(n, 7), s(n, 7);
        std::vector<float> o_ref = ores, o = ores;
        ref->isum.sum(&q, ZPP_QM_BF16, x.data(), o_ref.data(), 0.0f, ue.data(),
                      srcs.data(), nmsg, n, s_ref.data());
        ops->isum.sum(&q, ZPP_QM_BF16, x.data(), o.data(), 0.0f, ue.data(),
                      srcs.data(), nmsg, n, s.data());
        expect_same(s_ref, s, "sum");
        expect_same(f32_bits(o_ref), f32_bits(o), "own residual");
        // an independent check of one element: the products' sum
        size_t i = 100, b = i / q.block, cb = zpp_isum_code_bytes(&q, n);
        int64_t want = 0;
        int e = ue[b];
        float xv = zpp_qm_load(x.data(), i, ZPP_QM_BF16) + ores[i];
        if (e != ZPP_QM_UEXP_ZERO && e != ZPP_QM_UEXP_NONFINITE)
          want = (int64_t)std::nearbyint(std::ldexp((double)xv, -e));
        for (int j = 0; j < nmsg; j++) {
          const uint8_t *pl = srcs[j] + b * zpp_qm_payload_bytes(q.block, bits);
          size_t k = i - b * q.block;
          int code =
              bits == 8 ? (int8_t)pl[k]
                        : (int)(((pl[k / 2] >> (4 * (k & 1))) & 0xf) ^ 0x8) - 8;
          want += (int64_t)srcs[j][cb + b] * code;
        }
        EXPECT_EQ(want, (int64_t)s_ref[i]) << "element " << i;
      }
  }
}

// Extreme magnitudes: inputs from 2^-140 (subnormal) to just below 2^128,
// whose exponents span the whole range [-126, 118], agreed exponents up
// to 118, integer sums at and near +-2^22: every step of every path equals
// the scalar one.
TEST(IsumSimd, ExtremeMagnitudesAreBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  // the ends of the exponent range
  EXPECT_EQ(zpp_qm_unit_exp(0x7f7fffffu, 4), 118);
  EXPECT_EQ(zpp_qm_unit_exp(0x7f7fffffu, 8), 114);
  EXPECT_EQ(zpp_qm_unit_exp(1u, 4), ZPP_QM_UEXP_MIN);
  EXPECT_EQ(zpp_qm_unit_exp(1u, 8), ZPP_QM_UEXP_MIN);
  // s = fl(FLT_MAX / 7) = 146.29 * 2^118: the multiplier rounds up
  EXPECT_EQ(zpp_qm_unit_mult(0x7f7fffffu, 4, 118), 147u);
  for (const char *isa : kIsas) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr)
      continue;
    for (int bits : {4, 8})
      for (int sr = 0; sr < 2; sr++) {
        SCOPED_TRACE(std::string(isa) + " INT" + std::to_string(bits) +
                     (sr ? " sr" : " rne"));
        auto rng = seeded_rng("IsumSimd.ExtremeMagnitudes",
                              (uint64_t)bits * 10 + (uint64_t)sr);
        zpp_qcfg_t q{};
        q.bits = bits;
        q.block = 48;
        q.sr = sr;
        q.k0 = (uint32_t)rng();
        q.k1 = (uint32_t)rng();
        const int kLo = -140, kHi = 127;
        size_t nb = (size_t)(kHi - kLo + 1), n = nb * q.block;
        std::vector<uint8_t> x(n * 4);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t b = 0; b < nb; b++)
          for (size_t i = 0; i < q.block; i++) {
            int k = kLo + (int)b;
            // block b: magnitudes up to 2^k (the largest finite at 127)
            float v =
                k == 127 ? u(rng) * 3.4028235e38f : std::ldexp(u(rng), k + 1);
            if (i == 0)
              v = k == 127 ? 3.4028235e38f : std::ldexp(1.0f, k);
            zpp_qm_store(x.data(), b * q.block + i, ZPP_QM_F32, v);
          }
        std::vector<float> ores(n, 0.0f);
        std::vector<uint32_t> am(nb), am2(nb);
        ref->isum.absmax(&q, ZPP_QM_F32, x.data(), ores.data(), n, am.data());
        ops->isum.absmax(&q, ZPP_QM_F32, x.data(), ores.data(), n, am2.data());
        expect_same(am, am2, "absmax");
        std::vector<int8_t> ue(nb);
        int lo = 127, hi = -128;
        for (size_t b = 0; b < nb; b++) {
          int own = zpp_qm_unit_exp(am[b], bits);
          lo = std::min(lo, own);
          hi = std::max(hi, own);
          // sometimes a larger agreed exponent, up to 118
          ue[b] =
              (int8_t)(rng() % 3 == 0 ? std::min(118, own + (int)(rng() % 20))
                                      : own);
        }
        EXPECT_EQ(lo, ZPP_QM_UEXP_MIN);
        EXPECT_EQ(hi, bits == 4 ? 118 : 114);
        size_t mb = zpp_isum_msg_bytes(&q, n);
        std::vector<uint8_t> m_ref(mb), m(mb);
        std::vector<float> r_ref(n, 0.0f), r(n, 0.0f);
        ref->isum.encode(&q, ZPP_QM_F32, x.data(), r_ref.data(), 0.0f,
                         am.data(), ue.data(), n, m_ref.data());
        ops->isum.encode(&q, ZPP_QM_F32, x.data(), r.data(), 0.0f, am.data(),
                         ue.data(), n, m.data());
        expect_same(m_ref, m, "encode");
        expect_same(f32_bits(r_ref), f32_bits(r), "encode residual");
        const uint8_t *srcs[1] = {m_ref.data()};
        std::vector<int32_t> s_ref(n), s(n);
        std::vector<float> o_ref(n, 0.0f), o(n, 0.0f);
        ref->isum.sum(&q, ZPP_QM_F32, x.data(), o_ref.data(), 0.0f, ue.data(),
                      srcs, 1, n, s_ref.data());
        ops->isum.sum(&q, ZPP_QM_F32, x.data(), o.data(), 0.0f, ue.data(), srcs,
                      1, n, s.data());
        expect_same(s_ref, s, "sum");
        expect_same(f32_bits(o_ref), f32_bits(o), "own residual");
        // integer sums at and near the limit
        for (size_t i = 0; i < n; i += 7)
          s_ref[i] = (i / 7) % 4 == 0   ? ZPP_QM_ISUM_MAX
                     : (i / 7) % 4 == 1 ? -ZPP_QM_ISUM_MAX
                     : (i / 7) % 4 == 2 ? ZPP_QM_ISUM_MAX - 1
                                        : -(ZPP_QM_ISUM_MAX - 1);
        size_t eb = 4 * nb + zpp_isum_code_bytes(&q, n);
        std::vector<uint8_t> q_ref(eb), qv(eb);
        std::vector<float> e_ref(n), e(n);
        for (size_t i = 0; i < n; i++)
          e_ref[i] = e[i] = std::ldexp(u(rng), ue[i / q.block]);
        ref->isum.requant(&q, s_ref.data(), ue.data(), e_ref.data(), 0.0f, n,
                          q_ref.data());
        ops->isum.requant(&q, s_ref.data(), ue.data(), e.data(), 0.0f, n,
                          qv.data());
        expect_same(q_ref, qv, "requant");
        expect_same(f32_bits(e_ref), f32_bits(e), "requant residual");
        std::vector<uint8_t> f_ref(n * 4), f(n * 4);
        const uint8_t *s2[1] = {q_ref.data()};
        ref->isum.finish(&q, s_ref.data(), ue.data(), s2, 1, n, 8.0f,
                         ZPP_QM_F32, f_ref.data());
        ops->isum.finish(&q, s_ref.data(), ue.data(), s2, 1, n, 8.0f,
                         ZPP_QM_F32, f.data());
        expect_same(f_ref, f, "finish");
      }
  }
}

TEST(IsumSimd, RequantAndFinishAreBitwiseEqualToScalar) {
  for_each_case("IsumSimd.RequantAndFinish", [](const Case &c,
                                                std::mt19937_64 &rng) {
    const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
    int dt = kDtypes[c.di];
    zpp_qcfg_t q = make_cfg(c, rng); // stage 2's width: c.bits
    size_t n = c.s.count, nb = zpp_quant_nblocks(&q, n);
    // Integer sums up to the kernels' limit, per block a random range.
    std::vector<int32_t> in(n);
    std::vector<int8_t> ue(nb);
    for (size_t b = 0; b < nb; b++) {
      int kind = (int)(rng() % 8);
      int32_t range =
          kind == 0 ? 0 : (int32_t)(rng() % ZPP_QM_ISUM_MAX) >> (rng() % 20);
      ue[b] = kind == 1   ? (int8_t)ZPP_QM_UEXP_NONFINITE
              : kind == 2 ? (int8_t)ZPP_QM_UEXP_ZERO
                          : (int8_t)((int)(rng() % 60) - 40);
      for (size_t i = b * q.block; i < std::min(n, (b + 1) * q.block); i++)
        in[i] = range == 0
                    ? 0
                    : (int32_t)(rng() % (2 * (uint32_t)range + 1)) - range;
    }
    // Residuals: around a unit, some far beyond the +-2^22 clamp, NaN.
    std::vector<float> res(n);
    for (size_t i = 0; i < n; i++) {
      int e = ue[i / q.block];
      float unit = (e == ZPP_QM_UEXP_NONFINITE || e == ZPP_QM_UEXP_ZERO)
                       ? 1.0f
                       : zpp_qm_pow2(e);
      int k = (int)(rng() % 50);
      float f = std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng);
      res[i] = k == 0 ? NAN : k == 1 ? f * unit * 8388608.0f : f * unit;
    }
    size_t eb = 4 * nb + zpp_isum_code_bytes(&q, n);
    std::vector<uint8_t> m_ref(eb, 0x5a), m(eb, 0x5a);
    std::vector<float> r_ref = res, r = res;
    ref->isum.requant(&q, in.data(), ue.data(),
                      c.feedback ? r_ref.data() : nullptr, beta_of(c), n,
                      m_ref.data());
    c.ops->isum.requant(&q, in.data(), ue.data(),
                        c.feedback ? r.data() : nullptr, beta_of(c), n,
                        m.data());
    expect_same(m_ref, m, "requant message");
    expect_same(f32_bits(r_ref), f32_bits(r), "requant residual");

    // The finish: the requantized message and one of random codes with
    // random finite scales (and a NaN and a zero scale).
    std::vector<uint8_t> other(eb);
    for (auto &byte : other)
      byte = (uint8_t)rng();
    for (size_t b = 0; b < nb; b++) {
      float sc = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                            (int)(rng() % 40) - 20);
      sc = b % 11 == 3 ? NAN : b % 11 == 5 ? 0.0f : sc;
      std::memcpy(other.data() + 4 * b, &sc, 4);
    }
    const uint8_t *srcs[2] = {m_ref.data(), other.data()};
    // div: MEAN over 8 ranks (a power of two), 6, SUM (1) and 2^-3.
    for (float div : {8.0f, 6.0f, 1.0f, 0.125f})
      for (int k = 1; k <= 2; k++) {
        size_t ob = n * zpp_qm_dtype_bytes(dt);
        std::vector<uint8_t> o_ref(ob, 0x33), o(ob, 0x33);
        ref->isum.finish(&q, in.data(), ue.data(), srcs, k, n, div, dt,
                         o_ref.data());
        c.ops->isum.finish(&q, in.data(), ue.data(), srcs, k, n, div, dt,
                           o.data());
        expect_same(o_ref, o, "finish, div " + std::to_string(div));
      }
  });
}

// Stage 2's residual reaches the wire late, never lost (docs/format.md,
// "Integer sums", re-quantization): (a) in a block whose unit is the
// all-zero marker (every stage-1 contribution of the group zero) the
// message is zero (scale 0, codes 0) and the residual stays as it was;
// (b) at most 2^22 units of a residual enter a step's sum, the excess
// stays in the residual: new residual = fl(e - dec), dec the message's
// decoded value, within 2^22 (1 + 1 / qmax2) units of it.  Every path.
TEST(IsumSimd, RequantDefersAZeroUnitBlocksAndAClampedResidual) {
  for (const char *isa : {"scalar", kIsas[0], kIsas[1]}) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr)
      continue;
    for (int bits : {4, 8}) {
      SCOPED_TRACE(std::string(isa) + " INT" + std::to_string(bits));
      auto rng = seeded_rng("IsumSimd.RequantDefers", (uint64_t)bits);
      zpp_qcfg_t q{};
      q.bits = bits;
      q.block = 64;
      const size_t n = 128, nb = 2;
      const int e = -10; // block 1's unit 2^-10
      std::vector<int8_t> ue = {(int8_t)ZPP_QM_UEXP_ZERO, (int8_t)e};
      std::vector<int32_t> in(n, 0);
      std::vector<float> res(n);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (size_t i = 0; i < n; i++) {
        in[i] = i < 64 ? 0 : (int32_t)(rng() % 201) - 100;
        // block 0: a residual of any size; block 1: 2^30 units and more
        res[i] =
            i < 64 ? std::ldexp(u(rng), -3)
                   : std::ldexp((i & 1 ? 1.0f : -1.0f) * (1.0f + u(rng) * 0.5f),
                                30 + e);
      }
      std::vector<float> r = res;
      std::vector<uint8_t> m(4 * nb + zpp_isum_code_bytes(&q, n));
      ops->isum.requant(&q, in.data(), ue.data(), r.data(), 0.0f, n, m.data());
      std::vector<float> dec(n);
      zpp_quant_decode_scalar(&q, m.data(), n, ZPP_QM_F32, dec.data());
      float sc0;
      std::memcpy(&sc0, m.data(), 4);
      EXPECT_EQ(sc0, 0.0f) << "a zero unit's block: scale 0";
      double qmax = (1 << (bits - 1)) - 1, unit = std::ldexp(1.0, e);
      for (size_t i = 0; i < n; i++) {
        if (i < 64) {
          EXPECT_EQ(dec[i], 0.0f) << i;
          EXPECT_EQ(to_bits(r[i]), to_bits(res[i]))
              << "kept whole, element " << i;
          continue;
        }
        // what went out is at most 2^22 + |I| units (and a step more)
        double sent = dec[i], lim = (4194304.0 + 100.0) * (1 + 1 / qmax) * unit;
        EXPECT_LE(std::fabs(sent), lim) << i;
        // and what did not stays: fl(fl(I u) + e) - dec, one rounding
        double want = ((double)in[i] * unit + res[i]) - sent;
        EXPECT_NEAR(r[i], want, std::fabs(want) * std::ldexp(1.0, -23)) << i;
        EXPECT_GT(std::fabs(r[i]), std::fabs(res[i]) / 2)
            << "most of it stays, " << i;
      }
    }
  }
}

// The fused steps of every path (the scalar one included) against the
// scalar steps they fuse: sum then requant (message and residual), sum
// then finish; counts of several tiles, tiles that end inside the call.
TEST(IsumSimd, FusedStepsAreBitwiseEqualToTheScalarSteps) {
  for_each_case(
      "IsumSimd.FusedSteps",
      [](const Case &c, std::mt19937_64 &rng) {
        const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
        int dt = kDtypes[c.di];
        zpp_qcfg_t q1 = make_cfg(c, rng), q2 = make_cfg(c, rng);
        size_t n = c.s.count, nb = zpp_quant_nblocks(&q1, n);
        std::vector<uint8_t> x = make_input(rng, dt, n, c.s.block);
        // the own slice's residual: taken into the absmax, as qgz_int.c does
        std::vector<float> ores = make_res(rng, n, std::ldexp(1.0f, -8));
        const float *orp = c.feedback ? ores.data() : nullptr;
        std::vector<uint32_t> am(nb);
        ref->isum.absmax(&q1, dt, x.data(), orp, n, am.data());
        std::vector<int8_t> ue = make_uexp(rng, am.data(), nb, c.bits);
        // Stage 1: the real encode of x and two messages of random bytes.
        size_t mb = zpp_isum_msg_bytes(&q1, n);
        std::vector<std::vector<uint8_t>> msgs(3, std::vector<uint8_t>(mb));
        ref->isum.encode(&q1, dt, x.data(), nullptr, 0.0f, am.data(), ue.data(),
                         n, msgs[0].data());
        for (int k = 1; k < 3; k++)
          for (auto &byte : msgs[k])
            byte = (uint8_t)rng();
        const uint8_t *srcs[3] = {msgs[0].data(), msgs[1].data(),
                                  msgs[2].data()};
        std::vector<float> res =
            make_res(rng, n, std::ldexp(1.0f, (int)(rng() % 20) - 10));
        std::vector<int32_t> tmp(zpp_isum_tile(&q1, n), -1);
        size_t eb = 4 * nb + zpp_isum_code_bytes(&q2, n);
        for (int with_own = 0; with_own < 2; with_own++) {
          SCOPED_TRACE(with_own ? "with own" : "without own");
          const void *own = with_own ? x.data() : nullptr;
          std::vector<int32_t> s_ref(n);
          std::vector<float> o1 = ores, o_g = ores;
          float *or1 = c.feedback ? o1.data() : nullptr;
          ref->isum.sum(&q1, dt, own, or1, beta_of(c), ue.data(), srcs, 3, n,
                        s_ref.data());

          std::vector<uint8_t> m_ref(eb, 0x5a), m(eb, 0x5a);
          std::vector<float> r_ref = res, r = res;
          float *rr = c.feedback ? r_ref.data() : nullptr;
          float *rg = c.feedback ? r.data() : nullptr;
          ref->isum.requant(&q2, s_ref.data(), ue.data(), rr, beta_of(c), n,
                            m_ref.data());
          c.ops->isum.sum_requant(
              &q1, &q2, dt, own, c.feedback ? o_g.data() : nullptr, ue.data(),
              srcs, 3, rg, beta_of(c), n, tmp.data(), m.data());
          expect_same(m_ref, m, "sum_requant message");
          expect_same(f32_bits(r_ref), f32_bits(r), "sum_requant residual");
          expect_same(f32_bits(o1), f32_bits(o_g), "sum_requant own residual");

          // The finish: the re-quantized message and one of random codes
          // and random finite scales.
          std::vector<uint8_t> other(eb);
          for (auto &byte : other)
            byte = (uint8_t)rng();
          for (size_t b = 0; b < nb; b++) {
            float sc =
                std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                           (int)(rng() % 40) - 20);
            std::memcpy(other.data() + 4 * b, &sc, 4);
          }
          const uint8_t *srcs2[2] = {m_ref.data(), other.data()};
          for (int k = 0; k <= 2; k++) {
            size_t ob = n * zpp_qm_dtype_bytes(dt);
            std::vector<uint8_t> o_ref(ob, 0x33), o(ob, 0x33);
            float div = k == 1 ? 6.0f : 8.0f;
            ref->isum.finish(&q2, s_ref.data(), ue.data(), srcs2, k, n, div, dt,
                             o_ref.data());
            std::vector<float> og = ores;
            c.ops->isum.sum_finish(
                &q1, &q2, dt, own, c.feedback ? og.data() : nullptr, beta_of(c),
                ue.data(), srcs, 3, srcs2, k, n, div, tmp.data(), o.data());
            expect_same(o_ref, o, "sum_finish");
            expect_same(f32_bits(o1), f32_bits(og), "sum_finish own residual");
          }
        }
      },
      {"scalar", kIsas[0], kIsas[1]});
}

} // namespace
