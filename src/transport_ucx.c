/* UCX backend: placeholder until the transport lands (see below). */
#include "transport_impl.h"

int zpp_transport_ucx_available(char *why, size_t len) {
  if (why)
    snprintf(why, len, "not built yet");
  return 0;
}

zpp_status_t zpp_transport_ucx_create(zpp_transport_t *t,
                                      const zpp_bootstrap_t *bs,
                                      int cuda_device) {
  (void)t;
  (void)bs;
  (void)cuda_device;
  return zpp_error(ZPP_ERR_UNSUPPORTED, __func__, "UCX: not built yet");
}
