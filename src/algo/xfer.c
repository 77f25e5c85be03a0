/*
 * The one dispatch of a transfer descriptor (transport.h): one check of its
 * arguments by kind, then, under the transport's lock, the broken check,
 * the call counter and the start: the backend's collective table (NCCL:
 * enqueued on the stream, done for the host) or the host algorithms over
 * the round table (the op state machine of op.c).
 */
#include "algo/algo.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "algo/algo_impl.h"
#include "core/core.h"
#include "transport/transport_impl.h"

static zpp_status_t need(zpp_transport_t *t, const void *p, int needed,
                         const char *name, const char *func) {
  if (p == NULL && needed)
    return zpp_transport_fail(
        t, zpp_error(ZPP_ERR_NULL_POINTER, func, "%s is NULL", name));
  return ZPP_OK;
}

/* Sum of counts (and with displacements, the largest end) fits size_t. */
static zpp_status_t check_counts(zpp_transport_t *t, int n,
                                 const size_t *bytes, const size_t *displs,
                                 const char *name, const char *func,
                                 size_t *total) {
  size_t sum = 0;
  int i;
  for (i = 0; i < n; i++) {
    size_t end = displs ? displs[i] : sum;
    if (end > SIZE_MAX - bytes[i] || sum > SIZE_MAX - bytes[i])
      return zpp_transport_fail(
          t, zpp_error(ZPP_ERR_OVERFLOW, func,
                       "%s[%d] = %zu: the buffer extent overflows size_t",
                       name, i, bytes[i]));
    sum += bytes[i];
  }
  *total = sum;
  return ZPP_OK;
}

zpp_status_t zpp_xfer_check(zpp_transport_t *t, const zpp_xfer_desc_t *d,
                            const char *func) {
  zpp_group_t g;
  int n;
  size_t stotal = 0, rtotal = 0;
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "transport is NULL");
  if (d == NULL)
    return zpp_transport_fail(
        t, zpp_error(ZPP_ERR_NULL_POINTER, func, "descriptor is NULL"));
  if ((unsigned)d->kind >= ZPP_XFER_NKINDS)
    return zpp_transport_fail(
        t, zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "kind %d: not a transfer kind", (int)d->kind));
  g = d->group;
  if (g != ZPP_GROUP_WORLD && g != ZPP_GROUP_NODE && g != ZPP_GROUP_CROSS)
    return zpp_transport_fail(
        t, zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "group %d: must be ZPP_GROUP_WORLD, _NODE or _CROSS",
                     (int)g));
  if (d->kind != ZPP_XFER_BARRIER && d->mem != ZPP_MEMORY_HOST &&
      d->mem != ZPP_MEMORY_DEVICE)
    return zpp_transport_fail(
        t, zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "mem %d: must be ZPP_MEMORY_HOST or ZPP_MEMORY_DEVICE",
                     (int)d->mem));
  n = t->grp[g].size;
  switch (d->kind) {
  case ZPP_XFER_ALLGATHER:
  case ZPP_XFER_ALLTOALL:
    ZPP_CHECK(need(t, d->send, d->bytes > 0, "send", func));
    ZPP_CHECK(need(t, d->recv, d->bytes > 0, "recv", func));
    if (d->bytes > 0 && (size_t)n > SIZE_MAX / d->bytes)
      return zpp_transport_fail(
          t, zpp_error(ZPP_ERR_OVERFLOW, func,
                       "bytes %zu x %d members overflows size_t", d->bytes,
                       n));
    return ZPP_OK;
  case ZPP_XFER_ALLGATHERV:
    ZPP_CHECK(need(t, d->recv_bytes, 1, "recv_bytes", func));
    ZPP_CHECK(check_counts(t, n, d->recv_bytes, d->recv_displs, "recv_bytes",
                           func, &rtotal));
    ZPP_CHECK(need(t, d->send, d->recv_bytes[t->grp[g].index] > 0, "send",
                   func));
    return need(t, d->recv, rtotal > 0, "recv", func);
  case ZPP_XFER_ALLTOALLV:
    ZPP_CHECK(need(t, d->send_bytes, 1, "send_bytes", func));
    ZPP_CHECK(need(t, d->recv_bytes, 1, "recv_bytes", func));
    ZPP_CHECK(check_counts(t, n, d->send_bytes, d->send_displs, "send_bytes",
                           func, &stotal));
    ZPP_CHECK(check_counts(t, n, d->recv_bytes, d->recv_displs, "recv_bytes",
                           func, &rtotal));
    ZPP_CHECK(need(t, d->send, stotal > 0, "send", func));
    return need(t, d->recv, rtotal > 0, "recv", func);
  case ZPP_XFER_REDUCE_SCATTER:
  case ZPP_XFER_ALLREDUCE: {
    size_t es = zpp_dtype_size(d->dtype);
    zpp_status_t st = zpp_check_float_dtype(func, "dtype", d->dtype);
    if (st != ZPP_OK)
      return zpp_transport_fail(t, st);
    if (d->op != ZPP_REDUCE_SUM && d->op != ZPP_REDUCE_MEAN)
      return zpp_transport_fail(
          t, zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                       "op %d: must be ZPP_REDUCE_SUM or ZPP_REDUCE_MEAN",
                       (int)d->op));
    if (d->count > SIZE_MAX / es / (size_t)n)
      return zpp_transport_fail(
          t, zpp_error(ZPP_ERR_OVERFLOW, func,
                       "count %zu: the buffer size overflows size_t",
                       d->count));
    ZPP_CHECK(need(t, d->send, d->count > 0, "send", func));
    return need(t, d->recv, d->count > 0, "recv", func);
  }
  case ZPP_XFER_BARRIER:
    return ZPP_OK;
  }
  return zpp_transport_fail(
      t, zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                   "kind %d: not a transfer kind", (int)d->kind));
}

zpp_status_t zpp_xfer_start(zpp_transport_t *t, const zpp_xfer_desc_t *d,
                            unsigned flags, zpp_xop_t **op) {
  static const char func[] = "zpp_xfer_start";
  zpp_xfer_desc_t c;
  zpp_status_t st;
  if (op == NULL)
    return t != NULL ? zpp_transport_fail(t, zpp_error(ZPP_ERR_NULL_POINTER,
                                                       func, "op is NULL"))
                     : zpp_error(ZPP_ERR_NULL_POINTER, func, "op is NULL");
  *op = NULL;
  /* errors are named after the transfer ("allgather: send is NULL") */
  ZPP_CHECK(zpp_xfer_check(t, d, d != NULL ? zpp_xfer_name(d->kind) : func));
  c = *d;
  if (c.kind == ZPP_XFER_BARRIER) {
    c.mem = ZPP_MEMORY_HOST;
    c.stream = NULL;
  }
  if (c.kind == ZPP_XFER_ALLGATHER || c.kind == ZPP_XFER_ALLTOALL)
    c.send_bytes = c.send_displs = c.recv_bytes = c.recv_displs = NULL;
  pthread_mutex_lock(&t->lock);
  if (atomic_load(&t->broken)) {
    pthread_mutex_unlock(&t->lock);
    return zpp_transport_broken_error(t, zpp_xfer_name(c.kind));
  }
  atomic_fetch_add(&t->calls[c.group], 1);
  ZPP_TRACE(ZPP_SUBSYS_NET, "%s on group %s (%d members)",
            zpp_xfer_name(c.kind), zpp_group_name(c.group),
            t->grp[c.group].size);
  if (t->ops->round != NULL) {
    st = zpp_algo_start(t, &c, (flags & ZPP_XFER_SYNC_OUT) != 0, op);
  } else {
    st = t->ops->coll->enqueue(t, &c);
    if (st == ZPP_OK)
      *op = zpp_xop_done();
  }
  pthread_mutex_unlock(&t->lock);
  return zpp_transport_fail(t, st);
}
