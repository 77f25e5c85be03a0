# topology/: the node map (pure C) and GPU link discovery (NVML by dlopen).
list(APPEND ZPP_C_SOURCES topology/topo.c topology/topo_gpu.c)
