// The ceiling that tcp collectives between two ranks are measured against: the rate TCP moves data each way
// when two processes send to each other and receive from each other at the same time, as the two ranks of an
// AllReduce do. A 2-rank AllReduce moves its buffer once each way per call (half in the reduce-scatter, half in
// the all-gather), so its busbw cannot pass this rate. Two processes (a fork) connect over loopback, or over
// `address` for a listener this program opens there; each repetition both send `bytes` and receive `bytes`
// with one poll() loop each, and the rate is bytes / (the slower process's time). Prints the best and the
// median rate each way in GB/s (1e9 bytes per second).
// Usage: tcp_ceiling [bytes (256M; K, M, G suffixes)] [repetitions (5)] [IPv4 address to listen on (127.0.0.1)]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "perf/cli.h"

namespace {

using Clock = std::chrono::steady_clock;

const char kUsage[] = "usage: tcp_ceiling [bytes > 0, K/M/G suffixes] [repetitions >= 1] [IPv4 address]\n";

// Sends `bytes` from `out` and receives `bytes` into `in` on one socket at once; false on an error.
bool exchange(int fd, const char* out, char* in, size_t bytes) {
  size_t sent = 0, received = 0;
  while (sent < bytes || received < bytes) {
    pollfd pfd{fd, static_cast<short>((sent < bytes ? POLLOUT : 0) | (received < bytes ? POLLIN : 0)), 0};
    if (poll(&pfd, 1, 10000) <= 0) return false;
    if ((pfd.revents & POLLOUT) && sent < bytes) {
      ssize_t n = send(fd, out + sent, std::min<size_t>(bytes - sent, 1 << 20), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) return false;
      if (n > 0) sent += static_cast<size_t>(n);
    }
    if ((pfd.revents & (POLLIN | POLLHUP | POLLERR)) && received < bytes) {
      ssize_t n = recv(fd, in + received, std::min<size_t>(bytes - received, 1 << 20), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return false;
      if (n > 0) received += static_cast<size_t>(n);
    }
  }
  return true;
}

// One side: `repetitions` exchanges, each after a one-byte handshake so both start together; the times in
// seconds go to `times`.
bool run(int fd, size_t bytes, int repetitions, std::vector<double>* times) {
  std::vector<char> out(bytes, 1), in(bytes);
  for (int r = 0; r < repetitions; ++r) {
    char go = 'g';
    if (!exchange(fd, &go, &go, 1)) return false;
    Clock::time_point start = Clock::now();
    if (!exchange(fd, out.data(), in.data(), bytes)) return false;
    times->push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{256} << 20;
  int repetitions = 5;
  const char* address = argc > 3 ? argv[3] : "127.0.0.1";
  sockaddr_in where{};
  where.sin_family = AF_INET;
  try {
    if (argc > 1) bytes = perf::parseSizeArg(argv[1], "bytes");
    if (argc > 2) repetitions = perf::parseIntArg(argv[2], "repetitions", 1, 1000000);
  } catch (const perf::UsageError& error) {
    fprintf(stderr, "tcp_ceiling: %s\n%s", error.what(), kUsage);
    return 2;
  }
  if (argc > 4 || bytes == 0 || inet_pton(AF_INET, address, &where.sin_addr) != 1) {
    fputs(kUsage, stderr);
    return 2;
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t length = sizeof(where);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&where), sizeof(where)) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&where), &length) != 0) {
    fprintf(stderr, "tcp_ceiling: cannot listen on %s: %s\n", address, strerror(errno));
    return 1;
  }
  int one = 1;
  pid_t child = fork();
  if (child == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&where), sizeof(where)) != 0) _exit(1);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<double> ignored;
    _exit(run(fd, bytes, repetitions, &ignored) ? 0 : 1);
  }
  int fd = accept(listener, nullptr, nullptr);
  if (fd < 0) {
    fprintf(stderr, "tcp_ceiling: accept: %s\n", strerror(errno));
    return 1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> times;
  bool ok = run(fd, bytes, repetitions, &times);
  close(fd);
  int status = 0;
  waitpid(child, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "tcp_ceiling: an exchange failed\n");
    return 1;
  }
  std::sort(times.begin(), times.end());
  double best = bytes / times.front() / 1e9, median = bytes / times[times.size() / 2] / 1e9;
  printf("tcp_ceiling: %zu bytes each way over %s, %d repetitions: best %.2f GB/s, median %.2f GB/s each way\n",
         bytes, address, repetitions, best, median);
  return 0;
}
