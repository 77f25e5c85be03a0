/*
 * zpp communicator: the ranks of a job, their topology (which ranks share
 * a node, how GPUs on a node are linked), the transport that moves bytes
 * between them, and exact counts of the bytes each link class carried.
 *
 * A communicator is created over a *bootstrap*: a small out-of-band
 * exchange (allgather, bcast, barrier) used at creation and for metadata.
 * Three ways in:
 *   - zpp_comm_create_from_id / zpp_comm_create_from_env: zpp's own TCP
 *     bootstrap, from a unique id or torchrun's or srun's environment (no
 *     MPI);
 *   - zpp_comm_create_mpi (<zpp/zpp_mpi.h>): MPI is the bootstrap (zpp never
 *     calls MPI_Init or MPI_Finalize);
 *   - zpp_comm_create: any bootstrap the caller provides (a table below).
 * zpp_comm_split and zpp_comm_create_from_ranks make communicators of any
 * subset.  The collectives (qwZ, hpZ, qgZ) are declared in their own header
 * and take a zpp_comm_t.
 *
 * Topology and groups (docs/design.md, "Topology"):
 *   - node:       ranks that share a machine (from the launcher), or an
 *                 emulated node when ZPP_TOPO / zpp_comm_config_t.topology
 *                 is set; nodes are numbered by their lowest world rank;
 *   - local rank: position of a rank among its node's ranks, by world rank;
 *   - groups:     ZPP_GROUP_WORLD (all ranks), ZPP_GROUP_NODE (my node's
 *                 ranks, ordered by local rank), ZPP_GROUP_CROSS (the ranks
 *                 with my local rank on every node that has one, ordered by
 *                 node).  With an uneven layout (3 ranks on one node, 5 on
 *                 another) CROSS groups differ in size: see "uniform".
 */
#ifndef ZPP_ZPP_COMM_H
#define ZPP_ZPP_COMM_H

#include <zpp/zpp.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_comm *zpp_comm_t;

typedef enum {
  ZPP_BACKEND_AUTO = 0, /* ZPP_BACKEND names one, else: host memory: MPI
                           (under an MPI bootstrap), else UCX; device
                           memory: NCCL when it loads and a device is
                           usable, else MPI (or UCX) staging */
  ZPP_BACKEND_MPI = 1,  /* host memory; device memory staged through pinned
                           host buffers */
  ZPP_BACKEND_NCCL = 2, /* device memory, asynchronous on a CUDA stream */
  ZPP_BACKEND_UCX = 3   /* UCX (ucp, tag matching), host memory; device
                           memory staged through host buffers (zpp loads
                           libucp.so.0 at run time) */
} zpp_backend_t;

typedef enum {
  ZPP_MEMORY_HOST = 0,  /* buffers passed to operations are host pointers */
  ZPP_MEMORY_DEVICE = 1 /* buffers are CUDA device pointers */
} zpp_memory_t;

/* Link class between two ranks.  Byte accounting uses two classes only:
 * intra-node (every class below ZPP_LINK_NET) and inter-node. */
typedef enum {
  ZPP_LINK_SELF = 0,        /* the same rank */
  ZPP_LINK_SAME_DEVICE = 1, /* two ranks on one GPU */
  ZPP_LINK_NVLINK = 2,      /* GPUs joined by NVLink or an NVSwitch */
  ZPP_LINK_PCIE = 3,        /* GPUs with peer access over PCIe */
  ZPP_LINK_HOST = 4,        /* same node, through host memory (host
                               buffers, or GPUs without a peer path) */
  ZPP_LINK_NET = 5          /* different nodes: the network */
} zpp_link_t;

/* "self", "same-device", "nvlink", "pcie", "host", "net". */
ZPP_API const char *zpp_link_name(zpp_link_t link);

typedef enum {
  ZPP_GROUP_WORLD = 0,
  ZPP_GROUP_NODE = 1,
  ZPP_GROUP_CROSS = 2
} zpp_group_t;
#define ZPP_NGROUPS 3

/* "world", "node", "cross". */
ZPP_API const char *zpp_group_name(zpp_group_t group);
/* "auto", "mpi", "nccl", "ucx". */
ZPP_API const char *zpp_backend_name(zpp_backend_t backend);

/* How all-gathers and reduce-scatters over several nodes move their bytes
 * (host backends MPI and UCX; NCCL chooses its own routing). */
typedef enum {
  ZPP_ALGORITHM_DEFAULT = 0, /* the setting ZPP_ALGO (auto when unset) */
  ZPP_ALGORITHM_HIER = 1,    /* rail-aligned and hierarchical across nodes:
                                every inter-node link carries the minimum
                                (docs/design.md, "Transports"); inside one
                                node, and with one rank per node, the flat
                                algorithms */
  ZPP_ALGORITHM_FLAT = 2,    /* ring all-gather and pairwise reduce-scatter
                                over every group */
  ZPP_ALGORITHM_AUTO = 3     /* per call, the one a cost model predicts to
                                be faster for its size, the group's nodes
                                and the links (docs/design.md, "Choosing
                                the algorithm"; ZPP_TUNER_FILE) */
} zpp_algorithm_t;

typedef struct {
  size_t struct_size;    /* sizeof(zpp_comm_config_t): set by the INIT macro */
  zpp_backend_t backend; /* default ZPP_BACKEND_AUTO (then the setting
                            ZPP_BACKEND=mpi|nccl|ucx decides, if set) */
  zpp_memory_t memory;   /* memory space of operation buffers */
  int cuda_device;       /* device memory: CUDA device index; -1 (default):
                            the rank's real local rank modulo the number of
                            visible devices */
  const char *topology;  /* emulated topology ("2x4", "0,0,0,1,1"); takes
                            precedence over ZPP_TOPO; NULL or "": ZPP_TOPO,
                            else discovery */
  double timeout_s;      /* > 0: overrides ZPP_TIMEOUT_S for this
                            communicator; <= 0 (default): ZPP_TIMEOUT_S;
                            either is taken as at most 1e9 s */
  /* Fields below were added in 0.2; a struct_size from before (the
   * size up to timeout_s) is accepted and they take their defaults. */
  zpp_algorithm_t algorithm; /* default ZPP_ALGORITHM_DEFAULT: the setting
                                ZPP_ALGO=auto|hier|flat decides; every rank
                                must use the same */
} zpp_comm_config_t;

#define ZPP_COMM_CONFIG_INIT                                                   \
  { sizeof(zpp_comm_config_t), ZPP_BACKEND_AUTO, ZPP_MEMORY_HOST, -1, NULL,     \
    0.0, ZPP_ALGORITHM_DEFAULT }

/* Checks a config; the message names the bad field. */
ZPP_API zpp_status_t zpp_comm_config_check(const zpp_comm_config_t *cfg);

/* ---- bootstrap -----------------------------------------------------------
 * The out-of-band exchange a communicator is built over (docs/design.md,
 * "Bootstrap").  Every function is collective over the bootstrap's `size`
 * ranks, takes and returns host memory, and must return within
 * `timeout_s` seconds (<= 0: no limit) with ZPP_OK or an error status
 * (ZPP_ERR_TIMEOUT when a peer did not take part in time); every rank calls
 * them in the same order.  zpp calls them at creation, in zpp_comm_split
 * and for metadata checks (ZPP_CHECK=1), from one thread at a time. */
typedef struct {
  size_t struct_size; /* sizeof(zpp_bootstrap_t): ZPP_BOOTSTRAP_INIT */
  const char *name;   /* shown in reports ("mpi", "tcp", ...); NULL: "user" */
  int rank, size;     /* my rank, number of ranks (0 <= rank < size) */
  void *ctx;          /* passed to every function; owned by the caller */
  /* all[r * bytes ..] = rank r's `mine` (bytes each, the same on all). */
  zpp_status_t (*allgather)(void *ctx, const void *mine, size_t bytes,
                            void *all, double timeout_s);
  /* buf (bytes) of rank `root` to every rank. */
  zpp_status_t (*bcast)(void *ctx, void *buf, size_t bytes, int root,
                        double timeout_s);
  zpp_status_t (*barrier)(void *ctx, double timeout_s);
} zpp_bootstrap_t;

#define ZPP_BOOTSTRAP_INIT                                                     \
  { sizeof(zpp_bootstrap_t), NULL, 0, 0, NULL, NULL, NULL, NULL }

/* Collective over the bootstrap's ranks: a communicator of bs->size ranks,
 * world rank bs->rank.  The table is copied; bs->ctx must stay valid until
 * zpp_comm_destroy.  Topology discovery exchanges host identities over the
 * bootstrap (host name, boot id and network namespace: equal identities
 * share a node) and, for device memory, GPU bus ids; ZPP_TOPO still
 * emulates.  cfg NULL: defaults.  Backend AUTO: UCX for host memory.
 * Errors are agreed on: when one rank fails, every rank returns an error
 * naming that rank and its message. */
ZPP_API zpp_status_t zpp_comm_create(const zpp_bootstrap_t *bs,
                                     const zpp_comm_config_t *cfg,
                                     zpp_comm_t *out);

/* A copy of the bootstrap table a communicator was built over (its own
 * TCP or MPI adapter, or the caller's).  Tools use it for their own
 * barriers and reductions; never call it while a started collective of
 * the communicator is in flight (ZPP_CHECK uses the same channel). */
ZPP_API zpp_status_t zpp_comm_get_bootstrap(zpp_comm_t comm,
                                            zpp_bootstrap_t *bs);

/* zpp's TCP bootstrap.  One process -- the one that calls
 * zpp_get_unique_id, which must also be one of the ranks -- listens on an
 * address (ZPP_BOOTSTRAP_ADDR, else MASTER_ADDR, else 127.0.0.1; port
 * ZPP_BOOTSTRAP_PORT, else any free one); the id carries that address and a
 * random session number.  Pass the id to every rank out of band, then call
 * zpp_comm_create_from_id on each.  Ranks connect to that process (a star);
 * every wait is bounded by the timeout (cfg->timeout_s, else
 * ZPP_TIMEOUT_S).  Errors name the problem on every rank: a malformed id
 * (ZPP_ERR_INVALID_ARGUMENT), an id whose root is gone (stale:
 * ZPP_ERR_TIMEOUT after retrying for the timeout, or ZPP_ERR_MISMATCH when
 * another session answers), rank >= nranks, a rank claimed twice
 * (ZPP_ERR_MISMATCH), a rank that never arrives (ZPP_ERR_TIMEOUT naming
 * it), a port already in use (ZPP_ERR_SYSTEM). */
#define ZPP_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[ZPP_UNIQUE_ID_BYTES];
} zpp_unique_id_t;

ZPP_API zpp_status_t zpp_get_unique_id(zpp_unique_id_t *id);
/* Stops listening for an id of zpp_get_unique_id that no communicator will
 * be made from (a failure before zpp_comm_create_from_id, e.g. the id could
 * not be passed on).  An id this process does not listen for (another's,
 * or already used) is left alone: ZPP_OK. */
ZPP_API zpp_status_t zpp_release_unique_id(const zpp_unique_id_t *id);

ZPP_API zpp_status_t zpp_comm_create_from_id(const zpp_unique_id_t *id,
                                             int nranks, int rank,
                                             const zpp_comm_config_t *cfg,
                                             zpp_comm_t *out);

/* The TCP bootstrap from torchrun's environment: RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT (LOCAL_RANK, when set, is recorded and checked
 * against the discovered local rank: a mismatch is logged).  Rank 0 listens
 * on MASTER_ADDR at port ZPP_BOOTSTRAP_PORT, else MASTER_PORT + 1 (torchrun's
 * own store holds MASTER_PORT).
 * Without RANK, srun's variables (unless another launcher started the
 * process inside an allocation: Open MPI's OMPI_COMM_WORLD_SIZE set, or
 * MPICH's or Intel MPI's hydra, whose MPI_LOCALRANKID, PMI_RANK or PMI_SIZE
 * are set and disagree with SLURM_PROCID / SLURM_NTASKS): SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID (checked as LOCAL_RANK is), SLURM_STEP_ID
 * (required: without it the process is a batch script's, not srun's); the
 * root's address is MASTER_ADDR, else the first host of
 * SLURM_STEP_NODELIST, else of SLURM_JOB_NODELIST ("node[01-04],gpu3":
 * node01; where srun's block distribution puts task 0); its port
 * ZPP_BOOTSTRAP_PORT, else MASTER_PORT + 1, else P + 1 with
 * P = 10000 + 2 * ((SLURM_JOB_ID * 61 + SLURM_STEP_ID) mod 11000): steps
 * 0 to 10999 of a job get different ports, as do the steps 0 of jobs whose
 * ids differ by less than 11000, but steps of two jobs can meet (job J step
 * 61 is job J + 1 step 0; set MASTER_PORT then).  zpp.init_process_group
 * puts torch's store on P.  Missing or malformed variables give
 * ZPP_ERR_INVALID_ARGUMENT naming them. */
ZPP_API zpp_status_t zpp_comm_create_from_env(const zpp_comm_config_t *cfg,
                                              zpp_comm_t *out);

/* Name of the bootstrap of a communicator: "tcp", "mpi", or the caller's
 * zpp_bootstrap_t.name ("user" when NULL). */
ZPP_API const char *zpp_comm_bootstrap_name(zpp_comm_t comm);

/* ---- communicators of a subset ------------------------------------------
 * Collective over the ranks of `comm`.  Ranks with the same `color` (>= 0)
 * form one new communicator, ordered by (key, rank in comm); color
 * ZPP_SPLIT_NONE gives *newcomm = NULL.  The new communicator has the
 * backend and memory space of `comm`; its node map is `comm`'s restricted
 * to its ranks (an emulated map stays emulated).  Its bootstrap: a
 * duplicate of the MPI communicator with a rank map for communicators made
 * by zpp_comm_create_mpi, else a new TCP star rooted at its first rank
 * (address: the one `comm`'s TCP bootstrap uses, else ZPP_BOOTSTRAP_ADDR,
 * else 127.0.0.1 when every member shares a host).  Under MPI a subset
 * that does not hold every rank of its MPI communicator cannot be split
 * again (nor passed to zpp_comm_create_from_ranks): every rank fails at
 * once with ZPP_ERR_UNSUPPORTED (zpp_mpi.h). */
#define ZPP_SPLIT_NONE (-1)
ZPP_API zpp_status_t zpp_comm_split(zpp_comm_t comm, int color, int key,
                                    zpp_comm_t *newcomm);

/* Collective over the ranks of `comm`, every rank passing the same list:
 * a communicator of comm's ranks ranks[0..n-1] in that order (rank i of the
 * new communicator is ranks[i]); ranks not in the list get NULL.  Ranks
 * must be distinct and in [0, size).  The lists are compared: ranks that
 * passed different ones all fail with ZPP_ERR_MISMATCH naming one that
 * differs; a rank whose list is invalid makes every rank fail, naming it. */
ZPP_API zpp_status_t zpp_comm_create_from_ranks(zpp_comm_t comm, int n,
                                                const int *ranks,
                                                zpp_comm_t *newcomm);

/* Collective over the ranks of the communicator.  Safe on NULL.  Returns
 * (bounded) also after zpp_comm_abort or a failure: started requests not
 * waited for are dropped (queued plans never run; a running one ends at
 * its next step), and nothing waits for a peer.  After a failure it first
 * waits for the transfers of the failed calls that could not be cancelled
 * (see "faults" below): receives up to the timeout, sends (they only
 * read) up to 1 s. */
ZPP_API zpp_status_t zpp_comm_destroy(zpp_comm_t comm);

/* ---- faults ----------------------------------------------------------------
 * A communicator that fails -- a peer missing past the timeout
 * (ZPP_TIMEOUT_S), a collective that failed part-way on this rank, an
 * error of the backend -- or that is aborted, is unusable from then on:
 * every later call on it (collectives, zpp_comm_split, waits) fails at
 * once with its *first* error, and it can only be destroyed.  Errors from
 * timeouts name the ranks whose part never came ("rank 3 did not take
 * part ...", "... of transfers from 3"), and, for ranks on this machine,
 * whether their process is gone or stopped.
 *
 * Buffers of a failed call.  A call that failed or was aborted while its
 * transfers were in flight cancels them, but a transfer the peer has
 * already matched cannot be cancelled, and Open MPI cancels no send: the
 * MPI and UCX backends may still write the call's receive buffers and read
 * its send buffers after it returned.  Keep a failed call's buffers
 * allocated until zpp_comm_destroy returns.  Destroy waits for such
 * transfers (bounded, above); those still pending then are left to the
 * backend, the buffers zpp owns that they use (scratch, staging) are
 * leaked rather than freed under them, and a warning says so: a send may
 * then still read a user buffer if its peer posts the receive later. */

/* Aborts the communicator on this rank.  Safe from any thread, also while
 * other threads are inside calls on it (not concurrently with or after
 * zpp_comm_destroy); local (no communication) and returns at once.  Every
 * call that waits on it and every request not yet complete returns
 * ZPP_ERR_ABORTED promptly (at its next poll: about a millisecond, or
 * after the kernel step it is running); later calls fail at once with the
 * communicator's first error (ZPP_ERR_ABORTED unless it had failed
 * before).  Other ranks are not told: their collectives with this rank
 * time out, naming it, unless they abort too.  Call zpp_comm_destroy
 * afterwards. */
ZPP_API zpp_status_t zpp_comm_abort(zpp_comm_t comm);

/* ---- surviving a rank's death ----------------------------------------------
 * zpp_comm_shrink: called by every surviving rank of `comm` (after a
 * collective failed, or at any time), it aborts `comm` on this rank, lets
 * the survivors agree on who is alive and builds a communicator of exactly
 * those ranks, renumbered in the order of their ranks in `comm`.  It needs
 * nothing of `comm`'s bootstrap, backend or MPI (which may be gone with
 * the dead rank): every communicator keeps, from its creation, one
 * listening TCP socket per rank whose addresses all ranks know, and the
 * agreement runs over those (docs/api.md, "Shrinking after a failure").
 *
 * The agreement: the coordinator is the lowest rank whose socket does not
 * refuse (a dead process's socket refuses; nothing else counts as death:
 * no answer, a failure on this host or a closed connection is tried again
 * until the deadline, so every survivor reaches the same one or fails);
 * each survivor joins it; the coordinator waits for the ranks it cannot
 * prove dead up to `join_s`, then sends its decision (the members and a
 * new TCP star it roots) to every member and ZPP_ERR_EXCLUDED to the live
 * ranks that did not join.  A coordinator that dies before its decision
 * is replaced by the next lowest rank.  The new communicator is created
 * over that star; it is the commit: if a member fails from the decision
 * on, every member fails.
 *
 * Every rank returns within `timeout_s` of its call, except that the
 * creation of the new communicator gets at least 0.5 s even when less is
 * left, and a member that stops in the middle of it makes its exchanges
 * wait for the communicator's timeout.  Results:
 *   ZPP_OK                 *newcomm holds the survivors; new_rank_of
 *                          (NULL, or an array of comm's size) maps each
 *                          rank of comm to its new rank, -1 if left out;
 *   ZPP_ERR_EXCLUDED       this rank had not joined at the decision (it
 *                          called too late, or could not reach the
 *                          coordinator within its join window);
 *   ZPP_ERR_PEER_FAILED    a member failed after the decision (the message
 *                          names it), or the rank this rank joined failed:
 *                          start over from a new unique id, `comm` cannot
 *                          be shrunk twice;
 *   ZPP_ERR_TIMEOUT        the lowest rank not proven dead never decided:
 *                          it is alive and did not call shrink (or its own
 *                          call was refused for bad arguments), or its
 *                          host does not answer; also the members the
 *                          coordinator's DECIDE did not reach when it died
 *                          while sending it (those it reached return
 *                          ZPP_ERR_PEER_FAILED; once they destroyed comm,
 *                          the unreached ones coordinate among themselves
 *                          and may return ZPP_OK: docs/api.md);
 *   ZPP_ERR_SYSTEM         connections to that rank failed on this host
 *                          until the deadline (no descriptor, port, route);
 *   ZPP_ERR_UNSUPPORTED    comm has no listening socket (it could not open
 *                          one at creation: the warning said why; or its
 *                          ranks span hosts that could not reach each
 *                          other's: set ZPP_BOOTSTRAP_ADDR on each host to
 *                          its own address), or comm's backend is MPI
 *                          and UCX, which replaces it, is not usable; comm
 *                          is not aborted;
 *   ZPP_ERR_INVALID_ARGUMENT, _NULL_POINTER  bad arguments (this rank then
 *                          does not take part, and is left out).
 * `comm` is unusable afterwards (aborted); destroy it (zpp_comm_destroy
 * returns promptly: its transfers with the dead rank are dropped).
 *
 * The new communicator: bootstrap "tcp" (the coordinator's star), backend
 * the old one's, except MPI, which becomes UCX (host memory and staged
 * device memory); memory space, algorithm, CUDA device and timeout as
 * `comm`'s; its topology is rediscovered (an emulated map is `comm`'s
 * restricted to the members), so a node that lost a rank becomes an
 * uneven node.
 *
 * Assumes fail-stop processes on hosts that stay up: a rank is proven dead
 * only by its socket refusing.  A host that vanishes (no refusal) is never
 * proven dead: as the lowest rank not proven dead it makes the others time
 * out, as a higher rank it is left out at the join window's end.  A
 * network split that drops packets makes the cut-off ranks fail; one that
 * answers with refusals looks like death, and both sides may then return
 * ZPP_OK with disjoint members. */
typedef struct {
  size_t struct_size; /* sizeof(zpp_shrink_config_t): ZPP_SHRINK_CONFIG_INIT */
  double timeout_s;   /* > 0: bound of the call on each rank; <= 0
                         (default): 3 times comm's timeout T (ZPP_TIMEOUT_S):
                         survivors see a death up to T apart (one times
                         out in a collective, another saw the peer's
                         connection reset), the coordinator then waits its
                         join window, and the creation needs the rest */
  double join_s;      /* > 0: how long the coordinator waits for live ranks
                         that have not joined (< timeout_s); <= 0 (default):
                         half of the bound (1.5 T).  A survivor that calls
                         shrink later than this after the coordinator is
                         left out (ZPP_ERR_EXCLUDED). */
} zpp_shrink_config_t;

#define ZPP_SHRINK_CONFIG_INIT                                                 \
  { sizeof(zpp_shrink_config_t), 0.0, 0.0 }

ZPP_API zpp_status_t zpp_comm_shrink(zpp_comm_t comm,
                                     const zpp_shrink_config_t *cfg,
                                     int *new_rank_of, zpp_comm_t *newcomm);

/* The communicator's asynchronous error, without blocking: *status =
 * ZPP_OK while it works, else the first error that made it unusable
 * (e.g. a started collective that failed on the engine thread, a timeout,
 * ZPP_ERR_ABORTED), or an asynchronous error of the backend (NCCL).  When
 * *status is an error, zpp_get_last_error() gives its message on this
 * thread.  Safe from any thread.  Returns ZPP_OK unless comm or status is
 * NULL. */
ZPP_API zpp_status_t zpp_comm_get_async_error(zpp_comm_t comm,
                                              zpp_status_t *status);

ZPP_API zpp_status_t zpp_comm_rank(zpp_comm_t comm, int *rank);
ZPP_API zpp_status_t zpp_comm_size(zpp_comm_t comm, int *size);
/* Backend actually in use (never ZPP_BACKEND_AUTO) and its memory space. */
ZPP_API zpp_status_t zpp_comm_backend(zpp_comm_t comm, zpp_backend_t *backend);
ZPP_API zpp_status_t zpp_comm_memory(zpp_comm_t comm, zpp_memory_t *memory);
/* Algorithm of multi-node all-gathers and reduce-scatters in use: the
 * resolved setting, ZPP_ALGORITHM_HIER, _FLAT or _AUTO, never _DEFAULT
 * (under _AUTO each call chooses: zpp_comm_choose_algorithm says what;
 * NCCL communicators report the setting, though NCCL routes by itself). */
ZPP_API zpp_status_t zpp_comm_algorithm(zpp_comm_t comm,
                                        zpp_algorithm_t *algorithm);

/* The collectives whose algorithm zpp_comm_choose_algorithm predicts. */
typedef enum {
  ZPP_ALGO_COLL_ALLGATHER = 0,      /* count: elements of each rank's block */
  ZPP_ALGO_COLL_REDUCE_SCATTER = 1, /* count: elements of each rank's shard */
  ZPP_ALGO_COLL_ALLREDUCE = 2       /* count: elements of the whole buffer */
} zpp_algo_coll_t;

/* The algorithm a host backend runs for that collective of `count`
 * elements of `dtype` on the world group: ZPP_ALGORITHM_HIER or _FLAT (the
 * same answer on every rank, the one the call itself takes), and in
 * *chunks (may be NULL) the hierarchical pipeline's chunk count (0 when
 * flat; ZPP_ALGO_COLL_ALLREDUCE: the chunks of its reduce-scatter part).
 * A forced setting answers itself where the hierarchical algorithms apply
 * (several nodes, some with more than one rank).  On an NCCL communicator
 * the answer is what the host algorithms would run; NCCL routes its
 * collectives itself, so it says nothing of what NCCL runs. */
ZPP_API zpp_status_t zpp_comm_choose_algorithm(zpp_comm_t comm,
                                               zpp_algo_coll_t coll,
                                               size_t count, zpp_dtype_t dtype,
                                               zpp_algorithm_t *algorithm,
                                               int *chunks);

/* ---- topology queries -------------------------------------------------- */
ZPP_API zpp_status_t zpp_comm_nnodes(zpp_comm_t comm, int *nnodes);
/* Node index of world rank `rank` (0 <= rank < size). */
ZPP_API zpp_status_t zpp_comm_node_of(zpp_comm_t comm, int rank, int *node);
/* Local rank of world rank `rank` on its node. */
ZPP_API zpp_status_t zpp_comm_local_rank_of(zpp_comm_t comm, int rank,
                                            int *local_rank);
/* Number of ranks on node `node` (0 <= node < nnodes). */
ZPP_API zpp_status_t zpp_comm_node_size(zpp_comm_t comm, int node, int *size);
/* My local rank and the size of my node. */
ZPP_API zpp_status_t zpp_comm_local_rank(zpp_comm_t comm, int *local_rank);
ZPP_API zpp_status_t zpp_comm_local_size(zpp_comm_t comm, int *local_size);
/* 1 when the node map comes from ZPP_TOPO or config.topology. */
ZPP_API zpp_status_t zpp_comm_topo_emulated(zpp_comm_t comm, int *emulated);
/* 1 when every node has the same number of ranks (hpZ and two-level qgZ
 * need it). */
ZPP_API zpp_status_t zpp_comm_topo_uniform(zpp_comm_t comm, int *uniform);
/* Link class between world ranks a and b. */
ZPP_API zpp_status_t zpp_comm_link(zpp_comm_t comm, int a, int b,
                                   zpp_link_t *link);

/* Writes the map: nodes, ranks, local ranks and, for GPU communicators, the
 * GPU link matrix of each node in the style of `nvidia-smi topo -m`.
 * json != 0: one JSON object with at least "emulated", "world_size" and
 * "nodes": [{"ranks": [...]}, ...].  Local operation (no communication). */
ZPP_API zpp_status_t zpp_comm_print_topology(zpp_comm_t comm, FILE *out,
                                             int json);

/* ---- accounting ----------------------------------------------------------
 * Exact counts of payload bytes this rank's transport sent and received,
 * split by link class, and calls per group.  Bytes a rank copies to itself
 * are not counted.  docs/design.md ("Transports") names the algorithm of
 * every operation and the formulas of its counts. */
typedef struct {
  size_t struct_size; /* sizeof(zpp_comm_stats_t): set by the INIT macro */
  uint64_t intra_bytes_sent;
  uint64_t intra_bytes_recv;
  uint64_t inter_bytes_sent;
  uint64_t inter_bytes_recv;
  uint64_t calls[ZPP_NGROUPS]; /* transport operations per zpp_group_t */
  int bytes_derived;  /* 1: some counts are derived from the documented
                         algorithm of a library collective (NCCL), not
                         measured per transfer */
  int topo_emulated;  /* the node map is emulated (ZPP_TOPO) */
  int link_emulated;  /* inter-node links are slowed (ZPP_EMU_INTER_GBIT) */
  double emu_gbit;    /* emulated inter-node Gbit/s per rank (0: none) */
  double emu_lat_us;  /* emulated inter-node latency per transfer, us */
  double emu_wait_s;  /* seconds this rank slept on emulated links */
} zpp_comm_stats_t;

#define ZPP_COMM_STATS_INIT                                                    \
  { sizeof(zpp_comm_stats_t), 0, 0, 0, 0, {0, 0, 0}, 0, 0, 0, 0.0, 0.0, 0.0 }

/* stats->struct_size must be set (ZPP_COMM_STATS_INIT); a smaller, older
 * struct receives its leading fields.  Local operation.  The counts take
 * in every collective started before the call: on device memory over MPI
 * or UCX, where calls return before the engine ran them, get and reset
 * first wait (bounded by the timeout) until those ran their host part. */
ZPP_API zpp_status_t zpp_comm_get_stats(zpp_comm_t comm,
                                        zpp_comm_stats_t *stats);
/* Clears the counters of this rank.  Local operation. */
ZPP_API zpp_status_t zpp_comm_reset_stats(zpp_comm_t comm);

/* Message of the last error raised by an operation on this communicator
 * ("" if none), kept until the next error on it. */
ZPP_API const char *zpp_comm_get_last_error(zpp_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_ZPP_COMM_H */
