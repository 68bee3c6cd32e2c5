// The CUDA reduction, divide and copy kernels (kernels.h). Each is a grid-stride loop over 16-byte vectors when
// every pointer it touches is 16-byte aligned, and over elements otherwise; the elements past the last whole
// vector go one per thread. The arithmetic is element_ops.h's, shared with the host test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "src/core/check.h"
#include "src/exec/cuda/element_ops.h"
#include "src/exec/cuda/kernels.h"
#include "transports/fifo_protocol.h"  // compiled here for the device too: the GPU executor's FIFO arithmetic

namespace loom::device {
namespace {

constexpr int kThreads = 512;
constexpr unsigned kMaxBlocks = 1024;  // per launch; the grid-stride loop covers the rest

// Blocks for `units` units of work: enough to fill the device, no more than the work needs.
unsigned blocksFor(size_t units) {
  size_t blocks = (units + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<size_t>(blocks, 1, kMaxBlocks));
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

__device__ size_t firstIndex() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t gridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

// 16 bytes of elements, loaded and stored as one uint4.
template <typename Storage>
union Vector {
  uint4 raw;
  Storage elements[sizeof(uint4) / sizeof(Storage)];
};

template <loomDataType_t kType, typename Op>
__global__ void reduceKernel(void* dst, const void* a, const void* b, size_t count, bool vectors) {
  using Storage = typename FormatOf<kType>::Storage;
  constexpr size_t kPerVector = sizeof(uint4) / sizeof(Storage);
  auto* out = static_cast<Storage*>(dst);
  const auto* inA = static_cast<const Storage*>(a);
  const auto* inB = static_cast<const Storage*>(b);
  size_t done = 0;
  if (vectors) {
    const size_t whole = count / kPerVector;
    for (size_t v = firstIndex(); v < whole; v += gridStride()) {
      Vector<Storage> x, y, z;
      x.raw = reinterpret_cast<const uint4*>(inA)[v];
      y.raw = reinterpret_cast<const uint4*>(inB)[v];
#pragma unroll
      for (size_t j = 0; j < kPerVector; ++j) z.elements[j] = combine<kType, Op>(x.elements[j], y.elements[j]);
      reinterpret_cast<uint4*>(out)[v] = z.raw;
    }
    done = whole * kPerVector;
  }
  for (size_t i = done + firstIndex(); i < count; i += gridStride()) out[i] = combine<kType, Op>(inA[i], inB[i]);
}

template <loomDataType_t kType>
__global__ void divideKernel(void* data, size_t count, int divisor, bool vectors) {
  using Storage = typename FormatOf<kType>::Storage;
  constexpr size_t kPerVector = sizeof(uint4) / sizeof(Storage);
  auto* values = static_cast<Storage*>(data);
  size_t done = 0;
  if (vectors) {
    const size_t whole = count / kPerVector;
    for (size_t v = firstIndex(); v < whole; v += gridStride()) {
      Vector<Storage> x;
      x.raw = reinterpret_cast<const uint4*>(values)[v];
#pragma unroll
      for (size_t j = 0; j < kPerVector; ++j) x.elements[j] = divide<kType>(x.elements[j], divisor);
      reinterpret_cast<uint4*>(values)[v] = x.raw;
    }
    done = whole * kPerVector;
  }
  for (size_t i = done + firstIndex(); i < count; i += gridStride()) values[i] = divide<kType>(values[i], divisor);
}

__global__ void copyKernel(void* dst, const void* src, size_t bytes, bool vectors) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  size_t done = 0;
  if (vectors) {
    const size_t whole = bytes / sizeof(uint4);
    for (size_t v = firstIndex(); v < whole; v += gridStride())
      reinterpret_cast<uint4*>(out)[v] = reinterpret_cast<const uint4*>(in)[v];
    done = whole * sizeof(uint4);
  }
  for (size_t i = done + firstIndex(); i < bytes; i += gridStride()) out[i] = in[i];
}

__global__ void gateWaitKernel(const StreamGate* gate, uint64_t sequence) {
  const volatile uint64_t* done = &gate->done;
  const volatile uint32_t* abort = &gate->abort;
  unsigned sleepNs = 64;
  while (*done < sequence && *abort == 0) {
    __nanosleep(sleepNs);
    if (sleepNs < 4096) sleepNs *= 2;
  }
}

struct DeviceSlicesOf {
  size_t sliceElems;
  __device__ size_t operator()(const Step& step) const { return sliceCount(step.count(), sliceElems); }
};

__global__ void planWalkKernel(FlatPlanView plan, uint32_t laneIndex, size_t sliceElems, uint32_t* visits,
                               size_t capacity, unsigned long long* count) {
  const FlatLaneView lane = plan.lane(laneIndex);
  const DeviceSlicesOf slicesOf{sliceElems};
  BasicLaneCursor<FlatLaneView> cursor;
  unsigned long long visited = 0;
  for (cursor.start(lane, slicesOf); !cursor.done(); cursor.next(slicesOf)) {
    if (visited < capacity) {
      visits[2 * visited] = static_cast<uint32_t>(cursor.step());
      visits[2 * visited + 1] = static_cast<uint32_t>(cursor.round());
    }
    ++visited;
  }
  *count = visited;
}

__device__ uint64_t nanoseconds() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

template <loomDataType_t kType, typename Op>
__global__ void lanesKernel(FlatPlanView plan, LaneCall call, FifoWords words, PortableEnd* recvEnds,
                            PortableEnd* sendEnds, int nranks, const uint32_t* abortFlag, uint64_t timeoutNs,
                            uint32_t* status) {
  extern __shared__ uint32_t llStaging[];
  if (threadIdx.x != 0) return;
  const FlatLaneView lane = plan.lane(blockIdx.x);
  LaneRunner<kType, Op> runner;
  runner.start(lane, call, words, recvEnds + lane.channel * nranks, sendEnds + lane.channel * nranks, llStaging);
  uint64_t lastProgress = nanoseconds();
  unsigned sleepNs = 32;
  while (!runner.done()) {
    const LaneStatus state = runner.tryNext();
    uint32_t failure = kLaneOk;
    if (state == LaneStatus::kRan) {
      lastProgress = nanoseconds();
      sleepNs = 32;
      continue;
    }
    if (state == LaneStatus::kPeerAborted) failure = kLanePeerAborted;
    if (state == LaneStatus::kBadMessage) failure = kLaneBadMessage;
    if (abortFlag != nullptr && *reinterpret_cast<const volatile uint32_t*>(abortFlag) != 0) failure = kLaneAborted;
    if (failure == kLaneOk && nanoseconds() - lastProgress > timeoutNs) failure = kLaneTimedOut;
    if (failure != kLaneOk) {
      atomicCAS(status, kLaneOk, failure);
      return;
    }
    __nanosleep(sleepNs);
    if (sleepNs < 1024) sleepNs *= 2;
  }
}

loomResult_t launched(const char* what) {
  cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return loomSuccess;
  return LOOM_FAIL(loomUnhandledCudaError, CUDA, "%s kernel launch failed: %s", what, cudaGetErrorString(error));
}

// Calls body.template operator()<kType>() for the loomDataType_t `type`; false for a value outside the enum.
template <typename Body>
bool forType(loomDataType_t type, Body&& body) {
  switch (type) {
    case loomInt8:
      body.template operator()<loomInt8>();
      return true;
    case loomUint8:
      body.template operator()<loomUint8>();
      return true;
    case loomInt32:
      body.template operator()<loomInt32>();
      return true;
    case loomUint32:
      body.template operator()<loomUint32>();
      return true;
    case loomInt64:
      body.template operator()<loomInt64>();
      return true;
    case loomUint64:
      body.template operator()<loomUint64>();
      return true;
    case loomFloat16:
      body.template operator()<loomFloat16>();
      return true;
    case loomFloat32:
      body.template operator()<loomFloat32>();
      return true;
    case loomFloat64:
      body.template operator()<loomFloat64>();
      return true;
    case loomBfloat16:
      body.template operator()<loomBfloat16>();
      return true;
    default:
      return false;
  }
}

template <typename Op>
loomResult_t launchReduce(void* dst, const void* a, const void* b, size_t count, loomDataType_t type,
                          cudaStream_t stream) {
  const bool vectors = aligned16(dst) && aligned16(a) && aligned16(b);
  const unsigned blocks = blocksFor(vectors ? (count + 15) / 16 : count);  // a vector holds 2 to 16 elements
  bool known = forType(type, [&]<loomDataType_t kType>() {
    reduceKernel<kType, Op><<<blocks, kThreads, 0, stream>>>(dst, a, b, count, vectors);
  });
  if (!known) return LOOM_FAIL(loomInvalidArgument, CUDA, "reduce kernel: data type %d is not a loomDataType_t", type);
  return launched("reduce");
}

template <typename Op>
loomResult_t launchLanes(const FlatPlanView& plan, const LaneCall& call, const FifoWords& words,
                         PortableEnd* recvEnds, PortableEnd* sendEnds, int nranks, loomDataType_t type,
                         const uint32_t* abortFlag, uint64_t timeoutNs, uint32_t* status, size_t stagingBytes,
                         cudaStream_t stream) {
  bool known = forType(type, [&]<loomDataType_t kType>() {
    lanesKernel<kType, Op><<<plan.laneCount, 32, stagingBytes, stream>>>(plan, call, words, recvEnds, sendEnds,
                                                                        nranks, abortFlag, timeoutNs, status);
  });
  if (!known) return LOOM_FAIL(loomInvalidArgument, CUDA, "lanes kernel: data type %d is not a loomDataType_t", type);
  return launched("lanes");
}

}  // namespace

loomResult_t enqueueReduce(void* dst, const void* a, const void* b, size_t count, loomDataType_t type,
                           loomRedOp_t op, void* stream) {
  if (count == 0) return loomSuccess;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  switch (op) {
    case loomSum:
    case loomAvg:
      return launchReduce<SumOp>(dst, a, b, count, type, cudaStream);
    case loomProd:
      return launchReduce<ProdOp>(dst, a, b, count, type, cudaStream);
    case loomMax:
      return launchReduce<MaxOp>(dst, a, b, count, type, cudaStream);
    case loomMin:
      return launchReduce<MinOp>(dst, a, b, count, type, cudaStream);
    default:
      return LOOM_FAIL(loomInvalidArgument, CUDA, "reduce kernel: operation %d is not a loomRedOp_t", op);
  }
}

loomResult_t enqueueDivide(void* data, size_t count, loomDataType_t type, int divisor, void* stream) {
  if (count == 0 || divisor < 2) return loomSuccess;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  const bool vectors = aligned16(data);
  const unsigned blocks = blocksFor(vectors ? (count + 15) / 16 : count);
  bool known = forType(type, [&]<loomDataType_t kType>() {
    divideKernel<kType><<<blocks, kThreads, 0, cudaStream>>>(data, count, divisor, vectors);
  });
  if (!known) return LOOM_FAIL(loomInvalidArgument, CUDA, "divide kernel: data type %d is not a loomDataType_t", type);
  return launched("divide");
}

loomResult_t enqueueCopy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return loomSuccess;
  const bool vectors = aligned16(dst) && aligned16(src);
  copyKernel<<<blocksFor(vectors ? (bytes + 15) / 16 : bytes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, src, bytes, vectors);
  return launched("copy");
}

loomResult_t enqueueGateWait(const StreamGate* gate, uint64_t sequence, void* stream) {
  gateWaitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(gate, sequence);
  return launched("gate wait");
}

loomResult_t enqueuePlanWalk(FlatPlanView plan, uint32_t lane, size_t sliceElems, uint32_t* visits, size_t capacity,
                             unsigned long long* count, void* stream) {
  if (lane >= plan.laneCount || sliceElems == 0)
    return LOOM_FAIL(loomInvalidArgument, CUDA, "plan walk: lane %u of %u, slices of %zu elements", lane,
                     plan.laneCount, sliceElems);
  planWalkKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(plan, lane, sliceElems, visits, capacity, count);
  return launched("plan walk");
}

loomResult_t enqueueLanes(const FlatPlanView& plan, const LaneCall& call, const FifoWords& words,
                          PortableEnd* recvEnds, PortableEnd* sendEnds, int nranks, loomDataType_t type,
                          loomRedOp_t op, const uint32_t* abortFlag, uint64_t timeoutNs, uint32_t* status,
                          size_t llSlotBytes, void* stream) {
  if (plan.laneCount == 0) return loomSuccess;
  const size_t stagingBytes = llSlotBytes / 8 * sizeof(uint32_t);
  auto cudaStream = static_cast<cudaStream_t>(stream);
  auto launch = [&]<typename Op>() {
    return launchLanes<Op>(plan, call, words, recvEnds, sendEnds, nranks, type, abortFlag, timeoutNs, status,
                           stagingBytes, cudaStream);
  };
  switch (op) {
    case loomSum:
    case loomAvg:
      return launch.template operator()<SumOp>();
    case loomProd:
      return launch.template operator()<ProdOp>();
    case loomMax:
      return launch.template operator()<MaxOp>();
    case loomMin:
      return launch.template operator()<MinOp>();
    default:
      return LOOM_FAIL(loomInvalidArgument, CUDA, "lanes kernel: operation %d is not a loomRedOp_t", op);
  }
}

}  // namespace loom::device
