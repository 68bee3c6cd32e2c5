// The device path of CUDA communicators (cuda_device.h): the communicator's half of the GPU executor. It plans
// (a planner, planner.h, with a copy of the communicator's tuner made at init, so a call never waits for the
// staged path's worker, which holds the communicator's run lock), connects through cuda_ipc (a ConnectionTable,
// connections.h: plan channels, and the one-shot and two-shot mailboxes on a channel of their own), and hands
// each call to the executor (src/exec/cuda/device_executor.h), which owns the device memory and launches the
// kernels. Everything is made on first use and kept until the communicator is destroyed.
#include "src/core/cuda_device.h"

#if LOOM_HAVE_CUDA
#include <algorithm>
#include <mutex>
#include <utility>

#include "src/base/check.h"
#include "src/base/cuda_util.h"
#include "src/base/dtype.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/wait.h"
#include "src/core/comm.h"
#include "src/exec/cuda/device_executor.h"
#include "transports/transport.h"

namespace loom {
namespace {

constexpr int kMailboxChannel = 4096;  // apart from the collectives' channels and Send/Recv's (kP2PChannel on)
constexpr size_t kMaxDevicePlans = 256;

// What the device path keeps beside each cached plan.
struct DevicePlanState {
  DeviceSlicing slicing;
  DevicePlanCopy copy;
  bool connected = false;
};
using DevicePlanner = Planner<DevicePlanState>;
using DevicePlan = DevicePlanner::Entry;

// The GPU executor's FIFOs: the communicator's, with LOOM_CUDA_SLOT_BYTES slots (NCCL-sized steps in device
// memory) in place of the host's.
FifoShape deviceFifoShape(const loomComm* comm) {
  FifoShape shape = comm->settings.fifoShape;
  shape.slotBytes = static_cast<size_t>(params::cudaSlotBytes()) / 64 * 64;
  return shape;
}

// The device path's tuner: the communicator's context with the GPU executor's channels and slots
// (LOOM_CUDA_NCHANNELS, LOOM_CUDA_SLOT_BYTES; every rank checked alike at init), as loom-tune and loom-sim model
// a GPU topology (contextFor).
Tuner deviceTuner(const loomComm* comm) {
  const Tuner& host = comm->planner.tuner();
  TuneContext context = host.context();
  context.nChannels = static_cast<int>(params::cudaNChannels());
  context.simpleSliceBytes = fifoPayloadBytes(deviceFifoShape(comm), Protocol::kSimple);
  context.deviceExecutor = true;
  Tuner tuner;
  tuner.configure(context, host.costs());
  return tuner;
}

DeviceExecutorConfig executorConfig(const loomComm* comm, int device, const uint32_t* abortFlag) {
  DeviceExecutorConfig config;
  config.device = device;
  config.rank = comm->rank;
  config.nranks = comm->nranks;
  config.maxChannels = kMaxChannels * kChannelSets;  // a tree's second set of channels too (algorithms/plan.h)
  config.timeoutMs = comm->settings.timeoutMs;
  config.fifoShape = deviceFifoShape(comm);
  config.forcedProtocol = comm->settings.forcedProtocol;
  config.abortFlag = abortFlag;
  return config;
}

}  // namespace

class DevicePath final : private ConnectionTable::Owner {
 public:
  DevicePath(loomComm* comm, int device, const uint32_t* abortFlag)
      : comm_(comm), planner_(deviceTuner(comm)), executor_(executorConfig(comm, device, abortFlag)) {}
  ~DevicePath();
  loomResult_t start();
  bool takes(const Call& call) const;
  loomResult_t enqueue(const Call& call);
  loomResult_t error();

 private:
  loomResult_t planOf(const Call& call, void* stream, DevicePlan** out);
  loomResult_t connect(const DevicePlan& plan);
  loomResult_t connectMailboxes();
  // ConnectionTable::Owner: every connection goes through cuda_ipc; each new one's end goes to the executor.
  loomResult_t route(int peer, ConnectionTable::Route* out) override;
  const FifoShape& shapeOf(int channel) override {
    return channel == kMailboxChannel ? executor_.mailboxShape() : executor_.fifoShape();
  }
  loomResult_t made(bool sender, int peer, int channel, Endpoint& endpoint) override {
    return executor_.setEnd(sender, peer, channel, channel == kMailboxChannel, endpoint);
  }
  loomResult_t attachFailed(int peer, int channel, const ConnectionTable::Route& route, loomResult_t result) override;
  // A sender waits for its peer's receiver within the deadline, watching the abort flag (not the peer watch,
  // which belongs to the staged path's worker and its run lock).
  WaitCheck connectCheck(const Deadline& deadline) const;
  loomResult_t launch(const Call& call);

  loomComm* comm_;
  std::mutex mutex_;  // everything below
  DevicePlanner planner_;
  ConnectionTable connections_;
  DeviceExecutor executor_;
  bool mailboxes_ = false;
  bool errorNoted_ = false;
};

loomResult_t DevicePath::start() {
  DeviceScope scope(executor_.device());
  connections_.bind(this, comm_->commHash, comm_->rank);
  return executor_.start();
}

DevicePath::~DevicePath() {
  // Freeing memory a kernel still uses would corrupt what the kernel writes next; past the deadline it is left.
  if (!executor_.drained()) {
    LOOM_WARN(CUDA,
              "rank %d: a CUDA stream had not passed this communicator's last kernel within %lld ms of its "
              "destruction: its device memory is left allocated",
              comm_->rank, (long long)comm_->settings.timeoutMs);
    connections_.abandon();
    executor_.abandon();
    return;
  }
  DeviceScope scope(executor_.device());
  connections_.clear();
  planner_.forEach([this](DevicePlan& plan) { (void)executor_.release(plan.extra.copy, nullptr); });
}

bool DevicePath::takes(const Call& call) const {
  // The lane runner rounds fp16 and bf16 at every combination, where the host executor keeps the partial sums of
  // the rank-order plans in fp32 (RankPlan::wideScratch): under LOOM_DETERMINISTIC, their reductions go the
  // staged path, but for AllReduce by the mailboxes, which accumulate in fp32 and round once as the host does.
  // Every rank decides alike (the switch, type and size match on all of them).
  if (comm_->settings.deterministic && dtypeHasWiderPartials(call.datatype)) {
    if (call.collective == Collective::kAllReduce)
      return executor_.byMailboxes(call.count * dtypeSize(call.datatype));
    if (call.collective == Collective::kReduceScatter || call.collective == Collective::kReduce) return false;
  }
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
  if (!executor_.failed()) return loomSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  const loomResult_t result = executor_.error();
  if (!errorNoted_) comm_->setLastError(threadLastError());  // its message, once
  errorNoted_ = true;
  return result;
}

loomResult_t DevicePath::planOf(const Call& call, void* stream, DevicePlan** out) {
  if (planner_.size() >= kMaxDevicePlans) {
    // Kernels still queued may use any cached plan: each is freed in stream order, after the calls before.
    LOOM_CHECK(planner_.clear([&](DevicePlan& plan) { return executor_.release(plan.extra.copy, stream); }));
  }
  PlannedCall planned;
  DevicePlan* plan = nullptr;
  LOOM_CHECK(planner_.plan(call, nullptr, &planned, &plan));
  if (plan->extra.copy.arrays == nullptr) {
    for (const Lane& lane : plan->plan.lanes)
      if (lane.channel < 0 || lane.channel >= kMaxChannels * kChannelSets)
        return LOOM_FAIL(loomInternalError, CUDA, "%s: plan %s uses channel %d (below %d)",
                         collectiveName(call.collective), planned.choice->algorithm.c_str(), lane.channel,
                         kMaxChannels * kChannelSets);
    plan->extra.slicing = {planned.choice->slicing.simpleSliceBytes, planned.choice->slicing.llThresholdBytes};
    LOOM_CHECK(executor_.upload(plan->plan, &plan->extra.copy));
  }
  *out = plan;
  return loomSuccess;
}

loomResult_t DevicePath::route(int peer, ConnectionTable::Route* out) {
  (void)peer;
  *out = {deviceTransport(), nullptr};
  return loomSuccess;
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

loomResult_t DevicePath::enqueue(const Call& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (call.count == 0) return loomSuccess;
  DeviceScope scope(executor_.device());
  loomResult_t result = launch(call);
  if (result != loomSuccess) {
    // Peers may be in this call's kernels already, and the barrier counts may have moved on: the communicator
    // is done for.
    int expected = loomSuccess;
    comm_->asyncError.compare_exchange_strong(expected, result);
  }
  return result;
}

loomResult_t DevicePath::launch(const Call& call) {
  DeviceCall device;
  device.input = call.inputs[0];
  device.output = call.outputs[0];
  device.count = call.count;
  device.datatype = call.datatype;
  device.op = call.op;
  device.stream = call.stream;
  // The mailboxes reduce in rank order, fp16 and bf16 in fp32 rounded once: the bits of the host's rank-order
  // plans.
  if (call.collective == Collective::kAllReduce && executor_.byMailboxes(call.count * dtypeSize(call.datatype))) {
    LOOM_CHECK(connectMailboxes());
    return executor_.enqueueMailboxes(device);
  }
  DevicePlan* plan = nullptr;
  LOOM_CHECK(planOf(call, call.stream, &plan));
  if (!plan->extra.connected) {
    LOOM_CHECK(connect(*plan));
    plan->extra.connected = true;
  }
  // The lane runner keeps partials in the type itself, wideScratch or not (takes() keeps that off the
  // deterministic path).
  const size_t scratchBytes = plan->plan.scratchCount * dtypeSize(call.datatype);
  return executor_.enqueuePlan(device, plan->extra.copy, plan->extra.slicing, scratchBytes, plan->plan.reducedOutput);
}

void DevicePathDeleter::operator()(DevicePath* path) const { delete path; }

loomResult_t devicePathCreate(loomComm* comm, int device, const uint32_t* abortFlag, DevicePathPtr* out) {
  out->reset();
  const std::string choice = params::cudaPath();
  if (choice != "staged" && choice != "device")
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_CUDA_PATH=\"%s\" is neither staged nor device", choice.c_str());
  if (choice == "staged") return loomSuccess;
  if (comm->settings.checksum) {
    LOOM_INFO(CUDA, "rank %d: LOOM_CUDA_PATH=device, but the GPU executor does not checksum its messages "
              "(LOOM_CHECKSUM): calls go the staged path", comm->rank);
    return loomSuccess;
  }
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
