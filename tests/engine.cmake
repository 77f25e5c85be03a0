# The execution engine's promises about threads and memory
# (tests/test_engine.cc), under mpirun on an emulated 2x2.  pthread_create
# is wrapped at link time so the test can count the threads zpp creates.
if(ZPP_WITH_MPI_ENABLED)
  add_executable(test_engine test_engine.cc)
  target_link_libraries(test_engine PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_link_options(test_engine PRIVATE -Wl,--wrap=pthread_create)
  # the engine's own interface (src/engine/plan.h) for plans of test kernels
  target_include_directories(test_engine PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(test_engine PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  add_test(NAME engine_2x2
    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
      --mca btl self,vader --bind-to none -np 4 $<TARGET_FILE:test_engine>)
  set_tests_properties(engine_2x2 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;ZPP_PIPE_MIN_CHUNK=256;OMPI_MCA_mpi_yield_when_idle=1")
endif()
