// The transform kernels (transform_cuda.cu) for test_elementwise_cuda_arch,
// compiled with __CUDA_ARCH__ defined (see test_elementwise_cuda_arch.cc).
#include <cuda_runtime.h>

#include <cmath>

#define __CUDA_ARCH__ 900
#include "kernels/transform_cuda.cu"
#undef __CUDA_ARCH__
