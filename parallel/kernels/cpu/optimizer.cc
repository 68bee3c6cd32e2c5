// AdamW and gradient-norm clipping (kernels.h), as torch.optim.AdamW and torch.nn.utils.clip_grad_norm_ compute them.
#include <algorithm>
#include <cmath>

#include "parallel/kernels/cpu/fast_math.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

// p -= lr * wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps).
LOOM_CPU_DISPATCH void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float learningRate,
                                   float beta1, float beta2, float eps, float weightDecay, int step, float gradScale) {
  const float correction1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float correction2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * gradScale;
    params[i] -= learningRate * weightDecay * params[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float mHat = m[i] / correction1;
    const float vHat = v[i] / correction2;
    params[i] -= learningRate * mHat / (std::sqrt(vHat) + eps);
  }
}

LOOM_CPU_DISPATCH double sumOfSquares(const float* grads, size_t n) {
  return laneSum(n, [grads](size_t i) { return static_cast<double>(grads[i]) * grads[i]; });
}

float clipFactor(double globalSumOfSquares, float maxNorm) {
  return static_cast<float>(std::min(1.0, maxNorm / (std::sqrt(globalSumOfSquares) + 1e-6)));
}

}  // namespace loom::parallel::cpu
