/*
 * MPI backend.  Every operation is built from point-to-point transfers with
 * a known algorithm, never from MPI's own collectives, so each byte is
 * counted on the link it crosses (docs/design.md "Transports"):
 *
 *   allgather[v]    ring over the members in ring order (by node, then
 *                   local rank): n-1 steps, each member forwards one block
 *                   to its successor per step; ZPP_NET_RINGS > 1 runs
 *                   several rotated rings on chunks of the blocks;
 *   alltoall[v]     pairwise exchange: member i sends block j straight to
 *                   member j and receives block j from j; all n-1 pairs
 *                   posted at once, in the order i+1, i+2, ...;
 *   reduce_scatter  the same pairwise exchange of shards, then a local sum
 *                   in member order 0..n-1 with an fp32 accumulator,
 *                   rounded once to the dtype;
 *   allreduce       reduce_scatter over balanced shards (the first
 *                   count % n members hold one element more), then a ring
 *                   allgatherv of the reduced shards;
 *   barrier         MPI_Ibarrier (no payload).
 *
 * Operations are blocking.  Waits poll while transfers progress and sleep
 * once nothing has completed for ZPP_NET_SPIN_US (see wait_all), so a rank
 * waiting for a slower peer does not take a core from the ranks sharing
 * the machine; a wait longer than the timeout breaks the communicator and
 * returns ZPP_ERR_TIMEOUT.
 * Device memory is staged through pinned host buffers.
 */
#include "transport_impl.h"

#if ZPP_HAVE_MPI

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant_math.h"

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define TAG_DATA 7301
#define TAG_EMU 7302
/* MPI counts are int: larger transfers go as several messages. */
#define MAX_MSG ((size_t)1 << 30)

typedef struct {
  MPI_Comm comm[ZPP_NGROUPS]; /* WORLD is zpp's duplicate (not freed here) */
  int cuda_device;
  /* Reused per-operation storage (operations are serialised). */
  MPI_Request *req;
  int req_cap;
  int64_t *emu_hdr; /* deadlines received with inter-node messages */
  int64_t *emu_out; /* deadlines sent */
  int emu_cap;
  void *tmp; /* host scratch of reductions */
  size_t tmp_cap;
  int *idx; /* MPI_Testsome indices */
  int idx_cap;
  int64_t spin_ns; /* ZPP_NET_SPIN_US: busy polling after progress */
  int rings;       /* ZPP_NET_RINGS: rings of a ring all-gather */
  void *stage_in, *stage_out; /* pinned staging of device memory */
  size_t stage_in_cap, stage_out_cap;
} mpi_impl_t;

zpp_status_t zpp_mpi_error(int rc, const char *func, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", rc);
  msg[len < (int)sizeof msg ? len : (int)sizeof msg - 1] = '\0';
  return zpp_error(ZPP_ERR_MPI, func, "%s: %s", what, msg);
}

static zpp_status_t grow(void **p, size_t *cap, size_t need, const char *what) {
  void *q;
  if (need <= *cap)
    return ZPP_OK;
  q = realloc(*p, need);
  if (q == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%s of %zu bytes", what,
                     need);
  *p = q;
  *cap = need;
  return ZPP_OK;
}

/* ---- transfers ------------------------------------------------------------ */

/* One side of a transfer: a member index of the group, a buffer, bytes. */
typedef struct {
  int peer;
  const void *buf;
  size_t bytes;
} xfer_t;

static int chunks(size_t bytes) { return (int)((bytes + MAX_MSG - 1) / MAX_MSG); }

static zpp_status_t reserve(mpi_impl_t *m, int nreq, int nemu) {
  if (nreq > m->req_cap) {
    MPI_Request *r = realloc(m->req, (size_t)nreq * sizeof *r);
    if (r == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%d requests", nreq);
    m->req = r;
    m->req_cap = nreq;
  }
  if (nemu > m->emu_cap) {
    int64_t *a = realloc(m->emu_hdr, (size_t)nemu * sizeof *a);
    int64_t *b;
    if (a == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "emulation headers");
    m->emu_hdr = a;
    b = realloc(m->emu_out, (size_t)nemu * sizeof *b);
    if (b == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "emulation headers");
    m->emu_out = b;
    m->emu_cap = nemu;
  }
  return ZPP_OK;
}

/* Waits for n requests.  It polls without sleeping (yielding the core to
 * any runnable rank) for spin_ns after the start or the last completed
 * request, so a transfer in flight -- a large intra-node message moves in
 * fragments that need both sides to poll -- runs at full speed; after that
 * it sleeps between polls, 1 us doubling to 200 us, so a rank waiting for
 * a late peer does not burn a core.  Past the timeout the transport is
 * broken and ZPP_ERR_TIMEOUT returned. */
static zpp_status_t wait_all(zpp_transport_t *t, MPI_Request *req, int n,
                             int cancellable, const char *what,
                             zpp_group_t g) {
  mpi_impl_t *m = t->impl;
  int64_t now = zpp_time_ns(), limit, quiet_until;
  long pause_ns = 1000;
  int left = n, out = 0, rc, i;
  limit = t->timeout_s > 0 ? now + (int64_t)(t->timeout_s * 1e9) : INT64_MAX;
  quiet_until = now + m->spin_ns;
  if (n > m->idx_cap) {
    int *p = realloc(m->idx, (size_t)n * sizeof *p);
    if (p == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "%d request indices", n);
    m->idx = p;
    m->idx_cap = n;
  }
  while (left > 0) {
    rc = MPI_Testsome(n, req, &out, m->idx, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
      return zpp_mpi_error(rc, what, "MPI_Testsome");
    if (out == MPI_UNDEFINED)
      break; /* every request is inactive */
    now = zpp_time_ns();
    if (out > 0) {
      left -= out;
      quiet_until = now + m->spin_ns;
      pause_ns = 1000;
      continue;
    }
    if (now > limit)
      break;
    if (now < quiet_until) {
      sched_yield();
    } else {
      struct timespec ts = {0, pause_ns};
      nanosleep(&ts, NULL);
      if (pause_ns < 200000)
        pause_ns *= 2;
    }
  }
  if (left <= 0 || out == MPI_UNDEFINED)
    return ZPP_OK;
  /* Point-to-point requests are cancelled and released; a non-blocking
   * collective may be neither (MPI forbids it), so it is left to finish
   * when the late peers arrive. */
  for (i = 0; cancellable && i < n; i++) {
    if (req[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&req[i]);
      MPI_Request_free(&req[i]);
    }
  }
  zpp_transport_break(t, "%s on group %s timed out after %.3g s", what,
                      zpp_group_name(g), t->timeout_s);
  return zpp_error(ZPP_ERR_TIMEOUT, what,
                   "group %s: no completion within %.3g s (ZPP_TIMEOUT_S); "
                   "a peer is missing or stuck; the communicator is aborted",
                   zpp_group_name(g), t->timeout_s);
}

/* Posts every receive, then every send (in the given order, which is the
 * order they take my emulated NIC), waits, counts the bytes per peer and,
 * under link emulation, sleeps until the latest deadline carried by a
 * received message. */
static zpp_status_t exchange(zpp_transport_t *t, zpp_group_t g,
                             const xfer_t *send, int ns, const xfer_t *recv,
                             int nr, const char *what) {
  mpi_impl_t *m = t->impl;
  const zpp_tgroup_t *gr = &t->grp[g];
  MPI_Comm comm = m->comm[g];
  int nreq = 0, nemu = 0, i, k, rc, nhdr = 0;
  int64_t latest = 0;
  for (i = 0; i < ns; i++)
    nreq += chunks(send[i].bytes) + (t->emu_on ? 1 : 0);
  for (i = 0; i < nr; i++)
    nreq += chunks(recv[i].bytes) + (t->emu_on ? 1 : 0);
  nemu = t->emu_on ? ns + nr : 0;
  ZPP_CHECK(reserve(m, nreq > 0 ? nreq : 1, nemu));
  nreq = 0;
  for (i = 0; i < nr; i++) {
    char *p = (char *)recv[i].buf;
    size_t left = recv[i].bytes;
    int emu = t->emu_on &&
              zpp_transport_link(t, gr->members[recv[i].peer]) == ZPP_LINK_NET;
    if (left == 0)
      continue;
    if (emu) {
      rc = MPI_Irecv(&m->emu_hdr[nhdr++], 8, MPI_BYTE, recv[i].peer, TAG_EMU,
                     comm, &m->req[nreq++]);
      if (rc != MPI_SUCCESS)
        return zpp_mpi_error(rc, what, "MPI_Irecv");
    }
    for (k = 0; left > 0; k++) {
      size_t b = left < MAX_MSG ? left : MAX_MSG;
      rc = MPI_Irecv(p, (int)b, MPI_BYTE, recv[i].peer, TAG_DATA, comm,
                     &m->req[nreq++]);
      if (rc != MPI_SUCCESS)
        return zpp_mpi_error(rc, what, "MPI_Irecv");
      p += b;
      left -= b;
    }
  }
  for (i = 0; i < ns; i++) {
    const char *p = (const char *)send[i].buf;
    size_t left = send[i].bytes;
    int peer = gr->members[send[i].peer];
    if (left == 0)
      continue;
    if (t->emu_on && zpp_transport_link(t, peer) == ZPP_LINK_NET) {
      int64_t *d = &m->emu_out[i];
      *d = zpp_transport_emu_deadline(t, peer, send[i].bytes);
      rc = MPI_Isend(d, 8, MPI_BYTE, send[i].peer, TAG_EMU, comm,
                     &m->req[nreq++]);
      if (rc != MPI_SUCCESS)
        return zpp_mpi_error(rc, what, "MPI_Isend");
    }
    while (left > 0) {
      size_t b = left < MAX_MSG ? left : MAX_MSG;
      rc = MPI_Isend(p, (int)b, MPI_BYTE, send[i].peer, TAG_DATA, comm,
                     &m->req[nreq++]);
      if (rc != MPI_SUCCESS)
        return zpp_mpi_error(rc, what, "MPI_Isend");
      p += b;
      left -= b;
    }
  }
  ZPP_CHECK(wait_all(t, m->req, nreq, 1, what, g));
  for (i = 0; i < ns; i++)
    zpp_transport_account(t, gr->members[send[i].peer], send[i].bytes, 0);
  for (i = 0; i < nr; i++)
    zpp_transport_account(t, gr->members[recv[i].peer], 0, recv[i].bytes);
  for (i = 0; i < nhdr; i++)
    if (m->emu_hdr[i] > latest)
      latest = m->emu_hdr[i];
  zpp_transport_emu_wait(t, latest);
  return ZPP_OK;
}

/* ---- host algorithms ------------------------------------------------------ */

/* Rings ("channels"): ZPP_NET_RINGS rings run at once, each over its own
 * share of every block (chunk c of C: floor split, the first b % C chunks
 * one byte longer).  Ring c visits the nodes in order and each node's
 * members rotated by c, so its node boundaries -- the inter-node hops --
 * fall on other ranks than ring 0's, and the inter-node bytes leave
 * through C ranks per node instead of one.  C is capped by the largest
 * node run of the group (rotating a run of one changes nothing). */
static int ring_channels(const zpp_transport_t *t, const zpp_tgroup_t *gr) {
  const mpi_impl_t *m = t->impl;
  int i = 0, best = 1, n = gr->size;
  while (i < n) {
    int node = t->topo->node_of[gr->members[gr->ring[i]]], j = i;
    while (j < n && t->topo->node_of[gr->members[gr->ring[j]]] == node)
      j++;
    if (j - i > best)
      best = j - i;
    i = j;
  }
  return m->rings < best ? m->rings : best;
}

/* Ring order of channel c: gr->ring with each node's run rotated by c. */
static void channel_ring(const zpp_transport_t *t, const zpp_tgroup_t *gr,
                         int c, int *out) {
  int n = gr->size, i = 0, k;
  while (i < n) {
    int node = t->topo->node_of[gr->members[gr->ring[i]]], j = i, len;
    while (j < n && t->topo->node_of[gr->members[gr->ring[j]]] == node)
      j++;
    len = j - i;
    for (k = 0; k < len; k++)
      out[i + k] = gr->ring[i + (k + c) % len];
    i = j;
  }
}

static void chunk_of(size_t b, int c, int nc, size_t *lo, size_t *len) {
  size_t q = b / (size_t)nc, r = b % (size_t)nc, cc = (size_t)c;
  *len = q + (cc < r ? 1 : 0);
  *lo = q * cc + (cc < r ? cc : r);
}

/* Ring allgatherv: blocks by member index at displs (packed when NULL).
 * My block must already be in place.  n-1 steps; per step and ring every
 * member forwards one chunk to its successor. */
static zpp_status_t ring_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                   char *recv, const size_t *bytes,
                                   const size_t *displs, const char *what) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, nc, s, i, c, *rings = NULL, *pos;
  size_t *off = NULL;
  xfer_t *out, *in;
  zpp_status_t st = ZPP_OK;
  if (n == 1)
    return ZPP_OK;
  nc = ring_channels(t, gr);
  off = malloc((size_t)n * sizeof *off);
  rings = malloc(((size_t)nc * (size_t)(n + 1)) * sizeof *rings);
  out = malloc(2 * (size_t)nc * sizeof *out);
  if (off == NULL || rings == NULL || out == NULL) {
    free(off);
    free(rings);
    free(out);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "ring tables of %d members",
                     n);
  }
  in = out + nc;
  pos = rings + (size_t)nc * (size_t)n;
  if (displs == NULL) {
    size_t acc = 0;
    for (i = 0; i < n; i++) {
      off[i] = acc;
      acc += bytes[i];
    }
    displs = off;
  }
  for (c = 0; c < nc; c++) {
    int *R = rings + (size_t)c * (size_t)n;
    channel_ring(t, gr, c, R);
    for (i = 0; i < n; i++)
      if (R[i] == gr->index)
        pos[c] = i;
  }
  for (s = 0; s < n - 1 && st == ZPP_OK; s++) {
    for (c = 0; c < nc; c++) {
      const int *R = rings + (size_t)c * (size_t)n;
      int p = pos[c];
      int sb = R[(p - s + n) % n];         /* block I forward */
      int rb = R[(p - s - 1 + 2 * n) % n]; /* block I receive */
      size_t lo, len;
      chunk_of(bytes[sb], c, nc, &lo, &len);
      out[c].peer = R[(p + 1) % n];
      out[c].buf = recv + displs[sb] + lo;
      out[c].bytes = len;
      chunk_of(bytes[rb], c, nc, &lo, &len);
      in[c].peer = R[(p + n - 1) % n];
      in[c].buf = recv + displs[rb] + lo;
      in[c].bytes = len;
    }
    /* Two rings may join the same pair of ranks: both sides post them in
     * ring order, and MPI matches messages of one pair in order. */
    st = exchange(t, g, out, nc, in, nc, what);
  }
  free(out);
  free(rings);
  free(off);
  return st;
}

static zpp_status_t host_allgather(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, size_t bytes, void *recv) {
  const zpp_tgroup_t *gr = &t->grp[g];
  size_t *cnt;
  zpp_status_t st;
  int i;
  char *mine = (char *)recv + (size_t)gr->index * bytes;
  if (send != mine && bytes > 0)
    memcpy(mine, send, bytes);
  cnt = malloc((size_t)gr->size * sizeof *cnt);
  if (cnt == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "allgather", "%d counts", gr->size);
  for (i = 0; i < gr->size; i++)
    cnt[i] = bytes;
  st = ring_allgatherv(t, g, recv, cnt, NULL, "allgather");
  free(cnt);
  return st;
}

static size_t displ_of(const size_t *bytes, const size_t *displs, int i) {
  size_t acc = 0;
  int k;
  if (displs)
    return displs[i];
  for (k = 0; k < i; k++)
    acc += bytes[k];
  return acc;
}

static zpp_status_t host_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                    const void *send, void *recv,
                                    const size_t *bytes,
                                    const size_t *displs) {
  int me = t->grp[g].index;
  char *mine = (char *)recv + displ_of(bytes, displs, me);
  if (send != mine && bytes[me] > 0)
    memmove(mine, send, bytes[me]);
  return ring_allgatherv(t, g, recv, bytes, displs, "allgatherv");
}

static zpp_status_t host_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, const size_t *sbytes,
                                   const size_t *sdispls, void *recv,
                                   const size_t *rbytes,
                                   const size_t *rdispls, const char *what) {
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, me = gr->index, s;
  xfer_t *out, *in;
  size_t *so, *ro, acc;
  zpp_status_t st;
  out = malloc((size_t)n * (2 * sizeof(xfer_t) + 2 * sizeof(size_t)));
  if (out == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "%d peers", n);
  in = out + n;
  so = (size_t *)(in + n);
  ro = so + n;
  for (s = 0, acc = 0; s < n; s++) {
    so[s] = sdispls ? sdispls[s] : acc;
    acc += sbytes[s];
  }
  for (s = 0, acc = 0; s < n; s++) {
    ro[s] = rdispls ? rdispls[s] : acc;
    acc += rbytes[s];
  }
  if (sbytes[me] != rbytes[me]) {
    free(out);
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, what,
                     "send_bytes[%d] = %zu but recv_bytes[%d] = %zu: my block "
                     "to myself must have one size",
                     me, sbytes[me], me, rbytes[me]);
  }
  if (sbytes[me] > 0)
    memmove((char *)recv + ro[me], (const char *)send + so[me], sbytes[me]);
  for (s = 1; s < n; s++) {
    int to = (me + s) % n, from = (me - s + n) % n;
    out[s - 1].peer = to;
    out[s - 1].buf = (const char *)send + so[to];
    out[s - 1].bytes = sbytes[to];
    in[s - 1].peer = from;
    in[s - 1].buf = (char *)recv + ro[from];
    in[s - 1].bytes = rbytes[from];
  }
  st = exchange(t, g, out, n - 1, in, n - 1, what);
  free(out);
  return st;
}

/* Shard of member j of a balanced split of `count` elements over n. */
static void shard(size_t count, int n, int j, size_t *off, size_t *len) {
  size_t q = count / (size_t)n, r = count % (size_t)n, jj = (size_t)j;
  *len = q + (jj < r ? 1 : 0);
  *off = jj * q + (jj < r ? jj : r);
}

/* dst[e] = sum over members i = 0..n-1 of block i, element e, in member
 * order with an fp32 accumulator, rounded once to dtype.  block i is at
 * blocks[i]. */
static void reduce_blocks(void *dst, const void *const *blocks, int n,
                          size_t count, zpp_dtype_t dtype) {
  size_t e;
  int i, dt = (int)dtype;
  for (e = 0; e < count; e++) {
    float acc = zpp_qm_load(blocks[0], e, dt);
    for (i = 1; i < n; i++)
      acc = zpp_qm_add(acc, zpp_qm_load(blocks[i], e, dt));
    zpp_qm_store(dst, e, dt, acc);
  }
}

/* Reduce-scatter of shards given by (off, len) per member: pairwise
 * exchange, then the ordered sum into `dst` (my shard). */
static zpp_status_t host_reduce_shards(zpp_transport_t *t, zpp_group_t g,
                                       const void *send, void *dst,
                                       const size_t *off, const size_t *len,
                                       zpp_dtype_t dtype, const char *what) {
  mpi_impl_t *m = t->impl;
  const zpp_tgroup_t *gr = &t->grp[g];
  int n = gr->size, me = gr->index, i;
  size_t es = zpp_dtype_size(dtype), mine = len[me] * es;
  size_t *sb, *so, *rb, *ro;
  const void **blocks;
  zpp_status_t st;
  if (n == 1) {
    if (dst != (const char *)send + off[0] * es)
      memmove(dst, (const char *)send + off[0] * es, mine);
    return ZPP_OK;
  }
  if (mine > 0 && (size_t)n > SIZE_MAX / mine)
    return zpp_error(ZPP_ERR_OVERFLOW, what, "scratch size overflows");
  ZPP_CHECK(grow(&m->tmp, &m->tmp_cap, mine * (size_t)n + 1, "reduction scratch"));
  sb = malloc((size_t)n * 4 * sizeof *sb + (size_t)n * sizeof *blocks);
  if (sb == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, what, "%d peers", n);
  so = sb + n;
  rb = so + n;
  ro = rb + n;
  blocks = (const void **)(ro + n);
  for (i = 0; i < n; i++) {
    sb[i] = i == me ? 0 : len[i] * es;
    so[i] = off[i] * es;
    rb[i] = i == me ? 0 : mine;
    ro[i] = (size_t)i * mine;
    blocks[i] = i == me ? (const char *)send + off[me] * es
                        : (const char *)m->tmp + ro[i];
  }
  st = host_alltoallv(t, g, send, sb, so, m->tmp, rb, ro, what);
  if (st == ZPP_OK)
    reduce_blocks(dst, blocks, n, len[me], dtype);
  free(sb);
  return st;
}

static zpp_status_t host_reduce_scatter(zpp_transport_t *t, zpp_group_t g,
                                        const void *send, void *recv,
                                        size_t count, zpp_dtype_t dtype) {
  int n = t->grp[g].size, i;
  size_t *off = malloc(2 * (size_t)n * sizeof *off), *len;
  zpp_status_t st;
  if (off == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "reduce_scatter", "%d shards", n);
  len = off + n;
  for (i = 0; i < n; i++) {
    off[i] = (size_t)i * count;
    len[i] = count;
  }
  st = host_reduce_shards(t, g, send, recv, off, len, dtype, "reduce_scatter");
  free(off);
  return st;
}

static zpp_status_t host_allreduce(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, void *recv, size_t count,
                                   zpp_dtype_t dtype) {
  int n = t->grp[g].size, me = t->grp[g].index, i;
  size_t es = zpp_dtype_size(dtype);
  size_t *off = malloc(4 * (size_t)n * sizeof *off), *len, *boff, *blen;
  zpp_status_t st;
  if (off == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "allreduce", "%d shards", n);
  len = off + n;
  boff = len + n;
  blen = boff + n;
  for (i = 0; i < n; i++) {
    shard(count, n, i, &off[i], &len[i]);
    boff[i] = off[i] * es;
    blen[i] = len[i] * es;
  }
  /* The reduced shard lands in place in recv; reading send's shard `me`
   * and writing recv's is element by element, so send == recv is safe. */
  st = host_reduce_shards(t, g, send, (char *)recv + boff[me], off, len, dtype,
                          "allreduce");
  if (st == ZPP_OK)
    st = ring_allgatherv(t, g, recv, blen, boff, "allreduce");
  free(off);
  return st;
}

/* ---- device staging -------------------------------------------------------- */

#if ZPP_HAVE_CUDA
static zpp_status_t cuda_err(cudaError_t e, const char *what, const char *call) {
  return zpp_error(ZPP_ERR_CUDA, what, "%s: %s", call, cudaGetErrorString(e));
}

static zpp_status_t pinned(void **p, size_t *cap, size_t need,
                           const char *what) {
  cudaError_t e;
  if (need <= *cap)
    return ZPP_OK;
  if (*p != NULL)
    cudaFreeHost(*p);
  *p = NULL;
  *cap = 0;
  e = cudaMallocHost(p, need);
  if (e != cudaSuccess)
    return cuda_err(e, what, "cudaMallocHost");
  *cap = need;
  return ZPP_OK;
}

/* Copies device input to pinned memory; the caller runs the host algorithm
 * between stage_in and stage_out. */
static zpp_status_t stage_in(zpp_transport_t *t, const void *src, size_t bytes,
                             size_t out_bytes, void *stream, const char *what) {
  mpi_impl_t *m = t->impl;
  cudaError_t e;
  if (!zpp_cuda_available())
    return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                     "mem ZPP_MEMORY_DEVICE: no usable CUDA device");
  /* The current device is per thread (a progress thread may call us). */
  if (m->cuda_device >= 0 && (e = cudaSetDevice(m->cuda_device)) != cudaSuccess)
    return cuda_err(e, what, "cudaSetDevice");
  ZPP_CHECK(pinned(&m->stage_in, &m->stage_in_cap, bytes + 1, what));
  ZPP_CHECK(pinned(&m->stage_out, &m->stage_out_cap, out_bytes + 1, what));
  if (bytes == 0)
    return ZPP_OK;
  e = cudaMemcpyAsync(m->stage_in, src, bytes, cudaMemcpyDefault,
                      (cudaStream_t)stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize((cudaStream_t)stream);
  return e == cudaSuccess ? ZPP_OK : cuda_err(e, what, "device-to-host staging");
}

static zpp_status_t stage_out(zpp_transport_t *t, void *dst, size_t bytes,
                              void *stream, const char *what) {
  mpi_impl_t *m = t->impl;
  cudaError_t e;
  if (bytes == 0)
    return ZPP_OK;
  e = cudaMemcpyAsync(dst, m->stage_out, bytes, cudaMemcpyDefault,
                      (cudaStream_t)stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize((cudaStream_t)stream);
  return e == cudaSuccess ? ZPP_OK : cuda_err(e, what, "host-to-device staging");
}
#define STAGED(t) (((mpi_impl_t *)(t)->impl)->stage_in)
#define STAGED_OUT(t) (((mpi_impl_t *)(t)->impl)->stage_out)
#endif

#if !ZPP_HAVE_CUDA
static zpp_status_t no_device(const char *what) {
  return zpp_error(ZPP_ERR_UNSUPPORTED, what,
                   "mem ZPP_MEMORY_DEVICE: zpp was built without CUDA");
}
#endif

static size_t sum_bytes(const size_t *b, const size_t *d, int n) {
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

/* ---- the table ----------------------------------------------------------- */

static zpp_status_t mpi_allgather(zpp_transport_t *t, zpp_group_t g,
                                  const void *send, size_t bytes, void *recv,
                                  zpp_memory_t mem, void *stream) {
  size_t total = bytes * (size_t)t->grp[g].size;
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_allgather(t, g, send, bytes, recv);
#if ZPP_HAVE_CUDA
  ZPP_CHECK(stage_in(t, send, bytes, total, stream, "allgather"));
  ZPP_CHECK(host_allgather(t, g, STAGED(t), bytes, STAGED_OUT(t)));
  return stage_out(t, recv, total, stream, "allgather");
#else
  (void)total;
  return no_device("allgather");
#endif
}

static zpp_status_t mpi_allgatherv(zpp_transport_t *t, zpp_group_t g,
                                   const void *send, void *recv,
                                   const size_t *bytes, const size_t *displs,
                                   zpp_memory_t mem, void *stream) {
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_allgatherv(t, g, send, recv, bytes, displs);
#if ZPP_HAVE_CUDA
  {
    size_t total = sum_bytes(bytes, displs, t->grp[g].size);
    size_t mine = bytes[t->grp[g].index];
    /* The gap between blocks keeps its device contents: stage it too. */
    ZPP_CHECK(stage_in(t, recv, total, total, stream, "allgatherv"));
    memcpy(STAGED_OUT(t), STAGED(t), total);
    ZPP_CHECK(stage_in(t, send, mine, total, stream, "allgatherv"));
    ZPP_CHECK(host_allgatherv(t, g, STAGED(t), STAGED_OUT(t), bytes, displs));
    return stage_out(t, recv, total, stream, "allgatherv");
  }
#else
  (void)sum_bytes;
  return no_device("allgatherv");
#endif
}

static zpp_status_t mpi_alltoallv(zpp_transport_t *t, zpp_group_t g,
                                  const void *send, const size_t *sbytes,
                                  const size_t *sdispls, void *recv,
                                  const size_t *rbytes, const size_t *rdispls,
                                  zpp_memory_t mem, void *stream) {
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_alltoallv(t, g, send, sbytes, sdispls, recv, rbytes, rdispls,
                          "alltoallv");
#if ZPP_HAVE_CUDA
  {
    int n = t->grp[g].size;
    size_t sin = sum_bytes(sbytes, sdispls, n);
    size_t rout = sum_bytes(rbytes, rdispls, n);
    ZPP_CHECK(stage_in(t, recv, rout, rout, stream, "alltoallv"));
    memcpy(STAGED_OUT(t), STAGED(t), rout);
    ZPP_CHECK(stage_in(t, send, sin, rout, stream, "alltoallv"));
    ZPP_CHECK(host_alltoallv(t, g, STAGED(t), sbytes, sdispls, STAGED_OUT(t),
                             rbytes, rdispls, "alltoallv"));
    return stage_out(t, recv, rout, stream, "alltoallv");
  }
#else
  return no_device("alltoallv");
#endif
}

static zpp_status_t mpi_reduce_scatter(zpp_transport_t *t, zpp_group_t g,
                                       const void *send, void *recv,
                                       size_t count, zpp_dtype_t dtype,
                                       zpp_reduce_op_t op, zpp_memory_t mem,
                                       void *stream) {
  (void)op;
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_reduce_scatter(t, g, send, recv, count, dtype);
#if ZPP_HAVE_CUDA
  {
    size_t es = zpp_dtype_size(dtype);
    size_t in = count * es * (size_t)t->grp[g].size;
    ZPP_CHECK(stage_in(t, send, in, count * es, stream, "reduce_scatter"));
    ZPP_CHECK(host_reduce_scatter(t, g, STAGED(t), STAGED_OUT(t), count, dtype));
    return stage_out(t, recv, count * es, stream, "reduce_scatter");
  }
#else
  return no_device("reduce_scatter");
#endif
}

static zpp_status_t mpi_allreduce(zpp_transport_t *t, zpp_group_t g,
                                  const void *send, void *recv, size_t count,
                                  zpp_dtype_t dtype, zpp_reduce_op_t op,
                                  zpp_memory_t mem, void *stream) {
  (void)op;
  (void)stream;
  if (mem == ZPP_MEMORY_HOST)
    return host_allreduce(t, g, send, recv, count, dtype);
#if ZPP_HAVE_CUDA
  {
    size_t bytes = count * zpp_dtype_size(dtype);
    ZPP_CHECK(stage_in(t, send, bytes, bytes, stream, "allreduce"));
    ZPP_CHECK(host_allreduce(t, g, STAGED(t), STAGED_OUT(t), count, dtype));
    return stage_out(t, recv, bytes, stream, "allreduce");
  }
#else
  return no_device("allreduce");
#endif
}

static zpp_status_t mpi_barrier(zpp_transport_t *t, zpp_group_t g) {
  mpi_impl_t *m = t->impl;
  MPI_Request r;
  int rc = MPI_Ibarrier(m->comm[g], &r);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, "barrier", "MPI_Ibarrier");
  return wait_all(t, &r, 1, 0, "barrier", g);
}

static void mpi_destroy(zpp_transport_t *t) {
  mpi_impl_t *m = t->impl;
  int fin = 0;
  if (m == NULL)
    return;
  MPI_Finalized(&fin);
  if (!fin) {
    if (m->comm[ZPP_GROUP_NODE] != MPI_COMM_NULL)
      MPI_Comm_free(&m->comm[ZPP_GROUP_NODE]);
    if (m->comm[ZPP_GROUP_CROSS] != MPI_COMM_NULL)
      MPI_Comm_free(&m->comm[ZPP_GROUP_CROSS]);
  }
#if ZPP_HAVE_CUDA
  if (m->stage_in)
    cudaFreeHost(m->stage_in);
  if (m->stage_out)
    cudaFreeHost(m->stage_out);
#endif
  free(m->req);
  free(m->idx);
  free(m->emu_hdr);
  free(m->emu_out);
  free(m->tmp);
  free(m);
  t->impl = NULL;
}

static const zpp_transport_ops_t mpi_ops = {
    "mpi",          mpi_allgather, mpi_allgatherv, mpi_alltoallv,
    mpi_reduce_scatter, mpi_allreduce, mpi_barrier, NULL, mpi_destroy, NULL};

zpp_status_t zpp_transport_mpi_create(zpp_transport_t *t, MPI_Comm world,
                                      int cuda_device) {
  mpi_impl_t *m = calloc(1, sizeof *m);
  const zpp_topo_t *topo = t->topo;
  int rc, g;
  if (m == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "MPI backend state");
  m->cuda_device = cuda_device;
  m->spin_ns = zpp_setting_long("ZPP_NET_SPIN_US", 1000) * 1000;
  if (m->spin_ns < 0)
    m->spin_ns = 0;
  m->rings = (int)zpp_setting_long("ZPP_NET_RINGS", 1);
  if (m->rings < 1 || m->rings > 64) {
    ZPP_WARN(ZPP_SUBSYS_NET, "ZPP_NET_RINGS=%d: must be in [1, 64]; using 1",
             m->rings);
    m->rings = 1;
  }
  m->comm[ZPP_GROUP_WORLD] = world;
  m->comm[ZPP_GROUP_NODE] = m->comm[ZPP_GROUP_CROSS] = MPI_COMM_NULL;
  t->impl = m;
  t->ops = &mpi_ops;
  t->backend = ZPP_BACKEND_MPI;
  /* NODE: colour = node, key = local rank; CROSS: colour = local rank,
   * key = node.  The member order then equals the topology's. */
  rc = MPI_Comm_split(world, topo->node_of[t->rank],
                      topo->local_rank_of[t->rank], &m->comm[ZPP_GROUP_NODE]);
  if (rc == MPI_SUCCESS)
    rc = MPI_Comm_split(world, topo->local_rank_of[t->rank],
                        topo->node_of[t->rank], &m->comm[ZPP_GROUP_CROSS]);
  if (rc != MPI_SUCCESS)
    return zpp_mpi_error(rc, __func__, "MPI_Comm_split");
  for (g = 0; g < ZPP_NGROUPS; g++) {
    int r = -1, n = -1;
    MPI_Comm_set_errhandler(m->comm[g], MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm[g], &r);
    MPI_Comm_size(m->comm[g], &n);
    if (r != t->grp[g].index || n != t->grp[g].size)
      return zpp_error(ZPP_ERR_INTERNAL, __func__,
                       "group %s: MPI gives rank %d of %d, topology %d of %d",
                       zpp_group_name((zpp_group_t)g), r, n, t->grp[g].index,
                       t->grp[g].size);
  }
  return ZPP_OK;
}

#endif /* ZPP_HAVE_MPI */
