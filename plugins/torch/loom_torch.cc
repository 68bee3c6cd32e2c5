// loom_torch: loom as a torch.distributed backend. `import loom_torch` registers the backend "loom"
// (torch.distributed.Backend.register_backend), so that init_process_group(backend="loom") and new_group(...,
// backend="loom") run their collectives over a loom communicator.
//
// A process group joins a loom communicator through the group's store: its rank 0 draws a unique id and sets it
// under a key of the group's prefix, the others read it. The group's timeout is the communicator's deadline, so a
// dead peer becomes an error on every survivor within it. Collectives run on a worker thread of the group, one at a
// time in the order they were called (the order every rank calls them), each a blocking loom call; the Work they
// return completes, with its future, when the call returns. Point-to-point messages go over a two-rank communicator
// per peer and direction (made on first use, its id passed through the store), each with a worker thread of its
// own, so that a send waiting for its receiver never holds up a receive from that peer. Tags are accepted but not
// used: between two ranks, messages match in the order they were sent.
//
// Built against torch 1.13 (the ProcessGroup base) and written for torch 2.x too (the Backend base), tensors on the
// CPU: contiguous, of a type loom reduces (float, double, half, bfloat16, int8, uint8, int32, int64; bool for the
// operations that move data without reducing it).
#include <pybind11/chrono.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/loom.h"

namespace loom_torch {

#if TORCH_VERSION_MAJOR >= 2
using Base = c10d::Backend;
#else
using Base = c10d::ProcessGroup;
#endif

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("loom: " + message); }

void check(loomResult_t result, loomComm_t comm, const char* what) {
  if (result == loomSuccess) return;
  fail(std::string(what) + " failed: " + loomGetErrorString(result) + ": " + loomGetLastError(comm));
}

loomDataType_t typeOf(const at::Tensor& tensor, bool reducing) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return loomFloat32;
    case at::kDouble:
      return loomFloat64;
    case at::kHalf:
      return loomFloat16;
    case at::kBFloat16:
      return loomBfloat16;
    case at::kChar:
      return loomInt8;
    case at::kByte:
      return loomUint8;
    case at::kInt:
      return loomInt32;
    case at::kLong:
      return loomInt64;
    case at::kBool:
      if (!reducing) return loomUint8;
      fail("bool tensors cannot be reduced (only moved: broadcast, gather, scatter, all-to-all, send)");
    default:
      fail(std::string("tensors of type ") + c10::toString(tensor.scalar_type()) + " are not supported");
  }
}

loomRedOp_t opOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return loomSum;
    case c10d::ReduceOp::AVG:
      return loomAvg;
    case c10d::ReduceOp::PRODUCT:
      return loomProd;
    case c10d::ReduceOp::MIN:
      return loomMin;
    case c10d::ReduceOp::MAX:
      return loomMax;
    default:
      fail("reduce op " + std::to_string(static_cast<int>(op.op_)) +
           " is not supported (SUM, AVG, PRODUCT, MIN and MAX are)");
  }
}

// Checks a tensor loom can use in place: on the CPU, dense and contiguous.
void checkTensor(const at::Tensor& tensor, const char* what) {
  if (!tensor.device().is_cpu()) fail(std::string(what) + ": tensors must be on the CPU");
  if (tensor.is_sparse() || !tensor.is_contiguous()) fail(std::string(what) + ": tensors must be dense and contiguous");
}

void checkSingle(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1)
    fail(std::string(what) + ": one tensor per call (got " + std::to_string(tensors.size()) + ")");
  checkTensor(tensors[0], what);
}

// All the tensors of a list into one contiguous buffer, and back.
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& tensor : tensors) flat.push_back(tensor.reshape(-1));
  return at::cat(flat);
}
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t at = 0;
  for (at::Tensor& tensor : tensors) {
    tensor.copy_(flat.narrow(0, at, tensor.numel()).view(tensor.sizes()));
    at += tensor.numel();
  }
}

// A collective or message in flight: completes (with its future, whose value is its output tensors) when the loom
// call returns, or fails with its error.
class LoomWork : public c10d::Work {
 public:
  LoomWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void complete(std::exception_ptr error) {
    finish(error);
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A thread that runs tasks in the order they are queued.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  // The error of the last task without a Work, on the worker's thread.
  void rethrowFailure() const {
    if (failed_) std::rethrow_exception(failed_);
  }
  void queue(std::function<void()> run, c10::intrusive_ptr<LoomWork> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.emplace_back(std::move(run), std::move(work));
    }
    ready_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::pair<std::function<void()>, c10::intrusive_ptr<LoomWork>> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::exception_ptr error;
      try {
        task.first();
      } catch (...) {
        error = std::current_exception();
      }
      if (task.second)
        task.second->complete(error);
      else
        failed_ = error;  // a task without a Work (a link's join): its error fails what follows
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<std::function<void()>, c10::intrusive_ptr<LoomWork>>> tasks_;
  bool stopping_ = false;
  std::exception_ptr failed_;
  std::thread thread_;
};

// Draws a unique id and sets it under `key` in `store`.
loomUniqueId publishId(c10d::Store& store, const std::string& key) {
  loomUniqueId id;
  check(loomGetUniqueId(&id), nullptr, "loomGetUniqueId");
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  return id;
}

// The unique id under `key` in `store`, once it is there. Polls rather than waits: a TCPStore holds its lock
// through a waiting get, which would keep this process's other threads from setting their keys.
loomUniqueId readId(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store.check({key})) {
    if (std::chrono::steady_clock::now() > deadline)
      fail("no loom unique id appeared under " + key + " in the store within the group's timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::vector<uint8_t> bytes = store.get(key);
  loomUniqueId id;
  if (bytes.size() != sizeof(id)) fail("the store holds no loom unique id under " + key);
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

// Joins communicator `id` as `rank` of `size`, with `timeout` as its deadline.
loomComm_t join(const loomUniqueId& id, int rank, int size, std::chrono::milliseconds timeout,
                const std::string& name) {
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
  config.commName = name.c_str();
  loomComm_t comm = nullptr;
  check(loomCommInitRankConfig(&comm, size, id, rank, &config), nullptr, "loomCommInitRankConfig");
  return comm;
}

class ProcessGroupLoom : public Base {
 public:
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)
      : Base(rank, size), store_(store), timeout_(timeout) {
    const loomUniqueId id = rank == 0 ? publishId(*store_, "loom/id") : readId(*store_, "loom/id", timeout);
    comm_ = join(id, rank, size, timeout, "torch group");
  }
  ~ProcessGroupLoom() override {
    collectives_.reset();
    for (auto& [key, link] : links_) {
      link->worker.reset();  // its queue run, its thread stopped
      if (link->comm != nullptr) loomCommDestroy(link->comm);
    }
    if (comm_ != nullptr) loomCommDestroy(comm_);
  }

  const std::string getBackendName() const override { return "loom"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    checkSingle(tensors, "broadcast");
    at::Tensor t = tensors[0];
    const int root = static_cast<int>(opts.rootRank);
    return collective(c10d::OpType::BROADCAST, {t}, [=] {
      check(loomBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), typeOf(t, false), root, comm_, nullptr), comm_,
            "loomBroadcast");
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    checkSingle(tensors, "allreduce");
    at::Tensor t = tensors[0];
    const loomRedOp_t op = opOf(opts.reduceOp);
    const loomDataType_t type = typeOf(t, true);
    return collective(c10d::OpType::ALLREDUCE, {t}, [=] {
      check(loomAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, op, comm_, nullptr), comm_, "loomAllReduce");
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    if (tensors.empty()) fail("allreduce_coalesced: no tensors");
    for (const at::Tensor& tensor : tensors) {
      checkTensor(tensor, "allreduce_coalesced");
      if (tensor.scalar_type() != tensors[0].scalar_type()) fail("allreduce_coalesced: tensors of one type only");
    }
    std::vector<at::Tensor> outputs = tensors;
    const loomRedOp_t op = opOf(opts.reduceOp);
    const loomDataType_t type = typeOf(tensors[0], true);
    return collective(c10d::OpType::ALLREDUCE_COALESCED, outputs, [=]() mutable {
      at::Tensor flat = flatten(outputs);
      check(loomAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), type, op, comm_, nullptr), comm_,
            "loomAllReduce");
      unflatten(flat, outputs);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    checkSingle(tensors, "reduce");
    at::Tensor t = tensors[0];
    const loomRedOp_t op = opOf(opts.reduceOp);
    const loomDataType_t type = typeOf(t, true);
    const int root = static_cast<int>(opts.rootRank);
    return collective(c10d::OpType::REDUCE, {t}, [=] {
      check(loomReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, op, root, comm_, nullptr), comm_, "loomReduce");
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    checkSingle(inputs, "allgather");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
      fail("allgather: one list of " + std::to_string(size_) + " output tensors");
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> out = outputs[0];
    for (const at::Tensor& tensor : out) {
      checkTensor(tensor, "allgather");
      if (tensor.numel() != in.numel() || tensor.scalar_type() != in.scalar_type())
        fail("allgather: every output tensor must match the input's size and type");
    }
    return collective(c10d::OpType::ALLGATHER, out, [=]() mutable {
      at::Tensor flat = at::empty({in.numel() * size_}, in.options());
      check(loomAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), typeOf(in, false), comm_, nullptr), comm_,
            "loomAllGather");
      unflatten(flat, out);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    checkTensor(input, "_allgather_base");
    checkTensor(output, "_allgather_base");
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type())
      fail("_allgather_base: the output must hold the world's inputs, of the input's type");
    at::Tensor in = input, out = output;
    return collective(c10d::OpType::_ALLGATHER_BASE, {out}, [=] {
      check(loomAllGather(in.data_ptr(), out.data_ptr(), in.numel(), typeOf(in, false), comm_, nullptr), comm_,
            "loomAllGather");
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    checkSingle(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor in = inputs[0];
    std::vector<at::Tensor> out;
    if (rank_ == root) {
      if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_)
        fail("gather: the root needs one list of " + std::to_string(size_) + " output tensors");
      out = outputs[0];
      for (const at::Tensor& tensor : out)
        if (tensor.numel() != in.numel() || tensor.scalar_type() != in.scalar_type())
          fail("gather: every output tensor must match the input's size and type");
    } else if (!outputs.empty() && !outputs[0].empty()) {
      fail("gather: only the root passes output tensors");
    }
    return collective(c10d::OpType::GATHER, out, [=]() mutable {
      at::Tensor flat = at::empty({rank_ == root ? in.numel() * size_ : 0}, in.options());
      check(loomGather(in.data_ptr(), rank_ == root ? flat.data_ptr() : nullptr, in.numel(), typeOf(in, false), root,
                       comm_, nullptr),
            comm_, "loomGather");
      if (rank_ == root) unflatten(flat, out);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    checkSingle(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor out = outputs[0];
    std::vector<at::Tensor> in;
    if (rank_ == root) {
      if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
        fail("scatter: the root needs one list of " + std::to_string(size_) + " input tensors");
      in = inputs[0];
      for (const at::Tensor& tensor : in)
        if (tensor.numel() != out.numel() || tensor.scalar_type() != out.scalar_type())
          fail("scatter: every input tensor must match the output's size and type");
    } else if (!inputs.empty() && !inputs[0].empty()) {
      fail("scatter: only the root passes input tensors");
    }
    return collective(c10d::OpType::SCATTER, {out}, [=] {
      at::Tensor flat = rank_ == root ? flatten(in) : at::empty({0}, out.options());
      check(loomScatter(rank_ == root ? flat.data_ptr() : nullptr, out.data_ptr(), out.numel(), typeOf(out, false),
                        root, comm_, nullptr),
            comm_, "loomScatter");
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    checkSingle(outputs, "reduce_scatter");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_)
      fail("reduce_scatter: one list of " + std::to_string(size_) + " input tensors");
    at::Tensor out = outputs[0];
    std::vector<at::Tensor> in = inputs[0];
    for (const at::Tensor& tensor : in)
      if (tensor.numel() != out.numel() || tensor.scalar_type() != out.scalar_type())
        fail("reduce_scatter: every input tensor must match the output's size and type");
    const loomRedOp_t op = opOf(opts.reduceOp);
    const loomDataType_t type = typeOf(out, true);
    return collective(c10d::OpType::REDUCE_SCATTER, {out}, [=] {
      at::Tensor flat = flatten(in);
      check(loomReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), type, op, comm_, nullptr), comm_,
            "loomReduceScatter");
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    checkTensor(input, "_reduce_scatter_base");
    checkTensor(output, "_reduce_scatter_base");
    if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type())
      fail("_reduce_scatter_base: the input must hold the world's outputs, of the output's type");
    at::Tensor in = input, out = output;
    const loomRedOp_t op = opOf(opts.reduceOp);
    const loomDataType_t type = typeOf(out, true);
    return collective(c10d::OpType::_REDUCE_SCATTER_BASE, {out}, [=] {
      check(loomReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, op, comm_, nullptr), comm_,
            "loomReduceScatter");
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions&) override {
    checkTensor(input, "alltoall_base");
    checkTensor(output, "alltoall_base");
    if (input.scalar_type() != output.scalar_type()) fail("alltoall_base: input and output of one type");
    // Elements per first-dimension row; splits count rows (empty: equal parts).
    const int64_t row = input.dim() > 0 && input.size(0) > 0 ? input.numel() / input.size(0) : 1;
    auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& tensor, const char* which) {
      std::vector<size_t> result(size_);
      if (splits.empty()) {
        if (tensor.dim() == 0 || tensor.size(0) % size_ != 0)
          fail(std::string("alltoall_base: the ") + which + "'s first dimension does not split evenly");
        for (auto& count : result) count = static_cast<size_t>(tensor.numel() / size_);
        return result;
      }
      if (static_cast<int>(splits.size()) != size_)
        fail(std::string("alltoall_base: one ") + which + " split per rank");
      int64_t rows = 0;
      for (int p = 0; p < size_; ++p) {
        if (splits[p] < 0) fail("alltoall_base: negative split");
        result[p] = static_cast<size_t>(splits[p] * row);
        rows += splits[p];
      }
      if (tensor.dim() == 0 || rows != tensor.size(0))
        fail(std::string("alltoall_base: the ") + which + " splits do not add up to its first dimension");
      return result;
    };
    const std::vector<size_t> sendCounts = counts(inputSplits, input, "input"),
                              receiveCounts = counts(outputSplits, output, "output");
    at::Tensor in = input, out = output;
    return collective(c10d::OpType::ALLTOALL_BASE, {out}, [=] {
      std::vector<size_t> sendDispls(size_), receiveDispls(size_);
      for (int p = 1; p < size_; ++p) {
        sendDispls[p] = sendDispls[p - 1] + sendCounts[p - 1];
        receiveDispls[p] = receiveDispls[p - 1] + receiveCounts[p - 1];
      }
      check(loomAllToAllv(in.data_ptr(), sendCounts.data(), sendDispls.data(), out.data_ptr(), receiveCounts.data(),
                          receiveDispls.data(), typeOf(in, false), comm_, nullptr),
            comm_, "loomAllToAllv");
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_)
      fail("alltoall: one input and one output tensor per rank");
    for (size_t p = 0; p < outputs.size(); ++p) {
      checkTensor(inputs[p], "alltoall");
      checkTensor(outputs[p], "alltoall");
      if (inputs[p].scalar_type() != inputs[0].scalar_type() || outputs[p].scalar_type() != inputs[0].scalar_type())
        fail("alltoall: tensors of one type only");
    }
    std::vector<at::Tensor> in = inputs, out = outputs;
    return collective(c10d::OpType::ALLTOALL, out, [=]() mutable {
      std::vector<size_t> sendCounts(size_), sendDispls(size_), receiveCounts(size_), receiveDispls(size_);
      for (int p = 0; p < size_; ++p) {
        sendCounts[p] = static_cast<size_t>(in[p].numel());
        receiveCounts[p] = static_cast<size_t>(out[p].numel());
        if (p > 0) {
          sendDispls[p] = sendDispls[p - 1] + sendCounts[p - 1];
          receiveDispls[p] = receiveDispls[p - 1] + receiveCounts[p - 1];
        }
      }
      at::Tensor flatIn = flatten(in);
      at::Tensor flatOut =
          at::empty({static_cast<int64_t>(receiveDispls.back() + receiveCounts.back())}, in[0].options());
      check(loomAllToAllv(flatIn.data_ptr(), sendCounts.data(), sendDispls.data(), flatOut.data_ptr(),
                          receiveCounts.data(), receiveDispls.data(), typeOf(in[0], false), comm_, nullptr),
            comm_, "loomAllToAllv");
      unflatten(flatOut, out);
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override {
    checkSingle(tensors, "send");
    checkPeer(dstRank, "send");
    at::Tensor t = tensors[0];
    Link& link = linkTo(dstRank, true);
    return queue(*link.worker, c10d::OpType::SEND, {t}, [t, &link] {
      link.worker->rethrowFailure();
      check(loomSend(t.data_ptr(), t.numel(), typeOf(t, false), link.peer, link.comm, nullptr), link.comm, "loomSend");
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override {
    checkSingle(tensors, "recv");
    checkPeer(srcRank, "recv");
    at::Tensor t = tensors[0];
    Link& link = linkTo(srcRank, false);
    return queue(*link.worker, c10d::OpType::RECV, {t}, [t, &link] {
      link.worker->rethrowFailure();
      check(loomRecv(t.data_ptr(), t.numel(), typeOf(t, false), link.peer, link.comm, nullptr), link.comm, "loomRecv");
    });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    fail("recv from any source is not supported (name the source rank)");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return collective(c10d::OpType::BARRIER, {}, [this] { check(loomBarrier(comm_, nullptr), comm_, "loomBarrier"); });
  }

 private:
  // One direction of messages between this rank and a peer: a two-rank communicator and the thread that runs them.
  struct Link {
    loomComm_t comm = nullptr;
    int peer = 0;  // the other rank's rank in comm
    std::unique_ptr<Worker> worker;
  };

  void checkPeer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      fail(std::string(what) + ": rank " + std::to_string(peer) + " is not another rank of this group of " +
           std::to_string(size_));
  }

  // The link for messages to (`sending`) or from `peer`, joined on first use by its worker, ahead of its first
  // message (so that two ranks each sending first to the other do not wait for each other's join): the sender is
  // rank 0 of its communicator, and draws its id into the store under a key naming both ranks and the direction.
  Link& linkTo(int peer, bool sending) {
    const int from = sending ? rank_ : peer, to = sending ? peer : rank_;
    const std::pair<int, int> key{from, to};
    std::lock_guard<std::mutex> lock(linksMutex_);
    auto found = links_.find(key);
    if (found != links_.end()) return *found->second;
    auto link = std::make_unique<Link>();
    link->peer = sending ? 1 : 0;
    link->worker = std::make_unique<Worker>();
    Link& made = *link;
    const std::string storeKey = "loom/p2p/" + std::to_string(from) + "-" + std::to_string(to);
    // The sender publishes the id at once, from the caller's thread; the receiver's worker waits for it.
    loomUniqueId id{};
    if (sending) id = publishId(*store_, storeKey);
    made.worker->queue(
        [this, &made, storeKey, sending, id] {
          made.comm =
              join(sending ? id : readId(*store_, storeKey, timeout_), sending ? 0 : 1, 2, timeout_, "torch p2p");
        },
        c10::intrusive_ptr<LoomWork>());
    return *links_.emplace(key, std::move(link)).first->second;
  }

  c10::intrusive_ptr<c10d::Work> queue(Worker& worker, c10d::OpType type, std::vector<at::Tensor> outputs,
                                       std::function<void()> run) {
    auto work = c10::make_intrusive<LoomWork>(rank_, type, std::move(outputs));
    worker.queue(std::move(run), work);
    return work;
  }

  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, std::vector<at::Tensor> outputs,
                                            std::function<void()> run) {
    return queue(*collectives_, type, std::move(outputs), std::move(run));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  loomComm_t comm_ = nullptr;
  std::unique_ptr<Worker> collectives_ = std::make_unique<Worker>();
  std::mutex linksMutex_;
  std::map<std::pair<int, int>, std::unique_ptr<Link>> links_;
};

c10::intrusive_ptr<Base> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::chrono::duration<float>& timeout) {
  const auto milliseconds = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ProcessGroupLoom>(store, rank, size, milliseconds);
}

}  // namespace loom_torch

PYBIND11_MODULE(loom_torch, module) {
  module.doc() = "loom as a torch.distributed backend: import it, then init_process_group(backend=\"loom\")";
  // torch's bindings of the base class, which the class below derives from in Python too.
  py::module_::import("torch.distributed");
  py::class_<loom_torch::ProcessGroupLoom, loom_torch::Base, c10::intrusive_ptr<loom_torch::ProcessGroupLoom>>(
      module, "ProcessGroupLoom")
      .def(py::init(
               [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
                 return c10::make_intrusive<loom_torch::ProcessGroupLoom>(store, rank, size, timeout);
               }),
           py::call_guard<py::gil_scoped_release>());
  module.def("_create", &loom_torch::create, py::call_guard<py::gil_scoped_release>(),
             "The backend's constructor for torch.distributed: (store, rank, size, timeout).");
  py::object backend = py::module_::import("torch.distributed").attr("Backend");
#if TORCH_VERSION_MAJOR >= 2
  backend.attr("register_backend")("loom", module.attr("_create"),
                                   py::arg("devices") = std::vector<std::string>{"cpu"});
#else
  backend.attr("register_backend")("loom", module.attr("_create"));
#endif
}
