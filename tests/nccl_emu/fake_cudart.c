/*
 * A minimal CUDA runtime for the NCCL stand-in's own tests, used only
 * where the build has no emulated runtime (ZPP_CUDA_EMU, tests/cuda_emu):
 * the few calls the stand-in and test_nccl_emu make, under the real names
 * and types of cuda_runtime_api.h.
 *
 * Models: ZPP_EMU_DEVICES devices (default 8) with distinct PCI bus ids, a
 * current device per thread, streams that run their work in order on a
 * worker thread each (the NULL stream is one legacy stream per device),
 * host functions, synchronous and asynchronous copies, pointer attributes
 * of cudaMalloc'd and cudaHostAlloc'd memory.  Does not model: kernels, events, protection of
 * device memory from host threads, the legacy stream's implicit
 * synchronisation with other streams, errors of a real device.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_API __attribute__((visibility("default")))
#define FAKE_MAXDEV 64

typedef struct task {
  struct task *next;
  cudaHostFn_t fn;
  void *arg;
  void *dst;
  const void *src;
  size_t len;
} task_t;

struct CUstream_st {
  int dev;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  task_t *head, *tail;
  int busy, stop;
  pthread_t worker;
};

typedef struct alloc {
  struct alloc *next;
  char *p;
  size_t len;
  int dev;
  enum cudaMemoryType type;
} alloc_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_t *g_allocs;
static struct CUstream_st *g_legacy[FAKE_MAXDEV];
static __thread int t_dev;
static __thread cudaError_t t_last;

static int ndev(void) {
  const char *v = getenv("ZPP_EMU_DEVICES");
  int n = v ? atoi(v) : 8;
  return n < 1 ? 1 : n > FAKE_MAXDEV ? FAKE_MAXDEV : n;
}

static cudaError_t fail(cudaError_t e) {
  t_last = e;
  return e;
}

static void *worker(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    task_t *t;
    while (s->head == NULL && !s->stop)
      pthread_cond_wait(&s->cond, &s->lock);
    if (s->head == NULL)
      break;
    t = s->head;
    s->head = t->next;
    if (s->head == NULL)
      s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->lock);
    if (t->fn)
      t->fn(t->arg);
    else
      memcpy(t->dst, t->src, t->len);
    free(t);
    pthread_mutex_lock(&s->lock);
    s->busy = 0;
    pthread_cond_broadcast(&s->cond);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static struct CUstream_st *stream_new(int dev) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  s->dev = dev;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  if (pthread_create(&s->worker, NULL, worker, s) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

static struct CUstream_st *resolve(cudaStream_t s) {
  struct CUstream_st *r;
  if (s != NULL)
    return s;
  pthread_mutex_lock(&g_lock);
  if (g_legacy[t_dev] == NULL)
    g_legacy[t_dev] = stream_new(t_dev);
  r = g_legacy[t_dev];
  pthread_mutex_unlock(&g_lock);
  return r;
}

static cudaError_t enqueue(cudaStream_t st, task_t *t) {
  struct CUstream_st *s = resolve(st);
  if (s == NULL) {
    free(t);
    return fail(cudaErrorMemoryAllocation);
  }
  pthread_mutex_lock(&s->lock);
  if (s->tail)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  return cudaSuccess;
}

static void drain(struct CUstream_st *s) {
  pthread_mutex_lock(&s->lock);
  while (s->head != NULL || s->busy)
    pthread_cond_wait(&s->cond, &s->lock);
  pthread_mutex_unlock(&s->lock);
}

FAKE_API cudaError_t cudaGetDeviceCount(int *n) {
  *n = ndev();
  return cudaSuccess;
}

FAKE_API cudaError_t cudaGetDevice(int *d) {
  *d = t_dev;
  return cudaSuccess;
}

FAKE_API cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= ndev())
    return fail(cudaErrorInvalidDevice);
  t_dev = d;
  return cudaSuccess;
}

FAKE_API cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
  if (d < 0 || d >= ndev())
    return fail(cudaErrorInvalidDevice);
  snprintf(id, (size_t)len, "00000000:%02X:00.0", 0x10 + d);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = stream_new(t_dev);
  return *s ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

FAKE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s,
                                               unsigned int flags) {
  (void)flags; /* the fake's legacy stream never synchronises others */
  return cudaStreamCreate(s);
}

FAKE_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == NULL)
    return fail(cudaErrorInvalidResourceHandle);
  drain(s);
  pthread_mutex_lock(&s->lock);
  s->stop = 1;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->worker, NULL);
  free(s);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  struct CUstream_st *r = resolve(s);
  if (r)
    drain(r);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaStreamQuery(cudaStream_t s) {
  struct CUstream_st *r = resolve(s);
  cudaError_t e;
  pthread_mutex_lock(&r->lock);
  e = (r->head == NULL && !r->busy) ? cudaSuccess : cudaErrorNotReady;
  pthread_mutex_unlock(&r->lock);
  return e;
}

FAKE_API cudaError_t cudaDeviceSynchronize(void) {
  int d;
  for (d = 0; d < FAKE_MAXDEV; d++)
    if (g_legacy[d])
      drain(g_legacy[d]);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn,
                                        void *arg) {
  task_t *t = calloc(1, sizeof *t);
  if (t == NULL)
    return fail(cudaErrorMemoryAllocation);
  t->fn = fn;
  t->arg = arg;
  return enqueue(s, t);
}

FAKE_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                     enum cudaMemcpyKind k, cudaStream_t s) {
  task_t *t = calloc(1, sizeof *t);
  (void)k;
  if (t == NULL)
    return fail(cudaErrorMemoryAllocation);
  t->dst = dst;
  t->src = src;
  t->len = n;
  return enqueue(s, t);
}

FAKE_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                                enum cudaMemcpyKind k) {
  (void)k;
  drain(resolve(NULL));
  memcpy(dst, src, n);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaMemset(void *p, int v, size_t n) {
  drain(resolve(NULL));
  memset(p, v, n);
  return cudaSuccess;
}

static cudaError_t alloc_of(void **p, size_t n, enum cudaMemoryType type) {
  alloc_t *a = calloc(1, sizeof *a);
  if (a == NULL || (a->p = malloc(n ? n : 1)) == NULL) {
    free(a);
    return fail(cudaErrorMemoryAllocation);
  }
  a->len = n;
  a->dev = t_dev;
  a->type = type;
  pthread_mutex_lock(&g_lock);
  a->next = g_allocs;
  g_allocs = a;
  pthread_mutex_unlock(&g_lock);
  *p = a->p;
  return cudaSuccess;
}

static cudaError_t free_of(void *p, enum cudaMemoryType type) {
  alloc_t **pp, *a = NULL;
  if (p == NULL)
    return cudaSuccess;
  pthread_mutex_lock(&g_lock);
  for (pp = &g_allocs; *pp; pp = &(*pp)->next)
    if ((*pp)->p == p && (*pp)->type == type) {
      a = *pp;
      *pp = a->next;
      break;
    }
  pthread_mutex_unlock(&g_lock);
  if (a == NULL)
    return fail(cudaErrorInvalidValue);
  free(a->p);
  free(a);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaMalloc(void **p, size_t n) {
  return alloc_of(p, n, cudaMemoryTypeDevice);
}

FAKE_API cudaError_t cudaFree(void *p) {
  return free_of(p, cudaMemoryTypeDevice);
}

FAKE_API cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  (void)flags;
  return alloc_of(p, n, cudaMemoryTypeHost);
}

FAKE_API cudaError_t cudaFreeHost(void *p) {
  return free_of(p, cudaMemoryTypeHost);
}

FAKE_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at,
                                              const void *p) {
  alloc_t *a;
  memset(at, 0, sizeof *at);
  at->type = cudaMemoryTypeUnregistered;
  at->device = -2;
  pthread_mutex_lock(&g_lock);
  for (a = g_allocs; a; a = a->next)
    if ((const char *)p >= a->p && (const char *)p < a->p + (a->len ? a->len : 1)) {
      at->type = a->type;
      at->device = a->dev;
      at->devicePointer = (void *)p;
      at->hostPointer = a->type == cudaMemoryTypeHost ? (void *)p : NULL;
      break;
    }
  pthread_mutex_unlock(&g_lock);
  return cudaSuccess;
}

FAKE_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

FAKE_API const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotReady: return "device not ready";
  default: break;
  }
  return "fake runtime error";
}
