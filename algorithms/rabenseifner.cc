// Recursive halving and doubling AllReduce (Rabenseifner's algorithm): a reduce-scatter by recursive halving,
// then an all-gather by recursive doubling. Over p = 2^k ranks it takes 2 log2(p) steps, each rank sending
// 2 (p-1)/p of the data, the ring's volume in log2 steps instead of 2(p-1): the choice for small and mid-sized
// messages at many ranks.
//
// Ranks are numbered virtually so that a power of two p (the largest not above n) take part. The first 2*extra
// ranks (extra = n - p) pair up: even rank r folds its whole input into r + 1 (phase "fold") and sits out; odd
// rank r plays virtual rank r / 2. Ranks from 2*extra on play r - extra. Each rank's accumulator is its input
// until its first reduction, then its output.
//
// Halving, for mask = p/2, p/4, ..., 1: virtual rank v pairs with v ^ mask. Its block (the whole part at first)
// splits in two halves; v keeps the lower half when v & mask is 0, else the upper, sends the other half to its
// partner and adds the partner's copy of the kept half into its output. After log2(p) phases v holds one block
// of about count/p elements, fully reduced. Doubling retraces the halving backwards: at each mask v sends its
// block to the partner and receives the sibling block, so the block doubles until v holds the whole part.
// Finally ("unfold") every odd rank below 2*extra sends the result to the even rank that folded into it.
//
// Every exchange reads what the phase before wrote, at other offsets, so each is a phase of its own (plan.h).
// Steps per rank: 2 log2(p), plus 2 with extra ranks. Bytes sent per rank: 2 (p-1)/p of the data (plus the whole
// of it, once, on the folding and unfolding ranks). With C channels the data is cut into C parts, one lane each.
#include <vector>

#include "algorithms/builders.h"

namespace loom {
namespace {

struct Block {
  size_t offset, count;
};

void rabenseifnerLane(const CollArgs& args, Block part, Lane* lane) {
  int n = args.nranks, rank = args.rank;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int extra = n - p;
  std::vector<Step>& steps = lane->steps;
  auto in = [](Block b) { return input(b.offset, b.count); };
  auto out = [](Block b) { return output(b.offset, b.count); };
  if (rank < 2 * extra && rank % 2 == 0) {
    steps.push_back(send(rank + 1, in(part)));
    lane->startPhase();
    steps.push_back(recv(rank + 1, out(part)));
    return;
  }
  int v = rank < 2 * extra ? rank / 2 : rank - extra;
  auto real = [&](int virtualRank) { return virtualRank < extra ? 2 * virtualRank + 1 : virtualRank + extra; };
  bool reduced = false;  // whether the accumulator is the output yet
  if (rank < 2 * extra) {
    steps.push_back(recvReduce(rank - 1, in(part), out(part)));
    reduced = true;
  }
  // Halving: the blocks held after each phase, so that doubling can retrace them.
  std::vector<Block> held{part};
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    Block whole = held.back();
    Block lower{whole.offset, whole.count / 2}, upper{whole.offset + whole.count / 2, whole.count - whole.count / 2};
    bool keepLower = (v & mask) == 0;
    Block kept = keepLower ? lower : upper, given = keepLower ? upper : lower;
    int partner = real(v ^ mask);
    lane->startPhase();
    steps.push_back(send(partner, reduced ? out(given) : in(given)));
    steps.push_back(recvReduce(partner, reduced ? out(kept) : in(kept), out(kept)));
    reduced = true;
    held.push_back(kept);
  }
  if (!reduced) steps.push_back(copy(in(part), out(part)));  // one rank alone
  // Doubling: send the block held, receive its sibling within the block held one phase earlier.
  for (int mask = 1; mask <= p / 2; mask *= 2) {
    Block mine = held.back();
    held.pop_back();
    Block whole = held.back();
    Block sibling = mine.offset == whole.offset ? Block{mine.offset + mine.count, whole.count - mine.count}
                                                : Block{whole.offset, whole.count - mine.count};
    int partner = real(v ^ mask);
    lane->startPhase();
    steps.push_back(send(partner, out(mine)));
    steps.push_back(recv(partner, out(sibling)));
  }
  if (rank < 2 * extra) {
    lane->startPhase();
    steps.push_back(send(rank - 1, out(part)));
  }
}

}  // namespace

RankPlan buildRabenseifnerAllReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "rabenseifner");
  for (int c = 0; c < args.nChannels; ++c) {
    Block part{partOffset(args.count, args.nChannels, c), partCount(args.count, args.nChannels, c)};
    if (part.count == 0) continue;
    Lane lane{c, {}};
    rabenseifnerLane(args, part, &lane);
    plan.lanes.push_back(std::move(lane));
  }
  plan.reducedOutput = output(0, args.count);
  return plan;
}

}  // namespace loom
