# zpp_pgroup_recover (tests/test_recover.cc): forked ranks over the TCP
# bootstrap and UCX (no MPI) on emulated 2x2, 2x4 and 1x4 nodes; victims
# SIGKILLed after a forward gather, the survivors shrink and re-partition
# a parameter group.  Each case is bounded (30 s).
if(EXISTS ${PROJECT_SOURCE_DIR}/src/runtime/runtime.c)
  add_executable(test_recover test_recover.cc)
  target_link_libraries(test_recover PRIVATE zpp_static GTest::gtest GTest::gtest_main)
  gtest_discover_tests(test_recover DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "unit;bootstrap" TIMEOUT 30 RUN_SERIAL TRUE)
endif()
