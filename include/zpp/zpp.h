/*
 * zpp: communication-compressed collectives for sharded data-parallel
 * training (ZeRO-3), in the spirit of ZeRO++.
 *
 * This header holds the core of the public API: status codes, version,
 * data types, settings and the stand-alone block quantizer.  The
 * communicator and collectives live in <zpp/zpp_comm.h>.
 *
 * Conventions (see docs/api.md):
 *   - every function returns zpp_status_t; ZPP_OK is 0, errors are negative;
 *   - output arguments come last and are written only on success;
 *   - on error, zpp_get_last_error() returns a message naming the bad
 *     argument (thread-local);
 *   - the library never calls exit() or abort() and never asserts on input.
 */
#ifndef ZPP_ZPP_H
#define ZPP_ZPP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ZPP_API
#else
#define ZPP_API __attribute__((visibility("default")))
#endif

#define ZPP_VERSION_MAJOR 0
#define ZPP_VERSION_MINOR 1
#define ZPP_VERSION_PATCH 0
/* Single integer for comparisons: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define ZPP_VERSION_CODE \
  (ZPP_VERSION_MAJOR * 10000 + ZPP_VERSION_MINOR * 100 + ZPP_VERSION_PATCH)

typedef enum {
  ZPP_OK = 0,
  ZPP_ERR_INVALID_ARGUMENT = -1, /* a value out of its documented range     */
  ZPP_ERR_NULL_POINTER = -2,     /* a required pointer was NULL             */
  ZPP_ERR_BUFFER_TOO_SMALL = -3, /* an output or input buffer is too short  */
  ZPP_ERR_OVERFLOW = -4,         /* a size computation overflows size_t     */
  ZPP_ERR_UNSUPPORTED = -5,      /* not compiled in, or no device present   */
  ZPP_ERR_OUT_OF_MEMORY = -6,
  ZPP_ERR_CUDA = -7,     /* a CUDA runtime error; message keeps its text    */
  ZPP_ERR_NCCL = -8,     /* an NCCL error; message keeps its text           */
  ZPP_ERR_MPI = -9,      /* an MPI error; message keeps its text            */
  ZPP_ERR_TIMEOUT = -10, /* an operation exceeded ZPP_TIMEOUT_S             */
  ZPP_ERR_MISMATCH = -11, /* ranks disagree (length, config) under ZPP_CHECK */
  ZPP_ERR_STALE = -12,    /* a cached copy is older than the parameters     */
  ZPP_ERR_SYSTEM = -13,   /* an OS call failed; message keeps strerror       */
  ZPP_ERR_IO = -14,       /* a file could not be read or parsed             */
  ZPP_ERR_INTERNAL = -15, /* a bug in zpp: please report it                 */
  ZPP_ERR_ABORTED = -16,  /* the communicator was aborted (zpp_comm_abort)  */
  ZPP_ERR_EXCLUDED = -17, /* zpp_comm_shrink left this rank out (too late)  */
  ZPP_ERR_PEER_FAILED = -18, /* another rank failed during zpp_comm_shrink  */
  ZPP_ERR_DATA_LOST = -19 /* only dead ranks held it: no intact copy left   */
} zpp_status_t;

/* Static name and meaning of a status code ("ZPP_ERR_NULL_POINTER: ..."). */
ZPP_API const char *zpp_status_string(zpp_status_t status);

/* Message of the last error raised on this thread ("" if none). It names
 * the function and the bad argument, e.g.
 * "zpp_quant_encode: block_size 0: must be >= 1". */
ZPP_API const char *zpp_get_last_error(void);

/* Run-time version, encoded like ZPP_VERSION_CODE. */
ZPP_API zpp_status_t zpp_get_version(int *version);

/* Optional parts a libzpp can be built with (CMake's ZPP_WITH_* options
 * and what the build found).  Built in is not usable: NCCL and UCX are
 * opened at run time (libnccl.so.2, libucp.so.0) and CUDA needs a device
 * (zpp_cuda_available). */
typedef enum {
  ZPP_FEATURE_CUDA = 1,     /* CUDA kernels and device memory (nvcc)       */
  ZPP_FEATURE_CUDA_EMU = 2, /* the same on the CPU emulator of the CUDA
                               runtime (test builds, ZPP_CUDA_EMU)         */
  ZPP_FEATURE_NCCL = 4,     /* the NCCL backend                            */
  ZPP_FEATURE_MPI = 8,      /* the MPI backend, <zpp/zpp_mpi.h>            */
  ZPP_FEATURE_UCX = 16      /* the UCX backend                             */
} zpp_feature_t;

/* The zpp_feature_t this library was built with, ORed together. */
ZPP_API zpp_status_t zpp_get_build_features(unsigned *features);

typedef enum {
  ZPP_FLOAT32 = 0,
  ZPP_FLOAT16 = 1, /* IEEE binary16 */
  ZPP_BFLOAT16 = 2, /* bfloat16: never converted through fp16 */
  ZPP_UINT8 = 3     /* raw bytes: moved, never computed on.  Only the
                       plain all-gather (zpp_allgather) takes it (FSDP2
                       gathers a group of mixed dtypes as bytes); every
                       reducing or quantizing call rejects it with
                       ZPP_ERR_INVALID_ARGUMENT naming the dtype */
} zpp_dtype_t;

/* Bytes per element of a dtype; 0 for an unknown dtype. */
ZPP_API size_t zpp_dtype_size(zpp_dtype_t dtype);
/* "fp32", "fp16", "bf16", "u8", or "unknown". */
ZPP_API const char *zpp_dtype_name(zpp_dtype_t dtype);
/* Parses "fp32"/"float32"/"f32", "fp16"/"float16"/"half",
 * "bf16"/"bfloat16", "u8"/"uint8". */
ZPP_API zpp_status_t zpp_dtype_parse(const char *name, zpp_dtype_t *dtype);

/* ---------------------------------------------------------------------- */
/* Settings: every ZPP_* environment variable, read once from one table.  */
/* ---------------------------------------------------------------------- */

/* Writes every setting with its current value, default and help. */
ZPP_API zpp_status_t zpp_settings_print(FILE *out);
/* Current value of one setting as text (after the environment is read). */
ZPP_API zpp_status_t zpp_settings_get(const char *name, const char **value);

/* ---------------------------------------------------------------------- */
/* Block quantizer.  The encoded format is specified in docs/format.md.   */
/* ---------------------------------------------------------------------- */

typedef enum {
  ZPP_QUANT_SYMMETRIC = 0, /* codes in [-(2^(b-1)-1), 2^(b-1)-1], scale only */
  ZPP_QUANT_ASYMMETRIC = 1 /* codes in [0, 2^b-1], scale and zero point     */
} zpp_quant_mode_t;

typedef enum {
  ZPP_ROUND_NEAREST = 0,   /* round half to even (default) */
  ZPP_ROUND_STOCHASTIC = 1 /* unbiased: up with probability equal to the
                              fraction (docs/format.md) */
} zpp_rounding_t;

typedef struct {
  size_t struct_size; /* sizeof(zpp_quant_config_t): set by the INIT macro */
  int bits;           /* 8 or 4 */
  size_t block_size;  /* elements per block (one scale each), >= 1 */
  zpp_quant_mode_t mode;
  /* Fields below were added in 0.2; a struct_size from before (the size
   * up to `mode`) is accepted and they take their defaults. */
  zpp_rounding_t rounding; /* default ZPP_ROUND_NEAREST */
  uint64_t seed;      /* stochastic rounding: element i of a call draws its
                         random bits from (seed, i) only, so a seed gives
                         the same bytes on every path (CPU, SIMD, CUDA) */
} zpp_quant_config_t;

#define ZPP_QUANT_CONFIG_INIT \
  { sizeof(zpp_quant_config_t), 8, 256, ZPP_QUANT_SYMMETRIC, \
    ZPP_ROUND_NEAREST, 0 }

/* Checks a config; the message names the bad field. */
ZPP_API zpp_status_t zpp_quant_config_check(const zpp_quant_config_t *cfg);

/* Bytes that zpp_quant_encode writes for `count` elements (scales, zero
 * points and payload together); 0 for count 0.  ZPP_ERR_OVERFLOW when the
 * size does not fit in size_t. */
ZPP_API zpp_status_t zpp_quant_encoded_size(const zpp_quant_config_t *cfg,
                                            size_t count, size_t *bytes);

/* Encodes `count` elements of `dtype` from host memory `src` into `dst`
 * (dst_bytes >= zpp_quant_encoded_size).  Any alignment is accepted. */
ZPP_API zpp_status_t zpp_quant_encode(const zpp_quant_config_t *cfg,
                                      zpp_dtype_t dtype, const void *src,
                                      size_t count, void *dst,
                                      size_t dst_bytes);

/* Decodes `count` elements from `src` (src_bytes >= encoded size) into
 * `dst` of `dtype`. */
ZPP_API zpp_status_t zpp_quant_decode(const zpp_quant_config_t *cfg,
                                      const void *src, size_t src_bytes,
                                      size_t count, zpp_dtype_t dtype,
                                      void *dst);

/* acc[i] = acc[i] + decoded[i] in fp32 (the building block of qgZ). */
ZPP_API zpp_status_t zpp_quant_decode_accumulate(const zpp_quant_config_t *cfg,
                                                 const void *src,
                                                 size_t src_bytes,
                                                 size_t count, float *acc);

/* Orthonormal Hadamard rotation (docs/format.md, "Hadamard rotation"):
 * every whole group of `group` elements (a power of two >= 2) of src is
 * replaced by H x / sqrt(group) in fp32; the last count % group elements
 * are copied unrotated.  The rotation is its own inverse: applying it to
 * dst again gives back src (to within the rounding bound of the format
 * page).  dst holds count floats.  With fp32 input dst may be src or
 * overlap it anyhow; with fp16/bf16 input dst must not overlap src
 * (ZPP_ERR_INVALID_ARGUMENT). */
ZPP_API zpp_status_t zpp_hadamard(size_t group, zpp_dtype_t dtype,
                                  const void *src, size_t count, float *dst);

/* CPU code path in use: "scalar", "avx2" or "avx512".  ZPP_CPU_ISA
 * (auto|scalar|avx2|avx512) selects it; a request the CPU cannot run falls
 * back to the best it can, with a warning in the log. */
ZPP_API const char *zpp_quant_cpu_isa(void);

/* ---------------------------------------------------------------------- */
/* The same on device memory, asynchronous on a CUDA stream.              */
/* `stream` is a cudaStream_t (NULL: the legacy default stream).  Return  */
/* ZPP_ERR_UNSUPPORTED when zpp was built without CUDA or no device can   */
/* be used; argument errors are reported before anything is launched.    */
/* ---------------------------------------------------------------------- */

typedef void *zpp_stream_t;

/* 1 when zpp was built with CUDA and a usable device is present. */
ZPP_API int zpp_cuda_available(void);

ZPP_API zpp_status_t zpp_quant_encode_device(const zpp_quant_config_t *cfg,
                                             zpp_dtype_t dtype,
                                             const void *src, size_t count,
                                             void *dst, size_t dst_bytes,
                                             zpp_stream_t stream);
ZPP_API zpp_status_t zpp_quant_decode_device(const zpp_quant_config_t *cfg,
                                             const void *src, size_t src_bytes,
                                             size_t count, zpp_dtype_t dtype,
                                             void *dst, zpp_stream_t stream);
ZPP_API zpp_status_t zpp_quant_decode_accumulate_device(
    const zpp_quant_config_t *cfg, const void *src, size_t src_bytes,
    size_t count, float *acc, zpp_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_ZPP_H */
