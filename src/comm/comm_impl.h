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

/* The ranks that share rank `me`'s cores, among n records `stride`
 * bytes apart: those on its kernel (the uint64_t at kernel_off, the boot
 * id's hash: equal on containers and network namespaces of one machine),
 * or where a kernel id is 0 (unknown), those with its host key (the
 * int64_t at key_off). */
int zpp_comm_ranks_on_kernel(const void *recs, size_t stride,
                             size_t kernel_off, size_t key_off, int n, int me);
/* A communicator over zpp's TCP star joined with `id` (comm_tcp.c);
 * rank_error: a message to fail with at once, after taking part (NULL:
 * none). */
zpp_status_t zpp_comm_create_tcp(const zpp_unique_id_t *id, int nranks,
                                 int rank, const zpp_comm_config_t *cfg,
                                 const char *rank_error, const char *func,
                                 zpp_comm_t *out);
/* The node map t restricted to `members` (in new-rank order), as an
 * emulation spec with labels dense by first appearance (comm_split.c). */
struct zpp_topo;
zpp_status_t zpp_comm_child_spec(const struct zpp_topo *t, const int *members,
                                 int n, char *spec, size_t len,
                                 const char *func);
/* The communicator's release for a TCP star it owns. */
void zpp_comm_release_tcp(zpp_comm_t c);

/* ---- shrink.c: the listening socket each rank keeps for zpp_comm_shrink.
 * At creation, before the first exchange: opens it on the address other
 * hosts reach this process by (ZPP_BOOTSTRAP_ADDR, else the TCP
 * bootstrap's: tcp is its state, else NULL; else loopback, *ip then
 * loopback too) on a free port.  *port 0 when it could not (warned). */
void zpp_rescue_open(void *tcp, int *fd, uint32_t *ip, uint16_t *port);
/* After the first exchange: the addresses of every rank (ip network
 * order, each where its listener is bound; self_ip: what other hosts
 * reach me by) and a number every rank computed alike for this
 * communicator.  Takes fd (also on failure: closed). */
zpp_status_t zpp_rescue_attach(zpp_comm_t c, int fd, int rank, int size,
                               uint32_t self_ip, const uint32_t *ip,
                               const uint16_t *port, uint64_t epoch,
                               const char *func);
/* No listener for this communicator: zpp_comm_shrink returns
 * ZPP_ERR_UNSUPPORTED with `why`. */
zpp_status_t zpp_rescue_none(zpp_comm_t c, const char *why, const char *func);
/* Testing: the listener's descriptor (-1: none). */
int zpp_rescue_fd(zpp_comm_t c);
/* Closes the socket and frees the state (zpp_comm_destroy). */
void zpp_rescue_free(zpp_comm_t c);
/* Closes a listener of zpp_rescue_open not attached (a failed creation);
 * a fork's child never keeps one (it becomes a socket that does not
 * listen there). */
void zpp_rescue_close(int fd);
/* Testing: called at named points of zpp_comm_shrink on every rank
 * ("joined": my join was sent; "decided": a member received the
 * decision; "deciding": the coordinator is about to send it; "decide-one": it
 * sent one DECIDE, in members' rank order; "decide-sent": it sent DECIDE to
 * every member, EXCLUDED follows). */
extern void (*zpp_shrink_test_hook)(int rank, const char *point);
/* Testing: when set, each connection this rank starts to rank `to` first
 * asks it; a nonzero errno fails that connect with it. */
extern int (*zpp_shrink_test_connect)(int rank, int to);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COMM_COMM_IMPL_H */
