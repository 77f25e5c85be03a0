// tools/train_math.h's kernels built for the baseline instruction set only
// (no target_clones), so that test_train.cc checks that path too on a CPU
// where the dispatched one is AVX2.  The header's functions are static:
// these copies do not clash with test_train.cc's.
#define ZPP_TRAIN_NO_CLONES 1
#include "train_math.h"

#include "train_math_baseline.h"

void baseline_train_forward(const uint16_t *w, const uint16_t *bias, int fan_out, int fan_in,
                            const float *xt, size_t ns, int bl, float *z, size_t ldz) {
  train_forward(w, bias, fan_out, fan_in, xt, ns, bl, z, ldz);
}
void baseline_train_weight_grad(const float *d, size_t ldd, const float *x, size_t ldx, int bl,
                                int fan_out, int fan_in, uint16_t *g, uint16_t *gb) {
  train_weight_grad(d, ldd, x, ldx, bl, fan_out, fan_in, g, gb);
}
void baseline_train_input_grad(const uint16_t *w, int fan_out, int fan_in, const float *d,
                               size_t ldd, int bl, float *dp, size_t ldp) {
  train_input_grad(w, fan_out, fan_in, d, ldd, bl, dp, ldp);
}
