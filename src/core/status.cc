// The status report (status.h): the list of communicators, the SIGUSR1 handler, and the thread that logs.
#include "src/core/status.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "src/base/log.h"
#include "src/base/params.h"
#include "src/core/comm.h"
#include "src/core/enqueue.h"

namespace loom {
namespace {

// The listed communicators. Never freed: the status thread may still look at it while the process exits.
struct Registry {
  std::mutex mutex;
  std::vector<loomComm*> comms;
};
Registry& registry() {
  static Registry* made = new Registry;
  return *made;
}

int gWakeFd = -1;  // the write end of the status thread's pipe: what SIGUSR1 writes to

void onStatusSignal(int) {
  int saved = errno;
  char byte = 's';
  if (gWakeFd >= 0) (void)!write(gWakeFd, &byte, 1);
  errno = saved;
}

struct timespec modifiedAt(const std::string& path, bool* exists) {
  struct stat info {};
  *exists = !path.empty() && ::stat(path.c_str(), &info) == 0;
  return *exists ? info.st_mtim : timespec{0, 0};
}

// Wakes on SIGUSR1 (through the pipe) and once a second to look at LOOM_STATUS_FILE, whose change of modification
// time (creation included) asks for a report.
void statusThread(int readFd, std::string file) {
  bool existed = false;
  timespec last = modifiedAt(file, &existed);
  for (;;) {
    pollfd wake{readFd, POLLIN, 0};
    int ready = poll(&wake, 1, file.empty() ? -1 : 1000);  // without a file, only SIGUSR1 wakes it
    bool report = false;
    if (ready > 0) {
      char drained[64];
      while (read(readFd, drained, sizeof(drained)) > 0) {
      }
      report = true;
    }
    bool exists = false;
    timespec now = modifiedAt(file, &exists);
    if (exists && (!existed || now.tv_sec != last.tv_sec || now.tv_nsec != last.tv_nsec)) report = true;
    existed = exists;
    last = now;
    if (report) {
      std::string text = statusReport();
      LOOM_WARN(COLL, "status of this process's communicators (SIGUSR1 or LOOM_STATUS_FILE):\n%s", text.c_str());
    }
  }
}

// Once per process: the SIGUSR1 handler where LOOM_STATUS_SIGNAL allows it and the application has none, and the
// thread, where either trigger is on.
void startStatusThread() {
  std::string file = params::statusFile();
  bool signal = params::statusSignal() != 0;
  if (signal) {
    struct sigaction current {};
    signal =
        sigaction(SIGUSR1, nullptr, &current) == 0 && current.sa_handler == SIG_DFL && !(current.sa_flags & SA_SIGINFO);
  }
  if (!signal && file.empty()) return;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    LOOM_WARN(INIT, "status reports are off: pipe2: %s", strerror(errno));
    return;
  }
  gWakeFd = fds[1];
  std::thread(statusThread, fds[0], file).detach();
  if (signal) {
    struct sigaction action {};
    action.sa_handler = onStatusSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  }
}

}  // namespace

void CommStatus::begin(uint8_t collective, size_t count, loomDataType_t datatype, loomRedOp_t op, int root) {
  collective_.store(collective, std::memory_order_relaxed);
  count_.store(count, std::memory_order_relaxed);
  datatype_.store(static_cast<uint8_t>(datatype), std::memory_order_relaxed);
  op_.store(static_cast<uint8_t>(op), std::memory_order_relaxed);
  root_.store(root, std::memory_order_relaxed);
  started_.fetch_add(1, std::memory_order_release);
}

void CommStatus::waiting(const std::string& what, Clock::time_point since) {
  std::lock_guard<std::mutex> lock(mutex_);
  waitingCall_ = started_.load(std::memory_order_relaxed);
  waitingFor_ = what;
  waitingSince_ = since;
}

std::string CommStatus::describe() const {
  uint64_t started = started_.load(std::memory_order_acquire), finished = finished_.load(std::memory_order_relaxed);
  std::string text = std::to_string(started) + " calls started, " + std::to_string(finished) + " finished";
  if (started == finished) return text + "; no call running";
  text += "; running " + describeCall(static_cast<Collective>(collective_.load(std::memory_order_relaxed)),
                                      count_.load(std::memory_order_relaxed),
                                      static_cast<loomDataType_t>(datatype_.load(std::memory_order_relaxed)),
                                      static_cast<loomRedOp_t>(op_.load(std::memory_order_relaxed)),
                                      root_.load(std::memory_order_relaxed));
  std::lock_guard<std::mutex> lock(mutex_);
  if (waitingCall_ != started) return text + ", no long wait so far";
  double seconds = std::chrono::duration<double>(Clock::now() - waitingSince_).count();
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f s", seconds);
  return text + ", waiting " + waited + " for " + waitingFor_;
}

void StatusListing::list(loomComm* comm) {
  static std::once_flag started;
  std::call_once(started, startStatusThread);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  comm_ = comm;
  r.comms.push_back(comm);
}

StatusListing::~StatusListing() {
  if (comm_ == nullptr) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.comms.erase(std::remove(r.comms.begin(), r.comms.end(), comm_), r.comms.end());
}

std::string statusReport() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.comms.empty()) return "  no communicator";
  std::string text;
  for (const loomComm* comm : r.comms) {
    char head[160];
    std::snprintf(head, sizeof(head), "  comm \"%s\" (%016llx) rank %d of %d%s: ", comm->settings.name.c_str(),
                  (unsigned long long)comm->commHash, comm->rank, comm->nranks,
                  comm->settings.device == loomDeviceCuda ? " (CUDA)" : "");
    text += (text.empty() ? "" : "\n") + std::string(head) + comm->status.describe();
  }
  return text;
}

}  // namespace loom
