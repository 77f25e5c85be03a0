/*
 * The arithmetic of zpp-train's linear layers (tools/zpp_train.c), for bl
 * samples at a time.
 *
 * Every output element is summed in one fixed order, the order of the
 * plain per-sample loops (tests/runtime/test_train.cc keeps those as the
 * reference and checks these bitwise): the loops are only reordered
 * across independent sums, so that each weight row is read once per step
 * instead of once per sample, and independent sums fill the vector lanes.
 * No sum is reassociated; the build has no FMA contraction
 * (-ffp-contract=off, CMakeLists.txt), so a product is rounded before it
 * is added, as in the plain loops.  The lane count changes which
 * independent sums run side by side, never the order within one: every
 * instruction set gives the same bits.
 *
 * The lanes are GNU C vectors of 8 floats (GCC and Clang, any target):
 * written out because GCC, left to itself, vectorizes the dot products'
 * ordered sums as in-order reductions, lane by lane, slower than scalar.
 * Element-wise vector arithmetic is IEEE single precision per lane.  On
 * x86-64 each kernel is built twice (target_clones): for AVX2, one
 * instruction per 8 lanes, chosen at load time where the CPU has it, and
 * for the baseline, two SSE instructions per 8 lanes.
 *
 * The parameters and the weight gradient are bf16, as the trainer holds
 * and reduces them: the kernels widen the weights as they read them
 * (exact) and round the gradient to nearest even as they write it, the
 * rounding of zpp_qm_f32_to_bf16, instead of a pass that widens a layer
 * into an fp32 copy before and one that narrows an fp32 gradient after
 * (4 + 2 bytes a parameter less through memory each way).
 *
 * Layouts: weights row-major [fan_out][fan_in]; activations and
 * gradients sample-major, sample b at b * ld.  Valid C11 and C++ (the test
 * includes it).
 */
#ifndef ZPP_TRAIN_MATH_H
#define ZPP_TRAIN_MATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "zpp_internal/kernels.h" /* zpp_qm_bf16_to_f32, zpp_qm_f32_to_bf16 */

typedef float train_vf __attribute__((vector_size(32)));
typedef uint32_t train_vu __attribute__((vector_size(32)));
typedef uint16_t train_vh __attribute__((vector_size(16)));
#define TRAIN_LANES 8

/* ZPP_TRAIN_NO_CLONES: the baseline only (tests/runtime checks both).
 * ThreadSanitizer builds (ZPP_SANITIZE=thread) get the baseline too: the
 * clones' ifunc resolver is instrumented and runs during relocation,
 * before the TSan runtime is initialized, so the program crashed at load
 * (zpp-train --help included). */
#if defined(__SANITIZE_THREAD__)
#define TRAIN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRAIN_TSAN 1
#endif
#endif
#if defined(__x86_64__) && (defined(__clang__) || defined(__GNUC__)) && \
    !defined(ZPP_TRAIN_NO_CLONES) && !defined(TRAIN_TSAN)
#define TRAIN_KERNEL                                                           \
  static inline __attribute__((target_clones("avx2", "default")))
#else
#define TRAIN_KERNEL static inline
#endif

/* train_load_bf16x2's shuffles put each bf16 in the high half of a 32-bit
 * lane of a little-endian vector */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tools/train_math.h: little-endian targets only"
#endif

/* The vector helpers are macros (GNU statement expressions), not
 * functions: a function that takes or returns a 32-byte vector has an ABI
 * that differs with AVX, which Clang refuses in the baseline clone even
 * where the call is inlined. */

/* 8 floats at p (unaligned) */
#define train_load(p)                                                          \
  __extension__({                                                              \
    train_vf v_;                                                               \
    memcpy(&v_, (p), sizeof v_);                                               \
    v_;                                                                        \
  })
#define train_store(p, v)                                                      \
  do {                                                                         \
    const train_vf s_ = (v);                                                   \
    memcpy((p), &s_, sizeof s_);                                               \
  } while (0)
/* the 32 bits b in every lane, as floats: an OR into a zero vector (exact
 * for every value, -0 and NaN included) because GCC builds the plain
 * initializer lane by lane instead of broadcasting */
#define train_splat_bits(b)                                                    \
  __extension__({                                                              \
    const train_vu z_ = {0, 0, 0, 0, 0, 0, 0, 0};                              \
    const train_vu u_ = z_ | (uint32_t)(b);                                    \
    train_vf v_;                                                               \
    memcpy(&v_, &u_, sizeof v_);                                               \
    v_;                                                                        \
  })
/* the float s in every lane */
#define train_splat(s)                                                         \
  __extension__({                                                              \
    const float f_ = (s);                                                      \
    uint32_t b_;                                                               \
    memcpy(&b_, &f_, sizeof b_);                                               \
    train_splat_bits(b_);                                                      \
  })
/* the bf16 h, widened (exact), in every lane */
#define train_splat_bf(h) train_splat_bits((uint32_t)(h) << 16)
/* 8 bf16 at p, widened */
#define train_load_bf(p)                                                       \
  __extension__({                                                              \
    train_vh h_;                                                               \
    memcpy(&h_, (p), sizeof h_);                                               \
    const train_vu u_ = __builtin_convertvector(h_, train_vu) << 16;           \
    train_vf v_;                                                               \
    memcpy(&v_, &u_, sizeof v_);                                               \
    v_;                                                                        \
  })

/* Two-input shuffle of vectors a and b by the constant lane indices that
 * follow, of the mask type mask_t (an integer vector of a's lane count and
 * width): GCC's builtin takes the mask as a vector, Clang's as arguments. */
typedef uint16_t train_vh16 __attribute__((vector_size(32)));
#if defined(__clang__)
#define TRAIN_SHUFFLE(mask_t, a, b, ...)                                       \
  __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define TRAIN_SHUFFLE(mask_t, a, b, ...)                                       \
  __builtin_shuffle(a, b, (mask_t){__VA_ARGS__})
#endif

/* 16 bf16 at p, widened into lo and hi in the order of AVX2's in-lane
 * unpacks (one shuffle each, no shift): lo gets elements 0-3 and 8-11, hi
 * 4-7 and 12-15.  train_swap_halves converts between that order and
 * memory order. */
#define train_load_bf16x2(p, lo, hi)                                           \
  do {                                                                         \
    const train_vh16 z_ = {0};                                                 \
    train_vh16 h_;                                                             \
    memcpy(&h_, (p), sizeof h_);                                               \
    const train_vh16 l_ = TRAIN_SHUFFLE(train_vh16, z_, h_, 0, 16, 0, 17, 0,  \
                                        18, 0, 19, 0, 24, 0, 25, 0, 26, 0,    \
                                        27);                                  \
    const train_vh16 u_ = TRAIN_SHUFFLE(train_vh16, z_, h_, 0, 20, 0, 21, 0,  \
                                        22, 0, 23, 0, 28, 0, 29, 0, 30, 0,    \
                                        31);                                  \
    memcpy(&(lo), &l_, sizeof(lo));                                            \
    memcpy(&(hi), &u_, sizeof(hi));                                            \
  } while (0)
/* 16 floats in x (elements 0-7) and y (8-15) to unpack order in lo, hi;
 * and back, by the same two shuffles */
#define train_swap_halves(x, y, lo, hi)                                        \
  do {                                                                         \
    const train_vf x_ = (x), y_ = (y);                                         \
    (lo) = TRAIN_SHUFFLE(train_vu, x_, y_, 0, 1, 2, 3, 8, 9, 10, 11);         \
    (hi) = TRAIN_SHUFFLE(train_vu, x_, y_, 4, 5, 6, 7, 12, 13, 14, 15);       \
  } while (0)

/* v rounded to 8 bf16 at p, lane by lane zpp_qm_f32_to_bf16: nearest
 * even, NaN quietened with its sign and top payload, overflow to Inf */
#define train_store_bf(p, v)                                                   \
  do {                                                                         \
    const train_vf f_ = (v);                                                   \
    train_vu u_;                                                               \
    memcpy(&u_, &f_, sizeof u_);                                               \
    const train_vu nan_ = (train_vu)((u_ & 0x7fffffffu) > 0x7f800000u);        \
    const train_vu r_ = (u_ + 0x7fffu + ((u_ >> 16) & 1u)) >> 16;              \
    const train_vu q_ = (u_ >> 16) | 0x0040u;                                  \
    const train_vh h_ =                                                        \
        __builtin_convertvector((r_ & ~nan_) | (q_ & nan_), train_vh);         \
    memcpy((p), &h_, sizeof h_);                                               \
  } while (0)

/* Columns of the transposed input of train_forward: bl rounded up to a
 * whole vector. */
static inline size_t train_lanes(int bl) {
  return ((size_t)bl + TRAIN_LANES - 1) / TRAIN_LANES * TRAIN_LANES;
}

/* xt[i * ns + b] = x[b * ldx + i] for b < bl; 0 for bl <= b < ns (the
 * padding lanes are computed and discarded). */
static inline void train_transpose(const float *x, size_t ldx, int bl, int n,
                                   size_t ns, float *xt) {
  for (int i = 0; i < n; i++) {
    float *r = xt + (size_t)i * ns;
    for (int b = 0; b < bl; b++)
      r[b] = x[(size_t)b * ldx + i];
    for (size_t b = (size_t)bl; b < ns; b++)
      r[b] = 0.0f;
  }
}

/* Forward of a linear layer, before the activation:
 *   z_b[k] = (((bias[k] + w[k][0] x_b[0]) + w[k][1] x_b[1]) + ...)
 *            + w[k][fan_in - 1] x_b[fan_in - 1]
 * for b < bl, k < fan_out; w and bias bf16.  xt: the inputs from
 * train_transpose (ns = train_lanes(bl) columns); z_b at z + b * ldz.
 * Tiles of 8 rows x 8 samples (8 accumulators): a row tile is read once
 * from memory and once more from cache per further 8 samples. */
TRAIN_KERNEL void train_forward(const uint16_t *w, const uint16_t *bias,
                                int fan_out, int fan_in, const float *xt,
                                size_t ns, int bl, float *z, size_t ldz) {
  int k = 0;
  for (; k + 8 <= fan_out; k += 8) {
    const uint16_t *wk = w + (size_t)k * fan_in;
    for (size_t b0 = 0; b0 < ns; b0 += TRAIN_LANES) {
      train_vf a[8];
      for (int r = 0; r < 8; r++)
        a[r] = train_splat_bf(bias[k + r]);
      for (int i = 0; i < fan_in; i++) {
        const train_vf xv = train_load(xt + (size_t)i * ns + b0);
        for (int r = 0; r < 8; r++)
          a[r] += train_splat_bf(wk[(size_t)r * fan_in + i]) * xv;
      }
      for (int r = 0; r < 8; r++)
        for (int j = 0; j < TRAIN_LANES && b0 + (size_t)j < (size_t)bl; j++)
          z[(b0 + (size_t)j) * ldz + k + r] = a[r][j];
    }
  }
  for (; k < fan_out; k++) { /* the last fan_out % 8 rows, one at a time */
    const uint16_t *wk = w + (size_t)k * fan_in;
    for (size_t b0 = 0; b0 < ns; b0 += TRAIN_LANES) {
      train_vf a = train_splat_bf(bias[k]);
      for (int i = 0; i < fan_in; i++)
        a += train_splat_bf(wk[i]) *
             train_load(xt + (size_t)i * ns + b0);
      for (int j = 0; j < TRAIN_LANES && b0 + (size_t)j < (size_t)bl; j++)
        z[(b0 + (size_t)j) * ldz + k] = a[j];
    }
  }
}

/* Weight and bias gradient of a linear layer, samples in order, rounded
 * once to bf16 at the end:
 *   g[k][i] = bf16(((0 + d_0[k] x_0[i]) + d_1[k] x_1[i]) + ...
 *                  + d_{bl-1}[k] x_{bl-1}[i])
 *   gb[k]   = bf16(((0 + d_0[k]) + d_1[k]) + ... + d_{bl-1}[k])
 * d_b (fan_out) at d + b * ldd, x_b (fan_in) at x + b * ldx; g is
 * [fan_out][fan_in], gb has fan_out elements.  Tiles of 1 row x 64
 * inputs (8 accumulators); each element of g is written once. */
TRAIN_KERNEL void train_weight_grad(const float *d, size_t ldd,
                                    const float *x, size_t ldx, int bl,
                                    int fan_out, int fan_in, uint16_t *g,
                                    uint16_t *gb) {
  for (int k = 0; k < fan_out; k++) {
    uint16_t *gr = g + (size_t)k * fan_in;
    int i = 0;
    for (; i + 8 * TRAIN_LANES <= fan_in; i += 8 * TRAIN_LANES) {
      train_vf a[8];
      for (int u = 0; u < 8; u++)
        a[u] = train_splat(0.0f);
      for (int b = 0; b < bl; b++) {
        const train_vf dk = train_splat(d[(size_t)b * ldd + k]);
        const float *xb = x + (size_t)b * ldx + i;
        for (int u = 0; u < 8; u++)
          a[u] += dk * train_load(xb + TRAIN_LANES * u);
      }
      for (int u = 0; u < 8; u++)
        train_store_bf(gr + i + TRAIN_LANES * u, a[u]);
    }
    for (; i + TRAIN_LANES <= fan_in; i += TRAIN_LANES) {
      train_vf a = train_splat(0.0f);
      for (int b = 0; b < bl; b++)
        a += train_splat(d[(size_t)b * ldd + k]) *
             train_load(x + (size_t)b * ldx + i);
      train_store_bf(gr + i, a);
    }
    for (; i < fan_in; i++) {
      float a = 0.0f;
      for (int b = 0; b < bl; b++)
        a += d[(size_t)b * ldd + k] * x[(size_t)b * ldx + i];
      gr[i] = zpp_qm_f32_to_bf16(a);
    }
    float sb = 0.0f;
    for (int b = 0; b < bl; b++)
      sb += d[(size_t)b * ldd + k];
    gb[k] = zpp_qm_f32_to_bf16(sb);
  }
}

/* Gradient with respect to the layer's input, rows in order:
 *   dp_b[i] = ((0 + w[0][i] d_b[0]) + w[1][i] d_b[1]) + ...
 *             + w[fan_out - 1][i] d_b[fan_out - 1]
 * w bf16; d_b at d + b * ldd, dp_b (fan_in) at dp + b * ldp.  Blocks of 64
 * rows (128 KiB of w at fan_in 1024, on 32 pages: cache and TLB) in order;
 * in a block, tiles of 1 sample x 64 inputs (8 accumulators, continuing
 * the partial sums the previous block stored) run down a column strip of
 * the block, read from memory for the first sample and from cache after. */
TRAIN_KERNEL void train_input_grad(const uint16_t *w, int fan_out, int fan_in,
                                   const float *d, size_t ldd, int bl,
                                   float *dp, size_t ldp) {
  for (int k0 = 0; k0 == 0 || k0 < fan_out; k0 += 64) {
    const int k1 = fan_out - k0 < 64 ? fan_out : k0 + 64;
    int i = 0;
    for (; i + 8 * TRAIN_LANES <= fan_in; i += 8 * TRAIN_LANES)
      for (int b = 0; b < bl; b++) {
        const float *db = d + (size_t)b * ldd;
        float *o = dp + (size_t)b * ldp + i;
        /* a[2v], a[2v + 1]: inputs i + 16v .. + 15 in unpack order */
        train_vf a[8];
        for (int v = 0; v < 4; v++)
          if (k0)
            train_swap_halves(train_load(o + 16 * v),
                              train_load(o + 16 * v + 8), a[2 * v],
                              a[2 * v + 1]);
          else
            a[2 * v] = a[2 * v + 1] = train_splat(0.0f);
        for (int k = k0; k < k1; k++) {
          const uint16_t *wk = w + (size_t)k * fan_in + i;
          const train_vf dk = train_splat(db[k]);
          for (int v = 0; v < 4; v++) {
            train_vf lo, hi;
            train_load_bf16x2(wk + 16 * v, lo, hi);
            a[2 * v] += lo * dk;
            a[2 * v + 1] += hi * dk;
          }
        }
        for (int v = 0; v < 4; v++) {
          train_vf x, y;
          train_swap_halves(a[2 * v], a[2 * v + 1], x, y);
          train_store(o + 16 * v, x);
          train_store(o + 16 * v + 8, y);
        }
      }
    for (; i + TRAIN_LANES <= fan_in; i += TRAIN_LANES)
      for (int b = 0; b < bl; b++) {
        const float *db = d + (size_t)b * ldd;
        float *o = dp + (size_t)b * ldp + i;
        train_vf a = k0 ? train_load(o) : train_splat(0.0f);
        for (int k = k0; k < k1; k++)
          a += train_load_bf(w + (size_t)k * fan_in + i) * train_splat(db[k]);
        train_store(o, a);
      }
    for (; i < fan_in; i++)
      for (int b = 0; b < bl; b++) {
        const float *db = d + (size_t)b * ldd;
        float a = k0 ? dp[(size_t)b * ldp + i] : 0.0f;
        for (int k = k0; k < k1; k++)
          a += zpp_qm_bf16_to_f32(w[(size_t)k * fan_in + i]) * db[k];
        dp[(size_t)b * ldp + i] = a;
      }
  }
}

#endif
