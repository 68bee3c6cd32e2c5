// What the host code that drives CUDA shares (cuda_calls.cc, cuda_device.cc, transports/cuda_ipc): a CUDA error
// as a loom error with CUDA's message, and a scope that makes a device current. Included only where the build
// has CUDA (LOOM_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "src/base/check.h"

namespace loom {

inline loomResult_t cudaFailed(cudaError_t error, const char* what) {
  return LOOM_FAIL(loomUnhandledCudaError, CUDA, "%s: %s (%s)", what, cudaGetErrorString(error),
                   cudaGetErrorName(error));
}

#define LOOM_CUDA_CHECK(call, what)                                                     \
  do {                                                                                  \
    cudaError_t loomCudaError_ = (call);                                                \
    if (loomCudaError_ != cudaSuccess) return ::loom::cudaFailed(loomCudaError_, what); \
  } while (0)

// Makes `device` the calling thread's current device for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device)
      changed_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace loom
