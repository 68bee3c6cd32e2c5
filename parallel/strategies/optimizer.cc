// AdamW over a range of the flat parameter buffer (optimizer.h).
#include "parallel/strategies/optimizer.h"

#include <algorithm>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel {

AdamW::AdamW(const GptLayout& layout, AdamWOptions options, size_t begin, size_t end)
    : options_(options),
      begin_(begin),
      end_(std::min(end, layout.total)),
      m_(end_ > begin_ ? end_ - begin_ : 0),
      v_(m_.size()),
      scaled_(m_.size()) {
  for (const ParamRange& range : layout.params) {
    const size_t lo = std::max(range.offset, begin_), hi = std::min(range.offset + range.numel(), end_);
    if (lo < hi) spans_.push_back(Span{lo, hi, range.shape.size() == 2});
  }
}

void AdamW::step(float* params, size_t paramsBase, const float* grads, size_t gradsBase, float gradScale) {
  ++steps_;
  for (const Span& span : spans_) {
    const size_t n = span.end - span.begin, at = span.begin - begin_;
    const float* g = grads + (span.begin - gradsBase);
    if (gradScale != 1.0f) {
      std::copy(g, g + n, scaled_.begin() + at);
      cpu::scale(scaled_.data() + at, n, gradScale);
      g = scaled_.data() + at;
    }
    cpu::adamwUpdate(params + (span.begin - paramsBase), g, m_.data() + at, v_.data() + at, n, options_.learningRate,
                     options_.beta1, options_.beta2, options_.eps, span.decay ? options_.weightDecay : 0.0f, steps_);
  }
}

void AdamW::restore(const float* m, const float* v, int steps) {
  std::copy(m, m + m_.size(), m_.begin());
  std::copy(v, v + v_.size(), v_.begin());
  steps_ = steps;
}

}  // namespace loom::parallel
