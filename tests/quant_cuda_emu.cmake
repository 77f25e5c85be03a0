# test_quant_cuda_emu: the CUDA codec's kernels compiled as C++ and run on
# the emulated CUDA runtime (tests/cuda_emu, libzpp_cudart_emu), against the
# scalar codec.  Needs neither nvcc nor a GPU, so it is built on every
# machine (not under the sanitizers: the emulator switches stacks and
# handles SIGSEGV).  It does not link libzpp (whose CUDA build holds the
# same launchers): it compiles the scalar reference in.
if(TARGET zpp_cudart_emu)
  add_executable(test_quant_cuda_emu test_quant_cuda_emu.cc
    ${PROJECT_SOURCE_DIR}/src/kernels/quant_scalar.c)
  target_include_directories(test_quant_cuda_emu PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
    ${CMAKE_CURRENT_SOURCE_DIR})
  # Vector loads reinterpret element buffers; #pragma unroll is nvcc's.
  # UBSan's alignment check stands in for the GPU's misaligned-address
  # fault: a vector access the launcher allowed on an unaligned pointer
  # aborts.
  target_compile_options(test_quant_cuda_emu PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-fno-strict-aliasing -Wno-unknown-pragmas
    -fsanitize=alignment -fno-sanitize-recover=alignment>)
  target_link_options(test_quant_cuda_emu PRIVATE -fsanitize=alignment)
  target_link_libraries(test_quant_cuda_emu PRIVATE zpp_cudart_emu GTest::gtest
    GTest::gtest_main)
  # Every case synchronises with cudaMemcpy: a short delay per operation
  # keeps the thousands of cases quick.
  gtest_discover_tests(test_quant_cuda_emu DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS unit ENVIRONMENT "ZPP_EMU_DELAY_US=5")
endif()
