// Mixture of experts and expert parallelism (parallel/model/moe.h): the MoE model's gradients, load-balancing loss
// included, against central differences; moe-tiny trained with its experts spread over 2 and 4 expert-parallel
// ranks, alone and with data parallelism, and on an 8-rank ep2 x dp2 x pp2 mesh, against one rank over the same
// micro-batches (fp32, within 1e-5 relative over 10 steps), with tokens dropped over capacity along the way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "parallel/model/gpt.h"
#include "tests/parallel/training.h"

namespace loom::parallel {
namespace {

using runs::Training;

constexpr int kSteps = 10;

// The slope of `objective` in `value` by central differences, and whether it has one there: routing is piecewise
// constant, so where the step moves a token across an expert's or the capacity's boundary the objective jumps and
// the one-sided slopes disagree (by more than 5% of the slope, or of `floor` where the slope is smaller); such
// points are not checked.
struct Slope {
  double central;
  bool smooth;
};
template <typename Objective>
Slope slopeAt(float& value, float eps, double floor, Objective objective) {
  const float saved = value;
  const double here = objective();
  value = saved + eps;
  const double plus = objective();
  value = saved - eps;
  const double minus = objective();
  value = saved;
  const double central = (plus - minus) / (2.0 * eps), left = (here - minus) / eps, right = (plus - here) / eps;
  return {central, std::fabs(left - right) <= 0.05 * std::max(floor, std::fabs(central))};
}

GptConfig moeConfig() {
  GptConfig config;
  EXPECT_TRUE(GptConfig::preset("moe-tiny", &config));
  config.maxT = runs::kT;
  return config;
}

TEST(MixtureOfExperts, GradientsMatchCentralDifferences) {
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    GptConfig config{2, 2, 8, 4, 11};
    config.experts = 4;
    config.topk = 2;
    config.ffn = 12;
    config.capacityFactor = 0.75f;  // 6 of the 16 assignments of a layer kept per expert at most: some drop
    config.dropPolicy = policy;
    config.auxLossCoefficient = 1.0f;  // large, so that its gradient shows next to the model loss's
    Gpt model(config);
    model.initialise(5);
    float* params = model.params().f32();
    for (size_t i = 0; i < model.layout().total; ++i) params[i] *= 10.0f;
    const int B = 2, T = 4;
    std::vector<int32_t> tokens(B * T + 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % config.vocab);
    // The objective: the language model's loss and the load-balancing loss.
    auto objective = [&]() {
      const double loss = model.forward(tokens.data(), tokens.data() + 1, B, T);
      return loss + model.lastAuxLoss();
    };
    model.zeroGrads();
    objective();
    EXPECT_GT(model.lastAuxLoss(), 0.0f);
    model.backward();
    EXPECT_GT(model.assignmentsDropped(), 0) << "the capacity factor dropped nothing";
    const float* grads = model.grads().f32();
    const float eps = 1e-3f;
    int checked = 0, skipped = 0;
    for (const ParamRange& range : model.layout().params) {
      const size_t stride = std::max<size_t>(1, range.numel() / 8);
      size_t wrong = 0;
      for (size_t i = 0; i < range.numel(); i += stride) {
        const Slope slope = slopeAt(params[range.offset + i], eps, 1.0, objective);
        if (!slope.smooth) {
          ++skipped;
          continue;
        }
        ++checked;
        const double numeric = slope.central, analytic = grads[range.offset + i];
        // The losses are fp32: each difference carries about 1e-3 of rounding at this step.
        if (std::fabs(numeric - analytic) > 1e-3 + 2e-2 * std::fabs(numeric) && ++wrong <= 3)
          ADD_FAILURE() << dropPolicyName(policy) << ": " << range.name << " element " << i << ": backward " << analytic
                        << ", central difference " << numeric;
      }
      EXPECT_EQ(wrong, 0u) << range.name;
    }
    EXPECT_GT(checked, 100);
    EXPECT_LT(skipped, checked / 20) << "too many routing boundaries within the step";
  }
}

// The load-balancing loss's own gradient, apart from the model loss's: the gradients with the loss's coefficient
// minus those without it, against central differences of the loss alone (routing does not depend on it).
TEST(MixtureOfExperts, LoadBalancingGradientMatchesCentralDifferences) {
  GptConfig config{2, 2, 8, 4, 11};
  config.experts = 4;
  config.topk = 2;
  config.ffn = 12;
  config.auxLossCoefficient = 1.0f;
  GptConfig without = config;
  without.auxLossCoefficient = 0;
  Gpt model(config), plain(without);
  model.initialise(5);
  plain.initialise(5);
  const int B = 2, T = 4;
  std::vector<int32_t> tokens(B * T + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 5 + 1) % config.vocab);
  for (Gpt* m : {&model, &plain}) {
    m->zeroGrads();
    m->forward(tokens.data(), tokens.data() + 1, B, T);
    m->backward();
  }
  float* params = model.params().f32();
  const float eps = 1e-3f;
  double largest = 0;
  auto aux = [&]() {
    model.forward(tokens.data(), tokens.data() + 1, B, T);
    return static_cast<double>(model.lastAuxLoss());
  };
  for (const char* name :
       {"h.0.mlp.router.weight", "h.1.mlp.router.weight", "h.0.ln_2.weight", "h.0.attn.c_proj.weight"}) {
    const ParamRange& range = *model.layout().find(name);
    for (size_t i = 0; i < range.numel(); i += std::max<size_t>(1, range.numel() / 16)) {
      const Slope slope = slopeAt(params[range.offset + i], eps, 1e-2, aux);
      if (!slope.smooth) continue;
      const double numeric = slope.central;
      const double analytic = model.grads().f32()[range.offset + i] - plain.grads().f32()[range.offset + i];
      largest = std::max(largest, std::fabs(numeric));
      EXPECT_NEAR(analytic, numeric, 2e-4 + 2e-2 * std::fabs(numeric)) << name << " element " << i;
    }
  }
  EXPECT_GT(largest, 1e-3) << "the load-balancing loss has no gradient to check";
}

TEST(MixtureOfExperts, LayoutSpreadsExpertsOverTheirRanks) {
  const GptConfig config = moeConfig();
  const GptLayout whole = GptLayout::of(config), half = GptLayout::of(config, 1, {}, 2, 1);
  ASSERT_NE(whole.find("h.1.mlp.experts.3.c_proj.bias"), nullptr);
  EXPECT_EQ(half.find("h.1.mlp.experts.1.c_fc.weight"), nullptr);
  ASSERT_NE(half.find("h.1.mlp.experts.3.c_fc.weight"), nullptr);
  EXPECT_TRUE(half.find("h.1.mlp.experts.3.c_fc.weight")->expert);
  EXPECT_FALSE(half.find("h.1.mlp.router.weight")->expert);
  // Each expert holds 2 C F + F + C parameters; rank 1 of 2 holds half of them.
  const size_t perExpert = 2 * 128 * 256 + 256 + 128;
  EXPECT_EQ(whole.total - half.total, size_t{2} * 2 * perExpert);
  int expertUnits = 0;
  for (bool expert : half.expertUnit) expertUnits += expert;
  EXPECT_EQ(expertUnits, config.layers);
}

runs::Run expertRun(int nranks, int ep) {
  runs::Run run;
  run.nranks = nranks;
  run.ep = ep;
  run.steps = kSteps;
  run.config = moeConfig();
  return run;
}

// One rank over each data-parallel rank's micro-batches in turn: a micro-batch's capacity counts the same tokens.
Training oneRank(int micro) {
  runs::Run run = expertRun(1, 1);
  run.micro = micro;
  return runs::train(run);
}

TEST(ExpertParallel, MatchesOneRankAtTwoAndFourRanks) {
  for (int ep : {2, 4}) {
    const Training single = oneRank(ep);
    const Training run = runs::train(expertRun(ep, ep));
    runs::expectSameTraining(run, single, 1e-5, "ep " + std::to_string(ep));
    EXPECT_GT(run.dropped, 0) << "no token was dropped over capacity";
  }
}

// The forward dispatch through loom's expert dispatch (loom_ep.h), in both modes: the same rows reach the same
// experts in the same order, so training is bitwise the same as over loomAllToAllv, drops included.
TEST(ExpertParallel, ExpertDispatchTrainsExactlyAsAllToAllv) {
  for (int ep : {2, 4}) {
    const Training reference = runs::train(expertRun(ep, ep));
    for (ExpertDispatch dispatch : {ExpertDispatch::kEpNormal, ExpertDispatch::kEpLowLatency}) {
      runs::Run run = expertRun(ep, ep);
      run.config.expertDispatch = dispatch;
      const Training trained = runs::train(run);
      const std::string what = std::string(expertDispatchName(dispatch)) + " at ep " + std::to_string(ep);
      EXPECT_EQ(trained.losses, reference.losses) << what;
      EXPECT_EQ(trained.params, reference.params) << what;
      EXPECT_EQ(trained.dropped, reference.dropped) << what;
    }
  }
}

TEST(ExpertParallel, CombinedWithDataParallelism) {
  const Training single = oneRank(4);
  runs::expectSameTraining(runs::train(expertRun(4, 2)), single, 1e-5, "ep 2 x edp 2");
}

// Without expert parallelism the experts are ordinary units: ZeRO shards them like the rest.
TEST(MixtureOfExperts, EveryZeroStageMatchesOneRank) {
  const Training single = oneRank(2);
  for (runs::Strategy strategy : {runs::Strategy::kZero1, runs::Strategy::kZero2, runs::Strategy::kZero3}) {
    runs::Run run = expertRun(2, 1);
    run.strategy = strategy;
    runs::expectSameTraining(runs::train(run), single, 1e-5,
                             "moe-tiny, ZeRO-" + std::to_string(static_cast<int>(strategy)));
  }
}

TEST(ExpertParallel, CombinedWithDataAndPipelineParallelismOnEightRanks) {
  runs::Run run = expertRun(8, 2);
  run.pp = 2;
  run.micro = 2;  // 2 sequences per data-parallel rank, in 2 micro-batches
  const Training single = oneRank(8);
  runs::expectSameTraining(runs::train(run), single, 1e-5, "ep2 x dp2 x pp2");
}

}  // namespace
}  // namespace loom::parallel
