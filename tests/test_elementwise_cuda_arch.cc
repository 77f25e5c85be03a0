// test_elementwise_cuda_arch: test_elementwise_cuda's cases on the kernels
// of elementwise_cuda.cu compiled here as C++ against the CPU emulator
// (tests/cuda_emu) with __CUDA_ARCH__ defined, so that the device branches
// of quant_math.h are the code under test, as in nvcc's device pass, and
// with UBSan's alignment check (tests/elementwise_cuda.cmake).  The
// emulator faults on a misaligned load or store intrinsic; UBSan stands in
// for the GPU's misaligned-address fault on plain loads and stores, which
// the emulator cannot see: a kernel that reads a bf16 buffer at an odd
// address through a plain 16-bit load aborts here.  The transform kernels
// are compiled the same way in test_elementwise_cuda_arch_tf.cc.
#include <cuda_runtime.h>

#include <cmath>

#define __CUDA_ARCH__ 900
#include "kernels/elementwise_cuda.cu"
#undef __CUDA_ARCH__

// The library's settings table (src/core/settings.c) is not linked into
// this test: the scratch pool's threshold takes its default.
extern "C" long zpp_setting_long(const char *name, long def) {
  (void)name;
  return def;
}

namespace {
bool device_available() {
  int n = 0;
  bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}
} // namespace

#define ZPP_TEST_DEVICE_AVAILABLE() device_available()
// every case once more on the CPU: the long length shortened (it still
// spans several CTAs)
#define ZPP_TEST_ELEMENTWISE_LONG 20011
#include "test_elementwise_cuda.cc"
