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
 *   --variant names mpi-best (unless the environment sets it); with no
 *   forced algorithm and no rules file tuned keeps its fixed decision, so
 *   the default mpi rows are unchanged.  A rules file
 *   (coll_tuned_dynamic_rules_filename) would take precedence over the
 *   forced algorithm: mpi-best fails by name when one is set.  Per size,
 *   every algorithm that runs there gets -w warm-up and -n timed calls
 *   (above 1 MiB at most 1 + 2); the one with the lowest median over its
 *   timed calls of each call's MAX over ranks is measured again as the
 *   row, named mpi-best[<algorithm>].
 *
 * Verification (Open MPI 4.1 only: the wrappers follow its internal
 * signatures, so they are compiled against its headers alone and used
 * only when MPI_Get_library_version says 4.1): zpp-bench defines, and
 * exports (--dynamic-list), the entry points of the algorithms
 * themselves: Open MPI's base allgather and reduce_scatter_block
 * algorithms (libmpi) and HAN's allgathers (mca_coll_han.so).  Open MPI
 * binds its references to them (calls between libmpi's own functions, and
 * the function pointers tuned and HAN store, through their GOT and PLT)
 * to the first definition in the global lookup order, the executable's;
 * each wrapper notes its name when its communicator is the one being
 * probed and calls Open MPI's own definition (dlsym(RTLD_NEXT)).  A probe
 * call on the row's buffers at each size must enter the function that was
 * asked for (HAN: a HAN allgather and no base allgather on that
 * communicator, which a HAN fallback would call; tuned: the function of
 * algorithm k first, and no other tuned algorithm, which an algorithm
 * that hands off calls), otherwise the variant fails with a message
 * naming what served the call; an algorithm that hands off (recursive
 * doubling to bruck at a size that is not a power of two, say) is not run
 * at that size, and the '# mpi-best' line says so.  Every step that can
 * fail on some ranks only is agreed on by all ranks before the next
 * collective, so a failure ends every rank with its message.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "zpp_bench_common.h"

#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PEER_MAX_ALGS 16
#define PEER_MAX_SEEN 8

/* ---- the wrappers -------------------------------------------------------- */

/* The wrappers follow Open MPI 4.1's internal signatures: compiled (and
 * exported, perf/CMakeLists.txt) only against its headers, and used only
 * when the library that runs says it is 4.1 (zpp_bench_mpi_peers_init). */
#if defined(OMPI_MAJOR_VERSION) && defined(OMPI_MINOR_VERSION) &&              \
    OMPI_MAJOR_VERSION == 4 && OMPI_MINOR_VERSION == 1
#define PEER_WRAPPERS 1
#else
#define PEER_WRAPPERS 0
#endif

static MPI_Comm g_watch = MPI_COMM_NULL; /* the communicator being probed */
static const char *g_seen[PEER_MAX_SEEN]; /* entered on g_watch, in order */
static int g_nseen;           /* entries, including those past PEER_MAX_SEEN */
static const char *g_missing; /* a wrapped symbol with no definition found */

static void seen(MPI_Comm comm, const char *name) {
  if (comm == g_watch && g_watch != MPI_COMM_NULL) {
    if (g_nseen < PEER_MAX_SEEN)
      g_seen[g_nseen] = name;
    g_nseen++;
  }
}

#if PEER_WRAPPERS
/* Open MPI's own definition of symbol: the next one after the
 * executable's in the global lookup order (libmpi, and the components,
 * which Open MPI 4.1 loads RTLD_GLOBAL). */
static void *real_of(const char *symbol, void **cache) {
  if (*cache == NULL) {
    *cache = dlsym(RTLD_NEXT, symbol);
    if (*cache == NULL && g_missing == NULL) {
      const char *e = dlerror();
      g_missing = symbol;
      fprintf(stderr,
              "zpp-bench: Open MPI's own %s was not found "
              "(dlsym(RTLD_NEXT): %s)\n",
              symbol, e != NULL ? e : "no definition after zpp-bench's");
    }
  }
  return *cache;
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
    static void *cache;                                                        \
    ag_fn_t real = (ag_fn_t)real_of(#fn, &cache);                              \
    seen(comm, label);                                                         \
    return real != NULL ? real(sb, sc, sd, rb, rc, rd, comm, module)           \
                        : MPI_ERR_INTERN;                                      \
  }
#define PEER_WRAP_RSB(fn, label)                                               \
  int fn(const void *sb, void *rb, int rc, MPI_Datatype dt, MPI_Op op,         \
         MPI_Comm comm, void *module);                                         \
  int fn(const void *sb, void *rb, int rc, MPI_Datatype dt, MPI_Op op,         \
         MPI_Comm comm, void *module) {                                        \
    static void *cache;                                                        \
    rsb_fn_t real = (rsb_fn_t)real_of(#fn, &cache);                            \
    seen(comm, label);                                                         \
    return real != NULL ? real(sb, rb, rc, dt, op, comm, module)               \
                        : MPI_ERR_INTERN;                                      \
  }

/* The labels are tuned's enumerator names (ompi_info --param coll tuned
 * --level 9 --parsable), prefixed by the component; keep g_wrapped and
 * bench_mpi_peers.dynlist in step with this list. */
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

/* The tuned algorithms a wrapper watches, per collective. */
static const char *const g_wrapped_ag[] = {
    "linear", "bruck", "recursive_doubling", "ring", "neighbor", "two_proc"};
static const char *const g_wrapped_rsb[] = {
    "basic_linear", "recursive_doubling", "recursive_halving", "butterfly"};
#endif

/* 1 when a wrapper watches tuned's algorithm `name` of the collective. */
static int wrapped(int rs, const char *name) {
#if PEER_WRAPPERS
  const char *const *w = rs ? g_wrapped_rsb : g_wrapped_ag;
  size_t i, n = rs ? sizeof g_wrapped_rsb / sizeof *g_wrapped_rsb
                   : sizeof g_wrapped_ag / sizeof *g_wrapped_ag;
  for (i = 0; i < n; i++)
    if (strcmp(w[i], name) == 0)
      return 1;
#else
  (void)rs;
  (void)name;
#endif
  return 0;
}

/* ---- state --------------------------------------------------------------- */

typedef struct {
  MPI_Comm comm;
  char name[64]; /* tuned's enumerator name */
  int alg;
  char skip[96];    /* non-empty: never run, and why */
  char handoff[96]; /* non-empty: not run at this size, and why */
} peer_alg_t;

static int g_peers_ready = 0;
static int g_coll_rs = 0; /* 1: reduce-scatter, 0: all-gather */
static int g_want_han = 0, g_want_best = 0;
static MPI_Comm g_han_comm = MPI_COMM_NULL;
static peer_alg_t g_algs[PEER_MAX_ALGS];
static int g_nalgs = 0;
static char g_why[512]; /* the last failure, for stderr */

static int my_rank(void) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

static int world_size(void) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/* Notes why this rank cannot go on and prints it; returns st. */
static zpp_status_t peer_fail_st(zpp_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static zpp_status_t peer_fail_st(zpp_status_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_why, sizeof g_why, fmt, ap);
  va_end(ap);
  fprintf(stderr, "zpp-bench: rank %d: %s\n", my_rank(), g_why);
  return st;
}

#define peer_fail(...) peer_fail_st(ZPP_ERR_UNSUPPORTED, __VA_ARGS__)

/* An MPI call that returned err: ZPP_ERR_MPI with Open MPI's text. */
static zpp_status_t peer_mpi_fail(const char *what, const char *call, int err) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", err);
  return peer_fail_st(ZPP_ERR_MPI, "%s: %s: %s", what, call, msg);
}

/* Every rank learns whether all ranks are fine (collective on
 * MPI_COMM_WORLD).  Called after each step that can fail on some ranks
 * only, before the next collective: a rank that returned early would
 * leave the others waiting in it.  When some rank failed, every rank
 * returns the status of the lowest failing one, and a rank that was fine
 * prints that rank's message. */
static zpp_status_t peer_agree(zpp_status_t st) {
  int me = my_rank(), mine = st == ZPP_OK ? INT_MAX : me, first = INT_MAX;
  int code = (int)st;
  char why[sizeof g_why];
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == INT_MAX)
    return ZPP_OK;
  memcpy(why, g_why, sizeof why);
  MPI_Bcast(why, (int)sizeof why, MPI_CHAR, first, MPI_COMM_WORLD);
  MPI_Bcast(&code, 1, MPI_INT, first, MPI_COMM_WORLD);
  if (st != ZPP_OK)
    return st; /* this rank printed its own message */
  why[sizeof why - 1] = '\0';
  memcpy(g_why, why, sizeof g_why);
  fprintf(stderr, "zpp-bench: rank %d: %s (on rank %d)\n", me, why, first);
  return (zpp_status_t)code;
}

/* Every rank learns whether all ranks are fine (ok: 1 or 0). */
static int all_ok(int ok) {
  int all = ok;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
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
  if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &n) != MPI_SUCCESS)
    return -1;
  e = n != 1          ? -1
      : write != NULL ? MPI_T_cvar_write(h, (void *)write)
                      : MPI_SUCCESS;
  if (e == MPI_SUCCESS)
    e = MPI_T_cvar_read(h, read);
  MPI_T_cvar_handle_free(&h);
  return e == MPI_SUCCESS ? 0 : -1;
}

/* Reads a string control variable (an unset one reads as "") into buf,
 * truncated to len bytes; -1 when there is none or it cannot be read. */
static int cvar_string(const char *name, char *buf, size_t len) {
  MPI_T_cvar_handle h;
  int idx, n = 0, e = -1;
  char *v = NULL;
  buf[0] = '\0';
  if (cvar_index(name, &idx) != 0)
    return -1;
  if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &n) != MPI_SUCCESS)
    return -1;
  /* n: the bytes the value may take (Open MPI 4.1: 2048) */
  if (n > 0 && (v = calloc((size_t)n + 1, 1)) != NULL &&
      MPI_T_cvar_read(h, v) == MPI_SUCCESS) {
    snprintf(buf, len, "%s", v);
    e = 0;
  }
  free(v);
  MPI_T_cvar_handle_free(&h);
  return e;
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

/* The cvar's scope and enumeration. */
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

/* The number of tuned (base) algorithms the last probe entered; *other:
 * the first of them that is not `want` (NULL: none). */
static int seen_tuned(const char *want, const char **other) {
  int i, n = 0;
  *other = NULL;
  for (i = 0; i < g_nseen && i < PEER_MAX_SEEN; i++)
    if (strncmp(g_seen[i], "tuned:", 6) == 0) {
      n++;
      if (*other == NULL && (want == NULL || strcmp(g_seen[i], want) != 0))
        *other = g_seen[i];
    }
  return n + (g_nseen > PEER_MAX_SEEN ? g_nseen - PEER_MAX_SEEN : 0);
}

/* The functions the last probe entered, in order, for a '# served' line. */
static const char *seen_list(char *buf, size_t len) {
  int i;
  buf[0] = '\0';
  for (i = 0; i < g_nseen && i < PEER_MAX_SEEN; i++)
    snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? " then " : "",
             g_seen[i]);
  return buf;
}

static int seen_han(void) {
  return g_nseen > 0 && strncmp(g_seen[0], "han:", 4) == 0;
}

/* 1 when the last probe served a HAN all-gather as asked: HAN's entered
 * first, and no base algorithm on that communicator (a HAN fallback calls
 * one). */
static int han_served(void) {
  const char *other;
  return seen_han() && seen_tuned(NULL, &other) == 0;
}

/* ---- setup --------------------------------------------------------------- */

static zpp_status_t han_create(char *text, size_t len) {
  MPI_Info info;
  int one = my_rank(), *all, n = world_size(), e, k;
  zpp_status_t st = ZPP_OK;
  MPI_Info_create(&info);
  MPI_Info_set(info, "ompi_comm_coll_preference", "han");
  e = MPI_Comm_dup_with_info(MPI_COMM_WORLD, info, &g_han_comm);
  MPI_Info_free(&info);
  if (e != MPI_SUCCESS) {
    g_han_comm = MPI_COMM_NULL;
    st = peer_mpi_fail("variant mpi-han", "MPI_Comm_dup_with_info", e);
  }
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
  MPI_Comm_set_errhandler(g_han_comm, MPI_ERRORS_RETURN);
  all = malloc((size_t)n * sizeof *all);
  if (all == NULL)
    st = peer_fail_st(ZPP_ERR_OUT_OF_MEMORY,
                      "variant mpi-han: no memory for the probe's %d ints", n);
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
  /* HAN's first call builds its node communicators with an allgather on
   * this one (coll_han_subcomms.c); a fallback replaces HAN's functions
   * for good: the second call tells */
  for (k = 0; k < 2 && st == ZPP_OK; k++) {
    if (k == 1) {
      g_watch = g_han_comm;
      g_nseen = 0;
    }
    e = MPI_Allgather(&one, 1, MPI_INT, all, 1, MPI_INT, g_han_comm);
    g_watch = MPI_COMM_NULL;
    if (e != MPI_SUCCESS)
      st = peer_mpi_fail("variant mpi-han", "the probe MPI_Allgather", e);
    st = peer_agree(st);
  }
  free(all);
  if (st != ZPP_OK)
    return st;
  if (g_nseen == 0)
    st = peer_fail("variant mpi-han: the interposition saw no call: the "
                   "probe MPI_Allgather entered none of the functions "
                   "zpp-bench wraps%s%s",
                   g_missing != NULL ? "; Open MPI's own definition is "
                                       "missing: "
                                     : "",
                   g_missing != NULL ? g_missing : "");
  else if (!han_served())
    st = peer_fail(
        "variant mpi-han: HAN was not selected: the second probe "
        "MPI_Allgather on the communicator duplicated with "
        "ompi_comm_coll_preference=han was served by %s%s (Open MPI 4.1's "
        "HAN refuses a communicator whose processes all share one node, "
        "and falls back when the ranks per node differ)",
        g_seen[0], seen_han() ? " and then a base allgather" : "");
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
  snprintf(text + strlen(text), len - strlen(text),
           "mpi-han: MPI_Comm_dup_with_info(ompi_comm_coll_preference=han); "
           "a probe allgather was served by %s%s. ",
           g_seen[0],
           g_coll_rs ? "; HAN has no reduce_scatter_block, the module under "
                       "it serves that"
                     : "");
  return ZPP_OK;
}

static zpp_status_t best_create(int world, char *text, size_t len) {
  const char *var = g_coll_rs ? "coll_tuned_reduce_scatter_block_algorithm"
                              : "coll_tuned_allgather_algorithm";
  MPI_T_enum et;
  char ename[64], rules[1024];
  int scope = 0, num = 0, nl = sizeof ename, i, dyn = 0, e;
  zpp_status_t st = ZPP_OK;
  if (cvar_int("coll_tuned_use_dynamic_rules", NULL, &dyn) != 0 || !dyn)
    st = peer_fail("variant mpi-best: coll_tuned_use_dynamic_rules is %s: "
                   "tuned ignores a forced algorithm (the variable is "
                   "read-only at run time; zpp-bench sets "
                   "OMPI_MCA_coll_tuned_use_dynamic_rules=1 before MPI_Init "
                   "unless the environment sets it)",
                   dyn ? "unreadable" : "false");
  else if (cvar_string("coll_tuned_dynamic_rules_filename", rules,
                       sizeof rules) != 0 ||
           rules[0] != '\0')
    st = peer_fail("variant mpi-best: coll_tuned_dynamic_rules_filename is "
                   "set (%s): tuned's rules file takes precedence over a "
                   "forced algorithm; unset it (OMPI_MCA_coll_tuned_dynamic_"
                   "rules_filename, an MCA parameter file) for mpi-best",
                   rules[0] ? rules : "unreadable");
  else if (cvar_info(var, &scope, &et) != 0 ||
           MPI_T_enum_get_info(et, &num, ename, &nl) != MPI_SUCCESS)
    st = peer_fail("variant mpi-best: no MPI_T control variable %s with an "
                   "enumeration",
                   var);
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
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
    if (!wrapped(g_coll_rs, item)) {
      snprintf(a->skip, sizeof a->skip,
               "no wrapper: zpp-bench cannot verify it");
      continue;
    }
    if (!g_coll_rs && strcmp(item, "two_proc") == 0 && world != 2) {
      snprintf(a->skip, sizeof a->skip, "needs 2 ranks");
      continue;
    }
    if (cvar_int(var, &value, &back) != 0 || back != value)
      st = peer_fail("variant mpi-best: MPI_T_cvar_write of %s failed "
                     "(wrote %d, read back %d)",
                     var, value, back);
    if ((st = peer_agree(st)) != ZPP_OK)
      return st;
    e = MPI_Comm_dup(MPI_COMM_WORLD, &a->comm);
    if (e != MPI_SUCCESS) {
      a->comm = MPI_COMM_NULL;
      st = peer_mpi_fail("variant mpi-best", "MPI_Comm_dup", e);
    } else {
      MPI_Comm_set_errhandler(a->comm, MPI_ERRORS_RETURN);
    }
    if (cvar_int(var, &zero, &back) != 0 || back != 0)
      st = peer_fail("variant mpi-best: could not reset %s to 0", var);
    if ((st = peer_agree(st)) != ZPP_OK)
      return st;
  }
  if (g_nalgs == 0)
    return peer_fail("variant mpi-best: %s enumerates no algorithm", var);
  snprintf(text + strlen(text), len - strlen(text),
           "; per size each runs -w warm-up + -n timed calls (at sizes above "
           "1 MiB at most 1 + 2), the fastest by the median over its timed "
           "calls of each call's MAX over ranks is measured again as the row "
           "mpi-best[<algorithm>]. ");
  return ZPP_OK;
}

/* "" when zpp-bench can see which function serves a call here, else
 * why not. */
static const char *unverifiable(char *buf, size_t len) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int n = 0;
  size_t i;
  if (!PEER_WRAPPERS) {
    snprintf(buf, len,
             "zpp-bench was built against an MPI that is not Open MPI 4.1, "
             "so it has no wrappers of its algorithms");
    return buf;
  }
  v[0] = '\0';
  if (MPI_Get_library_version(v, &n) != MPI_SUCCESS)
    snprintf(v, sizeof v, "unknown");
  if (strncmp(v, "Open MPI v4.1.", 14) == 0)
    return "";
  for (i = 0; v[i] != '\0' && v[i] != '\n' && v[i] != ','; i++)
    ;
  v[i] = '\0';
  snprintf(buf, len,
           "the library is %s; zpp-bench's wrappers follow Open MPI 4.1's "
           "internal functions",
           v);
  return buf;
}

zpp_status_t zpp_bench_mpi_peers_init(const zpp_bench_ctx_t *ctx,
                                      const zpp_bench_variant_t *v, int nv,
                                      int reduce_scatter, char *text,
                                      size_t len) {
  zpp_status_t st = ZPP_OK;
  const char *why = NULL;
  char buf[256];
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
  if (why != NULL) /* the same on every rank, and no MPI from here */
    return peer_fail("variants mpi-han, mpi-best %s", why);
  why = unverifiable(buf, sizeof buf);
  if (why[0] != '\0')
    st = peer_fail("variants mpi-han, mpi-best: selection cannot be "
                   "verified on this Open MPI (%s)",
                   why);
  if (st == ZPP_OK) {
    int prov = 0, e = MPI_T_init_thread(MPI_THREAD_SERIALIZED, &prov);
    if (e != MPI_SUCCESS)
      st = peer_mpi_fail("variants mpi-han, mpi-best", "MPI_T_init_thread", e);
    else
      g_mpit = 1;
  }
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* mpi-best at one size: every algorithm that runs here, warm-up and
 * timed calls (each after a barrier; above 1 MiB at most 1 + 2), each
 * call's MAX over ranks; the winner has the lowest median.  *pick: its
 * index (-1: none ran). */
static zpp_status_t best_trial(const zpp_bench_ctx_t *ctx, zpp_bench_case_t *c,
                               MPI_Datatype type, MPI_Op op, int count,
                               char *line, size_t len, int *pick) {
  const zpp_bench_opts_t *o = ctx->opt;
  int big = c->bytes > ((size_t)1 << 20);
  int warm = big && o->warmup > 1 ? 1 : o->warmup;
  int timed = big && o->iters > 2 ? 2 : o->iters;
  double best = -1, *t;
  int k, it;
  zpp_status_t st = ZPP_OK;
  *pick = -1;
  t = malloc(((size_t)timed + 1) * sizeof *t);
  if (t == NULL)
    st = peer_fail_st(ZPP_ERR_OUT_OF_MEMORY,
                      "variant mpi-best: no memory for %d times", timed);
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
  snprintf(line, len, "mpi-best size %zu (%d + %d calls each):", c->bytes, warm,
           timed);
  for (k = 0; k < g_nalgs; k++) {
    peer_alg_t *a = &g_algs[k];
    struct timespec t0, t1;
    int err = MPI_SUCCESS, e;
    double med;
    if (a->skip[0] || a->handoff[0]) {
      snprintf(line + strlen(line), len - strlen(line), " %s (%s)", a->name,
               a->skip[0] ? a->skip : a->handoff);
      continue;
    }
    for (it = 0; it < warm + timed; it++) {
      MPI_Barrier(MPI_COMM_WORLD);
      clock_gettime(CLOCK_MONOTONIC, &t0);
      if (g_coll_rs)
        e = MPI_Reduce_scatter_block(c->in->host, c->out->host, count, type, op,
                                     a->comm);
      else
        e = MPI_Allgather(c->in->host, count, type, c->out->host, count, type,
                          a->comm);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      if (e != MPI_SUCCESS && err == MPI_SUCCESS)
        err = e;
      if (it >= warm)
        t[it - warm] = (double)(t1.tv_sec - t0.tv_sec) +
                       1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    t[timed] = err != MPI_SUCCESS; /* the MAX over ranks: any failed */
    MPI_Allreduce(MPI_IN_PLACE, t, timed + 1, MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
    if (t[timed] != 0) {
      st = err != MPI_SUCCESS
               ? peer_mpi_fail("variant mpi-best", a->name, err)
               : peer_fail_st(ZPP_ERR_MPI,
                              "variant mpi-best: %s failed on another rank",
                              a->name);
      break;
    }
    qsort(t, (size_t)timed, sizeof *t, cmp_double);
    med = timed % 2 ? t[timed / 2] : 0.5 * (t[timed / 2 - 1] + t[timed / 2]);
    snprintf(line + strlen(line), len - strlen(line), " %s %.1f us", a->name,
             med * 1e6);
    if (best < 0 || med < best) {
      best = med;
      *pick = k;
    }
  }
  free(t);
  return st;
}

/* The probe of one mpi-best algorithm at this size: ZPP_OK when the
 * forced function was the one entered first and no other tuned algorithm
 * was entered; a hand-off to another algorithm marks it not run here. */
static zpp_status_t best_verify(zpp_bench_case_t *c, peer_alg_t *a,
                                MPI_Datatype type, MPI_Op op, int count) {
  char want[80];
  const char *other = NULL;
  int e, ran_here;
  zpp_status_t st = ZPP_OK;
  snprintf(want, sizeof want, "tuned:%s", a->name);
  e = probe(a->comm, c->in->host, c->out->host, count, type, op);
  if (e != MPI_SUCCESS)
    st = peer_mpi_fail("variant mpi-best", "the probe call", e);
  else if (g_nseen == 0)
    st = peer_fail("variant mpi-best: the interposition saw no call: the "
                   "probe on the communicator forced to %s entered none of "
                   "the functions zpp-bench wraps%s%s",
                   want,
                   g_missing != NULL ? "; Open MPI's own definition is "
                                       "missing: "
                                     : "",
                   g_missing != NULL ? g_missing : "");
  else if (strcmp(g_seen[0], want) != 0)
    st = peer_fail("variant mpi-best: the communicator forced to %s was "
                   "served by %s",
                   want, g_seen[0]);
  if ((st = peer_agree(st)) != ZPP_OK)
    return st;
  /* exactly one tuned algorithm entered, the forced one */
  ran_here = seen_tuned(want, &other) == 1;
  if (!all_ok(ran_here))
    snprintf(a->handoff, sizeof a->handoff, "hands off to %s at %d ranks",
             other != NULL ? other + 6
                           : "another algorithm (another rank "
                             "saw it)",
             world_size());
  return ZPP_OK;
}

zpp_status_t zpp_bench_mpi_peer_setup(const zpp_bench_ctx_t *ctx,
                                      zpp_bench_case_t *c, void *default_comm,
                                      void *type_p, void *op_p, int count,
                                      void **comm_out) {
  MPI_Datatype type = *(MPI_Datatype *)type_p;
  MPI_Op op = *(MPI_Op *)op_p;
  char line[1024], names[256];
  int k, e, pick = -1;
  zpp_status_t st = ZPP_OK;
  if (c->v->peer == ZPP_BENCH_PEER_DEFAULT) {
    /* Open MPI's own choice: named, not required */
    MPI_Comm comm = *(MPI_Comm *)default_comm;
    e = probe(comm, c->in->host, c->out->host, count, type, op);
    if (e != MPI_SUCCESS)
      st = peer_mpi_fail("variant mpi", "the probe call", e);
    if ((st = peer_agree(st)) != ZPP_OK)
      return st;
    snprintf(line, sizeof line, "served: mpi size %zu by %s", c->bytes,
             g_nseen > 0 ? seen_list(names, sizeof names)
                         : "a function zpp-bench does not watch");
    *comm_out = default_comm;
  } else if (!g_peers_ready) {
    return peer_fail("variant %s: the Open MPI peers are not set up "
                     "(zpp_bench_mpi_peers_init did not succeed)",
                     c->v->name);
  } else if (c->v->peer == ZPP_BENCH_PEER_HAN) {
    e = probe(g_han_comm, c->in->host, c->out->host, count, type, op);
    if (e != MPI_SUCCESS)
      st = peer_mpi_fail("variant mpi-han", "the probe call", e);
    else if (g_nseen == 0)
      st = peer_fail("variant mpi-han: the interposition saw no call at "
                     "size %zu",
                     c->bytes);
    /* all-gather: HAN's, with no fallback; reduce-scatter: HAN has none,
     * the module under it serves it */
    else if (g_coll_rs ? seen_han() : !han_served())
      st = peer_fail("variant mpi-han: the probe call at size %zu was "
                     "served by %s, not by %s",
                     c->bytes, g_seen[0],
                     g_coll_rs ? "the module under HAN" : "HAN alone");
    if ((st = peer_agree(st)) != ZPP_OK)
      return st;
    snprintf(c->label, sizeof c->label, "mpi-han");
    snprintf(line, sizeof line, "served: mpi-han size %zu by %s%s", c->bytes,
             seen_list(names, sizeof names),
             g_coll_rs ? " (HAN 4.1 has no reduce_scatter_block)" : "");
    *comm_out = &g_han_comm;
  } else {
    /* every algorithm must be the one that serves its communicator */
    for (k = 0; k < g_nalgs; k++) {
      peer_alg_t *a = &g_algs[k];
      a->handoff[0] = '\0';
      if (a->skip[0])
        continue;
      if ((st = best_verify(c, a, type, op, count)) != ZPP_OK)
        return st;
    }
    st = best_trial(ctx, c, type, op, count, line, sizeof line, &pick);
    if (st != ZPP_OK)
      return st;
    if (pick < 0)
      return peer_fail("variant mpi-best: no algorithm runs at size %zu: %s",
                       c->bytes, line);
    snprintf(c->label, sizeof c->label, "mpi-best[%s]", g_algs[pick].name);
    snprintf(line + strlen(line), sizeof line - strlen(line),
             " -> %s (each run verified: its forced function alone served "
             "a probe)",
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
