// The CUDA block codec (src/kernels/quant_cuda.cu) run on the CPU under
// the emulated CUDA runtime (tests/cuda_emu, libzpp_cudart_emu) and
// compared with the scalar reference bit for bit: encoded bytes with
// memcmp, decoded outputs bit for bit.  Buffers are emulated device memory
// whose inputs end at a guard page (a kernel reading past them faults).  It runs on every machine, GPU or not, and checks what the device
// test cannot check without a GPU: the work decomposition (groups, chunks,
// segments), the packing, the reductions and their synchronisation (a
// shuffle or barrier not reached by every thread fails the launch), the
// choice between the vector, element and byte access paths, and the three
// encode paths for long blocks.  The per-element floating point is the
// shared math of quant_math.h in its host form; test_quant_cuda checks the
// device form on a GPU.
//
// Seed: ZPP_TEST_SEED (default 20261129), printed by every test.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

// CTAs per launch; lowered by one test to run the kernels' grid-stride loops.
static size_t g_max_grid = (size_t)1 << 30;
#define ZPP_QUANT_CUDA_MAX_GRID g_max_grid
#include "kernels/quant_cuda.cu"  // kernels and launchers, compiled as C++
#include "quant_cuda_testdata.h"
#include "zpp_cuda_emu.h"

namespace {

using namespace zpp_test;

struct Shape {
  int dt, bits;
  bool asym;
};

std::vector<Shape> AllShapes() {
  std::vector<Shape> v;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (int bits : {8, 4})
      for (bool asym : {false, true}) v.push_back({dt, bits, asym});
  return v;
}

std::string ShapeName(const ::testing::TestParamInfo<Shape> &i) {
  const Shape &s = i.param;
  return std::string(s.dt == ZPP_QM_F32 ? "fp32" : s.dt == ZPP_QM_F16 ? "fp16" : "bf16") +
         "_int" + std::to_string(s.bits) + (s.asym ? "_asym" : "_sym");
}

// Offsets in bytes added to each buffer, to reach the element and byte
// access paths.
struct Offsets {
  size_t src = 0, enc = 0, out = 0;
};

// n bytes of device memory that end where an inaccessible page begins (the
// emulator ends every allocation whose size is a multiple of 256 bytes at
// a guard page): a kernel reading past them faults.
struct Guarded {
  uint8_t *base = nullptr, *p = nullptr;
  explicit Guarded(size_t n) {
    size_t body = (n + 255) / 256 * 256;
    if (cudaMalloc(&base, body ? body : 256) != cudaSuccess) return;
    p = base + body - n;
  }
  Guarded(const Guarded &) = delete;
  Guarded &operator=(const Guarded &) = delete;
  ~Guarded() {
    if (base) cudaFree(base);
  }
};

std::string fault() { return std::string(" (emulator: ") + zpp_emu_last_fault() + ")"; }

// Encodes and decodes one case on the emulator and on the scalar reference;
// returns false (with a failure recorded) on the first difference.
// sr: stochastic rounding with these keys and index base (docs/format.md);
// nullptr: round to nearest.
bool check_case(const Shape &s, size_t block, size_t n, const std::vector<uint8_t> &in,
                const std::vector<float> &acc0, Offsets o = Offsets(),
                const zpp_qcfg_t *sr = nullptr) {
  zpp_qcfg_t q = {s.bits, s.asym ? 1 : 0, block, 0, 0, 0, 0};
  if (sr != nullptr) {
    q.sr = 1;
    q.k0 = sr->k0;
    q.k1 = sr->k1;
    q.base = sr->base;
  }
  std::string ctx = describe(s.dt, s.bits, s.asym, block, n) + " offsets src " +
                    std::to_string(o.src) + " enc " + std::to_string(o.enc) + " out " +
                    std::to_string(o.out) +
                    (sr ? " sr base " + std::to_string(sr->base) : std::string());
  int ovf = 0;
  size_t sz = zpp_quant_bytes(&q, n, &ovf);
  size_t es = dtype_size(s.dt);
  // inputs at the requested offset, ending at a guard page
  Guarded src(n * es + o.src);
  if (src.p == nullptr) {
    ADD_FAILURE() << "cudaMalloc failed";
    return false;
  }
  EXPECT_EQ(cudaMemcpy(src.p + o.src, in.data(), n * es, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint8_t> ref(sz + 1, 0xa5), got(sz + o.enc + 1, 0xa5);
  zpp_quant_encode_scalar(&q, s.dt, in.data(), n, ref.data());
  Guarded denc(got.size());
  EXPECT_EQ(cudaMemcpy(denc.p, got.data(), got.size(), cudaMemcpyHostToDevice), cudaSuccess);
  char err[256] = "";
  int rc = zpp_quant_cuda_encode(&q, s.dt, src.p + o.src, n, denc.p + o.enc, nullptr, err,
                                 sizeof err);
  EXPECT_EQ(rc, 0) << ctx << ": " << err << fault();
  if (rc != 0) return false;
  cudaError_t ce = cudaMemcpy(got.data(), denc.p, got.size(), cudaMemcpyDeviceToHost);
  EXPECT_EQ(ce, cudaSuccess) << ctx << ": " << cudaGetErrorString(ce) << fault();
  if (ce != cudaSuccess) return false;
  if (std::memcmp(ref.data(), got.data() + o.enc, sz + 1) != 0) {
    size_t i = 0;
    while (ref[i] == got[o.enc + i]) i++;
    ADD_FAILURE() << ctx << ": encoded byte " << i << " of " << sz << " is "
                  << (int)got[o.enc + i] << ", reference " << (int)ref[i]
                  << " (metadata ends at " << zpp_quant_nblocks(&q, n) * (s.asym ? 8 : 4)
                  << ")";
    return false;
  }
  Guarded enc(sz + o.enc);  // the encoding again, ending at a guard page
  EXPECT_EQ(cudaMemcpy(enc.p, got.data(), sz + o.enc, cudaMemcpyHostToDevice), cudaSuccess);
  for (int kind : {(int)ZPP_QM_F32, (int)ZPP_QM_F16, (int)ZPP_QM_BF16, ZPP_QM_OUT_ACC}) {
    size_t w = out_size(kind);
    std::vector<uint8_t> d0(n * w + 8), d1(n * w + o.out + 8);
    for (size_t i = 0; i < d0.size(); i++) d0[i] = (uint8_t)(i * 13 + 1);
    for (size_t i = 0; i < d1.size(); i++) d1[i] = (uint8_t)((i - o.out) * 13 + 1);
    if (kind == ZPP_QM_OUT_ACC) {
      std::memcpy(d0.data(), acc0.data(), 4 * n);
      std::memcpy(d1.data() + o.out, acc0.data(), 4 * n);
    }
    zpp_quant_decode_scalar(&q, ref.data(), n, kind, d0.data());
    Guarded dout(d1.size());
    EXPECT_EQ(cudaMemcpy(dout.p, d1.data(), d1.size(), cudaMemcpyHostToDevice), cudaSuccess);
    rc = zpp_quant_cuda_decode(&q, enc.p + o.enc, n, kind, dout.p + o.out, nullptr, err,
                               sizeof err);
    EXPECT_EQ(rc, 0) << ctx << " decode " << kind_name(kind) << ": " << err << fault();
    if (rc != 0) return false;
    ce = cudaMemcpy(d1.data(), dout.p, d1.size(), cudaMemcpyDeviceToHost);
    EXPECT_EQ(ce, cudaSuccess) << ctx << " decode " << kind_name(kind) << ": "
                               << cudaGetErrorString(ce) << fault();
    if (ce != cudaSuccess) return false;
    if (std::memcmp(d0.data(), d1.data() + o.out, n * w + 8) != 0) {
      size_t i = first_mismatch(d0.data(), d1.data() + o.out, n, kind);
      ADD_FAILURE() << ctx << " decode " << kind_name(kind) << ": element " << i
                    << " differs (or the bytes after the output were touched)";
      return false;
    }
  }
  return true;
}

class QuantCudaEmu : public ::testing::TestWithParam<Shape> {};

// Every block size class (1, odd, powers of two, around the warp, CTA and
// segment limits, long blocks split over CTAs) against lengths that make
// partial chunks and tails.
TEST_P(QuantCudaEmu, EncodeAndDecodeAreBitwiseEqualToScalar) {
  const Shape s = GetParam();
  uint64_t seed = print_seed("QuantCudaEmu");
  const size_t blocks[] = {1, 2, 3, 7, 8, 9, 16, 33, 64, 256, 257, 4096, 8192, 8193, 20000};
  const size_t lengths[] = {1, 2, 7, 8, 9, 33, 257, 4097, 20011, 41017};
  auto in = make_input(seed, s.dt, 45007);
  auto acc = make_acc(seed, 45007);
  for (size_t block : blocks)
    for (size_t n : lengths) {
      if (block < 8 && n > 5000) continue;  // one fiber per element: slow
      if (!check_case(s, block, n, in, acc)) return;
    }
}

// Pointers off their vector alignment, off their element alignment, and
// metadata off 4 bytes (the looping path for long blocks).
TEST_P(QuantCudaEmu, AnyPointerAlignmentGivesTheSameBytes) {
  const Shape s = GetParam();
  uint64_t seed = print_seed("QuantCudaEmu alignment");
  auto in = make_input(seed, s.dt, 40009);
  auto acc = make_acc(seed, 40009);
  const size_t es = dtype_size(s.dt);
  const Offsets offs[] = {{es, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 2, 0},
                          {0, 0, 4}, {0, 0, 2}, {0, 0, 1}, {2 * es, 4, 8}};
  for (size_t block : {3, 32, 8200, 20000})
    for (size_t n : {9, block == 3 ? 4097 : 24001})
      for (Offsets o : offs)
        if (!check_case(s, block, n, in, acc, o)) return;
}

// A few CTAs per launch, so that each CTA loops over many work items and
// reuses its shared memory.
TEST_P(QuantCudaEmu, KernelsLoopWhenTheGridIsCapped) {
  const Shape s = GetParam();
  uint64_t seed = print_seed("QuantCudaEmu capped grid");
  auto in = make_input(seed, s.dt, 30011);
  auto acc = make_acc(seed, 30011);
  struct Restore {
    ~Restore() { g_max_grid = (size_t)1 << 30; }
  } restore;
  for (size_t grid : {1, 3})
    for (size_t block : {5, 64, 1024, 20000}) {
      g_max_grid = grid;
      if (!check_case(s, block, 30011, in, acc)) return;
      if (!check_case(s, block, 30011, in, acc, Offsets{0, 1, 0})) return;
    }
}

// Stochastic rounding: the kernels draw element i's bits at
// base + i from the same keyed generator as the scalar codec, so the bytes
// are equal, whatever the block class, the split over CTAs or the base.
TEST_P(QuantCudaEmu, StochasticRoundingIsBitwiseEqualToScalar) {
  const Shape s = GetParam();
  uint64_t seed = print_seed("QuantCudaEmu stochastic rounding");
  auto in = make_input(seed, s.dt, 24001);
  auto acc = make_acc(seed, 24001);
  zpp_qm_keys_t k = zpp_qm_rng_keys(seed);
  zpp_qcfg_t sr = {0, 0, 0, 1, k.k0, k.k1, 0};
  for (uint64_t base : {(uint64_t)0, (uint64_t)24001 * 3, ((uint64_t)1 << 33) + 5})
    for (size_t block : {7, 256, 8200})
      for (size_t n : {9, 4097, 24001}) {
        sr.base = base;
        if (!check_case(s, block, n, in, acc, Offsets(), &sr)) return;
      }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantCudaEmu, ::testing::ValuesIn(AllShapes()), ShapeName);

std::vector<const void *> kernel_log() {
  std::vector<const void *> v(64);
  size_t n = zpp_emu_kernel_log(v.data(), v.size());
  v.resize(n < v.size() ? n : v.size());
  return v;
}

// The launches each path makes, so that the tests above are known to cover
// all of them.
TEST(QuantCudaEmuPaths, EachEncodePathIsTaken) {
  print_seed("QuantCudaEmuPaths");
  auto in = make_input(test_seed(), ZPP_QM_F32, 70001);
  Guarded src(in.size()), enc(70001 * 9 + 16);
  ASSERT_EQ(cudaMemcpy(src.p, in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
  char err[256];
  auto kernels_of = [&](size_t block, size_t n, size_t enc_off) {
    zpp_qcfg_t q = {8, 0, block, 0, 0, 0, 0};
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    zpp_emu_kernel_log_clear();
    EXPECT_EQ(zpp_quant_cuda_encode(&q, ZPP_QM_F32, src.p, n, enc.base + enc_off, nullptr, err,
                                    sizeof err),
              0)
        << err;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << fault();
    return kernel_log();
  };
  const void *full = reinterpret_cast<const void *>(&encode_kernel<ZPP_QM_F32, 8, false, kFull>);
  // one segment per block
  EXPECT_EQ(kernels_of(256, 70001, 0), std::vector<const void *>{full});
  // long blocks, few of them: reset, reduce, quantise, finish
  auto split = kernels_of(20000, 70001, 0);
  ASSERT_EQ(split.size(), 4u);
  EXPECT_EQ(split[1], reinterpret_cast<const void *>(&encode_kernel<ZPP_QM_F32, 8, false, kReduce>));
  EXPECT_EQ(split[2], reinterpret_cast<const void *>(&encode_kernel<ZPP_QM_F32, 8, false, kQuant>));
  // long blocks with unaligned metadata: one looping CTA per block
  EXPECT_EQ(kernels_of(20000, 70001, 1), std::vector<const void *>{full});
  EXPECT_EQ(zpp_emu_max_block_threads(), kMaxGroup);
  // a count shorter than the block: one short block, no split
  EXPECT_EQ(kernels_of((size_t)1 << 20, 9, 0), std::vector<const void *>{full});
}

TEST(QuantCudaEmuPaths, ZeroCountLaunchesNothing) {
  zpp_qcfg_t q = {4, 1, 7, 0, 0, 0, 0};
  char err[8];
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  zpp_emu_kernel_log_clear();
  EXPECT_EQ(zpp_quant_cuda_encode(&q, ZPP_QM_F16, nullptr, 0, nullptr, nullptr, err, sizeof err), 0);
  EXPECT_EQ(zpp_quant_cuda_decode(&q, nullptr, 0, ZPP_QM_OUT_ACC, nullptr, nullptr, err, sizeof err), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(kernel_log().empty());
}

}  // namespace
