// The reference GPT on the CPU (parallel/model/gpt.h): its layout (GPT-2 small's parameter count), the loss at
// initialisation (about ln V), every parameter's gradient against central differences of the loss on a small
// model, and a few AdamW steps on one batch driving the loss down.
#include "parallel/model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel {
namespace {

std::vector<int32_t> sequence(size_t n, int vocab, uint32_t seed) {
  std::vector<int32_t> tokens(n);
  uint32_t state = seed;
  for (auto& token : tokens) {
    state = state * 1664525u + 1013904223u;
    token = static_cast<int32_t>((state >> 8) % vocab);
  }
  return tokens;
}

TEST(Gpt, LayoutHasGpt2SmallsParameterCountAndContiguousUnits) {
  GptConfig config;
  ASSERT_TRUE(GptConfig::preset("gpt2-124m", &config));
  GptLayout layout = GptLayout::of(config);
  EXPECT_EQ(layout.total, 124439808u);  // GPT-2 small, output head tied to the token embedding
  ASSERT_EQ(layout.unitBegin.size(), static_cast<size_t>(config.layers) + 3);
  EXPECT_EQ(layout.unitBegin.front(), 0u);
  EXPECT_EQ(layout.unitBegin.back(), layout.total);
  size_t next = 0;
  for (const ParamRange& range : layout.params) {
    EXPECT_EQ(range.offset, next) << range.name;
    next += range.numel();
  }
  EXPECT_FALSE(GptConfig::preset("gpt-huge", &config));
  EXPECT_EQ((GptConfig{2, 3, 100, 8, 16}.check()), "channels 100 is not divisible by heads 3");
}

TEST(Gpt, InitialLossIsAboutLnV) {
  GptConfig config;
  ASSERT_TRUE(GptConfig::preset("gpt-tiny", &config));
  Gpt model(config);
  model.initialise(1);
  const int B = 2, T = 32;
  std::vector<int32_t> tokens = sequence(B * T + 1, config.vocab, 7);
  float loss = model.forward(tokens.data(), tokens.data() + 1, B, T);
  EXPECT_NEAR(loss, std::log(static_cast<float>(config.vocab)), 0.1f);
}

TEST(Gpt, GradientsMatchCentralDifferences) {
  const GptConfig config{2, 2, 8, 4, 11};
  Gpt model(config);
  model.initialise(3);
  // Larger weights than GPT-2's 0.02, so that every path carries a gradient well above fp32's noise.
  float* params = model.params().f32();
  for (size_t i = 0; i < model.layout().total; ++i) params[i] *= 10.0f;
  const int B = 2, T = 4;
  std::vector<int32_t> tokens = sequence(B * T + 1, config.vocab, 11);
  model.zeroGrads();
  model.forward(tokens.data(), tokens.data() + 1, B, T);
  model.backward();
  const float* grads = model.grads().f32();
  const float eps = 3e-3f;
  for (const ParamRange& range : model.layout().params) {
    const size_t stride = std::max<size_t>(1, range.numel() / 12);
    size_t wrong = 0;
    for (size_t i = 0; i < range.numel(); i += stride) {
      float& value = params[range.offset + i];
      const float saved = value;
      auto lossAt = [&](float offset) {
        value = saved + offset;
        return static_cast<double>(model.forward(tokens.data(), tokens.data() + 1, B, T));
      };
      // The five-point central difference: its truncation error is O(eps^4), so eps can be large enough that
      // fp32's rounding of the loss (which differs with the BLAS kernels the CPU gets) stays well below the
      // gradient.
      const double numeric = (8.0 * (lossAt(eps) - lossAt(-eps)) - (lossAt(2 * eps) - lossAt(-2 * eps))) / (12.0 * eps);
      value = saved;
      const double analytic = grads[range.offset + i];
      if (std::fabs(numeric - analytic) > 5e-4 + 2e-2 * std::fabs(numeric) && ++wrong <= 3)
        ADD_FAILURE() << range.name << " element " << i << ": backward " << analytic << ", central difference "
                      << numeric;
    }
    EXPECT_EQ(wrong, 0u) << range.name;
  }
}

TEST(Gpt, AdamWStepsOnOneBatchLowerTheLoss) {
  GptConfig config;
  ASSERT_TRUE(GptConfig::preset("gpt-tiny", &config));
  Gpt model(config);
  model.initialise(5);
  const int B = 2, T = 16;
  std::vector<int32_t> tokens = sequence(B * T + 1, config.vocab, 13);
  const size_t n = model.layout().total;
  std::vector<float> m(n), v(n);
  float first = 0, last = 0;
  for (int step = 1; step <= 20; ++step) {
    model.zeroGrads();
    last = model.forward(tokens.data(), tokens.data() + 1, B, T);
    if (step == 1) first = last;
    model.backward();
    cpu::adamwUpdate(model.params().f32(), model.grads().f32(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f,
                     step);
  }
  EXPECT_LT(last, 0.5f * first) << "first loss " << first << ", after 20 steps " << last;
}

}  // namespace
}  // namespace loom::parallel
