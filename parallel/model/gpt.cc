// The reference GPT's initialisation, forward and backward (gpt.h); its presets and parameter layout are in
// gpt_layout.cc.
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

}  // namespace

namespace {

int countOf(loomComm_t comm) {
  int count = 1;
  if (comm != nullptr) loomCommCount(comm, &count);
  return count;
}

int rankOf(loomComm_t comm) {
  int rank = 0;
  if (comm != nullptr) loomCommUserRank(comm, &rank);
  return rank;
}

}  // namespace

Gpt::Gpt(const GptConfig& config, Ops& ops, loomComm_t tensorParallel, bool sequenceParallel, loomComm_t pipeline,
         int chunks, loomComm_t expertParallel)
    : config_(config),
      ops_(ops),
      tensor_(tensorParallel, sequenceParallel, ops),
      tp_(tensor_.size()),
      tpRank_(tensor_.rank()),
      sp_(tensor_.sequenceParallel()),
      pipeline_(pipeline, ops),
      layout_(GptLayout::of(config, tp_, PipelineStage{countOf(pipeline), rankOf(pipeline), chunks},
                            countOf(expertParallel), rankOf(expertParallel))) {
  std::string problem = config.check();
  if (problem.empty() && (config.heads % tp_ != 0 || config.vocab % tp_ != 0))
    problem = "tensor parallelism over " + std::to_string(tp_) + " ranks needs heads (" + std::to_string(config.heads) +
              ") and vocab (" + std::to_string(config.vocab) + ") divisible by it";
  if (problem.empty()) problem = layout_.stage.check(config.layers);
  if (problem.empty() && config.experts > 0 && tp_ > 1)
    problem = "experts do not combine with tensor parallelism (spread them with expert parallelism)";
  if (problem.empty() && config.experts % countOf(expertParallel) != 0)
    problem = std::to_string(config.experts) + " experts do not spread evenly over " +
              std::to_string(countOf(expertParallel)) + " expert-parallel ranks";
  if (!problem.empty()) {
    std::fprintf(stderr, "gpt: %s\n", problem.c_str());
    std::abort();
  }
  if (tp_ > 1) zeroPositions_ = zeros({config.maxT, config.channels});
  if (config.experts > 0) {
    ep_ = countOf(expertParallel);
    epRank_ = rankOf(expertParallel);
    moe_ = std::make_unique<MoeLayer>(
        MoeShape{config.experts, config.topk, config.channels, config.hidden(), config.capacityFactor,
                 config.dropPolicy, config.auxLossCoefficient, config.expertDispatch},
        ops_, ep_ > 1 ? expertParallel : nullptr);
  }
  // The units in GptLayout::of's order.
  const PipelineStage& stage = layout_.stage;
  layersPerChunk_ = config.layers / stage.virtualStages();
  int unit = 0;
  if (stage.holdsEmbeddings()) embeddingUnit_ = unit++;
  blockUnit_.assign(config.layers, -1);
  expertUnit_.assign(config.layers, -1);
  for (int chunk = 0; chunk < stage.chunks; ++chunk)
    for (int l = 0; l < layersPerChunk_; ++l) {
      blockUnit_[firstLayer(chunk) + l] = unit++;
      if (config.experts > 0) expertUnit_[firstLayer(chunk) + l] = unit++;
    }
  if (stage.holdsHead()) {
    lnfUnit_ = unit++;
    headUnit_ = stage.holdsEmbeddings() ? embeddingUnit_ : unit++;
  }
  unitParams_.assign(unit, nullptr);
  unitGrads_.assign(unit, nullptr);
  params_ = zeros({static_cast<int64_t>(layout_.total)});
  grads_ = zeros({static_cast<int64_t>(layout_.total)});
  bindDefault();
}

Gpt::~Gpt() = default;

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
  tensor_.allReduce(layernormGrads_.data(), 2 * C, loomTypeOf(ops_.dtype()), loomSum);
  ops_.add(dparams, layernormGrads_.data(), 2 * C);
}

double Gpt::sumOverModelParallel(double value) {
  value = tensor_.sum(value);
  value = pipeline_.sum(value);
  return moe_ ? moe_->sumOverRanks(value) : value;
}

double Gpt::gradientSquares(const void* grads, size_t begin, size_t end, size_t gradsBase) const {
  const bool tiedCopy = headUnit_ >= 0 && headUnit_ != embeddingUnit_;
  if ((tp_ == 1 || tpRank_ == 0) && !tiedCopy && epRank_ == 0)
    return end > begin ? ops_.sumOfSquares(elementAt(ops_, grads, begin - gradsBase), end - begin) : 0;
  double squares = 0;
  for (const ParamRange& range : layout_.params) {
    if (range.tiedCopy) continue;                                           // counted on the first stage
    if (epRank_ != 0 && !range.expert) continue;                            // counted on expert-parallel rank 0
    if (tpRank_ != 0 && range.split == TensorSplit::kReplicated) continue;  // counted on tensor-parallel rank 0
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
  if (tp_ > 1 || pipelined() || ep_ > 1) {
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
  b.router = b.fcw;  // with experts the router follows the layernorm
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
  size_t bytes = 0;
  for (const auto& slot : slots_) {
    const Activations& a = slot->acts;
    bytes += bytesOf({&a.encoded,   &a.ln1,     &a.ln1Mean, &a.ln1Rstd, &a.qkv,   &a.attY,   &a.att,    &a.attProj,
                      &a.residual2, &a.ln2,     &a.ln2Mean, &a.ln2Rstd, &a.fc,    &a.fcGelu, &a.fcProj, &a.residual3,
                      &a.lnf,       &a.lnfMean, &a.lnfRstd, &a.logits,  &a.probs, &a.losses});
    for (const MoeState& state : slot->moe) bytes += state.bytes();  // its routing's rows, the experts' activations
  }
  return bytes;
}

size_t Gpt::activationGradientBytes() const {
  size_t bytes = 0;
  for (const auto& slot : slots_) {
    const Activations& d = slot->grads;
    bytes += bytesOf({&d.encoded, &d.ln1, &d.qkv, &d.attY, &d.attProj, &d.residual2, &d.ln2, &d.fc, &d.fcGelu,
                      &d.fcProj, &d.residual3, &d.lnf, &d.logits, &d.losses});
  }
  return bytes;
}

size_t Gpt::boundaryElements(int B, int T) const {
  const size_t BT = static_cast<size_t>(B) * T;
  return (sp_ ? BT / tp_ : BT) * config_.channels;
}

Gpt::Slot& Gpt::slotAt(int index, const char* pass) {
  if (index < 0 || static_cast<size_t>(index) >= slots_.size() || slots_[index]->chunk < 0) {
    std::fprintf(stderr, "gpt: %s on activation slot %d, which no forward pass has filled\n", pass, index);
    std::abort();
  }
  Slot& slot = *slots_[index];
  rowsHere_ = static_cast<int>(boundaryElements(slot.B, slot.T) / config_.channels);
  tensor_.setElementsHere(static_cast<size_t>(rowsHere_) * config_.channels);
  return slot;
}

void* Gpt::passInput(int chunk, int slot, int B, int T) { return reserve(slot, chunk, B, T).acts.encoded.data(); }

const void* Gpt::passOutput(int index) {
  Slot& slot = slotAt(index, "passOutput");
  return at(slot.acts.residual3, (layersPerChunk_ - 1) * boundaryElements(slot.B, slot.T));
}

void* Gpt::outputGradient(int index) {
  Slot& slot = slotAt(index, "outputGradient");
  return at(slot.grads.residual3, (layersPerChunk_ - 1) * boundaryElements(slot.B, slot.T));
}

const void* Gpt::inputGradient(int slot) { return slotAt(slot, "inputGradient").grads.encoded.data(); }

Gpt::Slot& Gpt::reserve(int index, int chunk, int B, int T) {
  const int64_t BT = int64_t{B} * T;
  if (sp_ && BT % tp_ != 0) {
    std::fprintf(stderr, "gpt: sequence parallelism over %d ranks needs B x T (%lld) divisible by it\n", tp_,
                 static_cast<long long>(BT));
    std::abort();
  }
  if (index < 0 || chunk < 0 || chunk >= layout_.stage.chunks) {
    std::fprintf(stderr, "gpt: a pass of chunk %d (of %d) on activation slot %d\n", chunk, layout_.stage.chunks, index);
    std::abort();
  }
  while (slots_.size() <= static_cast<size_t>(index)) slots_.push_back(std::make_unique<Slot>());
  Slot& slot = *slots_[index];
  // This rank's heads (NH / t of them, C / t channels), MLP units (4C / t) and vocabulary rows (V / t); with
  // sequence parallelism, its 1/t of the rows outside the tensor-parallel regions (R). The chunk's layers only, and
  // the head's tensors only on the last virtual stage.
  const int64_t L = layersPerChunk_, NH = config_.heads / tp_, C = config_.channels, part = C / tp_,
                V = config_.vocab / tp_, R = sp_ ? BT / tp_ : BT;
  const bool head = lastChunk(chunk), dense = config_.experts == 0;
  if (slot.chunk != chunk || slot.B != B || slot.T != T) {
    auto only = [](bool keep, Tensor tensor) { return keep ? std::move(tensor) : Tensor(); };
    for (Activations* a : {&slot.acts, &slot.grads}) {
      const bool values = a == &slot.acts;  // what only the forward keeps: statistics, probabilities
      a->encoded = zeros({R, C});
      a->ln1 = zeros({L, R, C});
      a->ln1Mean = only(values, floats({L, R}));
      a->ln1Rstd = only(values, floats({L, R}));
      a->qkv = zeros({L, BT, 3 * part});
      a->attY = zeros({L, BT, part});
      a->att = only(values, zeros({L, B, NH, T, T}));
      a->attProj = zeros({L, R, C});
      a->residual2 = zeros({L, R, C});
      a->ln2 = zeros({L, R, C});
      a->ln2Mean = only(values, floats({L, R}));
      a->ln2Rstd = only(values, floats({L, R}));
      a->fc = only(dense, zeros({L, BT, 4 * part}));
      a->fcGelu = only(dense, zeros({L, BT, 4 * part}));
      a->fcProj = zeros({L, R, C});
      a->residual3 = zeros({L, R, C});
      a->lnf = only(head, zeros({R, C}));
      a->lnfMean = only(head && values, floats({R}));
      a->lnfRstd = only(head && values, floats({R}));
      a->logits = only(head, zeros({BT, V}));
      a->probs = only(head && values, zeros({BT, V}));
      a->losses = only(head, floats({BT}));
    }
    slot.tokens = only(firstChunk(chunk), Tensor::zeros({BT}, DType::kInt32, &ops_));
    slot.targets = only(head, Tensor::zeros({BT}, DType::kInt32, &ops_));
    slot.crossMax = only(head && tp_ > 1, floats({BT}));
    slot.crossSums = only(head && tp_ > 1, floats({BT}));
    slot.crossTargets = only(head && tp_ > 1, floats({BT}));
    slot.losses.assign(head ? BT : 0, 0.0f);
    slot.moe.assign(dense ? 0 : L, MoeState{});
    slot.chunk = chunk;
    slot.B = B;
    slot.T = T;
  }
  if (sp_ && scratchBT_ != BT) {
    layernormGrads_ = zeros({2 * C});
    scratchBT_ = static_cast<int>(BT);
  }
  tensor_.reserve(BT, config_.channels);
  rowsHere_ = static_cast<int>(R);
  tensor_.setElementsHere(static_cast<size_t>(rowsHere_) * config_.channels);
  return slot;
}

float Gpt::crossEntropy(Slot& slot, int BT, int V) {
  Activations& a = slot.acts;
  if (tp_ == 1) {
    ops_.crossEntropyForward(a.losses.f32(), a.probs.data(), a.logits.data(), slot.targets.i32(), BT, V);
  } else {  // the vocabulary's parts: the maximum, then the sum of exponentials and the target's logit
    ops_.crossEntropyMax(slot.crossMax.f32(), a.logits.data(), BT, V);
    tensor_.allReduce(slot.crossMax.data(), BT, loomFloat32, loomMax);
    ops_.crossEntropyExp(slot.crossSums.f32(), slot.crossTargets.f32(), a.probs.data(), a.logits.data(),
                         slot.crossMax.f32(), slot.targets.i32(), BT, V);
    tensor_.allReduce(slot.crossSums.data(), BT, loomFloat32, loomSum);
    tensor_.allReduce(slot.crossTargets.data(), BT, loomFloat32, loomSum);
    ops_.crossEntropyFinish(a.losses.f32(), a.probs.data(), slot.crossSums.f32(), slot.crossTargets.f32(), BT, V);
  }
  ops_.download(slot.losses.data(), a.losses.data(), sizeof(float) * BT);  // fp32 whatever the model's dtype
  double sum = 0;
  for (float loss : slot.losses) sum += loss;
  return static_cast<float>(sum / BT);
}

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (pipelined()) {
    std::fprintf(stderr, "gpt: forward() runs the whole model; a pipeline stage runs forwardPass()\n");
    std::abort();
  }
  return forwardPass(0, 0, tokens, targets, B, T);
}

void Gpt::backward(float lossScale) {
  if (pipelined()) {
    std::fprintf(stderr, "gpt: backward() runs the whole model; a pipeline stage runs backwardPass()\n");
    std::abort();
  }
  backwardPass(0, lossScale, true);
}

float Gpt::forwardPass(int chunk, int index, const int32_t* tokens, const int32_t* targets, int B, int T) {
  if (T > config_.maxT || B < 1 || T < 1) {
    std::fprintf(stderr, "gpt: a batch of %d x %d tokens (at most %d per sequence)\n", B, T, config_.maxT);
    std::abort();
  }
  Slot& slot = reserve(index, chunk, B, T);
  hooksOn_ = !pipelined();
  lastAuxLoss_ = 0;
  const int L = layersPerChunk_, first = firstLayer(chunk), NH = config_.heads / tp_, C = config_.channels,
            part = C / tp_, V = config_.vocab / tp_, BT = B * T, R = rowsHere_;
  const bool embed = firstChunk(chunk), head = lastChunk(chunk);
  if (embed) uploadLocalIds(slot.tokens, tokens, BT);
  slot.haveTargets = head && targets != nullptr;
  if (slot.haveTargets) uploadLocalIds(slot.targets, targets, BT);
  const bool lead = tpRank_ == 0;  // adds what the ranks' sum must count once: positions, row-parallel biases
  Activations& a = slot.acts;
  // rows: this rank's positions of C values (all of them without sequence parallelism); partRows: all positions of
  // this rank's C / t channels, in the tensor-parallel regions.
  const size_t rows = static_cast<size_t>(R) * C, partRows = static_cast<size_t>(BT) * part;
  if (embed) {  // else a.encoded holds the previous virtual stage's output
    acquire(embeddingUnit_, false);
    // The embeddings' unit: wte [V, C] (this rank's rows), then wpe.
    void* wte = unitParams_[embeddingUnit_];
    void* wpe = at(wte, static_cast<size_t>(V) * C);
    void* embedded = tensor_.partialBuffer(a.encoded.data());
    ops_.embeddingForward(embedded, slot.tokens.i32(), wte, lead ? wpe : zeroPositions_.data(), B, T, C);
    tensor_.finishRows(embedded, a.encoded.data());
  }
  for (int l = 0; l < L; ++l) {
    const int unit = blockUnit_[first + l];
    acquire(unit, false);
    const Block w = block(unitParams_[unit]);
    void* x = l == 0 ? a.encoded.data() : at(a.residual3, (l - 1) * rows);
    void* ln1 = at(a.ln1, l * rows);
    void* qkv = at(a.qkv, l * 3 * partRows);
    void* attY = at(a.attY, l * partRows);
    void* att = at(a.att, static_cast<size_t>(l) * B * NH * T * T);
    void* attProj = at(a.attProj, l * rows);
    void* residual2 = at(a.residual2, l * rows);
    void* ln2 = at(a.ln2, l * rows);
    void* fc = moe_ ? nullptr : at(a.fc, l * 4 * partRows);
    void* fcGelu = moe_ ? nullptr : at(a.fcGelu, l * 4 * partRows);
    void* fcProj = at(a.fcProj, l * rows);
    void* residual3 = at(a.residual3, l * rows);
    ops_.layernormForward(ln1, a.ln1Mean.f32() + l * R, a.ln1Rstd.f32() + l * R, x, w.ln1w, w.ln1b, R, C);
    ops_.matmulForward(qkv, tensor_.gatherRows(ln1), w.qkvw, w.qkvb, BT, C, 3 * part);  // f
    ops_.attentionForward(attY, att, qkv, B, T, part, NH);
    void* attPartial = tensor_.partialBuffer(attProj);
    ops_.matmulForward(attPartial, attY, w.projw, lead ? w.projb : nullptr, BT, part, C);
    tensor_.finishRows(attPartial, attProj);  // g
    ops_.residualForward(residual2, x, attProj, rows);
    ops_.layernormForward(ln2, a.ln2Mean.f32() + l * R, a.ln2Rstd.f32() + l * R, residual2, w.ln2w, w.ln2b, R, C);
    if (moe_) {
      const int experts = expertUnit_[first + l];
      acquire(experts, false);
      MoeState& state = slot.moe[l];
      lastAuxLoss_ += moe_->forward(state, fcProj, ln2, BT, MoeParams{w.router, unitParams_[experts]});
      routed_ += static_cast<int64_t>(BT) * config_.topk;
      dropped_ += state.dropped;
      release(experts, false);
    } else {
      ops_.matmulForward(fc, tensor_.gatherRows(ln2), w.fcw, w.fcb, BT, C, 4 * part);
      ops_.geluForward(fcGelu, fc, 4 * partRows);
      void* mlpPartial = tensor_.partialBuffer(fcProj);
      ops_.matmulForward(mlpPartial, fcGelu, w.fcProjw, lead ? w.fcProjb : nullptr, BT, 4 * part, C);
      tensor_.finishRows(mlpPartial, fcProj);
    }
    ops_.residualForward(residual3, residual2, fcProj, rows);
    release(unit, false);
  }
  if (head) {
    void* last = at(a.residual3, (L - 1) * rows);
    acquire(lnfUnit_, false);
    void* lnfw = unitParams_[lnfUnit_];
    void* lnfb = at(lnfw, C);
    ops_.layernormForward(a.lnf.data(), a.lnfMean.f32(), a.lnfRstd.f32(), last, lnfw, lnfb, R, C);
    release(lnfUnit_, false);
    if (headUnit_ != embeddingUnit_) acquire(headUnit_, false);
    ops_.matmulForward(a.logits.data(), tensor_.gatherRows(a.lnf.data()), unitParams_[headUnit_], nullptr, BT, C, V);
    release(headUnit_, false);
  }
  if (embed && embeddingUnit_ != headUnit_) release(embeddingUnit_, false);
  return slot.haveTargets ? crossEntropy(slot, BT, V) : 0.0f;
}

void Gpt::headBackward(Slot& slot, bool input, bool weights) {
  const int C = config_.channels, V = config_.vocab / tp_, BT = slot.B * slot.T;
  Activations& a = slot.acts;
  Activations& d = slot.grads;
  const void* lnf = tensor_.gatherRows(a.lnf.data());
  // The head's input: each rank's vocabulary adds its part (the dual of gathering the rows).
  void* headPartial = input ? tensor_.partialBuffer(d.lnf.data()) : nullptr;
  ops_.matmulBackward(headPartial, weights ? unitGrads_[headUnit_] : nullptr, nullptr, d.logits.data(), lnf,
                      unitParams_[headUnit_], BT, C, V);
  if (input) tensor_.finishRows(headPartial, d.lnf.data());
}

void Gpt::blockBackward(Slot& slot, int l, bool input, bool weights) {
  const int B = slot.B, T = slot.T, NH = config_.heads / tp_, C = config_.channels, part = C / tp_, BT = B * T,
            R = rowsHere_;
  const size_t rows = static_cast<size_t>(R) * C, partRows = static_cast<size_t>(BT) * part;
  const int unit = blockUnit_[firstLayer(slot.chunk) + l];
  Activations& a = slot.acts;
  Activations& d = slot.grads;
  const Block w = block(unitParams_[unit]);
  const Block dw = block(unitGrads_[unit]);
  // A linear layer's backward: the input's gradient, the weights', or both.
  auto linear = [&](void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                    int inputs, int outputs) {
    ops_.matmulBackward(input ? dinp : nullptr, weights ? dweight : nullptr, weights ? dbias : nullptr, dout, inp,
                        weight, BT, inputs, outputs);
  };
  void* x = l == 0 ? a.encoded.data() : at(a.residual3, (l - 1) * rows);
  void* dx = l == 0 ? d.encoded.data() : at(d.residual3, (l - 1) * rows);
  const size_t r = l * rows, pr = l * partRows;
  if (input) ops_.residualBackward(at(d.residual2, r), at(d.fcProj, r), at(d.residual3, r), rows);
  if (moe_) {
    const int experts = expertUnit_[firstLayer(slot.chunk) + l];
    moe_->backward(slot.moe[l], at(d.ln2, r), at(d.fcProj, r), at(a.ln2, r), MoeParams{w.router, unitParams_[experts]},
                   MoeGrads{dw.router, unitGrads_[experts]}, slot.lossScale, input, weights);
  } else {
    // g's dual: the output's gradient over all rows.
    linear(at(d.fcGelu, 4 * pr), dw.fcProjw, dw.fcProjb, tensor_.gatherRows(at(d.fcProj, r)), at(a.fcGelu, 4 * pr),
           w.fcProjw, 4 * part, C);
    if (input) ops_.geluBackward(at(d.fc, 4 * pr), at(d.fcGelu, 4 * pr), at(a.fc, 4 * pr), 4 * partRows);
    void* mlpInput = input ? tensor_.partialBuffer(at(d.ln2, r)) : nullptr;  // f's dual: the ranks' parts summed
    linear(mlpInput, dw.fcw, dw.fcb, at(d.fc, 4 * pr), tensor_.gatherRows(at(a.ln2, r)), w.fcw, C, 4 * part);
    if (input) tensor_.finishRows(mlpInput, at(d.ln2, r));
  }
  if (input) {
    layernormBackward(at(d.residual2, r), dw.ln2w, at(d.ln2, r), at(a.residual2, r), w.ln2w, a.ln2Mean.f32() + l * R,
                      a.ln2Rstd.f32() + l * R);
    ops_.residualBackward(dx, at(d.attProj, r), at(d.residual2, r), rows);
  }
  linear(at(d.attY, pr), dw.projw, dw.projb, tensor_.gatherRows(at(d.attProj, r)), at(a.attY, pr), w.projw, part, C);
  if (input)
    ops_.attentionBackward(at(d.qkv, 3 * pr), at(d.attY, pr), at(a.qkv, 3 * pr),
                           at(a.att, static_cast<size_t>(l) * B * NH * T * T), B, T, part, NH);
  void* attentionInput = input ? tensor_.partialBuffer(at(d.ln1, r)) : nullptr;
  linear(attentionInput, dw.qkvw, dw.qkvb, at(d.qkv, 3 * pr), tensor_.gatherRows(at(a.ln1, r)), w.qkvw, C, 3 * part);
  if (input) {
    tensor_.finishRows(attentionInput, at(d.ln1, r));
    layernormBackward(dx, dw.ln1w, at(d.ln1, r), x, w.ln1w, a.ln1Mean.f32() + l * R, a.ln1Rstd.f32() + l * R);
  }
}

void Gpt::embeddingBackward(Slot& slot) {
  const int C = config_.channels, V = config_.vocab / tp_;
  void* dwte = unitGrads_[embeddingUnit_];
  void* dwpe = at(dwte, static_cast<size_t>(V) * C);
  ops_.embeddingBackward(dwte, dwpe, tensor_.gatherRows(slot.grads.encoded.data()), slot.tokens.i32(), slot.B, slot.T,
                         C, V);
}

void Gpt::backwardPass(int index, float lossScale, bool weights) {
  Slot& slot = slotAt(index, "backwardPass");
  const bool embed = firstChunk(slot.chunk), head = lastChunk(slot.chunk);
  if (head && !slot.haveTargets) {
    std::fprintf(stderr, "gpt: backward needs a forward with targets\n");
    std::abort();
  }
  hooksOn_ = !pipelined() && weights;
  slot.lossScale = lossScale;
  const int L = layersPerChunk_, C = config_.channels, V = config_.vocab / tp_, BT = slot.B * slot.T;
  const size_t rows = static_cast<size_t>(rowsHere_) * C;
  Activations& a = slot.acts;
  Activations& d = slot.grads;
  // The kernels add into the gradients: all zero but the output's, which the next virtual stage sent.
  for (Tensor* t : {&d.encoded, &d.ln1, &d.qkv, &d.attY, &d.attProj, &d.residual2, &d.ln2, &d.fc, &d.fcGelu, &d.fcProj,
                    &d.lnf, &d.logits})
    t->zero();
  ops_.zero(d.residual3.data(), (head ? L : L - 1) * rows * ops_.elementBytes());
  if (head) {
    acquire(headUnit_, true);
    acquire(lnfUnit_, true);
    // The mean over B * T positions.
    const std::vector<float> dlosses(BT, lossScale / BT);
    ops_.upload(d.losses.data(), dlosses.data(), sizeof(float) * BT);
    ops_.crossEntropyBackward(d.logits.data(), d.losses.f32(), a.probs.data(), slot.targets.i32(), BT, V);
    headBackward(slot, true, weights);
    layernormBackward(at(d.residual3, (L - 1) * rows), unitGrads_[lnfUnit_], d.lnf.data(),
                      at(a.residual3, (L - 1) * rows), unitParams_[lnfUnit_], a.lnfMean.f32(), a.lnfRstd.f32());
    release(lnfUnit_, true);
  }
  for (int l = L - 1; l >= 0; --l) {
    const int unit = blockUnit_[firstLayer(slot.chunk) + l], experts = expertUnit_[firstLayer(slot.chunk) + l];
    if (experts >= 0) acquire(experts, true);  // the MLP's first: the unit after the block's
    acquire(unit, true);
    blockBackward(slot, l, true, weights);
    if (experts >= 0) release(experts, true);
    release(unit, true);
  }
  if (embed && weights) {
    if (embeddingUnit_ != headUnit_) acquire(embeddingUnit_, true);
    embeddingBackward(slot);
  }
  if (head) release(headUnit_, true);
  if (embed && embeddingUnit_ != headUnit_) release(embeddingUnit_, true);
}

void Gpt::weightPass(int index) {
  Slot& slot = slotAt(index, "weightPass");
  hooksOn_ = false;
  if (lastChunk(slot.chunk)) headBackward(slot, false, true);
  for (int l = layersPerChunk_ - 1; l >= 0; --l) blockBackward(slot, l, false, true);
  if (firstChunk(slot.chunk)) embeddingBackward(slot);
}

void Gpt::synchronizeTiedGradients() {
  const PipelineStage& stage = layout_.stage;
  if (stage.stages == 1 || (!stage.holdsEmbeddings() && !stage.holdsHead())) return;
  const size_t n = static_cast<size_t>(config_.vocab / tp_) * config_.channels;
  pipeline_.sumTied(unitGrads_[stage.holdsEmbeddings() ? embeddingUnit_ : headUnit_], n);
}

}  // namespace loom::parallel
