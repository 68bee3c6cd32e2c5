// Layer normalisation (kernels.h). Statistics are accumulated in double: rows are short, and the backward's two
// reductions are what fp32 loses most in.
#include <cmath>

#include "parallel/kernels/cpu/fast_math.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

constexpr double kLayernormEps = 1e-5;

LOOM_CPU_DISPATCH void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                        const float* bias, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<size_t>(i) * C;
    const double mu = laneSum(C, [x](size_t c) { return static_cast<double>(x[c]); }) / C;
    const double squares = laneSum(C, [x, mu](size_t c) { return (x[c] - mu) * (x[c] - mu); });
    const double r = 1.0 / std::sqrt(squares / C + kLayernormEps);
    float* y = out + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) y[c] = static_cast<float>((x[c] - mu) * r) * weight[c] + bias[c];
    mean[i] = static_cast<float>(mu);
    rstd[i] = static_cast<float>(r);
  }
}

// With xhat = (x - mean) * rstd and g = dout * weight:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight += dout * xhat; dbias += dout.
LOOM_CPU_DISPATCH void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                         const float* weight, const float* mean, const float* rstd, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const float* x = inp + static_cast<size_t>(i) * C;
    const float* dy = dout + static_cast<size_t>(i) * C;
    const double mu = mean[i], r = rstd[i];
    const double meanG = laneSum(C, [dy, weight](size_t c) { return static_cast<double>(dy[c]) * weight[c]; }) / C;
    const double meanGXhat =
        laneSum(C, [x, dy, weight, mu,
                    r](size_t c) { return static_cast<double>(dy[c]) * weight[c] * ((x[c] - mu) * r); }) /
        C;
    float* dx = dinp + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - mu) * r;
      const double g = static_cast<double>(dy[c]) * weight[c];
      dx[c] += static_cast<float>(r * (g - meanG - xhat * meanGXhat));
      dweight[c] += static_cast<float>(dy[c] * xhat);
      dbias[c] += dy[c];
    }
  }
}

}  // namespace loom::parallel::cpu
