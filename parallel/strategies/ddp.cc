// The DDP training step (ddp.h). Its communication is in ddp_comm.cc, apart from the math.
#include "parallel/strategies/ddp.h"

#include <algorithm>
#include <chrono>

#include "parallel/check.h"
#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel {

DdpTrainer::DdpTrainer(Gpt& model, loomComm_t comm, DdpOptions options)
    : model_(model),
      comm_(comm),
      pipeline_(options.pipeline),
      buckets_(comm, model.ops(), model.layout(), options.bucketBytes, options.expertComm),
      optimizer_(model.layout(), options.adamw, 0, model.layout().total, model.ops()),
      scalars_(comm, model.ops()) {
  if (optimizer_.mixed()) optimizer_.setMasterWeights(downloadParams().data());
  if (options.expertComm != nullptr) {
    int ranks = 1;
    loomCommCount(comm, &ranks);
    lossScale_ = 1.0f / static_cast<float>(ranks);
  }
}

std::vector<float> DdpTrainer::downloadParams() const {
  std::vector<float> params(model_.layout().total);
  model_.ops().downloadFloats(params.data(), model_.params().data(), params.size());
  return params;
}

StepReport DdpTrainer::step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
                            int B, int T) {
  const auto start = std::chrono::steady_clock::now();
  const size_t micro = inputs.size();
  const float lossScale = lossScale_ / static_cast<float>(micro);
  model_.zeroGrads();
  void* grads = model_.grads().data();
  double localLoss = 0;
  StepReport report{};
  if (pipeline_ != nullptr) {
    localLoss = pipeline_->run(inputs, targets, B, T, lossScale_) * static_cast<double>(micro);
    buckets_.start(grads);
    buckets_.unitDone(0);  // every gradient final: every bucket queued at once
    report.exposedSeconds = buckets_.finish();
    // After the data-parallel sums, so that the first and last stages add the same two halves: equal bits.
    model_.synchronizeTiedGradients();
  }
  for (size_t k = 0; k < micro && pipeline_ == nullptr; ++k) {
    localLoss += model_.forward(inputs[k], targets[k], B, T);
    if (k + 1 < micro) {
      model_.backward(lossScale);
      continue;
    }
    buckets_.start(grads);
    UnitHooks hooks;
    hooks.release = [this](int unit, bool backward) {
      if (backward) buckets_.unitDone(unit);
    };
    model_.setUnitHooks(std::move(hooks));
    model_.backward(lossScale);
    model_.setUnitHooks({});
    report.exposedSeconds = buckets_.finish();
  }
  report.loss = scalars_.average(static_cast<float>(localLoss / micro));
  // Every rank has the same averaged gradients, so the same clipping factor and the same step.
  const size_t n = model_.layout().total;
  const float clip = optimizer_.options().clipNorm > 0
                         ? cpu::clipFactor(model_.sumOverModelParallel(model_.gradientSquares(grads, 0, n, 0)),
                                           optimizer_.options().clipNorm)
                         : 1.0f;
  optimizer_.step(model_.params().data(), 0, grads, 0, clip);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

double DdpTrainer::communicationAlone() {
  const auto start = std::chrono::steady_clock::now();
  buckets_.start(model_.grads().data());
  buckets_.unitDone(0);  // every gradient final: every bucket queued at once
  buckets_.finish();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void DdpTrainer::exportState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) {
  *params = optimizer_.mixed() ? optimizer_.masterWeights() : downloadParams();
  *m = optimizer_.firstMoments();
  *v = optimizer_.secondMoments();
}

void DdpTrainer::importState(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                             int steps) {
  model_.ops().uploadFloats(model_.params().data(), params.data(), params.size());
  optimizer_.setMasterWeights(params.data());
  optimizer_.restore(m.data(), v.data(), steps);
}

MemoryReport DdpTrainer::memory() const {
  MemoryReport report;
  report.paramBytes = model_.layout().total * model_.ops().elementBytes();
  report.gradBytes = report.paramBytes;
  report.optimizerBytes = optimizer_.stateBytes();
  return report;
}

}  // namespace loom::parallel
