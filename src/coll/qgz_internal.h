/*
 * What the files of qgZ share (src/coll/qgz.c: the plan; qgz_float.c:
 * the steps that sum in fp32; qgz_int.c: the steps that sum in the
 * compressed domain, ZPP_QGZ_SUM_INT): the state of one call and the
 * layout of its slices, chunks and messages.  Private to src/coll.
 */
#ifndef ZPP_SRC_COLL_QGZ_INTERNAL_H
#define ZPP_SRC_COLL_QGZ_INTERNAL_H

#include "coll/coll.h"
#include "core/core.h"
#include "engine/exec.h"
#include "kernels/quant_cpu.h"
#include "kernels/quant_math.h"
#include "topology/topo.h"
#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>
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

#define QGZ_DEPTH 3 /* chunk slots in flight */
/* qgz_plan appends N_k before K_{k-1} and relies on their slots differing */
_Static_assert(QGZ_DEPTH >= 2, "QGZ_DEPTH");

/* The state of one call: stage 1 sends, to each member j of group g1, the
 * chunk of slices slice(j, 0..m1-1) (to itself: nothing); stage 2 (two
 * levels only) sends partial sum m to CROSS member m (to itself:
 * nothing). */
typedef struct {
  qgz_arg_t a;
  const zpp_topo_t *topo;
  zpp_group_t g1;
  int s1, m1, two;
  int raw1; /* stage 1 moves the dtype, unquantized (ZPP_QGZ_INTRA_RAW) */
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
    float *accx;      /* X: m1 - 1 partial sums of the chunk */
    uint8_t *s2, *r2; /* stage 2 (two levels), m1 parts (own: unused) */
    float *acco;      /* O: the kept partial sum, then the result */
  } slot[QGZ_DEPTH];
} qgz_ctx_t;

static inline int qgz_slice_of(const qgz_ctx_t *p, int j, int m) {
  if (!p->two)
    return zpp_transport_group_member(p->a.ex.t, p->g1, j);
  return p->topo->node_ranks[p->topo->node_off[m] + j];
}

static inline size_t qgz_chunk_len(const qgz_ctx_t *p, size_t k) {
  size_t off = k * p->chunk;
  return p->a.count - off < p->chunk ? p->a.count - off : p->chunk;
}

/* Bytes of one stage-1 message part: `len` elements encoded, or in the
 * dtype when stage 1 is raw. */
static inline size_t qgz_s1_bytes(const qgz_ctx_t *p, size_t len) {
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

/* Where part m of the stage-1 message to (or from) member j lies in a
 * slot's s1 (or r1): member after member, each its m1 parts of e1 bytes in
 * node order. */
static inline size_t qgz_s1_at(const qgz_ctx_t *p, int j, int m, size_t e1) {
  return ((size_t)j * (size_t)p->m1 + (size_t)m) * e1;
}

/* The stage-1 messages of partial sum m of chunk k from the other members,
 * in member order, into srcs; their number (s1 - 1). */
static inline int qgz_s1_srcs(const qgz_ctx_t *p, size_t k, int m,
                              const void **srcs) {
  size_t e1 = qgz_s1_bytes(p, qgz_chunk_len(p, k));
  const uint8_t *r1 = p->slot[k % QGZ_DEPTH].r1;
  int j, n = 0;
  for (j = 0; j < p->s1; j++)
    if (j != p->me1)
      srcs[n++] = r1 + qgz_s1_at(p, j, m, e1);
  return n;
}

/* The finish's divisor: the world size for MEAN, else 1. */
static inline float qgz_div(const qgz_ctx_t *p) {
  return p->a.op == ZPP_OP_MEAN ? (float)zpp_transport_size(p->a.ex.t) : 1.0f;
}

/* Stochastic rounding: the config of one encode, with a seed of its own
 * for each (stage, rank, slice or partial sum), so no two encodes of a
 * call share random bits; elements draw at their index in the slice. */
static inline zpp_quant_config_t qgz_stream_q(const zpp_quant_config_t *q,
                                              int stage, int rank, int slice) {
  zpp_quant_config_t r = *q;
  if (r.rounding == ZPP_ROUND_STOCHASTIC) {
    zpp_qm_keys_t k = zpp_qm_rng_keys(q->seed ^ ((uint64_t)stage << 62));
    r.seed = ((uint64_t)k.k1 << 32 | k.k0) ^
             ((uint64_t)(uint32_t)rank << 32 | (uint32_t)slice);
  }
  return r;
}

/* Where the residual of slice (or partial sum) `seg` starts at element
 * `off`, as encode_ef (qgz_float.c) finds it (used by the batched and
 * device message tables and by qgz_res8_load / qgz_res8_store): fp32,
 * seg * count + off floats in; INT8, segment seg's blocks from off /
 * block on, their scales and their codes. */
static inline void qgz_residual_at(const qgz_ctx_t *p, size_t seg, size_t off,
                                   void **res, uint8_t **res_codes) {
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

/* INT8 residual (a.residual_bits 8): the blocks of segment seg that hold
 * the `len` elements at `off` (chunks are whole blocks, so they own whole
 * blocks) gathered into p->rs, their scales then their codes, and decoded
 * into buf (fp32). */
static inline zpp_status_t qgz_res8_load(qgz_ctx_t *p, size_t seg, size_t off,
                                         size_t len, float *buf) {
  const qgz_arg_t *a = &p->a;
  size_t nb = (len + a->qr.block_size - 1) / a->qr.block_size;
  void *scales;
  uint8_t *codes;
  qgz_residual_at(p, seg, off, &scales, &codes);
  ZPP_CHECK(zpp_k_copy(&a->ex, p->rs, scales, nb * 4));
  ZPP_CHECK(zpp_k_copy(&a->ex, p->rs + nb * 4, codes, len));
  return zpp_k_decode(&a->ex, &a->qr, p->rs, len, ZPP_FLOAT32, buf);
}

/* The way back: buf (the new errors) encoded into p->rs and scattered
 * into those blocks of segment seg. */
static inline zpp_status_t qgz_res8_store(qgz_ctx_t *p, size_t seg, size_t off,
                                          size_t len, const float *buf) {
  const qgz_arg_t *a = &p->a;
  size_t nb = (len + a->qr.block_size - 1) / a->qr.block_size;
  void *scales;
  uint8_t *codes;
  qgz_residual_at(p, seg, off, &scales, &codes);
  ZPP_CHECK(zpp_k_encode(&a->ex, &a->qr, ZPP_FLOAT32, buf, len, p->rs));
  ZPP_CHECK(zpp_k_copy(&a->ex, scales, p->rs, nb * 4));
  return zpp_k_copy(&a->ex, codes, p->rs + nb * 4, len);
}

/* The two sets of stage 1's partial sums. */
enum { QGZ_HALF_X = 0, QGZ_HALF_O = 1 };

static inline int qgz_half_parts(const qgz_ctx_t *p, int h) {
  return h == QGZ_HALF_O ? 1 : p->m1 - 1;
}

/* The partial sum (node index) of part i of set h: X skips mo. */
static inline int qgz_half_part(const qgz_ctx_t *p, int h, int i) {
  if (h == QGZ_HALF_O)
    return p->mo;
  return i < p->mo ? i : i + 1;
}

/* Chunk k of this rank's own slice of partial sum m, in sendbuf. */
static inline const void *qgz_own_ptr(const qgz_ctx_t *p, size_t k, int m) {
  size_t at = (size_t)qgz_slice_of(p, p->me1, m) * p->a.count + k * p->chunk;
  return (const uint8_t *)p->a.send + at * zpp_dtype_size(p->a.dtype);
}

/* Stage 1's partial sums come from zpp_k_sum_decoded (its message table
 * p->srcs) unless stage 1 is raw or rotated.  The integer sums
 * (qgz_int.c) fill p->srcs too, through qgz_s1_srcs: they run with
 * neither (qgz_isum picks FLOAT for a raw or rotated stage 1, check_cfg
 * refuses INT asked for with either), so p->srcs is there for them. */
static inline int qgz_sum_in_one_call(const qgz_ctx_t *p) {
  return !p->raw1 && !p->rot1;
}

/* The steps that sum in fp32 (qgz_float.c), each for chunk k: stage 1's
 * encode; set X (the partial sums other nodes keep, two levels) with
 * stage 2's encode; set O (the partial sum this node keeps) with stage
 * 2's reduce and the finish. */
zpp_status_t zpp_qgz_float_encode(qgz_ctx_t *p, size_t k);
zpp_status_t zpp_qgz_float_reduce_x(qgz_ctx_t *p, size_t k);
zpp_status_t zpp_qgz_float_keep(qgz_ctx_t *p, size_t k);

/* The steps of compressed-domain sums (qgz_int.c), host or device memory:
 * before the chunks, the absmax of every block and this rank's exponents
 * (a plan kernel step), then, after the all-gather of the exponents, their
 * max (a plan kernel step, s1 > 1); per chunk k the same three steps as
 * the float path's.  zpp_qgz_int_alloc makes the buffers and tables of a
 * call with a.isum and at least one chunk. */
zpp_status_t zpp_qgz_int_absmax(void *ctx, size_t unused);
zpp_status_t zpp_qgz_int_agree(void *ctx, size_t unused);
zpp_status_t zpp_qgz_int_encode(qgz_ctx_t *p, size_t k);
zpp_status_t zpp_qgz_int_reduce_x(qgz_ctx_t *p, size_t k);
zpp_status_t zpp_qgz_int_keep(qgz_ctx_t *p, size_t k);
zpp_status_t zpp_qgz_int_alloc(const char *func, qgz_ctx_t *p);

#endif /* ZPP_SRC_COLL_QGZ_INTERNAL_H */
