/*
 * The per-transport caches of src/algo: reduction scratch in host memory
 * and pinned staging buffers (the types are in algo_impl.h).  Ops in
 * flight at once need their own buffers; a few are kept for reuse so a
 * steady stream of operations allocates nothing.  Guarded by t->lock
 * (every caller holds it).
 */
#include "algo/algo_impl.h"
#include "core/core.h"
#include "transport/transport_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static void algo_release(zpp_transport_t *t);

static zpp_status_t algo_state(zpp_transport_t *t, const char *what) {
  if (t->algo == NULL && (t->algo = calloc(1, sizeof *t->algo)) == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "transport caches");
  t->algo_release = algo_release;
  return ZPP_OK;
}

/* Host scratch of `need` bytes, from the transport's cache. */
zpp_status_t zpp_algo_host_get(zpp_transport_t *t, size_t need, zpp_algo_buf_t *b,
                               const char *what) {
  b->slot = NULL;
  b->own = b->p = zpp_scratch_get(t, need);
  if (b->own == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what,
                     "reduction scratch of %zu bytes", need);
  return ZPP_OK;
}

/* Gives b back to the transport's cache (held there while cancelled
 * transfers may still touch it). */
void zpp_algo_host_put(zpp_transport_t *t, zpp_algo_buf_t *b) {
  zpp_scratch_put(t, b->own);
  b->slot = NULL;
  b->own = b->p = NULL;
}

/* Moves b's memory onto the held list *l (its slot, if any, is left
 * empty); without memory for the list node it is leaked. */
void zpp_algo_hold(zpp_algo_retired_t **l, zpp_algo_buf_t *b) {
  void *p = b->slot != NULL ? b->slot->p : b->own;
  zpp_algo_retired_t *h;
  if (b->slot != NULL) {
    b->slot->p = NULL;
    b->slot->cap = 0;
    b->slot->busy = 0;
  }
  b->slot = NULL;
  b->own = b->p = NULL;
  if (p != NULL && (h = (zpp_algo_retired_t *)calloc(1, sizeof *h)) != NULL) {
    h->p = p;
    h->next = *l;
    *l = h;
  }
}

#if ZPP_HAVE_CUDA
zpp_status_t zpp_algo_cuda_err(cudaError_t e, const char *what,
                               const char *call) {
  return zpp_error(ZPP_ERR_CUDA, what, "%s: %s", call, cudaGetErrorString(e));
}

/* A pinned slot is free once no stage-out copy reads it any more. */
static int pinned_idle(zpp_algo_slot_t *s) {
  if (s->busy)
    return 0;
  if (s->ev_pending) {
    cudaError_t e = cudaEventQuery(s->ev);
    if (e == cudaErrorNotReady)
      return 0;
    (void)cudaGetLastError(); /* an error surfaces on the stream's owner */
    s->ev_pending = 0;
  }
  return 1;
}

/* The pinned slot after s (the array, then the list; *cur tracks the
 * list node, NULL while in the array); s NULL: the first. */
static zpp_algo_slot_t *pinned_next(struct zpp_algo *a, zpp_algo_slot_t *s, zpp_algo_more_slot_t **cur) {
  if (s == NULL) {
    *cur = NULL;
    return &a->pinned[0];
  }
  if (*cur == NULL) {
    if (s != &a->pinned[ZPP_ALGO_SLOTS - 1])
      return s + 1;
    *cur = a->more;
  } else {
    *cur = (*cur)->next;
  }
  return *cur != NULL ? &(*cur)->s : NULL;
}

static size_t pow2_at_least(size_t n) {
  size_t c = 4096;
  while (c < n && c <= SIZE_MAX / 2)
    c *= 2;
  return c < n ? n : c;
}

zpp_status_t zpp_algo_pinned_get(zpp_transport_t *t, size_t need, zpp_algo_buf_t *b,
                                 const char *what) {
  zpp_algo_slot_t *best = NULL, *idle = NULL, *s;
  zpp_algo_more_slot_t *cur = NULL;
  struct zpp_algo *a;
  ZPP_CHECK(algo_state(t, what));
  a = t->algo;
  for (s = pinned_next(a, NULL, &cur); s != NULL; s = pinned_next(a, s, &cur)) {
    if (!pinned_idle(s))
      continue;
    if (s->cap >= need && (best == NULL || s->cap < best->cap))
      best = s;
    if (idle == NULL || s->cap > idle->cap)
      idle = s;
  }
  if (best == NULL) {
    size_t cap = pow2_at_least(need);
    void *p = NULL;
    zpp_algo_retired_t *old = NULL;
    zpp_algo_more_slot_t *ms = NULL;
    cudaError_t e;
    if ((idle != NULL && idle->p != NULL &&
         (old = (zpp_algo_retired_t *)calloc(1, sizeof *old)) == NULL) ||
        (idle == NULL && (ms = (zpp_algo_more_slot_t *)calloc(1, sizeof *ms)) == NULL)) {
      free(old);
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "pinned slot list");
    }
    e = cudaMallocHost(&p, cap);
    if (e != cudaSuccess) {
      free(old);
      free(ms);
      return zpp_algo_cuda_err(e, what, "cudaMallocHost");
    }
    if (idle == NULL) {
      ms->next = a->more;
      a->more = ms;
      idle = &ms->s;
    } else if (old != NULL) {
      old->p = idle->p;
      old->next = a->retired;
      a->retired = old;
    }
    idle->p = p;
    idle->cap = cap;
    best = idle;
  }
  best->busy = 1;
  b->slot = best;
  b->own = NULL;
  b->p = best->p;
  return ZPP_OK;
}

/* Releases b; `stream` non-NULL-or-legacy with pending = 1: a copy on it
 * still uses b, so the slot waits for an event recorded there.  Never
 * blocks: where the event cannot be made (a broken CUDA context), the slot
 * is lost, never reused nor freed, rather than waiting for the stream. */
void zpp_algo_pinned_put(zpp_algo_buf_t *b, int pending, void *stream) {
  if (b->slot != NULL) {
    zpp_algo_slot_t *s = b->slot;
    if (pending) {
      cudaError_t e = cudaSuccess;
      if (!s->ev_made) {
        e = cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming);
        s->ev_made = e == cudaSuccess;
      }
      if (e == cudaSuccess)
        e = cudaEventRecord(s->ev, (cudaStream_t)stream);
      if (e == cudaSuccess) {
        s->ev_pending = 1;
      } else {
        (void)cudaGetLastError();
        s->lost = 1;
        b->slot = NULL;
        b->own = b->p = NULL;
        return;
      }
    }
    s->busy = 0;
  }
  b->slot = NULL;
  b->own = b->p = NULL;
}
#endif

/* Frees a held list of pinned buffers, or (quiet = 0: cancelled
 * transfers may still touch the buffers) leaks the buffers and frees only
 * the list nodes. */
static void held_free(zpp_algo_retired_t **l, int quiet) {
  while (*l != NULL) {
    zpp_algo_retired_t *h = *l;
    *l = h->next;
#if ZPP_HAVE_CUDA
    if (quiet)
      cudaFreeHost(h->p);
#else
    (void)quiet;
#endif
    free(h);
  }
}

/* The transport's algo_release: after the backend's destroy. */
static void algo_release(zpp_transport_t *t) {
  int quiet;
  if (t->algo == NULL)
    return;
  /* zpp_transport_free drained the backend first */
  quiet = !zpp_transport_in_doubt(t);
  if (!quiet && t->algo->held_pinned != NULL)
    ZPP_WARN(ZPP_SUBSYS_NET, "destroy: buffers of failed operations are "
                             "leaked: cancelled transfers may still use them");
  held_free(&t->algo->held_pinned, quiet);
#if ZPP_HAVE_CUDA
  {
    struct zpp_algo *a = t->algo;
    zpp_algo_slot_t *s;
    zpp_algo_more_slot_t *cur = NULL;
    double to = zpp_transport_timeout_s(t);
    int64_t limit = zpp_time_ns() + (int64_t)((to > 0 ? to : 60.0) * 1e9);
    int leak = 0;
    /* Stage-out copies may still read slots: wait for them, bounded (a
     * buffer whose copy never completes is leaked, never freed under it). */
    for (s = pinned_next(a, NULL, &cur); s != NULL; s = pinned_next(a, s, &cur)) {
      struct timespec ts = {0, 1000000};
      if (s->lost) {
        leak = 1;
        continue;
      }
      while (!pinned_idle(s) && zpp_time_ns() < limit)
        nanosleep(&ts, NULL);
      if (!pinned_idle(s)) {
        leak = 1;
        continue;
      }
      if (s->ev_made)
        cudaEventDestroy(s->ev);
      if (s->p != NULL)
        cudaFreeHost(s->p);
    }
    if (leak)
      ZPP_WARN(ZPP_SUBSYS_NET, "destroy: a staging copy did not finish within "
                               "the timeout; its pinned buffer is leaked");
    while (a->more != NULL) {
      zpp_algo_more_slot_t *m = a->more;
      a->more = m->next;
      free(m);
    }
    while (a->retired != NULL) {
      zpp_algo_retired_t *r = a->retired;
      a->retired = r->next;
      cudaFreeHost(r->p);
      free(r);
    }
  }
#endif
  free(t->algo);
  t->algo = NULL;
}
