/*
 * GPU link discovery.  NVML is opened at run time with dlopen, so libzpp
 * has no link-time dependency on the driver and loads where there is none;
 * the few NVML declarations needed are written here from NVML's public
 * documentation (no nvml.h is required to build).  CUDA peer-access
 * queries are the fallback; they cannot tell NVLink from PCIe, so a peer
 * path found that way is reported as ZPP_LINK_PCIE ("peer access").
 */
#include "topology/topo.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* ---- NVML subset (values from the NVML API reference) ----------------- */
typedef int zpp_nvml_return_t; /* NVML_SUCCESS == 0 */
typedef struct zpp_nvml_device *zpp_nvml_device_t;
typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} zpp_nvml_pci_info_t;
#define ZPP_NVML_P2P_CAPS_INDEX_NVLINK 2
#define ZPP_NVML_P2P_CAPS_INDEX_READ 0
#define ZPP_NVML_P2P_STATUS_OK 0
#define ZPP_NVML_FEATURE_ENABLED 1
#define ZPP_NVML_NVLINK_MAX_LINKS 18

static struct {
  int loaded;
  void *handle;
  zpp_nvml_return_t (*init)(void);
  zpp_nvml_return_t (*by_bus_id)(const char *, zpp_nvml_device_t *);
  zpp_nvml_return_t (*p2p_status)(zpp_nvml_device_t, zpp_nvml_device_t, int,
                                  int *);
  zpp_nvml_return_t (*nvlink_state)(zpp_nvml_device_t, unsigned, int *);
  zpp_nvml_return_t (*nvlink_remote)(zpp_nvml_device_t, unsigned,
                                     zpp_nvml_pci_info_t *);
} nvml;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void nvml_load(void) {
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    ZPP_INFO(ZPP_SUBSYS_TOPO, "NVML not loaded (%s); using CUDA peer queries",
             dlerror());
    return;
  }
  *(void **)&nvml.init = dlsym(h, "nvmlInit_v2");
  *(void **)&nvml.by_bus_id = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void **)&nvml.p2p_status = dlsym(h, "nvmlDeviceGetP2PStatus");
  *(void **)&nvml.nvlink_state = dlsym(h, "nvmlDeviceGetNvLinkState");
  *(void **)&nvml.nvlink_remote = dlsym(h, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  if (!nvml.init || !nvml.by_bus_id || !nvml.p2p_status || nvml.init() != 0) {
    ZPP_INFO(ZPP_SUBSYS_TOPO, "NVML present but unusable; using CUDA peer "
             "queries");
    dlclose(h);
    memset(&nvml, 0, sizeof nvml);
    return;
  }
  nvml.handle = h;
  nvml.loaded = 1;
  ZPP_INFO(ZPP_SUBSYS_TOPO, "NVML loaded for GPU link discovery");
}

const char *zpp_topo_gpu_probe_source(void) {
  pthread_once(&nvml_once, nvml_load);
  if (nvml.loaded)
    return "nvml";
#if ZPP_HAVE_CUDA
  return "cuda-peer";
#else
  return "none";
#endif
}

zpp_status_t zpp_topo_gpu_describe(int device, zpp_topo_gpu_t *out) {
  zpp_topo_gpu_t g;
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (device < 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "device %d: must be >= 0", device);
  memset(&g, 0, sizeof g);
  g.device = device;
#if ZPP_HAVE_CUDA
  {
    cudaError_t e = cudaDeviceGetPCIBusId(g.bus_id, (int)sizeof g.bus_id, device);
    if (e != cudaSuccess)
      return zpp_error(ZPP_ERR_CUDA, __func__,
                       "cudaDeviceGetPCIBusId(device %d): %s", device,
                       cudaGetErrorString(e));
  }
#endif
  *out = g;
  return ZPP_OK;
}

/* NVML bus ids are upper case with an 8-digit domain; CUDA's use 4 or 8. */
static int same_bus(const char *a, const char *b) {
  const char *ca = strchr(a, ':'), *cb = strchr(b, ':');
  if (ca == NULL || cb == NULL)
    return strcasecmp(a, b) == 0;
  return strcasecmp(ca, cb) == 0 && strtol(a, NULL, 16) == strtol(b, NULL, 16);
}

zpp_status_t zpp_topo_gpu_link(const zpp_topo_gpu_t *self,
                               const zpp_topo_gpu_t *peer, zpp_link_t *link,
                               int *nvlinks) {
  if (self == NULL || peer == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "%s is NULL",
                     self == NULL ? "self" : "peer");
  if (link == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "link is NULL");
  if (nvlinks)
    *nvlinks = 0;
  if (self->device < 0 || peer->device < 0 || self->bus_id[0] == '\0' ||
      peer->bus_id[0] == '\0') {
    *link = ZPP_LINK_HOST;
    return ZPP_OK;
  }
  if (same_bus(self->bus_id, peer->bus_id)) {
    *link = ZPP_LINK_SAME_DEVICE;
    return ZPP_OK;
  }
  pthread_once(&nvml_once, nvml_load);
  if (nvml.loaded) {
    zpp_nvml_device_t a, b;
    int status = -1;
    if (nvml.by_bus_id(self->bus_id, &a) == 0 &&
        nvml.by_bus_id(peer->bus_id, &b) == 0) {
      if (nvml.p2p_status(a, b, ZPP_NVML_P2P_CAPS_INDEX_NVLINK, &status) == 0 &&
          status == ZPP_NVML_P2P_STATUS_OK) {
        int count = 0, active = 0;
        unsigned l;
        /* Links whose far end is the peer; behind an NVSwitch the far end
         * is the switch, so count every active link instead. */
        for (l = 0; nvml.nvlink_state && l < ZPP_NVML_NVLINK_MAX_LINKS; l++) {
          int on = 0;
          zpp_nvml_pci_info_t pci;
          if (nvml.nvlink_state(a, l, &on) != 0 ||
              on != ZPP_NVML_FEATURE_ENABLED)
            continue;
          active++;
          if (nvml.nvlink_remote && nvml.nvlink_remote(a, l, &pci) == 0 &&
              same_bus(pci.bus_id, peer->bus_id))
            count++;
        }
        *link = ZPP_LINK_NVLINK;
        if (nvlinks)
          *nvlinks = count ? count : active;
        return ZPP_OK;
      }
      if (nvml.p2p_status(a, b, ZPP_NVML_P2P_CAPS_INDEX_READ, &status) == 0) {
        *link = status == ZPP_NVML_P2P_STATUS_OK ? ZPP_LINK_PCIE : ZPP_LINK_HOST;
        return ZPP_OK;
      }
    }
    ZPP_INFO(ZPP_SUBSYS_TOPO, "NVML could not relate %s and %s; trying CUDA",
             self->bus_id, peer->bus_id);
  }
#if ZPP_HAVE_CUDA
  {
    int da, db, can = 0;
    if (cudaDeviceGetByPCIBusId(&da, self->bus_id) == cudaSuccess &&
        cudaDeviceGetByPCIBusId(&db, peer->bus_id) == cudaSuccess &&
        cudaDeviceCanAccessPeer(&can, da, db) == cudaSuccess && can) {
      *link = ZPP_LINK_PCIE;
      return ZPP_OK;
    }
    (void)cudaGetLastError();
  }
#endif
  *link = ZPP_LINK_HOST;
  return ZPP_OK;
}
