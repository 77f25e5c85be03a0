# zpp_get_build_features (test_build_features, label unit; label emu too
# in an emulated build, below) against this configuration's own decisions:
# the ZPP_WITH_* results above, and UCX's header looked for here the way
# transport_ucx.c does (__has_include).
include(CheckIncludeFile)
check_include_file(ucp/api/ucp.h ZPP_TEST_HAVE_UCP_H)
zpp_add_gtest(test_build_features)
target_compile_definitions(test_build_features PRIVATE
  ZPP_EXPECT_CUDA=$<BOOL:${ZPP_WITH_CUDA_ENABLED}>
  ZPP_EXPECT_CUDA_EMU=$<BOOL:${ZPP_CUDA_EMU}>
  ZPP_EXPECT_NCCL=$<BOOL:${ZPP_WITH_NCCL_ENABLED}>
  ZPP_EXPECT_MPI=$<BOOL:${ZPP_WITH_MPI_ENABLED}>
  ZPP_EXPECT_UCX=$<BOOL:${ZPP_TEST_HAVE_UCP_H}>)
# In an emulated build (ZPP_CUDA_EMU) the same test, label emu: the
# emulator's bit set and the real CUDA's clear (make test-emu builds it).
if(ZPP_CUDA_EMU)
  add_test(NAME build_features_emu COMMAND test_build_features)
  set_tests_properties(build_features_emu PROPERTIES LABELS emu TIMEOUT 60)
endif()
