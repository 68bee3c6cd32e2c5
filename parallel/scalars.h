// Sums and averages of one host value across the ranks (the loss, the gradient norm's sum of squares, its sum over
// tensor-parallel ranks), through a slot in the model's memory: a CUDA communicator reads and writes device memory
// only.
#pragma once

#include "loom/loom.h"
#include "parallel/kernels/ops.h"
#include "parallel/tensor.h"

namespace loom::parallel {

class Scalars {
 public:
  Scalars(loomComm_t comm, Ops& ops);
  ~Scalars();
  Scalars(const Scalars&) = delete;
  Scalars& operator=(const Scalars&) = delete;

  // Each returns when every rank has given its value.
  float average(float value);
  double sum(double value);

 private:
  template <typename Value>
  Value reduce(Value value, loomDataType_t type, loomRedOp_t op);

  loomComm_t comm_;
  Ops& ops_;
  loomStream_t stream_ = nullptr;
  Tensor slot_;
};

}  // namespace loom::parallel
