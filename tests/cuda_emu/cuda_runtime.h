// A CPU stand-in for the few parts of the CUDA runtime and device language
// that kernels/quant/quant_cuda.cu uses, so that its kernels and launchers
// can be compiled as C++ and run on a machine without a GPU
// (test_quant_cuda_emu).  It checks the index arithmetic, the chunk
// packing, the reductions and the choice of paths; it does not check the
// device's floating point (that is quant_math.h's business and is checked
// on a GPU by test_quant_cuda).
//
// Model: every CUDA thread of a CTA is a fiber (ucontext) on one OS thread;
// CTAs run one after another, so a function-scope `static` is exactly
// __shared__ memory.  A warp shuffle is two barriers of the 32 lanes of the
// warp and __syncthreads is a barrier of the whole CTA; both require every
// thread to arrive, as the real ones do (a full mask, no exited lanes).  A
// round in which no fiber reaches a barrier or finishes is a deadlock: the
// launch fails with cudaErrorLaunchFailure and emu_error() says where.
#ifndef ZPP_TESTS_CUDA_EMU_CUDA_RUNTIME_H
#define ZPP_TESTS_CUDA_EMU_CUDA_RUNTIME_H

#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

typedef struct zq_emu_stream *cudaStream_t;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorLaunchFailure = 719
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  void *attrs;
  unsigned numAttrs;
};

namespace zq_emu {

constexpr size_t kStack = 64 * 1024;

struct Fiber {
  ucontext_t ctx;
  bool done;
};

struct State {
  dim3 grid, block, bidx, tidx;
  std::vector<Fiber> fibers;
  std::vector<char> stacks;
  ucontext_t sched;
  unsigned cur = 0;
  void (*body)(void *) = nullptr;
  void *body_arg = nullptr;
  unsigned cta_count = 0, cta_gen = 0;
  std::vector<unsigned> warp_count, warp_gen;
  std::vector<uint64_t> warp_slot;
  unsigned long progress = 0;
  std::string error;       // last failure (deadlock, bad mask)
  unsigned long launches = 0;
  unsigned long max_threads = 0;  // largest CTA seen
  std::vector<const void *> kernels;  // every kernel launched, in order
};

inline State &st() {
  static State s;
  return s;
}

inline void yield() {
  State &s = st();
  swapcontext(&s.fibers[s.cur].ctx, &s.sched);
}

inline void barrier(unsigned &count, unsigned &gen, unsigned expected) {
  unsigned g = gen;
  st().progress++;
  if (++count == expected) {
    count = 0;
    gen++;
    return;
  }
  while (gen == g) yield();
}

inline void fail(const std::string &what) {
  if (st().error.empty()) st().error = what;
}

inline void trampoline() {
  State &s = st();
  s.body(s.body_arg);
  s.fibers[s.cur].done = true;
  s.progress++;
  // returning resumes uc_link (the scheduler)
}

// Runs one CTA to completion; false on deadlock.
inline bool run_cta() {
  State &s = st();
  unsigned n = s.block.x;
  if (s.fibers.size() < n) {
    s.fibers.resize(n);
    s.stacks.resize(n * kStack);
  }
  size_t warps = (n + 31) / 32;
  s.warp_count.assign(warps, 0);
  s.warp_gen.assign(warps, 0);
  s.warp_slot.assign(warps * 32, 0);
  s.cta_count = 0;
  s.cta_gen = 0;
  for (unsigned i = 0; i < n; i++) {
    Fiber &f = s.fibers[i];
    f.done = false;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = &s.stacks[i * kStack];
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &s.sched;
    makecontext(&f.ctx, trampoline, 0);
  }
  // Warps run in a shuffled priority order, and the first warp that can
  // move runs as far as it can before the next one gets a turn: a warp
  // races ahead of the others after every __syncthreads, which exposes
  // shared memory reused without a barrier.
  std::vector<unsigned> order(warps);
  for (unsigned w = 0; w < warps; w++) order[w] = w;
  uint64_t h = 0x9e3779b97f4a7c15ull * (s.launches * 1000003ull + s.bidx.x + 1);
  for (size_t w = warps; w > 1; w--) {
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    std::swap(order[w - 1], order[(h >> 17) % w]);
  }
  for (;;) {
    bool moved = false;
    for (unsigned w : order) {
      for (;;) {  // this warp, until it is stuck or done
        unsigned long before = s.progress;
        bool live = false;
        for (unsigned i = w * 32; i < n && i < w * 32 + 32; i++) {
          if (s.fibers[i].done) continue;
          s.cur = i;
          s.tidx.x = i;
          swapcontext(&s.sched, &s.fibers[i].ctx);
          live = live || !s.fibers[i].done;
        }
        if (s.progress != before) moved = true;
        if (!live || s.progress == before) break;
      }
      if (moved) break;  // back to the warp of highest priority
    }
    bool all_done = true;
    for (unsigned i = 0; i < n; i++) all_done = all_done && s.fibers[i].done;
    if (all_done) return true;
    if (!moved) {
      fail("deadlock: threads wait at a shuffle or __syncthreads that not "
           "every thread reaches (block " + std::to_string(s.bidx.x) + ")");
      return false;
    }
  }
}

template <typename F>
void call_body(void *f) {
  (*static_cast<F *>(f))();
}

}  // namespace zq_emu

// The built-in variables, as references into the emulator state (the
// scheduler sets tidx.x before it resumes a thread).
inline const dim3 &threadIdx = zq_emu::st().tidx;
inline const dim3 &blockIdx = zq_emu::st().bidx;
inline const dim3 &blockDim = zq_emu::st().block;
inline const dim3 &gridDim = zq_emu::st().grid;

inline void __syncthreads() {
  zq_emu::State &s = zq_emu::st();
  zq_emu::barrier(s.cta_count, s.cta_gen, s.block.x);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  zq_emu::State &s = zq_emu::st();
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  if (mask != 0xffffffffu) zq_emu::fail("__shfl_xor_sync: mask is not full");
  unsigned lane = s.cur % 32, warp = s.cur / 32;
  unsigned lanes = s.block.x - warp * 32 < 32 ? s.block.x - warp * 32 : 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  s.warp_slot[warp * 32 + lane] = bits;
  zq_emu::barrier(s.warp_count[warp], s.warp_gen[warp], lanes);
  unsigned src = lane ^ (unsigned)lane_mask;
  if ((src / (unsigned)width) != (lane / (unsigned)width) || src >= lanes) src = lane;
  T r;
  std::memcpy(&r, &s.warp_slot[warp * 32 + src], sizeof r);
  zq_emu::barrier(s.warp_count[warp], s.warp_gen[warp], lanes);
  return r;
}

// Store with an explicit cache operator: a plain store here.
template <typename T>
inline void __stwb(T *p, T v) {
  *p = v;
}

inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned atomicMin(unsigned *p, unsigned v) {
  unsigned old = *p;
  if (v < old) *p = v;
  return old;
}

// ---- runtime API ------------------------------------------------------------

inline cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error"
         : e == cudaErrorLaunchFailure ? "unspecified launch failure (emulator)"
                                       : "invalid argument";
}
inline const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess"
         : e == cudaErrorLaunchFailure ? "cudaErrorLaunchFailure"
                                       : "cudaErrorInvalidValue";
}
// Every pointer is "device memory" to the emulator.
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a,
                                            const void *p) {
  a->type = cudaMemoryTypeDevice;
  a->device = 0;
  a->devicePointer = const_cast<void *>(p);
  a->hostPointer = nullptr;
  return cudaSuccess;
}

// Runs the grid synchronously, CTA after CTA.
template <typename... Exp, typename... Act>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *cfg,
                               void (*kernel)(Exp...), Act &&...args) {
  zq_emu::State &s = zq_emu::st();
  if (cfg->gridDim.x == 0 || cfg->blockDim.x == 0 || cfg->blockDim.x > 1024 ||
      cfg->gridDim.y != 1 || cfg->blockDim.y != 1)
    return cudaErrorInvalidValue;
  s.launches++;
  s.kernels.push_back(reinterpret_cast<const void *>(kernel));
  if (cfg->blockDim.x > s.max_threads) s.max_threads = cfg->blockDim.x;
  s.grid = cfg->gridDim;
  s.block = cfg->blockDim;
  auto body = [&]() { kernel(args...); };
  s.body = &zq_emu::call_body<decltype(body)>;
  s.body_arg = &body;
  for (unsigned b = 0; b < cfg->gridDim.x; b++) {
    s.bidx = dim3(b, 0, 0);
    if (!zq_emu::run_cta()) return cudaErrorLaunchFailure;
  }
  return s.error.empty() ? cudaSuccess : cudaErrorLaunchFailure;
}

#endif  // ZPP_TESTS_CUDA_EMU_CUDA_RUNTIME_H
