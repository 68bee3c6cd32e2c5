// The GPU executor: runs a rank's share of a call as kernels on the caller's stream, over connections whose
// FIFOs lie in device memory that peers map. It is the GPU-only half of the executor layer, and holds nothing
// but memory primitives and launch glue:
//  - the kernels' connection arrays (PortableEnd, channel * nranks + peer, in device memory), whose counters
//    the kernels carry from call to call;
//  - the one-shot and two-shot mailboxes' addresses;
//  - flat plans copied into device memory;
//  - scratch memory, grown in stream order;
//  - a status word in mapped host memory where a kernel records why it stopped (a LaneFailure): sticky, so every
//    later kernel returns at once;
//  - the event after the last call, which the next call's stream waits for (calls share FIFOs, mailboxes and
//    scratch, so they run one after another whatever streams they are enqueued on).
// The walk of a plan's steps is the host's (lane_walker.h, through lane_runner.h in kernels.cu). Like the host
// executor it knows nothing of communicators, plans' choice or how connections were made: its caller (the
// communicator's device path, src/core/cuda_device.cc) plans, connects and hands it each new end. Not
// thread-safe: the caller serializes. Built only where the build has CUDA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "algorithms/flat_plan.h"
#include "loom/loom.h"
#include "src/exec/peer_allreduce.h"
#include "transports/fifo.h"
#include "transports/transport.h"

namespace loom {

// What the executor is given once: the rank's place, and the settings its kernels obey.
struct DeviceExecutorConfig {
  int device = 0;
  int rank = 0;
  int nranks = 1;
  int maxChannels = 1;  // channels a plan may use (the connection arrays' rows)
  int64_t timeoutMs = 0;
  FifoShape fifoShape{};  // of every plan connection
  int forcedProtocol = -1;
  const uint32_t* abortFlag = nullptr;  // the device's view of the communicator's mapped abort word
};

// A flat plan's copy in device memory (upload; freed by release).
struct DevicePlanCopy {
  FlatPlan flat;
  void* arrays = nullptr;  // flat's three arrays, in device memory (null: not uploaded)
  FlatPlanView view{};
};

// One call on one device buffer each way, on `stream` (a cudaStream_t).
struct DeviceCall {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  loomDataType_t datatype = loomFloat32;
  loomRedOp_t op = loomSum;
  void* stream = nullptr;
};

// How a plan's steps are sliced (the tuner's choice for the call's shape).
struct DeviceSlicing {
  size_t simpleSliceBytes = 0;
  size_t llThresholdBytes = 0;
};

class DeviceExecutor {
 public:
  explicit DeviceExecutor(const DeviceExecutorConfig& config) : config_(config) {}
  // Frees what start() made, unless the last call had not drained (drained()) or abandon() was called.
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  // Allocates the connection arrays, the status word, a stream for copies and the event; reads the one-shot and
  // two-shot limits (LOOM_CUDA_ONESHOT_BYTES, LOOM_CUDA_TWOSHOT_BYTES).
  loomResult_t start();
  int device() const { return config_.device; }

  // The shape of the mailboxes' connections, which the caller makes on a channel of their own.
  const FifoShape& mailboxShape() const { return mailboxShape_; }
  const FifoShape& fifoShape() const { return config_.fifoShape; }  // of every plan connection
  // Whether an AllReduce of `bytes` runs by mailboxes (one-shot or two-shot) rather than a plan.
  bool byMailboxes(size_t bytes) const { return bytes <= std::max(oneShotBytes_, twoShotBytes_); }

  // Copies `plan`'s flat form into device memory (*copy, whose arrays must be null).
  loomResult_t upload(const RankPlan& plan, DevicePlanCopy* copy);
  // Frees a copy: in the order of `stream` (kernels still queued may use it), or at once when stream is null.
  loomResult_t release(DevicePlanCopy& copy, void* stream);
  // A new connection's end, for the kernels (a plan channel) or the mailboxes (`mailbox`: channel ignored).
  loomResult_t setEnd(bool sender, int peer, int channel, bool mailbox, Endpoint& endpoint);

  // Enqueues `call` after the call before: a plan's lanes, one CTA each, with `scratchBytes` of scratch; or
  // one-shot / two-shot AllReduce through the mailboxes. Then, for loomAvg, the divide of `reduced` (elements of
  // the output; a plan says which, by mailboxes it is all of it). Returns at once. After a failure the caller
  // must treat the communicator as failed: peers may be inside this call's kernels.
  loomResult_t enqueuePlan(const DeviceCall& call, const DevicePlanCopy& plan, const DeviceSlicing& slicing,
                           size_t scratchBytes, Region reduced);
  loomResult_t enqueueMailboxes(const DeviceCall& call);

  // Whether a kernel has stopped before its end (cheap: one load of the status word).
  bool failed() const;
  // Why it stopped, as an error with its message (loomSuccess while none has); the same error every time after.
  loomResult_t error();

  // Waits, within the deadline, until the streams have passed the last call: before the memory kernels use is
  // freed. False when they have not.
  bool drained();
  // Lets go of the device memory without freeing it (destruction after drained() said false).
  void abandon() { abandoned_ = true; }

 private:
  loomResult_t waitForLast(void* stream);
  loomResult_t finish(const DeviceCall& call, Region reduced);
  loomResult_t reserveScratch(size_t bytes, void* stream);
  uint64_t timeoutNs() const;

  const DeviceExecutorConfig config_;
  PortableEnd* recvEnds_ = nullptr;  // device memory, channel * nranks + peer
  PortableEnd* sendEnds_ = nullptr;
  unsigned char* inbox_[kMaxPeerRanks] = {};  // the mailboxes' FIFOs, by peer
  unsigned char* outbox_[kMaxPeerRanks] = {};
  FifoShape mailboxShape_{};
  size_t oneShotBytes_ = 0, twoShotBytes_ = 0;
  uint64_t epoch_ = 1;      // the next barrier's flag
  uint64_t peerCalls_ = 0;  // one-shot and two-shot calls so far: their slot parity
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  uint32_t* status_ = nullptr;        // mapped host memory: a LaneFailure
  uint32_t* deviceStatus_ = nullptr;  // the device's view
  void* setup_ = nullptr;             // cudaStream_t for copies of plans and ends
  void* last_ = nullptr;              // cudaEvent_t recorded after each call
  bool launched_ = false;
  bool abandoned_ = false;
  loomResult_t reported_ = loomSuccess;
};

}  // namespace loom
