/*
 * The listener every communicator keeps for zpp_comm_shrink (comm/shrink.c
 * has the protocol; comm/rescue.c opens, registers and frees it, and
 * keeps it out of forked children).  Internal to comm/.
 */
#ifndef ZPP_COMM_RESCUE_H
#define ZPP_COMM_RESCUE_H

#include <stdint.h>

#include "comm/tcp.h"

struct zpp_rescue {
  int fd; /* the listener; -1: none, `why` says why */
  int rank, size;
  uint64_t epoch;   /* the same on every rank of this communicator */
  uint32_t self_ip; /* the address other hosts reach me by */
  uint32_t *ip;     /* [size] network order */
  uint16_t *port;   /* [size] */
  int used;         /* zpp_comm_shrink was called on it */
  char why[ZPP_TCP_ERRLEN];
};

#endif
