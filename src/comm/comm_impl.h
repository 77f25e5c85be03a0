/*
 * What the files of src/comm share: the creation steps' messages and
 * agreement, and the TCP star as a creator (comm_tcp.c) that subsets
 * without a creator of their own use too.  Not for other layers.
 */
#ifndef ZPP_SRC_COMM_COMM_IMPL_H
#define ZPP_SRC_COMM_COMM_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a rank's message in the creation exchanges. */
#define ZPP_COMM_MSGLEN 200

/* msg (ZPP_COMM_MSGLEN bytes) = this thread's last error when st failed,
 * else "". */
void zpp_comm_fill_msg(char *msg, zpp_status_t st);
/* The first failure among n exchanged records (status and message at the
 * given offsets, `stride` bytes apart) as this rank's error under `func`:
 * its own when `mine` failed, else "rank r failed: <its message>". */
zpp_status_t zpp_comm_first_failure(const void *recs, size_t stride,
                                    size_t status_off, size_t msg_off, int n,
                                    zpp_status_t mine, const char *func);
/* FNV-1a over n bytes, continuing from h. */
uint64_t zpp_comm_fnv_mix(uint64_t h, const void *p, size_t n);
/* A communicator over zpp's TCP star joined with `id` (comm_tcp.c);
 * rank_error: a message to fail with at once, after taking part (NULL:
 * none). */
zpp_status_t zpp_comm_create_tcp(const zpp_unique_id_t *id, int nranks,
                                 int rank, const zpp_comm_config_t *cfg,
                                 const char *rank_error, const char *func,
                                 zpp_comm_t *out);
/* The communicator's release for a TCP star it owns. */
void zpp_comm_release_tcp(zpp_comm_t c);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COMM_COMM_IMPL_H */
