/* cuda_fp8.h of the CUDA emulator: the storage types only (nccl.h includes
 * this header from C++; zpp has no fp8 data). */
#ifndef ZPP_TESTS_CUDA_EMU_CUDA_FP8_H
#define ZPP_TESTS_CUDA_EMU_CUDA_FP8_H
#include <stdint.h>
typedef struct __nv_fp8_e4m3 { uint8_t x; } __nv_fp8_e4m3;
typedef struct __nv_fp8_e5m2 { uint8_t x; } __nv_fp8_e5m2;
#endif
