/*
 * The execution engine: runs plans (plan.h), one engine per communicator.
 *
 * A plan runs on exactly one thread at a time:
 *   - inline, on the calling thread, when the call is blocking and nothing
 *     is queued or running on the communicator (no hand-off, no thread);
 *   - on the communicator's engine thread (started at the first started
 *     collective) otherwise, in submission order, so every rank issues the
 *     same transport operations in the same order.
 * On a stream-ordered backend (NCCL) running a plan means enqueueing its
 * steps, so it always runs inline.
 *
 * Executing a plan: transfer steps are started without blocking, in index
 * order, as soon as their dependencies are done, and polled; kernel steps
 * run as soon as theirs are.  When nothing can move the executor spins
 * (yielding the core) for ZPP_NET_SPIN_US after the last progress, then
 * sleeps, 1 us doubling to 200 us, or until the earliest emulated-link
 * deadline of the transfers in flight.  No lock is held while it waits.
 *
 * Completion: a host plan is complete when its last step is; a plan on
 * device memory is complete when an event recorded on its stream after
 * its last step has completed, so a request never reports done before the
 * device ran its work, and waiting for it does not wait for unrelated work
 * queued later on the same stream.  Every wait is bounded by the
 * communicator's timeout (ZPP_TIMEOUT_S).
 *
 * Device: the thread that runs a plan on device memory makes the
 * communicator's device current for the plan and restores its previous
 * device afterwards (a caller's current device is its own business).
 */
#include "engine/engine_impl.h"

#include "comm/comm.h"
#include "core/core.h"
#include "engine/exec.h"
#include "kernels/elementwise.h"
#include "kernels/stream.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t engines_mu = PTHREAD_MUTEX_INITIALIZER;
/* The engine whose thread this is (NULL: not an engine thread). */
static _Thread_local zpp_engine_t *tl_engine;

int zpp_engine_on_thread(zpp_comm_t comm) {
  return tl_engine != NULL && tl_engine->comm == comm;
}

static void engine_abort(zpp_comm_t comm);
static zpp_status_t engine_quiesce(zpp_comm_t comm, const char *func);

zpp_engine_t *zpp_engine_of(zpp_comm_t comm) {
  zpp_engine_t *e;
  pthread_mutex_lock(&engines_mu);
  e = (zpp_engine_t *)comm->engine;
  if (e == NULL) {
    e = (zpp_engine_t *)calloc(1, sizeof *e);
    if (e != NULL) {
      e->comm = comm;
      pthread_mutex_init(&e->mu, NULL);
      pthread_cond_init(&e->cv, NULL);
      e->last_progress_ns = zpp_time_ns();
      comm->engine = e;
      zpp_comm_set_before_destroy(comm, zpp_engine_release);
      zpp_comm_set_on_abort(comm, engine_abort);
      zpp_comm_set_quiesce(comm, engine_quiesce);
    }
  }
  pthread_mutex_unlock(&engines_mu);
  return e;
}

/* ---- requests ---------------------------------------------------------------- */

static struct zpp_request *new_request(zpp_comm_t comm) {
  struct zpp_request *r = (struct zpp_request *)calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->comm = comm;
  r->t = zpp_comm_transport(comm);
  r->started_ns = zpp_time_ns();
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  return r;
}

static void free_request(struct zpp_request *r) {
  zpp_engine_event_destroy(r->event);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

/* e: the engine whose thread ran r's plan (NULL: inline or dropped); its
 * running ticket is cleared while r->mu is held (lock order r->mu, then
 * e->mu, as wait_ran), so whoever sees r done also sees the plan out of
 * flight (zpp_engine_in_flight), and the other way round. */
static void complete(struct zpp_request *r, zpp_status_t st, void *event,
                     zpp_engine_t *e) {
  pthread_mutex_lock(&r->mu);
  if (e != NULL) {
    pthread_mutex_lock(&e->mu);
    e->running_ticket = 0;
    /* tickets dropped while the plan ran (abort, abandon) */
    zpp_engine_drop_ticket_locked(e, 0);
    pthread_mutex_unlock(&e->mu);
  }
  if (r->abandoned) { /* nobody waits for it any more */
    pthread_mutex_unlock(&r->mu);
    r->event = event;
    free_request(r);
    return;
  }
  r->status = st;
  if (st != ZPP_OK) /* zpp_error is thread-local: carry the message */
    snprintf(r->msg, sizeof r->msg, "%s", zpp_get_last_error());
  r->event = event;
  r->ran = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* ---- the engine thread -------------------------------------------------------- */

/* The engine thread's wait for work: while completion events are
 * watched, a poll of them every pause (1 us doubling to 1 ms). */
static void engine_idle(zpp_engine_t *e, long *pause_ns) {
  struct timespec ts;
  if (e->watch == NULL) {
    pthread_cond_wait(&e->cv, &e->mu);
    *pause_ns = 1000;
    return;
  }
  pthread_mutex_unlock(&e->mu);
  zpp_engine_watch_poll(e);
  pthread_mutex_lock(&e->mu);
  if (e->watch == NULL || (e->head != NULL && !e->busy) || e->stop)
    return;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += *pause_ns;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_cond_timedwait(&e->cv, &e->mu, &ts);
  if (*pause_ns < 1000000)
    *pause_ns *= 2;
}

/* A staged device plan ran (st): wait for its stream, then release the
 * caller's streams waiting for its ticket (failed or not: the error is
 * the communicator's, and no stream may wait for ever). */
static zpp_status_t staged_done(zpp_engine_t *e, const char *func,
                                struct zpp_request *r, zpp_status_t st,
                                void **event, uint64_t ticket) {
  zpp_transport_t *t = r->t;
  /* the device part is timed from here: the plan may have waited in the
   * queue, and its host part was bounded on its own */
  int64_t now = zpp_time_ns();
  if (st == ZPP_OK && *event != NULL)
    st = zpp_engine_wait_event(t, *event, now, func);
  else if (st != ZPP_OK)
    /* what the plan queued before it failed may still write the caller's
     * buffers: release the caller's stream only after it (bounded) */
    zpp_engine_stage_drain(e, func, now);
  zpp_engine_event_destroy(*event);
  *event = NULL;
  if (st != ZPP_OK && !zpp_transport_is_broken(t))
    /* a detached request keeps no error: the communicator does */
    zpp_transport_break_st(t, st, "%s failed: %s", func,
                           zpp_get_last_error());
  zpp_engine_release_ticket(e, ticket);
  return st;
}

static void *engine_main(void *arg) {
  zpp_engine_t *e = (zpp_engine_t *)arg;
  long pause_ns = 1000;
  tl_engine = e;
  zpp_engine_thread_init(e);
  pthread_mutex_lock(&e->mu);
  for (;;) {
    zpp_plan_t *p;
    struct zpp_request *r;
    void *event = NULL;
    zpp_status_t st;
    const char *func;
    uint64_t ticket;
    while ((e->head == NULL || e->busy) && !e->stop)
      engine_idle(e, &pause_ns);
    if (e->head == NULL || e->busy)
      break; /* stop, with nothing left to run */
    p = e->head;
    e->head = p->next;
    if (e->head == NULL)
      e->tail = NULL;
    e->busy = 1;
    e->running_ticket = p->ticket;
    pthread_mutex_unlock(&e->mu);
    r = p->req;
    func = p->func;
    ticket = p->ticket;
    p->progress = &e->last_progress_ns;
    p->on_engine = e;
    st = zpp_engine_run_plan(p, &event);
    /* the host part is done (zpp_engine_run_plan freed p; device work may still be
     * on the stream): out of flight as r completes */
    if (r->staged)
      st = staged_done(e, func, r, st, &event, ticket);
    complete(r, st, event, e);
    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    e->last_progress_ns = zpp_time_ns();
    pthread_cond_broadcast(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  zpp_engine_watch_drain(e);
  return NULL;
}

zpp_status_t zpp_engine_start_thread_locked(zpp_engine_t *e,
                                            const char *func) {
  if (e->thread_started)
    return ZPP_OK;
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0)
    return zpp_error(ZPP_ERR_SYSTEM, func,
                     "pthread_create of the engine thread failed");
  e->thread_started = 1;
  return ZPP_OK;
}

/* Queues p for the engine thread (started on first use). */
static zpp_status_t enqueue(zpp_engine_t *e, zpp_plan_t *p) {
  zpp_status_t st;
  pthread_mutex_lock(&e->mu);
  st = zpp_engine_start_thread_locked(e, p->func);
  if (st != ZPP_OK) {
    pthread_mutex_unlock(&e->mu);
    return st;
  }
  if (e->head == NULL && !e->busy)
    e->last_progress_ns = zpp_time_ns();
  p->next = NULL;
  p->ticket = ++e->last_ticket;
  if (p->req != NULL && p->req->staged)
    p->req->staged = p->ticket;
  if (e->tail != NULL)
    e->tail->next = p;
  else
    e->head = p;
  e->tail = p;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  return ZPP_OK;
}

/* A waiter's deadline for one slice of a bounded wait: 100 ms from now
 * (CLOCK_REALTIME, as pthread_cond_timedwait takes it). */
static void slice_deadline(struct timespec *ts) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_nsec += 100 * 1000 * 1000;
  if (ts->tv_nsec >= 1000000000) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000;
  }
}

/* The bound of every wait on the engine: the plan running now is bounded
 * by its own transfers' timeouts, so a waiter allows it one timeout and a
 * margin beyond the last completion: no progress since `last_ns` for
 * twice the timeout `to` and a second (never with to <= 0). */
static double stall_limit_s(double to) { return 2.0 * to + 1.0; }
static int engine_stalled(int64_t last_ns, double to) {
  return to > 0 &&
         zpp_time_ns() - last_ns > (int64_t)(stall_limit_s(to) * 1e9);
}

/* Waits until r's host part ran.  The engine runs plans one after
 * another, each transfer bounded by the timeout; a wait gives up when the
 * engine made no progress (no step started or finished, no bytes moved)
 * for twice the timeout and a second. */
static zpp_status_t wait_ran(zpp_engine_t *e, struct zpp_request *r,
                             const char *func) {
  double to = zpp_transport_timeout_s(r->t);
  pthread_mutex_lock(&r->mu);
  while (!r->ran) {
    struct timespec ts;
    int64_t last;
    slice_deadline(&ts);
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    if (r->ran || to <= 0 || e == NULL)
      continue;
    pthread_mutex_lock(&e->mu);
    last = e->last_progress_ns;
    pthread_mutex_unlock(&e->mu);
    if (engine_stalled(last, to)) {
      pthread_mutex_unlock(&r->mu);
      return zpp_error(ZPP_ERR_TIMEOUT, func,
                       "the communicator's engine made no progress for "
                       "%.3g s (ZPP_TIMEOUT_S %.3g); the communicator is "
                       "aborted",
                       stall_limit_s(to), to);
    }
  }
  pthread_mutex_unlock(&r->mu);
  return ZPP_OK;
}

/* A wait for r timed out: the communicator is aborted and r is freed.  A
 * plan still queued is dropped (it must not touch the caller's buffers
 * after the call returned); one running now frees r when it completes. */
static void abandon(zpp_engine_t *e, struct zpp_request *r, const char *func) {
  zpp_plan_t *p = NULL, *prev = NULL, *q;
  int ran;
  zpp_transport_break_st(r->t, ZPP_ERR_TIMEOUT,
                         "%s: the communicator's engine made no progress "
                         "within the timeout",
                         func);
  pthread_mutex_lock(&e->mu);
  for (q = e->head; q != NULL; prev = q, q = q->next) {
    if (q->req != r)
      continue;
    p = q;
    if (prev != NULL)
      prev->next = q->next;
    else
      e->head = q->next;
    if (e->tail == q)
      e->tail = prev;
    if (r->staged)
      zpp_engine_drop_ticket_locked(e, q->ticket);
    break;
  }
  pthread_mutex_unlock(&e->mu);
  if (p != NULL) {
    zpp_engine_plan_free(p);
    free_request(r);
    return;
  }
  pthread_mutex_lock(&r->mu);
  ran = r->ran;
  r->abandoned = !ran;
  pthread_mutex_unlock(&r->mu);
  if (ran)
    free_request(r);
}

/* The request's result, on this thread and on the communicator. */
static zpp_status_t request_result(struct zpp_request *r, const char *func) {
  zpp_status_t st = r->status;
  if (st != ZPP_OK) {
    zpp_error(st, func, "%s", r->msg);
    return zpp_transport_fail(r->t, st);
  }
  if (r->event != NULL) {
    st = zpp_engine_wait_event(r->t, r->event, r->started_ns, func);
    if (st == ZPP_OK) {
      zpp_engine_event_destroy(r->event);
      r->event = NULL;
    }
  }
  return st;
}

/* A started stream-ordered collective: the engine thread watches an event
 * recorded on its stream right after it (the request keeps its own).  On
 * a failure to record one, the request's waits stay the only bound. */
static void watch_after(zpp_engine_t *e, void *stream, int64_t started,
                        const char *func) {
#if ZPP_HAVE_CUDA_KERNELS
  char err[256];
  void *w = NULL;
  int saved = -1;
  if (zpp_exec_device_enter(e->comm, &saved) == ZPP_OK &&
      zpp_ew_event_record(&w, stream, err, sizeof err) == 0)
    (void)zpp_engine_watch(e, w, started, func);
  zpp_exec_device_leave(saved);
#else
  (void)e;
  (void)stream;
  (void)started;
  (void)func;
#endif
}

/* The waiter of r gives it up to the engine (a stream waits for it): the
 * engine frees it when it completes, or now if it did already. */
static void detach(struct zpp_request *r) {
  int ran;
  pthread_mutex_lock(&r->mu);
  ran = r->ran;
  r->abandoned = !ran;
  pthread_mutex_unlock(&r->mu);
  if (ran)
    free_request(r);
}

/* A staged device plan (device.c): queued for the engine thread; the
 * caller's stream waits for it, not the caller. */
static zpp_status_t submit_staged(zpp_engine_t *e, zpp_plan_t *p,
                                  zpp_request_t *req) {
  zpp_comm_t comm = p->ex.comm;
  const char *func = p->func;
  void *stream = p->ex.caller_stream;
  struct zpp_request *r = new_request(comm);
  uint64_t ticket;
  int host = 0;
  zpp_status_t st, wst;
  if (r == NULL) {
    zpp_engine_plan_free(p);
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                         "request"));
  }
  r->staged = 1; /* the ticket once queued */
  st = zpp_engine_stage_in(e, p, stream);
  if (st == ZPP_OK) {
    p->req = r;
    st = enqueue(e, p);
  }
  if (st != ZPP_OK) {
    zpp_engine_plan_free(p);
    free_request(r);
    return zpp_comm_fail(comm, st);
  }
  ticket = r->staged; /* p is the engine's now */
  if (req != NULL) {
    *req = r;
    return ZPP_OK;
  }
  st = zpp_engine_stage_out(e, stream, ticket, func, &host);
  if (st == ZPP_OK && !host) {
    detach(r);
    return ZPP_OK;
  }
  /* no stream wait: this thread waits, as zpp_request_wait does, so that
   * the buffers are not used after the call returned */
  wst = wait_ran(e, r, func);
  if (wst != ZPP_OK) {
    abandon(e, r, func);
    return zpp_comm_fail(comm, wst);
  }
  wst = request_result(r, func);
  free_request(r);
  if (st == ZPP_OK)
    st = wst;
  return st != ZPP_OK ? zpp_comm_fail(comm, st) : ZPP_OK;
}

zpp_status_t zpp_plan_submit(zpp_plan_t *p, zpp_request_t *req) {
  zpp_comm_t comm = p->ex.comm;
  zpp_transport_t *t = p->ex.t;
  const char *func = p->func;
  int stream_ordered = zpp_transport_backend(t) == ZPP_BACKEND_NCCL;
  int inline_ok = 0;
  zpp_engine_t *e = zpp_engine_of(comm);
  struct zpp_request *r = NULL;
  void *event = NULL, *stream = NULL;
  int64_t started;
  zpp_status_t st;
  if (e == NULL) {
    zpp_engine_plan_free(p);
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                         "engine state"));
  }
  if (zpp_engine_staged(comm, p->ex.mem))
    return submit_staged(e, p, req);
  if (req != NULL) {
    r = new_request(comm);
    if (r == NULL) {
      zpp_engine_plan_free(p);
      return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                           "request"));
    }
  }
  /* Inline: enqueueing on a stream, a blocking call with nothing ahead of
   * it, or a started call where MPI allows no engine thread (it then
   * completes at once, as <zpp/zpp_coll.h> says). */
  pthread_mutex_lock(&e->mu);
  if (stream_ordered ||
      !(zpp_comm_thread_caps(comm) & ZPP_THREADS_PROGRESS) ||
      (req == NULL && e->head == NULL && !e->busy)) {
    /* wait for the engine to be idle: plans never overlap */
    while (e->head != NULL || e->busy)
      pthread_cond_wait(&e->cv, &e->mu);
    e->busy = 1;
    inline_ok = 1;
  }
  pthread_mutex_unlock(&e->mu);
  if (inline_ok) {
    stream = p->ex.stream;
    started = zpp_time_ns();
    p->progress = &e->last_progress_ns;
    st = zpp_engine_run_plan(p, &event);
    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    e->last_progress_ns = zpp_time_ns();
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (r != NULL) {
      complete(r, st, event, NULL);
      if (st != ZPP_OK) {
        free_request(r);
        return zpp_comm_fail(comm, st);
      }
      *req = r;
      /* the engine thread watches every stream-ordered collective, waited
       * for or not: a second event right after the request's */
      if (stream_ordered && event != NULL)
        watch_after(e, stream, started, func);
      return ZPP_OK;
    }
    if (st == ZPP_OK && event != NULL && stream_ordered)
      /* on the stream: the engine thread watches it, the caller goes on */
      return zpp_comm_fail(comm, zpp_engine_watch(e, event, started, func));
    if (st == ZPP_OK && event != NULL)
      st = zpp_engine_wait_event(t, event, started, func);
    zpp_engine_event_destroy(event);
    return st != ZPP_OK ? zpp_comm_fail(comm, st) : ZPP_OK;
  }
  if (r == NULL) { /* blocking call behind queued plans: wait our turn */
    r = new_request(comm);
    if (r == NULL) {
      zpp_engine_plan_free(p);
      return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                           "request"));
    }
    p->req = r;
    st = enqueue(e, p);
    if (st != ZPP_OK) {
      zpp_engine_plan_free(p);
      free_request(r);
      return zpp_comm_fail(comm, st);
    }
    st = wait_ran(e, r, func);
    if (st != ZPP_OK) { /* r may still be queued or running */
      abandon(e, r, func);
      return zpp_comm_fail(comm, st);
    }
    st = request_result(r, func);
    free_request(r);
    return st != ZPP_OK ? zpp_comm_fail(comm, st) : ZPP_OK;
  }
  p->req = r;
  st = enqueue(e, p);
  if (st != ZPP_OK) {
    zpp_engine_plan_free(p);
    free_request(r);
    return zpp_comm_fail(comm, st);
  }
  *req = r;
  return ZPP_OK;
}

zpp_status_t zpp_request_wait(zpp_request_t req) {
  zpp_engine_t *e;
  zpp_status_t st;
  if (req == NULL)
    return ZPP_OK;
  e = (zpp_engine_t *)req->comm->engine;
  st = wait_ran(e, req, __func__);
  if (st != ZPP_OK) { /* still queued or running */
    zpp_comm_t comm = req->comm;
    abandon(e, req, __func__);
    return zpp_comm_fail(comm, st);
  }
  st = request_result(req, __func__);
  free_request(req);
  return st;
}

/* Makes `stream` wait for req without the host waiting; req stays the
 * caller's.  *host = 1 when the host waited for req's host part instead
 * (host memory, a failed call, no stream waits in the driver). */
static zpp_status_t order_stream(zpp_request_t req, zpp_stream_t stream,
                                 const char *func, int *host) {
  zpp_comm_t comm = req->comm;
  zpp_engine_t *e = (zpp_engine_t *)comm->engine;
  zpp_memory_t mem = ZPP_MEMORY_HOST;
  zpp_status_t st;
  void *event;
  *host = 0;
  if (zpp_comm_memory(comm, &mem) != ZPP_OK || mem != ZPP_MEMORY_DEVICE) {
    *host = 1;
    return wait_ran(e, req, func);
  }
  /* a stream wait captured into a graph would replay a stale order */
  ZPP_CHECK(zpp_exec_check_capture(func, comm, stream));
  if (req->staged) {
    ZPP_CHECK(zpp_engine_stage_out(e, stream, req->staged, func, host));
    return *host ? wait_ran(e, req, func) : ZPP_OK;
  }
  pthread_mutex_lock(&req->mu);
  event = req->ran && req->status == ZPP_OK ? req->event : NULL;
  pthread_mutex_unlock(&req->mu);
  if (event == NULL) { /* a failed call: nothing to order */
    *host = 1;
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  {
    /* stream-ordered: it ran inline, its work is on its stream */
    char err[256];
    int saved = -1;
    st = zpp_exec_device_enter(comm, &saved);
    if (st == ZPP_OK && zpp_st_wait_event(stream, event, err, sizeof err) != 0)
      st = zpp_error(ZPP_ERR_CUDA, func, "stream: %s", err);
    zpp_exec_device_leave(saved);
    return st;
  }
#else
  (void)st;
  return ZPP_OK;
#endif
}

zpp_status_t zpp_request_order_stream(zpp_request_t req, zpp_stream_t stream) {
  int host = 0;
  zpp_status_t st;
  if (req == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "req is NULL");
  st = order_stream(req, stream, __func__, &host);
  if (st == ZPP_OK && host) /* the host part ran: its status */
    st = req->ran ? req->status : ZPP_OK;
  if (st == ZPP_OK) /* a failure known already (the communicator's) */
    st = zpp_transport_check_async(req->t, __func__);
  return st != ZPP_OK ? zpp_comm_fail(req->comm, st) : ZPP_OK;
}

zpp_status_t zpp_request_wait_stream(zpp_request_t req, zpp_stream_t stream) {
  zpp_comm_t comm;
  zpp_status_t st;
  int host = 0;
  if (req == NULL)
    return ZPP_OK;
  comm = req->comm;
  st = order_stream(req, stream, __func__, &host);
  if (st != ZPP_OK || host) {
    /* not ordered (or nothing to order): the host waits; req is freed */
    zpp_status_t wst = zpp_request_wait(req);
    return st != ZPP_OK ? zpp_comm_fail(comm, st) : wst;
  }
  if (req->staged) {
    detach(req); /* the engine frees it when its plan ends */
  } else {
    /* NCCL: the engine thread watches the collective already (a watch
     * event of its own); the request's event may go */
    free_request(req);
  }
  /* a failure known already (the communicator's): the stream goes on
   * with the output undefined */
  st = zpp_transport_check_async(zpp_comm_transport(comm), __func__);
  return st != ZPP_OK ? zpp_comm_fail(comm, st) : ZPP_OK;
}

zpp_status_t zpp_request_test(zpp_request_t req, int *done) {
  int ran;
  if (req == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "req is NULL");
  if (done == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "done is NULL");
  pthread_mutex_lock(&req->mu);
  ran = req->ran;
  pthread_mutex_unlock(&req->mu);
  *done = 0;
  if (!ran)
    return ZPP_OK;
  if (req->status != ZPP_OK || req->event == NULL) {
    *done = 1;
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  {
    char err[256];
    if (zpp_ew_event_query(req->event, done, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, __func__, "%s", err);
  }
#endif
  return ZPP_OK;
}

uint64_t zpp_engine_last_ticket(zpp_comm_t comm) {
  zpp_engine_t *e;
  uint64_t t = 0;
  pthread_mutex_lock(&engines_mu);
  e = (zpp_engine_t *)comm->engine;
  if (e != NULL) {
    pthread_mutex_lock(&e->mu);
    t = e->last_ticket;
    pthread_mutex_unlock(&e->mu);
  }
  pthread_mutex_unlock(&engines_mu);
  return t;
}

/* Under e->mu.  Tickets grow in queue order and the queue stays sorted
 * (plans leave it only from the head, or dropped by abandon / abort), so
 * the oldest plan not yet done is the running one, else the head. */
static int ticket_in_flight(const zpp_engine_t *e, uint64_t ticket) {
  return (e->running_ticket != 0 && e->running_ticket <= ticket) ||
         (e->head != NULL && e->head->ticket <= ticket);
}

int zpp_engine_in_flight(zpp_comm_t comm, uint64_t ticket) {
  zpp_engine_t *e;
  int in = 0;
  if (ticket == 0)
    return 0;
  pthread_mutex_lock(&engines_mu);
  e = (zpp_engine_t *)comm->engine;
  if (e != NULL) {
    pthread_mutex_lock(&e->mu);
    in = ticket_in_flight(e, ticket);
    pthread_mutex_unlock(&e->mu);
  }
  pthread_mutex_unlock(&engines_mu);
  return in;
}

zpp_status_t zpp_engine_wait_ticket(zpp_comm_t comm, uint64_t ticket,
                                    const char *func, const char *tail) {
  zpp_engine_t *e;
  zpp_status_t st = ZPP_OK;
  double to;
  if (ticket == 0) /* nothing started: comm is not touched */
    return ZPP_OK;
  /* the engine lives until zpp_comm_destroy, which the caller has not
   * reached (it still uses comm) */
  pthread_mutex_lock(&engines_mu);
  e = (zpp_engine_t *)comm->engine;
  pthread_mutex_unlock(&engines_mu);
  if (e == NULL)
    return ZPP_OK;
  to = zpp_transport_timeout_s(zpp_comm_transport(comm));
  pthread_mutex_lock(&e->mu);
  while (ticket_in_flight(e, ticket)) {
    struct timespec ts;
    slice_deadline(&ts);
    /* signalled when a plan finishes; the slice also sees abandon() */
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    if (ticket_in_flight(e, ticket) &&
        engine_stalled(e->last_progress_ns, to)) {
      st = ZPP_ERR_TIMEOUT;
      break;
    }
  }
  pthread_mutex_unlock(&e->mu);
  if (st == ZPP_OK)
    return ZPP_OK;
  /* as a timed-out zpp_request_wait: the stuck plan stops at its next
   * step, and nothing sane can follow on this communicator */
  zpp_transport_break_st(zpp_comm_transport(comm), ZPP_ERR_TIMEOUT,
                         "%s: the communicator's engine made no progress "
                         "within the timeout",
                         func);
  st = zpp_error(ZPP_ERR_TIMEOUT, func,
                 "the communicator's engine made no progress for %.3g s "
                 "(ZPP_TIMEOUT_S %.3g) while a started call was in flight; "
                 "the communicator is aborted%s%s",
                 stall_limit_s(to), to, tail ? "; " : "", tail ? tail : "");
  return zpp_comm_fail(comm, st);
}

/* The statistics count what the collectives started so far moved: on a
 * communicator whose calls return before the engine ran them (staged
 * device plans), wait for their host part first.  A broken communicator
 * answers at once (its counts are what they are). */
static zpp_status_t engine_quiesce(zpp_comm_t comm, const char *func) {
  uint64_t t = zpp_engine_last_ticket(comm);
  zpp_memory_t mem = ZPP_MEMORY_HOST;
  if (t == 0 || zpp_comm_memory(comm, &mem) != ZPP_OK ||
      !zpp_engine_staged(comm, mem) || !zpp_engine_in_flight(comm, t) ||
      zpp_transport_is_broken(zpp_comm_transport(comm)))
    return ZPP_OK;
  return zpp_engine_wait_ticket(comm, t, func, NULL);
}

/* zpp_comm_abort (any thread; the transport is broken already): the
 * plans still queued never start; their requests complete with the
 * communicator's error now, so their waiters return at once.  The plan
 * running now stops at its next step or test. */
static void engine_abort(zpp_comm_t comm) {
  zpp_engine_t *e;
  zpp_plan_t *p, *next;
  pthread_mutex_lock(&engines_mu);
  e = (zpp_engine_t *)comm->engine;
  if (e == NULL) {
    pthread_mutex_unlock(&engines_mu);
    return;
  }
  pthread_mutex_lock(&e->mu);
  p = e->head;
  e->head = e->tail = NULL;
  if (p != NULL) /* staged plans among them: their streams go on */
    zpp_engine_drop_ticket_locked(e, e->last_ticket);
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_mutex_unlock(&engines_mu);
  for (; p != NULL; p = next) {
    struct zpp_request *r = p->req;
    zpp_status_t st = zpp_transport_broken_error(p->ex.t, p->func);
    next = p->next;
    zpp_engine_plan_free(p);
    complete(r, st, NULL, NULL);
  }
}

void zpp_engine_release(zpp_comm_t comm) {
  zpp_engine_t *e;
  pthread_mutex_lock(&engines_mu);
  e = (zpp_engine_t *)comm->engine;
  comm->engine = NULL;
  pthread_mutex_unlock(&engines_mu);
  if (e == NULL)
    return;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (e->thread_started)
    pthread_join(e->thread, NULL); /* runs what is queued first, then
                                      waits for the watched events */
  zpp_engine_device_free(e);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
}

size_t zpp_engine_cached_bytes(zpp_comm_t comm) {
  return comm != NULL ? zpp_scratch_cached_bytes(zpp_comm_transport(comm)) : 0;
}
