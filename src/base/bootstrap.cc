// Bootstrap: unique ids, the root rendezvous server, and each rank's ring and point-to-point connections.
//
// Wire format (integers little-endian) after the handshake of socket.h on every connection:
//   rank -> root   u32 length, then u32 kRegister, i32 rank, i32 nranks, listener address bytes
//   root -> rank   u32 length, then u32 kTable, u32 nranks, nranks x (u16 length, address bytes)
//                  or u32 length, then u32 kReject, reason text
//   rank -> rank   u32 kRingConn, kP2pConn or kHandoffConn, i32 from-rank; then on a ring connection raw
//                  allGather blocks, on a p2p connection frames of i32 tag, u32 0, u64 length, payload, on a
//                  handoff connection kHandoffHelloBytes for its new owner, after which it belongs to that owner
// Not here: retrying a failed rank, re-forming a ring, or encrypting anything (the secret authenticates only).
#include "src/base/bootstrap.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "src/base/bootstrap_wire.h"
#include "src/base/check.h"
#include "src/base/params.h"
#include "src/base/siphash.h"
#include "src/base/socket.h"

namespace loom {
namespace {

using namespace bootwire;

static_assert(kSecretBytes == kAuthSecretBytes && kSecretBytes == kSipHashKeyBytes);

// The root exits when no rank has registered for this long (or LOOM_TIMEOUT_MS if longer): by then every rank
// that could still use it has timed out itself, and a leaked listener would only invite strangers.
constexpr int64_t kRootIdleMs = int64_t{10} * 60 * 1000;

// ---- The root ----

// Collects (rank, nranks, listener address) from every rank, answers each with the full table, then exits.
class RootServer : public AuthServer {
 public:
  RootServer(UniqueFd listener, const uint8_t* secret, const std::string& address)
      : AuthServer(std::move(listener), secret, AuthRole::kRoot, "bootstrap root at " + address) {}

  void run() {
    const int64_t idleMs = std::max<int64_t>(kRootIdleMs, params::timeoutMs());
    lastRegistration_ = Clock::now();
    for (;;) {
      bool woken = false;
      serveOnce(kPollSliceMs, -1, &woken);
      if (tablesSent_ && conns_.empty()) {
        LOOM_INFO(BOOT, "%s: all %d ranks have the table; exiting", name_.c_str(), nranks_);
        return;
      }
      if (!tablesSent_ && Clock::now() - lastRegistration_ > std::chrono::milliseconds(idleMs)) {
        LOOM_WARN(BOOT, "%s: giving up after %lld s without a new rank (%d of %d registered); closing", name_.c_str(),
                  (long long)(idleMs / 1000), registered_, nranks_);
        return;
      }
    }
  }

 private:
  enum Stage { kLength = 1, kBody, kRegistered, kSendingTable };

  void onAuthenticated(Conn& conn) override {
    conn.stage = kLength;
    expectInput(conn, 4);
  }

  const char* describeStage(const Conn& conn) const override {
    switch (conn.stage) {
      case kLength:
      case kBody:
        return "its registration";
      case kRegistered:
        return "the wait for the other ranks";
      case kSendingTable:
        return "the sending of the table";
      default:
        return AuthServer::describeStage(conn);
    }
  }

  void onMessage(Conn& conn) override {
    Reader in(conn.io.input());
    if (conn.stage == kLength) {
      uint32_t length = 0;
      in.u32(&length);
      if (length < kRegisterHeaderBytes || length > kMaxRegisterBytes) {
        return drop(conn, "it declared a %u-byte registration; expected %zu to %zu bytes", length, kRegisterHeaderBytes,
                    kMaxRegisterBytes);
      }
      conn.stage = kBody;
      return expectInput(conn, length);
    }
    if (conn.stage == kRegistered) return drop(conn, "it sent data after registering");
    Registration registration;
    bool isRegistration = false;
    const std::string problem = parseRegistration(conn.io.input(), &registration, &isRegistration);
    if (!isRegistration) return drop(conn, "%s", problem.c_str());
    if (!problem.empty()) return reject(conn, "%s", problem.c_str());
    const int r = registration.rank, n = registration.nranks;
    const std::string& address = registration.address;
    if (nranks_ > 0 && n != nranks_) {
      return reject(conn, "rank %d says nranks is %d but the ranks registered so far said %d", r, n, nranks_);
    }
    if (nranks_ > 0 && byRank_[r] != nullptr) {
      return reject(conn, "rank %d is already registered from %s", r, byRank_[r]->io.peerName().c_str());
    }
    if (nranks_ < 0) {
      nranks_ = n;
      byRank_.assign(n, nullptr);
      addresses_.assign(n, std::string());
    }
    byRank_[r] = &conn;
    addresses_[r] = address;
    conn.rank = r;
    conn.stage = kRegistered;
    conn.deadline = Clock::time_point::max();  // it waits for the others; the idle limit bounds that
    expectInput(conn, 1);                      // only to notice it leaving
    ++registered_;
    lastRegistration_ = Clock::now();
    LOOM_INFO(BOOT, "%s: rank %d of %d registered (%d so far), listening at %s", name_.c_str(), r, n, registered_,
              address.c_str());
    if (registered_ == nranks_) sendTables();
  }

  void onGone(Conn& conn) override {
    if (tablesSent_ || conn.stage != kRegistered) return;
    // Its slot is free again, so a restarted rank can still join.
    byRank_[conn.rank] = nullptr;
    if (--registered_ == 0) nranks_ = -1;
  }

  void reject(Conn& conn, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    char why[kMaxRejectBytes];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(why, sizeof(why), fmt, args);
    va_end(args);
    LOOM_WARN(BOOT, "%s: rejecting the registration from %s: %s", name_.c_str(), conn.io.peerName().c_str(), why);
    std::vector<uint8_t> message = encodeReject(why);
    conn.io.queue(message.data(), message.size());
    conn.closeWhenFlushed = true;
    conn.deadline = Clock::now() + std::chrono::milliseconds(handshakeMs_);
  }

  void sendTables() {
    std::vector<uint8_t> message = encodeTable(addresses_);
    tablesSent_ = true;
    listener_.reset();  // the rendezvous is complete: late or stray connections are refused by the kernel
    for (auto& conn : conns_) {
      if (conn->stage != kRegistered) {
        LOOM_INFO(BOOT, "%s: closing the unregistered connection from %s: all ranks are in", name_.c_str(),
                  conn->io.peerName().c_str());
        conn->dead = true;
        continue;
      }
      conn->stage = kSendingTable;
      conn->reading = false;
      conn->io.queue(message.data(), message.size());
      conn->closeWhenFlushed = true;
      conn->deadline = Clock::now() + std::chrono::milliseconds(handshakeMs_);
    }
  }

  int nranks_ = -1;
  int registered_ = 0;
  bool tablesSent_ = false;
  std::vector<Conn*> byRank_;
  std::vector<std::string> addresses_;
  Clock::time_point lastRegistration_;
};

loomResult_t launchRoot(UniqueFd listener, const uint8_t* secret, const std::string& address) {
  auto root = std::make_shared<RootServer>(std::move(listener), secret, address);
  try {
    std::thread([root] { root->run(); }).detach();
  } catch (const std::system_error& error) {
    return LOOM_FAIL(loomSystemError, BOOT, "cannot start the bootstrap root thread for %s: %s", address.c_str(),
                     error.what());
  }
  LOOM_INFO(BOOT, "bootstrap root listening at %s", address.c_str());
  return loomSuccess;
}

// Condition-variable waits are sliced like poll()s, so the abort flag is seen within kPollSliceMs.
std::chrono::milliseconds waitSlice(const Deadline& deadline) {
  return std::chrono::milliseconds(std::min<int64_t>(kPollSliceMs, deadline.remainingMs()));
}

// ---- What a rank's listener thread shares with the calling thread ----

struct Inbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> messages;  // by (peer, tag), FIFO
  std::vector<char> peerGone;  // its p2p connection to us ended: nothing more will come from it
  UniqueFd ringPrev;           // handed over once rank-1 has connected
  // Handoff connections: kept here until a handler is set, then given to it as they come.
  struct Handoff {
    int peer;
    uint8_t hello[kHandoffHelloBytes];
    UniqueFd fd;
  };
  std::vector<Handoff> handoffs;
  std::map<uint32_t, Bootstrap::HandoffFn> handoffHandlers;  // by the hello's kind (its first 4 bytes)
  // The first accept() that failed (out of file descriptors, say): a peer this rank waits for may have been left
  // unanswered, so every wait that times out says so.
  std::string listenerProblem;

  // What a timeout's message adds when the listener has failed ("" when it has not); the mutex must be held.
  std::string listenerNote() const {
    return listenerProblem.empty()
               ? ""
               : "; this rank's bootstrap listener could not accept a connection: " + listenerProblem;
  }
};

// A rank's listener: accepts the ring connection from rank-1 and p2p connections from any rank, and reads p2p
// frames as they come so that a sender never waits for its receiver to call recv().
class PeerServer : public AuthServer {
 public:
  PeerServer(UniqueFd listener, const uint8_t* secret, int rank, int nranks, Inbox* inbox)
      : AuthServer(std::move(listener), secret, AuthRole::kPeer, "bootstrap listener of rank " + std::to_string(rank)),
        rank_(rank),
        nranks_(nranks),
        inbox_(inbox),
        p2pConnected_(nranks, false) {}

  void serve(int wakeFd, const std::atomic<bool>& stopping) {
    while (!stopping.load()) {
      bool woken = false;
      serveOnce(kPollSliceMs, wakeFd, &woken);
    }
  }

 private:
  enum Stage { kHello = 1, kFrameHeader, kFramePayload, kHandoffHello };

  void onAuthenticated(Conn& conn) override {
    conn.stage = kHello;
    expectInput(conn, kHelloBytes);
  }

  const char* describeStage(const Conn& conn) const override {
    return conn.stage == kHello || conn.stage == kHandoffHello ? "its hello" : AuthServer::describeStage(conn);
  }

  void onMessage(Conn& conn) override {
    if (conn.stage == kHello) {
      uint32_t kind = 0;
      int peer = -1;
      const std::string problem = parseHello(std::span<const uint8_t, kHelloBytes>(conn.io.input().data(), kHelloBytes),
                                             rank_, nranks_, &kind, &peer);
      if (!problem.empty()) return drop(conn, "%s", problem.c_str());
      if (kind == kRingConn) return takeRing(conn, peer);
      if (kind == kHandoffConn) {
        conn.rank = peer;
        conn.stage = kHandoffHello;
        return expectInput(conn, kHandoffHelloBytes);
      }
      if (p2pConnected_[peer]) return drop(conn, "a second p2p connection from rank %d", peer);
      // A sender whose write failed starts over on a new connection once the old one has closed.
      p2pConnected_[peer] = true;
      setPeerGone(peer, false);
      conn.rank = peer;
      conn.deadline = Clock::time_point::max();  // an authenticated peer may stay quiet as long as it likes
      conn.stage = kFrameHeader;
      return expectInput(conn, kFrameHeaderBytes);
    }
    if (conn.stage == kHandoffHello) return handOff(conn);
    if (conn.stage == kFrameHeader) {
      uint64_t bytes = 0;
      const std::string problem = parseFrameHeader(
          std::span<const uint8_t, kFrameHeaderBytes>(conn.io.input().data(), kFrameHeaderBytes), &conn.tag, &bytes);
      if (!problem.empty()) return drop(conn, "%s", problem.c_str());
      if (bytes > 0) {
        conn.stage = kFramePayload;
        return expectInput(conn, bytes);
      }
      deliver(conn.rank, conn.tag, {});
    } else {
      deliver(conn.rank, conn.tag, std::move(conn.io.input()));
    }
    conn.stage = kFrameHeader;
    expectInput(conn, kFrameHeaderBytes);
  }

  void takeRing(Conn& conn, int peer) {
    int prev = (rank_ + nranks_ - 1) % nranks_;
    if (peer != prev || ringPrev_) return drop(conn, "unexpected ring connection from rank %d", peer);
    ringPrev_ = true;
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    inbox_->ringPrev = conn.io.releaseFd();
    conn.dead = true;  // the connection now belongs to the Bootstrap's caller
    inbox_->changed.notify_all();
  }

  void handOff(Conn& conn) {
    Inbox::Handoff handoff{conn.rank, {}, conn.io.releaseFd()};
    std::memcpy(handoff.hello, conn.io.input().data(), kHandoffHelloBytes);
    conn.dead = true;  // the connection now belongs to the handler
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    auto handler = inbox_->handoffHandlers.find(handoffKind(handoff.hello));
    if (handler != inbox_->handoffHandlers.end())
      handler->second(handoff.peer, handoff.hello, std::move(handoff.fd));
    else
      inbox_->handoffs.push_back(std::move(handoff));
  }

  void setPeerGone(int peer, bool gone) {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    inbox_->peerGone[peer] = gone;
    inbox_->changed.notify_all();
  }

  void deliver(int peer, int tag, std::vector<uint8_t> message) {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    inbox_->messages[{peer, tag}].push_back(std::move(message));
    inbox_->changed.notify_all();
  }

  void onEof(Conn& conn) override {
    // A peer that is done with us closes between frames; anything else is a peer that died mid-message.
    if (conn.stage == kFrameHeader && conn.io.inputReceived() == 0) return retire(conn);
    AuthServer::onEof(conn);
  }

  void onGone(Conn& conn) override {
    if (conn.rank < 0) return;
    p2pConnected_[conn.rank] = false;
    setPeerGone(conn.rank, true);
  }

  void onAcceptFailed(const std::string& why) override {
    std::lock_guard<std::mutex> lock(inbox_->mutex);
    if (inbox_->listenerProblem.empty()) inbox_->listenerProblem = why;
    inbox_->changed.notify_all();
  }

  int rank_;
  int nranks_;
  Inbox* inbox_;
  std::vector<bool> p2pConnected_;
  bool ringPrev_ = false;
};

}  // namespace

// ---- Unique ids and roots ----

loomResult_t packUniqueId(const UniqueIdInfo& info, loomUniqueId* id) {
  if (info.rootAddress.empty() || info.rootAddress.size() > kMaxAddressBytes) {
    return LOOM_FAIL(loomInvalidArgument, BOOT, "root address \"%s\" has %zu characters; a unique id holds 1 to %zu",
                     info.rootAddress.c_str(), info.rootAddress.size(), kMaxAddressBytes);
  }
  std::vector<uint8_t> bytes = encodeUniqueId(info);
  std::memcpy(id->internal, bytes.data(), LOOM_UNIQUE_ID_BYTES);
  return loomSuccess;
}

loomResult_t unpackUniqueId(const loomUniqueId& id, UniqueIdInfo* info) {
  const std::string problem = parseUniqueId(std::span<const uint8_t, LOOM_UNIQUE_ID_BYTES>(
                                                reinterpret_cast<const uint8_t*>(id.internal), LOOM_UNIQUE_ID_BYTES),
                                            info);
  if (!problem.empty()) return LOOM_FAIL(loomInvalidArgument, BOOT, "%s", problem.c_str());
  return loomSuccess;
}

loomResult_t createUniqueId(loomUniqueId* id) {
  SocketAddress address;
  LOOM_CHECK(chooseListenAddress(&address));
  UniqueIdInfo info;
  LOOM_CHECK(randomBytes(info.secret, kSecretBytes));
  UniqueFd listener;
  LOOM_CHECK(listenOn(address, false, &listener, &info.rootAddress));
  LOOM_CHECK(packUniqueId(info, id));
  return launchRoot(std::move(listener), info.secret, info.rootAddress);
}

loomResult_t startRoot(const UniqueIdInfo& info) {
  SocketAddress address;
  LOOM_CHECK(resolveAddress(info.rootAddress, &address));
  std::string host;
  int port = 0;
  splitHostPort(info.rootAddress, &host, &port);
  // A host name can resolve differently here than on the other hosts (Debian's /etc/hosts maps this host's own
  // name to 127.0.1.1), so the root listens on every interface at that port; the secret keeps strangers out.
  if (!isNumericHost(host)) address = wildcardOf(address);
  UniqueFd listener;
  std::string bound;
  // SO_REUSEADDR: the port is fixed by the launcher, and the previous job's connections may be in TIME_WAIT.
  LOOM_CHECK(listenOn(address, true, &listener, &bound));
  return launchRoot(std::move(listener), info.secret, bound);
}

// ---- A rank ----

struct Bootstrap::Impl {
  int rank = 0;
  int nranks = 1;
  uint8_t secret[kSecretBytes];
  uint64_t commHash = 0;
  const std::atomic<bool>* abortFlag = nullptr;
  std::vector<std::string> addresses;  // every rank's listener
  UniqueFd ringNext;                   // to rank+1
  UniqueFd ringPrev;                   // from rank-1
  uint64_t allGatherCalls = 0;
  std::mutex sendMutex;
  std::vector<UniqueFd> sendConns;  // p2p, opened on first send
  Inbox inbox;
  std::unique_ptr<PeerServer> server;
  UniqueFd wakeFd;
  std::atomic<bool> stopping{false};
  std::thread listenerThread;

  ~Impl() {
    if (!listenerThread.joinable()) return;
    stopping.store(true);
    uint64_t one = 1;
    if (write(wakeFd.get(), &one, sizeof(one)) < 0) {
      // The thread still sees `stopping` within one poll slice.
    }
    listenerThread.join();
  }

  IoWait waitFor(const char* operation, int64_t timeoutMs) const {
    return IoWait{Deadline(timeoutMs), abortFlag,
                  std::string("bootstrap ") + operation + " of rank " + std::to_string(rank)};
  }
  static std::string peerName(int peer) { return "rank " + std::to_string(peer); }

  loomResult_t joinRoot(const UniqueIdInfo& info, const IoWait& wait, UniqueFd* listener);
  loomResult_t startListener(UniqueFd listener);
  loomResult_t connectPeer(int peer, ConnKind kind, const IoWait& wait, UniqueFd* out);
  loomResult_t connectRing(const IoWait& wait);
  loomResult_t ringAllGather(uint8_t* slots, size_t bytesPerRank, const IoWait& wait);
};

loomResult_t Bootstrap::Impl::joinRoot(const UniqueIdInfo& info, const IoWait& wait, UniqueFd* listener) {
  const std::string rootName = "the root at " + info.rootAddress;
  UniqueFd root;
  LOOM_CHECK(connectTo(info.rootAddress, /*untilListening=*/true, wait, &root));
  // Listen where LOOM_SOCKET_IFNAME says, else on the interface that reaches the root: the other ranks will reach
  // this one the same way. Unless the root was named by a host name that led to loopback here: other hosts cannot
  // reach this rank's loopback. Peers' data connections (tcp) come here too.
  SocketAddress local;
  LOOM_CHECK(localAddress(root.get(), &local));
  std::string rootHost;
  int rootPort = 0;
  splitHostPort(info.rootAddress, &rootHost, &rootPort);
  if (!params::socketIfname().empty() || (isLoopback(local) && !isNumericHost(rootHost)))
    LOOM_CHECK(chooseListenAddress(&local));
  setPort(&local, 0);
  std::string listenAddress;
  LOOM_CHECK(listenOn(local, false, listener, &listenAddress));
  LOOM_CHECK(authenticateToAcceptor(root.get(), secret, AuthRole::kRoot, rootName, wait));

  std::vector<uint8_t> message = encodeRegistration({rank, nranks, listenAddress});
  LOOM_CHECK(writeExact(root.get(), message.data(), message.size(), rootName, wait));

  uint8_t lengthBytes[4];
  LOOM_CHECK(readExact(root.get(), lengthBytes, sizeof(lengthBytes), rootName, wait));
  uint32_t length = 0;
  Reader(lengthBytes).u32(&length);
  const size_t maxLength = maxRootReplyBytes(nranks);
  if (length < 4 || length > maxLength) {
    return LOOM_FAIL(loomRemoteError, BOOT, "%s: %s announced a %u-byte reply; expected 4 to %zu bytes",
                     wait.operation.c_str(), rootName.c_str(), length, maxLength);
  }
  std::vector<uint8_t> reply(length);
  LOOM_CHECK(readExact(root.get(), reply.data(), reply.size(), rootName, wait));
  RootReply parsed;
  const std::string problem = parseRootReply(reply, nranks, &parsed);
  if (!problem.empty()) {
    return LOOM_FAIL(loomRemoteError, BOOT, "%s: %s sent %s", wait.operation.c_str(), rootName.c_str(),
                     problem.c_str());
  }
  if (parsed.rejected) {
    return LOOM_FAIL(loomInvalidUsage, BOOT, "%s: %s rejected this rank: %s", wait.operation.c_str(), rootName.c_str(),
                     parsed.reason.c_str());
  }
  addresses = std::move(parsed.addresses);
  LOOM_INFO(BOOT, "rank %d listens at %s; got the addresses of all %d ranks from %s", rank, listenAddress.c_str(),
            nranks, rootName.c_str());
  return loomSuccess;
}

loomResult_t Bootstrap::Impl::startListener(UniqueFd listener) {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return LOOM_FAIL(loomSystemError, BOOT, "eventfd() for the bootstrap listener of rank %d: %m", rank);
  wakeFd.reset(fd);
  inbox.peerGone.assign(nranks, 0);
  sendConns.resize(nranks);
  server = std::make_unique<PeerServer>(std::move(listener), secret, rank, nranks, &inbox);
  try {
    listenerThread = std::thread([this] {
      ScopedLogRank logRank(rank);
      server->serve(wakeFd.get(), stopping);
    });
  } catch (const std::system_error& error) {
    return LOOM_FAIL(loomSystemError, BOOT, "cannot start the bootstrap listener thread of rank %d: %s", rank,
                     error.what());
  }
  return loomSuccess;
}

loomResult_t Bootstrap::Impl::connectPeer(int peer, ConnKind kind, const IoWait& wait, UniqueFd* out) {
  const std::string name = peerName(peer) + " at " + addresses[peer];
  UniqueFd fd;
  // A peer's listener opened before it registered, so a refusal means the peer has gone: no retries.
  LOOM_CHECK(connectTo(addresses[peer], /*untilListening=*/false, wait, &fd));
  LOOM_CHECK(authenticateToAcceptor(fd.get(), secret, AuthRole::kPeer, name, wait));
  std::vector<uint8_t> hello = encodeHello(kind, rank);
  LOOM_CHECK(writeExact(fd.get(), hello.data(), hello.size(), name, wait));
  *out = std::move(fd);
  return loomSuccess;
}

loomResult_t Bootstrap::Impl::connectRing(const IoWait& wait) {
  // Everyone connects forward before waiting for the connection from behind; listener threads accept, so the
  // order of arrival does not matter.
  LOOM_CHECK(connectPeer((rank + 1) % nranks, kRingConn, wait, &ringNext));
  const int prev = (rank + nranks - 1) % nranks;
  std::unique_lock<std::mutex> lock(inbox.mutex);
  while (!inbox.ringPrev.valid()) {
    if (wait.aborted()) {
      return LOOM_FAIL(loomRemoteError, BOOT,
                       "%s: aborted while waiting for rank %d (previous in the ring) to connect%s",
                       wait.operation.c_str(), prev, inbox.listenerNote().c_str());
    }
    if (wait.deadline.expired()) {
      return LOOM_FAIL(loomTimeout, BOOT, "%s: rank %d (previous in the ring) did not connect within %lld ms%s",
                       wait.operation.c_str(), prev, (long long)wait.deadline.timeoutMs(),
                       inbox.listenerNote().c_str());
    }
    inbox.changed.wait_for(lock, waitSlice(wait.deadline));
  }
  ringPrev = std::move(inbox.ringPrev);
  return loomSuccess;
}

// Ring allgather: in step s this rank sends slot (rank - s) to rank+1 and receives slot (rank - s - 1) from
// rank-1; after nranks-1 steps every slot has gone round. Each rank moves (nranks-1) * bytesPerRank each way.
loomResult_t Bootstrap::Impl::ringAllGather(uint8_t* slots, size_t bytesPerRank, const IoWait& wait) {
  if (nranks == 1) return loomSuccess;
  const int next = (rank + 1) % nranks;
  const int prev = (rank + nranks - 1) % nranks;
  const std::string nextName = peerName(next), prevName = peerName(prev);
  // Each call opens with (call number, bytesPerRank), so ranks that disagree fail here with a clear message
  // instead of reading each other's bytes out of frame.
  const uint64_t call = allGatherCalls++;
  std::vector<uint8_t> mine;
  putU64(&mine, call);
  putU64(&mine, bytesPerRank);
  uint8_t theirs[16];
  LOOM_CHECK(exchange(ringNext.get(), mine.data(), mine.size(), nextName, ringPrev.get(), theirs, sizeof(theirs),
                      prevName, wait));
  uint64_t theirCall = 0, theirBytes = 0;
  Reader in(theirs);
  in.u64(&theirCall), in.u64(&theirBytes);
  if (theirCall != call || theirBytes != bytesPerRank) {
    return LOOM_FAIL(loomInternalError, BOOT,
                     "%s: rank %d is at ring exchange #%llu with %llu bytes per rank; this rank is at #%llu with %zu",
                     wait.operation.c_str(), prev, (unsigned long long)theirCall, (unsigned long long)theirBytes,
                     (unsigned long long)call, bytesPerRank);
  }
  for (int step = 0; step < nranks - 1; ++step) {
    const int sendSlot = (rank - step + nranks) % nranks;
    const int recvSlot = (rank - step - 1 + nranks) % nranks;
    LOOM_CHECK(exchange(ringNext.get(), slots + sendSlot * bytesPerRank, bytesPerRank, nextName, ringPrev.get(),
                        slots + recvSlot * bytesPerRank, bytesPerRank, prevName, wait));
  }
  return loomSuccess;
}

loomResult_t Bootstrap::create(const loomUniqueId& id, int rank, int nranks, const Deadline& deadline,
                               const std::atomic<bool>* abortFlag, std::unique_ptr<Bootstrap>* out) {
  UniqueIdInfo info;
  LOOM_CHECK(unpackUniqueId(id, &info));
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
    return LOOM_FAIL(loomInvalidArgument, BOOT, "bootstrap: rank %d of %d ranks; expected 0 <= rank < nranks <= %d",
                     rank, nranks, kMaxRanks);
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->abortFlag = abortFlag;
  std::memcpy(impl->secret, info.secret, kSecretBytes);
  static const char kCommHashLabel[] = "loom communicator hash";
  impl->commHash = sipHash24(info.secret, kCommHashLabel, sizeof(kCommHashLabel) - 1);

  const IoWait wait{deadline, abortFlag, "bootstrap init of rank " + std::to_string(rank)};
  UniqueFd listener;
  LOOM_CHECK(impl->joinRoot(info, wait, &listener));
  LOOM_CHECK(impl->startListener(std::move(listener)));
  std::unique_ptr<Bootstrap> bootstrap(new Bootstrap(std::move(impl)));
  if (nranks > 1) LOOM_CHECK(bootstrap->impl_->connectRing(wait));
  *out = std::move(bootstrap);
  return loomSuccess;
}

Bootstrap::Bootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bootstrap::~Bootstrap() = default;

int Bootstrap::rank() const { return impl_->rank; }
std::string Bootstrap::listenAddress() const { return impl_->addresses[impl_->rank]; }
int Bootstrap::nranks() const { return impl_->nranks; }
uint64_t Bootstrap::commHash() const { return impl_->commHash; }

loomResult_t Bootstrap::allGather(void* data, size_t bytesPerRank, int64_t timeoutMs) {
  return impl_->ringAllGather(static_cast<uint8_t*>(data), bytesPerRank, impl_->waitFor("allGather", timeoutMs));
}

loomResult_t Bootstrap::barrier(int64_t timeoutMs) {
  std::vector<uint8_t> slots(impl_->nranks);
  return impl_->ringAllGather(slots.data(), 1, impl_->waitFor("barrier", timeoutMs));
}

loomResult_t Bootstrap::send(int peer, int tag, const void* data, size_t bytes, int64_t timeoutMs) {
  Impl& self = *impl_;
  if (peer < 0 || peer >= self.nranks || bytes > kMaxP2pBytes || (data == nullptr && bytes > 0)) {
    return LOOM_FAIL(loomInvalidArgument, BOOT,
                     "bootstrap send of rank %d: peer %d of %d ranks, %zu bytes at %p; expected a valid peer and at "
                     "most %llu bytes",
                     self.rank, peer, self.nranks, bytes, data, (unsigned long long)kMaxP2pBytes);
  }
  if (peer == self.rank) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    std::lock_guard<std::mutex> lock(self.inbox.mutex);
    self.inbox.messages[{peer, tag}].emplace_back(p, p + bytes);
    self.inbox.changed.notify_all();
    return loomSuccess;
  }
  const IoWait wait = self.waitFor("send", timeoutMs);
  std::lock_guard<std::mutex> lock(self.sendMutex);
  UniqueFd& conn = self.sendConns[peer];
  if (!conn.valid()) LOOM_CHECK(self.connectPeer(peer, kP2pConn, wait, &conn));
  std::vector<uint8_t> header = encodeFrameHeader(tag, bytes);
  const std::string name = Impl::peerName(peer);
  loomResult_t result = writeExact(conn.get(), header.data(), header.size(), name, wait);
  if (result == loomSuccess) result = writeExact(conn.get(), data, bytes, name, wait);
  // A frame cut short leaves the stream out of step: the next send starts over on a new connection.
  if (result != loomSuccess) conn.reset();
  return result;
}

loomResult_t Bootstrap::connectHandoff(int peer, const uint8_t hello[kHandoffHelloBytes], int64_t timeoutMs,
                                       UniqueFd* out) {
  Impl& self = *impl_;
  if (peer < 0 || peer >= self.nranks || peer == self.rank) {
    return LOOM_FAIL(loomInvalidArgument, BOOT,
                     "bootstrap handoff connection of rank %d: peer %d is not another of %d ranks", self.rank, peer,
                     self.nranks);
  }
  const IoWait wait = self.waitFor("handoff connection", timeoutMs);
  UniqueFd fd;
  LOOM_CHECK(self.connectPeer(peer, kHandoffConn, wait, &fd));
  LOOM_CHECK(writeExact(fd.get(), hello, kHandoffHelloBytes, Impl::peerName(peer), wait));
  *out = std::move(fd);
  return loomSuccess;
}

std::string Bootstrap::listenerNote() const {
  std::lock_guard<std::mutex> lock(impl_->inbox.mutex);
  return impl_->inbox.listenerNote();
}

void Bootstrap::setHandoffHandler(uint32_t kind, HandoffFn handler) {
  std::lock_guard<std::mutex> lock(impl_->inbox.mutex);
  if (!handler) {
    impl_->inbox.handoffHandlers.erase(kind);
    return;
  }
  HandoffFn& installed = impl_->inbox.handoffHandlers[kind] = std::move(handler);
  std::vector<Inbox::Handoff> kept;
  for (Inbox::Handoff& handoff : impl_->inbox.handoffs) {
    if (handoffKind(handoff.hello) == kind) {
      installed(handoff.peer, handoff.hello, std::move(handoff.fd));
    } else {
      kept.push_back(std::move(handoff));
    }
  }
  impl_->inbox.handoffs.swap(kept);
}

loomResult_t Bootstrap::recv(int peer, int tag, void* data, size_t bytes, int64_t timeoutMs) {
  Impl& self = *impl_;
  if (peer < 0 || peer >= self.nranks || (data == nullptr && bytes > 0)) {
    return LOOM_FAIL(loomInvalidArgument, BOOT, "bootstrap recv of rank %d: peer %d is outside 0..%d", self.rank, peer,
                     self.nranks - 1);
  }
  const Deadline deadline(timeoutMs);
  std::unique_lock<std::mutex> lock(self.inbox.mutex);
  for (;;) {
    auto found = self.inbox.messages.find({peer, tag});
    if (found != self.inbox.messages.end() && !found->second.empty()) {
      std::vector<uint8_t>& message = found->second.front();
      if (message.size() != bytes) {
        // Left queued: a wrong size is the caller's bug and must not lose the message.
        return LOOM_FAIL(loomInternalError, BOOT,
                         "bootstrap recv of rank %d: the message from rank %d with tag %d has %zu bytes, expected %zu",
                         self.rank, peer, tag, message.size(), bytes);
      }
      if (bytes > 0) std::memcpy(data, message.data(), bytes);
      found->second.pop_front();
      if (found->second.empty()) self.inbox.messages.erase(found);
      return loomSuccess;
    }
    if (self.inbox.peerGone[peer]) {
      return LOOM_FAIL(
          loomRemoteError, BOOT,
          "bootstrap recv of rank %d: rank %d closed its connection without sending a message with tag %d%s", self.rank,
          peer, tag, self.inbox.listenerNote().c_str());
    }
    if (self.abortFlag != nullptr && self.abortFlag->load(std::memory_order_relaxed)) {
      return LOOM_FAIL(loomRemoteError, BOOT, "bootstrap recv of rank %d: aborted while waiting for rank %d, tag %d%s",
                       self.rank, peer, tag, self.inbox.listenerNote().c_str());
    }
    if (deadline.expired()) {
      return LOOM_FAIL(loomTimeout, BOOT,
                       "bootstrap recv of rank %d: no message with tag %d from rank %d within %lld ms%s", self.rank,
                       tag, peer, (long long)timeoutMs, self.inbox.listenerNote().c_str());
    }
    self.inbox.changed.wait_for(lock, waitSlice(deadline));
  }
}

}  // namespace loom
