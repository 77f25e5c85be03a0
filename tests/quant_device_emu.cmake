# The quantizer's device entry points (zpp_quant_encode_device, ...) of an
# emulated build (ZPP_CUDA_EMU), through libzpp, on emulated device memory,
# bit for bit against the CPU codec: tests/test_quant_cuda.cc, the GPU test
# itself, with its longest input shortened from 16M to 3M elements (a CPU
# runs every CUDA thread), six of its 72 shapes, and without the
# QuantCudaPaths suite, whose long blocks need inputs of 8M elements and
# more (test_quant_cuda_emu covers those paths on the CPU).  Label "emu".
if(ZPP_CUDA_EMU AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_quant_cuda.cc)
  add_executable(test_quant_cuda test_quant_cuda.cc)
  target_link_libraries(test_quant_cuda PRIVATE zpp_static GTest::gtest GTest::gtest_main)
  target_include_directories(test_quant_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(test_quant_cuda PRIVATE ZPP_HAVE_CUDA=1
    ZPP_TEST_CUDA_EMU=1 "ZPP_TEST_QUANT_CUDA_LONG=((size_t)3 << 20) + 43")
  # zpp_cuda_emu.h: the emulator's test hooks (a held stream)
  target_include_directories(test_quant_cuda PRIVATE ${PROJECT_SOURCE_DIR}/tests/cuda_emu)
  # Six of the 72 shapes, so that each dtype, width and mode and every
  # block size class runs once; the pointer and stream suites in full.
  set(_shapes fp32_int8_sym_block256 fp32_int4_asym_block1 fp16_int8_asym_block3
    fp16_int4_sym_block4096 bf16_int8_sym_block1048576 bf16_int4_asym_block32)
  set(_filter "QuantCudaPointers.*:QuantCudaStream.*")
  # stochastic rounding at nonzero index bases, on every launcher path
  string(APPEND _filter ":QuantCudaTransforms.StochasticRoundingAtANonzeroIndexBase")
  # the Hadamard rotation, every group size 2..65536, against float64
  string(APPEND _filter ":QuantCudaTransforms.HadamardMatchesFloat64WithinTheStageBound")
  # the batched encode and decode-sum (tables of runs) against the CPU
  string(APPEND _filter ":QuantCudaBatch.*")
  foreach(_s ${_shapes})
    string(APPEND _filter ":All/QuantCuda.*/${_s}")
  endforeach()
  add_test(NAME quant_device_emu COMMAND test_quant_cuda --gtest_filter=${_filter})
  set_tests_properties(quant_device_emu PROPERTIES LABELS emu TIMEOUT 600)
endif()
