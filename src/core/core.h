/*
 * The core layer (src/core): error reporting, logging and settings, which
 * every other layer uses.  It includes nothing of zpp's but the public
 * headers.  Not installed.
 */
#ifndef ZPP_SRC_CORE_CORE_H
#define ZPP_SRC_CORE_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Records a thread-local message "func: text" and returns `status`.
 * Every error return of the library goes through here, so that
 * zpp_get_last_error() always names the bad argument. */
zpp_status_t zpp_error(zpp_status_t status, const char *func, const char *fmt,
                       ...) __attribute__((format(printf, 3, 4)));
void zpp_error_clear(void);

/* The two check macros: return on error, and jump to a cleanup label. */
#define ZPP_CHECK(call)                                                        \
  do {                                                                         \
    zpp_status_t zpp_check_st_ = (call);                                       \
    if (zpp_check_st_ != ZPP_OK)                                               \
      return zpp_check_st_;                                                    \
  } while (0)

#define ZPP_CHECK_GOTO(call, st, label)                                        \
  do {                                                                         \
    (st) = (call);                                                             \
    if ((st) != ZPP_OK)                                                        \
      goto label;                                                              \
  } while (0)

/* ZPP_OK when the library computes on `dtype` (fp32, fp16, bf16); else
 * ZPP_ERR_INVALID_ARGUMENT naming `what` ("dtype", "cfg->dtype") and the
 * value.  ZPP_UINT8 is bytes for the plain all-gather only
 * (include/zpp/zpp.h), so every reducing or quantizing path rejects it
 * here, with a message that says so. */
zpp_status_t zpp_check_float_dtype(const char *func, const char *what,
                                   zpp_dtype_t dtype);

/* 1 when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a
 * byte; an empty range or a NULL pointer shares none.  The addresses are
 * compared as integers and no end address is formed, so a range near the
 * top of the address space cannot wrap around and hide an overlap.  The
 * one test of buffer overlap in the library (zpp_hadamard, the
 * collectives' zpp_coll_check_overlap). */
static inline int zpp_bytes_overlap(const void *a, size_t a_bytes,
                                    const void *b, size_t b_bytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  if (a == NULL || b == NULL || a_bytes == 0 || b_bytes == 0)
    return 0;
  return x <= y ? y - x < a_bytes : x - y < b_bytes;
}

/* ---- time (src/core/clock.c) -------------------------------------------- */
/* CLOCK_MONOTONIC in nanoseconds. */
int64_t zpp_time_ns(void);
/* Sleeps (never spins) until CLOCK_MONOTONIC reaches `deadline_ns`. */
void zpp_sleep_until_ns(int64_t deadline_ns);
/* The back-off of a poll loop with nothing to wake it: sleeps *pause_ns,
 * then doubles it up to 200 us (callers start at 1 us and reset to it on
 * progress). */
void zpp_pause_ns(long *pause_ns);

/* ---- logging: ZPP_DEBUG=WARN|INFO|TRACE, ZPP_DEBUG_SUBSYS, ZPP_DEBUG_FILE */
typedef enum {
  ZPP_LOG_NONE = 0,
  ZPP_LOG_WARN = 1,
  ZPP_LOG_INFO = 2,
  ZPP_LOG_TRACE = 3
} zpp_log_level_t;

/* Subsystems, matched by name against ZPP_DEBUG_SUBSYS ("ALL" default). */
#define ZPP_SUBSYS_INIT "INIT"
#define ZPP_SUBSYS_QUANT "QUANT"
#define ZPP_SUBSYS_TOPO "TOPO"
#define ZPP_SUBSYS_NET "NET"
#define ZPP_SUBSYS_COLL "COLL"

int zpp_log_enabled(zpp_log_level_t level, const char *subsys);
void zpp_log(zpp_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The rank printed in log lines; -1 until a communicator sets it. */
void zpp_log_set_rank(int rank);

#define ZPP_WARN(subsys, ...) zpp_log(ZPP_LOG_WARN, subsys, __VA_ARGS__)
#define ZPP_INFO(subsys, ...)                                                  \
  do {                                                                         \
    if (zpp_log_enabled(ZPP_LOG_INFO, subsys))                                 \
      zpp_log(ZPP_LOG_INFO, subsys, __VA_ARGS__);                              \
  } while (0)
#define ZPP_TRACE(subsys, ...)                                                 \
  do {                                                                         \
    if (zpp_log_enabled(ZPP_LOG_TRACE, subsys))                                \
      zpp_log(ZPP_LOG_TRACE, subsys, __VA_ARGS__);                             \
  } while (0)

/* The parsers behind ZPP_DEBUG, ZPP_DEBUG_FILE and ZPP_DEBUG_SUBSYS
 * (src/core/log.c; separate so tests/fuzz can call them): the level named by
 * `lvl` (WARN for anything unknown); `pattern` with %h -> host and %p ->
 * pid into out[cap] (truncated, always terminated; returns its length);
 * whether `subsys` is in the comma list (or the list is ALL or empty). */
zpp_log_level_t zpp_log_parse_level(const char *lvl);
size_t zpp_log_expand_path(const char *pattern, const char *host, int pid,
                           char *out, size_t cap);
int zpp_log_subsys_match(const char *list, const char *subsys);

/* ---- settings: one table (src/core/settings.c), read once ------------------- */
/* Raw text of a setting ("" if unset and without default). */
const char *zpp_setting(const char *name);
/* Parsed values; a malformed value, or one outside the setting's range in
 * the table, logs a warning and yields `def`. */
long zpp_setting_long(const char *name, long def);
double zpp_setting_double(const char *name, double def);
/* Tests only (tests/fuzz): reads the environment again.  Not thread-safe:
 * no other thread may use the settings meanwhile. */
void zpp_settings_reload(void);
/* Setting i of the table (0 when i is past its end): name and the range of
 * a number (+-DBL_MAX for text). */
int zpp_setting_info(size_t i, const char **name, double *lo, double *hi);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_CORE_CORE_H */
