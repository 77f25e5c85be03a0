// An environment variable set for one scope and put back (or unset) when
// the scope ends, however it ends (an ASSERT_* returns early).  `after`,
// when given, runs after the set and after the restore: zpp reads its
// settings once, so a test of a ZPP_* setting passes zpp_settings_reload.
#pragma once

#include <cstdlib>
#include <string>

struct ScopedEnv {
  std::string name, old;
  bool had;
  void (*after)(void);
  ScopedEnv(const char *n, const char *v, void (*then)(void) = nullptr)
      : name(n), after(then) {
    const char *o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, v, 1);
    if (after != nullptr) after();
  }
  ~ScopedEnv() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
    if (after != nullptr) after();
  }
  ScopedEnv(const ScopedEnv &) = delete;
  ScopedEnv &operator=(const ScopedEnv &) = delete;
};
