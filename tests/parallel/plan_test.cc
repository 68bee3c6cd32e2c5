// The training arithmetic (parallel/plan/accounting.h) against the figures it is taken from: the ZeRO paper's table,
// Korthikanti et al.'s activation counts, the pipeline bubble, and the reference GPT's own parameter count.
#include <gtest/gtest.h>

#include "parallel/model/gpt.h"
#include "parallel/plan/accounting.h"

namespace loom::parallel::plan {
namespace {

// Rajbhandari et al., figure 1: 7.5B parameters on 64 GPUs with K = 12.
TEST(Plan, ZeroTableForSevenAndAHalfBillionParametersOnSixtyFourGpus) {
  const double psi = 7.5e9;
  const double expected[] = {120, 31.4, 16.6, 1.9};  // GB per GPU for stages 0 to 3, as the paper rounds them
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_NEAR(zeroModelStates(psi, 64, stage).total() / 1e9, expected[stage], 0.05) << "stage " << stage;
  EXPECT_DOUBLE_EQ(zeroModelStates(psi, 64, 0).total() / psi, 16.0) << "bytes per parameter";
  EXPECT_DOUBLE_EQ(zeroModelStates(psi, 64, 0, Precision::fp32()).total() / psi, 16.0) << "fp32: 4 + 4 + 8";
}

// Korthikanti et al., table 2, at s = 1024, b = 1, h = 768, a = 12 (GPT-2 small's layer).
TEST(Plan, ActivationBytesPerLayerFollowKorthikanti) {
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(1024, 1, 768, 12, 1, false, Recompute::kNone), 89653248);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(1024, 1, 768, 12, 4, false, Recompute::kNone), 28311552);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(1024, 1, 768, 12, 4, true, Recompute::kNone), 22413312);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(1024, 1, 768, 12, 4, true, Recompute::kSelective), 6684672);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(1024, 1, 768, 12, 1, false, Recompute::kFull), 2.0 * 1024 * 768);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(1024, 1, 768, 12, 4, true, Recompute::kFull), 2.0 * 1024 * 768 / 4);
}

TEST(Plan, PipelineBubble) {
  for (int p : {2, 4, 8})
    for (int m : {4, 8, 32}) {
      EXPECT_DOUBLE_EQ(bubbleFraction(Schedule::k1F1B, p, m), (p - 1.0) / m);
      EXPECT_DOUBLE_EQ(bubbleFraction(Schedule::kGpipe, p, m), (p - 1.0) / m);
      EXPECT_DOUBLE_EQ(bubbleFraction(Schedule::kInterleaved, p, m, 2), (p - 1.0) / (2.0 * m));
      EXPECT_NEAR(bubbleFraction(Schedule::kZbH1, p, m) / bubbleFraction(Schedule::k1F1B, p, m), 1.0 / 3, 1e-12);
    }
  EXPECT_DOUBLE_EQ(microBatchesInFlight(Schedule::kGpipe, 4, 16), 16);
  EXPECT_DOUBLE_EQ(microBatchesInFlight(Schedule::k1F1B, 4, 16), 4);
  EXPECT_DOUBLE_EQ(microBatchesInFlight(Schedule::k1F1B, 4, 2), 2);
}

TEST(Plan, ParameterCountsMatchTheModel) {
  ModelSpec gpt2;
  ASSERT_TRUE(ModelSpec::preset("gpt2-124m", &gpt2));
  EXPECT_DOUBLE_EQ(countParameters(gpt2).total, 124439808);
  for (const std::string& name : {std::string("gpt-tiny"), std::string("gpt2-124m")}) {
    ModelSpec spec;
    GptConfig config;
    ASSERT_TRUE(ModelSpec::preset(name, &spec));
    ASSERT_TRUE(GptConfig::preset(name, &config));
    EXPECT_DOUBLE_EQ(countParameters(spec).total, static_cast<double>(GptLayout::of(config).total)) << name;
  }
  ModelSpec moe;
  ASSERT_TRUE(ModelSpec::preset("moe-tiny", &moe));
  const ParameterCount count = countParameters(moe);
  EXPECT_GT(count.total, count.activePerToken) << "top-2 of 4 experts reads half the experts";
  ModelSpec gpt3;
  ASSERT_TRUE(ModelSpec::preset("gpt3-175b", &gpt3));
  EXPECT_NEAR(countParameters(gpt3).total / 1e9, 175, 0.5);
}

TEST(Plan, EstimateShardsAndChecksALayout) {
  ModelSpec gpt2;
  ModelSpec::preset("gpt2-124m", &gpt2);
  Layout single;
  const Estimate one = estimate(gpt2, single);
  ASSERT_EQ(one.problem, "");
  EXPECT_DOUBLE_EQ(one.paramsPerGpu, 124439808);
  EXPECT_DOUBLE_EQ(one.states.total(), 16.0 * 124439808);
  EXPECT_DOUBLE_EQ(one.activations, 12 * 89653248.0);
  EXPECT_EQ(one.communication.total(), 0);

  Layout data;
  data.dp = 4;
  data.zero = 3;
  const Estimate zero3 = estimate(gpt2, data);
  EXPECT_DOUBLE_EQ(zero3.states.total(), 4.0 * 124439808);
  EXPECT_DOUBLE_EQ(zero3.communication.dataParallel, 3 * 0.75 * 124439808 * 2);
  data.microBatches = 4;  // ZeRO-3 gathers twice and reduce-scatters once per micro-batch; ZeRO-2 reduce-scatters
  EXPECT_DOUBLE_EQ(estimate(gpt2, data).communication.dataParallel, 12 * 0.75 * 124439808 * 2);
  data.zero = 2;
  EXPECT_DOUBLE_EQ(estimate(gpt2, data).communication.dataParallel, 5 * 0.75 * 124439808 * 2);

  Layout tensor;
  tensor.tp = 4;
  tensor.sequenceParallel = true;
  tensor.recompute = Recompute::kSelective;
  EXPECT_DOUBLE_EQ(estimate(gpt2, tensor).activationsPerLayer, 6684672);

  Layout bad;
  bad.tp = 5;
  EXPECT_NE(estimate(gpt2, bad).problem.find("does not divide the 12 heads"), std::string::npos);
  bad.tp = 1;
  bad.pp = 5;
  EXPECT_NE(estimate(gpt2, bad).problem.find("layers"), std::string::npos);
}

}  // namespace
}  // namespace loom::parallel::plan
