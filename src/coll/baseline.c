/*
 * The full-precision baselines: zpp_allgather and zpp_reduce_scatter, each
 * a plan of one transfer.  docs/design.md, "Collectives".
 */
#include "coll/coll.h"

#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/plan.h"

/* A plan of one transfer step. */
static zpp_status_t submit_one(const char *func, const zpp_exec_t *ex,
                               const zpp_xfer_desc_t *x, zpp_request_t *req) {
  zpp_plan_t *p;
  ZPP_CHECK(zpp_comm_fail(ex->comm, zpp_plan_create(func, ex, NULL, NULL, &p)));
  zpp_plan_xfer(p, x, ZPP_NO_STEP, ZPP_NO_STEP);
  return zpp_plan_submit(p, req);
}

zpp_status_t zpp_allgather(zpp_comm_t comm, const void *sendbuf, void *recvbuf,
                           size_t count, zpp_dtype_t dtype,
                           zpp_stream_t stream, zpp_request_t *req) {
  zpp_coll_args_t a;
  zpp_exec_t ex;
  zpp_xfer_desc_t x;
  a = zpp_coll_args_init(__func__, comm, stream, sendbuf, recvbuf, count,
                         dtype);
  a.dtype_bytes = 1;
  a.layout = ZPP_BUFS_GATHER;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  memset(&x, 0, sizeof x);
  x.kind = ZPP_XFER_ALLGATHER;
  x.group = ZPP_GROUP_WORLD;
  x.send = sendbuf;
  x.recv = recvbuf;
  x.bytes = count * zpp_dtype_size(dtype);
  return submit_one(__func__, &ex, &x, req);
}

zpp_status_t zpp_reduce_scatter(zpp_comm_t comm, const void *sendbuf,
                                void *recvbuf, size_t count, zpp_dtype_t dtype,
                                zpp_redop_t op, zpp_stream_t stream,
                                zpp_request_t *req) {
  zpp_coll_args_t a;
  zpp_exec_t ex;
  zpp_xfer_desc_t x;
  a = zpp_coll_args_init(__func__, comm, stream, sendbuf, recvbuf, count,
                         dtype);
  a.op_word = (int)op;
  a.op = op;
  a.check_op = 1;
  a.layout = ZPP_BUFS_SCATTER;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  memset(&x, 0, sizeof x);
  x.kind = ZPP_XFER_REDUCE_SCATTER;
  x.group = ZPP_GROUP_WORLD;
  x.send = sendbuf;
  x.recv = recvbuf;
  x.count = count;
  x.dtype = dtype;
  /* MEAN divides the fp32 sum before the one rounding (transport.h) */
  x.op = op == ZPP_OP_MEAN ? ZPP_REDUCE_MEAN : ZPP_REDUCE_SUM;
  return submit_one(__func__, &ex, &x, req);
}
