/*
 * NCCL backend: device memory, asynchronous on the caller's CUDA stream.
 * libnccl.so.2 is opened with dlopen and the symbols used are resolved into
 * a table, so libzpp loads where NCCL is absent; the build needs nccl.h
 * only.  The communicators are non-blocking (ncclConfig_t.blocking = 0):
 * every wait polls ncclCommGetAsyncError and gives up after the timeout,
 * aborting the communicators instead of hanging.  One communicator (WORLD)
 * owns resources; NODE and CROSS are splits sharing them, made only where
 * WORLD cannot serve the group and a rank shares it with another
 * (group_plan).
 *
 * Routing and counts (docs/design.md "Transports"):
 *   allgather       ncclAllGather: counts derived from a ring in ring order
 *                   (NCCL's ring crosses each node boundary once per
 *                   channel; bytes_derived is set);
 *   reduce_scatter  ncclReduceScatter in fp32 (16-bit inputs widened
 *                   first, one rounding to the dtype after it, MEAN divided
 *                   before that rounding): derived the same way, 4 bytes
 *                   per element;
 *   allreduce       that reduce-scatter + ncclAllGather over shards of
 *                   ceil(count / n) elements (padded), so its result equals
 *                   reduce_scatter's bit for bit;
 *   allgatherv,
 *   alltoall[v]     grouped ncclSend/ncclRecv, one pair per peer: exact;
 *   barrier         ncclAllGather of one byte per member, then a wait.
 * Link emulation (ZPP_EMU_INTER_*) is an MPI-backend feature.
 */
#include "transport/transport_impl.h"

#include <stdlib.h>
#include <string.h>

#if ZPP_HAVE_NCCL

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include "kernels/elementwise.h"
#include <pthread.h>
#include <time.h>

/* ncclCommSplit and non-blocking init need NCCL 2.18. */
#define ZPP_NCCL_MIN_VERSION 21800

static struct {
  int ok;
  char why[256];
  int version;
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int,
                                     ncclConfig_t *);
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *,
                            ncclConfig_t *);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommCount)(const ncclComm_t, int *);
  ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
  const char *(*GetErrorString)(ncclResult_t);
  const char *(*GetLastError)(ncclComm_t);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t,
                            ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t,
                                ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t);
  ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
} api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

#define ZPP_NCCL_SYM(name)                                                     \
  do {                                                                         \
    *(void **)&api.name = dlsym(h, "nccl" #name);                              \
    if (api.name == NULL) {                                                    \
      snprintf(api.why, sizeof api.why, "%s lacks nccl" #name, lib);           \
      return;                                                                  \
    }                                                                          \
  } while (0)

static void api_load(void) {
  /* ZPP_NCCL_LIBRARY: the real libnccl by default; tests name a stand-in. */
  const char *lib = zpp_setting("ZPP_NCCL_LIBRARY");
  void *h;
  if (lib[0] == '\0')
    lib = "libnccl.so.2";
  h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(api.why, sizeof api.why, "dlopen(%s) (ZPP_NCCL_LIBRARY): %s", lib,
             dlerror());
    return;
  }
  ZPP_NCCL_SYM(GetVersion);
  ZPP_NCCL_SYM(GetUniqueId);
  ZPP_NCCL_SYM(CommInitRankConfig);
  ZPP_NCCL_SYM(CommSplit);
  ZPP_NCCL_SYM(CommGetAsyncError);
  ZPP_NCCL_SYM(CommAbort);
  ZPP_NCCL_SYM(CommFinalize);
  ZPP_NCCL_SYM(CommDestroy);
  ZPP_NCCL_SYM(CommCount);
  ZPP_NCCL_SYM(CommUserRank);
  ZPP_NCCL_SYM(GetErrorString);
  ZPP_NCCL_SYM(GetLastError);
  ZPP_NCCL_SYM(AllGather);
  ZPP_NCCL_SYM(ReduceScatter);
  ZPP_NCCL_SYM(Send);
  ZPP_NCCL_SYM(Recv);
  ZPP_NCCL_SYM(GroupStart);
  ZPP_NCCL_SYM(GroupEnd);
  if (api.GetVersion(&api.version) != ncclSuccess ||
      api.version < ZPP_NCCL_MIN_VERSION) {
    snprintf(api.why, sizeof api.why,
             "NCCL version %d: zpp needs %d or later (ncclCommSplit)",
             api.version, ZPP_NCCL_MIN_VERSION);
    return;
  }
  /* The library stays loaded for the life of the process. */
  api.ok = 1;
}

int zpp_transport_nccl_available(char *why, size_t len) {
  int n = 0;
  pthread_once(&api_once, api_load);
  if (!api.ok) {
    if (why)
      snprintf(why, len, "%s", api.why);
    return 0;
  }
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    if (why)
      snprintf(why, len, "no usable CUDA device");
    return 0;
  }
  return 1;
}

typedef struct {
  /* mu guards comm[] and aborted, and is held for every NCCL call on a
   * communicator (one short call: the communicators are non-blocking;
   * never across a wait).  abort_all may run on any thread
   * (zpp_comm_abort) while the engine or a caller is inside one of our
   * calls: ncclCommAbort frees the communicator, so no other thread may
   * be in NCCL with it then, nor use it after.  Holding mu for every call
   * also keeps NCCL's rule that NODE and CROSS, which share WORLD's
   * resources (splitShare), are never called in parallel with it. */
  pthread_mutex_t mu;
  int aborted; /* abort_all ran: comm[] are gone, every call fails */
  /* The communicators this transport made: WORLD, and NODE and CROSS
   * where they are neither WORLD's members in WORLD's order (then WORLD
   * serves them) nor of one member on every rank (then nothing does).
   * NULL: not made here. */
  ncclComm_t comm[ZPP_NGROUPS];
  /* The communicator of group g is comm[use[g]]; -1: this rank is alone
   * in g, and g's operations are local copies. */
  int use[ZPP_NGROUPS];
  int device;
  char *scratch; /* one byte per world rank, for the barrier */
  /* The barrier's own non-blocking stream: the legacy stream would also
   * wait for (and hold up) every blocking stream of the process. */
  cudaStream_t bar_stream;
  /* Operations on cudaStreamPerThread go through pt_stream: a
   * non-blocking communicator may issue an operation later from a thread
   * of NCCL's, where that handle names the other thread's stream.  pt_in
   * orders pt_stream after the caller's per-thread stream, pt_out the
   * other way round; made on first use. */
  cudaStream_t pt_stream;
  cudaEvent_t pt_in, pt_out;
  void *pad;     /* padded allreduce buffers */
  size_t pad_cap;
  float *wide;   /* fp32 copies of reduction inputs (reduce_fp32) */
  size_t wide_cap;
  float *acc;    /* fp32 reduced shard (reduce_fp32) */
  size_t acc_cap;
  /* wide, acc and pad serve every reduction of the transport, and two
   * reductions may be enqueued on different streams: each waits on its
   * stream for this event, recorded after the previous one's last use.
   * They come from zpp's stream-ordered scratch pool (zpp_ew_alloc_device),
   * not the application's current pool, and grow on the stream of
   * the reduction that needs more (freed and allocated in its order, after
   * that wait), so growing never synchronises the device. */
  cudaEvent_t scratch_ev;
  int scratch_ev_made;
} nccl_impl_t;

static zpp_status_t nccl_err(ncclResult_t r, ncclComm_t c, const char *what,
                             const char *call) {
  const char *last = (c != NULL) ? api.GetLastError(c) : NULL;
  return zpp_error(ZPP_ERR_NCCL, what, "%s: %s%s%s", call,
                   api.GetErrorString(r), last && last[0] ? ": " : "",
                   last ? last : "");
}

static zpp_status_t cuda_err(cudaError_t e, const char *what, const char *call) {
  return zpp_error(ZPP_ERR_CUDA, what, "%s: %s", call, cudaGetErrorString(e));
}

/* Aborts every communicator once (any thread; never with mu held). */
static void abort_all(zpp_transport_t *t) {
  nccl_impl_t *m = t->impl;
  int g;
  pthread_mutex_lock(&m->mu);
  for (g = ZPP_NGROUPS - 1; g >= 0; g--) {
    if (m->comm[g] != NULL)
      api.CommAbort(m->comm[g]);
    m->comm[g] = NULL;
  }
  m->aborted = 1;
  pthread_mutex_unlock(&m->mu);
}

/* The error of a call after abort_all: the communicator's first error
 * (zpp_comm_abort's ZPP_ERR_ABORTED, a timeout ...), else a NCCL one. */
static zpp_status_t aborted_error(zpp_transport_t *t, const char *what) {
  if (atomic_load(&t->broken))
    return zpp_transport_broken_error(t, what);
  return zpp_error(ZPP_ERR_NCCL, what, "the NCCL communicators were aborted");
}

/* Takes mu for one NCCL call on group g's communicator (*c); after an
 * abort, fails without holding mu.  Not for a group this rank is alone in
 * (its operations are local). */
static zpp_status_t comm_lock(zpp_transport_t *t, zpp_group_t g,
                              const char *what, ncclComm_t *c) {
  nccl_impl_t *m = t->impl;
  if (m->use[g] < 0)
    return zpp_error(ZPP_ERR_INTERNAL, what,
                     "group %s has one member here and no NCCL communicator",
                     zpp_group_name(g));
  pthread_mutex_lock(&m->mu);
  if (m->aborted || m->comm[m->use[g]] == NULL) {
    pthread_mutex_unlock(&m->mu);
    return aborted_error(t, what);
  }
  *c = m->comm[m->use[g]];
  return ZPP_OK;
}

static int64_t limit_of(const zpp_transport_t *t) {
  return t->timeout_s > 0 ? zpp_time_ns() + (int64_t)(t->timeout_s * 1e9)
                          : INT64_MAX;
}

/* A non-blocking communicator answers ncclInProgress until its last call
 * has been taken in; wait for that, with the timeout.  c is valid while
 * not aborted (only abort_all and destroy free it), so each poll looks at
 * it under mu. */
static zpp_status_t ready(zpp_transport_t *t, ncclComm_t c, const char *what) {
  nccl_impl_t *m = t->impl;
  int64_t limit = limit_of(t);
  long pause_ns = 1000;
  for (;;) {
    ncclResult_t async = ncclSuccess, r;
    zpp_status_t st = ZPP_OK;
    pthread_mutex_lock(&m->mu);
    if (m->aborted) {
      pthread_mutex_unlock(&m->mu);
      return aborted_error(t, what);
    }
    r = api.CommGetAsyncError(c, &async);
    if (r != ncclSuccess)
      st = nccl_err(r, c, what, "ncclCommGetAsyncError");
    else if (async != ncclSuccess && async != ncclInProgress)
      st = nccl_err(async, c, what, "asynchronous NCCL error");
    pthread_mutex_unlock(&m->mu);
    if (r != ncclSuccess)
      return st;
    if (async == ncclSuccess)
      return ZPP_OK;
    /* Broken first (with the status this call returns: the first error
     * of every later call), then aborted: a thread that finds the
     * communicators gone reports why. */
    if (async != ncclInProgress) {
      zpp_transport_break_st(t, st, "NCCL error in %s", what);
      abort_all(t);
      return st;
    }
    if (zpp_time_ns() > limit) {
      zpp_transport_break_st(t, ZPP_ERR_TIMEOUT, "%s timed out", what);
      abort_all(t);
      return zpp_error(ZPP_ERR_TIMEOUT, what,
                       "NCCL call not taken in within %.3g s "
                       "(ZPP_TIMEOUT_S); communicators aborted",
                       t->timeout_s);
    }
    zpp_pause_ns(&pause_ns);
  }
}

/* Checks a call's immediate result, then waits until it is taken in.
 * Called with mu held (comm_lock, or creation before anyone can abort);
 * releases it. */
static zpp_status_t called(zpp_transport_t *t, ncclResult_t r, ncclComm_t c,
                           const char *what, const char *call) {
  nccl_impl_t *m = t->impl;
  if (r != ncclSuccess && r != ncclInProgress) {
    zpp_status_t st = nccl_err(r, c, what, call);
    pthread_mutex_unlock(&m->mu);
    return st;
  }
  pthread_mutex_unlock(&m->mu);
  return ready(t, c, what);
}


static zpp_status_t device_only(zpp_memory_t mem, const char *what) {
  if (mem != ZPP_MEMORY_DEVICE)
    return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                     "mem ZPP_MEMORY_HOST: the NCCL backend takes device "
                     "memory (use the MPI backend for host buffers)");
  return ZPP_OK;
}

/* CUDA's current device is per thread, and a progress thread may call us:
 * make the communicator's device current before touching CUDA or NCCL. */
static zpp_status_t on_device(zpp_transport_t *t, zpp_memory_t mem,
                              const char *what) {
  nccl_impl_t *m = t->impl;
  cudaError_t e;
  ZPP_CHECK(device_only(mem, what));
  e = cudaSetDevice(m->device);
  return e == cudaSuccess ? ZPP_OK : cuda_err(e, what, "cudaSetDevice");
}

/* Counts of a ring collective, derived from the algorithm: per step I send
 * one block of `block` bytes to my ring successor and receive one from my
 * predecessor; steps = n - 1 per ring pass. */
static void account_ring(zpp_transport_t *t, zpp_group_t g, uint64_t block,
                         int passes) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, pos = 0, i;
  uint64_t total = (uint64_t)(n - 1) * block * (uint64_t)passes;
  if (n == 1)
    return;
  for (i = 0; i < n; i++)
    if (gr->ring[i] == gr->index)
      pos = i;
  zpp_transport_account(t, gr->members[gr->ring[(pos + 1) % n]], total, 0);
  zpp_transport_account(t, gr->members[gr->ring[(pos + n - 1) % n]], 0, total);
  t->bytes_derived = 1;
}

static zpp_status_t nccl_allgather(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, size_t bytes, void *recv,
                                   zpp_memory_t mem, void *stream) {
  ncclComm_t c = NULL;
  ZPP_CHECK(on_device(t, mem, "allgather"));
  if (bytes == 0)
    return ZPP_OK;
  if (t->grp[g].size == 1) {
    cudaError_t e = send == recv ? cudaSuccess
                                 : cudaMemcpyAsync(recv, send, bytes,
                                                   cudaMemcpyDeviceToDevice,
                                                   (cudaStream_t)stream);
    return e == cudaSuccess ? ZPP_OK
                            : cuda_err(e, "allgather", "cudaMemcpyAsync");
  }
  ZPP_CHECK(comm_lock(t, g, "allgather", &c));
  ZPP_CHECK(called(t, api.AllGather(send, recv, bytes, ncclUint8, c,
                                    (cudaStream_t)stream),
                   c, "allgather", "ncclAllGather"));
  account_ring(t, g, bytes, 1);
  return ZPP_OK;
}

/* Grouped point-to-point exchange: to member j send sb[j] bytes at so[j],
 * from member j receive rb[j] bytes at ro[j]; my own block is copied. */
static zpp_status_t p2p(zpp_transport_t *t, zpp_group_t g, const char *send,
                        const size_t *sb, const size_t *so, char *recv,
                        const size_t *rb, const size_t *ro, void *stream,
                        const char *what) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, me = gr->index, s;
  ncclResult_t r = ncclSuccess;
  ncclComm_t c = NULL;
  if (sb[me] > 0 && send + so[me] != recv + ro[me]) {
    cudaError_t e = cudaMemcpyAsync(recv + ro[me], send + so[me], sb[me],
                                    cudaMemcpyDeviceToDevice,
                                    (cudaStream_t)stream);
    if (e != cudaSuccess)
      return cuda_err(e, what, "cudaMemcpyAsync of my own block");
  }
  if (n == 1)
    return ZPP_OK;
  ZPP_CHECK(comm_lock(t, g, what, &c));
  r = api.GroupStart();
  for (s = 1; s < n && (r == ncclSuccess || r == ncclInProgress); s++) {
    int to = (me + s) % n, from = (me - s + n) % n;
    if (rb[from] > 0)
      r = api.Recv(recv + ro[from], rb[from], ncclUint8, from, c,
                   (cudaStream_t)stream);
    if (sb[to] > 0 && (r == ncclSuccess || r == ncclInProgress))
      r = api.Send(send + so[to], sb[to], ncclUint8, to, c,
                   (cudaStream_t)stream);
  }
  {
    ncclResult_t e = api.GroupEnd();
    if (r == ncclSuccess || r == ncclInProgress)
      r = e;
  }
  ZPP_CHECK(called(t, r, c, what, "ncclSend/ncclRecv group"));
  for (s = 0; s < n; s++) {
    if (s == me)
      continue;
    zpp_transport_account(t, gr->members[s], sb[s], rb[s]);
  }
  return ZPP_OK;
}

static zpp_status_t nccl_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                    const void *send, void *recv,
                                    const size_t *bytes, const size_t *displs,
                                    zpp_memory_t mem, void *stream) {
  int n = t->grp[g].size, me = t->grp[g].index, i;
  size_t *sb, *so, *ro, acc = 0;
  zpp_status_t st;
  ZPP_CHECK(on_device(t, mem, "allgatherv"));
  sb = malloc(3 * (size_t)n * sizeof *sb);
  if (sb == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "allgatherv", "%d peers", n);
  so = sb + n;
  ro = so + n;
  for (i = 0; i < n; i++) {
    ro[i] = displs ? displs[i] : acc;
    acc += bytes[i];
  }
  /* Every peer receives my block, read from `send`. */
  for (i = 0; i < n; i++) {
    sb[i] = bytes[me];
    so[i] = 0;
  }
  /* The own-block copy reads send + so[me] into recv + ro[me]. */
  st = p2p(t, g, (const char *)send, sb, so, (char *)recv, bytes, ro, stream,
           "allgatherv");
  free(sb);
  return st;
}

static zpp_status_t nccl_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, const size_t *sbytes,
                                   const size_t *sdispls, void *recv,
                                   const size_t *rbytes, const size_t *rdispls,
                                   zpp_memory_t mem, void *stream) {
  int n = t->grp[g].size, me = t->grp[g].index, i;
  size_t *so, *ro, sa = 0, ra = 0;
  zpp_status_t st;
  ZPP_CHECK(on_device(t, mem, "alltoallv"));
  if (sbytes[me] != rbytes[me])
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, "alltoallv",
                     "send_bytes[%d] = %zu but recv_bytes[%d] = %zu: my block "
                     "to myself must have one size",
                     me, sbytes[me], me, rbytes[me]);
  so = malloc(2 * (size_t)n * sizeof *so);
  if (so == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "alltoallv", "%d peers", n);
  ro = so + n;
  for (i = 0; i < n; i++) {
    so[i] = sdispls ? sdispls[i] : sa;
    ro[i] = rdispls ? rdispls[i] : ra;
    sa += sbytes[i];
    ra += rbytes[i];
  }
  st = p2p(t, g, (const char *)send, sbytes, so, (char *)recv, rbytes, ro,
           stream, "alltoallv");
  free(so);
  return st;
}

/* Grows a reduction scratch buffer on stream s, which the caller has
 * ordered after every earlier use of the buffer (scratch_acquire): the old
 * one is freed and the new one allocated in s's order, so nothing waits
 * (cudaFree of cudaMalloc'd memory would synchronise the device).  It
 * comes from zpp's scratch pool of the current device (the communicator's:
 * on_device), not from the application's current pool. */
static zpp_status_t grow_dev(void **p, size_t *cap, size_t bytes,
                             cudaStream_t s, const char *what) {
  cudaError_t e = cudaSuccess;
  char err[256];
  if (bytes <= *cap)
    return ZPP_OK;
  if (*p != NULL)
    e = cudaFreeAsync(*p, s);
  *p = NULL;
  *cap = 0;
  if (e != cudaSuccess)
    return cuda_err(e, what, "cudaFreeAsync of reduction scratch");
  if (zpp_ew_alloc_device(bytes, p, s, err, sizeof err) != 0) {
    *p = NULL;
    return zpp_error(ZPP_ERR_CUDA, what, "reduction scratch of %zu bytes: %s",
                     bytes, err);
  }
  *cap = bytes;
  return ZPP_OK;
}

/* A reduction that uses the shared scratch starts on `s` only after the
 * previous user's last access (scratch_ev, possibly on another stream)... */
static zpp_status_t scratch_acquire(zpp_transport_t *t, cudaStream_t s,
                                    const char *what) {
  nccl_impl_t *m = t->impl;
  cudaError_t e;
  if (!m->scratch_ev_made)
    return ZPP_OK; /* no reduction used it yet */
  e = cudaStreamWaitEvent(s, m->scratch_ev, 0);
  return e == cudaSuccess
             ? ZPP_OK
             : cuda_err(e, what, "cudaStreamWaitEvent for the reduction scratch");
}

/* ... and marks its own last access (also after an error: what was
 * enqueued may still run). */
static zpp_status_t scratch_release(zpp_transport_t *t, cudaStream_t s,
                                    const char *what) {
  nccl_impl_t *m = t->impl;
  cudaError_t e = cudaSuccess;
  if (!m->scratch_ev_made) {
    e = cudaEventCreateWithFlags(&m->scratch_ev, cudaEventDisableTiming);
    m->scratch_ev_made = e == cudaSuccess;
  }
  if (e == cudaSuccess)
    e = cudaEventRecord(m->scratch_ev, s);
  if (e == cudaSuccess)
    return ZPP_OK;
  /* The next reduction could not be ordered after this one: report. */
  return cuda_err(e, what, "cudaEventRecord after the reduction scratch");
}

/* ncclReduceScatter of fp32 sums over group g into out (shard elements);
 * alone in g, my input is the sum. */
static zpp_status_t sum_fp32(zpp_transport_t *t, zpp_group_t g, const float *in,
                             float *out, size_t shard, cudaStream_t s,
                             const char *what) {
  ncclComm_t c = NULL;
  if (t->grp[g].size == 1) {
    cudaError_t e = in == out ? cudaSuccess
                              : cudaMemcpyAsync(out, in, shard * sizeof(float),
                                                cudaMemcpyDeviceToDevice, s);
    return e == cudaSuccess ? ZPP_OK : cuda_err(e, what, "cudaMemcpyAsync");
  }
  ZPP_CHECK(comm_lock(t, g, what, &c));
  return called(t,
                api.ReduceScatter(in, out, shard, ncclFloat32, ncclSum, c, s),
                c, what, "ncclReduceScatter");
}

/* The reduction zpp promises (transport.h): each member's shard j summed
 * in fp32 and rounded once to the dtype (after the division for MEAN).
 * NCCL's own fp16/bf16 reduce-scatter rounds at every step, so 16-bit
 * inputs are widened to fp32 first (NCCL then carries 4-byte elements:
 * twice the bytes of the dtype) and the fp32 shard is finished into `out`.
 * Summation order is NCCL's ring order.  `send` holds `valid` elements of
 * the n * shard the reduction reads; the rest is taken as zero. */
static zpp_status_t reduce_fp32(zpp_transport_t *t, zpp_group_t g,
                                const void *send, size_t valid, void *out,
                                size_t shard, zpp_dtype_t dtype,
                                zpp_reduce_op_t op, void *stream,
                                const char *what) {
  nccl_impl_t *m = t->impl;
  size_t n = (size_t)t->grp[g].size, total = shard * n;
  float div = op == ZPP_REDUCE_MEAN ? (float)n : 1.0f;
  cudaStream_t s = (cudaStream_t)stream;
  const float *in = (const float *)send;
  char err[256];
  cudaError_t e;
  if (dtype != ZPP_FLOAT32 || valid < total) {
    ZPP_CHECK(grow_dev((void **)&m->wide, &m->wide_cap, total * sizeof(float),
                       s, what));
    if (valid < total) {
      e = cudaMemsetAsync(m->wide + valid, 0, (total - valid) * sizeof(float),
                          s);
      if (e != cudaSuccess)
        return cuda_err(e, what, "cudaMemsetAsync of the padding");
    }
    if (zpp_ew_widen_device((int)dtype, send, valid, m->wide, stream, err,
                            sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, what, "%s", err);
    in = m->wide;
  }
  if (dtype == ZPP_FLOAT32 && div == 1.0f) { /* fp32 sum: straight out */
    ZPP_CHECK(sum_fp32(t, g, in, (float *)out, shard, s, what));
  } else {
    ZPP_CHECK(grow_dev((void **)&m->acc, &m->acc_cap, shard * sizeof(float), s,
                       what));
    ZPP_CHECK(sum_fp32(t, g, in, m->acc, shard, s, what));
    if (zpp_ew_finish_device(m->acc, shard, div, (int)dtype, out, stream, err,
                             sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, what, "%s", err);
  }
  account_ring(t, g, (uint64_t)shard * sizeof(float), 1);
  return ZPP_OK;
}

static zpp_status_t nccl_reduce_scatter(zpp_transport_t *t, zpp_group_t g,
                                        const void *send, void *recv,
                                        size_t count, zpp_dtype_t dtype,
                                        zpp_reduce_op_t op, zpp_memory_t mem,
                                        void *stream) {
  size_t n = (size_t)t->grp[g].size;
  zpp_status_t st, rs;
  ZPP_CHECK(on_device(t, mem, "reduce_scatter"));
  if (count == 0)
    return ZPP_OK;
  if (dtype == ZPP_FLOAT32 && op == ZPP_REDUCE_SUM) /* no scratch */
    return reduce_fp32(t, g, send, count * n, recv, count, dtype, op, stream,
                       "reduce_scatter");
  ZPP_CHECK(scratch_acquire(t, (cudaStream_t)stream, "reduce_scatter"));
  st = reduce_fp32(t, g, send, count * n, recv, count, dtype, op, stream,
                   "reduce_scatter");
  rs = scratch_release(t, (cudaStream_t)stream, "reduce_scatter");
  return st != ZPP_OK ? st : rs;
}

/* reduce_fp32 over shards of ceil(count / n) elements (zero padding), then
 * an all-gather of the rounded shards: the result equals reduce_scatter's
 * shards bit for bit. */
static zpp_status_t nccl_allreduce(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, void *recv, size_t count,
                                   zpp_dtype_t dtype, zpp_reduce_op_t op,
                                   zpp_memory_t mem, void *stream) {
  nccl_impl_t *m = t->impl;
  int n = t->grp[g].size, me = t->grp[g].index;
  size_t es = zpp_dtype_size(dtype), shard = (count + (size_t)n - 1) / (size_t)n;
  cudaStream_t s = (cudaStream_t)stream;
  ncclComm_t c = NULL;
  cudaError_t e;
  char *out;
  zpp_status_t st, rs = ZPP_OK;
  int scratch;
  ZPP_CHECK(on_device(t, mem, "allreduce"));
  if (count == 0)
    return ZPP_OK;
  scratch = shard * (size_t)n != count || dtype != ZPP_FLOAT32 ||
            op != ZPP_REDUCE_SUM;
  if (scratch)
    ZPP_CHECK(scratch_acquire(t, s, "allreduce"));
  if (shard * (size_t)n == count) {
    out = (char *)recv; /* reduce my shard into its place, gather in place */
    st = ZPP_OK;
  } else {
    st = grow_dev(&m->pad, &m->pad_cap, shard * (size_t)n * es, s, "allreduce");
    out = (char *)m->pad;
  }
  if (st == ZPP_OK)
    st = reduce_fp32(t, g, send, count, out + (size_t)me * shard * es, shard,
                     dtype, op, stream, "allreduce");
  /* Alone in g: my shard is all of it, already in place. */
  if (st == ZPP_OK && n > 1)
    st = comm_lock(t, g, "allreduce", &c);
  if (st == ZPP_OK && n > 1)
    st = called(t, api.AllGather(out + (size_t)me * shard * es, out,
                                 shard * es, ncclUint8, c, s),
                c, "allreduce", "ncclAllGather");
  if (st == ZPP_OK) {
    account_ring(t, g, (uint64_t)shard * es, 1);
    if (out != (char *)recv) {
      e = cudaMemcpyAsync(recv, out, count * es, cudaMemcpyDeviceToDevice, s);
      if (e != cudaSuccess)
        st = cuda_err(e, "allreduce", "copying the result");
    }
  }
  if (scratch)
    rs = scratch_release(t, s, "allreduce");
  return st != ZPP_OK ? st : rs;
}

static zpp_status_t nccl_sync(zpp_transport_t *t, void *stream) {
  nccl_impl_t *m = t->impl;
  int64_t limit = limit_of(t);
  long pause_ns = 1000;
  int g;
  ZPP_CHECK(on_device(t, ZPP_MEMORY_DEVICE, "sync"));
  for (;;) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    zpp_status_t st = ZPP_OK;
    int aborted;
    /* not an error, but the thread's last error now: clear it (a launch
     * checked with cudaGetLastError would fail on it) */
    if (e == cudaErrorNotReady)
      (void)cudaGetLastError();
    /* Work that an abort ended (zpp_comm_abort from another thread, an
     * error) leaves the stream too: drained is not done then. */
    pthread_mutex_lock(&m->mu);
    aborted = m->aborted;
    for (g = 0; g < ZPP_NGROUPS && !aborted && e == cudaErrorNotReady &&
                st == ZPP_OK;
         g++) {
      ncclResult_t async = ncclSuccess;
      if (m->comm[g] == NULL)
        continue;
      api.CommGetAsyncError(m->comm[g], &async);
      if (async != ncclSuccess && async != ncclInProgress)
        st = nccl_err(async, m->comm[g], "sync", "asynchronous NCCL error");
    }
    pthread_mutex_unlock(&m->mu);
    if (aborted)
      return aborted_error(t, "sync");
    if (e == cudaSuccess)
      return ZPP_OK;
    if (e != cudaErrorNotReady) {
      st = cuda_err(e, "sync", "cudaStreamQuery");
      zpp_transport_break_st(t, st, "CUDA error while waiting");
      abort_all(t);
      return st;
    }
    if (st != ZPP_OK) {
      zpp_transport_break_st(t, st, "asynchronous NCCL error on group %s",
                             zpp_group_name((zpp_group_t)(g - 1)));
      abort_all(t);
      return st;
    }
    if (zpp_time_ns() > limit) {
      zpp_transport_break_st(t, ZPP_ERR_TIMEOUT, "stream wait timed out");
      abort_all(t);
      return zpp_error(ZPP_ERR_TIMEOUT, "sync",
                       "operations on the stream did not finish within %.3g s "
                       "(ZPP_TIMEOUT_S); NCCL communicators aborted",
                       t->timeout_s);
    }
    zpp_pause_ns(&pause_ns);
  }
}

static zpp_status_t nccl_barrier(zpp_transport_t *t, zpp_group_t g) {
  nccl_impl_t *m = t->impl;
  int me = t->grp[g].index;
  ncclComm_t c = NULL;
  ZPP_CHECK(on_device(t, ZPP_MEMORY_DEVICE, "barrier"));
  if (t->grp[g].size == 1)
    return ZPP_OK;
  ZPP_CHECK(comm_lock(t, g, "barrier", &c));
  ZPP_CHECK(called(t, api.AllGather(m->scratch + me, m->scratch, 1, ncclUint8,
                                    c, m->bar_stream),
                   c, "barrier", "ncclAllGather"));
  account_ring(t, g, 1, 1);
  return nccl_sync(t, m->bar_stream);
}

static void nccl_destroy(zpp_transport_t *t) {
  nccl_impl_t *m = t->impl;
  int g;
  if (m == NULL)
    return;
  /* Not concurrent with zpp_comm_abort (zpp_comm.h), and the engine is
   * gone: no other thread uses the communicators now. */
  for (g = ZPP_NGROUPS - 1; g >= 0; g--) {
    if (m->comm[g] == NULL)
      continue;
    if (t->broken) {
      api.CommAbort(m->comm[g]);
    } else {
      ncclResult_t r = api.CommFinalize(m->comm[g]);
      if ((r == ncclSuccess || r == ncclInProgress) &&
          ready(t, m->comm[g], "destroy") == ZPP_OK)
        api.CommDestroy(m->comm[g]);
      else if (m->comm[g] != NULL && !m->aborted)
        api.CommAbort(m->comm[g]);
    }
    m->comm[g] = NULL;
  }
  /* The reduction scratch (stream-ordered allocations: cudaFree would not
   * wait for their last users) goes on the barrier's stream after the
   * last reduction that used it. */
  if (m->bar_stream != NULL) {
    if (m->scratch_ev_made)
      (void)cudaStreamWaitEvent(m->bar_stream, m->scratch_ev, 0);
    if (m->pad)
      (void)cudaFreeAsync(m->pad, m->bar_stream);
    if (m->wide)
      (void)cudaFreeAsync(m->wide, m->bar_stream);
    if (m->acc)
      (void)cudaFreeAsync(m->acc, m->bar_stream);
    cudaStreamDestroy(m->bar_stream);
  }
  if (m->pt_stream != NULL)
    cudaStreamDestroy(m->pt_stream);
  if (m->pt_in != NULL)
    cudaEventDestroy(m->pt_in);
  if (m->pt_out != NULL)
    cudaEventDestroy(m->pt_out);
  if (m->scratch)
    cudaFree(m->scratch);
  if (m->scratch_ev_made)
    cudaEventDestroy(m->scratch_ev);
  pthread_mutex_destroy(&m->mu);
  free(m);
  t->impl = NULL;
}

/* Asynchronous errors of the three communicators, without waiting. */
static zpp_status_t nccl_check_async(zpp_transport_t *t, const char *what) {
  nccl_impl_t *m = t->impl;
  zpp_status_t st = ZPP_OK;
  int g, aborted;
  pthread_mutex_lock(&m->mu);
  aborted = m->aborted;
  for (g = 0; g < ZPP_NGROUPS && !aborted && st == ZPP_OK; g++) {
    ncclResult_t async = ncclSuccess;
    if (m->comm[g] == NULL)
      continue;
    api.CommGetAsyncError(m->comm[g], &async);
    if (async != ncclSuccess && async != ncclInProgress)
      st = nccl_err(async, m->comm[g], what, "asynchronous NCCL error");
  }
  pthread_mutex_unlock(&m->mu);
  if (aborted)
    return aborted_error(t, what);
  if (st != ZPP_OK) {
    zpp_transport_break_st(t, st, "asynchronous NCCL error on group %s",
                           zpp_group_name((zpp_group_t)(g - 1)));
    abort_all(t);
  }
  return st;
}

/* Stream-ordered: the operations enqueue; no round primitive. */
/* The collective table's one entry: the descriptor's kind picks the
 * operation.  An all-to-all of `bytes` per member is the all-to-allv of
 * equal counts. */
static zpp_status_t enqueue_on(zpp_transport_t *t, const zpp_xfer_desc_t *d) {
  switch (d->kind) {
  case ZPP_XFER_ALLGATHER:
    return nccl_allgather(t, d->group, d->send, d->bytes, d->recv, d->mem,
                          d->stream);
  case ZPP_XFER_ALLGATHERV:
    return nccl_allgatherv(t, d->group, d->send, d->recv, d->recv_bytes,
                           d->recv_displs, d->mem, d->stream);
  case ZPP_XFER_ALLTOALL: {
    size_t n = (size_t)t->grp[d->group].size, i, *counts;
    zpp_status_t st;
    counts = malloc(n * sizeof *counts);
    if (counts == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "alltoall", "%zu counts", n);
    for (i = 0; i < n; i++)
      counts[i] = d->bytes;
    st = nccl_alltoallv(t, d->group, d->send, counts, NULL, d->recv, counts,
                        NULL, d->mem, d->stream);
    free(counts);
    return st;
  }
  case ZPP_XFER_ALLTOALLV:
    return nccl_alltoallv(t, d->group, d->send, d->send_bytes, d->send_displs,
                          d->recv, d->recv_bytes, d->recv_displs, d->mem,
                          d->stream);
  case ZPP_XFER_REDUCE_SCATTER:
    return nccl_reduce_scatter(t, d->group, d->send, d->recv, d->count,
                               d->dtype, d->op, d->mem, d->stream);
  case ZPP_XFER_ALLREDUCE:
    return nccl_allreduce(t, d->group, d->send, d->recv, d->count, d->dtype,
                          d->op, d->mem, d->stream);
  case ZPP_XFER_BARRIER:
    return nccl_barrier(t, d->group);
  }
  return zpp_error(ZPP_ERR_INTERNAL, zpp_xfer_name(d->kind),
                   "transfer kind %d", (int)d->kind);
}

/* An operation on the calling thread's per-thread stream, through
 * pt_stream (see nccl_impl_t): the stream handle given to NCCL names the
 * same stream whichever thread issues it.  Called on the caller's thread
 * with the communicator's device current. */
static zpp_status_t enqueue_per_thread(zpp_transport_t *t,
                                       const zpp_xfer_desc_t *d) {
  nccl_impl_t *m = t->impl;
  zpp_xfer_desc_t x = *d;
  zpp_status_t st;
  cudaError_t e = cudaSuccess;
  int dev = -1;
  /* cudaStreamPerThread names the current device's stream: on another
   * device it is not the stream the communicator can be ordered with. */
  e = cudaGetDevice(&dev);
  if (e != cudaSuccess)
    return cuda_err(e, zpp_xfer_name(d->kind), "cudaGetDevice");
  if (dev != m->device)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, zpp_xfer_name(d->kind),
                     "stream cudaStreamPerThread on current device %d: the "
                     "communicator's device is %d (cudaSetDevice(%d) first)",
                     dev, m->device, m->device);
  if (m->pt_stream == NULL) {
    e = cudaStreamCreateWithFlags(&m->pt_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags(&m->pt_in, cudaEventDisableTiming);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags(&m->pt_out, cudaEventDisableTiming);
    if (e != cudaSuccess)
      return cuda_err(e, zpp_xfer_name(d->kind),
                      "the stream for cudaStreamPerThread operations");
  }
  e = cudaEventRecord(m->pt_in, cudaStreamPerThread);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(m->pt_stream, m->pt_in, 0);
  if (e != cudaSuccess)
    return cuda_err(e, zpp_xfer_name(d->kind),
                    "ordering after cudaStreamPerThread");
  x.stream = m->pt_stream;
  st = enqueue_on(t, &x);
  /* also after a failure: whatever was queued comes before later work */
  e = cudaEventRecord(m->pt_out, m->pt_stream);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(cudaStreamPerThread, m->pt_out, 0);
  if (st == ZPP_OK && e != cudaSuccess)
    st = cuda_err(e, zpp_xfer_name(d->kind),
                  "ordering cudaStreamPerThread after the operation");
  return st;
}

static zpp_status_t nccl_enqueue(zpp_transport_t *t, const zpp_xfer_desc_t *d) {
  if (d->stream == (void *)cudaStreamPerThread && d->kind != ZPP_XFER_BARRIER)
    return enqueue_per_thread(t, d);
  return enqueue_on(t, d);
}

static const zpp_coll_ops_t nccl_coll = {
    .enqueue = nccl_enqueue,
    .sync = nccl_sync,
    .check_async = nccl_check_async,
    .abort_device_work = abort_all};
static const zpp_transport_ops_t nccl_ops = {
    .name = "nccl", .destroy = nccl_destroy, .coll = &nccl_coll};

/* How group g (NODE or CROSS) is served, the same on every rank (the
 * topology is every rank's): by WORLD's communicator when its members are
 * WORLD's in WORLD's order (one node, for NODE); by none when no rank
 * shares it with another (one rank per node for NODE, one node for
 * CROSS); else by a split of WORLD, in which ranks alone in their
 * instance of g take no part. */
enum { GROUP_LOCAL, GROUP_WORLD, GROUP_SPLIT };

static int group_plan(const zpp_transport_t *t, zpp_group_t g) {
  const zpp_topo_t *topo = t->topo;
  const zpp_tgroup_t *gr = &t->grp[g];
  int i, largest = 0;
  if (gr->size == t->size) {
    for (i = 0; i < gr->size && gr->members[i] == i; i++)
      ;
    if (i == gr->size)
      return GROUP_WORLD;
  }
  if (g == ZPP_GROUP_NODE) {
    for (i = 0; i < topo->nnodes; i++)
      if (topo->node_off[i + 1] - topo->node_off[i] > largest)
        largest = topo->node_off[i + 1] - topo->node_off[i];
  } else {
    largest = topo->nnodes; /* local rank 0's: one member per node */
  }
  return largest > 1 ? GROUP_SPLIT : GROUP_LOCAL;
}

static const char *use_name(const nccl_impl_t *m, zpp_group_t g) {
  if (m->use[g] < 0)
    return "local copies (one member)";
  return m->use[g] == ZPP_GROUP_WORLD ? "the world's communicator"
                                      : "a split sharing the world's resources";
}

zpp_status_t zpp_transport_nccl_create(zpp_transport_t *t,
                                       const zpp_bootstrap_t *bs,
                                       int cuda_device) {
  nccl_impl_t *m;
  ncclUniqueId id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  const zpp_topo_t *topo = t->topo;
  char why[256];
  cudaError_t e;
  ncclResult_t rinit;
  struct {
    int32_t status;
    ncclUniqueId id;
  } mine, *all;
  zpp_status_t st = ZPP_OK;
  int g;
  if (t->emu_on) {
    ZPP_WARN(ZPP_SUBSYS_NET, "ZPP_EMU_INTER_GBIT/LAT_US apply to the MPI "
             "backend only; NCCL links are not slowed");
    t->emu_on = 0;
    t->emu_gbit = t->emu_lat_us = 0;
  }
  /* Everything that can fail locally happens before the exchange of the
   * unique id, and every rank learns every other rank's outcome in that
   * exchange: a rank that failed here never leaves the others waiting for
   * an id (or inside ncclCommInitRankConfig) that will not come. */
  memset(&mine, 0, sizeof mine);
  m = NULL;
  if (!zpp_transport_nccl_available(why, sizeof why))
    st = zpp_error(ZPP_ERR_UNSUPPORTED, __func__, "NCCL backend: %s", why);
  else if ((m = calloc(1, sizeof *m)) == NULL)
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "NCCL backend state");
  if (m != NULL) {
    pthread_mutex_init(&m->mu, NULL);
    m->device = cuda_device;
    t->impl = m;
    t->ops = &nccl_ops;
    t->backend = ZPP_BACKEND_NCCL;
    e = cudaSetDevice(cuda_device);
    if (e == cudaSuccess)
      e = cudaMalloc((void **)&m->scratch, (size_t)t->size);
    if (e == cudaSuccess)
      e = cudaStreamCreateWithFlags(&m->bar_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
      st = cuda_err(e, __func__, "cudaSetDevice/cudaMalloc/cudaStreamCreate");
  }
  if (st == ZPP_OK && t->rank == 0) {
    ncclResult_t r = api.GetUniqueId(&mine.id);
    if (r != ncclSuccess)
      st = nccl_err(r, NULL, __func__, "ncclGetUniqueId");
  }
  mine.status = (int32_t)st;
  all = malloc((size_t)t->size * sizeof *all);
  if (all == NULL)
    return st != ZPP_OK ? st
                        : zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                    "%d bootstrap records", t->size);
  {
    zpp_status_t xs =
        bs->allgather(bs->ctx, &mine, sizeof mine, all, t->timeout_s);
    if (xs != ZPP_OK) {
      free(all);
      return st != ZPP_OK ? st : xs;
    }
  }
  for (g = 0; g < t->size && st == ZPP_OK; g++)
    if (all[g].status != ZPP_OK)
      st = zpp_error((zpp_status_t)all[g].status, __func__,
                     "rank %d failed before NCCL initialisation (%s); see "
                     "its log",
                     g, zpp_status_string((zpp_status_t)all[g].status));
  id = all[0].id;
  free(all);
  if (st != ZPP_OK)
    return st;
  cfg.blocking = 0;
  /* NCCL decides sharing by the PARENT's splitShare (init.cc of NCCL
   * 2.28, ncclCommInitChildComm: the parent's shareResources comes from
   * its own config): WORLD's config says it, so that NODE and CROSS use
   * WORLD's resources (buffers, connections, proxy thread) instead of
   * making their own.  Shared resources put the three communicators'
   * kernels on one stream, in the order they are issued; that is safe
   * because every rank issues them in the same order. */
  cfg.splitShare = 1;
  /* The handle is written by the call: read it only after the call
   * returned (as an argument of the same call its value is unspecified). */
  /* called() releases mu, taken for each call (nobody else can see the
   * communicators yet). */
  pthread_mutex_lock(&m->mu);
  rinit = api.CommInitRankConfig(&m->comm[ZPP_GROUP_WORLD], t->size, id,
                                 t->rank, &cfg);
  ZPP_CHECK(called(t, rinit, m->comm[ZPP_GROUP_WORLD], __func__,
                   "ncclCommInitRankConfig (NCCL needs one GPU per rank; use "
                   "the MPI backend for several ranks on one GPU)"));
  /* NODE: colour node, key local rank; CROSS: colour local rank, key node:
   * the member order equals the topology's.  They share WORLD's resources
   * (WORLD's splitShare, above). */
  for (g = ZPP_GROUP_NODE; g <= ZPP_GROUP_CROSS; g++) {
    const zpp_tgroup_t *gr = &t->grp[g];
    int plan = group_plan(t, (zpp_group_t)g);
    if (plan == GROUP_SPLIT) {
      int node = topo->node_of[t->rank], local = topo->local_rank_of[t->rank];
      int color = gr->size == 1         ? NCCL_SPLIT_NOCOLOR
                  : g == ZPP_GROUP_NODE ? node
                                        : local;
      pthread_mutex_lock(&m->mu);
      ZPP_CHECK(called(t,
                       api.CommSplit(m->comm[ZPP_GROUP_WORLD], color,
                                     g == ZPP_GROUP_NODE ? local : node,
                                     &m->comm[g], &cfg),
                       m->comm[ZPP_GROUP_WORLD], __func__,
                       g == ZPP_GROUP_NODE ? "ncclCommSplit(node)"
                                           : "ncclCommSplit(cross)"));
      if (m->comm[g] != NULL)
        ZPP_CHECK(ready(t, m->comm[g], __func__));
    }
    m->use[g] = gr->size == 1 ? -1 : plan == GROUP_WORLD ? ZPP_GROUP_WORLD : g;
  }
  m->use[ZPP_GROUP_WORLD] = t->size == 1 ? -1 : ZPP_GROUP_WORLD;
  for (g = 0; g < ZPP_NGROUPS; g++) {
    int r = -1, n = -1;
    if (m->use[g] < 0)
      continue;
    api.CommUserRank(m->comm[m->use[g]], &r);
    api.CommCount(m->comm[m->use[g]], &n);
    if (r != t->grp[g].index || n != t->grp[g].size)
      return zpp_error(ZPP_ERR_INTERNAL, __func__,
                       "group %s: NCCL gives rank %d of %d, topology %d of %d",
                       zpp_group_name((zpp_group_t)g), r, n, t->grp[g].index,
                       t->grp[g].size);
  }
  ZPP_INFO(ZPP_SUBSYS_NET,
           "NCCL %d backend on device %d; node group: %s, cross group: %s",
           api.version, cuda_device, use_name(m, ZPP_GROUP_NODE),
           use_name(m, ZPP_GROUP_CROSS));
  return ZPP_OK;
}

#else /* !ZPP_HAVE_NCCL */

int zpp_transport_nccl_available(char *why, size_t len) {
  if (why)
    snprintf(why, len, "zpp was built without NCCL support");
  return 0;
}

zpp_status_t zpp_transport_nccl_create(zpp_transport_t *t,
                                       const zpp_bootstrap_t *bs,
                                       int cuda_device) {
  (void)t;
  (void)bs;
  (void)cuda_device;
  return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                   "backend NCCL: zpp was built without NCCL support");
}

#endif /* ZPP_HAVE_NCCL */
