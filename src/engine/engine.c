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
#include "algo/algo.h"
#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "kernels/elementwise.h"
#include "transport/transport_impl.h"

#if ZPP_HAVE_CUDA_KERNELS
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { STEP_WAITING = 0, STEP_RUNNING = 1, STEP_DONE = 2 };

typedef struct {
  zpp_step_kind_t kind;
  int deps[ZPP_STEP_MAXDEPS];
  zpp_kernel_fn fn;
  size_t arg;
  zpp_xfer_desc_t x;
  int state;
  zpp_xop_t *op;
} step_t;

struct zpp_request {
  zpp_comm_t comm;
  zpp_transport_t *t;
  int ran;              /* the host part finished (status valid) */
  zpp_status_t status;
  char msg[512];        /* the error message of the thread that ran it */
  void *event;          /* device plans: recorded after the last step */
  int64_t started_ns;   /* for the timeout of the event wait */
  int abandoned;        /* its waiter gave up while the plan ran: the
                           engine frees the request when it completes */
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

struct zpp_plan {
  const char *func;
  int ndone;       /* steps done (execute) */
  zpp_status_t poll_st; /* first error seen by zpp_plan_poll */
  zpp_exec_t ex;
  void *ctx;
  void (*release)(void *ctx);
  step_t *steps;
  int n, cap;
  int oom;
  struct zpp_request *req; /* where the result goes; NULL: inline caller */
  _Atomic int64_t *progress; /* the engine's last_progress_ns, or NULL */
  struct zpp_plan *next;   /* engine queue */
  uint64_t ticket;         /* 1, 2, ... in queue order (0: never queued) */
};

/* ---- the per-communicator engine ----------------------------------------- */

#define CACHE_SLOTS 32
#define CACHE_HDR 64 /* keeps buffers 64-byte aligned, holds their size */

typedef struct {
  zpp_comm_t comm;
  pthread_mutex_t mu;
  pthread_cond_t cv;        /* queue, busy and stop changes */
  zpp_plan_t *head, *tail;  /* queued plans */
  int busy;                 /* a plan is running (thread or inline) */
  uint64_t last_ticket;     /* the last queued plan's ticket */
  uint64_t running_ticket;  /* the engine thread's plan now (0: none) */
  int thread_started, stop;
  pthread_t thread;
  /* A plan started or finished a step, or moved bytes (for bounded waits:
   * a long plan that keeps moving is not a hung one).  Written by the
   * running plan without the mutex. */
  _Atomic int64_t last_progress_ns;
  /* Host scratch: plans need large buffers on every call (a qwZ gather of
   * 16 MiB per rank over 8 ranks needs ~70 MB unchunked, on device memory;
   * the host pipeline keeps 3 slots of 1/32 of it); fresh malloc'ed memory of
   * that size is mmap'ed and returned on free, so every call would pay
   * page faults.  Freed buffers are kept (up to ZPP_SCRATCH_CACHE_MB) for
   * the life of the communicator and released by zpp_comm_destroy. */
  pthread_mutex_t cache_mu;
  void *slot[CACHE_SLOTS];
  size_t slot_cap[CACHE_SLOTS];
  size_t cache_total;
  /* Host memory given back while cancelled transfers may still read or
   * write it (zpp_transport_in_doubt: a failed plan's scratch, a failed
   * hpZ handle's partition): never reused, freed by zpp_engine_release
   * once the transport is quiet, else leaked.  Under cache_mu. */
  struct held *held;
} engine_t;

struct held {
  void *p; /* what free() takes */
  struct held *next;
};

static pthread_mutex_t engines_mu = PTHREAD_MUTEX_INITIALIZER;

static void engine_abort(zpp_comm_t comm);

static engine_t *engine_of(zpp_comm_t comm) {
  engine_t *e;
  pthread_mutex_lock(&engines_mu);
  e = (engine_t *)comm->engine;
  if (e == NULL) {
    e = (engine_t *)calloc(1, sizeof *e);
    if (e != NULL) {
      e->comm = comm;
      pthread_mutex_init(&e->mu, NULL);
      pthread_cond_init(&e->cv, NULL);
      pthread_mutex_init(&e->cache_mu, NULL);
      e->last_progress_ns = zpp_time_ns();
      comm->engine = e;
      zpp_comm_set_before_destroy(comm, zpp_engine_release);
      zpp_comm_set_on_abort(comm, engine_abort);
    }
  }
  pthread_mutex_unlock(&engines_mu);
  return e;
}

void *zpp_engine_host_alloc(zpp_comm_t comm, size_t bytes) {
  engine_t *e = engine_of(comm);
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

/* ---- plans ------------------------------------------------------------------ */

zpp_status_t zpp_plan_create(const char *func, const zpp_exec_t *ex,
                             void *ctx, void (*release)(void *ctx),
                             zpp_plan_t **out) {
  zpp_plan_t *p = (zpp_plan_t *)calloc(1, sizeof *p);
  if (p == NULL) {
    if (release != NULL)
      release(ctx);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "plan");
  }
  p->func = func;
  p->ex = *ex;
  p->ctx = ctx;
  p->release = release;
  *out = p;
  return ZPP_OK;
}

void *zpp_plan_ctx(zpp_plan_t *p) { return p->ctx; }

static int add_step(zpp_plan_t *p, zpp_step_kind_t kind, int dep0, int dep1) {
  step_t *s;
  if (p->oom)
    return ZPP_NO_STEP;
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    step_t *q = (step_t *)realloc(p->steps, (size_t)cap * sizeof *q);
    if (q == NULL) {
      p->oom = 1;
      return ZPP_NO_STEP;
    }
    p->steps = q;
    p->cap = cap;
  }
  s = &p->steps[p->n];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  /* Dependencies point backwards (a DAG in index order: no deadlock). */
  s->deps[0] = dep0 >= 0 && dep0 < p->n ? dep0 : ZPP_NO_STEP;
  s->deps[1] = dep1 >= 0 && dep1 < p->n ? dep1 : ZPP_NO_STEP;
  return p->n++;
}

int zpp_plan_kernel(zpp_plan_t *p, zpp_kernel_fn fn, size_t arg, int dep0,
                    int dep1) {
  int i = add_step(p, ZPP_STEP_KERNEL, dep0, dep1);
  if (i != ZPP_NO_STEP) {
    p->steps[i].fn = fn;
    p->steps[i].arg = arg;
  }
  return i;
}

int zpp_plan_xfer(zpp_plan_t *p, const zpp_xfer_desc_t *x, int dep0, int dep1) {
  int i = add_step(p, ZPP_STEP_XFER, dep0, dep1);
  if (i != ZPP_NO_STEP) {
    p->steps[i].x = *x;
    /* Every transfer of a plan is on the plan's memory space and stream. */
    p->steps[i].x.mem = p->ex.mem;
    p->steps[i].x.stream = p->ex.stream;
  }
  return i;
}

static void plan_free(zpp_plan_t *p) {
  int i;
  for (i = 0; i < p->n; i++)
    if (p->steps[i].op != NULL)
      zpp_xop_free(p->steps[i].op);
  if (p->release != NULL)
    p->release(p->ctx);
  free(p->steps);
  free(p);
}

void zpp_plan_discard(zpp_plan_t *p) {
  if (p != NULL)
    plan_free(p);
}

/* ---- executing a plan ---------------------------------------------------- */

static int deps_done(const zpp_plan_t *p, const step_t *s) {
  int d;
  for (d = 0; d < ZPP_STEP_MAXDEPS; d++)
    if (s->deps[d] != ZPP_NO_STEP && p->steps[s->deps[d]].state != STEP_DONE)
      return 0;
  return 1;
}

static zpp_status_t start_xfer(zpp_plan_t *p, step_t *s) {
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
    if (p->steps[i].state != STEP_RUNNING)
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
    step_t *s = &p->steps[i];
    int done = 0;
    zpp_status_t st;
    if (s->state != STEP_RUNNING)
      continue;
    st = zpp_xop_test(s->op, &done);
    if (st != ZPP_OK)
      return st;
    if (done) {
      zpp_xop_free(s->op);
      s->op = NULL;
      s->state = STEP_DONE;
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
  int64_t spin_ns = p->ex.t->spin_ns; /* ZPP_NET_SPIN_US, read at creation */
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
      step_t *s = &p->steps[next_x];
      if (s->kind != ZPP_STEP_XFER) {
        next_x++;
        continue;
      }
      if (!deps_done(p, s))
        break;
      st = start_xfer(p, s);
      if (st != ZPP_OK)
        return st;
      s->state = STEP_RUNNING;
      next_x++;
      progressed = 1;
    }
    st = poll_xfers(p, &progressed);
    if (st != ZPP_OK)
      return st;
    /* one kernel step, then look at the wire again */
    for (i = 0; i < n; i++) {
      step_t *s = &p->steps[i];
      if (s->kind != ZPP_STEP_KERNEL || s->state != STEP_WAITING ||
          !deps_done(p, s))
        continue;
      tl_running = p;
      st = s->fn(p->ctx, s->arg);
      tl_running = NULL;
      if (st == ZPP_OK && p->poll_st != ZPP_OK)
        st = p->poll_st; /* a transfer failed while the kernel polled */
      if (st != ZPP_OK)
        return st;
      s->state = STEP_DONE;
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
 * *saved gets the thread's previous device (-1: none to restore). */
static zpp_status_t enter_device(const zpp_plan_t *p, int *saved) {
  *saved = -1;
#if ZPP_HAVE_CUDA_KERNELS
  if (p->ex.mem == ZPP_MEMORY_DEVICE && p->ex.comm->cuda_device >= 0) {
    char err[256];
    int cur = -1;
    if (zpp_ew_get_device(&cur, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, p->func, "%s", err);
    if (cur != p->ex.comm->cuda_device &&
        zpp_ew_set_device(p->ex.comm->cuda_device, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, p->func, "%s", err);
    *saved = cur;
  }
#else
  (void)p;
#endif
  return ZPP_OK;
}

static void leave_device(const zpp_plan_t *p, int saved) {
#if ZPP_HAVE_CUDA_KERNELS
  char err[256];
  if (saved >= 0 && saved != p->ex.comm->cuda_device)
    zpp_ew_set_device(saved, err, sizeof err);
#else
  (void)p;
  (void)saved;
#endif
}

/* Runs p's steps on this thread; on device memory records the completion
 * event (*event, may stay NULL for host plans).  Frees p. */
static zpp_status_t run_plan(zpp_plan_t *p, void **event) {
  int saved = -1;
  zpp_status_t st;
  *event = NULL;
  st = enter_device(p, &saved);
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
  leave_device(p, saved);
  if (st != ZPP_OK) {
    /* This rank left the collective part-way: its peers still run the
     * transfers it skipped, and its next operations would take their
     * tags.  Nothing sane can follow on this communicator. */
    zpp_transport_fail(p->ex.t, st);
    zpp_transport_break_st(p->ex.t, st, "%s failed on this rank: %s",
                           p->func, zpp_status_string(st));
  }
  plan_free(p);
  return st;
}

/* Waits for a device plan's completion event, polling the transport's
 * asynchronous errors; bounded by the timeout from `start_ns`. */
static zpp_status_t wait_event(zpp_transport_t *t, void *event,
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
    if (done && t->ops->coll != NULL && t->ops->coll->abort_device_work != NULL)
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
      if (t->ops->coll != NULL && t->ops->coll->abort_device_work != NULL)
        t->ops->coll->abort_device_work(t);
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

static void event_destroy(void *event) {
#if ZPP_HAVE_CUDA_KERNELS
  zpp_ew_event_destroy(event);
#else
  (void)event;
#endif
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
  event_destroy(r->event);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

/* e: the engine whose thread ran r's plan (NULL: inline or dropped); its
 * running ticket is cleared while r->mu is held (lock order r->mu, then
 * e->mu, as wait_ran), so whoever sees r done also sees the plan out of
 * flight (zpp_engine_in_flight), and the other way round. */
static void complete(struct zpp_request *r, zpp_status_t st, void *event,
                     engine_t *e) {
  pthread_mutex_lock(&r->mu);
  if (e != NULL) {
    pthread_mutex_lock(&e->mu);
    e->running_ticket = 0;
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

static void *engine_main(void *arg) {
  engine_t *e = (engine_t *)arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    zpp_plan_t *p;
    struct zpp_request *r;
    void *event = NULL;
    zpp_status_t st;
    while ((e->head == NULL || e->busy) && !e->stop)
      pthread_cond_wait(&e->cv, &e->mu);
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
    p->progress = &e->last_progress_ns;
    st = run_plan(p, &event);
    /* the host part is done (run_plan freed p; device work may still be
     * on the stream): out of flight as r completes */
    complete(r, st, event, e);
    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    e->last_progress_ns = zpp_time_ns();
    pthread_cond_broadcast(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

/* Queues p for the engine thread (started on first use). */
static zpp_status_t enqueue(engine_t *e, zpp_plan_t *p) {
  pthread_mutex_lock(&e->mu);
  if (!e->thread_started) {
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
      pthread_mutex_unlock(&e->mu);
      return zpp_error(ZPP_ERR_SYSTEM, p->func,
                       "pthread_create of the engine thread failed");
    }
    e->thread_started = 1;
  }
  if (e->head == NULL && !e->busy)
    e->last_progress_ns = zpp_time_ns();
  p->next = NULL;
  p->ticket = ++e->last_ticket;
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
static zpp_status_t wait_ran(engine_t *e, struct zpp_request *r,
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
static void abandon(engine_t *e, struct zpp_request *r, const char *func) {
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
    break;
  }
  pthread_mutex_unlock(&e->mu);
  if (p != NULL) {
    plan_free(p);
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
    st = wait_event(r->t, r->event, r->started_ns, func);
    if (st == ZPP_OK) {
      event_destroy(r->event);
      r->event = NULL;
    }
  }
  return st;
}

zpp_status_t zpp_plan_submit(zpp_plan_t *p, zpp_request_t *req) {
  zpp_comm_t comm = p->ex.comm;
  zpp_transport_t *t = p->ex.t;
  const char *func = p->func;
  int stream_ordered = zpp_transport_backend(t) == ZPP_BACKEND_NCCL;
  int inline_ok = 0;
  engine_t *e = engine_of(comm);
  struct zpp_request *r = NULL;
  void *event = NULL;
  zpp_status_t st;
  if (e == NULL) {
    plan_free(p);
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                         "engine state"));
  }
  if (req != NULL) {
    r = new_request(comm);
    if (r == NULL) {
      plan_free(p);
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
    p->progress = &e->last_progress_ns;
    st = run_plan(p, &event);
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
      return ZPP_OK;
    }
    if (st == ZPP_OK && event != NULL)
      st = wait_event(t, event, zpp_time_ns(), func);
    event_destroy(event);
    return st != ZPP_OK ? zpp_comm_fail(comm, st) : ZPP_OK;
  }
  if (r == NULL) { /* blocking call behind queued plans: wait our turn */
    r = new_request(comm);
    if (r == NULL) {
      plan_free(p);
      return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                           "request"));
    }
    p->req = r;
    st = enqueue(e, p);
    if (st != ZPP_OK) {
      plan_free(p);
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
    plan_free(p);
    free_request(r);
    return zpp_comm_fail(comm, st);
  }
  *req = r;
  return ZPP_OK;
}

zpp_status_t zpp_request_wait(zpp_request_t req) {
  engine_t *e;
  zpp_status_t st;
  if (req == NULL)
    return ZPP_OK;
  e = (engine_t *)req->comm->engine;
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
  engine_t *e;
  uint64_t t = 0;
  pthread_mutex_lock(&engines_mu);
  e = (engine_t *)comm->engine;
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
static int ticket_in_flight(const engine_t *e, uint64_t ticket) {
  return (e->running_ticket != 0 && e->running_ticket <= ticket) ||
         (e->head != NULL && e->head->ticket <= ticket);
}

int zpp_engine_in_flight(zpp_comm_t comm, uint64_t ticket) {
  engine_t *e;
  int in = 0;
  if (ticket == 0)
    return 0;
  pthread_mutex_lock(&engines_mu);
  e = (engine_t *)comm->engine;
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
  engine_t *e;
  zpp_status_t st = ZPP_OK;
  double to;
  if (ticket == 0) /* nothing started: comm is not touched */
    return ZPP_OK;
  /* the engine lives until zpp_comm_destroy, which the caller has not
   * reached (it still uses comm) */
  pthread_mutex_lock(&engines_mu);
  e = (engine_t *)comm->engine;
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

/* zpp_comm_abort (any thread; the transport is broken already): the
 * plans still queued never start; their requests complete with the
 * communicator's error now, so their waiters return at once.  The plan
 * running now stops at its next step or test. */
static void engine_abort(zpp_comm_t comm) {
  engine_t *e;
  zpp_plan_t *p, *next;
  pthread_mutex_lock(&engines_mu);
  e = (engine_t *)comm->engine;
  if (e == NULL) {
    pthread_mutex_unlock(&engines_mu);
    return;
  }
  pthread_mutex_lock(&e->mu);
  p = e->head;
  e->head = e->tail = NULL;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_mutex_unlock(&engines_mu);
  for (; p != NULL; p = next) {
    struct zpp_request *r = p->req;
    zpp_status_t st = zpp_transport_broken_error(p->ex.t, p->func);
    next = p->next;
    plan_free(p);
    complete(r, st, NULL, NULL);
  }
}

void zpp_engine_release(zpp_comm_t comm) {
  engine_t *e;
  int i, quiet;
  pthread_mutex_lock(&engines_mu);
  e = (engine_t *)comm->engine;
  comm->engine = NULL;
  pthread_mutex_unlock(&engines_mu);
  if (e == NULL)
    return;
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (e->thread_started)
    pthread_join(e->thread, NULL); /* runs what is queued first */
  /* The cache was filled before any transfer was left in doubt (after
   * that, memory goes to `held`): free.  Held memory only once the
   * transport's cancelled transfers are done (bounded wait), else leak. */
  quiet = zpp_transport_quiesce(zpp_comm_transport(comm));
  while (e->held != NULL) {
    struct held *h = e->held;
    e->held = h->next;
    if (quiet)
      free(h->p);
    free(h);
  }
  for (i = 0; i < CACHE_SLOTS; i++)
    free(e->slot[i]);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->cache_mu);
  free(e);
}
