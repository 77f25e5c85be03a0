/*
 * The collectives layer (src/coll): the shared argument checks of every
 * collective (check.c) and the helpers the plans of baseline.c, qwz.c,
 * hpz.c, qgZ's files (qgz*.c) and qwd.c share.  Each collective builds a plan
 * (src/engine/plan.h) of kernel steps (src/engine/exec.h) and transport
 * operations, never calling MPI, NCCL or CUDA directly.  Not installed.
 */
#ifndef ZPP_SRC_COLL_COLL_H
#define ZPP_SRC_COLL_COLL_H

#include <stdint.h>
#include <string.h>
#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#include "engine/exec.h"

#ifdef __cplusplus
extern "C" {
#endif


/* The words of a quantizer config compared across ranks under ZPP_CHECK. */
static inline void zpp_coll_quant_words(const zpp_quant_config_t *q,
                                        uint64_t w[3]) {
  w[0] = (uint64_t)q->bits;
  w[1] = (uint64_t)q->block_size;
  w[2] = (uint64_t)q->mode;
}

/* ---- the prologue: one argument check for every collective --------------
 * A collective fills one zpp_coll_args_t (as NCCL's collectives fill one
 * descriptor) and calls zpp_coll_prologue, which runs, in this order, and
 * stops at the first failure:
 *   1. the communicator: not NULL, not broken (zpp_exec_init);
 *   2. pre(a, ex), the collective's own first checks (its config);
 *   3. the quantizer config `quant`, reported as `quant_name` with fields
 *      `quant_fp`-prefixed ("quant", "quant->"), when quant_name is set;
 *   4. the dtype: a float dtype, or any dtype with dtype_bytes (the plain
 *      all-gather moves bytes);
 *   5. the reduction op, with check_op;
 *   6. the buffers of `layout`: counts that fit size_t, non-NULL where data
 *      moves, overlapping only in the layout's in-place form, device memory
 *      on device communicators (ZPP_BUFS_NAMED: the same without the
 *      overlap, under send_name and recv_name; ZPP_BUFS_NONE: none);
 *   7. post(a, ex), the collective's own last checks;
 * then, with ZPP_CHECK=1, every rank's count, dtype, op_word and
 * words[0..nwords) and the local outcome are compared (zpp_coll_check_args),
 * so all ranks fail together.  Any error is recorded on the communicator.
 * On success ex is ready for the plan. */
typedef enum {
  ZPP_BUFS_GATHER = 0, /* send count, recv size * count elements; in place:
                          send == recv + rank * count */
  ZPP_BUFS_SCATTER = 1, /* send size * count, recv count elements; in place:
                           recv == send + rank * count */
  ZPP_BUFS_NAMED = 2,   /* count, NULL and device checks only */
  ZPP_BUFS_NONE = 3     /* the collective checks its buffers itself */
} zpp_bufs_layout_t;

typedef struct zpp_coll_args {
  const char *func; /* the public function, for messages */
  zpp_comm_t comm;
  void *stream;
  size_t count;
  zpp_dtype_t dtype;
  int dtype_bytes; /* 1: ZPP_UINT8 too */
  zpp_redop_t op;
  int check_op;    /* 1: op is the call's reduction, checked */
  int op_word;     /* compared under ZPP_CHECK as "op": the op, -1 when the
                      collective has none, or the collective's own tag */
  zpp_bufs_layout_t layout;
  const void *send, *recv;
  const char *send_name, *recv_name; /* ZPP_BUFS_NAMED */
  const zpp_quant_config_t *quant;
  const char *quant_name, *quant_fp;
  zpp_status_t (*pre)(struct zpp_coll_args *a, const zpp_exec_t *ex);
  zpp_status_t (*post)(struct zpp_coll_args *a, const zpp_exec_t *ex);
  void *ctx; /* for pre and post */
  uint64_t words[5]; /* config words compared under ZPP_CHECK (pre and post
                        may fill them) */
  int nwords;
} zpp_coll_args_t;

zpp_status_t zpp_coll_prologue(zpp_coll_args_t *a, zpp_exec_t *ex);

/* The arguments every collective has, the rest zero: no op (op_word -1),
 * layout ZPP_BUFS_GATHER, no quantizer config, no hooks. */
static inline zpp_coll_args_t
zpp_coll_args_init(const char *func, zpp_comm_t comm, zpp_stream_t stream,
                   const void *send, const void *recv, size_t count,
                   zpp_dtype_t dtype) {
  zpp_coll_args_t a;
  memset(&a, 0, sizeof a);
  a.func = func;
  a.comm = comm;
  a.stream = stream;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dtype;
  a.op_word = -1;
  return a;
}

/* With ZPP_CHECK=1: all ranks compare (count, dtype, op, config words) and
 * the result of their local argument checks (`local`) with one small
 * all-gather, and fail together: a rank whose own checks failed returns
 * its error, every other rank ZPP_ERR_MISMATCH naming it; differing
 * arguments give ZPP_ERR_MISMATCH naming the field and the first differing
 * rank.  So one rank's bad call never leaves the others hanging.  Without
 * ZPP_CHECK it returns `local`. */
zpp_status_t zpp_coll_check_args(const char *func, const zpp_exec_t *ex,
                                 size_t count, int dtype, int op,
                                 const uint64_t *words, int nwords,
                                 zpp_status_t local);

/* Argument checks shared by the collectives; the message names `func`. */
zpp_status_t zpp_coll_check_dtype(const char *func, zpp_dtype_t dtype);
/* The plain all-gather moves bytes: it takes ZPP_UINT8 as well. */
zpp_status_t zpp_coll_check_dtype_bytes(const char *func, zpp_dtype_t dtype);
zpp_status_t zpp_coll_check_op(const char *func, zpp_redop_t op);
/* size * count * dtype bytes must fit size_t. */
zpp_status_t zpp_coll_check_count(const char *func, const zpp_exec_t *ex,
                                  size_t count, zpp_dtype_t dtype);
/* On a device-memory communicator, p (if not NULL) must be device memory:
 * one pointer query per buffer and call (the kernels skip theirs). */
zpp_status_t zpp_coll_check_device_buf(const char *func, const zpp_exec_t *ex,
                                       const char *what, const void *p);
/* ZPP_ERR_INVALID_ARGUMENT when buffer b (b_bytes) shares a byte with
 * buffer a (a_bytes), naming both, their sizes and where b starts
 * relative to a; else ZPP_OK.  in_place: b is this rank's slot of a (the
 * per-rank buffer of an all-gather or reduce-scatter, a the whole one),
 * and b == a + rank * b_bytes, the collective's in-place form, is
 * accepted.  A local check of this rank's own pointers (docs/collectives.md,
 * "Buffers"), made before any transfer. */
zpp_status_t zpp_coll_check_overlap(const char *func, const zpp_exec_t *ex,
                                    const char *a_name, const void *a,
                                    size_t a_bytes, const char *b_name,
                                    const void *b, size_t b_bytes,
                                    int in_place);
/* The overlap part of zpp_coll_check_bufs: send and recv (count elements
 * per rank of dtype, the sizes of `layout`) share bytes only in the
 * layout's in-place form.  size * count * dtype bytes must fit size_t. */
zpp_status_t zpp_coll_check_layout_overlap(const char *func,
                                           const zpp_exec_t *ex,
                                           zpp_bufs_layout_t layout,
                                           const void *send, const void *recv,
                                           size_t count, zpp_dtype_t dtype);
/* zpp_coll_check_count; buffers non-NULL when count > 0; overlapping only
 * in the in-place form of `layout` (zpp_coll_check_overlap); and on device
 * communicators classified as device memory once.  Messages name them
 * "sendbuf" and "recvbuf". */
zpp_status_t zpp_coll_check_bufs(const char *func, const zpp_exec_t *ex,
                                 zpp_bufs_layout_t layout, const void *send,
                                 const void *recv, size_t count,
                                 zpp_dtype_t dtype);
/* The count, NULL and device checks of zpp_coll_check_bufs (not the
 * overlap: its sizes differ by collective) with the names the public
 * declaration gives the two buffers (qWD: "target" and "recon"). */
zpp_status_t zpp_coll_check_bufs_named(const char *func, const zpp_exec_t *ex,
                                       const char *send_name, const void *send,
                                       const char *recv_name, const void *recv,
                                       size_t count, zpp_dtype_t dtype);
/* q non-NULL and valid (zpp_quant_config_check), reported under `func`
 * with the caller's names: ("quant", "quant->") gives "zpp_qwz_allgather:
 * quant->bits 3: must be 8 or 4". */
zpp_status_t zpp_coll_check_quant(const char *func, const char *name,
                                  const char *fp,
                                  const zpp_quant_config_t *q);

/* Elements per chunk of a chunked (pipelined) plan: a whole number of
 * blocks, about count / parts and at least ZPP_PIPE_MIN_CHUNK (below that,
 * per-message latency costs more than the overlap hides), so chunk
 * boundaries are block boundaries and the chunked result is bitwise the
 * unchunked one; the last chunk is what is left.  Returns count when the
 * collective should not be chunked: ZPP_PIPE_MIN_CHUNK 0, block 0, one
 * chunk holding it all, or a chunk that would overflow size_t.  parts is
 * the collective's (QWZ_PARTS, QGZ_PARTS); 0 counts as 1. */
size_t zpp_plan_chunk(size_t count, size_t block, size_t parts);

/* ---- hpZ's secondary copy as a source of recovery ----------------------
 * zpp_pgroup_recover rebuilds a dead rank's primary shard from the copy a
 * survivor keeps (docs/runtime.md, "Recovery").  *held says what this
 * rank's secondary copy holds of world rank owner's shard: NONE (owner is
 * not in my CROSS group, uneven nodes keep no copy, or no forward gather
 * completed yet), STALE (the parameters changed since the copy was made)
 * or CURRENT.  When held and out is not NULL, the shard is decoded (a
 * quantized copy) or copied into out: count elements of the dtype, host
 * memory only, a stale copy included.  Local: no communication, so it
 * works on an aborted communicator. */
enum {
  ZPP_HPZ_COPY_NONE = 0,
  ZPP_HPZ_COPY_STALE = 1,
  ZPP_HPZ_COPY_CURRENT = 2
};
zpp_status_t zpp_hpz_copy_of(zpp_hpz_t hpz, int owner, void *out, int *held);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COLL_COLL_H */
