/*
 * The bootstrap layer (docs/design.md, "Bootstrap"): how a communicator is
 * created over any zpp_bootstrap_t (comm_create.c), zpp's TCP bootstrap
 * (bootstrap_tcp.c), and what a creator (comm_mpi.c, the TCP paths) adds
 * to the generic creation.  Not installed.
 */
#ifndef ZPP_SRC_BOOTSTRAP_H
#define ZPP_SRC_BOOTSTRAP_H

#include <stdatomic.h>
#include <stdint.h>
#include <zpp/zpp_comm.h>

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zpp_transport;

/* What a creator adds to zpp_comm_create_with.  Zero-initialise, then set
 * what applies. */
typedef struct {
  const char *name;     /* bootstrap name for reports ("mpi", "tcp") */
  zpp_status_t pre_status; /* != ZPP_OK: this rank failed before creation
                              (message in zpp_get_last_error()); it still
                              takes part in the first exchange, so every
                              rank learns it */
  int has_host_key;     /* 1: host_key/real_local_rank come from the
                           launcher (MPI's shared-memory split) */
  int64_t host_key;
  int real_local_rank;
  int thread_caps;      /* ZPP_THREADS_* allowed (transport.h) */
  /* The MPI backend; NULL when the bootstrap is not MPI. */
  zpp_status_t (*mpi_transport)(struct zpp_transport *t, void *state,
                                int cuda_device);
  /* A subset communicator of `parent` (collective over parent, every rank
   * calls it): members[0..n) are the parent ranks of my colour in new-rank
   * order, I am members[me]; color ZPP_SPLIT_NONE (n 0): not a member, or
   * a rank failed (st != ZPP_OK: every rank still calls, so nobody waits);
   * NULL: zpp builds a TCP star for each subset. */
  zpp_status_t (*split)(zpp_comm_t parent, zpp_status_t st, int color,
                        const int *members, int n, int me,
                        const zpp_comm_config_t *cfg, zpp_comm_t *out);
  /* Frees `state` (called by zpp_comm_destroy after the transport is
   * freed, and only for communicators that were created). */
  void (*release)(zpp_comm_t c);
  void *state;
  void *tcp; /* the TCP bootstrap state when the bootstrap is zpp's own */
} zpp_creator_t;

/* Collective over bs's ranks.  On success the communicator owns cr->state
 * (released by cr->release); on failure the caller still owns it.  Failures
 * are agreed on: every rank returns an error naming the failing rank. */
zpp_status_t zpp_comm_create_with(const zpp_bootstrap_t *bs,
                                  const zpp_comm_config_t *cfg,
                                  const zpp_creator_t *cr, const char *func,
                                  zpp_comm_t *out);

/* ---- TCP bootstrap (bootstrap_tcp.c) ------------------------------------- */
/* Listens on ip (network order):port (0: any) and writes the id of a new
 * session; the listener waits in this process for zpp_tcp_boot_create. */
zpp_status_t zpp_tcp_listen(uint32_t ip, int port, uint64_t session,
                            zpp_unique_id_t *id, const char *func);
uint64_t zpp_tcp_random_session(void);
/* Closes the listener of `id` if this process holds it (an id that will
 * not be used: its creation failed on some rank). */
void zpp_tcp_unlisten(const zpp_unique_id_t *id);
/* ZPP_BOOTSTRAP_ADDR, else MASTER_ADDR, else 127.0.0.1. */
zpp_status_t zpp_tcp_listen_addr(const char *func, uint32_t *ip);
/* The id of torchrun's or srun's environment (rank 0 also starts
 * listening): MASTER_ADDR, else under srun the first host of
 * SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST); port ZPP_BOOTSTRAP_PORT,
 * else MASTER_PORT + 1, else under srun zpp_slurm_port + 1. */
zpp_status_t zpp_tcp_id_env(const char *func, int rank, zpp_unique_id_t *id);
/* RANK, WORLD_SIZE or LOCAL_RANK (or srun's SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID) as zpp_comm_create_from_env reads it: an integer in
 * [0, 2^24] (src/comm/comm_tcp.c; tests/fuzz calls it). */
zpp_status_t zpp_env_int(const char *name, int *v);
/* Joins the star of `id` as `rank` of `nranks` (the process holding the
 * id's listener is the root).  rank_error != NULL: this rank's own
 * arguments are bad; it tells the root (so every rank fails naming it) and
 * returns ZPP_ERR_INVALID_ARGUMENT with that text.  Fills a table whose
 * ctx is freed with zpp_tcp_boot_free. */
zpp_status_t zpp_tcp_boot_create(const zpp_unique_id_t *id, int nranks,
                                 int rank, double timeout_s,
                                 const char *rank_error, zpp_bootstrap_t *out,
                                 const char *func);
void zpp_tcp_boot_free(void *ctx);
/* From now on the bootstrap's waits end early once *flag is set (the
 * communicator's broken flag: zpp_comm_abort). */
void zpp_tcp_boot_watch(void *ctx, const atomic_int *flag);
/* The IPv4 (network order) other ranks reach this rank's bootstrap by. */
uint32_t zpp_tcp_boot_ip(void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_BOOTSTRAP_H */
