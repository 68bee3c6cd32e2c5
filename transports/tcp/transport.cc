// tcp: connections between ranks on different hosts (or any ranks, when LOOM_TRANSPORTS asks for it) over TCP.
//
// A proxied transport (proxy.h): each end keeps a FIFO in its own memory and the communicator's proxy thread moves
// the messages. On the sending rank it drains the FIFO the executor posts into, frame by frame, into the
// connection's sockets; on the receiving rank it reads frames from the sockets and posts them into the FIFO the
// executor reads, as a local sender would. Flow control is the receiver's credit: the proxy reads a frame's
// payload only once a slot is free for it, and TCP's window holds the sender back meanwhile.
//
// A connection is LOOM_NSOCKS sockets (the sender's setting; the receiver learns it from the hellos), each opened
// through the bootstrap's listener (Bootstrap::connectHandoff), which authenticates it with the communicator's
// secret; the opener's hello names the channel, the socket's index and the count. Wire format per message, on
// socket 0: u32 payload bytes, u32 protocol (0 Simple, 1 LL), then the payload's first part. A Simple payload of
// kStripeMinBytes or more is cut into one part per socket (stripe() in proxy.h decides, from the size alone, so the
// receiver cuts it the same way), and socket j carries part j with nothing around it; anything smaller travels
// whole on socket 0. Several sockets help where a network caps each flow, as clouds do. LL messages travel as
// their payload and get the receiving FIFO's flags on arrival. A DirectDescriptor posted by this process's
// executor (Links::proxySends) is sent from the memory it names, sparing the copy into the FIFO (under
// LOOM_CHECKSUM the checksum after the descriptor follows it on the wire: the receiver sees the same frame); the
// executor's call ends only once the proxy has released it.
//
// Sent again (LOOM_CHECKSUM=2, TcpComm::holds_): the sending proxy keeps each message in its FIFO, unreleased, after
// it went, and the receiving proxy sends notices back on socket 0 (a frame header: the low 32 bits of a number in
// the size field, the kind in the protocol field): kReleasedNotice, every message before the count was released by
// the receiving executor, which checked it, so the sender releases them too; kAgainNotice, the executor asks for
// that message again (FifoReceiver::askResend), and the sender sends it once more, after the frame on its way,
// with kSentAgain in the protocol field, which the receiving proxy writes into the slot the executor kept
// (FifoSender::rewriteAt). The sender's FIFO depth bounds what is in flight, so the receiving FIFO always has a
// slot for what precedes the message sent again: nothing waits on the message the executor waits for.
//
// Failure: an executor that gives up has the proxy send an abort notice (a frame header with protocol
// kAbortNotice and the failure behind it, in either direction, on socket 0) before it shuts the sockets, so the peer tells a rank that gave
// up from one that vanished (its sockets closed or reset). A finished sender shuts its sockets for writing: the
// receiver reads the end between frames.
#include "transports/proxy.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "src/base/bootstrap.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/socket.h"

namespace loom {
namespace {

constexpr uint32_t kHelloMagic = 0x6c746370;  // opens the hello of a tcp data connection
constexpr size_t kFrameHeaderBytes = 8;
constexpr uint32_t kAbortNotice = 0xab0f;  // in a frame header's protocol field: the sender's executor gave up

// An abort notice carries the failure behind it (the low 48 bits of packOrigin) in the header's size field and
// the protocol field's top half.
void putAbortNotice(uint8_t* header, uint64_t origin) {
  putU32(header, static_cast<uint32_t>(origin));
  putU32(header + 4, kAbortNotice | static_cast<uint32_t>((origin >> 32) & 0xffff) << 16);
}
bool isAbortNotice(uint32_t protocol) { return (protocol & 0xffff) == kAbortNotice; }
// Notices back under LOOM_CHECKSUM=2 (above), and the mark of a message sent again in a data frame's protocol field.
constexpr uint32_t kReleasedNotice = 0xac0f;
constexpr uint32_t kAgainNotice = 0xae0f;
constexpr uint32_t kSentAgain = 0x100;
uint64_t abortNoticeOrigin(const uint8_t* header) {
  return getU32(header) | static_cast<uint64_t>(getU32(header + 4) >> 16) << 32;
}
constexpr int kMaxSockets = 16;

// One socket of a connection, and its share of the message in flight.
struct TcpSocket {
  UniqueFd fd;
  size_t begin = 0;  // the part of the payload this socket carries
  size_t end = 0;
  size_t done = 0;  // bytes of it moved so far
  bool wantWrite = false;  // its buffer is full
  bool finished() const { return begin + done == end; }
};

struct TcpConn : ProxyConn {
  TcpConn(bool sends, int peer, int channel, const FifoShape& shape, int sockets, int doorbell)
      : ProxyConn(sends, peer, channel, shape, doorbell), socks(sockets) {}

  std::vector<TcpSocket> socks;  // receiving side: empty until all the sender's sockets arrived
  uint8_t frame[kFrameHeaderBytes] = {};
  size_t frameDone = 0;
  // A notice back on socket 0: being read (sending side, backDone bytes of it so far), or being sent (receiving
  // side, backDone of backBytes).
  uint8_t back[kFrameHeaderBytes] = {};
  size_t backDone = 0;
  size_t backBytes = 0;
  uint64_t ackedTo = 0;   // receiving side, holding: the release count last told the sender
  uint64_t askedFor = 0;  // ... the number, plus one, of the message last asked for again

  bool owesPeer() const override {
    if (!holds || sends || closed) return false;
    const FifoHeader* header = fifo.view().header;
    return backDone < backBytes || header->tail.load(std::memory_order_acquire) > ackedTo ||
           header->resendWanted.load(std::memory_order_acquire) > askedFor;
  }

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
};


class TcpComm : public ProxyComm {
 public:
  // LOOM_NSOCKS and LOOM_TCP_CALLER_PROGRESS are read here, once per communicator.
  explicit TcpComm(const TransportCommContext& context)
      : ProxyComm(context, "tcp"),
        sockets_(static_cast<int>(std::clamp<int64_t>(params::nsocks(), 1, kMaxSockets))),
        callerProgress_(params::tcpCallerProgress() != 0),
        holds_(context.checksumResend) {}

  loomResult_t start() {
    LOOM_CHECK(openDoorbell());
    context().bootstrap->setHandoffHandler(
        kHelloMagic, [this](int peer, const uint8_t* hello, UniqueFd socket) { arrive(peer, hello, std::move(socket)); });
    return loomSuccess;
  }

  ~TcpComm() override {
    context().bootstrap->setHandoffHandler(kHelloMagic, nullptr);
    stopProxy();
  }

  int sockets() const { return sockets_; }
  bool holds() const { return holds_; }
  // Non-blocking sockets: any thread may run a pass over them (LOOM_TCP_CALLER_PROGRESS).
  bool progressesFromCaller() const override { return callerProgress_; }
  // The interface of the listener peers connect to: where their data arrives, and, routes being symmetric on
  // a cluster, where this rank's leaves.
  std::string netDevice() const override { return interfaceHolding(context().bootstrap->listenAddress()); }

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
    if (magic != kHelloMagic || receiver != static_cast<uint32_t>(context().rank) || count < 1 ||
        count > kMaxSockets || index >= count) {
      LOOM_WARN(NET,
                "tcp: dropped a connection from rank %d: its hello (magic %08x, for rank %u, socket %u of %u) is not "
                "a tcp data connection to this rank",
                peer, magic, receiver, index, count);
      return;
    }
    std::lock_guard<std::mutex> lock(arrivedMutex_);
    arrived_.push_back({peer, static_cast<int>(channel), static_cast<int>(index), static_cast<int>(count),
                        std::move(socket)});
    wake();
  }

  bool adoptExtra() override;
  bool pump(ProxyConn& conn) override {
    auto& tcp = static_cast<TcpConn&>(conn);
    return tcp.sends ? pumpOut(tcp) : pumpIn(tcp);
  }
  void notifyGaveUp(ProxyConn& conn) override;
  void shutNetwork(ProxyConn& conn, bool graceful) override;
  void sleep(int64_t micros) override;
  bool pumpOut(TcpConn& conn);
  bool pumpIn(TcpConn& conn);
  bool readBack(TcpConn& conn);
  bool sendBack(TcpConn& conn);

  const int sockets_;  // per connection this rank opens
  const bool callerProgress_;
  const bool holds_;  // LOOM_CHECKSUM=2: connections keep what they sent until the far end checked it (above)
  std::mutex arrivedMutex_;
  std::vector<Arrival> arrived_;
  // The proxy thread's: sockets that arrived before their receiving end was there, or before the rest of their
  // connection.
  std::map<std::pair<int, int>, std::vector<UniqueFd>> waiting_;
};

// Gives receiving connections their sockets once all have arrived.
bool TcpComm::adoptExtra() {
  std::vector<Arrival> arrived;
  {
    std::lock_guard<std::mutex> lock(arrivedMutex_);
    arrived.swap(arrived_);
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
    auto& tcp = static_cast<TcpConn&>(*conn);
    tcp.socks.clear();
    tcp.socks.resize(sockets.size());
    for (size_t j = 0; j < sockets.size(); ++j) tcp.socks[j].fd = std::move(sockets[j]);
    tcp.connected = true;
    waiting_.erase(found);
    LOOM_TRACE(NET, "tcp: connected %s over %zu socket(s)", tcp.name().c_str(), tcp.socks.size());
  }
  return !arrived.empty();
}

// Sending side: whatever the executor posted goes out, message by message, as far as the sockets take it.
bool TcpComm::pumpOut(TcpConn& conn) {
  // Holding, the receiver's notices come back all the time: the window moves only with them.
  bool progressed = conn.holds && readBack(conn);
  if (conn.closed) return true;
  for (;;) {
    if (!conn.inFrame) {
      bool bad = false;
      if (!nextOutgoing(conn, &bad)) {
        if (bad) fail(conn, "was given a direct message that is not in this process's memory");
        return progressed || bad;
      }
      putU32(conn.frame, static_cast<uint32_t>(conn.payloadBytes));
      putU32(conn.frame + 4, static_cast<uint32_t>(conn.protocol) | (conn.sendingAgain ? kSentAgain : 0));
      conn.frameDone = 0;
      conn.startParts();
      conn.inFrame = true;
    }
    for (size_t j = 0; j < conn.socks.size(); ++j) {
      TcpSocket& sock = conn.socks[j];
      while (!sock.finished() || (j == 0 && conn.frameDone < kFrameHeaderBytes)) {
        iovec parts[3];
        int count = 0;
        if (j == 0 && conn.frameDone < kFrameHeaderBytes)
          parts[count++] = {conn.frame + conn.frameDone, kFrameHeaderBytes - conn.frameDone};
        if (!sock.finished()) count += outgoingPieces(conn, sock.begin + sock.done, sock.end, parts + count);
        msghdr message{};
        message.msg_iov = parts;
        message.msg_iovlen = count;
        ssize_t n = sendmsg(sock.fd.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (wouldBlock(errno)) {
            sock.wantWrite = true;
            break;
          }
          const int error = errno;
          // A receiver that gave up sent its notice back before it shut the socket: that, if it came, says why.
          readBack(conn);
          if (!conn.closed) fail(conn, "could not send", error);
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
    if (conn.sendingAgain) {
      LOOM_INFO(NET, "tcp: connection %s: sent message %llu again, as the receiver asked (LOOM_CHECKSUM=2)",
                conn.name().c_str(), static_cast<unsigned long long>(conn.againWanted - 1));
      conn.againWanted = 0;
      conn.sendingAgain = false;
    } else if (conn.holds) {
      ++conn.nextToSend;  // kept until the receiver's release comes back
    } else {
      conn.drain->release();
    }
    conn.inFrame = false;
    ++sent_;
  }
}

// Sending side: the notices the receiving end sends back on socket 0, as far as they have come: an abort notice,
// and on a holding connection its executor's releases and requests. Whether anything came (the connection may
// have ended).
bool TcpComm::readBack(TcpConn& conn) {
  bool progressed = false;
  while (!conn.closed && !conn.socks.empty() && conn.socks[0].fd.valid()) {
    ssize_t n = recv(conn.socks[0].fd.get(), conn.back + conn.backDone, kFrameHeaderBytes - conn.backDone, MSG_DONTWAIT);
    if (n == 0) {
      if (conn.backDone == 0) {
        peerClosed(conn);
      } else {
        fail(conn, "was closed by the peer in the middle of a notice");
      }
      return true;
    }
    if (n < 0) {
      if (wouldBlock(errno)) return progressed;
      fail(conn, "broke", errno);
      return true;
    }
    progressed = true;
    conn.backDone += static_cast<size_t>(n);
    if (conn.backDone < kFrameHeaderBytes) continue;
    conn.backDone = 0;
    const uint32_t low = getU32(conn.back), kind = getU32(conn.back + 4);
    if (isAbortNotice(kind)) {
      peerGaveUp(conn, abortNoticeOrigin(conn.back));
      return true;
    }
    // A count or number from the last release on: what is in flight is far less than 2^32 messages.
    const uint64_t released = conn.drain->released();
    const uint64_t number = released + static_cast<uint32_t>(low - static_cast<uint32_t>(released));
    if (conn.holds && kind == kReleasedNotice && number <= conn.nextToSend) {
      conn.drain->releaseThrough(number);
    } else if (conn.holds && kind == kAgainNotice && number < conn.nextToSend && conn.againWanted == 0) {
      LOOM_INFO(NET, "tcp: connection %s: the receiver asks for message %llu again", conn.name().c_str(),
                static_cast<unsigned long long>(number));
      conn.againWanted = number + 1;
    } else {
      LOOM_WARN(NET, "tcp: connection %s: a notice back of kind %08x for message %llu (%llu sent, %llu released)",
                conn.name().c_str(), kind, static_cast<unsigned long long>(number),
                static_cast<unsigned long long>(conn.nextToSend), static_cast<unsigned long long>(released));
      fail(conn, "had a notice back that is not one of its own");
      return true;
    }
  }
  return progressed;
}

// Receiving side, holding: tells the sender what the executor released since the last notice, and which message it
// asks for again, one notice at a time. Whether anything went.
bool TcpComm::sendBack(TcpConn& conn) {
  bool progressed = false;
  for (;;) {
    if (conn.backDone == conn.backBytes) {
      const FifoHeader* header = conn.fifo.view().header;
      const uint64_t wanted = header->resendWanted.load(std::memory_order_acquire);
      const uint64_t released = header->tail.load(std::memory_order_acquire);
      if (wanted > conn.askedFor) {
        putU32(conn.back, static_cast<uint32_t>(wanted - 1));
        putU32(conn.back + 4, kAgainNotice);
        conn.askedFor = wanted;
      } else if (released > conn.ackedTo) {
        putU32(conn.back, static_cast<uint32_t>(released));
        putU32(conn.back + 4, kReleasedNotice);
        conn.ackedTo = released;
      } else {
        return progressed;
      }
      conn.backDone = 0;
      conn.backBytes = kFrameHeaderBytes;
    }
    TcpSocket& first = conn.socks[0];
    ssize_t n = send(first.fd.get(), conn.back + conn.backDone, conn.backBytes - conn.backDone,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (wouldBlock(errno)) {
        first.wantWrite = true;
        return progressed;
      }
      fail(conn, "could not send a notice back", errno);
      return true;
    }
    first.wantWrite = false;
    progressed = true;
    conn.backDone += static_cast<size_t>(n);
  }
}

// Receiving side: frames from the sockets go into the executor's FIFO, each once a slot is free for it.
bool TcpComm::pumpIn(TcpConn& conn) {
  bool progressed = conn.holds && sendBack(conn);
  if (conn.closed) return true;
  for (;;) {
    if (!conn.inFrame) {
      TcpSocket& first = conn.socks[0];
      ssize_t n = recv(first.fd.get(), conn.frame + conn.frameDone, kFrameHeaderBytes - conn.frameDone, MSG_DONTWAIT);
      if (n == 0) {
        if (conn.frameDone == 0) {
          peerClosed(conn);
        } else {
          fail(conn, "was closed by the peer in the middle of a frame header");
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
      if (isAbortNotice(protocol)) {
        peerGaveUp(conn, abortNoticeOrigin(conn.frame));
        return true;
      }
      conn.sendingAgain = (protocol & kSentAgain) != 0;
      protocol &= ~kSentAgain;
      if (conn.sendingAgain && (!conn.holds || conn.askedFor == 0)) {
        fail(conn, "was sent a message again that this end did not ask for");
        return true;
      }
      if (protocol > static_cast<uint32_t>(Protocol::kLL) ||
          bytes > fifoPayloadBytes(conn.shape, static_cast<Protocol>(protocol))) {
        LOOM_WARN(NET, "tcp: connection %s: a frame of %u bytes with protocol %u; at most %zu (Simple) or %zu (LL)",
                  conn.name().c_str(), bytes, protocol, fifoPayloadBytes(conn.shape, Protocol::kSimple),
                  fifoPayloadBytes(conn.shape, Protocol::kLL));
        fail(conn, "carried a malformed frame");
        return true;
      }
      conn.protocol = static_cast<Protocol>(protocol);
      conn.payloadBytes = bytes;
      conn.payload = nullptr;
      conn.startParts();
      conn.inFrame = true;
    }
    if (conn.payload == nullptr && conn.sendingAgain) {
      // Into the slot the executor kept for it.
      conn.payload = static_cast<std::byte*>(conn.fill->rewriteAt(conn.askedFor - 1, conn.protocol, conn.payloadBytes));
      if (conn.payload == nullptr) {
        fail(conn, "was sent a message again that the executor no longer waits for");
        return true;
      }
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
          fail(conn, "was closed by the peer in the middle of a message");
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
    corruptInTransit(conn.payload, conn.payloadBytes);  // the fault hook (LOOM_FAULT_CORRUPT), as the message lands
    if (conn.sendingAgain) {
      conn.fill->repost();
      conn.sendingAgain = false;
    } else {
      conn.fill->post(conn.protocol, conn.payloadBytes);
    }
    ++received_;
    conn.inFrame = false;
    conn.frameDone = 0;
    progressed = true;
  }
}

void TcpComm::notifyGaveUp(ProxyConn& conn) {
  auto& tcp = static_cast<TcpConn&>(conn);
  // Best effort: socket 0 of a sending end may be in the middle of a frame, and then the peer sees the connection
  // lost instead.
  if (tcp.socks.empty() || !tcp.socks[0].fd.valid() || (tcp.sends && tcp.inFrame)) return;
  if (!tcp.sends && tcp.backDone != tcp.backBytes) return;  // ... or the receiving end in the middle of a notice
  uint8_t notice[kFrameHeaderBytes];
  putAbortNotice(notice, conn.localOrigin());
  if (send(tcp.socks[0].fd.get(), notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    // The peer learns of it from the socket closing instead.
  }
}

void TcpComm::shutNetwork(ProxyConn& conn, bool graceful) {
  for (TcpSocket& sock : static_cast<TcpConn&>(conn).socks) {
    if (sock.fd.valid()) shutdown(sock.fd.get(), graceful ? SHUT_WR : SHUT_RDWR);
    sock.fd.reset();
  }
}

// Sleeps until a socket needs the proxy, the doorbell rings, or `micros` pass (0: only looks).
void TcpComm::sleep(int64_t micros) {
  std::vector<pollfd> fds;
  fds.push_back({doorbell(), POLLIN, 0});
  std::vector<TcpConn*> polled;
  for (auto& conn : conns_) {
    auto& tcp = static_cast<TcpConn&>(*conn);
    if (!tcp.connected || tcp.closed) continue;
    for (size_t j = 0; j < tcp.socks.size(); ++j) {
      const TcpSocket& sock = tcp.socks[j];
      short events = 0;
      if (tcp.sends) {
        // A sending socket turns readable only when the peer gave up, closed it or broke it.
        events = static_cast<short>(POLLIN | (sock.wantWrite ? POLLOUT : 0));
      } else if (!tcp.wantSlot && (j == 0 ? !tcp.inFrame || !sock.finished() : tcp.inFrame && !sock.finished())) {
        events = POLLIN;  // data is expected on it
      }
      if (!tcp.sends && j == 0 && sock.wantWrite) events |= POLLOUT;  // a notice back waits for room
      fds.push_back({sock.fd.get(), events, 0});
      polled.push_back(&tcp);
    }
  }
  timespec timeout{0, static_cast<long>(micros * 1000)};
  if (ppoll(fds.data(), fds.size(), &timeout, nullptr) <= 0) return;
  if (fds[0].revents & POLLIN) drainDoorbell();
  for (size_t i = 1; i < fds.size(); ++i) {
    TcpConn& conn = *polled[i - 1];
    if (!conn.sends || conn.closed || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    if (fds[i].fd == conn.socks[0].fd.get()) {
      readBack(conn);  // the receiving end's notices
    } else {
      // The other sockets carry nothing back: readable means closed or broken.
      char byte;
      ssize_t n = recv(fds[i].fd, &byte, 1, MSG_DONTWAIT);
      if (n == 0) {
        peerClosed(conn);
      } else if (n != 0 && !(n < 0 && wouldBlock(errno))) {
        fail(conn, "broke", n < 0 ? errno : 0);
      }
    }
  }
}

class TcpTransport : public Transport {
 public:
  const char* name() const override { return "tcp"; }

  bool canConnect(const PeerInfo&, const PeerInfo&, std::string*) const override { return true; }
  TransportTraits traits() const override {
    TransportTraits traits;
    traits.movesByProxy = traits.proxySendsFromCallerMemory = traits.proxySendsChecksumAfterCallerMemory = true;
    traits.proxyResends = true;
    // Each message costs system calls and wakeups of both proxies and executors: larger ones move more per byte.
    traits.networkSlotBytes = static_cast<size_t>(std::max<int64_t>(0, params::tcpSlotBytes()));
    return traits;
  }

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
    conn->holds = comm->holds();
    return comm->attach(std::move(conn), out);
  }

  loomResult_t attachSender(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                            const WaitCheck& check, std::unique_ptr<Endpoint>* out) override {
    auto* comm = static_cast<TcpComm*>(state);
    LOOM_CHECK(check());
    const int sockets = comm->sockets();
    auto conn = std::make_shared<TcpConn>(true, key.receiver, key.channel, shape, sockets, comm->doorbell());
    conn->holds = comm->holds();
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
    conn->connected = true;
    return comm->attach(std::move(conn), out);
  }
};

}  // namespace

Transport* tcpTransport() {
  static TcpTransport transport;
  return &transport;
}

}  // namespace loom
