// Tests of the node map (src/topology/topo.h) in one process: ZPP_TOPO
// parsing and its errors, maps from host keys, uneven and round-robin
// layouts, group membership, GPU link classes and the reports.
#include <gtest/gtest.h>

#include <zpp/zpp.h>
#include <zpp/zpp_comm.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "topology/topo.h"
}

namespace {

std::vector<int> parse_ok(const char *spec, int world) {
  int *map = nullptr, n = 0;
  zpp_status_t st = zpp_topo_parse(spec, world, &map, &n);
  EXPECT_EQ(st, ZPP_OK) << spec << ": " << zpp_get_last_error();
  std::vector<int> v;
  if (st == ZPP_OK) v.assign(map, map + n);
  std::free(map);
  return v;
}

void parse_bad(const char *spec, int world, const char *needle) {
  int *map = nullptr, n = -7;
  EXPECT_EQ(zpp_topo_parse(spec, world, &map, &n), ZPP_ERR_INVALID_ARGUMENT)
      << spec;
  EXPECT_EQ(map, nullptr) << "output written on error";
  EXPECT_EQ(n, -7) << "output written on error";
  EXPECT_NE(std::string(zpp_get_last_error()).find(needle), std::string::npos)
      << "message \"" << zpp_get_last_error() << "\" lacks \"" << needle
      << "\"";
}

struct TopoPtr {
  zpp_topo_t *t = nullptr;
  ~TopoPtr() { zpp_topo_free(t); }
};

zpp_topo_t *from_spec(const char *spec, TopoPtr &p) {
  std::vector<int> m = parse_ok(spec, -1);
  EXPECT_EQ(zpp_topo_from_nodes((int)m.size(), m.data(), spec, "ZPP_TOPO", &p.t),
            ZPP_OK)
      << zpp_get_last_error();
  return p.t;
}

std::vector<int> group(const zpp_topo_t *t, zpp_group_t g, int me,
                       int *index = nullptr) {
  int n = 0, idx = -1;
  EXPECT_EQ(zpp_topo_group(t, g, me, nullptr, &n, nullptr), ZPP_OK);
  std::vector<int> v(n);
  EXPECT_EQ(zpp_topo_group(t, g, me, v.data(), &n, &idx), ZPP_OK);
  if (index) *index = idx;
  return v;
}

std::string print(const zpp_topo_t *t, int json) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  EXPECT_EQ(zpp_topo_print(t, f, json, "extra-text\n", "\"extra\": 1"), ZPP_OK);
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

}  // namespace

TEST(TopoParse, NodesTimesRanks) {
  EXPECT_EQ(parse_ok("2x4", 8), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(parse_ok(" 3X2 ", -1), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(parse_ok("1x1", 1), (std::vector<int>{0}));
  EXPECT_EQ(parse_ok("4x1", 0), (std::vector<int>{0, 1, 2, 3}));
}

TEST(TopoParse, RankToNodeList) {
  EXPECT_EQ(parse_ok("0,0,0,1,1", 5), (std::vector<int>{0, 0, 0, 1, 1}));
  EXPECT_EQ(parse_ok("0, 1 ,0,1", 4), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(parse_ok("1,0", -1), (std::vector<int>{1, 0}));
  EXPECT_EQ(parse_ok("0", 1), (std::vector<int>{0}));
}

TEST(TopoParse, BadSpecsNameTheProblem) {
  parse_bad("", 4, "empty");
  parse_bad("   ", 4, "empty");
  parse_bad("2x", 4, "NxM");
  parse_bad("x4", 4, "NxM");
  parse_bad("2x4x1", 8, "NxM");
  parse_bad("0x4", 0, ">= 1");
  parse_bad("2x0", 0, ">= 1");
  parse_bad("2x4", 6, "describes 8 ranks but the communicator has 6");
  parse_bad("0,0,1", 4, "describes 3 ranks but the communicator has 4");
  parse_bad("0,2,2", 3, "node 1 has no rank");
  parse_bad("0,,1", 3, "item 1");
  parse_bad("0,a", 2, "item 1");
  parse_bad("-1,0", 2, "item 0");
  parse_bad("0,1,", 2, "item 2");
  parse_bad("99999999x2", 0, "NxM");
  parse_bad("300x300", 0, "at most");
}

TEST(TopoParse, NullArguments) {
  int *m = nullptr, n = 0;
  EXPECT_EQ(zpp_topo_parse(nullptr, 1, &m, &n), ZPP_ERR_NULL_POINTER);
  EXPECT_NE(std::string(zpp_get_last_error()).find("spec"), std::string::npos);
  EXPECT_EQ(zpp_topo_parse("1x1", 1, nullptr, &n), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_topo_parse("1x1", 1, &m, nullptr), ZPP_ERR_NULL_POINTER);
}

TEST(TopoMap, UniformLayout) {
  TopoPtr p;
  zpp_topo_t *t = from_spec("2x4", p);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->world_size, 8);
  EXPECT_EQ(t->nnodes, 2);
  EXPECT_TRUE(t->uniform);
  EXPECT_TRUE(t->emulated);
  for (int r = 0; r < 8; r++) {
    EXPECT_EQ(t->node_of[r], r / 4);
    EXPECT_EQ(t->local_rank_of[r], r % 4);
  }
  int idx;
  EXPECT_EQ(group(t, ZPP_GROUP_NODE, 5, &idx), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(idx, 1);
  EXPECT_EQ(group(t, ZPP_GROUP_CROSS, 5, &idx), (std::vector<int>{1, 5}));
  EXPECT_EQ(idx, 1);
  EXPECT_EQ(group(t, ZPP_GROUP_WORLD, 5, &idx).size(), 8u);
  EXPECT_EQ(idx, 5);
  EXPECT_EQ(zpp_topo_link(t, 1, 1), ZPP_LINK_SELF);
  EXPECT_EQ(zpp_topo_link(t, 1, 2), ZPP_LINK_HOST);
  EXPECT_EQ(zpp_topo_link(t, 1, 5), ZPP_LINK_NET);
}

// 3 ranks on node 0, 2 on node 1: described as they are.
TEST(TopoMap, UnevenLayoutIsTruthful) {
  TopoPtr p;
  zpp_topo_t *t = from_spec("0,0,0,1,1", p);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->nnodes, 2);
  EXPECT_FALSE(t->uniform);
  EXPECT_EQ(t->node_off[1] - t->node_off[0], 3);
  EXPECT_EQ(t->node_off[2] - t->node_off[1], 2);
  int idx;
  // Local rank 2 exists on node 0 only: its CROSS group is itself.
  EXPECT_EQ(group(t, ZPP_GROUP_CROSS, 2, &idx), (std::vector<int>{2}));
  EXPECT_EQ(idx, 0);
  EXPECT_EQ(group(t, ZPP_GROUP_CROSS, 4, &idx), (std::vector<int>{1, 4}));
  EXPECT_EQ(idx, 1);
  EXPECT_EQ(group(t, ZPP_GROUP_NODE, 4, &idx), (std::vector<int>{3, 4}));
  EXPECT_EQ(idx, 1);
  std::string txt = print(t, 0);
  EXPECT_NE(txt.find("uneven"), std::string::npos) << txt;
  std::string js = print(t, 1);
  EXPECT_NE(js.find("\"uniform\": false"), std::string::npos) << js;
}

TEST(TopoMap, RoundRobinPlacement) {
  TopoPtr p;
  zpp_topo_t *t = from_spec("0,1,0,1", p);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->uniform);
  EXPECT_EQ(t->local_rank_of[2], 1);
  EXPECT_EQ(group(t, ZPP_GROUP_NODE, 3), (std::vector<int>{1, 3}));
  EXPECT_EQ(group(t, ZPP_GROUP_CROSS, 3), (std::vector<int>{2, 3}));
  // Ring order groups each node's ranks together.
  EXPECT_EQ(std::vector<int>(t->node_ranks, t->node_ranks + 4),
            (std::vector<int>{0, 2, 1, 3}));
}

TEST(TopoMap, FromHostKeysNumbersNodesByLowestRank) {
  const int64_t keys[] = {70, 70, 12, 70, 12, 99};
  TopoPtr p;
  ASSERT_EQ(zpp_topo_from_keys(6, keys, "test", &p.t), ZPP_OK);
  EXPECT_FALSE(p.t->emulated);
  EXPECT_EQ(p.t->nnodes, 3);
  EXPECT_EQ(std::vector<int>(p.t->node_of, p.t->node_of + 6),
            (std::vector<int>{0, 0, 1, 0, 1, 2}));
  EXPECT_EQ(std::vector<int>(p.t->local_rank_of, p.t->local_rank_of + 6),
            (std::vector<int>{0, 1, 0, 2, 1, 0}));
  EXPECT_FALSE(p.t->uniform);
  std::string js = print(p.t, 1);
  EXPECT_NE(js.find("\"emulated\": false"), std::string::npos) << js;
}

TEST(TopoMap, BadConstructionArguments) {
  zpp_topo_t *t = nullptr;
  const int gap[] = {0, 2, 2};
  EXPECT_EQ(zpp_topo_from_nodes(3, gap, nullptr, nullptr, &t),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("node 1 has no rank"),
            std::string::npos);
  const int neg[] = {0, -1};
  EXPECT_EQ(zpp_topo_from_nodes(2, neg, nullptr, nullptr, &t),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("node_of[1] = -1"),
            std::string::npos);
  EXPECT_EQ(zpp_topo_from_nodes(0, gap, nullptr, nullptr, &t),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_topo_from_nodes(2, nullptr, nullptr, nullptr, &t),
            ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(t, nullptr);
  TopoPtr p;
  zpp_topo_t *u = from_spec("1x2", p);
  EXPECT_EQ(zpp_topo_group(u, (zpp_group_t)7, 0, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zpp_topo_group(u, ZPP_GROUP_NODE, 2, nullptr, nullptr, nullptr),
            ZPP_ERR_INVALID_ARGUMENT);
}

// The GPU part: classes as given on one node, NET across nodes, SELF on the
// diagonal whatever the input says; the matrix is printed nvidia-smi style.
TEST(TopoGpu, LinkMatrix) {
  TopoPtr p;
  zpp_topo_t *t = from_spec("2x2", p);
  ASSERT_NE(t, nullptr);
  zpp_topo_gpu_t g[4];
  for (int r = 0; r < 4; r++) {
    g[r].device = r % 2;
    std::snprintf(g[r].bus_id, sizeof g[r].bus_id, "00000000:%02X:00.0",
                  r % 2 + 7);
  }
  uint8_t link[16], nv[16];
  for (int i = 0; i < 16; i++) {
    link[i] = ZPP_LINK_NVLINK;
    nv[i] = 18;
  }
  link[2 * 4 + 3] = link[3 * 4 + 2] = ZPP_LINK_PCIE;
  ASSERT_EQ(zpp_topo_set_gpus(t, g, link, nv), ZPP_OK);
  EXPECT_EQ(zpp_topo_link(t, 0, 1), ZPP_LINK_NVLINK);
  EXPECT_EQ(zpp_topo_link(t, 2, 3), ZPP_LINK_PCIE);
  EXPECT_EQ(zpp_topo_link(t, 0, 2), ZPP_LINK_NET);
  EXPECT_EQ(zpp_topo_link(t, 3, 3), ZPP_LINK_SELF);
  std::string txt = print(t, 0);
  EXPECT_NE(txt.find("NV18"), std::string::npos) << txt;
  EXPECT_NE(txt.find("PCI"), std::string::npos) << txt;
  EXPECT_NE(txt.find("EMULATED"), std::string::npos) << txt;
  std::string js = print(t, 1);
  EXPECT_NE(js.find("\"gpu_links\": [[\"self\", \"nvlink\"]"), std::string::npos)
      << js;
}

TEST(TopoGpu, ClassesWithoutAProbe) {
  zpp_topo_gpu_t a{}, b{};
  zpp_link_t l = ZPP_LINK_NET;
  int nv = -1;
  a.device = 0;
  b.device = -1;  // no GPU: through host memory
  ASSERT_EQ(zpp_topo_gpu_link(&a, &b, &l, &nv), ZPP_OK);
  EXPECT_EQ(l, ZPP_LINK_HOST);
  EXPECT_EQ(nv, 0);
  b.device = 0;
  std::strcpy(a.bus_id, "00000000:07:00.0");
  std::strcpy(b.bus_id, "0000:07:00.0");  // CUDA's short domain form
  ASSERT_EQ(zpp_topo_gpu_link(&a, &b, &l, nullptr), ZPP_OK);
  EXPECT_EQ(l, ZPP_LINK_SAME_DEVICE);
  EXPECT_EQ(zpp_topo_gpu_link(nullptr, &b, &l, nullptr), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_topo_gpu_link(&a, &b, nullptr, nullptr), ZPP_ERR_NULL_POINTER);
  // Loads (or fails to load) NVML by dlopen without crashing.
  std::string src = zpp_topo_gpu_probe_source();
  EXPECT_TRUE(src == "nvml" || src == "cuda-peer" || src == "none") << src;
}

TEST(TopoReport, JsonHasTheDocumentedFields) {
  TopoPtr p;
  zpp_topo_t *t = from_spec("0,0,0,1,1", p);
  std::string js = print(t, 1);
  EXPECT_EQ(js.rfind("{\"emulated\": true", 0), 0u) << js;
  EXPECT_NE(js.find("\"world_size\": 5"), std::string::npos) << js;
  EXPECT_NE(js.find("\"ranks\": [0, 1, 2]"), std::string::npos) << js;
  EXPECT_NE(js.find("\"ranks\": [3, 4]"), std::string::npos) << js;
  EXPECT_NE(js.find("\"extra\": 1}"), std::string::npos) << js;
  EXPECT_EQ(js.back(), '\n');
  EXPECT_EQ(zpp_topo_print(t, nullptr, 1, nullptr, nullptr),
            ZPP_ERR_NULL_POINTER);
}

TEST(TopoNames, LinksAndGroups) {
  EXPECT_STREQ(zpp_link_name(ZPP_LINK_NVLINK), "nvlink");
  EXPECT_STREQ(zpp_link_name(ZPP_LINK_NET), "net");
  EXPECT_STREQ(zpp_link_name((zpp_link_t)42), "unknown");
  EXPECT_STREQ(zpp_group_name(ZPP_GROUP_CROSS), "cross");
  EXPECT_STREQ(zpp_backend_name(ZPP_BACKEND_NCCL), "nccl");
}
