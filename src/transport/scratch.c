/*
 * Host scratch: one cache of host buffers per transport, the only one the
 * library keeps.  The engine's plans take their kernel steps' scratch from
 * it (src/engine/exec.c) and the host algorithms their reduction scratch
 * (src/algo): buffers of many megabytes are needed on every call, and
 * fresh malloc'ed memory of that size is mmap'ed and returned on free, so
 * every call would pay page faults.  Freed buffers are kept, up to
 * ZPP_SCRATCH_CACHE_MB, for the life of the transport.
 *
 * While cancelled transfers may still read or write host memory
 * (zpp_transport_in_doubt), nothing given back is reused: it is held, and
 * freed with the transport only once the transport is quiet, else leaked.
 */
#include "transport/transport_impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#define SCRATCH_HDR 64 /* keeps buffers 64-byte aligned, holds their size */

struct zpp_scratch_held {
  void *p; /* what free() takes */
  struct zpp_scratch_held *next;
};

void zpp_scratch_init(zpp_scratch_t *s) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
}

void *zpp_scratch_get(zpp_transport_t *t, size_t bytes) {
  zpp_scratch_t *s = &t->scratch;
  void *base = NULL;
  int i, best = -1;
  pthread_mutex_lock(&s->mu);
  for (i = 0; i < ZPP_SCRATCH_SLOTS; i++)
    if (s->slot[i] != NULL && s->cap[i] >= bytes &&
        (best < 0 || s->cap[i] < s->cap[best]))
      best = i;
  if (best >= 0) {
    base = s->slot[best];
    s->slot[best] = NULL;
    s->total -= s->cap[best];
  }
  pthread_mutex_unlock(&s->mu);
  if (base != NULL)
    return (char *)base + SCRATCH_HDR;
  if (bytes > SIZE_MAX - SCRATCH_HDR ||
      posix_memalign(&base, SCRATCH_HDR, bytes + SCRATCH_HDR) != 0)
    return NULL;
  memcpy(base, &bytes, sizeof bytes);
  return (char *)base + SCRATCH_HDR;
}

int zpp_scratch_hold(zpp_transport_t *t, void *p) {
  zpp_scratch_t *s = &t->scratch;
  struct zpp_scratch_held *h;
  if (p == NULL || !zpp_transport_in_doubt(t))
    return 0;
  h = (struct zpp_scratch_held *)calloc(1, sizeof *h);
  if (h == NULL) /* leaked: never freed under a transfer */
    return 1;
  h->p = p;
  pthread_mutex_lock(&s->mu);
  h->next = s->held;
  s->held = h;
  pthread_mutex_unlock(&s->mu);
  return 1;
}

void zpp_scratch_put(zpp_transport_t *t, void *p) {
  zpp_scratch_t *s = &t->scratch;
  void *base;
  size_t cap, limit =
                  (size_t)zpp_setting_long("ZPP_SCRATCH_CACHE_MB", 512) << 20;
  int i, slot = -1;
  if (p == NULL)
    return;
  base = (char *)p - SCRATCH_HDR;
  if (zpp_scratch_hold(t, base))
    return;
  memcpy(&cap, base, sizeof cap);
  if (cap > limit) {
    free(base);
    return;
  }
  pthread_mutex_lock(&s->mu);
  for (i = 0; i < ZPP_SCRATCH_SLOTS && slot < 0; i++)
    if (s->slot[i] == NULL)
      slot = i;
  if (slot < 0) {
    pthread_mutex_unlock(&s->mu);
    free(base);
    return;
  }
  /* make room under the limit by dropping the smallest buffers */
  while (s->total + cap > limit) {
    int small = -1;
    for (i = 0; i < ZPP_SCRATCH_SLOTS; i++)
      if (s->slot[i] != NULL && (small < 0 || s->cap[i] < s->cap[small]))
        small = i;
    if (small < 0)
      break;
    free(s->slot[small]);
    s->slot[small] = NULL;
    s->total -= s->cap[small];
  }
  s->slot[slot] = base;
  s->cap[slot] = cap;
  s->total += cap;
  pthread_mutex_unlock(&s->mu);
}

size_t zpp_scratch_cached_bytes(zpp_transport_t *t) {
  size_t b;
  pthread_mutex_lock(&t->scratch.mu);
  b = t->scratch.total;
  pthread_mutex_unlock(&t->scratch.mu);
  return b;
}

void zpp_scratch_release(zpp_transport_t *t, int quiet) {
  zpp_scratch_t *s = &t->scratch;
  int i, leaked = 0;
  while (s->held != NULL) {
    struct zpp_scratch_held *h = s->held;
    s->held = h->next;
    if (quiet)
      free(h->p);
    else
      leaked = 1;
    free(h);
  }
  if (leaked)
    ZPP_WARN(ZPP_SUBSYS_NET, "destroy: scratch of failed operations is "
                             "leaked: cancelled transfers may still use it");
  for (i = 0; i < ZPP_SCRATCH_SLOTS; i++) {
    free(s->slot[i]);
    s->slot[i] = NULL;
  }
  s->total = 0;
  pthread_mutex_destroy(&s->mu);
}
