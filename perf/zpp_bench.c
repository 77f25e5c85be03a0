/*
 * zpp-bench: benchmark of the zpp collectives against their full-precision
 * baselines, shaped like nccl-tests (a harness, one small file per
 * collective: bench_allgather.c, bench_reducescatter.c, bench_hpz.c).
 *
 *   mpirun -np 8 zpp-bench --coll allgather -b 1M -e 64M -f 4
 *   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. zpp-bench ...
 *       (started like torchrun starts workers: zpp's TCP bootstrap, no MPI)
 *   srun -n 4 zpp-bench ...   (srun's variables: the same TCP bootstrap)
 *
 * --bootstrap mpi|env picks the bootstrap (default: env when RANK and
 * WORLD_SIZE are set and no MPI launcher is seen, or when srun started the
 * process: SLURM_PROCID and SLURM_STEP_ID set, and no MPI launcher's
 * variables unlike them, as the library decides), --backend the
 * transport; the header names both.  Per size (from -b to -e, times -f)
 * and per variant, every rank runs -w untimed warm-up calls, then -n timed
 * calls, each after a barrier (MPI_Barrier on MPI_COMM_WORLD, or the
 * bootstrap's barrier without MPI) and timed alone with
 * clock_gettime(CLOCK_MONOTONIC); one variant after the other, or with
 * --interleave round-robin (warm-up call k, then timed call k, of every
 * variant before call k + 1 of any, each round starting one variant later);
 * time_us is the MAX over ranks of each rank's MEAN; time_med_us,
 * time_min_us and time_max_us are the median, min and max over the timed
 * iterations of each iteration's MAX over ranks (the spread a shared machine
 * or a shaped TCP link puts on single calls).  --variant mpi runs Open
 * MPI's own MPI_Allgather / MPI_Reduce_scatter_block on the same buffers;
 * mpi-han and mpi-best the same with HAN, and with the fastest of tuned's
 * algorithms, each selection verified (perf/bench_mpi_peers.c).  The byte columns come
 * from zpp_comm_get_stats around the first timed call; the check (-c 1)
 * looks at that call's output (the output buffer is poisoned with NaN
 * bytes before it).  The algo column (table and JSON) names the family
 * the row's calls ran: under ZPP_ALGO=auto zpp_comm_choose_algorithm's
 * answer for that size.  Exit status: 0 all good, 1 a check found wrong
 * elements, 2 bad flags, 3 a zpp or CUDA call failed (or --memory device
 * without a device).
 *
 * Only rank 0 prints rows; any rank prints the error it met, to stderr.
 */
#include "zpp_bench_common.h"

#include <zpp/zpp_mpi.h>

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if ZPP_BENCH_CUDA
#include <cuda_runtime.h>
#endif
/* The emulated CUDA runtime of the tests (tests/cuda_emu) defines
 * ZPP_CUDA_EMU: its "device" runs on the CPU, so its times are no GPU's. */
#if ZPP_BENCH_CUDA && defined(ZPP_CUDA_EMU)
#define BENCH_DEVICE_NAME "device (EMULATED CUDA runtime: not GPU times)"
#else
#define BENCH_DEVICE_NAME "device"
#endif

#define BENCH_MAX_VARIANTS 16
#define BENCH_CHECK_FULL_BYTES ((size_t)1 << 20) /* check all up to 1 MiB */

enum { EXIT_WRONG = 1, EXIT_USAGE = 2, EXIT_ZPP = 3 };

static int g_rank = 0;

/* ---- the harness's own exchanges: MPI_COMM_WORLD under mpirun, else the
 * communicator's bootstrap (never while a collective is in flight) ----- */

static int g_env = 0;            /* started from torchrun's environment */
static int g_trace = 0; /* --trace: rank 0 prints each timed call */
static zpp_comm_t g_comm = NULL; /* set once created */

/* A variable set to something: empty is unset, as the library reads it. */
static const char *env_set(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

/* srun's task, as zpp_comm_create_from_env decides it (src/comm/tcp_id.c,
 * zpp_env_slurm): SLURM_PROCID set, and no launcher started inside the
 * allocation (Open MPI's mpirun; MPICH's or Intel MPI's hydra, whose
 * MPI_LOCALRANKID, PMI_RANK or PMI_SIZE are set and unlike SLURM_PROCID /
 * SLURM_NTASKS; a PMIx launcher whose PMIX_RANK is not SLURM_PROCID).
 * srun --mpi=pmi2 or pmix sets them as SLURM_*. */
static int env_srun(void) {
  const char *p = env_set("SLURM_PROCID"), *n = getenv("SLURM_NTASKS");
  const char *pr = getenv("PMI_RANK"), *ps = getenv("PMI_SIZE");
  const char *xr = getenv("PMIX_RANK");
  if (p == NULL || env_set("SLURM_STEP_ID") == NULL ||
      getenv("OMPI_COMM_WORLD_SIZE") != NULL ||
      getenv("MPI_LOCALRANKID") != NULL)
    return 0;
  if ((pr != NULL || ps != NULL) &&
      (pr == NULL || strcmp(pr, p) != 0 ||
       (ps != NULL && (n == NULL || strcmp(ps, n) != 0))))
    return 0;
  return xr == NULL || strcmp(xr, p) == 0;
}

/* torchrun's variables (RANK and WORLD_SIZE, no MPI launcher), or srun's */
static int env_launch(void) {
  if (env_set("RANK") != NULL)
    return env_set("WORLD_SIZE") != NULL &&
           getenv("OMPI_COMM_WORLD_SIZE") == NULL &&
           getenv("PMI_SIZE") == NULL && getenv("PMIX_RANK") == NULL;
  return env_srun();
}

static void h_barrier(void) {
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  if (!g_env) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  if (zpp_comm_get_bootstrap(g_comm, &bs) == ZPP_OK &&
      bs.barrier(bs.ctx, 0) != ZPP_OK)
    fprintf(stderr, "zpp-bench: rank %d: bootstrap barrier: %s\n", g_rank,
            zpp_get_last_error());
}

enum { H_MIN, H_MAX, H_SUM };

/* One double (or uint64) per rank reduced over all ranks. */
static int h_gather(const void *mine, size_t bytes, void *all) {
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  if (zpp_comm_get_bootstrap(g_comm, &bs) != ZPP_OK ||
      bs.allgather(bs.ctx, mine, bytes, all, 0) != ZPP_OK) {
    fprintf(stderr, "zpp-bench: rank %d: bootstrap allgather: %s\n", g_rank,
            zpp_get_last_error());
    return -1;
  }
  return 0;
}

static double h_double(double v, int op) {
  double r = v, *all;
  int n = 0, i;
  if (!g_env) {
    MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, op == H_MAX ? MPI_MAX : MPI_MIN,
                  MPI_COMM_WORLD);
    return r;
  }
  zpp_comm_size(g_comm, &n);
  all = malloc((size_t)n * sizeof *all);
  if (all != NULL && h_gather(&v, sizeof v, all) == 0)
    for (i = 0; i < n; i++)
      r = op == H_MAX ? (all[i] > r ? all[i] : r) : (all[i] < r ? all[i] : r);
  free(all);
  return r;
}

static uint64_t h_u64(uint64_t v, int op) {
  uint64_t r = op == H_SUM ? 0 : v, *all;
  int n = 0, i;
  if (!g_env) {
    MPI_Allreduce(&v, &r, 1, MPI_UINT64_T, op == H_SUM ? MPI_SUM : MPI_MAX,
                  MPI_COMM_WORLD);
    return r;
  }
  zpp_comm_size(g_comm, &n);
  all = malloc((size_t)n * sizeof *all);
  if (all != NULL && h_gather(&v, sizeof v, all) == 0)
    for (i = 0; i < n; i++)
      r = op == H_SUM ? r + all[i] : (all[i] > r ? all[i] : r);
  free(all);
  return r;
}

/* ---- data and reference helpers ------------------------------------------ */

static uint64_t mix64(uint64_t z) { /* splitmix64 finalizer */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int mant_bits(zpp_dtype_t dt) {
  return dt == ZPP_FLOAT32 ? 23 : dt == ZPP_FLOAT16 ? 10 : 7;
}

static int min_exp(zpp_dtype_t dt) { return dt == ZPP_FLOAT16 ? -14 : -126; }

double zpp_bench_round(double v, zpp_dtype_t dt) {
  int k, e;
  double q, r;
  if (v == 0 || !isfinite(v))
    return v;
  frexp(fabs(v), &k); /* |v| in [2^(k-1), 2^k) */
  e = k - 1 < min_exp(dt) ? min_exp(dt) : k - 1;
  q = ldexp(1.0, e - mant_bits(dt)); /* the ulp at |v| (subnormals: fixed) */
  r = rint(v / q) * q;               /* exact scaling; rint: nearest even */
  if (fabs(r) >= (dt == ZPP_FLOAT16 ? 65536.0 : ldexp(1.0, 128)))
    return copysign(INFINITY, v);
  return r;
}

double zpp_bench_value(uint64_t seed, int rank, size_t i, zpp_dtype_t dt) {
  uint64_t key = mix64(seed ^ mix64(0x7a70700000000000ull + (uint64_t)rank));
  uint64_t h1 = mix64(key + (uint64_t)i), h2 = mix64(h1 ^ key);
  double u1 = ((double)(h1 >> 11) + 1.0) * ldexp(1.0, -53); /* (0, 1] */
  double u2 = (double)(h2 >> 11) * ldexp(1.0, -53);         /* [0, 1) */
  double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  return zpp_bench_round(z, dt);
}

static uint16_t f16_bits(double v) { /* v finite and representable */
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  int k, e;
  if (isnan(v))
    return 0x7e00;
  if (isinf(v))
    return sign | 0x7c00;
  if (a == 0)
    return sign;
  frexp(a, &k);
  e = k - 1;
  if (e < -14) /* subnormal: multiples of 2^-24 */
    return sign | (uint16_t)ldexp(a, 24);
  return sign | (uint16_t)((e + 15) << 10) |
         (uint16_t)((ldexp(a, -e) - 1.0) * 1024.0);
}

static double f16_value(uint16_t h) {
  int ex = (h >> 10) & 31, man = h & 1023;
  double v = ex == 0    ? ldexp((double)man, -24)
             : ex == 31 ? (man ? NAN : INFINITY)
                        : ldexp((double)(1024 + man), ex - 25);
  return (h & 0x8000) ? -v : v;
}

double zpp_bench_load(const void *buf, size_t i, zpp_dtype_t dt) {
  const uint8_t *p = (const uint8_t *)buf;
  if (dt == ZPP_FLOAT32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  } else {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    if (dt == ZPP_FLOAT16)
      return f16_value(h);
    {
      uint32_t u = (uint32_t)h << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
  }
}

void zpp_bench_store(void *buf, size_t i, zpp_dtype_t dt, double v) {
  uint8_t *p = (uint8_t *)buf;
  float f;
  v = zpp_bench_round(v, dt);
  if (dt == ZPP_FLOAT16) {
    uint16_t h = f16_bits(v);
    memcpy(p + 2 * i, &h, 2);
    return;
  }
  f = (float)v; /* exact: v is representable */
  if (dt == ZPP_FLOAT32) {
    memcpy(p + 4 * i, &f, 4);
  } else {
    uint32_t u;
    uint16_t h;
    memcpy(&u, &f, 4);
    h = (uint16_t)(u >> 16);
    memcpy(p + 2 * i, &h, 2);
  }
}

int zpp_bench_same_bits(const void *a, const void *b, size_t i,
                        zpp_dtype_t dt) {
  size_t ds = zpp_dtype_size(dt);
  return memcmp((const uint8_t *)a + i * ds, (const uint8_t *)b + i * ds, ds) ==
         0;
}

int zpp_bench_equal_bits(const void *buf, size_t i, zpp_dtype_t dt, double v) {
  uint8_t want[4];
  size_t ds = zpp_dtype_size(dt);
  zpp_bench_store(want, 0, dt, v);
  return memcmp((const uint8_t *)buf + i * ds, want, ds) == 0;
}

size_t zpp_bench_block_stride(size_t size_bytes) {
  if (size_bytes <= BENCH_CHECK_FULL_BYTES)
    return 1;
  return (size_bytes + BENCH_CHECK_FULL_BYTES - 1) / BENCH_CHECK_FULL_BYTES;
}

int zpp_bench_block_checked(size_t b, size_t nb, size_t stride) {
  return b % stride == 0 || b + 1 == nb;
}

void zpp_bench_block_params(const double *x, size_t len, int bits,
                            double *scale, double *range) {
  double am = 0;
  size_t i;
  for (i = 0; i < len; i++)
    am = fmax(am, fabs(x[i]));
  *range = am;
  *scale = am / (double)((1 << (bits - 1)) - 1) * (1 + ldexp(1.0, -23));
}

double zpp_bench_out_rel(zpp_dtype_t dt) {
  return dt == ZPP_FLOAT32   ? ldexp(1.0, -24)
         : dt == ZPP_FLOAT16 ? ldexp(1.0, -11)
                             : ldexp(1.0, -8);
}

double zpp_bench_quant_bound(double scale, double range, double x, double out,
                             zpp_dtype_t dt) {
  double b = scale * (0.5 + ldexp(1.0, -12)) +
             ldexp(1.0, -22) * (fabs(x) + range) + ldexp(1.0, -149);
  if (dt == ZPP_BFLOAT16)
    b += fabs(out) * ldexp(1.0, -8) + 1e-38;
  if (dt == ZPP_FLOAT16)
    b += fabs(out) * ldexp(1.0, -11) + ldexp(1.0, -25);
  return b;
}

void zpp_bench_check_add(zpp_bench_check_t *chk, double got, double ref,
                         int ok) {
  double e = fabs(got - ref);
  chk->checked++;
  if (!ok)
    chk->wrong++;
  if (e > chk->max_err || isnan(e))
    chk->max_err = isnan(e) ? INFINITY : e;
}

/* ---- Open MPI's own collectives (the mpi variants) ------------------------ */

static MPI_Comm g_mpi_comm = MPI_COMM_NULL; /* MPI_COMM_WORLD's duplicate */
static MPI_Op g_mpi_sum16[2] = {MPI_OP_NULL, MPI_OP_NULL}; /* bf16, fp16 */

const char *zpp_bench_mpi_check(const zpp_bench_ctx_t *ctx) {
  if (g_env)
    return "needs the MPI bootstrap (mpirun), not --bootstrap env";
  if (ctx->opt->memory != ZPP_MEMORY_HOST)
    return "needs --memory host (the MPI here is not CUDA-aware)";
  return NULL;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) { /* nearest even; NaN stays NaN */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The user-defined sums: inout[i] = round(in[i] + inout[i]).  bf16: the
 * sum in fp32, then rounded to bf16 (two roundings: the check's bound
 * counts both); fp16: the exact sum in double, rounded once. */
static void mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
  const uint16_t *a = (const uint16_t *)in;
  uint16_t *b = (uint16_t *)inout;
  int i;
  (void)dt;
  for (i = 0; i < *len; i++)
    b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static void mpi_sum_fp16(void *in, void *inout, int *len, MPI_Datatype *dt) {
  int i;
  (void)dt;
  for (i = 0; i < *len; i++)
    zpp_bench_store(inout, (size_t)i, ZPP_FLOAT16,
                    zpp_bench_load(in, (size_t)i, ZPP_FLOAT16) +
                        zpp_bench_load(inout, (size_t)i, ZPP_FLOAT16));
}

static zpp_status_t mpi_fail(const char *call, int err) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", err);
  fprintf(stderr, "zpp-bench: rank %d: %s: %s\n", g_rank, call, msg);
  return ZPP_ERR_MPI;
}

static zpp_status_t mpi_setup(const zpp_bench_ctx_t *ctx) {
  int e;
  const char *why = zpp_bench_mpi_check(ctx);
  if (why != NULL) {
    fprintf(stderr, "zpp-bench: rank %d: variant mpi %s\n", g_rank, why);
    return ZPP_ERR_UNSUPPORTED;
  }
  if (g_mpi_comm != MPI_COMM_NULL)
    return ZPP_OK;
  e = MPI_Comm_dup(MPI_COMM_WORLD, &g_mpi_comm);
  if (e != MPI_SUCCESS)
    return mpi_fail("MPI_Comm_dup", e);
  MPI_Comm_set_errhandler(g_mpi_comm, MPI_ERRORS_RETURN);
  e = MPI_Op_create(mpi_sum_bf16, 1, &g_mpi_sum16[0]);
  if (e == MPI_SUCCESS)
    e = MPI_Op_create(mpi_sum_fp16, 1, &g_mpi_sum16[1]);
  return e == MPI_SUCCESS ? ZPP_OK : mpi_fail("MPI_Op_create", e);
}

/* The MPI type and op of a reduce-scatter of dtype (zpp_bench_mpi_reduce_
 * scatter). */
static void mpi_rs_type(zpp_dtype_t dt, MPI_Datatype *type, MPI_Op *op) {
  *type = dt == ZPP_FLOAT32 ? MPI_FLOAT : MPI_UINT16_T;
  *op = dt == ZPP_FLOAT32    ? MPI_SUM
        : dt == ZPP_BFLOAT16 ? g_mpi_sum16[0]
                             : g_mpi_sum16[1];
}

zpp_status_t zpp_bench_mpi_case_setup(const zpp_bench_ctx_t *ctx,
                                      zpp_bench_case_t *c) {
  MPI_Datatype type = MPI_BYTE;
  MPI_Op op = MPI_OP_NULL;
  size_t n = c->count;
  void *comm = NULL;
  zpp_status_t st = mpi_setup(ctx);
  if (st != ZPP_OK)
    return st;
  if (ctx->opt->coll != NULL && strcmp(ctx->opt->coll, "reducescatter") == 0)
    mpi_rs_type(ctx->opt->dtype, &type, &op);
  else
    n = c->count * zpp_dtype_size(ctx->opt->dtype); /* MPI_BYTE, as run */
  if (n > (size_t)INT_MAX) {
    fprintf(stderr,
            "zpp-bench: rank %d: variant %s: %zu elements per rank: "
            "more than an MPI count (INT_MAX)\n",
            g_rank, c->v->name, n);
    return ZPP_ERR_OVERFLOW;
  }
  st = zpp_bench_mpi_peer_setup(ctx, c, &g_mpi_comm, &type, &op, (int)n,
                                &comm);
  c->state = comm;
  return st;
}

static void mpi_teardown(void) {
  int i;
  zpp_bench_mpi_peers_teardown();
  for (i = 0; i < 2; i++)
    if (g_mpi_sum16[i] != MPI_OP_NULL)
      MPI_Op_free(&g_mpi_sum16[i]);
  if (g_mpi_comm != MPI_COMM_NULL)
    MPI_Comm_free(&g_mpi_comm);
}

zpp_status_t zpp_bench_mpi_allgather(const zpp_bench_ctx_t *ctx,
                                     const zpp_bench_case_t *c, size_t bytes) {
  MPI_Comm comm = c->state != NULL ? *(MPI_Comm *)c->state : g_mpi_comm;
  int e;
  (void)ctx;
  if (bytes > (size_t)INT_MAX) {
    fprintf(stderr, "zpp-bench: rank %d: MPI_Allgather of %zu bytes: more "
                    "than INT_MAX\n", g_rank, bytes);
    return ZPP_ERR_OVERFLOW;
  }
  e = MPI_Allgather(c->in->host, (int)bytes, MPI_BYTE, c->out->host,
                    (int)bytes, MPI_BYTE, comm);
  return e == MPI_SUCCESS ? ZPP_OK : mpi_fail("MPI_Allgather", e);
}

zpp_status_t zpp_bench_mpi_reduce_scatter(const zpp_bench_ctx_t *ctx,
                                          const zpp_bench_case_t *c,
                                          zpp_dtype_t dt, zpp_redop_t op) {
  MPI_Comm comm = c->state != NULL ? *(MPI_Comm *)c->state : g_mpi_comm;
  MPI_Datatype type;
  MPI_Op mop;
  size_t i, count = c->count;
  void *out = c->out->host;
  int e;
  mpi_rs_type(dt, &type, &mop);
  if (count > (size_t)INT_MAX) {
    fprintf(stderr, "zpp-bench: rank %d: MPI_Reduce_scatter_block of %zu "
                    "elements: more than INT_MAX\n", g_rank, count);
    return ZPP_ERR_OVERFLOW;
  }
  e = MPI_Reduce_scatter_block(c->in->host, out, (int)count, type, mop,
                               comm);
  if (e != MPI_SUCCESS)
    return mpi_fail("MPI_Reduce_scatter_block", e);
  if (op == ZPP_OP_MEAN) {
    float w = (float)ctx->world;
    for (i = 0; i < count; i++) {
      if (dt == ZPP_FLOAT32)
        ((float *)out)[i] /= w;
      else if (dt == ZPP_BFLOAT16)
        ((uint16_t *)out)[i] =
            f32_to_bf16(bf16_to_f32(((uint16_t *)out)[i]) / w);
      else
        zpp_bench_store(out, i, dt,
                        (double)((float)zpp_bench_load(out, i, dt) / w));
    }
  }
  return ZPP_OK;
}

/* ---- buffers ------------------------------------------------------------- */

#if ZPP_BENCH_CUDA
static zpp_status_t cuda_fail(cudaError_t e, const char *call, size_t bytes) {
  fprintf(stderr, "zpp-bench: rank %d: %s (%zu bytes): %s\n", g_rank, call,
          bytes, cudaGetErrorString(e));
  return ZPP_ERR_CUDA;
}
#endif

zpp_status_t zpp_bench_buf_alloc(const zpp_bench_ctx_t *ctx, size_t bytes,
                                 zpp_bench_buf_t *buf) {
  buf->bytes = bytes;
  buf->dev = NULL;
  buf->host = malloc(bytes > 0 ? bytes : 1);
  if (buf->host == NULL) {
    fprintf(stderr, "zpp-bench: rank %d: out of host memory (%zu bytes)\n",
            g_rank, bytes);
    return ZPP_ERR_OUT_OF_MEMORY;
  }
  if (ctx->opt->memory == ZPP_MEMORY_HOST) {
    buf->dev = buf->host;
    return ZPP_OK;
  }
#if ZPP_BENCH_CUDA
  {
    cudaError_t e = cudaMalloc(&buf->dev, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
      buf->dev = NULL;
      return cuda_fail(e, "cudaMalloc", bytes);
    }
  }
  return ZPP_OK;
#else
  return ZPP_ERR_UNSUPPORTED; /* main refuses --memory device first */
#endif
}

void zpp_bench_buf_free(const zpp_bench_ctx_t *ctx, zpp_bench_buf_t *buf) {
#if ZPP_BENCH_CUDA
  if (buf->dev != NULL && buf->dev != buf->host)
    cudaFree(buf->dev);
#endif
  (void)ctx;
  free(buf->host);
  buf->host = buf->dev = NULL;
}

zpp_status_t zpp_bench_buf_upload(const zpp_bench_ctx_t *ctx,
                                  zpp_bench_buf_t *buf) {
  (void)ctx;
  if (buf->dev == buf->host || buf->bytes == 0)
    return ZPP_OK;
#if ZPP_BENCH_CUDA
  {
    cudaError_t e =
        cudaMemcpy(buf->dev, buf->host, buf->bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
      return cuda_fail(e, "cudaMemcpy to device", buf->bytes);
  }
#endif
  return ZPP_OK;
}

zpp_status_t zpp_bench_buf_download(const zpp_bench_ctx_t *ctx,
                                    zpp_bench_buf_t *buf) {
  (void)ctx;
  if (buf->dev == buf->host || buf->bytes == 0)
    return ZPP_OK;
#if ZPP_BENCH_CUDA
  {
    cudaError_t e =
        cudaMemcpy(buf->host, buf->dev, buf->bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
      return cuda_fail(e, "cudaMemcpy to host", buf->bytes);
  }
#endif
  return ZPP_OK;
}

/* Fills the buffer with 0xff bytes: NaN in fp32, fp16 and bf16. */
static zpp_status_t buf_poison(const zpp_bench_ctx_t *ctx,
                               zpp_bench_buf_t *buf) {
  memset(buf->host, 0xff, buf->bytes);
  return zpp_bench_buf_upload(ctx, buf);
}

/* ---- flags --------------------------------------------------------------- */

static const zpp_bench_coll_t *const g_colls[] = {
    &zpp_bench_allgather, &zpp_bench_reducescatter, &zpp_bench_hpz};
#define NCOLLS (sizeof g_colls / sizeof g_colls[0])

static void usage(FILE *f) {
  size_t i;
  fprintf(
      f,
      "usage: mpirun -np N zpp-bench [flags]\n"
      "  -b, --minbytes SIZE  smallest size (default 64K); K, M, G = 2^10,\n"
      "                       2^20, 2^30.  allgather, hpz-gather: bytes of\n"
      "                       one rank's shard; reducescatter: bytes of one\n"
      "                       rank's input (count = size / dtype / world)\n"
      "  -e, --maxbytes SIZE  largest size (default 4M)\n"
      "  -f, --stepfactor F   multiply the size by F (integer >= 2; default "
      "4)\n"
      "  -n, --iters N        timed iterations per row (default 20)\n"
      "  -w, --warmup_iters W untimed iterations first (default 5)\n"
      "  -c, --check 0|1      check the first timed iteration (default 1)\n"
      "  --interleave         run the variants of a size round-robin: warm-up\n"
      "                       and timed call k of each before call k+1 of\n"
      "                       any, each round starting one variant later\n"
      "                       (default: one variant after the other); every\n"
      "                       variant's buffers and handles exist at once\n"
      "  --trace              rank 0 prints each timed call to stderr before\n"
      "                       it (# timed VARIANT size SIZE iteration K)\n"
      "  --coll C             allgather (default), reducescatter, hpz-gather\n"
      "  --variant LIST       comma list (default: all of the collective);\n"
      "                       the baseline is added when missing\n"
      "  --dtype D            fp32, fp16 or bf16 (default bf16): the data;\n"
      "                       the baseline variant moves it and is named so\n"
      "  --block B            elements per quantization scale (default 256)\n"
      "  --op sum|mean        reducescatter reduction (default sum)\n"
      "  --format F           table (default), csv or json\n"
      "  --memory host|device buffers in host memory (default) or CUDA\n"
      "                       device memory (needs zpp built with CUDA and a\n"
      "                       device; otherwise: error \"no CUDA device\")\n"
      "  --backend B          auto (default), mpi, ucx or nccl (device memory:\n"
      "                       mpi and ucx stage it through host memory)\n"
      "  --seed S             data seed (default 20261129)\n"
      "  --corrupt            checker self-test: rank 0 spoils one output\n"
      "                       element before the check (must exit 1)\n"
      "  --print-settings     print every ZPP_* setting and exit\n"
      "  --bootstrap mpi|env  mpi: under mpirun; env: started like torchrun "
      "(RANK, WORLD_SIZE,\n"
      "                       MASTER_ADDR, MASTER_PORT; no MPI) or by srun "
      "(SLURM_*);\n"
      "                       default: env when RANK and WORLD_SIZE, or "
      "SLURM_PROCID\n"
      "                       and SLURM_STEP_ID (srun's task), are set and no "
      "MPI\n"
      "                       launcher is seen\n"
      "variants:\n");
  for (i = 0; i < NCOLLS; i++)
    fprintf(f, "  %-14s %s\n", g_colls[i]->name, g_colls[i]->variant_help);
  fprintf(f, "environment: ZPP_TOPO (emulated nodes, e.g. 2x4), "
             "ZPP_EMU_INTER_GBIT and\nZPP_EMU_INTER_LAT_US (emulated "
             "inter-node link per rank); see --print-settings.\n"
             "exit status: 0 ok, 1 a check failed, 2 bad flags, 3 a zpp or "
             "CUDA call failed\n");
}

static int flag_error(const char *fmt, ...) {
  va_list ap;
  if (g_rank == 0) {
    fprintf(stderr, "zpp-bench: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see --help)\n");
  }
  return -1;
}

/* Unsigned integer with an optional K, M or G suffix (powers of 1024). */
static int parse_bytes(const char *flag, const char *s, size_t min,
                       size_t *out) {
  char *end;
  unsigned long long v, mul = 1;
  errno = 0;
  if (s == NULL || *s < '0' || *s > '9')
    return flag_error("%s '%s': must be a number", flag, s ? s : "");
  v = strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k')
    mul = 1ull << 10;
  else if (*end == 'M' || *end == 'm')
    mul = 1ull << 20;
  else if (*end == 'G' || *end == 'g')
    mul = 1ull << 30;
  if (mul > 1)
    end++;
  if (errno != 0 || *end != '\0' || v > (unsigned long long)SIZE_MAX / mul ||
      v * mul < min)
    return flag_error("%s '%s': must be an integer >= %zu with an optional "
                      "K, M or G suffix",
                      flag, s, min);
  *out = (size_t)(v * mul);
  return 0;
}

static int parse_int(const char *flag, const char *s, int min, int max,
                     int *out) {
  size_t v = 0;
  if (parse_bytes(flag, s, 0, &v) != 0)
    return -1;
  if (v < (size_t)min || v > (size_t)max)
    return flag_error("%s %s: must be in [%d, %d]", flag, s, min, max);
  *out = (int)v;
  return 0;
}

enum {
  OPT_COLL = 256,
  OPT_VARIANT,
  OPT_DTYPE,
  OPT_BLOCK,
  OPT_FORMAT,
  OPT_OP,
  OPT_MEMORY,
  OPT_BACKEND,
  OPT_SEED,
  OPT_CORRUPT,
  OPT_SETTINGS,
  OPT_BOOTSTRAP,
  OPT_INTERLEAVE,
  OPT_TRACE
};

/* 0: run; 1: exit 0 (help); -1: bad flags. */
static int parse_args(int argc, char **argv, zpp_bench_opts_t *o,
                      int *print_settings) {
  static const struct option longs[] = {
      {"minbytes", required_argument, NULL, 'b'},
      {"maxbytes", required_argument, NULL, 'e'},
      {"stepfactor", required_argument, NULL, 'f'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup_iters", required_argument, NULL, 'w'},
      {"check", required_argument, NULL, 'c'},
      {"help", no_argument, NULL, 'h'},
      {"coll", required_argument, NULL, OPT_COLL},
      {"variant", required_argument, NULL, OPT_VARIANT},
      {"dtype", required_argument, NULL, OPT_DTYPE},
      {"block", required_argument, NULL, OPT_BLOCK},
      {"format", required_argument, NULL, OPT_FORMAT},
      {"op", required_argument, NULL, OPT_OP},
      {"memory", required_argument, NULL, OPT_MEMORY},
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"seed", required_argument, NULL, OPT_SEED},
      {"corrupt", no_argument, NULL, OPT_CORRUPT},
      {"print-settings", no_argument, NULL, OPT_SETTINGS},
      {"bootstrap", required_argument, NULL, OPT_BOOTSTRAP},
      {"interleave", no_argument, NULL, OPT_INTERLEAVE},
      {"trace", no_argument, NULL, OPT_TRACE},
      {NULL, 0, NULL, 0}};
  int c;
  size_t v;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":b:e:f:n:w:c:h", longs, NULL)) != -1) {
    switch (c) {
    case 'b':
      if (parse_bytes("-b", optarg, 1, &o->min_bytes) != 0)
        return -1;
      break;
    case 'e':
      if (parse_bytes("-e", optarg, 1, &o->max_bytes) != 0)
        return -1;
      break;
    case 'f':
      if (parse_bytes("-f", optarg, 2, &o->factor) != 0)
        return -1;
      break;
    case 'n':
      if (parse_int("-n", optarg, 1, 1000000, &o->iters) != 0)
        return -1;
      break;
    case 'w':
      if (parse_int("-w", optarg, 0, 1000000, &o->warmup) != 0)
        return -1;
      break;
    case 'c':
      if (parse_int("-c", optarg, 0, 1, &o->check) != 0)
        return -1;
      break;
    case 'h':
      if (g_rank == 0)
        usage(stdout);
      return 1;
    case OPT_COLL:
      o->coll = optarg;
      break;
    case OPT_VARIANT:
      o->variants = optarg;
      break;
    case OPT_DTYPE:
      if (strcmp(optarg, "fp32") == 0)
        o->dtype = ZPP_FLOAT32;
      else if (strcmp(optarg, "fp16") == 0)
        o->dtype = ZPP_FLOAT16;
      else if (strcmp(optarg, "bf16") == 0)
        o->dtype = ZPP_BFLOAT16;
      else
        return flag_error("--dtype %s: must be fp32, fp16 or bf16", optarg);
      break;
    case OPT_BLOCK:
      if (parse_bytes("--block", optarg, 1, &o->block) != 0)
        return -1;
      break;
    case OPT_FORMAT:
      if (strcmp(optarg, "table") == 0)
        o->format = ZPP_BENCH_TABLE;
      else if (strcmp(optarg, "csv") == 0)
        o->format = ZPP_BENCH_CSV;
      else if (strcmp(optarg, "json") == 0)
        o->format = ZPP_BENCH_JSON;
      else
        return flag_error("--format %s: must be table, csv or json", optarg);
      break;
    case OPT_OP:
      if (strcmp(optarg, "sum") == 0)
        o->op = ZPP_OP_SUM;
      else if (strcmp(optarg, "mean") == 0)
        o->op = ZPP_OP_MEAN;
      else
        return flag_error("--op %s: must be sum or mean", optarg);
      break;
    case OPT_MEMORY:
      if (strcmp(optarg, "host") == 0)
        o->memory = ZPP_MEMORY_HOST;
      else if (strcmp(optarg, "device") == 0)
        o->memory = ZPP_MEMORY_DEVICE;
      else
        return flag_error("--memory %s: must be host or device", optarg);
      break;
    case OPT_BACKEND:
      if (strcmp(optarg, "auto") == 0)
        o->backend = ZPP_BACKEND_AUTO;
      else if (strcmp(optarg, "mpi") == 0)
        o->backend = ZPP_BACKEND_MPI;
      else if (strcmp(optarg, "ucx") == 0)
        o->backend = ZPP_BACKEND_UCX;
      else if (strcmp(optarg, "nccl") == 0)
        o->backend = ZPP_BACKEND_NCCL;
      else
        return flag_error("--backend %s: must be auto, mpi, ucx or nccl",
                          optarg);
      break;
    case OPT_SEED:
      if (parse_bytes("--seed", optarg, 0, &v) != 0)
        return -1;
      o->seed = (uint64_t)v;
      break;
    case OPT_CORRUPT:
      o->corrupt = 1;
      break;
    case OPT_INTERLEAVE:
      o->interleave = 1;
      break;
    case OPT_TRACE:
      g_trace = 1;
      break;
    case OPT_SETTINGS:
      *print_settings = 1;
      break;
    case OPT_BOOTSTRAP: /* chosen in main, before MPI_Init */
      if (strcmp(optarg, "mpi") != 0 && strcmp(optarg, "env") != 0)
        return flag_error("--bootstrap %s: must be mpi or env", optarg);
      break;
    case ':':
      return flag_error("%s needs a value", argv[optind - 1]);
    default:
      return flag_error("unknown flag '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return flag_error("unexpected argument '%s'", argv[optind]);
  if (o->min_bytes > o->max_bytes)
    return flag_error("-b %zu is larger than -e %zu", o->min_bytes,
                      o->max_bytes);
  return 0;
}

/* A communicator of its own of the job's ranks whose world all-gather and
 * reduce-scatter run algorithm `algo` (the "-flat" / "-hier" baselines):
 * over the job's bootstrap, or MPI_COMM_WORLD's.  Collective. */
static zpp_status_t forced_comm(zpp_comm_t comm, const zpp_comm_config_t *cfg,
                                zpp_algorithm_t algo, int rank,
                                zpp_comm_t *out) {
  zpp_comm_config_t fc = *cfg;
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  zpp_status_t st;
  fc.algorithm = algo;
  st = g_env ? zpp_comm_get_bootstrap(comm, &bs) : ZPP_OK;
  if (st == ZPP_OK)
    st = g_env ? zpp_comm_create(&bs, &fc, out)
               : zpp_comm_create_mpi(MPI_COMM_WORLD, &fc, out);
  if (st != ZPP_OK)
    fprintf(stderr, "zpp-bench: rank %d: the %s communicator: %s: %s\n", rank,
            algo == ZPP_ALGORITHM_HIER ? "hierarchical" : "flat",
            zpp_status_string(st), zpp_get_last_error());
  return st;
}

/* Splits o->variants (or the default list) into parsed variants and puts
 * the baseline first when it is missing. */
static int parse_variants(const zpp_bench_coll_t *coll,
                          const zpp_bench_opts_t *o, zpp_bench_variant_t *v,
                          int *nv, int *added_baseline) {
  char list[512], err[256], *tok, *save = NULL;
  int n = 0, have_base = 0;
  if (o->variants != NULL)
    snprintf(list, sizeof list, "%s", o->variants);
  else
    coll->default_variants(o->dtype, list, sizeof list);
  for (tok = strtok_r(list, ",", &save); tok != NULL;
       tok = strtok_r(NULL, ",", &save)) {
    if (n + 1 >= BENCH_MAX_VARIANTS)
      return flag_error("--variant: at most %d variants",
                        BENCH_MAX_VARIANTS - 1);
    if (coll->parse_variant(tok, o->dtype, &v[n], err, sizeof err) != 0)
      return flag_error("--variant %s of --coll %s: %s", tok, coll->name, err);
    have_base |= v[n].baseline;
    n++;
  }
  if (n == 0)
    return flag_error("--variant '%s': empty list", o->variants);
  *added_baseline = !have_base;
  if (!have_base) { /* ratios are against a baseline of this run */
    memmove(&v[1], &v[0], (size_t)n * sizeof *v);
    coll->parse_variant(zpp_dtype_name(o->dtype), o->dtype, &v[0], err,
                        sizeof err);
    n++;
  }
  *nv = n;
  return 0;
}

/* ---- output -------------------------------------------------------------- */

typedef struct {
  char variant[48];
  const char *algo; /* the family the call ran: hier, flat (zpp's baselines
                       on a host backend), nccl, mpi, or - */
  size_t size, count;
  double time_us, algbw, busbw;
  double intra_bytes, inter_bytes; /* sent per rank, mean over ranks */
  uint64_t inter_bytes_max;        /* sent, max over ranks */
  uint64_t inter_node_max; /* sent by a node's ranks together, max over
                            * nodes: the busiest node link, one way */
  double ratio;                    /* < 0: no baseline time */
  /* Each timed iteration's MAX over ranks: median, min, max over -n. */
  double med_us, min_us, max_us;
  int counted; /* 0: the bytes are not zpp's to count (the mpi variants) */
  int checked;
  double max_err;
  uint64_t wrong;
} row_t;

static const char *const CSV_HEADER =
    "coll,variant,size,count,dtype,time_us,algbw,busbw,intra_bytes,"
    "inter_bytes,ratio,max_err,wrong,inter_bytes_max,time_med_us,"
    "time_min_us,time_max_us,inter_bytes_node_max";

/* Byte means are exact when the sum divides by the world size. */
static void fmt_bytes(char *buf, size_t len, double b) {
  if (b == floor(b))
    snprintf(buf, len, "%.0f", b);
  else
    snprintf(buf, len, "%.3f", b);
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

typedef struct {
  const zpp_bench_coll_t *coll;
  const zpp_bench_opts_t *o;
  const zpp_bench_ctx_t *ctx;
  const zpp_bench_variant_t *v;
  int nv, added_baseline, has_mpi;
  const char *peers; /* how mpi-han / mpi-best were selected, or "" */
  const char *backend, *topo, *bootstrap;
  int any_flat; /* a "-flat" variant runs on a second communicator */
  int any_hier; /* a "-hier" variant runs on another one */
  int topo_emulated, link_emulated, bytes_derived;
  double gbit, lat_us;
  int *node_sizes;
  int nrows; /* JSON rows written so far */
  char host[64], loadavg[32];
} header_t;

/* Rank 0's host name and 1-minute load average, for the header. */
static void host_info(header_t *h) {
  FILE *f = fopen("/proc/loadavg", "r");
  snprintf(h->loadavg, sizeof h->loadavg, "unknown");
  if (f != NULL) {
    double l;
    if (fscanf(f, "%lf", &l) == 1)
      snprintf(h->loadavg, sizeof h->loadavg, "%.2f", l);
    fclose(f);
  }
  if (gethostname(h->host, sizeof h->host) != 0)
    snprintf(h->host, sizeof h->host, "unknown");
  h->host[sizeof h->host - 1] = '\0';
}

/* The header as (key, text) lines; JSON gets the same texts as fields.
 * HEADER_LINE holds the longest, the peers line (PEERS_TEXT of
 * zpp_bench_mpi_peers_init and its frame). */
#define HEADER_LINES 24
#define PEERS_TEXT 1600
#define HEADER_LINE (PEERS_TEXT + 400)
static void header_texts(const header_t *h, char lines[][HEADER_LINE],
                         const char **keys, int *n) {
  const zpp_bench_opts_t *o = h->o;
  const char *dt = zpp_dtype_name(o->dtype);
  char vl[256] = "", nodes[200] = "";
  int i, k = 0, even = 1;
  for (i = 0; i < h->nv; i++)
    snprintf(vl + strlen(vl), sizeof vl - strlen(vl), "%s%s", i ? "," : "",
             h->v[i].name);
  for (i = 1; i < h->ctx->nnodes; i++)
    even &= h->node_sizes[i] == h->node_sizes[0];
  if (even) {
    snprintf(nodes, sizeof nodes, "%d nodes x %d ranks per node",
             h->ctx->nnodes, h->node_sizes[0]);
  } else {
    snprintf(nodes, sizeof nodes, "%d nodes, uneven: ranks per node ",
             h->ctx->nnodes);
    for (i = 0; i < h->ctx->nnodes; i++)
      snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), "%s%d",
               i ? "," : "", h->node_sizes[i]);
  }
#define LINE(key, ...)                                                         \
  do {                                                                         \
    keys[k] = key;                                                             \
    snprintf(lines[k++], HEADER_LINE, __VA_ARGS__);                            \
  } while (0)
  LINE("run",
       "zpp-bench: coll %s, variants %s%s, dtype %s, block %zu%s%s, "
       "memory %s, backend %s, bootstrap %s",
       h->coll->name, vl, h->added_baseline ? " (baseline added)" : "", dt,
       o->block, h->coll == &zpp_bench_reducescatter ? ", op " : "",
       h->coll == &zpp_bench_reducescatter
           ? (o->op == ZPP_OP_MEAN ? "mean" : "sum")
           : "",
       o->memory == ZPP_MEMORY_HOST ? "host" : BENCH_DEVICE_NAME, h->backend,
       h->bootstrap);
  LINE("world", "world %d ranks: %s", h->ctx->world, nodes);
  LINE("host",
       "rank 0 host %s, load average %s at start (other processes "
       "on the cores make times noisy)",
       h->host, h->loadavg);
  if (h->topo_emulated)
    LINE("topology", "topology EMULATED (ZPP_TOPO=%s)", h->topo);
  else
    LINE("topology", "topology discovered (ranks that share a host form a "
                     "node)");
  if (h->link_emulated && h->gbit > 0)
    LINE("link",
         "inter-node link EMULATED at %g Gbit/s per rank, %g us "
         "latency",
         h->gbit, h->lat_us);
  else if (h->link_emulated)
    LINE("link",
         "inter-node link EMULATED at unlimited Gbit/s per rank, %g "
         "us latency",
         h->lat_us);
  else
    LINE("link", "links not slowed (ZPP_EMU_INTER_GBIT unset)");
  if (h->has_mpi && h->link_emulated)
    LINE("mpi", "the mpi rows are NOT on the emulated link: Open MPI's own "
                "collective moves its bytes through this machine's transport, "
                "which zpp's emulation does not slow, so their time and ratio "
                "are not a comparison on the same link");
  if (h->has_mpi)
    LINE("peers", "Open MPI peers (%s): mpi: Open MPI's default selection. %s",
         o->format == ZPP_BENCH_JSON
             ? "each row's serving function is verified per size; the "
               "'# served' and '# mpi-best' lines that name it are not "
               "printed under --format json"
             : "each row's serving function is named per size in a "
               "'# served' or '# mpi-best' line",
         h->peers);
  LINE("algorithm", "algorithm: %s%s%s%s",
       h->ctx->algo_auto
           ? "auto (per call, the family the cost model predicts faster: "
             "the algo column; docs/design.md, \"Choosing the algorithm\")"
       : h->ctx->hier
           ? "hier (all-gather and reduce-scatter rail-aligned and "
             "hierarchical across nodes, docs/collectives.md)"
           : "flat (ring all-gather, pairwise reduce-scatter: one node, one "
             "rank per node, NCCL's own, or ZPP_ALGO=flat)",
       h->any_flat ? "; the -flat variants run the flat algorithms" : "",
       !h->any_hier ? ""
       : h->ctx->hier_capable
           ? "; the -hier variants run the hierarchical algorithms"
           : "; the -hier variants run what the flat ones run (one node, "
             "one rank per node or NCCL: no hierarchy; the algo column says "
             "which)",
       h->any_flat && h->any_hier
           ? ", each on a communicator of its own of the same ranks"
       : h->any_flat || h->any_hier
           ? ", on a communicator of its own of the same ranks"
           : "");
  if (h->coll == &zpp_bench_hpz && !h->ctx->uniform)
    LINE("hpz", "uneven nodes: hpZ keeps no secondary copy, so hpz-bwd "
                "variants run the documented fallback, a world gather from "
                "the primary shard");
  LINE("seed",
       "seed %llu: element i of rank r is N(0,1) from (seed, r, i), "
       "rounded to %s",
       (unsigned long long)o->seed, dt);
  LINE("timing",
       "timing: %s before each timed "
       "iteration, wall time of each by clock_gettime("
       "CLOCK_MONOTONIC); time_us = MAX over ranks of the MEAN over "
       "-n %d iterations; -w %d warm-up iterations untimed; "
       "time_med_us, time_min_us, time_max_us = median, min, max over the "
       "iterations of each iteration's MAX over ranks; %s",
       g_env ? "the bootstrap's barrier" : "MPI_Barrier(MPI_COMM_WORLD)",
       o->iters, o->warmup,
       o->interleave ? "the variants of a size round-robin (--interleave: "
                       "warm-up and timed call k of each before call k+1 "
                       "of any, each round starting one variant later)"
                     : "the variants of a size one after the other");
  LINE("size", "%s", h->coll->size_help);
  LINE("bandwidth", "%s; GB/s = 1e9 bytes/s", h->coll->bytes_help);
  LINE("bytes",
       "intra_bytes, inter_bytes = bytes SENT per rank in the first "
       "timed iteration, MEAN over ranks; inter_bytes_max = MAX over "
       "ranks; inter_bytes_node_max (CSV, JSON) = the bytes a node's ranks "
       "send to other nodes together, MAX over nodes (zpp_comm_get_stats%s%s)",
       h->bytes_derived ? "; some counts DERIVED from NCCL's algorithm" : "",
       h->has_mpi ? "; empty for mpi: Open MPI's own collective, whose "
                    "routing zpp cannot see" : "");
  LINE("ratio",
       "ratio = time_us / time_us of the baseline %s at the same "
       "size in this run",
       dt);
  if (o->check)
    LINE("check",
         "check of the first timed iteration: max_err = max |out - "
         "float64 reference|, wrong = elements outside the bound "
         "(%s); every element when size <= 1 MiB, else one block of "
         "%zu in every ceil(size / 1 MiB), plus the last",
         h->coll->check_help, o->block);
  else
    LINE("check", "check off (-c 0): max_err and wrong not computed");
#undef LINE
  *n = k;
}

/* The table's variant column: the longest name, mpi-best[<algorithm>]
 * with tuned's longest algorithm name (recursive_doubling). */
#define VARIANT_W 28

static void print_header(header_t *h, FILE *f) {
  static char lines[HEADER_LINES][HEADER_LINE];
  const char *keys[HEADER_LINES];
  int n, i;
  header_texts(h, lines, keys, &n);
  if (h->o->format != ZPP_BENCH_JSON) {
    for (i = 0; i < n; i++)
      fprintf(f, "# %s\n", lines[i]);
    if (h->o->format == ZPP_BENCH_CSV)
      fprintf(f, "%s\n", CSV_HEADER);
    else
      fprintf(f,
              "#\n# %-*s %12s %11s %5s %11s %9s %9s %12s %12s %8s %10s "
              "%7s %12s %11s %11s %11s %5s\n",
              VARIANT_W, "variant", "size", "count", "type", "time(us)",
              "algbw", "busbw", "intra_bytes", "inter_bytes", "ratio",
              "max_err", "#wrong", "inter_max", "med(us)", "min(us)",
              "max(us)", "algo");
    fflush(f);
    return;
  }
  fprintf(f, "{\"header\": {\"program\": \"zpp-bench\", \"coll\": ");
  json_string(f, h->coll->name);
  fprintf(f, ", \"variants\": [");
  for (i = 0; i < h->nv; i++) {
    fprintf(f, "%s", i ? ", " : "");
    json_string(f, h->v[i].name);
  }
  fprintf(f,
          "], \"dtype\": \"%s\", \"block\": %zu, \"op\": \"%s\", "
          "\"memory\": \"%s\", \"backend\": \"%s\", \"bootstrap\": \"%s\", "
          "\"world\": %d, \"nodes\": %d, \"ranks_per_node\": [",
          zpp_dtype_name(h->o->dtype), h->o->block,
          h->o->op == ZPP_OP_MEAN ? "mean" : "sum",
          h->o->memory == ZPP_MEMORY_HOST ? "host" : "device", h->backend,
          h->bootstrap,
          h->ctx->world, h->ctx->nnodes);
  for (i = 0; i < h->ctx->nnodes; i++)
    fprintf(f, "%s%d", i ? ", " : "", h->node_sizes[i]);
  fprintf(f, "], \"topology_emulated\": %s, \"zpp_topo\": ",
          h->topo_emulated ? "true" : "false");
  json_string(f, h->topo);
  fprintf(f,
          ", \"link_emulated\": %s, \"emu_gbit\": %g, \"emu_lat_us\": %g, "
          "\"seed\": %llu, \"iters\": %d, \"warmup\": %d, \"check\": %d, "
          "\"interleave\": %s",
          h->link_emulated ? "true" : "false", h->gbit, h->lat_us,
          (unsigned long long)h->o->seed, h->o->iters, h->o->warmup,
          h->o->check, h->o->interleave ? "true" : "false");
  fprintf(f, ", \"notes\": {"); /* the text of the table header */
  for (i = 0; i < n; i++) {
    fprintf(f, "%s\"%s\": ", i ? ", " : "", keys[i]);
    json_string(f, lines[i]);
  }
  fprintf(f, "}},\n\"rows\": [");
  fflush(f);
}

static void print_row(header_t *h, const row_t *r, FILE *f) {
  const zpp_bench_opts_t *o = h->o;
  const char *dt = zpp_dtype_name(o->dtype);
  char intra[32] = "", inter[32] = "", imax[32] = "", nmax[32] = "",
       ratio[32], err[32], wrong[32];
  if (r->counted) {
    fmt_bytes(intra, sizeof intra, r->intra_bytes);
    fmt_bytes(inter, sizeof inter, r->inter_bytes);
    snprintf(imax, sizeof imax, "%llu", (unsigned long long)r->inter_bytes_max);
    snprintf(nmax, sizeof nmax, "%llu", (unsigned long long)r->inter_node_max);
  }
  if (r->ratio >= 0)
    snprintf(ratio, sizeof ratio, "%.4f", r->ratio);
  else
    snprintf(ratio, sizeof ratio, "%s", "");
  if (r->checked) {
    snprintf(err, sizeof err, "%.4g", r->max_err);
    snprintf(wrong, sizeof wrong, "%llu", (unsigned long long)r->wrong);
  } else {
    err[0] = wrong[0] = '\0';
  }
  if (o->format == ZPP_BENCH_CSV) {
    /* the algo column is the table's and JSON's: the CSV keeps the
     * columns the study scripts of perf/ write as their header */
    fprintf(f, "%s,%s,%zu,%zu,%s,%.2f,%.4f,%.4f,%s,%s,%s,%s,%s,%s,%.2f,%.2f,"
            "%.2f,%s\n",
            h->coll->name, r->variant, r->size, r->count, dt, r->time_us,
            r->algbw, r->busbw, intra, inter, ratio, err, wrong, imax,
            r->med_us, r->min_us, r->max_us, nmax);
  } else if (o->format == ZPP_BENCH_TABLE) {
    fprintf(f,
            "  %-*s %12zu %11zu %5s %11.1f %9.3f %9.3f %12s %12s %8s "
            "%10s %7s %12s %11.1f %11.1f %11.1f %5s\n",
            VARIANT_W, r->variant, r->size, r->count, dt, r->time_us, r->algbw,
            r->busbw, intra[0] ? intra : "-", inter[0] ? inter : "-",
            ratio[0] ? ratio : "-", err[0] ? err : "-", wrong[0] ? wrong : "-",
            imax[0] ? imax : "-", r->med_us, r->min_us, r->max_us, r->algo);
  } else {
    fprintf(f,
            "%s\n  {\"coll\": \"%s\", \"variant\": \"%s\", \"size\": %zu, "
            "\"count\": %zu, \"dtype\": \"%s\", \"time_us\": %.2f, "
            "\"algbw\": %.4f, \"busbw\": %.4f, \"intra_bytes\": %s, "
            "\"inter_bytes\": %s, \"ratio\": %s, \"max_err\": %s, "
            "\"wrong\": %s, \"inter_bytes_max\": %s, \"time_med_us\": %.2f, "
            "\"time_min_us\": %.2f, \"time_max_us\": %.2f, "
            "\"inter_bytes_node_max\": %s, \"algo\": \"%s\"}",
            h->nrows ? "," : "", h->coll->name, r->variant, r->size, r->count,
            dt, r->time_us, r->algbw, r->busbw, intra[0] ? intra : "null",
            inter[0] ? inter : "null", ratio[0] ? ratio : "null",
            err[0] ? err : "null", wrong[0] ? wrong : "null",
            imax[0] ? imax : "null", r->med_us, r->min_us, r->max_us,
            nmax[0] ? nmax : "null", r->algo);
    h->nrows++;
  }
  fflush(f);
}

static void print_footer(header_t *h, FILE *f, uint64_t wrong,
                         const char *error) {
  const char *verdict = error[0] ? "ERROR" : wrong ? "FAILED" : "PASSED";
  if (h->o->format == ZPP_BENCH_JSON) {
    fprintf(f,
            "\n], \"wrong_total\": %llu, \"checked\": %s, \"status\": "
            "\"%s\", \"error\": ",
            (unsigned long long)wrong, h->o->check ? "true" : "false", verdict);
    json_string(f, error);
    fprintf(f, "}\n");
  } else {
    if (error[0])
      fprintf(f, "# error: %s\n", error);
    fprintf(f, "# wrong values: %llu%s; %s\n", (unsigned long long)wrong,
            h->o->check ? "" : " (check off)", verdict);
  }
  fflush(f);
}

/* ---- running one (size, variant) ----------------------------------------- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Every rank learns the worst status (statuses are <= 0). */
static zpp_status_t agree(zpp_status_t st) {
  return (zpp_status_t)(int)h_double((double)st, H_MIN);
}

/* An Open MPI variant's failure is not zpp's: its message is the line
 * zpp-bench printed before, not the communicator's last error. */
static void report_failure(const zpp_bench_ctx_t *ctx, const char *what,
                           const zpp_bench_case_t *c, zpp_status_t st) {
  fprintf(
      stderr, "zpp-bench: rank %d: %s of %s %s, size %zu (count %zu): %s: %s\n",
      ctx->rank, what, ctx->opt->coll, c->v->name, c->bytes, c->count,
      zpp_status_string(st),
      c->v->foreign
          ? "(the message above says why)"
          : zpp_comm_get_last_error(zpp_bench_comm_of(ctx, c->v)));
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The sum over each node's ranks of v (one value per rank), max over
 * nodes: one reduction per node, no allocation. */
static uint64_t node_max(const zpp_bench_ctx_t *ctx, uint64_t v) {
  uint64_t m = 0, sum;
  int k;
  for (k = 0; k < ctx->nnodes; k++) {
    sum = h_u64(ctx->node_of[ctx->rank] == k ? v : 0, H_SUM);
    m = sum > m ? sum : m;
  }
  return m;
}

/* Each iteration's time becomes its MAX over ranks (in place); then their
 * median, min and max, in us. */
static void iter_stats(double *t, int n, row_t *row) {
  int i;
  if (!g_env) {
    MPI_Allreduce(MPI_IN_PLACE, t, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  } else {
    for (i = 0; i < n; i++)
      t[i] = h_double(t[i], H_MAX);
  }
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  row->med_us = 1e6 * (n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]));
  row->min_us = 1e6 * t[0];
  row->max_us = 1e6 * t[n - 1];
}

/* One (size, variant) row being measured: its case, the stats around its
 * first timed iteration (the counted and checked one), its times. */
typedef struct {
  zpp_bench_case_t c;
  zpp_comm_t comm;
  zpp_comm_stats_t s0, s1;
  zpp_bench_check_t chk;
  double total, *times;
} timed_t;

/* Allocates the row's times and sets its case up; returns the agreed
 * status (ZPP_OK or the worst error).  tc_end is owed whatever it
 * returns. */
static zpp_status_t tc_begin(const zpp_bench_coll_t *coll,
                             const zpp_bench_ctx_t *ctx, timed_t *tc) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_status_t st, all;
  tc->comm = zpp_bench_comm_of(ctx, tc->c.v);
  tc->times = calloc((size_t)o->iters, sizeof *tc->times);
  st = tc->times != NULL ? ZPP_OK : ZPP_ERR_OUT_OF_MEMORY;
  /* setup may call collectives: every rank calls it, or none */
  if ((all = agree(st)) == ZPP_OK) {
    st = coll->setup(ctx, &tc->c);
    all = agree(st);
  }
  if (st != ZPP_OK)
    report_failure(ctx, "setup", &tc->c, st);
  return all;
}

/* One untimed warm-up call of the row; returns the agreed status. */
static zpp_status_t tc_warm(const zpp_bench_coll_t *coll,
                            const zpp_bench_ctx_t *ctx, timed_t *tc) {
  zpp_status_t st = coll->run(ctx, &tc->c);
  if (st != ZPP_OK)
    report_failure(ctx, "warm-up", &tc->c, st);
  return agree(st);
}

/* Timed iteration `it` of the row: the first one poisons the output
 * before, counts the bytes sent and checks the output after (untimed). */
static zpp_status_t tc_iter(const zpp_bench_coll_t *coll,
                            const zpp_bench_ctx_t *ctx, timed_t *tc, int it) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_bench_case_t *c = &tc->c;
  zpp_status_t st;
  double t0, t1;
  if (it == 0 && o->check) {
    st = agree(buf_poison(ctx, c->out));
    if (st != ZPP_OK)
      return st;
  }
  if (g_trace && ctx->rank == 0)
    fprintf(stderr, "# timed %s size %zu iteration %d\n", c->v->name,
            c->bytes, it);
  h_barrier();
  if (it == 0)
    zpp_comm_get_stats(tc->comm, &tc->s0);
  t0 = now_s();
  st = coll->run(ctx, c);
  t1 = now_s();
  tc->total += t1 - t0;
  tc->times[it] = t1 - t0;
  if (it == 0)
    zpp_comm_get_stats(tc->comm, &tc->s1);
  if (st != ZPP_OK)
    report_failure(ctx, "timed iteration", c, st);
  if (it == 0 && st == ZPP_OK && o->check) {
    st = zpp_bench_buf_download(ctx, c->out);
    if (st == ZPP_OK) {
      if (o->corrupt && ctx->rank == 0 && c->count > 0)
        zpp_bench_store(c->out->host, 0, o->dtype, 4096.0);
      coll->check(ctx, c, &tc->chk);
    }
  }
  return agree(st);
}

/* The family a variant's calls of `count` elements run: zpp's own
 * all-gather and reduce-scatter baselines ask the communicator (under
 * ZPP_ALGO=auto it chooses per size); quantized plans and hpZ: "-". */
static const char *row_algo(const zpp_bench_coll_t *coll,
                            const zpp_bench_ctx_t *ctx,
                            const zpp_bench_variant_t *v, size_t count) {
  zpp_backend_t be = ZPP_BACKEND_MPI;
  zpp_algorithm_t a = ZPP_ALGORITHM_FLAT;
  if (v->foreign)
    return "mpi";
  zpp_comm_backend(ctx->comm, &be);
  if (be == ZPP_BACKEND_NCCL)
    return "nccl";
  if (v->flat)
    return "flat";
  if (v->hier)
    return ctx->hier_capable ? "hier" : "flat";
  if (!v->baseline || (coll != &zpp_bench_allgather &&
                       coll != &zpp_bench_reducescatter))
    return "-";
  if (zpp_comm_choose_algorithm(ctx->comm,
                                coll == &zpp_bench_allgather
                                    ? ZPP_ALGO_COLL_ALLGATHER
                                    : ZPP_ALGO_COLL_REDUCE_SCATTER,
                                count, ctx->opt->dtype, &a, NULL) != ZPP_OK)
    return "?";
  return a == ZPP_ALGORITHM_HIER ? "hier" : "flat";
}

/* Tears the row's case down and, when every iteration ran (all ==
 * ZPP_OK), fills its row (collective: every rank calls it). */
static void tc_end(const zpp_bench_coll_t *coll, const zpp_bench_ctx_t *ctx,
                   timed_t *tc, zpp_status_t all, row_t *row) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_bench_case_t *c = &tc->c;
  double mean, tmax;
  uint64_t sent[2], sum[2] = {0, 0}, inter_max = 0;
  coll->teardown(ctx, c);
  if (all != ZPP_OK) {
    free(tc->times);
    tc->times = NULL;
    return;
  }
  iter_stats(tc->times, o->iters, row);
  free(tc->times);
  tc->times = NULL;
  mean = tc->total / o->iters;
  tmax = h_double(mean, H_MAX);
  sent[0] = tc->s1.intra_bytes_sent - tc->s0.intra_bytes_sent;
  sent[1] = tc->s1.inter_bytes_sent - tc->s0.inter_bytes_sent;
  sum[0] = h_u64(sent[0], H_SUM);
  sum[1] = h_u64(sent[1], H_SUM);
  inter_max = h_u64(sent[1], H_MAX);
  row->inter_node_max = node_max(ctx, sent[1]);
  snprintf(row->variant, sizeof row->variant, "%s",
           c->label[0] ? c->label : c->v->name);
  row->algo = row_algo(coll, ctx, c->v, c->count);
  row->size = c->bytes;
  row->count = c->count;
  row->time_us = tmax * 1e6;
  row->algbw =
      tmax > 0 ? coll->algbw_bytes(c->bytes, ctx->world) / tmax / 1e9 : 0;
  row->busbw = row->algbw * coll->busbw_factor(ctx->world);
  row->intra_bytes = (double)sum[0] / ctx->world;
  row->inter_bytes = (double)sum[1] / ctx->world;
  row->inter_bytes_max = inter_max;
  row->ratio = -1;
  row->counted = !c->v->foreign;
  row->checked = o->check;
  row->max_err = 0;
  row->wrong = 0;
  if (o->check) {
    row->max_err = h_double(tc->chk.max_err, H_MAX);
    row->wrong = h_u64(tc->chk.wrong, H_SUM);
  }
}

/* Measures the nv rows of one size: one variant after the other, or with
 * --interleave round-robin: warm-up call k, then timed call k, of every
 * variant before call k + 1 of any, round k starting at variant k mod nv
 * (so that a slow phase of a shared machine slows every variant alike, and
 * what one call leaves behind -- a drained token bucket, a TCP window --
 * falls on every variant in turn).  Returns the agreed status; *failed
 * gets the variant that failed. */
static zpp_status_t run_size(const zpp_bench_coll_t *coll,
                             const zpp_bench_ctx_t *ctx, timed_t *tc, int nv,
                             row_t *rows, int *failed) {
  const zpp_bench_opts_t *o = ctx->opt;
  zpp_status_t all = ZPP_OK;
  int i, k, it, begun = 0;
  if (!o->interleave) {
    for (i = 0; i < nv && all == ZPP_OK; i++) {
      *failed = i;
      all = tc_begin(coll, ctx, &tc[i]);
      for (it = 0; all == ZPP_OK && it < o->warmup; it++)
        all = tc_warm(coll, ctx, &tc[i]);
      for (it = 0; all == ZPP_OK && it < o->iters; it++)
        all = tc_iter(coll, ctx, &tc[i], it);
      tc_end(coll, ctx, &tc[i], all, &rows[i]);
    }
    return all;
  }
  for (i = 0; i < nv && all == ZPP_OK; i++, begun++) {
    *failed = i;
    all = tc_begin(coll, ctx, &tc[i]);
  }
  for (it = 0; all == ZPP_OK && it < o->warmup + o->iters; it++)
    for (k = 0; k < nv && all == ZPP_OK; k++) {
      i = (it + k) % nv;
      *failed = i;
      all = it < o->warmup ? tc_warm(coll, ctx, &tc[i])
                           : tc_iter(coll, ctx, &tc[i], it - o->warmup);
    }
  for (i = 0; i < begun; i++)
    tc_end(coll, ctx, &tc[i], all, &rows[i]);
  return all;
}

/* ---- main ---------------------------------------------------------------- */

static int bench(const zpp_bench_coll_t *coll, zpp_bench_opts_t *o,
                 zpp_comm_t comm, const zpp_comm_config_t *cfg) {
  zpp_bench_variant_t v[BENCH_MAX_VARIANTS];
  zpp_bench_ctx_t ctx;
  header_t h;
  zpp_comm_stats_t stats = ZPP_COMM_STATS_INIT;
  zpp_backend_t backend = ZPP_BACKEND_MPI;
  size_t ds = zpp_dtype_size(o->dtype), size;
  uint64_t wrong_total = 0;
  char error[1024] = "";
  int nv = 0, i, rc = 0;
  FILE *out = stdout;

  memset(&ctx, 0, sizeof ctx);
  memset(&h, 0, sizeof h);
  ctx.opt = o;
  ctx.comm = comm;
  zpp_comm_rank(comm, &ctx.rank);
  zpp_comm_size(comm, &ctx.world);
  zpp_comm_nnodes(comm, &ctx.nnodes);
  zpp_comm_topo_uniform(comm, &ctx.uniform);
  ctx.node_of = malloc((size_t)ctx.world * sizeof *ctx.node_of);
  ctx.local_of = malloc((size_t)ctx.world * sizeof *ctx.local_of);
  h.node_sizes = malloc((size_t)ctx.nnodes * sizeof *h.node_sizes);
  if (ctx.node_of == NULL || ctx.local_of == NULL || h.node_sizes == NULL) {
    fprintf(stderr, "zpp-bench: rank %d: out of memory\n", ctx.rank);
    free(ctx.node_of);
    free(ctx.local_of);
    free(h.node_sizes);
    return EXIT_ZPP;
  }
  for (i = 0; i < ctx.world; i++) {
    zpp_comm_node_of(comm, i, &ctx.node_of[i]);
    zpp_comm_local_rank_of(comm, i, &ctx.local_of[i]);
  }
  for (i = 0; i < ctx.nnodes; i++)
    zpp_comm_node_size(comm, i, &h.node_sizes[i]);
  if (parse_variants(coll, o, v, &nv, &h.added_baseline) != 0) {
    free(ctx.node_of);
    free(ctx.local_of);
    free(h.node_sizes);
    return EXIT_USAGE;
  }
  for (i = 0; i < nv; i++) {
    h.any_flat |= v[i].flat;
    h.any_hier |= v[i].hier;
  }
  /* every rank parsed the same list: all create them (over the same
   * bootstrap), or all fail alike */
  if ((h.any_flat && forced_comm(comm, cfg, ZPP_ALGORITHM_FLAT, ctx.rank,
                                 &ctx.comm_flat) != ZPP_OK) ||
      (h.any_hier && forced_comm(comm, cfg, ZPP_ALGORITHM_HIER, ctx.rank,
                                 &ctx.comm_hier) != ZPP_OK)) {
    zpp_comm_destroy(ctx.comm_flat);
    free(ctx.node_of);
    free(ctx.local_of);
    free(h.node_sizes);
    return EXIT_ZPP;
  }
  zpp_comm_get_stats(comm, &stats);
  zpp_comm_backend(comm, &backend);
  {
    zpp_algorithm_t al = ZPP_ALGORITHM_FLAT;
    zpp_comm_algorithm(comm, &al);
    ctx.hier_capable = backend != ZPP_BACKEND_NCCL && ctx.nnodes > 1 &&
                       ctx.nnodes < ctx.world;
    ctx.hier = al == ZPP_ALGORITHM_HIER && ctx.hier_capable;
    ctx.algo_auto = al == ZPP_ALGORITHM_AUTO && backend != ZPP_BACKEND_NCCL;
  }
  zpp_comm_topo_emulated(comm, &h.topo_emulated);
  if (zpp_settings_get("ZPP_TOPO", &h.topo) != ZPP_OK)
    h.topo = "";
  h.coll = coll;
  h.o = o;
  h.ctx = &ctx;
  h.bootstrap = zpp_comm_bootstrap_name(comm);
  h.v = v;
  h.nv = nv;
  for (i = 0; i < nv; i++)
    h.has_mpi |= v[i].foreign;
  h.backend = zpp_backend_name(backend);
  h.link_emulated = stats.link_emulated;
  h.bytes_derived = stats.bytes_derived;
  h.gbit = stats.emu_gbit;
  h.lat_us = stats.emu_lat_us;
  host_info(&h);
  h.peers = "";
  if (h.has_mpi) {
    static char peers[PEERS_TEXT];
    zpp_status_t st = zpp_bench_mpi_peers_init(
        &ctx, v, nv, coll == &zpp_bench_reducescatter, peers, sizeof peers);
    if (agree(st) != ZPP_OK) {
      if (ctx.rank == 0)
        fprintf(stderr, "zpp-bench: the Open MPI peers cannot be selected "
                        "as asked (each rank printed why)\n");
      zpp_comm_destroy(ctx.comm_flat);
      zpp_comm_destroy(ctx.comm_hier);
      free(ctx.node_of);
      free(ctx.local_of);
      free(h.node_sizes);
      return EXIT_ZPP;
    }
    h.peers = peers;
  }
  if (ctx.rank == 0)
    print_header(&h, out);

  for (size = o->min_bytes; size <= o->max_bytes;) {
    size_t count = coll->count_of(size, ds, ctx.world);
    zpp_bench_buf_t in = {NULL, NULL, 0}, outb = {NULL, NULL, 0};
    row_t rows[BENCH_MAX_VARIANTS];
    zpp_status_t st;
    double base_us = -1;
    size_t k;
    memset(rows, 0, sizeof rows);
    st = zpp_bench_buf_alloc(&ctx, coll->in_elems(count, ctx.world) * ds, &in);
    if (st == ZPP_OK)
      st = zpp_bench_buf_alloc(&ctx, coll->out_elems(count, ctx.world) * ds,
                               &outb);
    if (st == ZPP_OK) {
      size_t n = coll->in_elems(count, ctx.world);
      for (k = 0; k < n; k++)
        zpp_bench_store(in.host, k, o->dtype,
                        zpp_bench_value(o->seed, ctx.rank, k, o->dtype));
      st = zpp_bench_buf_upload(&ctx, &in);
    }
    if (agree(st) != ZPP_OK) {
      snprintf(error, sizeof error, "buffers of size %zu: %s (see stderr)",
               size, zpp_status_string(st != ZPP_OK ? st : ZPP_ERR_INTERNAL));
      zpp_bench_buf_free(&ctx, &in);
      zpp_bench_buf_free(&ctx, &outb);
      break;
    }
    if (ctx.algo_auto) { /* the check's reference follows each size's choice */
      zpp_algorithm_t a = ZPP_ALGORITHM_FLAT;
      zpp_status_t cs = zpp_comm_choose_algorithm(
          comm,
          coll == &zpp_bench_allgather ? ZPP_ALGO_COLL_ALLGATHER
                                       : ZPP_ALGO_COLL_REDUCE_SCATTER,
          count, o->dtype, &a, NULL);
      if (cs != ZPP_OK) {
        snprintf(error, sizeof error, "zpp_comm_choose_algorithm: %s",
                 zpp_get_last_error());
        zpp_bench_buf_free(&ctx, &in);
        zpp_bench_buf_free(&ctx, &outb);
        break;
      }
      ctx.hier = a == ZPP_ALGORITHM_HIER;
    }
    {
      timed_t tc[BENCH_MAX_VARIANTS];
      int failed = 0;
      memset(tc, 0, sizeof tc);
      for (i = 0; i < nv; i++) {
        tc[i].c.v = &v[i];
        tc[i].c.count = count;
        tc[i].c.bytes = coll->bytes_of(count, ds, ctx.world);
        tc[i].c.in = &in;
        tc[i].c.out = &outb;
        tc[i].c.state = NULL;
        tc[i].s0 = tc[i].s1 = (zpp_comm_stats_t)ZPP_COMM_STATS_INIT;
      }
      st = run_size(coll, &ctx, tc, nv, rows, &failed);
      if (st != ZPP_OK)
        snprintf(error, sizeof error,
                 "%s %s, size %zu: %s (each failing rank printed its "
                 "message to stderr)",
                 coll->name, v[failed].name, tc[failed].c.bytes,
                 zpp_status_string(st));
      for (i = 0; st == ZPP_OK && i < nv; i++)
        if (v[i].baseline && base_us < 0)
          base_us = rows[i].time_us;
    }
    zpp_bench_buf_free(&ctx, &in);
    zpp_bench_buf_free(&ctx, &outb);
    if (error[0])
      break;
    for (i = 0; i < nv; i++) {
      rows[i].ratio = base_us > 0 ? rows[i].time_us / base_us : -1;
      wrong_total += rows[i].wrong;
      if (ctx.rank == 0)
        print_row(&h, &rows[i], out);
    }
    if (size > o->max_bytes / o->factor)
      break;
    size *= o->factor;
  }
  if (error[0])
    rc = EXIT_ZPP;
  else if (wrong_total > 0)
    rc = EXIT_WRONG;
  if (ctx.rank == 0)
    print_footer(&h, out, wrong_total, error);
  zpp_comm_destroy(ctx.comm_flat);
  zpp_comm_destroy(ctx.comm_hier);
  free(ctx.node_of);
  free(ctx.local_of);
  free(h.node_sizes);
  return rc;
}

/* 1 when a --variant list names mpi-best (before getopt: MPI_Init comes
 * first). */
static int asks_mpi_best(int argc, char **argv) {
  char list[512], *tok, *save = NULL;
  const char *val;
  int i;
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--variant") == 0 && i + 1 < argc)
      val = argv[++i];
    else if (strncmp(argv[i], "--variant=", 10) == 0)
      val = argv[i] + 10;
    else
      continue;
    snprintf(list, sizeof list, "%s", val);
    for (tok = strtok_r(list, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save))
      if (strcmp(tok, "mpi-best") == 0)
        return 1;
  }
  return 0;
}

#define FINALIZE()                                                             \
  do {                                                                         \
    if (!g_env)                                                                \
      MPI_Finalize();                                                          \
  } while (0)

int main(int argc, char **argv) {
  zpp_bench_opts_t o;
  const zpp_bench_coll_t *coll = NULL;
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  zpp_comm_t comm = NULL;
  zpp_status_t st;
  int print_settings = 0, rc, i, provided = 0;

  g_env = env_launch();
  for (i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--bootstrap") == 0)
      g_env = strcmp(argv[i + 1], "env") == 0;
  if (g_env) {
    /* until the communicator says (RANK first, as the library reads them) */
    const char *r =
        env_set("RANK") != NULL ? env_set("RANK") : env_set("SLURM_PROCID");
    g_rank = r != NULL ? atoi(r) : 0;
  } else {
    /* mpi-best forces tuned's algorithms, which tuned reads only with
     * dynamic rules on: a variable that cannot be written after MPI_Init
     * (perf/bench_mpi_peers.c).  The environment's own setting wins. */
    if (asks_mpi_best(argc, argv))
      setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 0);
    /* SERIALIZED: zpp's pipelined collectives hand transfers to a helper
     * thread while this thread computes (it never calls MPI meanwhile). */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  }
  memset(&o, 0, sizeof o);
  o.min_bytes = (size_t)64 << 10;
  o.max_bytes = (size_t)4 << 20;
  o.factor = 4;
  o.iters = 20;
  o.warmup = 5;
  o.check = 1;
  o.coll = "allgather";
  o.dtype = ZPP_BFLOAT16;
  o.block = 256;
  o.format = ZPP_BENCH_TABLE;
  o.op = ZPP_OP_SUM;
  o.memory = ZPP_MEMORY_HOST;
  o.backend = ZPP_BACKEND_AUTO;
  o.seed = 20261129ull;
  rc = parse_args(argc, argv, &o, &print_settings);
  if (rc != 0) {
    FINALIZE();
    return rc > 0 ? 0 : EXIT_USAGE;
  }
  if (print_settings) {
    if (g_rank == 0)
      zpp_settings_print(stdout);
    FINALIZE();
    return 0;
  }
  for (i = 0; i < (int)NCOLLS; i++)
    if (strcmp(o.coll, g_colls[i]->name) == 0)
      coll = g_colls[i];
  if (coll == NULL) {
    flag_error("--coll %s: must be allgather, reducescatter or hpz-gather",
               o.coll);
    FINALIZE();
    return EXIT_USAGE;
  }
  if (o.memory == ZPP_MEMORY_DEVICE &&
      (!ZPP_BENCH_CUDA || !zpp_cuda_available())) {
    if (g_rank == 0)
      fprintf(stderr, "zpp-bench: --memory device: no CUDA device (%s)\n",
              ZPP_BENCH_CUDA ? "zpp_cuda_available() is 0: no usable device"
                             : "zpp was built without CUDA, so zpp-bench "
                               "cannot allocate device memory");
    FINALIZE();
    return EXIT_ZPP;
  }
  cfg.memory = o.memory;
  cfg.backend = o.backend;
  /* Creation fails on every rank alike (zpp agrees on it). */
  st = g_env ? zpp_comm_create_from_env(&cfg, &comm)
             : zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &comm);
  if (st != ZPP_OK) {
    fprintf(stderr, "zpp-bench: rank %d: %s: %s\n", g_rank,
            zpp_status_string(st), zpp_get_last_error());
    FINALIZE();
    return EXIT_ZPP;
  }
  g_comm = comm;
  zpp_comm_rank(comm, &g_rank);
  rc = bench(coll, &o, comm, &cfg);
  if (!g_env)
    mpi_teardown();
  zpp_comm_destroy(comm);
  FINALIZE();
  return rc;
}
