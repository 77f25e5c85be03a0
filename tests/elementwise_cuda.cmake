# test_elementwise_cuda: the element-wise device kernels (finish, scale,
# add_residual, residual, ema_residual, widen, convert, wdiff) against a
# float64 reference at every buffer offset, through libzpp.  With CUDA it
# runs on the GPU (label unit; it skips without a device); in an emulated
# build (ZPP_CUDA_EMU) on the emulated runtime, which faults on a misaligned
# access as a GPU does (label emu).
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_elementwise_cuda.cc)
  if(ZPP_WITH_CUDA_ENABLED)
    zpp_add_gtest(test_elementwise_cuda)
    target_link_libraries(test_elementwise_cuda PRIVATE CUDA::cudart_static)
  elseif(ZPP_CUDA_EMU)
    add_executable(test_elementwise_cuda test_elementwise_cuda.cc)
    target_link_libraries(test_elementwise_cuda PRIVATE zpp_static GTest::gtest
      GTest::gtest_main)
    target_include_directories(test_elementwise_cuda PRIVATE
      ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests/cuda_emu)
    target_compile_definitions(test_elementwise_cuda PRIVATE ZPP_HAVE_CUDA=1
      ZPP_TEST_CUDA_EMU=1)
    add_test(NAME elementwise_device_emu COMMAND test_elementwise_cuda)
    # every case synchronises: a short delay per operation keeps it quick
    set_tests_properties(elementwise_device_emu PROPERTIES LABELS emu
      TIMEOUT 900 ENVIRONMENT "ZPP_EMU_DELAY_US=20")
  endif()
endif()
