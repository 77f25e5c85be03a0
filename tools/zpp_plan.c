/*
 * zpp-plan: what each ZeRO stage costs a rank -- model-state memory,
 * communication per training step on each link class, and a step
 * communication time from an alpha-beta model -- for a model of PSI
 * parameters on N ranks, S per node (M = N / S nodes).
 *
 * Nothing is measured: every number is a formula, the same ones zpp's
 * collectives and the MPI transport follow (docs/collectives.md,
 * docs/design.md "Transports"); encoded sizes come from
 * zpp_quant_encoded_size (docs/format.md).
 *
 * Memory (bytes per rank, mixed-precision Adam: bf16 parameters and
 * gradients, K bytes of optimizer state per parameter, K = 12 for fp32
 * master weights, momentum and variance).  Sharded states use the padded
 * shard c = ceil(PSI / N) elements, as ZeRO-3 runtimes pad every tensor to
 * a multiple of N:
 *   dp      (2 + 2 + K) PSI
 *   zero1   4 PSI + K c
 *   zero2   2 PSI + (2 + K) c
 *   zero3   (4 + K) c
 *   zeropp  zero3 + the hpZ secondary copy: the M encoded shards of this
 *           rank's CROSS group, M * E(c) bytes (about PSI / S elements):
 *           INT8 (--hpz-bits 8) E(c) = c + 4 ceil(c / block) with fp32
 *           scales; bf16 (--hpz-bits 16) E(c) = 2 c.
 *           + with --ef 32|8, qgZ's error-feedback residual: L = N + M
 *           segments of c elements (the stage-1 error of all N slices of
 *           the rank's gradient, the stage-2 error of M partial sums), or
 *           L = N on one node (M = 1: no second stage): fp32 4 L c, INT8
 *           L E8(c) (zpp_qgz_residual_bytes).
 *   --qwd B  zero1 and zero2 refresh their full parameters with qWD
 *           (quantized differences, B bits, --qwd-block): the all-gather
 *           moves E_B(c) instead of 2c bytes; no state beyond the full
 *           parameters these stages hold already; per update a scratch of
 *           N E_B(c) + 4 c bytes (the encoded differences and one fp32
 *           shard), reported as qwd_scratch_bytes.
 *
 * Communication per step, bytes SENT per rank (bf16, d = 2 bytes), with
 * --algo hier (the default, zpp's ZPP_ALGO=hier; M > 1 and S > 1):
 *   hierarchical all-gather of B bytes per rank: inter (M - 1) B on every
 *     rank (avg = max), intra (S - 1) M B; its two stages overlap (chunks);
 *   hierarchical reduce-scatter of c elements per rank: the transpose,
 *     inter (M - 1) c d, intra (S - 1) M c d;
 * with --algo flat (ZPP_ALGO=flat), and whenever M = 1 or S = 1:
 *   ring all-gather of B bytes per rank (world ring in node order): a rank
 *     sends (N - 1) B to its successor; only the last rank of each node has
 *     its successor on another node, so the inter-node bytes of one rank
 *     are (N - 1) B or 0.  Reported per rank as the world total / N:
 *     inter (N - 1) B / S, intra (N - 1) B (S - 1) / S (M > 1; with one
 *     node everything is intra).  *_max is the busiest rank: (N - 1) B.
 *   pairwise reduce-scatter of c elements per rank: c d to every other
 *     rank: intra (S - 1) c d, inter (N - S) c d.
 *   dp      all-reduce of the gradients = reduce-scatter + all-gather (c d)
 *   zero1/2 reduce-scatter of the gradients + all-gather of the parameters
 *   zero3   forward all-gather + backward all-gather + reduce-scatter
 *   zeropp  qwZ forward all-gather of E8(c) bytes (INT8, symmetric)
 *           + hpZ backward all-gather inside the node of the secondary
 *             copy: intra (S - 1) M E_hpz(c), inter 0
 *           + qgZ reduce-scatter, INT4 at both stages: intra
 *             (S - 1) M E4(c), inter (M - 1) E4(c),
 *             E4(c) = ceil(c / 2) + 4 ceil(c / block) (even block).
 *   The paper's idealised volumes per rank are printed beside them, in
 *   units of the bf16 model size 2 PSI: dp, zero1, zero2 2x, zero3 3x,
 *   zeropp 0.75x (0.5 + 0 + 0.25).
 *
 * Alpha-beta time.  A collective runs `steps` dependent rounds; a round
 * on link class L costs alpha_L + bytes / beta_L (alpha = --*-lat-us,
 * beta = --*-gbps Gbit/s per rank, each rank has its own link).  Links of
 * the two classes work at once, so a collective costs the slower class:
 *   time = max over classes L it uses of (steps_L alpha_L + bytes_L / beta_L)
 * with bytes_L those of the busiest rank on L:
 *   hierarchical          steps 1 per class (the stages overlap), bytes as
 *                          above
 *   ring all-gather       steps N - 1, bytes (N - 1) B on each class used
 *   pairwise (reduce-scatter, all-to-all): every pair posted at once, so
 *                          steps 1, bytes as above
 *   qgZ                    its intra stage, then its inter stage (sum)
 *   hpZ backward           ring inside the node: steps S - 1
 * The step time is the sum over the step's collectives: no overlap with
 * compute or between collectives, no encode/decode cost, no congestion.
 *
 * Exit status: 0 ok, 2 bad flag (the message names it), 1 library error.
 */
#include <zpp/zpp.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "zpp-plan"
#define PLAN_EXIT_USAGE 2
#define PLAN_EXIT_LIBRARY 1
#define PLAN_MAX_PARAMS 1000000000000000ull /* 1e15 keeps every product < 2^64 */
#define PLAN_MAX_RANKS (1ull << 24)
#define PLAN_MAX_K 1000ull
#define PLAN_MAX_COLLS 4

typedef struct {
  uint64_t params; /* PSI, elements */
  uint64_t ranks;  /* N */
  uint64_t per_node; /* S */
  uint64_t k;      /* optimizer bytes per parameter */
  uint64_t block;  /* elements per quantization scale */
  int hpz_bits;    /* 8 or 16 */
  int ef_bits;     /* 0 (no error feedback), 32 or 8 */
  int qwd_bits;    /* 0, 4 or 8 */
  int flat;        /* --algo flat: ring all-gather, pairwise reduce-scatter */
  uint64_t qwd_block;
  double intra_gbps, inter_gbps;     /* Gbit/s per rank */
  double intra_lat_us, inter_lat_us; /* per round */
  int json;
} plan_args_t;

/* One collective of a step, per rank.  Bytes are what one rank sends;
 * the *_avg are world totals / N, the *_max the busiest rank's. */
typedef struct {
  const char *name;
  double intra_avg, inter_avg;
  double intra_max, inter_max;
  uint64_t intra_steps, inter_steps;
  int sequential; /* 1: the intra part, then the inter part (qgZ) */
  double time_s;
} plan_coll_t;

typedef struct {
  const char *key;
  const char *what;
  uint64_t params_bytes, grads_bytes, optim_bytes, hpz_bytes;
  uint64_t residual_bytes; /* qgZ error feedback (zeropp, --ef) */
  uint64_t qwd_scratch_bytes; /* transient, per qWD update (--qwd) */
  uint64_t model_state_bytes;
  plan_coll_t colls[PLAN_MAX_COLLS];
  int ncolls;
  double intra, inter, inter_max, time_s;
  double paper_factor; /* idealised volume in units of 2 PSI bytes */
} plan_stage_t;

static void usage(FILE *out) {
  fprintf(out,
"usage: " PROG " --params PSI --ranks N [--ranks-per-node S] [flags]\n"
"Per-rank model-state memory, communication per step on each link class\n"
"and an alpha-beta communication time for dp, ZeRO-1/2/3 and ZeRO++\n"
"(qwZ + hpZ + qgZ), with zpp's own algorithms and byte formulas.\n"
"  --params PSI        parameters; suffix K, M, B (or G), T = 1e3, 1e6,\n"
"                      1e9, 1e12, decimals allowed (7B, 7.5B, 125M)\n"
"  --ranks N           data-parallel ranks (world size)\n"
"  --ranks-per-node S  ranks per node, must divide N (default 8)\n"
"  --k K               optimizer bytes per parameter (default 12: fp32\n"
"                      master weights, Adam momentum and variance)\n"
"  --block B           elements per quantization scale (default 256)\n"
"  --hpz-bits 8|16     dtype of hpZ's secondary copy: INT8 (default) or bf16\n"
"  --ef 0|32|8         zeropp error-feedback residual: none (default), fp32\n"
"                      or INT8 (LoCo style): (N+M) c floats or (N+M) E8(c);\n"
"                      N segments only on one node (no second stage)\n"
"  --qwd 0|4|8         zero1/zero2 gather their new parameters as qWD\n"
"                      differences of that many bits (default 0: bf16)\n"
"  --qwd-block B       qWD elements per scale (default 2048)\n"
"  --intra-gbps G      intra-node link per rank, Gbit/s (default 3600)\n"
"  --inter-gbps G      inter-node link per rank, Gbit/s (default 400)\n"
"  --intra-lat-us L    intra-node latency per round, us (default 2)\n"
"  --inter-lat-us L    inter-node latency per round, us (default 5)\n"
"  --algo hier|flat    zpp's all-gather and reduce-scatter across nodes:\n"
"                      hier (default, ZPP_ALGO=hier) or flat (ring, pairwise)\n"
"  --format table|json table (default) or one JSON object with the keys\n"
"                      dp, zero1, zero2, zero3, zeropp (and \"inputs\")\n"
"  --help              this text\n"
"Memory per rank (bf16 parameters and gradients, c = ceil(PSI/N)):\n"
"  dp (4+K) PSI; zero1 4 PSI + K c; zero2 2 PSI + (2+K) c; zero3 (4+K) c;\n"
"  zeropp = zero3 + hpZ secondary copy M E(c) (M = N/S nodes; INT8:\n"
"  E(c) = c + 4 ceil(c/block), bf16: 2c).\n"
"Bytes sent per rank per step: hier (M > 1, S > 1): all-gather of B\n"
"  bytes inter (M-1)B, intra (S-1)MB on every rank; reduce-scatter inter\n"
"  (M-1)2c, intra (S-1)M2c.  flat: ring all-gather of B bytes: inter\n"
"  (N-1)B/S, intra (N-1)B(S-1)/S (world total / N; the busiest rank sends\n"
"  (N-1)B across); pairwise reduce-scatter: intra (S-1)2c, inter (N-S)2c.\n"
"  dp = all-reduce = reduce-scatter + all-gather; zero1/2 the same;\n"
"  zero3 = 2 all-gathers + reduce-scatter; zeropp = qwZ INT8 all-gather\n"
"  (B = E8(c)) + hpZ backward gather in the node (intra (S-1) M E(c))\n"
"  + qgZ INT4 (intra (S-1) M E4(c), inter (M-1) E4(c)).\n"
"Time (alpha-beta): a collective costs max over link classes L of\n"
"  steps_L * lat_L + bytes_L / bw_L, bytes_L of the busiest rank; hier\n"
"  1 step per class; ring all-gather N-1 steps, pairwise exchanges 1 step\n"
"  (all pairs posted at once), hpZ gather S-1 steps, qgZ intra stage then\n"
"  inter stage. The step sums its collectives: no overlap, no codec cost,\n"
"  no congestion.\n"
"Paper volumes: per rank in units of the bf16 model 2 PSI: 2 (dp, zero1,\n"
"  zero2), 3 (zero3), 0.75 (zeropp).\n"
"Exit status: 0 ok, 2 bad flag (named in the message), 1 library error.\n");
}

static void plan_bad(const char *flag, const char *value, const char *why) {
  if (value)
    fprintf(stderr, PROG ": %s %s: %s (see " PROG " --help)\n", flag, value, why);
  else
    fprintf(stderr, PROG ": %s %s (see " PROG " --help)\n", flag, why);
}

/* "7B", "7.5B", "125M", "1000": exact, in integers.  0 on success. */
static int plan_parse_params(const char *s, uint64_t *out) {
  uint64_t ip = 0, frac = 0, fden = 1, mult = 1;
  const char *p = s;
  int digits = 0;
  while (*p >= '0' && *p <= '9') {
    if (ip > PLAN_MAX_PARAMS)
      return -1;
    ip = ip * 10 + (uint64_t)(*p++ - '0');
    digits++;
  }
  if (*p == '.') {
    p++;
    while (*p >= '0' && *p <= '9') {
      if (fden >= 1000000000000ull)
        return -1;
      frac = frac * 10 + (uint64_t)(*p++ - '0');
      fden *= 10;
      digits++;
    }
  }
  if (digits == 0)
    return -1;
  switch (*p) {
  case 'k': case 'K': mult = 1000ull; p++; break;
  case 'm': case 'M': mult = 1000000ull; p++; break;
  case 'b': case 'B': case 'g': case 'G': mult = 1000000000ull; p++; break;
  case 't': case 'T': mult = 1000000000000ull; p++; break;
  default: break;
  }
  if (*p != '\0' || ip > PLAN_MAX_PARAMS / mult)
    return -1;
  /* frac / fden * mult must be a whole number of parameters. */
  if ((frac * mult) % fden != 0)
    return -1;
  *out = ip * mult + frac * mult / fden;
  return (*out == 0 || *out > PLAN_MAX_PARAMS) ? -1 : 0;
}

static int plan_parse_u64(const char *s, uint64_t lo, uint64_t hi,
                          uint64_t *out) {
  char *end;
  unsigned long long v;
  if (s == NULL || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

static int plan_parse_pos(const char *s, int allow_zero, double *out) {
  char *end;
  double v;
  if (s == NULL || *s == '\0')
    return -1;
  errno = 0;
  v = strtod(s, &end);
  if (errno != 0 || *end != '\0' || !isfinite(v) || v < 0 ||
      (!allow_zero && v == 0))
    return -1;
  *out = v;
  return 0;
}

/* 0 ok, 1 --help printed, 2 bad input (message written). */
static int plan_parse_args(int argc, char **argv, plan_args_t *a) {
  int i, have_params = 0, have_ranks = 0;
  a->per_node = 8;
  a->k = 12;
  a->block = 256;
  a->hpz_bits = 8;
  a->ef_bits = 0;
  a->qwd_bits = 0;
  a->qwd_block = 2048;
  a->intra_gbps = 3600;
  a->inter_gbps = 400;
  a->intra_lat_us = 2;
  a->inter_lat_us = 5;
  a->json = 0;
  a->flat = 0;
  for (i = 1; i < argc; i++) {
    const char *f = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t u;
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      usage(stdout);
      return 1;
    }
    if (strncmp(f, "--", 2) != 0) {
      fprintf(stderr, PROG ": unexpected argument '%s' (see " PROG " --help)\n", f);
      return 2;
    }
    if (v == NULL) {
      plan_bad(f, NULL, "needs a value");
      return 2;
    }
    i++;
    if (strcmp(f, "--params") == 0) {
      if (plan_parse_params(v, &a->params) != 0) {
        plan_bad(f, v, "must be a whole number of parameters >= 1 and <= 1e15, "
                       "optionally with K, M, B or T (e.g. 7B, 7.5B, 125M)");
        return 2;
      }
      have_params = 1;
    } else if (strcmp(f, "--ranks") == 0) {
      if (plan_parse_u64(v, 1, PLAN_MAX_RANKS, &a->ranks) != 0) {
        plan_bad(f, v, "must be an integer in [1, 16777216]");
        return 2;
      }
      have_ranks = 1;
    } else if (strcmp(f, "--ranks-per-node") == 0) {
      if (plan_parse_u64(v, 1, PLAN_MAX_RANKS, &a->per_node) != 0) {
        plan_bad(f, v, "must be an integer in [1, 16777216]");
        return 2;
      }
    } else if (strcmp(f, "--k") == 0) {
      if (plan_parse_u64(v, 0, PLAN_MAX_K, &a->k) != 0) {
        plan_bad(f, v, "must be an integer number of bytes in [0, 1000]");
        return 2;
      }
    } else if (strcmp(f, "--block") == 0) {
      if (plan_parse_u64(v, 1, 1u << 30, &a->block) != 0) {
        plan_bad(f, v, "must be an integer in [1, 2^30]");
        return 2;
      }
    } else if (strcmp(f, "--hpz-bits") == 0) {
      if (plan_parse_u64(v, 8, 16, &u) != 0 || (u != 8 && u != 16)) {
        plan_bad(f, v, "must be 8 (INT8) or 16 (bf16)");
        return 2;
      }
      a->hpz_bits = (int)u;
    } else if (strcmp(f, "--ef") == 0) {
      if (plan_parse_u64(v, 0, 32, &u) != 0 || (u != 0 && u != 8 && u != 32)) {
        plan_bad(f, v, "must be 0 (off), 32 (fp32) or 8 (INT8)");
        return 2;
      }
      a->ef_bits = (int)u;
    } else if (strcmp(f, "--qwd") == 0) {
      if (plan_parse_u64(v, 0, 8, &u) != 0 || (u != 0 && u != 4 && u != 8)) {
        plan_bad(f, v, "must be 0 (off), 4 or 8");
        return 2;
      }
      a->qwd_bits = (int)u;
    } else if (strcmp(f, "--qwd-block") == 0) {
      if (plan_parse_u64(v, 1, 1u << 30, &a->qwd_block) != 0) {
        plan_bad(f, v, "must be an integer in [1, 2^30]");
        return 2;
      }
    } else if (strcmp(f, "--intra-gbps") == 0 || strcmp(f, "--inter-gbps") == 0) {
      double *dst = strcmp(f, "--intra-gbps") == 0 ? &a->intra_gbps
                                                   : &a->inter_gbps;
      if (plan_parse_pos(v, 0, dst) != 0) {
        plan_bad(f, v, "must be a number > 0 (Gbit/s per rank)");
        return 2;
      }
    } else if (strcmp(f, "--intra-lat-us") == 0) {
      if (plan_parse_pos(v, 1, &a->intra_lat_us) != 0) {
        plan_bad(f, v, "must be a number >= 0 (microseconds)");
        return 2;
      }
    } else if (strcmp(f, "--inter-lat-us") == 0) {
      if (plan_parse_pos(v, 1, &a->inter_lat_us) != 0) {
        plan_bad(f, v, "must be a number >= 0 (microseconds)");
        return 2;
      }
    } else if (strcmp(f, "--algo") == 0) {
      if (strcmp(v, "hier") == 0)
        a->flat = 0;
      else if (strcmp(v, "flat") == 0)
        a->flat = 1;
      else {
        plan_bad(f, v, "must be hier or flat");
        return 2;
      }
    } else if (strcmp(f, "--format") == 0) {
      if (strcmp(v, "json") == 0)
        a->json = 1;
      else if (strcmp(v, "table") == 0)
        a->json = 0;
      else {
        plan_bad(f, v, "must be table or json");
        return 2;
      }
    } else {
      fprintf(stderr, PROG ": unknown flag '%s' (see " PROG " --help)\n", f);
      return 2;
    }
  }
  if (!have_params) {
    plan_bad("--params", NULL, "is required");
    return 2;
  }
  if (!have_ranks) {
    plan_bad("--ranks", NULL, "is required");
    return 2;
  }
  if (a->ranks % a->per_node != 0) {
    fprintf(stderr,
            PROG ": --ranks-per-node %llu: must divide --ranks %llu "
            "(nodes of equal size; see " PROG " --help)\n",
            (unsigned long long)a->per_node, (unsigned long long)a->ranks);
    return 2;
  }
  return 0;
}

/* Encoded bytes of c elements, symmetric, `bits` wide (docs/format.md). */
static int plan_encoded(uint64_t c, int bits, uint64_t block, uint64_t *out) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  size_t bytes = 0;
  zpp_status_t st;
  q.bits = bits;
  q.block_size = (size_t)block;
  q.mode = ZPP_QUANT_SYMMETRIC;
  st = zpp_quant_encoded_size(&q, (size_t)c, &bytes);
  if (st != ZPP_OK) {
    fprintf(stderr, PROG ": zpp_quant_encoded_size failed: %s: %s\n",
            zpp_status_string(st), zpp_get_last_error());
    return -1;
  }
  *out = bytes;
  return 0;
}

typedef struct {
  const plan_args_t *args;
  double n, s, m;              /* N, S, M as doubles */
  double a_in, a_out;          /* alpha, seconds */
  double b_in, b_out;          /* beta, bytes per second */
} plan_net_t;

/* Hierarchical all-gather (or reduce-scatter: the same bytes) of B bytes
 * per rank: every rank sends (M - 1) B across and (S - 1) M B inside. */
static plan_coll_t plan_hier(const char *name, uint64_t b,
                             const plan_net_t *k) {
  double intra = (k->s - 1) * k->m * (double)b, inter = (k->m - 1) * (double)b;
  plan_coll_t c = {name, intra, inter, intra, inter, intra > 0, inter > 0, 0,
                   0};
  return c;
}

static int plan_is_hier(const plan_args_t *a, const plan_net_t *k) {
  return !a->flat && k->m > 1 && k->s > 1;
}

/* World ring all-gather of B bytes per rank (or hierarchical). */
static plan_coll_t plan_ring_allgather(const char *name, uint64_t b,
                                       const plan_net_t *k) {
  plan_coll_t c = {name, 0, 0, 0, 0, 0, 0, 0, 0};
  if (plan_is_hier(k->args, k))
    return plan_hier(name, b, k);
  double sent = (k->n - 1) * (double)b;
  if (k->m > 1) {
    c.inter_avg = sent / k->s;
    c.intra_avg = sent * (k->s - 1) / k->s;
    c.inter_max = sent;
    c.intra_max = k->s > 1 ? sent : 0;
  } else {
    c.intra_avg = c.intra_max = sent;
  }
  c.intra_steps = c.intra_max > 0 ? (uint64_t)(k->n - 1) : 0;
  c.inter_steps = c.inter_max > 0 ? (uint64_t)(k->n - 1) : 0;
  return c;
}

/* Pairwise exchange: `intra`, `inter` bytes sent by every rank. */
static plan_coll_t plan_pairwise(const char *name, double intra, double inter,
                                 int sequential) {
  plan_coll_t c = {name, intra, inter, intra, inter, intra > 0, inter > 0,
                   sequential, 0};
  return c;
}

static void plan_time(plan_coll_t *c, const plan_net_t *k) {
  double ti = c->intra_steps ? c->intra_steps * k->a_in + c->intra_max / k->b_in : 0;
  double to = c->inter_steps ? c->inter_steps * k->a_out + c->inter_max / k->b_out : 0;
  c->time_s = c->sequential ? ti + to : (ti > to ? ti : to);
}

static void plan_add(plan_stage_t *st, plan_coll_t c, const plan_net_t *k) {
  plan_time(&c, k);
  st->colls[st->ncolls++] = c;
  st->intra += c.intra_avg;
  st->inter += c.inter_avg;
  st->inter_max += c.inter_max;
  st->time_s += c.time_s;
}

static void json_num(double v) {
  if (v == floor(v) && fabs(v) < 9e15)
    printf("%.0f", v);
  else
    printf("%.6f", v);
}

static void print_json(const plan_args_t *a, uint64_t c, const plan_stage_t *st,
                       int nst) {
  int i, j;
  printf("{\n  \"inputs\": {\"params\": %llu, \"ranks\": %llu, "
         "\"ranks_per_node\": %llu, \"nodes\": %llu, \"k\": %llu, "
         "\"block\": %llu, \"hpz_bits\": %d, \"ef_bits\": %d, \"qwd_bits\": %d, "
         "\"qwd_block\": %llu, \"shard_elements\": %llu, "
         "\"intra_gbps\": %g, \"inter_gbps\": %g, \"intra_lat_us\": %g, "
         "\"inter_lat_us\": %g, \"algo\": \"%s\", "
         "\"bytes_averaging\": \"world total / ranks\"},\n",
         (unsigned long long)a->params, (unsigned long long)a->ranks,
         (unsigned long long)a->per_node,
         (unsigned long long)(a->ranks / a->per_node), (unsigned long long)a->k,
         (unsigned long long)a->block, a->hpz_bits, a->ef_bits, a->qwd_bits,
         (unsigned long long)a->qwd_block, (unsigned long long)c, a->intra_gbps, a->inter_gbps, a->intra_lat_us, a->inter_lat_us,
         a->flat ? "flat" : "hier");
  for (i = 0; i < nst; i++) {
    const plan_stage_t *s = &st[i];
    printf("  \"%s\": {\n", s->key);
    printf("    \"model_state_bytes\": %llu,\n", (unsigned long long)s->model_state_bytes);
    printf("    \"param_bytes\": %llu, \"grad_bytes\": %llu, "
           "\"optimizer_bytes\": %llu, \"hpz_secondary_bytes\": %llu,\n",
           (unsigned long long)s->params_bytes, (unsigned long long)s->grads_bytes,
           (unsigned long long)s->optim_bytes, (unsigned long long)s->hpz_bytes);
    printf("    \"residual_bytes\": %llu, \"qwd_scratch_bytes\": %llu,\n",
           (unsigned long long)s->residual_bytes,
           (unsigned long long)s->qwd_scratch_bytes);
    printf("    \"intra_bytes_per_step\": ");
    json_num(s->intra);
    printf(",\n    \"inter_bytes_per_step\": ");
    json_num(s->inter);
    printf(",\n    \"inter_bytes_per_step_max\": ");
    json_num(s->inter_max);
    printf(",\n    \"comm_time_s_per_step\": %.9g,\n", s->time_s);
    printf("    \"paper_bytes_per_step\": ");
    json_num(s->paper_factor * 2.0 * (double)a->params);
    printf(",\n    \"collectives\": [");
    for (j = 0; j < s->ncolls; j++) {
      const plan_coll_t *k = &s->colls[j];
      printf("%s\n      {\"name\": \"%s\", \"intra_bytes\": ", j ? "," : "", k->name);
      json_num(k->intra_avg);
      printf(", \"inter_bytes\": ");
      json_num(k->inter_avg);
      printf(", \"inter_bytes_max\": ");
      json_num(k->inter_max);
      printf(", \"intra_steps\": %llu, \"inter_steps\": %llu, \"time_s\": %.9g}",
             (unsigned long long)k->intra_steps, (unsigned long long)k->inter_steps,
             k->time_s);
    }
    printf("\n    ]\n  }%s\n", i + 1 < nst ? "," : "");
  }
  printf("}\n");
}

static void print_table(const plan_args_t *a, uint64_t c, const plan_stage_t *st,
                        int nst) {
  int i, j;
  printf("# zpp-plan: PSI %llu parameters, N %llu ranks = %llu nodes x %llu, "
         "K %llu, block %llu, hpZ copy %s\n",
         (unsigned long long)a->params, (unsigned long long)a->ranks,
         (unsigned long long)(a->ranks / a->per_node),
         (unsigned long long)a->per_node, (unsigned long long)a->k,
         (unsigned long long)a->block, a->hpz_bits == 8 ? "INT8" : "bf16");
  printf("# shard c = %llu elements; links per rank: intra %g Gbit/s %g us, "
         "inter %g Gbit/s %g us; all-gather and reduce-scatter %s\n",
         (unsigned long long)c, a->intra_gbps, a->intra_lat_us, a->inter_gbps,
         a->inter_lat_us,
         a->flat ? "flat (ring, pairwise)" : "hierarchical (--algo hier)");
  printf("# bytes sent per rank per step (world total / N); inter max = busiest "
         "rank; time = alpha-beta, collectives in sequence (--help)\n");
  printf("%-7s %14s %14s %14s %14s %12s %14s\n", "stage", "states GB",
         "intra MB", "inter MB", "inter max MB", "comm ms", "paper MB");
  for (i = 0; i < nst; i++) {
    const plan_stage_t *s = &st[i];
    printf("%-7s %14.3f %14.3f %14.3f %14.3f %12.3f %14.3f\n", s->key,
           s->model_state_bytes / 1e9, s->intra / 1e6, s->inter / 1e6,
           s->inter_max / 1e6, s->time_s * 1e3,
           s->paper_factor * 2.0 * (double)a->params / 1e6);
  }
  printf("\n%-7s %-18s %14s %14s %14s %12s\n", "stage", "collective",
         "intra MB", "inter MB", "inter max MB", "ms");
  for (i = 0; i < nst; i++)
    for (j = 0; j < st[i].ncolls; j++) {
      const plan_coll_t *k = &st[i].colls[j];
      printf("%-7s %-18s %14.3f %14.3f %14.3f %12.3f\n", st[i].key, k->name,
             k->intra_avg / 1e6, k->inter_avg / 1e6, k->inter_max / 1e6,
             k->time_s * 1e3);
    }
  printf("\nzeropp memory includes hpZ's secondary copy: %llu bytes (%s, "
         "M = %llu encoded shards).\n",
         (unsigned long long)st[nst - 1].hpz_bytes,
         a->hpz_bits == 8 ? "INT8 with fp32 scales" : "bf16",
         (unsigned long long)(a->ranks / a->per_node));
  if (a->ef_bits)
    printf("zeropp memory includes qgZ's error-feedback residual (%s): %llu "
           "bytes per rank (fp32 would be %llu).\n",
           a->ef_bits == 8 ? "INT8" : "fp32",
           (unsigned long long)st[nst - 1].residual_bytes,
           (unsigned long long)(4 * (a->ranks + a->ranks / a->per_node) * c));
  if (a->qwd_bits)
    printf("zero1/zero2 gather their parameters as qWD INT%d differences "
           "(block %llu): no extra state; %llu bytes of scratch per update.\n",
           a->qwd_bits, (unsigned long long)a->qwd_block,
           (unsigned long long)st[1].qwd_scratch_bytes);
}

int main(int argc, char **argv) {
  plan_args_t a;
  plan_stage_t st[5];
  plan_net_t k;
  uint64_t c, n, s, m, e8, e4, ehpz, b, ewd = 0;
  int rc = plan_parse_args(argc, argv, &a);
  if (rc == 1)
    return 0;
  if (rc != 0)
    return PLAN_EXIT_USAGE;
  n = a.ranks;
  s = a.per_node;
  m = n / s;
  c = (a.params + n - 1) / n;
  b = 2 * c; /* bf16 shard */
  if (plan_encoded(c, 8, a.block, &e8) != 0 || plan_encoded(c, 4, a.block, &e4) != 0)
    return PLAN_EXIT_LIBRARY;
  ehpz = a.hpz_bits == 8 ? e8 : b;
  if (a.qwd_bits) {
    zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
    size_t by = 0;
    q.bits = a.qwd_bits;
    q.block_size = (size_t)a.qwd_block;
    if (zpp_quant_encoded_size(&q, (size_t)c, &by) != ZPP_OK) {
      fprintf(stderr, PROG ": zpp_quant_encoded_size failed: %s\n",
              zpp_get_last_error());
      return PLAN_EXIT_LIBRARY;
    }
    ewd = by;
  }
  k.args = &a;
  k.n = (double)n;
  k.s = (double)s;
  k.m = (double)m;
  k.a_in = a.intra_lat_us * 1e-6;
  k.a_out = a.inter_lat_us * 1e-6;
  k.b_in = a.intra_gbps * 1e9 / 8;
  k.b_out = a.inter_gbps * 1e9 / 8;

  memset(st, 0, sizeof st);
  st[0].key = "dp";
  st[0].params_bytes = 2 * a.params;
  st[0].grads_bytes = 2 * a.params;
  st[0].optim_bytes = a.k * a.params;
  st[0].paper_factor = 2;
  st[1].key = "zero1";
  st[1].params_bytes = 2 * a.params;
  st[1].grads_bytes = 2 * a.params;
  st[1].optim_bytes = a.k * c;
  st[1].paper_factor = 2;
  st[2].key = "zero2";
  st[2].params_bytes = 2 * a.params;
  st[2].grads_bytes = 2 * c;
  st[2].optim_bytes = a.k * c;
  st[2].paper_factor = 2;
  st[3].key = "zero3";
  st[3].params_bytes = 2 * c;
  st[3].grads_bytes = 2 * c;
  st[3].optim_bytes = a.k * c;
  st[3].paper_factor = 3;
  st[4] = st[3];
  st[4].key = "zeropp";
  st[4].hpz_bytes = m * ehpz;
  st[4].paper_factor = 0.75;
  if (a.ef_bits) {
    /* N segments of c elements, plus M when qgZ has a second stage, i.e.
     * more than one node (zpp_qgz_residual_bytes: one node runs stage 1
     * only, with no stage-2 partial sums to keep an error for) */
    uint64_t e8r = 0, segs = n + (m > 1 ? m : 0);
    if (a.ef_bits == 8 && plan_encoded(c, 8, a.block, &e8r) != 0)
      return PLAN_EXIT_LIBRARY;
    st[4].residual_bytes = segs * (a.ef_bits == 8 ? e8r : 4 * c);
  }
  if (a.qwd_bits)
    st[1].qwd_scratch_bytes = st[2].qwd_scratch_bytes = n * ewd + 4 * c;
  {
    int i;
    for (i = 0; i < 5; i++)
      st[i].model_state_bytes = st[i].params_bytes + st[i].grads_bytes +
                                st[i].optim_bytes + st[i].hpz_bytes +
                                st[i].residual_bytes;
  }
  {
    double rs_in = (double)(s - 1) * (double)b, rs_out = (double)(n - s) * (double)b;
    int i;
    plan_coll_t rs = plan_is_hier(&a, &k)
                         ? plan_hier("reduce_scatter", b, &k)
                         : plan_pairwise("reduce_scatter", rs_in, rs_out, 0);
    plan_add(&st[0], rs, &k);
    plan_add(&st[0], plan_ring_allgather("allgather", b, &k), &k);
    for (i = 1; i <= 2; i++) {
      plan_add(&st[i], rs, &k);
      if (a.qwd_bits)
        plan_add(&st[i], plan_ring_allgather("qwd_allgather", ewd, &k), &k);
      else
        plan_add(&st[i], plan_ring_allgather("allgather", b, &k), &k);
    }
    plan_add(&st[3], plan_ring_allgather("fwd_allgather", b, &k), &k);
    plan_add(&st[3], plan_ring_allgather("bwd_allgather", b, &k), &k);
    plan_add(&st[3], rs, &k);
    plan_add(&st[4], plan_ring_allgather("qwz_fwd_allgather", e8, &k), &k);
    {
      /* hpZ backward: ring of S members inside the node, M * E per member. */
      plan_coll_t h = plan_pairwise("hpz_bwd_allgather",
                                    (double)(s - 1) * (double)(m * ehpz), 0, 0);
      h.intra_steps = s - 1;
      plan_add(&st[4], h, &k);
    }
    plan_add(&st[4],
             plan_pairwise("qgz_reduce_scatter", (double)(s - 1) * (double)(m * e4),
                           (double)(m - 1) * (double)e4, 1),
             &k);
  }
  if (a.json)
    print_json(&a, c, st, 5);
  else
    print_table(&a, c, st, 5);
  return 0;
}
