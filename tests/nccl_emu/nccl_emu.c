/*
 * zpp's NCCL stand-in: a shared library with NCCL's C API (the real nccl.h
 * types), loaded by libzpp through the same dlopen path as libnccl.so.2
 * (ZPP_NCCL_LIBRARY names it), so that zpp's NCCL backend runs on machines
 * without a GPU, on top of the emulated CUDA runtime.  Built for tests only.
 *
 * What it models, with NCCL's documented behaviour:
 *   - communicators: ncclGetUniqueId, ncclCommInitRankConfig (blocking or
 *     not), ncclCommSplit, ncclCommFinalize, ncclCommDestroy, ncclCommAbort,
 *     ncclCommGetAsyncError, ncclCommCount, ncclCommUserRank,
 *     ncclCommCuDevice, ncclGetVersion, ncclGetErrorString,
 *     ncclGetLastError;
 *   - non-blocking creation: init and split return ncclInProgress and the
 *     communicator answers ncclInProgress until a background thread has
 *     connected it and at least ZPP_NCCL_EMU_INIT_DELAY_MS (default 20) have
 *     passed, so a caller that reads the handle too early or does not poll
 *     fails here as it would on a GPU; a call on a communicator that is not
 *     ready fails with ncclInvalidArgument (NCCL's "use before the previous
 *     operation returned ncclSuccess");
 *   - NULL, unknown, destroyed or aborted communicators are rejected with
 *     ncclInvalidArgument (handles are never reused, so a stale one is
 *     recognised);
 *   - two ranks of one communicator on one device (same PCI bus id, same
 *     host) fail creation with ncclInvalidUsage on every rank;
 *   - ncclAllGather, ncclReduceScatter, ncclSend, ncclRecv are stream
 *     ordered: on the given stream (NULL: the legacy stream of the
 *     communicator's device) they enqueue copies of the inputs into pinned
 *     host staging, a host function (cudaLaunchHostFunc) that exchanges and
 *     reduces the staged bytes when the stream reaches it, and copies of
 *     the results back; the host function calls no CUDA function and never
 *     touches device memory (nccl_emu_ops.c);
 *   - a send completes only once the peer posted the matching receive, so
 *     ungrouped send/recv cycles hang (here: time out) as on a GPU, while
 *     send/recv pairs inside ncclGroupStart/End are matched as a group;
 *   - buffers are checked as with NCCL_CHECK_POINTERS=1 (device memory of
 *     the communicator's device, or managed memory): the GPU's failure for
 *     a host pointer, an illegal-address fault, cannot happen in a host
 *     function, so the stand-in rejects the call instead;
 *   - reductions in the order of a ring reduce-scatter over the ranks in
 *     rank order: the shard of rank i starts with rank i+1's value and ends
 *     with its own, the sum rounded to the data type after every addition
 *     (fp16 and bf16 accumulate in their own type, as NCCL does);
 *   - errors: every wait is bounded by ZPP_NCCL_EMU_TIMEOUT_S (default 60)
 *     and turns into an asynchronous error (ncclRemoteError) reported by
 *     ncclCommGetAsyncError; ncclCommAbort wakes every pending operation,
 *     which then finishes with an error, and never waits for peers;
 *   - thread safety: a call on a communicator (collective, send, receive,
 *     split, finalize, destroy) while another thread is inside a call on
 *     it, or holds grouped operations on it until its ncclGroupEnd, fails
 *     with ncclInvalidUsage; communicators split with config.splitShare
 *     count as their parent for this; each call stays inside a random
 *     0..2 x ZPP_NCCL_EMU_CALL_US (default 20) us, so that unsynchronised
 *     callers overlap; ncclCommGetAsyncError, ncclCommAbort,
 *     ncclGetLastError and the queries stay allowed from any thread;
 *   - ncclInProgress of operations: on a non-blocking communicator a
 *     collective, send or receive outside a group, or ncclGroupEnd,
 *     returns ncclInProgress for a fraction ZPP_NCCL_EMU_INPROGRESS
 *     (default 0.5) of calls and is enqueued on its streams only a random
 *     0..2 x ZPP_NCCL_EMU_ISSUE_US (default 200) us later; until then the
 *     communicator answers ncclInProgress and refuses other calls
 *     (nccl_emu_ops.c, "issuing");
 *   - config.splitShare (and NCCL_COMM_SPLIT_SHARE_RESOURCES, which
 *     overrides it at each communicator's creation): a parent with
 *     splitShare 1 shares its resources with its splits, whatever their
 *     own value, which is for their children; a split without config
 *     inherits the parent's value, one with a config takes NCCL's
 *     defaults (blocking 1, splitShare 0) for fields it leaves
 *     NCCL_CONFIG_UNDEF_INT; the test hook
 *     zpp_nccl_emu_census counts live communicators and those owning
 *     resources (zpp_nccl_emu.h);
 *   - the random draws (dwell, in-progress, issue delay) come from
 *     ZPP_NCCL_EMU_SEED (default: clock and pid), printed at first use.
 *
 * What it does not model: topology, routing, channels and protocols (the
 * ring is always rank order, one chunk, one channel; NCCL's tree, NVLS and
 * PAT algorithms and its multi-ring chunking are absent), NVLink, PCIe,
 * InfiniBand and GPUDirect, performance, CUDA graphs capture of NCCL
 * calls, user buffer registration, ncclAllReduce, ncclBroadcast, ncclReduce
 * and the other calls zpp does not make, ncclAvg and ncclPreMulSum, fp8
 * types, communicators spanning machines (ranks meet over UNIX sockets of
 * one host), kernels that hang the device (a stream blocked in a
 * stand-in operation blocks only that stream), the check that the
 * stream belongs to the communicator's device (the emulated runtime has no
 * cudaStreamGetDevice to ask), what sharing resources saves (a shared
 * child costs nothing here either way), and NCCL's rule against issuing
 * operations in parallel on independent communicators of one device from
 * several threads (only one communicator, or one family sharing
 * resources, is guarded).
 *
 * Between ranks (threads or processes of one machine) bytes travel over
 * UNIX-domain sockets in the abstract namespace, named from the unique id
 * (nccl_emu_net.c); the stand-in needs neither MPI nor shared files.
 */
#include "nccl_emu_internal.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define EMU_HANDLE_MAGIC 0x7a70706e63636cull /* "zppnccl" */
#define EMU_ID_MAGIC "zpp-nccl-emu-id"

typedef struct {
  char magic[16];
  uint64_t token[2];
} emu_id_t;

/* ---- time and settings --------------------------------------------------- */

int64_t emu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The settings, read from the environment once, at first use (NCCL reads
 * each NCCL_* parameter once too: src/include/param.h, NCCL_PARAM, caches
 * it).  Other threads of the stand-in read them while the application may
 * call setenv, which is not safe against getenv; tests change them with
 * zpp_nccl_emu_set. */
static const char *const setting_names[] = {
    "ZPP_NCCL_EMU_TIMEOUT_S",  "ZPP_NCCL_EMU_INIT_DELAY_MS",
    "ZPP_NCCL_EMU_INPROGRESS", "ZPP_NCCL_EMU_ISSUE_US",
    "ZPP_NCCL_EMU_CALL_US",    "ZPP_NCCL_EMU_SEED",
    "ZPP_NCCL_EMU_DEBUG",      "NCCL_COMM_SPLIT_SHARE_RESOURCES"};
#define EMU_NSETTINGS (sizeof setting_names / sizeof setting_names[0])
#define EMU_SETTING_LEN 64
static pthread_mutex_t setting_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t setting_once = PTHREAD_ONCE_INIT;
static char setting_val[EMU_NSETTINGS][EMU_SETTING_LEN];
static int setting_set[EMU_NSETTINGS];

static void settings_load(void) {
  size_t i;
  for (i = 0; i < EMU_NSETTINGS; i++) {
    const char *v = getenv(setting_names[i]);
    setting_set[i] = v != NULL;
    if (v != NULL)
      snprintf(setting_val[i], EMU_SETTING_LEN, "%s", v);
  }
}

static int setting_index(const char *name) {
  size_t i;
  for (i = 0; i < EMU_NSETTINGS; i++)
    if (strcmp(setting_names[i], name) == 0)
      return (int)i;
  return -1;
}

/* The value of setting `name` into buf; 0 when it is not set. */
static int setting_str(const char *name, char *buf, size_t len) {
  int i = setting_index(name), set;
  pthread_once(&setting_once, settings_load);
  if (i < 0)
    return 0;
  pthread_mutex_lock(&setting_lock);
  set = setting_set[i];
  if (set)
    snprintf(buf, len, "%s", setting_val[i]);
  pthread_mutex_unlock(&setting_lock);
  return set;
}

/* Test hook (zpp_nccl_emu.h). */
EMU_API int zpp_nccl_emu_set(const char *name, const char *value) {
  int i = name ? setting_index(name) : -1;
  pthread_once(&setting_once, settings_load);
  if (i < 0 || (value != NULL && strlen(value) >= EMU_SETTING_LEN))
    return -1;
  pthread_mutex_lock(&setting_lock);
  setting_set[i] = value != NULL;
  if (value != NULL)
    snprintf(setting_val[i], EMU_SETTING_LEN, "%s", value);
  pthread_mutex_unlock(&setting_lock);
  return 0;
}

double emu_setting(const char *name, double def) {
  char v[EMU_SETTING_LEN], *end;
  double d;
  if (!setting_str(name, v, sizeof v) || v[0] == '\0')
    return def;
  d = strtod(v, &end);
  return (*end == '\0' && d >= 0) ? d : def;
}

static int emu_debug(void) {
  char v[EMU_SETTING_LEN];
  return setting_str("ZPP_NCCL_EMU_DEBUG", v, sizeof v);
}

double emu_timeout_s(void) {
  return emu_setting("ZPP_NCCL_EMU_TIMEOUT_S", 60.0);
}

int64_t emu_deadline(void) {
  return emu_now_ns() + (int64_t)(emu_timeout_s() * 1e9);
}

static pthread_mutex_t rand_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rand_state;
static int rand_seeded;

uint64_t emu_rand(void) {
  uint64_t x;
  pthread_mutex_lock(&rand_lock);
  if (!rand_seeded) {
    char v[EMU_SETTING_LEN], *end = NULL;
    int set = setting_str("ZPP_NCCL_EMU_SEED", v, sizeof v) && v[0];
    rand_state = set ? strtoull(v, &end, 10) : 0;
    if (!(set && end && *end == '\0'))
      rand_state = (uint64_t)emu_now_ns() ^ ((uint64_t)getpid() << 32);
    rand_seeded = 1;
    fprintf(stderr, "[nccl-emu %d] ZPP_NCCL_EMU_SEED=%llu\n", (int)getpid(),
            (unsigned long long)rand_state);
  }
  /* splitmix64 */
  rand_state += 0x9e3779b97f4a7c15ull;
  x = rand_state;
  pthread_mutex_unlock(&rand_lock);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* ---- errors --------------------------------------------------------------- */

static __thread char tl_err[EMU_ERR_LEN];

ncclResult_t emu_fail(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_err, sizeof tl_err, fmt, ap);
  va_end(ap);
  if (emu_debug())
    fprintf(stderr, "[nccl-emu %d] %s: %s\n", (int)getpid(),
            ncclGetErrorString(r), tl_err);
  return r;
}

void emu_set_async_locked(emu_comm_t *c, ncclResult_t r, const char *fmt,
                          ...) {
  va_list ap;
  if (c->async != ncclSuccess)
    return; /* the first error explains the others */
  c->async = r;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  if (emu_debug())
    fprintf(stderr, "[nccl-emu %d] asynchronous %s: %s\n", (int)getpid(),
            ncclGetErrorString(r), c->err);
  pthread_cond_broadcast(&c->cond);
}

void emu_set_async(emu_comm_t *c, ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  char buf[EMU_ERR_LEN];
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->lock);
  emu_set_async_locked(c, r, "%s", buf);
  pthread_mutex_unlock(&c->lock);
}

/* ---- registry of handles ---------------------------------------------------
 * Handles are small and never freed: a destroyed one keeps impl == NULL, so
 * it is told apart from a live one even when memory is reused. */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm **reg;
static size_t reg_n, reg_cap;

static struct ncclComm *handle_new(emu_comm_t *c) {
  struct ncclComm *h = calloc(1, sizeof *h);
  if (h == NULL)
    return NULL;
  h->magic = EMU_HANDLE_MAGIC;
  h->impl = c;
  pthread_mutex_lock(&reg_lock);
  if (reg_n == reg_cap) {
    size_t cap = reg_cap ? 2 * reg_cap : 64;
    struct ncclComm **r = realloc(reg, cap * sizeof *r);
    if (r == NULL) {
      pthread_mutex_unlock(&reg_lock);
      free(h);
      return NULL;
    }
    reg = r;
    reg_cap = cap;
  }
  reg[reg_n++] = h;
  pthread_mutex_unlock(&reg_lock);
  c->handle = h;
  return h;
}

static int registered_locked(ncclComm_t h) {
  size_t i;
  for (i = 0; i < reg_n; i++)
    if (reg[i] == h)
      return 1;
  return 0;
}

void emu_ref(emu_comm_t *c) {
  pthread_mutex_lock(&c->lock);
  c->refs++;
  pthread_mutex_unlock(&c->lock);
}

/* ---- shared resources and the thread inside a call ----------------------- */

static emu_res_t *res_new(void) {
  emu_res_t *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  pthread_mutex_init(&r->lock, NULL);
  r->refs = 1;
  return r;
}

static void res_put(emu_res_t *r) {
  int last;
  if (r == NULL)
    return;
  pthread_mutex_lock(&r->lock);
  last = --r->refs == 0;
  pthread_mutex_unlock(&r->lock);
  if (last) {
    pthread_mutex_destroy(&r->lock);
    free(r);
  }
}

ncclResult_t emu_enter(emu_comm_t *c, const char *func) {
  emu_res_t *r = c->res;
  pthread_t self = pthread_self();
  double us = emu_setting("ZPP_NCCL_EMU_CALL_US", 20.0);
  char other[sizeof r->call];
  int shared;
  pthread_mutex_lock(&r->lock);
  if (r->depth > 0 && !pthread_equal(r->owner, self)) {
    memcpy(other, r->call, sizeof other);
    shared = r->refs > 1;
    pthread_mutex_unlock(&r->lock);
    return emu_fail(ncclInvalidUsage,
                    "%s: communicator %p (rank %d of %d) is in use by another "
                    "thread (in %s): NCCL operations on one communicator%s "
                    "must not be issued from several threads in parallel",
                    func, (void *)c->handle, c->rank, c->nranks, other,
                    shared ? ", or on communicators sharing its resources "
                             "(splitShare),"
                           : "");
  }
  if (r->depth++ == 0) {
    r->owner = self;
    snprintf(r->call, sizeof r->call, "%s", func);
  }
  pthread_mutex_unlock(&r->lock);
  if (us > 0) {
    /* Stay inside the call a while, so that another thread's call at about
     * the same time overlaps it. */
    int64_t ns = (int64_t)(emu_rand() % (uint64_t)(2 * us * 1000 + 1));
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
  }
  return ncclSuccess;
}

void emu_leave(emu_comm_t *c) {
  emu_res_t *r = c->res;
  pthread_mutex_lock(&r->lock);
  if (r->depth > 0)
    r->depth--;
  pthread_mutex_unlock(&r->lock);
}

void emu_unref(emu_comm_t *c) {
  int last, i;
  pthread_mutex_lock(&c->lock);
  last = --c->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (!last)
    return;
  emu_mesh_close(c);
  for (i = 0; c->peers != NULL && i < c->nranks; i++)
    pthread_mutex_destroy(&c->peers[i].send_lock);
  free(c->peers);
  res_put(c->res);
  pthread_cond_destroy(&c->cond);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

emu_comm_t *emu_get(ncclComm_t h, const char *func, ncclResult_t *r) {
  emu_comm_t *c = NULL;
  if (h == NULL) {
    *r = emu_fail(ncclInvalidArgument, "%s: comm is NULL", func);
    return NULL;
  }
  pthread_mutex_lock(&reg_lock);
  if (!registered_locked(h))
    *r = emu_fail(ncclInvalidArgument,
                  "%s: comm %p is not a communicator of this library", func,
                  (void *)h);
  else if (h->impl == NULL)
    *r = emu_fail(ncclInvalidArgument,
                  "%s: comm %p was destroyed or aborted", func, (void *)h);
  else {
    c = h->impl;
    emu_ref(c);
  }
  pthread_mutex_unlock(&reg_lock);
  return c;
}

ncclResult_t emu_state_locked(emu_comm_t *c) {
  if (c->async != ncclSuccess)
    return c->async;
  if (c->init != ncclSuccess)
    return c->init;
  if (emu_now_ns() < c->ready_after_ns || c->busy > 0 || c->issuing > 0)
    return ncclInProgress;
  if (c->finalizing && c->pending > 0)
    return ncclInProgress;
  return ncclSuccess;
}

emu_comm_t *emu_get_ready(ncclComm_t h, const char *func, ncclResult_t *r) {
  emu_comm_t *c = emu_get(h, func, r);
  ncclResult_t st;
  int fin;
  char msg[EMU_ERR_LEN];
  if (c == NULL)
    return NULL;
  pthread_mutex_lock(&c->lock);
  st = emu_state_locked(c);
  fin = c->finalizing;
  snprintf(msg, sizeof msg, "%s", c->err);
  pthread_mutex_unlock(&c->lock);
  if (st == ncclInProgress) {
    *r = emu_fail(ncclInvalidArgument,
                  "%s: communicator used before its previous operation "
                  "(init, split, finalize, or a call that returned "
                  "ncclInProgress) completed: poll ncclCommGetAsyncError "
                  "until it returns ncclSuccess",
                  func);
  } else if (st != ncclSuccess) {
    *r = emu_fail(st, "%s: communicator has failed: %s", func, msg);
  } else if (fin) {
    *r = emu_fail(ncclInvalidUsage, "%s: communicator was finalized", func);
  } else {
    return c;
  }
  emu_unref(c);
  return NULL;
}

/* ---- small calls ------------------------------------------------------------ */

EMU_API ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL)
    return emu_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

EMU_API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: break;
  }
  return "unknown result code";
}

EMU_API const char *ncclGetLastError(ncclComm_t h) {
  static __thread char out[EMU_ERR_LEN];
  emu_comm_t *c = NULL;
  snprintf(out, sizeof out, "%s", tl_err);
  pthread_mutex_lock(&reg_lock);
  if (h != NULL && registered_locked(h) && h->impl != NULL)
    c = h->impl;
  if (c != NULL) {
    /* A failed communicator's own message: the caller that polled
     * ncclCommGetAsyncError wants that explained, and it was recorded on
     * another thread. */
    pthread_mutex_lock(&c->lock);
    if (c->err[0] != '\0' && (c->async != ncclSuccess || tl_err[0] == '\0' ||
                              (c->init != ncclSuccess &&
                               c->init != ncclInProgress)))
      snprintf(out, sizeof out, "%s", c->err);
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_unlock(&reg_lock);
  return out;
}

EMU_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  emu_id_t e;
  if (id == NULL)
    return emu_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  memset(&e, 0, sizeof e);
  memcpy(e.magic, EMU_ID_MAGIC, sizeof EMU_ID_MAGIC);
  if (getrandom(e.token, sizeof e.token, 0) != (ssize_t)sizeof e.token) {
    /* No entropy source: time and pid still make a collision unlikely. */
    e.token[0] = (uint64_t)emu_now_ns();
    e.token[1] = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&e;
  }
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &e, sizeof e);
  return ncclSuccess;
}

/* ---- creation ----------------------------------------------------------------- */

static int64_t init_delay_ns(void) {
  return (int64_t)(emu_setting("ZPP_NCCL_EMU_INIT_DELAY_MS", 20.0) * 1e6);
}

/* The fields of a config the stand-in models: blocking and splitShare
 * (each NCCL_CONFIG_UNDEF_INT: the value the caller put in, NCCL's default
 * or, for a split without config, the parent's).  The environment's
 * NCCL_COMM_SPLIT_SHARE_RESOURCES overrides splitShare at each
 * communicator's creation, as in NCCL (init.cc envConfigOverride, called
 * for a config and for a parent's copied one alike). */
static ncclResult_t config_read(const ncclConfig_t *cfg, int *blocking,
                                int *split_share, const char *func) {
  char env[EMU_SETTING_LEN];
  int env_set = setting_str("NCCL_COMM_SPLIT_SHARE_RESOURCES", env, sizeof env);
  if (cfg != NULL) {
    if (cfg->magic != 0xcafebeef ||
        cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
      return emu_fail(ncclInvalidArgument,
                      "%s: config was not initialised with "
                      "NCCL_CONFIG_INITIALIZER (magic 0x%x, size %zu)",
                      func, cfg->magic, cfg->size);
    if (cfg->blocking != NCCL_CONFIG_UNDEF_INT && cfg->blocking != 0 &&
        cfg->blocking != 1)
      return emu_fail(ncclInvalidArgument,
                      "%s: config->blocking %d: must be 0 or 1", func,
                      cfg->blocking);
    if (cfg->blocking != NCCL_CONFIG_UNDEF_INT)
      *blocking = cfg->blocking;
    if (cfg->size >= offsetof(ncclConfig_t, splitShare) + sizeof(int) &&
        cfg->splitShare != NCCL_CONFIG_UNDEF_INT) {
      if (cfg->splitShare != 0 && cfg->splitShare != 1)
        return emu_fail(ncclInvalidArgument,
                        "%s: config->splitShare %d: must be 0 or 1", func,
                        cfg->splitShare);
      *split_share = cfg->splitShare;
    }
  }
  if (env_set && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
    *split_share = env[0] == '1';
  return ncclSuccess;
}

/* A communicator with its own resources (share NULL) or share's. */
static emu_comm_t *comm_new(int nranks, int rank, int dev, int blocking,
                            emu_res_t *share) {
  emu_comm_t *c = calloc(1, sizeof *c);
  pthread_condattr_t ca;
  if (c == NULL)
    return NULL;
  if (share != NULL) {
    pthread_mutex_lock(&share->lock);
    share->refs++;
    pthread_mutex_unlock(&share->lock);
    c->res = share;
    c->shares = 1;
  } else if ((c->res = res_new()) == NULL) {
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->lock, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cond, &ca);
  pthread_condattr_destroy(&ca);
  c->refs = 1; /* the handle's */
  c->nranks = nranks;
  c->rank = rank;
  c->dev = dev;
  c->blocking = blocking;
  c->init = ncclInProgress;
  c->wake[0] = c->wake[1] = -1;
  c->ready_after_ns = blocking ? 0 : emu_now_ns() + init_delay_ns();
  return c;
}

static int peers_alloc(emu_comm_t *c) {
  int i;
  c->peers = calloc((size_t)c->nranks, sizeof *c->peers);
  if (c->peers == NULL)
    return -1;
  for (i = 0; i < c->nranks; i++) {
    c->peers[i].fd = -1;
    pthread_mutex_init(&c->peers[i].send_lock, NULL);
  }
  return 0;
}

/* Ends a background creation: records its result and drops its reference. */
static void finish_init(emu_comm_t *c, ncclResult_t r) {
  pthread_mutex_lock(&c->lock);
  if (r != ncclSuccess && c->err[0] == '\0')
    snprintf(c->err, sizeof c->err, "%s", tl_err);
  if (r == ncclSuccess && c->aborted)
    r = ncclInvalidUsage;
  c->init = r;
  c->bg--;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  emu_unref(c);
}

/* Waits for the background work of a blocking creation (bounded). */
static ncclResult_t wait_created(emu_comm_t *c) {
  int64_t deadline = emu_deadline() + 1000000000; /* the worker's own + 1 s */
  ncclResult_t r;
  pthread_mutex_lock(&c->lock);
  while (c->init == ncclInProgress && emu_now_ns() < deadline) {
    struct timespec ts;
    int64_t wake = emu_now_ns() + 100000000;
    ts.tv_sec = (time_t)(wake / 1000000000);
    ts.tv_nsec = (long)(wake % 1000000000);
    pthread_cond_timedwait(&c->cond, &c->lock, &ts);
  }
  r = c->init;
  pthread_mutex_unlock(&c->lock);
  if (r == ncclInProgress)
    return emu_fail(ncclSystemError, "communicator creation did not finish");
  if (r != ncclSuccess)
    return emu_fail(r, "%s", c->err);
  return ncclSuccess;
}

static void hello_of(const emu_comm_t *c, emu_hello_t *h) {
  memset(h, 0, sizeof *h);
  h->nranks = c->nranks;
  h->rank = c->rank;
  h->dev = c->dev;
  h->token[0] = c->token[0];
  h->token[1] = c->token[1];
  memcpy(h->host, c->host, sizeof h->host);
  memcpy(h->busid, c->busid, sizeof h->busid);
}

static void *init_main(void *arg) {
  emu_comm_t *c = arg;
  emu_hello_t mine, *all = calloc((size_t)c->nranks, sizeof *all);
  ncclResult_t r = ncclSuccess;
  int i, j;
  if (all == NULL) {
    finish_init(c, emu_fail(ncclSystemError, "stand-in: out of host memory"));
    return NULL;
  }
  hello_of(c, &mine);
  r = emu_mesh_connect(c, &mine, all);
  /* Every rank sees every hello, so all of them find the same pair. */
  for (i = 0; i < c->nranks && r == ncclSuccess; i++)
    for (j = i + 1; j < c->nranks && r == ncclSuccess; j++)
      if (strcmp(all[i].host, all[j].host) == 0 &&
          strcmp(all[i].busid, all[j].busid) == 0)
        r = emu_fail(ncclInvalidUsage,
                     "Duplicate GPU detected: rank %d and rank %d both on "
                     "CUDA device %s of host %s (NCCL needs one device per "
                     "rank)",
                     i, j, all[i].busid, all[i].host);
  free(all);
  finish_init(c, r);
  return NULL;
}

static ncclResult_t start_bg(emu_comm_t *c, void *(*fn)(void *), void *arg) {
  pthread_t t;
  pthread_attr_t at;
  int rc;
  pthread_mutex_lock(&c->lock);
  c->refs++;
  c->bg++;
  pthread_mutex_unlock(&c->lock);
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  rc = pthread_create(&t, &at, fn, arg);
  pthread_attr_destroy(&at);
  if (rc != 0) {
    pthread_mutex_lock(&c->lock);
    c->refs--;
    c->bg--;
    pthread_mutex_unlock(&c->lock);
    return emu_fail(ncclSystemError, "stand-in: pthread_create: %s",
                    strerror(rc));
  }
  return ncclSuccess;
}

EMU_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                            ncclUniqueId id, int rank,
                                            ncclConfig_t *config) {
  emu_id_t e;
  emu_comm_t *c;
  struct ncclComm *h;
  ncclResult_t r;
  int blocking = 1, split_share = 0, dev = -1;
  cudaError_t ce;
  if (comm == NULL)
    return emu_fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
  if (nranks < 1)
    return emu_fail(ncclInvalidArgument,
                    "ncclCommInitRankConfig: nranks %d: must be >= 1", nranks);
  if (rank < 0 || rank >= nranks)
    return emu_fail(ncclInvalidArgument,
                    "ncclCommInitRankConfig: rank %d: must be in [0, %d)", rank,
                    nranks);
  memcpy(&e, id.internal, sizeof e);
  if (memcmp(e.magic, EMU_ID_MAGIC, sizeof EMU_ID_MAGIC) != 0)
    return emu_fail(ncclInvalidArgument,
                    "ncclCommInitRankConfig: commId was not made by "
                    "ncclGetUniqueId of this library");
  r = config_read(config, &blocking, &split_share, "ncclCommInitRankConfig");
  if (r != ncclSuccess)
    return r;
  /* As NCCL: the rank's device is the calling thread's current one. */
  ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess)
    return emu_fail(ncclUnhandledCudaError,
                    "ncclCommInitRankConfig: cudaGetDevice: %s",
                    cudaGetErrorString(ce));
  c = comm_new(nranks, rank, dev, blocking, NULL);
  if (c == NULL || peers_alloc(c) != 0) {
    if (c != NULL)
      emu_unref(c);
    return emu_fail(ncclSystemError, "stand-in: out of host memory");
  }
  c->split_share = split_share;
  ce = cudaDeviceGetPCIBusId(c->busid, sizeof c->busid, dev);
  if (ce != cudaSuccess) {
    emu_unref(c);
    return emu_fail(ncclUnhandledCudaError,
                    "ncclCommInitRankConfig: cudaDeviceGetPCIBusId(%d): %s",
                    dev, cudaGetErrorString(ce));
  }
  if (gethostname(c->host, sizeof c->host) != 0)
    snprintf(c->host, sizeof c->host, "localhost");
  c->host[sizeof c->host - 1] = '\0';
  c->token[0] = e.token[0];
  c->token[1] = e.token[1];
  h = handle_new(c);
  if (h == NULL) {
    emu_unref(c);
    return emu_fail(ncclSystemError, "stand-in: out of host memory");
  }
  r = start_bg(c, init_main, c);
  if (r != ncclSuccess) {
    pthread_mutex_lock(&reg_lock);
    h->impl = NULL;
    pthread_mutex_unlock(&reg_lock);
    emu_unref(c);
    return r;
  }
  /* NCCL hands out the handle at once; it is usable once ready. */
  *comm = h;
  if (!blocking)
    return ncclInProgress;
  r = wait_created(c);
  if (r != ncclSuccess) {
    /* A blocking init that failed leaves no communicator behind. */
    pthread_mutex_lock(&reg_lock);
    h->impl = NULL;
    pthread_mutex_unlock(&reg_lock);
    pthread_mutex_lock(&c->lock);
    c->aborted = 1;
    pthread_mutex_unlock(&c->lock);
    emu_mesh_shutdown(c);
    emu_unref(c);
    *comm = NULL;
  }
  return r;
}

EMU_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks,
                                      ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

/* ---- split ---------------------------------------------------------------------- */

typedef struct {
  emu_comm_t *parent, *child; /* child NULL: NCCL_SPLIT_NOCOLOR */
  int color, key;
  uint64_t seq;
} split_arg_t;

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void *split_main(void *arg) {
  split_arg_t *s = arg;
  emu_comm_t *p = s->parent, *c = s->child;
  int n = p->nranks, i, me = p->rank;
  int32_t mine[2] = {s->color, s->key}, (*ck)[2] = calloc((size_t)n, sizeof *ck);
  int64_t deadline = emu_deadline();
  ncclResult_t r = ck ? ncclSuccess
                      : emu_fail(ncclSystemError, "stand-in: out of memory");
  /* Everyone's colour and key, over the parent's connections. */
  for (i = 0; i < n && r == ncclSuccess; i++)
    if (i != me)
      r = emu_send(p, i, EMU_MSG_SPLIT, s->seq, mine, sizeof mine);
  for (i = 0; i < n && r == ncclSuccess; i++) {
    emu_msg_t *m = NULL;
    if (i == me) {
      ck[i][0] = mine[0];
      ck[i][1] = mine[1];
      continue;
    }
    r = emu_take(p, i, EMU_MSG_SPLIT, s->seq, deadline, &m);
    if (r == ncclSuccess && m->len == sizeof mine)
      memcpy(ck[i], m->data, sizeof mine);
    else if (r == ncclSuccess)
      r = emu_fail(ncclInternalError, "stand-in: bad split message");
    emu_msg_free(m);
  }
  if (r != ncclSuccess) {
    pthread_mutex_lock(&p->lock);
    if (p->async == ncclSuccess)
      emu_set_async_locked(p, r, "ncclCommSplit: %s", tl_err);
    pthread_mutex_unlock(&p->lock);
  }
  /* The parent is usable again once the exchange is over. */
  pthread_mutex_lock(&p->lock);
  p->busy--;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  if (c != NULL) {
    if (r == ncclSuccess) {
      /* Members of my colour ordered by (key, parent rank). */
      int cnt = 0, pos = 0;
      for (i = 0; i < n; i++)
        if (ck[i][0] == s->color) {
          cnt++;
          if (ck[i][1] < s->key || (ck[i][1] == s->key && i < me))
            pos++;
        }
      c->nranks = cnt;
      c->rank = pos;
      c->token[0] = mix64(p->token[0] ^ mix64(s->seq));
      c->token[1] = mix64(p->token[1] ^ mix64((uint64_t)(uint32_t)s->color));
      if (peers_alloc(c) != 0)
        r = emu_fail(ncclSystemError, "stand-in: out of host memory");
    }
    if (r == ncclSuccess) {
      emu_hello_t mine_h, *all = calloc((size_t)c->nranks, sizeof *all);
      hello_of(c, &mine_h);
      r = all ? emu_mesh_connect(c, &mine_h, all)
              : emu_fail(ncclSystemError, "stand-in: out of host memory");
      free(all);
    } else if (c->err[0] == '\0') {
      snprintf(c->err, sizeof c->err, "ncclCommSplit: %.480s", tl_err);
    }
    finish_init(c, r);
  }
  free(ck);
  pthread_mutex_lock(&p->lock);
  p->bg--;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  emu_unref(p);
  free(s);
  return NULL;
}

EMU_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
                                   ncclComm_t *newcomm, ncclConfig_t *config) {
  ncclResult_t r;
  emu_comm_t *p, *c = NULL;
  struct ncclComm *h = NULL;
  split_arg_t *s;
  int blocking, split_share;
  if (newcomm == NULL)
    return emu_fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return emu_fail(ncclInvalidArgument,
                    "ncclCommSplit: color %d: must be >= 0 or "
                    "NCCL_SPLIT_NOCOLOR",
                    color);
  p = emu_get_ready(comm, "ncclCommSplit", &r);
  if (p == NULL)
    return r;
  /* nccl.h: "If config is NULL, the new communicator will inherit the
   * original communicator's configuration"; a config's fields left
   * NCCL_CONFIG_UNDEF_INT take NCCL's defaults (init.cc parseCommConfig,
   * NCCL_CONFIG_DEFAULT: blocking 1, splitShare 0), not the parent's. */
  blocking = config == NULL ? p->blocking : 1;
  split_share = config == NULL ? p->split_share : 0;
  r = config_read(config, &blocking, &split_share, "ncclCommSplit");
  if (r == ncclSuccess)
    r = emu_enter(p, "ncclCommSplit");
  if (r != ncclSuccess) {
    emu_unref(p);
    return r;
  }
  s = calloc(1, sizeof *s);
  if (s == NULL) {
    emu_leave(p);
    emu_unref(p);
    return emu_fail(ncclSystemError, "stand-in: out of host memory");
  }
  if (color != NCCL_SPLIT_NOCOLOR) {
    /* Same device as the parent; rank and size are known after the
     * exchange.  The PARENT's splitShare decides whether the child uses
     * the parent's resources (NCCL v2.28.9 init.cc:2582,
     * "comm->shareResources = ... comm->config.splitShare" with comm the
     * parent, and init.cc:408, new resources "if (parent == NULL ||
     * !parent->shareResources)"); the child's own value is for its
     * children. */
    c = comm_new(1, 0, p->dev, blocking, p->split_share ? p->res : NULL);
    if (c != NULL) {
      c->split_share = split_share;
      memcpy(c->busid, p->busid, sizeof c->busid);
      memcpy(c->host, p->host, sizeof c->host);
      h = handle_new(c);
    }
    if (h == NULL) {
      if (c)
        emu_unref(c);
      free(s);
      emu_leave(p);
      emu_unref(p);
      return emu_fail(ncclSystemError, "stand-in: out of host memory");
    }
    /* The child's background reference. */
    pthread_mutex_lock(&c->lock);
    c->refs++;
    c->bg++;
    pthread_mutex_unlock(&c->lock);
  }
  s->parent = p; /* the reference taken by emu_get_ready */
  s->child = c;
  s->color = color;
  s->key = key;
  pthread_mutex_lock(&p->lock);
  s->seq = ++p->split_seq;
  p->busy++;
  p->bg++;
  pthread_mutex_unlock(&p->lock);
  {
    pthread_t t;
    pthread_attr_t at;
    int rc;
    /* The call's part on the caller's thread ends here (the parent is
     * busy, so refused to any call, until the exchange is over). */
    emu_leave(p);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&t, &at, split_main, s);
    pthread_attr_destroy(&at);
    if (rc != 0) {
      pthread_mutex_lock(&p->lock);
      p->busy--;
      p->bg--;
      pthread_mutex_unlock(&p->lock);
      if (c != NULL) {
        pthread_mutex_lock(&reg_lock);
        h->impl = NULL;
        pthread_mutex_unlock(&reg_lock);
        finish_init(c, ncclSystemError);
        emu_unref(c);
      }
      emu_unref(p);
      free(s);
      return emu_fail(ncclSystemError, "stand-in: pthread_create: %s",
                      strerror(rc));
    }
  }
  *newcomm = h;
  if (!blocking)
    return ncclInProgress;
  if (c == NULL) {
    /* Blocking and no colour: wait for the exchange on the parent. */
    int64_t deadline = emu_deadline() + 1000000000;
    pthread_mutex_lock(&p->lock);
    while (p->busy > 0 && emu_now_ns() < deadline) {
      struct timespec ts;
      int64_t wake = emu_now_ns() + 100000000;
      ts.tv_sec = (time_t)(wake / 1000000000);
      ts.tv_nsec = (long)(wake % 1000000000);
      pthread_cond_timedwait(&p->cond, &p->lock, &ts);
    }
    r = p->async;
    pthread_mutex_unlock(&p->lock);
    return r;
  }
  r = wait_created(c);
  if (r != ncclSuccess) {
    pthread_mutex_lock(&reg_lock);
    h->impl = NULL;
    pthread_mutex_unlock(&reg_lock);
    emu_unref(c);
    *newcomm = NULL;
  }
  return r;
}

/* ---- state, queries ---------------------------------------------------------------- */

EMU_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm,
                                           ncclResult_t *asyncError) {
  ncclResult_t r;
  emu_comm_t *c;
  if (asyncError == NULL)
    return emu_fail(ncclInvalidArgument,
                    "ncclCommGetAsyncError: asyncError is NULL");
  c = emu_get(comm, "ncclCommGetAsyncError", &r);
  if (c == NULL)
    return r;
  pthread_mutex_lock(&c->lock);
  *asyncError = emu_state_locked(c);
  pthread_mutex_unlock(&c->lock);
  emu_unref(c);
  return ncclSuccess;
}

/* Test hook (found with dlsym): the communicators of this process that
 * are neither destroyed nor aborted, and how many of them own their
 * resources (the others are splitShare children sharing an ancestor's). */
EMU_API void zpp_nccl_emu_census(int *comms, int *own_resources) {
  size_t i;
  int n = 0, own = 0;
  pthread_mutex_lock(&reg_lock);
  for (i = 0; i < reg_n; i++)
    if (reg[i]->impl != NULL) {
      n++;
      own += !reg[i]->impl->shares;
    }
  pthread_mutex_unlock(&reg_lock);
  if (comms != NULL)
    *comms = n;
  if (own_resources != NULL)
    *own_resources = own;
}

/* Count, rank, device: only once the communicator is ready (its size is
 * not known before, for a split). */
static emu_comm_t *get_known(ncclComm_t comm, const char *func,
                             ncclResult_t *r) {
  emu_comm_t *c = emu_get(comm, func, r);
  ncclResult_t init;
  if (c == NULL)
    return NULL;
  pthread_mutex_lock(&c->lock);
  init = c->init;
  pthread_mutex_unlock(&c->lock);
  if (init == ncclSuccess)
    return c;
  *r = emu_fail(init == ncclInProgress ? ncclInvalidArgument : init,
                "%s: communicator %s", func,
                init == ncclInProgress ? "is still being created: poll "
                                         "ncclCommGetAsyncError first"
                                       : "failed at creation");
  emu_unref(c);
  return NULL;
}

EMU_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  ncclResult_t r;
  emu_comm_t *c;
  if (count == NULL)
    return emu_fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  c = get_known(comm, "ncclCommCount", &r);
  if (c == NULL)
    return r;
  *count = c->nranks;
  emu_unref(c);
  return ncclSuccess;
}

EMU_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclResult_t r;
  emu_comm_t *c;
  if (rank == NULL)
    return emu_fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  c = get_known(comm, "ncclCommUserRank", &r);
  if (c == NULL)
    return r;
  *rank = c->rank;
  emu_unref(c);
  return ncclSuccess;
}

EMU_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  ncclResult_t r;
  emu_comm_t *c;
  if (device == NULL)
    return emu_fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  c = get_known(comm, "ncclCommCuDevice", &r);
  if (c == NULL)
    return r;
  *device = c->dev;
  emu_unref(c);
  return ncclSuccess;
}

/* ---- teardown ------------------------------------------------------------------------ */

/* Takes the handle's communicator out of the registry (the caller now owns
 * the handle's reference). */
static emu_comm_t *detach(ncclComm_t h, const char *func, ncclResult_t *r) {
  emu_comm_t *c = NULL;
  pthread_mutex_lock(&reg_lock);
  if (!registered_locked(h))
    *r = emu_fail(ncclInvalidArgument,
                  "%s: comm %p is not a communicator of this library", func,
                  (void *)h);
  else if (h->impl == NULL)
    *r = emu_fail(ncclInvalidArgument, "%s: comm %p was already destroyed or "
                  "aborted", func, (void *)h);
  else {
    c = h->impl;
    h->impl = NULL;
  }
  pthread_mutex_unlock(&reg_lock);
  return c;
}

static void abort_comm(emu_comm_t *c) {
  int connected;
  pthread_mutex_lock(&c->lock);
  c->aborted = 1;
  connected = c->init != ncclInProgress;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  emu_forget_later(c);
  /* Break the connections so that peers stop waiting for us too; while
   * creation runs its thread owns them and stops on the flag. */
  if (connected)
    emu_mesh_shutdown(c);
}

EMU_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ncclResult_t r;
  emu_comm_t *c;
  if (comm == NULL)
    return ncclSuccess;
  c = detach(comm, "ncclCommAbort", &r);
  if (c == NULL)
    return r;
  abort_comm(c);
  emu_unref(c);
  return ncclSuccess;
}

/* Waits until nothing is enqueued and no background work runs. */
static int drain(emu_comm_t *c, int64_t deadline) {
  int left;
  pthread_mutex_lock(&c->lock);
  while ((c->pending > 0 || c->bg > 0 || c->issuing > 0) &&
         emu_now_ns() < deadline) {
    struct timespec ts;
    int64_t wake = emu_now_ns() + 100000000;
    ts.tv_sec = (time_t)(wake / 1000000000);
    ts.tv_nsec = (long)(wake % 1000000000);
    pthread_cond_timedwait(&c->cond, &c->lock, &ts);
  }
  left = c->pending + c->bg + c->issuing;
  pthread_mutex_unlock(&c->lock);
  return left;
}

EMU_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t r;
  emu_comm_t *c = emu_get_ready(comm, "ncclCommFinalize", &r);
  int pending;
  if (c == NULL)
    return r;
  if ((r = emu_enter(c, "ncclCommFinalize")) != ncclSuccess) {
    emu_unref(c);
    return r;
  }
  emu_leave(c);
  pthread_mutex_lock(&c->lock);
  c->finalizing = 1;
  pending = c->pending + c->issuing;
  pthread_mutex_unlock(&c->lock);
  if (!c->blocking) {
    emu_unref(c);
    return pending > 0 ? ncclInProgress : ncclSuccess;
  }
  if (drain(c, emu_deadline()) > 0)
    r = emu_fail(ncclSystemError,
                 "ncclCommFinalize: operations still pending after %.3g s "
                 "(ZPP_NCCL_EMU_TIMEOUT_S)",
                 emu_timeout_s());
  else {
    pthread_mutex_lock(&c->lock);
    r = c->async;
    pthread_mutex_unlock(&c->lock);
  }
  emu_unref(c);
  return r;
}

EMU_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclResult_t r;
  emu_comm_t *c;
  int left, ok;
  if (comm == NULL)
    return ncclSuccess;
  /* Not while another thread is inside a call on it. */
  if ((c = emu_get(comm, "ncclCommDestroy", &r)) == NULL)
    return r;
  r = emu_enter(c, "ncclCommDestroy");
  if (r == ncclSuccess)
    emu_leave(c);
  emu_unref(c);
  if (r != ncclSuccess)
    return r;
  c = detach(comm, "ncclCommDestroy", &r);
  if (c == NULL)
    return r;
  /* NCCL's destroy waits for the communicator's operations. */
  left = drain(c, emu_deadline());
  if (left > 0) {
    fprintf(stderr,
            "[nccl-emu] ncclCommDestroy: %d operations of rank %d still "
            "pending after %.3g s (ZPP_NCCL_EMU_TIMEOUT_S): aborting them\n",
            left, c->rank, emu_timeout_s());
    abort_comm(c);
  } else {
    pthread_mutex_lock(&c->lock);
    ok = c->init == ncclSuccess && !c->aborted;
    c->destroyed = 1;
    pthread_mutex_unlock(&c->lock);
    if (ok)
      emu_mesh_bye(c);
  }
  emu_unref(c);
  return ncclSuccess;
}
