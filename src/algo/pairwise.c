/*
 * The pairwise family (described at the top of op.c): all-to-all[v] as
 * one round of all n-1 pairs, and the flat reduce-scatter: that round of
 * shards, then a local sum of the blocks in member order.
 */
#include "algo/algo_impl.h"
#include "core/core.h"
#include "kernels/elementwise.h"
#include "quant/quant.h"

#include <stdint.h>
#include <string.h>

/* dst[e] = sum over i = 0..n-1 of block i (dtype in_dt), element e, in
 * that order with an fp32 accumulator, divided by div when div > 0 (MEAN),
 * rounded once to out_dt (kernels/elementwise.c, in tiles). */
void zpp_algo_reduce_blocks(void *dst, zpp_dtype_t out_dt,
                            const void *const *blocks, zpp_dtype_t in_dt, int n,
                            size_t count, float div) {
  zpp_ew_reduce_blocks_host(zpp_quant_cpu_simd(), dst, (int)out_dt, blocks,
                            (int)in_dt, n, count, div);
}

/* All n-1 pairs at once, in the order me+1, me+2, ... */
static zpp_status_t pair_round(zpp_xop_t *op) {
  int n = op->n, me = op->me, s;
  for (s = 1; s < n; s++) {
    int to = (me + s) % n, from = (me - s + n) % n;
    zpp_algo_data_xfer(op, &op->dout[s - 1], to, op->p_send + op->so[to],
                       op->sb[to]);
    zpp_algo_data_xfer(op, &op->din[s - 1], from, op->p_recv + op->ro[from],
                       op->rb[from]);
  }
  op->nin = op->nout = n - 1;
  op->ctl = 0;
  return zpp_algo_post_round(op);
}

/* Pairwise reduce of shards (off[i], len[i]) of `send` into dst: my shard
 * from every peer lands in scratch, then the blocks are summed. */
zpp_status_t zpp_algo_setup_reduce(zpp_xop_t *op, const void *send, void *dst) {
  int n = op->n, me = op->me, i;
  size_t es = zpp_dtype_size(op->dtype), mine = op->len[me] * es;
  op->dst = dst;
  if (n == 1) {
    if (dst != (const char *)send + op->off[0] * es && mine > 0)
      memmove(dst, (const char *)send + op->off[0] * es, mine);
    return ZPP_OK;
  }
  if (mine > 0 && (size_t)n > (SIZE_MAX - 1) / mine)
    return zpp_error(ZPP_ERR_OVERFLOW, op->what, "scratch size overflows");
  ZPP_CHECK(zpp_algo_host_get(op->t, mine * (size_t)n + 1, &op->tmp, op->what));
  for (i = 0; i < n; i++) {
    op->sb[i] = i == me ? 0 : op->len[i] * es;
    op->so[i] = op->off[i] * es;
    op->rb[i] = i == me ? 0 : mine;
    op->ro[i] = (size_t)i * mine;
    op->blocks[i] = i == me ? (const char *)send + op->off[me] * es
                            : (const char *)op->tmp.p + op->ro[i];
  }
  op->p_send = send;
  op->p_recv = op->tmp.p;
  return ZPP_OK;
}

/* The ZPP_PH_PAIR step: the one pairwise round. */
zpp_status_t zpp_algo_pair_step(zpp_xop_t *op, int *end) {
  if (op->step >= 1) {
    *end = 1;
    return ZPP_OK;
  }
  op->step = 1;
  return pair_round(op);
}

/* The ZPP_PH_REDUCE step: the blocks of zpp_algo_setup_reduce summed into
 * dst (no round). */
zpp_status_t zpp_algo_reduce_step(zpp_xop_t *op, int *end) {
  zpp_algo_reduce_blocks(op->dst, op->dtype, op->blocks, op->dtype, op->n,
                         op->len[op->me],
                         op->rop == ZPP_REDUCE_MEAN ? (float)op->n : 0.0f);
  *end = 1;
  return ZPP_OK;
}
