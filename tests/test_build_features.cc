// zpp_get_build_features: each bit against what CMake decided for this
// build (tests/build_features.cmake passes it in), and the calls that
// depend on a feature agree with it.
#include <gtest/gtest.h>

#include <zpp/zpp.h>

#include <cstring>
#include <string>

namespace {

unsigned expected() {
  unsigned f = 0;
  if (ZPP_EXPECT_CUDA)
    f |= ZPP_FEATURE_CUDA;
  if (ZPP_EXPECT_CUDA_EMU)
    f |= ZPP_FEATURE_CUDA_EMU;
  if (ZPP_EXPECT_NCCL)
    f |= ZPP_FEATURE_NCCL;
  if (ZPP_EXPECT_MPI)
    f |= ZPP_FEATURE_MPI;
  if (ZPP_EXPECT_UCX)
    f |= ZPP_FEATURE_UCX;
  return f;
}

TEST(BuildFeatures, EqualTheConfiguration) {
  unsigned f = 0xdeadbeefu;
  ASSERT_EQ(zpp_get_build_features(&f), ZPP_OK);
  std::printf("[ info ] features 0x%x, configured 0x%x\n", f, expected());
  EXPECT_EQ(f, expected());
  // no bit outside the documented ones; CUDA and its emulator exclude
  // each other
  EXPECT_EQ(f & ~31u, 0u);
  EXPECT_NE(f & ZPP_FEATURE_CUDA && f & ZPP_FEATURE_CUDA_EMU, true);
}

TEST(BuildFeatures, NullIsAnError) {
  EXPECT_EQ(zpp_get_build_features(nullptr), ZPP_ERR_NULL_POINTER);
  EXPECT_STREQ(zpp_get_last_error(),
               "zpp_get_build_features: features is NULL");
}

TEST(BuildFeatures, DeviceCallsAgree) {
  // without CUDA (real or emulated) no device is usable and the device
  // codec says so
  unsigned f = 0;
  ASSERT_EQ(zpp_get_build_features(&f), ZPP_OK);
  if (f & (ZPP_FEATURE_CUDA | ZPP_FEATURE_CUDA_EMU))
    GTEST_SKIP()
        << "built with CUDA: whether a device is usable depends on the machine";
  EXPECT_EQ(zpp_cuda_available(), 0);
  zpp_quant_config_t c = ZPP_QUANT_CONFIG_INIT;
  float x[4] = {1, 2, 3, 4};
  uint8_t enc[64];
  EXPECT_EQ(
      zpp_quant_encode_device(&c, ZPP_FLOAT32, x, 4, enc, sizeof enc, nullptr),
      ZPP_ERR_UNSUPPORTED);
}

} // namespace
