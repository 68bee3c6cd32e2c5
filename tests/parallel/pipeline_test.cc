// Pipeline parallelism against one rank: every schedule at 2 and 4 stages with 4 and 8 micro-batches trains the
// same model as one rank over the same global batch (fp32, within 1e-5 relative over 10 steps), alone and combined
// with tensor and data parallelism; each schedule keeps the micro-batches in flight its design says; and a measured
// timeline respects the plan's dependencies.
#include <gtest/gtest.h>

#include <string>

#include "parallel/plan/accounting.h"
#include "tests/parallel/training.h"

namespace loom::parallel {
namespace {

using plan::Schedule;
using runs::Training;

// Eight layers (every schedule at 4 stages with 2 chunks), small enough for 4 ranks on 2 cores.
GptConfig deepConfig() { return GptConfig{8, 4, 32, runs::kT, 64}; }

constexpr int kSteps = 10;

runs::Run pipelined(const GptConfig& config, int stages, int micro, Schedule schedule) {
  runs::Run run;
  run.nranks = stages;
  run.pp = stages;
  run.micro = micro;
  run.schedule = schedule;
  run.chunks = schedule == Schedule::kInterleaved ? 2 : 1;
  run.steps = kSteps;
  run.config = config;
  return run;
}

Training oneRank(const GptConfig& config, int micro) {
  runs::Run run;
  run.micro = micro;
  run.steps = kSteps;
  run.config = config;
  return runs::train(run);
}

TEST(PipelineParallel, EveryScheduleMatchesOneRank) {
  for (int micro : {4, 8}) {
    const Training single = oneRank(deepConfig(), micro);
    for (int stages : {2, 4})
      for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1}) {
        const std::string what = std::string(plan::scheduleName(schedule)) + ", p " + std::to_string(stages) + ", m " +
                                 std::to_string(micro);
        const Training run = runs::train(pipelined(deepConfig(), stages, micro, schedule));
        runs::expectSameTraining(run, single, 1e-5, what);
      }
  }
}

TEST(PipelineParallel, StageZeroHoldsTheMicroBatchesItsScheduleKeepsInFlight) {
  const int stages = 4, micro = 8;
  const Training gpipe = runs::train(pipelined(deepConfig(), stages, micro, Schedule::kGpipe));
  const Training oneF1B = runs::train(pipelined(deepConfig(), stages, micro, Schedule::k1F1B));
  const Training zb = runs::train(pipelined(deepConfig(), stages, micro, Schedule::kZbH1));
  EXPECT_EQ(gpipe.inFlight, micro);
  EXPECT_EQ(oneF1B.inFlight, stages);
  EXPECT_EQ(zb.inFlight, stages);  // ZB-H1 in 1F1B's memory
  EXPECT_EQ(static_cast<double>(oneF1B.inFlight), plan::microBatchesInFlight(Schedule::k1F1B, stages, micro));
  // The activations kept scale with the slots.
  EXPECT_EQ(gpipe.activationBytes * stages, oneF1B.activationBytes * micro);
}

TEST(PipelineParallel, CombinedWithTensorAndDataParallelOnEightRanks) {
  const GptConfig config = runs::smallConfig();  // gpt-tiny
  const Training single = oneRank(config, 4);
  for (runs::Strategy strategy : {runs::Strategy::kDdp, runs::Strategy::kZero1}) {
    runs::Run run = pipelined(config, 2, 2, Schedule::k1F1B);
    run.nranks = 8;
    run.tp = 2;
    run.micro = 2;  // 4 sequences per data-parallel rank in 2 micro-batches: 4 micro-batches of 2 over both
    run.strategy = strategy;
    run.sequenceParallel = strategy == runs::Strategy::kZero1;
    runs::expectSameTraining(
        runs::train(run), single, 1e-5,
        "dp2 x tp2 x pp2, " + std::string(strategy == runs::Strategy::kDdp ? "DDP" : "ZeRO-1 + SP"));
  }
}

TEST(PipelineParallel, MeasuredTimelineFollowsThePlan) {
  runs::Run run = pipelined(deepConfig(), 2, 4, Schedule::kZbH1);
  run.steps = 2;
  run.timeline = true;
  const Training trained = runs::train(run);
  const pipeline::Timeline& timeline = trained.timeline;
  ASSERT_EQ(timeline.spans.size(), 2u * 3 * 4);  // F, B and W of 4 micro-batches on 2 stages
  auto find = [&](int stage, pipeline::Op op, int micro) {
    for (const pipeline::Span& span : timeline.spans)
      if (span.stage == stage && span.action.op == op && span.action.microBatch == micro) return span;
    ADD_FAILURE() << "no " << pipeline::opName(op) << micro << " on stage " << stage;
    return pipeline::Span{};
  };
  for (int i = 0; i < 4; ++i) {
    // Stage 1's forward needs stage 0's output, stage 0's backward stage 1's input gradient.
    EXPECT_GE(find(1, pipeline::Op::kForward, i).start, find(0, pipeline::Op::kForward, i).end);
    EXPECT_GE(find(0, pipeline::Op::kBackward, i).start, find(1, pipeline::Op::kBackward, i).end);
    EXPECT_GE(find(0, pipeline::Op::kWeight, i).start, find(0, pipeline::Op::kBackward, i).end);
  }
  for (const pipeline::Span& span : timeline.spans) EXPECT_LT(span.start, span.end);
  EXPECT_GT(timeline.bubble(), 0.0);
  const std::string chart = timeline.render(1, timeline.makespan / 120);
  EXPECT_NE(chart.find("stage 1 |"), std::string::npos) << chart;
}

}  // namespace
}  // namespace loom::parallel
