// Send/Recv groups and the barrier.
//
// SendRecv: the Send and Recv calls of one group on one communicator. Calls to the same peer keep their order
// (they share a connection), so each peer gets one send lane and one receive lane; lanes to different peers
// proceed independently, which is what lets any pattern of sends and receives in a group complete. A rank's
// sends to itself are paired in order with its receives from itself and become copies. One step per call.
//
// Barrier: dissemination. In round k every rank sends a one-byte token to rank+2^k and takes the token of
// rank-2^k, merged (max) into its own; after ceil(log2 n) rounds every rank has heard, directly or not, from
// every rank, so none leaves before all have entered. 2*ceil(log2 n) steps, ceil(log2 n) bytes per rank.
#include <map>

#include "algorithms/builders.h"

namespace loom {

RankPlan buildSendRecv(const CollArgs& args) {
  RankPlan plan = planShell(args, "p2p");
  std::map<int, Lane> sendLanes, recvLanes;
  std::vector<uint32_t> selfSends, selfRecvs;
  for (uint32_t i = 0; i < args.p2p.size(); ++i) {
    const P2POp& op = args.p2p[i];
    if (op.count == 0) continue;
    if (op.peer == args.rank) {
      (op.isSend ? selfSends : selfRecvs).push_back(i);
    } else if (op.isSend) {
      sendLanes[op.peer].steps.push_back(send(op.peer, Region{Buffer::kInput, 0, op.count, i}));
    } else {
      recvLanes[op.peer].steps.push_back(recv(op.peer, Region{Buffer::kOutput, 0, op.count, i}));
    }
  }
  for (auto* lanes : {&sendLanes, &recvLanes})
    for (auto& [peer, lane] : *lanes) plan.lanes.push_back(std::move(lane));
  // Self pairs: the verifier and the argument checks make sure counts match; copy the common prefix.
  Lane self{0, {}};
  for (size_t k = 0; k < std::min(selfSends.size(), selfRecvs.size()); ++k) {
    size_t count = std::min(args.p2p[selfSends[k]].count, args.p2p[selfRecvs[k]].count);
    self.steps.push_back(
        copy(Region{Buffer::kInput, 0, count, selfSends[k]}, Region{Buffer::kOutput, 0, count, selfRecvs[k]}));
  }
  if (!self.steps.empty()) plan.lanes.push_back(std::move(self));
  return plan;
}

RankPlan buildDisseminationBarrier(const CollArgs& args) {
  RankPlan plan = planShell(args, "dissemination");
  plan.scratchCount = 1;  // the token: what this rank has heard, merged with max
  int n = args.nranks, rank = args.rank;
  Lane lane{0, {}};
  for (int distance = 1; distance < n; distance *= 2) {
    lane.steps.push_back(send((rank + distance) % n, scratch(0, 1)));
    lane.steps.push_back(recvReduce((rank - distance + n) % n, scratch(0, 1), scratch(0, 1)));
  }
  if (!lane.steps.empty()) plan.lanes.push_back(std::move(lane));
  return plan;
}

}  // namespace loom
