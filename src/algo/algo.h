/*
 * The algorithms layer (src/algo): how a transfer descriptor
 * (transport/transport.h) becomes work on the wire.  zpp_xfer_start checks
 * it and dispatches it once: to the backend's collective table (NCCL:
 * enqueued on the stream) or to the host algorithms over the round table
 * (MPI, UCX: ring, pairwise and hierarchical state machines, op.c, ring.c,
 * pairwise.c, hier.c).  The engine (src/engine) runs every transfer step of
 * a plan through these calls.  Not installed.
 *
 * Several operations may be in flight on one transport, also on different
 * groups; they must be started in the same order on every member of their
 * group (each gets a tag from a per-group sequence, so their messages
 * never match another operation's).
 *
 *   host backends: the algorithms run as non-blocking state machines over
 *     rounds; device buffers are staged through pinned host memory (the
 *     stage-in copy is waited for at start, within the op's timeout, the
 *     stage-out copy is enqueued on the stream at completion);
 *   stream-ordered backends: start enqueues on the stream; the op is then
 *     done as far as the host is concerned (its completion is the
 *     stream's business: plans record an event).
 *
 * A timed-out operation (ZPP_TIMEOUT_S from its start), or one freed while
 * in flight, breaks the transport; other failures return their error and
 * the engine breaks the transport for any plan that failed part-way (its
 * peers still run the transfers this rank skipped).  Single-threaded per
 * transport: the caller serialises calls.
 */
#ifndef ZPP_SRC_ALGO_ALGO_H
#define ZPP_SRC_ALGO_ALGO_H

#include <stdint.h>
#include <zpp/zpp.h>

#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_xop zpp_xop_t;

/* Flags of zpp_xfer_start. */
#define ZPP_XFER_SYNC_OUT 1u /* host backends, device memory: the stage-out
                                copy is synchronised at completion, so the
                                output is complete when the op is done */

/* ZPP_OK when d is a valid descriptor for t (group, memory space, buffers
 * non-NULL where bytes move, sizes that fit size_t, reduction dtype and
 * op); else the error, named after `func`, also kept on the transport. */
zpp_status_t zpp_xfer_check(zpp_transport_t *t, const zpp_xfer_desc_t *d,
                            const char *func);
/* Checks d and starts it without blocking; *op is the handle (also for a
 * stream-ordered backend, where it is done at once).  The descriptor may
 * be reused once this returns; its arrays must live until the op is done.
 * On error no op is returned. */
zpp_status_t zpp_xfer_start(zpp_transport_t *t, const zpp_xfer_desc_t *d,
                            unsigned flags, zpp_xop_t **op);
/* Advances op without blocking; *done = 1 once its output is complete
 * (host memory) or enqueued (stream-ordered / staged device output).  An
 * error (also a timeout) is returned once; the op is then done. */
zpp_status_t zpp_xop_test(zpp_xop_t *op, int *done);
/* Earliest CLOCK_MONOTONIC time (ns) at which testing op again can make
 * progress when nothing else happens (an emulated link's deadline), or 0:
 * poll as usual.  Lets the engine sleep instead of spinning. */
int64_t zpp_xop_wake_ns(const zpp_xop_t *op);
/* Frees a done op; an op still in flight is cancelled first (its peers then
 * time out; the transport is broken). */
void zpp_xop_free(zpp_xop_t *op);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ALGO_ALGO_H */
