/*
 * The engine's own interface to the layers above (src/coll, src/runtime)
 * besides plans (plan.h): teardown and the tickets of queued plans.  Not
 * installed.
 */
#ifndef ZPP_SRC_ENGINE_ENGINE_H
#define ZPP_SRC_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#include "include/zpp_internal/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Drains the communicator's engine (queued plans run first) and stops its
 * thread.  Called by zpp_comm_destroy (the host scratch the plans used is
 * the transport's, freed with it). */
void zpp_engine_release(zpp_comm_t comm);

/* Tickets: the engine numbers the plans it queues 1, 2, ... in order.
 * zpp_engine_last_ticket: the newest one handed out on comm (0: none);
 * read before and after a call, a change means the call queued a plan
 * (a plan run inline is done with host memory when the call returns).
 * zpp_engine_in_flight: 1 while a plan with a ticket <= ticket is queued
 * or running on the engine thread (its host part may still read or write
 * the caller's buffers; device work it put on a stream is not seen), 0
 * once all have finished or were dropped (abort, abandoned waits).
 * zpp_engine_wait_ticket: waits until zpp_engine_in_flight is 0, bounded
 * like zpp_request_wait: when the engine made no progress for twice
 * ZPP_TIMEOUT_S and a second (no bound with ZPP_TIMEOUT_S 0), the
 * communicator is aborted and ZPP_ERR_TIMEOUT returned, its message
 * ending with `tail` (may be NULL).  Ticket 0 returns at once without
 * touching comm. */
uint64_t zpp_engine_last_ticket(zpp_comm_t comm);
int zpp_engine_in_flight(zpp_comm_t comm, uint64_t ticket);
zpp_status_t zpp_engine_wait_ticket(zpp_comm_t comm, uint64_t ticket,
                                    const char *func, const char *tail);
/* 1 when the calling thread is comm's engine thread (running a plan's
 * step or release). */
int zpp_engine_on_thread(zpp_comm_t comm);


#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ENGINE_ENGINE_H */
