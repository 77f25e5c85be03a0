/* Placeholder until the avx2 path lands: not built, so the table is NULL. */
#include "quant_cpu.h"

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx2(void) { return NULL; }
