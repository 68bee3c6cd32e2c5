// Bucketed gradient all-reduce (ddp_comm.h).
#include "parallel/strategies/ddp_comm.h"

#include <algorithm>
#include <chrono>

#include "parallel/check.h"

namespace loom::parallel {

BucketedAllReduce::BucketedAllReduce(loomComm_t comm, Ops& ops, const GptLayout& layout, size_t bucketBytes)
    : comm_(comm), ops_(ops), unitBegin_(layout.unitBegin) {
  const size_t perBucket = std::max<size_t>(1, bucketBytes / ops.elementBytes());
  // From the last unit to the first: a unit's elements join the open bucket while it has room; a unit larger
  // than a bucket is cut into bucket-sized pieces.
  size_t end = layout.total, open = layout.total;
  for (size_t unit = unitBegin_.size() - 1; unit-- > 0;) {
    const size_t begin = unitBegin_[unit];
    while (end - begin > 0) {
      const size_t take = std::min(end - begin, perBucket - (open - end));
      end -= take;
      if (open - end == perBucket) {
        buckets_.push_back({end, open});
        open = end;
      }
    }
  }
  if (open > 0) buckets_.push_back({0, open});
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
    const auto [begin, end] = buckets_[launched_++];
    void* bucket = elementAt(ops_, grads_, begin);
    LOOM_PAR_CHECK(comm_,
                   loomAllReduce(bucket, bucket, end - begin, loomTypeOf(ops_.dtype()), loomAvg, comm_, stream_));
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
