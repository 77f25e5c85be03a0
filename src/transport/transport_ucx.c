/*
 * UCX backend (ucp, tag matching), host memory: the round primitive of
 * src/transport/transport.h over ucp_tag_send_nbx / ucp_tag_recv_nbx (docs/design.md,
 * "Transports", "UCX backend").  The algorithms (rings, pairwise exchange,
 * member-order reduction), byte accounting, link emulation, device
 * staging, timeouts and the waits are src/algo's, as for MPI,
 * so results and byte counts are the MPI backend's bit for bit.
 *
 * libucp.so.0 is opened with dlopen and the symbols used are resolved into
 * a table (like NCCL), so libzpp keeps no link-time dependency on UCX; the
 * build needs ucp.h only.  One ucp_context per process (shared, counted),
 * one ucp_worker per communicator, one endpoint per peer; worker addresses
 * are exchanged over the communicator's bootstrap.
 *
 * Matching: the three groups share the worker's one tag space, so the
 * 64-bit wire tag is  sender's world rank (32 bits) | group (2) | the
 * algorithms' tag (30; t->tag_limit = 2^30), matched with a full mask.
 * Ops in flight at once have different algorithm tags; transfers of one
 * pair, group and tag match in posting order, which UCP's tag matching
 * guarantees for messages of one endpoint (as MPI's non-overtaking rule,
 * which MPI libraries built on UCP rely on).
 *
 * Requests are posted without callbacks and polled (ucp_request_check_status,
 * ucp_tag_recv_request_test) in round_test, which calls
 * ucp_worker_progress once and never blocks; a request released with
 * ucp_request_free gets no later callback, but one still in progress
 * after its cancel (matched) may still write its buffer, which zpp then
 * holds (ucx_round_cancel).  An endpoint error, a failed
 * request or a message of the wrong size fails the round naming the peer
 * and breaks the communicator.
 *
 * Device memory: Debian's UCX is built without CUDA, so device buffers
 * are staged through host memory by src/algo, as on the MPI
 * backend; creation logs that it does so.
 */
#include "transport/transport_impl.h"

#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<ucp/api/ucp.h>)
#define ZPP_HAVE_UCX_HEADERS 1
#endif
#endif

#if ZPP_HAVE_UCX_HEADERS

#include <dlfcn.h>
#include <pthread.h>
#include <ucp/api/ucp.h>

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
  ucs_status_ptr_t (*worker_flush_nbx)(ucp_worker_h, const ucp_request_param_t *);
  ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
  ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
  ucs_status_ptr_t (*tag_send_nbx)(ucp_ep_h, const void *, size_t, ucp_tag_t,
                                   const ucp_request_param_t *);
  ucs_status_ptr_t (*tag_recv_nbx)(ucp_worker_h, void *, size_t, ucp_tag_t,
                                   ucp_tag_t, const ucp_request_param_t *);
  ucs_status_t (*request_check_status)(void *);
  ucs_status_t (*tag_recv_request_test)(void *, ucp_tag_recv_info_t *);
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
  UCX_SYM(worker_flush_nbx, "ucp_worker_flush_nbx");
  UCX_SYM(ep_create, "ucp_ep_create");
  UCX_SYM(ep_close_nbx, "ucp_ep_close_nbx");
  UCX_SYM(tag_send_nbx, "ucp_tag_send_nbx");
  UCX_SYM(tag_recv_nbx, "ucp_tag_recv_nbx");
  UCX_SYM(request_check_status, "ucp_request_check_status");
  UCX_SYM(tag_recv_request_test, "ucp_tag_recv_request_test");
  UCX_SYM(request_cancel, "ucp_request_cancel");
  UCX_SYM(request_free, "ucp_request_free");
  /* libucs, a dependency of libucp: dlsym searches the handle's
   * dependencies too. */
  UCX_SYM(status_string, "ucs_status_string");
  /* The library stays loaded for the life of the process. */
  api.ok = 1;
}

int zpp_transport_ucx_built(void) { return 1; }

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
      /* Tag matching only: the waits are src/algo's (poll, then
       * sleep), so no event fd is needed. */
      p.features = UCP_FEATURE_TAG;
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

/* Wire tag: sender's world rank | group | the algorithms' tag. */
#define TAG_RANK_SHIFT 32
#define TAG_GROUP_SHIFT 30
#define TAG_ALGO_BITS 30
_Static_assert(ZPP_NGROUPS <= 4, "the wire tag has 2 bits for the group");

/* One posted transfer of a round. */
typedef struct {
  void *req;   /* NULL once completed and released */
  int peer;    /* world rank */
  int is_recv;
  size_t bytes;
} ux_t;

struct zpp_round {
  struct zpp_round *next; /* free list */
  ux_t *x;                /* [cap] */
  int n, cap, left;
  zpp_group_t g;
};

typedef struct ucx_impl {
  zpp_transport_t *t;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_ep_h *ep;          /* [size]; NULL for myself */
  volatile int *ep_fail; /* [size] ucs_status_t of an endpoint error, 0 ok */
  zpp_round_t *free_rounds;
} ucx_impl_t;

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  ucx_impl_t *u = arg;
  int r;
  for (r = 0; r < u->t->size; r++)
    if (u->ep[r] == ep)
      u->ep_fail[r] = (int)status;
}

static const char *peer_problem(ucs_status_t s) {
  switch (s) {
  case UCS_ERR_UNREACHABLE: return "unreachable";
  case UCS_ERR_CONNECTION_RESET:
  case UCS_ERR_ENDPOINT_TIMEOUT:
  case UCS_ERR_CANCELED: return "closed the connection (exited?)";
  default: return "failed";
  }
}

static ucp_tag_t wire_tag(int sender, zpp_group_t g, uint32_t tag) {
  return ((ucp_tag_t)(uint32_t)sender << TAG_RANK_SHIFT) |
         ((ucp_tag_t)g << TAG_GROUP_SHIFT) |
         ((ucp_tag_t)tag & ((1ull << TAG_ALGO_BITS) - 1));
}

/* ---- rounds ------------------------------------------------------------------- */

static zpp_round_t *round_get(ucx_impl_t *u, int n) {
  zpp_round_t *r = u->free_rounds;
  if (r != NULL)
    u->free_rounds = r->next;
  else if ((r = calloc(1, sizeof *r)) == NULL)
    return NULL;
  if (n > r->cap) {
    ux_t *x = realloc(r->x, (size_t)n * sizeof *x);
    if (x == NULL) {
      r->next = u->free_rounds;
      u->free_rounds = r;
      return NULL;
    }
    r->x = x;
    r->cap = n;
  }
  r->n = r->left = 0;
  return r;
}

static void round_put(ucx_impl_t *u, zpp_round_t *r) {
  r->next = u->free_rounds;
  u->free_rounds = r;
}

/* Cancels what is pending and releases the handle.  A released request
 * gets no callback, but one UCX had already matched (a rendezvous in
 * progress) or could not cancel still reads or writes its buffer until
 * it completes: returns how many were still in progress after the
 * cancel, so their buffers are held (transport/transport.h).  UCX gives no way
 * to wait for a freed request, so there is no round_drain: they stay in
 * doubt, and zpp's buffers are leaked at destroy. */
static int ucx_round_cancel(zpp_transport_t *t, zpp_round_t *r) {
  ucx_impl_t *u = t->impl;
  int i, left = 0;
  for (i = 0; i < r->n; i++) {
    if (r->x[i].req != NULL) {
      api.request_cancel(u->worker, r->x[i].req);
      if (api.request_check_status(r->x[i].req) == UCS_INPROGRESS)
        left++;
      api.request_free(r->x[i].req);
      r->x[i].req = NULL;
    }
  }
  round_put(u, r);
  return left;
}

/* A failed transfer of a round: the communicator cannot go on (its peers'
 * sequences no longer match), so it is broken, naming the peer. */
static zpp_status_t peer_failed(zpp_transport_t *t, zpp_group_t g,
                                const ux_t *x, ucs_status_t s,
                                const char *cause) {
  /* The peer named may only have closed after another rank died (its
   * destroy closes its endpoints): say which ranks of this machine are
   * gone or stopped. */
  char others[160] = "";
  zpp_transport_describe_peers(t, others, sizeof others);
  zpp_transport_break_st(t, ZPP_ERR_SYSTEM, "group %s: rank %d %s",
                         zpp_group_name(g), x->peer, peer_problem(s));
  return zpp_error(ZPP_ERR_SYSTEM, "round",
                   "group %s: %s rank %d: rank %d %s (UCX %s: %s)%s; the "
                   "communicator is aborted",
                   zpp_group_name(g), x->is_recv ? "receive from" : "send to",
                   x->peer, x->peer, peer_problem(s), cause,
                   api.status_string(s), others);
}

static zpp_status_t post(zpp_transport_t *t, zpp_round_t *r, zpp_group_t g,
                         const zpp_xfer_t *xf, int n, int is_recv) {
  ucx_impl_t *u = t->impl;
  const int *mem = t->grp[g].members;
  ucp_request_param_t prm;
  int i;
  memset(&prm, 0, sizeof prm);
  /* No callback: round_test polls; every post returns a request. */
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.datatype = ucp_dt_make_contig(1);
  for (i = 0; i < n; i++) {
    ux_t *x = &r->x[r->n];
    int peer = mem[xf[i].peer];
    ucs_status_ptr_t q;
    x->req = NULL;
    x->peer = peer;
    x->is_recv = is_recv;
    x->bytes = xf[i].bytes;
    if (peer == t->rank || u->ep[peer] == NULL)
      return zpp_error(ZPP_ERR_INTERNAL, "round_post",
                       "group %s: a transfer to myself (rank %d)",
                       zpp_group_name(g), peer);
    if (u->ep_fail[peer] != 0)
      return peer_failed(t, g, x, (ucs_status_t)u->ep_fail[peer],
                         "endpoint error");
    if (is_recv)
      q = api.tag_recv_nbx(u->worker, xf[i].buf, xf[i].bytes,
                           wire_tag(peer, g, xf[i].tag), ~(ucp_tag_t)0, &prm);
    else
      q = api.tag_send_nbx(u->ep[peer], xf[i].buf, xf[i].bytes,
                           wire_tag(t->rank, g, xf[i].tag), &prm);
    if (UCS_PTR_IS_ERR(q))
      return peer_failed(t, g, x, UCS_PTR_STATUS(q),
                         is_recv ? "ucp_tag_recv_nbx" : "ucp_tag_send_nbx");
    x->req = q;
    r->n++;
  }
  return ZPP_OK;
}

static zpp_status_t ucx_round_post(zpp_transport_t *t, zpp_group_t g,
                                   const zpp_xfer_t *recv, int nrecv,
                                   const zpp_xfer_t *send, int nsend,
                                   zpp_round_t **round) {
  ucx_impl_t *u = t->impl;
  int n = nrecv + nsend;
  zpp_round_t *r = round_get(u, n > 0 ? n : 1);
  zpp_status_t st;
  if (r == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "round_post", "%d requests", n);
  r->g = g;
  st = post(t, r, g, recv, nrecv, 1);
  if (st == ZPP_OK)
    st = post(t, r, g, send, nsend, 0);
  if (st != ZPP_OK) {
    zpp_transport_add_in_doubt(t, ucx_round_cancel(t, r), "round_post");
    return st;
  }
  r->left = r->n;
  *round = r;
  return ZPP_OK;
}

static zpp_status_t ucx_round_test(zpp_transport_t *t, zpp_round_t *r,
                                   int *done) {
  ucx_impl_t *u = t->impl;
  int i, fin = 0;
  *done = 0;
  api.worker_progress(u->worker);
  for (i = 0; i < r->n; i++) {
    ux_t *x = &r->x[i];
    ucp_tag_recv_info_t info;
    ucs_status_t s;
    if (x->req == NULL)
      continue;
    info.length = 0;
    s = x->is_recv ? api.tag_recv_request_test(x->req, &info)
                   : api.request_check_status(x->req);
    if (s == UCS_INPROGRESS) {
      /* An endpoint error matters only for a peer this round still waits
       * on (a peer that finished and closed its endpoints is not one). */
      if (u->ep_fail[x->peer] != 0)
        return peer_failed(t, r->g, x, (ucs_status_t)u->ep_fail[x->peer],
                           "endpoint error");
      continue;
    }
    api.request_free(x->req);
    x->req = NULL;
    r->left--;
    fin++;
    if (s == UCS_ERR_MESSAGE_TRUNCATED && x->is_recv)
      return zpp_transport_size_mismatch(t, r->g, x->peer, "more bytes",
                                         x->bytes);
    if (s != UCS_OK)
      return peer_failed(t, r->g, x, s, "request");
    if (x->is_recv && info.length != x->bytes) {
      char got[64];
      snprintf(got, sizeof got, "%zu bytes", (size_t)info.length);
      return zpp_transport_size_mismatch(t, r->g, x->peer, got, x->bytes);
    }
  }
  if (fin > 0)
    zpp_transport_progressed(t);
  if (r->left <= 0) {
    *done = 1;
    round_put(u, r);
  }
  return ZPP_OK;
}

/* The transfers still pending, for the timeout message. */
static void ucx_round_pending(zpp_transport_t *t, const zpp_round_t *r,
                              char *buf, size_t len) {
  size_t used = 0;
  int i;
  if (len > 0)
    buf[0] = '\0';
  for (i = 0; i < r->n && used + 24 < len; i++)
    if (r->x[i].req != NULL)
      used += (size_t)snprintf(buf + used, len - used, "%s%s %d",
                               used ? ", " : "",
                               r->x[i].is_recv ? "from" : "to", r->x[i].peer);
  if (used < len) /* peers of this machine that are gone or stopped */
    zpp_transport_describe_peers(t, buf, len);
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

static void ucx_destroy(zpp_transport_t *t) {
  ucx_impl_t *u = t->impl;
  int r;
  if (u == NULL)
    return;
  if (u->worker != NULL) {
    ucp_request_param_t prm;
    int64_t deadline = zpp_time_ns() + 2000000000;
    memset(&prm, 0, sizeof prm);
    /* Deliver what is queued, then close: gracefully (flushed, the peer
     * told) while the communicator works, so a peer still receiving my
     * last messages or still wiring up its endpoint to me does not see
     * my endpoints vanish first; forcibly once broken (peers may be gone).
     * Both bounded by the deadline. */
    if (!t->broken)
      finish(u, api.worker_flush_nbx(u->worker, &prm), deadline);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = t->broken ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    for (r = 0; u->ep != NULL && r < t->size; r++)
      if (u->ep[r] != NULL)
        finish(u, api.ep_close_nbx(u->ep[r], &prm), deadline);
    api.worker_destroy(u->worker);
  }
  if (u->ctx != NULL)
    context_put();
  while (u->free_rounds != NULL) {
    zpp_round_t *q = u->free_rounds;
    u->free_rounds = q->next;
    free(q->x);
    free(q);
  }
  free(u->ep);
  free((void *)u->ep_fail);
  free(u);
  t->impl = NULL;
}

/* No barrier_post: src/algo's dissemination barrier of 1-byte
 * messages over the rounds is what a UCP barrier would be anyway. */
static const zpp_round_ops_t ucx_rounds = {
    .round_post = ucx_round_post,
    .round_test = ucx_round_test,
    .round_cancel = ucx_round_cancel,
    .round_pending = ucx_round_pending,
};
static const zpp_transport_ops_t ucx_ops = {
    .name = "ucx", .destroy = ucx_destroy, .round = &ucx_rounds};

/* ---- creation --------------------------------------------------------------------- */

#define ADDR_MAX 4096

typedef struct {
  int32_t status;
  uint32_t len;
} addr_hdr_t;

/* Local setup: context, worker, my address. */
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
    t->cuda_device = cuda_device;
    t->tag_limit = 1u << TAG_ALGO_BITS;
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

int zpp_transport_ucx_built(void) { return 0; }

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
