# qgZ with compressed-domain sums (tests/test_qgz_int.cc) under mpirun:
# one node (1x4), two levels (2x4, 3x2) and uneven nodes (0,0,0,1,1: the
# flat stage), host memory, small pipeline chunks on 2x4.  Label "mpi".
# Emulated build (ZPP_CUDA_EMU): the same layouts on device memory, the
# CUDA kernels of src/kernels/isum_cuda.cu, with the MPI backend (staging
# through host memory) and the NCCL stand-in when it is built, against the
# same model and bounds, and bit for bit against the host path
# (qgz_int_device_<backend>_<layout>).  Label "emu".
if(ZPP_WITH_MPI_ENABLED AND EXISTS ${PROJECT_SOURCE_DIR}/src/transport/transport_mpi.c)
  add_executable(test_qgz_int test_qgz_int.cc)
  target_link_libraries(test_qgz_int PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_qgz_int PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
    ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}>)
  target_include_directories(test_qgz_int PRIVATE ${PROJECT_SOURCE_DIR}/src)
  set(_backends "")
  if(ZPP_CUDA_EMU)
    set(_backends mpi)
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/nccl_emu/nccl_emu.c AND ZPP_WITH_NCCL_ENABLED)
      list(APPEND _backends nccl)
    endif()
  endif()
  foreach(_layout 1x4:4 2x4:8 3x2:6 "0,0,0,1,1:5")
    string(REPLACE ":" ";" _p "${_layout}")
    list(GET _p 0 _topo)
    list(GET _p 1 _np)
    string(REPLACE "," "" _tname "${_topo}")
    add_test(NAME qgz_int_${_tname}
      COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
        --mca btl self,vader --bind-to none -np ${_np} $<TARGET_FILE:test_qgz_int>)
    set(_pipe "")
    if(_topo STREQUAL "2x4")
      set(_pipe ";ZPP_PIPE_MIN_CHUNK=256")
    endif()
    set_tests_properties(qgz_int_${_tname} PROPERTIES LABELS mpi TIMEOUT 120
      ENVIRONMENT "ZPP_TOPO=${_topo};OMPI_MCA_mpi_yield_when_idle=1${_pipe}")
    foreach(_be ${_backends})
      set(_env "ZPP_TOPO=${_topo};ZPP_TEST_MEMORY=device;ZPP_TEST_BACKEND=${_be}")
      string(APPEND _env ";OMPI_MCA_mpi_yield_when_idle=1")
      if(_be STREQUAL "nccl")
        string(APPEND _env ";ZPP_NCCL_LIBRARY=$<TARGET_FILE:zpp_nccl_emu>")
      endif()
      add_test(NAME qgz_int_device_${_be}_${_tname}
        COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
          --mca btl self,vader --bind-to none -np ${_np} $<TARGET_FILE:test_qgz_int>)
      set_tests_properties(qgz_int_device_${_be}_${_tname} PROPERTIES LABELS emu
        TIMEOUT 600 ENVIRONMENT "${_env}")
    endforeach()
  endforeach()
endif()
