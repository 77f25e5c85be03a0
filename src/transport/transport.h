/*
 * The transport interface: the only way the collective algorithms (qwZ,
 * hpZ, qgZ and the baselines) move bytes.  They call the zpp_transport_*
 * functions below, never MPI or NCCL.  A backend (transport_mpi.c,
 * transport_nccl.c, transport_ucx.c; docs/design.md "Transports") fills a
 * zpp_transport_ops_t; the wrappers here check arguments, serialise calls,
 * count calls per group and record errors on the communicator, so every
 * backend gets the same contract.
 *
 * Groups (see <zpp/zpp_comm.h>): WORLD, NODE (my node, by local rank),
 * CROSS (my local rank on each node, by node).  "Member i" of a group is
 * the i-th rank in that order; buffers are laid out by member index.
 *
 * Contract of every operation:
 *   - collective over the members of the group; all members pass the same
 *     sizes (the transport does not verify this; the collectives do under
 *     ZPP_CHECK=1);
 *   - `mem` is the memory space of every buffer of the call; `stream` is a
 *     cudaStream_t for device memory (NULL: legacy default stream), ignored
 *     for host memory;
 *   - host backends (MPI): a blocking call returns with the output
 *     complete (device memory: the stream has been synchronised); the
 *     non-blocking form below is complete when zpp_xop_test says done.
 *     NCCL backend: enqueued on `stream`; zpp_transport_sync waits for it
 *     with the timeout;
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
 * calls; the blocking wrappers may be called from any one thread at a
 * time, e.g. a progress thread).  A per-transport mutex guards each short
 * step (start, one test, free), so MPI is never entered by two threads of
 * one transport at once.  On host backends (the round primitive) it is
 * never held while a wait sleeps or polls; backends that fill the
 * operations run them under it (NCCL: until each call is taken in, and its
 * barrier until the stream is done; UCX: the whole blocking operation),
 * bounded by the timeout.
 */
#ifndef ZPP_SRC_TRANSPORT_H
#define ZPP_SRC_TRANSPORT_H

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

/* Byte counters of one rank (exact, see docs/design.md "Transports"). */
typedef struct {
  uint64_t sent[ZPP_NLINKCLASSES];
  uint64_t recv[ZPP_NLINKCLASSES];
  uint64_t calls[ZPP_NGROUPS];
} zpp_transport_counts_t;

/* ---- the round primitive of host backends --------------------------------
 * A round is a set of point-to-point transfers within one group, posted
 * together and complete when all of them are.  src/transport_algo.c builds
 * every operation of a host backend (MPI, UCX) from rounds and does
 * everything else itself: algorithms, tags, byte accounting, link
 * emulation (the deadline header is one more 8-byte transfer of the
 * round), device staging, timeouts (docs/design.md "Transports"). */
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

/* A backend.  Arguments reach it already checked.  Stream-ordered
 * backends (NCCL) fill the operations and count their own bytes with
 * zpp_transport_account (per peer, so each byte lands on its link); host
 * backends fill only the round primitive at the end (and destroy): the
 * operations are then the algorithms of src/transport_algo.c. */
typedef struct {
  const char *name;
  zpp_status_t (*allgather)(zpp_transport_t *t, zpp_group_t g,
                            const void *send, size_t bytes, void *recv,
                            zpp_memory_t mem, void *stream);
  zpp_status_t (*allgatherv)(zpp_transport_t *t, zpp_group_t g,
                             const void *send, void *recv,
                             const size_t *recv_bytes,
                             const size_t *recv_displs, zpp_memory_t mem,
                             void *stream);
  zpp_status_t (*alltoallv)(zpp_transport_t *t, zpp_group_t g,
                            const void *send, const size_t *send_bytes,
                            const size_t *send_displs, void *recv,
                            const size_t *recv_bytes,
                            const size_t *recv_displs, zpp_memory_t mem,
                            void *stream);
  zpp_status_t (*reduce_scatter)(zpp_transport_t *t, zpp_group_t g,
                                 const void *send, void *recv, size_t count,
                                 zpp_dtype_t dtype, zpp_reduce_op_t op,
                                 zpp_memory_t mem, void *stream);
  zpp_status_t (*allreduce)(zpp_transport_t *t, zpp_group_t g,
                            const void *send, void *recv, size_t count,
                            zpp_dtype_t dtype, zpp_reduce_op_t op,
                            zpp_memory_t mem, void *stream);
  zpp_status_t (*barrier)(zpp_transport_t *t, zpp_group_t g);
  /* Waits until the operations enqueued on `stream` completed, polling
   * asynchronous errors; ZPP_ERR_TIMEOUT after the timeout (the backend is
   * then aborted and every later call fails).  NULL: nothing to wait for. */
  zpp_status_t (*sync)(zpp_transport_t *t, void *stream);
  void (*destroy)(zpp_transport_t *t);
  /* Non-blocking check for asynchronous errors (NCCL's
   * ncclCommGetAsyncError); on one, the backend aborts and breaks the
   * transport and returns the error.  NULL: there are none. */
  zpp_status_t (*check_async)(zpp_transport_t *t, const char *what);
  /* Stops the backend's in-flight device work now (NCCL: ncclCommAbort on
   * every group), so that streams holding it drain instead of waiting for
   * peers that will not come; called once the transport is broken.
   * Idempotent.  NULL: the backend has no such work. */
  void (*abort_device_work)(zpp_transport_t *t);
  /* -- host backends: the round primitive (NULL for stream-ordered ones) --
   * All three are called with the transport's mutex held and never block.
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
} zpp_transport_ops_t;

/* ---- the operations ------------------------------------------------------
 * All return ZPP_OK or an error whose message is also kept as the
 * transport's last error. */

/* recv[i * bytes ..] = member i's send (bytes each). */
zpp_status_t zpp_transport_allgather(zpp_transport_t *t, zpp_group_t g,
                                     const void *send, size_t bytes,
                                     void *recv, zpp_memory_t mem,
                                     void *stream);
/* Member i contributes recv_bytes[i] bytes, placed at recv + recv_displs[i]
 * (recv_displs NULL: packed in member order).  My send holds
 * recv_bytes[my_index] bytes. */
zpp_status_t zpp_transport_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                      const void *send, void *recv,
                                      const size_t *recv_bytes,
                                      const size_t *recv_displs,
                                      zpp_memory_t mem, void *stream);
/* send[j * bytes ..] goes to member j; recv[i * bytes ..] came from i. */
zpp_status_t zpp_transport_alltoall(zpp_transport_t *t, zpp_group_t g,
                                    const void *send, size_t bytes,
                                    void *recv, zpp_memory_t mem,
                                    void *stream);
/* Per-peer byte counts; displacements NULL: packed in member order.
 * send_bytes[j] here must equal member j's recv_bytes[my_index]. */
zpp_status_t zpp_transport_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                     const void *send,
                                     const size_t *send_bytes,
                                     const size_t *send_displs, void *recv,
                                     const size_t *recv_bytes,
                                     const size_t *recv_displs,
                                     zpp_memory_t mem, void *stream);
/* send holds n * count elements (n = group size); recv (count elements)
 * receives shard my_index of the sum. */
zpp_status_t zpp_transport_reduce_scatter(zpp_transport_t *t, zpp_group_t g,
                                          const void *send, void *recv,
                                          size_t count, zpp_dtype_t dtype,
                                          zpp_reduce_op_t op,
                                          zpp_memory_t mem, void *stream);
/* recv (count elements, any count) = sum of every member's send. */
zpp_status_t zpp_transport_allreduce(zpp_transport_t *t, zpp_group_t g,
                                     const void *send, void *recv,
                                     size_t count, zpp_dtype_t dtype,
                                     zpp_reduce_op_t op, zpp_memory_t mem,
                                     void *stream);
zpp_status_t zpp_transport_barrier(zpp_transport_t *t, zpp_group_t g);
/* Asynchronous errors of the backend, without blocking (ZPP_OK when the
 * backend has none); a transport broken earlier answers its error. */
zpp_status_t zpp_transport_check_async(zpp_transport_t *t, const char *what);
/* Completes what was enqueued on `stream` (no-op for host backends).  The
 * mutex is not held while it waits. */
zpp_status_t zpp_transport_sync(zpp_transport_t *t, void *stream);

/* ---- non-blocking operations (the engine's transfer steps) ----------------
 * zpp_transport_start_* starts the same operation as its blocking twin
 * above (same arguments, same checks, same counters and results) and
 * returns at once with a handle; zpp_xop_test advances it without
 * blocking.  Several operations may be in flight on one transport, also on
 * different groups; they must be started in the same order on every
 * member of their group (each gets a tag from a per-group sequence, so
 * their messages never match another operation's).  Blocking operations
 * are start + zpp_xop_wait.
 *
 *   host-only backends (MPI, UCX): the algorithms (ring, pairwise, member-
 *     order reduction, emulation, accounting) run as state machines over
 *     rounds of point-to-point transfers in src/transport_algo.c; device
 *     buffers are staged through pinned host memory (the stage-in copy is
 *     waited for at start, within the op's timeout, the stage-out copy is
 *     enqueued on `stream` at completion);
 *   stream-ordered backends (NCCL): start enqueues on `stream`; the
 *     operation is then done as far as the host is concerned (its
 *     completion is the stream's business: plans record an event).
 *
 * A timed-out operation (ZPP_TIMEOUT_S from its start), or one freed while
 * in flight, breaks the transport; other failures return their error and
 * the engine breaks the transport for any plan that failed part-way (its
 * peers still run the transfers this rank skipped).  Single-threaded per
 * transport: the caller (the engine, src/engine.c) serialises calls. */
typedef struct zpp_xop zpp_xop_t;

zpp_status_t zpp_transport_start_allgather(zpp_transport_t *t, zpp_group_t g,
                                           const void *send, size_t bytes,
                                           void *recv, zpp_memory_t mem,
                                           void *stream, zpp_xop_t **op);
zpp_status_t zpp_transport_start_allgatherv(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    const size_t *recv_bytes, const size_t *recv_displs, zpp_memory_t mem,
    void *stream, zpp_xop_t **op);
zpp_status_t zpp_transport_start_alltoallv(
    zpp_transport_t *t, zpp_group_t g, const void *send,
    const size_t *send_bytes, const size_t *send_displs, void *recv,
    const size_t *recv_bytes, const size_t *recv_displs, zpp_memory_t mem,
    void *stream, zpp_xop_t **op);
zpp_status_t zpp_transport_start_alltoall(zpp_transport_t *t, zpp_group_t g,
                                          const void *send, size_t bytes,
                                          void *recv, zpp_memory_t mem,
                                          void *stream, zpp_xop_t **op);
zpp_status_t zpp_transport_start_reduce_scatter(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream, zpp_xop_t **xop);
zpp_status_t zpp_transport_start_allreduce(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream, zpp_xop_t **xop);
zpp_status_t zpp_transport_start_barrier(zpp_transport_t *t, zpp_group_t g,
                                         zpp_xop_t **op);
/* Advances op without blocking; *done = 1 once its output is complete
 * (host memory) or enqueued (stream-ordered / staged device output).  An
 * error (also a timeout) is returned once; the op is then done. */
zpp_status_t zpp_xop_test(zpp_xop_t *op, int *done);
/* Earliest CLOCK_MONOTONIC time (ns) at which testing op again can make
 * progress when nothing else happens (an emulated link's deadline), or 0:
 * poll as usual.  Lets the engine sleep instead of spinning. */
int64_t zpp_xop_wake_ns(const zpp_xop_t *op);
/* Polls op (spin, then sleep, like the blocking wait) until done. */
zpp_status_t zpp_xop_wait(zpp_xop_t *op);
/* Frees a done op; an op still in flight is cancelled first (its peers then
 * time out; the transport is broken). */
void zpp_xop_free(zpp_xop_t *op);
/* Details of the implementation (src/transport_algo.c):
 *   - tags: each start on group g takes the next number of g's sequence;
 *     the op's transfers carry tags derived from it, so ops in flight at
 *     once never match each other's messages, also on one pair of ranks;
 *   - the blocking wrappers are start + wait + free, and with staged
 *     device memory they also synchronise `stream` (as before: on return
 *     the output is complete);
 *   - an op started on a group of one member, or with nothing to send,
 *     may be done at start (its first test says so). */

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
 * as zpp_xop_wait does, and sleeps only once it stops (ZPP_NET_SPIN_US). */
uint64_t zpp_transport_progress(const zpp_transport_t *t);

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

/* Records the calling thread's last error as the transport's (so the
 * communicator's) last error and returns `st`. */
zpp_status_t zpp_transport_fail(zpp_transport_t *t, zpp_status_t st);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_TRANSPORT_H */
