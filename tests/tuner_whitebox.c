/* test_tuner's view into an op and a communicator (C: the library's
 * internal headers use C11 atomics): the hierarchical chunks an op ran,
 * the agreed cost model of a communicator. */
#include "algo/algo_impl.h"
#include "algo/tune.h"
#include "comm/comm.h"
#include "transport/transport_impl.h"

int zpp_test_op_hier_chunks(const zpp_xop_t *op) { return op->hc; }

/* The agreed model. */
void zpp_test_comm_model(const struct zpp_comm *c, zpp_link_model_t *m) {
  *m = c->tr->model;
}

/* zpp_tune_probe on c's transport, from c's agreed model. */
int zpp_test_comm_probe(const struct zpp_comm *c, zpp_link_model_t *m,
                        int able) {
  *m = c->tr->model;
  return (int)zpp_tune_probe(c->tr, m, able);
}
