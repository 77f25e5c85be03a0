# zpp_comm_shrink (tests/test_shrink.cc): forked ranks over the TCP
# bootstrap and UCX (no MPI), one SIGKILLed before or during all-gathers
# and reduce-scatters on 1x4, 2x2 and 2x4; each case is bounded (30 s).
add_executable(test_shrink test_shrink.cc)
target_link_libraries(test_shrink PRIVATE zpp_static GTest::gtest GTest::gtest_main)
target_include_directories(test_shrink PRIVATE ${PROJECT_SOURCE_DIR}/src)
gtest_discover_tests(test_shrink DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS "unit;bootstrap" TIMEOUT 30 RUN_SERIAL TRUE)
