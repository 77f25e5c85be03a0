/*
 * libFuzzer target: the settings table (src/core/settings.c) and every parser
 * of the environment: the ZPP_* values as numbers and text, the log settings
 * (ZPP_DEBUG, ZPP_DEBUG_SUBSYS, ZPP_DEBUG_FILE), ZPP_CPU_ISA, ZPP_TOPO,
 * torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_PORT,
 * TORCHELASTIC_RUN_ID) and srun's (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_JOB_ID,
 * SLURM_STEP_ID) as zpp_comm_create_from_env reads them, the Slurm
 * hostlist parser included.
 *
 * Input: records "<selector byte><value bytes>\n"; a selector below 0xF0
 * picks entry (selector % entries) of the settings table, 0xF0..0xF5
 * torchrun's variables in the order below (0xF5: the host name for
 * ZPP_DEBUG_FILE's %h), one from 0xF6 srun's variables in the order below
 * ((selector - 0xF6) % 7), so that the committed inputs keep their
 * meaning when the table grows; the value is set with setenv (up to a
 * NUL byte, which an environment cannot hold).
 * MASTER_ADDR is always 127.0.0.1: nothing here resolves names or listens.
 *
 * What must hold (otherwise abort()): a numeric setting lies in its
 * table's range or is the caller's default; zpp_settings_get returns the
 * environment's text; every parser returns, with a message on an error;
 * ZPP_DEBUG_FILE expands within its buffer; a hostlist's first host is a
 * non-empty host name (letters, digits, '-', '.', '_') within its buffer,
 * a malformed list's message names its variable; the Slurm port is even
 * and in [10000, 31998].
 */
#include "comm/bootstrap.h"
#include "comm/slurm.h"
#include "core/core.h"
#include "kernels/quant_cpu.h"
#include "topology/topo.h"

#include <ctype.h>
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const torchrun[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                       "MASTER_PORT", "TORCHELASTIC_RUN_ID"};
#define NTORCH (sizeof torchrun / sizeof torchrun[0])
static const char *const slurm[] = {"SLURM_PROCID",       "SLURM_NTASKS",
                                    "SLURM_LOCALID",      "SLURM_STEP_NODELIST",
                                    "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
                                    "SLURM_STEP_ID"};
#define NSLURM (sizeof slurm / sizeof slurm[0])
#define MAXNAMES 64
#define SEL_TORCH 0xF0 /* first selector of torchrun's variables */
#define SEL_SLURM 0xF6 /* first selector of srun's variables */

static const char *names[MAXNAMES];
static size_t nnames, nsettings;
static FILE *devnull;
/* Inputs run, and those where a number from the environment was taken
 * (run.sh requires some among the committed inputs: not a vacuous run). */
static unsigned long n_inputs, n_accepted;

static void summary(void) {
  fprintf(stderr, "fuzz_settings: %lu inputs, %lu accepted\n", n_inputs,
          n_accepted);
}

static void fail(const char *what) {
  fprintf(stderr, "fuzz_settings: %s (last error: %s)\n", what,
          zpp_get_last_error());
  abort();
}

static void setup(void) {
  const char *name;
  double lo, hi;
  size_t i;
  while (nsettings < MAXNAMES - NTORCH - NSLURM &&
         zpp_setting_info(nsettings, &name, &lo, &hi))
    names[nsettings++] = name;
  nnames = nsettings;
  for (i = 0; i < NTORCH; i++)
    names[nnames++] = torchrun[i];
  for (i = 0; i < NSLURM; i++)
    names[nnames++] = slurm[i];
  devnull = fopen("/dev/null", "w");
  atexit(summary);
  /* The log reads ZPP_DEBUG* once, at its first message: latch it now,
   * quiet and on stderr, so that no fuzzed ZPP_DEBUG_FILE is ever opened
   * (the log's parsers are called directly below). */
  for (i = 0; i < nnames; i++)
    unsetenv(names[i]);
  setenv("ZPP_DEBUG", "NONE", 1);
  zpp_settings_reload();
  (void)zpp_log_enabled(ZPP_LOG_WARN, ZPP_SUBSYS_INIT);
}

/* The library's default for a numeric setting is never outside its range;
 * a sentinel the range excludes shows whether the default was taken. */
static int check_numbers(void) {
  size_t i;
  int taken = 0;
  for (i = 0;; i++) {
    const char *name;
    double lo, hi, d;
    long l;
    if (!zpp_setting_info(i, &name, &lo, &hi))
      break;
    if (lo == -DBL_MAX) /* text setting */
      continue;
    l = zpp_setting_long(name, -7777777);
    if (l != -7777777 && ((double)l < lo || (double)l > hi))
      fail("zpp_setting_long returned a value outside the range");
    d = zpp_setting_double(name, -7777777.0);
    if (d != -7777777.0 && !(d >= lo && d <= hi))
      fail("zpp_setting_double returned a value outside the range");
    if (getenv(name) != NULL && l != -7777777)
      taken++;
  }
  return taken;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char host[ZPP_TOPO_HOST_LEN] = "fuzzhost", path[512];
  const char *v;
  size_t i = 0, k;
  int x, *node_of = NULL, n = 0;
  zpp_unique_id_t id;

  if (nnames == 0)
    setup();
  for (k = 0; k < nnames; k++)
    unsetenv(names[k]);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  while (i < size) {
    uint8_t sel = data[i++];
    const uint8_t *nl = memchr(data + i, '\n', size - i);
    size_t end = nl != NULL ? (size_t)(nl - data) : size, len = end - i;
    char value[1024];
    if (len >= sizeof value)
      len = sizeof value - 1;
    memcpy(value, data + i, len);
    value[len] = '\0'; /* a NUL inside ends the value, as in environ */
    if (sel < SEL_TORCH)
      setenv(names[sel % nsettings], value, 1);
    else if (sel >= SEL_SLURM)
      setenv(slurm[(sel - SEL_SLURM) % NSLURM], value, 1);
    else if (sel - SEL_TORCH == NTORCH)
      snprintf(host, sizeof host, "%s", value);
    else
      setenv(torchrun[sel - SEL_TORCH], value, 1);
    i = end + 1;
  }
  zpp_settings_reload();

  /* the table: text as set, numbers in range */
  for (k = 0; k < nsettings; k++) {
    const char *env = getenv(names[k]);
    if (zpp_settings_get(names[k], &v) != ZPP_OK)
      fail("zpp_settings_get failed on a name of the table");
    if (env != NULL && strcmp(env, v) != 0)
      fail("zpp_settings_get differs from the environment");
  }
  n_inputs++;
  if (check_numbers() > 0)
    n_accepted++;
  if (devnull != NULL && zpp_settings_print(devnull) != ZPP_OK)
    fail("zpp_settings_print failed");

  /* the log settings */
  (void)zpp_log_parse_level(zpp_setting("ZPP_DEBUG"));
  (void)zpp_log_subsys_match(zpp_setting("ZPP_DEBUG_SUBSYS"), "NET");
  if (zpp_log_expand_path(zpp_setting("ZPP_DEBUG_FILE"), host, 4194304, path,
                          sizeof path) >= sizeof path ||
      strlen(path) >= sizeof path)
    fail("ZPP_DEBUG_FILE expanded past its buffer");

  /* ZPP_CPU_ISA and ZPP_TOPO */
  (void)zpp_quant_cpu_ops_named(zpp_setting("ZPP_CPU_ISA"));
  if (zpp_topo_parse(zpp_setting("ZPP_TOPO"), 0, &node_of, &n) == ZPP_OK) {
    if (n < 1 || n > 1 << 16) /* ZPP_TOPO_MAX_RANKS of src/topology/topo.c */
      fail("zpp_topo_parse accepted a rank count out of range");
    free(node_of);
  } else if (zpp_get_last_error()[0] == '\0') {
    fail("zpp_topo_parse failed without a message");
  }

  /* torchrun's and srun's variables, as zpp_comm_create_from_env reads
   * them */
  for (k = 0; k < 3; k++) {
    if (zpp_env_int(torchrun[k], &x) == ZPP_OK && (x < 0 || x > 1 << 24))
      fail("zpp_env_int accepted a value out of range");
    if (zpp_env_int(slurm[k], &x) == ZPP_OK && (x < 0 || x > 1 << 24))
      fail("zpp_env_int accepted a SLURM_* value out of range");
  }
  for (k = 3; k < 5; k++) {
    char first[64];
    size_t j, len;
    if ((v = getenv(slurm[k])) == NULL)
      continue;
    if (zpp_slurm_first_host(slurm[k], v, first, sizeof first, "fuzz") ==
        ZPP_OK) {
      len = strlen(first);
      if (len == 0 || len >= sizeof first)
        fail("zpp_slurm_first_host accepted an empty or overlong host");
      for (j = 0; j < len; j++)
        if (!(isalnum((unsigned char)first[j]) || first[j] == '-' ||
              first[j] == '.' || first[j] == '_'))
          fail("zpp_slurm_first_host returned a character of no host name");
    } else if (strstr(zpp_get_last_error(), slurm[k]) == NULL ||
               first[0] != '\0') {
      fail("zpp_slurm_first_host failed without naming the variable, or "
           "left a partial host");
    }
  }
  {
    long port = 0;
    if (zpp_slurm_port("fuzz", &port) == ZPP_OK &&
        (port < 10000 || port > 31998 || port % 2 != 0))
      fail("zpp_slurm_port out of its documented range");
  }
  if (zpp_tcp_id_env("fuzz_settings", 1, &id) != ZPP_OK &&
      zpp_get_last_error()[0] == '\0')
    fail("zpp_tcp_id_env failed without a message");
  return 0;
}
