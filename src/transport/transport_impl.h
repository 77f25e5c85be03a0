/*
 * What the transport backends and the layers that build them (src/algo,
 * src/comm) share; the engine and the collectives use transport.h
 * only.  One zpp_transport_t per communicator: the
 * generic part (groups, counters, link emulation, errors) lives here and
 * in transport.c, a backend hangs its state on `impl`.
 */
#ifndef ZPP_SRC_TRANSPORT_IMPL_H
#define ZPP_SRC_TRANSPORT_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/core.h"
#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZPP_TRANSPORT_ERRLEN 512

/* ZPP_NET_SEGMENT unset, on real inter-node links: 64 KiB less 128 bytes,
 * under Open MPI's TCP eager limit (btl_tcp_eager_limit, 64 KiB, header
 * included).  A larger message goes by rendezvous, and the receiver's
 * acknowledgement leaves through the same connection's send queue as its
 * own data: in an exchange both ways it waits until the peer's whole
 * transfer has gone, which serializes the two directions
 * (docs/design.md, "MPI transport"). */
#define ZPP_NET_SEGMENT_AUTO 65408

typedef struct {
  int size;     /* members */
  int index;    /* my member index */
  int *members; /* [size] world rank of each member */
  int *ring;    /* [size] member indices in ring order: by node, then local
                   rank, so a ring crosses each node boundary once */
  /* The group's nodes (hierarchical algorithms, src/algo): node k
   * of the group (k = 0..nh-1, in ring order) holds the members
   * ring[hoff[k] .. hoff[k + 1]); member i is on node hnode[i], at
   * position hlocal[i] of that run. */
  int nh;
  int *hoff;          /* [nh + 1] */
  int *hnode, *hlocal; /* [size] */
  uint32_t seq; /* operations started on this group (their tags) */
  int shape[6]; /* the cost model's view of the group (src/algo/tune.c),
                   computed on first use; shape_ok once it is */
  int shape_ok;
} zpp_tgroup_t;

/* The host scratch cache (scratch.c): best fit over ZPP_SCRATCH_SLOTS
 * kept buffers, up to ZPP_SCRATCH_CACHE_MB in all, plus the buffers held
 * while cancelled transfers may touch them. */
#define ZPP_SCRATCH_SLOTS 32
typedef struct {
  pthread_mutex_t mu; /* guards everything below; taken after t->lock */
  void *slot[ZPP_SCRATCH_SLOTS]; /* the allocation (header first) */
  size_t cap[ZPP_SCRATCH_SLOTS];
  size_t total;
  struct zpp_scratch_held *held;
} zpp_scratch_t;

struct zpp_algo; /* src/algo's per-transport caches */


struct zpp_transport {
  const zpp_transport_ops_t *ops;
  void *impl; /* backend state */
  zpp_backend_t backend;
  zpp_memory_t memory; /* memory space the communicator was created for */
  zpp_topo_t *topo;    /* owned */
  int rank, size;
  zpp_tgroup_t grp[ZPP_NGROUPS];
  double timeout_s;
  /* Link emulation (docs/design.md "Transports"): a per-rank NIC clock in
   * CLOCK_MONOTONIC nanoseconds, shared by every process on the machine. */
  double emu_gbit;   /* Gbit/s = bits per ns; 0: bandwidth not limited */
  double emu_lat_us;
  int emu_on;
  int64_t nic_free_ns; /* the time my NIC finishes its queued sends */
  atomic_uint_fast64_t emu_wait_ns;
  int bytes_derived;
  atomic_uint_fast64_t sent[ZPP_NLINKCLASSES];
  atomic_uint_fast64_t recv[ZPP_NLINKCLASSES];
  atomic_uint_fast64_t calls[ZPP_NGROUPS];
  /* Host backends (src/algo). */
  int64_t spin_ns;    /* ZPP_NET_SPIN_US: busy polling after progress */
  int rings;          /* ZPP_NET_RINGS: rings of a ring all-gather */
  uint32_t tag_limit; /* tags the backend can carry: [0, tag_limit) */
  int cuda_device;    /* device of staged device buffers (-1: current) */
  int p2p_barrier;    /* testing: dissemination barrier (see transport.h) */
  zpp_algorithm_t algorithm; /* HIER, FLAT or AUTO (src/algo/tune.c), agreed */
  zpp_link_model_t model; /* AUTO's constants, the same on every rank */
  size_t hier_chunk;  /* ZPP_HIER_CHUNK: bytes per hierarchical chunk (0:
                         one; under AUTO, unset: the model's count) */
  int hier_chunk_set; /* ZPP_HIER_CHUNK was set */
  int qgz_sum_int;    /* ZPP_QGZ_SUM=int, agreed at creation */
  size_t net_seg;     /* ZPP_NET_SEGMENT: the MPI transport's largest message
                         to an inter-node peer (0: whole transfers) */
  atomic_uint_fast64_t progress; /* bumped when a transfer completes */
  zpp_scratch_t scratch;         /* host scratch (scratch.c) */
  struct zpp_algo *algo;         /* owned by src/algo, which sets */
  void (*algo_release)(struct zpp_transport *t); /* with it: frees it, run by
                                    zpp_transport_free after the backend's
                                    destroy */
  pthread_mutex_t lock;     /* guards each start/test/free (never a wait) */
  pthread_mutex_t err_lock; /* guards last_error */
  char last_error[ZPP_TRANSPORT_ERRLEN];
  /* [size] process id of each rank whose process this one can see (same
   * machine and pid namespace), else 0; NULL: not known.  For error
   * messages only: a peer that is gone or stopped is named as such. */
  int *pid;
  /* Set once, by the first failure that leaves the communicator unusable
   * (a timeout, a plan that failed part-way, zpp_comm_abort); every later
   * call fails at once with broken_st.  broken_why and broken_st are
   * written under err_lock before broken is set, and never change after
   * (broken_st may still go from ZPP_OK, "not known yet", to the status
   * the failing call returns). */
  atomic_int broken;
  zpp_status_t broken_st;
  char broken_why[256];
  /* Transfers of cancelled rounds that may still read or write their
   * buffers (round_cancel's count; round_drain's after teardown).  While
   * it is not 0, the transport is broken and the buffers zpp owns that a
   * failed operation used are held, never freed or reused: by the
   * operation's pinned staging (src/algo) and by the scratch cache
   * (scratch.c);
   * zpp_transport_quiesce waits for them at teardown, and whatever is
   * still in doubt then is leaked. */
  atomic_int in_doubt;
};

/* Generic part.  Takes ownership of topo (also on failure). */
zpp_status_t zpp_transport_init(zpp_transport_t *t, zpp_topo_t *topo,
                                int rank, zpp_memory_t memory,
                                double timeout_s);
/* Backend destroy, then the generic part; frees t. */
void zpp_transport_free(zpp_transport_t *t);

/* A receive from world rank `peer` of group g got another size than the
 * `want` bytes it posted ("33 bytes", "more bytes"): ranks passed
 * different sizes.  Breaks the transport with ZPP_ERR_MISMATCH and returns
 * that error, naming both; every backend reports it so. */
zpp_status_t zpp_transport_size_mismatch(zpp_transport_t *t, zpp_group_t g,
                                         int peer, const char *got,
                                         size_t want);

/* Appends "; rank r (pid p) is gone" / "... is stopped" for every other
 * rank whose process this one can see in that state, to buf (len bytes,
 * NUL-terminated); nothing when none is. */
void zpp_transport_describe_peers(const zpp_transport_t *t, char *buf,
                                  size_t len);

/* Link emulation: for a send of `bytes` to world rank `peer`, reserves my
 * NIC and returns the time the receiver may use the data: start =
 * max(now, nic_free), nic_free = start + bytes * 8 / Gbit, deadline =
 * nic_free + latency.  Returns 0 when the link is not emulated (intra-node
 * or emulation off). */
int64_t zpp_transport_emu_deadline(zpp_transport_t *t, int peer,
                                   uint64_t bytes);
/* Sleeps until `deadline_ns` (0: no wait) and counts the time slept. */
void zpp_transport_emu_wait(zpp_transport_t *t, int64_t deadline_ns);

/* Teardown (zpp_comm_destroy): waits, bounded by the timeout (60 s when
 * there is none), until no transfer of a cancelled round may still touch
 * its buffer.  Returns 1 when none may (held buffers can be freed), 0
 * when some still may (they must be leaked).  Not concurrent with any
 * other use of t. */
int zpp_transport_quiesce(zpp_transport_t *t);
/* Counts n (> 0) transfers that a cancel left behind (round_cancel's
 * result) and breaks the transport: nothing new may be posted while they
 * may still complete.  With the mutex held (any thread). */
void zpp_transport_add_in_doubt(zpp_transport_t *t, int n, const char *what);
/* 1 while transfers of cancelled rounds may still touch their buffers. */
static inline int zpp_transport_in_doubt(zpp_transport_t *t) {
  return t != NULL && atomic_load(&t->in_doubt) > 0;
}

/* Round backends call this whenever a transfer completed. */
static inline void zpp_transport_progressed(zpp_transport_t *t) {
  atomic_fetch_add_explicit(&t->progress, 1, memory_order_relaxed);
}

/* Scratch: set up by zpp_transport_init; freed by zpp_transport_free
 * after the quiesce (quiet = 0: held buffers are leaked). */
void zpp_scratch_init(zpp_scratch_t *s);
void zpp_scratch_release(zpp_transport_t *t, int quiet);

/* Backend constructors: fill t->ops, t->impl, t->backend (host backends
 * also t->tag_limit). */
#if ZPP_HAVE_MPI
#include <mpi.h>
/* `comm` is zpp's duplicate (not freed by the backend); every group's
 * messages go over it.  mpi_rank[w]: the MPI rank in comm of world rank w
 * (NULL: w itself; a subset's comm holds its parent's ranks). */
zpp_status_t zpp_transport_mpi_create(zpp_transport_t *t, MPI_Comm comm,
                                      const int *mpi_rank, int cuda_device);
/* MPI error text of `rc` as a zpp error. */
zpp_status_t zpp_mpi_error(int rc, const char *func, const char *what);
#endif
/* NCCL: libnccl.so.2 is opened with dlopen; ZPP_ERR_UNSUPPORTED when it, a
 * CUDA device or the build support is missing.  bs: the communicator's
 * bootstrap (rank 0's unique id is broadcast over it). */
zpp_status_t zpp_transport_nccl_create(zpp_transport_t *t,
                                       const zpp_bootstrap_t *bs,
                                       int cuda_device);
/* 1 when libnccl.so.2 can be opened and zpp was built with NCCL support. */
int zpp_transport_nccl_available(char *why, size_t len);
/* UCX: libucp.so.0 is opened with dlopen; worker addresses are exchanged
 * over bs (one allgather, taken part in even by a rank that failed, so
 * failures are agreed).  ZPP_ERR_UNSUPPORTED when UCX cannot be loaded. */
zpp_status_t zpp_transport_ucx_create(zpp_transport_t *t,
                                      const zpp_bootstrap_t *bs,
                                      int cuda_device);
/* 1 when libucp.so.0 can be opened with every symbol zpp uses. */
int zpp_transport_ucx_available(char *why, size_t len);
/* 1 when zpp was built with the UCX headers (the backend is compiled in). */
int zpp_transport_ucx_built(void);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_TRANSPORT_IMPL_H */
