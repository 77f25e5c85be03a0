# The exact error text of every bad argument of every public function
# (tests/test_errors.cc), under mpirun on an emulated 2x2.  Label "mpi".
if(ZPP_WITH_MPI_ENABLED AND EXISTS ${PROJECT_SOURCE_DIR}/src/runtime/runtime.c)
  add_executable(test_errors test_errors.cc)
  target_link_libraries(test_errors PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_errors PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
    ZPP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_test(NAME errors_2x2
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --mca btl self,vader
      --bind-to none -np 4 $<TARGET_FILE:test_errors>)
  set_tests_properties(errors_2x2 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")
  # The buffer-overlap tests again on the UCX transport, uneven nodes (the
  # hierarchical algorithm with a small node) and ZPP_CHECK=1 (one rank's
  # refused call fails every rank).
  add_test(NAME errors_overlap_ucx_uneven
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --mca btl self,vader
      --bind-to none -np 5 $<TARGET_FILE:test_errors>
      --gtest_filter=Overlap.*:ErrorText.OverlappingBuffers)
  set_tests_properties(errors_overlap_ucx_uneven PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=0,0,0,1,1;ZPP_BACKEND=ucx;ZPP_CHECK=1;OMPI_MCA_mpi_yield_when_idle=1")
endif()
