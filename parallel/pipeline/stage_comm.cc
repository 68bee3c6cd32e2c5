// A pipeline stage's exchanges besides activations (stage_comm.h).
#include "parallel/pipeline/stage_comm.h"

#include "parallel/check.h"

namespace loom::parallel {

StageComm::StageComm(loomComm_t comm, Ops& ops) : ops_(ops) {
  if (comm != nullptr) {
    loomCommCount(comm, &stages_);
    loomCommUserRank(comm, &stage_);
  }
  if (stages_ == 1) return;
  comm_ = comm;
  stream_ = ops_.createStream();
  scalars_ = std::make_unique<Scalars>(comm_, ops_);
}

StageComm::~StageComm() {
  if (stream_ != nullptr) ops_.destroyStream(stream_);
}

void StageComm::sumTied(void* grads, size_t n) {
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  if (stages_ == 1 || (!first && !last)) return;
  const int peer = first ? stages_ - 1 : 0;
  if (!incoming_.defined() || incoming_.numel() != n)
    incoming_ = Tensor::zeros({static_cast<int64_t>(n)}, ops_.dtype(), &ops_);
  const loomDataType_t type = loomTypeOf(ops_.dtype());
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomGroupStart());
  LOOM_PAR_CHECK(comm_, loomSend(grads, n, type, peer, comm_, stream_));
  LOOM_PAR_CHECK(comm_, loomRecv(incoming_.data(), n, type, peer, comm_, stream_));
  LOOM_PAR_CHECK(comm_, loomGroupEnd());
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
  ops_.add(grads, incoming_.data(), n);  // a + b on one stage, b + a on the other: the same bits
}

double StageComm::sum(double value) { return scalars_ ? scalars_->sum(value) : value; }

}  // namespace loom::parallel
