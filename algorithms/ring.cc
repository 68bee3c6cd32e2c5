// Ring algorithms: ranks form the ring 0 -> 1 -> ... -> n-1 -> 0; each rank receives from `prev` and sends to
// `next`. With C channels the data is cut into C parts and each channel runs its own ring over its part.
//
// AllReduce (reduce-scatter then all-gather over n chunks of the part; chunk q = the q-th of n near-equal pieces):
//   step 0          send chunk[rank] to next
//   steps 1..n-2    recvReduceSend chunk[rank-j]: add my input, pass it on
//   step n-1        recvReduceCopySend chunk[rank+1]: the chunk is now complete; keep it and pass it on
//   steps n..2n-3   recvCopySend chunk[rank+1-j]: keep and pass on completed chunks
//   step 2n-2       recv chunk[rank+2]: the last missing chunk
//   2(n-1) steps; each rank sends 2(n-1)/n of the data.
// ReduceScatter: the first half, ending in recvReduce into the output: n-1 steps, (n-1)/n of the input each.
// AllGather: the second half, starting from this rank's input: n-1 steps, (n-1)/n of the output each.
// Broadcast: a chain from root around the ring, pipelined by slices: n-1 sends in all, count per rank.
// Reduce: a chain ending at root (root+1 starts, each rank adds its input): n-1 sends, count per rank.
#include "algorithms/builders.h"

namespace loom {
namespace {

int mod(int value, int n) { return ((value % n) + n) % n; }

// The piece of `part` that chunk q of n covers, as an offset into the part's buffer.
struct Chunks {
  size_t partOffset;
  size_t partCount;
  int n;
  size_t offset(int q) const { return partOffset + loom::partOffset(partCount, n, mod(q, n)); }
  size_t count(int q) const { return loom::partCount(partCount, n, mod(q, n)); }
};

void ringAllReduceLane(const CollArgs& args, const Chunks& chunks, Lane* lane) {
  int n = args.nranks, rank = args.rank, next = mod(rank + 1, n), prev = mod(rank - 1, n);
  auto in = [&](int q) { return input(chunks.offset(q), chunks.count(q)); };
  auto out = [&](int q) { return output(chunks.offset(q), chunks.count(q)); };
  std::vector<Step>& steps = lane->steps;
  steps.push_back(send(next, in(rank)));
  for (int j = 1; j <= n - 2; ++j) steps.push_back(recvReduceSend(prev, in(rank - j), next));
  steps.push_back(recvReduceCopySend(prev, in(rank + 1), out(rank + 1), next));
  for (int j = 1; j <= n - 2; ++j) steps.push_back(recvCopySend(prev, out(rank + 1 - j), next));
  steps.push_back(recv(prev, out(rank + 2)));
}

}  // namespace

RankPlan buildRingAllReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "ring");
  for (int c = 0; c < args.nChannels; ++c) {
    Chunks chunks{partOffset(args.count, args.nChannels, c), partCount(args.count, args.nChannels, c), args.nranks};
    if (chunks.partCount == 0) continue;
    Lane lane{c, {}};
    if (args.nranks == 1) {
      lane.steps.push_back(
          copy(input(chunks.partOffset, chunks.partCount), output(chunks.partOffset, chunks.partCount)));
    } else {
      ringAllReduceLane(args, chunks, &lane);
    }
    plan.lanes.push_back(std::move(lane));
  }
  plan.reducedOutput = output(0, args.count);
  return plan;
}

RankPlan buildRingReduceScatter(const CollArgs& args) {
  RankPlan plan = planShell(args, "ring");
  int n = args.nranks, rank = args.rank, next = mod(rank + 1, n), prev = mod(rank - 1, n);
  for (int c = 0; c < args.nChannels; ++c) {
    size_t part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    auto in = [&](int q) { return blockPart(Buffer::kInput, args.count, args.nChannels, c, mod(q, n)); };
    Region out = output(partOffset(args.count, args.nChannels, c), part);
    Lane lane{c, {}};
    if (n == 1) {
      lane.steps.push_back(copy(in(0), out));
    } else {
      lane.steps.push_back(send(next, in(rank - 1)));
      for (int j = 1; j <= n - 2; ++j) lane.steps.push_back(recvReduceSend(prev, in(rank - 1 - j), next));
      lane.steps.push_back(recvReduce(prev, in(rank), out));
    }
    plan.lanes.push_back(std::move(lane));
  }
  plan.reducedOutput = output(0, args.count);
  return plan;
}

RankPlan buildRingAllGather(const CollArgs& args) {
  RankPlan plan = planShell(args, "ring");
  int n = args.nranks, rank = args.rank, next = mod(rank + 1, n), prev = mod(rank - 1, n);
  for (int c = 0; c < args.nChannels; ++c) {
    size_t part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    auto out = [&](int q) { return blockPart(Buffer::kOutput, args.count, args.nChannels, c, mod(q, n)); };
    Region in = input(partOffset(args.count, args.nChannels, c), part);
    Lane lane{c, {}};
    // In place the copy's source and destination coincide; the executor skips it.
    lane.steps.push_back(copy(in, out(rank)));
    if (n > 1) {
      lane.steps.push_back(send(next, in));
      for (int j = 1; j <= n - 2; ++j) lane.steps.push_back(recvCopySend(prev, out(rank - j), next));
      lane.steps.push_back(recv(prev, out(rank - (n - 1))));
    }
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

RankPlan buildRingBroadcast(const CollArgs& args) {
  RankPlan plan = planShell(args, "ring");
  int n = args.nranks, rank = args.rank, next = mod(rank + 1, n), prev = mod(rank - 1, n);
  int position = mod(rank - args.root, n);  // 0 at root, n-1 at the end of the chain
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), count = partCount(args.count, args.nChannels, c);
    if (count == 0) continue;
    Lane lane{c, {}};
    if (position == 0) {
      if (n > 1) lane.steps.push_back(send(next, input(offset, count)));
      lane.steps.push_back(copy(input(offset, count), output(offset, count)));
    } else if (position < n - 1) {
      lane.steps.push_back(recvCopySend(prev, output(offset, count), next));
    } else {
      lane.steps.push_back(recv(prev, output(offset, count)));
    }
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

RankPlan buildRingReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "ring");
  int n = args.nranks, rank = args.rank, next = mod(rank + 1, n), prev = mod(rank - 1, n);
  int position = mod(rank - args.root - 1, n);  // 0 at root+1 (starts the chain), n-1 at root
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), count = partCount(args.count, args.nChannels, c);
    if (count == 0) continue;
    Lane lane{c, {}};
    if (n == 1) {
      lane.steps.push_back(copy(input(offset, count), output(offset, count)));
    } else if (position == 0) {
      lane.steps.push_back(send(next, input(offset, count)));
    } else if (position < n - 1) {
      lane.steps.push_back(recvReduceSend(prev, input(offset, count), next));
    } else {
      lane.steps.push_back(recvReduce(prev, input(offset, count), output(offset, count)));
    }
    plan.lanes.push_back(std::move(lane));
  }
  if (rank == args.root) plan.reducedOutput = output(0, args.count);
  return plan;
}

}  // namespace loom
