# zpp_comm_shrink (tests/test_shrink.cc): forked ranks over the TCP
# bootstrap and UCX (no MPI), one SIGKILLed before or during all-gathers
# and reduce-scatters on 1x4, 2x2 and 2x4; each case is bounded (30 s).
add_executable(test_shrink test_shrink.cc)
target_link_libraries(test_shrink PRIVATE zpp_static GTest::gtest GTest::gtest_main)
target_include_directories(test_shrink PRIVATE ${PROJECT_SOURCE_DIR}/src)
gtest_discover_tests(test_shrink DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS "unit;bootstrap" TIMEOUT 30 RUN_SERIAL TRUE)

# The same over an MPI communicator: MPI need not survive the death.  The
# driver checks mpiexec's exit status and every survivor's lines.
if(ZPP_WITH_MPI_ENABLED)
  add_executable(shrink_mpi_worker shrink_mpi_worker.c)
  target_link_libraries(shrink_mpi_worker PRIVATE zpp_static MPI::MPI_C)
  add_test(NAME shrink_mpi_kill_2x2
    COMMAND ${CMAKE_COMMAND} -D MPIEXEC=${MPIEXEC_EXECUTABLE}
      -D WORKER=$<TARGET_FILE:shrink_mpi_worker> -D NP=4 -D SURVIVORS=3
      -P ${CMAKE_CURRENT_SOURCE_DIR}/shrink/check_mpi.cmake)
  set_tests_properties(shrink_mpi_kill_2x2 PROPERTIES LABELS mpi TIMEOUT 30
    ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")

  # The faults on the namespace cluster (real nodes, the node map
  # discovered).  Not a ctest entry: it needs root and the nodes of
  # scripts/netns_cluster.sh; tests/cluster_tests.sh runs it there.
  add_executable(shrink_cluster_worker shrink_cluster_worker.c)
  target_link_libraries(shrink_cluster_worker PRIVATE zpp_static MPI::MPI_C m)
  target_include_directories(shrink_cluster_worker PRIVATE ${PROJECT_SOURCE_DIR}/src)
endif()

# The fork harness of test_shrink and test_recover (tests/fork_job.h): a
# rank dead before its go, a crash, an exit code, a fork that fails.
add_executable(test_fork_job test_fork_job.cc)
target_link_libraries(test_fork_job PRIVATE GTest::gtest GTest::gtest_main)
gtest_discover_tests(test_fork_job DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS unit TIMEOUT 30)
