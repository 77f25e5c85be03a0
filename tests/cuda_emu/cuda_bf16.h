/* cuda_bf16.h of the CUDA emulator: the storage type only (nccl.h includes
 * this header; zpp converts bfloat16 itself, in quant_math.h). */
#ifndef ZPP_TESTS_CUDA_EMU_CUDA_BF16_H
#define ZPP_TESTS_CUDA_EMU_CUDA_BF16_H
#include <stdint.h>
typedef struct __attribute__((aligned(2))) __nv_bfloat16 { uint16_t x; } __nv_bfloat16;
#endif
