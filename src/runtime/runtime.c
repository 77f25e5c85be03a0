/*
 * Parameter groups (include/zpp/zpp_runtime.h): the layout, the buffers and
 * the choice of collective a ZeRO runtime needs, written against the
 * public collectives (zpp_coll.h) and communicator (zpp_comm.h) APIs, and
 * one question to the engine (engine/engine.h): whether a started gradient
 * reduction of the group is still in flight, so that the residual it uses
 * is never freed under it.  Usage and the memory each call holds:
 * docs/runtime.md.
 */
#include <zpp/zpp_runtime.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "quant/quant.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct zpp_pgroup {
  zpp_comm_t comm;
  zpp_pgroup_config_t cfg;
  zpp_memory_t memory;
  int rank, size;
  int ntensors;
  size_t *offsets; /* ntensors + 1 prefix sums (elements) */
  size_t numel, shard_numel;
  size_t esize;    /* bytes per element of cfg.dtype */
  /* buffers: own_* are allocated by the group (host memory only) */
  void *shard, *own_shard;
  void *full, *own_full;    /* full: attached or allocated at fetch */
  int full_attached;
  int full_in_doubt; /* a fetch into own_full failed: the backend may
                        still write it until the communicator is
                        destroyed (docs/api.md, faults), so it is
                        leaked, never freed */
  void *residual, *own_residual;
  size_t residual_count; /* floats (INT8: the bytes rounded up to floats) */
  size_t residual_bytes;
  uint64_t id;           /* index among the groups of comm (same on every
                            rank): its own stochastic-rounding stream */
  uint64_t calls;        /* qgZ / qWD calls: stochastic-rounding seeds */
  uint64_t reductions;   /* reduce_gradients calls: the residual's step */
  zpp_hpz_t hpz;
  zpp_request_t pending;    /* fetch in flight */
  uint64_t reduce_ticket;   /* the last started reduce_gradients (engine
                               ticket; 0: none or done inline) */
  int held;                 /* the full buffer holds gathered data */
  uint64_t generation;
  struct pg_recovery *rec; /* made by zpp_pgroup_recover: the old layout */
};

/* What zpp_pgroup_recover_state needs of the old layout (the old group
 * may be gone by then), and what zpp_pgroup_lost reports. */
struct pg_recovery {
  int old_size, old_rank;
  size_t old_shard; /* the old group's shard_numel */
  int *old_of;      /* [new size]: the old rank of each new rank */
  int nlost;
  int *lost, *from; /* [nlost]: old rank lost, old rank whose copy rebuilt
                       it (-1: it owned only padding) */
};

static void recovery_free(struct pg_recovery *r) {
  if (r == NULL)
    return;
  free(r->old_of);
  free(r->lost);
  free(r->from);
  free(r);
}

static size_t gcd_size(size_t a, size_t b) {
  while (b) {
    size_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static zpp_status_t check_bits(const char *func, const char *name, int bits,
                               int allow_zero) {
  if ((allow_zero && bits == 0) || bits == 4 || bits == 8)
    return ZPP_OK;
  return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func, "%s %d: must be %s4 or 8",
                   name, bits, allow_zero ? "0 (off), " : "");
}

/* sizeof(zpp_pgroup_config_t) of zpp 0.1: the fields up to `align`. */
#define PGROUP_CONFIG_V1_SIZE                                                  \
  (offsetof(zpp_pgroup_config_t, align) + sizeof(size_t))

/* sizeof(zpp_pgroup_config_t) of zpp 0.2: the fields up to `qwd_block`. */
#define PGROUP_CONFIG_V2_SIZE                                                  \
  (offsetof(zpp_pgroup_config_t, qwd_block) + sizeof(size_t))

/* The full current config of one of any accepted size (each older size
 * ends on a size_t field, so its prefix is whole fields). */
static void config_get(const zpp_pgroup_config_t *in,
                       zpp_pgroup_config_t *out) {
  zpp_pgroup_config_t d = ZPP_PGROUP_CONFIG_INIT;
  if (in->struct_size >= sizeof(zpp_pgroup_config_t))
    d = *in;
  else if (in->struct_size >= PGROUP_CONFIG_V2_SIZE)
    memcpy(&d, in, PGROUP_CONFIG_V2_SIZE);
  else
    memcpy(&d, in, PGROUP_CONFIG_V1_SIZE);
  d.struct_size = sizeof(zpp_pgroup_config_t);
  *out = d;
}

static zpp_status_t check_config(const char *func,
                                 const zpp_pgroup_config_t *in) {
  zpp_pgroup_config_t cc;
  const zpp_pgroup_config_t *c = &cc;
  if (in->struct_size < PGROUP_CONFIG_V1_SIZE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->struct_size %zu: must be sizeof(zpp_pgroup_config_t)"
                     " = %zu (use ZPP_PGROUP_CONFIG_INIT)",
                     in->struct_size, sizeof(zpp_pgroup_config_t));
  config_get(in, &cc);
  ZPP_CHECK(zpp_check_float_dtype(func, "cfg->dtype", c->dtype));
  ZPP_CHECK(check_bits(func, "cfg->qwz_bits", c->qwz_bits, 1));
  ZPP_CHECK(check_bits(func, "cfg->qgz_bits", c->qgz_bits, 1));
  if (c->qgz_intra_bits != 0 && c->qgz_intra_bits != 4 &&
      c->qgz_intra_bits != 8 && c->qgz_intra_bits != ZPP_QGZ_INTRA_RAW)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->qgz_intra_bits %d: must be 0 (qgz_bits), 4, 8 or "
                     "16 (ZPP_QGZ_INTRA_RAW: not quantized inside the node)",
                     c->qgz_intra_bits);
  if (c->qwz_bits && c->qwz_block == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->qwz_block 0: must be >= 1");
  if (c->qgz_bits && c->qgz_block == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->qgz_block 0: must be >= 1");
  if (c->hpz != 0 && c->hpz != 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->hpz %d: must be 0 or 1", c->hpz);
  if (c->error_feedback != 0 && c->error_feedback != 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->error_feedback %d: must be 0 or 1",
                     c->error_feedback);
  if (c->error_feedback && c->qgz_bits == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->error_feedback 1: needs cfg->qgz_bits 4 or 8 "
                     "(the baseline reduce-scatter has no compression "
                     "error)");
  ZPP_CHECK(check_bits(func, "cfg->qwd_bits", c->qwd_bits, 1));
  if (c->qwd_bits && c->qwd_block == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->qwd_block 0: must be >= 1");
  if (c->qwd_bits && (c->qwz_bits || c->hpz))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->qwd_bits %d: qWD groups keep the full parameters "
                     "and gather differences; qwz_bits and hpz must be 0",
                     c->qwd_bits);
  if (c->qgz_hadamard != 0 &&
      (c->qgz_bits == 0 || c->qgz_hadamard < 2 ||
       (c->qgz_hadamard & (c->qgz_hadamard - 1)) != 0 ||
       c->qgz_block % c->qgz_hadamard != 0))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->qgz_hadamard %zu: must be 0, or (with qgz_bits) a "
                     "power of two >= 2 that divides qgz_block %zu",
                     c->qgz_hadamard, c->qgz_block);
  if (c->rounding != ZPP_ROUND_NEAREST && c->rounding != ZPP_ROUND_STOCHASTIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->rounding %d: must be ZPP_ROUND_NEAREST or "
                     "ZPP_ROUND_STOCHASTIC",
                     (int)c->rounding);
  if (c->error_feedback_bits != 32 && c->error_feedback_bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->error_feedback_bits %d: must be 32 (fp32) or 8 "
                     "(INT8)",
                     c->error_feedback_bits);
  if (!(c->error_feedback_beta >= 0.0f && c->error_feedback_beta < 1.0f))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->error_feedback_beta %g: must be in [0, 1) (0: "
                     "plain error feedback; LoCo: 0.8)",
                     (double)c->error_feedback_beta);
  return ZPP_OK;
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The seed of call `call` of the group: a hash of (cfg.seed, the group's
 * index on its communicator, call), so that no two groups (layers) and no
 * two calls share random bits, and a run repeats with the same seed.  (It
 * was cfg.seed ^ call * const: every layer's call k drew the same bits.) */
static uint64_t group_seed(const zpp_pgroup_t pg, uint64_t call) {
  uint64_t h = mix64(pg->cfg.seed + 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ (pg->id + 0x632be59bd9b4e019ull));
  return mix64(h ^ (call + 0x85ebca77c2b2ae63ull));
}

/* The qgZ config of the group's reduce-scatters (call `call`). */
static zpp_qgz_config_t group_qgz(const zpp_pgroup_t pg, uint64_t call) {
  const zpp_pgroup_config_t *c = &pg->cfg;
  zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
  q.inter_bits = c->qgz_bits;
  q.intra_bits = c->qgz_intra_bits;
  q.block_size = c->qgz_block;
  q.hadamard = c->qgz_hadamard;
  q.rounding = c->rounding;
  q.seed = group_seed(pg, call);
  q.residual_bits = c->error_feedback_bits;
  q.residual_beta = c->error_feedback_beta;
  q.residual_reset = c->error_feedback_reset;
  return q;
}

ZPP_API zpp_status_t zpp_pgroup_create(zpp_comm_t comm,
                                       const zpp_pgroup_config_t *cfg,
                                       const size_t *sizes, int ntensors,
                                       zpp_pgroup_t *out) {
  static const char *F = "zpp_pgroup_create";
  zpp_pgroup_config_t defaults = ZPP_PGROUP_CONFIG_INIT;
  zpp_status_t st;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "comm is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "out is NULL");
  if (ntensors < 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "ntensors %d: must be >= 0", ntensors);
  if (ntensors > 0 && sizes == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "sizes is NULL (ntensors %d)",
                     ntensors);
  if (cfg == NULL)
    cfg = &defaults;
  ZPP_CHECK(check_config(F, cfg));

  zpp_pgroup_t pg = calloc(1, sizeof(*pg));
  if (pg == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "group struct");
  pg->comm = comm;
  /* taken before anything that can fail on one rank only, so every rank's
   * groups keep the same indices */
  pg->id = zpp_comm_next_object_id(comm);
  config_get(cfg, &pg->cfg);
  if (pg->cfg.qgz_intra_bits == 0)
    pg->cfg.qgz_intra_bits = pg->cfg.qgz_bits;
  pg->esize = zpp_dtype_size(cfg->dtype);
  pg->ntensors = ntensors;
  ZPP_CHECK_GOTO(zpp_comm_rank(comm, &pg->rank), st, err_free);
  ZPP_CHECK_GOTO(zpp_comm_size(comm, &pg->size), st, err_free);
  ZPP_CHECK_GOTO(zpp_comm_memory(comm, &pg->memory), st, err_free);

  pg->offsets = malloc(((size_t)ntensors + 1) * sizeof(size_t));
  if (pg->offsets == NULL) {
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "offsets of %d tensors",
                   ntensors);
    goto err_free;
  }
  pg->offsets[0] = 0;
  for (int t = 0; t < ntensors; t++) {
    if (sizes[t] > SIZE_MAX / 2 - pg->offsets[t]) {
      st = zpp_error(ZPP_ERR_OVERFLOW, F,
                     "sizes[%d] %zu: the total overflows size_t", t, sizes[t]);
      goto err_offsets;
    }
    pg->offsets[t + 1] = pg->offsets[t] + sizes[t];
  }
  pg->numel = pg->offsets[ntensors];

  /* Alignment: a shard that is a whole number of quantization blocks
   * has no short tail block (docs/runtime.md, "Layout"). */
  size_t align = cfg->align;
  if (align == 0) {
    align = 1;
    if (cfg->qwz_bits)
      align = cfg->qwz_block;
    if (cfg->qgz_bits) {
      size_t g = gcd_size(align, cfg->qgz_block);
      align = align / g * cfg->qgz_block;
    }
  }
  size_t w = (size_t)pg->size;
  size_t per = pg->numel / w + (pg->numel % w != 0);
  per = (per + align - 1) / align * align;
  if (per > SIZE_MAX / w / pg->esize) {
    st = zpp_error(ZPP_ERR_OVERFLOW, F,
                   "numel %zu with align %zu: the padded buffer overflows",
                   pg->numel, align);
    goto err_offsets;
  }
  pg->shard_numel = per;

  if (cfg->hpz) {
    zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
    hc.quantized = cfg->qwz_bits != 0;
    if (hc.quantized) {
      hc.quant.bits = cfg->qwz_bits;
      hc.quant.block_size = cfg->qwz_block;
    }
    ZPP_CHECK_GOTO(zpp_hpz_create(comm, &hc, per, cfg->dtype, &pg->hpz), st,
                   err_offsets);
  }
  if (cfg->error_feedback) {
    zpp_qgz_config_t q = group_qgz(pg, 0);
    ZPP_CHECK_GOTO(zpp_qgz_residual_bytes(comm, &q, per, &pg->residual_bytes),
                   st, err_hpz);
    pg->residual_count = (pg->residual_bytes + sizeof(float) - 1) /
                         sizeof(float);
  }

  if (pg->memory == ZPP_MEMORY_HOST) {
    pg->own_shard = calloc(per ? per : 1, pg->esize);
    if (pg->own_shard == NULL) {
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "shard of %zu elements", per);
      goto err_hpz;
    }
    pg->shard = pg->own_shard;
    if (pg->cfg.qwd_bits) { /* the reconstruction qWD keeps, zero */
      pg->own_full = calloc(per * w != 0 ? per * w : 1, pg->esize);
      if (pg->own_full == NULL) {
        st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, F,
                       "qWD full buffer of %zu elements", per * w);
        goto err_shard;
      }
      pg->full = pg->own_full;
    }
    if (pg->residual_count) {
      pg->own_residual = calloc(pg->residual_count, sizeof(float));
      if (pg->own_residual == NULL) {
        st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "residual of %zu floats",
                       pg->residual_count);
        goto err_shard;
      }
      pg->residual = pg->own_residual;
    }
  }
  *out = pg;
  return ZPP_OK;

err_shard:
  free(pg->own_full);
  free(pg->own_shard);
err_hpz:
  zpp_hpz_destroy(pg->hpz);
err_offsets:
  free(pg->offsets);
err_free:
  free(pg);
  return st;
}

static zpp_status_t finish_pending(zpp_pgroup_t pg) {
  if (pg->pending == NULL)
    return ZPP_OK;
  zpp_status_t st = zpp_request_wait(pg->pending);
  pg->pending = NULL;
  pg->held = st == ZPP_OK;
  if (st != ZPP_OK && pg->own_full && !pg->cfg.qwd_bits)
    pg->full_in_doubt = 1;
  return st;
}

/* Lets go of the group's own full buffer: freed, or, when a failed fetch
 * may still write it (zpp_comm.h: a failed collective's buffers stay in
 * use until zpp_comm_destroy returns), left allocated with a WARN. */
static void drop_own_full(zpp_pgroup_t pg, const char *func) {
  if (pg->full_in_doubt && pg->own_full)
    ZPP_WARN(ZPP_SUBSYS_COLL,
             "%s: group %llu: the full buffer of %zu bytes a failed fetch "
             "may still write is left allocated (leaked)",
             func, (unsigned long long)pg->id,
             pg->shard_numel * (size_t)pg->size * pg->esize);
  else
    free(pg->own_full);
  pg->full_in_doubt = 0;
  pg->own_full = NULL;
}

/* A zpp_pgroup_reduce_gradients of pg with error feedback is queued or
 * running on the engine: it reads and writes the residual. */
static int reduction_in_flight(zpp_pgroup_t pg) {
  if (pg->reduce_ticket && !zpp_engine_in_flight(pg->comm, pg->reduce_ticket))
    pg->reduce_ticket = 0;
  return pg->reduce_ticket != 0;
}

ZPP_API zpp_status_t zpp_pgroup_destroy(zpp_pgroup_t pg) {
  if (pg == NULL)
    return ZPP_OK;
  zpp_status_t st = finish_pending(pg);
  zpp_status_t st2 = zpp_hpz_destroy(pg->hpz);
  /* a started reduction still uses the residual: wait for it (bounded),
   * as for a pending fetch; past the bound the residual is leaked, never
   * freed under it.  Last, so that its message is the one left. */
  zpp_status_t st0 = zpp_engine_wait_ticket(
      pg->comm, pg->reduce_ticket, "zpp_pgroup_destroy",
      pg->own_residual ? "the group's residual is leaked, not freed under it"
                       : "the attached residual may still be in use until "
                         "the reduction's request completes");
  if (st0 != ZPP_OK)
    pg->own_residual = NULL;
  drop_own_full(pg, "zpp_pgroup_destroy");
  free(pg->own_residual);
  free(pg->own_shard);
  free(pg->offsets);
  recovery_free(pg->rec);
  free(pg);
  if (st0 != ZPP_OK)
    return st0;
  return st != ZPP_OK ? st : st2;
}

ZPP_API zpp_status_t zpp_pgroup_get_info(zpp_pgroup_t pg,
                                         zpp_pgroup_info_t *info) {
  static const char *F = "zpp_pgroup_get_info";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (info == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "info is NULL");
  if (info->struct_size < sizeof(zpp_pgroup_info_t))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "info->struct_size %zu: must be %zu (use "
                     "ZPP_PGROUP_INFO_INIT)",
                     info->struct_size, sizeof(zpp_pgroup_info_t));
  zpp_pgroup_info_t r = ZPP_PGROUP_INFO_INIT;
  r.world_size = pg->size;
  r.rank = pg->rank;
  r.ntensors = pg->ntensors;
  r.numel = pg->numel;
  r.shard_numel = pg->shard_numel;
  r.padded_numel = pg->shard_numel * (size_t)pg->size;
  r.shard_offset = pg->shard_numel * (size_t)pg->rank;
  r.full_bytes = pg->own_full ? r.padded_numel * pg->esize : 0;
  if (pg->hpz) {
    zpp_hpz_info_t hi = ZPP_HPZ_INFO_INIT;
    ZPP_CHECK(zpp_hpz_get_info(pg->hpz, &hi));
    r.hpz_bytes = hi.secondary_bytes;
  }
  r.residual_bytes = pg->own_residual ? pg->residual_bytes : 0;
  r.generation = pg->generation;
  *info = r;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_tensor(zpp_pgroup_t pg, int t, size_t *offset,
                                       size_t *numel, int *first_rank,
                                       int *last_rank) {
  static const char *F = "zpp_pgroup_tensor";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (t < 0 || t >= pg->ntensors)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "t %d: must be in [0, %d)", t, pg->ntensors);
  size_t off = pg->offsets[t], n = pg->offsets[t + 1] - off;
  size_t s = pg->shard_numel ? pg->shard_numel : 1;
  size_t last_el = n ? off + n - 1 : off;
  int fr = (int)(off / s), lr = (int)(last_el / s);
  if (fr >= pg->size)
    fr = pg->size - 1; /* an empty tensor at the very end */
  if (lr >= pg->size)
    lr = pg->size - 1;
  if (offset)
    *offset = off;
  if (numel)
    *numel = n;
  if (first_rank)
    *first_rank = fr;
  if (last_rank)
    *last_rank = lr;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_attach(zpp_pgroup_t pg, void *shard,
                                       void *full, void *residual) {
  static const char *F = "zpp_pgroup_attach";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->pending)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a fetch is pending: zpp_pgroup_wait first");
  if (residual && reduction_in_flight(pg))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "residual: a zpp_pgroup_reduce_gradients of the group "
                     "is in flight and uses the residual this would "
                     "replace: attach once it has finished (its request "
                     "waited for or tested done)");
  if (residual && pg->residual_count == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "residual: given but the group keeps none (%s)",
                     !pg->cfg.error_feedback ? "cfg->error_feedback 0"
                     : pg->shard_numel == 0
                         ? "the shard is empty (shard_numel 0)"
                         : "qgz_intra_bits 16 on one node: nothing is "
                           "quantized");
  if (shard) {
    free(pg->own_shard);
    pg->own_shard = NULL;
    pg->shard = shard;
  }
  if (full) {
    drop_own_full(pg, F);
    pg->full = full;
    pg->full_attached = 1;
    pg->held = 0;
  }
  if (residual) {
    free(pg->own_residual);
    pg->own_residual = NULL;
    pg->residual = residual;
  }
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_residual_count(zpp_pgroup_t pg,
                                               size_t *count) {
  static const char *F = "zpp_pgroup_residual_count";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (count == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "count is NULL");
  *count = pg->residual_count;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_shard(zpp_pgroup_t pg, void **shard) {
  static const char *F = "zpp_pgroup_shard";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (shard == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "shard is NULL");
  if (pg->shard == NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a device-memory group: attach a shard first "
                     "(zpp_pgroup_attach)");
  *shard = pg->shard;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_fetch(zpp_pgroup_t pg, zpp_fetch_t kind,
                                      zpp_stream_t stream) {
  static const char *F = "zpp_pgroup_fetch";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (kind != ZPP_FETCH_FORWARD && kind != ZPP_FETCH_BACKWARD)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "kind %d: must be ZPP_FETCH_FORWARD or "
                     "ZPP_FETCH_BACKWARD",
                     (int)kind);
  if (pg->pending)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a fetch of this group is pending: zpp_pgroup_wait "
                     "first");
  if (pg->cfg.qwd_bits)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a qWD group (cfg->qwd_bits %d) keeps the full "
                     "parameters; refresh them with zpp_pgroup_update_params",
                     pg->cfg.qwd_bits);
  if (pg->shard == NULL || (pg->memory != ZPP_MEMORY_HOST && !pg->full))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a device-memory group: attach shard and full "
                     "buffers first (zpp_pgroup_attach)");
  size_t padded = pg->shard_numel * (size_t)pg->size;
  if (pg->full == NULL) {
    pg->own_full = malloc(padded ? padded * pg->esize : 1);
    if (pg->own_full == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "full buffer of %zu elements",
                       padded);
    pg->full = pg->own_full;
  }
  pg->held = 0;
  zpp_status_t st;
  zpp_request_t req = NULL;
  const zpp_pgroup_config_t *c = &pg->cfg;
  if (pg->hpz && kind == ZPP_FETCH_BACKWARD) {
    /* The current shard is passed so a stale secondary copy is refreshed
     * by a forward gather, never used (docs/collectives.md, hpZ). */
    st = zpp_hpz_backward_gather(pg->hpz, pg->shard, pg->full, stream, &req);
  } else if (pg->hpz) {
    st = zpp_hpz_forward_gather(pg->hpz, pg->shard, pg->full, stream, &req);
  } else if (c->qwz_bits) {
    zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
    q.bits = c->qwz_bits;
    q.block_size = c->qwz_block;
    st = zpp_qwz_allgather(pg->comm, &q, pg->shard, pg->full, pg->shard_numel,
                           c->dtype, stream, &req);
  } else {
    st = zpp_allgather(pg->comm, pg->shard, pg->full, pg->shard_numel,
                       c->dtype, stream, &req);
  }
  if (st != ZPP_OK) { /* its transfers may still write the buffer */
    if (pg->own_full && !pg->cfg.qwd_bits)
      pg->full_in_doubt = 1;
    return st;
  }
  pg->pending = req;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_wait(zpp_pgroup_t pg, void **full) {
  static const char *F = "zpp_pgroup_wait";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->pending == NULL && !pg->held)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: nothing fetched (none since the last release or "
                     "params_changed): call zpp_pgroup_fetch first");
  ZPP_CHECK(finish_pending(pg));
  if (full)
    *full = pg->full;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_release(zpp_pgroup_t pg) {
  static const char *F = "zpp_pgroup_release";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  zpp_status_t st = finish_pending(pg);
  pg->held = 0;
  if (pg->own_full && !pg->cfg.qwd_bits) { /* qWD keeps its reconstruction */
    drop_own_full(pg, F);
    pg->full = NULL;
  }
  return st;
}

ZPP_API zpp_status_t zpp_pgroup_reduce_gradients(zpp_pgroup_t pg,
                                                 const void *full_grad,
                                                 void *grad_shard,
                                                 zpp_redop_t op,
                                                 zpp_stream_t stream,
                                                 zpp_request_t *req) {
  static const char *F = "zpp_pgroup_reduce_gradients";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->shard_numel && full_grad == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "full_grad is NULL");
  if (pg->shard_numel && grad_shard == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "grad_shard is NULL");
  if (op != ZPP_OP_SUM && op != ZPP_OP_MEAN)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "op %d: must be ZPP_OP_SUM or ZPP_OP_MEAN", (int)op);
  const zpp_pgroup_config_t *c = &pg->cfg;
  if (c->qgz_bits) {
    /* (a group whose quantized stages keep no error, residual_count 0,
     * needs none: an empty shard, or qgz_intra_bits 16 on one node) */
    if (c->error_feedback && pg->residual_count && pg->residual == NULL)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                       "pg: a device-memory group with error feedback: "
                       "attach a residual first (zpp_pgroup_attach)");
    zpp_qgz_config_t q = group_qgz(pg, pg->calls++);
    q.step = pg->reductions++;
    uint64_t before = zpp_engine_last_ticket(pg->comm);
    zpp_status_t st = zpp_qgz_reduce_scatter(
        pg->comm, &q, full_grad, grad_shard, pg->shard_numel, c->dtype, op,
        c->error_feedback ? pg->residual : NULL, stream, req);
    /* only the residual is the group's (the gradients are the caller's).
     * A new ticket means the call queued a plan: kept also after a
     * failed call (a timed-out wait leaves its plan running) and for
     * blocking ones (a ticket already done costs nothing). */
    uint64_t after = zpp_engine_last_ticket(pg->comm);
    if (c->error_feedback && pg->residual_count && after != before)
      pg->reduce_ticket = after;
    return st;
  }
  return zpp_reduce_scatter(pg->comm, full_grad, grad_shard, pg->shard_numel,
                            c->dtype, op, stream, req);
}

ZPP_API zpp_status_t zpp_pgroup_params_changed(zpp_pgroup_t pg) {
  static const char *F = "zpp_pgroup_params_changed";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->pending)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a fetch is pending: the parameters must not change "
                     "while they are gathered (zpp_pgroup_wait first)");
  pg->generation++;
  pg->held = 0; /* a held full buffer is stale: zpp_pgroup_wait refuses it */
  if (pg->hpz)
    ZPP_CHECK(zpp_hpz_invalidate(pg->hpz));
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_update_params(zpp_pgroup_t pg,
                                              const float *master_shard,
                                              zpp_stream_t stream) {
  static const char *F = "zpp_pgroup_update_params";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->cfg.qwd_bits == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: the group has no qWD (cfg->qwd_bits 0): write the "
                     "shard and fetch instead");
  if (pg->pending)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a fetch or update of this group is pending: "
                     "zpp_pgroup_wait first");
  if (pg->shard_numel && master_shard == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "master_shard is NULL");
  if (pg->full == NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: a device-memory group: attach the full buffer "
                     "first (zpp_pgroup_attach)");
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  q.bits = pg->cfg.qwd_bits;
  q.block_size = pg->cfg.qwd_block;
  q.rounding = pg->cfg.rounding;
  q.seed = group_seed(pg, pg->calls++);
  zpp_request_t req = NULL;
  pg->held = 0;
  ZPP_CHECK(zpp_qwd_allgather(pg->comm, &q, master_shard, pg->full,
                              pg->shard_numel, pg->cfg.dtype, stream, &req));
  pg->pending = req;
  if (req == NULL) /* completed inline */
    pg->held = 1;
  return ZPP_OK;
}

/* ---- Recovery after a rank's death (docs/runtime.md, "Recovery") ------- */

/* The elements of the flat buffer old rank q owned, [*b, *e), clipped to
 * numel (the rest is padding, zero). */
static void owned_range(size_t numel, size_t shard, int q, size_t *b,
                        size_t *e) {
  size_t lo = (size_t)q * shard, hi = lo + shard;
  *b = lo < numel ? lo : numel;
  *e = hi < numel ? hi : numel;
}

/* [b, e) and [lo, hi) overlap in [*x, *y) (empty: *x >= *y). */
static void intersect(size_t b, size_t e, size_t lo, size_t hi, size_t *x,
                      size_t *y) {
  *x = b > lo ? b : lo;
  *y = e < hi ? e : hi;
}

/* Moves elements of esz bytes from the old layout (r, this rank's old
 * shard `mine`) into this rank's new shard `dst` of new_shard elements
 * on comm.  Old shards travel in all-gathers of chunks of at most 32 MiB
 * in all (n ranks times the chunk), in passes: in pass 0 every survivor
 * sends its own old shard; with hpz, in pass p >= 1 a survivor sends the
 * p-th lost shard it rebuilds (r->from), decoded from its copy into one
 * old shard's buffer (the others send zeros nobody reads).  Each rank
 * copies only what overlaps its new shard, so the peak is the chunks,
 * the new shard and, on a holder, one decoded old shard.  Elements of
 * lost ranks without a holder, and at or past numel, are zero. */
static const size_t rec_chunk_bytes = (size_t)32 << 20;

/* The old rank whose shard survivor k sends in pass p of repartition
 * (-1: none). */
static int pass_src(const struct pg_recovery *r, int with_copies, int k,
                    int p) {
  if (p == 0)
    return r->old_of[k];
  for (int i = 0, c = 0; with_copies && i < r->nlost; i++)
    if (r->from[i] == r->old_of[k] && ++c == p)
      return r->lost[i];
  return -1;
}

static zpp_status_t repartition(const char *func, zpp_comm_t comm,
                                const struct pg_recovery *r, size_t numel,
                                size_t new_shard, const void *mine, size_t esz,
                                zpp_hpz_t hpz, void *dst) {
  int n = 0, me = 0;
  ZPP_CHECK(zpp_comm_size(comm, &n));
  ZPP_CHECK(zpp_comm_rank(comm, &me));
  size_t lo = (size_t)me * new_shard, hi = lo + new_shard;
  if (hi > numel)
    hi = numel;
  if (new_shard)
    memset(dst, 0, new_shard * esz);
  if (r->old_shard == 0)
    return ZPP_OK;
  int passes = 1;
  for (int k = 0; k < n && hpz; k++) {
    int c = 1;
    for (int i = 0; i < r->nlost; i++)
      c += r->from[i] == r->old_of[k];
    if (c > passes)
      passes = c;
  }
  size_t chunk = rec_chunk_bytes / ((size_t)n * esz);
  if (chunk == 0)
    chunk = 1;
  if (chunk > r->old_shard)
    chunk = r->old_shard;
  size_t sb = r->old_shard * esz;
  uint8_t *buf = malloc((size_t)n * chunk * esz);
  uint8_t *dec = passes > 1 ? calloc(sb, 1) : NULL;
  if (buf == NULL || (passes > 1 && dec == NULL)) {
    free(buf);
    free(dec);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                     "re-partition buffers of %zu and %zu bytes",
                     (size_t)n * chunk * esz, passes > 1 ? sb : (size_t)0);
  }
  zpp_status_t st = ZPP_OK;
  int gather_failed = 0;
  for (int p = 0; p < passes && st == ZPP_OK; p++) {
    int q = pass_src(r, hpz != NULL, me, p);
    const uint8_t *src = mine;
    if (p > 0) {
      memset(dec, 0, sb);
      if (q >= 0) {
        int held = ZPP_HPZ_COPY_NONE;
        st = zpp_hpz_copy_of(hpz, q, dec, &held);
        if (st != ZPP_OK)
          break;
        if (held != ZPP_HPZ_COPY_CURRENT) {
          st = zpp_error(ZPP_ERR_INTERNAL, func,
                         "the copy of old rank %d's shard changed during "
                         "recovery",
                         q);
          break;
        }
      }
      src = dec;
    }
    for (size_t off = 0; off < r->old_shard; off += chunk) {
      size_t c = r->old_shard - off < chunk ? r->old_shard - off : chunk;
      st = zpp_allgather(comm, src + off * esz, buf, c * esz, ZPP_UINT8, NULL,
                         NULL);
      gather_failed = st != ZPP_OK;
      if (gather_failed)
        break;
      for (int k = 0; k < n; k++) {
        int qk = pass_src(r, hpz != NULL, k, p);
        if (qk < 0)
          continue;
        size_t gb = (size_t)qk * r->old_shard + off, x, y;
        intersect(gb, gb + c, lo, hi, &x, &y);
        if (x < y)
          memcpy((uint8_t *)dst + (x - lo) * esz,
                 buf + ((size_t)k * c + (x - gb)) * esz, (y - x) * esz);
      }
    }
  }
  if (gather_failed) {
    /* zpp_comm.h: a failed collective's buffers stay in use until
     * zpp_comm_destroy returns */
    ZPP_WARN(ZPP_SUBSYS_COLL,
             "%s: a failed re-partition all-gather's buffers, %zu bytes, "
             "are left allocated (leaked)",
             func, (size_t)n * chunk * esz + (dec ? sb : 0));
    return st;
  }
  free(buf);
  free(dec);
  return st;
}

/* What each survivor tells the others: its old rank and layout (which
 * must agree), then one byte per old rank: what its hpZ copy holds of
 * that rank's shard (ZPP_HPZ_COPY_*). */
enum {
  REC_OLD_RANK,
  REC_GENERATION,
  REC_NUMEL,
  REC_SHARD,
  REC_OLD_SIZE,
  REC_NTENSORS,
  REC_ESIZE,
  REC_HPZ,
  REC_ID,
  REC_WORDS
};

/* Why no survivor holds a current copy of old rank q's shard. */
static zpp_status_t data_lost(const char *func, zpp_pgroup_t old,
                              const int *new_rank_of, const uint64_t *recs,
                              size_t words, int q, size_t b, size_t e) {
  char why[512];
  int nnodes = 1, uniform = 1, lq = 0, nq = 0;
  (void)zpp_comm_nnodes(old->comm, &nnodes);
  (void)zpp_comm_topo_uniform(old->comm, &uniform);
  (void)zpp_comm_local_rank_of(old->comm, q, &lq);
  (void)zpp_comm_node_of(old->comm, q, &nq);
  if (!old->cfg.hpz) {
    snprintf(why, sizeof why, "cfg->hpz 0: no secondary copy is kept");
  } else if (nnodes == 1) {
    snprintf(why, sizeof why,
             "one node: the only hpZ copy of a shard is on its node");
  } else if (!uniform) {
    snprintf(why, sizeof why,
             "uneven nodes: hpZ keeps no secondary copy (backward gathers "
             "run over the world)");
  } else {
    /* the holders: local rank lq on every other node */
    size_t len = (size_t)snprintf(why, sizeof why,
                                  "its copies are on the ranks of local rank "
                                  "%d of the other nodes:",
                                  lq);
    for (int w = 0; w < old->size && len < sizeof why; w++) {
      int l = -1, nd = -1;
      (void)zpp_comm_local_rank_of(old->comm, w, &l);
      (void)zpp_comm_node_of(old->comm, w, &nd);
      if (l != lq || w == q)
        continue;
      const char *state = "dead";
      if (new_rank_of[w] >= 0) {
        const uint8_t *hold =
            (const uint8_t *)(recs + (size_t)new_rank_of[w] * words +
                              REC_WORDS);
        state = hold[q] == ZPP_HPZ_COPY_STALE
                    ? "stale (the parameters changed after the last forward "
                      "gather)"
                    : "none (no forward gather completed)";
      }
      len += (size_t)snprintf(why + len, sizeof why - len,
                              " old rank %d (node %d) %s;", w, nd, state);
    }
  }
  return zpp_error(ZPP_ERR_DATA_LOST, func,
                   "old rank %d (node %d) died and its shard, elements [%zu, "
                   "%zu) of the group's %zu, has no current copy on a "
                   "survivor: %s",
                   q, nq, b, e, old->numel, why);
}

ZPP_API zpp_status_t zpp_pgroup_recover(zpp_pgroup_t old, zpp_comm_t newcomm,
                                        const int *new_rank_of,
                                        zpp_pgroup_t *out,
                                        zpp_pgroup_recovery_t *report) {
  static const char *F = "zpp_pgroup_recover";
  zpp_status_t st = ZPP_OK;
  if (old == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "old is NULL");
  if (newcomm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "newcomm is NULL");
  if (new_rank_of == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "new_rank_of is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "out is NULL");
  if (report != NULL && report->struct_size < sizeof(zpp_pgroup_recovery_t))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "report->struct_size %zu: must be %zu (use "
                     "ZPP_PGROUP_RECOVERY_INIT)",
                     report->struct_size, sizeof(zpp_pgroup_recovery_t));
  if (newcomm == old->comm)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "newcomm is the old group's communicator: pass the one "
                     "zpp_comm_shrink returned");
  if (old->memory != ZPP_MEMORY_HOST)
    return zpp_error(ZPP_ERR_UNSUPPORTED, F,
                     "old: a device-memory group; recovery reads host "
                     "memory only");
  if (old->cfg.qwd_bits)
    return zpp_error(ZPP_ERR_UNSUPPORTED, F,
                     "old: a qWD group (cfg->qwd_bits %d): not supported",
                     old->cfg.qwd_bits);
  int nr = 0, nn = 0, W = old->size;
  ZPP_CHECK(zpp_comm_rank(newcomm, &nr));
  ZPP_CHECK(zpp_comm_size(newcomm, &nn));
  /* new_rank_of as zpp_comm_shrink makes it: survivors 0, 1, ... in old
   * rank order, me among them */
  int next = 0;
  for (int q = 0; q < W; q++) {
    if (new_rank_of[q] < 0)
      continue;
    if (new_rank_of[q] != next)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                       "new_rank_of[%d] %d: zpp_comm_shrink numbers the "
                       "survivors 0, 1, ... in old rank order (want %d)",
                       q, new_rank_of[q], next);
    next++;
  }
  if (next != nn || new_rank_of[old->rank] != nr)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "new_rank_of: names %d survivors with old rank %d as "
                     "new rank %d, but newcomm has %d ranks and this is new "
                     "rank %d",
                     next, old->rank, new_rank_of[old->rank], nn, nr);
  /* a fetch that failed with the old communicator is over */
  (void)finish_pending(old);

  struct pg_recovery *r = calloc(1, sizeof *r);
  size_t words = REC_WORDS + ((size_t)W + 7) / 8;
  uint64_t *recs = calloc((size_t)nn * words, sizeof(uint64_t));
  uint64_t *mine = calloc(words, sizeof(uint64_t));
  size_t *sizes = malloc(((size_t)old->ntensors + 1) * sizeof(size_t));
  zpp_pgroup_t ng = NULL;
  if (r == NULL || recs == NULL || mine == NULL || sizes == NULL) {
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "recovery records");
    goto err;
  }
  r->old_size = W;
  r->old_rank = old->rank;
  r->old_shard = old->shard_numel;
  r->old_of = malloc((size_t)nn * sizeof(int));
  r->lost = malloc(((size_t)W - (size_t)nn + 1) * sizeof(int));
  r->from = malloc(((size_t)W - (size_t)nn + 1) * sizeof(int));
  if (r->old_of == NULL || r->lost == NULL || r->from == NULL) {
    st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, F, "recovery records");
    goto err;
  }
  for (int q = 0; q < W; q++) {
    if (new_rank_of[q] >= 0)
      r->old_of[new_rank_of[q]] = q;
    else
      r->lost[r->nlost++] = q;
  }

  /* every survivor's layout and what its hpZ copy holds of each lost rank */
  mine[REC_OLD_RANK] = (uint64_t)old->rank;
  mine[REC_GENERATION] = old->generation;
  mine[REC_NUMEL] = old->numel;
  mine[REC_SHARD] = old->shard_numel;
  mine[REC_OLD_SIZE] = (uint64_t)W;
  mine[REC_NTENSORS] = (uint64_t)old->ntensors;
  mine[REC_ESIZE] = old->esize;
  mine[REC_HPZ] = old->hpz != NULL;
  mine[REC_ID] = old->id;
  for (int i = 0; i < r->nlost && old->hpz; i++) {
    int held = ZPP_HPZ_COPY_NONE;
    ZPP_CHECK_GOTO(zpp_hpz_copy_of(old->hpz, r->lost[i], NULL, &held), st, err);
    ((uint8_t *)(mine + REC_WORDS))[r->lost[i]] = (uint8_t)held;
  }
  st = zpp_allgather(newcomm, mine, recs, words * sizeof(uint64_t), ZPP_UINT8,
                     NULL, NULL);
  if (st != ZPP_OK) { /* zpp_comm.h: its buffers stay in use until
                         zpp_comm_destroy returns */
    ZPP_WARN(ZPP_SUBSYS_COLL,
             "%s: the failed all-gather's buffers, %zu bytes, are left "
             "allocated (leaked)",
             F, (nn + (size_t)1) * words * sizeof(uint64_t));
    recs = mine = NULL;
    goto err;
  }
  static const char *what[REC_WORDS] = {
      "old rank",           "generation", "numel",        "shard_numel",
      "old world size",     "ntensors",   "element size", "hpz",
      "id (creation order)"};
  for (int k = 0; k < nn; k++) {
    const uint64_t *o = recs + (size_t)k * words;
    if (o[REC_OLD_RANK] != (uint64_t)r->old_of[k]) {
      st = zpp_error(ZPP_ERR_MISMATCH, F,
                     "new rank %d says it was old rank %llu, new_rank_of "
                     "here says old rank %d: the survivors' maps differ",
                     k, (unsigned long long)o[REC_OLD_RANK], r->old_of[k]);
      goto err;
    }
    for (int wd = REC_GENERATION; wd < REC_WORDS; wd++)
      if (o[wd] != mine[wd]) {
        st = zpp_error(ZPP_ERR_MISMATCH, F,
                       "old rank %d's group has %s %llu, old rank %d's %llu "
                       "(%s)",
                       r->old_of[k], what[wd], (unsigned long long)o[wd],
                       old->rank, (unsigned long long)mine[wd],
                       wd == REC_GENERATION
                           ? "the parameters changed on some survivors and "
                             "not on others before the failure"
                           : "not the same group on every survivor");
        goto err;
      }
  }

  /* who rebuilds each lost shard: the lowest survivor with a current copy */
  size_t rebuilt = 0;
  for (int i = 0; i < r->nlost; i++) {
    int q = r->lost[i];
    size_t b, e;
    owned_range(old->numel, old->shard_numel, q, &b, &e);
    r->from[i] = -1;
    if (b >= e)
      continue; /* padding only: zero */
    for (int k = 0; k < nn && r->from[i] < 0; k++)
      if (((const uint8_t *)(recs + (size_t)k * words + REC_WORDS))[q] ==
          ZPP_HPZ_COPY_CURRENT)
        r->from[i] = r->old_of[k];
    if (r->from[i] < 0) {
      st = data_lost(F, old, new_rank_of, recs, words, q, b, e);
      goto err;
    }
    rebuilt += e - b;
  }

  /* the same tensors and configuration over the survivors */
  for (int t = 0; t < old->ntensors; t++)
    sizes[t] = old->offsets[t + 1] - old->offsets[t];
  ZPP_CHECK_GOTO(
      zpp_pgroup_create(newcomm, &old->cfg, sizes, old->ntensors, &ng), st,
      err);
  ng->generation = old->generation;
  /* the lost shards come from their holders' copies */
  ZPP_CHECK_GOTO(repartition(F, newcomm, r, old->numel, ng->shard_numel,
                             old->shard, old->esize, old->hpz, ng->shard),
                 st, err);

  /* what this rank's new shard lost */
  size_t lo = (size_t)nr * ng->shard_numel, hi = lo + ng->shard_numel;
  size_t state_lost = 0;
  int quantized = old->cfg.hpz && old->cfg.qwz_bits;
  for (int i = 0; i < r->nlost; i++) {
    size_t b, e, x, y;
    owned_range(old->numel, old->shard_numel, r->lost[i], &b, &e);
    intersect(b, e, lo, hi, &x, &y);
    if (x < y)
      state_lost += y - x;
    if (nr == 0 && b < e)
      ZPP_WARN(ZPP_SUBSYS_COLL,
               "zpp_pgroup_recover: group %llu: old rank %d died; its shard, "
               "elements [%zu, %zu), rebuilt from old rank %d's hpZ copy (%s)"
               "; their optimizer state is lost; %d -> %d ranks",
               (unsigned long long)old->id, r->lost[i], b, e, r->from[i],
               quantized ? "qwZ-quantized: within its bound" : "exact", W, nn);
  }
  if (report != NULL) {
    zpp_pgroup_recovery_t rep = ZPP_PGROUP_RECOVERY_INIT;
    rep.old_world_size = W;
    rep.new_world_size = nn;
    rep.old_rank = old->rank;
    rep.lost_ranks = r->nlost;
    rep.exact = !(quantized && rebuilt > 0);
    rep.rebuilt_numel = rebuilt;
    rep.state_lost_numel = state_lost;
    rep.residual_floats_dropped = old->residual_count;
    rep.generation = old->generation;
    *report = rep;
  }
  ng->rec = r;
  r = NULL;
  *out = ng;
  ng = NULL;
err:
  if (ng != NULL)
    zpp_pgroup_destroy(ng);
  free(sizes);
  free(mine);
  free(recs);
  recovery_free(r);
  return st;
}

ZPP_API zpp_status_t zpp_pgroup_lost(zpp_pgroup_t pg, int i, int *old_rank,
                                     int *from_rank, size_t *begin,
                                     size_t *end) {
  static const char *F = "zpp_pgroup_lost";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->rec == NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: not made by zpp_pgroup_recover");
  if (i < 0 || i >= pg->rec->nlost)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F, "i %d: must be in [0, %d)", i,
                     pg->rec->nlost);
  size_t b, e;
  owned_range(pg->numel, pg->rec->old_shard, pg->rec->lost[i], &b, &e);
  if (old_rank)
    *old_rank = pg->rec->lost[i];
  if (from_rank)
    *from_rank = pg->rec->from[i];
  if (begin)
    *begin = b;
  if (end)
    *end = e;
  return ZPP_OK;
}

ZPP_API zpp_status_t zpp_pgroup_recover_state(zpp_pgroup_t pg,
                                              const void *old_state,
                                              void *new_state,
                                              size_t elem_bytes) {
  static const char *F = "zpp_pgroup_recover_state";
  if (pg == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F, "pg is NULL");
  if (pg->rec == NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F,
                     "pg: not made by zpp_pgroup_recover");
  if (elem_bytes == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, F, "elem_bytes 0: must be >= 1");
  if (pg->rec->old_shard && old_state == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F,
                     "old_state is NULL (old shard_numel %zu)",
                     pg->rec->old_shard);
  if (pg->shard_numel && new_state == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, F,
                     "new_state is NULL (shard_numel %zu)", pg->shard_numel);
  if (pg->rec->old_shard > SIZE_MAX / elem_bytes / (size_t)pg->size ||
      pg->shard_numel > SIZE_MAX / elem_bytes)
    return zpp_error(ZPP_ERR_OVERFLOW, F,
                     "elem_bytes %zu: the state's size overflows size_t",
                     elem_bytes);
  return repartition(F, pg->comm, pg->rec, pg->numel, pg->shard_numel,
                     old_state, elem_bytes, NULL, new_state);
}
