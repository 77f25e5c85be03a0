/*
 * The NCCL stand-in's operations: argument checks on the caller's thread,
 * groups, and per stream a sequence of work that moves the bytes when the
 * stream reaches it.
 *
 * A host function may neither call CUDA nor touch device memory (the
 * emulated runtime enforces both, as the real one forbids the first and
 * faults on the second), so a batch (one call, or every call of a group on
 * one stream) is enqueued as:
 *   1. cudaMemcpyAsync of every input from device memory into pinned host
 *      staging buffers;
 *   2. a host function that exchanges and reduces the staged bytes, in two
 *      phases: first every send of every operation (the blocks of a
 *      collective, ncclSend payloads, and a "clear to send" for every
 *      ncclRecv), then every receive;
 *   3. cudaMemcpyAsync of every result from staging into device memory;
 *   4. a host function that returns the staging buffers and completes the
 *      batch.
 * Sends never wait for the peer's stream (its receiver thread drains
 * them), so a group of sends and receives in any pattern completes, and an
 * ungrouped ncclSend waits for the matching ncclRecv to be posted, as
 * NCCL's does.
 *
 * Reductions follow a ring reduce-scatter over the ranks in rank order
 * (see nccl_emu.c): shard i = x[i+1] + x[i+2] + ... + x[i], each addition
 * rounded to the data type; fp16 and bf16 additions are computed exactly
 * in double and rounded once to the type, which is what a correctly
 * rounded fp16/bf16 add (the GPU's __hadd) gives.
 */
#include "nccl_emu_internal.h"

#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_ALLGATHER, OP_REDUCE_SCATTER, OP_SEND, OP_RECV };

/* A pinned host buffer; kept in one pool for the life of the process,
 * since a host function (where the last reference to a communicator may
 * go) cannot give it back to CUDA. */
typedef struct emu_stage {
  struct emu_stage *next;
  unsigned char *p;
  size_t cap;
} emu_stage_t;

typedef struct {
  int kind;
  emu_comm_t *c; /* holds a reference */
  emu_stage_t *in, *out; /* staged input and result (NULL: none) */
  const void *sbuf;
  void *rbuf;
  size_t count; /* elements: per rank (allgather), per shard (reduce-scatter) */
  ncclDataType_t dt;
  ncclRedOp_t op;
  int peer;
  uint64_t tag;
  cudaStream_t stream;
  ncclResult_t result;
} emu_op_t;

typedef struct {
  int n;
  emu_op_t *ops;
} emu_batch_t;

static const char *op_name(int kind) {
  switch (kind) {
  case OP_ALLGATHER: return "ncclAllGather";
  case OP_REDUCE_SCATTER: return "ncclReduceScatter";
  case OP_SEND: return "ncclSend";
  case OP_RECV: return "ncclRecv";
  }
  return "?";
}

size_t emu_dtype_size(ncclDataType_t dt) {
  switch (dt) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: break;
  }
  return 0;
}

/* ---- fp16 / bf16 ------------------------------------------------------------ */

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp((double)m, -24);
  else
    v = ldexp((double)(m | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* x rounded to nearest-even in a binary format with p significand bits,
 * smallest normal exponent emin and largest exponent emax. */
static double round_to_format(double x, int p, int emin, int emax) {
  int e;
  double q, r;
  if (isnan(x) || isinf(x) || x == 0)
    return x;
  frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
  e -= 1;
  if (e < emin)
    e = emin; /* subnormal range: a fixed quantum */
  q = ldexp(1.0, e - (p - 1));
  r = nearbyint(x / q) * q; /* x / q is exact: q is a power of two */
  if (fabs(r) > ldexp(2.0 - ldexp(1.0, 1 - p), emax))
    return copysign(INFINITY, x);
  return r;
}

static uint16_t double_to_half(double x) {
  double r = round_to_format(x, 11, -14, 15), a;
  uint16_t s = signbit(r) ? 0x8000 : 0;
  int e;
  if (isnan(r))
    return 0x7fff; /* the canonical NaN of the GPU's half arithmetic */
  a = fabs(r);
  if (isinf(a))
    return s | 0x7c00;
  if (a < ldexp(1.0, -14))
    return s | (uint16_t)ldexp(a, 24); /* subnormal or zero */
  frexp(a, &e);
  e -= 1;
  return s | (uint16_t)((e + 15) << 10) |
         (uint16_t)(ldexp(a, -e) * 1024.0 - 1024.0);
}

static uint16_t double_to_bf16(double x) {
  double r = round_to_format(x, 8, -126, 127);
  float f = (float)r; /* exact: r is representable in bf16, so in fp32 */
  uint32_t u;
  if (isnan(r))
    return 0x7fff;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

/* ---- reductions ------------------------------------------------------------------ */

static double combine_d(double a, double b, ncclRedOp_t op) {
  switch (op) {
  case ncclProd: return a * b;
  case ncclMax: return (isnan(a) || a > b) ? a : b;
  case ncclMin: return (isnan(a) || a < b) ? a : b;
  default: return a + b;
  }
}

static float combine_f(float a, float b, ncclRedOp_t op) {
  switch (op) {
  case ncclProd: return a * b;
  case ncclMax: return (isnan(a) || a > b) ? a : b;
  case ncclMin: return (isnan(a) || a < b) ? a : b;
  default: return a + b;
  }
}

#define EMU_INT_COMBINE(T, a, b, op)                                           \
  ((op) == ncclProd  ? (T)((a) * (b))                                          \
   : (op) == ncclMax ? ((a) > (b) ? (a) : (b))                                 \
   : (op) == ncclMin ? ((a) < (b) ? (a) : (b))                                 \
                     : (T)((a) + (b)))

/* out[e] = contrib[o[0]][e] op contrib[o[1]][e] op ... in the order o,
 * rounding to dt after every step. */
static void reduce_in_order(const unsigned char *const *contrib, const int *o,
                            int n, void *out, size_t count, ncclDataType_t dt,
                            ncclRedOp_t op) {
  size_t e;
  int k;
#define EMU_REDUCE_INT(T, UT)                                                  \
  for (e = 0; e < count; e++) {                                                \
    UT acc;                                                                    \
    memcpy(&acc, contrib[o[0]] + e * sizeof(T), sizeof acc);                   \
    for (k = 1; k < n; k++) {                                                  \
      UT v;                                                                    \
      memcpy(&v, contrib[o[k]] + e * sizeof(T), sizeof v);                     \
      if (op == ncclMax || op == ncclMin) {                                    \
        T sa, sv;                                                              \
        memcpy(&sa, &acc, sizeof sa);                                          \
        memcpy(&sv, &v, sizeof sv);                                            \
        sa = EMU_INT_COMBINE(T, sa, sv, op);                                   \
        memcpy(&acc, &sa, sizeof acc);                                         \
      } else {                                                                 \
        acc = EMU_INT_COMBINE(UT, acc, v, op); /* wraps, as on the GPU */      \
      }                                                                        \
    }                                                                          \
    memcpy((unsigned char *)out + e * sizeof(T), &acc, sizeof acc);            \
  }
  switch (dt) {
  case ncclInt8: EMU_REDUCE_INT(int8_t, uint8_t) break;
  case ncclUint8: EMU_REDUCE_INT(uint8_t, uint8_t) break;
  case ncclInt32: EMU_REDUCE_INT(int32_t, uint32_t) break;
  case ncclUint32: EMU_REDUCE_INT(uint32_t, uint32_t) break;
  case ncclInt64: EMU_REDUCE_INT(int64_t, uint64_t) break;
  case ncclUint64: EMU_REDUCE_INT(uint64_t, uint64_t) break;
  case ncclFloat32:
    for (e = 0; e < count; e++) {
      float acc, v;
      memcpy(&acc, contrib[o[0]] + e * 4, 4);
      for (k = 1; k < n; k++) {
        memcpy(&v, contrib[o[k]] + e * 4, 4);
        acc = combine_f(acc, v, op);
      }
      memcpy((unsigned char *)out + e * 4, &acc, 4);
    }
    break;
  case ncclFloat64:
    for (e = 0; e < count; e++) {
      double acc, v;
      memcpy(&acc, contrib[o[0]] + e * 8, 8);
      for (k = 1; k < n; k++) {
        memcpy(&v, contrib[o[k]] + e * 8, 8);
        acc = combine_d(acc, v, op);
      }
      memcpy((unsigned char *)out + e * 8, &acc, 8);
    }
    break;
  case ncclFloat16:
  case ncclBfloat16: {
    int half = dt == ncclFloat16;
    for (e = 0; e < count; e++) {
      uint16_t b, r;
      double acc;
      memcpy(&b, contrib[o[0]] + e * 2, 2);
      acc = half ? half_to_double(b) : bf16_to_double(b);
      r = b;
      for (k = 1; k < n; k++) {
        double v;
        memcpy(&b, contrib[o[k]] + e * 2, 2);
        v = half ? half_to_double(b) : bf16_to_double(b);
        /* exact in double, then one rounding to the type: a correctly
         * rounded fp16/bf16 operation */
        r = half ? double_to_half(combine_d(acc, v, op))
                 : double_to_bf16(combine_d(acc, v, op));
        acc = half ? half_to_double(r) : bf16_to_double(r);
      }
      memcpy((unsigned char *)out + e * 2, &r, 2);
    }
    break;
  }
  default: break;
  }
#undef EMU_REDUCE_INT
}

/* ---- staging ------------------------------------------------------------------- */

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static emu_stage_t *pool;

/* The smallest free buffer of at least `len` bytes, else a new one (on the
 * caller's thread: cudaHostAlloc is not allowed in a host function). */
static emu_stage_t *stage_get(size_t len) {
  emu_stage_t **pp, **best = NULL, *s;
  size_t cap = 4096;
  pthread_mutex_lock(&pool_lock);
  for (pp = &pool; *pp != NULL; pp = &(*pp)->next)
    if ((*pp)->cap >= len && (best == NULL || (*pp)->cap < (*best)->cap))
      best = pp;
  if (best != NULL) {
    s = *best;
    *best = s->next;
    pthread_mutex_unlock(&pool_lock);
    s->next = NULL;
    return s;
  }
  pthread_mutex_unlock(&pool_lock);
  while (cap < len)
    cap *= 2;
  s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  if (cudaHostAlloc((void **)&s->p, cap, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    free(s);
    return NULL;
  }
  s->cap = cap;
  return s;
}

static void stage_put(emu_stage_t *s) {
  if (s == NULL)
    return;
  pthread_mutex_lock(&pool_lock);
  s->next = pool;
  pool = s;
  pthread_mutex_unlock(&pool_lock);
}

/* Bytes of device input and result each operation stages. */
static void stage_sizes(const emu_op_t *o, size_t *in, size_t *out) {
  size_t bytes = o->count * emu_dtype_size(o->dt), n = (size_t)o->c->nranks;
  *in = *out = 0;
  switch (o->kind) {
  case OP_ALLGATHER: *in = bytes; *out = n * bytes; break;
  case OP_REDUCE_SCATTER: *in = n * bytes; *out = bytes; break;
  case OP_SEND: *in = bytes; break;
  case OP_RECV: *out = bytes; break;
  }
}

/* ---- the host functions ------------------------------------------------------------ */

static void op_fail(emu_op_t *o, ncclResult_t r) {
  if (o->result == ncclSuccess)
    o->result = r;
}

/* Phase 1: everything this operation sends, from its staged input. */
static void op_post(emu_op_t *o) {
  emu_comm_t *c = o->c;
  size_t es = emu_dtype_size(o->dt), bytes = o->count * es;
  int n = c->nranks, me = c->rank, i;
  ncclResult_t r;
  /* A failed or aborted communicator runs nothing more: its peers must
   * not see half of an operation (NCCL's errors are fatal too). */
  pthread_mutex_lock(&c->lock);
  r = c->aborted ? ncclInvalidUsage : c->async;
  pthread_mutex_unlock(&c->lock);
  if (r != ncclSuccess) {
    op_fail(o, r);
    return;
  }
  switch (o->kind) {
  case OP_ALLGATHER:
    for (i = 1; i < n && r == ncclSuccess; i++)
      r = emu_send(c, (me + i) % n, EMU_MSG_COLL, o->tag, o->in->p, bytes);
    break;
  case OP_REDUCE_SCATTER:
    for (i = 1; i < n && r == ncclSuccess; i++) {
      int to = (me + i) % n;
      r = emu_send(c, to, EMU_MSG_COLL, o->tag, o->in->p + (size_t)to * bytes,
                   bytes);
    }
    break;
  case OP_SEND:
    r = emu_send(c, o->peer, EMU_MSG_P2P, o->tag, o->in->p, bytes);
    break;
  case OP_RECV:
    r = emu_send(c, o->peer, EMU_MSG_CTS, o->tag, NULL, 0);
    break;
  }
  op_fail(o, r);
}

static ncclResult_t check_len(emu_op_t *o, const emu_msg_t *m, size_t want,
                              int from) {
  if (m->len == want)
    return ncclSuccess;
  emu_set_async(o->c, ncclInvalidUsage,
                "%s: rank %d sent %zu bytes but rank %d expects %zu (counts "
                "or types differ between the ranks)",
                op_name(o->kind), from, m->len, o->c->rank, want);
  return ncclInvalidUsage;
}

/* Phase 2: everything this operation receives, into its staged result. */
static void op_finish(emu_op_t *o, int64_t deadline) {
  emu_comm_t *c = o->c;
  size_t es = emu_dtype_size(o->dt), bytes = o->count * es;
  int n = c->nranks, me = c->rank, i;
  ncclResult_t r = ncclSuccess;
  emu_msg_t *m = NULL;
  if (o->result != ncclSuccess)
    return;
  switch (o->kind) {
  case OP_ALLGATHER: {
    unsigned char *out = o->out->p;
    memcpy(out + (size_t)me * bytes, o->in->p, bytes);
    for (i = 1; i < n && r == ncclSuccess; i++) {
      int from = (me - i + n) % n;
      r = emu_take(c, from, EMU_MSG_COLL, o->tag, deadline, &m);
      if (r == ncclSuccess)
        r = check_len(o, m, bytes, from);
      if (r == ncclSuccess)
        memcpy(out + (size_t)from * bytes, m->data, bytes);
      emu_msg_free(m);
      m = NULL;
    }
    break;
  }
  case OP_REDUCE_SCATTER: {
    const unsigned char **contrib = calloc((size_t)n, sizeof *contrib);
    emu_msg_t **msgs = calloc((size_t)n, sizeof *msgs);
    int *order = calloc((size_t)n, sizeof *order);
    if (contrib == NULL || msgs == NULL || order == NULL) {
      emu_set_async(c, ncclSystemError, "stand-in: out of host memory");
      r = ncclSystemError;
    }
    for (i = 1; i < n && r == ncclSuccess; i++) {
      int from = (me - i + n) % n;
      r = emu_take(c, from, EMU_MSG_COLL, o->tag, deadline, &msgs[from]);
      if (r == ncclSuccess)
        r = check_len(o, msgs[from], bytes, from);
      if (r == ncclSuccess)
        contrib[from] = msgs[from]->data;
    }
    if (r == ncclSuccess) {
      contrib[me] = o->in->p + (size_t)me * bytes;
      /* The ring: my shard starts at my successor and ends with me. */
      for (i = 0; i < n; i++)
        order[i] = (me + 1 + i) % n;
      reduce_in_order(contrib, order, n, o->out->p, o->count, o->dt, o->op);
    }
    for (i = 0; msgs != NULL && i < n; i++)
      emu_msg_free(msgs[i]);
    free(msgs);
    free(contrib);
    free(order);
    break;
  }
  case OP_SEND:
    /* Complete once the peer posted the matching receive. */
    r = emu_take(c, o->peer, EMU_MSG_CTS, o->tag, deadline, &m);
    emu_msg_free(m);
    break;
  case OP_RECV:
    r = emu_take(c, o->peer, EMU_MSG_P2P, o->tag, deadline, &m);
    if (r == ncclSuccess)
      r = check_len(o, m, bytes, o->peer);
    if (r == ncclSuccess && bytes > 0)
      memcpy(o->out->p, m->data, bytes);
    emu_msg_free(m);
    break;
  }
  op_fail(o, r);
}

/* Gives back what the operations hold: staging, the pending count (when
 * they were counted) and their communicator references. */
static void release_ops(emu_op_t *ops, int n, int counted) {
  int i;
  for (i = 0; i < n; i++) {
    emu_comm_t *c = ops[i].c;
    stage_put(ops[i].in);
    stage_put(ops[i].out);
    ops[i].in = ops[i].out = NULL;
    if (counted) {
      pthread_mutex_lock(&c->lock);
      c->pending--;
      pthread_cond_broadcast(&c->cond);
      pthread_mutex_unlock(&c->lock);
    }
    emu_unref(c);
  }
}

static void run_batch(void *arg) {
  emu_batch_t *b = arg;
  int64_t deadline = emu_deadline();
  int i;
  for (i = 0; i < b->n; i++)
    op_post(&b->ops[i]);
  for (i = 0; i < b->n; i++)
    op_finish(&b->ops[i], deadline);
}

static void end_batch(void *arg) {
  emu_batch_t *b = arg;
  release_ops(b->ops, b->n, 1);
  free(b->ops);
  free(b);
}

/* ---- groups and launch ---------------------------------------------------------- */

static __thread int g_depth;
static __thread ncclResult_t g_err;
static __thread emu_op_t *g_ops;
static __thread int g_n, g_cap;

/* Enqueues steps 1-4 of one stream's batch.  *kept: the batch owns the
 * operations (always on success); else the caller still does. */
/* 1 on the stand-in's issuer thread (issuer_main). */
static _Thread_local int t_issuer;

static ncclResult_t launch_stream(emu_op_t *ops, int n, int *kept) {
  emu_batch_t *b = calloc(1, sizeof *b);
  int prev = -1, dev = ops[0].c->dev, i, step = 0;
  cudaStream_t st = ops[0].stream;
  cudaError_t e = cudaSuccess;
  *kept = 0;
  for (i = 1; i < n; i++)
    if (ops[i].c->dev != dev) {
      free(b);
      return emu_fail(ncclInvalidUsage,
                      "ncclGroupEnd: one stream carries operations of "
                      "communicators on devices %d and %d",
                      dev, ops[i].c->dev);
    }
  if (b == NULL || (b->ops = calloc((size_t)n, sizeof *ops)) == NULL) {
    free(b);
    return emu_fail(ncclSystemError, "stand-in: out of host memory");
  }
  /* The communicator's device first, as NCCL makes it current: a CUDA
   * call (the staging allocations below) on a thread that never chose a
   * device would make a context on device 0. */
  cudaGetDevice(&prev);
  if (prev != dev)
    cudaSetDevice(dev);
  for (i = 0; i < n; i++) {
    size_t in, out;
    stage_sizes(&ops[i], &in, &out);
    ops[i].in = in ? stage_get(in) : NULL;
    ops[i].out = out ? stage_get(out) : NULL;
    if ((in && ops[i].in == NULL) || (out && ops[i].out == NULL)) {
      for (; i >= 0; i--) {
        stage_put(ops[i].in);
        stage_put(ops[i].out);
        ops[i].in = ops[i].out = NULL;
      }
      free(b->ops);
      free(b);
      if (prev != dev && prev >= 0 && !t_issuer)
        cudaSetDevice(prev);
      return emu_fail(ncclSystemError,
                      "stand-in: cudaHostAlloc of the staging buffers failed");
    }
  }
  /* (The NULL stream means the legacy stream of the communicator's
   * device, current since the top.) */
  for (i = 0; i < n && e == cudaSuccess; i++) {
    size_t in, out;
    stage_sizes(&ops[i], &in, &out);
    if (in) {
      e = cudaMemcpyAsync(ops[i].in->p, ops[i].sbuf, in, cudaMemcpyDeviceToHost,
                          st);
      step += e == cudaSuccess;
    }
  }
  if (e == cudaSuccess) {
    /* From here on the batch is committed: number the operations in call
     * order (every rank issues a communicator's operations in the same
     * order, so the k-th collective, or the k-th send to a peer, meets the
     * k-th on the other side). */
    for (i = 0; i < n; i++) {
      emu_comm_t *c = ops[i].c;
      pthread_mutex_lock(&c->lock);
      if (ops[i].kind == OP_SEND)
        ops[i].tag = ++c->peers[ops[i].peer].send_seq;
      else if (ops[i].kind == OP_RECV)
        ops[i].tag = ++c->peers[ops[i].peer].recv_seq;
      else
        ops[i].tag = ++c->coll_seq;
      c->pending++;
      pthread_mutex_unlock(&c->lock);
    }
    memcpy(b->ops, ops, (size_t)n * sizeof *ops);
    b->n = n;
    e = cudaLaunchHostFunc(st, run_batch, b);
    if (e == cudaSuccess)
      step = -1;
    for (i = 0; i < n && e == cudaSuccess; i++) {
      size_t in, out;
      stage_sizes(&ops[i], &in, &out);
      if (out)
        e = cudaMemcpyAsync(ops[i].rbuf, ops[i].out->p, out,
                            cudaMemcpyHostToDevice, st);
    }
    if (e == cudaSuccess)
      e = cudaLaunchHostFunc(st, end_batch, b);
  }
  /* The issuer thread is the stand-in's own: it keeps the device (as
   * NCCL's threads do); "restoring" the device 0 it never chose would
   * make a context there. */
  if (prev != dev && prev >= 0 && !t_issuer)
    cudaSetDevice(prev);
  if (step == -1)
    *kept = 1;
  if (e == cudaSuccess)
    return ncclSuccess;
  if (step == -1) {
    /* Part of the batch is queued and may run: it cannot be taken back.
     * The communicators fail, and their operations stay counted, so a
     * destroy gives up on them after the timeout. */
    for (i = 0; i < n; i++)
      emu_set_async(ops[i].c, ncclUnhandledCudaError,
                    "%s: a stream call failed after the batch was queued: %s",
                    op_name(ops[i].kind), cudaGetErrorString(e));
    return emu_fail(ncclUnhandledCudaError, "stream call failed: %s",
                    cudaGetErrorString(e));
  }
  /* Only input copies into staging were queued: the staging buffers are
   * left to them (not returned to the pool), the rest is undone. */
  for (i = 0; i < n; i++)
    ops[i].in = ops[i].out = NULL;
  free(b->ops);
  free(b);
  return emu_fail(ncclUnhandledCudaError, "cudaMemcpyAsync: %s",
                  cudaGetErrorString(e));
}

/* One batch per stream, streams in the order they first appear. */
static ncclResult_t launch(emu_op_t *ops, int n) {
  char *done = calloc((size_t)n, 1);
  emu_op_t *part = malloc((size_t)n * sizeof *part);
  ncclResult_t r = ncclSuccess;
  int i, j, kept;
  if (done == NULL || part == NULL) {
    free(done);
    free(part);
    release_ops(ops, n, 0);
    return emu_fail(ncclSystemError, "stand-in: out of host memory");
  }
  for (i = 0; i < n; i++) {
    int k = 0;
    if (done[i])
      continue;
    for (j = i; j < n; j++)
      if (!done[j] && ops[j].stream == ops[i].stream) {
        part[k++] = ops[j];
        done[j] = 1;
      }
    kept = 0;
    if (r == ncclSuccess)
      r = launch_stream(part, k, &kept);
    if (!kept)
      release_ops(part, k, 0);
  }
  free(done);
  free(part);
  return r;
}

static ncclResult_t group_fail(ncclResult_t r) {
  if (g_depth > 0 && g_err == ncclSuccess)
    g_err = r;
  return r;
}

/* ---- issuing: now, or later after returning ncclInProgress -----------------
 * NCCL, on a non-blocking communicator: "If any NCCL function returns
 * ncclInProgress, users must query the communicator state until it becomes
 * ncclSuccess before calling another NCCL function", and "Before the state
 * becomes ncclSuccess, do not issue CUDA kernels on streams used by NCCL".
 * The stand-in hands such a call (a fraction ZPP_NCCL_EMU_INPROGRESS of
 * them, default 0.5, drawn from ZPP_NCCL_EMU_SEED) to its issuer thread,
 * which enqueues it on its streams after a random 0..2 x
 * ZPP_NCCL_EMU_ISSUE_US (default 200) us; until then its communicators
 * answer ncclInProgress and refuse other calls, and its streams do not hold
 * it, so a caller that does not poll sees stale data. */

typedef struct emu_later {
  struct emu_later *next;
  emu_op_t *ops;
  int n;
  int64_t not_before;
} emu_later_t;

static pthread_mutex_t later_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t later_cond = PTHREAD_COND_INITIALIZER;
static emu_later_t *later_head, *later_tail;
static int later_started, later_held;
/* The item the issuer has taken off the queue and is launching (NULL:
 * none); an abort of one of its communicators waits until it is done. */
static emu_later_t *later_busy;

/* Test hook (zpp_nccl_emu.h): while held, nothing handed to the issuer
 * thread is issued. */
EMU_API void zpp_nccl_emu_hold_issue(int hold) {
  pthread_mutex_lock(&later_lock);
  later_held = hold != 0;
  pthread_cond_broadcast(&later_cond);
  pthread_mutex_unlock(&later_lock);
}

static void issued(emu_op_t *ops, int n, ncclResult_t r) {
  int i;
  for (i = 0; i < n; i++) {
    emu_comm_t *c = ops[i].c;
    pthread_mutex_lock(&c->lock);
    if (r != ncclSuccess)
      emu_set_async_locked(c, r,
                           "%s returned ncclInProgress, then failed "
                           "when the stand-in enqueued it",
                           op_name(ops[i].kind));
    c->issuing--;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
  }
}

/* Takes the operations of c out of item l (later_lock held); they are
 * no longer counted as issuing.  Returns how many it took. */
static int later_drop_locked(emu_later_t *l, const emu_comm_t *c,
                             emu_op_t *dropped) {
  int i, k = 0, d = 0;
  for (i = 0; i < l->n; i++) {
    emu_op_t *o = &l->ops[i];
    int aborted;
    pthread_mutex_lock(&o->c->lock);
    aborted = o->c == c || o->c->aborted;
    if (aborted) {
      o->c->issuing--;
      pthread_cond_broadcast(&o->c->cond);
    }
    pthread_mutex_unlock(&o->c->lock);
    if (aborted)
      dropped[d++] = *o;
    else
      l->ops[k++] = *o;
  }
  l->n = k;
  return d;
}

/* The issuer's next item, once its time has come (later_lock held); NULL
 * when the queue is empty or held.  Items are taken off the queue only
 * here, so an abort finds every item not yet launching in the queue. */
static emu_later_t *later_next_locked(int64_t *wait_ns) {
  emu_later_t *l = later_head;
  int64_t now = emu_now_ns();
  *wait_ns = -1;
  if (l == NULL || later_held)
    return NULL;
  if (l->not_before > now) {
    *wait_ns = l->not_before - now;
    return NULL;
  }
  later_head = l->next;
  if (later_head == NULL)
    later_tail = NULL;
  return l;
}

static void *issuer_main(void *arg) {
  (void)arg;
  t_issuer = 1;
  for (;;) {
    emu_later_t *l;
    emu_comm_t **cs;
    emu_op_t *gone;
    int64_t wait_ns;
    int i, ngone;
    pthread_mutex_lock(&later_lock);
    while ((l = later_next_locked(&wait_ns)) == NULL) {
      if (wait_ns < 0) {
        pthread_cond_wait(&later_cond, &later_lock);
      } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)(wait_ns / 1000000000);
        ts.tv_nsec += (long)(wait_ns % 1000000000);
        if (ts.tv_nsec >= 1000000000) {
          ts.tv_sec++;
          ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&later_cond, &later_lock, &ts);
      }
    }
    /* Operations of communicators aborted meanwhile are not issued. */
    gone = malloc((size_t)l->n * sizeof *gone);
    ngone = gone != NULL ? later_drop_locked(l, NULL, gone) : 0;
    later_busy = l;
    pthread_mutex_unlock(&later_lock);
    release_ops(gone, ngone, 0);
    free(gone);
    /* launch() gives the operations' references away: keep the
     * communicators for the bookkeeping after it. */
    cs = malloc((size_t)l->n * sizeof *cs);
    for (i = 0; cs != NULL && i < l->n; i++) {
      cs[i] = l->ops[i].c;
      emu_ref(cs[i]);
    }
    if (l->n == 0) {
      /* every operation was of an aborted communicator */
    } else if (cs == NULL) {
      issued(l->ops, l->n, ncclSystemError);
      release_ops(l->ops, l->n, 0);
    } else {
      ncclResult_t r = launch(l->ops, l->n);
      issued(l->ops, l->n, r); /* reads only ops[i].c, kept alive by cs */
      for (i = 0; i < l->n; i++)
        emu_unref(cs[i]);
    }
    free(cs);
    pthread_mutex_lock(&later_lock);
    later_busy = NULL;
    pthread_cond_broadcast(&later_cond);
    pthread_mutex_unlock(&later_lock);
    free(l->ops);
    free(l);
  }
  return NULL;
}

/* NCCL's abort raises the abort flag, then aborts and joins the
 * communicator's group job (v2.28.9 init.cc:2515-2519 and :377,
 * ncclGroupJobAbort) before it frees it: after ncclCommAbort nothing of c
 * is enqueued any more.
 * Unlinks c's calls that returned ncclInProgress and were not issued, and
 * waits (bounded) while the issuer is enqueueing one of c's. */
void emu_forget_later(emu_comm_t *c) {
  emu_later_t **pp, *gone_items = NULL;
  emu_op_t *gone = NULL;
  int ngone = 0, cap = 0, i;
  int64_t deadline = emu_deadline();
  pthread_mutex_lock(&later_lock);
  later_tail = NULL;
  for (pp = &later_head; *pp != NULL;) {
    emu_later_t *l = *pp;
    int mine = 0;
    for (i = 0; i < l->n; i++)
      mine |= l->ops[i].c == c;
    if (mine) {
      if (ngone + l->n > cap) {
        emu_op_t *g = realloc(gone, (size_t)(ngone + l->n) * sizeof *g);
        if (g == NULL)
          mine = 0; /* out of memory: the issuer drops them instead */
        else {
          gone = g;
          cap = ngone + l->n;
        }
      }
    }
    if (mine)
      ngone += later_drop_locked(l, c, gone + ngone);
    if (l->n == 0) {
      *pp = l->next;
      l->next = gone_items;
      gone_items = l;
    } else {
      later_tail = l;
      pp = &l->next;
    }
  }
  for (;;) {
    int busy = 0;
    struct timespec ts;
    for (i = 0; later_busy != NULL && i < later_busy->n; i++)
      busy |= later_busy->ops[i].c == c;
    if (!busy || emu_now_ns() >= deadline)
      break;
    clock_gettime(CLOCK_REALTIME, &ts); /* later_cond's clock */
    ts.tv_nsec += 10000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&later_cond, &later_lock, &ts);
  }
  pthread_mutex_unlock(&later_lock);
  release_ops(gone, ngone, 0);
  free(gone);
  while (gone_items != NULL) {
    emu_later_t *l = gone_items;
    gone_items = l->next;
    free(l->ops);
    free(l);
  }
}

/* Hands ops to the issuer thread; 0 when it cannot (then nothing changed). */
static int issue_later(const emu_op_t *ops, int n) {
  emu_later_t *l = calloc(1, sizeof *l);
  double us = emu_setting("ZPP_NCCL_EMU_ISSUE_US", 200.0);
  int i;
  if (l == NULL || (l->ops = malloc((size_t)n * sizeof *ops)) == NULL) {
    free(l);
    return 0;
  }
  memcpy(l->ops, ops, (size_t)n * sizeof *ops);
  l->n = n;
  l->not_before =
      emu_now_ns() +
      (us > 0 ? (int64_t)(emu_rand() % (uint64_t)(2 * us * 1000 + 1)) : 0);
  pthread_mutex_lock(&later_lock);
  if (!later_started) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    later_started = pthread_create(&t, &at, issuer_main, NULL) == 0;
    pthread_attr_destroy(&at);
    if (!later_started) {
      pthread_mutex_unlock(&later_lock);
      free(l->ops);
      free(l);
      return 0;
    }
  }
  for (i = 0; i < n; i++) {
    pthread_mutex_lock(&ops[i].c->lock);
    ops[i].c->issuing++;
    pthread_mutex_unlock(&ops[i].c->lock);
  }
  if (later_tail != NULL)
    later_tail->next = l;
  else
    later_head = l;
  later_tail = l;
  pthread_cond_signal(&later_cond);
  pthread_mutex_unlock(&later_lock);
  return 1;
}

/* Issues a call's operations (one, or a group's) and ends the call on
 * their communicators.  The operations' references go with them. */
static ncclResult_t issue(emu_op_t *ops, int n) {
  emu_comm_t **cs = malloc((size_t)n * sizeof *cs);
  double frac = emu_setting("ZPP_NCCL_EMU_INPROGRESS", 0.5);
  int i, nonblocking = 1;
  ncclResult_t r;
  if (cs == NULL) {
    for (i = 0; i < n; i++)
      emu_leave(ops[i].c);
    release_ops(ops, n, 0);
    return emu_fail(ncclSystemError, "stand-in: out of host memory");
  }
  for (i = 0; i < n; i++) {
    cs[i] = ops[i].c;
    emu_ref(cs[i]);
    nonblocking &= !cs[i]->blocking;
  }
  if (nonblocking && frac > 0 &&
      (double)(emu_rand() >> 11) * 0x1.0p-53 < frac && issue_later(ops, n))
    r = ncclInProgress;
  else
    r = launch(ops, n);
  for (i = 0; i < n; i++) {
    emu_leave(cs[i]);
    emu_unref(cs[i]);
  }
  free(cs);
  return r;
}

static ncclResult_t submit(const emu_op_t *o) {
  emu_op_t one = *o;
  if (g_depth == 0)
    return issue(&one, 1);
  /* NCCL v2.28.9 group.cc:51-59, ncclAsyncLaunch: "Blocking and
   * nonblocking communicators are not allowed in the same group", the call
   * fails with ncclInvalidArgument (NCCL checks it for the calls that run
   * as group jobs, init and split; for operations it lets the last
   * communicator decide the group's mode, group.h ncclGroupCommJoin, which
   * the stand-in refuses as well). */
  if (g_n > 0 && g_ops[0].c->blocking != o->c->blocking) {
    emu_leave(o->c);
    emu_unref(o->c);
    return group_fail(emu_fail(
        ncclInvalidArgument,
        "%s: blocking and non-blocking communicators are not allowed in the "
        "same group (communicator %p is %sblocking, the group's first %p "
        "is %sblocking)",
        op_name(o->kind), (void *)o->c->handle, o->c->blocking ? "" : "non-",
        (void *)g_ops[0].c->handle, g_ops[0].c->blocking ? "" : "non-"));
  }
  if (g_n == g_cap) {
    int cap = g_cap ? 2 * g_cap : 16;
    emu_op_t *p = realloc(g_ops, (size_t)cap * sizeof *p);
    if (p == NULL) {
      emu_leave(o->c);
      emu_unref(o->c);
      return group_fail(emu_fail(ncclSystemError, "stand-in: out of memory"));
    }
    g_ops = p;
    g_cap = cap;
  }
  /* The call stays open on its communicator until ncclGroupEnd: "for any
   * grouped NCCL operations, users need to ensure only one thread issues
   * the all operations in the group". */
  g_ops[g_n++] = one;
  return ncclSuccess;
}

EMU_API ncclResult_t ncclGroupStart(void) {
  g_depth++;
  return ncclSuccess;
}

EMU_API ncclResult_t ncclGroupEnd(void) {
  ncclResult_t r;
  int i;
  if (g_depth == 0)
    return emu_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_depth > 0)
    return ncclSuccess;
  r = g_err;
  g_err = ncclSuccess;
  if (r != ncclSuccess) {
    /* A failed call in the group: nothing of the group runs. */
    for (i = 0; i < g_n; i++)
      emu_leave(g_ops[i].c);
    release_ops(g_ops, g_n, 0);
  } else if (g_n > 0) {
    r = issue(g_ops, g_n);
  }
  g_n = 0;
  return r;
}

/* ---- argument checks ------------------------------------------------------------- */

static const char *mem_kind(enum cudaMemoryType t) {
  switch (t) {
  case cudaMemoryTypeHost: return "pinned host";
  case cudaMemoryTypeDevice: return "device";
  case cudaMemoryTypeManaged: return "managed";
  default: break;
  }
  return "unregistered host";
}

/* NCCL_CHECK_POINTERS=1: device memory of the comm's device, or managed. */
static ncclResult_t check_ptr(const emu_comm_t *c, const void *p,
                              const char *what, const char *func) {
  struct cudaPointerAttributes a;
  cudaError_t e;
  if (p == NULL)
    return emu_fail(ncclInvalidArgument, "%s: %s is NULL", func, what);
  memset(&a, 0, sizeof a);
  e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return emu_fail(ncclInvalidArgument, "%s: %s %p: cudaPointerGetAttributes: "
                    "%s", func, what, p, cudaGetErrorString(e));
  }
  if (a.type == cudaMemoryTypeManaged)
    return ncclSuccess;
  if (a.type == cudaMemoryTypeUnregistered)
    return emu_fail(ncclInvalidArgument,
                    "%s: %s %p is %s memory; the communicator works on device "
                    "%d",
                    func, what, p, mem_kind(a.type), c->dev);
  if (a.device != c->dev)
    return emu_fail(ncclInvalidArgument,
                    "%s: %s %p is %s memory of device %d; the communicator's "
                    "device is %d",
                    func, what, p, mem_kind(a.type), a.device, c->dev);
  return ncclSuccess;
}

static ncclResult_t check_type(ncclDataType_t dt, const char *func) {
  if (emu_dtype_size(dt) == 0)
    return emu_fail(ncclInvalidArgument,
                    "%s: datatype %d: not a type the stand-in models", func,
                    (int)dt);
  return ncclSuccess;
}

/* Takes a ready comm and begins the call on it, or records the error
 * (also for the group). */
static emu_comm_t *op_comm(ncclComm_t comm, const char *func, ncclResult_t *r) {
  emu_comm_t *c = emu_get_ready(comm, func, r);
  if (c != NULL && (*r = emu_enter(c, func)) != ncclSuccess) {
    emu_unref(c);
    c = NULL;
  }
  if (c == NULL)
    group_fail(*r);
  return c;
}

static ncclResult_t op_reject(emu_comm_t *c, ncclResult_t r) {
  emu_leave(c);
  emu_unref(c);
  return group_fail(r);
}

/* A call with nothing to move (count 0) ends. */
static ncclResult_t op_nothing(emu_comm_t *c) {
  emu_leave(c);
  emu_unref(c);
  return ncclSuccess;
}

EMU_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                                   size_t sendcount, ncclDataType_t datatype,
                                   ncclComm_t comm, cudaStream_t stream) {
  static const char *f = "ncclAllGather";
  ncclResult_t r;
  emu_comm_t *c = op_comm(comm, f, &r);
  emu_op_t o;
  if (c == NULL)
    return r;
  if ((r = check_type(datatype, f)) != ncclSuccess)
    return op_reject(c, r);
  if (sendcount == 0) /* nothing to move, as in NCCL */
    return op_nothing(c);
  if ((r = check_ptr(c, sendbuff, "sendbuff", f)) != ncclSuccess ||
      (r = check_ptr(c, recvbuff, "recvbuff", f)) != ncclSuccess)
    return op_reject(c, r);
  memset(&o, 0, sizeof o);
  o.kind = OP_ALLGATHER;
  o.c = c;
  o.sbuf = sendbuff;
  o.rbuf = recvbuff;
  o.count = sendcount;
  o.dt = datatype;
  o.stream = stream;
  return submit(&o);
}

EMU_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                                       size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op,
                                       ncclComm_t comm, cudaStream_t stream) {
  static const char *f = "ncclReduceScatter";
  ncclResult_t r;
  emu_comm_t *c = op_comm(comm, f, &r);
  emu_op_t o;
  if (c == NULL)
    return r;
  if ((r = check_type(datatype, f)) != ncclSuccess)
    return op_reject(c, r);
  if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin)
    return op_reject(c, emu_fail(ncclInvalidArgument,
                                 "%s: op %d: the stand-in models ncclSum, "
                                 "ncclProd, ncclMax and ncclMin",
                                 f, (int)op));
  if (recvcount == 0)
    return op_nothing(c);
  if ((r = check_ptr(c, sendbuff, "sendbuff", f)) != ncclSuccess ||
      (r = check_ptr(c, recvbuff, "recvbuff", f)) != ncclSuccess)
    return op_reject(c, r);
  memset(&o, 0, sizeof o);
  o.kind = OP_REDUCE_SCATTER;
  o.c = c;
  o.sbuf = sendbuff;
  o.rbuf = recvbuff;
  o.count = recvcount;
  o.dt = datatype;
  o.op = op;
  o.stream = stream;
  return submit(&o);
}

static ncclResult_t p2p(int kind, const void *sbuf, void *rbuf, size_t count,
                        ncclDataType_t dt, int peer, ncclComm_t comm,
                        cudaStream_t stream) {
  const char *f = op_name(kind);
  ncclResult_t r;
  emu_comm_t *c = op_comm(comm, f, &r);
  emu_op_t o;
  if (c == NULL)
    return r;
  if ((r = check_type(dt, f)) != ncclSuccess)
    return op_reject(c, r);
  if (peer < 0 || peer >= c->nranks)
    return op_reject(c, emu_fail(ncclInvalidArgument,
                                 "%s: peer %d: must be in [0, %d)", f, peer,
                                 c->nranks));
  if (count == 0)
    return op_nothing(c);
  r = kind == OP_SEND ? check_ptr(c, sbuf, "sendbuff", f)
                      : check_ptr(c, rbuf, "recvbuff", f);
  if (r != ncclSuccess)
    return op_reject(c, r);
  memset(&o, 0, sizeof o);
  o.kind = kind;
  o.c = c;
  o.sbuf = sbuf;
  o.rbuf = rbuf;
  o.count = count;
  o.dt = dt;
  o.peer = peer;
  o.stream = stream;
  return submit(&o);
}

EMU_API ncclResult_t ncclSend(const void *sendbuff, size_t count,
                              ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream) {
  return p2p(OP_SEND, sendbuff, NULL, count, datatype, peer, comm, stream);
}

EMU_API ncclResult_t ncclRecv(void *recvbuff, size_t count,
                              ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream) {
  return p2p(OP_RECV, NULL, recvbuff, count, datatype, peer, comm, stream);
}
