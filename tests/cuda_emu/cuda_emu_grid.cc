// The CTA scheduler of the CUDA emulator: runs a grid on the calling
// thread.  Every CUDA thread of a CTA is a fiber; CTAs run one after
// another, so a function-scope `static` is exactly __shared__ memory.  A
// warp shuffle is two barriers of the lanes of the warp and __syncthreads
// a barrier of the whole CTA; both need every thread to arrive, as the real
// ones do (a full mask, no exited lanes).  A round in which no fiber
// reaches a barrier or finishes is a deadlock: the launch fails.  A
// misaligned access of a load or store intrinsic (zpp_emu_misaligned)
// stops the CTA at once: the faulting fiber is never resumed.
//
// Fibers switch with a few instructions on x86-64 (callee-saved registers
// and the stack pointer; no signal mask, unlike swapcontext, which makes a
// system call per switch) and with ucontext elsewhere.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emu_internal.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

extern "C" {
__attribute__((visibility("default"))) struct zpp_emu_builtins zpp_emu_builtin = {dim3(0, 0, 0), dim3(0, 0, 0), dim3(1, 1, 1),
                                           dim3(1, 1, 1)};
}

namespace zpp_emu {
namespace {

constexpr size_t kStack = 64 * 1024;  // bytes per fiber, plus a guard page
constexpr unsigned kMaxThreads = 1024;

#if defined(__x86_64__)
// zpp_emu_ctx_switch(&save, next): pushes the callee-saved registers and
// the SSE/x87 control words, saves the stack pointer in *save, loads next
// and pops what that stack saved.
extern "C" void zpp_emu_ctx_switch(void **save, void *next);
asm(R"(
  .text
  .globl zpp_emu_ctx_switch
  .hidden zpp_emu_ctx_switch
  .type zpp_emu_ctx_switch,@function
zpp_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size zpp_emu_ctx_switch,.-zpp_emu_ctx_switch
)");

struct Ctx {
  void *sp = nullptr;
};
#else
struct Ctx {
  ucontext_t uc;
};
#endif

struct Fiber {
  Ctx ctx;
  bool done = false;
  char *stack = nullptr;  // lowest usable byte
};

struct Sched {
  std::vector<Fiber> fibers;
  Ctx sched;
  unsigned cur = 0, n = 0;
  void (*run)(void *) = nullptr;
  void *closure = nullptr;
  unsigned cta_count = 0, cta_gen = 0;
  std::vector<unsigned> warp_count, warp_gen;
  std::vector<uint64_t> warp_slot;
  unsigned long progress = 0, launches = 0;
  std::string error;
  // A thread made a misaligned access: the CTA stops at once (the
  // faulting fiber is never resumed) and the launch fails with
  // cudaErrorMisalignedAddress.
  bool misaligned = false;
};

// This thread is running a grid (its CUDA threads are fibers of it): a
// misaligned access on any other thread is host code, even while a grid
// runs elsewhere.
thread_local bool t_in_grid = false;

Sched &S() {
  static Sched *s = new Sched;  // never destroyed: a worker may outlive exit
  return *s;
}

void switch_to(Ctx &from, Ctx &to) {
#if defined(__x86_64__)
  zpp_emu_ctx_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

[[noreturn]] void fiber_main() {
  for (;;) {
    Sched &s = S();
    s.run(s.closure);
    s.fibers[s.cur].done = true;
    s.progress++;
    switch_to(s.fibers[s.cur].ctx, s.sched);  // never resumed again
  }
}

#if !defined(__x86_64__)
void fiber_entry() { fiber_main(); }
#endif

void make_fiber(Fiber &f) {
  f.done = false;
#if defined(__x86_64__)
  // Top of the stack, 16-byte aligned: the return address of the switch
  // (fiber_main) sits at a 16-byte boundary, so that fiber_main starts
  // with the stack alignment of a called function.
  uintptr_t top = ((uintptr_t)(f.stack + kStack) & ~(uintptr_t)15) - 16;
  void **sp = (void **)top;
  *sp = (void *)&fiber_main;
  uint32_t ctl[2];
  __asm__ volatile("stmxcsr %0" : "=m"(ctl[0]));
  __asm__ volatile("fnstcw %0" : "=m"(ctl[1]));
  sp -= 6;  // rbp rbx r12 r13 r14 r15
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  sp -= 1;
  std::memcpy(sp, ctl, 8);
  f.ctx.sp = sp;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = f.stack;
  f.ctx.uc.uc_stack.ss_size = kStack;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, fiber_entry, 0);
#endif
}

void ensure_fibers(unsigned n) {
  Sched &s = S();
  if (s.fibers.size() >= n) return;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t old = s.fibers.size();
  s.fibers.resize(n);
  for (size_t i = old; i < n; i++) {
    // one mapping per fiber: a guard page below its stack
    void *m = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "zpp cuda emu: cannot map fiber stacks\n");
      std::abort();
    }
    mprotect(m, page, PROT_NONE);
    s.fibers[i].stack = (char *)m + page;
  }
}

void yield() {
  Sched &s = S();
  switch_to(s.fibers[s.cur].ctx, s.sched);
}

void barrier(unsigned &count, unsigned &gen, unsigned expected) {
  unsigned g = gen;
  S().progress++;
  if (++count == expected) {
    count = 0;
    gen++;
    return;
  }
  while (gen == g) yield();
}

void fail(const std::string &what) {
  if (S().error.empty()) S().error = what;
}

// Runs one CTA to completion; false on deadlock.
bool run_cta() {
  Sched &s = S();
  unsigned n = s.n;
  size_t warps = (n + 31) / 32;
  s.warp_count.assign(warps, 0);
  s.warp_gen.assign(warps, 0);
  s.warp_slot.assign(warps * 32, 0);
  s.cta_count = 0;
  s.cta_gen = 0;
  for (unsigned i = 0; i < n; i++) make_fiber(s.fibers[i]);
  // Warps run in a shuffled priority order, and the first warp that can
  // move runs as far as it can before the next one gets a turn: a warp
  // races ahead of the others after every __syncthreads, which exposes
  // shared memory reused without a barrier.
  std::vector<unsigned> order(warps);
  for (unsigned w = 0; w < warps; w++) order[w] = w;
  uint64_t h = 0x9e3779b97f4a7c15ull * (s.launches * 1000003ull +
                                        zpp_emu_builtin.blockIdx.x + 1);
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
          zpp_emu_builtin.threadIdx.x = i;
          switch_to(s.sched, s.fibers[i].ctx);
          if (s.misaligned)
            return false;
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
           "every thread reaches (block " +
           std::to_string(zpp_emu_builtin.blockIdx.x) + ")");
      return false;
    }
  }
}

}  // namespace

bool run_grid(dim3 grid, dim3 block, void (*run)(void *), void *closure,
              std::string *why) {
  Sched &s = S();
  if (block.x == 0 || block.x > kMaxThreads) {
    *why = "block of " + std::to_string(block.x) + " threads";
    return false;
  }
  ensure_fibers(block.x);
  s.launches++;
  s.error.clear();
  s.misaligned = false;
  s.run = run;
  s.closure = closure;
  s.n = block.x;
  zpp_emu_builtin.gridDim = grid;
  zpp_emu_builtin.blockDim = block;
  zpp_emu_builtin.threadIdx = dim3(0, 0, 0);
  bool ok = true;
  t_in_grid = true;
  for (unsigned b = 0; b < grid.x && ok; b++) {
    zpp_emu_builtin.blockIdx = dim3(b, 0, 0);
    ok = run_cta() && s.error.empty();
  }
  t_in_grid = false;
  if (!ok) *why = s.error.empty() ? "launch failed" : s.error;
  return ok;
}

cudaError_t grid_error() {
  return S().misaligned ? cudaErrorMisalignedAddress : cudaErrorLaunchFailure;
}

void prepare_thread() {
  static thread_local bool done = false;
  if (done) return;
  done = true;
  // A fault in a fiber is handled on this stack, and the handler jumps back
  // to the worker's frame (siglongjmp allows that from a signal stack).
  size_t sz = 256 * 1024;
  void *m = mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return;
  stack_t ss = {};
  ss.ss_sp = m;
  ss.ss_size = sz;
  sigaltstack(&ss, nullptr);
}

}  // namespace zpp_emu

extern "C" __attribute__((visibility("default"))) void zpp_emu_syncthreads(void) {
  zpp_emu::Sched &s = zpp_emu::S();
  zpp_emu::barrier(s.cta_count, s.cta_gen, s.n);
}

extern "C" __attribute__((visibility("default"))) uint64_t zpp_emu_shfl_xor(uint64_t bits, unsigned mask, int lane_mask,
                                     int width) {
  zpp_emu::Sched &s = zpp_emu::S();
  if (mask != 0xffffffffu) zpp_emu::fail("__shfl_xor_sync: mask is not full");
  unsigned lane = s.cur % 32, warp = s.cur / 32;
  unsigned lanes = s.n - warp * 32 < 32 ? s.n - warp * 32 : 32;
  s.warp_slot[warp * 32 + lane] = bits;
  zpp_emu::barrier(s.warp_count[warp], s.warp_gen[warp], lanes);
  unsigned src = lane ^ (unsigned)lane_mask;
  if ((src / (unsigned)width) != (lane / (unsigned)width) || src >= lanes) src = lane;
  uint64_t r = s.warp_slot[warp * 32 + src];
  zpp_emu::barrier(s.warp_count[warp], s.warp_gen[warp], lanes);
  return r;
}

// A load or store intrinsic (cuda_runtime.h) got a pointer that is not a
// multiple of its access size: the CUDA thread stops here for good.
extern "C" __attribute__((visibility("default"))) void
zpp_emu_misaligned(const void *p, size_t bytes, const char *op) {
  zpp_emu::Sched &s = zpp_emu::S();
  char what[160];
  std::snprintf(
      what, sizeof what,
      "misaligned address: %s of %zu bytes at %p (block %u, thread %u)", op,
      bytes, p, zpp_emu_builtin.blockIdx.x, zpp_emu_builtin.threadIdx.x);
  if (!zpp_emu::t_in_grid) { // host code: no CUDA thread to stop
    std::fprintf(stderr, "zpp cuda emu: %s outside a kernel\n", what);
    std::abort();
  }
  s.error = what;
  s.misaligned = true;
  s.progress++;
  zpp_emu::switch_to(s.fibers[s.cur].ctx, s.sched); // never resumed
  std::abort();
}
