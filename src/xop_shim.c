/*
 * TEMPORARY: the non-blocking interface of transport.h implemented with the
 * blocking calls (an op is done when started).  Replaced by
 * src/transport_algo.c (non-blocking state machines); kept only until that
 * lands so the engine can be built and tested.
 */
#include "transport_impl.h"

#include <stdlib.h>

struct zpp_xop {
  zpp_status_t st;
};

static zpp_status_t mk(zpp_status_t st, zpp_xop_t **op) {
  *op = NULL;
  if (st != ZPP_OK)
    return st;
  *op = calloc(1, sizeof **op);
  if (*op == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "xop", "op");
  return ZPP_OK;
}

zpp_status_t zpp_transport_start_allgather(zpp_transport_t *t, zpp_group_t g,
                                           const void *send, size_t bytes,
                                           void *recv, zpp_memory_t mem,
                                           void *stream, zpp_xop_t **op) {
  return mk(zpp_transport_allgather(t, g, send, bytes, recv, mem, stream), op);
}
zpp_status_t zpp_transport_start_allgatherv(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    const size_t *recv_bytes, const size_t *recv_displs, zpp_memory_t mem,
    void *stream, zpp_xop_t **op) {
  return mk(zpp_transport_allgatherv(t, g, send, recv, recv_bytes, recv_displs,
                                     mem, stream),
            op);
}
zpp_status_t zpp_transport_start_alltoallv(
    zpp_transport_t *t, zpp_group_t g, const void *send,
    const size_t *send_bytes, const size_t *send_displs, void *recv,
    const size_t *recv_bytes, const size_t *recv_displs, zpp_memory_t mem,
    void *stream, zpp_xop_t **op) {
  return mk(zpp_transport_alltoallv(t, g, send, send_bytes, send_displs, recv,
                                    recv_bytes, recv_displs, mem, stream),
            op);
}
zpp_status_t zpp_transport_start_alltoall(zpp_transport_t *t, zpp_group_t g,
                                          const void *send, size_t bytes,
                                          void *recv, zpp_memory_t mem,
                                          void *stream, zpp_xop_t **op) {
  return mk(zpp_transport_alltoall(t, g, send, bytes, recv, mem, stream), op);
}
zpp_status_t zpp_transport_start_reduce_scatter(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream, zpp_xop_t **xop) {
  return mk(zpp_transport_reduce_scatter(t, g, send, recv, count, dtype, op,
                                         mem, stream),
            xop);
}
zpp_status_t zpp_transport_start_allreduce(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream, zpp_xop_t **xop) {
  return mk(zpp_transport_allreduce(t, g, send, recv, count, dtype, op, mem,
                                    stream),
            xop);
}
zpp_status_t zpp_transport_start_barrier(zpp_transport_t *t, zpp_group_t g,
                                         zpp_xop_t **op) {
  return mk(zpp_transport_barrier(t, g), op);
}
zpp_status_t zpp_xop_test(zpp_xop_t *op, int *done) {
  (void)op;
  *done = 1;
  return ZPP_OK;
}
int64_t zpp_xop_wake_ns(const zpp_xop_t *op) {
  (void)op;
  return 0;
}
zpp_status_t zpp_xop_wait(zpp_xop_t *op) {
  (void)op;
  return ZPP_OK;
}
void zpp_xop_free(zpp_xop_t *op) { free(op); }
