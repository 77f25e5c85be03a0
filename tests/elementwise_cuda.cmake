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
    # the longest case shortened (the CPU runs every CUDA thread): 300007
    # elements still take several CTAs of grid-stride work
    target_compile_definitions(test_elementwise_cuda PRIVATE ZPP_HAVE_CUDA=1
      ZPP_TEST_CUDA_EMU=1 ZPP_TEST_ELEMENTWISE_LONG=300007)
    add_test(NAME elementwise_device_emu COMMAND test_elementwise_cuda)
    # every case synchronises: a short delay per operation keeps it quick
    set_tests_properties(elementwise_device_emu PROPERTIES LABELS emu
      TIMEOUT 900 ENVIRONMENT "ZPP_EMU_DELAY_US=20")
  endif()
endif()

# test_elementwise_cuda_arch: the same cases on the kernels compiled into
# the test as C++ against the emulator with __CUDA_ARCH__ defined (the
# device branches of quant_math.h) and UBSan's alignment check standing in
# for the GPU's fault on a misaligned plain load or store.  Like
# test_quant_cuda_emu it needs neither nvcc nor a GPU nor libzpp, so it is
# built wherever the emulator is (label unit).
if(TARGET zpp_cudart_emu AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_elementwise_cuda_arch.cc)
  add_executable(test_elementwise_cuda_arch test_elementwise_cuda_arch.cc
    test_elementwise_cuda_arch_tf.cc ${PROJECT_SOURCE_DIR}/src/kernels/transform.c)
  target_include_directories(test_elementwise_cuda_arch PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
    ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/cuda_emu)
  target_compile_definitions(test_elementwise_cuda_arch PRIVATE
    ZPP_TEST_CUDA_EMU=1)
  # #pragma unroll is nvcc's
  target_compile_options(test_elementwise_cuda_arch PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wno-unknown-pragmas -fsanitize=alignment
    -fno-sanitize-recover=alignment>)
  target_link_options(test_elementwise_cuda_arch PRIVATE -fsanitize=alignment)
  target_link_libraries(test_elementwise_cuda_arch PRIVATE zpp_cudart_emu
    GTest::gtest GTest::gtest_main)
  add_test(NAME elementwise_arch_emu COMMAND test_elementwise_cuda_arch)
  set_tests_properties(elementwise_arch_emu PROPERTIES LABELS unit TIMEOUT 600
    ENVIRONMENT "ZPP_EMU_DELAY_US=5")
endif()

# test_coll_align: the collectives on buffers at any byte offset
# (zpp_coll.h, "Alignment") under mpirun: coll_align_2x2 on host memory
# (label mpi) and, where the device path is built, on device memory
# through zpp_add_device_suite (coll_align_device_<backend>_2x2, label emu).
if(ZPP_WITH_MPI_ENABLED AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_coll_align.cc)
  add_executable(test_coll_align test_coll_align.cc)
  target_link_libraries(test_coll_align PRIVATE zpp_static GTest::gtest MPI::MPI_C)
  target_compile_definitions(test_coll_align PRIVATE OMPI_SKIP_MPICXX=1
    MPICH_SKIP_MPICXX=1 ZPP_HAVE_CUDA=$<BOOL:${ZPP_HAVE_CUDA_RT}>)
  target_include_directories(test_coll_align PRIVATE ${PROJECT_SOURCE_DIR}/src)
  if(ZPP_WITH_CUDA_ENABLED)
    target_link_libraries(test_coll_align PRIVATE CUDA::cudart_static)
  endif()
  add_test(NAME coll_align_2x2 COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root
    --oversubscribe --mca btl self,vader --bind-to none -np 4
    $<TARGET_FILE:test_coll_align>)
  set_tests_properties(coll_align_2x2 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "ZPP_TOPO=2x2;OMPI_MCA_mpi_yield_when_idle=1")
  if(ZPP_CUDA_EMU)
    zpp_add_device_suite(coll_align_device test_coll_align "2x2:4" "")
  endif()
endif()
