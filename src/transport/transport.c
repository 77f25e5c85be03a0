/*
 * The generic half of every transport: groups, call and byte counters,
 * link emulation, errors and queries.  Backends (transport_mpi.c,
 * transport_ucx.c, transport_nccl.c) only move bytes; transfers are
 * checked and dispatched by src/algo/xfer.c.
 */
#include "transport/transport_impl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *zpp_xfer_name(zpp_xfer_kind_t kind) {
  static const char *const names[ZPP_XFER_NKINDS] = {
      "allgather",      "allgatherv", "alltoall", "alltoallv",
      "reduce_scatter", "allreduce",  "barrier"};
  return (unsigned)kind < ZPP_XFER_NKINDS ? names[kind] : "transfer";
}

double zpp_timeout_clamp(double timeout_s) {
  return timeout_s > ZPP_TIMEOUT_MAX_S ? ZPP_TIMEOUT_MAX_S : timeout_s;
}

/* ---- init / teardown ------------------------------------------------------ */

static zpp_linkclass_t link_class(const zpp_transport_t *t, int peer) {
  return zpp_topo_link(t->topo, t->rank, peer) == ZPP_LINK_NET
             ? ZPP_LINKCLASS_INTER
             : ZPP_LINKCLASS_INTRA;
}

/* The node runs of a group's ring order (transport_impl.h). */
static zpp_status_t group_nodes(const zpp_topo_t *topo, zpp_tgroup_t *gr) {
  int n = gr->size, i, k = 0;
  gr->hoff = malloc((size_t)(n + 1) * sizeof(int));
  gr->hnode = malloc((size_t)n * sizeof(int));
  gr->hlocal = malloc((size_t)n * sizeof(int));
  if (gr->hoff == NULL || gr->hnode == NULL || gr->hlocal == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "zpp_transport_init",
                     "group node tables");
  for (i = 0; i < n; i++) {
    int m = gr->ring[i];
    if (i == 0 || topo->node_of[gr->members[m]] !=
                      topo->node_of[gr->members[gr->ring[i - 1]]])
      gr->hoff[k++] = i;
    gr->hnode[m] = k - 1;
    gr->hlocal[m] = i - gr->hoff[k - 1];
  }
  gr->hoff[k] = n;
  gr->nh = k;
  return ZPP_OK;
}

zpp_status_t zpp_transport_init(zpp_transport_t *t, zpp_topo_t *topo,
                                int rank, zpp_memory_t memory,
                                double timeout_s) {
  int g, i;
  memset(t, 0, sizeof *t);
  t->topo = topo;
  t->rank = rank;
  t->size = topo->world_size;
  t->memory = memory;
  t->timeout_s = zpp_timeout_clamp(timeout_s);
  pthread_mutex_init(&t->lock, NULL);
  pthread_mutex_init(&t->err_lock, NULL);
  zpp_scratch_init(&t->scratch);
  for (g = 0; g < ZPP_NGROUPS; g++) {
    zpp_tgroup_t *gr = &t->grp[g];
    ZPP_CHECK(zpp_topo_group(topo, (zpp_group_t)g, rank, NULL, &gr->size,
                             &gr->index));
    gr->members = malloc((size_t)gr->size * sizeof(int));
    gr->ring = malloc((size_t)gr->size * sizeof(int));
    if (gr->members == NULL || gr->ring == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "group tables");
    ZPP_CHECK(zpp_topo_group(topo, (zpp_group_t)g, rank, gr->members, NULL,
                             NULL));
    /* NODE and CROSS members are already in node order; WORLD members are
     * in world-rank order, which a round-robin placement interleaves. */
    if (g == ZPP_GROUP_WORLD)
      memcpy(gr->ring, topo->node_ranks, (size_t)gr->size * sizeof(int));
    else
      for (i = 0; i < gr->size; i++)
        gr->ring[i] = i;
    ZPP_CHECK(group_nodes(topo, gr));
  }
  t->emu_gbit = zpp_setting_double("ZPP_EMU_INTER_GBIT", 0.0);
  t->emu_lat_us = zpp_setting_double("ZPP_EMU_INTER_LAT_US", 0.0);
  if (t->emu_gbit < 0 || t->emu_lat_us < 0) {
    ZPP_WARN(ZPP_SUBSYS_NET, "negative ZPP_EMU_INTER_GBIT/ZPP_EMU_INTER_LAT_US "
             "ignored");
    t->emu_gbit = t->emu_gbit < 0 ? 0 : t->emu_gbit;
    t->emu_lat_us = t->emu_lat_us < 0 ? 0 : t->emu_lat_us;
  }
  t->emu_on = t->emu_gbit > 0 || t->emu_lat_us > 0;
  t->algorithm = ZPP_ALGORITHM_HIER; /* comm_create sets the agreed one */
  t->hier_chunk = 262144; /* and the agreed ZPP_HIER_CHUNK */
  t->net_seg = 0;         /* and the agreed ZPP_NET_SEGMENT */
  t->cuda_device = -1;
  t->spin_ns = zpp_setting_long("ZPP_NET_SPIN_US", 100000) * 1000;
  if (t->spin_ns < 0)
    t->spin_ns = 0;
  t->rings = (int)zpp_setting_long("ZPP_NET_RINGS", 1);
  if (t->rings < 1 || t->rings > 64) {
    ZPP_WARN(ZPP_SUBSYS_NET, "ZPP_NET_RINGS=%d: must be in [1, 64]; using 1",
             t->rings);
    t->rings = 1;
  }
  return ZPP_OK;
}

void zpp_transport_add_in_doubt(zpp_transport_t *t, int n, const char *what) {
  if (n <= 0)
    return;
  atomic_fetch_add(&t->in_doubt, n);
  zpp_transport_break(t, "%s: %d cancelled transfer(s) may still complete",
                      what, n);
}

int zpp_transport_quiesce(zpp_transport_t *t) {
  int left;
  if (t == NULL)
    return 1;
  left = atomic_load(&t->in_doubt);
  if (left > 0 && t->ops != NULL && t->ops->round != NULL &&
      t->ops->round->round_drain != NULL) {
    double to = t->timeout_s > 0 ? t->timeout_s : 60.0;
    pthread_mutex_lock(&t->lock);
    left = t->ops->round->round_drain(t, zpp_time_ns() + (int64_t)(to * 1e9));
    pthread_mutex_unlock(&t->lock);
    atomic_store(&t->in_doubt, left);
  }
  return left == 0;
}

void zpp_transport_free(zpp_transport_t *t) {
  int g;
  if (t == NULL)
    return;
  /* Held buffers (the scratch's, algo_release's) are freed only once no
   * cancelled transfer can touch them. */
  if (t->ops != NULL)
    zpp_transport_quiesce(t);
  if (t->ops != NULL && t->ops->destroy != NULL)
    t->ops->destroy(t);
  if (t->algo_release != NULL)
    t->algo_release(t);
  zpp_scratch_release(t, !zpp_transport_in_doubt(t));
  for (g = 0; g < ZPP_NGROUPS; g++) {
    free(t->grp[g].members);
    free(t->grp[g].ring);
    free(t->grp[g].hoff);
    free(t->grp[g].hnode);
    free(t->grp[g].hlocal);
  }
  zpp_topo_free(t->topo);
  free(t->pid);
  pthread_mutex_destroy(&t->lock);
  pthread_mutex_destroy(&t->err_lock);
  free(t);
}

static void vbreak(zpp_transport_t *t, zpp_status_t st, const char *fmt,
                   va_list ap) {
  char why[sizeof t->broken_why];
  int first = 0;
  vsnprintf(why, sizeof why, fmt, ap);
  pthread_mutex_lock(&t->err_lock);
  if (!atomic_load(&t->broken)) {
    memcpy(t->broken_why, why, sizeof why);
    t->broken_st = st;
    atomic_store(&t->broken, 1);
    first = 1;
  } else if (t->broken_st == ZPP_OK) {
    t->broken_st = st; /* the first break did not know its status */
  }
  pthread_mutex_unlock(&t->err_lock);
  if (first)
    ZPP_WARN(ZPP_SUBSYS_NET, "communicator unusable: %s", why);
}

void zpp_transport_break(zpp_transport_t *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vbreak(t, ZPP_OK, fmt, ap);
  va_end(ap);
}

void zpp_transport_break_st(zpp_transport_t *t, zpp_status_t st,
                            const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vbreak(t, st, fmt, ap);
  va_end(ap);
}

zpp_status_t zpp_transport_size_mismatch(zpp_transport_t *t, zpp_group_t g,
                                         int peer, const char *got,
                                         size_t want) {
  zpp_transport_break_st(t, ZPP_ERR_MISMATCH,
                         "group %s: rank %d sent %s where %zu bytes were "
                         "expected",
                         zpp_group_name(g), peer, got, want);
  return zpp_error(ZPP_ERR_MISMATCH, "round",
                   "group %s: rank %d sent %s where %zu bytes were expected "
                   "(ranks passed different sizes); the communicator is "
                   "aborted",
                   zpp_group_name(g), peer, got, want);
}

zpp_status_t zpp_transport_broken_error(zpp_transport_t *t, const char *func) {
  zpp_status_t st;
  char why[sizeof t->broken_why];
  if (t == NULL || !atomic_load(&t->broken))
    return ZPP_OK;
  pthread_mutex_lock(&t->err_lock);
  st = t->broken_st != ZPP_OK ? t->broken_st : ZPP_ERR_TIMEOUT;
  memcpy(why, t->broken_why, sizeof why);
  pthread_mutex_unlock(&t->err_lock);
  return zpp_transport_fail(
      t, zpp_error(st, func,
                   "communicator was aborted earlier (%s); destroy it", why));
}

int zpp_transport_is_broken(const zpp_transport_t *t) {
  return t != NULL && atomic_load(&t->broken);
}

/* 'T' (stopped), 't' (traced) ... from /proc/<pid>/stat; 0 if unknown. */
static char proc_state(int pid) {
  char path[64], line[256], *p;
  FILE *f;
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  f = fopen(path, "r");
  if (f == NULL)
    return 0;
  p = fgets(line, sizeof line, f);
  fclose(f);
  if (p == NULL || (p = strrchr(line, ')')) == NULL || p[1] != ' ')
    return 0;
  return p[2];
}

void zpp_transport_describe_peers(const zpp_transport_t *t, char *buf,
                                  size_t len) {
  size_t used = strnlen(buf, len);
  int r;
  if (t == NULL || t->pid == NULL)
    return;
  for (r = 0; r < t->size && used + 48 < len; r++) {
    const char *what = NULL;
    char s;
    if (r == t->rank || t->pid[r] <= 0)
      continue;
    if (kill(t->pid[r], 0) != 0 && errno == ESRCH)
      what = "is gone (exited or killed)";
    else if ((s = proc_state(t->pid[r])) == 'T' || s == 't')
      what = "is stopped";
    else if (s == 'Z' || s == 'X')
      what = "is gone (exited or killed)";
    if (what != NULL)
      used += (size_t)snprintf(buf + used, len - used, "; rank %d (pid %d) %s",
                               r, t->pid[r], what);
  }
}

/* ---- link emulation ------------------------------------------------------- */

int64_t zpp_transport_emu_deadline(zpp_transport_t *t, int peer,
                                   uint64_t bytes) {
  int64_t now, start, xfer;
  double x;
  if (!t->emu_on || link_class(t, peer) != ZPP_LINKCLASS_INTER)
    return 0;
  now = zpp_time_ns();
  /* Gbit/s is bits per nanosecond.  A tiny bandwidth (the setting allows
   * any value in [0, 1e6]) must not overflow the conversion: a transfer
   * lasts at most ~30 years of emulated time. */
  x = t->emu_gbit > 0 ? (double)bytes * 8.0 / t->emu_gbit + 0.5 : 0.0;
  xfer = x < 1e18 ? (int64_t)x : (int64_t)1e18;
  start = now > t->nic_free_ns ? now : t->nic_free_ns;
  /* transfers queue on the NIC: keep their sum from overflowing too
   * (the timeout ends such a wait long before) */
  t->nic_free_ns = start < (int64_t)4e18 - xfer ? start + xfer : (int64_t)4e18;
  return t->nic_free_ns + (int64_t)(t->emu_lat_us * 1000.0 + 0.5);
}

void zpp_transport_emu_wait(zpp_transport_t *t, int64_t deadline_ns) {
  int64_t now;
  if (deadline_ns <= 0)
    return;
  now = zpp_time_ns();
  if (deadline_ns <= now)
    return;
  zpp_sleep_until_ns(deadline_ns);
  atomic_fetch_add(&t->emu_wait_ns, (uint_fast64_t)(zpp_time_ns() - now));
}

/* ---- accounting ------------------------------------------------------------ */

void zpp_transport_account(zpp_transport_t *t, int peer, uint64_t sent,
                           uint64_t recv) {
  zpp_linkclass_t c;
  if (t == NULL || peer == t->rank || peer < 0 || peer >= t->size)
    return;
  c = link_class(t, peer);
  if (sent)
    atomic_fetch_add(&t->sent[c], sent);
  if (recv)
    atomic_fetch_add(&t->recv[c], recv);
}

void zpp_transport_get_counts(zpp_transport_t *t, zpp_transport_counts_t *out) {
  int i;
  for (i = 0; i < ZPP_NLINKCLASSES; i++) {
    out->sent[i] = atomic_load(&t->sent[i]);
    out->recv[i] = atomic_load(&t->recv[i]);
  }
  for (i = 0; i < ZPP_NGROUPS; i++)
    out->calls[i] = atomic_load(&t->calls[i]);
}

void zpp_transport_reset_counts(zpp_transport_t *t) {
  int i;
  for (i = 0; i < ZPP_NLINKCLASSES; i++) {
    atomic_store(&t->sent[i], 0);
    atomic_store(&t->recv[i], 0);
  }
  for (i = 0; i < ZPP_NGROUPS; i++)
    atomic_store(&t->calls[i], 0);
  atomic_store(&t->emu_wait_ns, 0);
}

/* ---- errors ----------------------------------------------------------------- */

zpp_status_t zpp_transport_fail(zpp_transport_t *t, zpp_status_t st) {
  if (t != NULL && st != ZPP_OK) {
    pthread_mutex_lock(&t->err_lock);
    snprintf(t->last_error, sizeof t->last_error, "%s", zpp_get_last_error());
    pthread_mutex_unlock(&t->err_lock);
  }
  return st;
}

/* ---- queries ---------------------------------------------------------------- */

int zpp_transport_rank(const zpp_transport_t *t) { return t->rank; }
int zpp_transport_size(const zpp_transport_t *t) { return t->size; }
int zpp_transport_qgz_sum_int(const zpp_transport_t *t) {
  return t->qgz_sum_int;
}

const zpp_topo_t *zpp_transport_topo(const zpp_transport_t *t) {
  return t->topo;
}
zpp_backend_t zpp_transport_backend(const zpp_transport_t *t) {
  return t->backend;
}
double zpp_transport_timeout_s(const zpp_transport_t *t) {
  return t->timeout_s;
}
uint64_t zpp_transport_progress(const zpp_transport_t *t) {
  return (uint64_t)atomic_load(&((zpp_transport_t *)t)->progress);
}

static int group_ok(zpp_group_t g) {
  return g == ZPP_GROUP_WORLD || g == ZPP_GROUP_NODE || g == ZPP_GROUP_CROSS;
}

int zpp_transport_group_size(const zpp_transport_t *t, zpp_group_t g) {
  return group_ok(g) ? t->grp[g].size : -1;
}
int zpp_transport_group_rank(const zpp_transport_t *t, zpp_group_t g) {
  return group_ok(g) ? t->grp[g].index : -1;
}
int zpp_transport_group_member(const zpp_transport_t *t, zpp_group_t g,
                               int i) {
  if (!group_ok(g) || i < 0 || i >= t->grp[g].size)
    return -1;
  return t->grp[g].members[i];
}
zpp_link_t zpp_transport_link(const zpp_transport_t *t, int peer) {
  if (peer < 0 || peer >= t->size)
    return ZPP_LINK_NET;
  return zpp_topo_link(t->topo, t->rank, peer);
}

/* ---- the build's features (public: zpp.h) -------------------------------- */

zpp_status_t zpp_get_build_features(unsigned *features) {
  unsigned f = 0;
  if (features == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "features is NULL");
#if ZPP_HAVE_CUDA_KERNELS
  f |= ZPP_HAVE_CUDA_EMU ? ZPP_FEATURE_CUDA_EMU : ZPP_FEATURE_CUDA;
#endif
#if ZPP_HAVE_NCCL
  f |= ZPP_FEATURE_NCCL;
#endif
#if ZPP_HAVE_MPI
  f |= ZPP_FEATURE_MPI;
#endif
  if (zpp_transport_ucx_built())
    f |= ZPP_FEATURE_UCX;
  *features = f;
  return ZPP_OK;
}

/* ---- testing switches, stream sync, asynchronous errors ------------------- */

void zpp_transport_set_p2p_barrier(zpp_transport_t *t, int on) {
  pthread_mutex_lock(&t->lock);
  t->p2p_barrier = on;
  pthread_mutex_unlock(&t->lock);
}

/* The lock guards the broken check only: the backend's wait polls without
 * it (one thread at a time per transport, see transport.h). */
zpp_status_t zpp_transport_sync(zpp_transport_t *t, void *stream) {
  zpp_status_t st = ZPP_OK;
  int broken;
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "transport is NULL");
  if (t->ops->coll == NULL || t->ops->coll->sync == NULL)
    return ZPP_OK;
  pthread_mutex_lock(&t->lock);
  broken = atomic_load(&t->broken);
  pthread_mutex_unlock(&t->lock);
  if (broken)
    return zpp_transport_broken_error(t, __func__);
  st = t->ops->coll->sync(t, stream);
  return zpp_transport_fail(t, st);
}

zpp_status_t zpp_transport_check_async(zpp_transport_t *t, const char *what) {
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, what, "transport is NULL");
  if (atomic_load(&t->broken))
    return zpp_transport_broken_error(t, what);
  if (t->ops->coll == NULL || t->ops->coll->check_async == NULL)
    return ZPP_OK;
  return zpp_transport_fail(t, t->ops->coll->check_async(t, what));
}

int zpp_transport_aborts_device_work(const zpp_transport_t *t) {
  return t->ops != NULL && t->ops->coll != NULL &&
         t->ops->coll->abort_device_work != NULL;
}

void zpp_transport_abort_device_work(zpp_transport_t *t) {
  if (zpp_transport_aborts_device_work(t))
    t->ops->coll->abort_device_work(t);
}

int64_t zpp_transport_spin_ns(const zpp_transport_t *t) { return t->spin_ns; }
