// Test helpers: blocking and per-kind forms of the transfer descriptor's
// one entry (src/algo/algo.h, zpp_xfer_start).  The library has no
// blocking transfers (the engine polls every op it starts); the transport
// tests call these to drive one operation at a time.  blocking_*: start
// with ZPP_XFER_SYNC_OUT (staged device output is complete on return),
// wait, free.  start_*: the descriptor filled from positional arguments.
#ifndef ZPP_TESTS_XFER_BLOCKING_H
#define ZPP_TESTS_XFER_BLOCKING_H

#include <sched.h>

#include <cstring>

#include "algo/algo.h"
#include "core/core.h"  // zpp_pause_ns, zpp_sleep_until_ns

// Polls op until done, as the engine's executor does (src/engine/run.c):
// without sleeping (yielding the core) for ZPP_NET_SPIN_US after the start
// or the transport's last completed transfer, so that a large intra-node
// message, which moves only while both sides poll, runs at full speed;
// then sleeping 1 us doubling to 200 us; an emulated link's deadline is
// slept through (the window does not start again after it).  The op's own
// timeout (ZPP_TIMEOUT_S from its start) bounds the loop.
static inline zpp_status_t xop_wait(zpp_transport_t *t, zpp_xop_t *op) {
  const int64_t spin_ns = zpp_transport_spin_ns(t);
  uint64_t seen = zpp_transport_progress(t);
  int64_t quiet_until = zpp_time_ns() + spin_ns;
  long pause_ns = 1000;
  for (;;) {
    int done = 0;
    zpp_status_t st = zpp_xop_test(op, &done);
    if (st != ZPP_OK || done)
      return st;
    int64_t now = zpp_time_ns(), wake = zpp_xop_wake_ns(op);
    uint64_t p = zpp_transport_progress(t);
    if (p != seen) {
      seen = p;
      quiet_until = now + spin_ns;
      pause_ns = 1000;
    } else if (wake > now) {
      zpp_sleep_until_ns(wake);
    } else if (now < quiet_until) {
      sched_yield();
    } else {
      zpp_pause_ns(&pause_ns);
    }
  }
}

static inline zpp_xfer_desc_t xfer_desc(zpp_xfer_kind_t kind, zpp_group_t g,
                                        const void *send, void *recv,
                                        zpp_memory_t mem, void *stream) {
  zpp_xfer_desc_t d;
  std::memset(&d, 0, sizeof d);
  d.kind = kind;
  d.group = g;
  d.send = send;
  d.recv = recv;
  d.mem = mem;
  d.stream = stream;
  return d;
}

static inline zpp_status_t blocking_run(zpp_transport_t *t,
                                        const zpp_xfer_desc_t &d) {
  zpp_xop_t *op = nullptr;
  zpp_status_t st = zpp_xfer_start(t, &d, ZPP_XFER_SYNC_OUT, &op);
  if (st != ZPP_OK)
    return st;
  st = xop_wait(t, op);
  zpp_xop_free(op);
  return st;
}

static inline zpp_xfer_desc_t gather_desc(zpp_xfer_kind_t kind, zpp_group_t g,
                                          const void *send, size_t bytes,
                                          void *recv, zpp_memory_t mem,
                                          void *stream) {
  zpp_xfer_desc_t d = xfer_desc(kind, g, send, recv, mem, stream);
  d.bytes = bytes;
  return d;
}
static inline zpp_xfer_desc_t gatherv_desc(zpp_group_t g, const void *send,
                                           void *recv, const size_t *rb,
                                           const size_t *rd, zpp_memory_t mem,
                                           void *stream) {
  zpp_xfer_desc_t d =
      xfer_desc(ZPP_XFER_ALLGATHERV, g, send, recv, mem, stream);
  d.recv_bytes = rb;
  d.recv_displs = rd;
  return d;
}
static inline zpp_xfer_desc_t a2av_desc(zpp_group_t g, const void *send,
                                        const size_t *sb, const size_t *sd,
                                        void *recv, const size_t *rb,
                                        const size_t *rd, zpp_memory_t mem,
                                        void *stream) {
  zpp_xfer_desc_t d = xfer_desc(ZPP_XFER_ALLTOALLV, g, send, recv, mem, stream);
  d.send_bytes = sb;
  d.send_displs = sd;
  d.recv_bytes = rb;
  d.recv_displs = rd;
  return d;
}
static inline zpp_xfer_desc_t reduce_desc(zpp_xfer_kind_t kind, zpp_group_t g,
                                          const void *send, void *recv,
                                          size_t count, zpp_dtype_t dtype,
                                          zpp_reduce_op_t op, zpp_memory_t mem,
                                          void *stream) {
  zpp_xfer_desc_t d = xfer_desc(kind, g, send, recv, mem, stream);
  d.count = count;
  d.dtype = dtype;
  d.op = op;
  return d;
}

static inline zpp_status_t blocking_allgather(zpp_transport_t *t, zpp_group_t g,
                                              const void *send, size_t bytes,
                                              void *recv, zpp_memory_t mem,
                                              void *stream) {
  return blocking_run(
      t, gather_desc(ZPP_XFER_ALLGATHER, g, send, bytes, recv, mem, stream));
}
static inline zpp_status_t blocking_alltoall(zpp_transport_t *t, zpp_group_t g,
                                             const void *send, size_t bytes,
                                             void *recv, zpp_memory_t mem,
                                             void *stream) {
  return blocking_run(
      t, gather_desc(ZPP_XFER_ALLTOALL, g, send, bytes, recv, mem, stream));
}
static inline zpp_status_t blocking_allgatherv(zpp_transport_t *t,
                                               zpp_group_t g, const void *send,
                                               void *recv, const size_t *rb,
                                               const size_t *rd,
                                               zpp_memory_t mem, void *stream) {
  return blocking_run(t, gatherv_desc(g, send, recv, rb, rd, mem, stream));
}
static inline zpp_status_t blocking_alltoallv(
    zpp_transport_t *t, zpp_group_t g, const void *send, const size_t *sb,
    const size_t *sd, void *recv, const size_t *rb, const size_t *rd,
    zpp_memory_t mem, void *stream) {
  return blocking_run(t, a2av_desc(g, send, sb, sd, recv, rb, rd, mem, stream));
}
static inline zpp_status_t blocking_reduce_scatter(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream) {
  return blocking_run(t, reduce_desc(ZPP_XFER_REDUCE_SCATTER, g, send, recv,
                                     count, dtype, op, mem, stream));
}
static inline zpp_status_t blocking_allreduce(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream) {
  return blocking_run(t, reduce_desc(ZPP_XFER_ALLREDUCE, g, send, recv, count,
                                     dtype, op, mem, stream));
}
static inline zpp_status_t blocking_barrier(zpp_transport_t *t, zpp_group_t g) {
  return blocking_run(t, xfer_desc(ZPP_XFER_BARRIER, g, nullptr, nullptr,
                                   ZPP_MEMORY_HOST, nullptr));
}

static inline zpp_status_t start_allgather(zpp_transport_t *t, zpp_group_t g,
                                           const void *send, size_t bytes,
                                           void *recv, zpp_memory_t mem,
                                           void *stream, zpp_xop_t **op) {
  zpp_xfer_desc_t d =
      gather_desc(ZPP_XFER_ALLGATHER, g, send, bytes, recv, mem, stream);
  return zpp_xfer_start(t, &d, 0, op);
}
static inline zpp_status_t start_alltoall(zpp_transport_t *t, zpp_group_t g,
                                          const void *send, size_t bytes,
                                          void *recv, zpp_memory_t mem,
                                          void *stream, zpp_xop_t **op) {
  zpp_xfer_desc_t d =
      gather_desc(ZPP_XFER_ALLTOALL, g, send, bytes, recv, mem, stream);
  return zpp_xfer_start(t, &d, 0, op);
}
static inline zpp_status_t start_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                            const void *send, void *recv,
                                            const size_t *rb, const size_t *rd,
                                            zpp_memory_t mem, void *stream,
                                            zpp_xop_t **op) {
  zpp_xfer_desc_t d = gatherv_desc(g, send, recv, rb, rd, mem, stream);
  return zpp_xfer_start(t, &d, 0, op);
}
static inline zpp_status_t start_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                           const void *send, const size_t *sb,
                                           const size_t *sd, void *recv,
                                           const size_t *rb, const size_t *rd,
                                           zpp_memory_t mem, void *stream,
                                           zpp_xop_t **op) {
  zpp_xfer_desc_t d = a2av_desc(g, send, sb, sd, recv, rb, rd, mem, stream);
  return zpp_xfer_start(t, &d, 0, op);
}
static inline zpp_status_t start_reduce_scatter(
    zpp_transport_t *t, zpp_group_t g, const void *send, void *recv,
    size_t count, zpp_dtype_t dtype, zpp_reduce_op_t op, zpp_memory_t mem,
    void *stream, zpp_xop_t **xop) {
  zpp_xfer_desc_t d = reduce_desc(ZPP_XFER_REDUCE_SCATTER, g, send, recv,
                                  count, dtype, op, mem, stream);
  return zpp_xfer_start(t, &d, 0, xop);
}
static inline zpp_status_t start_allreduce(zpp_transport_t *t, zpp_group_t g,
                                           const void *send, void *recv,
                                           size_t count, zpp_dtype_t dtype,
                                           zpp_reduce_op_t op, zpp_memory_t mem,
                                           void *stream, zpp_xop_t **xop) {
  zpp_xfer_desc_t d = reduce_desc(ZPP_XFER_ALLREDUCE, g, send, recv, count,
                                  dtype, op, mem, stream);
  return zpp_xfer_start(t, &d, 0, xop);
}
static inline zpp_status_t start_barrier(zpp_transport_t *t, zpp_group_t g,
                                         zpp_xop_t **op) {
  zpp_xfer_desc_t d =
      xfer_desc(ZPP_XFER_BARRIER, g, nullptr, nullptr, ZPP_MEMORY_HOST,
                nullptr);
  return zpp_xfer_start(t, &d, 0, op);
}

#endif  // ZPP_TESTS_XFER_BLOCKING_H
