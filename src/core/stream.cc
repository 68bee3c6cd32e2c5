// Host streams (see stream.h). A stream is a worker thread with a queue; streams are registered in a set so a
// stale or foreign pointer passed as a stream is an argument error, not a crash.
#include "src/core/stream.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "src/base/check.h"
#include "src/core/comm.h"

namespace loom {
namespace {

class HostStream {
 public:
  HostStream() : worker_([this] { work(); }) {}
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  void enqueue(std::vector<Call> calls) {
    for (const Call& call : calls) call.comm->activeCalls.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(calls));
    }
    wake_.notify_all();
  }

  loomResult_t synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    drained_.wait(lock, [this] { return queue_.empty() && !busy_; });
    loomResult_t result = firstError_;
    firstError_ = loomSuccess;
    return result;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      std::vector<Call> calls = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      loomResult_t result = runCalls(calls);
      for (const Call& call : calls) call.comm->activeCalls.fetch_sub(1);
      lock.lock();
      busy_ = false;
      if (result != loomSuccess && firstError_ == loomSuccess) firstError_ = result;
      if (queue_.empty()) drained_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, drained_;
  std::deque<std::vector<Call>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  loomResult_t firstError_ = loomSuccess;
  std::thread worker_;
};

std::mutex gStreamsMutex;
std::set<HostStream*>& liveStreams() {
  static std::set<HostStream*> streams;
  return streams;
}

HostStream* find(loomStream_t stream) {
  std::lock_guard<std::mutex> lock(gStreamsMutex);
  auto found = liveStreams().find(static_cast<HostStream*>(stream));
  return found == liveStreams().end() ? nullptr : *found;
}

}  // namespace

bool isHostStream(loomStream_t stream) { return find(stream) != nullptr; }

loomResult_t streamEnqueue(loomStream_t stream, std::vector<Call> calls) {
  HostStream* host = find(stream);
  if (host == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "stream %p is not a loom host stream", stream);
  host->enqueue(std::move(calls));
  return loomSuccess;
}

loomResult_t streamCreate(loomStream_t* stream) {
  if (stream == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "stream pointer is NULL");
  auto* host = new HostStream();
  std::lock_guard<std::mutex> lock(gStreamsMutex);
  liveStreams().insert(host);
  *stream = host;
  return loomSuccess;
}

loomResult_t streamSynchronize(loomStream_t stream) {
  HostStream* host = find(stream);
  if (host == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "stream %p is not a loom host stream", stream);
  return host->synchronize();
}

loomResult_t streamDestroy(loomStream_t stream) {
  HostStream* host = find(stream);
  if (host == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "stream %p is not a loom host stream", stream);
  loomResult_t result = host->synchronize();
  {
    std::lock_guard<std::mutex> lock(gStreamsMutex);
    liveStreams().erase(host);
  }
  delete host;
  return result;
}

}  // namespace loom
