// The reference GPT's layout, initialisation, forward and backward (gpt.h).
#include "parallel/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "parallel/check.h"

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

GptLayout GptLayout::of(const GptConfig& config, int tensorParallel) {
  GptLayout layout;
  const int64_t C = config.channels, t = tensorParallel;
  using enum TensorSplit;
  auto add = [&](std::string name, std::vector<int64_t> shape, TensorSplit split = kReplicated, int parts = 1) {
    if (split == kRows) shape[0] /= t;
    if (split == kColumns) shape[1] /= t;
    layout.params.push_back(ParamRange{std::move(name), layout.total, std::move(shape), split, parts});
    layout.total += layout.params.back().numel();
  };
  layout.tensorParallel = tensorParallel;
  layout.unitBegin.push_back(0);
  add("wte.weight", {config.vocab, C}, kRows);
  add("wpe.weight", {config.maxT, C});
  for (int l = 0; l < config.layers; ++l) {
    layout.unitBegin.push_back(layout.total);
    const std::string prefix = "h." + std::to_string(l) + ".";
    add(prefix + "ln_1.weight", {C});
    add(prefix + "ln_1.bias", {C});
    add(prefix + "attn.c_attn.weight", {3 * C, C}, kRows, 3);
    add(prefix + "attn.c_attn.bias", {3 * C}, kRows, 3);
    add(prefix + "attn.c_proj.weight", {C, C}, kColumns);
    add(prefix + "attn.c_proj.bias", {C});
    add(prefix + "ln_2.weight", {C});
    add(prefix + "ln_2.bias", {C});
    add(prefix + "mlp.c_fc.weight", {4 * C, C}, kRows);
    add(prefix + "mlp.c_fc.bias", {4 * C}, kRows);
    add(prefix + "mlp.c_proj.weight", {C, 4 * C}, kColumns);
    add(prefix + "mlp.c_proj.bias", {C});
  }
  layout.unitBegin.push_back(layout.total);
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  layout.unitBegin.push_back(layout.total);
  return layout;
}

// Rank `rank`'s elements of the full layout's parameter `full`, as (local offset, full offset, count) runs.
template <typename Visit>
void forEachRun(const ParamRange& local, const ParamRange& full, int t, int rank, Visit visit) {
  const size_t cols = local.shape.size() == 2 ? static_cast<size_t>(local.shape[1]) : 1;
  const size_t rows = static_cast<size_t>(local.shape[0]);
  switch (local.split) {
    case TensorSplit::kReplicated:
      visit(local.offset, full.offset, local.numel());
      return;
    case TensorSplit::kRows: {  // `parts` blocks of rows (q, k, v), each cut over the ranks
      const size_t localRows = rows / local.parts, fullRows = localRows * t;
      for (int part = 0; part < local.parts; ++part)
        visit(local.offset + part * localRows * cols, full.offset + (part * fullRows + rank * localRows) * cols,
              localRows * cols);
      return;
    }
    case TensorSplit::kColumns:  // each row's columns cut over the ranks
      for (size_t row = 0; row < rows; ++row)
        visit(local.offset + row * cols, full.offset + row * cols * t + rank * cols, cols);
      return;
  }
}

void GptLayout::shard(const GptLayout& full, const float* fullValues, int rank, float* local) const {
  for (size_t i = 0; i < params.size(); ++i)
    forEachRun(params[i], full.params[i], tensorParallel, rank, [&](size_t at, size_t from, size_t count) {
      std::copy(fullValues + from, fullValues + from + count, local + at);
    });
}

void GptLayout::unshard(const GptLayout& full, const float* local, int rank, float* fullValues) const {
  for (size_t i = 0; i < params.size(); ++i)
    forEachRun(params[i], full.params[i], tensorParallel, rank,
               [&](size_t at, size_t to, size_t count) { std::copy(local + at, local + at + count, fullValues + to); });
}

namespace {

int countOf(loomComm_t comm) {
  int count = 1;
  if (comm != nullptr) loomCommCount(comm, &count);
  return count;
}

}  // namespace

Gpt::Gpt(const GptConfig& config, Ops& ops, loomComm_t tensorParallel, bool sequenceParallel)
    : config_(config),
      ops_(ops),
      tpComm_(tensorParallel),
      tp_(countOf(tensorParallel)),
      sp_(sequenceParallel && tp_ > 1),
      layout_(GptLayout::of(config, tp_)) {
  std::string problem = config.check();
  if (problem.empty() && (config.heads % tp_ != 0 || config.vocab % tp_ != 0))
    problem = "tensor parallelism over " + std::to_string(tp_) + " ranks needs heads (" + std::to_string(config.heads) +
              ") and vocab (" + std::to_string(config.vocab) + ") divisible by it";
  if (!problem.empty()) {
    std::fprintf(stderr, "gpt: %s\n", problem.c_str());
    std::abort();
  }
  if (tp_ > 1) {
    loomCommUserRank(tpComm_, &tpRank_);
    tpStream_ = ops_.createStream();
    tpScalars_ = std::make_unique<Scalars>(tpComm_, ops_);
    zeroPositions_ = zeros({config.maxT, config.channels});
  }
  const size_t units = layout_.unitBegin.size() - 1;
  unitParams_.assign(units, nullptr);
  unitGrads_.assign(units, nullptr);
  params_ = zeros({static_cast<int64_t>(layout_.total)});
  grads_ = zeros({static_cast<int64_t>(layout_.total)});
  bindDefault();
}

Gpt::~Gpt() {
  if (tpStream_ != nullptr) ops_.destroyStream(tpStream_);
}

void Gpt::tensorParallelAllReduce(void* data, size_t n, loomDataType_t type, loomRedOp_t op) {
  if (tp_ == 1) return;
  ops_.commAfterCompute(tpStream_);
  LOOM_PAR_CHECK(tpComm_, loomAllReduce(data, data, n, type, op, tpComm_, tpStream_));
  LOOM_PAR_CHECK(tpComm_, ops_.synchronize(tpStream_, tpComm_));
}

void* Gpt::gatherRows(void* local, Tensor& scratch) {
  if (!sp_) return local;
  ops_.commAfterCompute(tpStream_);
  LOOM_PAR_CHECK(tpComm_, loomAllGather(local, scratch.data(), static_cast<size_t>(rowsHere_) * config_.channels,
                                        loomTypeOf(ops_.dtype()), tpComm_, tpStream_));
  LOOM_PAR_CHECK(tpComm_, ops_.synchronize(tpStream_, tpComm_));
  return scratch.data();
}

void* Gpt::partialBuffer(void* out, Tensor& scratch) {
  if (!sp_) return out;
  scratch.zero();  // backward adds into it
  return scratch.data();
}

void Gpt::finishRows(void* partial, void* out) {
  const size_t here = static_cast<size_t>(rowsHere_) * config_.channels;
  if (!sp_) {
    tensorParallelAllReduce(out, here, loomTypeOf(ops_.dtype()), loomSum);
    return;
  }
  ops_.commAfterCompute(tpStream_);
  LOOM_PAR_CHECK(tpComm_, loomReduceScatter(partial, out, here, loomTypeOf(ops_.dtype()), loomSum, tpComm_, tpStream_));
  LOOM_PAR_CHECK(tpComm_, ops_.synchronize(tpStream_, tpComm_));
}

void Gpt::layernormBackward(void* dinp, void* dparams, const void* dout, const void* inp, const void* weight,
                            const float* mean, const float* rstd) {
  const int C = config_.channels;
  if (!sp_) {
    ops_.layernormBackward(dinp, dparams, at(dparams, C), dout, inp, weight, mean, rstd, rowsHere_, C);
    return;
  }
  // This backward's share over this rank's rows, summed over the ranks, then added to the gradients (which may
  // hold earlier micro-batches' sums already).
  layernormGrads_.zero();
  ops_.layernormBackward(dinp, layernormGrads_.data(), at(layernormGrads_, C), dout, inp, weight, mean, rstd, rowsHere_,
                         C);
  tensorParallelAllReduce(layernormGrads_.data(), 2 * C, loomTypeOf(ops_.dtype()), loomSum);
  ops_.add(dparams, layernormGrads_.data(), 2 * C);
}

double Gpt::sumOverTensorParallel(double value) { return tp_ == 1 ? value : tpScalars_->sum(value); }

double Gpt::gradientSquares(const void* grads, size_t begin, size_t end, size_t gradsBase) const {
  if (tp_ == 1 || tpRank_ == 0)
    return end > begin ? ops_.sumOfSquares(elementAt(ops_, grads, begin - gradsBase), end - begin) : 0;
  double squares = 0;
  for (const ParamRange& range : layout_.params) {
    if (range.split == TensorSplit::kReplicated) continue;  // counted on tensor-parallel rank 0
    const size_t lo = std::max(begin, range.offset), hi = std::min(end, range.offset + range.numel());
    if (lo < hi) squares += ops_.sumOfSquares(elementAt(ops_, grads, lo - gradsBase), hi - lo);
  }
  return squares;
}

void Gpt::uploadLocalIds(Tensor& ids, const int32_t* tokens, int n) {
  if (tp_ == 1) {
    ops_.upload(ids.data(), tokens, sizeof(int32_t) * n);
    return;
  }
  const int rows = config_.vocab / tp_, first = tpRank_ * rows;
  std::vector<int32_t> local(tokens, tokens + n);
  for (int32_t& id : local) id = id >= first && id < first + rows ? id - first : -1;
  ops_.upload(ids.data(), local.data(), sizeof(int32_t) * n);
}

void Gpt::bindUnit(int unit, void* params, void* grads) {
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
    unitParams_[u] = at(params_, layout_.unitBegin[u]);
    unitGrads_[u] = at(grads_, layout_.unitBegin[u]);
  }
}

std::vector<float> Gpt::initialValues(const GptLayout& layout, int layers, uint64_t seed) {
  std::vector<float> values(layout.total);
  NormalSource normal(seed);
  const double residualScale = 1.0 / std::sqrt(2.0 * layers);
  for (const ParamRange& range : layout.params) {
    float* range0 = values.data() + range.offset;
    const bool gain = range.name.find("ln_") != std::string::npos && range.name.ends_with(".weight");
    const bool bias = range.name.ends_with(".bias");
    const bool residual = range.name.ends_with("c_proj.weight");
    for (size_t i = 0; i < range.numel(); ++i) {
      if (gain) {
        range0[i] = 1.0f;
      } else if (bias) {
        range0[i] = 0.0f;
      } else {
        range0[i] = static_cast<float>(0.02 * normal.next() * (residual ? residualScale : 1.0));
      }
    }
  }
  return values;
}

void Gpt::initialise(uint64_t seed) {
  const GptLayout whole = GptLayout::of(config_);
  std::vector<float> values = initialValues(whole, config_.layers, seed);
  if (tp_ > 1) {
    std::vector<float> local(layout_.total);
    layout_.shard(whole, values.data(), tpRank_, local.data());
    values = std::move(local);
  }
  ops_.uploadFloats(params_.data(), values.data(), values.size());
}

Gpt::Block Gpt::block(void* p) const {
  const size_t C = config_.channels, part = C / tp_;  // this rank's share of C (its heads' channels)
  Block b{};
  b.ln1w = p;
  b.ln1b = at(b.ln1w, C);
  b.qkvw = at(b.ln1b, C);
  b.qkvb = at(b.qkvw, 3 * part * C);
  b.projw = at(b.qkvb, 3 * part);
  b.projb = at(b.projw, C * part);
  b.ln2w = at(b.projb, C);
  b.ln2b = at(b.ln2w, C);
  b.fcw = at(b.ln2b, C);
  b.fcb = at(b.fcw, 4 * part * C);
  b.fcProjw = at(b.fcb, 4 * part);
  b.fcProjb = at(b.fcProjw, 4 * part * C);
  return b;
}

namespace {

size_t bytesOf(const std::initializer_list<const Tensor*>& tensors) {
  size_t bytes = 0;
  for (const Tensor* tensor : tensors) bytes += tensor->bytes();
  return bytes;
}

}  // namespace

size_t Gpt::activationBytes() const {
  const Activations& a = acts_;
  return bytesOf({&a.encoded,   &a.ln1,     &a.ln1Mean, &a.ln1Rstd, &a.qkv,   &a.attY,   &a.att,    &a.attProj,
                  &a.residual2, &a.ln2,     &a.ln2Mean, &a.ln2Rstd, &a.fc,    &a.fcGelu, &a.fcProj, &a.residual3,
                  &a.lnf,       &a.lnfMean, &a.lnfRstd, &a.logits,  &a.probs, &a.losses});
}

size_t Gpt::activationGradientBytes() const {
  const Activations& d = grads2_;
  return bytesOf({&d.encoded, &d.ln1, &d.qkv, &d.attY, &d.attProj, &d.residual2, &d.ln2, &d.fc, &d.fcGelu, &d.fcProj,
                  &d.residual3, &d.lnf, &d.logits, &d.losses});
}

void Gpt::reserve(int B, int T) {
  if (B == B_ && T == T_) return;
  // This rank's heads (NH / t of them, C / t channels), MLP units (4C / t) and vocabulary rows (V / t); with
  // sequence parallelism, its 1/t of the rows outside the tensor-parallel regions (R).
  const int64_t L = config_.layers, NH = config_.heads / tp_, C = config_.channels, part = C / tp_,
                V = config_.vocab / tp_, BT = int64_t{B} * T;
  if (sp_ && BT % tp_ != 0) {
    std::fprintf(stderr, "gpt: sequence parallelism over %d ranks needs B x T (%lld) divisible by it\n", tp_,
                 static_cast<long long>(BT));
    std::abort();
  }
  const int64_t R = sp_ ? BT / tp_ : BT;
  for (Activations* a : {&acts_, &grads2_}) {
    const bool values = a == &acts_;  // what only the forward keeps: statistics, probabilities
    a->encoded = zeros({R, C});
    a->ln1 = zeros({L, R, C});
    a->ln1Mean = values ? floats({L, R}) : Tensor();
    a->ln1Rstd = values ? floats({L, R}) : Tensor();
    a->qkv = zeros({L, BT, 3 * part});
    a->attY = zeros({L, BT, part});
    a->att = values ? zeros({L, B, NH, T, T}) : Tensor();
    a->attProj = zeros({L, R, C});
    a->residual2 = zeros({L, R, C});
    a->ln2 = zeros({L, R, C});
    a->ln2Mean = values ? floats({L, R}) : Tensor();
    a->ln2Rstd = values ? floats({L, R}) : Tensor();
    a->fc = zeros({L, BT, 4 * part});
    a->fcGelu = zeros({L, BT, 4 * part});
    a->fcProj = zeros({L, R, C});
    a->residual3 = zeros({L, R, C});
    a->lnf = zeros({R, C});
    a->lnfMean = values ? floats({R}) : Tensor();
    a->lnfRstd = values ? floats({R}) : Tensor();
    a->logits = zeros({BT, V});
    a->probs = values ? zeros({BT, V}) : Tensor();
    a->losses = floats({BT});
  }
  tokens_ = Tensor::zeros({BT}, DType::kInt32, &ops_);
  targets_ = Tensor::zeros({BT}, DType::kInt32, &ops_);
  if (tp_ > 1) {
    crossMax_ = floats({BT});
    crossSums_ = floats({BT});
    crossTargets_ = floats({BT});
  }
  if (sp_) {
    gathered_ = zeros({BT, C});
    partial_ = zeros({BT, C});
    layernormGrads_ = zeros({2 * C});
  }
  losses_.assign(BT, 0.0f);
  rowsHere_ = static_cast<int>(R);
  B_ = B;
  T_ = T;
}

float Gpt::crossEntropy(int BT, int V) {
  Activations& a = acts_;
  if (tp_ == 1) {
    ops_.crossEntropyForward(a.losses.f32(), a.probs.data(), a.logits.data(), targets_.i32(), BT, V);
  } else {  // the vocabulary's parts: the maximum, then the sum of exponentials and the target's logit
    ops_.crossEntropyMax(crossMax_.f32(), a.logits.data(), BT, V);
    tensorParallelAllReduce(crossMax_.data(), BT, loomFloat32, loomMax);
    ops_.crossEntropyExp(crossSums_.f32(), crossTargets_.f32(), a.probs.data(), a.logits.data(), crossMax_.f32(),
                         targets_.i32(), BT, V);
    tensorParallelAllReduce(crossSums_.data(), BT, loomFloat32, loomSum);
    tensorParallelAllReduce(crossTargets_.data(), BT, loomFloat32, loomSum);
    ops_.crossEntropyFinish(a.losses.f32(), a.probs.data(), crossSums_.f32(), crossTargets_.f32(), BT, V);
  }
  ops_.download(losses_.data(), a.losses.data(), sizeof(float) * BT);  // fp32 whatever the model's dtype
  double sum = 0;
  for (float loss : losses_) sum += loss;
  return static_cast<float>(sum / BT);
}

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (T > config_.maxT || B < 1 || T < 1) {
    std::fprintf(stderr, "gpt: a batch of %d x %d tokens (at most %d per sequence)\n", B, T, config_.maxT);
    std::abort();
  }
  reserve(B, T);
  const int L = config_.layers, NH = config_.heads / tp_, C = config_.channels, part = C / tp_, V = config_.vocab / tp_,
            BT = B * T, R = rowsHere_;
  uploadLocalIds(tokens_, tokens, BT);
  haveTargets_ = targets != nullptr;
  if (haveTargets_) uploadLocalIds(targets_, targets, BT);
  const int lnfUnit = L + 1;
  const bool lead = tpRank_ == 0;  // adds what the ranks' sum must count once: positions, row-parallel biases
  acquire(0, false);
  // Unit 0: wte [V, C] (this rank's rows), then wpe; the final layernorm's unit: its weight, then its bias.
  void* wte = unitParams_[0];
  void* wpe = at(unitParams_[0], static_cast<size_t>(V) * C);
  Activations& a = acts_;
  // rows: this rank's positions of C values (all of them without sequence parallelism); partRows: all positions of
  // this rank's C / t channels, in the tensor-parallel regions.
  const size_t rows = static_cast<size_t>(R) * C, partRows = static_cast<size_t>(BT) * part;
  void* embedded = partialBuffer(a.encoded.data(), partial_);
  ops_.embeddingForward(embedded, tokens_.i32(), wte, lead ? wpe : zeroPositions_.data(), B, T, C);
  finishRows(embedded, a.encoded.data());
  for (int l = 0; l < L; ++l) {
    acquire(l + 1, false);
    const Block w = block(unitParams_[l + 1]);
    void* x = l == 0 ? a.encoded.data() : at(a.residual3, (l - 1) * rows);
    void* ln1 = at(a.ln1, l * rows);
    void* qkv = at(a.qkv, l * 3 * partRows);
    void* attY = at(a.attY, l * partRows);
    void* att = at(a.att, static_cast<size_t>(l) * B * NH * T * T);
    void* attProj = at(a.attProj, l * rows);
    void* residual2 = at(a.residual2, l * rows);
    void* ln2 = at(a.ln2, l * rows);
    void* fc = at(a.fc, l * 4 * partRows);
    void* fcGelu = at(a.fcGelu, l * 4 * partRows);
    void* fcProj = at(a.fcProj, l * rows);
    void* residual3 = at(a.residual3, l * rows);
    ops_.layernormForward(ln1, a.ln1Mean.f32() + l * R, a.ln1Rstd.f32() + l * R, x, w.ln1w, w.ln1b, R, C);
    ops_.matmulForward(qkv, gatherRows(ln1, gathered_), w.qkvw, w.qkvb, BT, C, 3 * part);  // f
    ops_.attentionForward(attY, att, qkv, B, T, part, NH);
    void* attPartial = partialBuffer(attProj, partial_);
    ops_.matmulForward(attPartial, attY, w.projw, lead ? w.projb : nullptr, BT, part, C);
    finishRows(attPartial, attProj);  // g
    ops_.residualForward(residual2, x, attProj, rows);
    ops_.layernormForward(ln2, a.ln2Mean.f32() + l * R, a.ln2Rstd.f32() + l * R, residual2, w.ln2w, w.ln2b, R, C);
    ops_.matmulForward(fc, gatherRows(ln2, gathered_), w.fcw, w.fcb, BT, C, 4 * part);
    ops_.geluForward(fcGelu, fc, 4 * partRows);
    void* mlpPartial = partialBuffer(fcProj, partial_);
    ops_.matmulForward(mlpPartial, fcGelu, w.fcProjw, lead ? w.fcProjb : nullptr, BT, 4 * part, C);
    finishRows(mlpPartial, fcProj);
    ops_.residualForward(residual3, residual2, fcProj, rows);
    release(l + 1, false);
  }
  void* last = at(a.residual3, (L - 1) * rows);
  acquire(lnfUnit, false);
  void* lnfw = unitParams_[lnfUnit];
  void* lnfb = at(lnfw, C);
  ops_.layernormForward(a.lnf.data(), a.lnfMean.f32(), a.lnfRstd.f32(), last, lnfw, lnfb, R, C);
  release(lnfUnit, false);
  ops_.matmulForward(a.logits.data(), gatherRows(a.lnf.data(), gathered_), wte, nullptr, BT, C, V);
  release(0, false);
  return haveTargets_ ? crossEntropy(BT, V) : 0.0f;
}

void Gpt::backward(float lossScale) {
  if (!haveTargets_) {
    std::fprintf(stderr, "gpt: backward() needs a forward() with targets\n");
    std::abort();
  }
  const int B = B_, T = T_, L = config_.layers, NH = config_.heads / tp_, C = config_.channels, part = C / tp_,
            V = config_.vocab / tp_, BT = B * T, R = rowsHere_;
  const size_t rows = static_cast<size_t>(R) * C, partRows = static_cast<size_t>(BT) * part;
  Activations& a = acts_;
  Activations& d = grads2_;
  for (Tensor* t : {&d.encoded, &d.ln1, &d.qkv, &d.attY, &d.attProj, &d.residual2, &d.ln2, &d.fc, &d.fcGelu, &d.fcProj,
                    &d.residual3, &d.lnf, &d.logits})
    t->zero();
  const int lnfUnit = L + 1;
  acquire(0, true);
  acquire(lnfUnit, true);
  void* wte = unitParams_[0];
  void* dwte = unitGrads_[0];
  void* dwpe = at(unitGrads_[0], static_cast<size_t>(V) * C);
  // The mean over B * T positions.
  const std::vector<float> dlosses(BT, lossScale / BT);
  ops_.upload(d.losses.data(), dlosses.data(), sizeof(float) * BT);
  ops_.crossEntropyBackward(d.logits.data(), d.losses.f32(), a.probs.data(), targets_.i32(), BT, V);
  // The head's input: each rank's vocabulary adds its part (the dual of gathering the rows).
  void* headPartial = partialBuffer(d.lnf.data(), partial_);
  ops_.matmulBackward(headPartial, dwte, nullptr, d.logits.data(), gatherRows(a.lnf.data(), gathered_), wte, BT, C, V);
  finishRows(headPartial, d.lnf.data());
  layernormBackward(at(d.residual3, (L - 1) * rows), unitGrads_[lnfUnit], d.lnf.data(), at(a.residual3, (L - 1) * rows),
                    unitParams_[lnfUnit], a.lnfMean.f32(), a.lnfRstd.f32());
  release(lnfUnit, true);
  for (int l = L - 1; l >= 0; --l) {
    acquire(l + 1, true);
    const Block w = block(unitParams_[l + 1]);
    const Block dw = block(unitGrads_[l + 1]);
    void* x = l == 0 ? a.encoded.data() : at(a.residual3, (l - 1) * rows);
    void* dx = l == 0 ? d.encoded.data() : at(d.residual3, (l - 1) * rows);
    const size_t r = l * rows, pr = l * partRows;
    ops_.residualBackward(at(d.residual2, r), at(d.fcProj, r), at(d.residual3, r), rows);
    // g's dual: the output's gradient over all rows.
    ops_.matmulBackward(at(d.fcGelu, 4 * pr), dw.fcProjw, dw.fcProjb, gatherRows(at(d.fcProj, r), gathered_),
                        at(a.fcGelu, 4 * pr), w.fcProjw, BT, 4 * part, C);
    ops_.geluBackward(at(d.fc, 4 * pr), at(d.fcGelu, 4 * pr), at(a.fc, 4 * pr), 4 * partRows);
    void* mlpInput = partialBuffer(at(d.ln2, r), partial_);  // f's dual: the ranks' parts summed
    ops_.matmulBackward(mlpInput, dw.fcw, dw.fcb, at(d.fc, 4 * pr), gatherRows(at(a.ln2, r), gathered_), w.fcw, BT, C,
                        4 * part);
    finishRows(mlpInput, at(d.ln2, r));
    layernormBackward(at(d.residual2, r), dw.ln2w, at(d.ln2, r), at(a.residual2, r), w.ln2w, a.ln2Mean.f32() + l * R,
                      a.ln2Rstd.f32() + l * R);
    ops_.residualBackward(dx, at(d.attProj, r), at(d.residual2, r), rows);
    ops_.matmulBackward(at(d.attY, pr), dw.projw, dw.projb, gatherRows(at(d.attProj, r), gathered_), at(a.attY, pr),
                        w.projw, BT, part, C);
    ops_.attentionBackward(at(d.qkv, 3 * pr), at(d.attY, pr), at(a.qkv, 3 * pr),
                           at(a.att, static_cast<size_t>(l) * B * NH * T * T), B, T, part, NH);
    void* attentionInput = partialBuffer(at(d.ln1, r), partial_);
    ops_.matmulBackward(attentionInput, dw.qkvw, dw.qkvb, at(d.qkv, 3 * pr), gatherRows(at(a.ln1, r), gathered_),
                        w.qkvw, BT, C, 3 * part);
    finishRows(attentionInput, at(d.ln1, r));
    layernormBackward(dx, dw.ln1w, at(d.ln1, r), x, w.ln1w, a.ln1Mean.f32() + l * R, a.ln1Rstd.f32() + l * R);
    release(l + 1, true);
  }
  ops_.embeddingBackward(dwte, dwpe, gatherRows(d.encoded.data(), gathered_), tokens_.i32(), B, T, C, V);
  release(0, true);
}

}  // namespace loom::parallel
