// Input data and output comparison shared by the CUDA codec tests
// (test_quant_cuda on a GPU, test_quant_cuda_emu on the CPU emulator).
//
// Inputs are random with a printed seed (ZPP_TEST_SEED) and mix in what the
// format treats specially: zero blocks, constant blocks, subnormals, +-0,
// NaN and +-Inf (single elements and whole blocks), raw bit patterns
// (NaN payloads, half subnormals), and values whose asymmetric range
// overflows fp32.  Regions of the structured part are aligned to 2^20
// elements and to 4096, so they form whole blocks for every power-of-two
// block size and most blocks of odd sizes.
#ifndef ZPP_TESTS_QUANT_CUDA_TESTDATA_H
#define ZPP_TESTS_QUANT_CUDA_TESTDATA_H

#include <zpp/zpp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quant_cpu.h"
#include "kernels/quant_math.h"

namespace zpp_test {

inline uint64_t test_seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

inline uint64_t print_seed(const char *what) {
  uint64_t seed = test_seed();
  std::printf("[ seed ] %s: ZPP_TEST_SEED=%llu\n", what,
              (unsigned long long)seed);
  return seed;
}

// splitmix64: fast, and the same sequence on every platform.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t below(uint32_t n) { return (uint32_t)(next() % n); }
};

inline size_t dtype_size(int dt) { return dt == ZPP_QM_F32 ? 4 : 2; }

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Stores v as element i of a dtype buffer (fp16/bf16 by the shared
// round-to-nearest-even conversions), or raw bits of the element width.
inline void put_value(uint8_t *buf, int dt, size_t i, float v) {
  if (dt == ZPP_QM_F32) {
    std::memcpy(buf + 4 * i, &v, 4);
    return;
  }
  uint16_t h = dt == ZPP_QM_BF16 ? zpp_qm_f32_to_bf16(v) : zpp_qm_f32_to_f16(v);
  std::memcpy(buf + 2 * i, &h, 2);
}
inline void put_bits(uint8_t *buf, int dt, size_t i, uint32_t bits) {
  if (dt == ZPP_QM_F32) {
    std::memcpy(buf + 4 * i, &bits, 4);
    return;
  }
  uint16_t h = (uint16_t)bits;
  std::memcpy(buf + 2 * i, &h, 2);
}

// A subnormal of the element format, as raw bits, random sign.
inline uint32_t subnormal_bits(Rng &r, int dt) {
  uint32_t sign = (uint32_t)(r.next() & 1);
  if (dt == ZPP_QM_F32) return sign << 31 | (1 + r.below(0x7fffff));
  if (dt == ZPP_QM_F16) return sign << 15 | (1 + r.below(0x3ff));
  return sign << 15 | (1 + r.below(0x7f));  // bf16
}

// n elements of dtype `dt`, deterministic in (seed, dt, n).
inline std::vector<uint8_t> make_input(uint64_t seed, int dt, size_t n) {
  Rng r(seed ^ (0x51ed27ull * (uint64_t)(dt + 1)));
  std::vector<uint8_t> buf(n * dtype_size(dt));
  // fp16 keeps its exponents small so that most blocks stay finite
  const int emin = dt == ZPP_QM_F16 ? -12 : -40, emax = dt == ZPP_QM_F16 ? 8 : 40;
  double mag = 1.0, shift = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (i % 64 == 0) {  // a new magnitude (and offset) every 64 elements
      mag = std::ldexp(1.0, emin + (int)r.below((uint32_t)(emax - emin + 1)));
      shift = r.below(4) == 0 ? mag * (r.uniform() * 8.0 - 4.0) : 0.0;
    }
    uint32_t p = r.below(1 << 16);
    if (p < 1024) {
      put_value(buf.data(), dt, i, p < 512 ? 0.0f : -0.0f);
    } else if (p < 1280) {
      put_bits(buf.data(), dt, i, subnormal_bits(r, dt));
    } else if (p < 1296) {
      put_bits(buf.data(), dt, i, (uint32_t)r.next());  // any pattern
    } else if (p < 1300) {
      put_value(buf.data(), dt, i, p & 1 ? NAN : (p & 2 ? INFINITY : -INFINITY));
    } else {
      put_value(buf.data(), dt, i, (float)((r.uniform() * 2.0 - 1.0) * mag + shift));
    }
  }
  // a few fixed elements near the start, for the short lengths
  if (n > 2) put_value(buf.data(), dt, 1, -0.0f);
  if (n > 3) put_bits(buf.data(), dt, 2, subnormal_bits(r, dt));
  // zero runs: whole blocks for every block size <= 1024 and 1, 3, 7
  for (size_t s = 8192; s + 4096 <= n; s += 16384)
    for (size_t i = s; i < s + 4096; i++) put_value(buf.data(), dt, i, 0.0f);
  // structured regions of 2^20 elements (block sizes up to 2^20)
  const size_t M = (size_t)1 << 20;
  auto region = [&](size_t k, auto fill) {
    for (size_t i = k * M; i < (k + 1) * M && i < n; i++) fill(i);
  };
  region(1, [&](size_t i) { put_value(buf.data(), dt, i, 0.0f); });
  region(3, [&](size_t i) { put_value(buf.data(), dt, i, 1.5f); });  // constant
  region(5, [&](size_t i) { put_bits(buf.data(), dt, i, subnormal_bits(r, dt)); });
  if (7 * M + 12345 < n) put_value(buf.data(), dt, 7 * M + 12345, NAN);
  if (9 * M + 777 < n) put_value(buf.data(), dt, 9 * M + 777, INFINITY);
  // fp32: +-3e38 in one block, a range beyond FLT_MAX (non-finite block)
  region(11, [&](size_t i) {
    put_value(buf.data(), dt, i,
              dt == ZPP_QM_F32 ? (i % 2 ? 3e38f : -3e38f) : (float)(i % 7) - 3.0f);
  });
  return buf;
}

// Finite fp32 start values of an accumulator.
inline std::vector<float> make_acc(uint64_t seed, size_t n) {
  Rng r(seed ^ 0xacc0ull);
  std::vector<float> a(n);
  for (size_t i = 0; i < n; i++) a[i] = (float)(r.uniform() * 4.0 - 2.0);
  return a;
}

// Output element width of a decode kind (ZPP_QM_OUT_ACC: fp32).
inline size_t out_size(int kind) { return kind == ZPP_QM_OUT_ACC ? 4 : dtype_size(kind); }

inline const char *kind_name(int kind) {
  return kind == ZPP_QM_F32 ? "fp32" : kind == ZPP_QM_F16 ? "fp16"
         : kind == ZPP_QM_BF16 ? "bf16" : "acc";
}

// Index of the first decoded element whose bits differ, NaN == NaN (the
// device may return a different NaN payload, e.g. the canonical NaN of a
// multiply); n when all agree.
inline size_t first_mismatch(const uint8_t *a, const uint8_t *b, size_t n,
                             int kind) {
  size_t w = out_size(kind);
  for (size_t i = 0; i < n; i++) {
    uint32_t x = 0, y = 0;
    std::memcpy(&x, a + w * i, w);
    std::memcpy(&y, b + w * i, w);
    if (x == y) continue;
    bool nx, ny;
    if (w == 4) {
      nx = (x & 0x7fffffffu) > 0x7f800000u;
      ny = (y & 0x7fffffffu) > 0x7f800000u;
    } else if (kind == ZPP_QM_F16) {
      nx = (x & 0x7fffu) > 0x7c00u;
      ny = (y & 0x7fffu) > 0x7c00u;
    } else {
      nx = (x & 0x7fffu) > 0x7f80u;
      ny = (y & 0x7fffu) > 0x7f80u;
    }
    if (!(nx && ny)) return i;
  }
  return n;
}

inline std::string describe(int dt, int bits, bool asym, size_t block, size_t n) {
  return std::string(dt == ZPP_QM_F32 ? "fp32" : dt == ZPP_QM_F16 ? "fp16" : "bf16") +
         " int" + std::to_string(bits) + (asym ? " asym" : " sym") + " block " +
         std::to_string(block) + " n " + std::to_string(n);
}

}  // namespace zpp_test

#endif  // ZPP_TESTS_QUANT_CUDA_TESTDATA_H
