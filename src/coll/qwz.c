/*
 * qwZ: the blockwise-quantized weight all-gather, as a pipelined plan of
 * encode, all-gather and decode steps per chunk.  docs/design.md,
 * "Collectives"; the wire format: docs/format.md.
 */
#include "coll/coll.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "engine/plan.h"
#include "quant/quant.h"

#define QWZ_DEPTH 3 /* chunk buffers in flight: gather k+2 while decoding k */
/* Chunks of a call (zpp_plan_chunk: every chunk but the last at least
 * ZPP_PIPE_MIN_CHUNK elements).  The first chunk's encode and gather and
 * the last one's decode run alone; from 32 * ZPP_PIPE_MIN_CHUNK elements
 * on, each is about 1/QWZ_PARTS of the call.  32 rather than qgZ's 8: on
 * the real 2x4 link at 1.6 Gbit/s per node, 16 MiB shards, qwZ INT8 took
 * 0.78 of the time with 32 chunks that it took with 8, and 64 were no
 * better for INT8 and slower for INT4 (docs/benchmarks.md, section 9,
 * "qwZ's chunks"). */
#define QWZ_PARTS 32

/* qwZ as a plan.  The shard is cut into chunks of whole blocks (one chunk
 * unless chunking pays: zpp_plan_chunk); per chunk k, in buffer slot
 * k % QWZ_DEPTH:
 *   E_k  encode my chunk into slot + me * bytes_k     (after D_{k-DEPTH})
 *   X_k  in-place all-gather of the slot over WORLD   (after E_k)
 *   D_k  decode every rank's chunk into recv          (after X_k)
 * so the engine decodes chunk k while k+1 and k+2 are on the wire.  Since
 * chunks are whole blocks, every decoded value is the unchunked one. */
typedef struct {
  zpp_exec_t ex;
  zpp_quant_config_t q;
  const void *send;
  void *recv;
  size_t count, chunk;
  zpp_dtype_t dtype;
  int n, me;
  uint8_t *buf[QWZ_DEPTH];
} qwz_ctx_t;

static void qwz_release(void *p) {
  qwz_ctx_t *c = (qwz_ctx_t *)p;
  int i;
  for (i = 0; i < QWZ_DEPTH; i++)
    zpp_k_free(&c->ex, c->buf[i]);
  free(c);
}

static size_t qwz_len(const qwz_ctx_t *c, size_t k) {
  size_t off = k * c->chunk;
  return c->count - off < c->chunk ? c->count - off : c->chunk;
}

static zpp_status_t qwz_encode(void *p, size_t k) {
  qwz_ctx_t *c = (qwz_ctx_t *)p;
  size_t len = qwz_len(c, k), e = zpp_coll_encoded_size(&c->q, len);
  const uint8_t *src =
      (const uint8_t *)c->send + k * c->chunk * zpp_dtype_size(c->dtype);
  /* stochastic rounding draws at the element's index in the whole tensor
   * (rank me's shard starts at me * count), so chunking does not change
   * the bytes */
  return zpp_k_encode_at(&c->ex, &c->q, c->dtype, src, len,
                         (uint64_t)c->me * c->count + k * c->chunk,
                         c->buf[k % QWZ_DEPTH] + (size_t)c->me * e);
}

static zpp_status_t qwz_decode(void *p, size_t k) {
  qwz_ctx_t *c = (qwz_ctx_t *)p;
  size_t len = qwz_len(c, k), e = zpp_coll_encoded_size(&c->q, len);
  size_t ds = zpp_dtype_size(c->dtype), off = k * c->chunk;
  int r;
  for (r = 0; r < c->n; r++) {
    zpp_plan_poll(); /* keep the next chunks' gathers moving */
    ZPP_CHECK(zpp_k_decode(&c->ex, &c->q, c->buf[k % QWZ_DEPTH] + (size_t)r * e,
                           len, c->dtype,
                           (uint8_t *)c->recv + ((size_t)r * c->count + off) * ds));
  }
  return ZPP_OK;
}

static zpp_status_t qwz_plan(const char *func, const zpp_exec_t *ex,
                             const zpp_quant_config_t *q, const void *send,
                             void *recv, size_t count, zpp_dtype_t dtype,
                             zpp_request_t *req) {
  qwz_ctx_t *c;
  zpp_plan_t *p;
  size_t nchunks, k, ebuf;
  int i, nslots, dec[QWZ_DEPTH];
  zpp_status_t st = ZPP_OK;
  c = (qwz_ctx_t *)calloc(1, sizeof *c);
  if (c == NULL)
    return zpp_comm_fail(ex->comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                             "plan context"));
  c->ex = *ex;
  zpp_quant_config_get(q, &c->q); /* any accepted struct_size */
  c->send = send;
  c->recv = recv;
  c->count = count;
  c->dtype = dtype;
  c->n = zpp_transport_size(ex->t);
  c->me = zpp_transport_rank(ex->t);
  c->chunk = count;
  if (ex->mem == ZPP_MEMORY_HOST && c->n > 1 && count > 0)
    c->chunk = zpp_plan_chunk(count, q->block_size, QWZ_PARTS);
  nchunks = count == 0 ? 0 : (count + c->chunk - 1) / c->chunk;
  nslots = nchunks < QWZ_DEPTH ? (int)nchunks : QWZ_DEPTH;
  ebuf = zpp_coll_encoded_size(q, c->chunk);
  for (i = 0; i < nslots && st == ZPP_OK; i++)
    st = zpp_k_alloc(ex, (size_t)c->n * ebuf, (void **)&c->buf[i]);
  if (st != ZPP_OK) {
    qwz_release(c);
    return zpp_comm_fail(ex->comm, st);
  }
  ZPP_CHECK(zpp_comm_fail(ex->comm,
                          zpp_plan_create(func, ex, c, qwz_release, &p)));
  for (i = 0; i < QWZ_DEPTH; i++)
    dec[i] = ZPP_NO_STEP;
  if (nchunks > 0)
    ZPP_TRACE(ZPP_SUBSYS_COLL, "qwZ: %zu chunk(s) of %zu elements", nchunks,
              c->chunk);
  for (k = 0; k < nchunks; k++) {
    size_t bytes = zpp_coll_encoded_size(q, qwz_len(c, k));
    uint8_t *slot = c->buf[k % QWZ_DEPTH];
    zpp_xfer_desc_t x;
    int e, xs;
    e = zpp_plan_kernel(p, qwz_encode, k, dec[k % QWZ_DEPTH], ZPP_NO_STEP);
    memset(&x, 0, sizeof x);
    x.kind = ZPP_XFER_ALLGATHER;
    x.group = ZPP_GROUP_WORLD;
    x.send = slot + (size_t)c->me * bytes;
    x.recv = slot;
    x.bytes = bytes;
    xs = zpp_plan_xfer(p, &x, e, ZPP_NO_STEP);
    dec[k % QWZ_DEPTH] = zpp_plan_kernel(p, qwz_decode, k, xs, ZPP_NO_STEP);
  }
  return zpp_plan_submit(p, req);
}

/* The config words compared under ZPP_CHECK, once the config passed. */
static zpp_status_t qwz_words(zpp_coll_args_t *a, const zpp_exec_t *ex) {
  (void)ex;
  zpp_coll_quant_words(a->quant, a->words);
  a->nwords = 3;
  return ZPP_OK;
}

zpp_status_t zpp_qwz_allgather(zpp_comm_t comm, const zpp_quant_config_t *quant,
                               const void *sendbuf, void *recvbuf,
                               size_t count, zpp_dtype_t dtype,
                               zpp_stream_t stream, zpp_request_t *req) {
  zpp_coll_args_t a;
  zpp_exec_t ex;
  a = zpp_coll_args_init(__func__, comm, stream, sendbuf, recvbuf, count,
                         dtype);
  a.layout = ZPP_BUFS_GATHER;
  a.quant = quant;
  a.quant_name = "quant";
  a.quant_fp = "quant->";
  a.post = qwz_words;
  ZPP_CHECK(zpp_coll_prologue(&a, &ex));
  return qwz_plan(__func__, &ex, quant, sendbuf, recvbuf, count, dtype, req);
}
