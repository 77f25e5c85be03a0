/*
 * Plans: what a collective is, for the engine that runs it (engine.c).
 *
 * A collective builds a plan of steps and submits it; it never waits for a
 * transfer or a thread itself.  Steps are
 *   - kernel steps: a function of the collective (encode, decode,
 *     accumulate, copy: the kernels of exec.h, on the plan's memory
 *     space and stream), run to completion by the engine;
 *   - transfer steps: one transfer descriptor (transport.h), started by
 *     src/algo's one dispatch without blocking and polled (host backends),
 *     or enqueued on the stream (NCCL).
 * Each step names up to ZPP_STEP_MAXDEPS earlier steps it needs done
 * (data hazards, buffer reuse); dependencies point backwards, so a plan is
 * a DAG in index order and cannot deadlock.  Transfer steps start in index
 * order on every rank (the transport's tags follow that order); kernel
 * steps run as soon as their dependencies are done, which lets a chunked
 * plan decode chunk k while chunks k+1 and k+2 are on the wire, with no
 * thread of its own.
 *
 * Memory a plan needs is allocated while it is built (zpp_k_alloc on the
 * plan's exec) and released by the plan's release function once the last
 * step is done (device memory: stream-ordered, so after the work that
 * uses it).
 *
 * Where a new collective plugs in: build a plan with these calls.  Where a
 * new transport plugs in: one of transport.h's two backend tables (the
 * collective table or the round table); plans do not change.
 * docs/design.md, "Execution".
 */
#ifndef ZPP_SRC_ENGINE_PLAN_H
#define ZPP_SRC_ENGINE_PLAN_H

#include <zpp/zpp_coll.h>

#include "engine/exec.h"
#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ZPP_STEP_KERNEL = 0, ZPP_STEP_XFER = 1 } zpp_step_kind_t;


/* A kernel step: fn(ctx, arg).  ctx is the plan's context. */
typedef zpp_status_t (*zpp_kernel_fn)(void *ctx, size_t arg);

#define ZPP_STEP_MAXDEPS 2
#define ZPP_NO_STEP (-1)

typedef struct zpp_plan zpp_plan_t;

/* A new, empty plan for `func` (the public function, for messages) on the
 * exec's communicator, memory space and stream.  ctx is the collective's
 * state, handed to every kernel step; release(ctx) runs once after the
 * last step (or after a failure) and frees ctx and the plan's buffers. */
zpp_status_t zpp_plan_create(const char *func, const zpp_exec_t *ex,
                             void *ctx, void (*release)(void *ctx),
                             zpp_plan_t **out);
/* Appends a step; returns its index, or ZPP_NO_STEP when out of memory
 * (the plan remembers the failure; zpp_plan_submit reports it).  dep0 and
 * dep1 are earlier step indices or ZPP_NO_STEP. */
int zpp_plan_kernel(zpp_plan_t *p, zpp_kernel_fn fn, size_t arg, int dep0,
                    int dep1);
/* A transfer step: the descriptor (transport.h) without mem and stream,
 * which are the plan's.  Its arrays must live as long as the plan (in its
 * context). */
int zpp_plan_xfer(zpp_plan_t *p, const zpp_xfer_desc_t *x, int dep0, int dep1);
/* The context of a plan (for collectives that fill it after creation). */
void *zpp_plan_ctx(zpp_plan_t *p);

/* Runs the plan: now on this thread (req NULL and nothing queued, or a
 * stream-ordered backend, where running means enqueueing), or on the
 * communicator's engine thread (req given, or plans queued ahead).  Takes
 * ownership of p in every case.  req: a started collective that completes
 * when the engine ran it (host) and the work on the stream is done (device:
 * an event recorded after the last step). */
zpp_status_t zpp_plan_submit(zpp_plan_t *p, zpp_request_t *req);

/* For kernel steps that run long (encode or decode of many slices): tests
 * the transfers of the running plan that are in flight, so they keep
 * moving while the step computes (MPI moves a large message only while
 * both sides poll).  Call it between pieces of work; it never blocks.
 * No-op outside a kernel step. */
void zpp_plan_poll(void);

/* Frees a plan that will not be submitted (runs release). */
void zpp_plan_discard(zpp_plan_t *p);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ENGINE_PLAN_H */
