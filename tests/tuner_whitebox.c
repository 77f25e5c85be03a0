/* test_tuner's view into an op (C: the library's internal headers use C11
 * atomics): the hierarchical chunks it ran. */
#include "algo/algo_impl.h"

int zpp_test_op_hier_chunks(const zpp_xop_t *op) { return op->hc; }
