/*
 * The MPI adapter (docs/design.md, "Bootstrap"): zpp_comm_create_mpi
 * duplicates the caller's communicator twice with MPI_Comm_idup (one for
 * the bootstrap, one for the transport), offers the first as a bootstrap,
 * adds what only MPI gives -- the thread level, the MPI backend, subsets
 * over duplicates -- and hands over to the generic creation
 * (comm_create.c), which finds the node map from host identities as on
 * every bootstrap.
 *
 * Every wait is bounded by the timeout (ZPP_TIMEOUT_S), also when a rank
 * never arrives or dies: zpp calls no blocking MPI collective.
 * MPI_Comm_dup, MPI_Comm_split and MPI_Comm_split_type have no
 * non-blocking form (a rank missing from them hangs the others for good),
 * so zpp uses MPI_Comm_idup, polled until the timeout, and otherwise only
 * point-to-point messages:
 *   - the bootstrap's exchanges are Isend/Irecv with every member (O(n)
 *     small messages per rank per exchange: creation makes a handful, and
 *     ZPP_CHECK one per collective), so a timeout names exactly the ranks
 *     whose part never came;
 *   - the transport sends every group's messages over one duplicate, the
 *     group in the tag (transport_mpi.c);
 *   - a subset is a duplicate of its parent's bootstrap communicator with
 *     a map from the subset's ranks to MPI ranks.
 * A duplicate whose MPI_Comm_idup timed out cannot be cancelled: its
 * request is left behind (MPI completes it if the late rank comes).
 * The missing ranks of an MPI_Comm_idup cannot be named: zpp has no
 * channel of its own before it completes.
 */
#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "transport/transport_impl.h"

#if ZPP_HAVE_MPI

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zpp/zpp_mpi.h>

/* Buffers and requests of an exchange given up (timeout, abort): MPI may
 * still write into the receive buffers or read the send buffer when the
 * late ranks come, so they live until the bootstrap is freed, and beyond
 * when MPI still holds them then (a leak of a few hundred bytes per
 * failed exchange, on a communicator that is unusable anyway). */
typedef struct orphan {
  struct orphan *next;
  MPI_Request *req;
  int nreq;
  void *sbuf, *rbuf;
} orphan_t;

typedef struct {
  MPI_Comm comm; /* zpp's duplicate, only for these point-to-point messages */
  int rank, size;
  int *mpi_rank;  /* [size] MPI rank in comm of bootstrap rank r */
  uint32_t seq;   /* exchanges so far (their tags) */
  int tag_ub;
  zpp_status_t broken; /* != ZPP_OK: an exchange failed; all later ones
                          fail at once (their tags would be out of step) */
  char broken_why[320];
  const atomic_int *abort; /* the communicator's broken flag, once made */
  orphan_t *orphans;
} mpi_boot_t;

typedef struct {
  MPI_Comm world; /* zpp's duplicate for the transport */
  mpi_boot_t boot;
} mpi_creator_t;

/* ---- the bootstrap: point-to-point exchanges ------------------------------ */

static int mpi_finalized(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin;
}

static void orphans_free(mpi_boot_t *b) {
  while (b->orphans != NULL) {
    orphan_t *o = b->orphans;
    int done = 0, i;
    b->orphans = o->next;
    if (!mpi_finalized())
      MPI_Testall(o->nreq, o->req, &done, MPI_STATUSES_IGNORE);
    if (done) {
      free(o->sbuf);
      free(o->rbuf);
    } else if (!mpi_finalized()) {
      /* MPI still owns them: leave the buffers to it (see orphan_t). */
      for (i = 0; i < o->nreq; i++)
        if (o->req[i] != MPI_REQUEST_NULL)
          MPI_Request_free(&o->req[i]);
    }
    free(o->req);
    free(o);
  }
}

static void boot_release(mpi_boot_t *b) {
  orphans_free(b);
  if (b->comm != MPI_COMM_NULL && !mpi_finalized())
    MPI_Comm_free(&b->comm);
  b->comm = MPI_COMM_NULL;
  free(b->mpi_rank);
  b->mpi_rank = NULL;
}

/* A failed exchange: receives are cancelled, the rest is kept (orphan_t),
 * and the bootstrap refuses every later exchange with this error. */
static zpp_status_t give_up(mpi_boot_t *b, MPI_Request *req, int nreq,
                            int nrecv, void *sbuf, void *rbuf,
                            zpp_status_t st) {
  orphan_t *o = calloc(1, sizeof *o);
  int i;
  for (i = 0; i < nrecv; i++)
    if (req[i] != MPI_REQUEST_NULL)
      MPI_Cancel(&req[i]);
  if (o != NULL) {
    o->req = req;
    o->nreq = nreq;
    o->sbuf = sbuf;
    o->rbuf = rbuf;
    o->next = b->orphans;
    b->orphans = o;
  } else {
    for (i = 0; i < nreq; i++)
      if (req[i] != MPI_REQUEST_NULL)
        MPI_Request_free(&req[i]);
    free(req); /* the buffers stay to MPI */
  }
  b->broken = st;
  snprintf(b->broken_why, sizeof b->broken_why, "%s", zpp_get_last_error());
  return st;
}

/* One exchange: my `bytes` of sbuf to every rank in `to`, and `bytes` from
 * every rank in `from` into rbuf + r * bytes; complete when every transfer
 * is, bounded by the timeout and the communicator's abort. */
static zpp_status_t exchange(mpi_boot_t *b, const char *what, const void *mine,
                             size_t bytes, int root, void *out,
                             double timeout_s) {
  int n = b->size, me = b->rank, r, rc, nreq = 0, nrecv = 0;
  int tag = (int)(b->seq++ % ((uint32_t)b->tag_ub + 1));
  int64_t deadline = timeout_s > 0
                         ? zpp_time_ns() + (int64_t)(timeout_s * 1e9)
                         : INT64_MAX;
  long ns = 1000;
  MPI_Request *req;
  int *from, *idx, left;
  char *sbuf = NULL, *rbuf = NULL;
  zpp_status_t st = ZPP_OK;
  if (b->broken != ZPP_OK)
    return zpp_error(b->broken, what,
                     "the MPI bootstrap is unusable after an earlier failure "
                     "(%s)",
                     b->broken_why);
  if (bytes > (size_t)INT32_MAX || (size_t)n > SIZE_MAX / (bytes + 1))
    return zpp_error(ZPP_ERR_OVERFLOW, what, "%zu bytes from %d ranks", bytes,
                     n);
  req = malloc(2 * (size_t)n * sizeof *req);
  from = malloc(4 * (size_t)n * sizeof *from); /* and idx */
  idx = from + 2 * (size_t)n;
  sbuf = malloc(bytes + 1);
  rbuf = malloc(bytes * (size_t)n + 1);
  if (req == NULL || from == NULL || sbuf == NULL || rbuf == NULL) {
    free(req);
    free(from);
    free(sbuf);
    free(rbuf);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "%zu bytes", bytes);
  }
  if (bytes > 0 && mine != NULL)
    memcpy(sbuf, mine, bytes);
  /* receives first, then sends (root < 0: everyone to everyone) */
  for (r = 0; r < n && st == ZPP_OK; r++) {
    if (r == me || (root >= 0 && r != root))
      continue;
    rc = MPI_Irecv(rbuf + (size_t)r * bytes, (int)bytes, MPI_BYTE,
                   b->mpi_rank[r], tag, b->comm, &req[nreq]);
    if (rc != MPI_SUCCESS)
      st = zpp_mpi_error(rc, what, "MPI_Irecv");
    else
      from[nreq++] = r;
  }
  nrecv = nreq;
  for (r = 0; r < n && st == ZPP_OK; r++) {
    if (r == me || (root >= 0 && me != root))
      continue;
    rc = MPI_Isend(sbuf, (int)bytes, MPI_BYTE, b->mpi_rank[r], tag, b->comm,
                   &req[nreq]);
    if (rc != MPI_SUCCESS)
      st = zpp_mpi_error(rc, what, "MPI_Isend");
    else
      from[nreq++] = r;
  }
  left = nreq;
  while (st == ZPP_OK && left > 0) {
    int got = 0;
    rc = MPI_Testsome(nreq, req, &got, idx, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      st = zpp_mpi_error(rc, what, "MPI_Testsome");
      break;
    }
    if (got == MPI_UNDEFINED)
      break; /* every request inactive */
    left -= got;
    if (left <= 0)
      break;
    if (got > 0) {
      ns = 1000;
      continue;
    }
    if (b->abort != NULL && atomic_load(b->abort)) {
      st = zpp_error(ZPP_ERR_ABORTED, what,
                     "the communicator was aborted during a bootstrap "
                     "exchange");
      break;
    }
    if (zpp_time_ns() > deadline) {
      /* the ranks whose part never came; else those that did not take
       * mine (a send waits for its receiver) */
      char who[200] = "";
      size_t used = 0;
      int k, cnt = 0, recv_missing = 0;
      for (k = 0; k < nrecv; k++)
        recv_missing |= req[k] != MPI_REQUEST_NULL;
      for (k = recv_missing ? 0 : nrecv; k < (recv_missing ? nrecv : nreq);
           k++) {
        if (req[k] == MPI_REQUEST_NULL || used + 12 >= sizeof who)
          continue;
        cnt++;
        used += (size_t)snprintf(who + used, sizeof who - used, "%s%d",
                                 used ? ", " : "", from[k]);
      }
      st = zpp_error(ZPP_ERR_TIMEOUT, what,
                     "rank %d: %s %s did not %s bootstrap exchange %u within "
                     "%.3g s (ZPP_TIMEOUT_S): missing, stopped or failed",
                     me, cnt > 1 ? "ranks" : "rank", who,
                     recv_missing ? "take part in" : "receive its part of",
                     b->seq - 1, timeout_s);
      break;
    }
    zpp_pause_ns(&ns);
  }
  free(from);
  if (st != ZPP_OK && nreq > 0)
    return give_up(b, req, nreq, nrecv, sbuf, rbuf, st);
  if (st == ZPP_OK && out != NULL && bytes > 0) {
    if (root < 0) {
      memcpy(rbuf + (size_t)me * bytes, sbuf, bytes);
      memcpy(out, rbuf, bytes * (size_t)n);
    } else if (me != root) {
      memcpy(out, rbuf + (size_t)root * bytes, bytes);
    }
  }
  if (st != ZPP_OK) { /* failed before anything was posted */
    b->broken = st;
    snprintf(b->broken_why, sizeof b->broken_why, "%s", zpp_get_last_error());
  }
  free(req);
  free(sbuf);
  free(rbuf);
  return st;
}

static zpp_status_t bs_allgather(void *ctx, const void *mine, size_t bytes,
                                 void *all, double timeout_s) {
  return exchange(ctx, "bootstrap allgather", mine, bytes, -1, all,
                  timeout_s);
}

static zpp_status_t bs_bcast(void *ctx, void *buf, size_t bytes, int root,
                             double timeout_s) {
  mpi_boot_t *b = ctx;
  if (root < 0 || root >= b->size)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, "bootstrap bcast",
                     "root %d: must be in [0, %d)", root, b->size);
  return exchange(ctx, "bootstrap bcast", buf, bytes, root, buf, timeout_s);
}

static zpp_status_t bs_barrier(void *ctx, double timeout_s) {
  return exchange(ctx, "bootstrap barrier", NULL, 0, -1, NULL, timeout_s);
}

/* ---- duplicates -------------------------------------------------------------- */

/* MPI_Comm_idup of `comm` into out[0..k), polled until the timeout. */
static zpp_status_t idup(MPI_Comm comm, int k, MPI_Comm *out, double timeout_s,
                         const char *func) {
  MPI_Request req[2];
  int64_t deadline = timeout_s > 0
                         ? zpp_time_ns() + (int64_t)(timeout_s * 1e9)
                         : INT64_MAX;
  long ns = 1000;
  int i, rc, done = 0;
  for (i = 0; i < k; i++) {
    out[i] = MPI_COMM_NULL;
    req[i] = MPI_REQUEST_NULL;
  }
  for (i = 0; i < k; i++) {
    rc = MPI_Comm_idup(comm, &out[i], &req[i]);
    if (rc != MPI_SUCCESS) {
      /* The others wait in theirs and time out.  The duplications started
       * here stay pending: their communicators may not be used or freed
       * before they complete, so they are left to MPI (as on a timeout). */
      for (i = 0; i < k; i++)
        out[i] = MPI_COMM_NULL;
      return zpp_mpi_error(rc, func, "MPI_Comm_idup");
    }
  }
  for (;;) {
    rc = MPI_Testall(k, req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
      return zpp_mpi_error(rc, func, "MPI_Comm_idup (MPI_Testall)");
    if (done) {
      for (i = 0; i < k; i++)
        MPI_Comm_set_errhandler(out[i], MPI_ERRORS_RETURN);
      return ZPP_OK;
    }
    if (zpp_time_ns() > deadline) {
      /* A non-blocking collective can be neither cancelled nor freed
       * (MPI forbids both): its request is dropped, left to MPI with its
       * duplicate (never used); one that completed is freed. */
      for (i = 0; i < k; i++) {
        if (req[i] == MPI_REQUEST_NULL && out[i] != MPI_COMM_NULL)
          MPI_Comm_free(&out[i]);
        out[i] = MPI_COMM_NULL;
      }
      return zpp_error(ZPP_ERR_TIMEOUT, func,
                       "MPI_Comm_idup: not every rank of the MPI communicator "
                       "took part within %.3g s (ZPP_TIMEOUT_S); MPI does not "
                       "say which is missing",
                       timeout_s);
    }
    zpp_pause_ns(&ns);
  }
}

static double timeout_of(const zpp_comm_config_t *cfg) {
  if (cfg != NULL && cfg->struct_size >= ZPP_COMM_CONFIG_V1_SIZE &&
      cfg->timeout_s > 0)
    return zpp_timeout_clamp(cfg->timeout_s);
  return zpp_timeout_clamp(zpp_setting_double("ZPP_TIMEOUT_S", 300.0));
}

/* ---- the creator ------------------------------------------------------------ */

static void creator_free(mpi_creator_t *m) {
  if (m == NULL)
    return;
  boot_release(&m->boot);
  if (m->world != MPI_COMM_NULL && !mpi_finalized())
    MPI_Comm_free(&m->world);
  free(m);
}

static void release_mpi(zpp_comm_t c) {
  creator_free(c->creator);
  c->creator = NULL;
}

static zpp_status_t mpi_transport(zpp_transport_t *t, void *state,
                                  int cuda_device) {
  mpi_creator_t *m = state;
  return zpp_transport_mpi_create(t, m->world, m->boot.mpi_rank, cuda_device);
}

static zpp_status_t mpi_split(zpp_comm_t parent, zpp_status_t st, int color,
                              const int *members, int n, int me,
                              const zpp_comm_config_t *cfg, zpp_comm_t *out);

/* Duplicates of `comm` (MPI ranks mpi_rank[0..size) are this
 * communicator's ranks, NULL: all of comm in order), then the generic
 * creation.  Collective over every rank of comm (also the ones not in the
 * map, which pass size 0 and return after the duplication). */
static zpp_status_t create_over(MPI_Comm comm, const int *mpi_rank, int size,
                                int rank, const zpp_comm_config_t *cfg,
                                const char *func, zpp_comm_t *out) {
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  zpp_creator_t cr;
  mpi_creator_t *mc = calloc(1, sizeof *mc);
  MPI_Comm dups[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  double timeout = timeout_of(cfg);
  int level = 0, r, flag = 0, *ub = NULL;
  zpp_status_t st;

  /* Every rank takes part in the duplication, whatever happened (a rank
   * that could not allocate fails after it: the others then time out in
   * the first exchange of the creation, naming it). */
  st = idup(comm, 2, dups, timeout, func);
  if (st == ZPP_OK && size > 0 &&
      (mc == NULL ||
       (mc->boot.mpi_rank = malloc((size_t)size * sizeof(int))) == NULL))
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "communicator");
  if (st != ZPP_OK || size == 0) { /* size 0: not a member */
    if (dups[0] != MPI_COMM_NULL)
      MPI_Comm_free(&dups[0]);
    if (dups[1] != MPI_COMM_NULL)
      MPI_Comm_free(&dups[1]);
    if (mc != NULL)
      free(mc->boot.mpi_rank);
    free(mc);
    return st;
  }
  mc->boot.comm = dups[0];
  mc->world = dups[1];
  mc->boot.rank = rank;
  mc->boot.size = size;
  for (r = 0; r < size; r++)
    mc->boot.mpi_rank[r] = mpi_rank != NULL ? mpi_rank[r] : r;
  MPI_Comm_get_attr(mc->boot.comm, MPI_TAG_UB, &ub, &flag);
  mc->boot.tag_ub = flag && ub != NULL && *ub > 0 ? *ub : 32767;

  memset(&cr, 0, sizeof cr);
  cr.name = "mpi";
  /* What the collectives may do with threads (transport.h,
   * zpp_comm_thread_caps): the engine thread that runs started
   * collectives calls MPI while the caller may call MPI too, which needs
   * MPI_THREAD_MULTIPLE.  Blocking collectives (and chunked, pipelined
   * ones) run on the calling thread and need nothing more. */
  MPI_Query_thread(&level);
  cr.thread_caps = level >= MPI_THREAD_MULTIPLE ? ZPP_THREADS_PROGRESS : 0;
  if (level < MPI_THREAD_MULTIPLE)
    ZPP_INFO(ZPP_SUBSYS_NET,
             "MPI thread level %d: started collectives run to completion "
             "when started (asynchrony needs MPI_THREAD_MULTIPLE)",
             level);
  /* No host key: the node map comes from host identities (host name, boot
   * id, network namespace), as on every bootstrap; MPI's own
   * (MPI_Comm_split_type) cannot be bounded by a timeout. */
  cr.mpi_transport = mpi_transport;
  cr.split = mpi_split;
  cr.release = release_mpi;
  cr.state = mc;

  bs.name = "mpi";
  bs.rank = rank;
  bs.size = size;
  bs.ctx = &mc->boot;
  bs.allgather = bs_allgather;
  bs.bcast = bs_bcast;
  bs.barrier = bs_barrier;
  st = zpp_comm_create_with(&bs, cfg, &cr, func, out);
  if (st != ZPP_OK) {
    creator_free(mc);
    return st;
  }
  /* From now on zpp_comm_abort ends the bootstrap's waits too. */
  mc->boot.abort = &(*out)->tr->broken;
  return ZPP_OK;
}

/* Subsets: every rank of the parent duplicates the parent's bootstrap
 * communicator (only point-to-point traffic runs there, so the
 * duplication cannot cross a collective of the parent), the members keep
 * theirs with the map of the subset's ranks to MPI ranks. */
static zpp_status_t mpi_split(zpp_comm_t parent, zpp_status_t st, int color,
                              const int *members, int n, int me,
                              const zpp_comm_config_t *cfg, zpp_comm_t *out) {
  mpi_creator_t *pm = parent->creator;
  int *map = NULL, i, nmpi = 0;
  zpp_status_t xs;
  *out = NULL;
  if (pm->boot.broken != ZPP_OK) /* nobody gets past a failed exchange */
    return st != ZPP_OK ? st
                        : zpp_error(pm->boot.broken, "zpp_comm_split",
                                    "the parent's bootstrap failed (%s)",
                                    pm->boot.broken_why);
  /* The duplication below is collective over every rank of the parent's
   * MPI communicator.  A subset shares that communicator with the other
   * ranks of its parent (its siblings), which do not take part here: the
   * duplication would wait for them until the timeout.  Every rank of
   * the parent sees the same sizes, so all fail here alike, at once. */
  MPI_Comm_size(pm->boot.comm, &nmpi);
  if (nmpi != pm->boot.size)
    return st != ZPP_OK
               ? st
               : zpp_error(ZPP_ERR_UNSUPPORTED, "zpp_comm_split",
                           "comm is a subset of %d of the %d ranks of its MPI "
                           "communicator (made by zpp_comm_split or "
                           "zpp_comm_create_from_ranks): under MPI it cannot "
                           "be split again (a communicator of a subset's "
                           "ranks has no MPI form bounded by a timeout); "
                           "split the communicator of zpp_comm_create_mpi "
                           "instead",
                           pm->boot.size, nmpi);
  if (st == ZPP_OK && color != ZPP_SPLIT_NONE) {
    map = malloc((size_t)n * sizeof *map);
    if (map == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, "zpp_comm_split", "rank map");
    for (i = 0; map != NULL && i < n; i++)
      map[i] = pm->boot.mpi_rank[members[i]];
  }
  /* A rank that failed still duplicates (as a non-member). */
  xs = create_over(pm->boot.comm, map,
                   st == ZPP_OK && color != ZPP_SPLIT_NONE ? n : 0, me, cfg,
                   "zpp_comm_split", out);
  free(map);
  return st != ZPP_OK ? st : xs;
}

zpp_status_t zpp_comm_create_mpi(MPI_Comm comm, const zpp_comm_config_t *cfg,
                                 zpp_comm_t *out) {
  int init = 0, fin = 0, rank = 0, size = 0;
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "comm: MPI is %s; call MPI_Init first",
                     fin ? "finalised" : "not initialised");
  if (comm == MPI_COMM_NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "comm is MPI_COMM_NULL");
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  zpp_log_set_rank(rank);
  return create_over(comm, NULL, size, rank, cfg, __func__, out);
}

zpp_status_t zpp_comm_get_mpi_comm(zpp_comm_t comm, MPI_Comm *out) {
  mpi_creator_t *m;
  int n = 0, r;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (comm->release != release_mpi)
    return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                     "comm was not created from MPI");
  m = comm->creator;
  MPI_Comm_size(m->world, &n);
  if (n != comm->tr->size)
    return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                     "comm is a subset of %d of %d ranks (zpp_comm_split): "
                     "zpp keeps no MPI communicator of exactly its ranks "
                     "(MPI_Comm_split cannot be bounded by a timeout)",
                     comm->tr->size, n);
  /* All the ranks, reordered by a split: MPI's ranks are not comm's. */
  for (r = 0; r < n; r++)
    if (m->boot.mpi_rank[r] != r)
      return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                       "comm's rank %d is rank %d of the MPI communicator "
                       "(reordered by zpp_comm_split): zpp keeps no MPI "
                       "communicator of its ranks in its order",
                       r, m->boot.mpi_rank[r]);
  *out = m->world;
  return ZPP_OK;
}

#endif /* ZPP_HAVE_MPI */
