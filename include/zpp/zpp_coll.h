/*
 * The ZeRO++ collectives and their full-precision baselines.
 *
 *   zpp_allgather / zpp_reduce_scatter    baselines (no compression)
 *   zpp_qwz_allgather                     qwZ: quantized weight all-gather
 *   zpp_hpz_*                             hpZ: secondary partition per node
 *   zpp_qgz_reduce_scatter                qgZ: hierarchical quantized
 *                                         reduce-scatter of gradients
 *
 * Every collective is written once against the transfer descriptor and the
 * quantizer (docs/design.md, "Collectives"), so the same code serves host
 * memory over MPI and device memory over NCCL.  Buffers live in the
 * communicator's memory space (zpp_comm_config_t.memory); device buffers
 * on the communicator's device, or managed memory (another device's
 * memory is ZPP_ERR_INVALID_ARGUMENT, naming the buffer).
 *
 * Counts are elements per rank (like NCCL): all-gather inputs hold `count`
 * elements and outputs `size * count`; reduce-scatter inputs hold
 * `size * count` and outputs `count`, rank r receiving slice r.  Any count
 * works, 0, 1, 7 or a large prime: the quantized collectives encode every
 * rank's slice on its own (docs/format.md), so nothing is padded and no
 * multiple of 8 or of the world size is needed.
 *
 * Asynchrony: pass `req` to start a collective and wait on it later (req
 * NULL: the blocking form).  Each collective is a plan of steps run by the
 * communicator's engine (docs/design.md, "Execution"), never by a thread
 * of its own.  Every wait is bounded by the communicator's timeout
 * (ZPP_TIMEOUT_S).  All ranks must start the same collectives in the same
 * order.
 *
 * Host memory: started collectives run on the communicator's engine
 * thread in the order they were started (MPI must then be initialised
 * with MPI_THREAD_MULTIPLE: zpp_comm_create_mpi checks it and runs
 * requests to completion when started otherwise); the blocking form
 * returns when the collective completed.  Until the wait returns, the
 * caller must not touch the buffers of a started collective.
 *
 * Device memory: collectives are stream-ordered, as NCCL's are.  The
 * collective comes after the work queued on `stream` before the call, and
 * the blocking form returns once it is queued, without waiting for the
 * device or for peers: work queued later on `stream` comes after it.  On
 * NCCL the steps go to `stream` itself; on MPI or UCX (staging through
 * pinned memory) the engine thread runs them on a stream of its own, and
 * `stream` waits for the engine (cuStreamWaitValue32 on a counter in
 * pinned memory) rather than the caller.  Keep the buffers alive and
 * untouched until the stream reached that point.  Errors that show after
 * the call returned (a peer that never came, a failed transfer) break the
 * communicator: its next call returns them, and a collective whose work
 * did not finish within the timeout is aborted so that `stream` drains
 * (its output is then undefined).  zpp_request_wait_stream makes another
 * stream wait for a started collective; zpp_request_wait and
 * zpp_request_test wait for it on the host: done means the device ran it
 * (an event recorded after its last step completed), not counting work
 * queued later on its stream.  The work runs on the communicator's device
 * whatever the calling thread's current device, which is put back when it
 * has a CUDA context already (a thread that never chose a device gets no
 * context on device 0).  Collectives cannot be captured into a CUDA graph:
 * a call on a capturing stream returns ZPP_ERR_UNSUPPORTED before anything
 * is queued.  Built without CUDA stream memory operations in the driver,
 * or with MPI below MPI_THREAD_MULTIPLE, staged collectives wait on the
 * host instead (said once in the log).
 *
 * Buffers and overlap: the buffers of a call share no byte, except in the
 * in-place form its declaration names (all-gathers: sendbuf == recvbuf +
 * rank * count elements; reduce-scatters: recvbuf == sendbuf + rank *
 * count; qWD: none).  Any other overlap is ZPP_ERR_INVALID_ARGUMENT,
 * before anything is sent, with a message naming both buffers, their
 * sizes in bytes and where one starts in the other.  Buffers that only
 * touch (one ends where the other starts) do not overlap.  The check is
 * local: it sees this rank's pointers, so a call may be refused on one
 * rank and accepted on the others, and a refused call is a bug of the
 * program on the rank that got it.  Like any argument error of one rank
 * (a NULL buffer), it leaves the other ranks in a collective this rank
 * did not start: they wait until the timeout, or meet this rank's next
 * collective.  With ZPP_CHECK=1 the ranks compare the outcome of their
 * checks before any data moves, and fail together: this rank with
 * ZPP_ERR_INVALID_ARGUMENT, every other one with ZPP_ERR_MISMATCH naming
 * it (docs/collectives.md, "Buffers").
 *
 * Alignment: a buffer may start at any byte, in host and in device
 * memory; an fp16 or bf16 buffer at an odd address (or an fp32 one at a
 * 2-byte boundary) works, with the bitwise result of the same data at an
 * aligned address.  On a GPU the kernels move 16 bytes per access where a
 * buffer allows it and fall back to narrower accesses, down to single
 * bytes, where it does not: buffers that start at a 16-byte boundary
 * (cudaMalloc's start at 256) are the fast case.
 */
#ifndef ZPP_ZPP_COLL_H
#define ZPP_ZPP_COLL_H

#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ZPP_OP_SUM = 0, /* sum over all ranks */
  ZPP_OP_MEAN = 1 /* the true mean: sum / world size, whatever the layout */
} zpp_redop_t;

typedef struct zpp_request *zpp_request_t;

/* Waits on the host for a started collective (device memory: until the
 * device ran it), frees the request and returns the collective's status.
 * A NULL request is ZPP_OK. */
ZPP_API zpp_status_t zpp_request_wait(zpp_request_t req);
/* Device memory: makes `stream` (a cudaStream_t; NULL: the legacy
 * stream) wait for the started collective without the host waiting, and
 * frees the request.  Returns the errors known now (an argument error, a
 * communicator broken earlier); later ones break the communicator and its
 * next call returns them.  Host memory: as zpp_request_wait.  A NULL
 * request is ZPP_OK. */
ZPP_API zpp_status_t zpp_request_wait_stream(zpp_request_t req,
                                             zpp_stream_t stream);
/* As zpp_request_wait_stream, but the request stays the caller's: it may
 * be ordered onto several streams, polled with zpp_request_test (done once
 * the device ran the collective) and must still be freed with
 * zpp_request_wait or zpp_request_wait_stream.  Host memory: waits on the
 * host for the collective, without freeing.  A NULL request is
 * ZPP_ERR_NULL_POINTER. */
ZPP_API zpp_status_t zpp_request_order_stream(zpp_request_t req,
                                              zpp_stream_t stream);
/* *done = 1 when the request completed (then call zpp_request_wait to get
 * its status and free it). */
ZPP_API zpp_status_t zpp_request_test(zpp_request_t req, int *done);

/* ---- baselines ----------------------------------------------------------- */

/* recvbuf[r * count ..] = rank r's sendbuf (count elements of dtype).
 * In place when sendbuf == recvbuf + rank * count; any other overlap of
 * sendbuf and recvbuf is ZPP_ERR_INVALID_ARGUMENT. */
ZPP_API zpp_status_t zpp_allgather(zpp_comm_t comm, const void *sendbuf,
                                   void *recvbuf, size_t count,
                                   zpp_dtype_t dtype, zpp_stream_t stream,
                                   zpp_request_t *req);

/* recvbuf (count elements) = slice `rank` of the sum (or mean) of every
 * rank's sendbuf (size * count elements), accumulated in fp32 and rounded
 * once to dtype; MEAN divides the fp32 sum by the world size before that
 * one rounding.  Order of the additions, fixed (bitwise reproducible) on
 * the host backends (MPI, UCX): rank order with the flat algorithm; with
 * the hierarchical one (the default over several nodes, zpp_algorithm_t)
 * each node's ranks in order, that partial sum rounded to bf16 for bf16
 * (fp16 and fp32: kept in fp32), then the nodes in order
 * (docs/collectives.md, Baselines).  NCCL: its ring order (it then
 * carries fp32: 4 bytes per element, also for fp16/bf16 input).
 * In place when recvbuf == sendbuf + rank * count (NCCL's in-place form;
 * every algorithm and backend reads this rank's slice of sendbuf before
 * it writes recvbuf), the same bits as out of place; any other overlap is
 * ZPP_ERR_INVALID_ARGUMENT. */
ZPP_API zpp_status_t zpp_reduce_scatter(zpp_comm_t comm, const void *sendbuf,
                                        void *recvbuf, size_t count,
                                        zpp_dtype_t dtype, zpp_redop_t op,
                                        zpp_stream_t stream,
                                        zpp_request_t *req);

/* ---- qwZ ---------------------------------------------------------------- */

/* Each rank encodes its shard with `quant` (scales and payload in one
 * buffer), one all-gather moves every encoded shard, every rank decodes
 * them into recvbuf in dtype.  All ranks end with bitwise identical
 * output, within the per-element bound of docs/format.md of the input.
 * In place when sendbuf == recvbuf + rank * count (each chunk of the shard
 * is encoded before its decoded value is written over it), the same bits
 * as out of place; any other overlap is ZPP_ERR_INVALID_ARGUMENT. */
ZPP_API zpp_status_t zpp_qwz_allgather(zpp_comm_t comm,
                                       const zpp_quant_config_t *quant,
                                       const void *sendbuf, void *recvbuf,
                                       size_t count, zpp_dtype_t dtype,
                                       zpp_stream_t stream,
                                       zpp_request_t *req);

/* ---- qWD ---------------------------------------------------------------- */

/* Quantized weight differences (SDP4Bit's qWD), for runtimes that keep the
 * full parameters between steps (ZeRO-1/2).  recon (size * count elements
 * of dtype) is the reconstruction of the full tensor, identical on all
 * ranks before the call (e.g. the initial weights, or zeros).  Each rank
 * encodes d = target - fp32(recon[rank * count ..]) with `quant` (target:
 * its count fp32 master values), one all-gather moves the encoded
 * differences, and every rank adds every decoded difference to its recon
 * (fp32 add, rounded once to dtype).  All ranks end bitwise identical;
 * the error of recon against the targets is one quantization of one
 * difference plus the dtype rounding, whatever the number of steps
 * (docs/collectives.md, "qWD").  Stochastic rounding draws at the
 * element's index in the full tensor.  target (count floats) and recon
 * must not share a byte (ZPP_ERR_INVALID_ARGUMENT): there is no in-place
 * form, since the difference is taken against recon's slice as it was
 * before the call (a target kept in that slice would send zero). */
ZPP_API zpp_status_t zpp_qwd_allgather(zpp_comm_t comm,
                                       const zpp_quant_config_t *quant,
                                       const float *target, void *recon,
                                       size_t count, zpp_dtype_t dtype,
                                       zpp_stream_t stream,
                                       zpp_request_t *req);

/* ---- hpZ ---------------------------------------------------------------- */

typedef struct zpp_hpz *zpp_hpz_t;

typedef struct {
  size_t struct_size;       /* sizeof(zpp_hpz_config_t): INIT macro */
  int quantized;            /* 1 (default): gathers use qwZ with `quant`;
                               0: full precision */
  zpp_quant_config_t quant; /* default INT8, block 256, symmetric */
} zpp_hpz_config_t;

#define ZPP_HPZ_CONFIG_INIT \
  { sizeof(zpp_hpz_config_t), 1, ZPP_QUANT_CONFIG_INIT }

typedef struct {
  size_t struct_size;      /* sizeof(zpp_hpz_info_t): INIT macro */
  int hierarchical;        /* 1: backward gathers stay inside the node; 0:
                              uneven nodes, backward gathers fall back to a
                              world gather (docs/design.md) */
  uint64_t generation;     /* bumped by zpp_hpz_invalidate */
  uint64_t secondary_generation; /* generation of the secondary copy; 0:
                                    none yet */
  size_t secondary_bytes;  /* extra memory held for the secondary copy */
} zpp_hpz_info_t;

#define ZPP_HPZ_INFO_INIT { sizeof(zpp_hpz_info_t), 0, 0, 0, 0 }

/* A tensor (or flat parameter group) of `count` elements per rank. */
ZPP_API zpp_status_t zpp_hpz_create(zpp_comm_t comm,
                                    const zpp_hpz_config_t *cfg, size_t count,
                                    zpp_dtype_t dtype, zpp_hpz_t *hpz);
/* Frees the handle and its secondary copy once the gathers started on it
 * are done.  Call it before zpp_comm_destroy of its communicator: the
 * handle uses the communicator to free its copy. */
ZPP_API zpp_status_t zpp_hpz_destroy(zpp_hpz_t hpz);

/* Forward gather: like zpp_qwz_allgather (or zpp_allgather when not
 * quantized) of sendbuf (this rank's primary shard) into recvbuf (size *
 * count), and it keeps this rank's secondary shard: the encoded shards of
 * the ranks with my local rank on every node, cut from the gathered data
 * with no extra communication.  In place when sendbuf == recvbuf + rank *
 * count; any other overlap is ZPP_ERR_INVALID_ARGUMENT. */
ZPP_API zpp_status_t zpp_hpz_forward_gather(zpp_hpz_t hpz,
                                            const void *sendbuf,
                                            void *recvbuf,
                                            zpp_stream_t stream,
                                            zpp_request_t *req);

/* Backward gather: rebuilds recvbuf from the secondary shards with an
 * all-gather inside the node only (zero inter-node bytes); the output is
 * bitwise equal to the forward gather's.  When the parameters changed
 * since the secondary copy was made (zpp_hpz_invalidate), it never uses
 * the stale copy: with sendbuf (the current primary shard) it refreshes
 * by running a forward gather; with sendbuf NULL it returns
 * ZPP_ERR_STALE.  Before any forward gather it behaves the same way.
 * sendbuf, when not NULL, follows the forward gather's rule (in place when
 * sendbuf == recvbuf + rank * count, no other overlap), checked whether or
 * not this call reads it. */
ZPP_API zpp_status_t zpp_hpz_backward_gather(zpp_hpz_t hpz,
                                             const void *sendbuf,
                                             void *recvbuf,
                                             zpp_stream_t stream,
                                             zpp_request_t *req);

/* The parameters changed (optimizer step, checkpoint load): the secondary
 * copy is stale from now on.  Local, no communication; call it on every
 * rank. */
ZPP_API zpp_status_t zpp_hpz_invalidate(zpp_hpz_t hpz);

ZPP_API zpp_status_t zpp_hpz_get_info(zpp_hpz_t hpz, zpp_hpz_info_t *info);

/* ---- qgZ ---------------------------------------------------------------- */

/* intra_bits for an intra-node stage without quantization: each slice
 * travels inside the node in sendbuf's dtype (16 bits for the bf16 and fp16
 * gradients it is meant for) and is summed in fp32; only the network
 * crossing is quantized (inter_bits).  Where quantizing costs more than the
 * intra-node link saves (host memory, shared-memory peers), and one
 * quantization error instead of two. */
#define ZPP_QGZ_INTRA_RAW 16

/* The Hadamard group size the literature uses (SDP4Bit: 32). */
#define ZPP_QGZ_HADAMARD_DEFAULT 32

typedef struct {
  size_t struct_size;     /* sizeof(zpp_qgz_config_t): INIT macro */
  int intra_bits;         /* codes inside the node: 4 (default) or 8, or
                             ZPP_QGZ_INTRA_RAW (16): no codes inside the
                             node, the slices travel in sendbuf's dtype
                             (docs/collectives.md, "Raw intra-node
                             stage") */
  int inter_bits;         /* codes across nodes: 4 (default) or 8 */
  size_t block_size;      /* elements per scale, default 256 */
  zpp_quant_mode_t mode;  /* default symmetric */
  /* Fields below were added in revision 2 of this struct (revision 1: the
   * fields up to `mode`); a struct_size of revision 1 is accepted and they
   * take their defaults.  The struct's revisions are its own, not library
   * versions. */
  size_t hadamard;        /* 0 (default): off; else every rank's slice is
                             rotated in groups of this many elements (a
                             power of two >= 2 that divides block_size;
                             ZPP_QGZ_HADAMARD_DEFAULT is 32) before the
                             first encode, both stages reduce in the
                             rotated domain and the inverse is applied
                             after the last accumulation; the last
                             count % hadamard elements of a slice are not
                             rotated (docs/collectives.md) */
  zpp_rounding_t rounding; /* both stages; default ZPP_ROUND_NEAREST */
  uint64_t seed;          /* stochastic rounding: the same seed gives the
                             same result (and the same random bits); pass
                             a new one for every tensor and step, or the
                             rounding errors of calls that share it are
                             correlated */
  int residual_bits;      /* error-feedback residual storage: 32 (default,
                             fp32) or 8 (INT8, LoCo style: the format of
                             docs/format.md, symmetric, block_size) */
  /* Fields below were added in revision 3 (LoCo's compensation); a
   * struct_size of revision 2 (the size up to residual_bits) is accepted
   * and they take their defaults. */
  float residual_beta;    /* in [0, 1): the residual is a moving average of
                             the compression errors, e <- beta e + (1 -
                             beta) err; 0 (default): plain error feedback
                             (e <- err); LoCo uses 0.8 */
  uint32_t residual_reset; /* > 0: calls whose `step` is a positive multiple
                              of it start from a zero residual (LoCo: every
                              1024 steps); 0 (default): never */
  uint64_t step;          /* the caller's step counter, for residual_reset */
  /* Field below was added in revision 4; a struct_size of revision 3 (the
   * size up to step) is accepted and it takes its default. */
  int sum;                /* how the stages reduce: ZPP_QGZ_SUM_DEFAULT
                             (the ZPP_QGZ_SUM setting, for the configs
                             that allow it), ZPP_QGZ_SUM_FLOAT or
                             ZPP_QGZ_SUM_INT (docs/collectives.md,
                             "Compressed-domain sums") */
} zpp_qgz_config_t;

/* zpp_qgz_config_t.sum.  FLOAT: every hop decodes to fp32, adds and
 * re-encodes with scales of its own.  INT: the ranks of a stage agree on a
 * power-of-two unit per block first, each sends codes on its own integer
 * multiple of the unit (one multiplier byte per block), the sums are exact
 * integers, the node's integer sum is re-quantized for the network from
 * integers, and each rank decodes once.  Each rank's step lies less than
 * one unit (under 2/255 of the group's largest scale) above its own scale,
 * so its error bound is FLOAT's plus half a unit; the own share, rounded
 * to a unit, is fed back with error feedback (docs/format.md, "Integer
 * sums"); host and device memory give the same bits.  INT needs a
 * symmetric mode, no Hadamard rotation, a quantized stage 1 (intra_bits 4
 * or 8) and at most 2056 (INT4) or 128 (INT8) ranks per stage: asked for
 * explicitly otherwise, the call fails (ZPP_ERR_UNSUPPORTED for the
 * rotation and the stage size, ZPP_ERR_INVALID_ARGUMENT for the others);
 * DEFAULT then means FLOAT. */
#define ZPP_QGZ_SUM_DEFAULT 0
#define ZPP_QGZ_SUM_FLOAT 1
#define ZPP_QGZ_SUM_INT 2

#define ZPP_QGZ_CONFIG_INIT                                                    \
  { sizeof(zpp_qgz_config_t), 4, 4, 256, ZPP_QUANT_SYMMETRIC, 0,             \
    ZPP_ROUND_NEAREST, 0, 32, 0.0f, 0, 0, ZPP_QGZ_SUM_DEFAULT }

/* LoCo's setting (Xie et al. 2024): beta 0.8, a reset every 1024 steps. */
#define ZPP_QGZ_LOCO_BETA 0.8f
#define ZPP_QGZ_LOCO_RESET 1024

/* Floats of the fp32 error-feedback residual for a call with `count`
 * elements per rank (it holds the compression error of both stages, one
 * segment per slice and per partial sum; the segments of the rank's own
 * share, which is not quantized, are neither read nor written, but for
 * its slices' rounding to a unit with ZPP_QGZ_SUM_INT): enough
 * for every fp32-residual config (with intra_bits ZPP_QGZ_INTRA_RAW fewer
 * are used); the INT8 residual's size is zpp_qgz_residual_bytes, which
 * can exceed 4 times this count (E8(count) > 4 count with blocks of one
 * element, or count 1). */
ZPP_API zpp_status_t zpp_qgz_residual_count(zpp_comm_t comm, size_t count,
                                            size_t *residual_count);

/* Bytes of the error-feedback residual of `cfg` (either residual_bits):
 * fp32 4 (W + M) count; INT8 (W + M) E8(count), one encoded INT8 buffer
 * of `count` elements per stage-1 slice and per stage-2 partial sum.  With
 * intra_bits ZPP_QGZ_INTRA_RAW stage 1 has no error: M segments (two
 * levels), W (uneven nodes: the flat stage quantizes in inter_bits) or 0
 * (one node: nothing is quantized, and the residual is not touched). */
ZPP_API zpp_status_t zpp_qgz_residual_bytes(zpp_comm_t comm,
                                            const zpp_qgz_config_t *cfg,
                                            size_t count, size_t *bytes);

/* Hierarchical quantized reduce-scatter: rank r receives slice r (count
 * elements) of the sum or mean of every rank's sendbuf (size * count).
 *   1. every rank encodes, for each other local rank j of its node, the
 *      slices of the ranks with local rank j (one contiguous message per
 *      destination), and an all-to-all inside the node moves them;
 *   2. each rank sums its own slices (read from sendbuf, not quantized) and
 *      the decoded messages in fp32, then encodes the partial sum of each
 *      other node's slice, and an all-to-all among the ranks with its
 *      local rank on the other nodes moves them (one crossing of the
 *      network, in inter_bits);
 *   3. decode-accumulate in fp32 with its own node's partial sum (kept in
 *      fp32), divide by the world size for MEAN, round once to dtype.
 * What a rank would send to itself is never quantized: its residual
 * segments (its own slices, its own node's partial sum) are neither read
 * nor written (ZPP_QGZ_SUM_INT: its own slices' hold the error of their
 * rounding to a unit).
 * One node: step 1 only.  Uneven nodes: one flat quantized all-to-all over
 * the world (docs/design.md).  residual (NULL: no error feedback) is a
 * caller-owned fp32 buffer of zpp_qgz_residual_count elements, zero before
 * the first step: each step adds it to the data before encoding and
 * stores the new compression error into it (with cfg->residual_beta, a
 * moving average of the errors; cfg->residual_reset zeroes it first every
 * that many steps of cfg->step).  With cfg->residual_bits 8 it
 * is a buffer of zpp_qgz_residual_bytes bytes (all zero before the first
 * step), any alignment.  A NaN or Inf in any rank's gradient makes the
 * owning shard's element non-finite.  In place when recvbuf == sendbuf +
 * rank * count (each chunk of this rank's slice is read into the partial
 * sums before its result is written over it), the same bits as out of
 * place; residual
 * (zpp_qgz_residual_bytes bytes) shares no byte with sendbuf or recvbuf;
 * any other overlap is ZPP_ERR_INVALID_ARGUMENT. */
ZPP_API zpp_status_t zpp_qgz_reduce_scatter(zpp_comm_t comm,
                                            const zpp_qgz_config_t *cfg,
                                            const void *sendbuf,
                                            void *recvbuf, size_t count,
                                            zpp_dtype_t dtype, zpp_redop_t op,
                                            void *residual,
                                            zpp_stream_t stream,
                                            zpp_request_t *req);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_ZPP_COLL_H */
