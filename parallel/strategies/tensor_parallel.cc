// Tensor and sequence parallelism's communication (tensor_parallel.h).
#include "parallel/strategies/tensor_parallel.h"

#include "parallel/check.h"

namespace loom::parallel {

TensorParallel::TensorParallel(loomComm_t comm, bool sequenceParallel, Ops& ops) : ops_(ops) {
  if (comm != nullptr) {
    loomCommCount(comm, &size_);
    loomCommUserRank(comm, &rank_);
  }
  if (size_ == 1) return;
  comm_ = comm;
  sequenceParallel_ = sequenceParallel;
  stream_ = ops_.createStream();
  scalars_ = std::make_unique<Scalars>(comm_, ops_);
}

TensorParallel::~TensorParallel() {
  if (stream_ != nullptr) ops_.destroyStream(stream_);
}

void TensorParallel::reserve(int64_t rows, int channels) {
  if (!sequenceParallel_ || scratchRows_ == rows) return;
  gathered_ = Tensor::zeros({rows, channels}, ops_.dtype(), &ops_);
  partial_ = Tensor::zeros({rows, channels}, ops_.dtype(), &ops_);
  scratchRows_ = rows;
}

void TensorParallel::allReduce(void* data, size_t n, loomDataType_t type, loomRedOp_t op) {
  if (size_ == 1) return;
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomAllReduce(data, data, n, type, op, comm_, stream_));
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
}

void* TensorParallel::gatherRows(void* local) {
  if (!sequenceParallel_) return local;
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomAllGather(local, gathered_.data(), elementsHere_, loomTypeOf(ops_.dtype()), comm_, stream_));
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
  return gathered_.data();
}

void* TensorParallel::partialBuffer(void* out) {
  if (!sequenceParallel_) return out;
  partial_.zero();  // backward adds into it
  return partial_.data();
}

void TensorParallel::finishRows(void* partial, void* out) {
  if (!sequenceParallel_) {
    allReduce(out, elementsHere_, loomTypeOf(ops_.dtype()), loomSum);
    return;
  }
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_,
                 loomReduceScatter(partial, out, elementsHere_, loomTypeOf(ops_.dtype()), loomSum, comm_, stream_));
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
}

double TensorParallel::sum(double value) { return size_ > 1 ? scalars_->sum(value) : value; }

}  // namespace loom::parallel
