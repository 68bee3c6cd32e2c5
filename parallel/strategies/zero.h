// ZeRO, stages 1 to 3, on the per-unit sharding of zero_comm.h (rank r owns slice r of every unit).
//  - Stage 1: the optimizer state is sharded. Forward and backward run on the whole model; each unit's gradients
//    are then averaged into the rank's slice (reduce-scatter), the rank steps AdamW on the parameters it owns, and
//    every unit's parameters are all-gathered back.
//  - Stage 2: also the gradients. The model keeps no gradient buffer: backward gets a fresh one per unit (the
//    embeddings' lives through the whole backward, since the tied head adds to it first), and each unit's
//    gradients are reduce-scattered as soon as backward releases it, while the next unit's backward runs; its buffer
//    is freed once that reduce-scatter is done.
//  - Stage 3 (FSDP): also the parameters. Each rank keeps its slices; a unit is all-gathered when the model acquires
//    it, before forward and again before backward, with the next unit's gather queued behind it (prefetch), and
//    freed when released. No all-gather after the step.
// Every rank ends each step with the same parameters as DDP and as one rank over the same global batch.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "loom/loom.h"
#include "parallel/kernels/ops.h"
#include "parallel/model/gpt.h"
#include "parallel/strategies/optimizer.h"
#include "parallel/strategies/trainer.h"
#include "parallel/strategies/zero_comm.h"
#include "parallel/tensor.h"

namespace loom::parallel {

struct ZeroOptions {
  int stage = 1;  // 1, 2 or 3
  AdamWOptions adamw;
  // Stage 1 only: a pipeline's executor runs the micro-batches over the stages. Stages 2 and 3 shard each unit's
  // gradients (and parameters) as backward releases it, once per micro-batch, which a pipeline's interleaved
  // backwards would turn into a reduce-scatter (and gathers) per micro-batch and unit: they take no pipeline.
  MicroBatchRunner* pipeline = nullptr;
};

class ZeroTrainer : public Trainer {
 public:
  // Takes the model's current parameters as the starting point; from stage 2 on it frees the model's own buffers
  // that the stage shards.
  ZeroTrainer(Gpt& model, loomComm_t comm, ZeroOptions options);
  ~ZeroTrainer() override;
  StepReport step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B,
                  int T) override;
  MemoryReport memory() const override;
  const Sharding& sharding() const { return sharding_; }
  // The whole parameters as host floats (the master weights in bf16), gathered from every rank's slices (for checks
  // and checkpoints); every rank must call it.
  std::vector<float> gatherParams();
  void exportState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) override;
  void importState(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                   int steps) override;
  int steps() const override { return optimizers_.empty() ? 0 : optimizers_.front().steps(); }
  // Each unit's reduce-scatter, and its all-gather after the step (stages 1, 2) or two gathers (stage 3, before
  // forward and before backward).
  double communicationAlone() override;

 private:
  void acquire(int unit, bool backward);
  void release(int unit, bool backward);
  // Starts gathering unit u's parameters into a buffer of its own, unless they are there or on their way.
  void startGather(int unit);
  // Waits for the queued reduce-scatters, adds each into the gradient slices and frees its gradient buffer.
  void collectGradients();
  void* allocate(Tensor& buffer, size_t elements);
  void free(Tensor& buffer);
  void* at(Tensor& buffer, size_t elements) { return elementAt(ops_, buffer.data(), elements); }
  // The whole of an array sharded as the units are: `sliceOf(u, padded)` fills unit u's padded slice.
  std::vector<float> gatherUnits(const std::function<void(size_t unit, float* slice)>& sliceOf);

  Gpt& model_;
  Ops& ops_;
  loomComm_t comm_;
  ZeroOptions options_;
  int nranks_ = 1;
  Sharding sharding_;
  ZeroComm zeroComm_;
  // Buffers in the model's memory and element type.
  std::vector<AdamW> optimizers_;  // one per unit, over the elements this rank owns
  Tensor gradSlices_;              // this rank's slice of every unit's averaged gradients
  Tensor incoming_;                // reduce-scatters land here when micro-batches accumulate (stage 2, 3)
  Tensor paramSlices_;             // stage 3: the parameters this rank owns, padded slices
  // Stages 2 and 3: per unit, its gradient buffer (padded) while backward or a reduce-scatter uses it, and (stage
  // 3) its gathered parameters while forward or backward does.
  std::vector<Tensor> unitGrads_, unitParams_;
  std::vector<bool> gathering_;  // stage 3: a gather of the unit is queued or done
  // Units whose reduce-scatter is queued, and whether it lands in incoming_ (to be added to the slices).
  std::vector<std::pair<int, bool>> reducing_;
  bool firstMicro_ = true;
  size_t liveBytes_ = 0, peakBytes_ = 0;  // transient buffers: now, and the most since construction
};

}  // namespace loom::parallel
