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
};

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
  return st;
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
  free(pg->own_full);
  free(pg->own_residual);
  free(pg->own_shard);
  free(pg->offsets);
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
    free(pg->own_full);
    pg->own_full = NULL;
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
  if (st != ZPP_OK)
    return st;
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
    free(pg->own_full);
    pg->own_full = NULL;
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
