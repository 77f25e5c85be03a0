/*
 * Runtime-facing API: parameter groups for a ZeRO-3 / ZeRO++ runtime.
 *
 * A parameter group is a list of tensors flattened into one buffer of the
 * working dtype and partitioned over the ranks of a communicator: rank r
 * owns elements [r * shard_numel, (r + 1) * shard_numel) of the padded flat
 * buffer.  A runtime drives it as follows (docs/runtime.md):
 *
 *   create      layout from the tensor sizes; every rank calls it
 *   fetch/wait  gather the shards into the full buffer before use
 *               (forward: qwZ when qwz_bits; backward: hpZ when hpz)
 *   release     the full buffer is not needed any more (freed)
 *   reduce_gradients
 *               reduce-scatter a full gradient into the owner's shard
 *               (qgZ when qgz_bits, with error feedback when asked;
 *               the full-precision baseline otherwise)
 *   params_changed
 *               after the optimizer step or a checkpoint load: cached
 *               copies (hpZ secondary partition) are stale
 *   recover     after zpp_comm_shrink: the group over the survivors, a
 *               dead rank's shard rebuilt from hpZ's secondary copy
 *
 * Every function is collective in the sense of the collectives: all ranks
 * call the same group functions in the same order.  Only this header's
 * functions and <zpp/zpp_coll.h> are used underneath: the group adds no
 * transport of its own.
 */
#ifndef ZPP_ZPP_RUNTIME_H
#define ZPP_ZPP_RUNTIME_H

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_pgroup *zpp_pgroup_t;

typedef struct {
  size_t struct_size;   /* sizeof(zpp_pgroup_config_t): INIT macro */
  zpp_dtype_t dtype;    /* working dtype of parameters and gradients
                           (default ZPP_BFLOAT16) */
  int qwz_bits;         /* 0 (default): full-precision gathers; 8 or 4 */
  size_t qwz_block;     /* qwZ elements per scale (default 256) */
  int hpz;              /* 1: backward fetches gather inside the node from
                           a secondary partition (default 0) */
  int qgz_bits;         /* 0 (default): baseline reduce-scatter; 4 or 8:
                           qgZ with these inter-node bits */
  int qgz_intra_bits;   /* qgZ intra-node bits; 0 (default): qgz_bits;
                           ZPP_QGZ_INTRA_RAW (16): not quantized inside
                           the node */
  size_t qgz_block;     /* qgZ elements per scale (default 256) */
  int error_feedback;   /* 1: qgZ keeps a residual of its quantization
                           errors (needs qgz_bits; none where nothing it
                           quantizes: zpp_pgroup_residual_count) */
  size_t align;         /* shard_numel is a multiple of this (elements);
                           0 (default): the quantization blocks in use
                           (lcm of qwz_block and qgz_block), else 1 */
  /* Fields below were added in 0.2; a struct_size from before (the size
   * up to `align`) is accepted and they take their defaults. */
  size_t qgz_hadamard;  /* qgZ Hadamard group (zpp_qgz_config_t.hadamard):
                           0 (default) off; must divide qgz_block */
  zpp_rounding_t rounding; /* qgZ and qWD encodes (default nearest) */
  uint64_t seed;        /* stochastic rounding: call k of the group uses a
                           seed derived from (seed, the group's index among
                           the groups created on its communicator, k), so
                           groups (layers) and calls draw independent bits
                           from one seed, and runs repeat */
  int error_feedback_bits; /* residual storage: 32 (default) fp32, 8 INT8 */
  int qwd_bits;         /* 0 (default) off; 4 or 8: the group holds the full
                           parameters and zpp_pgroup_update_params sends
                           quantized differences (ZeRO-1/2 runtimes) */
  size_t qwd_block;     /* qWD elements per scale (default 2048) */
  /* Fields below were added in 0.3; a struct_size from 0.2 (the size up to
   * qwd_block) is accepted and they take their defaults. */
  float error_feedback_beta;     /* LoCo's moving average of the residual
                                    (zpp_qgz_config_t.residual_beta): 0
                                    (default) plain error feedback; 0.8 */
  uint32_t error_feedback_reset; /* reduction k > 0 of the group starts
                                    from a zero residual when k is a
                                    multiple of this (residual_reset, with
                                    the group's reduction count as step);
                                    0 (default) never; LoCo: 1024 */
} zpp_pgroup_config_t;

#define ZPP_PGROUP_CONFIG_INIT                                                 \
  { sizeof(zpp_pgroup_config_t), ZPP_BFLOAT16, 0, 256, 0, 0, 0, 256, 0, 0,   \
    0, ZPP_ROUND_NEAREST, 0, 32, 0, 2048, 0.0f, 0 }

typedef enum {
  ZPP_FETCH_FORWARD = 0, /* qwZ (or full precision) world gather; with hpZ
                            it also refreshes the secondary partition */
  ZPP_FETCH_BACKWARD = 1 /* hpZ: gather inside the node from the secondary
                            partition (refreshed first when stale);
                            without hpZ the same as forward */
} zpp_fetch_t;

typedef struct {
  size_t struct_size;   /* sizeof(zpp_pgroup_info_t): INIT macro */
  int world_size;
  int rank;
  int ntensors;
  size_t numel;         /* sum of the tensor sizes */
  size_t padded_numel;  /* shard_numel * world_size >= numel; the padding
                           is at the end and is zero in the group's shard */
  size_t shard_numel;   /* elements owned by every rank */
  size_t shard_offset;  /* rank * shard_numel */
  size_t full_bytes;    /* bytes of the full buffer held now in the
                           group's own memory (0 after release; 0 for an
                           attached buffer) */
  size_t hpz_bytes;     /* hpZ secondary partition held (0 without hpZ) */
  size_t residual_bytes; /* qgZ error-feedback residual held in the group's
                           own memory (0 for an attached one) */
  uint64_t generation;  /* bumped by zpp_pgroup_params_changed */
} zpp_pgroup_info_t;

#define ZPP_PGROUP_INFO_INIT                                                   \
  { sizeof(zpp_pgroup_info_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* Creates a group of `ntensors` tensors of sizes[t] elements, packed in
 * order (tensor t at the sum of the sizes before it).  cfg NULL: defaults.
 * Host-memory communicators: the group allocates its shard (zeroed) at
 * creation and the full buffer at each fetch.  Device-memory
 * communicators: the caller provides them with zpp_pgroup_attach.  The
 * configuration must be the same on all ranks. */
ZPP_API zpp_status_t zpp_pgroup_create(zpp_comm_t comm,
                                       const zpp_pgroup_config_t *cfg,
                                       const size_t *sizes, int ntensors,
                                       zpp_pgroup_t *out);
/* Frees what the group allocated (not attached buffers).  Waits first for
 * a pending fetch, and for a zpp_pgroup_reduce_gradients of the group
 * with error feedback that is still queued or running (it uses the
 * group's residual).  That wait is bounded like zpp_request_wait: when
 * the engine makes no progress for twice ZPP_TIMEOUT_S and a second, the
 * communicator is aborted and ZPP_ERR_TIMEOUT returned, the rest freed
 * and the group's own residual leaked, never freed under the reduction
 * (an attached one may be in use until its request completes).  The
 * reduction's request stays valid: wait for it as usual.  Safe on NULL.
 * Destroy a group before its communicator. */
ZPP_API zpp_status_t zpp_pgroup_destroy(zpp_pgroup_t pg);

ZPP_API zpp_status_t zpp_pgroup_get_info(zpp_pgroup_t pg,
                                         zpp_pgroup_info_t *info);

/* Tensor t: its offset in the flat buffer, its size, and the first and
 * last rank whose shard holds part of it (a tensor of size 0 is "owned"
 * by the rank whose shard holds its offset). */
ZPP_API zpp_status_t zpp_pgroup_tensor(zpp_pgroup_t pg, int t, size_t *offset,
                                       size_t *numel, int *first_rank,
                                       int *last_rank);

/* Caller-owned buffers in the communicator's memory space (required for
 * device memory, optional for host memory; NULL keeps the group's own):
 * shard (shard_numel elements of dtype), full (padded_numel elements) and
 * residual (zpp_pgroup_residual_count floats, zero before the first
 * reduction; needed only with error feedback, and only when that count is
 * non-zero: a residual given to a group whose count is 0 is refused).  Not
 * during a fetch (refused).  A residual is refused while a
 * zpp_pgroup_reduce_gradients of the group with error feedback is still
 * queued or running: it uses the residual this would replace, and the
 * group's own would be freed under it (zpp_request_wait or a successful
 * zpp_request_test ends that).  On device memory the group sees only the
 * host part: kernels the reduction put on the stream may still use the
 * old residual (the caller's there, never freed by the group), and the
 * blocking form returns once the reduction is queued (zpp_coll.h,
 * "Asynchrony"): a reduction is in flight until its request was waited
 * for on the host, so start it with a request and wait for that before an
 * attach, and order the attach after the stream.
 * With qwd_bits an attached full buffer is the reconstruction qWD keeps:
 * it must hold the same values on every rank.  shard may be this rank's
 * slot of full (full + rank * shard_numel elements: the gather runs in
 * place) and shares no other byte with it; otherwise the fetch fails with
 * ZPP_ERR_INVALID_ARGUMENT from the collective, whose message calls shard
 * sendbuf and full recvbuf (zpp_coll.h, "Buffers and overlap"). */
ZPP_API zpp_status_t zpp_pgroup_attach(zpp_pgroup_t pg, void *shard,
                                       void *full, void *residual);

/* Floats of the error-feedback residual (0 without error feedback, and 0
 * when no quantized stage keeps an error: an empty shard, or
 * qgz_intra_bits 16 on one node, where nothing is quantized); with
 * error_feedback_bits 8 the INT8 residual of zpp_qgz_residual_bytes
 * bytes, rounded up to whole floats. */
ZPP_API zpp_status_t zpp_pgroup_residual_count(zpp_pgroup_t pg,
                                               size_t *count);

/* This rank's shard of the working-dtype parameters (shard_numel
 * elements): the optimizer writes its new values here, then calls
 * zpp_pgroup_params_changed. */
ZPP_API zpp_status_t zpp_pgroup_shard(zpp_pgroup_t pg, void **shard);

/* Starts gathering every rank's shard into the full buffer (padded_numel
 * elements of dtype).  Asynchronous: the next group can be fetched before
 * this one is waited for.  ZPP_ERR_INVALID_ARGUMENT while a fetch of this
 * group is pending or `kind` is unknown. */
ZPP_API zpp_status_t zpp_pgroup_fetch(zpp_pgroup_t pg, zpp_fetch_t kind,
                                      zpp_stream_t stream);
/* Waits for the pending fetch and returns the full buffer (valid until
 * zpp_pgroup_release).  Returns the gather's status; with no fetch
 * pending and none held, ZPP_ERR_INVALID_ARGUMENT. */
ZPP_API zpp_status_t zpp_pgroup_wait(zpp_pgroup_t pg, void **full);
/* The full buffer is not needed any more: the group frees it (attached:
 * only marks it free).  Waits for a pending fetch first.  After a fetch
 * that failed, the group's own full buffer is leaked instead (here and in
 * zpp_pgroup_destroy): the backend may still write into it until the
 * communicator is destroyed (docs/api.md, faults). */
ZPP_API zpp_status_t zpp_pgroup_release(zpp_pgroup_t pg);

/* full_grad (padded_numel elements of dtype; elements past numel should
 * be zero) of every rank is reduced into grad_shard (shard_numel
 * elements) of its owner: qgZ when qgz_bits (with the group's residual
 * when error_feedback and zpp_pgroup_residual_count is non-zero), else
 * the baseline zpp_reduce_scatter (fp32 sum in its fixed order, rounded
 * once; see there).  req NULL: as the collectives' blocking form (device
 * memory: returns once queued, zpp_coll.h "Asynchrony"); otherwise
 * zpp_request_wait(*req) finishes it.  grad_shard may be this rank's slot
 * of full_grad (full_grad + rank * shard_numel elements: in place); any
 * other byte shared by full_grad, grad_shard and the residual is
 * ZPP_ERR_INVALID_ARGUMENT from the collective (named sendbuf, recvbuf and
 * residual there). */
ZPP_API zpp_status_t zpp_pgroup_reduce_gradients(zpp_pgroup_t pg,
                                                 const void *full_grad,
                                                 void *grad_shard,
                                                 zpp_redop_t op,
                                                 zpp_stream_t stream,
                                                 zpp_request_t *req);

/* qWD groups (qwd_bits 4 or 8; ZeRO-1/2 runtimes, which keep the full
 * parameters): after the optimizer step, brings the full buffer up to date
 * from this rank's new fp32 master shard (shard_numel floats) with
 * zpp_qwd_allgather: quantized differences against the full buffer
 * itself, which the group keeps between steps (its own starts at zero; an
 * attached one at what the caller put there, the same on every rank).
 * Asynchronous like a fetch: zpp_pgroup_wait returns the full buffer,
 * identical on all ranks.  Call zpp_pgroup_params_changed first.
 * ZPP_ERR_INVALID_ARGUMENT without qwd_bits or while a fetch is pending,
 * or when master_shard shares a byte with the full buffer (qWD has no
 * in-place form; zpp_qwd_allgather names them target and recon). */
ZPP_API zpp_status_t zpp_pgroup_update_params(zpp_pgroup_t pg,
                                              const float *master_shard,
                                              zpp_stream_t stream);

/* The parameters changed (optimizer step, checkpoint load): the hpZ
 * secondary partition and a held full buffer are stale from now on (the
 * next backward fetch refreshes, never uses the stale copy).  Local, no
 * communication; call it on every rank, right after writing the shard
 * with no failure handling in between (a zpp_pgroup_recover between the
 * two would trust the copies of the old values). */
ZPP_API zpp_status_t zpp_pgroup_params_changed(zpp_pgroup_t pg);

/* ---- Recovery after a rank's death (docs/runtime.md, "Recovery") ------- */

typedef struct {
  size_t struct_size;     /* sizeof(zpp_pgroup_recovery_t): INIT macro */
  int old_world_size;
  int new_world_size;
  int old_rank;           /* this rank in the old group */
  int lost_ranks;         /* old ranks gone (zpp_pgroup_lost: which, and
                             what of the flat buffer they owned) */
  int exact;              /* 1: every rebuilt element is bitwise its value
                             before the failure (unquantized hpZ copy, or no
                             real element lost); 0: within the quantization
                             bound of the copy (qwZ, docs/format.md) */
  size_t rebuilt_numel;   /* elements (of numel) rebuilt from hpZ copies */
  size_t state_lost_numel; /* of them, in this rank's new shard: their
                              optimizer state is gone (zeroed by
                              zpp_pgroup_recover_state) */
  size_t residual_floats_dropped; /* this rank's qgZ error-feedback
                                     residual, laid out for the old ranks:
                                     the new group's starts at zero */
  uint64_t generation;    /* the parameters' generation the survivors
                             agreed on (zpp_pgroup_info_t.generation of the
                             old group; the new group starts there) */
} zpp_pgroup_recovery_t;

#define ZPP_PGROUP_RECOVERY_INIT                                               \
  { sizeof(zpp_pgroup_recovery_t), 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* After zpp_comm_shrink(old's communicator, cfg, new_rank_of, &newcomm):
 * every survivor calls this for every group, in creation order (it is
 * collective on newcomm), with new_rank_of as zpp_comm_shrink returned it
 * (the old size of ints, -1 for a rank left out).  It creates *out, the
 * same tensors and configuration re-partitioned over newcomm's ranks, and
 * fills its shard: elements a survivor owned keep their bits; a lost
 * rank's shard is rebuilt from the hpZ secondary copy held by a survivor
 * (the copy of the last forward gather: exact when unquantized, within
 * qwZ's bound otherwise).  Reads only memory of old, never its (aborted)
 * communicator's transfers: it waits (bounded) for old's pending request
 * and reads old's rank, size and topology.  Destroy old afterwards.
 * Host-memory groups only; buffers attached to old are not carried (the
 * new group allocates its own).  Until the new group's first forward
 * gather its hpZ copies hold nothing: a death before it is DATA_LOST.
 * report (NULL: not wanted) says what was lost; new rank 0 logs a WARN
 * line per lost rank that owned real elements.
 * Errors: ZPP_ERR_DATA_LOST naming the old rank whose shard no survivor
 * holds a current copy of, and why (hpZ off, one node, uneven nodes, the
 * copy's holders dead too, the copies stale: parameters changed after the
 * last forward gather); ZPP_ERR_MISMATCH when the survivors' groups
 * differ (layout, generation, the group's id: groups recovered in
 * different orders); ZPP_ERR_UNSUPPORTED for device memory and qWD
 * groups; a collective's error on newcomm.  An error found after the
 * survivors' first exchange is the same on every survivor; the argument
 * checks before it are local.  *out is set only on success. */
ZPP_API zpp_status_t zpp_pgroup_recover(zpp_pgroup_t old, zpp_comm_t newcomm,
                                        const int *new_rank_of,
                                        zpp_pgroup_t *out,
                                        zpp_pgroup_recovery_t *report);

/* Lost rank i (0 <= i < report.lost_ranks) of a group made by
 * zpp_pgroup_recover: its old rank, the old rank whose hpZ copy rebuilt
 * its shard (-1: its shard held only padding), and the elements of the
 * flat buffer it owned, [begin, end) (end <= numel). */
ZPP_API zpp_status_t zpp_pgroup_lost(zpp_pgroup_t pg, int i, int *old_rank,
                                     int *from_rank, size_t *begin,
                                     size_t *end);

/* Moves per-element state the caller keeps for its shard (fp32 master
 * weights, optimizer moments: elem_bytes per element) from the old
 * layout to the new one: old_state holds the old group's shard_numel
 * elements on this rank, new_state receives the new shard_numel.  Elements
 * a survivor owned keep their bytes; those of lost ranks (zpp_pgroup_lost)
 * and the padding are zero.  Collective on pg's communicator; pg must
 * come from zpp_pgroup_recover (the old group may be destroyed before or
 * after; old_state must live until this returns). */
ZPP_API zpp_status_t zpp_pgroup_recover_state(zpp_pgroup_t pg,
                                              const void *old_state,
                                              void *new_state,
                                              size_t elem_bytes);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_ZPP_RUNTIME_H */
