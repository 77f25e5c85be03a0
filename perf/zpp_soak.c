/*
 * zpp-soak: a long run of the three ZeRO++ collectives, watching the
 * process for growth (perf/soak.sh drives it; docs/bench/robustness.md).
 *
 * Every iteration, on host memory and `count` fp32 elements per rank:
 *   qwZ   zpp_qwz_allgather (INT8, block 256);
 *   hpZ   zpp_hpz_forward_gather, zpp_hpz_backward_gather (from the
 *         secondary copy), zpp_hpz_invalidate (the "optimizer step");
 *   qgZ   zpp_qgz_reduce_scatter (INT4 both stages, MEAN) with error
 *         feedback (an fp32 residual carried from step to step).
 * qwZ is a blocking call (run inline); the hpZ gathers and qgZ are started
 * with requests (run by the communicator's engine thread) and waited for
 * (with MPI_THREAD_MULTIPLE; otherwise they complete inline).
 * Data change every iteration (a deterministic function of seed, rank and
 * iteration).  Every `check` iterations the results are verified: qwZ and
 * both hpZ gathers must equal, bit for bit, what zpp_quant_encode +
 * zpp_quant_decode give for every rank's shard computed locally, and qgZ's
 * output must be finite.  A wrong result fails the run.
 *
 * Sampled every `sample` iterations (and after the last): this process's
 * RSS (VmRSS) and thread count (/proc/self/status), its open file
 * descriptors (/proc/self/fd), the bytes in the engine's host scratch
 * cache, and malloc's bytes in use (mallinfo2).  After zpp_hpz_destroy and
 * zpp_comm_destroy, the threads, descriptors and malloc'ed bytes are
 * compared with their values before the communicator was created.  A
 * first communicator runs PRE_ITERS iterations and is destroyed before
 * that: Open MPI's one-time allocations (free lists, a dup'ed
 * communicator's modules) are then made, and the difference is zpp's.
 *
 * Output (rank 0, stdout): one CSV row per sample and rank, then the
 * checks, one "soak: ..." line each; exit status 1 when one fails, 2 for
 * a bad flag.  The verdicts:
 *   rss     mean RSS of the last 10% of samples at most 1% above the
 *           first 10% (per rank; the first 10% starts after the warm-up;
 *           a fall is no failure);
 *   threads, fds: never above the value at the first sample;
 *   cache   engine scratch never above ZPP_SCRATCH_CACHE_MB;
 *   destroy threads and fds back to their values before creation, and
 *           malloc'ed bytes at most half the scratch cache held just
 *           before destroy above it (at least 32 KiB, at most 1 MiB), so
 *           that a cache destroy does not free fails the run (a line
 *           says so when the cache is too small for that: raise --count).
 *
 *   mpirun -np 8 -x ZPP_TOPO=2x4 zpp-soak --iters 10000 [--count 4096]
 *       [--sample 100] [--check 500] [--warmup 200]
 */
#include <mpi.h>
#include <zpp/zpp.h>

#include "zpp_internal/engine.h"
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <dirent.h>
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "zpp-soak"
#define PRE_ITERS 20 /* iterations of the first communicator */


typedef struct {
  long iter;
  long rss_kb, threads, fds;
  long cache_bytes;
  long heap_bytes;
} sample_t;

static int g_rank;

static void die(const char *call, zpp_status_t st) {
  fprintf(stderr, PROG ": rank %d: %s: %s: %s\n", g_rank, call,
          zpp_status_string(st), zpp_get_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define ZCALL(x)                                                               \
  do {                                                                         \
    zpp_status_t st_ = (x);                                                    \
    if (st_ != ZPP_OK)                                                         \
      die(#x, st_);                                                            \
  } while (0)

static long status_field(const char *key) {
  char line[256];
  size_t n = strlen(key);
  long v = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, key, n) == 0 && line[n] == ':') {
      v = strtol(line + n + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

static long count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  long n = 0;
  if (d == NULL)
    return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n - 1; /* the directory stream's own descriptor */
}

static long heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return (long)(mi.uordblks + mi.hblkhd);
}

static sample_t take(long iter, zpp_comm_t comm) {
  sample_t s;
  s.iter = iter;
  s.rss_kb = status_field("VmRSS");
  s.threads = status_field("Threads");
  s.fds = count_fds();
  s.cache_bytes = comm != NULL ? (long)zpp_engine_cached_bytes(comm) : 0;
  s.heap_bytes = heap_in_use();
  return s;
}

/* Element i of rank r's shard at iteration it: smooth plus a varying part. */
static float value(uint64_t seed, int r, long it, size_t i) {
  uint64_t x = seed ^ ((uint64_t)r << 48) ^ ((uint64_t)it << 20) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (float)sin(0.001 * (double)i + 0.1 * r) +
         (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5);
}

typedef struct {
  size_t count, n, ebytes;
  uint64_t seed;
  zpp_quant_config_t q;
  zpp_qgz_config_t gc;
  float *send, *gath, *back, *full, *grad, *red, *resid;
} soak_bufs_t;

/* One iteration: qwZ blocking (runs inline); hpZ and qgZ started (the
 * engine thread runs them, in submission order) and waited for: requests
 * too; then the hpZ "optimizer step". */
static void iteration(zpp_comm_t comm, zpp_hpz_t hpz, long it, soak_bufs_t *b) {
  zpp_request_t rq[3];
  size_t i;
  int k;
  for (i = 0; i < b->count; i++)
    b->send[i] = value(b->seed, g_rank, it, i);
  for (i = 0; i < b->n; i++)
    b->grad[i] = 0.01f * value(b->seed + 1, g_rank, it, i);
  ZCALL(zpp_qwz_allgather(comm, &b->q, b->send, b->gath, b->count,
                          ZPP_FLOAT32, NULL, NULL));
  ZCALL(zpp_hpz_forward_gather(hpz, b->send, b->full, NULL, &rq[0]));
  ZCALL(zpp_hpz_backward_gather(hpz, NULL, b->back, NULL, &rq[1]));
  ZCALL(zpp_qgz_reduce_scatter(comm, &b->gc, b->grad, b->red, b->count,
                               ZPP_FLOAT32, ZPP_OP_MEAN, b->resid, NULL,
                               &rq[2]));
  for (k = 0; k < 3; k++)
    ZCALL(zpp_request_wait(rq[k]));
  ZCALL(zpp_hpz_invalidate(hpz));
}

static long parse(const char *flag, const char *s) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 1) {
    fprintf(stderr, PROG ": %s %s: must be a positive integer\n", flag, s);
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  long iters = 10000, sample = 100, check = 500, warmup = 200, it;
  size_t count = 4096, i, n;
  int size, provided, a, failed = 0, r;
  zpp_comm_t comm;
  zpp_hpz_t hpz;
  zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
  soak_bufs_t b;
  float *expect;
  uint8_t *enc;
  size_t rcount;
  sample_t before, held, after, *samples, *all;
  long nsamples = 0, cap;
  double limit_mb;

  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (a = 1; a < argc; a++) {
    const char *v = a + 1 < argc ? argv[a + 1] : "";
    if (strcmp(argv[a], "--iters") == 0)
      iters = parse(argv[a], v), a++;
    else if (strcmp(argv[a], "--count") == 0)
      count = (size_t)parse(argv[a], v), a++;
    else if (strcmp(argv[a], "--sample") == 0)
      sample = parse(argv[a], v), a++;
    else if (strcmp(argv[a], "--check") == 0)
      check = parse(argv[a], v), a++;
    else if (strcmp(argv[a], "--warmup") == 0)
      warmup = parse(argv[a], v), a++;
    else {
      if (g_rank == 0)
        fprintf(stderr,
                "usage: " PROG " [--iters N] [--count C] [--sample S] "
                "[--check K] [--warmup W]\n");
      MPI_Finalize();
      return 2;
    }
  }
  if (warmup >= iters)
    warmup = iters / 10;
  cap = iters / sample + 2;
  samples = calloc((size_t)cap, sizeof *samples);
  n = (size_t)size * count;
  memset(&b, 0, sizeof b);
  b.count = count;
  b.n = n;
  b.seed = 20260511;
  b.q = (zpp_quant_config_t)ZPP_QUANT_CONFIG_INIT;
  b.gc = (zpp_qgz_config_t)ZPP_QGZ_CONFIG_INIT;
  b.send = malloc(count * sizeof(float));
  b.gath = malloc(n * sizeof(float));
  b.back = malloc(n * sizeof(float));
  b.full = malloc(n * sizeof(float));
  b.grad = malloc(n * sizeof(float));
  b.red = malloc(count * sizeof(float));
  expect = malloc(count * sizeof(float));
  if (!samples || !b.send || !b.gath || !b.back || !b.full || !b.grad ||
      !b.red || !expect) {
    fprintf(stderr, PROG ": out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ZCALL(zpp_quant_encoded_size(&b.q, count, &b.ebytes));
  enc = malloc(b.ebytes);

  /* A first communicator, one iteration, destroyed: what Open MPI
   * allocates once on first use (its free lists, the dup'ed
   * communicators' modules) is then in `before`, and the check after
   * destroy sees zpp's memory only. */
  ZCALL(zpp_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm));
  ZCALL(zpp_hpz_create(comm, &hc, count, ZPP_FLOAT32, &hpz));
  ZCALL(zpp_qgz_residual_count(comm, count, &rcount));
  b.resid = calloc(rcount, sizeof(float));
  for (it = 0; it < PRE_ITERS && it < iters; it++)
    iteration(comm, hpz, -1 - it, &b);
  ZCALL(zpp_hpz_destroy(hpz));
  ZCALL(zpp_comm_destroy(comm));
  free(b.resid);

  MPI_Barrier(MPI_COMM_WORLD);
  before = take(-1, NULL);
  ZCALL(zpp_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm));
  ZCALL(zpp_hpz_create(comm, &hc, count, ZPP_FLOAT32, &hpz));
  ZCALL(zpp_qgz_residual_count(comm, count, &rcount));
  b.resid = calloc(rcount, sizeof(float));

  for (it = 0; it < iters; it++) {
    iteration(comm, hpz, it, &b);
    if (it % check == 0 || it == iters - 1) {
      for (r = 0; r < size && !failed; r++) {
        float *x = malloc(count * sizeof(float));
        for (i = 0; i < count; i++)
          x[i] = value(b.seed, r, it, i);
        ZCALL(zpp_quant_encode(&b.q, ZPP_FLOAT32, x, count, enc, b.ebytes));
        ZCALL(zpp_quant_decode(&b.q, enc, b.ebytes, count, ZPP_FLOAT32,
                               expect));
        if (memcmp(expect, b.gath + (size_t)r * count, count * 4) != 0 ||
            memcmp(expect, b.full + (size_t)r * count, count * 4) != 0 ||
            memcmp(expect, b.back + (size_t)r * count, count * 4) != 0) {
          fprintf(stderr,
                  PROG ": rank %d: iteration %ld: the gathered shard of rank "
                  "%d differs from its local encode + decode\n",
                  g_rank, it, r);
          failed = 1;
        }
        free(x);
      }
      for (i = 0; i < count && !failed; i++)
        if (!isfinite(b.red[i])) {
          fprintf(stderr, PROG ": rank %d: iteration %ld: qgZ output %zu is "
                  "not finite\n", g_rank, it, i);
          failed = 1;
        }
    }
    if ((it % sample == 0 || it == iters - 1) && nsamples < cap)
      samples[nsamples++] = take(it, comm);
  }
  held = take(iters, comm); /* the scratch destroy must give back */
  ZCALL(zpp_hpz_destroy(hpz));
  ZCALL(zpp_comm_destroy(comm));
  free(b.resid);
  MPI_Barrier(MPI_COMM_WORLD);
  after = take(iters, NULL);

  /* every rank's samples to rank 0 (the same count on every rank) */
  all = g_rank == 0 ? malloc((size_t)size * (size_t)cap * sizeof *all) : NULL;
  MPI_Gather(samples, (int)(cap * (long)sizeof *samples), MPI_BYTE, all,
             (int)(cap * (long)sizeof *samples), MPI_BYTE, 0, MPI_COMM_WORLD);
  {
    long mine[8] = {before.threads, before.fds, before.heap_bytes,
                    after.threads,  after.fds,  after.heap_bytes, failed,
                    held.cache_bytes};
    long *ba = g_rank == 0 ? malloc((size_t)size * sizeof mine) : NULL;
    MPI_Gather(mine, 8, MPI_LONG, ba, 8, MPI_LONG, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
      long first_n, last_n, worst_growth_r = -1, t0, f0, k;
      double worst = 0.0;
      int ok_rss = 1, ok_thr = 1, ok_fd = 1, ok_cache = 1, ok_destroy = 1,
          ok_results = 1;
      long max_cache = 0, heap_delta_max = 0, tol_min = -1, blind = 0;
      const char *env = getenv("ZPP_SCRATCH_CACHE_MB");
      limit_mb = env != NULL ? atof(env) : 512.0;
      printf("rank,iter,rss_kb,threads,fds,cache_bytes,heap_bytes\n");
      for (r = 0; r < size; r++)
        for (k = 0; k < nsamples; k++) {
          sample_t *s = &all[(size_t)r * (size_t)cap + (size_t)k];
          printf("%d,%ld,%ld,%ld,%ld,%ld,%ld\n", r, s->iter, s->rss_kb,
                 s->threads, s->fds, s->cache_bytes, s->heap_bytes);
        }
      /* the samples after the warm-up; first and last 10% of them */
      for (k = 0; k < nsamples && samples[k].iter < warmup; k++) {
      }
      first_n = (nsamples - k) / 10 > 0 ? (nsamples - k) / 10 : 1;
      last_n = first_n;
      printf("soak: %d ranks, %ld iterations of qwZ + hpZ (forward, backward, "
             "invalidate) + qgZ with error feedback, %zu fp32 per rank, "
             "%ld samples per rank, warm-up %ld iterations\n",
             size, iters, count, nsamples, warmup);
      for (r = 0; r < size; r++) {
        sample_t *s = &all[(size_t)r * (size_t)cap];
        double a0 = 0, a1 = 0, growth;
        long j;
        if (ba[r * 8 + 6])
          ok_results = 0;
        for (j = 0; j < first_n; j++)
          a0 += (double)s[k + j].rss_kb / (double)first_n;
        for (j = 0; j < last_n; j++)
          a1 += (double)s[nsamples - 1 - j].rss_kb / (double)last_n;
        growth = (a1 - a0) / a0;
        if (fabs(growth) > fabs(worst) || worst_growth_r < 0) {
          worst = growth;
          worst_growth_r = r;
        }
        if (growth > 0.01)
          ok_rss = 0;
        t0 = s[0].threads;
        f0 = s[0].fds;
        for (j = 0; j < nsamples; j++) {
          if (s[j].threads > t0)
            ok_thr = 0;
          if (s[j].fds > f0)
            ok_fd = 0;
          if (s[j].cache_bytes > max_cache)
            max_cache = s[j].cache_bytes;
        }
        printf("soak: rank %d: RSS first 10%% %.0f kB, last 10%% %.0f kB "
               "(%+.3f%%); threads %ld..%ld; fds %ld..%ld\n",
               r, a0, a1, 100.0 * growth, t0, s[nsamples - 1].threads, f0,
               s[nsamples - 1].fds);
        if (ba[r * 8 + 3] != ba[r * 8 + 0] || ba[r * 8 + 4] != ba[r * 8 + 1])
          ok_destroy = 0;
        {
          /* What destroy must give back includes the scratch cache held
           * just before it (ba[7]): the tolerance stays under half of
           * it, so that a cache left behind fails; what remains of Open
           * MPI's lazy allocations after the first communicator is a few
           * KB (5 to 60 KB per rank measured here). */
          long delta = ba[r * 8 + 5] - ba[r * 8 + 2], held_b = ba[r * 8 + 7];
          long tol = held_b / 2 < (1l << 20) ? held_b / 2 : (1l << 20);
          if (tol < (32l << 10))
            tol = 32l << 10;
          if (held_b <= tol)
            blind = 1;
          if (delta > heap_delta_max)
            heap_delta_max = delta;
          if (tol_min < 0 || tol < tol_min)
            tol_min = tol;
          if (delta > tol)
            ok_destroy = 0;
          printf("soak: rank %d: before create / after destroy: threads %ld "
                 "/ %ld, fds %ld / %ld, malloc'ed bytes %ld / %ld (%+ld, "
                 "limit %ld; scratch held before destroy %ld)\n",
                 r, ba[r * 8 + 0], ba[r * 8 + 3], ba[r * 8 + 1],
                 ba[r * 8 + 4], ba[r * 8 + 2], ba[r * 8 + 5], delta, tol,
                 held_b);
        }
      }
      if ((double)max_cache > limit_mb * 1048576.0)
        ok_cache = 0;
      printf("soak: results %s (checked every %ld iterations)\n",
             ok_results ? "ok" : "FAILED", check);
      printf("soak: rss %s: worst rank %ld, last 10%% vs first 10%% %+.3f%% "
             "(limit +1%%)\n",
             ok_rss ? "ok" : "FAILED", worst_growth_r, 100.0 * worst);
      printf("soak: threads %s, fds %s (never above the first sample)\n",
             ok_thr ? "ok" : "FAILED", ok_fd ? "ok" : "FAILED");
      printf("soak: cache %s: engine scratch peak %ld bytes (limit %.0f MiB)\n",
             ok_cache ? "ok" : "FAILED", max_cache, limit_mb);
      printf("soak: destroy %s: threads and fds as before creation, malloc'ed "
             "bytes at most %+ld (limit %ld: half the scratch held before "
             "destroy, within [32 KiB, 1 MiB])\n",
             ok_destroy ? "ok" : "FAILED", heap_delta_max, tol_min);
      if (blind)
        printf("soak: destroy: the scratch held before destroy is within the "
               "limit on some rank: this run cannot tell whether destroy "
               "frees it (raise --count)\n");
      if (!(ok_rss && ok_thr && ok_fd && ok_cache && ok_destroy && ok_results))
        failed = 1;
      free(ba);
      free(all);
    }
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  free(samples);
  free(b.send);
  free(b.gath);
  free(b.back);
  free(b.full);
  free(b.grad);
  free(b.red);
  free(expect);
  free(enc);
  MPI_Finalize();
  return failed ? 1 : 0;
}
