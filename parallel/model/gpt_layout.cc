// The reference GPT's presets and parameter layout (gpt.h): which tensors a rank holds, where in the flat buffer,
// and how a tensor-parallel rank's part maps onto the whole model's values.
#include <algorithm>
#include <string>
#include <vector>

#include "parallel/check.h"
#include "parallel/model/gpt.h"

namespace loom::parallel {
namespace {

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
  if (name == "moe-tiny") {
    *out = GptConfig{2, 4, 128, 64, 256};
    out->experts = 4;
    out->topk = 2;
    out->ffn = 256;
    out->capacityFactor = 1.25f;
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
  if (experts < 0 || (experts > 0 && (topk < 1 || topk > experts)))
    return "top-" + std::to_string(topk) + " routing over " + std::to_string(experts) + " experts";
  if (capacityFactor < 0 || ffn < 0) return "a negative capacity factor or MLP width";
  return "";
}

size_t ParamRange::numel() const { return product(shape); }

std::string PipelineStage::check(int layers) const {
  if (stages < 1 || chunks < 1 || stage < 0 || stage >= stages)
    return "stage " + std::to_string(stage) + " of " + std::to_string(stages) + " with " + std::to_string(chunks) +
           " chunks is no pipeline stage";
  if (layers % virtualStages() != 0)
    return std::to_string(layers) + " layers do not split into " + std::to_string(stages) + " x " +
           std::to_string(chunks) + " virtual stages";
  return "";
}

GptLayout GptLayout::of(const GptConfig& config, int tensorParallel, const PipelineStage& stage, int expertParallel,
                        int expertRank) {
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
  layout.stage = stage;
  layout.expertParallel = expertParallel;
  layout.expertRank = expertRank;
  auto unit = [&](bool expert) {
    layout.unitBegin.push_back(layout.total);
    layout.expertUnit.push_back(expert);
  };
  if (stage.holdsEmbeddings()) {
    unit(false);
    add("wte.weight", {config.vocab, C}, kRows);
    add("wpe.weight", {config.maxT, C});
  }
  const int perChunk = config.layers / stage.virtualStages();
  for (int chunk = 0; chunk < stage.chunks; ++chunk)
    for (int l = stage.virtualStage(chunk) * perChunk; l < (stage.virtualStage(chunk) + 1) * perChunk; ++l) {
      unit(false);
      const std::string prefix = "h." + std::to_string(l) + ".";
      add(prefix + "ln_1.weight", {C});
      add(prefix + "ln_1.bias", {C});
      add(prefix + "attn.c_attn.weight", {3 * C, C}, kRows, 3);
      add(prefix + "attn.c_attn.bias", {3 * C}, kRows, 3);
      add(prefix + "attn.c_proj.weight", {C, C}, kColumns);
      add(prefix + "attn.c_proj.bias", {C});
      add(prefix + "ln_2.weight", {C});
      add(prefix + "ln_2.bias", {C});
      if (config.experts == 0) {
        add(prefix + "mlp.c_fc.weight", {4 * C, C}, kRows);
        add(prefix + "mlp.c_fc.bias", {4 * C}, kRows);
        add(prefix + "mlp.c_proj.weight", {C, 4 * C}, kColumns);
        add(prefix + "mlp.c_proj.bias", {C});
        continue;
      }
      add(prefix + "mlp.router.weight", {config.experts, C});
      unit(true);
      const int local = config.experts / expertParallel, F = config.hidden();
      for (int e = expertRank * local; e < (expertRank + 1) * local; ++e) {
        const std::string expert = prefix + "mlp.experts." + std::to_string(e) + ".";
        add(expert + "c_fc.weight", {F, C});
        add(expert + "c_fc.bias", {F});
        add(expert + "c_proj.weight", {C, F});
        add(expert + "c_proj.bias", {C});
        for (int i = 0; i < 4; ++i) layout.params[layout.params.size() - 1 - i].expert = true;
      }
    }
  if (stage.holdsHead()) {
    unit(false);
    add("ln_f.weight", {C});
    add("ln_f.bias", {C});
    if (!stage.holdsEmbeddings()) {  // the tied head's own copy of the token embedding
      unit(false);
      add("wte.weight", {config.vocab, C}, kRows);
      layout.params.back().tiedCopy = true;
    }
  }
  layout.unitBegin.push_back(layout.total);
  return layout;
}

const ParamRange* GptLayout::find(const std::string& name) const {
  const ParamRange* copy = nullptr;
  for (const ParamRange& range : params) {
    if (range.name != name) continue;
    if (!range.tiedCopy) return &range;
    copy = &range;
  }
  return copy;
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
  for (const ParamRange& range : params)
    forEachRun(range, *full.find(range.name), tensorParallel, rank, [&](size_t at, size_t from, size_t count) {
      std::copy(fullValues + from, fullValues + from + count, local + at);
    });
}

void GptLayout::unshard(const GptLayout& full, const float* local, int rank, float* fullValues) const {
  for (const ParamRange& range : params) {
    if (range.tiedCopy) continue;
    forEachRun(range, *full.find(range.name), tensorParallel, rank,
               [&](size_t at, size_t to, size_t count) { std::copy(local + at, local + at + count, fullValues + to); });
  }
}

}  // namespace loom::parallel
