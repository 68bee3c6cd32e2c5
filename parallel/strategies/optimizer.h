// AdamW over a model's flat parameter buffer, or over a shard of it (ZeRO), with its moments held for just that
// range. Weight decay applies to the matrices (embeddings and linear weights), not to biases and layernorm gains,
// as in GPT-2's training recipes. Gradient clipping by global norm takes the sum of squares of every rank's part.
// The state lives in the model's Ops memory; where the model computes in bf16, AdamW keeps fp32 master weights of
// its range beside the moments and writes them, rounded, into the model's parameters (the ZeRO paper's mixed
// precision: 12 bytes of optimizer state per parameter).
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/kernels/ops.h"
#include "parallel/model/gpt.h"
#include "parallel/tensor.h"

namespace loom::parallel {

struct AdamWOptions {
  float learningRate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weightDecay = 0.1f;
  float clipNorm = 1.0f;  // 0: no clipping
};

class AdamW {
 public:
  // Holds moments (and master weights, when `ops` computes in bf16) for elements [begin, end) of `layout`'s buffer.
  AdamW(const GptLayout& layout, AdamWOptions options, size_t begin, size_t end, Ops& ops = cpuOps());
  // One step on the elements [begin, end) of the full buffer, after scaling the gradients by `gradScale` (the
  // clipping factor). Element i is params[i - paramsBase] and its gradient grads[i - gradsBase] (ops memory and
  // element type): base 0 for a full buffer, begin() for one that holds just this range (a ZeRO shard).
  void step(void* params, size_t paramsBase, const void* grads, size_t gradsBase, float gradScale);
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  int steps() const { return steps_; }
  // Whether it keeps master weights (the parameters are bf16).
  bool mixed() const { return master_.defined(); }
  // Bytes of optimizer state this rank holds (two moments per element of its range, and the master weights).
  size_t stateBytes() const { return m_.bytes() + v_.bytes() + (mixed() ? master_.bytes() : 0); }
  const AdamWOptions& options() const { return options_; }
  // The moments of elements [begin, end) on the host, for a checkpoint, and their restoring with the step count.
  std::vector<float> firstMoments() const;
  std::vector<float> secondMoments() const;
  void restore(const float* m, const float* v, int steps);
  // Mixed only: the master weights of [begin, end) on the host, and setting them (from the initial parameters or a
  // checkpoint's).
  std::vector<float> masterWeights() const;
  void setMasterWeights(const float* values);

 private:
  struct Span {
    size_t begin, end;
    bool decay;
  };
  AdamWOptions options_;
  Ops& ops_;
  size_t begin_, end_;
  std::vector<Span> spans_;  // [begin, end) cut where weight decay changes
  Tensor m_, v_, master_;
  int steps_ = 0;
};

}  // namespace loom::parallel
