// Runs the collective test matrix as one rank of a job started by loomrun (or any launcher that
// loomCommInitFromEnv understands), and exits 0 only if every case passed on this rank and its peers.
//   collective_check [small counts, comma separated] [big count] [plain|alloc|registered|cuda]
// Every type and op at the small counts; float and int32 (sum, avg, max) at the big count. The last argument
// puts the buffers in loomMemAlloc memory or registers them, so peers read them in place, or runs the cases on a
// CUDA communicator with device buffers on a stream (local rank r on device r modulo the devices there are).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "tests/common/matrix.h"

#if LOOM_TEST_CUDA
#include <cuda_runtime.h>

namespace {

// The calls' stream: the copies in and out go on it too, so they are ordered with the calls. (A copy from pageable
// memory can return before its transfer has landed; only work on the same stream is sure to see it.)
cudaStream_t gStream = nullptr;

loomtest::Device cudaDevice() {
  loomtest::Device device{};
  device.allocate = [](size_t bytes) -> void* {
    void* pointer = nullptr;
    return cudaMalloc(&pointer, bytes) == cudaSuccess ? pointer : nullptr;
  };
  device.release = [](void* pointer) { cudaFree(pointer); };
  device.copy = [](void* dst, const void* src, size_t bytes) {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, gStream) == cudaSuccess &&
           cudaStreamSynchronize(gStream) == cudaSuccess;
  };
  device.synchronize = [](loomStream_t stream) {
    return cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) == cudaSuccess;
  };
  return device;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  std::vector<size_t> small = {0, 1, 7, 1000};
  size_t big = 1000003;
  if (argc > 1) {
    small.clear();
    std::stringstream list(argv[1]);
    for (std::string item; std::getline(list, item, ',');) small.push_back(std::stoul(item));
  }
  if (argc > 2) big = std::stoul(argv[2]);
  loomtest::Memory memory = loomtest::Memory::kPlain;
  if (argc > 3)
    memory = std::string(argv[3]) == "alloc"        ? loomtest::Memory::kLoomAlloc
             : std::string(argv[3]) == "registered" ? loomtest::Memory::kRegistered
             : std::string(argv[3]) == "cuda"       ? loomtest::Memory::kDevice
                                                    : loomtest::Memory::kPlain;

  loomComm_t comm = nullptr;
  if (loomCommInitFromEnv(&comm) != loomSuccess) {
    std::fprintf(stderr, "collective_check: init failed: %s\n", loomGetLastError(nullptr));
    return 2;
  }
  int rank = 0, nranks = 0;
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);
  // The cases run on `casesComm`: the world itself, or a CUDA communicator split from it. The verdicts always
  // go over the world, on host memory.
  loomComm_t casesComm = comm;
  loomtest::Device device{};
  if (memory == loomtest::Memory::kDevice) {
#if LOOM_TEST_CUDA
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "collective_check: cuda: no CUDA device\n");
      loomCommDestroy(comm);
      return 77;
    }
    const char* localRank = std::getenv("LOOM_LOCAL_RANK");
    loomConfig_t config = LOOM_CONFIG_INITIALIZER;
    config.device = loomDeviceCuda;
    config.cudaDevice = (localRank ? std::atoi(localRank) : rank) % devices;
    cudaSetDevice(config.cudaDevice);
    if (cudaStreamCreateWithFlags(&gStream, cudaStreamNonBlocking) != cudaSuccess ||
        loomCommSplit(comm, 0, rank, &casesComm, &config) != loomSuccess) {
      std::fprintf(stderr, "collective_check: rank %d: no CUDA communicator: %s\n", rank, loomGetLastError(comm));
      return 2;
    }
    device = cudaDevice();
    device.stream = gStream;
#else
    std::fprintf(stderr, "collective_check: cuda: this build has no CUDA\n");
    loomCommDestroy(comm);
    return 77;
#endif
  }
  std::vector<loomtest::Case> cases = loomtest::matrix(nranks, small);
  for (const loomtest::Case& c : loomtest::matrix(nranks, {big})) {
    bool typeKept = c.type == loomFloat32 || c.type == loomInt32;
    bool opKept = c.op == loomSum || c.op == loomAvg || c.op == loomMax;
    if (typeKept && opKept) cases.push_back(c);
  }
  int failures = 0;
  for (const loomtest::Case& c : cases) {
    std::string error = loomtest::runCase(c, casesComm, rank, memory, &device);
    int mine = error.empty() ? 0 : 1, any = 0;
    if (!error.empty()) std::fprintf(stderr, "rank %d: FAILED %s\n", rank, error.c_str());
    if (loomAllReduce(&mine, &any, 1, loomInt32, loomMax, comm, nullptr) != loomSuccess || any) {
      failures = 1;
      break;
    }
  }
  if (rank == 0)
    std::printf("collective_check: %zu cases on %d ranks%s: %s\n", cases.size(), nranks,
                memory == loomtest::Memory::kDevice ? " with CUDA buffers" : "", failures ? "FAILED" : "passed");
  if (casesComm != comm) loomCommDestroy(casesComm);
  loomCommDestroy(comm);
  return failures;
}
