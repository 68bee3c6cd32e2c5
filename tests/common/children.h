// Ranks as forked children, for the tests and tools that kill, stop or lose them (tests/mp/failure_test.cc,
// tests/faults/): a child runs a function and leaves with _exit, never returning into its parent's code; it dies
// with its parent (PR_SET_PDEATHSIG) and after kChildAlarmSeconds in any case. The parent bounds every wait with a
// deadline and reaps every child on every path (Children's destructor kills and reaps whatever is left). Fork the
// children before calling loomGetUniqueId and give them the id over their pipe: forking after it would copy a
// process whose bootstrap root thread may hold a lock (seen as a hang under ASan, whose allocator lock a child
// inherited).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"

namespace loomtest {

using Clock = std::chrono::steady_clock;

inline constexpr int kChildAlarmSeconds = 60;  // a child still alive then is killed by SIGALRM
inline constexpr int kInitFailed = 100;        // exit code 100 + loomResult_t: init failed
inline constexpr int kChildCheckFailed = 120;  // the child's own check failed (wrong data, wrong rank, ...)

inline double secondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// A child's two pipes: its words to the parent ("R" once it is ready, then any message), and the parent's to it.
struct ChildPipes {
  int toParent;
  int fromParent;
};

// A child's words to the parent, over its pipe: "R" once it is ready, then any message.
inline void tell(int toParent, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(toParent, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

inline std::string describeStatus(int status) {
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    std::string text = "exit " + std::to_string(code);
    if (code < loomNumResults) text += std::string(" (") + loomGetErrorString(static_cast<loomResult_t>(code)) + ")";
    if (code >= kInitFailed && code < kInitFailed + loomNumResults) text += " (init failed)";
    if (code == kChildCheckFailed) text += " (the child's check failed)";
    return text;
  }
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

class Children {
 public:
  struct Child {
    pid_t pid = -1;
    int fromChild = -1;  // read end of the child's pipe
    int toChild = -1;    // write end of the parent's pipe to the child
    bool reaped = false;
    int status = 0;
    Clock::time_point endedAt;
    std::string said;
  };

  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    killAll();
    for (Child& child : children_) {
      if (child.fromChild >= 0) close(child.fromChild);
      if (child.toChild >= 0) close(child.toChild);
    }
  }

  // Forks a child that runs body(its pipes) and leaves with _exit(the value body returns).
  bool spawn(const std::function<int(const ChildPipes&)>& body) {
    int fds[2], down[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    if (pipe2(down, O_CLOEXEC) != 0) {
      close(fds[0]);
      close(fds[1]);
      return false;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      for (int fd : {fds[0], fds[1], down[0], down[1]}) close(fd);
      return false;
    }
    if (pid == 0) {
      close(fds[0]);
      close(down[1]);
      for (const Child& earlier : children_) close(earlier.toChild);  // an earlier child sees EOF when we die
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(kChildCheckFailed);
      alarm(kChildAlarmSeconds);
      int code = kChildCheckFailed;
      try {
        code = body(ChildPipes{fds[1], down[0]});
      } catch (...) {
      }
      _exit(code);
    }
    close(fds[1]);
    close(down[0]);
    Child child;
    child.pid = pid;
    child.fromChild = fds[0];
    child.toChild = down[1];
    children_.push_back(child);
    return true;
  }

  size_t size() const { return children_.size(); }

  // Writes `bytes` to every child's pipe (they are far below a pipe's capacity, so this does not block).
  bool sendToAll(const void* data, size_t bytes) {
    for (const Child& child : children_)
      if (write(child.toChild, data, bytes) != static_cast<ssize_t>(bytes)) return false;
    return true;
  }
  const Child& operator[](size_t i) const { return children_[i]; }

  // Reads each child's first byte, which must be 'R', within `seconds`. False when one said something else,
  // exited first or the time ran out.
  bool waitReady(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (Child& child : children_) {
      char mark = 0;
      for (;;) {
        int left =
            static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
        if (left <= 0) return false;
        pollfd fd{child.fromChild, POLLIN, 0};
        int ready = poll(&fd, 1, left);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return false;
        ssize_t n = read(child.fromChild, &mark, 1);
        if (n == 1) break;
        if (n < 0 && errno == EINTR) continue;
        return false;  // EOF: the child is gone
      }
      if (mark != 'R') {
        child.said.push_back(mark);
        return false;
      }
    }
    return true;
  }

  // Whether child `i` is still running (not exited, killed or reaped); one that ended is reaped here.
  bool running(size_t i) {
    Child& child = children_[i];
    if (child.reaped) return false;
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) != child.pid) return true;
    child.reaped = true;
    child.status = status;
    child.endedAt = Clock::now();
    drain(child);
    return false;
  }

  void signal(size_t i, int sig) {
    if (!children_[i].reaped) kill(children_[i].pid, sig);
  }

  // Reaps children as they exit, noting when; true when all are reaped within `seconds`. Otherwise the rest are
  // killed and reaped, and false comes back.
  // `except` (an index, or -1): a child not waited for (a stopped one), though killed with the rest on a timeout.
  bool waitAll(double seconds, int except = -1) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      bool allReaped = true;
      for (Child& child : children_) {
        if (child.reaped || &child - children_.data() == except) continue;
        int status = 0;
        pid_t done = waitpid(child.pid, &status, WNOHANG);
        if (done == child.pid) {
          child.reaped = true;
          child.status = status;
          child.endedAt = Clock::now();
          drain(child);
        } else {
          allReaped = false;
        }
      }
      if (allReaped) return true;
      if (Clock::now() >= deadline) {
        killAll();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // What every child ended with and said: for failure messages.
  std::string report() const {
    std::string text;
    for (size_t i = 0; i < children_.size(); ++i) {
      const Child& child = children_[i];
      text += "\n  child " + std::to_string(i) + " (pid " + std::to_string(child.pid) +
              "): " + (child.reaped ? describeStatus(child.status) : std::string("not reaped"));
      if (!child.said.empty()) text += ": \"" + child.said + "\"";
    }
    return text;
  }

 private:
  void killAll() {
    for (Child& child : children_) {
      if (child.reaped) continue;
      kill(child.pid, SIGKILL);
      int status = 0;
      while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
      child.reaped = true;
      child.status = status;
      child.endedAt = Clock::now();
      drain(child);
    }
  }

  // Appends what is left in a reaped child's pipe (the write end is closed, so this ends).
  static void drain(Child& child) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(child.fromChild, buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR))
      if (n > 0) child.said.append(buffer, static_cast<size_t>(n));
  }

  std::vector<Child> children_;
};

// A private LOOM_SHM_DIR (a directory in /dev/shm) for the children: whatever loom leaves is found there,
// unaffected by other loom jobs on the machine. Removed, with anything in it, at the end.
class ShmDir {
 public:
  ShmDir() {
    char name[] = "/dev/shm/loomtest-children-XXXXXX";
    if (mkdtemp(name) != nullptr) path_ = name;
  }
  ~ShmDir() {
    for (const std::string& entry : entries()) unlink((path_ + "/" + entry).c_str());
    if (!path_.empty()) rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    if (DIR* dir = opendir(path_.c_str())) {
      while (dirent* entry = readdir(dir))
        if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..") names.push_back(entry->d_name);
      closedir(dir);
    }
    return names;
  }

 private:
  std::string path_;
};

inline std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += " " + name;
  return text;
}

// A child's copy of the unique id the parent sends once every child is forked.
inline bool receiveId(int fromParent, loomUniqueId* id, double seconds = 30) {
  size_t done = 0;
  auto* bytes = reinterpret_cast<char*>(id);
  while (done < sizeof(*id)) {
    pollfd fd{fromParent, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(seconds * 1000)) <= 0) return false;
    ssize_t n = read(fromParent, bytes + done, sizeof(*id) - done);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Removes every launcher variable loomCommInitFromEnv reads, so only what a test sets counts.
inline void clearLauncherEnv() {
  for (const char* name : {"LOOM_RANK",
                           "LOOM_NRANKS",
                           "LOOM_ROOT_ADDR",
                           "LOOM_SECRET",
                           "LOOM_PORT_OFFSET",
                           "RANK",
                           "WORLD_SIZE",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                           "PMIX_NAMESPACE",
                           "PMI_RANK",
                           "PMI_SIZE",
                           "SLURM_PROCID",
                           "SLURM_NTASKS",
                           "SLURM_STEP_NODELIST",
                           "SLURM_JOB_ID",
                           "SLURM_STEP_ID"})
    unsetenv(name);
}

// A TCP port on the loopback interface that nothing listens on at the moment (-1 when none could be had).
inline int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  close(fd);
  return port;
}

}  // namespace loomtest
