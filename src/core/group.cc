// Groups: loomGroupStart/End on the calling thread. Calls made inside a group are collected; the outermost
// loomGroupEnd merges the Send/Recv calls of each communicator into one SendRecv call (so they progress
// together, which is what lets pairs of sends and receives complete) and runs everything at once.
#include <algorithm>
#include <map>
#include <mutex>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/core/coll_check.h"
#include "src/core/comm.h"
#include "src/core/cuda_calls.h"
#include "src/core/enqueue.h"
#include "src/core/stream.h"

namespace loom {
namespace {
thread_local int tGroupDepth = 0;
thread_local std::vector<Call> tGroupCalls;

// Send/Recv calls of one communicator become one SendRecv call at the position of the first.
std::vector<Call> mergeSendRecv(std::vector<Call> calls) {
  std::vector<Call> merged;
  std::map<loomComm*, size_t> p2pIndex;
  for (Call& call : calls) {
    if (call.collective != Collective::kSendRecv) {
      merged.push_back(std::move(call));
      continue;
    }
    auto found = p2pIndex.find(call.comm);
    if (found == p2pIndex.end()) {
      p2pIndex[call.comm] = merged.size();
      merged.push_back(std::move(call));
      continue;
    }
    Call& target = merged[found->second];
    target.p2p.push_back(call.p2p.front());
    target.inputs.push_back(call.inputs.front());
    target.outputs.push_back(call.outputs.front());
  }
  return merged;
}

// Sends to self must pair with receives from self of the same size, in order.
loomResult_t checkSelfPairs(const Call& call) {
  std::vector<size_t> sends, recvs;
  for (const P2POp& op : call.p2p)
    if (op.peer == call.comm->rank) (op.isSend ? sends : recvs).push_back(op.count);
  if (sends != recvs)
    return LOOM_FAIL(loomInvalidUsage, COLL,
                     "rank %d sends %zu message(s) to itself and receives %zu from itself in one group; each send "
                     "to self needs a receive from self of the same count, in the same order",
                     call.comm->rank, sends.size(), recvs.size());
  return loomSuccess;
}

const Call& firstCallOf(const std::vector<Call>& calls, const loomComm* comm) {
  return *std::find_if(calls.begin(), calls.end(), [comm](const Call& call) { return call.comm == comm; });
}

// A CUDA group goes to each communicator's worker, which runs its share with the others' concurrently.
loomResult_t enqueueCudaGroup(std::vector<Call> calls) {
  std::vector<loomComm*> comms;
  for (const Call& call : calls)
    if (std::find(comms.begin(), comms.end(), call.comm) == comms.end()) comms.push_back(call.comm);
  loomResult_t result = loomSuccess;
  for (loomComm* comm : comms) {
    std::vector<Call> share;
    for (Call& call : calls)
      if (call.comm == comm) share.push_back(std::move(call));
    loomResult_t enqueued = cudaEnqueue(std::move(share));
    if (enqueued != loomSuccess) {
      comm->setLastError(threadLastError());
      if (result == loomSuccess) result = enqueued;
    }
  }
  return result;
}

}  // namespace

bool groupOpen() { return tGroupDepth > 0; }
void groupAdd(Call call) { tGroupCalls.push_back(std::move(call)); }

}  // namespace loom

using loom::Call;

loomResult_t loomGroupStart(void) {
  ++loom::tGroupDepth;
  return loomSuccess;
}

loomResult_t loomGroupEnd(void) {
  using namespace loom;
  clearThreadLastError();
  if (tGroupDepth == 0) return LOOM_FAIL(loomInvalidUsage, COLL, "loomGroupEnd without a matching loomGroupStart");
  if (--tGroupDepth > 0) return loomSuccess;
  std::vector<Call> calls = mergeSendRecv(std::move(tGroupCalls));
  tGroupCalls.clear();
  if (calls.empty()) return loomSuccess;
  for (const Call& call : calls) {
    loomResult_t result = call.collective == Collective::kSendRecv ? checkSelfPairs(call) : loomSuccess;
    // A host group runs (or is queued) as one: one stream. A CUDA group goes to each communicator's worker on that
    // communicator's stream, so only the calls of one communicator must share one (one device per stream, as with
    // NCCL's groups over several devices).
    const Call& first = call.comm->settings.device == loomDeviceCuda ? firstCallOf(calls, call.comm) : calls.front();
    if (result == loomSuccess && call.stream != first.stream)
      result = LOOM_FAIL(loomInvalidUsage, COLL, "calls of one group must use the same stream%s (%p and %p)",
                         call.comm->settings.device == loomDeviceCuda ? " on each communicator" : "", first.stream, call.stream);
    if (result == loomSuccess && call.comm->settings.device != calls.front().comm->settings.device)
      result = LOOM_FAIL(loomInvalidUsage, COLL,
                         "a group mixes host and CUDA communicators (rank %d of \"%s\" and "
                         "rank %d of \"%s\")",
                         calls.front().comm->rank, calls.front().comm->settings.name.c_str(), call.comm->rank,
                         call.comm->settings.name.c_str());
    if (result != loomSuccess) {
      for (const Call& other : calls) other.comm->setLastError(threadLastError());
      return result;
    }
  }
  // LOOM_CHECK_COLL: a group on one communicator compares its collectives with the peers' groups. A thread driving
  // several ranks in one group cannot wait for each in turn: such groups go unchecked.
  loomComm* first = calls.front().comm;
  if (first->settings.checkCalls &&
      std::all_of(calls.begin(), calls.end(), [first](const Call& call) { return call.comm == first; })) {
    loomResult_t checked = checkSameCalls(first, calls);
    if (checked != loomSuccess) {
      first->setLastError(threadLastError());
      return checked;
    }
  }
  std::erase_if(calls, [](const Call& call) { return call.fingerprintOnly; });
  if (calls.empty()) return loomSuccess;
  loomStream_t stream = calls.front().stream;
  if (calls.front().comm->settings.device == loomDeviceCuda) return enqueueCudaGroup(std::move(calls));
  if (stream != nullptr) return streamEnqueue(stream, std::move(calls));
  for (const Call& call : calls) call.comm->activeCalls.fetch_add(1);
  loomResult_t result = runCalls(calls);
  for (const Call& call : calls) call.comm->activeCalls.fetch_sub(1);
  return result;
}

loomResult_t loomGroupSimulateEnd(loomSimInfo_t* simInfo) {
  using namespace loom;
  clearThreadLastError();
  if (simInfo == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "loomGroupSimulateEnd: simInfo is NULL");
  if (simInfo->size != sizeof(loomSimInfo_t))
    return LOOM_FAIL(loomInvalidArgument, COLL,
                     "loomGroupSimulateEnd: simInfo->size is %zu, expected %zu (start from LOOM_SIM_INFO_INITIALIZER)",
                     simInfo->size, sizeof(loomSimInfo_t));
  if (tGroupDepth == 0)
    return LOOM_FAIL(loomInvalidUsage, COLL, "loomGroupSimulateEnd without a matching loomGroupStart");
  if (tGroupDepth > 1)
    return LOOM_FAIL(loomInvalidUsage, COLL,
                     "loomGroupSimulateEnd inside a nested group: only the outermost group "
                     "can be simulated");
  for (const Call& call : tGroupCalls)
    if (call.collective == Collective::kSendRecv)
      return LOOM_FAIL(loomInvalidUsage, COLL,
                       "loomGroupSimulateEnd: the group holds Send/Recv calls, which cannot "
                       "be estimated; end it with loomGroupEnd");
  std::vector<Call> calls = std::move(tGroupCalls);
  tGroupCalls.clear();
  tGroupDepth = 0;
  std::map<loomComm*, double> perComm;
  for (const Call& call : calls) {
    loomComm* comm = call.comm;
    std::lock_guard<std::mutex> lock(comm->runMutex);
    size_t count = call.count;
    Collective collective = call.collective;
    if (collective == Collective::kAllToAllv) {  // estimated as an AllToAll of its average block
      size_t total = 0;
      for (size_t c : call.sendCounts) total += c;
      count = total / std::max(1, comm->nranks);
      collective = Collective::kAllToAll;
    }
    const TuneEstimate& choice = comm->planner.tuner().choose(collective, count * dtypeSize(call.datatype), comm->settings.algorithmRules);
    double us = estimateCall(comm->planner.tuner().context(), comm->planner.tuner().costs(), collective, count, dtypeSize(call.datatype),
                             call.root, choice.algorithm, choice.nChannels, &choice.slicing);
    perComm[comm] += std::max(0.0, us);
  }
  double slowest = 0;
  for (const auto& [comm, us] : perComm) slowest = std::max(slowest, us);
  simInfo->estimatedTime = static_cast<float>(slowest);
  return loomSuccess;
}
