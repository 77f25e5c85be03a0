// zpp_comm_shrink: surviving a rank's death (include/zpp/zpp_comm.h,
// docs/api.md "Shrinking after a failure").  Each test forks plain
// processes that build a communicator over zpp's TCP bootstrap (UCX
// backend, loopback, no MPI), SIGKILLs one (before, or in the middle of,
// all-gathers and reduce-scatters), and checks on every survivor that
//   - the collective fails (bounded), zpp_comm_shrink succeeds, and every
//     survivor reports the same map of old ranks to new ones: the dead rank
//     (and a live rank that did not call shrink) out, the others renumbered
//     in order;
//   - the next all-gather and reduce-scatter on the new communicator are
//     exact (against every rank's data regenerated from the seed);
//   - the new node map is the old one without the dead rank (an emulated
//     2x2 that lost a rank becomes uneven);
// and that a second SIGKILL during the shrink ends in a named error on
// every survivor within the bound.  The time from the kill to the first
// exact collective is printed.
//
// Seed: ZPP_TEST_SEED (default 20261129), printed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#include "comm/comm_impl.h"
#include "comm/shrink_report.h"
#include "fork_job.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The communicator's timeout: the collective with the dead rank fails
// within it (or sooner, when UCX sees the peer's connection reset).
constexpr double kTimeout = 3.0;

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

using zpp_test::mono_s;

// What a child reports through its pipe: "key value" lines, the message
// last.
struct Res {
  int status = 99; // zpp_status_t of the shrink; 99: no result (msg: how
                   // the child ended, tests/fork_job.h)
  int coll_status = 0; // of the collective that failed first
  int new_rank = -1, new_size = 0, nnodes = 0, uniform = -1;
  std::string map; // new_rank_of, "0,1,-1,2"
  std::string node_sizes;
  double t_fail = 0, t_shrunk = 0, t_exact = 0, t_destroyed = 0;
  int exact = 0; // 1: the collectives on the new communicator were exact
  std::string msg;
};

std::string encode(const Res &r) {
  std::ostringstream o;
  o.precision(17);
  o << r.status << ' ' << r.coll_status << ' ' << r.new_rank << ' '
    << r.new_size << ' ' << r.nnodes << ' ' << r.uniform << ' '
    << (r.map.empty() ? "-" : r.map) << ' '
    << (r.node_sizes.empty() ? "-" : r.node_sizes) << ' ' << r.t_fail << ' '
    << r.t_shrunk << ' ' << r.t_exact << ' ' << r.t_destroyed << ' ' << r.exact
    << '\n'
    << r.msg;
  return o.str();
}

Res decode(const std::string &text) {
  Res r;
  std::istringstream in(text);
  in >> r.status >> r.coll_status >> r.new_rank >> r.new_size >> r.nnodes >>
      r.uniform >> r.map >> r.node_sizes >> r.t_fail >> r.t_shrunk >>
      r.t_exact >> r.t_destroyed >> r.exact;
  if (!in)
    return Res();
  std::getline(in, r.msg);
  std::string rest((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  r.msg = rest;
  return r;
}

// Forked ranks (tests/fork_job.h).
using Ctl = zpp_test::ForkCtl;
using Job = zpp_test::ForkJob<Res, encode, decode>;

zpp_unique_id_t share_id(int i, const Ctl &c) {
  zpp_unique_id_t id;
  std::memset(&id, 0, sizeof id);
  if (i == 0) {
    if (zpp_get_unique_id(&id) != ZPP_OK)
      _exit(3);
    for (size_t k = 1; k < c.id_w.size(); k++)
      if (write(c.id_w[k], &id, sizeof id) != (ssize_t)sizeof id)
        _exit(3);
  } else if (read(c.id_r, &id, sizeof id) != (ssize_t)sizeof id) {
    _exit(3);
  }
  return id;
}

zpp_comm_t make_comm(int i, int n, const Ctl &c, const char *topo) {
  zpp_unique_id_t id = share_id(i, c);
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

// Data of a rank identified by its OLD rank (so the reference does not
// depend on the renumbering), per round.
std::vector<float> data_of(int old_rank, int round, size_t n, bool integers) {
  std::mt19937_64 g(seed() * 1000003ull + (uint64_t)old_rank * 7919ull +
                    (uint64_t)round);
  std::vector<float> v(n);
  if (integers) {
    std::uniform_int_distribution<int> d(-1000, 1000);
    for (auto &x : v)
      x = (float)d(g);
  } else {
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto &x : v)
      x = d(g);
  }
  return v;
}

// The buffers of failed calls: the backend may still write them until
// zpp_comm_destroy returns (<zpp/zpp_comm.h>, "faults"), so they are freed
// only after that.
std::vector<std::vector<float>> g_keep;

// One all-gather and one reduce-scatter SUM of small integers (exact in
// fp32) on `comm`, whose rank r is old rank old_of[r]; 0 when both are
// exact, the failing status otherwise, -100 when a result is wrong.
int exact_round(zpp_comm_t comm, const std::vector<int> &old_of, int round,
                std::string *why) {
  int rank = 0, size = 0;
  zpp_comm_rank(comm, &rank);
  zpp_comm_size(comm, &size);
  const size_t n = 4099, m = 1031;
  std::vector<float> mine = data_of(old_of[rank], round, n, false),
                     all(n * size);
  int st = zpp_allgather(comm, mine.data(), all.data(), n, ZPP_FLOAT32, nullptr,
                         nullptr);
  if (st != ZPP_OK) {
    *why = zpp_comm_get_last_error(comm);
    g_keep.push_back(std::move(mine));
    g_keep.push_back(std::move(all));
    return st;
  }
  for (int r = 0; r < size; r++)
    if (std::memcmp(all.data() + r * n,
                    data_of(old_of[r], round, n, false).data(),
                    n * sizeof(float)) != 0) {
      *why = "all-gather: block of rank " + std::to_string(r) + " differs";
      return -100;
    }
  std::vector<float> send = data_of(old_of[rank], round + 5000, m * size, true),
                     out(m);
  st = zpp_reduce_scatter(comm, send.data(), out.data(), m, ZPP_FLOAT32,
                          ZPP_OP_SUM, nullptr, nullptr);
  if (st != ZPP_OK) {
    *why = zpp_comm_get_last_error(comm);
    g_keep.push_back(std::move(send));
    g_keep.push_back(std::move(out));
    return st;
  }
  std::vector<double> ref(m, 0.0);
  for (int r = 0; r < size; r++) {
    std::vector<float> x = data_of(old_of[r], round + 5000, m * size, true);
    for (size_t k = 0; k < m; k++)
      ref[k] += x[(size_t)rank * m + k];
  }
  for (size_t k = 0; k < m; k++)
    if ((double)out[k] != ref[k]) {
      *why = "reduce-scatter: element " + std::to_string(k) + " is " +
             std::to_string(out[k]) + ", want " + std::to_string(ref[k]);
      return -100;
    }
  return 0;
}

enum class When { Before, During };

struct Scenario {
  int n;
  const char *topo; // emulated node map (nullptr: one real host)
  int victim;
  When when;
  int idle = -1;              // a live rank that never calls shrink (-1: none)
  double shrink_timeout = 0;  // zpp_shrink_config_t.timeout_s (0: default)
  int second = -1;            // a rank killed during the shrink (-1: none)
  const char *second_at = ""; // ... at this point of zpp_comm_shrink
  int want = ZPP_OK;          // what every other survivor's shrink returns
  // Rank `cut`'s first `cut_times` connections to rank `cut_to` fail here
  // (EADDRNOTAVAIL, standing in for a lost SYN or a full descriptor
  // table: no proof of death); cut_times < 0: all of them, and rank `cut`
  // must end in a named error while the others leave it out.
  int cut = -1, cut_to = 0, cut_times = 0;
  const char *pause_at = ""; // every rank sleeps 50 ms at this point
};

// Points of the shrink: the second victim SIGKILLs itself at g_die_at;
// every rank sleeps at g_pause_at.
const char *g_die_at = "";
const char *g_pause_at = "";
void at_point(int, const char *point) {
  if (std::strcmp(point, g_die_at) == 0)
    raise(SIGKILL);
  if (std::strcmp(point, g_pause_at) == 0)
    usleep(50000);
}

int g_cut_to = -1, g_cut_left = 0;
int cut_connect(int, int to) {
  if (to != g_cut_to || g_cut_left == 0)
    return 0;
  if (g_cut_left > 0)
    g_cut_left--;
  return EADDRNOTAVAIL;
}

// Collectives until one fails; then the shrink, a check of the new
// communicator, and one exact round on it.
Res survivor(int i, const Ctl &ctl, const Scenario &sc) {
  Res res;
  zpp_comm_t comm = make_comm(i, sc.n, ctl, sc.topo);
  std::vector<int> ident(sc.n);
  for (int r = 0; r < sc.n; r++)
    ident[r] = r;
  std::string why;
  int round = 0;
  if (exact_round(comm, ident, round++, &why) != 0) {
    res.status = -200;
    res.msg = "first round: " + why;
    return res;
  }
  ctl.ready();
  if (sc.when == When::Before)
    ctl.wait_go();
  // Collectives until one fails (the victim's are interrupted by the kill).
  double t0 = mono_s();
  for (;;) {
    int st = exact_round(comm, ident, round++, &why);
    if (st == -100) {
      res.status = -200;
      res.msg = "before the failure: " + why;
      return res;
    }
    if (st != 0) {
      res.coll_status = st;
      break;
    }
    if (mono_s() - t0 > 20) {
      res.status = -201;
      res.msg = "no collective failed within 20 s";
      return res;
    }
  }
  res.t_fail = mono_s();
  if (i == sc.idle) {
    // alive, but calls shrink only once the others returned from theirs
    // (the parent's go); its bound counts from that call
    ctl.wait_go();
    res.t_fail = mono_s();
  }
  if (i == sc.second)
    g_die_at = sc.second_at;
  g_pause_at = sc.pause_at;
  zpp_shrink_test_hook = at_point;
  if (i == sc.cut) {
    g_cut_to = sc.cut_to;
    g_cut_left = sc.cut_times;
    zpp_shrink_test_connect = cut_connect;
  }
  zpp_shrink_config_t cfg = ZPP_SHRINK_CONFIG_INIT;
  cfg.timeout_s = sc.shrink_timeout;
  std::vector<int> map(sc.n, -7);
  zpp_comm_t nc = nullptr;
  res.status = zpp_comm_shrink(comm, &cfg, map.data(), &nc);
  res.t_shrunk = mono_s();
  if (sc.idle >= 0 && i != sc.idle)
    ctl.ready(); // returned: the idle rank may call now
  if (res.status != ZPP_OK) {
    res.msg = zpp_get_last_error();
  } else {
    std::vector<int> old_of;
    for (int r = 0; r < sc.n; r++) {
      res.map += (r ? "," : "") + std::to_string(map[r]);
      if (map[r] >= 0)
        old_of.push_back(r);
    }
    zpp_comm_rank(nc, &res.new_rank);
    zpp_comm_size(nc, &res.new_size);
    zpp_comm_nnodes(nc, &res.nnodes);
    zpp_comm_topo_uniform(nc, &res.uniform);
    for (int k = 0; k < res.nnodes; k++) {
      int s = 0;
      zpp_comm_node_size(nc, k, &s);
      res.node_sizes += (k ? "," : "") + std::to_string(s);
    }
    if ((int)old_of.size() != res.new_size) {
      res.msg = "new_rank_of names " + std::to_string(old_of.size()) +
                " members, the communicator has " +
                std::to_string(res.new_size);
    } else {
      int st = exact_round(nc, old_of, 1000, &why);
      res.t_exact = mono_s();
      res.exact = st == 0;
      if (st != 0)
        res.msg = "after the shrink: " + why;
    }
    zpp_comm_destroy(nc);
  }
  zpp_comm_destroy(comm);
  res.t_destroyed = mono_s();
  g_keep.clear();
  return res;
}

// The map every survivor must report: the dead and the idle rank out,
// the others renumbered in order.
std::string expected_map(int n, const std::vector<int> &out) {
  std::string s;
  int next = 0;
  for (int r = 0; r < n; r++) {
    bool gone = false;
    for (int o : out)
      gone |= o == r;
    s += (r ? "," : "") + std::to_string(gone ? -1 : next++);
  }
  return s;
}

void run_scenario(const Scenario &sc, const std::string &want_nodes) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  Job job(sc.n, [&](int i, const Ctl &c) { return survivor(i, c, sc); });
  ASSERT_TRUE(job.all_ready(20)) << "the ranks did not start";
  if (sc.when == When::Before) {
    job.kill_rank(sc.victim);
    job.go();
  } else {
    usleep(300000); // the ranks are in the middle of their collectives
    job.kill_rank(sc.victim);
  }
  if (sc.idle >= 0) {
    std::vector<int> skip = {sc.victim, sc.idle, sc.second};
    EXPECT_TRUE(job.all_ready(25, skip))
        << "the other survivors did not return from zpp_comm_shrink";
    job.go_one(sc.idle);
  }
  std::vector<Res> res = job.finish(25);
  std::vector<int> out = {sc.victim};
  if (sc.idle >= 0)
    out.push_back(sc.idle);
  if (sc.second >= 0)
    out.push_back(sc.second);
  if (sc.cut >= 0 && sc.cut_times < 0)
    out.push_back(sc.cut);
  const std::string want = expected_map(sc.n, out);
  const double bound = sc.shrink_timeout > 0 ? sc.shrink_timeout : 3 * kTimeout;
  double worst = 0;
  for (int i = 0; i < sc.n; i++) {
    if (i == sc.victim)
      continue;
    const Res &r = res[i];
    SCOPED_TRACE("rank " + std::to_string(i));
    if (i == sc.second) {
      // it SIGKILLs itself: any other end (a crash, an exit) is a failure
      EXPECT_EQ(r.status, 99) << "the second victim did not die: " << r.msg;
      EXPECT_TRUE(job.died_by(i, SIGKILL)) << job.how(i);
      continue;
    }
    EXPECT_NE(r.coll_status, 0)
        << "the collective with the dead rank did not fail";
    // every wait bounded: the collective's timeout, the shrink's bound
    EXPECT_LT(r.t_shrunk - r.t_fail, bound + 1.0);
    if (i == sc.idle) {
      EXPECT_EQ(r.status, ZPP_ERR_EXCLUDED) << r.msg;
      EXPECT_NE(r.msg.find("after the decision"), std::string::npos) << r.msg;
      continue;
    }
    if (i == sc.cut && sc.cut_times < 0) {
      // it never reached the coordinator: left out, and told so
      EXPECT_TRUE(r.status == ZPP_ERR_EXCLUDED || r.status == ZPP_ERR_SYSTEM ||
                  r.status == ZPP_ERR_TIMEOUT)
          << r.status << " " << r.map << " " << r.msg;
      continue;
    }
    if (sc.want != ZPP_OK) {
      EXPECT_EQ(r.status, sc.want) << r.msg;
      // the caller's numbering: the creation's own numbers new ranks
      EXPECT_NE(r.msg.find("old rank " + std::to_string(sc.second)),
                std::string::npos)
          << "the error does not name the second victim: " << r.msg;
      // and no number of the new communicator's creation as a bare rank
      for (size_t p = r.msg.find("rank"); p != std::string::npos;
           p = r.msg.find("rank", p + 4)) {
        size_t q = p + 4 + (r.msg.compare(p + 4, 1, "s") == 0);
        bool word = p == 0 || !std::isalnum((unsigned char)r.msg[p - 1]);
        bool old = p >= 4 && r.msg.compare(p - 4, 4, "old ") == 0;
        EXPECT_FALSE(word && !old && q + 1 < r.msg.size() && r.msg[q] == ' ' &&
                     std::isdigit((unsigned char)r.msg[q + 1]))
            << "a rank not labelled old at " << p << ": " << r.msg;
      }
      std::printf("rank %d: shrink failed %.3f s after its call: %s\n", i,
                  r.t_shrunk - r.t_fail, r.msg.c_str());
      continue;
    }
    ASSERT_EQ(r.status, ZPP_OK) << r.msg;
    EXPECT_EQ(r.map, want);
    EXPECT_EQ(r.new_size, sc.n - (int)out.size());
    EXPECT_TRUE(r.exact) << r.msg;
    EXPECT_EQ(r.node_sizes, want_nodes);
    // bounded: the old communicator's cancelled transfers are waited for
    // at most the timeout
    EXPECT_LT(r.t_destroyed - r.t_exact, kTimeout + 10.0)
        << "destroying the old communicator";
    worst = std::max(worst, r.t_exact - job.t_kill);
    std::printf(
        "rank %d: failed %.3f s after the kill (status %d), shrunk %.3f s "
        "later, first exact collective %.3f s after the kill\n",
        i, r.t_fail - job.t_kill, r.coll_status, r.t_shrunk - r.t_fail,
        r.t_exact - job.t_kill);
  }
  if (sc.want != ZPP_OK)
    return;
  std::printf("death to the first exact collective on every survivor: %.3f s "
              "(ZPP_TIMEOUT_S %.1f s)\n",
              worst, kTimeout);
  // bounded, not timed: the failed collective's timeout, the shrink's own
  // bound and the first collective, with room for a loaded machine.  The
  // target (ZPP_TIMEOUT_S + 2 s) is a figure of perf/shrink_cluster_study.sh
  // and perf/survive_study.sh, not of a unit test.
  if (sc.idle < 0 && sc.second < 0 && sc.cut_times >= 0) {
    EXPECT_LT(worst, kTimeout + bound + 10.0);
  }
}

TEST(Shrink, KillBeforeAllGather1x4) {
  run_scenario({4, nullptr, 2, When::Before}, "3");
}

TEST(Shrink, KillDuringCollectives1x4) {
  run_scenario({4, nullptr, 1, When::During}, "3");
}

TEST(Shrink, KillRank0BeforeAllGather2x2) {
  // rank 0: the old bootstrap's root and the first coordinator candidate
  run_scenario({4, "2x2", 0, When::Before}, "1,2");
}

TEST(Shrink, KillDuringCollectives2x2) {
  run_scenario({4, "2x2", 3, When::During}, "2,1");
}

TEST(Shrink, KillDuringCollectives2x4) {
  run_scenario({8, "2x4", 5, When::During}, "4,3");
}

TEST(Shrink, KillBeforeAllGather2x4) {
  run_scenario({8, "2x4", 2, When::Before}, "3,4");
}

// Rank 2 stays alive but calls shrink only after the others decided: every
// survivor leaves it out alike, and it gets ZPP_ERR_EXCLUDED.
TEST(Shrink, LiveRankThatDoesNotJoinIsExcluded) {
  Scenario sc{4, "2x2", 3, When::Before};
  sc.idle = 2;
  run_scenario(sc, "2");
}

// A second rank dies after the coordinator's decision reached it: the
// creation of the new communicator, the commit, fails on every other
// survivor with ZPP_ERR_PEER_FAILED naming it, within the bound.
TEST(Shrink, SecondKillAfterTheDecisionFailsEverySurvivor) {
  Scenario sc{4, nullptr, 3, When::Before};
  sc.second = 2;
  sc.second_at = "decided";
  sc.want = ZPP_ERR_PEER_FAILED;
  run_scenario(sc, "");
}

// As above with old and new numbering apart: rank 1 dead, old rank 3 is
// new rank 2 of the members 0, 2, 3; the error names it as old rank 3.
TEST(Shrink, SecondKillIsNamedByItsOldRank) {
  Scenario sc{4, nullptr, 1, When::Before};
  sc.second = 3;
  sc.second_at = "decided";
  sc.want = ZPP_ERR_PEER_FAILED;
  run_scenario(sc, "");
}

// The coordinator (rank 0) dies while it decides: the others saw its
// connection close before any decision, and rank 1 takes over.
TEST(Shrink, CoordinatorKilledBeforeDecidingIsReplaced) {
  Scenario sc{4, "2x2", 3, When::Before};
  sc.second = 0;
  sc.second_at = "deciding";
  run_scenario(sc, "1,1");
}

// The coordinator dies after its DECIDE reached rank 1 only (it sends in
// rank order): rank 1's creation fails (ZPP_ERR_PEER_FAILED); rank 2, to
// which rank 0 now refuses, joins rank 1, which is creating and never
// answers: ZPP_ERR_TIMEOUT, or, once rank 1 destroyed comm (its socket
// then refuses), a communicator of rank 2 alone.  Never two survivors with
// ZPP_OK and different members.
TEST(Shrink, CoordinatorKilledAfterPartOfItsDecision) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  Scenario sc{4, nullptr, 3, When::Before};
  sc.second = 0;
  sc.second_at = "decide-one";
  Job job(sc.n, [&](int i, const Ctl &c) { return survivor(i, c, sc); });
  ASSERT_TRUE(job.all_ready(20)) << "the ranks did not start";
  job.kill_rank(3);
  job.go();
  std::vector<Res> res = job.finish(25);
  EXPECT_EQ(res[0].status, 99) << "rank 0 did not die: " << res[0].msg;
  EXPECT_TRUE(job.died_by(0, SIGKILL)) << "rank 0: " << job.how(0);
  EXPECT_EQ(res[1].status, ZPP_ERR_PEER_FAILED) << res[1].msg;
  EXPECT_TRUE(res[2].status == ZPP_ERR_TIMEOUT ||
              (res[2].status == ZPP_OK && res[2].map == "-1,-1,0,-1"))
      << res[2].status << " " << res[2].map << " " << res[2].msg;
  for (int i = 1; i <= 2; i++) {
    EXPECT_LT(res[i].t_shrunk - res[i].t_fail, 3 * kTimeout + 1.0) << i;
    std::printf("rank %d: status %d after %.3f s: %s\n", i, res[i].status,
                res[i].t_shrunk - res[i].t_fail, res[i].msg.c_str());
  }
}

// Rank 2's first connection to rank 0, the coordinator, fails on its side
// (no proof that rank 0 died), and rank 0 pauses between its DECIDE and its
// EXCLUDED: rank 2 must try rank 0 again instead of joining rank 1 or
// coordinating, and every survivor ends with the same members.
TEST(Shrink, FailedConnectIsNoProofOfDeath) {
  Scenario sc{4, nullptr, 3, When::Before};
  sc.cut = 2;
  sc.cut_times = 1;
  sc.pause_at = "decide-sent";
  run_scenario(sc, "3");
}

// Rank 2 never reaches rank 0: rank 0 and 1 decide without it once the
// join window ends, and rank 2 ends in a named error (EXCLUDED on rank 0's
// probe) instead of a communicator of its own.
TEST(Shrink, UnreachableCoordinatorLeavesTheRankOut) {
  Scenario sc{4, nullptr, 3, When::Before};
  sc.cut = 2;
  sc.cut_times = -1;
  sc.pause_at = "decide-sent";
  run_scenario(sc, "2");
}

// Nobody died: every rank calls shrink, and the new communicator holds
// them all, in order; the old one is aborted.
TEST(Shrink, WithoutAFailureKeepsEveryRank) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  Job job(3, [](int i, const Ctl &c) {
    Res res;
    zpp_comm_t comm = make_comm(i, 3, c, "0,1,1");
    c.ready();
    std::vector<int> map(3, -7);
    zpp_comm_t nc = nullptr;
    res.status = zpp_comm_shrink(comm, nullptr, map.data(), &nc);
    res.msg = zpp_get_last_error();
    if (res.status == ZPP_OK) {
      for (int r = 0; r < 3; r++)
        res.map += (r ? "," : "") + std::to_string(map[r]);
      zpp_comm_size(nc, &res.new_size);
      zpp_comm_nnodes(nc, &res.nnodes);
      std::string why;
      res.exact = exact_round(nc, {0, 1, 2}, 7, &why) == 0;
      if (!res.exact)
        res.msg = why;
      std::vector<float> x(4), y(12);
      res.coll_status = zpp_allgather(comm, x.data(), y.data(), 4, ZPP_FLOAT32,
                                      nullptr, nullptr);
      zpp_comm_destroy(nc);
    }
    zpp_comm_destroy(comm);
    return res;
  });
  ASSERT_TRUE(job.all_ready(20));
  std::vector<Res> res = job.finish(25);
  for (int i = 0; i < 3; i++) {
    SCOPED_TRACE("rank " + std::to_string(i));
    ASSERT_EQ(res[i].status, ZPP_OK) << res[i].msg;
    EXPECT_EQ(res[i].map, "0,1,2");
    EXPECT_EQ(res[i].new_size, 3);
    EXPECT_EQ(res[i].nnodes, 2);
    EXPECT_TRUE(res[i].exact) << res[i].msg;
    EXPECT_EQ(res[i].coll_status, ZPP_ERR_ABORTED);
  }
}

// A process forked from rank 1 after its communicator's creation (a data
// loader's worker) outlives rank 1's SIGKILL: rank 1's shrink listener
// must not live on in it, so that rank 0's probe is refused and rank 0
// decides at once instead of waiting out its join window (1.5 T).
TEST(Shrink, ForkedChildDoesNotKeepTheListener) {
  Job job(2, [](int i, const Ctl &c) {
    Res res;
    zpp_comm_t comm = make_comm(i, 2, c, nullptr);
    if (i == 1) {
      if (fork() == 0) {
        // keeps the listening sockets it inherited, nothing else (not the
        // test's output either: ctest would wait for it)
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++)
          dup2(null, fd);
        for (int fd = 3; fd < 1024; fd++) {
          int on = 0;
          socklen_t len = sizeof on;
          if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) != 0 || !on)
            close(fd);
        }
        sleep(8);
        _exit(0);
      }
      c.ready();
      pause(); // SIGKILLed by the parent
    }
    c.ready();
    c.wait_go();
    std::vector<int> map(2, -7);
    zpp_comm_t nc = nullptr;
    res.t_fail = mono_s();
    res.status = zpp_comm_shrink(comm, nullptr, map.data(), &nc);
    res.t_shrunk = mono_s();
    res.msg = res.status == ZPP_OK ? "" : zpp_get_last_error();
    res.map = std::to_string(map[0]) + "," + std::to_string(map[1]);
    if (res.status == ZPP_OK)
      zpp_comm_destroy(nc);
    zpp_comm_destroy(comm);
    return res;
  });
  ASSERT_TRUE(job.all_ready(20));
  job.kill_rank(1);
  job.go_one(0);
  std::vector<Res> res = job.finish(25);
  ASSERT_EQ(res[0].status, ZPP_OK) << res[0].msg;
  EXPECT_EQ(res[0].map, "0,-1");
  EXPECT_LT(res[0].t_shrunk - res[0].t_fail, 1.0)
      << "rank 1's listener outlived it in the forked process";
  std::printf("rank 0 shrank in %.3f s\n", res[0].t_shrunk - res[0].t_fail);
}

// ZPP_BOOTSTRAP_ADDR names the address this process is reached by: the
// shrink listener binds it (not every address), and shrinking works
// through it.
TEST(Shrink, ListenerBindsZppBootstrapAddr) {
  Job job(2, [](int i, const Ctl &c) {
    Res res;
    setenv("ZPP_BOOTSTRAP_ADDR", "127.0.0.2", 1);
    zpp_comm_t comm = make_comm(i, 2, c, nullptr), nc = nullptr;
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    char at[INET_ADDRSTRLEN] = "?";
    if (getsockname(zpp_rescue_fd(comm), (struct sockaddr *)&sa, &sl) == 0)
      inet_ntop(AF_INET, &sa.sin_addr, at, sizeof at);
    res.node_sizes = at;
    std::vector<int> map(2, -7);
    res.status = zpp_comm_shrink(comm, nullptr, map.data(), &nc);
    res.msg = res.status == ZPP_OK ? "" : zpp_get_last_error();
    res.map = std::to_string(map[0]) + "," + std::to_string(map[1]);
    if (res.status == ZPP_OK)
      zpp_comm_destroy(nc);
    zpp_comm_destroy(comm);
    return res;
  });
  std::vector<Res> res = job.finish(25);
  for (int i = 0; i < 2; i++) {
    SCOPED_TRACE("rank " + std::to_string(i));
    EXPECT_EQ(res[i].node_sizes, "127.0.0.2");
    ASSERT_EQ(res[i].status, ZPP_OK) << res[i].msg;
    EXPECT_EQ(res[i].map, "0,1");
  }
}

// Bad arguments: errors naming them, and the communicator untouched (this
// rank does not take part).  A communicator of one rank, whose shrink is
// itself; a second shrink of it is refused.
TEST(Shrink, BadArguments) {
  Job job(1, [](int i, const Ctl &c) {
    Res res;
    zpp_comm_t comm = make_comm(i, 1, c, nullptr), nc = nullptr;
    zpp_shrink_config_t cfg = ZPP_SHRINK_CONFIG_INIT;
    std::string errs;
    auto expect = [&](int got, int want, const char *text) {
      std::string m = got == ZPP_OK ? "" : zpp_get_last_error();
      if (got != want || m.find(text) == std::string::npos)
        errs += "[" + std::to_string(got) + " \"" + m + "\", want " +
                std::to_string(want) + " \"" + text + "\"] ";
    };
    expect(zpp_comm_shrink(nullptr, nullptr, nullptr, &nc),
           ZPP_ERR_NULL_POINTER, "zpp_comm_shrink: comm is NULL");
    expect(zpp_comm_shrink(comm, nullptr, nullptr, nullptr),
           ZPP_ERR_NULL_POINTER, "zpp_comm_shrink: newcomm is NULL");
    cfg.struct_size = 8;
    expect(zpp_comm_shrink(comm, &cfg, nullptr, &nc), ZPP_ERR_INVALID_ARGUMENT,
           "cfg->struct_size 8: must be sizeof(zpp_shrink_config_t)");
    cfg = ZPP_SHRINK_CONFIG_INIT;
    cfg.timeout_s = NAN;
    expect(zpp_comm_shrink(comm, &cfg, nullptr, &nc), ZPP_ERR_INVALID_ARGUMENT,
           "cfg->timeout_s is NaN");
    cfg = ZPP_SHRINK_CONFIG_INIT;
    cfg.timeout_s = 2;
    cfg.join_s = 2;
    expect(zpp_comm_shrink(comm, &cfg, nullptr, &nc), ZPP_ERR_INVALID_ARGUMENT,
           "cfg->join_s 2: must be less than the bound of the call, 2 s");
    // none of these touched the communicator
    std::vector<float> x(8), y(8);
    expect(zpp_allgather(comm, x.data(), y.data(), 8, ZPP_FLOAT32, nullptr,
                         nullptr),
           ZPP_OK, "");
    int map = -7;
    expect(zpp_comm_shrink(comm, nullptr, &map, &nc), ZPP_OK, "");
    if (map != 0)
      errs += "new_rank_of[0] " + std::to_string(map) + " ";
    zpp_comm_t again = nullptr;
    expect(zpp_comm_shrink(comm, nullptr, nullptr, &again),
           ZPP_ERR_INVALID_ARGUMENT, "zpp_comm_shrink was called on it before");
    zpp_comm_destroy(nc);
    zpp_comm_destroy(comm);
    res.status = errs.empty() ? 0 : -1;
    res.msg = errs;
    return res;
  });
  std::vector<Res> res = job.finish(25);
  EXPECT_EQ(res[0].status, 0) << res[0].msg;
}

// ---- the commit's error message (comm/shrink_report.h) -----------------

// Parses "0-4,6-63" (with a trailing "..." when cut) back into ranks.
std::vector<int> parse_ranges(const std::string &s, bool *cut) {
  std::vector<int> v;
  std::string t = s;
  *cut = t.size() >= 3 && t.compare(t.size() - 3, 3, "...") == 0;
  if (*cut)
    t.resize(t.size() - 3);
  std::stringstream in(t);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty())
      continue;
    size_t dash = item.find('-');
    int a = std::stoi(item.substr(0, dash));
    int b = dash == std::string::npos ? a : std::stoi(item.substr(dash + 1));
    for (int r = a; r <= b; r++)
      v.push_back(r);
  }
  return v;
}

TEST(ShrinkReport, RangesOfRandomSetsParseBack) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  std::mt19937_64 rng(seed());
  char fixed[64];
  const int six[] = {0, 1, 2, 3, 4, 6, 7, 8};
  zpp_shrink_ranges(six, 8, fixed, sizeof fixed);
  EXPECT_STREQ(fixed, "0-4,6-8");
  zpp_shrink_ranges(six, 0, fixed, sizeof fixed);
  EXPECT_STREQ(fixed, "none");
  for (int trial = 0; trial < 500; trial++) {
    int n = 1 + (int)(rng() % 300);
    std::vector<int> set;
    for (int r = 0; r < n; r++)
      if (rng() % 3 != 0)
        set.push_back(r);
    size_t len = 4 + rng() % 120;
    std::vector<char> buf(len, 'x');
    zpp_shrink_ranges(set.data(), (int)set.size(), buf.data(), len);
    std::string got(buf.data());
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + got);
    ASSERT_LT(got.size(), len);
    if (set.empty()) {
      EXPECT_EQ(got, "none");
      continue;
    }
    bool cut = false;
    std::vector<int> back = parse_ranges(got, &cut);
    if (!cut) {
      EXPECT_EQ(back, set);
      continue;
    }
    // a cut list is a prefix of the set, its last range whole
    ASSERT_LT(back.size(), set.size());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), set.begin()));
    if (!back.empty()) {
      EXPECT_NE(set[back.size()], back.back() + 1) << "a range was cut";
    }
  }
}

TEST(ShrinkReport, CreationRanksBecomeOldRanks) {
  const int mem[] = {0, 1, 2, 3, 4, 6, 7}; // old ranks of new ranks 0..6
  char out[512];
  zpp_shrink_old_ranks("zpp_comm_shrink: the root at 10.0.0.1:41000 did not "
                       "welcome rank 6 within 8.9 s",
                       mem, 7, out, sizeof out);
  EXPECT_STREQ(out, "zpp_comm_shrink: the root at 10.0.0.1:41000 did not "
                    "welcome old rank 7 within 8.9 s");
  zpp_shrink_old_ranks("bootstrap root at h:1: ranks 5, 6 never arrived; 5 of "
                       "7 ranks did; rank 5: x; a process claims rank 9; "
                       "old rank 3 and frank 2 stay",
                       mem, 7, out, sizeof out);
  EXPECT_STREQ(out, "bootstrap root at h:1: old ranks 6, 7 never arrived; 5 "
                    "of 7 ranks did; old rank 6: x; a process claims new "
                    "rank 9; old rank 3 and frank 2 stay");
  // cut: always terminated, marked
  char small[20];
  zpp_shrink_old_ranks("rank 1 and rank 2 and rank 3 and rank 4", mem, 7, small,
                       sizeof small);
  EXPECT_LT(std::strlen(small), sizeof small);
  EXPECT_EQ(std::string(small).substr(std::strlen(small) - 3), "...");
}

// 64 ranks, 8 of them gone, a long cause: the cause comes first and whole,
// both lists as ranges, and the whole fits the room.
TEST(ShrinkReport, CommitMessageKeepsTheCauseAndTheLists) {
  std::vector<int> mem, gone = {3, 9, 17, 25, 33, 41, 49, 57};
  for (int r = 0; r < 64; r++)
    mem.push_back(r);
  std::string cause = "bootstrap root at 10.0.0.1:41000: old rank 57 never "
                      "arrived at the bootstrap within 8.9 s";
  while (cause.size() < 220)
    cause += " (padding of a long cause)";
  char out[417]; // what zpp_comm_shrink leaves the message (shrink.c)
  zpp_shrink_commit_msg(cause.c_str(), gone.data(), 8, mem.data(), 64, out,
                        sizeof out);
  std::string m(out);
  EXPECT_LT(m.size(), sizeof out);
  EXPECT_EQ(m.compare(0, cause.size(), cause), 0) << m;
  EXPECT_NE(m.find("old ranks 3,9,17,25,33,41,49,57;"), std::string::npos) << m;
  EXPECT_NE(m.find("old ranks 0-63)"), std::string::npos) << m;
  // a cause too long for the room is cut, marked, and the lists stay
  std::string huge(1000, 'c');
  zpp_shrink_commit_msg(huge.c_str(), gone.data(), 8, mem.data(), 64, out,
                        sizeof out);
  m = out;
  EXPECT_LT(m.size(), sizeof out);
  EXPECT_NE(m.find("c... (a member failed"), std::string::npos) << m;
  EXPECT_NE(m.find("old ranks 0-63)"), std::string::npos) << m;
  zpp_shrink_commit_msg("x", nullptr, 0, mem.data(), 64, out, sizeof out);
  EXPECT_NE(std::string(out).find("comm: none proven;"), std::string::npos)
      << out;
}

} // namespace
