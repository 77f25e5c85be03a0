// Tests of the block quantizer on the CPU: the format rules of
// docs/format.md checked against an independent float64 reference, every
// SIMD path against the scalar reference bit for bit, and every bad
// argument against its documented status code.
//
// Seed: ZPP_TEST_SEED (default 20261129); it is printed by every test that
// draws random data.
#include <gtest/gtest.h>

#include <zpp/zpp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "scoped_env.h"

// This file's copy of quant_cpu.h's zpp_qcpu_prefetch records the offsets
// it requests (from g_pf_base) instead of prefetching (QuantPrefetch below);
// the library's kernels keep the real requests.
static const char *g_pf_base;
static std::vector<size_t> g_pf;
#define ZPP_QCPU_PREFETCH_LINE(addr) \
  g_pf.push_back((size_t)((const char *)(addr) - g_pf_base))

extern "C" {
#include "coll/coll.h"  // zpp_k_sum_decoded, zpp_exec_t
#include "kernels/elementwise.h"
#include "core/core.h"
#include "quant/quant.h"
#include "kernels/quant_cpu.h"
#include "kernels/quant_math.h"
#include "kernels/transform.h"
}

namespace {

uint64_t test_seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

std::mt19937_64 seeded_rng(const char *what, uint64_t salt = 0) {
  uint64_t seed = test_seed();
  std::printf("[ seed ] %s: ZPP_TEST_SEED=%llu (salt %llu)\n", what,
              (unsigned long long)seed, (unsigned long long)salt);
  return std::mt19937_64(seed * 1000003ull + salt);
}

// ---- independent conversions (float64 based) ------------------------------

float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round a double to the nearest value with `mant` explicit mantissa bits and
// minimum normal exponent `emin` (IEEE formats): ties to even, via exact
// scaling with ldexp.  Overflow handling is the caller's.
double round_to_format(double x, int mant, int emin) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1)
  int exp = std::max(e - 1, emin);
  double ulp = std::ldexp(1.0, exp - mant);
  double q = x / ulp;  // exact: power-of-two scaling
  double r = std::nearbyint(q);  // default mode: ties to even
  return r * ulp;
}

float bf16_to_float(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
float half_to_float(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v;
  if (exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
  if (exp == 0) v = std::ldexp((double)man, -24);
  else v = std::ldexp(1024.0 + man, exp - 25);
  return (float)(sign ? -v : v);
}

// A float made representable in `dtype`, so that the test's float64 view
// equals what the library reads.
float representable(float x, zpp_dtype_t dt) {
  if (dt == ZPP_FLOAT32) return x;
  if (dt == ZPP_BFLOAT16) return (float)round_to_format(x, 7, -126);
  double r = round_to_format(x, 10, -14);
  if (std::fabs(r) > 65504.0) r = std::copysign(65504.0, r);
  return (float)r;
}

void put(std::vector<uint8_t> &buf, zpp_dtype_t dt, size_t i, float v) {
  if (dt == ZPP_FLOAT32) {
    std::memcpy(&buf[4 * i], &v, 4);
    return;
  }
  uint16_t h = dt == ZPP_BFLOAT16 ? (uint16_t)(bits_of(v) >> 16)
                                  : zpp_qm_f32_to_f16(v);  // v is exact
  std::memcpy(&buf[2 * i], &h, 2);
}

float get(const uint8_t *buf, zpp_dtype_t dt, size_t i) {
  if (dt == ZPP_FLOAT32) {
    float f;
    std::memcpy(&f, buf + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, buf + 2 * i, 2);
  return dt == ZPP_BFLOAT16 ? bf16_to_float(h) : half_to_float(h);
}

zpp_quant_config_t make_cfg(int bits, size_t block, bool asym) {
  zpp_quant_config_t c = ZPP_QUANT_CONFIG_INIT;
  c.bits = bits;
  c.block_size = block;
  c.mode = asym ? ZPP_QUANT_ASYMMETRIC : ZPP_QUANT_SYMMETRIC;
  return c;
}

// Independent size formula (docs/format.md, "Layout").
size_t expected_size(int bits, size_t block, bool asym, size_t n) {
  if (n == 0) return 0;
  size_t nb = (n + block - 1) / block;
  size_t tail = n - (nb - 1) * block;
  auto pay = [&](size_t len) { return bits == 8 ? len : (len + 1) / 2; };
  return nb * (asym ? 8 : 4) + (nb - 1) * pay(block) + pay(tail);
}

std::vector<float> draw(std::mt19937_64 &rng, size_t n, zpp_dtype_t dt,
                        int dist) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) {
    float v = dist == 0 ? normal(rng) : uni(rng) + 0.5f;  // 1: shifted
    x[i] = representable(v, dt);
  }
  return x;
}

std::vector<uint8_t> to_bytes(const std::vector<float> &x, zpp_dtype_t dt) {
  std::vector<uint8_t> b(x.size() * zpp_dtype_size(dt) + 1);
  for (size_t i = 0; i < x.size(); i++) put(b, dt, i, x[i]);
  return b;
}

// Half a unit in the last place of the output format at |v|, plus the
// smallest subnormal step of that format: the rounding of the final store.
double store_err(double v, zpp_dtype_t dt) {
  v = std::fabs(v);
  if (dt == ZPP_FLOAT32) return 0;  // fp32 roundings are in the main bound
  if (dt == ZPP_BFLOAT16) return v * std::ldexp(1.0, -8) + std::ldexp(1.0, -133);
  return v * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
}

// Checks the decoded values of one encoded buffer against x, block by
// block, with the bound of docs/format.md ("Error bound"):
//   |x_hat - x| <= scale * (1/2 + 2^-12) + 2^-22 * (|x| + range) + 2^-149
// plus the store rounding of fp16/bf16 output.  Also checks the stored
// scale against the rule scale = fl(range / levels).
void check_block_bounds(const std::vector<float> &x, const uint8_t *enc,
                        const uint8_t *out, zpp_dtype_t dt, int bits,
                        size_t block, bool asym, const std::string &ctx) {
  size_t n = x.size();
  size_t nb = (n + block - 1) / block;
  size_t meta = asym ? 8 : 4;
  int bad = 0;
  for (size_t b = 0; b < nb && bad < 5; b++) {
    size_t off = b * block, len = std::min(block, n - off);
    double mn = INFINITY, mx = -INFINITY, amax = 0;
    for (size_t i = 0; i < len; i++) {
      double v = x[off + i];
      mn = std::min(mn, v);
      mx = std::max(mx, v);
      amax = std::max(amax, std::fabs(v));
    }
    double range = asym ? mx - mn : amax;
    float scale;
    std::memcpy(&scale, enc + b * meta, 4);
    float levels = asym ? (float)((1 << bits) - 1) : (float)((1 << (bits - 1)) - 1);
    float want = range == 0 ? 0.0f : (float)range / levels;
    if (range != 0 && want == 0) want = f32_from_bits(1);
    if (scale != want) {
      ADD_FAILURE() << ctx << " block " << b << ": scale " << scale
                    << " != fl(range/levels) " << want;
      bad++;
    }
    if (asym) {
      float zero;
      std::memcpy(&zero, enc + b * meta + 4, 4);
      if (zero != (float)mn) {
        ADD_FAILURE() << ctx << " block " << b << ": zero " << zero
                      << " != min " << mn;
        bad++;
      }
    }
    for (size_t i = 0; i < len && bad < 5; i++) {
      double xv = x[off + i], xh = get(out, dt, off + i);
      double bound = (double)scale * (0.5 + std::ldexp(1.0, -12)) +
                     std::ldexp(1.0, -22) * (std::fabs(xv) + range) +
                     std::ldexp(1.0, -149) + store_err(xh, dt);
      if (!(std::fabs(xh - xv) <= bound)) {
        ADD_FAILURE() << ctx << " element " << off + i << ": x " << xv
                      << " decoded " << xh << " error " << std::fabs(xh - xv)
                      << " > bound " << bound << " (scale " << scale << ")";
        bad++;
      }
    }
  }
}

const zpp_dtype_t kDtypes[] = {ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16};

// ---- format ------------------------------------------------------------------

TEST(QuantFormat, EncodedSizeMatchesLayoutFormula) {
  const size_t lengths[] = {0, 1, 2, 7, 8, 9, 255, 256, 257, 4097, 100003};
  const size_t blocks[] = {1, 2, 3, 7, 8, 64, 255, 256, 4096, 1u << 20};
  for (int bits : {8, 4})
    for (bool asym : {false, true})
      for (size_t blk : blocks)
        for (size_t n : lengths) {
          zpp_quant_config_t c = make_cfg(bits, blk, asym);
          size_t got = 12345;
          ASSERT_EQ(zpp_quant_encoded_size(&c, n, &got), ZPP_OK);
          EXPECT_EQ(got, expected_size(bits, blk, asym, n))
              << "bits " << bits << " block " << blk << " n " << n;
        }
}

TEST(QuantFormat, Int4PacksEvenElementInLowNibble) {
  // block of 3: codes for x = {7s, -7s, 3s}: 7 -> 0x7, -7 -> 0x9, 3 -> 0x3
  float x[3] = {7.0f, -7.0f, 3.0f};
  zpp_quant_config_t c = make_cfg(4, 3, false);
  uint8_t enc[6];
  ASSERT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, x, 3, enc, sizeof enc), ZPP_OK);
  float scale;
  std::memcpy(&scale, enc, 4);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(enc[4], 0x97);  // element 0 low nibble, element 1 high nibble
  EXPECT_EQ(enc[5], 0x03);  // odd tail: high nibble zero
}

TEST(QuantFormat, Int8AsymmetricLayoutIsScaleZeroPayload) {
  float x[4] = {-1.0f, 0.0f, 1.0f, 254.0f};  // range 255 -> scale 1
  zpp_quant_config_t c = make_cfg(8, 4, true);
  uint8_t enc[12];
  ASSERT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, x, 4, enc, sizeof enc), ZPP_OK);
  float scale, zero;
  std::memcpy(&scale, enc, 4);
  std::memcpy(&zero, enc + 4, 4);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(zero, -1.0f);
  EXPECT_EQ(enc[8], 0);
  EXPECT_EQ(enc[9], 1);
  EXPECT_EQ(enc[10], 2);
  EXPECT_EQ(enc[11], 255);
}

TEST(QuantFormat, RoundsHalfToEven) {
  // scale 1 (absmax 127): 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, 0.5 -> 0
  float x[5] = {127.0f, 2.5f, 3.5f, -2.5f, 0.5f};
  zpp_quant_config_t c = make_cfg(8, 5, false);
  uint8_t enc[9];
  ASSERT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, x, 5, enc, sizeof enc), ZPP_OK);
  EXPECT_EQ((int8_t)enc[4], 127);
  EXPECT_EQ((int8_t)enc[5], 2);
  EXPECT_EQ((int8_t)enc[6], 4);
  EXPECT_EQ((int8_t)enc[7], -2);
  EXPECT_EQ((int8_t)enc[8], 0);
}

// ---- round trip over the grid of shapes ---------------------------------------

struct Shape {
  zpp_dtype_t dt;
  int bits;
  bool asym;
};

class QuantRoundTrip : public ::testing::TestWithParam<Shape> {};

TEST_P(QuantRoundTrip, WithinDerivedBoundForEveryLengthAndBlock) {
  Shape s = GetParam();
  auto rng = seeded_rng("QuantRoundTrip", s.dt * 100 + s.bits * 10 + s.asym);
  const size_t lengths[] = {1, 2, 7, 9, 31, 33, 255, 257, 1000, 4097};
  const size_t blocks[] = {1, 2, 3, 7, 8, 16, 31, 32, 64, 100, 128, 255, 256,
                           1000, 4096, 5000};
  for (size_t n : lengths)
    for (size_t blk : blocks) {
      auto x = draw(rng, n, s.dt, (n + blk) % 2);
      auto in = to_bytes(x, s.dt);
      zpp_quant_config_t c = make_cfg(s.bits, blk, s.asym);
      size_t sz;
      ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
      std::vector<uint8_t> enc(sz), out(n * zpp_dtype_size(s.dt));
      ASSERT_EQ(zpp_quant_encode(&c, s.dt, in.data(), n, enc.data(), sz), ZPP_OK)
          << zpp_get_last_error();
      ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, s.dt, out.data()), ZPP_OK);
      std::string ctx = std::string(zpp_dtype_name(s.dt)) + " bits " +
                        std::to_string(s.bits) + (s.asym ? " asym" : " sym") +
                        " n " + std::to_string(n) + " block " + std::to_string(blk);
      check_block_bounds(x, enc.data(), out.data(), s.dt, s.bits, blk, s.asym, ctx);
      if (HasFailure()) return;
    }
}

TEST_P(QuantRoundTrip, GridValuesRoundTripExactly) {
  Shape s = GetParam();
  auto rng = seeded_rng("GridValues", s.dt * 100 + s.bits * 10 + s.asym);
  const int levels = s.asym ? (1 << s.bits) - 1 : (1 << (s.bits - 1)) - 1;
  const size_t blk = 37, n = 37 * 5 + 11;
  std::uniform_int_distribution<int> code(s.asym ? 0 : -levels, levels);
  std::uniform_int_distribution<int> ex(-6, 3);
  std::vector<float> x(n);
  for (size_t b = 0; b * blk < n; b++) {
    // step 2^e (exact in every dtype), zero point a multiple of the step
    float step = std::ldexp(1.0f, ex(rng));
    // zero point a multiple of the step in [-128, 0] steps, so every value
    // zero + k * step (|.| <= 255 steps) fits bf16's 8 significant bits
    float zero = s.asym ? -step * (float)(code(rng) % 129) : 0.0f;
    size_t off = b * blk, len = std::min(blk, n - off);
    for (size_t i = 0; i < len; i++) x[off + i] = zero + step * (float)code(rng);
    // pin both ends of the range so the scale is exactly `step`
    x[off] = zero + step * (float)levels;
    if (len > 1) x[off + 1] = s.asym ? zero : -step * (float)levels;
  }
  auto in = to_bytes(x, s.dt);
  zpp_quant_config_t c = make_cfg(s.bits, blk, s.asym);
  size_t sz;
  ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
  std::vector<uint8_t> enc(sz), out(n * zpp_dtype_size(s.dt));
  ASSERT_EQ(zpp_quant_encode(&c, s.dt, in.data(), n, enc.data(), sz), ZPP_OK);
  ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, s.dt, out.data()), ZPP_OK);
  for (size_t i = 0; i < n; i++)
    ASSERT_EQ(get(out.data(), s.dt, i), get(in.data(), s.dt, i)) << "element " << i;
}

TEST_P(QuantRoundTrip, ZeroBlocksDecodeToExactZeroAndNonFiniteBlocksToNaN) {
  Shape s = GetParam();
  auto rng = seeded_rng("ZeroAndNaN", s.dt * 100 + s.bits * 10 + s.asym);
  const size_t blk = 16, n = 16 * 6 + 5;
  auto x = draw(rng, n, s.dt, 0);
  for (size_t i = 16; i < 32; i++) x[i] = 0.0f;          // block 1: zeros
  for (size_t i = 32; i < 48; i++) x[i] = -0.0f;         // block 2: -0
  x[48 + 3] = NAN;                                        // block 3: NaN
  x[64 + 15] = INFINITY;                                  // block 4: +Inf
  x[96 + 2] = -INFINITY;                                  // tail: -Inf
  auto in = to_bytes(x, s.dt);
  zpp_quant_config_t c = make_cfg(s.bits, blk, s.asym);
  size_t sz;
  ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
  std::vector<uint8_t> enc(sz), out(n * zpp_dtype_size(s.dt));
  ASSERT_EQ(zpp_quant_encode(&c, s.dt, in.data(), n, enc.data(), sz), ZPP_OK);
  ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, s.dt, out.data()), ZPP_OK);
  for (size_t i = 16; i < 48; i++) EXPECT_EQ(get(out.data(), s.dt, i), 0.0f) << i;
  for (size_t i = 48; i < 80; i++) EXPECT_TRUE(std::isnan(get(out.data(), s.dt, i))) << i;
  for (size_t i = 96; i < n; i++) EXPECT_TRUE(std::isnan(get(out.data(), s.dt, i))) << i;
  // the finite blocks are unaffected
  std::vector<float> x0(x.begin(), x.begin() + 16), x5(x.begin() + 80, x.begin() + 96);
  for (size_t i = 0; i < 16; i++) {
    EXPECT_FALSE(std::isnan(get(out.data(), s.dt, i)));
    EXPECT_FALSE(std::isnan(get(out.data(), s.dt, 80 + i)));
  }
  check_block_bounds(x0, enc.data(), out.data(), s.dt, s.bits, blk, s.asym, "block 0");
}

TEST_P(QuantRoundTrip, UnalignedPointersGiveTheSameBytes) {
  Shape s = GetParam();
  auto rng = seeded_rng("Unaligned", s.dt * 100 + s.bits * 10 + s.asym);
  const size_t n = 1003, blk = 64;
  auto x = draw(rng, n, s.dt, 0);
  auto in = to_bytes(x, s.dt);
  zpp_quant_config_t c = make_cfg(s.bits, blk, s.asym);
  size_t sz;
  ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
  std::vector<uint8_t> enc(sz), enc_u(sz + 3), in_u(in.size() + 3);
  std::memcpy(in_u.data() + 1, in.data(), in.size());
  ASSERT_EQ(zpp_quant_encode(&c, s.dt, in.data(), n, enc.data(), sz), ZPP_OK);
  ASSERT_EQ(zpp_quant_encode(&c, s.dt, in_u.data() + 1, n, enc_u.data() + 3, sz), ZPP_OK);
  ASSERT_EQ(std::memcmp(enc.data(), enc_u.data() + 3, sz), 0);
  std::vector<uint8_t> out(n * 4 + 8), out_u(n * 4 + 8);
  ASSERT_EQ(zpp_quant_decode(&c, enc_u.data() + 3, sz, n, s.dt, out_u.data() + 1), ZPP_OK);
  ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, s.dt, out.data()), ZPP_OK);
  ASSERT_EQ(std::memcmp(out.data(), out_u.data() + 1, n * zpp_dtype_size(s.dt)), 0);
}

TEST_P(QuantRoundTrip, DecodeAccumulateAddsTheDecodedValuesInFp32) {
  Shape s = GetParam();
  auto rng = seeded_rng("DecodeAccumulate", s.dt * 100 + s.bits * 10 + s.asym);
  const size_t n = 777, blk = 50;
  auto x = draw(rng, n, s.dt, 1);
  auto in = to_bytes(x, s.dt);
  zpp_quant_config_t c = make_cfg(s.bits, blk, s.asym);
  size_t sz;
  ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
  std::vector<uint8_t> enc(sz);
  ASSERT_EQ(zpp_quant_encode(&c, s.dt, in.data(), n, enc.data(), sz), ZPP_OK);
  std::vector<float> dec(n), acc = draw(rng, n, ZPP_FLOAT32, 0), acc0 = acc;
  ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, ZPP_FLOAT32, dec.data()), ZPP_OK);
  ASSERT_EQ(zpp_quant_decode_accumulate(&c, enc.data(), sz, n, acc.data()), ZPP_OK);
  for (size_t i = 0; i < n; i++) {
    float want = acc0[i] + dec[i];
    ASSERT_EQ(bits_of(acc[i]), bits_of(want)) << "element " << i;
  }
}

std::string ShapeName(const ::testing::TestParamInfo<Shape> &i) {
  return std::string(zpp_dtype_name(i.param.dt)) + "_int" +
         std::to_string(i.param.bits) + (i.param.asym ? "_asym" : "_sym");
}

std::vector<Shape> AllShapes() {
  std::vector<Shape> v;
  for (zpp_dtype_t dt : kDtypes)
    for (int bits : {8, 4})
      for (bool asym : {false, true}) v.push_back({dt, bits, asym});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllShapes, QuantRoundTrip, ::testing::ValuesIn(AllShapes()),
                         ShapeName);

// ---- edge values ---------------------------------------------------------------

// Constant blocks are exact in asymmetric mode (zero = the constant,
// scale 0); symmetric mode has no zero point, so the claim is asym only.
TEST(QuantEdges, ConstantBlocksAsymmetricDecodeExactly) {
  for (zpp_dtype_t dt : kDtypes)
    for (int bits : {8, 4}) {
      auto rng = seeded_rng("ConstantBlocks", dt * 100 + bits);
      const size_t blk = 10, n = 47;
      std::vector<float> x(n);
      std::normal_distribution<float> normal(0.0f, 100.0f);
      for (size_t b = 0; b * blk < n; b++) {
        float v = representable(normal(rng), dt);
        for (size_t i = b * blk; i < std::min(n, (b + 1) * blk); i++) x[i] = v;
      }
      auto in = to_bytes(x, dt);
      zpp_quant_config_t c = make_cfg(bits, blk, true);
      size_t sz;
      ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
      std::vector<uint8_t> enc(sz), out(n * zpp_dtype_size(dt));
      ASSERT_EQ(zpp_quant_encode(&c, dt, in.data(), n, enc.data(), sz), ZPP_OK);
      ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, dt, out.data()), ZPP_OK);
      for (size_t i = 0; i < n; i++)
        EXPECT_EQ(get(out.data(), dt, i), x[i]) << zpp_dtype_name(dt) << " int" << bits << " " << i;
    }
}

TEST(QuantEdges, LengthZeroIsANoOpAndAllowsNullBuffers) {
  zpp_quant_config_t c = make_cfg(8, 32, false);
  size_t sz = 99;
  ASSERT_EQ(zpp_quant_encoded_size(&c, 0, &sz), ZPP_OK);
  EXPECT_EQ(sz, 0u);
  EXPECT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, nullptr, 0, nullptr, 0), ZPP_OK);
  EXPECT_EQ(zpp_quant_decode(&c, nullptr, 0, 0, ZPP_FLOAT32, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_quant_decode_accumulate(&c, nullptr, 0, 0, nullptr), ZPP_OK);
}

TEST(QuantEdges, SubnormalAndHugeBlocksStayWithinBound) {
  // bf16 keeps fp32's range: tiny and huge values must survive (an fp16
  // detour would flush them to 0 or Inf).
  for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16})
    for (int bits : {8, 4})
      for (bool asym : {false, true}) {
        std::vector<float> x = {1e-45f, -3e-45f, 7e-45f, 0.0f,      // subnormal
                                1e-40f, 2e-39f, -5e-41f, 1e-42f,    // subnormal
                                3e38f, -1e38f, 2.5e37f, 1e30f,      // huge
                                1e-30f, -2e-30f, 3e-31f, 1e-32f};   // tiny normal
        if (asym) x[9] = 1e38f;  // keep max - min finite (docs/format.md)
        for (auto &v : x) v = representable(v, dt);
        auto in = to_bytes(x, dt);
        zpp_quant_config_t c = make_cfg(bits, 4, asym);
        size_t sz;
        ASSERT_EQ(zpp_quant_encoded_size(&c, x.size(), &sz), ZPP_OK);
        std::vector<uint8_t> enc(sz), out(x.size() * zpp_dtype_size(dt));
        ASSERT_EQ(zpp_quant_encode(&c, dt, in.data(), x.size(), enc.data(), sz), ZPP_OK);
        ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, x.size(), dt, out.data()), ZPP_OK);
        check_block_bounds(x, enc.data(), out.data(), dt, bits, 4, asym,
                           std::string(zpp_dtype_name(dt)) + " extreme");
        float big = get(out.data(), dt, 8);
        EXPECT_TRUE(std::isfinite(big) && big > 1e38f) << big;
      }
}

TEST(QuantEdges, AsymmetricRangeBeyondFltMaxIsNonFinite) {
  float x[4] = {3e38f, -3e38f, 1.0f, 2.0f};
  zpp_quant_config_t c = make_cfg(8, 2, true);
  uint8_t enc[20];
  float out[4];
  ASSERT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, x, 4, enc, sizeof enc), ZPP_OK);
  ASSERT_EQ(zpp_quant_decode(&c, enc, sizeof enc, 4, ZPP_FLOAT32, out), ZPP_OK);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  EXPECT_NEAR(out[2], 1.0f, 1.0f / 255);
  EXPECT_NEAR(out[3], 2.0f, 1.0f / 255);
}

// ---- conversions ------------------------------------------------------------------

TEST(QuantConvert, F16AndBf16RoundToNearestEvenLikeFloat64Reference) {
  auto rng = seeded_rng("Convert");
  std::uniform_int_distribution<uint32_t> u32;
  for (int i = 0; i < 2000000; i++) {
    uint32_t b = u32(rng);
    if (i < 1000) b = (uint32_t)i << 13 | (i & 1 ? 0x1000u : 0);  // half ties
    float f = f32_from_bits(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(zpp_qm_f32_to_f16(f))));
      EXPECT_TRUE(std::isnan(bf16_to_float(zpp_qm_f32_to_bf16(f))));
      continue;
    }
    double rh = round_to_format(f, 10, -14);
    if (std::fabs(rh) > 65504.0) rh = std::copysign(INFINITY, f);
    float h = half_to_float(zpp_qm_f32_to_f16(f));
    ASSERT_EQ(bits_of(h), bits_of((float)rh)) << "fp16 of " << f << " bits " << b;
    ASSERT_EQ(bits_of(zpp_qm_f16_to_f32(zpp_qm_f32_to_f16(f))), bits_of(h));
    double rb = round_to_format(f, 7, -126);
    if (std::fabs(rb) > 3.3895313892515355e38) rb = std::copysign(INFINITY, f);
    ASSERT_EQ(bits_of(bf16_to_float(zpp_qm_f32_to_bf16(f))), bits_of((float)rb))
        << "bf16 of " << f;
  }
}

// ---- pipeline chunks (coll/coll.h) -----------------------------------------

// zpp_plan_chunk, the chunk of qwZ's and qgZ's pipelines, by its contract
// (src/coll/coll.h) checked property by property on random counts, blocks,
// part counts and minimums: the count itself when the setting is 0 or one
// chunk would hold it all, else whole blocks, at least the minimum and
// count / parts, less than one block above the larger of the two, and
// short of the count.  Then the edge cases of the contract, and the sizes
// of the real-link runs of docs/bench/real_links.md (qwZ's 32 chunks per
// call at 16 MiB).
TEST(PlanChunk, WholeBlocksAboutCountOverPartsAtLeastTheMinimum) {
  ScopedEnv keep("ZPP_PIPE_MIN_CHUNK", "65536", zpp_settings_reload);
  auto rng = seeded_rng("PlanChunk");
  for (int it = 0; it < 4000; it++) {
    size_t count = (size_t)(rng() % (it % 2 ? 50000000u : 5000u)) + 1;
    size_t block = (size_t)(rng() % (it % 3 ? 300u : 5000u)) + 1;
    size_t parts = (size_t)(rng() % 64) + 1;
    long min = it % 10 == 0 ? 0 : (long)(rng() % 200000);
    setenv("ZPP_PIPE_MIN_CHUNK", std::to_string(min).c_str(), 1);
    zpp_settings_reload();
    size_t c = zpp_plan_chunk(count, block, parts);
    std::string what = "count " + std::to_string(count) + " block " +
                       std::to_string(block) + " parts " + std::to_string(parts) +
                       " min " + std::to_string(min);
    size_t want = count / parts > (size_t)min ? count / parts : (size_t)min;
    // one chunk: pipelining off, or the rounded target reaches the count
    if (min == 0 || (want + block - 1) / block * block >= count) {
      EXPECT_EQ(c, count) << what;
      continue;
    }
    EXPECT_EQ(c % block, 0u) << what;
    EXPECT_GE(c, (size_t)min) << what;
    EXPECT_GE(c, count / parts) << what;
    EXPECT_LT(c - block, want) << what;
    EXPECT_LT(c, count) << what;
  }
  setenv("ZPP_PIPE_MIN_CHUNK", "65536", 1);
  zpp_settings_reload();
  // qwZ (32 parts), block 256: a 16 MiB bf16 shard (8 Mi elements) in 32
  // chunks of 256 Ki, a 4 MiB one in 32 of 64 Ki; qgZ (8 parts): the 16 MiB
  // input's slice at 2 x 4 (1 Mi) in 8 of 128 Ki, 256 KiB input: one chunk
  EXPECT_EQ(zpp_plan_chunk(8u << 20, 256, 32), 256u << 10);
  EXPECT_EQ(zpp_plan_chunk(2u << 20, 256, 32), 64u << 10);
  EXPECT_EQ(zpp_plan_chunk(1u << 20, 256, 8), 128u << 10);
  EXPECT_EQ(zpp_plan_chunk(16u << 10, 256, 8), 16u << 10);
  // block 0 and a chunk past SIZE_MAX: one chunk; parts 0 counts as 1
  EXPECT_EQ(zpp_plan_chunk(1u << 20, 0, 8), 1u << 20);
  EXPECT_EQ(zpp_plan_chunk(SIZE_MAX, SIZE_MAX / 2, 1), SIZE_MAX);
  EXPECT_EQ(zpp_plan_chunk(1u << 20, 256, 0), 1u << 20);
  EXPECT_EQ(zpp_plan_chunk(1u << 20, 256, 1), 1u << 20);
}

// ---- software prefetch (quant_cpu.h) ---------------------------------------

// One call against its contract, computed here from the arguments: the
// 64-byte steps from *done below min(upto, end), without the first ones
// when they span more than 2 * AHEAD; *done then the first step at or
// past min(upto, end); nothing when *done is already there.
TEST(QuantPrefetch, ACallRequestsItsSpanInsideTheBuffer) {
  auto rng = seeded_rng("QuantPrefetch.ACall");
  const size_t A = ZPP_QCPU_PREFETCH_AHEAD;
  for (int trial = 0; trial < 2000; trial++) {
    size_t end = (size_t)(rng() % 200000);
    size_t done = (size_t)(rng() % (end + 300));
    size_t upto = (size_t)(rng() % (end + 6000));
    std::vector<char> mem(end + 1);
    g_pf_base = mem.data();
    g_pf.clear();
    size_t d = done;
    zpp_qcpu_prefetch(mem.data(), &d, upto, end);
    size_t u = upto < end ? upto : end;
    std::vector<size_t> want;
    size_t lo = done, x;
    while (u > lo && u - lo > 2 * A)
      lo += 64;
    for (x = lo; x < u; x += 64)
      want.push_back(x);
    ASSERT_EQ(g_pf, want) << "end " << end << " done " << done << " upto " << upto;
    ASSERT_EQ(d, done >= u ? done : x) << "end " << end << " done " << done;
    for (size_t o : g_pf)
      ASSERT_LT(o, end);
  }
}

// An encoder's sweep (quant_avx2.c / quant_avx512.c: before block b, up to
// the end of the block plus AHEAD): every request inside the buffer, each
// step once and in order; blocks of at most AHEAD bytes get every step of
// the buffer, longer ones at most 2 * AHEAD bytes of requests per block.
TEST(QuantPrefetch, AnEncodersSweepCoversTheBufferOnce) {
  auto rng = seeded_rng("QuantPrefetch.Sweep");
  const size_t A = ZPP_QCPU_PREFETCH_AHEAD;
  const size_t blocks[] = {1, 3, 16, 32, 256, 1000, 1024, 4096, 100000};
  for (size_t es : {(size_t)2, (size_t)4})
    for (size_t block : blocks)
      for (int trial = 0; trial < 4; trial++) {
        size_t count = (size_t)(rng() % 70000), end = count * es, pf = 0;
        std::vector<char> mem(end + 1);
        std::vector<size_t> all;
        g_pf_base = mem.data();
        for (size_t off = 0; off < count; off += block) {
          size_t len = count - off < block ? count - off : block;
          g_pf.clear();
          zpp_qcpu_prefetch(mem.data(), &pf, (off + len) * es + A, end);
          ASSERT_LE(g_pf.size() * 64, 2 * A) << "block " << block;
          all.insert(all.end(), g_pf.begin(), g_pf.end());
        }
        for (size_t i = 0; i < all.size(); i++) {
          ASSERT_LT(all[i], end) << "es " << es << " block " << block;
          ASSERT_EQ(all[i] % 64, 0u) << "off the grid of *done = 0";
          if (i > 0) {
            ASSERT_GT(all[i], all[i - 1]) << "a step requested twice";
          }
        }
        if (block * es <= A) {
          ASSERT_EQ(all.size(), (end + 63) / 64)
              << "es " << es << " block " << block << " count " << count;
        }
      }
}

// ---- the reduction of the host algorithms (elementwise.h) -------------------

// zpp_ew_reduce_blocks_host, in tiles, against (1) the per-element scalar
// loop it replaced (zpp_qm_load / zpp_qm_add / zpp_qm_store, block order,
// one rounding): bit for bit, specials included (a NaN's payload aside);
// (2) the float64 sum of the
// same inputs on finite data: within (n - 1) * 2^-24 * sum|x| of the fp32
// additions, plus the fp32 division of a mean (2^-24 |r|), plus half a unit
// of the output dtype (2^-24, 2^-11, 2^-8 relative to the fp32 result, so
// (1 + that) times the fp32 errors; fp16 subnormals 2^-25 absolute).
// Every dtype pair, block counts 1..9, lengths around the 512-element
// tile, odd byte offsets (the host algorithms accept any alignment), sum
// and mean, and dst = one of the blocks (in place).
TEST(QuantElementwise, ReduceBlocksIsBitwiseThePerElementLoopAndNearFloat64) {
  auto rng = seeded_rng("ReduceBlocks");
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> u32;
  const int dts[] = {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16};
  const size_t sizes[] = {0, 1, 7, 511, 512, 513, 1536, 2049};
  const int ns[] = {1, 2, 3, 4, 8, 9};
  auto esz = [](int dt) { return dt == ZPP_QM_F32 ? 4 : 2; };
  auto rel = [](int dt) {
    return dt == ZPP_QM_F32 ? std::ldexp(1.0, -24)
                            : dt == ZPP_QM_F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  };
  int cases = 0;
  for (int it : dts)
    for (int ot : dts)
      for (size_t count : sizes)
        for (int n : ns)
          for (int special = 0; special < 2; special++) {
            float div = (cases % 3 == 0) ? 0.0f : (float)n;
            // n input blocks, each at an odd byte offset in its own buffer
            std::vector<std::vector<unsigned char>> in(n);
            std::vector<const void *> blocks(n);
            for (int i = 0; i < n; i++) {
              in[i].resize(count * esz(it) + 1);
              for (size_t e = 0; e < count; e++) {
                float v = nd(rng) * (float)(1 << (e % 7));
                if (special && u32(rng) % 16 == 0) {
                  const float sp[] = {NAN, INFINITY, -INFINITY, 1e-40f, 7e4f, 3e38f};
                  v = sp[u32(rng) % 6];
                }
                zpp_qm_store(in[i].data() + 1, e, it, v);
              }
              blocks[i] = in[i].data() + 1;
            }
            // 3 guard bytes either side of the output
            std::vector<unsigned char> got(count * esz(ot) + 6, 0xa5), want(got);
            zpp_ew_reduce_blocks_host(1, got.data() + 3, ot, blocks.data(), it, n, count, div);
            {  // the scalar rounding (simd 0): the same bytes as the AVX2 one
              std::vector<unsigned char> sc(got.size(), 0xa5);
              zpp_ew_reduce_blocks_host(0, sc.data() + 3, ot, blocks.data(), it, n, count, div);
              ASSERT_EQ(0, std::memcmp(sc.data(), got.data(), got.size()))
                  << "simd 0 and 1 differ; count " << count << ", n " << n << ", in " << it
                  << ", out " << ot << ", div " << div << ", specials " << special;
            }
            for (size_t e = 0; e < count; e++) {
              float acc = zpp_qm_load(blocks[0], e, it);
              double sum = acc, mag = std::fabs(acc);
              for (int i = 1; i < n; i++) {
                float x = zpp_qm_load(blocks[i], e, it);
                acc = zpp_qm_add(acc, x);
                sum += x;
                mag += std::fabs(x);
              }
              zpp_qm_store(want.data() + 3, e, ot, div > 0 ? acc / div : acc);
              float r = zpp_qm_load(got.data() + 3, e, ot);
              if (!special && std::isfinite(r)) {
                double ref = div > 0 ? sum / div : sum, m = div > 0 ? mag / div : mag;
                // the output rounding is relative to the fp32 result, not to
                // ref: the fp32 errors count (1 + rel) times (1.0001: the
                // second-order terms)
                double bound = ((n - 1) * std::ldexp(1.0, -24) * m +
                                std::ldexp(1.0, -24) * std::fabs(ref)) * (1 + rel(ot)) * 1.0001 +
                               rel(ot) * std::fabs(ref) * 1.0001 + std::ldexp(1.0, -25);
                ASSERT_LE(std::fabs((double)r - ref), bound)
                    << "element " << e << " of " << count << ", n " << n << ", in " << it
                    << ", out " << ot << ", div " << div;
              }
            }
            // bit for bit, but for the payload of a NaN (which operand's
            // payload an addition of two NaNs keeps is the compiler's
            // choice: it may commute the operands); the bytes either side
            // of the output are untouched
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), 3)) << "wrote before dst";
            ASSERT_EQ(0, std::memcmp(got.data() + 3 + count * esz(ot),
                                     want.data() + 3 + count * esz(ot), 3))
                << "wrote past dst";
            for (size_t e = 0; e < count; e++) {
              float g = zpp_qm_load(got.data() + 3, e, ot), w = zpp_qm_load(want.data() + 3, e, ot);
              if (std::isnan(g) && std::isnan(w)) continue;
              ASSERT_EQ(0, std::memcmp(got.data() + 3 + e * esz(ot), want.data() + 3 + e * esz(ot),
                                       esz(ot)))
                  << "element " << e << ": " << g << " against " << w << "; count " << count
                  << ", n " << n << ", in " << it << ", out " << ot << ", div " << div
                  << ", specials " << special;
            }
            // in place (the in-place allreduce: dst is block k itself), when
            // the output is no wider than the input: the same bytes
            if (esz(ot) <= esz(it) && count > 0) {
              int k = cases % n;
              std::vector<unsigned char> inpl(in[k]);
              std::vector<const void *> b2(blocks);
              b2[k] = inpl.data() + 1;
              zpp_ew_reduce_blocks_host(cases % 2, inpl.data() + 1, ot, b2.data(), it, n, count,
                                        div);
              for (size_t e = 0; e < count; e++) {
                float g = zpp_qm_load(inpl.data() + 1, e, ot), w = zpp_qm_load(want.data() + 3, e, ot);
                if (std::isnan(g) && std::isnan(w)) continue;
                ASSERT_EQ(0, std::memcmp(inpl.data() + 1 + e * esz(ot),
                                         want.data() + 3 + e * esz(ot), esz(ot)))
                    << "in place (dst = block " << k << "): element " << e << ": " << g
                    << " against " << w << "; count " << count << ", n " << n << ", in " << it
                    << ", out " << ot << ", div " << div;
              }
            }
            cases++;
          }
  std::printf("%d cases bitwise equal to the per-element loop\n", cases);
}

// The other tiled element-wise loops against plain per-element loops of
// zpp_qm_load / zpp_qm_store, bit for bit (NaN payloads aside): finish
// (fp32 accumulators to the dtype, sum and mean; scalar and AVX2), scale
// (in place), to_f32 (scalar and AVX2) and add_residual; every dtype,
// lengths around the tile and the 16 elements of an AVX2 step, odd
// alignment, specials.
TEST(QuantElementwise, FinishScaleAndResidualAreBitwiseThePerElementLoops) {
  auto rng = seeded_rng("ElementwiseTiles");
  std::normal_distribution<float> nd(0.0f, 100.0f);
  std::uniform_int_distribution<uint32_t> u32;
  auto fb = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  // specials, and bf16 rounding ties (to even: down, up), the largest
  // float (rounds to Inf) and a signalling NaN (quietened)
  const float sp[] = {NAN,           INFINITY,          -INFINITY,        1e-40f,
                      7e4f,          3e38f,             -0.0f,            fb(0x3f808000u),
                      fb(0xbf818000u), fb(0x7f7fffffu), fb(0x7f800001u)};
  const uint32_t nsp = sizeof sp / sizeof sp[0];
  auto same = [](const unsigned char *a, const unsigned char *b, size_t e, int dt) {
    float x = zpp_qm_load(a, e, dt), y = zpp_qm_load(b, e, dt);
    size_t es = dt == ZPP_QM_F32 ? 4 : 2;
    return (std::isnan(x) && std::isnan(y)) || std::memcmp(a + e * es, b + e * es, es) == 0;
  };
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (size_t count : {(size_t)0, (size_t)1, (size_t)15, (size_t)16, (size_t)33,
                         (size_t)511, (size_t)512, (size_t)1025})
      for (float div : {1.0f, 8.0f, 3.0f}) {
        size_t es = dt == ZPP_QM_F32 ? 4 : 2;
        std::vector<float> acc(count), res(count);
        std::vector<unsigned char> buf(count * es + 1);
        for (size_t e = 0; e < count; e++) {
          acc[e] = u32(rng) % 8 == 0 ? sp[u32(rng) % nsp] : nd(rng);
          res[e] = u32(rng) % 8 == 0 ? sp[u32(rng) % nsp] : nd(rng);
          zpp_qm_store(buf.data() + 1, e, dt, u32(rng) % 8 == 0 ? sp[u32(rng) % nsp] : nd(rng));
        }
        std::vector<unsigned char> got(count * es + 1), want(count * es + 1);
        for (size_t e = 0; e < count; e++)
          zpp_qm_store(want.data() + 1, e, dt, div == 1.0f ? acc[e] : acc[e] / div);
        for (int simd : {0, 1}) {  // the scalar and the AVX2 bf16 rounding
          zpp_ew_finish_host(simd, acc.data(), count, div, dt, got.data() + 1);
          for (size_t e = 0; e < count; e++)
            ASSERT_TRUE(same(got.data() + 1, want.data() + 1, e, dt))
                << "finish: element " << e << " of " << count << ", dtype " << dt << ", div "
                << div << ", simd " << simd;
          // in place: out is acc itself, as the per-element loop allowed
          std::vector<float> inpl(acc);
          zpp_ew_finish_host(simd, inpl.data(), count, div, dt, inpl.data());
          for (size_t e = 0; e < count; e++)
            ASSERT_TRUE(same((const unsigned char *)inpl.data(), want.data() + 1, e, dt))
                << "finish in place: element " << e << " of " << count << ", dtype " << dt
                << ", div " << div << ", simd " << simd;
        }
        got = buf;
        want = buf;
        zpp_ew_scale_host(dt, got.data() + 1, count, div);
        for (size_t e = 0; e < count; e++)
          zpp_qm_store(want.data() + 1, e, dt, zpp_qm_load(want.data() + 1, e, dt) / div);
        for (size_t e = 0; e < count; e++)
          ASSERT_TRUE(same(got.data() + 1, want.data() + 1, e, dt))
              << "scale: element " << e << " of " << count << ", dtype " << dt << ", div " << div;
        std::vector<float> out(count), ref(count);
        for (int simd : {0, 1}) {  // to_f32: the conversion, in AVX2 for bf16
          std::fill(out.begin(), out.end(), 12345.0f);
          zpp_ew_to_f32_host(simd, dt, buf.data() + 1, count, out.data());
          for (size_t e = 0; e < count; e++) {
            float w = zpp_qm_load(buf.data() + 1, e, dt);
            ASSERT_TRUE((std::isnan(out[e]) && std::isnan(w)) || bits_of(out[e]) == bits_of(w))
                << "to_f32: element " << e << " of " << count << ", dtype " << dt << ", simd "
                << simd;
          }
        }
        zpp_ew_add_residual_host(dt, buf.data() + 1, res.data(), count, out.data());
        for (size_t e = 0; e < count; e++) {
          ref[e] = zpp_qm_add(zpp_qm_load(buf.data() + 1, e, dt), res[e]);
          ASSERT_TRUE((std::isnan(out[e]) && std::isnan(ref[e])) || bits_of(out[e]) == bits_of(ref[e]))
              << "add_residual: element " << e << " of " << count << ", dtype " << dt;
        }
      }
}

// zpp_ew_encode_ef_host (error feedback fused with the encode, in tiles of
// whole blocks) against the unfused sequence it replaced, on the scalar
// path: x = fp32(g) + res (zpp_qm_add), one encode of the whole call,
// its decode, res = x - decode (0 where not finite) or LoCo's moving
// average.  The encoded bytes and the new residual bit for bit (NaN
// payloads aside), every CPU path, every dtype, 8 and 4 bits, symmetric
// and asymmetric, stochastic rounding at a non-zero base, lengths around
// the tile with tail blocks, odd block sizes, special values in g and in
// the residual; a block longer than the tile returns -1 and writes nothing.
TEST(QuantElementwise, EncodeWithErrorFeedbackIsBitwiseTheUnfusedSequence) {
  auto rng = seeded_rng("EncodeEF");
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<uint32_t> u32;
  const float sp[] = {NAN, INFINITY, -INFINITY, 1e-40f, 3e38f, -0.0f};
  const zpp_quant_cpu_ops_t *scalar = zpp_quant_cpu_ops_named("scalar");
  const size_t blocks[] = {1, 3, 7, 64, 255, 256, 1000, 1024, 1025};
  const size_t counts[] = {0, 1, 255, 1024, 1025, 3001};
  int cases = 0, fused = 0;
  for (const char *isa : {"scalar", "avx2", "avx512"}) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr) {
      std::printf("%s: not built or not supported by this CPU\n", isa);
      continue;
    }
    for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
      for (int bits : {8, 4})
        for (int asym : {0, 1})
          for (size_t blk : blocks)
            for (size_t count : counts)
              for (float beta : {0.0f, 0.8f}) {
                if (count > 1100 && blk < 64) continue;  // keep the run short
                zpp_qcfg_t q{};
                q.bits = bits;
                q.asym = asym;
                q.block = blk;
                q.sr = (int)(u32(rng) % 2);
                q.k0 = u32(rng);
                q.k1 = u32(rng);
                q.base = u32(rng) % 100000;
                size_t es = dt == ZPP_QM_F32 ? 4 : 2;
                int special = cases % 3 == 0;
                std::vector<unsigned char> g(count * es + 1);
                std::vector<float> res(count);
                for (size_t e = 0; e < count; e++) {
                  float scale = (float)(1 << (e / blk % 5));  // blocks of differing range
                  float v = special && u32(rng) % 32 == 0 ? sp[u32(rng) % 6] : nd(rng) * scale;
                  zpp_qm_store(g.data() + 1, e, dt, v);
                  res[e] = special && u32(rng) % 32 == 0 ? sp[u32(rng) % 6] : nd(rng) * 0.01f;
                }
                int ovf = 0;
                size_t eb = zpp_quant_bytes(&q, count, &ovf);
                ASSERT_EQ(0, ovf);
                // the unfused sequence on the scalar path
                std::vector<float> x(count), dec(count), want_res(res);
                std::vector<unsigned char> want(eb + 4, 0x5a), got(eb + 4, 0x5a);
                for (size_t e = 0; e < count; e++)
                  x[e] = zpp_qm_add(zpp_qm_load(g.data() + 1, e, dt), res[e]);
                if (count > 0) {
                  scalar->encode(&q, ZPP_QM_F32, x.data(), count, want.data());
                  scalar->decode(&q, want.data(), count, ZPP_QM_F32, dec.data());
                }
                for (size_t e = 0; e < count; e++) {
                  if (beta == 0.0f) {
                    float d = x[e] - dec[e];
                    want_res[e] = std::isfinite(d) ? d : 0.0f;
                  } else {
                    want_res[e] = zpp_qm_ema_residual(res[e], x[e], dec[e], beta, 1.0f - beta);
                  }
                }
                std::vector<float> got_res(res);
                int rc = zpp_ew_encode_ef_host(ops, &q, dt, g.data() + 1, count, got_res.data(),
                                               beta, got.data());
                cases++;
                if (blk > ZPP_EW_EF_TILE) {  // too long for a tile: nothing written
                  ASSERT_EQ(-1, rc) << "block " << blk;
                  for (size_t e = 0; e < count; e++)
                    ASSERT_EQ(bits_of(res[e]), bits_of(got_res[e])) << "res written, block " << blk;
                  for (size_t b = 0; b < got.size(); b++)
                    ASSERT_EQ(0x5a, got[b]) << "dst written, block " << blk;
                  continue;
                }
                ASSERT_EQ(0, rc);
                fused++;
                const std::string what = std::string(isa) + ", dtype " + std::to_string(dt) +
                                         ", bits " + std::to_string(bits) + ", asym " +
                                         std::to_string(asym) + ", block " + std::to_string(blk) +
                                         ", count " + std::to_string(count) + ", sr " +
                                         std::to_string(q.sr) + ", beta " + std::to_string(beta);
                for (size_t b = 0; b < got.size(); b++)  // the 4 bytes past it too
                  ASSERT_EQ(want[b], got[b]) << "encoded byte " << b << " of " << eb << ": " << what;
                for (size_t e = 0; e < count; e++)
                  ASSERT_TRUE((std::isnan(got_res[e]) && std::isnan(want_res[e])) ||
                              bits_of(got_res[e]) == bits_of(want_res[e]))
                      << "residual " << e << ": " << got_res[e] << " against " << want_res[e]
                      << ": " << what;
              }
  }
  std::printf("%d cases, %d fused, bitwise the unfused sequence\n", cases, fused);
  ASSERT_GT(fused, 0);
}

// zpp_ew_sum_decoded_host (qgZ's stage 1 on the host: the own slice and
// the other ranks' messages summed in one pass of L1 tiles) against the
// passes it replaces on the scalar path: out = fp32(own), then each source
// decode-accumulated in order.  Bit for bit (NaN payloads aside), every
// ISA, dtype, width, mode, blocks around the tile (a block longer than
// ZPP_EW_EF_TILE returns -1 with nothing written), tails, 0..3 sources
// (all four where the count spans tiles), the scalar and the AVX2
// conversion of the own slice (drawn per case).
TEST(QuantElementwise, SumOfDecodedSourcesIsBitwiseThePasses) {
  auto rng = seeded_rng("SumDecoded");
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<uint32_t> u32;
  const float sp[] = {NAN, INFINITY, -INFINITY, 1e-40f, 3e38f, -0.0f};
  const zpp_quant_cpu_ops_t *scalar = zpp_quant_cpu_ops_named("scalar");
  const size_t blocks[] = {1, 7, 64, 256, 1000, 1024, 1025};
  // 3001 with block 1000: 4 tiles; 17409 (17 tiles of 1024 and one
  // element), block 1024 only
  const size_t counts[] = {0, 1, 255, 1024, 1025, 3001, 17409};
  int cases = 0, fused = 0;
  for (const char *isa : {"scalar", "avx2", "avx512"}) {
    const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(isa);
    if (ops == nullptr) {
      std::printf("%s: not built or not supported by this CPU\n", isa);
      continue;
    }
    for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
      for (int bits : {8, 4})
        for (int asym : {0, 1})
          for (size_t blk : blocks)
            for (size_t count : counts) {
              if (count > 1100 && blk < 64) continue;  // keep the run short
              if (count > 3001 && blk != 1024) continue;
              // across tile boundaries (count > one tile) every source count;
              // below, one drawn from the case's parameters
              int lo = 0, hi = 3;
              if (count <= ZPP_EW_EF_TILE)
                lo = hi = (int)((blk * 31 + count * 7 + (size_t)bits + (size_t)asym * 3 +
                                 (size_t)dt * 5) % 4);
              for (int n = lo; n <= hi; n++) {
                int simd = (int)(u32(rng) % 2);
                zpp_qcfg_t q{};
                q.bits = bits;
                q.asym = asym;
                q.block = blk;
                size_t es = dt == ZPP_QM_F32 ? 4 : 2;
                int special = cases % 3 == 0;
                auto value = [&](size_t e) {
                  float scale = (float)(1 << (e / blk % 5));  // blocks of differing range
                  return special && u32(rng) % 32 == 0 ? sp[u32(rng) % 6] : nd(rng) * scale;
                };
                std::vector<unsigned char> own(count * es + 1);
                for (size_t e = 0; e < count; e++) zpp_qm_store(own.data() + 1, e, dt, value(e));
                int ovf = 0;
                size_t eb = zpp_quant_bytes(&q, count, &ovf);
                ASSERT_EQ(0, ovf);
                std::vector<std::vector<unsigned char>> enc(n, std::vector<unsigned char>(eb + 1));
                std::vector<const uint8_t *> srcs(n);
                for (int j = 0; j < n; j++) {
                  std::vector<float> x(count);
                  for (size_t e = 0; e < count; e++) x[e] = value(e);
                  if (count > 0) scalar->encode(&q, ZPP_QM_F32, x.data(), count, enc[j].data() + 1);
                  srcs[j] = enc[j].data() + 1;  // odd alignment
                }
                std::vector<float> want(count + 2, 777.0f), got(count + 2, 777.0f);
                for (size_t e = 0; e < count; e++) want[e] = zpp_qm_load(own.data() + 1, e, dt);
                for (int j = 0; j < n && count > 0; j++)
                  scalar->decode(&q, srcs[j], count, ZPP_QM_OUT_ACC, want.data());
                int rc = zpp_ew_sum_decoded_host(ops, &q, simd, dt, own.data() + 1, srcs.data(), n,
                                                 count, got.data());
                cases++;
                if (blk > ZPP_EW_EF_TILE) {  // too long for a tile: nothing written
                  ASSERT_EQ(-1, rc) << "block " << blk;
                  for (float v : got) ASSERT_EQ(777.0f, v) << "out written, block " << blk;
                  continue;
                }
                ASSERT_EQ(0, rc);
                fused++;
                for (size_t e = 0; e < count + 2; e++)  // the 2 floats past it too
                  ASSERT_TRUE((std::isnan(got[e]) && std::isnan(want[e])) ||
                              bits_of(got[e]) == bits_of(want[e]))
                      << "element " << e << " of " << count << ": " << got[e] << " against "
                      << want[e] << "; " << isa << ", dtype " << dt << ", bits " << bits
                      << ", asym " << asym << ", block " << blk << ", sources " << n << ", simd "
                      << simd;
              }
            }
  }
  std::printf("%d cases, %d fused, bitwise the passes\n", cases, fused);
  ASSERT_GT(fused, 0);
}

// The collectives' entry, zpp_k_sum_decoded on host memory: the tiles where
// the block fits one (zpp_quant_sum_decoded reports fused), the passes
// where it does not (block 2048 > ZPP_EW_EF_TILE), no source (a null
// table), and count 0 (nothing written).  Reference: fp32(own) by
// zpp_qm_load, then the public zpp_quant_decode_accumulate per source.
TEST(QuantElementwise, SumDecodedEntryTakesTheTilesOrThePasses) {
  auto rng = seeded_rng("SumDecodedEntry");
  std::normal_distribution<float> nd(0.0f, 2.0f);
  zpp_exec_t ex{};
  ex.mem = ZPP_MEMORY_HOST;
  for (size_t blk : {size_t(64), size_t(2048)})
    for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16})
      for (int n : {0, 3})
        for (size_t count : {size_t(0), size_t(5000)}) {
          zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
          q.bits = 4;
          q.block_size = blk;
          size_t es = zpp_dtype_size(dt), eb = 0;
          int qdt = dt == ZPP_FLOAT32 ? ZPP_QM_F32 : ZPP_QM_BF16;
          ASSERT_EQ(ZPP_OK, zpp_quant_encoded_size(&q, count, &eb));
          std::vector<unsigned char> own(count * es);
          for (size_t e = 0; e < count; e++) zpp_qm_store(own.data(), e, qdt, nd(rng));
          std::vector<std::vector<unsigned char>> enc(n, std::vector<unsigned char>(eb + 1));
          std::vector<const void *> srcs(n);
          for (int j = 0; j < n; j++) {
            std::vector<float> x(count);
            for (float &v : x) v = nd(rng);
            ASSERT_EQ(ZPP_OK, zpp_quant_encode(&q, ZPP_FLOAT32, x.data(), count, enc[j].data(), eb));
            srcs[j] = enc[j].data();
          }
          std::vector<float> want(count + 1, 777.0f), got(count + 1, 777.0f);
          for (size_t e = 0; e < count; e++) want[e] = zpp_qm_load(own.data(), e, qdt);
          for (int j = 0; j < n; j++)
            ASSERT_EQ(ZPP_OK, zpp_quant_decode_accumulate(&q, srcs[j], eb, count, want.data()));
          int fused = -1;
          ASSERT_EQ(ZPP_OK, zpp_quant_sum_decoded(&q, dt, own.data(), n ? srcs.data() : nullptr, n,
                                                  count, got.data(), &fused))
              << zpp_get_last_error();
          EXPECT_EQ(count == 0 || blk <= ZPP_EW_EF_TILE, fused == 1) << "block " << blk;
          std::fill(got.begin(), got.end(), 777.0f);
          ASSERT_EQ(ZPP_OK, zpp_k_sum_decoded(&ex, &q, dt, own.data(), n ? srcs.data() : nullptr,
                                              n, count, got.data()))
              << zpp_get_last_error();
          for (size_t e = 0; e < count + 1; e++)  // the float past it too
            ASSERT_EQ(bits_of(want[e]), bits_of(got[e]))
                << "element " << e << " of " << count << ", block " << blk << ", dtype " << dt
                << ", sources " << n;
        }
}

// ---- SIMD paths against the scalar reference --------------------------------------

class QuantSimd : public ::testing::TestWithParam<const char *> {};

TEST_P(QuantSimd, EncodeAndDecodeAreBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(GetParam());
  if (ops == nullptr)
    GTEST_SKIP() << GetParam() << " path not built or not supported by this CPU";
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  auto rng = seeded_rng("QuantSimd");
  const size_t lengths[] = {1, 5, 8, 15, 16, 17, 63, 64, 65, 1000, 4097, 70001};
  const size_t blocks[] = {1, 3, 7, 8, 9, 15, 16, 17, 32, 33, 64, 127, 256,
                           1024, 4096};
  std::uniform_int_distribution<int> pick(0, 99);
  for (zpp_dtype_t dt : kDtypes)
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t blk : blocks)
          for (size_t n : lengths) {
            if (n > 5000 && blk < 32) continue;  // keep the run short
            auto x = draw(rng, n, dt, (int)(n % 2));
            for (size_t i = 0; i < n; i++) {  // sprinkle special values
              int p = pick(rng);
              if (p == 0) x[i] = 0.0f;
              if (p == 1) x[i] = -0.0f;
              if (p == 2 && n > 1000 && i % 4096 < 64) x[i] = NAN;
              if (p == 3 && n > 1000 && i % 4096 > 4000) x[i] = -INFINITY;
              if (p == 4) x[i] = representable(x[i] * 1e-6f, dt);
            }
            if (n > 64) for (size_t i = 0; i < 40; i++) x[i] = 0.0f;  // zero block
            auto in = to_bytes(x, dt);
            zpp_qcfg_t q = {bits, asym, blk, 0, 0, 0, 0};
            int ovf;
            size_t sz = zpp_quant_bytes(&q, n, &ovf);
            std::vector<uint8_t> e0(sz + 1, 0xa5), e1(sz + 1, 0xa5);
            ref->encode(&q, dt, in.data(), n, e0.data());
            ops->encode(&q, dt, in.data(), n, e1.data());
            std::string ctx = std::string(GetParam()) + " " + zpp_dtype_name(dt) +
                              " bits " + std::to_string(bits) +
                              (asym ? " asym" : " sym") + " n " + std::to_string(n) +
                              " block " + std::to_string(blk);
            ASSERT_EQ(std::memcmp(e0.data(), e1.data(), sz + 1), 0) << ctx << ": encode";
            for (int out : {0, 1, 2, ZPP_QM_OUT_ACC}) {
              size_t esz = out == ZPP_QM_OUT_ACC ? 4 : zpp_dtype_size((zpp_dtype_t)out);
              std::vector<uint8_t> d0(n * esz + 4), d1;
              for (size_t i = 0; i < d0.size(); i++) d0[i] = (uint8_t)(i * 7);
              d1 = d0;  // accumulate starts from the same finite values
              if (out == ZPP_QM_OUT_ACC)
                for (size_t i = 0; i < n; i++) {
                  float v = x[(i * 31) % n];
                  if (!std::isfinite(v)) v = 1.0f;
                  std::memcpy(&d0[4 * i], &v, 4);
                  std::memcpy(&d1[4 * i], &v, 4);
                }
              ref->decode(&q, e0.data(), n, out, d0.data());
              ops->decode(&q, e0.data(), n, out, d1.data());
              ASSERT_EQ(std::memcmp(d0.data(), d1.data(), d0.size()), 0)
                  << ctx << ": decode to kind " << out;
            }
          }
}

// Raw input bits for the special-value test: per block a random binade
// (2^-149 .. 2^127, so subnormal, tiny-scale DIV and huge blocks occur), and
// raw patterns that a float detour would hide (fp16/bf16 signalling NaNs,
// -0, the largest finite values, the smallest subnormal).
std::vector<uint8_t> special_input(std::mt19937_64 &rng, zpp_dtype_t dt,
                                   size_t n, size_t blk, int bits, bool asym) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-150, 127), pick(0, 63), kind(0, 9);
  const size_t es = zpp_dtype_size(dt);
  std::vector<uint8_t> b(n * es + 1);
  const float qmax = (float)((1 << (bits - 1)) - 1);
  auto put_bits = [&](size_t i, uint32_t f32bits, uint16_t h16) {
    if (dt == ZPP_FLOAT32) std::memcpy(&b[4 * i], &f32bits, 4);
    else std::memcpy(&b[2 * i], &h16, 2);
  };
  auto put_float = [&](size_t i, float v) {
    uint16_t h = dt == ZPP_BFLOAT16 ? (uint16_t)(bits_of(v) >> 16)  // truncate: any pattern is an input
                                    : zpp_qm_f32_to_f16(v);
    put_bits(i, bits_of(v), h);
  };
  for (size_t off = 0; off < n; off += blk) {
    size_t len = std::min(blk, n - off);
    int k = kind(rng);
    float sc = std::ldexp(1.0f, binade(rng));
    float edge_base = std::ldexp(1.0f + std::fabs(normal(rng)) / 4.0f, binade(rng) / 2);
    for (size_t i = 0; i < len; i++) {
      float v = normal(rng) * sc;
      if (k == 0) v = (float)(int)(normal(rng) * 40.0f) + 0.5f;  // ties at scale 1
      if (k == 1) v = asym ? 3.0f + (float)(i % 5) : (float)(int)(normal(rng) * 40.0f);
      if (k == 2) v = std::ldexp((float)(i % 7), -149);          // subnormal: DIV kind
      if (k == 3) v = (i % 2 ? 1.0f : -1.0f) * 3.0e38f * (float)(i % 3) / 2.0f;
      if (k == 7) {  // every element at +-absmax or one ulp inside: codes at +-qmax
        float edge = i % 4 < 2 ? edge_base : std::nextafter(edge_base, 0.0f);
        v = i % 2 ? -edge : edge;
      }
      put_float(off + i, v);
    }
    if (k == 0) put_float(off, 127.0f);  // absmax 127 -> scale 1 (sym)
    if (k == 1 && asym) {                // -0 as the block minimum
      put_bits(off, 0x80000000u, 0x8000);
      if (len > 2) put_bits(off + 2, 0, 0);
    }
    if (k == 1 && !asym) put_float(off + len - 1, -qmax * 2.0f);  // clamp edge
    if (k == 4)                          // constant block of -0 and +0
      for (size_t i = 0; i < len; i++) put_bits(off + i, i % 2 ? 0 : 0x80000000u, i % 2 ? 0 : 0x8000);
    if (k == 5) {                        // one non-finite element, first or last
      size_t at = pick(rng) % 2 ? off : off + len - 1;
      int w = pick(rng) % 4;
      uint32_t f[4] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u};
      uint16_t h[4] = {(uint16_t)(dt == ZPP_BFLOAT16 ? 0x7f80 : 0x7c00),
                       (uint16_t)(dt == ZPP_BFLOAT16 ? 0xff80 : 0xfc00),
                       (uint16_t)(dt == ZPP_BFLOAT16 ? 0xffc1 : 0xfe01),
                       (uint16_t)(dt == ZPP_BFLOAT16 ? 0x7f81 : 0x7c01)};  // sNaN
      put_bits(at, f[w], h[w]);
    }
    if (k == 6 && len > 1) {             // largest finite and smallest subnormal
      put_bits(off + len / 2, 0x7f7fffffu, (uint16_t)(dt == ZPP_BFLOAT16 ? 0x7f7f : 0x7bff));
      put_bits(off, 0x00000001u, 0x0001);
    }
  }
  return b;
}

TEST_P(QuantSimd, SpecialValuesAndUnalignedBuffersAreBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(GetParam());
  if (ops == nullptr)
    GTEST_SKIP() << GetParam() << " path not built or not supported by this CPU";
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  auto rng = seeded_rng("QuantSimdSpecial");
  const size_t blocks[] = {8, 16, 24, 31, 32, 33, 48, 64, 96, 200, 256, 8192, 8193};
  const size_t lengths[] = {33, 999, 20011};
  for (zpp_dtype_t dt : kDtypes)
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t blk : blocks)
          for (size_t n : lengths) {
            auto in = special_input(rng, dt, n, blk, bits, asym);
            const size_t es = zpp_dtype_size(dt);
            zpp_qcfg_t q = {bits, asym, blk, 0, 0, 0, 0};
            int ovf;
            size_t sz = zpp_quant_bytes(&q, n, &ovf);
            // odd byte offsets: nothing in the SIMD path may assume alignment
            std::vector<uint8_t> in_u(in.size() + 3), e0(sz + 1, 0x5a), e1(sz + 4, 0x5a);
            std::memcpy(in_u.data() + 3, in.data(), in.size());
            ref->encode(&q, dt, in.data(), n, e0.data());
            ops->encode(&q, dt, in_u.data() + 3, n, e1.data() + 1);
            std::string ctx = std::string(GetParam()) + " " + zpp_dtype_name(dt) +
                              " bits " + std::to_string(bits) + (asym ? " asym" : " sym") +
                              " n " + std::to_string(n) + " block " + std::to_string(blk);
            ASSERT_EQ(std::memcmp(e0.data(), e1.data() + 1, sz), 0) << ctx << ": encode";
            ASSERT_EQ(e1[0], 0x5a) << ctx << ": wrote before dst";
            ASSERT_EQ(e1[sz + 1], 0x5a) << ctx << ": wrote past dst";
            std::memcpy(e1.data() + 1, e0.data(), sz);  // decode from unaligned src
            for (int out : {0, 1, 2, ZPP_QM_OUT_ACC}) {
              size_t osz = out == ZPP_QM_OUT_ACC ? 4 : zpp_dtype_size((zpp_dtype_t)out);
              std::vector<uint8_t> d0(n * osz + 2, 0x77), d1(n * osz + 5, 0x77);
              if (out == ZPP_QM_OUT_ACC)
                for (size_t i = 0; i < n; i++) {
                  float v = (float)(i % 13) - 6.5f;
                  std::memcpy(&d0[4 * i], &v, 4);
                  std::memcpy(&d1[4 * i + 3], &v, 4);
                }
              ref->decode(&q, e0.data(), n, out, d0.data());
              ops->decode(&q, e1.data() + 1, n, out, d1.data() + 3);
              ASSERT_EQ(std::memcmp(d0.data(), d1.data() + 3, n * osz), 0)
                  << ctx << ": decode to kind " << out;
              ASSERT_EQ(d1[n * osz + 3], 0x77) << ctx << ": decode wrote past dst";
            }
            (void)es;
          }
}

// Decode of arbitrary metadata: random scale/zero bit patterns make the
// decoded values cover the whole fp32 range, so the fp16/bf16 stores are
// checked on overflow, subnormal results, ties and NaN payloads.  At most
// one of scale and zero is NaN (with two NaN operands IEEE leaves the
// payload of zero + q * scale open, and compilers order operands freely).
TEST_P(QuantSimd, DecodeOfArbitraryMetadataIsBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(GetParam());
  if (ops == nullptr)
    GTEST_SKIP() << GetParam() << " path not built or not supported by this CPU";
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  auto rng = seeded_rng("QuantSimdMeta");
  std::uniform_int_distribution<uint32_t> u32;
  const size_t n = 4099;
  for (int bits : {8, 4})
    for (bool asym : {false, true})
      for (size_t blk : {16, 32, 37, 64, 256}) {
        zpp_qcfg_t q = {bits, asym, blk, 0, 0, 0, 0};
        int ovf;
        size_t sz = zpp_quant_bytes(&q, n, &ovf);
        size_t nb = (n + blk - 1) / blk, mb = asym ? 8 : 4;
        std::vector<uint8_t> enc(sz);
        for (auto &c : enc) c = (uint8_t)u32(rng);
        for (size_t b = 0; b < nb; b++) {
          uint32_t sc = u32(rng), zr = u32(rng);
          if (b % 4 == 1) sc = (sc & 0x807fffffu) | 0x33000000u;  // fp16 subnormal range
          if (b % 4 == 2) sc = (sc & 0x80ffffffu) | 0x3b000000u;  // fp16 normal range
          if ((zr & 0x7fffffffu) > 0x7f800000u && (sc & 0x7fffffffu) > 0x7f800000u)
            zr = 0x3f800000u;
          std::memcpy(&enc[b * mb], &sc, 4);
          if (asym) std::memcpy(&enc[b * mb + 4], &zr, 4);
        }
        std::string ctx = std::string(GetParam()) + " bits " + std::to_string(bits) +
                          (asym ? " asym" : " sym") + " block " + std::to_string(blk);
        for (int out : {0, 1, 2, ZPP_QM_OUT_ACC}) {
          size_t osz = out == ZPP_QM_OUT_ACC ? 4 : zpp_dtype_size((zpp_dtype_t)out);
          std::vector<uint8_t> d0(n * osz), d1;
          if (out == ZPP_QM_OUT_ACC)
            for (size_t i = 0; i < n; i++) {  // finite or Inf accumulators
              uint32_t a = u32(rng);
              if ((a & 0x7f800000u) == 0x7f800000u) a &= 0xff800000u;
              std::memcpy(&d0[4 * i], &a, 4);
            }
          d1 = d0;
          ref->decode(&q, enc.data(), n, out, d0.data());
          ops->decode(&q, enc.data(), n, out, d1.data());
          for (size_t i = 0; i < n; i++)
            ASSERT_EQ(std::memcmp(&d0[i * osz], &d1[i * osz], osz), 0)
                << ctx << ": decode to kind " << out << ", element " << i;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Paths, QuantSimd, ::testing::Values("avx2", "avx512"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param);
                         });

TEST(QuantSimd, IsaInUseIsNamed) {
  std::string isa = zpp_quant_cpu_isa();
  EXPECT_TRUE(isa == "scalar" || isa == "avx2" || isa == "avx512") << isa;
}


// ---- stochastic rounding (docs/format.md, "Stochastic rounding") ----------------------

zpp_quant_config_t sr_cfg(int bits, size_t block, bool asym, uint64_t seed) {
  zpp_quant_config_t c = make_cfg(bits, block, asym);
  c.rounding = ZPP_ROUND_STOCHASTIC;
  c.seed = seed;
  return c;
}

TEST_P(QuantSimd, StochasticRoundingIsBitwiseEqualToScalar) {
  const zpp_quant_cpu_ops_t *ops = zpp_quant_cpu_ops_named(GetParam());
  if (ops == nullptr)
    GTEST_SKIP() << GetParam() << " path not built or not supported by this CPU";
  const zpp_quant_cpu_ops_t *ref = zpp_quant_cpu_ops_named("scalar");
  auto rng = seeded_rng("QuantSimd.StochasticRounding");
  const size_t lengths[] = {1, 7, 16, 17, 65, 1000, 4097};
  const size_t blocks[] = {1, 7, 8, 16, 17, 32, 33, 256, 1024};
  // index bases: 0, and one whose vectors cross a 2^32 boundary (the SIMD
  // paths hand those elements to the scalar code)
  const uint64_t bases[] = {0, 0xfffffff0ull - 37, 5ull << 32};
  for (zpp_dtype_t dt : kDtypes)
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t blk : blocks)
          for (size_t n : lengths)
            for (uint64_t base : bases) {
              auto x = draw(rng, n, dt, (int)(n % 2));
              if (n > 64) x[3] = NAN;  // a non-finite block among the others
              if (n > 100) for (size_t i = 40; i < 72; i++) x[i] = 0.0f;
              auto in = to_bytes(x, dt);
              zpp_qm_keys_t k = zpp_qm_rng_keys(rng());
              zpp_qcfg_t q = {bits, asym, blk, 1, k.k0, k.k1, base};
              int ovf;
              size_t sz = zpp_quant_bytes(&q, n, &ovf);
              std::vector<uint8_t> e0(sz + 1, 0xa5), e1(sz + 1, 0xa5);
              ref->encode(&q, dt, in.data(), n, e0.data());
              ops->encode(&q, dt, in.data(), n, e1.data());
              if (e0 != e1) {
                size_t at = 0;
                while (e0[at] == e1[at]) at++;
                ADD_FAILURE() << GetParam() << " " << zpp_dtype_name(dt) << " bits " << bits
                              << (asym ? " asym" : " sym") << " block " << blk << " n " << n
                              << " base " << base << ": first differing byte " << at;
                return;
              }
            }
}

// Every stochastic code is one of the two grid neighbours of the scaled
// value, so the error is below one step (not half of one):
//   |x_hat - x| <= scale * (1 + 2^-12) + 2^-22 * (|x| + range) + 2^-149
// (docs/format.md, "Stochastic rounding"), for every dtype and mode; the
// same seed gives the same bytes, another seed other bytes, and a call
// split at a block boundary (index base = the offset) the same bytes.
// The rule of docs/format.md, "Stochastic rounding", element by element:
// the code is f + 1 exactly when r24 < ceil(p 2^24), p = fl(v - f) the
// fraction rounded once to fp32 (the reference computes it in double and
// rounds it: exact for v >= 0 and v <= -1/2, rounded for -1/2 < v < 0).
// Checked at the two r24 around the threshold for random v in every range,
// among them values in (-1/2, 0) whose fraction is not an fp32 number (so
// "v - f is exact" would put the threshold elsewhere) and tiny negatives
// (p = 1: always code 0).
TEST(QuantStochastic, ThresholdIsTheFractionRoundedOnceToFp32) {
  auto rng = seeded_rng("QuantStochastic.Threshold");
  zpp_qm_params_t p;
  p.scale = 1.0f;
  p.zero = 0.0f;
  p.inv = 1.0f;
  p.lo = -127.0f;
  p.hi = 127.0f;
  p.kind = ZPP_QM_KIND_MUL;
  std::uniform_real_distribution<float> wide(-127.0f, 127.0f), neg(-0.5f, 0.0f);
  std::uniform_int_distribution<int> expo(-40, -2);
  int inexact = 0, checked = 0;
  for (int i = 0; i < 30000; i++) {
    float v = i % 3 == 0 ? wide(rng)
              : i % 3 == 1 ? neg(rng)
                           : -std::ldexp(1.0f + neg(rng), expo(rng));  // tiny negatives
    if (v == 0.0f) continue;
    double f = std::floor((double)v), exact = (double)v - f;
    float frac = (float)exact;  // one rounding to nearest even
    if ((double)frac != exact) {
      inexact++;
      EXPECT_TRUE(v > -0.5f && v < 0.0f) << "fraction of " << v << " not exact";
    }
    double t = std::ceil((double)frac * 16777216.0);  // codes f + 1 for r24 < t
    if (t >= 1) {
      EXPECT_EQ(zpp_qm_quantize_sr(v, &p, (uint32_t)(t - 1)), (int)f + 1)
          << "v " << v << " r24 " << t - 1;
      checked++;
    }
    if (t < 16777216.0) {
      EXPECT_EQ(zpp_qm_quantize_sr(v, &p, (uint32_t)t), (int)f) << "v " << v << " r24 " << t;
      checked++;
    }
    if (v < 0.0f && v > -std::ldexp(1.0f, -25)) {  // v + 1 rounds to 1
      EXPECT_EQ(frac, 1.0f) << v;
      EXPECT_EQ(zpp_qm_quantize_sr(v, &p, 16777215u), 0) << v;
    }
  }
  std::printf("[ info ] %d thresholds checked, %d fractions rounded\n", checked, inexact);
  EXPECT_GT(inexact, 1000) << "the rounded case (-1/2 < v < 0) was not exercised";
}

TEST(QuantStochastic, ReproducibleSplittableAndWithinOneStep) {
  auto rng = seeded_rng("QuantStochastic.Reproducible");
  for (zpp_dtype_t dt : kDtypes)
    for (int bits : {8, 4})
      for (bool asym : {false, true}) {
        const size_t n = 3001, block = 100;
        auto x = draw(rng, n, dt, asym ? 1 : 0);
        auto in = to_bytes(x, dt);
        zpp_quant_config_t c = sr_cfg(bits, block, asym, 77);
        size_t sz;
        ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
        std::vector<uint8_t> a(sz), b(sz), d(sz);
        ASSERT_EQ(zpp_quant_encode(&c, dt, in.data(), n, a.data(), sz), ZPP_OK);
        ASSERT_EQ(zpp_quant_encode(&c, dt, in.data(), n, b.data(), sz), ZPP_OK);
        EXPECT_EQ(a, b) << "same seed, different bytes";
        zpp_quant_config_t c2 = sr_cfg(bits, block, asym, 78);
        ASSERT_EQ(zpp_quant_encode(&c2, dt, in.data(), n, d.data(), sz), ZPP_OK);
        EXPECT_NE(a, d) << "seeds 77 and 78 drew the same codes";
        // split at element 1000 (block 10): the second part draws at 1000+i
        size_t s1, s2, cut = 1000, ds = zpp_dtype_size(dt);
        ASSERT_EQ(zpp_quant_encoded_size(&c, cut, &s1), ZPP_OK);
        ASSERT_EQ(zpp_quant_encoded_size(&c, n - cut, &s2), ZPP_OK);
        std::vector<uint8_t> p1(s1), p2(s2), w1(cut * ds), w2((n - cut) * ds), whole(n * ds);
        ASSERT_EQ(zpp_quant_encode_at(&c, dt, in.data(), cut, 0, p1.data(), s1), ZPP_OK);
        ASSERT_EQ(zpp_quant_encode_at(&c, dt, in.data() + cut * ds, n - cut, cut, p2.data(), s2),
                  ZPP_OK);
        ASSERT_EQ(zpp_quant_decode(&c, p1.data(), s1, cut, dt, w1.data()), ZPP_OK);
        ASSERT_EQ(zpp_quant_decode(&c, p2.data(), s2, n - cut, dt, w2.data()), ZPP_OK);
        ASSERT_EQ(zpp_quant_decode(&c, a.data(), sz, n, dt, whole.data()), ZPP_OK);
        EXPECT_EQ(0, std::memcmp(w1.data(), whole.data(), cut * ds));
        EXPECT_EQ(0, std::memcmp(w2.data(), whole.data() + cut * ds, (n - cut) * ds))
            << "a call split at a block boundary drew other bits";
        // within one step
        size_t meta = asym ? 8 : 4;
        int bad = 0;
        for (size_t i = 0; i < n && bad < 3; i++) {
          size_t blk = i / block, off = blk * block, len = std::min(block, n - off);
          double mn = INFINITY, mx = -INFINITY, amax = 0;
          for (size_t j = off; j < off + len; j++) {
            mn = std::min(mn, (double)x[j]);
            mx = std::max(mx, (double)x[j]);
            amax = std::max(amax, std::fabs((double)x[j]));
          }
          float scale;
          std::memcpy(&scale, a.data() + blk * meta, 4);
          double range = asym ? mx - mn : amax;
          double xh = get(whole.data(), dt, i);
          double bound = scale * (1 + std::ldexp(1.0, -12)) +
                         std::ldexp(1.0, -22) * (std::fabs(x[i]) + range) +
                         std::ldexp(1.0, -149) + store_err(xh, dt);
          if (!(std::fabs(xh - x[i]) <= bound)) {
            ADD_FAILURE() << zpp_dtype_name(dt) << " bits " << bits << (asym ? " asym" : " sym")
                          << " element " << i << ": x " << x[i] << " decoded " << xh
                          << " error " << std::fabs(xh - x[i]) << " > one step " << bound;
            bad++;
          }
        }
      }
}

// Unbiasedness at the rate the math gives.  For element i of a block with
// step D (the stored scale), the scaled value v lies between the codes f
// and f + 1 with fraction p = v - f; a stochastic code is f + 1 with
// probability p (to within 2^-24), so the decoded error e = x_hat - x
// takes the values (1 - p) D and -p D: mean 0, variance D^2 p (1 - p) <=
// D^2 / 4.  The mean of K encodings with independent seeds then has
//   E[mean - x] = 0,  Var[mean - x] = D^2 p (1 - p) / K   (std <= D / (2 sqrt K)),
// so T = sum_i (mean_i - x_i)^2 / sum_i D_i^2 p_i (1 - p_i) / K has mean 1
// and, over N = 4096 elements, a standard deviation of about sqrt(2 / N) =
// 0.022 (the mean of K >= 16 two-valued draws is close to normal).  The
// test asks 0.85 <= T <= 1.15 at K = 16 and at K = 256: the error falls
// as 1/sqrt(K), neither faster (correlated seeds would not average) nor
// slower (a bias would not average away: T would grow with K), and also
// checks every element against Hoeffding's bound D sqrt(ln(2N/1e-9)/(2K))
// (each error lies in an interval of length D).  Rounding to nearest, by
// contrast, makes the same error every time.
TEST(QuantStochastic, MeanOfKEncodingsConvergesToTheInputAtTheDerivedRate) {
  auto rng = seeded_rng("QuantStochastic.Unbiased");
  const size_t n = 4096, block = 64;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float &v : x) v = normal(rng);
  zpp_quant_config_t c = sr_cfg(4, block, false, 0);
  size_t sz;
  ASSERT_EQ(zpp_quant_encoded_size(&c, n, &sz), ZPP_OK);
  std::vector<uint8_t> enc(sz);
  std::vector<float> dec(n);
  std::vector<double> sum(n, 0.0), var(n, 0.0), step(n, 0.0);
  uint64_t seed0 = rng();
  int k = 0;
  for (int K : {16, 256}) {
    for (; k < K; k++) {
      c.seed = seed0 + (uint64_t)k;
      ASSERT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, x.data(), n, enc.data(), sz), ZPP_OK);
      ASSERT_EQ(zpp_quant_decode(&c, enc.data(), sz, n, ZPP_FLOAT32, dec.data()), ZPP_OK);
      for (size_t i = 0; i < n; i++) sum[i] += dec[i];
    }
    for (size_t i = 0; i < n; i++) {
      float scale;
      std::memcpy(&scale, enc.data() + (i / block) * 4, 4);
      double v = (double)x[i] / scale, p = v - std::floor(v);
      step[i] = scale;
      var[i] = (double)scale * scale * p * (1 - p) / K;
    }
    double num = 0, den = 0;
    int bad = 0;
    double hoeff = std::sqrt(std::log(2.0 * n / 1e-9) / (2.0 * K));
    for (size_t i = 0; i < n; i++) {
      double err = sum[i] / K - x[i];
      num += err * err;
      den += var[i];
      if (std::fabs(err) > step[i] * (hoeff + 1e-4) && bad++ < 3)
        ADD_FAILURE() << "K " << K << " element " << i << ": mean error " << err
                      << " beyond Hoeffding's " << step[i] * hoeff;
    }
    double T = num / den;
    std::printf("[ info ] K %d: sum of squared mean errors / predicted = %.4f\n", K, T);
    EXPECT_GT(T, 0.85) << "K " << K << ": the mean converges faster than independent draws can";
    EXPECT_LT(T, 1.15) << "K " << K << ": the mean does not converge at 1/sqrt(K) (bias or "
                       << "correlated random bits)";
  }
  // nearest rounding: the same error on every encoding, so its mean does
  // not improve; at K = 256 the stochastic mean is far closer
  zpp_quant_config_t rtn = make_cfg(4, block, false);
  ASSERT_EQ(zpp_quant_encode(&rtn, ZPP_FLOAT32, x.data(), n, enc.data(), sz), ZPP_OK);
  ASSERT_EQ(zpp_quant_decode(&rtn, enc.data(), sz, n, ZPP_FLOAT32, dec.data()), ZPP_OK);
  double e_rtn = 0, e_sr = 0;
  for (size_t i = 0; i < n; i++) {
    e_rtn += (dec[i] - x[i]) * (double)(dec[i] - x[i]);
    e_sr += (sum[i] / 256 - x[i]) * (sum[i] / 256 - x[i]);
  }
  EXPECT_LT(e_sr, 0.2 * e_rtn);
}

// A config from zpp 0.1 (no rounding, no seed) is still accepted and
// encodes as the current one with the defaults.
TEST(QuantApi, OlderSmallerConfigStructsStillWork) {
  struct v1_config {
    size_t struct_size;
    int bits;
    size_t block_size;
    zpp_quant_mode_t mode;
  } old = {sizeof(v1_config), 4, 64, ZPP_QUANT_SYMMETRIC};
  static_assert(sizeof(v1_config) == ZPP_QUANT_CONFIG_V1_SIZE, "0.1 layout");
  const zpp_quant_config_t *oc = reinterpret_cast<const zpp_quant_config_t *>(&old);
  zpp_quant_config_t nc = make_cfg(4, 64, false);
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); i++) x[i] = std::sin((double)i);
  size_t s1, s2;
  ASSERT_EQ(zpp_quant_encoded_size(oc, x.size(), &s1), ZPP_OK) << zpp_get_last_error();
  ASSERT_EQ(zpp_quant_encoded_size(&nc, x.size(), &s2), ZPP_OK);
  ASSERT_EQ(s1, s2);
  std::vector<uint8_t> a(s1), b(s2);
  ASSERT_EQ(zpp_quant_encode(oc, ZPP_FLOAT32, x.data(), x.size(), a.data(), s1), ZPP_OK);
  ASSERT_EQ(zpp_quant_encode(&nc, ZPP_FLOAT32, x.data(), x.size(), b.data(), s2), ZPP_OK);
  EXPECT_EQ(a, b);
  zpp_quant_config_t bad = make_cfg(8, 64, false);
  bad.rounding = (zpp_rounding_t)5;
  EXPECT_EQ(zpp_quant_config_check(&bad), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("rounding 5"), std::string::npos);
}

// ---- Hadamard rotation (docs/format.md, "Hadamard rotation") ---------------------------

// float64 H x / sqrt(g) of one group (Sylvester order: H[i][j] =
// (-1)^popcount(i & j), what the butterflies compute).
std::vector<double> hadamard_ref(const float *x, size_t g) {
  std::vector<double> y(g, 0.0);
  for (size_t i = 0; i < g; i++)
    for (size_t j = 0; j < g; j++)
      y[i] += (__builtin_popcountll(i & j) & 1 ? -1.0 : 1.0) * x[j];
  for (double &v : y) v /= std::sqrt((double)g);
  return y;
}

// The fp32 rotation against float64: each output is a sum of g = 2^k
// terms +-x_j formed in k rounded additions, so its error is at most
// k 2^-24 sum_j |x_j| (to first order); times c = fl(1/sqrt(g)) (relative
// error 2^-24 for odd k) and one rounding of the product:
//   |y_hat - y| <= (k 2^-24 (1 + 2^-20) sum_j |x_j| ) c + 2^-23 |y| + 2^-149.
TEST(QuantHadamard, MatchesFloat64WithinTheRoundingBoundAndLeavesTheTail) {
  auto rng = seeded_rng("QuantHadamard.Float64");
  for (zpp_dtype_t dt : kDtypes)
    for (size_t g : {2, 4, 8, 32, 256, 1024}) {
      size_t n = 3 * g + 5;  // a tail of 5 elements is not rotated
      auto x = draw(rng, n, dt, 0);
      for (size_t i = 0; i < n; i += 97) x[i] = representable(x[i] * 100.0f, dt);  // outliers
      auto in = to_bytes(x, dt);
      std::vector<float> y(n);
      ASSERT_EQ(zpp_hadamard(g, dt, in.data(), n, y.data()), ZPP_OK);
      int k = 0;
      while (((size_t)1 << k) < g) k++;
      double c = 1.0 / std::sqrt((double)g);
      int bad = 0;
      for (size_t b0 = 0; b0 + g <= n; b0 += g) {
        auto ref = hadamard_ref(&x[b0], g);
        double l1 = 0;
        for (size_t j = 0; j < g; j++) l1 += std::fabs(x[b0 + j]);
        for (size_t i = 0; i < g && bad < 3; i++) {
          double bound = k * std::ldexp(1.0, -24) * (1 + std::ldexp(1.0, -20)) * l1 * c +
                         std::ldexp(1.0, -23) * std::fabs(ref[i]) + std::ldexp(1.0, -149);
          if (!(std::fabs(y[b0 + i] - ref[i]) <= bound) && bad++ < 3)
            ADD_FAILURE() << zpp_dtype_name(dt) << " g " << g << " element " << b0 + i << ": "
                          << y[b0 + i] << " vs " << ref[i] << " bound " << bound;
        }
      }
      for (size_t i = n / g * g; i < n; i++)
        EXPECT_EQ(y[i], x[i]) << "tail element " << i << " was changed";
      // its own inverse: the second rotation brings x back to within the
      // two rounding bounds (the first one's error passes through the
      // orthonormal second rotation unchanged in norm)
      std::vector<float> z(n);
      ASSERT_EQ(zpp_hadamard(g, ZPP_FLOAT32, y.data(), n, z.data()), ZPP_OK);
      ASSERT_EQ(zpp_hadamard(g, ZPP_FLOAT32, y.data(), n, y.data()), ZPP_OK);  // in place
      EXPECT_EQ(0, std::memcmp(z.data(), y.data(), n * 4)) << "in place differs";
      for (size_t b0 = 0; b0 + g <= n; b0 += g) {
        double l1 = 0;
        for (size_t j = 0; j < g; j++) l1 += std::fabs(x[b0 + j]);
        for (size_t i = 0; i < g; i++) {
          double bound = 2 * (k + 2) * std::ldexp(1.0, -24) * (1 + std::ldexp(1.0, -20)) * l1;
          if (!(std::fabs(z[b0 + i] - x[b0 + i]) <= bound) && bad++ < 3)
            ADD_FAILURE() << "g " << g << " inverse element " << b0 + i << ": " << z[b0 + i]
                          << " vs " << x[b0 + i] << " bound " << bound;
        }
      }
    }
}

TEST(QuantHadamard, Avx2IsBitwiseEqualToScalar) {
  if (!zpp_tf_have_avx2()) GTEST_SKIP() << "this CPU has no AVX2";
  auto rng = seeded_rng("QuantHadamard.Avx2");
  for (zpp_dtype_t dt : kDtypes)
    for (size_t g : {2, 4, 8, 16, 32, 64, 512, 4096})
      for (size_t n : {(size_t)1, g - 1, g, 2 * g + 3, 9 * g}) {
        auto x = draw(rng, n, dt, 1);
        auto in = to_bytes(x, dt);
        std::vector<float> a(n, -1.0f), b(n, -2.0f);
        zpp_tf_hadamard_scalar(g, dt, in.data(), n, a.data());
        zpp_tf_hadamard_avx2(g, dt, in.data(), n, b.data());
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), n * 4))
            << zpp_dtype_name(dt) << " g " << g << " n " << n;
      }
}

TEST(QuantHadamard, BadArgumentsAreNamed) {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  uint16_t h[8] = {0};
  EXPECT_EQ(zpp_hadamard(3, ZPP_FLOAT32, x, 8, y), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("group 3"), std::string::npos);
  EXPECT_EQ(zpp_hadamard(1, ZPP_FLOAT32, x, 8, y), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_hadamard(8, (zpp_dtype_t)9, x, 8, y), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_hadamard(8, ZPP_FLOAT32, nullptr, 8, y), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_hadamard(8, ZPP_FLOAT32, x, 8, nullptr), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_hadamard(8, ZPP_BFLOAT16, h, 4, reinterpret_cast<float *>(h)),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_hadamard(8, ZPP_FLOAT32, nullptr, 0, nullptr), ZPP_OK);
}

// Buffers that partly overlap.  fp32: the rotation of a copy of the input,
// whatever the overlap (dst before, after or inside src).  fp16/bf16: the
// input is widened into dst as it is read, so any shared byte would be
// overwritten before it is read: refused with the exact message, dst left
// untouched.
TEST(QuantHadamard, PartialOverlapIsHandledForFp32AndRefusedFor16Bit) {
  auto rng = seeded_rng("QuantHadamard.Overlap");
  const size_t g = 16, n = 5 * g + 3;  // a tail too
  for (long shift : {-37L, -16L, -1L, 1L, 5L, 16L, 40L}) {
    auto x = draw(rng, n, ZPP_FLOAT32, 1);
    std::vector<float> want(n), buf(n + 2 * 64, 0.0f);
    ASSERT_EQ(zpp_hadamard(g, ZPP_FLOAT32, x.data(), n, want.data()), ZPP_OK);
    float *src = buf.data() + 64, *dst = src + shift;
    std::memcpy(src, x.data(), n * 4);
    ASSERT_EQ(zpp_hadamard(g, ZPP_FLOAT32, src, n, dst), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(0, std::memcmp(want.data(), dst, n * 4)) << "fp32, dst = src + " << shift;
  }
  for (zpp_dtype_t dt : {ZPP_FLOAT16, ZPP_BFLOAT16})
    for (long shift_bytes : {-2L * (long)n - 2, -6L, 0L, 2L, 40L, 2L * (long)n - 2}) {
      auto x = draw(rng, n, dt, 1);
      auto in = to_bytes(x, dt);
      std::vector<uint8_t> buf(8 * n + 1024, 0);
      uint8_t *src = buf.data() + 4 * n + 256;
      std::memcpy(src, in.data(), in.size());
      float *dst = reinterpret_cast<float *>(src + shift_bytes);
      std::vector<uint8_t> before = buf;
      EXPECT_EQ(zpp_hadamard(g, dt, src, n, dst), ZPP_ERR_INVALID_ARGUMENT)
          << zpp_dtype_name(dt) << " dst = src + " << shift_bytes << " bytes";
      EXPECT_EQ(std::string(zpp_get_last_error()),
                std::string("zpp_hadamard: dst overlaps src (dtype ") + zpp_dtype_name(dt) +
                    ", count " + std::to_string(n) +
                    "): only ZPP_FLOAT32 input may share memory with dst");
      EXPECT_EQ(before, buf) << "a refused call wrote to memory";
    }
  // 16-bit input that ends exactly where dst starts, or starts where dst
  // ends, does not overlap: accepted, and equal to separate buffers.
  {
    auto x = draw(rng, n, ZPP_BFLOAT16, 1);
    auto in = to_bytes(x, ZPP_BFLOAT16);
    std::vector<float> want(n);
    ASSERT_EQ(zpp_hadamard(g, ZPP_BFLOAT16, in.data(), n, want.data()), ZPP_OK);
    std::vector<uint8_t> buf(6 * n + 64);
    float *dst = reinterpret_cast<float *>(buf.data());
    uint8_t *src = buf.data() + 4 * n;  // right after dst
    std::memcpy(src, in.data(), 2 * n);
    ASSERT_EQ(zpp_hadamard(g, ZPP_BFLOAT16, src, n, dst), ZPP_OK) << zpp_get_last_error();
    EXPECT_EQ(0, std::memcmp(want.data(), dst, n * 4));
  }
}

// ---- zpp_bytes_overlap (core/core.h): the one overlap test of the library ----------
//
// Against a 128-bit reference: [x, x + na) and [y, y + nb) share a byte iff
// both are non-empty, neither address is 0, and max(x, y) < min(x + na,
// y + nb) computed without wrapping.  Ranges near the top of the address
// space are where a test that forms end addresses in uintptr_t wraps to
// a small number and misses the overlap.  The addresses are only compared,
// never dereferenced.
#if defined(__SIZEOF_INT128__)
bool overlap_ref(uintptr_t x, size_t na, uintptr_t y, size_t nb) {
  typedef unsigned __int128 u128;
  if (x == 0 || y == 0 || na == 0 || nb == 0) return false;
  u128 lo = x > y ? x : y, ex = (u128)x + na, ey = (u128)y + nb;
  return lo < (ex < ey ? ex : ey);
}

TEST(BytesOverlap, MatchesA128BitReferenceAlsoAtTheTopOfTheAddressSpace) {
  auto rng = seeded_rng("BytesOverlap");
  const uintptr_t top = UINTPTR_MAX;
  const size_t big = SIZE_MAX;
  struct Case {
    uintptr_t x;
    size_t na;
    uintptr_t y;
    size_t nb;
  };
  std::vector<Case> cases = {
      // the last bytes of the address space: end addresses would wrap to 0
      {top - 15, 16, top - 3, 100},  // y inside x, y's range runs past the top
      {top - 3, 100, top - 15, 16},  // the same, swapped
      {top - 15, 16, top, 1},        // the very last byte
      {top, 1, top, 1},
      {top - 15, 8, top - 7, 8},     // touching at the top: no overlap
      {top - 7, 8, top - 15, 8},
      {top - 15, 8, top - 8, 8},     // one shared byte
      {top - 7, big, 16, 16},        // a huge range from the top does not wrap
      {16, 16, top - 7, big},        //   around onto low addresses
      {1, big, top, 1},              // a range covering everything else
      {top, 1, 1, big},
      // empty ranges and NULL share nothing
      {64, 0, 64, 16}, {64, 16, 64, 0}, {0, 16, 0, 16}, {0, big, 8, 8}, {8, 8, 0, big},
      // plain cases: equal, inside, touching, apart
      {4096, 64, 4096, 64}, {4096, 64, 4100, 4}, {4096, 64, 4160, 4}, {4160, 4, 4096, 64},
      {4096, 64, 4159, 1}, {4159, 1, 4096, 64}, {4096, 64, 8192, 64},
  };
  // random ranges, half of them within 2^12 bytes of the top
  for (int i = 0; i < 20000; i++) {
    uintptr_t x = (uintptr_t)rng(), y;
    if (i % 2) x = top - (x & 0xfff);
    y = x + (uintptr_t)((int64_t)(rng() % 8192) - 4096);  // wraps on purpose
    size_t na = (size_t)(rng() % 5000), nb = (size_t)(rng() % 5000);
    if (i % 7 == 0) na = big - (size_t)(rng() % 16);
    cases.push_back({x, na, y, nb});
  }
  int shown = 0;
  size_t wrong = 0;
  for (const Case &c : cases) {
    bool want = overlap_ref(c.x, c.na, c.y, c.nb);
    int got = zpp_bytes_overlap((const void *)c.x, c.na, (const void *)c.y, c.nb);
    if (got != (want ? 1 : 0)) {
      wrong++;
      if (shown++ < 8)
        ADD_FAILURE() << std::hex << "[0x" << c.x << " + 0x" << c.na << ") and [0x" << c.y
                      << " + 0x" << c.nb << "): got " << got << ", want " << want;
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << cases.size() << " cases";
}
#endif

// ---- bad arguments --------------------------------------------------------------------

TEST(QuantErrors, EveryBadArgumentReturnsItsCodeAndNamesIt) {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint8_t enc[64];
  zpp_quant_config_t c = make_cfg(8, 4, false);
  auto expect = [](zpp_status_t got, zpp_status_t want, const char *needle) {
    EXPECT_EQ(got, want) << zpp_get_last_error();
    EXPECT_NE(std::string(zpp_get_last_error()).find(needle), std::string::npos)
        << "message \"" << zpp_get_last_error() << "\" should name " << needle;
  };
  expect(zpp_quant_encode(nullptr, ZPP_FLOAT32, x, 8, enc, 64), ZPP_ERR_NULL_POINTER, "cfg");
  expect(zpp_quant_encode(&c, ZPP_FLOAT32, nullptr, 8, enc, 64), ZPP_ERR_NULL_POINTER, "src");
  expect(zpp_quant_encode(&c, ZPP_FLOAT32, x, 8, nullptr, 64), ZPP_ERR_NULL_POINTER, "dst");
  expect(zpp_quant_encode(&c, ZPP_FLOAT32, x, 8, enc, 15), ZPP_ERR_BUFFER_TOO_SMALL, "dst_bytes");
  expect(zpp_quant_encode(&c, (zpp_dtype_t)7, x, 8, enc, 64), ZPP_ERR_INVALID_ARGUMENT, "dtype");
  expect(zpp_quant_decode(&c, enc, 15, 8, ZPP_FLOAT32, x), ZPP_ERR_BUFFER_TOO_SMALL, "src_bytes");
  expect(zpp_quant_decode(&c, enc, 64, 8, ZPP_FLOAT32, nullptr), ZPP_ERR_NULL_POINTER, "dst");
  expect(zpp_quant_decode_accumulate(&c, enc, 64, 8, nullptr), ZPP_ERR_NULL_POINTER, "acc");
  zpp_quant_config_t b3 = make_cfg(3, 4, false);
  expect(zpp_quant_encode(&b3, ZPP_FLOAT32, x, 8, enc, 64), ZPP_ERR_INVALID_ARGUMENT, "bits 3");
  zpp_quant_config_t b0 = make_cfg(8, 0, false);
  expect(zpp_quant_encoded_size(&b0, 8, nullptr), ZPP_ERR_INVALID_ARGUMENT, "block_size 0");
  zpp_quant_config_t m9 = make_cfg(8, 4, false);
  m9.mode = (zpp_quant_mode_t)9;
  expect(zpp_quant_config_check(&m9), ZPP_ERR_INVALID_ARGUMENT, "mode 9");
  zpp_quant_config_t old = make_cfg(8, 4, false);
  old.struct_size = 4;
  expect(zpp_quant_config_check(&old), ZPP_ERR_INVALID_ARGUMENT, "struct_size");
  size_t sz;
  expect(zpp_quant_encoded_size(&c, SIZE_MAX, &sz), ZPP_ERR_OVERFLOW, "count");
  expect(zpp_quant_encode(&c, ZPP_FLOAT32, x, SIZE_MAX / 2, enc, 64), ZPP_ERR_OVERFLOW, "count");
  expect(zpp_quant_encoded_size(&c, 8, nullptr), ZPP_ERR_NULL_POINTER, "bytes");
}

// Found by tests/fuzz/fuzz_quant_decode (corpus regression-dtype3-*): dtype
// 3 is the kernels' internal "accumulate" kind, and zpp_quant_decode once
// took it for decode_accumulate, reading and writing 4 bytes per element
// of a dst the caller sized for its dtype.  Every value outside the
// enum, and 3 (now ZPP_UINT8, which no computing call takes), must be
// rejected before any kernel runs.
TEST(QuantErrors, DecodeRejectsEveryDtypeOutsideTheEnum) {
  float x[16] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16};
  uint8_t enc[128];
  size_t need = 0;
  zpp_quant_config_t c = make_cfg(8, 4, false);
  ASSERT_EQ(zpp_quant_encoded_size(&c, 16, &need), ZPP_OK);
  ASSERT_EQ(zpp_quant_encode(&c, ZPP_FLOAT32, x, 16, enc, sizeof enc), ZPP_OK);
  for (int d : {-1, 3, 4, 255}) {
    uint16_t out[16];
    for (auto &o : out)
      o = 0xabcd;
    EXPECT_EQ(zpp_quant_decode(&c, enc, need, 16, (zpp_dtype_t)d, out),
              ZPP_ERR_INVALID_ARGUMENT) << "dtype " << d;
    // 3 is ZPP_UINT8 now, a dtype of the plain all-gather only: named so
    std::string want = d == 3 ? "dtype ZPP_UINT8" : "dtype " + std::to_string(d);
    EXPECT_NE(std::string(zpp_get_last_error()).find(want), std::string::npos)
        << zpp_get_last_error();
    for (auto o : out)
      EXPECT_EQ(o, 0xabcd) << "dtype " << d << ": dst was written";
    EXPECT_EQ(zpp_quant_decode_device(&c, enc, need, 16, (zpp_dtype_t)d, out,
                                      nullptr),
              ZPP_ERR_INVALID_ARGUMENT) << "dtype " << d << ": "
                                         << zpp_get_last_error();
  }
}

TEST(QuantErrors, DeviceCallsWithoutADeviceSayWhy) {
  if (zpp_cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  zpp_quant_config_t c = make_cfg(8, 4, false);
  float x[4] = {1, 2, 3, 4};
  uint8_t enc[8];
  EXPECT_EQ(zpp_quant_encode_device(&c, ZPP_FLOAT32, x, 4, enc, 8, nullptr),
            ZPP_ERR_UNSUPPORTED);
  EXPECT_FALSE(std::string(zpp_get_last_error()).empty());
  // argument errors are still reported first
  EXPECT_EQ(zpp_quant_encode_device(&c, ZPP_FLOAT32, x, 4, enc, 1, nullptr),
            ZPP_ERR_BUFFER_TOO_SMALL);
}

TEST(QuantApi, VersionAndStatusStrings) {
  int v = 0;
  ASSERT_EQ(zpp_get_version(&v), ZPP_OK);
  EXPECT_EQ(v, ZPP_VERSION_CODE);
  EXPECT_EQ(zpp_get_version(nullptr), ZPP_ERR_NULL_POINTER);
  for (int s = 0; s >= ZPP_ERR_INTERNAL; s--)
    EXPECT_EQ(std::string(zpp_status_string((zpp_status_t)s)).rfind("ZPP_", 0), 0u) << s;
  zpp_dtype_t dt;
  EXPECT_EQ(zpp_dtype_parse("bf16", &dt), ZPP_OK);
  EXPECT_EQ(dt, ZPP_BFLOAT16);
  EXPECT_EQ(zpp_dtype_parse("int8", &dt), ZPP_ERR_INVALID_ARGUMENT);
}

}  // namespace
