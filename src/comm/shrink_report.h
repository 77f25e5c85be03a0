/*
 * The message of a failed zpp_comm_shrink commit (comm/shrink.c): the
 * creation of the new communicator numbers its ranks anew, the caller
 * knows the old ranks, and an error message holds 512 bytes
 * (core/error.c).  Pure string work, testable on its own.
 */
#ifndef ZPP_COMM_SHRINK_REPORT_H
#define ZPP_COMM_SHRINK_REPORT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ranks[0..n), ascending, as ranges ("0-4,6-63") in buf (len >= 4
 * bytes, always terminated); a list that does not fit ends in "...";
 * n == 0 gives "none". */
void zpp_shrink_ranges(const int *ranks, int n, char *buf, size_t len);

/* msg, a message of the new communicator's creation, with each "rank N"
 * and "ranks N, M" (new ranks) written as "old rank mem[N]" ("old ranks
 * ..."); a number outside [0, nmem) stays, as "new rank N".  buf (len
 * bytes) is always terminated; a cut ends in "...". */
void zpp_shrink_old_ranks(const char *msg, const int *mem, int nmem, char *buf,
                          size_t len);

/* The commit's error message in buf (len bytes): the cause first (cut
 * with "..." to leave room for the lists), then the members found no
 * longer listening (gone[0..ngone), old ranks, ascending; probed: no
 * proof for those not named) and the members (mem[0..nmem), old ranks). */
void zpp_shrink_commit_msg(const char *cause, const int *gone, int ngone,
                           const int *mem, int nmem, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
