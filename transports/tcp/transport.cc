// tcp: connections between ranks on different hosts (or any ranks, when LOOM_TRANSPORTS asks for it) over TCP.
//
// Each end keeps a FIFO in its own memory, laid out as shm's, so the executor never knows the difference. One
// proxy thread per communicator moves the messages: on the sending rank it drains the FIFO the executor posts
// into, frame by frame, into the connection's socket; on the receiving rank it reads frames from the socket and
// posts them into the FIFO the executor reads, as a local sender would. Flow control is the receiver's credit:
// the proxy reads a frame's payload only once a slot is free for it, and TCP's window holds the sender back
// meanwhile.
//
// A connection is LOOM_NSOCKS sockets (the sender's setting; the receiver learns it from the hellos), each opened
// through the bootstrap's listener (Bootstrap::connectHandoff), which authenticates it with the communicator's
// secret; the opener's hello names the channel, the socket's index and the count. Wire format per message, on
// socket 0: u32 payload bytes, u32 protocol (0 Simple, 1 LL), then the payload's first part. A Simple payload of
// kStripeMinBytes or more is cut into one part per socket (stripe() decides, from the size alone, so the
// receiver cuts it the same way), and socket j carries part j with nothing around it; anything smaller travels
// whole on socket 0. Several sockets help where a network caps each flow, as clouds do. LL messages travel as
// their payload and get the receiving FIFO's flags on arrival. A DirectDescriptor posted by this process's
// executor (Links::proxySends) is sent from the memory it names, sparing the copy into the FIFO; the executor's
// call ends only once the proxy has released it.
//
// Failure: a connection that fails or ends while its FIFO is in use marks the FIFO aborted (kConnectionLost),
// which the executor reports as loomRemoteError naming the peer; the proxy logs why (WARN). An executor that
// gives up marks its FIFO aborted; the proxy then sends an abort notice (a frame header with protocol
// kAbortNotice, in either direction) and shuts the socket, and the peer's proxy marks its own FIFO aborted by
// the peer (kAbortedByPeer), so that each survivor's error tells a peer that gave up from one that vanished. When a
// communicator is destroyed, the proxy first sends what its executor had posted (a call may return before its last
// messages left), within LOOM_TIMEOUT_MS.
#include "transports/transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/check.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/socket.h"

namespace loom {
namespace {

constexpr uint32_t kHelloMagic = 0x6c746370;  // opens the hello of a tcp data connection
constexpr size_t kFrameHeaderBytes = 8;
constexpr uint32_t kAbortNotice = 0xab0f;  // in a frame header's protocol field: the sender's executor gave up
constexpr size_t kStripeMinBytes = 65536;
constexpr int kMaxSockets = 16;
// Idle proxy: after LOOM_YIELD_US of yielding, it sleeps until its sockets, the FIFOs' doorbell (fifo.h) or its
// eventfd wake it, and at least this often looks around anyway (a safety net: nothing needs it).
constexpr int64_t kSleepBackstopUs = 100000;

// A FIFO in this process's memory.
class LocalFifo {
 public:
  // `doorbell`: the proxy's eventfd, which the executor's side rings while the proxy sleeps.
  LocalFifo(const FifoShape& shape, int doorbell)
      : bytes_((fifoBytes(shape) + 4095) / 4096 * 4096), base_(std::aligned_alloc(4096, bytes_)) {
    if (base_ == nullptr) return;
    fifoInit(base_, shape);
    fifoView(base_).header->doorbell = doorbell;
  }
  ~LocalFifo() { std::free(base_); }
  LocalFifo(const LocalFifo&) = delete;
  LocalFifo& operator=(const LocalFifo&) = delete;
  bool valid() const { return base_ != nullptr; }
  size_t bytes() const { return bytes_; }
  FifoMemory view() const { return fifoView(base_); }

 private:
  size_t bytes_;
  void* base_;
};

// Part `index` of `sockets` of a message, as [*begin, *end) of its payload.
void stripe(size_t bytes, Protocol protocol, int sockets, int index, size_t* begin, size_t* end) {
  if (protocol != Protocol::kSimple || bytes < kStripeMinBytes || sockets == 1) {
    *begin = 0;
    *end = index == 0 ? bytes : 0;
    return;
  }
  size_t part = (bytes / sockets + 63) / 64 * 64;
  *begin = std::min(bytes, part * index);
  *end = index == sockets - 1 ? bytes : std::min(bytes, part * (index + 1));
}

// One socket of a connection, and its share of the message in flight.
struct TcpSocket {
  UniqueFd fd;
  size_t begin = 0;  // the part of the payload this socket carries
  size_t end = 0;
  size_t done = 0;  // bytes of it moved so far
  bool wantWrite = false;  // its buffer is full
  bool finished() const { return begin + done == end; }
};

// One direction of one channel between this rank and `peer`.
struct TcpConn {
  TcpConn(bool sends, int peer, int channel, const FifoShape& shape, int sockets, int doorbell)
      : sends(sends), peer(peer), channel(channel), shape(shape), fifo(shape, doorbell), socks(sockets) {}

  const bool sends;  // this rank sends: the proxy drains `fifo` into the sockets; else it fills `fifo`
  const int peer;
  const int channel;
  const FifoShape shape;
  LocalFifo fifo;
  std::atomic<bool> released{false};  // the executor's endpoint is gone

  // The proxy thread's alone from here on.
  std::vector<TcpSocket> socks;         // receiving side: empty until the sender's first socket arrives
  bool connected = false;               // every socket is there
  std::unique_ptr<FifoReceiver> drain;  // sending side
  std::unique_ptr<FifoSender> fill;     // receiving side
  uint8_t frame[kFrameHeaderBytes] = {};
  size_t frameDone = 0;
  bool inFrame = false;  // between a frame's header and the end of its payload
  Protocol protocol = Protocol::kSimple;
  std::byte* payload = nullptr;  // where the payload comes from (sending) or goes (receiving; null: no slot yet)
  size_t payloadBytes = 0;
  bool wantSlot = false;  // a frame waits for the executor to free a slot
  bool closed = false;    // the sockets are shut: nothing more moves

  void startParts() {
    for (size_t j = 0; j < socks.size(); ++j) {
      stripe(payloadBytes, protocol, static_cast<int>(socks.size()), static_cast<int>(j), &socks[j].begin,
             &socks[j].end);
      socks[j].done = 0;
    }
  }
  bool partsFinished() const {
    return std::all_of(socks.begin(), socks.end(), [](const TcpSocket& sock) { return sock.finished(); });
  }

  std::string name() const {
    return std::string(sends ? "to" : "from") + " rank " + std::to_string(peer) + " on channel " +
           std::to_string(channel);
  }
};

void putU32(uint8_t* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint32_t getU32(const uint8_t* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}

bool wouldBlock(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

class TcpComm : public TransportComm {
 public:
  // LOOM_NSOCKS is read here, once per communicator.
  explicit TcpComm(const TransportCommContext& context)
      : context_(context), sockets_(static_cast<int>(std::clamp<int64_t>(params::nsocks(), 1, kMaxSockets))) {}

  loomResult_t start() {
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return LOOM_FAIL(loomSystemError, NET, "eventfd() for the tcp proxy of rank %d: %m", context_.rank);
    wake_.reset(fd);
    context_.bootstrap->setHandoffHandler(
        [this](int peer, const uint8_t* hello, UniqueFd socket) { arrive(peer, hello, std::move(socket)); });
    return loomSuccess;
  }

  ~TcpComm() override {
    context_.bootstrap->setHandoffHandler(nullptr);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake();
    if (!thread_.joinable()) return;
    thread_.join();
    LOOM_INFO(NET, "rank %d: %llu messages sent and %llu received over tcp", context_.rank,
              static_cast<unsigned long long>(sent_), static_cast<unsigned long long>(received_));
  }

  const TransportCommContext& context() const { return context_; }
  int doorbell() const { return wake_.get(); }
  int sockets() const { return sockets_; }

  // Hands a new connection to the proxy, starting it with the first.
  loomResult_t add(std::shared_ptr<TcpConn> conn) {
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
        return LOOM_FAIL(loomSystemError, NET, "cannot start the tcp proxy thread of rank %d: %s", context_.rank,
                         error.what());
      }
    }
    wake();
    return loomSuccess;
  }

  void wake() {
    uint64_t one = 1;
    if (write(wake_.get(), &one, sizeof(one)) < 0) {
      // The counter is full, so the proxy has a wake-up pending already.
    }
  }

 private:
  struct Arrival {
    int peer;
    int channel;
    int index;
    int count;
    UniqueFd fd;
  };

  // On the bootstrap listener's thread: one of a sender's sockets to this rank.
  void arrive(int peer, const uint8_t* hello, UniqueFd socket) {
    uint32_t magic = getU32(hello), channel = getU32(hello + 4), receiver = getU32(hello + 8);
    uint32_t index = hello[12], count = hello[13];
    if (magic != kHelloMagic || receiver != static_cast<uint32_t>(context_.rank) || count < 1 ||
        count > kMaxSockets || index >= count) {
      LOOM_WARN(NET,
                "tcp: dropped a connection from rank %d: its hello (magic %08x, for rank %u, socket %u of %u) is not "
                "a tcp data connection to this rank",
                peer, magic, receiver, index, count);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    arrived_.push_back({peer, static_cast<int>(channel), static_cast<int>(index), static_cast<int>(count),
                        std::move(socket)});
    wake();
  }

  void run();
  bool adopt();
  bool pumpOut(TcpConn& conn);
  bool pumpIn(TcpConn& conn);
  bool watchLocal(TcpConn& conn);
  void peerClosed(TcpConn& conn);
  void peerGaveUp(TcpConn& conn);
  void fail(TcpConn& conn, const char* what, int error);
  void shut(TcpConn& conn);
  bool finished(const TcpConn& conn) const;
  void nap(int64_t micros);
  bool pass();
  void setSleeping(bool sleeping);

  TransportCommContext context_;
  const int sockets_;  // per connection this rank opens
  UniqueFd wake_;
  std::thread thread_;
  std::mutex mutex_;  // guards what other threads hand the proxy
  std::vector<std::shared_ptr<TcpConn>> added_;
  std::vector<Arrival> arrived_;
  bool stopping_ = false;

  // The proxy thread's.
  std::vector<std::shared_ptr<TcpConn>> conns_;
  // Sockets that arrived before their receiving end was there, or before the rest of their connection.
  std::map<std::pair<int, int>, std::vector<UniqueFd>> waiting_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
};

// Takes what other threads handed over; gives receiving connections their sockets once all have arrived.
bool TcpComm::adopt() {
  std::vector<std::shared_ptr<TcpConn>> added;
  std::vector<Arrival> arrived;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    added.swap(added_);
    arrived.swap(arrived_);
  }
  for (auto& conn : added) {
    if (conn->sends) {
      conn->drain = std::make_unique<FifoReceiver>(conn->fifo.view());
      conn->connected = true;
    } else {
      conn->fill = std::make_unique<FifoSender>(conn->fifo.view());
    }
    conns_.push_back(std::move(conn));
  }
  for (Arrival& arrival : arrived) {
    std::vector<UniqueFd>& sockets = waiting_[{arrival.peer, arrival.channel}];
    if (sockets.empty()) sockets.resize(arrival.count);
    if (static_cast<int>(sockets.size()) != arrival.count || sockets[arrival.index].valid()) {
      LOOM_WARN(NET, "tcp: dropped socket %d of %d from rank %d on channel %d: it does not fit the %zu before it",
                arrival.index, arrival.count, arrival.peer, arrival.channel, sockets.size());
      continue;
    }
    sockets[arrival.index] = std::move(arrival.fd);
  }
  for (auto& conn : conns_) {
    if (conn->connected || conn->closed) continue;
    auto found = waiting_.find({conn->peer, conn->channel});
    if (found == waiting_.end()) continue;
    std::vector<UniqueFd>& sockets = found->second;
    if (!std::all_of(sockets.begin(), sockets.end(), [](const UniqueFd& fd) { return fd.valid(); })) continue;
    conn->socks.clear();
    conn->socks.resize(sockets.size());
    for (size_t j = 0; j < sockets.size(); ++j) conn->socks[j].fd = std::move(sockets[j]);
    conn->connected = true;
    waiting_.erase(found);
    LOOM_TRACE(NET, "tcp: connected %s over %zu socket(s)", conn->name().c_str(), conn->socks.size());
  }
  return !added.empty() || !arrived.empty();
}

// Sending side: whatever the executor posted goes out, message by message, as far as the sockets take it.
bool TcpComm::pumpOut(TcpConn& conn) {
  bool progressed = false;
  for (;;) {
    if (!conn.inFrame) {
      size_t bytes = 0;
      bool direct = false;
      const void* data = conn.drain->pollAny(&bytes, &conn.protocol, &direct);
      if (data == nullptr) return progressed;
      if (direct) {
        // The payload lies in this process's memory, where the executor left it for the proxy to send from.
        const auto* descriptor = static_cast<const DirectDescriptor*>(data);
        if (descriptor->pid != getpid() || descriptor->bytes > fifoPayloadBytes(conn.shape, Protocol::kSimple)) {
          fail(conn, "was given a direct message that is not in this process's memory", 0);
          return true;
        }
        data = reinterpret_cast<const void*>(descriptor->address);
        bytes = descriptor->bytes;
      }
      putU32(conn.frame, static_cast<uint32_t>(bytes));
      putU32(conn.frame + 4, static_cast<uint32_t>(conn.protocol));
      conn.frameDone = 0;
      conn.payload = static_cast<std::byte*>(const_cast<void*>(data));
      conn.payloadBytes = bytes;
      conn.startParts();
      conn.inFrame = true;
    }
    for (size_t j = 0; j < conn.socks.size(); ++j) {
      TcpSocket& sock = conn.socks[j];
      while (!sock.finished() || (j == 0 && conn.frameDone < kFrameHeaderBytes)) {
        iovec parts[2];
        int count = 0;
        if (j == 0 && conn.frameDone < kFrameHeaderBytes)
          parts[count++] = {conn.frame + conn.frameDone, kFrameHeaderBytes - conn.frameDone};
        if (!sock.finished()) parts[count++] = {conn.payload + sock.begin + sock.done, sock.end - sock.begin - sock.done};
        msghdr message{};
        message.msg_iov = parts;
        message.msg_iovlen = count;
        ssize_t n = sendmsg(sock.fd.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (wouldBlock(errno)) {
            sock.wantWrite = true;
            break;
          }
          fail(conn, "could not send", errno);
          return true;
        }
        sock.wantWrite = false;
        progressed = true;
        size_t sent = static_cast<size_t>(n);
        if (j == 0) {
          size_t toHeader = std::min(sent, kFrameHeaderBytes - conn.frameDone);
          conn.frameDone += toHeader;
          sent -= toHeader;
        }
        sock.done += sent;
      }
    }
    if (conn.frameDone < kFrameHeaderBytes || !conn.partsFinished()) return progressed;
    conn.drain->release();
    conn.inFrame = false;
    ++sent_;
  }
}

// Receiving side: frames from the sockets go into the executor's FIFO, each once a slot is free for it.
bool TcpComm::pumpIn(TcpConn& conn) {
  bool progressed = false;
  for (;;) {
    if (!conn.inFrame) {
      TcpSocket& first = conn.socks[0];
      ssize_t n = recv(first.fd.get(), conn.frame + conn.frameDone, kFrameHeaderBytes - conn.frameDone, MSG_DONTWAIT);
      if (n == 0) {
        if (conn.frameDone == 0) {
          peerClosed(conn);
        } else {
          fail(conn, "was closed by the peer in the middle of a frame header", 0);
        }
        return true;
      }
      if (n < 0) {
        if (wouldBlock(errno)) return progressed;
        fail(conn, "could not receive", errno);
        return true;
      }
      progressed = true;
      conn.frameDone += static_cast<size_t>(n);
      if (conn.frameDone < kFrameHeaderBytes) continue;
      uint32_t bytes = getU32(conn.frame), protocol = getU32(conn.frame + 4);
      if (protocol == kAbortNotice) {
        peerGaveUp(conn);
        return true;
      }
      if (protocol > static_cast<uint32_t>(Protocol::kLL) ||
          bytes > fifoPayloadBytes(conn.shape, static_cast<Protocol>(protocol))) {
        LOOM_WARN(NET, "tcp: connection %s: a frame of %u bytes with protocol %u; at most %zu (Simple) or %zu (LL)",
                  conn.name().c_str(), bytes, protocol, fifoPayloadBytes(conn.shape, Protocol::kSimple),
                  fifoPayloadBytes(conn.shape, Protocol::kLL));
        fail(conn, "carried a malformed frame", 0);
        return true;
      }
      conn.protocol = static_cast<Protocol>(protocol);
      conn.payloadBytes = bytes;
      conn.payload = nullptr;
      conn.startParts();
      conn.inFrame = true;
    }
    if (conn.payload == nullptr) {
      conn.payload = static_cast<std::byte*>(conn.fill->reserve(conn.protocol));
      conn.wantSlot = conn.payload == nullptr;
      if (conn.wantSlot) return progressed;
    }
    for (TcpSocket& sock : conn.socks) {
      while (!sock.finished()) {
        ssize_t n = recv(sock.fd.get(), conn.payload + sock.begin + sock.done, sock.end - sock.begin - sock.done,
                         MSG_DONTWAIT);
        if (n == 0) {
          fail(conn, "was closed by the peer in the middle of a message", 0);
          return true;
        }
        if (n < 0) {
          if (wouldBlock(errno)) break;
          fail(conn, "could not receive", errno);
          return true;
        }
        progressed = true;
        sock.done += static_cast<size_t>(n);
      }
    }
    if (!conn.partsFinished()) return progressed;
    conn.fill->post(conn.protocol, conn.payloadBytes);
    ++received_;
    conn.inFrame = false;
    conn.frameDone = 0;
    progressed = true;
  }
}

// An executor that gave up marked its FIFO aborted: the peer hears of it through an abort notice, or through the
// sockets closing.
bool TcpComm::watchLocal(TcpConn& conn) {
  if (conn.closed || conn.fifo.view().header->aborted.load(std::memory_order_relaxed) == 0) return false;
  LOOM_INFO(NET, "tcp: connection %s: this rank gave up on it; closing", conn.name().c_str());
  // Best effort: socket 0 of a sending end may be in the middle of a frame, and then the peer sees the connection
  // lost instead.
  if (!conn.socks.empty() && conn.socks[0].fd.valid() && (!conn.sends || !conn.inFrame)) {
    uint8_t notice[kFrameHeaderBytes];
    putU32(notice, 0);
    putU32(notice + 4, kAbortNotice);
    if (send(conn.socks[0].fd.get(), notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
      // The peer learns of it from the socket closing instead.
    }
  }
  shut(conn);
  return true;
}

// The peer closed between frames: it finished with this communicator. Should the executor wait on this FIFO
// again, it finds it aborted and names the peer.
void TcpComm::peerClosed(TcpConn& conn) {
  LOOM_INFO(NET, "tcp: connection %s: the peer closed it", conn.name().c_str());
  conn.fifo.view().header->aborted.store(kConnectionLost, std::memory_order_relaxed);
  shut(conn);
}

void TcpComm::peerGaveUp(TcpConn& conn) {
  LOOM_INFO(NET, "tcp: connection %s: the peer gave up on it", conn.name().c_str());
  conn.fifo.view().header->aborted.store(kAbortedByPeer, std::memory_order_relaxed);
  shut(conn);
}

void TcpComm::fail(TcpConn& conn, const char* what, int error) {
  if (error != 0) {
    LOOM_WARN(NET, "tcp: connection %s %s: %s", conn.name().c_str(), what, std::strerror(error));
  } else {
    LOOM_WARN(NET, "tcp: connection %s %s", conn.name().c_str(), what);
  }
  conn.fifo.view().header->aborted.store(kConnectionLost, std::memory_order_relaxed);
  shut(conn);
}

void TcpComm::shut(TcpConn& conn) {
  for (TcpSocket& sock : conn.socks) {
    if (sock.fd.valid()) shutdown(sock.fd.get(), SHUT_RDWR);
    sock.fd.reset();
  }
  conn.closed = true;
}

// Nothing more to do for a connection whose endpoint is gone: a receiving one at once, a sending one once what
// its executor posted has left.
bool TcpComm::finished(const TcpConn& conn) const {
  if (conn.closed) return conn.released.load();
  if (!conn.released.load()) return false;
  if (!conn.sends) return true;
  return !conn.inFrame && conn.fifo.view().header->head.load(std::memory_order_acquire) ==
                              conn.fifo.view().header->tail.load(std::memory_order_acquire);
}

// Sleeps until a socket needs the proxy, the eventfd (the doorbell) rings, or `micros` pass (0: only looks).
void TcpComm::nap(int64_t micros) {
  std::vector<pollfd> fds;
  fds.push_back({wake_.get(), POLLIN, 0});
  std::vector<TcpConn*> polled;
  for (auto& conn : conns_) {
    if (!conn->connected || conn->closed) continue;
    for (size_t j = 0; j < conn->socks.size(); ++j) {
      const TcpSocket& sock = conn->socks[j];
      short events = 0;
      if (conn->sends) {
        // A sending socket turns readable only when the peer gave up, closed it or broke it.
        events = static_cast<short>(POLLIN | (sock.wantWrite ? POLLOUT : 0));
      } else if (!conn->wantSlot && (j == 0 ? !conn->inFrame || !sock.finished() : conn->inFrame && !sock.finished())) {
        events = POLLIN;  // data is expected on it
      }
      fds.push_back({sock.fd.get(), events, 0});
      polled.push_back(conn.get());
    }
  }
  timespec timeout{0, static_cast<long>(micros * 1000)};
  if (ppoll(fds.data(), fds.size(), &timeout, nullptr) <= 0) return;
  if (fds[0].revents & POLLIN) {
    uint64_t count = 0;
    if (read(wake_.get(), &count, sizeof(count)) < 0) {
      // Another look drained it first: the eventfd is non-blocking.
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    TcpConn& conn = *polled[i - 1];
    if (!conn.sends || conn.closed || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    // The receiving end only ever sends an abort notice.
    uint8_t notice[kFrameHeaderBytes];
    ssize_t n = recv(fds[i].fd, notice, sizeof(notice), MSG_DONTWAIT);
    if (n == 0) {
      peerClosed(conn);
    } else if (n < 0 && !wouldBlock(errno)) {
      fail(conn, "broke", errno);
    } else if (n > 0) {
      peerGaveUp(conn);
    }
  }
}

// One round over every connection; whether anything moved.
bool TcpComm::pass() {
  bool progressed = adopt();
  for (auto& conn : conns_) {
    if (watchLocal(*conn) || conn->closed || !conn->connected) continue;
    progressed |= conn->sends ? pumpOut(*conn) : pumpIn(*conn);
  }
  for (auto& conn : conns_) {
    if (!finished(*conn) || conn->closed) continue;
    for (TcpSocket& sock : conn->socks) {
      if (sock.fd.valid()) shutdown(sock.fd.get(), SHUT_WR);
      sock.fd.reset();
    }
    conn->closed = true;
  }
  std::erase_if(conns_, [](const std::shared_ptr<TcpConn>& conn) { return conn->closed && conn->released.load(); });
  return progressed;
}

// Tells every FIFO's executor side whether the proxy sleeps, so that it rings the doorbell (fifo.h).
void TcpComm::setSleeping(bool sleeping) {
  for (auto& conn : conns_)
    conn->fifo.view().header->sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void TcpComm::run() {
  static const int64_t yieldUs = params::yieldUs();
  Clock::time_point idleSince = Clock::now();
  bool idle = false;
  std::optional<Deadline> flushBy;  // set once the communicator is being destroyed
  for (;;) {
    bool progressed = pass();
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping = stopping_;
    }
    if (stopping) {
      if (!flushBy) flushBy.emplace(context_.timeoutMs);
      if (conns_.empty()) break;
      if (flushBy->expired()) {
        LOOM_WARN(NET, "tcp: rank %d: %zu connection(s) still had messages to send after %lld ms; closing them",
                  context_.rank, conns_.size(), static_cast<long long>(flushBy->timeoutMs()));
        break;
      }
    }
    if (progressed) {
      idle = false;
      continue;
    }
    if (!idle) {
      idle = true;
      idleSince = Clock::now();
    }
    auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - idleSince).count();
    if (waited < yieldUs) {
      nap(0);
      sched_yield();
      continue;
    }
    // Sleep until a socket, the doorbell or the eventfd wakes the proxy: set `sleeping` first, then look once
    // more, so that a message posted meanwhile is either seen now or rings.
    setSleeping(true);
    if (!pass()) nap(kSleepBackstopUs);
    setSleeping(false);
  }
  for (auto& conn : conns_) shut(*conn);
  conns_.clear();
  waiting_.clear();
}

class TcpEndpoint : public Endpoint {
 public:
  TcpEndpoint(TcpComm* comm, std::shared_ptr<TcpConn> conn) : comm_(comm), conn_(std::move(conn)) {}
  ~TcpEndpoint() override {
    conn_->released.store(true);
    comm_->wake();
  }
  FifoMemory fifo() override { return conn_->fifo.view(); }

 private:
  TcpComm* comm_;
  std::shared_ptr<TcpConn> conn_;
};

class TcpTransport : public Transport {
 public:
  const char* name() const override { return "tcp"; }

  bool canConnect(const PeerInfo&, const PeerInfo&, std::string*) const override { return true; }
  bool movesByProxy() const override { return true; }

  loomResult_t openComm(const TransportCommContext& context, std::unique_ptr<TransportComm>* out) override {
    auto comm = std::make_unique<TcpComm>(context);
    LOOM_CHECK(comm->start());
    *out = std::move(comm);
    return loomSuccess;
  }

  loomResult_t createReceiver(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                              std::unique_ptr<Endpoint>* out) override {
    auto* comm = static_cast<TcpComm*>(state);
    auto conn = std::make_shared<TcpConn>(false, key.sender, key.channel, shape, 0, comm->doorbell());
    if (!conn->fifo.valid())
      return LOOM_FAIL(loomSystemError, NET, "tcp: cannot allocate %zu bytes for the FIFO %s", conn->fifo.bytes(),
                       conn->name().c_str());
    LOOM_CHECK(comm->add(conn));
    *out = std::make_unique<TcpEndpoint>(comm, std::move(conn));
    return loomSuccess;
  }

  loomResult_t attachSender(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                            const WaitCheck& check, std::unique_ptr<Endpoint>* out) override {
    auto* comm = static_cast<TcpComm*>(state);
    LOOM_CHECK(check());
    const int sockets = comm->sockets();
    auto conn = std::make_shared<TcpConn>(true, key.receiver, key.channel, shape, sockets, comm->doorbell());
    if (!conn->fifo.valid())
      return LOOM_FAIL(loomSystemError, NET, "tcp: cannot allocate %zu bytes for the FIFO %s", conn->fifo.bytes(),
                       conn->name().c_str());
    for (int j = 0; j < sockets; ++j) {
      uint8_t hello[kHandoffHelloBytes] = {};
      putU32(hello, kHelloMagic);
      putU32(hello + 4, static_cast<uint32_t>(key.channel));
      putU32(hello + 8, static_cast<uint32_t>(key.receiver));
      hello[12] = static_cast<uint8_t>(j);
      hello[13] = static_cast<uint8_t>(sockets);
      LOOM_CHECK(comm->context().bootstrap->connectHandoff(key.receiver, hello, comm->context().timeoutMs,
                                                           &conn->socks[j].fd));
    }
    LOOM_CHECK(comm->add(conn));
    *out = std::make_unique<TcpEndpoint>(comm, std::move(conn));
    return loomSuccess;
  }
};

}  // namespace

Transport* tcpTransport() {
  static TcpTransport transport;
  return &transport;
}

}  // namespace loom
