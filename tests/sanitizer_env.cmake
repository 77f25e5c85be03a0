# The ASan harness's settings checked on the dynamic-TLS tracer crash
# (tests/test_sanitizer_env.cc); only an ASan build has a leak checker.
string(TOLOWER "${ZPP_SANITIZE}" _zpp_san_env)
if(ZPP_SANITIZE AND NOT _zpp_san_env STREQUAL "thread")
  add_library(zpp_tls_probe MODULE sanitizers/tls_module.c)
  zpp_add_gtest(test_sanitizer_env)
  add_dependencies(test_sanitizer_env zpp_tls_probe)
  target_compile_definitions(test_sanitizer_env PRIVATE
    ZPP_TLS_MODULE="$<TARGET_FILE:zpp_tls_probe>")
  target_link_libraries(test_sanitizer_env PRIVATE ${CMAKE_DL_LIBS})
endif()
