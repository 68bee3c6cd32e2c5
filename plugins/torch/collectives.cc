// ProcessGroupLoom's collectives (process_group.h): each checks its tensors on the caller's thread, stages them
// and queues its loom calls on the group's worker.
#include "plugins/torch/process_group.h"

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace loom_torch {

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  checkSingle(tensors, "broadcast");
  Staging stage;
  at::Tensor t = stage.inout(tensors[0]);
  const int root = checkRoot(opts.rootRank, "broadcast");
  return collective(
      c10d::OpType::BROADCAST, tensors,
      [COPY_ALL] {
        call(loomBroadcast(t.data_ptr(), t.data_ptr(), bytesOf(t), loomUint8, root, comm_, nullptr), comm_,
             "loomBroadcast");
      },
      std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  checkSingle(tensors, "allreduce");
  const Reduction r = reductionOf(opts.reduceOp, tensors[0], "allreduce");
  reduceTypeOf(tensors[0], r, "allreduce");
  Staging stage;
  at::Tensor t = stage.inout(tensors[0]);
  return collective(
      c10d::OpType::ALLREDUCE, tensors,
      [COPY_ALL] { grouped({[&](Keep& keep) { allReduce(t, r, keep); }}, "allreduce"); }, std::move(stage));
}

// Each tensor reduced as by allreduce (their types may differ), in one loom group.
c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) fail("allreduce_coalesced: no tensors");
  std::vector<Reduction> reductions;
  for (const at::Tensor& tensor : tensors) {
    checkTensor(tensor, "allreduce_coalesced");
    reductions.push_back(reductionOf(opts.reduceOp, tensor, "allreduce_coalesced"));
    reduceTypeOf(tensor, reductions.back(), "allreduce_coalesced");
  }
  Staging stage;
  std::vector<at::Tensor> outputs = stage.inout(tensors);
  return collective(
      c10d::OpType::ALLREDUCE_COALESCED, tensors,
      [COPY_ALL] {
        std::vector<std::function<void(Keep&)>> calls;
        for (size_t i = 0; i < outputs.size(); ++i)
          calls.push_back([&, i](Keep& keep) { allReduce(outputs[i], reductions[i], keep); });
        grouped(calls, "allreduce_coalesced");
      },
      std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  checkSingle(tensors, "reduce");
  const Reduction r = reductionOf(opts.reduceOp, tensors[0], "reduce");
  reduceTypeOf(tensors[0], r, "reduce");
  const int root = checkRoot(opts.rootRank, "reduce");
  Staging stage;
  at::Tensor t = rank_ == root ? stage.inout(tensors[0]) : stage.in(tensors[0]);
  return collective(c10d::OpType::REDUCE, tensors, [COPY_ALL] {
    if (r.bitwise) {  // gathered at the root, folded there
      at::Tensor stacked = at::empty({rank_ == root ? size_ : 0, t.numel()}, t.options());
      call(loomGather(t.data_ptr(), rank_ == root ? stacked.data_ptr() : nullptr, bytesOf(t), loomUint8, root, comm_,
                      nullptr),
           comm_, "loomGather");
      if (rank_ == root) t.view({-1}).copy_(fold(stacked, r.bitwiseOp));
      return;
    }
    // A scaled input is a copy: the root's result lands in t, the others' tensors stay as they were.
    const at::Tensor in = reducible(scaledInput(t, r)), out = rank_ == root ? reducible(t) : in;
    call(loomReduce(in.data_ptr(), out.data_ptr(), in.numel(), reduceTypeOf(t, r, "reduce"), r.op, root, comm_,
                    nullptr),
         comm_, "loomReduce");
  }, std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions&) {
  checkSingle(inputs, "allgather");
  if (outputs.size() != 1) fail("allgather: one list of " + std::to_string(size_) + " output tensors");
  checkGatherList(outputs[0], inputs[0], "allgather");
  Staging stage;
  at::Tensor in = stage.in(inputs[0]);
  std::vector<at::Tensor> out = stage.out(outputs[0]);
  return collective(
      c10d::OpType::ALLGATHER, outputs[0],
      [COPY_ALL]() mutable { grouped({[&](Keep& keep) { allGatherList(in, out, keep); }}, "allgather"); },
      std::move(stage));
}

// Each input all-gathered, as by allgather, in one loom group: outputLists[p][i] receives rank p's inputs[i].
c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions&) {
  if (inputs.empty()) fail("allgather_coalesced: no input tensors");
  if (static_cast<int>(outputLists.size()) != size_)
    fail("allgather_coalesced: one list of outputs per rank (" + std::to_string(size_) + " ranks, " +
         std::to_string(outputLists.size()) + " lists)");
  std::vector<std::vector<at::Tensor>> out(inputs.size());  // out[i]: input i's tensor of every rank
  std::vector<at::Tensor> every;
  for (int p = 0; p < size_; ++p) {
    if (outputLists[p].size() != inputs.size())
      fail("allgather_coalesced: the list of rank " + std::to_string(p) + " has " +
           std::to_string(outputLists[p].size()) + " tensors, one per input (" + std::to_string(inputs.size()) +
           ") needed");
    for (size_t i = 0; i < inputs.size(); ++i) out[i].push_back(outputLists[p][i]);
    every.insert(every.end(), outputLists[p].begin(), outputLists[p].end());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "allgather_coalesced");
    checkGatherList(out[i], inputs[i], "allgather_coalesced");
  }
  Staging stage;
  std::vector<at::Tensor> in = stage.in(inputs);
  for (auto& list : out) list = stage.out(list);
  return collective(
      c10d::OpType::ALLGATHER_COALESCED, every,
      [COPY_ALL]() mutable {
        std::vector<std::function<void(Keep&)>> calls;
        for (size_t i = 0; i < in.size(); ++i)
          calls.push_back([&, i](Keep& keep) { allGatherList(in[i], out[i], keep); });
        grouped(calls, "allgather_coalesced");
      },
      std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions&) {
  checkGatherInto(output, input, "_allgather_base");
  Staging stage;
  at::Tensor in = stage.in(input), out = stage.out(output);
  return collective(
      c10d::OpType::_ALLGATHER_BASE, {output},
      [COPY_ALL] { grouped({[&](Keep&) { allGatherInto(in, out); }}, "_allgather_base"); }, std::move(stage));
}

#if TORCH_VERSION_MAJOR >= 2
// Each input gathered into its output tensor, as by _allgather_base, in one loom group.
c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions&) {
  checkPairs(outputs, inputs, "allgather_into_tensor_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) checkGatherInto(outputs[i], inputs[i], "allgather_into_tensor_coalesced");
  return pairwise(outputs, inputs, "allgather_into_tensor_coalesced",
                  [this](const at::Tensor& in, const at::Tensor& out, size_t, Keep&) { allGatherInto(in, out); });
}

#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  checkSingle(inputs, "gather");
  const int root = checkRoot(opts.rootRank, "gather");
  std::vector<at::Tensor> mine;
  if (rank_ == root) {
    if (outputs.size() != 1) fail("gather: the root needs one list of " + std::to_string(size_) + " output tensors");
    checkGatherList(outputs[0], inputs[0], "gather");
    mine = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail("gather: only the root passes output tensors");
  }
  Staging stage;
  at::Tensor in = stage.in(inputs[0]);
  std::vector<at::Tensor> out = stage.out(mine);
  return collective(c10d::OpType::GATHER, mine, [COPY_ALL]() mutable {
    at::Tensor flat = at::empty({rank_ == root ? in.numel() * size_ : 0}, in.options());
    call(loomGather(in.data_ptr(), rank_ == root ? flat.data_ptr() : nullptr, bytesOf(in), loomUint8, root, comm_,
                    nullptr),
         comm_, "loomGather");
    if (rank_ == root) unflatten(flat, out);
  }, std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  checkSingle(outputs, "scatter");
  const int root = checkRoot(opts.rootRank, "scatter");
  std::vector<at::Tensor> theirs;
  if (rank_ == root) {
    if (inputs.size() != 1) fail("scatter: the root needs one list of " + std::to_string(size_) + " input tensors");
    checkGatherList(inputs[0], outputs[0], "scatter");
    theirs = inputs[0];
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail("scatter: only the root passes input tensors");
  }
  Staging stage;
  at::Tensor out = stage.out(outputs[0]);
  std::vector<at::Tensor> in = stage.in(theirs);
  return collective(c10d::OpType::SCATTER, outputs, [COPY_ALL] {
    at::Tensor flat = rank_ == root ? flatten(in) : at::empty({0}, out.options());
    call(loomScatter(rank_ == root ? flat.data_ptr() : nullptr, out.data_ptr(), bytesOf(out), loomUint8, root, comm_,
                     nullptr),
         comm_, "loomScatter");
  }, std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  checkSingle(outputs, "reduce_scatter");
  if (inputs.size() != 1) fail("reduce_scatter: one list of " + std::to_string(size_) + " input tensors");
  checkGatherList(inputs[0], outputs[0], "reduce_scatter");
  const Reduction r = reductionOf(opts.reduceOp, outputs[0], "reduce_scatter");
  reduceTypeOf(outputs[0], r, "reduce_scatter");
  Staging stage;
  at::Tensor out = stage.out(outputs[0]);
  std::vector<at::Tensor> in = stage.in(inputs[0]);
  return collective(
      c10d::OpType::REDUCE_SCATTER, outputs,
      [COPY_ALL] {
        grouped({[&](Keep& keep) { reduceScatter(keep.hold(flatten(in)), out, r, keep); }}, "reduce_scatter");
      },
      std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  checkGatherInto(input, output, "_reduce_scatter_base");
  const Reduction r = reductionOf(opts.reduceOp, output, "_reduce_scatter_base");
  reduceTypeOf(output, r, "_reduce_scatter_base");
  Staging stage;
  at::Tensor in = stage.in(input), out = stage.out(output);
  return collective(
      c10d::OpType::_REDUCE_SCATTER_BASE, {output},
      [COPY_ALL] { grouped({[&](Keep& keep) { reduceScatter(in, out, r, keep); }}, "_reduce_scatter_base"); },
      std::move(stage));
}

#if TORCH_VERSION_MAJOR >= 2
// Each input reduced and scattered into its output, as by _reduce_scatter_base, in one loom group.
c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  checkPairs(outputs, inputs, "reduce_scatter_tensor_coalesced");
  std::vector<Reduction> reductions;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkGatherInto(inputs[i], outputs[i], "reduce_scatter_tensor_coalesced");
    reductions.push_back(reductionOf(opts.reduceOp, outputs[i], "reduce_scatter_tensor_coalesced"));
    reduceTypeOf(outputs[i], reductions.back(), "reduce_scatter_tensor_coalesced");
  }
  return pairwise(outputs, inputs, "reduce_scatter_tensor_coalesced",
                  [this, reductions](const at::Tensor& in, const at::Tensor& out, size_t i, Keep& keep) {
                    reduceScatter(in, out, reductions[i], keep);
                  });
}

#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& outputSplits,
                                                               std::vector<int64_t>& inputSplits,
                                                               const c10d::AllToAllOptions&) {
  checkTensor(input, "alltoall_base");
  checkTensor(output, "alltoall_base");
  if (input.scalar_type() != output.scalar_type()) fail("alltoall_base: input and output of one type");
  // Bytes per first-dimension row; splits count rows (empty: equal parts).
  auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& tensor, const char* which) {
    std::vector<size_t> result(size_);
    const size_t row = tensor.dim() > 0 && tensor.size(0) > 0 ? bytesOf(tensor) / tensor.size(0) : 0;
    if (splits.empty()) {
      if (tensor.dim() == 0 || tensor.size(0) % size_ != 0)
        fail(std::string("alltoall_base: the ") + which + "'s first dimension does not split evenly");
      for (auto& count : result) count = bytesOf(tensor) / size_;
      return result;
    }
    if (static_cast<int>(splits.size()) != size_) fail(std::string("alltoall_base: one ") + which + " split per rank");
    int64_t rows = 0;
    for (int p = 0; p < size_; ++p) {
      if (splits[p] < 0) fail("alltoall_base: negative split");
      result[p] = static_cast<size_t>(splits[p]) * row;
      rows += splits[p];
    }
    if (tensor.dim() == 0 || rows != tensor.size(0))
      fail(std::string("alltoall_base: the ") + which + " splits do not add up to its first dimension");
    return result;
  };
  const std::vector<size_t> sendCounts = counts(inputSplits, input, "input"),
                            receiveCounts = counts(outputSplits, output, "output");
  Staging stage;
  at::Tensor in = stage.in(input), out = stage.out(output);
  return collective(
      c10d::OpType::ALLTOALL_BASE, {output}, [COPY_ALL] { allToAll(in, sendCounts, out, receiveCounts); },
      std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions&) {
  if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_)
    fail("alltoall: one input and one output tensor per rank");
  std::vector<size_t> sendCounts(size_), receiveCounts(size_);
  for (int p = 0; p < size_; ++p) {
    checkTensor(inputs[p], "alltoall");
    checkTensor(outputs[p], "alltoall");
    if (inputs[p].scalar_type() != inputs[0].scalar_type() || outputs[p].scalar_type() != inputs[0].scalar_type())
      fail("alltoall: tensors of one type only");
    sendCounts[p] = bytesOf(inputs[p]);
    receiveCounts[p] = bytesOf(outputs[p]);
  }
  Staging stage;
  std::vector<at::Tensor> in = stage.in(inputs), out = stage.out(outputs);
  return collective(c10d::OpType::ALLTOALL, outputs, [COPY_ALL]() mutable {
    at::Tensor flatOut = at::empty({static_cast<int64_t>(
                                       std::accumulate(receiveCounts.begin(), receiveCounts.end(), size_t{0}))},
                                   in[0].options().dtype(at::kByte));
    allToAll(flatten(in), sendCounts, flatOut, receiveCounts);
    int64_t at = 0;
    for (int p = 0; p < size_; ++p) {
      out[p].view({-1}).view(at::kByte).copy_(flatOut.narrow(0, at, static_cast<int64_t>(receiveCounts[p])));
      at += static_cast<int64_t>(receiveCounts[p]);
    }
  }, std::move(stage));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::barrier(const c10d::BarrierOptions&) {
  return collective(c10d::OpType::BARRIER, {}, [this] { call(loomBarrier(comm_, nullptr), comm_, "loomBarrier"); });
}

#if TORCH_VERSION_MAJOR >= 2
void ProcessGroupLoom::checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                                  const char* what) {
  if (inputs.empty() || outputs.size() != inputs.size())
    fail(std::string(what) + ": one output per input (" + std::to_string(inputs.size()) + " inputs, " +
         std::to_string(outputs.size()) + " outputs)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::pairwise(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs, const char* what,
                                                          PairFn each) {
  Staging stage;
  std::vector<at::Tensor> in = stage.in(inputs), out = stage.out(outputs);
  return collective(
      c10d::OpType::COALESCED, outputs,
      [COPY_ALL] {
        std::vector<std::function<void(Keep&)>> calls;
        for (size_t i = 0; i < in.size(); ++i) calls.push_back([&, i](Keep& keep) { each(in[i], out[i], i, keep); });
        grouped(calls, what);
      },
      std::move(stage));
}

#endif

// Runs `calls` (each queues loom calls on comm_) as one loom group, then what they left for after its end. An
// error names `what`, the operation.
void ProcessGroupLoom::grouped(const std::vector<std::function<void(Keep&)>>& calls, const char* what) {
  Keep keep;
  call(loomGroupStart(), comm_, "loomGroupStart");
  try {
    for (const auto& queueCalls : calls) queueCalls(keep);
  } catch (...) {
    loomGroupEnd();
    throw;
  }
  call(loomGroupEnd(), comm_, what);
  for (const auto& then : keep.after) then();
}

// All-reduces t in place by r (queued in the caller's group).
void ProcessGroupLoom::allReduce(const at::Tensor& t, const Reduction& r, Keep& keep) {
  if (r.bitwise) {  // every rank's input gathered, folded here
    const at::Tensor& stacked = keep.hold(at::empty({size_, t.numel()}, t.options()));
    call(loomAllGather(t.data_ptr(), stacked.data_ptr(), bytesOf(t), loomUint8, comm_, nullptr), comm_,
         "loomAllGather");
    keep.after.push_back([t, &stacked, op = r.bitwiseOp] { t.view({-1}).copy_(fold(stacked, op)); });
    return;
  }
  const at::Tensor& in = keep.hold(reducible(scaledInput(t, r)));
  const at::Tensor out = reducible(t);
  call(loomAllReduce(in.data_ptr(), out.data_ptr(), out.numel(), reduceTypeOf(t, r, "allreduce"), r.op, comm_,
                     nullptr),
       comm_, "loomAllReduce");
}

// Reduces `in` (the world's outputs, rank-major) by r, this rank's part into `out` (queued in the caller's group).
void ProcessGroupLoom::reduceScatter(const at::Tensor& in, const at::Tensor& out, const Reduction& r, Keep& keep) {
  if (r.bitwise) {  // part p of every rank's input sent to rank p, folded there
    const at::Tensor& stacked = keep.hold(at::empty({size_, out.numel()}, out.options()));
    call(loomAllToAll(in.data_ptr(), stacked.data_ptr(), bytesOf(out), loomUint8, comm_, nullptr), comm_,
         "loomAllToAll");
    keep.after.push_back([out, &stacked, op = r.bitwiseOp] { out.view({-1}).copy_(fold(stacked, op)); });
    return;
  }
  const at::Tensor& scaled = keep.hold(reducible(scaledInput(in, r)));
  const at::Tensor result = reducible(out);
  call(loomReduceScatter(scaled.data_ptr(), result.data_ptr(), result.numel(), reduceTypeOf(out, r, "reduce_scatter"),
                         r.op, comm_, nullptr),
       comm_, "loomReduceScatter");
}

// All-gathers `in` into the list `out`, one tensor per rank (queued in the caller's group).
void ProcessGroupLoom::allGatherList(const at::Tensor& in, const std::vector<at::Tensor>& out, Keep& keep) {
  const at::Tensor& flat = keep.hold(at::empty({in.numel() * size_}, in.options()));
  call(loomAllGather(in.data_ptr(), flat.data_ptr(), bytesOf(in), loomUint8, comm_, nullptr), comm_,
       "loomAllGather");
  keep.after.push_back([out, &flat]() mutable { unflatten(flat, out); });
}

// All-gathers `in` into `out`, which holds size_ of it (queued in the caller's group).
void ProcessGroupLoom::allGatherInto(const at::Tensor& in, const at::Tensor& out) {
  call(loomAllGather(in.data_ptr(), out.data_ptr(), bytesOf(in), loomUint8, comm_, nullptr), comm_, "loomAllGather");
}

// Sends sendCounts[p] bytes of `in` to each rank p, in rank order, and receives receiveCounts[p] from each into
// `out`, in rank order.
void ProcessGroupLoom::allToAll(const at::Tensor& in, const std::vector<size_t>& sendCounts, const at::Tensor& out,
                                const std::vector<size_t>& receiveCounts) {
  std::vector<size_t> sendDispls(size_), receiveDispls(size_);
  for (int p = 1; p < size_; ++p) {
    sendDispls[p] = sendDispls[p - 1] + sendCounts[p - 1];
    receiveDispls[p] = receiveDispls[p - 1] + receiveCounts[p - 1];
  }
  call(loomAllToAllv(in.data_ptr(), sendCounts.data(), sendDispls.data(), out.data_ptr(), receiveCounts.data(),
                     receiveDispls.data(), loomUint8, comm_, nullptr),
       comm_, "loomAllToAllv");
}

int ProcessGroupLoom::checkRoot(int64_t root, const char* what) const {
  if (root < 0 || root >= size_)
    fail(std::string(what) + ": root " + std::to_string(root) + " is not a rank of this group of " +
         std::to_string(size_));
  return static_cast<int>(root);
}

// A list of size_ tensors, each like `one` (its size and type).
void ProcessGroupLoom::checkGatherList(const std::vector<at::Tensor>& list, const at::Tensor& one,
                                       const char* what) const {
  if (static_cast<int>(list.size()) != size_)
    fail(std::string(what) + ": a list of " + std::to_string(size_) + " tensors, one per rank (got " +
         std::to_string(list.size()) + ")");
  for (const at::Tensor& tensor : list) {
    checkTensor(tensor, what);
    if (tensor.numel() != one.numel() || tensor.scalar_type() != one.scalar_type())
      fail(std::string(what) + ": every tensor of the list must match " + std::to_string(one.numel()) +
           " elements of " + c10::toString(one.scalar_type()) + " (got " + std::to_string(tensor.numel()) + " of " +
           c10::toString(tensor.scalar_type()) + ")");
  }
}

// `whole` holds size_ of `part`, of its type.
void ProcessGroupLoom::checkGatherInto(const at::Tensor& whole, const at::Tensor& part, const char* what) const {
  checkTensor(whole, what);
  checkTensor(part, what);
  if (whole.numel() != part.numel() * size_ || whole.scalar_type() != part.scalar_type())
    fail(std::string(what) + ": the larger tensor must hold " + std::to_string(size_) + " x " +
         std::to_string(part.numel()) + " elements of " + c10::toString(part.scalar_type()) + " (got " +
         std::to_string(whole.numel()) + " of " + c10::toString(whole.scalar_type()) + ")");
}

}  // namespace loom_torch
