/* Status strings and the thread-local last-error message. */
#include "core/core.h"

#include <stdio.h>
#include <string.h>

#define ZPP_ERRMSG_LEN 512

static _Thread_local char last_error[ZPP_ERRMSG_LEN];

const char *zpp_status_string(zpp_status_t status) {
  switch (status) {
  case ZPP_OK: return "ZPP_OK: success";
  case ZPP_ERR_INVALID_ARGUMENT: return "ZPP_ERR_INVALID_ARGUMENT: an argument is out of its documented range";
  case ZPP_ERR_NULL_POINTER: return "ZPP_ERR_NULL_POINTER: a required pointer is NULL";
  case ZPP_ERR_BUFFER_TOO_SMALL: return "ZPP_ERR_BUFFER_TOO_SMALL: a buffer is shorter than required";
  case ZPP_ERR_OVERFLOW: return "ZPP_ERR_OVERFLOW: a size does not fit in size_t";
  case ZPP_ERR_UNSUPPORTED: return "ZPP_ERR_UNSUPPORTED: not built in, or no device available";
  case ZPP_ERR_OUT_OF_MEMORY: return "ZPP_ERR_OUT_OF_MEMORY: an allocation failed";
  case ZPP_ERR_CUDA: return "ZPP_ERR_CUDA: a CUDA call failed";
  case ZPP_ERR_NCCL: return "ZPP_ERR_NCCL: an NCCL call failed";
  case ZPP_ERR_MPI: return "ZPP_ERR_MPI: an MPI call failed";
  case ZPP_ERR_TIMEOUT: return "ZPP_ERR_TIMEOUT: an operation exceeded ZPP_TIMEOUT_S";
  case ZPP_ERR_MISMATCH: return "ZPP_ERR_MISMATCH: ranks passed different arguments";
  case ZPP_ERR_STALE: return "ZPP_ERR_STALE: a cached copy is older than the parameters";
  case ZPP_ERR_SYSTEM: return "ZPP_ERR_SYSTEM: an operating-system call failed";
  case ZPP_ERR_IO: return "ZPP_ERR_IO: a file could not be read or parsed";
  case ZPP_ERR_INTERNAL: return "ZPP_ERR_INTERNAL: internal error in zpp";
  case ZPP_ERR_ABORTED: return "ZPP_ERR_ABORTED: the communicator was aborted (zpp_comm_abort)";
  case ZPP_ERR_EXCLUDED: return "ZPP_ERR_EXCLUDED: zpp_comm_shrink left this rank out of the new communicator";
  case ZPP_ERR_PEER_FAILED: return "ZPP_ERR_PEER_FAILED: another rank failed during zpp_comm_shrink";
  case ZPP_ERR_DATA_LOST: return "ZPP_ERR_DATA_LOST: data held only by dead ranks is lost: no intact copy survives";
  }
  return "unknown zpp status";
}

zpp_status_t zpp_error(zpp_status_t status, const char *func, const char *fmt,
                       ...) {
  va_list ap;
  int n = snprintf(last_error, sizeof last_error, "%s: ", func);
  if (n < 0 || (size_t)n >= sizeof last_error)
    n = 0;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  ZPP_INFO(ZPP_SUBSYS_INIT, "error %d: %s", (int)status, last_error);
  return status;
}

void zpp_error_clear(void) { last_error[0] = '\0'; }

const char *zpp_get_last_error(void) { return last_error; }

zpp_status_t zpp_get_version(int *version) {
  if (version == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "version is NULL");
  *version = ZPP_VERSION_CODE;
  return ZPP_OK;
}

size_t zpp_dtype_size(zpp_dtype_t dtype) {
  switch (dtype) {
  case ZPP_FLOAT32: return 4;
  case ZPP_FLOAT16:
  case ZPP_BFLOAT16: return 2;
  case ZPP_UINT8: return 1;
  }
  return 0;
}

const char *zpp_dtype_name(zpp_dtype_t dtype) {
  switch (dtype) {
  case ZPP_FLOAT32: return "fp32";
  case ZPP_FLOAT16: return "fp16";
  case ZPP_BFLOAT16: return "bf16";
  case ZPP_UINT8: return "u8";
  }
  return "unknown";
}

zpp_status_t zpp_check_float_dtype(const char *func, const char *what,
                                   zpp_dtype_t dtype) {
  if (dtype == ZPP_UINT8)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s ZPP_UINT8 (u8): bytes are taken by zpp_allgather "
                     "only; this call computes on the data and needs "
                     "ZPP_FLOAT32, ZPP_FLOAT16 or ZPP_BFLOAT16",
                     what);
  if (zpp_dtype_size(dtype) == 0)
    return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                     "%s %d: must be ZPP_FLOAT32, ZPP_FLOAT16 or ZPP_BFLOAT16",
                     what, (int)dtype);
  return ZPP_OK;
}

zpp_status_t zpp_dtype_parse(const char *name, zpp_dtype_t *dtype) {
  static const struct { const char *name; zpp_dtype_t dt; } names[] = {
      {"fp32", ZPP_FLOAT32},  {"float32", ZPP_FLOAT32}, {"f32", ZPP_FLOAT32},
      {"float", ZPP_FLOAT32}, {"fp16", ZPP_FLOAT16},    {"float16", ZPP_FLOAT16},
      {"f16", ZPP_FLOAT16},   {"half", ZPP_FLOAT16},    {"bf16", ZPP_BFLOAT16},
      {"bfloat16", ZPP_BFLOAT16}, {"u8", ZPP_UINT8},     {"uint8", ZPP_UINT8}};
  size_t i;
  if (name == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "name is NULL");
  if (dtype == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "dtype is NULL");
  for (i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcmp(name, names[i].name) == 0) {
      *dtype = names[i].dt;
      return ZPP_OK;
    }
  }
  return zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                   "name \"%s\": must be fp32, fp16, bf16 or u8", name);
}
