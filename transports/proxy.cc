// The proxy thread and FIFOs the network transports share (proxy.h).
#include "transports/proxy.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <system_error>

#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/params.h"

namespace loom {
namespace {

// An idle proxy sleeps until the network or a doorbell wakes it, and at least this often looks around anyway (a
// safety net: nothing needs it).
constexpr int64_t kSleepBackstopUs = 100000;
// An attached caller that finds nothing to move polls the sockets of sending connections once in this many passes.
constexpr uint64_t kCallerPassesPerPoll = 16;

}  // namespace

Pages::Pages(size_t bytes) : bytes_((bytes + 4095) / 4096 * 4096) {
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) base_ = nullptr;
}

Pages::~Pages() {
  if (base_ == nullptr) return;
  // Quarantined: the pages go back to the system; the addresses stay mapped (a late write lands in a fresh zero page).
  if (quarantined_ && madvise(base_, bytes_, MADV_DONTNEED) == 0) return;
  munmap(base_, bytes_);
}

LocalFifo::LocalFifo(const FifoShape& shape, int doorbell) : pages_(fifoBytes(shape)) {
  if (!pages_.valid()) return;
  fifoInit(pages_.data(), shape);
  fifoView(pages_.data()).header->doorbell = doorbell;
}

std::string ProxyConn::name() const {
  return std::string(sends ? "to" : "from") + " rank " + std::to_string(peer) + " on channel " + std::to_string(channel);
}

void stripe(size_t bytes, Protocol protocol, int parts, int index, size_t* begin, size_t* end) {
  if (stripeCount(bytes, protocol, parts) == 1) {
    *begin = 0;
    *end = index == 0 ? bytes : 0;
    return;
  }
  size_t part = (bytes / parts + 63) / 64 * 64;
  *begin = std::min(bytes, part * index);
  *end = index == parts - 1 ? bytes : std::min(bytes, part * (index + 1));
}

int stripeCount(size_t bytes, Protocol protocol, int parts) {
  return protocol != Protocol::kSimple || bytes < kStripeMinBytes || parts <= 1 ? 1 : parts;
}

bool nextOutgoing(ProxyConn& conn, bool* bad) {
  *bad = false;
  size_t bytes = 0;
  bool direct = false;
  conn.sendingAgain = conn.holds && conn.againWanted != 0;
  const void* data =
      !conn.holds ? conn.drain->pollAny(&bytes, &conn.protocol, &direct)
                  : conn.drain->peekAny(conn.sendingAgain ? conn.againWanted - 1 : conn.nextToSend, &bytes,
                                        &conn.protocol, &direct);
  if (data == nullptr) return false;
  conn.trailer = nullptr;
  conn.trailerBytes = 0;
  if (direct) {
    // The payload lies in this process's memory, where the executor left it for the proxy to send from. The
    // message's size beyond the payload's is its checksum (LOOM_CHECKSUM), after the descriptor in the slot.
    const auto* descriptor = static_cast<const DirectDescriptor*>(data);
    const size_t trailer = bytes > descriptor->bytes ? bytes - descriptor->bytes : 0;
    if (descriptor->pid != getpid() || (trailer != 0 && trailer != kChecksumBytes) ||
        descriptor->bytes + trailer > fifoPayloadBytes(conn.shape, Protocol::kSimple)) {
      *bad = true;
      return false;
    }
    if (trailer != 0) conn.trailer = static_cast<const std::byte*>(data) + sizeof(DirectDescriptor);
    conn.trailerBytes = trailer;
    data = reinterpret_cast<const void*>(descriptor->address);
    bytes = descriptor->bytes + trailer;
  }
  conn.payload = static_cast<std::byte*>(const_cast<void*>(data));
  conn.payloadBytes = bytes;
  return true;
}

int outgoingPieces(const ProxyConn& conn, size_t begin, size_t end, iovec pieces[2]) {
  const size_t body = conn.payloadBytes - conn.trailerBytes;
  int count = 0;
  if (begin < std::min(end, body)) pieces[count++] = {conn.payload + begin, std::min(end, body) - begin};
  if (end > body) {
    const size_t from = std::max(begin, body);
    pieces[count++] = {const_cast<std::byte*>(conn.trailer) + (from - body), end - from};
  }
  return count;
}

ProxyComm::ProxyComm(const TransportCommContext& context, const char* transport)
    : context_(context), transport_(transport) {}

ProxyComm::~ProxyComm() = default;

loomResult_t ProxyComm::openDoorbell() {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0)
    return LOOM_FAIL(loomSystemError, NET, "eventfd() for the %s proxy of rank %d: %m", transport_, context_.rank);
  wake_.reset(fd);
  return loomSuccess;
}

loomResult_t ProxyComm::attach(std::shared_ptr<ProxyConn> conn, std::unique_ptr<Endpoint>* out) {
  if (!conn->fifo.valid())
    return LOOM_FAIL(loomSystemError, NET, "%s: cannot allocate %zu bytes for the FIFO %s", transport_,
                     conn->fifo.bytes(), conn->name().c_str());
  std::shared_ptr<ProxyConn> kept = conn;
  std::lock_guard<std::mutex> lock(mutex_);
  added_.push_back(std::move(conn));
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] {
        ScopedLogRank logRank(context_.rank);
        run();
      });
    } catch (const std::system_error& error) {
      added_.pop_back();
      return LOOM_FAIL(loomSystemError, NET, "cannot start the %s proxy thread of rank %d: %s", transport_,
                       context_.rank, error.what());
    }
  }
  wake();
  *out = std::make_unique<ProxyEndpoint>(this, std::move(kept));
  return loomSuccess;
}

void ProxyComm::wake() {
  uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0) {
    // The counter is full, so the proxy has a wake-up pending already.
  }
}

void ProxyComm::drainDoorbell() {
  uint64_t count = 0;
  if (read(wake_.get(), &count, sizeof(count)) < 0) {
    // Another look drained it first: the eventfd is non-blocking.
  }
}

void ProxyComm::stopProxy() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  if (!thread_.joinable()) return;
  wake();
  thread_.join();
  LOOM_INFO(NET, "rank %d: %llu messages sent and %llu received over %s, in %llu passes of the proxy and %llu of "
            "callers",
            context_.rank, static_cast<unsigned long long>(sent_), static_cast<unsigned long long>(received_),
            transport_, static_cast<unsigned long long>(proxyPasses_), static_cast<unsigned long long>(callerPasses_));
}

void ProxyComm::shut(ProxyConn& conn, uint32_t code, uint64_t origin) {
  if (code != 0) conn.markAborted(code, origin);
  if (!conn.closed) shutNetwork(conn, false);
  conn.closed = true;
}

void ProxyComm::fail(ProxyConn& conn, const std::string& what, int error) {
  std::string why = std::string(transport_) + ": connection " + conn.name() + " " + what;
  if (error != 0) why += std::string(": ") + std::strerror(error);
  LOOM_WARN(NET, "%s", why.c_str());
  {
    std::lock_guard<std::mutex> lock(lostMutex_);
    std::erase_if(lost_, [&](const auto& entry) { return entry.first == conn.peer; });
    lost_.emplace_back(conn.peer, std::move(why));
  }
  shut(conn, kConnectionLost);
}

std::string ProxyComm::lostReason(int peer) const {
  std::lock_guard<std::mutex> lock(lostMutex_);
  if (peer < 0) return lost_.empty() ? std::string() : lost_.back().second;
  for (const auto& [who, why] : lost_)
    if (who == peer) return why;
  return {};
}

// The peer closed between messages: it finished with this communicator. Should the executor wait on this FIFO
// again, it finds it aborted and names the peer.
//
// A sending connection with nothing pending is not marked yet: its peer finished with everything this rank sent,
// and this rank's executor may be waiting for the peer's last messages on other connections, still on their way.
// The mark comes (pass()) only if the executor posts to it again.
void ProxyComm::peerClosed(ProxyConn& conn) {
  LOOM_INFO(NET, "%s: connection %s: the peer closed it", transport_, conn.name().c_str());
  if (conn.sends && !conn.inFrame && conn.drain->empty()) {
    conn.closedIdle = true;
    shut(conn, 0);
    return;
  }
  shut(conn, kConnectionLost);
}

void ProxyComm::peerGaveUp(ProxyConn& conn, uint64_t origin) {
  LOOM_INFO(NET, "%s: connection %s: the peer gave up on it", transport_, conn.name().c_str());
  shut(conn, kAbortedByPeer, origin);
}

// Takes the connections other threads handed over.
bool ProxyComm::adopt() {
  std::vector<std::shared_ptr<ProxyConn>> added, retired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    added.swap(added_);
    retired.swap(retired_);  // dropped here: a connection's last reference goes on this thread
  }
  for (auto& conn : added) {
    if (conn->sends) {
      conn->drain = std::make_unique<FifoReceiver>(conn->fifo.view());
    } else {
      conn->fill = std::make_unique<FifoSender>(conn->fifo.view());
    }
    conns_.push_back(std::move(conn));
  }
  bool extra = adoptExtra();
  return !added.empty() || extra;
}

// An executor that gave up marked its FIFO aborted: the peer hears of it.
bool ProxyComm::watchLocal(ProxyConn& conn) {
  if (conn.closed || conn.fifo.view().header->aborted.load(std::memory_order_relaxed) == 0) return false;
  LOOM_INFO(NET, "%s: connection %s: this rank gave up on it; closing", transport_, conn.name().c_str());
  if (conn.connected) notifyGaveUp(conn);
  shut(conn, 0);
  return true;
}

// Nothing more to do for a connection whose endpoint is gone: a receiving one once it owes the sender no notice, a
// sending one once what its executor posted has left (and, holding, been released by the far end).
bool ProxyComm::finished(const ProxyConn& conn) const {
  if (!conn.released.load()) return false;
  if (conn.closed) return true;
  if (!conn.sends) return !conn.owesPeer();
  const FifoHeader* header = conn.fifo.view().header;
  return !conn.inFrame &&
         header->head.load(std::memory_order_acquire) == header->tail.load(std::memory_order_acquire);
}

// One round over every connection; whether anything moved.
bool ProxyComm::pass() {
  bool progressed = adopt();
  progressed |= progress();
  for (auto& conn : conns_) {
    if (conn->closedIdle && !conn->drain->empty()) {  // posted to a peer that has gone
      conn->closedIdle = false;
      conn->markAborted(kConnectionLost);
    }
    if (watchLocal(*conn) || conn->closed || !conn->connected) continue;
    progressed |= pump(*conn);
  }
  for (auto& conn : conns_) {
    if (!finished(*conn) || conn->closed) continue;
    shutNetwork(*conn, true);
    conn->closed = true;
  }
  std::erase_if(conns_, [](const std::shared_ptr<ProxyConn>& conn) { return conn->closed && conn->released.load(); });
  return progressed;
}

// Tells every FIFO's executor side whether the proxy sleeps, so that it rings the doorbell (fifo.h).
void ProxyComm::setSleeping(bool sleeping) {
  for (auto& conn : conns_) conn->fifo.view().header->sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ProxyComm::waitDoorbell(int64_t micros) {
  pollfd doorbell{wake_.get(), POLLIN, 0};
  timespec timeout{micros / 1000000, static_cast<long>(micros % 1000000 * 1000)};
  if (ppoll(&doorbell, 1, &timeout, nullptr) > 0) drainDoorbell();
}

void ProxyComm::attachCaller() {
  callers_.fetch_add(1, std::memory_order_seq_cst);
  // A proxy asleep on the network holds the connections: wake it, and it leaves them to this caller (run()).
  if (proxyAsleep_.load(std::memory_order_seq_cst)) wake();
}

bool ProxyComm::progressFromCaller() {
  std::unique_lock<std::mutex> lock(passMutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (pass()) {
    ++callerPasses_;
    idleCallerPasses_ = 0;
    return true;
  }
  // A peer that gave up on or closed a connection this rank sends on shows only in a poll of its sockets: one
  // in kCallerPassesPerPoll idle passes polls them.
  if (++idleCallerPasses_ % kCallerPassesPerPoll == 0) sleep(0);
  return false;
}

void ProxyComm::detachCaller() {
  callers_.fetch_sub(1, std::memory_order_seq_cst);
  // The proxy takes over what the call left: its last messages may still be on their way. With nothing left,
  // it may sleep on: it looks at the network again within kSleepBackstopUs, or when the next call attaches.
  std::unique_lock<std::mutex> lock(passMutex_, std::try_to_lock);
  if (lock.owns_lock() && !needsProxy()) return;
  wake();
}

bool ProxyComm::needsProxy() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!added_.empty() || !retired_.empty()) return true;
  }
  return std::any_of(conns_.begin(), conns_.end(), [](const std::shared_ptr<ProxyConn>& conn) {
    if (conn->closed) return false;
    bool aborted = conn->fifo.view().header->aborted.load(std::memory_order_relaxed) != 0;
    return aborted || (conn->sends && (conn->inFrame || !conn->drain->empty())) || conn->owesPeer();
  });
}

void ProxyComm::run() {
  static const int64_t yieldUs = params::yieldUs();
  Clock::time_point idleSince = Clock::now();
  bool idle = false;
  std::optional<Deadline> flushBy;  // set once the communicator is being destroyed
  for (;;) {
    bool progressed;
    {
      std::lock_guard<std::mutex> lock(passMutex_);
      progressed = pass();
      if (progressed) ++proxyPasses_;
    }
    bool stopping, moreAdded;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping = stopping_;
      moreAdded = !added_.empty();
    }
    if (stopping) {
      if (!flushBy) flushBy.emplace(context_.timeoutMs);
      // A connection attached while this pass ran (after its adopt()) may hold the executor's last message.
      if (conns_.empty() && !moreAdded) break;
      if (flushBy->expired()) {
        LOOM_WARN(NET, "%s: rank %d: %zu connection(s) still had messages to send after %lld ms; closing them",
                  transport_, context_.rank, conns_.size(), static_cast<long long>(flushBy->timeoutMs()));
        break;
      }
    }
    if (progressed) {
      idle = false;
      continue;
    }
    if (callers_.load(std::memory_order_seq_cst) > 0 && !stopping) {
      // A waiting caller moves the messages: stay off the cores until its call ends (detachCaller rings).
      waitDoorbell(kSleepBackstopUs);
      idle = false;
      continue;
    }
    if (!idle) {
      idle = true;
      idleSince = Clock::now();
    }
    auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - idleSince).count();
    if (waited < yieldUs) {
      {
        std::lock_guard<std::mutex> lock(passMutex_);
        sleep(0);
      }
      sched_yield();
      continue;
    }
    // Sleep until the network, the doorbell or the eventfd wakes the proxy: mark the FIFOs first, then look
    // once more, so that a message posted meanwhile is either seen now or rings. A caller that attaches
    // meanwhile sees proxyAsleep_ and rings, or is seen here.
    std::lock_guard<std::mutex> passLock(passMutex_);
    proxyAsleep_.store(true, std::memory_order_seq_cst);
    if (callers_.load(std::memory_order_seq_cst) == 0 || stopping) {
      setSleeping(true);
      if (!pass()) sleep(kSleepBackstopUs);
      setSleeping(false);
    }
    proxyAsleep_.store(false, std::memory_order_seq_cst);
  }
  std::lock_guard<std::mutex> passLock(passMutex_);
  for (auto& conn : conns_) shut(*conn, 0);
  conns_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  added_.clear();  // attached but never adopted (the flush ran out of time): nothing of theirs left
  retired_.clear();
}

ProxyEndpoint::~ProxyEndpoint() { comm_->release(std::move(conn_)); }

void ProxyComm::release(std::shared_ptr<ProxyConn> conn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    conn->released.store(true);
    retired_.push_back(std::move(conn));
  }
  wake();
}

}  // namespace loom
