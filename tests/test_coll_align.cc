// The collectives on buffers that start at any byte (zpp_coll.h,
// "Alignment"): fp32, fp16 and bf16 send and receive buffers 1 (16-bit
// dtypes only), 2, 6 and 14 bytes past a 256-byte boundary give the
// bitwise result of the same call on aligned buffers, and the
// full-precision reduce-scatter the exact sum (the inputs are multiples of
// 1/8 small enough that every partial sum is exact in every dtype).  On a
// GPU a 16-bit or vector access at the wrong boundary is a
// cudaErrorMisalignedAddress; the emulated runtime (tests/cuda_emu) faults
// the same way on the kernels' loads and stores.
//
// Run under mpirun (tests/elementwise_cuda.cmake), on host memory or with
// ZPP_TEST_MEMORY=device on device memory.  Seed: ZPP_TEST_SEED (default
// 20261129).
#include <gtest/gtest.h>
#include <mpi.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#ifndef ZPP_HAVE_CUDA
#define ZPP_HAVE_CUDA 0
#endif
#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_gtest_main.h"
#include "test_memory.h"

extern "C" {
#include "kernels/quant_math.h"
}

namespace {

zpp_comm_t g_comm = nullptr;
int g_rank = 0, g_size = 1, g_nnodes = 1, g_uniform = 1;

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

// Element i of rank r's send buffer: k / 8 with |k| <= 32, from a hash of
// (seed, r, i); exact in every dtype, and so is any sum of up to 64 of them.
float value(int r, size_t i) {
  uint64_t h = (seed() + 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1)) ^
               (i * 0xbf58476d1ce4e5b9ull);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  return (float)((int)(h % 65) - 32) / 8.0f;
}

std::vector<uint8_t> pack(int r, size_t n, zpp_dtype_t dt) {
  std::vector<uint8_t> v(n * zpp_dtype_size(dt));
  for (size_t i = 0; i < n; i++) {
    float x = value(r, i);
    if (dt == ZPP_FLOAT32) {
      std::memcpy(&v[4 * i], &x, 4);
    } else {
      uint16_t h =
          dt == ZPP_BFLOAT16 ? zpp_qm_f32_to_bf16(x) : zpp_qm_f32_to_f16(x);
      std::memcpy(&v[2 * i], &h, 2);
    }
  }
  return v;
}

double unpack(const std::vector<uint8_t> &v, zpp_dtype_t dt, size_t i) {
  if (dt == ZPP_FLOAT32) {
    float x;
    std::memcpy(&x, &v[4 * i], 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, &v[2 * i], 2);
  return dt == ZPP_BFLOAT16 ? zpp_qm_bf16_to_f32(h) : zpp_qm_f16_to_f32(h);
}

// Memory of the suite's space (device with ZPP_TEST_MEMORY=device, else
// host) holding `bytes` at `off` bytes past a 256-byte aligned allocation.
struct BufAt {
  const bool dev = zpp_test::DeviceMemory();
  uint8_t *base = nullptr;
  size_t off, bytes;
  BufAt(size_t off_, size_t bytes_) : off(off_), bytes(bytes_) {
    size_t all = (off + bytes + 16 + 255) / 256 * 256;
#if ZPP_HAVE_CUDA
    if (dev) {
      if (cudaMalloc(&base, all) != cudaSuccess)
        base = nullptr;
      if (base)
        cudaMemset(base, 0x5a, all);
      return;
    }
#endif
    base = static_cast<uint8_t *>(std::aligned_alloc(256, all));
    if (base)
      std::memset(base, 0x5a, all);
  }
  BufAt(const BufAt &) = delete;
  ~BufAt() {
#if ZPP_HAVE_CUDA
    if (dev) {
      cudaFree(base);
      return;
    }
#endif
    std::free(base);
  }
  void *p() const { return base + off; }
  void put(const std::vector<uint8_t> &v) const {
#if ZPP_HAVE_CUDA
    if (dev) {
      cudaMemcpy(base + off, v.data(), v.size(), cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(base + off, v.data(), v.size());
  }
  std::vector<uint8_t> get() const {
    std::vector<uint8_t> v(bytes);
#if ZPP_HAVE_CUDA
    if (dev) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cudaMemcpy(v.data(), base + off, bytes, cudaMemcpyDeviceToHost);
      return v;
    }
#endif
    std::memcpy(v.data(), base + off, bytes);
    return v;
  }
};

// A collective from send (at soff) into recv (at roff): the received bytes.
using Call = zpp_status_t (*)(const void *send, void *recv, size_t count,
                              zpp_dtype_t dt);

std::vector<uint8_t> run(Call call, size_t send_n, size_t recv_n, size_t count,
                         zpp_dtype_t dt, size_t soff, size_t roff) {
  const size_t es = zpp_dtype_size(dt);
  BufAt s(soff, send_n * es), r(roff, recv_n * es);
  EXPECT_TRUE(s.base && r.base);
  s.put(pack(g_rank, send_n, dt));
  zpp_status_t st = call(s.p(), r.p(), count, dt);
  EXPECT_EQ(st, ZPP_OK) << zpp_comm_get_last_error(g_comm);
  return r.get();
}

struct Shape {
  zpp_dtype_t dt;
  size_t soff, roff;
};

// Every dtype with send and receive buffers at the offsets of the suite,
// each call at a different pair.
std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16}) {
    std::vector<size_t> o = {2, 6, 14};
    if (dt != ZPP_FLOAT32)
      o.insert(o.begin(), 1);
    for (size_t j = 0; j < o.size(); j++)
      v.push_back({dt, o[j], o[(j + 1) % o.size()]});
  }
  return v;
}

std::string describe(const Shape &s, size_t count) {
  return std::string(zpp_dtype_name(s.dt)) + ", " + std::to_string(count) +
         " elements per rank, send at +" + std::to_string(s.soff) +
         ", recv at +" + std::to_string(s.roff);
}

// The same call on aligned buffers and at the shape's offsets: the same
// bytes on every rank.
void expect_alignment_free(Call call, bool gather) {
  for (size_t count : {(size_t)1, (size_t)7, (size_t)1000})
    for (const Shape &s : shapes()) {
      SCOPED_TRACE(describe(s, count));
      size_t send_n = gather ? count : g_size * count;
      size_t recv_n = gather ? g_size * count : count;
      auto want = run(call, send_n, recv_n, count, s.dt, 0, 0);
      auto got = run(call, send_n, recv_n, count, s.dt, s.soff, s.roff);
      EXPECT_EQ(got, want);
    }
}

zpp_redop_t g_op = ZPP_OP_SUM;

zpp_status_t reduce_scatter(const void *snd, void *rcv, size_t n,
                            zpp_dtype_t dt) {
  return zpp_reduce_scatter(g_comm, snd, rcv, n, dt, g_op, nullptr, nullptr);
}

TEST(Alignment, ReduceScatterAtAnyByteIsTheExactSum) {
  for (zpp_redop_t op : {ZPP_OP_SUM, ZPP_OP_MEAN})
    for (size_t count : {(size_t)1, (size_t)7, (size_t)1000})
      for (const Shape &s : shapes()) {
        SCOPED_TRACE(describe(s, count) +
                     (op == ZPP_OP_SUM ? ", sum" : ", mean"));
        g_op = op;
        auto got = run(reduce_scatter, g_size * count, count, count, s.dt,
                       s.soff, s.roff);
        int bad = 0;
        for (size_t i = 0; i < count; i++) {
          // the sum is exact in fp32; MEAN: one fp32 division, then the
          // rounding to the dtype (zpp_coll.h)
          double sum = 0;
          for (int r = 0; r < g_size; r++)
            sum += value(r, g_rank * count + i);
          float m = (float)sum / (float)g_size;
          double want = op == ZPP_OP_SUM      ? sum
                        : s.dt == ZPP_FLOAT32 ? m
                        : s.dt == ZPP_BFLOAT16
                            ? zpp_qm_bf16_to_f32(zpp_qm_f32_to_bf16(m))
                            : zpp_qm_f16_to_f32(zpp_qm_f32_to_f16(m));
          double g = unpack(got, s.dt, i);
          if (g != want && bad++ < 3)
            ADD_FAILURE() << "element " << i << ": " << g << ", want " << want;
        }
      }
  g_op = ZPP_OP_SUM;
}

zpp_status_t allgather(const void *snd, void *rcv, size_t n, zpp_dtype_t dt) {
  return zpp_allgather(g_comm, snd, rcv, n, dt, nullptr, nullptr);
}

TEST(Alignment, AllgatherAtAnyByteIsExact) {
  for (size_t count : {(size_t)1, (size_t)7, (size_t)1000})
    for (const Shape &s : shapes()) {
      SCOPED_TRACE(describe(s, count));
      auto got =
          run(allgather, count, g_size * count, count, s.dt, s.soff, s.roff);
      std::vector<uint8_t> want;
      for (int r = 0; r < g_size; r++) {
        auto x = pack(r, count, s.dt);
        want.insert(want.end(), x.begin(), x.end());
      }
      EXPECT_EQ(got, want);
    }
}

zpp_status_t qwz(const void *snd, void *rcv, size_t n, zpp_dtype_t dt) {
  zpp_quant_config_t q = ZPP_QUANT_CONFIG_INIT;
  q.bits = 4;
  q.block_size = 32;
  return zpp_qwz_allgather(g_comm, &q, snd, rcv, n, dt, nullptr, nullptr);
}

TEST(Alignment, QwzAtAnyByteEqualsTheAlignedCall) {
  expect_alignment_free(qwz, true);
}

zpp_status_t qgz(const void *snd, void *rcv, size_t n, zpp_dtype_t dt) {
  zpp_qgz_config_t c = ZPP_QGZ_CONFIG_INIT;
  c.hadamard = 32;
  return zpp_qgz_reduce_scatter(g_comm, &c, snd, rcv, n, dt, ZPP_OP_MEAN,
                                nullptr, nullptr, nullptr);
}

TEST(Alignment, QgzAtAnyByteEqualsTheAlignedCall) {
  expect_alignment_free(qgz, false);
}

// qgZ with error feedback (the fp32 residual) and hadamard 0 or 32: send
// and receive buffers at the shape's offsets and the residual at an odd
// byte or a 2-byte boundary give the aligned call's bits, in the output
// and in the residual, over two steps (the second reads the residual the
// first wrote).
void expect_qgz_residual_alignment_free(size_t hadamard) {
  zpp_qgz_config_t c = ZPP_QGZ_CONFIG_INIT;
  c.hadamard = hadamard;
  for (size_t count : {(size_t)7, (size_t)1000})
    for (const Shape &s : shapes()) {
      const size_t eoff = s.soff + 1; // 2, 3, 7 or 15
      SCOPED_TRACE(describe(s, count) + ", residual at +" +
                   std::to_string(eoff) + ", hadamard " +
                   std::to_string(hadamard));
      size_t rn = 0;
      ASSERT_EQ(zpp_qgz_residual_count(g_comm, count, &rn), ZPP_OK);
      const size_t es = zpp_dtype_size(s.dt);
      auto go = [&](size_t soff, size_t roff, size_t roff_res) {
        BufAt snd(soff, g_size * count * es), rcv(roff, count * es),
            res(roff_res, rn * 4);
        EXPECT_TRUE(snd.base && rcv.base && res.base);
        snd.put(pack(g_rank, g_size * count, s.dt));
        res.put(std::vector<uint8_t>(rn * 4, 0));
        for (int step = 0; step < 2; step++) {
          zpp_status_t st =
              zpp_qgz_reduce_scatter(g_comm, &c, snd.p(), rcv.p(), count, s.dt,
                                     ZPP_OP_MEAN, res.p(), nullptr, nullptr);
          EXPECT_EQ(st, ZPP_OK) << zpp_comm_get_last_error(g_comm);
        }
        std::vector<uint8_t> out = rcv.get(), r = res.get();
        out.insert(out.end(), r.begin(), r.end());
        return out;
      };
      auto want = go(0, 0, 0);
      auto got = go(s.soff, s.roff, eoff);
      EXPECT_EQ(got, want);
    }
}

TEST(Alignment, QgzWithResidualAtAnyByteEqualsTheAlignedCall) {
  expect_qgz_residual_alignment_free(0);
}

TEST(Alignment, QgzHadamardWithResidualAtAnyByteEqualsTheAlignedCall) {
  expect_qgz_residual_alignment_free(32);
}

void setup() {
  zpp_test::OpenComm((unsigned long long)seed(), &g_comm, &g_rank, &g_size,
                     &g_nnodes, &g_uniform);
}

void teardown() { zpp_comm_destroy(g_comm); }

} // namespace

int main(int argc, char **argv) {
  return zpp_test::RunAllRanks(argc, argv, setup, teardown);
}
