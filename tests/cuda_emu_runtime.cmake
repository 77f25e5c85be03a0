# test_cuda_emu: the contract of the emulated CUDA runtime (tests/cuda_emu):
# asynchrony, order, events, legacy and non-blocking streams, devices,
# illegal addresses, host access to device memory, hooks.  Label "emu" (a
# normal build runs it with the rest of ctest); built wherever the
# emulator is.
if(TARGET zpp_cudart_emu)
  add_executable(test_cuda_emu test_cuda_emu.cc)
  target_compile_options(test_cuda_emu PRIVATE -Wno-unknown-pragmas)
  target_link_libraries(test_cuda_emu PRIVATE zpp_cudart_emu GTest::gtest
    GTest::gtest_main)
  gtest_discover_tests(test_cuda_emu DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS emu)
endif()
