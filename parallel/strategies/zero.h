// ZeRO stage 1: the optimizer state is sharded. Every rank runs forward and backward on its part of the batch with
// the whole model; each unit's gradients are then averaged into the rank's slice with a reduce-scatter (zero_comm.h),
// the rank takes the AdamW step on the parameters it owns only, and every unit's parameters are all-gathered back.
// Each rank holds 1/nranks of the two Adam moments. Stages 2 (gradients sharded during backward) and 3 (parameters
// sharded per layer) build on this sharding.
#pragma once

#include <memory>
#include <vector>

#include "loom/loom.h"
#include "parallel/model/gpt.h"
#include "parallel/strategies/optimizer.h"
#include "parallel/strategies/trainer.h"
#include "parallel/strategies/zero_comm.h"

namespace loom::parallel {

struct ZeroOptions {
  int stage = 1;  // only 1 for now
  AdamWOptions adamw;
};

class ZeroTrainer : public Trainer {
 public:
  ZeroTrainer(Gpt& model, loomComm_t comm, ZeroOptions options);
  StepReport step(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets, int B,
                  int T) override;
  // Whole parameters and gradients, a slice of each unit's optimizer state (and the gradient slices it averages
  // into).
  MemoryReport memory() const override;
  const Sharding& sharding() const { return sharding_; }

 private:
  Gpt& model_;
  loomComm_t comm_;
  ZeroOptions options_;
  Sharding sharding_;
  ZeroComm zeroComm_;
  std::vector<AdamW> optimizers_;  // one per unit, over the elements this rank owns
  std::vector<float> gradSlices_;  // this rank's slice of every unit's averaged gradients
  std::vector<float> paramSlice_;  // one unit's slice of parameters, padded, for the all-gather
};

}  // namespace loom::parallel
