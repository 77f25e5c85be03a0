/*
 * The arithmetic of zpp-train's linear layers (tools/zpp_train.c), for bl
 * samples at a time.
 *
 * Every output element is summed in one fixed order, the order of the
 * plain per-sample loops (tests/runtime/test_train.cc keeps those as the
 * reference and checks these bitwise): the loops are only reordered
 * across independent sums, so that each weight row is read once per step
 * instead of once per sample and the independent sums fill the vector
 * lanes.  No sum is reassociated; the build has no FMA contraction
 * (-ffp-contract=off, CMakeLists.txt), so a product is rounded before it
 * is added, as in the plain loops.
 *
 * Layouts: weights row-major [fan_out][fan_in]; activations and
 * gradients sample-major, sample b at b * ld.  Valid C11 and C++ (the test
 * includes it).
 */
#ifndef ZPP_TRAIN_MATH_H
#define ZPP_TRAIN_MATH_H

#include <stddef.h>

#ifdef __cplusplus
#define TRAIN_RESTRICT __restrict
#else
#define TRAIN_RESTRICT restrict
#endif

/* samples per tile of the forward pass: the vector dimension */
#define TRAIN_LANES 8
/* weight rows per tile of the forward pass (4 x 8 accumulators: 8 SSE
 * registers, half the x86-64 register file) */
#define TRAIN_ROWS 4

/* Columns of the transposed input of train_forward: bl rounded up to a
 * whole tile. */
static inline size_t train_lanes(int bl) {
  return ((size_t)bl + TRAIN_LANES - 1) / TRAIN_LANES * TRAIN_LANES;
}

/* xt[i * ns + b] = x[b * ldx + i] for b < bl; 0 for bl <= b < ns (the
 * padding lanes are computed and discarded). */
static inline void train_transpose(const float *TRAIN_RESTRICT x, size_t ldx,
                                   int bl, int n, size_t ns,
                                   float *TRAIN_RESTRICT xt) {
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
 * train_lanes(bl) columns); z_b at z + b * ldz. */
static inline void train_forward(const float *TRAIN_RESTRICT w,
                                 const float *TRAIN_RESTRICT bias, int fan_out,
                                 int fan_in, const float *TRAIN_RESTRICT xt,
                                 size_t ns, int bl, float *TRAIN_RESTRICT z,
                                 size_t ldz) {
  int k = 0;
  for (; k + TRAIN_ROWS <= fan_out; k += TRAIN_ROWS) {
    const float *w0 = w + (size_t)k * fan_in;
    const float *w1 = w0 + fan_in, *w2 = w1 + fan_in, *w3 = w2 + fan_in;
    for (size_t b0 = 0; b0 < ns; b0 += TRAIN_LANES) {
      float a0[TRAIN_LANES], a1[TRAIN_LANES], a2[TRAIN_LANES],
          a3[TRAIN_LANES];
      for (int j = 0; j < TRAIN_LANES; j++) {
        a0[j] = bias[k];
        a1[j] = bias[k + 1];
        a2[j] = bias[k + 2];
        a3[j] = bias[k + 3];
      }
      for (int i = 0; i < fan_in; i++) {
        const float *xi = xt + (size_t)i * ns + b0;
        const float c0 = w0[i], c1 = w1[i], c2 = w2[i], c3 = w3[i];
        for (int j = 0; j < TRAIN_LANES; j++) {
          a0[j] += c0 * xi[j];
          a1[j] += c1 * xi[j];
          a2[j] += c2 * xi[j];
          a3[j] += c3 * xi[j];
        }
      }
      for (int j = 0; j < TRAIN_LANES && b0 + (size_t)j < (size_t)bl; j++) {
        float *zb = z + (b0 + (size_t)j) * ldz + k;
        zb[0] = a0[j];
        zb[1] = a1[j];
        zb[2] = a2[j];
        zb[3] = a3[j];
      }
    }
  }
  for (; k < fan_out; k++) { /* the last fan_out % TRAIN_ROWS rows */
    const float *w0 = w + (size_t)k * fan_in;
    for (size_t b0 = 0; b0 < ns; b0 += TRAIN_LANES) {
      float a0[TRAIN_LANES];
      for (int j = 0; j < TRAIN_LANES; j++)
        a0[j] = bias[k];
      for (int i = 0; i < fan_in; i++) {
        const float *xi = xt + (size_t)i * ns + b0;
        const float c0 = w0[i];
        for (int j = 0; j < TRAIN_LANES; j++)
          a0[j] += c0 * xi[j];
      }
      for (int j = 0; j < TRAIN_LANES && b0 + (size_t)j < (size_t)bl; j++)
        z[(b0 + (size_t)j) * ldz + k] = a0[j];
    }
  }
}

/* Weight and bias gradient of a linear layer, samples in order:
 *   g[k][i] = ((0 + d_0[k] x_0[i]) + d_1[k] x_1[i]) + ... + d_{bl-1}[k] x_{bl-1}[i]
 *   gb[k]   = ((0 + d_0[k]) + d_1[k]) + ... + d_{bl-1}[k]
 * d_b (fan_out) at d + b * ldd, x_b (fan_in) at x + b * ldx; g is
 * [fan_out][fan_in], gb has fan_out elements. */
static inline void train_weight_grad(const float *TRAIN_RESTRICT d, size_t ldd,
                                     const float *TRAIN_RESTRICT x, size_t ldx,
                                     int bl, int fan_out, int fan_in,
                                     float *TRAIN_RESTRICT g,
                                     float *TRAIN_RESTRICT gb) {
  for (int k = 0; k < fan_out; k++) {
    float *gr = g + (size_t)k * fan_in; /* 4 fan_in bytes: stays in L1 */
    for (int i = 0; i < fan_in; i++)
      gr[i] = 0.0f;
    float sb = 0.0f;
    for (int b = 0; b < bl; b++) {
      const float dk = d[(size_t)b * ldd + k];
      const float *xb = x + (size_t)b * ldx;
      for (int i = 0; i < fan_in; i++)
        gr[i] += dk * xb[i];
      sb += dk;
    }
    gb[k] = sb;
  }
}

/* Gradient with respect to the layer's input, rows in order:
 *   dp_b[i] = ((0 + w[0][i] d_b[0]) + w[1][i] d_b[1]) + ...
 *             + w[fan_out - 1][i] d_b[fan_out - 1]
 * d_b at d + b * ldd, dp_b (fan_in) at dp + b * ldp.  Each weight row is
 * read once, contiguously, for all samples (dp: 4 bl fan_in bytes, kept
 * in cache). */
static inline void train_input_grad(const float *TRAIN_RESTRICT w, int fan_out,
                                    int fan_in, const float *TRAIN_RESTRICT d,
                                    size_t ldd, int bl,
                                    float *TRAIN_RESTRICT dp, size_t ldp) {
  for (int b = 0; b < bl; b++)
    for (int i = 0; i < fan_in; i++)
      dp[(size_t)b * ldp + i] = 0.0f;
  for (int k = 0; k < fan_out; k++) {
    const float *wr = w + (size_t)k * fan_in;
    for (int b = 0; b < bl; b++) {
      const float dk = d[(size_t)b * ldd + k];
      float *dpb = dp + (size_t)b * ldp;
      for (int i = 0; i < fan_in; i++)
        dpb[i] += wr[i] * dk;
    }
  }
}

#endif
