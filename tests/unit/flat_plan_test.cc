// Flat plans (algorithms/flat_plan.h), the form a CUDA kernel walks: for every algorithm of every collective, a
// flattened plan holds the same steps, and BasicLaneCursor walks each of its lanes through the same (step,
// round) sequence as the host executor's LaneCursor walks the original. Also the slice arithmetic every executor
// shares (plan.h), and what the GPU executor assumes of every plan: no two lanes share a connection end.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/flat_plan.h"

namespace loom {
namespace {

TEST(SliceArithmetic, SlicesCoverAStepExactlyOnce) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{1} << 20})
    for (size_t slice : {size_t{1}, size_t{3}, size_t{64}, size_t{4096}}) {
      size_t slices = sliceCount(count, slice), next = 0;
      for (size_t round = 0; round < slices + 2; ++round) {
        size_t lo = 0, hi = 0;
        sliceBounds(count, slice, round, &lo, &hi);
        if (round >= slices) {
          EXPECT_EQ(lo, hi) << "past the last slice, count " << count << " slice " << slice;
          continue;
        }
        EXPECT_EQ(lo, next);
        EXPECT_GT(hi, lo);
        EXPECT_LE(hi - lo, slice);
        next = hi;
      }
      EXPECT_EQ(next, count);
    }
  // No overflow near the top of size_t.
  size_t lo = 0, hi = 0;
  sliceBounds(SIZE_MAX - 5, SIZE_MAX / 2, 1, &lo, &hi);
  EXPECT_EQ(lo, SIZE_MAX / 2);
  EXPECT_EQ(hi, SIZE_MAX - 5);
}

bool sameStep(const Step& a, const Step& b) { return std::memcmp(&a, &b, sizeof(Step)) == 0; }

// The (step, round) pairs a cursor visits, with slices of `slice` elements.
template <class View>
std::vector<std::pair<size_t, size_t>> walk(const View& lane, size_t slice) {
  auto slicesOf = [slice](const Step& step) { return sliceCount(step.count(), slice); };
  BasicLaneCursor<View> cursor;
  std::vector<std::pair<size_t, size_t>> order;
  for (cursor.start(lane, slicesOf); !cursor.done(); cursor.next(slicesOf))
    order.emplace_back(cursor.step(), cursor.round());
  return order;
}

TEST(FlatPlan, EveryAlgorithmFlattensToTheSameWalk) {
  const Collective kCollectives[] = {Collective::kAllReduce, Collective::kBroadcast, Collective::kReduce,
                                     Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll,
                                     Collective::kGather,    Collective::kScatter,       Collective::kBarrier};
  int plans = 0, lanes = 0;
  for (Collective collective : kCollectives)
    for (const std::string& algorithm : algorithmsFor(collective))
      for (int nranks : {2, 3, 4, 8})
        for (int nChannels : {1, 2})
          for (size_t count : {size_t{1}, size_t{1000}, size_t{100003}})
            for (int rank = 0; rank < nranks; ++rank) {
              CollArgs args;
              args.collective = collective;
              args.nranks = nranks;
              args.rank = rank;
              args.root = 1 % nranks;
              args.count = count;
              args.nChannels = nChannels;
              RankPlan plan;
              if (!buildPlan(args, algorithm, &plan)) continue;  // not for this shape (a torus of 3 ranks...)
              FlatPlan flat = flatten(plan);
              FlatPlanView view = flat.view();
              const std::string where = std::string(collectiveName(collective)) + " " + algorithm + " ranks " +
                                        std::to_string(nranks) + " rank " + std::to_string(rank) + " channels " +
                                        std::to_string(nChannels) + " count " + std::to_string(count);
              ASSERT_EQ(view.laneCount, plan.lanes.size()) << where;
              EXPECT_EQ(view.inputCount, plan.inputCount) << where;
              EXPECT_EQ(view.outputCount, plan.outputCount) << where;
              EXPECT_EQ(view.scratchCount, plan.scratchCount) << where;
              for (uint32_t l = 0; l < view.laneCount; ++l) {
                const Lane& lane = plan.lanes[l];
                FlatLaneView flatLane = view.lane(l);
                ASSERT_EQ(flatLane.channel, lane.channel) << where;
                ASSERT_EQ(flatLane.stepCount, lane.steps.size()) << where;
                for (size_t s = 0; s < lane.steps.size(); ++s)
                  ASSERT_TRUE(sameStep(flatLane.stepAt(s), lane.steps[s])) << where << " lane " << l << " step " << s;
                for (size_t slice : {size_t{1} << 30, size_t{997}, size_t{64}})
                  ASSERT_EQ(walk(flatLane, slice), walk(lane, slice)) << where << " lane " << l << " slice " << slice;
                ++lanes;
              }
              ++plans;
            }
  EXPECT_GT(plans, 1000);
  EXPECT_GT(lanes, plans);
}

// The GPU executor runs a plan's lanes at once, one CTA each, and each end of a connection (channel, peer,
// direction) keeps its counters in one place: two lanes using one end would race on them. The host executor
// interleaves lanes in one thread and would not notice, so this holds every plan to it.
TEST(FlatPlan, NoTwoLanesShareAConnectionEnd) {
  int plans = 0;
  for (Collective collective : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                                Collective::kBroadcast, Collective::kReduce, Collective::kAllToAll})
    for (const std::string& algorithm : algorithmsFor(collective))
      for (int nranks = 1; nranks <= 9; ++nranks)
        for (int nChannels : {1, 2, 4})
          for (int rank = 0; rank < nranks; ++rank) {
            CollArgs args;
            args.collective = collective;
            args.nranks = nranks;
            args.rank = rank;
            args.root = nranks - 1;
            args.count = 10007;
            args.nChannels = nChannels;
            RankPlan plan;
            if (!buildPlan(args, algorithm, &plan)) continue;
            ++plans;
            std::set<std::tuple<int, int, bool>> taken;  // (channel, peer, sends) of the lanes before
            for (const Lane& lane : plan.lanes) {
              std::set<std::tuple<int, int, bool>> mine;
              for (const Step& step : lane.steps) {
                if (actionReceives(step.action)) mine.insert({lane.channel, step.recvPeer, false});
                if (actionSends(step.action)) mine.insert({lane.channel, step.sendPeer, true});
              }
              for (const auto& end : mine)
                EXPECT_TRUE(taken.insert(end).second)
                    << collectiveName(collective) << " " << algorithm << " ranks " << nranks << " channels "
                    << nChannels << " rank " << rank << ": channel " << std::get<0>(end) << " peer "
                    << std::get<1>(end) << (std::get<2>(end) ? " (send)" : " (receive)") << " in two lanes";
            }
          }
  EXPECT_GT(plans, 1000);
}

}  // namespace
}  // namespace loom
