// The device half of PreMulSum (premul.h): one grid-stride kernel per datatype.
#include <cstring>

#include "plugins/nccl/premul.h"

namespace loom::nccl {
namespace {

template <typename T>
__global__ void premulKernel(const T* in, T* out, size_t count, T immediate, const T* deviceScalar) {
  T scalar = deviceScalar != nullptr ? *deviceScalar : immediate;
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    out[i] = premultiplied(in[i], scalar);
}

}  // namespace

cudaError_t premulOnDevice(int datatype, const void* in, void* out, size_t count, const void* immediate,
                           const void* deviceScalar, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr unsigned kThreads = 256;
  constexpr size_t kMaxBlocks = 4096;
  size_t wanted = (count + kThreads - 1) / kThreads;
  unsigned blocks = static_cast<unsigned>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
  bool known = visitType(datatype, [&]<typename T>(T*) {
    T value{};
    if (immediate != nullptr) std::memcpy(static_cast<void*>(&value), immediate, sizeof(T));
    premulKernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(in), static_cast<T*>(out), count, value,
                                                     static_cast<const T*>(deviceScalar));
  });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace loom::nccl
