// The pieces every wait in loom is built from: a Deadline (LOOM_TIMEOUT_MS or the config's timeoutMs) and a
// Backoff that spins briefly, then yields, then sleeps, so that more ranks than cores still make progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

#include "loom/loom.h"

namespace loom {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static constexpr int64_t kNeverMs = int64_t{100} * 365 * 24 * 3600 * 1000;
  // 0 means already expired; a negative or an enormous value (over a century) means never.
  explicit Deadline(int64_t timeoutMs)
      : end_(timeoutMs < 0 || timeoutMs > kNeverMs ? Clock::time_point::max()
                                                   : Clock::now() + std::chrono::milliseconds(timeoutMs)),
        timeoutMs_(timeoutMs) {}
  bool expired() const { return Clock::now() >= end_; }
  int64_t remainingMs() const {
    if (end_ == Clock::time_point::max()) return INT64_MAX;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return left > 0 ? left : 0;
  }
  int64_t timeoutMs() const { return timeoutMs_; }

 private:
  Clock::time_point end_;
  int64_t timeoutMs_;
};

// What a wait asks each time it finds nothing to do: loomSuccess to go on waiting, or the error that ends the
// wait (deadline passed, communicator aborted, peer dead), its message already recorded.
using WaitCheck = std::function<loomResult_t()>;

// Call pause() each time a poll finds nothing to do, reset() when it made progress.
// Polls to spin before yielding: for a thread with a core of its own, and for one sharing cores with its peers.
// A yield costs about a microsecond and a half on a virtual machine, far more than a message between cores.
constexpr int64_t kSpinPollsDedicated = 1 << 16;
constexpr int64_t kSpinPollsShared = 200;

class Backoff {
 public:
  // Spins LOOM_SPIN_COUNT polls (when set), else kSpinPollsShared, before yielding: for waits off the data path.
  Backoff();
  // Spins `spinPolls` polls before yielding: many where the waiting thread has a core to itself, few where
  // threads outnumber cores and the peer it waits for may need this one.
  explicit Backoff(int64_t spinPolls);
  void pause();
  void reset() { polls_ = 0; }
  // Whether the next pause() only spins; a caller may then skip its costlier checks on most polls.
  bool spinning() const { return polls_ < spinLimit_; }
  int64_t polls() const { return polls_; }

 private:
  int64_t polls_ = 0;
  int64_t spinLimit_;
  int64_t yieldMicros_;
  Clock::time_point waitStart_;
};

}  // namespace loom
