/*
 * zpp-quant-error: error of the zpp block quantizer as a function of the
 * block size, the width (INT8/INT4) and the mode (symmetric/asymmetric),
 * on synthetic data or on a raw little-endian fp32/fp16/bf16 file.
 *
 * One tool, two front ends (docs/api.md, "Quantization error tool"): this
 * C one reads only what needs no parsing (its own generator, raw files);
 * python -m zpp.quant_error (python/zpp/quant_error.py) reads raw files
 * too, and .npy, .safetensors and torch checkpoints through numpy,
 * safetensors and torch.  Both take the same flags and print the same
 * columns; on the same raw file their stdout is byte for byte the same
 * (python/tests/test_quant_error.py checks it).
 *
 * Every number goes through the public API: zpp_quant_encode from the
 * data's own dtype, then zpp_quant_decode (into the same dtype unless
 * --decode-to fp32).  Sums are float64, in element order:
 *   rel_l2        = ||x_hat - x||_2 / ||x||_2           (a fraction)
 *   max_abs       = max_i |x_hat_i - x_i|
 *   snr_db        = 20 log10(||x||_2 / ||x_hat - x||_2)  ("inf" when exact)
 *   bits_per_elem = 8 * encoded bytes / n   (scales and zero points count)
 *
 * Synthetic data comes from the tool's own generator (xoshiro256** seeded
 * through splitmix64, Box-Muller normals, inverse-CDF Laplace), so a seed
 * gives the same tensor on every machine; only libm's log/sin/cos enter,
 * and their results are rounded to fp32 before use.
 *
 * Exit status: 0 on success; 2 for a bad flag or an unusable input file
 * (the message names it); 1 when the library returns an error.
 */
#include <zpp/zpp.h>

#include "zpp_internal/kernels.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define QE_PROG "zpp-quant-error"
#define QE_EXIT_USAGE 2
#define QE_EXIT_LIBRARY 1
#define QE_DEFAULT_SEED 20261129ull
#define QE_DEFAULT_N ((size_t)1 << 20)
#define QE_MAX_LIST 64

/* ---- errors --------------------------------------------------------------- */

static void qe_fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Set while the command line is parsed: errors then point at --help. */
static int qe_parsing_args;

static void qe_fail(int code, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, QE_PROG ": ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (qe_parsing_args)
    fprintf(stderr, " (see " QE_PROG " --help)");
  fputc('\n', stderr);
  exit(code);
}

/* A library call that failed: its function, status and message. */
static void qe_check(zpp_status_t st, const char *call) {
  if (st != ZPP_OK)
    qe_fail(QE_EXIT_LIBRARY, "%s failed: %s: %s", call,
            zpp_status_string(st), zpp_get_last_error());
}

static void *qe_malloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (p == NULL)
    qe_fail(QE_EXIT_LIBRARY, "out of memory allocating %zu bytes for %s",
            bytes, what);
  return p;
}

/* ---- random numbers ------------------------------------------------------- */

/* xoshiro256** (Blackman and Vigna), state filled by splitmix64. */
typedef struct {
  uint64_t s[4];
  double spare; /* second Box-Muller value */
  int has_spare;
} qe_rng_t;

static uint64_t qe_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t qe_rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

/* Independent streams of one seed: the data of a distribution depends only
 * on (seed, stream, n), not on which other distributions are listed. */
static void qe_rng_init(qe_rng_t *r, uint64_t seed, uint64_t stream) {
  uint64_t sm = seed ^ (0xd1b54a32d192ed03ull * (stream + 1));
  int i;
  for (i = 0; i < 4; i++)
    r->s[i] = qe_splitmix64(&sm);
  r->has_spare = 0;
  r->spare = 0.0;
}

static uint64_t qe_rng_next(qe_rng_t *r) {
  uint64_t *s = r->s;
  uint64_t result = qe_rotl(s[1] * 5u, 7) * 9u;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = qe_rotl(s[3], 45);
  return result;
}

/* 53 random bits as a double: k * 2^-53, k in [0, 2^53). */
static double qe_rng_k53(qe_rng_t *r) {
  return (double)(qe_rng_next(r) >> 11);
}

/* Uniform index in [0, n) without modulo bias. */
static size_t qe_rng_index(qe_rng_t *r, size_t n) {
  uint64_t lim = UINT64_MAX - UINT64_MAX % (uint64_t)n;
  uint64_t x;
  do {
    x = qe_rng_next(r);
  } while (x >= lim);
  return (size_t)(x % (uint64_t)n);
}

/* Uniform on [-sqrt(3), sqrt(3)): unit variance. */
static double qe_sample_uniform(qe_rng_t *r) {
  double u = qe_rng_k53(r) * 0x1.0p-53; /* [0, 1) */
  return sqrt(3.0) * (2.0 * u - 1.0);
}

/* Standard normal by Box-Muller; u1 in (0, 1] keeps log finite. */
static double qe_sample_normal(qe_rng_t *r) {
  double u1, u2, rad, ang;
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  u1 = (qe_rng_k53(r) + 1.0) * 0x1.0p-53;
  u2 = qe_rng_k53(r) * 0x1.0p-53;
  rad = sqrt(-2.0 * log(u1));
  ang = 6.283185307179586476925286766559 * u2;
  r->spare = rad * sin(ang);
  r->has_spare = 1;
  return rad * cos(ang);
}

/* Laplace with unit variance (b = 1/sqrt(2)) by the inverse CDF;
 * u in (-1/2, 1/2) open, so the log stays finite. */
static double qe_sample_laplace(qe_rng_t *r) {
  double u = (qe_rng_k53(r) + 0.5) * 0x1.0p-53 - 0.5;
  double b = 0.70710678118654752440;
  double mag = -b * log1p(-2.0 * fabs(u));
  return u < 0 ? -mag : mag;
}

/* ---- options -------------------------------------------------------------- */

enum { QE_NORMAL = 0, QE_UNIFORM, QE_LAPLACE, QE_NORMAL_OUTLIERS, QE_NDIST };
static const char *const qe_dist_names[QE_NDIST] = {"normal", "uniform",
                                                    "laplace",
                                                    "normal-outliers"};

enum { QE_FMT_TABLE = 0, QE_FMT_CSV, QE_FMT_JSON };

typedef struct {
  int dists[QE_MAX_LIST];
  int ndists;
  int bits[QE_MAX_LIST];
  int nbits;
  size_t blocks[QE_MAX_LIST]; /* 0: the whole tensor */
  int nblocks;
  int modes[QE_MAX_LIST]; /* zpp_quant_mode_t */
  int nmodes;
  size_t n;
  uint64_t seed;
  size_t outliers;
  double outlier_scale;
  int dtype; /* zpp_dtype_t, or -1: the file's own */
  int decode_fp32;
  const char *input;
  int input_dtype; /* raw files only; -1 unset */
  int format;
  /* generator flags given explicitly: an error together with --input */
  const char *gen_flag_given;
  /* transforms: Hadamard group sizes (0: off) and roundings; with either
   * flag the output gains the columns hadamard,rounding */
  size_t hadamards[QE_MAX_LIST];
  int nhadamards;
  int roundings[QE_MAX_LIST]; /* zpp_rounding_t */
  int nroundings;
  int extra_cols;
} qe_opts_t;

static void qe_usage(FILE *out) {
  fprintf(out,
"Usage: " QE_PROG " [options]\n"
"Quantization error of the zpp block quantizer (encode then decode through\n"
"the public API) for every combination of distribution/tensor, bits, mode\n"
"and block size.  Sums are float64.  The flags and columns are those of\n"
"python -m zpp.quant_error, which reads .npy, .safetensors and torch files.\n"
"\n"
"Data (synthetic; this tool only):\n"
"  --dist LIST          normal, uniform, laplace, normal-outliers or all\n"
"                       (comma list; default normal).  All have unit\n"
"                       variance; normal-outliers is the normal tensor of\n"
"                       the same seed with --outliers positions scaled\n"
"  --outliers N         outlier count for normal-outliers (default 16)\n"
"  --outlier-scale S    outlier factor (default 100)\n"
"  --n N                elements (default 1048576)\n"
"Data (from a file; the generator flags above are then refused):\n"
"  --input FILE         with --input-dtype: a raw little-endian file (both\n"
"                       front ends).  Without it, .npy, .safetensors and\n"
"                       torch checkpoints, which this tool does not parse:\n"
"                       python -m zpp.quant_error reads them (numpy,\n"
"                       safetensors, torch) with these flags and columns\n"
"  --input-dtype T      dtype of a raw file: fp32, fp16 or bf16\n"
"  --seed S             generator seed, and the seed of stochastic rounding\n"
"                       (default %llu; printed)\n"
"Quantizer:\n"
"  --bits LIST          8 and/or 4 (default 8,4)\n"
"  --block LIST         block sizes in elements; 0: one scale for the whole\n"
"                       tensor (default 32,64,128,256,512,1024,2048,4096,0)\n"
"  --mode LIST          sym and/or asym (default sym,asym)\n"
"  --sym, --asym        add one mode (same as --mode)\n"
"  --dtype T            fp32, fp16 or bf16: the data is rounded to T (RNE;\n"
"                       bf16 from fp32, never through fp16) and encoded\n"
"                       from T (default fp32; with --input the file's dtype)\n"
"  --decode-to D        same (decode into the data's dtype, as a\n"
"                       collective would; default) or fp32 (quantizer error\n"
"                       alone)\n"
"  --hadamard LIST      Hadamard group sizes (powers of two >= 2; 0: off;\n"
"                       default 0): the tensor is rotated in groups of G\n"
"                       (zpp_hadamard, as qgZ's option does; the last n %% G\n"
"                       elements stay), encoded and decoded in fp32,\n"
"                       rotated back, then stored in the data's dtype.  A\n"
"                       block must be a multiple of G (other pairs are\n"
"                       skipped with a note); the whole tensor always is\n"
"  --rounding LIST      nearest and/or stochastic (default nearest; the\n"
"                       stochastic seed is --seed).  With --hadamard or\n"
"                       --rounding the columns hadamard,rounding follow\n"
"                       bits_per_elem\n"
"Output:\n"
"  --format F           table (default), csv or json.  Columns:\n"
"                       dist,bits,block,mode,rel_l2,max_abs,snr_db,\n"
"                       bits_per_elem.  rel_l2 = ||x_hat-x||/||x||,\n"
"                       snr_db = 20 log10(||x||/||x_hat-x||) (inf: exact),\n"
"                       bits_per_elem = 8 * encoded bytes / n.  The run's\n"
"                       settings go to stdout as '#' lines for table, to\n"
"                       stderr for csv/json\n"
"  --print-settings     print every ZPP_* setting and exit\n"
"  --help               this text\n"
"Exit status: 0 ok, 2 bad flag or input file, 1 library error.\n",
          (unsigned long long)QE_DEFAULT_SEED);
}

/* Strict unsigned parse: digits only, no sign, no overflow. */
static int qe_parse_u64(const char *s, uint64_t *out) {
  uint64_t v = 0;
  if (*s == '\0')
    return -1;
  for (; *s; s++) {
    unsigned d;
    if (*s < '0' || *s > '9')
      return -1;
    d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10u)
      return -1;
    v = v * 10u + d;
  }
  *out = v;
  return 0;
}

static size_t qe_parse_size(const char *flag, const char *s) {
  uint64_t v;
  if (qe_parse_u64(s, &v) != 0 || v > SIZE_MAX)
    qe_fail(QE_EXIT_USAGE, "%s %s: must be a non-negative integer", flag, s);
  return (size_t)v;
}

/* Splits a comma list, calling `item` on each entry (empty ones refused). */
static void qe_parse_list(const char *flag, const char *list, int *count,
                          void (*item)(const char *flag, const char *tok,
                                       int idx, void *ctx),
                          void *ctx) {
  char buf[1024];
  char *tok, *save = NULL;
  size_t len = strlen(list);
  int k = 0;
  if (len == 0 || len >= sizeof buf)
    qe_fail(QE_EXIT_USAGE, "%s '%s': must be a comma list of 1 to %d items",
            flag, list, QE_MAX_LIST);
  if (list[0] == ',' || list[len - 1] == ',' || strstr(list, ",,") != NULL)
    qe_fail(QE_EXIT_USAGE, "%s '%s': empty item in the list", flag, list);
  memcpy(buf, list, len + 1);
  for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (k >= QE_MAX_LIST)
      qe_fail(QE_EXIT_USAGE, "%s '%s': more than %d items", flag, list,
              QE_MAX_LIST);
    item(flag, tok, k, ctx);
    k++;
  }
  *count = k;
}

static void qe_item_dist(const char *flag, const char *tok, int idx,
                         void *ctx) {
  int *dists = ctx, d;
  for (d = 0; d < QE_NDIST; d++)
    if (strcmp(tok, qe_dist_names[d]) == 0) {
      dists[idx] = d;
      return;
    }
  qe_fail(QE_EXIT_USAGE,
          "%s %s: unknown distribution (normal, uniform, laplace, "
          "normal-outliers or all)",
          flag, tok);
}

static void qe_item_bits(const char *flag, const char *tok, int idx,
                         void *ctx) {
  int *bits = ctx;
  if (strcmp(tok, "8") == 0)
    bits[idx] = 8;
  else if (strcmp(tok, "4") == 0)
    bits[idx] = 4;
  else
    qe_fail(QE_EXIT_USAGE, "%s %s: must be 8 or 4", flag, tok);
}

static void qe_item_block(const char *flag, const char *tok, int idx,
                          void *ctx) {
  size_t *blocks = ctx;
  blocks[idx] = qe_parse_size(flag, tok);
}

static void qe_item_mode(const char *flag, const char *tok, int idx,
                         void *ctx) {
  int *modes = ctx;
  if (strcmp(tok, "sym") == 0)
    modes[idx] = ZPP_QUANT_SYMMETRIC;
  else if (strcmp(tok, "asym") == 0)
    modes[idx] = ZPP_QUANT_ASYMMETRIC;
  else
    qe_fail(QE_EXIT_USAGE, "%s %s: must be sym or asym", flag, tok);
}

static void qe_item_hadamard(const char *flag, const char *tok, int idx,
                             void *ctx) {
  size_t *g = ctx;
  g[idx] = qe_parse_size(flag, tok);
  if (g[idx] != 0 && (g[idx] < 2 || (g[idx] & (g[idx] - 1)) != 0))
    qe_fail(QE_EXIT_USAGE, "%s %s: must be 0 (off) or a power of two >= 2",
            flag, tok);
}

static void qe_item_rounding(const char *flag, const char *tok, int idx,
                             void *ctx) {
  int *r = ctx;
  if (strcmp(tok, "nearest") == 0)
    r[idx] = ZPP_ROUND_NEAREST;
  else if (strcmp(tok, "stochastic") == 0)
    r[idx] = ZPP_ROUND_STOCHASTIC;
  else
    qe_fail(QE_EXIT_USAGE, "%s %s: must be nearest or stochastic", flag, tok);
}

static int qe_parse_dtype(const char *flag, const char *s) {
  zpp_dtype_t dt;
  /* u8 parses (zpp_allgather moves bytes) but is no data to quantize */
  if (zpp_dtype_parse(s, &dt) != ZPP_OK || dt == ZPP_UINT8)
    qe_fail(QE_EXIT_USAGE, "%s %s: must be fp32, fp16 or bf16", flag, s);
  return (int)dt;
}

static void qe_add_mode(qe_opts_t *o, int mode) {
  int i;
  for (i = 0; i < o->nmodes; i++)
    if (o->modes[i] == mode)
      return;
  o->modes[o->nmodes++] = mode;
}

static int qe_ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Names of files whose header gives the dtype (python/zpp/quant_error.py
 * reads them); .bin is raw with --input-dtype, a torch checkpoint without. */
static int qe_has_header(const char *path) {
  static const char *const sfx[] = {".npy", ".safetensors", ".pt", ".pth",
                                    ".ckpt"};
  size_t i;
  for (i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
    if (qe_ends_with(path, sfx[i]))
      return 1;
  return 0;
}

static void qe_parse_args(int argc, char **argv, qe_opts_t *o) {
  static const size_t default_blocks[] = {32,  64,   128,  256, 512,
                                          1024, 2048, 4096, 0};
  int i;
  size_t k;

  memset(o, 0, sizeof *o);
  o->dists[0] = QE_NORMAL;
  o->ndists = 1;
  o->bits[0] = 8;
  o->bits[1] = 4;
  o->nbits = 2;
  for (k = 0; k < sizeof default_blocks / sizeof default_blocks[0]; k++)
    o->blocks[k] = default_blocks[k];
  o->nblocks = (int)k;
  o->n = QE_DEFAULT_N;
  o->seed = QE_DEFAULT_SEED;
  o->outliers = 16;
  o->outlier_scale = 100.0;
  o->dtype = -1;
  o->input_dtype = -1;
  o->format = QE_FMT_TABLE;
  o->nhadamards = 1;
  o->nroundings = 1;

  static const char *const valued[] = {
      "--dist",  "--outliers", "--outlier-scale", "--n",
      "--seed",  "--bits",     "--block",         "--mode",
      "--dtype", "--decode-to", "--input",        "--input-dtype",
      "--format", "--hadamard", "--rounding"};
  qe_parsing_args = 1;
  for (i = 1; i < argc; i++) {
    char flag[64];
    size_t v;
    const char *arg = argv[i], *val = NULL, *eq;
    size_t flen;
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      qe_usage(stdout);
      exit(0);
    }
    if (strcmp(arg, "--print-settings") == 0) {
      qe_check(zpp_settings_print(stdout), "zpp_settings_print");
      exit(0);
    }
    if (strcmp(arg, "--sym") == 0 || strcmp(arg, "--asym") == 0) {
      qe_add_mode(o, arg[2] == 's' ? ZPP_QUANT_SYMMETRIC
                                   : ZPP_QUANT_ASYMMETRIC);
      continue;
    }
    if (strncmp(arg, "--", 2) != 0)
      qe_fail(QE_EXIT_USAGE, "unexpected argument '%s'", arg);
    eq = strchr(arg, '=');
    flen = eq ? (size_t)(eq - arg) : strlen(arg);
    if (flen >= sizeof flag)
      qe_fail(QE_EXIT_USAGE, "unknown flag '%s'", arg);
    memcpy(flag, arg, flen);
    flag[flen] = '\0';
    for (v = 0; v < sizeof valued / sizeof valued[0]; v++)
      if (strcmp(flag, valued[v]) == 0)
        break;
    if (v == sizeof valued / sizeof valued[0])
      qe_fail(QE_EXIT_USAGE, "unknown flag '%s'", flag);
    if (eq) {
      val = eq + 1;
    } else if (i + 1 < argc) {
      val = argv[++i];
    } else {
      qe_fail(QE_EXIT_USAGE, "%s: missing value", flag);
    }

    if (strcmp(flag, "--dist") == 0) {
      o->gen_flag_given = "--dist";
      if (strcmp(val, "all") == 0) {
        int d;
        for (d = 0; d < QE_NDIST; d++)
          o->dists[d] = d;
        o->ndists = QE_NDIST;
      } else {
        qe_parse_list(flag, val, &o->ndists, qe_item_dist, o->dists);
      }
    } else if (strcmp(flag, "--outliers") == 0) {
      o->gen_flag_given = "--outliers";
      o->outliers = qe_parse_size(flag, val);
    } else if (strcmp(flag, "--outlier-scale") == 0) {
      char *end;
      o->gen_flag_given = "--outlier-scale";
      errno = 0;
      o->outlier_scale = strtod(val, &end);
      if (*val == '\0' || *end != '\0' || errno != 0 ||
          !isfinite(o->outlier_scale))
        qe_fail(QE_EXIT_USAGE, "%s %s: must be a finite number", flag, val);
    } else if (strcmp(flag, "--n") == 0) {
      o->gen_flag_given = "--n";
      o->n = qe_parse_size(flag, val);
      if (o->n == 0)
        qe_fail(QE_EXIT_USAGE, "%s 0: must be >= 1", flag);
    } else if (strcmp(flag, "--seed") == 0) {
      if (qe_parse_u64(val, &o->seed) != 0)
        qe_fail(QE_EXIT_USAGE, "%s %s: must be an unsigned 64-bit integer",
                flag, val);
    } else if (strcmp(flag, "--bits") == 0) {
      qe_parse_list(flag, val, &o->nbits, qe_item_bits, o->bits);
    } else if (strcmp(flag, "--block") == 0) {
      qe_parse_list(flag, val, &o->nblocks, qe_item_block, o->blocks);
    } else if (strcmp(flag, "--mode") == 0) {
      int modes[QE_MAX_LIST], nm, m;
      qe_parse_list(flag, val, &nm, qe_item_mode, modes);
      for (m = 0; m < nm; m++)
        qe_add_mode(o, modes[m]);
    } else if (strcmp(flag, "--dtype") == 0) {
      o->dtype = qe_parse_dtype(flag, val);
    } else if (strcmp(flag, "--decode-to") == 0) {
      if (strcmp(val, "same") == 0)
        o->decode_fp32 = 0;
      else if (strcmp(val, "fp32") == 0)
        o->decode_fp32 = 1;
      else
        qe_fail(QE_EXIT_USAGE, "%s %s: must be same or fp32", flag, val);
    } else if (strcmp(flag, "--input") == 0) {
      if (*val == '\0')
        qe_fail(QE_EXIT_USAGE, "%s: empty file name", flag);
      o->input = val;
    } else if (strcmp(flag, "--input-dtype") == 0) {
      o->input_dtype = qe_parse_dtype(flag, val);
    } else if (strcmp(flag, "--hadamard") == 0) {
      qe_parse_list(flag, val, &o->nhadamards, qe_item_hadamard, o->hadamards);
      o->extra_cols = 1;
    } else if (strcmp(flag, "--rounding") == 0) {
      qe_parse_list(flag, val, &o->nroundings, qe_item_rounding, o->roundings);
      o->extra_cols = 1;
    } else if (strcmp(flag, "--format") == 0) {
      if (strcmp(val, "table") == 0)
        o->format = QE_FMT_TABLE;
      else if (strcmp(val, "csv") == 0)
        o->format = QE_FMT_CSV;
      else if (strcmp(val, "json") == 0)
        o->format = QE_FMT_JSON;
      else
        qe_fail(QE_EXIT_USAGE, "%s %s: must be table, csv or json", flag,
                val);
    }
  }

  if (o->nmodes == 0) { /* no --mode, --sym or --asym: both */
    o->modes[0] = ZPP_QUANT_SYMMETRIC;
    o->modes[1] = ZPP_QUANT_ASYMMETRIC;
    o->nmodes = 2;
  }
  if (o->input != NULL && o->gen_flag_given != NULL)
    qe_fail(QE_EXIT_USAGE,
            "%s: generates synthetic data and cannot be combined with "
            "--input %s",
            o->gen_flag_given, o->input);
  if (o->input == NULL && o->input_dtype >= 0)
    qe_fail(QE_EXIT_USAGE, "--input-dtype: only with --input");
  /* Formats with a header are the Python front end's: this tool parses
   * nothing (docs/api.md, "Quantization error tool"). */
  if (o->input != NULL && o->input_dtype < 0)
    qe_fail(QE_EXIT_USAGE,
            "--input %s: this tool reads raw little-endian files only, "
            "with --input-dtype fp32|fp16|bf16; .npy, .safetensors and "
            "torch checkpoints are read by python -m zpp.quant_error "
            "--input %s (same flags and columns)",
            o->input, o->input);
  if (o->input != NULL && qe_has_header(o->input))
    qe_fail(QE_EXIT_USAGE,
            "--input-dtype: only for raw files; %s has a header that gives "
            "its dtype (python -m zpp.quant_error --input %s reads it)",
            o->input, o->input);
  if (o->input == NULL && o->outliers > o->n) {
    int d;
    for (d = 0; d < o->ndists; d++)
      if (o->dists[d] == QE_NORMAL_OUTLIERS)
        qe_fail(QE_EXIT_USAGE, "--outliers %zu: must be <= --n %zu",
                o->outliers, o->n);
  }
  qe_parsing_args = 0;
}

/* ---- tensors -------------------------------------------------------------- */

typedef struct {
  const char *name; /* rows point here: static or in argv */
  int dtype;        /* zpp_dtype_t */
  size_t n;
  void *data; /* n elements of dtype */
} qe_tensor_t;

/* Rounds t to `dtype` through fp32 (exact for every source dtype), so
 * fp16 -> bf16 is one RNE rounding of the fp32 value, never via fp16. */
static void qe_tensor_convert(qe_tensor_t *t, int dtype) {
  void *out;
  size_t i;
  if (t->dtype == dtype)
    return;
  out = qe_malloc(t->n * zpp_dtype_size((zpp_dtype_t)dtype), "a tensor");
  for (i = 0; i < t->n; i++)
    zpp_qm_store(out, i, dtype, zpp_qm_load(t->data, i, t->dtype));
  free(t->data);
  t->data = out;
  t->dtype = dtype;
}

/* Synthetic tensor of distribution d as fp32. */
static void qe_generate(const qe_opts_t *o, int d, qe_tensor_t *t) {
  qe_rng_t rng;
  float *x;
  size_t i, n = o->n;
  /* normal-outliers shares the normal stream: it is the normal tensor of
   * the same seed with outliers added, so the two rows compare directly. */
  int base = d == QE_NORMAL_OUTLIERS ? QE_NORMAL : d;

  if (n > SIZE_MAX / sizeof(float))
    qe_fail(QE_EXIT_USAGE, "--n %zu: too large", n);
  x = qe_malloc(n * sizeof(float), "--n elements");
  qe_rng_init(&rng, o->seed, (uint64_t)base);
  for (i = 0; i < n; i++) {
    double v = base == QE_UNIFORM   ? qe_sample_uniform(&rng)
               : base == QE_LAPLACE ? qe_sample_laplace(&rng)
                                    : qe_sample_normal(&rng);
    x[i] = (float)v;
  }
  if (d == QE_NORMAL_OUTLIERS && o->outliers > 0) {
    /* distinct positions, drawn by rejection against a bitmap */
    unsigned char *taken = qe_malloc(n / 8 + 1, "the outlier bitmap");
    size_t k = 0;
    memset(taken, 0, n / 8 + 1);
    qe_rng_init(&rng, o->seed, (uint64_t)QE_NORMAL_OUTLIERS);
    while (k < o->outliers) {
      size_t pos = qe_rng_index(&rng, n);
      if (taken[pos / 8] & (1u << (pos % 8)))
        continue;
      taken[pos / 8] |= (unsigned char)(1u << (pos % 8));
      x[pos] = (float)((double)x[pos] * o->outlier_scale);
      k++;
    }
    free(taken);
  }
  t->name = qe_dist_names[d];
  t->dtype = ZPP_FLOAT32;
  t->n = n;
  t->data = x;
}

/* ---- raw file input: bytes as they are, no header ------------------------ */

static FILE *qe_open(const char *path, off_t *size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    qe_fail(QE_EXIT_USAGE, "--input %s: cannot open: %s", path,
            strerror(errno));
  if (fseeko(f, 0, SEEK_END) != 0 || (*size = ftello(f)) < 0 ||
      fseeko(f, 0, SEEK_SET) != 0)
    qe_fail(QE_EXIT_USAGE, "--input %s: cannot seek: %s", path,
            strerror(errno));
  return f;
}

static void qe_read_at(FILE *f, const char *path, off_t off, void *buf,
                       size_t bytes) {
  if (fseeko(f, off, SEEK_SET) != 0 || fread(buf, 1, bytes, f) != bytes)
    qe_fail(QE_EXIT_USAGE, "--input %s: cannot read %zu bytes at offset %lld",
            path, bytes, (long long)off);
}

static const char *qe_basename(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static void qe_read_raw(const qe_opts_t *o, qe_tensor_t *t) {
  off_t size;
  size_t es;
  FILE *f = qe_open(o->input, &size);
  es = zpp_dtype_size((zpp_dtype_t)o->input_dtype);
  if (size == 0 || (uint64_t)size % es != 0 || (uint64_t)size > SIZE_MAX)
    qe_fail(QE_EXIT_USAGE,
            "--input %s: %lld bytes is not a positive multiple of %zu "
            "(--input-dtype %s)",
            o->input, (long long)size, es,
            zpp_dtype_name((zpp_dtype_t)o->input_dtype));
  t->name = qe_basename(o->input); /* argv outlives the rows */
  t->dtype = o->input_dtype;
  t->n = (size_t)size / es;
  t->data = qe_malloc((size_t)size, "the input data");
  qe_read_at(f, o->input, 0, t->data, (size_t)size);
  fclose(f);
}

/* ---- measurement ---------------------------------------------------------- */

/* Sums of one (tensor or overall, bits, mode, block) combination. */
typedef struct {
  const char *name;
  int bits;
  size_t block; /* as requested: 0 is the whole tensor */
  int mode;
  size_t hadamard; /* 0: off */
  int rounding;
  double sum_x2, sum_e2, max_abs;
  double bytes, n; /* exact up to 2^53 */
} qe_row_t;

typedef struct {
  qe_row_t *rows;
  size_t count, cap;
} qe_rows_t;

static qe_row_t *qe_rows_add(qe_rows_t *r) {
  if (r->count == r->cap) {
    qe_row_t *grown;
    r->cap = r->cap ? 2 * r->cap : 64;
    grown = realloc(r->rows, r->cap * sizeof *grown);
    if (grown == NULL)
      qe_fail(QE_EXIT_LIBRARY, "out of memory for the result rows");
    r->rows = grown;
  }
  memset(&r->rows[r->count], 0, sizeof r->rows[0]);
  return &r->rows[r->count++];
}

static void qe_measure(const qe_tensor_t *t, int bits, int mode,
                       size_t block, size_t had, int rounding, uint64_t seed,
                       int decode_fp32, qe_row_t *row) {
  zpp_quant_config_t cfg = ZPP_QUANT_CONFIG_INIT;
  int out_dtype = decode_fp32 ? ZPP_FLOAT32 : t->dtype;
  size_t bytes, i;
  void *enc, *dec;
  double sx = 0.0, se = 0.0, mx = 0.0;

  cfg.bits = bits;
  cfg.mode = (zpp_quant_mode_t)mode;
  cfg.block_size = block == 0 ? t->n : block;
  cfg.rounding = (zpp_rounding_t)rounding;
  cfg.seed = seed;
  qe_check(zpp_quant_encoded_size(&cfg, t->n, &bytes),
           "zpp_quant_encoded_size");
  enc = qe_malloc(bytes, "the encoded tensor");
  dec = qe_malloc(t->n * zpp_dtype_size((zpp_dtype_t)out_dtype),
                  "the decoded tensor");
  if (had == 0) {
    qe_check(zpp_quant_encode(&cfg, (zpp_dtype_t)t->dtype, t->data, t->n, enc,
                              bytes),
             "zpp_quant_encode");
    qe_check(zpp_quant_decode(&cfg, enc, bytes, t->n, (zpp_dtype_t)out_dtype,
                              dec),
             "zpp_quant_decode");
  } else { /* rotate, encode and decode in fp32, rotate back, store */
    float *rot = qe_malloc(t->n * sizeof(float), "the rotated tensor");
    qe_check(zpp_hadamard(had, (zpp_dtype_t)t->dtype, t->data, t->n, rot),
             "zpp_hadamard");
    qe_check(zpp_quant_encode(&cfg, ZPP_FLOAT32, rot, t->n, enc, bytes),
             "zpp_quant_encode");
    qe_check(zpp_quant_decode(&cfg, enc, bytes, t->n, ZPP_FLOAT32, rot),
             "zpp_quant_decode");
    qe_check(zpp_hadamard(had, ZPP_FLOAT32, rot, t->n, rot), "zpp_hadamard");
    for (i = 0; i < t->n; i++)
      zpp_qm_store(dec, i, out_dtype, rot[i]);
    free(rot);
  }
  for (i = 0; i < t->n; i++) {
    double x = zpp_qm_load(t->data, i, t->dtype);
    double y = zpp_qm_load(dec, i, out_dtype);
    double e = y - x; /* exact: both are floats */
    double a = fabs(e);
    sx += x * x;
    se += e * e;
    /* a NaN, once met, stays (as numpy's max, which the Python front end
     * uses); a plain !(a <= mx) would let the next number replace it */
    if (!(a <= mx) && mx == mx)
      mx = a;
  }
  free(enc);
  free(dec);
  row->name = t->name;
  row->bits = bits;
  row->block = block;
  row->mode = mode;
  row->hadamard = had;
  row->rounding = rounding;
  row->sum_x2 = sx;
  row->sum_e2 = se;
  row->max_abs = mx;
  row->bytes = (double)bytes;
  row->n = (double)t->n;
}

/* Every (bits, mode, block, hadamard, rounding) of one tensor, in that
 * nesting order; a Hadamard group must divide the block (as qgZ asks). */
static void qe_measure_all(const qe_opts_t *o, const qe_tensor_t *t,
                           qe_rows_t *rows) {
  int b, m, k, h, r;
  for (b = 0; b < o->nbits; b++)
    for (m = 0; m < o->nmodes; m++)
      for (k = 0; k < o->nblocks; k++)
        for (h = 0; h < o->nhadamards; h++)
          for (r = 0; r < o->nroundings; r++) {
            size_t g = o->hadamards[h], blk = o->blocks[k];
            if (g != 0 && blk != 0 && blk % g != 0) {
              static int noted[QE_MAX_LIST][QE_MAX_LIST];
              if (!noted[k][h]++)
                fprintf(stderr, QE_PROG ": note: block %zu is not a multiple "
                                "of --hadamard %zu: skipped\n",
                        blk, g);
              continue;
            }
            qe_measure(t, o->bits[b], o->modes[m], blk, g, o->roundings[r],
                       o->seed, o->decode_fp32, qe_rows_add(rows));
          }
}

/* ---- output --------------------------------------------------------------- */

typedef struct {
  double rel_l2, max_abs, snr_db, bits_per_elem;
} qe_metrics_t;

static qe_metrics_t qe_metrics(const qe_row_t *r) {
  qe_metrics_t m;
  if (r->sum_e2 == 0.0) {
    m.rel_l2 = 0.0;
    m.snr_db = INFINITY;
  } else if (r->sum_x2 == 0.0) {
    m.rel_l2 = INFINITY;
    m.snr_db = -INFINITY;
  } else {
    m.rel_l2 = sqrt(r->sum_e2) / sqrt(r->sum_x2);
    m.snr_db = 20.0 * log10(sqrt(r->sum_x2) / sqrt(r->sum_e2));
  }
  m.max_abs = r->max_abs;
  m.bits_per_elem = 8.0 * r->bytes / r->n;
  return m;
}

/* Shortest %g text that reads back as the same double; inf/nan spelled. */
static const char *qe_num(char *buf, size_t cap, double v) {
  int prec;
  if (isnan(v))
    return "nan";
  if (isinf(v))
    return v > 0 ? "inf" : "-inf";
  for (prec = 15; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      break;
  }
  return buf;
}

static const char *qe_fixed(char *buf, size_t cap, const char *fmt,
                            double v) {
  if (isnan(v))
    return "nan";
  if (isinf(v))
    return v > 0 ? "inf" : "-inf";
  snprintf(buf, cap, fmt, v);
  return buf;
}

static const char *qe_mode_name(int mode) {
  return mode == ZPP_QUANT_ASYMMETRIC ? "asym" : "sym";
}

static const char *qe_rounding_name(int r) {
  return r == ZPP_ROUND_STOCHASTIC ? "stochastic" : "nearest";
}

static void qe_csv_field(FILE *out, const char *s) {
  if (strpbrk(s, ",\"\r\n") == NULL) {
    fputs(s, out);
    return;
  }
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', out);
    fputc(*s, out);
  }
  fputc('"', out);
}

static void qe_json_str_out(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c < 0x20)
      fprintf(out, "\\u%04x", c);
    else
      fputc(c, out);
  }
  fputc('"', out);
}

/* JSON has no inf/nan: they are written as the strings "inf", "nan". */
static void qe_json_num_out(FILE *out, double v) {
  char buf[40];
  const char *s = qe_num(buf, sizeof buf, v);
  if (isfinite(v))
    fputs(s, out);
  else
    fprintf(out, "\"%s\"", s);
}

static void qe_print(const qe_opts_t *o, const qe_rows_t *rows, FILE *out) {
  size_t i;
  char b1[40], b2[40], b3[40], b4[40];
  if (o->format == QE_FMT_CSV) {
    fprintf(out,
            "dist,bits,block,mode,rel_l2,max_abs,snr_db,bits_per_elem%s\n",
            o->extra_cols ? ",hadamard,rounding" : "");
    for (i = 0; i < rows->count; i++) {
      const qe_row_t *r = &rows->rows[i];
      qe_metrics_t m = qe_metrics(r);
      qe_csv_field(out, r->name);
      fprintf(out, ",%d,%zu,%s,%s,%s,%s,%s", r->bits, r->block,
              qe_mode_name(r->mode), qe_num(b1, sizeof b1, m.rel_l2),
              qe_num(b2, sizeof b2, m.max_abs),
              qe_num(b3, sizeof b3, m.snr_db),
              qe_num(b4, sizeof b4, m.bits_per_elem));
      if (o->extra_cols)
        fprintf(out, ",%zu,%s", r->hadamard, qe_rounding_name(r->rounding));
      fprintf(out, "\n");
    }
  } else if (o->format == QE_FMT_JSON) {
    fprintf(out, "[");
    for (i = 0; i < rows->count; i++) {
      const qe_row_t *r = &rows->rows[i];
      qe_metrics_t m = qe_metrics(r);
      fprintf(out, "%s\n  {\"dist\": ", i ? "," : "");
      qe_json_str_out(out, r->name);
      fprintf(out, ", \"bits\": %d, \"block\": %zu, \"mode\": \"%s\", ",
              r->bits, r->block, qe_mode_name(r->mode));
      fprintf(out, "\"rel_l2\": ");
      qe_json_num_out(out, m.rel_l2);
      fprintf(out, ", \"max_abs\": ");
      qe_json_num_out(out, m.max_abs);
      fprintf(out, ", \"snr_db\": ");
      qe_json_num_out(out, m.snr_db);
      fprintf(out, ", \"bits_per_elem\": ");
      qe_json_num_out(out, m.bits_per_elem);
      if (o->extra_cols)
        fprintf(out, ", \"hadamard\": %zu, \"rounding\": \"%s\"", r->hadamard,
                qe_rounding_name(r->rounding));
      fprintf(out, "}");
    }
    fprintf(out, "\n]\n");
  } else {
    int w = 4;
    for (i = 0; i < rows->count; i++) {
      int len = (int)strlen(rows->rows[i].name);
      if (len > w)
        w = len;
    }
    fprintf(out, "%-*s %4s %8s %4s %11s %11s %8s %13s", w, "dist", "bits",
            "block", "mode", "rel_l2", "max_abs", "snr_db", "bits_per_elem");
    if (o->extra_cols)
      fprintf(out, " %8s %10s", "hadamard", "rounding");
    fprintf(out, "\n");
    for (i = 0; i < rows->count; i++) {
      const qe_row_t *r = &rows->rows[i];
      qe_metrics_t m = qe_metrics(r);
      fprintf(out, "%-*s %4d %8zu %4s %11s %11s %8s %13s", w, r->name,
              r->bits, r->block, qe_mode_name(r->mode),
              qe_fixed(b1, sizeof b1, "%.4e", m.rel_l2),
              qe_fixed(b2, sizeof b2, "%.4e", m.max_abs),
              qe_fixed(b3, sizeof b3, "%.2f", m.snr_db),
              qe_fixed(b4, sizeof b4, "%.4f", m.bits_per_elem));
      if (o->extra_cols)
        fprintf(out, " %8zu %10s", r->hadamard, qe_rounding_name(r->rounding));
      fprintf(out, "\n");
    }
  }
}

/* ---- main ----------------------------------------------------------------- */

/* The settings of this run, one '#' line: on stdout above a table, on
 * stderr for csv/json so that their stdout stays machine-readable. */
static void qe_print_run(const qe_opts_t *o, const char *source, FILE *out) {
  int version = 0;
  zpp_get_version(&version);
  fprintf(out, "# " QE_PROG " (zpp %d.%d.%d, cpu path %s): %s", version / 10000,
          version / 100 % 100, version % 100, zpp_quant_cpu_isa(), source);
  if (o->input == NULL)
    fprintf(out, " n=%zu seed=%llu outliers=%zu outlier-scale=%g", o->n,
            (unsigned long long)o->seed, o->outliers, o->outlier_scale);
  else
    fprintf(out, " seed=%llu", (unsigned long long)o->seed);
  fprintf(out, " dtype=%s decode-to=%s\n",
          o->dtype >= 0     ? zpp_dtype_name((zpp_dtype_t)o->dtype)
          : o->input == NULL ? "fp32"
                             : "file's",
          o->decode_fp32 ? "fp32" : "same");
}

static void qe_tensor_free(qe_tensor_t *t) {
  free(t->data);
  t->data = NULL;
}

int main(int argc, char **argv) {
  qe_opts_t o;
  qe_rows_t rows = {NULL, 0, 0};
  char source[256];
  FILE *info;

  qe_parse_args(argc, argv, &o);
  info = o.format == QE_FMT_TABLE ? stdout : stderr;

  if (o.input == NULL) {
    int d;
    snprintf(source, sizeof source, "synthetic");
    qe_print_run(&o, source, info);
    for (d = 0; d < o.ndists; d++) {
      qe_tensor_t t;
      qe_generate(&o, o.dists[d], &t);
      qe_tensor_convert(&t, o.dtype >= 0 ? o.dtype : ZPP_FLOAT32);
      qe_measure_all(&o, &t, &rows);
      qe_tensor_free(&t);
    }
  } else {
    qe_tensor_t t;
    qe_read_raw(&o, &t);
    snprintf(source, sizeof source, "input=%s (raw, %zu elements, %s)",
             o.input, t.n, zpp_dtype_name((zpp_dtype_t)t.dtype));
    qe_print_run(&o, source, info);
    if (o.dtype >= 0)
      qe_tensor_convert(&t, o.dtype);
    qe_measure_all(&o, &t, &rows);
    qe_tensor_free(&t);
  }

  qe_print(&o, &rows, stdout);
  if (fflush(stdout) != 0 || ferror(stdout))
    qe_fail(QE_EXIT_LIBRARY, "writing the results failed: %s",
            strerror(errno));
  free(rows.rows);
  return 0;
}
