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
  // The first stage: the embeddings (vocabulary-parallel over tp), its layers with attention and dense MLPs split
  // over tp (layernorms replicated), experts spread over ep; the final layernorm too when it is also the last.
  const double attention = (count.attention - 4 * h) / t + 4 * h;
  const double mlp = model.experts > 0 ? (count.mlp - h * model.experts) / e + h * model.experts : count.mlp / t;
  result.paramsPerGpu = count.embeddings / t + layersHere * (attention + mlp) + (p == 1 ? count.finalNorm : 0);
  result.states = zeroModelStates(result.paramsPerGpu, d, layout.zero, precision);

  result.activationsPerLayer = activationBytesPerLayer(s, b, h, a, t, layout.sequenceParallel, layout.recompute);
  result.activations =
      result.activationsPerLayer * layersHere * microBatchesInFlight(layout.schedule, p, layout.microBatches, v);
  result.memory = result.states.total() + result.activations;

  Communication& c = result.communication;
  if (d > 1) {
    const double share = (d - 1.0) / d;
    c.dataParallel = (layout.zero == 3 ? 3 : 2) * share * result.paramsPerGpu * precision.grad;
  }
  const double activation = s * b * h * kActivationBytes;  // one micro-batch's [s, b, h] on this rank
  if (t > 1) {
    // Two all-reduces forward and two backward per layer (or as many all-gathers and reduce-scatters with SP,
    // half the bytes each); full recomputation runs the forward's two again.
    const double collectives = layout.recompute == Recompute::kFull ? 6 : 4;
    c.tensorParallel = collectives * 2 * (t - 1.0) / t * activation * layersHere * m;
  }
  if (p > 1) c.pipeline = 2 * activation / (layout.sequenceParallel ? t : 1) * m * v;  // forward out, backward out
  if (e > 1) {
    // Dispatch and combine, forward and backward: four all-to-alls of the top-k copies of every token.
    c.expert = 4 * (e - 1.0) / e * activation * model.topk * layersHere * m;
  }
  result.bubble = p > 1 ? bubbleFraction(layout.schedule, p, layout.microBatches, v) : 0;
  return result;
}

}  // namespace loom::parallel::plan
