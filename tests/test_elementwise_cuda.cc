// Tests of the element-wise device kernels (src/kernels/elementwise_cuda.cu:
// finish, scale, add_residual, residual, ema_residual, widen;
// src/kernels/transform_cuda.cu: convert, wdiff and the Hadamard scaling)
// against a scalar float64 reference, on random data with a printed seed,
// for lengths 0, 1, 7, 8, 9 and 1000003 and buffers that start 0, 2, 4, 6,
// 8 or 14 bytes (and 1 byte for fp16 and bf16) past a 256-byte boundary,
// each buffer of a call at its own offset.  The bytes around every output
// must stay untouched.
//
// The reference is exact, so the comparison is bit for bit (any NaN for a
// NaN): each kernel rounds every arithmetic step once to fp32 (no FMA), and
// the reference does that step in float64 and rounds the result to fp32.
// For +, -, * and / of two fp32 values the float64 result rounded to fp32
// is the correctly rounded fp32 result (double rounding is innocuous when
// the wider format has at least 2 * 24 + 2 = 50 significand bits; float64
// has 53), and conversions to fp16 and bf16 are done here by a search of
// the nearest representable value, ties to even.
//
// On the emulator (an emulated build: tests/cuda_emu) a misaligned access
// of the kernels' loads and stores is a sticky cudaErrorMisalignedAddress,
// as on a GPU, so the odd and 2-byte offsets check that the kernels never
// make a vector or 16-bit access the GPU would refuse.
//
// Every test skips with "no CUDA device" when zpp_cuda_available() is 0.
// Seed: ZPP_TEST_SEED (default 20261129).
#include <gtest/gtest.h>

#include <zpp/zpp.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/quant_math.h"
#include "kernels/transform.h"
#if ZPP_TEST_CUDA_EMU
#include "zpp_cuda_emu.h"
#endif

// A named namespace: test_elementwise_cuda_arch.cc includes this file after
// elementwise_cuda.cu, whose helpers live in the unnamed one.
namespace zpp_ew_test {

uint64_t test_seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

// splitmix64
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

std::string last_fault() {
#if ZPP_TEST_CUDA_EMU
  return std::string(" (emulator: ") + zpp_emu_last_fault() + ")";
#else
  return "";
#endif
}

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    ASSERT_EQ(e_, cudaSuccess)                                                 \
        << #call << ": " << cudaGetErrorString(e_) << last_fault();            \
  } while (0)

// Whether a device is there (test_elementwise_cuda_arch.cc, which does not
// link libzpp, asks the runtime).
#ifndef ZPP_TEST_DEVICE_AVAILABLE
#define ZPP_TEST_DEVICE_AVAILABLE() zpp_cuda_available()
#endif

#define SKIP_WITHOUT_DEVICE()                                                  \
  do {                                                                         \
    if (!ZPP_TEST_DEVICE_AVAILABLE())                                          \
      GTEST_SKIP() << "no CUDA device";                                        \
  } while (0)

// ---- the reference: dtype values and rounding, in float64 ---------------

const int kF32 = ZPP_QM_F32, kF16 = ZPP_QM_F16, kBF16 = ZPP_QM_BF16;

size_t esize(int dt) { return dt == kF32 ? 4 : 2; }
const char *dname(int dt) {
  return dt == kF32 ? "fp32" : dt == kF16 ? "fp16" : "bf16";
}

// The value of the bits of one element (the low 16 bits for fp16, bf16).
double value_of(int dt, uint32_t b) {
  if (dt == kF32) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (dt == kBF16)
    return value_of(kF32, b << 16);
  int sign = b >> 15 & 1, exp = b >> 10 & 0x1f, man = b & 0x3ff;
  double v;
  if (exp == 0x1f)
    v = man ? NAN : INFINITY;
  else if (exp == 0)
    v = std::ldexp((double)man, -24);
  else
    v = std::ldexp((double)(man | 0x400), exp - 25);
  return sign ? -v : v;
}

// Bits of the dt value nearest to v (a finite or infinite double, or NaN),
// ties to even; beyond the largest finite value by half a step or more,
// Inf.  For fp32 the cast (the host's IEEE conversion).
uint32_t round_to(int dt, double v) {
  if (dt == kF32) {
    float f = (float)v;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  const uint32_t inf = dt == kF16 ? 0x7c00u : 0x7f80u;
  if (std::isnan(v))
    return inf | (dt == kF16 ? 0x200u : 0x40u); /* quiet; "any NaN" */
  uint32_t sign = std::signbit(v) ? 0x8000u : 0u;
  double a = std::fabs(v);
  // largest finite pattern lo with value(lo) <= a; Inf counts as the next
  // step (2^16 for fp16, 2^128 for bf16) so that overflow rounds as IEEE
  auto val = [&](uint32_t p) {
    return p == inf ? (dt == kF16 ? 65536.0 : std::ldexp(1.0, 128))
                    : value_of(dt, p);
  };
  if (a >= val(inf))
    return sign | inf;
  uint32_t lo = 0, hi = inf; /* val(lo) <= a < val(hi) */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    (val(mid) <= a ? lo : hi) = mid;
  }
  double dlo = a - val(lo), dhi = val(hi) - a;
  uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1u) ? hi : lo;
  return sign | r;
}

float f32(double v) { return (float)v; }

bool is_nan_bits(int dt, uint32_t b) {
  return dt == kF32   ? (b & 0x7fffffffu) > 0x7f800000u
         : dt == kF16 ? (b & 0x7fffu) > 0x7c00u
                      : (b & 0x7fffu) > 0x7f80u;
}

// ---- buffers -------------------------------------------------------------

// Random dt elements: mostly finite values of varied magnitude, and at
// random places the values the conversions and the residuals treat
// specially (+-0, +-Inf, NaN, subnormals, values near the fp16 limit and
// halfway between two bf16 or fp16 values).
std::vector<uint8_t> random_elems(int dt, size_t n, Rng &rng) {
  std::vector<uint8_t> v(n * esize(dt));
  static const double special[] = {0.0,      -0.0,       INFINITY, -INFINITY,
                                   NAN,      1e-40,      -3e-42,   6e-8,
                                   -2.5e-6,  65504.0,    65519.0,  65520.0,
                                   -70000.0, 1.00390625, 3e38,     -1.5};
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng.next();
    double x;
    if ((r & 31) == 0) {
      x = special[(r >> 5) % (sizeof special / sizeof special[0])];
    } else {
      double m = (double)(r >> 40) / (double)(1ull << 24) + 1.0; /* [1, 2) */
      int e = (int)((r >> 8) % 61) - 30;
      x = ((r >> 16) & 1 ? -m : m) * std::ldexp(1.0, e);
      if (dt == kF32) /* full fp32 mantissas */
        x = f32(x + std::ldexp((double)((r >> 20) & 0xfff), e - 36));
    }
    uint32_t b = round_to(dt, x);
    std::memcpy(&v[i * esize(dt)], &b, esize(dt));
  }
  return v;
}

uint32_t bits_at(int dt, const std::vector<uint8_t> &v, size_t i) {
  uint32_t b = 0;
  std::memcpy(&b, &v[i * esize(dt)], esize(dt));
  return b;
}
double elem(int dt, const std::vector<uint8_t> &v, size_t i) {
  return value_of(dt, bits_at(dt, v, i));
}

// The bytes of one buffer of the call: device memory with the elements at
// `off` bytes past a 256-byte aligned allocation, random guard bytes around
// them.
struct DevBuf {
  int dt;
  size_t n, off;
  std::vector<uint8_t> init; /* the whole allocation as filled */
  uint8_t *d = nullptr;
  DevBuf(int dt_, size_t n_, size_t off_, const std::vector<uint8_t> &elems,
         Rng &rng)
      : dt(dt_), n(n_), off(off_) {
    init.resize(off + n * esize(dt) + 64);
    for (auto &b : init)
      b = (uint8_t)rng.next();
    if (!elems.empty())
      std::memcpy(&init[off], elems.data(), elems.size());
    if (cudaMalloc(&d, init.size()) != cudaSuccess ||
        cudaMemcpy(d, init.data(), init.size(), cudaMemcpyHostToDevice) !=
            cudaSuccess)
      d = nullptr;
  }
  DevBuf(const DevBuf &) = delete;
  ~DevBuf() {
    if (d)
      cudaFree(d);
  }
  void *p() const { return n ? d + off : nullptr; }
  std::vector<uint8_t> elems() const {
    return std::vector<uint8_t>(init.begin() + off,
                                init.begin() + off + n * esize(dt));
  }
};

// Reads back the buffer; checks the guard bytes and every element against
// want (the reference bits; NaN stands for any NaN).
void expect_out(const DevBuf &b, const std::vector<uint32_t> &want) {
  std::vector<uint8_t> got(b.init.size());
  CUDA_OK(cudaMemcpy(got.data(), b.d, got.size(), cudaMemcpyDeviceToHost));
  const size_t lo = b.off, hi = b.off + b.n * esize(b.dt);
  for (size_t i = 0; i < got.size(); i++)
    if ((i < lo || i >= hi) && got[i] != b.init[i])
      FAIL() << "byte " << (long)i - (long)lo
             << " relative to the output was overwritten";
  size_t bad = 0;
  for (size_t i = 0; i < b.n; i++) {
    uint32_t gb = 0, w = want[i];
    std::memcpy(&gb, &got[lo + i * esize(b.dt)], esize(b.dt));
    bool ok = is_nan_bits(b.dt, w) ? is_nan_bits(b.dt, gb) : gb == w;
    if (!ok && bad++ < 3)
      ADD_FAILURE() << "element " << i << " of " << b.n << ": 0x" << std::hex
                    << gb << ", want 0x" << w << std::dec;
  }
  EXPECT_EQ(bad, 0u) << "elements wrong";
}

// ---- cases -----------------------------------------------------------------

// The longest length (test_elementwise_cuda_arch.cc and the emulated
// build shorten it).
#ifndef ZPP_TEST_ELEMENTWISE_LONG
#define ZPP_TEST_ELEMENTWISE_LONG 1000003
#endif
const size_t kLengths[] = {0, 1, 7, 8, 9, ZPP_TEST_ELEMENTWISE_LONG};

// Byte offsets for a buffer of dt: 1 only for the 16-bit dtypes.
std::vector<size_t> offsets_for(int dt) {
  std::vector<size_t> o = {0, 2, 4, 6, 8, 14};
  if (dt != kF32)
    o.insert(o.begin() + 1, 1);
  return o;
}

enum Kernel {
  kFinish,
  kFinishInPlace, /* out == acc, fp32 */
  kScale,
  kAddResidual,
  kAddResidualInPlace, /* out == res */
  kResidual,
  kEmaResidual,
  kWiden,
  kConvert,
  kWdiff,
  kWdiffInPlace, /* out == target */
};

const char *kname(Kernel k) {
  static const char *const n[] = {"finish",
                                  "finish_in_place",
                                  "scale",
                                  "add_residual",
                                  "add_residual_in_place",
                                  "residual",
                                  "ema_residual",
                                  "widen",
                                  "convert",
                                  "wdiff",
                                  "wdiff_in_place"};
  return n[k];
}

struct Case {
  Kernel k;
  int dt; /* the dtype buffer's; kF32 for the fp32-only kernels */
};

// One call of kernel c.k on n elements whose buffers start at the byte
// offsets o[0], o[1], ... (in the order of the call's buffers).
void run_case(const Case &c, size_t n, const size_t *o, Rng &rng,
              cudaStream_t st) {
  const int dt = c.dt;
  char err[256] = "";
  const float div = 3.0f, beta = 0.875f;
  std::vector<uint32_t> want(n);
  switch (c.k) {
  case kFinish:
  case kFinishInPlace: {
    for (float dv : {1.0f, div}) {
      SCOPED_TRACE("div " + std::to_string(dv));
      DevBuf acc(kF32, n, o[0], random_elems(kF32, n, rng), rng);
      bool inplace = c.k == kFinishInPlace;
      DevBuf out(dt, inplace ? 0 : n, o[1], {}, rng);
      ASSERT_TRUE(acc.d && out.d);
      std::vector<uint8_t> a = acc.elems();
      for (size_t i = 0; i < n; i++)
        want[i] = round_to(dt, dv == 1.0f ? elem(kF32, a, i)
                                          : (double)f32(elem(kF32, a, i) / dv));
      void *dst = inplace ? acc.p() : out.p();
      ASSERT_EQ(zpp_ew_finish_device((const float *)acc.p(), n, dv, dt, dst, st,
                                     err, sizeof err),
                0)
          << err;
      CUDA_OK(cudaStreamSynchronize(st));
      expect_out(inplace ? acc : out, want);
    }
    return;
  }
  case kScale: {
    DevBuf buf(dt, n, o[0], random_elems(dt, n, rng), rng);
    ASSERT_TRUE(buf.d);
    std::vector<uint8_t> a = buf.elems();
    for (size_t i = 0; i < n; i++)
      want[i] = round_to(dt, f32(elem(dt, a, i) / div));
    ASSERT_EQ(zpp_ew_scale_device(dt, buf.p(), n, div, st, err, sizeof err), 0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    expect_out(buf, want);
    return;
  }
  case kAddResidual:
  case kAddResidualInPlace: {
    bool inplace = c.k == kAddResidualInPlace;
    DevBuf g(dt, n, o[0], random_elems(dt, n, rng), rng);
    DevBuf res(kF32, n, o[1], random_elems(kF32, n, rng), rng);
    DevBuf out(kF32, inplace ? 0 : n, o[2], {}, rng);
    ASSERT_TRUE(g.d && res.d && out.d);
    std::vector<uint8_t> a = g.elems(), r = res.elems();
    for (size_t i = 0; i < n; i++)
      want[i] = round_to(kF32, elem(dt, a, i) + elem(kF32, r, i));
    float *dst = (float *)(inplace ? res.p() : out.p());
    ASSERT_EQ(zpp_ew_add_residual_device(dt, g.p(), (const float *)res.p(), n,
                                         dst, st, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    expect_out(inplace ? res : out, want);
    return;
  }
  case kResidual: {
    DevBuf x(kF32, n, o[0], random_elems(kF32, n, rng), rng);
    DevBuf res(kF32, n, o[1], random_elems(kF32, n, rng), rng);
    ASSERT_TRUE(x.d && res.d);
    std::vector<uint8_t> a = x.elems(), r = res.elems();
    for (size_t i = 0; i < n; i++) {
      double e = f32(elem(kF32, a, i) - elem(kF32, r, i));
      want[i] = round_to(kF32, std::isfinite(e) ? e : 0.0);
    }
    ASSERT_EQ(zpp_ew_residual_device((const float *)x.p(), n, (float *)res.p(),
                                     st, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    expect_out(res, want);
    return;
  }
  case kEmaResidual: {
    DevBuf x(kF32, n, o[0], random_elems(kF32, n, rng), rng);
    DevBuf dec(kF32, n, o[1], random_elems(kF32, n, rng), rng);
    DevBuf res(kF32, n, o[2], random_elems(kF32, n, rng), rng);
    ASSERT_TRUE(x.d && dec.d && res.d);
    std::vector<uint8_t> a = x.elems(), d = dec.elems(), r = res.elems();
    const double omega = f32(1.0 - beta);
    for (size_t i = 0; i < n; i++) {
      double diff = f32(elem(kF32, a, i) - elem(kF32, d, i));
      double e =
          f32((double)f32(beta * elem(kF32, r, i)) + (double)f32(omega * diff));
      want[i] = round_to(kF32, std::isfinite(e) ? e : 0.0);
    }
    ASSERT_EQ(zpp_ew_ema_residual_device((const float *)x.p(),
                                         (const float *)dec.p(), n, beta,
                                         (float *)res.p(), st, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    expect_out(res, want);
    return;
  }
  case kWiden:
  case kConvert: {
    DevBuf src(dt, n, o[0], random_elems(dt, n, rng), rng);
    DevBuf out(kF32, n, o[1], {}, rng);
    ASSERT_TRUE(src.d && out.d);
    std::vector<uint8_t> a = src.elems();
    for (size_t i = 0; i < n; i++)
      want[i] = round_to(kF32, elem(dt, a, i));
    // convert: the Hadamard transform with groups of 1 (no rotation)
    int rc = c.k == kWiden
                 ? zpp_ew_widen_device(dt, src.p(), n, (float *)out.p(), st,
                                       err, sizeof err)
                 : zpp_tf_hadamard_device(1, dt, src.p(), n, (float *)out.p(),
                                          st, err, sizeof err);
    ASSERT_EQ(rc, 0) << err;
    CUDA_OK(cudaStreamSynchronize(st));
    expect_out(out, want);
    return;
  }
  case kWdiff:
  case kWdiffInPlace: {
    bool inplace = c.k == kWdiffInPlace;
    DevBuf recon(dt, n, o[0], random_elems(dt, n, rng), rng);
    DevBuf target(kF32, n, o[1], random_elems(kF32, n, rng), rng);
    DevBuf out(kF32, inplace ? 0 : n, o[2], {}, rng);
    ASSERT_TRUE(recon.d && target.d && out.d);
    std::vector<uint8_t> a = recon.elems(), t = target.elems();
    for (size_t i = 0; i < n; i++)
      want[i] = round_to(kF32, elem(kF32, t, i) - elem(dt, a, i));
    float *dst = (float *)(inplace ? target.p() : out.p());
    ASSERT_EQ(zpp_tf_wdiff_device(dt, recon.p(), (const float *)target.p(), n,
                                  dst, st, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    expect_out(inplace ? target : out, want);
    return;
  }
  }
}

// The dtype of each buffer of a kernel's call, in the order of run_case.
std::vector<int> buffer_dtypes(const Case &c) {
  switch (c.k) {
  case kFinish:
    return {kF32, c.dt};
  case kFinishInPlace:
    return {kF32, kF32};
  case kScale:
    return {c.dt};
  case kAddResidual:
    return {c.dt, kF32, kF32};
  case kAddResidualInPlace:
    return {c.dt, kF32, kF32};
  case kResidual:
    return {kF32, kF32};
  case kEmaResidual:
    return {kF32, kF32, kF32};
  case kWiden:
  case kConvert:
    return {c.dt, kF32};
  case kWdiff:
  case kWdiffInPlace:
    return {c.dt, kF32, kF32};
  }
  return {};
}

void PrintTo(const Case &c, std::ostream *os) {
  *os << kname(c.k) << " " << dname(c.dt);
}

// A fault is sticky on the device: cleared after each test in an emulated
// build, so that one test's fault fails that test alone.
void clear_fault() {
#if ZPP_TEST_CUDA_EMU
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess)
    zpp_emu_clear_sticky_error(dev);
  (void)cudaGetLastError();
#endif
}

class ElementwiseCuda : public ::testing::TestWithParam<Case> {
protected:
  void TearDown() override { clear_fault(); }
};

// Every length, and for each offset j: all buffers at offset j, then
// buffer b at offset j + b (modulo the list of its dtype), so that the
// buffers of a call are aligned alike and differently (the longest length
// only the second way: every buffer still meets every offset).
TEST_P(ElementwiseCuda, EqualsTheFloat64ReferenceAtEveryOffset) {
  SKIP_WITHOUT_DEVICE();
  const Case c = GetParam();
  const uint64_t seed = test_seed();
  std::printf("[ seed ] ElementwiseCuda %s %s: ZPP_TEST_SEED=%llu\n",
              kname(c.k), dname(c.dt), (unsigned long long)seed);
  Rng rng(seed ^ ((uint64_t)c.k << 40) ^ ((uint64_t)c.dt << 32));
  cudaStream_t st = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const std::vector<int> dts = buffer_dtypes(c);
  for (size_t n : kLengths)
    for (int rotate = n > 1000 ? 1 : 0; rotate < 2; rotate++)
      for (size_t j = 0; j < 7; j++) {
        size_t o[3] = {0, 0, 0};
        std::string where;
        for (size_t b = 0; b < dts.size(); b++) {
          std::vector<size_t> offs = offsets_for(dts[b]);
          o[b] = offs[(j + (rotate ? b : 0)) % offs.size()];
          where += (b ? ", " : "") + std::to_string(o[b]);
        }
        SCOPED_TRACE(std::string(kname(c.k)) + " " + dname(c.dt) + ", " +
                     std::to_string(n) + " elements, buffers at offsets " +
                     where);
        run_case(c, n, o, rng, st);
        if (HasFailure()) {
          cudaStreamDestroy(st);
          return;
        }
      }
  CUDA_OK(cudaStreamDestroy(st));
}

std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (int dt : {kF32, kF16, kBF16})
    for (Kernel k : {kFinish, kScale, kAddResidual, kAddResidualInPlace, kWiden,
                     kConvert, kWdiff, kWdiffInPlace})
      v.push_back({k, dt});
  for (Kernel k : {kFinishInPlace, kResidual, kEmaResidual})
    v.push_back({k, kF32});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, ElementwiseCuda, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case> &i) {
                           return std::string(kname(i.param.k)) + "_" +
                                  dname(i.param.dt);
                         });

// The scaling of the Hadamard transform (transform_cuda.cu's scale_kernel,
// after the stages of groups above 1024) at fp32 offsets: bitwise the
// scalar transform, the definition every path is tested against.
class ElementwiseCudaHadamard : public ::testing::Test {
protected:
  void TearDown() override { clear_fault(); }
};

TEST_F(ElementwiseCudaHadamard, TheScalingOfLargeGroupsEqualsTheScalarPath) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t seed = test_seed();
  std::printf("[ seed ] ElementwiseCudaHadamard: ZPP_TEST_SEED=%llu\n",
              (unsigned long long)seed);
  Rng rng(seed);
  cudaStream_t st = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t g = 2048, n = 3 * g + 5;
  for (size_t off : {0, 4, 8, 12}) {
    SCOPED_TRACE("buffer at offset " + std::to_string(off));
    std::vector<uint8_t> x = random_elems(kF32, n, rng);
    std::vector<float> want(n);
    zpp_tf_hadamard_scalar(g, kF32, x.data(), n, want.data());
    DevBuf buf(kF32, n, off, x, rng);
    ASSERT_TRUE(buf.d);
    char err[256] = "";
    ASSERT_EQ(zpp_tf_hadamard_device(g, kF32, buf.p(), n, (float *)buf.p(), st,
                                     err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    std::vector<uint32_t> wb(n);
    std::memcpy(wb.data(), want.data(), 4 * n);
    expect_out(buf, wb);
  }
  CUDA_OK(cudaStreamDestroy(st));
}

} // namespace zpp_ew_test
