// Direct algorithms: the root talks to every other rank itself, one lane per peer so that all transfers
// proceed at once. With C channels each peer's block is cut into C parts, one lane per (peer, channel).
//   Gather:    every rank sends its block to root; root receives block p from p.   1 step per rank; root
//              receives (n-1)*count.
//   Scatter:   root sends block p to p; every rank receives its block.             1 step per rank.
//   Broadcast: root sends the whole buffer to every peer.                          root sends (n-1)*count:
//              for small messages, where one step beats the ring's n-1.
//   AllReduce: one-shot ("direct"): every rank sends its whole buffer to every     each rank sends and receives
//              peer and reduces all n inputs itself, in rank order, so every      (n-1)*count: for small
//              rank computes the same bits. One message on the critical path     messages only.
//              instead of the ring's 2(n-1).
//              two-shot ("twoshot"): a direct reduce-scatter (chunk p to rank p),  2(n-1)/n * count: mid-sized
//              then a direct all-gather of the reduced chunks. Two messages.      messages.
//   ReduceScatter: every rank sends block p of its input to rank p, which         each rank sends and receives
//              combines the n copies in rank order: twoshot's first half.         (n-1)/n of the input.
//   Reduce:    every rank sends its buffer to root, which combines them in        root receives (n-1)*count.
//              rank order.
// Every reduction here combines the ranks' operands in rank order, (x0 op x1) op x2 ..., whatever the count,
// channels or slicing: the order LOOM_DETERMINISTIC keeps to (docs/RELIABILITY.md), which the verifier proves
// (VerifyOptions::rankOrder). fp16 and bf16 partial sums stay in fp32 (wideScratch) and are rounded once.
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

// Combines the n operands of one region in rank order, (x0 op x1) op x2 ..., so that every rank computing it
// gets the same bits: this rank's operand is `in`, the others arrive from their ranks. Partial results go to
// `partial` (in place, the output is the rank's own input, still needed when its turn comes), held in the type's
// partial type (RankPlan::wideScratch: fp32 for fp16 and bf16, so that the sum is rounded once); the last
// combination writes `out`. Rank 0's operand starts the sum where it lies, so at 2 ranks rank 0 needs no
// scratch and each rank has one step: rank 0 combines its input with the message, rank 1 receives, then
// combines.
void combineInRankOrder(int n, int rank, Region in, Region partial, Region out, Lane* lane) {
  Region sum = in;  // where operands 0..p-1 are combined
  if (rank != 0) {
    lane->steps.push_back(recv(0, partial));
    sum = partial;
  }
  for (int p = 1; p < n; ++p) {
    Region to = p == n - 1 ? out : partial;
    lane->steps.push_back(p == rank ? reduce(sum, in, to) : recvReduce(p, sum, to));
    sum = to;
  }
  if (n == 1) lane->steps.push_back(copy(in, out));
}

// The scratch combineInRankOrder needs on `rank`: none at 2 ranks on rank 0, else one partial sum per element.
size_t rankOrderScratch(int n, int rank, size_t count) { return n > 2 || rank != 0 ? count : 0; }

// A direct reduction, one lane per channel: the sends of each peer's operand first (in place, an input is sent
// before the same slice of the buffer is overwritten: a lane runs its steps in order for every slice), then the
// combination of this rank's n operands in rank order into its output. operand(p, c, offset, part) is the
// region of this rank's input that rank p combines, on channel c, whose part of the output is [offset, +part).
template <typename Operand>
RankPlan buildSendThenCombine(const CollArgs& args, const char* name, Operand operand) {
  RankPlan plan = planShell(args, name);
  int n = args.nranks, rank = args.rank;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    Lane lane{c, {}};
    for (int p = 0; p < n; ++p)
      if (p != rank) lane.steps.push_back(send(p, operand(p, c, offset, part)));
    combineInRankOrder(n, rank, operand(rank, c, offset, part), scratch(offset, part), output(offset, part), &lane);
    plan.lanes.push_back(std::move(lane));
  }
  plan.scratchCount = rankOrderScratch(n, rank, args.count);
  plan.wideScratch = true;
  plan.reducedOutput = output(0, args.count);
  return plan;
}

}  // namespace

// One-shot: every peer combines this rank's whole part.
RankPlan buildDirectAllReduce(const CollArgs& args) {
  return buildSendThenCombine(args, "direct", [](int, int, size_t offset, size_t part) { return input(offset, part); });
}

// Two-shot: chunk p of every channel's part belongs to rank p. Phase 1 sends chunk p to rank p and combines the
// n copies of this rank's chunk in rank order (a direct reduce-scatter); phase 2 sends the result to every peer,
// then receives theirs (a direct all-gather). Every send is posted before the first receive, so that no transfer
// waits behind another peer's; each slice's round still receives before the next round sends, so no FIFO holds
// more than one round's slices. Two messages on the critical path instead of one, but each rank sends 2 (n-1)/n
// of the data instead of n-1 times it: for messages too large for one-shot and too small for the ring's 2(n-1)
// steps.
RankPlan buildTwoShotAllReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "twoshot");
  int n = args.nranks, rank = args.rank;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    auto chunk = [&](Buffer buffer, int p) {
      return Region{buffer, offset + partOffset(part, n, p), partCount(part, n, p)};
    };
    Lane lane{c, {}};
    for (int p = 0; p < n; ++p)
      if (p != rank) lane.steps.push_back(send(p, chunk(Buffer::kInput, p)));
    combineInRankOrder(n, rank, chunk(Buffer::kInput, rank), chunk(Buffer::kScratch, rank),
                       chunk(Buffer::kOutput, rank), &lane);
    lane.startPhase();
    for (int p = 0; p < n; ++p)
      if (p != rank) lane.steps.push_back(send(p, chunk(Buffer::kOutput, rank)));
    for (int p = 0; p < n; ++p)
      if (p != rank) lane.steps.push_back(recv(p, chunk(Buffer::kOutput, p)));
    plan.lanes.push_back(std::move(lane));
  }
  plan.scratchCount = rankOrderScratch(n, rank, args.count);
  plan.wideScratch = true;
  plan.reducedOutput = output(0, args.count);
  return plan;
}

// Direct reduce-scatter: rank p combines block p of every rank's input.
RankPlan buildDirectReduceScatter(const CollArgs& args) {
  return buildSendThenCombine(args, "direct", [&](int p, int c, size_t, size_t) {
    return blockPart(Buffer::kInput, args.count, args.nChannels, c, p);
  });
}

// Direct reduce: every other rank sends its buffer to root on each channel; root combines them in rank order.
RankPlan buildDirectReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "direct");
  int n = args.nranks, rank = args.rank, root = args.root;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    Lane lane{c, {}};
    if (rank == root)
      combineInRankOrder(n, rank, input(offset, part), scratch(offset, part), output(offset, part), &lane);
    else
      lane.steps.push_back(send(root, input(offset, part)));
    plan.lanes.push_back(std::move(lane));
  }
  if (rank == root) {
    plan.scratchCount = rankOrderScratch(n, rank, args.count);
    plan.wideScratch = true;
    plan.reducedOutput = output(0, args.count);
  }
  return plan;
}

RankPlan buildDirectGather(const CollArgs& args) { return buildStar(args, "direct", true, Buffer::kOutput, true); }
RankPlan buildDirectScatter(const CollArgs& args) { return buildStar(args, "direct", false, Buffer::kInput, true); }
RankPlan buildDirectBroadcast(const CollArgs& args) { return buildStar(args, "direct", false, Buffer::kInput, false); }

}  // namespace loom
