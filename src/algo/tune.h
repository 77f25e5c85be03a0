/*
 * Choosing the algorithm (ZPP_ALGO=auto): a cost model of the ring,
 * pairwise and hierarchical families over alpha-beta links, its constants
 * (defaults, a tuner file, a probe at creation), and the per-call choice
 * (docs/design.md, "Choosing the algorithm").  The layer that builds
 * transports (src/comm) sets the constants; src/algo asks for choices.
 */
#ifndef ZPP_SRC_ALGO_TUNE_H
#define ZPP_SRC_ALGO_TUNE_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>

#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The collectives the model predicts (zpp_algo_coll_t's values). */
enum { ZPP_TUNE_AG = 0, ZPP_TUNE_RS = 1, ZPP_TUNE_AR = 2 };

/* What the model needs of a group: n members on `nodes` nodes, the
 * largest and smallest node; own_max: the most members one owner holds on
 * its node (hierarchical, the rule l mod size), own_x: the most of them
 * on other nodes (what it receives across). */
typedef struct {
  int n, nodes, smax, smin, own_max, own_x;
} zpp_tune_shape_t;

/* The model's prediction for one call, in microseconds. */
typedef struct {
  double flat_us, hier_us; /* hier_us < 0: the hierarchical family does not
                              apply (one node, or one member per node) */
  int hier;                /* the choice: 1 hierarchical */
  int chunks;    /* hierarchical chunks of the reduce-scatter (RS, AR) or
                    the all-gather (AG) */
  int chunks_ag; /* AR: the all-gather part's chunks */
} zpp_tune_pick_t;

/* Defaults: this machine's shared memory when shared_path (an emulated
 * topology), else a 10 Gbit/s network between nodes. */
void zpp_tune_defaults(zpp_link_model_t *m, int shared_path);

/* The constants a rank starts from before the tuner file or the probe:
 * the defaults (shared_path for an emulated topology without a slowed
 * link), the emulated link's rate and latency when emu_on (gbit <= 0:
 * not slowed), and cpu = host_ranks / cores (at least 1). */
void zpp_tune_start(zpp_link_model_t *m, int topo_emulated, int emu_on,
                    double emu_gbit, double emu_lat_us, int host_ranks,
                    int cores);

/* Parses a tuner file's text (docs/design.md gives the format) over *m;
 * errors (ZPP_ERR_IO) name `path`, the line and the key. */
zpp_status_t zpp_tune_parse(const char *path, const char *text,
                            zpp_link_model_t *m, const char *func);
/* Reads and parses the file; *hash: of its bytes (the same file on every
 * rank hashes alike). */
zpp_status_t zpp_tune_read_file(const char *path, zpp_link_model_t *m,
                                uint64_t *hash, const char *func);

/* The shape of a group whose nodes hold sizes[0..nodes) members. */
void zpp_tune_shape_of(const int *sizes, int nodes, zpp_tune_shape_t *s);

/* The prediction for collective `coll` (ZPP_TUNE_*): bytes = each block
 * (AG, the largest), each shard (RS) or the whole buffer (AR), of elements
 * of `esize` bytes whose hierarchical partial sums travel in `psize`-byte
 * elements; `rings`: the ring all-gather's rings. */
void zpp_tune_predict(const zpp_link_model_t *m, const zpp_tune_shape_t *s,
                      int coll, double bytes, int esize, int psize, int rings,
                      zpp_tune_pick_t *out);

/* The choice for a call on group g of transport t (HIER, FLAT or AUTO
 * resolved; t->lock held: the group's shape is cached): *hier, and the
 * hierarchical chunks (0: from ZPP_HIER_CHUNK) of its reduce-scatter part
 * (*c_rs) and all-gather part (*c_ag). */
void zpp_algo_choose(zpp_transport_t *t, zpp_group_t g, int coll, size_t bytes,
                     zpp_dtype_t dtype, int *hier, int *c_rs, int *c_ag);

/* The probe's block per member and how many all-gathers each timing
 * runs back to back (docs/design.md, the probe). */
enum { ZPP_TUNE_PROBE_BYTES = 131072, ZPP_TUNE_PROBE_RUNS = 4 };

/* Measures the links of t (a host backend): on the CROSS group, then the
 * NODE group, every rank's group at once after a barrier of the whole
 * communicator, runs of small and of ZPP_TUNE_PROBE_BYTES all-gathers;
 * writes what it measured into m (fields it could not measure: NaN) and
 * m->measured.  m->cpu, round_us and msg_us must be set.  Every rank of
 * the communicator calls it; able = 0 (the caller failed before): this
 * rank says so first and nobody times anything (every rank returns with
 * its rates NaN and this one with nothing measured).  Bounded by the
 * timeout; the counters (bytes, calls, emulated waits) are left as they
 * were. */
zpp_status_t zpp_tune_probe(zpp_transport_t *t, zpp_link_model_t *m, int able);

/* The probe's arithmetic: from the time of one all-gather of 8 bytes
 * (t_small) and of large_bytes (t_large) per member over a ring of n,
 * every rank at once, the per-round latency (less m's round and transfer
 * costs, times m->cpu) and the rate (where t_small >= t_large / 2, the
 * lower bound 2 large_bytes (n - 1) / t_large); NaN where not measurable
 * (n < 2, a time not positive and finite). */
void zpp_tune_probe_fit(const zpp_link_model_t *m, int n, double t_small,
                        double t_large, double large_bytes, double *lat,
                        double *bw);

/* The agreed model: the median over the n ranks' records of each measured
 * constant (NaN: not measured, skipped; none measured: def's, which must
 * be the same on every rank: rank 0's), the forced choices of rank 0's,
 * `measured` the union of every rank's.
 * scratch: n doubles, allocated by the caller before the exchange, so
 * that no rank-local failure can make one rank's model differ. */
void zpp_tune_agree(const zpp_link_model_t *all, int n,
                    const zpp_link_model_t *def, double *scratch,
                    zpp_link_model_t *out);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_ALGO_TUNE_H */
