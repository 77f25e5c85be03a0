/*
 * What the three parts of the NCCL stand-in share (nccl_emu.c: the API and
 * communicator life cycle; nccl_emu_net.c: sockets, the mesh and the
 * inboxes; nccl_emu_ops.c: operations, groups and reductions).  The first
 * comment of nccl_emu.c says what the stand-in models and what it does not.
 */
#ifndef ZPP_TESTS_NCCL_EMU_INTERNAL_H
#define ZPP_TESTS_NCCL_EMU_INTERNAL_H

#include <nccl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define EMU_API __attribute__((visibility("default")))

#define EMU_HOST_LEN 64
#define EMU_BUSID_LEN 32
#define EMU_ERR_LEN 512

/* Message kinds on a connection; each kind has its own tag space. */
enum {
  EMU_MSG_COLL = 1,  /* a collective's block; tag = collective number */
  EMU_MSG_P2P = 2,   /* ncclSend payload; tag = send number to that peer */
  EMU_MSG_CTS = 3,   /* ncclRecv posted ("clear to send"); tag as P2P */
  EMU_MSG_SPLIT = 4, /* ncclCommSplit colour and key; tag = split number */
  EMU_MSG_BYE = 5    /* the peer destroyed its communicator */
};

typedef struct emu_msg {
  struct emu_msg *next;
  uint32_t kind;
  uint64_t tag;
  size_t len;
  unsigned char *data; /* host memory, malloc'd */
} emu_msg_t;

/* What each rank tells every other when the mesh is built. */
typedef struct {
  uint32_t magic;
  int32_t nranks, rank, dev;
  uint64_t token[2];
  char host[EMU_HOST_LEN];
  char busid[EMU_BUSID_LEN];
} emu_hello_t;

/* Peer state: 0 connected, 1 said goodbye, 2 connection lost. */
typedef struct {
  int fd; /* -1: myself, or not connected */
  pthread_mutex_t send_lock;
  emu_msg_t *head, *tail; /* inbox, guarded by the comm's lock */
  int gone;
  uint64_t send_seq, recv_seq; /* p2p calls issued to / from this peer */
} emu_peer_t;

/* What the calls of a communicator share: its own resources, or with
 * config.splitShare its parent's.  NCCL's "Thread Safety" forbids calls on
 * one communicator, or on communicators sharing resources, from two
 * threads at once: owner is the thread inside such a call (or holding
 * grouped operations on one of them until its ncclGroupEnd). */
typedef struct emu_res {
  pthread_mutex_t lock;
  int refs;  /* communicators using it */
  int depth; /* calls and grouped operations `owner` has open on it */
  pthread_t owner;
  char call[32]; /* the owner's first open call, for the message */
} emu_res_t;

typedef struct emu_comm {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* inbox, state and pending changes */
  int refs;            /* the handle, background threads, queued operations */
  struct ncclComm *handle;
  int rank, nranks, dev;
  char busid[EMU_BUSID_LEN];
  char host[EMU_HOST_LEN];
  uint64_t token[2];
  int blocking;
  int split_share; /* config.splitShare: its splits share its resources;
                      inherited by a split without config */
  int shares;      /* uses its parent's resources (the parent's splitShare) */
  emu_res_t *res;
  /* Life cycle.  init: ncclInProgress until the mesh is built, then the
   * result.  busy: splits of this comm whose exchange is under way. */
  ncclResult_t init;
  int64_t ready_after_ns; /* the earliest time init may report success */
  int busy;
  ncclResult_t async; /* first asynchronous error, sticky */
  char err[EMU_ERR_LEN];
  int aborted, finalizing, destroyed;
  int pending; /* operations enqueued and not finished */
  int issuing; /* operations of a call that returned ncclInProgress, not yet
                  enqueued on their stream */
  int bg;      /* background threads (init, split) still running */
  uint64_t coll_seq, split_seq;
  emu_peer_t *peers; /* [nranks] */
  /* The receiver thread drains every connection into the inboxes, so a
   * sender never waits for the receiving rank's stream. */
  pthread_t rx;
  int rx_started;
  int wake[2]; /* pipe: wakes the receiver to stop */
} emu_comm_t;

struct ncclComm {
  uint64_t magic;
  emu_comm_t *impl; /* NULL once destroyed or aborted */
};

/* ---- nccl_emu.c --------------------------------------------------------- */
double emu_timeout_s(void);
int64_t emu_now_ns(void);
int64_t emu_deadline(void);
/* Records a synchronous error for ncclGetLastError and returns r. */
ncclResult_t emu_fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Records the first asynchronous error of c (caller holds c->lock). */
void emu_set_async_locked(emu_comm_t *c, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void emu_set_async(emu_comm_t *c, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Looks a handle up in the registry and takes a reference: NULL (with the
 * error recorded in *r) for NULL, unknown or destroyed communicators. */
emu_comm_t *emu_get(ncclComm_t h, const char *func, ncclResult_t *r);
/* Same, and the communicator must be ready for a new call. */
emu_comm_t *emu_get_ready(ncclComm_t h, const char *func, ncclResult_t *r);
void emu_ref(emu_comm_t *c);
void emu_unref(emu_comm_t *c);
/* The comm's readiness as ncclCommGetAsyncError reports it (lock held). */
ncclResult_t emu_state_locked(emu_comm_t *c);
/* A thread's call on c begins (fails with ncclInvalidUsage while another
 * thread is inside a call on c or on a communicator sharing c's
 * resources), and ends.  A call that begins waits a random 0..2 x
 * ZPP_NCCL_EMU_CALL_US (default 20) before it goes on, so that two
 * threads that call at about the same time overlap. */
ncclResult_t emu_enter(emu_comm_t *c, const char *func);
void emu_leave(emu_comm_t *c);
/* Uniform in [0, 2^64), from ZPP_NCCL_EMU_SEED (printed at first use). */
uint64_t emu_rand(void);
double emu_setting(const char *name, double def);

/* ---- nccl_emu_net.c ---------------------------------------------------- */
/* Connects rank c->rank with every other rank of c (names from c->token),
 * exchanges hellos (all[] gets every rank's, mine included), starts the
 * receiver thread.  Bounded by the timeout; fails early when c is aborted. */
ncclResult_t emu_mesh_connect(emu_comm_t *c, const emu_hello_t *mine,
                              emu_hello_t *all);
/* Sends one message to `peer` (to myself: straight into my inbox). */
ncclResult_t emu_send(emu_comm_t *c, int peer, uint32_t kind, uint64_t tag,
                      const void *data, size_t len);
/* Takes the message (kind, tag) from peer's inbox, waiting until deadline.
 * Fails at once when c is aborted or has an asynchronous error. */
ncclResult_t emu_take(emu_comm_t *c, int peer, uint32_t kind, uint64_t tag,
                      int64_t deadline, emu_msg_t **out);
void emu_msg_free(emu_msg_t *m);
/* Says goodbye to every peer (after the last operation of a destroy). */
void emu_mesh_bye(emu_comm_t *c);
/* Wakes every wait and breaks every connection (abort). */
void emu_mesh_shutdown(emu_comm_t *c);
/* Stops the receiver, closes the connections, frees the inboxes. */
void emu_mesh_close(emu_comm_t *c);

/* ---- nccl_emu_ops.c ---------------------------------------------------- */
size_t emu_dtype_size(ncclDataType_t dt); /* 0: not a type the stand-in knows */
/* For ncclCommAbort (c->aborted set): drops c's calls that returned
 * ncclInProgress and were not issued, and waits (bounded by the timeout)
 * while the issuer thread is enqueueing one of them. */
void emu_forget_later(emu_comm_t *c);

#endif /* ZPP_TESTS_NCCL_EMU_INTERNAL_H */
