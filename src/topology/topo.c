/*
 * The node map: parsing of emulated layouts, construction from host keys,
 * group membership and the printed report.  Pure C, no MPI (topo.h).
 */
#include "topology/topo.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* Largest world size a spec may describe: keeps every per-rank array and
 * the world x world link matrix allocatable. */
#define ZPP_TOPO_MAX_RANKS (1 << 16)

const char *zpp_link_name(zpp_link_t link) {
  switch (link) {
  case ZPP_LINK_SELF: return "self";
  case ZPP_LINK_SAME_DEVICE: return "same-device";
  case ZPP_LINK_NVLINK: return "nvlink";
  case ZPP_LINK_PCIE: return "pcie";
  case ZPP_LINK_HOST: return "host";
  case ZPP_LINK_NET: return "net";
  }
  return "unknown";
}

const char *zpp_group_name(zpp_group_t group) {
  switch (group) {
  case ZPP_GROUP_WORLD: return "world";
  case ZPP_GROUP_NODE: return "node";
  case ZPP_GROUP_CROSS: return "cross";
  }
  return "unknown";
}

/* ---- parsing ------------------------------------------------------------ */

static const char *skip_space(const char *p) {
  while (*p != '\0' && isspace((unsigned char)*p))
    p++;
  return p;
}

/* Reads a decimal integer in [0, ZPP_TOPO_MAX_RANKS]; NULL if none. */
static const char *read_count(const char *p, long *v) {
  char *end;
  p = skip_space(p);
  if (!isdigit((unsigned char)*p))
    return NULL;
  errno = 0;
  *v = strtol(p, &end, 10);
  if (errno != 0 || *v > ZPP_TOPO_MAX_RANKS)
    return NULL;
  return skip_space(end);
}

zpp_status_t zpp_topo_parse(const char *spec, int world_size, int **node_of,
                            int *n) {
  const char *p;
  int *map = NULL;
  long nodes, per, count = 0, cap = 0, maxlabel = -1, i;
  char *used = NULL;
  if (spec == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "spec is NULL");
  if (node_of == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "node_of is NULL");
  if (n == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "n is NULL");
  p = skip_space(spec);
  if (*p == '\0')
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "topology \"%s\": empty; expected NxM or a rank-to-node "
                     "list such as 0,0,1,1",
                     spec);
  if (strpbrk(spec, "xX") != NULL) {
    const char *q = read_count(p, &nodes);
    if (q == NULL || (*q != 'x' && *q != 'X') ||
        (q = read_count(q + 1, &per)) == NULL || *q != '\0')
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "topology \"%s\": expected NxM with N nodes of M ranks "
                       "(each at most %d)",
                       spec, ZPP_TOPO_MAX_RANKS);
    if (nodes < 1 || per < 1)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "topology \"%s\": nodes and ranks per node must be >= 1",
                       spec);
    if (nodes * per > ZPP_TOPO_MAX_RANKS)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "topology \"%s\": %ld ranks; at most %d supported", spec,
                       nodes * per, ZPP_TOPO_MAX_RANKS);
    count = nodes * per;
    if (world_size > 0 && count != world_size)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "topology \"%s\" describes %ld ranks but the "
                       "communicator has %d",
                       spec, count, world_size);
    map = malloc((size_t)count * sizeof *map);
    if (map == NULL)
      return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                       "%ld ranks of topology \"%s\"", count, spec);
    for (i = 0; i < count; i++)
      map[i] = (int)(i / per);
    *node_of = map;
    *n = (int)count;
    return ZPP_OK;
  }
  /* A rank-to-node list. */
  for (;;) {
    long label;
    const char *q = read_count(p, &label);
    if (q == NULL || (*q != ',' && *q != '\0')) {
      free(map);
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "topology \"%s\": item %ld is not a node index in "
                       "[0, %d] (expected NxM or a list such as 0,0,1,1)",
                       spec, count, ZPP_TOPO_MAX_RANKS);
    }
    if (count == cap) {
      int *grown;
      cap = cap ? 2 * cap : 16;
      if (cap > ZPP_TOPO_MAX_RANKS + 1)
        cap = ZPP_TOPO_MAX_RANKS + 1;
      if (count >= ZPP_TOPO_MAX_RANKS) {
        free(map);
        return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                         "topology \"%s\": more than %d ranks", spec,
                         ZPP_TOPO_MAX_RANKS);
      }
      grown = realloc(map, (size_t)cap * sizeof *map);
      if (grown == NULL) {
        free(map);
        return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__,
                         "topology \"%s\"", spec);
      }
      map = grown;
    }
    map[count++] = (int)label;
    if (label > maxlabel)
      maxlabel = label;
    if (*q == '\0')
      break;
    p = q + 1;
  }
  if (world_size > 0 && count != world_size) {
    free(map);
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "topology \"%s\" describes %ld ranks but the communicator "
                     "has %d",
                     spec, count, world_size);
  }
  used = calloc((size_t)maxlabel + 1, 1);
  if (used == NULL) {
    free(map);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "topology \"%s\"", spec);
  }
  for (i = 0; i < count; i++)
    used[map[i]] = 1;
  for (i = 0; i <= maxlabel; i++) {
    if (!used[i]) {
      free(used);
      free(map);
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "topology \"%s\": node %ld has no rank; node indices "
                       "must be 0..%ld without gaps",
                       spec, i, maxlabel);
    }
  }
  free(used);
  *node_of = map;
  *n = (int)count;
  return ZPP_OK;
}

/* ---- construction ------------------------------------------------------- */

void zpp_topo_free(zpp_topo_t *t) {
  if (t == NULL)
    return;
  free(t->nvlinks);
  free(t->link);
  free(t->gpu);
  free(t->host);
  free(t->node_ranks);
  free(t->node_off);
  free(t->local_rank_of);
  free(t->node_of);
  free(t);
}

zpp_status_t zpp_topo_from_nodes(int world_size, const int *node_of,
                                 const char *emulated_spec, const char *source,
                                 zpp_topo_t **out) {
  zpp_topo_t *t;
  int r, nn = 0, *fill = NULL;
  if (node_of == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "node_of is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (world_size < 1 || world_size > ZPP_TOPO_MAX_RANKS)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "world_size %d: must be in [1, %d]", world_size,
                     ZPP_TOPO_MAX_RANKS);
  for (r = 0; r < world_size; r++) {
    if (node_of[r] < 0 || node_of[r] >= world_size)
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "node_of[%d] = %d: must be in [0, %d)", r, node_of[r],
                       world_size);
    if (node_of[r] + 1 > nn)
      nn = node_of[r] + 1;
  }
  t = calloc(1, sizeof *t);
  if (t == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "topology map");
  t->world_size = world_size;
  t->nnodes = nn;
  t->node_of = malloc((size_t)world_size * sizeof(int));
  t->local_rank_of = malloc((size_t)world_size * sizeof(int));
  t->node_off = calloc((size_t)nn + 1, sizeof(int));
  t->node_ranks = malloc((size_t)world_size * sizeof(int));
  t->host = calloc((size_t)world_size, sizeof *t->host);
  fill = calloc((size_t)nn, sizeof(int));
  if (!t->node_of || !t->local_rank_of || !t->node_off || !t->node_ranks ||
      !t->host || !fill) {
    free(fill);
    zpp_topo_free(t);
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "topology of %d ranks",
                     world_size);
  }
  memcpy(t->node_of, node_of, (size_t)world_size * sizeof(int));
  for (r = 0; r < world_size; r++)
    t->node_off[node_of[r] + 1]++;
  for (r = 0; r < nn; r++) {
    if (t->node_off[r + 1] == 0) {
      free(fill);
      zpp_topo_free(t);
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "node %d has no rank; node indices must be dense", r);
    }
    t->node_off[r + 1] += t->node_off[r];
  }
  /* Ascending world rank within each node: local rank order. */
  for (r = 0; r < world_size; r++) {
    int nd = node_of[r];
    t->local_rank_of[r] = fill[nd];
    t->node_ranks[t->node_off[nd] + fill[nd]] = r;
    fill[nd]++;
  }
  free(fill);
  t->uniform = 1;
  for (r = 1; r < nn; r++)
    if (t->node_off[r + 1] - t->node_off[r] != t->node_off[1])
      t->uniform = 0;
  t->emulated = emulated_spec != NULL;
  snprintf(t->spec, sizeof t->spec, "%s", emulated_spec ? emulated_spec : "");
  snprintf(t->source, sizeof t->source, "%s",
           source ? source : (emulated_spec ? "ZPP_TOPO" : "given"));
  *out = t;
  return ZPP_OK;
}

zpp_status_t zpp_topo_from_keys(int world_size, const int64_t *key,
                                const char *source, zpp_topo_t **out) {
  int *node_of, r, q, nn = 0;
  zpp_status_t st;
  if (key == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "key is NULL");
  if (world_size < 1 || world_size > ZPP_TOPO_MAX_RANKS)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "world_size %d: must be in [1, %d]", world_size,
                     ZPP_TOPO_MAX_RANKS);
  node_of = malloc((size_t)world_size * sizeof *node_of);
  if (node_of == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "%d ranks", world_size);
  /* Quadratic, but only once per communicator and only over the keys. */
  for (r = 0; r < world_size; r++) {
    node_of[r] = -1;
    for (q = 0; q < r; q++) {
      if (key[q] == key[r]) {
        node_of[r] = node_of[q];
        break;
      }
    }
    if (node_of[r] < 0)
      node_of[r] = nn++;
  }
  st = zpp_topo_from_nodes(world_size, node_of, NULL,
                           source ? source : "host-keys", out);
  free(node_of);
  return st;
}

zpp_status_t zpp_topo_set_hosts(zpp_topo_t *t,
                                const char (*hosts)[ZPP_TOPO_HOST_LEN]) {
  int r;
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "t is NULL");
  if (hosts == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "hosts is NULL");
  for (r = 0; r < t->world_size; r++) {
    memcpy(t->host[r], hosts[r], ZPP_TOPO_HOST_LEN);
    t->host[r][ZPP_TOPO_HOST_LEN - 1] = '\0';
  }
  return ZPP_OK;
}

zpp_status_t zpp_topo_set_gpus(zpp_topo_t *t, const zpp_topo_gpu_t *gpu,
                               const uint8_t *link, const uint8_t *nvlinks) {
  size_t n, a, b;
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "t is NULL");
  if (gpu == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "gpu is NULL");
  if (link == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "link is NULL");
  n = (size_t)t->world_size;
  free(t->gpu);
  free(t->link);
  free(t->nvlinks);
  t->gpu = malloc(n * sizeof *t->gpu);
  t->link = malloc(n * n);
  t->nvlinks = calloc(n * n, 1);
  if (!t->gpu || !t->link || !t->nvlinks) {
    free(t->gpu);
    free(t->link);
    free(t->nvlinks);
    t->gpu = NULL;
    t->link = t->nvlinks = NULL;
    t->has_gpu = 0;
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, __func__, "GPU link matrix");
  }
  memcpy(t->gpu, gpu, n * sizeof *t->gpu);
  for (a = 0; a < n; a++) {
    for (b = 0; b < n; b++) {
      uint8_t l = link[a * n + b];
      if (a == b)
        l = ZPP_LINK_SELF;
      else if (t->node_of[a] != t->node_of[b])
        l = ZPP_LINK_NET;
      else if (l == ZPP_LINK_SELF || l == ZPP_LINK_NET || l > ZPP_LINK_NET)
        l = ZPP_LINK_HOST; /* same node: never self or network */
      t->link[a * n + b] = l;
      if (nvlinks != NULL && l == ZPP_LINK_NVLINK)
        t->nvlinks[a * n + b] = nvlinks[a * n + b];
    }
  }
  t->has_gpu = 1;
  return ZPP_OK;
}

zpp_link_t zpp_topo_link(const zpp_topo_t *t, int a, int b) {
  if (a == b)
    return ZPP_LINK_SELF;
  if (t->node_of[a] != t->node_of[b])
    return ZPP_LINK_NET;
  if (t->has_gpu)
    return (zpp_link_t)t->link[(size_t)a * (size_t)t->world_size + (size_t)b];
  return ZPP_LINK_HOST;
}

zpp_status_t zpp_topo_group(const zpp_topo_t *t, zpp_group_t group, int me,
                            int *members, int *size, int *my_index) {
  int n = 0, idx = -1, i;
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "t is NULL");
  if (me < 0 || me >= t->world_size)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "me %d: must be in [0, %d)", me, t->world_size);
  switch (group) {
  case ZPP_GROUP_WORLD:
    for (i = 0; i < t->world_size; i++) {
      if (members)
        members[n] = i;
      n++;
    }
    idx = me;
    break;
  case ZPP_GROUP_NODE: {
    int nd = t->node_of[me];
    for (i = t->node_off[nd]; i < t->node_off[nd + 1]; i++) {
      if (members)
        members[n] = t->node_ranks[i];
      n++;
    }
    idx = t->local_rank_of[me];
    break;
  }
  case ZPP_GROUP_CROSS: {
    int lr = t->local_rank_of[me];
    for (i = 0; i < t->nnodes; i++) {
      if (t->node_off[i + 1] - t->node_off[i] <= lr)
        continue;
      if (i == t->node_of[me])
        idx = n;
      if (members)
        members[n] = t->node_ranks[t->node_off[i] + lr];
      n++;
    }
    break;
  }
  default:
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "group %d: must be ZPP_GROUP_WORLD, _NODE or _CROSS",
                     (int)group);
  }
  if (size)
    *size = n;
  if (my_index)
    *my_index = idx;
  return ZPP_OK;
}

/* ---- reports ------------------------------------------------------------- */

static void json_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c < 0x20)
      fprintf(out, "\\u%04x", c);
    else
      fputc(c, out);
  }
  fputc('"', out);
}

/* nvidia-smi topo -m style cell of the GPU matrix. */
static void link_cell(const zpp_topo_t *t, int a, int b, char *buf,
                      size_t len) {
  size_t n = (size_t)t->world_size;
  zpp_link_t l = zpp_topo_link(t, a, b);
  switch (l) {
  case ZPP_LINK_SELF: snprintf(buf, len, "X"); break;
  case ZPP_LINK_SAME_DEVICE: snprintf(buf, len, "SAME"); break;
  case ZPP_LINK_NVLINK:
    if (t->nvlinks[(size_t)a * n + (size_t)b])
      snprintf(buf, len, "NV%d", t->nvlinks[(size_t)a * n + (size_t)b]);
    else
      snprintf(buf, len, "NV");
    break;
  case ZPP_LINK_PCIE: snprintf(buf, len, "PCI"); break;
  case ZPP_LINK_HOST: snprintf(buf, len, "HOST"); break;
  case ZPP_LINK_NET: snprintf(buf, len, "NET"); break;
  }
}

static const char *node_host(const zpp_topo_t *t, int node) {
  const char *h = t->host[t->node_ranks[t->node_off[node]]];
  return h[0] ? h : "?";
}

static void print_text(const zpp_topo_t *t, FILE *out, const char *extra) {
  int nd, i, j;
  fprintf(out, "# zpp topology: %d ranks on %d node%s, %s\n", t->world_size,
          t->nnodes, t->nnodes == 1 ? "" : "s",
          t->uniform ? "uniform" : "uneven (nodes differ in size)");
  if (t->emulated)
    fprintf(out, "# EMULATED topology: \"%s\" (ZPP_TOPO or config); real "
            "placement is not used for nodes\n", t->spec);
  else
    fprintf(out, "# discovered from: %s\n", t->source);
  for (nd = 0; nd < t->nnodes; nd++) {
    int sz = t->node_off[nd + 1] - t->node_off[nd];
    fprintf(out, "node %d: %d rank%s%s%s\n", nd, sz, sz == 1 ? "" : "s",
            t->emulated ? "" : ", host ", t->emulated ? "" : node_host(t, nd));
    fprintf(out, "  %-6s %-6s %-20s %s\n", "rank", "local", "host",
            t->has_gpu ? "gpu (bus id)" : "");
    for (i = t->node_off[nd]; i < t->node_off[nd + 1]; i++) {
      int r = t->node_ranks[i];
      fprintf(out, "  %-6d %-6d %-20s", r, t->local_rank_of[r],
              t->host[r][0] ? t->host[r] : "?");
      if (t->has_gpu && t->gpu[r].device >= 0)
        fprintf(out, " %d (%s)", t->gpu[r].device,
                t->gpu[r].bus_id[0] ? t->gpu[r].bus_id : "?");
      fputc('\n', out);
    }
    if (t->has_gpu) {
      fprintf(out, "  GPU links on node %d (rows and columns are ranks):\n",
              nd);
      fprintf(out, "  %-8s", "");
      for (j = t->node_off[nd]; j < t->node_off[nd + 1]; j++)
        fprintf(out, " r%-6d", t->node_ranks[j]);
      fputc('\n', out);
      for (i = t->node_off[nd]; i < t->node_off[nd + 1]; i++) {
        fprintf(out, "  r%-7d", t->node_ranks[i]);
        for (j = t->node_off[nd]; j < t->node_off[nd + 1]; j++) {
          char cell[16];
          link_cell(t, t->node_ranks[i], t->node_ranks[j], cell, sizeof cell);
          fprintf(out, " %-7s", cell);
        }
        fputc('\n', out);
      }
    }
  }
  if (t->has_gpu)
    fprintf(out, "Legend: X = self, SAME = same GPU, NV# = NVLink/NVSwitch "
            "(# links), PCI = peer access over PCIe, HOST = through host "
            "memory, ranks on other nodes: network\n");
  if (extra != NULL && extra[0] != '\0')
    fprintf(out, "%s", extra);
}

static void print_json(const zpp_topo_t *t, FILE *out, const char *extra) {
  int nd, i, j;
  fprintf(out, "{\"emulated\": %s, \"spec\": ", t->emulated ? "true" : "false");
  json_string(out, t->spec);
  fprintf(out, ", \"source\": ");
  json_string(out, t->source);
  fprintf(out, ", \"world_size\": %d, \"nnodes\": %d, \"uniform\": %s, "
          "\"nodes\": [",
          t->world_size, t->nnodes, t->uniform ? "true" : "false");
  for (nd = 0; nd < t->nnodes; nd++) {
    fprintf(out, "%s{\"node\": %d, \"host\": ", nd ? ", " : "", nd);
    json_string(out, t->emulated ? "" : node_host(t, nd));
    fprintf(out, ", \"ranks\": [");
    for (i = t->node_off[nd]; i < t->node_off[nd + 1]; i++)
      fprintf(out, "%s%d", i > t->node_off[nd] ? ", " : "", t->node_ranks[i]);
    fprintf(out, "]");
    if (t->has_gpu) {
      fprintf(out, ", \"gpu_links\": [");
      for (i = t->node_off[nd]; i < t->node_off[nd + 1]; i++) {
        fprintf(out, "%s[", i > t->node_off[nd] ? ", " : "");
        for (j = t->node_off[nd]; j < t->node_off[nd + 1]; j++)
          fprintf(out, "%s\"%s\"", j > t->node_off[nd] ? ", " : "",
                  zpp_link_name(zpp_topo_link(t, t->node_ranks[i],
                                              t->node_ranks[j])));
        fprintf(out, "]");
      }
      fprintf(out, "]");
    }
    fprintf(out, "}");
  }
  fprintf(out, "], \"ranks\": [");
  for (i = 0; i < t->world_size; i++) {
    fprintf(out, "%s{\"rank\": %d, \"node\": %d, \"local_rank\": %d, \"host\": ",
            i ? ", " : "", i, t->node_of[i], t->local_rank_of[i]);
    json_string(out, t->host[i]);
    if (t->has_gpu) {
      fprintf(out, ", \"gpu\": %d, \"bus_id\": ", t->gpu[i].device);
      json_string(out, t->gpu[i].bus_id);
    }
    fprintf(out, "}");
  }
  fprintf(out, "]");
  if (extra != NULL && extra[0] != '\0')
    fprintf(out, ", %s", extra);
  fprintf(out, "}\n");
}

zpp_status_t zpp_topo_print(const zpp_topo_t *t, FILE *out, int json,
                            const char *extra_text, const char *extra_json) {
  if (t == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "t is NULL");
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  if (json)
    print_json(t, out, extra_json);
  else
    print_text(t, out, extra_text);
  return ferror(out) ? zpp_error(ZPP_ERR_IO, __func__, "writing the map failed")
                     : ZPP_OK;
}
