/*
 * srun's environment as zpp_comm_create_from_env reads it (tcp_id.c;
 * docs/api.md): whether to read it, the first host of a Slurm hostlist
 * and the default port.  Plain C, no atomics: the unit tests and the
 * fuzz target include it.  Not installed.
 */
#ifndef ZPP_SRC_COMM_SLURM_H
#define ZPP_SRC_COMM_SLURM_H

#include <stddef.h>
#include <zpp/zpp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when zpp_comm_create_from_env reads srun's variables: SLURM_PROCID is
 * set, RANK is not, and no other launcher started this process inside an
 * allocation (its ranks inherit the allocation's SLURM_*): not Open MPI's
 * mpirun (OMPI_COMM_WORLD_SIZE set), not MPICH's or Intel MPI's hydra
 * (MPI_LOCALRANKID set, or PMI_RANK / PMI_SIZE set but not equal to
 * SLURM_PROCID / SLURM_NTASKS), not a PMIx launcher whose PMIX_RANK differs
 * from SLURM_PROCID.  srun --mpi=pmi2 or pmix sets them equal. */
int zpp_env_slurm(void);
/* The first host name of a Slurm hostlist expression ("node[01-04,07],gpu3"
 * -> "node01", "a-[1-2]-b" -> "a-1-b"; the zero padding as written) into
 * out[len].  The whole list is checked; a malformed one gives
 * ZPP_ERR_INVALID_ARGUMENT naming `name` (the variable) and the value. */
zpp_status_t zpp_slurm_first_host(const char *name, const char *list, char *out,
                                  size_t len, const char *func);
/* Under srun without MASTER_PORT: 10000 + 2 * ((SLURM_JOB_ID * 61 +
 * SLURM_STEP_ID) mod 11000), a port in [10000, 31998] (below Linux's
 * ephemeral range).  Steps 0 to 10999 of one job get different ports, and
 * so do the steps 0 of jobs whose ids differ by less than 11000; steps of
 * two jobs can meet (job J step 61 is job J + 1 step 0): set MASTER_PORT
 * when such steps share a node.  zpp.init_process_group's store takes it;
 * zpp's bootstrap the next one. */
zpp_status_t zpp_slurm_port(const char *func, long *port);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COMM_SLURM_H */
