// The reference GPT's layout, initialisation, forward and backward (gpt.h).
#include "parallel/model/gpt.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel {
namespace {

// A seeded normal source that gives the same numbers with every compiler and library: splitmix64 for the bits,
// Box-Muller for the shape.
class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : state_(seed) {}
  double next() {
    if (hasSpare_) {
      hasSpare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(bits() >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
    const double u2 = static_cast<double>(bits() >> 11) / 9007199254740992.0;          // [0, 1)
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    hasSpare_ = true;
    return radius * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t bits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
  double spare_ = 0;
  bool hasSpare_ = false;
};

size_t product(const std::vector<int64_t>& shape) {
  size_t count = 1;
  for (int64_t extent : shape) count *= static_cast<size_t>(extent);
  return count;
}

}  // namespace

bool GptConfig::preset(const std::string& name, GptConfig* out) {
  if (name == "gpt-tiny") {
    *out = GptConfig{2, 4, 128, 64, 256};
    return true;
  }
  if (name == "gpt2-124m") {
    *out = GptConfig{12, 12, 768, 1024, 50257};
    return true;
  }
  return false;
}

std::string GptConfig::check() const {
  if (layers < 1 || heads < 1 || channels < 1 || maxT < 1 || vocab < 1)
    return "layers, heads, channels, maxT and vocab must be at least 1 (got " + std::to_string(layers) + ", " +
           std::to_string(heads) + ", " + std::to_string(channels) + ", " + std::to_string(maxT) + ", " +
           std::to_string(vocab) + ")";
  if (channels % heads != 0)
    return "channels " + std::to_string(channels) + " is not divisible by heads " + std::to_string(heads);
  return "";
}

size_t ParamRange::numel() const { return product(shape); }

GptLayout GptLayout::of(const GptConfig& config) {
  GptLayout layout;
  const int64_t C = config.channels;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    layout.params.push_back(ParamRange{std::move(name), layout.total, std::move(shape)});
    layout.total += layout.params.back().numel();
  };
  layout.unitBegin.push_back(0);
  add("wte.weight", {config.vocab, C});
  add("wpe.weight", {config.maxT, C});
  for (int l = 0; l < config.layers; ++l) {
    layout.unitBegin.push_back(layout.total);
    const std::string prefix = "h." + std::to_string(l) + ".";
    add(prefix + "ln_1.weight", {C});
    add(prefix + "ln_1.bias", {C});
    add(prefix + "attn.c_attn.weight", {3 * C, C});
    add(prefix + "attn.c_attn.bias", {3 * C});
    add(prefix + "attn.c_proj.weight", {C, C});
    add(prefix + "attn.c_proj.bias", {C});
    add(prefix + "ln_2.weight", {C});
    add(prefix + "ln_2.bias", {C});
    add(prefix + "mlp.c_fc.weight", {4 * C, C});
    add(prefix + "mlp.c_fc.bias", {4 * C});
    add(prefix + "mlp.c_proj.weight", {C, 4 * C});
    add(prefix + "mlp.c_proj.bias", {C});
  }
  layout.unitBegin.push_back(layout.total);
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  layout.unitBegin.push_back(layout.total);
  return layout;
}

Gpt::Gpt(const GptConfig& config, bool ownsStorage) : config_(config), layout_(GptLayout::of(config)) {
  const std::string problem = config.check();
  if (!problem.empty()) {
    std::fprintf(stderr, "gpt: %s\n", problem.c_str());
    std::abort();
  }
  const size_t units = layout_.unitBegin.size() - 1;
  unitParams_.assign(units, nullptr);
  unitGrads_.assign(units, nullptr);
  if (!ownsStorage) return;
  params_ = Tensor::zeros({static_cast<int64_t>(layout_.total)});
  grads_ = Tensor::zeros({static_cast<int64_t>(layout_.total)});
  bindDefault();
}

void Gpt::bindUnit(int unit, float* params, float* grads) {
  if (params != nullptr) unitParams_[unit] = params;
  if (grads != nullptr) unitGrads_[unit] = grads;
}

void Gpt::dropStorage(bool params, bool grads) {
  for (size_t u = 0; u < unitParams_.size(); ++u) {
    if (params) unitParams_[u] = nullptr;
    if (grads) unitGrads_[u] = nullptr;
  }
  if (params) params_ = Tensor();
  if (grads) grads_ = Tensor();
}

void Gpt::bindDefault() {
  for (size_t u = 0; u < unitParams_.size(); ++u) {
    unitParams_[u] = params_.f32() + layout_.unitBegin[u];
    unitGrads_[u] = grads_.f32() + layout_.unitBegin[u];
  }
}

void Gpt::initialise(uint64_t seed) {
  NormalSource normal(seed);
  const double residualScale = 1.0 / std::sqrt(2.0 * config_.layers);
  float* base = params_.f32();
  for (const ParamRange& range : layout_.params) {
    float* values = base + range.offset;
    const bool gain = range.name.find("ln_") != std::string::npos && range.name.ends_with(".weight");
    const bool bias = range.name.ends_with(".bias");
    const bool residual = range.name.ends_with("c_proj.weight");
    for (size_t i = 0; i < range.numel(); ++i) {
      if (gain) {
        values[i] = 1.0f;
      } else if (bias) {
        values[i] = 0.0f;
      } else {
        values[i] = static_cast<float>(0.02 * normal.next() * (residual ? residualScale : 1.0));
      }
    }
  }
}

Gpt::Block Gpt::block(float* p) const {
  const size_t C = config_.channels;
  Block b{};
  b.ln1w = p;
  b.ln1b = b.ln1w + C;
  b.qkvw = b.ln1b + C;
  b.qkvb = b.qkvw + 3 * C * C;
  b.projw = b.qkvb + 3 * C;
  b.projb = b.projw + C * C;
  b.ln2w = b.projb + C;
  b.ln2b = b.ln2w + C;
  b.fcw = b.ln2b + C;
  b.fcb = b.fcw + 4 * C * C;
  b.fcProjw = b.fcb + 4 * C;
  b.fcProjb = b.fcProjw + 4 * C * C;
  return b;
}

void Gpt::reserve(int B, int T) {
  if (B == B_ && T == T_) return;
  const int64_t L = config_.layers, NH = config_.heads, C = config_.channels, V = config_.vocab, BT = int64_t{B} * T;
  for (Activations* a : {&acts_, &grads2_}) {
    a->encoded = Tensor::zeros({BT, C});
    a->ln1 = Tensor::zeros({L, BT, C});
    a->ln1Mean = Tensor::zeros({L, BT});
    a->ln1Rstd = Tensor::zeros({L, BT});
    a->qkv = Tensor::zeros({L, BT, 3 * C});
    a->attY = Tensor::zeros({L, BT, C});
    a->att = a == &acts_ ? Tensor::zeros({L, B, NH, T, T}) : Tensor();  // its gradient is never kept
    a->attProj = Tensor::zeros({L, BT, C});
    a->residual2 = Tensor::zeros({L, BT, C});
    a->ln2 = Tensor::zeros({L, BT, C});
    a->ln2Mean = Tensor::zeros({L, BT});
    a->ln2Rstd = Tensor::zeros({L, BT});
    a->fc = Tensor::zeros({L, BT, 4 * C});
    a->fcGelu = Tensor::zeros({L, BT, 4 * C});
    a->fcProj = Tensor::zeros({L, BT, C});
    a->residual3 = Tensor::zeros({L, BT, C});
    a->lnf = Tensor::zeros({BT, C});
    a->lnfMean = Tensor::zeros({BT});
    a->lnfRstd = Tensor::zeros({BT});
    a->logits = Tensor::zeros({BT, V});
    a->probs = a == &acts_ ? Tensor::zeros({BT, V}) : Tensor();
    a->losses = Tensor::zeros({BT});
  }
  B_ = B;
  T_ = T;
}

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (T > config_.maxT || B < 1 || T < 1) {
    std::fprintf(stderr, "gpt: a batch of %d x %d tokens (at most %d per sequence)\n", B, T, config_.maxT);
    std::abort();
  }
  reserve(B, T);
  const int L = config_.layers, NH = config_.heads, C = config_.channels, V = config_.vocab, BT = B * T;
  tokens_.assign(tokens, tokens + BT);
  if (targets != nullptr)
    targets_.assign(targets, targets + BT);
  else
    targets_.clear();
  const int lnfUnit = L + 1;
  acquire(0, false);
  // Unit 0: wte [V, C], then wpe; the final layernorm's unit: its weight, then its bias.
  const float* wte = unitParams_[0];
  const float* wpe = unitParams_[0] + static_cast<size_t>(V) * C;
  Activations& a = acts_;
  cpu::embeddingForward(a.encoded.f32(), tokens, wte, wpe, B, T, C);
  const size_t rows = static_cast<size_t>(BT) * C;
  for (int l = 0; l < L; ++l) {
    acquire(l + 1, false);
    const Block w = block(unitParams_[l + 1]);
    const float* x = l == 0 ? a.encoded.f32() : a.residual3.f32() + (l - 1) * rows;
    float* ln1 = a.ln1.f32() + l * rows;
    float* qkv = a.qkv.f32() + l * 3 * rows;
    float* attY = a.attY.f32() + l * rows;
    float* att = a.att.f32() + static_cast<size_t>(l) * B * NH * T * T;
    float* attProj = a.attProj.f32() + l * rows;
    float* residual2 = a.residual2.f32() + l * rows;
    float* ln2 = a.ln2.f32() + l * rows;
    float* fc = a.fc.f32() + l * 4 * rows;
    float* fcGelu = a.fcGelu.f32() + l * 4 * rows;
    float* fcProj = a.fcProj.f32() + l * rows;
    float* residual3 = a.residual3.f32() + l * rows;
    cpu::layernormForward(ln1, a.ln1Mean.f32() + l * BT, a.ln1Rstd.f32() + l * BT, x, w.ln1w, w.ln1b, BT, C);
    cpu::matmulForward(qkv, ln1, w.qkvw, w.qkvb, BT, C, 3 * C);
    cpu::attentionForward(attY, att, qkv, B, T, C, NH);
    cpu::matmulForward(attProj, attY, w.projw, w.projb, BT, C, C);
    cpu::residualForward(residual2, x, attProj, rows);
    cpu::layernormForward(ln2, a.ln2Mean.f32() + l * BT, a.ln2Rstd.f32() + l * BT, residual2, w.ln2w, w.ln2b, BT, C);
    cpu::matmulForward(fc, ln2, w.fcw, w.fcb, BT, C, 4 * C);
    cpu::geluForward(fcGelu, fc, 4 * rows);
    cpu::matmulForward(fcProj, fcGelu, w.fcProjw, w.fcProjb, BT, 4 * C, C);
    cpu::residualForward(residual3, residual2, fcProj, rows);
    release(l + 1, false);
  }
  const float* last = a.residual3.f32() + (L - 1) * rows;
  acquire(lnfUnit, false);
  const float* lnfw = unitParams_[lnfUnit];
  const float* lnfb = lnfw + C;
  cpu::layernormForward(a.lnf.f32(), a.lnfMean.f32(), a.lnfRstd.f32(), last, lnfw, lnfb, BT, C);
  release(lnfUnit, false);
  cpu::matmulForward(a.logits.f32(), a.lnf.f32(), wte, nullptr, BT, C, V);
  release(0, false);
  if (targets == nullptr) return 0.0f;
  cpu::crossEntropyForward(a.losses.f32(), a.probs.f32(), a.logits.f32(), targets, BT, V);
  double sum = 0;
  for (int i = 0; i < BT; ++i) sum += a.losses.f32()[i];
  return static_cast<float>(sum / BT);
}

void Gpt::backward(float lossScale) {
  if (targets_.empty()) {
    std::fprintf(stderr, "gpt: backward() needs a forward() with targets\n");
    std::abort();
  }
  const int B = B_, T = T_, L = config_.layers, NH = config_.heads, C = config_.channels, V = config_.vocab, BT = B * T;
  const size_t rows = static_cast<size_t>(BT) * C;
  Activations& a = acts_;
  Activations& d = grads2_;
  for (Tensor* t : {&d.encoded, &d.ln1, &d.qkv, &d.attY, &d.attProj, &d.residual2, &d.ln2, &d.fc, &d.fcGelu, &d.fcProj,
                    &d.residual3, &d.lnf, &d.logits})
    t->zero();
  const int lnfUnit = L + 1;
  acquire(0, true);
  acquire(lnfUnit, true);
  const float* wte = unitParams_[0];
  float* dwte = unitGrads_[0];
  float* dwpe = unitGrads_[0] + static_cast<size_t>(V) * C;
  // The mean over B * T positions.
  for (int i = 0; i < BT; ++i) d.losses.f32()[i] = lossScale / BT;
  cpu::crossEntropyBackward(d.logits.f32(), d.losses.f32(), a.probs.f32(), targets_.data(), BT, V);
  cpu::matmulBackward(d.lnf.f32(), dwte, nullptr, d.logits.f32(), a.lnf.f32(), wte, BT, C, V);
  cpu::layernormBackward(d.residual3.f32() + (L - 1) * rows, unitGrads_[lnfUnit], unitGrads_[lnfUnit] + C, d.lnf.f32(),
                         a.residual3.f32() + (L - 1) * rows, unitParams_[lnfUnit], a.lnfMean.f32(), a.lnfRstd.f32(), BT,
                         C);
  release(lnfUnit, true);
  for (int l = L - 1; l >= 0; --l) {
    acquire(l + 1, true);
    const Block w = block(unitParams_[l + 1]);
    const Block dw = block(unitGrads_[l + 1]);
    const float* x = l == 0 ? a.encoded.f32() : a.residual3.f32() + (l - 1) * rows;
    float* dx = l == 0 ? d.encoded.f32() : d.residual3.f32() + (l - 1) * rows;
    const size_t at = l * rows;
    cpu::residualBackward(d.residual2.f32() + at, d.fcProj.f32() + at, d.residual3.f32() + at, rows);
    cpu::matmulBackward(d.fcGelu.f32() + 4 * at, dw.fcProjw, dw.fcProjb, d.fcProj.f32() + at, a.fcGelu.f32() + 4 * at,
                        w.fcProjw, BT, 4 * C, C);
    cpu::geluBackward(d.fc.f32() + 4 * at, d.fcGelu.f32() + 4 * at, a.fc.f32() + 4 * at, 4 * rows);
    cpu::matmulBackward(d.ln2.f32() + at, dw.fcw, dw.fcb, d.fc.f32() + 4 * at, a.ln2.f32() + at, w.fcw, BT, C, 4 * C);
    cpu::layernormBackward(d.residual2.f32() + at, dw.ln2w, dw.ln2b, d.ln2.f32() + at, a.residual2.f32() + at, w.ln2w,
                           a.ln2Mean.f32() + l * BT, a.ln2Rstd.f32() + l * BT, BT, C);
    cpu::residualBackward(dx, d.attProj.f32() + at, d.residual2.f32() + at, rows);
    cpu::matmulBackward(d.attY.f32() + at, dw.projw, dw.projb, d.attProj.f32() + at, a.attY.f32() + at, w.projw, BT, C,
                        C);
    cpu::attentionBackward(d.qkv.f32() + 3 * at, d.attY.f32() + at, a.qkv.f32() + 3 * at,
                           a.att.f32() + static_cast<size_t>(l) * B * NH * T * T, B, T, C, NH);
    cpu::matmulBackward(d.ln1.f32() + at, dw.qkvw, dw.qkvb, d.qkv.f32() + 3 * at, a.ln1.f32() + at, w.qkvw, BT, C,
                        3 * C);
    cpu::layernormBackward(dx, dw.ln1w, dw.ln1b, d.ln1.f32() + at, x, w.ln1w, a.ln1Mean.f32() + l * BT,
                           a.ln1Rstd.f32() + l * BT, BT, C);
    release(l + 1, true);
  }
  cpu::embeddingBackward(dwte, dwpe, d.encoded.f32(), tokens_.data(), B, T, C);
  release(0, true);
}

}  // namespace loom::parallel
