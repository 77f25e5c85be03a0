/* zpp_comm_shrink on a communicator of zpp_comm_create_mpi (MPI backend),
 * under mpirun --enable-recovery (tests/shrink.cmake): rank 2 SIGKILLs
 * itself after a first all-gather; the survivors' next all-gather fails,
 * they shrink without any MPI call (the agreement runs over zpp's own
 * sockets) and check an all-gather on the new communicator (UCX over a
 * TCP star) exactly.  Each survivor prints its result; the test fails on
 * "exact 0" or a failed shrink. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(int argc, char **argv) {
  int prov;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 3;
  zpp_comm_t c, nc = NULL;
  int r, n;
  if (zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c)) {
    printf("create %s\n", zpp_get_last_error());
    return 1;
  }
  zpp_comm_rank(c, &r);
  zpp_comm_size(c, &n);
  float x[64], y[64 * 8];
  for (int i = 0; i < 64; i++)
    x[i] = r * 100 + i;
  zpp_allgather(c, x, y, 64, ZPP_FLOAT32, NULL, NULL);
  if (r == 2)
    raise(SIGKILL);
  double t0 = now();
  int st = zpp_allgather(c, x, y, 64, ZPP_FLOAT32, NULL, NULL);
  int m[8];
  int s = zpp_comm_shrink(c, NULL, m, &nc);
  printf("rank %d: coll %d, shrink %d after %.2f s: %s\n", r, st, s, now() - t0,
         s ? zpp_get_last_error() : "");
  if (!s) {
    zpp_backend_t b;
    zpp_comm_backend(nc, &b);
    int nn;
    zpp_comm_size(nc, &nn);
    int nr;
    zpp_comm_rank(nc, &nr);
    int e = zpp_allgather(nc, x, y, 64, ZPP_FLOAT32, NULL, NULL);
    int ok = 1;
    for (int q = 0, k = 0; q < n; q++)
      if (m[q] >= 0) {
        for (int i = 0; i < 64; i++)
          ok &= y[k * 64 + i] == q * 100 + i;
        k++;
      }
    printf(
        "rank %d -> %d of %d backend %s bootstrap %s allgather %d exact %d\n",
        r, nr, nn, zpp_backend_name(b), zpp_comm_bootstrap_name(nc), e, ok);
    zpp_comm_destroy(nc);
  }
  zpp_comm_destroy(c);
  printf("rank %d destroyed\n", r);
  fflush(stdout);
  _exit(0);
}
