// What every data-parallel strategy offers the training loop (DDP, ZeRO-1/2/3): one optimizer step over this rank's
// micro-batches, and what it measured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::parallel {

// What one step measured on this rank.
struct StepReport {
  float loss;             // the global batch's mean loss (averaged across ranks)
  double seconds;         // the whole step
  double exposedSeconds;  // waiting for communication that computation did not hide
};

// The bytes a rank holds for the model's state, by kind, as its strategy shards it (padding included).
struct MemoryReport {
  size_t paramBytes = 0;
  size_t gradBytes = 0;
  size_t optimizerBytes = 0;
  // The most bytes of buffers held for a while within a step at once (ZeRO's per-unit gradients and gathered
  // parameters), on top of the above.
  size_t peakTransientBytes = 0;
  size_t total() const { return paramBytes + gradBytes + optimizerBytes; }
  size_t peak() const { return total() + peakTransientBytes; }
};

// How a step's micro-batches run forward and backward when a strategy does not run them itself on the whole model:
// a pipeline schedule over the stages (parallel/pipeline/executor.h). After run() the model's gradients hold the
// sum over the micro-batches of the gradients of each one's mean loss over k micro-batches (loss scale 1/k), as
// they would on one rank.
class MicroBatchRunner {
 public:
  virtual ~MicroBatchRunner() = default;
  // The mean over the micro-batches of their mean losses, the same on every rank of the pipeline. Each micro-batch's
  // gradient is of its loss times lossScale / k.
  virtual double run(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B,
                     int T, float lossScale = 1.0f) = 0;
};

class Trainer {
 public:
  virtual ~Trainer() = default;
  // inputs[k] and targets[k]: micro-batch k, B x T tokens each.
  virtual StepReport step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B,
                          int T) = 0;
  virtual MemoryReport memory() const = 0;
  // For checkpoints, on every rank at once (they may communicate): the whole parameters and AdamW moments in the
  // model's layout, and the steps taken; and restoring them from a checkpoint's.
  virtual void exportState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) = 0;
  virtual void importState(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                           int steps) = 0;
  virtual int steps() const = 0;
  // For the time breakdown: the seconds one step's communication takes with no computation to hide it, measured by
  // running it alone (every rank at once). It changes only what the next step overwrites (gradients).
  virtual double communicationAlone() = 0;
};

}  // namespace loom::parallel
