// zpp's TCP bootstrap and zpp_comm_create over a caller's table, without
// MPI: each test forks plain processes (loopback only, every wait bounded)
// and collects each one's status and message through a pipe.  The
// launcher-based tests (tests/bootstrap.cmake) cover the torchrun path;
// this suite covers unique ids (malformed, stale), a user bootstrap and
// subsets over TCP, and srun's environment (the hostlist parser, the
// port, a communicator from SLURM_* variables).
//
// Seed: ZPP_TEST_SEED (default 20261129), printed.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <locale.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#include "comm/slurm.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

uint64_t seed() {
  const char *s = std::getenv("ZPP_TEST_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261129ull;
}

struct Result {
  int status = 99;  // zpp_status_t, or 99: the child died without a word
  std::string msg;
};

// Runs body(i, ids) in n forked processes; ids[i] is a pipe to write a
// zpp_unique_id_t to child i (from child 0).  Returns each child's result;
// children still running after `limit_s` are killed (status 98).
std::vector<Result> run(int n, double limit_s,
                        const std::function<Result(int, const std::vector<int> &,
                                                   int)> &body) {
  std::vector<int> res_r(n), res_w(n), id_r(n), id_w(n);
  for (int i = 0; i < n; i++) {
    int p[2], q[2];
    if (pipe(p) != 0 || pipe(q) != 0) std::abort();
    res_r[i] = p[0];
    res_w[i] = p[1];
    id_r[i] = q[0];
    id_w[i] = q[1];
  }
  std::vector<pid_t> pid(n);
  for (int i = 0; i < n; i++) {
    pid[i] = fork();
    if (pid[i] == 0) {
      Result r = body(i, id_w, id_r[i]);
      std::string out = std::to_string(r.status) + "\n" + r.msg;
      ssize_t k = write(res_w[i], out.data(), out.size());
      (void)k;
      _exit(0);
    }
  }
  for (int i = 0; i < n; i++) close(res_w[i]);
  std::vector<Result> out(n);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) {
    int st = 0;
    for (;;) {
      if (waitpid(pid[i], &st, WNOHANG) == pid[i]) break;
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > limit_s) {
        kill(pid[i], SIGKILL);
        waitpid(pid[i], &st, 0);
        out[i].status = 98;
        break;
      }
      usleep(10000);
    }
    char buf[4096];
    std::string text;
    ssize_t k;
    while ((k = read(res_r[i], buf, sizeof buf)) > 0) text.append(buf, (size_t)k);
    close(res_r[i]);
    close(id_r[i]);
    close(id_w[i]);
    if (out[i].status != 98 && !text.empty()) {
      size_t nl = text.find('\n');
      out[i].status = std::atoi(text.substr(0, nl).c_str());
      out[i].msg = text.substr(nl + 1);
    }
  }
  return out;
}

// Child 0 makes the id and sends it to the others.
zpp_unique_id_t share_id(int i, const std::vector<int> &to, int from) {
  zpp_unique_id_t id;
  std::memset(&id, 0, sizeof id);
  if (i == 0) {
    if (zpp_get_unique_id(&id) != ZPP_OK) _exit(3);
    for (size_t k = 1; k < to.size(); k++)
      if (write(to[k], &id, sizeof id) != (ssize_t)sizeof id) _exit(3);
  } else if (read(from, &id, sizeof id) != (ssize_t)sizeof id) {
    _exit(3);
  }
  return id;
}

zpp_comm_config_t quick(double timeout_s, const char *topo = nullptr) {
  zpp_comm_config_t c = ZPP_COMM_CONFIG_INIT;
  c.timeout_s = timeout_s;
  c.topology = topo;
  return c;
}

// Gathers every rank's seed-derived values and checks them bit for bit.
Result check_allgather(zpp_comm_t c, uint64_t salt) {
  int rank = 0, size = 0;
  zpp_comm_rank(c, &rank);
  zpp_comm_size(c, &size);
  const size_t count = 1000;
  auto gen = [&](int r) {
    std::mt19937 g((uint32_t)(seed() * 31 + salt * 7 + (uint64_t)r));
    std::vector<float> v(count);
    for (auto &x : v) x = (float)(g() % 100000) / 7.0f;
    return v;
  };
  std::vector<float> mine = gen(rank), all(count * size);
  Result res;
  res.status = zpp_allgather(c, mine.data(), all.data(), count, ZPP_FLOAT32, nullptr,
                             nullptr);
  if (res.status != ZPP_OK) {
    res.msg = zpp_comm_get_last_error(c);
    return res;
  }
  for (int r = 0; r < size; r++)
    if (std::memcmp(all.data() + r * count, gen(r).data(), count * 4) != 0) {
      res.status = -100;
      res.msg = "block of rank " + std::to_string(r) + " differs";
    }
  return res;
}

TEST(Bootstrap, UniqueIdCommunicatorRunsCollectives) {
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  auto res = run(3, 60, [](int i, const std::vector<int> &to, int from) {
    zpp_unique_id_t id = share_id(i, to, from);
    zpp_comm_config_t cfg = quick(30);
    zpp_comm_t c = nullptr;
    Result r;
    r.status = zpp_comm_create_from_id(&id, 3, i, &cfg, &c);
    if (r.status != ZPP_OK) {
      r.msg = zpp_get_last_error();
      return r;
    }
    zpp_backend_t b;
    zpp_comm_backend(c, &b);
    r = check_allgather(c, 1);
    if (r.status == ZPP_OK && (b != ZPP_BACKEND_UCX ||
                               std::string(zpp_comm_bootstrap_name(c)) != "tcp")) {
      r.status = -101;
      r.msg = std::string("backend ") + zpp_backend_name(b) + ", bootstrap " +
              zpp_comm_bootstrap_name(c);
    }
    zpp_comm_destroy(c);
    return r;
  });
  for (int i = 0; i < 3; i++) EXPECT_EQ(res[i].status, ZPP_OK) << i << ": " << res[i].msg;
}

TEST(Bootstrap, MalformedIdIsRejectedAtOnce) {
  auto t0 = std::chrono::steady_clock::now();
  // In a child: zpp reads its settings once per process, and the later
  // tests' children set ZPP_BOOTSTRAP_* after fork (the test process
  // itself must not have read them).
  auto bad = run(1, 30, [](int, const std::vector<int> &, int) {
    zpp_unique_id_t id;
    std::memset(&id, 0x41, sizeof id);
    zpp_comm_t c = nullptr;
    zpp_comm_config_t cfg = quick(30);
    Result r;
    r.status = zpp_comm_create_from_id(&id, 2, 1, &cfg, &c);
    r.msg = zpp_get_last_error();
    if (c != nullptr) r.status = -100;
    return r;
  });
  EXPECT_EQ(bad[0].status, ZPP_ERR_INVALID_ARGUMENT) << bad[0].msg;
  EXPECT_NE(bad[0].msg.find("malformed"), std::string::npos) << bad[0].msg;
  // a real id with one byte changed (a truncated or corrupted copy)
  auto res = run(1, 30, [](int, const std::vector<int> &, int) {
    zpp_unique_id_t good;
    Result r;
    r.status = zpp_get_unique_id(&good);
    good.internal[20] ^= 1;
    zpp_comm_t c2 = nullptr;
    zpp_comm_config_t cfg2 = quick(30);
    r.status = zpp_comm_create_from_id(&good, 2, 1, &cfg2, &c2);
    r.msg = zpp_get_last_error();
    return r;
  });
  EXPECT_EQ(res[0].status, ZPP_ERR_INVALID_ARGUMENT) << res[0].msg;
  EXPECT_NE(res[0].msg.find("checksum"), std::string::npos) << res[0].msg;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
            5.0);
}

// The id of a root that is gone: every rank gets ZPP_ERR_TIMEOUT within
// the timeout, saying the id may be stale.
TEST(Bootstrap, StaleIdOfAGoneRootTimesOut) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {  // makes an id and exits: its listener dies with it
    zpp_unique_id_t id;
    zpp_get_unique_id(&id);
    ssize_t k = write(p[1], &id, sizeof id);
    _exit(k == (ssize_t)sizeof id ? 0 : 1);
  }
  zpp_unique_id_t id;
  ASSERT_EQ(read(p[0], &id, sizeof id), (ssize_t)sizeof id);
  waitpid(pid, nullptr, 0);
  close(p[0]);
  close(p[1]);
  auto res = run(2, 30, [&](int i, const std::vector<int> &, int) {
    zpp_comm_t c = nullptr;
    zpp_comm_config_t cfg = quick(1.5);
    Result r;
    auto t0 = std::chrono::steady_clock::now();
    r.status = zpp_comm_create_from_id(&id, 3, i + 1, &cfg, &c);
    r.msg = zpp_get_last_error();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 3.0) r.msg += " [took too long]";
    return r;
  });
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(res[i].status, ZPP_ERR_TIMEOUT) << res[i].msg;
    EXPECT_NE(res[i].msg.find("stale"), std::string::npos) << res[i].msg;
    EXPECT_EQ(res[i].msg.find("too long"), std::string::npos) << res[i].msg;
  }
}

// A stale id whose port now serves another session: refused at once.
TEST(Bootstrap, StaleIdOfAnotherSessionIsRefused) {
  auto res = run(2, 30, [](int i, const std::vector<int> &to, int from) {
    Result r;
    zpp_unique_id_t old_id, id;
    if (i == 0) {
      // Two sessions on one port: the first is closed by making the second
      // (ZPP_BOOTSTRAP_PORT pins the port; read once per process, so set
      // before the first call).
      int port = 20000 + (int)(getpid() % 20000);
      setenv("ZPP_BOOTSTRAP_PORT", std::to_string(port).c_str(), 1);
      if (zpp_get_unique_id(&old_id) != ZPP_OK) {
        r.status = 97;
        r.msg = zpp_get_last_error();
        return r;
      }
      // Releasing the first listener: joining it alone as a 1-rank job.
      zpp_comm_t solo = nullptr;
      zpp_comm_config_t c1 = quick(5);
      c1.backend = ZPP_BACKEND_AUTO;
      zpp_comm_create_from_id(&old_id, 1, 0, &c1, &solo);
      zpp_comm_destroy(solo);
      if (zpp_get_unique_id(&id) != ZPP_OK) {
        r.status = 97;
        r.msg = zpp_get_last_error();
        return r;
      }
      if (write(to[1], &old_id, sizeof old_id) != (ssize_t)sizeof old_id) _exit(3);
      zpp_comm_t c = nullptr;
      zpp_comm_config_t cfg = quick(2);
      r.status = zpp_comm_create_from_id(&id, 2, 0, &cfg, &c);
      r.msg = zpp_get_last_error();
      zpp_comm_destroy(c);
      return r;
    }
    if (read(from, &old_id, sizeof old_id) != (ssize_t)sizeof old_id) _exit(3);
    zpp_comm_t c = nullptr;
    zpp_comm_config_t cfg = quick(2);
    r.status = zpp_comm_create_from_id(&old_id, 2, 1, &cfg, &c);
    r.msg = zpp_get_last_error();
    return r;
  });
  EXPECT_EQ(res[1].status, ZPP_ERR_MISMATCH) << res[1].msg;
  EXPECT_NE(res[1].msg.find("stale id"), std::string::npos) << res[1].msg;
  // The new session's root: its rank 1 never came.
  EXPECT_EQ(res[0].status, ZPP_ERR_TIMEOUT) << res[0].msg;
  EXPECT_NE(res[0].msg.find("rank 1 never arrived"), std::string::npos) << res[0].msg;
}

// zpp_comm_create over a caller's table (here one that forwards to a TCP
// communicator's bootstrap and counts the calls).
struct Wrapped {
  zpp_bootstrap_t inner;
  int calls = 0;
};
zpp_status_t w_allgather(void *ctx, const void *m, size_t b, void *all, double t) {
  Wrapped *w = (Wrapped *)ctx;
  w->calls++;
  return w->inner.allgather(w->inner.ctx, m, b, all, t);
}
zpp_status_t w_bcast(void *ctx, void *buf, size_t b, int root, double t) {
  Wrapped *w = (Wrapped *)ctx;
  w->calls++;
  return w->inner.bcast(w->inner.ctx, buf, b, root, t);
}
zpp_status_t w_barrier(void *ctx, double t) {
  Wrapped *w = (Wrapped *)ctx;
  w->calls++;
  return w->inner.barrier(w->inner.ctx, t);
}

TEST(Bootstrap, CallerTableAndSubsetsOverTcp) {
  auto res = run(4, 90, [](int i, const std::vector<int> &to, int from) {
    zpp_unique_id_t id = share_id(i, to, from);
    zpp_comm_config_t cfg = quick(30, "2x2");
    zpp_comm_t world = nullptr, user = nullptr, half = nullptr, pair = nullptr;
    Result r;
    r.status = zpp_comm_create_from_id(&id, 4, i, &cfg, &world);
    if (r.status != ZPP_OK) {
      r.msg = zpp_get_last_error();
      return r;
    }
    Wrapped w;
    zpp_comm_get_bootstrap(world, &w.inner);
    zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
    bs.name = "wrapped";
    bs.rank = w.inner.rank;
    bs.size = w.inner.size;
    bs.ctx = &w;
    bs.allgather = w_allgather;
    bs.bcast = w_bcast;
    bs.barrier = w_barrier;
    zpp_comm_config_t ucfg = quick(30, "2x2");
    r.status = zpp_comm_create(&bs, &ucfg, &user);
    if (r.status == ZPP_OK) r = check_allgather(user, 2);
    if (r.status == ZPP_OK && (w.calls == 0 ||
                               std::string(zpp_comm_bootstrap_name(user)) != "wrapped")) {
      r.status = -102;
      r.msg = "the caller's table was not used";
    }
    // subsets: {0,2} and {1,3} by colour (one per emulated node each: the
    // child keeps two nodes), then {3,0} from a list.
    if (r.status == ZPP_OK) r.status = zpp_comm_split(user, i % 2, i, &half);
    if (r.status == ZPP_OK) {
      int n = 0, sz = 0;
      zpp_comm_nnodes(half, &n);
      zpp_comm_size(half, &sz);
      if (n != 2 || sz != 2) {
        r.status = -103;
        r.msg = "subset of 2 ranks on " + std::to_string(n) + " nodes";
      }
    }
    if (r.status == ZPP_OK) r = check_allgather(half, 3);
    int list[2] = {3, 0};
    if (r.status == ZPP_OK) r.status = zpp_comm_create_from_ranks(user, 2, list, &pair);
    if (r.status == ZPP_OK && (i == 0 || i == 3)) {
      int pr = -1;
      zpp_comm_rank(pair, &pr);
      if (pr != (i == 3 ? 0 : 1)) {
        r.status = -104;
        r.msg = "rank " + std::to_string(pr) + " in the list communicator";
      }
      if (r.status == ZPP_OK) r = check_allgather(pair, 4);
    } else if (r.status == ZPP_OK && pair != nullptr) {
      r.status = -105;
      r.msg = "a rank outside the list got a communicator";
    }
    if (r.status != ZPP_OK && r.msg.empty()) r.msg = zpp_get_last_error();
    zpp_comm_destroy(pair);
    zpp_comm_destroy(half);
    zpp_comm_destroy(user);
    zpp_comm_destroy(world);
    return r;
  });
  for (int i = 0; i < 4; i++) EXPECT_EQ(res[i].status, ZPP_OK) << i << ": " << res[i].msg;
}

// A root whose host drops our SYNs (here: a loopback listener whose accept
// queue is full, so the kernel drops new SYNs): the connect must give up
// with the timeout, not after the kernel's SYN retries (about 2 minutes).
TEST(Bootstrap, ConnectToAnUnansweringRootIsBoundedByTheTimeout) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  ASSERT_EQ(bind(lfd, (sockaddr *)&sa, sizeof sa), 0);
  ASSERT_EQ(listen(lfd, 0), 0);  // accept queue of one; never accepted
  ASSERT_EQ(getsockname(lfd, (sockaddr *)&sa, &sl), 0);
  int port = ntohs(sa.sin_port);
  ASSERT_GT(port, 1);
  std::vector<int> fill;
  for (int k = 0; k < 3; k++) {  // fill the queue (later SYNs are dropped)
    int f = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(f, 0);
    connect(f, (sockaddr *)&sa, sizeof sa);
    fill.push_back(f);
  }
  usleep(100000);
  auto res = run(1, 20, [&](int, const std::vector<int> &, int) {
    // RANK 1 of the env path connects to MASTER_PORT + 1: our listener.
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port - 1).c_str(), 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    unsetenv("ZPP_BOOTSTRAP_PORT");
    zpp_comm_t c = nullptr;
    zpp_comm_config_t cfg = quick(1.5);
    Result r;
    auto t0 = std::chrono::steady_clock::now();
    r.status = zpp_comm_create_from_env(&cfg, &c);
    r.msg = zpp_get_last_error();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 4.0) r.msg += " [took too long: " + std::to_string(s) + " s]";
    return r;
  });
  for (int f : fill) close(f);
  close(lfd);
  EXPECT_EQ(res[0].status, ZPP_ERR_TIMEOUT) << res[0].msg;
  EXPECT_NE(res[0].msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << res[0].msg;
  EXPECT_EQ(res[0].msg.find("too long"), std::string::npos) << res[0].msg;
}

// ZPP_BOOTSTRAP_PORT out of range: refused at once on every rank, naming
// the variable (the bug it catches: a non-root rank connecting to the
// port's low 16 bits and waiting out the timeout, the root listening on the
// truncated port).
TEST(Bootstrap, BootstrapPortOutOfRangeIsNamedOnEveryRank) {
  // zpp reads its settings once per process: one value per child.
  const char *bad[] = {"-5", "65536", "4294967297"};
  auto res = run(3, 20, [&](int i, const std::vector<int> &, int) {
    Result r;
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    zpp_comm_config_t cfg = quick(1.0);
    {
      const char *v = bad[i];
      setenv("ZPP_BOOTSTRAP_PORT", v, 1);
      zpp_comm_t c = nullptr;
      zpp_status_t s = zpp_comm_create_from_env(&cfg, &c);
      std::string m = zpp_get_last_error();
      if (s != ZPP_ERR_INVALID_ARGUMENT || m.find("ZPP_BOOTSTRAP_PORT") == std::string::npos) {
        r.status = s == ZPP_OK ? -100 : s;
        r.msg = std::string("env path, ZPP_BOOTSTRAP_PORT=") + v + ": " + m;
        return r;
      }
      zpp_unique_id_t id;
      s = zpp_get_unique_id(&id);
      m = zpp_get_last_error();
      if (s != ZPP_ERR_INVALID_ARGUMENT || m.find("ZPP_BOOTSTRAP_PORT") == std::string::npos) {
        r.status = s == ZPP_OK ? -100 : s;
        r.msg = std::string("zpp_get_unique_id, ZPP_BOOTSTRAP_PORT=") + v + ": " + m;
        return r;
      }
    }
    r.status = ZPP_OK;
    return r;
  });
  for (int i = 0; i < 3; i++) EXPECT_EQ(res[i].status, ZPP_OK) << res[i].msg;
}

// Listening sockets of this process (UCX opens and closes other fds on
// its own threads, so a plain fd count is noisy).
int listening_sockets() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent *e = readdir(d)) {
    int fd = std::atoi(e->d_name), on = 0;
    socklen_t len = sizeof on;
    if (e->d_name[0] != '.' && fd != dirfd(d) &&
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on)
      n++;
  }
  closedir(d);
  return n;
}

// A split where one colour's first member cannot listen (ZPP_BOOTSTRAP_ADDR
// is an address of no local interface: bind fails, nothing is sent): every
// rank fails naming it, and the other colour's listener is closed, not
// left open for the life of the process.
TEST(Bootstrap, FailedSplitClosesTheOtherColoursListener) {
  auto res = run(2, 60, [](int i, const std::vector<int> &to, int from) {
    if (i == 1) setenv("ZPP_BOOTSTRAP_ADDR", "192.0.2.1", 1);  // TEST-NET-1
    zpp_unique_id_t id = share_id(i, to, from);
    zpp_comm_config_t cfg = quick(20);
    zpp_comm_t world = nullptr, sub = nullptr;
    Result r;
    r.status = zpp_comm_create_from_id(&id, 2, i, &cfg, &world);
    if (r.status != ZPP_OK) {
      r.msg = zpp_get_last_error();
      return r;
    }
    int before = listening_sockets();
    zpp_status_t s = zpp_comm_split(world, i, 0, &sub);  // each its own colour
    std::string m = zpp_comm_get_last_error(world);
    int after = listening_sockets();
    if (s == ZPP_OK) {
      r.status = -100;
      r.msg = "the split succeeded";
    } else if (m.find(i == 0 ? "rank 1" : "192.0.2.1") == std::string::npos) {
      r.status = -101;
      r.msg = "the error names neither rank 1 nor its address: " + m;
    } else if (after != before) {
      r.status = -102;
      r.msg = "listening sockets: " + std::to_string(before) + " before the failed split, " +
              std::to_string(after) + " after";
    } else {
      r.status = ZPP_OK;
    }
    zpp_comm_destroy(sub);
    zpp_comm_destroy(world);
    return r;
  });
  for (int i = 0; i < 2; i++) EXPECT_EQ(res[i].status, ZPP_OK) << i << ": " << res[i].msg;
}

// Sockets of this process (the fds of /proc/self/fd that are sockets).
int open_sockets() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent *e = readdir(d)) {
    char path[300], link[64];
    std::snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, link, sizeof link - 1);
    if (k > 0 && std::strncmp(link, "socket:", 7) == 0) n++;
  }
  closedir(d);
  return n;
}

// An id that will not be used: zpp_release_unique_id closes its listener
// (and an id of another process, or one released already, is left alone).
TEST(Bootstrap, ReleasedIdClosesItsListener) {
  auto res = run(1, 20, [](int, const std::vector<int> &, int) {
    Result r;
    int before = open_sockets();
    zpp_unique_id_t id;
    if ((r.status = zpp_get_unique_id(&id)) != ZPP_OK) {
      r.msg = zpp_get_last_error();
      return r;
    }
    int listening = open_sockets();
    r.status = zpp_release_unique_id(&id);
    int after = open_sockets();
    zpp_status_t again = zpp_release_unique_id(&id);
    zpp_status_t null = zpp_release_unique_id(nullptr);
    if (r.status == ZPP_OK &&
        (listening != before + 1 || after != before || again != ZPP_OK ||
         null != ZPP_ERR_NULL_POINTER)) {
      r.status = -100;
      r.msg = "sockets " + std::to_string(before) + " -> " + std::to_string(listening) +
              " -> " + std::to_string(after) + "; again " + std::to_string(again) +
              ", NULL " + std::to_string(null);
    }
    return r;
  });
  EXPECT_EQ(res[0].status, ZPP_OK) << res[0].msg;
}

TEST(Bootstrap, BadArgumentsAreNamed) {
  zpp_comm_t c = nullptr;
  zpp_bootstrap_t bs = ZPP_BOOTSTRAP_INIT;
  EXPECT_EQ(zpp_comm_create(nullptr, nullptr, &c), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_comm_create(&bs, nullptr, &c), ZPP_ERR_NULL_POINTER);
  EXPECT_NE(std::string(zpp_get_last_error()).find("allgather"), std::string::npos);
  bs.struct_size = 4;
  EXPECT_EQ(zpp_comm_create(&bs, nullptr, &c), ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(zpp_get_unique_id(nullptr), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(zpp_comm_split(nullptr, 0, 0, &c), ZPP_ERR_NULL_POINTER);
  EXPECT_EQ(c, nullptr);
}

// ---- srun's environment --------------------------------------------------

// The first host of a hostlist, built independently of the parser: each
// host expression is prefix [range list] middle [range list] suffix; the
// first host takes the first number of each bracket as written.
struct Hostlist {
  std::string text, first;
};

Hostlist random_hostlist(std::mt19937 &g) {
  auto pick = [&](int n) { return (int)(g() % (uint32_t)n); };
  auto name = [&](int len) {
    static const char cs[] = "abcdefghijklmnopqrstuvwxyz0123456789-._";
    std::string s;
    for (int i = 0; i < len; i++) s += cs[pick(i == 0 ? 26 : (int)sizeof cs - 1)];
    return s;
  };
  auto number = [&](int width, unsigned v) {
    std::string d = std::to_string(v);
    while ((int)d.size() < width) d = "0" + d;
    return d;
  };
  Hostlist h;
  int hosts = 1 + pick(3);
  for (int k = 0; k < hosts; k++) {
    std::string text, first;
    int parts = 1 + pick(3);
    for (int p = 0; p < parts; p++) {
      std::string pre = name(pick(p == 0 ? 6 : 3) + (p == 0 ? 1 : 0));
      text += pre;
      first += pre;
      if (pick(4) == 0) continue;  // no bracket in this part
      int width = 1 + pick(3), items = 1 + pick(3);
      text += "[";
      for (int it = 0; it < items; it++) {
        unsigned a = (unsigned)pick(90), b = a + (unsigned)pick(20);
        std::string da = number(width, a);
        if (it == 0) first += da;
        text += (it ? "," : "") + da;
        if (pick(2)) text += "-" + number(width, b);
      }
      text += "]";
    }
    h.text += (k ? "," : "") + text;
    if (k == 0) h.first = first;
  }
  return h;
}

TEST(SlurmHostlist, FirstHostOfWrittenForms) {
  const char *cases[][2] = {
      {"node[01-04,07],gpu3", "node01"},
      {"a-[1-2]-b", "a-1-b"},
      {"gpu3", "gpu3"},
      {"node007", "node007"},
      {"node[007]", "node007"},
      {"node[0010-0020]", "node0010"},
      {"rack[2-3]-node[08-12,1]", "rack2-node08"},
      {"[5-6]x", "5x"},
      {"c1.cluster.example,c2", "c1.cluster.example"},
      {"n[9-10],m[1-2]", "n9"},
      {"host_a[3]", "host_a3"},
  };
  for (auto &c : cases) {
    char out[256] = "unset";
    ASSERT_EQ(zpp_slurm_first_host("SLURM_STEP_NODELIST", c[0], out, sizeof out, "test"),
              ZPP_OK)
        << c[0] << ": " << zpp_get_last_error();
    EXPECT_STREQ(out, c[1]) << c[0];
  }
  std::printf("seed ZPP_TEST_SEED=%llu\n", (unsigned long long)seed());
  std::mt19937 g((uint32_t)seed());
  for (int i = 0; i < 2000; i++) {
    Hostlist h = random_hostlist(g);
    char out[256] = "unset";
    ASSERT_EQ(zpp_slurm_first_host("SLURM_JOB_NODELIST", h.text.c_str(), out, sizeof out, "t"),
              ZPP_OK)
        << h.text << ": " << zpp_get_last_error();
    ASSERT_EQ(std::string(out), h.first) << h.text;
  }
}

TEST(SlurmHostlist, MalformedListsAreNamedWithTheirValue) {
  const char *bad[] = {"",          ",node1",      "node1,",       "a,,b",
                       "node[",     "node[1-3",    "node]1",       "node[]",
                       "node[a-b]", "node[3-1]",   "node[1-]",     "node[-1]",
                       "node[1,]",  "node[[1]]",   "node 1",       "node[1:2]",
                       "nöde",      "n[1]x[2-1]",  "ok,bad[2-1]",  "n[1234567890123456789]"};
  for (const char *b : bad) {
    char out[256] = "unset";
    EXPECT_EQ(zpp_slurm_first_host("SLURM_STEP_NODELIST", b, out, sizeof out, "test"),
              ZPP_ERR_INVALID_ARGUMENT)
        << "accepted \"" << b << "\" as " << out;
    std::string m = zpp_get_last_error();
    EXPECT_NE(m.find("SLURM_STEP_NODELIST"), std::string::npos) << m;
    if (b[0] != '\0') {
      EXPECT_NE(m.find(std::string("\"") + b + "\""), std::string::npos) << m;
    }
    EXPECT_STREQ(out, "") << b;  // no partial host left behind
  }
  // a first host longer than the output buffer
  char small[8];
  EXPECT_EQ(zpp_slurm_first_host("SLURM_STEP_NODELIST", "node[0000001]", small, sizeof small,
                                 "test"),
            ZPP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zpp_get_last_error()).find("too long"), std::string::npos);
  EXPECT_EQ(zpp_slurm_first_host("SLURM_STEP_NODELIST", "node[001-9]", small, sizeof small,
                                 "test"),
            ZPP_OK);
  EXPECT_STREQ(small, "node001");
}

// Host names are ASCII: a locale whose isalnum() takes more (Latin-1's
// 0xE9, 'e' acute) must not widen what the parser accepts.  The locale is
// made with localedef into a temporary LOCPATH; without localedef or its
// sources the test is skipped.
TEST(SlurmHostlist, NonAsciiBytesAreRefusedWhateverTheLocale) {
  char dir[] = "/tmp/zpp-locale.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string cmd = std::string("localedef -i en_US -f ISO-8859-1 ") + dir +
                    "/lat1 > /dev/null 2>&1";
  int made = std::system(cmd.c_str());
  auto res = run(1, 20, [&](int, const std::vector<int> &, int) {
    Result r;
    setenv("LOCPATH", dir, 1);
    if (made != 0 || setlocale(LC_CTYPE, "lat1") == nullptr || !isalnum(0xE9)) {
      r.status = 1;  // no such locale here
      return r;
    }
    r.status = ZPP_OK;
    for (int c = 0x80; c <= 0xFF; c++) {
      char list[8] = {'n', (char)c, '1', '\0'}, out[64];
      if (zpp_slurm_first_host("SLURM_STEP_NODELIST", list, out, sizeof out, "t") !=
          ZPP_ERR_INVALID_ARGUMENT) {
        r.status = -100;
        r.msg = "byte " + std::to_string(c) + " accepted in a host name (locale " +
                setlocale(LC_CTYPE, nullptr) + ")";
        return r;
      }
    }
    return r;
  });
  std::system((std::string("rm -rf ") + dir).c_str());
  if (res[0].status == 1) GTEST_SKIP() << "no Latin-1 locale could be made (localedef)";
  EXPECT_EQ(res[0].status, ZPP_OK) << res[0].msg;
}

// Sets (value != nullptr) or unsets each variable, in this process.
void set_env(std::initializer_list<std::pair<const char *, const char *>> vars) {
  for (auto &v : vars) {
    if (v.second != nullptr)
      setenv(v.first, v.second, 1);
    else
      unsetenv(v.first);
  }
}

TEST(SlurmEnv, PortIsTheDocumentedFunctionOfJobAndStep) {
  auto res = run(1, 20, [](int, const std::vector<int> &, int) {
    Result r;
    r.status = ZPP_OK;
    std::vector<long> seen;
    for (unsigned long long job : {0ull, 1ull, 7ull, 123456ull, 4294967295ull}) {
      for (unsigned long long step = 0; step < 40; step++) {
        set_env({{"SLURM_JOB_ID", std::to_string(job).c_str()},
                 {"SLURM_STEP_ID", std::to_string(step).c_str()}});
        long port = -1;
        if (zpp_slurm_port("t", &port) != ZPP_OK) {
          r.status = -100;
          r.msg = zpp_get_last_error();
          return r;
        }
        long want = 10000 + 2 * (long)((job * 61 + step) % 11000);
        if (port != want || port < 10000 || port + 1 > 32767) {
          r.status = -101;
          r.msg = "job " + std::to_string(job) + " step " + std::to_string(step) + ": port " +
                  std::to_string(port) + ", want " + std::to_string(want);
          return r;
        }
        if (job == 123456ull) seen.push_back(port);
      }
    }
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
      r.status = -102;
      r.msg = "two steps of one job share a port";
    }
    for (const char *bad : {"", "x", "-1", "4294967296", "12 "}) {
      set_env({{"SLURM_JOB_ID", bad}});
      long port = 0;
      std::string m;
      if (zpp_slurm_port("t", &port) != ZPP_ERR_INVALID_ARGUMENT ||
          (m = zpp_get_last_error()).find("SLURM_JOB_ID") == std::string::npos) {
        r.status = -103;
        r.msg = std::string("SLURM_JOB_ID=\"") + bad + "\": " + m;
      }
    }
    return r;
  });
  EXPECT_EQ(res[0].status, ZPP_OK) << res[0].msg;
}

// A port P whose P + 1 (the bootstrap's) is free on 127.0.0.1 now, as the
// port of some SLURM_JOB_ID: the test then leaves MASTER_PORT unset.
unsigned long long job_with_free_port() {
  for (unsigned long long job = 1000 + seed() % 100000; job < 2000000; job++) {
    long port = 10000 + 2 * (long)((job * 61) % 11000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)(port + 1));
    bool ok = bind(fd, (sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) return job;
  }
  return 0;
}

// srun starts every task with SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_STEP_NODELIST, SLURM_JOB_ID and SLURM_STEP_ID; no RANK, no MASTER_*.
TEST(SlurmEnv, CommunicatorFromSrunsVariables) {
  unsigned long long job = job_with_free_port();
  ASSERT_NE(job, 0u);
  auto res = run(3, 60, [job](int i, const std::vector<int> &, int) {
    std::string js = std::to_string(job), rank = std::to_string(i);
    set_env({{"RANK", nullptr},
             {"WORLD_SIZE", nullptr},
             {"LOCAL_RANK", nullptr},
             {"MASTER_ADDR", nullptr},
             {"MASTER_PORT", nullptr},
             {"OMPI_COMM_WORLD_SIZE", nullptr},
             {"ZPP_BOOTSTRAP_PORT", nullptr},
             {"SLURM_PROCID", rank.c_str()},
             {"SLURM_LOCALID", rank.c_str()},
             {"SLURM_NTASKS", "3"},
             {"SLURM_JOB_ID", js.c_str()},
             {"SLURM_STEP_ID", "0"},
             {"SLURM_STEP_NODELIST", "localhost,node[2-3]"},
             {"SLURM_JOB_NODELIST", "unused[1-9]"}});
    zpp_comm_config_t cfg = quick(30);
    zpp_comm_t c = nullptr;
    Result r;
    r.status = zpp_comm_create_from_env(&cfg, &c);
    if (r.status != ZPP_OK) {
      r.msg = zpp_get_last_error();
      return r;
    }
    int rk = -1, n = -1;
    zpp_comm_rank(c, &rk);
    zpp_comm_size(c, &n);
    r = check_allgather(c, 9);
    if (r.status == ZPP_OK && (rk != i || n != 3)) {
      r.status = -101;
      r.msg = "rank " + std::to_string(rk) + " of " + std::to_string(n);
    }
    zpp_comm_destroy(c);
    return r;
  });
  for (int i = 0; i < 3; i++) EXPECT_EQ(res[i].status, ZPP_OK) << i << ": " << res[i].msg;
}

// Which processes read srun's variables: srun's tasks (also with srun's
// PMI plugins, --mpi=pmi2 or pmix, whose rank is SLURM_PROCID), not the
// ranks of a launcher started inside an allocation, which inherit its
// SLURM_*: Open MPI's mpirun, MPICH's or Intel MPI's hydra (whose proxies
// srun starts, one per node: SLURM_PROCID is the node's index there).
TEST(SlurmEnv, OtherLaunchersInsideAnAllocationAreNotSrun) {
  struct Case {
    std::vector<std::pair<const char *, const char *>> env;
    int want;
    const char *what;
  };
  std::vector<Case> cases = {
      {{}, 1, "srun's task"},
      {{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, 1, "srun --mpi=pmi2"},
      {{{"PMIX_RANK", "1"}}, 1, "srun --mpi=pmix"},
      {{{"RANK", "1"}}, 0, "torchrun's RANK"},
      {{{"OMPI_COMM_WORLD_SIZE", "2"}}, 0, "Open MPI's mpirun"},
      {{{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"}}, 0, "hydra"},
      {{{"PMI_RANK", "1"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"}}, 0,
       "hydra, PMI_RANK equal to the node's index"},
      {{{"PMI_RANK", "1"}, {"PMI_SIZE", "8"}}, 0, "PMI_SIZE unlike SLURM_NTASKS"},
      {{{"PMI_SIZE", "2"}}, 0, "PMI_SIZE without PMI_RANK"},
      {{{"PMI_RANK", "3"}}, 0, "PMI_RANK unlike SLURM_PROCID"},
      {{{"MPI_LOCALRANKID", "0"}}, 0, "MPI_LOCALRANKID"},
      {{{"PMIX_RANK", "3"}}, 0, "PMIX_RANK unlike SLURM_PROCID"},
  };
  auto res = run((int)cases.size(), 20, [&](int i, const std::vector<int> &, int) {
    set_env({{"RANK", nullptr},
             {"OMPI_COMM_WORLD_SIZE", nullptr},
             {"PMI_RANK", nullptr},
             {"PMI_SIZE", nullptr},
             {"PMIX_RANK", nullptr},
             {"MPI_LOCALRANKID", nullptr},
             {"SLURM_PROCID", "1"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_STEP_ID", "0"}});
    for (auto &v : cases[i].env) set_env({v});
    Result r;
    int got = zpp_env_slurm();
    r.status = got == cases[i].want ? ZPP_OK : -100;
    r.msg = std::string(cases[i].what) + ": zpp_env_slurm() " + std::to_string(got);
    return r;
  });
  for (size_t i = 0; i < cases.size(); i++) EXPECT_EQ(res[i].status, ZPP_OK) << res[i].msg;
}

TEST(SlurmEnv, BadOrMissingVariablesAreNamed) {
  struct Case {
    std::vector<std::pair<const char *, const char *>> env;
    const char *want;
  };
  // Every case starts from a complete srun environment of rank 1 of 2
  // (rank 1: nothing listens) and changes it.
  const std::string long_addr(300, 'a');
  std::vector<Case> cases = {
      {{{"SLURM_STEP_ID", nullptr}}, "SLURM_STEP_ID is not"},
      {{{"SLURM_NTASKS", nullptr}}, "SLURM_NTASKS is not set (srun"},
      {{{"SLURM_NTASKS", "two"}}, "SLURM_NTASKS \"two\""},
      {{{"SLURM_PROCID", "-1"}}, "SLURM_PROCID \"-1\""},
      {{{"SLURM_LOCALID", "x"}}, "SLURM_LOCALID \"x\""},
      {{{"SLURM_STEP_NODELIST", "node[1-"}}, "SLURM_STEP_NODELIST \"node[1-\""},
      {{{"SLURM_STEP_NODELIST", nullptr}, {"SLURM_JOB_NODELIST", "n[2-1]"}},
       "SLURM_JOB_NODELIST \"n[2-1]\""},
      {{{"SLURM_STEP_NODELIST", nullptr}, {"SLURM_JOB_NODELIST", nullptr}},
       "SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST"},
      {{{"SLURM_JOB_ID", nullptr}}, "SLURM_JOB_ID is not set"},
      // mpirun inside an allocation: the SLURM_* are the allocation's
      {{{"OMPI_COMM_WORLD_SIZE", "2"}}, "RANK is not set"},
      // MPICH's or Intel MPI's hydra inside an allocation
      {{{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"}}, "RANK is not set"},
      // a longer MASTER_ADDR is named, not cut to the buffer and resolved
      {{{"MASTER_ADDR", long_addr.c_str()}}, "MASTER_ADDR \"aaaa"},
      {{{"MASTER_ADDR", long_addr.c_str()}}, "300 characters, longer than the 255"},
  };
  auto res = run((int)cases.size(), 30, [&](int i, const std::vector<int> &, int) {
    set_env({{"RANK", nullptr},
             {"WORLD_SIZE", nullptr},
             {"LOCAL_RANK", nullptr},
             {"MASTER_ADDR", nullptr},
             {"MASTER_PORT", nullptr},
             {"OMPI_COMM_WORLD_SIZE", nullptr},
             {"PMI_RANK", nullptr},
             {"PMI_SIZE", nullptr},
             {"PMIX_RANK", nullptr},
             {"MPI_LOCALRANKID", nullptr},
             {"SLURM_PROCID", "1"},
             {"SLURM_LOCALID", "1"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_JOB_ID", "77"},
             {"SLURM_STEP_ID", "3"},
             {"SLURM_STEP_NODELIST", "localhost"},
             {"SLURM_JOB_NODELIST", "localhost"}});
    for (auto &v : cases[i].env) set_env({v});
    zpp_comm_config_t cfg = quick(1.0);
    zpp_comm_t c = nullptr;
    Result r;
    zpp_status_t s = zpp_comm_create_from_env(&cfg, &c);
    r.msg = zpp_get_last_error();
    r.status = s == ZPP_ERR_INVALID_ARGUMENT && r.msg.find(cases[i].want) != std::string::npos
                   ? ZPP_OK
                   : (s == ZPP_OK ? -100 : s);
    zpp_comm_destroy(c);
    return r;
  });
  for (size_t i = 0; i < cases.size(); i++)
    EXPECT_EQ(res[i].status, ZPP_OK) << "want \"" << cases[i].want << "\": " << res[i].msg;
}

}  // namespace
