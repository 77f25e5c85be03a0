/*
 * libFuzzer target: the topology-string parser (ZPP_TOPO, the `topology`
 * field of zpp_comm_config_t; src/topology/topo.c) and what is built from it:
 * the node map, the groups, the host names and GPU links exchanged at
 * creation, and the text and JSON reports.
 *
 * Input: byte 0 selects the world size the spec must match (0: the spec
 * decides; else byte 0 - 1, so 0 ranks too); then the spec up to the first
 * NUL byte (or the end); the bytes after that NUL are the host names (64
 * bytes each, as exchanged), GPU bus ids and link classes of the ranks.
 *
 * What must hold (otherwise abort()): a parse either fails with a message
 * or gives a map whose groups partition the ranks as docs/design.md says
 * (NODE and CROSS members are on my node / have my local rank, each rank
 * once); reports of any host names and links are written without error.
 */
#include "topology/topo.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Groups are checked from at most this many ranks, spread over the world
 * (first and last included), and from fewer on a large world: each check
 * costs O(ranks), and a 65536-rank spec ("65536x1") checked from 64 ranks
 * took 4 s of CPU per input under ASan, past libFuzzer's timeout on a
 * loaded machine. */
#define MAX_RANKS_CHECKED 64
#define MAX_CHECK_WORK (1 << 18) /* checked ranks x world size */
#define MAX_RANKS_PRINTED 256 /* the report is quadratic in the ranks */

static FILE *devnull;
/* Inputs run, and specs accepted (run.sh requires some among the
 * committed inputs: not a vacuous run). */
static unsigned long n_inputs, n_accepted;

static void summary(void) {
  fprintf(stderr, "fuzz_topo: %lu inputs, %lu accepted\n", n_inputs,
          n_accepted);
}

static void fail(const char *what, const char *spec) {
  fprintf(stderr, "fuzz_topo: spec \"%s\": %s (last error: %s)\n", spec, what,
          zpp_get_last_error());
  abort();
}

static void check_groups(const zpp_topo_t *t, const char *spec) {
  int n = t->world_size, me, g, k, nchecked,
      *members = malloc((size_t)n * sizeof(int));
  char *seen = malloc((size_t)n);
  if (members == NULL || seen == NULL) {
    free(members);
    free(seen);
    return;
  }
  nchecked = n < MAX_RANKS_CHECKED ? n : MAX_RANKS_CHECKED;
  if ((long)nchecked * n > MAX_CHECK_WORK)
    nchecked = MAX_CHECK_WORK / n > 2 ? MAX_CHECK_WORK / n : 2;
  if (nchecked > n)
    nchecked = n;
  for (k = 0; k < nchecked; k++) {
    /* evenly spread: 0, ..., n - 1 */
    me = nchecked > 1 ? (int)((long)k * (n - 1) / (nchecked - 1)) : 0;
    for (g = 0; g < 3; g++) {
      int size = -1, idx = -1, i;
      if (zpp_topo_group(t, (zpp_group_t)g, me, members, &size, &idx) !=
          ZPP_OK)
        fail("zpp_topo_group failed on a valid rank", spec);
      if (size < 1 || size > n || idx < 0 || idx >= size ||
          members[idx] != me)
        fail("a group does not hold its own rank at its index", spec);
      memset(seen, 0, (size_t)n);
      for (i = 0; i < size; i++) {
        int r = members[i];
        if (r < 0 || r >= n || seen[r])
          fail("a group member is out of range or repeated", spec);
        seen[r] = 1;
        if (g == ZPP_GROUP_NODE && t->node_of[r] != t->node_of[me])
          fail("a NODE member is on another node", spec);
        if (g == ZPP_GROUP_CROSS &&
            t->local_rank_of[r] != t->local_rank_of[me])
          fail("a CROSS member has another local rank", spec);
      }
      if (g == ZPP_GROUP_WORLD && size != n)
        fail("WORLD is not every rank", spec);
    }
  }
  if (zpp_topo_group(t, (zpp_group_t)3, 0, NULL, NULL, NULL) == ZPP_OK ||
      zpp_topo_group(t, ZPP_GROUP_WORLD, n, NULL, NULL, NULL) == ZPP_OK)
    fail("zpp_topo_group accepted a bad group or rank", spec);
  free(seen);
  free(members);
}

/* Host names, GPUs and links of the ranks from the bytes after the spec. */
static void attach(zpp_topo_t *t, const uint8_t *p, size_t len,
                   const char *spec) {
  size_t n = (size_t)t->world_size, r, need;
  char(*hosts)[ZPP_TOPO_HOST_LEN] = calloc(n, ZPP_TOPO_HOST_LEN);
  zpp_topo_gpu_t *gpu = calloc(n, sizeof *gpu);
  uint8_t *link = calloc(n * n, 1), *nv = calloc(n * n, 1);
  if (hosts == NULL || gpu == NULL || link == NULL || nv == NULL)
    goto out;
  need = n * ZPP_TOPO_HOST_LEN;
  memcpy(hosts, p, len < need ? len : need); /* unterminated names too */
  for (r = 0; r < n; r++) {
    gpu[r].device = (int)r;
    if (len > 0)
      memcpy(gpu[r].bus_id, p + (r * 7) % len,
             len - (r * 7) % len < ZPP_TOPO_BUSID_LEN - 1
                 ? len - (r * 7) % len
                 : ZPP_TOPO_BUSID_LEN - 1);
  }
  for (r = 0; r < n * n && len > 0; r++) {
    link[r] = p[r % len];
    nv[r] = p[(r * 3) % len];
  }
  if (zpp_topo_set_hosts(t, (const char(*)[ZPP_TOPO_HOST_LEN])hosts) !=
      ZPP_OK)
    fail("zpp_topo_set_hosts failed", spec);
  if (len > 0 && p[0] & 1 &&
      zpp_topo_set_gpus(t, gpu, link, p[0] & 2 ? nv : NULL) != ZPP_OK)
    fail("zpp_topo_set_gpus failed", spec);
out:
  free(nv);
  free(link);
  free(gpu);
  free(hosts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *spec;
  const uint8_t *nul;
  size_t slen;
  int world, *node_of = NULL, n = 0, r;
  zpp_topo_t *t = NULL;
  zpp_status_t st;

  if (size == 0)
    return 0;
  if (devnull == NULL) {
    devnull = fopen("/dev/null", "w");
    atexit(summary);
  }
  n_inputs++;
  world = data[0] == 0 ? 0 : data[0] - 1;
  nul = memchr(data + 1, 0, size - 1);
  slen = nul != NULL ? (size_t)(nul - data) - 1 : size - 1;
  spec = malloc(slen + 1);
  if (spec == NULL)
    return 0;
  memcpy(spec, data + 1, slen);
  spec[slen] = '\0';

  st = zpp_topo_parse(spec, world, &node_of, &n);
  if (st != ZPP_OK) {
    if (zpp_get_last_error()[0] == '\0')
      fail("rejected without a message", spec);
    free(spec);
    return 0;
  }
  if (n < 1 || (world > 0 && n != world))
    fail("accepted with a wrong rank count", spec);
  n_accepted++;
  if (zpp_topo_from_nodes(n, node_of, spec, NULL, &t) != ZPP_OK)
    fail("zpp_topo_from_nodes rejected what zpp_topo_parse accepted", spec);
  for (r = 0; r < n; r++)
    if (t->node_of[r] != node_of[r] || t->local_rank_of[r] < 0)
      fail("the map differs from the parsed list", spec);
  check_groups(t, spec);
  if (n <= MAX_RANKS_PRINTED) {
    size_t rest = nul != NULL ? size - (size_t)(nul - data) - 1 : 0;
    int64_t *key = malloc((size_t)n * sizeof *key);
    zpp_topo_t *k = NULL;
    attach(t, nul != NULL ? nul + 1 : data, rest, spec);
    if (devnull != NULL && (zpp_topo_print(t, devnull, 0, spec, NULL) !=
                                ZPP_OK ||
                            zpp_topo_print(t, devnull, 1, NULL, spec) !=
                                ZPP_OK))
      fail("zpp_topo_print failed", spec);
    /* the same layout as host keys: the same node sizes */
    if (key != NULL) {
      for (r = 0; r < n; r++)
        key[r] = (int64_t)node_of[r] * 977 - 5;
      if (zpp_topo_from_keys(n, key, NULL, &k) != ZPP_OK ||
          k->nnodes != t->nnodes)
        fail("zpp_topo_from_keys disagrees with the parsed list", spec);
      zpp_topo_free(k);
      free(key);
    }
  }
  zpp_topo_free(t);
  free(node_of);
  free(spec);
  return 0;
}
