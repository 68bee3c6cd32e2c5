// Element-wise kernels (kernels.h): GELU, the residual sum, scaling.
#include <cmath>

#include "parallel/kernels/cpu/fast_math.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// tanh through one exp: 1 - 2 / (1 + e^2u), right at both ends and within about 1e-7 of tanhf everywhere
// (absolute: near 0 the subtraction loses tanh's relative precision, which 1 + tanh in GELU never had).
inline float fastTanh(float u) { return 1.0f - 2.0f / (1.0f + vectorExp(2.0f * u)); }

}  // namespace

// gelu(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
LOOM_CPU_DISPATCH void geluForward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + fastTanh(u));
  }
}

// gelu'(x) = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
LOOM_CPU_DISPATCH void geluBackward(float* dinp, const float* dout, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float th = fastTanh(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
  }
}

LOOM_CPU_DISPATCH void residualForward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

LOOM_CPU_DISPATCH void residualBackward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

LOOM_CPU_DISPATCH void scale(float* values, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) values[i] *= factor;
}

}  // namespace loom::parallel::cpu
