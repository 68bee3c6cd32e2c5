// Socket helpers: addresses, interface choice, listen/accept/connect, exact I/O under a deadline and abort
// flag, the secret handshake, StreamConn and AuthServer. Blocking helpers never block in the kernel: sockets are
// non-blocking and every wait is a poll() of at most kPollSliceMs. No DNS caching, no IPv6 scope guessing.
#include "src/base/socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <thread>

#include "src/base/check.h"
#include "src/base/params.h"
#include "src/base/siphash.h"

namespace loom {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

// ---- Addresses ----

bool splitHostPort(const std::string& text, std::string* host, int* port) {
  size_t colon;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') return false;
    *host = text.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = text.rfind(':');
    if (colon == std::string::npos) return false;
    *host = text.substr(0, colon);
    if (host->find(':') != std::string::npos) return false;  // a bare IPv6 address needs brackets
  }
  std::string digits = text.substr(colon + 1);
  if (host->empty() || digits.empty() || digits.size() > 5) return false;
  int value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  if (value > 65535) return false;
  *port = value;
  return true;
}

loomResult_t resolveAddress(const std::string& text, SocketAddress* out) {
  std::string host;
  int port = 0;
  if (!splitHostPort(text, &host, &port)) {
    return LOOM_FAIL(loomInvalidArgument, BOOT, "address \"%s\" is not of the form host:port or [v6]:port",
                     text.c_str());
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return LOOM_FAIL(loomInvalidArgument, BOOT, "cannot resolve host \"%s\" of address \"%s\": %s", host.c_str(),
                     text.c_str(), gai_strerror(rc));
  }
  std::memcpy(&out->storage, found->ai_addr, found->ai_addrlen);
  out->length = found->ai_addrlen;
  freeaddrinfo(found);
  return loomSuccess;
}

std::string formatAddress(const SocketAddress& address) {
  char host[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address.storage), address.length, host, sizeof(host), service,
                  sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "(unprintable address)";
  }
  if (address.storage.ss_family == AF_INET6) return "[" + std::string(host) + "]:" + service;
  return std::string(host) + ":" + service;
}

loomResult_t localAddress(int fd, SocketAddress* out) {
  out->length = sizeof(out->storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&out->storage), &out->length) != 0) {
    return LOOM_FAIL(loomSystemError, BOOT, "getsockname on socket %d failed: %m", fd);
  }
  return loomSuccess;
}

void setPort(SocketAddress* address, int port) {
  if (address->storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&address->storage)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (address->storage.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&address->storage)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

bool isNumericHost(const std::string& host) {
  in6_addr scratch;
  std::string bare = host.substr(0, host.find('%'));  // drop an IPv6 scope
  return inet_pton(AF_INET, host.c_str(), &scratch) == 1 || inet_pton(AF_INET6, bare.c_str(), &scratch) == 1;
}

bool isLoopback(const SocketAddress& address) {
  if (address.storage.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&address.storage);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address.storage.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    if (IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr) && v6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

SocketAddress wildcardOf(const SocketAddress& address) {
  SocketAddress any;
  if (address.storage.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&any.storage);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_any;
    v6->sin6_port = reinterpret_cast<const sockaddr_in6*>(&address.storage)->sin6_port;
    any.length = sizeof(sockaddr_in6);
  } else {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&any.storage);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_port = reinterpret_cast<const sockaddr_in*>(&address.storage)->sin_port;
    any.length = sizeof(sockaddr_in);
  }
  return any;
}

InterfaceFilter parseInterfaceFilter(const std::string& spec) {
  InterfaceFilter filter;
  std::string rest = spec;
  if (!rest.empty() && rest[0] == '^') {
    filter.exclude = true;
    rest.erase(0, 1);
  }
  if (!rest.empty() && rest[0] == '=') {
    filter.exact = true;
    rest.erase(0, 1);
  }
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    std::string name = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!name.empty()) filter.names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return filter;
}

bool interfaceMatches(const InterfaceFilter& filter, const std::string& name) {
  bool listed = std::any_of(filter.names.begin(), filter.names.end(), [&](const std::string& entry) {
    return filter.exact ? name == entry : name.compare(0, entry.size(), entry) == 0;
  });
  return listed != filter.exclude;
}

std::string interfaceHolding(const std::string& hostPort) {
  std::string host;
  int port = 0;
  if (!splitHostPort(hostPort, &host, &port)) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* it = list; it != nullptr && name.empty(); it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    int family = it->ifa_addr->sa_family;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = family == AF_INET    ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr)
                      : family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr)
                                           : nullptr;
    if (raw != nullptr && inet_ntop(family, raw, text, sizeof(text)) != nullptr && host == text) name = it->ifa_name;
  }
  freeifaddrs(list);
  return name;
}

loomResult_t chooseListenAddress(SocketAddress* out) {
  const std::string spec = params::socketIfname();
  // By default, as NCCL: anything but docker bridges and loopback, unless nothing else is up.
  const InterfaceFilter filter = parseInterfaceFilter(spec.empty() ? "^docker,lo" : spec);
  // Read here for loomGetUniqueId too, before any communicator's init has checked the settings.
  if (const std::string why = params::problem("LOOM_SOCKET_FAMILY"); !why.empty())
    return LOOM_FAIL(loomInvalidArgument, BOOT, "%s", why.c_str());
  const std::string familyName = params::socketFamily();
  int onlyFamily = familyName == "AF_INET" ? AF_INET : familyName == "AF_INET6" ? AF_INET6 : AF_UNSPEC;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return LOOM_FAIL(loomSystemError, BOOT, "getifaddrs failed: %m");
  // Lower score wins: IPv4, then global IPv6, then link-local IPv6 (which needs its scope to be usable); by
  // default, IPv4 only.
  int bestScore = 3;
  std::string seen;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (onlyFamily != AF_UNSPEC && family != onlyFamily) continue;
    if (seen.find(std::string(it->ifa_name) + " ") == std::string::npos) seen += std::string(it->ifa_name) + " ";
    if (!interfaceMatches(filter, it->ifa_name)) continue;
    if (spec.empty() && ((it->ifa_flags & IFF_LOOPBACK) || family != (onlyFamily == AF_INET6 ? AF_INET6 : AF_INET)))
      continue;
    int score = 0;
    if (family == AF_INET6) {
      auto* v6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
      score = IN6_IS_ADDR_LINKLOCAL(&v6->sin6_addr) ? 2 : 1;
    }
    if (score >= bestScore) continue;
    bestScore = score;
    out->length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memset(&out->storage, 0, sizeof(out->storage));
    std::memcpy(&out->storage, it->ifa_addr, out->length);
  }
  freeifaddrs(list);
  if (bestScore < 3) {
    setPort(out, 0);
    return loomSuccess;
  }
  if (!spec.empty()) {
    return LOOM_FAIL(loomInvalidUsage, BOOT,
                     "LOOM_SOCKET_IFNAME=%s matches no interface that is up with an %s address (interfaces: %s)",
                     spec.c_str(), familyName.empty() ? "IP" : familyName.c_str(), seen.empty() ? "none" : seen.c_str());
  }
  std::memset(&out->storage, 0, sizeof(out->storage));
  if (onlyFamily == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&out->storage);
    v6->sin6_family = AF_INET6;
    v6->sin6_addr = in6addr_loopback;
    out->length = sizeof(sockaddr_in6);
    return loomSuccess;
  }
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out->storage);
  v4->sin_family = AF_INET;
  v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  out->length = sizeof(sockaddr_in);
  return loomSuccess;
}

// ---- Listen, accept, connect ----

namespace {

void setNoDelay(int fd) {
  int one = 1;
  // Bootstrap messages are small request/response exchanges: Nagle would add 40 ms to each.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool isRetryableConnectError(int error) {
  return error == ECONNREFUSED || error == ETIMEDOUT || error == ENETUNREACH || error == EHOSTUNREACH ||
         error == ECONNRESET || error == EAGAIN || error == EADDRNOTAVAIL;
}

// Sleeps up to `ms`, but not past the deadline.
void napUntil(const Deadline& deadline, int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, deadline.remainingMs())));
}

int pollSliceMs(const Deadline& deadline) {
  return static_cast<int>(std::min<int64_t>(kPollSliceMs, deadline.remainingMs()));
}

}  // namespace

loomResult_t listenOn(const SocketAddress& address, bool reuseAddress, UniqueFd* out, std::string* boundAddress) {
  std::string wanted = formatAddress(address);
  UniqueFd fd(socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return LOOM_FAIL(loomSystemError, BOOT, "socket() for a listener on %s failed: %m", wanted.c_str());
  int one = 1;
  if (reuseAddress && setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    return LOOM_FAIL(loomSystemError, BOOT, "setting SO_REUSEADDR on the listener for %s failed: %m", wanted.c_str());
  }
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    return LOOM_FAIL(loomSystemError, BOOT, "cannot bind a listener to %s: %m", wanted.c_str());
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    return LOOM_FAIL(loomSystemError, BOOT, "listen() on %s failed: %m", wanted.c_str());
  }
  SocketAddress bound;
  LOOM_CHECK(localAddress(fd.get(), &bound));
  *boundAddress = formatAddress(bound);
  *out = std::move(fd);
  return loomSuccess;
}

loomResult_t acceptOne(int listenFd, UniqueFd* out, std::string* peerName) {
  SocketAddress peer;
  peer.length = sizeof(peer.storage);
  int fd = accept4(listenFd, reinterpret_cast<sockaddr*>(&peer.storage), &peer.length, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    // Nothing pending, or a client that gave up between poll() and accept(): neither is an error.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED || errno == EPROTO) {
      out->reset();
      return loomSuccess;
    }
    return LOOM_FAIL(loomSystemError, BOOT, "accept() on listener socket %d failed: %m", listenFd);
  }
  setNoDelay(fd);
  out->reset(fd);
  *peerName = formatAddress(peer);
  return loomSuccess;
}

loomResult_t connectTo(const std::string& address, bool untilListening, const IoWait& wait, UniqueFd* out) {
  SocketAddress target;
  LOOM_CHECK(resolveAddress(address, &target));
  int64_t napMs = 10;
  int lastError = 0;
  int attempts = 0;
  for (;;) {
    if (wait.aborted())
      return LOOM_FAIL(loomRemoteError, BOOT, "%s: aborted while connecting to %s", wait.operation.c_str(),
                       address.c_str());
    if (attempts > 0 && wait.deadline.expired()) {
      errno = lastError;
      return LOOM_FAIL(loomTimeout, BOOT, "%s: could not connect to %s within %lld ms (%d attempts, last: %m)",
                       wait.operation.c_str(), address.c_str(), (long long)wait.deadline.timeoutMs(), attempts);
    }
    ++attempts;
    UniqueFd fd(socket(target.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return LOOM_FAIL(loomSystemError, BOOT, "%s: socket() failed: %m", wait.operation.c_str());
    int rc = connect(fd.get(), reinterpret_cast<const sockaddr*>(&target.storage), target.length);
    int error = rc == 0 ? 0 : errno;
    // A non-blocking connect finishes in the background; wait for it in slices so the abort flag is seen.
    while (error == EINPROGRESS || error == EINTR) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      int ready = poll(&pfd, 1, pollSliceMs(wait.deadline));
      if (ready > 0) {
        socklen_t len = sizeof(error);
        if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      } else if (ready < 0 && errno != EINTR) {
        error = errno;
      } else if (wait.aborted() || wait.deadline.expired()) {
        error = ETIMEDOUT;
      }
    }
    if (error == 0) {
      setNoDelay(fd.get());
      *out = std::move(fd);
      return loomSuccess;
    }
    if (error == ECONNREFUSED && !untilListening) {
      return LOOM_FAIL(loomRemoteError, BOOT, "%s: %s refused the connection: its listener is closed (has it exited?)",
                       wait.operation.c_str(), address.c_str());
    }
    if (!isRetryableConnectError(error)) {
      errno = error;
      return LOOM_FAIL(loomSystemError, BOOT, "%s: connect to %s failed: %m", wait.operation.c_str(), address.c_str());
    }
    lastError = error;
    napUntil(wait.deadline, napMs);
    napMs = std::min<int64_t>(napMs * 2, 200);
  }
}

// ---- Exact I/O ----

namespace {

struct Transfer {
  int fd;
  uint8_t* data;
  size_t bytes;
  bool isSend;
  const std::string* peer;
  size_t done = 0;
};

enum class IoStatus { kDone, kClosed, kTimedOut, kAborted, kFailed };

bool isResetError(int error) { return error == ECONNRESET || error == EPIPE || error == ENOTCONN; }

// Moves as much as the socket takes now. Returns kDone when it made progress or must wait.
IoStatus step(Transfer* t) {
  while (t->done < t->bytes) {
    ssize_t n = t->isSend ? send(t->fd, t->data + t->done, t->bytes - t->done, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : recv(t->fd, t->data + t->done, t->bytes - t->done, MSG_DONTWAIT);
    if (n > 0) {
      t->done += static_cast<size_t>(n);
    } else if (n == 0 && !t->isSend) {
      return IoStatus::kClosed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return IoStatus::kDone;
    } else {
      return isResetError(errno) ? IoStatus::kClosed : IoStatus::kFailed;
    }
  }
  return IoStatus::kDone;
}

// Runs `count` transfers to completion. On failure *culprit is the transfer that failed (or was still waiting)
// and errno holds the reason for kFailed.
IoStatus runTransfers(Transfer* transfers, int count, const IoWait& wait, Transfer** culprit) {
  for (;;) {
    pollfd pfds[2];
    int waiting = 0;
    for (int i = 0; i < count; ++i) {
      Transfer* t = &transfers[i];
      IoStatus status = step(t);
      if (status != IoStatus::kDone) {
        *culprit = t;
        return status;
      }
      if (t->done < t->bytes) {
        pfds[waiting++] = pollfd{t->fd, static_cast<short>(t->isSend ? POLLOUT : POLLIN), 0};
        *culprit = t;
      }
    }
    if (waiting == 0) return IoStatus::kDone;
    if (wait.aborted()) return IoStatus::kAborted;
    if (wait.deadline.expired()) return IoStatus::kTimedOut;
    if (poll(pfds, waiting, pollSliceMs(wait.deadline)) < 0 && errno != EINTR) {
      return IoStatus::kFailed;
    }
  }
}

loomResult_t reportTransfer(IoStatus status, const Transfer& t, const IoWait& wait) {
  const char* op = wait.operation.c_str();
  const char* peer = t.peer->c_str();
  const char* verb = t.isSend ? "sending to" : "receiving from";
  switch (status) {
    case IoStatus::kDone:
      return loomSuccess;
    case IoStatus::kClosed:
      return LOOM_FAIL(loomRemoteError, BOOT, "%s: %s closed the connection (%zu of %zu bytes %s)", op, peer, t.done,
                       t.bytes, t.isSend ? "sent" : "received");
    case IoStatus::kTimedOut:
      return LOOM_FAIL(loomTimeout, BOOT, "%s: timed out after %lld ms %s %s (%zu of %zu bytes done)", op,
                       (long long)wait.deadline.timeoutMs(), verb, peer, t.done, t.bytes);
    case IoStatus::kAborted:
      return LOOM_FAIL(loomRemoteError, BOOT, "%s: aborted while %s %s", op, verb, peer);
    case IoStatus::kFailed:
      break;
  }
  return LOOM_FAIL(loomSystemError, BOOT, "%s: %s %s failed: %m", op, verb, peer);
}

}  // namespace

loomResult_t readExact(int fd, void* data, size_t bytes, const std::string& peer, const IoWait& wait) {
  Transfer t{fd, static_cast<uint8_t*>(data), bytes, false, &peer};
  Transfer* culprit = &t;
  return reportTransfer(runTransfers(&t, 1, wait, &culprit), *culprit, wait);
}

loomResult_t writeExact(int fd, const void* data, size_t bytes, const std::string& peer, const IoWait& wait) {
  Transfer t{fd, const_cast<uint8_t*>(static_cast<const uint8_t*>(data)), bytes, true, &peer};
  Transfer* culprit = &t;
  return reportTransfer(runTransfers(&t, 1, wait, &culprit), *culprit, wait);
}

loomResult_t exchange(int sendFd, const void* sendData, size_t sendBytes, const std::string& sendPeer, int recvFd,
                      void* recvData, size_t recvBytes, const std::string& recvPeer, const IoWait& wait) {
  Transfer t[2] = {{sendFd, const_cast<uint8_t*>(static_cast<const uint8_t*>(sendData)), sendBytes, true, &sendPeer},
                   {recvFd, static_cast<uint8_t*>(recvData), recvBytes, false, &recvPeer}};
  Transfer* culprit = &t[0];
  return reportTransfer(runTransfers(t, 2, wait, &culprit), *culprit, wait);
}

// ---- The handshake ----

loomResult_t randomBytes(void* out, size_t bytes) {
  uint8_t* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    ssize_t n = getrandom(p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return LOOM_FAIL(loomSystemError, BOOT, "getrandom() failed: %m");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return loomSuccess;
}

void authTag(const uint8_t* secret, const uint8_t* nonce, uint8_t role, uint8_t tag[kAuthTagBytes]) {
  uint8_t message[kNonceBytes + 1];
  std::memcpy(message, nonce, kNonceBytes);
  message[kNonceBytes] = role;
  uint64_t hash = sipHash24(secret, message, sizeof(message));
  for (size_t i = 0; i < kAuthTagBytes; ++i) tag[i] = static_cast<uint8_t>(hash >> (8 * i));
}

bool checkAuthAnswer(const uint8_t* secret, const uint8_t* challenge, AuthRole role, const uint8_t* answer,
                     uint8_t proof[kAuthTagBytes]) {
  uint8_t expected[kAuthTagBytes];
  authTag(secret, challenge, static_cast<uint8_t>(role), expected);
  if (!timingSafeEqual(expected, answer, kAuthTagBytes)) return false;
  authTag(secret, answer + kAuthTagBytes, static_cast<uint8_t>(role) | 0x80, proof);
  return true;
}

loomResult_t authenticateToAcceptor(int fd, const uint8_t* secret, AuthRole role, const std::string& peer,
                                    const IoWait& wait) {
  uint8_t challenge[kNonceBytes];
  LOOM_CHECK(readExact(fd, challenge, sizeof(challenge), peer, wait));
  uint8_t answer[kAuthAnswerBytes];
  authTag(secret, challenge, static_cast<uint8_t>(role), answer);
  LOOM_CHECK(randomBytes(answer + kAuthTagBytes, kNonceBytes));
  LOOM_CHECK(writeExact(fd, answer, sizeof(answer), peer, wait));
  uint8_t proof[kAuthTagBytes];
  uint8_t expected[kAuthTagBytes];
  authTag(secret, answer + kAuthTagBytes, static_cast<uint8_t>(role) | 0x80, expected);
  Transfer t{fd, proof, sizeof(proof), false, &peer};
  Transfer* culprit = &t;
  IoStatus status = runTransfers(&t, 1, wait, &culprit);
  if (status == IoStatus::kClosed) {
    // An acceptor drops a connection whose answer is wrong without saying why; this is the likely reason.
    return LOOM_FAIL(loomRemoteError, BOOT,
                     "%s: %s rejected our answer to its challenge: it holds another secret (a unique id from "
                     "another run?) or expects another kind of connection",
                     wait.operation.c_str(), peer.c_str());
  }
  LOOM_CHECK(reportTransfer(status, t, wait));
  if (!timingSafeEqual(proof, expected, sizeof(proof))) {
    return LOOM_FAIL(loomRemoteError, BOOT, "%s: %s sent a wrong proof: it does not know this communicator's secret",
                     wait.operation.c_str(), peer.c_str());
  }
  return loomSuccess;
}

// ---- StreamConn ----

void StreamConn::expect(size_t bytes) {
  input_.assign(bytes, 0);
  received_ = 0;
}

void StreamConn::queue(const void* data, size_t bytes) {
  if (sent_ == output_.size()) {
    output_.clear();
    sent_ = 0;
  }
  const uint8_t* p = static_cast<const uint8_t*>(data);
  output_.insert(output_.end(), p, p + bytes);
}

short StreamConn::pollEvents() const {
  short events = 0;
  if (!inputComplete()) events |= POLLIN;
  if (outputPending()) events |= POLLOUT;
  return events;
}

StreamConn::Progress StreamConn::readSome() {
  Transfer t{fd_.get(), input_.data(), input_.size(), false, &peerName_};
  t.done = received_;
  IoStatus status = step(&t);
  Progress progress = t.done > received_ ? Progress::kSome : Progress::kNone;
  received_ = t.done;
  if (status == IoStatus::kClosed) return Progress::kClosed;
  if (status == IoStatus::kFailed) return Progress::kFailed;
  return progress;
}

StreamConn::Progress StreamConn::writeSome() {
  Transfer t{fd_.get(), output_.data(), output_.size(), true, &peerName_};
  t.done = sent_;
  IoStatus status = step(&t);
  Progress progress = t.done > sent_ ? Progress::kSome : Progress::kNone;
  sent_ = t.done;
  if (status == IoStatus::kClosed) return Progress::kClosed;
  if (status == IoStatus::kFailed) return Progress::kFailed;
  return progress;
}

// ---- AuthServer ----

namespace {
// Unauthenticated connections one server holds at once; more are closed on arrival so that a flood cannot
// exhaust the process's file descriptors.
constexpr size_t kMaxPendingConns = 256;
}  // namespace

AuthServer::AuthServer(UniqueFd listener, const uint8_t* secret, AuthRole role, std::string name)
    : listener_(std::move(listener)),
      role_(role),
      name_(std::move(name)),
      handshakeMs_(std::max<int64_t>(1, params::bootstrapTimeoutMs())) {
  std::memcpy(secret_, secret, kAuthSecretBytes);
}

void AuthServer::onEof(Conn& conn) { drop(conn, "it closed the connection during %s", describeStage(conn)); }

const char* AuthServer::describeStage(const Conn& conn) const {
  return conn.stage == kStageAuth ? "the challenge" : "a message";
}

void AuthServer::retire(Conn& conn) {
  if (conn.dead) return;
  conn.dead = true;
  onGone(conn);
}

void AuthServer::drop(Conn& conn, const char* fmt, ...) {
  char why[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(why, sizeof(why), fmt, args);
  va_end(args);
  std::string who = conn.io.peerName();
  if (conn.rank >= 0) who += " (rank " + std::to_string(conn.rank) + ")";
  LOOM_WARN(BOOT, "%s: dropping the connection from %s: %s", name_.c_str(), who.c_str(), why);
  retire(conn);
}

void AuthServer::serveOnce(int timeoutMs, int wakeFd, bool* woken) {
  Clock::time_point now = Clock::now();
  Clock::time_point wakeAt = now + std::chrono::milliseconds(timeoutMs);
  std::vector<pollfd> pfds;
  if (wakeFd >= 0) pfds.push_back({wakeFd, POLLIN, 0});
  const bool pollListener = listener_.valid() && now >= listenPausedUntil_;
  if (pollListener) pfds.push_back({listener_.get(), POLLIN, 0});
  const size_t firstConn = pfds.size();
  const size_t connCount = conns_.size();
  for (auto& conn : conns_) {
    short events = static_cast<short>((conn->reading ? POLLIN : 0) | (conn->io.outputPending() ? POLLOUT : 0));
    pfds.push_back({conn->io.fd(), events, 0});
    wakeAt = std::min(wakeAt, conn->deadline);
  }
  auto waitMs = std::chrono::duration_cast<std::chrono::milliseconds>(wakeAt - now).count();
  int ready = poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<int64_t>(waitMs + 1, 0, timeoutMs)));
  if (ready < 0 && errno != EINTR) {
    LOOM_WARN(BOOT, "%s: poll() failed: %m", name_.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (ready > 0) {
    if (wakeFd >= 0 && pfds[0].revents != 0) *woken = true;
    for (size_t i = 0; i < connCount; ++i) {
      if (pfds[firstConn + i].revents != 0) serve(*conns_[i], pfds[firstConn + i].revents);
    }
    // Accepted last: new connections are appended to conns_, past the ones polled this round.
    if (pollListener && pfds[firstConn - 1].revents != 0) acceptPending();
  }
  now = Clock::now();
  for (auto& conn : conns_) {
    if (!conn->dead && now >= conn->deadline) {
      drop(*conn, "%s took longer than %lld ms", describeStage(*conn), (long long)handshakeMs_);
    }
  }
  std::erase_if(conns_, [](const std::unique_ptr<Conn>& conn) { return conn->dead; });
}

void AuthServer::acceptPending() {
  for (;;) {
    UniqueFd fd;
    std::string peer;
    if (acceptOne(listener_.get(), &fd, &peer) != loomSuccess) {
      // Out of descriptors: stop listening for a moment instead of spinning on a readable listener.
      listenPausedUntil_ = Clock::now() + std::chrono::milliseconds(kPollSliceMs);
      onAcceptFailed(threadLastError());
      return;
    }
    if (!fd.valid()) return;
    size_t pending = std::count_if(conns_.begin(), conns_.end(),
                                   [](const std::unique_ptr<Conn>& c) { return c->stage == kStageAuth; });
    if (pending >= kMaxPendingConns) {
      LOOM_WARN(BOOT, "%s: refusing the connection from %s: %zu connections are already mid-handshake", name_.c_str(),
                peer.c_str(), pending);
      continue;
    }
    auto conn = std::make_unique<Conn>(StreamConn(std::move(fd), peer));
    if (randomBytes(conn->challenge, kNonceBytes) != loomSuccess) continue;
    conn->io.queue(conn->challenge, kNonceBytes);
    conn->deadline = Clock::now() + std::chrono::milliseconds(handshakeMs_);
    expectInput(*conn, kAuthAnswerBytes);
    flush(*conn);
    conns_.push_back(std::move(conn));
  }
}

void AuthServer::serve(Conn& conn, short revents) {
  if (conn.dead) return;
  if ((revents & (POLLOUT | POLLERR | POLLHUP)) && conn.io.outputPending()) flush(conn);
  if (conn.dead) return;
  if (conn.reading && (revents & (POLLIN | POLLERR | POLLHUP))) {
    pump(conn);
  } else if ((revents & (POLLERR | POLLHUP)) && !conn.io.outputPending()) {
    retire(conn);  // not reading and nothing to send: without this, a hung-up socket would wake poll() forever
  }
}

void AuthServer::flush(Conn& conn) {
  StreamConn::Progress progress = conn.io.writeSome();
  if (progress == StreamConn::Progress::kClosed) return drop(conn, "it closed the connection before our reply");
  if (progress == StreamConn::Progress::kFailed) return drop(conn, "sending failed: %m");
  if (conn.closeWhenFlushed && !conn.io.outputPending()) conn.dead = true;
}

// Reads what has arrived and handles each completed input, until the socket has nothing more.
void AuthServer::pump(Conn& conn) {
  while (!conn.dead && conn.reading) {
    StreamConn::Progress progress = conn.io.readSome();
    if (conn.io.inputComplete()) {
      conn.reading = false;
      handle(conn);
      continue;
    }
    if (progress == StreamConn::Progress::kClosed) onEof(conn);
    if (progress == StreamConn::Progress::kFailed) drop(conn, "reading failed: %m");
    if (progress != StreamConn::Progress::kSome) break;
  }
  if (!conn.dead && conn.io.outputPending()) flush(conn);
}

void AuthServer::handle(Conn& conn) {
  if (conn.stage != kStageAuth) return onMessage(conn);
  uint8_t proof[kAuthTagBytes];
  if (!checkAuthAnswer(secret_, conn.challenge, role_, conn.io.input().data(), proof)) {
    return drop(conn,
                "wrong answer to the challenge: it does not know this communicator's secret (or it answered "
                "for another kind of connection)");
  }
  conn.io.queue(proof, sizeof(proof));
  onAuthenticated(conn);
}

}  // namespace loom
