/*
 * Device staging of the host algorithms: an op on device memory runs on
 * pinned host copies of the caller's buffers (cache.c's pinned slots).
 * The input is copied in when the op starts, waited for within the op's
 * timeout; the output is copied back when it completes, enqueued on the
 * caller's stream (synchronised with ZPP_XFER_SYNC_OUT).
 */
#include "algo/algo_impl.h"
#include "core/core.h"
#include "transport/transport_impl.h"

#include <stdatomic.h>
#include <stddef.h>

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* pending_out = 1 only after a complete op (its transfers are done).
 * After a failure, while cancelled transfers may still read or write
 * (t->in_doubt), the op's buffers are held until destroy instead. */
void zpp_algo_release_buffers(zpp_xop_t *op, int pending_out) {
  /* the transport's scratch holds it itself while in doubt */
  zpp_algo_host_put(op->t, &op->tmp);
#if ZPP_HAVE_CUDA
  int held = !pending_out && zpp_transport_in_doubt(op->t) &&
             op->t->algo != NULL;
  if (op->staged && held) {
    zpp_algo_hold(&op->t->algo->held_pinned, &op->stage_in);
    zpp_algo_hold(&op->t->algo->held_pinned, &op->stage_out);
  } else if (op->staged) {
    zpp_algo_pinned_put(&op->stage_in, op->stage_pending, op->stream);
    zpp_algo_pinned_put(&op->stage_out, pending_out || op->stage_pending,
                        op->stream);
  }
#else
  (void)pending_out;
#endif
}

#if ZPP_HAVE_CUDA
/* End of the furthest block (displacements NULL: packed). */
static size_t extent(const size_t *b, const size_t *d, int n) {
  size_t end = 0, acc = 0;
  int i;
  for (i = 0; i < n; i++) {
    size_t o = d ? d[i] : acc;
    if (o + b[i] > end)
      end = o + b[i];
    acc += b[i];
  }
  return end;
}

static zpp_status_t set_device(zpp_transport_t *t, const char *what) {
  cudaError_t e;
  /* The current device is per thread (any thread may test an op). */
  if (t->cuda_device >= 0 && (e = cudaSetDevice(t->cuda_device)) != cudaSuccess)
    return zpp_algo_cuda_err(e, what, "cudaSetDevice");
  return ZPP_OK;
}

/* Waits until the work on op's stream so far is done, by the op's deadline
 * (its timeout from the start); an abort (zpp_comm_abort from another
 * thread) ends the wait at the next poll.  cudaStreamSynchronize would
 * wait for ever where the caller's earlier work on the stream never
 * finishes (a kernel waiting for a peer that is gone); here that is
 * ZPP_ERR_TIMEOUT (or the abort's error), and the op's staging buffers
 * wait for the copies still queued (stage_pending) instead of going back
 * to the pool under them. */
static zpp_status_t stream_wait(zpp_xop_t *op, const char *step) {
  long pause_ns = 1000;
  for (;;) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)op->stream);
    if (e == cudaSuccess)
      return ZPP_OK;
    /* cudaErrorNotReady is the thread's last error now; clear it, or the
     * next launch checked with cudaGetLastError (the caller's) fails */
    if (e == cudaErrorNotReady)
      (void)cudaGetLastError();
    if (e != cudaErrorNotReady) {
      op->stage_pending = 1;
      return zpp_algo_cuda_err(e, op->what, step);
    }
    if (atomic_load(&op->t->broken)) { /* zpp_comm_abort, another thread */
      op->stage_pending = 1;
      return zpp_transport_broken_error(op->t, op->what);
    }
    if (zpp_time_ns() > op->limit_ns) {
      op->stage_pending = 1;
      return zpp_error(ZPP_ERR_TIMEOUT, op->what,
                       "%s: the stream's earlier work did not finish within "
                       "%.3g s (ZPP_TIMEOUT_S)", step, op->t->timeout_s);
    }
    zpp_pause_ns(&pause_ns);
  }
}

/* The blocks of a v-variant (b[i] bytes at d[i], packed when d is NULL)
 * as runs of contiguous bytes (off[r], len[r]): empty blocks dropped, a
 * block that starts where the previous one (in member order) ends joined to
 * it.  Returns the number of runs (at most n). */
static int block_runs(const size_t *b, const size_t *d, int n, size_t *off,
                      size_t *len) {
  size_t acc = 0;
  int i, nr = 0;
  for (i = 0; i < n; i++) {
    size_t o = d ? d[i] : acc;
    acc += b[i];
    if (b[i] == 0)
      continue;
    if (nr > 0 && off[nr - 1] + len[nr - 1] == o) {
      len[nr - 1] += b[i];
      continue;
    }
    off[nr] = o;
    len[nr] = b[i];
    nr++;
  }
  return nr;
}

/* Queues the copies of runs (off[r], len[r]) from src to dst on op's
 * stream (the whole [0, bytes) when nr < 0); *queued: how many. */
static zpp_status_t copy_runs(zpp_xop_t *op, void *dst, const void *src,
                              size_t bytes, const size_t *off,
                              const size_t *len, int nr, const char *step,
                              int *queued) {
  int r, whole = nr < 0;
  *queued = 0;
  for (r = 0; r < (whole ? 1 : nr); r++) {
    size_t o = whole ? 0 : off[r], l = whole ? bytes : len[r];
    cudaError_t e;
    if (l == 0)
      continue;
    e = cudaMemcpyAsync((char *)dst + o, (const char *)src + o, l,
                        cudaMemcpyDefault, (cudaStream_t)op->stream);
    if (e != cudaSuccess) {
      op->stage_pending |= *queued > 0; /* those may still run */
      return zpp_algo_cuda_err(e, op->what, step);
    }
    (*queued)++;
  }
  return ZPP_OK;
}

/* Device-to-host copy into pinned memory, waited for (bounded); with
 * nothing to copy, no wait (the caller's stream may be busy for long). */
static zpp_status_t copy_in(zpp_xop_t *op, void *dst, const void *src,
                            size_t bytes, const size_t *off,
                            const size_t *len, int nr) {
  int queued = 0;
  ZPP_CHECK(copy_runs(op, dst, src, bytes, off, len, nr,
                      "device-to-host staging", &queued));
  return queued > 0 ? stream_wait(op, "device-to-host staging") : ZPP_OK;
}
#endif

/* Device buffers: the op's input is copied to pinned memory now; *send /
 * *recv then point at the pinned copies, laid out as the user's buffers.
 * For the v-variants only the blocks move, in both directions: a gap
 * between them (an empty block to myself: qgZ's all-to-alls) is neither
 * read, where it may never have been written, nor written back, so it
 * keeps what the caller left there. */
zpp_status_t zpp_algo_stage(zpp_xop_t *op, const zpp_xfer_desc_t *a,
                            const void **send, void **recv) {
#if ZPP_HAVE_CUDA
  zpp_transport_t *t = op->t;
  const char *what = op->what;
  size_t in = 0, out = 0, es = zpp_dtype_size(a->dtype);
  int n = op->n, v_in = 0;
  if (!zpp_cuda_available())
    return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                     "mem ZPP_MEMORY_DEVICE: no usable CUDA device");
  ZPP_CHECK(set_device(t, what));
  op->nu = -1; /* all of the output, but for the v-variants (below) */
  switch (a->kind) {
  case ZPP_XFER_ALLGATHER:
    in = a->bytes;
    out = a->bytes * (size_t)n;
    break;
  case ZPP_XFER_ALLGATHERV:
    out = extent(a->recv_bytes, a->recv_displs, n);
    in = a->recv_bytes[op->me];
    op->nu = block_runs(a->recv_bytes, a->recv_displs, n, op->uoff, op->ulen);
    break;
  case ZPP_XFER_ALLTOALL: /* zpp_xfer_start cleared its arrays */
  case ZPP_XFER_ALLTOALLV:
    if (a->send_bytes == NULL) {
      in = out = a->bytes * (size_t)n;
    } else {
      in = extent(a->send_bytes, a->send_displs, n);
      out = extent(a->recv_bytes, a->recv_displs, n);
      v_in = 1;
    }
    break;
  case ZPP_XFER_REDUCE_SCATTER:
    out = a->count * es;
    in = out * (size_t)n;
    break;
  case ZPP_XFER_ALLREDUCE:
    in = out = a->count * es;
    break;
  case ZPP_XFER_BARRIER:
    return ZPP_OK;
  }
  op->staged = 1;
  op->stream = a->stream;
  op->user_recv = a->recv;
  op->out_bytes = out;
  ZPP_CHECK(zpp_algo_pinned_get(t, in + 1, &op->stage_in, what));
  ZPP_CHECK(zpp_algo_pinned_get(t, out + 1, &op->stage_out, what));
  if (v_in) { /* the send runs first, in the table the recv runs then take */
    int nr = block_runs(a->send_bytes, a->send_displs, n, op->uoff, op->ulen);
    ZPP_CHECK(copy_in(op, op->stage_in.p, a->send, in, op->uoff, op->ulen,
                      nr));
    op->nu = block_runs(a->recv_bytes, a->recv_displs, n, op->uoff, op->ulen);
  } else {
    ZPP_CHECK(copy_in(op, op->stage_in.p, a->send, in, NULL, NULL, -1));
  }
  *send = op->stage_in.p;
  *recv = op->stage_out.p;
  return ZPP_OK;
#else
  (void)a;
  (void)send;
  (void)recv;
  return zpp_error(ZPP_ERR_UNSUPPORTED, op->what,
                   "mem ZPP_MEMORY_DEVICE: zpp was built without CUDA");
#endif
}

/* The op's output is complete in host memory: enqueue the copy to the
 * device (synchronised with ZPP_XFER_SYNC_OUT) and free the buffers. */
zpp_status_t zpp_algo_unstage(zpp_xop_t *op) {
#if ZPP_HAVE_CUDA
  zpp_status_t st;
  int pending = 0, queued = 0;
  if (!op->staged || op->out_bytes == 0) {
    zpp_algo_release_buffers(op, 0);
    return ZPP_OK;
  }
  st = set_device(op->t, op->what);
  if (st == ZPP_OK)
    st = copy_runs(op, op->user_recv, op->stage_out.p, op->out_bytes,
                   op->uoff, op->ulen, op->nu, "host-to-device staging",
                   &queued);
  if (st == ZPP_OK && queued > 0) {
    if (op->sync_out)
      st = stream_wait(op, "host-to-device staging"); /* pending on failure */
    else
      pending = 1;
  }
  zpp_algo_release_buffers(op, pending);
  return st;
#else
  zpp_algo_release_buffers(op, 0);
  return ZPP_OK;
#endif
}
