/*
 * MPI backend: the round primitive of src/transport.h over MPI_Isend /
 * MPI_Irecv, plus MPI_Ibarrier as its barrier.  The algorithms (rings,
 * pairwise exchange, member-order reduction), accounting, link emulation,
 * device staging and the waits are src/transport_algo.c's, so every byte
 * is counted on the link it crosses (docs/design.md "Transports").
 *
 * One MPI communicator per group (WORLD is zpp's duplicate, NODE and CROSS
 * are split from it), so tags only need to be unique within a group; the
 * tags are the algorithms', below MPI_TAG_UB.  Messages over 1 GiB go as
 * several (MPI counts are int), posted in order, so they match in order.
 * A round's requests live in a round object taken from a free list, so a
 * steady stream of rounds allocates nothing.
 */
#include "transport_impl.h"

#if ZPP_HAVE_MPI

#include <stdlib.h>

/* MPI counts are int: larger transfers go as several messages. */
#define MAX_MSG ((size_t)1 << 30)

struct zpp_round {
  struct zpp_round *next; /* free list */
  MPI_Request *req;       /* [nreq] */
  int *idx;               /* [cap] MPI_Testsome indices */
  int nreq, cap, left;
  int cancellable; /* 0: a non-blocking collective (MPI cannot cancel it) */
};

typedef struct {
  MPI_Comm comm[ZPP_NGROUPS]; /* WORLD is zpp's duplicate (not freed here) */
  zpp_round_t *free_rounds;
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

static int chunks(size_t bytes) { return (int)((bytes + MAX_MSG - 1) / MAX_MSG); }

static zpp_round_t *round_get(mpi_impl_t *m, int nreq) {
  zpp_round_t *r = m->free_rounds;
  if (r != NULL)
    m->free_rounds = r->next;
  else if ((r = calloc(1, sizeof *r)) == NULL)
    return NULL;
  if (nreq > r->cap) {
    MPI_Request *q = realloc(r->req, (size_t)nreq * sizeof *q);
    int *x = q != NULL ? realloc(r->idx, (size_t)nreq * sizeof *x) : NULL;
    if (q != NULL)
      r->req = q;
    if (x == NULL) {
      r->next = m->free_rounds;
      m->free_rounds = r;
      return NULL;
    }
    r->idx = x;
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

static void mpi_round_cancel(zpp_transport_t *t, zpp_round_t *r) {
  int i;
  /* A non-blocking collective can be neither cancelled nor freed: it is
   * left to finish when the late peers arrive (its handle is dropped). */
  for (i = 0; r->cancellable && i < r->nreq; i++) {
    if (r->req[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&r->req[i]);
      MPI_Request_free(&r->req[i]);
    }
  }
  round_put(t->impl, r);
}

static zpp_status_t post(zpp_round_t *r, const zpp_xfer_t *x, int n, int send,
                         MPI_Comm comm) {
  int i, rc;
  for (i = 0; i < n; i++) {
    char *p = (char *)x[i].buf;
    size_t left = x[i].bytes;
    while (left > 0) {
      size_t b = left < MAX_MSG ? left : MAX_MSG;
      rc = send ? MPI_Isend(p, (int)b, MPI_BYTE, x[i].peer, (int)x[i].tag,
                            comm, &r->req[r->nreq])
                : MPI_Irecv(p, (int)b, MPI_BYTE, x[i].peer, (int)x[i].tag,
                            comm, &r->req[r->nreq]);
      if (rc != MPI_SUCCESS)
        return zpp_mpi_error(rc, "round_post", send ? "MPI_Isend" : "MPI_Irecv");
      r->nreq++;
      p += b;
      left -= b;
    }
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
  int nreq = 0, i;
  for (i = 0; i < nrecv; i++)
    nreq += chunks(recv[i].bytes);
  for (i = 0; i < nsend; i++)
    nreq += chunks(send[i].bytes);
  r = round_get(m, nreq > 0 ? nreq : 1);
  if (r == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "round_post", "%d requests", nreq);
  st = post(r, recv, nrecv, 0, m->comm[g]);
  if (st == ZPP_OK)
    st = post(r, send, nsend, 1, m->comm[g]);
  if (st != ZPP_OK) {
    mpi_round_cancel(t, r);
    return st;
  }
  r->left = r->nreq;
  *round = r;
  return ZPP_OK;
}

static zpp_status_t mpi_round_test(zpp_transport_t *t, zpp_round_t *r,
                                   int *done) {
  int out = 0, rc;
  *done = 0;
  rc = MPI_Testsome(r->nreq, r->req, &out, r->idx, MPI_STATUSES_IGNORE);
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

static zpp_status_t mpi_barrier_post(zpp_transport_t *t, zpp_group_t g,
                                     uint32_t tag, zpp_round_t **round) {
  mpi_impl_t *m = t->impl;
  zpp_round_t *r = round_get(m, 1);
  int rc;
  (void)tag; /* MPI matches collectives by order */
  if (r == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "barrier", "a request");
  rc = MPI_Ibarrier(m->comm[g], &r->req[0]);
  if (rc != MPI_SUCCESS) {
    round_put(m, r);
    return zpp_mpi_error(rc, "barrier", "MPI_Ibarrier");
  }
  r->nreq = r->left = 1;
  r->cancellable = 0;
  *round = r;
  return ZPP_OK;
}

/* ---- the table ----------------------------------------------------------- */

static void mpi_destroy(zpp_transport_t *t) {
  mpi_impl_t *m = t->impl;
  int fin = 0;
  if (m == NULL)
    return;
  MPI_Finalized(&fin);
  if (!fin) {
    if (m->comm[ZPP_GROUP_NODE] != MPI_COMM_NULL)
      MPI_Comm_free(&m->comm[ZPP_GROUP_NODE]);
    if (m->comm[ZPP_GROUP_CROSS] != MPI_COMM_NULL)
      MPI_Comm_free(&m->comm[ZPP_GROUP_CROSS]);
  }
  while (m->free_rounds != NULL) {
    zpp_round_t *r = m->free_rounds;
    m->free_rounds = r->next;
    free(r->req);
    free(r->idx);
    free(r);
  }
  free(m);
  t->impl = NULL;
}

static const zpp_transport_ops_t mpi_ops = {
    .name = "mpi",
    .destroy = mpi_destroy,
    .round_post = mpi_round_post,
    .round_test = mpi_round_test,
    .round_cancel = mpi_round_cancel,
    .barrier_post = mpi_barrier_post,
};

zpp_status_t zpp_transport_mpi_create(zpp_transport_t *t, MPI_Comm world,
                                      int cuda_device) {
  mpi_impl_t *m = calloc(1, sizeof *m);
  const zpp_topo_t *topo = t->topo;
  int rc, g, flag = 0;
  int *ub = NULL;
  if (m == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "MPI backend state");
  t->cuda_device = cuda_device;
  /* Tags 0..MPI_TAG_UB (at least 32767 by the standard). */
  MPI_Comm_get_attr(world, MPI_TAG_UB, &ub, &flag);
  t->tag_limit = flag && ub != NULL && *ub > 0
                     ? (*ub >= (1 << 30) ? 1u << 30 : (uint32_t)*ub + 1)
                     : 32768;
  m->comm[ZPP_GROUP_WORLD] = world;
  m->comm[ZPP_GROUP_NODE] = m->comm[ZPP_GROUP_CROSS] = MPI_COMM_NULL;
  t->impl = m;
  t->ops = &mpi_ops;
  t->backend = ZPP_BACKEND_MPI;
  /* NODE: colour = node, key = local rank; CROSS: colour = local rank,
   * key = node.  The member order then equals the topology's. */
  rc = MPI_Comm_split(world, topo->node_of[t->rank],
                      topo->local_rank_of[t->rank], &m->comm[ZPP_GROUP_NODE]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_split(world, topo->local_rank_of[t->rank],
                        topo->node_of[t->rank], &m->comm[ZPP_GROUP_CROSS]);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, __func__, "MPI_Comm_split");
  for (g = 0; g < ZPP_NGROUPS; g++) {
    int r = -1, n = -1;
    MPI_Comm_set_errhandler(m->comm[g], MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm[g], &r);
    MPI_Comm_size(m->comm[g], &n);
    if (r != t->grp[g].index || n != t->grp[g].size)
      return zpp_error(ZPP_ERR_INTERNAL, __func__,
                       "group %s: MPI gives rank %d of %d, topology %d of %d",
                       zpp_group_name((zpp_group_t)g), r, n, t->grp[g].index,
                       t->grp[g].size);
  }
  return ZPP_OK;
}

#endif /* ZPP_HAVE_MPI */
