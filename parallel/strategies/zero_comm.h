// ZeRO's sharding and its communication. Each unit of the model's buffer (a layer: GptLayout::unitBegin) is padded
// to a multiple of the rank count and cut into equal slices; rank r owns slice r of every unit, so a unit's
// gradients are averaged with one reduce-scatter and its parameters rebuilt with one all-gather, both with equal
// counts, and ZeRO-3 can gather one layer at a time.
#pragma once

#include <cstddef>
#include <vector>

#include "loom/loom.h"
#include "parallel/kernels/ops.h"
#include "parallel/model/gpt.h"
#include "parallel/scalars.h"
#include "parallel/tensor.h"

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

// Every buffer is in `ops`' memory and element type unless it says otherwise; each call is queued on the
// communication stream after the computation queued before it.
class ZeroComm {
 public:
  ZeroComm(loomComm_t comm, Ops& ops, const Sharding& sharding);
  ~ZeroComm();
  ZeroComm(const ZeroComm&) = delete;
  ZeroComm& operator=(const ZeroComm&) = delete;

  // Queues the average across ranks of unit u's gradients into this rank's slice (`slice`). `unitGrads` holds the
  // unit padded to slice x nranks elements; it must stay unchanged until wait().
  void reduceScatter(int unit, const void* unitGrads, void* slice);
  // The same in place (stage 1, which keeps the whole gradients): the average of this rank's slice lands at its
  // place in `unitGrads` (the unpadded unit), or, for a unit that needs padding, in a padded copy kept for it.
  // Returns where the slice is.
  void* reduceScatterInPlace(int unit, void* unitGrads);
  // Bytes of the padded copies kept (stages 1 and 2: one per unit the ranks do not divide).
  size_t paddedBytes() const;
  // Rebuilds unit u's parameters (`unitParams`: the whole unit, this rank's slice already in place) from every
  // rank's slice, in place (through the unit's padded copy when the ranks do not divide it); returns when done.
  void allGatherInPlace(int unit, void* unitParams);
  // Makes the padded copies of the units the ranks do not divide now (stages 1 and 2), so that memory() counts them
  // from the start.
  void keepPaddedCopies();
  // Queues the gathering of unit u from every rank's slice into `padded` (slice x nranks elements).
  void gather(int unit, const void* slice, void* padded);
  // The same as allGather for fp32 values on the host (optimizer state, master weights): `slice` holds the unit's
  // padded slice, `whole` receives the whole unit.
  void allGatherHost(int unit, const float* slice, float* whole);
  // The sum over ranks of `value` (a sum of squares for the gradient norm); returns when done.
  double sum(double value) { return scalars_.sum(value); }
  // The average over ranks of `value` (the loss).
  float average(float value) { return scalars_.average(value); }
  // Waits for everything queued.
  void wait();

 private:
  // Unit u's zero-padded copy (made on first use), or null when the ranks divide it.
  Tensor* paddedCopy(int unit);

  loomComm_t comm_;
  Ops& ops_;
  const Sharding& sharding_;
  int nranks_ = 1, rank_ = 0;
  loomStream_t stream_ = nullptr;
  Scalars scalars_;
  std::vector<Tensor> padded_;   // stages 1 and 2, per unit the ranks do not divide: a zero-padded copy
  Tensor hostSlice_, hostUnit_;  // fp32 staging for allGatherHost, in ops' memory
};

}  // namespace loom::parallel
