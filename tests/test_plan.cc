// Tests of the zpp-plan tool, run as a user would (--format json), against
// numbers computed by hand here, with the arithmetic written out: the ZeRO
// paper's 7.5B / 64-rank memory example, a small case whose byte formulas
// (docs/collectives.md, docs/design.md "Transports") and alpha-beta times
// are worked through term by term, and bad input.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct ToolRun {
  int status;
  std::string out;
};

ToolRun run(const std::string &args, bool with_stderr = true) {
  ToolRun r{-1, ""};
  std::string cmd = std::string(ZPP_PLAN_BIN) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE *p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The number after "key": inside the object of `stage` (the text between
// "stage": and the next top-level stage key).  NaN when absent.
double field(const std::string &json, const std::string &stage, const std::string &key) {
  static const char *const kStages[] = {"\"inputs\":", "\"dp\":", "\"zero1\":", "\"zero2\":",
                                        "\"zero3\":", "\"zeropp\":"};
  size_t begin = json.find("\"" + stage + "\":");
  if (begin == std::string::npos) return NAN;
  size_t end = json.size();
  for (const char *s : kStages) {
    size_t at = json.find(s, begin + 1);
    if (at != std::string::npos && at < end) end = at;
  }
  size_t at = json.find("\"" + key + "\":", begin);
  if (at == std::string::npos || at >= end) return NAN;
  return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

}  // namespace

// ZeRO paper (Rajbhandari et al. 2020), Figure 1: PSI = 7.5B, N = 64, K = 12.
TEST(Plan, MemoryMatchesTheZeroPaperExample) {
  ToolRun r = run("--params 7.5B --ranks 64 --ranks-per-node 8 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  const double psi = 7.5e9;
  // dp: (2 + 2 + 12) * 7.5e9 = 120e9
  EXPECT_EQ(field(r.out, "dp", "model_state_bytes"), 120e9);
  // zero1: 4 * 7.5e9 + 12 * 7.5e9 / 64 = 30e9 + 1.40625e9 = 31.40625e9 (31.4 GB)
  EXPECT_EQ(field(r.out, "zero1", "model_state_bytes"), 31.40625e9);
  // zero2: 2 * 7.5e9 + 14 * 7.5e9 / 64 = 15e9 + 1.640625e9 = 16.640625e9 (16.6 GB)
  EXPECT_EQ(field(r.out, "zero2", "model_state_bytes"), 16.640625e9);
  // zero3: 16 * 7.5e9 / 64 = 1.875e9 (1.9 GB)
  EXPECT_EQ(field(r.out, "zero3", "model_state_bytes"), 1.875e9);
  // zeropp: + M = 8 INT8 shards of c = 117187500 elements, block 256:
  // ceil(117187500 / 256) = 457764 scales (457763 * 256 = 117187328 < c),
  // E8 = 117187500 + 4 * 457764 = 119018556; 8 * E8 = 952148448.
  EXPECT_EQ(field(r.out, "zeropp", "model_state_bytes"), 1.875e9 + 952148448.0);
  EXPECT_EQ(field(r.out, "zeropp", "hpz_secondary_bytes"), 952148448.0);
  // The paper's idealised per-rank volumes: 2M, 3M, 0.75M with M = 2 PSI.
  EXPECT_EQ(field(r.out, "dp", "paper_bytes_per_step"), 2 * 2 * psi);
  EXPECT_EQ(field(r.out, "zero3", "paper_bytes_per_step"), 3 * 2 * psi);
  EXPECT_EQ(field(r.out, "zeropp", "paper_bytes_per_step"), 0.75 * 2 * psi);
}

// PSI = 1M, N = 8, S = 4 (M = 2 nodes), K = 12, block 256.
//   c = 1e6 / 8 = 125000 elements per shard, bf16 shard B = 250000 bytes.
//   nb = ceil(125000 / 256) = 489 blocks (488 * 256 = 124928, tail 72).
//   E8(c) = 125000 + 4 * 489 = 126956.
//   E4(c) = 4 * 489 + 488 * 128 + ceil(72 / 2) = 1956 + 62464 + 36 = 64456.
// Ring all-gather of B bytes: each rank sends 7 B; the world total crosses
// the network M times, so per rank (total / N): inter 7 B / 4, intra
// 7 B * 3 / 4.  Pairwise reduce-scatter: intra 3 * B, inter 4 * B.
// --algo flat: the ring all-gather and the pairwise reduce-scatter.
TEST(Plan, SmallCaseBytesByHand) {
  ToolRun r = run("--params 1M --ranks 8 --ranks-per-node 4 --algo flat --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  const double B = 250000, e8 = 126956, e4 = 64456;
  const double ag_inter = 7 * B / 4, ag_intra = 7 * B * 3 / 4;  // 437500, 1312500
  const double rs_intra = 3 * B, rs_inter = 4 * B;              // 750000, 1000000
  EXPECT_EQ(field(r.out, "inputs", "shard_elements"), 125000);

  // Memory: dp 16e6; zero1 4e6 + 12 * 125000; zero2 2e6 + 14 * 125000;
  // zero3 16 * 125000; zeropp + 2 * E8.
  EXPECT_EQ(field(r.out, "dp", "model_state_bytes"), 16e6);
  EXPECT_EQ(field(r.out, "zero1", "model_state_bytes"), 5.5e6);
  EXPECT_EQ(field(r.out, "zero2", "model_state_bytes"), 3.75e6);
  EXPECT_EQ(field(r.out, "zero3", "model_state_bytes"), 2e6);
  EXPECT_EQ(field(r.out, "zeropp", "model_state_bytes"), 2e6 + 2 * e8);  // 2253912

  // dp, zero1, zero2: reduce-scatter + all-gather.
  for (const char *st : {"dp", "zero1", "zero2"}) {
    EXPECT_EQ(field(r.out, st, "intra_bytes_per_step"), rs_intra + ag_intra) << st;  // 2062500
    EXPECT_EQ(field(r.out, st, "inter_bytes_per_step"), rs_inter + ag_inter) << st;  // 1437500
  }
  // zero3: two all-gathers and a reduce-scatter.
  EXPECT_EQ(field(r.out, "zero3", "intra_bytes_per_step"), 2 * ag_intra + rs_intra);  // 3375000
  EXPECT_EQ(field(r.out, "zero3", "inter_bytes_per_step"), 2 * ag_inter + rs_inter);  // 1875000
  // The busiest rank (last of its node) sends the whole ring across: 7 B.
  EXPECT_EQ(field(r.out, "zero3", "inter_bytes_per_step_max"), 2 * 7 * B + rs_inter);

  // zeropp: qwZ all-gather of E8 (inter 7 * 126956 / 4 = 222173, intra
  // 7 * 126956 * 3 / 4 = 666519), hpZ backward gather inside the node
  // (3 * 2 * E8 = 761736, no inter), qgZ INT4 (intra 3 * 2 * E4 = 386736,
  // inter 1 * E4 = 64456).
  EXPECT_EQ(7 * e8 / 4, 222173.0);
  EXPECT_EQ(field(r.out, "zeropp", "intra_bytes_per_step"),
            7 * e8 * 3 / 4 + 3 * 2 * e8 + 3 * 2 * e4);  // 666519 + 761736 + 386736
  EXPECT_EQ(field(r.out, "zeropp", "inter_bytes_per_step"), 7 * e8 / 4 + 1 * e4);  // 286629
}

// bf16 hpZ copy: M * 2c = 2 * 250000 bytes in memory and in the backward gather.
TEST(Plan, Bf16SecondaryCopy) {
  ToolRun r = run("--params 1M --ranks 8 --ranks-per-node 4 --hpz-bits 16 --algo flat --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "zeropp", "model_state_bytes"), 2e6 + 2 * 250000.0);
  // intra: qwZ 666519 + hpZ 3 * 2 * 250000 + qgZ 386736
  EXPECT_EQ(field(r.out, "zeropp", "intra_bytes_per_step"), 666519 + 1500000 + 386736.0);
}

// Alpha-beta, small case: intra 8 Gbit/s = 1e9 B/s, 10 us; inter
// 0.8 Gbit/s = 1e8 B/s, 100 us.
//   ring all-gather of B: 7 rounds, each the slower class:
//     max(10e-6 + B / 1e9, 100e-6 + B / 1e8)
//   zero3: 2 * 7 * (100e-6 + 250000 / 1e8) = 2 * 7 * 2.6e-3 = 36.4e-3
//        + reduce-scatter max(10e-6 + 750000 / 1e9, 100e-6 + 1e6 / 1e8)
//          = 10.1e-3                                     -> 46.5e-3 s
//   zeropp: qwZ 7 * (100e-6 + 126956 / 1e8) = 7 * 1.36956e-3 = 9.58692e-3
//         + hpZ 3 * (10e-6 + 253912 / 1e9) = 3 * 263.912e-6 = 0.791736e-3
//         + qgZ (10e-6 + 386736 / 1e9) + (100e-6 + 64456 / 1e8)
//           = 396.736e-6 + 744.56e-6 = 1.141296e-3    -> 11.519952e-3 s
TEST(Plan, AlphaBetaTimesByHand) {
  ToolRun r = run("--params 1M --ranks 8 --ranks-per-node 4 --intra-gbps 8 --inter-gbps 0.8 "
                  "--intra-lat-us 10 --inter-lat-us 100 --algo flat --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  // Printed with 9 significant digits: relative 1e-8 covers the rounding.
  EXPECT_NEAR(field(r.out, "zero3", "comm_time_s_per_step"), 46.5e-3, 46.5e-3 * 1e-8);
  EXPECT_NEAR(field(r.out, "zeropp", "comm_time_s_per_step"), 11.519952e-3, 11.519952e-3 * 1e-8);
}

// The default, --algo hier: every rank sends (M - 1) B across per all-gather
// and (M - 1) 2c per reduce-scatter, (S - 1) M of them inside the node.
// 2 nodes of 4, c = 125000, B = 250000: all-gather inter 250000, intra
// 3 * 2 * 250000 = 1500000; the reduce-scatter the same.  Alpha-beta: one
// step per class, the slower class: max(10e-6 + 1.5e6 / 1e9,
// 100e-6 + 250000 / 1e8) = 2.6e-3 per collective.
TEST(Plan, SmallCaseHierarchicalBytesByHand) {
  ToolRun r = run("--params 1M --ranks 8 --ranks-per-node 4 --intra-gbps 8 --inter-gbps 0.8 "
                  "--intra-lat-us 10 --inter-lat-us 100 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"algo\": \"hier\""), std::string::npos) << r.out;
  const double B = 250000, e8 = 126956, e4 = 64456;
  for (const char *st : {"dp", "zero1", "zero2"}) {
    EXPECT_EQ(field(r.out, st, "inter_bytes_per_step"), 2 * B) << st;
    EXPECT_EQ(field(r.out, st, "intra_bytes_per_step"), 2 * 6 * B) << st;
  }
  EXPECT_EQ(field(r.out, "zero3", "inter_bytes_per_step"), 3 * B);
  EXPECT_EQ(field(r.out, "zero3", "inter_bytes_per_step_max"), 3 * B);
  EXPECT_EQ(field(r.out, "zero3", "intra_bytes_per_step"), 3 * 6 * B);
  EXPECT_NEAR(field(r.out, "zero3", "comm_time_s_per_step"), 3 * 2.6e-3, 7.8e-3 * 1e-8);
  // zeropp: qwZ is the hierarchical all-gather of E8 (inter 1 * E8, intra
  // 3 * 2 * E8), hpZ backward (3 * 2 * E8 inside), qgZ INT4 as before.
  EXPECT_EQ(field(r.out, "zeropp", "inter_bytes_per_step"), e8 + e4);
  EXPECT_EQ(field(r.out, "zeropp", "intra_bytes_per_step"), 6 * e8 + 6 * e8 + 6 * e4);
  EXPECT_EQ(run("--params 1M --ranks 8 --algo ring").status, 2);
}

// One node: the ring never leaves it, qgZ runs its intra stage only.
TEST(Plan, OneNodeHasNoInterNodeBytes) {
  ToolRun r = run("--params 1M --ranks 8 --ranks-per-node 8 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char *st : {"dp", "zero1", "zero2", "zero3", "zeropp"})
    EXPECT_EQ(field(r.out, st, "inter_bytes_per_step"), 0) << st;
  // zero3: 2 * 7 * 250000 + 7 * 250000 = 5250000 bytes inside the node.
  EXPECT_EQ(field(r.out, "zero3", "intra_bytes_per_step"), 5250000);
}

TEST(Plan, TableAndHelp) {
  ToolRun r = run("--params 7B --ranks 16", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("zeropp"), std::string::npos) << r.out;
  r = run("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--ranks-per-node"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("alpha-beta"), std::string::npos) << r.out;
}

TEST(Plan, BadInputExits2NamingTheFlag) {
  struct Case {
    const char *args, *flag;
  } cases[] = {
      {"--params 1M --ranks 8 --ranks-per-node 3", "--ranks-per-node"},
      {"--params 1.5 --ranks 8", "--params"},
      {"--params 7X --ranks 8", "--params"},
      {"--params 0 --ranks 8", "--params"},
      {"--params -5 --ranks 8", "--params"},
      {"--ranks 8", "--params"},
      {"--params 1M", "--ranks"},
      {"--params 1M --ranks 0", "--ranks"},
      {"--params 1M --ranks 8x", "--ranks"},
      {"--params 1M --ranks 8 --k -1", "--k"},
      {"--params 1M --ranks 8 --block 0", "--block"},
      {"--params 1M --ranks 8 --hpz-bits 4", "--hpz-bits"},
      {"--params 1M --ranks 8 --inter-gbps 0", "--inter-gbps"},
      {"--params 1M --ranks 8 --intra-lat-us -1", "--intra-lat-us"},
      {"--params 1M --ranks 8 --format xml", "--format"},
      {"--params 1M --ranks 8 --bogus 1", "--bogus"},
      {"--params 1M --ranks", "--ranks"},
  };
  for (const Case &c : cases) {
    ToolRun r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.flag), std::string::npos) << c.args << ": " << r.out;
  }
}

// The transforms (error feedback, qWD), the same small case (c = 125000, N = 8, M = 2, block 256):
//   --ef 32: residual 4 (N + M) c = 4 * 10 * 125000 = 5000000 bytes;
//   --ef 8:  (N + M) E8(c), E8 = 125000 + 4 * 489 = 126956: 1269560 bytes;
//            both added to zeropp's model state;
//   --qwd 4 (block 2048): E4(c) = ceil(c/2048) = 62 scales (61 * 2048 =
//            124928, tail 72): 62 * 4 + 61 * 1024 + 36 = 62748 bytes, moved
//            by zero1/zero2's all-gather instead of B = 250000; inter-node
//            per rank (world total / N) (N - 1) E / S = 7 * 62748 / 4 =
//            109809; scratch per update N E + 4 c = 501984 + 500000.
TEST(Plan, ErrorFeedbackResidualAndQwdByHand) {
  ToolRun r = run("--params 1M --ranks 8 --ranks-per-node 4 --ef 32 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "zeropp", "residual_bytes"), 5000000.0);
  EXPECT_EQ(field(r.out, "zeropp", "model_state_bytes"),
            field(r.out, "zero3", "model_state_bytes") +
                field(r.out, "zeropp", "hpz_secondary_bytes") + 5000000.0);
  r = run("--params 1M --ranks 8 --ranks-per-node 4 --ef 8 --qwd 4 --algo flat --format json",
          false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "zeropp", "residual_bytes"), 1269560.0);
  EXPECT_EQ(field(r.out, "zero2", "qwd_scratch_bytes"), 8 * 62748.0 + 500000.0);
  EXPECT_EQ(field(r.out, "zero2", "model_state_bytes"),
            field(r.out, "zero2", "param_bytes") + field(r.out, "zero2", "grad_bytes") +
                field(r.out, "zero2", "optimizer_bytes"));
  // zero2's inter-node bytes: the pairwise reduce-scatter (N - S) 2c =
  // 4 * 250000 = 1000000 plus the qWD ring all-gather 109809
  EXPECT_EQ(field(r.out, "zero2", "inter_bytes_per_step"), 1000000.0 + 109809.0);
  // hierarchical (the default): (M - 1) 2c = 250000 plus (M - 1) E = 62748
  r = run("--params 1M --ranks 8 --ranks-per-node 4 --ef 8 --qwd 4 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "zero2", "inter_bytes_per_step"), 250000.0 + 62748.0);
  // one node (N = S = 8, M = 1): qgZ has no second stage, so the residual
  // holds the N stage-1 segments only (zpp_qgz_residual_bytes): 4 N c =
  // 4 * 8 * 125000 = 4000000 bytes, INT8 N E8(c) = 8 * 126956 = 1015648
  r = run("--params 1M --ranks 8 --ranks-per-node 8 --ef 32 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "zeropp", "residual_bytes"), 4000000.0);
  r = run("--params 1M --ranks 8 --ranks-per-node 8 --ef 8 --format json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(field(r.out, "zeropp", "residual_bytes"), 1015648.0);
  EXPECT_EQ(run("--params 1M --ranks 8 --ef 16").status, 2);
  EXPECT_EQ(run("--params 1M --ranks 8 --qwd 2").status, 2);
}
