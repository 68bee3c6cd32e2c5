// PreMulSum's local step, x * scalar, for every NCCL datatype that reduces: written once for the host (the library
// in host mode) and the device (premul.cu). fp16 and bf16 multiply in fp32 and round to nearest even, as loom
// reduces them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace loom::nccl {

template <typename T>
__host__ __device__ inline T premultiplied(T x, T scalar) {
  return static_cast<T>(x * scalar);
}
template <>
__host__ __device__ inline __half premultiplied(__half x, __half scalar) {
  return __float2half_rn(__half2float(x) * __half2float(scalar));
}
template <>
__host__ __device__ inline __nv_bfloat16 premultiplied(__nv_bfloat16 x, __nv_bfloat16 scalar) {
  return __float2bfloat16_rn(__bfloat162float(x) * __bfloat162float(scalar));
}

// Calls visit(static_cast<T*>(nullptr)) with T the C++ type of NCCL datatype `datatype` (ncclInt8 to
// ncclBfloat16, which are loom's datatypes with the same numbers); false for any other value.
template <typename Visit>
bool visitType(int datatype, Visit&& visit) {
  switch (datatype) {
    case 0:
      visit(static_cast<int8_t*>(nullptr));
      return true;
    case 1:
      visit(static_cast<uint8_t*>(nullptr));
      return true;
    case 2:
      visit(static_cast<int32_t*>(nullptr));
      return true;
    case 3:
      visit(static_cast<uint32_t*>(nullptr));
      return true;
    case 4:
      visit(static_cast<int64_t*>(nullptr));
      return true;
    case 5:
      visit(static_cast<uint64_t*>(nullptr));
      return true;
    case 6:
      visit(static_cast<__half*>(nullptr));
      return true;
    case 7:
      visit(static_cast<float*>(nullptr));
      return true;
    case 8:
      visit(static_cast<double*>(nullptr));
      return true;
    case 9:
      visit(static_cast<__nv_bfloat16*>(nullptr));
      return true;
    default:
      return false;
  }
}

// out[i] = in[i] * scalar for `count` elements of `datatype`, queued on `stream`. The scalar is read by the
// kernel from `deviceScalar` when that is not null (NCCL's ncclScalarDevice), else taken from `immediate` (one
// element, copied now). in == out is allowed.
cudaError_t premulOnDevice(int datatype, const void* in, void* out, size_t count, const void* immediate,
                           const void* deviceScalar, cudaStream_t stream);

}  // namespace loom::nccl
