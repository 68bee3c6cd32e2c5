// loom_torch: loom as a torch.distributed backend. `import loom_torch` registers the backend "loom"
// (torch.distributed.Backend.register_backend), so that init_process_group(backend="loom") and new_group(...,
// backend="loom") run their collectives over a loom communicator.
//
// A process group joins a loom communicator through the group's store: its rank 0 draws a unique id and sets it
// under a key of the group's prefix, the others read it. The group's timeout is the communicator's deadline, so a
// dead peer becomes an error on every survivor within it. Collectives run on a worker thread of the group, one at a
// time in the order they were called (the order every rank calls them), each a blocking loom call (the coalesced
// forms: one loom group of calls); the Work they return completes, with its future, when the call returns.
// Point-to-point messages go over a two-rank communicator per peer and direction (made on first use, its id passed
// through the store), each with a worker thread of its own, so that a send waiting for its receiver never holds up
// a receive from that peer. A message is its size, then its bytes: a receive checks the size, and a receive from
// any source listens on every peer's link and takes the first message to come (see take()). Tags are accepted but
// not used: between two ranks, messages match in the order they were sent.
//
// One source for torch 1.13 (the ProcessGroup base) and torch 2.x (the Backend base, by TORCH_VERSION_MAJOR).
// Tensors dense and contiguous, on the CPU or a CUDA device: a CUDA tensor goes through host memory (Staging: copied
// to the host when the call is made, after what its stream has queued so far; its result copied back, and the copy
// waited for, before the Work completes). Operations that move data take every dtype (as bytes); reductions take
// the types loom reduces (float, double, half, bfloat16, int8, uint8, int32, int64, and uint32 and uint64 on 2.x),
// complex tensors through their real view (SUM, AVG, PREMUL_SUM), bool as bytes (MIN and PRODUCT are AND, MAX and
// SUM are OR). PREMUL_SUM scales the input by its factor, then sums. The bitwise ops (BAND, BOR, BXOR, on integer
// and bool tensors) have no loom kernel: the inputs are gathered (all-gather, gather or all-to-all) and folded here.
#include <pybind11/chrono.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/loom.h"

namespace loom_torch {

// A lambda that copies what it uses, `this` included: [=] in C++17 (torch 1.13), [=, this] from C++20 (torch 2.x).
#if __cplusplus >= 202002L
#define COPY_ALL =, this
#else
#define COPY_ALL =
#endif

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

// The tensor whose elements loom reduces: a complex tensor's real view, else the tensor itself.
at::Tensor reducible(const at::Tensor& tensor) { return tensor.is_complex() ? at::view_as_real(tensor) : tensor; }

// How an operation reduces: a loom op (after scaling the input by `scale` for PREMUL_SUM), or a bitwise op folded
// here.
struct Reduction {
  loomRedOp_t op = loomSum;
  bool bitwise = false;
  c10d::ReduceOp::RedOpType bitwiseOp = c10d::ReduceOp::BAND;
  bool scaled = false;
  double scale = 1.0;
  at::Tensor scaleTensor;  // PREMUL_SUM's factor as a one-element tensor, when it came as one
};

std::string opName(c10d::ReduceOp::RedOpType op) {
  static const char* const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto index = static_cast<size_t>(op);
  return index < sizeof(names) / sizeof(names[0]) ? names[index] : "reduce op " + std::to_string(index);
}

// The reduction `op` asks for on `tensor` (its dtype checked against it), or an error naming what does not fit.
Reduction reductionOf(const c10d::ReduceOp& op, const at::Tensor& tensor, const char* what) {
  Reduction r;
  const at::ScalarType type = tensor.scalar_type();
  const bool isBool = type == at::kBool, isFloat = at::isFloatingType(type) || at::isComplexType(type);
  const std::string where = std::string(what) + ": " + opName(op.op_) + " on " + c10::toString(type) + " tensors";
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      r.op = isBool ? loomMax : loomSum;  // bool: or
      break;
    case c10d::ReduceOp::AVG:
      if (isBool) fail(where + " is not defined");
      r.op = loomAvg;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = isBool ? loomMin : loomProd;  // bool: and
      break;
    case c10d::ReduceOp::MIN:
      r.op = loomMin;
      break;
    case c10d::ReduceOp::MAX:
      r.op = loomMax;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (isFloat) fail(where + ": bitwise ops take integer and bool tensors");
      r.bitwise = true;
      r.bitwiseOp = op.op_;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!isFloat) fail(where + ": PREMUL_SUM takes floating-point tensors");
      const auto* factor = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (factor == nullptr) fail(where + " without its factor (make it with _make_nccl_premul_sum)");
      r.op = loomSum;
      r.scaled = true;
#if TORCH_VERSION_MAJOR >= 2
      if (factor->tensor_factor.defined()) r.scaleTensor = factor->tensor_factor;
#else
      if (!factor->tensor_factors.empty()) r.scaleTensor = factor->tensor_factors[0];
#endif
      if (r.scaleTensor.defined()) {
        if (r.scaleTensor.numel() != 1) fail(where + ": its factor must be one element");
        r.scaleTensor = r.scaleTensor.to(at::kCPU);
      } else {
        r.scale = factor->double_factor;
      }
      break;
    }
    default:
      fail(where + " is not supported");
  }
  if (at::isComplexType(type) && (r.op != loomSum && r.op != loomAvg))
    fail(where + ": complex tensors reduce by SUM, AVG and PREMUL_SUM only");
  return r;
}

// loom's type for the elements of reducible(tensor) under `r`, or an error naming the type.
loomDataType_t reduceTypeOf(const at::Tensor& tensor, const Reduction& r, const char* what) {
  switch (reducible(tensor).scalar_type()) {
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
    case at::kBool:
      return loomUint8;
    case at::kInt:
      return loomInt32;
    case at::kLong:
      return loomInt64;
#if TORCH_VERSION_MAJOR >= 2
    case at::kUInt32:
      return loomUint32;
    case at::kUInt64:
      return loomUint64;
#endif
    default:
      if (r.bitwise) return loomUint8;  // folded here: moved as bytes
      fail(std::string(what) + ": " + c10::toString(tensor.scalar_type()) +
           " tensors cannot be reduced (they can be moved: broadcast, all-gather, gather, scatter, all-to-all, send)");
  }
}

// The input of a reduction of `tensor` by `r`: the tensor, or a copy scaled by PREMUL_SUM's factor.
at::Tensor scaledInput(const at::Tensor& tensor, const Reduction& r) {
  if (!r.scaled) return tensor;
  return r.scaleTensor.defined() ? tensor * r.scaleTensor.to(tensor.scalar_type()) : tensor * r.scale;
}

// Folds the rows of `stacked` ([ranks, n]) by a bitwise op into a tensor of n.
at::Tensor fold(const at::Tensor& stacked, c10d::ReduceOp::RedOpType op) {
  at::Tensor acc = stacked[0].clone();
  for (int64_t row = 1; row < stacked.size(0); ++row) {
    if (op == c10d::ReduceOp::BAND)
      acc.bitwise_and_(stacked[row]);
    else if (op == c10d::ReduceOp::BOR)
      acc.bitwise_or_(stacked[row]);
    else
      acc.bitwise_xor_(stacked[row]);
  }
  return acc;
}

// A tensor's bytes, for the operations that move data without reducing it (any dtype).
size_t bytesOf(const at::Tensor& tensor) { return static_cast<size_t>(tensor.numel()) * tensor.element_size(); }

// Checks a tensor loom can use, in place or through host memory: on the CPU or a CUDA device, dense and contiguous.
void checkTensor(const at::Tensor& tensor, const char* what) {
  if (!tensor.device().is_cpu() && !tensor.device().is_cuda())
    fail(std::string(what) + ": tensors must be on the CPU or a CUDA device (this one is on " +
         tensor.device().str() + ")");
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
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t at = 0;
  for (const at::Tensor& tensor : tensors) {
    tensor.copy_(flat.narrow(0, at, tensor.numel()).view(tensor.sizes()));
    at += tensor.numel();
  }
}

// LOOM_TORCH_STAGE=1 stages CPU tensors too (copies on the CPU): how the tests run the CUDA tensors' path on a
// machine without a GPU.
bool stageEverything() {
  static const bool all = [] {
    const char* value = std::getenv("LOOM_TORCH_STAGE");
    return value != nullptr && std::string(value) == "1";
  }();
  return all;
}

// The host copies a call works on in place of its CUDA tensors. Each tensor the call reads is copied to the host
// when the call is made (on the caller's thread: the copy waits for what the tensor's stream has queued); each it
// writes gets a host tensor, copied back by finish() once the call has run (on the worker), which then waits for
// those copies, so that the tensors hold the results when the Work completes. A tensor staged twice (a list that
// names it twice) gets the same host copy.
class Staging {
 public:
  // `t` as the call reads it.
  at::Tensor in(const at::Tensor& t) { return stage(t, true, false); }
  // `t` as the call writes it (out) or reads and writes it (inout).
  at::Tensor out(const at::Tensor& t) { return stage(t, false, true); }
  at::Tensor inout(const at::Tensor& t) { return stage(t, true, true); }
  std::vector<at::Tensor> in(const std::vector<at::Tensor>& ts) { return each(ts, true, false); }
  std::vector<at::Tensor> out(const std::vector<at::Tensor>& ts) { return each(ts, false, true); }
  std::vector<at::Tensor> inout(const std::vector<at::Tensor>& ts) { return each(ts, true, true); }

  // Copies the results back into the tensors the call writes, and waits for the copies.
  void finish() const {
    for (const Staged& staged : staged_)
      if (staged.written) staged.original.copy_(staged.host);
    for (const Staged& staged : staged_) {
      if (!staged.written || !staged.original.device().is_cuda()) continue;
      c10::impl::VirtualGuardImpl guard(staged.original.device().type());
      guard.getStream(staged.original.device()).synchronize();
    }
  }

 private:
  struct Staged {
    at::Tensor original, host;
    bool written;
  };
  at::Tensor stage(const at::Tensor& t, bool read, bool written) {
    if (!t.defined() || (t.device().is_cpu() && !stageEverything())) return t;
    for (Staged& staged : staged_) {
      if (staged.original.unsafeGetTensorImpl() != t.unsafeGetTensorImpl()) continue;
      staged.written = staged.written || written;
      return staged.host;
    }
    at::Tensor host = read ? t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true)
                           : at::empty(t.sizes(), t.options().device(at::kCPU));
    staged_.push_back({t, host, written});
    return host;
  }
  std::vector<at::Tensor> each(const std::vector<at::Tensor>& ts, bool read, bool written) {
    std::vector<at::Tensor> hosts;
    for (const at::Tensor& t : ts) hosts.push_back(stage(t, read, written));
    return hosts;
  }
  std::vector<Staged> staged_;
};

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
  // The rank a receive took its message from (set before it completes).
  int sourceRank() const override { return source_.load(); }
  void setSource(int rank) { source_.store(rank); }
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
  std::atomic<int> source_{-1};
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
loomUniqueId readId(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                    const std::atomic<bool>* aborted = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store.check({key})) {
    if (aborted != nullptr && aborted->load()) fail("the group was closed or aborted while waiting for " + key);
    if (timeout.count() > 0 && std::chrono::steady_clock::now() > deadline)
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

// A receiving link's communicator waits for a message's header for as long as a receive may want one (about 24
// days, its own deadline): the group's timeout bounds each receive instead (ProcessGroupLoom::reap).
constexpr int kListenTimeoutMs = INT32_MAX;

// Joins a receiving link (rank 1 of 2) whose calls wait up to kListenTimeoutMs; the join itself is bounded by
// `timeout` (its sender joins as it publishes the id) and ends early when `stop` is set.
loomComm_t joinListening(const loomUniqueId& id, std::chrono::milliseconds timeout, const std::atomic<bool>& stop) {
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = kListenTimeoutMs;
  config.blocking = 0;
  config.commName = "torch p2p";
  loomComm_t comm = nullptr;
  const loomResult_t started = loomCommInitRankConfig(&comm, 2, id, 1, &config);
  if (started != loomInProgress) check(started, nullptr, "loomCommInitRankConfig");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    loomResult_t state = loomSuccess;
    loomCommGetAsyncError(comm, &state);
    if (state == loomSuccess) return comm;
    if (state != loomInProgress) {
      const std::string why = loomGetLastError(comm);
      loomCommAbort(comm);
      fail(std::string("joining a receiving link failed: ") + loomGetErrorString(state) + ": " + why);
    }
    if (stop.load() || std::chrono::steady_clock::now() > deadline) {
      loomCommAbort(comm);
      fail(stop.load() ? "the group was closed while a receiving link joined"
                       : "a receiving link's sender did not join within the group's timeout");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class ProcessGroupLoom : public Base {
 public:
  ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)
      : Base(rank, size), store_(store), timeout_(timeout) {
    const loomUniqueId id = rank == 0 ? publishId(*store_, "loom/id") : readId(*store_, "loom/id", timeout);
    comm_ = join(id, rank, size, timeout, "torch group");
  }
  ~ProcessGroupLoom() override { close(); }

  const std::string getBackendName() const override { return "loom"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
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
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
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
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
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

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    checkGatherInto(output, input, "_allgather_base");
    Staging stage;
    at::Tensor in = stage.in(input), out = stage.out(output);
    return collective(
        c10d::OpType::_ALLGATHER_BASE, {output},
        [COPY_ALL] { grouped({[&](Keep&) { allGatherInto(in, out); }}, "_allgather_base"); }, std::move(stage));
  }

#if TORCH_VERSION_MAJOR >= 2
  // Each input gathered into its output tensor, as by _allgather_base, in one loom group.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions&) override {
    checkPairs(outputs, inputs, "allgather_into_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) checkGatherInto(outputs[i], inputs[i], "allgather_into_tensor_coalesced");
    return pairwise(outputs, inputs, "allgather_into_tensor_coalesced",
                    [this](const at::Tensor& in, const at::Tensor& out, size_t, Keep&) { allGatherInto(in, out); });
  }
#endif

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
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
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions&) override {
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

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
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

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override {
    checkSingle(tensors, "send");
    checkPeer(dstRank, "send");
    Staging stage;
    at::Tensor t = stage.in(tensors[0]);
    Link& link = linkTo(dstRank, true);
    return queue(*link.worker, c10d::OpType::SEND, tensors, [this, t, &link] {
      link.worker->rethrowFailure();
      const uint64_t bytes = bytesOf(t);  // the message's header: its size, by which the receiver matches it
      call(loomSend(&bytes, sizeof(bytes), loomUint8, link.peer, link.comm, nullptr), link.comm, "loomSend");
      call(loomSend(t.data_ptr(), bytes, loomUint8, link.peer, link.comm, nullptr), link.comm, "loomSend");
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override {
    checkSingle(tensors, "recv");
    checkPeer(srcRank, "recv");
    auto posted = post(tensors[0], srcRank, c10d::OpType::RECV);
    Link& link = linkTo(srcRank, false);
    link.worker->queue([this, &link, posted] { take(link, srcOf(link), posted); }, c10::intrusive_ptr<LoomWork>());
    return posted->work;
  }

  // The next message of any peer: every peer's receiving link listens for a header while the receive is open,
  // and the first header claims it. A link whose header came too late keeps it for its next receive.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int) override {
    checkSingle(tensors, "recvAnysource");
    if (size_ < 2) fail("recvAnysource: a group of one rank has no one to receive from");
    auto posted = post(tensors[0], -1, c10d::OpType::RECVANYSOURCE);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      Link& link = linkTo(peer, false);
      link.worker->queue([this, &link, peer, posted] { take(link, peer, posted); }, c10::intrusive_ptr<LoomWork>());
    }
    return posted->work;
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return collective(c10d::OpType::BARRIER, {}, [this] { call(loomBarrier(comm_, nullptr), comm_, "loomBarrier"); });
  }

#if TORCH_VERSION_MAJOR >= 2
  // Ends every call in flight (each fails, as does every later one) and tells the peers; the communicators are
  // freed when the group is.
  void abort() override {
    aborted_.store(true);
    stopping_.store(true);
    revokeAll();
  }
  // Runs what was queued, then frees the communicators; later calls fail.
  void shutdown() override { close(); }

  c10::intrusive_ptr<Options> getBackendOptions() override { return c10::make_intrusive<Options>("loom", timeout_); }

  // A subgroup of this one's ranks: a communicator of its own, joined through the store torch hands it.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Base> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                 const c10::intrusive_ptr<Options>& opts) override {
    const auto found = std::find(ranks.begin(), ranks.end(), rank_);
    if (found == ranks.end()) return nullptr;  // not a member: no group here
    const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
    return c10::make_intrusive<ProcessGroupLoom>(store, static_cast<int>(found - ranks.begin()),
                                                 static_cast<int>(ranks.size()), timeout);
  }
#endif

 private:
  // What the calls of one loom group need after they are queued: tensors that must live until its end (scaled
  // copies, gathered buffers), and what to do with the results once it has ended (folds, copies out).
  struct Keep {
    const at::Tensor& hold(at::Tensor tensor) {
      held.push_back(std::move(tensor));
      return held.back();
    }
    std::deque<at::Tensor> held;  // a deque: hold's references stay valid
    std::vector<std::function<void()>> after;
  };

#if TORCH_VERSION_MAJOR >= 2
  void checkPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, const char* what) {
    if (inputs.empty() || outputs.size() != inputs.size())
      fail(std::string(what) + ": one output per input (" + std::to_string(inputs.size()) + " inputs, " +
           std::to_string(outputs.size()) + " outputs)");
  }

  // The coalesced forms over (input, output) pairs: `each(in, out, i, keep)` queues pair i's calls, all of them
  // in one loom group.
  using PairFn = std::function<void(const at::Tensor&, const at::Tensor&, size_t, Keep&)>;
  c10::intrusive_ptr<c10d::Work> pairwise(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const char* what, PairFn each) {
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
  void grouped(const std::vector<std::function<void(Keep&)>>& calls, const char* what) {
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

  // Checks a loom call's result: an error names the call and loom's message (or says the group was aborted, when
  // it was: the communicator then tells nothing more).
  void call(loomResult_t result, loomComm_t comm, const char* what) const {
    if (result == loomSuccess) return;
    if (aborted_.load()) fail(std::string(what) + " failed: the group was aborted (abort())");
    check(result, comm, what);
  }

  // All-reduces t in place by r (queued in the caller's group).
  void allReduce(const at::Tensor& t, const Reduction& r, Keep& keep) {
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
  void reduceScatter(const at::Tensor& in, const at::Tensor& out, const Reduction& r, Keep& keep) {
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
  void allGatherList(const at::Tensor& in, const std::vector<at::Tensor>& out, Keep& keep) {
    const at::Tensor& flat = keep.hold(at::empty({in.numel() * size_}, in.options()));
    call(loomAllGather(in.data_ptr(), flat.data_ptr(), bytesOf(in), loomUint8, comm_, nullptr), comm_,
         "loomAllGather");
    keep.after.push_back([out, &flat]() mutable { unflatten(flat, out); });
  }

  // All-gathers `in` into `out`, which holds size_ of it (queued in the caller's group).
  void allGatherInto(const at::Tensor& in, const at::Tensor& out) {
    call(loomAllGather(in.data_ptr(), out.data_ptr(), bytesOf(in), loomUint8, comm_, nullptr), comm_, "loomAllGather");
  }

  // Sends sendCounts[p] bytes of `in` to each rank p, in rank order, and receives receiveCounts[p] from each into
  // `out`, in rank order.
  void allToAll(const at::Tensor& in, const std::vector<size_t>& sendCounts, const at::Tensor& out,
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

  int checkRoot(int64_t root, const char* what) const {
    if (root < 0 || root >= size_)
      fail(std::string(what) + ": root " + std::to_string(root) + " is not a rank of this group of " +
           std::to_string(size_));
    return static_cast<int>(root);
  }

  // A list of size_ tensors, each like `one` (its size and type).
  void checkGatherList(const std::vector<at::Tensor>& list, const at::Tensor& one, const char* what) const {
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
  void checkGatherInto(const at::Tensor& whole, const at::Tensor& part, const char* what) const {
    checkTensor(whole, what);
    checkTensor(part, what);
    if (whole.numel() != part.numel() * size_ || whole.scalar_type() != part.scalar_type())
      fail(std::string(what) + ": the larger tensor must hold " + std::to_string(size_) + " x " +
           std::to_string(part.numel()) + " elements of " + c10::toString(part.scalar_type()) + " (got " +
           std::to_string(whole.numel()) + " of " + c10::toString(whole.scalar_type()) + ")");
  }

  // Ends the calls in flight on every communicator of the group: they and every later one fail.
  void revokeAll() {
    std::lock_guard<std::mutex> lock(linksMutex_);
    if (comm_ != nullptr) loomCommRevoke(comm_);
    for (auto& [key, link] : links_)
      if (link->comm != nullptr) loomCommRevoke(link->comm);
  }

  // Runs what is queued (failing at once after an abort), stops the workers and frees the communicators.
  void close() {
    // Called from Python's deallocation too, with the GIL held: the threads joined here may drop the last
    // reference to a tensor whose Python object C++ then owns, which takes the GIL to free it.
    std::optional<py::gil_scoped_release> withoutGil;
    if (PyGILState_Check()) withoutGil.emplace();
    std::lock_guard<std::mutex> closing(closeMutex_);
    collectives_.reset();  // its queue run, its thread stopped
    {
      std::lock_guard<std::mutex> lock(postedMutex_);
      closed_.store(true);
      stopping_.store(true);
    }
    reapWake_.notify_all();
    if (reaper_.joinable()) reaper_.join();  // every receive still open failed
    std::map<std::pair<int, int>, std::unique_ptr<Link>> links;
    {
      std::lock_guard<std::mutex> lock(linksMutex_);
      links.swap(links_);
    }
    for (auto& [key, link] : links) {
      // A receiving link may be listening for a header that will never come: revoked, its wait ends.
      loomComm_t comm = nullptr;
      {
        std::lock_guard<std::mutex> lock(linksMutex_);  // its worker may be setting it
        comm = link->comm;
      }
      if (link->from != rank_ && comm != nullptr && !link->revoked.exchange(true)) loomCommRevoke(comm);
      link->worker.reset();
      if (link->comm != nullptr) loomCommDestroy(link->comm);
    }
    loomComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(linksMutex_);  // revokeAll uses comm_ under it
      std::swap(comm, comm_);
    }
    if (comm != nullptr) loomCommDestroy(comm);
  }

  // One direction of messages between this rank and a peer: a two-rank communicator and the thread that runs them.
  // A receiving link also holds the header of a message it has received but not yet delivered.
  struct Link {
    loomComm_t comm = nullptr;
    int peer = 0;  // the other rank's rank in comm
    int from = 0;  // the sending rank, in the group
    std::unique_ptr<Worker> worker;
    bool hasHeader = false;  // on the worker's thread only
    uint64_t header = 0;
    std::atomic<bool> revoked{false};  // by reap, a receive past its deadline in the middle of its message
  };

  // A receive not yet completed: from `source` (-1: any peer), into `tensor`, by `deadline`. The first of a link
  // (its message arrived) and reap (its deadline passed) to claim it completes it.
  struct Posted {
    int source = -1;
    Staging staging;
    at::Tensor tensor;  // the caller's, or its host copy (staging)
    c10::intrusive_ptr<LoomWork> work;
    std::chrono::steady_clock::time_point deadline;
    std::atomic<bool> claimed{false};
    std::atomic<Link*> receiving{nullptr};  // the link moving its message, once claimed by one
    std::atomic<int> failedLinks{0};
  };

  int srcOf(const Link& link) const { return link.from; }

  // A receive into `tensor` from `source` (-1: any), its Work, and its place among the receives reap watches.
  std::shared_ptr<Posted> post(const at::Tensor& tensor, int source, c10d::OpType type) {
    auto posted = std::make_shared<Posted>();
    posted->source = source;
    posted->tensor = posted->staging.out(tensor);
    posted->work = c10::make_intrusive<LoomWork>(rank_, type, std::vector<at::Tensor>{tensor});
    posted->deadline = std::chrono::steady_clock::now() + timeout_;
    std::lock_guard<std::mutex> lock(postedMutex_);
    if (closed_.load()) fail("the group was shut down (shutdown()): no more calls run on it");
    posted_.push_back(posted);
    if (!reaper_.joinable()) reaper_ = std::thread([this] { reap(); });
    return posted;
  }

  static void finish(Posted& posted, std::exception_ptr error) {
    posted.work->complete(error);
  }

  // On `link`'s worker (messages from `peer`): receives the next message's header unless the link holds one, and
  // delivers that message into `posted` if no one has claimed it; else the header waits for the link's next
  // receive.
  void take(Link& link, int peer, const std::shared_ptr<Posted>& posted) {
    if (posted->claimed.load()) return;  // taken from another link, or past its deadline: nothing to listen for
    try {
      link.worker->rethrowFailure();
      if (aborted_.load()) fail("the group was aborted (abort()): no more calls run on it");
      if (!link.hasHeader) {
        call(loomRecv(&link.header, sizeof(link.header), loomUint8, link.peer, link.comm, nullptr), link.comm,
             "loomRecv");
        link.hasHeader = true;
      }
    } catch (...) {
      // A link that cannot receive fails a receive from its peer; a receive from any peer only once every link has.
      if (posted->source >= 0 || posted->failedLinks.fetch_add(1) + 2 == size_) {
        if (!posted->claimed.exchange(true)) finish(*posted, std::current_exception());
      }
      return;
    }
    if (posted->claimed.exchange(true)) return;  // the header stays for the link's next receive
    posted->receiving.store(&link);
    link.hasHeader = false;
    const uint64_t bytes = link.header, wanted = bytesOf(posted->tensor);
    std::exception_ptr error;
    try {
      if (bytes != wanted) {  // the message is taken off the link all the same, then the receive fails
        std::vector<uint8_t> sink(bytes);
        call(loomRecv(sink.data(), bytes, loomUint8, link.peer, link.comm, nullptr), link.comm, "loomRecv");
        fail("recv: rank " + std::to_string(peer) + " sent " + std::to_string(bytes) + " bytes; this receive takes " +
             std::to_string(wanted) + " (" + std::to_string(posted->tensor.numel()) + " of " +
             c10::toString(posted->tensor.scalar_type()) + ")");
      }
      call(loomRecv(posted->tensor.data_ptr(), bytes, loomUint8, link.peer, link.comm, nullptr), link.comm,
           "loomRecv");
      posted->staging.finish();
      posted->work->setSource(peer);
    } catch (...) {
      error = std::current_exception();
      if (link.revoked.load())
        error = std::make_exception_ptr(std::runtime_error(
            "loom: recv from rank " + std::to_string(peer) + ": its message did not arrive within the group's timeout (" +
            std::to_string(timeout_.count()) + " ms)"));
    }
    posted->receiving.store(nullptr);
    finish(*posted, error);
  }

  // The receives' deadlines: one not claimed by then fails; one whose message is still arriving then ends its
  // link (revoked: the peer's later messages fail too, as a timed-out loom call's would). Works are completed
  // outside the lock: their futures' callbacks may post receives.
  void reap() {
    std::unique_lock<std::mutex> lock(postedMutex_);
    for (;;) {
      const bool closing = closed_.load();
      std::vector<std::pair<std::shared_ptr<Posted>, std::string>> failing;
      const auto now = std::chrono::steady_clock::now();
      for (auto it = posted_.begin(); it != posted_.end();) {
        Posted& posted = **it;
        if (posted.work->isCompleted()) {
          it = posted_.erase(it);
          continue;
        }
        if (closing || now > posted.deadline) {
          if (!posted.claimed.exchange(true)) {
            const std::string from = posted.source < 0 ? "any rank" : "rank " + std::to_string(posted.source);
            failing.emplace_back(*it, closing ? "loom: recv from " + from + ": the group was shut down or aborted"
                                              : "loom: recv from " + from + ": no message within the group's timeout (" +
                                                    std::to_string(timeout_.count()) + " ms)");
            it = posted_.erase(it);
            continue;
          }
          if (Link* link = posted.receiving.load(); link != nullptr && !link->revoked.exchange(true))
            loomCommRevoke(link->comm);
        }
        ++it;
      }
      lock.unlock();
      for (auto& [posted, message] : failing) finish(*posted, std::make_exception_ptr(std::runtime_error(message)));
      lock.lock();
      if (closing) return;
      reapWake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

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
    if (closed_.load()) fail("the group was shut down (shutdown()): no more calls run on it");
    auto found = links_.find(key);
    if (found != links_.end()) return *found->second;
    auto link = std::make_unique<Link>();
    link->peer = sending ? 1 : 0;
    link->from = from;
    link->worker = std::make_unique<Worker>();
    Link& made = *link;
    const std::string storeKey = "loom/p2p/" + std::to_string(from) + "-" + std::to_string(to);
    // The sender publishes the id at once, from the caller's thread; the receiver's worker waits for it.
    loomUniqueId id{};
    if (sending) id = publishId(*store_, storeKey);
    made.worker->queue(
        [this, &made, storeKey, sending, id] {
          // A receiving link waits for its sender without a deadline of its own (the peer may never send; each
          // receive has the group's), until the group closes.
          loomComm_t comm = sending ? join(id, 0, 2, timeout_, "torch p2p")
                                    : joinListening(readId(*store_, storeKey, std::chrono::milliseconds(0), &stopping_),
                                                    timeout_, stopping_);
          std::lock_guard<std::mutex> lock(linksMutex_);  // revokeAll and close read it
          made.comm = comm;
          if (aborted_.load() || (!sending && stopping_.load() && !made.revoked.exchange(true))) loomCommRevoke(comm);
        },
        c10::intrusive_ptr<LoomWork>());
    return *links_.emplace(key, std::move(link)).first->second;
  }

  // Queues `run` on `worker`, then the copies back of what `staging` staged; it fails at once if the group is
  // aborted by then. `outputs`: the caller's tensors, the Work's result.
  c10::intrusive_ptr<c10d::Work> queue(Worker& worker, c10d::OpType type, std::vector<at::Tensor> outputs,
                                       std::function<void()> run, Staging staging = {}) {
    auto work = c10::make_intrusive<LoomWork>(rank_, type, std::move(outputs));
    worker.queue(
        [this, run = std::move(run), staging = std::move(staging)] {
          if (aborted_.load()) fail("the group was aborted (abort()): no more calls run on it");
          run();
          staging.finish();
        },
        work);
    return work;
  }

  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, std::vector<at::Tensor> outputs,
                                            std::function<void()> run, Staging staging = {}) {
    if (closed_.load()) fail("the group was shut down (shutdown()): no more calls run on it");
    return queue(*collectives_, type, std::move(outputs), std::move(run), std::move(staging));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false}, closed_{false};
  std::atomic<bool> stopping_{false};  // closed or aborted: what waits without a deadline gives up
  std::mutex closeMutex_;
  std::mutex postedMutex_;
  std::condition_variable reapWake_;
  std::vector<std::shared_ptr<Posted>> posted_;
  std::thread reaper_;
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
                                   py::arg("devices") = std::vector<std::string>{"cpu", "cuda"});
#else
  backend.attr("register_backend")("loom", module.attr("_create"));
#endif
}
