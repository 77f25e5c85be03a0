# Runtime API (tests/test_runtime.cc, multi-rank), the reference trainer
# zpp-train (tests/runtime/test_train.cc runs it under mpirun and checks its
# JSON) and the example of docs/runtime.md.  Label "mpi" (docs: "docs").
if(ZPP_WITH_MPI_ENABLED AND EXISTS ${PROJECT_SOURCE_DIR}/src/runtime/runtime.c)
  set(_zpp_rt_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --mca btl self,vader --bind-to none)
  add_executable(test_runtime test_runtime.cc)
  target_link_libraries(test_runtime PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_runtime PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
    ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}>)
  target_include_directories(test_runtime PRIVATE ${PROJECT_SOURCE_DIR}/src)
  foreach(_layout 2x2:4 1x4:4 "0,0,0,1,1:5")
    string(REPLACE ":" ";" _p "${_layout}")
    list(GET _p 0 _topo)
    list(GET _p 1 _np)
    string(REPLACE "," "" _tname "${_topo}")
    add_test(NAME runtime_${_tname}
      COMMAND ${_zpp_rt_mpirun} -np ${_np} $<TARGET_FILE:test_runtime>)
    set_tests_properties(runtime_${_tname} PROPERTIES LABELS mpi TIMEOUT 120
      ENVIRONMENT "ZPP_TOPO=${_topo};OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()
  # Emulated build (ZPP_CUDA_EMU): the same suite on device memory with
  # attached device buffers, on the MPI backend (staging through host
  # memory) and on the NCCL stand-in (tests/nccl_emu).  Label "emu".
  if(ZPP_CUDA_EMU)
    zpp_add_device_suite(runtime_device test_runtime "2x2:4;3x2:6;1x4:4" "")
  endif()

  if(TARGET zpp-train)
    # A plain gtest (no MPI of its own) that launches zpp-train with mpirun.
    string(REPLACE ";" " " _zpp_rt_launch "${_zpp_rt_mpirun}")
    add_executable(test_runtime_train runtime/test_train.cc runtime/train_math_baseline.cc)
    target_link_libraries(test_runtime_train PRIVATE GTest::gtest GTest::gtest_main)
    target_include_directories(test_runtime_train PRIVATE ${PROJECT_SOURCE_DIR}/tools
      ${PROJECT_SOURCE_DIR}/src/include)
    target_compile_definitions(test_runtime_train PRIVATE
      ZPP_RT_LAUNCH="${_zpp_rt_launch}"
      ZPP_RT_TRAIN="$<TARGET_FILE:zpp-train>")
    add_dependencies(test_runtime_train zpp-train)
    # The byte formulas of the suite follow one forced family (ZPP_ALGO=hier
    # here; under the default, auto, the choice is per call).
    add_test(NAME runtime_train_2x2 COMMAND test_runtime_train)
    set_tests_properties(runtime_train_2x2 PROPERTIES LABELS mpi TIMEOUT 240
      ENVIRONMENT "ZPP_TOPO=2x2;ZPP_ALGO=hier;OMPI_MCA_mpi_yield_when_idle=1")
    # The layer kernels alone (no mpirun), also in make test-tsan: there the
    # kernels' target_clones resolver crashed the program at load.
    add_test(NAME runtime_train_math
      COMMAND test_runtime_train --gtest_filter=TrainMath.*)
    set_tests_properties(runtime_train_math PROPERTIES LABELS unit TIMEOUT 120)
  endif()

  # docs/runtime.md's example: compiled, run, and kept verbatim in the doc.
  add_executable(runtime_example runtime/example.c)
  target_link_libraries(runtime_example PRIVATE zpp_static MPI::MPI_C)
  add_test(NAME runtime_example_2x2
    COMMAND ${_zpp_rt_mpirun} -np 4 $<TARGET_FILE:runtime_example>)
  set_tests_properties(runtime_example_2x2 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")
endif()
add_test(NAME docs_runtime_example
  COMMAND ${CMAKE_COMMAND} -DDOC=${PROJECT_SOURCE_DIR}/docs/runtime.md
    -DEXAMPLE=${CMAKE_CURRENT_SOURCE_DIR}/runtime/example.c
    -P ${CMAKE_CURRENT_SOURCE_DIR}/runtime/check_doc_example.cmake)
set_tests_properties(docs_runtime_example PROPERTIES LABELS docs)
