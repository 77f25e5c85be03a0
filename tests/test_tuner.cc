// ZPP_ALGO=auto (src/algo/tune.c): the cost model itself (its formulas at
// known constants, crossovers that move the right way, the tuner file's
// strict parser), and under mpirun (tests/tuner.cmake gives the layouts)
// that every rank makes the same choice, that each choice is what runs
// (the inter-node bytes of its family, docs/design.md "Transports") and
// gives the exact result, and that a tuner file's forced family is obeyed.
//
// ZPP_TEST_TUNER_EXPECT=hier|flat: every call where the hierarchical
// family applies must choose that (a tuner file forces it).
// ZPP_TEST_CREATE_CASE=<status>: creation must fail on every rank with
// that status (MISMATCH, IO, INVALID) and a message containing
// ZPP_TEST_CREATE_EXPECT (the launcher sets the settings per rank).
#include <gtest/gtest.h>
#include <mpi.h>
#include <zpp/zpp_mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "algo/tune.h"
#include "comm/comm.h"
#include "comm/comm_impl.h"
#include "xfer_blocking.h"

namespace {

int g_rank = 0, g_size = 1;
uint64_t g_seed = 20260104;
zpp_comm_t g_comm = nullptr;

// ---- the model --------------------------------------------------------------

zpp_tune_shape_t Shape(std::vector<int> sizes) {
  zpp_tune_shape_t s;
  zpp_tune_shape_of(sizes.data(), (int)sizes.size(), &s);
  return s;
}

TEST(Model, ShapeOfEvenAndUnevenNodes) {
  zpp_tune_shape_t s = Shape({4, 4});
  EXPECT_EQ(s.n, 8);
  EXPECT_EQ(s.nodes, 2);
  EXPECT_EQ(s.smax, 4);
  EXPECT_EQ(s.smin, 4);
  EXPECT_EQ(s.own_max, 2);  // local rank l of each node: the rail
  // 3 + 1: the node of one owns every member (l mod 1 = 0): 2 of local
  // rank 0, one each of 1 and 2
  s = Shape({3, 1});
  EXPECT_EQ(s.n, 4);
  EXPECT_EQ(s.smin, 1);
  EXPECT_EQ(s.own_max, 4);
  EXPECT_EQ(s.own_x, 3);
}

// The formulas of docs/design.md ("Choosing the algorithm") written out
// here once more, term by term, at constants where every term counts.
TEST(Model, PredictionsFollowTheDocumentedFormulas) {
  zpp_link_model_t m;
  zpp_tune_defaults(&m, 0);
  m.intra_lat_us = 2;
  m.intra_bw = 1000;
  m.inter_lat_us = 50;
  m.inter_bw = 100;
  m.round_us = 10;
  m.msg_us = 1;
  m.reduce_bw = 500;
  const zpp_tune_shape_t s = Shape({4, 4});
  const double n = 8, S = 4, M = 2, own = 2, b = 40000;
  zpp_tune_pick_t p;
  zpp_tune_predict(&m, &s, ZPP_TUNE_RS, b, 4, 4, 1, &p);
  double flat = 10 + 2 * (n - 1) * 1 +
                std::max(2 + (S - 1) * b / 1000, 50 + (n - S) * b / 100) +
                n * b / 500;
  EXPECT_NEAR(p.flat_us, flat, 1e-9 * flat);
  double best = 0;
  int bc = 0;
  for (int c = 1; c <= 8; c++) {
    double cs = b / c;
    double a = 2 + (S - 1) * own * cs / 1000, x = 50 + (M - 1) * cs / 100;
    double msgs = 2 * (S - 1) * own + (own - 1) + (M - 1);
    double comp = (S * own * cs + M * cs) / 500;
    double t = (c + 1) * 10 + c * msgs * 1 + a + x + (c - 1) * std::max(a, x) +
               c * comp;
    if (bc == 0 || t < best) best = t, bc = c;
  }
  EXPECT_NEAR(p.hier_us, best, 1e-9 * best);
  EXPECT_EQ(p.chunks, bc);
  EXPECT_EQ(p.hier, best < flat);
  // The ring all-gather: n - 1 rounds, a boundary rank sends across.
  zpp_tune_predict(&m, &s, ZPP_TUNE_AG, b, 1, 1, 1, &p);
  double ring = (n - 1) * (10 + 2 + std::max(50 + b / 100, 2 + b / 1000));
  EXPECT_NEAR(p.flat_us, ring, 1e-9 * ring);
}

TEST(Model, OneNodeOrOneRankPerNodeStaysFlat) {
  zpp_link_model_t m;
  zpp_tune_defaults(&m, 0);
  m.inter_bw = 1;  // a link so slow that the hierarchy would pay
  for (auto sizes : {std::vector<int>{4}, std::vector<int>{1, 1, 1, 1}}) {
    zpp_tune_shape_t s = Shape(sizes);
    zpp_tune_pick_t p;
    zpp_tune_predict(&m, &s, ZPP_TUNE_RS, 1 << 24, 2, 2, 1, &p);
    EXPECT_EQ(p.hier, 0);
    EXPECT_LT(p.hier_us, 0);
  }
}

// On one machine's shared memory (the emulated topology unshaped) the
// pairwise reduce-scatter moves the same bytes in one round as the
// hierarchical one in two with a second sum: flat at every size.  On a
// slow inter-node link the hierarchical one sends a quarter of the bytes
// across (2x4): hierarchical at large sizes, flat at small ones.
TEST(Model, PicksAtKnownConstants) {
  const zpp_tune_shape_t s = Shape({4, 4});
  zpp_link_model_t shm, slow;
  zpp_tune_defaults(&shm, 1);
  zpp_tune_defaults(&slow, 0);
  slow.inter_bw = 0.4 * 125;  // 0.4 Gbit/s per rank
  slow.inter_lat_us = 200;
  for (double b = 64; b <= 64.0 * (1 << 20); b *= 4) {
    zpp_tune_pick_t p;
    zpp_tune_predict(&shm, &s, ZPP_TUNE_RS, b, 2, 2, 1, &p);
    EXPECT_EQ(p.hier, 0) << "shared memory, shard of " << b << " bytes";
  }
  zpp_tune_pick_t p;
  zpp_tune_predict(&slow, &s, ZPP_TUNE_RS, 16 << 20, 2, 2, 1, &p);
  EXPECT_EQ(p.hier, 1);
  EXPECT_LT(p.hier_us * 2.5, p.flat_us);  // about 4x fewer bytes across
  zpp_tune_predict(&slow, &s, ZPP_TUNE_RS, 64, 2, 2, 1, &p);
  EXPECT_EQ(p.hier, 0);
  // fp16's partials travel in fp32: twice stage B's bytes
  zpp_tune_pick_t p16;
  zpp_tune_predict(&slow, &s, ZPP_TUNE_RS, 16 << 20, 2, 4, 1, &p16);
  zpp_tune_predict(&slow, &s, ZPP_TUNE_RS, 16 << 20, 2, 2, 1, &p);
  EXPECT_GT(p16.hier_us, p.hier_us);
}

// Smallest size at which the model picks hier (0: never up to 1 GiB).
double Crossover(const zpp_link_model_t &m, const zpp_tune_shape_t &s, int coll) {
  bool seen = false;
  double first = 0;
  for (double b = 16; b <= double(1 << 30); b *= 2) {
    zpp_tune_pick_t p;
    zpp_tune_predict(&m, &s, coll, b, 2, 2, 1, &p);
    if (p.hier && !seen) seen = true, first = b;
    // one crossover: once hierarchical, hierarchical at every larger size
    EXPECT_FALSE(seen && !p.hier) << "coll " << coll << " back to flat at " << b << " on "
                                    << s.n << " ranks, " << m.inter_bw / 125 << " Gbit/s";
  }
  return first;
}

TEST(Model, CrossoversAreMonotone) {
  // Equal nodes: the hierarchy sends fewer bytes across than the flat
  // families.  (3 + 1 nodes: the rank alone on its node receives 3 blocks
  // across either way, and the hierarchy only adds its intra-node stage.)
  for (auto sizes : {std::vector<int>{4, 4}, std::vector<int>{2, 2},
                     std::vector<int>{8, 8, 8, 8}}) {
    const zpp_tune_shape_t s = Shape(sizes);
    for (int coll : {ZPP_TUNE_AG, ZPP_TUNE_RS, ZPP_TUNE_AR}) {
      double prev = 0;
      bool any = false;
      // a slower inter-node link never moves the crossover to larger sizes
      // (links slower than the intra-node path: where the network is the
      // faster path, the hierarchy's extra intra-node bytes may cost more
      // than it saves at large sizes, and there is no single crossover)
      for (double gbit : {10.0, 3.2, 1.6, 0.4, 0.1}) {
        zpp_link_model_t m;
        zpp_tune_defaults(&m, 0);
        m.inter_bw = gbit * 125;
        m.inter_lat_us = 30;
        double x = Crossover(m, s, coll);
        if (any && prev > 0) {
          EXPECT_GT(x, 0) << "coll " << coll << " at " << gbit << " Gbit/s";
          EXPECT_LE(x, prev) << "coll " << coll << " at " << gbit << " Gbit/s";
        }
        if (x > 0) prev = x, any = true;
      }
      EXPECT_TRUE(any) << "coll " << coll << ": hierarchical on no link";
    }
  }
}

TEST(Model, ForcedChunksAreKept) {
  zpp_link_model_t m;
  zpp_tune_defaults(&m, 0);
  m.inter_bw = 50;
  m.chunks = 3;
  const zpp_tune_shape_t s = Shape({4, 4});
  zpp_tune_pick_t p;
  zpp_tune_predict(&m, &s, ZPP_TUNE_AR, 64 << 20, 2, 2, 1, &p);
  EXPECT_EQ(p.chunks, 3);
  EXPECT_EQ(p.chunks_ag, 3);
}

// docs/bench/collectives.md's rows (2x4 emulated on 2 cores: 8 ranks on
// one host of 2 cores, 16 MiB per rank bf16): at each link rate the model,
// from the constants creation starts from, picks the family measured
// faster.  all-gather: hier at 0.4 and 10 Gbit/s and unlimited;
// reduce-scatter of 2 MiB shards: hier at 0.4 Gbit/s (51.9 vs 173.5 ms),
// flat at 10 Gbit/s (20.8 vs 23.8 ms) and unlimited (18.3 vs 27.4 ms).
TEST(Model, EmulatedBenchRowsPickTheMeasuredFaster) {
  int sizes[2] = {4, 4};
  zpp_tune_shape_t s;
  zpp_tune_shape_of(sizes, 2, &s);
  const struct {
    double gbit;
    int ag_hier, rs_hier;
  } rows[] = {{0.4, 1, 1}, {10, 1, 0}, {0, 1, 0}};
  for (const auto &r : rows) {
    zpp_link_model_t m;
    zpp_tune_pick_t p;
    zpp_tune_start(&m, 1, r.gbit > 0, r.gbit, 0.0, 8, 2);
    EXPECT_EQ(m.cpu, 4.0);
    zpp_tune_predict(&m, &s, ZPP_TUNE_AG, 16777216.0, 1, 1, 1, &p);
    EXPECT_EQ(p.hier, r.ag_hier) << r.gbit << " Gbit/s all-gather: flat "
                                 << p.flat_us << " us, hier " << p.hier_us;
    zpp_tune_predict(&m, &s, ZPP_TUNE_RS, 2097152.0, 2, 2, 1, &p);
    EXPECT_EQ(p.hier, r.rs_hier) << r.gbit << " Gbit/s reduce-scatter: flat "
                                 << p.flat_us << " us, hier " << p.hier_us;
  }
}

// The median of every rank's measurements, NaN (not measured) skipped.
TEST(Model, AgreementIsTheMedian) {
  zpp_link_model_t def, all[4], out;
  double scratch[4];
  zpp_tune_defaults(&def, 0);
  for (int r = 0; r < 4; r++) {
    all[r] = def;
    all[r].inter_bw = 100.0 * (4 - r);  // 400, 300, 200, 100
    all[r].intra_bw = r == 1 ? NAN : 1000.0 + r;
  }
  all[2].inter_lat_us = NAN;
  all[3].inter_lat_us = NAN;
  all[0].inter_lat_us = 7;
  all[1].inter_lat_us = 9;
  zpp_tune_agree(all, 4, &def, scratch, &out);
  EXPECT_EQ(out.inter_bw, 200.0);  // the lower middle of 100..400
  EXPECT_EQ(out.intra_bw, 1002.0);
  EXPECT_EQ(out.inter_lat_us, 7.0);
  for (auto &a : all) a.inter_lat_us = NAN;
  zpp_tune_agree(all, 4, &def, scratch, &out);
  EXPECT_EQ(out.inter_lat_us, def.inter_lat_us);
}

// A rate the probe measured ran with every rank's probe at once, so it
// already holds the cores' and links' sharing: the model does not divide
// it by the ranks per core again (a default or a file's rate it does).
TEST(Model, MeasuredIntraRateIsNotDividedByRanksPerCore) {
  zpp_link_model_t m, u;
  zpp_tune_defaults(&m, 0);
  m.intra_bw = 500.0;
  m.inter_bw = 60.0;
  m.cpu = 4.0;
  u = m;
  u.intra_bw = m.intra_bw * m.cpu; // divided by cpu: m's measured rate
  m.measured = ZPP_TUNE_MEASURED_INTRA | ZPP_TUNE_MEASURED_INTER;
  zpp_tune_shape_t s = Shape({4, 4});
  for (int coll = 0; coll < 3; coll++)
    for (double b = 1024; b <= 16 << 20; b *= 8) {
      zpp_tune_pick_t pm, pu;
      zpp_tune_predict(&m, &s, coll, b, 2, 2, 1, &pm);
      zpp_tune_predict(&u, &s, coll, b, 2, 2, 1, &pu);
      EXPECT_DOUBLE_EQ(pm.flat_us, pu.flat_us) << coll << " " << b;
      EXPECT_DOUBLE_EQ(pm.hier_us, pu.hier_us) << coll << " " << b;
      EXPECT_EQ(pm.chunks, pu.chunks);
    }
  // not measured: the same rate is divided, so the prediction is slower
  zpp_link_model_t d = m;
  d.measured = 0;
  zpp_tune_pick_t pm, pd;
  zpp_tune_predict(&m, &s, ZPP_TUNE_RS, 1 << 20, 2, 2, 1, &pm);
  zpp_tune_predict(&d, &s, ZPP_TUNE_RS, 1 << 20, 2, 2, 1, &pd);
  EXPECT_GT(pd.hier_us, pm.hier_us);
}

// The probe's arithmetic against the formulas worked by hand: latency
// per round less K (O + 2m), at least 0.1 us; the rate from the
// difference of the two times, or its lower bound from half the large
// time where the large time is not at least twice the small one (the
// block too small to tell the rate); NaN for a ring of one, or for a
// time not measured.
TEST(Model, ProbeFitFollowsTheDocumentedFormulas) {
  zpp_link_model_t m;
  zpp_tune_defaults(&m, 0);
  m.round_us = 15;
  m.msg_us = 1.5;
  m.cpu = 4;
  double lat, bw;
  // n = 2: one round; 200 us small, 1000 us large of 131072 bytes
  zpp_tune_probe_fit(&m, 2, 200.0, 1000.0, 131072.0, &lat, &bw);
  EXPECT_DOUBLE_EQ(lat, 200.0 - 4 * (15 + 3));  // 128
  EXPECT_DOUBLE_EQ(bw, 131072.0 / 800.0);
  // n = 4: three rounds; cpu below 1 counts as 1
  m.cpu = 0.5;
  zpp_tune_probe_fit(&m, 4, 90.0, 3090.0, 131072.0, &lat, &bw);
  EXPECT_DOUBLE_EQ(lat, 30.0 - 18.0);
  EXPECT_DOUBLE_EQ(bw, 131072.0 * 3 / 3000.0);
  // latency floor
  zpp_tune_probe_fit(&m, 2, 5.0, 1000.0, 131072.0, &lat, &bw);
  EXPECT_DOUBLE_EQ(lat, 0.1);
  // the small run half the large one or more: the lower bound of the
  // rate, the large time halved
  zpp_tune_probe_fit(&m, 2, 500.0, 1000.0, 131072.0, &lat, &bw);
  EXPECT_DOUBLE_EQ(bw, 131072.0 / 500.0);
  zpp_tune_probe_fit(&m, 2, 900.0, 1000.0, 131072.0, &lat, &bw);
  EXPECT_DOUBLE_EQ(bw, 131072.0 / 500.0);
  EXPECT_FALSE(std::isnan(lat));
  zpp_tune_probe_fit(&m, 2, 499.0, 1000.0, 131072.0, &lat, &bw);
  EXPECT_DOUBLE_EQ(bw, 131072.0 / 501.0);
  // nothing to measure
  zpp_tune_probe_fit(&m, 1, 10.0, 100.0, 131072.0, &lat, &bw);
  EXPECT_TRUE(std::isnan(lat) && std::isnan(bw));
  zpp_tune_probe_fit(&m, 2, INFINITY, INFINITY, 131072.0, &lat, &bw);
  EXPECT_TRUE(std::isnan(lat) && std::isnan(bw));
  zpp_tune_probe_fit(&m, 2, 0.0, 100.0, 131072.0, &lat, &bw);
  EXPECT_TRUE(std::isnan(lat) && std::isnan(bw));
}

// The ranks that share a rank's cores: equal kernel ids (namespaces of
// one machine: different host keys, one kernel), the host key where a
// kernel id is unknown (0), and nothing across kernels.
TEST(Model, RanksOnAKernelCountTheMachineNotTheNode) {
  struct Rec {
    int32_t pad;
    uint64_t kernel;
    int64_t key;
  };
  // ranks 0-3: node A, 4-7: node B, one kernel 11; 8-9: kernel 22, keys
  // 8; 10-11: kernel unknown, key 10; 12: kernel unknown, key 8
  std::vector<Rec> r(13);
  for (int i = 0; i < 13; i++) {
    r[i].pad = -1;
    r[i].kernel = i < 8 ? 11 : i < 10 ? 22 : 0;
    r[i].key = i < 4 ? 0 : i < 8 ? 4 : i < 10 ? 8 : i < 12 ? 10 : 8;
  }
  auto count = [&](int me) {
    return zpp_comm_ranks_on_kernel(r.data(), sizeof(Rec), offsetof(Rec, kernel),
                                    offsetof(Rec, key), (int)r.size(), me);
  };
  EXPECT_EQ(count(0), 8);
  EXPECT_EQ(count(5), 8);
  EXPECT_EQ(count(8), 3);  // kernel 22 (8, 9), and 12 by key 8
  EXPECT_EQ(count(10), 2); // key 10
  EXPECT_EQ(count(12), 3); // key 8: 8, 9, 12
}

// A rate measured on any rank makes the agreed one measured (the median
// is over the measurements only); none measured: not measured.
TEST(Model, AgreementKeepsWhatWasMeasured) {
  zpp_link_model_t def, all[3], out;
  double scratch[3];
  zpp_tune_defaults(&def, 0);
  for (auto &a : all) a = def;
  zpp_tune_agree(all, 3, &def, scratch, &out);
  EXPECT_EQ(out.measured, 0);
  all[2].measured = ZPP_TUNE_MEASURED_INTER; // alone on its node: no intra
  all[1].measured = ZPP_TUNE_MEASURED_INTRA;
  zpp_tune_agree(all, 3, &def, scratch, &out);
  EXPECT_EQ(out.measured, ZPP_TUNE_MEASURED_INTRA | ZPP_TUNE_MEASURED_INTER);
}

// More ranks than any fixed buffer: the median over the caller's scratch,
// against a sort of the measured values (NaN skipped).
TEST(Model, AgreementOfManyRanksUsesTheScratch) {
  unsigned seed = (unsigned)std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(1.0, 1000.0);
  const int n = 257;
  std::vector<zpp_link_model_t> all(n);
  std::vector<double> scratch(n, -1.0), want;
  zpp_link_model_t def, out;
  zpp_tune_defaults(&def, 0);
  for (int r = 0; r < n; r++) {
    all[r] = def;
    all[r].inter_bw = rng() % 5 == 0 ? NAN : u(rng);
    if (!std::isnan(all[r].inter_bw))
      want.push_back(all[r].inter_bw);
  }
  std::sort(want.begin(), want.end());
  zpp_tune_agree(all.data(), n, &def, scratch.data(), &out);
  EXPECT_EQ(out.inter_bw, want[(want.size() - 1) / 2]);
  EXPECT_EQ(out.intra_bw, def.intra_bw);
}

// ---- the tuner file ---------------------------------------------------------

TEST(TunerFile, ParsesEveryKey) {
  zpp_link_model_t m;
  zpp_tune_defaults(&m, 1);
  const char *text =
      "# a cluster\n"
      "version = 1\n"
      "intra_lat_us = 1.5   # shared memory\n"
      "intra_gbit = 80\n"
      "\n"
      "  inter_lat_us=25\n"
      "inter_gbit = 1.6\n"
      "round_us = 12\n"
      "msg_us = 0.5\n"
      "reduce_gbit = 40\n"
      "shared_path = 0\n"
      "allgather = flat\n"
      "reduce_scatter = hier\n"
      "allreduce = auto\n"
      "hier_chunks = 4\n";
  ASSERT_EQ(zpp_tune_parse("t.txt", text, &m, "test"), ZPP_OK) << zpp_get_last_error();
  EXPECT_EQ(m.intra_lat_us, 1.5);
  EXPECT_EQ(m.intra_bw, 80 * 125.0);
  EXPECT_EQ(m.inter_lat_us, 25);
  EXPECT_EQ(m.inter_bw, 1.6 * 125.0);
  EXPECT_EQ(m.round_us, 12);
  EXPECT_EQ(m.msg_us, 0.5);
  EXPECT_EQ(m.reduce_bw, 40 * 125.0);
  EXPECT_EQ(m.shared_path, 0);
  EXPECT_EQ(m.force[ZPP_TUNE_AG], ZPP_ALGORITHM_FLAT);
  EXPECT_EQ(m.force[ZPP_TUNE_RS], ZPP_ALGORITHM_HIER);
  EXPECT_EQ(m.force[ZPP_TUNE_AR], 0);
  EXPECT_EQ(m.chunks, 4);
}

TEST(TunerFile, ErrorsNameTheLineAndTheKey) {
  const struct {
    const char *text, *want;
  } cases[] = {
      {"intra_gbit = 10\nbogus = 1\n", "t.txt line 2: unknown key \"bogus\""},
      {"inter_gbit = x\n", "line 1: key inter_gbit: \"x\" is not a number"},
      {"inter_gbit =\n", "line 1: key inter_gbit: \"\" is not a number"},
      {"inter_gbit = 1e999\n", "line 1: key inter_gbit"},
      {"inter_gbit = 0\n", "line 1: key inter_gbit: 0 must be > 0"},
      {"\n\nround_us = -1\n", "line 3: key round_us: -1 must be >= 0"},
      {"allgather = ring\n",
       "line 1: key allgather: \"ring\" must be auto, hier or flat"},
      {"hier_chunks = 9\n",
       "line 1: key hier_chunks: 9 must be an integer in [0, 8]"},
      {"hier_chunks = 2.5\n", "key hier_chunks"},
      {"version = 2\n", "line 1: key version: 2"},
      {"msg_us 3\n", "line 1: \"msg_us 3\": must be key = value"},
      {"msg_us = 1\nmsg_us = 2\n",
       "line 2: key msg_us: given twice (first on line 1)"},
      {"shared_path = yes\n",
       "line 1: key shared_path: \"yes\" must be 0 or 1"},
      {"inter_lat_us = 2e6\n",
       "line 1: key inter_lat_us: 2e6 must be in [0, 1e6]"},
      {"round_us = 1e300\n", "key round_us: 1e300 must be in [0, 1e6]"},
      {"inter_gbit = 1e-9\n", "key inter_gbit: 1e-9 must be in [1e-3, 1e6]"},
      {"reduce_gbit = 1e307\n",
       "key reduce_gbit: 1e307 must be in [1e-3, 1e6]"},
      {"intra_gbit = 1e-400\n", "key intra_gbit: \"1e-400\" is out of range"},
      {"ranks_per_core = 1e7\n", "key ranks_per_core: 1e7 must be in [0, 1e6]"},
  };
  for (const auto &c : cases) {
    zpp_link_model_t m;
    zpp_tune_defaults(&m, 0);
    EXPECT_EQ(zpp_tune_parse("t.txt", c.text, &m, "test"), ZPP_ERR_IO) << c.text;
    std::string msg = zpp_get_last_error();
    EXPECT_NE(msg.find(c.want), std::string::npos) << "got \"" << msg << "\", want \"" << c.want << "\"";
    EXPECT_NE(msg.find("ZPP_TUNER_FILE"), std::string::npos) << msg;
  }
  zpp_link_model_t m;
  uint64_t h = 0;
  EXPECT_EQ(zpp_tune_read_file("/nonexistent/zpp_tuner.txt", &m, &h, "test"), ZPP_ERR_IO);
  EXPECT_NE(std::string(zpp_get_last_error()).find("/nonexistent/zpp_tuner.txt"),
            std::string::npos);
}

// ---- every rank alike, and what runs ----------------------------------------

const char *Name(zpp_algorithm_t a) {
  return a == ZPP_ALGORITHM_HIER ? "hier" : a == ZPP_ALGORITHM_FLAT ? "flat" : "?";
}

struct Layout {
  int nodes = 1, smax = 1;
  std::vector<int> sizes;
  // the hierarchical family applies: several nodes, one of several ranks
  bool applies() const { return nodes > 1 && smax > 1; }
};

Layout GetLayout() {
  Layout l;
  zpp_comm_nnodes(g_comm, &l.nodes);
  for (int k = 0; k < l.nodes; k++) {
    int s = 0;
    zpp_comm_node_size(g_comm, k, &s);
    l.sizes.push_back(s);
    l.smax = std::max(l.smax, s);
  }
  return l;
}

const size_t kCounts[] = {1, 7, 1000, 4096, 65536};

// Creation (with the probe where it runs) leaves every counter at zero:
// the first Auto test, before any collective.
TEST(Auto, StatsAreZeroAfterCreation) {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  ASSERT_EQ(zpp_comm_get_stats(g_comm, &s), ZPP_OK);
  EXPECT_EQ(s.intra_bytes_sent, 0u);
  EXPECT_EQ(s.intra_bytes_recv, 0u);
  EXPECT_EQ(s.inter_bytes_sent, 0u);
  EXPECT_EQ(s.inter_bytes_recv, 0u);
  for (int g = 0; g < ZPP_NGROUPS; g++)
    EXPECT_EQ(s.calls[g], 0u) << "group " << g;
  EXPECT_EQ(s.emu_wait_s, 0.0);
}

// The ranks of MPI_COMM_WORLD on this rank's kernel (by boot id), as
// creation counts them for the ranks per core; -1: no boot id.
int RanksOnThisKernel() {
  char boot[64] = {0};
  if (FILE *f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (!std::fgets(boot, sizeof boot, f)) boot[0] = 0;
    std::fclose(f);
  }
  int have = boot[0] != 0, all_have = 0;
  MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::vector<char> all((size_t)g_size * sizeof boot);
  MPI_Allgather(boot, sizeof boot, MPI_CHAR, all.data(), sizeof boot, MPI_CHAR,
                MPI_COMM_WORLD);
  if (!all_have) return -1;
  int n = 0;
  for (int r = 0; r < g_size; r++)
    n += std::strncmp(&all[(size_t)r * sizeof boot], boot, sizeof boot) == 0;
  return n;
}

// The constants creation agrees on where nothing is measured (no probe:
// ZPP_TUNER_PROBE unset on an emulated topology, or 0), built here
// independently of the communicator: the start constants of 8 ranks on
// this machine, then the tuner file.  false: a probe ran (ZPP_TUNER_PROBE
// set, or real nodes without ZPP_TUNER_PROBE=0).
bool ExpectedModel(zpp_link_model_t *m) {
  const char *probe = std::getenv("ZPP_TUNER_PROBE");
  const char *topo = std::getenv("ZPP_TOPO");
  const char *file = std::getenv("ZPP_TUNER_FILE");
  bool emulated = topo && *topo, has_file = file && *file;
  std::string pr = probe && *probe ? probe : "auto";
  // the probe runs without a file where set to 1, or on real nodes (no
  // ZPP_TOPO) unless set to 0
  if (!has_file && (pr == "1" || (pr == "auto" && !emulated)))
    return false;
  auto num = [](const char *k) {
    const char *v = std::getenv(k);
    return v && *v ? std::strtod(v, nullptr) : 0.0;
  };
  double gbit = num("ZPP_EMU_INTER_GBIT"), lat = num("ZPP_EMU_INTER_LAT_US");
  int here = RanksOnThisKernel();
  zpp_tune_start(m, emulated, gbit > 0 || lat > 0, gbit, lat, here > 0 ? here : g_size,
                 (int)sysconf(_SC_NPROCESSORS_ONLN));
  uint64_t hash = 0;
  if (has_file) {
    EXPECT_EQ(zpp_tune_read_file(file, m, &hash, "test"), ZPP_OK);
  }
  return true;
}

extern "C" void zpp_test_comm_model(const struct zpp_comm *c,
                                    zpp_link_model_t *m); // tuner_whitebox.c

bool AlgoIsAuto() {
  zpp_algorithm_t al = ZPP_ALGORITHM_DEFAULT;
  return zpp_comm_algorithm(g_comm, &al) == ZPP_OK && al == ZPP_ALGORITHM_AUTO;
}

// The ranks per core count every rank on this kernel (the boot id), not
// on this host name or network namespace: nodes that are namespaces or
// containers of one machine share its cores (on the namespace cluster,
// 2 nodes x 4 ranks on 2 cores: 4).  The agreed value is the median of
// every rank's (the lower middle).
TEST(Auto, RanksPerCoreCountEveryRankOfThisKernel) {
  const char *file = std::getenv("ZPP_TUNER_FILE");
  if (file && *file) GTEST_SKIP() << "a tuner file may set ranks_per_core";
  if (!AlgoIsAuto()) GTEST_SKIP() << "no model without ZPP_ALGO=auto";
  int mine = RanksOnThisKernel();
  if (mine < 0) GTEST_SKIP() << "no boot id here";
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  double want = cores > 0 && mine > cores ? (double)mine / (double)cores : 1.0;
  std::vector<double> all(g_size);
  MPI_Allgather(&want, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  std::sort(all.begin(), all.end());
  zpp_link_model_t m;
  zpp_test_comm_model(g_comm, &m);
  EXPECT_DOUBLE_EQ(m.cpu, all[(g_size - 1) / 2])
      << mine << " ranks on this kernel, " << cores << " cores";
}

// Real links (the cluster suite sets ZPP_TEST_LINK_GBIT to each node's
// shaped rate): the probe measured the rate between nodes with every rank
// at once, so a rank's share of its node's link, not the link, and not
// what a tbf burst or a peer's head start lets one all-gather see.  The
// bound: twice the share (runs of four all-gathers are late by at most
// one peer's lead: at most 4/3 of the share), and at least a fifth of it.
TEST(Auto, ProbedRateBetweenNodesIsAShareOfTheLink) {
  const char *g = std::getenv("ZPP_TEST_LINK_GBIT");
  if (!(g && *g)) GTEST_SKIP() << "ZPP_TEST_LINK_GBIT not set";
  ASSERT_TRUE(AlgoIsAuto()) << "ZPP_TEST_LINK_GBIT needs ZPP_ALGO=auto";
  int me = 0, node = 0, ppn = 0, nodes = 0;
  ASSERT_EQ(zpp_comm_nnodes(g_comm, &nodes), ZPP_OK);
  ASSERT_EQ(zpp_comm_rank(g_comm, &me), ZPP_OK);
  ASSERT_EQ(zpp_comm_node_of(g_comm, me, &node), ZPP_OK);
  ASSERT_EQ(zpp_comm_node_size(g_comm, node, &ppn), ZPP_OK);
  ASSERT_GT(nodes, 1);
  zpp_link_model_t m;
  zpp_test_comm_model(g_comm, &m);
  double gbit = std::strtod(g, nullptr), got = m.inter_bw / 125.0;
  EXPECT_TRUE(m.measured & ZPP_TUNE_MEASURED_INTER);
  EXPECT_GT(got, 0.0);
  EXPECT_LE(got, 2.0 * gbit / ppn)
      << "per rank, " << ppn << " ranks share " << gbit << " Gbit/s";
  // a loaded machine slows the probe, never below a fifth of the share
  EXPECT_GE(got, 0.2 * gbit / ppn)
      << "per rank, " << ppn << " ranks share " << gbit << " Gbit/s";
}

extern "C" int zpp_test_comm_probe(const struct zpp_comm *c,
                                   zpp_link_model_t *m,
                                   int able); // tuner_whitebox.c

// The probe with one rank that cannot take part (it failed before, or
// has no buffer): that rank says so first and nobody times anything, so
// every rank returns at once with nothing measured, instead of waiting
// out the timeout in collectives that rank never enters.  Every rank
// able: the rates are measured (on more than one node).
TEST(Auto, ProbeWithARankThatCannotMeasuresNothingAndEndsEverywhere) {
  int nodes = 0;
  ASSERT_EQ(zpp_comm_nnodes(g_comm, &nodes), ZPP_OK);
  if (g_size < 2)
    GTEST_SKIP() << "one rank";
  for (int unable = -1; unable < std::min(g_size, 2); unable++) {
    zpp_link_model_t m;
    double t0 = MPI_Wtime();
    int st = zpp_test_comm_probe(g_comm, &m, g_rank != unable);
    double dt = MPI_Wtime() - t0;
    EXPECT_EQ(st, ZPP_OK) << zpp_get_last_error();
    if (unable >= 0) {
      EXPECT_EQ(m.measured, 0) << "rank " << unable << " could not probe";
      EXPECT_TRUE(std::isnan(m.inter_bw) && std::isnan(m.intra_bw));
      EXPECT_LT(dt, 5.0) << "waited for a rank that does not probe";
    } else if (nodes > 1) {
      EXPECT_NE(m.measured, 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST(Auto, EveryRankChoosesAlike) {
  zpp_algorithm_t al = ZPP_ALGORITHM_DEFAULT;
  ASSERT_EQ(zpp_comm_algorithm(g_comm, &al), ZPP_OK);
  const char *env = std::getenv("ZPP_ALGO");
  if (!env || !*env || std::string(env) == "auto") {
    EXPECT_EQ(al, ZPP_ALGORITHM_AUTO);
  }
  const char *expect = std::getenv("ZPP_TEST_TUNER_EXPECT");
  Layout l = GetLayout();
  std::vector<int> mine;
  zpp_link_model_t model;
  zpp_tune_shape_t shape;
  bool predict = ExpectedModel(&model) && !(expect && *expect) && l.applies();
  if (predict)
    zpp_tune_shape_of(l.sizes.data(), l.nodes, &shape);
  for (int coll = 0; coll < 3; coll++)
    for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16, ZPP_FLOAT16})
      for (size_t c = 1; c <= (size_t(1) << 26); c *= 4) {
        zpp_algorithm_t a = ZPP_ALGORITHM_DEFAULT;
        int chunks = -1;
        ASSERT_EQ(zpp_comm_choose_algorithm(g_comm, (zpp_algo_coll_t)coll, c, dt, &a, &chunks),
                  ZPP_OK)
            << zpp_get_last_error();
        ASSERT_TRUE(a == ZPP_ALGORITHM_HIER || a == ZPP_ALGORITHM_FLAT);
        if (!l.applies()) {
          EXPECT_EQ(a, ZPP_ALGORITHM_FLAT) << "one node or one rank per node";
        }
        if (a == ZPP_ALGORITHM_FLAT) {
          EXPECT_EQ(chunks, 0);
        } else {
          EXPECT_TRUE(chunks >= 1 && chunks <= 8) << chunks;
        }
        if (expect && *expect && l.applies()) {
          EXPECT_STREQ(Name(a), expect) << "coll " << coll << ", count " << c;
        }
        if (predict) { // the answer is the model's at the agreed constants
          zpp_tune_pick_t p;
          int es = (int)zpp_dtype_size(dt);
          if (const char *hc = std::getenv("ZPP_HIER_CHUNK"); hc && *hc) {
            // the count hier.c runs: of the block, shard or all-reduce shard
            size_t part = (coll == 2 ? (c + g_size - 1) / g_size : c) * es,
                   h = std::strtoull(hc, nullptr, 10);
            size_t k = h == 0 || part <= h ? 1 : (part + h - 1) / h;
            model.chunks = k > 8 ? 8 : (int)k;
          }
          zpp_tune_predict(
              &model, &shape, coll, (double)(c * es), coll == 0 ? 1 : es,
              dt == ZPP_FLOAT16 && coll != 0 ? 4 : (coll == 0 ? 1 : es), 1, &p);
          EXPECT_EQ(a, p.hier ? ZPP_ALGORITHM_HIER : ZPP_ALGORITHM_FLAT)
              << "coll " << coll << " dtype " << dt << " count " << c
              << ": flat " << p.flat_us << " us, hier " << p.hier_us;
          if (p.hier) {
            EXPECT_EQ(chunks, p.chunks) << "coll " << coll << " count " << c;
          }
        }
        mine.push_back((int)a * 16 + chunks);
      }
  std::vector<int> all(mine.size() * g_size);
  MPI_Allgather(mine.data(), (int)mine.size(), MPI_INT, all.data(), (int)mine.size(), MPI_INT,
                MPI_COMM_WORLD);
  int differ = 0;
  for (int r = 1; r < g_size; r++)
    for (size_t i = 0; i < mine.size(); i++)
      if (all[r * mine.size() + i] != all[i]) differ++;
  EXPECT_EQ(differ, 0) << "choices that differ from rank 0's";
  if (g_rank == 0) {
    std::printf("[ choice ] ");
    for (size_t i = 0; i < mine.size(); i += 7) std::printf("%s/%d ", Name((zpp_algorithm_t)(mine[i] / 16)), mine[i] % 16);
    std::printf("\n");
  }
}

extern "C" int zpp_test_op_hier_chunks(const zpp_xop_t *op); // tuner_whitebox.c

// White box: the chunks the hierarchical op runs (op->hc, read after it
// completed) are the ones zpp_comm_choose_algorithm answers (the model's
// unless ZPP_HIER_CHUNK is set), for the all-gather and the reduce-scatter.
TEST(Auto, TheOpRunsTheChosenChunks) {
  Layout l = GetLayout();
  if (!l.applies())
    GTEST_SKIP() << "one node or one rank per node";
  zpp_transport_t *t = g_comm->tr;
  int hier_seen = 0;
  for (size_t count = 4096; count <= (size_t(1) << 21); count *= 4) {
    for (int coll = 0; coll < 2; coll++) {
      zpp_algorithm_t a = ZPP_ALGORITHM_DEFAULT;
      int chunks = -1;
      ASSERT_EQ(zpp_comm_choose_algorithm(g_comm, (zpp_algo_coll_t)coll, count,
                                          ZPP_FLOAT32, &a, &chunks),
                ZPP_OK);
      std::vector<float> in(count * g_size, 1.0f), out(count * g_size);
      zpp_xop_t *op = nullptr;
      zpp_status_t st =
          coll == 0
              ? start_allgather(t, ZPP_GROUP_WORLD, in.data(), count * 4,
                                out.data(), ZPP_MEMORY_HOST, nullptr, &op)
              : start_reduce_scatter(t, ZPP_GROUP_WORLD, in.data(), out.data(),
                                     count, ZPP_FLOAT32, ZPP_REDUCE_SUM,
                                     ZPP_MEMORY_HOST, nullptr, &op);
      ASSERT_EQ(st, ZPP_OK) << zpp_get_last_error();
      ASSERT_EQ(xop_wait(t, op), ZPP_OK) << zpp_get_last_error();
      if (a == ZPP_ALGORITHM_HIER) {
        hier_seen++;
        EXPECT_EQ(zpp_test_op_hier_chunks(op), chunks)
            << "coll " << coll << ", count " << count;
      }
      zpp_xop_free(op);
    }
  }
  if (g_rank == 0)
    std::printf("[ chunks ] %d hierarchical calls checked\n", hier_seen);
}

uint64_t WorldSum(uint64_t v) {
  uint64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

uint64_t InterSent() {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  zpp_comm_get_stats(g_comm, &s);
  return s.inter_bytes_sent;
}

uint16_t ToBf16(float f) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Integer values in [-8, 8]: every partial and total sum is an integer of
// at most 8 * 8 * 8 in magnitude, exact in fp32 and bf16 (8 bits of
// mantissa: integers up to 256), so each algorithm's result equals the
// int64 reference bit for bit, whatever the order of its additions.
int Value(uint64_t seed, int rank, size_t i) {  // splitmix64 of the triple
  uint64_t z = seed ^ (uint64_t(rank) * 0x9E3779B97F4A7C15ull) ^ (i * 0xD1B54A32D192ED03ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (int)((z ^ (z >> 31)) % 17) - 8;
}

TEST(Auto, EveryChoiceRunsAndIsExact) {
  zpp_transport_t *t = zpp_comm_transport(g_comm);
  Layout l = GetLayout();
  const uint64_t n = (uint64_t)g_size, M = (uint64_t)l.nodes;
  uint64_t sq = 0;
  for (int s : l.sizes) sq += (uint64_t)s * (uint64_t)s;
  for (size_t count : kCounts) {
    for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_BFLOAT16}) {
      const size_t es = zpp_dtype_size(dt);
      const uint64_t seed = g_seed + count * 31 + (uint64_t)dt;
      auto store = [&](std::vector<char> &buf, size_t i, int v) {
        if (dt == ZPP_FLOAT32) {
          float f = (float)v;
          std::memcpy(buf.data() + i * 4, &f, 4);
        } else {
          uint16_t h = ToBf16((float)v);
          std::memcpy(buf.data() + i * 2, &h, 2);
        }
      };
      auto load = [&](const std::vector<char> &buf, size_t i) {
        if (dt == ZPP_FLOAT32) {
          float f;
          std::memcpy(&f, buf.data() + i * 4, 4);
          return (double)f;
        }
        uint16_t h;
        std::memcpy(&h, buf.data() + i * 2, 2);
        return (double)FromBf16(h);
      };
      // reduce-scatter: shard of `count` elements of each rank
      std::vector<char> in(n * count * es), out(count * es, 0x7f);
      for (size_t i = 0; i < n * count; i++) store(in, i, Value(seed, g_rank, i));
      zpp_algorithm_t a;
      ASSERT_EQ(zpp_comm_choose_algorithm(g_comm, ZPP_ALGO_COLL_REDUCE_SCATTER, count, dt, &a,
                                          nullptr),
                ZPP_OK);
      uint64_t before = InterSent();
      ASSERT_EQ(blocking_reduce_scatter(t, ZPP_GROUP_WORLD, in.data(), out.data(), count, dt,
                                        ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr),
                ZPP_OK)
          << zpp_get_last_error();
      uint64_t inter = WorldSum(InterSent() - before);
      size_t wrong = 0;
      for (size_t i = 0; i < count; i++) {
        int64_t want = 0;
        for (int r = 0; r < g_size; r++) want += Value(seed, r, (size_t)g_rank * count + i);
        if (load(out, i) != (double)want) wrong++;
      }
      EXPECT_EQ(wrong, 0u) << "reduce-scatter " << Name(a) << ", count " << count << ", dtype "
                           << zpp_dtype_name(dt) << ", ZPP_TEST_SEED=" << g_seed;
      // the family that ran, by its bytes across (world totals)
      uint64_t cd = count * es;
      uint64_t want_inter = l.nodes == 1               ? 0
                            : a == ZPP_ALGORITHM_HIER ? n * (M - 1) * cd
                                                      : cd * (n * n - sq);
      EXPECT_EQ(inter, want_inter) << "reduce-scatter chose " << Name(a) << ", count " << count;

      // all-gather of `count` elements
      std::vector<char> blk(count * es), all(n * count * es, 0x7f);
      for (size_t i = 0; i < count; i++) store(blk, i, Value(seed + 1, g_rank, i));
      ASSERT_EQ(zpp_comm_choose_algorithm(g_comm, ZPP_ALGO_COLL_ALLGATHER, count, dt, &a, nullptr),
                ZPP_OK);
      before = InterSent();
      ASSERT_EQ(blocking_allgather(t, ZPP_GROUP_WORLD, blk.data(), count * es, all.data(),
                                   ZPP_MEMORY_HOST, nullptr),
                ZPP_OK)
          << zpp_get_last_error();
      inter = WorldSum(InterSent() - before);
      wrong = 0;
      for (int r = 0; r < g_size; r++)
        for (size_t i = 0; i < count; i++)
          if (load(all, (size_t)r * count + i) != (double)Value(seed + 1, r, i)) wrong++;
      EXPECT_EQ(wrong, 0u) << "all-gather " << Name(a) << ", count " << count
                           << ", ZPP_TEST_SEED=" << g_seed;
      want_inter = l.nodes == 1 ? 0 : a == ZPP_ALGORITHM_HIER ? n * (M - 1) * cd : (n - 1) * cd * M;
      EXPECT_EQ(inter, want_inter) << "all-gather chose " << Name(a) << ", count " << count;

      // all-reduce of n * count elements (+ 1: uneven shards)
      size_t total = n * count + 1;
      std::vector<char> ain(total * es), aout(total * es, 0x7f);
      for (size_t i = 0; i < total; i++) store(ain, i, Value(seed + 2, g_rank, i));
      ASSERT_EQ(zpp_comm_choose_algorithm(g_comm, ZPP_ALGO_COLL_ALLREDUCE, total, dt, &a, nullptr),
                ZPP_OK);
      ASSERT_EQ(blocking_allreduce(t, ZPP_GROUP_WORLD, ain.data(), aout.data(), total, dt,
                                   ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr),
                ZPP_OK)
          << zpp_get_last_error();
      wrong = 0;
      for (size_t i = 0; i < total; i++) {
        int64_t want = 0;
        for (int r = 0; r < g_size; r++) want += Value(seed + 2, r, i);
        if (load(aout, i) != (double)want) wrong++;
      }
      EXPECT_EQ(wrong, 0u) << "all-reduce " << Name(a) << ", count " << total
                           << ", ZPP_TEST_SEED=" << g_seed;
    }
  }
}

// ---- creation that must fail on every rank ----------------------------------

int CreateCase(const char *which) {
  const char *want = std::getenv("ZPP_TEST_CREATE_EXPECT");
  std::string w = which;
  zpp_status_t code = w == "MISMATCH" ? ZPP_ERR_MISMATCH
                      : w == "IO"     ? ZPP_ERR_IO
                      : w == "INVALID" ? ZPP_ERR_INVALID_ARGUMENT
                                       : ZPP_OK;
  if (code == ZPP_OK || want == nullptr) {
    std::fprintf(stderr, "[rank %d] ZPP_TEST_CREATE_CASE=%s: must be MISMATCH, IO or INVALID, "
                 "with ZPP_TEST_CREATE_EXPECT set\n", g_rank, which);
    return 1;
  }
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 10;
  zpp_comm_t c = nullptr;
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  std::string msg = zpp_get_last_error();
  int bad = st != code || c != nullptr || msg.find(want) == std::string::npos;
  if (bad)
    std::fprintf(stderr, "[rank %d] %s: status %d (want %d), message \"%s\" (want \"%s\")\n",
                 g_rank, which, (int)st, (int)code, msg.c_str(), want);
  if (c != nullptr) zpp_comm_destroy(c);
  return bad;
}

class RankPrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", g_rank,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
};

}  // namespace

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  ::testing::InitGoogleTest(&argc, argv);
  if (const char *s = std::getenv("ZPP_TEST_SEED")) g_seed = std::strtoull(s, nullptr, 10);
  if (g_rank != 0) {
    auto &l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
    l.Append(new RankPrinter);
  }
  if (const char *c = std::getenv("ZPP_TEST_CREATE_CASE"); c && *c) {
    int bad = CreateCase(c), any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0) std::printf("%s ZPP_TEST_CREATE_CASE=%s\n", any ? "FAILED" : "PASSED", c);
    MPI_Finalize();
    return any;
  }
  if (g_rank == 0) {
    const char *t = std::getenv("ZPP_TOPO");
    std::printf("[ seed ] ZPP_TEST_SEED=%llu; %d ranks; ZPP_TOPO=%s\n",
                (unsigned long long)g_seed, g_size, t ? t : "");
  }
  int failed = 1;
  if (zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, &g_comm) != ZPP_OK) {
    std::fprintf(stderr, "[rank %d] zpp_comm_create_mpi: %s\n", g_rank, zpp_get_last_error());
  } else {
    failed = RUN_ALL_TESTS() != 0;
    zpp_comm_destroy(g_comm);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0 && any) std::printf("FAILED on at least one rank\n");
  MPI_Finalize();
  return any;
}
