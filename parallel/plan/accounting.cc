// Training arithmetic (accounting.h).
#include "parallel/plan/accounting.h"

#include <algorithm>
#include <cmath>

namespace loom::parallel::plan {
namespace {

constexpr double kActivationBytes = 2;  // 16-bit activations, as Korthikanti et al. count them

// The MLP of one expert (or the dense layer): two linear layers with biases.
double mlpParameters(double h, double f) { return 2 * h * f + f + h; }

}  // namespace

bool ModelSpec::preset(const std::string& name, ModelSpec* out) {
  ModelSpec spec;
  spec.name = name;
  if (name == "gpt-tiny") {
    spec.layers = 2, spec.hidden = 128, spec.heads = 4, spec.seq = 64, spec.vocab = 256;
  } else if (name == "gpt2-124m") {
    spec.layers = 12, spec.hidden = 768, spec.heads = 12, spec.seq = 1024, spec.vocab = 50257;
  } else if (name == "gpt2-1.5b") {
    spec.layers = 48, spec.hidden = 1600, spec.heads = 25, spec.seq = 1024, spec.vocab = 50257;
  } else if (name == "gpt3-175b") {
    spec.layers = 96, spec.hidden = 12288, spec.heads = 96, spec.seq = 2048, spec.vocab = 50257;
  } else if (name == "moe-tiny") {
    spec.layers = 2, spec.hidden = 128, spec.heads = 4, spec.seq = 64, spec.vocab = 256;
    spec.ffn = 256, spec.experts = 4, spec.topk = 2;
  } else {
    return false;
  }
  *out = spec;
  return true;
}

std::vector<std::string> ModelSpec::presetNames() {
  return {"gpt-tiny", "gpt2-124m", "gpt2-1.5b", "gpt3-175b", "moe-tiny"};
}

std::string ModelSpec::check() const {
  if (layers < 1 || hidden < 1 || heads < 1 || seq < 1 || vocab < 1)
    return "layers, hidden, heads, seq and vocab must be at least 1";
  if (hidden % heads != 0)
    return "heads " + std::to_string(heads) + " does not divide hidden " + std::to_string(hidden);
  if (ffn < 0) return "ffn " + std::to_string(ffn) + " is negative";
  if (experts < 0 || (experts > 0 && (topk < 1 || topk > experts)))
    return "top-k " + std::to_string(topk) + " must be from 1 to the experts (" + std::to_string(experts) + ")";
  return "";
}

ParameterCount countParameters(const ModelSpec& m) {
  const double h = m.hidden, f = m.ffnHidden();
  ParameterCount count;
  count.embeddings = static_cast<double>(m.vocab) * h + static_cast<double>(m.seq) * h;
  count.attention = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h;  // ln_1, QKV, projection, ln_2
  const double expert = mlpParameters(h, f);
  count.mlp = m.experts > 0 ? m.experts * expert + h * m.experts : expert;  // experts and their router
  count.finalNorm = 2 * h;
  count.total = count.embeddings + m.layers * (count.attention + count.mlp) + count.finalNorm;
  const double activeMlp = m.experts > 0 ? m.topk * expert + h * m.experts : expert;
  count.activePerToken = count.embeddings + m.layers * (count.attention + activeMlp) + count.finalNorm;
  return count;
}

ModelStates zeroModelStates(double psi, int nd, int stage, Precision precision) {
  ModelStates states{precision.param * psi, precision.grad * psi, precision.optimizer * psi};
  if (stage >= 1) states.optimizer /= nd;
  if (stage >= 2) states.grads /= nd;
  if (stage >= 3) states.params /= nd;
  return states;
}

const char* recomputeName(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

double activationBytesPerLayer(double s, double b, double h, double a, int t, bool sequenceParallel,
                               Recompute recompute) {
  const double sbh = s * b * h;
  const bool sp = sequenceParallel && t > 1;
  switch (recompute) {
    case Recompute::kFull:  // only each layer's input is kept
      return 2 * sbh / (sp ? t : 1);
    case Recompute::kSelective:  // the attention's s x s terms are recomputed
      if (t == 1 || sp) return 34 * sbh / t;
      return sbh * (10 + 24.0 / t);
    case Recompute::kNone:
      if (t == 1 || sp) return sbh * (34 + 5 * a * s / h) / t;
      return sbh * (10 + 24.0 / t + 5 * a * s / (h * t));
  }
  return 0;
}

const char* scheduleName(Schedule schedule) {
  switch (schedule) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZbH1:
      return "zb-h1";
  }
  return "?";
}

bool parseSchedule(const std::string& text, Schedule* out) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1})
    if (text == scheduleName(schedule)) {
      *out = schedule;
      return true;
    }
  return false;
}

double bubbleFraction(Schedule schedule, int p, int m, int v) {
  const double idle = p - 1;
  switch (schedule) {
    case Schedule::kGpipe:
    case Schedule::k1F1B:
      return idle / m;
    case Schedule::kInterleaved:
      return idle / (static_cast<double>(v) * m);
    case Schedule::kZbH1:
      return idle / (3.0 * m);
  }
  return 0;
}

double microBatchesInFlight(Schedule schedule, int p, int m, int v) {
  switch (schedule) {
    case Schedule::kGpipe:
      return m;
    case Schedule::k1F1B:
    case Schedule::kZbH1:
      return std::min(m, p);
    case Schedule::kInterleaved:
      return std::min<double>(m, p * (1.0 + (p - 1.0) / (static_cast<double>(p) * v)));
  }
  return 0;
}

std::string Layout::describe() const {
  std::string text = "tp=" + std::to_string(tp) + (sequenceParallel ? " sp" : "");
  if (cp > 1) text += " cp=" + std::to_string(cp);
  text += " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
  if (ep > 1) text += " ep=" + std::to_string(ep);
  text += " zero-" + std::to_string(zero) + " mb=" + std::to_string(microBatch) + " x " + std::to_string(microBatches);
  if (pp > 1) text += std::string(" ") + scheduleName(schedule) + (chunks > 1 ? " v=" + std::to_string(chunks) : "");
  if (recompute != Recompute::kNone) text += std::string(" recompute=") + recomputeName(recompute);
  return text;
}

double dataParallelPasses(const Layout& layout) {
  const double m = layout.microBatches;
  return layout.zero == 3 ? 3 * m : layout.zero == 2 ? m + 1 : 2;
}

double tensorParallelAllReduces(const Layout& layout, int layers) {
  // Per layer: two all-reduces forward and two backward (full recomputation runs the forward's again). With SP,
  // all-gathers and reduce-scatters of half an all-reduce's bytes each: two gathers and two reduce-scatters
  // forward, and backward two reduce-scatters and four gathers (the outputs' gradients, and the inputs gathered
  // again rather than kept).
  const bool sp = layout.sequenceParallel && layout.tp > 1;
  double perLayer = sp ? 5 : 4;
  if (layout.recompute == Recompute::kFull) perLayer += 2;
  // The embedding and the head, spread over the layers: the embedding's all-reduce (with SP a reduce-scatter, and
  // a gather of its gradient); with them on this stage too, the head's input (a gather forward and backward and a
  // reduce-scatter with SP, an all-reduce without).
  const double layersHere = static_cast<double>(layers) / layout.pp;
  const double embedding = 1, head = layout.pp == 1 ? (sp ? 1.5 : 1) : 0;
  return perLayer + (embedding + head) / layersHere;
}

Estimate estimate(const ModelSpec& model, const Layout& layout, Precision precision) {
  Estimate result;
  result.problem = model.check();
  const int t = layout.tp, p = layout.pp, d = layout.dp, e = layout.ep, v = layout.chunks;
  if (result.problem.empty()) {
    if (t < 1 || p < 1 || d < 1 || e < 1 || layout.cp < 1 || v < 1 || layout.microBatch < 1 || layout.microBatches < 1)
      result.problem = "every parallel size, the micro-batch and the micro-batches must be at least 1";
    else if (model.heads % t != 0)
      result.problem = "tp " + std::to_string(t) + " does not divide the " + std::to_string(model.heads) + " heads";
    else if (model.layers % (p * v) != 0)
      result.problem =
          "pp x chunks " + std::to_string(p * v) + " does not divide the " + std::to_string(model.layers) + " layers";
    else if (model.seq % layout.cp != 0)
      result.problem = "cp " + std::to_string(layout.cp) + " does not divide the sequence " + std::to_string(model.seq);
    else if (e > 1 && (model.experts == 0 || model.experts % e != 0))
      result.problem = "ep " + std::to_string(e) + " must divide the experts (" + std::to_string(model.experts) + ")";
    else if (e > 1 && (d * t) % e != 0)
      result.problem = "ep " + std::to_string(e) + " must divide tp x dp (" + std::to_string(d * t) + ")";
    else if (layout.zero < 0 || layout.zero > 3)
      result.problem = "zero stage " + std::to_string(layout.zero) + " (0 to 3)";
  }
  result.parameters = countParameters(model);
  if (!result.problem.empty()) return result;

  const double h = model.hidden, a = model.heads, b = layout.microBatch, m = layout.microBatches;
  const double s = static_cast<double>(model.seq) / layout.cp;  // tokens of a sequence on this rank
  const double layersHere = static_cast<double>(model.layers) / p;
  const ParameterCount& count = result.parameters;
  // The first stage, cut as GptLayout::of cuts the reference GPT: the token embedding by vocabulary rows, the
  // position embedding whole; attention's QKV and the MLP's first layer by rows, the projections by columns, their
  // biases and the layernorms whole (5h in attention, h in the MLP); experts spread over ep; the final layernorm too
  // when this stage is also the last.
  const double attention = (count.attention - 5 * h) / t + 5 * h;
  const double mlp =
      model.experts > 0 ? (count.mlp - h * model.experts) / e + h * model.experts : (count.mlp - h) / t + h;
  // With tensor parallelism the vocabulary is padded to a multiple of 128 t, as Megatron pads it.
  const double vocab = t > 1 ? std::ceil(model.vocab / (128.0 * t)) * 128 * t : model.vocab;
  result.paramsPerGpu = vocab * h / t + static_cast<double>(model.seq) * h + layersHere * (attention + mlp) +
                        (p == 1 ? count.finalNorm : 0);
  result.states = zeroModelStates(result.paramsPerGpu, d, layout.zero, precision);

  result.activationsPerLayer = activationBytesPerLayer(s, b, h, a, t, layout.sequenceParallel, layout.recompute);
  result.activations =
      result.activationsPerLayer * layersHere * microBatchesInFlight(layout.schedule, p, layout.microBatches, v);
  result.memory = result.states.total() + result.activations;

  Communication& c = result.communication;
  if (d > 1) {
    // Per step: one all-reduce (a reduce-scatter and an all-gather with ZeRO-1); ZeRO-2 reduce-scatters in every
    // micro-batch's backward, then all-gathers once; ZeRO-3 gathers every unit before each micro-batch's forward
    // and backward and reduce-scatters it after.
    const double share = (d - 1.0) / d;
    c.dataParallel = dataParallelPasses(layout) * share * result.paramsPerGpu * precision.grad;
  }
  const double activation = s * b * h * kActivationBytes;  // one micro-batch's [s, b, h] on this rank
  if (t > 1)
    c.tensorParallel = tensorParallelAllReduces(layout, model.layers) * 2 * (t - 1.0) / t * activation * layersHere * m;
  if (p > 1) c.pipeline = 2 * activation / (layout.sequenceParallel ? t : 1) * m * v;  // forward out, backward out
  if (e > 1) {
    // Dispatch and combine, forward and backward: four all-to-alls of the top-k copies of every token.
    c.expert = 4 * (e - 1.0) / e * activation * model.topk * layersHere * m;
  }
  result.bubble = p > 1 ? bubbleFraction(layout.schedule, p, layout.microBatches, v) : 0;
  return result;
}

}  // namespace loom::parallel::plan
