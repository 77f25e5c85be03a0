# (Named zpp_* so that it comes after tests/nccl_emu.cmake, which defines
# the stand-in: tests/CMakeLists.txt includes the fragments in name order.)
# The device path's contract (tests/test_device_path.cc): one ctest entry per
# device-path bug whose effect the collectives' results do not show,
# each with the backend, devices and ranks it needs.  Emulated builds only
# (it uses the emulator's hooks, tests/cuda_emu/zpp_cuda_emu.h).  Label emu.
if(ZPP_CUDA_EMU AND ZPP_WITH_MPI_ENABLED AND TARGET zpp_nccl_emu)
  add_executable(test_device_path test_device_path.cc)
  target_link_libraries(test_device_path PRIVATE zpp_static zpp_cudart_emu
    GTest::gtest MPI::MPI_C)
  target_include_directories(test_device_path BEFORE PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(test_device_path PRIVATE OMPI_SKIP_MPICXX=1
    MPICH_SKIP_MPICXX=1)
  set(_run ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
    --mca btl self,vader --bind-to none -np 2 $<TARGET_FILE:test_device_path>)
  set(_env "ZPP_NCCL_LIBRARY=$<TARGET_FILE:zpp_nccl_emu>;ZPP_TIMEOUT_S=60"
    "OMPI_MCA_mpi_yield_when_idle=1")
  foreach(_case request device hpz auto queries barrier abort ncclkill ncclasync staging
      cancelled stallsync wrongdev vblocks stream stream-staged secorder secorder-staged
      capture capture-staged context context-staged perthread perthread-staged destroy
      queue)
    set(_e ${_env} "ZPP_TEST_CASE=${_case}" "ZPP_TOPO=2x1")
    if(_case STREQUAL "abort")
      list(APPEND _e "ZPP_NCCL_EMU_TIMEOUT_S=300")
    elseif(_case STREQUAL "ncclasync")
      list(APPEND _e "ZPP_NCCL_EMU_TIMEOUT_S=1")
    elseif(_case STREQUAL "stallsync")
      list(APPEND _e "ZPP_EMU_TIMEOUT_S=20")
    endif()
    if(_case STREQUAL "auto")
      list(APPEND _e "ZPP_EMU_DEVICES=1")
    elseif(_case MATCHES "^context")
      list(APPEND _e "ZPP_EMU_DEVICES=3")
    else()
      list(APPEND _e "ZPP_EMU_DEVICES=2")
    endif()
    add_test(NAME device_path_${_case} COMMAND ${_run})
    set_tests_properties(device_path_${_case} PROPERTIES LABELS emu
      TIMEOUT 120 ENVIRONMENT "${_e}")
  endforeach()
  # The staged v-variants on 2 nodes x 2 ranks: the hierarchical
  # all-gatherv.
  add_test(NAME device_path_vblocks_2x2 COMMAND ${MPIEXEC_EXECUTABLE}
    --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none
    -np 4 $<TARGET_FILE:test_device_path>)
  set_tests_properties(device_path_vblocks_2x2 PROPERTIES LABELS emu TIMEOUT 120
    ENVIRONMENT "${_env};ZPP_TEST_CASE=vblocks;ZPP_TOPO=2x2;ZPP_EMU_DEVICES=2")
  # e: rank 0 alone gets a NCCL library that does not exist (an MPMD launch
  # gives the two ranks different environments).
  add_test(NAME device_path_creation COMMAND ${MPIEXEC_EXECUTABLE}
    --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none
    -np 1 -x ZPP_NCCL_LIBRARY=/nonexistent/libnccl.so.2
      $<TARGET_FILE:test_device_path> :
    -np 1 $<TARGET_FILE:test_device_path>)
  set_tests_properties(device_path_creation PROPERTIES LABELS emu TIMEOUT 120
    ENVIRONMENT "${_env};ZPP_TEST_CASE=creation;ZPP_TOPO=2x1;ZPP_EMU_DEVICES=2")
endif()
