// Direct algorithms: the root talks to every other rank itself, one lane per peer so that all transfers
// proceed at once. With C channels each peer's block is cut into C parts, one lane per (peer, channel).
//   Gather:    every rank sends its block to root; root receives block p from p.   1 step per rank; root
//              receives (n-1)*count.
//   Scatter:   root sends block p to p; every rank receives its block.             1 step per rank.
//   Broadcast: root sends the whole buffer to every peer.                          root sends (n-1)*count:
//              for small messages, where one step beats the ring's n-1.
//   AllReduce: every rank sends its whole buffer to every peer and reduces all n   each rank sends and receives
//              inputs itself, in rank order, so every rank computes the same       (n-1)*count: for small
//              bits. One message on the critical path instead of the ring's       messages only.
//              2(n-1).
#include "algorithms/builders.h"

namespace loom {
namespace {

// Lanes for one rank: for each peer p != root-side self, block p of `rootSide` on root pairs with `leafSide`
// on p. `toRoot` says which way the data flows.
RankPlan buildStar(const CollArgs& args, const char* name, bool toRoot, Buffer rootBuffer, bool blockPerPeer) {
  RankPlan plan = planShell(args, name);
  int n = args.nranks, root = args.root, rank = args.rank;
  size_t count = args.count;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(count, args.nChannels, c), part = partCount(count, args.nChannels, c);
    if (part == 0) continue;
    auto rootBlock = [&](int p) {
      return Region{rootBuffer, (blockPerPeer ? static_cast<size_t>(p) * count : 0) + offset, part};
    };
    if (rank == root) {
      for (int p = 0; p < n; ++p) {
        if (p == root) continue;
        Lane lane{c, {}};
        lane.steps.push_back(toRoot ? recv(p, rootBlock(p)) : send(p, rootBlock(p)));
        plan.lanes.push_back(std::move(lane));
      }
      Region own = toRoot ? input(offset, part) : output(offset, part);
      plan.lanes.push_back(Lane{c, {toRoot ? copy(own, rootBlock(root)) : copy(rootBlock(root), own)}});
    } else {
      Lane lane{c, {}};
      lane.steps.push_back(toRoot ? send(root, input(offset, part)) : recv(root, output(offset, part)));
      plan.lanes.push_back(std::move(lane));
    }
  }
  return plan;
}

}  // namespace

// One lane per channel: the sends first (in place, the input is sent before the same slice of the buffer is
// overwritten: a lane runs its steps in order for every slice), then the accumulation in rank order. The partial
// result lives in scratch (in place, the output is the rank's own input, still needed when its turn comes); the
// last combination writes the output. Rank 0's partial starts as its input, read where it is, so at 2 ranks
// rank 0 needs no scratch and each rank has one step after its sends: rank 0 combines its input with the message,
// rank 1 receives, then combines. Every combination is (partial op next operand), the same on every rank.
RankPlan buildDirectAllReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "direct");
  int n = args.nranks, rank = args.rank;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    Region in = input(offset, part), out = output(offset, part), partial = scratch(offset, part);
    Lane lane{c, {}};
    for (int p = 0; p < n; ++p)
      if (p != rank) lane.steps.push_back(send(p, input(offset, part)));
    Region sum = in;  // where operands 0..p-1 are combined
    if (rank != 0) {
      lane.steps.push_back(recv(0, partial));
      sum = partial;
    }
    for (int p = 1; p < n; ++p) {
      Region to = p == n - 1 ? out : partial;
      if (p == rank) {
        lane.steps.push_back(reduce(sum, in, to));  // its own input
      } else {
        lane.steps.push_back(recvReduce(p, sum, to));
      }
      sum = to;
    }
    if (n == 1) lane.steps.push_back(copy(in, out));
    plan.lanes.push_back(std::move(lane));
  }
  plan.scratchCount = n > 2 || rank != 0 ? args.count : 0;
  plan.reducedOutput = output(0, args.count);
  return plan;
}

RankPlan buildDirectGather(const CollArgs& args) { return buildStar(args, "direct", true, Buffer::kOutput, true); }
RankPlan buildDirectScatter(const CollArgs& args) { return buildStar(args, "direct", false, Buffer::kInput, true); }
RankPlan buildDirectBroadcast(const CollArgs& args) { return buildStar(args, "direct", false, Buffer::kInput, false); }

}  // namespace loom
