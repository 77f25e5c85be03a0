// Tests of the device block quantizer (zpp_quant_*_device, the kernels of
// src/kernels/quant_cuda.cu) against the CPU reference, bit for bit:
// the encoded bytes with memcmp, the decoded outputs and accumulators
// element by element (NaN == NaN: the device may return another NaN
// payload).  Also: the bytes past every output stay untouched, host
// pointers are refused, managed memory and unaligned device pointers work,
// and all work goes to the caller's stream (a stream synchronised alone,
// and a stream captured into a CUDA graph).  The transforms: stochastic
// rounding, and the Hadamard rotation against the host's bits and a
// float64 bound.  The batched launchers (quant_batch_cuda.cu: tables of
// runs) against the CPU's steps run one by one.
//
// Every test skips with "no CUDA device: ..." when zpp_cuda_available() is
// 0, and runs for real on a machine with a GPU (perf/gpu_check.sh), or on
// the emulated CUDA runtime in an emulated build (ZPP_CUDA_EMU).
// Seed: ZPP_TEST_SEED (default 20261129), printed by every test.
#include <gtest/gtest.h>

#include <zpp/zpp.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/core.h"
#include "kernels/elementwise.h"
#include "kernels/quant_cpu.h"
#include "kernels/quant_cuda.h"
#include "kernels/quant_math.h"
#include "kernels/transform.h"
#include "quant/quant.h"
#include "quant_cuda_testdata.h"
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

// ---- the paths for long blocks ----------------------------------------------

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

// ---- pointers ---------------------------------------------------------------

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

// ---- streams ----------------------------------------------------------------

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

// Scratch above the pool's release threshold (ZPP_SCRATCH_POOL_MB, default
// 256 MiB) goes back at the next synchronisation ("When more than the
// release threshold bytes of memory are held by the memory pool, the
// allocator will try to release memory back to the OS on the next call to
// stream, event or context synchronize.", driver_types.h,
// cudaMemPoolAttrReleaseThreshold): one large call does not keep its
// scratch from the application's allocator for the life of the process.
TEST(QuantCudaStream, ScratchAboveThePoolThresholdIsReleasedAtASynchronize) {
  ZPP_SKIP_WITHOUT_DEVICE();
  print_seed("QuantCudaStream scratch release");
  const char *env = std::getenv("ZPP_SCRATCH_POOL_MB");
  const size_t threshold = (env ? std::strtoull(env, nullptr, 10) : 256) << 20;
  const size_t big = threshold + ((size_t)512 << 20); // bytes
  int dev = -1;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceSynchronize());
#if ZPP_TEST_CUDA_EMU
  unsigned long releases0 = zpp_emu_mempool_releases(dev);
#else
  size_t free0 = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  if (free0 < big + ((size_t)256 << 20))
    GTEST_SKIP() << "needs " << (big >> 20) << " MiB of free device memory";
#endif
  Stream st;
  ASSERT_NE(st.s, nullptr);
  char err[256] = "";
  void *scratch = nullptr;
  ASSERT_EQ(zpp_ew_alloc_device(big, &scratch, st.s, err, sizeof err), 0)
      << err;
  EXPECT_EQ(zpp_ew_zero_device(scratch, big, st.s, err, sizeof err), 0) << err;
  zpp_ew_free_device(scratch, st.s);
  CUDA_OK(cudaStreamSynchronize(st.s));
#if ZPP_TEST_CUDA_EMU
  EXPECT_GT(zpp_emu_mempool_releases(dev), releases0)
      << "no pool released memory at the synchronize";
  EXPECT_LT(zpp_emu_mempool_reserved(dev), (unsigned long long)big)
      << "the scratch above the threshold is still reserved";
#else
  size_t free1 = 0;
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  EXPECT_GE(free1 + threshold, free0)
      << "the scratch above the threshold is still reserved";
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

// ---- transforms: stochastic rounding and the Hadamard rotation on the device
// ---

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
      // NaN == NaN here too: the input holds NaNs, whose payload after an
      // addition depends on the operand order the compiler picked (x86) or
      // is canonical (a GPU)
      bad = first_mismatch((const uint8_t *)ref.data(), (const uint8_t *)got.data(), n,
                           ZPP_QM_F32);
      EXPECT_EQ(bad, n) << "in place, g " << g << " first mismatch at " << bad;
    }
}


// The rotation against a float64 reference, for every power-of-two group
// from 2 to 65536 (one pass of the shared-memory tiles up to 8192, two
// above), odd group counts and a tail, fp32 and bf16 inputs, through the
// single and the batched launcher.  The bound: a group's output y_i is a
// sum of its g inputs with signs through k = log2(g) levels of fp32
// additions, then one multiply by c (c = 2^-k/2, or that times fl(1/sqrt 2)
// for odd k: one more rounding), so |y_i - H x_i| <= gamma_{k+2} * c *
// sum_j |x_j| with gamma_n = n u / (1 - n u), u = 2^-24 (Higham, recursive
// summation), plus the float64 reference's own error (2^-29 times that).
// The device must also equal the scalar host rotation bit for bit, leave
// the tail as fp32(x), write nothing past the run, and (emulated build,
// where the kernel log counts them) take one launch per pass.
TEST(QuantCudaTransforms, HadamardMatchesFloat64WithinTheStageBound) {
  ZPP_SKIP_WITHOUT_DEVICE();
  const uint64_t seed = print_seed("QuantCudaTransforms Hadamard float64");
  Stream st;
  ASSERT_NE(st.s, nullptr);
  for (int dt : {ZPP_QM_F32, ZPP_QM_BF16}) {
    std::vector<zpp_tf_run_t> runs;
    std::vector<std::vector<float>> refs;
    std::vector<DevBuf *> bufs;
    size_t nbad = 0;
    for (unsigned k = 1; k <= 16; k++) {
      const size_t g = (size_t)1 << k;
      size_t ngroups = g >= 4096 ? 3 : ((size_t)16384 / g) | 1;  // odd
      const size_t tail = (k * 7) % (g < 13 ? g : 13);           // < g
      const size_t n = ngroups * g + tail;
      SCOPED_TRACE("dtype " + std::to_string(dt) + " g " + std::to_string(g) + " groups " +
                   std::to_string(ngroups) + " tail " + std::to_string(tail));
      Rng r(seed + 1000 * (uint64_t)dt + k);
      std::vector<uint8_t> in(n * dtype_size(dt));
      std::vector<float> x(n);  // the input as the kernel reads it
      for (size_t i = 0; i < n; i++) {
        double mag = std::ldexp(1.0, (int)r.below(9) - 4);  // 2^-4 .. 2^4
        put_value(in.data(), dt, i, (float)((r.uniform() * 2.0 - 1.0) * mag));
        x[i] = zpp_qm_load(in.data(), i, dt);
      }
      // the float64 reference and its bound, group by group
      const double u = std::ldexp(1.0, -24), c = 1.0 / std::sqrt((double)g);
      const double gam = (k + 2) * u / (1.0 - (k + 2) * u);
      std::vector<double> y(x.begin(), x.end()), bound(n, 0.0);
      for (size_t b = 0; b + g <= n; b += g) {
        double sum = 0.0;
        for (size_t i = b; i < b + g; i++) sum += std::fabs(y[i]);
        for (size_t h = 1; h < g; h *= 2)
          for (size_t i = b; i < b + g; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
              double a0 = y[j], a1 = y[j + h];
              y[j] = a0 + a1;
              y[j + h] = a0 - a1;
            }
        for (size_t i = b; i < b + g; i++) {
          y[i] *= c;
          bound[i] = (gam + std::ldexp(2.0 * (k + 2), -53)) * c * sum;
        }
      }
      std::vector<float> want(n);
      zpp_tf_hadamard_scalar(g, dt, in.data(), n, want.data());
      DevBuf d_in(in.size()), d_out((n + 64) * 4);
      ASSERT_NE(d_in.p, nullptr);
      ASSERT_NE(d_out.p, nullptr);
      CUDA_OK(cudaMemcpy(d_in.p, in.data(), in.size(), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(d_out.p, kPoison, (n + 64) * 4));
      CUDA_OK(cudaDeviceSynchronize());  // st is not ordered with the legacy stream
      char err[256] = "";
#if ZPP_TEST_CUDA_EMU
      zpp_emu_kernel_log_clear();
#endif
      ASSERT_EQ(zpp_tf_hadamard_device(g, dt, d_in.p, n, (float *)d_out.p, st.s, err, sizeof err),
                0)
          << err;
      std::vector<uint8_t> got((n + 64) * 4);
      CUDA_OK(cudaMemcpyAsync(got.data(), d_out.p, got.size(), cudaMemcpyDeviceToHost, st.s));
      CUDA_OK(cudaStreamSynchronize(st.s));
#if ZPP_TEST_CUDA_EMU
      // one launch per pass of 13 stage bits, the tail included
      EXPECT_EQ(zpp_emu_kernel_log(nullptr, 0), (size_t)(k + 12) / 13) << "kernel launches";
#endif
      EXPECT_TRUE(guard_intact(got, n * 4)) << "a write past the output";
      const float *gf = (const float *)got.data();
      for (size_t i = 0; i < n; i++) {
        bool ok = i < ngroups * g ? std::fabs((double)gf[i] - y[i]) <= bound[i]
                                  : f32_bits(gf[i]) == f32_bits(x[i]);
        if (!ok && nbad++ < 5)
          ADD_FAILURE() << "element " << i << ": got " << gf[i] << ", float64 " << y[i]
                        << ", bound " << bound[i];
      }
      EXPECT_EQ(0, std::memcmp(gf, want.data(), n * 4)) << "not the host's bits";
      // the same run in a batch of all group sizes' inputs, below
      bufs.push_back(new DevBuf(in.size()));
      bufs.push_back(new DevBuf(n * 4));
      CUDA_OK(cudaMemcpy(bufs[bufs.size() - 2]->p, in.data(), in.size(), cudaMemcpyHostToDevice));
      refs.push_back(want);
      runs.push_back({bufs[bufs.size() - 2]->p, (float *)bufs.back()->p, n});
    }
    CUDA_OK(cudaDeviceSynchronize());
    // batched: one group size for every run, so batch each run with the
    // other runs' inputs rotated by the same g (the launch's table then
    // holds runs of different lengths and tiles)
    for (unsigned k = 1; k <= 16; k += 5) {
      const size_t g = (size_t)1 << k;
      SCOPED_TRACE("batch of " + std::to_string(runs.size()) + " runs, g " + std::to_string(g));
      char err[256] = "";
      ASSERT_EQ(zpp_tf_hadamard_batch_device(g, dt, runs.data(), runs.size(), st.s, err,
                                             sizeof err),
                0)
          << err;
      CUDA_OK(cudaStreamSynchronize(st.s));
      for (size_t i = 0; i < runs.size(); i++) {
        std::vector<float> want(runs[i].count), got(runs[i].count);
        std::vector<uint8_t> in(runs[i].count * dtype_size(dt));
        CUDA_OK(cudaMemcpy(in.data(), runs[i].src, in.size(), cudaMemcpyDeviceToHost));
        zpp_tf_hadamard_scalar(g, dt, in.data(), runs[i].count, want.data());
        CUDA_OK(cudaMemcpy(got.data(), runs[i].dst, got.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << "run " << i;
      }
    }
    // in place on fp32: the batch rotates its outputs again
    if (dt == ZPP_QM_F32) {
      std::vector<zpp_tf_run_t> inplace = runs;
      for (auto &r : inplace) r.src = r.dst;
      const size_t g = 64;
      std::vector<std::vector<float>> before;
      for (auto &r : inplace) {
        before.emplace_back(r.count);
        CUDA_OK(cudaMemcpy(before.back().data(), r.dst, r.count * 4, cudaMemcpyDeviceToHost));
      }
      char err[256] = "";
      ASSERT_EQ(zpp_tf_hadamard_batch_device(g, dt, inplace.data(), inplace.size(), st.s, err,
                                             sizeof err),
                0)
          << err;
      CUDA_OK(cudaStreamSynchronize(st.s));
      for (size_t i = 0; i < inplace.size(); i++) {
        std::vector<float> got(inplace[i].count);
        zpp_tf_hadamard_scalar(g, ZPP_QM_F32, before[i].data(), got.size(), before[i].data());
        CUDA_OK(cudaMemcpy(got.data(), inplace[i].dst, got.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(0, std::memcmp(got.data(), before[i].data(), got.size() * 4))
            << "in place, run " << i;
      }
    }
    for (DevBuf *b : bufs) delete b;
  }
}

// ---- batched launches: a table of runs against the CPU steps one by one -----

// The batched encode (zpp_quant_cuda_encode_batch) of 53 runs (two
// launches: 48 a launch) of varied lengths, packed back to back in one
// buffer as qgZ's messages are (so most encodes start unaligned), for
// every kind of error feedback, with and without the rotation and
// stochastic rounding, on blocks that fit one segment, blocks that are no
// multiple of a chunk, and blocks longer than a segment (one CTA loops):
// encodes and residuals must be bitwise those of the CPU's steps, run on
// each run alone (zpp_tf_hadamard_scalar, zpp_ew_add_residual_host, the
// scalar encode, decode, zpp_ew_residual_host / zpp_ew_ema_residual_host,
// the scalar INT8 encode of the new error).
TEST(QuantCudaBatch, EncodeBatchIsTheStepsOneByOne) {
  ZPP_SKIP_WITHOUT_DEVICE();
  const uint64_t seed = print_seed("QuantCudaBatch encode");
  Stream st;
  ASSERT_NE(st.s, nullptr);
  struct Shape {
    int dt, bits;
    bool asym, sr;
    size_t block, hadamard;
    int res, reset;
    float beta;
  };
  const Shape shapes[] = {
      {ZPP_QM_F32, 4, false, false, 64, 0, ZPP_QB_RES_NONE, 0, 0.0f},
      {ZPP_QM_BF16, 8, true, true, 64, 16, ZPP_QB_RES_F32, 0, 0.0f},
      {ZPP_QM_F32, 8, false, true, 96, 32, ZPP_QB_RES_I8, 0, 0.8f},
      {ZPP_QM_F16, 4, true, false, 100, 4, ZPP_QB_RES_F32, 0, 0.5f},
      {ZPP_QM_BF16, 4, false, false, 96, 0, ZPP_QB_RES_I8, 1, 0.0f},
      {ZPP_QM_F32, 8, true, false, 12288, 4096, ZPP_QB_RES_I8, 0, 0.0f},
      {ZPP_QM_BF16, 4, false, true, 12288, 0, ZPP_QB_RES_F32, 0, 0.8f},
  };
  for (const Shape &sh : shapes) {
    SCOPED_TRACE(describe(sh.dt, sh.bits, sh.asym, sh.block, 0) + " hadamard " +
                 std::to_string(sh.hadamard) + " residual " +
                 std::to_string(sh.res) + (sh.reset ? " reset" : "") +
                 " beta " + std::to_string(sh.beta) +
                 (sh.sr ? " stochastic" : ""));
    const size_t nruns = sh.block > 8192 ? 5 : 53; // long blocks: one launch
    zpp_qcfg_t q = {sh.bits, sh.asym ? 1 : 0, sh.block, sh.sr ? 1 : 0, 0, 0, 0};
    const zpp_qcfg_t q8 = {8, 0, sh.block, 0, 0, 0, 0}; // the INT8 residual
    Rng r(seed + sh.block * 31 + (size_t)sh.res);
    std::vector<size_t> count(nruns), src_off(nruns), dst_off(nruns),
        res_off(nruns);
    size_t src_n = 0, dst_n = 0, res_n = 0;
    int ov = 0;
    for (size_t i = 0; i < nruns; i++) {
      count[i] = 1 + r.below((uint32_t)(3 * sh.block)); // a short last block
      if (i % 7 == 3)
        count[i] = 2 * sh.block; // whole blocks only
      src_off[i] = src_n;
      src_n += count[i] + (i % 2); // an odd gap: unaligned sources
      dst_off[i] = dst_n;
      dst_n += zpp_quant_bytes(&q, count[i], &ov);
      res_off[i] = res_n;
      res_n += sh.res == ZPP_QB_RES_I8 ? zpp_quant_bytes(&q8, count[i], &ov)
                                       : count[i] * 4;
    }
    std::vector<uint8_t> src(src_n * dtype_size(sh.dt)), res(res_n + 4);
    for (size_t i = 0; i < src_n; i++)
      put_value(src.data(), sh.dt, i,
                (float)((r.uniform() * 2.0 - 1.0) * (1 + r.below(8))));
    // the old residual: fp32 values, or INT8 encodes of such values
    for (size_t i = 0; i < nruns; i++) {
      std::vector<float> old(count[i]);
      for (auto &v : old)
        v = (float)((r.uniform() - 0.5) * 0.25);
      if (sh.res == ZPP_QB_RES_I8)
        zpp_quant_encode_scalar(&q8, ZPP_QM_F32, old.data(), count[i],
                                res.data() + res_off[i]);
      else
        std::memcpy(res.data() + res_off[i], old.data(), count[i] * 4);
    }
    // the CPU, run by run
    std::vector<uint8_t> want_dst(dst_n), want_res = res;
    std::vector<zpp_qb_enc_run_t> runs(nruns);
    for (size_t i = 0; i < nruns; i++) {
      const size_t n = count[i];
      const uint8_t *g = src.data() + src_off[i] * dtype_size(sh.dt);
      std::vector<float> x(n), rr(n, 0.0f), dec(n);
      zpp_tf_hadamard_scalar(sh.hadamard, sh.dt, g, n, x.data());
      uint8_t *rp = want_res.data() + res_off[i];
      if (!sh.reset && sh.res == ZPP_QB_RES_F32)
        std::memcpy(rr.data(), rp, n * 4);
      if (!sh.reset && sh.res == ZPP_QB_RES_I8)
        zpp_quant_decode_scalar(&q8, rp, n, ZPP_QM_F32, rr.data());
      if (sh.res != ZPP_QB_RES_NONE)
        zpp_ew_add_residual_host(ZPP_QM_F32, x.data(), rr.data(), n, x.data());
      zpp_qcfg_t qi = q;
      const uint64_t rs = seed * 7 + i;
      if (sh.sr) {
        zpp_qm_keys_t k = zpp_qm_rng_keys(rs);
        qi.k0 = k.k0;
        qi.k1 = k.k1;
        qi.base = 1000 * i;
      }
      zpp_quant_encode_scalar(&qi, ZPP_QM_F32, x.data(), n,
                              want_dst.data() + dst_off[i]);
      if (sh.res != ZPP_QB_RES_NONE) {
        zpp_quant_decode_scalar(&q, want_dst.data() + dst_off[i], n, ZPP_QM_F32,
                                dec.data());
        if (sh.beta == 0.0f) {
          rr = dec;
          zpp_ew_residual_host(x.data(), n, rr.data());
        } else {
          zpp_ew_ema_residual_host(x.data(), dec.data(), n, sh.beta, rr.data());
        }
        if (sh.res == ZPP_QB_RES_I8)
          zpp_quant_encode_scalar(&q8, ZPP_QM_F32, rr.data(), n, rp);
        else
          std::memcpy(rp, rr.data(), n * 4);
      }
      runs[i].count = n;
      runs[i].base = 1000 * i;
      runs[i].seed = rs;
    }
    // the device, in one table
    DevBuf d_src(src.size()), d_dst(dst_n + 64), d_res(res.size());
    ASSERT_NE(d_src.p, nullptr);
    CUDA_OK(
        cudaMemcpy(d_src.p, src.data(), src.size(), cudaMemcpyHostToDevice));
    CUDA_OK(
        cudaMemcpy(d_res.p, res.data(), res.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_dst.p, kPoison, dst_n + 64));
    CUDA_OK(cudaDeviceSynchronize());
    for (size_t i = 0; i < nruns; i++) {
      const size_t nb = (count[i] + sh.block - 1) / sh.block;
      runs[i].src = d_src.p + src_off[i] * dtype_size(sh.dt);
      runs[i].dst = d_dst.p + dst_off[i];
      runs[i].res = d_res.p + res_off[i];
      runs[i].res_codes = d_res.p + res_off[i] + 4 * nb;
    }
    zpp_qb_enc_t b = {};
    b.q = q;
    b.dtype = sh.dt;
    b.res = sh.res;
    b.reset = sh.reset;
    b.beta = sh.beta;
    b.hadamard = sh.hadamard;
    ASSERT_TRUE(zpp_quant_cuda_encode_batch_fits(sh.block, sh.hadamard));
    char err[256] = "";
#if ZPP_TEST_CUDA_EMU
    zpp_emu_kernel_log_clear();
#endif
    ASSERT_EQ(zpp_quant_cuda_encode_batch(&b, runs.data(), nruns, st.s, err,
                                          sizeof err),
              0)
        << err;
    std::vector<uint8_t> got_dst(dst_n + 64), got_res(res.size());
    CUDA_OK(cudaMemcpyAsync(got_dst.data(), d_dst.p, got_dst.size(),
                            cudaMemcpyDeviceToHost, st.s));
    CUDA_OK(cudaMemcpyAsync(got_res.data(), d_res.p, got_res.size(),
                            cudaMemcpyDeviceToHost, st.s));
    CUDA_OK(cudaStreamSynchronize(st.s));
#if ZPP_TEST_CUDA_EMU
    EXPECT_EQ(zpp_emu_kernel_log(nullptr, 0), (nruns + 47) / 48)
        << "one launch per 48 runs";
#endif
    EXPECT_TRUE(guard_intact(got_dst, dst_n)) << "a write past the last encode";
    for (size_t i = 0; i < nruns; i++) {
      size_t nd = (i + 1 < nruns ? dst_off[i + 1] : dst_n) - dst_off[i];
      ASSERT_EQ(0, std::memcmp(got_dst.data() + dst_off[i],
                               want_dst.data() + dst_off[i], nd))
          << "encode of run " << i << " (" << count[i] << " elements)";
      size_t nr = (i + 1 < nruns ? res_off[i + 1] : res_n) - res_off[i];
      if (sh.res != ZPP_QB_RES_NONE) {
        ASSERT_EQ(0, std::memcmp(got_res.data() + res_off[i],
                                 want_res.data() + res_off[i], nr))
            << "residual of run " << i << " (" << count[i] << " elements)";
      }
    }
  }
}

// The batched decode-sum (zpp_quant_cuda_sum_batch): outputs that start
// from an fp32, bf16 or fp16 input or from their own values, each with its
// list of sources (encodes, or raw elements), more outputs and sources than
// one launch takes (one output's list is split between two launches):
// bitwise the CPU's widen and decode-accumulates (add-residuals) in order.
TEST(QuantCudaBatch, SumBatchIsTheDecodeAccumulatesInOrder) {
  ZPP_SKIP_WITHOUT_DEVICE();
  const uint64_t seed = print_seed("QuantCudaBatch sum");
  Stream st;
  ASSERT_NE(st.s, nullptr);
  struct Shape {
    int bits; // 0: raw sources of src_dt
    bool asym;
    size_t block;
    int init_dt, src_dt;
    bool own; // outputs start from their own values
  };
  const Shape shapes[] = {{4, false, 64, ZPP_QM_BF16, 0, false},
                          {8, true, 100, ZPP_QM_F32, 0, true},
                          {4, true, 12288, ZPP_QM_F16, 0, false},
                          {0, false, 0, ZPP_QM_BF16, ZPP_QM_BF16, false}};
  for (const Shape &sh : shapes) {
    SCOPED_TRACE("bits " + std::to_string(sh.bits) + " block " +
                 std::to_string(sh.block) + (sh.own ? " own start" : ""));
    const zpp_qcfg_t q = {sh.bits ? sh.bits : 8,
                          sh.asym ? 1 : 0,
                          sh.block ? sh.block : 1,
                          0,
                          0,
                          0,
                          0};
    Rng r(seed + sh.block + (size_t)sh.bits);
    // 50 outputs of 1..3 sources, then 2 of 120 (the second crosses the
    // 192 sources of a launch)
    std::vector<zpp_qb_sum_run_t> runs;
    std::vector<size_t> nsrc;
    for (int i = 0; i < 52; i++)
      nsrc.push_back(i < 50 ? 1 + (size_t)(i % 3) : 120);
    const size_t big = sh.block > 8192 ? 2 : 52; // long blocks: fewer outputs
    nsrc.resize(big);
    if (big == 2)
      nsrc = {3, 200};
    std::vector<std::vector<float>> want;
    std::vector<std::vector<uint8_t>> srcs_host, init_host;
    size_t total_src = 0;
    int ov = 0;
    for (size_t o = 0; o < nsrc.size(); o++) {
      size_t n = 1 + r.below(sh.block > 8192 ? 20000 : 700);
      std::vector<float> acc(n);
      std::vector<uint8_t> init(n * dtype_size(sh.init_dt));
      for (size_t i = 0; i < n; i++) {
        put_value(init.data(), sh.init_dt, i, (float)(r.uniform() * 4.0 - 2.0));
        acc[i] = sh.own ? (float)(r.uniform() - 0.5)
                        : zpp_qm_load(init.data(), i, sh.init_dt);
      }
      init_host.push_back(
          sh.own ? std::vector<uint8_t>((uint8_t *)acc.data(),
                                        (uint8_t *)acc.data() + 4 * n)
                 : init);
      for (size_t k = 0; k < nsrc[o]; k++) {
        std::vector<float> v(n);
        for (auto &x : v)
          x = (float)((r.uniform() * 2.0 - 1.0) * (1 + r.below(4)));
        std::vector<uint8_t> e;
        if (sh.bits) {
          e.resize(zpp_quant_bytes(&q, n, &ov));
          zpp_quant_encode_scalar(&q, ZPP_QM_F32, v.data(), n, e.data());
          zpp_quant_decode_scalar(&q, e.data(), n, ZPP_QM_OUT_ACC, acc.data());
        } else {
          e.resize(n * dtype_size(sh.src_dt));
          for (size_t i = 0; i < n; i++)
            put_value(e.data(), sh.src_dt, i, v[i]);
          zpp_ew_add_residual_host(sh.src_dt, e.data(), acc.data(), n,
                                   acc.data());
        }
        srcs_host.push_back(e);
      }
      zpp_qb_sum_run_t run = {};
      run.count = n;
      run.first = total_src;
      run.n = nsrc[o];
      total_src += nsrc[o];
      runs.push_back(run);
      want.push_back(acc);
    }
    // device copies, packed back to back (encodes at unaligned offsets)
    size_t bytes = 0;
    for (auto &e : srcs_host)
      bytes += e.size() + 1;
    DevBuf d_src(bytes);
    std::vector<DevBuf *> outs, inits;
    std::vector<const void *> srcs;
    size_t at = 0;
    for (auto &e : srcs_host) {
      CUDA_OK(
          cudaMemcpy(d_src.p + at, e.data(), e.size(), cudaMemcpyHostToDevice));
      srcs.push_back(d_src.p + at);
      at += e.size() + 1;
    }
    for (size_t o = 0; o < runs.size(); o++) {
      outs.push_back(new DevBuf(runs[o].count * 4));
      inits.push_back(new DevBuf(init_host[o].size()));
      CUDA_OK(cudaMemcpy(sh.own ? outs[o]->p : inits[o]->p, init_host[o].data(),
                         init_host[o].size(), cudaMemcpyHostToDevice));
      runs[o].out = (float *)outs[o]->p;
      runs[o].init = sh.own ? nullptr : inits[o]->p;
    }
    CUDA_OK(cudaDeviceSynchronize());
    char err[256] = "";
    ASSERT_EQ(zpp_quant_cuda_sum_batch(sh.bits ? &q : nullptr, sh.src_dt,
                                       sh.init_dt, runs.data(), runs.size(),
                                       srcs.data(), st.s, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st.s));
    for (size_t o = 0; o < runs.size(); o++) {
      std::vector<float> got(runs[o].count);
      CUDA_OK(cudaMemcpy(got.data(), outs[o]->p, got.size() * 4,
                         cudaMemcpyDeviceToHost));
      EXPECT_EQ(0, std::memcmp(got.data(), want[o].data(), got.size() * 4))
          << "output " << o << " (" << runs[o].count << " elements, "
          << runs[o].n << " sources)";
    }
    for (auto *b : outs)
      delete b;
    for (auto *b : inits)
      delete b;
  }
}

}  // namespace
