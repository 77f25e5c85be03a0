// libzpp_cudart_emu: a CUDA runtime emulated on the CPU, for tests.  It
// keeps the contract of the real runtime, failure modes included, so that
// zpp's device path (kernels, device memory, streams, events, the NCCL
// stand-in) runs in `make test` on machines without a GPU.
//
// What it models (each rule has a test in tests/test_cuda_emu.cc):
//  - ZPP_EMU_DEVICES devices (default 8), a current device per host thread
//    (default 0); device d has the PCI bus id 0000:<d+1>:00.0 in every
//    process, so two processes that use the same index use "the same GPU";
//  - a registry of allocations: kind (device, pinned host, managed) and
//    device; cudaPointerGetAttributes answers from it (anything else is
//    unregistered host memory);
//  - streams: each belongs to the device current at its creation and runs
//    its work in order on a worker thread, asynchronously from the host,
//    after a random delay (ZPP_EMU_DELAY_US, default 300: uniform in
//    [0, 2 x 300] us, seed ZPP_EMU_SEED, printed at first use), so that a
//    missing synchronisation shows up as a failing test, not as luck; one
//    device operation (kernel, copy, set, stream-ordered alloc/free) runs
//    at a time in the process;
//  - the legacy stream (0, cudaStreamLegacy), one per device, waits for
//    the earlier work of the blocking streams of its device, and they wait
//    for its earlier work; streams created with cudaStreamNonBlocking do
//    not synchronise with it;
//  - the per-thread default stream (cudaStreamPerThread): one per host
//    thread and device, not ordered with other threads' ones, a blocking
//    stream (it synchronises with the legacy stream); destroyed when its
//    thread exits (its queued work still runs);
//  - multi-device rules of the CUDA programming guide ("Stream and Event
//    Behavior"): a kernel launched into a stream of another device than the
//    current one fails with cudaErrorInvalidResourceHandle, and so does
//    cudaEventRecord of an event and a stream of different devices; copies
//    and memsets into another device's stream are allowed;
//  - events complete when the work before them did; cudaStreamWaitEvent
//    orders streams, with the event's state at the call; an event never
//    recorded is an empty set of work;
//  - the synchronous copy and memset follow the runtime's "API
//    synchronization behavior": cudaMemcpy returns after the copy except
//    device to device (asynchronous), cudaMemset is asynchronous unless
//    the target is pinned or managed memory; cudaMemcpyAsync stages a
//    pageable source at the call, and returns after a copy to pageable
//    memory from the device or from host to host;
//  - device memory lives in one arena that is PROT_NONE except while a
//    device operation runs, so host code touching it is caught:
//    "zpp cuda emu: host code touched device memory at <p>", then abort.
//    While a device operation runs, only the allocations it touches are
//    opened (on their first access, from the fault handler), and only if
//    they belong to its device or to a peer the device enabled; freed
//    memory is never reused and stays PROT_NONE.  Any other access by
//    device code (freed memory, another device's memory, a guard page past
//    an allocation) is a sticky cudaErrorIllegalAddress of that device,
//    as are kernel pointer arguments to another device's memory or to
//    unregistered host memory;
//  - a load or store intrinsic of device code (__ldg, __stcs, ...: the
//    device-language part of cuda_runtime.h) at an address that is not a
//    multiple of its access size is a sticky cudaErrorMisalignedAddress of
//    the device (cuda_emu_grid.cc stops the CUDA thread there);
//  - stream-ordered allocation: cudaMallocAsync's memory exists from its
//    point in the stream, cudaFreeAsync's memory is gone from its point;
//  - memory pools (cudaMallocAsync, cudaMallocFromPoolAsync, the default,
//    current and created pools of a device), as an account of bytes:
//    memory freed in stream order stays reserved in its pool and counts
//    against the device's memory until a stream, event or device
//    synchronisation releases what is above the pool's release threshold
//    (default 0), or cudaMemPoolTrimTo;
//  - cudaFree waits for the queued work of the allocation's device first
//    (cudaFreeHost: of every device), except for memory of cudaMallocAsync,
//    which it frees at once;
//  - a host function (cudaLaunchHostFunc) runs in stream order on the
//    stream's worker; CUDA calls from it fail with cudaErrorNotPermitted,
//    and it cannot touch device memory;
//  - stream capture into a graph (kernels, copies, memsets, host
//    functions, stream memory operations), instantiate and launch, with
//    the rules of a capture: querying or synchronising the capturing stream
//    or an event recorded in it, waiting on an event from outside, using
//    the legacy stream while a blocking stream captures, and potentially
//    unsafe calls (by the capture's and the thread's mode) fail and
//    invalidate the capture; a capture not begun Relaxed ends on its
//    thread;
//  - per-thread last error, sticky errors per device;
//  - primary contexts: cudaSetDevice(d) initialises device d's, and every
//    runtime call that needs a context (memory, streams, events, launches,
//    synchronisation, pointer attributes, cudaFree(0)) initialises the
//    calling thread's device's (device 0 on a thread that never set one);
//    device queries (cudaGetDevice, cudaGetDeviceCount, PCI bus ids, peer
//    capability) and cudaGetDriverEntryPointByVersion do not;
//  - driver functions through cudaGetDriverEntryPointByVersion:
//    cuStreamWaitValue32 and cuStreamWriteValue32 (the _v2 semantics; on
//    pinned host or device memory; a wait is bounded by ZPP_EMU_TIMEOUT_S,
//    then the device gets a sticky cudaErrorTimeout, where a GPU waits
//    forever) and cuDevicePrimaryCtxGetState; unknown symbols give NULL and
//    cudaDriverEntryPointSymbolNotFound; cudaEnablePerThreadDefaultStream
//    gives the _ptsz variants (stream 0 is cudaStreamPerThread).
//
// What it does NOT model:
//  - host code touching device memory while any device operation runs
//    (the touched allocations are open then) escapes detection;
//  - system calls given device memory (write, process_vm_readv of an MPI
//    library) fail with EFAULT instead of faulting;
//  - pointers inside struct arguments of a kernel are checked only by the
//    fault handler (another device's or freed memory), not for pageable
//    host memory;
//  - reads of up to 255 bytes before an allocation's start, and overruns of
//    an allocation whose size is not a multiple of 256 bytes within its
//    last 256, are not caught (allocations end at a guard page, rounded up
//    to 256 bytes);
//  - misaligned plain C++ loads and stores in a kernel (only the
//    intrinsics are checked);
//  - concurrency between device operations, 2-D/3-D grids, dynamic shared
//    memory, launch attributes, IPC (and exportable, managed or host memory
//    pools), reuse of freed addresses (a pool's reuse is bytes only),
//    managed-memory migration, device properties, timing accuracy;
//  - in a capture: allocation nodes (cudaMallocAsync fails and
//    invalidates it), captures joining other streams through events, graph
//    nodes, a device synchronisation while one of its streams captures;
//  - contexts other than the primary ones (the driver's cuCtx* calls), a
//    thread's current context apart from its device, cudaSetDeviceFlags;
//  - the v1 stream memory operations (cudaVersion below 11070 gets
//    cudaDriverEntryPointVersionNotSufficent, where a driver returns them),
//    64-bit waits and writes, compiling with per-thread default streams
//    (--default-stream per-thread: stream 0 is always the legacy stream);
//  - performance: a kernel runs on one CPU thread, one CUDA thread at a time.
#include "cuda_runtime.h"

#include <pthread.h>
#include <setjmp.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu_internal.h"
#include "zpp_cuda_emu.h"

#define ZPP_EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ---- settings -------------------------------------------------------------

constexpr int kMaxDevices = 64;

unsigned long env_ul(const char *name, unsigned long dflt) {
  const char *v = getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char *end = nullptr;
  unsigned long x = strtoul(v, &end, 0);
  return end && *end == '\0' ? x : dflt;
}

struct Settings {
  int devices = 8;
  std::atomic<unsigned> delay_us{300};
  uint64_t seed = 0;
  std::atomic<unsigned> timeout_s{300};
  size_t arena_bytes = (size_t)64 << 30;
  size_t device_bytes = (size_t)16 << 30;
};

// ---- the API counters -------------------------------------------------------

// clang-format off
#define ZPP_EMU_APIS(X)                                                          \
  X(cudaGetLastError) X(cudaPeekAtLastError) X(cudaGetDeviceCount)               \
  X(cudaSetDevice) X(cudaGetDevice) X(cudaDeviceSynchronize)                     \
  X(cudaDeviceGetPCIBusId) X(cudaDeviceGetByPCIBusId) X(cudaDeviceCanAccessPeer) \
  X(cudaDeviceEnablePeerAccess) X(cudaMalloc) X(cudaFree) X(cudaMallocAsync)     \
  X(cudaFreeAsync) X(cudaMallocHost) X(cudaHostAlloc) X(cudaFreeHost)            \
  X(cudaMallocManaged) X(cudaPointerGetAttributes) X(cudaMemcpy)                 \
  X(cudaMemcpyAsync) X(cudaMemset) X(cudaMemsetAsync) X(cudaStreamCreate)        \
  X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamSynchronize)     \
  X(cudaStreamQuery) X(cudaStreamWaitEvent) X(cudaLaunchHostFunc)                \
  X(cudaEventCreate) X(cudaEventCreateWithFlags) X(cudaEventRecord)              \
  X(cudaEventQuery) X(cudaEventSynchronize) X(cudaEventDestroy)                  \
  X(cudaEventElapsedTime) X(cudaStreamBeginCapture) X(cudaStreamEndCapture)      \
  X(cudaGraphInstantiate) X(cudaGraphLaunch) X(cudaGraphExecDestroy)             \
  X(cudaGraphDestroy) X(cudaLaunchKernelEx) X(cudaHostGetDevicePointer)          \
  X(cudaGetDriverEntryPointByVersion) X(cuStreamWaitValue32)                     \
  X(cuStreamWriteValue32) X(cuDevicePrimaryCtxGetState) X(cudaMallocFromPoolAsync) \
  X(cudaDeviceGetDefaultMemPool) X(cudaDeviceGetMemPool) X(cudaDeviceSetMemPool)  \
  X(cudaMemPoolCreate) X(cudaMemPoolDestroy) X(cudaMemPoolTrimTo)                 \
  X(cudaMemPoolSetAttribute) X(cudaMemPoolGetAttribute) X(cudaStreamIsCapturing)  \
  X(cudaStreamGetCaptureInfo) X(cudaThreadExchangeStreamCaptureMode)
// clang-format on

enum Api {
#define ZPP_EMU_ENUM(n) k_##n,
  ZPP_EMU_APIS(ZPP_EMU_ENUM)
#undef ZPP_EMU_ENUM
      kApiCount
};
const char *const kApiNames[] = {
#define ZPP_EMU_NAME(n) #n,
    ZPP_EMU_APIS(ZPP_EMU_NAME)
#undef ZPP_EMU_NAME
};
std::atomic<unsigned long> g_calls[kApiCount];

// ---- memory -----------------------------------------------------------------

enum Kind { kDevice, kPinned, kManaged };
enum State { kPending, kLive, kFreed };

// A memory pool of cudaMallocAsync: bytes only (freed addresses are never
// reused, so reuse is the accounting of reserved bytes).  Guarded by
// reg_mu, as the device's live bytes it charges.
struct Pool {
  int device = 0;
  bool is_default = false;
  bool live = true;        // not destroyed
  uint64_t threshold = 0;  // cudaMemPoolAttrReleaseThreshold: "(default 0)"
  uint64_t max_size = 0;   // 0: the device's memory
  uint64_t reserved = 0, reserved_high = 0, used = 0, used_high = 0;
  int reuse[3] = {1, 1, 1};  // the three reuse policies: "(default enabled)"
};

struct Alloc {
  uintptr_t base = 0;  // what the caller got
  size_t size = 0;     // what the caller asked for
  uintptr_t region = 0;  // pages of the allocation (device memory)
  size_t region_len = 0;
  Kind kind = kDevice;
  int device = 0;
  State state = kLive;
  bool stream_ordered = false;  // from cudaMallocAsync
  Pool *pool = nullptr;         // the pool it came from (stream-ordered)
};

// ---- streams, operations, events --------------------------------------------

struct Stream;

struct Dep {
  Stream *s;
  uint64_t seq;  // done when s->done >= seq
};

// A kernel's closure, shared by a launch and the graphs that hold it.
struct Closure {
  void (*run)(void *) = nullptr;
  void (*destroy)(void *) = nullptr;
  void *p = nullptr;
  ~Closure() {
    if (destroy) destroy(p);
  }
};

enum OpKind {
  kOpKernel,
  kOpCopy,
  kOpSet,
  kOpHostFn,
  kOpMarker,
  kOpWait,
  kOpAlloc,
  kOpFree,
  kOpWaitValue,  // cuStreamWaitValue32: dst, value, flags
  kOpWriteValue  // cuStreamWriteValue32: dst, value
};

struct Op {
  OpKind kind = kOpMarker;
  uint64_t seq = 0;
  std::vector<Dep> deps;
  // kernel
  dim3 grid, block;
  const void *kernel = nullptr;
  std::shared_ptr<Closure> closure;
  std::vector<const void *> ptrs;
  // copy / set
  void *dst = nullptr;
  const void *src = nullptr;
  size_t bytes = 0;
  int value = 0;
  std::shared_ptr<std::vector<char>> staged;  // a pageable source, copied at the call
  unsigned flags = 0;  // of a wait on a value
  // host function
  cudaHostFn_t fn = nullptr;
  void *user = nullptr;
  // marker (event record): completion time
  std::shared_ptr<double> time;
  // alloc / free
  uintptr_t alloc = 0;
};

struct Graph {
  std::vector<Op> ops;
};

struct Stream {
  int device = 0;
  bool nonblocking = false, legacy = false, destroyed = false;
  std::deque<Op> q;
  uint64_t next = 0, done = 0;  // seq of the last queued and last completed op
  bool held = false, running = false;
  bool worker = false;
  Graph *capture = nullptr;     // while a capture sequence runs
  bool capture_broken = false;  // invalidated: cudaStreamEndCapture fails
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  uint64_t capture_thread = 0;        // the thread that began it
  unsigned long long capture_id = 0;  // unique over the process
  uint64_t rng = 0;
};

struct Event {
  int device = 0;
  unsigned flags = 0;
  Stream *s = nullptr;
  uint64_t seq = 0;
  unsigned long long capture_id = 0;  // last recorded in this capture sequence
  std::shared_ptr<double> time;
};

struct Device {
  Stream *legacy = nullptr;
  cudaError_t sticky = cudaSuccess;
  bool peer[kMaxDevices] = {};
  size_t live_bytes = 0;  // allocations outside pools, and pools' reserved bytes
  Pool *default_pool = nullptr, *current_pool = nullptr;  // made at first use
  unsigned long pool_releases = 0;                        // releases of pool memory to the OS
};

struct Emu {
  Settings cfg;
  std::mutex mu;  // streams, events, devices
  std::condition_variable cv;
  std::vector<Stream *> streams;  // every stream ever created (never freed)
  std::set<Stream *> live_streams;
  std::set<Event *> live_events;
  std::set<Graph *> live_graphs;
  std::set<Pool *> live_pools;  // under reg_mu
  std::set<Stream *> capturing;  // streams with a capture sequence
  unsigned long long next_capture_id = 0;
  Device dev[kMaxDevices];
  // Whether device d's primary context is initialised (active).
  std::atomic<bool> ctx[kMaxDevices] = {};
  std::mutex reg_mu;  // the registry, taken by the fault handler too
  std::map<uintptr_t, Alloc> reg;
  uintptr_t arena_lo = 0, arena_hi = 0, arena_next = 0;
  size_t page = 4096;
  std::mutex exec_mu;  // one device operation at a time
  std::mutex log_mu;
  std::vector<const void *> kernel_log;
  std::vector<zpp_emu_copy> copy_log;
  std::atomic<int> last_kernel_device{-1};
  std::atomic<const void *> last_kernel{nullptr};
  std::atomic<unsigned> max_threads{0};
  std::string last_fault;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  struct sigaction old_segv = {}, old_bus = {};
};

Emu *g_emu = nullptr;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

// Per host thread.  Initial-exec TLS: the fault handler reads it.
__thread int t_device __attribute__((tls_model("initial-exec"))) = 0;
__thread cudaError_t t_last __attribute__((tls_model("initial-exec"))) = cudaSuccess;
__thread int t_in_host_fn __attribute__((tls_model("initial-exec"))) = 0;
// cudaThreadExchangeStreamCaptureMode: "This is the default mode."
__thread cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;
__thread uint64_t t_thread_id = 0;  // 0 until first asked

uint64_t thread_id() {
  static std::atomic<uint64_t> next{0};
  if (t_thread_id == 0) t_thread_id = ++next;
  return t_thread_id;
}

// The device operation this worker thread runs now (fault handler state).
struct Exec {
  int device = 0;
  cudaError_t err = cudaErrorIllegalAddress;  // of a fault, when fault is set
  uint64_t allowed = 0;  // devices whose memory the operation may touch
  std::vector<std::pair<uintptr_t, size_t>> opened;
  char fault[256] = "";
  sigjmp_buf env;
};
__thread Exec *t_exec __attribute__((tls_model("initial-exec"))) = nullptr;

void install_handlers();

void init_once() {
  Emu *e = new Emu;
  e->cfg.devices = (int)std::min<unsigned long>(env_ul("ZPP_EMU_DEVICES", 8), kMaxDevices);
  e->cfg.delay_us = (unsigned)env_ul("ZPP_EMU_DELAY_US", 300);
  e->cfg.seed = env_ul("ZPP_EMU_SEED",
                       (unsigned long)std::chrono::steady_clock::now().time_since_epoch().count() ^
                           ((unsigned long)getpid() << 20));
  e->cfg.timeout_s = (unsigned)env_ul("ZPP_EMU_TIMEOUT_S", 300);
  e->cfg.arena_bytes = (size_t)env_ul("ZPP_EMU_ARENA_GB", 64) << 30;
  e->cfg.device_bytes = (size_t)env_ul("ZPP_EMU_DEVICE_MEM_MB", 16384) << 20;
  e->page = (size_t)sysconf(_SC_PAGESIZE);
  void *m = mmap(nullptr, e->cfg.arena_bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "zpp cuda emu: cannot reserve %zu bytes of device arena\n",
                 e->cfg.arena_bytes);
    std::abort();
  }
  e->arena_lo = e->arena_next = (uintptr_t)m;
  e->arena_hi = e->arena_lo + e->cfg.arena_bytes;
  g_emu = e;
  std::fprintf(stderr,
               "zpp cuda emu: pid %d, %d devices, delay per operation 0..%u us, "
               "seed %llu (ZPP_EMU_DEVICES, ZPP_EMU_DELAY_US, ZPP_EMU_SEED)\n",
               (int)getpid(), e->cfg.devices, 2 * e->cfg.delay_us.load(),
               (unsigned long long)e->cfg.seed);
  install_handlers();
}

Emu &E() {
  if (g_emu == nullptr) pthread_once(&g_once, init_once);
  return *g_emu;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - E().t0)
      .count();
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

// Every API function starts here.
#define API(name)                                     \
  g_calls[k_##name].fetch_add(1, std::memory_order_relaxed); \
  Emu &emu = E();                                     \
  (void)emu;                                          \
  if (t_in_host_fn) return ret(cudaErrorNotPermitted)

// An API function that needs a context starts here: it initialises the
// primary context of the calling thread's device (device 0 on a thread
// that never set one).
#define API_CTX(name)                                                                              \
  API(name);                                                                                       \
  emu.ctx[t_device].store(true)

bool valid_device(int d) { return d >= 0 && d < E().cfg.devices; }

cudaError_t sticky(int d) { return valid_device(d) ? E().dev[d].sticky : cudaSuccess; }

// ---- the fault handler --------------------------------------------------------

const Alloc *find_locked(uintptr_t a) {
  Emu &e = *g_emu;
  auto it = e.reg.upper_bound(a);
  if (it == e.reg.begin()) return nullptr;
  --it;
  const Alloc &al = it->second;
  if (al.kind == kDevice) {
    if (a >= al.region && a < al.region + al.region_len) return &al;
  } else if (a >= al.base && a < al.base + al.size) {
    return &al;
  }
  return nullptr;
}

void fault_text(Exec *x, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->fault, sizeof x->fault, fmt, ap);
  va_end(ap);
}

// Opens the allocation holding a for the device operation this thread
// runs, if it may touch it; otherwise records why not.
bool open_for_exec(Exec *x, uintptr_t a) {
  Emu &e = *g_emu;
  std::lock_guard<std::mutex> lk(e.reg_mu);
  const Alloc *al = find_locked(a);
  if (al == nullptr) {
    fault_text(x, "access to %p: no allocation there (past the end of one, or never allocated)",
               (void *)a);
    return false;
  }
  if (al->state == kFreed) {
    fault_text(x, "access to %p: freed device memory (allocation %p of %zu bytes)", (void *)a,
               (void *)al->base, al->size);
    return false;
  }
  if (al->state == kPending) {
    fault_text(x, "access to %p: stream-ordered allocation %p not made yet in stream order",
               (void *)a, (void *)al->base);
    return false;
  }
  if (!(x->allowed >> al->device & 1)) {
    fault_text(x, "access to %p: memory of device %d from device %d without peer access",
               (void *)a, al->device, x->device);
    return false;
  }
  if (mprotect((void *)al->region, al->region_len, PROT_READ | PROT_WRITE) != 0) return false;
  x->opened.emplace_back(al->region, al->region_len);
  return true;
}

void write_err(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

void chain(int sig, siginfo_t *si, void *uc, const struct sigaction &old) {
  if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction != nullptr) {
    old.sa_sigaction(sig, si, uc);
    return;
  }
  if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
    return;
  }
  // default action: re-raise on return
  signal(sig, SIG_DFL);
}

void on_fault(int sig, siginfo_t *si, void *uc) {
  Emu *e = g_emu;
  uintptr_t a = (uintptr_t)si->si_addr;
  bool in_arena = e != nullptr && a >= e->arena_lo && a < e->arena_hi;
  Exec *x = t_exec;
  if (x != nullptr) {  // device code faulted
    if (in_arena && open_for_exec(x, a)) return;
    if (!in_arena)
      fault_text(x, "access to %p: not device memory (pageable host memory, or a guard page)",
                 (void *)a);
    siglongjmp(x->env, 1);
  }
  if (in_arena) {
    char msg[128];
    snprintf(msg, sizeof msg, "zpp cuda emu: host code touched device memory at %p\n", (void *)a);
    write_err(msg);
    abort();
  }
  chain(sig, si, uc, sig == SIGSEGV ? e->old_segv : e->old_bus);
}

void install_one(int sig, struct sigaction *old) {
  struct sigaction cur = {};
  sigaction(sig, nullptr, &cur);
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault) return;
  struct sigaction sa = {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, old);
}

// Also called when memory or streams are made: a library that installs
// its own handler later (MPI does) is put behind ours again.
void install_handlers() {
  install_one(SIGSEGV, &E().old_segv);
  install_one(SIGBUS, &E().old_bus);
}

// ---- the registry --------------------------------------------------------------

struct PtrInfo {
  bool registered = false;  // pinned, managed or device (any state)
  bool in_arena = false;
  Alloc a;
};

PtrInfo classify(const void *p) {
  Emu &e = E();
  PtrInfo r;
  uintptr_t a = (uintptr_t)p;
  r.in_arena = a >= e.arena_lo && a < e.arena_hi;
  std::lock_guard<std::mutex> lk(e.reg_mu);
  const Alloc *al = find_locked(a);
  if (al != nullptr) {
    r.registered = true;
    r.a = *al;
  }
  return r;
}

bool is_live_device(const PtrInfo &i) {
  return i.registered && i.a.kind == kDevice && i.a.state != kFreed;
}

// The bytes an allocation of size takes from its device or pool.
size_t charged(size_t size) { return (size + 255) & ~(size_t)255; }

// Device memory: [base, base + size) at the end of its pages, followed by
// a PROT_NONE guard page, never reused.  From a pool (stream-ordered,
// pending): the pool's unused reserved bytes are taken first, and only the
// rest is new memory of the device.
cudaError_t arena_alloc(size_t size, int device, State st, Pool *pool, void **out) {
  Emu &e = E();
  install_handlers();
  size_t sz = charged(size);
  size_t len = (sz + e.page - 1) / e.page * e.page;
  std::lock_guard<std::mutex> lk(e.reg_mu);
  size_t grow = sz;
  if (pool != nullptr) {
    uint64_t idle = pool->reserved - pool->used;
    grow = sz > idle ? sz - (size_t)idle : 0;
    if (pool->max_size != 0 && pool->reserved + grow > pool->max_size)
      return cudaErrorMemoryAllocation;
  }
  if (e.dev[device].live_bytes + grow > e.cfg.device_bytes) return cudaErrorMemoryAllocation;
  if (e.arena_next + len + e.page > e.arena_hi) return cudaErrorMemoryAllocation;
  Alloc al;
  al.region = e.arena_next;
  al.region_len = len;
  al.base = al.region + len - sz;
  al.size = size;
  al.kind = kDevice;
  al.device = device;
  al.state = st;
  al.stream_ordered = st == kPending;
  al.pool = pool;
  e.arena_next += len + e.page;
  e.reg[al.base] = al;
  e.dev[device].live_bytes += grow;
  if (pool != nullptr) {
    pool->used += sz;
    pool->reserved += grow;
    pool->used_high = std::max(pool->used_high, pool->used);
    pool->reserved_high = std::max(pool->reserved_high, pool->reserved);
  }
  *out = (void *)al.base;
  return cudaSuccess;
}

// Returns unused reserved bytes of a pool to the OS until it holds at most
// keep.  Caller holds reg_mu.
void pool_release_locked(Pool *p, uint64_t keep) {
  Emu &e = E();
  uint64_t idle = p->reserved - p->used;
  uint64_t over = p->reserved > keep ? p->reserved - keep : 0;
  uint64_t rel = std::min(idle, over);
  if (rel == 0) return;
  p->reserved -= rel;
  e.dev[p->device].live_bytes -= (size_t)rel;
  e.dev[p->device].pool_releases++;
}

// After a synchronisation that involved device d: its pools release what
// they hold above their threshold (cudaMemPoolAttrReleaseThreshold: "the
// allocator will try to release memory back to the OS on the next call to
// stream, event or context synchronize").  Caller holds neither mu nor
// reg_mu.
void pools_after_sync(int d) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.reg_mu);
  for (Pool *p : e.live_pools)
    if (p->device == d) pool_release_locked(p, p->threshold);
}

// Makes a device allocation inaccessible for good.  Caller holds exec_mu.
void arena_release(uintptr_t base) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.reg_mu);
  auto it = e.reg.find(base);
  if (it == e.reg.end() || it->second.state == kFreed) return;
  Alloc &al = it->second;
  al.state = kFreed;
  if (al.pool != nullptr) {  // back to its pool: still reserved
    al.pool->used -= charged(al.size);
    // a destroyed pool goes once its last allocation does
    if (!al.pool->live && al.pool->used == 0) pool_release_locked(al.pool, 0);
  } else {
    e.dev[al.device].live_bytes -= charged(al.size);
  }
  mprotect((void *)al.region, al.region_len, PROT_NONE);
  madvise((void *)al.region, al.region_len, MADV_DONTNEED);
}

cudaError_t host_alloc(size_t size, Kind kind, void **out) {
  Emu &e = E();
  install_handlers();
  size_t len = (std::max<size_t>(size, 1) + e.page - 1) / e.page * e.page;
  void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  Alloc al;
  al.base = (uintptr_t)m;
  al.size = std::max<size_t>(size, 1);
  al.region = al.base;
  al.region_len = len;
  al.kind = kind;
  al.device = t_device;
  al.state = kLive;
  std::lock_guard<std::mutex> lk(e.reg_mu);
  e.reg[al.base] = al;
  *out = m;
  return cudaSuccess;
}

// ---- streams -------------------------------------------------------------------

void worker_main(Stream *s);

Stream *new_stream(int device, bool nonblocking, bool legacy) {
  Emu &e = E();
  Stream *s = new Stream;
  s->device = device;
  s->nonblocking = nonblocking;
  s->legacy = legacy;
  s->rng = e.cfg.seed ^ (0x9e3779b97f4a7c15ull * (e.streams.size() + 1));
  e.streams.push_back(s);
  if (!legacy) e.live_streams.insert(s);
  return s;
}

// The per-thread default streams of this host thread, one per device,
// made at first use; when the thread exits they are destroyed as
// cudaStreamDestroy does (their queued work still runs).
struct PerThreadStreams {
  Stream *s[kMaxDevices] = {};
  ~PerThreadStreams() {
    if (g_emu == nullptr) return;
    std::lock_guard<std::mutex> lk(g_emu->mu);
    for (Stream *p : s)
      if (p != nullptr) {
        p->destroyed = true;
        p->held = false;
      }
    g_emu->cv.notify_all();
  }
};
thread_local PerThreadStreams t_per_thread;

// The stream a handle names, for the calling thread; nullptr if invalid.
// Caller holds mu.
Stream *resolve(cudaStream_t h, cudaError_t *err) {
  Emu &e = E();
  *err = cudaSuccess;
  if (h == nullptr || h == cudaStreamLegacy) {
    Device &d = e.dev[t_device];
    if (d.legacy == nullptr) d.legacy = new_stream(t_device, false, true);
    return d.legacy;
  }
  if (h == cudaStreamPerThread) {
    // a blocking stream: it synchronises with the legacy stream
    Stream *&p = t_per_thread.s[t_device];
    if (p == nullptr) {
      p = new_stream(t_device, false, false);
      e.live_streams.erase(p);  // no handle names it but cudaStreamPerThread
    }
    return p;
  }
  Stream *s = reinterpret_cast<Stream *>(h);
  if (!e.live_streams.count(s)) {
    *err = cudaErrorInvalidResourceHandle;
    return nullptr;
  }
  return s;
}

bool deps_done(const Op &op) {
  for (const Dep &d : op.deps)
    if (d.s->done < d.seq) return false;
  return true;
}

// ---- stream capture: what a capture sequence forbids ----------------------
//
// Each returns the error and invalidates the capture sequences concerned
// (cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated).
// Callers hold mu.

// The legacy stream while a blocking stream of its device captures:
// cudaErrorStreamCaptureImplicit, "The operation would have resulted in a
// disallowed implicit dependency on a current capture sequence from
// cudaStreamLegacy." (driver_types.h).
cudaError_t legacy_use_locked(const Stream *s, bool invalidate) {
  if (!s->legacy) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  for (Stream *c : E().capturing)
    if (c->device == s->device && !c->nonblocking) {
      if (invalidate) c->capture_broken = true;
      err = cudaErrorStreamCaptureImplicit;
    }
  return err;
}

// Synchronising or querying a capturing stream: "The operation is not
// permitted when the stream is capturing." (cudaErrorStreamCaptureUnsupported)
cudaError_t sync_use_locked(Stream *s) {
  if (s->capture != nullptr) {
    s->capture_broken = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  return legacy_use_locked(s, true);
}

// A potentially unsafe call (cudaMalloc, cudaMallocHost, cudaFree, a
// synchronous copy or memset) on this thread, by the rules of
// cudaThreadExchangeStreamCaptureMode: prohibited in Global mode while this
// thread has a capture not begun Relaxed or another thread one begun
// Global, in ThreadLocal mode only for this thread's own.
cudaError_t unsafe_call_locked() {
  if (t_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  uint64_t me = thread_id();
  cudaError_t err = cudaSuccess;
  for (Stream *c : E().capturing) {
    bool mine = c->capture_thread == me && c->capture_mode != cudaStreamCaptureModeRelaxed;
    bool others = t_capture_mode == cudaStreamCaptureModeGlobal && c->capture_thread != me &&
                  c->capture_mode == cudaStreamCaptureModeGlobal;
    if (mine || others) {
      c->capture_broken = true;
      err = cudaErrorStreamCaptureUnsupported;
    }
  }
  return err;
}

cudaError_t unsafe_call() {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.mu);
  return unsafe_call_locked();
}

// The capturing stream whose sequence has this id; nullptr when it ended.
Stream *capture_of(unsigned long long id) {
  for (Stream *c : E().capturing)
    if (c->capture_id == id) return c;
  return nullptr;
}

// Querying or synchronising an event last recorded in a capture sequence
// that still runs: cudaErrorCapturedEvent, "The operation is not permitted
// on an event which was last recorded in a capturing stream."
// (driver_types.h).  Once the sequence ended the event is as if never
// recorded.
cudaError_t captured_event_use_locked(const Event *e) {
  Stream *c = e->capture_id != 0 ? capture_of(e->capture_id) : nullptr;
  if (c == nullptr) return cudaSuccess;
  c->capture_broken = true;
  return cudaErrorCapturedEvent;
}

// Queues op on s (or appends it to the graph s captures).  Caller holds mu.
cudaError_t enqueue(Stream *s, Op op) {
  Emu &e = E();
  if (s->capture != nullptr) {
    // "further use of any streams which are being captured ... is invalid"
    if (s->capture_broken) return cudaErrorStreamCaptureInvalidated;
    // not modelled: stream-ordered allocation nodes
    if (op.kind == kOpAlloc || op.kind == kOpFree) {
      s->capture_broken = true;
      return cudaErrorStreamCaptureUnsupported;
    }
    s->capture->ops.push_back(std::move(op));
    return cudaSuccess;
  }
  cudaError_t err = legacy_use_locked(s, true);
  if (err != cudaSuccess) return err;
  // the legacy stream's implicit synchronisation
  if (s->legacy) {
    for (Stream *b : e.streams)
      if (b != s && b->device == s->device && !b->legacy && !b->nonblocking && b->next > b->done)
        op.deps.push_back({b, b->next});
  } else if (!s->nonblocking) {
    Stream *l = e.dev[s->device].legacy;
    if (l != nullptr && l->next > l->done) op.deps.push_back({l, l->next});
  }
  op.seq = ++s->next;
  s->q.push_back(std::move(op));
  if (!s->worker) {
    s->worker = true;
    std::thread(worker_main, s).detach();
  }
  e.cv.notify_all();
  return cudaSuccess;
}

// Waits (bounded) until pred() holds.  Caller holds lk on mu.
bool wait_for(std::unique_lock<std::mutex> &lk, const std::function<bool()> &pred) {
  Emu &e = E();
  return e.cv.wait_for(lk, std::chrono::seconds(e.cfg.timeout_s.load()), pred);
}

uint64_t next_rand(uint64_t &x) {
  x += 0x9e3779b97f4a7c15ull;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void set_sticky(int device, cudaError_t err, const char *what) {
  Emu &e = E();
  {
    std::lock_guard<std::mutex> lk(e.mu);
    if (e.dev[device].sticky == cudaSuccess) e.dev[device].sticky = err;
  }
  {
    std::lock_guard<std::mutex> lk(e.log_mu);
    e.last_fault = what;
  }
  std::fprintf(stderr, "zpp cuda emu: device %d: %s: %s\n", device, cudaGetErrorName(err), what);
}

// Runs a device operation under the device lock, with the fault handler
// armed.  Returns false (and makes the error sticky) on a fault.
bool run_device_op(int device, uint64_t allowed, const std::function<bool(Exec *)> &body) {
  Emu &e = E();
  zpp_emu::prepare_thread();
  // One Exec per worker thread, in memory the handler and siglongjmp leave
  // alone (no local of this frame changes between sigsetjmp and the jump).
  static thread_local Exec *const x = new Exec;
  std::lock_guard<std::mutex> lk(e.exec_mu);
  x->device = device;
  x->allowed = allowed;
  x->err = cudaErrorIllegalAddress;
  x->fault[0] = '\0';
  x->opened.clear();
  x->opened.reserve(64);
  bool ok = false;
  if (sigsetjmp(x->env, 1) == 0) {
    t_exec = x;
    ok = body(x);
    t_exec = nullptr;
  } else {
    t_exec = nullptr;
    ok = false;
  }
  for (auto &r : x->opened) mprotect((void *)r.first, r.second, PROT_NONE);
  x->opened.clear();
  if (!ok)
    set_sticky(device, x->fault[0] ? x->err : cudaErrorLaunchFailure,
               x->fault[0] ? x->fault : "launch failed");
  return ok;
}

uint64_t allowed_for(int device) {
  Emu &e = E();
  uint64_t m = 1ull << device;
  for (int p = 0; p < e.cfg.devices; p++)
    if (e.dev[device].peer[p]) m |= 1ull << p;
  return m;
}

uint64_t device_bit(const void *p) {
  PtrInfo i = classify(p);
  return i.registered && i.a.kind == kDevice ? 1ull << i.a.device : 0;
}

// The condition of cuStreamWaitValue32 (the CUstreamWaitValue_flags of
// cuda.h).
bool wait_value_holds(uint32_t word, uint32_t value, unsigned flags) {
  switch (flags & 0xf) {
  case 0x0:  // GEQ: "(int32_t)(*addr - value) >= 0"
    return (int32_t)(word - value) >= 0;
  case 0x1:  // EQ: "*addr == value"
    return word == value;
  case 0x2:  // AND: "(*addr & value) != 0"
    return (word & value) != 0;
  default:  // NOR: "~(*addr | value) != 0"
    return ~(word | value) != 0;
  }
}

// Blocks the stream until the word at op.dst satisfies the condition, the
// device fails, or ZPP_EMU_TIMEOUT_S passes (a GPU would wait forever):
// then the device gets a sticky cudaErrorTimeout.  The word is read with
// an acquire load, as the host (pinned memory) or another stream may write
// it at any time; neither notifies, so the worker polls.
void wait_value(Stream *s, const Op &op) {
  Emu &e = E();
  int d = s->device;
  const uint32_t *w = static_cast<const uint32_t *>(op.dst);
  bool on_device = device_bit(w) != 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(e.cfg.timeout_s.load());
  unsigned pause_us = 10;
  for (;;) {
    uint32_t word = 0;
    if (on_device) {
      uint64_t allowed;
      {
        std::lock_guard<std::mutex> lk(e.mu);
        allowed = allowed_for(d);
      }
      if (!run_device_op(d, allowed, [&](Exec *) {
            word = __atomic_load_n(w, __ATOMIC_ACQUIRE);
            return true;
          }))
        return;  // a fault: sticky already
    } else {
      word = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    }
    if (wait_value_holds(word, (uint32_t)op.value, op.flags)) return;
    if (sticky(d) != cudaSuccess) return;
    if (std::chrono::steady_clock::now() > deadline) {
      char what[160];
      snprintf(what, sizeof what,
               "cuStreamWaitValue32 on %p (value %u, flags 0x%x): not satisfied within "
               "ZPP_EMU_TIMEOUT_S (%u s); the word is %u",
               (const void *)w, (unsigned)op.value, op.flags, e.cfg.timeout_s.load(), word);
      set_sticky(d, cudaErrorTimeout, what);
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    pause_us = std::min(2 * pause_us, 1000u);
  }
}

void exec_op(Stream *s, Op &op) {
  Emu &e = E();
  int d = s->device;
  switch (op.kind) {
  case kOpKernel: {
    uint64_t allowed;
    {
      std::lock_guard<std::mutex> lk(e.mu);
      allowed = allowed_for(d);
    }
    run_device_op(d, allowed, [&](Exec *x) {
      for (size_t i = 0; i < op.ptrs.size(); i++) {
        const void *p = op.ptrs[i];
        if (p == nullptr) continue;
        PtrInfo pi = classify(p);
        if (!pi.in_arena && !pi.registered) {
          fault_text(x, "kernel argument %zu (%p) is pageable host memory", i, p);
          return false;
        }
        if (is_live_device(pi) && !(allowed >> pi.a.device & 1)) {
          fault_text(x, "kernel argument %zu (%p) is memory of device %d, kernel runs on device %d",
                     i, p, pi.a.device, d);
          return false;
        }
      }
      std::string why;
      bool ok = zpp_emu::run_grid(op.grid, op.block, op.closure->run, op.closure->p, &why);
      e.last_kernel_device = d;
      e.last_kernel = op.kernel;
      {
        std::lock_guard<std::mutex> lk(e.log_mu);
        if (e.kernel_log.size() < 100000) e.kernel_log.push_back(op.kernel);
      }
      unsigned m = e.max_threads.load();
      while (op.block.x > m && !e.max_threads.compare_exchange_weak(m, op.block.x)) {
      }
      if (!ok) {
        x->err = zpp_emu::grid_error();
        fault_text(x, "%s", why.c_str());
      }
      return ok;
    });
    break;
  }
  case kOpCopy: {
    uint64_t allowed = device_bit(op.dst) | device_bit(op.src);
    run_device_op(d, allowed, [&](Exec *) {
      std::memmove(op.dst, op.src, op.bytes);
      return true;
    });
    break;
  }
  case kOpSet: {
    uint64_t allowed = device_bit(op.dst);
    run_device_op(d, allowed, [&](Exec *) {
      std::memset(op.dst, op.value, op.bytes);
      return true;
    });
    break;
  }
  case kOpAlloc: {
    std::lock_guard<std::mutex> lk(e.exec_mu);
    std::lock_guard<std::mutex> rl(e.reg_mu);
    auto it = e.reg.find(op.alloc);
    if (it != e.reg.end() && it->second.state == kPending) it->second.state = kLive;
    break;
  }
  case kOpFree: {
    std::lock_guard<std::mutex> lk(e.exec_mu);
    arena_release(op.alloc);
    break;
  }
  case kOpHostFn:
    t_in_host_fn = 1;
    op.fn(op.user);
    t_in_host_fn = 0;
    break;
  case kOpMarker:
    if (op.time) *op.time = now_ms();
    break;
  case kOpWait:
    break;
  case kOpWaitValue:
    wait_value(s, op);
    break;
  case kOpWriteValue: {
    uint32_t *w = static_cast<uint32_t *>(op.dst);
    uint32_t v = (uint32_t)op.value;
    // CU_STREAM_WRITE_VALUE_DEFAULT: "a memory fence before the write,
    // which has similar semantics to __threadfence_system()"
    if (device_bit(w) == 0) {  // pinned host memory
      __atomic_store_n(w, v, __ATOMIC_SEQ_CST);
      break;
    }
    uint64_t allowed;
    {
      std::lock_guard<std::mutex> lk(e.mu);
      allowed = allowed_for(d);
    }
    run_device_op(d, allowed, [&](Exec *) {
      __atomic_store_n(w, v, __ATOMIC_SEQ_CST);
      return true;
    });
    break;
  }
  }
}

bool delayed(OpKind k) { return k != kOpMarker && k != kOpWait && k != kOpWaitValue; }

void worker_main(Stream *s) {
  Emu &e = E();
  zpp_emu::prepare_thread();
  prctl(PR_SET_TIMERSLACK, 1UL);  // delays of a few microseconds stay short
  std::unique_lock<std::mutex> lk(e.mu);
  for (;;) {
    // no bound: a worker waits for work as long as its stream lives
    e.cv.wait(lk, [&] {
      return (!s->q.empty() && !s->held && deps_done(s->q.front())) ||
             (s->destroyed && s->q.empty());
    });
    if (s->q.empty()) break;  // destroyed and drained
    Op op = s->q.front();  // stays queued (not done) while it runs
    s->running = true;
    bool skip = e.dev[s->device].sticky != cudaSuccess;
    unsigned delay = e.cfg.delay_us.load();
    uint64_t r = next_rand(s->rng);
    lk.unlock();
    if (delayed(op.kind) && delay > 0 && !skip)
      std::this_thread::sleep_for(std::chrono::microseconds(r % (2ull * delay + 1)));
    if (!skip || op.kind == kOpMarker || op.kind == kOpWait) exec_op(s, op);
    lk.lock();
    s->q.pop_front();
    s->done = op.seq;
    s->running = false;
    e.cv.notify_all();
  }
  s->worker = false;
}

// Waits until s has done everything queued so far.  Caller holds lk.
bool stream_wait_locked(std::unique_lock<std::mutex> &lk, Stream *s) {
  uint64_t target = s->next;
  return wait_for(lk, [&] { return s->done >= target; });
}

// The work a sync of s must wait for: s itself and, for a legacy stream,
// the blocking streams of its device (as a legacy-stream operation would).
std::vector<Dep> sync_targets(Stream *s) {
  Emu &e = E();
  std::vector<Dep> t{{s, s->next}};
  if (s->legacy)
    for (Stream *b : e.streams)
      if (b != s && b->device == s->device && !b->legacy && !b->nonblocking)
        t.push_back({b, b->next});
  return t;
}

cudaError_t wait_deps(std::unique_lock<std::mutex> &lk, const std::vector<Dep> &t) {
  bool ok = wait_for(lk, [&] {
    for (const Dep &d : t)
      if (d.s->done < d.seq) return false;
    return true;
  });
  return ok ? cudaSuccess : cudaErrorTimeout;
}

cudaError_t device_wait_locked(std::unique_lock<std::mutex> &lk, int device) {
  Emu &e = E();
  std::vector<Dep> t;
  for (Stream *b : e.streams)
    if (b->device == device) t.push_back({b, b->next});
  return wait_deps(lk, t);
}

// ---- copies ---------------------------------------------------------------------

bool host_side(const PtrInfo &i) { return !i.registered || i.a.kind != kDevice; }
bool device_side(const PtrInfo &i) {
  return i.registered && i.a.state != kFreed;  // device, managed or pinned
}

// Checks a copy's kind against what the pointers are and that device
// ranges lie inside their allocation.
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                       PtrInfo *di, PtrInfo *si) {
  *di = classify(dst);
  *si = classify(src);
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  for (const PtrInfo *i : {di, si}) {
    if (i->in_arena && (!i->registered || i->a.state == kFreed)) return cudaErrorInvalidValue;
    if (i->registered && i->a.kind == kDevice) {
      uintptr_t p = i == di ? (uintptr_t)dst : (uintptr_t)src;
      if (p < i->a.base || p + n > i->a.base + i->a.size) return cudaErrorInvalidValue;
    }
  }
  bool dd = di->registered && di->a.kind == kDevice, sd = si->registered && si->a.kind == kDevice;
  bool dm = di->registered && di->a.kind == kManaged, sm = si->registered && si->a.kind == kManaged;
  switch (kind) {
  case cudaMemcpyHostToHost:
    return dd || sd ? cudaErrorInvalidValue : cudaSuccess;
  case cudaMemcpyHostToDevice:
    return (dd || dm) && host_side(*si) ? cudaSuccess : cudaErrorInvalidValue;
  case cudaMemcpyDeviceToHost:
    return (sd || sm) && host_side(*di) ? cudaSuccess : cudaErrorInvalidValue;
  case cudaMemcpyDeviceToDevice:
    return device_side(*di) && device_side(*si) ? cudaSuccess : cudaErrorInvalidValue;
  case cudaMemcpyDefault:
    return cudaSuccess;
  default:
    return cudaErrorInvalidMemcpyDirection;
  }
}

cudaError_t copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t h,
                 bool sync) {
  Emu &e = E();
  PtrInfo di, si;
  cudaError_t err = check_copy(dst, src, n, kind, &di, &si);
  if (err != cudaSuccess) return err;
  std::unique_lock<std::mutex> lk(e.mu);
  Stream *s = resolve(h, &err);
  if (s == nullptr) return err;
  if ((err = e.dev[s->device].sticky) != cudaSuccess) return err;
  if (n == 0) return cudaSuccess;
  Op op;
  op.kind = kOpCopy;
  op.dst = dst;
  op.src = src;
  op.bytes = n;
  bool dst_device = di.registered && di.a.kind == kDevice;
  bool src_device = si.registered && si.a.kind == kDevice;
  bool dst_pageable = !di.registered && !di.in_arena;
  bool src_pageable = !si.registered && !si.in_arena;
  bool captured = s->capture != nullptr;
  bool dst_host = !di.registered || di.a.kind == kPinned;
  bool src_host = !si.registered || si.a.kind == kPinned;
  // cudaMemcpyAsync from pageable memory to the device: staged at the call,
  // so the caller may reuse the source as soon as it returns
  if (!sync && !captured && src_pageable && dst_device) {
    op.staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
    op.src = op.staged->data();
  }
  if ((err = enqueue(s, std::move(op))) != cudaSuccess) return err;
  {
    std::lock_guard<std::mutex> ll(e.log_mu);  // after mu, as elsewhere
    if (e.copy_log.size() < 100000) e.copy_log.push_back({dst, src, n});
  }
  // cudaMemcpy returns after the copy, except device to device;
  // cudaMemcpyAsync too for device to pageable memory and host to host
  bool wait = sync ? !(dst_device && src_device)
                   : !captured && ((src_device && dst_pageable) || (src_host && dst_host));
  if (wait) {
    if (!stream_wait_locked(lk, s)) return cudaErrorTimeout;
    return e.dev[s->device].sticky;
  }
  return cudaSuccess;
}

cudaError_t set(void *p, int value, size_t n, cudaStream_t h, bool sync) {
  Emu &e = E();
  PtrInfo pi = classify(p);
  if (n == 0) return cudaSuccess;
  if (!pi.registered || pi.a.state == kFreed) return cudaErrorInvalidValue;
  if ((uintptr_t)p + n > pi.a.base + pi.a.size) return cudaErrorInvalidValue;
  cudaError_t err;
  std::unique_lock<std::mutex> lk(e.mu);
  Stream *s = resolve(h, &err);
  if (s == nullptr) return err;
  if ((err = e.dev[s->device].sticky) != cudaSuccess) return err;
  Op op;
  op.kind = kOpSet;
  op.dst = p;
  op.value = value;
  op.bytes = n;
  if ((err = enqueue(s, std::move(op))) != cudaSuccess) return err;
  if (sync && pi.a.kind != kDevice) {
    if (!stream_wait_locked(lk, s)) return cudaErrorTimeout;
    return e.dev[s->device].sticky;
  }
  return cudaSuccess;
}

}  // namespace

// ==== the runtime API ==============================================================

ZPP_EMU_EXPORT cudaError_t cudaGetLastError(void) {
  g_calls[k_cudaGetLastError]++;
  Emu &e = E();
  cudaError_t s = sticky(t_device);
  cudaError_t r = t_last;
  t_last = cudaSuccess;
  (void)e;
  return s != cudaSuccess ? s : r;
}

ZPP_EMU_EXPORT cudaError_t cudaPeekAtLastError(void) {
  g_calls[k_cudaPeekAtLastError]++;
  E();
  cudaError_t s = sticky(t_device);
  return s != cudaSuccess ? s : t_last;
}

ZPP_EMU_EXPORT const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define ZPP_EMU_CASE(n) \
  case n:               \
    return #n;
    ZPP_EMU_CASE(cudaSuccess)
    ZPP_EMU_CASE(cudaErrorInvalidValue)
    ZPP_EMU_CASE(cudaErrorMemoryAllocation)
    ZPP_EMU_CASE(cudaErrorInitializationError)
    ZPP_EMU_CASE(cudaErrorInvalidConfiguration)
    ZPP_EMU_CASE(cudaErrorInvalidDevicePointer)
    ZPP_EMU_CASE(cudaErrorInvalidMemcpyDirection)
    ZPP_EMU_CASE(cudaErrorNoDevice)
    ZPP_EMU_CASE(cudaErrorInvalidDevice)
    ZPP_EMU_CASE(cudaErrorInvalidResourceHandle)
    ZPP_EMU_CASE(cudaErrorNotReady)
    ZPP_EMU_CASE(cudaErrorIllegalAddress)
    ZPP_EMU_CASE(cudaErrorMisalignedAddress)
    ZPP_EMU_CASE(cudaErrorPeerAccessAlreadyEnabled)
    ZPP_EMU_CASE(cudaErrorPeerAccessNotEnabled)
    ZPP_EMU_CASE(cudaErrorLaunchFailure)
    ZPP_EMU_CASE(cudaErrorNotPermitted)
    ZPP_EMU_CASE(cudaErrorNotSupported)
    ZPP_EMU_CASE(cudaErrorStreamCaptureUnsupported)
    ZPP_EMU_CASE(cudaErrorStreamCaptureInvalidated)
    ZPP_EMU_CASE(cudaErrorStreamCaptureIsolation)
    ZPP_EMU_CASE(cudaErrorStreamCaptureImplicit)
    ZPP_EMU_CASE(cudaErrorCapturedEvent)
    ZPP_EMU_CASE(cudaErrorStreamCaptureWrongThread)
    ZPP_EMU_CASE(cudaErrorTimeout)
    ZPP_EMU_CASE(cudaErrorUnknown)
#undef ZPP_EMU_CASE
  }
  return "cudaErrorUnknown";
}

ZPP_EMU_EXPORT const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInitializationError: return "initialization error";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevicePointer: return "invalid device pointer";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorMisalignedAddress: return "misaligned address";
  case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
  case cudaErrorPeerAccessNotEnabled: return "peer access has not been enabled";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorNotPermitted: return "operation not permitted";
  case cudaErrorNotSupported: return "operation not supported";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
  case cudaErrorStreamCaptureIsolation:
    return "dependency created on uncaptured work in another stream";
  case cudaErrorStreamCaptureImplicit:
    return "operation would make the legacy stream depend on a capturing blocking stream";
  case cudaErrorCapturedEvent:
    return "operation not permitted on an event last recorded in a capturing stream";
  case cudaErrorStreamCaptureWrongThread:
    return "attempt to terminate a thread-local capture sequence from another thread";
  case cudaErrorTimeout: return "wait operation timed out";
  default: return "unknown error";
  }
}

ZPP_EMU_EXPORT cudaError_t cudaGetDeviceCount(int *count) {
  API(cudaGetDeviceCount);
  if (count == nullptr) return ret(cudaErrorInvalidValue);
  *count = emu.cfg.devices;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaSetDevice(int device) {
  API(cudaSetDevice);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  t_device = device;
  // "This function will also immediately initialize the runtime state on
  // the primary context" (cuda_runtime_api.h, CUDA 12 and later)
  emu.ctx[device].store(true);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaGetDevice(int *device) {
  API(cudaGetDevice);
  if (device == nullptr) return ret(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceSynchronize(void) {
  API_CTX(cudaDeviceSynchronize);
  std::unique_lock<std::mutex> lk(emu.mu);
  cudaError_t err = device_wait_locked(lk, t_device);
  if (err == cudaSuccess) err = emu.dev[t_device].sticky;
  lk.unlock();
  if (err == cudaSuccess) pools_after_sync(t_device);
  return ret(err);
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device) {
  API(cudaDeviceGetPCIBusId);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  char buf[32];
  int n = snprintf(buf, sizeof buf, "0000:%02X:00.0", device + 1);
  if (id == nullptr || len <= n) return ret(cudaErrorInvalidValue);
  std::memcpy(id, buf, (size_t)n + 1);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *id) {
  API(cudaDeviceGetByPCIBusId);
  if (device == nullptr || id == nullptr) return ret(cudaErrorInvalidValue);
  unsigned dom = 0, bus = 0, dv = 0, fn = 0;
  if (sscanf(id, "%x:%x:%x.%x", &dom, &bus, &dv, &fn) != 4) {
    dom = 0;
    if (sscanf(id, "%x:%x.%x", &bus, &dv, &fn) != 3) return ret(cudaErrorInvalidValue);
  }
  if (dom != 0 || dv != 0 || fn != 0 || !valid_device((int)bus - 1))
    return ret(cudaErrorInvalidDevice);
  *device = (int)bus - 1;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  API(cudaDeviceCanAccessPeer);
  if (can == nullptr) return ret(cudaErrorInvalidValue);
  if (!valid_device(device) || !valid_device(peer)) return ret(cudaErrorInvalidDevice);
  *can = device != peer;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
  API_CTX(cudaDeviceEnablePeerAccess);
  if (flags != 0) return ret(cudaErrorInvalidValue);
  if (!valid_device(peer) || peer == t_device) return ret(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lk(emu.mu);
  bool &p = emu.dev[t_device].peer[peer];
  if (p) return ret(cudaErrorPeerAccessAlreadyEnabled);
  p = true;
  return cudaSuccess;
}

// ---- memory ----

ZPP_EMU_EXPORT cudaError_t cudaMalloc(void **p, size_t size) {
  API_CTX(cudaMalloc);
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  if (p == nullptr) return ret(cudaErrorInvalidValue);
  cudaError_t s = sticky(t_device);
  if (s != cudaSuccess) return ret(s);
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  return ret(arena_alloc(size, t_device, kLive, nullptr, p));
}

namespace {

// Device d's default pool (made at first use).  Caller holds reg_mu.
Pool *default_pool_locked(int d) {
  Emu &e = E();
  Device &dv = e.dev[d];
  if (dv.default_pool == nullptr) {
    dv.default_pool = new Pool;
    dv.default_pool->device = d;
    dv.default_pool->is_default = true;
    e.live_pools.insert(dv.default_pool);
  }
  return dv.default_pool;
}

// "By default, a device's current memory pool is its default memory pool."
// Caller holds reg_mu.
Pool *current_pool_locked(int d) {
  Device &dv = E().dev[d];
  return dv.current_pool != nullptr ? dv.current_pool : default_pool_locked(d);
}

// The live pool a handle names; nullptr if none.  Caller holds reg_mu.
Pool *pool_of(cudaMemPool_t h) {
  Pool *p = reinterpret_cast<Pool *>(h);
  return E().live_pools.count(p) ? p : nullptr;
}

// cudaMallocAsync (from pool h, or from the current pool of the stream's
// device when h is null): the memory exists from the allocation's point
// in the stream.
cudaError_t malloc_async(void **p, size_t size, cudaMemPool_t h_pool, cudaStream_t h) {
  Emu &emu = E();
  if (p == nullptr) return cudaErrorInvalidValue;
  cudaError_t err;
  int device;
  {
    std::lock_guard<std::mutex> lk(emu.mu);
    Stream *s = resolve(h, &err);
    if (s == nullptr) return err;
    if (s->capture) {  // not modelled: allocation nodes
      s->capture_broken = true;
      return cudaErrorStreamCaptureUnsupported;
    }
    if ((err = emu.dev[s->device].sticky) != cudaSuccess) return err;
    device = s->device;
  }
  Pool *pool;
  {
    std::lock_guard<std::mutex> rl(emu.reg_mu);
    pool = h_pool != nullptr ? pool_of(h_pool) : current_pool_locked(device);
  }
  if (pool == nullptr) return cudaErrorInvalidValue;
  if (size == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  void *q = nullptr;
  if ((err = arena_alloc(size, pool->device, kPending, pool, &q)) != cudaSuccess) return err;
  {
    std::lock_guard<std::mutex> lk(emu.mu);
    Stream *s = resolve(h, &err);
    if (s != nullptr) {
      Op op;
      op.kind = kOpAlloc;
      op.alloc = (uintptr_t)q;
      err = enqueue(s, std::move(op));
    }
  }
  if (err != cudaSuccess) {
    std::lock_guard<std::mutex> xl(emu.exec_mu);
    arena_release((uintptr_t)q);
    return err;
  }
  *p = q;
  return cudaSuccess;
}

}  // namespace

ZPP_EMU_EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t h) {
  API_CTX(cudaMallocAsync);
  return ret(malloc_async(p, size, nullptr, h));
}

ZPP_EMU_EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                                   cudaStream_t h) {
  API_CTX(cudaMallocFromPoolAsync);
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  return ret(malloc_async(p, size, pool, h));
}

ZPP_EMU_EXPORT cudaError_t cudaFree(void *p) {
  API_CTX(cudaFree);
  if (p == nullptr) return cudaSuccess;
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  PtrInfo i = classify(p);
  if (!i.registered || i.a.kind == kPinned || i.a.base != (uintptr_t)p || i.a.state == kFreed)
    return ret(cudaErrorInvalidValue);
  // "This API will not perform any implicit synchronization when the
  // pointer was allocated with ::cudaMallocAsync ... For all other
  // pointers, this API may perform implicit synchronization."
  // (cuda_runtime_api.h): the device finishes the work that may use p.
  if (!i.a.stream_ordered) {
    std::unique_lock<std::mutex> lk(emu.mu);
    cudaError_t err = device_wait_locked(lk, i.a.device);
    if (err != cudaSuccess) return ret(err);
  }
  if (i.a.kind == kManaged) {
    std::lock_guard<std::mutex> xl(emu.exec_mu);
    std::lock_guard<std::mutex> rl(emu.reg_mu);
    emu.reg.erase(i.a.base);
    munmap((void *)i.a.region, i.a.region_len);
  } else {
    std::lock_guard<std::mutex> xl(emu.exec_mu);
    arena_release(i.a.base);
  }
  return ret(sticky(t_device));
}

ZPP_EMU_EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t h) {
  API_CTX(cudaFreeAsync);
  if (p == nullptr) return cudaSuccess;
  PtrInfo i = classify(p);
  if (!i.registered || i.a.kind != kDevice || i.a.base != (uintptr_t)p || i.a.state == kFreed)
    return ret(cudaErrorInvalidValue);
  cudaError_t err;
  std::lock_guard<std::mutex> lk(emu.mu);
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return ret(err);
  Op op;
  op.kind = kOpFree;
  op.alloc = i.a.base;
  return ret(enqueue(s, std::move(op)));
}

// ---- memory pools ----

ZPP_EMU_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  API(cudaDeviceGetDefaultMemPool);
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  *pool = reinterpret_cast<cudaMemPool_t>(default_pool_locked(device));
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *pool, int device) {
  API(cudaDeviceGetMemPool);
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  *pool = reinterpret_cast<cudaMemPool_t>(current_pool_locked(device));
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t h) {
  API(cudaDeviceSetMemPool);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  Pool *p = pool_of(h);
  // "The memory pool must be local to the specified device."
  if (p == nullptr || p->device != device) return ret(cudaErrorInvalidValue);
  emu.dev[device].current_pool = p;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool,
                                             const struct cudaMemPoolProps *props) {
  API(cudaMemPoolCreate);
  if (pool == nullptr || props == nullptr) return ret(cudaErrorInvalidValue);
  // "reserved for future use, must be 0"
  for (unsigned char b : props->reserved)
    if (b != 0) return ret(cudaErrorInvalidValue);
  if (props->allocType != cudaMemAllocationTypePinned &&
      props->allocType != cudaMemAllocationTypeManaged)
    return ret(cudaErrorInvalidValue);
  // Pools of device memory without IPC handles are modelled; managed and
  // host pools and exportable ones are not.
  if (props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice ||
      props->handleTypes != cudaMemHandleTypeNone)
    return ret(cudaErrorNotSupported);
  if (!valid_device(props->location.id)) return ret(cudaErrorInvalidDevice);
  Pool *p = new Pool;
  p->device = props->location.id;
  p->max_size = props->maxSize;
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  emu.live_pools.insert(p);
  *pool = reinterpret_cast<cudaMemPool_t>(p);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t h) {
  API(cudaMemPoolDestroy);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  Pool *p = pool_of(h);
  // "A device's default memory pool cannot be destroyed."
  if (p == nullptr || p->is_default) return ret(cudaErrorInvalidValue);
  // "Destroying the current mempool of a device sets the default mempool of
  // that device as the current mempool for that device."
  if (emu.dev[p->device].current_pool == p) emu.dev[p->device].current_pool = nullptr;
  emu.live_pools.erase(p);
  p->live = false;
  // "the resources associated with the pool will be released automatically
  // once there are no more outstanding allocations" (arena_release); the
  // Pool itself stays, as its allocations point to it
  if (p->used == 0) pool_release_locked(p, 0);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t h, size_t keep) {
  API(cudaMemPoolTrimTo);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  Pool *p = pool_of(h);
  if (p == nullptr) return ret(cudaErrorInvalidValue);
  // "Releases memory back to the OS until the pool contains fewer than
  // minBytesToKeep reserved bytes, or there is no more memory that the
  // allocator can safely release."
  pool_release_locked(p, keep);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t h, enum cudaMemPoolAttr attr,
                                                   void *value) {
  API(cudaMemPoolSetAttribute);
  if (value == nullptr) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  Pool *p = pool_of(h);
  if (p == nullptr) return ret(cudaErrorInvalidValue);
  // The reuse attributes point to an int, the others to a cuuint64_t
  // (driver_types.h, cudaMemPoolAttr): read 8 bytes only for those.
  uint64_t v64 = 0;
  switch (attr) {
  case cudaMemPoolAttrReleaseThreshold:
  case cudaMemPoolAttrReservedMemHigh:
  case cudaMemPoolAttrUsedMemHigh:
    std::memcpy(&v64, value, sizeof v64);
    break;
  default:
    break;
  }
  switch (attr) {
  case cudaMemPoolReuseFollowEventDependencies:
  case cudaMemPoolReuseAllowOpportunistic:
  case cudaMemPoolReuseAllowInternalDependencies:
    p->reuse[attr - 1] = *static_cast<int *>(value);
    return cudaSuccess;
  case cudaMemPoolAttrReleaseThreshold:
    p->threshold = v64;
    return cudaSuccess;
  // "It is illegal to set this attribute to a non-zero value."
  case cudaMemPoolAttrReservedMemHigh:
    if (v64 != 0) return ret(cudaErrorInvalidValue);
    p->reserved_high = p->reserved;  // a watermark starts again from now
    return cudaSuccess;
  case cudaMemPoolAttrUsedMemHigh:
    if (v64 != 0) return ret(cudaErrorInvalidValue);
    p->used_high = p->used;
    return cudaSuccess;
  default:  // the current amounts are read-only
    return ret(cudaErrorInvalidValue);
  }
}

ZPP_EMU_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t h, enum cudaMemPoolAttr attr,
                                                   void *value) {
  API(cudaMemPoolGetAttribute);
  if (value == nullptr) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  Pool *p = pool_of(h);
  if (p == nullptr) return ret(cudaErrorInvalidValue);
  uint64_t v;
  switch (attr) {
  case cudaMemPoolReuseFollowEventDependencies:
  case cudaMemPoolReuseAllowOpportunistic:
  case cudaMemPoolReuseAllowInternalDependencies:
    *static_cast<int *>(value) = p->reuse[attr - 1];
    return cudaSuccess;
  case cudaMemPoolAttrReleaseThreshold:
    v = p->threshold;
    break;
  case cudaMemPoolAttrReservedMemCurrent:
    v = p->reserved;
    break;
  case cudaMemPoolAttrReservedMemHigh:
    v = p->reserved_high;
    break;
  case cudaMemPoolAttrUsedMemCurrent:
    v = p->used;
    break;
  case cudaMemPoolAttrUsedMemHigh:
    v = p->used_high;
    break;
  default:
    return ret(cudaErrorInvalidValue);
  }
  std::memcpy(value, &v, sizeof v);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaMallocHost(void **p, size_t size) {
  API_CTX(cudaMallocHost);
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  if (p == nullptr) return ret(cudaErrorInvalidValue);
  return ret(host_alloc(size, kPinned, p));
}

ZPP_EMU_EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags) {
  API_CTX(cudaHostAlloc);
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  if (p == nullptr || (flags & ~0x7u) != 0) return ret(cudaErrorInvalidValue);
  return ret(host_alloc(size, kPinned, p));
}

ZPP_EMU_EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned flags) {
  API_CTX(cudaMallocManaged);
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  if (p == nullptr || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
    return ret(cudaErrorInvalidValue);
  return ret(host_alloc(size, kManaged, p));
}

ZPP_EMU_EXPORT cudaError_t cudaFreeHost(void *p) {
  API_CTX(cudaFreeHost);
  if (p == nullptr) return cudaSuccess;
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  PtrInfo i = classify(p);
  if (!i.registered || i.a.kind != kPinned || i.a.base != (uintptr_t)p)
    return ret(cudaErrorInvalidValue);
  {
    // queued copies may still use it: every device finishes first
    std::unique_lock<std::mutex> lk(emu.mu);
    for (int d = 0; d < emu.cfg.devices; d++) {
      cudaError_t err = device_wait_locked(lk, d);
      if (err != cudaSuccess) return ret(err);
    }
  }
  std::lock_guard<std::mutex> rl(emu.reg_mu);
  emu.reg.erase(i.a.base);
  munmap((void *)i.a.region, i.a.region_len);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a,
                                                    const void *p) {
  API_CTX(cudaPointerGetAttributes);
  if (a == nullptr) return ret(cudaErrorInvalidValue);
  std::memset(a, 0, sizeof *a);
  PtrInfo i = classify(p);
  if (!i.registered || i.a.state == kFreed) {
    a->type = cudaMemoryTypeUnregistered;
    a->device = cudaInvalidDeviceId;
    a->hostPointer = const_cast<void *>(p);
    return cudaSuccess;
  }
  a->device = i.a.device;
  a->devicePointer = const_cast<void *>(p);
  switch (i.a.kind) {
  case kDevice:
    a->type = cudaMemoryTypeDevice;
    break;
  case kPinned:
    a->type = cudaMemoryTypeHost;
    a->hostPointer = const_cast<void *>(p);
    break;
  case kManaged:
    a->type = cudaMemoryTypeManaged;
    a->hostPointer = const_cast<void *>(p);
    break;
  }
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags) {
  API_CTX(cudaHostGetDevicePointer);
  if (dev == nullptr || flags != 0) return ret(cudaErrorInvalidValue);
  PtrInfo i = classify(host);
  if (!i.registered || i.a.kind != kPinned) return ret(cudaErrorInvalidValue);
  // every pinned allocation is mapped, at its host address (UVA)
  *dev = host;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                                      enum cudaMemcpyKind kind) {
  API_CTX(cudaMemcpy);
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  return ret(copy(dst, src, n, kind, nullptr, true));
}

ZPP_EMU_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                           enum cudaMemcpyKind kind, cudaStream_t s) {
  API_CTX(cudaMemcpyAsync);
  return ret(copy(dst, src, n, kind, s, false));
}

ZPP_EMU_EXPORT cudaError_t cudaMemset(void *p, int v, size_t n) {
  API_CTX(cudaMemset);
  if (cudaError_t u = unsafe_call()) return ret(u);  // during a capture
  return ret(set(p, v, n, nullptr, true));
}

ZPP_EMU_EXPORT cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  API_CTX(cudaMemsetAsync);
  return ret(set(p, v, n, s, false));
}

// ---- streams ----

ZPP_EMU_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *p, unsigned flags) {
  API_CTX(cudaStreamCreateWithFlags);
  if (p == nullptr || (flags & ~1u) != 0) return ret(cudaErrorInvalidValue);
  install_handlers();
  std::lock_guard<std::mutex> lk(emu.mu);
  if (emu.dev[t_device].sticky != cudaSuccess) return ret(emu.dev[t_device].sticky);
  *p = reinterpret_cast<cudaStream_t>(new_stream(t_device, flags & 1, false));
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *p) {
  API_CTX(cudaStreamCreate);
  g_calls[k_cudaStreamCreateWithFlags]--;  // counted once, as cudaStreamCreate
  return cudaStreamCreateWithFlags(p, cudaStreamDefault);
}

ZPP_EMU_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t h) {
  API_CTX(cudaStreamDestroy);
  if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread)
    return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  // returns at once; the queued work still runs (as the real runtime)
  emu.live_streams.erase(s);
  s->destroyed = true;
  s->held = false;
  emu.cv.notify_all();
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t h) {
  API_CTX(cudaStreamSynchronize);
  std::unique_lock<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if ((err = sync_use_locked(s)) != cudaSuccess) return ret(err);
  if ((err = wait_deps(lk, sync_targets(s))) != cudaSuccess) return ret(err);
  int device = s->device;
  if ((err = emu.dev[device].sticky) != cudaSuccess) return ret(err);
  lk.unlock();
  pools_after_sync(device);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaStreamQuery(cudaStream_t h) {
  API_CTX(cudaStreamQuery);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if ((err = sync_use_locked(s)) != cudaSuccess) return ret(err);
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return ret(err);
  for (const Dep &d : sync_targets(s))
    // cudaErrorNotReady is returned like any error, so it becomes the
    // thread's last error: cudaGetLastError "returns the last error that
    // has been produced by any of the runtime calls in the same instance
    // of the CUDA Runtime library in the host thread" (cuda_runtime_api.h),
    // and PyTorch clears it after a query for that reason
    // (c10/cuda/CUDAEvent.h: "ignore and clear the error if not ready").
    if (d.s->done < d.seq) return ret(cudaErrorNotReady);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned flags) {
  API_CTX(cudaStreamWaitEvent);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  Event *e = reinterpret_cast<Event *>(ev);
  if (!emu.live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  // cudaEventWaitExternal: "Event is captured in the graph as an external
  // event node when performing stream capture" (outside a capture it is a
  // plain wait; external nodes are not modelled)
  if (flags != cudaEventWaitDefault && flags != cudaEventWaitExternal)
    return ret(cudaErrorInvalidValue);
  if (flags == cudaEventWaitExternal && s->capture != nullptr) {
    std::fprintf(stderr, "zpp cuda emu: external event nodes of a capture are not modelled\n");
    return ret(cudaErrorNotSupported);
  }
  Stream *in = e->capture_id != 0 ? capture_of(e->capture_id) : nullptr;
  if (in != nullptr) {  // recorded in a running capture sequence
    if (s == in) return in->capture_broken ? ret(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
    std::fprintf(stderr, "zpp cuda emu: a wait on an event recorded in another stream's capture "
                         "(a capture across streams) is not modelled\n");
    return ret(cudaErrorNotSupported);
  }
  if (s->capture != nullptr && e->s != nullptr) {
    // driver_types.h, cudaErrorStreamCaptureIsolation: "A dependency would
    // have been created which crosses the capture sequence boundary."
    s->capture_broken = true;
    return ret(cudaErrorStreamCaptureIsolation);
  }
  if (e->s == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  Op op;
  op.kind = kOpWait;
  op.deps.push_back({e->s, e->seq});
  return ret(enqueue(s, std::move(op)));
}

ZPP_EMU_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *user) {
  API_CTX(cudaLaunchHostFunc);
  if (fn == nullptr) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return ret(err);
  Op op;
  op.kind = kOpHostFn;
  op.fn = fn;
  op.user = user;
  return ret(enqueue(s, std::move(op)));
}

// ---- events ----

ZPP_EMU_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *p, unsigned flags) {
  API_CTX(cudaEventCreateWithFlags);
  if (p == nullptr || (flags & ~7u) != 0) return ret(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
    return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(emu.mu);
  Event *e = new Event;
  e->device = t_device;
  e->flags = flags;
  emu.live_events.insert(e);
  *p = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaEventCreate(cudaEvent_t *p) {
  API_CTX(cudaEventCreate);
  g_calls[k_cudaEventCreateWithFlags]--;
  return cudaEventCreateWithFlags(p, cudaEventDefault);
}

ZPP_EMU_EXPORT cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t h) {
  API_CTX(cudaEventRecord);
  std::lock_guard<std::mutex> lk(emu.mu);
  Event *e = reinterpret_cast<Event *>(ev);
  if (!emu.live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if (s->device != e->device) return ret(cudaErrorInvalidResourceHandle);
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return ret(err);
  if (s->capture != nullptr) {
    // recorded inside a capture sequence: no node, and until the sequence
    // ends the event may be waited on in it, never queried or synchronised
    if (s->capture_broken) return ret(cudaErrorStreamCaptureInvalidated);
    e->s = nullptr;
    e->seq = 0;
    e->time.reset();
    e->capture_id = s->capture_id;
    return cudaSuccess;
  }
  Op op;
  op.kind = kOpMarker;
  auto t = std::make_shared<double>(-1.0);
  op.time = t;
  if ((err = enqueue(s, std::move(op))) != cudaSuccess) return ret(err);
  e->s = s;
  e->seq = s->next;
  e->time = t;
  e->capture_id = 0;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaEventQuery(cudaEvent_t ev) {
  API_CTX(cudaEventQuery);
  std::lock_guard<std::mutex> lk(emu.mu);
  Event *e = reinterpret_cast<Event *>(ev);
  if (!emu.live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t err = captured_event_use_locked(e);
  if (err != cudaSuccess) return ret(err);
  if (emu.dev[e->device].sticky != cudaSuccess) return ret(emu.dev[e->device].sticky);
  if (e->s == nullptr || e->s->done >= e->seq) return cudaSuccess;
  return ret(cudaErrorNotReady);  // the thread's last error (cudaStreamQuery)
}

ZPP_EMU_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  API_CTX(cudaEventSynchronize);
  std::unique_lock<std::mutex> lk(emu.mu);
  Event *e = reinterpret_cast<Event *>(ev);
  if (!emu.live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t cerr = captured_event_use_locked(e);
  if (cerr != cudaSuccess) return ret(cerr);
  if (e->s != nullptr) {
    Stream *s = e->s;
    uint64_t seq = e->seq;
    if (!wait_for(lk, [&] { return s->done >= seq; })) return ret(cudaErrorTimeout);
  }
  int device = e->device;
  cudaError_t err = emu.dev[device].sticky;
  if (err != cudaSuccess) return ret(err);
  lk.unlock();
  pools_after_sync(device);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  API_CTX(cudaEventDestroy);
  std::lock_guard<std::mutex> lk(emu.mu);
  Event *e = reinterpret_cast<Event *>(ev);
  if (!emu.live_events.count(e)) return ret(cudaErrorInvalidResourceHandle);
  emu.live_events.erase(e);
  delete e;  // a pending record completes without it (its marker owns the time)
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  API_CTX(cudaEventElapsedTime);
  std::lock_guard<std::mutex> lk(emu.mu);
  Event *ea = reinterpret_cast<Event *>(a), *eb = reinterpret_cast<Event *>(b);
  if (ms == nullptr) return ret(cudaErrorInvalidValue);
  if (!emu.live_events.count(ea) || !emu.live_events.count(eb) || ea->device != eb->device ||
      (ea->flags & cudaEventDisableTiming) || (eb->flags & cudaEventDisableTiming))
    return ret(cudaErrorInvalidResourceHandle);
  if (ea->s == nullptr || eb->s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (ea->s->done < ea->seq || eb->s->done < eb->seq) return ret(cudaErrorNotReady);
  *ms = (float)(*eb->time - *ea->time);
  return cudaSuccess;
}

// ---- graphs ----

ZPP_EMU_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode) {
  API_CTX(cudaStreamBeginCapture);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  // "Capture may not be initiated if \p stream is ::cudaStreamLegacy."
  if (s->legacy || s->capture) return ret(cudaErrorStreamCaptureUnsupported);
  s->capture = new Graph;
  s->capture_broken = false;
  s->capture_mode = mode;
  s->capture_thread = thread_id();
  s->capture_id = ++emu.next_capture_id;
  emu.capturing.insert(s);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *g) {
  API_CTX(cudaStreamEndCapture);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if (g == nullptr || s->capture == nullptr) return ret(cudaErrorInvalidValue);
  // "If the \p mode argument to ::cudaStreamBeginCapture was not
  // ::cudaStreamCaptureModeRelaxed, this call must be from the same thread"
  if (s->capture_mode != cudaStreamCaptureModeRelaxed && s->capture_thread != thread_id())
    return ret(cudaErrorStreamCaptureWrongThread);
  Graph *gr = s->capture;
  s->capture = nullptr;
  emu.capturing.erase(s);
  if (s->capture_broken) {
    delete gr;
    *g = nullptr;
    return ret(cudaErrorStreamCaptureInvalidated);
  }
  emu.live_graphs.insert(gr);
  *g = reinterpret_cast<cudaGraph_t>(gr);
  return cudaSuccess;
}

namespace {
cudaStreamCaptureStatus capture_status(const Stream *s) {
  if (s->capture == nullptr) return cudaStreamCaptureStatusNone;
  return s->capture_broken ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
}
}  // namespace

ZPP_EMU_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t h,
                                                 enum cudaStreamCaptureStatus *status) {
  API_CTX(cudaStreamIsCapturing);
  if (status == nullptr) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  // "if this is called on ::cudaStreamLegacy ... while a blocking stream on
  // the same device is capturing, it will return
  // ::cudaErrorStreamCaptureImplicit ... The blocking stream capture is not
  // invalidated."
  if ((err = legacy_use_locked(s, false)) != cudaSuccess) return ret(err);
  *status = capture_status(s);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t h,
                                                    enum cudaStreamCaptureStatus *status,
                                                    unsigned long long *id, cudaGraph_t *graph,
                                                    const cudaGraphNode_t **deps,
                                                    const cudaGraphEdgeData **edges,
                                                    size_t *ndeps) {
  API_CTX(cudaStreamGetCaptureInfo);
  // "If \p edgeData_out is non-NULL then \p dependencies_out must be as well."
  if (status == nullptr || (edges != nullptr && deps == nullptr)) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if ((err = legacy_use_locked(s, false)) != cudaSuccess) return ret(err);
  *status = capture_status(s);
  if (*status != cudaStreamCaptureStatusActive) return cudaSuccess;
  if (id != nullptr) *id = s->capture_id;
  if (graph != nullptr) *graph = reinterpret_cast<cudaGraph_t>(s->capture);
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (ndeps != nullptr) *ndeps = 0;
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  API(cudaThreadExchangeStreamCaptureMode);
  if (mode == nullptr ||
      (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
       *mode != cudaStreamCaptureModeRelaxed))
    return ret(cudaErrorInvalidValue);
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g,
                                                unsigned long long) {
  API_CTX(cudaGraphInstantiate);
  std::lock_guard<std::mutex> lk(emu.mu);
  Graph *gr = reinterpret_cast<Graph *>(g);
  if (x == nullptr || !emu.live_graphs.count(gr)) return ret(cudaErrorInvalidValue);
  Graph *copy = new Graph(*gr);
  emu.live_graphs.insert(copy);
  *x = reinterpret_cast<cudaGraphExec_t>(copy);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t h) {
  API_CTX(cudaGraphLaunch);
  std::lock_guard<std::mutex> lk(emu.mu);
  Graph *gr = reinterpret_cast<Graph *>(x);
  if (!emu.live_graphs.count(gr)) return ret(cudaErrorInvalidResourceHandle);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return ret(err);
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return ret(err);
  for (const Op &op : gr->ops)
    if ((err = enqueue(s, op)) != cudaSuccess) return ret(err);
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  API_CTX(cudaGraphExecDestroy);
  std::lock_guard<std::mutex> lk(emu.mu);
  Graph *gr = reinterpret_cast<Graph *>(x);
  if (!emu.live_graphs.erase(gr)) return ret(cudaErrorInvalidResourceHandle);
  delete gr;  // queued copies of its operations hold their closures
  return cudaSuccess;
}

ZPP_EMU_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  API_CTX(cudaGraphDestroy);
  std::lock_guard<std::mutex> lk(emu.mu);
  Graph *gr = reinterpret_cast<Graph *>(g);
  if (!emu.live_graphs.erase(gr)) return ret(cudaErrorInvalidResourceHandle);
  delete gr;
  return cudaSuccess;
}

// ---- kernel launch ----

ZPP_EMU_EXPORT cudaError_t zpp_emu_launch(const cudaLaunchConfig_t *cfg, const void *kernel,
                                          void (*run)(void *), void (*destroy)(void *),
                                          void *closure, const void *const *ptrs,
                                          size_t nptrs) {
  auto c = std::make_shared<Closure>();
  c->run = run;
  c->destroy = destroy;
  c->p = closure;  // freed by c whatever happens below
  API_CTX(cudaLaunchKernelEx);
  if (cfg == nullptr || kernel == nullptr) return ret(cudaErrorInvalidValue);
  const dim3 g = cfg->gridDim, b = cfg->blockDim;
  if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 ||
      (size_t)b.x * b.y * b.z > 1024 || g.y > 65535 || g.z > 65535)
    return ret(cudaErrorInvalidConfiguration);
  if (g.y != 1 || g.z != 1 || b.y != 1 || b.z != 1 || cfg->dynamicSmemBytes != 0 ||
      cfg->numAttrs != 0) {
    std::fprintf(stderr, "zpp cuda emu: a launch the emulator does not model "
                         "(2-D/3-D, dynamic shared memory or attributes)\n");
    return ret(cudaErrorNotSupported);
  }
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(cfg->stream, &err);
  if (s == nullptr) return ret(err);
  // "A kernel launch will fail if it is issued to a stream that is not
  // associated to the current device" (programming guide)
  if (s->device != t_device) return ret(cudaErrorInvalidResourceHandle);
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return ret(err);
  Op op;
  op.kind = kOpKernel;
  op.grid = g;
  op.block = b;
  op.kernel = kernel;
  op.closure = std::move(c);
  op.ptrs.assign(ptrs, ptrs + nptrs);
  return ret(enqueue(s, std::move(op)));
}

// ==== the driver API, reached through cudaGetDriverEntryPointByVersion ===========
//
// Typed with plain C types as a caller without cuda.h declares them:
// CUresult is int (its values are the cudaError_t values of the same
// names), CUstream is cudaStream_t, CUdeviceptr is unsigned long long,
// CUdevice is int.

namespace {

constexpr int kCuSuccess = 0, kCuInvalidValue = 1, kCuInvalidDevice = 101, kCuNotPermitted = 800,
              kCuNotSupported = 801;
constexpr unsigned kCuWaitValueFlush = 1u << 30;  // CU_STREAM_WAIT_VALUE_FLUSH
constexpr unsigned kCuWriteValueNoMemoryBarrier = 0x1;

// The 32-bit word at addr, for a stream memory operation: pinned host
// memory or live device memory.  cuda.h: "None of the operations accepts
// pointers to managed memory buffers".
int check_mem_op_word(unsigned long long addr) {
  if (addr == 0) return kCuInvalidValue;
  PtrInfo i = classify((const void *)addr);
  if (!i.registered || i.a.state == kFreed || i.a.kind == kManaged) return kCuInvalidValue;
  if (addr + 4 > i.a.base + i.a.size) return kCuInvalidValue;
  return kCuSuccess;
}

int enqueue_mem_op(cudaStream_t h, Op op) {
  Emu &emu = E();
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return (int)err;
  if ((err = emu.dev[s->device].sticky) != cudaSuccess) return (int)err;
  return (int)enqueue(s, std::move(op));
}

int emu_cuStreamWaitValue32(cudaStream_t stream, unsigned long long addr, uint32_t value,
                            unsigned flags) {
  g_calls[k_cuStreamWaitValue32]++;
  if (t_in_host_fn) return kCuNotPermitted;
  // CU_STREAM_WAIT_VALUE_FLUSH: "restricted to selected platforms"; the
  // emulated devices do not have it (CAN_FLUSH_REMOTE_WRITES is 0)
  if (flags & kCuWaitValueFlush) return kCuNotSupported;
  if (flags > 0x3) return kCuInvalidValue;
  int rc = check_mem_op_word(addr);
  if (rc != kCuSuccess) return rc;
  Op op;
  op.kind = kOpWaitValue;
  op.dst = (void *)addr;
  op.value = (int)value;
  op.flags = flags;
  return enqueue_mem_op(stream, std::move(op));
}

int emu_cuStreamWriteValue32(cudaStream_t stream, unsigned long long addr, uint32_t value,
                             unsigned flags) {
  g_calls[k_cuStreamWriteValue32]++;
  if (t_in_host_fn) return kCuNotPermitted;
  // CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER: "This flag is not supported
  // in the v2 API"
  if (flags == kCuWriteValueNoMemoryBarrier) return kCuNotSupported;
  if (flags != 0) return kCuInvalidValue;
  int rc = check_mem_op_word(addr);
  if (rc != kCuSuccess) return rc;
  Op op;
  op.kind = kOpWriteValue;
  op.dst = (void *)addr;
  op.value = (int)value;
  return enqueue_mem_op(stream, std::move(op));
}

// The per-thread (_ptsz) variants: stream 0 is the per-thread default
// stream.
cudaStream_t per_thread_default(cudaStream_t h) { return h == nullptr ? cudaStreamPerThread : h; }

int emu_cuStreamWaitValue32_ptsz(cudaStream_t stream, unsigned long long addr, uint32_t value,
                                 unsigned flags) {
  return emu_cuStreamWaitValue32(per_thread_default(stream), addr, value, flags);
}

int emu_cuStreamWriteValue32_ptsz(cudaStream_t stream, unsigned long long addr, uint32_t value,
                                  unsigned flags) {
  return emu_cuStreamWriteValue32(per_thread_default(stream), addr, value, flags);
}

int emu_cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active) {
  g_calls[k_cuDevicePrimaryCtxGetState]++;
  if (t_in_host_fn) return kCuNotPermitted;
  if (!valid_device(dev)) return kCuInvalidDevice;
  if (flags == nullptr || active == nullptr) return kCuInvalidValue;
  *flags = 0;  // cudaSetDeviceFlags is not modelled
  *active = E().ctx[dev].load() ? 1 : 0;
  return kCuSuccess;
}

// The driver version the emulated driver has (CUDA 13.0).
constexpr unsigned kDriverVersion = 13000;

struct DriverEntry {
  const char *symbol;
  unsigned since;  // the CUDA version of the function returned
  void *fn;
  void *fn_ptsz;  // its per-thread variant, if it has one
};

const DriverEntry kDriverEntries[] = {
    // the _v2 stream memory operations, since CUDA 11.7 (the v1 ones of
    // CUDA 8.0 are not modelled)
    {"cuStreamWaitValue32", 11070, (void *)&emu_cuStreamWaitValue32,
     (void *)&emu_cuStreamWaitValue32_ptsz},
    {"cuStreamWriteValue32", 11070, (void *)&emu_cuStreamWriteValue32,
     (void *)&emu_cuStreamWriteValue32_ptsz},
    {"cuDevicePrimaryCtxGetState", 7000, (void *)&emu_cuDevicePrimaryCtxGetState, nullptr},
};

}  // namespace

ZPP_EMU_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(
    const char *symbol, void **fn, unsigned cuda_version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *status) {
  API(cudaGetDriverEntryPointByVersion);
  if (symbol == nullptr || fn == nullptr) return ret(cudaErrorInvalidValue);
  *fn = nullptr;
  // "If the specified CUDA version is greater than the driver version, the
  // API will return ::cudaErrorInvalidValue."
  if (cuda_version > kDriverVersion || flags > cudaEnablePerThreadDefaultStream)
    return ret(cudaErrorInvalidValue);
  // "The API will return ::cudaSuccess and set the returned \p funcPtr to
  // NULL if the requested driver function is not supported on the
  // platform, no ABI compatible driver function exists for the requested
  // version or if the driver symbol is invalid."
  enum cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
  for (const DriverEntry &d : kDriverEntries) {
    if (std::strcmp(symbol, d.symbol) != 0) continue;
    if (cuda_version < d.since) {
      r = cudaDriverEntryPointVersionNotSufficent;
    } else {
      r = cudaDriverEntryPointSuccess;
      // cudaEnablePerThreadDefaultStream: "If a per-thread version is not
      // found, the API will return the legacy version of the driver
      // function."  cudaEnableDefault is the legacy search here: the
      // emulated header has no per-thread compilation mode.
      *fn = flags == cudaEnablePerThreadDefaultStream && d.fn_ptsz ? d.fn_ptsz : d.fn;
    }
    break;
  }
  if (status != nullptr) *status = r;
  return cudaSuccess;
}

// ==== test hooks (zpp_cuda_emu.h) ===================================================

namespace {
cudaError_t hold(cudaStream_t h, bool on) {
  Emu &emu = E();
  std::lock_guard<std::mutex> lk(emu.mu);
  cudaError_t err;
  Stream *s = resolve(h, &err);
  if (s == nullptr) return err;
  s->held = on;
  emu.cv.notify_all();
  return cudaSuccess;
}
}  // namespace

ZPP_EMU_EXPORT cudaError_t zpp_emu_stream_hold(cudaStream_t s) { return hold(s, true); }
ZPP_EMU_EXPORT cudaError_t zpp_emu_stream_release(cudaStream_t s) { return hold(s, false); }

ZPP_EMU_EXPORT unsigned long zpp_emu_api_calls(const char *name) {
  for (int i = 0; i < kApiCount; i++)
    if (name && std::strcmp(name, kApiNames[i]) == 0) return g_calls[i].load();
  return 0;
}

ZPP_EMU_EXPORT void zpp_emu_reset_api_calls(void) {
  for (auto &c : g_calls) c = 0;
}

ZPP_EMU_EXPORT int zpp_emu_last_kernel_device(void) { return E().last_kernel_device.load(); }
ZPP_EMU_EXPORT const void *zpp_emu_last_kernel(void) { return E().last_kernel.load(); }

ZPP_EMU_EXPORT size_t zpp_emu_kernel_log(const void **out, size_t max) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.log_mu);
  for (size_t i = 0; i < max && i < e.kernel_log.size(); i++) out[i] = e.kernel_log[i];
  return e.kernel_log.size();
}

ZPP_EMU_EXPORT void zpp_emu_kernel_log_clear(void) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.log_mu);
  e.kernel_log.clear();
}

ZPP_EMU_EXPORT size_t zpp_emu_copy_log(struct zpp_emu_copy *out, size_t max) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.log_mu);
  for (size_t i = 0; i < max && i < e.copy_log.size(); i++) out[i] = e.copy_log[i];
  return e.copy_log.size();
}

ZPP_EMU_EXPORT void zpp_emu_copy_log_clear(void) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.log_mu);
  e.copy_log.clear();
}

ZPP_EMU_EXPORT unsigned zpp_emu_max_block_threads(void) { return E().max_threads.load(); }

ZPP_EMU_EXPORT const char *zpp_emu_last_fault(void) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.log_mu);
  thread_local std::string copy;
  copy = e.last_fault;
  return copy.c_str();
}

ZPP_EMU_EXPORT void zpp_emu_clear_sticky_error(int device) {
  Emu &e = E();
  std::lock_guard<std::mutex> lk(e.mu);
  if (valid_device(device)) e.dev[device].sticky = cudaSuccess;
  std::lock_guard<std::mutex> ll(e.log_mu);
  e.last_fault.clear();
}

ZPP_EMU_EXPORT unsigned zpp_emu_set_delay_us(unsigned us) { return E().cfg.delay_us.exchange(us); }

ZPP_EMU_EXPORT unsigned zpp_emu_set_timeout_s(unsigned s) { return E().cfg.timeout_s.exchange(s); }

ZPP_EMU_EXPORT unsigned long zpp_emu_mempool_releases(int device) {
  Emu &e = E();
  std::lock_guard<std::mutex> rl(e.reg_mu);
  return valid_device(device) ? e.dev[device].pool_releases : 0;
}

ZPP_EMU_EXPORT unsigned long long zpp_emu_mempool_reserved(int device) {
  Emu &e = E();
  std::lock_guard<std::mutex> rl(e.reg_mu);
  unsigned long long n = 0;
  for (Pool *p : e.live_pools)
    if (p->device == device) n += p->reserved;
  return n;
}

ZPP_EMU_EXPORT int zpp_emu_context_active(int device) {
  return valid_device(device) && E().ctx[device].load() ? 1 : 0;
}

ZPP_EMU_EXPORT void zpp_emu_reset_contexts(void) {
  Emu &e = E();
  for (auto &c : e.ctx) c.store(false);
}
