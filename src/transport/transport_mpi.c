/*
 * MPI backend: the round primitive of src/transport/transport.h over MPI_Isend /
 * MPI_Irecv, plus MPI_Ibarrier as its barrier.  The algorithms (rings,
 * pairwise exchange, member-order reduction), accounting, link emulation,
 * device staging and the waits are src/algo's, so every byte
 * is counted on the link it crosses (docs/design.md "Transports").
 *
 * One MPI communicator for every group: zpp's duplicate (for a subset, a
 * duplicate of its parent's, with a map from zpp rank to MPI rank).  The
 * group rides in the tag: MPI tag = group * tag_limit + the algorithms'
 * tag, so messages of different groups never match.  No MPI_Comm_split:
 * it has no non-blocking form, and a rank that never arrives would hang
 * the others in it beyond ZPP_TIMEOUT_S.  Messages over 1 GiB go as
 * several (MPI counts are int), posted in order, so they match in order.
 * A round's requests live in a round object taken from a free list, so a
 * steady stream of rounds allocates nothing; each request remembers its
 * peer, so a timeout names the transfers still pending.
 *
 * Cancelling (a timeout, an error, zpp_comm_abort): MPI_Cancel completes
 * an unmatched receive at once, but a receive already matched still
 * writes its buffer, and Open MPI cancels no send (a send still reads
 * its buffer when the peer posts the receive).  So a cancelled request is
 * never freed blind: what does not complete within a few milliseconds is
 * kept (the orphans) and tested again at teardown, and its buffer is
 * kept alive until then (src/transport/transport_impl.h, in_doubt).
 */
#include "transport/transport_impl.h"

#if ZPP_HAVE_MPI

#include <limits.h>
#include <stdlib.h>
#include <time.h>

/* MPI counts are int: larger transfers go as several messages. */
#define MAX_MSG ((size_t)1 << 30)
/* How long a cancel tests its requests before leaving them as orphans;
 * how long teardown waits for orphaned sends (receives: the timeout). */
#define CANCEL_TEST_NS 5000000
#define DRAIN_SEND_NS 1000000000

struct zpp_round {
  struct zpp_round *next; /* free list */
  MPI_Request *req;       /* [nreq] */
  int *idx;               /* [cap] MPI_Testsome indices */
  MPI_Status *stat;       /* [cap] MPI_Testsome statuses */
  size_t *want;           /* [cap] bytes a receive expects */
  int *peer;              /* [cap] world rank of each request; -1: barrier */
  char *is_recv;          /* [cap] */
  zpp_group_t g;
  int nreq, cap, left;
  int cancellable; /* 0: a non-blocking collective (MPI cannot cancel it) */
};

typedef struct {
  MPI_Comm comm;  /* zpp's duplicate (not freed here) */
  int *mpi_rank;  /* [size] MPI rank in comm of each world rank */
  int whole;      /* comm holds exactly the communicator's ranks */
  zpp_round_t *free_rounds;
  /* Requests of cancelled rounds that did not complete: MPI may still
   * read (sends) or write (receives) their buffers.  Tested by
   * mpi_round_drain at teardown; `lost` counts those released to MPI
   * still pending (their buffers must never be freed). */
  MPI_Request *orphan;
  char *orphan_recv; /* [orphan_cap] the orphan is a receive */
  int norphan, orphan_cap, lost;
} mpi_impl_t;

zpp_status_t zpp_mpi_error(int rc, const char *func, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  msg[len < (int)sizeof msg ? len : (int)sizeof msg - 1] = '\0';
  return zpp_error(ZPP_ERR_MPI, func, "%s: %s", what, msg);
}

/* ---- rounds ----------------------------------------------------------------- */

/* The largest message to world rank `world`: t->net_seg on inter-node links
 * when set (ZPP_NET_SEGMENT), else MAX_MSG. */
static size_t msg_max(const zpp_transport_t *t, int world) {
  if (t->net_seg > 0 && zpp_transport_link(t, world) == ZPP_LINK_NET)
    return t->net_seg;
  return MAX_MSG;
}

static zpp_round_t *round_get(mpi_impl_t *m, int nreq) {
  zpp_round_t *r = m->free_rounds;
  if (r != NULL)
    m->free_rounds = r->next;
  else if ((r = calloc(1, sizeof *r)) == NULL)
    return NULL;
  if (nreq > r->cap) {
    MPI_Request *q = realloc(r->req, (size_t)nreq * sizeof *q);
    int *x = q != NULL ? realloc(r->idx, (size_t)nreq * sizeof *x) : NULL;
    int *pr = x != NULL ? realloc(r->peer, (size_t)nreq * sizeof *pr) : NULL;
    char *rv = pr != NULL ? realloc(r->is_recv, (size_t)nreq) : NULL;
    MPI_Status *sa = rv != NULL ? realloc(r->stat, (size_t)nreq * sizeof *sa)
                                : NULL;
    size_t *w = sa != NULL ? realloc(r->want, (size_t)nreq * sizeof *w) : NULL;
    if (q != NULL)
      r->req = q;
    if (x != NULL)
      r->idx = x;
    if (pr != NULL)
      r->peer = pr;
    if (rv != NULL)
      r->is_recv = rv;
    if (sa != NULL)
      r->stat = sa;
    if (w == NULL) {
      r->next = m->free_rounds;
      m->free_rounds = r;
      return NULL;
    }
    r->want = w;
    r->cap = nreq;
  }
  r->nreq = r->left = 0;
  r->cancellable = 1;
  return r;
}

static void round_put(mpi_impl_t *m, zpp_round_t *r) {
  r->next = m->free_rounds;
  m->free_rounds = r;
}

/* Keeps request i of r as an orphan; without memory for it, releases it
 * to MPI (counted lost: its buffer stays in doubt for ever). */
static void orphan_keep(mpi_impl_t *m, zpp_round_t *r, int i) {
  if (m->norphan == m->orphan_cap) {
    int cap = m->orphan_cap ? 2 * m->orphan_cap : 16;
    MPI_Request *q = realloc(m->orphan, (size_t)cap * sizeof *q);
    char *rv = q != NULL ? realloc(m->orphan_recv, (size_t)cap) : NULL;
    if (q != NULL)
      m->orphan = q;
    if (rv == NULL) {
      MPI_Request_free(&r->req[i]);
      m->lost++;
      return;
    }
    m->orphan_recv = rv;
    m->orphan_cap = cap;
  }
  m->orphan[m->norphan] = r->req[i];
  m->orphan_recv[m->norphan] = r->is_recv[i];
  m->norphan++;
  r->req[i] = MPI_REQUEST_NULL;
}

/* Cancels every pending request, tests them for CANCEL_TEST_NS (an
 * unmatched receive completes at once, a matched one when its data is
 * in), and keeps what is still pending as orphans: never freed blind, as
 * MPI would go on reading or writing the buffer.  Returns how many. */
static int mpi_round_cancel(zpp_transport_t *t, zpp_round_t *r) {
  mpi_impl_t *m = t->impl;
  int64_t until;
  int i, left = 0;
  /* A non-blocking collective can be neither cancelled nor freed: it is
   * left to finish when the late peers arrive (its handle is dropped; it
   * has no buffer). */
  if (!r->cancellable) {
    round_put(m, r);
    return 0;
  }
  for (i = 0; i < r->nreq; i++)
    if (r->req[i] != MPI_REQUEST_NULL)
      MPI_Cancel(&r->req[i]);
  until = zpp_time_ns() + CANCEL_TEST_NS;
  for (;;) {
    int flag = 0;
    if (MPI_Testall(r->nreq, r->req, &flag, MPI_STATUSES_IGNORE) ==
            MPI_SUCCESS &&
        flag)
      break; /* every request is inactive now */
    if (zpp_time_ns() > until)
      break;
    {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
  }
  for (i = 0; i < r->nreq; i++) {
    int flag = 0;
    if (r->req[i] == MPI_REQUEST_NULL)
      continue;
    if (MPI_Test(&r->req[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
      continue;
    orphan_keep(m, r, i);
    left++;
  }
  round_put(m, r);
  return left;
}

/* Tests the orphans until the receives (they write) complete or the
 * deadline, and the sends (they only read, and Open MPI cancels none: one
 * to a peer that never posts the receive never completes) for
 * DRAIN_SEND_NS at most; releases what is left to MPI (lost). */
static int mpi_round_drain(zpp_transport_t *t, int64_t deadline_ns) {
  mpi_impl_t *m = t->impl;
  int64_t start = zpp_time_ns();
  int64_t send_until = deadline_ns < start + DRAIN_SEND_NS
                           ? deadline_ns
                           : start + DRAIN_SEND_NS;
  int i, recvs = 0, sends = 0;
  long pause_ns = 1000;
  if (m->norphan == 0)
    return m->lost;
  for (;;) {
    int64_t now;
    recvs = sends = 0;
    for (i = 0; i < m->norphan; i++) {
      int flag = 0;
      if (m->orphan[i] == MPI_REQUEST_NULL)
        continue;
      if (MPI_Test(&m->orphan[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
          flag)
        continue;
      if (m->orphan_recv[i])
        recvs++;
      else
        sends++;
    }
    now = zpp_time_ns();
    if ((recvs == 0 && (sends == 0 || now > send_until)) || now > deadline_ns)
      break;
    {
      struct timespec ts = {0, pause_ns};
      nanosleep(&ts, NULL);
      if (pause_ns < 1000000)
        pause_ns *= 2;
    }
  }
  for (i = 0; i < m->norphan; i++)
    if (m->orphan[i] != MPI_REQUEST_NULL) {
      MPI_Request_free(&m->orphan[i]);
      m->lost++;
    }
  m->norphan = 0;
  if (recvs + sends > 0)
    ZPP_WARN(ZPP_SUBSYS_NET,
             "destroy: %d cancelled receive(s) and %d send(s) did not "
             "complete; MPI may still write or read their buffers: zpp's "
             "are leaked, never freed under them",
             recvs, sends);
  return m->lost;
}

/* Posts x[0..n) of group g; a transfer of 0 bytes is one empty message
 * (the p2p barrier's). */
static zpp_status_t post(zpp_transport_t *t, zpp_group_t g, zpp_round_t *r,
                         const zpp_xfer_t *x, int n, int send) {
  mpi_impl_t *m = t->impl;
  int i, rc;
  for (i = 0; i < n; i++) {
    char *p = (char *)x[i].buf;
    size_t left = x[i].bytes;
    int world = t->grp[g].members[x[i].peer];
    int dest = m->mpi_rank[world];
    int tag = (int)((uint32_t)g * t->tag_limit + x[i].tag);
    size_t max = msg_max(t, world);
    do {
      size_t b = left < max ? left : max;
      rc = send ? MPI_Isend(p, (int)b, MPI_BYTE, dest, tag, m->comm,
                            &r->req[r->nreq])
                : MPI_Irecv(p, (int)b, MPI_BYTE, dest, tag, m->comm,
                            &r->req[r->nreq]);
      if (rc != MPI_SUCCESS)
        return zpp_mpi_error(rc, "round_post", send ? "MPI_Isend" : "MPI_Irecv");
      r->peer[r->nreq] = world;
      r->is_recv[r->nreq] = (char)!send;
      r->want[r->nreq] = b;
      r->nreq++;
      p += b;
      left -= b;
    } while (left > 0);
  }
  return ZPP_OK;
}

static zpp_status_t mpi_round_post(zpp_transport_t *t, zpp_group_t g,
                                   const zpp_xfer_t *recv, int nrecv,
                                   const zpp_xfer_t *send, int nsend,
                                   zpp_round_t **round) {
  mpi_impl_t *m = t->impl;
  zpp_round_t *r;
  zpp_status_t st;
  size_t n = 0;
  int nreq, i;
  /* a message per MAX_MSG (per ZPP_NET_SEGMENT to an inter-node peer); a
   * transfer of 0 bytes is one empty message.  Both sides cut a transfer
   * alike (the setting is agreed at creation), and messages of one pair and
   * tag match in posting order. */
  for (i = 0; i < nrecv + nsend; i++) {
    const zpp_xfer_t *x = i < nrecv ? &recv[i] : &send[i - nrecv];
    size_t max = msg_max(t, t->grp[g].members[x->peer]);
    n += x->bytes > 0 ? (x->bytes + max - 1) / max : 1;
  }
  if (n > (size_t)INT_MAX / 4)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, "round_post",
                     "%zu messages in one round: set ZPP_NET_SEGMENT larger",
                     n);
  nreq = (int)n;
  r = round_get(m, nreq > 0 ? nreq : 1);
  if (r == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "round_post", "%d requests", nreq);
  r->g = g;
  st = post(t, g, r, recv, nrecv, 0);
  if (st == ZPP_OK)
    st = post(t, g, r, send, nsend, 1);
  if (st != ZPP_OK) {
    zpp_transport_add_in_doubt(t, mpi_round_cancel(t, r), "round_post");
    return st;
  }
  r->left = r->nreq;
  *round = r;
  return ZPP_OK;
}

/* Checks the receives MPI_Testsome completed (in_status: it returned
 * MPI_ERR_IN_STATUS): a longer message is MPI_ERR_TRUNCATE, a shorter one
 * only shows in its count, and would leave the rest of the buffer as it
 * was.  Per message: a transfer cut into several (ZPP_NET_SEGMENT, MAX_MSG)
 * that differs by whole messages is not seen here (docs/collectives.md,
 * "ZPP_CHECK=1"). */
static zpp_status_t check_sizes(zpp_transport_t *t, zpp_round_t *r, int out,
                                int in_status) {
  int k;
  for (k = 0; k < out; k++) {
    int i = r->idx[k], n = 0;
    char got[64];
    if (!r->is_recv[i] || r->peer[i] < 0) /* a send, the barrier */
      continue;
    if (in_status && r->stat[k].MPI_ERROR != MPI_SUCCESS) {
      int cls = 0;
      MPI_Error_class(r->stat[k].MPI_ERROR, &cls);
      if (cls == MPI_ERR_TRUNCATE)
        return zpp_transport_size_mismatch(t, r->g, r->peer[i], "more bytes",
                                           r->want[i]);
      continue;
    }
    if (MPI_Get_count(&r->stat[k], MPI_BYTE, &n) == MPI_SUCCESS &&
        n != MPI_UNDEFINED && (size_t)n != r->want[i]) {
      snprintf(got, sizeof got, "%d bytes", n);
      return zpp_transport_size_mismatch(t, r->g, r->peer[i], got,
                                         r->want[i]);
    }
  }
  return ZPP_OK;
}

static zpp_status_t mpi_round_test(zpp_transport_t *t, zpp_round_t *r,
                                   int *done) {
  int out = 0, rc, cls = MPI_SUCCESS;
  zpp_status_t st;
  *done = 0;
  rc = MPI_Testsome(r->nreq, r->req, &out, r->idx, r->stat);
  if (rc != MPI_SUCCESS) /* an implementation may return a code of the class */
    MPI_Error_class(rc, &cls);
  if (rc != MPI_SUCCESS && cls != MPI_ERR_IN_STATUS)
    return zpp_mpi_error(rc, "round_test", "MPI_Testsome");
  if (out != MPI_UNDEFINED &&
      (st = check_sizes(t, r, out, rc != MPI_SUCCESS)) != ZPP_OK)
    return st;
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, "round_test", "MPI_Testsome");
  if (out == MPI_UNDEFINED) {
    r->left = 0; /* every request is inactive */
  } else if (out > 0) {
    r->left -= out;
    zpp_transport_progressed(t);
  }
  if (r->left <= 0) {
    *done = 1;
    round_put(t->impl, r);
  }
  return ZPP_OK;
}

/* A barrier of group g: MPI_Ibarrier when g is the whole of zpp's MPI
 * communicator; otherwise one round of empty messages to and from every
 * other member (complete once every member has arrived). */
static zpp_status_t mpi_barrier_post(zpp_transport_t *t, zpp_group_t g,
                                     uint32_t tag, zpp_round_t **round) {
  mpi_impl_t *m = t->impl;
  const zpp_tgroup_t *gr = &t->grp[g];
  zpp_round_t *r;
  int rc;
  if (g != ZPP_GROUP_WORLD || !m->whole) {
    zpp_xfer_t *x = malloc(2 * (size_t)gr->size * sizeof *x);
    int i, k = 0;
    zpp_status_t st;
    if (x == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "barrier", "%d transfers",
                       2 * gr->size);
    for (i = 0; i < gr->size; i++) {
      if (i == gr->index)
        continue;
      x[k].peer = i;
      x[k].buf = NULL;
      x[k].bytes = 0;
      x[k].tag = tag;
      k++;
    }
    st = mpi_round_post(t, g, x, k, x, k, round);
    free(x);
    return st;
  }
  r = round_get(m, 1);
  if (r == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "barrier", "a request");
  rc = MPI_Ibarrier(m->comm, &r->req[0]);
  if (rc != MPI_SUCCESS) {
    round_put(m, r);
    return zpp_mpi_error(rc, "barrier", "MPI_Ibarrier");
  }
  r->peer[0] = -1;
  r->is_recv[0] = 1;
  r->want[0] = 0;
  r->g = g;
  r->nreq = r->left = 1;
  r->cancellable = 0;
  *round = r;
  return ZPP_OK;
}

/* The transfers of r still pending, by world rank, and the state of the
 * processes of the group this machine can see (gone, stopped). */
static void mpi_round_pending(zpp_transport_t *t, const zpp_round_t *r,
                              char *buf, size_t len) {
  /* Each (peer, direction) is named once, however many messages it has.
   * Checked against the names written so far (at most 64), not against
   * every earlier request, which was quadratic in the requests: a 1 GiB
   * exchange cut at ZPP_NET_SEGMENT=4096 has 2.6e5 each way. */
  int named[64], nnamed = 0;
  size_t used = 0;
  int i, j;
  if (len > 0)
    buf[0] = '\0';
  for (i = 0; i < r->nreq && used + 40 < len && nnamed < 64; i++) {
    int dup = 0, key;
    if (r->req[i] == MPI_REQUEST_NULL)
      continue;
    key = 2 * r->peer[i] + (r->is_recv[i] ? 1 : 0);
    for (j = 0; j < nnamed && !dup; j++)
      dup = named[j] == key;
    if (dup)
      continue;
    named[nnamed++] = key;
    if (r->peer[i] < 0)
      used += (size_t)snprintf(buf + used, len - used,
                               "%sMPI_Ibarrier (its late ranks cannot be "
                               "named)",
                               used ? ", " : "");
    else
      used += (size_t)snprintf(buf + used, len - used, "%s%s %d",
                               used ? ", " : "",
                               r->is_recv[i] ? "from" : "to", r->peer[i]);
  }
  if (used < len)
    zpp_transport_describe_peers(t, buf + used, len - used);
}

/* ---- the table ----------------------------------------------------------- */

static void mpi_destroy(zpp_transport_t *t) {
  mpi_impl_t *m = t->impl;
  if (m == NULL)
    return;
  while (m->free_rounds != NULL) {
    zpp_round_t *r = m->free_rounds;
    m->free_rounds = r->next;
    free(r->req);
    free(r->idx);
    free(r->peer);
    free(r->is_recv);
    free(r->stat);
    free(r->want);
    free(r);
  }
  /* zpp_transport_free drained the orphans first (mpi_round_drain):
   * none is left, only the arrays. */
  free(m->orphan);
  free(m->orphan_recv);
  free(m->mpi_rank);
  free(m);
  t->impl = NULL;
}

static const zpp_round_ops_t mpi_rounds = {
    .round_post = mpi_round_post,
    .round_test = mpi_round_test,
    .round_cancel = mpi_round_cancel,
    .round_drain = mpi_round_drain,
    .barrier_post = mpi_barrier_post,
    .round_pending = mpi_round_pending,
};
static const zpp_transport_ops_t mpi_ops = {
    .name = "mpi", .destroy = mpi_destroy, .round = &mpi_rounds};

zpp_status_t zpp_transport_mpi_create(zpp_transport_t *t, MPI_Comm comm,
                                      const int *mpi_rank, int cuda_device) {
  mpi_impl_t *m = calloc(1, sizeof *m);
  int flag = 0, w, n = 0, ub = 32767, limit;
  int *attr = NULL;
  if (m == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "MPI backend state");
  m->mpi_rank = malloc((size_t)t->size * sizeof *m->mpi_rank);
  if (m->mpi_rank == NULL) {
    free(m);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "rank map");
  }
  for (w = 0; w < t->size; w++)
    m->mpi_rank[w] = mpi_rank != NULL ? mpi_rank[w] : w;
  MPI_Comm_size(comm, &n);
  m->whole = n == t->size;
  for (w = 0; w < t->size && m->whole; w++)
    m->whole = m->mpi_rank[w] == w;
  m->comm = comm;
  t->impl = m;
  t->ops = &mpi_ops;
  t->backend = ZPP_BACKEND_MPI;
  t->cuda_device = cuda_device;
  /* Tags 0..MPI_TAG_UB (at least 32767 by the standard), a quarter per
   * group: tag_limit is the largest power of two with 4 * tag_limit - 1
   * <= MPI_TAG_UB, at most 2^28. */
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &attr, &flag);
  if (flag && attr != NULL && *attr > 0)
    ub = *attr;
  for (limit = 1 << 28; limit > 1 && (int64_t)4 * limit - 1 > ub; limit >>= 1) {
  }
  t->tag_limit = (uint32_t)limit;
  return ZPP_OK;
}

#endif /* ZPP_HAVE_MPI */
