// What the CUDA kernels' files share (kernels.cu, loss_optimizer.cu; nvcc only): the device type of an element
// type, loads that widen to fp32 and stores that round, the launch shape of the grid-stride loops, warp reductions
// and stream-ordered scratch. Internal to parallel/kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "parallel/kernels/cuda/kernels.h"

namespace loom::parallel::cuda::detail {

static_assert(sizeof(Bf16) == sizeof(__nv_bfloat16));

// The device type of a kernels.h element type, and the pointer casts between them.
template <typename E>
struct DeviceType {
  using type = float;
};
template <>
struct DeviceType<Bf16> {
  using type = __nv_bfloat16;
};
template <typename E>
using Dev = typename DeviceType<E>::type;
template <typename E>
Dev<E>* dev(E* p) {
  return reinterpret_cast<Dev<E>*>(p);
}
template <typename E>
const Dev<E>* dev(const E* p) {
  return reinterpret_cast<const Dev<E>*>(p);
}

// Loads widen to fp32; stores round to the element type (to nearest even).
__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename D>
__device__ __forceinline__ D store(float x);
template <>
__device__ __forceinline__ float store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <typename D>
__device__ __forceinline__ void addTo(D* p, float x) {
  *p = store<D>(load(*p) + x);
}

constexpr int kThreads = 256;

inline cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline unsigned blocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

__device__ inline size_t firstIndex() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline size_t gridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

__device__ inline float warpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ inline float warpMax(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Stream-ordered scratch on `stream`; without device memory the step cannot go on.
inline void mustAllocate(void** memory, size_t bytes, cudaStream_t stream, const char* what) {
  const cudaError_t error = cudaMallocAsync(memory, bytes, stream);
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "parallel/kernels/cuda: no device memory for %s (%zu bytes): %s\n", what, bytes,
               cudaGetErrorString(error));
  std::exit(1);
}

}  // namespace loom::parallel::cuda::detail
