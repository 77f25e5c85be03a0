// Between the two halves of the emulator: the runtime (cuda_emu.cc) and
// the CTA scheduler that runs a grid on fibers (cuda_emu_grid.cc).
#ifndef ZPP_TESTS_CUDA_EMU_INTERNAL_H
#define ZPP_TESTS_CUDA_EMU_INTERNAL_H

#include <string>

#include "cuda_runtime.h"

namespace zpp_emu {

// Runs every CTA of a 1-D grid, one after another, each CUDA thread a
// fiber calling run(closure).  False, with *why set, when a CTA deadlocks
// (a barrier or shuffle not reached by every thread) or a shuffle's mask is
// not full.  Called by one thread at a time (the device lock).
bool run_grid(dim3 grid, dim3 block, void (*run)(void *), void *closure,
              std::string *why);

// The error of the last grid run_grid failed: cudaErrorMisalignedAddress
// when a thread made a misaligned access (zpp_emu_misaligned), else
// cudaErrorLaunchFailure.
cudaError_t grid_error();

// Called once by every thread that may run device code: fiber stacks
// belong to the caller, and a fault inside a fiber needs an alternate
// signal stack.
void prepare_thread();

}  // namespace zpp_emu

#endif
