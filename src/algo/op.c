/*
 * The algorithms of the host backends (MPI, UCX), written once against the
 * round primitive of transport/transport.h (post a set of point-to-point
 * transfers, test it, cancel it), as non-blocking state machines: an
 * operation (zpp_xop_t) is a list of phases, a phase a sequence of rounds,
 * and zpp_xop_test advances it as far as it can without blocking.  Every
 * byte is counted on the link it crosses (docs/design.md "Transports"):
 *
 *   allgather[v]    ring over the members in ring order (by node, then
 *                   local rank): n-1 rounds, each member forwards one block
 *                   to its successor per round; ZPP_NET_RINGS > 1 runs
 *                   several rotated rings on chunks of the blocks;
 *                   hierarchical on a group over several nodes (below);
 *   alltoall[v]     pairwise exchange: member i sends block j straight to
 *                   member j and receives block j from j; one round of all
 *                   n-1 pairs, in the order i+1, i+2, ...;
 *   reduce_scatter  the same pairwise round of shards, then (when it
 *                   completes) a local sum in member order 0..n-1 with an
 *                   fp32 accumulator, rounded once to the dtype;
 *                   hierarchical on a group over several nodes (below);
 *   allreduce       reduce_scatter over balanced shards (the first
 *                   count % n members hold one element more), then a ring
 *                   allgatherv of the reduced shards;
 *   barrier         the backend's barrier_post if it has one (MPI:
 *                   MPI_Ibarrier), else a dissemination barrier:
 *                   ceil(log2 n) rounds of 1-byte messages to member
 *                   i + 2^k, not counted as payload.
 *
 * Hierarchical (on a group that spans several nodes with more than one
 * member on some node, when ZPP_ALGO=hier, or per call under ZPP_ALGO=auto,
 * the default, where tune.c's cost model predicts it faster than the ring
 * and pairwise ones).  On node m every member
 * w of the group has an *owner*: the member of node m at position
 * local(w) mod size(m) of its run (w itself on w's own node; with equal
 * nodes the rank with w's local rank: rail-aligned).
 *   all-gather      stage X: my block goes to its owner on every other
 *                   node (each rank sends (M-1) B across); stage N: each
 *                   member sends the blocks it owns to every other member
 *                   of its node;
 *   reduce-scatter  the transpose: stage A: slice w goes to its owner on
 *                   my node, which sums the node's contributions in local
 *                   order (fp32) and rounds the partial sum to its wire
 *                   dtype (bf16, fp32: the dtype; fp16: fp32, since an
 *                   fp16 partial could overflow where the total does not);
 *                   stage B: the owner sends it to w, which sums the
 *                   partials in node order (fp32) and rounds once (MEAN:
 *                   divided by n first);
 *   allreduce       that reduce-scatter over balanced shards, then that
 *                   all-gather.
 * The blocks are cut in up to 8 chunks (ZPP_HIER_CHUNK bytes; under auto
 * with it unset, the model's count) and round r
 * carries the first stage of chunk r with the second stage of chunk r-1,
 * so the intra-node work hides behind the inter-node transfers.
 *
 * The families are written in ring.c, pairwise.c and hier.c; this file
 * holds the op state machine that runs their phases.  Also in src/algo,
 * once for every host backend: tags (per-group sequence), link emulation
 * (the deadline header is one more transfer of the round; a round whose
 * data arrived completes only once its latest deadline has passed, and
 * zpp_xop_wake_ns says when) and the timeout from the op's start, here;
 * staging of device memory through pinned host buffers (stage.c; a small
 * cache per transport, so ops in flight have their own: cache.c).  The
 * wait loop's spin-then-sleep policy (ZPP_NET_SPIN_US) is the engine's
 * (src/engine).
 */
#include "algo/algo_impl.h"
#include "algo/tune.h"
#include "core/core.h"
#include "transport/transport_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The op of stream-ordered backends: done from the start. */
static zpp_xop_t done_op = {.state = ZPP_XS_DONE};

zpp_xop_t *zpp_xop_done(void) { return &done_op; }

/* Shard of member j of a balanced split of `count` elements over n. */
static void shard(size_t count, int n, int j, size_t *off, size_t *len) {
  size_t q = count / (size_t)n, r = count % (size_t)n, jj = (size_t)j;
  *len = q + (jj < r ? 1 : 0);
  *off = jj * q + (jj < r ? jj : r);
}

static void offsets(const size_t *b, const size_t *d, int n, size_t *out) {
  size_t acc = 0;
  int i;
  for (i = 0; i < n; i++) {
    out[i] = d ? d[i] : acc;
    acc += b[i];
  }
}

/* ---- rounds ---------------------------------------------------------------- */

static int link_is_net(const zpp_transport_t *t, int world_peer) {
  return zpp_transport_link(t, world_peer) == ZPP_LINK_NET;
}

/* What a round's completion means: the bytes are counted per peer, and
 * under link emulation the data is usable at the latest deadline carried
 * by the headers received. */
static void round_complete(zpp_xop_t *op) {
  zpp_transport_t *t = op->t;
  const int *mem = t->grp[op->g].members;
  int64_t latest = 0, now;
  int i;
  if (op->ctl)
    return;
  for (i = 0; i < op->nout; i++)
    zpp_transport_account(t, mem[op->dout[i].peer], op->dout[i].bytes, 0);
  for (i = 0; i < op->nin; i++)
    zpp_transport_account(t, mem[op->din[i].peer], 0, op->din[i].bytes);
  for (i = 0; i < op->nhdr; i++)
    if (op->hin[i] > latest)
      latest = op->hin[i];
  if (latest > 0 && latest > (now = zpp_time_ns())) {
    op->wake_ns = latest;
    op->arrived_ns = now;
  }
}

/* Posts din[0..nin) and dout[0..nout) (empty transfers dropped), each
 * inter-node transfer preceded by its 8-byte deadline header under link
 * emulation.  A round with nothing to move completes at once. */
zpp_status_t zpp_algo_post_round(zpp_xop_t *op) {
  zpp_transport_t *t = op->t;
  const int *mem = t->grp[op->g].members;
  int nr = 0, ns = 0, i, emu = t->emu_on && !op->ctl;
  op->nhdr = 0;
  for (i = 0; i < op->nin; i++) {
    const zpp_xfer_t *x = &op->din[i];
    if (x->bytes == 0)
      continue;
    if (emu && link_is_net(t, mem[x->peer])) {
      zpp_xfer_t *h = &op->rx[nr++];
      h->peer = x->peer;
      h->buf = &op->hin[op->nhdr++];
      h->bytes = sizeof(int64_t);
      h->tag = op->tag + ZPP_SUB_EMU;
    }
    op->rx[nr++] = *x;
  }
  for (i = 0; i < op->nout; i++) {
    const zpp_xfer_t *x = &op->dout[i];
    int peer = mem[x->peer];
    if (x->bytes == 0)
      continue;
    if (emu && link_is_net(t, peer)) {
      zpp_xfer_t *h = &op->sx[ns++];
      op->hout[i] = zpp_transport_emu_deadline(t, peer, x->bytes);
      h->peer = x->peer;
      h->buf = &op->hout[i];
      h->bytes = sizeof(int64_t);
      h->tag = op->tag + ZPP_SUB_EMU;
    }
    op->sx[ns++] = *x;
  }
  if (nr + ns == 0) {
    round_complete(op);
    return ZPP_OK;
  }
  return t->ops->round->round_post(t, op->g, op->rx, nr, op->sx, ns, &op->round);
}

void zpp_algo_data_xfer(zpp_xop_t *op, zpp_xfer_t *x, int peer, const void *buf,
                        size_t bytes) {
  x->peer = peer;
  x->buf = (void *)buf;
  x->bytes = bytes;
  x->tag = op->tag + ZPP_SUB_DATA;
}

/* Dissemination round k: a byte to member me + 2^k, one from me - 2^k. */
static zpp_status_t barrier_round(zpp_xop_t *op) {
  int n = op->n, d = 1 << op->step;
  op->dout[0].peer = (op->me + d) % n;
  op->dout[0].buf = &op->bar_out;
  op->dout[0].bytes = 1;
  op->dout[0].tag = op->tag + ZPP_SUB_CTL;
  op->din[0].peer = (op->me - d % n + n) % n;
  op->din[0].buf = &op->bar_in;
  op->din[0].bytes = 1;
  op->din[0].tag = op->tag + ZPP_SUB_CTL;
  op->nin = op->nout = 1;
  op->ctl = 1;
  return zpp_algo_post_round(op);
}

/* The ZPP_PH_BARRIER step: the backend's barrier (one step), else the
 * dissemination rounds. */
static zpp_status_t barrier_step(zpp_xop_t *op, int *end) {
  zpp_transport_t *t = op->t;
  zpp_status_t st;
  if (op->n == 1) {
    *end = 1;
    return ZPP_OK;
  }
  if (t->ops->round->barrier_post != NULL && !t->p2p_barrier) {
    if (op->step >= 1) {
      *end = 1;
      return ZPP_OK;
    }
    op->step = 1;
    op->ctl = 1;
    op->nin = op->nout = op->nhdr = 0;
    return t->ops->round->barrier_post(t, op->g, op->tag + ZPP_SUB_CTL, &op->round);
  }
  if ((1 << op->step) >= op->n) {
    *end = 1;
    return ZPP_OK;
  }
  st = barrier_round(op);
  op->step++;
  return st;
}

/* ---- start --------------------------------------------------------------------- */

/* Carves the op and its tables out of one allocation (every table but the
 * int ones, last, has 8-byte elements, so each stays aligned). */
static zpp_xop_t *op_alloc(int n, int nc, int slots) {
  int k = n - 1 > nc ? n - 1 : nc;
  size_t sz, nn = (size_t)n;
  zpp_xop_t *op;
  char *p;
  if (k < slots)
    k = slots;
  if (k < 1)
    k = 1;
  sz = sizeof *op + 11 * nn * sizeof(size_t) + nn * sizeof(void *) +
       6 * (size_t)k * sizeof(zpp_xfer_t) + 2 * (size_t)k * sizeof(int64_t) +
       ((size_t)nc * nn + (size_t)nc + 3 * nn) * sizeof(int);
  op = calloc(1, sz);
  if (op == NULL)
    return NULL;
  p = (char *)(op + 1);
#define ZPP_CARVE(field, count)                                                \
  do {                                                                         \
    op->field = (void *)p;                                                     \
    p += (count) * sizeof *op->field;                                          \
  } while (0)
  ZPP_CARVE(bytes, nn);
  ZPP_CARVE(displs, nn);
  ZPP_CARVE(sb, nn);
  ZPP_CARVE(so, nn);
  ZPP_CARVE(rb, nn);
  ZPP_CARVE(ro, nn);
  ZPP_CARVE(off, nn);
  ZPP_CARVE(len, nn);
  ZPP_CARVE(pre, nn);
  ZPP_CARVE(uoff, nn);
  ZPP_CARVE(ulen, nn);
  ZPP_CARVE(blocks, nn);
  ZPP_CARVE(din, (size_t)k);
  ZPP_CARVE(dout, (size_t)k);
  ZPP_CARVE(rx, 2 * (size_t)k);
  ZPP_CARVE(sx, 2 * (size_t)k);
  ZPP_CARVE(hin, (size_t)k);
  ZPP_CARVE(hout, (size_t)k);
  ZPP_CARVE(rings, (size_t)nc * nn);
  ZPP_CARVE(pos, (size_t)nc);
  ZPP_CARVE(own, nn);
  ZPP_CARVE(ai, nn);
  ZPP_CARVE(alist, nn);
#undef ZPP_CARVE
  return op;
}

static zpp_status_t setup(zpp_xop_t *op, const zpp_xfer_desc_t *a) {
  int n = op->n, me = op->me, i, np = 0;
  int hier = op->hier;
  const void *send = a->send;
  void *recv = a->recv;
  if (a->mem == ZPP_MEMORY_DEVICE && a->kind != ZPP_XFER_BARRIER)
    ZPP_CHECK(zpp_algo_stage(op, a, &send, &recv));
  switch (a->kind) {
  case ZPP_XFER_ALLGATHER: {
    for (i = 0; i < n; i++) {
      op->bytes[i] = a->bytes;
      op->displs[i] = (size_t)i * a->bytes;
    }
    zpp_algo_setup_ring(op, recv, send);
    if (hier)
      zpp_algo_hier_setup(op);
    op->plan[np++] = hier ? ZPP_PH_HAG : ZPP_PH_RING;
    break;
  }
  case ZPP_XFER_ALLGATHERV: {
    memcpy(op->bytes, a->recv_bytes, (size_t)n * sizeof(size_t));
    offsets(a->recv_bytes, a->recv_displs, n, op->displs);
    zpp_algo_setup_ring(op, recv, send);
    if (hier)
      zpp_algo_hier_setup(op);
    op->plan[np++] = hier ? ZPP_PH_HAG : ZPP_PH_RING;
    break;
  }
  case ZPP_XFER_ALLTOALL: /* zpp_xfer_start cleared its arrays */
  case ZPP_XFER_ALLTOALLV:
    if (a->send_bytes == NULL) {
      for (i = 0; i < n; i++) {
        op->sb[i] = op->rb[i] = a->bytes;
        op->so[i] = op->ro[i] = (size_t)i * a->bytes;
      }
    } else {
      memcpy(op->sb, a->send_bytes, (size_t)n * sizeof(size_t));
      memcpy(op->rb, a->recv_bytes, (size_t)n * sizeof(size_t));
      offsets(a->send_bytes, a->send_displs, n, op->so);
      offsets(a->recv_bytes, a->recv_displs, n, op->ro);
    }
    if (op->sb[me] != op->rb[me])
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, op->what,
                       "send_bytes[%d] = %zu but recv_bytes[%d] = %zu: my "
                       "block to myself must have one size",
                       me, op->sb[me], me, op->rb[me]);
    if (op->sb[me] > 0)
      memmove((char *)recv + op->ro[me], (const char *)send + op->so[me],
              op->sb[me]);
    op->p_send = send;
    op->p_recv = recv;
    op->plan[np++] = ZPP_PH_PAIR;
    break;
  case ZPP_XFER_REDUCE_SCATTER:
    op->dtype = a->dtype;
    op->rop = a->op;
    for (i = 0; i < n; i++) {
      op->off[i] = (size_t)i * a->count;
      op->len[i] = a->count;
    }
    if (hier) {
      ZPP_CHECK(zpp_algo_setup_hrs(op, send, recv));
      op->plan[np++] = ZPP_PH_HRS;
      break;
    }
    ZPP_CHECK(zpp_algo_setup_reduce(op, send, recv));
    if (n > 1) {
      op->plan[np++] = ZPP_PH_PAIR;
      op->plan[np++] = ZPP_PH_REDUCE;
    }
    break;
  case ZPP_XFER_ALLREDUCE: {
    size_t es = zpp_dtype_size(a->dtype);
    op->dtype = a->dtype;
    op->rop = a->op;
    for (i = 0; i < n; i++) {
      shard(a->count, n, i, &op->off[i], &op->len[i]);
      op->displs[i] = op->off[i] * es;
      op->bytes[i] = op->len[i] * es;
    }
    /* The reduced shard lands in place in recv; reading send's shard `me`
     * and writing recv's is element by element, so send == recv is safe
     * (hierarchical: chunk c of my shard is written a round after it was
     * read, and the shards of the others are only read). */
    zpp_algo_setup_ring(op, recv, NULL);
    if (hier) {
      ZPP_CHECK(zpp_algo_setup_hrs(op, send, (char *)recv + op->displs[me]));
      op->plan[np++] = ZPP_PH_HRS;
      op->plan[np++] = ZPP_PH_HAG;
      break;
    }
    ZPP_CHECK(zpp_algo_setup_reduce(op, send, (char *)recv + op->displs[me]));
    if (n > 1) {
      op->plan[np++] = ZPP_PH_PAIR;
      op->plan[np++] = ZPP_PH_REDUCE;
      op->plan[np++] = ZPP_PH_RING;
    }
    break;
  }
  case ZPP_XFER_BARRIER:
    op->plan[np++] = ZPP_PH_BARRIER;
    break;
  }
  op->plan[np] = ZPP_PH_END;
  return ZPP_OK;
}

/* ---- progress ------------------------------------------------------------------ */

/* Cancels the round in flight.  Transfers the backend could not cancel
 * at once break the transport and put its buffers in doubt: the op's
 * buffers are then held by zpp_algo_release_buffers, never reused. */
static void cancel_round(zpp_xop_t *op) {
  if (op->round != NULL) {
    int left = op->t->ops->round->round_cancel(op->t, op->round);
    op->round = NULL;
    zpp_transport_add_in_doubt(op->t, left, op->what);
  }
}

static zpp_status_t timed_out(zpp_xop_t *op) {
  zpp_transport_t *t = op->t;
  char who[160] = "";
  if (op->round != NULL && t->ops->round->round_pending != NULL)
    t->ops->round->round_pending(t, op->round, who, sizeof who);
  /* Broken first: the timeout is the cause, not what the cancel left. */
  zpp_transport_break(t, "%s on group %s timed out after %.3g s", op->what,
                      zpp_group_name(op->g), t->timeout_s);
  /* Point-to-point transfers are cancelled; a backend barrier may be left
   * to finish when the late peers arrive (MPI cannot cancel one). */
  cancel_round(op);
  return zpp_error(ZPP_ERR_TIMEOUT, op->what,
                   "group %s: no completion within %.3g s (ZPP_TIMEOUT_S)%s%s; "
                   "a peer is missing or stuck; the communicator is aborted",
                   zpp_group_name(op->g), t->timeout_s,
                   who[0] ? " of transfers " : "", who);
}

/* Runs the next step of the plan: posts a round (op->round), or completes
 * one without messages, or computes, or finishes the op. */
static zpp_status_t next_step(zpp_xop_t *op) {
  zpp_status_t st;
  int end = 0; /* the phase has no step left: on to the next */
  switch (op->plan[op->phase]) {
  case ZPP_PH_RING:
    st = zpp_algo_ring_step(op, &end);
    break;
  case ZPP_PH_PAIR:
    st = zpp_algo_pair_step(op, &end);
    break;
  case ZPP_PH_HAG:
    st = zpp_algo_hag_step(op, &end);
    break;
  case ZPP_PH_HRS:
    st = zpp_algo_hrs_step(op, &end);
    break;
  case ZPP_PH_REDUCE:
    st = zpp_algo_reduce_step(op, &end);
    break;
  case ZPP_PH_BARRIER:
    st = barrier_step(op, &end);
    break;
  case ZPP_PH_END:
  default:
    st = zpp_algo_unstage(op);
    op->state = ZPP_XS_DONE;
    return st;
  }
  if (!end)
    return st;
  op->phase++;
  op->step = 0;
  return ZPP_OK;
}

/* Advances op as far as it goes without blocking (t->lock held). */
static zpp_status_t advance(zpp_xop_t *op) {
  zpp_transport_t *t = op->t;
  int guard;
  if (t->broken) { /* also zpp_comm_abort from another thread */
    cancel_round(op);
    return zpp_transport_broken_error(t, op->what);
  }
  /* Each pass completes a round or a step; the plan has at most
   * 3 + ring steps + barrier rounds of them. */
  for (guard = 0; guard < 4 * op->n + 64; guard++) {
    if (op->round != NULL) {
      int done = 0;
      zpp_status_t st = t->ops->round->round_test(t, op->round, &done);
      if (st != ZPP_OK) {
        cancel_round(op);
        return st;
      }
      if (!done)
        return zpp_time_ns() > op->limit_ns ? timed_out(op) : ZPP_OK;
      op->round = NULL;
      round_complete(op);
    }
    if (op->wake_ns > 0) {
      int64_t now = zpp_time_ns();
      if (now < op->wake_ns)
        return ZPP_OK;
      atomic_fetch_add(&t->emu_wait_ns,
                       (uint_fast64_t)(op->wake_ns - op->arrived_ns));
      op->wake_ns = 0;
    }
    if (op->state == ZPP_XS_DONE)
      return ZPP_OK;
    ZPP_CHECK(next_step(op));
    if (op->state == ZPP_XS_DONE)
      return ZPP_OK;
  }
  return ZPP_OK; /* more next time */
}

/* The family an op runs (tune.c): *hier, and the chunks its choice set. */
static void choose(zpp_transport_t *t, const zpp_tgroup_t *gr,
                   const zpp_xfer_desc_t *a, int *hier, int *c_rs, int *c_ag) {
  size_t bytes = 0;
  int coll, i;
  *hier = *c_rs = *c_ag = 0;
  switch (a->kind) {
  case ZPP_XFER_ALLGATHER:
    coll = ZPP_TUNE_AG;
    bytes = a->bytes;
    break;
  case ZPP_XFER_ALLGATHERV: /* the largest block: every member knows it */
    coll = ZPP_TUNE_AG;
    for (i = 0; i < gr->size; i++)
      if (a->recv_bytes[i] > bytes)
        bytes = a->recv_bytes[i];
    break;
  case ZPP_XFER_REDUCE_SCATTER:
    coll = ZPP_TUNE_RS;
    bytes = a->count * zpp_dtype_size(a->dtype);
    break;
  case ZPP_XFER_ALLREDUCE:
    coll = ZPP_TUNE_AR;
    bytes = a->count * zpp_dtype_size(a->dtype);
    break;
  default:
    return;
  }
  zpp_algo_choose(t, a->group, coll, bytes, a->dtype, hier, c_rs, c_ag);
}

zpp_status_t zpp_algo_start(zpp_transport_t *t, const zpp_xfer_desc_t *a,
                            int sync_out, zpp_xop_t **out) {
  const zpp_tgroup_t *gr = &t->grp[a->group];
  int n = gr->size, ring = a->kind == ZPP_XFER_ALLGATHER ||
                           a->kind == ZPP_XFER_ALLGATHERV ||
                           a->kind == ZPP_XFER_ALLREDUCE;
  int hier, c_rs, c_ag, nc;
  uint32_t span = t->tag_limit / ZPP_NSUB;
  zpp_xop_t *op;
  zpp_status_t st;
  /* The tag is taken before anything can fail, so every member's sequence
   * stays in step with the others'. */
  uint32_t seq = t->grp[a->group].seq++;
  choose(t, gr, a, &hier, &c_rs, &c_ag);
  /* hierarchical ops run one rotated ring: nc = 1 */
  nc = ring && !hier ? zpp_algo_ring_channels(t, gr) : 1;
  op = op_alloc(n, nc, hier ? zpp_algo_hier_slots(t, gr) : 0);
  if (op == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, zpp_xfer_name(a->kind),
                     "operation of %d members",
                     n);
  op->hier = hier;
  op->hc_rs = c_rs;
  op->hc_ag = c_ag;
  op->t = t;
  op->kind = a->kind;
  op->g = a->group;
  op->what = zpp_xfer_name(a->kind);
  op->n = n;
  op->me = gr->index;
  op->nc = nc;
  op->tag = (span > 0 ? seq % span : 0) * ZPP_NSUB;
  op->sync_out = sync_out;
  op->limit_ns = t->timeout_s > 0
                     ? zpp_time_ns() + (int64_t)(t->timeout_s * 1e9)
                     : INT64_MAX;
  st = setup(op, a);
  /* The first round goes out now, so the transfer overlaps whatever the
   * caller does before it tests. */
  if (st == ZPP_OK)
    st = advance(op);
  if (st != ZPP_OK) {
    zpp_algo_release_buffers(op, 0);
    free(op);
    return st;
  }
  *out = op;
  return ZPP_OK;
}

zpp_status_t zpp_xop_test(zpp_xop_t *op, int *done) {
  zpp_transport_t *t;
  zpp_status_t st;
  if (op == NULL || done == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "%s is NULL",
                     op == NULL ? "op" : "done");
  *done = 0;
  if (op->state == ZPP_XS_DONE) {
    *done = 1;
    return ZPP_OK;
  }
  t = op->t;
  pthread_mutex_lock(&t->lock);
  st = advance(op);
  if (st != ZPP_OK) {
    zpp_algo_release_buffers(op, 0);
    op->state = ZPP_XS_DONE;
  }
  *done = op->state == ZPP_XS_DONE;
  pthread_mutex_unlock(&t->lock);
  return zpp_transport_fail(t, st);
}

int64_t zpp_xop_wake_ns(const zpp_xop_t *op) {
  return op != NULL && op->state != ZPP_XS_DONE ? op->wake_ns : 0;
}

void zpp_xop_free(zpp_xop_t *op) {
  zpp_transport_t *t;
  if (op == NULL || op->t == NULL)
    return;
  t = op->t;
  pthread_mutex_lock(&t->lock);
  if (op->state != ZPP_XS_DONE) {
    /* Its peers cannot complete without it: they time out.  Broken
     * first: that is the cause, not what the cancel may leave. */
    if (!t->broken)
      zpp_transport_break(t, "%s on group %s was freed while in flight",
                          op->what, zpp_group_name(op->g));
    cancel_round(op);
    zpp_algo_release_buffers(op, 0);
  }
  pthread_mutex_unlock(&t->lock);
  free(op);
}
