/*
 * The declared internal API of the codec kernels for zpp's own tools and
 * benchmarks (tools/, perf/): the scalar math shared by the CPU and CUDA
 * kernels (quant_math.h), the CPU kernel table (quant_cpu.h) and the
 * element-wise kernels (elementwise.h).  Not installed: programs outside
 * this tree use <zpp/zpp.h>.  Link zpp_static (the symbols are hidden in
 * libzpp.so).
 */
#ifndef ZPP_INTERNAL_KERNELS_H
#define ZPP_INTERNAL_KERNELS_H

#include "../../kernels/quant_math.h"
#include "../../kernels/quant_cpu.h"
#include "../../kernels/elementwise.h"

#endif /* ZPP_INTERNAL_KERNELS_H */
