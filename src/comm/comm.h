/*
 * The communicator layer (src/comm): struct zpp_comm, creation over any
 * bootstrap (MPI, zpp's TCP bootstrap, a caller's table), subsets, and
 * what the layers above (engine, collectives, runtime) ask of a
 * communicator.  A communicator owns one transport (src/transport) and
 * frees the host algorithms' caches (src/algo) with it.  Not installed.
 */
#ifndef ZPP_SRC_COMM_COMM_H
#define ZPP_SRC_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#include "core/core.h"
#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sizeof(zpp_comm_config_t) of zpp 0.1 (the fields up to timeout_s): a
 * caller built against that header passes it, and the fields added since
 * take their defaults. */
#define ZPP_COMM_CONFIG_V1_SIZE                                                \
  (offsetof(zpp_comm_config_t, timeout_s) + sizeof(double))

/* The whole current config from one of any accepted struct_size (>=
 * ZPP_COMM_CONFIG_V1_SIZE, checked by the caller). */
void zpp_comm_config_get(const zpp_comm_config_t *in, zpp_comm_config_t *out);

/* The communicator: a transport plus what created it.  The bootstrap
 * table (public zpp_bootstrap_t, <zpp/zpp_comm.h>) is also what backends
 * use at creation (NCCL's unique id, UCX's worker addresses), so backends
 * never depend on MPI. */
struct zpp_comm {
  zpp_transport_t *tr;
  zpp_comm_config_t cfg; /* as given, topology pointer cleared */
  char topo_spec[128];   /* the emulation spec in use ("" if discovered) */
  int cuda_device;       /* -1 for host-memory communicators */
  /* Frees what the creator owns besides the transport (zpp's MPI
   * duplicate, the TCP bootstrap); called after the transport is freed. */
  void (*release)(struct zpp_comm *c);
  void *creator; /* state of the creator (comm_mpi.c) */
  void *tcp;     /* zpp's TCP bootstrap state, freed on destroy (or NULL) */
  /* A subset communicator made the creator's way (NULL: a TCP star). */
  zpp_status_t (*split)(struct zpp_comm *parent, zpp_status_t st, int color,
                        const int *members, int n, int me,
                        const zpp_comm_config_t *cfg, struct zpp_comm **out);
  /* Set by a layer above (the collectives' progress thread): called first
   * in zpp_comm_destroy, while the transport still works. */
  void (*before_destroy)(struct zpp_comm *c);
  /* Set by the engine: called by zpp_comm_abort (any thread) after the
   * transport is broken, to complete the requests of queued plans. */
  void (*on_abort)(struct zpp_comm *c);
  /* Set by the engine: waits (bounded) until the collectives started so
   * far ran their host part, so that the statistics count them. */
  zpp_status_t (*quiesce)(struct zpp_comm *c, const char *func);
  /* Out-of-band host exchange for metadata (ZPP_CHECK), on every
   * backend; not counted in the statistics. */
  zpp_bootstrap_t boot;
  char boot_name[32];
  int thread_caps; /* ZPP_THREADS_* the creator's MPI allows */
  void *engine;    /* the plan engine (src/engine), created on first use */
  uint64_t objects; /* objects created on it so far (zpp_comm_next_object_id) */
  /* Every rank's listening socket for zpp_comm_shrink (shrink.c); NULL
   * when it could not be opened. */
  struct zpp_rescue *rescue;
};

/* zpp_comm_config_check reporting under `func` (the creating function). */
zpp_status_t zpp_comm_config_check_as(const char *func,
                                      const zpp_comm_config_t *cfg);

/* Registers fn to run first in zpp_comm_destroy, while the transport
 * still works (upper layers drain their work there; one hook). */
void zpp_comm_set_before_destroy(zpp_comm_t comm, void (*fn)(zpp_comm_t));
/* Registers fn to run in zpp_comm_abort (from any thread), after the
 * transport is marked broken (one hook). */
void zpp_comm_set_on_abort(zpp_comm_t comm, void (*fn)(zpp_comm_t));
/* Registers fn to run at the start of zpp_comm_get_stats and
 * zpp_comm_reset_stats (one hook). */
void zpp_comm_set_quiesce(zpp_comm_t comm,
                          zpp_status_t (*fn)(zpp_comm_t, const char *));

/* Every rank's `bytes` of host memory `mine`, concatenated by world rank,
 * over the communicator's bootstrap channel: works on every backend (NCCL
 * included) and is not counted in the statistics.  For metadata only. */
zpp_status_t zpp_comm_meta_allgather(zpp_comm_t comm, const void *mine,
                                     size_t bytes, void *all);

/* What threads the collectives may use on this communicator, from the
 * MPI thread level at creation: ZPP_THREADS_PROGRESS, the engine thread
 * that runs started collectives while the caller may call MPI. */
#define ZPP_THREADS_PROGRESS 2
int zpp_comm_thread_caps(zpp_comm_t comm);

/* The CUDA device of a device-memory communicator (-1 for host memory). */
int zpp_comm_device(zpp_comm_t comm);

/* The transport of a communicator (never NULL for a valid comm). */
zpp_transport_t *zpp_comm_transport(zpp_comm_t comm);

/* Records the calling thread's last error as the communicator's last error
 * and returns `st`.  Collectives use it on their own error paths. */
zpp_status_t zpp_comm_fail(zpp_comm_t comm, zpp_status_t st);

/* 0, 1, 2, ...: the index of an object (a parameter group) among those
 * created on communicator `comm` (comm.c).  Objects are created
 * collectively, in the same order on every rank, so the index is the same
 * on every rank; it gives each object its own stochastic-rounding stream. */
uint64_t zpp_comm_next_object_id(zpp_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COMM_COMM_H */
