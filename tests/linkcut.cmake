# Link cuts on the namespace cluster (tests/test_linkcut.cc).  Not a ctest
# entry: it needs root and the nodes of scripts/netns_cluster.sh, and
# tests/cluster_tests.sh (make test-cluster) runs it there.
if(ZPP_WITH_MPI_ENABLED)
  add_executable(test_linkcut test_linkcut.cc)
  target_link_libraries(test_linkcut PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_linkcut PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
endif()
