/*
 * The hierarchical family (described at the top of op.c;
 * docs/design.md, "Transports", gives the byte formulas): all-gather and
 * reduce-scatter in two stages, one across nodes and one within them,
 * over chunks, so that round r carries the first stage of chunk r with the
 * second stage of chunk r - 1.
 */
#include "algo/algo_impl.h"
#include "core/core.h"
#include "transport/transport_impl.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Whether the hierarchical family applies to group g: more than one node,
 * and some node with more than one member (with one member per node there
 * is nothing to aggregate: the flat algorithms are it).  Whether an op
 * runs it is zpp_algo_choose's answer (tune.c). */
int zpp_algo_hier_applies(const zpp_tgroup_t *gr) {
  return gr->nh > 1 && gr->nh < gr->size;
}

/* The dtype a node's partial sum travels in: fp32 for fp16 (an fp16
 * partial overflows past 65504 where the total, after cancellation across
 * nodes, need not: 4 fp16 gradients of 20000 on one node, -20000 on the
 * other), so the inter-node partials of fp16 take twice the bytes; bf16
 * keeps its own (its range is fp32's: it overflows only where the fp32
 * partial lies within 2^-8 of fp32's own limit, docs/collectives.md),
 * fp32 is itself. */
static zpp_dtype_t hier_partial_dtype(zpp_dtype_t dtype) {
  return dtype == ZPP_FLOAT16 ? ZPP_FLOAT32 : dtype;
}

/* Chunks of a stage whose largest block is `maxbytes`: `want` when the
 * op's choice set it (1..8), else from ZPP_HIER_CHUNK; the same on every
 * member, since every member knows every block size. */
static int hier_chunks(const zpp_transport_t *t, int want, size_t maxbytes) {
  size_t c;
  if (want > 0)
    return want;
  if (t->hier_chunk == 0 || maxbytes <= t->hier_chunk)
    return 1;
  c = (maxbytes + t->hier_chunk - 1) / t->hier_chunk;
  return c > 8 ? 8 : (int)c;
}

/* Member at position `pos` mod the size of node k's run. */
static int node_member(const zpp_tgroup_t *gr, int k, int pos) {
  int size = gr->hoff[k + 1] - gr->hoff[k];
  return gr->ring[gr->hoff[k] + pos % size];
}

/* My node, the owners on it, and what I own (the same set for both
 * collectives: I gather and forward the blocks of the members whose
 * slices I reduce). */
void zpp_algo_hier_setup(zpp_xop_t *op) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  int w;
  op->hn = gr->hnode[op->me];
  op->hl = gr->hlocal[op->me];
  op->hs = gr->hoff[op->hn + 1] - gr->hoff[op->hn];
  op->na = 0;
  for (w = 0; w < op->n; w++) {
    op->own[w] = node_member(gr, op->hn, gr->hlocal[w]);
    op->ai[w] = -1;
    if (op->own[w] == op->me) {
      op->ai[w] = op->na;
      op->alist[op->na++] = w;
    }
  }
}

/* Transfers a hierarchical round can hold (sends or receives): stage X or
 * B is at most one per member, stage N or A at most one per member plus
 * (hs - 1) per member I own. */
int zpp_algo_hier_slots(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
  int hs = gr->hoff[gr->hnode[gr->index] + 1] - gr->hoff[gr->hnode[gr->index]];
  int na = 0, w;
  (void)t;
  for (w = 0; w < gr->size; w++)
    na += node_member(gr, gr->hnode[gr->index], gr->hlocal[w]) == gr->index;
  return 2 * gr->size + (hs - 1) * na;
}

/* All-gather round r: stage X of chunk r (r < hc), stage N of chunk r - 1
 * (r >= 1).  To one peer both sides list the blocks in member order, so
 * transfers of a pair match in posting order. */
static zpp_status_t hag_round(zpp_xop_t *op, int r) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  int n = op->n, me = op->me, C = op->hc, ns = 0, nr = 0, s, w, a;
  size_t lo, len;
  if (r < C) {
    const char *mine = op->ring_send != NULL ? op->ring_send
                                             : op->ring_buf + op->displs[me];
    zpp_algo_chunk_of(op->bytes[me], r, C, &lo, &len);
    for (s = 1; s < gr->nh; s++)
      zpp_algo_data_xfer(op, &op->dout[ns++],
                         node_member(gr, (op->hn + s) % gr->nh, op->hl),
                         mine + lo, len);
    for (w = 0; w < n; w++)
      if (gr->hnode[w] != op->hn && op->own[w] == me) {
        zpp_algo_chunk_of(op->bytes[w], r, C, &lo, &len);
        zpp_algo_data_xfer(op, &op->din[nr++], w,
                           op->ring_buf + op->displs[w] + lo, len);
      }
  }
  if (r >= 1) {
    for (s = 1; s < op->hs; s++) {
      int j = node_member(gr, op->hn, op->hl + s);
      for (a = 0; a < op->na; a++) {
        w = op->alist[a];
        zpp_algo_chunk_of(op->bytes[w], r - 1, C, &lo, &len);
        zpp_algo_data_xfer(op, &op->dout[ns++], j,
                           op->ring_buf + op->displs[w] + lo, len);
      }
      for (w = 0; w < n; w++)
        if (op->own[w] == j) {
          zpp_algo_chunk_of(op->bytes[w], r - 1, C, &lo, &len);
          zpp_algo_data_xfer(op, &op->din[nr++], j,
                             op->ring_buf + op->displs[w] + lo, len);
        }
    }
  }
  op->nin = nr;
  op->nout = ns;
  op->ctl = 0;
  return zpp_algo_post_round(op);
}

/* Reduce-scatter round r: stage A of chunk r (r < hc), stage B of chunk
 * r - 1 (r >= 1).  Chunks are element ranges of each slice. */
static zpp_status_t hrs_round(zpp_xop_t *op, int r) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  size_t es = zpp_dtype_size(op->dtype), pes = zpp_dtype_size(op->pdt), lo, cl;
  int n = op->n, me = op->me, C = op->hc, ns = 0, nr = 0, s, w, a;
  if (r < C) {
    for (s = 1; s < op->hs; s++) {
      int jl = (op->hl + s) % op->hs, jp = jl < op->hl ? jl : jl - 1;
      int j = node_member(gr, op->hn, jl);
      for (w = 0; w < n; w++)
        if (op->own[w] == j) {
          zpp_algo_chunk_of(op->len[w], r, C, &lo, &cl);
          zpp_algo_data_xfer(op, &op->dout[ns++], j,
                             op->p_send + (op->off[w] + lo) * es, cl * es);
        }
      for (a = 0; a < op->na; a++) {
        zpp_algo_chunk_of(op->len[op->alist[a]], r, C, &lo, &cl);
        zpp_algo_data_xfer(
            op, &op->din[nr++], j,
            op->ra + ((size_t)jp * op->la + op->pre[a] + lo) * es, cl * es);
      }
    }
  }
  if (r >= 1) {
    for (a = 0; a < op->na; a++) {
      w = op->alist[a];
      if (gr->hnode[w] == op->hn)
        continue;
      zpp_algo_chunk_of(op->len[w], r - 1, C, &lo, &cl);
      zpp_algo_data_xfer(op, &op->dout[ns++], w,
                         op->pp + (op->pre[a] + lo) * pes, cl * pes);
    }
    zpp_algo_chunk_of(op->len[me], r - 1, C, &lo, &cl);
    for (s = 1; s < gr->nh; s++) {
      int k = (op->hn + s) % gr->nh, kp = k < op->hn ? k : k - 1;
      zpp_algo_data_xfer(op, &op->din[nr++], node_member(gr, k, op->hl),
                         op->rbuf + ((size_t)kp * op->len[me] + lo) * pes,
                         cl * pes);
    }
  }
  op->nin = nr;
  op->nout = ns;
  op->ctl = 0;
  return zpp_algo_post_round(op);
}

/* Chunk c of every partial sum I own: my node's contributions in local
 * order (mine from the send buffer), fp32, rounded to the wire dtype. */
static void hrs_partial(zpp_xop_t *op, int c) {
  size_t es = zpp_dtype_size(op->dtype), pes = zpp_dtype_size(op->pdt), lo, cl;
  int a, jl;
  for (a = 0; a < op->na; a++) {
    int w = op->alist[a];
    zpp_algo_chunk_of(op->len[w], c, op->hc, &lo, &cl);
    for (jl = 0; jl < op->hs; jl++) {
      int jp = jl < op->hl ? jl : jl - 1;
      op->blocks[jl] =
          jl == op->hl
              ? op->p_send + (op->off[w] + lo) * es
              : op->ra + ((size_t)jp * op->la + op->pre[a] + lo) * es;
    }
    zpp_algo_reduce_blocks(op->pp + (op->pre[a] + lo) * pes, op->pdt,
                           op->blocks, op->dtype, op->hs, cl, 0.0f);
  }
}

/* Chunk c of my slice: the nodes' partial sums in node order (mine from
 * pp), fp32, MEAN divided by the group size, rounded once. */
static void hrs_final(zpp_xop_t *op, int c) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  size_t es = zpp_dtype_size(op->dtype), pes = zpp_dtype_size(op->pdt);
  size_t lo, cl, mine = op->len[op->me];
  int k;
  zpp_algo_chunk_of(mine, c, op->hc, &lo, &cl);
  for (k = 0; k < gr->nh; k++) {
    int kp = k < op->hn ? k : k - 1;
    op->blocks[k] = k == op->hn
                        ? op->pp + (op->pre[op->ai[op->me]] + lo) * pes
                        : op->rbuf + ((size_t)kp * mine + lo) * pes;
  }
  zpp_algo_reduce_blocks((char *)op->dst + lo * es, op->dtype, op->blocks,
                         op->pdt, gr->nh, cl,
                         op->rop == ZPP_REDUCE_MEAN ? (float)op->n : 0.0f);
}

/* Reduce-scatter of shards (off[i], len[i]) of `send` into dst: owners,
 * chunks and the scratch (one buffer: pp and rbuf in the wire dtype, then
 * ra in the dtype). */
zpp_status_t zpp_algo_setup_hrs(zpp_xop_t *op, const void *send, void *dst) {
  const zpp_tgroup_t *gr = &op->t->grp[op->g];
  size_t es = zpp_dtype_size(op->dtype), maxlen = 0, wire, in;
  size_t pes;
  int a, w;
  op->pdt = hier_partial_dtype(op->dtype);
  pes = zpp_dtype_size(op->pdt);
  zpp_algo_hier_setup(op);
  op->la = 0;
  for (a = 0; a < op->na; a++) {
    op->pre[a] = op->la;
    op->la += op->len[op->alist[a]];
  }
  for (w = 0; w < op->n; w++)
    if (op->len[w] > maxlen)
      maxlen = op->len[w];
  /* elements: (hs - 1) * la (ra, dtype) + la + (nh - 1) * len[me] (pp and
   * rbuf, wire dtype); with equal nodes n * count + (M - 1) * count, the
   * caller's input and a bit; a small node of an uneven layout owns more.
   * Each part below SIZE_MAX / 4 bytes, so their sum cannot wrap. */
  if (op->la > 0 && (size_t)op->hs > SIZE_MAX / 4 / pes / op->la)
    return zpp_error(ZPP_ERR_OVERFLOW, op->what, "scratch size overflows");
  in = (size_t)(op->hs - 1) * op->la * es;
  if (op->len[op->me] > 0 &&
      (size_t)gr->nh > SIZE_MAX / 4 / pes / op->len[op->me])
    return zpp_error(ZPP_ERR_OVERFLOW, op->what, "scratch size overflows");
  wire = (op->la + (size_t)(gr->nh - 1) * op->len[op->me]) * pes;
  ZPP_CHECK(zpp_algo_host_get(op->t, wire + in + 1, &op->tmp, op->what));
  op->pp = op->tmp.p;
  op->rbuf = op->pp + op->la * pes;
  op->ra = op->pp + wire;
  op->hc = hier_chunks(op->t, op->hc_rs, maxlen * es);
  op->p_send = send;
  op->dst = dst;
  return ZPP_OK;
}

/* The ZPP_PH_HAG step: rounds 0..hc (the chunks counted at step 0). */
zpp_status_t zpp_algo_hag_step(zpp_xop_t *op, int *end) {
  zpp_status_t st;
  if (op->step == 0) {
    size_t maxb = 0;
    int w;
    for (w = 0; w < op->n; w++)
      if (op->bytes[w] > maxb)
        maxb = op->bytes[w];
    op->hc = hier_chunks(op->t, op->hc_ag, maxb);
  }
  if (op->step > op->hc) {
    *end = 1;
    return ZPP_OK;
  }
  st = hag_round(op, op->step);
  if (st == ZPP_OK && op->step == 0 && op->ring_send != NULL)
    /* round 0 sends my block from ring_send: put it in place meanwhile
     * (stage N forwards it from there) */
    memmove(op->ring_buf + op->displs[op->me], op->ring_send,
            op->bytes[op->me]);
  op->step++;
  return st;
}

/* The ZPP_PH_HRS step.  Step r: round r - 1 is complete: its stage-A chunk is
 * reduced into partial sums, its stage-B chunk (r - 2) into my slice; then
 * round r goes out (it sends the partials of chunk r - 1). */
zpp_status_t zpp_algo_hrs_step(zpp_xop_t *op, int *end) {
  zpp_status_t st;
  int r = op->step;
  if (r >= 1 && r - 1 < op->hc)
    hrs_partial(op, r - 1);
  if (r >= 2)
    hrs_final(op, r - 2);
  if (r > op->hc) {
    *end = 1;
    return ZPP_OK;
  }
  st = hrs_round(op, r);
  op->step++;
  return st;
}
