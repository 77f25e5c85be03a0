/*
 * Public block-quantizer API: argument checks, then the CPU path chosen at
 * run time (src/kernels/quant_cpu.h) or the CUDA launchers.
 */
#include "core/core.h"
#include "kernels/elementwise.h"
#include "kernels/quant_cpu.h"
#include "kernels/quant_cuda.h"
#include "kernels/quant_math.h"
#include "kernels/transform.h"
#include "quant/quant.h"
#if ZPP_HAVE_CUDA_KERNELS
#endif

#include <pthread.h>
#include <string.h>
#include <strings.h>

void zpp_quant_config_get(const zpp_quant_config_t *in,
                          zpp_quant_config_t *out) {
  zpp_quant_config_t d = ZPP_QUANT_CONFIG_INIT;
  if (in->struct_size >= sizeof(zpp_quant_config_t)) {
    d = *in;
  } else { /* a 0.1 struct: the fields up to `mode` */
    d.bits = in->bits;
    d.block_size = in->block_size;
    d.mode = in->mode;
  }
  d.struct_size = sizeof(zpp_quant_config_t);
  *out = d;
}

zpp_status_t zpp_quant_config_check_named(const char *func, const char *name,
                                          const char *fp,
                                          const zpp_quant_config_t *in) {
  zpp_quant_config_t c;
  const zpp_quant_config_t *cfg = &c;
  if (in == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "%s is NULL", name);
  if (in->struct_size < ZPP_QUANT_CONFIG_V1_SIZE)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%sstruct_size %zu: must be sizeof(zpp_quant_config_t) "
                     "(%zu); initialise with ZPP_QUANT_CONFIG_INIT",
                     fp, in->struct_size, sizeof(zpp_quant_config_t));
  zpp_quant_config_get(in, &c);
  if (cfg->bits != 8 && cfg->bits != 4)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%sbits %d: must be 8 or 4", fp, cfg->bits);
  if (cfg->block_size < 1)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%sblock_size 0: must be >= 1", fp);
  if (cfg->mode != ZPP_QUANT_SYMMETRIC && cfg->mode != ZPP_QUANT_ASYMMETRIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%smode %d: must be ZPP_QUANT_SYMMETRIC (0) or "
                     "ZPP_QUANT_ASYMMETRIC (1)",
                     fp, (int)cfg->mode);
  if (cfg->rounding != ZPP_ROUND_NEAREST &&
      cfg->rounding != ZPP_ROUND_STOCHASTIC)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%srounding %d: must be ZPP_ROUND_NEAREST (0) or "
                     "ZPP_ROUND_STOCHASTIC (1)",
                     fp, (int)cfg->rounding);
  return ZPP_OK;
}

static zpp_status_t config_check(const char *func,
                                 const zpp_quant_config_t *in) {
  return zpp_quant_config_check_named(func, "cfg", "cfg->", in);
}

zpp_status_t zpp_quant_config_check(const zpp_quant_config_t *cfg) {
  return config_check(__func__, cfg);
}

/* Validates cfg (reporting under `func`) and normalises it. */
static zpp_status_t to_qcfg(const char *func, const zpp_quant_config_t *in,
                            zpp_qcfg_t *q) {
  zpp_quant_config_t c;
  ZPP_CHECK(config_check(func, in));
  zpp_quant_config_get(in, &c);
  memset(q, 0, sizeof *q);
  q->bits = c.bits;
  q->asym = c.mode == ZPP_QUANT_ASYMMETRIC;
  q->block = c.block_size;
  if (c.rounding == ZPP_ROUND_STOCHASTIC) {
    zpp_qm_keys_t k = zpp_qm_rng_keys(c.seed);
    q->sr = 1;
    q->k0 = k.k0;
    q->k1 = k.k1;
  }
  return ZPP_OK;
}

static zpp_status_t check_dtype(const char *func, const char *what,
                                zpp_dtype_t dtype) {
  return zpp_check_float_dtype(func, what, dtype);
}

static zpp_status_t size_of(const char *func, const zpp_qcfg_t *q,
                            size_t count, size_t *bytes) {
  int overflow;
  *bytes = zpp_quant_bytes(q, count, &overflow);
  if (overflow)
    return zpp_error(ZPP_ERR_OVERFLOW, func,
                     "count %zu: encoded size overflows size_t", count);
  return ZPP_OK;
}

zpp_status_t zpp_quant_encoded_size(const zpp_quant_config_t *cfg,
                                    size_t count, size_t *bytes) {
  zpp_qcfg_t q;
  size_t b;
  ZPP_CHECK(to_qcfg(__func__, cfg, &q));
  if (bytes == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "bytes is NULL");
  ZPP_CHECK(size_of(__func__, &q, count, &b));
  *bytes = b;
  return ZPP_OK;
}

/* Common checks of encode: config, dtype, pointers, sizes. */
static zpp_status_t encode_args(const char *func, const zpp_quant_config_t *cfg,
                                zpp_dtype_t dtype, const void *src,
                                size_t count, const void *dst,
                                size_t dst_bytes, zpp_qcfg_t *q) {
  size_t need;
  ZPP_CHECK(to_qcfg(func, cfg, q));
  ZPP_CHECK(check_dtype(func, "dtype", dtype));
  if (count > SIZE_MAX / zpp_dtype_size(dtype))
    return zpp_error(ZPP_ERR_OVERFLOW, func,
                     "count %zu: input bytes overflow size_t", count);
  ZPP_CHECK(size_of(func, q, count, &need));
  if (count == 0)
    return ZPP_OK;
  if (src == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "src is NULL (count %zu)",
                     count);
  if (dst == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "dst is NULL (count %zu)",
                     count);
  if (dst_bytes < need)
    return zpp_error(ZPP_ERR_BUFFER_TOO_SMALL, func,
                     "dst_bytes %zu: %zu elements need %zu bytes", dst_bytes,
                     count, need);
  return ZPP_OK;
}

/* acc: decode_accumulate (out_kind is ZPP_QM_OUT_ACC); otherwise out_kind
 * is the caller's dtype, which must be checked as one even when its value
 * happens to be ZPP_QM_OUT_ACC (zpp_quant_decode with dtype 3 once ran the
 * accumulating kernel on a dst of the wrong size; tests/fuzz found it). */
static zpp_status_t decode_args(const char *func, const zpp_quant_config_t *cfg,
                                const void *src, size_t src_bytes,
                                size_t count, int acc, int out_kind,
                                const void *dst, zpp_qcfg_t *q) {
  size_t need;
  ZPP_CHECK(to_qcfg(func, cfg, q));
  if (!acc) {
    ZPP_CHECK(check_dtype(func, "dtype", (zpp_dtype_t)out_kind));
    if (count > SIZE_MAX / zpp_dtype_size((zpp_dtype_t)out_kind))
      return zpp_error(ZPP_ERR_OVERFLOW, func,
                       "count %zu: output bytes overflow size_t", count);
  } else if (count > SIZE_MAX / sizeof(float)) {
    return zpp_error(ZPP_ERR_OVERFLOW, func,
                     "count %zu: output bytes overflow size_t", count);
  }
  ZPP_CHECK(size_of(func, q, count, &need));
  if (count == 0)
    return ZPP_OK;
  if (src == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "src is NULL (count %zu)",
                     count);
  if (dst == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "%s is NULL (count %zu)",
                     acc ? "acc" : "dst", count);
  if (src_bytes < need)
    return zpp_error(ZPP_ERR_BUFFER_TOO_SMALL, func,
                     "src_bytes %zu: %zu elements need %zu bytes", src_bytes,
                     count, need);
  return ZPP_OK;
}

/* ---- CPU path selection ------------------------------------------------- */

static const zpp_quant_cpu_ops_t scalar_ops = {
    "scalar", zpp_quant_encode_scalar, zpp_quant_decode_scalar,
    ZPP_ISUM_OPS_SCALAR};

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops_named(const char *name) {
  if (strcasecmp(name, "scalar") == 0)
    return &scalar_ops;
  if (strcasecmp(name, "avx2") == 0)
    return zpp_quant_cpu_ops_avx2();
  if (strcasecmp(name, "avx512") == 0)
    return zpp_quant_cpu_ops_avx512();
  return NULL;
}

static pthread_once_t ops_once = PTHREAD_ONCE_INIT;
static const zpp_quant_cpu_ops_t *ops_in_use;

static void ops_select(void) {
  const char *want = zpp_setting("ZPP_CPU_ISA");
  const zpp_quant_cpu_ops_t *best = zpp_quant_cpu_ops_avx512();
  if (best == NULL)
    best = zpp_quant_cpu_ops_avx2();
  if (best == NULL)
    best = &scalar_ops;
  ops_in_use = best;
  if (want[0] != '\0' && strcasecmp(want, "auto") != 0) {
    const zpp_quant_cpu_ops_t *o = zpp_quant_cpu_ops_named(want);
    if (o != NULL)
      ops_in_use = o;
    else
      ZPP_WARN(ZPP_SUBSYS_QUANT,
               "ZPP_CPU_ISA=%s: not built in or not supported by this CPU; "
               "using %s",
               want, best->name);
  }
  ZPP_INFO(ZPP_SUBSYS_QUANT, "CPU quantizer path: %s", ops_in_use->name);
}

const zpp_quant_cpu_ops_t *zpp_quant_cpu_ops(void) {
  pthread_once(&ops_once, ops_select);
  return ops_in_use;
}

const char *zpp_quant_cpu_isa(void) { return zpp_quant_cpu_ops()->name; }

int zpp_quant_cpu_simd(void) {
  return strcmp(zpp_quant_cpu_ops()->name, "scalar") != 0 &&
         zpp_tf_have_avx2();
}

zpp_status_t zpp_hadamard(size_t group, zpp_dtype_t dtype, const void *src,
                          size_t count, float *dst) {
  if (group < 2 || (group & (group - 1)) != 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "group %zu: must be a power of two >= 2", group);
  ZPP_CHECK(check_dtype(__func__, "dtype", dtype));
  if (count > SIZE_MAX / sizeof(float))
    return zpp_error(ZPP_ERR_OVERFLOW, __func__,
                     "count %zu: output bytes overflow size_t", count);
  if (count == 0)
    return ZPP_OK;
  if (src == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "src is NULL (count %zu)",
                     count);
  if (dst == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "dst is NULL (count %zu)",
                     count);
  if (dtype != ZPP_FLOAT32) {
    /* 16-bit input is widened element by element into dst (4 bytes for
     * every 2 read), which would overwrite input not yet read wherever the
     * two ranges share a byte.  fp32 is moved as a whole first (memmove),
     * then rotated in dst: any overlap works. */
    if (zpp_bytes_overlap(src, count * zpp_dtype_size(dtype), dst,
                          count * sizeof(float)))
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "dst overlaps src (dtype %s, count %zu): only "
                       "ZPP_FLOAT32 input may share memory with dst",
                       zpp_dtype_name(dtype), count);
  }
  zpp_tf_hadamard_host(zpp_quant_cpu_simd(), group, (int)dtype, src, count,
                       dst);
  return ZPP_OK;
}

/* ---- host API ------------------------------------------------------------ */

zpp_status_t zpp_quant_encode(const zpp_quant_config_t *cfg, zpp_dtype_t dtype,
                              const void *src, size_t count, void *dst,
                              size_t dst_bytes) {
  return zpp_quant_encode_at(cfg, dtype, src, count, 0, dst, dst_bytes);
}

zpp_status_t zpp_quant_encode_at(const zpp_quant_config_t *cfg,
                                 zpp_dtype_t dtype, const void *src,
                                 size_t count, uint64_t index_base, void *dst,
                                 size_t dst_bytes) {
  zpp_qcfg_t q;
  ZPP_CHECK(encode_args("zpp_quant_encode", cfg, dtype, src, count, dst,
                        dst_bytes, &q));
  q.base = index_base;
  if (count > 0)
    zpp_quant_cpu_ops()->encode(&q, (int)dtype, src, count, (uint8_t *)dst);
  return ZPP_OK;
}

zpp_status_t zpp_quant_encode_ef_at(const zpp_quant_config_t *cfg,
                                    zpp_dtype_t dtype, const void *src,
                                    size_t count, uint64_t index_base,
                                    float *res, float beta, void *dst,
                                    size_t dst_bytes, int *fused) {
  zpp_qcfg_t q;
  ZPP_CHECK(encode_args("zpp_quant_encode", cfg, dtype, src, count, dst,
                        dst_bytes, &q));
  q.base = index_base;
  *fused = 1;
  if (count > 0 && res == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, "zpp_quant_encode",
                     "res is NULL (count %zu)", count);
  if (count > 0)
    *fused = zpp_ew_encode_ef_host(zpp_quant_cpu_ops(), &q, (int)dtype, src,
                                   count, res, beta, (uint8_t *)dst) == 0;
  return ZPP_OK;
}

zpp_status_t zpp_quant_sum_decoded(const zpp_quant_config_t *cfg,
                                   zpp_dtype_t dtype, const void *own,
                                   const void *const *srcs, int n,
                                   size_t count, float *out, int *fused) {
  zpp_qcfg_t q;
  ZPP_CHECK(to_qcfg(__func__, cfg, &q));
  ZPP_CHECK(check_dtype(__func__, "dtype", dtype));
  *fused = 1;
  if (count > 0)
    *fused = zpp_ew_sum_decoded_host(zpp_quant_cpu_ops(), &q,
                                     zpp_quant_cpu_simd(), (int)dtype, own,
                                     (const uint8_t *const *)srcs, n, count,
                                     out) == 0;
  return ZPP_OK;
}

zpp_status_t zpp_quant_decode(const zpp_quant_config_t *cfg, const void *src,
                              size_t src_bytes, size_t count,
                              zpp_dtype_t dtype, void *dst) {
  zpp_qcfg_t q;
  ZPP_CHECK(decode_args(__func__, cfg, src, src_bytes, count, 0, (int)dtype,
                        dst, &q));
  if (count > 0)
    zpp_quant_cpu_ops()->decode(&q, (const uint8_t *)src, count, (int)dtype,
                                dst);
  return ZPP_OK;
}

zpp_status_t zpp_quant_decode_accumulate(const zpp_quant_config_t *cfg,
                                         const void *src, size_t src_bytes,
                                         size_t count, float *acc) {
  zpp_qcfg_t q;
  ZPP_CHECK(decode_args(__func__, cfg, src, src_bytes, count, 1,
                        ZPP_QM_OUT_ACC, acc, &q));
  if (count > 0)
    zpp_quant_cpu_ops()->decode(&q, (const uint8_t *)src, count,
                                ZPP_QM_OUT_ACC, acc);
  return ZPP_OK;
}

/* ---- device API ---------------------------------------------------------- */

#if ZPP_HAVE_CUDA_KERNELS
int zpp_cuda_available(void) { return zpp_quant_cuda_device_ok(); }

/* want_device >= 0: device memory must belong to that device (managed
 * memory is addressable from any). */
static zpp_status_t device_ptr(const char *func, const char *what,
                               const void *p, int want_device) {
  char err[256];
  int dev = -1;
  if (!zpp_quant_cuda_is_device_ptr(p, &dev, err, sizeof err))
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s %p: not device memory (%s)", what, p, err);
  if (want_device >= 0 && dev >= 0 && dev != want_device)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s %p: memory of CUDA device %d, but the communicator "
                     "works on device %d",
                     what, p, dev, want_device);
  return ZPP_OK;
}

static zpp_status_t need_device(const char *func) {
  if (!zpp_quant_cuda_device_ok())
    return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                     "no usable CUDA device (no driver, or no GPU)");
  return ZPP_OK;
}
#else
int zpp_cuda_available(void) { return 0; }

static zpp_status_t need_device(const char *func) {
  return zpp_error(ZPP_ERR_UNSUPPORTED, func,
                   "zpp was built without CUDA (ZPP_WITH_CUDA=OFF or no nvcc)");
}
#endif

/* check_ptrs 0: the caller (a collective) classified its buffers once for
 * the whole call and owns its scratch, so the two pointer queries per
 * kernel are skipped (a qgZ call launches thousands of kernels). */
static zpp_status_t encode_device(const char *func,
                                  const zpp_quant_config_t *cfg,
                                  zpp_dtype_t dtype, const void *src,
                                  size_t count, uint64_t index_base, void *dst,
                                  size_t dst_bytes, zpp_stream_t stream,
                                  int check_ptrs) {
  zpp_qcfg_t q;
  ZPP_CHECK(encode_args(func, cfg, dtype, src, count, dst, dst_bytes, &q));
  q.base = index_base;
  ZPP_CHECK(need_device(func));
#if ZPP_HAVE_CUDA_KERNELS
  if (count > 0) {
    char err[256];
    if (check_ptrs) {
      ZPP_CHECK(device_ptr(func, "src", src, -1));
      ZPP_CHECK(device_ptr(func, "dst", dst, -1));
    }
    if (zpp_quant_cuda_encode(&q, (int)dtype, src, count, (uint8_t *)dst,
                              stream, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, func, "%s", err);
  }
#else
  (void)stream;
  (void)check_ptrs;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_quant_encode_device(const zpp_quant_config_t *cfg,
                                     zpp_dtype_t dtype, const void *src,
                                     size_t count, void *dst, size_t dst_bytes,
                                     zpp_stream_t stream) {
  return encode_device(__func__, cfg, dtype, src, count, 0, dst, dst_bytes,
                       stream, 1);
}

zpp_status_t zpp_quant_encode_device_at(const zpp_quant_config_t *cfg,
                                        zpp_dtype_t dtype, const void *src,
                                        size_t count, uint64_t index_base,
                                        void *dst, size_t dst_bytes,
                                        zpp_stream_t stream) {
  return encode_device("zpp_quant_encode_device", cfg, dtype, src, count,
                       index_base, dst, dst_bytes, stream, 1);
}

zpp_status_t zpp_quant_encode_device_trusted(const zpp_quant_config_t *cfg,
                                             zpp_dtype_t dtype,
                                             const void *src, size_t count,
                                             uint64_t index_base, void *dst,
                                             size_t dst_bytes, void *stream) {
  return encode_device("zpp_quant_encode_device", cfg, dtype, src, count,
                       index_base, dst, dst_bytes, stream, 0);
}

static zpp_status_t decode_device(const char *func,
                                  const zpp_quant_config_t *cfg,
                                  const void *src, size_t src_bytes,
                                  size_t count, int acc, int out_kind,
                                  void *dst, zpp_stream_t stream,
                                  int check_ptrs) {
  zpp_qcfg_t q;
  ZPP_CHECK(decode_args(func, cfg, src, src_bytes, count, acc, out_kind, dst,
                        &q));
  ZPP_CHECK(need_device(func));
#if ZPP_HAVE_CUDA_KERNELS
  if (count > 0) {
    char err[256];
    if (check_ptrs) {
      ZPP_CHECK(device_ptr(func, "src", src, -1));
      ZPP_CHECK(device_ptr(func, acc ? "acc" : "dst",
                           dst, -1));
    }
    if (zpp_quant_cuda_decode(&q, (const uint8_t *)src, count, out_kind, dst,
                              stream, err, sizeof err) != 0)
      return zpp_error(ZPP_ERR_CUDA, func, "%s", err);
  }
#else
  (void)stream;
  (void)check_ptrs;
#endif
  return ZPP_OK;
}

zpp_status_t zpp_quant_decode_device_trusted(const zpp_quant_config_t *cfg,
                                             const void *src, size_t src_bytes,
                                             size_t count, int acc,
                                             zpp_dtype_t dtype, void *dst,
                                             void *stream) {
  /* acc is explicit: the value of ZPP_QM_OUT_ACC is also ZPP_UINT8's, so
   * a dtype must never select the accumulating kernel */
  return decode_device(acc ? "zpp_quant_decode_accumulate_device"
                           : "zpp_quant_decode_device",
                       cfg, src, src_bytes, count, acc != 0,
                       acc ? ZPP_QM_OUT_ACC : (int)dtype, dst, stream, 0);
}

zpp_status_t zpp_quant_check_device_ptr(const char *func, const char *what,
                                        const void *p, int device) {
#if ZPP_HAVE_CUDA_KERNELS
  ZPP_CHECK(need_device(func));
  return device_ptr(func, what, p, device);
#else
  (void)what;
  (void)p;
  (void)device;
  return need_device(func);
#endif
}

zpp_status_t zpp_quant_decode_device(const zpp_quant_config_t *cfg,
                                     const void *src, size_t src_bytes,
                                     size_t count, zpp_dtype_t dtype,
                                     void *dst, zpp_stream_t stream) {
  return decode_device(__func__, cfg, src, src_bytes, count, 0, (int)dtype,
                       dst, stream, 1);
}

zpp_status_t zpp_quant_decode_accumulate_device(const zpp_quant_config_t *cfg,
                                                const void *src,
                                                size_t src_bytes, size_t count,
                                                float *acc,
                                                zpp_stream_t stream) {
  return decode_device(__func__, cfg, src, src_bytes, count, 1,
                       ZPP_QM_OUT_ACC, acc, stream, 1);
}
