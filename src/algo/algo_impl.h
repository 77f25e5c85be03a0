/*
 * What the files of src/algo share: the op state machine's entry points.
 * Not for other layers (they use algo.h).
 */
#ifndef ZPP_SRC_ALGO_ALGO_IMPL_H
#define ZPP_SRC_ALGO_ALGO_IMPL_H

#include "algo/algo.h"
#include "transport/transport_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts d (checked) on a host backend; called with t->lock held, after
 * the call was counted.  sync_out: staged device output is synchronised at
 * completion.  On error no op is returned. */
zpp_status_t zpp_algo_start(zpp_transport_t *t, const zpp_xfer_desc_t *d,
                            int sync_out, zpp_xop_t **op);
/* The op of a stream-ordered backend once enqueued: done from the start
 * (shared, never written; zpp_xop_free ignores it). */
zpp_xop_t *zpp_xop_done(void);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ALGO_ALGO_IMPL_H */
