/*
 * The node map of a communicator, in pure C: it knows nothing of MPI, NCCL
 * or quantization.  The transport bootstrap gathers one host key per rank
 * (ranks with equal keys share a node) and, for GPU communicators, one GPU
 * description per rank; this module turns them, or an emulated layout from
 * ZPP_TOPO, into the map.  Everything here is testable in one process.
 *
 * Invariants of a zpp_topo_t:
 *   - nodes are numbered 0..nnodes-1 (a parsed list keeps its labels, which
 *     must be dense; discovered nodes are numbered by their lowest rank);
 *   - the local rank of a rank is its position among its node's ranks in
 *     increasing world rank;
 *   - node_ranks[node_off[n] + l] is the world rank with local rank l on
 *     node n; node_off[nnodes] == world_size.
 */
#ifndef ZPP_TOPOLOGY_TOPO_H
#define ZPP_TOPOLOGY_TOPO_H

#include <stdint.h>
#include <stdio.h>
#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZPP_TOPO_HOST_LEN 64 /* bytes of a host name, NUL included */
#define ZPP_TOPO_BUSID_LEN 32 /* "00000000:07:00.0", NUL included */

/* What a rank knows of its GPU, exchanged at bootstrap. */
typedef struct {
  int device;                       /* CUDA device index; -1: no GPU */
  char bus_id[ZPP_TOPO_BUSID_LEN];  /* PCI bus id, "" if unknown */
} zpp_topo_gpu_t;

typedef struct zpp_topo {
  int world_size;
  int nnodes;
  int *node_of;       /* [world_size] */
  int *local_rank_of; /* [world_size] */
  int *node_off;      /* [nnodes + 1] prefix sums of node sizes */
  int *node_ranks;    /* [world_size] ranks of node n at node_off[n].. */
  int uniform;        /* every node has the same number of ranks */
  int emulated;       /* from a ZPP_TOPO-style spec, not the launcher */
  char spec[128];     /* the emulation spec ("" when discovered) */
  char source[64];    /* how the map was found, for reports */
  char (*host)[ZPP_TOPO_HOST_LEN]; /* [world_size] real host of each rank,
                                      "" if unknown */
  /* GPU part: present when has_gpu (a device-memory communicator). */
  int has_gpu;
  zpp_topo_gpu_t *gpu; /* [world_size] */
  uint8_t *link;       /* [world_size * world_size] zpp_link_t of (a, b) */
  uint8_t *nvlinks;    /* [world_size * world_size] NVLink count, 0 unknown */
} zpp_topo_t;

/* ---- parsing ------------------------------------------------------------
 * spec: "NxM" (N nodes of M consecutive ranks: rank r on node r / M), or a
 * rank-to-node list "0,0,0,1,1" (rank r on node list[r]; labels dense from
 * 0, any order, e.g. "0,1,0,1" places ranks round robin).  Spaces around
 * items are allowed.  world_size > 0: the spec must describe exactly that
 * many ranks; world_size <= 0: the spec decides.  On success *node_of is a
 * malloc'ed array of *n ranks (free it with free()). */
zpp_status_t zpp_topo_parse(const char *spec, int world_size, int **node_of,
                            int *n);

/* Builds a map from a node index per rank (dense labels 0..nnodes-1).
 * emulated_spec: the spec the labels came from, or NULL when they come from
 * the launcher (then `source` says how, e.g. "mpi-shared-memory"). */
zpp_status_t zpp_topo_from_nodes(int world_size, const int *node_of,
                                 const char *emulated_spec, const char *source,
                                 zpp_topo_t **out);

/* Builds a map from one host key per rank: equal keys, same node.  Nodes are
 * numbered by their lowest rank. */
zpp_status_t zpp_topo_from_keys(int world_size, const int64_t *key,
                                const char *source, zpp_topo_t **out);

/* Records each rank's real host name (for reports); hosts[r] is NUL
 * terminated within ZPP_TOPO_HOST_LEN bytes. */
zpp_status_t zpp_topo_set_hosts(zpp_topo_t *t,
                                const char (*hosts)[ZPP_TOPO_HOST_LEN]);

/* Attaches the GPU part: gpu[world_size] and the link classes, link[a * n +
 * b] for ranks a, b on the same node (other entries are overwritten with
 * ZPP_LINK_NET, the diagonal with ZPP_LINK_SELF).  nvlinks may be NULL. */
zpp_status_t zpp_topo_set_gpus(zpp_topo_t *t, const zpp_topo_gpu_t *gpu,
                               const uint8_t *link, const uint8_t *nvlinks);

void zpp_topo_free(zpp_topo_t *t);

/* Link class between world ranks a and b: SELF, NET across nodes, the GPU
 * class when a GPU part is attached, else HOST. */
zpp_link_t zpp_topo_link(const zpp_topo_t *t, int a, int b);

/* Ranks of `group` as seen from world rank `me`, in group order: WORLD by
 * world rank, NODE by local rank, CROSS by node.  members may be NULL to
 * query the size only; *my_index receives me's position (may be NULL). */
zpp_status_t zpp_topo_group(const zpp_topo_t *t, zpp_group_t group, int me,
                            int *members, int *size, int *my_index);

/* Text map (json == 0) or the JSON object described in <zpp/zpp_comm.h>.
 * `extra` is appended inside the JSON object / after the text (may be
 * NULL), so callers can add backend and link-emulation fields. */
zpp_status_t zpp_topo_print(const zpp_topo_t *t, FILE *out, int json,
                            const char *extra_text, const char *extra_json);

/* ---- GPU discovery (topology/topo_gpu.c) --------------------------------
 * NVML is loaded at run time with dlopen("libnvidia-ml.so.1"); CUDA peer
 * queries are the fallback.  Both are optional: without them every pair of
 * GPUs on a node is ZPP_LINK_HOST. */

/* Fills one rank's GPU description for CUDA device `device`. */
zpp_status_t zpp_topo_gpu_describe(int device, zpp_topo_gpu_t *out);

/* Link class and NVLink count from the GPU of `self` to the GPU of `peer`,
 * both on this machine. */
zpp_status_t zpp_topo_gpu_link(const zpp_topo_gpu_t *self,
                               const zpp_topo_gpu_t *peer, zpp_link_t *link,
                               int *nvlinks);

/* "nvml", "cuda-peer" or "none": what zpp_topo_gpu_link can use here. */
const char *zpp_topo_gpu_probe_source(void);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_TOPOLOGY_TOPO_H */
