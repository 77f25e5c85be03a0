// Multi-rank tests of the communicator and its transports, run under
// mpirun with the layouts of tests/transport.cmake (ZPP_TOPO).  Every
// operation on every group is checked bit for bit against an expectation
// computed here from the inputs of all ranks (each rank regenerates the
// others' random inputs from the seed), and every byte count against the
// formulas of the documented algorithms (docs/design.md "Transports").
//
// Seed: ZPP_TEST_SEED (default 20261129), printed by rank 0.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/resource.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>
#include <zpp/zpp_mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if ZPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

extern "C" {
#include "core/core.h"
#include "comm/comm.h"
#include "transport/transport.h"
#include "scoped_env.h"
#include "xfer_blocking.h"
}

#include <mutex>
#include <utility>

// The messages zpp's MPI transport sends, seen through MPI's profiling
// interface while g_isend_watch is set: (destination, bytes) of each
// MPI_Isend on a communicator other than MPI_COMM_WORLD (zpp's duplicate).
static std::mutex g_isend_mu;
static bool g_isend_watch = false;
static std::vector<std::pair<int, long>> g_isend;

extern "C" int MPI_Isend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                         MPI_Comm comm, MPI_Request *req) {
  {
    std::lock_guard<std::mutex> l(g_isend_mu);
    if (g_isend_watch && comm != MPI_COMM_WORLD) {
      int es = 1;
      MPI_Type_size(dt, &es);
      g_isend.emplace_back(dest, (long)count * es);
    }
  }
  return PMPI_Isend(buf, count, dt, dest, tag, comm, req);
}

namespace {

int g_rank = 0, g_size = 1;
uint64_t g_seed = 20261129ull;
// The backend under test: ZPP_BACKEND (ctest runs this suite once per
// backend, the same tests), default mpi.
std::string g_backend = "mpi";
zpp_comm_t g_comm = nullptr;

// ---- the layout, derived from ZPP_TOPO independently of src/topology/ ----
struct Layout {
  std::vector<int> node_of;
  int nnodes = 1;
  bool emulated = false;
  int node_size(int n) const {
    return (int)std::count(node_of.begin(), node_of.end(), n);
  }
  int local_rank(int r) const {
    int l = 0;
    for (int q = 0; q < r; q++) l += node_of[q] == node_of[r];
    return l;
  }
};
Layout g_layout;

// ZPP_TOPO: the layout zpp is told (emulated).  Without it the topology is
// discovered; ZPP_TEST_EXPECT_NODES (same syntax) then says what discovery
// must find (scripts/netns_cluster.sh: real nodes), else one node.
Layout make_layout(int size) {
  Layout L;
  const char *spec = std::getenv("ZPP_TOPO");
  const char *expect = std::getenv("ZPP_TEST_EXPECT_NODES");
  L.node_of.assign(size, 0);
  L.emulated = spec && *spec;
  if (!L.emulated) spec = expect;
  if (spec && *spec) {
    std::string s(spec);
    size_t x = s.find_first_of("xX");
    if (x != std::string::npos) {
      int per = std::atoi(s.c_str() + x + 1);
      for (int r = 0; r < size; r++) L.node_of[r] = r / per;
    } else {
      size_t pos = 0;
      for (int r = 0; r < size; r++) {
        L.node_of[r] = std::atoi(s.c_str() + pos);
        pos = s.find(',', pos) + 1;
      }
    }
  }
  L.nnodes = *std::max_element(L.node_of.begin(), L.node_of.end()) + 1;
  return L;
}

// Members of a group seen from `me`, in group order.
std::vector<int> members(zpp_group_t g, int me) {
  std::vector<int> m;
  const Layout &L = g_layout;
  if (g == ZPP_GROUP_WORLD) {
    for (int r = 0; r < g_size; r++) m.push_back(r);
  } else if (g == ZPP_GROUP_NODE) {
    for (int r = 0; r < g_size; r++)
      if (L.node_of[r] == L.node_of[me]) m.push_back(r);
  } else {
    for (int n = 0; n < L.nnodes; n++)
      for (int r = 0; r < g_size; r++)
        if (L.node_of[r] == n && L.local_rank(r) == L.local_rank(me))
          m.push_back(r);
  }
  return m;
}
int index_of(const std::vector<int> &m, int r) {
  return (int)(std::find(m.begin(), m.end(), r) - m.begin());
}
// Ring order of the ring algorithms, as member indices: by node, then by
// world rank (docs/design.md).
std::vector<int> ring(zpp_group_t g, int me) {
  std::vector<int> m = members(g, me), idx(m.size());
  for (size_t i = 0; i < m.size(); i++) idx[i] = (int)i;
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
    return g_layout.node_of[m[a]] < g_layout.node_of[m[b]];
  });
  return idx;
}

const zpp_group_t kGroups[] = {ZPP_GROUP_WORLD, ZPP_GROUP_NODE,
                               ZPP_GROUP_CROSS};

// ---- byte-count expectations --------------------------------------------
struct Bytes {
  uint64_t intra_sent = 0, intra_recv = 0, inter_sent = 0, inter_recv = 0;
  void add(int peer, uint64_t sent, uint64_t recv) {
    if (peer == g_rank) return;
    bool inter = g_layout.node_of[peer] != g_layout.node_of[g_rank];
    (inter ? inter_sent : intra_sent) += sent;
    (inter ? inter_recv : intra_recv) += recv;
  }
};

void expect_bytes(const Bytes &want, const zpp_comm_stats_t &got,
                  const std::string &what) {
  EXPECT_EQ(got.intra_bytes_sent, want.intra_sent) << what << " intra sent";
  EXPECT_EQ(got.intra_bytes_recv, want.intra_recv) << what << " intra recv";
  EXPECT_EQ(got.inter_bytes_sent, want.inter_sent) << what << " inter sent";
  EXPECT_EQ(got.inter_bytes_recv, want.inter_recv) << what << " inter recv";
}

zpp_comm_stats_t stats() {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  EXPECT_EQ(zpp_comm_get_stats(g_comm, &s), ZPP_OK);
  return s;
}

Bytes operator+(Bytes a, const Bytes &b) {
  a.intra_sent += b.intra_sent; a.intra_recv += b.intra_recv;
  a.inter_sent += b.inter_sent; a.inter_recv += b.inter_recv;
  return a;
}

// ZPP_ALGO (default hier): the hierarchical algorithms run on a group whose
// members span several nodes with more than one member on some node
// (docs/design.md "Transports"); otherwise, and with ZPP_ALGO=flat, the
// ring all-gather and the pairwise reduce-scatter.
bool g_hier = true;
struct Nodes {  // a member list cut by node, in node order
  std::vector<std::vector<int>> run;  // member indices of each node
  std::vector<int> node, pos;         // per member: its node, its place there
};
Nodes nodes_of(const std::vector<int> &m) {
  Nodes N;
  std::vector<int> ids;
  for (int r : m) ids.push_back(g_layout.node_of[r]);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  N.run.resize(ids.size());
  N.node.resize(m.size());
  N.pos.resize(m.size());
  for (size_t i = 0; i < m.size(); i++) {
    int k = (int)(std::find(ids.begin(), ids.end(), g_layout.node_of[m[i]]) - ids.begin());
    N.node[i] = k;
    N.pos[i] = (int)N.run[k].size();
    N.run[k].push_back((int)i);
  }
  return N;
}
bool hier_group(const std::vector<int> &m) {
  size_t nh = nodes_of(m).run.size();
  return g_hier && nh > 1 && nh < m.size();
}
// The owner of member w on node k: the member at w's place modulo k's size.
int owner(const Nodes &N, int k, int w) {
  return N.run[k][N.pos[w] % N.run[k].size()];
}

// Hierarchical all-gather(v): my block to its owner on every other node,
// the blocks I own (mine and those sent to me) to every other member of my
// node.
Bytes hier_ag_bytes(const std::vector<int> &m, const std::vector<uint64_t> &blk) {
  Nodes N = nodes_of(m);
  int n = (int)m.size(), me = index_of(m, g_rank), k0 = N.node[me];
  Bytes b;
  auto owned_by = [&](int j) {
    uint64_t t = 0;
    for (int w = 0; w < n; w++) t += owner(N, k0, w) == j ? blk[w] : 0;
    return t;
  };
  for (int k = 0; k < (int)N.run.size(); k++)
    if (k != k0) b.add(m[owner(N, k, me)], blk[me], 0);
  for (int w = 0; w < n; w++)
    if (N.node[w] != k0 && owner(N, k0, w) == me) b.add(m[w], 0, blk[w]);
  for (int j : N.run[k0])
    if (j != me) b.add(m[j], owned_by(me), owned_by(j));
  return b;
}

// Reduce-scatter of shards of blk[w] bytes: pairwise (each shard straight
// to its member), or hierarchical: the transpose of the all-gather (shard w
// to its owner on my node; the owner's partial sum to w, in the wire dtype:
// fp32 for fp16, `wire` = 2 times the shard's bytes).
Bytes rs_bytes(const std::vector<int> &m, const std::vector<uint64_t> &blk,
               uint64_t wire = 1) {
  int n = (int)m.size(), me = index_of(m, g_rank);
  Bytes b;
  if (!hier_group(m)) {
    for (int i = 0; i < n; i++) b.add(m[i], blk[i], blk[me]);
    return b;
  }
  Nodes N = nodes_of(m);
  int k0 = N.node[me];
  for (int j : N.run[k0]) {
    if (j == me) continue;
    uint64_t to = 0, from = 0;
    for (int w = 0; w < n; w++) {
      if (owner(N, k0, w) == j) to += blk[w];
      if (owner(N, k0, w) == me) from += blk[w];
    }
    b.add(m[j], to, from);
  }
  for (int w = 0; w < n; w++)
    if (N.node[w] != k0 && owner(N, k0, w) == me) b.add(m[w], wire * blk[w], 0);
  for (int k = 0; k < (int)N.run.size(); k++)
    if (k != k0) b.add(m[owner(N, k, me)], 0, wire * blk[me]);
  return b;
}
// The partials' wire bytes per shard byte (src/algo/hier.c).
uint64_t wire_of(zpp_dtype_t dt) { return dt == ZPP_FLOAT16 ? 2 : 1; }

// All-gather(v) bytes.  Ring allgatherv: I forward every block but my
// successor's, receive every block but mine.  With ZPP_NET_RINGS = C > 1,
// ring c carries chunk c of every block (b / C, the first b % C chunks one
// byte longer) and visits each node's members rotated by c; C is capped by
// the largest node run.  Hierarchical: hier_ag_bytes.
int g_rings = 1;
Bytes ring_bytes(zpp_group_t g, const std::vector<uint64_t> &blk) {
  std::vector<int> m = members(g, g_rank), base = ring(g, g_rank);
  int n = (int)m.size(), me = index_of(m, g_rank);
  Bytes b;
  if (n == 1) return b;
  if (hier_group(m)) return hier_ag_bytes(m, blk);
  std::vector<std::pair<int, int>> runs;  // [begin, end) of each node in base
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && g_layout.node_of[m[base[j]]] == g_layout.node_of[m[base[i]]]) j++;
    runs.push_back({i, j});
    i = j;
  }
  int longest = 1;
  for (auto &r : runs) longest = std::max(longest, r.second - r.first);
  int C = std::min(g_rings, longest);
  for (int c = 0; c < C; c++) {
    std::vector<int> R(n);
    for (auto &r : runs) {
      int len = r.second - r.first;
      for (int k = 0; k < len; k++) R[r.first + k] = base[r.first + (k + c) % len];
    }
    auto chunk = [&](uint64_t x) { return x / C + ((uint64_t)c < x % C ? 1 : 0); };
    int pos = index_of(R, me), next = R[(pos + 1) % n], prev = R[(pos + n - 1) % n];
    uint64_t total = 0;
    for (uint64_t x : blk) total += chunk(x);
    b.add(m[next], total - chunk(blk[next]), 0);
    b.add(m[prev], 0, total - chunk(blk[me]));
  }
  return b;
}

// ---- random inputs: any rank can regenerate any other's ------------------
std::mt19937_64 rng_for(uint64_t salt, int rank) {
  return std::mt19937_64(g_seed * 1000003ull + salt * 7919ull + (uint64_t)rank);
}
std::vector<uint8_t> bytes_of(uint64_t salt, int rank, size_t n) {
  auto rng = rng_for(salt, rank);
  std::vector<uint8_t> v;
  v.reserve(n + 1);  // data() is never NULL, even for 0 bytes
  v.resize(n);
  for (auto &x : v) x = (uint8_t)rng();
  return v;
}

// Independent dtype conversions (float64 based, round to nearest even).
float f32_of_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint32_t bits_of_f32(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float h2f(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp((double)m, -24)
                    : std::ldexp(1024.0 + m, e - 25);
  if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
  return (float)(s ? -v : v);
}
uint16_t f2h(float f) {
  double x = f, a = std::fabs(x);
  uint16_t s = std::signbit(x) ? 0x8000 : 0;
  if (a == 0) return s;
  int e = std::ilogb(a);
  if (e < -14) e = -14;
  double q = std::nearbyint(std::ldexp(a, 10 - e));  // mantissa with 10 bits
  if (q >= 2048) { q /= 2; e++; }
  if (e > 15) return s | 0x7c00;
  if (q < 1024) return s | (uint16_t)q;  // subnormal
  return s | (uint16_t)((e + 15) << 10) | (uint16_t)(q - 1024);
}
float b2f(uint16_t h) { return f32_of_bits((uint32_t)h << 16); }
uint16_t f2b(float f) {
  uint32_t u = bits_of_f32(f);
  double x = f;
  // Truncate, then compare the remainder exactly in float64.
  uint16_t t = (uint16_t)(u >> 16);
  double lo = b2f(t), hi = b2f((uint16_t)(t + 1));
  double dl = std::fabs(x - lo), dh = std::fabs(hi - x);
  if (dh < dl || (dh == dl && (t & 1))) return (uint16_t)(t + 1);
  return t;
}
float load(const void *p, size_t i, zpp_dtype_t dt) {
  if (dt == ZPP_FLOAT32) { float f; std::memcpy(&f, (const char *)p + 4 * i, 4); return f; }
  uint16_t h; std::memcpy(&h, (const char *)p + 2 * i, 2);
  return dt == ZPP_FLOAT16 ? h2f(h) : b2f(h);
}
void store(void *p, size_t i, zpp_dtype_t dt, float v) {
  if (dt == ZPP_FLOAT32) { std::memcpy((char *)p + 4 * i, &v, 4); return; }
  uint16_t h = dt == ZPP_FLOAT16 ? f2h(v) : f2b(v);
  std::memcpy((char *)p + 2 * i, &h, 2);
}
// Elements representable in dt, uniform in [-8, 8), never all zero.
std::vector<uint8_t> floats_of(uint64_t salt, int rank, size_t count,
                               zpp_dtype_t dt) {
  auto rng = rng_for(salt, rank);
  std::uniform_real_distribution<float> d(-8.0f, 8.0f);
  std::vector<uint8_t> v(count * zpp_dtype_size(dt) + 1);
  for (size_t i = 0; i < count; i++) store(v.data(), i, dt, d(rng));
  return v;
}
// The documented sum.  Flat: member order, fp32 accumulator, one rounding
// to dt.  Hierarchical: per node, its members in order (fp32), rounded to
// the wire dtype (what travels: dt, but fp32 for fp16); then the nodes in
// order (fp32), rounded once.
std::vector<uint8_t> sum_in_order(const std::vector<std::vector<uint8_t>> &in,
                                  const std::vector<int> &m, zpp_dtype_t dt,
                                  size_t first, size_t len) {
  std::vector<uint8_t> out(len * zpp_dtype_size(dt) + 1);
  bool hier = hier_group(m);
  Nodes N = nodes_of(m);
  for (size_t e = 0; e < len; e++) {
    float acc = 0;
    if (!hier) {
      acc = load(in[0].data(), first + e, dt);
      for (size_t i = 1; i < in.size(); i++)
        acc = acc + load(in[i].data(), first + e, dt);
    } else {
      for (size_t k = 0; k < N.run.size(); k++) {
        float part = 0;
        for (size_t j = 0; j < N.run[k].size(); j++) {
          float x = load(in[N.run[k][j]].data(), first + e, dt);
          part = j == 0 ? x : part + x;
        }
        uint8_t tmp[4];
        if (dt != ZPP_FLOAT16) {  // rounded to dt; fp16 partials stay fp32
          store(tmp, 0, dt, part);
          part = load(tmp, 0, dt);
        }
        acc = k == 0 ? part : acc + part;
      }
    }
    store(out.data(), e, dt, acc);
  }
  return out;
}
std::vector<uint8_t> expected_sum(uint64_t salt, const std::vector<int> &m,
                                  size_t count, zpp_dtype_t dt, size_t first,
                                  size_t len) {
  std::vector<std::vector<uint8_t>> in;
  for (int r : m) in.push_back(floats_of(salt, r, count, dt));
  return sum_in_order(in, m, dt, first, len);
}

std::string tag(zpp_group_t g, const char *op, size_t n, zpp_dtype_t dt = ZPP_FLOAT32) {
  return std::string(op) + " group " + zpp_group_name(g) + " size " +
         std::to_string(n) + " " + zpp_dtype_name(dt) + " rank " +
         std::to_string(g_rank);
}

zpp_transport_t *T() { return zpp_comm_transport(g_comm); }

}  // namespace

// ---- topology -------------------------------------------------------------

TEST(Topology, MatchesTheLayout) {
  int nn = 0, em = -1, un = -1, lr = -1, ls = -1;
  ASSERT_EQ(zpp_comm_nnodes(g_comm, &nn), ZPP_OK);
  EXPECT_EQ(nn, g_layout.nnodes);
  ASSERT_EQ(zpp_comm_topo_emulated(g_comm, &em), ZPP_OK);
  EXPECT_EQ(em, g_layout.emulated ? 1 : 0);
  bool uniform = true;
  for (int n = 1; n < nn; n++) uniform &= g_layout.node_size(n) == g_layout.node_size(0);
  ASSERT_EQ(zpp_comm_topo_uniform(g_comm, &un), ZPP_OK);
  EXPECT_EQ(un, uniform ? 1 : 0);
  for (int r = 0; r < g_size; r++) {
    int node = -1, l = -1;
    ASSERT_EQ(zpp_comm_node_of(g_comm, r, &node), ZPP_OK);
    ASSERT_EQ(zpp_comm_local_rank_of(g_comm, r, &l), ZPP_OK);
    EXPECT_EQ(node, g_layout.node_of[r]) << "rank " << r;
    EXPECT_EQ(l, g_layout.local_rank(r)) << "rank " << r;
    zpp_link_t link;
    ASSERT_EQ(zpp_comm_link(g_comm, g_rank, r, &link), ZPP_OK);
    EXPECT_EQ(link, r == g_rank ? ZPP_LINK_SELF
                    : g_layout.node_of[r] == g_layout.node_of[g_rank]
                        ? ZPP_LINK_HOST : ZPP_LINK_NET);
  }
  for (int n = 0; n < nn; n++) {
    int s = -1;
    ASSERT_EQ(zpp_comm_node_size(g_comm, n, &s), ZPP_OK);
    EXPECT_EQ(s, g_layout.node_size(n));
  }
  ASSERT_EQ(zpp_comm_local_rank(g_comm, &lr), ZPP_OK);
  ASSERT_EQ(zpp_comm_local_size(g_comm, &ls), ZPP_OK);
  EXPECT_EQ(lr, g_layout.local_rank(g_rank));
  EXPECT_EQ(ls, g_layout.node_size(g_layout.node_of[g_rank]));
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    EXPECT_EQ(zpp_transport_group_size(T(), g), (int)m.size()) << zpp_group_name(g);
    EXPECT_EQ(zpp_transport_group_rank(T(), g), index_of(m, g_rank));
    for (size_t i = 0; i < m.size(); i++)
      EXPECT_EQ(zpp_transport_group_member(T(), g, (int)i), m[i]);
    EXPECT_EQ(zpp_transport_group_member(T(), g, (int)m.size()), -1);
  }
}

TEST(Topology, ReportSaysWhatItIs) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ASSERT_EQ(zpp_comm_print_topology(g_comm, f, 1), ZPP_OK);
  std::fclose(f);
  std::string js(buf, len);
  std::free(buf);
  EXPECT_NE(js.find(g_layout.emulated ? "\"emulated\": true" : "\"emulated\": false"),
            std::string::npos) << js;
  EXPECT_NE(js.find("\"world_size\": " + std::to_string(g_size)), std::string::npos);
  EXPECT_NE(js.find("\"backend\": \"" + g_backend + "\""), std::string::npos) << js;
  EXPECT_NE(js.find("\"bootstrap\": \"mpi\""), std::string::npos) << js;
  zpp_comm_stats_t s = stats();
  EXPECT_EQ(s.topo_emulated, g_layout.emulated ? 1 : 0);
}

// ---- data movement ----------------------------------------------------------

TEST(Ops, AllgatherEveryGroup) {
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    for (size_t B : {0ul, 1ul, 7ul, 1000ul, 65539ul}) {
      for (int inplace = 0; inplace < 2; inplace++) {
        uint64_t salt = 100 + B + 7 * inplace + 31 * g;
        std::vector<uint8_t> mine = bytes_of(salt, g_rank, B);
        std::vector<uint8_t> out(n * B + 1, 0xEE);
        const void *send = mine.data();
        if (inplace) {
          std::memcpy(out.data() + me * B, mine.data(), B);
          send = out.data() + me * B;
        }
        zpp_comm_reset_stats(g_comm);
        ASSERT_EQ(blocking_allgather(T(), g, send, B, out.data(),
                                          ZPP_MEMORY_HOST, nullptr), ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        for (int i = 0; i < n; i++)
          EXPECT_EQ(0, std::memcmp(out.data() + i * B,
                                   bytes_of(salt, m[i], B).data(), B))
              << tag(g, "allgather", B) << " block " << i;
        EXPECT_EQ(out[n * B], 0xEE) << "wrote past the end";
        zpp_comm_stats_t s = stats();
        expect_bytes(ring_bytes(g, std::vector<uint64_t>(n, B)), s,
                     tag(g, "allgather", B));
        EXPECT_EQ(s.calls[g], 1u);
      }
    }
  }
}

TEST(Ops, AllgathervEveryGroup) {
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    for (int gaps = 0; gaps < 2; gaps++) {
      uint64_t salt = 300 + 31 * g + gaps;
      std::vector<size_t> cnt(n), dis(n);
      std::vector<uint64_t> blk(n);
      size_t total = 0;
      for (int i = 0; i < n; i++) {
        cnt[i] = (size_t)((m[i] * 37 + 11 * gaps) % 5 == 0 ? 0 : 50 + m[i] * 131 % 997);
        blk[i] = cnt[i];
        dis[i] = total + (gaps ? 3 : 0);
        total = dis[i] + cnt[i];
      }
      std::vector<uint8_t> mine = bytes_of(salt, g_rank, cnt[me]);
      std::vector<uint8_t> out(total + 1, 0xEE);
      zpp_comm_reset_stats(g_comm);
      ASSERT_EQ(blocking_allgatherv(T(), g, mine.data(), out.data(),
                                         cnt.data(), gaps ? dis.data() : nullptr,
                                         ZPP_MEMORY_HOST, nullptr), ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      for (int i = 0; i < n; i++) {
        EXPECT_EQ(0, std::memcmp(out.data() + dis[i],
                                 bytes_of(salt, m[i], cnt[i]).data(), cnt[i]))
            << tag(g, "allgatherv", total) << " block " << i;
        if (gaps) {
          for (int k = 1; k <= 3; k++)
            EXPECT_EQ(out[dis[i] - k], 0xEE) << "gap written";
        }
      }
      expect_bytes(ring_bytes(g, blk), stats(), tag(g, "allgatherv", total));
    }
  }
}

TEST(Ops, AlltoallEveryGroup) {
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    for (size_t B : {0ul, 1ul, 13ul, 4099ul}) {
      uint64_t salt = 500 + B + 31 * g;
      std::vector<uint8_t> mine = bytes_of(salt, g_rank, n * B);
      std::vector<uint8_t> out(n * B + 1, 0xEE);
      zpp_comm_reset_stats(g_comm);
      ASSERT_EQ(blocking_alltoall(T(), g, mine.data(), B, out.data(),
                                       ZPP_MEMORY_HOST, nullptr), ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      Bytes want;
      for (int i = 0; i < n; i++) {
        std::vector<uint8_t> theirs = bytes_of(salt, m[i], n * B);
        EXPECT_EQ(0, std::memcmp(out.data() + i * B, theirs.data() + me * B, B))
            << tag(g, "alltoall", B) << " from member " << i;
        want.add(m[i], B, B);
      }
      EXPECT_EQ(out[n * B], 0xEE);
      expect_bytes(want, stats(), tag(g, "alltoall", B));
    }
  }
}

TEST(Ops, AlltoallvEveryGroup) {
  // Member i sends f(i, j) bytes to member j (zero for some pairs).
  auto f = [](int i, int j, int c) -> size_t {
    return (size_t)((i * 7 + j * 3 + c) % 6 == 0 ? 0 : (i * 53 + j * 29 + c) % 211 + 1);
  };
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    for (int c = 0; c < 2; c++) {
      uint64_t salt = 700 + 31 * g + c;
      auto layout = [&](int i, std::vector<size_t> &sc, std::vector<size_t> &sd) {
        size_t acc = 0;
        sc.resize(n);
        sd.resize(n);
        for (int j = 0; j < n; j++) {
          sc[j] = f(m[i], m[j], c);
          sd[j] = acc + (c ? 5 : 0);
          acc = sd[j] + sc[j];
        }
        return acc;
      };
      std::vector<size_t> sc, sd, rc(n), rd(n);
      size_t stotal = layout(me, sc, sd), rtotal = 0;
      for (int i = 0; i < n; i++) {
        rc[i] = f(m[i], m[me], c);
        rd[i] = rtotal + (c ? 2 : 0);
        rtotal = rd[i] + rc[i];
      }
      std::vector<uint8_t> mine = bytes_of(salt, g_rank, stotal);
      std::vector<uint8_t> out(rtotal + 1, 0xEE);
      zpp_comm_reset_stats(g_comm);
      ASSERT_EQ(blocking_alltoallv(T(), g, mine.data(), sc.data(),
                                        c ? sd.data() : nullptr, out.data(),
                                        rc.data(), c ? rd.data() : nullptr,
                                        ZPP_MEMORY_HOST, nullptr), ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      Bytes want;
      for (int i = 0; i < n; i++) {
        std::vector<size_t> tc, td;
        size_t tt = layout(i, tc, td);
        std::vector<uint8_t> theirs = bytes_of(salt, m[i], tt);
        size_t d = c ? rd[i] : rd[i];
        EXPECT_EQ(0, std::memcmp(out.data() + d, theirs.data() + (c ? td[me] : td[me]), rc[i]))
            << tag(g, "alltoallv", rtotal) << " from member " << i;
        want.add(m[i], sc[i], rc[i]);
      }
      expect_bytes(want, stats(), tag(g, "alltoallv", rtotal));
    }
  }
}

// ---- reductions ---------------------------------------------------------------

TEST(Ops, ReduceScatterEveryGroupAndDtype) {
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16}) {
      size_t es = zpp_dtype_size(dt);
      for (size_t count : {1ul, 5ul, 333ul}) {
        uint64_t salt = 900 + count + 31 * g + 1000 * dt;
        std::vector<uint8_t> in = floats_of(salt, g_rank, n * count, dt);
        std::vector<uint8_t> out(count * es + 1, 0xEE), again(count * es + 1, 0xEE);
        zpp_comm_reset_stats(g_comm);
        ASSERT_EQ(blocking_reduce_scatter(T(), g, in.data(), out.data(), count,
                                               dt, ZPP_REDUCE_SUM, ZPP_MEMORY_HOST,
                                               nullptr), ZPP_OK)
            << zpp_comm_get_last_error(g_comm);
        expect_bytes(rs_bytes(m, std::vector<uint64_t>(n, count * es), wire_of(dt)),
                     stats(), tag(g, "reduce_scatter", count, dt));
        std::vector<uint8_t> ref = expected_sum(salt, m, n * count, dt, me * count, count);
        EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), count * es))
            << tag(g, "reduce_scatter", count, dt);
        EXPECT_EQ(out[count * es], 0xEE);
        // Deterministic: the same bits every run.
        ASSERT_EQ(blocking_reduce_scatter(T(), g, in.data(), again.data(), count,
                                               dt, ZPP_REDUCE_SUM, ZPP_MEMORY_HOST,
                                               nullptr), ZPP_OK);
        EXPECT_EQ(out, again);
      }
    }
  }
}

// Gradients whose sum over one node leaves fp16's range (65504) while the
// total over the nodes does not: node k's members send about +A (k even)
// or -A (k odd), A in [33000, 40000], so any two members of a node exceed
// 65504 and the nodes cancel (with an odd number of nodes the last one
// sends small values).  A partial sum rounded to fp16 became inf, and inf
// the result -- the "multi-node fp16 loss goes to inf" of hierarchical
// reductions; fp16 partials travel in fp32, so the result is finite and
// within the bound of the float64 sum.  bf16, whose partials stay bf16,
// has fp32's range: the same with A near 3.3e38 / (largest node).
TEST(Ops, ReduceScatterPartialSumsDoNotOverflow) {
  std::printf("seed %llu\n", (unsigned long long)g_seed);
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    Nodes N = nodes_of(m);
    int K = (int)N.run.size();
    size_t big = 1;
    for (auto &r : N.run) big = std::max(big, r.size());
    for (zpp_dtype_t dt : {ZPP_FLOAT16, ZPP_BFLOAT16}) {
      const size_t es = zpp_dtype_size(dt), count = 301;
      const double lim = dt == ZPP_FLOAT16 ? 65504.0 : 3.3895313892515355e38;
      const double ud = std::ldexp(1.0, dt == ZPP_FLOAT16 ? -11 : -8);
      const uint64_t salt = 2500 + 31 * g + 1000 * dt;
      // Amplitude of each element, the same on every member.
      std::vector<double> amp(n * count);
      auto ra = rng_for(salt, 0);
      std::uniform_real_distribution<double> da(0.0, 1.0);
      for (auto &a : amp)
        a = dt == ZPP_FLOAT16 ? 33000.0 + 7000.0 * da(ra)
                              : (0.9 + 0.07 * da(ra)) * 3.3e38 / (double)big;
      std::vector<std::vector<uint8_t>> in(n);
      for (int i = 0; i < n; i++) {
        auto rr = rng_for(salt, m[i] + 1);
        std::uniform_real_distribution<double> dj(0.0, 1.0 / 64);
        std::uniform_real_distribution<float> ds(-8.0f, 8.0f);
        int k = N.node[i];
        in[i].resize(n * count * es + 1);
        for (size_t e = 0; e < n * count; e++) {
          double v = (K % 2 == 1 && k == K - 1 && K > 1)
                         ? (double)ds(rr)
                         : (k % 2 ? -1.0 : 1.0) * amp[e] * (1.0 + dj(rr));
          store(in[i].data(), e, dt, (float)v);
        }
      }
      std::vector<uint8_t> out(count * es + 1, 0xEE);
      ASSERT_EQ(blocking_reduce_scatter(T(), g, in[me].data(), out.data(), count, dt,
                                             ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr),
                ZPP_OK)
          << zpp_comm_get_last_error(g_comm);
      std::vector<uint8_t> want = sum_in_order(in, m, dt, me * count, count);
      EXPECT_EQ(0, std::memcmp(out.data(), want.data(), count * es))
          << tag(g, "reduce_scatter of large partials", count, dt);
      int teeth = 0, bad = 0;
      for (size_t e = 0; e < count; e++) {
        size_t x = me * count + e;
        double total = 0, mag = 0, pmax = 0;
        for (int k = 0; k < K; k++) {
          double p = 0;
          for (int i : N.run[k]) p += load(in[i].data(), x, dt);
          pmax = std::max(pmax, std::fabs(p));
        }
        for (int i = 0; i < n; i++) {
          total += load(in[i].data(), x, dt);
          mag += std::fabs(load(in[i].data(), x, dt));
        }
        if (std::fabs(total) > lim * (1.0 - ud)) continue;  // overflows anyway
        teeth += pmax > (dt == ZPP_FLOAT16 ? 65504.0 : std::ldexp(1.0, 126));
        // fp32 additions (n of them, each 2^-24 of at most mag), the
        // partials' rounding (bf16: u_d of at most mag), the last rounding.
        double got = load(out.data(), e, dt);
        double bound = 2.0 * n * std::ldexp(mag, -24) +
                       (dt == ZPP_BFLOAT16 ? ud * mag : 0.0) +
                       ud * (1.0 + 2.0 * ud) * std::fabs(total) + std::ldexp(1.0, -24);
        if (!(std::isfinite(got) && std::fabs(got - total) <= bound) && bad++ < 3)
          ADD_FAILURE() << tag(g, "reduce_scatter of large partials", count, dt)
                        << " element " << e << ": " << got << ", float64 sum " << total
                        << ", bound " << bound << ", largest node partial " << pmax;
      }
      if (hier_group(m)) {  // the case exists on this layout
        EXPECT_GT(teeth, 0) << tag(g, "reduce_scatter of large partials", count, dt);
      }
    }
  }
}

TEST(Ops, AllreduceEqualsReduceScatterShards) {
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    for (zpp_dtype_t dt : {ZPP_FLOAT32, ZPP_FLOAT16, ZPP_BFLOAT16}) {
      size_t es = zpp_dtype_size(dt);
      for (size_t count : {(size_t)1, (size_t)n + 1, (size_t)7 * n, (size_t)1001}) {
        for (int inplace = 0; inplace < 2; inplace++) {
          uint64_t salt = 1300 + count + 31 * g + 1000 * dt;
          std::vector<uint8_t> in = floats_of(salt, g_rank, count, dt);
          std::vector<uint8_t> out(count * es + 1, 0xEE);
          const void *send = in.data();
          if (inplace) {
            std::memcpy(out.data(), in.data(), count * es);
            send = out.data();
          }
          zpp_comm_reset_stats(g_comm);
          ASSERT_EQ(blocking_allreduce(T(), g, send, out.data(), count, dt,
                                            ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr),
                    ZPP_OK)
              << zpp_comm_get_last_error(g_comm);
          std::vector<uint8_t> ref = expected_sum(salt, m, count, dt, 0, count);
          EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), count * es))
              << tag(g, "allreduce", count, dt) << (inplace ? " in place" : "");
          EXPECT_EQ(out[count * es], 0xEE);
          // Bytes: a reduce-scatter of balanced shards, then an
          // allgatherv of the reduced shards.
          std::vector<uint64_t> blk(n);
          for (int j = 0; j < n; j++) blk[j] = (count / n + ((size_t)j < count % n)) * es;
          expect_bytes(rs_bytes(m, blk, wire_of(dt)) + ring_bytes(g, blk), stats(),
                       tag(g, "allreduce", count, dt));
          // Where the shards are equal, allreduce's slice is reduce_scatter's
          // shard bit for bit.
          if (count % n == 0 && !inplace) {
            size_t c = count / n;
            std::vector<uint8_t> rs(c * es + 1);
            ASSERT_EQ(blocking_reduce_scatter(T(), g, in.data(), rs.data(), c, dt,
                                                   ZPP_REDUCE_SUM, ZPP_MEMORY_HOST,
                                                   nullptr), ZPP_OK);
            EXPECT_EQ(0, std::memcmp(rs.data(), out.data() + me * c * es, c * es))
                << tag(g, "allreduce vs reduce_scatter", count, dt);
          }
        }
      }
    }
  }
}

TEST(Ops, BarrierCountsACallAndNoBytes) {
  for (zpp_group_t g : kGroups) {
    zpp_comm_reset_stats(g_comm);
    ASSERT_EQ(blocking_barrier(T(), g), ZPP_OK) << zpp_comm_get_last_error(g_comm);
    zpp_comm_stats_t s = stats();
    EXPECT_EQ(s.calls[g], 1u);
    expect_bytes(Bytes(), s, tag(g, "barrier", 0));
  }
}

// Transfers to a rank on another node go in messages of at most
// ZPP_NET_SEGMENT bytes (docs/design.md): set, on every layout; unset, on
// real nodes only (65408), whole on an emulated topology.  The messages are
// watched at MPI_Isend; the receives cut alike, or the data checks of the
// other Ops tests fail.
TEST(Ops, InterNodeTransfersAreCutAtTheNetSegment) {
  if (g_backend != "mpi") GTEST_SKIP() << "the MPI transport's messages";
  const char *e = std::getenv("ZPP_NET_SEGMENT");
  long seg = e != nullptr && *e != '\0' ? std::atol(e) : g_layout.emulated ? 0 : 65408;
  // The pairwise all-to-all sends each block straight to its member: a
  // transfer of B bytes per peer, more than two segments (and more than
  // 4096, the smallest, when whole).
  const size_t B = 2 * (size_t)std::max(seg, 4096L) + 5;
  std::vector<uint8_t> in(B * g_size), out(B * g_size);
  for (int r = 0; r < g_size; r++)
    std::memcpy(in.data() + r * B, bytes_of(7000 + r, g_rank, B).data(), B);
  {
    std::lock_guard<std::mutex> l(g_isend_mu);
    g_isend.clear();
    g_isend_watch = true;
  }
  zpp_status_t st = blocking_alltoall(T(), ZPP_GROUP_WORLD, in.data(), B, out.data(),
                                           ZPP_MEMORY_HOST, nullptr);
  std::vector<std::pair<int, long>> sent;
  {
    std::lock_guard<std::mutex> l(g_isend_mu);
    g_isend_watch = false;
    sent.swap(g_isend);
  }
  ASSERT_EQ(st, ZPP_OK) << zpp_comm_get_last_error(g_comm);
  for (int r = 0; r < g_size; r++)
    EXPECT_EQ(0, std::memcmp(out.data() + r * B, bytes_of(7000 + g_rank, r, B).data(), B))
        << "block from " << r;
  // Expected: per peer on another node ceil(B / seg) messages (seg, ...,
  // the rest), one of B bytes when whole; per peer on this node one.
  std::vector<std::vector<long>> want(g_size), got(g_size);
  for (int r = 0; r < g_size; r++) {
    if (r == g_rank) continue;
    size_t left = B;
    bool net = g_layout.node_of[r] != g_layout.node_of[g_rank];
    do {
      size_t b = net && seg > 0 && left > (size_t)seg ? (size_t)seg : left;
      want[r].push_back((long)b);
      left -= b;
    } while (left > 0);
  }
  for (auto &m : sent) {
    ASSERT_GE(m.first, 0);
    ASSERT_LT(m.first, g_size);
    got[m.first].push_back(m.second);
  }
  for (int r = 0; r < g_size; r++)
    EXPECT_EQ(got[r], want[r]) << "messages to rank " << r << " (ZPP_NET_SEGMENT "
                               << (e != nullptr ? e : "unset") << ", " << B << " bytes)";
}

// The host scratch cache (src/transport/scratch.c), on a fresh
// communicator so that nothing else filled it: 64-byte aligned buffers,
// best fit among the kept ones, the bytes kept counted exactly, and
// ZPP_SCRATCH_CACHE_MB respected (a buffer over it is freed, a smaller one
// makes room by dropping the smallest kept ones).  Local to each rank.
TEST(Scratch, BestFitReuseAndTheCacheLimit) {
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, &c), ZPP_OK) << zpp_get_last_error();
  zpp_transport_t *t = zpp_comm_transport(c);
  ASSERT_EQ(zpp_scratch_cached_bytes(t), 0u);
  void *a = zpp_scratch_get(t, 1000), *b = zpp_scratch_get(t, 5000);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ((uintptr_t)a % 64, 0u);
  EXPECT_EQ((uintptr_t)b % 64, 0u);
  std::memset(a, 0xa5, 1000);  // the whole size is usable (ASan checks it)
  std::memset(b, 0x5a, 5000);
  EXPECT_EQ(zpp_scratch_cached_bytes(t), 0u);  // nothing kept while in use
  zpp_scratch_put(t, b);  // the larger first: a first fit would hand it out
  EXPECT_EQ(zpp_scratch_cached_bytes(t), 5000u);
  zpp_scratch_put(t, a);
  EXPECT_EQ(zpp_scratch_cached_bytes(t), 6000u);
  // best fit: 800 bytes take the 1000-byte buffer, the next the 5000 one
  void *x = zpp_scratch_get(t, 800);
  EXPECT_EQ(x, a);
  EXPECT_EQ(zpp_scratch_cached_bytes(t), 5000u);
  void *y = zpp_scratch_get(t, 800);
  EXPECT_EQ(y, b);
  EXPECT_EQ(zpp_scratch_cached_bytes(t), 0u);
  zpp_scratch_put(t, x);
  zpp_scratch_put(t, y);
  EXPECT_EQ(zpp_scratch_cached_bytes(t), 6000u);  // their capacities, not 800
  {
    ScopedEnv mb("ZPP_SCRATCH_CACHE_MB", "1", zpp_settings_reload);
    const size_t mib = (size_t)1 << 20;
    void *big = zpp_scratch_get(t, 2 * mib);  // over the limit: freed on put
    ASSERT_NE(big, nullptr);
    zpp_scratch_put(t, big);
    EXPECT_EQ(zpp_scratch_cached_bytes(t), 6000u);
    void *h1 = zpp_scratch_get(t, 600 * 1024), *h2 = zpp_scratch_get(t, 700 * 1024);
    ASSERT_NE(h1, nullptr);
    ASSERT_NE(h2, nullptr);
    zpp_scratch_put(t, h1);  // 6000 + 600 KiB <= 1 MiB: kept
    EXPECT_EQ(zpp_scratch_cached_bytes(t), 6000u + 600 * 1024);
    zpp_scratch_put(t, h2);  // drops the smallest until 700 KiB fit
    EXPECT_EQ(zpp_scratch_cached_bytes(t), (size_t)700 * 1024);
  }
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);  // frees what is kept (LSan)
}

// Summed over ranks, a world allgather of B bytes puts (n-1) * B * nnodes
// bytes on the network when nnodes > 1 on the ring (it crosses each node
// boundary once, so the boundary ranks carry it all), n * (nnodes-1) * B
// hierarchically, where every rank sends exactly (nnodes-1) * B across: the
// least any rank can send.  Every byte sent is received on the same class.
TEST(Stats, WorldTotalsFollowTheFormulas) {
  const size_t B = 1024;
  std::vector<uint8_t> in = bytes_of(42, g_rank, B), out(B * g_size);
  zpp_comm_reset_stats(g_comm);
  ASSERT_EQ(blocking_allgather(T(), ZPP_GROUP_WORLD, in.data(), B, out.data(),
                                    ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  zpp_comm_stats_t s = stats();
  uint64_t mine[4] = {s.intra_bytes_sent, s.intra_bytes_recv, s.inter_bytes_sent,
                      s.inter_bytes_recv}, sum[4];
  MPI_Allreduce(mine, sum, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  uint64_t n = (uint64_t)g_size, nn = (uint64_t)g_layout.nnodes;
  bool hier = hier_group(members(ZPP_GROUP_WORLD, g_rank));
  EXPECT_EQ(sum[2], nn == 1 ? 0 : hier ? n * (nn - 1) * B : (n - 1) * B * nn);
  EXPECT_EQ(sum[0] + sum[2], (n - 1) * B * n);
  uint64_t most = 0;
  MPI_Allreduce(&s.inter_bytes_sent, &most, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (hier) {
    EXPECT_EQ(most, (nn - 1) * B) << "the busiest rank's inter-node bytes";
  }
  EXPECT_EQ(sum[0], sum[1]);
  EXPECT_EQ(sum[2], sum[3]);
  ASSERT_EQ(zpp_comm_reset_stats(g_comm), ZPP_OK);
  s = stats();
  EXPECT_EQ(s.inter_bytes_sent + s.intra_bytes_sent + s.calls[0], 0u);
}

TEST(Stats, OlderSmallerStructGetsItsLeadingFields) {
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  s.struct_size = offsetof(zpp_comm_stats_t, calls);
  s.calls[0] = 777;
  ASSERT_EQ(zpp_comm_get_stats(g_comm, &s), ZPP_OK);
  EXPECT_EQ(s.calls[0], 777u) << "wrote past struct_size";
  s.struct_size = 3;
  EXPECT_EQ(zpp_comm_get_stats(g_comm, &s), ZPP_ERR_INVALID_ARGUMENT);
}

// The collectives layer calls the transport from a progress thread.
TEST(Threads, OperationsFromAnotherThread) {
  const size_t B = 512;
  std::vector<uint8_t> in = bytes_of(77, g_rank, B), out(B * g_size);
  zpp_status_t st = ZPP_ERR_INTERNAL;
  std::thread th([&] {
    st = blocking_allgather(T(), ZPP_GROUP_WORLD, in.data(), B, out.data(),
                                 ZPP_MEMORY_HOST, nullptr);
  });
  th.join();
  ASSERT_EQ(st, ZPP_OK);
  for (int r = 0; r < g_size; r++)
    EXPECT_EQ(0, std::memcmp(out.data() + r * B, bytes_of(77, r, B).data(), B));
}

// ---- non-blocking operations (zpp_xfer_start / zpp_xop_*) -----------------

namespace {
int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock zpp's emulation uses
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// Tests every op of `ops` (last started first) until all are done; fails
// after `limit_s` instead of hanging.
void test_all(std::vector<zpp_xop_t *> &ops, zpp_comm_t c, double limit_s = 60) {
  int64_t until = mono_ns() + (int64_t)(limit_s * 1e9);
  std::vector<int> done(ops.size(), 0);
  size_t left = ops.size();
  while (left > 0) {
    ASSERT_LT(mono_ns(), until) << left << " ops not done";
    for (size_t i = ops.size(); i-- > 0;) {
      if (done[i]) continue;
      int d = 0;
      ASSERT_EQ(zpp_xop_test(ops[i], &d), ZPP_OK) << "op " << i << ": "
                                                  << zpp_comm_get_last_error(c);
      if (d) { done[i] = 1; left--; }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}
}  // namespace

// Eight operations in flight at once on the three groups -- three of them
// on the same pairs of ranks (WORLD) -- started in one order and completed
// in the reverse: each output equals the reference and the blocking call's,
// bit for bit, and the counters are the sum of the per-op formulas.
TEST(Xop, SeveralInFlightEqualTheBlockingCalls) {
  const zpp_group_t W = ZPP_GROUP_WORLD, N = ZPP_GROUP_NODE, C = ZPP_GROUP_CROSS;
  std::vector<int> mw = members(W, g_rank), mn = members(N, g_rank),
                   mc = members(C, g_rank);
  int nw = (int)mw.size(), nn = (int)mn.size(), nc = (int)mc.size();
  int iw = index_of(mw, g_rank), in = index_of(mn, g_rank), ic = index_of(mc, g_rank);
  const size_t B1 = 1007, B2 = 65539, B3 = 4099, RS = 333, AR = 1001;
  const zpp_dtype_t bf = ZPP_BFLOAT16, hf = ZPP_FLOAT16;
  // Inputs.
  std::vector<uint8_t> a_in = bytes_of(4001, g_rank, B1), b_in = bytes_of(4002, g_rank, B2),
                       c_in = bytes_of(4003, g_rank, nw * B3);
  std::vector<size_t> d_cnt(nn);
  size_t d_tot = 0;
  for (int i = 0; i < nn; i++) d_tot += d_cnt[i] = (size_t)(mn[i] * 131 % 997) + (i % 2 ? 0 : 17);
  std::vector<uint8_t> d_in = bytes_of(4004, g_rank, d_cnt[in]);
  std::vector<uint8_t> e_in = floats_of(4005, g_rank, nc * RS, bf);
  std::vector<uint8_t> f_in = floats_of(4006, g_rank, AR, hf);
  auto gsize = [](int i, int j) { return (size_t)((i * 5 + j * 3) % 4 == 0 ? 0 : 100 + i * 37 + j); };
  std::vector<size_t> g_sc(nn), g_rc(nn);
  size_t g_st = 0, g_rt = 0;
  for (int j = 0; j < nn; j++) { g_st += g_sc[j] = gsize(mn[in], mn[j]); g_rt += g_rc[j] = gsize(mn[j], mn[in]); }
  std::vector<uint8_t> g_in = bytes_of(4007, g_rank, g_st);
  // Outputs (one guard byte each).
  std::vector<uint8_t> a_out(nw * B1 + 1, 0xEE), b_out(nw * B2 + 1, 0xEE),
      c_out(nw * B3 + 1, 0xEE), d_out(d_tot + 1, 0xEE), e_out(RS * 2 + 1, 0xEE),
      f_out(AR * 2 + 1, 0xEE), g_out(g_rt + 1, 0xEE);

  zpp_comm_reset_stats(g_comm);
  std::vector<zpp_xop_t *> ops(8, nullptr);
  zpp_transport_t *t = T();
  uint64_t moved = zpp_transport_progress(t);
  ASSERT_EQ(start_allgather(t, W, a_in.data(), B1, a_out.data(), ZPP_MEMORY_HOST, nullptr, &ops[0]), ZPP_OK);
  ASSERT_EQ(start_allgather(t, W, b_in.data(), B2, b_out.data(), ZPP_MEMORY_HOST, nullptr, &ops[1]), ZPP_OK);
  ASSERT_EQ(start_alltoall(t, W, c_in.data(), B3, c_out.data(), ZPP_MEMORY_HOST, nullptr, &ops[2]), ZPP_OK);
  ASSERT_EQ(start_allgatherv(t, N, d_in.data(), d_out.data(), d_cnt.data(), nullptr, ZPP_MEMORY_HOST, nullptr, &ops[3]), ZPP_OK);
  ASSERT_EQ(start_reduce_scatter(t, C, e_in.data(), e_out.data(), RS, bf, ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr, &ops[4]), ZPP_OK);
  ASSERT_EQ(start_allreduce(t, W, f_in.data(), f_out.data(), AR, hf, ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr, &ops[5]), ZPP_OK);
  ASSERT_EQ(start_alltoallv(t, N, g_in.data(), g_sc.data(), nullptr, g_out.data(), g_rc.data(), nullptr, ZPP_MEMORY_HOST, nullptr, &ops[6]), ZPP_OK);
  ASSERT_EQ(start_barrier(t, C, &ops[7]), ZPP_OK);
  // The argument arrays are copied at start: scribbling on them is harmless.
  std::vector<size_t> d_keep = d_cnt, g_sk = g_sc, g_rk = g_rc;
  std::fill(d_cnt.begin(), d_cnt.end(), 0);
  std::fill(g_sc.begin(), g_sc.end(), 0);
  std::fill(g_rc.begin(), g_rc.end(), 0);
  test_all(ops, g_comm);
  for (zpp_xop_t *op : ops) zpp_xop_free(op);
  zpp_comm_stats_t s = stats();
  if (nw > 1) {
    EXPECT_GT(zpp_transport_progress(t), moved) << "transfers completed unseen";
  }
  d_cnt = d_keep; g_sc = g_sk; g_rc = g_rk;

  // References, as in the Ops.* tests.
  for (int i = 0; i < nw; i++) {
    EXPECT_EQ(0, std::memcmp(a_out.data() + i * B1, bytes_of(4001, mw[i], B1).data(), B1)) << "a block " << i;
    EXPECT_EQ(0, std::memcmp(b_out.data() + i * B2, bytes_of(4002, mw[i], B2).data(), B2)) << "b block " << i;
    EXPECT_EQ(0, std::memcmp(c_out.data() + i * B3, bytes_of(4003, mw[i], nw * B3).data() + iw * B3, B3)) << "c from " << i;
  }
  for (int i = 0, o = 0; i < nn; o += (int)d_cnt[i], i++)
    EXPECT_EQ(0, std::memcmp(d_out.data() + o, bytes_of(4004, mn[i], d_cnt[i]).data(), d_cnt[i])) << "d block " << i;
  std::vector<uint8_t> e_ref = expected_sum(4005, mc, nc * RS, bf, ic * RS, RS);
  EXPECT_EQ(0, std::memcmp(e_out.data(), e_ref.data(), RS * 2)) << "reduce_scatter";
  std::vector<uint8_t> f_ref = expected_sum(4006, mw, AR, hf, 0, AR);
  EXPECT_EQ(0, std::memcmp(f_out.data(), f_ref.data(), AR * 2)) << "allreduce";
  for (int i = 0, o = 0; i < nn; o += (int)g_rc[i], i++) {
    size_t from = 0;  // offset of my block in member i's packed send
    for (int j = 0; j < in; j++) from += gsize(mn[i], mn[j]);
    size_t tot = 0;
    for (int j = 0; j < nn; j++) tot += gsize(mn[i], mn[j]);
    EXPECT_EQ(0, std::memcmp(g_out.data() + o, bytes_of(4007, mn[i], tot).data() + from, g_rc[i])) << "g from " << i;
  }
  for (auto *v : {&a_out, &b_out, &c_out, &d_out, &g_out}) EXPECT_EQ(v->back(), 0xEE);
  EXPECT_EQ(e_out[RS * 2], 0xEE);
  EXPECT_EQ(f_out[AR * 2], 0xEE);

  // Counters: the sum of each op's formula.
  Bytes want = ring_bytes(W, std::vector<uint64_t>(nw, B1)) + ring_bytes(W, std::vector<uint64_t>(nw, B2)) +
               ring_bytes(N, std::vector<uint64_t>(d_cnt.begin(), d_cnt.end()));
  for (int i = 0; i < nw; i++) want.add(mw[i], B3, B3);
  want = want + rs_bytes(mc, std::vector<uint64_t>(nc, RS * 2));
  std::vector<uint64_t> blk(nw);
  for (int j = 0; j < nw; j++) blk[j] = (AR / nw + ((size_t)j < AR % nw)) * 2;
  want = want + rs_bytes(mw, blk, wire_of(hf)) + ring_bytes(W, blk);
  for (int j = 0; j < nn; j++) want.add(mn[j], g_sc[j], g_rc[j]);
  expect_bytes(want, s, "eight ops in flight");
  EXPECT_EQ(s.calls[W], 4u);
  EXPECT_EQ(s.calls[N], 2u);
  EXPECT_EQ(s.calls[C], 2u);

  // The blocking calls give the same bits.
  std::vector<uint8_t> x(nw * B2 + 1, 0xEE);
  ASSERT_EQ(blocking_allgather(t, W, b_in.data(), B2, x.data(), ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  EXPECT_EQ(x, b_out);
  x.assign(nw * B3 + 1, 0xEE);
  ASSERT_EQ(blocking_alltoall(t, W, c_in.data(), B3, x.data(), ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  EXPECT_EQ(x, c_out);
  x.assign(RS * 2 + 1, 0xEE);
  ASSERT_EQ(blocking_reduce_scatter(t, C, e_in.data(), x.data(), RS, bf, ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  EXPECT_EQ(x, e_out);
  x.assign(AR * 2 + 1, 0xEE);
  ASSERT_EQ(blocking_allreduce(t, W, f_in.data(), x.data(), AR, hf, ZPP_REDUCE_SUM, ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  EXPECT_EQ(x, f_out);
  x.assign(g_rt + 1, 0xEE);
  ASSERT_EQ(blocking_alltoallv(t, N, g_in.data(), g_sc.data(), nullptr, x.data(), g_rc.data(), nullptr, ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  EXPECT_EQ(x, g_out);
}

// Two ops on one group started back to back, the second completed first:
// their messages never match each other's (tags from the group sequence).
TEST(Xop, TwoOnOnePairCompleteInEitherOrder) {
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size();
    const size_t B = 3001;
    std::vector<uint8_t> in1 = bytes_of(4101 + g, g_rank, B), in2 = bytes_of(4201 + g, g_rank, B);
    std::vector<uint8_t> o1(n * B), o2(n * B);
    zpp_xop_t *x1 = nullptr, *x2 = nullptr;
    ASSERT_EQ(start_allgather(T(), g, in1.data(), B, o1.data(), ZPP_MEMORY_HOST, nullptr, &x1), ZPP_OK);
    ASSERT_EQ(start_allgather(T(), g, in2.data(), B, o2.data(), ZPP_MEMORY_HOST, nullptr, &x2), ZPP_OK);
    ASSERT_EQ(xop_wait(T(), x2), ZPP_OK) << zpp_comm_get_last_error(g_comm);
    ASSERT_EQ(xop_wait(T(), x1), ZPP_OK) << zpp_comm_get_last_error(g_comm);
    zpp_xop_free(x1);
    zpp_xop_free(x2);
    for (int i = 0; i < n; i++) {
      EXPECT_EQ(0, std::memcmp(o1.data() + i * B, bytes_of(4101 + g, m[i], B).data(), B)) << tag(g, "first", B);
      EXPECT_EQ(0, std::memcmp(o2.data() + i * B, bytes_of(4201 + g, m[i], B).data(), B)) << tag(g, "second", B);
    }
  }
}

// zpp_xop_test never waits for a peer: rank 0 starts, tests (not done:
// the others have not started) and only then lets the others start.  A
// test that blocked would deadlock here until the communicator's timeout.
TEST(Xop, TestReturnsWhileThePeersAreLate) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 30;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK) << zpp_get_last_error();
  zpp_transport_t *t = zpp_comm_transport(c);
  const size_t B = 777;
  std::vector<uint8_t> in = bytes_of(4301, g_rank, B), out(g_size * B);
  for (int p2p = 0; p2p < 2; p2p++) {
    zpp_transport_set_p2p_barrier(t, p2p);
    for (int kind = 0; kind < 2; kind++) {  // allgather, barrier
      char go = 1;
      zpp_xop_t *op = nullptr;
      auto start = [&] {
        return kind == 0 ? start_allgather(t, ZPP_GROUP_WORLD, in.data(), B,
                                                         out.data(), ZPP_MEMORY_HOST,
                                                         nullptr, &op)
                         : start_barrier(t, ZPP_GROUP_WORLD, &op);
      };
      if (g_rank == 0) {
        ASSERT_EQ(start(), ZPP_OK);
        int done = 1;
        for (int k = 0; k < 3; k++) {
          ASSERT_EQ(zpp_xop_test(op, &done), ZPP_OK);
          EXPECT_EQ(done, 0) << (kind ? "barrier" : "allgather") << " done without its peers"
                             << (p2p ? " (p2p barrier)" : "");
        }
        EXPECT_EQ(zpp_xop_wake_ns(op), 0) << "no emulated deadline is pending";
        for (int r = 1; r < g_size; r++) MPI_Send(&go, 1, MPI_CHAR, r, 99, MPI_COMM_WORLD);
      } else {
        MPI_Recv(&go, 1, MPI_CHAR, 0, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        ASSERT_EQ(start(), ZPP_OK);
      }
      ASSERT_EQ(xop_wait(t, op), ZPP_OK) << zpp_comm_get_last_error(c);
      int done = 0;
      EXPECT_EQ(zpp_xop_test(op, &done), ZPP_OK);
      EXPECT_EQ(done, 1);
      zpp_xop_free(op);
      if (kind == 0) {
        for (int r = 0; r < g_size; r++)
          EXPECT_EQ(0, std::memcmp(out.data() + r * B, bytes_of(4301, r, B).data(), B));
      }
    }
  }
  zpp_comm_destroy(c);
}

// The dissemination barrier (backends without a barrier of their own)
// counts a call and no bytes, on every group.
TEST(Xop, DisseminationBarrierCountsNoBytes) {
  zpp_transport_set_p2p_barrier(T(), 1);
  for (zpp_group_t g : kGroups) {
    zpp_comm_reset_stats(g_comm);
    for (int k = 0; k < 3; k++)
      ASSERT_EQ(blocking_barrier(T(), g), ZPP_OK) << zpp_comm_get_last_error(g_comm);
    zpp_comm_stats_t s = stats();
    EXPECT_EQ(s.calls[g], 3u);
    expect_bytes(Bytes(), s, tag(g, "p2p barrier", 0));
  }
  zpp_transport_set_p2p_barrier(T(), 0);
}

// An op whose peers never start: the test that sees the timeout returns
// ZPP_ERR_TIMEOUT once, naming the group; the transport is then broken.
TEST(Xop, TimeoutNamesTheGroupAndBreaksTheTransport) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 0.5;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  zpp_transport_t *t = zpp_comm_transport(c);
  // Rank 0's first group (CROSS, NODE, WORLD) with a peer.
  zpp_group_t g = ZPP_GROUP_WORLD;
  for (zpp_group_t h : {ZPP_GROUP_CROSS, ZPP_GROUP_NODE})
    if (members(h, 0).size() > 1) { g = h; break; }
  if (g_rank == 0 && members(g, 0).size() > 1) {
    const size_t B = 64;
    std::vector<uint8_t> in(B, 1), out(B * g_size);
    zpp_xop_t *op = nullptr;
    ASSERT_EQ(start_allgather(t, g, in.data(), B, out.data(),
                                            ZPP_MEMORY_HOST, nullptr, &op), ZPP_OK);
    zpp_status_t st = ZPP_OK;
    int done = 0;
    int64_t t0 = mono_ns();
    while (st == ZPP_OK && !done && mono_ns() - t0 < 10000000000LL) {
      st = zpp_xop_test(op, &done);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(st, ZPP_ERR_TIMEOUT);
    std::string msg = zpp_comm_get_last_error(c);
    EXPECT_NE(msg.find(std::string("group ") + zpp_group_name(g)), std::string::npos) << msg;
    EXPECT_NE(msg.find("ZPP_TIMEOUT_S"), std::string::npos) << msg;
    // UCX names the transfers it waited for, among them the receive from
    // my predecessor in the (first) ring, whose send never came.  The MPI
    // backend does not list them.
    if (g_backend == "ucx") {
      std::vector<int> m = members(g, 0), base = ring(g, 0);
      int n = (int)m.size(), pos = index_of(base, index_of(m, 0));
      int pred = m[base[(pos - 1 + n) % n]];
      EXPECT_NE(msg.find("of transfers "), std::string::npos) << msg;
      EXPECT_NE(msg.find("from " + std::to_string(pred)), std::string::npos)
          << msg << " (predecessor: rank " << pred << ")";
    }
    EXPECT_GE((mono_ns() - t0) * 1e-9, 0.45) << "timed out before the timeout";
    // Returned once; the op is then done.
    EXPECT_EQ(zpp_xop_test(op, &done), ZPP_OK);
    EXPECT_EQ(done, 1);
    zpp_xop_free(op);
    zpp_xop_t *again = nullptr;
    EXPECT_EQ(start_barrier(t, ZPP_GROUP_WORLD, &again), ZPP_ERR_TIMEOUT);
    EXPECT_EQ(again, nullptr);
    EXPECT_NE(std::string(zpp_comm_get_last_error(c)).find("aborted earlier"), std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  zpp_comm_destroy(c);
}

// Freeing an op in flight cancels it and breaks the transport (its peers
// could not complete without it).
TEST(Xop, FreeInFlightBreaksTheTransport) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 5;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  zpp_transport_t *t = zpp_comm_transport(c);
  if (g_rank == 0) {
    std::vector<uint8_t> in(32, 1), out(32 * g_size);
    zpp_xop_t *op = nullptr;
    ASSERT_EQ(start_allgather(t, ZPP_GROUP_WORLD, in.data(), 32, out.data(),
                                            ZPP_MEMORY_HOST, nullptr, &op), ZPP_OK);
    zpp_xop_free(op);
    EXPECT_EQ(blocking_barrier(t, ZPP_GROUP_WORLD), ZPP_ERR_TIMEOUT);
    EXPECT_NE(std::string(zpp_comm_get_last_error(c)).find("freed while in flight"),
              std::string::npos) << zpp_comm_get_last_error(c);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  zpp_comm_destroy(c);
}

// Ranks that pass different sizes for one transfer: the receiver fails
// with ZPP_ERR_MISMATCH naming the sender, on both backends, whether the
// message is shorter than its receive (MPI completes it quietly: the rest
// of the buffer kept its old bytes) or longer (truncated).  Rank 0 expects
// `delta` more bytes from rank 1 than rank 1 sends.
TEST(Xop, RanksPassingDifferentSizesFailWithMismatch) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int delta : {8, -8}) {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.timeout_s = 2;  // bounds any wait of the others on rank 0
    zpp_comm_t c = nullptr;
    ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
    zpp_transport_t *t = zpp_comm_transport(c);
    auto len = [](int s, int d) { return (size_t)(32 + s + 2 * d); };
    std::vector<size_t> sb(g_size), rb(g_size);
    for (int j = 0; j < g_size; j++) {
      sb[j] = len(g_rank, j);
      rb[j] = len(j, g_rank) + (g_rank == 0 && j == 1 ? delta : 0);
    }
    std::vector<uint8_t> in(64 * g_size, 7), out(64 * g_size + 64, 0);
    std::vector<size_t> displs(g_size);
    for (int j = 0; j < g_size; j++) displs[j] = 64 * (size_t)j;
    zpp_status_t st = blocking_alltoallv(t, ZPP_GROUP_WORLD, in.data(), sb.data(),
                                              displs.data(), out.data(), rb.data(),
                                              displs.data(), ZPP_MEMORY_HOST, nullptr);
    if (g_rank == 0) {
      std::string msg = zpp_comm_get_last_error(c);
      EXPECT_EQ(st, ZPP_ERR_MISMATCH) << "delta " << delta << ": " << msg;
      EXPECT_NE(msg.find("rank 1 sent"), std::string::npos) << msg;
      EXPECT_NE(msg.find("different sizes"), std::string::npos) << msg;
      EXPECT_EQ(blocking_barrier(t, ZPP_GROUP_WORLD), ZPP_ERR_MISMATCH)
          << "the communicator is not aborted";
    } else {
      EXPECT_TRUE(st == ZPP_OK || st == ZPP_ERR_TIMEOUT || st == ZPP_ERR_MISMATCH)
          << zpp_status_string(st) << ": " << zpp_comm_get_last_error(c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    zpp_comm_destroy(c);
  }
}

TEST(Xop, NullArgumentsAreNamed) {
  std::vector<uint8_t> buf(8 * g_size);
  EXPECT_EQ(start_allgather(T(), ZPP_GROUP_WORLD, buf.data(), 8, buf.data(),
                                          ZPP_MEMORY_HOST, nullptr, nullptr),
            ZPP_ERR_NULL_POINTER);
  EXPECT_NE(std::string(zpp_comm_get_last_error(g_comm)).find("op is NULL"), std::string::npos);
  zpp_xop_t *op = nullptr;
  EXPECT_EQ(start_allgather(T(), ZPP_GROUP_WORLD, nullptr, 8, buf.data(),
                                          ZPP_MEMORY_HOST, nullptr, &op),
            ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(op, nullptr);
  EXPECT_NE(std::string(zpp_comm_get_last_error(g_comm)).find("send is NULL"), std::string::npos);
  int done = 0;
  EXPECT_EQ(zpp_xop_test(nullptr, &done), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_xop_wake_ns(nullptr), 0);
  zpp_xop_free(nullptr);
}

// ---- errors -------------------------------------------------------------------

namespace {
double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // shared by all ranks of the machine
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double cpu_s() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}
}  // namespace

// Neither an idle communicator nor a rank waiting for a late peer keeps a
// core busy.  The wait is the library's own: a blocking zpp_allgather runs
// its plan inline, and the executor (src/engine/run.c) sleeps between
// polls once ZPP_NET_SPIN_US (100 ms by default) passed without progress;
// that window alone is about 100 ms of the 0.3 x 800 ms allowed.
TEST(Threads, IdleAndLateWaitsUseLittleCpu) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  MPI_Barrier(MPI_COMM_WORLD);
  double c0 = cpu_s(), w0 = now_s();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  double idle_cpu = cpu_s() - c0, idle_wall = now_s() - w0;
  EXPECT_LT(idle_cpu, 0.1 * idle_wall) << "an idle process used CPU";
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(800));
  c0 = cpu_s();
  w0 = now_s();
  uint8_t mine = (uint8_t)g_rank;
  std::vector<uint8_t> all(g_size);
  EXPECT_EQ(zpp_allgather(g_comm, &mine, all.data(), 1, ZPP_UINT8, nullptr, nullptr), ZPP_OK)
      << zpp_comm_get_last_error(g_comm);
  double cpu = cpu_s() - c0, wall = now_s() - w0;
  for (int r = 0; r < g_size; r++) EXPECT_EQ(all[r], (uint8_t)r) << "rank " << r;
  if (g_rank == 0) {
    std::printf("[ wait ] rank 0 waited %.0f ms for late peers, %.0f ms CPU\n",
                wall * 1e3, cpu * 1e3);
    EXPECT_GE(wall, 0.5);
    // The spin window may use a core; the rest of the wait must not.
    double spin = zpp_setting_long("ZPP_NET_SPIN_US", 100000) * 1e-6;
    EXPECT_LT(cpu, spin + 0.3 * std::max(wall - spin, 0.0))
        << "waiting for a late peer burns CPU after the " << spin << " s spin window";
  }
}

TEST(Errors, BadArgumentsAreNamed) {
  std::vector<uint8_t> buf(64 * g_size);
  auto expect = [&](zpp_status_t got, zpp_status_t want, const char *needle) {
    EXPECT_EQ(got, want) << needle;
    std::string msg = zpp_comm_get_last_error(g_comm);
    EXPECT_NE(msg.find(needle), std::string::npos)
        << "message \"" << msg << "\" lacks \"" << needle << "\"";
  };
  zpp_comm_reset_stats(g_comm);
  expect(blocking_allgather(T(), ZPP_GROUP_WORLD, nullptr, 8, buf.data(),
                                 ZPP_MEMORY_HOST, nullptr),
         ZPP_ERR_NULL_POINTER, "send is NULL");
  expect(blocking_allgather(T(), (zpp_group_t)9, buf.data(), 8, buf.data(),
                                 ZPP_MEMORY_HOST, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "group 9");
  expect(blocking_alltoall(T(), ZPP_GROUP_NODE, buf.data(), 8, buf.data(),
                                (zpp_memory_t)5, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "mem 5");
  expect(blocking_reduce_scatter(T(), ZPP_GROUP_WORLD, buf.data(), buf.data(),
                                      1, (zpp_dtype_t)8, ZPP_REDUCE_SUM,
                                      ZPP_MEMORY_HOST, nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "dtype 8");
  expect(blocking_allreduce(T(), ZPP_GROUP_WORLD, buf.data(), buf.data(), 1,
                                 ZPP_FLOAT32, (zpp_reduce_op_t)3, ZPP_MEMORY_HOST,
                                 nullptr),
         ZPP_ERR_INVALID_ARGUMENT, "op 3");
  expect(blocking_allreduce(T(), ZPP_GROUP_WORLD, buf.data(), buf.data(),
                                 SIZE_MAX / 2, ZPP_FLOAT32, ZPP_REDUCE_SUM,
                                 ZPP_MEMORY_HOST, nullptr),
         ZPP_ERR_OVERFLOW, "count");
  expect(blocking_allgatherv(T(), ZPP_GROUP_WORLD, buf.data(), buf.data(),
                                  nullptr, nullptr, ZPP_MEMORY_HOST, nullptr),
         ZPP_ERR_NULL_POINTER, "recv_bytes is NULL");
  expect(blocking_alltoallv(T(), ZPP_GROUP_WORLD, buf.data(), nullptr, nullptr,
                                 buf.data(), nullptr, nullptr, ZPP_MEMORY_HOST,
                                 nullptr),
         ZPP_ERR_NULL_POINTER, "send_bytes is NULL");
  int x;
  expect(zpp_comm_node_of(g_comm, g_size, &x), ZPP_ERR_INVALID_ARGUMENT, "rank");
  expect(zpp_comm_node_size(g_comm, -1, &x), ZPP_ERR_INVALID_ARGUMENT, "node -1");
  expect(zpp_comm_rank(g_comm, nullptr), ZPP_ERR_NULL_POINTER, "rank is NULL");
  EXPECT_EQ(zpp_comm_rank(nullptr, &x), ZPP_ERR_NULL_POINTER);
  EXPECT_STREQ(zpp_comm_get_last_error(nullptr), "");
  EXPECT_EQ(zpp_comm_destroy(nullptr), ZPP_OK);
  // Rejected calls are not counted as calls.
  zpp_comm_stats_t s = stats();
  EXPECT_EQ(s.calls[0] + s.calls[1] + s.calls[2], 0u);
}

TEST(Errors, BadConfigsAreNamed) {
  zpp_comm_t c = nullptr;
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  auto bad = [&](zpp_status_t want, const char *needle) {
    c = nullptr;
    EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), want) << needle;
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::string(zpp_get_last_error()).find(needle), std::string::npos)
        << zpp_get_last_error();
    zpp_comm_destroy(c);
    cfg = ZPP_COMM_CONFIG_INIT;
  };
  cfg.struct_size = 8;
  bad(ZPP_ERR_INVALID_ARGUMENT, "struct_size");
  cfg.backend = ZPP_BACKEND_NCCL;
  bad(ZPP_ERR_INVALID_ARGUMENT, "needs cfg->memory ZPP_MEMORY_DEVICE");
  cfg.backend = (zpp_backend_t)17;
  bad(ZPP_ERR_INVALID_ARGUMENT, "cfg->backend 17");
  cfg.cuda_device = -2;
  bad(ZPP_ERR_INVALID_ARGUMENT, "cuda_device -2");
  std::string wrong = std::to_string(g_size + 1) + "x1";
  cfg.topology = wrong.c_str();
  bad(ZPP_ERR_INVALID_ARGUMENT, "describes");
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, nullptr), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_NULL, nullptr, &c), ZPP_ERR_INVALID_ARGUMENT);
}

// Ranks that disagree on the emulated layout all fail, none hangs.
TEST(Errors, RanksDisagreeingOnTheTopologyAllFail) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string a = "1x" + std::to_string(g_size), b = std::to_string(g_size) + "x1";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.topology = g_rank == 0 ? a.c_str() : b.c_str();
  zpp_comm_t c = nullptr;
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_ERR_MISMATCH);
  EXPECT_NE(std::string(zpp_get_last_error()).find("ZPP_TOPO"), std::string::npos);
  EXPECT_EQ(c, nullptr);
}

// An explicit backend in the config wins over ZPP_BACKEND, on the MPI
// bootstrap too (UCX's worker addresses travel over MPI then).
TEST(Config, ExplicitBackendIsUsed) {
  for (zpp_backend_t b : {ZPP_BACKEND_MPI, ZPP_BACKEND_UCX}) {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.backend = b;
    zpp_comm_t c = nullptr;
    ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK)
        << zpp_get_last_error();
    zpp_backend_t got = ZPP_BACKEND_AUTO;
    EXPECT_EQ(zpp_comm_backend(c, &got), ZPP_OK);
    EXPECT_EQ(got, b);
    EXPECT_STREQ(zpp_comm_bootstrap_name(c), "mpi");
    uint32_t mine = 0x5a000000u + (uint32_t)g_rank;
    std::vector<uint32_t> all(g_size, 0);
    EXPECT_EQ(blocking_allgather(zpp_comm_transport(c), ZPP_GROUP_WORLD, &mine, 4,
                                      all.data(), ZPP_MEMORY_HOST, nullptr),
              ZPP_OK)
        << zpp_comm_get_last_error(c);
    for (int r = 0; r < g_size; r++) EXPECT_EQ(all[r], 0x5a000000u + (uint32_t)r);
    EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  }
}

// cfg->algorithm takes precedence over ZPP_ALGO; both algorithms give the
// same all-gather bits, each with its own byte formula.
TEST(Config, AlgorithmFromTheConfigIsUsed) {
  for (zpp_algorithm_t al : {ZPP_ALGORITHM_FLAT, ZPP_ALGORITHM_HIER}) {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.algorithm = al;
    zpp_comm_t c = nullptr;
    ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK)
        << zpp_get_last_error();
    zpp_algorithm_t got = ZPP_ALGORITHM_DEFAULT;
    ASSERT_EQ(zpp_comm_algorithm(c, &got), ZPP_OK);
    EXPECT_EQ(got, al);
    bool keep = g_hier;
    g_hier = al == ZPP_ALGORITHM_HIER;  // the expectations of this comm
    std::vector<int> m = members(ZPP_GROUP_WORLD, g_rank);
    int n = (int)m.size();
    const size_t B = 777;
    std::vector<uint8_t> mine = bytes_of(7100, g_rank, B), out(n * B);
    zpp_comm_reset_stats(c);
    ASSERT_EQ(blocking_allgather(zpp_comm_transport(c), ZPP_GROUP_WORLD,
                                      mine.data(), B, out.data(), ZPP_MEMORY_HOST,
                                      nullptr), ZPP_OK);
    for (int i = 0; i < n; i++)
      EXPECT_EQ(0, std::memcmp(out.data() + i * B, bytes_of(7100, m[i], B).data(), B));
    zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
    zpp_comm_get_stats(c, &s);
    expect_bytes(ring_bytes(ZPP_GROUP_WORLD, std::vector<uint64_t>(n, B)), s,
                 al == ZPP_ALGORITHM_FLAT ? "flat allgather" : "hier allgather");
    g_hier = keep;
    EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  }
  zpp_comm_config_t bad = ZPP_COMM_CONFIG_INIT;
  bad.algorithm = (zpp_algorithm_t)7;
  zpp_comm_t c = nullptr;
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &bad, &c), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("cfg->algorithm 7"), std::string::npos)
      << zpp_get_last_error();
}

// ZPP_ALGORITHM_AUTO asked for in the config is taken as the setting
// ZPP_ALGO=auto is, and a split of such a communicator keeps it (the child
// is created with the parent's resolved setting).
TEST(Config, AutoFromTheConfigIsAcceptedAndSplitKeepsIt) {
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.algorithm = ZPP_ALGORITHM_AUTO;
  zpp_comm_t c = nullptr, half = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK) << zpp_get_last_error();
  zpp_algorithm_t got = ZPP_ALGORITHM_DEFAULT;
  ASSERT_EQ(zpp_comm_algorithm(c, &got), ZPP_OK);
  EXPECT_EQ(got, ZPP_ALGORITHM_AUTO);
  ASSERT_EQ(zpp_comm_split(c, g_rank % 2, g_rank, &half), ZPP_OK) << zpp_get_last_error();
  got = ZPP_ALGORITHM_DEFAULT;
  ASSERT_EQ(zpp_comm_algorithm(half, &got), ZPP_OK);
  EXPECT_EQ(got, ZPP_ALGORITHM_AUTO);
  EXPECT_EQ(zpp_comm_destroy(half), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
}

// A caller built against the header before `algorithm` was added passes
// the smaller struct: it is accepted, its fields are used (timeout_s,
// topology), and `algorithm` -- past its struct_size, here garbage --
// takes its default.  A struct_size below that layout is refused.
struct CommConfigV1 {  // zpp_comm_config_t up to timeout_s (zpp 0.1)
  size_t struct_size;
  zpp_backend_t backend;
  zpp_memory_t memory;
  int cuda_device;
  const char *topology;
  double timeout_s;
};
TEST(Config, OlderStructSizeIsAccepted) {
  static_assert(sizeof(CommConfigV1) < sizeof(zpp_comm_config_t), "layout");
  static_assert(offsetof(CommConfigV1, timeout_s) ==
                    offsetof(zpp_comm_config_t, timeout_s), "layout");
  union {
    CommConfigV1 v1;
    unsigned char raw[sizeof(zpp_comm_config_t) + 16];
  } u;
  std::memset(u.raw, 0x7f, sizeof u.raw);  // what lies past the old struct
  std::string spec = std::to_string(g_size) + "x1";
  u.v1.struct_size = sizeof(CommConfigV1);
  u.v1.backend = ZPP_BACKEND_MPI;
  u.v1.memory = ZPP_MEMORY_HOST;
  u.v1.cuda_device = -1;
  u.v1.topology = spec.c_str();
  u.v1.timeout_s = 37.5;
  const zpp_comm_config_t *cfg = reinterpret_cast<const zpp_comm_config_t *>(u.raw);
  EXPECT_EQ(zpp_comm_config_check(cfg), ZPP_OK) << zpp_get_last_error();
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, cfg, &c), ZPP_OK) << zpp_get_last_error();
  int nn = 0;
  zpp_comm_nnodes(c, &nn);
  EXPECT_EQ(nn, g_size) << "cfg->topology of the old struct";
  EXPECT_DOUBLE_EQ(zpp_transport_timeout_s(zpp_comm_transport(c)), 37.5)
      << "cfg->timeout_s of the old struct";
  // What ZPP_ALGORITHM_DEFAULT resolves to (ZPP_ALGO of this run).
  zpp_algorithm_t got = ZPP_ALGORITHM_DEFAULT;
  EXPECT_EQ(zpp_comm_algorithm(c, &got), ZPP_OK);
  EXPECT_EQ(got, g_hier ? ZPP_ALGORITHM_HIER : ZPP_ALGORITHM_FLAT);
  // A split keeps the config (now whole) and works.
  zpp_comm_t s = nullptr;
  EXPECT_EQ(zpp_comm_split(c, 0, g_rank, &s), ZPP_OK) << zpp_comm_get_last_error(c);
  EXPECT_EQ(zpp_comm_destroy(s), ZPP_OK);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
  u.v1.struct_size = offsetof(CommConfigV1, timeout_s);
  EXPECT_EQ(zpp_comm_config_check(cfg), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("cfg->struct_size"), std::string::npos)
      << zpp_get_last_error();
}

TEST(Errors, RanksDisagreeingOnTheAlgorithmAllFail) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.algorithm = g_rank == 0 ? ZPP_ALGORITHM_FLAT : ZPP_ALGORITHM_HIER;
  zpp_comm_t c = nullptr;
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_ERR_MISMATCH);
  EXPECT_NE(std::string(zpp_get_last_error()).find("ZPP_ALGO"), std::string::npos)
      << zpp_get_last_error();
  EXPECT_EQ(c, nullptr);
}

// config.topology takes precedence over ZPP_TOPO.
TEST(Config, TopologyStringOverridesTheEnvironment) {
  std::string spec = std::to_string(g_size) + "x1";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.topology = spec.c_str();
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK)
      << zpp_get_last_error();
  int nn = 0, em = 0, ls = 0;
  zpp_comm_nnodes(c, &nn);
  zpp_comm_topo_emulated(c, &em);
  zpp_comm_local_size(c, &ls);
  EXPECT_EQ(nn, g_size);
  EXPECT_EQ(em, 1);
  EXPECT_EQ(ls, 1);
  // The caller's communicator is duplicated, never used directly.
  MPI_Comm dup;
  ASSERT_EQ(zpp_comm_get_mpi_comm(c, &dup), ZPP_OK);
  int cmp = MPI_IDENT;
  MPI_Comm_compare(dup, MPI_COMM_WORLD, &cmp);
  EXPECT_EQ(cmp, MPI_CONGRUENT);
  EXPECT_EQ(zpp_comm_destroy(c), ZPP_OK);
}

// A peer that never arrives: the waiting rank gets ZPP_ERR_TIMEOUT after
// the timeout instead of hanging, and its communicator stays aborted.
TEST(Errors, TimeoutInsteadOfHanging) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.timeout_s = 0.5;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK);
  zpp_transport_t *t = zpp_comm_transport(c);
  if (g_rank == 0) {
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(blocking_barrier(t, ZPP_GROUP_WORLD), ZPP_ERR_TIMEOUT);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 0.5);
    EXPECT_LT(s, 5.0);
    EXPECT_NE(std::string(zpp_comm_get_last_error(c)).find("ZPP_TIMEOUT_S"),
              std::string::npos) << zpp_comm_get_last_error(c);
    char b = 0;
    EXPECT_EQ(blocking_allgather(t, ZPP_GROUP_WORLD, &b, 0, &b,
                                      ZPP_MEMORY_HOST, nullptr), ZPP_ERR_TIMEOUT);
    EXPECT_NE(std::string(zpp_comm_get_last_error(c)).find("aborted earlier"),
              std::string::npos);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    // MPI leaves rank 0's barrier request behind (a collective cannot be
    // cancelled), so the late ranks complete; point-to-point backends
    // (UCX) cancelled rank 0's part, and the late ranks time out in turn.
    zpp_status_t st = blocking_barrier(t, ZPP_GROUP_WORLD);
    if (g_backend == "mpi")
      EXPECT_EQ(st, ZPP_OK) << zpp_comm_get_last_error(c);
    else
      EXPECT_TRUE(st == ZPP_OK || st == ZPP_ERR_TIMEOUT) << zpp_comm_get_last_error(c);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  zpp_comm_destroy(c);
}

// A huge timeout means "practically none" (ZPP_TIMEOUT_MAX_S), not an
// immediate one: timeout_s * 1e9 must not overflow int64_t nanoseconds and
// put every deadline in the past, so that any wait not done at its first
// test (creation's bootstrap included) fails at once.  Rank 0 arrives late, so
// the others' first tests see nothing done.
TEST(Errors, HugeTimeoutIsNoTimeout) {
  for (double to : {1e12, (double)INFINITY}) {
    zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
    cfg.timeout_s = to;
    zpp_comm_t c = nullptr;
    if (g_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK)
        << "timeout_s " << to << ": " << zpp_get_last_error();
    zpp_transport_t *t = zpp_comm_transport(c);
    EXPECT_EQ(zpp_transport_timeout_s(t), ZPP_TIMEOUT_MAX_S);
    const size_t B = 64;
    std::vector<uint8_t> in = bytes_of(4401, g_rank, B), out(B * g_size);
    if (g_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(blocking_allgather(t, ZPP_GROUP_WORLD, in.data(), B, out.data(),
                                      ZPP_MEMORY_HOST, nullptr), ZPP_OK)
        << "timeout_s " << to << ": " << zpp_comm_get_last_error(c);
    for (int r = 0; r < g_size; r++)
      EXPECT_EQ(0, std::memcmp(out.data() + r * B, bytes_of(4401, r, B).data(), B)) << r;
    MPI_Barrier(MPI_COMM_WORLD);
    zpp_comm_destroy(c);
  }
}

// ---- device memory ---------------------------------------------------------

TEST(Device, ClearErrorWithoutAGpu) {
  if (zpp_cuda_available())
    GTEST_SKIP() << "a CUDA device is present: see Device.* and Nccl.*";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  zpp_comm_t c = nullptr;
  EXPECT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_ERR_UNSUPPORTED);
  std::string msg = zpp_get_last_error();
  EXPECT_TRUE(msg.find("no usable CUDA device") != std::string::npos ||
              msg.find("built without CUDA") != std::string::npos) << msg;
  char b[8] = {0};
  EXPECT_EQ(blocking_allgather(T(), ZPP_GROUP_WORLD, b, 1, b,
                                    ZPP_MEMORY_DEVICE, nullptr),
            ZPP_HAVE_CUDA ? ZPP_ERR_UNSUPPORTED : ZPP_ERR_UNSUPPORTED);
}

#if ZPP_HAVE_CUDA
namespace {
// Runs every op on device buffers and compares with the host results.
void device_ops(zpp_comm_t c, const char *what) {
  zpp_transport_t *t = zpp_comm_transport(c);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (zpp_group_t g : kGroups) {
    std::vector<int> m = members(g, g_rank);
    int n = (int)m.size(), me = index_of(m, g_rank);
    const size_t B = 4099, count = 1001;
    void *din, *dout;
    ASSERT_EQ(cudaMalloc(&din, n * B * 4 + 64), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, n * B * 4 + 64), cudaSuccess);
    // allgather
    std::vector<uint8_t> in = bytes_of(2000 + g, g_rank, B), out(n * B);
    cudaMemcpy(din, in.data(), B, cudaMemcpyHostToDevice);
    ASSERT_EQ(blocking_allgather(t, g, din, B, dout, ZPP_MEMORY_DEVICE, s), ZPP_OK)
        << what << ": " << zpp_comm_get_last_error(c);
    ASSERT_EQ(zpp_transport_sync(t, s), ZPP_OK);
    cudaMemcpy(out.data(), dout, n * B, cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++)
      EXPECT_EQ(0, std::memcmp(out.data() + i * B, bytes_of(2000 + g, m[i], B).data(), B))
          << what << " " << tag(g, "allgather", B);
    // alltoall
    in = bytes_of(2100 + g, g_rank, n * B);
    cudaMemcpy(din, in.data(), n * B, cudaMemcpyHostToDevice);
    ASSERT_EQ(blocking_alltoall(t, g, din, B, dout, ZPP_MEMORY_DEVICE, s), ZPP_OK);
    ASSERT_EQ(zpp_transport_sync(t, s), ZPP_OK);
    cudaMemcpy(out.data(), dout, n * B, cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++)
      EXPECT_EQ(0, std::memcmp(out.data() + i * B,
                               bytes_of(2100 + g, m[i], n * B).data() + me * B, B))
          << what << " " << tag(g, "alltoall", B);
    // allreduce (fp32): MPI staging is bitwise the documented sum; NCCL's
    // order is its own, so compare within the fp32 error bound there.
    zpp_backend_t be;
    zpp_comm_backend(c, &be);
    std::vector<uint8_t> fin = floats_of(2200 + g, g_rank, count, ZPP_FLOAT32);
    std::vector<uint8_t> fout(count * 4);
    cudaMemcpy(din, fin.data(), count * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(blocking_allreduce(t, g, din, dout, count, ZPP_FLOAT32,
                                      ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE, s), ZPP_OK);
    ASSERT_EQ(zpp_transport_sync(t, s), ZPP_OK);
    cudaMemcpy(fout.data(), dout, count * 4, cudaMemcpyDeviceToHost);
    std::vector<uint8_t> ref = expected_sum(2200 + g, m, count, ZPP_FLOAT32, 0, count);
    if (be == ZPP_BACKEND_MPI) {
      EXPECT_EQ(0, std::memcmp(fout.data(), ref.data(), count * 4)) << what;
    } else {
      // Each of n-1 fp32 additions of |x| < 8 * n adds <= 2^-24 relative
      // error of the partial sum: bound 8 * n * n * 2^-24 per element.
      double bound = 8.0 * n * n * std::ldexp(1.0, -24);
      for (size_t e = 0; e < count; e++)
        EXPECT_NEAR(load(fout.data(), e, ZPP_FLOAT32), load(ref.data(), e, ZPP_FLOAT32),
                    bound) << what << " element " << e;
    }
    // reduce_scatter in fp16 and bf16: MPI staging is the documented sum
    // (fp32 accumulator, one rounding).  NCCL adds in the dtype along its
    // ring and rounds after every addition: each of the n - 1 roundings
    // adds at most u * |partial sum| <= u * (1 + u)^n * sum |x| (u: the
    // dtype's unit roundoff) to the error against the exact sum.
    for (zpp_dtype_t dt : {ZPP_FLOAT16, ZPP_BFLOAT16}) {
      const size_t es = zpp_dtype_size(dt);
      const uint64_t salt = 2300 + g + 10 * (uint64_t)dt;
      std::vector<uint8_t> rin = floats_of(salt, g_rank, n * count, dt), rout(count * es);
      cudaMemcpy(din, rin.data(), n * count * es, cudaMemcpyHostToDevice);
      ASSERT_EQ(blocking_reduce_scatter(t, g, din, dout, count, dt, ZPP_REDUCE_SUM,
                                             ZPP_MEMORY_DEVICE, s), ZPP_OK)
          << what << ": " << zpp_comm_get_last_error(c);
      ASSERT_EQ(zpp_transport_sync(t, s), ZPP_OK);
      cudaMemcpy(rout.data(), dout, count * es, cudaMemcpyDeviceToHost);
      if (be == ZPP_BACKEND_MPI) {
        std::vector<uint8_t> want = expected_sum(salt, m, n * count, dt, me * count, count);
        EXPECT_EQ(0, std::memcmp(rout.data(), want.data(), count * es))
            << what << " " << tag(g, "reduce_scatter", count, dt);
        continue;
      }
      std::vector<std::vector<uint8_t>> all;
      for (int r : m) all.push_back(floats_of(salt, r, n * count, dt));
      const double u = std::ldexp(1.0, dt == ZPP_FLOAT16 ? -11 : -8);
      int bad = 0;
      for (size_t e = 0; e < count && bad < 3; e++) {
        double exact = 0, mag = 0;
        for (auto &x : all) {
          double v = load(x.data(), me * count + e, dt);
          exact += v;
          mag += std::fabs(v);
        }
        double bound = (n - 1) * u * std::pow(1 + u, n) * mag;
        double got = load(rout.data(), e, dt);
        if (!(std::fabs(got - exact) <= bound) && bad++ < 3)
          ADD_FAILURE() << what << " " << tag(g, "reduce_scatter", count, dt)
                        << " element " << e << ": " << got << ", exact " << exact
                        << ", bound " << bound;
      }
    }
    cudaFree(din);
    cudaFree(dout);
  }
  cudaStreamDestroy(s);
}
}  // namespace

// The MPI backend stages device memory through pinned host buffers, so
// several ranks may share one GPU.
TEST(Device, MpiStagingOnDeviceMemory) {
  if (!zpp_cuda_available()) GTEST_SKIP() << "no CUDA device on this machine";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  cfg.backend = ZPP_BACKEND_MPI;
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c), ZPP_OK) << zpp_get_last_error();
  device_ops(c, "mpi staging");
  zpp_comm_destroy(c);
}

TEST(Nccl, OpsOnDeviceMemory) {
  if (!zpp_cuda_available())
    GTEST_SKIP() << "no CUDA device on this machine: the NCCL backend needs a GPU";
  int ndev = 0;
  cudaGetDeviceCount(&ndev);
  int local = g_layout.local_rank(g_rank);
  (void)local;
  int need = 0, mine = 1;
  MPI_Allreduce(&mine, &need, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  // Ranks of this machine: all of them in these tests.
  if (ndev < need)
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << need << " ranks share "
                 << ndev << " device(s) (the MPI backend covers this case)";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  cfg.backend = ZPP_BACKEND_NCCL;
  zpp_comm_t c = nullptr;
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  if (st == ZPP_ERR_UNSUPPORTED)
    GTEST_SKIP() << "NCCL not usable: " << zpp_get_last_error();
  ASSERT_EQ(st, ZPP_OK) << zpp_get_last_error();
  device_ops(c, "nccl");
  zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
  zpp_comm_get_stats(c, &s);
  // One rank sends nothing, so no count is derived (zpp_comm.h).
  EXPECT_EQ(s.bytes_derived, g_size > 1 ? 1 : 0);
  zpp_comm_destroy(c);
}

// Reductions enqueued on two streams at once.  The NCCL backend's fp32
// scratch (widened 16-bit inputs, the accumulator, the allreduce padding)
// belongs to the transport; a reduction on one stream must not overwrite
// it while one on another stream still reads it.  The emulated runtime
// runs the two streams concurrently with random delays, so unordered
// scratch mixes some of the 12 rounds' inputs; each result is checked
// against its own inputs: the exact sum within the error of fp32 ring
// additions, (n - 1) 2^-24 sum|x| (each addition's relative error 2^-24 of
// a partial sum <= sum|x|), plus the one rounding to the dtype.
TEST(Nccl, ReductionsOnTwoStreamsKeepTheirOwnInputs) {
  if (!zpp_cuda_available())
    GTEST_SKIP() << "no CUDA device on this machine: the NCCL backend needs a GPU";
  int ndev = 0, need = 0, mine = 1;
  cudaGetDeviceCount(&ndev);
  MPI_Allreduce(&mine, &need, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (ndev < need)
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << need << " ranks share "
                 << ndev << " device(s)";
  zpp_comm_config_t cfg = ZPP_COMM_CONFIG_INIT;
  cfg.memory = ZPP_MEMORY_DEVICE;
  cfg.backend = ZPP_BACKEND_NCCL;
  zpp_comm_t c = nullptr;
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, &cfg, &c);
  if (st == ZPP_ERR_UNSUPPORTED)
    GTEST_SKIP() << "NCCL not usable: " << zpp_get_last_error();
  ASSERT_EQ(st, ZPP_OK) << zpp_get_last_error();
  zpp_transport_t *t = zpp_comm_transport(c);
  const zpp_group_t g = ZPP_GROUP_WORLD;
  std::vector<int> m = members(g, g_rank);
  const int n = (int)m.size(), me = index_of(m, g_rank), kRounds = 12;
  const size_t count = 1001;  // allreduce: 1001 % n != 0 for n > 1 (padding)
  cudaStream_t str[2];
  ASSERT_EQ(cudaStreamCreateWithFlags(&str[0], cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&str[1], cudaStreamNonBlocking), cudaSuccess);
  struct Op {
    int stream;
    zpp_dtype_t dt;
    bool allreduce;
    uint64_t salt;
    size_t in_elems;
    void *din, *dout;
  };
  // Per round: stream 0 a bf16 reduce-scatter (wide, acc); stream 1 an fp16
  // reduce-scatter (wide, acc) and an fp32 allreduce (wide, pad).
  std::vector<Op> ops;
  for (int r = 0; r < kRounds; r++) {
    ops.push_back({0, ZPP_BFLOAT16, false, 5000 + 3 * (uint64_t)r, n * count, nullptr, nullptr});
    ops.push_back({1, ZPP_FLOAT16, false, 5001 + 3 * (uint64_t)r, n * count, nullptr, nullptr});
    ops.push_back({1, ZPP_FLOAT32, true, 5002 + 3 * (uint64_t)r, count, nullptr, nullptr});
  }
  for (Op &o : ops) {
    size_t es = zpp_dtype_size(o.dt);
    std::vector<uint8_t> in = floats_of(o.salt, g_rank, o.in_elems, o.dt);
    ASSERT_EQ(cudaMalloc(&o.din, o.in_elems * es), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&o.dout, count * es), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(o.din, in.data(), o.in_elems * es, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  for (Op &o : ops) {
    st = o.allreduce
             ? blocking_allreduce(t, g, o.din, o.dout, count, o.dt, ZPP_REDUCE_SUM,
                                       ZPP_MEMORY_DEVICE, str[o.stream])
             : blocking_reduce_scatter(t, g, o.din, o.dout, count, o.dt,
                                            ZPP_REDUCE_SUM, ZPP_MEMORY_DEVICE,
                                            str[o.stream]);
    ASSERT_EQ(st, ZPP_OK) << zpp_comm_get_last_error(c);
  }
  ASSERT_EQ(zpp_transport_sync(t, str[0]), ZPP_OK) << zpp_comm_get_last_error(c);
  ASSERT_EQ(zpp_transport_sync(t, str[1]), ZPP_OK) << zpp_comm_get_last_error(c);
  int wrong_ops = 0;
  for (size_t k = 0; k < ops.size(); k++) {
    const Op &o = ops[k];
    size_t es = zpp_dtype_size(o.dt), first = o.allreduce ? 0 : me * count;
    std::vector<uint8_t> out(count * es);
    ASSERT_EQ(cudaMemcpy(out.data(), o.dout, count * es, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<std::vector<uint8_t>> all;
    for (int r : m) all.push_back(floats_of(o.salt, r, o.in_elems, o.dt));
    const double u = o.dt == ZPP_FLOAT32 ? 0 : std::ldexp(1.0, o.dt == ZPP_FLOAT16 ? -11 : -8);
    int bad = 0;
    for (size_t e = 0; e < count; e++) {
      double exact = 0, mag = 0;
      for (auto &x : all) {
        double v = load(x.data(), first + e, o.dt);
        exact += v;
        mag += std::fabs(v);
      }
      double e32 = (n - 1) * std::ldexp(1.0, -24) * mag * 1.0001;
      double bound = e32 + u * (std::fabs(exact) + e32);
      double got = load(out.data(), e, o.dt);
      if (!(std::fabs(got - exact) <= bound) && bad++ < 2)
        ADD_FAILURE() << "round " << k / 3 << " op " << k % 3 << " on stream "
                      << o.stream << ", element " << e << ": " << got << ", exact "
                      << exact << ", bound " << bound;
    }
    wrong_ops += bad > 0;
  }
  EXPECT_EQ(wrong_ops, 0) << "of " << ops.size() << " reductions";
  for (Op &o : ops) {
    cudaFree(o.din);
    cudaFree(o.dout);
  }
  cudaStreamDestroy(str[0]);
  cudaStreamDestroy(str[1]);
  zpp_comm_destroy(c);
}
#else
TEST(Nccl, OpsOnDeviceMemory) {
  GTEST_SKIP() << "zpp built without CUDA: no NCCL backend";
}
#endif

// ---- emulated links (run with ZPP_EMU_INTER_GBIT set: tests/transport.cmake)

TEST(Emu, InterNodeTransferTakesBytesOverBandwidth) {
  zpp_comm_stats_t s0 = stats();
  if (!s0.link_emulated)
    GTEST_SKIP() << "set ZPP_EMU_INTER_GBIT (ctest transport_emu_* does)";
  if (g_layout.nnodes < 2) GTEST_SKIP() << "needs 2 nodes";
  const double G = s0.emu_gbit, lat = s0.emu_lat_us * 1e-6;
  const size_t B = 4u << 20;
  const double xfer = B * 8.0 / G * 1e-9;  // seconds
  std::vector<uint8_t> in = bytes_of(3000, g_rank, B);
  std::vector<uint8_t> out(B * g_size);
  int ncross = zpp_transport_group_size(T(), ZPP_GROUP_CROSS);

  // CROSS: one inter-node transfer per step.  My result cannot be complete
  // before my predecessor's start + latency + B / bandwidth.
  MPI_Barrier(MPI_COMM_WORLD);
  double start = now_s();
  ASSERT_EQ(blocking_allgather(T(), ZPP_GROUP_CROSS, in.data(), B, out.data(),
                                    ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  double end = now_s();
  std::vector<double> starts(g_size);
  MPI_Allgather(&start, 1, MPI_DOUBLE, starts.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  if (ncross > 1) {
    std::vector<int> m = members(ZPP_GROUP_CROSS, g_rank);
    int me = index_of(m, g_rank);
    int prev = m[(me + (int)m.size() - 1) % m.size()];
    // n-1 sequential steps, each >= latency + transfer.
    double least = (ncross - 1) * (xfer + lat);
    EXPECT_GE(end - starts[prev], least * 0.999) << "finished too early";
    double first = *std::min_element(starts.begin(), starts.end());
    EXPECT_LE(end - first, least + 1.0) << "generous upper bound";
    std::printf("[ emu  ] rank %d: CROSS allgather %zu B x %d steps at %g Gbit/s: "
                "%.1f ms (model >= %.1f ms)\n", g_rank, B, ncross - 1, G,
                (end - starts[prev]) * 1e3, least * 1e3);
  }

  // NODE: intra-node traffic is not slowed.  Deterministic check: no
  // emulated wait happens (the time slept stays put); the elapsed time is
  // printed next to what the same bytes would take on an emulated link
  // (a timing bound would fail on a loaded 2-core machine, not on zpp).
  int nnode = zpp_transport_group_size(T(), ZPP_GROUP_NODE);
  double slept = stats().emu_wait_s;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  ASSERT_EQ(blocking_allgather(T(), ZPP_GROUP_NODE, in.data(), B, out.data(),
                                    ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  double el = now_s() - t0;
  EXPECT_EQ(stats().emu_wait_s, slept) << "intra-node traffic was slowed";
  if (nnode > 1)
    std::printf("[ emu  ] rank %d: NODE allgather %zu B x %d steps: %.1f ms "
                "(emulated link would take >= %.1f ms)\n", g_rank, B, nnode - 1,
                el * 1e3, (nnode - 1) * xfer * 1e3);
}

// Concurrent inter-node sends of one rank share its bandwidth.
TEST(Emu, ConcurrentTransfersShareTheNic) {
  zpp_comm_stats_t s0 = stats();
  if (!s0.link_emulated) GTEST_SKIP() << "set ZPP_EMU_INTER_GBIT";
  if (g_layout.nnodes < 2) GTEST_SKIP() << "needs 2 nodes";
  const size_t B = 1u << 20;
  const double xfer = B * 8.0 / s0.emu_gbit * 1e-9, lat = s0.emu_lat_us * 1e-6;
  // My inter-node peers in WORLD: each gets B bytes from me, back to back.
  int inter = 0;
  for (int r = 0; r < g_size; r++) inter += g_layout.node_of[r] != g_layout.node_of[g_rank];
  int most = 0;
  MPI_Allreduce(&inter, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  std::vector<uint8_t> in(B * g_size, 1), out(B * g_size);
  MPI_Barrier(MPI_COMM_WORLD);
  double start = now_s();
  ASSERT_EQ(blocking_alltoall(T(), ZPP_GROUP_WORLD, in.data(), B, out.data(),
                                   ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  double end = now_s(), first, last;
  MPI_Allreduce(&start, &first, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&end, &last, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // The rank with `most` inter-node peers finishes its last send no earlier
  // than its start + most * xfer; its receiver waits for it.  `first` is the
  // latest start, so last - first underestimates: compare with the earliest
  // start instead.
  double earliest;
  MPI_Allreduce(&start, &earliest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_GE(last - earliest, (most * xfer + lat) * 0.999);
  EXPECT_LE(last - earliest, most * xfer + lat + 1.0);
  (void)first;
}

// Waiting on an emulated link sleeps: CPU time stays well below wall time.
// Every rank takes part (skips are collective), ranks alone in their CROSS
// group check nothing.
TEST(Emu, WaitingDoesNotBurnACore) {
  zpp_comm_stats_t s0 = stats();
  if (!s0.link_emulated) GTEST_SKIP() << "set ZPP_EMU_INTER_GBIT";
  if (g_layout.nnodes < 2) GTEST_SKIP() << "needs 2 nodes";
  int ncross = zpp_transport_group_size(T(), ZPP_GROUP_CROSS);
  // About 0.3 s of emulated transfer per rank.
  const size_t B = (size_t)(0.3 * s0.emu_gbit * 1e9 / 8);
  std::vector<uint8_t> in(B, 3), out(B * g_size);
  zpp_comm_reset_stats(g_comm);
  MPI_Barrier(MPI_COMM_WORLD);
  double c0 = cpu_s(), w0 = now_s();
  ASSERT_EQ(blocking_allgather(T(), ZPP_GROUP_CROSS, in.data(), B, out.data(),
                                    ZPP_MEMORY_HOST, nullptr), ZPP_OK);
  double cpu = cpu_s() - c0, wall = now_s() - w0;
  if (ncross < 2) return;
  std::printf("[ emu  ] rank %d: %.0f ms wall, %.0f ms CPU (%.0f%%), slept %.0f ms\n",
              g_rank, wall * 1e3, cpu * 1e3, 100 * cpu / wall, stats().emu_wait_s * 1e3);
  EXPECT_GE(wall, 0.25);
  EXPECT_LT(cpu, 0.35 * wall) << "the wait burns CPU";
  EXPECT_GT(stats().emu_wait_s, 0.0);
}

// Non-blocking under emulation: the data of a round arrives long before
// its deadline; the op is not done before the deadline, zpp_xop_wake_ns
// says when, and that time is the sender's deadline: its start + bytes /
// bandwidth + latency on a fresh NIC clock (docs/design.md "Link
// emulation").  Compared with the sender's start, bracketed by clock reads
// around its start_allgather (which posts the first round).
TEST(Emu, NonBlockingWakeIsTheSendersDeadline) {
  zpp_comm_stats_t s0 = stats();
  if (!s0.link_emulated) GTEST_SKIP() << "set ZPP_EMU_INTER_GBIT";
  if (g_layout.nnodes < 2) GTEST_SKIP() << "needs 2 nodes";
  zpp_comm_t c = nullptr;
  ASSERT_EQ(zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, &c), ZPP_OK);
  zpp_transport_t *t = zpp_comm_transport(c);
  const size_t B = (size_t)(0.2 * s0.emu_gbit * 1e9 / 8);  // ~0.2 s on the link
  const int64_t xfer = std::llround(B * 8.0 / s0.emu_gbit), lat = std::llround(s0.emu_lat_us * 1000);
  // A cheap pattern per rank (tens of MB; Ops.* check random data).
  auto pattern = [&](int r) {
    std::vector<uint8_t> v(B);
    for (size_t i = 0; i < B; i++) v[i] = (uint8_t)(i * 131 + (i >> 8) + r * 29);
    return v;
  };
  std::vector<uint8_t> in = pattern(g_rank), out(B * g_size);
  std::vector<int> m = members(ZPP_GROUP_CROSS, g_rank);
  int n = (int)m.size(), me = index_of(m, g_rank);
  MPI_Barrier(MPI_COMM_WORLD);
  zpp_xop_t *op = nullptr;
  int64_t before = mono_ns();
  ASSERT_EQ(start_allgather(t, ZPP_GROUP_CROSS, in.data(), B, out.data(),
                                          ZPP_MEMORY_HOST, nullptr, &op), ZPP_OK);
  int64_t after = mono_ns();
  std::vector<int64_t> befores(g_size), afters(g_size);
  MPI_Allgather(&before, 1, MPI_INT64_T, befores.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  MPI_Allgather(&after, 1, MPI_INT64_T, afters.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  if (n > 1) {
    int prev = m[(me + n - 1) % n];
    int64_t wake = 0, until = mono_ns() + 20000000000LL;
    int done = 0;
    while (!wake && !done && mono_ns() < until) {
      ASSERT_EQ(zpp_xop_test(op, &done), ZPP_OK) << zpp_comm_get_last_error(c);
      wake = zpp_xop_wake_ns(op);
      if (!wake) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!wake) {
      // A loaded machine delivered the data after its deadline: then the op
      // must at least not have completed before the deadline.
      EXPECT_GE(mono_ns(), befores[prev] + xfer + lat) << "done before the deadline";
      std::printf("[ emu  ] rank %d: data arrived after its deadline (loaded machine); "
                  "wake time not observable in this run\n", g_rank);
    }
  }
  if (n > 1 && zpp_xop_wake_ns(op) != 0) {
    int prev = m[(me + n - 1) % n];
    int64_t wake = zpp_xop_wake_ns(op), until;
    int done = 0;
    EXPECT_GE(wake, befores[prev] + xfer + lat - 1) << "deadline earlier than the model";
    EXPECT_LE(wake, afters[prev] + xfer + lat + 1) << "deadline later than the model";
    int64_t now = mono_ns();
    if (now < wake) {
      ASSERT_EQ(zpp_xop_test(op, &done), ZPP_OK);
      if (mono_ns() < wake) {
        EXPECT_EQ(done, 0) << "done before the deadline";
      }
    }
    until = mono_ns() + 20000000000LL;
    while (!done && mono_ns() < until) {
      int64_t w = zpp_xop_wake_ns(op);
      if (w > mono_ns()) {
        timespec ts = {(time_t)(w / 1000000000), (long)(w % 1000000000)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
      }
      ASSERT_EQ(zpp_xop_test(op, &done), ZPP_OK) << zpp_comm_get_last_error(c);
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_EQ(done, 1);
    EXPECT_GE(mono_ns(), wake);
    zpp_comm_stats_t s = ZPP_COMM_STATS_INIT;
    zpp_comm_get_stats(c, &s);
    EXPECT_GT(s.emu_wait_s, 0.0);
    std::printf("[ emu  ] rank %d: wake %.3f ms after the sender's start (model %.3f ms + "
                "start window %.3f ms)\n", g_rank, (wake - befores[prev]) * 1e-6,
                (xfer + lat) * 1e-6, (afters[prev] - befores[prev]) * 1e-6);
  }
  ASSERT_EQ(xop_wait(t, op), ZPP_OK);
  zpp_xop_free(op);
  for (int i = 0; i < n; i++)
    EXPECT_EQ(0, std::memcmp(out.data() + i * B, pattern(m[i]).data(), B)) << "block " << i;
  zpp_comm_destroy(c);
}

TEST(Emu, ReportsSayTheLinksAreEmulated) {
  zpp_comm_stats_t s = stats();
  if (!s.link_emulated) GTEST_SKIP() << "set ZPP_EMU_INTER_GBIT";
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  zpp_comm_print_topology(g_comm, f, 0);
  std::fclose(f);
  std::string txt(buf, len);
  std::free(buf);
  EXPECT_NE(txt.find("EMULATED inter-node links"), std::string::npos) << txt;
  EXPECT_GT(s.emu_gbit, 0.0);
}

// ---- main ---------------------------------------------------------------------

namespace {
class RankPrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILED %s:%d\n%s\n", g_rank,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
};
}  // namespace

// ZPP_NET_SEGMENT cuts transfers into messages on both sides alike, so it
// must be the same everywhere and in range: ctest launches this binary
// with ZPP_TEST_NETSEG_CASE set and ZPP_NET_SEGMENT given by the launcher,
// per rank where the ranks differ (tests/transport.cmake; the environment
// is never changed inside this multi-threaded process).  "mismatch": the
// ranks disagree, every rank fails with ZPP_ERR_MISMATCH; "invalid": a
// value out of range on some rank (on one only: that rank still takes part
// in the first exchange, so the others fail at once with its message
// instead of waiting there for the 10 s timeout).  Every rank's message
// must contain ZPP_TEST_NETSEG_EXPECT.  Returns 1 on a failed check.
static int net_segment_case(const char *which) {
  const char *want = std::getenv("ZPP_TEST_NETSEG_EXPECT");
  zpp_status_t code = std::string(which) == "mismatch" ? ZPP_ERR_MISMATCH
                      : std::string(which) == "invalid" ? ZPP_ERR_INVALID_ARGUMENT
                                                        : ZPP_OK;
  if (code == ZPP_OK || want == nullptr) {
    std::fprintf(stderr, "[rank %d] ZPP_TEST_NETSEG_CASE=%s: must be mismatch or invalid, "
                 "with ZPP_TEST_NETSEG_EXPECT set\n", g_rank, which);
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

int main(int argc, char **argv) {
  int provided = 0;
  // This suite's references follow one forced family (ZPP_ALGO=flat, else
  // hier); the per-call choice of ZPP_ALGO=auto, the library's default, is
  // tests/test_tuner.cc's.  Set before MPI or zpp start any thread.
  setenv("ZPP_ALGO", "hier", 0);
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  ::testing::InitGoogleTest(&argc, argv);
  if (const char *s = std::getenv("ZPP_TEST_SEED")) g_seed = std::strtoull(s, nullptr, 10);
  if (const char *s = std::getenv("ZPP_NET_RINGS")) g_rings = std::max(1, std::atoi(s));
  if (const char *s = std::getenv("ZPP_ALGO"); s && std::string(s) == "flat") g_hier = false;
  if (const char *s = std::getenv("ZPP_BACKEND"); s && *s) g_backend = s;
  if (g_rank != 0) {
    auto &l = ::testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
    l.Append(new RankPrinter);
  }
  g_layout = make_layout(g_size);
  if (g_rank == 0) {
    const char *t = std::getenv("ZPP_TOPO");
    const char *x = std::getenv("ZPP_TEST_EXPECT_NODES");
    std::printf("[ seed ] ZPP_TEST_SEED=%llu; %d ranks; backend %s; algorithm %s; %s%s%s%s\n",
                (unsigned long long)g_seed, g_size, g_backend.c_str(),
                g_hier ? "hier" : "flat",
                t && *t ? "emulated topology ZPP_TOPO=" : "discovered topology",
                t && *t ? t : "",
                !(t && *t) && x && *x ? ", expected ZPP_TEST_EXPECT_NODES=" : "",
                !(t && *t) && x && *x ? x : "");
  }
  if (const char *c = std::getenv("ZPP_TEST_NETSEG_CASE"); c && *c) {
    int bad = net_segment_case(c), any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0) std::printf("%s ZPP_TEST_NETSEG_CASE=%s\n", any ? "FAILED" : "PASSED", c);
    MPI_Finalize();
    return any;
  }
  int failed = 1;
  zpp_status_t st = zpp_comm_create_mpi(MPI_COMM_WORLD, nullptr, &g_comm);
  if (st != ZPP_OK) {
    std::fprintf(stderr, "[rank %d] zpp_comm_create_mpi: %s\n", g_rank,
                 zpp_get_last_error());
  } else {
    if (g_rank == 0) zpp_comm_print_topology(g_comm, stdout, 0);
    failed = RUN_ALL_TESTS() != 0;
    zpp_comm_destroy(g_comm);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (g_rank == 0 && any) std::printf("FAILED on at least one rank\n");
  MPI_Finalize();
  return any;
}
