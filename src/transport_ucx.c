/*
 * UCX backend (ucp, tag matching), host memory (docs/design.md,
 * "Transports", "UCX backend").
 *
 * libucp.so.0 is opened with dlopen and the symbols used are resolved into
 * a table (like NCCL), so libzpp keeps no link-time dependency on UCX; the
 * build needs ucp.h only.  One ucp_context per process (shared, counted),
 * one ucp_worker per communicator, one endpoint per peer; worker addresses
 * are exchanged over the communicator's bootstrap.
 *
 * Data movement is one primitive, exchange(): post every receive, post
 * every send (in the order they take my emulated NIC), wait, count the
 * bytes per peer, apply the link emulation.  Tags carry the sender's world
 * rank, the group, the k-th message of that pair in this round, and a
 * per-group round number, so groups need no separate communicators: a
 * group is a list of endpoints.  The algorithms on top are the MPI
 * backend's (ring all-gather with ZPP_NET_RINGS channels, pairwise
 * all-to-all, pairwise reduce-scatter with the member-order fp32 sum,
 * allreduce as reduce-scatter + ring all-gather), so counts and results
 * are bit for bit the MPI backend's.
 *
 * NOTE: these algorithms are written here a second time, against this
 * file's exchange(), until the shared src/transport_algo.c (the lead's
 * refactor of transport_mpi.c) lands; then this file keeps only the
 * primitive.
 *
 * Waiting: ucp_worker_progress, yielding, for ZPP_NET_SPIN_US after the
 * last progress; then the worker is armed and the wait sleeps in ppoll() on
 * its event fd (10 us doubling to 200 us at most, as not every transport
 * signals it), so ranks waiting for a late peer keep no core busy; an idle
 * communicator runs nothing at all.  Past the timeout the requests are cancelled, the
 * transport is broken and the error names the peers that did not deliver.
 * An endpoint error (peer gone, unreachable) fails the call naming the
 * peer.
 *
 * Device memory: Debian's UCX is built without CUDA, so device buffers
 * are staged through host memory (cudaMemcpy on the caller's stream,
 * synchronised), as on the MPI backend; creation logs that it does so.
 */
#include "transport_impl.h"

#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<ucp/api/ucp.h>)
#define ZPP_HAVE_UCX_HEADERS 1
#endif
#endif

#if ZPP_HAVE_UCX_HEADERS

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "quant_math.h"

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* ---- the library, loaded at run time --------------------------------------- */

static struct {
  int ok;
  char why[256];
  ucs_status_t (*config_read)(const char *, const char *, ucp_config_t **);
  void (*config_release)(ucp_config_t *);
  ucs_status_t (*init_version)(unsigned, unsigned, const ucp_params_t *,
                               const ucp_config_t *, ucp_context_h *);
  void (*cleanup)(ucp_context_h);
  ucs_status_t (*worker_create)(ucp_context_h, const ucp_worker_params_t *,
                                ucp_worker_h *);
  void (*worker_destroy)(ucp_worker_h);
  ucs_status_t (*worker_get_address)(ucp_worker_h, ucp_address_t **, size_t *);
  void (*worker_release_address)(ucp_worker_h, ucp_address_t *);
  unsigned (*worker_progress)(ucp_worker_h);
  ucs_status_t (*worker_get_efd)(ucp_worker_h, int *);
  ucs_status_t (*worker_arm)(ucp_worker_h);
  ucs_status_ptr_t (*worker_flush_nbx)(ucp_worker_h, const ucp_request_param_t *);
  ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
  ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
  ucs_status_ptr_t (*tag_send_nbx)(ucp_ep_h, const void *, size_t, ucp_tag_t,
                                   const ucp_request_param_t *);
  ucs_status_ptr_t (*tag_recv_nbx)(ucp_worker_h, void *, size_t, ucp_tag_t,
                                   ucp_tag_t, const ucp_request_param_t *);
  ucs_status_t (*request_check_status)(void *);
  void (*request_cancel)(ucp_worker_h, void *);
  void (*request_free)(void *);
  const char *(*status_string)(ucs_status_t);
} api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

#define UCX_SYM(field, name)                                                   \
  do {                                                                         \
    *(void **)&api.field = dlsym(h, name);                                     \
    if (api.field == NULL) {                                                   \
      snprintf(api.why, sizeof api.why, "libucp.so.0 lacks %s", name);         \
      return;                                                                  \
    }                                                                          \
  } while (0)

static void api_load(void) {
  void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(api.why, sizeof api.why, "dlopen(libucp.so.0): %s", dlerror());
    return;
  }
  UCX_SYM(config_read, "ucp_config_read");
  UCX_SYM(config_release, "ucp_config_release");
  UCX_SYM(init_version, "ucp_init_version");
  UCX_SYM(cleanup, "ucp_cleanup");
  UCX_SYM(worker_create, "ucp_worker_create");
  UCX_SYM(worker_destroy, "ucp_worker_destroy");
  UCX_SYM(worker_get_address, "ucp_worker_get_address");
  UCX_SYM(worker_release_address, "ucp_worker_release_address");
  UCX_SYM(worker_progress, "ucp_worker_progress");
  UCX_SYM(worker_get_efd, "ucp_worker_get_efd");
  UCX_SYM(worker_arm, "ucp_worker_arm");
  UCX_SYM(worker_flush_nbx, "ucp_worker_flush_nbx");
  UCX_SYM(ep_create, "ucp_ep_create");
  UCX_SYM(ep_close_nbx, "ucp_ep_close_nbx");
  UCX_SYM(tag_send_nbx, "ucp_tag_send_nbx");
  UCX_SYM(tag_recv_nbx, "ucp_tag_recv_nbx");
  UCX_SYM(request_check_status, "ucp_request_check_status");
  UCX_SYM(request_cancel, "ucp_request_cancel");
  UCX_SYM(request_free, "ucp_request_free");
  /* libucs, a dependency of libucp: dlsym searches the handle's
   * dependencies too. */
  UCX_SYM(status_string, "ucs_status_string");
  /* The library stays loaded for the life of the process. */
  api.ok = 1;
}

int zpp_transport_ucx_available(char *why, size_t len) {
  pthread_once(&api_once, api_load);
  if (!api.ok && why != NULL)
    snprintf(why, len, "%s", api.why);
  return api.ok;
}

/* One context per process, shared by every communicator's worker. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static ucp_context_h ctx_handle;
static int ctx_refs;

static zpp_status_t ucx_err(ucs_status_t s, const char *what,
                            const char *call) {
  return zpp_error(ZPP_ERR_SYSTEM, what, "%s: %s", call, api.status_string(s));
}

static zpp_status_t context_get(ucp_context_h *out, const char *func) {
  zpp_status_t st = ZPP_OK;
  pthread_mutex_lock(&ctx_lock);
  if (ctx_refs == 0) {
    ucp_config_t *conf = NULL;
    ucp_params_t p;
    ucs_status_t s = api.config_read(NULL, NULL, &conf);
    if (s == UCS_OK) {
      memset(&p, 0, sizeof p);
      p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
      p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
      /* Workers of different communicators may be driven by different
       * threads. */
      p.mt_workers_shared = 1;
      s = api.init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, conf, &ctx_handle);
      api.config_release(conf);
    }
    if (s != UCS_OK)
      st = ucx_err(s, func, "ucp_init (UCX_TLS and friends select transports)");
  }
  if (st == ZPP_OK) {
    ctx_refs++;
    *out = ctx_handle;
  }
  pthread_mutex_unlock(&ctx_lock);
  return st;
}

static void context_put(void) {
  pthread_mutex_lock(&ctx_lock);
  if (ctx_refs > 0 && --ctx_refs == 0) {
    api.cleanup(ctx_handle);
    ctx_handle = NULL;
  }
  pthread_mutex_unlock(&ctx_lock);
}

/* ---- state --------------------------------------------------------------------- */

/* Tags: sender's world rank (32 bits) | kind (1) | group (2) | k-th
 * message of the pair in this round (5) | round (24). */
#define TAG_RANK_SHIFT 32
#define TAG_KIND_SHIFT 31
#define TAG_GROUP_SHIFT 29
#define TAG_NTH_SHIFT 24
#define TAG_ROUND_MASK 0xffffffull
#define MAX_NTH 32

typedef struct {
  int done;
  ucs_status_t status;
  size_t length; /* received bytes */
} cmpl_t;

typedef struct {
  void *req;
  int peer;   /* world rank */
  int is_recv;
  size_t bytes;
  cmpl_t c;
} pending_t;

typedef struct ucx_impl {
  zpp_transport_t *t;
  ucp_context_h ctx;
  ucp_worker_h worker;
  int efd;
  ucp_ep_h *ep;          /* [size]; NULL for myself */
  volatile int *ep_fail; /* [size] ucs_status_t of an endpoint error, 0 ok */
  uint32_t round[ZPP_NGROUPS];
  int64_t spin_ns;
  int rings;
  int cuda_device;
  pending_t *pend;
  int pend_cap;
  int64_t *emu_hdr, *emu_out;
  int emu_cap;
  void *tmp;
  size_t tmp_cap;
  void *stage_in, *stage_out;
  size_t stage_in_cap, stage_out_cap;
} ucx_impl_t;

typedef struct {
  int peer; /* member index */
  const void *buf;
  size_t bytes;
} xfer_t;

static void on_send(void *req, ucs_status_t status, void *user) {
  cmpl_t *c = user;
  (void)req;
  c->status = status;
  c->done = 1;
}

static void on_recv(void *req, ucs_status_t status,
                    const ucp_tag_recv_info_t *info, void *user) {
  cmpl_t *c = user;
  (void)req;
  c->status = status;
  c->length = info != NULL ? info->length : 0;
  c->done = 1;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  ucx_impl_t *u = arg;
  int r;
  for (r = 0; r < u->t->size; r++)
    if (u->ep[r] == ep)
      u->ep_fail[r] = (int)status;
}

static zpp_status_t grow(void **p, size_t *cap, size_t need, const char *what) {
  void *q;
  if (need <= *cap)
    return ZPP_OK;
  q = realloc(*p, need);
  if (q == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%s of %zu bytes", what,
                     need);
  *p = q;
  *cap = need;
  return ZPP_OK;
}

static zpp_status_t reserve(ucx_impl_t *u, int npend, int nemu) {
  if (npend > u->pend_cap) {
    pending_t *p = realloc(u->pend, (size_t)npend * sizeof *p);
    if (p == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%d requests", npend);
    u->pend = p;
    u->pend_cap = npend;
  }
  if (nemu > u->emu_cap) {
    int64_t *a = realloc(u->emu_hdr, (size_t)nemu * sizeof *a), *b;
    if (a == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "emulation headers");
    u->emu_hdr = a;
    b = realloc(u->emu_out, (size_t)nemu * sizeof *b);
    if (b == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "emulation headers");
    u->emu_out = b;
    u->emu_cap = nemu;
  }
  return ZPP_OK;
}

/* ---- waiting ------------------------------------------------------------------- */

static const char *peer_problem(ucs_status_t s) {
  switch (s) {
  case UCS_ERR_UNREACHABLE: return "unreachable";
  case UCS_ERR_CONNECTION_RESET:
  case UCS_ERR_ENDPOINT_TIMEOUT:
  case UCS_ERR_CANCELED: return "closed the connection (exited?)";
  case UCS_ERR_MESSAGE_TRUNCATED:
    return "sent more bytes than expected (ranks passed different sizes)";
  default: return "failed";
  }
}

/* Cancels and frees every request still in flight (after an error). */
static void drop_all(ucx_impl_t *u, int n) {
  int i, k;
  for (i = 0; i < n; i++)
    if (u->pend[i].req != NULL && !u->pend[i].c.done)
      api.request_cancel(u->worker, u->pend[i].req);
  /* Cancelled requests complete through their callbacks. */
  for (k = 0; k < 1000; k++) {
    int left = 0;
    api.worker_progress(u->worker);
    for (i = 0; i < n; i++)
      left += u->pend[i].req != NULL && !u->pend[i].c.done;
    if (left == 0)
      break;
  }
  for (i = 0; i < n; i++) {
    if (u->pend[i].req != NULL)
      api.request_free(u->pend[i].req);
    u->pend[i].req = NULL;
  }
}

/* Waits for n requests: progress (yielding) while anything moves and for
 * spin_ns after; then sleep on the worker's event fd.  Errors and the
 * timeout name the peers. */
static zpp_status_t wait_all(zpp_transport_t *t, int n, const char *what,
                             zpp_group_t g) {
  ucx_impl_t *u = t->impl;
  int64_t now = zpp_time_ns(), limit, quiet_until;
  long pause_ns = 10000;
  int i, left = n;
  limit = t->timeout_s > 0 ? now + (int64_t)(t->timeout_s * 1e9) : INT64_MAX;
  quiet_until = now + u->spin_ns;
  while (left > 0) {
    unsigned got = api.worker_progress(u->worker);
    int fin = 0;
    for (i = 0; i < n; i++) {
      pending_t *p = &u->pend[i];
      if (p->req == NULL || !p->c.done)
        continue;
      api.request_free(p->req);
      p->req = NULL;
      fin++;
      if (p->c.status != UCS_OK || (p->is_recv && p->c.length != p->bytes)) {
        ucs_status_t s = p->c.status != UCS_OK ? p->c.status
                                               : UCS_ERR_MESSAGE_TRUNCATED;
        drop_all(u, n);
        zpp_transport_break(t, "%s: rank %d %s", what, p->peer,
                            peer_problem(s));
        if (p->is_recv && p->c.status == UCS_OK)
          return zpp_error(ZPP_ERR_MISMATCH, what,
                           "group %s: rank %d sent %zu bytes where %zu were "
                           "expected (ranks passed different sizes)",
                           zpp_group_name(g), p->peer, p->c.length, p->bytes);
        return zpp_error(ZPP_ERR_SYSTEM, what,
                         "group %s: %s from rank %d: %s (UCX: %s); the "
                         "communicator is aborted",
                         zpp_group_name(g), p->is_recv ? "receive" : "send",
                         p->peer, peer_problem(s), api.status_string(s));
      }
    }
    left -= fin;
    if (left <= 0)
      break;
    /* An endpoint error matters only for peers this call still waits on
     * (a peer that finished and closed its endpoints is not an error). */
    for (i = 0; i < n; i++) {
      if (u->pend[i].req != NULL && u->ep_fail[u->pend[i].peer] != 0) {
        ucs_status_t s = (ucs_status_t)u->ep_fail[u->pend[i].peer];
        int peer = u->pend[i].peer;
        drop_all(u, n);
        zpp_transport_break(t, "%s: rank %d %s", what, peer, peer_problem(s));
        return zpp_error(ZPP_ERR_SYSTEM, what,
                         "group %s: rank %d %s (UCX endpoint error: %s); the "
                         "communicator is aborted",
                         zpp_group_name(g), peer, peer_problem(s),
                         api.status_string(s));
      }
    }
    now = zpp_time_ns();
    if (got > 0 || fin > 0) {
      quiet_until = now + u->spin_ns;
      pause_ns = 10000;
      continue;
    }
    if (now > limit) {
      char who[160] = "";
      size_t used = 0;
      for (i = 0; i < n && used + 16 < sizeof who; i++)
        if (u->pend[i].req != NULL)
          used += (size_t)snprintf(who + used, sizeof who - used, "%s%s %d",
                                   used ? ", " : "",
                                   u->pend[i].is_recv ? "from" : "to",
                                   u->pend[i].peer);
      drop_all(u, n);
      zpp_transport_break(t, "%s on group %s timed out after %.3g s", what,
                          zpp_group_name(g), t->timeout_s);
      return zpp_error(ZPP_ERR_TIMEOUT, what,
                       "group %s: no completion within %.3g s (ZPP_TIMEOUT_S) "
                       "of transfers %s: a peer is missing or stuck; the "
                       "communicator is aborted",
                       zpp_group_name(g), t->timeout_s, who);
    }
    if (now < quiet_until) {
      sched_yield();
    } else if (api.worker_arm(u->worker) == UCS_OK) {
      /* Nothing pending inside UCX: sleep until an event, or a short
       * while -- 10 us doubling to 200 us, as the MPI backend's wait --
       * since not every transport signals the event fd for every step of
       * a large (rendezvous, fragmented) transfer; the timeout is checked
       * between sleeps. */
      struct pollfd p = {u->efd, POLLIN, 0};
      struct timespec ts = {0, pause_ns};
      if (limit - now < pause_ns)
        ts.tv_nsec = (long)(limit - now > 0 ? limit - now : 0);
      ppoll(&p, 1, &ts, NULL);
      if (pause_ns < 200000)
        pause_ns *= 2;
    }
  }
  return ZPP_OK;
}

/* ---- the primitive --------------------------------------------------------------- */

static ucp_tag_t make_tag(int src, int kind, zpp_group_t g, int nth,
                          uint32_t round) {
  return ((ucp_tag_t)(uint32_t)src << TAG_RANK_SHIFT) |
         ((ucp_tag_t)kind << TAG_KIND_SHIFT) |
         ((ucp_tag_t)g << TAG_GROUP_SHIFT) |
         ((ucp_tag_t)(nth % MAX_NTH) << TAG_NTH_SHIFT) |
         ((ucp_tag_t)round & TAG_ROUND_MASK);
}

/* The k-th transfer of list[i]'s peer within the list (0 for the first). */
static int nth_of(const xfer_t *list, int i) {
  int k, n = 0;
  for (k = 0; k < i; k++)
    n += list[k].peer == list[i].peer && list[k].bytes > 0;
  return n;
}

static zpp_status_t post(ucx_impl_t *u, int idx, int world_peer, int is_recv,
                         void *buf, size_t bytes, ucp_tag_t tag,
                         const char *what) {
  pending_t *p = &u->pend[idx];
  ucp_request_param_t prm;
  ucs_status_ptr_t r;
  memset(&prm, 0, sizeof prm);
  memset(p, 0, sizeof *p);
  p->peer = world_peer;
  p->is_recv = is_recv;
  p->bytes = bytes;
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.datatype = ucp_dt_make_contig(1);
  prm.user_data = &p->c;
  if (is_recv) {
    prm.cb.recv = on_recv;
    r = api.tag_recv_nbx(u->worker, buf, bytes, tag, ~(ucp_tag_t)0, &prm);
  } else {
    prm.cb.send = on_send;
    r = api.tag_send_nbx(u->ep[world_peer], buf, bytes, tag, &prm);
  }
  if (UCS_PTR_IS_ERR(r))
    return zpp_error(ZPP_ERR_SYSTEM, what, "%s rank %d: %s: %s",
                     is_recv ? "receive from" : "send to", world_peer,
                     peer_problem(UCS_PTR_STATUS(r)),
                     api.status_string(UCS_PTR_STATUS(r)));
  p->req = r;
  return ZPP_OK;
}

/* Posts every receive, then every send (the order they take my emulated
 * NIC), waits, counts the bytes per peer (when `account`) and, under link
 * emulation, sleeps until the latest deadline received. */
static zpp_status_t exchange(zpp_transport_t *t, zpp_group_t g,
                             const xfer_t *send, int ns, const xfer_t *recv,
                             int nr, const char *what, int account) {
  ucx_impl_t *u = t->impl;
  const zpp_tgroup_t *gr = &t->grp[g];
  uint32_t round = u->round[g]++;
  int npend = 0, i, nhdr = 0, emu = t->emu_on && account;
  int64_t latest = 0;
  zpp_status_t st = ZPP_OK;
  ZPP_CHECK(reserve(u, 2 * (ns + nr) + 1, ns + nr + 1));
  for (i = 0; i < nr && st == ZPP_OK; i++) {
    int peer = gr->members[recv[i].peer], nth = nth_of(recv, i);
    if (recv[i].bytes == 0)
      continue;
    if (emu && zpp_transport_link(t, peer) == ZPP_LINK_NET)
      st = post(u, npend++, peer, 1, &u->emu_hdr[nhdr++], 8,
                make_tag(peer, 1, g, nth, round), what);
    if (st == ZPP_OK)
      st = post(u, npend++, peer, 1, (void *)recv[i].buf, recv[i].bytes,
                make_tag(peer, 0, g, nth, round), what);
  }
  for (i = 0; i < ns && st == ZPP_OK; i++) {
    int peer = gr->members[send[i].peer], nth = nth_of(send, i);
    if (send[i].bytes == 0)
      continue;
    if (emu && zpp_transport_link(t, peer) == ZPP_LINK_NET) {
      u->emu_out[i] = zpp_transport_emu_deadline(t, peer, send[i].bytes);
      st = post(u, npend++, peer, 0, &u->emu_out[i], 8,
                make_tag(t->rank, 1, g, nth, round), what);
    }
    if (st == ZPP_OK)
      st = post(u, npend++, peer, 0, (void *)send[i].buf, send[i].bytes,
                make_tag(t->rank, 0, g, nth, round), what);
  }
  if (st != ZPP_OK) {
    drop_all(u, npend);
    zpp_transport_break(t, "%s", zpp_get_last_error());
    return st;
  }
  ZPP_CHECK(wait_all(t, npend, what, g));
  if (account) {
    for (i = 0; i < ns; i++)
      zpp_transport_account(t, gr->members[send[i].peer], send[i].bytes, 0);
    for (i = 0; i < nr; i++)
      zpp_transport_account(t, gr->members[recv[i].peer], 0, recv[i].bytes);
  }
  for (i = 0; i < nhdr; i++)
    if (u->emu_hdr[i] > latest)
      latest = u->emu_hdr[i];
  zpp_transport_emu_wait(t, latest);
  return ZPP_OK;
}

/* ---- host algorithms (the MPI backend's, docs/design.md) ------------------------ */

static int ring_channels(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
  const ucx_impl_t *u = t->impl;
  int i = 0, best = 1, n = gr->size;
  while (i < n) {
    int node = t->topo->node_of[gr->members[gr->ring[i]]], j = i;
    while (j < n && t->topo->node_of[gr->members[gr->ring[j]]] == node)
      j++;
    if (j - i > best)
      best = j - i;
    i = j;
  }
  return u->rings < best ? u->rings : best;
}

static void channel_ring(const zpp_transport_t *t, const zpp_tgroup_t *gr,
                         int c, int *out) {
  int n = gr->size, i = 0, k;
  while (i < n) {
    int node = t->topo->node_of[gr->members[gr->ring[i]]], j = i, len;
    while (j < n && t->topo->node_of[gr->members[gr->ring[j]]] == node)
      j++;
    len = j - i;
    for (k = 0; k < len; k++)
      out[i + k] = gr->ring[i + (k + c) % len];
    i = j;
  }
}

static void chunk_of(size_t b, int c, int nc, size_t *lo, size_t *len) {
  size_t q = b / (size_t)nc, r = b % (size_t)nc, cc = (size_t)c;
  *len = q + (cc < r ? 1 : 0);
  *lo = q * cc + (cc < r ? cc : r);
}

static zpp_status_t ring_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                    char *recv, const size_t *bytes,
                                    const size_t *displs, const char *what) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, nc, s, i, c, *rings, *pos;
  size_t *off;
  xfer_t *out, *in;
  zpp_status_t st = ZPP_OK;
  if (n == 1)
    return ZPP_OK;
  nc = ring_channels(t, gr);
  off = malloc((size_t)n * sizeof *off);
  rings = malloc(((size_t)nc * (size_t)(n + 1)) * sizeof *rings);
  out = malloc(2 * (size_t)nc * sizeof *out);
  if (off == NULL || rings == NULL || out == NULL) {
    free(off);
    free(rings);
    free(out);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "ring tables of %d members",
                     n);
  }
  in = out + nc;
  pos = rings + (size_t)nc * (size_t)n;
  if (displs == NULL) {
    size_t acc = 0;
    for (i = 0; i < n; i++) {
      off[i] = acc;
      acc += bytes[i];
    }
    displs = off;
  }
  for (c = 0; c < nc; c++) {
    int *R = rings + (size_t)c * (size_t)n;
    channel_ring(t, gr, c, R);
    for (i = 0; i < n; i++)
      if (R[i] == gr->index)
        pos[c] = i;
  }
  for (s = 0; s < n - 1 && st == ZPP_OK; s++) {
    for (c = 0; c < nc; c++) {
      const int *R = rings + (size_t)c * (size_t)n;
      int p = pos[c];
      int sb = R[(p - s + n) % n];
      int rb = R[(p - s - 1 + 2 * n) % n];
      size_t lo, len;
      chunk_of(bytes[sb], c, nc, &lo, &len);
      out[c].peer = R[(p + 1) % n];
      out[c].buf = recv + displs[sb] + lo;
      out[c].bytes = len;
      chunk_of(bytes[rb], c, nc, &lo, &len);
      in[c].peer = R[(p + n - 1) % n];
      in[c].buf = recv + displs[rb] + lo;
      in[c].bytes = len;
    }
    st = exchange(t, g, out, nc, in, nc, what, 1);
  }
  free(out);
  free(rings);
  free(off);
  return st;
}

static size_t displ_of(const size_t *bytes, const size_t *displs, int i) {
  size_t acc = 0;
  int k;
  if (displs)
    return displs[i];
  for (k = 0; k < i; k++)
    acc += bytes[k];
  return acc;
}

static zpp_status_t host_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                    const void *send, void *recv,
                                    const size_t *bytes, const size_t *displs,
                                    const char *what) {
  int me = t->grp[g].index;
  char *mine = (char *)recv + displ_of(bytes, displs, me);
  if (send != mine && bytes[me] > 0)
    memmove(mine, send, bytes[me]);
  return ring_allgatherv(t, g, recv, bytes, displs, what);
}

static zpp_status_t host_allgather(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, size_t bytes,
                                   void *recv) {
  int n = t->grp[g].size, i;
  size_t *cnt = malloc((size_t)n * sizeof *cnt);
  zpp_status_t st;
  if (cnt == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "allgather", "%d counts", n);
  for (i = 0; i < n; i++)
    cnt[i] = bytes;
  st = host_allgatherv(t, g, send, recv, cnt, NULL, "allgather");
  free(cnt);
  return st;
}

static zpp_status_t host_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, const size_t *sbytes,
                                   const size_t *sdispls, void *recv,
                                   const size_t *rbytes,
                                   const size_t *rdispls, const char *what) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, me = gr->index, s;
  xfer_t *out, *in;
  size_t *so, *ro, acc;
  zpp_status_t st;
  if (sbytes[me] != rbytes[me])
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, what,
                     "send_bytes[%d] = %zu but recv_bytes[%d] = %zu: my block "
                     "to myself must have one size",
                     me, sbytes[me], me, rbytes[me]);
  out = malloc((size_t)n * (2 * sizeof(xfer_t) + 2 * sizeof(size_t)));
  if (out == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "%d peers", n);
  in = out + n;
  so = (size_t *)(in + n);
  ro = so + n;
  for (s = 0, acc = 0; s < n; s++) {
    so[s] = sdispls ? sdispls[s] : acc;
    acc += sbytes[s];
  }
  for (s = 0, acc = 0; s < n; s++) {
    ro[s] = rdispls ? rdispls[s] : acc;
    acc += rbytes[s];
  }
  if (sbytes[me] > 0)
    memmove((char *)recv + ro[me], (const char *)send + so[me], sbytes[me]);
  for (s = 1; s < n; s++) {
    int to = (me + s) % n, from = (me - s + n) % n;
    out[s - 1].peer = to;
    out[s - 1].buf = (const char *)send + so[to];
    out[s - 1].bytes = sbytes[to];
    in[s - 1].peer = from;
    in[s - 1].buf = (char *)recv + ro[from];
    in[s - 1].bytes = rbytes[from];
  }
  st = exchange(t, g, out, n - 1, in, n - 1, what, 1);
  free(out);
  return st;
}

static void shard(size_t count, int n, int j, size_t *off, size_t *len) {
  size_t q = count / (size_t)n, r = count % (size_t)n, jj = (size_t)j;
  *len = q + (jj < r ? 1 : 0);
  *off = jj * q + (jj < r ? jj : r);
}

/* dst[e] = sum over members 0..n-1 in member order, fp32 accumulator,
 * rounded once to dtype. */
static void reduce_blocks(void *dst, const void *const *blocks, int n,
                          size_t count, zpp_dtype_t dtype) {
  size_t e;
  int i, dt = (int)dtype;
  for (e = 0; e < count; e++) {
    float acc = zpp_qm_load(blocks[0], e, dt);
    for (i = 1; i < n; i++)
      acc = zpp_qm_add(acc, zpp_qm_load(blocks[i], e, dt));
    zpp_qm_store(dst, e, dt, acc);
  }
}

static zpp_status_t host_reduce_shards(zpp_transport_t *t, zpp_group_t g,
                                       const void *send, void *dst,
                                       const size_t *off, const size_t *len,
                                       zpp_dtype_t dtype, const char *what) {
  ucx_impl_t *u = t->impl;
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, me = gr->index, i;
  size_t es = zpp_dtype_size(dtype), mine = len[me] * es;
  size_t *sb, *so, *rb, *ro;
  const void **blocks;
  zpp_status_t st;
  if (n == 1) {
    if (dst != (const char *)send + off[0] * es)
      memmove(dst, (const char *)send + off[0] * es, mine);
    return ZPP_OK;
  }
  if (mine > 0 && (size_t)n > SIZE_MAX / mine)
    return zpp_error(ZPP_ERR_OVERFLOW, what, "scratch size overflows");
  ZPP_CHECK(grow(&u->tmp, &u->tmp_cap, mine * (size_t)n + 1,
                 "reduction scratch"));
  sb = malloc((size_t)n * 4 * sizeof *sb + (size_t)n * sizeof *blocks);
  if (sb == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "%d peers", n);
  so = sb + n;
  rb = so + n;
  ro = rb + n;
  blocks = (const void **)(ro + n);
  for (i = 0; i < n; i++) {
    sb[i] = i == me ? 0 : len[i] * es;
    so[i] = off[i] * es;
    rb[i] = i == me ? 0 : mine;
    ro[i] = (size_t)i * mine;
    blocks[i] = i == me ? (const char *)send + off[me] * es
                        : (const char *)u->tmp + ro[i];
  }
  st = host_alltoallv(t, g, send, sb, so, u->tmp, rb, ro, what);
  if (st == ZPP_OK)
    reduce_blocks(dst, blocks, n, len[me], dtype);
  free(sb);
  return st;
}

static zpp_status_t host_reduce_scatter(zpp_transport_t *t, zpp_group_t g,
                                        const void *send, void *recv,
                                        size_t count, zpp_dtype_t dtype) {
  int n = t->grp[g].size, i;
  size_t *off = malloc(2 * (size_t)n * sizeof *off), *len;
  zpp_status_t st;
  if (off == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "reduce_scatter", "%d shards", n);
  len = off + n;
  for (i = 0; i < n; i++) {
    off[i] = (size_t)i * count;
    len[i] = count;
  }
  st = host_reduce_shards(t, g, send, recv, off, len, dtype, "reduce_scatter");
  free(off);
  return st;
}

static zpp_status_t host_allreduce(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, void *recv, size_t count,
                                   zpp_dtype_t dtype) {
  int n = t->grp[g].size, me = t->grp[g].index, i;
  size_t es = zpp_dtype_size(dtype);
  size_t *off = malloc(4 * (size_t)n * sizeof *off), *len, *boff, *blen;
  zpp_status_t st;
  if (off == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "allreduce", "%d shards", n);
  len = off + n;
  boff = len + n;
  blen = boff + n;
  for (i = 0; i < n; i++) {
    shard(count, n, i, &off[i], &len[i]);
    boff[i] = off[i] * es;
    blen[i] = len[i] * es;
  }
  st = host_reduce_shards(t, g, send, (char *)recv + boff[me], off, len, dtype,
                          "allreduce");
  if (st == ZPP_OK)
    st = ring_allgatherv(t, g, recv, blen, boff, "allreduce");
  free(off);
  return st;
}

/* Dissemination barrier: round k, member i signals i + 2^k and waits for
 * i - 2^k (one byte each, not counted: barriers carry no payload). */
static zpp_status_t ucx_barrier(zpp_transport_t *t, zpp_group_t g) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, me = gr->index, k;
  char out = 1, in = 0;
  for (k = 1; k < n; k *= 2) {
    xfer_t s = {(me + k) % n, &out, 1}, r = {(me - k + n) % n, &in, 1};
    ZPP_CHECK(exchange(t, g, &s, 1, &r, 1, "barrier", 0));
  }
  return ZPP_OK;
}

/* ---- device staging --------------------------------------------------------------- */

#if ZPP_HAVE_CUDA
static zpp_status_t cuda_err(cudaError_t e, const char *what,
                             const char *call) {
  return zpp_error(ZPP_ERR_CUDA, what, "%s: %s", call, cudaGetErrorString(e));
}

static zpp_status_t pinned(void **p, size_t *cap, size_t need,
                           const char *what) {
  cudaError_t e;
  if (need <= *cap)
    return ZPP_OK;
  if (*p != NULL)
    cudaFreeHost(*p);
  *p = NULL;
  *cap = 0;
  e = cudaMallocHost(p, need);
  if (e != cudaSuccess)
    return cuda_err(e, what, "cudaMallocHost");
  *cap = need;
  return ZPP_OK;
}

static zpp_status_t copy_sync(void *dst, const void *src, size_t bytes,
                              void *stream, const char *what) {
  cudaError_t e;
  if (bytes == 0)
    return ZPP_OK;
  e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                      (cudaStream_t)stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize((cudaStream_t)stream);
  return e == cudaSuccess ? ZPP_OK : cuda_err(e, what, "staging copy");
}

/* Device input: copy `in_bytes` of src into pinned memory, and `keep`
 * bytes of the device output dst (for gaps the operation does not write)
 * into the output staging. */
static zpp_status_t stage(zpp_transport_t *t, const void *src, size_t in_bytes,
                          const void *dst, size_t out_bytes, size_t keep,
                          void *stream, const char *what) {
  ucx_impl_t *u = t->impl;
  cudaError_t e;
  if (!zpp_cuda_available())
    return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                     "mem ZPP_MEMORY_DEVICE: no usable CUDA device");
  if (u->cuda_device >= 0 &&
      (e = cudaSetDevice(u->cuda_device)) != cudaSuccess)
    return cuda_err(e, what, "cudaSetDevice");
  ZPP_CHECK(pinned(&u->stage_in, &u->stage_in_cap, in_bytes + 1, what));
  ZPP_CHECK(pinned(&u->stage_out, &u->stage_out_cap, out_bytes + 1, what));
  ZPP_CHECK(copy_sync(u->stage_out, dst, keep, stream, what));
  return copy_sync(u->stage_in, src, in_bytes, stream, what);
}
#endif

static size_t extent(const size_t *b, const size_t *d, int n) {
  size_t end = 0, acc = 0;
  int i;
  for (i = 0; i < n; i++) {
    size_t o = d ? d[i] : acc;
    if (o + b[i] > end)
      end = o + b[i];
    acc += b[i];
  }
  return end;
}

#if ZPP_HAVE_CUDA
#define DEVICE_PATH 1
#else
#define DEVICE_PATH 0
#endif

static zpp_status_t no_device(const char *what) {
  return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                   "mem ZPP_MEMORY_DEVICE: zpp was built without CUDA");
}

/* ---- the table ---------------------------------------------------------------------- */

static zpp_status_t u_allgather(zpp_transport_t *t, zpp_group_t g,
                                const void *send, size_t bytes, void *recv,
                                zpp_memory_t mem, void *stream) {
  size_t total = bytes * (size_t)t->grp[g].size;
  (void)stream;
  (void)total;
  if (mem == ZPP_MEMORY_HOST)
    return host_allgather(t, g, send, bytes, recv);
#if DEVICE_PATH
  {
    ucx_impl_t *u = t->impl;
    ZPP_CHECK(stage(t, send, bytes, recv, total, 0, stream, "allgather"));
    ZPP_CHECK(host_allgather(t, g, u->stage_in, bytes, u->stage_out));
    return copy_sync(recv, u->stage_out, total, stream, "allgather");
  }
#else
  return no_device("allgather");
#endif
}

static zpp_status_t u_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                 const void *send, void *recv,
                                 const size_t *bytes, const size_t *displs,
                                 zpp_memory_t mem, void *stream) {
  size_t total = extent(bytes, displs, t->grp[g].size);
  (void)stream;
  (void)total;
  if (mem == ZPP_MEMORY_HOST)
    return host_allgatherv(t, g, send, recv, bytes, displs, "allgatherv");
#if DEVICE_PATH
  {
    ucx_impl_t *u = t->impl;
    size_t mine = bytes[t->grp[g].index];
    ZPP_CHECK(stage(t, send, mine, recv, total, total, stream, "allgatherv"));
    ZPP_CHECK(host_allgatherv(t, g, u->stage_in, u->stage_out, bytes, displs,
                              "allgatherv"));
    return copy_sync(recv, u->stage_out, total, stream, "allgatherv");
  }
#else
  return no_device("allgatherv");
#endif
}

static zpp_status_t u_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                const void *send, const size_t *sbytes,
                                const size_t *sdispls, void *recv,
                                const size_t *rbytes, const size_t *rdispls,
                                zpp_memory_t mem, void *stream) {
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_alltoallv(t, g, send, sbytes, sdispls, recv, rbytes, rdispls,
                          "alltoallv");
#if DEVICE_PATH
  {
    ucx_impl_t *u = t->impl;
    int n = t->grp[g].size;
    size_t sin = extent(sbytes, sdispls, n), rout = extent(rbytes, rdispls, n);
    ZPP_CHECK(stage(t, send, sin, recv, rout, rout, stream, "alltoallv"));
    ZPP_CHECK(host_alltoallv(t, g, u->stage_in, sbytes, sdispls, u->stage_out,
                             rbytes, rdispls, "alltoallv"));
    return copy_sync(recv, u->stage_out, rout, stream, "alltoallv");
  }
#else
  (void)extent;
  return no_device("alltoallv");
#endif
}

static zpp_status_t u_reduce_scatter(zpp_transport_t *t, zpp_group_t g,
                                     const void *send, void *recv,
                                     size_t count, zpp_dtype_t dtype,
                                     zpp_reduce_op_t op, zpp_memory_t mem,
                                     void *stream) {
  (void)op;
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_reduce_scatter(t, g, send, recv, count, dtype);
#if DEVICE_PATH
  {
    ucx_impl_t *u = t->impl;
    size_t es = zpp_dtype_size(dtype);
    size_t in = count * es * (size_t)t->grp[g].size;
    ZPP_CHECK(stage(t, send, in, recv, count * es, 0, stream,
                    "reduce_scatter"));
    ZPP_CHECK(host_reduce_scatter(t, g, u->stage_in, u->stage_out, count,
                                  dtype));
    return copy_sync(recv, u->stage_out, count * es, stream, "reduce_scatter");
  }
#else
  return no_device("reduce_scatter");
#endif
}

static zpp_status_t u_allreduce(zpp_transport_t *t, zpp_group_t g,
                                const void *send, void *recv, size_t count,
                                zpp_dtype_t dtype, zpp_reduce_op_t op,
                                zpp_memory_t mem, void *stream) {
  (void)op;
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_allreduce(t, g, send, recv, count, dtype);
#if DEVICE_PATH
  {
    ucx_impl_t *u = t->impl;
    size_t bytes = count * zpp_dtype_size(dtype);
    ZPP_CHECK(stage(t, send, bytes, recv, bytes, 0, stream, "allreduce"));
    ZPP_CHECK(host_allreduce(t, g, u->stage_in, u->stage_out, count, dtype));
    return copy_sync(recv, u->stage_out, bytes, stream, "allreduce");
  }
#else
  return no_device("allreduce");
#endif
}

/* Waits (bounded) for a request of ep close / flush. */
static void finish(ucx_impl_t *u, ucs_status_ptr_t r, int64_t deadline) {
  if (r == NULL || UCS_PTR_IS_ERR(r))
    return;
  while (api.request_check_status(r) == UCS_INPROGRESS &&
         zpp_time_ns() < deadline)
    api.worker_progress(u->worker);
  api.request_free(r);
}

static void u_destroy(zpp_transport_t *t) {
  ucx_impl_t *u = t->impl;
  int r;
  if (u == NULL)
    return;
  if (u->worker != NULL) {
    ucp_request_param_t prm;
    int64_t deadline = zpp_time_ns() + 2000000000;
    memset(&prm, 0, sizeof prm);
    /* Deliver what is queued, then close without waiting for peers that
     * may be gone. */
    if (!t->broken)
      finish(u, api.worker_flush_nbx(u->worker, &prm), deadline);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    for (r = 0; u->ep != NULL && r < t->size; r++)
      if (u->ep[r] != NULL)
        finish(u, api.ep_close_nbx(u->ep[r], &prm), deadline);
    api.worker_destroy(u->worker);
  }
  if (u->ctx != NULL)
    context_put();
#if ZPP_HAVE_CUDA
  if (u->stage_in)
    cudaFreeHost(u->stage_in);
  if (u->stage_out)
    cudaFreeHost(u->stage_out);
#endif
  free(u->ep);
  free((void *)u->ep_fail);
  free(u->pend);
  free(u->emu_hdr);
  free(u->emu_out);
  free(u->tmp);
  free(u);
  t->impl = NULL;
}

static const zpp_transport_ops_t ucx_ops = {
    "ucx",       u_allgather, u_allgatherv, u_alltoallv, u_reduce_scatter,
    u_allreduce, ucx_barrier, NULL,         u_destroy,      NULL};

/* ---- creation --------------------------------------------------------------------- */

#define ADDR_MAX 4096

typedef struct {
  int32_t status;
  uint32_t len;
} addr_hdr_t;

/* Local setup: context, worker, event fd, my address. */
static zpp_status_t local_setup(zpp_transport_t *t, ucx_impl_t *u,
                                ucp_address_t **addr, size_t *len) {
  ucp_worker_params_t wp;
  ucs_status_t s;
  char why[256];
  if (!zpp_transport_ucx_available(why, sizeof why))
    return zpp_error(ZPP_ERR_UNSUPPORTED, "zpp_transport_ucx_create",
                     "backend UCX: %s", why);
  ZPP_CHECK(context_get(&u->ctx, "zpp_transport_ucx_create"));
  memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  /* One call at a time (the transport's mutex), possibly from different
   * threads (a progress thread). */
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  s = api.worker_create(u->ctx, &wp, &u->worker);
  if (s != UCS_OK) {
    u->worker = NULL;
    return ucx_err(s, "zpp_transport_ucx_create", "ucp_worker_create");
  }
  s = api.worker_get_efd(u->worker, &u->efd);
  if (s != UCS_OK)
    return ucx_err(s, "zpp_transport_ucx_create", "ucp_worker_get_efd");
  s = api.worker_get_address(u->worker, addr, len);
  if (s != UCS_OK)
    return ucx_err(s, "zpp_transport_ucx_create", "ucp_worker_get_address");
  if (*len > ADDR_MAX)
    return zpp_error(ZPP_ERR_INTERNAL, "zpp_transport_ucx_create",
                     "worker address of %zu bytes (zpp allows %d)", *len,
                     ADDR_MAX);
  (void)t;
  return ZPP_OK;
}

zpp_status_t zpp_transport_ucx_create(zpp_transport_t *t,
                                      const zpp_bootstrap_t *bs,
                                      int cuda_device) {
  ucx_impl_t *u = calloc(1, sizeof *u);
  ucp_address_t *addr = NULL;
  size_t len = 0;
  char *mine = NULL, *all = NULL;
  size_t rec = sizeof(addr_hdr_t) + ADDR_MAX;
  zpp_status_t st = ZPP_OK, xs;
  int r;
  if (u == NULL)
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "UCX backend state");
  if (st == ZPP_OK) {
    u->t = t;
    u->cuda_device = cuda_device;
    u->efd = -1;
    u->spin_ns = zpp_setting_long("ZPP_NET_SPIN_US", 1000) * 1000;
    if (u->spin_ns < 0)
      u->spin_ns = 0;
    u->rings = (int)zpp_setting_long("ZPP_NET_RINGS", 1);
    if (u->rings < 1 || u->rings > 64)
      u->rings = 1;
    t->impl = u;
    t->ops = &ucx_ops;
    t->backend = ZPP_BACKEND_UCX;
    u->ep = calloc((size_t)t->size, sizeof *u->ep);
    u->ep_fail = calloc((size_t)t->size, sizeof *u->ep_fail);
    if (u->ep == NULL || u->ep_fail == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "endpoints");
  }
  if (st == ZPP_OK)
    st = local_setup(t, u, &addr, &len);
  /* One exchange of fixed-size records, taken part in also after a local
   * failure, so every rank learns it. */
  mine = calloc(1, rec);
  all = malloc(rec * (size_t)bs->size);
  if (mine == NULL || all == NULL) {
    free(mine);
    free(all);
    if (addr != NULL)
      api.worker_release_address(u->worker, addr);
    return st != ZPP_OK ? st
                        : zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                    "address records");
  }
  {
    addr_hdr_t h = {(int32_t)st, (uint32_t)len};
    memcpy(mine, &h, sizeof h);
    if (st == ZPP_OK)
      memcpy(mine + sizeof h, addr, len);
  }
  if (addr != NULL)
    api.worker_release_address(u->worker, addr);
  xs = bs->allgather(bs->ctx, mine, rec, all, t->timeout_s);
  if (st == ZPP_OK)
    st = xs;
  for (r = 0; st == ZPP_OK && r < bs->size; r++) {
    addr_hdr_t h;
    memcpy(&h, all + (size_t)r * rec, sizeof h);
    if (h.status != ZPP_OK)
      st = zpp_error((zpp_status_t)h.status, __func__,
                     "rank %d could not start UCX; see its log", r);
  }
  for (r = 0; st == ZPP_OK && r < t->size; r++) {
    ucp_ep_params_t ep;
    ucs_status_t s;
    if (r == t->rank)
      continue;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)(all + (size_t)r * rec +
                                         sizeof(addr_hdr_t));
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_ep_error;
    ep.err_handler.arg = u;
    s = api.ep_create(u->worker, &ep, &u->ep[r]);
    if (s != UCS_OK) {
      u->ep[r] = NULL;
      st = zpp_error(ZPP_ERR_SYSTEM, __func__,
                     "rank %d is unreachable over UCX: ucp_ep_create: %s "
                     "(UCX_TLS selects the transports; a shared-memory "
                     "transport alone cannot reach another host, and cma "
                     "needs a companion such as posix or tcp)",
                     r, api.status_string(s));
    }
  }
  free(mine);
  free(all);
  if (st == ZPP_OK && t->memory == ZPP_MEMORY_DEVICE)
    ZPP_INFO(ZPP_SUBSYS_NET, "UCX backend: device memory is staged through "
             "host buffers (this UCX has no CUDA transports in use by zpp)");
  return st;
}

#else /* no UCX headers at build time */

int zpp_transport_ucx_available(char *why, size_t len) {
  if (why != NULL)
    snprintf(why, len, "zpp was built without the UCX headers (libucx-dev)");
  return 0;
}

zpp_status_t zpp_transport_ucx_create(zpp_transport_t *t,
                                      const zpp_bootstrap_t *bs,
                                      int cuda_device) {
  (void)t;
  (void)bs;
  (void)cuda_device;
  return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                   "backend UCX: zpp was built without the UCX headers "
                   "(install libucx-dev)");
}

#endif
