/*
 * The ring family (described at the top of op.c): the all-gather[v] over
 * the members in ring order, also of allreduce's reduced shards, on one
 * ring or on several rotated ones (ZPP_NET_RINGS), each over its own chunk
 * of every block.
 */
#include "algo/algo_impl.h"
#include "transport/transport_impl.h"

#include <stddef.h>
#include <string.h>

/* Rings ("channels"): ZPP_NET_RINGS rings run at once, each over its own
 * share of every block (chunk c of C: floor split, the first b % C chunks
 * one byte longer).  Ring c visits the nodes in order and each node's
 * members rotated by c, so its node boundaries -- the inter-node hops --
 * fall on other ranks than ring 0's, and the inter-node bytes leave
 * through C ranks per node instead of one.  C is capped by the largest
 * node run of the group (rotating a run of one changes nothing). */
int zpp_algo_ring_channels(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
  int i = 0, best = 1, n = gr->size;
  while (i < n) {
    int node = t->topo->node_of[gr->members[gr->ring[i]]], j = i;
    while (j < n && t->topo->node_of[gr->members[gr->ring[j]]] == node)
      j++;
    if (j - i > best)
      best = j - i;
    i = j;
  }
  return t->rings < best ? t->rings : best;
}

/* Ring order of channel c: gr->ring with each node's run rotated by c. */
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

void zpp_algo_chunk_of(size_t b, int c, int nc, size_t *lo, size_t *len) {
  size_t q = b / (size_t)nc, r = b % (size_t)nc, cc = (size_t)c;
  *len = q + (cc < r ? 1 : 0);
  *lo = q * cc + (cc < r ? cc : r);
}

/* Ring step s: per ring, forward one chunk to my successor and receive one
 * from my predecessor.  Two rings may join the same pair of ranks: both
 * sides post them in ring order, and transfers of one pair and tag match
 * in posting order. */
static zpp_status_t ring_round(zpp_xop_t *op) {
  int n = op->n, s = op->step, c;
  for (c = 0; c < op->nc; c++) {
    const int *R = op->rings + (size_t)c * (size_t)n;
    int p = op->pos[c];
    int sb = R[(p - s + n) % n];         /* block I forward */
    int rb = R[(p - s - 1 + 2 * n) % n]; /* block I receive */
    size_t lo, len;
    zpp_algo_chunk_of(op->bytes[sb], c, op->nc, &lo, &len);
    zpp_algo_data_xfer(op, &op->dout[c], R[(p + 1) % n],
                       (s == 0 && op->ring_send != NULL
                            ? op->ring_send
                            : op->ring_buf + op->displs[sb]) + lo,
                       len);
    zpp_algo_chunk_of(op->bytes[rb], c, op->nc, &lo, &len);
    zpp_algo_data_xfer(op, &op->din[c], R[(p + n - 1) % n],
                       op->ring_buf + op->displs[rb] + lo, len);
  }
  op->nin = op->nout = op->nc;
  op->ctl = 0;
  return zpp_algo_post_round(op);
}

/* send: my block's source (NULL: already in place). */
void zpp_algo_setup_ring(zpp_xop_t *op, char *buf, const void *send) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  int c, i, n = op->n;
  char *mine = buf + op->displs[op->me];
  op->ring_buf = buf;
  op->ring_send = NULL;
  if (send != NULL && send != mine && op->bytes[op->me] > 0) {
    if (n == 1)
      memmove(mine, send, op->bytes[op->me]);
    else
      op->ring_send = send;
  }
  for (c = 0; c < op->nc; c++) {
    int *R = op->rings + (size_t)c * (size_t)n;
    channel_ring(op->t, gr, c, R);
    for (i = 0; i < n; i++)
      if (R[i] == op->me)
        op->pos[c] = i;
  }
}

/* The ZPP_PH_RING step: ring round op->step, n - 1 of them. */
zpp_status_t zpp_algo_ring_step(zpp_xop_t *op, int *end) {
  zpp_status_t st;
  if (op->step >= op->n - 1) {
    *end = 1;
    return ZPP_OK;
  }
  st = ring_round(op); /* runs step op->step */
  if (st == ZPP_OK && op->step == 0 && op->ring_send != NULL) {
    /* Round 0 reads my block from ring_send and writes another block:
     * put mine in place meanwhile (later rounds forward it from there). */
    memmove(op->ring_buf + op->displs[op->me], op->ring_send,
            op->bytes[op->me]);
  }
  op->step++;
  return st;
}
