// PeerWatch (see peer_watch.h).
#include "src/core/peer_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace loom {
namespace {

int openPidfd(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

bool processGone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) return true;
  char state = '?';
  int scanned = std::fscanf(file, "%*d %*s %c", &state);
  std::fclose(file);
  return scanned == 1 && (state == 'Z' || state == 'X');
}

}  // namespace

PeerWatch::~PeerWatch() {
  for (const Watched& w : watched_)
    if (w.pidfd >= 0) close(w.pidfd);
}

void PeerWatch::add(int rank, int pid) {
  if (pid == getpid()) return;
  watched_.push_back({rank, pid, openPidfd(pid)});
}

int PeerWatch::firstDead(const std::function<bool(int)>& among) const {
  for (const Watched& w : watched_) {
    if (among && !among(w.rank)) continue;
    if (w.pidfd >= 0) {
      pollfd fd{w.pidfd, POLLIN, 0};
      if (poll(&fd, 1, 0) > 0) return w.rank;
    } else if (processGone(w.pid)) {
      return w.rank;
    }
  }
  return -1;
}

}  // namespace loom
