// The parallel layer's CUDA kernels (parallel/kernels/cuda) against their CPU references (parallel/kernels/cpu) on
// the same inputs: every forward and backward of the reference GPT's layers, AdamW, and the gradient norm. fp32 on
// both sides, with tolerances for the different order of sums (GEMMs, warp reductions, atomics); then bf16 on the
// device against fp32 on the CPU from the same bf16-rounded inputs, with tolerances for bf16's rounding of results
// (2^-9 relative) and of the intermediates it keeps (attention's scores and probabilities). Exits 77 (skipped) when
// there is no CUDA device.
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

// BT = 192 rows: layernorm's parameter sums take two chunks of 128 rows; T = 48 runs the softmaxes' warp loops
// twice; tokens (i * 7) % V repeat, so the embedding's atomics collide.
constexpr int B = 4, T = 48, C = 64, NH = 4, V = 97, BT = B * T;

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
  // Without a bias (the output head's form).
  cpu::matmulForward(out.data(), inp.data(), weight.data(), nullptr, BT, C, OC);
  cuda::matmulForward(dOut.get(), dInp.get(), dWeight.get(), nullptr, BT, C, OC, nullptr);
  expectClose(dOut.read(), out, 1e-5, "matmul forward without bias");
}

// The mixture of experts' row movements, with repeated rows, a dropped slot (-1) and gates, and the split halves of
// the matmul backward (ZB-H1's B and W) each alone.
TEST(ParallelCudaKernels, ExpertRowsAndSplitMatmulMatchTheCpu) {
  const int tokens = 40, k = 2, rows = 70;
  std::vector<float> inp = randomValues(tokens * C, 21), gates = randomValues(tokens * k, 22),
                     expertRows = randomValues(rows * C, 23), existing = randomValues(tokens * C, 24);
  std::vector<int32_t> gather(rows), slots(tokens * k);
  for (int i = 0; i < rows; ++i) gather[i] = (i * 11) % tokens;
  for (int a = 0; a < tokens * k; ++a) slots[a] = a % 9 == 4 ? -1 : (a * 13) % rows;
  std::vector<float> gathered(rows * C), scaled(rows * C), combined = existing, dots(rows);
  cpu::gatherRows(gathered.data(), inp.data(), gather.data(), nullptr, rows, C);
  cpu::gatherRows(scaled.data(), inp.data(), gather.data(), gates.data(), rows, C);
  cpu::combineRows(combined.data(), expertRows.data(), slots.data(), gates.data(), tokens, k, C);
  cpu::rowDots(dots.data(), inp.data(), gather.data(), expertRows.data(), rows, C);
  DeviceArray<float> dInp(inp), dGates(gates), dExpert(expertRows), dGathered(zeros(rows * C)),
      dScaled(zeros(rows * C)), dCombined(existing), dDots(zeros(rows));
  DeviceArray<int32_t> dGather(gather), dSlots(slots);
  cuda::gatherRows(dGathered.get(), dInp.get(), dGather.get(), nullptr, rows, C, nullptr);
  cuda::gatherRows(dScaled.get(), dInp.get(), dGather.get(), dGates.get(), rows, C, nullptr);
  cuda::combineRows(dCombined.get(), dExpert.get(), dSlots.get(), dGates.get(), tokens, k, C, nullptr);
  cuda::rowDots(dDots.get(), dInp.get(), dGather.get(), dExpert.get(), rows, C, nullptr);
  expectClose(dGathered.read(), gathered, 0, "gather rows");
  expectClose(dScaled.read(), scaled, 1e-6, "gather rows with scales");
  expectClose(dCombined.read(), combined, 1e-6, "combine rows");
  expectClose(dDots.read(), dots, 1e-5, "row dots");

  const int OC = 2 * C;
  std::vector<float> weight = randomValues(OC * C, 25), dout = randomValues(BT * OC, 26), in = randomValues(BT * C, 27);
  std::vector<float> dinp(BT * C), dweight(OC * C), dbias(OC);
  cpu::matmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), in.data(), weight.data(), BT, C, OC);
  DeviceArray<float> dWeight(weight), dDout(dout), dIn(in), dDinp(zeros(BT * C)), dDweight(zeros(OC * C)),
      dDbias(zeros(OC));
  cuda::matmulBackward<float>(dDinp.get(), nullptr, nullptr, dDout.get(), dIn.get(), dWeight.get(), BT, C, OC, nullptr);
  expectClose(dDweight.read(), zeros(OC * C), 0, "the input half writes no weight gradient");
  cuda::matmulBackward<float>(nullptr, dDweight.get(), dDbias.get(), dDout.get(), dIn.get(), dWeight.get(), BT, C, OC,
                              nullptr);
  expectClose(dDinp.read(), dinp, 1e-5, "matmul backward, input half");
  expectClose(dDweight.read(), dweight, 1e-5, "matmul backward, weight half");
  expectClose(dDbias.read(), dbias, 1e-5, "matmul backward, bias with the weights");
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
  cpu::embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, V);
  DeviceArray<int32_t> dTokens(tokens);
  DeviceArray<float> dWte(wte), dWpe(wpe), dDwte(zeros(V * C)), dDwpe(zeros(T * C));
  cuda::embeddingForward(dOut.get(), dTokens.get(), dWte.get(), dWpe.get(), B, T, C, nullptr);
  cuda::embeddingBackward(dDwte.get(), dDwpe.get(), dDout.get(), dTokens.get(), B, T, C, V, nullptr);
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
    cpu::adamwUpdate(params.data(), grads.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
    cuda::adamwUpdate(dParams.get(), dGrads.get(), dM.get(), dV.get(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f,
                      nullptr);
  }
  expectClose(dParams.read(), params, 1e-5, "adamw parameters");
  DeviceArray<double> dSum(std::vector<double>{0.0});
  cuda::sumOfSquares(dSum.get(), dParams.get(), n, nullptr);
  const double gpuSum = dSum.read()[0], cpuSum = cpu::sumOfSquares(params.data(), n);
  EXPECT_NEAR(gpuSum, cpuSum, 1e-4 * cpuSum) << "sum of squares";
}

// bf16 copies of host values on the device, and their values read back as floats.
DeviceArray<Bf16> bf16Array(const std::vector<float>& values) {
  std::vector<Bf16> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) rounded[i] = toBf16(values[i]);
  return DeviceArray<Bf16>(rounded);
}
std::vector<float> readFloats(const DeviceArray<Bf16>& array) {
  std::vector<float> values;
  for (Bf16 value : array.read()) values.push_back(fromBf16(value));
  return values;
}
// The values as bf16 would hold them: the CPU reference's inputs.
std::vector<float> roundedToBf16(std::vector<float> values) {
  for (float& value : values) value = fromBf16(toBf16(value));
  return values;
}

TEST(ParallelCudaKernels, Bf16MatmulAttentionAndLayernormMatchTheCpu) {
  const int OC = 3 * C;
  std::vector<float> inp = roundedToBf16(randomValues(BT * C, 31)), weight = roundedToBf16(randomValues(OC * C, 32));
  std::vector<float> bias = roundedToBf16(randomValues(OC, 33)), dout = roundedToBf16(randomValues(BT * OC, 34));
  std::vector<float> out(BT * OC), dinp(BT * C), dweight(OC * C), dbias(OC);
  cpu::matmulForward(out.data(), inp.data(), weight.data(), bias.data(), BT, C, OC);
  cpu::matmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), BT, C, OC);
  DeviceArray<Bf16> dInp = bf16Array(inp), dWeight = bf16Array(weight), dBias = bf16Array(bias),
                    dDout = bf16Array(dout), dOut = bf16Array(zeros(BT * OC)), dDinp = bf16Array(zeros(BT * C)),
                    dDweight = bf16Array(zeros(OC * C)), dDbias = bf16Array(zeros(OC));
  cuda::matmulForward(dOut.get(), dInp.get(), dWeight.get(), dBias.get(), BT, C, OC, nullptr);
  cuda::matmulBackward(dDinp.get(), dDweight.get(), dDbias.get(), dDout.get(), dInp.get(), dWeight.get(), BT, C, OC,
                       nullptr);
  expectClose(readFloats(dOut), out, 1e-2, "bf16 matmul forward");
  expectClose(readFloats(dDinp), dinp, 1e-2, "bf16 matmul dinp");
  expectClose(readFloats(dDweight), dweight, 1e-2, "bf16 matmul dweight");
  expectClose(readFloats(dDbias), dbias, 1e-2, "bf16 matmul dbias");

  std::vector<float> qkv = roundedToBf16(randomValues(BT * 3 * C, 35)), dy = roundedToBf16(randomValues(BT * C, 36));
  std::vector<float> y(BT * C), att(B * NH * T * T), dqkv(BT * 3 * C);
  cpu::attentionForward(y.data(), att.data(), qkv.data(), B, T, C, NH);
  cpu::attentionBackward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
  DeviceArray<Bf16> dQkv = bf16Array(qkv), dDy = bf16Array(dy), dY = bf16Array(zeros(BT * C)),
                    dAtt = bf16Array(zeros(att.size())), dScratch = bf16Array(zeros(att.size())),
                    dDqkv = bf16Array(zeros(BT * 3 * C));
  cuda::attentionForward(dY.get(), dAtt.get(), dQkv.get(), B, T, C, NH, nullptr);
  cuda::attentionBackward(dDqkv.get(), dDy.get(), dQkv.get(), dAtt.get(), dScratch.get(), B, T, C, NH, nullptr);
  expectClose(readFloats(dAtt), att, 1e-2, "bf16 attention probabilities");
  expectClose(readFloats(dY), y, 2e-2, "bf16 attention forward");
  expectClose(readFloats(dDqkv), dqkv, 4e-2, "bf16 attention backward");

  std::vector<float> x = roundedToBf16(randomValues(BT * C, 37, 2.0f)), gain = roundedToBf16(randomValues(C, 38));
  std::vector<float> shift = roundedToBf16(randomValues(C, 39)), dln = roundedToBf16(randomValues(BT * C, 40));
  std::vector<float> ln(BT * C), mean(BT), rstd(BT), dx(BT * C), dgain(C), dshift(C);
  cpu::layernormForward(ln.data(), mean.data(), rstd.data(), x.data(), gain.data(), shift.data(), BT, C);
  cpu::layernormBackward(dx.data(), dgain.data(), dshift.data(), dln.data(), x.data(), gain.data(), mean.data(),
                         rstd.data(), BT, C);
  DeviceArray<Bf16> dX = bf16Array(x), dGain = bf16Array(gain), dShift = bf16Array(shift), dDln = bf16Array(dln),
                    dLn = bf16Array(zeros(BT * C)), dDx = bf16Array(zeros(BT * C)), dDgain = bf16Array(zeros(C)),
                    dDshift = bf16Array(zeros(C));
  DeviceArray<float> dMean(zeros(BT)), dRstd(zeros(BT));
  cuda::layernormForward(dLn.get(), dMean.get(), dRstd.get(), dX.get(), dGain.get(), dShift.get(), BT, C, nullptr);
  cuda::layernormBackward(dDx.get(), dDgain.get(), dDshift.get(), dDln.get(), dX.get(), dGain.get(), dMean.get(),
                          dRstd.get(), BT, C, nullptr);
  expectClose(readFloats(dLn), ln, 1e-2, "bf16 layernorm forward");
  expectClose(dRstd.read(), rstd, 1e-5, "bf16 layernorm rstd");
  expectClose(readFloats(dDx), dx, 1e-2, "bf16 layernorm dinp");
  expectClose(readFloats(dDgain), dgain, 1e-2, "bf16 layernorm dweight");
  expectClose(readFloats(dDshift), dshift, 1e-2, "bf16 layernorm dbias");
}

TEST(ParallelCudaKernels, Bf16PointwiseLossAndMixedAdamWMatchTheCpu) {
  std::vector<float> inp = roundedToBf16(randomValues(BT * C, 41, 2.0f)),
                     dout = roundedToBf16(randomValues(BT * C, 42));
  std::vector<float> gelu(BT * C), dgelu(BT * C);
  cpu::geluForward(gelu.data(), inp.data(), gelu.size());
  cpu::geluBackward(dgelu.data(), dout.data(), inp.data(), gelu.size());
  DeviceArray<Bf16> dInp = bf16Array(inp), dDout = bf16Array(dout), dGelu = bf16Array(zeros(BT * C)),
                    dDgelu = bf16Array(zeros(BT * C));
  cuda::geluForward(dGelu.get(), dInp.get(), gelu.size(), nullptr);
  cuda::geluBackward(dDgelu.get(), dDout.get(), dInp.get(), gelu.size(), nullptr);
  expectClose(readFloats(dGelu), gelu, 1e-2, "bf16 gelu forward");
  expectClose(readFloats(dDgelu), dgelu, 1e-2, "bf16 gelu backward");

  std::vector<int32_t> tokens(BT), targets(BT);
  for (int i = 0; i < BT; ++i) {
    tokens[i] = (i * 7) % V;
    targets[i] = (i * 13 + 5) % V;
  }
  std::vector<float> wte = roundedToBf16(randomValues(V * C, 43)), wpe = roundedToBf16(randomValues(T * C, 44));
  std::vector<float> encoded(BT * C), dwte(V * C), dwpe(T * C);
  cpu::embeddingForward(encoded.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  cpu::embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, V);
  DeviceArray<int32_t> dTokens(tokens), dTargets(targets);
  DeviceArray<Bf16> dWte = bf16Array(wte), dWpe = bf16Array(wpe), dEncoded = bf16Array(zeros(BT * C)),
                    dDwte = bf16Array(zeros(V * C)), dDwpe = bf16Array(zeros(T * C));
  cuda::embeddingForward(dEncoded.get(), dTokens.get(), dWte.get(), dWpe.get(), B, T, C, nullptr);
  cuda::embeddingBackward(dDwte.get(), dDwpe.get(), dDout.get(), dTokens.get(), B, T, C, V, nullptr);
  expectClose(readFloats(dEncoded), encoded, 1e-2, "bf16 embedding forward");
  expectClose(readFloats(dDwte), dwte, 1e-2, "bf16 embedding dwte");
  expectClose(readFloats(dDwpe), dwpe, 1e-2, "bf16 embedding dwpe");

  std::vector<float> logits = roundedToBf16(randomValues(BT * V, 45, 3.0f)), dlosses = randomValues(BT, 46);
  std::vector<float> probs(BT * V), losses(BT), dlogits(BT * V);
  cpu::crossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), BT, V);
  cpu::crossEntropyBackward(dlogits.data(), dlosses.data(), probs.data(), targets.data(), BT, V);
  DeviceArray<Bf16> dLogits = bf16Array(logits), dProbs = bf16Array(zeros(BT * V)), dDlogits = bf16Array(zeros(BT * V));
  DeviceArray<float> dLosses(zeros(BT)), dDlosses(dlosses);
  cuda::crossEntropyForward(dLosses.get(), dProbs.get(), dLogits.get(), dTargets.get(), BT, V, nullptr);
  cuda::crossEntropyBackward(dDlogits.get(), dDlosses.get(), dProbs.get(), dTargets.get(), BT, V, nullptr);
  expectClose(dLosses.read(), losses, 1e-5, "bf16 cross-entropy losses (fp32)");
  expectClose(readFloats(dProbs), probs, 1e-2, "bf16 cross-entropy probabilities");
  expectClose(readFloats(dDlogits), dlogits, 1e-2, "bf16 cross-entropy backward");

  // Mixed AdamW: fp32 master weights and moments from bf16 gradients, the bf16 weights their rounding.
  const size_t n = 4099;
  std::vector<float> master = randomValues(n, 47), m(n), v(n);
  DeviceArray<float> dMaster(master), dM(m), dV(v);
  DeviceArray<Bf16> dParams = bf16Array(master);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> grads = roundedToBf16(randomValues(n, 50 + step));
    DeviceArray<Bf16> dGrads = bf16Array(grads);
    cpu::adamwUpdate(master.data(), grads.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
    cuda::adamwUpdate(dParams.get(), dGrads.get(), dMaster.get(), dM.get(), dV.get(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                      0.1f, step, 0.5f, nullptr);
  }
  expectClose(dMaster.read(), master, 1e-5, "mixed adamw master weights");
  const std::vector<float> gpuMaster = dMaster.read(), gpuParams = readFloats(dParams);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(gpuParams[i], fromBf16(toBf16(gpuMaster[i]))) << "weight " << i;
  DeviceArray<double> dSum(std::vector<double>{0.0});
  cuda::sumOfSquares(dSum.get(), dParams.get(), n, nullptr);
  double cpuSum = 0;
  for (float value : gpuParams) cpuSum += static_cast<double>(value) * value;
  EXPECT_NEAR(dSum.read()[0], cpuSum, 1e-5 * cpuSum) << "bf16 sum of squares";
}

}  // namespace
}  // namespace loom::parallel
