// AdamW over a model's flat parameter buffer, or over a shard of it (ZeRO), with its moments held for just that
// range. Weight decay applies to the matrices (embeddings and linear weights), not to biases and layernorm gains,
// as in GPT-2's training recipes. Gradient clipping by global norm takes the sum of squares of every rank's part.
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/model/gpt.h"

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
  // Holds moments for elements [begin, end) of `layout`'s buffer.
  AdamW(const GptLayout& layout, AdamWOptions options, size_t begin, size_t end);
  // One step on the elements [begin, end) of the full buffer, after scaling the gradients by `gradScale` (the
  // clipping factor). Element i is params[i - paramsBase] and its gradient grads[i - gradsBase]: base 0 for a full
  // buffer, begin() for one that holds just this range (a ZeRO shard).
  void step(float* params, size_t paramsBase, const float* grads, size_t gradsBase, float gradScale);
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  int steps() const { return steps_; }
  // Bytes of optimizer state this rank holds (two moments per element of its range).
  size_t stateBytes() const { return (m_.size() + v_.size()) * sizeof(float); }
  const AdamWOptions& options() const { return options_; }
  // The moments of elements [begin, end), for a checkpoint, and their restoring with the step count.
  const std::vector<float>& firstMoments() const { return m_; }
  const std::vector<float>& secondMoments() const { return v_; }
  void restore(const float* m, const float* v, int steps);

 private:
  struct Span {
    size_t begin, end;
    bool decay;
  };
  AdamWOptions options_;
  size_t begin_, end_;
  std::vector<Span> spans_;  // [begin, end) cut where weight decay changes
  std::vector<float> m_, v_, scaled_;
  int steps_ = 0;
};

}  // namespace loom::parallel
