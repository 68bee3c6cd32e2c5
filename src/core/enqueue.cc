// A call's way from the entry point to the executor, in named steps: submit() checks it (the ranks' calls agree,
// where LOOM_CHECK_COLL asks) and groups it (an open group, a host stream, a CUDA stream, or now); runCalls()
// then takes a Submission through gather, enter, plan (the communicator's planner: planner.h),
// connect, and execute.
#include "src/core/enqueue.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "algorithms/builders.h"
#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/core/coll_check.h"
#include "src/core/comm.h"
#include "src/core/cuda_calls.h"
#include "src/core/failure.h"
#include "src/core/stream.h"
#include "src/core/zero_copy.h"

namespace loom {
namespace {

constexpr size_t kMaxCachedPlans = 512;

ExecTask taskFor(const Call& call, const RankPlan* plan, const TuneEstimate& choice) {
  loomComm* comm = call.comm;
  ExecTask task;
  task.plan = plan;
  task.inputs = call.inputs;
  task.outputs = call.outputs;
  task.datatype = call.datatype;
  task.op = call.op;
  task.nranks = comm->nranks;
  task.rank = comm->rank;
  task.forcedProtocol = comm->settings.forcedProtocol;
  task.llThresholdBytes = choice.slicing.llThresholdBytes;
  task.simpleSliceBytes = std::min(choice.slicing.simpleSliceBytes, slicePayloadBytes(comm->settings, Protocol::kSimple));
  task.llSliceBytes = slicePayloadBytes(comm->settings, Protocol::kLL);
  task.checksum = comm->settings.checksum;
  task.checksumResend = comm->settings.checksumResend;
  task.links = &comm->connections;
  task.what = collectiveName(call.collective);
  size_t outputBytes = 0;
  for (size_t i = 0; i < call.outputs.size(); ++i) outputBytes += callBufferBytes(call, plan, false, i);
  markZeroCopy(call, plan, outputBytes, &task);
  task.streamOutputs = comm->settings.streamingBytes > 0 && outputBytes >= comm->settings.streamingBytes;
  return task;
}

// Records a failed run on every communicator it involved: the message for loomGetLastError, and the error as
// the communicator's async error when the communicator can no longer be trusted (peers gone, FIFOs mid-way).
// A failure that ends the communicator leads with the first failure noted on it (failure.h), when that is another
// rank's, and is logged so; its FIFOs are marked with it, so that it reaches every peer.
// `watches`: the run's, by communicator (what each runs, and the number of its first collective).
void recordFailure(std::vector<loomComm*>& comms, const std::vector<CommWatch>& watches, loomResult_t result) {
  const bool fatal = result == loomRemoteError || result == loomTimeout || result == loomSystemError ||
                     result == loomInternalError;
  for (size_t q = 0; q < comms.size(); ++q) {
    loomComm* comm = comms[q];
    if (!fatal) {
      comm->setLastError(threadLastError());
      continue;
    }
    comm->connections.noteFailure(packOrigin({comm->rank, FailureCause::kError, 0}));
    std::string message = threadLastError();
    const std::string prefix = failurePrefix(comm, watches[q].what(), watches[q].sequence(), message);
    if (!prefix.empty() && message.rfind(prefix, 0) != 0) {
      message = prefix + message;
      LOOM_WARN(COLL, "rank %d: %s", comm->rank, message.c_str());
      setThreadLastError(message);  // what the entry point copies to the communicator
    }
    comm->setLastError(message);
    int expected = loomSuccess;
    comm->asyncError.compare_exchange_strong(expected, result);
    comm->connections.abortAll();
  }
}

}  // namespace

CollArgs collArgsOf(const Call& call, int nChannels) {
  CollArgs args;
  args.collective = call.collective;
  args.nranks = call.comm->nranks;
  args.rank = call.comm->rank;
  args.root = call.root;
  args.count = call.count;
  args.nChannels = nChannels;
  args.sendCounts = call.sendCounts;
  args.sendDispls = call.sendDispls;
  args.recvCounts = call.recvCounts;
  args.recvDispls = call.recvDispls;
  args.p2p = call.p2p;
  args.torusDimCount = call.comm->settings.torusDimCount;
  std::copy(call.comm->settings.torusDims, call.comm->settings.torusDims + args.torusDimCount, args.torusDims);
  args.hostOf = call.comm->hostOf;
  return args;
}

bool reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}
bool rooted(Collective c) {
  return c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kGather ||
         c == Collective::kScatter;
}

std::string describeCall(Collective collective, size_t count, loomDataType_t datatype, loomRedOp_t op, int root) {
  std::string text = collectiveName(collective);
  if (collective == Collective::kBarrier || collective == Collective::kSendRecv) return text;
  text += collective == Collective::kAllToAllv ? " of " : " of " + std::to_string(count) + " ";
  text += dtypeName(datatype);
  if (reduces(collective)) text += std::string(" (") + opName(op) + ")";
  if (rooted(collective)) text += ", root " + std::to_string(root);
  return text;
}

// The containers of a run, kept per thread and cleared rather than freed, so that once warm a small call's run
// allocates nothing: at a microsecond a call, a dozen allocations are a fifth of the time.
struct RunWorkspace {
  bool busy = false;
  std::vector<loomComm*> comms, lockOrder;
  std::vector<CommWatch> watches;
  // Per communicator: the number of the run's first collective (0: none); connect() counts it on from there, a
  // task's number each.
  std::vector<uint64_t> sequences;
  std::vector<RankPlan> uncached;  // plans not cached (kept, with their capacity, until overwritten)
  std::vector<PlannedCall> plans;              // per call: its plan and the tuner's choice
  std::vector<HostPlanner::Entry*> cached;  // per call: its cache entry (null: built for the call)
  std::vector<std::vector<ExecTask>> queues;
  struct Idle {
    bool idle = false;
    Clock::time_point since, published;
  };
  std::vector<Idle> idle;  // per queue: how long it has waited, for the status report (status.h)
  HostExecutor executor;
};

// Takes this thread's workspace (or a fresh one if a run is already using it) and hands it back cleared.
class WorkspaceLease {
 public:
  WorkspaceLease()
      : own_(threadWorkspace().busy ? std::make_unique<RunWorkspace>() : nullptr),
        ws_(own_ ? *own_ : threadWorkspace()) {
    ws_.busy = true;
  }
  ~WorkspaceLease() {
    ws_.comms.clear();
    ws_.lockOrder.clear();
    ws_.watches.clear();
    ws_.plans.clear();
    ws_.cached.clear();
    ws_.idle.clear();
    for (auto& queue : ws_.queues) queue.clear();
    ws_.busy = false;
  }
  RunWorkspace& operator*() { return ws_; }

 private:
  static RunWorkspace& threadWorkspace() {
    thread_local RunWorkspace workspace;
    return workspace;
  }
  std::unique_ptr<RunWorkspace> own_;
  RunWorkspace& ws_;
};

// Holds the run mutexes of the communicators, locked in address order so two threads sharing them cannot
// deadlock.
class RunLocks {
 public:
  explicit RunLocks(const std::vector<loomComm*>& sorted) : comms_(sorted) {
    for (loomComm* comm : comms_) comm->runMutex.lock();
  }
  ~RunLocks() {
    for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) (*it)->runMutex.unlock();
  }

 private:
  const std::vector<loomComm*>& comms_;
};

namespace {

// One run of calls on this thread, in the steps every submission takes (runCalls): gather the communicators,
// enter the collectives on their status, plan every call, connect what the plans need, execute. The containers
// are the thread's RunWorkspace's. A step that fails records its error on every communicator of the run (fail),
// with the failing call's rank in the log.
class Submission {
 public:
  Submission(std::span<Call> calls, RunWorkspace& ws) : calls_(calls), ws_(ws) {}

  // The communicators, in order of first appearance (a queue each), and the order to lock them in.
  const std::vector<loomComm*>& gather() {
    for (const Call& call : calls_)
      if (std::find(ws_.comms.begin(), ws_.comms.end(), call.comm) == ws_.comms.end()) ws_.comms.push_back(call.comm);
    ws_.lockOrder.assign(ws_.comms.begin(), ws_.comms.end());
    if (ws_.lockOrder.size() > 1) std::sort(ws_.lockOrder.begin(), ws_.lockOrder.end());
    return ws_.lockOrder;
  }

  // With the communicators locked: each one's status shows the run's first call of it until the run ends
  // (leave()), and numbers the collectives it enters (a deadline names the ranks that have not entered one).
  // One watch per communicator serves the whole run, connection setup included, named by its first collective.
  void enter() {
    // Bound the plan caches here, never mid-run: the run keeps pointers to cached plans.
    for (loomComm* comm : ws_.comms)
      if (comm->planner.size() > kMaxCachedPlans) comm->planner.clear();
    std::vector<uint64_t>& sequences = ws_.sequences;
    sequences.clear();
    for (loomComm* comm : ws_.comms) {
      const Call& first = *std::find_if(calls_.begin(), calls_.end(), [&](const Call& call) { return call.comm == comm; });
      comm->status.begin(static_cast<uint8_t>(first.collective), first.count, first.datatype, first.op, first.root);
      uint64_t collectives = 0;
      for (const Call& call : calls_)
        if (call.comm == comm && call.collective != Collective::kSendRecv) ++collectives;
      sequences.push_back(collectives > 0 ? comm->status.enterCollectives(collectives) : 0);
    }
    for (size_t q = 0; q < ws_.comms.size(); ++q) {
      loomComm* comm = ws_.comms[q];
      auto first = std::find_if(calls_.begin(), calls_.end(), [&](const Call& call) {
        return call.comm == comm && (sequences[q] == 0 || call.collective != Collective::kSendRecv);
      });
      ws_.watches.emplace_back(comm, collectiveName(first->collective), sequences[q]);
    }
  }
  void leave() {
    for (loomComm* comm : ws_.comms) comm->status.end();
  }

  // Every call's plan (the communicator's cache, or built for the call), and every receiver it needs created.
  loomResult_t plan() {
    if (ws_.uncached.size() < calls_.size()) ws_.uncached.resize(calls_.size());
    ws_.plans.assign(calls_.size(), {});
    ws_.cached.assign(calls_.size(), nullptr);
    for (size_t i = 0; i < calls_.size(); ++i) {
      Call& call = calls_[i];
      ScopedLogRank logRank(call.comm->rank);
      loomResult_t result = call.comm->planner.plan(call, &ws_.uncached[i], &ws_.plans[i], &ws_.cached[i]);
      if (result != loomSuccess) return fail(result);
      if (!connected(i)) {
        result = call.comm->connections.createReceivers(call.comm, *ws_.plans[i].plan);
        if (result != loomSuccess) return failedConnecting(call, result);
      }
    }
    return loomSuccess;
  }

  // Every sender the plans need attached (after every receiver exists: see Connections), and a task per call
  // queued on its communicator's queue with the communicator's scratch.
  loomResult_t connect() {
    if (ws_.queues.size() < ws_.comms.size()) ws_.queues.resize(ws_.comms.size());
    for (size_t i = 0; i < calls_.size(); ++i) {
      Call& call = calls_[i];
      loomComm* comm = call.comm;
      ScopedLogRank logRank(comm->rank);
      const size_t q = queueOf(call);
      if (!connected(i)) {
        loomResult_t result =
            comm->connections.attachSenders(comm, *ws_.plans[i].plan, [&]() { return ws_.watches[q](false); });
        if (result != loomSuccess) return failedConnecting(call, result);
        if (ws_.cached[i] != nullptr) ws_.cached[i]->extra.connected = true;
      }
      const RankPlan& plan = *ws_.plans[i].plan;
      const size_t scratchBytes =
          plan.scratchCount * (plan.wideScratch ? dtypePartialSize(call.datatype) : dtypeSize(call.datatype));
      if (comm->scratch.size() < scratchBytes) comm->scratch.resize(scratchBytes);
      ws_.queues[q].push_back(taskFor(call, &plan, *ws_.plans[i].choice));
      if (call.collective != Collective::kSendRecv && ws_.sequences[q] > 0)
        ws_.queues[q].back().sequence = ws_.sequences[q]++;
    }
    for (size_t q = 0; q < ws_.comms.size(); ++q)
      for (ExecTask& task : ws_.queues[q]) task.scratch = ws_.comms[q]->scratch.data();
    return loomSuccess;
  }

  // Runs the queues to the end: the executor asks the watches after every pass whether to go on.
  loomResult_t execute() {
    ScopedLogRank logRank(ws_.comms.front()->rank);
    int64_t spinPolls = INT64_MAX;
    for (loomComm* comm : ws_.comms) spinPolls = std::min(spinPolls, comm->settings.spinPolls);
    ws_.idle.resize(ws_.comms.size());
    const loomResult_t result = ws_.executor.run(
        ws_.queues,
        [this](bool progressed, const NeedsPeerFn& needsPeer, const WaitingForFn& waitingFor) {
          // After progress a watch looks at the abort flag only: the peer query is built for idle checks alone.
          for (size_t q = 0; q < ws_.watches.size(); ++q) {
            if (progressed) {
              ws_.idle[q].idle = false;
              LOOM_CHECK(ws_.watches[q](true));
              continue;
            }
            LOOM_CHECK(ws_.watches[q](false, [&](int peer) { return needsPeer(q, peer); }));
            publishWaiting(q, waitingFor);
          }
          return loomSuccess;
        },
        spinPolls);
    return result == loomSuccess ? result : fail(result);
  }

 private:
  // Records a failed step on every communicator of the run; returns `result`.
  loomResult_t fail(loomResult_t result) {
    recordFailure(ws_.comms, ws_.watches, result);
    return result;
  }
  bool connected(size_t i) const { return ws_.cached[i] != nullptr && ws_.cached[i]->extra.connected; }
  size_t queueOf(const Call& call) const {
    return std::find(ws_.comms.begin(), ws_.comms.end(), call.comm) - ws_.comms.begin();
  }
  // A connection that cannot be made fails the call that needed it: say which (the transport names the peer).
  loomResult_t failedConnecting(const Call& call, loomResult_t result) {
    const std::string why = threadLastError();
    return fail(LOOM_FAIL(result, COLL, "%s on rank %d, connecting: %s", collectiveName(call.collective),
                          call.comm->rank, why.c_str()));
  }
  // A queue idle for a while tells its communicator's status what it waits for, at most every 200 ms.
  void publishWaiting(size_t q, const WaitingForFn& waitingFor) {
    constexpr auto kPublishAfter = std::chrono::milliseconds(200);
    RunWorkspace::Idle& idle = ws_.idle[q];
    const Clock::time_point now = Clock::now();
    if (!idle.idle) {
      idle = {true, now, now};
    } else if (now - idle.since >= kPublishAfter && now - idle.published >= kPublishAfter) {
      ws_.comms[q]->status.waiting(waitingFor(q), idle.since);
      idle.published = now;
    }
  }

  std::span<Call> calls_;
  RunWorkspace& ws_;
};

}  // namespace

loomResult_t runCalls(std::span<Call> calls) {
  WorkspaceLease lease;
  Submission run(calls, *lease);
  RunLocks locks(run.gather());
  run.enter();
  struct Leave {
    Submission& run;
    ~Leave() { run.leave(); }
  } leave{run};
  LOOM_CHECK(run.plan());
  LOOM_CHECK(run.connect());
  return run.execute();
}

loomResult_t submit(Call&& call) {
  if (groupOpen()) {
    groupAdd(std::move(call));
    return loomSuccess;
  }
  if (call.comm->settings.checkCalls) {
    LOOM_CHECK(checkSameCalls(call.comm, {&call, 1}));
    if (call.fingerprintOnly) return loomSuccess;
  }
  if (call.comm->settings.device == loomDeviceCuda || call.stream != nullptr) {
    loomStream_t stream = call.stream;
    std::vector<Call> calls;
    calls.push_back(std::move(call));
    return calls.front().comm->settings.device == loomDeviceCuda ? cudaEnqueue(std::move(calls))
                                                        : streamEnqueue(stream, std::move(calls));
  }
  return runCalls({&call, 1});
}

}  // namespace loom
