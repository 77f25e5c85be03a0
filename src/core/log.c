/* Logging in the style of NCCL_DEBUG: "host:pid:rank [LEVEL] SUBSYS msg". */
#include "core/core.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static zpp_log_level_t log_level = ZPP_LOG_WARN;
static char log_subsys[256];
static FILE *log_file;
static char log_host[64];
static int log_rank = -1;
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;

zpp_log_level_t zpp_log_parse_level(const char *lvl) {
  if (strcasecmp(lvl, "NONE") == 0)
    return ZPP_LOG_NONE;
  if (strcasecmp(lvl, "INFO") == 0)
    return ZPP_LOG_INFO;
  if (strcasecmp(lvl, "TRACE") == 0)
    return ZPP_LOG_TRACE;
  return ZPP_LOG_WARN;
}

size_t zpp_log_expand_path(const char *pattern, const char *host, int pid,
                           char *out, size_t cap) {
  size_t o = 0;
  const char *c;
  if (cap == 0)
    return 0;
  for (c = pattern; *c != '\0' && o + 1 < cap; c++) {
    int w;
    if (c[0] == '%' && c[1] == 'h')
      w = snprintf(out + o, cap - o, "%s", host);
    else if (c[0] == '%' && c[1] == 'p')
      w = snprintf(out + o, cap - o, "%d", pid);
    else {
      out[o++] = *c;
      continue;
    }
    c++;
    /* snprintf returns the length it wanted: a long host name stops at
     * the end of out, it never moves o past it */
    if (w < 0)
      break;
    o += (size_t)w < cap - o ? (size_t)w : cap - o - 1;
  }
  out[o] = '\0';
  return o;
}

int zpp_log_subsys_match(const char *list, const char *subsys) {
  const char *p;
  size_t n;
  if (strcasecmp(list, "ALL") == 0 || list[0] == '\0')
    return 1;
  n = strlen(subsys);
  for (p = list; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == n && strncasecmp(p, subsys, n) == 0)
      return 1;
    if (!comma)
      break;
    p = comma + 1;
  }
  return 0;
}

static void log_init(void) {
  const char *file = zpp_setting("ZPP_DEBUG_FILE");
  log_level = zpp_log_parse_level(zpp_setting("ZPP_DEBUG"));
  snprintf(log_subsys, sizeof log_subsys, "%s", zpp_setting("ZPP_DEBUG_SUBSYS"));
  if (gethostname(log_host, sizeof log_host) != 0)
    snprintf(log_host, sizeof log_host, "unknown");
  log_host[sizeof log_host - 1] = '\0';
  log_file = stderr;
  if (file[0] != '\0') {
    char path[512];
    zpp_log_expand_path(file, log_host, (int)getpid(), path, sizeof path);
    log_file = fopen(path, "a");
    if (log_file == NULL)
      log_file = stderr;
  }
}

void zpp_log_set_rank(int rank) { log_rank = rank; }

int zpp_log_enabled(zpp_log_level_t level, const char *subsys) {
  pthread_once(&log_once, log_init);
  if (level > log_level || level == ZPP_LOG_NONE)
    return 0;
  return zpp_log_subsys_match(log_subsys, subsys);
}

void zpp_log(zpp_log_level_t level, const char *subsys, const char *fmt, ...) {
  static const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
  va_list ap;
  if (!zpp_log_enabled(level, subsys))
    return;
  pthread_mutex_lock(&log_mutex);
  fprintf(log_file, "%s:%d:%d [zpp %s] %s ", log_host, (int)getpid(), log_rank,
          names[level], subsys);
  va_start(ap, fmt);
  vfprintf(log_file, fmt, ap);
  va_end(ap);
  fputc('\n', log_file);
  fflush(log_file);
  pthread_mutex_unlock(&log_mutex);
}
