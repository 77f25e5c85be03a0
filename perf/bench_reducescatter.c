/*
 * zpp-bench --coll reducescatter: the full-precision reduce-scatter
 * (zpp_reduce_scatter, named after the dtype) against hierarchical qgZ
 * (zpp_qgz_reduce_scatter, symmetric, --block elements per scale, no error
 * feedback), with --op sum or mean.
 *
 * Variants: <dtype> (baseline), <dtype>-flat (the same on a communicator
 * with the flat algorithm, pairwise), qgz4 (INT4 in and across nodes), qgz8
 * (INT8 both), qgzA-B (A bits inside the node, B across: qgz8-4 is the
 * ZeRO++ setting; A = 16: ZPP_QGZ_INTRA_RAW, the dtype inside the node,
 * not quantized), mpi (Open MPI's own MPI_Reduce_scatter_block on the same
 * buffers: zpp_bench_mpi_reduce_scatter; not in the default list), mpi-han
 * and mpi-best (the same on a communicator with HAN on top, which has no
 * reduce_scatter_block in Open MPI 4.1, or with each algorithm of tuned in
 * turn, the fastest named in the row: perf/bench_mpi_peers.c).
 * Size: the bytes of one rank's INPUT in the data dtype; count = size /
 * dtype size / world elements per rank in the output.
 */
#include "zpp_bench_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RS_BASE = 0, RS_QGZ = 1, RS_MPI = 2 };

static void rs_default_variants(zpp_dtype_t dtype, char *buf, size_t len) {
  snprintf(buf, len, "%s,qgz4,qgz8,qgz8-4", zpp_dtype_name(dtype));
}

static int bits_ok(int b) { return b == 4 || b == 8; }

static int rs_parse_variant(const char *tok, zpp_dtype_t dtype,
                            zpp_bench_variant_t *v, char *err, size_t errlen) {
  int a = 0, b = 0, n = 0;
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", tok);
  if (strcmp(tok, zpp_dtype_name(dtype)) == 0) {
    v->baseline = 1;
    v->kind = RS_BASE;
    return 0;
  }
  if (strcmp(tok, "mpi") == 0 || strcmp(tok, "mpi-han") == 0 ||
      strcmp(tok, "mpi-best") == 0) {
    v->kind = RS_MPI;
    v->foreign = 1;
    v->peer = tok[3] == '\0'   ? ZPP_BENCH_PEER_DEFAULT
              : tok[4] == 'h' ? ZPP_BENCH_PEER_HAN
                              : ZPP_BENCH_PEER_BEST;
    return 0;
  }
  if (strncmp(tok, zpp_dtype_name(dtype), strlen(zpp_dtype_name(dtype))) ==
          0 &&
      strcmp(tok + strlen(zpp_dtype_name(dtype)), "-flat") == 0) {
    v->kind = RS_BASE;
    v->flat = 1;
    return 0;
  }
  if (strncmp(tok, zpp_dtype_name(dtype), strlen(zpp_dtype_name(dtype))) ==
          0 &&
      strcmp(tok + strlen(zpp_dtype_name(dtype)), "-hier") == 0) {
    v->kind = RS_BASE;
    v->hier = 1;
    return 0;
  }
  if (sscanf(tok, "qgz%d-%d%n", &a, &b, &n) == 2 && tok[n] == '\0' &&
      (bits_ok(a) || a == ZPP_QGZ_INTRA_RAW) && bits_ok(b)) {
    v->kind = RS_QGZ;
    v->bits = a;
    v->bits2 = b;
    return 0;
  }
  if (sscanf(tok, "qgz%d%n", &a, &n) == 1 && tok[n] == '\0' && bits_ok(a)) {
    v->kind = RS_QGZ;
    v->bits = v->bits2 = a;
    return 0;
  }
  snprintf(err, errlen,
           "must be %s (baseline), %s-flat, %s-hier, qgz4, qgz8, qgzA-B "
           "with A in {4, 8, 16} and B in {4, 8} (A bits inside the node, "
           "16: not quantized; B across nodes), mpi, mpi-han or mpi-best",
           zpp_dtype_name(dtype), zpp_dtype_name(dtype),
           zpp_dtype_name(dtype));
  return -1;
}

static size_t rs_count_of(size_t bytes, size_t ds, int world) {
  return bytes / ds / (size_t)world;
}

static size_t rs_bytes_of(size_t count, size_t ds, int world) {
  return count * ds * (size_t)world;
}

static size_t rs_in_elems(size_t count, int world) {
  return count * (size_t)world;
}

static size_t rs_out_elems(size_t count, int world) {
  (void)world;
  return count;
}

static double rs_algbw_bytes(size_t bytes, int world) {
  (void)world;
  return (double)bytes;
}

static double rs_busbw_factor(int world) { return (double)(world - 1) / world; }

static zpp_status_t rs_setup(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  c->state = NULL;
  return c->v->kind == RS_MPI ? zpp_bench_mpi_case_setup(ctx, c) : ZPP_OK;
}

static zpp_status_t rs_run(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
  if (c->v->kind == RS_BASE)
    return zpp_reduce_scatter(zpp_bench_comm_of(ctx, c->v),
                              c->in->dev, c->out->dev, c->count, o->dtype,
                              o->op, NULL, NULL);
  if (c->v->kind == RS_MPI)
    return zpp_bench_mpi_reduce_scatter(ctx, c, o->dtype, o->op);
  q.intra_bits = c->v->bits;
  q.inter_bits = c->v->bits2;
  q.block_size = o->block;
  return zpp_qgz_reduce_scatter(ctx->comm, &q, c->in->dev, c->out->dev,
                                c->count, o->dtype, o->op, NULL, NULL, NULL);
}

/* Baseline: the transport contract of zpp_reduce_scatter, exactly
 * (docs/collectives.md).  Flat: an fp32 accumulator in rank order, rounded
 * once to dtype.  Hierarchical: each node's fp32 sum in rank order rounded
 * to dtype (fp16: kept in fp32, its wire dtype), then those in node order
 * in fp32, rounded once.  MEAN divides
 * the fp32 sum by the world size before that last rounding. */
static void rs_check_base(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                          size_t b0, size_t len, zpp_bench_check_t *chk) {
  const zpp_bench_opts_t *o = ctx->opt;
  size_t base = (size_t)ctx->rank * c->count, i;
  int r, k;
  int hier = c->v->flat   ? 0
             : c->v->hier ? ctx->hier_capable
                          : ctx->hier;
  for (i = 0; i < len; i++) {
    float acc = 0.0f;
    double ref = 0.0, want, got;
    for (r = 0; r < ctx->world; r++)
      ref += zpp_bench_value(o->seed, r, base + b0 + i, o->dtype);
    for (k = 0; k < (hier ? ctx->nnodes : 1); k++) {
      float part = 0.0f;
      int first = 1;
      for (r = 0; r < ctx->world; r++) {
        double x;
        if (hier && ctx->node_of[r] != k)
          continue;
        x = zpp_bench_value(o->seed, r, base + b0 + i, o->dtype);
        part = first ? (float)x : part + (float)x;
        first = 0;
      }
      if (hier && o->dtype != ZPP_FLOAT16) /* the partial travels in dtype
                                               (fp16: in fp32) */
        part = (float)zpp_bench_round((double)part, o->dtype);
      acc = k == 0 ? part : acc + part;
    }
    want = zpp_bench_round((double)acc, o->dtype);
    if (o->op == ZPP_OP_MEAN) {
      float m = acc / (float)ctx->world;
      want = zpp_bench_round((double)m, o->dtype);
      ref /= ctx->world;
    }
    got = zpp_bench_load(c->out->host, b0 + i, o->dtype);
    zpp_bench_check_add(
        chk, got, ref,
        zpp_bench_equal_bits(c->out->host, b0 + i, o->dtype, want));
  }
}

/* mpi: Open MPI sums in an order of its own and rounds every partial sum
 * to the dtype (fp32 natively; bf16 through fp32, two roundings; fp16
 * once: zpp_bench_mpi_reduce_scatter).  Any summation order of w terms
 * with relative rounding error at most u per addition stays within
 * gamma_{w-1} = (w-1) u / (1 - (w-1) u) of sum |x| (Higham, "Accuracy and
 * Stability of Numerical Algorithms", 4.2), plus an absolute half-spacing
 * of the smallest subnormal per addition.  u: 2^-24 (fp32), 2^-11 (fp16),
 * 2^-8 + 2^-24 (bf16).  MEAN adds the division in fp32 and its rounding to
 * the dtype. */
static void rs_check_mpi(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                         size_t b0, size_t len, zpp_bench_check_t *chk) {
  const zpp_bench_opts_t *o = ctx->opt;
  size_t base = (size_t)ctx->rank * c->count, i;
  int w = ctx->world, r;
  double u = o->dtype == ZPP_FLOAT32   ? ldexp(1.0, -24)
             : o->dtype == ZPP_FLOAT16 ? ldexp(1.0, -11)
                                       : ldexp(1.0, -8) + ldexp(1.0, -24);
  double tiny = o->dtype == ZPP_FLOAT32   ? ldexp(1.0, -150)
                : o->dtype == ZPP_FLOAT16 ? ldexp(1.0, -25)
                                          : ldexp(1.0, -134);
  double gamma = (w - 1) * u / (1 - (w - 1) * u);
  for (i = 0; i < len; i++) {
    double ref = 0, abssum = 0, bound, got;
    for (r = 0; r < w; r++) {
      double x = zpp_bench_value(o->seed, r, base + b0 + i, o->dtype);
      ref += x;
      abssum += fabs(x);
    }
    bound = gamma * abssum + (w - 1) * tiny;
    got = zpp_bench_load(c->out->host, b0 + i, o->dtype);
    if (o->op == ZPP_OP_MEAN) {
      ref /= w;
      bound = bound / w + (u + ldexp(1.0, -24)) * fabs(got) + tiny;
    }
    zpp_bench_check_add(chk, got, ref, fabs(got - ref) <= bound);
  }
}

/* qgZ: the two-stage bound of docs/collectives.md ("qgZ", "Error bound"),
 * as tests/test_coll.cc qgz_reference computes it, for one block of my
 * slice.  Stage 1 quantizes each rank's block with intra_bits
 * (error h1 from that block's own scale; none when stage 1 is raw, and
 * inter_bits for the flat stage of uneven nodes), but for the collector's
 * own (two levels: each node's rank with my local rank; flat: mine);
 * stage 2, with two levels, the partial sum of each other node, bounded by
 * U = sum over the node of |x| + h1; plus (world + nodes) fp32 additions
 * and the output rounding. */
static void rs_check_qgz(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                         size_t b0, size_t len, double *scratch,
                         zpp_bench_check_t *chk) {
  const zpp_bench_opts_t *o = ctx->opt;
  int w = ctx->world, m = ctx->nnodes, two = ctx->uniform && m > 1, r, k;
  size_t base = (size_t)ctx->rank * c->count, i;
  double *x = scratch, *sum = x + len, *h1sum = sum + len,
         *abssum = h1sum + len;
  double *h2 = abssum + len, *u = h2 + len; /* u: m * len */
  double levels2 = (double)((1 << (c->v->bits2 - 1)) - 1);
  double out_rel = zpp_bench_out_rel(o->dtype);
  int bits1 = c->v->bits;
  if (bits1 == ZPP_QGZ_INTRA_RAW) /* raw: two levels, one node; else flat */
    bits1 = two || m <= 1 ? 0 : c->v->bits2;
  memset(sum, 0, (4 + (size_t)m) * len * sizeof *x);
  for (r = 0; r < w; r++) {
    double scale = 0, range = 0;
    for (i = 0; i < len; i++)
      x[i] = zpp_bench_value(o->seed, r, base + b0 + i, o->dtype);
    int q1 = bits1 && (two ? ctx->local_of[r] != ctx->local_of[ctx->rank]
                           : r != ctx->rank);
    if (q1)
      zpp_bench_block_params(x, len, bits1, &scale, &range);
    for (i = 0; i < len; i++) {
      double h1 = q1 ? zpp_bench_quant_bound(scale, range, x[i], 0,
                                             ZPP_FLOAT32)
                     : 0.0;
      sum[i] += x[i];
      h1sum[i] += h1;
      abssum[i] += fabs(x[i]);
      u[(size_t)ctx->node_of[r] * len + i] += fabs(x[i]) + h1;
    }
  }
  for (k = 0; two && k < m; k++) {
    double umax = 0, range2, scale2;
    if (k == ctx->node_of[ctx->rank])
      continue; /* my node's partial sum stays fp32 */
    for (i = 0; i < len; i++)
      umax = fmax(umax, u[(size_t)k * len + i]);
    range2 = umax;
    scale2 = range2 / levels2 * (1 + ldexp(1.0, -22));
    for (i = 0; i < len; i++)
      h2[i] += zpp_bench_quant_bound(scale2, range2, u[(size_t)k * len + i], 0,
                                     ZPP_FLOAT32);
  }
  for (i = 0; i < len; i++) {
    double acc = (w + m) * ldexp(1.0, -23) * (abssum[i] + h1sum[i] + h2[i]);
    double bound = h1sum[i] + h2[i] + acc, ref = sum[i];
    double got = zpp_bench_load(c->out->host, b0 + i, o->dtype);
    if (o->op == ZPP_OP_MEAN) {
      ref /= w;
      bound = bound / w + ldexp(1.0, -24) * fabs(got);
    }
    bound += out_rel * fabs(got) + 1e-30;
    zpp_bench_check_add(chk, got, ref, fabs(got - ref) <= bound);
  }
}

static void rs_check(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                     zpp_bench_check_t *chk) {
  size_t block = ctx->opt->block, count = c->count;
  size_t nb = (count + block - 1) / block;
  size_t stride = zpp_bench_block_stride(c->bytes), b;
  size_t len_max = block < count ? block : count;
  double *scratch = NULL;
  if (c->v->kind == RS_QGZ) {
    scratch =
        malloc((6 + (size_t)ctx->nnodes) * (len_max + 1) * sizeof *scratch);
    if (scratch == NULL) { /* cannot check: fail every element */
      chk->wrong += count;
      return;
    }
  }
  for (b = 0; b < nb; b++) {
    size_t b0 = b * block, len = count - b0 < block ? count - b0 : block;
    if (!zpp_bench_block_checked(b, nb, stride))
      continue;
    if (c->v->kind == RS_BASE)
      rs_check_base(ctx, c, b0, len, chk);
    else if (c->v->kind == RS_MPI)
      rs_check_mpi(ctx, c, b0, len, chk);
    else
      rs_check_qgz(ctx, c, b0, len, scratch, chk);
  }
  free(scratch);
}

static void rs_teardown(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c) {
  (void)ctx;
  (void)c;
}

const zpp_bench_coll_t zpp_bench_reducescatter = {
    "reducescatter",
    "size = bytes of one rank's INPUT in the data dtype (count = size / "
    "dtype size / world elements per rank in the output)",
    "algbw = size / time; busbw = algbw * (world-1)/world (nccl-tests "
    "reduce_scatter)",
    "<dtype> (zpp_reduce_scatter, the baseline), <dtype>-flat (pairwise, "
    "ZPP_ALGORITHM_FLAT), qgz4, qgz8, qgzA-B "
    "(zpp_qgz_reduce_scatter, A bits inside the node (16: not quantized, "
    "ZPP_QGZ_INTRA_RAW), B across nodes, "
    "symmetric, --block elements per scale, no error feedback), mpi (Open "
    "MPI's MPI_Reduce_scatter_block on the same buffers; 16-bit dtypes with "
    "a user-defined sum that rounds each partial sum to the dtype), mpi-han "
    "(the same, HAN on top), mpi-best (the same, the fastest algorithm of "
    "tuned)",
    "baseline: bitwise equal to the documented order (flat: the fp32 sum in "
    "rank order rounded once; hierarchical: each node's sum rounded to the "
    "dtype (fp16: fp32), then summed in node order and rounded once; MEAN: the fp32 sum / "
    "world, rounded once); qgz: |out - float64 "
    "sum| within the two-stage bound of docs/collectives.md (block scales "
    "of every rank's input but the collector's own, which is not "
    "quantized) plus the output rounding; mpi*: |out - float64 "
    "sum| <= gamma_{w-1} sum |x| for any summation order (u per addition: "
    "fp32 2^-24, fp16 2^-11, bf16 2^-8 + 2^-24)",
    rs_default_variants,
    rs_parse_variant,
    rs_count_of,
    rs_bytes_of,
    rs_in_elems,
    rs_out_elems,
    rs_algbw_bytes,
    rs_busbw_factor,
    rs_setup,
    rs_run,
    rs_check,
    rs_teardown,
};
