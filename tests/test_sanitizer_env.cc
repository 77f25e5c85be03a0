// The ASan harness's own settings (Makefile ASAN_ENV), checked on the case
// that failed CI: LeakSanitizer's stop-the-world tracer segfaulting on a
// dynamic TLS block ("Tracer caught signal 11", after every test of
// coll_2x2 had passed).
//
// Up to GCC 13, the sanitizer runtime's __tls_get_addr interceptor takes a
// dynamic TLS block whose address is 16 mod 4096 for glibc 2.19's layout
// and reads the 16 bytes before it as {start, size}.  glibc >= 2.25 has no
// such header: the block comes from malloc, and those bytes are the ASan
// chunk header, so the range the tracer later scans is garbage
// (google/sanitizers#1322).  Open MPI's and UCX's plugins have TLS and are
// loaded with dlopen, so every rank of an MPI suite hits it now and then.
// ASAN_OPTIONS=intercept_tls_get_addr=0 skips the interception (dynamic
// TLS is then not scanned for roots).
//
// Without that option this test dies in the tracer on every run here
// (gcc 12, glibc 2.36): threads touch a dlopen'ed module's TLS and a
// leak check runs while they live.  Built only with ZPP_SANITIZE=address.
#include <dlfcn.h>
#include <sanitizer/lsan_interface.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#ifndef ZPP_TLS_MODULE
#error "ZPP_TLS_MODULE: path of the TLS probe module (tests/sanitizer_env.cmake)"
#endif

TEST(SanitizerEnv, LeakCheckSurvivesTheDynamicTlsOfLoadedModules)
{
  void *mod = dlopen(ZPP_TLS_MODULE, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(mod, nullptr) << dlerror();
  auto touch = reinterpret_cast<int *(*)(void)>(dlsym(mod, "zpp_tls_probe_touch"));
  ASSERT_NE(touch, nullptr) << dlerror();

  // 64 live threads, one dynamic TLS block each: with the interception on,
  // the blocks walk through enough malloc offsets that one lands on 16 mod
  // 4096 (every run here, from 8 threads up).
  constexpr int kThreads = 64;
  std::mutex mu;
  std::condition_variable cv;
  int ready = 0;
  bool release = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      touch();
      std::unique_lock<std::mutex> lk(mu);
      ++ready;
      cv.notify_all();
      // Bounded: the test thread releases everyone within seconds.
      cv.wait_for(lk, std::chrono::seconds(60), [&] { return release; });
    });
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, std::chrono::seconds(60), [&] { return ready == kThreads; });
  }
  EXPECT_EQ(ready, kThreads);

  // Nonzero means a leak was found; a tracer crash ends the process.
  int leaked = __lsan_do_recoverable_leak_check();

  {
    std::lock_guard<std::mutex> lk(mu);
    release = true;
  }
  cv.notify_all();
  for (auto &t : threads) t.join();
  EXPECT_EQ(leaked, 0);
  dlclose(mod);
}
