# The SIMD kernels of qgZ's compressed-domain sums against the scalar
# reference, bit for bit (tests/test_isum_simd.cc).  Label "unit".
zpp_add_gtest(test_isum_simd)
