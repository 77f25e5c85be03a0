// The baseline-only build of tools/train_math.h's kernels
// (train_math_baseline.cc).
#ifndef ZPP_TEST_TRAIN_MATH_BASELINE_H
#define ZPP_TEST_TRAIN_MATH_BASELINE_H

#include <cstddef>
#include <cstdint>

void baseline_train_forward(const uint16_t *w, const uint16_t *bias, int fan_out, int fan_in,
                            const float *xt, size_t ns, int bl, float *z, size_t ldz);
void baseline_train_weight_grad(const float *d, size_t ldd, const float *x, size_t ldx, int bl,
                                int fan_out, int fan_in, uint16_t *g, uint16_t *gb);
void baseline_train_input_grad(const uint16_t *w, int fan_out, int fan_in, const float *d,
                               size_t ldd, int bl, float *dp, size_t ldp);

#endif
