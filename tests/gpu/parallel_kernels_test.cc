// The parallel layer's CUDA kernels (parallel/kernels/cuda) against their CPU references (parallel/kernels/cpu) on
// the same inputs: every forward and backward of the reference GPT's layers, AdamW, and the gradient norm. fp32 on
// both sides; tolerances allow for the different order of sums (GEMMs, warp reductions, atomics). Exits 77
// (skipped) when there is no CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "parallel/kernels/cpu/kernels.h"
#include "parallel/kernels/cuda/kernels.h"
#include "tests/common/random_values.h"

namespace loom::parallel {
namespace {

using loomtest::randomValues;

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }

// Device copies that free themselves.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& values) : size_(values.size()) {
    cudaMalloc(&data_, std::max<size_t>(size_, 1) * sizeof(T));
    cudaMemcpy(data_, values.data(), size_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceArray() { cudaFree(data_); }
  T* get() { return data_; }
  std::vector<T> read() const {
    std::vector<T> values(size_);
    cudaDeviceSynchronize();
    cudaMemcpy(values.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost);
    return values;
  }

 private:
  T* data_ = nullptr;
  size_t size_;
};

// max |a - b| / max(max |b|, 1e-3)
void expectClose(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance,
                 const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double worst = 0, scale = 1e-3;
  for (size_t i = 0; i < cpu.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
  }
  EXPECT_LE(worst / scale, tolerance) << what;
  const char* message = "";
  EXPECT_FALSE(cuda::launchFailed(&message)) << what << ": " << message;
}

constexpr int B = 2, T = 16, C = 64, NH = 4, V = 97, BT = B * T;

TEST(ParallelCudaKernels, MatmulMatchesTheCpu) {
  const int OC = 3 * C;
  std::vector<float> inp = randomValues(BT * C, 1), weight = randomValues(OC * C, 2), bias = randomValues(OC, 3);
  std::vector<float> dout = randomValues(BT * OC, 4), out(BT * OC), dinp(BT * C), dweight(OC * C), dbias(OC);
  cpu::matmulForward(out.data(), inp.data(), weight.data(), bias.data(), BT, C, OC);
  cpu::matmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), BT, C, OC);
  DeviceArray<float> dInp(inp), dWeight(weight), dBias(bias), dDout(dout), dOut(zeros(BT * OC)), dDinp(zeros(BT * C)),
      dDweight(zeros(OC * C)), dDbias(zeros(OC));
  cuda::matmulForward(dOut.get(), dInp.get(), dWeight.get(), dBias.get(), BT, C, OC, nullptr);
  cuda::matmulBackward(dDinp.get(), dDweight.get(), dDbias.get(), dDout.get(), dInp.get(), dWeight.get(), BT, C, OC,
                       nullptr);
  expectClose(dOut.read(), out, 1e-5, "matmul forward");
  expectClose(dDinp.read(), dinp, 1e-5, "matmul dinp");
  expectClose(dDweight.read(), dweight, 1e-5, "matmul dweight");
  expectClose(dDbias.read(), dbias, 1e-5, "matmul dbias");
}

TEST(ParallelCudaKernels, AttentionMatchesTheCpu) {
  std::vector<float> inp = randomValues(BT * 3 * C, 5), dout = randomValues(BT * C, 6);
  std::vector<float> out(BT * C), att(B * NH * T * T), dinp(BT * 3 * C);
  cpu::attentionForward(out.data(), att.data(), inp.data(), B, T, C, NH);
  cpu::attentionBackward(dinp.data(), dout.data(), inp.data(), att.data(), B, T, C, NH);
  DeviceArray<float> dInp(inp), dDout(dout), dOut(zeros(BT * C)), dAtt(zeros(att.size())), dScratch(zeros(att.size())),
      dDinp(zeros(BT * 3 * C));
  cuda::attentionForward(dOut.get(), dAtt.get(), dInp.get(), B, T, C, NH, nullptr);
  cuda::attentionBackward(dDinp.get(), dDout.get(), dInp.get(), dAtt.get(), dScratch.get(), B, T, C, NH, nullptr);
  expectClose(dAtt.read(), att, 1e-5, "attention probabilities");
  expectClose(dOut.read(), out, 1e-5, "attention forward");
  expectClose(dDinp.read(), dinp, 1e-4, "attention backward");
}

TEST(ParallelCudaKernels, LayernormEmbeddingAndPointwiseMatchTheCpu) {
  std::vector<float> inp = randomValues(BT * C, 7, 2.0f), weight = randomValues(C, 8), bias = randomValues(C, 9);
  std::vector<float> dout = randomValues(BT * C, 10), out(BT * C), mean(BT), rstd(BT), dinp(BT * C), dweight(C),
                     dbias(C);
  cpu::layernormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), BT, C);
  cpu::layernormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                         rstd.data(), BT, C);
  DeviceArray<float> dInp(inp), dWeight(weight), dBias(bias), dDout(dout), dOut(zeros(BT * C)), dMean(zeros(BT)),
      dRstd(zeros(BT)), dDinp(zeros(BT * C)), dDweight(zeros(C)), dDbias(zeros(C));
  cuda::layernormForward(dOut.get(), dMean.get(), dRstd.get(), dInp.get(), dWeight.get(), dBias.get(), BT, C, nullptr);
  cuda::layernormBackward(dDinp.get(), dDweight.get(), dDbias.get(), dDout.get(), dInp.get(), dWeight.get(),
                          dMean.get(), dRstd.get(), BT, C, nullptr);
  expectClose(dOut.read(), out, 1e-5, "layernorm forward");
  expectClose(dDinp.read(), dinp, 1e-4, "layernorm dinp");
  expectClose(dDweight.read(), dweight, 1e-4, "layernorm dweight");
  expectClose(dDbias.read(), dbias, 1e-4, "layernorm dbias");

  std::vector<int32_t> tokens(BT);
  for (int i = 0; i < BT; ++i) tokens[i] = (i * 7) % V;
  std::vector<float> wte = randomValues(V * C, 11), wpe = randomValues(T * C, 12), dwte(V * C), dwpe(T * C);
  cpu::embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  cpu::embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  DeviceArray<int32_t> dTokens(tokens);
  DeviceArray<float> dWte(wte), dWpe(wpe), dDwte(zeros(V * C)), dDwpe(zeros(T * C));
  cuda::embeddingForward(dOut.get(), dTokens.get(), dWte.get(), dWpe.get(), B, T, C, nullptr);
  cuda::embeddingBackward(dDwte.get(), dDwpe.get(), dDout.get(), dTokens.get(), B, T, C, nullptr);
  expectClose(dOut.read(), out, 1e-6, "embedding forward");
  expectClose(dDwte.read(), dwte, 1e-5, "embedding dwte");
  expectClose(dDwpe.read(), dwpe, 1e-5, "embedding dwpe");

  std::vector<float> gelu(BT * C), dgelu(BT * C);
  cpu::geluForward(gelu.data(), inp.data(), gelu.size());
  cpu::geluBackward(dgelu.data(), dout.data(), inp.data(), gelu.size());
  DeviceArray<float> dGelu(zeros(BT * C)), dDgelu(zeros(BT * C));
  cuda::geluForward(dGelu.get(), dInp.get(), gelu.size(), nullptr);
  cuda::geluBackward(dDgelu.get(), dDout.get(), dInp.get(), gelu.size(), nullptr);
  expectClose(dGelu.read(), gelu, 1e-5, "gelu forward");
  expectClose(dDgelu.read(), dgelu, 1e-5, "gelu backward");
}

TEST(ParallelCudaKernels, CrossEntropyAdamWAndNormMatchTheCpu) {
  std::vector<float> logits = randomValues(BT * V, 13, 3.0f), probs(BT * V), losses(BT), dlosses = randomValues(BT, 14);
  std::vector<int32_t> targets(BT);
  for (int i = 0; i < BT; ++i) targets[i] = (i * 13 + 5) % V;
  std::vector<float> dlogits(BT * V);
  cpu::crossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), BT, V);
  cpu::crossEntropyBackward(dlogits.data(), dlosses.data(), probs.data(), targets.data(), BT, V);
  DeviceArray<float> dLogits(logits), dProbs(zeros(BT * V)), dLosses(zeros(BT)), dDlosses(dlosses),
      dDlogits(zeros(BT * V));
  DeviceArray<int32_t> dTargets(targets);
  cuda::crossEntropyForward(dLosses.get(), dProbs.get(), dLogits.get(), dTargets.get(), BT, V, nullptr);
  cuda::crossEntropyBackward(dDlogits.get(), dDlosses.get(), dProbs.get(), dTargets.get(), BT, V, nullptr);
  expectClose(dLosses.read(), losses, 1e-5, "cross-entropy losses");
  expectClose(dProbs.read(), probs, 1e-5, "cross-entropy probabilities");
  expectClose(dDlogits.read(), dlogits, 1e-5, "cross-entropy backward");

  const size_t n = 4099;
  std::vector<float> params = randomValues(n, 15), m(n), v(n);
  DeviceArray<float> dParams(params), dM(m), dV(v);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> grads = randomValues(n, 20 + step);
    DeviceArray<float> dGrads(grads);
    cpu::adamwUpdate(params.data(), grads.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    cuda::adamwUpdate(dParams.get(), dGrads.get(), dM.get(), dV.get(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step,
                      nullptr);
  }
  expectClose(dParams.read(), params, 1e-5, "adamw parameters");
  DeviceArray<double> dSum(std::vector<double>{0.0});
  cuda::sumOfSquares(dSum.get(), dParams.get(), n, nullptr);
  const double gpuSum = dSum.read()[0], cpuSum = cpu::sumOfSquares(params.data(), n);
  EXPECT_NEAR(gpuSum, cpuSum, 1e-4 * cpuSum) << "sum of squares";
}

}  // namespace
}  // namespace loom::parallel
