// Fused softmax and cross-entropy (kernels.h). The softmax subtracts the row's maximum and sums in double.
#include <algorithm>
#include <cmath>

#include "parallel/kernels/cpu/fast_math.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

LOOM_CPU_DISPATCH void crossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets,
                                           int N, int V) {
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<size_t>(i) * V;
    float* p = probs + static_cast<size_t>(i) * V;
    float maxLogit = row[0];
    for (int v = 1; v < V; ++v) maxLogit = std::max(maxLogit, row[v]);
    for (int v = 0; v < V; ++v) p[v] = vectorExp(row[v] - maxLogit);  // apart from the sum, so it vectorizes
    const double sum = laneSum(V, [p](size_t v) { return static_cast<double>(p[v]); });
    const float inverse = static_cast<float>(1.0 / sum);
    for (int v = 0; v < V; ++v) p[v] *= inverse;
    // -log softmax computed from the logits, not from the rounded probability.
    losses[i] = static_cast<float>(std::log(sum) - (row[targets[i]] - maxLogit));
  }
}

LOOM_CPU_DISPATCH void crossEntropyBackward(float* dlogits, const float* dlosses, const float* probs,
                                            const int32_t* targets, int N, int V) {
  for (int i = 0; i < N; ++i) {
    const float* p = probs + static_cast<size_t>(i) * V;
    float* d = dlogits + static_cast<size_t>(i) * V;
    for (int v = 0; v < V; ++v) d[v] += (p[v] - (v == targets[i] ? 1.0f : 0.0f)) * dlosses[i];
  }
}

LOOM_CPU_DISPATCH void crossEntropyMax(float* maxes, const float* logits, int N, int V) {
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<size_t>(i) * V;
    maxes[i] = *std::max_element(row, row + V);
  }
}

LOOM_CPU_DISPATCH void crossEntropyExp(float* sums, float* targetLogits, float* probs, const float* logits,
                                       const float* maxes, const int32_t* targets, int N, int V) {
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<size_t>(i) * V;
    float* p = probs + static_cast<size_t>(i) * V;
    const float maxLogit = maxes[i];
    for (int v = 0; v < V; ++v) p[v] = vectorExp(row[v] - maxLogit);
    sums[i] = static_cast<float>(laneSum(V, [p](size_t v) { return static_cast<double>(p[v]); }));
    targetLogits[i] = targets[i] >= 0 && targets[i] < V ? row[targets[i]] - maxLogit : 0.0f;
  }
}

LOOM_CPU_DISPATCH void crossEntropyFinish(float* losses, float* probs, const float* sums, const float* targetLogits,
                                          int N, int V) {
  for (int i = 0; i < N; ++i) {
    float* p = probs + static_cast<size_t>(i) * V;
    const float inverse = 1.0f / sums[i];
    for (int v = 0; v < V; ++v) p[v] *= inverse;
    losses[i] = std::log(sums[i]) - targetLogits[i];
  }
}

}  // namespace loom::parallel::cpu
