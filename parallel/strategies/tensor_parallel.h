// Tensor parallelism's communication, and sequence parallelism's: what a model cut over a communicator's ranks
// exchanges around its column- and row-parallel layers (Megatron's f and g). The model (Gpt) does the maths and
// asks this for the rows going into each tensor-parallel region and for the sums coming out of it.
//
// Without sequence parallelism every rank holds all B x T rows outside the regions: a region's input is used as
// it is, and its output (each rank's partial sum) is all-reduced. With it, each rank holds 1/t of the rows: the
// input is all-gathered and the output reduce-scattered, which moves the same bytes and keeps 1/t of the
// activations outside the regions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "loom/loom.h"
#include "parallel/kernels/ops.h"
#include "parallel/scalars.h"
#include "parallel/tensor.h"

namespace loom::parallel {

class TensorParallel {
 public:
  // Over `comm`'s ranks (null, or one rank: no tensor parallelism, and every call passes its data through).
  TensorParallel(loomComm_t comm, bool sequenceParallel, Ops& ops);
  ~TensorParallel();
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;
  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequenceParallel() const { return sequenceParallel_; }

  // Scratch for regions over `rows` rows of `channels` values (all B x T of them), made when that changes.
  void reserve(int64_t rows, int channels);
  // The values this rank holds outside the regions: its rows times the channels.
  void setElementsHere(size_t elements) { elementsHere_ = elements; }

  // The sum (or maximum) over the ranks of n elements at `data`, in place.
  void allReduce(void* data, size_t n, loomDataType_t type, loomRedOp_t op);
  // f: a column-parallel layer's input, all rows (`local` itself without sequence parallelism, else this rank's
  // rows gathered into scratch).
  void* gatherRows(void* local);
  // Where a row-parallel layer's partial output over all rows goes: `out` itself, or zeroed scratch.
  void* partialBuffer(void* out);
  // g: that partial output summed over the ranks into `out` (in place without sequence parallelism, else
  // reduce-scattered to this rank's rows).
  void finishRows(void* partial, void* out);
  // A host value summed over the ranks (itself without tensor parallelism).
  double sum(double value);

 private:
  Ops& ops_;
  loomComm_t comm_ = nullptr;
  int size_ = 1, rank_ = 0;
  bool sequenceParallel_ = false;
  loomStream_t stream_ = nullptr;
  std::unique_ptr<Scalars> scalars_;
  size_t elementsHere_ = 0;
  Tensor gathered_, partial_;  // sequence parallelism: all rows, gathered and before the reduce-scatter
  int64_t scratchRows_ = 0;
};

}  // namespace loom::parallel
