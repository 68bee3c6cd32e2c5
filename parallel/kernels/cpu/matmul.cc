// Linear layers through BLAS (kernels.h): one sgemm per product, row-major, the weight used transposed as PyTorch's
// [out, in] layout asks.
#include <cblas.h>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel::cpu {

void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) out[static_cast<size_t>(i) * OC + o] = bias[o];
    beta = 1.0f;
  }
  // out[N, OC] = inp[N, C] x weight^T[C, OC] (+ out)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC) {
  // dinp[N, C] += dout[N, OC] x weight[OC, C]
  if (dinp != nullptr)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  // dweight[OC, C] += dout^T[OC, N] x inp[N, C]
  if (dweight != nullptr)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr)
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) dbias[o] += dout[static_cast<size_t>(i) * OC + o];
}

}  // namespace loom::parallel::cpu
