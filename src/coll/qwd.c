/*
 * qWD: all-gather of quantized weight differences (SDP4Bit), written
 * as a plan of transfer descriptors and kernel steps (src/engine/exec.h).
 *
 * For runtimes that keep the full parameters between steps (ZeRO-1/2):
 * every rank holds the same reconstruction `recon` of the full tensor.
 * After the optimizer step, rank r sends d_r = target_r - fp32(recon_r)
 * (its fp32 master shard minus its slice of the reconstruction), encoded;
 * every rank adds every decoded difference to its copy:
 *   recon_r <- dtype(fp32(recon_r) + decode(encode(d_r)))
 * Every rank decodes the same bytes with the same code and adds them to
 * the same values, so the copies stay bitwise identical; and since each
 * difference is taken against the reconstruction itself, the error after
 * a step is that of one quantization of one difference: it does not
 * accumulate (docs/collectives.md, "qWD").
 */
#include "coll/coll.h"
#include "comm/comm.h"
#include "core/core.h"
#include "engine/plan.h"
#include "quant/quant.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q;
  const float *target;
  void *recon;
  size_t count;
  zpp_dtype_t dtype;
  int n, me;
  uint8_t *all; /* n encoded differences; mine at me * E */
  float *tmp;   /* my difference, then one decoded difference */
} qwd_ctx_t;

static void qwd_release(void *p) {
  qwd_ctx_t *c = (qwd_ctx_t *)p;
  zpp_k_free(&c->ex, c->tmp);
  zpp_k_free(&c->ex, c->all);
  free(c);
}

/* My difference, encoded into my block of `all`. */
static zpp_status_t qwd_encode(void *p, size_t arg) {
  qwd_ctx_t *c = (qwd_ctx_t *)p;
  size_t e = zpp_coll_encoded_size(&c->q, c->count);
  size_t ds = zpp_dtype_size(c->dtype);
  (void)arg;
  ZPP_CHECK(zpp_k_wdiff(&c->ex, c->dtype,
                        (uint8_t *)c->recon + (size_t)c->me * c->count * ds,
                        c->target, c->count, c->tmp));
  /* stochastic rounding draws at the element's index in the whole tensor */
  return zpp_k_encode_at(&c->ex, &c->q, ZPP_FLOAT32, c->tmp, c->count,
                         (uint64_t)c->me * (uint64_t)c->count,
                         c->all + (size_t)c->me * e);
}

/* Every rank's decoded difference added to its slice of recon. */
static zpp_status_t qwd_apply(void *p, size_t arg) {
  qwd_ctx_t *c = (qwd_ctx_t *)p;
  size_t e = zpp_coll_encoded_size(&c->q, c->count);
  size_t ds = zpp_dtype_size(c->dtype);
  int r;
  (void)arg;
  for (r = 0; r < c->n; r++) {
    uint8_t *rec = (uint8_t *)c->recon + (size_t)r * c->count * ds;
    const uint8_t *enc = c->all + (size_t)r * e;
    if (c->dtype == ZPP_FLOAT32) { /* one fp32 addition, in place */
      ZPP_CHECK(zpp_k_decode_acc(&c->ex, &c->q, enc, c->count, (float *)rec));
      continue;
    }
    ZPP_CHECK(zpp_k_decode(&c->ex, &c->q, enc, c->count, ZPP_FLOAT32, c->tmp));
    ZPP_CHECK(zpp_k_add_residual(&c->ex, c->dtype, rec, c->tmp, c->count,
                                 c->tmp));
    ZPP_CHECK(zpp_k_finish(&c->ex, c->tmp, c->count, 1.0f, c->dtype, rec));
  }
  return ZPP_OK;
}

/* The plan: D (difference and encode), X (all-gather), A (apply). */
static zpp_status_t qwd_plan(const char *func, qwd_ctx_t *c,
                             zpp_request_t *req) {
  const zpp_exec_t *ex = &c->ex;
  zpp_comm_t comm = ex->comm; /* c (and ex) are freed on failure */
  size_t e = zpp_coll_encoded_size(&c->q, c->count);
  zpp_plan_t *p;
  zpp_xfer_desc_t x;
  zpp_status_t st = ZPP_OK;
  int d, xs;
  c->n = zpp_transport_size(ex->t);
  c->me = zpp_transport_rank(ex->t);
  if (c->count > 0) {
    st = zpp_k_alloc(ex, (size_t)c->n * e, (void **)&c->all);
    if (st == ZPP_OK)
      st = zpp_k_alloc(ex, c->count * sizeof(float), (void **)&c->tmp);
  }
  if (st != ZPP_OK) {
    qwd_release(c);
    return zpp_comm_fail(comm, st);
  }
  ZPP_CHECK(zpp_comm_fail(comm,
                          zpp_plan_create(func, ex, c, qwd_release, &p)));
  if (c->count > 0) {
    d = zpp_plan_kernel(p, qwd_encode, 0, ZPP_NO_STEP, ZPP_NO_STEP);
    memset(&x, 0, sizeof x);
    x.kind = ZPP_XFER_ALLGATHER;
    x.group = ZPP_GROUP_WORLD;
    x.send = c->all + (size_t)c->me * e;
    x.recv = c->all;
    x.bytes = e;
    xs = zpp_plan_xfer(p, &x, d, ZPP_NO_STEP);
    zpp_plan_kernel(p, qwd_apply, 0, xs, ZPP_NO_STEP);
  }
  return zpp_plan_submit(p, req);
}

/* The prologue's last checks: target's size, no in-place form, and the
 * config words compared under ZPP_CHECK. */
static zpp_status_t qwd_post(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  zpp_quant_config_t q;
  if (a->count > SIZE_MAX / sizeof(float))
    return zpp_error(ZPP_ERR_OVERFLOW, a->func,
                     "count %zu: target (count x 4 bytes) overflows size_t",
                     a->count);
  /* No in-place form: the difference is taken against recon's old slice,
   * which a target stored there would have overwritten (zpp_coll.h). */
  ZPP_CHECK(zpp_coll_check_overlap(a->func, ex, "recon", a->recv,
                                   (size_t)zpp_transport_size(ex->t) *
                                       a->count * zpp_dtype_size(a->dtype),
                                   "target", a->send,
                                   a->count * sizeof(float), 0));
  zpp_quant_config_get(a->quant, &q);
  a->words[0] = (uint64_t)q.bits;
  a->words[1] = (uint64_t)q.block_size;
  a->words[2] = (uint64_t)q.mode | (uint64_t)q.rounding << 8;
  a->words[3] = q.seed;
  a->nwords = 4;
  return ZPP_OK;
}

zpp_status_t zpp_qwd_allgather(zpp_comm_t comm, const zpp_quant_config_t *quant,
                               const float *target, void *recon, size_t count,
                               zpp_dtype_t dtype, zpp_stream_t stream,
                               zpp_request_t *req) {
  zpp_coll_args_t a;
  zpp_exec_t ex;
  zpp_quant_config_t q;
  qwd_ctx_t *c;
  a = zpp_coll_args_init(__func__, comm, stream, target, recon, count, dtype);
  a.op_word = -2;
  a.layout = ZPP_BUFS_NAMED; /* named as in zpp_coll.h */
  a.send_name = "target";
  a.recv_name = "recon";
  a.quant = quant;
  a.quant_name = "quant";
  a.quant_fp = "quant->";
  a.post = qwd_post;
  a.nwords = 4;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  zpp_quant_config_get(quant, &q);
  c = (qwd_ctx_t *)calloc(1, sizeof *c);
  if (c == NULL)
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                                         "plan context"));
  c->ex = ex;
  c->q = q;
  c->target = target;
  c->recon = recon;
  c->count = count;
  c->dtype = dtype;
  return qwd_plan(__func__, c, req);
}
