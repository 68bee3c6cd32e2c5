// The GPU executor (device_executor.h): device memory and launch glue around the kernels of kernels.cu.
#include "src/exec/cuda/device_executor.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include <atomic>

#include "src/base/check.h"
#include "src/base/cuda_util.h"
#include "src/base/dtype.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/wait.h"
#include "src/exec/cuda/kernels.h"

namespace loom {
namespace {

// Bytes of the device copy of a flat plan: its three arrays, each aligned to 16 bytes.
size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

loomResult_t DeviceExecutor::start() {
  DeviceScope scope(config_.device);
  const size_t ends = static_cast<size_t>(config_.maxChannels) * config_.nranks * sizeof(PortableEnd);
  LOOM_CUDA_CHECK(cudaMalloc(&recvEnds_, ends), "GPU executor: cudaMalloc of connection ends");
  LOOM_CUDA_CHECK(cudaMalloc(&sendEnds_, ends), "GPU executor: cudaMalloc of connection ends");
  void* status = nullptr;
  LOOM_CUDA_CHECK(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable),
                  "GPU executor: cudaHostAlloc of the status word");
  status_ = static_cast<uint32_t*>(status);
  *status_ = kLaneOk;
  void* deviceStatus = nullptr;
  LOOM_CUDA_CHECK(cudaHostGetDevicePointer(&deviceStatus, status, 0), "GPU executor: cudaHostGetDevicePointer");
  deviceStatus_ = static_cast<uint32_t*>(deviceStatus);
  cudaStream_t setup = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&setup, cudaStreamNonBlocking), "GPU executor: cudaStreamCreate");
  setup_ = setup;
  cudaEvent_t last = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&last, cudaEventDisableTiming), "GPU executor: cudaEventCreate");
  last_ = last;
  // On a stream of its own: a plain cudaMemset would wait for the application's streams.
  LOOM_CUDA_CHECK(cudaMemsetAsync(recvEnds_, 0, ends, setup), "GPU executor: cudaMemsetAsync");
  LOOM_CUDA_CHECK(cudaMemsetAsync(sendEnds_, 0, ends, setup), "GPU executor: cudaMemsetAsync");
  LOOM_CUDA_CHECK(cudaStreamSynchronize(setup), "GPU executor: cudaStreamSynchronize");
  oneShotBytes_ = static_cast<size_t>(std::max<int64_t>(params::cudaOneShotBytes(), 0));
  twoShotBytes_ = static_cast<size_t>(std::max<int64_t>(params::cudaTwoShotBytes(), 0));
  if (config_.nranks < 2 || config_.nranks > kMaxPeerRanks) oneShotBytes_ = twoShotBytes_ = 0;
  // A slot holds a one-shot input, or a two-shot chunk in each half, 256-byte aligned.
  size_t slot = std::max(oneShotBytes_, 2 * peerChunkBytes(twoShotBytes_, 1, std::max(config_.nranks, 1)));
  mailboxShape_ = FifoShape{2, std::max<size_t>((slot + 255) / 256 * 256, 256), 64};
  return loomSuccess;
}

uint64_t DeviceExecutor::timeoutNs() const {
  return static_cast<uint64_t>(std::max<int64_t>(config_.timeoutMs, 1)) * 1000000;
}

bool DeviceExecutor::drained() {
  if (!launched_) return true;
  DeviceScope scope(config_.device);
  Deadline deadline(config_.timeoutMs);
  Backoff backoff;
  for (;;) {
    cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(last_));
    if (state != cudaErrorNotReady) {
      cudaGetLastError();
      return state == cudaSuccess;
    }
    if (deadline.expired()) return false;
    backoff.pause();
  }
}

DeviceExecutor::~DeviceExecutor() {
  // Freeing memory a kernel still uses would corrupt what the kernel writes next: the caller abandons it.
  if (abandoned_) return;
  DeviceScope scope(config_.device);
  cudaFree(scratch_);
  cudaFree(recvEnds_);
  cudaFree(sendEnds_);
  if (status_ != nullptr) cudaFreeHost(status_);
  if (setup_ != nullptr) cudaStreamDestroy(asStream(setup_));
  if (last_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(last_));
  cudaGetLastError();
}

bool DeviceExecutor::failed() const {
  return std::atomic_ref<uint32_t>(*status_).load(std::memory_order_acquire) != kLaneOk;
}

loomResult_t DeviceExecutor::error() {
  const uint32_t failure = std::atomic_ref<uint32_t>(*status_).load(std::memory_order_acquire);
  if (failure == kLaneOk) return loomSuccess;
  if (reported_ != loomSuccess) return reported_;
  const int rank = config_.rank;
  switch (failure) {
    case kLanePeerAborted:
      reported_ = LOOM_FAIL(loomRemoteError, CUDA, "rank %d: a kernel stopped: a peer gave up on the call", rank);
      break;
    case kLaneBadMessage:
      reported_ =
          LOOM_FAIL(loomInternalError, CUDA,
                    "rank %d: a kernel stopped at a message of the wrong size (ranks disagree on a call)", rank);
      break;
    case kLaneAborted:
      reported_ = LOOM_FAIL(loomRemoteError, CUDA, "rank %d: a kernel stopped: the communicator was aborted", rank);
      break;
    default:
      reported_ = LOOM_FAIL(loomTimeout, CUDA,
                            "rank %d: a kernel saw no progress within %lld ms (LOOM_TIMEOUT_MS or config "
                            "timeoutMs): a peer is gone or stuck",
                            rank, (long long)config_.timeoutMs);
      break;
  }
  return reported_;
}

loomResult_t DeviceExecutor::upload(const RankPlan& rankPlan, DevicePlanCopy* plan) {
  DeviceScope scope(config_.device);
  plan->flat = flatten(rankPlan);
  const FlatPlan& flat = plan->flat;
  const size_t lanes = align16(flat.lanes.size() * sizeof(FlatLane));
  const size_t steps = align16(flat.steps.size() * sizeof(Step));
  const size_t phases = align16(flat.phaseStarts.size() * sizeof(flat.phaseStarts[0]));
  const cudaStream_t setup = asStream(setup_);
  // From the stream-ordered pool, as scratch is: release frees plans with cudaFreeAsync.
  LOOM_CUDA_CHECK(cudaMallocAsync(&plan->arrays, std::max<size_t>(lanes + steps + phases, 16), setup),
                  "GPU executor: cudaMallocAsync of a plan");
  auto* base = static_cast<unsigned char*>(plan->arrays);
  cudaError_t error =
      cudaMemcpyAsync(base, flat.lanes.data(), flat.lanes.size() * sizeof(FlatLane), cudaMemcpyHostToDevice, setup);
  if (error == cudaSuccess)
    error = cudaMemcpyAsync(base + lanes, flat.steps.data(), flat.steps.size() * sizeof(Step), cudaMemcpyHostToDevice,
                            setup);
  if (error == cudaSuccess)
    error = cudaMemcpyAsync(base + lanes + steps, flat.phaseStarts.data(),
                            flat.phaseStarts.size() * sizeof(flat.phaseStarts[0]), cudaMemcpyHostToDevice, setup);
  if (error == cudaSuccess) error = cudaStreamSynchronize(setup);
  if (error != cudaSuccess) return cudaFailed(error, "GPU executor: copying a plan to the device");
  plan->view = flat.view();
  plan->view.lanes = reinterpret_cast<const FlatLane*>(base);
  plan->view.steps = reinterpret_cast<const Step*>(base + lanes);
  plan->view.phaseStarts = reinterpret_cast<const uint32_t*>(base + lanes + steps);
  return loomSuccess;
}

loomResult_t DeviceExecutor::release(DevicePlanCopy& plan, void* stream) {
  if (plan.arrays == nullptr) return loomSuccess;
  DeviceScope scope(config_.device);
  void* arrays = plan.arrays;
  plan.arrays = nullptr;
  if (stream == nullptr) {
    cudaFree(arrays);
    return loomSuccess;
  }
  LOOM_CUDA_CHECK(cudaFreeAsync(arrays, asStream(stream)), "GPU executor: cudaFreeAsync of a plan");
  return loomSuccess;
}

loomResult_t DeviceExecutor::setEnd(bool sender, int peer, int channel, bool mailbox, Endpoint& endpoint) {
  auto* fifo = reinterpret_cast<unsigned char*>(endpoint.fifo().header);
  if (mailbox) {
    if (peer < 0 || peer >= kMaxPeerRanks)
      return LOOM_FAIL(loomInternalError, CUDA, "GPU executor: a mailbox for rank %d (at most %d ranks)", peer,
                       kMaxPeerRanks);
    (sender ? outbox_ : inbox_)[peer] = fifo;
    return loomSuccess;
  }
  if (channel < 0 || channel >= config_.maxChannels)
    return LOOM_FAIL(loomInternalError, CUDA, "GPU executor: a connection on channel %d (at most %d)", channel,
                     config_.maxChannels);
  const FifoShape& shape = config_.fifoShape;
  PortableEnd end;
  end.fifo = fifo;
  end.depth = static_cast<uint32_t>(shape.depth);
  end.slotBytes = shape.slotBytes;
  end.llSlotBytes = shape.llSlotBytes;
  // A new connection's entry: no kernel reads it yet, so the copy need not wait for the calls in flight.
  PortableEnd* entry = (sender ? sendEnds_ : recvEnds_) + static_cast<size_t>(channel) * config_.nranks + peer;
  DeviceScope scope(config_.device);
  const cudaStream_t setup = asStream(setup_);
  cudaError_t error = cudaMemcpyAsync(entry, &end, sizeof(end), cudaMemcpyHostToDevice, setup);
  if (error == cudaSuccess) error = cudaStreamSynchronize(setup);
  if (error != cudaSuccess) return cudaFailed(error, "GPU executor: copying a connection end to the device");
  return loomSuccess;
}

// In stream order (after the calls before, which may still use the old memory), and without cudaFree, which
// waits for the whole device: kernels of peers in this process may be waiting for this very call.
loomResult_t DeviceExecutor::reserveScratch(size_t bytes, void* stream) {
  if (bytes <= scratchBytes_) return loomSuccess;
  if (scratch_ != nullptr)
    LOOM_CUDA_CHECK(cudaFreeAsync(scratch_, asStream(stream)), "GPU executor: cudaFreeAsync of scratch");
  scratch_ = nullptr;
  scratchBytes_ = 0;
  LOOM_CUDA_CHECK(cudaMallocAsync(&scratch_, bytes, asStream(stream)),
                  "GPU executor: cudaMallocAsync of scratch memory");
  scratchBytes_ = bytes;
  return loomSuccess;
}

loomResult_t DeviceExecutor::waitForLast(void* stream) {
  if (launched_)
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(asStream(stream), static_cast<cudaEvent_t>(last_), 0),
                    "GPU executor: cudaStreamWaitEvent");
  return loomSuccess;
}

loomResult_t DeviceExecutor::finish(const DeviceCall& call, Region reduced) {
  if (call.op == loomAvg && reduced.count > 0 && call.output != nullptr)
    LOOM_CHECK(
        device::enqueueDivide(static_cast<unsigned char*>(call.output) + reduced.offset * dtypeSize(call.datatype),
                              reduced.count, call.datatype, config_.nranks, call.stream));
  LOOM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(last_), asStream(call.stream)),
                  "GPU executor: cudaEventRecord");
  launched_ = true;
  return loomSuccess;
}

loomResult_t DeviceExecutor::enqueuePlan(const DeviceCall& call, const DevicePlanCopy& plan,
                                         const DeviceSlicing& slicing, size_t scratchBytes, Region reduced) {
  DeviceScope scope(config_.device);
  LOOM_CHECK(waitForLast(call.stream));
  LOOM_CHECK(reserveScratch(scratchBytes, call.stream));
  const FifoShape& shape = config_.fifoShape;
  const size_t elementBytes = dtypeSize(call.datatype);
  LaneCall lanes{};
  lanes.input = static_cast<unsigned char*>(const_cast<void*>(call.input));
  lanes.output = static_cast<unsigned char*>(call.output);
  lanes.scratch = static_cast<unsigned char*>(scratch_);
  lanes.simpleSliceElems = std::max<size_t>(
      1, std::min(slicing.simpleSliceBytes, fifoPayloadBytes(shape, Protocol::kSimple)) / elementBytes);
  lanes.llSliceElems = std::max<size_t>(1, fifoPayloadBytes(shape, Protocol::kLL) / elementBytes);
  lanes.llThresholdBytes = slicing.llThresholdBytes;
  lanes.forcedProtocol = config_.forcedProtocol;
  LOOM_CHECK(device::enqueueLanes(plan.view, lanes, fifoWords(), recvEnds_, sendEnds_, config_.nranks, call.datatype,
                                  call.op, config_.abortFlag, timeoutNs(), deviceStatus_, shape.llSlotBytes,
                                  call.stream));
  return finish(call, reduced);
}

loomResult_t DeviceExecutor::enqueueMailboxes(const DeviceCall& call) {
  DeviceScope scope(config_.device);
  LOOM_CHECK(waitForLast(call.stream));
  const bool twoShot = call.count * dtypeSize(call.datatype) > oneShotBytes_;
  PeerCall peers;
  peers.rank = config_.rank;
  peers.nranks = config_.nranks;
  peers.input = static_cast<const unsigned char*>(call.input);
  peers.output = static_cast<unsigned char*>(call.output);
  peers.count = call.count;
  for (int p = 0; p < config_.nranks; ++p) {
    if (p == config_.rank) continue;
    if (inbox_[p] == nullptr || outbox_[p] == nullptr)
      return LOOM_FAIL(loomInternalError, CUDA, "rank %d: GPU executor: no mailbox with rank %d", config_.rank, p);
    peers.inbox[p] = inbox_[p];
    peers.outbox[p] = outbox_[p];
  }
  peers.slotBytes = mailboxShape_.slotBytes;
  peers.words = fifoWords();
  peers.parity = static_cast<uint32_t>(peerCalls_ % 2);
  peers.epoch = epoch_;
  // Counted as enqueued, whether or not the launch fails: a failed launch fails the communicator.
  ++peerCalls_;
  epoch_ += twoShot ? 2 : 1;
  LOOM_CHECK(twoShot ? device::enqueueTwoShot(peers, call.datatype, call.op, config_.abortFlag, timeoutNs(),
                                              deviceStatus_, call.stream)
                     : device::enqueueOneShot(peers, call.datatype, call.op, config_.abortFlag, timeoutNs(),
                                              deviceStatus_, call.stream));
  // One-shot and two-shot leave the whole output reduced.
  return finish(call, Region{Buffer::kOutput, 0, call.count});
}

}  // namespace loom

#endif  // LOOM_HAVE_CUDA
