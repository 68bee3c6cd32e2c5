// perf/cuda_buffers.h over the CUDA runtime, or, in a build without CUDA, answers that say so.
#include "perf/cuda_buffers.h"

#if LOOM_PERF_CUDA
#include <cuda_runtime.h>
#endif

namespace perf::cuda {

#if LOOM_PERF_CUDA

namespace {
thread_local cudaError_t tLastError = cudaSuccess;
bool ok(cudaError_t error) {
  if (error != cudaSuccess) tLastError = error;
  return error == cudaSuccess;
}
}  // namespace

bool available(std::string* why) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count > 0) return true;
  *why = error != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(error) : "no CUDA device";
  return false;
}

int deviceCount() {
  int count = 0;
  return ok(cudaGetDeviceCount(&count)) ? count : 0;
}

bool select(int device, std::string* name, std::string* busId) {
  cudaDeviceProp properties{};
  char bus[32] = {};
  if (!ok(cudaSetDevice(device)) || !ok(cudaGetDeviceProperties(&properties, device)) ||
      !ok(cudaDeviceGetPCIBusId(bus, sizeof(bus), device)))
    return false;
  *name = properties.name;
  *busId = bus;
  return true;
}

size_t freeBytes() {
  size_t free = 0, total = 0;
  return ok(cudaMemGetInfo(&free, &total)) ? free : 0;
}

void* allocate(size_t bytes) {
  void* pointer = nullptr;
  return ok(cudaMalloc(&pointer, bytes)) ? pointer : nullptr;
}

void release(void* pointer) { ok(cudaFree(pointer)); }

bool zero(void* pointer, size_t bytes) { return ok(cudaMemset(pointer, 0, bytes)) && ok(cudaDeviceSynchronize()); }

bool copy(void* dst, const void* src, size_t bytes, void* stream) {
  auto cudaStream = static_cast<cudaStream_t>(stream);
  return ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStream)) && ok(cudaStreamSynchronize(cudaStream));
}

void* createStream() {
  cudaStream_t stream = nullptr;
  return ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) ? stream : nullptr;
}

bool synchronize(void* stream) { return ok(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

void destroyStream(void* stream) { ok(cudaStreamDestroy(static_cast<cudaStream_t>(stream))); }

std::string lastError() { return tLastError == cudaSuccess ? "" : cudaGetErrorString(tLastError); }

#else

bool available(std::string* why) {
  *why = "this loom build has no CUDA";
  return false;
}
int deviceCount() { return 0; }
bool select(int, std::string*, std::string*) { return false; }
size_t freeBytes() { return 0; }
void* allocate(size_t) { return nullptr; }
void release(void*) {}
bool zero(void*, size_t) { return false; }
bool copy(void*, const void*, size_t, void*) { return false; }
void* createStream() { return nullptr; }
bool synchronize(void*) { return false; }
void destroyStream(void*) {}
std::string lastError() { return "this loom build has no CUDA"; }

#endif

}  // namespace perf::cuda
