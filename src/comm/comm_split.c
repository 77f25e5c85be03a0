/*
 * Communicators of a subset of ranks (zpp_comm_split,
 * zpp_comm_create_from_ranks): made the creator's way (MPI: a duplicate
 * with a rank map) or over a TCP star among the members.
 * docs/design.md, "Bootstrap".
 */
#include "comm/comm.h"

#include "comm/comm_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "comm/bootstrap.h"
#include "core/core.h"
#include "transport/transport_impl.h"

typedef struct {
  int32_t status;
  int32_t color, key;
  int32_t list_n;     /* zpp_comm_create_from_ranks: the list's length */
  uint64_t list_hash; /* ... and a hash of it (0 for zpp_comm_split) */
  char msg[ZPP_COMM_MSGLEN];
} split_rec_t;

zpp_status_t zpp_comm_child_spec(const zpp_topo_t *t, const int *members, int n,
                                 char *spec, size_t len, const char *func) {
  int *label = malloc((size_t)t->nnodes * sizeof *label), next = 0, i;
  size_t used = 0;
  if (label == NULL)
    return zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "labels");
  for (i = 0; i < t->nnodes; i++)
    label[i] = -1;
  spec[0] = '\0';
  for (i = 0; i < n; i++) {
    int node = t->node_of[members[i]];
    int k;
    if (label[node] < 0)
      label[node] = next++;
    k = snprintf(spec + used, len - used, "%s%d", i ? "," : "", label[node]);
    if (k < 0 || (size_t)k >= len - used) {
      free(label);
      return zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                       "the emulated node map of %d ranks does not fit in a "
                       "spec of %zu characters",
                       n, len - 1);
    }
    used += (size_t)k;
  }
  free(label);
  return ZPP_OK;
}

/* zpp_comm_split and zpp_comm_create_from_ranks: st is this rank's status
 * so far (it still takes part in the exchange, so every rank fails alike,
 * naming it); list_n/list_hash: every rank must pass the same list. */
static zpp_status_t split_impl(zpp_comm_t comm, zpp_status_t st, int color,
                               int key, int list_n, uint64_t list_hash,
                               const char *func, zpp_comm_t *newcomm) {
  split_rec_t mine, *all = NULL;
  zpp_comm_config_t cfg;
  const zpp_topo_t *topo;
  int n, rank, r, cnt = 0, me = -1, *members = NULL, i;
  char spec[128];
  double timeout;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, func, "comm is NULL");
  ZPP_CHECK(zpp_transport_broken_error(comm->tr, func));
  timeout = comm->tr->timeout_s;
  n = comm->tr->size;
  rank = comm->tr->rank;
  topo = comm->tr->topo;
  if (st == ZPP_OK && newcomm == NULL)
    st = zpp_error(ZPP_ERR_NULL_POINTER, func, "newcomm is NULL");
  else if (st == ZPP_OK && color < ZPP_SPLIT_NONE)
    st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, func,
                   "color %d: must be >= 0, or ZPP_SPLIT_NONE", color);
  memset(&mine, 0, sizeof mine);
  mine.status = st;
  mine.color = color;
  mine.key = key;
  mine.list_n = list_n;
  mine.list_hash = list_hash;
  zpp_comm_fill_msg(mine.msg, st);
  all = malloc((size_t)n * sizeof *all);
  members = malloc((size_t)n * sizeof *members);
  if (all == NULL || members == NULL) {
    free(all);
    free(members);
    return zpp_comm_fail(comm, zpp_error(ZPP_ERR_OUT_OF_MEMORY, func,
                                         "%d records", n));
  }
  st = comm->boot.allgather(comm->boot.ctx, &mine, sizeof mine, all, timeout);
  if (st == ZPP_OK)
    st = zpp_comm_first_failure(all, sizeof *all,
                                offsetof(split_rec_t, status),
                                offsetof(split_rec_t, msg), n, mine.status,
                                func);
  for (r = 0; st == ZPP_OK && r < n; r++)
    if (all[r].list_n != list_n || all[r].list_hash != list_hash)
      st = zpp_error(ZPP_ERR_MISMATCH, func,
                     "ranks: rank %d passed another list (n %d) than this "
                     "rank %d (n %d); every rank must pass the same list",
                     r, all[r].list_n, rank, list_n);
  if (st != ZPP_OK) {
    color = ZPP_SPLIT_NONE;
    goto subset;
  }
  /* Members of my colour ordered by (key, rank). */
  if (color != ZPP_SPLIT_NONE) {
    for (r = 0; r < n; r++)
      if (all[r].color == color)
        members[cnt++] = r;
    for (i = 1; i < cnt; i++) {
      int x = members[i], j = i;
      while (j > 0 && (all[members[j - 1]].key > all[x].key ||
                       (all[members[j - 1]].key == all[x].key &&
                        members[j - 1] > x))) {
        members[j] = members[j - 1];
        j--;
      }
      members[j] = x;
    }
    for (i = 0; i < cnt; i++)
      if (members[i] == rank)
        me = i;
  }
subset:
  cfg = comm->cfg;
  cfg.backend = comm->tr->backend;
  cfg.algorithm = comm->tr->algorithm;
  cfg.topology = NULL;
  cfg.timeout_s = timeout;
  spec[0] = '\0';
  if (st == ZPP_OK && color != ZPP_SPLIT_NONE && topo->emulated) {
    st = zpp_comm_child_spec(topo, members, cnt, spec, sizeof spec, func);
    cfg.topology = spec;
  }
  if (comm->split != NULL) {
    /* The creator's way (MPI): collective over comm, also after a failure
     * (a bootstrap exchange that failed leaves it unusable, so the hook
     * then fails at once everywhere). */
    zpp_comm_t c = NULL;
    zpp_status_t xs =
        comm->split(comm, st, st == ZPP_OK ? color : ZPP_SPLIT_NONE,
                    members, st == ZPP_OK ? cnt : 0, me, &cfg, &c);
    st = st != ZPP_OK ? st : xs;
    if (st == ZPP_OK)
      *newcomm = c;
    goto done;
  }
  {
    /* A TCP star per colour: its first member listens, the ids travel
     * over comm's bootstrap. */
    zpp_unique_id_t id, *ids = NULL;
    memset(&id, 0, sizeof id);
    if (st == ZPP_OK && me == 0) {
      uint32_t ip = 0;
      const char *a = zpp_setting("ZPP_BOOTSTRAP_ADDR");
      int same_host = 1;
      for (i = 1; i < cnt; i++)
        same_host &= strncmp(topo->host[members[i]], topo->host[rank],
                             ZPP_TOPO_HOST_LEN) == 0;
      if (a[0] != '\0')
        st = zpp_tcp_listen_addr(func, &ip);
      else if (comm->tcp != NULL)
        ip = zpp_tcp_boot_ip(comm->tcp);
      else if (same_host)
        ip = htonl(INADDR_LOOPBACK);
      else
        st = zpp_error(ZPP_ERR_UNSUPPORTED, func,
                       "the members of colour %d are on several hosts and "
                       "the %s bootstrap gives no address to listen on: set "
                       "ZPP_BOOTSTRAP_ADDR",
                       color, comm->boot_name);
      if (st == ZPP_OK)
        st = zpp_tcp_listen(ip, 0, zpp_tcp_random_session(), &id, func);
    }
    ids = malloc((size_t)n * sizeof *ids);
    if (ids == NULL) {
      st = zpp_error(ZPP_ERR_OUT_OF_MEMORY, func, "ids");
      zpp_tcp_unlisten(&id);
      goto done;
    }
    /* Everyone takes part, also after a local failure: the status rides
     * in the first 4 bytes of a zeroed id slot when it failed. */
    if (st != ZPP_OK) {
      int32_t s = st;
      memset(&id, 0, sizeof id);
      memcpy(id.internal + sizeof id.internal - 4, &s, 4);
    }
    {
      zpp_status_t xs = comm->boot.allgather(comm->boot.ctx, &id, sizeof id,
                                             ids, timeout);
      if (st == ZPP_OK)
        st = xs;
    }
    for (r = 0; st == ZPP_OK && r < n; r++) {
      int32_t s;
      memcpy(&s, ids[r].internal + sizeof id.internal - 4, 4);
      if (s != 0)
        st = zpp_error((zpp_status_t)s, func,
                       "rank %d failed to start the bootstrap of its new "
                       "communicator",
                       r);
    }
    if (st == ZPP_OK && color != ZPP_SPLIT_NONE)
      st = zpp_comm_create_tcp(&ids[members[0]], cnt, me, &cfg, NULL, func,
                               newcomm);
    else if (me == 0)
      zpp_tcp_unlisten(&id); /* a rank failed: nobody will join it */
    free(ids);
  }
done:
  if (st == ZPP_OK && color == ZPP_SPLIT_NONE)
    *newcomm = NULL;
  free(all);
  free(members);
  return zpp_comm_fail(comm, st);
}

zpp_status_t zpp_comm_split(zpp_comm_t comm, int color, int key,
                            zpp_comm_t *newcomm) {
  return split_impl(comm, ZPP_OK, color, key, 0, 0, __func__, newcomm);
}

zpp_status_t zpp_comm_create_from_ranks(zpp_comm_t comm, int n,
                                        const int *ranks,
                                        zpp_comm_t *newcomm) {
  int i, j, pos = -1, size;
  uint64_t h = 1469598103934665603ull;
  zpp_status_t st = ZPP_OK;
  if (comm == NULL)
    return zpp_error(ZPP_ERR_NULL_POINTER, __func__, "comm is NULL");
  size = comm->tr->size;
  if (ranks == NULL)
    st = zpp_error(ZPP_ERR_NULL_POINTER, __func__, "ranks is NULL");
  else if (n < 1 || n > size)
    st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                   "n %d: must be in [1, %d]", n, size);
  for (i = 0; st == ZPP_OK && i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= size)
      st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                     "ranks[%d] = %d: must be in [0, %d)", i, ranks[i], size);
    for (j = 0; st == ZPP_OK && j < i; j++)
      if (ranks[j] == ranks[i])
        st = zpp_error(ZPP_ERR_INVALID_ARGUMENT, __func__,
                       "ranks[%d] = ranks[%d] = %d: ranks must be distinct", j,
                       i, ranks[i]);
    if (st == ZPP_OK && ranks[i] == comm->tr->rank)
      pos = i;
    if (st == ZPP_OK)
      h = zpp_comm_fnv_mix(h, &ranks[i], sizeof ranks[i]);
  }
  /* A bad list still takes part in the exchange (its status rides in the
   * record), and lists are compared there: ranks that passed different
   * lists fail with ZPP_ERR_MISMATCH naming one, instead of building
   * communicators that wait for each other. */
  return split_impl(comm, st, st == ZPP_OK && pos >= 0 ? 0 : ZPP_SPLIT_NONE,
                    pos, st == ZPP_OK ? n : 0, st == ZPP_OK ? h : 0, __func__,
                    newcomm);
}
