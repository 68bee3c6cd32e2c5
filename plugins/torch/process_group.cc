// ProcessGroupLoom's set-up, queues and shutdown (process_group.h).
#include "plugins/torch/process_group.h"

#include <algorithm>
#include <optional>

#include "plugins/torch/store.h"

namespace loom_torch {

ProcessGroupLoom::ProcessGroupLoom(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : Base(rank, size), store_(store), timeout_(timeout) {
  const loomUniqueId id = rank == 0 ? publishId(*store_, "loom/id") : readId(*store_, "loom/id", timeout);
  comm_ = join(id, rank, size, timeout, "torch group");
}

#if TORCH_VERSION_MAJOR >= 2
// Ends every call in flight (each fails, as does every later one) and tells the peers; the communicators are
// freed when the group is.
void ProcessGroupLoom::abort() {
  aborted_.store(true);
  stopping_.store(true);
  revokeAll();
}

c10::intrusive_ptr<Base> ProcessGroupLoom::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::vector<int>& ranks,
                                                 const c10::intrusive_ptr<Options>& opts) {
  const auto found = std::find(ranks.begin(), ranks.end(), rank_);
  if (found == ranks.end()) return nullptr;  // not a member: no group here
  const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  return c10::make_intrusive<ProcessGroupLoom>(store, static_cast<int>(found - ranks.begin()),
                                               static_cast<int>(ranks.size()), timeout);
}

#endif

// Checks a loom call's result: an error names the call and loom's message (or says the group was aborted, when
// it was: the communicator then tells nothing more).
void ProcessGroupLoom::call(loomResult_t result, loomComm_t comm, const char* what) const {
  if (result == loomSuccess) return;
  if (aborted_.load()) fail(std::string(what) + " failed: the group was aborted (abort())");
  check(result, comm, what);
}

// Ends the calls in flight on every communicator of the group: they and every later one fail.
void ProcessGroupLoom::revokeAll() {
  std::lock_guard<std::mutex> lock(linksMutex_);
  if (comm_ != nullptr) loomCommRevoke(comm_);
  for (auto& [key, link] : links_)
    if (link->comm != nullptr) loomCommRevoke(link->comm);
}

// Runs what is queued (failing at once after an abort), stops the workers and frees the communicators.
void ProcessGroupLoom::close() {
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

// Queues `run` on `worker`, then the copies back of what `staging` staged; it fails at once if the group is
// aborted by then. `outputs`: the caller's tensors, the Work's result.
c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::queue(Worker& worker, c10d::OpType type,
                                                       std::vector<at::Tensor> outputs, std::function<void()> run,
                                                       Staging staging) {
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

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::collective(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                            std::function<void()> run, Staging staging) {
  if (closed_.load()) fail("the group was shut down (shutdown()): no more calls run on it");
  return queue(*collectives_, type, std::move(outputs), std::move(run), std::move(staging));
}

}  // namespace loom_torch
