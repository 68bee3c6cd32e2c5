// Scalar reductions across the ranks (scalars.h).
#include "parallel/scalars.h"

#include "parallel/check.h"

namespace loom::parallel {

Scalars::Scalars(loomComm_t comm, Ops& ops)
    : comm_(comm), ops_(ops), stream_(ops.createStream()), slot_(Tensor::zeros({2}, DType::kFloat32, &ops)) {}

Scalars::~Scalars() { ops_.destroyStream(stream_); }

template <typename Value>
Value Scalars::reduce(Value value, loomDataType_t type, loomRedOp_t op) {
  ops_.upload(slot_.data(), &value, sizeof(value));
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomAllReduce(slot_.data(), slot_.data(), 1, type, op, comm_, stream_));
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
  ops_.download(&value, slot_.data(), sizeof(value));
  return value;
}

float Scalars::average(float value) { return reduce(value, loomFloat32, loomAvg); }
double Scalars::sum(double value) { return reduce(value, loomFloat64, loomSum); }

}  // namespace loom::parallel
