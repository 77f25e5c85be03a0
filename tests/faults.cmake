# Faults: zpp_comm_abort, the asynchronous error, the first
# error of a failed communicator, bounded creation (tests/test_faults.cc,
# under mpirun on an emulated 2x2, with and without ZPP_CHECK's argument
# exchange); then real faults injected into running jobs by
# tests/fault_inject.sh: a rank killed with SIGKILL mid-collective, a rank
# stopped with SIGSTOP for 2 s (tests/fault_worker.cc).
if(ZPP_WITH_MPI_ENABLED)
  add_executable(test_faults test_faults.cc)
  target_link_libraries(test_faults PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_include_directories(test_faults PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(test_faults PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  foreach(_chk 0 1)
    if(_chk)
      set(_name faults_check_2x2)
    else()
      set(_name faults_2x2)
    endif()
    add_test(NAME ${_name}
      COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
        --mca btl self,vader --bind-to none -np 4 $<TARGET_FILE:test_faults>)
    set_tests_properties(${_name} PROPERTIES LABELS mpi TIMEOUT 120
      ENVIRONMENT "ZPP_TOPO=2x2;ZPP_CHECK=${_chk};OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()

  add_executable(fault_worker fault_worker.cc)
  target_link_libraries(fault_worker PRIVATE zpp_static MPI::MPI_C)
  target_compile_definitions(fault_worker PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  # ZPP_FAULT_LAUNCH (the mpirun prefix, --enable-recovery included) may be
  # set in the environment to reuse the cases with another launcher.
  foreach(_case kill stop)
    add_test(NAME fault_${_case}_2x2
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/fault_inject.sh ${_case}
        $<TARGET_FILE:fault_worker> ${MPIEXEC_EXECUTABLE})
    set_tests_properties(fault_${_case}_2x2 PROPERTIES LABELS mpi TIMEOUT 120
      ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()
endif()
