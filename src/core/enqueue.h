// From a checked API call to running plans: Call records what the user asked for; submit() adds it to the
// open group, queues it on a host stream, or runs it at once; runCalls() plans, connects and executes.
#pragma once

#include <span>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/plan.h"
#include "loom/loom.h"
#include "src/base/inline_vector.h"

namespace loom {

struct Call {
  loomComm* comm = nullptr;
  Collective collective = Collective::kAllReduce;
  size_t count = 0;
  int root = 0;
  loomDataType_t datatype = loomFloat32;
  loomRedOp_t op = loomSum;
  loomStream_t stream = nullptr;
  InlineVector<const void*, 1> inputs;  // one per op for Send/Recv groups, else one
  InlineVector<void*, 1> outputs;
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;  // AllToAllv
  std::vector<P2POp> p2p;                                              // SendRecv
  bool fingerprintOnly = false;  // a call of count 0 under LOOM_CHECK_COLL: compared with the peers', not run
};

// Whether a collective takes an operator / a root.
bool reduces(Collective collective);
bool rooted(Collective collective);
// A call as messages name it: "AllReduce of 1024 float (sum)", "Broadcast of 8 int32, root 2", "Barrier". Only
// what the collective uses is shown (AllToAllv: no count).
std::string describeCall(Collective collective, size_t count, loomDataType_t datatype, loomRedOp_t op, int root);

// The plan builders' arguments for `call` on `nChannels` channels.
CollArgs collArgsOf(const Call& call, int nChannels);
// Runs `call` now, or adds it to this thread's open group, or queues it on its stream.
loomResult_t submit(Call&& call);
// Plans, connects and runs calls: those of one communicator one after another, communicators concurrently.
loomResult_t runCalls(std::span<Call> calls);

// Group state of the calling thread (group.cc).
bool groupOpen();
void groupAdd(Call call);

}  // namespace loom
