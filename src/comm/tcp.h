/*
 * What the files of zpp's TCP bootstrap share (bootstrap_tcp.c: joining
 * and the rounds through the root; tcp_id.c: the id and its listeners;
 * tcp_io.c: socket I/O under a deadline).  Not for other files: the
 * bootstrap's interface is comm/bootstrap.h.
 *
 * The unique id (zpp_unique_id_t, 128 bytes):
 *   magic "ZPPBOOT1" | u32 version | u32 IPv4 (network order) |
 *   u16 port (network order) | u16 0 | 4 zero bytes (alignment) |
 *   u64 session | u64 FNV-1a of the preceding 32 bytes | zeros
 * (zpp_tcp_id_fields_t, then zeros to 128 bytes).
 * A message: zpp_tcp_msg_hdr_t (magic, type, round, payload bytes), then
 * the payload.
 */
#ifndef ZPP_SRC_COMM_TCP_H
#define ZPP_SRC_COMM_TCP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <zpp/zpp_comm.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZPP_TCP_ID_MAGIC "ZPPBOOT1"
#define ZPP_TCP_ID_VERSION 1u
#define ZPP_TCP_MSG_MAGIC 0x5a505042u /* "ZPPB" */
#define ZPP_TCP_HOSTLEN 64
#define ZPP_TCP_ERRLEN 400

enum {
  ZPP_TCP_M_HELLO = 1,
  ZPP_TCP_M_WELCOME = 2,
  ZPP_TCP_M_ERR = 3,
  ZPP_TCP_M_DATA = 4
};

typedef struct {
  uint32_t magic, type;
  uint64_t seq, len;
} zpp_tcp_msg_hdr_t;

typedef struct {
  uint64_t session;
  int32_t rank, nranks;
  int32_t pid;
  int32_t failed; /* 1: this rank's own checks failed; text follows */
  char host[ZPP_TCP_HOSTLEN];
  char why[ZPP_TCP_ERRLEN];
} zpp_tcp_hello_t;

typedef struct {
  char magic[8];
  uint32_t version;
  uint32_t ip;
  uint16_t port;
  uint16_t zero;
  uint64_t session;
  uint64_t sum;
} zpp_tcp_id_fields_t;

/* ---- tcp_io.c: every wait has a deadline (CLOCK_MONOTONIC ns; INT64_MAX:
 * none).  Results: 0 ok, 1 timed out, -1 error (errno), -2 closed by the
 * peer, -6 aborted (the watched flag was set). */
int64_t zpp_tcp_deadline_of(double timeout_s);
/* While flag (the communicator's broken flag) is set on this thread, its
 * waits end with -6 once the flag is raised (zpp_comm_abort); NULL: not
 * watched. */
void zpp_tcp_io_watch(const atomic_int *flag);
int zpp_tcp_wait_fd(int fd, short ev, int64_t deadline);
int zpp_tcp_recv_all(int fd, void *buf, size_t n, int64_t deadline);
/* A message of type `type`, round `seq`, payload a then b. */
int zpp_tcp_send_msg(int fd, uint32_t type, uint64_t seq, const void *a,
                     size_t alen, const void *b, size_t blen, int64_t deadline);
/* A result in words ("timed out") and as a status. */
const char *zpp_tcp_io_what(int rc);
zpp_status_t zpp_tcp_io_status(int rc);
void zpp_tcp_set_sockopts(int fd);

/* ---- tcp_id.c ---- */
/* The fields of an id, checked (magic, version, checksum, zero padding,
 * a port); errors name `func`. */
zpp_status_t zpp_tcp_id_unpack(const zpp_unique_id_t *id,
                               zpp_tcp_id_fields_t *f, const char *func);
/* "a.b.c.d:port" of an id. */
void zpp_tcp_id_addr(const zpp_tcp_id_fields_t *f, char *buf, size_t len);
/* Removes and returns this process's listener of `session` (-1: none). */
int zpp_tcp_reg_take(uint64_t session);

#ifdef __cplusplus
}
#endif

#endif /* ZPP_SRC_COMM_TCP_H */
