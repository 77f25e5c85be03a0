// Forked ranks of the fault suites (tests/test_shrink.cc,
// tests/test_recover.cc): plain processes, no MPI, each with its pipes to
// the parent.  body(i, ctl) runs in child i; ctl.ready() tells the parent
// this rank's communicator works, ctl.wait_go() waits for the parent's go
// (sent after the kills), id_w / id_r carry rank 0's unique id to the
// others.  The child's Res goes back as text, through the suite's Encode
// and Decode (Res has `status` and `msg`).  A ForkJob that ends (a failed
// ASSERT included) SIGKILLs and reaps the children still running.  The
// parent ignores SIGPIPE (a rank that died before its go closes the go
// pipe: the write fails with EPIPE); the children keep the default.
// Statuses set here: 96 the job did not start (pipe or fork failed), 97
// the rank died before its go, 98 still running at finish's limit, and a
// rank without a result keeps Res's default (99 in both suites) with
// `msg` saying how it ended ("signal N", "exit N", from its wait status).
#ifndef ZPP_TESTS_FORK_JOB_H
#define ZPP_TESTS_FORK_JOB_H

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace zpp_test {

inline double mono_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// fork(), replaceable by the harness's own test (to make it fail).
inline pid_t (*g_fork)() = fork;

// "signal N" / "exit N" of a wait status.
inline std::string wait_status_text(int st) {
  if (WIFSIGNALED(st))
    return "signal " + std::to_string(WTERMSIG(st)) + " (" +
           strsignal(WTERMSIG(st)) + ")";
  if (WIFEXITED(st))
    return "exit " + std::to_string(WEXITSTATUS(st));
  return "wait status " + std::to_string(st);
}

struct ForkCtl {
  int ready_w = -1, go_r = -1;
  std::vector<int> id_w;
  int id_r = -1;
  void ready() const {
    char b = 1;
    if (write(ready_w, &b, 1) != 1)
      _exit(4);
  }
  void wait_go() const {
    char b;
    if (read(go_r, &b, 1) != 1)
      _exit(4);
  }
};

template <class Res, std::string (*Encode)(const Res &),
          Res (*Decode)(const std::string &)>
struct ForkJob {
  int n;
  std::vector<pid_t> pid;
  std::vector<int> res_r, ready_r, go_w;
  std::vector<bool> reaped;
  std::vector<int> wstat;           // each reaped child's wait status
  std::vector<bool> died_before_go; // its go pipe was closed (EPIPE)
  bool started = false;             // every pipe and fork succeeded
  bool closed = false;
  double t_kill = 0; // when the last kill_rank killed

  ForkJob(int n_, const std::function<Res(int, const ForkCtl &)> &body)
      : n(n_), pid(n_, -1), res_r(n_, -1), ready_r(n_, -1), go_w(n_, -1),
        reaped(n_, false), wstat(n_, -1), died_before_go(n_, false) {
    std::vector<int> res_w(n, -1), ready_w(n, -1), go_r(n, -1), id_r(n, -1),
        id_w(n, -1);
    auto close_child_ends = [&] {
      for (int i = 0; i < n; i++)
        for (int fd : {res_w[i], ready_w[i], go_r[i], id_r[i], id_w[i]})
          if (fd >= 0)
            close(fd);
    };
    for (int i = 0; i < n; i++) {
      int p[2], q[2], g[2], d[2];
      bool ok = pipe(p) == 0;
      if (ok) {
        res_r[i] = p[0];
        res_w[i] = p[1];
        ok = pipe(q) == 0;
      }
      if (ok) {
        ready_r[i] = q[0];
        ready_w[i] = q[1];
        ok = pipe(g) == 0;
      }
      if (ok) {
        go_r[i] = g[0];
        go_w[i] = g[1];
        ok = pipe(d) == 0;
      }
      if (!ok) {
        ADD_FAILURE() << "pipe for rank " << i << ": " << strerror(errno);
        close_child_ends();
        return; // the destructor closes the parent's ends
      }
      id_r[i] = d[0];
      id_w[i] = d[1];
    }
    for (int i = 0; i < n; i++) {
      pid[i] = g_fork();
      if (pid[i] < 0) {
        ADD_FAILURE() << "fork of rank " << i << " of " << n << ": "
                      << strerror(errno);
        close_child_ends();
        for (int j = 0; j < i; j++) {
          if (pid[j] <= 0)
            continue;
          kill(pid[j], SIGKILL);
          waitpid(pid[j], &wstat[j], 0);
          reaped[j] = true;
        }
        return;
      }
      if (pid[i] == 0) {
        signal(SIGPIPE, SIG_DFL); // the parent may ignore it
        // only its own ends stay open (another rank's write end held here
        // would keep that rank's reader from seeing its end)
        for (int j = 0; j < n; j++) {
          close(res_r[j]);
          close(ready_r[j]);
          close(go_w[j]);
          if (j != i) {
            close(res_w[j]);
            close(ready_w[j]);
            close(go_r[j]);
            close(id_r[j]);
          }
          if (i != 0)
            close(id_w[j]);
        }
        ForkCtl c;
        c.ready_w = ready_w[i];
        c.go_r = go_r[i];
        c.id_w = id_w;
        c.id_r = id_r[i];
        Res r = body(i, c);
        std::string out = Encode(r);
        ssize_t k = write(res_w[i], out.data(), out.size());
        (void)k;
        _exit(0);
      }
    }
    // a rank that dies before its go: go_one's write fails with EPIPE
    // instead of killing the test
    static const bool sigpipe_ignored = signal(SIGPIPE, SIG_IGN) != SIG_ERR;
    (void)sigpipe_ignored;
    close_child_ends();
    started = true;
  }

  ForkJob(const ForkJob &) = delete;
  ForkJob &operator=(const ForkJob &) = delete;

  // How rank i ended ("signal 9 (Killed)", "exit 3"); "running" before.
  std::string how(int i) const {
    return reaped[i] ? wait_status_text(wstat[i]) : "running";
  }

  // Whether rank i was reaped after death by signal `sig`.
  bool died_by(int i, int sig) const {
    return reaped[i] && wstat[i] != -1 && WIFSIGNALED(wstat[i]) &&
           WTERMSIG(wstat[i]) == sig;
  }

  ~ForkJob() {
    for (int i = 0; i < n; i++)
      if (!reaped[i] && pid[i] > 0) {
        kill(pid[i], SIGKILL);
        waitpid(pid[i], &wstat[i], 0);
        reaped[i] = true;
      }
    close_pipes();
  }

  void close_pipes() {
    if (closed)
      return;
    closed = true;
    for (int i = 0; i < n; i++)
      for (int fd : {res_r[i], ready_r[i], go_w[i]})
        if (fd >= 0)
          close(fd);
  }

  // Waits until every rank but those in `skip` said ready; false after
  // limit_s.
  bool all_ready(double limit_s, const std::vector<int> &skip = {}) {
    if (!started)
      return false;
    double t0 = mono_s();
    for (int i = 0; i < n; i++) {
      if (std::find(skip.begin(), skip.end(), i) != skip.end())
        continue;
      char b;
      for (;;) {
        struct pollfd p = {ready_r[i], POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
          if (read(ready_r[i], &b, 1) != 1)
            return false;
          break;
        }
        if (mono_s() - t0 > limit_s)
          return false;
      }
    }
    return true;
  }

  void kill_rank(int v) {
    t_kill = mono_s();
    if (pid[v] <= 0 || reaped[v])
      return;
    kill(pid[v], SIGKILL);
    waitpid(pid[v], &wstat[v], 0);
    reaped[v] = true;
  }

  void go() {
    for (int i = 0; i < n; i++)
      if (!reaped[i])
        go_one(i);
  }

  void go_one(int i) {
    if (!started)
      return;
    char b = 1;
    if (write(go_w[i], &b, 1) != 1 && errno == EPIPE)
      died_before_go[i] = true;
  }

  // Results of every rank (a killed one: Res's default, its msg saying how
  // it ended); children still running after limit_s are killed (status
  // 98); a rank that died before its go: 97; a job that did not start: 96.
  std::vector<Res> finish(double limit_s) {
    std::vector<Res> out(n);
    if (!started) {
      for (auto &r : out) {
        r.status = 96;
        r.msg = "the job did not start (pipe or fork failed)";
      }
      close_pipes();
      return out;
    }
    double t0 = mono_s();
    for (int i = 0; i < n; i++) {
      bool timed_out = false;
      while (!reaped[i] && pid[i] > 0) {
        if (waitpid(pid[i], &wstat[i], WNOHANG) == pid[i])
          break;
        if (mono_s() - t0 > limit_s) {
          kill(pid[i], SIGKILL);
          waitpid(pid[i], &wstat[i], 0);
          timed_out = true;
          break;
        }
        usleep(10000);
      }
      reaped[i] = true;
      std::string text;
      char buf[4096];
      ssize_t k;
      while (!timed_out && (k = read(res_r[i], buf, sizeof buf)) > 0)
        text.append(buf, (size_t)k);
      if (timed_out) {
        out[i].status = 98;
        out[i].msg = "still running after " + std::to_string(limit_s) + " s";
      } else if (!text.empty()) {
        out[i] = Decode(text);
      } else if (died_before_go[i]) {
        out[i].status = 97;
        out[i].msg = "rank " + std::to_string(i) + " died before go: " + how(i);
      } else {
        out[i].msg = "no result: " + how(i);
      }
    }
    close_pipes();
    return out;
  }
};

} // namespace zpp_test

#endif
