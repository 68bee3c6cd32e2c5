// loomrun: the local launcher. `loomrun -n N prog args...` forks N ranks of prog on this machine with the
// environment loomCommInitFromEnv reads (LOOM_RANK, LOOM_NRANKS, LOOM_LOCAL_RANK, LOOM_LOCAL_NRANKS,
// LOOM_ROOT_ADDR, LOOM_SECRET), optionally tags their output lines, and stops the whole job as soon as one
// rank fails, the job runs past --timeout, or loomrun itself is interrupted.
// It does not start ranks on other hosts (use mpirun, srun or torchrun there), forward stdin past rank 0,
// or bind ranks to cores. Linux only: it waits on signals through signalfd.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kMaxRanks = 1024;
constexpr int kUsageExit = 2;
constexpr int kTimeoutExit = 124;  // what coreutils timeout(1) returns
constexpr double kGraceSeconds = 2.0;
constexpr int kReapPollMs = 1000;  // the longest loomrun sleeps without checking on its ranks
constexpr size_t kMaxPendingLine = 64 * 1024;  // longer lines are passed on in pieces

const char kUsage[] =
    "usage: loomrun -n N [--tag-output] [--timeout S] [--] prog [args...]\n"
    "Runs N ranks of prog on this machine for loomCommInitFromEnv.\n"
    "  -n, -np N       number of ranks, 1..1024\n"
    "  --tag-output    prefix each line a rank prints with \"[rank] \"\n"
    "  --timeout S     stop the job and exit 124 when it runs longer than S seconds\n"
    "  -h, --help      this text\n"
    "Each rank gets LOOM_RANK, LOOM_NRANKS, LOOM_LOCAL_RANK, LOOM_LOCAL_NRANKS, LOOM_ROOT_ADDR and LOOM_SECRET.\n"
    "When a rank exits non-zero or dies by a signal, the others are stopped (SIGTERM, then SIGKILL after 2 s)\n"
    "and loomrun exits with that rank's code (128+signal for a signal).\n";

struct Options {
  int nranks = 0;
  bool tagOutput = false;
  double timeoutSeconds = 0;  // 0: none
  std::vector<char*> command;
};

// One stream of one rank when output is tagged: bytes not yet printed because their line is unfinished.
struct OutputPipe {
  int fd = -1;
  int destination = STDOUT_FILENO;
  std::string pending;
  bool midLine = false;  // a piece of an over-long line was printed without its end
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  OutputPipe out, err;
};

[[noreturn]] void usageError(const std::string& message) {
  fprintf(stderr, "loomrun: %s (see loomrun --help)\n", message.c_str());
  exit(kUsageExit);
}

[[noreturn]] void fatal(const char* what) {
  fprintf(stderr, "loomrun: %s: %s\n", what, strerror(errno));
  exit(1);
}

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

Options parseOptions(int argc, char** argv) {
  Options options;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--") {
      i++;
      break;
    } else if (arg == "-h" || arg == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    } else if (arg == "-n" || arg == "-np") {
      std::string text = value();
      char* end = nullptr;
      long n = strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 1 || n > kMaxRanks) {
        usageError("-n needs a number of ranks between 1 and " + std::to_string(kMaxRanks) + ", got '" + text + "'");
      }
      options.nranks = static_cast<int>(n);
    } else if (arg == "--tag-output") {
      options.tagOutput = true;
    } else if (arg == "--timeout") {
      std::string text = value();
      char* end = nullptr;
      double seconds = strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !(seconds > 0) || seconds > 1e9) {
        usageError("--timeout needs a positive number of seconds, got '" + text + "'");
      }
      options.timeoutSeconds = seconds;
    } else {
      usageError("unknown option '" + arg + "'");
    }
  }
  if (options.nranks == 0) usageError("-n N is required");
  if (i >= argc) usageError("no program to run");
  options.command.assign(argv + i, argv + argc);
  options.command.push_back(nullptr);
  return options;
}

// Rank 0's library listens on this port. Between our close and its bind another program could take the port;
// the window is short and rank 0 then fails with a clear bind error, so no reservation protocol is worth it.
int pickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fatal("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) fatal("bind 127.0.0.1:0");
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) fatal("getsockname");
  close(fd);
  return ntohs(addr.sin_port);
}

std::string randomSecret() {
  unsigned char bytes[16];
  for (size_t got = 0; got < sizeof(bytes);) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno != EINTR) fatal("getrandom");
    if (n > 0) got += n;
  }
  std::string hex;
  for (unsigned char b : bytes) {
    static const char kDigits[] = "0123456789abcdef";
    hex += kDigits[b >> 4];
    hex += kDigits[b & 15];
  }
  return hex;
}

void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our reader went away (EPIPE): the ranks' output is dropped, the job goes on
    data += n;
    size -= n;
  }
}

// Prints whole lines of `pipe` with the rank's tag; with `atEnd`, the unfinished last line too.
void flushLines(OutputPipe& pipe, int rank, bool atEnd) {
  std::string tag = "[" + std::to_string(rank) + "] ";
  size_t start = 0;
  for (size_t newline; (newline = pipe.pending.find('\n', start)) != std::string::npos; start = newline + 1) {
    std::string line = (pipe.midLine ? "" : tag) + pipe.pending.substr(start, newline + 1 - start);
    writeAll(pipe.destination, line.data(), line.size());
    pipe.midLine = false;
  }
  pipe.pending.erase(0, start);
  if (pipe.pending.size() > kMaxPendingLine || (atEnd && !pipe.pending.empty())) {
    std::string piece = (pipe.midLine ? "" : tag) + pipe.pending + (atEnd ? "\n" : "");
    writeAll(pipe.destination, piece.data(), piece.size());
    pipe.pending.clear();
    pipe.midLine = !atEnd;
  }
}

// Reads what `pipe` holds now; closes it at end of file.
void pumpOutput(OutputPipe& pipe, int rank) {
  char buffer[65536];
  for (;;) {
    ssize_t n = read(pipe.fd, buffer, sizeof(buffer));
    if (n > 0) {
      pipe.pending.append(buffer, n);
      flushLines(pipe, rank, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    flushLines(pipe, rank, true);  // end of file (or an error we cannot do better on)
    close(pipe.fd);
    pipe.fd = -1;
    return;
  }
}

void makePipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) fatal("pipe");
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
}

// In the child, between fork and exec: only plain system calls and setenv (loomrun has no threads).
[[noreturn]] void execRank(const Options& options, int rank, const std::string& rootAddr, const std::string& secret,
                           const sigset_t& oldMask, int outFd, int errFd) {
  // A group of its own lets loomrun stop the rank together with any process it started.
  setpgid(0, 0);
  signal(SIGPIPE, SIG_DFL);  // an ignored signal would stay ignored across exec
  sigprocmask(SIG_SETMASK, &oldMask, nullptr);
  if (outFd >= 0 && (dup2(outFd, STDOUT_FILENO) < 0 || dup2(errFd, STDERR_FILENO) < 0)) _exit(127);
  // A rank in a background process group that reads the terminal would be stopped; only rank 0 may read a
  // pipe or file given to loomrun.
  if (rank != 0 || isatty(STDIN_FILENO)) {
    int devNull = open("/dev/null", O_RDONLY);
    if (devNull >= 0) dup2(devNull, STDIN_FILENO);
  }
  setenv("LOOM_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOOM_NRANKS", std::to_string(options.nranks).c_str(), 1);
  setenv("LOOM_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOOM_LOCAL_NRANKS", std::to_string(options.nranks).c_str(), 1);
  setenv("LOOM_ROOT_ADDR", rootAddr.c_str(), 1);
  setenv("LOOM_SECRET", secret.c_str(), 1);
  execvp(options.command[0], options.command.data());
  fprintf(stderr, "loomrun: cannot run '%s': %s\n", options.command[0], strerror(errno));
  _exit(127);
}

void signalRanks(std::vector<Rank>& ranks, int signo) {
  for (size_t rank = 0; rank < ranks.size(); rank++) {
    Rank& r = ranks[rank];
    // ESRCH: the rank's group is gone between its exit and our reaping it; anything else is worth a line.
    if (r.running && kill(-r.pid, signo) != 0 && errno != ESRCH) {
      fprintf(stderr, "loomrun: cannot send signal %d to rank %zu (process group %d): %s\n", signo, rank, r.pid,
              strerror(errno));
    }
  }
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    int signo = WTERMSIG(status);
    return "killed by signal " + std::to_string(signo) + " (" + strsignal(signo) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);

  // Tagged output needs two descriptors per rank; 1024 ranks pass the usual soft limit of 1024.
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }

  // Signals are read from a signalfd in the poll loop, so a child's exit or a Ctrl-C cannot race the loop.
  sigset_t handled, oldMask;
  sigemptyset(&handled);
  for (int signo : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&handled, signo);
  if (sigprocmask(SIG_BLOCK, &handled, &oldMask) != 0) fatal("sigprocmask");
  int signalFd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signalFd < 0) fatal("signalfd");
  signal(SIGPIPE, SIG_IGN);
  signal(SIGCHLD, SIG_DFL);  // inherited SIG_IGN would reap the ranks before we learn how they ended

  const std::string rootAddr = "127.0.0.1:" + std::to_string(pickFreePort());
  const std::string secret = randomSecret();
  std::vector<Rank> ranks(options.nranks);
  fflush(stdout);
  fflush(stderr);
  for (int rank = 0; rank < options.nranks; rank++) {
    int outPipe[2] = {-1, -1}, errPipe[2] = {-1, -1};
    if (options.tagOutput) {
      makePipe(outPipe);
      makePipe(errPipe);
    }
    pid_t pid = fork();
    if (pid < 0) {
      perror("loomrun: fork");
      signalRanks(ranks, SIGKILL);
      return 1;
    }
    if (pid == 0) execRank(options, rank, rootAddr, secret, oldMask, outPipe[1], errPipe[1]);
    setpgid(pid, pid);  // also here, so that a signal sent right after fork reaches the group
    Rank& r = ranks[rank];
    r.pid = pid;
    r.running = true;
    if (options.tagOutput) {
      close(outPipe[1]);
      close(errPipe[1]);
      r.out = OutputPipe{outPipe[0], STDOUT_FILENO, "", false};
      r.err = OutputPipe{errPipe[0], STDERR_FILENO, "", false};
    }
  }

  const double jobDeadline = options.timeoutSeconds > 0 ? nowSeconds() + options.timeoutSeconds : 0;
  double killDeadline = 0;  // when stopping: the time SIGTERM turns into SIGKILL
  bool stopping = false;
  int exitCode = 0;
  int running = options.nranks;
  auto stopJob = [&](int signo, int code) {
    if (stopping) return;
    stopping = true;
    exitCode = code;
    signalRanks(ranks, signo);
    killDeadline = nowSeconds() + kGraceSeconds;
  };

  std::vector<pollfd> fds;
  std::vector<std::pair<OutputPipe*, int>> pipesPolled;  // parallel to fds: the pipe and its rank
  while (running > 0) {
    fds.assign(1, pollfd{signalFd, POLLIN, 0});
    pipesPolled.assign(1, {nullptr, -1});
    for (int rank = 0; rank < options.nranks; rank++) {
      for (OutputPipe* p : {&ranks[rank].out, &ranks[rank].err}) {
        if (p->fd < 0) continue;
        fds.push_back(pollfd{p->fd, POLLIN, 0});
        pipesPolled.push_back({p, rank});
      }
    }
    // Ranks are also reaped at least every second, whatever the signalfd says: a missed wake-up costs a second, not
    // the job.
    double wakeAt = stopping ? killDeadline : jobDeadline;
    int timeoutMs = kReapPollMs;
    if (wakeAt > 0)
      timeoutMs = std::min(kReapPollMs, static_cast<int>(std::max(0.0, (wakeAt - nowSeconds()) * 1000.0)) + 1);
    if (poll(fds.data(), fds.size(), timeoutMs) < 0 && errno != EINTR) fatal("poll");

    for (size_t i = 1; i < fds.size(); i++) {
      if (fds[i].revents != 0) pumpOutput(*pipesPolled[i].first, pipesPolled[i].second);
    }

    signalfd_siginfo info;
    while (read(signalFd, &info, sizeof(info)) == sizeof(info)) {
      int signo = static_cast<int>(info.ssi_signo);
      if (signo == SIGCHLD) continue;  // reaped below
      if (stopping) {
        signalRanks(ranks, SIGKILL);  // a second interrupt: no more grace
      } else {
        fprintf(stderr, "loomrun: got signal %d (%s); passing it to the ranks\n", signo, strsignal(signo));
        stopJob(signo, 128 + signo);
      }
    }

    int status;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      for (size_t rank = 0; rank < ranks.size(); rank++) {
        Rank& r = ranks[rank];
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        running--;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping) {
          fprintf(stderr, "loomrun: rank %zu (pid %d) %s%s\n", rank, pid, describeStatus(status).c_str(),
                  running > 0 ? "; stopping the other ranks" : "");
          stopJob(SIGTERM, WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
        }
      }
    }

    double now = nowSeconds();
    if (!stopping && jobDeadline > 0 && now >= jobDeadline && running > 0) {
      fprintf(stderr, "loomrun: the job ran past its timeout of %g s; stopping %d running rank%s\n",
              options.timeoutSeconds, running, running == 1 ? "" : "s");
      stopJob(SIGTERM, kTimeoutExit);
    } else if (stopping && killDeadline > 0 && now >= killDeadline) {
      signalRanks(ranks, SIGKILL);
      killDeadline = 0;
    }
  }

  // Every rank has exited, so what it wrote is in its pipes; children it left behind are not waited for.
  for (size_t rank = 0; rank < ranks.size(); rank++) {
    for (OutputPipe* p : {&ranks[rank].out, &ranks[rank].err}) {
      if (p->fd < 0) continue;
      pumpOutput(*p, static_cast<int>(rank));
      if (p->fd >= 0) {
        flushLines(*p, static_cast<int>(rank), true);
        close(p->fd);
      }
    }
  }
  return exitCode;
}
