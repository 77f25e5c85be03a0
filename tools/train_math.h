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
 * is added, as in the plain loops.
 *
 * The lanes are GNU C vectors of 4 floats (GCC and Clang, any target):
 * written out because GCC, left to itself, vectorizes the dot products'
 * ordered sums as in-order reductions, lane by lane, slower than scalar.
 * Element-wise vector arithmetic is IEEE single precision per lane.
 *
 * Layouts: weights row-major [fan_out][fan_in]; activations and
 * gradients sample-major, sample b at b * ld.  Valid C11 and C++ (the test
 * includes it).
 */
#ifndef ZPP_TRAIN_MATH_H
#define ZPP_TRAIN_MATH_H

#include <stddef.h>
#include <string.h>

typedef float train_v4 __attribute__((vector_size(16)));

static inline train_v4 train_load(const float *p) { /* unaligned */
  train_v4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void train_store(float *p, train_v4 v) {
  memcpy(p, &v, sizeof v);
}
static inline train_v4 train_splat(float s) {
  train_v4 v = {s, s, s, s};
  return v;
}

/* Columns of the transposed input of train_forward: bl rounded up to a
 * whole vector. */
static inline size_t train_lanes(int bl) { return ((size_t)bl + 3) / 4 * 4; }

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
 * for b < bl, k < fan_out.  xt: the inputs from train_transpose (ns =
 * train_lanes(bl) columns); z_b at z + b * ldz.  Tiles of 8 rows x 4
 * samples (8 accumulators): a row tile is read once from memory and once
 * more from cache per further 4 samples. */
static inline void train_forward(const float *w, const float *bias,
                                 int fan_out, int fan_in, const float *xt,
                                 size_t ns, int bl, float *z, size_t ldz) {
  int k = 0;
  for (; k + 8 <= fan_out; k += 8) {
    const float *wk = w + (size_t)k * fan_in;
    for (size_t b0 = 0; b0 < ns; b0 += 4) {
      train_v4 a[8];
      for (int r = 0; r < 8; r++)
        a[r] = train_splat(bias[k + r]);
      for (int i = 0; i < fan_in; i++) {
        const train_v4 xv = train_load(xt + (size_t)i * ns + b0);
        for (int r = 0; r < 8; r++)
          a[r] += train_splat(wk[(size_t)r * fan_in + i]) * xv;
      }
      for (int r = 0; r < 8; r++)
        for (int j = 0; j < 4 && b0 + (size_t)j < (size_t)bl; j++)
          z[(b0 + (size_t)j) * ldz + k + r] = a[r][j];
    }
  }
  for (; k < fan_out; k++) { /* the last fan_out % 8 rows, one at a time */
    const float *wk = w + (size_t)k * fan_in;
    for (size_t b0 = 0; b0 < ns; b0 += 4) {
      train_v4 a = train_splat(bias[k]);
      for (int i = 0; i < fan_in; i++)
        a += train_splat(wk[i]) * train_load(xt + (size_t)i * ns + b0);
      for (int j = 0; j < 4 && b0 + (size_t)j < (size_t)bl; j++)
        z[(b0 + (size_t)j) * ldz + k] = a[j];
    }
  }
}

/* Weight and bias gradient of a linear layer, samples in order:
 *   g[k][i] = ((0 + d_0[k] x_0[i]) + d_1[k] x_1[i]) + ...
 *             + d_{bl-1}[k] x_{bl-1}[i]
 *   gb[k]   = ((0 + d_0[k]) + d_1[k]) + ... + d_{bl-1}[k]
 * d_b (fan_out) at d + b * ldd, x_b (fan_in) at x + b * ldx; g is
 * [fan_out][fan_in], gb has fan_out elements.  Tiles of 1 row x 32
 * inputs (8 accumulators); each element of g is written once. */
static inline void train_weight_grad(const float *d, size_t ldd,
                                     const float *x, size_t ldx, int bl,
                                     int fan_out, int fan_in, float *g,
                                     float *gb) {
  for (int k = 0; k < fan_out; k++) {
    float *gr = g + (size_t)k * fan_in;
    int i = 0;
    for (; i + 32 <= fan_in; i += 32) {
      train_v4 a[8];
      for (int u = 0; u < 8; u++)
        a[u] = train_splat(0.0f);
      for (int b = 0; b < bl; b++) {
        const train_v4 dk = train_splat(d[(size_t)b * ldd + k]);
        const float *xb = x + (size_t)b * ldx + i;
        for (int u = 0; u < 8; u++)
          a[u] += dk * train_load(xb + 4 * u);
      }
      for (int u = 0; u < 8; u++)
        train_store(gr + i + 4 * u, a[u]);
    }
    for (; i + 4 <= fan_in; i += 4) {
      train_v4 a = train_splat(0.0f);
      for (int b = 0; b < bl; b++)
        a += train_splat(d[(size_t)b * ldd + k]) *
             train_load(x + (size_t)b * ldx + i);
      train_store(gr + i, a);
    }
    for (; i < fan_in; i++) {
      float a = 0.0f;
      for (int b = 0; b < bl; b++)
        a += d[(size_t)b * ldd + k] * x[(size_t)b * ldx + i];
      gr[i] = a;
    }
    float sb = 0.0f;
    for (int b = 0; b < bl; b++)
      sb += d[(size_t)b * ldd + k];
    gb[k] = sb;
  }
}

/* Gradient with respect to the layer's input, rows in order:
 *   dp_b[i] = ((0 + w[0][i] d_b[0]) + w[1][i] d_b[1]) + ...
 *             + w[fan_out - 1][i] d_b[fan_out - 1]
 * d_b at d + b * ldd, dp_b (fan_in) at dp + b * ldp.  Blocks of 64 rows
 * (256 KiB of w at fan_in 1024, on 64 pages: cache and TLB) in order; in
 * a block, tiles of 1 sample x 32 inputs (8 accumulators, continuing the
 * partial sums the previous block stored) run down a column strip of the
 * block, read from memory for the first sample and from cache after. */
static inline void train_input_grad(const float *w, int fan_out, int fan_in,
                                    const float *d, size_t ldd, int bl,
                                    float *dp, size_t ldp) {
  for (int k0 = 0; k0 == 0 || k0 < fan_out; k0 += 64) {
    const int k1 = fan_out - k0 < 64 ? fan_out : k0 + 64;
    int i = 0;
    for (; i + 32 <= fan_in; i += 32)
      for (int b = 0; b < bl; b++) {
        const float *db = d + (size_t)b * ldd;
        float *o = dp + (size_t)b * ldp + i;
        train_v4 a[8];
        for (int u = 0; u < 8; u++)
          a[u] = k0 ? train_load(o + 4 * u) : train_splat(0.0f);
        for (int k = k0; k < k1; k++) {
          const float *wk = w + (size_t)k * fan_in + i;
          const train_v4 dk = train_splat(db[k]);
          for (int u = 0; u < 8; u++)
            a[u] += train_load(wk + 4 * u) * dk;
        }
        for (int u = 0; u < 8; u++)
          train_store(o + 4 * u, a[u]);
      }
    for (; i + 4 <= fan_in; i += 4)
      for (int b = 0; b < bl; b++) {
        const float *db = d + (size_t)b * ldd;
        float *o = dp + (size_t)b * ldp + i;
        train_v4 a = k0 ? train_load(o) : train_splat(0.0f);
        for (int k = k0; k < k1; k++)
          a += train_load(w + (size_t)k * fan_in + i) * train_splat(db[k]);
        train_store(o, a);
      }
    for (; i < fan_in; i++)
      for (int b = 0; b < bl; b++) {
        const float *db = d + (size_t)b * ldd;
        float a = k0 ? dp[(size_t)b * ldp + i] : 0.0f;
        for (int k = k0; k < k1; k++)
          a += w[(size_t)k * fan_in + i] * db[k];
        dp[(size_t)b * ldp + i] = a;
      }
  }
}

#endif
