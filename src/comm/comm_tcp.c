/*
 * zpp's own ways in: a communicator over zpp's TCP bootstrap from a unique
 * id (zpp_comm_create_from_id) or from torchrun's or srun's environment
 * (zpp_comm_create_from_env).  docs/design.md, "Bootstrap".
 */
#include "comm/comm.h"

#include "comm/comm_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/slurm.h"
#include "core/core.h"
#include "transport/transport_impl.h"

static double timeout_of(const zpp_comm_config_t *cfg) {
  if (cfg != NULL && cfg->struct_size >= ZPP_COMM_CONFIG_V1_SIZE &&
      cfg->timeout_s > 0)
    return zpp_timeout_clamp(cfg->timeout_s);
  return zpp_timeout_clamp(zpp_setting_double("ZPP_TIMEOUT_S", 300.0));
}

zpp_status_t zpp_comm_create_tcp(const zpp_unique_id_t *id, int nranks,
                                 int rank, const zpp_comm_config_t *cfg,
                                 const char *rank_error, const char *func,
                                 zpp_comm_t *out) {
  zpp_bootstrap_t bs;
  zpp_creator_t cr;
  zpp_status_t st;
  ZPP_CHECK(zpp_tcp_boot_create(id, nranks, rank, timeout_of(cfg), rank_error,
                                &bs, func));
  memset(&cr, 0, sizeof cr);
  cr.name = "tcp";
  cr.thread_caps = ZPP_THREADS_PROGRESS;
  cr.tcp = bs.ctx;
  cr.release = zpp_comm_release_tcp;
  st = zpp_comm_create_with(&bs, cfg, &cr, func, out);
  if (st != ZPP_OK)
    zpp_tcp_boot_free(bs.ctx);
  else /* zpp_comm_abort ends the bootstrap's waits too */
    zpp_tcp_boot_watch(bs.ctx, &(*out)->tr->broken);
  return st;
}

zpp_status_t zpp_comm_create_from_id(const zpp_unique_id_t *id, int nranks,
                                     int rank, const zpp_comm_config_t *cfg,
                                     zpp_comm_t *out) {
  char bad[200];
  if (id == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "id is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (nranks < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "nranks %d: must be >= 1", nranks);
  if (rank < 0 || rank >= nranks) {
    /* Tell the root, so every rank fails naming this one. */
    snprintf(bad, sizeof bad, "rank %d: must be in [0, nranks = %d)", rank,
             nranks);
    return zpp_comm_create_tcp(id, nranks, rank, cfg, bad, __func__, out);
  }
  return zpp_comm_create_tcp(id, nranks, rank, cfg, NULL, __func__, out);
}

static zpp_status_t env_int(const char *name, int *v, const char *func) {
  const char *s = getenv(name);
  char *end = NULL;
  long x;
  if (s == NULL || s[0] == '\0')
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func, "%s is not set (%s)", name,
                     strncmp(name, "SLURM_", 6) == 0
                         ? "srun sets SLURM_PROCID, SLURM_NTASKS, "
                           "SLURM_LOCALID, SLURM_STEP_ID and "
                           "SLURM_STEP_NODELIST"
                         : "torchrun sets MASTER_ADDR, MASTER_PORT, RANK and "
                           "WORLD_SIZE; srun sets SLURM_PROCID and "
                           "SLURM_NTASKS");
  errno = 0;
  x = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || x < 0 || x > 1 << 24)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s \"%s\": must be a non-negative integer", name, s);
  *v = (int)x;
  return ZPP_OK;
}

zpp_status_t zpp_comm_create_from_env(const zpp_comm_config_t *cfg,
                                      zpp_comm_t *out) {
  zpp_unique_id_t id;
  int rank = 0, size = 0, local = -1;
  zpp_status_t st;
  char bad[200];
  const char *bad_rank = NULL, *step = getenv("SLURM_STEP_ID");
  /* torchrun's variables, else srun's (docs/api.md) */
  const int slurm = zpp_env_slurm();
  const char *rank_var = slurm ? "SLURM_PROCID" : "RANK";
  const char *size_var = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  const char *local_var = slurm ? "SLURM_LOCALID" : "LOCAL_RANK";
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (slurm && (step == NULL || step[0] == '\0'))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "SLURM_PROCID is set but SLURM_STEP_ID is not: this "
                     "process is a batch script's (sbatch, salloc), not a "
                     "task of srun; start the ranks with srun, or set "
                     "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  ZPP_CHECK(env_int(rank_var, &rank, __func__));
  ZPP_CHECK(env_int(size_var, &size, __func__));
  if (size < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__, "%s %d: must be >= 1",
                     size_var, size);
  if (getenv(local_var) != NULL)
    ZPP_CHECK(env_int(local_var, &local, __func__));
  if (rank >= size) {
    snprintf(bad, sizeof bad, "%s %d: must be in [0, %s = %d)", rank_var, rank,
             size_var, size);
    bad_rank = bad;
  }
  ZPP_CHECK(zpp_tcp_id_env(__func__, rank, &id));
  st = zpp_comm_create_tcp(&id, size, rank, cfg, bad_rank, __func__, out);
  if (st == ZPP_OK && local >= 0) {
    zpp_comm_t c = *out;
    int mine = c->tr->topo->emulated ? -1 : c->tr->topo->local_rank_of[rank];
    if (mine >= 0 && mine != local)
      ZPP_WARN(ZPP_SUBSYS_TOPO,
               "%s %d differs from the local rank %d discovered from "
               "host identities (zpp uses its own)",
               local_var, local, mine);
  }
  return st;
}

/* tests/fuzz: the parser of RANK, WORLD_SIZE and LOCAL_RANK (and of
 * SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID). */
zpp_status_t zpp_env_int(const char *name, int *v) {
  return env_int(name, v, __func__);
}
