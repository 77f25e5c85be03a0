// Tests of the device block quantizer (zpp_quant_*_device, the kernels of
// src/kernels/quant_cuda.cu) against the CPU reference, bit for bit:
// the encoded bytes with memcmp, the decoded outputs and accumulators
// element by element (NaN == NaN: the device may return another NaN
// payload).  Also: the bytes past every output stay untouched, host
// pointers are refused, managed memory and unaligned device pointers work,
// and all work goes to the caller's stream (a stream synchronised alone,
// and a stream captured into a CUDA graph).
//
// Every test skips with "no CUDA device: ..." when zpp_cuda_available() is
// 0, and runs for real on a machine with a GPU (perf/gpu_check.sh), or on
// the emulated CUDA runtime in an emulated build (ZPP_CUDA_EMU).
// Seed: ZPP_TEST_SEED (default 20261129), printed by every test.
#include <gtest/gtest.h>

#include <zpp/zpp.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/core.h"
#include "quant/quant.h"
#include "kernels/quant_cpu.h"
#include "quant_cuda_testdata.h"
#include "kernels/quant_math.h"
#include "kernels/transform.h"
#include "kernels/elementwise.h"
#if ZPP_TEST_CUDA_EMU
#include "zpp_cuda_emu.h"
#endif

namespace {

using namespace zpp_test;

std::string no_device_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (e != cudaSuccess)
    return std::string("no CUDA device: cudaGetDeviceCount: ") + cudaGetErrorString(e);
  return "no CUDA device: zpp_cuda_available() is 0 (devices: " + std::to_string(n) + ")";
}

#define ZPP_SKIP_WITHOUT_DEVICE() \
  do {                            \
    if (!zpp_cuda_available()) GTEST_SKIP() << no_device_reason(); \
  } while (0)

#define CUDA_OK(call)                                                              \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);         \
  } while (0)

// Device memory, freed on scope exit.
struct DevBuf {
  uint8_t *p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
  }
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

zpp_quant_config_t make_cfg(int bits, size_t block, bool asym) {
  zpp_quant_config_t c = ZPP_QUANT_CONFIG_INIT;
  c.bits = bits;
  c.block_size = block;
  c.mode = asym ? ZPP_QUANT_ASYMMETRIC : ZPP_QUANT_SYMMETRIC;
  return c;
}

// The longest input of the tests.  An emulated build (ZPP_CUDA_EMU, where a
// CPU runs every CUDA thread) shortens it: tests/quant_device_emu.cmake.
#ifndef ZPP_TEST_QUANT_CUDA_LONG
#define ZPP_TEST_QUANT_CUDA_LONG (((size_t)1 << 24) + 43)
#endif
const size_t kLong = ZPP_TEST_QUANT_CUDA_LONG;

// Host and device copies of one random input per dtype, made once.
struct Input {
  std::vector<uint8_t> host;
  DevBuf *dev = nullptr;
};
std::map<int, Input> &inputs() {
  static std::map<int, Input> m;
  return m;
}
const Input &input_for(int dt) {
  Input &in = inputs()[dt];
  if (in.dev == nullptr) {
    in.host = make_input(test_seed(), dt, kLong);
    in.dev = new DevBuf(in.host.size());
    if (in.dev->p)
      cudaMemcpy(in.dev->p, in.host.data(), in.host.size(), cudaMemcpyHostToDevice);
  }
  return in;
}
const std::vector<float> &acc_start() {
  static std::vector<float> a = make_acc(test_seed(), kLong);
  return a;
}

class FreeInputs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (auto &kv : inputs()) delete kv.second.dev;
    inputs().clear();
  }
};
[[maybe_unused]] const auto *const kFreeInputs = ::testing::AddGlobalTestEnvironment(new FreeInputs);

// The CPU reference, run on blocks split over the host's cores (the
// scalar codec is the definition every path is tested against).
void parallel_blocks(size_t nb, const std::function<void(size_t, size_t)> &f) {
  unsigned nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  if (nb < 64 || nt == 1) {
    f(0, nb);
    return;
  }
  std::vector<std::thread> th;
  for (unsigned i = 0; i < nt; i++) {
    size_t b0 = nb * i / nt, b1 = nb * (i + 1) / nt;
    th.emplace_back([&f, b0, b1] { f(b0, b1); });
  }
  for (auto &t : th) t.join();
}

void cpu_encode(const zpp_qcfg_t &q, int dt, const void *src, size_t n, uint8_t *dst) {
  parallel_blocks(zpp_quant_nblocks(&q, n), [&](size_t b0, size_t b1) {
    zpp_quant_encode_blocks_scalar(&q, dt, src, n, b0, b1, dst);
  });
}
void cpu_decode(const zpp_qcfg_t &q, const uint8_t *src, size_t n, int kind, void *dst) {
  parallel_blocks(zpp_quant_nblocks(&q, n), [&](size_t b0, size_t b1) {
    zpp_quant_decode_blocks_scalar(&q, src, n, b0, b1, kind, dst);
  });
}

constexpr size_t kGuard = 64;       // bytes checked past every device output
constexpr uint8_t kPoison = 0xa5;

bool guard_intact(const std::vector<uint8_t> &buf, size_t from) {
  for (size_t i = from; i < buf.size(); i++)
    if (buf[i] != kPoison) return false;
  return true;
}

// Byte offsets of the device buffers from their (256-byte aligned) start.
struct Offsets {
  size_t src = 0, enc = 0, out = 0;
};

// One case: device encode against the CPU, then every decode kind from the
// device's encoding against the CPU decode.  All work is on stream st,
// which alone is synchronised.
void check_case(int dt, int bits, bool asym, size_t block, size_t n, cudaStream_t st,
                Offsets o = Offsets()) {
  const std::string ctx = describe(dt, bits, asym, block, n) + " offsets src " +
                          std::to_string(o.src) + " enc " + std::to_string(o.enc) +
                          " out " + std::to_string(o.out);
  SCOPED_TRACE(ctx);
  ASSERT_LE(n, kLong) << "the inputs hold kLong elements";
  const Input &in = input_for(dt);
  ASSERT_NE(in.dev->p, nullptr) << "cudaMalloc of the input failed";
  const zpp_quant_config_t cfg = make_cfg(bits, block, asym);
  const zpp_qcfg_t q = {bits, asym ? 1 : 0, block, 0, 0, 0, 0};
  size_t sz = 0;
  ASSERT_EQ(zpp_quant_encoded_size(&cfg, n, &sz), ZPP_OK);
  const size_t es = dtype_size(dt);

  // input at its offset (a copy when the offset is not 0)
  DevBuf shifted(o.src ? n * es + o.src : 0);
  const uint8_t *d_src = in.dev->p;
  if (o.src) {
    ASSERT_NE(shifted.p, nullptr);
    CUDA_OK(cudaMemcpyAsync(shifted.p + o.src, in.dev->p, n * es,
                            cudaMemcpyDeviceToDevice, st));
    d_src = shifted.p + o.src;
  }

  std::vector<uint8_t> ref(sz);
  if (n) cpu_encode(q, dt, in.host.data(), n, ref.data());
  DevBuf d_enc(o.enc + sz + kGuard);
  ASSERT_NE(d_enc.p, nullptr);
  CUDA_OK(cudaMemsetAsync(d_enc.p, kPoison, d_enc.n, st));
  ASSERT_EQ(zpp_quant_encode_device(&cfg, (zpp_dtype_t)dt, n ? d_src : nullptr, n,
                                    n ? d_enc.p + o.enc : nullptr, sz, st),
            ZPP_OK)
      << zpp_get_last_error();
  std::vector<uint8_t> got(sz + kGuard);
  CUDA_OK(cudaMemcpyAsync(got.data(), d_enc.p + o.enc, got.size(), cudaMemcpyDeviceToHost, st));
  CUDA_OK(cudaStreamSynchronize(st));
  if (std::memcmp(ref.data(), got.data(), sz) != 0) {
    size_t i = 0;
    while (ref[i] == got[i]) i++;
    size_t meta = zpp_quant_nblocks(&q, n) * (asym ? 8 : 4);
    FAIL() << "encoded byte " << i << " of " << sz << " is " << (int)got[i]
           << ", CPU " << (int)ref[i] << (i < meta ? " (metadata of block " : " (payload")
           << (i < meta ? std::to_string(i / (asym ? 8 : 4)) + ")" : ")");
  }
  ASSERT_TRUE(guard_intact(got, sz)) << "encode wrote past the encoded size";

  const int kinds[] = {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16, ZPP_QM_OUT_ACC};
  for (int kind : kinds) {
    SCOPED_TRACE(std::string("decode to ") + kind_name(kind));
    const size_t w = out_size(kind);
    std::vector<uint8_t> dref(n * w), dgot(n * w + kGuard);
    DevBuf d_out(o.out + n * w + kGuard);
    ASSERT_NE(d_out.p, nullptr);
    CUDA_OK(cudaMemsetAsync(d_out.p, kPoison, d_out.n, st));
    if (kind == ZPP_QM_OUT_ACC && n) {
      std::memcpy(dref.data(), acc_start().data(), 4 * n);
      CUDA_OK(cudaMemcpyAsync(d_out.p + o.out, acc_start().data(), 4 * n,
                              cudaMemcpyHostToDevice, st));
    }
    if (n) cpu_decode(q, ref.data(), n, kind, dref.data());
    zpp_status_t rc =
        kind == ZPP_QM_OUT_ACC
            ? zpp_quant_decode_accumulate_device(&cfg, n ? d_enc.p + o.enc : nullptr, sz, n,
                                                 n ? (float *)(d_out.p + o.out) : nullptr, st)
            : zpp_quant_decode_device(&cfg, n ? d_enc.p + o.enc : nullptr, sz, n,
                                      (zpp_dtype_t)kind, n ? d_out.p + o.out : nullptr, st);
    ASSERT_EQ(rc, ZPP_OK) << zpp_get_last_error();
    CUDA_OK(cudaMemcpyAsync(dgot.data(), d_out.p + o.out, dgot.size(),
                            cudaMemcpyDeviceToHost, st));
    CUDA_OK(cudaStreamSynchronize(st));
    if (std::memcmp(dref.data(), dgot.data(), n * w) != 0) {
      size_t i = first_mismatch(dref.data(), dgot.data(), n, (int)kind);
      if (i < n) {
        uint32_t a = 0, b = 0;
        std::memcpy(&a, &dref[w * i], w);
        std::memcpy(&b, &dgot[w * i], w);
        FAIL() << "element " << i << " (block " << i / block << ") has bits 0x" << std::hex
               << b << ", CPU 0x" << a;
      }
    }
    ASSERT_TRUE(guard_intact(dgot, n * w)) << "decode wrote past the output";
  }
}

// ---- every dtype x width x mode x block size x length ----------------------

struct Case {
  int dt, bits;
  bool asym;
  size_t block;
};

std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t block : {(size_t)1, (size_t)3, (size_t)32, (size_t)256, (size_t)4096,
                             (size_t)1 << 20})
          v.push_back({dt, bits, asym, block});
  return v;
}

std::string CaseName(const ::testing::TestParamInfo<Case> &i) {
  const Case &c = i.param;
  return std::string(c.dt == ZPP_QM_F32 ? "fp32" : c.dt == ZPP_QM_F16 ? "fp16" : "bf16") +
         "_int" + std::to_string(c.bits) + (c.asym ? "_asym" : "_sym") + "_block" +
         std::to_string(c.block);
}

class QuantCuda : public ::testing::TestWithParam<Case> {};

TEST_P(QuantCuda, EncodeAndDecodeAreBitwiseEqualToCpu) {
  ZPP_SKIP_WITHOUT_DEVICE();
  const Case c = GetParam();
  print_seed("QuantCuda");
  Stream st;
  ASSERT_NE(st.s, nullptr);
  for (size_t n : {(size_t)0, (size_t)1, (size_t)7, (size_t)4097, (size_t)1000003, kLong}) {
    check_case(c.dt, c.bits, c.asym, c.block, n, st.s);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(All, QuantCuda, ::testing::ValuesIn(AllCases()), CaseName);

// ---- the paths for long blocks ------------------------------------------------

// Blocks over one segment (8192 elements): many of them (one looping CTA per
// block), few of them (split over CTAs), odd lengths (no vector access).
TEST(QuantCudaPaths, LongBlocksAreBitwiseEqualToCpu) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaPaths");
  Stream st;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16})
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t block : {(size_t)8193, (size_t)16384, (size_t)20000}) {
          check_case(dt, bits, asym, block, kLong, st.s);  // >= 1024 blocks: looping
          check_case(dt, bits, asym, block, 100003, st.s);  // few blocks: split
          if (HasFailure()) return;
        }
}

// Device pointers off their vector alignment, off their element size, and
// encoded buffers off 4 bytes: the same bytes as the CPU.
TEST(QuantCudaPaths, UnalignedDevicePointersGiveTheSameBytes) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaPaths unaligned");
  Stream st;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16}) {
    const size_t es = dtype_size(dt);
    const Offsets offs[] = {{es, 0, 0}, {1, 1, 1}, {0, 2, 2}, {0, 4, 4}, {2 * es, 8, 8}};
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t block : {(size_t)3, (size_t)256, (size_t)1 << 20})
          for (Offsets o : offs) {
            check_case(dt, bits, asym, block, 3 * ((size_t)1 << 20) + 5, st.s, o);
            if (HasFailure()) return;
          }
  }
}

// ---- pointers -------------------------------------------------------------------

TEST(QuantCudaPointers, HostPointersAreRefusedAndNamed) {
  ZPP_SKIP_WITHOUT_DEVICE();
  zpp_quant_config_t cfg = make_cfg(8, 32, false);
  const size_t n = 100;
  size_t sz = 0;
  ASSERT_EQ(zpp_quant_encoded_size(&cfg, n, &sz), ZPP_OK);
  std::vector<float> h_src(n, 1.0f), h_acc(n, 0.0f);
  std::vector<uint8_t> h_enc(sz);
  DevBuf d_src(4 * n), d_enc(sz);
  void *pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, sz));
  auto expect_refused = [](zpp_status_t st, const char *what) {
    EXPECT_EQ(st, ZPP_ERR_INVALID_ARGUMENT) << what;
    std::string msg = zpp_get_last_error();
    EXPECT_NE(msg.find(what), std::string::npos) << "message \"" << msg << "\" should name " << what;
    EXPECT_NE(msg.find("not device memory"), std::string::npos) << msg;
  };
  expect_refused(zpp_quant_encode_device(&cfg, ZPP_FLOAT32, h_src.data(), n, d_enc.p, sz, nullptr),
                 "src");
  expect_refused(zpp_quant_encode_device(&cfg, ZPP_FLOAT32, d_src.p, n, h_enc.data(), sz, nullptr),
                 "dst");
  expect_refused(zpp_quant_encode_device(&cfg, ZPP_FLOAT32, d_src.p, n, pinned, sz, nullptr),
                 "dst");
  expect_refused(zpp_quant_decode_device(&cfg, h_enc.data(), sz, n, ZPP_FLOAT32, d_src.p, nullptr),
                 "src");
  expect_refused(zpp_quant_decode_device(&cfg, d_enc.p, sz, n, ZPP_BFLOAT16, h_src.data(), nullptr),
                 "dst");
  expect_refused(zpp_quant_decode_accumulate_device(&cfg, d_enc.p, sz, n, h_acc.data(), nullptr),
                 "acc");
  cudaFreeHost(pinned);
  // argument errors come before the pointer checks, as on the host
  EXPECT_EQ(zpp_quant_encode_device(&cfg, ZPP_FLOAT32, d_src.p, n, d_enc.p, sz - 1, nullptr),
            ZPP_ERR_BUFFER_TOO_SMALL);
  // count 0 is a no-op that accepts NULL buffers
  EXPECT_EQ(zpp_quant_encode_device(&cfg, ZPP_FLOAT32, nullptr, 0, nullptr, 0, nullptr), ZPP_OK);
  EXPECT_EQ(zpp_quant_decode_accumulate_device(&cfg, nullptr, 0, 0, nullptr, nullptr), ZPP_OK);
}

TEST(QuantCudaPointers, ManagedMemoryIsAccepted) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaPointers managed");
  const size_t n = 70001;
  zpp_quant_config_t cfg = make_cfg(4, 256, true);
  const zpp_qcfg_t q = {4, 1, 256, 0, 0, 0, 0};
  size_t sz = 0;
  ASSERT_EQ(zpp_quant_encoded_size(&cfg, n, &sz), ZPP_OK);
  const Input &in = input_for(ZPP_QM_BF16);
  uint8_t *m_src = nullptr, *m_enc = nullptr;
  CUDA_OK(cudaMallocManaged(&m_src, 2 * n));
  CUDA_OK(cudaMallocManaged(&m_enc, sz));
  std::memcpy(m_src, in.host.data(), 2 * n);
  std::vector<uint8_t> ref(sz);
  cpu_encode(q, ZPP_QM_BF16, in.host.data(), n, ref.data());
  EXPECT_EQ(zpp_quant_encode_device(&cfg, ZPP_BFLOAT16, m_src, n, m_enc, sz, nullptr), ZPP_OK)
      << zpp_get_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(std::memcmp(ref.data(), m_enc, sz), 0);
  cudaFree(m_src);
  cudaFree(m_enc);
}

// ---- streams ---------------------------------------------------------------------

// A non-blocking stream, synchronised alone, for the three encode paths
// (check_case does all its work on the stream it is given).
TEST(QuantCudaStream, WorkRunsOnTheCallersStream) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaStream");
  Stream st;
  ASSERT_NE(st.s, nullptr);
  check_case(ZPP_QM_F32, 8, true, 256, 1000003, st.s);
  check_case(ZPP_QM_BF16, 4, false, (size_t)1 << 20, 3 * ((size_t)1 << 20) + 5, st.s);
  check_case(ZPP_QM_F16, 8, false, 16384, kLong, st.s);
}

// A query of unfinished work returns cudaErrorNotReady, and the runtime
// records it as the thread's last error like any other
// (cuda_runtime_api.h, cudaGetLastError: "the last error that has been
// produced by any of the runtime calls ... in the host thread").  It is no
// failure of a later launch: the element-wise and Hadamard launchers
// report their own launch's result, and zpp's own event query clears it.
// On the emulator the busy stream is held, so the query is not ready for
// sure; on a GPU a 256 MiB memset is usually still running (else skipped).
TEST(QuantCudaStream, AStaleNotReadyIsNoLaunchError) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaStream not ready");
  Stream busy, st;
  ASSERT_NE(busy.s, nullptr);
  ASSERT_NE(st.s, nullptr);
  const size_t n = 4096 + 3, g = 64;
#if ZPP_TEST_CUDA_EMU
  CUDA_OK(zpp_emu_stream_hold(busy.s));
#else
  const size_t big = (size_t)256 << 20;
  DevBuf fill(big);
  ASSERT_NE(fill.p, nullptr);
  CUDA_OK(cudaMemsetAsync(fill.p, 0, big, busy.s));
#endif
  cudaEvent_t ev;
  CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(ev, busy.s));
  cudaError_t q = cudaEventQuery(ev);
  if (q == cudaSuccess) {
    cudaEventDestroy(ev);
    GTEST_SKIP() << "the busy stream finished before the query";
  }
  ASSERT_EQ(q, cudaErrorNotReady);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorNotReady)
      << "the runtime keeps cudaErrorNotReady as the last error";
  // Launches on another stream succeed and compute the CPU's bits.
  std::vector<float> x(n), want(n), got(n), acc(n);
  Rng r(test_seed() + 91);
  for (size_t i = 0; i < n; i++) x[i] = (float)(r.uniform() * 8.0 - 4.0);
  zpp_tf_hadamard_scalar(g, ZPP_QM_F32, x.data(), n, want.data());
  DevBuf dx(n * 4), dy(n * 4), dz(n * 2);
  ASSERT_NE(dx.p, nullptr);
  CUDA_OK(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice));
  char err[256] = "";
  EXPECT_EQ(zpp_tf_hadamard_device(g, ZPP_QM_F32, dx.p, n, (float *)dy.p, st.s,
                                   err, sizeof err),
            0)
      << err;
  EXPECT_EQ(zpp_ew_finish_device((const float *)dx.p, n, 3.0f, ZPP_QM_BF16,
                                 dz.p, st.s, err, sizeof err),
            0)
      << err;
  CUDA_OK(cudaStreamSynchronize(st.s));
  CUDA_OK(cudaMemcpy(got.data(), dy.p, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * 4)) << "Hadamard";
  std::vector<uint16_t> z(n);
  CUDA_OK(cudaMemcpy(z.data(), dz.p, n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    uint16_t w = zpp_qm_f32_to_bf16(x[i] / 3.0f);
    ASSERT_EQ(z[i], w) << "finish, element " << i;
  }
  // zpp's own query of unfinished work leaves no error behind.
  (void)cudaGetLastError();
  int done = 1;
  EXPECT_EQ(zpp_ew_event_query(ev, &done, err, sizeof err), 0) << err;
#if ZPP_TEST_CUDA_EMU
  EXPECT_EQ(done, 0);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess)
      << "zpp_ew_event_query left cudaErrorNotReady behind";
  CUDA_OK(zpp_emu_stream_release(busy.s));
#endif
  CUDA_OK(cudaStreamSynchronize(busy.s));
  cudaEventDestroy(ev);
}

// The kernels' scratch (zpp_ew_alloc_device, stream-ordered) comes from a
// pool of zpp's own whose release threshold keeps it reserved: the
// device's default pool, whose threshold is 0 ("the allocator will try to
// release memory back to the OS on the next call to stream, event or
// context synchronize. (default 0)", driver_types.h), would hand it back
// at every synchronisation and map it again at the next call.  The
// application's default pool is left as it was.
TEST(QuantCudaStream, ScratchStaysReservedInZppsPoolAcrossASynchronize) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaStream scratch");
  int dev = -1;
  CUDA_OK(cudaGetDevice(&dev));
  cudaMemPool_t dflt = nullptr;
  CUDA_OK(cudaDeviceGetDefaultMemPool(&dflt, dev));
  CUDA_OK(cudaDeviceSynchronize());
  uint64_t zero = 0, threshold0 = 1, reserved0 = 1, used_high0 = 1;
  CUDA_OK(cudaMemPoolSetAttribute(dflt, cudaMemPoolAttrUsedMemHigh, &zero));
  CUDA_OK(cudaMemPoolGetAttribute(dflt, cudaMemPoolAttrReleaseThreshold, &threshold0));
  CUDA_OK(cudaMemPoolGetAttribute(dflt, cudaMemPoolAttrReservedMemCurrent, &reserved0));
  CUDA_OK(cudaMemPoolGetAttribute(dflt, cudaMemPoolAttrUsedMemHigh, &used_high0));
#if ZPP_TEST_CUDA_EMU
  unsigned long releases0 = zpp_emu_mempool_releases(dev);
#endif
  const size_t n = 100003;
  std::vector<float> x(n);
  Rng r(test_seed() + 7);
  for (auto &v : x) v = (float)(r.uniform() * 8.0 - 4.0);
  Stream st;
  ASSERT_NE(st.s, nullptr);
  DevBuf dx(n * 4), dz(n * 2);
  ASSERT_NE(dx.p, nullptr);
  ASSERT_NE(dz.p, nullptr);
  CUDA_OK(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice));
  char err[256] = "";
  void *scratch = nullptr;
  ASSERT_EQ(zpp_ew_alloc_device(n * 4, &scratch, st.s, err, sizeof err), 0) << err;
  EXPECT_EQ(zpp_ew_copy_device(scratch, dx.p, n * 4, st.s, err, sizeof err), 0) << err;
  EXPECT_EQ(zpp_ew_finish_device((const float *)scratch, n, 3.0f, ZPP_QM_BF16, dz.p, st.s, err,
                                 sizeof err),
            0)
      << err;
  zpp_ew_free_device(scratch, st.s);
  CUDA_OK(cudaStreamSynchronize(st.s));
  std::vector<uint16_t> z(n);
  CUDA_OK(cudaMemcpy(z.data(), dz.p, n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++)
    ASSERT_EQ(z[i], zpp_qm_f32_to_bf16(x[i] / 3.0f)) << "element " << i;
  uint64_t threshold1 = 1, reserved1 = 1, used_high1 = 1;
  CUDA_OK(cudaMemPoolGetAttribute(dflt, cudaMemPoolAttrReleaseThreshold, &threshold1));
  CUDA_OK(cudaMemPoolGetAttribute(dflt, cudaMemPoolAttrReservedMemCurrent, &reserved1));
  CUDA_OK(cudaMemPoolGetAttribute(dflt, cudaMemPoolAttrUsedMemHigh, &used_high1));
  EXPECT_EQ(used_high1, used_high0) << "the scratch came from the device's default pool";
  EXPECT_EQ(reserved1, reserved0);
  EXPECT_EQ(threshold1, threshold0) << "zpp changed the default pool's threshold";
#if ZPP_TEST_CUDA_EMU
  EXPECT_EQ(zpp_emu_mempool_releases(dev), releases0)
      << "a pool returned the scratch to the OS at the synchronize";
  EXPECT_GE(zpp_emu_mempool_reserved(dev), n * 4) << "the scratch is no longer reserved";
#endif
}

// Captured into a graph, nothing runs until the graph is launched: every
// kernel of every path was issued to the captured stream.
TEST(QuantCudaStream, LaunchesCanBeCapturedIntoAGraph) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaStream graph");
  Stream st;
  ASSERT_NE(st.s, nullptr);
  const Input &in = input_for(ZPP_QM_F32);
  for (size_t block : {(size_t)256, (size_t)1 << 20}) {
    SCOPED_TRACE("block " + std::to_string(block));
    const size_t n = 3 * ((size_t)1 << 20) + 5;
    zpp_quant_config_t cfg = make_cfg(8, block, true);
    const zpp_qcfg_t q = {8, 1, block, 0, 0, 0, 0};
    size_t sz = 0;
    ASSERT_EQ(zpp_quant_encoded_size(&cfg, n, &sz), ZPP_OK);
    DevBuf d_enc(sz), d_acc(4 * n);
    CUDA_OK(cudaMemset(d_enc.p, kPoison, sz));
    CUDA_OK(cudaMemcpy(d_acc.p, acc_start().data(), 4 * n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());

    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeRelaxed));
    zpp_status_t e1 = zpp_quant_encode_device(&cfg, ZPP_FLOAT32, in.dev->p, n, d_enc.p, sz, st.s);
    std::string m1 = zpp_get_last_error();
    zpp_status_t e2 =
        zpp_quant_decode_accumulate_device(&cfg, d_enc.p, sz, n, (float *)d_acc.p, st.s);
    std::string m2 = zpp_get_last_error();
    CUDA_OK(cudaStreamEndCapture(st.s, &graph));
    ASSERT_EQ(e1, ZPP_OK) << m1;
    ASSERT_EQ(e2, ZPP_OK) << m2;

    // nothing ran yet
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> got(sz);
    CUDA_OK(cudaMemcpy(got.data(), d_enc.p, sz, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(guard_intact(got, 0)) << "a kernel ran outside the captured stream";

    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, st.s));
    CUDA_OK(cudaStreamSynchronize(st.s));
    std::vector<uint8_t> ref(sz);
    cpu_encode(q, ZPP_QM_F32, in.host.data(), n, ref.data());
    CUDA_OK(cudaMemcpy(got.data(), d_enc.p, sz, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(ref.data(), got.data(), sz), 0) << "encode in the graph";
    std::vector<float> aref(acc_start().begin(), acc_start().begin() + n), agot(n);
    cpu_decode(q, ref.data(), n, ZPP_QM_OUT_ACC, aref.data());
    CUDA_OK(cudaMemcpy(agot.data(), d_acc.p, 4 * n, cudaMemcpyDeviceToHost));
    EXPECT_EQ(first_mismatch((const uint8_t *)aref.data(), (const uint8_t *)agot.data(), n,
                             ZPP_QM_OUT_ACC),
              n)
        << "decode-accumulate in the graph";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}


// ---- transforms: stochastic rounding and the Hadamard rotation on the device ------

// The encode kernel draws the same bits as the CPU (zpp_qm_rand24 of the
// element index plus the base): every path of the launcher (one segment,
// looping, split blocks) gives the CPU's bytes.
TEST(QuantCudaTransforms, StochasticRoundingIsBitwiseEqualToCpu) {
  ZPP_SKIP_WITHOUT_DEVICE();
  Stream st;
  const size_t blocks[] = {7, 32, 256, 5000, (size_t)1 << 16, (size_t)1 << 22};
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (size_t block : blocks) {
          size_t n = block >= ((size_t)1 << 16) ? 2 * block + 5 : 100003;
          SCOPED_TRACE(describe(dt, bits, asym, block, n) + " stochastic");
          const Input &in = input_for(dt);
          zpp_quant_config_t cfg = make_cfg(bits, block, asym);
          cfg.rounding = ZPP_ROUND_STOCHASTIC;
          cfg.seed = 1234 + (uint64_t)block;
          zpp_qm_keys_t k = zpp_qm_rng_keys(cfg.seed);
          const zpp_qcfg_t q = {bits, asym ? 1 : 0, block, 1, k.k0, k.k1, 0};
          size_t sz = 0;
          ASSERT_EQ(zpp_quant_encoded_size(&cfg, n, &sz), ZPP_OK);
          std::vector<uint8_t> ref(sz), got(sz);
          cpu_encode(q, dt, in.host.data(), n, ref.data());
          DevBuf d_enc(sz);
          ASSERT_EQ(zpp_quant_encode_device(&cfg, (zpp_dtype_t)dt, in.dev->p, n, d_enc.p, sz,
                                            st.s), ZPP_OK) << zpp_get_last_error();
          CUDA_OK(cudaMemcpyAsync(got.data(), d_enc.p, sz, cudaMemcpyDeviceToHost, st.s));
          CUDA_OK(cudaStreamSynchronize(st.s));
          ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), sz));
        }
}

// The same at nonzero index bases (the collectives pass an element's
// position in the whole tensor: a qwZ shard of rank r starts at r * count,
// a qgZ chunk at its offset): element i draws zpp_qm_rand24(keys, base + i)
// on the device as on the CPU, for bases below 2^32, across the 2^32 wrap
// of the low word inside the call, and above it; on every launcher path
// (one segment per block; split blocks; one CTA per block, which an
// unaligned dst selects), every dtype, width and mode.  Small inputs, so
// the emulated build runs it (quant_device_emu).
// 25003 normal values in dtype dt, host and device (the shared inputs
// change magnitude every 64 elements and hold NaNs, so most codes of a
// block of 10000 would be 0 or the block non-finite, whatever the random
// bits: the base would change nothing to compare).
const Input &normal_input(int dt) {
  Input &in = inputs()[100 + dt];  // freed by FreeInputs with the others
  if (in.dev == nullptr) {
    Rng r(test_seed() + 77 + (uint64_t)dt);
    const size_t n = 25003;
    in.host.assign(n * dtype_size(dt), 0);
    for (size_t i = 0; i < n; i++)
      put_value(in.host.data(), dt, i, (float)(r.uniform() * 2.0 - 1.0 + r.uniform() - 0.5));
    in.dev = new DevBuf(in.host.size());
    if (in.dev->p)
      cudaMemcpy(in.dev->p, in.host.data(), in.host.size(), cudaMemcpyHostToDevice);
  }
  return in;
}

TEST(QuantCudaTransforms, StochasticRoundingAtANonzeroIndexBase) {
  ZPP_SKIP_WITHOUT_DEVICE();
  Stream st;
  struct Shape {
    size_t block, n, dst_off;
    const char *path;
  };
  const Shape shapes[] = {{256, 5003, 0, "one segment"},
                          {10000, 25003, 0, "split blocks"},
                          {10000, 25003, 1, "one CTA per block (unaligned dst)"}};
  const uint64_t bases[] = {1, ((uint64_t)1 << 32) - 5000, ((uint64_t)1 << 33) + 777};
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (int bits : {8, 4})
      for (bool asym : {false, true})
        for (const Shape &sh : shapes)
          for (uint64_t base : bases) {
            SCOPED_TRACE(describe(dt, bits, asym, sh.block, sh.n) + " " + sh.path + " base " +
                         std::to_string(base));
            const Input &in = normal_input(dt);
            zpp_quant_config_t cfg = make_cfg(bits, sh.block, asym);
            cfg.rounding = ZPP_ROUND_STOCHASTIC;
            cfg.seed = 99 + (uint64_t)bits;
            zpp_qm_keys_t k = zpp_qm_rng_keys(cfg.seed);
            const zpp_qcfg_t q = {bits, asym ? 1 : 0, sh.block, 1, k.k0, k.k1, base};
            size_t sz = 0;
            ASSERT_EQ(zpp_quant_encoded_size(&cfg, sh.n, &sz), ZPP_OK);
            std::vector<uint8_t> ref(sz), got(sz), at0(sz);
            cpu_encode(q, dt, in.host.data(), sh.n, ref.data());
            zpp_qcfg_t q0 = q;
            q0.base = 0;
            cpu_encode(q0, dt, in.host.data(), sh.n, at0.data());
            ASSERT_NE(ref, at0) << "the base changes no bit: the check below would be empty";
            DevBuf d_enc(sz + sh.dst_off);
            ASSERT_EQ(zpp_quant_encode_device_at(&cfg, (zpp_dtype_t)dt, in.dev->p, sh.n, base,
                                                 d_enc.p + sh.dst_off, sz, st.s),
                      ZPP_OK) << zpp_get_last_error();
            CUDA_OK(cudaMemcpyAsync(got.data(), d_enc.p + sh.dst_off, sz, cudaMemcpyDeviceToHost,
                                    st.s));
            CUDA_OK(cudaStreamSynchronize(st.s));
            ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), sz));
          }
}

// The device rotation performs the host's operations in the same order:
// bitwise equal for every dtype, shared-memory groups (<= 1024) and the
// staged path (larger groups), with a tail left unrotated.
TEST(QuantCudaTransforms, HadamardIsBitwiseEqualToCpu) {
  ZPP_SKIP_WITHOUT_DEVICE();
  Stream st;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (size_t g : {2, 8, 32, 256, 1024, 4096, 65536}) {
      size_t n = 37 * g + 11;
      if (n > kLong) n = kLong;
      const Input &in = input_for(dt);
      std::vector<float> ref(n), got(n);
      zpp_tf_hadamard_scalar(g, dt, in.host.data(), n, ref.data());
      DevBuf d_out(n * 4);
      char err[256] = "";
      ASSERT_EQ(zpp_tf_hadamard_device(g, dt, in.dev->p, n, (float *)d_out.p, st.s, err,
                                       sizeof err), 0) << err;
      CUDA_OK(cudaMemcpyAsync(got.data(), d_out.p, n * 4, cudaMemcpyDeviceToHost, st.s));
      CUDA_OK(cudaStreamSynchronize(st.s));
      size_t bad = first_mismatch((const uint8_t *)ref.data(), (const uint8_t *)got.data(), n,
                                  ZPP_QM_F32);
      EXPECT_EQ(bad, n) << "dtype " << dt << " g " << g << " first mismatch at " << bad;
      // in place on fp32, applied again: the host's second rotation
      ASSERT_EQ(zpp_tf_hadamard_device(g, ZPP_QM_F32, d_out.p, n, (float *)d_out.p, st.s, err,
                                       sizeof err), 0) << err;
      zpp_tf_hadamard_scalar(g, ZPP_QM_F32, ref.data(), n, ref.data());
      CUDA_OK(cudaMemcpyAsync(got.data(), d_out.p, n * 4, cudaMemcpyDeviceToHost, st.s));
      CUDA_OK(cudaStreamSynchronize(st.s));
      EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), n * 4)) << "in place, g " << g;
    }
}

}  // namespace
