// AdamW over a range of the flat parameter buffer (optimizer.h).
#include "parallel/strategies/optimizer.h"

#include <algorithm>

namespace loom::parallel {
namespace {

std::vector<float> toHost(Ops& ops, const Tensor& tensor) {
  std::vector<float> values(tensor.numel());
  if (!values.empty()) ops.download(values.data(), tensor.data(), tensor.bytes());
  return values;
}

}  // namespace

AdamW::AdamW(const GptLayout& layout, AdamWOptions options, size_t begin, size_t end, Ops& ops)
    : options_(options), ops_(ops), begin_(begin), end_(std::min(end, layout.total)) {
  const int64_t n = end_ > begin_ ? static_cast<int64_t>(end_ - begin_) : 0;
  m_ = Tensor::zeros({n}, DType::kFloat32, &ops);
  v_ = Tensor::zeros({n}, DType::kFloat32, &ops);
  if (ops.dtype() != DType::kFloat32) master_ = Tensor::zeros({n}, DType::kFloat32, &ops);
  for (const ParamRange& range : layout.params) {
    const size_t lo = std::max(range.offset, begin_), hi = std::min(range.offset + range.numel(), end_);
    if (lo < hi) spans_.push_back(Span{lo, hi, range.shape.size() == 2});
  }
}

void AdamW::step(void* params, size_t paramsBase, const void* grads, size_t gradsBase, float gradScale) {
  ++steps_;
  for (const Span& span : spans_) {
    const size_t n = span.end - span.begin, at = span.begin - begin_;
    const AdamWStep constants{options_.learningRate,
                              options_.beta1,
                              options_.beta2,
                              options_.eps,
                              span.decay ? options_.weightDecay : 0.0f,
                              steps_,
                              gradScale};
    ops_.adamw(elementAt(ops_, params, span.begin - paramsBase), elementAt(ops_, grads, span.begin - gradsBase),
               mixed() ? master_.f32() + at : nullptr, m_.f32() + at, v_.f32() + at, n, constants);
  }
}

std::vector<float> AdamW::firstMoments() const { return toHost(ops_, m_); }
std::vector<float> AdamW::secondMoments() const { return toHost(ops_, v_); }
std::vector<float> AdamW::masterWeights() const { return mixed() ? toHost(ops_, master_) : std::vector<float>(); }

void AdamW::restore(const float* m, const float* v, int steps) {
  ops_.upload(m_.data(), m, m_.bytes());
  ops_.upload(v_.data(), v, v_.bytes());
  steps_ = steps;
}

void AdamW::setMasterWeights(const float* values) {
  if (mixed()) ops_.upload(master_.data(), values, master_.bytes());
}

}  // namespace loom::parallel
