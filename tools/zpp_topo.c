/*
 * zpp-topo: the node map zpp sees -- nodes, ranks, local ranks and, where
 * a GPU is present, the GPU link matrix of each node in the style of
 * `nvidia-smi topo -m`.  Every report says whether the topology and the
 * inter-node links are emulated (ZPP_TOPO, ZPP_EMU_INTER_*).
 *
 *   mpirun -np 8 zpp-topo [--json]        the live map of an MPI job
 *   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. zpp-topo
 *                                          the same, started like torchrun
 *                                          does (zpp's TCP bootstrap)
 *   zpp-topo --offline --topo 2x4 [--json] a spec's map, without MPI
 *
 * --bootstrap mpi|env picks the bootstrap (default: env when RANK and
 * WORLD_SIZE are set and no MPI launcher is seen, else mpi); --backend
 * picks the transport.  The report's first line names both.
 *   zpp-topo --print-settings              every ZPP_* setting
 *
 * Exit status: 0 on success; 2 for a bad flag; 1 when the library returns
 * an error (the message says which).
 */
#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zpp_internal/topo.h"

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define ZPP_TOPO_TOOL_MPI 1
#include <mpi.h>
#include <zpp/zpp_mpi.h>
#endif
#endif
#ifndef ZPP_TOPO_TOOL_MPI
#define ZPP_TOPO_TOOL_MPI 0
#endif

#define PROG "zpp-topo"

static void usage(FILE *out) {
  fprintf(out,
          "usage: " PROG " [--json] [--topo SPEC] [--device] [--offline] "
          "[--print-settings]\n"
          "  --json            one JSON object: \"emulated\", \"world_size\", "
          "\"nodes\": [{\"ranks\": [...]}], ...\n"
          "  --topo SPEC       emulated layout (NxM or a rank-to-node list "
          "such as 0,0,0,1,1); overrides ZPP_TOPO\n"
          "  --device          describe GPUs even when the default would not "
          "(needs CUDA)\n"
          "  --host            never touch GPUs\n"
          "  --offline         no MPI: print the map of SPEC (or ZPP_TOPO) "
          "alone\n"
          "  --bootstrap B     mpi (under mpirun) or env (torchrun's RANK, "
          "WORLD_SIZE, MASTER_ADDR, MASTER_PORT)\n"
          "  --backend B       auto, mpi, ucx or nccl\n"
          "  --print-settings  every ZPP_* setting with its value and help\n"
          "Run under mpirun, or with torchrun's environment, for the live map "
          "of a job.\n");
}

static int offline(const char *spec, int json) {
  int *node_of = NULL, n = 0;
  zpp_topo_t *t = NULL;
  if (spec == NULL || spec[0] == '\0') {
    fprintf(stderr, PROG ": --offline needs --topo SPEC or ZPP_TOPO\n");
    return 2;
  }
  if (zpp_topo_parse(spec, -1, &node_of, &n) != ZPP_OK ||
      zpp_topo_from_nodes(n, node_of, spec, "--offline", &t) != ZPP_OK) {
    fprintf(stderr, PROG ": %s\n", zpp_get_last_error());
    free(node_of);
    return 1;
  }
  free(node_of);
  zpp_topo_print(t, stdout, json,
                 "offline: the map of the spec alone (no MPI job)\n",
                 "\"offline\": true");
  zpp_topo_free(t);
  return 0;
}

static int parse_backend(const char *s, zpp_backend_t *b) {
  if (strcmp(s, "auto") == 0) *b = ZPP_BACKEND_AUTO;
  else if (strcmp(s, "mpi") == 0) *b = ZPP_BACKEND_MPI;
  else if (strcmp(s, "ucx") == 0) *b = ZPP_BACKEND_UCX;
  else if (strcmp(s, "nccl") == 0) *b = ZPP_BACKEND_NCCL;
  else return 0;
  return 1;
}

/* The bootstrap to use when none is named: torchrun's environment without
 * an MPI launcher's, else MPI. */
static int env_launch(void) {
  return getenv("RANK") != NULL && getenv("WORLD_SIZE") != NULL &&
         getenv("OMPI_COMM_WORLD_SIZE") == NULL && getenv("PMI_SIZE") == NULL &&
         getenv("PMIX_RANK") == NULL;
}

/* Prints the map of a live communicator (rank 0). */
static int report(zpp_comm_t comm, int json) {
  int rank = 0, rc = 0;
  zpp_comm_rank(comm, &rank);
  if (rank == 0 && zpp_comm_print_topology(comm, stdout, json) != ZPP_OK) {
    fprintf(stderr, PROG ": %s\n", zpp_comm_get_last_error(comm));
    rc = 1;
  }
  fflush(stdout);
  zpp_comm_destroy(comm);
  return rc;
}

int main(int argc, char **argv) {
  int json = 0, off = 0, device = -1, i, rc = 0, use_env = -1;
  const char *spec = NULL;
  zpp_backend_t backend = ZPP_BACKEND_AUTO;
  int backend_given = 0;
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "--topo") == 0 && i + 1 < argc) {
      spec = argv[++i];
    } else if (strcmp(argv[i], "--device") == 0) {
      device = 1;
    } else if (strcmp(argv[i], "--host") == 0) {
      device = 0;
    } else if (strcmp(argv[i], "--offline") == 0) {
      off = 1;
    } else if (strcmp(argv[i], "--bootstrap") == 0 && i + 1 < argc &&
               (strcmp(argv[i + 1], "mpi") == 0 ||
                strcmp(argv[i + 1], "env") == 0)) {
      use_env = strcmp(argv[++i], "env") == 0;
    } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc &&
               parse_backend(argv[i + 1], &backend)) {
      i++;
      backend_given = 1;
    } else if (strcmp(argv[i], "--print-settings") == 0) {
      return zpp_settings_print(stdout) == ZPP_OK ? 0 : 1;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, PROG ": unknown or incomplete flag \"%s\"\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (spec == NULL) {
    const char *env = NULL;
    if (zpp_settings_get("ZPP_TOPO", &env) == ZPP_OK && env[0] != '\0')
      spec = env;
  }
  if (off)
    return offline(spec, json);
  if (use_env < 0)
    use_env = !ZPP_TOPO_TOOL_MPI || env_launch();
  {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    zpp_comm_t comm = NULL;
    cfg.topology = spec;
    if (device < 0)
      device = zpp_cuda_available();
    cfg.memory = device ? ZPP_MEMORY_DEVICE : ZPP_MEMORY_HOST;
    /* The map needs no NCCL communicator: unless asked, MPI under mpirun,
     * UCX (the only transport without MPI) otherwise. */
    cfg.backend = backend_given ? backend
                  : use_env     ? ZPP_BACKEND_AUTO
                                : ZPP_BACKEND_MPI;
    if (use_env) {
      if (zpp_comm_create_from_env(&cfg, &comm) != ZPP_OK) {
        fprintf(stderr, PROG ": %s\n", zpp_get_last_error());
        return 1;
      }
      return report(comm, json);
    }
#if ZPP_TOPO_TOOL_MPI
    {
      int provided, rank = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &comm) != ZPP_OK) {
        if (rank == 0)
          fprintf(stderr, PROG ": %s\n", zpp_get_last_error());
        rc = 1;
      } else {
        rc = report(comm, json);
      }
      MPI_Finalize();
      return rc;
    }
#else
    (void)rc;
    fprintf(stderr, PROG ": built without MPI: use --bootstrap env (torchrun's "
            "environment), --offline or --print-settings\n");
    return 1;
#endif
  }
}
