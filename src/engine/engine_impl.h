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
  int abandoned;        /* its waiter gave up while the plan ran, or
                           handed it to a stream (device.c): the engine
                           frees the request when it completes */
  uint64_t staged;      /* a staged device plan's ticket (device.c): its
                           caller's streams wait for the engine's counter
                           to reach it; 0 otherwise */
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
  void *on_engine;         /* the engine whose thread runs it (NULL: the
                              caller's thread) */
  struct zpp_plan *next;   /* engine queue */
  uint64_t ticket;         /* 1, 2, ... in queue order (0: never queued) */
  void *in_event;          /* staged device plans: recorded on the caller's
                              stream at the call; the plan's stream waits
                              for it before its first step */
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
  /* Device memory (device.c), under mu unless said. */
  void *dstream;             /* the stream of staged device plans */
  uint32_t *counter;         /* pinned: the last staged ticket released */
  uint64_t released;         /* the ticket the counter holds */
  uint64_t release_upto;     /* dropped staged plans: released once the
                                running plan is done */
  struct zpp_watch *watch;   /* completion events the engine thread polls */
  int device_ready;          /* engine thread: the device is current */
  int device_warned;         /* engine thread: said it could not be */
} zpp_engine_t;

/* A stream-ordered call's completion event, watched by the engine thread
 * until it completes; past the timeout the communicator is aborted so that
 * the streams holding its work drain. */
typedef struct zpp_watch {
  void *event;
  int64_t started_ns;
  const char *func;
  struct zpp_watch *next;
} zpp_watch_t;


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

/* ---- device memory (device.c) -------------------------------------------- */

/* Staged device plans: a device communicator on a host backend whose
 * engine thread may progress plans while the caller goes on. */
int zpp_engine_staged(zpp_comm_t comm, zpp_memory_t mem);
/* The engine's stream for staged plans, created on first use on the
 * communicator's device. */
zpp_status_t zpp_engine_device_stream(const char *func, zpp_comm_t comm,
                                      void **stream);
/* The engine thread, before its first device plan or poll: makes the
 * communicator's device current for good (the thread is zpp's). */
zpp_status_t zpp_engine_thread_device(zpp_engine_t *e, const char *func);
/* At a staged call, on the caller's thread: p->in_event on `stream`. */
zpp_status_t zpp_engine_stage_in(zpp_engine_t *e, zpp_plan_t *p,
                                 void *stream);
/* `stream` waits until the engine released `ticket`.  When the driver
 * cannot make a stream wait on the counter, 1 in *host (the caller then
 * waits on the host). */
zpp_status_t zpp_engine_stage_out(zpp_engine_t *e, void *stream,
                                  uint64_t ticket, const char *func,
                                  int *host);
/* Releases the streams waiting for tickets up to `ticket` (never back). */
void zpp_engine_release_ticket(zpp_engine_t *e, uint64_t ticket);
/* Under e->mu: queued staged plans up to `ticket` were dropped; released
 * now when no plan runs, else when the running one is done. */
void zpp_engine_drop_ticket_locked(zpp_engine_t *e, uint64_t ticket);
/* Hands a completion event to the engine thread's watch (it destroys the
 * event); starts the thread if needed. */
zpp_status_t zpp_engine_watch(zpp_engine_t *e, void *event,
                              int64_t started_ns, const char *func);
/* Engine thread, e->mu not held: polls the watched events once; returns
 * 1 while some remain. */
int zpp_engine_watch_poll(zpp_engine_t *e);
/* Engine thread at stop: polls until every watched event completed or
 * the timeout aborted the communicator. */
void zpp_engine_watch_drain(zpp_engine_t *e);
/* Frees the device resources of the engine (after its thread ended). */
void zpp_engine_device_free(zpp_engine_t *e);
/* The engine thread, at its start: its stream captures are relaxed, so
 * that its allocations do not invalidate a capture of another thread. */
void zpp_engine_thread_init(zpp_engine_t *e);
/* After a staged plan failed: waits (bounded from `start_ns`) for what it
 * queued on the engine's stream. */
void zpp_engine_stage_drain(zpp_engine_t *e, const char *func,
                            int64_t start_ns);
/* Starts the engine thread if it is not running (under e->mu). */
zpp_status_t zpp_engine_start_thread_locked(zpp_engine_t *e,
                                            const char *func);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ENGINE_ENGINE_IMPL_H */
