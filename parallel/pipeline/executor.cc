// The pipeline executor (executor.h).
#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "parallel/check.h"

namespace loom::parallel::pipeline {
namespace {

[[noreturn]] void fail(const std::string& problem) {
  std::fprintf(stderr, "pipeline: %s\n", problem.c_str());
  std::abort();
}

// The monotonic clock, which every process of a host shares, in seconds.
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// On a link the peer is the other of its two ranks.
int peerOn(loomComm_t link) {
  int rank = 0;
  loomCommUserRank(link, &rank);
  return 1 - rank;
}

}  // namespace

Executor::Executor(Gpt& model, loomComm_t pipeline, Plan plan)
    : model_(model), ops_(model.ops()), pipeline_(pipeline), plan_(std::move(plan)), scalars_(pipeline, model.ops()) {
  int stages = 1;
  if (pipeline != nullptr) {
    loomCommCount(pipeline, &stages);
    loomCommUserRank(pipeline, &stage_);
  }
  const PipelineStage& held = model.stage();
  if (plan_.stages != stages || held.stages != stages || held.stage != stage_ || plan_.chunks != held.chunks)
    fail("a plan of " + std::to_string(plan_.stages) + " stages x " + std::to_string(plan_.chunks) +
         " chunks for stage " + std::to_string(held.stage) + " of a model cut into " + std::to_string(held.stages) +
         " x " + std::to_string(held.chunks) + ", on a pipeline of " + std::to_string(stages) + " ranks");
  if (stages == 1 && plan_.chunks > 1) fail("interleaving chunks needs two stages or more");
  const int previous = (stage_ + stages - 1) % stages;
  // Link j joins stage j (its rank 0) and stage j + 1 (its rank 1), once for each kind of message.
  for (int j = 0; j < stages && stages > 1; ++j)
    for (auto* links : {&activationLinks_, &gradientLinks_}) {
      const bool member = stage_ == j || stage_ == (j + 1) % stages;
      loomComm_t link = nullptr;
      LOOM_PAR_CHECK(pipeline,
                     loomCommSplit(pipeline, member ? 0 : LOOM_SPLIT_NOCOLOR, stage_ == j ? 0 : 1, &link, nullptr));
      links->push_back(link);
    }
  if (stages > 1) {
    sendActivations_ = activationLinks_[stage_];
    receiveActivations_ = activationLinks_[previous];
    sendGradients_ = gradientLinks_[previous];
    receiveGradients_ = gradientLinks_[stage_];
  }
  activationSends_ = ops_.createStream();
  gradientSends_ = ops_.createStream();
  receives_ = ops_.createStream();
  timingStream_ = ops_.createStream();
}

Executor::~Executor() {
  for (loomStream_t stream : {activationSends_, gradientSends_, receives_, timingStream_}) ops_.destroyStream(stream);
  for (auto* links : {&activationLinks_, &gradientLinks_})
    for (loomComm_t link : *links)
      if (link != nullptr) loomCommDestroy(link);
}

int Executor::slotFor(int micro, int chunk) {
  const auto found = slots_.find({micro, chunk});
  if (found != slots_.end()) return found->second;
  int slot = slotCount_;
  if (freeSlots_.empty()) {
    ++slotCount_;
  } else {
    slot = freeSlots_.back();
    freeSlots_.pop_back();
  }
  slots_[{micro, chunk}] = slot;
  peakInFlight_ = std::max(peakInFlight_, static_cast<int>(slots_.size()));
  return slot;
}

void Executor::freeSlot(int micro, int chunk) {
  const auto found = slots_.find({micro, chunk});
  freeSlots_.push_back(found->second);
  slots_.erase(found);
}

void Executor::send(const void* data, size_t elements, loomComm_t comm, loomStream_t stream) {
  if (sends_ == outgoing_.size())
    outgoing_.push_back(Tensor::zeros({static_cast<int64_t>(elements)}, ops_.dtype(), &ops_));
  Tensor& copy = outgoing_[sends_++];
  if (copy.numel() != elements) copy = Tensor::zeros({static_cast<int64_t>(elements)}, ops_.dtype(), &ops_);
  ops_.copy(copy.data(), data, elements * ops_.elementBytes());
  ops_.commAfterCompute(stream);
  LOOM_PAR_CHECK(comm, loomSend(copy.data(), elements, loomTypeOf(ops_.dtype()), peerOn(comm), comm, stream));
}

void Executor::receive(void* data, size_t elements, loomComm_t comm) {
  ops_.commAfterCompute(receives_);
  LOOM_PAR_CHECK(comm, loomRecv(data, elements, loomTypeOf(ops_.dtype()), peerOn(comm), comm, receives_));
  LOOM_PAR_CHECK(comm, ops_.synchronize(receives_, comm));
}

double Executor::run(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B,
                     int T, float scale) {
  const int m = plan_.microBatches;
  if (static_cast<int>(inputs.size()) != m || static_cast<int>(targets.size()) != m)
    fail("a step of " + std::to_string(inputs.size()) + " micro-batches for a plan of " + std::to_string(m));
  const float lossScale = scale / static_cast<float>(m);
  const size_t boundary = model_.boundaryElements(B, T);
  const bool split = plan_.splitBackward;
  if (timing_) {
    spans_.clear();
    LOOM_PAR_CHECK(pipeline_, loomBarrier(pipeline_, timingStream_));
    LOOM_PAR_CHECK(pipeline_, ops_.synchronize(timingStream_, pipeline_));
    stepStart_ = now();
  }
  double losses = 0;
  sends_ = 0;
  for (const Action& action : plan_.perStage[stage_]) {
    const int micro = action.microBatch, chunk = action.chunk;
    const int virtualStage = chunk * plan_.stages + stage_;
    const double start = timing_ ? now() : 0;
    switch (action.op) {
      case Op::kReceiveActivation:
        receive(model_.passInput(chunk, slotFor(micro, chunk), B, T), boundary, receiveActivations_);
        break;
      case Op::kSendActivation:
        send(model_.passOutput(slotFor(micro, chunk)), boundary, sendActivations_, activationSends_);
        break;
      case Op::kReceiveGradient:
        receive(model_.outputGradient(slotFor(micro, chunk)), boundary, receiveGradients_);
        break;
      case Op::kSendGradient:
        send(model_.inputGradient(slotFor(micro, chunk)), boundary, sendGradients_, gradientSends_);
        if (!split) freeSlot(micro, chunk);
        break;
      case Op::kForward:
        losses += model_.forwardPass(chunk, slotFor(micro, chunk), inputs[micro], targets[micro], B, T);
        break;
      case Op::kBackward:
        model_.backwardPass(slotFor(micro, chunk), lossScale, !split);
        if (!split && virtualStage == 0) freeSlot(micro, chunk);  // else once its gradient is sent
        break;
      case Op::kWeight:
        model_.weightPass(slotFor(micro, chunk));
        freeSlot(micro, chunk);
        break;
    }
    if (timing_ && (action.op == Op::kForward || action.op == Op::kBackward || action.op == Op::kWeight)) {
      if (ops_.onDevice()) {  // the action's kernels done
        ops_.commAfterCompute(timingStream_);
        LOOM_PAR_CHECK(pipeline_, ops_.synchronize(timingStream_, pipeline_));
      }
      spans_.push_back({stage_, action, start, now()});
    }
  }
  if (!slots_.empty()) fail("the plan left micro-batches without their backward");
  LOOM_PAR_CHECK(sendActivations_, ops_.synchronize(activationSends_, sendActivations_));
  LOOM_PAR_CHECK(sendGradients_, ops_.synchronize(gradientSends_, sendGradients_));
  return scalars_.sum(losses) / m;  // only the last stage's forwards have losses
}

Timeline Executor::gatherTimeline() {
  // Every stage has as many compute actions: the step's start, then five doubles each (op, micro-batch, chunk,
  // start, end).
  const size_t perStage = 1 + spans_.size() * 5;
  std::vector<double> mine{stepStart_};
  for (const Span& span : spans_)
    mine.insert(mine.end(), {static_cast<double>(span.action.op), static_cast<double>(span.action.microBatch),
                             static_cast<double>(span.action.chunk), span.start, span.end});
  // Doubles, in buffers of twice as many floats.
  Tensor send = Tensor::zeros({static_cast<int64_t>(perStage * 2)}, DType::kFloat32, &ops_);
  Tensor all = Tensor::zeros({static_cast<int64_t>(perStage * 2 * plan_.stages)}, DType::kFloat32, &ops_);
  ops_.upload(send.data(), mine.data(), perStage * sizeof(double));
  ops_.commAfterCompute(timingStream_);
  LOOM_PAR_CHECK(pipeline_, loomAllGather(send.data(), all.data(), perStage, loomFloat64, pipeline_, timingStream_));
  LOOM_PAR_CHECK(pipeline_, ops_.synchronize(timingStream_, pipeline_));
  std::vector<double> values(perStage * plan_.stages);
  ops_.download(values.data(), all.data(), values.size() * sizeof(double));
  Timeline timeline;
  double origin = values[0];  // the first stage out of the barrier
  for (int s = 0; s < plan_.stages; ++s) origin = std::min(origin, values[s * perStage]);
  for (int s = 0; s < plan_.stages; ++s)
    for (size_t k = 0; k < spans_.size(); ++k) {
      const double* v = values.data() + s * perStage + 1 + k * 5;
      const Span span{s,
                      Action{static_cast<Op>(static_cast<int>(v[0])), static_cast<int>(v[1]), static_cast<int>(v[2])},
                      v[3] - origin, v[4] - origin};
      timeline.spans.push_back(span);
      timeline.busy += span.end - span.start;
      timeline.makespan = std::max(timeline.makespan, span.end);
    }
  std::sort(timeline.spans.begin(), timeline.spans.end(),
            [](const Span& a, const Span& b) { return a.start != b.start ? a.start < b.start : a.stage < b.stage; });
  return timeline;
}

}  // namespace loom::parallel::pipeline
