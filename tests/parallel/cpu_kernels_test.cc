// The parallel layer's CPU kernels (parallel/kernels/cpu/kernels.h): forwards against plain double-precision
// references, and every backward against central differences of its forward: for a random r, the gradient of
// L = sum(out * r) with respect to each input the backward returns. PyTorch's own check of the whole model is
// tests/parallel/torch_reference.py.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "parallel/kernels/cpu/kernels.h"
#include "tests/common/random_values.h"

namespace loom::parallel::cpu {
namespace {

using loomtest::randomValues;

double dot(const std::vector<float>& a, const std::vector<float>& r) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * r[i];
  return sum;
}

// Holds analytic[j] to (loss(x + eps e_j) - loss(x - eps e_j)) / 2 eps for every j (or 150 spread over x).
void expectGradient(const std::string& what, std::vector<float>& x, const std::vector<float>& analytic,
                    const std::function<double()>& loss, float eps = 1e-2f, double tolerance = 2e-3) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const size_t stride = std::max<size_t>(1, x.size() / 150);
  size_t wrong = 0;
  for (size_t j = 0; j < x.size(); j += stride) {
    const float saved = x[j];
    x[j] = saved + eps;
    const double plus = loss();
    x[j] = saved - eps;
    const double minus = loss();
    x[j] = saved;
    const double numeric = (plus - minus) / (2.0 * eps);
    if (std::fabs(numeric - analytic[j]) > tolerance * (1.0 + std::fabs(numeric))) {
      if (++wrong <= 5)
        ADD_FAILURE() << what << " element " << j << ": backward " << analytic[j] << ", central difference " << numeric;
    }
  }
  EXPECT_EQ(wrong, 0u) << what;
}

TEST(CpuKernels, MatmulMatchesTheReferenceAndItsGradients) {
  for (bool withBias : {true, false}) {
    const int N = 6, C = 5, OC = 7;
    std::vector<float> inp = randomValues(N * C, 1), weight = randomValues(OC * C, 2), bias = randomValues(OC, 3);
    std::vector<float> out(N * OC);
    matmulForward(out.data(), inp.data(), weight.data(), withBias ? bias.data() : nullptr, N, C, OC);
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) {
        double want = withBias ? bias[o] : 0.0;
        for (int c = 0; c < C; ++c) want += static_cast<double>(inp[i * C + c]) * weight[o * C + c];
        EXPECT_NEAR(out[i * OC + o], want, 1e-5) << i << "," << o;
      }
    std::vector<float> r = randomValues(N * OC, 4);
    std::vector<float> dinp(N * C), dweight(OC * C), dbias(OC);
    matmulBackward(dinp.data(), dweight.data(), withBias ? dbias.data() : nullptr, r.data(), inp.data(), weight.data(),
                   N, C, OC);
    auto loss = [&]() {
      matmulForward(out.data(), inp.data(), weight.data(), withBias ? bias.data() : nullptr, N, C, OC);
      return dot(out, r);
    };
    expectGradient("matmul dinp", inp, dinp, loss);
    expectGradient("matmul dweight", weight, dweight, loss);
    if (withBias) expectGradient("matmul dbias", bias, dbias, loss);
  }
}

TEST(CpuKernels, BackwardsAccumulate) {
  const int N = 3, C = 4, OC = 2;
  std::vector<float> inp = randomValues(N * C, 5), weight = randomValues(OC * C, 6), dout = randomValues(N * OC, 7);
  std::vector<float> once(N * C), twice(N * C), dweight(OC * C), dbias(OC);
  matmulBackward(once.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  for (int pass = 0; pass < 2; ++pass)
    matmulBackward(twice.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), N, C, OC);
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
}

TEST(CpuKernels, EmbeddingAddsTokenAndPositionAndScattersGradients) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 4};  // token 1 twice in one sequence, 4 in both
  std::vector<float> wte = randomValues(V * C, 8), wpe = randomValues(T * C, 9), out(B * T * C);
  embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        EXPECT_FLOAT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c]);
  std::vector<float> r = randomValues(B * T * C, 10), dwte(V * C), dwpe(T * C);
  embeddingBackward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C, V);
  auto loss = [&]() {
    embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, r);
  };
  expectGradient("embedding dwte", wte, dwte, loss);
  expectGradient("embedding dwpe", wpe, dwpe, loss);
}

TEST(CpuKernels, LayernormNormalisesAndItsGradients) {
  const int N = 4, C = 16;
  std::vector<float> inp = randomValues(N * C, 11, 2.0f), weight = randomValues(C, 12), bias = randomValues(C, 13);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  for (int i = 0; i < N; ++i) {
    double mu = 0, var = 0;
    for (int c = 0; c < C; ++c) mu += inp[i * C + c];
    mu /= C;
    for (int c = 0; c < C; ++c) var += (inp[i * C + c] - mu) * (inp[i * C + c] - mu);
    var /= C;
    for (int c = 0; c < C; ++c)
      EXPECT_NEAR(out[i * C + c], (inp[i * C + c] - mu) / std::sqrt(var + 1e-5) * weight[c] + bias[c], 1e-5);
  }
  std::vector<float> r = randomValues(N * C, 14), dinp(N * C), dweight(C), dbias(C);
  layernormBackward(dinp.data(), dweight.data(), dbias.data(), r.data(), inp.data(), weight.data(), mean.data(),
                    rstd.data(), N, C);
  auto loss = [&]() {
    layernormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return dot(out, r);
  };
  expectGradient("layernorm dinp", inp, dinp, loss);
  expectGradient("layernorm dweight", weight, dweight, loss);
  expectGradient("layernorm dbias", bias, dbias, loss);
}

TEST(CpuKernels, AttentionIsCausalAndItsGradients) {
  const int B = 2, T = 5, C = 8, NH = 2;
  std::vector<float> inp = randomValues(B * T * 3 * C, 15), out(B * T * C), att(B * NH * T * T);
  attentionForward(out.data(), att.data(), inp.data(), B, T, C, NH);
  const int headSize = C / NH;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        // The reference: softmax of the scaled scores of keys 0..t, in double.
        std::vector<double> scores(t + 1);
        double maxScore = -1e300, sum = 0;
        for (int s = 0; s <= t; ++s) {
          double score = 0;
          for (int i = 0; i < headSize; ++i)
            score += static_cast<double>(inp[(b * T + t) * 3 * C + h * headSize + i]) *
                     inp[(b * T + s) * 3 * C + C + h * headSize + i];
          scores[s] = score / std::sqrt(static_cast<double>(headSize));
          maxScore = std::max(maxScore, scores[s]);
        }
        for (int s = 0; s <= t; ++s) sum += std::exp(scores[s] - maxScore);
        for (int s = 0; s < T; ++s) {
          const double want = s <= t ? std::exp(scores[s] - maxScore) / sum : 0.0;
          EXPECT_NEAR(att[((b * NH + h) * T + t) * T + s], want, 1e-6) << b << h << t << s;
        }
        for (int i = 0; i < headSize; ++i) {
          double want = 0;
          for (int s = 0; s <= t; ++s)
            want += std::exp(scores[s] - maxScore) / sum * inp[(b * T + s) * 3 * C + 2 * C + h * headSize + i];
          EXPECT_NEAR(out[(b * T + t) * C + h * headSize + i], want, 1e-5);
        }
      }
  std::vector<float> r = randomValues(B * T * C, 16), dinp(B * T * 3 * C);
  attentionBackward(dinp.data(), r.data(), inp.data(), att.data(), B, T, C, NH);
  auto loss = [&]() {
    attentionForward(out.data(), att.data(), inp.data(), B, T, C, NH);
    return dot(out, r);
  };
  expectGradient("attention dinp", inp, dinp, loss);
}

TEST(CpuKernels, GeluResidualAndTheirGradients) {
  const size_t n = 64;
  std::vector<float> inp = randomValues(n, 17, 2.0f), out(n), r = randomValues(n, 18), dinp(n);
  geluForward(out.data(), inp.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    EXPECT_NEAR(out[i], 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))), 1e-6);
  }
  geluBackward(dinp.data(), r.data(), inp.data(), n);
  expectGradient(
      "gelu dinp", inp, dinp,
      [&]() {
        geluForward(out.data(), inp.data(), n);
        return dot(out, r);
      },
      1e-3f);
  std::vector<float> a = randomValues(n, 19), b = randomValues(n, 20), da(n), db(n);
  residualForward(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(out[i], a[i] + b[i]);
  residualBackward(da.data(), db.data(), r.data(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(da[i], r[i]);
    EXPECT_FLOAT_EQ(db[i], r[i]);
  }
}

TEST(CpuKernels, CrossEntropyMatchesLogSoftmaxAndItsGradients) {
  const int N = 5, V = 11;
  std::vector<float> logits = randomValues(N * V, 21, 3.0f), probs(N * V), losses(N);
  std::vector<int32_t> targets = {0, 10, 3, 3, 7};
  crossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  for (int i = 0; i < N; ++i) {
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[i * V + v]));
    EXPECT_NEAR(losses[i], std::log(sum) - logits[i * V + targets[i]], 1e-5);
    for (int v = 0; v < V; ++v) EXPECT_NEAR(probs[i * V + v], std::exp(logits[i * V + v]) / sum, 1e-6);
  }
  std::vector<float> dlosses = randomValues(N, 22), dlogits(N * V);
  crossEntropyBackward(dlogits.data(), dlosses.data(), probs.data(), targets.data(), N, V);
  expectGradient("cross-entropy dlogits", logits, dlogits, [&]() {
    crossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    return dot(losses, dlosses);
  });
}

// The vocabulary-parallel steps over two halves of the columns, combined as the all-reduces would, give the fused
// kernel's losses and probabilities.
TEST(CpuKernels, VocabularyParallelCrossEntropyMatchesTheFusedOne) {
  const int N = 5, V = 12, half = V / 2;
  std::vector<float> logits = randomValues(N * V, 25, 3.0f), probs(N * V), losses(N);
  const std::vector<int32_t> targets = {0, 11, 5, 6, 7};
  crossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  std::vector<float> parts[2], partProbs[2], maxes[2], sums[2], targetLogits[2];
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < N; ++i)
      parts[r].insert(parts[r].end(), logits.begin() + i * V + r * half, logits.begin() + i * V + (r + 1) * half);
    partProbs[r].resize(N * half);
    maxes[r].resize(N), sums[r].resize(N), targetLogits[r].resize(N);
    crossEntropyMax(maxes[r].data(), parts[r].data(), N, half);
  }
  std::vector<float> maxAll(N), sumAll(N), targetAll(N), lossesParallel(N);
  for (int i = 0; i < N; ++i) maxAll[i] = std::max(maxes[0][i], maxes[1][i]);
  for (int r = 0; r < 2; ++r) {
    std::vector<int32_t> local(targets);
    for (int32_t& target : local) target = target >= r * half && target < (r + 1) * half ? target - r * half : -1;
    crossEntropyExp(sums[r].data(), targetLogits[r].data(), partProbs[r].data(), parts[r].data(), maxAll.data(),
                    local.data(), N, half);
  }
  for (int i = 0; i < N; ++i) {
    sumAll[i] = sums[0][i] + sums[1][i];
    targetAll[i] = targetLogits[0][i] + targetLogits[1][i];
  }
  for (int r = 0; r < 2; ++r)
    crossEntropyFinish(lossesParallel.data(), partProbs[r].data(), sumAll.data(), targetAll.data(), N, half);
  for (int i = 0; i < N; ++i) {
    EXPECT_NEAR(lossesParallel[i], losses[i], 1e-6) << "row " << i;
    for (int v = 0; v < V; ++v)
      EXPECT_NEAR(partProbs[v / half][i * half + v % half], probs[i * V + v], 1e-7) << "row " << i << " column " << v;
  }
}

TEST(CpuKernels, AdamWFollowsTheFormulaOverSteps) {
  const size_t n = 9;
  std::vector<float> params = randomValues(n, 23), m(n), v(n);
  std::vector<double> p(params.begin(), params.end()), md(n), vd(n);
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (int step = 1; step <= 5; ++step) {
    std::vector<float> grads = randomValues(n, 100 + step);
    adamwUpdate(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, wd, step);
    for (size_t i = 0; i < n; ++i) {
      p[i] -= lr * wd * p[i];
      md[i] = beta1 * md[i] + (1 - beta1) * grads[i];
      vd[i] = beta2 * vd[i] + (1 - beta2) * grads[i] * grads[i];
      p[i] -= lr * (md[i] / (1 - std::pow(beta1, step))) / (std::sqrt(vd[i] / (1 - std::pow(beta2, step))) + eps);
      EXPECT_NEAR(params[i], p[i], 1e-5) << "step " << step << " element " << i;
    }
  }
}

TEST(CpuKernels, ClippingScalesToTheMaximumNorm) {
  std::vector<float> grads = {3.0f, 4.0f};  // norm 5
  const double squares = sumOfSquares(grads.data(), grads.size());
  EXPECT_DOUBLE_EQ(squares, 25.0);
  EXPECT_FLOAT_EQ(clipFactor(squares, 10.0f), 1.0f);
  const float factor = clipFactor(squares, 1.0f);
  scale(grads.data(), grads.size(), factor);
  EXPECT_NEAR(std::sqrt(sumOfSquares(grads.data(), grads.size())), 1.0, 1e-6);
}

}  // namespace
}  // namespace loom::parallel::cpu
