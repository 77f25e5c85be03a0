/*
 * Memory-space dispatch of the kernels the collectives use: host memory
 * runs the CPU quantizer and element-wise loops; device memory enqueues the
 * CUDA kernels on the collective's stream.
 */
#include "coll_internal.h"
#include "elementwise.h"
#include "internal.h"
#include "quant_math.h"
#include "transform.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

zpp_status_t zpp_exec_init(const char *func, zpp_comm_t comm, void *stream,
                           zpp_exec_t *ex) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "comm is NULL");
  ex->comm = comm;
  ex->t = zpp_comm_transport(comm);
  ZPP_CHECK(zpp_comm_memory(comm, &ex->mem));
  ex->stream = stream;
  return ZPP_OK;
}

size_t zpp_coll_encoded_size(const zpp_quant_config_t *q, size_t count) {
  size_t b = 0;
  if (zpp_quant_encoded_size(q, count, &b) != ZPP_OK)
    return 0;
  return b;
}

#if ZPP_HAVE_CUDA_KERNELS
#define DEVICE_CALL(func, call)                                                \
  do {                                                                         \
    char err_[256];                                                            \
    if ((call) != 0)                                                           \
      return zpp_error(ZPP_ERR_CUDA, func, "%s", err_);                        \
  } while (0)
#define DEVICE_ERRBUF err_, sizeof err_
#endif

#if !ZPP_HAVE_CUDA_KERNELS
static zpp_status_t no_device(const char *func) {
  return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                   "device memory needs zpp built with CUDA kernels");
}
#endif

/* ---- host scratch cache --------------------------------------------------
 * Collectives need large scratch buffers on every call (a qwZ all-gather of
 * 16 MiB per rank over 8 ranks needs ~70 MB).  Freshly malloc'ed memory of
 * that size is mmap'ed and returned to the kernel on free, so every call
 * would pay page faults and zeroing.  Each thread keeps the buffers it
 * freed (up to ZPP_SCRATCH_CACHE_MB) and reuses the smallest that fits;
 * they are released when the thread exits. */

#define CACHE_SLOTS 8
#define CACHE_HDR 64 /* keeps the buffer 64-byte aligned, holds its size */

typedef struct {
  void *p[CACHE_SLOTS]; /* base pointers (header first) */
  size_t cap[CACHE_SLOTS];
  size_t total;
} scratch_cache_t;

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_release(void *v) {
  scratch_cache_t *c = (scratch_cache_t *)v;
  int i;
  for (i = 0; i < CACHE_SLOTS; i++)
    free(c->p[i]);
  free(c);
}

static void cache_init(void) { pthread_key_create(&cache_key, cache_release); }

static scratch_cache_t *cache_get(void) {
  scratch_cache_t *c;
  pthread_once(&cache_once, cache_init);
  c = (scratch_cache_t *)pthread_getspecific(cache_key);
  if (c == NULL) {
    c = (scratch_cache_t *)calloc(1, sizeof *c);
    if (c != NULL && pthread_setspecific(cache_key, c) != 0) {
      free(c);
      c = NULL;
    }
  }
  return c;
}

static void *host_alloc(size_t bytes) {
  scratch_cache_t *c = cache_get();
  int i, best = -1;
  void *base;
  for (i = 0; c != NULL && i < CACHE_SLOTS; i++)
    if (c->p[i] != NULL && c->cap[i] >= bytes &&
        (best < 0 || c->cap[i] < c->cap[best]))
      best = i;
  if (best >= 0) {
    base = c->p[best];
    c->p[best] = NULL;
    c->total -= c->cap[best];
    return (char *)base + CACHE_HDR;
  }
  if (bytes > SIZE_MAX - CACHE_HDR ||
      posix_memalign(&base, CACHE_HDR, bytes + CACHE_HDR) != 0)
    return NULL;
  memcpy(base, &bytes, sizeof bytes);
  return (char *)base + CACHE_HDR;
}

static void host_free(void *p) {
  scratch_cache_t *c = cache_get();
  void *base = (char *)p - CACHE_HDR;
  size_t cap, limit = (size_t)zpp_setting_long("ZPP_SCRATCH_CACHE_MB", 512)
                      << 20;
  int i, slot = -1;
  memcpy(&cap, base, sizeof cap);
  for (i = 0; c != NULL && i < CACHE_SLOTS && slot < 0; i++)
    if (c->p[i] == NULL)
      slot = i;
  if (c == NULL || slot < 0 || cap > limit) {
    free(base);
    return;
  }
  /* make room under the limit by dropping the smallest buffers */
  while (c->total + cap > limit) {
    int small = -1;
    for (i = 0; i < CACHE_SLOTS; i++)
      if (c->p[i] != NULL && (small < 0 || c->cap[i] < c->cap[small]))
        small = i;
    if (small < 0)
      break;
    free(c->p[small]);
    c->p[small] = NULL;
    c->total -= c->cap[small];
  }
  c->p[slot] = base;
  c->cap[slot] = cap;
  c->total += cap;
}

zpp_status_t zpp_k_alloc(const zpp_exec_t *ex, size_t bytes, void **p) {
  *p = NULL;
  if (bytes == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    *p = host_alloc(bytes);
    if (*p == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                       "scratch of %zu bytes", bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_alloc_device(bytes, p, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

void zpp_k_free(const zpp_exec_t *ex, void *p) {
  if (p == NULL)
    return;
  if (ex->mem == ZPP_MEMORY_HOST)
    host_free(p);
#if ZPP_HAVE_CUDA_KERNELS
  else
    zpp_ew_free_device(p, ex->stream);
#endif
}

zpp_status_t zpp_k_copy(const zpp_exec_t *ex, void *dst, const void *src,
                        size_t bytes) {
  if (bytes == 0 || dst == src)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    memmove(dst, src, bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_copy_device(dst, src, bytes, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_zero(const zpp_exec_t *ex, void *p, size_t bytes) {
  if (bytes == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    memset(p, 0, bytes);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_zero_device(p, bytes, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_encode(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                          zpp_dtype_t dtype, const void *src, size_t count,
                          void *dst) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_encode(q, dtype, src, count, dst, bytes);
  return zpp_quant_encode_device(q, dtype, src, count, dst, bytes, ex->stream);
}

zpp_status_t zpp_k_decode(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                          const void *src, size_t count, zpp_dtype_t dtype,
                          void *dst) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_decode(q, src, bytes, count, dtype, dst);
  return zpp_quant_decode_device(q, src, bytes, count, dtype, dst, ex->stream);
}

zpp_status_t zpp_k_decode_acc(const zpp_exec_t *ex,
                              const zpp_quant_config_t *q, const void *src,
                              size_t count, float *acc) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_decode_accumulate(q, src, bytes, count, acc);
  return zpp_quant_decode_accumulate_device(q, src, bytes, count, acc,
                                            ex->stream);
}

zpp_status_t zpp_k_finish(const zpp_exec_t *ex, const float *acc,
                          size_t count, float div, zpp_dtype_t dtype,
                          void *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_finish_host(acc, count, div, (int)dtype, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_finish_device(acc, count, div, (int)dtype, out,
                                             ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_scale(const zpp_exec_t *ex, zpp_dtype_t dtype, void *buf,
                         size_t count, float div) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_scale_host((int)dtype, buf, count, div);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_scale_device((int)dtype, buf, count, div,
                                            ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_add_residual(const zpp_exec_t *ex, zpp_dtype_t dtype,
                                const void *g, const float *res, size_t count,
                                float *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_add_residual_host((int)dtype, g, res, count, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_add_residual_device((int)dtype, g, res, count,
                                                   out, ex->stream,
                                                   DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_update_residual(const zpp_exec_t *ex,
                                   const zpp_quant_config_t *q,
                                   const float *x, const void *enc,
                                   size_t count, float *res) {
  if (count == 0)
    return ZPP_OK;
  ZPP_CHECK(zpp_k_decode(ex, q, enc, count, ZPP_FLOAT32, res));
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_ew_residual_host(x, count, res);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_ew_residual_device(x, count, res, ex->stream,
                                               DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_coll_check_args(const char *func, const zpp_exec_t *ex,
                                 size_t count, int dtype, int op,
                                 const uint64_t *words, int nwords,
                                 zpp_status_t local) {
  enum { NW = 9 }; /* count, dtype, op, 5 config words, local status */
  static const char *names[NW - 1] = {
      "count",         "dtype",         "op",
      "config word 0", "config word 1", "config word 2",
      "config word 3", "config word 4"};
  uint64_t mine[NW];
  uint64_t *all;
  int n, r, i, me;
  zpp_status_t st;
  if (zpp_setting_long("ZPP_CHECK", 0) == 0)
    return local;
  memset(mine, 0, sizeof mine);
  mine[0] = (uint64_t)count;
  mine[1] = (uint64_t)(uint32_t)dtype;
  mine[2] = (uint64_t)(uint32_t)op;
  for (i = 0; i < nwords && i + 3 < NW - 1; i++)
    mine[3 + i] = words[i];
  mine[NW - 1] = (uint64_t)(uint32_t)(-(int)local);
  n = zpp_transport_size(ex->t);
  me = zpp_transport_rank(ex->t);
  all = (uint64_t *)malloc(sizeof mine * (size_t)n);
  if (all == NULL) /* cannot take part: the others time out in the exchange */
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "ZPP_CHECK buffer");
  /* Out of band, host memory, on every backend, not counted. */
  st = zpp_comm_meta_allgather(ex->comm, mine, sizeof mine, all);
  if (st != ZPP_OK) {
    free(all);
    return st;
  }
  /* A rank whose own checks failed makes every rank fail, after the
   * exchange, so no rank goes on into a collective the others skip. */
  for (r = 0; r < n; r++) {
    uint64_t bad = all[(size_t)r * NW + NW - 1];
    if (bad != 0) {
      free(all);
      if (local != ZPP_OK)
        return local; /* this rank's own message stands */
      return zpp_error(ZPP_ERR_MISMATCH, func,
                       "ZPP_CHECK: rank %d failed its argument checks "
                       "(%s); this is rank %d",
                       r, zpp_status_string((zpp_status_t)(-(int64_t)bad)),
                       me);
    }
  }
  for (r = 0; r < n; r++) {
    const uint64_t *w = all + (size_t)r * NW;
    for (i = 0; i < NW - 1; i++) {
      if (w[i] != all[i]) {
        st = zpp_error(ZPP_ERR_MISMATCH, func,
                       "ZPP_CHECK: %s is %llu on rank 0 but %llu on rank %d "
                       "(this is rank %d); all ranks must pass the same",
                       names[i], (unsigned long long)all[i],
                       (unsigned long long)w[i], r, me);
        free(all);
        return st;
      }
    }
  }
  free(all);
  return ZPP_OK;
}

/* ---- argument checks and submission shared by the collectives ---------- */

zpp_status_t zpp_coll_check_dtype(const char *func, zpp_dtype_t dtype) {
  if (zpp_dtype_size(dtype) == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "dtype %d: must be ZPP_FLOAT32, ZPP_FLOAT16 or "
                     "ZPP_BFLOAT16",
                     (int)dtype);
  return ZPP_OK;
}

/* count elements per rank: the full buffer (size * count * dtype bytes)
 * must fit size_t; buffers must be non-NULL when there is data. */
zpp_status_t zpp_coll_check_bufs(const char *func, const zpp_exec_t *ex,
                               const void *send, const void *recv,
                               size_t count, zpp_dtype_t dtype) {
  size_t n = (size_t)zpp_transport_size(ex->t);
  size_t ds = zpp_dtype_size(dtype);
  if (count > SIZE_MAX / n / ds)
    return zpp_error(ZPP_ERR_OVERFLOW, func,
                     "count %zu: %zu ranks x count x %zu bytes overflows "
                     "size_t",
                     count, n, ds);
  if (count == 0)
    return ZPP_OK;
  if (send == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "sendbuf is NULL (count %zu)",
                     count);
  if (recv == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "recvbuf is NULL (count %zu)",
                     count);
  return ZPP_OK;
}

zpp_status_t zpp_coll_check_op(const char *func, zpp_redop_t op) {
  if (op != ZPP_OP_SUM && op != ZPP_OP_MEAN)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "op %d: must be ZPP_OP_SUM or ZPP_OP_MEAN", (int)op);
  return ZPP_OK;
}

static void *dup_arg(const void *arg, size_t bytes) {
  void *p = malloc(bytes);
  if (p != NULL)
    memcpy(p, arg, bytes);
  return p;
}

zpp_status_t zpp_coll_submit_copy(const char *func, zpp_comm_t comm, zpp_coll_fn fn,
                           const void *arg, size_t bytes, void *stream,
                           zpp_request_t *req) {
  void *copy = dup_arg(arg, bytes);
  if (copy == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                         "request arguments"));
  return zpp_coll_submit(func, comm, fn, copy, stream, req);
}

/* ---- transforms of issue 14 ---------------------------------------------- */

zpp_status_t zpp_k_encode_at(const zpp_exec_t *ex, const zpp_quant_config_t *q,
                             zpp_dtype_t dtype, const void *src, size_t count,
                             uint64_t index_base, void *dst) {
  size_t bytes = zpp_coll_encoded_size(q, count);
  if (ex->mem == ZPP_MEMORY_HOST)
    return zpp_quant_encode_at(q, dtype, src, count, index_base, dst, bytes);
  return zpp_quant_encode_device_at(q, dtype, src, count, index_base, dst,
                                    bytes, ex->stream);
}

zpp_status_t zpp_k_hadamard(const zpp_exec_t *ex, size_t group,
                            zpp_dtype_t dtype, const void *src, size_t count,
                            float *dst) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_tf_hadamard_host(zpp_quant_cpu_simd(), group, (int)dtype, src, count,
                         dst);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_tf_hadamard_device(group, (int)dtype, src, count,
                                               dst, ex->stream,
                                               DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}

zpp_status_t zpp_k_wdiff(const zpp_exec_t *ex, zpp_dtype_t dtype,
                         const void *recon, const float *target, size_t count,
                         float *out) {
  if (count == 0)
    return ZPP_OK;
  if (ex->mem == ZPP_MEMORY_HOST) {
    zpp_tf_wdiff_host((int)dtype, recon, target, count, out);
    return ZPP_OK;
  }
#if ZPP_HAVE_CUDA_KERNELS
  DEVICE_CALL(__func__, zpp_tf_wdiff_device((int)dtype, recon, target, count,
                                            out, ex->stream, DEVICE_ERRBUF));
  return ZPP_OK;
#else
  return no_device(__func__);
#endif
}
