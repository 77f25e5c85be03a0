# Multi-rank tests of the collectives (tests/test_coll.cc) under mpirun, one
# ctest entry per emulated layout (ZPP_TOPO), plus ZPP_CHECK=1 mismatch
# detection.  Label "mpi".
if(ZPP_WITH_MPI_ENABLED AND EXISTS ${PROJECT_SOURCE_DIR}/src/transport/transport_mpi.c)
  add_executable(test_coll test_coll.cc)
  target_link_libraries(test_coll PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  # C bindings only: no MPI C++ library at link time
  target_compile_definitions(test_coll PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
    ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}>)
  target_include_directories(test_coll PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set(_zpp_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --mca btl self,vader --bind-to none)
  # layout name -> ZPP_TOPO and rank count
  foreach(_layout 1x1:1 1x4:4 2x2:4 2x4:8 4x2:8 3x2:6 8x1:8 "0,0,0,1,1:5")
    string(REPLACE ":" ";" _p "${_layout}")
    list(GET _p 0 _topo)
    list(GET _p 1 _np)
    string(REPLACE "," "" _tname "${_topo}")
    add_test(NAME coll_${_tname}
      COMMAND ${_zpp_mpirun} -np ${_np} $<TARGET_FILE:test_coll>)
    # Some layouts run with small pipeline chunks, so the chunked
    # (pipelined) qwZ/qgZ paths are checked against the same bounds and
    # byte formulas as the unchunked ones.
    set(_pipe "")
    if(_topo MATCHES "^(2x4|3x2|0,0,0,1,1|1x4)$")
      # and the hierarchical all-gather / reduce-scatter in chunks
      set(_pipe ";ZPP_PIPE_MIN_CHUNK=256;ZPP_HIER_CHUNK=4096")
    endif()
    set_tests_properties(coll_${_tname} PROPERTIES LABELS mpi TIMEOUT 240
      ENVIRONMENT "ZPP_TOPO=${_topo};OMPI_MCA_mpi_yield_when_idle=1${_pipe}")
  endforeach()
  # The flat algorithms (ZPP_ALGO=flat) on multi-node layouts, and the
  # hierarchical ones on nodes of 3 + 2 + 1 ranks: the tests whose
  # expectations depend on the algorithm (baselines, qwZ and hpZ ride on the
  # world all-gather, qgZ on its own all-to-alls, the started collectives).
  foreach(_l "flat_2x4|8|2x4|flat" "flat_3x2|6|3x2|flat" "flat_00011|5|0,0,0,1,1|flat"
             "001112|6|0,0,0,1,1,2|hier")
    string(REPLACE "|" ";" _f "${_l}")
    list(GET _f 0 _name)
    list(GET _f 1 _np)
    list(GET _f 2 _topo)
    list(GET _f 3 _algo)
    add_test(NAME coll_${_name}
      COMMAND ${_zpp_mpirun} -np ${_np} $<TARGET_FILE:test_coll>
        --gtest_filter=Baseline.*:Qwz.*:Hpz.*:Async.*:Qgz.CountsEqualTheFormulas)
    set_tests_properties(coll_${_name} PROPERTIES LABELS mpi TIMEOUT 240
      ENVIRONMENT "ZPP_TOPO=${_topo};ZPP_ALGO=${_algo};ZPP_HIER_CHUNK=2048;OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()
  # MPI_THREAD_SERIALIZED: started collectives complete inline (no progress
  # thread), pipelining still runs; the results must not change.
  add_test(NAME coll_serialized
    COMMAND ${_zpp_mpirun} -np 4 $<TARGET_FILE:test_coll>
      --gtest_filter=Async.*:Qwz.*:Qgz.CountsEqualTheFormulas)
  set_tests_properties(coll_serialized PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;ZPP_TEST_MPI_THREAD=serialized;ZPP_PIPE_MIN_CHUNK=256;OMPI_MCA_mpi_yield_when_idle=1")
  # Emulated build (ZPP_CUDA_EMU): the same suite on device memory, with the
  # MPI backend staging through pinned host memory and, when the NCCL
  # stand-in is in the tree (tests/nccl_emu), with the NCCL backend loading
  # it through ZPP_NCCL_LIBRARY.  Same references and bounds as on host
  # memory (test_memory.h).  Label "emu".
  if(ZPP_CUDA_EMU)
    zpp_add_device_suite(coll_device test_coll "1x1:1;2x2:4;2x4:8;3x2:6"
      "ZPP_PIPE_MIN_CHUNK=256;ZPP_HIER_CHUNK=4096")
    # The longest cases on the emulator (the qgZ float64 reference over
    # every case and bit width, the 100-step qWD reconstruction, the
    # chunked plan against the one-chunk plan, error feedback with
    # Hadamard and LoCo, the raw intra-node stage) run on device memory on
    # one rank (1x1) with each backend, on three nodes (3x2; like every
    # coll_device entry with ZPP_HIER_CHUNK=4096) with MPI and on two
    # nodes with the full delay (2x2)
    # with NCCL; mpi_2x2, nccl_3x2 and 2x4 run the rest of the suite.
    # Every layout runs them on host memory (coll_<layout>).
    # The emulator's delay per operation: the full default on 2x4 and on
    # nccl 2x2, a short one (0..100 us) on the other layouts
    # (tests/cuda_emu/README.md, "The delay under make test").
    set(_zpp_coll_long Qgz.MatchesFloat64ReferenceWithinTheTwoStageBound
      Qwd.ReconstructionIsIdenticalOnAllRanksAndItsErrorDoesNotAccumulate
      Qgz.ChunkedPlanIsBitwiseTheOneChunkPlan
      Qgz.ErrorFeedbackWithHadamardAndLoCoMatchesFloat64Identity
      Qgz.RawIntraStageKeepsOnlyTheQuantizedStagesResidual)
    string(REPLACE ";" ":" _zpp_coll_long "${_zpp_coll_long}")
    foreach(_t mpi_2x4 nccl_2x4 mpi_2x2 nccl_3x2)
      if(TEST coll_device_${_t})
        set_property(TEST coll_device_${_t} APPEND PROPERTY ENVIRONMENT
          "GTEST_FILTER=-${_zpp_coll_long}")
      endif()
    endforeach()
    foreach(_be mpi nccl)
      foreach(_n 1x1 2x2 3x2)
        # nccl 2x2 keeps the full delay: the long cases (residuals carried
        # between calls, chunked plans) meet it on the backend whose own
        # streams and events they cross
        if(TEST coll_device_${_be}_${_n} AND NOT "${_be}_${_n}" STREQUAL "nccl_2x2")
          set_property(TEST coll_device_${_be}_${_n} APPEND PROPERTY ENVIRONMENT
            "ZPP_EMU_DELAY_US=50")
        endif()
      endforeach()
    endforeach()
    # the flat algorithms on device memory (MPI staging; NCCL routes by
    # itself)
    add_test(NAME coll_device_mpi_flat_2x4
      COMMAND ${_zpp_mpirun} -np 8 $<TARGET_FILE:test_coll>
        --gtest_filter=Baseline.*:Qwz.*:Hpz.*)
    set_tests_properties(coll_device_mpi_flat_2x4 PROPERTIES LABELS emu
      TIMEOUT 300 ENVIRONMENT
      "ZPP_TOPO=2x4;ZPP_ALGO=flat;ZPP_TEST_MEMORY=device;ZPP_TEST_BACKEND=mpi;OMPI_MCA_mpi_yield_when_idle=1")
  endif()
  add_test(NAME coll_check
    COMMAND ${_zpp_mpirun} -np 4 $<TARGET_FILE:test_coll>
      --gtest_filter=BadInput.*)
  set_tests_properties(coll_check PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;ZPP_CHECK=1;OMPI_MCA_mpi_yield_when_idle=1")
endif()
