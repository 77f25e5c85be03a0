// Tests of the zpp-topo tool, run as a user would: the offline map of a
// spec, the live map of an MPI job under an emulated topology (--json),
// --print-settings and bad flags.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

struct ToolRun {
  int status;
  std::string out;
};

ToolRun run(const std::string &cmd) {
  ToolRun r{-1, ""};
  FILE *p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Brackets and braces balance outside strings, and the text is one object.
bool json_shape_ok(const std::string &s) {
  int depth = 0;
  bool in_str = false;
  size_t end = s.find_last_not_of("\n ");
  if (s.empty() || s[0] != '{' || end == std::string::npos || s[end] != '}')
    return false;
  for (size_t i = 0; i <= end; i++) {
    char c = s[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') depth++;
    else if (c == '}' || c == ']') {
      if (--depth < 0) return false;
      if (depth == 0 && i != end) return false;
    }
  }
  return depth == 0 && !in_str;
}

const std::string kBin = ZPP_TOPO_BIN;

}  // namespace

TEST(TopoTool, OfflineJsonOfAnUnevenSpec) {
  ToolRun r = run(kBin + " --offline --topo 0,0,0,1,1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(json_shape_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"emulated\": true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"world_size\": 5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"nodes\": [{\"node\": 0, \"host\": \"\", \"ranks\": [0, 1, 2]}, "
                       "{\"node\": 1, \"host\": \"\", \"ranks\": [3, 4]}]"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"uniform\": false"), std::string::npos) << r.out;
}

TEST(TopoTool, OfflineTextSaysEmulated) {
  ToolRun r = run("ZPP_TOPO=2x4 " + kBin + " --offline");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("8 ranks on 2 nodes, uniform"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("EMULATED topology: \"2x4\""), std::string::npos) << r.out;
}

#ifdef ZPP_MPIEXEC
// The live map of a 4-rank job, nodes emulated, links emulated too.
TEST(TopoTool, LiveJsonUnderMpirun) {
  ToolRun r = run("ZPP_TOPO=2x2 ZPP_EMU_INTER_GBIT=100 OMPI_MCA_mpi_yield_when_idle=1 "
              ZPP_MPIEXEC " --allow-run-as-root --oversubscribe -np 4 " + kBin +
              " --host --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(json_shape_ok(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"emulated\": true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"world_size\": 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"ranks\": [0, 1]}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"ranks\": [2, 3]}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"link_emulation\": {\"emulated\": true, "
                       "\"gbit_per_rank\": 100"),
            std::string::npos) << r.out;
}

TEST(TopoTool, LiveDiscoveredIsNotEmulated) {
  ToolRun r = run("env -u ZPP_TOPO OMPI_MCA_mpi_yield_when_idle=1 " ZPP_MPIEXEC
              " --allow-run-as-root --oversubscribe -np 2 " + kBin + " --host --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"emulated\": false"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"nnodes\": 1"), std::string::npos) << r.out;
}
#endif

TEST(TopoTool, PrintSettings) {
  ToolRun r = run(kBin + " --print-settings");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char *s : {"ZPP_TOPO", "ZPP_TIMEOUT_S", "ZPP_EMU_INTER_GBIT",
                        "ZPP_EMU_INTER_LAT_US", "ZPP_DEBUG", "ZPP_NCCL_LIBRARY"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(TopoTool, BadInputsExitNonZeroWithAMessage) {
  ToolRun r = run(kBin + " --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("--bogus"), std::string::npos) << r.out;
  r = run(kBin + " --offline --topo 2x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("NxM"), std::string::npos) << r.out;
  r = run("env -u ZPP_TOPO " + kBin + " --offline");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("needs --topo"), std::string::npos) << r.out;
}
