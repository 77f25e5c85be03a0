/*
 * zpp-bench --coll hpz-gather: hpZ's forward gather (a world gather that
 * also keeps the node's secondary copy) and backward gather (a node-local
 * gather of the secondary copy: no inter-node bytes) against the
 * full-precision all-gather of the same shard.
 *
 * Variants: <dtype> (zpp_allgather, the baseline), hpz-fwdN and hpz-bwdN
 * (N = 8 or 4: qwZ-quantized hpZ, symmetric, --block elements per scale),
 * hpz-fwd-<dtype> and hpz-bwd-<dtype> (hpZ unquantized).
 * A backward variant runs one untimed forward gather in its setup, then
 * times backward gathers of that same secondary copy (the parameters do not
 * change between iterations, as between the backward passes of one step).
 * Size: as allgather, the bytes of one rank's shard.
 */
#include "zpp_bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HPZ_BASE = 0, HPZ_FWD = 1, HPZ_BWD = 2 };

typedef struct {
  zpp_hpz_t h;
  int pass_send;       /* uneven nodes: backward needs the primary shard */
  zpp_bench_buf_t fwd; /* backward variants: the forward gather's output */
} hpz_state_t;

static void hpz_default_variants(zpp_dtype_t dtype, char *buf, size_t len) {
  snprintf(buf, len, "%s,hpz-fwd8,hpz-bwd8,hpz-fwd4,hpz-bwd4",
           zpp_dtype_name(dtype));
}

static int hpz_parse_variant(const char *tok, zpp_dtype_t dtype,
                             zpp_bench_variant_t *v, char *err, size_t errlen) {
  const char *dt = zpp_dtype_name(dtype);
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", tok);
  if (strcmp(tok, dt) == 0) {
    v->baseline = 1;
    v->kind = HPZ_BASE;
    return 0;
  }
  if (strncmp(tok, "hpz-fwd", 7) == 0 || strncmp(tok, "hpz-bwd", 7) == 0) {
    const char *rest = tok + 7;
    v->kind = tok[4] == 'f' ? HPZ_FWD : HPZ_BWD;
    if (strcmp(rest, "8") == 0 || strcmp(rest, "4") == 0) {
      v->bits = rest[0] - '0';
      return 0;
    }
    if (rest[0] == '-' && strcmp(rest + 1, dt) == 0) {
      v->bits = 0; /* unquantized */
      return 0;
    }
  }
  snprintf(err, errlen,
           "must be %s (baseline), hpz-fwd8, hpz-bwd8, hpz-fwd4, hpz-bwd4, "
           "hpz-fwd-%s or hpz-bwd-%s",
           dt, dt, dt);
  return -1;
}

static size_t hpz_count_of(size_t bytes, size_t ds, int world) {
  (void)world;
  return bytes / ds;
}

static size_t hpz_bytes_of(size_t count, size_t ds, int world) {
  (void)world;
  return count * ds;
}

static size_t hpz_in_elems(size_t count, int world) {
  (void)world;
  return count;
}

static size_t hpz_out_elems(size_t count, int world) {
  return count * (size_t)world;
}

static double hpz_algbw_bytes(size_t bytes, int world) {
  return (double)bytes * world;
}

static double hpz_busbw_factor(int world) {
  return (double)(world - 1) / world;
}

static zpp_status_t hpz_setup(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_hpz_config_t cfg = ZPP_HPZ_CONFIG_INIT;
  zpp_hpz_info_t info = ZPP_HPZ_INFO_INIT;
  hpz_state_t *s;
  zpp_status_t st;
  c->state = NULL;
  if (c->v->kind == HPZ_BASE)
    return ZPP_OK;
  s = calloc(1, sizeof *s);
  if (s == NULL)
    return ZPP_ERR_OUT_OF_MEMORY;
  c->state = s;
  cfg.quantized = c->v->bits > 0;
  if (cfg.quantized) {
    cfg.quant.bits = c->v->bits;
    cfg.quant.block_size = o->block;
  }
  st = zpp_hpz_create(ctx->comm, &cfg, c->count, o->dtype, &s->h);
  if (st != ZPP_OK)
    return st;
  st = zpp_hpz_get_info(s->h, &info);
  if (st != ZPP_OK)
    return st;
  s->pass_send = !info.hierarchical;
  if (c->v->kind == HPZ_BWD) {
    st = zpp_bench_buf_alloc(ctx, c->out->bytes, &s->fwd);
    if (st != ZPP_OK)
      return st;
    st = zpp_hpz_forward_gather(s->h, c->in->dev, s->fwd.dev, NULL, NULL);
    if (st != ZPP_OK)
      return st;
    if (o->check)
      st = zpp_bench_buf_download(ctx, &s->fwd);
  }
  return st;
}

static zpp_status_t hpz_run(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  hpz_state_t *s = (hpz_state_t *)c->state;
  switch (c->v->kind) {
  case HPZ_FWD:
    return zpp_hpz_forward_gather(s->h, c->in->dev, c->out->dev, NULL, NULL);
  case HPZ_BWD:
    /* Even nodes: NULL, so a stale copy fails (ZPP_ERR_STALE) instead of
     * silently refreshing with a world gather. */
    return zpp_hpz_backward_gather(s->h, s->pass_send ? c->in->dev : NULL,
                                   c->out->dev, NULL, NULL);
  default:
    return zpp_allgather(ctx->comm, c->in->dev, c->out->dev, c->count,
                         ctx->opt->dtype, NULL, NULL);
  }
}

/* Forward: as qwZ (or bitwise for unquantized hpZ).  Backward: the same,
 * and bitwise equal to the forward gather's output (zpp_coll.h). */
static void hpz_check(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                      zpp_bench_check_t *chk) {
  hpz_state_t *s = (hpz_state_t *)c->state;
  zpp_bench_check_gathered(ctx, c, c->v->bits,
                           c->v->kind == HPZ_BWD ? s->fwd.host : NULL, chk);
}

static void hpz_teardown(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  hpz_state_t *s = (hpz_state_t *)c->state;
  if (s == NULL)
    return;
  zpp_bench_buf_free(ctx, &s->fwd);
  zpp_hpz_destroy(s->h);
  free(s);
  c->state = NULL;
}

const zpp_bench_coll_t zpp_bench_hpz = {
    "hpz-gather",
    "size = bytes of one rank's SHARD in the data dtype (count = size / "
    "dtype size elements per rank; output world * count)",
    "algbw = size * world / time; busbw = algbw * (world-1)/world "
    "(nccl-tests all_gather), for forward and backward gathers alike",
    "<dtype> (zpp_allgather, the baseline), hpz-fwd8, hpz-bwd8, hpz-fwd4, "
    "hpz-bwd4 (quantized hpZ, symmetric, --block elements per scale), "
    "hpz-fwd-<dtype>, hpz-bwd-<dtype> (unquantized hpZ); a bwd variant runs "
    "one untimed forward gather first, then times backward gathers",
    "baseline and unquantized hpZ: bitwise equal to every rank's input; "
    "quantized: within the per-element bound of docs/format.md; bwd: also "
    "bitwise equal to the forward gather's output",
    hpz_default_variants,
    hpz_parse_variant,
    hpz_count_of,
    hpz_bytes_of,
    hpz_in_elems,
    hpz_out_elems,
    hpz_algbw_bytes,
    hpz_busbw_factor,
    hpz_setup,
    hpz_run,
    hpz_check,
    hpz_teardown,
};
