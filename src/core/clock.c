/*
 * Time for every wait of the library: CLOCK_MONOTONIC in nanoseconds, an
 * absolute sleep, and the back-off of a poll loop (core/core.h).
 */
#include "core/core.h"

#include <errno.h>
#include <time.h>

int64_t zpp_time_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void zpp_sleep_until_ns(int64_t deadline_ns) {
  struct timespec ts;
  ts.tv_sec = (time_t)(deadline_ns / 1000000000);
  ts.tv_nsec = (long)(deadline_ns % 1000000000);
  /* Absolute sleep: a signal only restarts it, never shortens the wait. */
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

void zpp_pause_ns(long *pause_ns) {
  struct timespec ts = {0, *pause_ns};
  nanosleep(&ts, NULL);
  if (*pause_ns < 200000)
    *pause_ns *= 2;
}

