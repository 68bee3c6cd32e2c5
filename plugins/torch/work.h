// What runs a call of loom_torch (loom_torch.cc describes the backend): Staging, the host copies of its CUDA
// tensors; LoomWork, the Work it returns; and Worker, the thread that runs calls in the order they are queued.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "plugins/torch/helpers.h"

namespace loom_torch {

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
  void finish() const;

 private:
  struct Staged {
    at::Tensor original, host;
    bool written;
  };
  at::Tensor stage(const at::Tensor& t, bool read, bool written);
  std::vector<at::Tensor> each(const std::vector<at::Tensor>& ts, bool read, bool written);
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
  ~Worker();
  // The error of the last task without a Work, on the worker's thread.
  void rethrowFailure() const {
    if (failed_) std::rethrow_exception(failed_);
  }
  void queue(std::function<void()> run, c10::intrusive_ptr<LoomWork> work);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::pair<std::function<void()>, c10::intrusive_ptr<LoomWork>>> tasks_;
  bool stopping_ = false;
  std::exception_ptr failed_;
  std::thread thread_;
};

}  // namespace loom_torch
