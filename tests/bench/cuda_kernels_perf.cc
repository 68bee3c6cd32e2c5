// The CUDA kernels' bandwidth beside the device's own copy, measured in one run:
//
//   cuda_kernels_perf [BYTES] [ITERATIONS]      (default 1G 20; BYTES takes K, M, G suffixes)
//
// Times cudaMemcpyAsync device to device, loom's copy kernel and loom's reduce kernel (sum, for float, double,
// half and bfloat16) over buffers of BYTES each, with CUDA events, the best of ITERATIONS. Rates are memory
// traffic: a copy reads and writes BYTES (2 x BYTES), a reduce reads two inputs and writes one (3 x BYTES). The
// last column is each rate over the device copy's. Last, the copies between the device and pinned host memory,
// which bound a CUDA communicator's staged calls (src/core/cuda_calls.h). Exits 77 when there is no CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "perf/cli.h"
#include "src/base/dtype.h"
#include "src/exec/cuda/kernels.h"

namespace {

#define CUDA_OR_DIE(call)                                                                          \
  do {                                                                                             \
    cudaError_t error_ = (call);                                                                   \
    if (error_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "cuda_kernels_perf: %s: %s\n", #call, cudaGetErrorString(error_));     \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// BYTES as perf/cli reads sizes; exits with a usage message when malformed.
size_t parseBytes(const char* text) {
  try {
    size_t bytes = perf::parseSizeArg(text, "BYTES");
    if (bytes > 0) return bytes;
  } catch (const perf::UsageError& error) {
    std::fprintf(stderr, "cuda_kernels_perf: %s\n", error.what());
    std::exit(2);
  }
  std::fprintf(stderr, "cuda_kernels_perf: BYTES must be more than 0\n");
  std::exit(2);
}

// The best time of `iterations` runs of `body` on `stream`, in seconds, after one warm-up run.
double bestSeconds(int iterations, cudaStream_t stream, const std::function<void()>& body) {
  cudaEvent_t start, stop;
  CUDA_OR_DIE(cudaEventCreate(&start));
  CUDA_OR_DIE(cudaEventCreate(&stop));
  body();
  CUDA_OR_DIE(cudaStreamSynchronize(stream));
  float best = 0;
  for (int i = 0; i < iterations; ++i) {
    CUDA_OR_DIE(cudaEventRecord(start, stream));
    body();
    CUDA_OR_DIE(cudaEventRecord(stop, stream));
    CUDA_OR_DIE(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, start, stop));
    best = i == 0 ? ms : std::min(best, ms);
  }
  CUDA_OR_DIE(cudaEventDestroy(start));
  CUDA_OR_DIE(cudaEventDestroy(stop));
  return best / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? parseBytes(argv[1]) : size_t{1} << 30;
  const int iterations = argc > 2 ? std::max(1, std::atoi(argv[2])) : 20;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_kernels_perf: no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp properties{};
  CUDA_OR_DIE(cudaGetDeviceProperties(&properties, 0));
  void *a = nullptr, *b = nullptr, *out = nullptr;
  CUDA_OR_DIE(cudaMalloc(&a, bytes));
  CUDA_OR_DIE(cudaMalloc(&b, bytes));
  CUDA_OR_DIE(cudaMalloc(&out, bytes));
  CUDA_OR_DIE(cudaMemset(a, 0, bytes));
  CUDA_OR_DIE(cudaMemset(b, 0, bytes));
  cudaStream_t stream;
  CUDA_OR_DIE(cudaStreamCreate(&stream));
  auto check = [](loomResult_t result) {
    if (result != loomSuccess) {
      std::fprintf(stderr, "cuda_kernels_perf: a loom kernel failed to launch (%d)\n", result);
      std::exit(1);
    }
  };

  std::printf("# cuda_kernels_perf %zu bytes, best of %d, on %s (%d SMs)\n", bytes, iterations, properties.name,
              properties.multiProcessorCount);
  std::printf("# %-22s %12s %14s %10s\n", "kernel", "time (us)", "traffic (GB/s)", "/ memcpy");
  const double memcpySeconds = bestSeconds(iterations, stream, [&] {
    CUDA_OR_DIE(cudaMemcpyAsync(out, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double memcpyRate = 2.0 * bytes / memcpySeconds / 1e9;
  auto row = [&](const std::string& name, double seconds, double traffic) {
    const double rate = traffic * bytes / seconds / 1e9;
    std::printf("  %-22s %12.1f %14.1f %10.2f\n", name.c_str(), seconds * 1e6, rate, rate / memcpyRate);
  };
  row("cudaMemcpy D2D", memcpySeconds, 2);
  row("copy", bestSeconds(iterations, stream, [&] { check(loom::device::enqueueCopy(out, a, bytes, stream)); }), 2);
  for (loomDataType_t type : {loomFloat32, loomFloat64, loomFloat16, loomBfloat16}) {
    const size_t count = bytes / loom::dtypeSize(type);
    const double seconds = bestSeconds(iterations, stream, [&] {
      check(loom::device::enqueueReduce(out, a, b, count, type, loomSum, stream));
    });
    row(std::string("reduce ") + loom::dtypeName(type) + " sum", seconds, 3);
  }
  void* pinned = nullptr;
  CUDA_OR_DIE(cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable));
  std::memset(pinned, 0, bytes);
  const double toHost = bestSeconds(iterations, stream, [&] {
    CUDA_OR_DIE(cudaMemcpyAsync(pinned, a, bytes, cudaMemcpyDeviceToHost, stream));
  });
  const double toDevice = bestSeconds(iterations, stream, [&] {
    CUDA_OR_DIE(cudaMemcpyAsync(out, pinned, bytes, cudaMemcpyHostToDevice, stream));
  });
  std::printf("# pinned host memory (the staged path's ceiling): device to host %.1f GB/s, host to device %.1f GB/s\n",
              bytes / toHost / 1e9, bytes / toDevice / 1e9);
  CUDA_OR_DIE(cudaFreeHost(pinned));
  CUDA_OR_DIE(cudaStreamDestroy(stream));
  CUDA_OR_DIE(cudaFree(a));
  CUDA_OR_DIE(cudaFree(b));
  CUDA_OR_DIE(cudaFree(out));
  return 0;
}
