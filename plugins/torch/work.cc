// Staging, LoomWork and Worker (work.h): the host copies, the Work and the worker thread of loom_torch's calls.
#include "plugins/torch/work.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdlib>
#include <string>

namespace loom_torch {

// LOOM_TORCH_STAGE=1 stages CPU tensors too (copies on the CPU): how the tests run the CUDA tensors' path on a
// machine without a GPU.
bool stageEverything() {
  static const bool all = [] {
    const char* value = std::getenv("LOOM_TORCH_STAGE");
    return value != nullptr && std::string(value) == "1";
  }();
  return all;
}

void Staging::finish() const {
  for (const Staged& staged : staged_)
    if (staged.written) staged.original.copy_(staged.host);
  for (const Staged& staged : staged_) {
    if (!staged.written || !staged.original.device().is_cuda()) continue;
    c10::impl::VirtualGuardImpl guard(staged.original.device().type());
    guard.getStream(staged.original.device()).synchronize();
  }
}

at::Tensor Staging::stage(const at::Tensor& t, bool read, bool written) {
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

std::vector<at::Tensor> Staging::each(const std::vector<at::Tensor>& ts, bool read, bool written) {
  std::vector<at::Tensor> hosts;
  for (const at::Tensor& t : ts) hosts.push_back(stage(t, read, written));
  return hosts;
}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  thread_.join();
}

void Worker::queue(std::function<void()> run, c10::intrusive_ptr<LoomWork> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.emplace_back(std::move(run), std::move(work));
  }
  ready_.notify_one();
}

void Worker::loop() {
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

}  // namespace loom_torch
