// ZeRO's sharding and its communication. Each unit of the model's buffer (a layer: GptLayout::unitBegin) is padded
// to a multiple of the rank count and cut into equal slices; rank r owns slice r of every unit, so a unit's
// gradients are averaged with one reduce-scatter and its parameters rebuilt with one all-gather, both with equal
// counts, and ZeRO-3 can gather one layer at a time.
#pragma once

#include <cstddef>
#include <vector>

#include "loom/loom.h"
#include "parallel/model/gpt.h"

namespace loom::parallel {

struct UnitShard {
  size_t unitBegin, unitEnd;  // the unit in the full buffer
  size_t slice;               // elements per rank (the padded unit / nranks)
  size_t begin, end;          // the elements this rank owns ([begin, end) in the full buffer; may be empty)
  size_t shardOffset;         // where its slice starts in this rank's shard buffers
};

struct Sharding {
  std::vector<UnitShard> units;
  size_t shardElements = 0;  // this rank's slices of every unit, padding included
  size_t largestUnit = 0;    // the largest padded unit
  static Sharding of(const GptLayout& layout, int nranks, int rank);
};

class ZeroComm {
 public:
  ZeroComm(loomComm_t comm, const Sharding& sharding);
  ~ZeroComm();
  ZeroComm(const ZeroComm&) = delete;
  ZeroComm& operator=(const ZeroComm&) = delete;

  // Queues the average across ranks of unit u's gradients into this rank's slice (`slice`). `unitGrads` holds the
  // unit, padded to slice x nranks elements when `padded`, else unpadded (then copied); it must stay unchanged
  // until wait().
  void reduceScatter(int unit, const float* unitGrads, bool padded, float* slice);
  // Rebuilds unit u's parameters (`unitParams`: the whole unit) from every rank's slice (`slice`); returns when done.
  void allGather(int unit, const float* slice, float* unitParams);
  // Queues the gathering of unit u from every rank's slice into `padded` (slice x nranks elements).
  void gather(int unit, const float* slice, float* padded);
  // The sum over ranks of `value` (a sum of squares for the gradient norm); returns when done.
  double sum(double value);
  // The average over ranks of `value` (the loss).
  float average(float value);
  // Waits for everything queued.
  void wait();

 private:
  loomComm_t comm_;
  const Sharding& sharding_;
  loomStream_t stream_ = nullptr;
  std::vector<std::vector<float>> padded_;  // per unit whose padding reaches past its end: a zero-padded copy
  std::vector<float> gathered_;             // a padded unit, for all-gather
};

}  // namespace loom::parallel
