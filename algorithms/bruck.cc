// Bruck AllGather and its mirror, a log-step ReduceScatter: ceil(log2 n) steps at any rank count, for small
// messages at many ranks, where the ring's n-1 steps of latency dominate.
//
// AllGather. Before phase k rank r holds the blocks r, r+1, ..., r+2^k-1 (mod n). In phase k it sends the
// first m = min(2^k, n-2^k) of them to r - 2^k and receives blocks r+2^k ... r+2^k+m-1 from r + 2^k, so after
// ceil(log2 n) phases it holds all n. Blocks land straight in their places in the output (a run of blocks that
// wraps past block n-1 goes as two messages), so no final rotation is needed. Each phase reads blocks the
// phase before received: one phase each (plan.h). Bytes sent per rank: (n-1)/n of the output, as in the ring.
//
// ReduceScatter runs the AllGather backwards: every block's partial sums flow to its owner down the same
// spanning trees the AllGather uses to spread it. Phases k = K-1 ... 0: rank r sends its partials of blocks
// r+2^k ... r+2^k+m-1 to r + 2^k and adds the partials of blocks r ... r+m-1 from r - 2^k into its own. A
// partial is the rank's input block until it first receives for it; then it lives in scratch (block q at
// q*count), and the last phase (m = 1: block r alone) writes the output. Messages split where a run wraps and
// where the sender's or the receiver's partials change between input and scratch; both ends know all three
// points, so their messages match. Bytes sent per rank: (n-1)/n of the input.
//
// With C channels each lane handles channel c's part of every block, and runs of blocks go block by block.
#include <algorithm>
#include <vector>

#include "algorithms/builders.h"

namespace loom {
namespace {

int mod(int value, int n) { return ((value % n) + n) % n; }

// Calls emit(first, blocks) for each piece of the run of `m` blocks starting at block `first` (mod n), cut at
// the wrap past block n-1, at the run offsets in `cuts`, and into single blocks when there are several channels.
template <class Emit>
void forEachPiece(int n, int first, int m, std::vector<int> cuts, int nChannels, Emit&& emit) {
  if (first + m > n) cuts.push_back(n - first);
  cuts.push_back(0);
  cuts.push_back(m);
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    int begin = std::max(0, cuts[i]), end = std::min(m, cuts[i + 1]);
    if (begin >= end) continue;
    if (nChannels == 1) {
      emit(mod(first + begin, n), end - begin);
    } else {
      for (int j = begin; j < end; ++j) emit(mod(first + j, n), 1);
    }
  }
}

// Blocks [q, q + blocks) of a buffer of per-rank blocks, on channel c (blocks == 1 when there are several).
Region blocksOf(Buffer buffer, const CollArgs& args, int c, int q, int blocks) {
  Region region = blockPart(buffer, args.count, args.nChannels, c, q);
  region.count += static_cast<size_t>(blocks - 1) * args.count;
  return region;
}

// Appends a phase's sends and receives alternately, so that no rank has more messages in flight than the
// peer has taken: all sends first would deadlock once a run has more pieces than a FIFO has slots.
void pushAlternately(const std::vector<Step>& sends, const std::vector<Step>& recvs, Lane* lane) {
  for (size_t i = 0; i < std::max(sends.size(), recvs.size()); ++i) {
    if (i < sends.size()) lane->steps.push_back(sends[i]);
    if (i < recvs.size()) lane->steps.push_back(recvs[i]);
  }
}

int phasesFor(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

}  // namespace

RankPlan buildBruckAllGather(const CollArgs& args) {
  RankPlan plan = planShell(args, "bruck");
  int n = args.nranks, rank = args.rank;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    Lane lane{c, {}};
    auto out = [&](int q, int blocks) { return blocksOf(Buffer::kOutput, args, c, q, blocks); };
    Region in = input(partOffset(args.count, args.nChannels, c), part);
    // In place the copy's source and destination coincide; the executor skips it.
    lane.steps.push_back(copy(in, out(rank, 1)));
    for (int k = 0; k < phasesFor(n); ++k) {
      int distance = 1 << k, m = std::min(distance, n - distance);
      int to = mod(rank - distance, n), from = mod(rank + distance, n);
      std::vector<Step> sends, recvs;
      if (k == 0) {
        sends.push_back(send(to, in));  // phase 0 sends the input itself, so it need not wait for the copy
      } else {
        forEachPiece(n, rank, m, {}, args.nChannels,
                     [&](int q, int blocks) { sends.push_back(send(to, out(q, blocks))); });
      }
      forEachPiece(n, from, m, {}, args.nChannels,
                   [&](int q, int blocks) { recvs.push_back(recv(from, out(q, blocks))); });
      if (k > 0) lane.startPhase();
      pushAlternately(sends, recvs, &lane);
    }
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

RankPlan buildBruckReduceScatter(const CollArgs& args) {
  RankPlan plan = planShell(args, "bruck");
  int n = args.nranks, rank = args.rank;
  plan.scratchCount = n > 1 ? static_cast<size_t>(n) * args.count : 0;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t part = partCount(args.count, args.nChannels, c);
    if (part == 0) continue;
    Lane lane{c, {}};
    Region out = output(partOffset(args.count, args.nChannels, c), part);
    if (n == 1) {
      lane.steps.push_back(copy(blocksOf(Buffer::kInput, args, c, 0, 1), out));
      plan.lanes.push_back(std::move(lane));
      continue;
    }
    // A rank's partials of the blocks at run offsets [0, held) from itself are in scratch; the rest in its input.
    int held = 0;
    auto partial = [&](int q, int blocks, bool inScratch) {
      return blocksOf(inScratch ? Buffer::kScratch : Buffer::kInput, args, c, q, blocks);
    };
    for (int k = phasesFor(n) - 1; k >= 0; --k) {
      int distance = 1 << k, m = std::min(distance, n - distance);
      int to = mod(rank + distance, n), from = mod(rank - distance, n);
      // The run's cuts in the receiver's offsets: where the sender's scratch ends (its offsets are `distance`
      // more) and where the receiver's does.
      std::vector<int> cuts{held - distance, held};
      std::vector<Step> sends, recvs;
      forEachPiece(n, to, m, cuts, args.nChannels, [&](int q, int blocks) {
        bool inScratch = mod(q - rank, n) < held;
        sends.push_back(send(to, partial(q, blocks, inScratch)));
      });
      forEachPiece(n, rank, m, cuts, args.nChannels, [&](int q, int blocks) {
        bool inScratch = mod(q - rank, n) < held;
        Region dst = k == 0 ? out : partial(q, blocks, true);
        recvs.push_back(recvReduce(from, partial(q, blocks, inScratch), dst));
      });
      lane.startPhase();
      pushAlternately(sends, recvs, &lane);
      held = std::max(held, m);
    }
    plan.lanes.push_back(std::move(lane));
  }
  plan.reducedOutput = output(0, args.count);
  return plan;
}

}  // namespace loom
