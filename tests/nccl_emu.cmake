# The NCCL stand-in (tests/nccl_emu/): a shared library with NCCL's API that
# libzpp opens instead of libnccl.so.2 when ZPP_NCCL_LIBRARY names it, and
# its own contract tests (test_nccl_emu, label unit).  It needs the real
# nccl.h for the types, no GPU and no MPI, and runs on the emulated CUDA
# runtime (target zpp_cudart_emu, built with the tests except under the
# sanitizers).  Not built with ZPP_WITH_NCCL=OFF.  tests/CMakeLists.txt
# includes this.
find_path(ZPP_NCCL_EMU_NCCL_H nccl.h
  HINTS ${ZPP_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
if(NOT ZPP_WITH_NCCL STREQUAL "OFF" AND ZPP_NCCL_EMU_NCCL_H AND TARGET zpp_cudart_emu)
  set(_zpp_nccl_emu_rt zpp_cudart_emu)
  # nccl.h alone: its directory holds the real CUDA headers, which must not
  # hide the emulator's.
  configure_file(${ZPP_NCCL_EMU_NCCL_H}/nccl.h
    ${CMAKE_CURRENT_BINARY_DIR}/nccl_emu_include/nccl.h COPYONLY)
  set(ZPP_NCCL_EMU_NCCL_H ${CMAKE_CURRENT_BINARY_DIR}/nccl_emu_include)

  add_library(zpp_nccl_emu SHARED nccl_emu/nccl_emu.c nccl_emu/nccl_emu_net.c
    nccl_emu/nccl_emu_ops.c)
  target_include_directories(zpp_nccl_emu PRIVATE ${ZPP_NCCL_EMU_NCCL_H})
  # Only the nccl* names and the test hooks of nccl_emu/zpp_nccl_emu.h are
  # exported; the stand-in shares the process's CUDA runtime (the emulated
  # one is loaded once, by libzpp's user).
  set_target_properties(zpp_nccl_emu PROPERTIES C_VISIBILITY_PRESET hidden)
  target_link_libraries(zpp_nccl_emu PRIVATE ${_zpp_nccl_emu_rt} Threads::Threads m)
  target_link_options(zpp_nccl_emu PRIVATE -Wl,--no-undefined)

  add_executable(test_nccl_emu test_nccl_emu.cc)
  target_include_directories(test_nccl_emu PRIVATE ${ZPP_NCCL_EMU_NCCL_H}
    ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(test_nccl_emu PRIVATE zpp_nccl_emu ${_zpp_nccl_emu_rt}
    GTest::gtest GTest::gtest_main Threads::Threads)
  gtest_discover_tests(test_nccl_emu DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS unit TIMEOUT 120)
endif()

