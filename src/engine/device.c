/*
 * The engine on device memory: how a caller's CUDA stream and the
 * engine's work wait for each other without the caller's thread waiting.
 *
 * Stream-ordered backend (NCCL): a plan runs inline, so its steps are on
 * the caller's stream when the call returns.  Its completion event goes
 * to the engine thread's watch: the thread polls it (1 us doubling to 1
 * ms) and, when the work has not finished within the communicator's
 * timeout, breaks the communicator and aborts the backend's device work,
 * so the stream drains instead of hanging.
 *
 * Host backends (MPI, UCX: staging through pinned memory): a plan runs on
 * the engine thread, its device work on the engine's own non-blocking
 * stream.  At the call an event is recorded on the caller's stream; the
 * engine's stream waits for it before the plan's first step.  After the
 * plan the engine waits for its stream and stores the plan's ticket in a
 * counter of pinned memory; the caller's stream waits for the counter to
 * reach the ticket (cuStreamWaitValue32).  Tickets grow in queue order and
 * the counter never goes back.  A failed or dropped plan releases its
 * ticket too (its output is then undefined, and the error is the
 * communicator's), so no stream waits for ever.
 */
#include "engine/engine_impl.h"

#include "comm/comm.h"
#include "core/core.h"
#include "engine/exec.h"
#include "kernels/elementwise.h"
#include "kernels/stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

int zpp_engine_staged(zpp_comm_t comm, zpp_memory_t mem) {
#if ZPP_HAVE_CUDA_KERNELS
  zpp_transport_t *t = zpp_comm_transport(comm);
  return mem == ZPP_MEMORY_DEVICE &&
         zpp_transport_backend(t) != ZPP_BACKEND_NCCL &&
         (zpp_comm_thread_caps(comm) & ZPP_THREADS_PROGRESS);
#else
  (void)comm;
  (void)mem;
  return 0;
#endif
}

#if ZPP_HAVE_CUDA_KERNELS

/* Counters are never freed: a caller's stream may reach its wait on one
 * after the communicator is gone (it then finds the last ticket stored,
 * and goes on).  A freed engine's counter goes back to this pool, and the
 * next engine starts its tickets at the value the counter holds. */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pooled {
  uint32_t *counter;
  struct pooled *next;
} *pool;

static int counter_get(uint32_t **counter, char *err, size_t errlen) {
  struct pooled *p;
  pthread_mutex_lock(&pool_mu);
  p = pool;
  if (p != NULL)
    pool = p->next;
  pthread_mutex_unlock(&pool_mu);
  if (p == NULL)
    return zpp_st_counter_alloc(counter, err, errlen);
  *counter = p->counter;
  free(p);
  return 0;
}

static void counter_put(uint32_t *counter) {
  struct pooled *p = (struct pooled *)malloc(sizeof *p);
  if (p == NULL)
    return; /* leaked, never freed under a waiting stream */
  p->counter = counter;
  pthread_mutex_lock(&pool_mu);
  p->next = pool;
  pool = p;
  pthread_mutex_unlock(&pool_mu);
}

zpp_status_t zpp_engine_device_stream(const char *func, zpp_comm_t comm,
                                      void **stream) {
  zpp_engine_t *e = zpp_engine_of(comm);
  zpp_status_t st = ZPP_OK;
  char err[256];
  int saved = -1;
  *stream = NULL;
  if (e == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "engine state");
  pthread_mutex_lock(&e->mu);
  if (e->dstream == NULL) {
    st = zpp_exec_device_enter(comm, &saved);
    if (st == ZPP_OK && zpp_st_stream_create(&e->dstream, err, sizeof err) != 0)
      st = zpp_error(ZPP_ERR_CUDA, func, "the engine's stream: %s", err);
    if (st == ZPP_OK && e->counter == NULL) {
      if (counter_get(&e->counter, err, sizeof err) != 0) {
        st = zpp_error(ZPP_ERR_CUDA, func, "the engine's counter: %s", err);
      } else if (e->last_ticket == 0) {
        /* tickets go on from what the counter holds (a pooled one) */
        e->last_ticket = e->released =
            __atomic_load_n(e->counter, __ATOMIC_ACQUIRE);
      }
    }
    zpp_exec_device_leave(saved);
    if (st != ZPP_OK && e->dstream != NULL) {
      zpp_st_stream_destroy(e->dstream);
      e->dstream = NULL;
    }
  }
  *stream = e->dstream;
  pthread_mutex_unlock(&e->mu);
  return st;
}

zpp_status_t zpp_engine_thread_device(zpp_engine_t *e, const char *func) {
  char err[256];
  int dev = zpp_comm_device(e->comm);
  if (e->device_ready || dev < 0)
    return ZPP_OK;
  if (zpp_ew_set_device(dev, err, sizeof err) != 0)
    return zpp_error(ZPP_ERR_CUDA, func, "engine thread: %s", err);
  e->device_ready = 1;
  return ZPP_OK;
}

void zpp_engine_thread_init(zpp_engine_t *e) {
  char err[256];
  zpp_memory_t mem = ZPP_MEMORY_HOST;
  if (zpp_comm_memory(e->comm, &mem) != ZPP_OK || mem != ZPP_MEMORY_DEVICE)
    return;
  /* the device first: a CUDA call on a thread with none makes a context
   * on device 0 */
  if (zpp_engine_thread_device(e, "zpp engine") != ZPP_OK)
    return;
  if (zpp_st_relaxed_capture_mode(err, sizeof err) != 0)
    ZPP_WARN(ZPP_SUBSYS_COLL, "engine thread: %s", err);
}

void zpp_engine_stage_drain(zpp_engine_t *e, const char *func,
                            int64_t start_ns) {
  char err[256];
  void *ev = NULL;
  if (e->dstream == NULL ||
      zpp_ew_event_record(&ev, e->dstream, err, sizeof err) != 0)
    return;
  (void)zpp_engine_wait_event(zpp_comm_transport(e->comm), ev, start_ns,
                              func);
  zpp_ew_event_destroy(ev);
}

/* Once per process: a warning that the host waits instead of a stream. */
static void warn_host_wait(const char *func, const char *why) {
  static int said;
  if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
    return;
  ZPP_WARN(ZPP_SUBSYS_COLL,
           "%s: %s; device collectives over MPI or UCX make the caller's "
           "thread wait instead of its stream (said once)",
           func, why);
}

/* With one hardware queue per device (CUDA_DEVICE_MAX_CONNECTIONS=1) a
 * stream blocked on the counter also blocks the engine's stream behind
 * it: the wait would never end. */
static int one_connection(void) {
  const char *s = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return s != NULL && atoi(s) == 1;
}

zpp_status_t zpp_engine_stage_in(zpp_engine_t *e, zpp_plan_t *p,
                                 void *stream) {
  char err[256];
  int saved = -1;
  zpp_status_t st = zpp_exec_device_enter(e->comm, &saved);
  if (st == ZPP_OK &&
      zpp_ew_event_record(&p->in_event, stream, err, sizeof err) != 0)
    st = zpp_error(ZPP_ERR_CUDA, p->func, "the caller's stream: %s", err);
  zpp_exec_device_leave(saved);
  return st;
}

zpp_status_t zpp_engine_stage_out(zpp_engine_t *e, void *stream,
                                  uint64_t ticket, const char *func,
                                  int *host) {
  char err[256];
  int saved = -1, rc;
  zpp_status_t st;
  *host = 0;
  if (one_connection()) {
    warn_host_wait(func, "CUDA_DEVICE_MAX_CONNECTIONS is 1 (a stream waiting "
                         "for the engine would hold the engine's stream)");
    *host = 1;
    return ZPP_OK;
  }
  st = zpp_exec_device_enter(e->comm, &saved);
  if (st != ZPP_OK)
    return st;
  rc = zpp_st_wait_counter(stream, e->counter, (uint32_t)ticket, err,
                           sizeof err);
  zpp_exec_device_leave(saved);
  if (rc == 1)
    return zpp_error(ZPP_ERR_CUDA, func, "stream %p: %s", stream, err);
  if (rc != 0) {
    warn_host_wait(func, err);
    *host = 1;
  }
  return ZPP_OK;
}

/* The counter compares as (int32_t)(counter - value) >= 0: it moves only
 * forward, and never further than the last ticket handed out. */
void zpp_engine_release_ticket(zpp_engine_t *e, uint64_t ticket) {
  pthread_mutex_lock(&e->mu);
  if (ticket > e->last_ticket)
    ticket = e->last_ticket;
  if (e->counter != NULL && ticket > e->released) {
    e->released = ticket;
    __atomic_store_n(e->counter, (uint32_t)ticket, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&e->mu);
}

void zpp_engine_drop_ticket_locked(zpp_engine_t *e, uint64_t ticket) {
  if (ticket > e->release_upto)
    e->release_upto = ticket;
  if (e->running_ticket == 0 && e->counter != NULL &&
      e->release_upto > e->released) {
    e->released = e->release_upto;
    __atomic_store_n(e->counter, (uint32_t)e->released, __ATOMIC_RELEASE);
  }
}

zpp_status_t zpp_engine_watch(zpp_engine_t *e, void *event,
                              int64_t started_ns, const char *func) {
  zpp_watch_t *w = (zpp_watch_t *)calloc(1, sizeof *w);
  zpp_status_t st;
  if (w == NULL) { /* no watch: the host waits, as the host wait does */
    st = zpp_engine_wait_event(zpp_comm_transport(e->comm), event,
                               started_ns, func);
    zpp_engine_event_destroy(event);
    return st;
  }
  w->event = event;
  w->started_ns = started_ns;
  w->func = func;
  pthread_mutex_lock(&e->mu);
  st = zpp_engine_start_thread_locked(e, func);
  if (st == ZPP_OK) {
    w->next = e->watch;
    e->watch = w;
    pthread_cond_broadcast(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  if (st != ZPP_OK) {
    /* no thread to watch it: wait here, as the host wait does */
    st = zpp_engine_wait_event(zpp_comm_transport(e->comm), event,
                               started_ns, func);
    zpp_engine_event_destroy(event);
    free(w);
  }
  return st;
}

/* One watched event: 1 when it is done (or can be let go). */
static int watch_one(zpp_engine_t *e, zpp_watch_t *w, int64_t now) {
  zpp_transport_t *t = zpp_comm_transport(e->comm);
  double to = zpp_transport_timeout_s(t);
  char err[256];
  int done = 0;
  zpp_status_t st;
  if (zpp_ew_event_query(w->event, &done, err, sizeof err) != 0) {
    zpp_transport_break_st(t, ZPP_ERR_CUDA, "%s: completion event: %s",
                           w->func, err);
    zpp_transport_abort_device_work(t);
    return 1;
  }
  if (done)
    return 1;
  st = zpp_transport_check_async(t, w->func);
  if (st != ZPP_OK) {
    /* an asynchronous error of the backend: the work will not finish */
    zpp_transport_break_st(t, st, "%s: %s", w->func, zpp_get_last_error());
    zpp_transport_abort_device_work(t);
    return 0; /* its event completes as the aborted work leaves */
  }
  if (to > 0 && now - w->started_ns > (int64_t)(to * 1e9)) {
    zpp_transport_break_st(t, ZPP_ERR_TIMEOUT,
                           "%s: the collective's work on the stream did not "
                           "finish within %.3g s (ZPP_TIMEOUT_S); the "
                           "communicator is aborted",
                           w->func, to);
    zpp_transport_abort_device_work(t);
  }
  return 0;
}

int zpp_engine_watch_poll(zpp_engine_t *e) {
  zpp_watch_t *list, *w, *next, *keep = NULL;
  int64_t now = zpp_time_ns();
  int left;
  pthread_mutex_lock(&e->mu);
  list = e->watch;
  e->watch = NULL;
  pthread_mutex_unlock(&e->mu);
  if (list == NULL)
    return 0;
  if (zpp_engine_thread_device(e, "zpp engine") != ZPP_OK && !e->device_warned) {
    e->device_warned = 1;
    ZPP_WARN(ZPP_SUBSYS_COLL, "%s", zpp_get_last_error());
  }
  for (w = list; w != NULL; w = next) {
    next = w->next;
    if (watch_one(e, w, now)) {
      zpp_engine_event_destroy(w->event);
      free(w);
    } else {
      w->next = keep;
      keep = w;
    }
  }
  pthread_mutex_lock(&e->mu);
  for (w = keep; w != NULL; w = next) {
    next = w->next;
    w->next = e->watch;
    e->watch = w;
  }
  left = e->watch != NULL;
  pthread_mutex_unlock(&e->mu);
  return left;
}

void zpp_engine_watch_drain(zpp_engine_t *e) {
  long pause_ns = 1000;
  /* each event completes, or its timeout aborts the work and it then
   * completes: bounded by the timeout (a backend that cannot abort its
   * device work, none today, would leave the rest after twice that) */
  double to = zpp_transport_timeout_s(zpp_comm_transport(e->comm));
  int64_t limit = to > 0 ? zpp_time_ns() + (int64_t)(2.0 * to * 1e9) + 1000000000
                         : INT64_MAX;
  while (zpp_engine_watch_poll(e) && zpp_time_ns() < limit)
    zpp_pause_ns(&pause_ns);
  pthread_mutex_lock(&e->mu);
  while (e->watch != NULL) { /* past the bound: let the events go */
    zpp_watch_t *w = e->watch;
    e->watch = w->next;
    zpp_engine_event_destroy(w->event);
    free(w);
  }
  pthread_mutex_unlock(&e->mu);
}

void zpp_engine_device_free(zpp_engine_t *e) {
  char err[256];
  int saved = -1;
  if (e->dstream == NULL && e->counter == NULL)
    return;
  if (zpp_exec_device_enter(e->comm, &saved) == ZPP_OK)
    zpp_st_stream_destroy(e->dstream);
  if (e->counter != NULL)
    counter_put(e->counter);
  (void)err;
  zpp_exec_device_leave(saved);
  e->dstream = NULL;
  e->counter = NULL;
}

#else /* no CUDA kernels: no device memory */

zpp_status_t zpp_engine_device_stream(const char *func, zpp_comm_t comm,
                                      void **stream) {
  (void)comm;
  *stream = NULL;
  return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                   "device memory needs zpp built with CUDA kernels");
}
zpp_status_t zpp_engine_thread_device(zpp_engine_t *e, const char *func) {
  (void)e;
  (void)func;
  return ZPP_OK;
}
zpp_status_t zpp_engine_stage_in(zpp_engine_t *e, zpp_plan_t *p,
                                 void *stream) {
  (void)e;
  (void)stream;
  return zpp_error(ZPP_ERR_UNSUPPORTED, p->func,
                   "device memory needs zpp built with CUDA kernels");
}
zpp_status_t zpp_engine_stage_out(zpp_engine_t *e, void *stream,
                                  uint64_t ticket, const char *func,
                                  int *host) {
  (void)e;
  (void)stream;
  (void)ticket;
  (void)func;
  *host = 1;
  return ZPP_OK;
}
void zpp_engine_release_ticket(zpp_engine_t *e, uint64_t ticket) {
  (void)e;
  (void)ticket;
}
void zpp_engine_drop_ticket_locked(zpp_engine_t *e, uint64_t ticket) {
  (void)e;
  (void)ticket;
}
zpp_status_t zpp_engine_watch(zpp_engine_t *e, void *event,
                              int64_t started_ns, const char *func) {
  (void)e;
  (void)event;
  (void)started_ns;
  (void)func;
  return ZPP_OK;
}
int zpp_engine_watch_poll(zpp_engine_t *e) {
  (void)e;
  return 0;
}
void zpp_engine_watch_drain(zpp_engine_t *e) { (void)e; }
void zpp_engine_thread_init(zpp_engine_t *e) { (void)e; }
void zpp_engine_stage_drain(zpp_engine_t *e, const char *func,
                            int64_t start_ns) {
  (void)e;
  (void)func;
  (void)start_ns;
}
void zpp_engine_device_free(zpp_engine_t *e) { (void)e; }

#endif
