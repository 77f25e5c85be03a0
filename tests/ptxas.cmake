# The register check of the kernels (tools/check_ptxas.sh): every
# src/kernels/*.cu with ptxas's report for each architecture the
# library's machine code is built for (CMAKE_CUDA_ARCHITECTURES' real
# ones; without a CUDA build, the default of CMakeLists.txt: sm_80 and
# sm_90), failing on a spill or on local memory in any function: read from
# the report the library's CUDA build saved where this build compiles
# CUDA, else from a compile of its own; and the check's own test, which
# plants both and expects them refused in both modes.  Registered wherever nvcc is
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
    set(_zpp_ptxas_archs)
    if(ZPP_WITH_CUDA_ENABLED AND CMAKE_CUDA_ARCHITECTURES)
      foreach(_a ${CMAKE_CUDA_ARCHITECTURES})
        # 80, 80-real: sm_80 machine code; 90-virtual is PTX only
        if(_a MATCHES "^([0-9]+[a-z]?)(-real)?$")
          list(APPEND _zpp_ptxas_archs sm_${CMAKE_MATCH_1})
        endif()
      endforeach()
    endif()
    if(NOT _zpp_ptxas_archs)
      set(_zpp_ptxas_archs sm_80 sm_90)
    endif()
    list(JOIN _zpp_ptxas_archs "," _zpp_ptxas_archs)
    if(ZPP_WITH_CUDA_ENABLED AND ZPP_CUDA_SOURCES)
      # The library's own compile saved ptxas's report (CMakeLists.txt,
      # tools/ptxas_log.sh): read it for the library's CUDA sources; a
      # kernel file the library does not compile is compiled by the check.
      set(_zpp_lib_cu)
      foreach(_f ${ZPP_CUDA_SOURCES})
        list(APPEND _zpp_lib_cu ${PROJECT_SOURCE_DIR}/${_f})
      endforeach()
      set(_zpp_other_cu ${_zpp_kernel_cu})
      list(REMOVE_ITEM _zpp_other_cu ${_zpp_lib_cu})
      add_test(NAME ptxas_check
        COMMAND ${PROJECT_SOURCE_DIR}/tools/check_ptxas.sh
          --logs ${PROJECT_BINARY_DIR}/ptxas --arch ${_zpp_ptxas_archs} ${_zpp_lib_cu})
      if(_zpp_other_cu)
        add_test(NAME ptxas_check_other
          COMMAND ${PROJECT_SOURCE_DIR}/tools/check_ptxas.sh --nvcc ${_zpp_nvcc}
            --arch ${_zpp_ptxas_archs} ${_zpp_other_cu}
            -- -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/include)
        set_tests_properties(ptxas_check_other PROPERTIES LABELS ptxas TIMEOUT 600)
      endif()
    else()
      add_test(NAME ptxas_check
        COMMAND ${PROJECT_SOURCE_DIR}/tools/check_ptxas.sh --nvcc ${_zpp_nvcc}
          --arch ${_zpp_ptxas_archs} ${_zpp_kernel_cu}
          -- -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/include)
    endif()
    add_test(NAME ptxas_check_refuses
      COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/check_ptxas_test.sh ${_zpp_nvcc}
        ${PROJECT_SOURCE_DIR})
    set_tests_properties(ptxas_check ptxas_check_refuses PROPERTIES
      LABELS ptxas TIMEOUT 600)
  else()
    message(STATUS "zpp: no nvcc found: the ptxas check (tests/ptxas.cmake) is not registered")
  endif()
endif()
