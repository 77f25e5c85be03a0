# qgZ with compressed-domain sums (tests/test_qgz_int.cc) under mpirun:
# one node (1x4), two levels (2x4, 3x2; 3x1: one rank per node, a stage 1
# of one member) and uneven nodes (0,0,0,1,1: the flat stage), host
# memory, small pipeline chunks on 2x4.  Label "mpi".
# Emulated build (ZPP_CUDA_EMU): the same layouts on device memory, the
# CUDA kernels of src/kernels/isum_cuda.cu, with the MPI backend (staging
# through host memory) and the NCCL stand-in when it is built, against the
# same model and bounds, and bit for bit against the host path
# (qgz_int_device_<backend>_<layout>, zpp_add_device_suite; the 2048-call
# error-feedback telescope on device memory on 3x1 only, see below).
# Label "emu".
# With the setting ZPP_QGZ_SUM=int, QgzInt.DefaultSumFollowsTheSetting on
# 3x2 (qgz_int_sumenv_3x2, and on device memory
# qgz_int_device_mpi_sumenv_3x2): the default config sums as integers.
if(ZPP_WITH_MPI_ENABLED AND EXISTS ${PROJECT_SOURCE_DIR}/src/transport/transport_mpi.c)
  add_executable(test_qgz_int test_qgz_int.cc)
  target_link_libraries(test_qgz_int PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_qgz_int PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
    ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}>)
  target_include_directories(test_qgz_int PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set(_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --mca btl self,vader --bind-to none)
  set(_layouts 1x4:4 2x4:8 3x2:6 3x1:3 "0,0,0,1,1:5:00011")
  foreach(_layout ${_layouts})
    string(REPLACE ":" ";" _p "${_layout}")
    list(GET _p 0 _topo)
    list(GET _p 1 _np)
    string(REPLACE "," "" _tname "${_topo}")
    add_test(NAME qgz_int_${_tname}
      COMMAND ${_mpirun} -np ${_np} $<TARGET_FILE:test_qgz_int>)
    set(_pipe "")
    if(_topo STREQUAL "2x4")
      set(_pipe ";ZPP_PIPE_MIN_CHUNK=256")
    endif()
    set_tests_properties(qgz_int_${_tname} PROPERTIES LABELS mpi TIMEOUT 120
      ENVIRONMENT "ZPP_TOPO=${_topo};OMPI_MCA_mpi_yield_when_idle=1${_pipe}")
  endforeach()
  set(_sumenv "ZPP_TOPO=3x2;ZPP_QGZ_SUM=int;OMPI_MCA_mpi_yield_when_idle=1")
  add_test(NAME qgz_int_sumenv_3x2
    COMMAND ${_mpirun} -np 6 $<TARGET_FILE:test_qgz_int>
      --gtest_filter=QgzInt.DefaultSumFollowsTheSetting)
  set_tests_properties(qgz_int_sumenv_3x2 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "${_sumenv}")
  if(ZPP_CUDA_EMU)
    zpp_add_device_suite(qgz_int_device test_qgz_int "${_layouts}" "")
    # the emulated kernels of 8 ranks on a shared machine: more than the
    # helper's 300 s.  QgzInt.ErrorFeedbackMeanErrorTelescopesLikeFloat
    # (2048 calls, four fifths of the suite's time on the emulator) runs on
    # device memory on the cheapest two-level layout, 3x1 (the own share
    # rounded to a unit, stage-2 residuals of three nodes), with the NCCL
    # stand-in where it is built (the GPUs' backend).  Every layout runs it
    # on host memory (qgz_int_<layout>), and on every device entry the
    # results and residuals equal the host path's bit for bit over steps
    # with error feedback and a reset
    # (QgzInt.DeviceEqualsTheHostPathBitForBit).
    set(_telescope_be mpi)
    if(TEST qgz_int_device_nccl_3x1)
      set(_telescope_be nccl)
    endif()
    foreach(_be mpi nccl)
      foreach(_n 1x4 2x4 3x2 3x1 00011)
        if(TEST qgz_int_device_${_be}_${_n})
          set_tests_properties(qgz_int_device_${_be}_${_n} PROPERTIES TIMEOUT 600)
          # the emulator's full delay per operation on 2x4, a short one
          # elsewhere (tests/cuda_emu/README.md, "The delay under make test")
          if(NOT _n STREQUAL "2x4")
            set_property(TEST qgz_int_device_${_be}_${_n} APPEND PROPERTY ENVIRONMENT
              "ZPP_EMU_DELAY_US=50")
          endif()
          if(NOT "${_be}_${_n}" STREQUAL "${_telescope_be}_3x1")
            set_property(TEST qgz_int_device_${_be}_${_n} APPEND PROPERTY ENVIRONMENT
              "GTEST_FILTER=-QgzInt.ErrorFeedbackMeanErrorTelescopesLikeFloat")
          endif()
        endif()
      endforeach()
    endforeach()
    add_test(NAME qgz_int_device_mpi_sumenv_3x2
      COMMAND ${_mpirun} -np 6 $<TARGET_FILE:test_qgz_int>
        --gtest_filter=QgzInt.DefaultSumFollowsTheSetting)
    set_tests_properties(qgz_int_device_mpi_sumenv_3x2 PROPERTIES LABELS emu
      TIMEOUT 300
      ENVIRONMENT "${_sumenv};ZPP_TEST_MEMORY=device;ZPP_TEST_BACKEND=mpi")
  endif()
endif()
