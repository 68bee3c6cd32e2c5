// Causal multi-head self-attention (kernels.h), row by row: for query t of head h, the scores against keys 0..t, a
// softmax over them, and the weighted sum of the values. The backward recomputes nothing but the score gradient of
// one row at a time, in a buffer of T floats.
#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

void attentionForward(float* out, float* att, const float* inp, int B, int T, int C, int NH) {
  const int headSize = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(headSize));
  const size_t rowStride = static_cast<size_t>(3) * C;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* query = inp + (static_cast<size_t>(b) * T + t) * rowStride + h * headSize;
        float* probs = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        float maxScore = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          const float* key = inp + (static_cast<size_t>(b) * T + s) * rowStride + C + h * headSize;
          float dot = 0;
          for (int i = 0; i < headSize; ++i) dot += query[i] * key[i];
          probs[s] = dot * scale;
          maxScore = std::max(maxScore, probs[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; ++s) {
          probs[s] = std::exp(probs[s] - maxScore);
          sum += probs[s];
        }
        const float inverse = static_cast<float>(1.0 / sum);
        for (int s = 0; s <= t; ++s) probs[s] *= inverse;
        for (int s = t + 1; s < T; ++s) probs[s] = 0;
        float* y = out + (static_cast<size_t>(b) * T + t) * C + h * headSize;
        for (int i = 0; i < headSize; ++i) y[i] = 0;
        for (int s = 0; s <= t; ++s) {
          const float* value = inp + (static_cast<size_t>(b) * T + s) * rowStride + 2 * C + h * headSize;
          for (int i = 0; i < headSize; ++i) y[i] += probs[s] * value[i];
        }
      }
}

// For one row: dprobs[s] = dy . v[s]; dscores[s] = probs[s] * (dprobs[s] - sum_j probs[j] dprobs[j]);
// dq += scale * sum_s dscores[s] k[s]; dk[s] += scale * dscores[s] q; dv[s] += probs[s] dy.
void attentionBackward(float* dinp, const float* dout, const float* inp, const float* att, int B, int T, int C,
                       int NH) {
  const int headSize = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(headSize));
  const size_t rowStride = static_cast<size_t>(3) * C;
  std::vector<float> dprobs(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const size_t queryRow = (static_cast<size_t>(b) * T + t) * rowStride + h * headSize;
        const float* probs = att + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        const float* dy = dout + (static_cast<size_t>(b) * T + t) * C + h * headSize;
        double weighted = 0;
        for (int s = 0; s <= t; ++s) {
          const size_t keyRow = (static_cast<size_t>(b) * T + s) * rowStride + h * headSize;
          const float* value = inp + keyRow + 2 * C;
          float* dvalue = dinp + keyRow + 2 * C;
          float dot = 0;
          for (int i = 0; i < headSize; ++i) {
            dot += dy[i] * value[i];
            dvalue[i] += probs[s] * dy[i];
          }
          dprobs[s] = dot;
          weighted += static_cast<double>(probs[s]) * dot;
        }
        const float* query = inp + queryRow;
        float* dquery = dinp + queryRow;
        for (int s = 0; s <= t; ++s) {
          const size_t keyRow = (static_cast<size_t>(b) * T + s) * rowStride + h * headSize;
          const float* key = inp + keyRow + C;
          float* dkey = dinp + keyRow + C;
          const float dscore = probs[s] * (dprobs[s] - static_cast<float>(weighted)) * scale;
          for (int i = 0; i < headSize; ++i) {
            dquery[i] += dscore * key[i];
            dkey[i] += dscore * query[i];
          }
        }
      }
}

}  // namespace loom::parallel::cpu
