/*
 * zpp-train: reference trainer for the runtime API (docs/runtime.md).
 *
 * An MLP (tanh hidden layers, MSE loss against a fixed random teacher) is
 * trained with Adam (fp32 master weights, bf16 working copies) on
 * synthetic data from a fixed seed; the global batch is split over the
 * ranks.  One parameter group per layer.  Modes:
 *
 *   dp      every rank holds everything; gradients all-reduced
 *   zero1   optimizer state (master, m, v) sharded
 *   zero2   + gradients sharded
 *   zero3   + parameters sharded: fetched per layer before use, released
 *           after, the next layer prefetched
 *   zeropp  zero3 with qwZ, hpZ and qgZ (each switchable)
 *
 * Summation order (why dp..zero3 are bitwise equal, docs/runtime.md): every
 * mode reduces the bf16 gradient of each layer with the same call,
 * zpp_pgroup_reduce_gradients (the baseline reduce-scatter in its
 * documented order, docs/collectives.md); dp and zero1 all-gather the
 * reduced shards (the transport's all-reduce is exactly that pair), and
 * Adam runs the same element-wise code on each element wherever it is
 * stored.  The layers' arithmetic (tools/train_math.h) works on all of a
 * rank's samples at once but sums every element in the order of plain
 * per-sample loops.
 *
 * Overlap (--overlap 1, the default): each layer's gradient reduction is
 * started (a request) as soon as its gradient is ready and runs on the
 * communicator's engine thread while the next layer's backward computes;
 * all are waited for before the optimizer step.  zero2/zero3/zeropp keep
 * two full-gradient buffers for that (a layer waits for the reduction two
 * layers back before reusing its buffer).  The same calls in the same
 * order: the results are bitwise those of --overlap 0.
 *
 *   mpirun -np 4 zpp-train --mode zero3 [--steps 50] [--json]
 *
 * Exit status: 0 on success, 2 for a bad flag, 1 when a call fails.
 */
#include <mpi.h>
#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>
#include <zpp/zpp_runtime.h>

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zpp_internal/kernels.h"
#include "train_math.h"

#define PROG "zpp-train"

typedef enum { M_DP, M_ZERO1, M_ZERO2, M_ZERO3, M_ZEROPP } mode_t_;
static const char *mode_names[] = {"dp", "zero1", "zero2", "zero3", "zeropp"};

typedef struct {
  mode_t_ mode;
  int depth, width, in_dim, out_dim, batch, steps;
  float lr;
  uint64_t seed;
  int json, quiet, overlap;
  int qwz_bits, hpz, qgz_bits, qgz_intra_bits, ef;
  size_t block;
  /* transforms: qWD, Hadamard, stochastic rounding, error-feedback bits */
  int qwd_bits, hadamard, sr, ef_bits;
  size_t qwd_block, qwz_block;
  /* compression flags given on the command line: zero1/zero2 use only
   * these (so their defaults stay the bitwise baseline) */
  int given_qwz, given_qgz, given_ef;
  /* LoCo's compensation: moving average and reset period (0: off) */
  float ef_beta;
  unsigned ef_reset;
  /* standard deviation of the Gaussian noise added to every target (0:
   * none); the expected loss of the teacher itself is then sigma^2, a
   * floor no model can go below, as a language model's entropy rate */
  float label_noise;
  /* zero3/zeropp: forward and backward parameter fetches this many
   * layers ahead (1) */
  int bwd_prefetch;
  int fwd_prefetch;
  /* --survive: a rank's death is survived (zpp_comm_shrink, then
   * zpp_pgroup_recover); --kill-rank R --kill-step S: rank R SIGKILLs
   * itself at the start of step S's backward (-1: nobody), or with
   * --kill-late after step S's optimizer update */
  int survive, kill_rank, kill_step, kill_late;
} opts_t;

static int g_rank = 0, g_size = 1;

#define DIE(...)                                                               \
  do {                                                                         \
    fprintf(stderr, PROG ": rank %d: ", g_rank);                               \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    MPI_Abort(MPI_COMM_WORLD, 1);                                              \
  } while (0)
/* In the step loop: with --survive a failure goes to the recovery */
#define SCALL(call)                                                            \
  do {                                                                         \
    zpp_status_t st_ = (call);                                                 \
    if (st_ != ZPP_OK) {                                                       \
      if (!o.survive)                                                          \
        DIE("%s: %s: %s", #call, zpp_status_string(st_),                       \
            zpp_get_last_error());                                             \
      fail_st = st_;                                                           \
      snprintf(fail_msg, sizeof fail_msg, "%s: %s", #call,                     \
               zpp_get_last_error());                                          \
      goto failed;                                                             \
    }                                                                          \
  } while (0)
#define ZCALL(call)                                                            \
  do {                                                                         \
    zpp_status_t st_ = (call);                                                 \
    if (st_ != ZPP_OK)                                                         \
      DIE("%s: %s: %s", #call, zpp_status_string(st_), zpp_get_last_error()); \
  } while (0)

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  if (!p)
    DIE("out of memory (%zu x %zu bytes)", n, sz);
  return p;
}

/* ---- deterministic random numbers (splitmix64) --------------------------- */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* 64 random bits from (seed, stream, index) */
static uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t i) {
  return mix(seed ^ mix(stream * 0x100000001b3ull ^ mix(i)));
}
/* uniform in [-1, 1) from (seed, stream, index) */
static float urand(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t h = hash3(seed, stream, i);
  return (float)((double)(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* standard normal from (seed, stream, index): Box-Muller on two uniforms
 * in (0, 1] drawn from independent counters */
static float nrand(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t a = hash3(seed, stream, 2 * i), b = hash3(seed, stream, 2 * i + 1);
  double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float bf(uint16_t h) { return zpp_qm_bf16_to_f32(h); }
static uint16_t tobf(float f) { return zpp_qm_f32_to_bf16(f); }

/* ---- one layer = one parameter group ------------------------------------- */
typedef struct {
  int fan_in, fan_out;
  size_t n;              /* fan_out * fan_in + fan_out (weights, then bias) */
  zpp_pgroup_t pg;
  zpp_pgroup_config_t cfg;
  size_t shard, padded;  /* elements */
  /* model state kept between steps (sizes depend on the mode) */
  float *master, *m, *v; /* fp32: padded (dp) or shard (zero*) elements */
  uint16_t *wfull;       /* bf16 full parameters (dp, zero1, zero2) */
  uint16_t *gfull;       /* bf16 full gradient (dp, zero1: state; zero2/3:
                            points to the shared one-layer buffer) */
  uint16_t *gshard;      /* bf16 reduced gradient shard */
  /* after a recovery (NULL before): per element of the shard, the step
   * Adam's moments and bias correction (re)started at (1, or the step
   * after a recovery that lost the element's state) */
  int *rstep;
} layer_t;

static void usage(FILE *out) {
  fprintf(out,
          "usage: mpirun -np N " PROG " [options]\n"
          "  --mode M        dp | zero1 | zero2 | zero3 | zeropp (zero3)\n"
          "  --depth L       layers (14)        --width H   hidden width (62)\n"
          "  --in D          input features (16) --out K    outputs (4)\n"
          "  --large         depth 8, width 1024 (about 6.3M parameters)\n"
          "  --batch B       global batch, a multiple of N (64)\n"
          "  --steps S       (50)               --lr X      Adam lr (1e-3)\n"
          "  --seed S        data and init seed (1)\n"
          "  --qwz BITS      zeropp weight bits: 8, 4, 0 off (8)\n"
          "  --hpz 0|1       zeropp secondary partition (1)\n"
          "  --qgz BITS      zeropp gradient bits across nodes: 4, 8, 0 off (4)\n"
          "  --qgz-intra BITS  bits inside the node: 4, 8, or 16: not\n"
          "                  quantized, the bf16 gradient (4)\n"
          "  --ef 0|1        qgZ error feedback (1)\n"
          "  --block N       quantization block and shard alignment (256)\n"
          "  --qwz-block N   qwZ block (--block)\n"
          "  --qwd BITS      zero1/zero2: refresh the full weights with qWD,\n"
          "                  quantized differences: 4, 8, 0 off (0)\n"
          "  --qwd-block N   qWD block (2048)\n"
          "  --hadamard G    qgZ Hadamard group, 0 off (0)\n"
          "  --sr 0|1        stochastic rounding in qgZ and qWD (0)\n"
          "  --ef-bits 32|8  error-feedback residual storage (32)\n"
          "  --ef-beta B     LoCo: the residual averages the errors with\n"
          "                  weight B on the old one, in [0, 1) (0; LoCo 0.8)\n"
          "  --ef-reset N    LoCo: zero the residual every N steps (0 never;\n"
          "                  LoCo 1024)\n"
          "  --label-noise S add Gaussian noise of standard deviation S to every\n"
          "                  target: the loss then has a floor, S^2 (0)\n"
          "  zero1/zero2 use --qwz, --qgz, --ef only when given (default: the\n"
          "  bitwise baseline); dp ignores all compression flags\n"
          "  --overlap 0|1   start each layer's gradient reduction and overlap it\n"
          "                  with the next layer's backward (1)\n"
          "  --fwd-prefetch F zero3/zeropp: fetch the forward's parameters F\n"
          "                  layers ahead, 1 to 4; other modes refuse F > 1 (1)\n"
          "  --bwd-prefetch D the same for the backward's parameters (1)\n"
          "  --json          end with one JSON object (rank 0); step_time_s = mean\n"
"                  step time over steps 2.., max over ranks\n"
          "  --quiet         no per-step lines\n"
          "  --survive       zero3/zeropp: survive a rank's death (shrink the\n"
          "                  communicator, recover the groups from hpZ's\n"
          "                  copies, redo the step); run under mpirun\n"
          "                  --enable-recovery\n"
          "  --kill-rank R --kill-step S  with --survive: rank R SIGKILLs\n"
          "                  itself at the start of step S's backward\n"
          "  --kill-late     with --kill-rank: after step S's optimizer\n"
          "                  update instead (before the step's closing\n"
          "                  exchanges)\n");
}

static int parse(int argc, char **argv, opts_t *o) {
  *o = (opts_t){M_ZERO3, 14, 62, 16, 4, 64, 50, 1e-3f, 1, 0, 0, 1,
                8, 1, 4, 4, 1, 256, 0, 0, 0, 32, 2048, 0, 0, 0, 0, 0.0f, 0,
                0.0f, 1, 1, 0, -1, 0, 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV                                                                  \
  if (!v) {                                                                    \
    fprintf(stderr, PROG ": %s needs a value\n", a);                           \
    return 2;                                                                  \
  }                                                                            \
  i++;
    if (!strcmp(a, "--mode")) {
      NEEDV;
      int k = -1;
      for (int j = 0; j < 5; j++)
        if (!strcmp(v, mode_names[j]))
          k = j;
      if (k < 0) {
        fprintf(stderr, PROG ": --mode %s: must be dp, zero1, zero2, zero3 "
                        "or zeropp\n", v);
        return 2;
      }
      o->mode = (mode_t_)k;
    } else if (!strcmp(a, "--depth")) { NEEDV; o->depth = atoi(v);
    } else if (!strcmp(a, "--width")) { NEEDV; o->width = atoi(v);
    } else if (!strcmp(a, "--in")) { NEEDV; o->in_dim = atoi(v);
    } else if (!strcmp(a, "--out")) { NEEDV; o->out_dim = atoi(v);
    } else if (!strcmp(a, "--large")) { o->depth = 8; o->width = 1024;
    } else if (!strcmp(a, "--batch")) { NEEDV; o->batch = atoi(v);
    } else if (!strcmp(a, "--steps")) { NEEDV; o->steps = atoi(v);
    } else if (!strcmp(a, "--lr")) { NEEDV; o->lr = strtof(v, NULL);
    } else if (!strcmp(a, "--seed")) { NEEDV; o->seed = strtoull(v, NULL, 10);
    } else if (!strcmp(a, "--qwz")) { NEEDV; o->qwz_bits = atoi(v); o->given_qwz = 1;
    } else if (!strcmp(a, "--qwz-block")) { NEEDV; o->qwz_block = strtoull(v, NULL, 10);
    } else if (!strcmp(a, "--qwd")) { NEEDV; o->qwd_bits = atoi(v);
    } else if (!strcmp(a, "--qwd-block")) { NEEDV; o->qwd_block = strtoull(v, NULL, 10);
    } else if (!strcmp(a, "--hadamard")) { NEEDV; o->hadamard = atoi(v);
    } else if (!strcmp(a, "--sr")) { NEEDV; o->sr = atoi(v);
    } else if (!strcmp(a, "--ef-bits")) { NEEDV; o->ef_bits = atoi(v);
    } else if (!strcmp(a, "--ef-beta")) { NEEDV; o->ef_beta = strtof(v, NULL);
    } else if (!strcmp(a, "--ef-reset")) { NEEDV;
      o->ef_reset = (unsigned)strtoul(v, NULL, 10);
    } else if (!strcmp(a, "--label-noise")) {
      NEEDV;
      char *end;
      o->label_noise = strtof(v, &end);
      if (end == v || *end || !(o->label_noise >= 0.0f) ||
          !isfinite(o->label_noise)) {
        fprintf(stderr, PROG ": --label-noise %s: must be a finite number "
                        ">= 0\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--hpz")) { NEEDV; o->hpz = atoi(v);
    } else if (!strcmp(a, "--qgz")) { NEEDV; o->qgz_bits = atoi(v); o->given_qgz = 1;
    } else if (!strcmp(a, "--qgz-intra")) { NEEDV; o->qgz_intra_bits = atoi(v);
    } else if (!strcmp(a, "--ef")) { NEEDV; o->ef = atoi(v); o->given_ef = 1;
    } else if (!strcmp(a, "--block")) { NEEDV; o->block = strtoull(v, NULL, 10);
    } else if (!strcmp(a, "--overlap")) { NEEDV; o->overlap = atoi(v);
    } else if (!strcmp(a, "--bwd-prefetch") || !strcmp(a, "--fwd-prefetch")) {
      NEEDV;
      char *end;
      long d = strtol(v, &end, 10);
      if (end == v || *end || d < 1 || d > 4) {
        fprintf(stderr, PROG ": %s %s: must be 1 to 4\n", a, v);
        return 2;
      }
      *(a[2] == 'b' ? &o->bwd_prefetch : &o->fwd_prefetch) = (int)d;
    } else if (!strcmp(a, "--survive")) { o->survive = 1;
    } else if (!strcmp(a, "--kill-rank")) { NEEDV; o->kill_rank = atoi(v);
    } else if (!strcmp(a, "--kill-step")) { NEEDV; o->kill_step = atoi(v);
    } else if (!strcmp(a, "--kill-late")) { o->kill_late = 1;
    } else if (!strcmp(a, "--json")) { o->json = 1;
    } else if (!strcmp(a, "--quiet")) { o->quiet = 1;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 1;
    } else {
      fprintf(stderr, PROG ": unknown flag %s\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDV
  }
  if (o->depth < 1 || o->width < 1 || o->in_dim < 1 || o->out_dim < 1 ||
      o->steps < 0 || o->batch < 1 || o->block < 1 || !(o->lr > 0)) {
    fprintf(stderr, PROG ": --depth, --width, --in, --out, --batch, --block "
                    "must be >= 1, --steps >= 0, --lr > 0\n");
    return 2;
  }
  if ((o->bwd_prefetch != 1 || o->fwd_prefetch != 1) && o->mode != M_ZERO3 &&
      o->mode != M_ZEROPP) {
    /* dp, zero1 and zero2 keep the full parameters: no fetch to move, and
     * a silently ignored D would pass for a measured one */
    fprintf(stderr, PROG ": --%s-prefetch %d: only zero3 and zeropp fetch "
                    "parameters in the forward and backward (--mode %s keeps "
                    "them)\n",
            o->bwd_prefetch != 1 ? "bwd" : "fwd",
            o->bwd_prefetch != 1 ? o->bwd_prefetch : o->fwd_prefetch,
            mode_names[o->mode]);
    return 2;
  }
  if (o->survive && o->mode != M_ZERO3 && o->mode != M_ZEROPP) {
    fprintf(stderr, PROG ": --survive: only zero3 and zeropp (their groups "
                    "hold the parameters zpp_pgroup_recover rebuilds)\n");
    return 2;
  }
  if ((o->kill_rank >= 0 || o->kill_step) &&
      (!o->survive || o->kill_rank < 0 || o->kill_step < 1 ||
       o->kill_step > o->steps)) {
    fprintf(stderr, PROG ": --kill-rank %d --kill-step %d: need --survive, a "
                    "rank >= 0 and a step in [1, --steps]\n",
            o->kill_rank, o->kill_step);
    return 2;
  }
  if (o->overlap != 0 && o->overlap != 1) {
    fprintf(stderr, PROG ": --overlap %d: must be 0 or 1\n", o->overlap);
    return 2;
  }
  if (o->qwz_block == 0)
    o->qwz_block = o->block;
  if (o->qwd_bits && o->mode != M_ZERO1 && o->mode != M_ZERO2) {
    fprintf(stderr, PROG ": --qwd: only zero1 and zero2 keep the full "
                    "parameters between steps\n");
    return 2;
  }
  if (o->qwd_bits && o->given_qwz && o->qwz_bits) {
    fprintf(stderr, PROG ": --qwd and --qwz: choose one way to send the "
                    "weights\n");
    return 2;
  }
  return 0;
}

/* Adam on one element; the same code for every mode (bitwise agreement). */
static void adam(float *p, float *m, float *v, float g, float lr, float bc1,
                 float bc2) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  *m = b1 * *m + (1.0f - b1) * g;
  *v = b2 * *v + (1.0f - b2) * (g * g);
  float mh = *m / bc1, vh = *v / bc2;
  *p = *p - lr * mh / (sqrtf(vh) + eps);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *c = (const uint8_t *)p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

/* ---- the trainer's own exchanges ---------------------------------------
 * MPI need not survive a rank's death (docs/api.md, "Shrinking after a
 * failure"), so with --survive every exchange of the trainer itself
 * (barrier, losses, times, counters, checksums) is an all-gather of bytes
 * on the zpp communicator in use, whose bytes are left out of the
 * per-step counters (g_aux_*); otherwise MPI_Allgather.  Both hand every
 * rank the same bits, so the reductions below are the same. */
static zpp_comm_t g_comm;
static int g_survive;
static uint64_t g_aux_inter, g_aux_intra;

static double wtime(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static zpp_status_t xallgather(const void *in, size_t bytes, void *out) {
  if (!g_survive)
    return MPI_Allgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE,
                         MPI_COMM_WORLD) == MPI_SUCCESS
               ? ZPP_OK
               : ZPP_ERR_MPI;
  zpp_comm_stats_t a = ZPP_COMM_STATS_INIT, b = ZPP_COMM_STATS_INIT;
  (void)zpp_comm_get_stats(g_comm, &a);
  zpp_status_t st =
      zpp_allgather(g_comm, in, out, bytes, ZPP_UINT8, NULL, NULL);
  if (zpp_comm_get_stats(g_comm, &b) == ZPP_OK) {
    g_aux_inter += b.inter_bytes_sent - a.inter_bytes_sent;
    g_aux_intra += b.intra_bytes_sent - a.intra_bytes_sent;
  }
  return st;
}

/* Buffers of a failed collective: zpp_comm.h keeps them in use until
 * zpp_comm_destroy returns; the recovery frees them after it (a buffer
 * beyond the list's room is left allocated) */
static void *g_defer[64];
static int g_ndefer;
static void free_after(zpp_status_t st, void *p) {
  if (st == ZPP_OK)
    free(p);
  else if (g_ndefer < (int)(sizeof g_defer / sizeof g_defer[0]))
    g_defer[g_ndefer++] = p;
}
static void free_deferred(void) {
  while (g_ndefer > 0)
    free(g_defer[--g_ndefer]);
}

/* x[0..n) = the maximum over the ranks, element-wise */
static zpp_status_t xmax(double *x, int n) {
  double *all = calloc((size_t)g_size * (size_t)n, sizeof(double));
  if (all == NULL)
    return ZPP_ERR_OUT_OF_MEMORY;
  zpp_status_t st = xallgather(x, (size_t)n * sizeof(double), all);
  for (int r = 0; st == ZPP_OK && r < g_size; r++)
    for (int k = 0; k < n; k++)
      if (all[(size_t)r * n + k] > x[k])
        x[k] = all[(size_t)r * n + k];
  free_after(st, all);
  return st;
}

static zpp_status_t xminmax_u64(uint64_t x, uint64_t *mn, uint64_t *mx) {
  uint64_t *all = calloc((size_t)g_size, sizeof(uint64_t));
  if (all == NULL)
    return ZPP_ERR_OUT_OF_MEMORY;
  zpp_status_t st = xallgather(&x, sizeof x, all);
  *mn = *mx = x;
  for (int r = 0; st == ZPP_OK && r < g_size; r++) {
    if (all[r] < *mn)
      *mn = all[r];
    if (all[r] > *mx)
      *mx = all[r];
  }
  free_after(st, all);
  return st;
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  opts_t o;
  int pr = parse(argc, argv, &o);
  if (pr) {
    MPI_Finalize();
    return pr == 1 ? 0 : 2;
  }
  if (o.kill_rank >= g_size) {
    if (g_rank == 0)
      fprintf(stderr, PROG ": --kill-rank %d: not a rank of the %d ranks\n",
              o.kill_rank, g_size);
    MPI_Finalize();
    return 2;
  }
  if (o.batch % g_size) {
    if (g_rank == 0)
      fprintf(stderr, PROG ": --batch %d: must be a multiple of the %d ranks\n",
              o.batch, g_size);
    MPI_Finalize();
    return 2;
  }
  /* W, bl (and the buffers sized by them) change when --survive
   * recovers from a rank's death */
  int W = g_size, bl = o.batch / W;
  const int L = o.depth;
  const int world_rank = g_rank; /* the rank --kill-rank names */
  const mode_t_ mode = o.mode;
  const int sharded_opt = mode != M_DP;
  const int sharded_grad = mode >= M_ZERO2;
  const int sharded_param = mode >= M_ZERO3;

  zpp_comm_t comm;
  zpp_comm_config_t cc = ZPP_COMM_CONFIG_INIT;
  ZCALL(zpp_comm_create_mpi(MPI_COMM_WORLD, &cc, &comm));
  g_comm = comm;
  g_survive = o.survive;
  int nnodes = 1;
  ZCALL(zpp_comm_nnodes(comm, &nnodes));

  /* ---- layers and groups ---- */
  layer_t *ly = xcalloc((size_t)L, sizeof(layer_t));
  size_t psi_real = 0, psi = 0, max_padded = 0;
  for (int l = 0; l < L; l++) {
    layer_t *y = &ly[l];
    y->fan_in = l == 0 ? o.in_dim : o.width;
    y->fan_out = l == L - 1 ? o.out_dim : o.width;
    size_t sizes[2] = {(size_t)y->fan_out * y->fan_in, (size_t)y->fan_out};
    y->n = sizes[0] + sizes[1];
    zpp_pgroup_config_t pc = ZPP_PGROUP_CONFIG_INIT;
    pc.align = o.block; /* same layout in every mode */
    if (mode == M_ZEROPP) {
      pc.qwz_bits = o.qwz_bits;
      pc.qwz_block = o.qwz_block;
      pc.hpz = o.hpz;
      pc.qgz_bits = o.qgz_bits;
      pc.qgz_intra_bits = o.qgz_intra_bits;
      pc.qgz_block = o.block;
      pc.error_feedback = o.qgz_bits ? o.ef : 0;
    } else if (mode == M_ZERO1 || mode == M_ZERO2) { /* explicit flags only */
      pc.qwz_bits = o.given_qwz ? o.qwz_bits : 0;
      pc.qwz_block = o.qwz_block;
      pc.qgz_bits = o.given_qgz ? o.qgz_bits : 0;
      pc.qgz_intra_bits = o.qgz_intra_bits;
      pc.qgz_block = o.block;
      pc.error_feedback = pc.qgz_bits && (o.given_ef || o.given_qgz) ? o.ef : 0;
      pc.qwd_bits = o.qwd_bits;
      pc.qwd_block = o.qwd_block;
    }
    if (pc.qgz_bits) {
      pc.qgz_hadamard = (size_t)o.hadamard;
      pc.error_feedback_bits = o.ef_bits;
      pc.error_feedback_beta = o.ef_beta;
      pc.error_feedback_reset = o.ef_reset;
    }
    pc.rounding = o.sr ? ZPP_ROUND_STOCHASTIC : ZPP_ROUND_NEAREST;
    pc.seed = o.seed;
    y->cfg = pc;
    ZCALL(zpp_pgroup_create(comm, &pc, sizes, 2, &y->pg));
    zpp_pgroup_info_t pi = ZPP_PGROUP_INFO_INIT;
    ZCALL(zpp_pgroup_get_info(y->pg, &pi));
    y->shard = pi.shard_numel;
    y->padded = pi.padded_numel;
    psi_real += y->n;
    psi += y->padded;
    if (y->padded > max_padded)
      max_padded = y->padded;
  }

  /* ---- model state (bytes kept between steps, per rank) ---- */
  size_t state_bytes = 0, buf_bytes_grad = 0, buf_bytes_gshard = 0;
  /* zero2/3: one layer's full gradient, reused; with --overlap two, in
   * turns, since a layer's reduction may still read its buffer while the
   * next layer's gradient is computed */
  int ngbuf = sharded_grad ? (o.overlap ? 2 : 1) : 0;
  uint16_t *gbuf[2] = {NULL, NULL};
  for (int b = 0; b < ngbuf; b++)
    gbuf[b] = xcalloc(max_padded, 2);
  buf_bytes_grad = (size_t)ngbuf * max_padded * 2;
  /* the reduction in flight on each layer (and dp's all-gather after it) */
  zpp_request_t *rs_req = xcalloc((size_t)L, sizeof(zpp_request_t));
  zpp_request_t *ag_req = xcalloc((size_t)L, sizeof(zpp_request_t));
  for (int l = 0; l < L; l++) {
    layer_t *y = &ly[l];
    size_t no = sharded_opt ? y->shard : y->padded;
    y->master = xcalloc(no, 4);
    y->m = xcalloc(no, 4);
    y->v = xcalloc(no, 4);
    state_bytes += 12 * no;
    /* init: Xavier-uniform weights, zero bias; padded tail zero */
    float a = sqrtf(6.0f / (float)(y->fan_in + y->fan_out));
    size_t base = sharded_opt ? y->shard * (size_t)g_rank : 0;
    size_t nw = (size_t)y->fan_out * y->fan_in;
    for (size_t i = 0; i < no; i++) {
      size_t gi = base + i;
      y->master[i] = gi < nw ? a * urand(o.seed, 1000 + (uint64_t)l, gi) : 0.f;
    }
    void *shard;
    ZCALL(zpp_pgroup_shard(y->pg, &shard));
    if (!sharded_param) {
      y->wfull = xcalloc(y->padded, 2);
      state_bytes += 2 * y->padded;
      /* The group's shard is my slice of the full copy: the in-place
       * all-gather refreshes the full copy after the optimizer step. */
      ZCALL(zpp_pgroup_attach(y->pg, y->wfull + y->shard * (size_t)g_rank,
                              y->wfull, NULL));
      for (size_t i = 0; i < y->padded; i++) {
        size_t gi = i;
        y->wfull[i] = tobf(gi < nw ? a * urand(o.seed, 1000 + (uint64_t)l, gi)
                                   : 0.f);
      }
    } else {
      uint16_t *s = shard;
      for (size_t i = 0; i < y->shard; i++)
        s[i] = tobf(y->master[i]);
      state_bytes += 2 * y->shard; /* the group's bf16 shard */
    }
    if (!sharded_grad) {
      y->gfull = xcalloc(y->padded, 2);
      state_bytes += 2 * y->padded;
      y->gshard = xcalloc(y->shard, 2);
      buf_bytes_gshard += 2 * y->shard; /* reduce-scatter output, consumed
                                           by the all-gather / Adam */
    } else {
      y->gfull = gbuf[(L - 1 - l) % ngbuf]; /* backward order: in turns */
      y->gshard = xcalloc(y->shard, 2);
      state_bytes += 2 * y->shard;
    }
  }

  /* ---- activations (per rank, fp32) ---- */
  int maxd = o.width > o.in_dim ? o.width : o.in_dim;
  if (o.out_dim > maxd)
    maxd = o.out_dim;
  float **act = xcalloc((size_t)L + 1, sizeof(float *));
  for (int l = 0; l <= L; l++)
    act[l] = xcalloc((size_t)bl * maxd, 4);
  float *dcur = xcalloc((size_t)bl * maxd, 4), *dprev = xcalloc((size_t)bl * maxd, 4);
  /* the forward's input, transposed: [fan_in][ns] (tools/train_math.h) */
  size_t ns = train_lanes(bl);
  float *xt = xcalloc((size_t)maxd * ns, 4);
  /* the teacher's weights, out x in floats (256 bytes by default), drawn
   * once instead of per sample */
  float *teacher = xcalloc((size_t)o.out_dim * o.in_dim, 4);
  for (size_t j = 0; j < (size_t)o.out_dim * o.in_dim; j++)
    teacher[j] = urand(o.seed, 3, j);

  zpp_comm_stats_t s0 = ZPP_COMM_STATS_INIT, s1 = ZPP_COMM_STATS_INIT;
  ZCALL(zpp_comm_reset_stats(comm));
  double final_loss = 0, tail_sum = 0, first_loss = 0, floor_tail_sum = 0;
  double floor_loss = 0; /* this step's loss of the teacher (--label-noise) */
  int tail_n = 0;
  uint64_t tot_inter = 0, tot_intra = 0;
  uint64_t *all_stats = xcalloc(2 * (size_t)W, 8);
  size_t peak_full = 0, hpz_bytes = 0, resid_bytes = 0;
  size_t resid_fp32_bytes = 0, qwd_scratch = 0;
  double *losses = xcalloc(2 * (size_t)W, sizeof(double));
  uint64_t loss_hash = 1469598103934665603ull; /* every step's loss, bitwise */

  if (g_rank == 0 && !o.quiet)
    printf("# %s: %d ranks on %d nodes, %d layers, %zu parameters (%zu padded"
           "), global batch %d\n",
           mode_names[mode], W, nnodes, L, psi_real, psi, o.batch);

  /* Step time: from a barrier to the end of the optimizer step on the
   * slowest rank (MPI_Wtime, max over ranks); the first step warms caches
   * and allocators, so the mean leaves it out when there are more. */
  double time_sum = 0.0, time_first = 0.0;
  /* Where a step goes, this rank's sums over steps 2.. (the first when
   * there is one step): forward (data, forward, loss), backward, drain
   * (waiting for the last reductions), optimizer; and of those the time
   * blocked in zpp waits for parameters (forward, backward) and for
   * gradient reductions (backward and drain) */
  enum { PH_FWD, PH_BWD, PH_DRAIN, PH_OPT, PH_WAIT_FWD, PH_WAIT_BWD,
         PH_WAIT_BWD_PARAMS, PH_N };
  double ph[PH_N] = {0};
  /* --survive: the failure, the loss of every completed step */
  double t_last_ok = wtime();
  double *loss_curve = xcalloc((size_t)o.steps, sizeof(double));
  zpp_status_t fail_st = ZPP_OK;
  char fail_msg[512] = "";
  int failure_step = -1, world_before = W;
  double surv_t[4] = {0, 0, 0, 0}; /* detect, shrink, recover, cleanup (s) */
  uint64_t surv_rebuilt = 0, surv_state_lost = 0;
  int surv_exact = 1;
  for (int step = 1; step <= o.steps; step++) {
    double tp[PH_N] = {0}, tw;
    /* the optimizer has updated the parameters: a later failure of this
     * step's own exchanges is recovered from without redoing the step */
    int opt_done = 0;
    if (g_survive) { /* a barrier */
      char b0 = 0, *bs = xcalloc((size_t)W, 1);
      zpp_status_t bst = xallgather(&b0, 1, bs);
      free_after(bst, bs);
      SCALL(bst);
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
    }
    double t_step = wtime();
    SCALL(zpp_comm_get_stats(comm, &s0));
    const uint64_t aux0_inter = g_aux_inter, aux0_intra = g_aux_intra;
    /* data: sample j of the global batch of this step; teacher targets */
    int sample0 = g_rank * bl;
    for (int b = 0; b < bl; b++)
      for (int i = 0; i < o.in_dim; i++)
        act[0][(size_t)b * maxd + i] =
            urand(o.seed, 2, ((uint64_t)step << 32) ^
                                 ((uint64_t)(sample0 + b) * o.in_dim + i));
    /* ---- forward ---- */
    /* parameters fetched fwd_prefetch layers ahead of their use */
    const int DF = o.fwd_prefetch;
    size_t full_live = 0;
    if (sharded_param)
      for (int k = 0; k < DF && k < L; k++) {
        SCALL(zpp_pgroup_fetch(ly[k].pg, ZPP_FETCH_FORWARD, NULL));
        full_live += ly[k].padded * 2;
      }
    for (int l = 0; l < L; l++) {
      layer_t *y = &ly[l];
      const uint16_t *w = y->wfull;
      if (sharded_param) {
        void *full;
        if (l + DF < L) { /* prefetch DF layers ahead */
          SCALL(zpp_pgroup_fetch(ly[l + DF].pg, ZPP_FETCH_FORWARD, NULL));
          full_live += ly[l + DF].padded * 2;
        }
        if (full_live > peak_full)
          peak_full = full_live;
        tw = wtime();
        SCALL(zpp_pgroup_wait(y->pg, &full));
        tp[PH_WAIT_FWD] += wtime() - tw;
        w = full;
      }
      const uint16_t *bias = w + (size_t)y->fan_out * y->fan_in;
      train_transpose(act[l], (size_t)maxd, bl, y->fan_in, ns, xt);
      train_forward(w, bias, y->fan_out, y->fan_in, xt, ns, bl, act[l + 1],
                    (size_t)maxd);
      if (l != L - 1)
        for (int b = 0; b < bl; b++)
          for (int k = 0; k < y->fan_out; k++) {
            float *z = &act[l + 1][(size_t)b * maxd + k];
            *z = tanhf(*z);
          }
      if (sharded_param) {
        SCALL(zpp_pgroup_release(y->pg));
        full_live -= y->padded * 2;
      }
    }
    /* ---- loss: mean over samples and outputs of (y - t)^2 ---- */
    double lsum = 0, fsum = 0;
    for (int b = 0; b < bl; b++) {
      const float *x = act[0] + (size_t)b * maxd;
      const float *yv = act[L] + (size_t)b * maxd;
      for (int k = 0; k < o.out_dim; k++) {
        float t = 0;
        for (int i = 0; i < o.in_dim; i++)
          t += teacher[(size_t)k * o.in_dim + i] * x[i];
        t = tanhf(t);
        if (o.label_noise > 0.0f) {
          /* noise of this step's sample, the same in every mode */
          float nz = o.label_noise *
                     nrand(o.seed, 4, ((uint64_t)step << 32) ^
                                          ((uint64_t)(sample0 + b) * o.out_dim + k));
          t += nz;
          fsum += (double)nz * nz; /* the teacher's own loss */
        }
        float e = yv[k] - t;
        lsum += (double)e * e;
        dcur[(size_t)b * maxd + k] = 2.0f * e / (float)(bl * o.out_dim);
      }
    }
    double lloc[2] = {lsum / (bl * o.out_dim), fsum / (bl * o.out_dim)};
    SCALL(xallgather(lloc, sizeof lloc, losses));
    double loss = 0;
    floor_loss = 0;
    for (int r = 0; r < W; r++) { /* rank order: the same on every rank */
      loss += losses[2 * r];
      floor_loss += losses[2 * r + 1];
    }
    loss /= W;
    floor_loss /= W;
    double t_phase = wtime();
    tp[PH_FWD] = t_phase - t_step;
    /* the last exchange the killed rank takes part in */
    t_last_ok = t_phase;
    if (world_rank == o.kill_rank && step == o.kill_step && !o.kill_late) {
      fflush(stdout);
      fflush(stderr);
      raise(SIGKILL);
    }

    /* ---- backward ---- */
    /* parameters fetched bwd_prefetch layers ahead of their use */
    const int D = o.bwd_prefetch;
    full_live = 0;
    if (sharded_param)
      for (int k = 1; k <= D && L - k >= 0; k++) {
        SCALL(zpp_pgroup_fetch(ly[L - k].pg, ZPP_FETCH_BACKWARD, NULL));
        full_live += ly[L - k].padded * 2;
      }
    for (int l = L - 1; l >= 0; l--) {
      layer_t *y = &ly[l];
      const uint16_t *w = y->wfull;
      if (sharded_param) {
        void *full;
        if (l - D >= 0) {
          SCALL(zpp_pgroup_fetch(ly[l - D].pg, ZPP_FETCH_BACKWARD, NULL));
          full_live += ly[l - D].padded * 2;
        }
        if (full_live > peak_full)
          peak_full = full_live;
        tw = wtime();
        SCALL(zpp_pgroup_wait(y->pg, &full));
        tw = wtime() - tw;
        tp[PH_WAIT_BWD] += tw;
        tp[PH_WAIT_BWD_PARAMS] += tw;
        w = full;
      }
      /* dcur holds dLoss/d(output of layer l) pre-activation for the last
       * layer; for tanh layers convert through the derivative */
      if (l != L - 1)
        for (int b = 0; b < bl; b++)
          for (int k = 0; k < y->fan_out; k++) {
            float a = act[l + 1][(size_t)b * maxd + k];
            dcur[(size_t)b * maxd + k] *= 1.0f - a * a;
          }
      /* samples in order (tools/train_math.h): deterministic */
      if (l > 0)
        train_input_grad(w, y->fan_out, y->fan_in, dcur, (size_t)maxd, bl,
                         dprev, (size_t)maxd);
      if (sharded_param) {
        SCALL(zpp_pgroup_release(y->pg));
        full_live -= y->padded * 2;
      }
      /* Overlapped: the reduction two layers back read the buffer the
       * gradient goes to (zero2/3) */
      if (sharded_grad && o.overlap && l + 2 < L && rs_req[l + 2] != NULL) {
        tw = wtime();
        SCALL(zpp_request_wait(rs_req[l + 2]));
        tp[PH_WAIT_BWD] += wtime() - tw;
        rs_req[l + 2] = NULL;
      }
      /* the bf16 gradient, padded tail zero (the buffer is shared by
       * layers of other sizes) */
      train_weight_grad(dcur, (size_t)maxd, act[l], (size_t)maxd, bl,
                        y->fan_out, y->fan_in, y->gfull,
                        y->gfull + (size_t)y->fan_out * y->fan_in);
      memset(y->gfull + y->n, 0, (y->padded - y->n) * 2);
      float *t = dcur;
      dcur = dprev;
      dprev = t;
      /* reduced into its owner's shard: the same call in every
       * non-quantized mode */
      SCALL(zpp_pgroup_reduce_gradients(y->pg, y->gfull, y->gshard,
                                        ZPP_OP_MEAN, NULL,
                                        o.overlap ? &rs_req[l] : NULL));
      if (mode == M_DP) /* all-reduce = reduce-scatter + all-gather */
        SCALL(zpp_allgather(comm, y->gshard, y->gfull, y->shard,
                            ZPP_BFLOAT16, NULL,
                            o.overlap ? &ag_req[l] : NULL));
    }
    /* one clock reading ends a phase and starts the next: the phases
     * partition the step, no time between them left out */
    double t_now = wtime();
    tp[PH_BWD] = t_now - t_phase;
    t_phase = t_now;
    /* every reduction done before the optimizer reads the gradients (in
     * start order: the engine completes them in that order anyway) */
    for (int l = L - 1; l >= 0; l--) {
      if (rs_req[l] != NULL)
        SCALL(zpp_request_wait(rs_req[l]));
      if (ag_req[l] != NULL)
        SCALL(zpp_request_wait(ag_req[l]));
      rs_req[l] = ag_req[l] = NULL;
    }

    t_now = wtime();
    tp[PH_DRAIN] = t_now - t_phase;
    t_phase = t_now;
    /* ---- optimizer ---- */
    opt_done = 1;
    float bc1 = 1.0f - powf(0.9f, (float)step);
    float bc2 = 1.0f - powf(0.999f, (float)step);
    for (int l = 0; l < L; l++) {
      layer_t *y = &ly[l];
      if (mode == M_DP) {
        for (size_t i = 0; i < y->padded; i++) {
          adam(&y->master[i], &y->m[i], &y->v[i], bf(y->gfull[i]), o.lr, bc1,
               bc2);
          y->wfull[i] = tobf(y->master[i]);
        }
        continue;
      }
      void *shard;
      SCALL(zpp_pgroup_shard(y->pg, &shard));
      uint16_t *s = shard;
      /* elements whose state a recovery lost restarted Adam at rstep[i] */
      int rs = 1;
      float c1 = bc1, c2 = bc2;
      for (size_t i = 0; i < y->shard; i++) {
        if (y->rstep && y->rstep[i] != rs) {
          rs = y->rstep[i];
          c1 = 1.0f - powf(0.9f, (float)(step - rs + 1));
          c2 = 1.0f - powf(0.999f, (float)(step - rs + 1));
        }
        adam(&y->master[i], &y->m[i], &y->v[i], bf(y->gshard[i]), o.lr, c1, c2);
        /* qWD: my slice of the full copy is the reconstruction, the same
         * on every rank; only the update below may write it */
        if (!y->cfg.qwd_bits)
          s[i] = tobf(y->master[i]);
      }
      /* no failure handling between the writes and this call: a local
       * error, not a recoverable one */
      ZCALL(zpp_pgroup_params_changed(y->pg));
    }
    if (mode == M_ZERO1 || mode == M_ZERO2) /* refresh the full copies */
    {
      for (int l = 0; l < L; l++) /* all started, then all waited for */
        if (ly[l].cfg.qwd_bits)
          SCALL(zpp_pgroup_update_params(ly[l].pg, ly[l].master, NULL));
        else
          SCALL(zpp_pgroup_fetch(ly[l].pg, ZPP_FETCH_FORWARD, NULL));
      for (int l = 0; l < L; l++)
        SCALL(zpp_pgroup_wait(ly[l].pg, NULL));
    }

    if (world_rank == o.kill_rank && step == o.kill_step && o.kill_late) {
      fflush(stdout);
      fflush(stderr);
      raise(SIGKILL);
    }

    /* the step is done (a failure before the optimizer redoes it) */
    final_loss = loss;
    loss_hash = fnv(loss_hash, &loss, sizeof loss);
    loss_curve[step - 1] = loss;
    if (step == 1)
      first_loss = loss;
    if (step > o.steps - 10) /* the last 10 steps: less minibatch noise */
      tail_sum += loss, floor_tail_sum += floor_loss, tail_n++;

    t_now = wtime();
    tp[PH_OPT] = t_now - t_phase;
    t_step = t_now - t_step;
    if (step > 1 || o.steps == 1)
      for (int k = 0; k < PH_N; k++)
        ph[k] += tp[k];
    double t_max = t_step;
    SCALL(xmax(&t_max, 1));
    if (step == 1)
      time_first = t_max;
    else
      time_sum += t_max;

    SCALL(zpp_comm_get_stats(comm, &s1));
    /* less the trainer's own exchanges (--survive) */
    uint64_t mine[2] = {s1.inter_bytes_sent - s0.inter_bytes_sent -
                            (g_aux_inter - aux0_inter),
                        s1.intra_bytes_sent - s0.intra_bytes_sent -
                            (g_aux_intra - aux0_intra)};
    tot_inter += mine[0];
    tot_intra += mine[1];
    SCALL(xallgather(mine, sizeof mine, all_stats));
    if (g_rank == 0 && !o.quiet) {
      printf("step %3d loss %.6f  time %.4f s  bytes sent intra/inter per "
             "rank:",
             step, loss, t_max);
      for (int r = 0; r < W; r++)
        printf(" r%d %llu/%llu", r, (unsigned long long)all_stats[2 * r + 1],
               (unsigned long long)all_stats[2 * r]);
      if (o.label_noise > 0.0f) /* the floor of this step's batch */
        printf("  floor %.6f", floor_loss);
      printf("\n");
      fflush(stdout);
    }
    continue;
  failed:;
    /* --survive: a rank died during this step.  Shrink to the survivors,
     * rebuild every group from hpZ's copies (zpp_pgroup_recover), move the
     * optimizer state, and redo the step (docs/runtime.md, "Recovery") */
    {
      double t_fail = wtime();
      fprintf(stderr, PROG ": rank %d: step %d: %s: %s\n", g_rank, step,
              zpp_status_string(fail_st), fail_msg);
      int *map = xcalloc((size_t)W, sizeof(int));
      zpp_comm_t nc = NULL;
      ZCALL(zpp_comm_shrink(comm, NULL, map, &nc));
      double t_shrunk = wtime();
      for (int l = 0; l < L; l++) { /* the failed step's requests */
        if (rs_req[l] != NULL)
          (void)zpp_request_wait(rs_req[l]);
        if (ag_req[l] != NULL)
          (void)zpp_request_wait(ag_req[l]);
        rs_req[l] = ag_req[l] = NULL;
      }
      int new_rank = 0, new_size = 0;
      ZCALL(zpp_comm_rank(nc, &new_rank));
      ZCALL(zpp_comm_size(nc, &new_size));
      if (new_size >= W) /* nothing to recover from: the error is the
                            failure (redoing the step would meet it again) */
        DIE("step %d: %s: %s (no rank was lost)", step,
            zpp_status_string(fail_st), fail_msg);
      if (o.batch % new_size)
        DIE("--batch %d: not a multiple of the %d survivors (choose a batch "
            "both rank counts divide)",
            o.batch, new_size);
      psi = 0;
      max_padded = 0;
      for (int l = 0; l < L; l++) {
        layer_t *y = &ly[l];
        zpp_pgroup_t ng = NULL;
        zpp_pgroup_recovery_t rep = ZPP_PGROUP_RECOVERY_INIT;
        ZCALL(zpp_pgroup_recover(y->pg, nc, map, &ng, &rep));
        zpp_pgroup_info_t pi = ZPP_PGROUP_INFO_INIT;
        ZCALL(zpp_pgroup_get_info(ng, &pi));
        float *nm = xcalloc(pi.shard_numel, 4), *nm1 = xcalloc(pi.shard_numel, 4),
              *nv = xcalloc(pi.shard_numel, 4);
        ZCALL(zpp_pgroup_recover_state(ng, y->master, nm, 4));
        ZCALL(zpp_pgroup_recover_state(ng, y->m, nm1, 4));
        ZCALL(zpp_pgroup_recover_state(ng, y->v, nv, 4));
        /* each element's restart step moves with it; the lost ones (and
         * the padding) come zero and restart Adam's moments and bias
         * correction at the next step run: this one redone, or the one
         * after when the optimizer has run */
        int *ors = xcalloc(y->shard, sizeof(int));
        int *nrs = xcalloc(pi.shard_numel, sizeof(int));
        for (size_t i = 0; i < y->shard; i++)
          ors[i] = y->rstep ? y->rstep[i] : 1;
        ZCALL(zpp_pgroup_recover_state(ng, ors, nrs, sizeof(int)));
        free(ors);
        for (size_t i = 0; i < pi.shard_numel; i++) /* lost, padding */
          if (nrs[i] == 0)
            nrs[i] = opt_done ? step + 1 : step;
        free(y->rstep);
        y->rstep = nrs;
        /* the lost elements: master = the rebuilt bf16 weight, moments
         * zero (recover_state) */
        uint16_t *ws;
        ZCALL(zpp_pgroup_shard(ng, (void **)&ws));
        for (int k = 0; k < rep.lost_ranks; k++) {
          size_t b, e, lo = pi.shard_offset, hi = lo + pi.shard_numel;
          ZCALL(zpp_pgroup_lost(ng, k, NULL, NULL, &b, &e));
          if (b < lo)
            b = lo;
          if (e > hi)
            e = hi;
          if (b >= e)
            continue;
          for (size_t i = b - lo; i < e - lo; i++)
            nm[i] = bf(ws[i]);
        }
        free(y->master);
        free(y->m);
        free(y->v);
        y->master = nm;
        y->m = nm1;
        y->v = nv;
        ZCALL(zpp_pgroup_destroy(y->pg));
        y->pg = ng;
        state_bytes = state_bytes - 16 * y->shard + 16 * pi.shard_numel;
        y->shard = pi.shard_numel;
        y->padded = pi.padded_numel;
        free_after(ZPP_ERR_INTERNAL, y->gshard); /* after comm's destroy */
        y->gshard = xcalloc(y->shard, 2);
        psi += y->padded;
        if (y->padded > max_padded)
          max_padded = y->padded;
        surv_rebuilt += rep.rebuilt_numel;
        surv_state_lost += rep.state_lost_numel;
        surv_exact &= rep.exact;
      }
      double t_groups = wtime();
      ZCALL(zpp_comm_destroy(comm));
      free_deferred();
      comm = g_comm = nc;
      world_before = W;
      W = g_size = new_size;
      g_rank = new_rank;
      ZCALL(zpp_comm_nnodes(comm, &nnodes));
      /* buffers sized by the ranks, the samples per rank or the layers */
      bl = o.batch / W;
      ns = train_lanes(bl);
      for (int l = 0; l <= L; l++) {
        free(act[l]);
        act[l] = xcalloc((size_t)bl * maxd, 4);
      }
      free(dcur);
      free(dprev);
      free(xt);
      dcur = xcalloc((size_t)bl * maxd, 4);
      dprev = xcalloc((size_t)bl * maxd, 4);
      xt = xcalloc((size_t)maxd * ns, 4);
      for (int b = 0; b < ngbuf; b++) {
        free(gbuf[b]);
        gbuf[b] = xcalloc(max_padded, 2);
      }
      buf_bytes_grad = (size_t)ngbuf * max_padded * 2;
      for (int l = 0; l < L; l++)
        ly[l].gfull = gbuf[(L - 1 - l) % ngbuf];
      free(all_stats);
      free(losses);
      all_stats = xcalloc(2 * (size_t)W, 8);
      losses = xcalloc(2 * (size_t)W, sizeof(double));
      double t_rec = wtime();
      surv_t[0] = t_fail - t_last_ok;
      surv_t[1] = t_shrunk - t_fail;
      surv_t[2] = t_groups - t_shrunk;
      surv_t[3] = t_rec - t_groups;
      ZCALL(xmax(surv_t, 4));
      failure_step = step;
      if (g_rank == 0 && !o.quiet) {
        printf("# step %d: a rank died; %d -> %d ranks; failure seen %.3f s, "
               "shrunk in %.3f s, groups recovered in %.3f s, old "
               "communicator destroyed in %.3f s (slowest survivor); %llu "
               "elements rebuilt from hpZ copies (%s)\n",
               step, world_before, W, surv_t[0], surv_t[1], surv_t[2],
               surv_t[3],
               (unsigned long long)surv_rebuilt,
               surv_exact ? "exact" : "within qwZ's bound");
        fflush(stdout);
      }
      free(map);
      if (!opt_done)
        step--; /* redo it on the survivors */
    }
  }
  for (int l = 0; l < L; l++) {
    zpp_pgroup_info_t pi = ZPP_PGROUP_INFO_INIT;
    ZCALL(zpp_pgroup_get_info(ly[l].pg, &pi));
    hpz_bytes += pi.hpz_bytes;
    resid_bytes += pi.residual_bytes;
    /* what an fp32 residual would hold (the INT8 one saves the rest) */
    if (ly[l].cfg.error_feedback) { /* the layer's config, fp32 storage */
      zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
      size_t rb = 0;
      q.inter_bits = ly[l].cfg.qgz_bits;
      q.intra_bits = ly[l].cfg.qgz_intra_bits ? ly[l].cfg.qgz_intra_bits
                                              : ly[l].cfg.qgz_bits;
      q.block_size = ly[l].cfg.qgz_block;
      ZCALL(zpp_qgz_residual_bytes(comm, &q, ly[l].shard, &rb));
      resid_fp32_bytes += rb;
    }
    /* qWD: nothing kept beyond the full parameters these modes hold; per
     * update the encoded differences of all ranks and one fp32 shard */
    if (ly[l].cfg.qwd_bits) {
      zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
      size_t e = 0;
      q.bits = ly[l].cfg.qwd_bits;
      q.block_size = ly[l].cfg.qwd_block;
      ZCALL(zpp_quant_encoded_size(&q, ly[l].shard, &e));
      size_t scratch = (size_t)W * e + 4 * ly[l].shard;
      if (scratch > qwd_scratch)
        qwd_scratch = scratch;
    }
  }

  /* ---- checksum of the final fp32 master parameters (real elements) ---- */
  uint64_t h = 1469598103934665603ull;
  for (int l = 0; l < L; l++) {
    layer_t *y = &ly[l];
    float *full = y->master;
    float *tmp = NULL;
    if (sharded_opt) {
      tmp = xcalloc(y->padded, 4);
      ZCALL(xallgather(y->master, y->shard * 4, tmp));
      full = tmp;
    }
    h = fnv(h, full, y->n * 4);
    free(tmp);
  }
  uint64_t hmin, hmax;
  ZCALL(xminmax_u64(h, &hmin, &hmax));
  if (hmin != hmax)
    DIE("param_checksum differs between ranks");

  /* every rebuilt element lost its state on exactly one survivor */
  uint64_t surv_state_lost_all = 0;
  {
    uint64_t *all = xcalloc((size_t)W, 8);
    ZCALL(xallgather(&surv_state_lost, 8, all));
    for (int r = 0; r < W; r++)
      surv_state_lost_all += all[r];
    free(all);
  }
  uint64_t pr_inter[2] = {tot_inter, tot_intra};
  uint64_t *tots = xcalloc(2 * (size_t)W, 8);
  ZCALL(xallgather(pr_inter, sizeof pr_inter, tots));
  double phmax[PH_N];
  memcpy(phmax, ph, sizeof ph);
  ZCALL(xmax(phmax, PH_N));
  uint64_t sbmin64, sbmax64;
  ZCALL(xminmax_u64(state_bytes, &sbmin64, &sbmax64));
  unsigned long long sb = state_bytes, sbmin = sbmin64, sbmax = sbmax64;

  if (g_rank == 0) {
    int steps = o.steps > 0 ? o.steps : 1;
    uint64_t wi = 0, wa = 0;
    for (int r = 0; r < W; r++) {
      wi += tots[2 * r];
      wa += tots[2 * r + 1];
    }
    if (!o.quiet || !o.json)
      printf("# final loss %.9g  param_checksum %016llx  model state %llu "
             "bytes/rank  inter %.0f intra %.0f bytes/step (all ranks)\n",
             final_loss, (unsigned long long)h, sb, (double)wi / steps,
             (double)wa / steps);
    if (o.json) {
      printf("{\"mode\": \"%s\", \"world_size\": %d, \"nodes\": %d, "
             "\"steps\": %d, \"final_loss\": %.9g, "
             "\"param_checksum\": \"%016llx\", \"loss_last10\": %.9g, "
             "\"first_loss\": %.9g, \"loss_curve_checksum\": \"%016llx\", "
             "\"overlap\": %d, \"label_noise\": %.9g, \"loss_floor\": %.9g, "
             "\"floor_last10\": %.9g, ",
             mode_names[mode], W, nnodes, o.steps, final_loss,
             (unsigned long long)h, tail_n ? tail_sum / tail_n : final_loss,
             first_loss, (unsigned long long)loss_hash, o.overlap,
             (double)o.label_noise, (double)o.label_noise * o.label_noise,
             tail_n ? floor_tail_sum / tail_n : floor_loss);
      printf("\"inter_bytes_per_step\": %.17g, \"intra_bytes_per_step\": "
             "%.17g, ",
             (double)wi / steps, (double)wa / steps);
      printf("\"step_time_s\": %.9g, \"first_step_time_s\": %.9g, ",
             o.steps > 1 ? time_sum / (o.steps - 1) : time_first, time_first);
      {
        double n = o.steps > 1 ? o.steps - 1 : 1;
        printf("\"phase_s\": {\"forward\": %.6g, \"backward\": %.6g, "
               "\"drain\": %.6g, \"optimizer\": %.6g, "
               "\"wait_params_forward\": %.6g, \"wait_backward\": %.6g, "
               "\"wait_params_backward\": %.6g}, ",
               phmax[PH_FWD] / n, phmax[PH_BWD] / n, phmax[PH_DRAIN] / n,
               phmax[PH_OPT] / n, phmax[PH_WAIT_FWD] / n,
               phmax[PH_WAIT_BWD] / n, phmax[PH_WAIT_BWD_PARAMS] / n);
      }
      printf("\"inter_bytes_per_step_per_rank\": [");
      for (int r = 0; r < W; r++)
        printf("%s%.17g", r ? ", " : "", (double)tots[2 * r] / steps);
      printf("], \"intra_bytes_per_step_per_rank\": [");
      for (int r = 0; r < W; r++)
        printf("%s%.17g", r ? ", " : "", (double)tots[2 * r + 1] / steps);
      printf("], \"model_state_bytes\": %llu, \"model_state_bytes_max\": %llu, "
             "\"psi\": %zu, \"psi_real\": %zu, \"shards\": [",
             sbmin, sbmax, psi, psi_real);
      for (int l = 0; l < L; l++)
        printf("%s%zu", l ? ", " : "", ly[l].shard);
      printf("], \"buffers\": {\"gathered_params_peak\": %zu, "
             "\"grad_full_buffers\": %zu, \"grad_shard_reduce_out\": %zu, "
             "\"hpz_secondary\": %zu, \"qgz_residual\": %zu, "
             "\"qgz_residual_fp32\": %zu, \"qwd_scratch_peak\": %zu, "
             "\"padding_elems\": %zu}, ",
             peak_full, buf_bytes_grad, buf_bytes_gshard, hpz_bytes,
             resid_bytes, resid_fp32_bytes, qwd_scratch, psi - psi_real);
      const zpp_pgroup_config_t *c0 = &ly[0].cfg;
      printf("\"qwz_bits\": %d, \"hpz\": %d, \"qgz_bits\": %d, "
             "\"qgz_intra_bits\": %d, \"error_feedback\": %d, \"block\": %zu, "
             "\"qwz_block\": %zu, \"qwd_bits\": %d, \"qwd_block\": %zu, "
             "\"hadamard\": %zu, \"stochastic_rounding\": %d, "
             "\"ef_bits\": %d, \"ef_beta\": %g, \"ef_reset\": %u, "
             "\"seed\": %llu",
             c0->qwz_bits, c0->hpz, c0->qgz_bits,
             c0->qgz_bits ? c0->qgz_intra_bits : 0, c0->error_feedback,
             o.block, c0->qwz_bits ? c0->qwz_block : 0, c0->qwd_bits,
             c0->qwd_bits ? c0->qwd_block : 0, c0->qgz_hadamard,
             c0->rounding == ZPP_ROUND_STOCHASTIC,
             c0->error_feedback ? c0->error_feedback_bits : 0,
             c0->error_feedback ? (double)c0->error_feedback_beta : 0.0,
             c0->error_feedback ? c0->error_feedback_reset : 0u,
             (unsigned long long)o.seed);
      if (o.survive) {
        printf(", \"survive\": {\"kill_rank\": %d, \"kill_step\": %d, "
               "\"failure_step\": %d, \"world_size_before\": %d, "
               "\"world_size_after\": %d, \"detect_s\": %.6f, "
               "\"shrink_s\": %.6f, \"recover_s\": %.6f, \"cleanup_s\": %.6f, "
               "\"rebuilt_elements\": %llu, \"state_lost_elements\": %llu, "
               "\"rebuilt_exact\": %d}, \"loss_curve\": [",
               o.kill_rank, o.kill_step, failure_step, world_before, W,
               surv_t[0], surv_t[1], surv_t[2], surv_t[3],
               (unsigned long long)surv_rebuilt,
               (unsigned long long)surv_state_lost_all, surv_exact);
        for (int k = 0; k < o.steps; k++)
          printf("%s%.9g", k ? ", " : "", loss_curve[k]);
        printf("]");
      }
      printf("}\n");
    }
    fflush(stdout);
  }

  for (int l = 0; l < L; l++) {
    ZCALL(zpp_pgroup_destroy(ly[l].pg));
    free(ly[l].master);
    free(ly[l].m);
    free(ly[l].rstep);
    free(ly[l].v);
    free(ly[l].wfull);
    if (!sharded_grad)
      free(ly[l].gfull);
    free(ly[l].gshard);
  }
  for (int l = 0; l <= L; l++)
    free(act[l]);
  free(act);
  free(ly);
  free(gbuf[0]);
  free(gbuf[1]);
  free(rs_req);
  free(ag_req);
  free(dcur);
  free(dprev);
  free(xt);
  free(teacher);
  free(all_stats);
  free(tots);
  free(losses);
  free(loss_curve);
  ZCALL(zpp_comm_destroy(comm));
  if (failure_step >= 0) { /* MPI_COMM_WORLD lost a rank: no MPI call */
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  MPI_Finalize();
  return 0;
}
