// zpp's TCP bootstrap and zpp_comm_create over a caller's table, without
// MPI: each test forks plain processes (loopback only, every wait bounded)
// and collects each one's status and message through a pipe.  The
// launcher-based tests (tests/bootstrap.cmake) cover the torchrun path;
// this suite covers unique ids (malformed, stale), a user bootstrap and
// subsets over TCP.
//
// Seed: ZPP_TEST_SEED (default 20261129), printed.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zpp/zpp.h>
#include <zpp/zpp_coll.h>
#include <zpp/zpp_comm.h>

#include <chrono>
#include <cstdint>
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

}  // namespace
