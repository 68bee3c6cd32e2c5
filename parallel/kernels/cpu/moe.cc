// The mixture-of-experts layer's row movements (kernels.h): dispatch, combine and the gates' gradients.
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

void gatherRows(float* out, const float* inp, const int32_t* rows, const float* scales, int n, int C) {
  for (int i = 0; i < n; ++i) {
    const float* from = inp + static_cast<size_t>(rows[i]) * C;
    float* to = out + static_cast<size_t>(i) * C;
    const float factor = scales != nullptr ? scales[i] : 1.0f;
    for (int c = 0; c < C; ++c) to[c] = factor * from[c];
  }
}

void combineRows(float* out, const float* inp, const int32_t* slots, const float* gates, int tokens, int k, int C) {
  for (int t = 0; t < tokens; ++t) {
    float* to = out + static_cast<size_t>(t) * C;
    for (int c = 0; c < C; ++c) {
      float sum = 0;
      for (int j = 0; j < k; ++j) {
        const int32_t slot = slots[static_cast<size_t>(t) * k + j];
        if (slot < 0) continue;
        const float gate = gates != nullptr ? gates[static_cast<size_t>(t) * k + j] : 1.0f;
        sum += gate * inp[static_cast<size_t>(slot) * C + c];
      }
      to[c] += sum;
    }
  }
}

void rowDots(float* out, const float* a, const int32_t* rows, const float* b, int n, int C) {
  for (int i = 0; i < n; ++i) {
    const float* x = a + static_cast<size_t>(rows[i]) * C;
    const float* y = b + static_cast<size_t>(i) * C;
    double sum = 0;
    for (int c = 0; c < C; ++c) sum += static_cast<double>(x[c]) * y[c];
    out[i] = static_cast<float>(sum);
  }
}

}  // namespace loom::parallel::cpu
