// ZeRO's sharding and communication (zero_comm.h).
#include "parallel/strategies/zero_comm.h"

#include <algorithm>
#include <cstring>

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

ZeroComm::ZeroComm(loomComm_t comm, const Sharding& sharding)
    : comm_(comm), sharding_(sharding), padded_(sharding.units.size()), gathered_(sharding.largestUnit) {
  LOOM_PAR_CHECK(comm_, loomStreamCreate(&stream_));
}

ZeroComm::~ZeroComm() {
  if (stream_ != nullptr) loomStreamDestroy(stream_);
}

void ZeroComm::reduceScatter(int unit, const float* unitGrads, bool padded, float* slice) {
  const UnitShard& shard = sharding_.units[unit];
  const size_t n = shard.unitEnd - shard.unitBegin;
  int nranks = 1;
  loomCommCount(comm_, &nranks);
  const float* send = unitGrads;
  if (!padded && shard.slice * nranks != n) {
    // The padding: a zeroed copy, since reading past the unit would read past the buffer for the last one.
    std::vector<float>& copy = padded_[unit];
    copy.assign(shard.slice * nranks, 0.0f);
    std::memcpy(copy.data(), unitGrads, n * sizeof(float));
    send = copy.data();
  }
  LOOM_PAR_CHECK(comm_, loomReduceScatter(send, slice, shard.slice, loomFloat32, loomAvg, comm_, stream_));
}

void ZeroComm::allGather(int unit, const float* slice, float* unitParams) {
  const UnitShard& shard = sharding_.units[unit];
  gather(unit, slice, gathered_.data());
  wait();
  std::memcpy(unitParams, gathered_.data(), (shard.unitEnd - shard.unitBegin) * sizeof(float));
}

void ZeroComm::gather(int unit, const float* slice, float* padded) {
  LOOM_PAR_CHECK(comm_, loomAllGather(slice, padded, sharding_.units[unit].slice, loomFloat32, comm_, stream_));
}

double ZeroComm::sum(double value) {
  LOOM_PAR_CHECK(comm_, loomAllReduce(&value, &value, 1, loomFloat64, loomSum, comm_, stream_));
  LOOM_PAR_CHECK(comm_, loomStreamSynchronize(stream_));
  return value;
}

float ZeroComm::average(float value) {
  LOOM_PAR_CHECK(comm_, loomAllReduce(&value, &value, 1, loomFloat32, loomAvg, comm_, stream_));
  LOOM_PAR_CHECK(comm_, loomStreamSynchronize(stream_));
  return value;
}

void ZeroComm::wait() { LOOM_PAR_CHECK(comm_, loomStreamSynchronize(stream_)); }

}  // namespace loom::parallel
