// Launch helpers of the element-wise and transform kernels
// (elementwise_cuda.cu, transform_cuda.cu): CUDA C++, for .cu files only.
// Kernels are launched with cudaLaunchKernelEx rather than <<<>>> so that
// the files also compile as C++ against the CPU emulator (tests/cuda_emu).
#ifndef ZPP_SRC_KERNELS_LAUNCH_CUH
#define ZPP_SRC_KERNELS_LAUNCH_CUH

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdio.h>

namespace zpp_kl {

constexpr int kThreads = 256;

// CTAs of kThreads for count elements, capped: the kernels grid-stride.
inline int grid_for(size_t count) {
  size_t blocks = (count + kThreads - 1) / kThreads;
  return (int)(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// 0 for cudaSuccess; else 1 with "what: <CUDA's message>" in err.
inline int report(cudaError_t e, const char *what, char *err, size_t errlen) {
  if (e == cudaSuccess) return 0;
  snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return 1;
}

// kernel<<<ctas, threads, 0, stream>>>(args...).  Returns the launch's own
// error, never the thread's last error: that may hold an earlier call's (a
// cudaEventQuery's cudaErrorNotReady), which is no failure of this launch.
template <typename... Exp, typename... Act>
cudaError_t launch(void (*kernel)(Exp...), unsigned ctas, unsigned threads,
                   cudaStream_t stream, Act &&...args) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(ctas, 1, 1);
  lc.blockDim = dim3(threads, 1, 1);
  lc.dynamicSmemBytes = 0;
  lc.stream = stream;
  cudaError_t e = cudaLaunchKernelEx(&lc, kernel, static_cast<Act &&>(args)...);
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* reported by the caller; leave none behind */
  return e;
}

// launch over count elements: grid_for(count) CTAs of kThreads.
template <typename... Exp, typename... Act>
cudaError_t launch_over(void (*kernel)(Exp...), size_t count, void *stream,
                        Act &&...args) {
  return launch(kernel, (unsigned)grid_for(count), (unsigned)kThreads,
                (cudaStream_t)stream, static_cast<Act &&>(args)...);
}

}  // namespace zpp_kl

#endif  // ZPP_SRC_KERNELS_LAUNCH_CUH
