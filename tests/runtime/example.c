/* A minimal ZeRO-3 step with zpp parameter groups (host memory, MPI). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <zpp/zpp_mpi.h>
#include <zpp/zpp_runtime.h>

#define CHECK(call)                                                  \
  do {                                                               \
    zpp_status_t st_ = (call);                                       \
    if (st_ != ZPP_OK) {                                             \
      fprintf(stderr, "%s: %s\n", #call, zpp_get_last_error());      \
      MPI_Abort(MPI_COMM_WORLD, 1);                                  \
    }                                                                \
  } while (0)

int main(int argc, char **argv) {
  int provided, rank;
  /* THREAD_MULTIPLE lets fetches progress in the background. */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  zpp_comm_t comm;
  CHECK(zpp_comm_create_mpi(MPI_COMM_WORLD, NULL, &comm));

  /* One layer: a 64x32 weight and a bias, bf16, ZeRO++ compression on. */
  size_t sizes[2] = {64 * 32, 64};
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.qwz_bits = 8;       /* forward gather in INT8 */
  cfg.hpz = 1;            /* backward gather inside the node */
  cfg.qgz_bits = 4;       /* gradients in INT4 across nodes */
  cfg.error_feedback = 1;
  zpp_pgroup_t pg;
  CHECK(zpp_pgroup_create(comm, &cfg, sizes, 2, &pg));
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  CHECK(zpp_pgroup_get_info(pg, &info));

  /* The optimizer owns fp32 master weights of my shard only. */
  float *master = calloc(info.shard_numel, sizeof(float));
  uint16_t *shard, *grad = calloc(info.padded_numel, 2);
  uint16_t *gshard = calloc(info.shard_numel, 2);
  CHECK(zpp_pgroup_shard(pg, (void **)&shard));
  for (size_t i = 0; i < info.shard_numel; i++) {
    size_t g = info.shard_offset + i; /* element index in the flat buffer */
    master[i] = g < info.numel ? 0.01f * (float)(g % 17) : 0.0f;
    shard[i] = 0; /* bf16 working copy: written below */
  }
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < info.shard_numel; i++) { /* fp32 -> bf16 */
      union { float f; uint32_t u; } v = {master[i]};
      shard[i] = (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
    }
    CHECK(zpp_pgroup_params_changed(pg));
    void *full;
    CHECK(zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, NULL)); /* prefetch... */
    CHECK(zpp_pgroup_wait(pg, &full));                    /* ...then use */
    /* forward compute with `full` (padded_numel bf16 values) here */
    CHECK(zpp_pgroup_release(pg));
    CHECK(zpp_pgroup_fetch(pg, ZPP_FETCH_BACKWARD, NULL));
    CHECK(zpp_pgroup_wait(pg, &full));
    for (size_t i = 0; i < info.padded_numel; i++) /* fake gradient: w */
      grad[i] = i < info.numel ? ((uint16_t *)full)[i] : 0;
    CHECK(zpp_pgroup_release(pg));
    CHECK(zpp_pgroup_reduce_gradients(pg, grad, gshard, ZPP_OP_MEAN, NULL,
                                      NULL));
    for (size_t i = 0; i < info.shard_numel; i++) { /* SGD on my shard */
      union { uint32_t u; float f; } g = {(uint32_t)gshard[i] << 16};
      master[i] -= 0.1f * g.f;
    }
  }
  if (rank == 0)
    printf("%zu parameters, %zu per rank, hpZ holds %zu bytes\n", info.numel,
           info.shard_numel, info.hpz_bytes);
  CHECK(zpp_pgroup_destroy(pg));
  free(master);
  free(grad);
  free(gshard);
  CHECK(zpp_comm_destroy(comm));
  MPI_Finalize();
  return 0;
}
