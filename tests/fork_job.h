// Forked ranks of the fault suites (tests/test_shrink.cc,
// tests/test_recover.cc): plain processes, no MPI, each with its pipes to
// the parent.  body(i, ctl) runs in child i; ctl.ready() tells the parent
// this rank's communicator works, ctl.wait_go() waits for the parent's go
// (sent after the kills), id_w / id_r carry rank 0's unique id to the
// others.  The child's Res goes back as text, through the suite's Encode
// and Decode.  A ForkJob that ends (a failed ASSERT
// included) SIGKILLs and reaps the children still running.
#ifndef ZPP_TESTS_FORK_JOB_H
#define ZPP_TESTS_FORK_JOB_H

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace zpp_test {

inline double mono_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
  bool closed = false;
  double t_kill = 0; // when the last kill_rank killed

  ForkJob(int n_, const std::function<Res(int, const ForkCtl &)> &body)
      : n(n_), pid(n_), res_r(n_), ready_r(n_), go_w(n_), reaped(n_, false) {
    std::vector<int> res_w(n), ready_w(n), go_r(n), id_r(n), id_w(n);
    for (int i = 0; i < n; i++) {
      int p[2], q[2], g[2], d[2];
      if (pipe(p) != 0 || pipe(q) != 0 || pipe(g) != 0 || pipe(d) != 0)
        std::abort();
      res_r[i] = p[0];
      res_w[i] = p[1];
      ready_r[i] = q[0];
      ready_w[i] = q[1];
      go_r[i] = g[0];
      go_w[i] = g[1];
      id_r[i] = d[0];
      id_w[i] = d[1];
    }
    for (int i = 0; i < n; i++) {
      pid[i] = fork();
      if (pid[i] == 0) {
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
    for (int i = 0; i < n; i++) {
      close(res_w[i]);
      close(ready_w[i]);
      close(go_r[i]);
      close(id_r[i]);
      close(id_w[i]);
    }
  }

  ~ForkJob() {
    for (int i = 0; i < n; i++)
      if (!reaped[i] && pid[i] > 0) {
        kill(pid[i], SIGKILL);
        waitpid(pid[i], nullptr, 0);
        reaped[i] = true;
      }
    close_pipes();
  }

  void close_pipes() {
    if (closed)
      return;
    closed = true;
    for (int i = 0; i < n; i++) {
      close(res_r[i]);
      close(ready_r[i]);
      close(go_w[i]);
    }
  }

  // Waits until every rank but those in `skip` said ready; false after
  // limit_s.
  bool all_ready(double limit_s, const std::vector<int> &skip = {}) {
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
    kill(pid[v], SIGKILL);
    int st;
    waitpid(pid[v], &st, 0);
    reaped[v] = true;
  }

  void go() {
    for (int i = 0; i < n; i++)
      if (!reaped[i])
        go_one(i);
  }

  void go_one(int i) {
    char b = 1;
    if (write(go_w[i], &b, 1) != 1) {
    }
  }

  // Results of every rank (a killed one: Res's default); children still
  // running after limit_s are killed (status 98).
  std::vector<Res> finish(double limit_s) {
    std::vector<Res> out(n);
    double t0 = mono_s();
    for (int i = 0; i < n; i++) {
      int st = 0;
      bool timed_out = false;
      while (!reaped[i]) {
        if (waitpid(pid[i], &st, WNOHANG) == pid[i])
          break;
        if (mono_s() - t0 > limit_s) {
          kill(pid[i], SIGKILL);
          waitpid(pid[i], &st, 0);
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
      if (timed_out)
        out[i].status = 98;
      else if (!text.empty())
        out[i] = Decode(text);
    }
    close_pipes();
    return out;
  }
};

} // namespace zpp_test

#endif
