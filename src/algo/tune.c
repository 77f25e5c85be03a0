/*
 * ZPP_ALGO=auto (tune.h): the cost model of the ring / pairwise /
 * hierarchical families, written once, its constants and the per-call
 * choice.  docs/design.md, "Choosing the algorithm", gives the formulas;
 * the code below follows them term by term.
 */
#include "algo/tune.h"

#include "algo/algo.h"
#include "algo/algo_impl.h"
#include "core/core.h"
#include "transport/transport_impl.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Gbit/s to bytes per microsecond. */
#define GBIT_TO_BPUS 125.0

void zpp_tune_defaults(zpp_link_model_t *m, int shared_path) {
  memset(m, 0, sizeof *m);
  /* Shared memory through the MPI or UCX transport on one machine. */
  m->intra_lat_us = 3.0;
  m->intra_bw = 4000.0; /* 32 Gbit/s */
  m->round_us = 15.0;
  m->msg_us = 1.5;
  m->reduce_bw = 3000.0;
  m->shared_path = shared_path;
  if (shared_path) {
    m->inter_lat_us = m->intra_lat_us;
    m->inter_bw = m->intra_bw;
  } else {
    m->inter_lat_us = 30.0;
    m->inter_bw = 10.0 * GBIT_TO_BPUS;
  }
}

void zpp_tune_start(zpp_link_model_t *m, int topo_emulated, int emu_on,
                    double emu_gbit, double emu_lat_us, int host_ranks,
                    int cores) {
  zpp_tune_defaults(m, topo_emulated && emu_gbit <= 0);
  if (emu_on) {
    m->inter_lat_us = m->intra_lat_us + emu_lat_us;
    if (emu_gbit > 0)
      m->inter_bw = emu_gbit * GBIT_TO_BPUS;
  }
  m->cpu = cores > 0 && host_ranks > cores ? (double)host_ranks / cores : 1.0;
}

/* ---- the tuner file --------------------------------------------------------
 */

static char *trim(char *s) {
  char *e;
  while (*s == ' ' || *s == '\t' || *s == '\r')
    s++;
  e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
    *--e = '\0';
  return s;
}

enum { K_NUM, K_BOOL, K_ALGO, K_CHUNKS, K_VERSION };

static const struct {
  const char *key;
  int kind;
  size_t off;   /* K_NUM: the double in the model */
  double scale; /* K_NUM: file unit to the model's */
  int positive; /* K_NUM: must be > 0 (else >= 0) */
} keys[] = {
    {"version", K_VERSION, 0, 0, 0},
    {"intra_lat_us", K_NUM, offsetof(zpp_link_model_t, intra_lat_us), 1, 0},
    {"intra_gbit", K_NUM, offsetof(zpp_link_model_t, intra_bw), GBIT_TO_BPUS,
     1},
    {"inter_lat_us", K_NUM, offsetof(zpp_link_model_t, inter_lat_us), 1, 0},
    {"inter_gbit", K_NUM, offsetof(zpp_link_model_t, inter_bw), GBIT_TO_BPUS,
     1},
    {"round_us", K_NUM, offsetof(zpp_link_model_t, round_us), 1, 0},
    {"msg_us", K_NUM, offsetof(zpp_link_model_t, msg_us), 1, 0},
    {"reduce_gbit", K_NUM, offsetof(zpp_link_model_t, reduce_bw), GBIT_TO_BPUS,
     1},
    {"ranks_per_core", K_NUM, offsetof(zpp_link_model_t, cpu), 1, 0},
    {"shared_path", K_BOOL, 0, 0, 0},
    {"allgather", K_ALGO, 0, 0, 0},
    {"reduce_scatter", K_ALGO, 1, 0, 0},
    {"allreduce", K_ALGO, 2, 0, 0},
    {"hier_chunks", K_CHUNKS, 0, 0, 0},
};
#define NKEYS (sizeof keys / sizeof keys[0])

static zpp_status_t parse_value(const char *path, int line, size_t k,
                                const char *v, zpp_link_model_t *m,
                                const char *func) {
  char *end;
  double d;
  switch (keys[k].kind) {
  case K_ALGO:
    if (strcmp(v, "auto") == 0)
      m->force[keys[k].off] = 0;
    else if (strcmp(v, "hier") == 0)
      m->force[keys[k].off] = ZPP_ALGORITHM_HIER;
    else if (strcmp(v, "flat") == 0)
      m->force[keys[k].off] = ZPP_ALGORITHM_FLAT;
    else
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key %s: \"%s\" must be "
                       "auto, hier or flat",
                       path, line, keys[k].key, v);
    return ZPP_OK;
  case K_BOOL:
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key %s: \"%s\" must be 0 "
                       "or 1",
                       path, line, keys[k].key, v);
    m->shared_path = v[0] == '1';
    return ZPP_OK;
  default:
    break;
  }
  errno = 0;
  d = strtod(v, &end);
  if (v[0] != '\0' && *end == '\0' && errno == ERANGE)
    return zpp_error(ZPP_ERR_IO, func,
                     "ZPP_TUNER_FILE %s line %d: key %s: \"%s\" is out of "
                     "range (%s)",
                     path, line, keys[k].key, v,
                     fabs(d) < 1 ? "underflows" : "overflows");
  if (v[0] == '\0' || *end != '\0' || errno != 0 || !isfinite(d))
    return zpp_error(ZPP_ERR_IO, func,
                     "ZPP_TUNER_FILE %s line %d: key %s: \"%s\" is not a "
                     "number",
                     path, line, keys[k].key, v);
  switch (keys[k].kind) {
  case K_VERSION:
    if (d != 1)
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key version: %s: this zpp "
                       "reads version 1",
                       path, line, v);
    return ZPP_OK;
  case K_CHUNKS:
    if (d != floor(d) || d < 0 || d > 8)
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key hier_chunks: %s must "
                       "be an integer in [0, 8] (0: the model's)",
                       path, line, v);
    m->chunks = (int)d;
    return ZPP_OK;
  default:
    if (keys[k].positive ? !(d > 0) : !(d >= 0))
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key %s: %s must be %s 0",
                       path, line, keys[k].key, v,
                       keys[k].positive ? ">" : ">=");
    /* rates in [1e-3, 1e6] Gbit/s, times (and ranks per core) at most 1e6:
     * every sum and product of the model stays finite */
    if (keys[k].positive ? !(d >= 1e-3 && d <= 1e6) : !(d <= 1e6))
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key %s: %s must be in %s",
                       path, line, keys[k].key, v,
                       keys[k].positive ? "[1e-3, 1e6]" : "[0, 1e6]");
    *(double *)((char *)m + keys[k].off) = d * keys[k].scale;
    return ZPP_OK;
  }
}

zpp_status_t zpp_tune_parse(const char *path, const char *text,
                            zpp_link_model_t *m, const char *func) {
  int seen[NKEYS] = {0}, line = 0;
  const char *p = text;
  while (*p != '\0') {
    char buf[512], *s, *eq, *hash, *key, *val;
    size_t len = strcspn(p, "\n"), k;
    line++;
    if (len >= sizeof buf)
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: longer than %zu characters",
                       path, line, sizeof buf - 1);
    memcpy(buf, p, len);
    buf[len] = '\0';
    p += len + (p[len] == '\n');
    if ((hash = strchr(buf, '#')) != NULL)
      *hash = '\0';
    s = trim(buf);
    if (*s == '\0')
      continue;
    if ((eq = strchr(s, '=')) == NULL)
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: \"%s\": must be key = value",
                       path, line, s);
    *eq = '\0';
    key = trim(s);
    val = trim(eq + 1);
    for (k = 0; k < NKEYS && strcmp(keys[k].key, key) != 0; k++) {
    }
    if (k == NKEYS)
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: unknown key \"%s\"", path,
                       line, key);
    if (seen[k])
      return zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s line %d: key %s: given twice (first "
                       "on line %d)",
                       path, line, key, seen[k]);
    seen[k] = line;
    ZPP_CHECK(parse_value(path, line, k, val, m, func));
  }
  return ZPP_OK;
}

zpp_status_t zpp_tune_read_file(const char *path, zpp_link_model_t *m,
                                uint64_t *hash, const char *func) {
  enum { MAXLEN = 65536 };
  FILE *f = fopen(path, "rb");
  char *text;
  size_t n;
  uint64_t h = 1469598103934665603ull;
  zpp_status_t st;
  if (f == NULL)
    return zpp_error(ZPP_ERR_IO, func, "ZPP_TUNER_FILE %s: %s", path,
                     strerror(errno));
  text = malloc(MAXLEN + 2);
  if (text == NULL) {
    fclose(f);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "ZPP_TUNER_FILE %s", path);
  }
  n = fread(text, 1, MAXLEN + 1, f);
  st = ferror(f) ? zpp_error(ZPP_ERR_IO, func,
                             "ZPP_TUNER_FILE %s: read "
                             "error",
                             path)
       : n > MAXLEN
           ? zpp_error(ZPP_ERR_IO, func,
                       "ZPP_TUNER_FILE %s: longer than %d bytes", path, MAXLEN)
       : memchr(text, '\0', n) != NULL
           ? zpp_error(ZPP_ERR_IO, func, "ZPP_TUNER_FILE %s: not a text file",
                       path)
           : ZPP_OK;
  fclose(f);
  if (st == ZPP_OK) {
    size_t i;
    text[n] = '\0';
    for (i = 0; i < n; i++)
      h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    st = zpp_tune_parse(path, text, m, func);
  }
  free(text);
  if (st == ZPP_OK)
    *hash = h;
  return st;
}

/* ---- the model
 * --------------------------------------------------------------- */

/* Node k's size: v[k], or with offs v[k + 1] - v[k] (a group's hoff). */
#define SIZE_OF(k) (offs ? v[(k) + 1] - v[k] : v[k])

static void shape_core(const int *v, int nodes, int offs, zpp_tune_shape_t *s) {
  int k, j;
  s->n = 0;
  s->nodes = nodes;
  s->smax = 0;
  s->smin = nodes > 0 ? SIZE_OF(0) : 0;
  for (k = 0; k < nodes; k++) {
    s->n += SIZE_OF(k);
    if (SIZE_OF(k) > s->smax)
      s->smax = SIZE_OF(k);
    if (SIZE_OF(k) < s->smin)
      s->smin = SIZE_OF(k);
  }
  /* The owner at position 0 of node k holds every member of local rank
   * l = 0, s_k, 2 s_k, ...: cnt(l) of them, the nodes with more than l
   * members; positions p > 0 hold no more. */
  s->own_max = 1;
  for (k = 0; k < nodes; k++) {
    int own = 0, l;
    if (SIZE_OF(k) < 1)
      continue;
    for (l = 0; l < s->smax; l += SIZE_OF(k))
      for (j = 0; j < nodes; j++)
        own += SIZE_OF(j) > l;
    if (own > s->own_max)
      s->own_max = own;
  }
  s->own_x = s->own_max - 1;
}

#undef SIZE_OF

void zpp_tune_shape_of(const int *sizes, int nodes, zpp_tune_shape_t *s) {
  shape_core(sizes, nodes, 0, s);
}

/* One transfer of `bytes` on a link: latency plus bytes over bandwidth. */
static double xfer_us(double lat, double bw, double bytes) {
  return bytes > 0 ? lat + bytes / bw : 0.0;
}

/* A rank sending `intra` bytes within its node and `inter` across at once:
 * over independent links the slower; over a shared path the sum. */
static double link_us(const zpp_link_model_t *m, double intra, double inter) {
  double a = xfer_us(m->intra_lat_us, m->intra_bw, intra);
  double b = xfer_us(m->inter_lat_us, m->inter_bw, inter);
  return m->shared_path ? a + b : (a > b ? a : b);
}

/* Two stages that overlap in one round. */
static double both_us(const zpp_link_model_t *m, double a, double b) {
  return m->shared_path ? a + b : (a > b ? a : b);
}

/* Ring all-gather of blocks of b bytes over n members, nc rings. */
static double ring_ag(const zpp_link_model_t *m, const zpp_tune_shape_t *s,
                      double b, int nc) {
  double round;
  if (s->n < 2)
    return 0.0;
  if (s->nodes > 1) {
    /* a boundary rank: b / nc across, the other rings' chunks within */
    double edge = link_us(m, b * (nc - 1) / nc, b / nc);
    double in = link_us(m, b, 0);
    round = edge > in ? edge : in;
  } else {
    round = link_us(m, b, 0);
  }
  return (s->n - 1) * (m->round_us + 2.0 * nc * m->msg_us + round);
}

/* Pairwise reduce-scatter of shards of sb bytes, then the sum of n. */
static double pair_rs(const zpp_link_model_t *m, const zpp_tune_shape_t *s,
                      double sb) {
  if (s->n < 2)
    return 0.0;
  return m->round_us + 2.0 * (s->n - 1) * m->msg_us +
         link_us(m, (s->smax - 1) * sb, (double)(s->n - s->smin) * sb) +
         s->n * sb / m->reduce_bw;
}

/* C + 1 rounds: stage 1 of chunk r with stage 2 of chunk r - 1. */
static double pipelined(const zpp_link_model_t *m, int c, double st1,
                        double st2, double msgs, double compute) {
  return (c + 1) * m->round_us + c * msgs * m->msg_us + st1 + st2 +
         (c - 1) * both_us(m, st1, st2) + c * compute;
}

/* Hierarchical all-gather of blocks of b bytes in c chunks. */
static double hier_ag(const zpp_link_model_t *m, const zpp_tune_shape_t *s,
                      double b, int c) {
  double cb = b / c, xn = s->nodes - 1 > s->own_x ? s->nodes - 1 : s->own_x;
  double x = link_us(m, 0, xn * cb);
  double nn = link_us(m, (s->smax - 1) * (double)s->own_max * cb, 0);
  double msgs = (s->nodes - 1) + s->own_x + 2.0 * (s->smax - 1) * s->own_max;
  return pipelined(m, c, x, nn, msgs, 0.0);
}

/* Hierarchical reduce-scatter of shards of sb bytes in c chunks; the
 * partial sums travel at pf times the bytes. */
static double hier_rs(const zpp_link_model_t *m, const zpp_tune_shape_t *s,
                      double sb, double pf, int c) {
  double cs = sb / c, cp = cs * pf;
  double xn = s->nodes - 1 > s->own_x ? s->nodes - 1 : s->own_x;
  double a = link_us(m, (s->smax - 1) * (double)s->own_max * cs, 0);
  double b = link_us(m, 0, xn * cp);
  double msgs = 2.0 * (s->smax - 1) * s->own_max + s->own_x + s->nodes - 1;
  double compute = ((double)s->smax * s->own_max * cs + (double)s->nodes * cp) /
                   m->reduce_bw;
  return pipelined(m, c, a, b, msgs, compute);
}

/* The best chunk count (the smallest of equal times) of one part. */
static double best_chunks(const zpp_link_model_t *m, const zpp_tune_shape_t *s,
                          int rs, double bytes, double pf, int *chunks) {
  double best = 0;
  int c;
  for (c = 1; c <= 8; c++) {
    double t;
    if (m->chunks > 0 && c != m->chunks)
      continue;
    t = rs ? hier_rs(m, s, bytes, pf, c) : hier_ag(m, s, bytes, c);
    if (*chunks == 0 || t < best) {
      best = t;
      *chunks = c;
    }
  }
  return best;
}

void zpp_tune_predict(const zpp_link_model_t *m0, const zpp_tune_shape_t *s,
                      int coll, double bytes, int esize, int psize, int rings,
                      zpp_tune_pick_t *out) {
  /* ranks sharing a core share its time and its memory bandwidth: the
   * costs the CPU pays grow by cpu, the memory paths' rates shrink by it
   * (an emulated link that is shared memory too) */
  zpp_link_model_t cm = *m0, *m = &cm;
  double cpu = m0->cpu > 1 ? m0->cpu : 1;
  cm.round_us *= cpu;
  cm.msg_us *= cpu;
  cm.reduce_bw /= cpu;
  if (!(cm.measured & ZPP_TUNE_MEASURED_INTRA))
    cm.intra_bw /= cpu;
  if (cm.shared_path && cm.inter_bw > cm.intra_bw)
    cm.inter_bw = cm.intra_bw;
  double pf = esize > 0 ? (double)psize / esize : 1.0;
  int applies = s->nodes > 1 && s->nodes < s->n;
  memset(out, 0, sizeof *out);
  if (rings < 1)
    rings = 1;
  if (coll == ZPP_TUNE_AG) {
    out->flat_us = ring_ag(m, s, bytes, rings);
    if (applies)
      out->hier_us = best_chunks(m, s, 0, bytes, pf, &out->chunks);
  } else if (coll == ZPP_TUNE_RS) {
    out->flat_us = pair_rs(m, s, bytes);
    if (applies)
      out->hier_us = best_chunks(m, s, 1, bytes, pf, &out->chunks);
  } else {
    double shard = s->n > 0 ? bytes / s->n : bytes;
    out->flat_us = pair_rs(m, s, shard) + ring_ag(m, s, shard, rings);
    if (applies)
      out->hier_us = best_chunks(m, s, 1, shard, pf, &out->chunks) +
                     best_chunks(m, s, 0, shard, 1.0, &out->chunks_ag);
  }
  if (!applies)
    out->hier_us = -1;
  out->hier = applies && out->hier_us < out->flat_us;
}

static const zpp_tune_shape_t *group_shape(zpp_tgroup_t *g) {
  if (!g->shape_ok) {
    zpp_tune_shape_t s;
    shape_core(g->hoff, g->nh, 1, &s);
    g->shape[0] = s.n;
    g->shape[1] = s.nodes;
    g->shape[2] = s.smax;
    g->shape[3] = s.smin;
    g->shape[4] = s.own_max;
    g->shape[5] = s.own_x;
    g->shape_ok = 1;
  }
  return (const zpp_tune_shape_t *)(const void *)g->shape;
}

void zpp_algo_choose(zpp_transport_t *t, zpp_group_t g, int coll, size_t bytes,
                     zpp_dtype_t dtype, int *hier, int *c_rs, int *c_ag) {
  const zpp_tgroup_t *gr = &t->grp[g];
  zpp_tune_pick_t p;
  int es, ps, f;
  *hier = 0;
  *c_rs = *c_ag = 0;
  if (!(gr->nh > 1 && gr->nh < gr->size) || t->algorithm == ZPP_ALGORITHM_FLAT)
    return;
  if (t->algorithm != ZPP_ALGORITHM_AUTO) {
    *hier = 1;
    return;
  }
  es = coll == ZPP_TUNE_AG ? 1 : (int)zpp_dtype_size(dtype);
  ps = dtype == ZPP_FLOAT16 && coll != ZPP_TUNE_AG ? 4 : es;
  /* the rings the ring all-gather really runs on this group */
  if (t->hier_chunk_set) {
    /* ZPP_HIER_CHUNK: price the chunks hier.c will run (per part: the
     * block, the shard, or the all-reduce's shard of the buffer) */
    zpp_link_model_t m = t->model;
    size_t part = coll == ZPP_TUNE_AR
                      ? (bytes / (size_t)es + (size_t)gr->size - 1) /
                            (size_t)gr->size * (size_t)es
                      : bytes;
    size_t k = t->hier_chunk == 0 || part <= t->hier_chunk
                   ? 1
                   : (part + t->hier_chunk - 1) / t->hier_chunk;
    m.chunks = k > 8 ? 8 : (int)k;
    zpp_tune_predict(&m, group_shape(&t->grp[g]), coll, (double)bytes, es, ps,
                     zpp_algo_ring_channels(t, gr), &p);
  } else {
    zpp_tune_predict(&t->model, group_shape(&t->grp[g]), coll, (double)bytes,
                     es, ps, zpp_algo_ring_channels(t, gr), &p);
  }
  f = t->model.force[coll];
  *hier = f != 0 ? f == ZPP_ALGORITHM_HIER : p.hier;
  if (*hier && !t->hier_chunk_set) {
    /* the model's chunks (a forced family: the best of that family) */
    *c_rs = coll == ZPP_TUNE_AG ? 0 : p.chunks;
    *c_ag = coll == ZPP_TUNE_AG ? p.chunks : p.chunks_ag;
  }
}

/* ---- the probe and the agreement
 * ---------------------------------------------- */

/* Transfer d started and waited for, yielding the core between tests. */
static zpp_status_t probe_wait(zpp_transport_t *t, const zpp_xfer_desc_t *d) {
  zpp_xop_t *op = NULL;
  int done = 0;
  zpp_status_t st = zpp_xfer_start(t, d, 0, &op);
  while (st == ZPP_OK && !done) {
    st = zpp_xop_test(op, &done);
    if (st == ZPP_OK && !done)
      sched_yield();
  }
  zpp_xop_free(op);
  return st;
}

/* One in-place all-gather of `bytes` per member on group g, waited for;
 * *us its time. */
static zpp_status_t probe_ag(zpp_transport_t *t, zpp_group_t g, char *buf,
                             size_t bytes, double *us) {
  zpp_xfer_desc_t d;
  zpp_status_t st;
  int64_t t0 = zpp_time_ns();
  memset(&d, 0, sizeof d);
  d.kind = ZPP_XFER_ALLGATHER;
  d.group = g;
  d.recv = buf;
  d.send = buf + (size_t)t->grp[g].index * bytes;
  d.bytes = bytes;
  d.mem = ZPP_MEMORY_HOST;
  st = probe_wait(t, &d);
  *us = (double)(zpp_time_ns() - t0) / 1e3;
  return st;
}

/* A barrier of the whole communicator: each timed probe then starts
 * with every other rank's, so that the ranks sharing a node link, a core
 * or a memory bus share them in the probe as they do in a collective. */
static zpp_status_t probe_sync(zpp_transport_t *t) {
  zpp_xfer_desc_t d;
  if (t->grp[ZPP_GROUP_WORLD].size < 2)
    return ZPP_OK;
  memset(&d, 0, sizeof d);
  d.kind = ZPP_XFER_BARRIER;
  d.group = ZPP_GROUP_WORLD;
  d.mem = ZPP_MEMORY_HOST;
  return probe_wait(t, &d);
}

/* `runs` all-gathers of `bytes` back to back; *us: the time of one.  A
 * peer that left the barrier earlier has sent its block before this rank
 * starts: one all-gather alone can look faster than its link, runs of
 * them are late by at most that lead. */
static zpp_status_t probe_runs(zpp_transport_t *t, zpp_group_t g, char *buf,
                               size_t bytes, int runs, double *us) {
  int64_t t0 = zpp_time_ns();
  zpp_status_t st = ZPP_OK;
  int i;
  for (i = 0; i < runs && st == ZPP_OK; i++)
    st = probe_ag(t, g, buf, bytes, us);
  *us = (double)(zpp_time_ns() - t0) / 1e3 / runs;
  return st;
}

void zpp_tune_probe_fit(const zpp_link_model_t *m, int n, double t_small,
                        double t_large, double large_bytes, double *lat,
                        double *bw) {
  double cpu = m->cpu > 1 ? m->cpu : 1;
  *lat = *bw = NAN;
  if (n < 2 || !(t_small > 0) || !(t_large > 0) || !isfinite(t_small) ||
      !isfinite(t_large))
    return;
  /* a ring of n members: n - 1 rounds of one block, each paying the
   * round's and its two transfers' costs, which ranks sharing a core pay
   * K times (the probe ran on every rank at once) */
  *lat = t_small / (n - 1) - cpu * (m->round_us + 2.0 * m->msg_us);
  if (*lat < 0.1)
    *lat = 0.1;
  /* the large all-gathers' time less their rounds' latency; where that
   * latency is half their time or more (a fast link, or a small run
   * slowed by a late peer) the block is too small to tell the rate, and
   * half their time gives a lower bound of it */
  *bw = large_bytes * (n - 1) /
        (t_small < t_large / 2 ? t_large - t_small : t_large / 2);
}

/* Per-round latency and bandwidth of a ring over group g, every rank's
 * group at once (NaN when this rank's group has one member or buf is
 * NULL: it still takes part in the barriers): the least of REPS runs of
 * ZPP_TUNE_PROBE_RUNS small and as many large all-gathers. */
static zpp_status_t probe_group(zpp_transport_t *t, zpp_group_t g, char *buf,
                                const zpp_link_model_t *m, double *lat,
                                double *bw) {
  enum { SMALL = 8, REPS = 2 };
  int n = t->grp[g].size, i, timed = n > 1 && buf != NULL;
  double small = INFINITY, large = INFINITY, us;
  zpp_status_t st = ZPP_OK;
  *lat = *bw = NAN;
  for (i = 0; i < REPS && st == ZPP_OK; i++) {
    st = probe_sync(t);
    if (st == ZPP_OK && timed) {
      st = probe_runs(t, g, buf, SMALL, ZPP_TUNE_PROBE_RUNS, &us);
      if (st == ZPP_OK && us < small)
        small = us;
    }
    if (st == ZPP_OK)
      st = probe_sync(t);
    if (st == ZPP_OK && timed) {
      st = probe_runs(t, g, buf, ZPP_TUNE_PROBE_BYTES, ZPP_TUNE_PROBE_RUNS,
                      &us);
      if (st == ZPP_OK && us < large)
        large = us;
    }
  }
  if (st == ZPP_OK && timed)
    zpp_tune_probe_fit(m, n, small, large, ZPP_TUNE_PROBE_BYTES, lat, bw);
  return st;
}

/* Every rank's `able` (1: it has the probe's buffer) over the
 * communicator: *all 1 when every rank has. */
static zpp_status_t probe_agree(zpp_transport_t *t, int able, int *all) {
  int n = t->grp[ZPP_GROUP_WORLD].size, i;
  char *f;
  double us;
  zpp_status_t st;
  *all = able;
  if (n < 2)
    return ZPP_OK;
  f = calloc((size_t)n, 1);
  if (f == NULL) /* cannot take part: the others time out (bounded) */
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, "zpp_tune_probe",
                     "probe flags of %d ranks", n);
  f[t->grp[ZPP_GROUP_WORLD].index] = (char)able;
  st = probe_ag(t, ZPP_GROUP_WORLD, f, 1, &us);
  for (i = 0; i < n && st == ZPP_OK; i++)
    *all &= f[i] != 0;
  free(f);
  return st;
}

zpp_status_t zpp_tune_probe(zpp_transport_t *t, zpp_link_model_t *m, int able) {
  uint_fast64_t sent[ZPP_NLINKCLASSES], recv[ZPP_NLINKCLASSES],
      calls[ZPP_NGROUPS], emu_wait = atomic_load(&t->emu_wait_ns);
  int i, all = 0,
         nmax = t->grp[ZPP_GROUP_CROSS].size > t->grp[ZPP_GROUP_NODE].size
                    ? t->grp[ZPP_GROUP_CROSS].size
                    : t->grp[ZPP_GROUP_NODE].size;
  size_t len = (size_t)(nmax > 1 ? nmax : 1) * ZPP_TUNE_PROBE_BYTES;
  char *buf = able ? calloc(len, 1) : NULL;
  zpp_status_t st, mem = ZPP_OK;
  if (able && buf == NULL)
    mem = zpp_error(ZPP_ERR_OUT_OF_MEMORY, "zpp_tune_probe",
                    "probe buffer of %zu bytes (%d members x %d)", len, nmax,
                    ZPP_TUNE_PROBE_BYTES);
  m->inter_lat_us = m->inter_bw = m->intra_lat_us = m->intra_bw = NAN;
  m->measured = 0;
  for (i = 0; i < ZPP_NLINKCLASSES; i++) {
    sent[i] = atomic_load(&t->sent[i]);
    recv[i] = atomic_load(&t->recv[i]);
  }
  for (i = 0; i < ZPP_NGROUPS; i++)
    calls[i] = atomic_load(&t->calls[i]);
  /* first every rank says whether it can probe: one that cannot (no
   * buffer, or a failure before) takes part in that exchange only, and
   * nobody times anything, so every rank reaches the agreement after it
   * and sees that rank's error there */
  st = probe_agree(t, buf != NULL, &all);
  /* every rank: CROSS first, then NODE (a rank alone in its group takes
   * part in the barriers only) */
  if (st == ZPP_OK && all)
    st =
        probe_group(t, ZPP_GROUP_CROSS, buf, m, &m->inter_lat_us, &m->inter_bw);
  if (st == ZPP_OK && all)
    st = probe_group(t, ZPP_GROUP_NODE, buf, m, &m->intra_lat_us,
                     &m->intra_bw);
  free(buf);
  m->measured = (isnan(m->intra_bw) ? 0 : ZPP_TUNE_MEASURED_INTRA) |
                (isnan(m->inter_bw) ? 0 : ZPP_TUNE_MEASURED_INTER);
  for (i = 0; i < ZPP_NLINKCLASSES; i++) {
    atomic_store(&t->sent[i], sent[i]);
    atomic_store(&t->recv[i], recv[i]);
  }
  for (i = 0; i < ZPP_NGROUPS; i++)
    atomic_store(&t->calls[i], calls[i]);
  atomic_store(&t->emu_wait_ns, emu_wait);
  return st != ZPP_OK ? st : mem;
}

static double median_of(const zpp_link_model_t *all, int n, size_t off,
                        double def, double *x) {
  int k = 0, i, j;
  for (i = 0; i < n; i++) {
    double d = *(const double *)((const char *)&all[i] + off);
    if (isnan(d))
      continue;
    for (j = k; j > 0 && x[j - 1] > d; j--)
      x[j] = x[j - 1];
    x[j] = d;
    k++;
  }
  return k > 0 ? x[(k - 1) / 2] : def;
}

void zpp_tune_agree(const zpp_link_model_t *all, int n,
                    const zpp_link_model_t *def, double *scratch,
                    zpp_link_model_t *out) {
  static const size_t offs[] = {offsetof(zpp_link_model_t, intra_lat_us),
                                offsetof(zpp_link_model_t, intra_bw),
                                offsetof(zpp_link_model_t, inter_lat_us),
                                offsetof(zpp_link_model_t, inter_bw),
                                offsetof(zpp_link_model_t, round_us),
                                offsetof(zpp_link_model_t, msg_us),
                                offsetof(zpp_link_model_t, reduce_bw),
                                offsetof(zpp_link_model_t, cpu)};
  size_t i;
  int k;
  *out = all[0];
  /* a rate measured anywhere is agreed from the measurements only */
  for (k = 1; k < n; k++)
    out->measured |= all[k].measured;
  for (i = 0; i < sizeof offs / sizeof offs[0]; i++)
    *(double *)((char *)out + offs[i]) =
        median_of(all, n, offs[i],
                  *(const double *)((const char *)def + offs[i]), scratch);
}
