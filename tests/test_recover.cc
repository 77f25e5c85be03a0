// zpp_pgroup_recover: a parameter group re-partitioned over the survivors
// of a rank's death (include/zpp/zpp_runtime.h, docs/runtime.md
// "Recovery").  Each test forks plain processes that build a communicator
// over zpp's TCP bootstrap (UCX backend, loopback, no MPI; ZPP_TOPO-style
// emulated nodes), fill a bf16 group with random weights, run a forward
// gather (hpZ keeps its secondary copy), and then the parent SIGKILLs the
// victims.  Every survivor's next world gather fails; it shrinks the
// communicator, recovers the group and checks, against the weights
// regenerated from the seed:
//   - every element a survivor owned: bitwise its old value;
//   - every element of a lost shard: bitwise what the forward gather
//     before the failure returned, and bitwise the old weight (unquantized
//     hpZ copy) or within qwZ's bound of it (docs/format.md, "Error bound");
//   - the padding: zero;
//   - zpp_pgroup_recover_state: survivors' state moved bitwise, lost
//     elements zero, and the report's counts;
//   - a training step on the new group (gather, gradient reduce-scatter
//     MEAN, SGD update) against a float64 reference of the same step on
//     the recovered weights, with the bound of its bf16 roundings;
// and that the cases with no current copy fail on every survivor with
// ZPP_ERR_DATA_LOST naming the lost rank and why.
//
// Seed: ZPP_TEST_SEED (default 20261207), printed.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_runtime.h>

#include "fork_job.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr double kTimeout = 3.0; // the communicator's ZPP_TIMEOUT_S

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261207ull;
}

using zpp_test::mono_s;

float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f2bf(float f) { // round to nearest even (finite values)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The weight of flat element g before the failure (bf16), the target of
// old rank q in the training step, and the caller's per-element state.
uint16_t weight(size_t g) {
  std::mt19937_64 r(seed() * 1000003ull + g);
  std::normal_distribution<float> d(0.0f, 1.0f);
  return f2bf(d(r) * (g % 7 == 0 ? 4.0f : 1.0f));
}
float target(int q, size_t g) {
  std::mt19937_64 r(seed() * 7919ull + (uint64_t)q * 1000003ull + g);
  std::normal_distribution<float> d(0.0f, 1.0f);
  return d(r);
}
float state_of(size_t g) { return 1.0f + 0.25f * (float)g; }

// One survivor's result, as text through a pipe.
struct Res {
  int status = 99; // of zpp_pgroup_recover; 99: no result (msg: how the
                   // child ended, tests/fork_job.h)
  int coll_status = 0;
  long checked = 0, bad = 0;
  int lost_ranks = -1, exact = -1, new_size = 0;
  long rebuilt = 0, state_lost = 0;
  double t_fail = 0, t_shrunk = 0, t_recovered = 0;
  std::string msg;
};

std::string encode(const Res &r) {
  std::ostringstream o;
  o.precision(17);
  o << r.status << ' ' << r.coll_status << ' ' << r.checked << ' ' << r.bad
    << ' ' << r.lost_ranks << ' ' << r.exact << ' ' << r.new_size << ' '
    << r.rebuilt << ' ' << r.state_lost << ' ' << r.t_fail << ' ' << r.t_shrunk
    << ' ' << r.t_recovered << '\n'
    << r.msg;
  return o.str();
}

Res decode(const std::string &text) {
  Res r;
  std::istringstream in(text);
  in >> r.status >> r.coll_status >> r.checked >> r.bad >> r.lost_ranks >>
      r.exact >> r.new_size >> r.rebuilt >> r.state_lost >> r.t_fail >>
      r.t_shrunk >> r.t_recovered;
  if (!in)
    return Res();
  std::string line;
  std::getline(in, line);
  r.msg.assign(std::istreambuf_iterator<char>(in),
               std::istreambuf_iterator<char>());
  return r;
}

struct Scenario {
  int n;
  const char *topo;
  std::vector<int> victims;
  int hpz = 1;
  int qwz_bits = 0;
  bool stale = false; // parameters changed after the forward gather
  std::vector<int> stale_ranks; // only these changed them (empty: stale)
  size_t align = 0;             // cfg.align (0: the default)
  bool want_rebuilt = true;     // some lost rank owned real elements
  bool attach_full = false;     // attach a full buffer after the failure
  int want = ZPP_OK;
  std::vector<std::string> want_msg; // substrings of the error
  Scenario(int n_, const char *topo_, std::vector<int> v, int hpz_, int qwz)
      : n(n_), topo(topo_), victims(std::move(v)), hpz(hpz_), qwz_bits(qwz) {}
};

// Forked ranks (tests/fork_job.h).
using Ctl = zpp_test::ForkCtl;
using Job = zpp_test::ForkJob<Res, encode, decode>;

zpp_comm_t make_comm(int i, int n, const std::vector<int> &id_w, int id_r,
                     const char *topo) {
  zpp_unique_id_t id;
  std::memset(&id, 0, sizeof id);
  if (i == 0) {
    if (zpp_get_unique_id(&id) != ZPP_OK)
      _exit(3);
    for (int k = 1; k < n; k++)
      if (write(id_w[k], &id, sizeof id) != (ssize_t)sizeof id)
        _exit(3);
  } else if (read(id_r, &id, sizeof id) != (ssize_t)sizeof id) {
    _exit(3);
  }
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = kTimeout;
  cfg.topology = topo;
  cfg.backend = ZPP_BACKEND_UCX;
  zpp_comm_t comm = nullptr;
  if (zpp_comm_create_from_id(&id, n, i, &cfg, &comm) != ZPP_OK) {
    std::fprintf(stderr, "rank %d: create: %s\n", i, zpp_get_last_error());
    _exit(5);
  }
  return comm;
}

const size_t kSizes[2] = {3000, 77}; // numel 3077: a short last shard
const size_t kNumel = kSizes[0] + kSizes[1];

// qwZ's bound for element x of the block whose absmax is amax (INT8 or
// INT4 symmetric, docs/format.md "Error bound"), decoded to bf16.
double qwz_bound(double x, double amax, int bits) {
  double scale = amax / (bits == 8 ? 127.0 : 7.0);
  double e = scale * (0.5 + std::ldexp(1.0, -12)) +
             std::ldexp(1.0, -22) * (std::fabs(x) + amax) +
             std::ldexp(1.0, -149);
  return e + std::ldexp(1.0, -8) * (std::fabs(x) + e) + std::ldexp(1.0, -133);
}

#define BAD(...)                                                               \
  do {                                                                         \
    if (res.bad++ < 4) {                                                       \
      char b_[256];                                                            \
      std::snprintf(b_, sizeof b_, __VA_ARGS__);                               \
      res.msg += std::string(b_) + "; ";                                       \
    }                                                                          \
  } while (0)

Res survivor(int i, int ready_w, int go_r, const std::vector<int> &id_w,
             int id_r, const Scenario &sc) {
  Res res;
  zpp_comm_t comm = make_comm(i, sc.n, id_w, id_r, sc.topo);
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.hpz = sc.hpz;
  cfg.qwz_bits = sc.qwz_bits;
  cfg.align = sc.align;
  zpp_pgroup_t pg = nullptr;
  if (zpp_pgroup_create(comm, &cfg, kSizes, 2, &pg) != ZPP_OK) {
    res.status = -300;
    res.msg = zpp_get_last_error();
    return res;
  }
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  const size_t s_old = info.shard_numel;
  uint16_t *shard;
  zpp_pgroup_shard(pg, (void **)&shard);
  for (size_t j = 0; j < s_old; j++) {
    size_t g = info.shard_offset + j;
    shard[j] = g < kNumel ? weight(g) : 0;
  }
  // the forward gather: what every rank used, and hpZ's copy
  std::vector<uint16_t> before(info.padded_numel);
  void *full = nullptr;
  if (zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr) != ZPP_OK ||
      zpp_pgroup_wait(pg, &full) != ZPP_OK) {
    res.status = -301;
    res.msg = zpp_get_last_error();
    return res;
  }
  std::memcpy(before.data(), full, before.size() * 2);
  zpp_pgroup_release(pg);
  if (sc.stale || std::find(sc.stale_ranks.begin(), sc.stale_ranks.end(), i) !=
                      sc.stale_ranks.end())
    zpp_pgroup_params_changed(pg);
  std::vector<float> old_state(s_old);
  for (size_t j = 0; j < s_old; j++)
    old_state[j] = state_of(info.shard_offset + j);
  char b = 1;
  if (write(ready_w, &b, 1) != 1 || read(go_r, &b, 1) != 1)
    _exit(4);

  // the victims are dead: a world gather fails (bounded)
  res.coll_status = zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr);
  if (res.coll_status == ZPP_OK)
    res.coll_status = zpp_pgroup_wait(pg, nullptr);
  res.t_fail = mono_s();
  // The failed fetch's full buffer may still be written until the old
  // communicator's destroy returns (zpp_comm.h): replacing it by an
  // attached one leaves it allocated, with a WARN giving its size.
  std::vector<uint16_t> user_full;
  if (sc.attach_full) {
    user_full.assign(info.padded_numel, 0);
    char path[] = "/tmp/zpp_recover_logXXXXXX";
    int fd = mkstemp(path);
    int saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    int ast = zpp_pgroup_attach(pg, nullptr, user_full.data(), nullptr);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string log;
    char lb[1024];
    ssize_t k;
    lseek(fd, 0, SEEK_SET);
    while ((k = read(fd, lb, sizeof lb)) > 0)
      log.append(lb, (size_t)k);
    close(fd);
    unlink(path);
    std::string want = "the full buffer of " +
                       std::to_string(info.padded_numel * 2) +
                       " bytes a failed fetch may still write is left "
                       "allocated (leaked)";
    res.checked++;
    if (ast != ZPP_OK)
      BAD("attach after the failed fetch: %s", zpp_get_last_error());
    if (log.find("zpp_pgroup_attach") == std::string::npos ||
        log.find(want) == std::string::npos)
      BAD("attach after the failed fetch logged \"%s\", want \"%s\"",
          log.c_str(), want.c_str());
  }
  std::vector<int> map(sc.n, -7);
  zpp_comm_t nc = nullptr;
  int st = zpp_comm_shrink(comm, nullptr, map.data(), &nc);
  res.t_shrunk = mono_s();
  if (st != ZPP_OK) {
    res.status = -302;
    res.msg = std::string("shrink: ") + zpp_get_last_error();
    return res;
  }
  zpp_pgroup_t ng = nullptr;
  zpp_pgroup_recovery_t rep = ZPP_PGROUP_RECOVERY_INIT;
  res.status = zpp_pgroup_recover(pg, nc, map.data(), &ng, &rep);
  res.t_recovered = mono_s();
  zpp_comm_size(nc, &res.new_size);
  if (res.status != ZPP_OK) {
    res.msg = zpp_get_last_error();
    zpp_pgroup_destroy(pg);
    zpp_comm_destroy(nc);
    zpp_comm_destroy(comm);
    return res;
  }
  res.lost_ranks = rep.lost_ranks;
  res.exact = rep.exact;
  res.rebuilt = (long)rep.rebuilt_numel;
  res.state_lost = (long)rep.state_lost_numel;
  std::vector<float> new_state;
  zpp_pgroup_info_t ni = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(ng, &ni);
  new_state.assign(ni.shard_numel, -1.0f);
  int sst = zpp_pgroup_recover_state(ng, old_state.data(), new_state.data(),
                                     sizeof(float));
  zpp_pgroup_destroy(pg);
  zpp_comm_destroy(comm);
  if (sst != ZPP_OK) {
    res.status = -303;
    res.msg = std::string("recover_state: ") + zpp_get_last_error();
    return res;
  }
  std::vector<int> old_of;
  for (int q = 0; q < sc.n; q++)
    if (map[q] >= 0)
      old_of.push_back(q);
  // which flat elements were lost
  std::vector<char> lost(kNumel, 0);
  for (int k = 0; k < rep.lost_ranks; k++) {
    int q = -1, from = -1;
    size_t lb = 0, le = 0;
    zpp_pgroup_lost(ng, k, &q, &from, &lb, &le);
    if (lb != std::min((size_t)q * s_old, kNumel) ||
        le != std::min((size_t)(q + 1) * s_old, kNumel))
      BAD("lost %d: old rank %d's range [%zu, %zu)", k, q, lb, le);
    if (lb < le && (from < 0 || map[from] < 0))
      BAD("lost %d: rebuilt from old rank %d, not a survivor", k, from);
    for (size_t g = lb; g < le; g++)
      lost[g] = 1;
  }
  // the new shard against the weights before the failure
  uint16_t *ns;
  zpp_pgroup_shard(ng, (void **)&ns);
  std::vector<uint16_t> rec(ni.padded_numel, 0); // recovered, as the test
                                                 // expects them
  for (size_t j = 0; j < ni.shard_numel; j++) {
    size_t g = ni.shard_offset + j;
    res.checked++;
    if (g >= kNumel) {
      if (ns[j] != 0)
        BAD("padding element %zu is %#x", g, ns[j]);
      if (new_state[j] != 0.0f)
        BAD("padding state %zu is %g", g, new_state[j]);
      continue;
    }
    if (!lost[g]) {
      if (ns[j] != weight(g))
        BAD("survivor's element %zu: %#x, was %#x", g, ns[j], weight(g));
      if (new_state[j] != state_of(g))
        BAD("state of element %zu: %g, was %g", g, new_state[j], state_of(g));
      continue;
    }
    if (new_state[j] != 0.0f)
      BAD("lost state of element %zu: %g, want 0", g, new_state[j]);
    if (ns[j] != before[g])
      BAD("lost element %zu: %#x, the forward gather gave %#x", g, ns[j],
          before[g]);
    if (sc.qwz_bits == 0) {
      if (ns[j] != weight(g))
        BAD("lost element %zu: %#x, was %#x (unquantized copy)", g, ns[j],
            weight(g));
    } else {
      // the block of the dead rank's shard this element was encoded in
      size_t q = g / s_old, blk0 = q * s_old + (g - q * s_old) / 256 * 256;
      double amax = 0;
      for (size_t x = blk0; x < blk0 + 256 && x < (q + 1) * s_old; x++)
        amax = std::max(amax,
                        x < kNumel ? (double)std::fabs(bf2f(weight(x))) : 0.0);
      double w = bf2f(weight(g)), got = bf2f(ns[j]);
      if (!(std::fabs(got - w) <= qwz_bound(w, amax, sc.qwz_bits)))
        BAD("lost element %zu: %g, was %g, bound %g", g, got, w,
            qwz_bound(w, amax, sc.qwz_bits));
    }
  }

  // a training step on the recovered weights: gather, local gradient
  // (w - target of my old rank) in bf16, reduce-scatter MEAN, SGD
  void *nf = nullptr;
  if (zpp_pgroup_fetch(ng, ZPP_FETCH_FORWARD, nullptr) != ZPP_OK ||
      zpp_pgroup_wait(ng, &nf) != ZPP_OK) {
    res.status = -304;
    res.msg = std::string("fetch after recovery: ") + zpp_get_last_error();
    return res;
  }
  const uint16_t *wf = (const uint16_t *)nf;
  std::vector<uint16_t> wcopy(wf, wf + ni.padded_numel);
  zpp_pgroup_release(ng);
  int nr = 0;
  zpp_comm_rank(nc, &nr);
  std::vector<uint16_t> grad(ni.padded_numel, 0), gs(ni.shard_numel);
  for (size_t g = 0; g < kNumel; g++)
    grad[g] = f2bf(bf2f(wcopy[g]) - target(old_of[nr], g));
  if (zpp_pgroup_reduce_gradients(ng, grad.data(), gs.data(), ZPP_OP_MEAN,
                                  nullptr, nullptr) != ZPP_OK) {
    res.status = -305;
    res.msg = std::string("reduce after recovery: ") + zpp_get_last_error();
    return res;
  }
  const float lr = 0.01f;
  for (size_t j = 0; j < ni.shard_numel; j++) {
    size_t g = ni.shard_offset + j;
    if (g >= kNumel)
      continue;
    // the gathered weight is the recovered one (exact without qwZ)
    if (sc.qwz_bits == 0 && wcopy[g] != ns[j])
      BAD("gathered element %zu: %#x, recovered %#x", g, wcopy[g], ns[j]);
    double w = bf2f(wcopy[g]), gref = 0, m = 0;
    for (int k = 0; k < res.new_size; k++) {
      double d = w - (double)target(old_of[k], g);
      gref += d;
      m = std::max(m, std::fabs(d));
    }
    gref /= res.new_size;
    // bf16 rounding of each local gradient, of the node partials and of
    // the result: 2^-9 relative each, of values at most m; fp32 sums add
    // 2^-24 per term (docs/design.md, "Reductions are deterministic")
    double gb = 4 * std::ldexp(m, -9) + std::ldexp(m, -20);
    double got = bf2f(gs[j]);
    if (!(std::fabs(got - gref) <= gb))
      BAD("gradient of element %zu: %.9g, float64 %.9g, bound %.3g", g, got,
          gref, gb);
    double upd = bf2f(f2bf((float)w - lr * (float)got)), uref = w - lr * gref;
    double ub = lr * gb + std::ldexp(std::fabs(uref) + lr * gb, -8) +
                std::ldexp(std::fabs(w) + lr * std::fabs(got), -23);
    if (!(std::fabs(upd - uref) <= ub))
      BAD("updated element %zu: %.9g, float64 %.9g, bound %.3g", g, upd, uref,
          ub);
  }
  zpp_pgroup_destroy(ng);
  zpp_comm_destroy(nc);
  return res;
}

void run(const Scenario &sc) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  Job job(sc.n, [&](int i, const Ctl &c) {
    return survivor(i, c.ready_w, c.go_r, c.id_w, c.id_r, sc);
  });
  ASSERT_TRUE(job.all_ready(20)) << "the ranks did not start";
  double t_kill = mono_s();
  for (int v : sc.victims)
    job.kill_rank(v);
  job.go();
  std::vector<Res> res = job.finish(25);
  long state_lost = 0, rebuilt = -1;
  double worst = 0;
  for (int i = 0; i < sc.n; i++) {
    if (std::find(sc.victims.begin(), sc.victims.end(), i) != sc.victims.end())
      continue;
    const Res &r = res[i];
    SCOPED_TRACE("rank " + std::to_string(i));
    EXPECT_NE(r.coll_status, 0) << "the gather with a dead rank did not fail";
    ASSERT_EQ(r.status, sc.want)
        << zpp_status_string((zpp_status_t)r.status) << ": " << r.msg;
    for (const std::string &w : sc.want_msg)
      EXPECT_NE(r.msg.find(w), std::string::npos)
          << "the error does not say \"" << w << "\": " << r.msg;
    if (sc.want != ZPP_OK) {
      std::printf("rank %d: %s\n", i, r.msg.c_str());
      continue;
    }
    EXPECT_EQ(r.bad, 0) << r.msg;
    EXPECT_GT(r.checked, 0);
    EXPECT_EQ(r.lost_ranks, (int)sc.victims.size());
    EXPECT_EQ(r.new_size, sc.n - (int)sc.victims.size());
    EXPECT_EQ(r.exact, sc.qwz_bits == 0 ? 1 : 0);
    if (rebuilt < 0)
      rebuilt = r.rebuilt;
    EXPECT_EQ(r.rebuilt, rebuilt) << "survivors disagree on what was rebuilt";
    state_lost += r.state_lost;
    worst = std::max(worst, r.t_recovered - t_kill);
    std::printf("rank %d: failed %.3f s after the kill, shrunk in %.3f s, "
                "recovered in %.3f s; %ld elements checked\n",
                i, r.t_fail - t_kill, r.t_shrunk - r.t_fail,
                r.t_recovered - r.t_shrunk, r.checked);
  }
  if (sc.want != ZPP_OK)
    return;
  // every rebuilt element lost its state on exactly one survivor
  EXPECT_EQ(state_lost, rebuilt);
  if (sc.want_rebuilt)
    EXPECT_GT(rebuilt, 0);
  else
    EXPECT_EQ(rebuilt, 0) << "a rank owning only padding was lost";
  std::printf("kill to recovered group on every survivor: %.3f s "
              "(ZPP_TIMEOUT_S %.1f)\n",
              worst, kTimeout);
}

TEST(Recover, Kill1Exact2x2) { run({4, "2x2", {1}, 1, 0}); }

TEST(Recover, Kill2Quantized2x2) { run({4, "2x2", {2}, 1, 8}); }

TEST(Recover, Kill5Exact2x4) { run({8, "2x4", {5}, 1, 0}); }

// rank 0: the old bootstrap's root and the shrink's first coordinator
TEST(Recover, Kill0Quantized2x4) { run({8, "2x4", {0}, 1, 8}); }

// A whole node: the other node's secondary partition holds every shard.
TEST(Recover, WholeNodeKilled2x4) { run({8, "2x4", {4, 5, 6, 7}, 1, 0}); }

TEST(Recover, HpzOffIsDataLost2x2) {
  Scenario sc{4, "2x2", {3}, 0, 0};
  sc.want = ZPP_ERR_DATA_LOST;
  sc.want_msg = {"old rank 3 (node 1) died", "cfg->hpz 0"};
  run(sc);
}

// Ranks 1 and 3 are local rank 1 of both nodes: the only holders of each
// other's copies.
TEST(Recover, CopyHoldersDeadIsDataLost2x2) {
  Scenario sc{4, "2x2", {1, 3}, 1, 8};
  sc.want = ZPP_ERR_DATA_LOST;
  sc.want_msg = {"old rank 1 (node 0) died", "old rank 3 (node 1) dead"};
  run(sc);
}

TEST(Recover, OneNodeIsDataLost1x4) {
  Scenario sc{4, "1x4", {2}, 1, 0};
  sc.want = ZPP_ERR_DATA_LOST;
  sc.want_msg = {"old rank 2 (node 0) died", "one node"};
  run(sc);
}

// Uneven nodes (as after a first recovery): hpZ keeps no secondary copy,
// so a death there is not recoverable, and says so.
TEST(Recover, UnevenNodesAreDataLost) {
  Scenario sc{5, "0,0,1,1,1", {3}, 1, 0};
  sc.want = ZPP_ERR_DATA_LOST;
  sc.want_msg = {"old rank 3 (node 1) died", "uneven nodes"};
  run(sc);
}

// The parameters changed after the last forward gather: the copies are
// stale, never used.
TEST(Recover, StaleCopyIsDataLost2x2) {
  Scenario sc{4, "2x2", {2}, 1, 0};
  sc.stale = true;
  sc.want = ZPP_ERR_DATA_LOST;
  sc.want_msg = {"old rank 2 (node 1) died", "old rank 0 (node 0) stale"};
  run(sc);
}

// A full buffer attached after a failed fetch: the group's own one is
// left allocated (named, with its size), not freed under the backend.
TEST(Recover, AttachAfterAFailedFetchLeaksTheOwnFullBuffer2x2) {
  Scenario sc{4, "2x2", {1}, 1, 0};
  sc.attach_full = true;
  run(sc);
}

// The parameters changed on rank 0 only before the failure: the
// survivors' generations differ and no copy is trusted.
TEST(Recover, SurvivorsAtDifferentGenerationsMismatch2x2) {
  Scenario sc{4, "2x2", {3}, 1, 0};
  sc.stale_ranks = {0};
  sc.want = ZPP_ERR_MISMATCH;
  sc.want_msg = {"generation", "the parameters changed on some survivors"};
  run(sc);
}

// cfg.align 2048: shards of 2048 elements, numel 3077: old ranks 2 and 3
// own only padding; losing rank 3 rebuilds nothing and loses no state.
TEST(Recover, LostRankOwningOnlyPadding2x2) {
  Scenario sc{4, "2x2", {3}, 1, 0};
  sc.align = 2048;
  sc.want_rebuilt = false;
  run(sc);
}

// Two groups of the same layout, so that only their creation order tells
// them apart.  Each survivor fills group k with weight(g + k * kNumel),
// gathers both, and after rank 3's death recovers them in creation order,
// or (swap) rank 0 in the reverse order.  In order: every element of each
// new shard is bitwise its group's weight; swapped: ZPP_ERR_MISMATCH on
// every survivor, naming the id.
Res two_groups(int i, int ready_w, int go_r, const std::vector<int> &id_w,
               int id_r, bool swap) {
  Res res;
  const int n = 4;
  zpp_comm_t comm = make_comm(i, n, id_w, id_r, "2x2");
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.hpz = 1;
  zpp_pgroup_t pg[2] = {nullptr, nullptr};
  for (int k = 0; k < 2; k++) {
    if (zpp_pgroup_create(comm, &cfg, kSizes, 2, &pg[k]) != ZPP_OK) {
      res.status = -300;
      res.msg = zpp_get_last_error();
      return res;
    }
    zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
    zpp_pgroup_get_info(pg[k], &info);
    uint16_t *shard;
    zpp_pgroup_shard(pg[k], (void **)&shard);
    for (size_t j = 0; j < info.shard_numel; j++) {
      size_t g = info.shard_offset + j;
      shard[j] = g < kNumel ? weight(g + (size_t)k * kNumel) : 0;
    }
    if (zpp_pgroup_fetch(pg[k], ZPP_FETCH_FORWARD, nullptr) != ZPP_OK ||
        zpp_pgroup_wait(pg[k], nullptr) != ZPP_OK) {
      res.status = -301;
      res.msg = zpp_get_last_error();
      return res;
    }
    zpp_pgroup_release(pg[k]);
  }
  char b = 1;
  if (write(ready_w, &b, 1) != 1 || read(go_r, &b, 1) != 1)
    _exit(4);
  res.coll_status = zpp_pgroup_fetch(pg[0], ZPP_FETCH_FORWARD, nullptr);
  if (res.coll_status == ZPP_OK)
    res.coll_status = zpp_pgroup_wait(pg[0], nullptr);
  std::vector<int> map(n, -7);
  zpp_comm_t nc = nullptr;
  if (zpp_comm_shrink(comm, nullptr, map.data(), &nc) != ZPP_OK) {
    res.status = -302;
    res.msg = std::string("shrink: ") + zpp_get_last_error();
    return res;
  }
  zpp_comm_size(nc, &res.new_size);
  zpp_pgroup_t ng[2] = {nullptr, nullptr};
  res.status = ZPP_OK;
  for (int t = 0; t < 2 && res.status == ZPP_OK; t++) {
    int k = swap && i == 0 ? 1 - t : t;
    res.status = zpp_pgroup_recover(pg[k], nc, map.data(), &ng[k], nullptr);
    if (res.status != ZPP_OK)
      res.msg = zpp_get_last_error();
  }
  for (int k = 0; k < 2 && res.status == ZPP_OK; k++) {
    zpp_pgroup_info_t ni = ZPP_PGROUP_INFO_INIT;
    zpp_pgroup_get_info(ng[k], &ni);
    uint16_t *ns;
    zpp_pgroup_shard(ng[k], (void **)&ns);
    for (size_t j = 0; j < ni.shard_numel; j++, res.checked++) {
      size_t g = ni.shard_offset + j;
      uint16_t want = g < kNumel ? weight(g + (size_t)k * kNumel) : 0;
      if (ns[j] != want)
        BAD("group %d element %zu: %#x, want %#x", k, g, ns[j], want);
    }
  }
  for (int k = 0; k < 2; k++) {
    zpp_pgroup_destroy(ng[k]);
    zpp_pgroup_destroy(pg[k]);
  }
  zpp_comm_destroy(nc);
  zpp_comm_destroy(comm);
  return res;
}

void run_two_groups(bool swap) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  Job job(4, [&](int i, const Ctl &c) {
    return two_groups(i, c.ready_w, c.go_r, c.id_w, c.id_r, swap);
  });
  ASSERT_TRUE(job.all_ready(20)) << "the ranks did not start";
  job.kill_rank(3);
  job.go();
  std::vector<Res> res = job.finish(25);
  for (int i = 0; i < 3; i++) {
    SCOPED_TRACE("rank " + std::to_string(i));
    const Res &r = res[i];
    EXPECT_NE(r.coll_status, 0) << "the gather with a dead rank did not fail";
    if (swap) {
      EXPECT_EQ(r.status, ZPP_ERR_MISMATCH)
          << zpp_status_string((zpp_status_t)r.status) << ": " << r.msg;
      EXPECT_NE(r.msg.find("id (creation order)"), std::string::npos) << r.msg;
      std::printf("rank %d: %s\n", i, r.msg.c_str());
    } else {
      EXPECT_EQ(r.status, ZPP_OK)
          << zpp_status_string((zpp_status_t)r.status) << ": " << r.msg;
      EXPECT_EQ(r.bad, 0) << r.msg;
      EXPECT_GT(r.checked, 0);
    }
  }
}

TEST(Recover, TwoGroupsInCreationOrder2x2) { run_two_groups(false); }

TEST(Recover, TwoGroupsPairedInDifferentOrdersMismatch2x2) {
  run_two_groups(true);
}

// zpp_pgroup_recover_state with elements of 4 MiB: the re-partition's
// all-gather moves at most 32 MiB in all per chunk, so with 3 survivors a
// chunk holds 2 elements and an old shard of 3 (10 elements, align 1, over
// 4 ranks) takes two chunks, the second short.  Every survivor's element
// keeps its bytes (a pattern of its index and byte offset); rank 1's,
// lost, are zero.
Res big_state(int i, int ready_w, int go_r, const std::vector<int> &id_w,
              int id_r) {
  Res res;
  const int n = 4;
  const size_t eb = (size_t)4 << 20, sizes[1] = {10};
  zpp_comm_t comm = make_comm(i, n, id_w, id_r, "2x2");
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  cfg.hpz = 1;
  cfg.align = 1;
  zpp_pgroup_t pg = nullptr;
  if (zpp_pgroup_create(comm, &cfg, sizes, 1, &pg) != ZPP_OK) {
    res.status = -300;
    res.msg = zpp_get_last_error();
    return res;
  }
  zpp_pgroup_info_t info = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(pg, &info);
  auto byte = [&](size_t g, size_t k) {
    return (uint8_t)(g * 131 + k * 7 + (k >> 12) + seed());
  };
  std::vector<uint8_t> old_state(info.shard_numel * eb);
  for (size_t j = 0; j < info.shard_numel; j++)
    for (size_t k = 0; k < eb; k++)
      old_state[j * eb + k] = byte(info.shard_offset + j, k);
  if (zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr) != ZPP_OK ||
      zpp_pgroup_wait(pg, nullptr) != ZPP_OK) {
    res.status = -301;
    res.msg = zpp_get_last_error();
    return res;
  }
  zpp_pgroup_release(pg);
  char b = 1;
  if (write(ready_w, &b, 1) != 1 || read(go_r, &b, 1) != 1)
    _exit(4);
  res.coll_status = zpp_pgroup_fetch(pg, ZPP_FETCH_FORWARD, nullptr);
  if (res.coll_status == ZPP_OK)
    res.coll_status = zpp_pgroup_wait(pg, nullptr);
  std::vector<int> map(n, -7);
  zpp_comm_t nc = nullptr;
  if (zpp_comm_shrink(comm, nullptr, map.data(), &nc) != ZPP_OK) {
    res.status = -302;
    res.msg = std::string("shrink: ") + zpp_get_last_error();
    return res;
  }
  zpp_pgroup_t ng = nullptr;
  res.status = zpp_pgroup_recover(pg, nc, map.data(), &ng, nullptr);
  if (res.status != ZPP_OK) {
    res.msg = zpp_get_last_error();
    return res;
  }
  zpp_pgroup_info_t ni = ZPP_PGROUP_INFO_INIT;
  zpp_pgroup_get_info(ng, &ni);
  std::vector<uint8_t> ns(ni.shard_numel * eb, 0xee);
  int st = zpp_pgroup_recover_state(ng, old_state.data(), ns.data(), eb);
  if (st != ZPP_OK) {
    res.status = -303;
    res.msg = std::string("recover_state: ") + zpp_get_last_error();
    return res;
  }
  for (size_t j = 0; j < ni.shard_numel; j++) {
    size_t g = ni.shard_offset + j;
    bool zero = g >= sizes[0] || g / info.shard_numel == 1;
    for (size_t k = 0; k < eb; k++, res.checked++) {
      uint8_t want = zero ? 0 : byte(g, k);
      if (ns[j * eb + k] != want)
        BAD("element %zu byte %zu: %#x, want %#x", g, k, ns[j * eb + k], want);
    }
  }
  zpp_pgroup_destroy(ng);
  zpp_pgroup_destroy(pg);
  zpp_comm_destroy(nc);
  zpp_comm_destroy(comm);
  return res;
}

TEST(Recover, StateInSeveralChunks2x2) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  Job job(4, [&](int i, const Ctl &c) {
    return big_state(i, c.ready_w, c.go_r, c.id_w, c.id_r);
  });
  ASSERT_TRUE(job.all_ready(20)) << "the ranks did not start";
  job.kill_rank(1);
  job.go();
  std::vector<Res> res = job.finish(25);
  for (int i : {0, 2, 3}) {
    SCOPED_TRACE("rank " + std::to_string(i));
    EXPECT_EQ(res[i].status, ZPP_OK)
        << zpp_status_string((zpp_status_t)res[i].status) << ": " << res[i].msg;
    EXPECT_EQ(res[i].bad, 0) << res[i].msg;
    EXPECT_GT(res[i].checked, 0);
  }
}

// recover's and its companions' own argument checks, on one rank (a
// communicator of one and a second one as the "shrunk" one).
Res arg_checks(int i, int ready_w, const std::vector<int> &id_w, int id_r) {
  Res res;
  zpp_comm_t comm = make_comm(i, 1, id_w, id_r, nullptr);
  zpp_comm_t nc = make_comm(i, 1, id_w, id_r, nullptr);
  char b = 1;
  if (write(ready_w, &b, 1) != 1)
    _exit(4);
  auto expect = [&](const char *what, int got, int want, const char *text) {
    res.checked++;
    std::string m = zpp_get_last_error();
    if (got != want || m.find(text) == std::string::npos)
      BAD("%s: %s (%s), want %s with \"%s\"", what,
          zpp_status_string((zpp_status_t)got), m.c_str(),
          zpp_status_string((zpp_status_t)want), text);
  };
  zpp_pgroup_config_t cfg = ZPP_PGROUP_CONFIG_INIT;
  zpp_pgroup_t pg = nullptr, ng = nullptr;
  if (zpp_pgroup_create(comm, &cfg, kSizes, 2, &pg) != ZPP_OK) {
    res.status = -300;
    res.msg = zpp_get_last_error();
    return res;
  }
  int map[1] = {0};
  zpp_pgroup_recovery_t rep = ZPP_PGROUP_RECOVERY_INIT;
  rep.struct_size = 8;
  expect("struct_size", zpp_pgroup_recover(pg, nc, map, &ng, &rep),
         ZPP_ERR_INVALID_ARGUMENT, "report->struct_size 8");
  int bad1[1] = {1}, bad2[1] = {-1};
  expect("map 1", zpp_pgroup_recover(pg, nc, bad1, &ng, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "new_rank_of[0] 1");
  expect("map -1", zpp_pgroup_recover(pg, nc, bad2, &ng, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "new_rank_of: names 0 survivors");
  expect("same comm", zpp_pgroup_recover(pg, comm, map, &ng, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "newcomm is the old group's communicator");
  zpp_pgroup_config_t qc = ZPP_PGROUP_CONFIG_INIT;
  qc.qwd_bits = 8;
  zpp_pgroup_t qg = nullptr;
  if (zpp_pgroup_create(comm, &qc, kSizes, 2, &qg) == ZPP_OK) {
    expect("qWD", zpp_pgroup_recover(qg, nc, map, &ng, nullptr),
           ZPP_ERR_UNSUPPORTED, "qWD group (cfg->qwd_bits 8)");
    zpp_pgroup_destroy(qg);
  } else {
    BAD("qWD group: %s", zpp_get_last_error());
  }
  float st[1] = {0};
  expect("recover_state of a group not recovered",
         zpp_pgroup_recover_state(pg, st, st, 4), ZPP_ERR_INVALID_ARGUMENT,
         "not made by zpp_pgroup_recover");
  expect("lost of a group not recovered",
         zpp_pgroup_lost(pg, 0, nullptr, nullptr, nullptr, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "not made by zpp_pgroup_recover");
  rep = ZPP_PGROUP_RECOVERY_INIT;
  if (zpp_pgroup_recover(pg, nc, map, &ng, &rep) != ZPP_OK) {
    BAD("recover with nobody lost: %s", zpp_get_last_error());
  } else {
    if (rep.lost_ranks != 0 || rep.rebuilt_numel != 0)
      BAD("nobody lost: lost_ranks %d rebuilt %zu", rep.lost_ranks,
          rep.rebuilt_numel);
    std::vector<float> a(kNumel), c(kNumel);
    expect("elem_bytes 0", zpp_pgroup_recover_state(ng, a.data(), c.data(), 0),
           ZPP_ERR_INVALID_ARGUMENT, "elem_bytes 0");
    expect("lost 0 of 0",
           zpp_pgroup_lost(ng, 0, nullptr, nullptr, nullptr, nullptr),
           ZPP_ERR_INVALID_ARGUMENT, "i 0: must be in [0, 0)");
    expect("lost -1",
           zpp_pgroup_lost(ng, -1, nullptr, nullptr, nullptr, nullptr),
           ZPP_ERR_INVALID_ARGUMENT, "i -1: must be in [0, 0)");
    zpp_pgroup_destroy(ng);
  }
  zpp_pgroup_destroy(pg);
  zpp_comm_destroy(nc);
  zpp_comm_destroy(comm);
  res.status = ZPP_OK;
  return res;
}

TEST(Recover, OwnChecksNameTheBadArgument) {
  Job job(1, [&](int i, const Ctl &c) {
    return arg_checks(i, c.ready_w, c.id_w, c.id_r);
  });
  ASSERT_TRUE(job.all_ready(20)) << "the rank did not start";
  std::vector<Res> res = job.finish(25);
  EXPECT_EQ(res[0].status, ZPP_OK) << res[0].msg;
  EXPECT_EQ(res[0].bad, 0) << res[0].msg;
  EXPECT_EQ(res[0].checked, 10);
}

} // namespace
