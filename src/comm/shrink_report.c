/* The message of a failed zpp_comm_shrink commit (comm/shrink_report.h). */
#include "comm/shrink_report.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends s to buf[*at..len); 0 when all of it fit, else -1 (nothing
 * appended). */
static int put(char *buf, size_t len, size_t *at, const char *s) {
  size_t k = strlen(s);
  if (*at + k + 1 > len)
    return -1;
  memcpy(buf + *at, s, k + 1);
  *at += k;
  return 0;
}

/* Ends buf with "..." within len (len >= 4): the text up to *at is cut
 * back as far as needed. */
static void cut(char *buf, size_t len, size_t at) {
  if (at + 4 > len)
    at = len - 4;
  memcpy(buf + at, "...", 4);
}

void zpp_shrink_ranges(const int *ranks, int n, char *buf, size_t len) {
  size_t at = 0;
  int i = 0;
  if (len < 4)
    return;
  buf[0] = '\0';
  if (n == 0) {
    snprintf(buf, len, "none");
    return;
  }
  while (i < n) {
    char one[32];
    int j = i;
    while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
      j++;
    if (j == i)
      snprintf(one, sizeof one, "%s%d", i ? "," : "", ranks[i]);
    else
      snprintf(one, sizeof one, "%s%d-%d", i ? "," : "", ranks[i], ranks[j]);
    /* room for this range, and for "..." if more follow */
    if (at + strlen(one) + (j + 1 < n ? 3 : 0) + 1 > len) {
      cut(buf, len, at);
      return;
    }
    put(buf, len, &at, one);
    i = j + 1;
  }
}

/* A decimal number at p (no sign): its value in *v, its length returned
 * (0: none). */
static size_t number(const char *p, long *v) {
  size_t k = 0;
  while (isdigit((unsigned char)p[k]) && k < 9)
    k++;
  if (k == 0 || isdigit((unsigned char)p[k]))
    return 0;
  *v = strtol(p, NULL, 10);
  return k;
}

void zpp_shrink_old_ranks(const char *msg, const int *mem, int nmem, char *buf,
                          size_t len) {
  size_t at = 0;
  const char *p = msg;
  if (len < 4)
    return;
  buf[0] = '\0';
  while (*p != '\0') {
    char one[40];
    /* "rank " or "ranks " as a word, not already labelled */
    int word = (p == msg || !isalnum((unsigned char)p[-1])) &&
               strncmp(p, "rank", 4) == 0;
    int labelled = p - msg >= 4 && (strncmp(p - 4, "old ", 4) == 0 ||
                                    strncmp(p - 4, "new ", 4) == 0);
    size_t w = word && p[4] == 's' ? 5 : 4;
    long v;
    size_t k = word && p[w] == ' ' ? number(p + w + 1, &v) : 0;
    if (k == 0 || labelled) {
      one[0] = *p++;
      one[1] = '\0';
    } else {
      /* the first number, then ", N" or ",N" while they follow */
      const char *q = p + w + 1;
      for (;;) {
        int old = v >= 0 && v < nmem;
        if (q == p + w + 1)
          snprintf(one, sizeof one, "%s%s %ld", old ? "old " : "new ",
                   w == 5 ? "ranks" : "rank", old ? (long)mem[v] : v);
        else
          snprintf(one, sizeof one, old ? "%ld" : "new rank %ld",
                   old ? (long)mem[v] : v);
        if (put(buf, len, &at, one) != 0) {
          cut(buf, len, at);
          return;
        }
        q += k;
        if (w == 5 && q[0] == ',' && q[1] == ' ' &&
            (k = number(q + 2, &v)) > 0) {
          if (put(buf, len, &at, ", ") != 0) {
            cut(buf, len, at);
            return;
          }
          q += 2;
        } else if (w == 5 && q[0] == ',' && (k = number(q + 1, &v)) > 0) {
          if (put(buf, len, &at, ",") != 0) {
            cut(buf, len, at);
            return;
          }
          q += 1;
        } else {
          break;
        }
      }
      p = q;
      continue;
    }
    if (put(buf, len, &at, one) != 0) {
      cut(buf, len, at);
      return;
    }
  }
}

void zpp_shrink_commit_msg(const char *cause, const int *gone, int ngone,
                           const int *mem, int nmem, char *buf, size_t len) {
  char g[96], m[96], tail[320];
  size_t room;
  int k;
  zpp_shrink_ranges(gone, ngone, g, sizeof g);
  zpp_shrink_ranges(mem, nmem, m, sizeof m);
  snprintf(tail, sizeof tail,
           " (a member failed after the decision; members no longer "
           "listening, dead or done with comm: %s%s; the %d members: old "
           "ranks %s)",
           ngone > 1   ? "old ranks "
           : ngone > 0 ? "old rank "
                       : "",
           ngone > 0 ? g : "none proven", nmem, m);
  k = snprintf(buf, len, "%s", cause);
  room = len > strlen(tail) + 4 ? len - strlen(tail) : 4;
  if (k < 0 || (size_t)k + 1 > room)
    cut(buf, room, room - 4);
  snprintf(buf + strlen(buf), len - strlen(buf), "%s", tail);
}
