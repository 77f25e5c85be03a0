/*
 * The engine's host scratch cache: buffers kept for the life of the
 * communicator (up to ZPP_SCRATCH_CACHE_MB), and buffers held while
 * cancelled transfers may still touch them.
 */
#include "engine/engine_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "transport/transport_impl.h"

void *zpp_engine_host_alloc(zpp_comm_t comm, size_t bytes) {
  engine_t *e = zpp_engine_of(comm);
  void *base = NULL;
  int i, best = -1;
  if (e != NULL) {
    pthread_mutex_lock(&e->cache_mu);
    for (i = 0; i < CACHE_SLOTS; i++)
      if (e->slot[i] != NULL && e->slot_cap[i] >= bytes &&
          (best < 0 || e->slot_cap[i] < e->slot_cap[best]))
        best = i;
    if (best >= 0) {
      base = e->slot[best];
      e->slot[best] = NULL;
      e->cache_total -= e->slot_cap[best];
    }
    pthread_mutex_unlock(&e->cache_mu);
    if (base != NULL)
      return (char *)base + CACHE_HDR;
  }
  if (bytes > SIZE_MAX - CACHE_HDR ||
      posix_memalign(&base, CACHE_HDR, bytes + CACHE_HDR) != 0)
    return NULL;
  memcpy(base, &bytes, sizeof bytes);
  return (char *)base + CACHE_HDR;
}

/* While cancelled transfers may still touch host memory, keeps `p` (a
 * block free() takes) until zpp_engine_release instead of freeing it:
 * returns 1 when it took p (without memory for the record p is leaked,
 * never freed), 0 when the caller frees it as usual. */
int zpp_engine_hold(zpp_comm_t comm, void *p) {
  engine_t *e;
  struct held *h;
  if (p == NULL || !zpp_transport_in_doubt(zpp_comm_transport(comm)))
    return 0;
  e = (engine_t *)comm->engine;
  if (e == NULL || (h = (struct held *)calloc(1, sizeof *h)) == NULL)
    return 1;
  h->p = p;
  pthread_mutex_lock(&e->cache_mu);
  h->next = e->held;
  e->held = h;
  pthread_mutex_unlock(&e->cache_mu);
  return 1;
}

void zpp_engine_host_free(zpp_comm_t comm, void *p) {
  engine_t *e = (engine_t *)comm->engine;
  void *base = (char *)p - CACHE_HDR;
  size_t cap, limit = (size_t)zpp_setting_long("ZPP_SCRATCH_CACHE_MB", 512)
                      << 20;
  int i, slot = -1;
  if (zpp_engine_hold(comm, base))
    return;
  memcpy(&cap, base, sizeof cap);
  if (e == NULL || cap > limit) {
    free(base);
    return;
  }
  pthread_mutex_lock(&e->cache_mu);
  for (i = 0; i < CACHE_SLOTS && slot < 0; i++)
    if (e->slot[i] == NULL)
      slot = i;
  if (slot < 0) {
    pthread_mutex_unlock(&e->cache_mu);
    free(base);
    return;
  }
  /* make room under the limit by dropping the smallest buffers */
  while (e->cache_total + cap > limit) {
    int small = -1;
    for (i = 0; i < CACHE_SLOTS; i++)
      if (e->slot[i] != NULL && (small < 0 || e->slot_cap[i] < e->slot_cap[small]))
        small = i;
    if (small < 0)
      break;
    free(e->slot[small]);
    e->slot[small] = NULL;
    e->cache_total -= e->slot_cap[small];
  }
  e->slot[slot] = base;
  e->slot_cap[slot] = cap;
  e->cache_total += cap;
  pthread_mutex_unlock(&e->cache_mu);
}

size_t zpp_engine_cached_bytes(zpp_comm_t comm) {
  engine_t *e = comm != NULL ? (engine_t *)comm->engine : NULL;
  size_t b;
  if (e == NULL)
    return 0;
  pthread_mutex_lock(&e->cache_mu);
  b = e->cache_total;
  pthread_mutex_unlock(&e->cache_mu);
  return b;
}
