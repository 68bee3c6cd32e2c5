// DDP's communication: the flat gradient buffer cut into buckets, each averaged across the ranks with one
// all-reduce on a communication stream (a loom host stream, or a CUDA stream ordered after the computation) as soon
// as backward has finished every gradient in it, so that the all-reduce of the last layers overlaps the backward of
// the first (PyTorch DDP's bucketing, on the model's layer-contiguous layout: a bucket is a range of the buffer).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "loom/loom.h"
#include "parallel/kernels/ops.h"
#include "parallel/model/gpt.h"

namespace loom::parallel {

class BucketedAllReduce {
 public:
  // Buckets of `bucketBytes` over `layout`'s buffer from its end (the order backward finishes it), the last one, at
  // the buffer's start, what is left. A bucket may span units; it is queued once the lowest of them is done. The
  // gradients are `ops`' elements in its memory. With `expertComm` (the ranks that hold the same experts) no bucket
  // mixes expert units with others; the experts' buckets are summed over expertComm and the others over comm, and
  // the trainer divides the loss by comm's ranks instead (an expert's gradient gathers every expert-parallel rank's
  // tokens, so no one group's average is the global batch's).
  BucketedAllReduce(loomComm_t comm, Ops& ops, const GptLayout& layout, size_t bucketBytes,
                    loomComm_t expertComm = nullptr);
  ~BucketedAllReduce();
  BucketedAllReduce(const BucketedAllReduce&) = delete;
  BucketedAllReduce& operator=(const BucketedAllReduce&) = delete;

  // A backward over `grads` (the flat gradient buffer) begins.
  void start(void* grads);
  // Backward has finished unit `unit`: queues every bucket whose gradients are now all final.
  void unitDone(int unit);
  // Queues what is left and waits until every bucket is averaged. Returns the seconds it waited: the part of the
  // communication that backward did not hide.
  double finish();

  // [begin, end) of each bucket, in the order they are queued.
  const std::vector<std::pair<size_t, size_t>>& buckets() const { return buckets_; }
  bool expertBucket(size_t bucket) const { return expertBuckets_[bucket]; }

 private:
  void launchReady();

  loomComm_t comm_, expertComm_;
  Ops& ops_;
  loomStream_t stream_ = nullptr;
  std::vector<size_t> unitBegin_;
  std::vector<std::pair<size_t, size_t>> buckets_;
  std::vector<bool> expertBuckets_;
  size_t launched_ = 0;   // buckets queued in this backward
  size_t finalFrom_ = 0;  // gradients from this offset on are final
  void* grads_ = nullptr;
};

}  // namespace loom::parallel
