// The pipeline executor: runs any Plan (schedule.h) on this rank's stage of a pipelined Gpt, one action after
// another, for one training step's micro-batches.
//
// Communication. Activations go forward and gradients backward between neighbouring stages (virtual stage k to
// k + 1 is stage s to s + 1, and the last stage to stage 0 between chunks) with loomSend and loomRecv. Each kind of
// message goes over each link (stage j to j + 1) on a two-rank communicator of its own, split from the pipeline's:
// a communicator runs its calls one at a time, so one that a rank both sent and received on from two streams could
// block a send behind a receive waiting for it; and on a link of its own each kind's messages are matched in the
// order both plans list them (with two stages, activations and gradients both go from stage 0 to stage 1 when
// interleaved, in orders that differ). A receive blocks the stage until its data is there: the next action needs
// it. A send is queued on a stream per kind and never waited for within the step, which is what schedule.h's
// simulation assumes (sends buffered), so that no plan it accepts can deadlock here: the data to send is copied to
// a buffer of its own first, so the activation slot it came from may be reused at once, and the send streams are
// drained when the step ends. The trainer then sums the tied token embedding's gradients across the first and last
// stages (Gpt::synchronizeTiedGradients).
//
// Memory. Each micro-batch in flight on a chunk takes an activation slot of the model, from its forward (or the
// receive before it) to its backward (with ZB-H1: its W); a slot freed is reused by the next micro-batch, so a
// stage keeps as many micro-batches' activations as its schedule has in flight (GPipe m, 1F1B p - s on stage s).
//
// Timing. With timing on, a barrier starts the step and every compute action's start and end are read from the
// monotonic clock (on a device, after waiting for the action's kernels); gatherTimeline() collects every stage's
// spans, from the moment the first stage left the barrier: a measured Timeline, rendered and with its bubble, as
// schedule.h's simulation gives one. The stages must share the clock, as a host's processes do; stages on other
// hosts would be shifted by their clocks' offsets.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "loom/loom.h"
#include "parallel/model/gpt.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/scalars.h"
#include "parallel/strategies/trainer.h"

namespace loom::parallel::pipeline {

class Executor : public MicroBatchRunner {
 public:
  // `model` is this rank's stage of a pipeline over `pipeline` (the communicator it was built with, rank s stage s);
  // `plan` must have the model's stages and chunks. Collective over the pipeline (it splits communicators).
  Executor(Gpt& model, loomComm_t pipeline, Plan plan);
  ~Executor() override;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One step: inputs.size() must be the plan's micro-batches. Adds their gradients to the model's (zero them first
  // for a fresh step; the tied embedding's two halves are left apart) and returns the mean loss.
  double run(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B, int T,
             float lossScale = 1.0f) override;
  const Plan& plan() const { return plan_; }
  void setTiming(bool on) { timing_ = on; }
  // The last timed run's compute actions on every stage, in seconds from its start. Collective over the pipeline.
  Timeline gatherTimeline();
  // The most micro-batches whose activations this stage held at once, over every run so far.
  int peakInFlight() const { return peakInFlight_; }

 private:
  // The activation slot of micro-batch `micro` on chunk `chunk`, taken from the free ones (or a new one) on first
  // use.
  int slotFor(int micro, int chunk);
  void freeSlot(int micro, int chunk);
  // Queues a send of `elements` at `data` to the other rank of `link` on `stream`, from a copy; receives from it.
  void send(const void* data, size_t elements, loomComm_t link, loomStream_t stream);
  void receive(void* data, size_t elements, loomComm_t link);

  Gpt& model_;
  Ops& ops_;
  loomComm_t pipeline_;
  Plan plan_;
  int stage_ = 0;
  // Link j's communicators (stage j its rank 0, stage j + 1 its rank 1; null where this stage is neither), and the
  // four this stage uses.
  std::vector<loomComm_t> activationLinks_, gradientLinks_;
  loomComm_t sendActivations_ = nullptr, receiveActivations_ = nullptr, sendGradients_ = nullptr,
             receiveGradients_ = nullptr;
  loomStream_t activationSends_ = nullptr, gradientSends_ = nullptr, receives_ = nullptr, timingStream_ = nullptr;
  Scalars scalars_;                           // the loss, summed over the stages
  std::vector<Tensor> outgoing_;              // copies of what this step sends, reused from step to step
  size_t sends_ = 0;                          // of them in use this step
  std::map<std::pair<int, int>, int> slots_;  // (micro-batch, chunk) -> activation slot
  std::vector<int> freeSlots_;
  int slotCount_ = 0, peakInFlight_ = 0;
  bool timing_ = false;
  std::vector<Span> spans_;  // this stage's, from the last timed run, on the monotonic clock
  double stepStart_ = 0;
};

}  // namespace loom::parallel::pipeline
