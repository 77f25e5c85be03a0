/*
 * The MPI adapter (docs/design.md, "Bootstrap"): zpp_comm_create_mpi
 * duplicates the caller's communicator, offers it as a bootstrap (its
 * collectives, each bounded by the timeout), adds what only MPI knows --
 * which ranks share a node (MPI's shared-memory split), the thread level,
 * the MPI backend, MPI_Comm_split for subsets -- and hands over to the
 * generic creation (comm_create.c).
 */
#include "bootstrap.h"
#include "transport_impl.h"

#if ZPP_HAVE_MPI

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zpp/zpp_mpi.h>

typedef struct {
  MPI_Comm dup;
} mpi_creator_t;

static void release_mpi(zpp_comm_t c) {
  mpi_creator_t *m = c->creator;
  int fin = 0;
  if (m == NULL)
    return;
  MPI_Finalized(&fin);
  if (!fin && m->dup != MPI_COMM_NULL)
    MPI_Comm_free(&m->dup);
  free(m);
  c->creator = NULL;
}

/* Waits for a non-blocking collective with the bootstrap's timeout.  A
 * collective cannot be cancelled: past the timeout it is left behind (the
 * communicator is unusable then anyway). */
static zpp_status_t wait_req(MPI_Request *req, double timeout_s,
                             const char *what) {
  int64_t deadline = timeout_s > 0 ? zpp_time_ns() + (int64_t)(timeout_s * 1e9)
                                   : INT64_MAX;
  long pause_ns = 1000;
  for (;;) {
    int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return zpp_mpi_error(rc, what, "MPI_Test");
    if (done)
      return ZPP_OK;
    if (zpp_time_ns() > deadline)
      return zpp_error(ZPP_ERR_TIMEOUT, what,
                       "MPI bootstrap: not every rank took part within %.3g s "
                       "(ZPP_TIMEOUT_S)",
                       timeout_s);
    {
      struct timespec ts = {0, pause_ns};
      nanosleep(&ts, NULL);
      if (pause_ns < 200000)
        pause_ns *= 2;
    }
  }
}

static zpp_status_t bs_bcast(void *ctx, void *buf, size_t bytes, int root,
                             double timeout_s) {
  MPI_Request req;
  int rc;
  if (bytes > (size_t)INT32_MAX)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__, "%zu bytes", bytes);
  rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, *(MPI_Comm *)ctx, &req);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, __func__, "MPI_Ibcast");
  return wait_req(&req, timeout_s, "bootstrap bcast");
}

static zpp_status_t bs_allgather(void *ctx, const void *mine, size_t bytes,
                                 void *all, double timeout_s) {
  MPI_Request req;
  int rc;
  if (bytes > (size_t)INT32_MAX)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__, "%zu bytes", bytes);
  rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                      *(MPI_Comm *)ctx, &req);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, __func__, "MPI_Iallgather");
  return wait_req(&req, timeout_s, "bootstrap allgather");
}

static zpp_status_t bs_barrier(void *ctx, double timeout_s) {
  MPI_Request req;
  int rc = MPI_Ibarrier(*(MPI_Comm *)ctx, &req);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, __func__, "MPI_Ibarrier");
  return wait_req(&req, timeout_s, "bootstrap barrier");
}

static zpp_status_t mpi_transport(zpp_transport_t *t, void *state,
                                  int cuda_device) {
  return zpp_transport_mpi_create(t, ((mpi_creator_t *)state)->dup,
                                  cuda_device);
}

/* Subsets with MPI_Comm_split (colour/key order equals zpp_comm_split's),
 * then the MPI path again on the result. */
static zpp_status_t mpi_split(zpp_comm_t parent, int color, int key,
                              const zpp_comm_config_t *cfg, zpp_comm_t *out) {
  MPI_Comm dup = ((mpi_creator_t *)parent->creator)->dup, sub = MPI_COMM_NULL;
  zpp_status_t st;
  int rc = MPI_Comm_split(dup, color == ZPP_SPLIT_NONE ? MPI_UNDEFINED : color,
                          key, &sub);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, "zpp_comm_split", "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) {
    *out = NULL;
    return ZPP_OK;
  }
  st = zpp_comm_create_mpi(sub, cfg, out);
  MPI_Comm_free(&sub);
  return st;
}

zpp_status_t zpp_comm_create_mpi(MPI_Comm comm, const zpp_comm_config_t *cfg,
                                 zpp_comm_t *out) {
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  zpp_creator_t cr;
  mpi_creator_t *mc = NULL;
  MPI_Comm shm = MPI_COMM_NULL;
  int init = 0, fin = 0, rank, size, rc, shm_rank = 0, key = 0, level = 0;
  zpp_status_t st;

  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "comm: MPI is %s; call MPI_Init first",
                     fin ? "finalised" : "not initialised");
  if (comm == MPI_COMM_NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "comm is MPI_COMM_NULL");
  mc = calloc(1, sizeof *mc);
  if (mc == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "communicator");
  mc->dup = MPI_COMM_NULL;
  rc = MPI_Comm_dup(comm, &mc->dup);
  if (rc != MPI_SUCCESS) {
    free(mc);
    return zpp_mpi_error(rc, __func__, "MPI_Comm_dup");
  }
  MPI_Comm_set_errhandler(mc->dup, MPI_ERRORS_RETURN);
  MPI_Comm_rank(mc->dup, &rank);
  MPI_Comm_size(mc->dup, &size);
  zpp_log_set_rank(rank);
  memset(&cr, 0, sizeof cr);
  cr.name = "mpi";
  /* What the collectives may do with threads (transport.h,
   * zpp_comm_thread_caps): the engine thread that runs started
   * collectives calls MPI while the caller may call MPI too, which needs
   * MPI_THREAD_MULTIPLE.  Blocking collectives (and chunked, pipelined
   * ones) run on the calling thread and need nothing more. */
  MPI_Query_thread(&level);
  cr.thread_caps = level >= MPI_THREAD_MULTIPLE ? ZPP_THREADS_PROGRESS : 0;
  if (level < MPI_THREAD_MULTIPLE)
    ZPP_INFO(ZPP_SUBSYS_NET,
             "MPI thread level %d: started collectives run to completion "
             "when started (asynchrony needs MPI_THREAD_MULTIPLE)",
             level);

  /* Host identity: the launcher's shared-memory domains; the lowest world
   * rank of each is its key. */
  st = ZPP_OK;
  rc = MPI_Comm_split_type(mc->dup, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                           &shm);
  if (rc == MPI_SUCCESS) {
    MPI_Comm_rank(shm, &shm_rank);
    rc = MPI_Allreduce(&rank, &key, 1, MPI_INT, MPI_MIN, shm);
    MPI_Comm_free(&shm);
  }
  if (rc != MPI_SUCCESS)
    st = zpp_mpi_error(rc, __func__,
                       "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  cr.pre_status = st;
  cr.has_host_key = 1;
  cr.host_key = key;
  cr.real_local_rank = shm_rank;
  cr.mpi_transport = mpi_transport;
  cr.split = mpi_split;
  cr.release = release_mpi;
  cr.state = mc;

  bs.name = "mpi";
  bs.rank = rank;
  bs.size = size;
  bs.ctx = &mc->dup;
  bs.allgather = bs_allgather;
  bs.bcast = bs_bcast;
  bs.barrier = bs_barrier;
  st = zpp_comm_create_with(&bs, cfg, &cr, __func__, out);
  if (st != ZPP_OK) {
    MPI_Comm_free(&mc->dup);
    free(mc);
  }
  return st;
}

zpp_status_t zpp_comm_get_mpi_comm(zpp_comm_t comm, MPI_Comm *out) {
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (comm->release != release_mpi)
    return zpp_error(ZPP_ERR_UNSUPPORTED, __func__,
                     "comm was not created from MPI");
  *out = ((mpi_creator_t *)comm->creator)->dup;
  return ZPP_OK;
}

#endif /* ZPP_HAVE_MPI */
