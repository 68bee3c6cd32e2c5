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
      buckets_(comm, model.layout(), options.bucketBytes),
      optimizer_(model.layout(), options.adamw, 0, model.layout().total) {
  LOOM_PAR_CHECK(comm_, loomStreamCreate(&lossStream_));
}

DdpTrainer::~DdpTrainer() {
  if (lossStream_ != nullptr) loomStreamDestroy(lossStream_);
}

StepReport DdpTrainer::step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
                            int B, int T) {
  const auto start = std::chrono::steady_clock::now();
  const size_t micro = inputs.size();
  const float lossScale = 1.0f / static_cast<float>(micro);
  model_.zeroGrads();
  float* grads = model_.grads().f32();
  double localLoss = 0;
  StepReport report{};
  for (size_t k = 0; k < micro; ++k) {
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
  float loss = static_cast<float>(localLoss / micro);
  LOOM_PAR_CHECK(comm_, loomAllReduce(&loss, &loss, 1, loomFloat32, loomAvg, comm_, lossStream_));
  // Every rank has the same averaged gradients, so the same clipping factor and the same step.
  const size_t n = model_.layout().total;
  const float clip = optimizer_.options().clipNorm > 0
                         ? cpu::clipFactor(cpu::sumOfSquares(grads, n), optimizer_.options().clipNorm)
                         : 1.0f;
  optimizer_.step(model_.params().f32(), 0, grads, 0, clip);
  LOOM_PAR_CHECK(comm_, loomStreamSynchronize(lossStream_));
  report.loss = loss;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

void DdpTrainer::exportState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) {
  const float* whole = model_.params().f32();
  params->assign(whole, whole + model_.layout().total);
  *m = optimizer_.firstMoments();
  *v = optimizer_.secondMoments();
}

void DdpTrainer::importState(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                             int steps) {
  std::copy(params.begin(), params.end(), model_.params().f32());
  optimizer_.restore(m.data(), v.data(), steps);
}

MemoryReport DdpTrainer::memory() const {
  MemoryReport report;
  report.paramBytes = model_.layout().total * sizeof(float);
  report.gradBytes = report.paramBytes;
  report.optimizerBytes = optimizer_.stateBytes();
  return report;
}

}  // namespace loom::parallel
