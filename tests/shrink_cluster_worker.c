/* zpp_comm_shrink and zpp_pgroup_recover on the namespace cluster
 * (scripts/netns_cluster.sh; run by tests/cluster_tests.sh under
 * `mpirun --enable-recovery`): real nodes, TCP over veth links, the node
 * map discovered.  MPI only starts the ranks and hands out the unique id;
 * the communicator runs over zpp's TCP bootstrap and UCX, and after the
 * fault no MPI call is made (Open MPI's TCP transport aborts a process
 * whose peer died), so the survivors shrink over zpp's own sockets.
 *
 *   shrink_cluster_worker kill qwz|hpz|qgz   2 nodes x 4 ranks: rank 5 (node
 *       1) SIGKILLs itself in the middle of a qwZ all-gather, an hpZ
 *       forward gather or a qgZ reduce-scatter; the 7 survivors shrink and
 *       check the new communicator: the map (rank 5 out), the rediscovered
 *       nodes (4 and 3 ranks, not uniform), an all-gather and a
 *       reduce-scatter bitwise and a qwZ all-gather within its bound
 *       against every rank's data regenerated from the seed.  Each prints
 *       the time from the kill (the killer's timestamp) to its first exact
 *       collective, new rank 0 the slowest survivor's.
 *   shrink_cluster_worker node   rank 4 SIGKILLs every rank of node 1 (4-7)
 *       during a forward fetch of group A (hpZ, current copies); group B
 *       (hpZ, the parameters changed after its last forward gather) is
 *       stale.  The survivors shrink to one node; A recovers bitwise from
 *       node 0's hpZ copies; B fails with ZPP_ERR_DATA_LOST naming old
 *       rank 4 and its stale copy; then an exact round.
 *   shrink_cluster_worker cut   rank 0 cuts node 1's link
 *       (ZPP_TEST_LINK_CUT) while collectives run and restores it
 *       (ZPP_TEST_LINK_RESTORE) only after every rank's bound: every call
 *       times out (or sees a reset once a peer on its node timed out and
 *       left), node 0 shrinks to its 4 ranks (exact round), each rank of
 *       node 1 ends in ZPP_ERR_TIMEOUT or _SYSTEM naming rank 0, the
 *       coordinator it cannot reach (no refusal proves it dead).  Bound
 *       per rank: T (the collective) + 3 T (the shrink) + 2 s.
 *   shrink_cluster_worker second   as kill qwz, and rank 6 SIGKILLs
 *       itself once the decision reached it: every other survivor's shrink
 *       fails with ZPP_ERR_PEER_FAILED naming exactly old rank 6 as no
 *       longer listening and no rank by its new number; each keeps its
 *       communicator until T + 3 T + 1 s after the kill, then reports.
 *
 * On one host, ZPP_TOPO=2x4 emulates the two nodes (the node map is then
 * checked as emulated).
 * Environment: ZPP_TIMEOUT_S (T, default 3), ZPP_TEST_SEED (default
 * 20261211, printed), ZPP_TEST_KILL_STAMP (the file the killer writes its
 * CLOCK_MONOTONIC time into; the namespaces share one clock and /tmp).
 * Each survivor prints one line "PASS rank R: ..." or "FAIL rank R: ...";
 * the driver counts them (a rank that hangs prints nothing). */
#include <ctype.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_runtime.h>

#include "comm/comm_impl.h"

#define N_WORLD 8
#define VICTIM 5
#define SECOND 6
#define COUNT (1u << 18) /* elements per rank of the collectives killed */
#define CHECK_N 4099     /* elements per rank of the checks after */
#define GROUP_NUMEL 12289

static int g_rank = -1;
static double g_t; /* ZPP_TIMEOUT_S */
static uint64_t g_seed;
static const char *g_stamp;
static atomic_int g_in_call; /* the collective thread sets, the killer reads */
static char g_why[1024]; /* the first failed check */

static double mono(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fail(const char *fmt, ...) {
  va_list ap;
  if (g_why[0] != '\0')
    return;
  va_start(ap, fmt);
  vsnprintf(g_why, sizeof g_why, fmt, ap);
  va_end(ap);
}

/* splitmix64: the data of (old rank, round, index), independent of zpp */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static uint64_t key(int r, int round, size_t i) {
  return mix(g_seed ^ mix(((uint64_t)r << 48) ^ ((uint64_t)round << 32) ^ i));
}
/* roughly normal: the sum of 4 uniforms in [-1, 1), scaled */
static float normal(int r, int round, size_t i) {
  uint64_t k = key(r, round, i);
  double s = 0;
  for (int j = 0; j < 4; j++)
    s += (double)((k >> (16 * j)) & 0xffff) / 32768.0 - 1.0;
  return (float)(s * 1.7);
}
/* an integer in [-1000, 1000]: sums exact in fp32 in any order */
static float integer(int r, int round, size_t i) {
  return (float)((int)(key(r, round, i) % 2001) - 1000);
}
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static uint16_t weight(int group, size_t g) {
  return f2bf(normal(1000 + group, 0, g));
}

/* ---- the killer -------------------------------------------------------- */

static int g_npids;
static pid_t g_pids[N_WORLD]; /* whom the killer kills, itself last */

static void stamp(void) {
  FILE *f = fopen(g_stamp, "w");
  if (f != NULL) {
    fprintf(f, "%.9f\n", mono());
    fclose(f);
  }
}

static void *killer(void *arg) {
  (void)arg;
  usleep(300000 + (useconds_t)(g_seed % 200000));
  while (!g_in_call) /* in the middle of a call */
    usleep(200);
  stamp();
  for (int i = 0; i < g_npids; i++)
    if (g_pids[i] != getpid())
      kill(g_pids[i], SIGKILL);
  raise(SIGKILL);
  return NULL;
}

static double kill_time(void) {
  double t = 0;
  FILE *f = fopen(g_stamp, "r");
  if (f == NULL || fscanf(f, "%lf", &t) != 1)
    t = 0;
  if (f != NULL)
    fclose(f);
  return t;
}

/* the second victim dies once the decision reached it */
static void die_when_decided(int rank, const char *point) {
  (void)rank;
  if (strcmp(point, "decided") == 0)
    raise(SIGKILL);
}

/* ---- checks on the new communicator ------------------------------------ */

/* qwZ INT8 symmetric, fp32 output (docs/format.md, "Error bound") */
static double qwz_bound(double x, double amax) {
  return amax / 127.0 * (0.5 + ldexp(1, -12)) +
         ldexp(1, -22) * (fabs(x) + amax) + ldexp(1, -149);
}

/* An all-gather (bitwise), then a reduce-scatter SUM of integers
 * (bitwise) and a qwZ all-gather (within its bound); *t_exact: when the
 * all-gather was found exact.  old_of[new rank] = old rank.  0: all
 * good. */
static int exact_round(zpp_comm_t c, const int *old_of, int round,
                       double *t_exact) {
  int me = 0, n = 0, bad = 0;
  zpp_comm_rank(c, &me);
  zpp_comm_size(c, &n);
  size_t m = CHECK_N, tot = (size_t)n * m;
  float *x = malloc(tot * sizeof *x), *y = malloc(tot * sizeof *y);
  if (x == NULL || y == NULL) {
    fail("no memory");
    return -1;
  }
  for (size_t i = 0; i < m; i++)
    x[i] = normal(old_of[me], round, i);
  int st = zpp_allgather(c, x, y, m, ZPP_FLOAT32, NULL, NULL);
  if (st != ZPP_OK) {
    fail("all-gather on the new communicator: %s", zpp_comm_get_last_error(c));
    return st; /* the buffers may still be written: kept */
  }
  for (int r = 0; r < n && !bad; r++)
    for (size_t i = 0; i < m; i++)
      if (y[r * m + i] != normal(old_of[r], round, i)) {
        fail("all-gather: element %zu of new rank %d is %g, want %g", i, r,
             y[r * m + i], normal(old_of[r], round, i));
        bad = 1;
        break;
      }
  *t_exact = mono();
  /* reduce-scatter: rank q's input is integer(old_of[q], round + 1, .) */
  for (size_t i = 0; i < tot; i++)
    x[i] = integer(old_of[me], round + 1, i);
  st = zpp_reduce_scatter(c, x, y, m, ZPP_FLOAT32, ZPP_OP_SUM, NULL, NULL);
  if (st != ZPP_OK) {
    fail("reduce-scatter on the new communicator: %s",
         zpp_comm_get_last_error(c));
    return st;
  }
  for (size_t i = 0; i < m && !bad; i++) {
    double want = 0;
    for (int q = 0; q < n; q++)
      want += integer(old_of[q], round + 1, (size_t)me * m + i);
    if ((double)y[i] != want) {
      fail("reduce-scatter: element %zu is %g, want %g", i, y[i], want);
      bad = 1;
    }
  }
  /* qwZ: each rank encodes its own shard in blocks of 256 */
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  for (size_t i = 0; i < m; i++)
    x[i] = normal(old_of[me], round + 2, i);
  st = zpp_qwz_allgather(c, &q, x, y, m, ZPP_FLOAT32, NULL, NULL);
  if (st != ZPP_OK) {
    fail("qwZ all-gather on the new communicator: %s",
         zpp_comm_get_last_error(c));
    return st;
  }
  for (int r = 0; r < n && !bad; r++)
    for (size_t b = 0; b < m && !bad; b += 256) {
      size_t e = b + 256 < m ? b + 256 : m;
      double amax = 0;
      for (size_t i = b; i < e; i++)
        amax = fmax(amax, fabs(normal(old_of[r], round + 2, i)));
      for (size_t i = b; i < e; i++) {
        double w = normal(old_of[r], round + 2, i), got = y[r * m + i];
        if (!(fabs(got - w) <= qwz_bound(w, amax))) {
          fail("qwZ: element %zu of new rank %d is %.9g, want %.9g within "
               "%.3g",
               i, r, got, w, qwz_bound(w, amax));
          bad = 1;
          break;
        }
      }
    }
  free(x);
  free(y);
  return bad ? -100 : 0;
}

/* The node sizes of c, "4,3" */
static void node_sizes(zpp_comm_t c, char *out, size_t len) {
  int nn = 0, k;
  size_t at = 0;
  out[0] = '\0';
  zpp_comm_nnodes(c, &nn);
  for (k = 0; k < nn && at < len; k++) {
    int s = 0;
    zpp_comm_node_size(c, k, &s);
    at += (size_t)snprintf(out + at, len - at, "%s%d", k ? "," : "", s);
  }
}

/* ---- the collective the victim dies in ---------------------------------- */

typedef struct {
  const char *what;
  zpp_comm_t c;
  zpp_hpz_t hpz;
  float *x, *y;
} loop_t;

/* One call of the collective under test. */
static int one_call(loop_t *l) {
  int st;
  g_in_call = 1;
  if (strcmp(l->what, "qwz") == 0) {
    zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
    st =
        zpp_qwz_allgather(l->c, &q, l->x, l->y, COUNT, ZPP_FLOAT32, NULL, NULL);
  } else if (strcmp(l->what, "hpz") == 0) {
    st = zpp_hpz_forward_gather(l->hpz, l->x, l->y, NULL, NULL);
    if (st == ZPP_OK)
      st = zpp_hpz_backward_gather(l->hpz, NULL, l->y, NULL, NULL);
  } else if (strcmp(l->what, "qgz") == 0) {
    zpp_qgz_config_t q = ZPP_QGZ_CONFIG_INIT;
    st = zpp_qgz_reduce_scatter(l->c, &q, l->x, l->y, COUNT, ZPP_FLOAT32,
                                ZPP_OP_SUM, NULL, NULL, NULL);
  } else {
    st = zpp_allgather(l->c, l->x, l->y, COUNT, ZPP_FLOAT32, NULL, NULL);
  }
  g_in_call = 0;
  return st;
}

/* Calls until one fails (at most 30 s); its status. */
static int until_failure(loop_t *l) {
  double t0 = mono();
  for (;;) {
    int st = one_call(l);
    if (st != ZPP_OK)
      return st;
    if (mono() - t0 > 30) {
      fail("no %s call failed within 30 s", l->what);
      return ZPP_OK;
    }
  }
}

static zpp_comm_t create(const zpp_unique_id_t *id, int n) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  zpp_comm_t c = NULL;
  cfg.timeout_s = g_t;
  cfg.backend = ZPP_BACKEND_UCX;
  if (zpp_comm_create_from_id(id, n, g_rank, &cfg, &c) != ZPP_OK) {
    printf("FAIL rank %d: create: %s\n", g_rank, zpp_get_last_error());
    fflush(stdout);
    _exit(1);
  }
  return c;
}

static void report(const char *fmt, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  if (g_why[0] != '\0')
    printf("FAIL rank %d: %s (%s)\n", g_rank, g_why, b);
  else
    printf("PASS rank %d: %s\n", g_rank, b);
  fflush(stdout);
}

/* The checks of a shrink that must succeed: map, node sizes, a round;
 * returns the first exact collective's time (0: none). */
static double check_new(zpp_comm_t nc, const int *map, int n,
                        const char *want_map, const char *want_nodes,
                        int want_uniform) {
  char got[64] = "", nodes[64];
  int old_of[N_WORLD], k = 0, size = 0, uniform = -1, emulated = -1;
  size_t at = 0;
  double t_exact = 0;
  for (int r = 0; r < n; r++) {
    at += (size_t)snprintf(got + at, sizeof got - at, "%s%d", r ? "," : "",
                           map[r]);
    if (map[r] >= 0)
      old_of[k++] = r;
  }
  zpp_comm_size(nc, &size);
  zpp_comm_topo_uniform(nc, &uniform);
  zpp_comm_topo_emulated(nc, &emulated);
  node_sizes(nc, nodes, sizeof nodes);
  if (strcmp(got, want_map) != 0)
    fail("new_rank_of %s, want %s", got, want_map);
  if (size != k)
    fail("the new communicator has %d ranks, new_rank_of names %d", size, k);
  /* discovered on the cluster; ZPP_TOPO (one host) emulates the nodes */
  int want_emulated = getenv("ZPP_TOPO") != NULL;
  if (strcmp(nodes, want_nodes) != 0 || uniform != want_uniform ||
      emulated != want_emulated)
    fail("the new node map: sizes %s uniform %d emulated %d, want %s uniform "
         "%d, %s",
         nodes, uniform, emulated, want_nodes, want_uniform,
         want_emulated ? "emulated (ZPP_TOPO)" : "discovered");
  if (g_why[0] == '\0' && exact_round(nc, old_of, 100, &t_exact) != 0)
    t_exact = 0;
  return t_exact;
}

/* The slowest survivor's `v`, over the new communicator (after the
 * checks: its own all-gather). */
static double slowest(zpp_comm_t nc, double v) {
  int n = 0;
  double all[N_WORLD], worst = v;
  zpp_comm_size(nc, &n);
  if (zpp_allgather(nc, &v, all, sizeof v, ZPP_UINT8, NULL, NULL) != ZPP_OK) {
    fail("the all-gather of the times: %s", zpp_comm_get_last_error(nc));
    return -1;
  }
  for (int i = 0; i < n; i++)
    worst = all[i] > worst ? all[i] : worst;
  return worst;
}

/* ---- the modes ------------------------------------------------------------
 */

/* The members a failed shrink names no longer listening: the text after
 * "dead or done with comm: " up to ';'.  0: found. */
static int gone_list(const char *msg, char *out, size_t len) {
  const char *k = "dead or done with comm: ", *p = strstr(msg, k), *e;
  out[0] = '\0';
  if (p == NULL)
    return -1;
  p += strlen(k);
  e = strchr(p, ';');
  if (e == NULL)
    return -1;
  snprintf(out, len, "%.*s", (int)(e - p), p);
  return 0;
}

/* The first "rank N" or "ranks N" of msg not labelled "old " (a number
 * in the new communicator's numbering, which the caller does not know);
 * NULL: none. */
static const char *bare_rank(const char *msg) {
  const char *p = msg;
  while ((p = strstr(p, "rank")) != NULL) {
    const char *q = p + 4 + (p[4] == 's');
    int word = p == msg || !(isalnum((unsigned char)p[-1]));
    if (word && q[0] == ' ' && isdigit((unsigned char)q[1]) &&
        !(p - msg >= 4 && strncmp(p - 4, "old ", 4) == 0))
      return p;
    p += 4;
  }
  return NULL;
}

static int run_kill(const char *what, const zpp_unique_id_t *id, int second) {
  loop_t l = {what, create(id, N_WORLD), NULL, NULL, NULL};
  char gone[256] = "";
  size_t len = strcmp(what, "qgz") == 0 ? (size_t)N_WORLD * COUNT : COUNT;
  int map[N_WORLD], st, coll;
  zpp_comm_t nc = NULL;
  pthread_t th;
  l.x = calloc(len, sizeof *l.x);
  l.y = calloc((size_t)N_WORLD * COUNT, sizeof *l.y);
  for (size_t i = 0; i < len; i++)
    l.x[i] = normal(g_rank, 0, i);
  if (strcmp(what, "hpz") == 0) {
    zpp_hpz_config_t hc = ZPP_HPZ_CONFIG_INIT;
    if (zpp_hpz_create(l.c, &hc, COUNT, ZPP_FLOAT32, &l.hpz) != ZPP_OK)
      fail("hpz_create: %s", zpp_get_last_error());
  }
  if (one_call(&l) != ZPP_OK) /* connects every pair before the kill */
    fail("the first %s call: %s", what, zpp_comm_get_last_error(l.c));
  MPI_Barrier(MPI_COMM_WORLD); /* the last MPI call before the fault */
  if (g_rank == VICTIM) {
    g_pids[g_npids++] = getpid();
    pthread_create(&th, NULL, killer, NULL);
  }
  coll = until_failure(&l);
  double t_fail = mono();
  if (second && g_rank == SECOND)
    zpp_shrink_test_hook = die_when_decided;
  st = zpp_comm_shrink(l.c, NULL, map, &nc);
  double t_shrunk = mono(), t_kill = kill_time();
  if (t_kill == 0)
    fail("no kill time in %s", g_stamp);
  if (second) {
    if (st != ZPP_ERR_PEER_FAILED)
      fail("shrink returned %s, want ZPP_ERR_PEER_FAILED: %s",
           zpp_status_string(st), st ? zpp_get_last_error() : "");
    else if (gone_list(zpp_get_last_error(), gone, sizeof gone) != 0 ||
             strcmp(gone, "old rank 6") != 0)
      fail("the members named no longer listening are \"%s\", want exactly "
           "\"old rank 6\": %s",
           gone, zpp_get_last_error());
    else if (bare_rank(zpp_get_last_error()) != NULL)
      fail("the error names a rank that is not an old rank (\"%.12s\"): %s",
           bare_rank(zpp_get_last_error()), zpp_get_last_error());
    if (t_shrunk - t_fail > 3 * g_t + 1)
      fail("the shrink took %.2f s, bound %.2f s", t_shrunk - t_fail,
           3 * g_t + 1);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st ? zpp_get_last_error() : "");
    /* comm stays (its listener accepting) until every survivor's shrink
     * returned: each fails by its own call's bound, at most T + 3 T after
     * the kill; a destroyed one would refuse the others' probes and be
     * named with the dead.  The report comes after: the driver stops the
     * run soon after the last one. */
    if (t_kill > 0) {
      double wait = t_kill + 4 * g_t + 1 - mono();
      if (wait > 0)
        usleep((useconds_t)(wait * 1e6));
    }
    report("%s died mid-call, rank 6 after the decision: shrink %s after "
           "%.3f s: %s",
           what, zpp_status_string(st), t_shrunk - t_fail, msg);
  } else if (st != ZPP_OK) {
    fail("shrink: %s", zpp_get_last_error());
    report("%s", what);
  } else {
    double t_exact = check_new(nc, map, N_WORLD, "0,1,2,3,4,-1,5,6", "4,3", 0);
    int nr = -1;
    zpp_comm_rank(nc, &nr);
    double mine = t_exact > 0 ? t_exact - t_kill : 1e9;
    double worst = slowest(nc, mine);
    if (t_exact > 0 && mine > 4 * g_t + 2)
      fail("kill to the first exact collective %.3f s: more than T + the "
           "shrink's bound 3 T + 2 s",
           mine);
    report("rank 5 killed in the middle of a %s call; this rank's call failed "
           "%.3f s after the kill (%s), shrink %.3f s, first exact "
           "collective %.3f s after the kill; new rank %d of 7 on nodes 4,3",
           what, t_fail - t_kill, zpp_status_string(coll), t_shrunk - t_fail,
           mine, nr);
    if (nr == 0)
      printf("kill to the first exact collective on every survivor (%s, "
             "ZPP_TIMEOUT_S %g): %.3f s\n",
             what, g_t, worst);
    zpp_comm_destroy(nc);
  }
  fflush(stdout);
  if (l.hpz != NULL)
    zpp_hpz_destroy(l.hpz);
  zpp_comm_destroy(l.c);
  return 0;
}

/* A group of GROUP_NUMEL bf16 weights, hpZ on, filled and forward-gathered
 * (checked). */
static zpp_pgroup_t make_group(zpp_comm_t c, int gid) {
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  size_t sizes[1] = {GROUP_NUMEL};
  zpp_pgroup_t pg = NULL;
  uint16_t *sh, *full = NULL;
  cfg.hpz = 1;
  if (zpp_pgroup_create(c, &cfg, sizes, 1, &pg) != ZPP_OK) {
    fail("pgroup_create: %s", zpp_get_last_error());
    return NULL;
  }
  zpp_pgroup_get_info(pg, &info);
  zpp_pgroup_shard(pg, (void **)&sh);
  for (size_t j = 0; j < info.shard_numel; j++) {
    size_t g = info.shard_offset + j;
    sh[j] = g < GROUP_NUMEL ? weight(gid, g) : 0;
  }
  if (zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, NULL) != ZPP_OK ||
      zpp_pgroup_wait(pg, (void **)&full) != ZPP_OK) {
    fail("the first forward fetch: %s", zpp_get_last_error());
    return pg;
  }
  for (size_t g = 0; g < GROUP_NUMEL; g++)
    if (full[g] != weight(gid, g)) {
      fail("the first forward fetch: element %zu", g);
      break;
    }
  zpp_pgroup_release(pg);
  return pg;
}

static int run_node(const zpp_unique_id_t *id) {
  zpp_comm_t c = create(id, N_WORLD), nc = NULL;
  int map[N_WORLD], coll = ZPP_OK, st;
  pthread_t th;
  pid_t mine = getpid(), pids[N_WORLD];
  zpp_pgroup_t a = make_group(c, 0), b = make_group(c, 1);
  if (b != NULL)
    zpp_pgroup_params_changed(b); /* B's copies are stale from now on */
  MPI_Allgather(&mine, sizeof mine, MPI_BYTE, pids, sizeof mine, MPI_BYTE,
                MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD); /* the last MPI call before the fault */
  if (g_rank == 4) {
    for (int r = 4; r < N_WORLD; r++)
      g_pids[g_npids++] = pids[r];
    pthread_create(&th, NULL, killer, NULL);
  }
  double t0 = mono();
  while (a != NULL && coll == ZPP_OK && mono() - t0 < 30) {
    g_in_call = 1;
    coll = zpp_pgroup_fetch(a, ZPP_FETCH_FORWARD, NULL);
    if (coll == ZPP_OK)
      coll = zpp_pgroup_wait(a, NULL);
    g_in_call = 0;
    if (coll == ZPP_OK)
      zpp_pgroup_release(a);
  }
  if (coll == ZPP_OK)
    fail("no forward fetch failed within 30 s");
  double t_fail = mono();
  st = zpp_comm_shrink(c, NULL, map, &nc);
  double t_shrunk = mono(), t_kill = kill_time();
  if (st != ZPP_OK) {
    fail("shrink: %s", zpp_get_last_error());
    report("node 1 killed");
    return 0;
  }
  double t_exact = check_new(nc, map, N_WORLD, "0,1,2,3,-1,-1,-1,-1", "4", 1);
  /* A: recovers bitwise from node 0's copies */
  zpp_pgroup_t na = NULL, nb = NULL;
  zpp_pgroup_recovery_t rep = ZPP_PGROUP_RECOVERY_INIT;
  double t_rec0 = mono();
  st = a != NULL ? zpp_pgroup_recover(a, nc, map, &na, &rep) : ZPP_ERR_INTERNAL;
  double t_rec = mono() - t_rec0;
  if (st != ZPP_OK) {
    fail("recover A: %s", zpp_get_last_error());
  } else {
    zpp_pgroup_info_t ni = ZPP_PGROUP_INFO_INIT;
    uint16_t *sh;
    zpp_pgroup_get_info(na, &ni);
    zpp_pgroup_shard(na, (void **)&sh);
    if (rep.lost_ranks != 4 || rep.exact != 1 || rep.new_world_size != 4)
      fail("recover A: lost_ranks %d exact %d new size %d, want 4 1 4",
           rep.lost_ranks, rep.exact, rep.new_world_size);
    for (size_t j = 0; j < ni.shard_numel; j++) {
      size_t g = ni.shard_offset + j;
      uint16_t want = g < GROUP_NUMEL ? weight(0, g) : 0;
      if (sh[j] != want) {
        fail("recover A: element %zu is %#x, want %#x", g, sh[j], want);
        break;
      }
    }
    /* every element, not only this rank's shard: a forward fetch of the
     * whole group on the new communicator */
    uint16_t *full = NULL;
    if (zpp_pgroup_fetch(na, ZPP_FETCH_FORWARD, NULL) != ZPP_OK ||
        zpp_pgroup_wait(na, (void **)&full) != ZPP_OK) {
      fail("forward fetch of recovered A: %s", zpp_get_last_error());
    } else {
      for (size_t g = 0; g < GROUP_NUMEL; g++)
        if (full[g] != weight(0, g)) {
          fail("recover A: element %zu of the fetched group is %#x, want "
               "%#x",
               g, full[g], weight(0, g));
          break;
        }
      zpp_pgroup_release(na);
    }
  }
  /* B: no current copy of node 1's shards */
  zpp_pgroup_recovery_t repb = ZPP_PGROUP_RECOVERY_INIT;
  int stb =
      b != NULL ? zpp_pgroup_recover(b, nc, map, &nb, &repb) : ZPP_ERR_INTERNAL;
  char msgb[1024];
  snprintf(msgb, sizeof msgb, "%s", stb ? zpp_get_last_error() : "");
  if (stb != ZPP_ERR_DATA_LOST)
    fail("recover B returned %s, want ZPP_ERR_DATA_LOST: %s",
         zpp_status_string(stb), msgb);
  else if (strstr(msgb, "old rank 4 (node 1) died") == NULL ||
           strstr(msgb, "stale") == NULL)
    fail("recover B: the error does not name old rank 4 and its stale copy: "
         "%s",
         msgb);
  if (nb != NULL)
    zpp_pgroup_destroy(nb);
  /* the communicator still works after B's refusal */
  int old_of[4] = {0, 1, 2, 3};
  double t2 = 0;
  if (g_why[0] == '\0')
    exact_round(nc, old_of, 200, &t2);
  report("node 1 (ranks 4-7) killed during a forward fetch; fetch failed "
         "%.3f s after the kill (%s), shrink %.3f s to one node of 4, first "
         "exact collective %.3f s after the kill; group A recovered bitwise "
         "in %.3f s; group B: %s",
         t_fail - t_kill, zpp_status_string(coll), t_shrunk - t_fail,
         t_exact - t_kill, t_rec, msgb);
  if (na != NULL)
    zpp_pgroup_destroy(na);
  if (a != NULL)
    zpp_pgroup_destroy(a);
  if (b != NULL)
    zpp_pgroup_destroy(b);
  zpp_comm_destroy(nc);
  zpp_comm_destroy(c);
  return 0;
}

static int run_cut(const zpp_unique_id_t *id) {
  const char *cut = getenv("ZPP_TEST_LINK_CUT"),
             *restore = getenv("ZPP_TEST_LINK_RESTORE");
  loop_t l = {"allgather", create(id, N_WORLD), NULL, NULL, NULL};
  int map[N_WORLD], st, coll;
  zpp_comm_t nc = NULL;
  pid_t restorer = -1;
  /* the collective (T) and the shrink (3 T) end on every rank before the
   * link comes back: a rank of node 1 that could reach node 0 after its
   * ranks left would find their listeners closed (refusals) and
   * coordinate node 1 alone */
  double hold = 4 * g_t + 2;
  if (cut == NULL || restore == NULL) {
    fail("set ZPP_TEST_LINK_CUT and ZPP_TEST_LINK_RESTORE");
    report("cut");
    return 1;
  }
  l.x = calloc(COUNT, sizeof *l.x);
  l.y = calloc((size_t)N_WORLD * COUNT, sizeof *l.y);
  for (size_t i = 0; i < COUNT; i++)
    l.x[i] = normal(g_rank, 0, i);
  if (one_call(&l) != ZPP_OK)
    fail("the first all-gather: %s", zpp_comm_get_last_error(l.c));
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s", cut);
    stamp();
    if (system(cmd) != 0)
      fail("the cut command failed: %s", cut);
    restorer = fork();
    if (restorer == 0) {
      usleep((useconds_t)(hold * 1e6));
      execl("/bin/sh", "sh", "-c", restore, (char *)NULL);
      _exit(127);
    }
  } else {
    usleep(200000); /* the cut is in place */
  }
  coll = until_failure(&l);
  double t_fail = mono();
  st = zpp_comm_shrink(l.c, NULL, map, &nc);
  double t_shrunk = mono(), t_cut = kill_time();
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", st ? zpp_get_last_error() : "");
  if (t_cut == 0)
    fail("no cut time in %s", g_stamp);
  /* a cut breaks no connection: the call times out, or sees a reset once
   * a peer on its own node timed out and aborted (its shrink) */
  if (coll != ZPP_ERR_TIMEOUT &&
      !(coll == ZPP_ERR_SYSTEM && t_fail - t_cut >= 0.5 * g_t))
    fail("the collective returned %s %.3f s after the cut: want "
         "ZPP_ERR_TIMEOUT, or ZPP_ERR_SYSTEM after a peer's timeout",
         zpp_status_string(coll), t_fail - t_cut);
  if (t_shrunk - t_cut > 4 * g_t + 2)
    fail("returned %.3f s after the cut, bound T + 3 T + 2 s = %.1f s",
         t_shrunk - t_cut, 4 * g_t + 2);
  if (g_rank < 4) {
    /* node 0 decides without node 1 once the join window ends */
    if (st != ZPP_OK)
      fail("shrink on node 0: %s", msg);
    else
      check_new(nc, map, N_WORLD, "0,1,2,3,-1,-1,-1,-1", "4", 1);
  } else if (st == ZPP_OK) {
    fail("a rank of the cut node shrank to a communicator");
  } else if (st == ZPP_ERR_EXCLUDED ? strstr(msg, "rank 0 decided") == NULL
             : st == ZPP_ERR_TIMEOUT || st == ZPP_ERR_SYSTEM
                 ? strstr(msg, "rank 0, the lowest rank not proven dead") ==
                       NULL
                 : 1) {
    /* rank 0 coordinates (no refusal proves it dead): it never answered,
     * or, had the link come back in time, excluded this rank */
    fail("shrink on the cut node: %s: %s, want ZPP_ERR_TIMEOUT, _SYSTEM or "
         "_EXCLUDED naming rank 0",
         zpp_status_string(st), msg);
  }
  report("node 1's link cut while all-gathers ran: this rank's call failed "
         "%.3f s after the cut (%s), shrink %s %.3f s later%s%s",
         t_fail - t_cut, zpp_status_string(coll), zpp_status_string(st),
         t_shrunk - t_fail, st ? ": " : "", msg);
  if (nc != NULL)
    zpp_comm_destroy(nc);
  zpp_comm_destroy(l.c);
  if (restorer > 0) {
    int ws;
    waitpid(restorer, &ws, 0);
  }
  return 0;
}

int main(int argc, char **argv) {
  int prov, n;
  zpp_unique_id_t id;
  const char *mode = argc > 1 ? argv[1] : "";
  char host[256];
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  g_t = getenv("ZPP_TIMEOUT_S") ? atof(getenv("ZPP_TIMEOUT_S")) : 3.0;
  g_seed = getenv("ZPP_TEST_SEED") ? strtoull(getenv("ZPP_TEST_SEED"), NULL, 10)
                                   : 20261211ull;
  g_stamp = getenv("ZPP_TEST_KILL_STAMP") ? getenv("ZPP_TEST_KILL_STAMP")
                                          : "/tmp/zpp-shrink-cluster.stamp";
  if (n != N_WORLD) {
    if (g_rank == 0)
      printf("FAIL rank 0: run on 2 nodes x 4 ranks (-np 8), not %d\n", n);
    MPI_Finalize();
    return 1;
  }
  /* Each node is reached by its host name (the cluster's /etc/hosts): the
   * unique id's listener and the shrink listeners bind there. */
  if (gethostname(host, sizeof host) == 0 &&
      getenv("ZPP_BOOTSTRAP_ADDR") == NULL)
    setenv("ZPP_BOOTSTRAP_ADDR", host, 1);
  memset(&id, 0, sizeof id);
  if (g_rank == 0) {
    printf("seed ZPP_TEST_SEED=%llu, ZPP_TIMEOUT_S %g, mode %s %s\n",
           (unsigned long long)g_seed, g_t, mode, argc > 2 ? argv[2] : "");
    fflush(stdout);
    if (zpp_get_unique_id(&id) != ZPP_OK) {
      printf("FAIL rank 0: zpp_get_unique_id: %s\n", zpp_get_last_error());
      fflush(stdout);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (strcmp(mode, "kill") == 0 && argc > 2 &&
      (strcmp(argv[2], "qwz") == 0 || strcmp(argv[2], "hpz") == 0 ||
       strcmp(argv[2], "qgz") == 0))
    run_kill(argv[2], &id, 0);
  else if (strcmp(mode, "second") == 0)
    run_kill("qwz", &id, 1);
  else if (strcmp(mode, "node") == 0)
    run_node(&id);
  else if (strcmp(mode, "cut") == 0)
    run_cut(&id);
  else if (g_rank == 0)
    printf("FAIL rank 0: usage: shrink_cluster_worker kill qwz|hpz|qgz | "
           "node | cut | second\n");
  fflush(stdout);
  /* no MPI_Finalize: MPI does not survive the death of a rank */
  _exit(0);
}
