/*
 * zpp-bench --coll allgather: the full-precision all-gather (zpp_allgather,
 * named after the dtype: fp32, fp16 or bf16) against qwZ
 * (zpp_qwz_allgather, symmetric, --block elements per scale).
 *
 * Variants: <dtype> (baseline), <dtype>-flat (the same on a communicator
 * with the flat algorithm, the ring: what zpp ran before the hierarchical
 * default), qwz8, qwz4, mpi (Open MPI's own MPI_Allgather of the same
 * input and output buffers, MPI_BYTE; not in the default list).
 * Size: the bytes of one rank's shard in the data dtype; count = size /
 * dtype size elements per rank; the output holds world * count elements.
 * mpi-han, mpi-best: the same MPI_Allgather on a communicator served by
 * HAN, or by each of tuned's algorithms in turn, the fastest named in the
 * row (perf/bench_mpi_peers.c).
 */
#include "zpp_bench_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { AG_BASE = 0, AG_QWZ = 1, AG_MPI = 2 };

static void ag_default_variants(zpp_dtype_t dtype, char *buf, size_t len) {
  snprintf(buf, len, "%s,qwz8,qwz4", zpp_dtype_name(dtype));
}

static int ag_parse_variant(const char *tok, zpp_dtype_t dtype,
                            zpp_bench_variant_t *v, char *err, size_t errlen) {
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", tok);
  if (strcmp(tok, zpp_dtype_name(dtype)) == 0) {
    v->baseline = 1;
    v->kind = AG_BASE;
    return 0;
  }
  if (strncmp(tok, zpp_dtype_name(dtype), strlen(zpp_dtype_name(dtype))) ==
          0 &&
      strcmp(tok + strlen(zpp_dtype_name(dtype)), "-flat") == 0) {
    v->kind = AG_BASE;
    v->flat = 1;
    return 0;
  }
  if (strncmp(tok, zpp_dtype_name(dtype), strlen(zpp_dtype_name(dtype))) ==
          0 &&
      strcmp(tok + strlen(zpp_dtype_name(dtype)), "-hier") == 0) {
    v->kind = AG_BASE;
    v->hier = 1;
    return 0;
  }
  if (strcmp(tok, "qwz8") == 0 || strcmp(tok, "qwz4") == 0) {
    v->kind = AG_QWZ;
    v->bits = tok[3] - '0';
    return 0;
  }
  if (strcmp(tok, "mpi") == 0 || strcmp(tok, "mpi-han") == 0 ||
      strcmp(tok, "mpi-best") == 0) {
    v->kind = AG_MPI;
    v->foreign = 1;
    v->peer = tok[3] == '\0'   ? ZPP_BENCH_PEER_DEFAULT
              : tok[4] == 'h' ? ZPP_BENCH_PEER_HAN
                              : ZPP_BENCH_PEER_BEST;
    return 0;
  }
  snprintf(err, errlen,
           "must be %s (baseline), %s-flat, %s-hier, qwz8, qwz4, mpi, "
           "mpi-han or mpi-best",
           zpp_dtype_name(dtype), zpp_dtype_name(dtype),
           zpp_dtype_name(dtype));
  return -1;
}

static size_t ag_count_of(size_t bytes, size_t ds, int world) {
  (void)world;
  return bytes / ds;
}

static size_t ag_bytes_of(size_t count, size_t ds, int world) {
  (void)world;
  return count * ds;
}

static size_t ag_in_elems(size_t count, int world) {
  (void)world;
  return count;
}

static size_t ag_out_elems(size_t count, int world) {
  return count * (size_t)world;
}

static double ag_algbw_bytes(size_t bytes, int world) {
  return (double)bytes * world;
}

static double ag_busbw_factor(int world) { return (double)(world - 1) / world; }

static zpp_status_t ag_setup(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  c->state = NULL;
  return c->v->kind == AG_MPI ? zpp_bench_mpi_case_setup(ctx, c) : ZPP_OK;
}

static zpp_status_t ag_run(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  if (c->v->kind == AG_BASE)
    return zpp_allgather(zpp_bench_comm_of(ctx, c->v), c->in->dev,
                         c->out->dev, c->count, o->dtype, NULL, NULL);
  if (c->v->kind == AG_MPI)
    return zpp_bench_mpi_allgather(ctx, c, c->count * zpp_dtype_size(o->dtype));
  q.bits = c->v->bits;
  q.block_size = o->block;
  return zpp_qwz_allgather(ctx->comm, &q, c->in->dev, c->out->dev, c->count,
                           o->dtype, NULL, NULL);
}

void zpp_bench_check_gathered(const zpp_bench_ctx_t *ctx,
                              const zpp_bench_case_t *c, int bits,
                              const void *equal, zpp_bench_check_t *chk) {
  const zpp_bench_opts_t *o = ctx->opt;
  size_t block = o->block, count = c->count;
  size_t nb = (count + block - 1) / block;
  size_t stride = zpp_bench_block_stride(c->bytes), b, i;
  double *x = malloc((block < count ? block : count + 1) * sizeof *x);
  int r;
  if (x == NULL) { /* cannot check: say so by failing every element */
    chk->wrong += (uint64_t)count * (uint64_t)ctx->world;
    return;
  }
  for (r = 0; r < ctx->world; r++)
    for (b = 0; b < nb; b++) {
      size_t b0 = b * block, len = count - b0 < block ? count - b0 : block;
      double scale = 0, range = 0;
      if (!zpp_bench_block_checked(b, nb, stride))
        continue;
      for (i = 0; i < len; i++)
        x[i] = zpp_bench_value(o->seed, r, b0 + i, o->dtype);
      if (bits > 0)
        zpp_bench_block_params(x, len, bits, &scale, &range);
      for (i = 0; i < len; i++) {
        size_t at = (size_t)r * count + b0 + i;
        double got = zpp_bench_load(c->out->host, at, o->dtype);
        int ok =
            bits > 0
                ? fabs(got - x[i]) <=
                      zpp_bench_quant_bound(scale, range, x[i], got, o->dtype)
                : zpp_bench_equal_bits(c->out->host, at, o->dtype, x[i]);
        if (equal != NULL)
          ok = ok && zpp_bench_same_bits(c->out->host, equal, at, o->dtype);
        zpp_bench_check_add(chk, got, x[i], ok);
      }
    }
  free(x);
}

static void ag_check(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                     zpp_bench_check_t *chk) {
  zpp_bench_check_gathered(ctx, c, c->v->kind == AG_QWZ ? c->v->bits : 0, NULL,
                           chk);
}

static void ag_teardown(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  (void)ctx;
  (void)c;
}

const zpp_bench_coll_t zpp_bench_allgather = {
    "allgather",
    "size = bytes of one rank's SHARD in the data dtype (count = size / "
    "dtype size elements per rank; output world * count)",
    "algbw = size * world / time; busbw = algbw * (world-1)/world "
    "(nccl-tests all_gather)",
    "<dtype> (zpp_allgather, the baseline), <dtype>-flat (zpp_allgather "
    "with the flat ring, ZPP_ALGORITHM_FLAT), qwz8, qwz4 (zpp_qwz_allgather, "
    "symmetric INT8/INT4, --block elements per scale), mpi (Open MPI's "
    "MPI_Allgather on the same buffers), mpi-han (the same, HAN), "
    "mpi-best (the same, the fastest algorithm of tuned)",
    "baseline and mpi*: bitwise equal to every rank's input; qwzN: |out - in| "
    "within the per-element bound of docs/format.md for the input block",
    ag_default_variants,
    ag_parse_variant,
    ag_count_of,
    ag_bytes_of,
    ag_in_elems,
    ag_out_elems,
    ag_algbw_bytes,
    ag_busbw_factor,
    ag_setup,
    ag_run,
    ag_check,
    ag_teardown,
};
