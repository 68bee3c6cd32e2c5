// Pairwise all-to-all: at step j every rank sends its block for rank+j and receives the block from rank-j, so
// that at any moment each rank sends to one peer and receives from another, and no rank is everyone's target.
// Sends and receives sit on two lanes, so a slow peer delays only its own transfers; the copy of the rank's own
// block leads the receive lane, so that it goes slice by slice beside the receives instead of as one long copy
// while the peers wait for their messages to be taken. n-1 steps; each rank sends
// (n-1)/n of its input. AllToAllv is the same with per-peer counts and displacements (zero blocks are skipped on
// both sides, so counts must agree pairwise). With C channels every block is cut into C parts.
#include "algorithms/builders.h"

namespace loom {
namespace {

int mod(int value, int n) { return ((value % n) + n) % n; }

using BlockFn = Region (*)(const CollArgs&, Buffer, int peer);

Region uniformBlock(const CollArgs& args, Buffer buffer, int peer) {
  return {buffer, static_cast<size_t>(peer) * args.count, args.count};
}

Region variableBlock(const CollArgs& args, Buffer buffer, int peer) {
  if (buffer == Buffer::kInput) return {buffer, args.sendDispls[peer], args.sendCounts[peer]};
  return {buffer, args.recvDispls[peer], args.recvCounts[peer]};
}

Region channelPart(Region block, int nChannels, int channel) {
  return {block.buffer, block.offset + partOffset(block.count, nChannels, channel),
          partCount(block.count, nChannels, channel)};
}

RankPlan buildPairwise(const CollArgs& args, BlockFn block) {
  RankPlan plan = planShell(args, "pairwise");
  int n = args.nranks, rank = args.rank;
  for (int c = 0; c < args.nChannels; ++c) {
    Lane sends{c, {}}, recvs{c, {}};
    Region own = channelPart(block(args, Buffer::kInput, rank), args.nChannels, c);
    if (own.count > 0)
      recvs.steps.push_back(copy(own, channelPart(block(args, Buffer::kOutput, rank), args.nChannels, c)));
    for (int j = 1; j < n; ++j) {
      int to = mod(rank + j, n), from = mod(rank - j, n);
      Region out = channelPart(block(args, Buffer::kInput, to), args.nChannels, c);
      Region in = channelPart(block(args, Buffer::kOutput, from), args.nChannels, c);
      if (out.count > 0) sends.steps.push_back(send(to, out));
      if (in.count > 0) recvs.steps.push_back(recv(from, in));
    }
    for (Lane* lane : {&sends, &recvs})
      if (!lane->steps.empty()) plan.lanes.push_back(std::move(*lane));
  }
  return plan;
}

}  // namespace

RankPlan buildPairwiseAllToAll(const CollArgs& args) { return buildPairwise(args, uniformBlock); }
RankPlan buildPairwiseAllToAllv(const CollArgs& args) { return buildPairwise(args, variableBlock); }

}  // namespace loom
