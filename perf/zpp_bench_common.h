/*
 * zpp-bench: the harness shared by the per-collective files (nccl-tests
 * style).  perf/zpp_bench.c owns the flags, the sizes loop, the timing, the
 * output formats and the checks' bookkeeping; each perf/bench_<coll>.c
 * describes one collective through a zpp_bench_coll_t: how a size becomes
 * a count, which variants exist, how one variant runs, and how a rank
 * checks its own output against a float64 reference.
 *
 * Data: element i of rank r's input is zpp_bench_value(seed, r, i, dtype),
 * a standard normal value rounded to the dtype.  It is a pure function of
 * (seed, rank, index), so every rank can regenerate any element of any
 * rank's input without communication, and a sampled check only generates
 * the elements it looks at.
 */
#ifndef ZPP_PERF_ZPP_BENCH_COMMON_H
#define ZPP_PERF_ZPP_BENCH_COMMON_H

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#include <stddef.h>
#include <stdint.h>

typedef enum {
  ZPP_BENCH_TABLE = 0,
  ZPP_BENCH_CSV = 1,
  ZPP_BENCH_JSON = 2
} zpp_bench_format_t;

typedef struct {
  size_t min_bytes, max_bytes; /* -b, -e: per-rank bytes, see coll->size_help */
  size_t factor;               /* -f */
  int iters, warmup, check;    /* -n, -w, -c */
  const char *coll;            /* --coll */
  const char *variants;        /* --variant; NULL: the collective's default */
  zpp_dtype_t dtype;           /* --dtype */
  size_t block;                /* --block: elements per quantization block */
  zpp_bench_format_t format;   /* --format */
  zpp_redop_t op;              /* --op (reducescatter) */
  zpp_memory_t memory;         /* --memory */
  zpp_backend_t backend;       /* --backend */
  uint64_t seed;               /* --seed */
  int corrupt;                 /* --corrupt: checker self-test */
  int interleave;              /* --interleave: variants round-robin */
} zpp_bench_opts_t;

/* The job as the communicator sees it. */
typedef struct {
  const zpp_bench_opts_t *opt;
  zpp_comm_t comm;
  /* The same ranks with the flat algorithms (ZPP_ALGORITHM_FLAT: ring
   * all-gather, pairwise reduce-scatter), for the "-flat" variants; NULL
   * when no variant asks for it. */
  zpp_comm_t comm_flat;
  /* The same ranks with the hierarchical algorithms (ZPP_ALGORITHM_HIER,
   * ZPP_HIER_CHUNK's chunks), for the "-hier" variants; NULL when no
   * variant asks for it. */
  zpp_comm_t comm_hier;
  /* 1 when the hierarchical algorithms can run here: a host backend,
   * several nodes and more than one rank on some node (elsewhere hier
   * falls back to the flat ones) */
  int hier_capable;
  /* 1 when comm's world all-gather and reduce-scatter run hierarchically
   * (docs/collectives.md): algorithm hier, a host backend, several nodes
   * and more than one rank on some node. */
  int hier;
  /* 1 under ZPP_ALGO=auto on a host backend: hier is then each size's
   * choice for the reduce-scatter baseline (zpp_comm_choose_algorithm) */
  int algo_auto;
  int rank, world, nnodes, uniform;
  int *node_of; /* world rank -> node index (world entries) */
  int *local_of; /* world rank -> local rank on its node (world entries) */
} zpp_bench_ctx_t;

/* A buffer in the communicator's memory space and its host mirror.  Host
 * memory: dev == host.  Device memory: dev is a cudaMalloc pointer and the
 * harness copies between the two outside the timed region. */
typedef struct {
  void *host;
  void *dev;
  size_t bytes;
} zpp_bench_buf_t;

/* One variant of a collective, parsed from a --variant token. */
typedef struct {
  char name[32];
  int baseline; /* the full-precision collective in the data dtype */
  int kind;     /* collective-specific */
  int bits;     /* quantized variants: code width (intra-node for qgZ) */
  int bits2;    /* qgZ: inter-node code width */
  int foreign;  /* 1: not zpp's (Open MPI's own collective): zpp counts
                 * none of its bytes */
  int flat;     /* runs on ctx->comm_flat (the "-flat" baselines) */
  int hier;     /* runs on ctx->comm_hier (the "-hier" baselines) */
  int peer;     /* foreign: ZPP_BENCH_PEER_* (which Open MPI selection) */
} zpp_bench_variant_t;

/* The communicator a variant runs on: the flat or hierarchical one of the
 * "-flat" / "-hier" baselines, else the job's. */
static inline zpp_comm_t zpp_bench_comm_of(const zpp_bench_ctx_t *ctx,
                                           const zpp_bench_variant_t *v) {
  return v->flat ? ctx->comm_flat : v->hier ? ctx->comm_hier : ctx->comm;
}

/* The Open MPI peers (perf/bench_mpi_peers.c): mpi, Open MPI's default
 * selection; mpi-han, the HAN component; mpi-best, the fastest algorithm
 * of the tuned component at each size. */
enum {
  ZPP_BENCH_PEER_DEFAULT = 0,
  ZPP_BENCH_PEER_HAN = 1,
  ZPP_BENCH_PEER_BEST = 2
};

/* One (size, variant) run: the harness owns in/out, the collective owns
 * state (handles, extra buffers). */
typedef struct {
  const zpp_bench_variant_t *v;
  size_t count; /* elements per rank passed to the collective */
  size_t bytes; /* the size column: see coll->size_help */
  zpp_bench_buf_t *in, *out;
  void *state;
  char label[48]; /* the row's variant name when not v->name (setup) */
} zpp_bench_case_t;

/* Result of a rank's check of its own output. */
typedef struct {
  double max_err;   /* max |out - float64 reference| over checked elements */
  uint64_t wrong;   /* checked elements outside their bound */
  uint64_t checked; /* elements looked at */
} zpp_bench_check_t;

typedef struct {
  const char *name;         /* --coll value */
  const char *size_help;    /* header line: what -b/-e and size mean */
  const char *bytes_help;   /* header line: algbw bytes and busbw factor */
  const char *variant_help; /* --help text: the variant tokens */
  const char *check_help;   /* header line: the bounds */
  /* Default --variant list for a dtype, written into buf. */
  void (*default_variants)(zpp_dtype_t dtype, char *buf, size_t len);
  /* Parses one token; 0 on success, else writes a message into err. */
  int (*parse_variant)(const char *tok, zpp_dtype_t dtype,
                       zpp_bench_variant_t *v, char *err, size_t errlen);
  /* Elements per rank for -b/-e bytes, and the size column for a count. */
  size_t (*count_of)(size_t bytes, size_t dtype_size, int world);
  size_t (*bytes_of)(size_t count, size_t dtype_size, int world);
  /* Elements of one rank's input and output buffers. */
  size_t (*in_elems)(size_t count, int world);
  size_t (*out_elems)(size_t count, int world);
  /* nccl-tests algbw bytes for the size column, and the busbw factor. */
  double (*algbw_bytes)(size_t bytes, int world);
  double (*busbw_factor)(int world);
  /* Per (size, variant); setup may call collectives (every rank calls it).
   * A failing zpp call returns its status; the harness prints
   * zpp_comm_get_last_error. */
  zpp_status_t (*setup)(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c);
  zpp_status_t (*run)(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c);
  /* Local: checks c->out->host (downloaded) after the first timed
   * iteration; may sample (zpp_bench_block_stride). */
  void (*check)(const zpp_bench_ctx_t *ctx, const zpp_bench_case_t *c,
                zpp_bench_check_t *chk);
  void (*teardown)(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c);
} zpp_bench_coll_t;

extern const zpp_bench_coll_t zpp_bench_allgather;
extern const zpp_bench_coll_t zpp_bench_reducescatter;
extern const zpp_bench_coll_t zpp_bench_hpz;

/* ---- helpers (perf/zpp_bench.c) ------------------------------------------ */

/* Element i of rank r's input: N(0, 1) rounded to dtype (never NaN/Inf). */
double zpp_bench_value(uint64_t seed, int rank, size_t i, zpp_dtype_t dtype);
/* v rounded to nearest even in dtype (fp32, fp16 or bf16), in double. */
double zpp_bench_round(double v, zpp_dtype_t dtype);
/* Element i of a dtype buffer, widened exactly. */
double zpp_bench_load(const void *buf, size_t i, zpp_dtype_t dtype);
/* Stores v (rounded to dtype first) as element i. */
void zpp_bench_store(void *buf, size_t i, zpp_dtype_t dtype, double v);
/* 1 when element i of a and b have the same bits. */
int zpp_bench_same_bits(const void *a, const void *b, size_t i,
                        zpp_dtype_t dtype);
/* 1 when element i of buf has the bits of v (v representable in dtype). */
int zpp_bench_equal_bits(const void *buf, size_t i, zpp_dtype_t dtype,
                         double v);

/* Sampling of the checks: 1 (every block) when the size column is at most
 * 1 MiB, else ceil(size / 1 MiB): one block of --block elements in every
 * `stride`, plus the last (tail) block. */
size_t zpp_bench_block_stride(size_t size_bytes);
/* 1 when block b of nb is checked under stride. */
int zpp_bench_block_checked(size_t b, size_t nb, size_t stride);

/* Scale and range of one block of a quantizer with `bits` (symmetric) as
 * docs/format.md computes them, as upper bounds in double: range = absmax,
 * scale = range / qmax * (1 + 2^-23) (fp32 rounding of the division). */
void zpp_bench_block_params(const double *x, size_t len, int bits,
                            double *scale, double *range);
/* Per-element bound of docs/format.md for a block with (scale, range):
 * scale * (1/2 + 2^-12) + 2^-22 * (|x| + range) + 2^-149, plus half an ulp
 * of the output dtype at |out| when it is fp16 or bf16. */
double zpp_bench_quant_bound(double scale, double range, double x, double out,
                             zpp_dtype_t dtype);
/* Half an ulp of dtype relative to |v| (2^-24, 2^-11, 2^-8): the output
 * rounding of a value computed in fp32 and stored in dtype. */
double zpp_bench_out_rel(zpp_dtype_t dtype);

/* Adds one checked element to chk. */
void zpp_bench_check_add(zpp_bench_check_t *chk, double got, double ref,
                         int ok);

/* Shared by allgather and hpz-gather: checks c->out->host, the world
 * gather of every rank's input shard of c->count elements.  bits 0: bitwise
 * equal to the input; 8 or 4: within the docs/format.md bound of the input
 * block (symmetric, --block elements).  equal: NULL, or a host buffer the
 * output must also equal bitwise (hpZ backward against forward). */
void zpp_bench_check_gathered(const zpp_bench_ctx_t *ctx,
                              const zpp_bench_case_t *c, int bits,
                              const void *equal, zpp_bench_check_t *chk);

/* ---- Open MPI's own collectives, the "mpi" variants (perf/zpp_bench.c) ---
 * mpi on MPI_COMM_WORLD's duplicate, mpi-han and mpi-best on duplicates of
 * their own (perf/bench_mpi_peers.c), errors return, so world rank r is
 * zpp's rank r and the outputs are laid out as zpp's.  Available under the
 * MPI bootstrap and host memory only: zpp_bench_mpi_check says why not
 * (NULL: available).  zpp_bench_mpi_case_setup (collective: every rank
 * calls it at the same point) duplicates the communicator on first use,
 * probes one call on the case's buffers to name (mpi) or verify (mpi-han,
 * mpi-best) what serves it, and points c->state at the communicator. */
const char *zpp_bench_mpi_check(const zpp_bench_ctx_t *ctx);
zpp_status_t zpp_bench_mpi_case_setup(const zpp_bench_ctx_t *ctx,
                                      zpp_bench_case_t *c);
/* MPI_Allgather of `bytes` per rank (MPI_BYTE) on c's communicator. */
zpp_status_t zpp_bench_mpi_allgather(const zpp_bench_ctx_t *ctx,
                                     const zpp_bench_case_t *c, size_t bytes);
/* MPI_Reduce_scatter_block of c->count elements per rank on c's
 * communicator: fp32 with MPI_FLOAT and MPI_SUM; fp16 and bf16 (no MPI
 * type) as MPI_UINT16_T with a user-defined commutative sum that adds two
 * elements and rounds the sum to the dtype (nearest even), as a reduction
 * on 16-bit data does in each step.  MEAN: the SUM divided by the world
 * size in fp32 and rounded. */
zpp_status_t zpp_bench_mpi_reduce_scatter(const zpp_bench_ctx_t *ctx,
                                          const zpp_bench_case_t *c,
                                          zpp_dtype_t dtype, zpp_redop_t op);

/* perf/bench_mpi_peers.c.  Creates the mpi-han and mpi-best communicators
 * the variants ask for (collective) and verifies HAN; text gets what was
 * done, for the header.  ZPP_OK when no variant asks for them. */
zpp_status_t zpp_bench_mpi_peers_init(const zpp_bench_ctx_t *ctx,
                                      const zpp_bench_variant_t *v, int nv,
                                      int reduce_scatter, char *text,
                                      size_t len);
/* One case's probe (and, mpi-best, the trial of every algorithm); type_p,
 * op_p and default_comm point to an MPI_Datatype, MPI_Op and MPI_Comm;
 * *comm_out to the MPI_Comm the case runs on. */
zpp_status_t zpp_bench_mpi_peer_setup(const zpp_bench_ctx_t *ctx,
                                      zpp_bench_case_t *c, void *default_comm,
                                      void *type_p, void *op_p, int count,
                                      void **comm_out);
void zpp_bench_mpi_peers_teardown(void);

/* Buffers in the communicator's memory space (device: cudaMalloc). */
zpp_status_t zpp_bench_buf_alloc(const zpp_bench_ctx_t *ctx, size_t bytes,
                                 zpp_bench_buf_t *buf);
void zpp_bench_buf_free(const zpp_bench_ctx_t *ctx, zpp_bench_buf_t *buf);
zpp_status_t zpp_bench_buf_upload(const zpp_bench_ctx_t *ctx,
                                  zpp_bench_buf_t *buf);
zpp_status_t zpp_bench_buf_download(const zpp_bench_ctx_t *ctx,
                                    zpp_bench_buf_t *buf);

#endif /* ZPP_PERF_ZPP_BENCH_COMMON_H */
