/*
 * qWD: all-gather of quantized weight differences (SDP4Bit), written
 * against the transport table and the kernel dispatch (coll_internal.h).
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
#include "coll_internal.h"
#include "internal.h"

#include <stdint.h>
#include <string.h>

typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q;
  const float *target;
  void *recon;
  size_t count;
  zpp_dtype_t dtype;
} qwd_arg_t;

static zpp_status_t qwd_run(void *arg) {
  qwd_arg_t *a = (qwd_arg_t *)arg;
  const zpp_exec_t *ex = &a->ex;
  int n = zpp_transport_size(ex->t), me = zpp_transport_rank(ex->t), r;
  size_t e = zpp_coll_encoded_size(&a->q, a->count);
  size_t ds = zpp_dtype_size(a->dtype);
  uint8_t *all = NULL;
  float *tmp = NULL;
  zpp_status_t st;
  if (a->count == 0)
    return ZPP_OK;
  ZPP_CHECK_GOTO(zpp_k_alloc(ex, (size_t)n * e, (void **)&all), st, out);
  ZPP_CHECK_GOTO(zpp_k_alloc(ex, a->count * sizeof(float), (void **)&tmp), st,
                 out);
  ZPP_CHECK_GOTO(zpp_k_wdiff(ex, a->dtype,
                             (uint8_t *)a->recon + (size_t)me * a->count * ds,
                             a->target, a->count, tmp),
                 st, out);
  /* stochastic rounding draws at the element's index in the whole tensor */
  ZPP_CHECK_GOTO(zpp_k_encode_at(ex, &a->q, ZPP_FLOAT32, tmp, a->count,
                                 (uint64_t)me * (uint64_t)a->count,
                                 all + (size_t)me * e),
                 st, out);
  ZPP_CHECK_GOTO(zpp_transport_allgather(ex->t, ZPP_GROUP_WORLD,
                                         all + (size_t)me * e, e, all, ex->mem,
                                         ex->stream),
                 st, out);
  for (r = 0; r < n; r++) {
    uint8_t *rec = (uint8_t *)a->recon + (size_t)r * a->count * ds;
    if (a->dtype == ZPP_FLOAT32) { /* one fp32 addition, in place */
      ZPP_CHECK_GOTO(zpp_k_decode_acc(ex, &a->q, all + (size_t)r * e, a->count,
                                      (float *)rec),
                     st, out);
      continue;
    }
    ZPP_CHECK_GOTO(zpp_k_decode(ex, &a->q, all + (size_t)r * e, a->count,
                                ZPP_FLOAT32, tmp),
                   st, out);
    ZPP_CHECK_GOTO(zpp_k_add_residual(ex, a->dtype, rec, tmp, a->count, tmp),
                   st, out);
    ZPP_CHECK_GOTO(zpp_k_finish(ex, tmp, a->count, 1.0f, a->dtype, rec), st,
                   out);
  }
  st = ZPP_OK;
out:
  zpp_k_free(ex, tmp);
  zpp_k_free(ex, all);
  return st;
}

zpp_status_t zpp_qwd_allgather(zpp_comm_t comm, const zpp_quant_config_t *quant,
                               const float *target, void *recon, size_t count,
                               zpp_dtype_t dtype, zpp_stream_t stream,
                               zpp_request_t *req) {
  qwd_arg_t a;
  uint64_t w[4] = {0, 0, 0, 0};
  zpp_status_t st = ZPP_OK;
  ZPP_CHECK(zpp_exec_init(__func__, comm, stream, &a.ex));
  memset(&a.q, 0, sizeof a.q);
  if (quant == NULL) {
    st = zpp_error(ZPP_ERR_NULL_POINTER, __func__, "quant is NULL");
  } else if (zpp_quant_config_check(quant) != ZPP_OK) {
    const char *m = zpp_get_last_error(), *c = strchr(m, ':');
    st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__, "quant: %s",
                   c != NULL ? c + 2 : m);
  }
  if (st == ZPP_OK)
    st = zpp_coll_check_dtype(__func__, dtype);
  if (st == ZPP_OK)
    st = zpp_coll_check_bufs(__func__, &a.ex, target, recon, count, dtype);
  if (st == ZPP_OK) {
    zpp_quant_config_get(quant, &a.q);
    w[0] = (uint64_t)a.q.bits;
    w[1] = (uint64_t)a.q.block_size;
    w[2] = (uint64_t)a.q.mode | (uint64_t)a.q.rounding << 8;
    w[3] = a.q.seed;
  }
  ZPP_CHECK(zpp_comm_fail(comm, zpp_coll_check_args(__func__, &a.ex, count,
                                                    (int)dtype, -2, w, 4,
                                                    st)));
  a.target = target;
  a.recon = recon;
  a.count = count;
  a.dtype = dtype;
  return zpp_coll_submit_copy(__func__, comm, qwd_run, &a, sizeof a, stream,
                              req);
}
