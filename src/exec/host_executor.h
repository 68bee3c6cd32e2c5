// The host executor: runs RankPlans on CPU buffers over FIFO connections, on the calling thread.
//
// Each step is cut into slices of one FIFO slot; a lane runs in rounds (slice k of every step in order), and all
// lanes of all tasks given to one run() progress together, without blocking: a slice runs only when its message
// has arrived and its outgoing slot is free, so any number of ranks can share few cores. When nothing can move
// the executor moves its network connections itself where their transport lets it (Links::progressNetwork), else
// backs off (spin, yield, sleep) and asks its Watch whether to give up: deadline, abort, dead peer.
// It knows nothing of communicators or of how connections were made.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "algorithms/plan.h"
#include "loom/loom.h"
#include "transports/fifo.h"

namespace loom {

// Where a plan's connections are: both ends of every (peer, channel) it uses, set up by the caller.
class Links {
 public:
  virtual ~Links() = default;
  virtual FifoSender* sender(int peer, int channel) = 0;
  virtual FifoReceiver* receiver(int peer, int channel) = 0;
  // Whether `peer` can read this process's memory itself, so that messages to it may be DirectDescriptors.
  virtual bool directTo(int peer) = 0;
  // Whether a proxy thread of this process moves the messages to `peer` (tcp): it then sends a DirectDescriptor's
  // payload from this process's memory itself, so any buffer the call does not write meanwhile may go direct.
  virtual bool proxySends(int peer) = 0;
  // Whether a proxy thread moves the messages to and from `peer` (tcp, ucx, ib), rather than the ranks' executors
  // reaching each other's FIFOs themselves (shm, loopback).
  virtual bool movesByProxy(int peer) {
    (void)peer;
    return false;
  }
  // Under LOOM_CHECKSUM=2, whether a message from `peer` that failed its check can be asked for again: where the
  // peer's executor writes this rank's FIFO itself, or its transport's proxies resend (TransportTraits::proxyResends).
  virtual bool sendsAgain(int peer) { return !movesByProxy(peer); }
  // A direct message's payload in this address space, when its memory can be mapped here; nullptr: copy it.
  virtual const void* mapDirect(const DirectDescriptor& message) = 0;
  // What failed on a lost connection with `peer` (negative: any peer), as its transport saw it; empty when it
  // cannot tell.
  virtual std::string whyLost(int peer) {
    (void)peer;
    return {};
  }
  // Network connections the waiting thread moves itself (tcp; TransportComm::attachCaller): a run calls
  // beginNetworkProgress() once before its first progressNetwork(), and endNetworkProgress() as it ends.
  // begin returns false when there is nothing to move that way (the run then makes no other call).
  virtual bool beginNetworkProgress() { return false; }
  virtual bool progressNetwork() { return false; }  // whether anything moved
  virtual void endNetworkProgress() {}

  // The first failure this rank knows of on these connections (packOrigin; 0: none yet). Whoever finds one notes
  // it; the first note stands, and every abort mark the executor makes carries it, so that it reaches every rank.
  uint64_t failure() const { return failure_.load(std::memory_order_acquire); }
  // Notes `origin` unless a failure is noted already; returns the one that stands. An implementation may first
  // refine what it is told with what it can see itself (a peer process it watches).
  // After a connection with `peer` was marked lost or given up on without saying why: the failure another of
  // these connections' marks carries (packOrigin; 0: none yet), and in *mayCome whether one may still be on its
  // way (the peer could have failed first of something else and ended: its notice lands a little after), in
  // which case the caller looks again for a moment before it settles for what it saw.
  static constexpr int kMarkGraceMs = 200;  // how long "a moment" is
  virtual uint64_t marksAfterLoss(int peer, bool* mayCome) {
    (void)peer;
    *mayCome = false;
    return 0;
  }
  virtual uint64_t noteFailure(uint64_t origin) {
    uint64_t none = 0;
    failure_.compare_exchange_strong(none, origin, std::memory_order_acq_rel);
    return failure();
  }

 private:
  std::atomic<uint64_t> failure_{0};
};

// A buffer of a task that peers may read in place, and the shared file it lies in, if any.
struct DirectBuffer {
  bool direct = false;     // registered, and not written by the call while a peer may read it
  bool unwritten = false;  // not written by the call while a proxy may read it (registered or not)
  SharedRegion region;
};

struct ExecTask {
  const RankPlan* plan = nullptr;
  std::span<const void* const> inputs;  // by Region::bufferIndex (the caller's vectors, alive for the run)
  std::span<void* const> outputs;
  void* scratch = nullptr;
  loomDataType_t datatype = loomFloat32;
  loomRedOp_t op = loomSum;
  int nranks = 1;  // the divisor of loomAvg
  int rank = -1;   // this rank, as the failure it notes when it fails of its own error names it
  // The protocol of a message depends only on its size, which sender and receiver agree on, so both ends of
  // every connection always use the same protocol and the same slicing.
  int forcedProtocol = -1;      // -1: by size; else a Protocol
  size_t llThresholdBytes = 0;  // steps moving at most this many bytes use LL
  size_t simpleSliceBytes = 0;  // payload of one slot per protocol
  size_t llSliceBytes = 0;
  Links* links = nullptr;
  const char* what = "";  // e.g. "AllReduce", for error messages
  uint64_t sequence = 0;  // the call's number among its communicator's collectives (0: none, a Send/Recv)
  // LOOM_CHECKSUM: every message carries the CRC32C of its payload after it (kChecksumBytes), checked before its
  // data is used; the slice sizes above leave room for it. The task ends only once the peers it reaches directly
  // (not through a proxy) have taken every message it sent them, so that a mismatch fails the sender's call too.
  bool checksum = false;
  // LOOM_CHECKSUM=2: a message that fails its check is asked for again, once, where its sender writes this rank's
  // FIFO itself (shm, loopback); the sender keeps a copy of each until it is released (FifoSender::retain).
  bool checksumResend = false;
  // Buffers peers may read in place (registered, and not overlapping a buffer this call writes): a Simple send
  // of such data goes out as a DirectDescriptor, and the call ends only when every peer has read it.
  std::vector<DirectBuffer> directInputs;
  std::vector<DirectBuffer> directOutputs;
  uint64_t* directMessages = nullptr;  // counts the DirectDescriptors sent (for statistics and tests)
  bool streamOutputs = false;          // write the outputs with non-temporal stores (larger than the caches)
  bool directForwards = false;         // forwarding steps may pass their output to the peer in place
};

// Whether the task in progress on queue `queue` still waits on rank `peer` (a message from it, room in its FIFO,
// or its read of a direct message): a peer that has exited fails only the operations that still need it.
using NeedsPeerFn = std::function<bool(size_t queue, int peer)>;

// What the task in progress on queue `queue` waits for ("a message from rank 3 on channel 0"; empty when none).
using WaitingForFn = std::function<std::string(size_t queue)>;

// Called after every pass over the lanes, with whether anything moved: loomSuccess to go on, or the error that
// ends the run (its message recorded with fail()). A deadline is on waiting, so progress restarts it.
using WatchFn =
    std::function<loomResult_t(bool progressed, const NeedsPeerFn& needsPeer, const WaitingForFn& waitingFor)>;

class TaskRun;

// Runs tasks to completion on the calling thread. Keep one per thread and reuse it: it keeps its containers
// between runs, so that a warm small call allocates nothing.
class HostExecutor {
 public:
  HostExecutor();
  ~HostExecutor();
  HostExecutor(const HostExecutor&) = delete;
  HostExecutor& operator=(const HostExecutor&) = delete;

  // Tasks in one queue run one after another (they share connections); queues run concurrently. On error every
  // connection the run touched is marked aborted so peers notice at once. spinPolls: how long an idle pass spins
  // before it yields the CPU (see Backoff).
  loomResult_t run(std::vector<std::vector<ExecTask>>& queues, const WatchFn& watch, int64_t spinPolls);

 private:
  loomResult_t runQueues(std::vector<std::vector<ExecTask>>& queues, const WatchFn& watch, int64_t spinPolls);
  bool progressNetwork(std::span<std::unique_ptr<TaskRun>> runs);

  std::vector<size_t> next_;                    // per queue: the next task to start
  std::vector<std::unique_ptr<TaskRun>> runs_;  // per queue: its task in progress (reused)
  std::vector<Links*> driving_;                 // links whose network this run moves (beginNetworkProgress)
};

}  // namespace loom
