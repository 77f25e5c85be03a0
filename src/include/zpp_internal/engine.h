/*
 * The declared internal API of the plan engine for zpp's own tools and
 * benchmarks (perf/zpp_soak.c watches the scratch cache).  Not installed;
 * link zpp_static (the symbol is hidden in libzpp.so).  src/engine
 * includes this header, so the definition is checked against it.
 */
#ifndef ZPP_INTERNAL_ENGINE_H
#define ZPP_INTERNAL_ENGINE_H

#include <stddef.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes kept for reuse by the communicator's host scratch cache (its
 * transport's, shared by the engine's plans and the host algorithms;
 * 0 for NULL). */
size_t zpp_engine_cached_bytes(zpp_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_INTERNAL_ENGINE_H */
