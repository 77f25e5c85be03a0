# The CUDA kernels of qgZ's integer sums (src/kernels/isum_cuda.cu) of an
# emulated build (ZPP_CUDA_EMU), through libzpp, on emulated device memory,
# bit for bit against the scalar reference: tests/test_isum_cuda.cc.
# Label "emu".
if(ZPP_CUDA_EMU AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_isum_cuda.cc)
  add_executable(test_isum_cuda test_isum_cuda.cc)
  target_link_libraries(test_isum_cuda PRIVATE zpp_static GTest::gtest GTest::gtest_main)
  # zpp_cuda_emu.h: the emulator's test hooks (the kernel log)
  target_include_directories(test_isum_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src
    ${PROJECT_SOURCE_DIR}/tests/cuda_emu)
  add_test(NAME isum_device_emu COMMAND test_isum_cuda)
  # every step synchronises: a short delay per operation keeps it quick
  set_tests_properties(isum_device_emu PROPERTIES LABELS emu TIMEOUT 300
    ENVIRONMENT "ZPP_EMU_DELAY_US=5")
endif()
