/*
 * Creating a zpp communicator from an MPI communicator.  Separate from
 * <zpp/zpp_comm.h> so that code which never creates a communicator does
 * not need mpi.h.
 */
#ifndef ZPP_ZPP_MPI_H
#define ZPP_ZPP_MPI_H

#include <mpi.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over the ranks of `comm`.  MPI must be initialised by the
 * caller (zpp never calls MPI_Init or MPI_Finalize) and stay initialised
 * until zpp_comm_destroy.  zpp duplicates `comm` (MPI_Comm_idup), so its
 * traffic never mixes with the caller's.  cfg NULL: defaults.  Every wait
 * is bounded by the timeout (cfg->timeout_s, else ZPP_TIMEOUT_S): zpp calls
 * no blocking MPI collective; after the duplication (whose missing ranks
 * MPI cannot name) errors name the ranks that did not take part.  The node
 * map comes from host identities (host name, boot id, network namespace),
 * as on every bootstrap.
 *
 * Threads: the communicator's operations may be called from one thread
 * other than the creating one (a progress thread), one call at a time;
 * MPI must then provide MPI_THREAD_SERIALIZED, or MPI_THREAD_MULTIPLE when
 * the application calls MPI concurrently from another thread.
 *
 * Errors: ZPP_ERR_UNSUPPORTED when zpp was built without MPI or the
 * requested backend is not available; ZPP_ERR_INVALID_ARGUMENT for a bad
 * config or topology string (the message names it). */
ZPP_API zpp_status_t zpp_comm_create_mpi(MPI_Comm comm,
                                         const zpp_comm_config_t *cfg,
                                         zpp_comm_t *out);

/* The communicator zpp duplicated from the caller's (for tools and tests;
 * do not free it).  ZPP_ERR_UNSUPPORTED for a subset (zpp_comm_split):
 * zpp keeps no MPI communicator of exactly its ranks. */
ZPP_API zpp_status_t zpp_comm_get_mpi_comm(zpp_comm_t comm, MPI_Comm *out);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_ZPP_MPI_H */
