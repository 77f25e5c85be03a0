/* A user's program built against the installed zpp: find_package(zpp) or
 * pkg-config.  It round-trips a few values through the public API. */
#include <zpp/zpp.h>

#include <math.h>
#include <stdio.h>

int main(void) {
  float x[5] = {1.0f, -2.0f, 3.5f, 0.25f, -0.125f}, y[5];
  unsigned char enc[64];
  size_t bytes;
  int version, i;
  zpp_quant_config_t cfg = ZPP_QUANT_CONFIG_INIT;
  cfg.block_size = 4;
  if (zpp_get_version(&version) != ZPP_OK || version != ZPP_VERSION_CODE) {
    fprintf(stderr, "version mismatch: header %d library %d\n",
            ZPP_VERSION_CODE, version);
    return 1;
  }
  if (zpp_quant_encoded_size(&cfg, 5, &bytes) != ZPP_OK ||
      zpp_quant_encode(&cfg, ZPP_FLOAT32, x, 5, enc, sizeof enc) != ZPP_OK ||
      zpp_quant_decode(&cfg, enc, bytes, 5, ZPP_FLOAT32, y) != ZPP_OK) {
    fprintf(stderr, "zpp error: %s\n", zpp_get_last_error());
    return 1;
  }
  for (i = 0; i < 5; i++) {
    if (fabsf(y[i] - x[i]) > 3.5f / 127.0f) {
      fprintf(stderr, "element %d: %g decoded as %g\n", i, x[i], y[i]);
      return 1;
    }
  }
  printf("consumer OK: zpp %d, %zu encoded bytes, isa %s\n", version, bytes,
         zpp_quant_cpu_isa());
  return 0;
}
