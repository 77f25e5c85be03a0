# qgZ's device path on the emulated runtime (tests/test_qgz_device.cc):
# the kernel launches of one call do not grow with the number of ranks
# (the whole job against a half of it, from the emulator's kernel log),
# and results and residuals equal the host path's bit for bit.  Layouts
# 2x4 (grows the ranks per node) and 4x2 (grows the nodes), MPI and NCCL
# backends.  Label emu.
if(ZPP_CUDA_EMU AND ZPP_WITH_MPI_ENABLED AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_qgz_device.cc)
  add_executable(test_qgz_device test_qgz_device.cc)
  target_link_libraries(test_qgz_device PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_qgz_device PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
    ZPP_HAVE_CUDA=1)
  target_include_directories(test_qgz_device PRIVATE ${PROJECT_SOURCE_DIR}/src
    ${PROJECT_SOURCE_DIR}/tests/cuda_emu)
  zpp_add_device_suite(qgz_device test_qgz_device "2x4:8;4x2:8" "")
endif()
