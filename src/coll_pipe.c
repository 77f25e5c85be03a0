/*
 * A communication thread for pipelined collectives.  The algorithm posts
 * transport operations (closures) in a fixed order; the thread runs them
 * in that order while the posting thread computes (encodes, decodes,
 * accumulates).  Every rank posts the same operations in the same order,
 * so the transport sees the same sequence on every rank.
 *
 * Only host memory is pipelined: on a blocking backend this is what lets
 * the decode and reduce work overlap the transfers.  After a failed
 * operation the remaining ones are not run and report the same error.
 */
#include "coll_internal.h"
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

#define PIPE_MAX 64 /* operations in flight */

typedef struct {
  zpp_coll_fn fn;
  void *arg;
  zpp_status_t status;
  int done;
} pipe_op_t;

struct zpp_pipe {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pipe_op_t ops[PIPE_MAX];
  int posted, next, stop, started;
  zpp_status_t failed;
  char failed_msg[512];
};

static void *pipe_main(void *p) {
  zpp_pipe_t *q = (zpp_pipe_t *)p;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    pipe_op_t *op;
    zpp_status_t st;
    while (q->next == q->posted && !q->stop)
      pthread_cond_wait(&q->cv, &q->mu);
    if (q->next == q->posted)
      break;
    op = &q->ops[q->next % PIPE_MAX];
    if (q->failed == ZPP_OK) {
      pthread_mutex_unlock(&q->mu);
      st = op->fn(op->arg);
      pthread_mutex_lock(&q->mu);
      if (st != ZPP_OK && q->failed == ZPP_OK) {
        q->failed = st;
        snprintf(q->failed_msg, sizeof q->failed_msg, "%s",
                 zpp_get_last_error());
      }
    } else {
      st = q->failed;
    }
    op->status = st;
    op->done = 1;
    q->next++;
    pthread_cond_broadcast(&q->cv);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

zpp_status_t zpp_pipe_start(const char *func, zpp_pipe_t **out) {
  zpp_pipe_t *q = (zpp_pipe_t *)calloc(1, sizeof *q);
  if (q == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "pipeline state");
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  if (pthread_create(&q->thread, NULL, pipe_main, q) != 0) {
    free(q);
    return zpp_error(ZPP_ERR_SYSTEM, func, "pthread_create failed");
  }
  q->started = 1;
  *out = q;
  return ZPP_OK;
}

int zpp_pipe_post(zpp_pipe_t *q, zpp_coll_fn fn, void *arg) {
  int ticket;
  pthread_mutex_lock(&q->mu);
  /* keep at most PIPE_MAX operations not yet collected by a wait */
  while (q->posted - q->next >= PIPE_MAX)
    pthread_cond_wait(&q->cv, &q->mu);
  ticket = q->posted;
  q->ops[ticket % PIPE_MAX].fn = fn;
  q->ops[ticket % PIPE_MAX].arg = arg;
  q->ops[ticket % PIPE_MAX].done = 0;
  q->posted++;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return ticket;
}

zpp_status_t zpp_pipe_wait(zpp_pipe_t *q, int ticket) {
  zpp_status_t st;
  pthread_mutex_lock(&q->mu);
  while (q->next <= ticket)
    pthread_cond_wait(&q->cv, &q->mu);
  st = q->failed;
  pthread_mutex_unlock(&q->mu);
  if (st != ZPP_OK) /* the error message of the failed operation */
    return zpp_error(st, "pipeline", "%s", q->failed_msg);
  return ZPP_OK;
}

zpp_status_t zpp_pipe_finish(zpp_pipe_t *q) {
  zpp_status_t st;
  if (q == NULL)
    return ZPP_OK;
  pthread_mutex_lock(&q->mu);
  q->stop = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  pthread_join(q->thread, NULL);
  st = q->failed;
  if (st != ZPP_OK)
    zpp_error(st, "pipeline", "%s", q->failed_msg);
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  free(q);
  return st;
}

/* Chunk length: whole blocks, about count / 8 and at least
 * ZPP_PIPE_MIN_CHUNK elements; count itself (no pipelining) when that
 * setting is 0 or the data fits one chunk. */
size_t zpp_pipe_chunk(size_t count, size_t block) {
  long min = zpp_setting_long("ZPP_PIPE_MIN_CHUNK", 65536);
  size_t target = count / 8, nblk;
  if (min <= 0)
    return count;
  if (target < (size_t)min)
    target = (size_t)min;
  nblk = target / block + (target % block != 0);
  if (nblk > SIZE_MAX / block)
    return count;
  return nblk * block >= count ? count : nblk * block;
}
