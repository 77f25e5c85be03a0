/* Logging in the style of NCCL_DEBUG: "host:pid:rank [LEVEL] SUBSYS msg". */
#include "internal.h"

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

static void log_init(void) {
  const char *lvl = zpp_setting("ZPP_DEBUG");
  const char *file = zpp_setting("ZPP_DEBUG_FILE");
  if (strcasecmp(lvl, "NONE") == 0)
    log_level = ZPP_LOG_NONE;
  else if (strcasecmp(lvl, "INFO") == 0)
    log_level = ZPP_LOG_INFO;
  else if (strcasecmp(lvl, "TRACE") == 0)
    log_level = ZPP_LOG_TRACE;
  else
    log_level = ZPP_LOG_WARN;
  snprintf(log_subsys, sizeof log_subsys, "%s", zpp_setting("ZPP_DEBUG_SUBSYS"));
  if (gethostname(log_host, sizeof log_host) != 0)
    snprintf(log_host, sizeof log_host, "unknown");
  log_host[sizeof log_host - 1] = '\0';
  log_file = stderr;
  if (file[0] != '\0') {
    char path[512];
    size_t o = 0;
    const char *c;
    for (c = file; *c && o + 32 < sizeof path; c++) {
      if (c[0] == '%' && c[1] == 'h') {
        o += (size_t)snprintf(path + o, sizeof path - o, "%s", log_host);
        c++;
      } else if (c[0] == '%' && c[1] == 'p') {
        o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
        c++;
      } else {
        path[o++] = *c;
      }
    }
    path[o] = '\0';
    log_file = fopen(path, "a");
    if (log_file == NULL)
      log_file = stderr;
  }
}

void zpp_log_set_rank(int rank) { log_rank = rank; }

int zpp_log_enabled(zpp_log_level_t level, const char *subsys) {
  const char *p;
  size_t n;
  pthread_once(&log_once, log_init);
  if (level > log_level || level == ZPP_LOG_NONE)
    return 0;
  if (strcasecmp(log_subsys, "ALL") == 0 || log_subsys[0] == '\0')
    return 1;
  n = strlen(subsys);
  for (p = log_subsys; *p;) {
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
