// Data parallelism (DDP): every rank holds the whole model and optimizer, runs forward and backward on its part of
// the global batch, and the gradients are averaged across the ranks (BucketedAllReduce, overlapped with backward)
// before every rank takes the same AdamW step. With gradient accumulation, a step is several micro-batches whose
// gradients add up locally; only the last one's backward communicates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "loom/loom.h"
#include "parallel/model/gpt.h"
#include "parallel/scalars.h"
#include "parallel/strategies/ddp_comm.h"
#include "parallel/strategies/optimizer.h"
#include "parallel/strategies/trainer.h"

namespace loom::parallel {

struct DdpOptions {
  size_t bucketBytes = size_t{25} << 20;  // PyTorch DDP's default
  AdamWOptions adamw;
  // A pipeline's executor runs the micro-batches over the stages; the gradients are then averaged at once (the
  // buckets queued together) after the pipeline's last backward, and the tied embedding's halves summed across the
  // first and last stages.
  MicroBatchRunner* pipeline = nullptr;
  // With experts spread over expert-parallel ranks: the ranks that hold the same experts (BucketedAllReduce).
  loomComm_t expertComm = nullptr;
};

class DdpTrainer : public Trainer {
 public:
  DdpTrainer(Gpt& model, loomComm_t comm, DdpOptions options);
  StepReport step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B,
                  int T) override;
  // Everything whole on every rank. The model's Ops and the communicator must be of one kind (host or CUDA).
  MemoryReport memory() const override;
  void exportState(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) override;
  void importState(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v,
                   int steps) override;
  int steps() const override { return optimizer_.steps(); }
  double communicationAlone() override;
  const BucketedAllReduce& buckets() const { return buckets_; }
  const AdamW& optimizer() const { return optimizer_; }

 private:
  // The model's parameters as host floats.
  std::vector<float> downloadParams() const;

  Gpt& model_;
  loomComm_t comm_;
  MicroBatchRunner* pipeline_;
  float lossScale_ = 1;  // 1, or 1 / the data-parallel ranks with an expert communicator
  BucketedAllReduce buckets_;
  AdamW optimizer_;
  Scalars scalars_;
};

}  // namespace loom::parallel
