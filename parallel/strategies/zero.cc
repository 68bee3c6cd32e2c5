// The ZeRO training step (zero.h). Its communication is in zero_comm.cc, apart from the math.
#include "parallel/strategies/zero.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel {
namespace {

Sharding shardingOf(const GptLayout& layout, loomComm_t comm) {
  int nranks = 1, rank = 0;
  loomCommCount(comm, &nranks);
  loomCommUserRank(comm, &rank);
  return Sharding::of(layout, nranks, rank);
}

}  // namespace

ZeroTrainer::ZeroTrainer(Gpt& model, loomComm_t comm, ZeroOptions options)
    : model_(model),
      comm_(comm),
      options_(options),
      sharding_(shardingOf(model.layout(), comm)),
      zeroComm_(comm, sharding_),
      gradSlices_(sharding_.shardElements) {
  if (options.stage != 1) {
    std::fprintf(stderr, "zero: stage %d is not built yet (1 is)\n", options.stage);
    std::exit(1);
  }
  size_t largestSlice = 0;
  for (const UnitShard& shard : sharding_.units) {
    optimizers_.emplace_back(model.layout(), options.adamw, shard.begin, shard.end);
    largestSlice = std::max(largestSlice, shard.slice);
  }
  paramSlice_.resize(largestSlice);
}

StepReport ZeroTrainer::step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
                             int B, int T) {
  const auto start = std::chrono::steady_clock::now();
  const size_t micro = inputs.size();
  model_.zeroGrads();
  double localLoss = 0;
  for (size_t k = 0; k < micro; ++k) {
    localLoss += model_.forward(inputs[k], targets[k], B, T);
    model_.backward(1.0f / static_cast<float>(micro));
  }
  const float* grads = model_.grads().f32();
  float* params = model_.params().f32();
  const auto communicating = std::chrono::steady_clock::now();
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    zeroComm_.reduceScatter(static_cast<int>(u), grads + shard.unitBegin, gradSlices_.data() + shard.shardOffset);
  }
  zeroComm_.wait();
  // The global gradient norm: every rank's owned elements (padding excluded), summed across ranks.
  double squares = 0;
  for (const UnitShard& shard : sharding_.units)
    squares += cpu::sumOfSquares(gradSlices_.data() + shard.shardOffset, shard.end - shard.begin);
  const float clip =
      options_.adamw.clipNorm > 0 ? cpu::clipFactor(zeroComm_.sum(squares), options_.adamw.clipNorm) : 1.0f;
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    if (shard.end > shard.begin) optimizers_[u].step(params, gradSlices_.data() + shard.shardOffset, shard.begin, clip);
    // The rank's updated slice, padded with zeros past the unit's end, then every rank's into the unit.
    std::fill(paramSlice_.begin(), paramSlice_.end(), 0.0f);
    std::copy(params + shard.begin, params + shard.end, paramSlice_.begin());
    zeroComm_.allGather(static_cast<int>(u), paramSlice_.data(), params + shard.unitBegin);
  }
  StepReport report{};
  report.loss = zeroComm_.average(static_cast<float>(localLoss / micro));
  const auto end = std::chrono::steady_clock::now();
  report.exposedSeconds = std::chrono::duration<double>(end - communicating).count();
  report.seconds = std::chrono::duration<double>(end - start).count();
  return report;
}

MemoryReport ZeroTrainer::memory() const {
  MemoryReport report;
  report.paramBytes = model_.layout().total * sizeof(float);
  report.gradBytes = model_.layout().total * sizeof(float) + gradSlices_.size() * sizeof(float);
  for (const AdamW& optimizer : optimizers_) report.optimizerBytes += optimizer.stateBytes();
  return report;
}

}  // namespace loom::parallel
