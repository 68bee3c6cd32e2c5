// What a pipeline stage's model exchanges with the other stages besides activations (which the pipeline executor,
// executor.h, moves): the gradients of the token embedding that the first stage holds and the last stage's tied
// head holds a copy of (Megatron's tied embedding), and host values summed over the stages (the global gradient
// norm's squares). The model (Gpt) does the maths and says what to exchange.
#pragma once

#include <cstddef>
#include <memory>

#include "loom/loom.h"
#include "parallel/kernels/ops.h"
#include "parallel/scalars.h"
#include "parallel/tensor.h"

namespace loom::parallel {

class StageComm {
 public:
  // Over `comm`'s ranks, rank s being stage s (null, or one rank: no pipeline, and every call passes through).
  StageComm(loomComm_t comm, Ops& ops);
  ~StageComm();
  StageComm(const StageComm&) = delete;
  StageComm& operator=(const StageComm&) = delete;
  int stages() const { return stages_; }
  int stage() const { return stage_; }

  // On the first and last stages, adds the other one's n gradients (the model's element type) to `grads`, in place,
  // so that both hold the sum with the same bits; nothing on the stages between, or with one stage.
  void sumTied(void* grads, size_t n);
  // A host value summed over the stages (itself with one stage).
  double sum(double value);

 private:
  Ops& ops_;
  loomComm_t comm_ = nullptr;
  int stages_ = 1, stage_ = 0;
  loomStream_t stream_ = nullptr;
  std::unique_ptr<Scalars> scalars_;
  Tensor incoming_;  // the other stage's gradients, while they are summed
};

}  // namespace loom::parallel
