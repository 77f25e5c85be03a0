/*
 * Every ZPP_* environment variable in one table: name, default, help, and
 * for numbers the range the code relies on.  Values are read once, on
 * first use, into the table; zpp_settings_print shows them all (tools
 * expose it as --print-settings).  A number that does not parse or lies
 * outside its range logs a warning and yields the caller's default, so
 * callers may compute with it (spin_us * 1000, MiB << 20) without checks
 * of their own.
 */
#include "core/core.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *name;
  const char *def;
  const char *help;
  const char *value; /* environment, else def */
  int from_env;
} zpp_setting_t;

/* Ranges of the numeric settings (text settings: not listed). */
static const struct {
  const char *name;
  double lo, hi;
} ranges[] = {
    /* seconds: at most ~31 years; zpp_timeout_clamp caps it further */
    {"ZPP_TIMEOUT_S", 0, 1e9},
    /* the callers check it and fail with their own message */
    {"ZPP_BOOTSTRAP_PORT", (double)LONG_MIN, (double)LONG_MAX},
    {"ZPP_EMU_INTER_GBIT", 0, 1e6},
    {"ZPP_EMU_INTER_LAT_US", 0, 1e9},
    {"ZPP_PIPE_MIN_CHUNK", 0, 1e15},
    {"ZPP_NET_SPIN_US", 0, 1e9},
    {"ZPP_NET_RINGS", 1, 64},
    /* MiB: << 20 must fit size_t */
    {"ZPP_SCRATCH_CACHE_MB", 0, 1 << 24},
    {"ZPP_SCRATCH_POOL_MB", 0, 1 << 24},
};

static zpp_setting_t settings[] = {
    {"ZPP_DEBUG", "WARN", "log level: NONE, WARN, INFO or TRACE", NULL, 0},
    {"ZPP_DEBUG_SUBSYS", "ALL",
     "comma list of subsystems to log: INIT,QUANT,TOPO,NET,COLL or ALL", NULL,
     0},
    {"ZPP_DEBUG_FILE", "",
     "log to this file instead of stderr; %h host and %p pid are expanded",
     NULL, 0},
    {"ZPP_CPU_ISA", "auto",
     "CPU quantizer path: auto, scalar, avx2 or avx512", NULL, 0},
    {"ZPP_QGZ_SUM", "float",
     "qgZ's default reduction (zpp_qgz_config_t.sum DEFAULT): float "
     "(decode, add, re-encode per hop) or int (agreed scales, integer "
     "sums, one decode), either case; read at communicator creation and "
     "the same on every rank",
     NULL, 0},
    {"ZPP_TOPO", "",
     "emulated topology: NxM (N nodes of M ranks) or a rank-to-node list "
     "such as 0,0,0,1,1; empty: discover",
     NULL, 0},
    {"ZPP_TIMEOUT_S", "300",
     "seconds a collective may wait before its communicator is aborted", NULL,
     0},
    {"ZPP_BACKEND", "",
     "transport when the config says ZPP_BACKEND_AUTO: mpi, nccl or ucx; "
     "empty: automatic",
     NULL, 0},
    {"ZPP_BOOTSTRAP_ADDR", "",
     "TCP bootstrap: IPv4 address or host name the root listens on "
     "(empty: MASTER_ADDR, else 127.0.0.1)",
     NULL, 0},
    {"ZPP_BOOTSTRAP_PORT", "0",
     "TCP bootstrap: port the root listens on (0: any free port for "
     "zpp_get_unique_id; from the environment MASTER_PORT + 1, under srun "
     "without MASTER_PORT 10001 + 2 * ((SLURM_JOB_ID * 61 + SLURM_STEP_ID) "
     "mod 11000))",
     NULL, 0},
    {"ZPP_EMU_INTER_GBIT", "0",
     "emulated inter-node bandwidth in Gbit/s per rank (0: not emulated)",
     NULL, 0},
    {"ZPP_EMU_INTER_LAT_US", "0",
     "emulated inter-node latency per transfer in microseconds", NULL, 0},
    {"ZPP_PIPE_MIN_CHUNK", "65536",
     "smallest pipeline chunk of qwZ and qgZ on host memory, in elements "
     "(rounded up to whole quantization blocks); 0 turns pipelining off",
     NULL, 0},
    {"ZPP_NET_SPIN_US", "100000",
     "host transports (MPI, UCX): microseconds a wait keeps polling (yielding the "
     "core) after the last completed transfer before it sleeps between polls",
     NULL, 0},
    {"ZPP_NET_RINGS", "1",
     "host transports (MPI): rings a ring all-gather runs at once, each rotated so "
     "its node boundaries fall on other ranks (like NCCL's channels)",
     NULL, 0},
    {"ZPP_ALGO", "auto",
     "host transports (MPI, UCX): all-gather and reduce-scatter over several "
     "nodes: auto (per call, the family a cost model of the links predicts "
     "faster), hier (rail-aligned, hierarchical: each inter-node link "
     "carries the minimum) or flat (ring all-gather, pairwise "
     "reduce-scatter); cfg->algorithm takes precedence; the same on every "
     "rank",
     NULL, 0},
    {"ZPP_TUNER_FILE", "",
     "ZPP_ALGO=auto: a text file of the cost model's constants and forced "
     "choices (docs/design.md, \"Choosing the algorithm\") instead of the "
     "probe; the same file on every rank",
     NULL, 0},
    {"ZPP_TUNER_PROBE", "auto",
     "ZPP_ALGO=auto without ZPP_TUNER_FILE: measure the links at creation "
     "(a few small all-gathers): auto (on real nodes, not on an emulated "
     "topology), 1 (also there) or 0 (never: defaults); the same on every "
     "rank",
     NULL, 0},
    {"ZPP_HIER_CHUNK", "",
     "host transports: chunk size, in bytes, of a hierarchical all-gather "
     "or reduce-scatter (its inter- and intra-node stages overlap chunk by "
     "chunk): min(8, ceil(largest block / this)) chunks, so larger chunks "
     "when 8 do not cover a block; 0: one; unset: 262144 under "
     "ZPP_ALGO=hier, the cost model's count under auto; the same on every "
     "rank",
     NULL, 0},
    {"ZPP_NET_SEGMENT", "",
     "MPI transport: largest message, in bytes, to a rank on another node "
     "(longer transfers are cut): 0 (whole transfers) or 4096..2^30; "
     "empty: 65408 (under Open MPI's TCP eager limit) on real inter-node "
     "links, 0 on an emulated topology; the same on every rank",
     NULL, 0},
    {"ZPP_SCRATCH_CACHE_MB", "512",
     "host scratch memory each communicator keeps between collectives "
     "(the plans' and the host reductions' alike), in MiB (reused instead "
     "of malloc/free per call; 0 keeps none)",
     NULL, 0},
    {"ZPP_SCRATCH_POOL_MB", "256",
     "device scratch memory (zpp's stream-ordered pool, one per device) "
     "kept reserved between collectives, in MiB; what is above it goes "
     "back to the device at the next synchronisation (0 keeps none)",
     NULL, 0},
    {"ZPP_NCCL_LIBRARY", "libnccl.so.2",
     "NCCL library the NCCL backend opens with dlopen: a file name the "
     "loader searches for, or a path (tests name the NCCL stand-in here)",
     NULL, 0},
    {"ZPP_CHECK", "0",
     "1: collectives verify that all ranks passed the same lengths and "
     "configs (one extra small all-gather per call)",
     NULL, 0},
};

#define NSETTINGS (sizeof settings / sizeof settings[0])

/* Accepted range of setting i, inclusive (+-DBL_MAX: any, or text). */
static double range_lo[NSETTINGS], range_hi[NSETTINGS];

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

static void settings_load(void) {
  size_t i, k;
  for (i = 0; i < NSETTINGS; i++) {
    const char *env = getenv(settings[i].name);
    settings[i].from_env = env != NULL;
    settings[i].value = env != NULL ? env : settings[i].def;
    range_lo[i] = -DBL_MAX;
    range_hi[i] = DBL_MAX;
    for (k = 0; k < sizeof ranges / sizeof ranges[0]; k++)
      if (strcmp(ranges[k].name, settings[i].name) == 0) {
        range_lo[i] = ranges[k].lo;
        range_hi[i] = ranges[k].hi;
      }
  }
}

void zpp_settings_reload(void) {
  pthread_once(&settings_once, settings_load);
  settings_load();
}

int zpp_setting_info(size_t i, const char **name, double *lo, double *hi) {
  pthread_once(&settings_once, settings_load);
  if (i >= NSETTINGS)
    return 0;
  *name = settings[i].name;
  *lo = range_lo[i];
  *hi = range_hi[i];
  return 1;
}

static zpp_setting_t *find(const char *name) {
  size_t i;
  pthread_once(&settings_once, settings_load);
  for (i = 0; i < NSETTINGS; i++)
    if (strcmp(settings[i].name, name) == 0)
      return &settings[i];
  return NULL;
}

const char *zpp_setting(const char *name) {
  zpp_setting_t *s = find(name);
  return s != NULL ? s->value : "";
}

long zpp_setting_long(const char *name, long def) {
  zpp_setting_t *s = find(name);
  const char *v = s != NULL ? s->value : "";
  char *end;
  long r;
  if (v[0] == '\0')
    return def;
  errno = 0;
  r = strtol(v, &end, 10);
  if (errno != 0 || *end != '\0') {
    ZPP_WARN(ZPP_SUBSYS_INIT, "%s=\"%s\" is not an integer; using %ld", name,
             v, def);
    return def;
  }
  if ((double)r < range_lo[s - settings] ||
      (double)r > range_hi[s - settings]) {
    ZPP_WARN(ZPP_SUBSYS_INIT, "%s=%ld: must be in [%.0f, %.0f]; using %ld",
             name, r, range_lo[s - settings], range_hi[s - settings], def);
    return def;
  }
  return r;
}

double zpp_setting_double(const char *name, double def) {
  zpp_setting_t *s = find(name);
  const char *v = s != NULL ? s->value : "";
  char *end;
  double r;
  if (v[0] == '\0')
    return def;
  errno = 0;
  r = strtod(v, &end);
  if (errno != 0 || *end != '\0') {
    ZPP_WARN(ZPP_SUBSYS_INIT, "%s=\"%s\" is not a number; using %g", name, v,
             def);
    return def;
  }
  if (!(r >= range_lo[s - settings] && r <= range_hi[s - settings])) {
    /* also NaN */
    ZPP_WARN(ZPP_SUBSYS_INIT, "%s=%g: must be in [%g, %g]; using %g", name, r,
             range_lo[s - settings], range_hi[s - settings], def);
    return def;
  }
  return r;
}

zpp_status_t zpp_settings_print(FILE *out) {
  size_t i;
  if (out == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "out is NULL");
  pthread_once(&settings_once, settings_load);
  for (i = 0; i < NSETTINGS; i++)
    fprintf(out, "%-22s = %-10s (%s; default \"%s\") %s\n", settings[i].name,
            settings[i].value[0] ? settings[i].value : "\"\"",
            settings[i].from_env ? "from environment" : "default",
            settings[i].def, settings[i].help);
  return ZPP_OK;
}

zpp_status_t zpp_settings_get(const char *name, const char **value) {
  zpp_setting_t *s;
  if (name == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "name is NULL");
  if (value == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "value is NULL");
  s = find(name);
  if (s == NULL)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "name \"%s\": not a zpp setting", name);
  *value = s->value;
  return ZPP_OK;
}
