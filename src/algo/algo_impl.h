/*
 * What the files of src/algo share: the op (struct zpp_xop) and its plan,
 * the per-transport caches, and the functions the files offer each other.
 * Not for other layers (they use algo.h).
 *
 *   op.c        the op state machine: setup by kind, rounds, progress,
 *               the entry points (zpp_algo_start, zpp_xop_*)
 *   ring.c      the ring family (all-gather)
 *   pairwise.c  the pairwise family (all-to-all, flat reduce-scatter) and
 *               the local sum of blocks
 *   hier.c      the hierarchical family (all-gather, reduce-scatter)
 *   tune.c      the choice among them (ZPP_ALGO=auto: the cost model)
 *   stage.c     device staging through pinned host memory
 *   cache.c     the per-transport caches: host scratch, pinned buffers
 *   xfer.c      the one dispatch of a transfer descriptor
 */
#ifndef ZPP_SRC_ALGO_ALGO_IMPL_H
#define ZPP_SRC_ALGO_ALGO_IMPL_H

#include "algo/algo.h"
#include "transport/transport_impl.h"

#include <stddef.h>
#include <stdint.h>

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* An op's transfers carry tag = base + sub, base = (group sequence number
 * modulo tag_limit / ZPP_NSUB) * ZPP_NSUB. */
enum { ZPP_SUB_DATA = 0, ZPP_SUB_EMU = 1, ZPP_SUB_CTL = 2, ZPP_NSUB = 4 };

/* Phases; an op runs its plan in order. */
enum { ZPP_PH_RING, ZPP_PH_PAIR, ZPP_PH_REDUCE, ZPP_PH_BARRIER, ZPP_PH_HAG, ZPP_PH_HRS, ZPP_PH_END };
#define ZPP_MAX_PHASES 4

/* ---- the per-transport caches (cache.c) -----------------------------------
 * Pinned staging buffers: ZPP_ALGO_SLOTS kept for reuse, guarded by t->lock.
 * Reduction scratch comes from the transport's host scratch cache
 * (zpp_scratch_get, transport/transport.h), which the engine shares. */
#define ZPP_ALGO_SLOTS 8

typedef struct {
  void *p;
  size_t cap;
  int busy;
#if ZPP_HAVE_CUDA
  cudaEvent_t ev; /* recorded after the stage-out copy that reads it */
  int ev_made, ev_pending;
  int lost; /* a copy may still use it and no event says when: leaked */
#endif
} zpp_algo_slot_t;

/* Pinned staging buffers.  cudaFreeHost synchronises the whole device, so
 * it never runs while operations may be in flight (it would wait for the
 * caller's unrelated work, from inside a non-blocking test): pinned slots
 * are only ever added (ZPP_ALGO_SLOTS in the array, more on a list when all are
 * busy), and a slot too small for a request gets a larger buffer while the
 * old one is retired, kept until algo_release.  Capacities are powers
 * of two, so a slot's retired buffers total less than its current one. */
typedef struct zpp_algo_more_slot {
  zpp_algo_slot_t s;
  struct zpp_algo_more_slot *next;
} zpp_algo_more_slot_t;

typedef struct zpp_algo_retired {
  void *p;
  struct zpp_algo_retired *next;
} zpp_algo_retired_t;

struct zpp_algo {
  zpp_algo_slot_t pinned[ZPP_ALGO_SLOTS];
  zpp_algo_more_slot_t *more;  /* pinned slots beyond ZPP_ALGO_SLOTS */
  zpp_algo_retired_t *retired; /* pinned buffers replaced by larger ones */
  /* Pinned buffers of ops released while cancelled transfers may still
   * touch them (t->in_doubt): freed by algo_release only once the
   * transport is quiet, else leaked. */
  zpp_algo_retired_t *held_pinned;
};

/* A buffer of an op: a pinned cache slot, or its own (pinned: when every
 * slot is busy; host: the transport's scratch). */
typedef struct {
  zpp_algo_slot_t *slot;
  void *own;
  void *p;
} zpp_algo_buf_t;

/* ---- the op (op.c) ------------------------------------------------------- */

enum { ZPP_XS_RUNNING = 0, ZPP_XS_DONE = 1 };

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
  int plan[ZPP_MAX_PHASES + 1];
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
  zpp_algo_buf_t tmp;
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
  int hier;         /* the op runs the hierarchical family (tune.c) */
  int hc_rs, hc_ag; /* chunks its choice set (0: from ZPP_HIER_CHUNK) */
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
  zpp_algo_buf_t stage_in, stage_out;
};

/* ---- op.c ---------------------------------------------------------------- */

/* Starts d (checked) on a host backend; called with t->lock held, after
 * the call was counted.  sync_out: staged device output is synchronised at
 * completion.  On error no op is returned. */
zpp_status_t zpp_algo_start(zpp_transport_t *t, const zpp_xfer_desc_t *d,
                            int sync_out, zpp_xop_t **op);
/* The op of a stream-ordered backend once enqueued: done from the start
 * (shared, never written; zpp_xop_free ignores it). */
zpp_xop_t *zpp_xop_done(void);
/* Posts the round of op->din[0..nin) and op->dout[0..nout) as op->round
 * (with the emulation headers, counted at completion). */
zpp_status_t zpp_algo_post_round(zpp_xop_t *op);
/* Fills *x: a data transfer of op with member `peer`. */
void zpp_algo_data_xfer(zpp_xop_t *op, zpp_xfer_t *x, int peer, const void *buf,
                        size_t bytes);

/* ---- the families: setup, and the steps of their phases ---------------------
 * A step function runs the phase's step op->step: it posts a round
 * (op->round) or computes, and returns its status; where the phase has no
 * step left it sets *end = 1 (and returns ZPP_OK), and next_step (op.c)
 * moves to the next phase. */

/* ring.c: the rings of a group (ZPP_NET_RINGS, capped by its largest node
 * run); chunk c of nc of b bytes or elements (floor split, the first
 * b % nc one longer); the ring tables and my block's source (send NULL:
 * already in place in buf); the ZPP_PH_RING step. */
int zpp_algo_ring_channels(const zpp_transport_t *t, const zpp_tgroup_t *gr);
void zpp_algo_chunk_of(size_t b, int c, int nc, size_t *lo, size_t *len);
void zpp_algo_setup_ring(zpp_xop_t *op, char *buf, const void *send);
zpp_status_t zpp_algo_ring_step(zpp_xop_t *op, int *end);

/* pairwise.c: dst = the sum of n blocks of count elements in order, fp32,
 * divided by div when div > 0, rounded once to out_dt; the flat
 * reduce-scatter's tables and scratch; the ZPP_PH_PAIR and ZPP_PH_REDUCE steps. */
void zpp_algo_reduce_blocks(void *dst, zpp_dtype_t out_dt,
                            const void *const *blocks, zpp_dtype_t in_dt, int n,
                            size_t count, float div);
zpp_status_t zpp_algo_setup_reduce(zpp_xop_t *op, const void *send, void *dst);
zpp_status_t zpp_algo_pair_step(zpp_xop_t *op, int *end);
zpp_status_t zpp_algo_reduce_step(zpp_xop_t *op, int *end);

/* hier.c: whether the hierarchical family applies to a group; my node, owners and
 * what I own; the transfers a hierarchical round can hold; the
 * hierarchical reduce-scatter's tables and scratch; the ZPP_PH_HAG and ZPP_PH_HRS
 * steps. */
int zpp_algo_hier_applies(const zpp_tgroup_t *gr);
void zpp_algo_hier_setup(zpp_xop_t *op);
int zpp_algo_hier_slots(const zpp_transport_t *t, const zpp_tgroup_t *gr);
zpp_status_t zpp_algo_setup_hrs(zpp_xop_t *op, const void *send, void *dst);
zpp_status_t zpp_algo_hag_step(zpp_xop_t *op, int *end);
zpp_status_t zpp_algo_hrs_step(zpp_xop_t *op, int *end);

/* ---- stage.c ------------------------------------------------------------- */

/* Gives back the op's scratch and staging buffers (held until destroy
 * while cancelled transfers may touch them); pending_out: a stage-out copy
 * was enqueued. */
void zpp_algo_release_buffers(zpp_xop_t *op, int pending_out);
/* Device memory: stages the op's input into pinned memory; *send / *recv
 * then point at the pinned copies. */
zpp_status_t zpp_algo_stage(zpp_xop_t *op, const zpp_xfer_desc_t *a,
                            const void **send, void **recv);
/* At completion: the staged output back to the device, then the buffers
 * released. */
zpp_status_t zpp_algo_unstage(zpp_xop_t *op);

/* ---- cache.c ------------------------------------------------------------- */

/* Host scratch of `need` bytes into b; given back by zpp_algo_host_put. */
zpp_status_t zpp_algo_host_get(zpp_transport_t *t, size_t need, zpp_algo_buf_t *b,
                               const char *what);
void zpp_algo_host_put(zpp_transport_t *t, zpp_algo_buf_t *b);
/* Moves b's memory onto the held list *l (freed at destroy once the
 * transport is quiet). */
void zpp_algo_hold(zpp_algo_retired_t **l, zpp_algo_buf_t *b);
#if ZPP_HAVE_CUDA
/* A CUDA error as zpp's, the call and CUDA's message kept. */
zpp_status_t zpp_algo_cuda_err(cudaError_t e, const char *what,
                               const char *call);
/* A pinned buffer of at least `need` bytes into b; given back by
 * zpp_algo_pinned_put (pending: a copy on `stream` still uses it). */
zpp_status_t zpp_algo_pinned_get(zpp_transport_t *t, size_t need, zpp_algo_buf_t *b,
                                 const char *what);
void zpp_algo_pinned_put(zpp_algo_buf_t *b, int pending, void *stream);
#endif

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ALGO_ALGO_IMPL_H */
