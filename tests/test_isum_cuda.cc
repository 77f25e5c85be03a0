// The CUDA kernels of qgZ's integer sums (src/kernels/isum_cuda.cu) on the
// emulated CUDA runtime, bit for bit against the scalar reference
// (zpp_isum_*_scalar of quant_cpu.h): random data with a printed seed,
// fp32/fp16/bf16, INT4/INT8, blocks that do not divide the counts (odd
// tails, blocks shorter than a chunk), without a residual and with an fp32
// or INT8 one (plain and moving average, reset), nearest and stochastic
// rounding, all-zero and non-finite blocks, residuals beyond the unit clamp
// and NaN, several runs per launch packed at 16-byte, element and odd byte
// offsets, a sum with more messages than one launch takes (its own slice's
// residual updated once), a finish with more messages than one launch
// takes (rounded once).  An INT8 residual's reference is the host path's:
// decode, scalar kernel, encode.
//
// Seed: ZPP_TEST_SEED (default 20261129).  Label emu
// (tests/isum_cuda_emu.cmake).
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <zpp/zpp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/exec.h"
#include "kernels/isum_cuda.h"
#include "kernels/quant_cpu.h"
#include "kernels/quant_math.h"
#include "isum_testdata.h"
#include "zpp_cuda_emu.h"

namespace {

uint64_t test_seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    ASSERT_EQ(e_, cudaSuccess)                                                 \
        << #call << ": " << cudaGetErrorString(e_)                             \
        << " (emulator: " << zpp_emu_last_fault() << ")";                      \
  } while (0)

// One device buffer holding every run's piece, back to back: piece i
// starts at a 16-byte boundary plus 0, one element or one byte (i % 3), so
// that the vector, element and byte paths all run.
struct Packed {
  std::vector<size_t> off;
  size_t bytes = 0;
  void add(size_t n, size_t es, size_t i) {
    bytes = (bytes + 15) / 16 * 16 + (i % 3 == 0 ? 0 : i % 3 == 1 ? es : 1);
    off.push_back(bytes);
    bytes += n;
  }
};

struct Dev {
  uint8_t *p = nullptr;
  explicit Dev(size_t n) { cudaMalloc(&p, n + 16); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
};

// Elements stored as dtype (tests/isum_testdata.h).
void fill_input(std::mt19937_64 &rng, int dt, size_t count, size_t block,
                uint8_t *v) {
  isum_fill_input(rng, dt, count, block, v);
}

// Residuals around a unit 2^-8 of the data's order, a few NaN and a few
// beyond the unit clamp of the requant.
std::vector<float> make_res(std::mt19937_64 &rng, size_t count) {
  std::vector<float> r(count);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-14, 4);
  for (auto &x : r) {
    uint64_t k = rng() % 101;
    x = k == 0 ? NAN : k == 1 ? 1e30f * u(rng) : std::ldexp(u(rng), ex(rng));
  }
  return r;
}

// Agreed exponents: the own one, or a larger one of another rank.
std::vector<int8_t> agree(std::mt19937_64 &rng, const uint32_t *amax, size_t nb,
                          int bits) {
  std::vector<int8_t> e(nb);
  for (size_t b = 0; b < nb; b++) {
    int own = zpp_qm_unit_exp(amax[b], bits);
    int other = (int)(rng() % 30) - 20;
    e[b] = (int8_t)(own == ZPP_QM_UEXP_NONFINITE || rng() % 3
                        ? own
                        : std::max(own, other));
  }
  return e;
}

// The residual of a run as the device holds it (fp32 floats, or the INT8
// encode of them) and the reference's fp32 view of it.
struct Resid {
  std::vector<uint8_t> stored;
  int kind;
  size_t count, block;
  zpp_qcfg_t q8() const { return zpp_qcfg_t{8, 0, block, 0, 0, 0, 0}; }
  Resid(int k, const std::vector<float> &v, size_t blk)
      : kind(k), count(v.size()), block(blk) {
    if (kind == ZPP_QB_RES_I8) {
      zpp_qcfg_t q = q8();
      int ov = 0;
      stored.resize(zpp_quant_bytes(&q, count, &ov));
      zpp_quant_encode_scalar(&q, ZPP_QM_F32, v.data(), count, stored.data());
    } else if (kind == ZPP_QB_RES_F32) {
      stored.resize(count * 4);
      std::memcpy(stored.data(), v.data(), count * 4);
    }
  }
  // The values the kernel reads (zeros with reset).
  std::vector<float> values(bool reset) const {
    std::vector<float> v(count, 0.0f);
    if (reset || kind == ZPP_QB_RES_NONE)
      return v;
    if (kind == ZPP_QB_RES_F32) {
      std::memcpy(v.data(), stored.data(), count * 4);
    } else {
      zpp_qcfg_t q = q8();
      zpp_quant_decode_scalar(&q, stored.data(), count, ZPP_QM_F32, v.data());
    }
    return v;
  }
  // The new errors stored back.
  void store(const std::vector<float> &v) {
    if (kind == ZPP_QB_RES_F32) {
      std::memcpy(stored.data(), v.data(), count * 4);
    } else if (kind == ZPP_QB_RES_I8) {
      zpp_qcfg_t q = q8();
      zpp_quant_encode_scalar(&q, ZPP_QM_F32, v.data(), count, stored.data());
    }
  }
};

struct Case {
  int dt, bits, res, reset, sr;
  float beta;
  size_t block;
  std::string name() const {
    return std::string(dt == ZPP_QM_F32   ? "fp32"
                       : dt == ZPP_QM_F16 ? "fp16"
                                          : "bf16") +
           " INT" + std::to_string(bits) + " res " + std::to_string(res) +
           (reset ? " reset" : "") + " beta " + std::to_string(beta) +
           (sr ? " sr" : " rne") + " block " + std::to_string(block);
  }
};

std::vector<Case> cases() {
  struct R {
    int res, reset;
    float beta;
  };
  const R rs[] = {{ZPP_QB_RES_NONE, 0, 0.0f}, {ZPP_QB_RES_F32, 0, 0.0f},
                  {ZPP_QB_RES_F32, 1, 0.5f},  {ZPP_QB_RES_I8, 0, 0.0f},
                  {ZPP_QB_RES_I8, 0, 0.8f},   {ZPP_QB_RES_I8, 1, 0.0f}};
  const size_t blocks[] = {64, 7, 33, 256, 100, 1};
  std::vector<Case> v;
  size_t k = 0;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (int bits : {4, 8})
      for (const R &r : rs)
        for (int sr = 0; sr < 2; sr++, k++)
          v.push_back({dt, bits, r.res, r.reset, sr, r.beta, blocks[k % 6]});
  return v;
}

constexpr size_t kRuns = 5;

template <class T>
void upload(const Dev &d, const Packed &pk, size_t i, const std::vector<T> &v) {
  if (!v.empty())
    cudaMemcpy(d.p + pk.off[i], v.data(), v.size() * sizeof(T),
               cudaMemcpyHostToDevice);
}

std::vector<uint8_t> download(const Dev &d, const Packed &pk, size_t i,
                              size_t n) {
  std::vector<uint8_t> v(n);
  if (n)
    cudaMemcpy(v.data(), d.p + pk.off[i], n, cudaMemcpyDeviceToHost);
  return v;
}

template <class T>
::testing::AssertionResult same(const std::vector<T> &want,
                                const std::vector<uint8_t> &got) {
  const uint8_t *a = (const uint8_t *)want.data();
  size_t n = want.size() * sizeof(T);
  if (got.size() != n)
    return ::testing::AssertionFailure() << "size";
  for (size_t k = 0; k < n; k++)
    if (a[k] != got[k])
      return ::testing::AssertionFailure()
             << "first differing byte " << k << " of " << n << " (element "
             << k / sizeof(T) << "): " << (int)a[k] << " (scalar) vs "
             << (int)got[k] << " (device)";
  return ::testing::AssertionSuccess();
}

size_t launches() { return zpp_emu_kernel_log(nullptr, 0); }

// Stage 1 on one rank: absmax, encode of kRuns slices, against the scalar
// kernels; then the sum of those messages (and more) into int32.
TEST(IsumCuda, AbsmaxEncodeAndSumAreTheScalarKernels) {
  const uint64_t seed = test_seed();
  std::printf("[ seed ] IsumCuda stage 1: ZPP_TEST_SEED=%llu\n",
              (unsigned long long)seed);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  size_t ci = 0;
  for (const Case &c : cases()) {
    SCOPED_TRACE(c.name());
    std::mt19937_64 rng(seed * 1000003ull + ci++);
    const size_t es = zpp_qm_dtype_bytes(c.dt);
    zpp_qcfg_t q = {c.bits, 0, c.block, c.sr, 0, 0, 0};
    std::vector<size_t> count(kRuns);
    for (size_t i = 0; i < kRuns; i++)
      count[i] = i == 2 ? 2 * c.block : 1 + rng() % (3 * c.block + 20);
    std::vector<std::vector<uint8_t>> src(kRuns);
    std::vector<Resid> res;
    std::vector<int> has_res(kRuns);
    Packed psrc, pres, pamax, pexp, puexp, pdst;
    for (size_t i = 0; i < kRuns; i++) {
      size_t nb = zpp_quant_nblocks(&q, count[i]);
      src[i].resize(count[i] * es);
      fill_input(rng, c.dt, count[i], c.block, src[i].data());
      has_res[i] = c.res != ZPP_QB_RES_NONE && i != 1; // run 1: own slice
      res.emplace_back(has_res[i] ? c.res : ZPP_QB_RES_NONE,
                       make_res(rng, count[i]), c.block);
      psrc.add(src[i].size(), es, i);
      pres.add(res[i].stored.size(), 4, i);
      pamax.add(nb * 4, 4, i);
      pexp.add(nb, 1, i);
      puexp.add(nb, 1, i);
      pdst.add(zpp_isum_msg_bytes(&q, count[i]), 4, i);
    }
    Dev dsrc(psrc.bytes), dres(pres.bytes), damax(pamax.bytes),
        dexp(pexp.bytes), duexp(puexp.bytes), ddst(pdst.bytes);
    for (size_t i = 0; i < kRuns; i++) {
      upload(dsrc, psrc, i, src[i]);
      upload(dres, pres, i, res[i].stored);
    }
    zpp_isum_cuda_t cfg = {c.bits, c.block, c.dt, c.sr, c.res, c.reset, c.beta};
    char err[256] = "";

    // absmax (and the own exponents)
    std::vector<zpp_isum_cuda_absmax_run_t> ar(kRuns);
    for (size_t i = 0; i < kRuns; i++) {
      ar[i].src = dsrc.p + psrc.off[i];
      ar[i].res = has_res[i] ? dres.p + pres.off[i] : nullptr;
      ar[i].res_codes = has_res[i] ? dres.p + pres.off[i] +
                                         4 * zpp_quant_nblocks(&q, count[i])
                                   : nullptr;
      ar[i].count = count[i];
      ar[i].amax = (uint32_t *)(damax.p + pamax.off[i]);
      ar[i].uexp = (int8_t *)(dexp.p + pexp.off[i]);
    }
    size_t l0 = launches();
    ASSERT_EQ(zpp_isum_cuda_absmax(&cfg, ar.data(), kRuns, st, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    EXPECT_EQ(launches() - l0, 1u) << "one absmax launch for the runs";
    std::vector<std::vector<uint32_t>> amax(kRuns);
    std::vector<std::vector<int8_t>> uexp(kRuns);
    for (size_t i = 0; i < kRuns; i++) {
      size_t nb = zpp_quant_nblocks(&q, count[i]);
      std::vector<float> rv = res[i].values(false);
      amax[i].resize(nb);
      zpp_isum_absmax_scalar(&q, c.dt, src[i].data(),
                             has_res[i] && !c.reset ? rv.data() : nullptr,
                             count[i], amax[i].data());
      ASSERT_TRUE(same(amax[i], download(damax, pamax, i, nb * 4)))
          << "absmax of run " << i << " (" << count[i] << " elements)";
      std::vector<int8_t> own(nb);
      for (size_t b = 0; b < nb; b++)
        own[b] = (int8_t)zpp_qm_unit_exp(amax[i][b], c.bits);
      ASSERT_TRUE(same(own, download(dexp, pexp, i, nb)))
          << "own exponents of run " << i;
      uexp[i] = agree(rng, amax[i].data(), nb, c.bits);
      upload(duexp, puexp, i, uexp[i]);
    }

    // encode
    std::vector<zpp_isum_cuda_encode_run_t> er(kRuns);
    std::vector<std::vector<uint8_t>> want(kRuns);
    for (size_t i = 0; i < kRuns; i++) {
      size_t nb = zpp_quant_nblocks(&q, count[i]);
      er[i].src = dsrc.p + psrc.off[i];
      er[i].res = has_res[i] ? dres.p + pres.off[i] : nullptr;
      er[i].res_codes = has_res[i] ? dres.p + pres.off[i] + 4 * nb : nullptr;
      er[i].amax = (const uint32_t *)(damax.p + pamax.off[i]);
      er[i].uexp = (const int8_t *)(duexp.p + puexp.off[i]);
      er[i].dst = ddst.p + pdst.off[i];
      er[i].count = count[i];
      er[i].base = i == 3 ? 0xffffffffull - count[i] / 2 : 1000 * i;
      er[i].seed = seed + 17 * i;
      zpp_qcfg_t qi = q;
      zpp_qm_keys_t k = zpp_qm_rng_keys(er[i].seed);
      qi.k0 = k.k0;
      qi.k1 = k.k1;
      qi.base = er[i].base;
      want[i].resize(zpp_isum_msg_bytes(&q, count[i]));
      std::vector<float> rv = res[i].values(c.reset);
      zpp_isum_encode_scalar(
          &qi, c.dt, src[i].data(), has_res[i] ? rv.data() : nullptr, c.beta,
          amax[i].data(), uexp[i].data(), count[i], want[i].data());
      if (has_res[i])
        res[i].store(rv);
    }
    l0 = launches();
    ASSERT_EQ(zpp_isum_cuda_encode(&cfg, er.data(), kRuns, st, err, sizeof err),
              0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    EXPECT_EQ(launches() - l0, 1u) << "one encode launch for the runs";
    for (size_t i = 0; i < kRuns; i++) {
      ASSERT_TRUE(same(want[i], download(ddst, pdst, i, want[i].size())))
          << "message of run " << i << " (" << count[i] << " elements)";
      if (has_res[i]) {
        ASSERT_TRUE(
            same(res[i].stored, download(dres, pres, i, res[i].stored.size())))
            << "residual of run " << i << " (" << count[i] << " elements)";
      }
    }

    // sum: run i adds the messages of runs 0..i (its own count: the
    // messages of runs of equal count), own slice src[i] on its
    // exponents; one run sums 150 messages (two launches)
    {
      std::vector<zpp_isum_cuda_sum_run_t> sr;
      std::vector<const uint8_t *> srcs_dev;
      std::vector<std::vector<int32_t>> wsum;
      Packed pout;
      const size_t n150 = 150;
      std::vector<uint8_t> many_host;
      // 150 messages of run 0's count, encoded on the host
      size_t n0 = count[0], mb0 = zpp_isum_msg_bytes(&q, n0);
      std::vector<std::vector<uint8_t>> many(n150);
      for (size_t k = 0; k < n150; k++) {
        std::vector<uint8_t> x(n0 * es);
        fill_input(rng, c.dt, n0, c.block, x.data());
        std::vector<uint32_t> am(amax[0].size());
        zpp_isum_absmax_scalar(&q, c.dt, x.data(), nullptr, n0, am.data());
        std::vector<int8_t> ue = uexp[0];
        for (size_t b = 0; b < ue.size(); b++)
          ue[b] = (int8_t)std::max<int>(ue[b], zpp_qm_unit_exp(am[b], c.bits));
        many[k].resize(mb0);
        zpp_isum_encode_scalar(&q, c.dt, x.data(), nullptr, 0.0f, am.data(),
                               ue.data(), n0, many[k].data());
      }
      Packed pmany;
      for (size_t k = 0; k < n150; k++)
        pmany.add(mb0, 4, k);
      Dev dmany(pmany.bytes);
      for (size_t k = 0; k < n150; k++)
        upload(dmany, pmany, k, many[k]);
      // run 0: the 150 messages, own src[0]; runs 1..4: the own message
      // of the run and of run 2 when counts agree, own NULL for run 4.
      // The own slices' residuals (runs 0, 2, 3: run 0's in the first of
      // its two launches only), on exponents whose absmax takes them in
      // (as qgz_int.c's agreement does).
      std::vector<Resid> ores;
      std::vector<int> has_ores(kRuns);
      std::vector<std::vector<int8_t>> uexp_s(kRuns);
      Packed pores, puexp_s;
      for (size_t i = 0; i < kRuns; i++) {
        size_t nb = zpp_quant_nblocks(&q, count[i]);
        has_ores[i] = c.res != ZPP_QB_RES_NONE && (i == 0 || i == 2 || i == 3);
        ores.emplace_back(has_ores[i] ? c.res : ZPP_QB_RES_NONE,
                          make_res(rng, count[i]), c.block);
        std::vector<float> rv = ores[i].values(c.reset);
        std::vector<uint32_t> am(nb);
        zpp_isum_absmax_scalar(&q, c.dt, src[i].data(),
                               has_ores[i] ? rv.data() : nullptr, count[i],
                               am.data());
        uexp_s[i] = agree(rng, am.data(), nb, c.bits);
        pores.add(ores[i].stored.size(), 4, i);
        puexp_s.add(nb, 1, i);
      }
      Dev dores(pores.bytes), duexp_s(puexp_s.bytes);
      for (size_t i = 0; i < kRuns; i++) {
        upload(dores, pores, i, ores[i].stored);
        upload(duexp_s, puexp_s, i, uexp_s[i]);
      }
      for (size_t i = 0; i < kRuns; i++) {
        zpp_isum_cuda_sum_run_t r = {};
        std::vector<const uint8_t *> hs;
        r.first = srcs_dev.size();
        if (i == 0) {
          for (size_t k = 0; k < n150; k++) {
            srcs_dev.push_back(dmany.p + pmany.off[k]);
            hs.push_back(many[k].data());
          }
        } else {
          srcs_dev.push_back(ddst.p + pdst.off[i]);
          hs.push_back(want[i].data());
        }
        r.n = hs.size();
        r.count = count[i];
        r.own = i == 4 ? nullptr : dsrc.p + psrc.off[i];
        r.res = has_ores[i] ? dores.p + pores.off[i] : nullptr;
        r.res_codes = has_ores[i] ? dores.p + pores.off[i] +
                                        4 * zpp_quant_nblocks(&q, count[i])
                                  : nullptr;
        r.uexp = (const int8_t *)(duexp_s.p + puexp_s.off[i]);
        std::vector<int32_t> w(count[i]);
        std::vector<float> rv = ores[i].values(c.reset);
        zpp_isum_sum_scalar(&q, c.dt, i == 4 ? nullptr : src[i].data(),
                            has_ores[i] ? rv.data() : nullptr, c.beta,
                            uexp_s[i].data(), hs.data(), (int)hs.size(),
                            count[i], w.data());
        if (has_ores[i])
          ores[i].store(rv);
        wsum.push_back(w);
        pout.add(count[i] * 4, 4, i);
        sr.push_back(r);
      }
      Dev dout(pout.bytes);
      for (size_t i = 0; i < kRuns; i++)
        sr[i].out = (int32_t *)(dout.p + pout.off[i]);
      l0 = launches();
      ASSERT_EQ(zpp_isum_cuda_sum(&cfg, sr.data(), kRuns, srcs_dev.data(), st,
                                  err, sizeof err),
                0)
          << err;
      CUDA_OK(cudaStreamSynchronize(st));
      EXPECT_EQ(launches() - l0, 2u)
          << "154 messages: two launches of at most " << ZPP_ISUM_CUDA_SRCS;
      for (size_t i = 0; i < kRuns; i++) {
        ASSERT_TRUE(same(wsum[i], download(dout, pout, i, count[i] * 4)))
            << "sum of run " << i << " (" << count[i] << " elements, "
            << sr[i].n << " messages)";
        if (has_ores[i]) {
          ASSERT_TRUE(same(ores[i].stored,
                           download(dores, pores, i, ores[i].stored.size())))
              << "own residual of run " << i << " (" << count[i]
              << " elements)";
        }
      }
    }
  }
  cudaStreamDestroy(st);
}

// Stage 2 and the finish: integer sums (within ZPP_QM_ISUM_MAX, zero and
// non-finite blocks among them) re-quantized with the residual updated,
// and the finish of an own int32 sum with the other nodes' messages.
TEST(IsumCuda, RequantAndFinishAreTheScalarKernels) {
  const uint64_t seed = test_seed();
  std::printf("[ seed ] IsumCuda stage 2: ZPP_TEST_SEED=%llu\n",
              (unsigned long long)seed);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  size_t ci = 0;
  for (const Case &c : cases()) {
    SCOPED_TRACE(c.name());
    std::mt19937_64 rng(seed * 1000033ull + ci++);
    const size_t es = zpp_qm_dtype_bytes(c.dt);
    zpp_qcfg_t q = {c.bits, 0, c.block, c.sr, 0, 0, 0};
    std::vector<size_t> count(kRuns);
    for (size_t i = 0; i < kRuns; i++)
      count[i] = i == 2 ? 2 * c.block : 1 + rng() % (3 * c.block + 20);
    std::vector<std::vector<int32_t>> in(kRuns);
    std::vector<std::vector<int8_t>> uexp(kRuns);
    std::vector<Resid> res;
    Packed pin, puexp, pres, pdst;
    for (size_t i = 0; i < kRuns; i++) {
      size_t nb = zpp_quant_nblocks(&q, count[i]);
      in[i].resize(count[i]);
      uexp[i].resize(nb);
      for (size_t b = 0; b < nb; b++) {
        int kind = (int)(rng() % 12);
        uexp[i][b] = (int8_t)(kind == 0   ? ZPP_QM_UEXP_ZERO
                              : kind == 1 ? ZPP_QM_UEXP_NONFINITE
                                          : (int)(rng() % 40) - 30);
        int32_t lim = kind == 2 ? ZPP_QM_ISUM_MAX : (int32_t)(1 + rng() % 5000);
        for (size_t k = b * c.block; k < std::min(count[i], (b + 1) * c.block);
             k++)
          in[i][k] = kind == 0 || kind == 3
                         ? 0
                         : (int32_t)(rng() % (2 * (uint64_t)lim + 1)) - lim;
      }
      // residuals of a few units of each block
      std::vector<float> r = make_res(rng, count[i]);
      for (size_t k = 0; k < count[i]; k++) {
        int e = uexp[i][k / c.block];
        if (e != ZPP_QM_UEXP_ZERO && e != ZPP_QM_UEXP_NONFINITE && rng() % 2)
          r[k] = std::ldexp((float)((int)(rng() % 2001) - 1000) / 100.0f, e);
      }
      res.emplace_back(i == 1 ? ZPP_QB_RES_NONE : c.res, r, c.block);
      pin.add(count[i] * 4, 4, i);
      puexp.add(nb, 1, i);
      pres.add(res[i].stored.size(), 4, i);
      pdst.add(nb * 4 + zpp_isum_code_bytes(&q, count[i]), 4, i);
    }
    Dev din(pin.bytes), duexp(puexp.bytes), dres(pres.bytes), ddst(pdst.bytes);
    for (size_t i = 0; i < kRuns; i++) {
      upload(din, pin, i, in[i]);
      upload(duexp, puexp, i, uexp[i]);
      upload(dres, pres, i, res[i].stored);
    }
    zpp_isum_cuda_t cfg = {c.bits, c.block, c.dt, c.sr, c.res, c.reset, c.beta};
    char err[256] = "";

    std::vector<zpp_isum_cuda_requant_run_t> rr(kRuns);
    std::vector<std::vector<uint8_t>> want(kRuns);
    for (size_t i = 0; i < kRuns; i++) {
      const bool hr = res[i].kind != ZPP_QB_RES_NONE;
      rr[i].in = (const int32_t *)(din.p + pin.off[i]);
      rr[i].uexp = (const int8_t *)(duexp.p + puexp.off[i]);
      rr[i].res = hr ? dres.p + pres.off[i] : nullptr;
      rr[i].res_codes =
          hr ? dres.p + pres.off[i] + 4 * zpp_quant_nblocks(&q, count[i])
             : nullptr;
      rr[i].dst = ddst.p + pdst.off[i];
      rr[i].count = count[i];
      rr[i].base = i == 3 ? 0xffffffffull - count[i] / 2 : 777 * i;
      rr[i].seed = seed + 31 * i;
      zpp_qcfg_t qi = q;
      zpp_qm_keys_t k = zpp_qm_rng_keys(rr[i].seed);
      qi.k0 = k.k0;
      qi.k1 = k.k1;
      qi.base = rr[i].base;
      want[i].resize(zpp_quant_nblocks(&q, count[i]) * 4 +
                     zpp_isum_code_bytes(&q, count[i]));
      std::vector<float> rv = res[i].values(c.reset);
      zpp_isum_requant_scalar(&qi, in[i].data(), uexp[i].data(),
                              hr ? rv.data() : nullptr, c.beta, count[i],
                              want[i].data());
      if (hr)
        res[i].store(rv);
    }
    size_t l0 = launches();
    ASSERT_EQ(
        zpp_isum_cuda_requant(&cfg, rr.data(), kRuns, st, err, sizeof err), 0)
        << err;
    CUDA_OK(cudaStreamSynchronize(st));
    EXPECT_EQ(launches() - l0, 1u) << "one requant launch for the runs";
    for (size_t i = 0; i < kRuns; i++) {
      ASSERT_TRUE(same(want[i], download(ddst, pdst, i, want[i].size())))
          << "message of run " << i << " (" << count[i] << " elements)";
      if (res[i].kind != ZPP_QB_RES_NONE) {
        ASSERT_TRUE(
            same(res[i].stored, download(dres, pres, i, res[i].stored.size())))
            << "residual of run " << i;
      }
    }

    // finish: run i keeps in[i] and adds the messages of the runs of equal
    // count (itself included, as another node's) plus three more of its
    // own count; MEAN over 6 ranks for odd i
    std::vector<zpp_isum_cuda_finish_run_t> fr(kRuns);
    std::vector<const uint8_t *> fsrcs;
    std::vector<std::vector<uint8_t>> extra;
    Packed pout, pext;
    std::vector<std::vector<uint8_t>> wout(kRuns);
    std::vector<std::vector<const uint8_t *>> hsrc(kRuns);
    for (size_t i = 0; i < kRuns; i++) {
      hsrc[i].push_back(want[i].data());
      for (int k = 0; k < 3; k++) {
        std::vector<int32_t> s(count[i]);
        for (auto &v : s)
          v = (int32_t)(rng() % 20001) - 10000;
        std::vector<uint8_t> m(want[i].size());
        zpp_isum_requant_scalar(&q, s.data(), uexp[i].data(), nullptr, 0.0f,
                                count[i], m.data());
        extra.push_back(m);
      }
      pout.add(count[i] * es, es, i);
    }
    for (size_t k = 0; k < extra.size(); k++)
      pext.add(extra[k].size(), 4, k);
    Dev dext(pext.bytes), dout(pout.bytes);
    for (size_t k = 0; k < extra.size(); k++)
      upload(dext, pext, k, extra[k]);
    for (size_t i = 0; i < kRuns; i++) {
      fr[i].own = (const int32_t *)(din.p + pin.off[i]);
      fr[i].uexp = (const int8_t *)(duexp.p + puexp.off[i]);
      fr[i].dst = dout.p + pout.off[i];
      fr[i].count = count[i];
      fr[i].first = fsrcs.size();
      fsrcs.push_back(ddst.p + pdst.off[i]);
      for (int k = 0; k < 3; k++) {
        fsrcs.push_back(dext.p + pext.off[3 * i + k]);
        hsrc[i].push_back(extra[3 * i + k].data());
      }
      fr[i].n = 4;
    }
    for (float div : {1.0f, 6.0f}) {
      for (size_t i = 0; i < kRuns; i++) {
        wout[i].resize(count[i] * es);
        zpp_isum_finish_scalar(&q, in[i].data(), uexp[i].data(), hsrc[i].data(),
                               4, count[i], div, c.dt, wout[i].data());
      }
      l0 = launches();
      ASSERT_EQ(zpp_isum_cuda_finish(&cfg, fr.data(), kRuns, fsrcs.data(), div,
                                     st, err, sizeof err),
                0)
          << err;
      CUDA_OK(cudaStreamSynchronize(st));
      EXPECT_EQ(launches() - l0, 1u) << "one finish launch for the runs";
      for (size_t i = 0; i < kRuns; i++)
        ASSERT_TRUE(same(wout[i], download(dout, pout, i, count[i] * es)))
            << "finish of run " << i << " (" << count[i] << " elements), div "
            << div;
    }
  }
  cudaStreamDestroy(st);
}

// A finish of more messages than one launch takes (a stage 2 of more than
// ZPP_ISUM_CUDA_SRCS + 1 nodes): the run goes on over launches through its
// fp32 part (the own sums' buffer itself, or scratch of its own) and
// rounds once, bit for bit the scalar finish.  Runs of 150, 4 and 300
// messages: 454 sources, 128 a launch (the run of 4 is not split, the
// others are), so ceil(454 / 128) = 4 launches.
TEST(IsumCuda, FinishOfManyMessagesGoesOnOverLaunches) {
  const uint64_t seed = test_seed();
  std::printf("[ seed ] IsumCuda long finish: ZPP_TEST_SEED=%llu\n",
              (unsigned long long)seed);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t nmsg[] = {150, 4, 300};
  const size_t nr = 3;
  const size_t blocks[] = {64, 7, 33, 100, 1, 256};
  size_t ci = 0;
  for (int dt : {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16})
    for (int bits : {4, 8}) {
      const size_t block = blocks[ci % 6];
      SCOPED_TRACE("dtype " + std::to_string(dt) + " INT" +
                   std::to_string(bits) + " block " + std::to_string(block));
      std::mt19937_64 rng(seed * 1000037ull + ci++);
      const size_t es = zpp_qm_dtype_bytes(dt);
      zpp_qcfg_t q = {bits, 0, block, 0, 0, 0, 0};
      std::vector<size_t> count(nr);
      std::vector<std::vector<int32_t>> own(nr);
      std::vector<std::vector<int8_t>> uexp(nr);
      std::vector<std::vector<std::vector<uint8_t>>> msg(nr);
      Packed pown, puexp, ppart, pout, pmsg;
      size_t nm = 0;
      for (size_t i = 0; i < nr; i++) {
        count[i] = 1 + rng() % (3 * block + 20);
        size_t nb = zpp_quant_nblocks(&q, count[i]);
        own[i].resize(count[i]);
        uexp[i].resize(nb);
        for (size_t b = 0; b < nb; b++)
          uexp[i][b] = (int8_t)((int)(rng() % 40) - 30);
        for (auto &v : own[i])
          v = (int32_t)(rng() % 20001) - 10000;
        for (size_t k = 0; k < nmsg[i]; k++) {
          std::vector<int32_t> s(count[i]);
          for (auto &v : s)
            v = (int32_t)(rng() % 20001) - 10000;
          std::vector<uint8_t> m(nb * 4 + zpp_isum_code_bytes(&q, count[i]));
          zpp_isum_requant_scalar(&q, s.data(), uexp[i].data(), nullptr, 0.0f,
                                  count[i], m.data());
          pmsg.add(m.size(), 4, nm++);
          msg[i].push_back(std::move(m));
        }
        pown.add(count[i] * 4, 4, i);
        puexp.add(nb, 1, i);
        ppart.add(count[i] * 4, 4, i);
        pout.add(count[i] * es, es, i);
      }
      Dev down(pown.bytes), duexp(puexp.bytes), dpart(ppart.bytes),
          dout(pout.bytes), dmsg(pmsg.bytes);
      std::vector<const uint8_t *> srcs;
      std::vector<std::vector<const uint8_t *>> hsrc(nr);
      std::vector<zpp_isum_cuda_finish_run_t> fr(nr);
      nm = 0;
      for (size_t i = 0; i < nr; i++) {
        upload(duexp, puexp, i, uexp[i]);
        fr[i].own = (const int32_t *)(down.p + pown.off[i]);
        fr[i].uexp = (const int8_t *)(duexp.p + puexp.off[i]);
        fr[i].dst = dout.p + pout.off[i];
        fr[i].count = count[i];
        fr[i].first = srcs.size();
        fr[i].n = nmsg[i];
        // run 0: its own sums' buffer (as qgz_int.c); run 1: none (one
        // launch); run 2: scratch of its own
        fr[i].part = i == 0   ? (float *)(down.p + pown.off[i])
                     : i == 2 ? (float *)(dpart.p + ppart.off[i])
                              : nullptr;
        for (size_t k = 0; k < nmsg[i]; k++, nm++) {
          upload(dmsg, pmsg, nm, msg[i][k]);
          srcs.push_back(dmsg.p + pmsg.off[nm]);
          hsrc[i].push_back(msg[i][k].data());
        }
      }
      zpp_isum_cuda_t cfg = {bits, block, dt, 0, ZPP_QB_RES_NONE, 0, 0.0f};
      char err[256] = "";
      for (float div : {1.0f, 7.0f}) {
        for (size_t i = 0; i < nr; i++) // run 0's part overwrote it
          upload(down, pown, i, own[i]);
        size_t l0 = launches();
        ASSERT_EQ(zpp_isum_cuda_finish(&cfg, fr.data(), nr, srcs.data(), div,
                                       st, err, sizeof err),
                  0)
            << err;
        CUDA_OK(cudaStreamSynchronize(st));
        EXPECT_EQ(launches() - l0, 4u)
            << "454 messages: 4 launches of at most " << ZPP_ISUM_CUDA_SRCS;
        for (size_t i = 0; i < nr; i++) {
          std::vector<uint8_t> want(count[i] * es);
          zpp_isum_finish_scalar(&q, own[i].data(), uexp[i].data(),
                                 hsrc[i].data(), (int)nmsg[i], count[i], div,
                                 dt, want.data());
          ASSERT_TRUE(same(want, download(dout, pout, i, want.size())))
              << "finish of run " << i << " (" << count[i] << " elements, "
              << nmsg[i] << " messages), div " << div;
        }
      }
    }
  cudaStreamDestroy(st);
}

// More runs than a launch takes: one launch per ZPP_ISUM_CUDA_BATCH runs,
// the same results as the scalar absmax; and a bad config is refused
// with a message naming it.
TEST(IsumCuda, BatchesOfRunsAndBadConfigs) {
  const uint64_t seed = test_seed();
  std::printf("[ seed ] IsumCuda batches: ZPP_TEST_SEED=%llu\n",
              (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  const size_t nruns = ZPP_ISUM_CUDA_BATCH + 5, block = 16;
  zpp_qcfg_t q = {8, 0, block, 0, 0, 0, 0};
  Packed ps, pa;
  std::vector<std::vector<uint8_t>> src(nruns);
  for (size_t i = 0; i < nruns; i++) {
    size_t n = 1 + rng() % 50;
    src[i].resize(n * 2);
    fill_input(rng, ZPP_QM_BF16, n, block, src[i].data());
    ps.add(src[i].size(), 2, i);
    pa.add(zpp_quant_nblocks(&q, n) * 4, 4, i);
  }
  Dev ds(ps.bytes), da(pa.bytes);
  std::vector<zpp_isum_cuda_absmax_run_t> ar(nruns);
  for (size_t i = 0; i < nruns; i++) {
    upload(ds, ps, i, src[i]);
    ar[i] = {ds.p + ps.off[i],
             nullptr,
             nullptr,
             src[i].size() / 2,
             (uint32_t *)(da.p + pa.off[i]),
             nullptr};
  }
  zpp_isum_cuda_t cfg = {8, block, ZPP_QM_BF16, 0, ZPP_QB_RES_NONE, 0, 0.0f};
  char err[256] = "";
  size_t l0 = launches();
  ASSERT_EQ(
      zpp_isum_cuda_absmax(&cfg, ar.data(), nruns, nullptr, err, sizeof err), 0)
      << err;
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(launches() - l0, 2u);
  for (size_t i = 0; i < nruns; i++) {
    std::vector<uint32_t> w(zpp_quant_nblocks(&q, ar[i].count));
    zpp_isum_absmax_scalar(&q, ZPP_QM_BF16, src[i].data(), nullptr, ar[i].count,
                           w.data());
    ASSERT_TRUE(same(w, download(da, pa, i, w.size() * 4))) << "run " << i;
  }
  cfg.bits = 3;
  EXPECT_EQ(
      zpp_isum_cuda_absmax(&cfg, ar.data(), nruns, nullptr, err, sizeof err),
      -1);
  EXPECT_NE(std::string(err).find("bits 3"), std::string::npos) << err;
  cfg.bits = 8;
  cfg.block = 0;
  EXPECT_EQ(
      zpp_isum_cuda_absmax(&cfg, ar.data(), nruns, nullptr, err, sizeof err),
      -1);
  EXPECT_NE(std::string(err).find("block 0"), std::string::npos) << err;
}

// The library's callers, zpp_k_isum_* (engine/exec.h), check the kernels'
// limits before a launch: a bad argument is ZPP_ERR_INVALID_ARGUMENT or
// ZPP_ERR_UNSUPPORTED with a message naming it, not a ZPP_ERR_CUDA, and
// nothing is launched.
TEST(IsumCuda, ExecWrappersNameBadArguments) {
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  zpp_exec_t ex = {};
  ex.mem = ZPP_MEMORY_DEVICE;
  ex.stream = ex.caller_stream = st;
  Dev d(4096);
  CUDA_OK(cudaMemset(d.p, 0, 4096));
  const zpp_isum_cuda_t good = {8, 16, ZPP_QM_F32, 0, ZPP_QB_RES_NONE, 0, 0.0f};
  zpp_isum_cuda_absmax_run_t ar = {
      d.p, nullptr, nullptr, 32, (uint32_t *)(d.p + 1024), nullptr};
  zpp_isum_cuda_encode_run_t er = {};
  zpp_isum_cuda_sum_run_t sr = {};
  zpp_isum_cuda_requant_run_t rr = {};
  zpp_isum_cuda_finish_run_t fr = {};
  er.count = sr.count = rr.count = fr.count = 32;
  const uint8_t *srcs[ZPP_ISUM_CUDA_SRCS + 1] = {};
  auto expect = [&](zpp_status_t got, zpp_status_t want, const char *text,
                    const char *what) {
    EXPECT_EQ(got, want) << what << ": " << zpp_get_last_error();
    EXPECT_NE(std::string(zpp_get_last_error()).find(text), std::string::npos)
        << what << ": " << zpp_get_last_error();
  };
  const size_t l0 = launches();
  zpp_isum_cuda_t c = good;
  c.bits = 3;
  expect(zpp_k_isum_absmax(&ex, &c, &ar, 1), ZPP_ERR_INVALID_ARGUMENT,
         "c->bits 3", "absmax, bits 3");
  c = good;
  c.block = 0;
  expect(zpp_k_isum_encode(&ex, &c, &er, 1), ZPP_ERR_INVALID_ARGUMENT,
         "c->block 0", "encode, block 0");
  c = good;
  c.dtype = 7;
  expect(zpp_k_isum_sum(&ex, &c, &sr, 1, srcs), ZPP_ERR_UNSUPPORTED,
         "c->dtype 7", "sum, dtype 7");
  c = good;
  c.res = 9;
  expect(zpp_k_isum_requant(&ex, &c, &rr, 1), ZPP_ERR_INVALID_ARGUMENT,
         "c->res 9", "requant, residual kind 9");
  expect(
      zpp_k_isum_agree(&ex, (const int8_t *)d.p, 16, 0, (int8_t *)(d.p + 2048)),
      ZPP_ERR_INVALID_ARGUMENT, "rows 0", "agreement, rows 0");
  fr.n = ZPP_ISUM_CUDA_SRCS + 1;
  expect(zpp_k_isum_finish(&ex, &good, &fr, 1, srcs, 1.0f),
         ZPP_ERR_INVALID_ARGUMENT, "runs[0].part NULL",
         "finish of 129 messages without part");
  expect(zpp_k_isum_absmax(&ex, nullptr, &ar, 1), ZPP_ERR_NULL_POINTER,
         "c NULL", "absmax, c NULL");
  CUDA_OK(cudaStreamSynchronize(st));
  EXPECT_EQ(launches(), l0) << "a refused call launched a kernel";
  // and a good call through the same exec runs
  ASSERT_EQ(zpp_k_isum_absmax(&ex, &good, &ar, 1), ZPP_OK)
      << zpp_get_last_error();
  CUDA_OK(cudaStreamSynchronize(st));
  EXPECT_EQ(launches(), l0 + 1);
  cudaStreamDestroy(st);
}

} // namespace
