# The register check of the kernels (tools/check_ptxas.sh): every
# src/kernels/*.cu compiled for sm_90 with ptxas's report, failing on a
# spill or on local memory in any function; and the check's own test,
# which plants both and expects them refused.  Registered wherever nvcc is
# found, whether or not this build compiles CUDA (ZPP_WITH_CUDA=OFF
# included), but not in the emulated build, whose suites are label emu.
# Label ptxas: `make test-unit` runs every test of build/.
if(NOT ZPP_CUDA_EMU)
  if(CMAKE_CUDA_COMPILER)
    set(_zpp_nvcc ${CMAKE_CUDA_COMPILER})
  else()
    find_program(ZPP_NVCC nvcc HINTS /usr/local/cuda/bin)
    set(_zpp_nvcc ${ZPP_NVCC})
  endif()
  if(_zpp_nvcc)
    file(GLOB _zpp_kernel_cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/kernels/*.cu)
    add_test(NAME ptxas_check
      COMMAND ${PROJECT_SOURCE_DIR}/tools/check_ptxas.sh --nvcc ${_zpp_nvcc}
        --arch sm_90 ${_zpp_kernel_cu}
        -- -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/include)
    add_test(NAME ptxas_check_refuses
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_ptxas_test.sh ${_zpp_nvcc}
        ${PROJECT_SOURCE_DIR})
    set_tests_properties(ptxas_check ptxas_check_refuses PROPERTIES
      LABELS ptxas TIMEOUT 600)
  else()
    message(STATUS "zpp: no nvcc found: the ptxas check (tests/ptxas.cmake) is not registered")
  endif()
endif()
