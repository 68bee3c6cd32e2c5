// Watches the processes of a communicator's peers on this host, so that a rank killed in the middle of a call
// becomes an error on every survivor within milliseconds instead of a wait until the deadline. It uses pidfds
// (readable once the process has exited, zombie or not) and falls back to kill(pid, 0) plus /proc state.
#pragma once

#include <functional>
#include <vector>

namespace loom {

class PeerWatch {
 public:
  PeerWatch() = default;
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;
  // Starts watching `pid` as `rank`. Ranks in this very process are never watched (they cannot die alone).
  void add(int rank, int pid);
  // The rank of a watched process that has exited, or -1 when all are alive; with `among`, only the ranks for
  // which it returns true are looked at.
  int firstDead(const std::function<bool(int)>& among = nullptr) const;

  // What this process can see of a watched rank's process (kRunning as well for ranks it does not watch).
  enum class State { kRunning, kStopped, kExited, kKilled, kGone };
  // *detail: the exit status (kExited) or the signal (kKilled), read while the process is a zombie its parent
  // has not reaped; kGone once it has been (how it ended is then not known).
  State state(int rank, int* detail) const;

 private:
  struct Watched {
    int rank;
    int pid;
    int pidfd;  // -1 when pidfd_open is unavailable
  };
  std::vector<Watched> watched_;
};

}  // namespace loom
