/* cuda_fp16.h of the CUDA emulator: the storage type only (nccl.h includes
 * this header; zpp converts half precision itself, in quant_math.h). */
#ifndef ZPP_TESTS_CUDA_EMU_CUDA_FP16_H
#define ZPP_TESTS_CUDA_EMU_CUDA_FP16_H
#include <stdint.h>
typedef struct __attribute__((aligned(2))) __half { uint16_t x; } __half;
#endif
