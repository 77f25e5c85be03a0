/* test_tuner's view into an op (C: the library's internal headers use C11
 * atomics): the hierarchical chunks it ran. */
#include "algo/algo_impl.h"

int zpp_test_op_hier_chunks(const zpp_xop_t *op) { return op->hc; }

#include "comm/comm.h"
#include "transport/transport_impl.h"

/* The agreed model's ranks per core. */
double zpp_test_comm_ranks_per_core(const struct zpp_comm *c) {
  return c->tr->model.cpu;
}
