// The fork harness of the fault suites (tests/fork_job.h): a rank that
// dies between its ready and the parent's go, a rank that crashes, a
// rank that exits with a code, and a fork that fails part-way.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <string>

#include "fork_job.h"

namespace {

struct Res {
  int status = 99; // 99: no result
  int rank = -1;
  std::string msg;
};

std::string encode(const Res &r) {
  std::ostringstream o;
  o << r.status << ' ' << r.rank << ' ' << r.msg;
  return o.str();
}

Res decode(const std::string &s) {
  Res r;
  std::istringstream in(s);
  in >> r.status >> r.rank;
  std::getline(in, r.msg);
  return r;
}

using Ctl = zpp_test::ForkCtl;
using Job = zpp_test::ForkJob<Res, encode, decode>;

Res normal(int i, const Ctl &c) {
  c.ready();
  c.wait_go();
  Res r;
  r.status = 0;
  r.rank = i;
  r.msg = "ok";
  return r;
}

// Waits, without reaping it, until the child has ended.
void wait_dead(pid_t p) {
  siginfo_t info;
  while (waitid(P_PID, (id_t)p, &info, WEXITED | WNOWAIT) != 0 &&
         errno == EINTR) {
  }
}

bool has(const std::string &s, const std::string &what) {
  return s.find(what) != std::string::npos;
}

// The parent's go to a rank whose go pipe is closed fails with EPIPE: the
// test goes on (no SIGPIPE) and the rank's status says it died before go.
TEST(ForkJob, RankDeadBetweenReadyAndGo) {
  Job job(3, [](int i, const Ctl &c) {
    if (i == 1) {
      c.ready();
      _exit(7);
    }
    return normal(i, c);
  });
  ASSERT_TRUE(job.all_ready(10));
  wait_dead(job.pid[1]);
  job.go();
  std::vector<Res> res = job.finish(10);
  EXPECT_EQ(res[1].status, 97) << res[1].msg;
  EXPECT_TRUE(has(res[1].msg, "rank 1 died before go: exit 7")) << res[1].msg;
  for (int i : {0, 2}) {
    EXPECT_EQ(res[i].status, 0) << i << ": " << res[i].msg;
    EXPECT_EQ(res[i].rank, i);
  }
}

// A rank that crashes after the go: no result, and how it ended is kept
// (signal 11, not the parent's SIGKILL).
TEST(ForkJob, CrashedRankKeepsItsSignal) {
  Job job(3, [](int i, const Ctl &c) {
    if (i == 2) {
      c.ready();
      c.wait_go();
      signal(SIGSEGV, SIG_DFL); // a sanitizer's handler would exit instead
      raise(SIGSEGV);
    }
    return normal(i, c);
  });
  ASSERT_TRUE(job.all_ready(10));
  job.go();
  std::vector<Res> res = job.finish(10);
  EXPECT_EQ(res[2].status, 99);
  EXPECT_TRUE(has(res[2].msg, "signal 11")) << res[2].msg;
  EXPECT_TRUE(job.died_by(2, SIGSEGV)) << job.how(2);
  EXPECT_FALSE(job.died_by(2, SIGKILL)) << job.how(2);
  for (int i : {0, 1})
    EXPECT_EQ(res[i].status, 0) << i << ": " << res[i].msg;
}

// A rank that exits with a code and a rank the parent kills: "exit 3" and
// "signal 9", told apart.
TEST(ForkJob, ExitCodeAndParentsKillAreToldApart) {
  Job job(3, [](int i, const Ctl &c) {
    if (i == 0) {
      c.ready();
      c.wait_go();
      _exit(3);
    }
    return normal(i, c);
  });
  ASSERT_TRUE(job.all_ready(10));
  job.kill_rank(1);
  job.go();
  std::vector<Res> res = job.finish(10);
  EXPECT_EQ(res[0].status, 99);
  EXPECT_TRUE(has(res[0].msg, "exit 3")) << res[0].msg;
  EXPECT_FALSE(job.died_by(0, SIGKILL)) << job.how(0);
  EXPECT_TRUE(job.died_by(1, SIGKILL)) << job.how(1);
  EXPECT_TRUE(has(res[1].msg, "signal 9")) << res[1].msg;
  EXPECT_EQ(res[2].status, 0) << res[2].msg;
}

int g_forks = 0;
pid_t fork_failing_third() {
  if (++g_forks == 3) {
    errno = EAGAIN;
    return -1;
  }
  return fork();
}

// fork() fails for the third rank: the two forked ranks are SIGKILLed and
// reaped at once, the test gets a failure, and nothing reaches pid -1.
TEST(ForkJob, FailedForkKillsAndReapsTheForkedRanks) {
  testing::TestPartResultArray failures;
  bool ready = true, killed[2] = {false, false}, gone[2] = {false, false};
  std::vector<Res> res;
  {
    testing::ScopedFakeTestPartResultReporter rep(
        testing::ScopedFakeTestPartResultReporter::
            INTERCEPT_ONLY_CURRENT_THREAD,
        &failures);
    g_forks = 0;
    zpp_test::g_fork = fork_failing_third;
    Job job(4, normal);
    zpp_test::g_fork = fork;
    for (int i = 0; i < 2; i++) {
      killed[i] = job.died_by(i, SIGKILL);
      // already reaped: no child of that pid is left
      gone[i] = job.pid[i] > 0 && waitpid(job.pid[i], nullptr, WNOHANG) < 0 &&
                errno == ECHILD;
    }
    ready = job.all_ready(1);
    job.go();
    res = job.finish(1);
  }
  zpp_test::g_fork = fork;
  ASSERT_EQ(failures.size(), 1);
  EXPECT_TRUE(has(failures.GetTestPartResult(0).message(), "fork of rank 2"))
      << failures.GetTestPartResult(0).message();
  for (int i = 0; i < 2; i++) {
    EXPECT_TRUE(killed[i]) << "rank " << i << " not SIGKILLed";
    EXPECT_TRUE(gone[i]) << "rank " << i << " not reaped";
  }
  EXPECT_FALSE(ready);
  ASSERT_EQ(res.size(), 4u);
  for (const Res &r : res)
    EXPECT_EQ(r.status, 96) << r.msg;
}

} // namespace
