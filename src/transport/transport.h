/*
 * The transport layer (src/transport): one transport per communicator,
 * holding its groups, call and byte counters, link emulation, timeout and
 * errors, and one backend.  A backend fills one of two tables below: the
 * collective table (NCCL, stream-ordered) or the round table (MPI, UCX:
 * point-to-point rounds, from which src/algo builds every collective).
 * What moves is described by one transfer descriptor (zpp_xfer_desc_t);
 * src/algo checks it and dispatches it once (algo/algo.h), and plans
 * (src/engine) hold it as their transfer steps.  Nothing above src/algo
 * calls a backend.  docs/design.md, "Transports".
 *
 * Groups (see <zpp/zpp_comm.h>): WORLD, NODE (my node, by local rank),
 * CROSS (my local rank on each node, by node).  "Member i" of a group is
 * the i-th rank in that order; buffers are laid out by member index.
 *
 * Contract of every transfer:
 *   - collective over the members of the group; all members pass the same
 *     sizes (the transport does not verify this; the collectives do under
 *     ZPP_CHECK=1);
 *   - `mem` is the memory space of every buffer of the call; `stream` is a
 *     cudaStream_t for device memory (NULL: legacy default stream), ignored
 *     for host memory;
 *   - host backends: complete when zpp_xop_test says done (device memory:
 *     the stage-out copy is enqueued on the stream, or synchronised with
 *     ZPP_XFER_SYNC_OUT).  NCCL backend: enqueued on `stream`;
 *     zpp_transport_sync waits for it with the timeout;
 *   - send and receive buffers must not overlap, except in-place allgather
 *     (send == recv + my_index * bytes), in-place reduce_scatter (recv ==
 *     send + my_index * count elements: my shard of send is never sent and
 *     is read before recv is written, chunk by chunk; zpp_reduce_scatter
 *     promises this form, zpp_coll.h) and in-place allreduce (send ==
 *     recv);
 *   - sizes are bytes for data movement and elements for reductions;
 *   - reductions are deterministic: reduce_scatter's shard j is the sum of
 *     the members' contributions in member order 0..n-1 with an fp32
 *     accumulator, rounded once to the dtype, after the division by the
 *     member count for ZPP_REDUCE_MEAN (host backends; the NCCL backend
 *     sums in fp32 too, in NCCL's ring order, fixed for a given
 *     communicator, then rounds once);
 *     allreduce is computed as that reduce-scatter followed by an allgather,
 *     so its result equals reduce_scatter's shards bit for bit.
 *
 * Threads: one thread at a time per transport (the engine serialises its
 * calls).  A per-transport mutex guards each short step (start, one test,
 * free), so MPI is never entered by two threads of one transport at once.
 * On host backends (the round table) it is never held while a wait sleeps
 * or polls; the collective table runs under it (NCCL: until each call is
 * taken in, and its barrier until the stream is done), bounded by the
 * timeout.
 */
#ifndef ZPP_SRC_TRANSPORT_TRANSPORT_H
#define ZPP_SRC_TRANSPORT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#include "topology/topo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SUM: the sum over the group's members.  MEAN: that sum divided by the
 * number of members, in fp32, before the one rounding to the dtype (a true
 * mean, not a rounded sum rounded again). */
typedef enum { ZPP_REDUCE_SUM = 0, ZPP_REDUCE_MEAN = 1 } zpp_reduce_op_t;

/* The two accounting classes. */
typedef enum { ZPP_LINKCLASS_INTRA = 0, ZPP_LINKCLASS_INTER = 1 } zpp_linkclass_t;
#define ZPP_NLINKCLASSES 2

typedef struct zpp_transport zpp_transport_t;

/* The cost model's constants (src/algo/tune.c, docs/design.md "Choosing
 * the algorithm"): latencies in microseconds, bandwidths in bytes per
 * microsecond (per rank, one direction).  Agreed at creation: every rank
 * holds the same values, so every rank makes the same choice. */
typedef struct {
  double intra_lat_us, intra_bw; /* a transfer within a node */
  double inter_lat_us, inter_bw; /* a transfer between nodes */
  double round_us;               /* fixed cost of one round (post, test) */
  double msg_us;                 /* cost of each transfer posted */
  double reduce_bw;              /* host sum, bytes of input per us */
  double cpu;      /* ranks per core of a machine (agreed: the median over
                      the ranks; >= 1, 0 counts as 1):
                      the host's per-round, per-transfer and sum costs and its
                      memory bandwidth are shared by that many ranks */
  int shared_path; /* 1: inter- and intra-node bytes share one path (an
                      emulated topology on one machine): their times add */
  int measured;    /* ZPP_TUNE_MEASURED_*: rates the probe measured with
                      every rank's probe at once, so with the cores and
                      links shared as in a collective (not divided by cpu) */
  /* Forced choices (tuner file): 0 model, else ZPP_ALGORITHM_HIER/FLAT,
   * per collective: all-gather, reduce-scatter, all-reduce. */
  int force[3];
  int chunks; /* hierarchical chunks (1..8); 0: the model's */
} zpp_link_model_t;

enum { ZPP_TUNE_MEASURED_INTRA = 1, ZPP_TUNE_MEASURED_INTER = 2 };

/* Byte counters of one rank (exact, see docs/design.md "Transports"). */
typedef struct {
  uint64_t sent[ZPP_NLINKCLASSES];
  uint64_t recv[ZPP_NLINKCLASSES];
  uint64_t calls[ZPP_NGROUPS];
} zpp_transport_counts_t;

/* ---- the round primitive of host backends --------------------------------
 * A round is a set of point-to-point transfers within one group, posted
 * together and complete when all of them are (the round table below). */
typedef struct {
  int peer;       /* member index in the round's group */
  void *buf;      /* host memory: read for a send, written for a receive */
  size_t bytes;   /* > 0 (the algorithms never post empty transfers); any
                     size: the backend splits what it must */
  uint32_t tag;   /* < t->tag_limit: a receive matches the peer's send of
                     the same group and tag; several transfers of one pair,
                     group and tag match in posting order */
} zpp_xfer_t;

/* A posted round; each backend defines struct zpp_round privately. */
typedef struct zpp_round zpp_round_t;

/* ---- the transfer descriptor ---------------------------------------------
 * One collective transfer, as a plan step holds it (src/engine/plan.h), as
 * the dispatch checks and starts it (src/algo/xfer.c), and as a backend
 * receives it: the collective table's enqueue (NCCL) or the host
 * algorithms over rounds (src/algo).  One kind enum, one dispatch. */
typedef enum {
  ZPP_XFER_ALLGATHER = 0, /* bytes per member; in place when send is my slot */
  ZPP_XFER_ALLGATHERV,    /* recv_bytes (recv_displs NULL: packed) */
  ZPP_XFER_ALLTOALL,      /* bytes per member */
  ZPP_XFER_ALLTOALLV,     /* send_bytes, send_displs, recv_bytes, recv_displs */
  ZPP_XFER_REDUCE_SCATTER, /* count elements of my shard, dtype, op */
  ZPP_XFER_ALLREDUCE,     /* count elements, dtype, op */
  ZPP_XFER_BARRIER
} zpp_xfer_kind_t;
#define ZPP_XFER_NKINDS 7

typedef struct {
  zpp_xfer_kind_t kind;
  zpp_group_t group;
  const void *send;
  void *recv;
  size_t bytes; /* allgather, alltoall: per member */
  /* allgatherv, alltoallv: per member, in member order; the arrays must
   * live until the operation is done (a plan keeps them in its context;
   * the host algorithms copy them at start).  displs NULL: packed. */
  const size_t *send_bytes, *send_displs, *recv_bytes, *recv_displs;
  size_t count; /* reductions, elements */
  zpp_dtype_t dtype;
  zpp_reduce_op_t op;
  zpp_memory_t mem; /* the memory space of every buffer */
  void *stream;     /* cudaStream_t for device memory (NULL: legacy) */
} zpp_xfer_desc_t;

/* "allgather", "alltoallv", ...: the name errors carry. */
const char *zpp_xfer_name(zpp_xfer_kind_t kind);

/* ---- the backends' tables ------------------------------------------------
 * A backend fills exactly one of two tables.  Arguments reach it checked. */

/* Stream-ordered backends (NCCL): the collective table.  The backend moves
 * whole collectives and counts its own bytes with zpp_transport_account
 * (per peer, so each byte lands on its link). */
typedef struct {
  /* Enqueues d (checked; d->mem is the communicator's) on d->stream. */
  zpp_status_t (*enqueue)(zpp_transport_t *t, const zpp_xfer_desc_t *d);
  /* Waits until the operations enqueued on `stream` completed, polling
   * asynchronous errors; ZPP_ERR_TIMEOUT after the timeout (the backend is
   * then aborted and every later call fails). */
  zpp_status_t (*sync)(zpp_transport_t *t, void *stream);
  /* Non-blocking check for asynchronous errors (NCCL's
   * ncclCommGetAsyncError); on one, the backend aborts and breaks the
   * transport and returns the error. */
  zpp_status_t (*check_async)(zpp_transport_t *t, const char *what);
  /* Stops the backend's in-flight device work now (NCCL: ncclCommAbort on
   * every group), so that streams holding it drain instead of waiting for
   * peers that will not come; called once the transport is broken.
   * Idempotent. */
  void (*abort_device_work)(zpp_transport_t *t);
} zpp_coll_ops_t;

/* Host backends (MPI, UCX): the round table.  The algorithms of src/algo
 * build every collective from rounds and do everything else themselves:
 * tags, byte accounting, link emulation (the deadline header is one more
 * 8-byte transfer of the round), device staging, timeouts. */
typedef struct {
  /* All three are called with the transport's mutex held and never block.
   * round_post posts every receive of recv[0..nrecv), then every send of
   * send[0..nsend), in that order (the order a send takes the NIC), and
   * returns a handle; on error nothing stays posted.  The xfer arrays may
   * be reused once it returns; the buffers stay untouched until the round
   * completes or is cancelled. */
  zpp_status_t (*round_post)(zpp_transport_t *t, zpp_group_t g,
                             const zpp_xfer_t *recv, int nrecv,
                             const zpp_xfer_t *send, int nsend,
                             zpp_round_t **round);
  /* Advances the round without blocking; *done = 1 when every transfer
   * completed, and the handle is then released.  Calls
   * zpp_transport_progressed(t) whenever a transfer completed (the waits
   * keep spinning while things move).  An error leaves the handle to
   * round_cancel. */
  zpp_status_t (*round_test)(zpp_transport_t *t, zpp_round_t *round,
                             int *done);
  /* Cancels what is still pending and releases the handle.  A transfer
   * the backend cannot cancel at once (a receive already matched, a send
   * MPI cannot cancel) may still read or write its buffer afterwards:
   * returns how many there are (0: none).  Those buffers must then stay
   * alive until round_drain says they are quiet (the caller also breaks
   * the transport, so nothing new is posted meanwhile). */
  int (*round_cancel)(zpp_transport_t *t, zpp_round_t *round);
  /* Optional: waits, until deadline_ns at most, for the transfers that
   * round_cancel left behind, then releases what is left to the backend;
   * returns how many transfers may still read or write their buffers
   * (0: none, ever).  Called with the mutex held, at teardown only.
   * NULL: the backend leaves nothing behind it could wait for. */
  int (*round_drain)(zpp_transport_t *t, int64_t deadline_ns);
  /* Optional: a barrier of group g as a round (tested and cancelled like
   * one; cancel may leave it to complete when the peers arrive).  NULL:
   * the algorithms run a dissemination barrier of 1-byte messages. */
  zpp_status_t (*barrier_post)(zpp_transport_t *t, zpp_group_t g,
                               uint32_t tag, zpp_round_t **round);
  /* Optional: writes the transfers of `round` still pending, by world
   * rank ("from 3, to 1"), into buf (len bytes, NUL-terminated), so a
   * timeout names the peers it waited for.  NULL: they are not named. */
  void (*round_pending)(zpp_transport_t *t, const zpp_round_t *round,
                        char *buf, size_t len);
} zpp_round_ops_t;

typedef struct {
  const char *name;
  void (*destroy)(zpp_transport_t *t);
  const zpp_coll_ops_t *coll;   /* stream-ordered backends, else NULL */
  const zpp_round_ops_t *round; /* host backends, else NULL */
} zpp_transport_ops_t;

/* ---- the operations ------------------------------------------------------
 * All return ZPP_OK or an error whose message is also kept as the
 * transport's last error. */

/* Asynchronous errors of the backend, without blocking (ZPP_OK when the
 * backend has none); a transport broken earlier answers its error. */
zpp_status_t zpp_transport_check_async(zpp_transport_t *t, const char *what);
/* 1 when the backend can stop its in-flight device work (NCCL), so that
 * aborted work may leave a stream without having run; 0 for host
 * backends. */
int zpp_transport_aborts_device_work(const zpp_transport_t *t);
/* Stops the backend's in-flight device work now (no-op when it has none),
 * so that streams holding it drain; for a broken transport.  Idempotent. */
void zpp_transport_abort_device_work(zpp_transport_t *t);
/* Completes what was enqueued on `stream` (no-op for host backends).  The
 * mutex is not held while it waits. */
zpp_status_t zpp_transport_sync(zpp_transport_t *t, void *stream);

/* ---- host scratch ---------------------------------------------------------
 * One cache of host buffers per transport (scratch.c), shared by the
 * engine's plans and the host algorithms; thread-safe.
 * zpp_scratch_get: `bytes` of host memory, 64-byte aligned (NULL: out of
 * memory).  zpp_scratch_put: gives it back (kept for reuse up to
 * ZPP_SCRATCH_CACHE_MB, or held until the transport is freed while
 * cancelled transfers may still touch it).  zpp_scratch_hold: for a block
 * of malloc's that is not scratch (hpZ's secondary copy): 1 when the
 * transport took it (held, never freed under a transfer), 0 when the
 * caller frees it as usual.  zpp_scratch_cached_bytes: bytes kept for
 * reuse. */
void *zpp_scratch_get(zpp_transport_t *t, size_t bytes);
void zpp_scratch_put(zpp_transport_t *t, void *p);
int zpp_scratch_hold(zpp_transport_t *t, void *p);
size_t zpp_scratch_cached_bytes(zpp_transport_t *t);

/* Testing: on = 1 makes barriers of host backends run the dissemination
 * barrier of rounds even where the backend has its own (barrier_post). */
void zpp_transport_set_p2p_barrier(zpp_transport_t *t, int on);

/* ---- queries ------------------------------------------------------------- */
int zpp_transport_rank(const zpp_transport_t *t);     /* world rank */
int zpp_transport_size(const zpp_transport_t *t);     /* world size */
int zpp_transport_group_size(const zpp_transport_t *t, zpp_group_t g);
int zpp_transport_group_rank(const zpp_transport_t *t, zpp_group_t g);
/* World rank of member i of group g (-1 when i is out of range). */
int zpp_transport_group_member(const zpp_transport_t *t, zpp_group_t g,
                               int i);
/* Link class from me to world rank `peer`. */
zpp_link_t zpp_transport_link(const zpp_transport_t *t, int peer);
const zpp_topo_t *zpp_transport_topo(const zpp_transport_t *t);
/* ZPP_QGZ_SUM as every rank of the communicator set it (1: int). */
int zpp_transport_qgz_sum_int(const zpp_transport_t *t);
zpp_backend_t zpp_transport_backend(const zpp_transport_t *t);
/* Seconds a blocking wait may last before ZPP_ERR_TIMEOUT (<= 0: no
 * limit; never above ZPP_TIMEOUT_MAX_S). */
double zpp_transport_timeout_s(const zpp_transport_t *t);
/* The largest timeout in seconds (about 31.7 years): deadlines are int64_t
 * nanoseconds, and a larger timeout (1e12, inf) overflowed that, putting
 * every deadline in the past.  Larger values are taken as this one. */
#define ZPP_TIMEOUT_MAX_S 1e9
double zpp_timeout_clamp(double timeout_s);
/* A counter that grows whenever a transfer of a host backend completed
 * (also partway through an op): a poll loop keeps spinning while it moves,
 * as the engine's wait does, and sleeps only once it stops
 * (ZPP_NET_SPIN_US). */
uint64_t zpp_transport_progress(const zpp_transport_t *t);
/* ZPP_NET_SPIN_US in nanoseconds, read at creation: how long a poll loop
 * keeps spinning after the last progress before it sleeps. */
int64_t zpp_transport_spin_ns(const zpp_transport_t *t);

/* ---- accounting hook -----------------------------------------------------
 * Adds bytes this rank sent to / received from world rank `peer` to the
 * class of the link between them (nothing for peer == me).  Backends call
 * it for every transfer; a collective that moves bytes by other means (none
 * today) would call it too, so the counts stay the transport's. */
void zpp_transport_account(zpp_transport_t *t, int peer, uint64_t sent,
                           uint64_t recv);
/* Snapshot of the counters (collectives diff two snapshots per call). */
void zpp_transport_get_counts(zpp_transport_t *t, zpp_transport_counts_t *out);
void zpp_transport_reset_counts(zpp_transport_t *t);

/* ZPP_OK while the transport works; else the first error that made it
 * unusable (a timeout, a plan that failed part-way, zpp_comm_abort:
 * ZPP_ERR_ABORTED), raised as this thread's error for `func` and recorded
 * on the communicator.  Safe from any thread. */
zpp_status_t zpp_transport_broken_error(zpp_transport_t *t, const char *func);
/* 1 when the transport is broken (no error is set). */
int zpp_transport_is_broken(const zpp_transport_t *t);

/* Marks the transport unusable with a reason; later calls fail with it.
 * The first break wins; its status is the first one known: st of
 * zpp_transport_break_st (zpp_transport_break leaves it to the call that
 * returns the error; ZPP_ERR_TIMEOUT when none does).  Safe from any
 * thread. */
void zpp_transport_break(zpp_transport_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void zpp_transport_break_st(zpp_transport_t *t, zpp_status_t st,
                            const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the calling thread's last error as the transport's (so the
 * communicator's) last error and returns `st`. */
zpp_status_t zpp_transport_fail(zpp_transport_t *t, zpp_status_t st);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_TRANSPORT_TRANSPORT_H */
