// The GPU executor of CUDA communicators (cuda_device.h).
//
// What it keeps per communicator, all made on first use and kept until the communicator is destroyed:
//  - connections through cuda_ipc, by (peer, channel), and for the kernels two device arrays of PortableEnd
//    (channel * nranks + peer), whose counters the kernels carry from call to call;
//  - the mailboxes of one-shot and two-shot AllReduce: one per peer each way, on a channel of their own;
//  - flat plans copied into device memory, by call shape, from a planner (planner.h) with a copy of the
//    communicator's tuner made at init (so a call never waits for the staged path's worker, which holds the
//    communicator's run lock);
//  - scratch memory for the plans that need it;
//  - a status word in mapped host memory where a kernel records why it stopped (a LaneFailure): sticky, so every
//    later kernel returns at once and the error reaches loomCommGetAsyncError.
// Kernels of one communicator run one after another whatever streams they are enqueued on: each call's stream
// first waits for the event recorded after the call before, since they share FIFOs, mailboxes and scratch.
#include "src/core/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "algorithms/flat_plan.h"
#include "src/base/check.h"
#include "src/base/cuda_util.h"
#include "src/base/dtype.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/wait.h"
#include "src/core/comm.h"
#include "src/exec/cuda/kernels.h"
#include "transports/transport.h"

namespace loom {
namespace {

constexpr int kMailboxChannel = 4096;  // apart from the collectives' channels and Send/Recv's (kP2PChannel on)
constexpr size_t kMaxDevicePlans = 256;

// What the GPU executor keeps beside each cached plan.
struct DevicePlanState {
  Slicing slicing;
  FlatPlan flat;
  void* arrays = nullptr;  // flat's three arrays, in device memory (null: not uploaded yet)
  FlatPlanView view{};
  bool connected = false;
};
using DevicePlanner = Planner<DevicePlanState>;
using DevicePlan = DevicePlanner::Entry;

// Bytes of the device copy of a flat plan: its three arrays, each aligned to 16 bytes.
size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

}  // namespace

class DevicePath final : private ConnectionTable::Owner {
 public:
  DevicePath(loomComm* comm, int device, const uint32_t* abortFlag)
      : comm_(comm), device_(device), abortFlag_(abortFlag), planner_(comm->planner.tuner()) {}
  ~DevicePath();
  loomResult_t start();
  bool takes(const Call& call) const;
  loomResult_t enqueue(const Call& call);
  loomResult_t error();

 private:
  loomResult_t planOf(const Call& call, cudaStream_t stream, DevicePlan** out);
  loomResult_t upload(DevicePlan* plan);
  loomResult_t connect(const DevicePlan& plan);
  loomResult_t connectMailboxes();
  // ConnectionTable::Owner: every connection goes through cuda_ipc; each new one's end is copied to the kernels'
  // arrays (the mailboxes' are read by launchPeer instead).
  loomResult_t route(int peer, ConnectionTable::Route* out) override;
  const FifoShape& shapeOf(int channel) override { return channel == kMailboxChannel ? mailboxShape_ : comm_->settings.fifoShape; }
  loomResult_t made(bool sender, int peer, int channel, Endpoint& endpoint) override;
  loomResult_t attachFailed(int peer, int channel, const ConnectionTable::Route& route, loomResult_t result) override;
  // A sender waits for its peer's receiver within the deadline, watching the abort flag (not the peer watch,
  // which belongs to the staged path's worker and its run lock).
  WaitCheck connectCheck(const Deadline& deadline) const;
  loomResult_t setEnd(PortableEnd* array, int peer, int channel, const Endpoint& endpoint);
  loomResult_t reserveScratch(size_t bytes, cudaStream_t stream);
  loomResult_t launchPlan(const Call& call, DevicePlan& plan, cudaStream_t stream);
  loomResult_t launchPeer(const Call& call, bool twoShot, cudaStream_t stream);
  // The call's kernels (the stream already waits for the call before), then avg's divide.
  loomResult_t launch(const Call& call, cudaStream_t stream);
  // Waits, within the deadline, until the stream has passed the last call: before the memory kernels use is
  // freed at destruction. False when it has not.
  bool drained();
  uint64_t timeoutNs() const { return static_cast<uint64_t>(std::max<int64_t>(comm_->settings.timeoutMs, 1)) * 1000000; }

  loomComm* comm_;
  const int device_;
  const uint32_t* abortFlag_;
  std::mutex mutex_;  // everything below
  DevicePlanner planner_;
  ConnectionTable connections_;
  PortableEnd* recvEnds_ = nullptr;  // device memory, channel * nranks + peer
  PortableEnd* sendEnds_ = nullptr;
  bool mailboxes_ = false;
  FifoShape mailboxShape_{};
  size_t oneShotBytes_ = 0, twoShotBytes_ = 0;
  uint64_t epoch_ = 1;      // the next barrier's flag
  uint64_t peerCalls_ = 0;  // one-shot and two-shot calls so far: their slot parity
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  uint32_t* status_ = nullptr;        // mapped host memory: a LaneFailure
  uint32_t* deviceStatus_ = nullptr;  // the device's view
  cudaStream_t setup_ = nullptr;      // copies of plans and ends
  cudaEvent_t last_ = nullptr;        // recorded after each call
  bool launched_ = false;
  loomResult_t reported_ = loomSuccess;
};

loomResult_t DevicePath::start() {
  DeviceScope scope(device_);
  connections_.bind(this, comm_->commHash, comm_->rank);
  const size_t ends = static_cast<size_t>(kMaxChannels) * comm_->nranks * sizeof(PortableEnd);
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
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&setup_, cudaStreamNonBlocking), "GPU executor: cudaStreamCreate");
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming), "GPU executor: cudaEventCreate");
  // On a stream of its own: a plain cudaMemset would wait for the application's streams.
  LOOM_CUDA_CHECK(cudaMemsetAsync(recvEnds_, 0, ends, setup_), "GPU executor: cudaMemsetAsync");
  LOOM_CUDA_CHECK(cudaMemsetAsync(sendEnds_, 0, ends, setup_), "GPU executor: cudaMemsetAsync");
  LOOM_CUDA_CHECK(cudaStreamSynchronize(setup_), "GPU executor: cudaStreamSynchronize");
  oneShotBytes_ = static_cast<size_t>(std::max<int64_t>(params::cudaOneShotBytes(), 0));
  twoShotBytes_ = static_cast<size_t>(std::max<int64_t>(params::cudaTwoShotBytes(), 0));
  if (comm_->nranks < 2 || comm_->nranks > kMaxPeerRanks) oneShotBytes_ = twoShotBytes_ = 0;
  // A slot holds a one-shot input, or a two-shot chunk in each half, 256-byte aligned.
  size_t slot = std::max(oneShotBytes_, 2 * peerChunkBytes(twoShotBytes_, 1, std::max(comm_->nranks, 1)));
  mailboxShape_ = FifoShape{2, std::max<size_t>((slot + 255) / 256 * 256, 256), 64};
  return loomSuccess;
}

bool DevicePath::drained() {
  if (!launched_) return true;
  DeviceScope scope(device_);
  Deadline deadline(comm_->settings.timeoutMs);
  Backoff backoff;
  for (;;) {
    cudaError_t state = cudaEventQuery(last_);
    if (state != cudaErrorNotReady) {
      cudaGetLastError();
      return state == cudaSuccess;
    }
    if (deadline.expired()) return false;
    backoff.pause();
  }
}

DevicePath::~DevicePath() {
  // Freeing memory a kernel still uses would corrupt what the kernel writes next; past the deadline it is left.
  if (!drained()) {
    LOOM_WARN(CUDA,
              "rank %d: a CUDA stream had not passed this communicator's last kernel within %lld ms of its "
              "destruction: its device memory is left allocated",
              comm_->rank, (long long)comm_->settings.timeoutMs);
    connections_.abandon();
    return;
  }
  DeviceScope scope(device_);
  connections_.clear();
  planner_.forEach([](DevicePlan& plan) { cudaFree(plan.extra.arrays); });
  cudaFree(scratch_);
  cudaFree(recvEnds_);
  cudaFree(sendEnds_);
  if (status_ != nullptr) cudaFreeHost(status_);
  if (setup_ != nullptr) cudaStreamDestroy(setup_);
  if (last_ != nullptr) cudaEventDestroy(last_);
  cudaGetLastError();
}

bool DevicePath::takes(const Call& call) const {
  switch (call.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return true;
    default:
      return false;  // the lane runner reads and writes buffer 0 only; AllToAll plans are not held to it yet
  }
}

loomResult_t DevicePath::error() {
  const uint32_t failure = std::atomic_ref<uint32_t>(*status_).load(std::memory_order_acquire);
  if (failure == kLaneOk) return loomSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  if (reported_ != loomSuccess) return reported_;
  switch (failure) {
    case kLanePeerAborted:
      reported_ =
          LOOM_FAIL(loomRemoteError, CUDA, "rank %d: a kernel stopped: a peer gave up on the call", comm_->rank);
      break;
    case kLaneBadMessage:
      reported_ =
          LOOM_FAIL(loomInternalError, CUDA,
                    "rank %d: a kernel stopped at a message of the wrong size (ranks disagree on a call)", comm_->rank);
      break;
    case kLaneAborted:
      reported_ =
          LOOM_FAIL(loomRemoteError, CUDA, "rank %d: a kernel stopped: the communicator was aborted", comm_->rank);
      break;
    default:
      reported_ = LOOM_FAIL(loomTimeout, CUDA,
                            "rank %d: a kernel saw no progress within %lld ms (LOOM_TIMEOUT_MS or config "
                            "timeoutMs): a peer is gone or stuck",
                            comm_->rank, (long long)comm_->settings.timeoutMs);
      break;
  }
  comm_->setLastError(threadLastError());
  return reported_;
}

loomResult_t DevicePath::upload(DevicePlan* entry) {
  DevicePlanState* plan = &entry->extra;
  plan->flat = flatten(entry->plan);
  const FlatPlan& flat = plan->flat;
  const size_t lanes = align16(flat.lanes.size() * sizeof(FlatLane));
  const size_t steps = align16(flat.steps.size() * sizeof(Step));
  const size_t phases = align16(flat.phaseStarts.size() * sizeof(flat.phaseStarts[0]));
  // From the stream-ordered pool, as scratch is: planOf frees plans with cudaFreeAsync.
  LOOM_CUDA_CHECK(cudaMallocAsync(&plan->arrays, std::max<size_t>(lanes + steps + phases, 16), setup_),
                  "GPU executor: cudaMallocAsync of a plan");
  auto* base = static_cast<unsigned char*>(plan->arrays);
  cudaError_t error =
      cudaMemcpyAsync(base, flat.lanes.data(), flat.lanes.size() * sizeof(FlatLane), cudaMemcpyHostToDevice, setup_);
  if (error == cudaSuccess)
    error = cudaMemcpyAsync(base + lanes, flat.steps.data(), flat.steps.size() * sizeof(Step), cudaMemcpyHostToDevice,
                            setup_);
  if (error == cudaSuccess)
    error = cudaMemcpyAsync(base + lanes + steps, flat.phaseStarts.data(),
                            flat.phaseStarts.size() * sizeof(flat.phaseStarts[0]), cudaMemcpyHostToDevice, setup_);
  if (error == cudaSuccess) error = cudaStreamSynchronize(setup_);
  if (error != cudaSuccess) return cudaFailed(error, "GPU executor: copying a plan to the device");
  plan->view = flat.view();
  plan->view.lanes = reinterpret_cast<const FlatLane*>(base);
  plan->view.steps = reinterpret_cast<const Step*>(base + lanes);
  plan->view.phaseStarts = reinterpret_cast<const uint32_t*>(base + lanes + steps);
  return loomSuccess;
}

loomResult_t DevicePath::planOf(const Call& call, cudaStream_t stream, DevicePlan** out) {
  if (planner_.size() >= kMaxDevicePlans) {
    // Kernels still queued may use any cached plan: each is freed in stream order, after the calls before.
    LOOM_CHECK(planner_.clear([&](DevicePlan& plan) {
      if (plan.extra.arrays == nullptr) return loomSuccess;
      LOOM_CUDA_CHECK(cudaFreeAsync(plan.extra.arrays, stream), "GPU executor: cudaFreeAsync of a plan");
      return loomSuccess;
    }));
  }
  PlannedCall planned;
  DevicePlan* plan = nullptr;
  LOOM_CHECK(planner_.plan(call, nullptr, &planned, &plan));
  if (plan->extra.arrays == nullptr) {
    for (const Lane& lane : plan->plan.lanes)
      if (lane.channel < 0 || lane.channel >= kMaxChannels)
        return LOOM_FAIL(loomInternalError, CUDA, "%s: plan %s uses channel %d (at most %d)",
                         collectiveName(call.collective), planned.choice->algorithm.c_str(), lane.channel,
                         kMaxChannels);
    plan->extra.slicing = planned.choice->slicing;
    LOOM_CHECK(upload(plan));
  }
  *out = plan;
  return loomSuccess;
}

loomResult_t DevicePath::setEnd(PortableEnd* array, int peer, int channel, const Endpoint& endpoint) {
  const FifoShape& shape = comm_->settings.fifoShape;
  PortableEnd end;
  end.fifo = reinterpret_cast<unsigned char*>(const_cast<Endpoint&>(endpoint).fifo().header);
  end.depth = static_cast<uint32_t>(shape.depth);
  end.slotBytes = shape.slotBytes;
  end.llSlotBytes = shape.llSlotBytes;
  // A new connection's entry: no kernel reads it yet, so the copy need not wait for the calls in flight.
  PortableEnd* entry = array + static_cast<size_t>(channel) * comm_->nranks + peer;
  cudaError_t error = cudaMemcpyAsync(entry, &end, sizeof(end), cudaMemcpyHostToDevice, setup_);
  if (error == cudaSuccess) error = cudaStreamSynchronize(setup_);
  if (error != cudaSuccess) return cudaFailed(error, "GPU executor: copying a connection end to the device");
  return loomSuccess;
}

loomResult_t DevicePath::route(int peer, ConnectionTable::Route* out) {
  (void)peer;
  *out = {deviceTransport(), nullptr};
  return loomSuccess;
}

loomResult_t DevicePath::made(bool sender, int peer, int channel, Endpoint& endpoint) {
  return channel == kMailboxChannel ? loomSuccess : setEnd(sender ? sendEnds_ : recvEnds_, peer, channel, endpoint);
}

WaitCheck DevicePath::connectCheck(const Deadline& deadline) const {
  return [this, &deadline]() {
    if (comm_->abortFlag.load(std::memory_order_relaxed))
      return LOOM_FAIL(loomRemoteError, CUDA, "rank %d: communicator aborted while connecting", comm_->rank);
    if (deadline.expired()) return loomTimeout;  // attachFailed says who
    return loomSuccess;
  };
}

loomResult_t DevicePath::attachFailed(int peer, int channel, const ConnectionTable::Route& route, loomResult_t result) {
  (void)route;
  if (result == loomTimeout)
    return LOOM_FAIL(loomTimeout, CUDA,
                     "rank %d: rank %d made no GPU executor connection (channel %d) within %lld ms "
                     "(LOOM_TIMEOUT_MS or config timeoutMs): is it running the same call, with "
                     "LOOM_CUDA_PATH=device?",
                     comm_->rank, peer, channel, (long long)comm_->settings.timeoutMs);
  const std::string why = threadLastError();
  return LOOM_FAIL(result, CUDA, "rank %d, connecting to rank %d (channel %d): %s", comm_->rank, peer, channel,
                   why.c_str());
}

// Receivers first, then senders (ConnectionTable): no rank waits for a receiver only it could make. The deadline
// bounds the plan's connection setup as a whole.
loomResult_t DevicePath::connect(const DevicePlan& plan) {
  LOOM_CHECK(connections_.createReceivers(plan.plan));
  const Deadline deadline(comm_->settings.timeoutMs);
  return connections_.attachSenders(plan.plan, connectCheck(deadline));
}

loomResult_t DevicePath::connectMailboxes() {
  if (mailboxes_) return loomSuccess;
  for (int peer = 0; peer < comm_->nranks; ++peer)
    if (peer != comm_->rank) LOOM_CHECK(connections_.createReceiver(peer, kMailboxChannel));
  const Deadline deadline(comm_->settings.timeoutMs);
  for (int peer = 0; peer < comm_->nranks; ++peer)
    if (peer != comm_->rank) LOOM_CHECK(connections_.attachSender(peer, kMailboxChannel, connectCheck(deadline)));
  mailboxes_ = true;
  return loomSuccess;
}

// In stream order (after the calls before, which may still use the old memory), and without cudaFree, which
// waits for the whole device: kernels of peers in this process may be waiting for this very call.
loomResult_t DevicePath::reserveScratch(size_t bytes, cudaStream_t stream) {
  if (bytes <= scratchBytes_) return loomSuccess;
  if (scratch_ != nullptr) LOOM_CUDA_CHECK(cudaFreeAsync(scratch_, stream), "GPU executor: cudaFreeAsync of scratch");
  scratch_ = nullptr;
  scratchBytes_ = 0;
  LOOM_CUDA_CHECK(cudaMallocAsync(&scratch_, bytes, stream), "GPU executor: cudaMallocAsync of scratch memory");
  scratchBytes_ = bytes;
  return loomSuccess;
}

loomResult_t DevicePath::launchPlan(const Call& call, DevicePlan& entry, cudaStream_t stream) {
  DevicePlanState& plan = entry.extra;
  if (!plan.connected) {
    LOOM_CHECK(connect(entry));
    plan.connected = true;
  }
  const size_t elementBytes = dtypeSize(call.datatype);
  LOOM_CHECK(reserveScratch(entry.plan.scratchCount * elementBytes, stream));
  const FifoShape& shape = comm_->settings.fifoShape;
  LaneCall lanes{};
  lanes.input = static_cast<unsigned char*>(const_cast<void*>(call.inputs[0]));
  lanes.output = static_cast<unsigned char*>(call.outputs[0]);
  lanes.scratch = static_cast<unsigned char*>(scratch_);
  lanes.simpleSliceElems = std::max<size_t>(
      1, std::min(plan.slicing.simpleSliceBytes, fifoPayloadBytes(shape, Protocol::kSimple)) / elementBytes);
  lanes.llSliceElems = std::max<size_t>(1, fifoPayloadBytes(shape, Protocol::kLL) / elementBytes);
  lanes.llThresholdBytes = plan.slicing.llThresholdBytes;
  lanes.forcedProtocol = comm_->settings.forcedProtocol;
  return device::enqueueLanes(plan.view, lanes, fifoWords(), recvEnds_, sendEnds_, comm_->nranks, call.datatype,
                              call.op, abortFlag_, timeoutNs(), deviceStatus_, shape.llSlotBytes, stream);
}

loomResult_t DevicePath::launchPeer(const Call& call, bool twoShot, cudaStream_t stream) {
  LOOM_CHECK(connectMailboxes());
  PeerCall peers;
  peers.rank = comm_->rank;
  peers.nranks = comm_->nranks;
  peers.input = static_cast<const unsigned char*>(call.inputs[0]);
  peers.output = static_cast<unsigned char*>(call.outputs[0]);
  peers.count = call.count;
  for (int p = 0; p < comm_->nranks; ++p) {
    if (p == comm_->rank) continue;
    peers.inbox[p] = reinterpret_cast<unsigned char*>(connections_.receiverOf(p, kMailboxChannel)->fifo().header);
    peers.outbox[p] = reinterpret_cast<unsigned char*>(connections_.senderOf(p, kMailboxChannel)->fifo().header);
  }
  peers.slotBytes = mailboxShape_.slotBytes;
  peers.words = fifoWords();
  peers.parity = static_cast<uint32_t>(peerCalls_ % 2);
  peers.epoch = epoch_;
  // Counted as enqueued, whether or not the launch fails: a failed launch fails the communicator.
  ++peerCalls_;
  epoch_ += twoShot ? 2 : 1;
  return twoShot
             ? device::enqueueTwoShot(peers, call.datatype, call.op, abortFlag_, timeoutNs(), deviceStatus_, stream)
             : device::enqueueOneShot(peers, call.datatype, call.op, abortFlag_, timeoutNs(), deviceStatus_, stream);
}

loomResult_t DevicePath::enqueue(const Call& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (call.count == 0) return loomSuccess;
  DeviceScope scope(device_);
  auto stream = static_cast<cudaStream_t>(call.stream);
  if (launched_) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, 0), "GPU executor: cudaStreamWaitEvent");
  loomResult_t result = launch(call, stream);
  if (result != loomSuccess) {
    // Peers may be in this call's kernels already, and the barrier counts may have moved on: the communicator
    // is done for.
    int expected = loomSuccess;
    comm_->asyncError.compare_exchange_strong(expected, result);
  }
  return result;
}

loomResult_t DevicePath::launch(const Call& call, cudaStream_t stream) {
  const size_t bytes = call.count * dtypeSize(call.datatype);
  const bool peer = call.collective == Collective::kAllReduce && bytes <= std::max(oneShotBytes_, twoShotBytes_);
  DevicePlan* plan = nullptr;
  if (peer) {
    LOOM_CHECK(launchPeer(call, bytes > oneShotBytes_, stream));
  } else {
    LOOM_CHECK(planOf(call, stream, &plan));
    LOOM_CHECK(launchPlan(call, *plan, stream));
  }
  if (call.op == loomAvg) {
    // One-shot and two-shot leave the whole output reduced; a plan says where it leaves the reduced part.
    Region reduced = peer ? Region{Buffer::kOutput, 0, call.count} : plan->plan.reducedOutput;
    if (reduced.count > 0 && call.outputs[0] != nullptr)
      LOOM_CHECK(device::enqueueDivide(
          static_cast<unsigned char*>(call.outputs[0]) + reduced.offset * dtypeSize(call.datatype), reduced.count,
          call.datatype, comm_->nranks, stream));
  }
  LOOM_CUDA_CHECK(cudaEventRecord(last_, stream), "GPU executor: cudaEventRecord");
  launched_ = true;
  return loomSuccess;
}

void DevicePathDeleter::operator()(DevicePath* path) const { delete path; }

loomResult_t devicePathCreate(loomComm* comm, int device, const uint32_t* abortFlag, DevicePathPtr* out) {
  out->reset();
  const std::string choice = params::cudaPath();
  if (choice != "staged" && choice != "device")
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_CUDA_PATH=\"%s\" is neither staged nor device", choice.c_str());
  if (choice == "staged") return loomSuccess;
  if (!comm->everyRankCuda) {
    LOOM_INFO(CUDA, "rank %d: LOOM_CUDA_PATH=device, but some ranks have host communicators: calls go the staged path",
              comm->rank);
    return loomSuccess;
  }
  Transport* transport = deviceTransport();
  for (const PeerInfo& peer : comm->peers) {
    std::string why;
    if (!transport->canConnect(comm->peers[comm->rank], peer, &why)) {
      LOOM_INFO(CUDA, "rank %d: LOOM_CUDA_PATH=device, but %s: calls go the staged path", comm->rank, why.c_str());
      return loomSuccess;
    }
  }
  DevicePathPtr path(new DevicePath(comm, device, abortFlag));
  LOOM_CHECK(path->start());
  *out = std::move(path);
  LOOM_INFO(CUDA, "rank %d: GPU executor on device %d over cuda_ipc", comm->rank, device);
  return loomSuccess;
}

bool devicePathTakes(const DevicePath& path, const Call& call) { return path.takes(call); }
loomResult_t devicePathEnqueue(DevicePath& path, const Call& call) { return path.enqueue(call); }
loomResult_t devicePathError(DevicePath& path) { return path.error(); }

}  // namespace loom

#endif  // LOOM_HAVE_CUDA
