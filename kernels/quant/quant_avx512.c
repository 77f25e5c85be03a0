/* Placeholder until the avx512 path lands: not built, so the table is NULL. */
#include "quant_cpu.h"

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_avx512(void) { return NULL; }
