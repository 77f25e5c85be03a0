/*
 * qgZ: hierarchical quantized reduce-scatter of gradients, written as
 * plans of transfer descriptors and kernel steps (src/engine/exec.h).
 *
 * World of M nodes of S ranks (uniform layout).  Rank (node n, local l)
 * owns slice w(n, l) of the result, where w(m, j) is the world rank with
 * local rank j on node m: the standard reduce-scatter layout, whatever the
 * rank-to-node map.
 *   stage 1: for each other local rank j, encode (intra_bits) the M
 *            slices w(0, j) .. w(M-1, j) into one contiguous message;
 *            all-to-all in the NODE group; acc[m] = my own slice w(m, l)
 *            from sendbuf in fp32, then the decoded messages added in
 *            local-rank order: the sum over my node of slice w(m, l).
 *   stage 2: encode (inter_bits) each acc[m] of another node; all-to-all
 *            in the CROSS group (acc[m] goes to node m); decode-accumulate
 *            them in node order into acc[n] of my own node (fp32): my
 *            slice.
 *   finish:  divide by the world size for MEAN, round once to dtype.
 * What a rank would send to itself (its own slices, its own node's
 * partial sum) skips the quantizer: less work, one error term less per
 * stage; its block of each all-to-all is empty (its part of the message
 * buffers is never written, sent or read), and its residual segments are
 * neither read nor written (integer sums: its own slices' hold the error
 * of their rounding to a unit).
 * Uneven nodes: one flat all-to-all over the world (stage 1 only, over
 * all ranks).  intra_bits ZPP_QGZ_INTRA_RAW: stage 1 sends the slices in
 * the dtype and sums them in fp32 (no codes, no error, no stage-1
 * residual); the flat stage of uneven nodes, which crosses the network,
 * then quantizes in inter_bits, and one node quantizes nothing.  Bytes and
 * the error bound: docs/collectives.md, "qgZ".
 */
#include "coll/coll.h"
#include "comm/comm.h"
#include "core/core.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "kernels/quant_cpu.h"
#include "kernels/quant_math.h"
#include "quant/quant.h"
#include "topology/topo.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q1, q2; /* stage 1 (intra) and stage 2 (inter) */
  zpp_quant_config_t qr;     /* INT8 residual storage (residual_bits 8) */
  const void *send;
  void *recv;
  size_t count;
  zpp_dtype_t dtype;
  zpp_redop_t op;
  void *residual;
  size_t hadamard;   /* rotation group, 0: off */
  int residual_bits; /* 32 or 8 */
  float beta;        /* moving average of the errors (LoCo), 0: plain EF */
  int reset;         /* this call starts from a zero residual */
  int isum;          /* compressed-domain sums (ZPP_QGZ_SUM_INT) */
} qgz_arg_t;

static int qgz_two_level(const zpp_transport_t *t) {
  const zpp_topo_t *topo = zpp_transport_topo(t);
  return topo->uniform && topo->nnodes > 1;
}

zpp_status_t zpp_qgz_residual_count(zpp_comm_t comm, size_t count,
                                    size_t *residual_count) {
  zpp_transport_t *t;
  size_t n, m = 0;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (residual_count == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "residual_count is NULL");
  t = zpp_comm_transport(comm);
  n = (size_t)zpp_transport_size(t);
  if (qgz_two_level(t))
    m = (size_t)zpp_transport_topo(t)->nnodes;
  if (count > SIZE_MAX / sizeof(float) / (n + m))
    return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                     "count %zu: residual size overflows size_t", count);
  *residual_count = (n + m) * count;
  return ZPP_OK;
}

/* Stage 1 of a config with intra_bits ZPP_QGZ_INTRA_RAW is not quantized
 * on two levels and on one node; the flat stage of uneven nodes crosses the
 * network and quantizes in inter_bits. */
static int qgz_raw1(const zpp_transport_t *t, int intra_bits) {
  return intra_bits == ZPP_QGZ_INTRA_RAW &&
         (qgz_two_level(t) || zpp_transport_topo(t)->nnodes <= 1);
}

/* Residual segments: one per stage-1 slice (W, none when stage 1 is raw),
 * then one per stage-2 partial sum (M, two levels); those of the rank's
 * own share (not quantized) stay unused, but for the own slices' with
 * integer sums (their rounding to a unit). */
static size_t qgz_levels(const zpp_transport_t *t, int intra_bits) {
  return (qgz_raw1(t, intra_bits) ? 0 : (size_t)zpp_transport_size(t)) +
         (qgz_two_level(t) ? (size_t)zpp_transport_topo(t)->nnodes : 0);
}

/* The INT8 residual format: symmetric, nearest, the qgZ block. */
static zpp_quant_config_t residual_q8(size_t block) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  q.bits = 8;
  q.block_size = block;
  return q;
}

/* sizeof(zpp_qgz_config_t) of revision 2: the fields up to residual_bits
 * (residual_beta now sits in what was its tail padding). */
#define QGZ_CONFIG_V2_SIZE                                                     \
  ((offsetof(zpp_qgz_config_t, residual_bits) + sizeof(int) +                \
    sizeof(uint64_t) - 1) / sizeof(uint64_t) * sizeof(uint64_t))

/* sizeof(zpp_qgz_config_t) of revision 3: the fields up to step. */
#define QGZ_CONFIG_V3_SIZE (offsetof(zpp_qgz_config_t, step) + sizeof(uint64_t))

/* Reads a config of any accepted size (revision 1: fields up to `mode`;
 * 2: up to residual_bits; 3: up to step; 4: up to sum, include/zpp/
 * zpp_coll.h), field by field: an older struct's
 * padding is not read as a newer field. */
static void qgz_config_get(const zpp_qgz_config_t *in, zpp_qgz_config_t *out) {
  zpp_qgz_config_t d = ZPP_QGZ_CONFIG_INIT;
  if (in->struct_size >= sizeof(zpp_qgz_config_t)) {
    d = *in;
  } else if (in->struct_size >= QGZ_CONFIG_V3_SIZE) {
    memcpy(&d, in, QGZ_CONFIG_V3_SIZE);
    d.sum = ZPP_QGZ_SUM_DEFAULT;
  } else {
    d.intra_bits = in->intra_bits;
    d.inter_bits = in->inter_bits;
    d.block_size = in->block_size;
    d.mode = in->mode;
    if (in->struct_size >= QGZ_CONFIG_V2_SIZE) {
      d.hadamard = in->hadamard;
      d.rounding = in->rounding;
      d.seed = in->seed;
      d.residual_bits = in->residual_bits;
    }
  }
  d.struct_size = sizeof(zpp_qgz_config_t);
  *out = d;
}

static zpp_status_t check_cfg(const char *func, const zpp_qgz_config_t *c);

zpp_status_t zpp_qgz_residual_bytes(zpp_comm_t comm,
                                    const zpp_qgz_config_t *cfg, size_t count,
                                    size_t *bytes) {
  zpp_qgz_config_t c;
  size_t n, per;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  if (bytes == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "bytes is NULL");
  ZPP_CHECK(check_cfg(__func__, cfg));
  qgz_config_get(cfg, &c);
  n = qgz_levels(zpp_comm_transport(comm), c.intra_bits);
  if (c.residual_bits == 8) {
    zpp_quant_config_t q = residual_q8(c.block_size);
    ZPP_CHECK(zpp_quant_encoded_size(&q, count, &per));
  } else {
    if (count > SIZE_MAX / sizeof(float))
      return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                       "count %zu: residual size overflows size_t", count);
    per = count * sizeof(float);
  }
  if (per != 0 && n > SIZE_MAX / per)
    return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                     "count %zu: residual size overflows size_t", count);
  *bytes = n * per;
  return ZPP_OK;
}

#define QGZ_DEPTH 3 /* chunk slots in flight */
/* qgz_plan appends N_k before K_{k-1} and relies on their slots differing */
_Static_assert(QGZ_DEPTH >= 2, "QGZ_DEPTH");
/* Chunks of a call (zpp_plan_chunk).  qwZ takes 32; here 16 were within
 * the spread of an alternated run on the real 2x4 link at 1.6 Gbit/s, 16
 * MiB per rank (docs/benchmarks.md, section 9, "qwZ's chunks"). */
#define QGZ_PARTS 8

/* The state of one call: stage 1 sends, to each member j of group g1, the
 * chunk of slices slice(j, 0..m1-1) (to itself: nothing); stage 2 (two
 * levels only) sends partial sum m to CROSS member m (to itself:
 * nothing). */
typedef struct {
  qgz_arg_t a;
  const zpp_topo_t *topo;
  zpp_group_t g1;
  int s1, m1, two;
  int raw1;       /* stage 1 moves the dtype, unquantized (ZPP_QGZ_INTRA_RAW) */
  /* A rank's own share of each stage, which it would send to itself: its
   * index in g1 (me1, stage 1: its own slices) and in CROSS (mo, stage 2:
   * the partial sum its node keeps; 0 on one level).  That share skips the
   * quantizer and the message: it is summed from sendbuf, or kept in the
   * partial sums, in fp32 (no encode, no decode, no error), and its residual
   * segments are neither read nor written (docs/collectives.md, "qgZ"; integer
   * sums round the own slices to a unit and feed that error back). */
  int me1, mo;
  int rot1, rot2; /* Hadamard: before the stage-1 encode, or (raw stage 1)
                     on the partial sums before the stage-2 encode */
  size_t seg2;    /* residual segment of partial sum 0: after the W
                     stage-1 ones, or first when stage 1 is raw */
  size_t chunk, nchunks;
  /* Scratch of one kernel step (kernel steps of a plan run one at a time,
   * and none of these outlives its step, so one of each serves all
   * slots). */
  float *tmp;  /* one slice chunk: rotated and/or gradient + residual */
  float *tmp2; /* INT8 residual: the chunk's residual, then its new error */
  float *tmp3; /* moving average: the chunk's decoded value */
  uint8_t *rs; /* INT8 residual: the chunk's encoded residual */
  const void **srcs; /* s1 - 1: the other members' messages of one part */
  /* Device memory: each kernel step makes one batched launch per kind of
   * work (encode, decode-sum, rotation) over a table of its slices or
   * partial sums, however many ranks there are (zpp_k_*_batch); host
   * memory runs them one by one.  The tables of one step: */
  int batch;
  zpp_qb_enc_run_t *eruns; /* (s1 - 1) m1 stage-1 encodes, or m1 - 1 */
  zpp_qb_sum_run_t *sruns; /* m1 partial sums */
  zpp_tf_run_t *hruns;     /* m1 rotations */
  const void **bsrcs;      /* (s1 - 1) m1 + m1 messages to decode */
  /* The all-to-alls' layouts (the same for send and recv): bytes and
   * displacements per member, [0] for a whole chunk, [1] for the last
   * one; the block to itself is empty (it would only be copied, and it is
   * never read). */
  struct {
    size_t *bytes, *displs;
  } lay1[2], lay2[2];
  size_t *lay_mem;
  size_t res_seg; /* INT8 residual: bytes of one segment (E8(count)) */
  /* Compressed-domain sums (a.isum): the integer-sum kernels, the blocks
   * of one slice, this rank's absmax bits of every block of every slice
   * (W nb: amax_mine) and the unit exponents: this rank's (uexp_mine),
   * every g1 member's (uexp_all, s1 W nb bytes, all-gathered) and their
   * max, the agreed ones (uexp; uexp_mine itself when s1 is 1).  The partial
   * sums (accx, acco) hold int32 then. */
  const zpp_isum_ops_t *iops;
  size_t nb;
  uint32_t *amax_mine;
  int8_t *uexp_mine, *uexp_all, *uexp;
  const uint8_t **fsrcs; /* m1 - 1: the other nodes' stage-2 messages */
  /* Integer sums on device memory (idev): one chunk, each step one
   * launch per kind of work over a table of its slices or partial sums
   * (the kernels of src/kernels/isum_cuda.h, bitwise the host's), on the
   * plan's stream.  The tables of one step and its message pointers: */
  int idev;
  zpp_isum_cuda_absmax_run_t *iabs;  /* W slices */
  zpp_isum_cuda_encode_run_t *ienc;  /* (s1 - 1) m1 stage-1 messages */
  zpp_isum_cuda_sum_run_t *isr;      /* m1 partial sums */
  zpp_isum_cuda_requant_run_t *ireq; /* m1 - 1 stage-2 messages */
  const uint8_t **isrcs;             /* s1 m1 */
  /* Per slot: stage 1's messages (to each member j the m1 parts of slices
   * slice(j, 0..m1-1), in node order), and its partial sums in two sets:
   * X, the m1 - 1 that other nodes keep, and O, the one this node keeps
   * (one level: the only one); qgz_plan reduces them in separate steps. */
  struct {
    uint8_t *s1, *r1;
    float *accx;     /* X: m1 - 1 partial sums of the chunk */
    uint8_t *s2, *r2; /* stage 2 (two levels), m1 parts (own: unused) */
    float *acco;     /* O: the kept partial sum, then the result */
  } slot[QGZ_DEPTH];
} qgz_ctx_t;

static int slice_of(const qgz_ctx_t *p, int j, int m) {
  if (!p->two)
    return zpp_transport_group_member(p->a.ex.t, p->g1, j);
  return p->topo->node_ranks[p->topo->node_off[m] + j];
}

static size_t chunk_len(const qgz_ctx_t *p, size_t k) {
  size_t off = k * p->chunk;
  return p->a.count - off < p->chunk ? p->a.count - off : p->chunk;
}

/* Bytes of one stage-1 message part: `len` elements encoded, or in the
 * dtype when stage 1 is raw. */
static size_t s1_bytes(const qgz_ctx_t *p, size_t len) {
  if (p->a.isum) { /* codes and multipliers: the unit is agreed */
    zpp_qcfg_t c;
    memset(&c, 0, sizeof c);
    c.bits = p->a.q1.bits;
    c.block = p->a.q1.block_size;
    return zpp_isum_msg_bytes(&c, len);
  }
  return p->raw1 ? len * zpp_dtype_size(p->a.dtype)
                 : zpp_coll_encoded_size(&p->a.q1, len);
}

/* Stochastic rounding: the config of one encode, with a seed of its own
 * for each (stage, rank, slice or partial sum), so no two encodes of a
 * call share random bits; elements draw at their index in the slice. */
static zpp_quant_config_t stream_q(const zpp_quant_config_t *q, int stage,
                                   int rank, int slice) {
  zpp_quant_config_t r = *q;
  if (r.rounding == ZPP_ROUND_STOCHASTIC) {
    zpp_qm_keys_t k = zpp_qm_rng_keys(q->seed ^ ((uint64_t)stage << 62));
    r.seed = ((uint64_t)k.k1 << 32 | k.k0) ^
             ((uint64_t)(uint32_t)rank << 32 | (uint32_t)slice);
  }
  return r;
}

/* Error feedback around one encode of `len` elements at `off` of slice
 * (or partial sum) `seg`: x (fp32, may be p->tmp) += residual, encode x
 * into out, store the new error.  fp32 residual: seg * count + off floats
 * in; INT8: segment seg (E8(count) bytes, the format of docs/format.md),
 * the chunk's blocks gathered into p->rs and decoded, then re-encoded and
 * scattered back (chunks are whole blocks, so they own whole blocks).  A
 * call with a->reset uses a zero residual instead of the stored one. */
static zpp_status_t encode_ef(qgz_ctx_t *p, const zpp_quant_config_t *q,
                              size_t seg, size_t off, size_t len,
                              zpp_dtype_t dt, const void *x, uint8_t *out) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  if (a->residual == NULL)
    return zpp_k_encode_at(ex, q, dt, x, len, off, out);
  if (a->residual_bits == 32) {
    float *res = (float *)a->residual + seg * a->count + off;
    if (a->reset)
      ZPP_CHECK(zpp_k_zero(ex, res, len * sizeof(float)));
    return zpp_k_encode_ef(ex, q, dt, x, len, off, res, a->beta, p->tmp,
                           p->tmp3, out);
  }
  {
    size_t bs = a->qr.block_size, nbt = (a->count + bs - 1) / bs;
    size_t b0 = off / bs, nb = (len + bs - 1) / bs;
    uint8_t *segp = (uint8_t *)a->residual + seg * p->res_seg;
    if (a->reset) {
      ZPP_CHECK(zpp_k_zero(ex, p->tmp2, len * sizeof(float)));
    } else {
      ZPP_CHECK(zpp_k_copy(ex, p->rs, segp + b0 * 4, nb * 4));
      ZPP_CHECK(zpp_k_copy(ex, p->rs + nb * 4, segp + nbt * 4 + b0 * bs, len));
      ZPP_CHECK(zpp_k_decode(ex, &a->qr, p->rs, len, ZPP_FLOAT32, p->tmp2));
    }
    ZPP_CHECK(zpp_k_encode_ef(ex, q, dt, x, len, off, p->tmp2, a->beta,
                              p->tmp, p->tmp3, out));
    ZPP_CHECK(zpp_k_encode(ex, &a->qr, ZPP_FLOAT32, p->tmp2, len, p->rs));
    ZPP_CHECK(zpp_k_copy(ex, segp + b0 * 4, p->rs, nb * 4));
    return zpp_k_copy(ex, segp + nbt * 4 + b0 * bs, p->rs + nb * 4, len);
  }
}

/* Batched steps: the residual of slice (or partial sum) `seg` for `len`
 * elements at `off`, as encode_ef finds it: fp32, seg * count + off
 * floats in; INT8, segment seg's blocks from off / block on, their scales
 * and their codes. */
static void residual_at(const qgz_ctx_t *p, size_t seg, size_t off, void **res,
                        uint8_t **res_codes) {
  const qgz_arg_t *a = &p->a;
  *res = NULL;
  *res_codes = NULL;
  if (a->residual == NULL)
    return;
  if (a->residual_bits == 32) {
    *res = (float *)a->residual + seg * a->count + off;
  } else {
    size_t bs = a->qr.block_size, nbt = (a->count + bs - 1) / bs;
    uint8_t *segp = (uint8_t *)a->residual + seg * p->res_seg;
    *res = segp + off / bs * 4;
    *res_codes = segp + nbt * 4 + off / bs * bs;
  }
}

static void batch_residual(const qgz_ctx_t *p, size_t seg, size_t off,
                           zpp_qb_enc_run_t *r) {
  residual_at(p, seg, off, &r->res, &r->res_codes);
}

/* Batched steps: what the encodes of one step share. */
static zpp_k_enc_batch_t batch_opts(const qgz_ctx_t *p,
                                    const zpp_quant_config_t *q, zpp_dtype_t dt,
                                    size_t hadamard) {
  zpp_k_enc_batch_t b;
  memset(&b, 0, sizeof b);
  b.q = q;
  b.dtype = dt;
  b.residual_bits = p->a.residual != NULL ? p->a.residual_bits : 0;
  b.reset = p->a.reset;
  b.beta = p->a.beta;
  b.hadamard = hadamard;
  return b;
}

/* The two sets of stage 1's partial sums. */
enum { HALF_X = 0, HALF_O = 1 };

static int half_parts(const qgz_ctx_t *p, int h) {
  return h == HALF_O ? 1 : p->m1 - 1;
}

/* The partial sum (node index) of part i of set h: X skips mo. */
static int half_part(const qgz_ctx_t *p, int h, int i) {
  if (h == HALF_O)
    return p->mo;
  return i < p->mo ? i : i + 1;
}

static const void *own_ptr(const qgz_ctx_t *p, size_t k, int m);

/* ---- compressed-domain sums (ZPP_QGZ_SUM_INT, host memory) ---------------
 * Before the chunks: every rank takes the absmax of each block of every
 * slice (data + stage-1 residual) and its unit exponent, the g1 members
 * all-gather the exponents and each takes the max, so all members of a
 * stage quantize a slice's block with steps that are integer multiples of
 * the same power-of-two unit.  Stage 1 then sends codes and one multiplier
 * per block and sums them as integers in units (the rank's own slice
 * rounded to a unit); stage 2 re-quantizes the integer sums into the
 * format of docs/format.md; the finish decodes once.  docs/collectives.md,
 * "Compressed-domain sums". */

/* The kernels' config: width, block, stochastic rounding of stream q
 * (stream_q) from element `base`. */
static zpp_qcfg_t isum_qcfg(const zpp_quant_config_t *q, uint64_t base) {
  zpp_qcfg_t c;
  memset(&c, 0, sizeof c);
  c.bits = q->bits;
  c.block = q->block_size;
  if (q->rounding == ZPP_ROUND_STOCHASTIC) {
    zpp_qm_keys_t k = zpp_qm_rng_keys(q->seed);
    c.sr = 1;
    c.k0 = k.k0;
    c.k1 = k.k1;
    c.base = base;
  }
  return c;
}

/* The fp32 residual of segment seg for `len` elements at `off`, for the
 * integer-sum kernels: fp32, in place (zeroed first when the call resets,
 * if `zero`); INT8, decoded into buf (p->tmp2, or p->tmp for the own
 * slice's beside stage 2's; zero when the call resets).  *r NULL: no error
 * feedback. */
static zpp_status_t isum_res_load(qgz_ctx_t *p, size_t seg, size_t off,
                                  size_t len, int zero, float *buf, float **r) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  *r = NULL;
  if (a->residual == NULL)
    return ZPP_OK;
  if (a->residual_bits == 32) {
    *r = (float *)a->residual + seg * a->count + off;
    if (a->reset && zero)
      memset(*r, 0, len * sizeof(float));
    return ZPP_OK;
  }
  *r = buf;
  if (a->reset)
    return zpp_k_zero(ex, buf, len * sizeof(float));
  {
    size_t bs = a->qr.block_size, nbt = (a->count + bs - 1) / bs;
    size_t b0 = off / bs, nb = (len + bs - 1) / bs;
    const uint8_t *segp = (const uint8_t *)a->residual + seg * p->res_seg;
    ZPP_CHECK(zpp_k_copy(ex, p->rs, segp + b0 * 4, nb * 4));
    ZPP_CHECK(zpp_k_copy(ex, p->rs + nb * 4, segp + nbt * 4 + b0 * bs, len));
    return zpp_k_decode(ex, &a->qr, p->rs, len, ZPP_FLOAT32, buf);
  }
}

/* INT8 residual: buf (the new errors) encoded back into segment seg. */
static zpp_status_t isum_res_store(qgz_ctx_t *p, size_t seg, size_t off,
                                   size_t len, const float *buf) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t bs = a->qr.block_size, nbt = (a->count + bs - 1) / bs;
  size_t b0 = off / bs, nb = (len + bs - 1) / bs;
  uint8_t *segp;
  if (a->residual == NULL || a->residual_bits == 32)
    return ZPP_OK;
  segp = (uint8_t *)a->residual + seg * p->res_seg;
  ZPP_CHECK(zpp_k_encode(ex, &a->qr, ZPP_FLOAT32, buf, len, p->rs));
  ZPP_CHECK(zpp_k_copy(ex, segp + b0 * 4, p->rs, nb * 4));
  return zpp_k_copy(ex, segp + nbt * 4 + b0 * bs, p->rs + nb * 4, len);
}

/* The steps on device memory (after the host ones). */
static zpp_status_t isum_absmax_dev(qgz_ctx_t *p);
static zpp_status_t isum_encode_dev(qgz_ctx_t *p, size_t k);
static zpp_status_t isum_reduce_x_dev(qgz_ctx_t *p, size_t k);
static zpp_status_t isum_keep_dev(qgz_ctx_t *p, size_t k);

/* The absmax of every block of every slice: its data plus its stage-1
 * residual (the own slices' too: their rounding to a unit is fed back),
 * chunk by chunk. */
static zpp_status_t isum_absmax(void *ctx, size_t unused) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  size_t ds = zpp_dtype_size(a->dtype), k;
  zpp_qcfg_t c = isum_qcfg(&a->q1, 0);
  int j, m;
  (void)unused;
  if (p->idev)
    return isum_absmax_dev(p);
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1; m++) {
      size_t sl = (size_t)slice_of(p, j, m);
      for (k = 0; k < p->nchunks; k++) {
        size_t off = k * p->chunk, len = chunk_len(p, k);
        float *r = NULL;
        if (!a->reset)
          ZPP_CHECK(isum_res_load(p, sl, off, len, 0, p->tmp2, &r));
        size_t b0 = sl * p->nb + off / c.block, b;
        size_t nb = (len + c.block - 1) / c.block;
        p->iops->absmax(&c, (int)a->dtype,
                        (const uint8_t *)a->send + (sl * a->count + off) * ds,
                        r, len, p->amax_mine + b0);
        for (b = b0; b < b0 + nb; b++)
          p->uexp_mine[b] =
              (int8_t)zpp_qm_unit_exp(p->amax_mine[b], a->q1.bits);
        zpp_plan_poll();
      }
    }
  return ZPP_OK;
}

/* The agreed exponents: the max over the g1 members (s1 > 1; with one
 * member uexp is uexp_mine). */
static zpp_status_t isum_agree(void *ctx, size_t unused) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  size_t n = (size_t)zpp_transport_size(p->a.ex.t) * p->nb, i;
  int j;
  (void)unused;
  if (p->idev) /* on the stream, from the all-gathered bytes */
    return zpp_k_isum_agree(&p->a.ex, p->uexp_all, n, p->s1, p->uexp);
  /* member by member over contiguous bytes (the compiler vectorizes it) */
  memcpy(p->uexp, p->uexp_all, n);
  for (j = 1; j < p->s1; j++) {
    const int8_t *u = p->uexp_all + (size_t)j * n;
    for (i = 0; i < n; i++)
      p->uexp[i] = u[i] > p->uexp[i] ? u[i] : p->uexp[i];
  }
  return ZPP_OK;
}

/* The agreed exponents of chunk k of slice sl, and this rank's absmax. */
static const int8_t *isum_uexp(const qgz_ctx_t *p, int sl, size_t k) {
  return p->uexp + (size_t)sl * p->nb + k * p->chunk / p->a.q1.block_size;
}

static const uint32_t *isum_amax(const qgz_ctx_t *p, int sl, size_t k) {
  return p->amax_mine + (size_t)sl * p->nb + k * p->chunk / p->a.q1.block_size;
}

/* Stage 1 encode of chunk k on the agreed units (codes, multipliers). */
static zpp_status_t isum_encode(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e1 = s1_bytes(p, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(a->ex.t);
  if (p->idev)
    return isum_encode_dev(p, k);
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1; m++) {
      int sl = slice_of(p, j, m);
      zpp_quant_config_t q = stream_q(&a->q1, 1, me, sl);
      zpp_qcfg_t c = isum_qcfg(&q, off);
      float *r;
      uint8_t *o = out + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
      if (j == p->me1)
        continue;
      zpp_plan_poll();
      ZPP_CHECK(isum_res_load(p, (size_t)sl, off, len, 1, p->tmp2, &r));
      p->iops->encode(&c, (int)a->dtype,
                      (const uint8_t *)a->send +
                          ((size_t)sl * a->count + off) * ds,
                      r, a->beta, isum_amax(p, sl, k), isum_uexp(p, sl, k), len,
                      o);
      ZPP_CHECK(isum_res_store(p, (size_t)sl, off, len, p->tmp2));
    }
  return ZPP_OK;
}

/* The stage-1 messages of partial sum m of chunk k from the other members
 * into p->srcs; their number. */
static int isum_srcs(qgz_ctx_t *p, size_t k, int m) {
  size_t e1 = s1_bytes(p, chunk_len(p, k));
  const uint8_t *r1 = p->slot[k % QGZ_DEPTH].r1;
  int j, n = 0;
  for (j = 0; j < p->s1; j++)
    if (j != p->me1)
      p->srcs[n++] = r1 + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
  return n;
}

/* Set X of chunk k, integer sums: each partial sum (the own slice, plus
 * its stage-1 residual, in units plus the other members' multiplied codes)
 * re-quantized for stage 2 in the same pass, its int32 sums in a
 * cache-sized tile of accx. */
static zpp_status_t isum_reduce_x(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  int32_t *tmp = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].accx;
  zpp_qcfg_t c1 = isum_qcfg(&a->q1, 0);
  int i, me = zpp_transport_rank(a->ex.t);
  if (p->idev)
    return isum_reduce_x_dev(p, k);
  for (i = 0; i < half_parts(p, HALF_X); i++) {
    int m = half_part(p, HALF_X, i), n = isum_srcs(p, k, m);
    size_t own = (size_t)slice_of(p, p->me1, m);
    zpp_quant_config_t q = stream_q(&a->q2, 2, me, m);
    zpp_qcfg_t c = isum_qcfg(&q, off);
    float *r, *r1;
    zpp_plan_poll();
    ZPP_CHECK(isum_res_load(p, own, off, len, 1, p->tmp, &r1));
    ZPP_CHECK(isum_res_load(p, p->seg2 + (size_t)m, off, len, 1, p->tmp2, &r));
    p->iops->sum_requant(&c1, &c, (int)a->dtype, own_ptr(p, k, m), r1,
                         isum_uexp(p, (int)own, k),
                         (const uint8_t *const *)p->srcs, n, r, a->beta, len,
                         tmp, p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2);
    ZPP_CHECK(isum_res_store(p, own, off, len, p->tmp));
    ZPP_CHECK(isum_res_store(p, p->seg2 + (size_t)m, off, len, p->tmp2));
  }
  return ZPP_OK;
}

/* Set O of chunk k, integer sums: the kept partial sum and the other
 * nodes' messages, decoded once into recvbuf in the same pass (its int32
 * sums in a cache-sized tile of acco). */
static zpp_status_t isum_keep(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  int32_t *tmp = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].acco;
  zpp_qcfg_t c1 = isum_qcfg(&a->q1, 0), c = isum_qcfg(&a->q2, 0);
  float div = a->op == ZPP_OP_MEAN ? (float)zpp_transport_size(a->ex.t) : 1.0f;
  int m, n = 0, n1 = isum_srcs(p, k, p->mo);
  size_t own = (size_t)slice_of(p, p->me1, p->mo);
  float *r1;
  if (p->idev)
    return isum_keep_dev(p, k);
  for (m = 0; m < p->m1 && p->two; m++)
    if (m != p->mo)
      p->fsrcs[n++] = p->slot[k % QGZ_DEPTH].r2 + (size_t)m * e2;
  zpp_plan_poll();
  ZPP_CHECK(isum_res_load(p, own, off, len, 1, p->tmp, &r1));
  p->iops->sum_finish(
      &c1, &c, (int)a->dtype, own_ptr(p, k, p->mo), r1, a->beta,
      isum_uexp(p, (int)own, k), (const uint8_t *const *)p->srcs, n1, p->fsrcs,
      n, len, div, tmp, (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype));
  return isum_res_store(p, own, off, len, p->tmp);
}

/* ---- integer sums on device memory ------------------------------------------
 * The same steps as above on the plan's stream, one chunk (the whole
 * slices), each kind of work one batched launch over a table: bitwise the
 * host path's (tests/test_qgz_int.cc, QgzInt.DeviceEqualsTheHostPathBitFor-
 * Bit).  The residuals stay in their layout (fp32, or INT8 blocks the
 * kernels decode and re-encode themselves); the partial sums are int32 in
 * accx and acco, written by the sum kernel and read by the requant and the
 * finish. */

/* The kernels' config of stage q (width, block, rounding) on this call's
 * dtype and residual. */
static zpp_isum_cuda_t isum_dcfg(const qgz_ctx_t *p,
                                 const zpp_quant_config_t *q) {
  const qgz_arg_t *a = &p->a;
  zpp_isum_cuda_t c;
  memset(&c, 0, sizeof c);
  c.bits = q->bits;
  c.block = q->block_size;
  c.dtype = (int)a->dtype;
  c.sr = q->rounding == ZPP_ROUND_STOCHASTIC;
  c.res = a->residual == NULL      ? ZPP_QB_RES_NONE
          : a->residual_bits == 32 ? ZPP_QB_RES_F32
                                   : ZPP_QB_RES_I8;
  c.reset = a->reset;
  c.beta = a->beta;
  return c;
}

static zpp_status_t isum_absmax_dev(qgz_ctx_t *p) {
  const qgz_arg_t *a = &p->a;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q1);
  size_t w = (size_t)zpp_transport_size(a->ex.t), ds = zpp_dtype_size(a->dtype);
  size_t sl;
  for (sl = 0; sl < w; sl++) {
    zpp_isum_cuda_absmax_run_t *r = &p->iabs[sl];
    void *res;
    uint8_t *codes;
    residual_at(p, sl, 0, &res, &codes);
    r->src = (const uint8_t *)a->send + sl * a->count * ds;
    r->res = res;
    r->res_codes = codes;
    r->count = a->count;
    r->amax = p->amax_mine + sl * p->nb;
    r->uexp = p->uexp_mine + sl * p->nb;
  }
  return zpp_k_isum_absmax(&a->ex, &c, p->iabs, w);
}

static zpp_status_t isum_encode_dev(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k), n = 0;
  size_t e1 = s1_bytes(p, len), ds = zpp_dtype_size(a->dtype);
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q1);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(a->ex.t);
  for (j = 0; j < p->s1; j++)
    for (m = 0; m < p->m1 && j != p->me1; m++) {
      int sl = slice_of(p, j, m);
      zpp_isum_cuda_encode_run_t *r = &p->ienc[n++];
      residual_at(p, (size_t)sl, off, &r->res, &r->res_codes);
      r->src = (const uint8_t *)a->send + ((size_t)sl * a->count + off) * ds;
      r->amax = isum_amax(p, sl, k);
      r->uexp = isum_uexp(p, sl, k);
      r->dst = out + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
      r->count = len;
      r->base = off;
      r->seed = stream_q(&a->q1, 1, me, sl).seed;
    }
  return zpp_k_isum_encode(&a->ex, &c, p->ienc, n);
}

/* The integer sums of set h of chunk k, one after the other in acc: the
 * own slices (their stage-1 residuals updated) and the other members'
 * messages (p->isrcs). */
static zpp_status_t isum_sum_dev(qgz_ctx_t *p, size_t k, int h, int32_t *acc) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k), ns = 0;
  size_t e1 = s1_bytes(p, len);
  const uint8_t *r1 = p->slot[k % QGZ_DEPTH].r1;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q1);
  int i, j, np = half_parts(p, h);
  for (i = 0; i < np; i++) {
    int m = half_part(p, h, i);
    int own = slice_of(p, p->me1, m);
    zpp_isum_cuda_sum_run_t *r = &p->isr[i];
    residual_at(p, (size_t)own, off, &r->res, &r->res_codes);
    r->own = own_ptr(p, k, m);
    r->uexp = isum_uexp(p, own, k);
    r->out = acc + (size_t)i * len;
    r->count = len;
    r->first = ns;
    for (j = 0; j < p->s1; j++)
      if (j != p->me1)
        p->isrcs[ns++] = r1 + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
    r->n = ns - r->first;
  }
  return zpp_k_isum_sum(&a->ex, &c, p->isr, (size_t)np, p->isrcs);
}

static zpp_status_t isum_reduce_x_dev(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  int32_t *acc = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].accx;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q2);
  int i, np = half_parts(p, HALF_X), me = zpp_transport_rank(a->ex.t);
  ZPP_CHECK(isum_sum_dev(p, k, HALF_X, acc));
  for (i = 0; i < np; i++) {
    int m = half_part(p, HALF_X, i);
    zpp_isum_cuda_requant_run_t *r = &p->ireq[i];
    residual_at(p, p->seg2 + (size_t)m, off, &r->res, &r->res_codes);
    r->in = acc + (size_t)i * len;
    r->uexp = isum_uexp(p, slice_of(p, p->me1, m), k);
    r->dst = p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2;
    r->count = len;
    r->base = off;
    r->seed = stream_q(&a->q2, 2, me, m).seed;
  }
  return zpp_k_isum_requant(&a->ex, &c, p->ireq, (size_t)np);
}

static zpp_status_t isum_keep_dev(qgz_ctx_t *p, size_t k) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len), n = 0;
  int32_t *acc = (int32_t *)(void *)p->slot[k % QGZ_DEPTH].acco;
  zpp_isum_cuda_t c = isum_dcfg(p, &a->q2);
  zpp_isum_cuda_finish_run_t r;
  float div = a->op == ZPP_OP_MEAN ? (float)zpp_transport_size(a->ex.t) : 1.0f;
  int m;
  ZPP_CHECK(isum_sum_dev(p, k, HALF_O, acc));
  for (m = 0; m < p->m1 && p->two; m++)
    if (m != p->mo)
      p->fsrcs[n++] = p->slot[k % QGZ_DEPTH].r2 + (size_t)m * e2;
  memset(&r, 0, sizeof r);
  r.own = acc;
  /* more than ZPP_ISUM_CUDA_SRCS other nodes: the finish goes on over
   * launches, its fp32 sums in place of the int32 ones it has read */
  r.part = p->slot[k % QGZ_DEPTH].acco;
  r.uexp = isum_uexp(p, slice_of(p, p->me1, p->mo), k);
  r.dst = (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype);
  r.count = len;
  r.first = 0;
  r.n = n;
  return zpp_k_isum_finish(&a->ex, &c, &r, 1, p->fsrcs, div);
}

/* Stage 1 encode of chunk k into its slot, residuals updated. */
static zpp_status_t stage1_encode(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e1 = s1_bytes(p, len), ds = zpp_dtype_size(a->dtype);
  uint8_t *out = p->slot[k % QGZ_DEPTH].s1;
  int j, m, me = zpp_transport_rank(ex->t);
  if (a->isum)
    return isum_encode(p, k);
  if (p->batch && !p->raw1) { /* every slice to every member: one table */
    zpp_k_enc_batch_t b =
        batch_opts(p, &a->q1, a->dtype, p->rot1 ? a->hadamard : 0);
    size_t n = 0;
    for (j = 0; j < p->s1; j++)
      for (m = 0; m < p->m1 && j != p->me1; m++) {
        int sl = slice_of(p, j, m);
        zpp_qb_enc_run_t *r = &p->eruns[n++];
        r->src = (const uint8_t *)a->send + ((size_t)sl * a->count + off) * ds;
        r->dst = out + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
        batch_residual(p, (size_t)sl, off, r);
        r->count = len;
        r->base = off;
        r->seed = stream_q(&a->q1, 1, me, sl).seed;
      }
    return zpp_k_encode_batch(ex, &b, p->eruns, n);
  }
  for (j = 0; j < p->s1; j++) {
    if (j == p->me1) { /* not sent: summed from sendbuf by stage1_sum */
      out += (size_t)p->m1 * e1;
      continue;
    }
    for (m = 0; m < p->m1; m++, out += e1) {
      int sl = slice_of(p, j, m);
      zpp_plan_poll(); /* keep the transfers in flight moving */
      size_t at = (size_t)sl * a->count + off;
      const void *g = (const uint8_t *)a->send + at * ds;
      zpp_dtype_t dt = a->dtype;
      zpp_quant_config_t q;
      if (p->raw1) { /* the slice as it is, into its message */
        ZPP_CHECK(zpp_k_copy(ex, out, g, e1));
        continue;
      }
      q = stream_q(&a->q1, 1, me, sl);
      if (p->rot1) { /* groups start at the slice's first element */
        ZPP_CHECK(zpp_k_hadamard(ex, a->hadamard, dt, g, len, p->tmp));
        g = p->tmp;
        dt = ZPP_FLOAT32;
      }
      ZPP_CHECK(encode_ef(p, &q, (size_t)sl, off, len, dt, g, out));
    }
  }
  return ZPP_OK;
}

/* acc is the slot's (this chunk's until its last step, which this is), so
 * the inverse rotation may work in place. */
static zpp_status_t finish(const qgz_ctx_t *p, size_t k, float *acc) {
  const qgz_arg_t *a = &p->a;
  size_t off = k * p->chunk;
  float div = a->op == ZPP_OP_MEAN ? (float)zpp_transport_size(a->ex.t) : 1.0f;
  if (p->rot1 || p->rot2) /* back from the rotated domain, in place */
    ZPP_CHECK(zpp_k_hadamard(&a->ex, a->hadamard, ZPP_FLOAT32, acc,
                             chunk_len(p, k), acc));
  return zpp_k_finish(&a->ex, acc, chunk_len(p, k), div, a->dtype,
                      (uint8_t *)a->recv + off * zpp_dtype_size(a->dtype));
}

/* Chunk k of this rank's own slice of partial sum m, in sendbuf. */
static const void *own_ptr(const qgz_ctx_t *p, size_t k, int m) {
  size_t at = (size_t)slice_of(p, p->me1, m) * p->a.count + k * p->chunk;
  return (const uint8_t *)p->a.send + at * zpp_dtype_size(p->a.dtype);
}

/* part = this rank's own slice of partial sum m, chunk k, in fp32, read
 * from sendbuf (rotated first when stage 1 rotates). */
static zpp_status_t own_slice(qgz_ctx_t *p, size_t k, int m, float *part) {
  const qgz_arg_t *a = &p->a;
  size_t len = chunk_len(p, k);
  const void *g = own_ptr(p, k, m);
  if (p->rot1) /* straight into part: the rotation writes fp32 */
    return zpp_k_hadamard(&a->ex, a->hadamard, a->dtype, g, len, part);
  return zpp_k_to_f32(&a->ex, a->dtype, g, len, part);
}

/* Stage 1's partial sums come from zpp_k_sum_decoded (its message table
 * p->srcs) unless stage 1 is raw or rotated. */
static int sum_in_one_call(const qgz_ctx_t *p) {
  return !p->raw1 && !p->rot1;
}

/* Stage 1 decode-accumulate (raw: convert-accumulate) of set h of chunk
 * k into acc (its partial sums one after the other): each partial sum starts as
 * this rank's own slice, then the other members' messages are added in
 * member order (unrotated and quantized: in one pass of L1 tiles on the
 * host, zpp_k_sum_decoded). */
static zpp_status_t stage1_sum(qgz_ctx_t *p, size_t k, int h, float *acc) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t len = chunk_len(p, k), e1 = s1_bytes(p, len);
  const uint8_t *r1 = p->slot[k % QGZ_DEPTH].r1;
  int i, j, np = half_parts(p, h);
  if (p->batch) { /* every partial sum of the set: one table */
    size_t ns = 0;
    for (i = 0; i < np && p->rot1; i++) { /* own slices, rotated, first */
      p->hruns[i].src = own_ptr(p, k, half_part(p, h, i));
      p->hruns[i].dst = acc + (size_t)i * len;
      p->hruns[i].count = len;
    }
    if (p->rot1)
      ZPP_CHECK(zpp_k_hadamard_batch(ex, a->hadamard, a->dtype, p->hruns,
                                     (size_t)np));
    for (i = 0; i < np; i++) {
      int m = half_part(p, h, i);
      zpp_qb_sum_run_t *r = &p->sruns[i];
      r->out = acc + (size_t)i * len;
      r->init = p->rot1 ? NULL : own_ptr(p, k, m);
      r->count = len;
      r->first = ns;
      for (j = 0; j < p->s1; j++)
        if (j != p->me1)
          p->bsrcs[ns++] = r1 + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
      r->n = ns - r->first;
    }
    return zpp_k_sum_batch(ex, p->raw1 ? NULL : &a->q1, a->dtype, a->dtype,
                           p->sruns, (size_t)np, p->bsrcs);
  }
  for (i = 0; i < np; i++) {
    int m = half_part(p, h, i);
    float *part = acc + (size_t)i * len;
    if (sum_in_one_call(p)) { /* own slice and messages in one pass */
      int n = 0;
      for (j = 0; j < p->s1; j++)
        if (j != p->me1)
          p->srcs[n++] = r1 + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
      zpp_plan_poll();
      ZPP_CHECK(zpp_k_sum_decoded(ex, &a->q1, a->dtype, own_ptr(p, k, m),
                                  p->srcs, n, len, part));
      continue;
    }
    ZPP_CHECK(own_slice(p, k, m, part));
    for (j = 0; j < p->s1; j++) {
      const uint8_t *in = r1 + ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
      if (j == p->me1)
        continue; /* already in part */
      zpp_plan_poll();
      if (p->raw1) /* part = part + fp32(slice), in place */
        ZPP_CHECK(zpp_k_add_residual(ex, a->dtype, in, part, len, part));
      else
        ZPP_CHECK(zpp_k_decode_acc(ex, &a->q1, in, len, part));
    }
  }
  return ZPP_OK;
}

/* Set X of chunk k (two levels): the partial sums other nodes keep, then
 * stage 2's encode of each into its part of s2 (stage-2 residual segments
 * from p->seg2; own part: not written).  A raw stage 1 leaves the rotation to
 * here: the partial sums are rotated in place, and the sum of rotated
 * partial sums is the rotated sum (stage2_keep rotates the kept one). */
static zpp_status_t stage1_reduce_x(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t off = k * p->chunk, len = chunk_len(p, k);
  size_t e2 = zpp_coll_encoded_size(&a->q2, len);
  float *acc = p->slot[k % QGZ_DEPTH].accx;
  int i, me = zpp_transport_rank(ex->t);
  if (a->isum)
    return isum_reduce_x(p, k);
  ZPP_CHECK(stage1_sum(p, k, HALF_X, acc));
  if (p->batch) { /* every partial sum to send: one table */
    zpp_k_enc_batch_t b = batch_opts(p, &a->q2, ZPP_FLOAT32, 0);
    int np = half_parts(p, HALF_X);
    for (i = 0; i < np; i++) {
      int m = half_part(p, HALF_X, i);
      zpp_qb_enc_run_t *r = &p->eruns[i];
      p->hruns[i].src = p->hruns[i].dst = acc + (size_t)i * len;
      p->hruns[i].count = len;
      r->src = acc + (size_t)i * len;
      r->dst = p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2;
      batch_residual(p, p->seg2 + (size_t)m, off, r);
      r->count = len;
      r->base = off;
      r->seed = stream_q(&a->q2, 2, me, m).seed;
    }
    if (p->rot2) /* in place, before the encode */
      ZPP_CHECK(zpp_k_hadamard_batch(ex, a->hadamard, ZPP_FLOAT32, p->hruns,
                                     (size_t)np));
    return zpp_k_encode_batch(ex, &b, p->eruns, (size_t)np);
  }
  for (i = 0; i < half_parts(p, HALF_X); i++) { /* part mo: not sent */
    int m = half_part(p, HALF_X, i);
    float *part = acc + (size_t)i * len;
    uint8_t *out = p->slot[k % QGZ_DEPTH].s2 + (size_t)m * e2;
    zpp_quant_config_t q;
    zpp_plan_poll();
    q = stream_q(&a->q2, 2, me, m);
    if (p->rot2)
      ZPP_CHECK(zpp_k_hadamard(ex, a->hadamard, ZPP_FLOAT32, part, len, part));
    ZPP_CHECK(encode_ef(p, &q, p->seg2 + (size_t)m, off, len, ZPP_FLOAT32,
                        part, out));
  }
  return ZPP_OK;
}

/* Set O of chunk k: the partial sum this node keeps; one level: the
 * finish.  Two levels: rotated when stage 2 rotates, the other nodes'
 * partial sums decoded and added to it in node order (in place, fp32),
 * then the finish. */
static zpp_status_t stage2_keep(void *ctx, size_t k) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const qgz_arg_t *a = &p->a;
  size_t len = chunk_len(p, k), e2 = zpp_coll_encoded_size(&a->q2, len);
  float *sum = p->slot[k % QGZ_DEPTH].acco;
  const uint8_t *in;
  int m;
  if (a->isum)
    return isum_keep(p, k);
  ZPP_CHECK(stage1_sum(p, k, HALF_O, sum));
  if (!p->two)
    return finish(p, k, sum);
  if (p->rot2)
    ZPP_CHECK(zpp_k_hadamard(&a->ex, a->hadamard, ZPP_FLOAT32, sum, len, sum));
  in = p->slot[k % QGZ_DEPTH].r2;
  if (p->batch) { /* the other nodes' partial sums: one table */
    size_t n = 0;
    for (m = 0; m < p->m1; m++)
      if (m != p->mo)
        p->bsrcs[n++] = in + (size_t)m * e2;
    p->sruns[0].out = sum;
    p->sruns[0].init = NULL;
    p->sruns[0].count = len;
    p->sruns[0].first = 0;
    p->sruns[0].n = n;
    ZPP_CHECK(zpp_k_sum_batch(&a->ex, &a->q2, ZPP_FLOAT32, ZPP_FLOAT32,
                              p->sruns, 1, p->bsrcs));
    return finish(p, k, sum);
  }
  for (m = 0; m < p->m1; m++, in += e2) {
    if (m == p->mo)
      continue; /* the start of the sum */
    zpp_plan_poll();
    ZPP_CHECK(zpp_k_decode_acc(&a->ex, &a->q2, in, len, sum));
  }
  return finish(p, k, sum);
}

static void qgz_release(void *ctx) {
  qgz_ctx_t *p = (qgz_ctx_t *)ctx;
  const zpp_exec_t *ex = &p->a.ex;
  int i;
  for (i = 0; i < QGZ_DEPTH; i++) {
    zpp_k_free(ex, p->slot[i].s1);
    zpp_k_free(ex, p->slot[i].r1);
    zpp_k_free(ex, p->slot[i].accx);
    zpp_k_free(ex, p->slot[i].s2);
    zpp_k_free(ex, p->slot[i].r2);
    zpp_k_free(ex, p->slot[i].acco);
  }
  zpp_k_free(ex, p->tmp);
  zpp_k_free(ex, p->tmp2);
  zpp_k_free(ex, p->tmp3);
  zpp_k_free(ex, p->rs);
  free((void *)p->srcs);
  free((void *)p->fsrcs);
  zpp_k_free(ex, p->amax_mine);
  if (p->uexp != p->uexp_mine) /* else the same buffer (s1 == 1) */
    zpp_k_free(ex, p->uexp);
  zpp_k_free(ex, p->uexp_mine);
  zpp_k_free(ex, p->uexp_all);
  free(p->iabs);
  free(p->ienc);
  free(p->isr);
  free(p->ireq);
  free((void *)p->isrcs);
  free(p->eruns);
  free(p->sruns);
  free(p->hruns);
  free((void *)p->bsrcs);
  free(p->lay_mem);
  free(p);
}

/* An all-to-all in g with the blocks bytes/displs (send and recv alike). */
static zpp_xfer_desc_t a2a(zpp_group_t g, const uint8_t *send, uint8_t *recv,
                           const size_t *bytes, const size_t *displs) {
  zpp_xfer_desc_t x;
  memset(&x, 0, sizeof x);
  x.kind = ZPP_XFER_ALLTOALLV;
  x.group = g;
  x.send = send;
  x.recv = recv;
  x.send_bytes = x.recv_bytes = bytes;
  x.send_displs = x.recv_displs = displs;
  return x;
}

/* n blocks of b bytes back to back, but the block to member me: empty. */
static void a2a_layout(size_t *bytes, size_t *displs, int n, int me,
                       size_t b) {
  int i;
  for (i = 0; i < n; i++) {
    bytes[i] = i == me ? 0 : b;
    displs[i] = (size_t)i * b;
  }
}

/* The buffers of the plan (scratch as the config needs it). */
static zpp_status_t qgz_alloc(const char *func, qgz_ctx_t *p) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  size_t e1 = s1_bytes(p, p->chunk), s1 = (size_t)p->s1;
  size_t e2 = zpp_coll_encoded_size(&a->q2, p->chunk), m1 = (size_t)p->m1;
  size_t nslots = p->nchunks < QGZ_DEPTH ? p->nchunks : QGZ_DEPTH, i;
  zpp_status_t st = ZPP_OK;
  for (i = 0; i < nslots && st == ZPP_OK; i++) {
    st = zpp_k_alloc(ex, s1 * m1 * e1, (void **)&p->slot[i].s1);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, s1 * m1 * e1, (void **)&p->slot[i].r1);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->slot[i].acco);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, (m1 - 1) * p->chunk * sizeof(float),
                       (void **)&p->slot[i].accx);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, m1 * e2, (void **)&p->slot[i].s2);
    if (st == ZPP_OK && p->two)
      st = zpp_k_alloc(ex, m1 * e2, (void **)&p->slot[i].r2);
  }
  if (st == ZPP_OK && p->nchunks > 0) { /* the all-to-alls' layouts */
    size_t nl = 4 * (s1 + m1), last = chunk_len(p, p->nchunks - 1), t;
    p->lay_mem = (size_t *)malloc(nl * sizeof *p->lay_mem);
    if (p->lay_mem == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ all-to-all layouts");
    for (t = 0; t < 2 && st == ZPP_OK; t++) {
      size_t len = t == 0 ? p->chunk : last;
      p->lay1[t].bytes = p->lay_mem + t * 2 * s1;
      p->lay1[t].displs = p->lay1[t].bytes + s1;
      p->lay2[t].bytes = p->lay_mem + 4 * s1 + t * 2 * m1;
      p->lay2[t].displs = p->lay2[t].bytes + m1;
      a2a_layout(p->lay1[t].bytes, p->lay1[t].displs, p->s1, p->me1,
                 m1 * s1_bytes(p, len));
      a2a_layout(p->lay2[t].bytes, p->lay2[t].displs, p->m1, p->mo,
                 zpp_coll_encoded_size(&a->q2, len));
    }
  }
  if (st == ZPP_OK && p->s1 > 1 && sum_in_one_call(p)) { /* stage1_sum */
    p->srcs = (const void **)calloc(s1 - 1, sizeof *p->srcs);
    if (p->srcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ message table");
  }
  if (st == ZPP_OK && a->isum && p->nchunks > 0) { /* the absmax tables */
    size_t w = (size_t)zpp_transport_size(ex->t);
    p->nb = (a->count + a->q1.block_size - 1) / a->q1.block_size;
    p->iops = &zpp_quant_cpu_ops()->isum;
    st = zpp_k_alloc(ex, w * p->nb * 4, (void **)&p->amax_mine);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, w * p->nb, (void **)&p->uexp_mine);
    if (st == ZPP_OK && s1 > 1)
      st = zpp_k_alloc(ex, w * p->nb, (void **)&p->uexp);
    if (st == ZPP_OK && s1 > 1)
      st = zpp_k_alloc(ex, s1 * w * p->nb, (void **)&p->uexp_all);
    if (s1 == 1) /* a stage of one rank agrees with itself */
      p->uexp = p->uexp_mine;
    if (st == ZPP_OK) {
      p->fsrcs = (const uint8_t **)calloc(m1, sizeof *p->fsrcs);
      if (p->fsrcs == NULL)
        st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ message table");
    }
  }
  if (st == ZPP_OK && p->idev && p->nchunks > 0) { /* the tables, no scratch */
    size_t w = (size_t)zpp_transport_size(ex->t);
    p->iabs = (zpp_isum_cuda_absmax_run_t *)calloc(w, sizeof *p->iabs);
    p->ienc = (zpp_isum_cuda_encode_run_t *)calloc(s1 * m1, sizeof *p->ienc);
    p->isr = (zpp_isum_cuda_sum_run_t *)calloc(m1, sizeof *p->isr);
    p->ireq = (zpp_isum_cuda_requant_run_t *)calloc(m1, sizeof *p->ireq);
    p->isrcs = (const uint8_t **)calloc(s1 * m1, sizeof *p->isrcs);
    if (p->iabs == NULL || p->ienc == NULL || p->isr == NULL ||
        p->ireq == NULL || p->isrcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ integer-sum tables");
    if (st == ZPP_OK && a->residual != NULL && a->residual_bits == 8)
      p->res_seg = zpp_coll_encoded_size(&a->qr, a->count);
    return st;
  }
  if (st == ZPP_OK && p->batch) { /* the tables; no per-slice scratch */
    size_t ne = (s1 - 1) * m1 > m1 ? (s1 - 1) * m1 : m1;
    p->eruns = (zpp_qb_enc_run_t *)calloc(ne, sizeof *p->eruns);
    p->sruns = (zpp_qb_sum_run_t *)calloc(m1, sizeof *p->sruns);
    p->hruns = (zpp_tf_run_t *)calloc(m1, sizeof *p->hruns);
    p->bsrcs = (const void **)calloc(s1 * m1, sizeof *p->bsrcs);
    if (p->eruns == NULL || p->sruns == NULL || p->hruns == NULL ||
        p->bsrcs == NULL)
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "qgZ batch tables");
    if (st == ZPP_OK && a->residual != NULL && a->residual_bits == 8)
      p->res_seg = zpp_coll_encoded_size(&a->qr, a->count);
    return st;
  }
  if (st == ZPP_OK && (a->residual != NULL || a->hadamard) && p->nchunks > 0)
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp);
  if (st == ZPP_OK && a->residual != NULL && a->residual_bits == 8 &&
      p->nchunks > 0) {
    p->res_seg = zpp_coll_encoded_size(&a->qr, a->count);
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp2);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, zpp_coll_encoded_size(&a->qr, p->chunk),
                       (void **)&p->rs);
  }
  if (st == ZPP_OK && a->residual != NULL && a->beta != 0.0f &&
      p->nchunks > 0)
    st = zpp_k_alloc(ex, p->chunk * sizeof(float), (void **)&p->tmp3);
  return st;
}

/* The plan.  Per chunk k in slot k % QGZ_DEPTH:
 *   E_k   stage 1 encode                 (after K_{k-3})
 *   N_k   all-to-all in g1               (after E_k)
 *   X_k   two levels: stage 1 reduce of the partial sums other nodes
 *         keep; stage 2 encode           (after N_k, C_{k-3}: the latter
 *                                         also follows from E_k, kept to
 *                                         name the s2 hazard)
 *   C_k   two levels: all-to-all in CROSS (after X_k)
 *   K_k   stage 1 reduce of the partial sum this node keeps; two levels:
 *         stage 2 reduce; the finish     (one level: after N_k; two:
 *                                         after C_k, so after N_k too)
 * appended in the order X_{k-1} C_{k-1} E_k N_k K_{k-1}, so transfers
 * start in the order N0 C0 N1 C1 N2 ..., the same on every rank.  Kernel
 * steps run in index order as soon as they are ready: a chunk's partial
 * sums for the other nodes go on the wire before its own node's is summed,
 * and the next chunk's encode comes before that sum too, so the engine
 * sums and finishes one chunk while the next ones cross the network.  Each
 * partial sum is made as in one step, in the same order: the bits do not
 * depend on the split. */
static zpp_status_t qgz_plan(const char *func, qgz_ctx_t *p,
                             zpp_request_t *req) {
  const qgz_arg_t *a = &p->a;
  const zpp_exec_t *ex = &a->ex;
  zpp_comm_t comm = ex->comm; /* p (and ex) are freed on failure */
  zpp_plan_t *plan;
  zpp_status_t st;
  size_t k, n;
  int i, kfree[QGZ_DEPTH], cprev[QGZ_DEPTH], nstep[QGZ_DEPTH];
  p->topo = zpp_transport_topo(ex->t);
  p->two = qgz_two_level(ex->t);
  p->g1 = p->two ? ZPP_GROUP_NODE : ZPP_GROUP_WORLD;
  p->s1 = zpp_transport_group_size(ex->t, p->g1);
  p->m1 = p->two ? p->topo->nnodes : 1;
  p->raw1 = qgz_raw1(ex->t, a->q1.bits);
  if (a->q1.bits == ZPP_QGZ_INTRA_RAW && !p->raw1)
    p->a.q1.bits = a->q2.bits; /* uneven nodes: the flat stage crosses */
  /* the rotation only serves quantization: none on one rank */
  p->rot1 = a->hadamard && !p->raw1 && zpp_transport_size(ex->t) > 1;
  p->rot2 = a->hadamard && p->raw1 && p->two;
  p->seg2 = p->raw1 ? 0 : (size_t)zpp_transport_size(ex->t);
  p->me1 = zpp_transport_group_rank(ex->t, p->g1);
  p->mo = p->two ? zpp_transport_group_rank(ex->t, ZPP_GROUP_CROSS) : 0;
  p->chunk = a->count;
  if (ex->mem == ZPP_MEMORY_HOST && zpp_transport_size(ex->t) > 1 &&
      a->count > 0)
    p->chunk = zpp_plan_chunk(a->count, a->q1.block_size, QGZ_PARTS);
  p->nchunks = n = a->count == 0 ? 0 : (a->count + p->chunk - 1) / p->chunk;
  p->batch =
      ex->mem != ZPP_MEMORY_HOST &&
      zpp_k_encode_batch_ok(ex, a->q1.block_size, p->rot1 ? a->hadamard : 0);
  p->idev = a->isum && ex->mem != ZPP_MEMORY_HOST;
  st = qgz_alloc(func, p);
  if (st != ZPP_OK) {
    qgz_release(p);
    return zpp_comm_fail(comm, st);
  }
  ZPP_CHECK(zpp_comm_fail(comm,
                          zpp_plan_create(func, ex, p, qgz_release, &plan)));
  ZPP_TRACE(ZPP_SUBSYS_COLL, "qgZ: %s, %zu chunk(s) of %zu elements",
            p->two ? "two levels" : "one level", n, p->chunk);
  for (i = 0; i < QGZ_DEPTH; i++)
    kfree[i] = cprev[i] = nstep[i] = ZPP_NO_STEP;
  if (a->isum && n > 0) { /* the scale agreement, before every encode */
    int s = zpp_plan_kernel(plan, isum_absmax, 0, ZPP_NO_STEP, ZPP_NO_STEP);
    /* an all-gather of the exponent bytes, (s1 - 1) W nb sent per rank;
     * a max all-reduce would send about 2 (s1 - 1) / s1 W nb, but the
     * transports reduce only SUM/MEAN of floating-point dtypes
     * (docs/collectives.md, "Compressed-domain sums") */
    if (p->s1 > 1) {
      zpp_xfer_desc_t x;
      memset(&x, 0, sizeof x);
      x.kind = ZPP_XFER_ALLGATHER;
      x.group = p->g1;
      x.send = p->uexp_mine;
      x.recv = p->uexp_all;
      x.bytes = (size_t)zpp_transport_size(ex->t) * p->nb;
      s = zpp_plan_xfer(plan, &x, s, ZPP_NO_STEP);
      s = zpp_plan_kernel(plan, isum_agree, 0, s, ZPP_NO_STEP);
    }
    for (i = 0; i < QGZ_DEPTH; i++)
      kfree[i] = s;
  }
  for (k = 0; n > 0 && k <= n; k++) {
    size_t j = k - 1; /* the previous chunk (unused at k = 0) */
    int c = ZPP_NO_STEP;
    if (k >= 1 && p->two) {
      int sl = (int)(j % QGZ_DEPTH);
      int t = j + 1 == n;
      zpp_xfer_desc_t x = a2a(ZPP_GROUP_CROSS, p->slot[sl].s2, p->slot[sl].r2,
                              p->lay2[t].bytes, p->lay2[t].displs);
      int r = zpp_plan_kernel(plan, stage1_reduce_x, j, nstep[sl], cprev[sl]);
      c = cprev[sl] = zpp_plan_xfer(plan, &x, r, ZPP_NO_STEP); /* C_j */
    }
    if (k < n) {
      int sl = (int)(k % QGZ_DEPTH);
      int t = k + 1 == n;
      zpp_xfer_desc_t x = a2a(p->g1, p->slot[sl].s1, p->slot[sl].r1,
                              p->lay1[t].bytes, p->lay1[t].displs);
      int e = zpp_plan_kernel(plan, stage1_encode, k, kfree[sl], ZPP_NO_STEP);
      nstep[sl] = zpp_plan_xfer(plan, &x, e, ZPP_NO_STEP); /* N_k */
    }
    if (k >= 1) {
      int sl = (int)(j % QGZ_DEPTH); /* nstep[sl]: N_j (N_k is in another) */
      kfree[sl] = zpp_plan_kernel(plan, stage2_keep, j,
                                  p->two ? c : nstep[sl], ZPP_NO_STEP);
    }
  }
  return zpp_plan_submit(plan, req);
}

/* sizeof(zpp_qgz_config_t) of revision 1: the fields up to `mode`. */
#define QGZ_CONFIG_V1_SIZE                                                     \
  ((offsetof(zpp_qgz_config_t, mode) + sizeof(zpp_quant_mode_t) +            \
    sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t))

static zpp_status_t check_cfg(const char *func, const zpp_qgz_config_t *in) {
  zpp_qgz_config_t cc;
  const zpp_qgz_config_t *c = &cc;
  if (in == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "cfg is NULL");
  if (in->struct_size < QGZ_CONFIG_V1_SIZE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->struct_size %zu: initialise with "
                     "ZPP_QGZ_CONFIG_INIT",
                     in->struct_size);
  qgz_config_get(in, &cc);
  if (c->intra_bits != 4 && c->intra_bits != 8 &&
      c->intra_bits != ZPP_QGZ_INTRA_RAW)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->intra_bits %d: must be 4, 8 or 16 "
                     "(ZPP_QGZ_INTRA_RAW: not quantized inside the node)",
                     c->intra_bits);
  if (c->inter_bits != 4 && c->inter_bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->inter_bits %d: must be 4 or 8", c->inter_bits);
  if (c->block_size < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->block_size 0: must be >= 1");
  if (c->mode != ZPP_QUANT_SYMMETRIC && c->mode != ZPP_QUANT_ASYMMETRIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->mode %d: must be ZPP_QUANT_SYMMETRIC or "
                     "ZPP_QUANT_ASYMMETRIC",
                     (int)c->mode);
  if (c->hadamard != 0 &&
      (c->hadamard < 2 || (c->hadamard & (c->hadamard - 1)) != 0 ||
       c->block_size % c->hadamard != 0))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->hadamard %zu: must be 0 (off) or a power of two "
                     ">= 2 that divides block_size %zu",
                     c->hadamard, c->block_size);
  if (c->rounding != ZPP_ROUND_NEAREST && c->rounding != ZPP_ROUND_STOCHASTIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->rounding %d: must be ZPP_ROUND_NEAREST or "
                     "ZPP_ROUND_STOCHASTIC",
                     (int)c->rounding);
  if (c->residual_bits != 32 && c->residual_bits != 8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->residual_bits %d: must be 32 (fp32) or 8 (INT8)",
                     c->residual_bits);
  if (c->sum != ZPP_QGZ_SUM_DEFAULT && c->sum != ZPP_QGZ_SUM_FLOAT &&
      c->sum != ZPP_QGZ_SUM_INT)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->sum %d: must be ZPP_QGZ_SUM_DEFAULT, "
                     "ZPP_QGZ_SUM_FLOAT or ZPP_QGZ_SUM_INT",
                     c->sum);
  if (c->sum == ZPP_QGZ_SUM_INT && c->mode != ZPP_QUANT_SYMMETRIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->sum ZPP_QGZ_SUM_INT: needs cfg->mode "
                     "ZPP_QUANT_SYMMETRIC (integer sums share a scale, "
                     "not a zero point)");
  if (c->sum == ZPP_QGZ_SUM_INT && c->intra_bits == ZPP_QGZ_INTRA_RAW)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->sum ZPP_QGZ_SUM_INT: needs cfg->intra_bits 4 or "
                     "8 (ZPP_QGZ_INTRA_RAW has no codes to sum)");
  if (c->sum == ZPP_QGZ_SUM_INT && c->hadamard != 0)
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "cfg->sum ZPP_QGZ_SUM_INT with cfg->hadamard %zu: the "
                     "rotation is not implemented for integer sums",
                     c->hadamard);
  if (!(c->residual_beta >= 0.0f && c->residual_beta < 1.0f))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "cfg->residual_beta %g: must be in [0, 1) (0: plain "
                     "error feedback; LoCo: 0.8)",
                     (double)c->residual_beta);
  return ZPP_OK;
}

/* The ranks of stage 1, which sum together: the node on two levels, else
 * the world (one node, or the flat stage of uneven nodes). */
static int isum_stage_size(const zpp_transport_t *t) {
  return zpp_transport_group_size(t, qgz_two_level(t) ? ZPP_GROUP_NODE
                                                      : ZPP_GROUP_WORLD);
}

/* The most ranks per stage whose integer sums fit the kernels' range:
 * codes up to qmax1 times multipliers up to 255 (plus a unit of rounding
 * of the own share), s1 255 (qmax1 + 1) <= ZPP_QM_ISUM_MAX (INT8: 128
 * ranks per stage; INT4: 2056). */
static int isum_max_ranks(int intra_bits) {
  return ZPP_QM_ISUM_MAX /
         (ZPP_QM_UMULT_MAX * (zpp_qm_sym_qmax(intra_bits) + 1));
}

static int isum_fits(const zpp_transport_t *t, int intra_bits) {
  return (uint64_t)isum_stage_size(t) * ZPP_QM_UMULT_MAX *
             (uint64_t)(zpp_qm_sym_qmax(intra_bits) + 1) <=
         ZPP_QM_ISUM_MAX;
}

/* Whether a call of config c (checked) sums in the compressed domain:
 * ZPP_QGZ_SUM_INT, or DEFAULT with the setting ZPP_QGZ_SUM=int and a
 * config that allows it (host or device memory alike).  One rank
 * quantizes nothing either way. */
static int qgz_isum(const zpp_qgz_config_t *c, const zpp_transport_t *t) {
  int want = c->sum == ZPP_QGZ_SUM_INT;
  if (c->sum == ZPP_QGZ_SUM_DEFAULT)
    want = zpp_transport_qgz_sum_int(t) && c->mode == ZPP_QUANT_SYMMETRIC &&
           c->intra_bits != ZPP_QGZ_INTRA_RAW && c->hadamard == 0 &&
           isum_fits(t, c->intra_bits);
  return want && zpp_transport_size(t) > 1;
}

/* The residual is read and written between the encodes that read
 * sendbuf and the finish that writes recvbuf: it may share no byte with
 * either (cfg and the buffers already checked). */
static zpp_status_t check_residual_overlap(const char *func,
                                           const zpp_exec_t *ex,
                                           const zpp_qgz_config_t *cfg,
                                           const void *sendbuf,
                                           const void *recvbuf, size_t count,
                                           zpp_dtype_t dtype,
                                           const void *residual) {
  size_t rb, one = count * zpp_dtype_size(dtype);
  size_t all = one * (size_t)zpp_transport_size(ex->t);
  ZPP_CHECK(zpp_qgz_residual_bytes(ex->comm, cfg, count, &rb));
  ZPP_CHECK(zpp_coll_check_overlap(func, ex, "sendbuf", sendbuf, all,
                                   "residual", residual, rb, 0));
  return zpp_coll_check_overlap(func, ex, "recvbuf", recvbuf, one, "residual",
                                residual, rb, 0);
}

/* What qgZ's own checks read besides the common arguments. */
typedef struct {
  const zpp_qgz_config_t *cfg;
  void *residual;
} qgz_args_t;

/* The prologue's first check: the qgZ config. */
static zpp_status_t qgz_pre(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  (void)ex;
  return check_cfg(a->func, ((const qgz_args_t *)a->ctx)->cfg);
}

/* The prologue's last checks, in qgZ's order: the residual's size fits,
 * then the buffers (as ZPP_BUFS_SCATTER would check them), the residual in
 * device memory and apart from them; then the config words compared under
 * ZPP_CHECK. */
static zpp_status_t qgz_post(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  const zpp_qgz_config_t *cfg = ((const qgz_args_t *)a->ctx)->cfg;
  void *residual = ((const qgz_args_t *)a->ctx)->residual;
  zpp_qgz_config_t cf = ZPP_QGZ_CONFIG_INIT;
  uint32_t bb;
  size_t rc; /* only checked, so an overflowing residual size fails */
  /* its only failure here: the size overflows; named after the call */
  if (zpp_qgz_residual_count(a->comm, a->count, &rc) != ZPP_OK)
    return zpp_error(ZPP_ERR_OVERFLOW, a->func,
                     "count %zu: the residual (zpp_qgz_residual_count "
                     "floats) overflows size_t",
                     a->count);
  ZPP_CHECK(zpp_coll_check_bufs(a->func, ex, ZPP_BUFS_SCATTER, a->send,
                                a->recv, a->count, a->dtype));
  if (a->count > 0)
    ZPP_CHECK(zpp_coll_check_device_buf(a->func, ex, "residual", residual));
  if (residual != NULL)
    ZPP_CHECK(check_residual_overlap(a->func, ex, cfg, a->send, a->recv,
                                     a->count, a->dtype, residual));
  qgz_config_get(cfg, &cf);
  if (cf.sum == ZPP_QGZ_SUM_INT && !isum_fits(ex->t, cf.intra_bits))
    return zpp_error(ZPP_ERR_UNSUPPORTED, a->func,
                     "cfg->sum ZPP_QGZ_SUM_INT with cfg->intra_bits %d: "
                     "%d ranks sum in stage 1 (%s), more than the integer "
                     "sums hold (%d at most)",
                     cf.intra_bits, isum_stage_size(ex->t),
                     qgz_two_level(ex->t) ? "the node" : "the world",
                     isum_max_ranks(cf.intra_bits));
  /* packed so that every field is compared within the 5 words; the sum
   * as resolved (the setting may differ between ranks) */
  a->words[0] = (uint64_t)cf.intra_bits | (uint64_t)cf.inter_bits << 8 |
                (uint64_t)cf.mode << 16 | (uint64_t)cf.rounding << 24 |
                (uint64_t)cf.residual_bits << 32 |
                (uint64_t)qgz_isum(&cf, ex->t) << 40;
  a->words[1] = (uint64_t)cf.block_size;
  /* two fields per word where needed: a mismatch of either changes it */
  a->words[2] = (uint64_t)cf.hadamard ^ (uint64_t)cf.residual_reset << 32;
  a->words[3] = cf.seed ^ (cf.step * 0x9e3779b97f4a7c15ull);
  memcpy(&bb, &cf.residual_beta, sizeof bb);
  a->words[4] = (uint64_t)bb << 32 | (residual != NULL);
  return ZPP_OK;
}

zpp_status_t zpp_qgz_reduce_scatter(zpp_comm_t comm,
                                    const zpp_qgz_config_t *cfg,
                                    const void *sendbuf, void *recvbuf,
                                    size_t count, zpp_dtype_t dtype,
                                    zpp_redop_t op, void *residual,
                                    zpp_stream_t stream, zpp_request_t *req) {
  zpp_coll_args_t a;
  qgz_args_t g;
  zpp_exec_t ex;
  qgz_ctx_t *c;
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  zpp_qgz_config_t cf = ZPP_QGZ_CONFIG_INIT;
  a = zpp_coll_args_init(__func__, comm, stream, sendbuf, recvbuf, count,
                         dtype);
  a.op_word = (int)op;
  a.op = op;
  a.check_op = 1;
  a.layout = ZPP_BUFS_NONE; /* qgz_post, after the residual's size */
  a.pre = qgz_pre;
  a.post = qgz_post;
  g.cfg = cfg;
  g.residual = residual;
  a.ctx = &g;
  a.nwords = 5;
  a.words[4] = residual != NULL;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  qgz_config_get(cfg, &cf);
  c = (qgz_ctx_t *)calloc(1, sizeof *c);
  if (c == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                         "plan context"));
  q.block_size = cf.block_size;
  q.mode = cf.mode;
  q.rounding = cf.rounding;
  q.seed = cf.seed;
  c->a.ex = ex;
  c->a.q1 = q;
  c->a.q1.bits = cf.intra_bits;
  c->a.q2 = q;
  c->a.q2.bits = cf.inter_bits;
  c->a.qr = residual_q8(cf.block_size);
  c->a.hadamard = cf.hadamard;
  c->a.residual_bits = cf.residual_bits;
  c->a.beta = cf.residual_beta;
  c->a.reset = cf.residual_reset > 0 && cf.step > 0 &&
               cf.step % cf.residual_reset == 0;
  c->a.send = sendbuf;
  c->a.recv = recvbuf;
  c->a.count = count;
  c->a.dtype = dtype;
  c->a.op = op;
  c->a.residual = residual;
  c->a.isum = qgz_isum(&cf, ex.t);
  return qgz_plan(__func__, c, req);
}
