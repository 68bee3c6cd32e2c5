// Where each communicator of this process is, for finding the rank a job is stuck on: on SIGUSR1, or when the file
// LOOM_STATUS_FILE names is touched, every communicator's state goes to the log: its calls started and finished,
// the call running, how long it has waited and for what ("a message from rank 3 on channel 0").
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "loom/loom.h"
#include "src/base/wait.h"

struct loomComm;

namespace loom {

// One communicator's state, written by its calls and read by the status thread. The per-call part is a few
// relaxed stores, so that a call pays next to nothing for it.
class CommStatus {
 public:
  // A call (or a group's share) of the communicator starts running; `collective` is a loom::Collective.
  void begin(uint8_t collective, size_t count, loomDataType_t datatype, loomRedOp_t op, int root);
  void end() { finished_.fetch_add(1, std::memory_order_relaxed); }
  // The run enters `n` more collective calls (Send and Recv are not counted): every rank numbers the collectives
  // of a communicator alike, so a peer's count tells whether it has entered the call this rank waits in.
  // Returns the number of the first of them.
  uint64_t enterCollectives(uint64_t n) { return collectives_.fetch_add(n, std::memory_order_relaxed) + 1; }
  uint64_t collectives() const { return collectives_.load(std::memory_order_relaxed); }
  uint64_t started() const { return started_.load(std::memory_order_relaxed); }
  uint64_t finished() const { return finished_.load(std::memory_order_relaxed); }
  // The running call has been waiting for `what` since `since`.
  void waiting(const std::string& what, Clock::time_point since);
  // "12 calls started, 11 finished; running AllReduce of 1048576 float (sum), waiting 3.2 s for ..."
  std::string describe() const;

 private:
  std::atomic<uint64_t> started_{0}, finished_{0}, collectives_{0};
  std::atomic<uint8_t> collective_{0}, datatype_{0}, op_{0};
  std::atomic<int32_t> root_{0};
  std::atomic<uint64_t> count_{0};
  mutable std::mutex mutex_;
  uint64_t waitingCall_ = 0;  // started_ of the call that was waiting
  std::string waitingFor_;
  Clock::time_point waitingSince_;
};

// Puts a communicator in (and takes it out of) the list the status report walks. The first listing of the process
// starts the status thread (when LOOM_STATUS_SIGNAL or LOOM_STATUS_FILE asks for one).
class StatusListing {
 public:
  StatusListing() = default;
  ~StatusListing();
  StatusListing(const StatusListing&) = delete;
  StatusListing& operator=(const StatusListing&) = delete;
  // Once `comm` is ready (its name, rank and peers set for good).
  void list(loomComm* comm);

 private:
  loomComm* comm_ = nullptr;
};

// Every listed communicator's state, a line each; what SIGUSR1 logs.
std::string statusReport();

}  // namespace loom
