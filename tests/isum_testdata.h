// The input data of the integer-sum kernel tests (test_isum_simd.cc on the
// host's SIMD paths, test_isum_cuda.cc on the device kernels): count
// elements stored as dtype into v, per block a random magnitude 2^k (k in
// [-12, 12]); of 16 blocks one is all zero, one holds +-Inf, one NaN, one
// an element at -magnitude.
#ifndef ZPP_TESTS_ISUM_TESTDATA_H
#define ZPP_TESTS_ISUM_TESTDATA_H

#include "kernels/quant_math.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>

inline void isum_fill_input(std::mt19937_64 &rng, int dtype, size_t count, size_t block,
                            uint8_t *v) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 12), pick(0, 15);
  for (size_t off = 0; off < count; off += block) {
    size_t len = std::min(block, count - off);
    int kind = pick(rng);
    float mag = std::ldexp(1.0f, ex(rng));
    for (size_t i = 0; i < len; i++) {
      float x = kind == 0 ? 0.0f : u(rng) * mag;
      if (kind == 1 && i == len / 2)
        x = (rng() & 1) ? INFINITY : -INFINITY;
      if (kind == 2 && i == len / 3)
        x = NAN;
      if (kind == 3 && i == 0)
        x = -mag;
      zpp_qm_store(v, off + i, dtype, x);
    }
  }
}

#endif
