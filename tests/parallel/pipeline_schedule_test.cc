// Pipeline schedules as data (parallel/pipeline/schedule.h): every schedule's plan is complete and runs to its end
// in the simulation, keeps its memory bound, and has the bubble its formula gives: (p - 1)/m for GPipe and 1F1B,
// (p - 1)/(v m) interleaved, and a third of 1F1B's for ZB-H1 when F, B and W cost the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "parallel/pipeline/schedule.h"

namespace loom::parallel::pipeline {
namespace {

constexpr Schedule kSchedules[] = {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1};

Plan planOf(Schedule schedule, int p, int m, int v = 1) {
  Plan plan;
  std::string error;
  EXPECT_TRUE(makePlan(schedule, p, m, v, &plan, &error)) << error;
  return plan;
}

Timeline run(const Plan& plan, const Costs& costs) {
  Timeline timeline;
  std::string error;
  EXPECT_TRUE(simulate(plan, costs, &timeline, &error)) << error;
  return timeline;
}

TEST(PipelineSchedule, EveryPlanRunsEachMicroBatchOnceInOrder) {
  for (Schedule schedule : kSchedules)
    for (int p : {2, 4})
      for (int m : {4, 8}) {
        const int v = schedule == Schedule::kInterleaved ? 2 : 1;
        const Plan plan = planOf(schedule, p, m, v);
        const std::string what =
            std::string(plan::scheduleName(schedule)) + " p=" + std::to_string(p) + " m=" + std::to_string(m);
        for (int s = 0; s < p; ++s) {
          std::map<std::pair<int, int>, int> forwardAt, backwardAt, weightAt;  // (micro-batch, chunk) -> position
          const std::vector<Action>& actions = plan.perStage[s];
          for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
            const Action& a = actions[i];
            auto& seen = a.op == Op::kForward ? forwardAt : a.op == Op::kBackward ? backwardAt : weightAt;
            if (a.op == Op::kForward || a.op == Op::kBackward || a.op == Op::kWeight) {
              EXPECT_TRUE(seen.emplace(std::make_pair(a.microBatch, a.chunk), i).second) << what << " twice";
            }
          }
          EXPECT_EQ(forwardAt.size(), static_cast<size_t>(m * v)) << what << " stage " << s;
          EXPECT_EQ(backwardAt.size(), static_cast<size_t>(m * v)) << what << " stage " << s;
          EXPECT_EQ(weightAt.size(), schedule == Schedule::kZbH1 ? static_cast<size_t>(m) : 0u) << what;
          for (const auto& [key, at] : backwardAt) EXPECT_LT(forwardAt[key], at) << what << ": B before its F";
          for (const auto& [key, at] : weightAt) EXPECT_LT(backwardAt[key], at) << what << ": W before its B";
        }
        run(plan, Costs{});
      }
}

TEST(PipelineSchedule, BubblesFollowTheFormulas) {
  for (int p : {2, 4, 8})
    for (int m : {4, 8, 16}) {
      for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B})
        EXPECT_NEAR(run(planOf(schedule, p, m), Costs{1, 2, 0}).bubble(), plan::bubbleFraction(schedule, p, m), 1e-12)
            << plan::scheduleName(schedule) << " p=" << p << " m=" << m;
      if (m % p == 0) {  // each of 2 chunks is half a stage's layers
        EXPECT_NEAR(run(planOf(Schedule::kInterleaved, p, m, 2), Costs{0.5, 1, 0}).bubble(),
                    plan::bubbleFraction(Schedule::kInterleaved, p, m, 2), 1e-12)
            << "interleaved p=" << p << " m=" << m;
      }
      // ZB-H1's third holds once the pipeline fills (m >= p); with fewer micro-batches the W's cannot fill it.
      const double oneF1B = run(planOf(Schedule::k1F1B, p, m), Costs{1, 1, 1}).bubble();
      const double zeroBubble = run(planOf(Schedule::kZbH1, p, m), Costs{1, 1, 1}).bubble();
      if (m >= p) {
        EXPECT_NEAR(zeroBubble, oneF1B / 3, 1e-12) << "zb-h1 p=" << p << " m=" << m;
        EXPECT_NEAR(zeroBubble, plan::bubbleFraction(Schedule::kZbH1, p, m), 1e-12) << "zb-h1 p=" << p << " m=" << m;
      } else {
        EXPECT_LT(zeroBubble, oneF1B) << "zb-h1 p=" << p << " m=" << m;
      }
    }
}

// 1F1B holds at most p - s micro-batches' activations on stage s (forwarded, not yet backward), GPipe all m; ZB-H1
// frees a micro-batch at its W and holds at most p, 1F1B's peak.
TEST(PipelineSchedule, MicroBatchesInFlightStayWithinTheScheduleBound) {
  const int p = 4, m = 8;
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kZbH1}) {
    const Plan plan = planOf(schedule, p, m);
    for (int s = 0; s < p; ++s) {
      int held = 0, peak = 0;
      for (const Action& a : plan.perStage[s]) {
        if (a.op == Op::kForward) peak = std::max(peak, ++held);
        if (a.op == (schedule == Schedule::kZbH1 ? Op::kWeight : Op::kBackward)) --held;
      }
      const int bound = schedule == Schedule::kGpipe ? m : schedule == Schedule::k1F1B ? p - s : p;
      EXPECT_LE(peak, bound) << plan::scheduleName(schedule) << " stage " << s;
    }
  }
}

TEST(PipelineSchedule, BadShapesAndStuckPlansAreRefusedByName) {
  Plan plan;
  std::string error;
  EXPECT_FALSE(makePlan(Schedule::kInterleaved, 4, 6, 2, &plan, &error));
  EXPECT_NE(error.find("not a multiple of 4"), std::string::npos) << error;
  EXPECT_FALSE(makePlan(Schedule::k1F1B, 2, 4, 2, &plan, &error));
  EXPECT_NE(error.find("one chunk per stage"), std::string::npos) << error;
  // Stage 0 waiting for a gradient before it sends the activation that would produce it.
  plan = planOf(Schedule::k1F1B, 2, 1);
  std::swap(plan.perStage[0][0], plan.perStage[0][2]);  // F, send, recv-gradient, B -> recv-gradient first
  Timeline timeline;
  EXPECT_FALSE(simulate(plan, Costs{}, &timeline, &error));
  EXPECT_NE(error.find("waits forever"), std::string::npos) << error;
}

TEST(PipelineSchedule, TimelineShowsEveryStage) {
  const std::string text = run(planOf(Schedule::k1F1B, 2, 2), Costs{1, 2, 0}).render(2);
  EXPECT_NE(text.find("stage 0 |F0F1"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 1 |..F0B000"), std::string::npos) << text;
}

}  // namespace
}  // namespace loom::parallel::pipeline
