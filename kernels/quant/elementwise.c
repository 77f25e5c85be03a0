/* Host element-wise helpers of the collectives (elementwise.h). */
#include "elementwise.h"

#include "quant_math.h"

void zpp_ew_finish_host(const float *acc, size_t count, float div, int dtype,
                        void *out) {
  size_t i;
  for (i = 0; i < count; i++)
    zpp_qm_store(out, i, dtype, div == 1.0f ? acc[i] : acc[i] / div);
}

void zpp_ew_scale_host(int dtype, void *buf, size_t count, float div) {
  size_t i;
  for (i = 0; i < count; i++)
    zpp_qm_store(buf, i, dtype, zpp_qm_load(buf, i, dtype) / div);
}

void zpp_ew_add_residual_host(int dtype, const void *g, const float *res,
                              size_t count, float *out) {
  size_t i;
  for (i = 0; i < count; i++)
    out[i] = zpp_qm_add(zpp_qm_load(g, i, dtype), res[i]);
}

void zpp_ew_residual_host(const float *x, size_t count, float *res) {
  size_t i;
  for (i = 0; i < count; i++) {
    float e = x[i] - res[i];
    res[i] = (zpp_qm_f32_bits(e) & ZPP_QM_ABS_MASK) >= ZPP_QM_EXP_MASK ? 0.0f
                                                                       : e;
  }
}

void zpp_ew_ema_residual_host(const float *x, const float *dec, size_t count,
                              float beta, float *res) {
  float omega = 1.0f - beta;
  size_t i;
  for (i = 0; i < count; i++)
    res[i] = zpp_qm_ema_residual(res[i], x[i], dec[i], beta, omega);
}
