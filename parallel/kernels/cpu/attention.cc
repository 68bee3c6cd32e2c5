// Causal multi-head self-attention (kernels.h), a head at a time with BLAS: the scores S = Q K^T / sqrt(hs) and the
// output Y = P V as GEMMs over the strided q, k and v columns of the QKV buffer, the causal softmax row by row in
// between. The products run over whole T x T blocks, the masked half included: at these sizes one GEMM beats a
// triangle of small loops. The backward needs one T x T buffer for dP.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/kernels/cpu/fast_math.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

LOOM_CPU_DISPATCH void attentionForward(float* out, float* att, const float* inp, int B, int T, int C, int NH) {
  const int headSize = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(headSize));
  const int rowStride = 3 * C;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* query = inp + static_cast<size_t>(b) * T * rowStride + h * headSize;
      const float* key = query + C;
      const float* value = query + 2 * C;
      float* probs = att + (static_cast<size_t>(b) * NH + h) * T * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, headSize, scale, query, rowStride, key, rowStride,
                  0.0f, probs, T);
      for (int t = 0; t < T; ++t) {
        float* row = probs + static_cast<size_t>(t) * T;
        const float maxScore = *std::max_element(row, row + t + 1);
        for (int s = 0; s <= t; ++s) row[s] = vectorExp(row[s] - maxScore);  // apart from the sum: it vectorizes
        const double sum = laneSum(t + 1, [row](size_t s) { return static_cast<double>(row[s]); });
        const float inverse = static_cast<float>(1.0 / sum);
        for (int s = 0; s <= t; ++s) row[s] *= inverse;
        std::fill(row + t + 1, row + T, 0.0f);
      }
      float* y = out + static_cast<size_t>(b) * T * C + h * headSize;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, headSize, T, 1.0f, probs, T, value, rowStride, 0.0f, y,
                  C);
    }
}

// dP = dY V^T; dS = P * (dP - rowsum(P * dP)) / sqrt(hs) (zero where P is, above the diagonal);
// dQ += dS K; dK += dS^T Q; dV += P^T dY.
LOOM_CPU_DISPATCH void attentionBackward(float* dinp, const float* dout, const float* inp, const float* att, int B,
                                         int T, int C, int NH) {
  const int headSize = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(headSize));
  const int rowStride = 3 * C;
  std::vector<float> scores(static_cast<size_t>(T) * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const size_t first = static_cast<size_t>(b) * T * rowStride + h * headSize;
      const float* query = inp + first;
      const float* key = query + C;
      const float* value = query + 2 * C;
      float* dquery = dinp + first;
      float* dkey = dquery + C;
      float* dvalue = dquery + 2 * C;
      const float* probs = att + (static_cast<size_t>(b) * NH + h) * T * T;
      const float* dy = dout + static_cast<size_t>(b) * T * C + h * headSize;
      float* d = scores.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, headSize, 1.0f, dy, C, value, rowStride, 0.0f, d, T);
      for (int t = 0; t < T; ++t) {
        const float* p = probs + static_cast<size_t>(t) * T;
        float* row = d + static_cast<size_t>(t) * T;
        const double weighted = laneSum(t + 1, [p, row](size_t s) { return static_cast<double>(p[s]) * row[s]; });
        for (int s = 0; s <= t; ++s) row[s] = p[s] * (row[s] - static_cast<float>(weighted)) * scale;
        std::fill(row + t + 1, row + T, 0.0f);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, headSize, T, 1.0f, d, T, key, rowStride, 1.0f, dquery,
                  rowStride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, headSize, T, 1.0f, d, T, query, rowStride, 1.0f, dkey,
                  rowStride);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, headSize, T, 1.0f, probs, T, dy, C, 1.0f, dvalue,
                  rowStride);
    }
}

}  // namespace loom::parallel::cpu
