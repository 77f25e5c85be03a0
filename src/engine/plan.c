/*
 * Building plans: steps, dependencies, the plan's context and release.
 */
#include "engine/engine_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"

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
  zpp_step_t *s;
  if (p->oom)
    return ZPP_NO_STEP;
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    zpp_step_t *q = (zpp_step_t *)realloc(p->steps, (size_t)cap * sizeof *q);
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

void zpp_engine_plan_free(zpp_plan_t *p) {
  int i;
  for (i = 0; i < p->n; i++)
    if (p->steps[i].op != NULL)
      zpp_xop_free(p->steps[i].op);
  if (p->release != NULL)
    p->release(p->ctx);
  zpp_engine_event_destroy(p->in_event);
  free(p->steps);
  free(p);
}

void zpp_plan_discard(zpp_plan_t *p) {
  if (p != NULL)
    zpp_engine_plan_free(p);
}
