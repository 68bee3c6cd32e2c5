// Bucketed gradient all-reduce (ddp_comm.h).
#include "parallel/strategies/ddp_comm.h"

#include <algorithm>
#include <chrono>

#include "parallel/check.h"

namespace loom::parallel {

BucketedAllReduce::BucketedAllReduce(loomComm_t comm, Ops& ops, const GptLayout& layout, size_t bucketBytes,
                                     loomComm_t expertComm)
    : comm_(comm), expertComm_(expertComm), ops_(ops), unitBegin_(layout.unitBegin) {
  const size_t perBucket = std::max<size_t>(1, bucketBytes / ops.elementBytes());
  // From the last unit to the first: a unit's elements join the open bucket while it has room (and, with an expert
  // communicator, is of the same kind); a unit larger than a bucket is cut into bucket-sized pieces.
  size_t end = layout.total, open = layout.total;
  bool openExpert = false;
  auto close = [&](bool expert) {
    buckets_.push_back({end, open});
    expertBuckets_.push_back(expert);
    open = end;
  };
  for (size_t unit = unitBegin_.size() - 1; unit-- > 0;) {
    const size_t begin = unitBegin_[unit];
    const bool expert = expertComm_ != nullptr && layout.expertUnit[unit];
    if (open > end && expert != openExpert) close(openExpert);
    openExpert = expert;
    while (end - begin > 0) {
      const size_t take = std::min(end - begin, perBucket - (open - end));
      end -= take;
      if (open - end == perBucket) close(expert);
    }
  }
  if (open > 0) close(openExpert);
  stream_ = ops_.createStream();
}

BucketedAllReduce::~BucketedAllReduce() { ops_.destroyStream(stream_); }

void BucketedAllReduce::start(void* grads) {
  grads_ = grads;
  launched_ = 0;
  finalFrom_ = unitBegin_.back();
}

void BucketedAllReduce::unitDone(int unit) {
  finalFrom_ = std::min(finalFrom_, unitBegin_[unit]);
  launchReady();
}

void BucketedAllReduce::launchReady() {
  if (launched_ == buckets_.size() || buckets_[launched_].first < finalFrom_) return;
  ops_.commAfterCompute(stream_);
  while (launched_ < buckets_.size() && buckets_[launched_].first >= finalFrom_) {
    const bool expert = expertBuckets_[launched_];
    const auto [begin, end] = buckets_[launched_++];
    void* bucket = elementAt(ops_, grads_, begin);
    loomComm_t comm = expert ? expertComm_ : comm_;
    const loomRedOp_t op = expertComm_ != nullptr ? loomSum : loomAvg;
    LOOM_PAR_CHECK(comm, loomAllReduce(bucket, bucket, end - begin, loomTypeOf(ops_.dtype()), op, comm, stream_));
  }
}

double BucketedAllReduce::finish() {
  finalFrom_ = 0;
  launchReady();
  const auto start = std::chrono::steady_clock::now();
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace loom::parallel
