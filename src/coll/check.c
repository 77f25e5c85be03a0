/*
 * The argument checks every collective shares (the prologue: dtype,
 * counts, buffers, overlap, memory space, and with ZPP_CHECK=1 the
 * agreement of every rank), and the chunking rule of pipelined plans.
 */
#include "coll/coll.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "quant/quant.h"

zpp_status_t zpp_coll_check_args(const char *func, const zpp_exec_t *ex,
                                 size_t count, int dtype, int op,
                                 const uint64_t *words, int nwords,
                                 zpp_status_t local) {
  enum { NW = 9 }; /* count, dtype, op, 5 config words, local status */
  static const char *names[NW - 1] = {
      "count",         "dtype",         "op",
      "config word 0", "config word 1", "config word 2",
      "config word 3", "config word 4"};
  uint64_t mine[NW];
  uint64_t *all;
  int n, r, i, me;
  zpp_status_t st;
  if (zpp_setting_long("ZPP_CHECK", 0) == 0)
    return local;
  memset(mine, 0, sizeof mine);
  mine[0] = (uint64_t)count;
  mine[1] = (uint64_t)(uint32_t)dtype;
  mine[2] = (uint64_t)(uint32_t)op;
  for (i = 0; i < nwords && i + 3 < NW - 1; i++)
    mine[3 + i] = words[i];
  mine[NW - 1] = (uint64_t)(uint32_t)(-(int)local);
  n = zpp_transport_size(ex->t);
  me = zpp_transport_rank(ex->t);
  all = (uint64_t *)malloc(sizeof mine * (size_t)n);
  if (all == NULL) /* cannot take part: the others time out in the exchange */
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "ZPP_CHECK buffer");
  /* Out of band, host memory, on every backend, not counted. */
  st = zpp_comm_meta_allgather(ex->comm, mine, sizeof mine, all);
  if (st != ZPP_OK) {
    free(all);
    return st;
  }
  /* A rank whose own checks failed makes every rank fail, after the
   * exchange, so no rank goes on into a collective the others skip. */
  for (r = 0; r < n; r++) {
    uint64_t bad = all[(size_t)r * NW + NW - 1];
    if (bad != 0) {
      free(all);
      if (local != ZPP_OK)
        return local; /* this rank's own message stands */
      return zpp_error(ZPP_ERR_MISMATCH, func,
                       "ZPP_CHECK: rank %d failed its argument checks "
                       "(%s); this is rank %d",
                       r, zpp_status_string((zpp_status_t)(-(int64_t)bad)),
                       me);
    }
  }
  for (r = 0; r < n; r++) {
    const uint64_t *w = all + (size_t)r * NW;
    for (i = 0; i < NW - 1; i++) {
      if (w[i] != all[i]) {
        st = zpp_error(ZPP_ERR_MISMATCH, func,
                       "ZPP_CHECK: %s is %llu on rank 0 but %llu on rank %d "
                       "(this is rank %d); all ranks must pass the same",
                       names[i], (unsigned long long)all[i],
                       (unsigned long long)w[i], r, me);
        free(all);
        return st;
      }
    }
  }
  free(all);
  return ZPP_OK;
}

/* ---- argument checks and submission shared by the collectives ---------- */

zpp_status_t zpp_coll_check_dtype(const char *func, zpp_dtype_t dtype) {
  return zpp_check_float_dtype(func, "dtype", dtype);
}

zpp_status_t zpp_coll_check_dtype_bytes(const char *func, zpp_dtype_t dtype) {
  if (zpp_dtype_size(dtype) == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "dtype %d: must be ZPP_FLOAT32, ZPP_FLOAT16, "
                     "ZPP_BFLOAT16 or ZPP_UINT8",
                     (int)dtype);
  return ZPP_OK;
}

/* count elements per rank: the full buffer (size * count * dtype bytes)
 * must fit size_t; buffers must be non-NULL when there is data. */
zpp_status_t zpp_coll_check_count(const char *func, const zpp_exec_t *ex,
                                  size_t count, zpp_dtype_t dtype) {
  size_t n = (size_t)zpp_transport_size(ex->t);
  size_t ds = zpp_dtype_size(dtype);
  if (count > SIZE_MAX / n / ds)
    return zpp_error(ZPP_ERR_OVERFLOW, func,
                     "count %zu: %zu ranks x count x %zu bytes overflows "
                     "size_t",
                     count, n, ds);
  return ZPP_OK;
}

zpp_status_t zpp_coll_check_device_buf(const char *func, const zpp_exec_t *ex,
                                       const char *what, const void *p) {
  if (ex->mem != ZPP_MEMORY_DEVICE || p == NULL)
    return ZPP_OK;
  return zpp_quant_check_device_ptr(func, what, p,
                                    zpp_comm_device(ex->comm));
}

zpp_status_t zpp_coll_check_bufs_named(const char *func, const zpp_exec_t *ex,
                                       const char *send_name, const void *send,
                                       const char *recv_name, const void *recv,
                                       size_t count, zpp_dtype_t dtype) {
  ZPP_CHECK(zpp_coll_check_count(func, ex, count, dtype));
  if (count == 0)
    return ZPP_OK;
  if (send == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "%s is NULL (count %zu)",
                     send_name, count);
  if (recv == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "%s is NULL (count %zu)",
                     recv_name, count);
  /* Device memory: the caller's buffers are classified here, once per
   * call; the kernels the collective launches then skip the query. */
  ZPP_CHECK(zpp_coll_check_device_buf(func, ex, send_name, send));
  return zpp_coll_check_device_buf(func, ex, recv_name, recv);
}

zpp_status_t zpp_coll_check_overlap(const char *func, const zpp_exec_t *ex,
                                    const char *a_name, const void *a,
                                    size_t a_bytes, const char *b_name,
                                    const void *b, size_t b_bytes,
                                    int in_place) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  char sign = y >= x ? '+' : '-';
  size_t off = y >= x ? (size_t)(y - x) : (size_t)(x - y);
  if (!zpp_bytes_overlap(a, a_bytes, b, b_bytes))
    return ZPP_OK;
  if (in_place) {
    /* rank * b_bytes < size * b_bytes = a_bytes: no overflow */
    size_t me = (size_t)zpp_transport_rank(ex->t), slot = me * b_bytes;
    if (sign == '+' && off == slot)
      return ZPP_OK;
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s (%zu bytes at %s %c %zu) overlaps %s (%zu bytes): "
                     "only %s == %s + %zu (in place: rank %zu x %zu bytes) "
                     "may share memory with %s",
                     b_name, b_bytes, a_name, sign, off, a_name, a_bytes,
                     b_name, a_name, slot, me, b_bytes, a_name);
  }
  return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                   "%s (%zu bytes at %s %c %zu) overlaps %s (%zu bytes): %s "
                   "must not share memory with %s",
                   b_name, b_bytes, a_name, sign, off, a_name, a_bytes, b_name,
                   a_name);
}

zpp_status_t zpp_coll_check_layout_overlap(const char *func,
                                           const zpp_exec_t *ex,
                                           zpp_bufs_layout_t layout,
                                           const void *send, const void *recv,
                                           size_t count, zpp_dtype_t dtype) {
  /* size * count * dtype bytes fit size_t (zpp_coll_check_count) */
  size_t one = count * zpp_dtype_size(dtype);
  size_t all = one * (size_t)zpp_transport_size(ex->t);
  /* the per-rank buffer is named first, as "at <whole buffer> + offset" */
  if (layout == ZPP_BUFS_GATHER)
    return zpp_coll_check_overlap(func, ex, "recvbuf", recv, all, "sendbuf",
                                  send, one, 1);
  return zpp_coll_check_overlap(func, ex, "sendbuf", send, all, "recvbuf",
                                recv, one, 1);
}

zpp_status_t zpp_coll_check_bufs(const char *func, const zpp_exec_t *ex,
                                 zpp_bufs_layout_t layout, const void *send,
                                 const void *recv, size_t count,
                                 zpp_dtype_t dtype) {
  ZPP_CHECK(zpp_coll_check_bufs_named(func, ex, "sendbuf", send, "recvbuf",
                                      recv, count, dtype));
  return zpp_coll_check_layout_overlap(func, ex, layout, send, recv, count,
                                       dtype);
}

zpp_status_t zpp_coll_check_op(const char *func, zpp_redop_t op) {
  if (op != ZPP_OP_SUM && op != ZPP_OP_MEAN)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "op %d: must be ZPP_OP_SUM or ZPP_OP_MEAN", (int)op);
  return ZPP_OK;
}

/* Chunk length: whole blocks, about count / parts and at least
 * ZPP_PIPE_MIN_CHUNK elements; count itself (no pipelining) when that
 * setting is 0 or the data fits one chunk. */
size_t zpp_plan_chunk(size_t count, size_t block, size_t parts) {
  long min = zpp_setting_long("ZPP_PIPE_MIN_CHUNK", 65536);
  size_t target = count / (parts > 0 ? parts : 1), nblk;
  if (min <= 0 || block == 0)
    return count;
  if (target < (size_t)min)
    target = (size_t)min;
  nblk = target / block + (target % block != 0);
  if (nblk > SIZE_MAX / block)
    return count;
  return nblk * block >= count ? count : nblk * block;
}


zpp_status_t zpp_coll_check_quant(const char *func, const char *name,
                                  const char *fp,
                                  const zpp_quant_config_t *q) {
  return zpp_quant_config_check_named(func, name, fp, q);
}

/* ---- the prologue ------------------------------------------------------ */

static zpp_status_t local_checks(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  const char *f = a->func;
  if (a->pre != NULL)
    ZPP_CHECK(a->pre(a, ex));
  if (a->quant_name != NULL)
    ZPP_CHECK(zpp_coll_check_quant(f, a->quant_name, a->quant_fp, a->quant));
  ZPP_CHECK(a->dtype_bytes ? zpp_coll_check_dtype_bytes(f, a->dtype)
                           : zpp_coll_check_dtype(f, a->dtype));
  if (a->check_op)
    ZPP_CHECK(zpp_coll_check_op(f, a->op));
  switch (a->layout) {
  case ZPP_BUFS_GATHER:
  case ZPP_BUFS_SCATTER:
    ZPP_CHECK(zpp_coll_check_bufs(f, ex, a->layout, a->send, a->recv,
                                  a->count, a->dtype));
    break;
  case ZPP_BUFS_NAMED:
    ZPP_CHECK(zpp_coll_check_bufs_named(f, ex, a->send_name, a->send,
                                        a->recv_name, a->recv, a->count,
                                        a->dtype));
    break;
  case ZPP_BUFS_NONE:
    break;
  }
  if (a->post != NULL)
    ZPP_CHECK(a->post(a, ex));
  return ZPP_OK;
}

zpp_status_t zpp_coll_prologue(zpp_coll_args_t *a, zpp_exec_t *ex) {
  zpp_status_t st;
  ZPP_CHECK(zpp_exec_init(a->func, a->comm, a->stream, ex));
  st = local_checks(a, ex);
  return zpp_comm_fail(a->comm,
                       zpp_coll_check_args(a->func, ex, a->count,
                                           (int)a->dtype, a->op_word,
                                           a->words, a->nwords, st));
}
