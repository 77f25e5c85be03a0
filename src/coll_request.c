/*
 * Requests: start a collective now, wait for it later.
 *
 * Blocking backends (MPI) run started collectives on one progress thread
 * per communicator, in the order they were started, so every rank issues
 * the same transport operations in the same order (two collectives must
 * never interleave their messages).  A blocking call (req NULL) made while
 * requests are queued joins the queue and waits, which keeps that order.
 * Stream-ordered backends (NCCL) enqueue the work on the caller's stream at
 * once; waiting synchronises the stream.
 */
#include "coll_internal.h"
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct zpp_request {
  zpp_coll_fn fn;
  void *arg;
  zpp_transport_t *t;
  void *stream;     /* stream-ordered: wait synchronises it */
  int stream_ordered;
  int done;
  int ran_on_worker;
  zpp_status_t status;
  char msg[512]; /* the worker thread's error message, for the waiter */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct zpp_request *next; /* queue link */
};

typedef struct worker {
  zpp_comm_t comm;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct zpp_request *head, *tail;
  int stop;
  struct worker *next;
} worker_t;

static pthread_mutex_t workers_mu = PTHREAD_MUTEX_INITIALIZER;
static worker_t *workers;

static void complete(struct zpp_request *r, zpp_status_t st) {
  pthread_mutex_lock(&r->mu);
  r->status = st;
  r->done = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

static void *worker_main(void *p) {
  worker_t *w = (worker_t *)p;
  for (;;) {
    struct zpp_request *r;
    zpp_status_t st;
    pthread_mutex_lock(&w->mu);
    while (w->head == NULL && !w->stop)
      pthread_cond_wait(&w->cv, &w->mu);
    if (w->head == NULL) {
      pthread_mutex_unlock(&w->mu);
      return NULL;
    }
    r = w->head;
    w->head = r->next;
    if (w->head == NULL)
      w->tail = NULL;
    pthread_mutex_unlock(&w->mu);
    st = r->fn(r->arg);
    free(r->arg);
    r->arg = NULL;
    /* zpp_error is thread-local: carry the message to the waiting thread */
    if (st != ZPP_OK)
      snprintf(r->msg, sizeof r->msg, "%s", zpp_get_last_error());
    complete(r, st);
  }
}

/* The worker of comm, started on first use. */
static zpp_status_t get_worker(const char *func, zpp_comm_t comm,
                               worker_t **out) {
  worker_t *w;
  pthread_mutex_lock(&workers_mu);
  for (w = workers; w != NULL; w = w->next)
    if (w->comm == comm)
      break;
  if (w == NULL) {
    w = (worker_t *)calloc(1, sizeof *w);
    if (w == NULL) {
      pthread_mutex_unlock(&workers_mu);
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "progress thread state");
    }
    w->comm = comm;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      pthread_mutex_unlock(&workers_mu);
      free(w);
      return zpp_error(ZPP_ERR_SYSTEM, func, "pthread_create failed");
    }
    w->next = workers;
    workers = w;
    zpp_comm_set_before_destroy(comm, zpp_coll_comm_release);
  }
  pthread_mutex_unlock(&workers_mu);
  *out = w;
  return ZPP_OK;
}

static worker_t *find_worker(zpp_comm_t comm) {
  worker_t *w;
  pthread_mutex_lock(&workers_mu);
  for (w = workers; w != NULL && w->comm != comm; w = w->next) {
  }
  pthread_mutex_unlock(&workers_mu);
  return w;
}

static struct zpp_request *new_request(zpp_coll_fn fn, void *arg,
                                       zpp_transport_t *t, void *stream) {
  struct zpp_request *r = (struct zpp_request *)calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  r->fn = fn;
  r->arg = arg;
  r->t = t;
  r->stream = stream;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  return r;
}

static void free_request(struct zpp_request *r) {
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r->arg);
  free(r);
}

static zpp_status_t wait_done(struct zpp_request *r) {
  zpp_status_t st;
  pthread_mutex_lock(&r->mu);
  while (!r->done)
    pthread_cond_wait(&r->cv, &r->mu);
  st = r->status;
  pthread_mutex_unlock(&r->mu);
  if (st != ZPP_OK && r->ran_on_worker) {
    /* the message on this thread and on the communicator */
    zpp_error(st, "zpp_request_wait", "%s", r->msg);
    return zpp_transport_fail(r->t, st);
  }
  if (st == ZPP_OK && r->stream_ordered)
    st = zpp_transport_sync(r->t, r->stream);
  return st;
}

zpp_status_t zpp_coll_submit(const char *func, zpp_comm_t comm,
                             zpp_coll_fn fn, void *arg, void *stream,
                             zpp_request_t *req) {
  zpp_transport_t *t = zpp_comm_transport(comm);
  int stream_ordered = zpp_transport_backend(t) == ZPP_BACKEND_NCCL;
  struct zpp_request *r;
  worker_t *w = NULL;
  zpp_status_t st;

  /* Run now when the work is stream-ordered, when nothing is queued ahead
   * of a blocking call, or when MPI does not allow a progress thread (the
   * request then completes at once, as <zpp/zpp_coll.h> says). */
  if (stream_ordered || (req == NULL && find_worker(comm) == NULL) ||
      !(zpp_comm_thread_caps(comm) & ZPP_THREADS_PROGRESS)) {
    /* Enqueue on the stream, or run on this thread: nothing is queued
     * ahead of us, so the order of operations is kept. */
    st = fn(arg);
    free(arg);
    if (st == ZPP_OK && stream_ordered && req == NULL)
      st = zpp_transport_sync(t, stream);
    if (st != ZPP_OK)
      return zpp_comm_fail(comm, st);
    if (req != NULL) {
      r = new_request(NULL, NULL, t, stream);
      if (r == NULL)
        return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "request");
      r->stream_ordered = stream_ordered;
      r->done = 1;
      r->status = ZPP_OK;
      *req = r;
    }
    return ZPP_OK;
  }

  r = new_request(fn, arg, t, stream);
  if (r == NULL) {
    free(arg);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "request");
  }
  r->ran_on_worker = 1;
  st = get_worker(func, comm, &w);
  if (st != ZPP_OK) {
    free_request(r);
    return st;
  }
  pthread_mutex_lock(&w->mu);
  if (w->tail != NULL)
    w->tail->next = r;
  else
    w->head = r;
  w->tail = r;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (req != NULL) {
    *req = r;
    return ZPP_OK;
  }
  st = wait_done(r); /* on error: message already on comm and thread */
  free_request(r);
  return st;
}

zpp_status_t zpp_request_wait(zpp_request_t req) {
  zpp_status_t st;
  if (req == NULL)
    return ZPP_OK;
  st = wait_done(req);
  free_request(req);
  return st;
}

zpp_status_t zpp_request_test(zpp_request_t req, int *done) {
  if (req == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "req is NULL");
  if (done == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "done is NULL");
  pthread_mutex_lock(&req->mu);
  *done = req->done;
  pthread_mutex_unlock(&req->mu);
  return ZPP_OK;
}

void zpp_coll_comm_release(zpp_comm_t comm) {
  worker_t **pp, *w = NULL;
  pthread_mutex_lock(&workers_mu);
  for (pp = &workers; *pp != NULL; pp = &(*pp)->next) {
    if ((*pp)->comm == comm) {
      w = *pp;
      *pp = w->next;
      break;
    }
  }
  pthread_mutex_unlock(&workers_mu);
  if (w == NULL)
    return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}
