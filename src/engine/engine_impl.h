/*
 * What the files of src/engine share: plans, steps, requests and the
 * per-communicator engine.  Not for other layers (they use plan.h,
 * engine.h and exec.h).
 */
#ifndef ZPP_SRC_ENGINE_ENGINE_IMPL_H
#define ZPP_SRC_ENGINE_ENGINE_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "algo/algo.h"
#include "engine/engine.h"
#include "engine/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { ZPP_STEP_WAITING = 0, ZPP_STEP_RUNNING = 1, ZPP_STEP_DONE = 2 };

typedef struct {
  zpp_step_kind_t kind;
  int deps[ZPP_STEP_MAXDEPS];
  zpp_kernel_fn fn;
  size_t arg;
  zpp_xfer_desc_t x;
  int state;
  zpp_xop_t *op;
} zpp_step_t;

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
  zpp_step_t *steps;
  int n, cap;
  int oom;
  struct zpp_request *req; /* where the result goes; NULL: inline caller */
  _Atomic int64_t *progress; /* the engine's last_progress_ns, or NULL */
  struct zpp_plan *next;   /* engine queue */
  uint64_t ticket;         /* 1, 2, ... in queue order (0: never queued) */
};

/* ---- the per-communicator engine ----------------------------------------- */

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
} zpp_engine_t;


/* The communicator's engine, created on first use (NULL: out of memory). */
zpp_engine_t *zpp_engine_of(zpp_comm_t comm);
/* Runs the plan's release and frees it (plan.c). */
void zpp_engine_plan_free(zpp_plan_t *p);
/* Runs p's steps on this thread; on device memory records the completion
 * event (*event, may stay NULL for host plans).  Frees p (run.c). */
zpp_status_t zpp_engine_run_plan(zpp_plan_t *p, void **event);
/* Waits for a device plan's completion event, polling the transport's
 * asynchronous errors; bounded by the timeout from `start_ns` (run.c). */
zpp_status_t zpp_engine_wait_event(zpp_transport_t *t, void *event,
                                   int64_t start_ns, const char *func);
void zpp_engine_event_destroy(void *event);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ENGINE_ENGINE_IMPL_H */
