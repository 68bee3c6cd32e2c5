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
      ops_(model.ops()),
      comm_(comm),
      options_(options),
      sharding_(shardingOf(model.layout(), comm)),
      zeroComm_(comm, model.ops(), sharding_) {
  if (options.stage < 1 || options.stage > 3) {
    std::fprintf(stderr, "zero: stage %d (1, 2 or 3)\n", options.stage);
    std::exit(1);
  }
  if (options.stage >= 2 && (options.pipeline != nullptr || model.pipelined())) {
    std::fprintf(stderr, "zero: stage %d does not combine with pipeline parallelism (stage 1 does)\n", options.stage);
    std::exit(1);
  }
  if (model.layout().expertParallel > 1) {
    std::fprintf(stderr,
                 "zero: experts spread over expert-parallel ranks need DDP (their data-parallel group is "
                 "another)\n");
    std::exit(1);
  }
  if (!model.ownsStorage()) {
    std::fprintf(stderr, "zero: the model must hold its initial parameters\n");
    std::exit(1);
  }
  loomCommCount(comm, &nranks_);
  // Stage 1 keeps the whole gradients, and its reduce-scatters land in them; later stages keep only the slices.
  if (options.stage >= 2)
    gradSlices_ = Tensor::zeros({static_cast<int64_t>(sharding_.shardElements)}, ops_.dtype(), &ops_);
  std::vector<float> initial(model.layout().total);
  ops_.downloadFloats(initial.data(), model.params().data(), initial.size());
  for (const UnitShard& shard : sharding_.units) {
    optimizers_.emplace_back(model.layout(), options.adamw, shard.begin, shard.end, ops_);
    optimizers_.back().setMasterWeights(initial.data() + shard.begin);
  }
  const size_t units = sharding_.units.size();
  unitGrads_.resize(units);
  unitParams_.resize(units);
  gathering_.assign(units, false);
  if (options.stage == 3) {
    paramSlices_ = Tensor::zeros({static_cast<int64_t>(sharding_.shardElements)}, ops_.dtype(), &ops_);
    for (const UnitShard& shard : sharding_.units)
      ops_.copy(at(paramSlices_, shard.shardOffset), elementAt(ops_, model.params().data(), shard.begin),
                (shard.end - shard.begin) * ops_.elementBytes());
  } else {
    zeroComm_.keepPaddedCopies();  // the all-gathers (and stage 1's reduce-scatters) of units the ranks do not divide
  }
  if (options.stage >= 2) {
    model.dropStorage(options.stage == 3, true);
    UnitHooks hooks;
    hooks.acquire = [this](int unit, bool backward) { acquire(unit, backward); };
    hooks.release = [this](int unit, bool backward) { release(unit, backward); };
    model.setUnitHooks(std::move(hooks));
  }
}

ZeroTrainer::~ZeroTrainer() {
  if (options_.stage >= 2) model_.setUnitHooks({});
}

void* ZeroTrainer::allocate(Tensor& buffer, size_t elements) {
  buffer = Tensor::zeros({static_cast<int64_t>(elements)}, ops_.dtype(), &ops_);
  liveBytes_ += buffer.bytes();
  peakBytes_ = std::max(peakBytes_, liveBytes_);
  return buffer.data();
}

void ZeroTrainer::free(Tensor& buffer) {
  liveBytes_ -= buffer.bytes();
  buffer = Tensor();
}

void ZeroTrainer::startGather(int unit) {
  if (gathering_[unit]) return;
  const UnitShard& shard = sharding_.units[unit];
  void* padded = allocate(unitParams_[unit], shard.slice * nranks_);
  zeroComm_.gather(unit, at(paramSlices_, shard.shardOffset), padded);
  gathering_[unit] = true;
}

// The order the model acquires units in (gpt.h), for the prefetch: forward 0, 1..L, L+1; backward 0, L+1, L..1.
void ZeroTrainer::acquire(int unit, bool backward) {
  const int units = static_cast<int>(sharding_.units.size()), last = units - 1;
  if (options_.stage == 3) {
    startGather(unit);
    zeroComm_.wait();  // this unit's gather, and whatever was queued before it
    model_.bindUnit(unit, unitParams_[unit].data(), nullptr);
    int next = -1;
    if (!backward) next = unit < last ? unit + 1 : -1;
    if (backward) next = unit == 0 ? last : unit == last ? last - 1 : unit - 1;
    if (next > 0 || (next == 0 && !backward)) startGather(next);
  }
  if (backward) {
    const UnitShard& shard = sharding_.units[unit];
    model_.bindUnit(unit, nullptr, allocate(unitGrads_[unit], shard.slice * nranks_));
  }
}

void ZeroTrainer::release(int unit, bool backward) {
  if (options_.stage == 3) {
    free(unitParams_[unit]);
    gathering_[unit] = false;
    model_.bindUnit(unit, nullptr, nullptr);
  }
  if (!backward) return;
  // The reduce-scatters queued before this one are done once the stream is: their buffers go, and this unit's
  // reduce-scatter runs while the model goes on to the next unit.
  collectGradients();
  const UnitShard& shard = sharding_.units[unit];
  void* target = at(firstMicro_ ? gradSlices_ : incoming_, shard.shardOffset);
  zeroComm_.reduceScatter(unit, unitGrads_[unit].data(), target);
  reducing_.push_back({unit, !firstMicro_});
}

void ZeroTrainer::collectGradients() {
  if (reducing_.empty()) return;
  zeroComm_.wait();
  for (const auto& [unit, accumulate] : reducing_) {
    if (accumulate) {
      const UnitShard& shard = sharding_.units[unit];
      ops_.add(at(gradSlices_, shard.shardOffset), at(incoming_, shard.shardOffset), shard.slice);
    }
    free(unitGrads_[unit]);
  }
  reducing_.clear();
}

StepReport ZeroTrainer::step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
                             int B, int T) {
  const auto start = std::chrono::steady_clock::now();
  const size_t micro = inputs.size();
  if (options_.stage == 1) model_.zeroGrads();
  if (options_.stage >= 2 && micro > 1 && !incoming_.defined())
    incoming_ = Tensor::zeros({static_cast<int64_t>(sharding_.shardElements)}, ops_.dtype(), &ops_);
  double localLoss = 0;
  if (options_.pipeline != nullptr) {
    localLoss = options_.pipeline->run(inputs, targets, B, T) * static_cast<double>(micro);
    // Before the reduce-scatters, which leave each rank a slice of its own units (the embeddings' on the first
    // stage, the head's copy on the last: other slices). With more than 2 data-parallel ranks the two stages' sums
    // may then differ in order, and the copies in the last bit.
    model_.synchronizeTiedGradients();
  }
  for (size_t k = 0; k < micro && options_.pipeline == nullptr; ++k) {
    firstMicro_ = k == 0;
    localLoss += model_.forward(inputs[k], targets[k], B, T);
    model_.backward(1.0f / static_cast<float>(micro));
    // The last unit's reduce-scatter (the embeddings') before the next micro-batch takes a buffer for that unit.
    if (options_.stage >= 2) collectGradients();
  }
  const auto communicating = std::chrono::steady_clock::now();
  void* params = options_.stage == 3 ? paramSlices_.data() : model_.params().data();
  // Where each unit's averaged slice of this rank is.
  std::vector<const void*> slices(sharding_.units.size());
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    slices[u] = options_.stage == 1 ? zeroComm_.reduceScatterInPlace(
                                          static_cast<int>(u), elementAt(ops_, model_.grads().data(), shard.unitBegin))
                                    : at(gradSlices_, shard.shardOffset);
  }
  if (options_.stage == 1) zeroComm_.wait();
  // The global gradient norm: every rank's owned elements (padding excluded), summed across ranks.
  double squares = 0;
  for (size_t u = 0; u < sharding_.units.size(); ++u)
    squares +=
        model_.gradientSquares(slices[u], sharding_.units[u].begin, sharding_.units[u].end, sharding_.units[u].begin);
  const float clip = options_.adamw.clipNorm > 0
                         ? cpu::clipFactor(model_.sumOverModelParallel(zeroComm_.sum(squares)), options_.adamw.clipNorm)
                         : 1.0f;
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    const void* grads = slices[u];
    if (options_.stage == 3) {
      if (shard.end > shard.begin)
        optimizers_[u].step(elementAt(ops_, params, shard.shardOffset), shard.begin, grads, shard.begin, clip);
      continue;
    }
    if (shard.end > shard.begin) optimizers_[u].step(params, 0, grads, shard.begin, clip);
    // Every rank's updated slice into the unit, in place.
    zeroComm_.allGatherInPlace(static_cast<int>(u), elementAt(ops_, params, shard.unitBegin));
  }
  StepReport report{};
  report.loss = zeroComm_.average(static_cast<float>(localLoss / micro));
  const auto end = std::chrono::steady_clock::now();
  report.exposedSeconds = std::chrono::duration<double>(end - communicating).count();
  report.seconds = std::chrono::duration<double>(end - start).count();
  return report;
}

double ZeroTrainer::communicationAlone() {
  const auto start = std::chrono::steady_clock::now();
  Tensor gathered = Tensor::zeros({static_cast<int64_t>(sharding_.largestUnit)}, ops_.dtype(), &ops_);
  Tensor grads = Tensor::zeros({static_cast<int64_t>(sharding_.largestUnit)}, ops_.dtype(), &ops_);
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    const int unit = static_cast<int>(u);
    if (options_.stage == 3) {
      zeroComm_.gather(unit, at(paramSlices_, shard.shardOffset), gathered.data());
      zeroComm_.gather(unit, at(paramSlices_, shard.shardOffset), gathered.data());
    }
    if (options_.stage == 1)
      zeroComm_.reduceScatterInPlace(unit, grads.data());
    else
      zeroComm_.reduceScatter(unit, grads.data(), at(gradSlices_, shard.shardOffset));
  }
  zeroComm_.wait();
  if (options_.stage != 3) {
    // The all-gathers give every rank back the parameters it has: the state stays as it was.
    void* params = model_.params().data();
    for (size_t u = 0; u < sharding_.units.size(); ++u)
      zeroComm_.allGatherInPlace(static_cast<int>(u), elementAt(ops_, params, sharding_.units[u].unitBegin));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<float> ZeroTrainer::gatherUnits(const std::function<void(size_t unit, float* slice)>& sliceOf) {
  std::vector<float> whole(model_.layout().total), slice;
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    slice.assign(shard.slice, 0.0f);
    sliceOf(u, slice.data());
    zeroComm_.allGatherHost(static_cast<int>(u), slice.data(), whole.data() + shard.unitBegin);
  }
  return whole;
}

std::vector<float> ZeroTrainer::gatherParams() {
  if (optimizers_.front().mixed())
    return gatherUnits([&](size_t u, float* slice) {
      const std::vector<float> master = optimizers_[u].masterWeights();
      std::copy(master.begin(), master.end(), slice);
    });
  if (options_.stage == 3)
    return gatherUnits([&](size_t u, float* slice) {
      const UnitShard& shard = sharding_.units[u];
      ops_.downloadFloats(slice, at(paramSlices_, shard.shardOffset), shard.slice);
    });
  std::vector<float> params(model_.layout().total);
  ops_.downloadFloats(params.data(), model_.params().data(), params.size());
  return params;
}

void ZeroTrainer::exportState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) {
  *params = gatherParams();
  *m = gatherUnits([&](size_t u, float* slice) {
    const std::vector<float> moments = optimizers_[u].firstMoments();
    std::copy(moments.begin(), moments.end(), slice);
  });
  *v = gatherUnits([&](size_t u, float* slice) {
    const std::vector<float> moments = optimizers_[u].secondMoments();
    std::copy(moments.begin(), moments.end(), slice);
  });
}

void ZeroTrainer::importState(const std::vector<float>& params, const std::vector<float>& m,
                              const std::vector<float>& v, int steps) {
  for (size_t u = 0; u < sharding_.units.size(); ++u) {
    const UnitShard& shard = sharding_.units[u];
    optimizers_[u].restore(m.data() + shard.begin, v.data() + shard.begin, steps);
    optimizers_[u].setMasterWeights(params.data() + shard.begin);
    if (options_.stage == 3) {
      std::vector<float> slice(shard.slice, 0.0f);
      std::copy(params.begin() + shard.begin, params.begin() + shard.end, slice.begin());
      ops_.uploadFloats(at(paramSlices_, shard.shardOffset), slice.data(), slice.size());
    }
  }
  if (options_.stage != 3) ops_.uploadFloats(model_.params().data(), params.data(), params.size());
}

MemoryReport ZeroTrainer::memory() const {
  MemoryReport report;
  const size_t element = ops_.elementBytes();
  const size_t whole = model_.layout().total * element, slices = sharding_.shardElements * element;
  report.paramBytes = options_.stage == 3 ? slices : whole;
  report.gradBytes = (options_.stage == 1 ? whole : 0) + gradSlices_.bytes() + incoming_.bytes();
  for (const AdamW& optimizer : optimizers_) report.optimizerBytes += optimizer.stateBytes();
  report.peakTransientBytes = peakBytes_ + zeroComm_.paddedBytes();  // and the padded units' copies, throughout
  return report;
}

}  // namespace loom::parallel
