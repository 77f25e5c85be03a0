/*
 * The algorithms of the host backends (MPI, UCX), written once against the
 * round primitive of src/transport.h (post a set of point-to-point
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
 * Hierarchical (ZPP_ALGO=hier, the default, on a group that spans several
 * nodes with more than one member on some node).  On node m every member
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
 * The blocks are cut in up to 8 chunks (ZPP_HIER_CHUNK bytes) and round r
 * carries the first stage of chunk r with the second stage of chunk r-1,
 * so the intra-node work hides behind the inter-node transfers.
 *
 * Also here, once for every host backend: tags (per-group sequence),
 * link emulation (the deadline header is one more transfer of the round;
 * a round whose data arrived completes only once its latest deadline has
 * passed, and zpp_xop_wake_ns says when), the timeout from the op's start,
 * staging of device memory through pinned host buffers (a small cache per
 * transport, so ops in flight have their own), and the wait loop's
 * spin-then-sleep policy (ZPP_NET_SPIN_US).
 */
#include "algo/algo_impl.h"
#include "core/core.h"
#include "kernels/elementwise.h"
#include "kernels/quant_math.h"
#include "quant/quant.h"
#include "transport/transport_impl.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* An op's transfers carry tag = base + sub, base = (group sequence number
 * modulo tag_limit / NSUB) * NSUB. */
enum { SUB_DATA = 0, SUB_EMU = 1, SUB_CTL = 2, NSUB = 4 };

/* Phases; an op runs its plan in order. */
enum { PH_RING, PH_PAIR, PH_REDUCE, PH_BARRIER, PH_HAG, PH_HRS, PH_END };
#define MAX_PHASES 4

/* ---- per-transport caches: reduction scratch and pinned staging ---------
 * Ops in flight at once need their own buffers; a few are kept for reuse
 * so a steady stream of operations allocates nothing.  Guarded by t->lock
 * (every caller holds it). */
#define SLOTS 8

typedef struct {
  void *p;
  size_t cap;
  int busy;
#if ZPP_HAVE_CUDA
  cudaEvent_t ev; /* recorded after the stage-out copy that reads it */
  int ev_made, ev_pending;
  int lost; /* a copy may still use it and no event says when: leaked */
#endif
} slot_t;

/* Pinned staging buffers.  cudaFreeHost synchronises the whole device, so
 * it never runs while operations may be in flight (it would wait for the
 * caller's unrelated work, from inside a non-blocking test): pinned slots
 * are only ever added (SLOTS in the array, more on a list when all are
 * busy), and a slot too small for a request gets a larger buffer while the
 * old one is retired, kept until zpp_algo_destroy.  Capacities are powers
 * of two, so a slot's retired buffers total less than its current one. */
typedef struct more_slot {
  slot_t s;
  struct more_slot *next;
} more_slot_t;

typedef struct retired {
  void *p;
  struct retired *next;
} retired_t;

struct zpp_algo {
  slot_t host[SLOTS];
  slot_t pinned[SLOTS];
  more_slot_t *more;  /* pinned slots beyond SLOTS */
  retired_t *retired; /* pinned buffers replaced by larger ones */
  /* Buffers of ops released while cancelled transfers may still touch
   * them (t->in_doubt): freed by zpp_algo_destroy only once the transport
   * is quiet, else leaked. */
  retired_t *held_host, *held_pinned;
};

/* A buffer of an op: a cache slot, or its own when every slot is busy. */
typedef struct {
  slot_t *slot;
  void *own;
  void *p;
} buf_t;

static void algo_release(zpp_transport_t *t);

static zpp_status_t algo_state(zpp_transport_t *t, const char *what) {
  if (t->algo == NULL && (t->algo = calloc(1, sizeof *t->algo)) == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "transport caches");
  t->algo_release = algo_release;
  return ZPP_OK;
}

/* Host scratch of `need` bytes. */
static zpp_status_t host_get(zpp_transport_t *t, size_t need, buf_t *b,
                             const char *what) {
  slot_t *best = NULL, *idle = NULL;
  int i;
  ZPP_CHECK(algo_state(t, what));
  for (i = 0; i < SLOTS; i++) {
    slot_t *s = &t->algo->host[i];
    if (s->busy)
      continue;
    if (s->cap >= need && (best == NULL || s->cap < best->cap))
      best = s;
    if (idle == NULL || s->cap > idle->cap)
      idle = s;
  }
  if (best == NULL && idle != NULL) {
    void *p = malloc(need);
    if (p == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what,
                       "reduction scratch of %zu bytes", need);
    free(idle->p);
    idle->p = p;
    idle->cap = need;
    best = idle;
  }
  if (best != NULL) {
    best->busy = 1;
    b->slot = best;
    b->own = NULL;
    b->p = best->p;
    return ZPP_OK;
  }
  b->slot = NULL;
  b->own = b->p = malloc(need);
  if (b->own == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what,
                     "reduction scratch of %zu bytes", need);
  return ZPP_OK;
}

/* Moves b's memory onto the held list *l (its slot, if any, is left
 * empty); without memory for the list node it is leaked. */
static void hold(retired_t **l, buf_t *b) {
  void *p = b->slot != NULL ? b->slot->p : b->own;
  retired_t *h;
  if (b->slot != NULL) {
    b->slot->p = NULL;
    b->slot->cap = 0;
    b->slot->busy = 0;
  }
  b->slot = NULL;
  b->own = b->p = NULL;
  if (p != NULL && (h = (retired_t *)calloc(1, sizeof *h)) != NULL) {
    h->p = p;
    h->next = *l;
    *l = h;
  }
}

static void host_put(buf_t *b) {
  if (b->slot != NULL)
    b->slot->busy = 0;
  free(b->own);
  b->slot = NULL;
  b->own = b->p = NULL;
}

#if ZPP_HAVE_CUDA
static zpp_status_t cuda_err(cudaError_t e, const char *what, const char *call) {
  return zpp_error(ZPP_ERR_CUDA, what, "%s: %s", call, cudaGetErrorString(e));
}

/* A pinned slot is free once no stage-out copy reads it any more. */
static int pinned_idle(slot_t *s) {
  if (s->busy)
    return 0;
  if (s->ev_pending) {
    cudaError_t e = cudaEventQuery(s->ev);
    if (e == cudaErrorNotReady)
      return 0;
    (void)cudaGetLastError(); /* an error surfaces on the stream's owner */
    s->ev_pending = 0;
  }
  return 1;
}

/* The pinned slot after s (the array, then the list; *cur tracks the
 * list node, NULL while in the array); s NULL: the first. */
static slot_t *pinned_next(struct zpp_algo *a, slot_t *s, more_slot_t **cur) {
  if (s == NULL) {
    *cur = NULL;
    return &a->pinned[0];
  }
  if (*cur == NULL) {
    if (s != &a->pinned[SLOTS - 1])
      return s + 1;
    *cur = a->more;
  } else {
    *cur = (*cur)->next;
  }
  return *cur != NULL ? &(*cur)->s : NULL;
}

static size_t pow2_at_least(size_t n) {
  size_t c = 4096;
  while (c < n && c <= SIZE_MAX / 2)
    c *= 2;
  return c < n ? n : c;
}

static zpp_status_t pinned_get(zpp_transport_t *t, size_t need, buf_t *b,
                               const char *what) {
  slot_t *best = NULL, *idle = NULL, *s;
  more_slot_t *cur = NULL;
  struct zpp_algo *a;
  ZPP_CHECK(algo_state(t, what));
  a = t->algo;
  for (s = pinned_next(a, NULL, &cur); s != NULL; s = pinned_next(a, s, &cur)) {
    if (!pinned_idle(s))
      continue;
    if (s->cap >= need && (best == NULL || s->cap < best->cap))
      best = s;
    if (idle == NULL || s->cap > idle->cap)
      idle = s;
  }
  if (best == NULL) {
    size_t cap = pow2_at_least(need);
    void *p = NULL;
    retired_t *old = NULL;
    more_slot_t *ms = NULL;
    cudaError_t e;
    if ((idle != NULL && idle->p != NULL &&
         (old = (retired_t *)calloc(1, sizeof *old)) == NULL) ||
        (idle == NULL && (ms = (more_slot_t *)calloc(1, sizeof *ms)) == NULL)) {
      free(old);
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "pinned slot list");
    }
    e = cudaMallocHost(&p, cap);
    if (e != cudaSuccess) {
      free(old);
      free(ms);
      return cuda_err(e, what, "cudaMallocHost");
    }
    if (idle == NULL) {
      ms->next = a->more;
      a->more = ms;
      idle = &ms->s;
    } else if (old != NULL) {
      old->p = idle->p;
      old->next = a->retired;
      a->retired = old;
    }
    idle->p = p;
    idle->cap = cap;
    best = idle;
  }
  best->busy = 1;
  b->slot = best;
  b->own = NULL;
  b->p = best->p;
  return ZPP_OK;
}

/* Releases b; `stream` non-NULL-or-legacy with pending = 1: a copy on it
 * still uses b, so the slot waits for an event recorded there.  Never
 * blocks: where the event cannot be made (a broken CUDA context), the slot
 * is lost, never reused nor freed, rather than waiting for the stream. */
static void pinned_put(buf_t *b, int pending, void *stream) {
  if (b->slot != NULL) {
    slot_t *s = b->slot;
    if (pending) {
      cudaError_t e = cudaSuccess;
      if (!s->ev_made) {
        e = cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming);
        s->ev_made = e == cudaSuccess;
      }
      if (e == cudaSuccess)
        e = cudaEventRecord(s->ev, (cudaStream_t)stream);
      if (e == cudaSuccess) {
        s->ev_pending = 1;
      } else {
        (void)cudaGetLastError();
        s->lost = 1;
        b->slot = NULL;
        b->own = b->p = NULL;
        return;
      }
    }
    s->busy = 0;
  }
  b->slot = NULL;
  b->own = b->p = NULL;
}
#endif

/* Frees a held list, or (quiet = 0: cancelled transfers may still touch
 * the buffers) leaks the buffers and frees only the list nodes. */
static void held_free(retired_t **l, int quiet, int pinned) {
  while (*l != NULL) {
    retired_t *h = *l;
    *l = h->next;
    if (quiet && !pinned)
      free(h->p);
#if ZPP_HAVE_CUDA
    else if (quiet)
      cudaFreeHost(h->p);
#endif
    free(h);
  }
}

/* The transport's algo_release: after the backend's destroy. */
static void algo_release(zpp_transport_t *t) {
  int i, quiet;
  if (t->algo == NULL)
    return;
  /* zpp_transport_free drained the backend first */
  quiet = !zpp_transport_in_doubt(t);
  if (!quiet && (t->algo->held_host != NULL || t->algo->held_pinned != NULL))
    ZPP_WARN(ZPP_SUBSYS_NET, "destroy: buffers of failed operations are "
                             "leaked: cancelled transfers may still use them");
  held_free(&t->algo->held_host, quiet, 0);
  held_free(&t->algo->held_pinned, quiet, 1);
  for (i = 0; i < SLOTS; i++)
    free(t->algo->host[i].p);
#if ZPP_HAVE_CUDA
  {
    struct zpp_algo *a = t->algo;
    slot_t *s;
    more_slot_t *cur = NULL;
    double to = zpp_transport_timeout_s(t);
    int64_t limit = zpp_time_ns() + (int64_t)((to > 0 ? to : 60.0) * 1e9);
    int leak = 0;
    /* Stage-out copies may still read slots: wait for them, bounded (a
     * buffer whose copy never completes is leaked, never freed under it). */
    for (s = pinned_next(a, NULL, &cur); s != NULL; s = pinned_next(a, s, &cur)) {
      struct timespec ts = {0, 1000000};
      if (s->lost) {
        leak = 1;
        continue;
      }
      while (!pinned_idle(s) && zpp_time_ns() < limit)
        nanosleep(&ts, NULL);
      if (!pinned_idle(s)) {
        leak = 1;
        continue;
      }
      if (s->ev_made)
        cudaEventDestroy(s->ev);
      if (s->p != NULL)
        cudaFreeHost(s->p);
    }
    if (leak)
      ZPP_WARN(ZPP_SUBSYS_NET, "destroy: a staging copy did not finish within "
                               "the timeout; its pinned buffer is leaked");
    while (a->more != NULL) {
      more_slot_t *m = a->more;
      a->more = m->next;
      free(m);
    }
    while (a->retired != NULL) {
      retired_t *r = a->retired;
      a->retired = r->next;
      cudaFreeHost(r->p);
      free(r);
    }
  }
#endif
  free(t->algo);
  t->algo = NULL;
}

/* ---- the op ---------------------------------------------------------------- */

enum { XS_RUNNING = 0, XS_DONE = 1 };

struct zpp_xop {
  zpp_transport_t *t; /* NULL: the shared done op */
  zpp_xfer_kind_t kind;
  zpp_group_t g;
  const char *what;
  int state;
  int n, me;
  uint32_t tag; /* base tag (SUB_* added) */
  int64_t limit_ns;
  /* The plan and where it is. */
  int plan[MAX_PHASES + 1];
  int phase, step;
  /* The round in flight (NULL: none), its data transfers, and what was
   * posted (data plus emulation headers). */
  zpp_round_t *round;
  int ctl; /* the round carries control messages: not counted, no emulation */
  int nin, nout, nhdr;
  zpp_xfer_t *din, *dout; /* [k] */
  zpp_xfer_t *rx, *sx;    /* [2k] */
  int64_t *hin, *hout;    /* [k] deadlines received / sent */
  int64_t wake_ns;        /* emulated data not usable before (0: none) */
  int64_t arrived_ns;     /* when that round's data arrived */
  /* Ring phase: blocks by member index at ring_buf + displs[i].  My own
   * block is sent in round 0 from ring_send when it is not in place yet,
   * and copied into place while that round is on the wire. */
  char *ring_buf;
  const char *ring_send;
  size_t *bytes, *displs; /* [n] */
  int nc;                 /* rings */
  int *rings, *pos;       /* [nc * n], [nc] */
  /* Pairwise phase: to member j sb[j] bytes at p_send + so[j], from j rb[j]
   * bytes at p_recv + ro[j]. */
  const char *p_send;
  char *p_recv;
  size_t *sb, *so, *rb, *ro; /* [n] */
  /* Reduction: shards (elements) and the blocks summed into dst. */
  size_t *off, *len; /* [n] */
  const void **blocks; /* [n] */
  void *dst;
  zpp_dtype_t dtype;
  zpp_reduce_op_t rop;
  buf_t tmp;
  /* Barrier: one byte each way per round. */
  char bar_out, bar_in;
  /* Hierarchical phases: hc chunks; my node hn (hs members, mine at
   * position hl); own[w]: the owner of member w's block or slice on my
   * node; the na members I own, alist (increasing), ai[w] (their position
   * there, -1 when not mine), pre[a] (element offset of alist[a]'s slice
   * in the partial sums, la in all).  RS scratch: ra, the slices I own
   * from every other member of my node ((hs - 1) * la elements of dtype);
   * pp, my partial sums (la elements of pdt); rbuf, the partials of my
   * slice from the other nodes ((nh - 1) * len[me] of pdt).  pdt: the
   * partials' wire dtype (hier_partial_dtype). */
  int hc, hn, hs, hl, na;
  zpp_dtype_t pdt;
  int *own, *ai, *alist; /* [n] */
  size_t *pre;           /* [n] */
  size_t la;
  char *ra, *pp, *rbuf;
  /* Device staging: the host algorithm runs on stage_in / stage_out; at
   * the end stage_out is copied to `user_recv` on `stream`: all of it
   * (nu < 0) or, for the v-variants, only its nu runs of blocks (uoff[r],
   * ulen[r] bytes). */
  int staged, sync_out;
  int nu;
  size_t *uoff, *ulen; /* [n] */
  int stage_pending; /* a staging copy may still run: buffers wait for it */
  void *stream;
  void *user_recv;
  size_t out_bytes;
  buf_t stage_in, stage_out;
};

/* The op of stream-ordered backends: done from the start. */
static zpp_xop_t done_op = {.state = XS_DONE};

zpp_xop_t *zpp_xop_done(void) { return &done_op; }

/* ---- helpers from the blocking algorithms -------------------------------- */

/* Rings ("channels"): ZPP_NET_RINGS rings run at once, each over its own
 * share of every block (chunk c of C: floor split, the first b % C chunks
 * one byte longer).  Ring c visits the nodes in order and each node's
 * members rotated by c, so its node boundaries -- the inter-node hops --
 * fall on other ranks than ring 0's, and the inter-node bytes leave
 * through C ranks per node instead of one.  C is capped by the largest
 * node run of the group (rotating a run of one changes nothing). */
static int ring_channels(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
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

static void chunk_of(size_t b, int c, int nc, size_t *lo, size_t *len) {
  size_t q = b / (size_t)nc, r = b % (size_t)nc, cc = (size_t)c;
  *len = q + (cc < r ? 1 : 0);
  *lo = q * cc + (cc < r ? cc : r);
}

/* Shard of member j of a balanced split of `count` elements over n. */
static void shard(size_t count, int n, int j, size_t *off, size_t *len) {
  size_t q = count / (size_t)n, r = count % (size_t)n, jj = (size_t)j;
  *len = q + (jj < r ? 1 : 0);
  *off = jj * q + (jj < r ? jj : r);
}

/* dst[e] = sum over i = 0..n-1 of block i (dtype in_dt), element e, in
 * that order with an fp32 accumulator, divided by div when div > 0 (MEAN),
 * rounded once to out_dt (kernels/quant/elementwise.c, in tiles). */
static void reduce_blocks(void *dst, zpp_dtype_t out_dt,
                          const void *const *blocks, zpp_dtype_t in_dt, int n,
                          size_t count, float div) {
  zpp_ew_reduce_blocks_host(zpp_quant_cpu_simd(), dst, (int)out_dt, blocks,
                            (int)in_dt, n, count, div);
}

#if ZPP_HAVE_CUDA
/* End of the furthest block (displacements NULL: packed). */
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
#endif

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
static zpp_status_t post_round(zpp_xop_t *op) {
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
      h->tag = op->tag + SUB_EMU;
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
      h->tag = op->tag + SUB_EMU;
    }
    op->sx[ns++] = *x;
  }
  if (nr + ns == 0) {
    round_complete(op);
    return ZPP_OK;
  }
  return t->ops->round->round_post(t, op->g, op->rx, nr, op->sx, ns, &op->round);
}

static void data_xfer(zpp_xop_t *op, zpp_xfer_t *x, int peer, const void *buf,
                      size_t bytes) {
  x->peer = peer;
  x->buf = (void *)buf;
  x->bytes = bytes;
  x->tag = op->tag + SUB_DATA;
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
    chunk_of(op->bytes[sb], c, op->nc, &lo, &len);
    data_xfer(op, &op->dout[c], R[(p + 1) % n],
              (s == 0 && op->ring_send != NULL
                   ? op->ring_send
                   : op->ring_buf + op->displs[sb]) + lo,
              len);
    chunk_of(op->bytes[rb], c, op->nc, &lo, &len);
    data_xfer(op, &op->din[c], R[(p + n - 1) % n],
              op->ring_buf + op->displs[rb] + lo, len);
  }
  op->nin = op->nout = op->nc;
  op->ctl = 0;
  return post_round(op);
}

/* All n-1 pairs at once, in the order me+1, me+2, ... */
static zpp_status_t pair_round(zpp_xop_t *op) {
  int n = op->n, me = op->me, s;
  for (s = 1; s < n; s++) {
    int to = (me + s) % n, from = (me - s + n) % n;
    data_xfer(op, &op->dout[s - 1], to, op->p_send + op->so[to], op->sb[to]);
    data_xfer(op, &op->din[s - 1], from, op->p_recv + op->ro[from],
              op->rb[from]);
  }
  op->nin = op->nout = n - 1;
  op->ctl = 0;
  return post_round(op);
}

/* Dissemination round k: a byte to member me + 2^k, one from me - 2^k. */
static zpp_status_t barrier_round(zpp_xop_t *op) {
  int n = op->n, d = 1 << op->step;
  op->dout[0].peer = (op->me + d) % n;
  op->dout[0].buf = &op->bar_out;
  op->dout[0].bytes = 1;
  op->dout[0].tag = op->tag + SUB_CTL;
  op->din[0].peer = (op->me - d % n + n) % n;
  op->din[0].buf = &op->bar_in;
  op->din[0].bytes = 1;
  op->din[0].tag = op->tag + SUB_CTL;
  op->nin = op->nout = 1;
  op->ctl = 1;
  return post_round(op);
}

/* ---- hierarchical all-gather and reduce-scatter ------------------------------
 * (the algorithm is described at the top of this file; docs/design.md,
 * "Transports", gives the byte formulas). */

/* Whether ops on group g run hierarchically: the default algorithm, more
 * than one node, and some node with more than one member (with one member
 * per node there is nothing to aggregate: the flat algorithms are it). */
static int hier_on(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
  return !t->flat && gr->nh > 1 && gr->nh < gr->size;
}

/* The dtype a node's partial sum travels in: fp32 for fp16 (an fp16
 * partial overflows past 65504 where the total, after cancellation across
 * nodes, need not: 4 fp16 gradients of 20000 on one node, -20000 on the
 * other), so the inter-node partials of fp16 take twice the bytes; bf16
 * keeps its own (its range is fp32's: it overflows only where the fp32
 * partial lies within 2^-8 of fp32's own limit, docs/collectives.md),
 * fp32 is itself. */
static zpp_dtype_t hier_partial_dtype(zpp_dtype_t dtype) {
  return dtype == ZPP_FLOAT16 ? ZPP_FLOAT32 : dtype;
}

/* Chunks of a stage whose largest block is `maxbytes`: the same on every
 * member, since every member knows every block size. */
static int hier_chunks(const zpp_transport_t *t, size_t maxbytes) {
  size_t c;
  if (t->hier_chunk == 0 || maxbytes <= t->hier_chunk)
    return 1;
  c = (maxbytes + t->hier_chunk - 1) / t->hier_chunk;
  return c > 8 ? 8 : (int)c;
}

/* Member at position `pos` mod the size of node k's run. */
static int node_member(const zpp_tgroup_t *gr, int k, int pos) {
  int size = gr->hoff[k + 1] - gr->hoff[k];
  return gr->ring[gr->hoff[k] + pos % size];
}

/* My node, the owners on it, and what I own (the same set for both
 * collectives: I gather and forward the blocks of the members whose
 * slices I reduce). */
static void hier_setup(zpp_xop_t *op) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  int w;
  op->hn = gr->hnode[op->me];
  op->hl = gr->hlocal[op->me];
  op->hs = gr->hoff[op->hn + 1] - gr->hoff[op->hn];
  op->na = 0;
  for (w = 0; w < op->n; w++) {
    op->own[w] = node_member(gr, op->hn, gr->hlocal[w]);
    op->ai[w] = -1;
    if (op->own[w] == op->me) {
      op->ai[w] = op->na;
      op->alist[op->na++] = w;
    }
  }
}

/* Transfers a hierarchical round can hold (sends or receives): stage X or
 * B is at most one per member, stage N or A at most one per member plus
 * (hs - 1) per member I own. */
static int hier_slots(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
  int hs = gr->hoff[gr->hnode[gr->index] + 1] - gr->hoff[gr->hnode[gr->index]];
  int na = 0, w;
  if (!hier_on(t, gr))
    return 0;
  for (w = 0; w < gr->size; w++)
    na += node_member(gr, gr->hnode[gr->index], gr->hlocal[w]) == gr->index;
  return 2 * gr->size + (hs - 1) * na;
}

/* All-gather round r: stage X of chunk r (r < hc), stage N of chunk r - 1
 * (r >= 1).  To one peer both sides list the blocks in member order, so
 * transfers of a pair match in posting order. */
static zpp_status_t hag_round(zpp_xop_t *op, int r) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  int n = op->n, me = op->me, C = op->hc, ns = 0, nr = 0, s, w, a;
  size_t lo, len;
  if (r < C) {
    const char *mine = op->ring_send != NULL ? op->ring_send
                                             : op->ring_buf + op->displs[me];
    chunk_of(op->bytes[me], r, C, &lo, &len);
    for (s = 1; s < gr->nh; s++)
      data_xfer(op, &op->dout[ns++],
                node_member(gr, (op->hn + s) % gr->nh, op->hl), mine + lo,
                len);
    for (w = 0; w < n; w++)
      if (gr->hnode[w] != op->hn && op->own[w] == me) {
        chunk_of(op->bytes[w], r, C, &lo, &len);
        data_xfer(op, &op->din[nr++], w, op->ring_buf + op->displs[w] + lo,
                  len);
      }
  }
  if (r >= 1) {
    for (s = 1; s < op->hs; s++) {
      int j = node_member(gr, op->hn, op->hl + s);
      for (a = 0; a < op->na; a++) {
        w = op->alist[a];
        chunk_of(op->bytes[w], r - 1, C, &lo, &len);
        data_xfer(op, &op->dout[ns++], j, op->ring_buf + op->displs[w] + lo,
                  len);
      }
      for (w = 0; w < n; w++)
        if (op->own[w] == j) {
          chunk_of(op->bytes[w], r - 1, C, &lo, &len);
          data_xfer(op, &op->din[nr++], j, op->ring_buf + op->displs[w] + lo,
                    len);
        }
    }
  }
  op->nin = nr;
  op->nout = ns;
  op->ctl = 0;
  return post_round(op);
}

/* Reduce-scatter round r: stage A of chunk r (r < hc), stage B of chunk
 * r - 1 (r >= 1).  Chunks are element ranges of each slice. */
static zpp_status_t hrs_round(zpp_xop_t *op, int r) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  size_t es = zpp_dtype_size(op->dtype), pes = zpp_dtype_size(op->pdt), lo, cl;
  int n = op->n, me = op->me, C = op->hc, ns = 0, nr = 0, s, w, a;
  if (r < C) {
    for (s = 1; s < op->hs; s++) {
      int jl = (op->hl + s) % op->hs, jp = jl < op->hl ? jl : jl - 1;
      int j = node_member(gr, op->hn, jl);
      for (w = 0; w < n; w++)
        if (op->own[w] == j) {
          chunk_of(op->len[w], r, C, &lo, &cl);
          data_xfer(op, &op->dout[ns++], j,
                    op->p_send + (op->off[w] + lo) * es, cl * es);
        }
      for (a = 0; a < op->na; a++) {
        chunk_of(op->len[op->alist[a]], r, C, &lo, &cl);
        data_xfer(op, &op->din[nr++], j,
                  op->ra + ((size_t)jp * op->la + op->pre[a] + lo) * es,
                  cl * es);
      }
    }
  }
  if (r >= 1) {
    for (a = 0; a < op->na; a++) {
      w = op->alist[a];
      if (gr->hnode[w] == op->hn)
        continue;
      chunk_of(op->len[w], r - 1, C, &lo, &cl);
      data_xfer(op, &op->dout[ns++], w, op->pp + (op->pre[a] + lo) * pes,
                cl * pes);
    }
    chunk_of(op->len[me], r - 1, C, &lo, &cl);
    for (s = 1; s < gr->nh; s++) {
      int k = (op->hn + s) % gr->nh, kp = k < op->hn ? k : k - 1;
      data_xfer(op, &op->din[nr++], node_member(gr, k, op->hl),
                op->rbuf + ((size_t)kp * op->len[me] + lo) * pes, cl * pes);
    }
  }
  op->nin = nr;
  op->nout = ns;
  op->ctl = 0;
  return post_round(op);
}

/* Chunk c of every partial sum I own: my node's contributions in local
 * order (mine from the send buffer), fp32, rounded to the wire dtype. */
static void hrs_partial(zpp_xop_t *op, int c) {
  size_t es = zpp_dtype_size(op->dtype), pes = zpp_dtype_size(op->pdt), lo, cl;
  int a, jl;
  for (a = 0; a < op->na; a++) {
    int w = op->alist[a];
    chunk_of(op->len[w], c, op->hc, &lo, &cl);
    for (jl = 0; jl < op->hs; jl++) {
      int jp = jl < op->hl ? jl : jl - 1;
      op->blocks[jl] =
          jl == op->hl
              ? op->p_send + (op->off[w] + lo) * es
              : op->ra + ((size_t)jp * op->la + op->pre[a] + lo) * es;
    }
    reduce_blocks(op->pp + (op->pre[a] + lo) * pes, op->pdt, op->blocks,
                  op->dtype, op->hs, cl, 0.0f);
  }
}

/* Chunk c of my slice: the nodes' partial sums in node order (mine from
 * pp), fp32, MEAN divided by the group size, rounded once. */
static void hrs_final(zpp_xop_t *op, int c) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  size_t es = zpp_dtype_size(op->dtype), pes = zpp_dtype_size(op->pdt);
  size_t lo, cl, mine = op->len[op->me];
  int k;
  chunk_of(mine, c, op->hc, &lo, &cl);
  for (k = 0; k < gr->nh; k++) {
    int kp = k < op->hn ? k : k - 1;
    op->blocks[k] = k == op->hn
                        ? op->pp + (op->pre[op->ai[op->me]] + lo) * pes
                        : op->rbuf + ((size_t)kp * mine + lo) * pes;
  }
  reduce_blocks((char *)op->dst + lo * es, op->dtype, op->blocks, op->pdt,
                gr->nh, cl, op->rop == ZPP_REDUCE_MEAN ? (float)op->n : 0.0f);
}

/* Reduce-scatter of shards (off[i], len[i]) of `send` into dst: owners,
 * chunks and the scratch (one buffer: pp and rbuf in the wire dtype, then
 * ra in the dtype). */
static zpp_status_t setup_hrs(zpp_xop_t *op, const void *send, void *dst) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  size_t es = zpp_dtype_size(op->dtype), maxlen = 0, wire, in;
  size_t pes;
  int a, w;
  op->pdt = hier_partial_dtype(op->dtype);
  pes = zpp_dtype_size(op->pdt);
  hier_setup(op);
  op->la = 0;
  for (a = 0; a < op->na; a++) {
    op->pre[a] = op->la;
    op->la += op->len[op->alist[a]];
  }
  for (w = 0; w < op->n; w++)
    if (op->len[w] > maxlen)
      maxlen = op->len[w];
  /* elements: (hs - 1) * la (ra, dtype) + la + (nh - 1) * len[me] (pp and
   * rbuf, wire dtype); with equal nodes n * count + (M - 1) * count, the
   * caller's input and a bit; a small node of an uneven layout owns more.
   * Each part below SIZE_MAX / 4 bytes, so their sum cannot wrap. */
  if (op->la > 0 && (size_t)op->hs > SIZE_MAX / 4 / pes / op->la)
    return zpp_error(ZPP_ERR_OVERFLOW, op->what, "scratch size overflows");
  in = (size_t)(op->hs - 1) * op->la * es;
  if (op->len[op->me] > 0 &&
      (size_t)gr->nh > SIZE_MAX / 4 / pes / op->len[op->me])
    return zpp_error(ZPP_ERR_OVERFLOW, op->what, "scratch size overflows");
  wire = (op->la + (size_t)(gr->nh - 1) * op->len[op->me]) * pes;
  ZPP_CHECK(host_get(op->t, wire + in + 1, &op->tmp, op->what));
  op->pp = op->tmp.p;
  op->rbuf = op->pp + op->la * pes;
  op->ra = op->pp + wire;
  op->hc = hier_chunks(op->t, maxlen * es);
  op->p_send = send;
  op->dst = dst;
  return ZPP_OK;
}

/* ---- staging ----------------------------------------------------------------- */

/* pending_out = 1 only after a complete op (its transfers are done).
 * After a failure, while cancelled transfers may still read or write
 * (t->in_doubt), the op's buffers are held until destroy instead. */
static void release_buffers(zpp_xop_t *op, int pending_out) {
  int held = !pending_out && zpp_transport_in_doubt(op->t) &&
             op->t->algo != NULL;
  if (held)
    hold(&op->t->algo->held_host, &op->tmp);
  else
    host_put(&op->tmp);
#if ZPP_HAVE_CUDA
  if (op->staged && held) {
    hold(&op->t->algo->held_pinned, &op->stage_in);
    hold(&op->t->algo->held_pinned, &op->stage_out);
  } else if (op->staged) {
    pinned_put(&op->stage_in, op->stage_pending, op->stream);
    pinned_put(&op->stage_out, pending_out || op->stage_pending, op->stream);
  }
#endif
}

#if ZPP_HAVE_CUDA
static zpp_status_t set_device(zpp_transport_t *t, const char *what) {
  cudaError_t e;
  /* The current device is per thread (any thread may test an op). */
  if (t->cuda_device >= 0 && (e = cudaSetDevice(t->cuda_device)) != cudaSuccess)
    return cuda_err(e, what, "cudaSetDevice");
  return ZPP_OK;
}

/* Waits until the work on op's stream so far is done, by the op's deadline
 * (its timeout from the start); an abort (zpp_comm_abort from another
 * thread) ends the wait at the next poll.  cudaStreamSynchronize would
 * wait for ever where the caller's earlier work on the stream never
 * finishes (a kernel waiting for a peer that is gone); here that is
 * ZPP_ERR_TIMEOUT (or the abort's error), and the op's staging buffers
 * wait for the copies still queued (stage_pending) instead of going back
 * to the pool under them. */
static zpp_status_t stream_wait(zpp_xop_t *op, const char *step) {
  long pause_ns = 1000;
  for (;;) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)op->stream);
    if (e == cudaSuccess)
      return ZPP_OK;
    if (e != cudaErrorNotReady) {
      op->stage_pending = 1;
      return cuda_err(e, op->what, step);
    }
    if (atomic_load(&op->t->broken)) { /* zpp_comm_abort, another thread */
      op->stage_pending = 1;
      return zpp_transport_broken_error(op->t, op->what);
    }
    if (zpp_time_ns() > op->limit_ns) {
      op->stage_pending = 1;
      return zpp_error(ZPP_ERR_TIMEOUT, op->what,
                       "%s: the stream's earlier work did not finish within "
                       "%.3g s (ZPP_TIMEOUT_S)", step, op->t->timeout_s);
    }
    zpp_pause_ns(&pause_ns);
  }
}

/* The blocks of a v-variant (b[i] bytes at d[i], packed when d is NULL)
 * as runs of contiguous bytes (off[r], len[r]): empty blocks dropped, a
 * block that starts where the previous one (in member order) ends joined to
 * it.  Returns the number of runs (at most n). */
static int block_runs(const size_t *b, const size_t *d, int n, size_t *off,
                      size_t *len) {
  size_t acc = 0;
  int i, nr = 0;
  for (i = 0; i < n; i++) {
    size_t o = d ? d[i] : acc;
    acc += b[i];
    if (b[i] == 0)
      continue;
    if (nr > 0 && off[nr - 1] + len[nr - 1] == o) {
      len[nr - 1] += b[i];
      continue;
    }
    off[nr] = o;
    len[nr] = b[i];
    nr++;
  }
  return nr;
}

/* Queues the copies of runs (off[r], len[r]) from src to dst on op's
 * stream (the whole [0, bytes) when nr < 0); *queued: how many. */
static zpp_status_t copy_runs(zpp_xop_t *op, void *dst, const void *src,
                              size_t bytes, const size_t *off,
                              const size_t *len, int nr, const char *step,
                              int *queued) {
  int r, whole = nr < 0;
  *queued = 0;
  for (r = 0; r < (whole ? 1 : nr); r++) {
    size_t o = whole ? 0 : off[r], l = whole ? bytes : len[r];
    cudaError_t e;
    if (l == 0)
      continue;
    e = cudaMemcpyAsync((char *)dst + o, (const char *)src + o, l,
                        cudaMemcpyDefault, (cudaStream_t)op->stream);
    if (e != cudaSuccess) {
      op->stage_pending |= *queued > 0; /* those may still run */
      return cuda_err(e, op->what, step);
    }
    (*queued)++;
  }
  return ZPP_OK;
}

/* Device-to-host copy into pinned memory, waited for (bounded); with
 * nothing to copy, no wait (the caller's stream may be busy for long). */
static zpp_status_t copy_in(zpp_xop_t *op, void *dst, const void *src,
                            size_t bytes, const size_t *off,
                            const size_t *len, int nr) {
  int queued = 0;
  ZPP_CHECK(copy_runs(op, dst, src, bytes, off, len, nr,
                      "device-to-host staging", &queued));
  return queued > 0 ? stream_wait(op, "device-to-host staging") : ZPP_OK;
}
#endif

/* Device buffers: the op's input is copied to pinned memory now; *send /
 * *recv then point at the pinned copies, laid out as the user's buffers.
 * For the v-variants only the blocks move, in both directions: a gap
 * between them (an empty block to myself: qgZ's all-to-alls) is neither
 * read, where it may never have been written, nor written back, so it
 * keeps what the caller left there. */
static zpp_status_t stage(zpp_xop_t *op, const zpp_xfer_desc_t *a,
                          const void **send, void **recv) {
#if ZPP_HAVE_CUDA
  zpp_transport_t *t = op->t;
  const char *what = op->what;
  size_t in = 0, out = 0, es = zpp_dtype_size(a->dtype);
  int n = op->n, v_in = 0;
  if (!zpp_cuda_available())
    return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                     "mem ZPP_MEMORY_DEVICE: no usable CUDA device");
  ZPP_CHECK(set_device(t, what));
  op->nu = -1; /* all of the output, but for the v-variants (below) */
  switch (a->kind) {
  case ZPP_XFER_ALLGATHER:
    in = a->bytes;
    out = a->bytes * (size_t)n;
    break;
  case ZPP_XFER_ALLGATHERV:
    out = extent(a->recv_bytes, a->recv_displs, n);
    in = a->recv_bytes[op->me];
    op->nu = block_runs(a->recv_bytes, a->recv_displs, n, op->uoff, op->ulen);
    break;
  case ZPP_XFER_ALLTOALL: /* zpp_xfer_start cleared its arrays */
  case ZPP_XFER_ALLTOALLV:
    if (a->send_bytes == NULL) {
      in = out = a->bytes * (size_t)n;
    } else {
      in = extent(a->send_bytes, a->send_displs, n);
      out = extent(a->recv_bytes, a->recv_displs, n);
      v_in = 1;
    }
    break;
  case ZPP_XFER_REDUCE_SCATTER:
    out = a->count * es;
    in = out * (size_t)n;
    break;
  case ZPP_XFER_ALLREDUCE:
    in = out = a->count * es;
    break;
  case ZPP_XFER_BARRIER:
    return ZPP_OK;
  }
  op->staged = 1;
  op->stream = a->stream;
  op->user_recv = a->recv;
  op->out_bytes = out;
  ZPP_CHECK(pinned_get(t, in + 1, &op->stage_in, what));
  ZPP_CHECK(pinned_get(t, out + 1, &op->stage_out, what));
  if (v_in) { /* the send runs first, in the table the recv runs then take */
    int nr = block_runs(a->send_bytes, a->send_displs, n, op->uoff, op->ulen);
    ZPP_CHECK(copy_in(op, op->stage_in.p, a->send, in, op->uoff, op->ulen,
                      nr));
    op->nu = block_runs(a->recv_bytes, a->recv_displs, n, op->uoff, op->ulen);
  } else {
    ZPP_CHECK(copy_in(op, op->stage_in.p, a->send, in, NULL, NULL, -1));
  }
  *send = op->stage_in.p;
  *recv = op->stage_out.p;
  return ZPP_OK;
#else
  (void)a;
  (void)send;
  (void)recv;
  return zpp_error(ZPP_ERR_UNSUPPORTED, op->what,
                   "mem ZPP_MEMORY_DEVICE: zpp was built without CUDA");
#endif
}

/* The op's output is complete in host memory: enqueue the copy to the
 * device (synchronised for the blocking wrappers) and free the buffers. */
static zpp_status_t unstage(zpp_xop_t *op) {
#if ZPP_HAVE_CUDA
  zpp_status_t st;
  int pending = 0, queued = 0;
  if (!op->staged || op->out_bytes == 0) {
    release_buffers(op, 0);
    return ZPP_OK;
  }
  st = set_device(op->t, op->what);
  if (st == ZPP_OK)
    st = copy_runs(op, op->user_recv, op->stage_out.p, op->out_bytes,
                   op->uoff, op->ulen, op->nu, "host-to-device staging",
                   &queued);
  if (st == ZPP_OK && queued > 0) {
    if (op->sync_out)
      st = stream_wait(op, "host-to-device staging"); /* pending on failure */
    else
      pending = 1;
  }
  release_buffers(op, pending);
  return st;
#else
  release_buffers(op, 0);
  return ZPP_OK;
#endif
}

/* ---- start --------------------------------------------------------------------- */

/* Pairwise reduce of shards (off[i], len[i]) of `send` into dst: my shard
 * from every peer lands in scratch, then the blocks are summed. */
static zpp_status_t setup_reduce(zpp_xop_t *op, const void *send, void *dst) {
  int n = op->n, me = op->me, i;
  size_t es = zpp_dtype_size(op->dtype), mine = op->len[me] * es;
  op->dst = dst;
  if (n == 1) {
    if (dst != (const char *)send + op->off[0] * es && mine > 0)
      memmove(dst, (const char *)send + op->off[0] * es, mine);
    return ZPP_OK;
  }
  if (mine > 0 && (size_t)n > (SIZE_MAX - 1) / mine)
    return zpp_error(ZPP_ERR_OVERFLOW, op->what, "scratch size overflows");
  ZPP_CHECK(host_get(op->t, mine * (size_t)n + 1, &op->tmp, op->what));
  for (i = 0; i < n; i++) {
    op->sb[i] = i == me ? 0 : op->len[i] * es;
    op->so[i] = op->off[i] * es;
    op->rb[i] = i == me ? 0 : mine;
    op->ro[i] = (size_t)i * mine;
    op->blocks[i] = i == me ? (const char *)send + op->off[me] * es
                            : (const char *)op->tmp.p + op->ro[i];
  }
  op->p_send = send;
  op->p_recv = op->tmp.p;
  return ZPP_OK;
}

/* send: my block's source (NULL: already in place). */
static void setup_ring(zpp_xop_t *op, char *buf, const void *send) {
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
  int hier = hier_on(op->t, &op->t->grp[op->g]);
  const void *send = a->send;
  void *recv = a->recv;
  if (a->mem == ZPP_MEMORY_DEVICE && a->kind != ZPP_XFER_BARRIER)
    ZPP_CHECK(stage(op, a, &send, &recv));
  switch (a->kind) {
  case ZPP_XFER_ALLGATHER: {
    for (i = 0; i < n; i++) {
      op->bytes[i] = a->bytes;
      op->displs[i] = (size_t)i * a->bytes;
    }
    setup_ring(op, recv, send);
    if (hier)
      hier_setup(op);
    op->plan[np++] = hier ? PH_HAG : PH_RING;
    break;
  }
  case ZPP_XFER_ALLGATHERV: {
    memcpy(op->bytes, a->recv_bytes, (size_t)n * sizeof(size_t));
    offsets(a->recv_bytes, a->recv_displs, n, op->displs);
    setup_ring(op, recv, send);
    if (hier)
      hier_setup(op);
    op->plan[np++] = hier ? PH_HAG : PH_RING;
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
    op->plan[np++] = PH_PAIR;
    break;
  case ZPP_XFER_REDUCE_SCATTER:
    op->dtype = a->dtype;
    op->rop = a->op;
    for (i = 0; i < n; i++) {
      op->off[i] = (size_t)i * a->count;
      op->len[i] = a->count;
    }
    if (hier) {
      ZPP_CHECK(setup_hrs(op, send, recv));
      op->plan[np++] = PH_HRS;
      break;
    }
    ZPP_CHECK(setup_reduce(op, send, recv));
    if (n > 1) {
      op->plan[np++] = PH_PAIR;
      op->plan[np++] = PH_REDUCE;
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
    setup_ring(op, recv, NULL);
    if (hier) {
      ZPP_CHECK(setup_hrs(op, send, (char *)recv + op->displs[me]));
      op->plan[np++] = PH_HRS;
      op->plan[np++] = PH_HAG;
      break;
    }
    ZPP_CHECK(setup_reduce(op, send, (char *)recv + op->displs[me]));
    if (n > 1) {
      op->plan[np++] = PH_PAIR;
      op->plan[np++] = PH_REDUCE;
      op->plan[np++] = PH_RING;
    }
    break;
  }
  case ZPP_XFER_BARRIER:
    op->plan[np++] = PH_BARRIER;
    break;
  }
  op->plan[np] = PH_END;
  return ZPP_OK;
}

/* ---- progress ------------------------------------------------------------------ */

/* Cancels the round in flight.  Transfers the backend could not cancel
 * at once break the transport and put its buffers in doubt: the op's
 * buffers are then held by release_buffers, never reused. */
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
  zpp_transport_t *t = op->t;
  switch (op->plan[op->phase]) {
  case PH_RING:
    if (op->step >= op->n - 1)
      break;
    {
      zpp_status_t st = ring_round(op); /* runs step op->step */
      if (st == ZPP_OK && op->step == 0 && op->ring_send != NULL) {
        /* Round 0 reads my block from ring_send and writes another block:
         * put mine in place meanwhile (later rounds forward it from there). */
        memmove(op->ring_buf + op->displs[op->me], op->ring_send,
                op->bytes[op->me]);
      }
      op->step++;
      return st;
    }
  case PH_PAIR:
    if (op->step >= 1)
      break;
    op->step = 1;
    return pair_round(op);
  case PH_HAG: {
    zpp_status_t st;
    if (op->step == 0) {
      size_t maxb = 0;
      int w;
      for (w = 0; w < op->n; w++)
        if (op->bytes[w] > maxb)
          maxb = op->bytes[w];
      op->hc = hier_chunks(t, maxb);
    }
    if (op->step > op->hc)
      break;
    st = hag_round(op, op->step);
    if (st == ZPP_OK && op->step == 0 && op->ring_send != NULL)
      /* round 0 sends my block from ring_send: put it in place meanwhile
       * (stage N forwards it from there) */
      memmove(op->ring_buf + op->displs[op->me], op->ring_send,
              op->bytes[op->me]);
    op->step++;
    return st;
  }
  case PH_HRS: {
    /* step r: round r - 1 is complete: its stage-A chunk is reduced into
     * partial sums, its stage-B chunk (r - 2) into my slice; then round r
     * goes out (it sends the partials of chunk r - 1) */
    zpp_status_t st;
    int r = op->step;
    if (r >= 1 && r - 1 < op->hc)
      hrs_partial(op, r - 1);
    if (r >= 2)
      hrs_final(op, r - 2);
    if (r > op->hc)
      break;
    st = hrs_round(op, r);
    op->step++;
    return st;
  }
  case PH_REDUCE:
    reduce_blocks(op->dst, op->dtype, op->blocks, op->dtype, op->n,
                  op->len[op->me], op->rop == ZPP_REDUCE_MEAN ? (float)op->n
                                                              : 0.0f);
    break;
  case PH_BARRIER:
    if (op->n == 1)
      break;
    if (t->ops->round->barrier_post != NULL && !t->p2p_barrier) {
      if (op->step >= 1)
        break;
      op->step = 1;
      op->ctl = 1;
      op->nin = op->nout = op->nhdr = 0;
      return t->ops->round->barrier_post(t, op->g, op->tag + SUB_CTL, &op->round);
    }
    if ((1 << op->step) >= op->n)
      break;
    {
      zpp_status_t st = barrier_round(op);
      op->step++;
      return st;
    }
  case PH_END:
  default: {
    zpp_status_t st = unstage(op);
    op->state = XS_DONE;
    return st;
  }
  }
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
    if (op->state == XS_DONE)
      return ZPP_OK;
    ZPP_CHECK(next_step(op));
    if (op->state == XS_DONE)
      return ZPP_OK;
  }
  return ZPP_OK; /* more next time */
}

zpp_status_t zpp_algo_start(zpp_transport_t *t, const zpp_xfer_desc_t *a,
                            int sync_out, zpp_xop_t **out) {
  const zpp_tgroup_t *gr = &t->grp[a->group];
  int n = gr->size, ring = a->kind == ZPP_XFER_ALLGATHER ||
                           a->kind == ZPP_XFER_ALLGATHERV ||
                           a->kind == ZPP_XFER_ALLREDUCE;
  int hier = ring || a->kind == ZPP_XFER_REDUCE_SCATTER;
  /* hierarchical ops run one rotated ring: nc = 1 */
  int nc = ring && !hier_on(t, gr) ? ring_channels(t, gr) : 1;
  uint32_t span = t->tag_limit / NSUB;
  zpp_xop_t *op;
  zpp_status_t st;
  /* The tag is taken before anything can fail, so every member's sequence
   * stays in step with the others'. */
  uint32_t seq = t->grp[a->group].seq++;
  op = op_alloc(n, nc, hier ? hier_slots(t, gr) : 0);
  if (op == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, zpp_xfer_name(a->kind),
                     "operation of %d members",
                     n);
  op->t = t;
  op->kind = a->kind;
  op->g = a->group;
  op->what = zpp_xfer_name(a->kind);
  op->n = n;
  op->me = gr->index;
  op->nc = nc;
  op->tag = (span > 0 ? seq % span : 0) * NSUB;
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
    release_buffers(op, 0);
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
  if (op->state == XS_DONE) {
    *done = 1;
    return ZPP_OK;
  }
  t = op->t;
  pthread_mutex_lock(&t->lock);
  st = advance(op);
  if (st != ZPP_OK) {
    release_buffers(op, 0);
    op->state = XS_DONE;
  }
  *done = op->state == XS_DONE;
  pthread_mutex_unlock(&t->lock);
  return zpp_transport_fail(t, st);
}

int64_t zpp_xop_wake_ns(const zpp_xop_t *op) {
  return op != NULL && op->state != XS_DONE ? op->wake_ns : 0;
}

void zpp_xop_free(zpp_xop_t *op) {
  zpp_transport_t *t;
  if (op == NULL || op->t == NULL)
    return;
  t = op->t;
  pthread_mutex_lock(&t->lock);
  if (op->state != XS_DONE) {
    /* Its peers cannot complete without it: they time out.  Broken
     * first: that is the cause, not what the cancel may leave. */
    if (!t->broken)
      zpp_transport_break(t, "%s on group %s was freed while in flight",
                          op->what, zpp_group_name(op->g));
    cancel_round(op);
    release_buffers(op, 0);
  }
  pthread_mutex_unlock(&t->lock);
  free(op);
}
