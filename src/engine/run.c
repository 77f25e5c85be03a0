/*
 * Executing a plan on one thread: transfer steps started in index order
 * and polled, kernel steps run when their dependencies are done, the
 * wait between them, and the device's completion event.
 */
#include "engine/engine_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/exec.h"
#include "kernels/elementwise.h"
#include "kernels/stream.h"

#include <sched.h>
#include <time.h>

/* ---- executing a plan ---------------------------------------------------- */

static int deps_done(const zpp_plan_t *p, const zpp_step_t *s) {
  int d;
  for (d = 0; d < ZPP_STEP_MAXDEPS; d++)
    if (s->deps[d] != ZPP_NO_STEP && p->steps[s->deps[d]].state != ZPP_STEP_DONE)
      return 0;
  return 1;
}

static zpp_status_t start_xfer(zpp_plan_t *p, zpp_step_t *s) {
  return zpp_xfer_start(p->ex.t, &s->x, 0, &s->op);
}

/* Waits for progress: until the earliest emulated-link deadline of the
 * transfers in flight when every one has such a deadline, else spin
 * (yield) until quiet_until and then sleep with a doubling pause. */
static void idle_wait(const zpp_plan_t *p, int64_t quiet_until,
                      long *pause_ns) {
  int64_t now = zpp_time_ns(), wake = INT64_MAX;
  int i, polled = 0;
  for (i = 0; i < p->n; i++) {
    int64_t w;
    if (p->steps[i].state != ZPP_STEP_RUNNING)
      continue;
    w = zpp_xop_wake_ns(p->steps[i].op);
    if (w <= now) {
      polled = 1;
      break;
    }
    if (w < wake)
      wake = w;
  }
  if (!polled && wake != INT64_MAX) {
    zpp_sleep_until_ns(wake);
    return;
  }
  if (now < quiet_until) {
    sched_yield();
  } else {
    zpp_pause_ns(pause_ns);
  }
}

/* The plan whose kernel step this thread is running (zpp_plan_poll). */
static _Thread_local zpp_plan_t *tl_running;

/* Tests every transfer in flight once; marks the done ones. */
static zpp_status_t poll_xfers(zpp_plan_t *p, int *progressed) {
  int i;
  for (i = 0; i < p->n; i++) {
    zpp_step_t *s = &p->steps[i];
    int done = 0;
    zpp_status_t st;
    if (s->state != ZPP_STEP_RUNNING)
      continue;
    st = zpp_xop_test(s->op, &done);
    if (st != ZPP_OK)
      return st;
    if (done) {
      zpp_xop_free(s->op);
      s->op = NULL;
      s->state = ZPP_STEP_DONE;
      p->ndone++;
      *progressed = 1;
    }
  }
  return ZPP_OK;
}

void zpp_plan_poll(void) {
  zpp_plan_t *p = tl_running;
  int progressed = 0;
  zpp_status_t st;
  if (p == NULL || p->poll_st != ZPP_OK)
    return;
  st = poll_xfers(p, &progressed);
  if (st != ZPP_OK) /* reported by the executor after the kernel step */
    p->poll_st = st;
}

static zpp_status_t execute(zpp_plan_t *p) {
  int64_t spin_ns = zpp_transport_spin_ns(p->ex.t);
  int64_t quiet_until = zpp_time_ns() + spin_ns;
  long pause_ns = 1000;
  int n = p->n, next_x = 0, i;
  uint64_t moved = zpp_transport_progress(p->ex.t);
  zpp_status_t st = ZPP_OK;
  if (p->oom)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, p->func, "plan steps");
  p->ndone = 0;
  while (p->ndone < n) {
    int progressed = 0;
    /* zpp_comm_abort from another thread, or a failure elsewhere: stop
     * between steps (transfers in flight see it at their next test) */
    ZPP_CHECK(zpp_transport_broken_error(p->ex.t, p->func));
    /* transfers start in index order, the same on every rank */
    while (next_x < n) {
      zpp_step_t *s = &p->steps[next_x];
      if (s->kind != ZPP_STEP_XFER) {
        next_x++;
        continue;
      }
      if (!deps_done(p, s))
        break;
      st = start_xfer(p, s);
      if (st != ZPP_OK)
        return st;
      s->state = ZPP_STEP_RUNNING;
      next_x++;
      progressed = 1;
    }
    st = poll_xfers(p, &progressed);
    if (st != ZPP_OK)
      return st;
    /* one kernel step, then look at the wire again */
    for (i = 0; i < n; i++) {
      zpp_step_t *s = &p->steps[i];
      if (s->kind != ZPP_STEP_KERNEL || s->state != ZPP_STEP_WAITING ||
          !deps_done(p, s))
        continue;
      tl_running = p;
      st = s->fn(p->ctx, s->arg);
      tl_running = NULL;
      if (st == ZPP_OK && p->poll_st != ZPP_OK)
        st = p->poll_st; /* a transfer failed while the kernel polled */
      if (st != ZPP_OK)
        return st;
      s->state = ZPP_STEP_DONE;
      p->ndone++;
      progressed = 1;
      break;
    }
    /* a transfer inside an operation completed (a round of a ring, a
     * fragment): keep spinning, large intra-node messages need both sides
     * to poll */
    if (zpp_transport_progress(p->ex.t) != moved) {
      moved = zpp_transport_progress(p->ex.t);
      progressed = 1;
    }
    if (progressed) {
      int64_t now = zpp_time_ns();
      quiet_until = now + spin_ns;
      pause_ns = 1000;
      if (p->progress != NULL)
        atomic_store_explicit(p->progress, now, memory_order_relaxed);
    } else {
      idle_wait(p, quiet_until, &pause_ns);
    }
  }
  return ZPP_OK;
}

/* Makes the communicator's device current on this thread for the plan;
 * *saved gets the thread's previous device (-1: none to restore).  The
 * engine's thread keeps the device (it is zpp's thread). */
static zpp_status_t enter_device(const zpp_plan_t *p, int *saved) {
  *saved = -1;
  if (p->ex.mem != ZPP_MEMORY_DEVICE)
    return ZPP_OK;
  if (p->on_engine != NULL)
    return zpp_engine_thread_device((zpp_engine_t *)p->on_engine, p->func);
  return zpp_exec_device_enter(p->ex.comm, saved);
}

/* A staged plan's stream waits for the caller's work before its steps. */
static zpp_status_t stage_in(zpp_plan_t *p) {
#if ZPP_HAVE_CUDA_KERNELS
  char err[256];
  if (p->in_event == NULL)
    return ZPP_OK;
  if (zpp_st_wait_event(p->ex.stream, p->in_event, err, sizeof err) != 0)
    return zpp_error(ZPP_ERR_CUDA, p->func, "waiting for the caller's stream: %s",
                     err);
  zpp_engine_event_destroy(p->in_event);
  p->in_event = NULL;
#else
  (void)p;
#endif
  return ZPP_OK;
}

/* Runs p's steps on this thread; on device memory records the completion
 * event (*event, may stay NULL for host plans).  Frees p. */
zpp_status_t zpp_engine_run_plan(zpp_plan_t *p, void **event) {
  int saved = -1;
  zpp_status_t st;
  *event = NULL;
  st = enter_device(p, &saved);
  if (st == ZPP_OK)
    st = stage_in(p);
  if (st == ZPP_OK)
    st = execute(p);
#if ZPP_HAVE_CUDA_KERNELS
  if (st == ZPP_OK && p->ex.mem == ZPP_MEMORY_DEVICE) {
    char err[256];
    /* release first: stream-ordered frees come before the event */
    if (p->release != NULL)
      p->release(p->ctx);
    p->release = NULL;
    if (zpp_ew_event_record(event, p->ex.stream, err, sizeof err) != 0)
      st = zpp_error(ZPP_ERR_CUDA, p->func, "completion event: %s", err);
  }
#endif
  zpp_exec_device_leave(saved);
  if (st != ZPP_OK) {
    /* This rank left the collective part-way: its peers still run the
     * transfers it skipped, and its next operations would take their
     * tags.  Nothing sane can follow on this communicator. */
    zpp_transport_fail(p->ex.t, st);
    zpp_transport_break_st(p->ex.t, st, "%s failed on this rank: %s",
                           p->func, zpp_status_string(st));
  }
  zpp_engine_plan_free(p);
  return st;
}

/* Waits for a device plan's completion event, polling the transport's
 * asynchronous errors; bounded by the timeout from `start_ns`. */
zpp_status_t zpp_engine_wait_event(zpp_transport_t *t, void *event,
                               int64_t start_ns, const char *func) {
#if ZPP_HAVE_CUDA_KERNELS
  double to = zpp_transport_timeout_s(t);
  int64_t limit = to > 0 ? start_ns + (int64_t)(to * 1e9) : INT64_MAX;
  long pause_ns = 1000;
  char err[256];
  for (;;) {
    int done = 0;
    if (zpp_ew_event_query(event, &done, err, sizeof err) != 0)
      return zpp_transport_fail(t, zpp_error(ZPP_ERR_CUDA, func, "%s", err));
    /* A backend that aborts its device work on a failure (NCCL: after
     * zpp_comm_abort, a timeout) lets the aborted work leave the stream,
     * and the event then completes without the collective having run:
     * on a broken transport, done is not success. */
    if (done && zpp_transport_aborts_device_work(t))
      ZPP_CHECK(zpp_transport_broken_error(t, func));
    if (done)
      return ZPP_OK;
    ZPP_CHECK(zpp_transport_check_async(t, func));
    if (zpp_time_ns() > limit) {
      zpp_transport_break_st(t, ZPP_ERR_TIMEOUT,
                             "%s: device work did not finish within %.3g s",
                             func, to);
      /* The stream holds work waiting for peers: stop it, or the
       * caller's stream (and its next synchronisation) never drains. */
      zpp_transport_abort_device_work(t);
      return zpp_transport_fail(
          t, zpp_error(ZPP_ERR_TIMEOUT, func,
                       "the collective's work on the stream did not finish "
                       "within %.3g s (ZPP_TIMEOUT_S); the communicator is "
                       "aborted",
                       to));
    }
    zpp_pause_ns(&pause_ns);
  }
#else
  (void)t;
  (void)event;
  (void)start_ns;
  (void)func;
  return ZPP_OK;
#endif
}

void zpp_engine_event_destroy(void *event) {
#if ZPP_HAVE_CUDA_KERNELS
  zpp_ew_event_destroy(event);
#else
  (void)event;
#endif
}
