// The Ops (parallel/kernels/ops.h) of a CUDA device: memory from the device's stream-ordered pool (cudaMallocAsync,
// cudaFreeAsync, so that freeing a buffer never waits for the whole device, where another rank's kernel may be
// waiting for this one), one compute stream on which every kernel and copy is queued, communication streams
// ordered after it with an event, and the kernels of kernels.h in fp32 or bf16 (with fp32 master weights in AdamW).
// Built where the build has CUDA and cuBLAS (LOOM_PARALLEL_CUDA).
#pragma once

#include <memory>
#include <string>

#include "parallel/kernels/ops.h"

namespace loom::parallel::cuda {

// Ops on CUDA device `device` with parameters, gradients and activations of `dtype` (kFloat32 or kBfloat16). Null,
// with *error saying why, when there is no such device or the dtype is another.
std::unique_ptr<Ops> makeOps(int device, DType dtype, std::string* error);

// How many CUDA devices this process sees (0 when none, or no driver).
int deviceCount();

}  // namespace loom::parallel::cuda
