// PeerWatch (see peer_watch.h).
#include "src/core/peer_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// A process's state letter from /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...; 0 when it is not there), and for a
// zombie its exit status as waitpid reports it (field 52, Linux 3.5 on; -1 when not read).
char procState(int pid, int* exitCode) {
  *exitCode = -1;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) return 0;
  char text[1024];
  size_t got = std::fread(text, 1, sizeof(text) - 1, file);
  std::fclose(file);
  text[got] = '\0';
  // The command name (field 2) may hold spaces and parentheses: the fields after it start past the last ')'.
  const char* end = std::strrchr(text, ')');
  if (end == nullptr || end[1] == '\0' || end[2] == '\0') return 0;
  const char state = end[2];
  if (state == 'Z') {
    const char* field = end + 2;  // field 3
    for (int index = 3; index < 52 && field != nullptr; ++index) {
      field = std::strchr(field, ' ');
      if (field != nullptr) ++field;
    }
    if (field != nullptr) *exitCode = std::atoi(field);
  }
  return state;
}

bool processGone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  int exitCode = -1;
  char state = procState(pid, &exitCode);
  return state == 0 || state == 'Z' || state == 'X';
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

PeerWatch::State PeerWatch::state(int rank, int* detail) const {
  *detail = 0;
  for (const Watched& w : watched_) {
    if (w.rank != rank) continue;
    int exitCode = -1;
    char letter = procState(w.pid, &exitCode);
    if (letter == 'T' || letter == 't') return State::kStopped;
    if (letter != 0 && letter != 'Z' && letter != 'X') return State::kRunning;
    if (exitCode < 0) return State::kGone;
    if (WIFSIGNALED(exitCode)) {
      *detail = WTERMSIG(exitCode);
      return State::kKilled;
    }
    *detail = WEXITSTATUS(exitCode);
    return State::kExited;
  }
  return State::kRunning;
}

}  // namespace loom
