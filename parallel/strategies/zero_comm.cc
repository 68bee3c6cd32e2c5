// ZeRO's sharding and communication (zero_comm.h).
#include "parallel/strategies/zero_comm.h"

#include <algorithm>

#include "parallel/check.h"

namespace loom::parallel {

Sharding Sharding::of(const GptLayout& layout, int nranks, int rank) {
  Sharding sharding;
  for (size_t u = 0; u + 1 < layout.unitBegin.size(); ++u) {
    UnitShard shard;
    shard.unitBegin = layout.unitBegin[u];
    shard.unitEnd = layout.unitBegin[u + 1];
    const size_t n = shard.unitEnd - shard.unitBegin;
    shard.slice = (n + nranks - 1) / nranks;
    shard.begin = std::min(shard.unitBegin + rank * shard.slice, shard.unitEnd);
    shard.end = std::min(shard.begin + shard.slice, shard.unitEnd);
    shard.shardOffset = sharding.shardElements;
    sharding.shardElements += shard.slice;
    sharding.largestUnit = std::max(sharding.largestUnit, shard.slice * nranks);
    sharding.units.push_back(shard);
  }
  return sharding;
}

ZeroComm::ZeroComm(loomComm_t comm, Ops& ops, const Sharding& sharding)
    : comm_(comm), ops_(ops), sharding_(sharding), scalars_(comm, ops), padded_(sharding.units.size()) {
  loomCommCount(comm_, &nranks_);
  loomCommUserRank(comm_, &rank_);
  stream_ = ops_.createStream();
}

ZeroComm::~ZeroComm() { ops_.destroyStream(stream_); }

void ZeroComm::reduceScatter(int unit, const void* unitGrads, void* slice) {
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomReduceScatter(unitGrads, slice, sharding_.units[unit].slice, loomTypeOf(ops_.dtype()),
                                          loomAvg, comm_, stream_));
}

Tensor* ZeroComm::paddedCopy(int unit) {
  const UnitShard& shard = sharding_.units[unit];
  if (shard.slice * nranks_ == shard.unitEnd - shard.unitBegin) return nullptr;
  Tensor& copy = padded_[unit];
  if (!copy.defined()) copy = Tensor::zeros({static_cast<int64_t>(shard.slice * nranks_)}, ops_.dtype(), &ops_);
  return &copy;
}

void ZeroComm::keepPaddedCopies() {
  for (size_t u = 0; u < sharding_.units.size(); ++u) paddedCopy(static_cast<int>(u));
}

size_t ZeroComm::paddedBytes() const {
  size_t bytes = 0;
  for (const Tensor& copy : padded_) bytes += copy.bytes();
  return bytes;
}

void* ZeroComm::reduceScatterInPlace(int unit, void* unitGrads) {
  const UnitShard& shard = sharding_.units[unit];
  void* buffer = unitGrads;
  if (Tensor* copy = paddedCopy(unit)) {  // the zeroed padding stays zero: it sums to zero wherever it lands
    ops_.copy(copy->data(), unitGrads, (shard.unitEnd - shard.unitBegin) * ops_.elementBytes());
    buffer = copy->data();
  }
  void* slice = elementAt(ops_, buffer, static_cast<size_t>(rank_) * shard.slice);
  reduceScatter(unit, buffer, slice);
  return slice;
}

void ZeroComm::allGatherInPlace(int unit, void* unitParams) {
  const UnitShard& shard = sharding_.units[unit];
  const size_t mine = static_cast<size_t>(rank_) * shard.slice;
  void* buffer = unitParams;
  Tensor* copy = paddedCopy(unit);
  if (copy != nullptr) {  // this rank's elements into its slice of the copy; its padding stays zero
    buffer = copy->data();
    ops_.copy(elementAt(ops_, buffer, mine), elementAt(ops_, unitParams, mine),
              (shard.end - shard.begin) * ops_.elementBytes());
  }
  gather(unit, elementAt(ops_, buffer, mine), buffer);
  wait();
  if (copy != nullptr) ops_.copy(unitParams, buffer, (shard.unitEnd - shard.unitBegin) * ops_.elementBytes());
}

void ZeroComm::gather(int unit, const void* slice, void* padded) {
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_,
                 loomAllGather(slice, padded, sharding_.units[unit].slice, loomTypeOf(ops_.dtype()), comm_, stream_));
}

void ZeroComm::allGatherHost(int unit, const float* slice, float* whole) {
  const UnitShard& shard = sharding_.units[unit];
  if (!hostUnit_.defined()) {
    hostSlice_ = Tensor::zeros({static_cast<int64_t>(sharding_.largestUnit / nranks_)}, DType::kFloat32, &ops_);
    hostUnit_ = Tensor::zeros({static_cast<int64_t>(sharding_.largestUnit)}, DType::kFloat32, &ops_);
  }
  ops_.upload(hostSlice_.data(), slice, shard.slice * sizeof(float));
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomAllGather(hostSlice_.data(), hostUnit_.data(), shard.slice, loomFloat32, comm_, stream_));
  wait();
  ops_.download(whole, hostUnit_.data(), (shard.unitEnd - shard.unitBegin) * sizeof(float));
}

void ZeroComm::wait() { LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_)); }

}  // namespace loom::parallel
