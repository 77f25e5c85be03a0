# test_quant_cuda_emu: the CUDA codec's kernels compiled as C++ and run on a
# CPU emulator (tests/cuda_emu/cuda_runtime.h), against the scalar codec.
# Needs neither nvcc nor a GPU, so it is built on every machine.  It does
# not link libzpp (whose CUDA build holds the same launchers): it compiles
# the scalar reference in.  tests/CMakeLists.txt includes this fragment.
add_executable(test_quant_cuda_emu test_quant_cuda_emu.cc
  ${PROJECT_SOURCE_DIR}/kernels/quant/quant_scalar.c)
# The emulator's cuda_runtime.h must win over a real one.
target_include_directories(test_quant_cuda_emu BEFORE PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
target_include_directories(test_quant_cuda_emu PRIVATE
  ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/kernels/quant
  ${CMAKE_CURRENT_SOURCE_DIR})
# Vector loads reinterpret element buffers; #pragma unroll is nvcc's.
# UBSan's alignment check stands in for the GPU's misaligned-address fault:
# a vector access the launcher allowed on an unaligned pointer aborts.
target_compile_options(test_quant_cuda_emu PRIVATE
  $<$<COMPILE_LANGUAGE:CXX>:-fno-strict-aliasing -Wno-unknown-pragmas
  -fsanitize=alignment -fno-sanitize-recover=alignment>)
target_link_options(test_quant_cuda_emu PRIVATE -fsanitize=alignment)
target_link_libraries(test_quant_cuda_emu PRIVATE GTest::gtest GTest::gtest_main)
gtest_discover_tests(test_quant_cuda_emu DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS unit)
