/*
 * zpp-quant-bench: single-thread throughput of the CPU block quantizer
 * (encode, decode, decode-accumulate) for every input dtype and width,
 * each beside memcpy of the same number of bytes measured in the same run;
 * and qgZ's error feedback around an encode (fp32 and bf16 gradients, fp32
 * residual), fused (zpp_ew_encode_ef_host, one pass: `ef_fused`) and as
 * the sequence of passes it replaced (`ef_passes`: add the residual,
 * encode, decode, subtract), in the same run.
 *
 * Bandwidth is (bytes read + bytes written) / time, for the codec and for
 * memcpy alike, so `ratio` = codec GB/s / memcpy GB/s says how close the
 * codec comes to the memory system on this core.  Times are medians over
 * --iters runs after --warmup runs; codec and memcpy runs alternate so that
 * both see the same machine state.  Every row also checks the path's
 * output against the scalar reference (`wrong` = differing bytes); the
 * exit status is 1 when any row is wrong, 2 on a bad flag.
 *
 * --qgz-chain: instead, the CPU work one rank of a 2x4 qgZ reduce-scatter
 * does on its own input of --n elements (8 slices of n / 8), both
 * reductions (zpp_qgz_config_t.sum FLOAT and INT, INT4/INT4, block
 * --block; INT also unfused, with an agreement per chunk and without the
 * agreement's pass, see qc_int), in --chunks chunks as qgZ's host plan,
 * bf16 and fp32, each beside one memcpy of that input in the
 * same run: `ratio` = chain time / memcpy time, medians, and
 * `min_ratio` the same of the fastest runs (on a shared machine the runs
 * that no other process slowed down) (docs/collectives.md,
 * "Compressed-domain sums").  Exit status 1 when the fused INT chain's
 * output differs from the unfused one's.
 *
 * Pin it for stable numbers: taskset -c 1 zpp-quant-bench --isa avx2
 */
#include "zpp_internal/kernels.h"

#include <zpp/zpp.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { FMT_TABLE, FMT_CSV, FMT_JSON } fmt_t;

typedef struct {
  size_t n;     /* elements */
  size_t block; /* elements per block */
  int iters, warmup;
  const char *isa;
  fmt_t fmt;
  int asym;
  int cold; /* write COLD_BYTES elsewhere before every run */
  int qgz_chain; /* --qgz-chain */
  size_t chunks; /* --chunks */
} opts_t;

/* --cold: bytes written before each run (codec and memcpy alike), several
 * times any last-level cache of the machines we run on, so that a run
 * reads its input from memory, as the encode of a collective reads a
 * buffer the application wrote long before. */
#define COLD_BYTES ((size_t)256 << 20)
static unsigned char *cold_buf;

static void make_cold(const opts_t *o) {
  static unsigned char v;
  if (o->cold)
    memset(cold_buf, ++v, COLD_BYTES);
}

typedef struct {
  const char *op;
  const char *dtype;
  int bits;
  double bytes; /* read + written by one run */
  double ms, gbps, memcpy_ms, memcpy_gbps;
  size_t wrong;
} row_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int k) {
  qsort(v, (size_t)k, sizeof *v, cmp_double);
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: zpp-quant-bench [--n N] [--block B] [--iters I] [--warmup W]\n"
      "                       [--isa auto|scalar|avx2|avx512]\n"
      "                       [--format table|csv|json] [--sym|--asym] "
      "[--cold]\n"
      "                       [--qgz-chain [--chunks C]]\n"
      "  --n N        elements per buffer (default 16777216: out of cache)\n"
      "  --block B    elements per quantization block (default 256)\n"
      "  --iters I    timed runs per row; the median is reported (default 10)\n"
      "  --warmup W   untimed runs per row first (default 2)\n"
      "  --isa P      CPU path; auto = the library's choice (ZPP_CPU_ISA)\n"
      "  --format F   table (default), csv or json\n"
      "  --sym/--asym quantization mode (default symmetric)\n"
      "  --cold       write 256 MiB elsewhere before every run (codec and\n"
      "               memcpy alike): inputs come from memory, not cache\n"
      "  --qgz-chain  qgZ's kernels of one rank of a 2x4 call (FLOAT and\n"
      "               INT sums) against a memcpy of its input\n"
      "  --chunks C   --qgz-chain: chunks of the call (default 8, as qgZ's\n"
      "               host plan; 1: every step over the whole input)\n");
}

static int parse_size(const char *flag, const char *s, size_t min, size_t *out) {
  char *end;
  unsigned long long v;
  errno = 0;
  if (s == NULL || *s == '\0' || *s == '-') {
    fprintf(stderr, "zpp-quant-bench: %s needs a number\n", flag);
    return -1;
  }
  v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > SIZE_MAX / 8) {
    fprintf(stderr, "zpp-quant-bench: %s %s: must be an integer >= %zu\n", flag,
            s, min);
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    size_t x;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(a, "--sym") == 0) {
      o->asym = 0;
    } else if (strcmp(a, "--asym") == 0) {
      o->asym = 1;
    } else if (strcmp(a, "--cold") == 0) {
      o->cold = 1;
    } else if (strcmp(a, "--qgz-chain") == 0) {
      o->qgz_chain = 1;
    } else if (strcmp(a, "--n") == 0) {
      if (parse_size(a, v, 1, &o->n) != 0)
        return -1;
      i++;
    } else if (strcmp(a, "--chunks") == 0) {
      if (parse_size(a, v, 1, &o->chunks) != 0)
        return -1;
      i++;
    } else if (strcmp(a, "--block") == 0) {
      if (parse_size(a, v, 1, &o->block) != 0)
        return -1;
      i++;
    } else if (strcmp(a, "--iters") == 0 || strcmp(a, "--warmup") == 0) {
      int it = strcmp(a, "--iters") == 0;
      if (parse_size(a, v, it ? 1 : 0, &x) != 0)
        return -1;
      if (x > 100000) {
        fprintf(stderr, "zpp-quant-bench: %s %s: at most 100000\n", a, v);
        return -1;
      }
      *(it ? &o->iters : &o->warmup) = (int)x;
      i++;
    } else if (strcmp(a, "--isa") == 0) {
      if (v == NULL || (strcmp(v, "auto") != 0 && strcmp(v, "scalar") != 0 &&
                        strcmp(v, "avx2") != 0 && strcmp(v, "avx512") != 0)) {
        fprintf(stderr, "zpp-quant-bench: --isa %s: must be auto, scalar, "
                        "avx2 or avx512\n", v ? v : "(missing)");
        return -1;
      }
      o->isa = v;
      i++;
    } else if (strcmp(a, "--format") == 0) {
      if (v != NULL && strcmp(v, "table") == 0)
        o->fmt = FMT_TABLE;
      else if (v != NULL && strcmp(v, "csv") == 0)
        o->fmt = FMT_CSV;
      else if (v != NULL && strcmp(v, "json") == 0)
        o->fmt = FMT_JSON;
      else {
        fprintf(stderr, "zpp-quant-bench: --format %s: must be table, csv or "
                        "json\n", v ? v : "(missing)");
        return -1;
      }
      i++;
    } else {
      fprintf(stderr, "zpp-quant-bench: unknown argument '%s'\n", a);
      return -1;
    }
  }
  return 0;
}

static void cpu_model(char *buf, size_t len) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(buf, len, "unknown");
  if (f == NULL)
    return;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *c = strchr(line, ':');
      if (c != NULL) {
        c++;
        while (*c == ' ' || *c == '\t')
          c++;
        c[strcspn(c, "\n")] = '\0';
        snprintf(buf, len, "%s", c);
      }
      break;
    }
  }
  fclose(f);
}

/* Deterministic normal-ish data (sum of uniforms): finite, varied scales. */
static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static void fill_input(float *x, size_t n) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  size_t i;
  for (i = 0; i < n; i++) {
    uint64_t r = rng_next(&s);
    float u = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) +
              (float)((r >> 32) & 0xffff) - 98302.5f;
    x[i] = u * (1.0f / 32768.0f);
  }
}

static void *xalloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return NULL;
  memset(p, 0, bytes); /* fault the pages in before timing */
  return p;
}

typedef struct {
  const zpp_quant_cpu_ops_t *ops;
  zpp_qcfg_t q;
  int dtype;
  size_t n;
  const void *src;
  uint8_t *enc;
  void *out;
  int kind; /* 0 encode, 1 decode, 2 decode-accumulate, 3 error feedback
               fused, 4 error feedback in passes */
  float *res, *tmp; /* 3, 4: the residual; 4: x = g + res */
} job_t;

static void run_job(const job_t *j) {
  if (j->kind == 3) {
    zpp_ew_encode_ef_host(j->ops, &j->q, j->dtype, j->src, j->n, j->res, 0.0f,
                          j->enc);
  } else if (j->kind == 4) {
    zpp_ew_add_residual_host(j->dtype, j->src, j->res, j->n, j->tmp);
    j->ops->encode(&j->q, ZPP_QM_F32, j->tmp, j->n, j->enc);
    j->ops->decode(&j->q, j->enc, j->n, ZPP_QM_F32, j->res);
    zpp_ew_residual_host(j->tmp, j->n, j->res);
  } else if (j->kind == 0)
    j->ops->encode(&j->q, j->dtype, j->src, j->n, j->enc);
  else
    j->ops->decode(&j->q, j->enc, j->n,
                   j->kind == 1 ? j->dtype : ZPP_QM_OUT_ACC, j->out);
}

/* Times the job and a memcpy of the same read + written bytes, alternating. */
static void measure(const opts_t *o, const job_t *j, void *mc_dst,
                    const void *mc_src, row_t *r) {
  size_t mc_bytes = (size_t)(r->bytes / 2.0);
  double *t = malloc(sizeof(double) * (size_t)o->iters);
  double *m = malloc(sizeof(double) * (size_t)o->iters);
  int k;
  if (t == NULL || m == NULL) {
    fprintf(stderr, "zpp-quant-bench: out of memory\n");
    exit(1);
  }
  for (k = 0; k < o->warmup; k++) {
    make_cold(o);
    run_job(j);
    make_cold(o);
    memcpy(mc_dst, mc_src, mc_bytes);
  }
  for (k = 0; k < o->iters; k++) {
    double t0;
    make_cold(o);
    t0 = now_s();
    run_job(j);
    t[k] = now_s() - t0;
    make_cold(o);
    t0 = now_s();
    memcpy(mc_dst, mc_src, mc_bytes);
    m[k] = now_s() - t0;
  }
  r->ms = 1e3 * median(t, o->iters);
  r->memcpy_ms = 1e3 * median(m, o->iters);
  r->gbps = r->bytes / (r->ms * 1e6);
  r->memcpy_gbps = 2.0 * (double)mc_bytes / (r->memcpy_ms * 1e6);
  free(t);
  free(m);
}

static size_t count_diff(const void *a, const void *b, size_t len) {
  const uint8_t *x = a, *y = b;
  size_t i, d = 0;
  for (i = 0; i < len; i++)
    d += x[i] != y[i];
  return d;
}

static void print_header(const opts_t *o, const char *cpu, const char *isa) {
  if (o->fmt == FMT_JSON) {
    printf("{\"cpu\": \"%s\", \"isa\": \"%s\", \"n\": %zu, \"block\": %zu, "
           "\"mode\": \"%s\", \"iters\": %d, \"warmup\": %d, \"cold\": %d, "
           "\"rows\": [\n",
           cpu, isa, o->n, o->block, o->asym ? "asym" : "sym", o->iters,
           o->warmup, o->cold);
    return;
  }
  printf("# zpp-quant-bench: cpu \"%s\", isa %s, n %zu, block %zu, %s, "
         "iters %d (median), warmup %d, single thread",
         cpu, isa, o->n, o->block, o->asym ? "asym" : "sym", o->iters,
         o->warmup);
  if (o->cold)
    printf(", cold (%zu MiB written before each run)", COLD_BYTES >> 20);
  printf("\n");
  if (o->fmt == FMT_CSV)
    printf("op,dtype,bits,isa,block,n,mode,bytes,time_ms,gbps,memcpy_ms,"
           "memcpy_gbps,ratio,wrong\n");
  else
    printf("# %-10s %5s %4s %10s %9s %9s %11s %6s %6s\n", "op", "dtype", "bits",
           "bytes", "time_ms", "GB/s", "memcpy_GB/s", "ratio", "wrong");
}

static void print_row(const opts_t *o, const char *isa, const row_t *r,
                      int first) {
  double ratio = r->gbps / r->memcpy_gbps;
  if (o->fmt == FMT_JSON)
    printf("%s  {\"op\": \"%s\", \"dtype\": \"%s\", \"bits\": %d, "
           "\"bytes\": %.0f, \"time_ms\": %.4f, \"gbps\": %.3f, "
           "\"memcpy_ms\": %.4f, \"memcpy_gbps\": %.3f, \"ratio\": %.3f, "
           "\"wrong\": %zu}",
           first ? "" : ",\n", r->op, r->dtype, r->bits, r->bytes, r->ms,
           r->gbps, r->memcpy_ms, r->memcpy_gbps, ratio, r->wrong);
  else if (o->fmt == FMT_CSV)
    printf("%s,%s,%d,%s,%zu,%zu,%s,%.0f,%.4f,%.3f,%.4f,%.3f,%.3f,%zu\n", r->op,
           r->dtype, r->bits, isa, o->block, o->n, o->asym ? "asym" : "sym",
           r->bytes, r->ms, r->gbps, r->memcpy_ms, r->memcpy_gbps, ratio,
           r->wrong);
  else
    printf("  %-10s %5s %4d %10.0f %9.3f %9.2f %11.2f %6.2f %6zu\n", r->op,
           r->dtype, r->bits, r->bytes, r->ms, r->gbps, r->memcpy_gbps, ratio,
           r->wrong);
  fflush(stdout);
}

/* ---- --qgz-chain ----------------------------------------------------------
 * One rank of a 2x4 qgZ (node 0, local rank 0: it keeps partial sum 0 and
 * sends partial sum 1), with the messages it would receive stood in for by
 * the ones it encodes (the same sizes and work).  Kernels as qgZ's host
 * path calls them (src/coll/qgz_float.c, qgz_int.c). */
#define QC_S 4
#define QC_M 2
#define QC_W (QC_S * QC_M)

#define QC_DEPTH 3 /* chunk slots, as qgz_internal.h's QGZ_DEPTH */

typedef struct {
  const zpp_quant_cpu_ops_t *ops;
  int dtype, simd;
  size_t count, block;
  size_t chunk, nchunks; /* elements per chunk (whole blocks) */
  size_t ms, ms2;        /* bytes of a chunk's message slot: stage 1, 2 */
  const uint8_t *in;     /* W slices of count */
  /* QC_DEPTH slots of a chunk's messages: stage 1, (S - 1) M; stage 2 */
  uint8_t *msg[QC_W], *msg2;
  float *acc[QC_M];        /* QC_DEPTH slots of a chunk */
  int32_t *iacc[QC_M];     /* QC_DEPTH slots of a chunk (fused: a tile) */
  uint32_t *amax;          /* W nb: this rank's absmax */
  int8_t *uexp, *uexp_all; /* W nb; S W nb: the unit exponents */
  void *out;
} qc_t;

/* Element `off` of slice sl. */
static const void *qc_slice(const qc_t *c, int sl, size_t off) {
  return c->in + ((size_t)sl * c->count + off) * zpp_qm_dtype_bytes(c->dtype);
}

static size_t qc_len(const qc_t *c, size_t k) {
  size_t off = k * c->chunk;
  return c->count - off < c->chunk ? c->count - off : c->chunk;
}

static void qc_float(const qc_t *c, size_t k) {
  zpp_qcfg_t q = {4, 0, c->block, 0, 0, 0, 0};
  const uint8_t *srcs[QC_S - 1];
  size_t off = k * c->chunk, len = qc_len(c, k), sl = k % QC_DEPTH;
  uint8_t *m2 = c->msg2 + sl * c->ms2;
  float *acc[QC_M];
  int j, m, n = 0;
  for (m = 0; m < QC_M; m++)
    acc[m] = c->acc[m] + sl * c->chunk;
  for (j = 1; j < QC_S; j++) /* stage 1 encode */
    for (m = 0; m < QC_M; m++)
      c->ops->encode(&q, c->dtype, qc_slice(c, m * QC_S + j, off), len,
                     c->msg[n++] + sl * c->ms);
  for (m = 0; m < QC_M; m++) { /* stage 1 sums */
    for (j = 0; j < QC_S - 1; j++)
      srcs[j] = c->msg[j * QC_M + m] + sl * c->ms;
    if (zpp_ew_sum_decoded_host(c->ops, &q, c->simd, c->dtype,
                                qc_slice(c, m * QC_S, off), srcs, QC_S - 1, len,
                                acc[m]) != 0) {
      zpp_ew_to_f32_host(c->simd, c->dtype, qc_slice(c, m * QC_S, off), len,
                         acc[m]);
      for (j = 0; j < QC_S - 1; j++)
        c->ops->decode(&q, srcs[j], len, ZPP_QM_OUT_ACC, acc[m]);
    }
  }
  c->ops->encode(&q, ZPP_QM_F32, acc[1], len, m2); /* stage 2 */
  c->ops->decode(&q, m2, len, ZPP_QM_OUT_ACC, acc[0]);
  zpp_ew_finish_host(c->simd, acc[0], len, (float)QC_W, c->dtype,
                     (uint8_t *)c->out + off * zpp_qm_dtype_bytes(c->dtype));
}

/* INT variants: QC_INT the chain of qgz_int.c (the agreement: the absmax of
 * the whole input, before the chunks; per chunk the encode, the fused
 * stage-1 sum + re-quantization of the partial sum sent and the fused
 * stage-1 sum + finish of the one kept); QC_INT_UNFUSED the unfused steps
 * (the int32 sums through memory); QC_INT_CHUNK_AGREE the agreement chunk
 * by chunk, just before the chunk's encode (its input read again from the
 * cache; qgz.c would need an exponent exchange per chunk); QC_INT_NOAGREE
 * no agreement pass (as if the units were known: a bound on reusing the
 * last call's exponents, which also needs the encode to take each block's
 * absmax itself, from the cache). */
enum {
  QC_FLOAT,
  QC_INT,
  QC_INT_UNFUSED,
  QC_INT_CHUNK_AGREE,
  QC_INT_NOAGREE,
  QC_KINDS
};
static const char *const qc_kind_name[QC_KINDS] = {"float", "int", "int_unf",
                                                   "int_cagr", "int_noag"};

/* The agreement of elements [off, off + len) of every slice, as
 * qgz_int.c's zpp_qgz_int_absmax and zpp_qgz_int_agree (the other
 * members' exponents: copies of this rank's, standing in for the
 * all-gather). */
static void qc_agree(const qc_t *c, size_t off, size_t len) {
  zpp_qcfg_t q = {4, 0, c->block, 0, 0, 0, 0};
  size_t nb = (c->count + c->block - 1) / c->block, n = QC_W * nb, b;
  size_t b0 = off / c->block, nbk = (len + c->block - 1) / c->block;
  int j, sl;
  for (sl = 0; sl < QC_W; sl++) { /* absmax and exponents */
    size_t x = (size_t)sl * nb + b0;
    c->ops->isum.absmax(&q, c->dtype, qc_slice(c, sl, off), NULL, len,
                        c->amax + x);
    for (b = x; b < x + nbk; b++)
      c->uexp_all[b] = (int8_t)zpp_qm_unit_exp(c->amax[b], 4);
    for (j = 1; j < QC_S; j++)
      memcpy(c->uexp_all + j * n + x, c->uexp_all + x, nbk);
  }
  for (sl = 0; sl < QC_W; sl++) { /* the max */
    size_t x = (size_t)sl * nb + b0;
    memcpy(c->uexp + x, c->uexp_all + x, nbk);
    for (j = 1; j < QC_S; j++) {
      const int8_t *u = c->uexp_all + j * n;
      for (b = x; b < x + nbk; b++)
        c->uexp[b] = u[b] > c->uexp[b] ? u[b] : c->uexp[b];
    }
  }
}

static void qc_int(const qc_t *c, size_t k, int kind) {
  zpp_qcfg_t q = {4, 0, c->block, 0, 0, 0, 0};
  size_t nb = (c->count + c->block - 1) / c->block;
  size_t off = k * c->chunk, len = qc_len(c, k), sl = k % QC_DEPTH;
  size_t b0 = off / c->block;
  uint8_t *m2 = c->msg2 + sl * c->ms2;
  const uint8_t *srcs[QC_S - 1];
  int j, m, n = 0;
  if (kind == QC_INT_CHUNK_AGREE)
    qc_agree(c, off, len);
  for (j = 1; j < QC_S; j++) /* stage 1 encode: codes, multipliers */
    for (m = 0; m < QC_M; m++) {
      size_t x = (size_t)(m * QC_S + j) * nb + b0;
      c->ops->isum.encode(&q, c->dtype, qc_slice(c, m * QC_S + j, off), NULL,
                          0.0f, c->amax + x, c->uexp + x, len,
                          c->msg[n++] + sl * c->ms);
    }
  if (kind != QC_INT_UNFUSED) {
    const uint8_t *s2 = m2;
    for (j = 0; j < QC_S - 1; j++) /* partial sum 1: summed, re-quantized */
      srcs[j] = c->msg[j * QC_M + 1] + sl * c->ms;
    c->ops->isum.sum_requant(&q, &q, c->dtype, qc_slice(c, QC_S, off), NULL,
                             c->uexp + (size_t)QC_S * nb + b0, srcs, QC_S - 1,
                             NULL, 0.0f, len, c->iacc[1], m2);
    for (j = 0; j < QC_S - 1; j++) /* partial sum 0: summed, finished */
      srcs[j] = c->msg[j * QC_M] + sl * c->ms;
    c->ops->isum.sum_finish(
        &q, &q, c->dtype, qc_slice(c, 0, off), NULL, 0.0f, c->uexp + b0, srcs,
        QC_S - 1, &s2, 1, len, (float)QC_W, c->iacc[0],
        (uint8_t *)c->out + off * zpp_qm_dtype_bytes(c->dtype));
    return;
  }
  for (m = 0; m < QC_M; m++) { /* stage 1 integer sums */
    for (j = 0; j < QC_S - 1; j++)
      srcs[j] = c->msg[j * QC_M + m] + sl * c->ms;
    c->ops->isum.sum(&q, c->dtype, qc_slice(c, m * QC_S, off), NULL, 0.0f,
                     c->uexp + (size_t)(m * QC_S) * nb + b0, srcs, QC_S - 1,
                     len, c->iacc[m] + sl * c->chunk);
  }
  c->ops->isum.requant(&q, c->iacc[1] + sl * c->chunk,
                       c->uexp + (size_t)QC_S * nb + b0, NULL, 0.0f, len, m2);
  srcs[0] = m2;
  c->ops->isum.finish(&q, c->iacc[0] + sl * c->chunk, c->uexp + b0, srcs, 1,
                      len, (float)QC_W, c->dtype,
                      (uint8_t *)c->out + off * zpp_qm_dtype_bytes(c->dtype));
}

static void qc_run(const qc_t *c, int kind) {
  size_t k;
  if (kind == QC_INT || kind == QC_INT_UNFUSED)
    qc_agree(c, 0, c->count);
  for (k = 0; k < c->nchunks; k++)
    if (kind == QC_FLOAT)
      qc_float(c, k);
    else
      qc_int(c, k, kind);
}

/* Frees what qgz_chain allocated for one dtype (free(NULL) is a no-op). */
static void qc_free(qc_t *c) {
  int i;
  for (i = 0; i < QC_W; i++)
    free(c->msg[i]);
  free(c->msg2);
  for (i = 0; i < QC_M; i++) {
    free(c->acc[i]);
    free(c->iacc[i]);
  }
  free(c->amax);
  free(c->uexp);
  free(c->uexp_all);
  free(c->out);
  free((void *)c->in);
}

static int qgz_chain(const opts_t *o, const zpp_quant_cpu_ops_t *ops,
                     const char *cpu) {
  static const int dts[2] = {ZPP_QM_BF16, ZPP_QM_F32};
  static const char *dn[2] = {"bf16", "fp32"};
  size_t count = o->n / QC_W, nb, e, chunk;
  int d, k, i, ok, wrong = 0;
  zpp_qcfg_t q4 = {4, 0, o->block, 0, 0, 0, 0};
  float *f32;
  int ovf = 0;
  if (count == 0) {
    fprintf(stderr, "zpp-quant-bench: --qgz-chain needs --n >= %d\n", QC_W);
    return 2;
  }
  nb = (count + o->block - 1) / o->block;
  e = zpp_quant_bytes(&q4, count, &ovf);
  /* chunks of whole blocks, about count / --chunks (qgz.c: 8) */
  chunk = (count / o->chunks + o->block - 1) / o->block * o->block;
  chunk = chunk == 0 ? o->block : chunk;
  chunk = chunk > count ? count : chunk;
  printf("# zpp-quant-bench --qgz-chain: one rank of 2x4 qgZ INT4/INT4, block "
         "%zu, %zu elements of input (8 slices of %zu, %zu chunks of %zu), "
         "path %s, %s\n",
         o->block, QC_W * count, count, (count + chunk - 1) / chunk, chunk,
         ops->name, cpu);
  printf("%-6s %-8s %10s %10s %7s %10s %10s %9s\n", "dtype", "sum", "ms",
         "memcpy_ms", "ratio", "min_ms", "min_memcpy", "min_ratio");
  f32 = xalloc(4 * QC_W * count);
  if (f32 == NULL)
    return 1;
  fill_input(f32, QC_W * count);
  for (d = 0; d < 2; d++) {
    qc_t c;
    size_t ds = zpp_qm_dtype_bytes(dts[d]), bytes = QC_W * count * ds;
    uint8_t *in = xalloc(bytes), *mc = xalloc(bytes);
    memset(&c, 0, sizeof c);
    c.ops = ops;
    c.dtype = dts[d];
    c.simd = strcmp(ops->name, "scalar") != 0;
    c.count = count;
    c.block = o->block;
    c.in = in; /* freed by qc_free */
    c.chunk = chunk;
    c.nchunks = (count + chunk - 1) / chunk;
    c.ms =
        zpp_quant_bytes(&q4, chunk, &ovf) + (chunk + o->block - 1) / o->block;
    c.ms2 = zpp_quant_bytes(&q4, chunk, &ovf);
    for (i = 0; i < (QC_S - 1) * QC_M; i++)
      c.msg[i] = xalloc(QC_DEPTH * c.ms); /* INT: codes and multipliers */
    c.msg2 = xalloc(QC_DEPTH * c.ms2);
    for (i = 0; i < QC_M; i++) {
      c.acc[i] = xalloc(4 * QC_DEPTH * chunk);
      c.iacc[i] = xalloc(4 * QC_DEPTH * chunk);
    }
    c.amax = xalloc(4 * QC_W * nb);
    c.uexp = xalloc(QC_W * nb);
    c.uexp_all = xalloc(QC_S * QC_W * nb);
    c.out = xalloc(4 * count);
    ok = in != NULL && mc != NULL && c.msg2 != NULL && c.amax != NULL &&
         c.uexp != NULL && c.uexp_all != NULL && c.out != NULL;
    for (i = 0; i < (QC_S - 1) * QC_M; i++)
      ok = ok && c.msg[i] != NULL;
    for (i = 0; i < QC_M; i++)
      ok = ok && c.acc[i] != NULL && c.iacc[i] != NULL;
    if (!ok) {
      fprintf(stderr, "zpp-quant-bench: out of memory\n");
      qc_free(&c);
      free(mc);
      free(f32);
      return 1;
    }
    for (i = 0; i < (int)(QC_W * count); i++)
      zpp_qm_store(in, (size_t)i, dts[d], f32[i]);
    { /* the fused chain's output against the unfused one's */
      size_t ob = count * ds;
      uint8_t *o0 = xalloc(ob + e);
      if (o0 == NULL) {
        qc_free(&c);
        free(mc);
        free(f32);
        return 1;
      }
      qc_run(&c, QC_INT_UNFUSED);
      memcpy(o0, c.out, ob);
      memcpy(o0 + ob, c.msg2, c.ms2);
      qc_run(&c, QC_INT);
      if (memcmp(o0, c.out, ob) != 0 || memcmp(o0 + ob, c.msg2, c.ms2) != 0) {
        fprintf(stderr,
                "zpp-quant-bench: %s: fused INT chain differs from "
                "the unfused one\n",
                dn[d]);
        wrong = 1;
      }
      free(o0);
    }
    for (k = 0; k < QC_KINDS; k++) {
      double *t = malloc(sizeof(double) * (size_t)o->iters);
      double *m = malloc(sizeof(double) * (size_t)o->iters);
      int it;
      if (t == NULL || m == NULL) {
        free(t);
        free(m);
        qc_free(&c);
        free(mc);
        free(f32);
        return 1;
      }
      for (it = 0; it < o->warmup + o->iters; it++) {
        double t0;
        make_cold(o);
        t0 = now_s();
        qc_run(&c, k);
        t0 = now_s() - t0;
        if (it >= o->warmup)
          t[it - o->warmup] = t0;
        make_cold(o);
        t0 = now_s();
        memcpy(mc, in, bytes);
        t0 = now_s() - t0;
        if (it >= o->warmup)
          m[it - o->warmup] = t0;
      }
      {
        double tm = median(t, o->iters), mm = median(m, o->iters);
        double t1 = t[0], m1 = m[0];
        for (it = 1; it < o->iters; it++) {
          t1 = t[it] < t1 ? t[it] : t1;
          m1 = m[it] < m1 ? m[it] : m1;
        }
        printf("%-6s %-8s %10.3f %10.3f %7.2f %10.3f %10.3f %9.2f\n", dn[d],
               qc_kind_name[k], 1e3 * tm, 1e3 * mm, tm / mm, 1e3 * t1, 1e3 * m1,
               t1 / m1);
      }
      free(t);
      free(m);
    }
    qc_free(&c);
    free(mc);
  }
  free(f32);
  return wrong;
}

int main(int argc, char **argv) {
  static const int dtypes[3] = {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16};
  static const char *dtype_names[3] = {"fp32", "fp16", "bf16"};
  opts_t o = {(size_t)1 << 24, 256, 10, 2, "auto", FMT_TABLE, 0, 0, 0, 8};
  const zpp_quant_cpu_ops_t *ops, *ref;
  char cpu[256];
  size_t enc_max, mc_max;
  float *f32;
  void *in[3], *out, *out_ref, *acc, *acc_ref, *mc_src, *mc_dst;
  float *res, *res_ref, *tmp;
  uint8_t *enc, *enc_ref;
  int bits_i, d, kind, first = 1, wrong_rows = 0, ovf = 0;

  if (parse_args(argc, argv, &o) != 0) {
    usage(stderr);
    return 2;
  }
  ops = strcmp(o.isa, "auto") == 0 ? zpp_quant_cpu_ops()
                                   : zpp_quant_cpu_ops_named(o.isa);
  ref = zpp_quant_cpu_ops_named("scalar");
  if (ops == NULL) {
    fprintf(stderr, "zpp-quant-bench: --isa %s: not built in or not supported "
                    "by this CPU\n", o.isa);
    return 2;
  }
  cpu_model(cpu, sizeof cpu);
  if (o.qgz_chain)
    return qgz_chain(&o, ops, cpu);

  {
    zpp_qcfg_t q4 = {4, o.asym, o.block, 0, 0, 0, 0},
               q8 = {8, o.asym, o.block, 0, 0, 0, 0};
    size_t e4 = zpp_quant_bytes(&q4, o.n, &ovf);
    size_t e8 = zpp_quant_bytes(&q8, o.n, &ovf);
    if (ovf) {
      fprintf(stderr, "zpp-quant-bench: --n %zu: encoded size overflows\n", o.n);
      return 2;
    }
    enc_max = e4 > e8 ? e4 : e8;
  }
  /* largest row: error feedback with fp32 gradients reads 4n of gradient
   * and 4n of residual, writes 4n of residual and enc (decode-accumulate
   * moves enc + 8n) */
  if (o.n > (SIZE_MAX - enc_max) / 12) {
    fprintf(stderr, "zpp-quant-bench: --n %zu: buffer sizes overflow\n", o.n);
    return 2;
  }
  mc_max = (enc_max + 12 * o.n) / 2 + 64;
  f32 = xalloc(4 * o.n);
  in[0] = f32;
  in[1] = xalloc(2 * o.n);
  in[2] = xalloc(2 * o.n);
  out = xalloc(4 * o.n);
  out_ref = xalloc(4 * o.n);
  acc = xalloc(4 * o.n);
  acc_ref = xalloc(4 * o.n);
  enc = xalloc(enc_max);
  enc_ref = xalloc(enc_max);
  res = xalloc(4 * o.n);
  res_ref = xalloc(4 * o.n);
  tmp = xalloc(4 * o.n);
  mc_src = xalloc(mc_max);
  mc_dst = xalloc(mc_max);
  if (o.cold && (cold_buf = xalloc(COLD_BYTES)) == NULL) {
    fprintf(stderr, "zpp-quant-bench: --cold: out of memory for 256 MiB\n");
    return 1;
  }
  if (!f32 || !in[1] || !in[2] || !out || !out_ref || !acc || !acc_ref ||
      !enc || !enc_ref || !mc_src || !mc_dst || !res || !res_ref || !tmp) {
    fprintf(stderr, "zpp-quant-bench: out of memory for --n %zu\n", o.n);
    return 1;
  }
  fill_input(f32, o.n);
  {
    size_t i;
    uint16_t *h = in[1], *b = in[2];
    for (i = 0; i < o.n; i++) {
      h[i] = zpp_qm_f32_to_f16(f32[i]);
      b[i] = zpp_qm_f32_to_bf16(f32[i]);
    }
  }
  memset(mc_src, 0x5a, mc_max);

  print_header(&o, cpu, ops->name);
  for (bits_i = 0; bits_i < 2; bits_i++) {
    int bits = bits_i == 0 ? 8 : 4;
    zpp_qcfg_t q = {bits, o.asym, o.block, 0, 0, 0, 0};
    size_t eb = zpp_quant_bytes(&q, o.n, &ovf);
    for (kind = 0; kind < 5; kind++) {
      for (d = 0; d < 3; d++) {
        size_t esz = zpp_qm_dtype_bytes(dtypes[d]);
        job_t j = {ops, q, dtypes[d], o.n, in[d], enc, NULL, kind, NULL, NULL};
        row_t r;
        memset(&r, 0, sizeof r);
        r.dtype = dtype_names[d];
        r.bits = bits;
        /* encoded input of this dtype for the decode rows */
        ref->encode(&q, dtypes[d], in[d], o.n, enc_ref);
        if (kind == 0) {
          r.op = "encode";
          r.bytes = (double)(esz * o.n + eb);
          measure(&o, &j, mc_dst, mc_src, &r);
          r.wrong = count_diff(enc, enc_ref, eb);
        } else if (kind == 1) {
          r.op = "decode";
          memcpy(enc, enc_ref, eb);
          j.out = out;
          r.bytes = (double)(eb + esz * o.n);
          measure(&o, &j, mc_dst, mc_src, &r);
          ref->decode(&q, enc, o.n, dtypes[d], out_ref);
          r.wrong = count_diff(out, out_ref, esz * o.n);
        } else if (kind >= 3) {
          /* error feedback: fp32 and bf16 gradients (what qgZ gets), the
           * residual a fraction of them; wrong = bytes (code and new
           * residual) where fused and passes differ, from the same start */
          size_t i;
          if (dtypes[d] == ZPP_QM_F16 || o.block > ZPP_EW_EF_TILE)
            continue;
          r.op = kind == 3 ? "ef_fused" : "ef_passes";
          for (i = 0; i < o.n; i++)
            res[i] = 0.01f * f32[(i * 7) % o.n];
          j.res = res;
          j.tmp = tmp;
          r.bytes = (double)(esz * o.n + 8 * o.n + eb);
          measure(&o, &j, mc_dst, mc_src, &r);
          for (i = 0; i < o.n; i++)
            res[i] = res_ref[i] = 0.01f * f32[(i * 7) % o.n];
          zpp_ew_encode_ef_host(ops, &q, dtypes[d], in[d], o.n, res, 0.0f,
                                enc);
          j.ops = ref;
          j.kind = 4;
          j.res = res_ref;
          j.enc = enc_ref;
          run_job(&j);
          r.wrong = count_diff(enc, enc_ref, eb) +
                    count_diff(res, res_ref, 4 * o.n);
        } else {
          /* accumulation is into fp32 whatever the dtype that was encoded:
           * one row per width, from the fp32 encoding */
          if (dtypes[d] != ZPP_QM_F32)
            continue;
          r.op = "decode_acc";
          memcpy(enc, enc_ref, eb);
          memcpy(acc, f32, 4 * o.n);
          j.out = acc;
          r.bytes = (double)(eb + 8 * o.n);
          measure(&o, &j, mc_dst, mc_src, &r);
          /* the timed runs accumulated warmup + iters times: check one */
          memcpy(acc, f32, 4 * o.n);
          memcpy(acc_ref, f32, 4 * o.n);
          ops->decode(&q, enc, o.n, ZPP_QM_OUT_ACC, acc);
          ref->decode(&q, enc, o.n, ZPP_QM_OUT_ACC, acc_ref);
          r.wrong = count_diff(acc, acc_ref, 4 * o.n);
        }
        wrong_rows += r.wrong != 0;
        print_row(&o, ops->name, &r, first);
        first = 0;
      }
    }
  }
  if (o.fmt == FMT_JSON)
    printf("\n], \"wrong_rows\": %d}\n", wrong_rows);
  else if (wrong_rows)
    printf("# %d row(s) differ from the scalar reference\n", wrong_rows);
  /* freed so that a leak checker (tests/quant_bench_test.sh under ASan)
   * sees none */
  {
    void *bufs[] = {f32, in[1], in[2], out, out_ref, acc, acc_ref, enc,
                    enc_ref, res, res_ref, tmp, mc_src, mc_dst, cold_buf};
    size_t i;
    for (i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      free(bufs[i]);
  }
  return wrong_rows ? 1 : 0;
}
