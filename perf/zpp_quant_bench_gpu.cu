/*
 * zpp-quant-bench-gpu: throughput of the device block quantizer
 * (zpp_quant_encode_device, zpp_quant_decode_device,
 * zpp_quant_decode_accumulate_device) and of the element-wise kernels of
 * the collectives next to a device-to-device cudaMemcpyAsync moving the
 * same number of bytes, measured in the same run.
 *
 *   GB/s = (bytes read + bytes written) / median time, 1 GB = 1e9 bytes
 *     encode:      count * sizeof(dtype) read, encoded size written
 *     decode:      encoded size read, count * sizeof(dtype) written
 *     decode_acc:  encoded size + count * 4 read, count * 4 written
 *     d2d:         a copy of half the op's bytes, counted read + written
 *                  (2 x its size), so both columns move the same traffic.
 *   ratio = gbps / d2d_gbps: the fraction of copy speed the kernel reaches.
 *
 * Then the element-wise kernels of the collectives (elementwise.h), bits
 * and block "-", for fp32, fp16 and bf16 buffers from cudaMalloc (256-byte
 * aligned), and for bf16 also at 2 and 1 bytes past that boundary (dtype
 * "bf16+2", "bf16+1": the 16-bit buffer there, the fp32 ones aligned):
 *     scale:        count * sizeof(dtype) read and written (in place,
 *                   divisor 1: the data stays the same from run to run)
 *     finish:       count * 4 read (fp32 accumulator), count *
 *                   sizeof(dtype) written (divisor 4, a mean)
 *     widen:        count * sizeof(dtype) read, count * 4 written
 *     add_residual: count * sizeof(dtype) + count * 4 read, count * 4
 *                   written
 *   Goal on an H100: ratio >= 0.7.  Each is checked first on a prefix
 *   against the host function; a difference exits with status 1.
 *
 * Times are cudaEvent pairs around each launch on one stream; the median
 * of -n iterations after -w warm-up launches.  A check compares the device
 * encoding of a prefix with the CPU path; a difference exits with status 1.
 * No usable GPU: a message on stderr and exit status 2.
 *
 * Usage: zpp-quant-bench-gpu [--count N] [--block LIST] [--mode sym|asym]
 *          [-n iters] [-w warmup] [--format table|csv]
 */
#include <zpp/zpp.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zpp_internal/kernels.h"

namespace {

struct Options {
  size_t count = (size_t)1 << 26;
  std::vector<size_t> blocks = {256, 4096};
  bool asym = false;
  int iters = 20, warmup = 5;
  bool csv = false;
};

void usage(FILE *f) {
  fprintf(f,
          "usage: zpp-quant-bench-gpu [--count N] [--block LIST] [--mode sym|asym]\n"
          "                           [-n iters] [-w warmup] [--format table|csv]\n"
          "  --count N      elements per buffer (default 67108864)\n"
          "  --block LIST   comma-separated block sizes (default 256,4096)\n"
          "  --mode M       sym or asym (default sym)\n"
          "  -n iters       timed launches per row, median reported (default 20)\n"
          "  -w warmup      untimed launches first (default 5)\n"
          "  --format F     table or csv (default table)\n");
}

bool parse_size(const char *s, size_t *v) {
  char *end = nullptr;
  unsigned long long x = strtoull(s, &end, 0);
  if (end == s || *end != '\0' || x == 0) return false;
  *v = (size_t)x;
  return true;
}

int parse(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&](const char *what) {
      if (val == nullptr) {
        fprintf(stderr, "zpp-quant-bench-gpu: %s needs a value\n", what);
        return false;
      }
      i++;
      return true;
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      exit(0);
    } else if (a == "--count") {
      if (!need("--count") || !parse_size(val, &o->count)) goto bad;
    } else if (a == "--block") {
      if (!need("--block")) goto bad;
      o->blocks.clear();
      std::string list = val;
      size_t pos = 0;
      while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        size_t b;
        if (!parse_size(item.c_str(), &b)) goto bad;
        o->blocks.push_back(b);
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--mode") {
      if (!need("--mode")) goto bad;
      if (strcmp(val, "sym") == 0) o->asym = false;
      else if (strcmp(val, "asym") == 0) o->asym = true;
      else goto bad;
    } else if (a == "-n") {
      if (!need("-n") || (o->iters = atoi(val)) < 1) goto bad;
    } else if (a == "-w") {
      if (!need("-w") || (o->warmup = atoi(val)) < 0) goto bad;
    } else if (a == "--format") {
      if (!need("--format")) goto bad;
      if (strcmp(val, "csv") == 0) o->csv = true;
      else if (strcmp(val, "table") == 0) o->csv = false;
      else goto bad;
    } else {
      fprintf(stderr, "zpp-quant-bench-gpu: unknown argument %s\n", a.c_str());
      usage(stderr);
      return -1;
    }
    continue;
  bad:
    fprintf(stderr, "zpp-quant-bench-gpu: bad value for %s\n", a.c_str());
    usage(stderr);
    return -1;
  }
  return 0;
}

#define BENCH_CUDA(call)                                                           \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      fprintf(stderr, "zpp-quant-bench-gpu: %s: %s\n", #call, cudaGetErrorString(e_)); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

#define BENCH_ZPP(call)                                                            \
  do {                                                                             \
    zpp_status_t s_ = (call);                                                      \
    if (s_ != ZPP_OK) {                                                            \
      fprintf(stderr, "zpp-quant-bench-gpu: %s: %s\n", #call, zpp_get_last_error()); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

/* Normal-ish values (sum of uniforms) times a magnitude that changes every
 * 1000 elements, from a hash of the index: no host generation. */
__global__ void fill_kernel(void *dst, size_t n, int dtype, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t h = (i + seed) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    float u = ((float)(uint32_t)h + (float)(uint32_t)(h >> 32)) * 2.3283064e-10f - 1.0f;
    float m = (float)(1 + (i / 1000) % 7) * 0.25f;
    float v = __fmul_rn(u, m);
    if (dtype == ZPP_QM_F32)
      ((float *)dst)[i] = v;
    else if (dtype == ZPP_QM_F16)
      ((uint16_t *)dst)[i] = zpp_qm_f32_to_f16(v);
    else
      ((uint16_t *)dst)[i] = zpp_qm_f32_to_bf16(v);
  }
}

struct Timer {
  cudaStream_t st;
  cudaEvent_t a, b;
  explicit Timer(cudaStream_t s) : st(s) {
    BENCH_CUDA(cudaEventCreate(&a));
    BENCH_CUDA(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  /* median seconds of `iters` timed runs of f after `warmup` untimed ones */
  template <typename F> double median(int warmup, int iters, F f) {
    for (int i = 0; i < warmup; i++) f();
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; i++) {
      BENCH_CUDA(cudaEventRecord(a, st));
      f();
      BENCH_CUDA(cudaEventRecord(b, st));
      BENCH_CUDA(cudaEventSynchronize(b));
      BENCH_CUDA(cudaEventElapsedTime(&ms[i], a, b));
    }
    std::sort(ms.begin(), ms.end());
    double m = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    return m * 1e-3;
  }
};

struct Row {
  const char *op, *dtype;
  int bits;
  size_t block;
  double gbps, d2d_gbps;
};

/* bits and block of a row, "-" for an element-wise kernel (bits 0) */
std::string bits_str(const Row &r) {
  return r.bits ? std::to_string(r.bits) : "-";
}
std::string block_str(const Row &r) {
  return r.bits ? std::to_string(r.block) : "-";
}

void print_rows(const std::vector<Row> &rows, const Options &o, const char *device) {
  if (o.csv) {
    printf("op,dtype,bits,block,gbps,d2d_gbps,ratio\n");
    for (const Row &r : rows)
      printf("%s,%s,%s,%s,%.1f,%.1f,%.3f\n", r.op, r.dtype, bits_str(r).c_str(),
             block_str(r).c_str(), r.gbps, r.d2d_gbps, r.gbps / r.d2d_gbps);
    return;
  }
  printf("# zpp-quant-bench-gpu: %s, %zu elements, %s, median of %d (warm-up %d)\n",
         device, o.count, o.asym ? "asymmetric" : "symmetric", o.iters, o.warmup);
  printf("# GB/s = (bytes read + written) / time; d2d: cudaMemcpyAsync of the same traffic\n");
  printf("%-12s %-6s %4s %9s %9s %9s %6s\n", "op", "dtype", "bits", "block",
         "gbps", "d2d_gbps", "ratio");
  for (const Row &r : rows)
    printf("%-12s %-6s %4s %9s %9.1f %9.1f %6.3f\n", r.op, r.dtype,
           bits_str(r).c_str(), block_str(r).c_str(), r.gbps, r.d2d_gbps,
           r.gbps / r.d2d_gbps);
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (parse(argc, argv, &o) != 0) return 2;

  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0 || !zpp_cuda_available()) {
    fprintf(stderr,
            "zpp-quant-bench-gpu: no usable CUDA device (%s); this benchmark "
            "needs a GPU\n",
            e != cudaSuccess ? cudaGetErrorString(e) : "zpp_cuda_available() is 0");
    return 2;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));

  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Timer timer(st);

  const size_t n = o.count;
  /* buffers for the largest case: fp32 input, the largest encoding, fp32 out */
  size_t enc_max = 0;
  for (size_t b : o.blocks)
    for (int bits : {8, 4}) {
      zpp_quant_config_t c = ZPP_QUANT_CONFIG_INIT;
      c.bits = bits;
      c.block_size = b;
      c.mode = o.asym ? ZPP_QUANT_ASYMMETRIC : ZPP_QUANT_SYMMETRIC;
      size_t sz = 0;
      BENCH_ZPP(zpp_quant_encoded_size(&c, n, &sz));
      enc_max = std::max(enc_max, sz);
    }
  const size_t big = std::max(4 * n, enc_max) + 16;
  uint8_t *d_in = nullptr, *d_enc = nullptr, *d_out = nullptr, *d_cp0 = nullptr,
          *d_cp1 = nullptr;
  BENCH_CUDA(cudaMalloc(&d_in, 4 * n));
  BENCH_CUDA(cudaMalloc(&d_enc, enc_max));
  BENCH_CUDA(cudaMalloc(&d_out, 4 * n));
  BENCH_CUDA(cudaMalloc(&d_cp0, big));
  BENCH_CUDA(cudaMalloc(&d_cp1, big));
  BENCH_CUDA(cudaMemsetAsync(d_cp0, 0, big, st));
  BENCH_CUDA(cudaMemsetAsync(d_out, 0, 4 * n, st));

  /* the d2d baseline: a copy of bytes/2, counted twice */
  auto d2d_gbps = [&](size_t traffic) {
    size_t cp = (traffic / 2 + 15) & ~(size_t)15;
    double t = timer.median(o.warmup, o.iters, [&] {
      BENCH_CUDA(cudaMemcpyAsync(d_cp1, d_cp0, cp, cudaMemcpyDeviceToDevice, st));
    });
    return 2.0 * (double)cp / t * 1e-9;
  };

  std::vector<Row> rows;
  int wrong = 0;
  const int dtypes[] = {ZPP_QM_F32, ZPP_QM_F16, ZPP_QM_BF16};
  for (size_t block : o.blocks)
    for (int dt : dtypes)
      for (int bits : {8, 4}) {
        const zpp_dtype_t zdt = (zpp_dtype_t)dt;
        const size_t es = zpp_dtype_size(zdt);
        const char *dname = zpp_dtype_name(zdt);
        zpp_quant_config_t c = ZPP_QUANT_CONFIG_INIT;
        c.bits = bits;
        c.block_size = block;
        c.mode = o.asym ? ZPP_QUANT_ASYMMETRIC : ZPP_QUANT_SYMMETRIC;
        size_t sz = 0;
        BENCH_ZPP(zpp_quant_encoded_size(&c, n, &sz));
        fill_kernel<<<1024, 256, 0, st>>>(d_in, n, dt, 12345);
        BENCH_CUDA(cudaGetLastError());

        /* check a prefix against the CPU path */
        {
          size_t m = std::min(n, (size_t)1 << 20), msz = 0;
          BENCH_ZPP(zpp_quant_encoded_size(&c, m, &msz));
          std::vector<uint8_t> h_in(m * es), ref(msz), got(msz);
          BENCH_ZPP(zpp_quant_encode_device(&c, zdt, d_in, m, d_enc, enc_max, st));
          BENCH_CUDA(cudaMemcpyAsync(h_in.data(), d_in, m * es, cudaMemcpyDeviceToHost, st));
          BENCH_CUDA(cudaMemcpyAsync(got.data(), d_enc, msz, cudaMemcpyDeviceToHost, st));
          BENCH_CUDA(cudaStreamSynchronize(st));
          BENCH_ZPP(zpp_quant_encode(&c, zdt, h_in.data(), m, ref.data(), msz));
          if (memcmp(ref.data(), got.data(), msz) != 0) {
            fprintf(stderr, "zpp-quant-bench-gpu: %s int%d block %zu: device encoding differs from the CPU\n",
                    dname, bits, block);
            wrong++;
          }
        }

        double t_enc = timer.median(o.warmup, o.iters, [&] {
          BENCH_ZPP(zpp_quant_encode_device(&c, zdt, d_in, n, d_enc, sz, st));
        });
        double b_enc = (double)(n * es + sz);
        rows.push_back({"encode", dname, bits, block, b_enc / t_enc * 1e-9, d2d_gbps((size_t)b_enc)});

        double t_dec = timer.median(o.warmup, o.iters, [&] {
          BENCH_ZPP(zpp_quant_decode_device(&c, d_enc, sz, n, zdt, d_out, st));
        });
        double b_dec = (double)(sz + n * es);
        rows.push_back({"decode", dname, bits, block, b_dec / t_dec * 1e-9, d2d_gbps((size_t)b_dec)});

        if (dt == ZPP_QM_F32) { /* the accumulator is fp32 whatever the source */
          double t_acc = timer.median(o.warmup, o.iters, [&] {
            BENCH_ZPP(zpp_quant_decode_accumulate_device(&c, d_enc, sz, n, (float *)d_out, st));
          });
          double b_acc = (double)(sz + 8 * n);
          rows.push_back({"decode_acc", dname, bits, block, b_acc / t_acc * 1e-9,
                          d2d_gbps((size_t)b_acc)});
        }
      }

  /* ---- element-wise kernels ---- */
  struct Ew {
    int dt;
    size_t off; /* bytes past cudaMalloc's alignment of the dtype buffer */
    const char *name;
  };
  const Ew ews[] = {{ZPP_QM_F32, 0, "fp32"},
                    {ZPP_QM_F16, 0, "fp16"},
                    {ZPP_QM_BF16, 0, "bf16"},
                    {ZPP_QM_BF16, 2, "bf16+2"},
                    {ZPP_QM_BF16, 1, "bf16+1"}};
  /* d_dt + off: the dtype buffer (scale's, finish's output, widen's and
   * add_residual's input); d_acc, d_res: fp32 inputs; d_out: fp32 output */
  uint8_t *d_acc = nullptr, *d_dt = nullptr, *d_res = nullptr;
  BENCH_CUDA(cudaMalloc(&d_acc, 4 * n));
  BENCH_CUDA(cudaMalloc(&d_dt, 4 * n + 16));
  BENCH_CUDA(cudaMalloc(&d_res, 4 * n));
  fill_kernel<<<1024, 256, 0, st>>>(d_acc, n, ZPP_QM_F32, 777);
  fill_kernel<<<1024, 256, 0, st>>>(d_res, n, ZPP_QM_F32, 999);
  BENCH_CUDA(cudaGetLastError());
  char err[256] = "";
  auto ew_ok = [&](int rc, const char *what) {
    if (rc != 0) {
      fprintf(stderr, "zpp-quant-bench-gpu: %s: %s\n", what, err);
      exit(1);
    }
  };
  for (const Ew &w : ews) {
    const zpp_dtype_t zdt = (zpp_dtype_t)w.dt;
    const size_t es = zpp_dtype_size(zdt);
    uint8_t *src = d_dt + w.off; /* the dtype buffer */
    float *acc = (float *)d_acc, *res = (float *)d_res, *out = (float *)d_out;
    /* filled aligned, then copied to its offset (fill_kernel's stores need
     * natural alignment) */
    auto fill_src = [&] {
      fill_kernel<<<1024, 256, 0, st>>>(d_cp0, n, w.dt, 4242);
      BENCH_CUDA(cudaGetLastError());
      BENCH_CUDA(
          cudaMemcpyAsync(src, d_cp0, n * es, cudaMemcpyDeviceToDevice, st));
    };
    fill_src();

    /* check a prefix of each against the host function */
    {
      const size_t m = std::min(n, (size_t)1 << 20);
      std::vector<uint8_t> h_got(4 * m), h_want(4 * m), h_tmp(4 * m);
      std::vector<float> h_acc(m), h_res(m);
      BENCH_CUDA(cudaMemcpyAsync(h_acc.data(), acc, 4 * m,
                                 cudaMemcpyDeviceToHost, st));
      BENCH_CUDA(cudaMemcpyAsync(h_res.data(), res, 4 * m,
                                 cudaMemcpyDeviceToHost, st));
      BENCH_CUDA(cudaStreamSynchronize(st));
      auto compare = [&](const char *op, size_t bytes) {
        BENCH_CUDA(cudaStreamSynchronize(st));
        if (memcmp(h_got.data(), h_want.data(), bytes) != 0) {
          fprintf(stderr,
                  "zpp-quant-bench-gpu: %s %s: device result differs from the "
                  "host\n",
                  op, w.name);
          wrong++;
        }
      };
      /* finish into the dtype buffer's place, then scale it in place */
      ew_ok(zpp_ew_finish_device(acc, m, 4.0f, w.dt, src, st, err, sizeof err),
            "finish");
      BENCH_CUDA(cudaMemcpyAsync(h_got.data(), src, m * es,
                                 cudaMemcpyDeviceToHost, st));
      zpp_ew_finish_host(0, h_acc.data(), m, 4.0f, w.dt, h_want.data());
      compare("finish", m * es);
      memcpy(h_tmp.data(), h_want.data(), m * es);
      ew_ok(zpp_ew_scale_device(w.dt, src, m, 3.0f, st, err, sizeof err),
            "scale");
      BENCH_CUDA(cudaMemcpyAsync(h_got.data(), src, m * es,
                                 cudaMemcpyDeviceToHost, st));
      zpp_ew_scale_host(w.dt, h_want.data(), m, 3.0f);
      compare("scale", m * es);
      memcpy(h_tmp.data(), h_want.data(), m * es);
      ew_ok(zpp_ew_widen_device(w.dt, src, m, out, st, err, sizeof err),
            "widen");
      BENCH_CUDA(cudaMemcpyAsync(h_got.data(), out, 4 * m,
                                 cudaMemcpyDeviceToHost, st));
      zpp_ew_to_f32_host(0, w.dt, h_tmp.data(), m, (float *)h_want.data());
      compare("widen", 4 * m);
      ew_ok(zpp_ew_add_residual_device(w.dt, src, res, m, out, st, err,
                                       sizeof err),
            "add_residual");
      BENCH_CUDA(cudaMemcpyAsync(h_got.data(), out, 4 * m,
                                 cudaMemcpyDeviceToHost, st));
      zpp_ew_add_residual_host(w.dt, h_tmp.data(), h_res.data(), m,
                               (float *)h_want.data());
      compare("add_residual", 4 * m);
      fill_src();
    }

    double t = timer.median(o.warmup, o.iters, [&] {
      ew_ok(zpp_ew_scale_device(w.dt, src, n, 1.0f, st, err, sizeof err),
            "scale");
    });
    double b = (double)(2 * n * es);
    rows.push_back({"scale", w.name, 0, 0, b / t * 1e-9, d2d_gbps((size_t)b)});
    t = timer.median(o.warmup, o.iters, [&] {
      ew_ok(zpp_ew_finish_device(acc, n, 4.0f, w.dt, src, st, err, sizeof err),
            "finish");
    });
    b = (double)(4 * n + n * es);
    rows.push_back({"finish", w.name, 0, 0, b / t * 1e-9, d2d_gbps((size_t)b)});
    t = timer.median(o.warmup, o.iters, [&] {
      ew_ok(zpp_ew_widen_device(w.dt, src, n, out, st, err, sizeof err),
            "widen");
    });
    b = (double)(n * es + 4 * n);
    rows.push_back({"widen", w.name, 0, 0, b / t * 1e-9, d2d_gbps((size_t)b)});
    t = timer.median(o.warmup, o.iters, [&] {
      ew_ok(zpp_ew_add_residual_device(w.dt, src, res, n, out, st, err,
                                       sizeof err),
            "add_residual");
    });
    b = (double)(n * es + 8 * n);
    rows.push_back(
        {"add_residual", w.name, 0, 0, b / t * 1e-9, d2d_gbps((size_t)b)});
  }
  BENCH_CUDA(cudaStreamSynchronize(st));
  cudaFree(d_acc);
  cudaFree(d_dt);
  cudaFree(d_res);
  print_rows(rows, o, prop.name);
  cudaFree(d_in);
  cudaFree(d_enc);
  cudaFree(d_out);
  cudaFree(d_cp0);
  cudaFree(d_cp1);
  cudaStreamDestroy(st);
  if (wrong) {
    fprintf(stderr, "zpp-quant-bench-gpu: %d check(s) failed\n", wrong);
    return 1;
  }
  return 0;
}
