/*
 * zpp-bench's strongest Open MPI peers (Open MPI 4.1): the variants
 * mpi-han and mpi-best, each on a communicator of its own, and the check
 * that the selection they ask for is the one that serves the call.
 *
 * Selection (Open MPI picks a communicator's coll modules when it is
 * created, so each peer gets a duplicate of MPI_COMM_WORLD):
 * - mpi-han: MPI_Comm_dup_with_info with the info key
 *   ompi_comm_coll_preference=han, which moves HAN to the top of that
 *   communicator's modules (coll_base_comm_select.c).  coll_han_priority
 *   cannot be raised instead: it is read-only at run time (MPI_T scope
 *   below READWRITE, ompi_info "status:read-only"), and raising it before
 *   MPI_Init would put HAN under the default mpi rows too.  HAN 4.1 has
 *   no reduce_scatter_block: on its communicator the module under it
 *   serves MPI_Reduce_scatter_block (tuned's fixed decision).
 * - mpi-best: for every algorithm k of tuned's
 *   coll_tuned_allgather_algorithm / coll_tuned_reduce_scatter_block_
 *   algorithm (MPI_T enumeration), MPI_T_cvar_write(k), read back, dup,
 *   write 0 ("ignore") again.  tuned reads a forced algorithm only when
 *   coll_tuned_use_dynamic_rules is true, which is read-only at run time:
 *   main sets OMPI_MCA_coll_tuned_use_dynamic_rules=1 before MPI_Init when
 *   a variant asks for mpi-best (unless the environment sets it); with no
 *   forced algorithm and no rules file tuned keeps its fixed decision, so
 *   the default mpi rows are unchanged.  Per size, every algorithm runs -w
 *   warm-up and -n timed calls; the fastest (MAX over ranks of the mean)
 *   is measured again as the row, named mpi-best[<algorithm>].
 *
 * Verification: zpp-bench defines, and exports (--dynamic-list), the
 * entry points of the algorithms themselves: Open MPI's base allgather
 * and reduce_scatter_block algorithms (libmpi) and HAN's allgathers
 * (mca_coll_han.so).  tuned and HAN reach them through their PLT, so the
 * definition of the executable comes first; each wrapper notes its name
 * when its communicator is the one being probed and calls Open MPI's own
 * definition (found in the loaded objects by dlopen(RTLD_NOLOAD) +
 * dlsym).  A probe call on the row's buffers at each size must enter the
 * function that was asked for (HAN: a HAN allgather and no base
 * allgather on that communicator, which a HAN fallback would call;
 * tuned: the base function of algorithm k first); otherwise the variant
 * fails with a message naming what served the call instead.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "zpp_bench_common.h"

#include <dlfcn.h>
#include <link.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PEER_MAX_ALGS 16
#define PEER_MAX_SEEN 8

/* ---- the wrappers -------------------------------------------------------- */

static MPI_Comm g_watch = MPI_COMM_NULL; /* the communicator being probed */
static const char *g_seen[PEER_MAX_SEEN]; /* entered on g_watch, in order */
static int g_nseen;

typedef struct {
  const char *symbol;
  void *real;
} peer_sym_t;

typedef struct {
  const char *symbol;
  peer_sym_t *sym;
  int found;
} peer_find_t;

/* Open MPI's own definition of f->symbol: the first loaded object other
 * than the executable that defines it. */
static int find_in_object(struct dl_phdr_info *info, size_t size, void *arg) {
  peer_find_t *f = (peer_find_t *)arg;
  void *h, *p;
  (void)size;
  if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
    return 0; /* the executable */
  h = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
  if (h == NULL)
    return 0;
  p = dlsym(h, f->symbol);
  dlclose(h);
  if (p == NULL)
    return 0;
  f->sym->real = p;
  f->found = 1;
  return 1;
}

static void *real_of(peer_sym_t *s) {
  if (s->real == NULL) {
    peer_find_t f = {s->symbol, s, 0};
    dl_iterate_phdr(find_in_object, &f);
  }
  return s->real;
}

static void seen(MPI_Comm comm, const char *name) {
  if (comm == g_watch && g_watch != MPI_COMM_NULL && g_nseen < PEER_MAX_SEEN)
    g_seen[g_nseen++] = name;
}

typedef int (*ag_fn_t)(const void *, int, MPI_Datatype, void *, int,
                       MPI_Datatype, MPI_Comm, void *);
typedef int (*rsb_fn_t)(const void *, void *, int, MPI_Datatype, MPI_Op,
                        MPI_Comm, void *);

/* Open MPI 4.1's signatures (coll_base_functions.h, coll_han.h): its
 * datatype, communicator and op structs are what MPI_Datatype, MPI_Comm
 * and MPI_Op point to; the module is passed through. */
#define PEER_WRAP_AG(fn, label)                                                \
  int fn(const void *sb, int sc, MPI_Datatype sd, void *rb, int rc,            \
         MPI_Datatype rd, MPI_Comm comm, void *module);                        \
  int fn(const void *sb, int sc, MPI_Datatype sd, void *rb, int rc,            \
         MPI_Datatype rd, MPI_Comm comm, void *module) {                       \
    static peer_sym_t s = {#fn, NULL};                                         \
    ag_fn_t real = (ag_fn_t)real_of(&s);                                       \
    seen(comm, label);                                                         \
    return real != NULL ? real(sb, sc, sd, rb, rc, rd, comm, module)          \
                        : MPI_ERR_INTERN;                                      \
  }
#define PEER_WRAP_RSB(fn, label)                                               \
  int fn(const void *sb, void *rb, int rc, MPI_Datatype dt, MPI_Op op,         \
         MPI_Comm comm, void *module);                                         \
  int fn(const void *sb, void *rb, int rc, MPI_Datatype dt, MPI_Op op,         \
         MPI_Comm comm, void *module) {                                        \
    static peer_sym_t s = {#fn, NULL};                                         \
    rsb_fn_t real = (rsb_fn_t)real_of(&s);                                     \
    seen(comm, label);                                                         \
    return real != NULL ? real(sb, rb, rc, dt, op, comm, module)              \
                        : MPI_ERR_INTERN;                                      \
  }

/* The labels are tuned's enumerator names (ompi_info --param coll tuned
 * --level 9 --parsable), prefixed by the component. */
PEER_WRAP_AG(ompi_coll_base_allgather_intra_basic_linear, "tuned:linear")
PEER_WRAP_AG(ompi_coll_base_allgather_intra_bruck, "tuned:bruck")
PEER_WRAP_AG(ompi_coll_base_allgather_intra_recursivedoubling,
             "tuned:recursive_doubling")
PEER_WRAP_AG(ompi_coll_base_allgather_intra_ring, "tuned:ring")
PEER_WRAP_AG(ompi_coll_base_allgather_intra_neighborexchange,
             "tuned:neighbor")
PEER_WRAP_AG(ompi_coll_base_allgather_intra_two_procs, "tuned:two_proc")
PEER_WRAP_AG(mca_coll_han_allgather_intra, "han:allgather_intra")
PEER_WRAP_AG(mca_coll_han_allgather_intra_simple, "han:allgather_simple")
PEER_WRAP_RSB(ompi_coll_base_reduce_scatter_block_basic_linear,
              "tuned:basic_linear")
PEER_WRAP_RSB(ompi_coll_base_reduce_scatter_block_intra_recursivedoubling,
              "tuned:recursive_doubling")
PEER_WRAP_RSB(ompi_coll_base_reduce_scatter_block_intra_recursivehalving,
              "tuned:recursive_halving")
PEER_WRAP_RSB(ompi_coll_base_reduce_scatter_block_intra_butterfly,
              "tuned:butterfly")

/* ---- state --------------------------------------------------------------- */

typedef struct {
  MPI_Comm comm;
  char name[64]; /* tuned's enumerator name */
  int alg;
  char skip[80]; /* non-empty: not run, and why */
} peer_alg_t;

static int g_peers_ready = 0;
static int g_coll_rs = 0; /* 1: reduce-scatter, 0: all-gather */
static int g_want_han = 0, g_want_best = 0;
static MPI_Comm g_han_comm = MPI_COMM_NULL;
static peer_alg_t g_algs[PEER_MAX_ALGS];
static int g_nalgs = 0;
static char g_why[512]; /* the last failure, for the header and stderr */

static int my_rank(void) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

static zpp_status_t peer_fail(const char *fmt, const char *a, const char *b) {
  snprintf(g_why, sizeof g_why, fmt, a, b);
  fprintf(stderr, "zpp-bench: rank %d: %s\n", my_rank(), g_why);
  return ZPP_ERR_UNSUPPORTED;
}

/* ---- MPI_T ---------------------------------------------------------------- */

static int g_mpit = 0;

static int cvar_index(const char *name, int *idx) {
  return MPI_T_cvar_get_index(name, idx) == MPI_SUCCESS ? 0 : -1;
}

/* Reads (write == NULL) or writes then reads back an int control variable
 * without an object binding. */
static int cvar_int(const char *name, const int *write, int *read) {
  MPI_T_cvar_handle h;
  int idx, n = 0, e;
  if (cvar_index(name, &idx) != 0)
    return -1;
  if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &n) != MPI_SUCCESS || n != 1)
    return -1;
  e = write != NULL ? MPI_T_cvar_write(h, (void *)write) : MPI_SUCCESS;
  if (e == MPI_SUCCESS)
    e = MPI_T_cvar_read(h, read);
  MPI_T_cvar_handle_free(&h);
  return e == MPI_SUCCESS ? 0 : e;
}

static const char *scope_name(int scope) {
  switch (scope) {
  case MPI_T_SCOPE_CONSTANT:
    return "constant";
  case MPI_T_SCOPE_READONLY:
    return "read-only";
  case MPI_T_SCOPE_LOCAL:
    return "local (writable)";
  case MPI_T_SCOPE_GROUP:
  case MPI_T_SCOPE_GROUP_EQ:
    return "group (writable)";
  case MPI_T_SCOPE_ALL:
  case MPI_T_SCOPE_ALL_EQ:
    return "all (writable)";
  default:
    return "unknown";
  }
}

/* The cvar's scope and enumeration (names of values 1..n-1 into algs). */
static int cvar_info(const char *name, int *scope, MPI_T_enum *et) {
  char n[128], d[512];
  int idx, nl = sizeof n, dl = sizeof d, verb, bind;
  MPI_Datatype dt;
  if (cvar_index(name, &idx) != 0)
    return -1;
  return MPI_T_cvar_get_info(idx, n, &nl, &verb, &dt, et, d, &dl, &bind,
                             scope) == MPI_SUCCESS
             ? 0
             : -1;
}

/* ---- probing ------------------------------------------------------------- */

/* One call of the collective on comm with the wrappers watching it. */
static int probe(MPI_Comm comm, const void *in, void *out, int count,
                 MPI_Datatype type, MPI_Op op) {
  int e;
  g_watch = comm;
  g_nseen = 0;
  if (g_coll_rs)
    e = MPI_Reduce_scatter_block(in, out, count, type, op, comm);
  else
    e = MPI_Allgather(in, count, type, out, count, type, comm);
  g_watch = MPI_COMM_NULL;
  return e;
}

static const char *first_seen(void) {
  return g_nseen > 0 ? g_seen[0] : "nothing zpp-bench watches";
}

/* 1 when the last probe called a base allgather algorithm on the
 * watched communicator (a HAN fallback does). */
static int seen_base(void) {
  int i;
  for (i = 0; i < g_nseen; i++)
    if (strncmp(g_seen[i], "tuned:", 6) == 0)
      return 1;
  return 0;
}

static int seen_han(void) {
  return g_nseen > 0 && strncmp(g_seen[0], "han:", 4) == 0;
}

/* Every rank learns whether all ranks are fine. */
static int all_ok(int ok) {
  int all = ok;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

/* ---- setup --------------------------------------------------------------- */

static zpp_status_t han_create(char *text, size_t len) {
  MPI_Info info;
  int one = my_rank(), *all, n = 0, ok;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Info_create(&info);
  MPI_Info_set(info, "ompi_comm_coll_preference", "han");
  if (MPI_Comm_dup_with_info(MPI_COMM_WORLD, info, &g_han_comm) !=
      MPI_SUCCESS) {
    MPI_Info_free(&info);
    return peer_fail("variant mpi-han: MPI_Comm_dup_with_info failed%s%s", "",
                     "");
  }
  MPI_Info_free(&info);
  MPI_Comm_set_errhandler(g_han_comm, MPI_ERRORS_RETURN);
  /* HAN is on the communicator when its allgather serves one */
  all = malloc((size_t)n * sizeof *all);
  if (all == NULL)
    return ZPP_ERR_OUT_OF_MEMORY;
  /* HAN's first call builds its node communicators with an allgather on
   * this one (coll_han_subcomms.c); a fallback replaces HAN's functions
   * for good: the second call tells */
  MPI_Allgather(&one, 1, MPI_INT, all, 1, MPI_INT, g_han_comm);
  g_watch = g_han_comm;
  g_nseen = 0;
  MPI_Allgather(&one, 1, MPI_INT, all, 1, MPI_INT, g_han_comm);
  g_watch = MPI_COMM_NULL;
  free(all);
  ok = all_ok(seen_han() && !seen_base());
  if (!ok)
    return peer_fail(
        "variant mpi-han: HAN was not selected: the second probe "
        "MPI_Allgather on the communicator duplicated with "
        "ompi_comm_coll_preference=han was served by %s%s (Open MPI 4.1's "
        "HAN refuses a communicator whose "
        "processes all share one node, and falls back when the ranks per "
        "node differ)",
        first_seen(), seen_han() ? " and then a base allgather" : "");
  snprintf(text + strlen(text), len - strlen(text),
           "mpi-han: MPI_Comm_dup_with_info(ompi_comm_coll_preference=han); "
           "a probe allgather was served by %s%s. ",
           g_seen[0],
           g_coll_rs ? "; HAN has no reduce_scatter_block, the module under "
                       "it serves that (named per size)"
                     : "");
  return ZPP_OK;
}

static zpp_status_t best_create(int world, char *text, size_t len) {
  const char *var = g_coll_rs ? "coll_tuned_reduce_scatter_block_algorithm"
                              : "coll_tuned_allgather_algorithm";
  MPI_T_enum et;
  char ename[64];
  int scope = 0, num = 0, nl = sizeof ename, i, dyn = 0;
  if (cvar_int("coll_tuned_use_dynamic_rules", NULL, &dyn) != 0 || !dyn)
    return peer_fail("variant mpi-best: coll_tuned_use_dynamic_rules is %s: "
                     "tuned ignores a forced algorithm (the variable is "
                     "read-only at run time; zpp-bench sets "
                     "OMPI_MCA_coll_tuned_use_dynamic_rules=1 before MPI_Init "
                     "unless the environment sets it)%s",
                     dyn ? "unreadable" : "false", "");
  if (cvar_info(var, &scope, &et) != 0 ||
      MPI_T_enum_get_info(et, &num, ename, &nl) != MPI_SUCCESS)
    return peer_fail("variant mpi-best: no MPI_T control variable %s with an "
                     "enumeration%s",
                     var, "");
  snprintf(text + strlen(text), len - strlen(text),
           "mpi-best: MPI_T_cvar_write(%s = k) (scope %s), read back, "
           "MPI_Comm_dup, for k in",
           var, scope_name(scope));
  g_nalgs = 0;
  for (i = 0; i < num && g_nalgs < PEER_MAX_ALGS; i++) {
    peer_alg_t *a = &g_algs[g_nalgs];
    char item[64];
    int value = 0, il = sizeof item, back = -1, zero = 0;
    if (MPI_T_enum_get_item(et, i, &value, item, &il) != MPI_SUCCESS ||
        value == 0)
      continue; /* 0: "ignore", tuned's own decision */
    memset(a, 0, sizeof *a);
    a->comm = MPI_COMM_NULL;
    a->alg = value;
    snprintf(a->name, sizeof a->name, "%s", item);
    g_nalgs++;
    snprintf(text + strlen(text), len - strlen(text), " %d:%s", value, item);
    if (!g_coll_rs && strcmp(item, "two_proc") == 0 && world != 2) {
      snprintf(a->skip, sizeof a->skip, "needs 2 ranks");
      continue;
    }
    if (cvar_int(var, &value, &back) != 0 || back != value) {
      char msg[64];
      snprintf(msg, sizeof msg, "%d, read back %d", value, back);
      return peer_fail("variant mpi-best: MPI_T_cvar_write of %s failed "
                       "(wrote %s)",
                       var, msg);
    }
    if (MPI_Comm_dup(MPI_COMM_WORLD, &a->comm) != MPI_SUCCESS)
      return peer_fail("variant mpi-best: MPI_Comm_dup for %s failed%s", item,
                       "");
    MPI_Comm_set_errhandler(a->comm, MPI_ERRORS_RETURN);
    if (cvar_int(var, &zero, &back) != 0 || back != 0)
      return peer_fail("variant mpi-best: could not reset %s to 0%s", var, "");
  }
  if (g_nalgs == 0)
    return peer_fail("variant mpi-best: %s enumerates no algorithm%s", var,
                     "");
  snprintf(text + strlen(text), len - strlen(text),
           "; per size each runs -w + -n calls, the fastest is measured again "
           "as the row mpi-best[<algorithm>]. ");
  return ZPP_OK;
}

zpp_status_t zpp_bench_mpi_peers_init(const zpp_bench_ctx_t *ctx,
                                      const zpp_bench_variant_t *v, int nv,
                                      int reduce_scatter, char *text,
                                      size_t len) {
  zpp_status_t st = ZPP_OK;
  const char *why = NULL;
  int i;
  text[0] = '\0';
  g_coll_rs = reduce_scatter;
  for (i = 0; i < nv; i++) {
    g_want_han |= v[i].peer == ZPP_BENCH_PEER_HAN;
    g_want_best |= v[i].peer == ZPP_BENCH_PEER_BEST;
  }
  if (!g_want_han && !g_want_best)
    return ZPP_OK;
  why = zpp_bench_mpi_check(ctx);
  if (why != NULL) {
    fprintf(stderr, "zpp-bench: rank %d: variants mpi-han, mpi-best %s\n",
            ctx->rank, why);
    return ZPP_ERR_UNSUPPORTED;
  }
  {
    int prov = 0;
    if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
      return peer_fail("MPI_T_init_thread failed%s%s", "", "");
    g_mpit = 1;
  }
  {
    int scope = -1;
    MPI_T_enum et;
    if (cvar_info("coll_han_priority", &scope, &et) == 0)
      snprintf(text, len, "coll_han_priority scope %s. ", scope_name(scope));
    if (cvar_info("coll_tuned_use_dynamic_rules", &scope, &et) == 0)
      snprintf(text + strlen(text), len - strlen(text),
               "coll_tuned_use_dynamic_rules scope %s. ", scope_name(scope));
  }
  if (g_want_han)
    st = han_create(text, len);
  if (st == ZPP_OK && g_want_best)
    st = best_create(ctx->world, text, len);
  g_peers_ready = st == ZPP_OK;
  return st;
}

const char *zpp_bench_mpi_peers_error(void) { return g_why; }

/* mpi-best at one size: every algorithm -w + -n calls (each after a
 * barrier), the MAX over ranks of its mean; returns the fastest. */
static int best_trial(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c,
                      MPI_Datatype type, MPI_Op op, int count, char *line,
                      size_t len) {
  const zpp_bench_opts_t *o = ctx->opt;
  double best = -1;
  int k, it, pick = -1;
  snprintf(line, len, "mpi-best size %zu:", c->bytes);
  for (k = 0; k < g_nalgs; k++) {
    peer_alg_t *a = &g_algs[k];
    double total = 0, mean;
    struct timespec t0, t1;
    if (a->skip[0]) {
      snprintf(line + strlen(line), len - strlen(line), " %s (%s)", a->name,
               a->skip);
      continue;
    }
    for (it = 0; it < o->warmup + o->iters; it++) {
      MPI_Barrier(MPI_COMM_WORLD);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      if (g_coll_rs)
        MPI_Reduce_scatter_block(c->in->host, c->out->host, count, type, op,
                                 a->comm);
      else
        MPI_Allgather(c->in->host, count, type, c->out->host, count, type,
                      a->comm);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      if (it >= o->warmup)
        total += (double)(t1.tv_sec - t0.tv_sec) +
                 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    mean = total / o->iters;
    MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
    snprintf(line + strlen(line), len - strlen(line), " %s %.1f us", a->name,
             mean * 1e6);
    if (best < 0 || mean < best) {
      best = mean;
      pick = k;
    }
  }
  return pick;
}

zpp_status_t zpp_bench_mpi_peer_setup(const zpp_bench_ctx_t *ctx,
                                      zpp_bench_case_t *c, void *default_comm,
                                      void *type_p, void *op_p, int count,
                                      void **comm_out) {
  MPI_Datatype type = *(MPI_Datatype *)type_p;
  MPI_Op op = *(MPI_Op *)op_p;
  char line[1024];
  int k, ok, pick;
  if (c->v->peer == ZPP_BENCH_PEER_DEFAULT) {
    /* Open MPI's own choice: named, not required */
    MPI_Comm comm = *(MPI_Comm *)default_comm;
    ok = probe(comm, c->in->host, c->out->host, count, type, op) ==
         MPI_SUCCESS;
    if (!all_ok(ok))
      return peer_fail("variant mpi: the probe call failed%s%s", "", "");
    snprintf(line, sizeof line, "served: mpi size %zu by %s", c->bytes,
             g_nseen > 0 ? g_seen[0] : "a function zpp-bench does not watch");
    *comm_out = default_comm;
  } else if (!g_peers_ready) {
    return ZPP_ERR_UNSUPPORTED;
  } else if (c->v->peer == ZPP_BENCH_PEER_HAN) {
    ok = probe(g_han_comm, c->in->host, c->out->host, count, type, op) ==
         MPI_SUCCESS;
    /* all-gather: HAN's, with no fallback; reduce-scatter: HAN has none */
    ok = all_ok(ok && (g_coll_rs ? g_nseen > 0 : seen_han() && !seen_base()));
    if (!ok)
      return peer_fail("variant mpi-han: the probe call was served by %s, "
                       "not by %s",
                       first_seen(),
                       g_coll_rs ? "a function zpp-bench watches" : "HAN");
    snprintf(c->label, sizeof c->label, "mpi-han");
    snprintf(line, sizeof line, "served: mpi-han size %zu by %s%s", c->bytes,
             g_seen[0],
             g_coll_rs ? " (HAN 4.1 has no reduce_scatter_block)" : "");
    *comm_out = &g_han_comm;
  } else {
    /* every algorithm must be the one that serves its communicator */
    for (k = 0; k < g_nalgs; k++) {
      peer_alg_t *a = &g_algs[k];
      char want[48];
      if (a->skip[0])
        continue;
      snprintf(want, sizeof want, "tuned:%s", a->name);
      ok = probe(a->comm, c->in->host, c->out->host, count, type, op) ==
           MPI_SUCCESS;
      ok = all_ok(ok && g_nseen > 0 && strcmp(g_seen[0], want) == 0);
      if (!ok)
        return peer_fail("variant mpi-best: the communicator forced to %s "
                         "was served by %s",
                         want, first_seen());
    }
    pick = best_trial(ctx, c, type, op, count, line, sizeof line);
    if (pick < 0)
      return peer_fail("variant mpi-best: no algorithm can run%s%s", "", "");
    snprintf(c->label, sizeof c->label, "mpi-best[%s]", g_algs[pick].name);
    snprintf(line + strlen(line), sizeof line - strlen(line),
             " -> %s (each verified: its forced function served a probe)",
             g_algs[pick].name);
    *comm_out = &g_algs[pick].comm;
  }
  if (ctx->rank == 0 && ctx->opt->format != ZPP_BENCH_JSON) {
    printf("# %s\n", line);
    fflush(stdout);
  }
  return ZPP_OK;
}

void zpp_bench_mpi_peers_teardown(void) {
  int k;
  for (k = 0; k < g_nalgs; k++)
    if (g_algs[k].comm != MPI_COMM_NULL)
      MPI_Comm_free(&g_algs[k].comm);
  g_nalgs = 0;
  if (g_han_comm != MPI_COMM_NULL)
    MPI_Comm_free(&g_han_comm);
  if (g_mpit)
    MPI_T_finalize();
  g_mpit = 0;
  g_peers_ready = 0;
}
