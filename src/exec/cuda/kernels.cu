// The CUDA reduction, divide and copy kernels (kernels.h). Each is a grid-stride loop over 16-byte vectors when
// every pointer it touches is 16-byte aligned, and over elements otherwise; the elements past the last whole
// vector go one per thread. The arithmetic is element_ops.h's, shared with the host test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "src/base/check.h"
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

constexpr int kLaneThreads = 256;

// One lane per CTA. Thread 0 drives the lane (waits for each slice's message and credit, posts and releases);
// every thread of the CTA moves the slice's data. The slice goes through shared memory; the fence and barrier
// after the data make it visible to the peer before thread 0 posts.
template <loomDataType_t kType, typename Op>
__global__ void lanesKernel(FlatPlanView plan, LaneCall call, FifoWords words, PortableEnd* recvEnds,
                            PortableEnd* sendEnds, int nranks, const uint32_t* abortFlag, uint64_t timeoutNs,
                            uint32_t* status) {
  using Runner = LaneRunner<kType, Op>;
  extern __shared__ uint32_t llStaging[];
  __shared__ typename Runner::Slice slice;
  __shared__ uint32_t state;  // kLaneOk: a slice to run; else done (kLaneDone) or a LaneFailure
  constexpr uint32_t kLaneDone = 0xffffffffu;
  Runner runner;  // thread 0's
  if (threadIdx.x == 0) {
    const FlatLaneView lane = plan.lane(blockIdx.x);
    runner.start(lane, call, words, recvEnds + lane.channel * nranks, sendEnds + lane.channel * nranks, llStaging);
  }
  for (;;) {
    if (threadIdx.x == 0) {
      uint64_t since = nanoseconds();
      unsigned sleepNs = 32;
      for (;;) {
        if (*reinterpret_cast<const volatile uint32_t*>(status) != kLaneOk) {
          state = kLaneDone;  // another lane, or an earlier call, has failed: the communicator is done for
          break;
        }
        const LaneStatus ready = runner.prepare(&slice);
        if (ready == LaneStatus::kRan) {
          state = kLaneOk;
          break;
        }
        uint32_t failure = kLaneOk;
        if (ready == LaneStatus::kDone) {
          state = kLaneDone;
          break;
        }
        if (ready == LaneStatus::kPeerAborted) failure = kLanePeerAborted;
        if (ready == LaneStatus::kBadMessage) failure = kLaneBadMessage;
        if (abortFlag != nullptr && *reinterpret_cast<const volatile uint32_t*>(abortFlag) != 0) failure = kLaneAborted;
        if (failure == kLaneOk && nanoseconds() - since > timeoutNs) failure = kLaneTimedOut;
        if (failure != kLaneOk) {
          atomicCAS(status, kLaneOk, failure);
          state = kLaneDone;
          break;
        }
        __nanosleep(sleepNs);
        if (sleepNs < 1024) sleepNs *= 2;
      }
    }
    __syncthreads();
    if (state != kLaneOk) return;
    Runner::apply(slice, threadIdx.x, blockDim.x);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) runner.finish(slice);
    // The next prepare() rewrites the slice only after every thread has passed the barrier above.
  }
}

__device__ bool failed(const uint32_t* status) {
  return *reinterpret_cast<const volatile uint32_t*>(status) != kLaneOk;
}

// The barrier half of thread p < nranks (other than the rank's own): raises flag `epoch` for peer p and waits for
// p's. Returns the failure that ended the wait, or kLaneOk.
using Flags = PeerAllReduce<loomUint8, SumOp>;  // signal, arrived and peerAborted do not depend on the type
__device__ uint32_t meetPeer(const PeerCall& call, int p, uint64_t epoch, const uint32_t* abortFlag,
                             uint64_t timeoutNs) {
  Flags::signal(call, p, epoch);
  const uint64_t start = nanoseconds();
  unsigned sleepNs = 32;
  while (!Flags::arrived(call, p, epoch)) {
    if (Flags::peerAborted(call, p)) return kLanePeerAborted;
    if (abortFlag != nullptr && *reinterpret_cast<const volatile uint32_t*>(abortFlag) != 0) return kLaneAborted;
    if (nanoseconds() - start > timeoutNs) return kLaneTimedOut;
    __nanosleep(sleepNs);
    if (sleepNs < 1024) sleepNs *= 2;
  }
  return kLaneOk;
}

// A barrier with every peer, in one CTA whose threads 0 to nranks - 1 each meet one peer, after every thread's
// writes of the CTA (and of the kernels before it on the stream) are visible to the peers. On a failure it marks
// the rank's mailboxes to its peers aborted, so they stop at their next look, and records the cause. Returns
// whether all met.
__device__ bool barrier(const PeerCall& call, uint64_t epoch, const uint32_t* abortFlag, uint64_t timeoutNs,
                        uint32_t* status) {
  __shared__ uint32_t failure;
  if (threadIdx.x == 0) failure = kLaneOk;
  __threadfence_system();
  __syncthreads();
  const int p = static_cast<int>(threadIdx.x);
  if (p < call.nranks && p != call.rank) {
    uint32_t why = meetPeer(call, p, epoch, abortFlag, timeoutNs);
    if (why != kLaneOk) atomicCAS(&failure, kLaneOk, why);
  }
  __syncthreads();
  if (failure == kLaneOk) return true;
  if (p < call.nranks && p != call.rank)
    *reinterpret_cast<volatile uint32_t*>(call.outbox[p] + call.words.aborted) = kAbortedByPeer;
  if (threadIdx.x == 0) atomicCAS(status, kLaneOk, failure);
  return false;
}

template <loomDataType_t kType, typename Op>
__global__ void oneShotKernel(PeerCall call, const uint32_t* abortFlag, uint64_t timeoutNs, uint32_t* status) {
  using Runner = PeerAllReduce<kType, Op>;
  if (failed(status)) return;
  Runner::oneShotPush(call, threadIdx.x, blockDim.x);
  if (!barrier(call, call.epoch, abortFlag, timeoutNs, status)) return;
  Runner::oneShotReduce(call, threadIdx.x, blockDim.x);
}

__global__ void barrierKernel(PeerCall call, uint64_t epoch, const uint32_t* abortFlag, uint64_t timeoutNs,
                              uint32_t* status) {
  if (failed(status)) return;
  barrier(call, epoch, abortFlag, timeoutNs, status);
}

// One two-shot data phase over the whole grid.
template <loomDataType_t kType, typename Op, int kPhase>
__global__ void twoShotKernel(PeerCall call, const uint32_t* status) {
  using Runner = PeerAllReduce<kType, Op>;
  if (failed(status)) return;
  if constexpr (kPhase == 0) Runner::twoShotScatter(call, firstIndex(), gridStride());
  if constexpr (kPhase == 1) Runner::twoShotReduce(call, firstIndex(), gridStride());
  if constexpr (kPhase == 2) Runner::twoShotGather(call, firstIndex(), gridStride());
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

// Calls body.template operator()<Op>() for the loomRedOp_t `op` (avg as sum); false for a value outside the enum.
template <typename Body>
bool forOp(loomRedOp_t op, Body&& body) {
  switch (op) {
    case loomSum:
    case loomAvg:
      body.template operator()<SumOp>();
      return true;
    case loomProd:
      body.template operator()<ProdOp>();
      return true;
    case loomMax:
      body.template operator()<MaxOp>();
      return true;
    case loomMin:
      body.template operator()<MinOp>();
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

}  // namespace

loomResult_t enqueueReduce(void* dst, const void* a, const void* b, size_t count, loomDataType_t type, loomRedOp_t op,
                           void* stream) {
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

loomResult_t enqueueLanes(const FlatPlanView& plan, const LaneCall& call, const FifoWords& words, PortableEnd* recvEnds,
                          PortableEnd* sendEnds, int nranks, loomDataType_t type, loomRedOp_t op,
                          const uint32_t* abortFlag, uint64_t timeoutNs, uint32_t* status, size_t llSlotBytes,
                          void* stream) {
  if (plan.laneCount == 0) return loomSuccess;
  const size_t stagingBytes = llSlotBytes / 8 * sizeof(uint32_t);
  auto cudaStream = static_cast<cudaStream_t>(stream);
  bool knownType = true;
  bool knownOp = forOp(op, [&]<typename Op>() {
    knownType = forType(type, [&]<loomDataType_t kType>() {
      lanesKernel<kType, Op><<<plan.laneCount, kLaneThreads, stagingBytes, cudaStream>>>(
          plan, call, words, recvEnds, sendEnds, nranks, abortFlag, timeoutNs, status);
    });
  });
  if (!knownOp) return LOOM_FAIL(loomInvalidArgument, CUDA, "lanes kernel: operation %d is not a loomRedOp_t", op);
  if (!knownType)
    return LOOM_FAIL(loomInvalidArgument, CUDA, "lanes kernel: data type %d is not a loomDataType_t", type);
  return launched("lanes");
}

namespace {

loomResult_t checkPeerCall(const PeerCall& call, const char* what) {
  if (call.nranks < 2 || call.nranks > kMaxPeerRanks || call.rank < 0 || call.rank >= call.nranks)
    return LOOM_FAIL(loomInvalidArgument, CUDA, "%s: rank %d of %d (2 to %d ranks)", what, call.rank, call.nranks,
                     kMaxPeerRanks);
  return loomSuccess;
}

}  // namespace

loomResult_t enqueueOneShot(const PeerCall& call, loomDataType_t type, loomRedOp_t op, const uint32_t* abortFlag,
                            uint64_t timeoutNs, uint32_t* status, void* stream) {
  LOOM_CHECK(checkPeerCall(call, "one-shot AllReduce"));
  if (call.count == 0) return loomSuccess;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  bool knownType = true;
  bool knownOp = forOp(op, [&]<typename Op>() {
    knownType = forType(type, [&]<loomDataType_t kType>() {
      oneShotKernel<kType, Op><<<1, kThreads, 0, cudaStream>>>(call, abortFlag, timeoutNs, status);
    });
  });
  if (!knownOp || !knownType)
    return LOOM_FAIL(loomInvalidArgument, CUDA, "one-shot AllReduce: data type %d or operation %d out of range", type,
                     op);
  return launched("one-shot AllReduce");
}

loomResult_t enqueueTwoShot(const PeerCall& call, loomDataType_t type, loomRedOp_t op, const uint32_t* abortFlag,
                            uint64_t timeoutNs, uint32_t* status, void* stream) {
  LOOM_CHECK(checkPeerCall(call, "two-shot AllReduce"));
  if (call.count == 0) return loomSuccess;
  auto cudaStream = static_cast<cudaStream_t>(stream);
  size_t elementBytes = 0;
  bool knownType =
      forType(type, [&]<loomDataType_t kType>() { elementBytes = sizeof(typename FormatOf<kType>::Storage); });
  if (!knownType) return LOOM_FAIL(loomInvalidArgument, CUDA, "two-shot AllReduce: data type %d out of range", type);
  // Each data phase moves a chunk per peer; the grid covers one chunk's elements.
  const unsigned blocks = blocksFor(peerChunkBytes(call.count, elementBytes, call.nranks) / elementBytes);
  bool knownOp = forOp(op, [&]<typename Op>() {
    forType(type, [&]<loomDataType_t kType>() {
      twoShotKernel<kType, Op, 0><<<blocks, kThreads, 0, cudaStream>>>(call, status);
      barrierKernel<<<1, 32, 0, cudaStream>>>(call, call.epoch, abortFlag, timeoutNs, status);
      twoShotKernel<kType, Op, 1><<<blocks, kThreads, 0, cudaStream>>>(call, status);
      barrierKernel<<<1, 32, 0, cudaStream>>>(call, call.epoch + 1, abortFlag, timeoutNs, status);
      twoShotKernel<kType, Op, 2><<<blocks, kThreads, 0, cudaStream>>>(call, status);
    });
  });
  if (!knownOp) return LOOM_FAIL(loomInvalidArgument, CUDA, "two-shot AllReduce: operation %d out of range", op);
  return launched("two-shot AllReduce");
}

}  // namespace loom::device
