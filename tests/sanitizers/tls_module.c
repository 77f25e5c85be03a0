/* A module with thread-local storage, loaded with dlopen by
 * tests/test_sanitizer_env.cc: glibc gives each thread that touches it a
 * dynamic TLS block from malloc (the sanitizer's allocator, under ASan). */
__thread int zpp_tls_probe[4];

int *zpp_tls_probe_touch(void)
{
  zpp_tls_probe[0]++;
  return zpp_tls_probe;
}
