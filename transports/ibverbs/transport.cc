// ib, the data path: work completions, clear-to-send and data writes, LL and striped messages, the control
// sockets (ready, abort notices, bye), and the proxy's sleep on the completion channel and the sockets
// (ib_comm.h describes the design).
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "src/base/bootstrap.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/socket.h"
#include "transports/ibverbs/ib_comm.h"
#include "transports/ibverbs/verbs.h"
#include "transports/proxy.h"

namespace loom::ib {


bool IbComm::postRecv(IbConn& conn, int qp) {
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, qp, conn.id);
  ibv_recv_wr* bad = nullptr;
  return verbs_->postRecv(conn.qps[static_cast<size_t>(qp)], &wr, &bad) == 0;
}

IbConn* IbComm::byId(uint32_t id) {
  for (auto& conn : conns_)
    if (static_cast<IbConn&>(*conn).id == id) return static_cast<IbConn*>(conn.get());
  return nullptr;
}

void IbComm::complete(const ibv_wc& wc) {
  IbConn* conn = byId(wrConn(wc.wr_id));
  if (conn == nullptr || conn->closed) return;  // a connection already gone (its flushed requests)
  if (wc.status != IBV_WC_SUCCESS) {
    const char* what = wrKind(wc.wr_id) == kWrRecv ? "a receive" : "an RDMA write";
    fail(*conn, std::string("failed ") + what + " on " + deviceName_ + ": " + verbs_->wcStatusStr(wc.status) +
                    " (verbs status " + std::to_string(static_cast<int>(wc.status)) + ")");
    return;
  }
  switch (wrKind(wc.wr_id)) {
    case kWrData:
      if (--conn->partsPending == 0) {
        conn->drain->release();
        conn->inFrame = false;
        ++sent_;
      }
      break;
    case kWrCts:
      break;
    case kWrRecv: {
      uint32_t imm = ntohl(wc.imm_data);
      int qp = wrQp(wc.wr_id);
      if (conn->sends) {
        // CTS come in order on queue pair 0; the immediate is the message's number modulo 2^32.
        if (imm != static_cast<uint32_t>(conn->granted)) {
          fail(*conn, "got a clear-to-send out of order");
          return;
        }
        ++conn->granted;
      } else {
        conn->arrived[static_cast<size_t>(qp)].push_back(imm);
      }
      if (!postRecv(*conn, qp)) fail(*conn, "could not post a receive");
      break;
    }
  }
}

bool IbComm::pollCompletions() {
  bool any = false;
  ibv_wc wcs[16];
  for (;;) {
    int n = verbs_->pollCq(cq_, 16, wcs);
    if (n < 0) {
      LOOM_WARN(NET, "ib: polling the completion queue of %s failed", deviceName_.c_str());
      return any;
    }
    for (int i = 0; i < n; ++i) complete(wcs[i]);
    any |= n > 0;
    if (n < 16) return any;
  }
}

bool IbComm::progress() {
  bool any = pollCompletions();
  // The control sockets are looked at when idle (sleep) and every 256th round while busy.
  if ((++rounds_ & 255) == 0) any |= watchControls(0);
  return any;
}

bool IbComm::pump(ProxyConn& base) {
  auto& conn = static_cast<IbConn&>(base);
  return conn.sends ? pumpOut(conn) : pumpIn(conn);
}

// Sending side: the next message goes out once the receiver cleared it.
bool IbComm::pumpOut(IbConn& conn) {
  if (conn.inFrame || conn.granted <= conn.messages) return false;
  size_t bytes = 0;
  Protocol protocol = Protocol::kSimple;
  bool direct = false;
  const void* data = conn.drain->pollAny(&bytes, &protocol, &direct);
  if (data == nullptr) return false;
  if (direct) {
    fail(conn, "was given a direct message (ib sends from registered memory only)");
    return true;
  }
  const CtsEntry& cts = static_cast<const CtsEntry*>(conn.cts.data())[conn.messages % conn.shape.depth];
  if (cts.sequence != conn.messages + 1 || bytes > cts.capacity) {
    fail(conn, "found a clear-to-send entry that does not match its message");
    return true;
  }
  std::byte* source = conn.slotSimple(conn.messages);
  if (data != source) std::memcpy(source, data, bytes);  // LL: decoded into staging; send its payload
  const int parts = stripeCount(bytes, protocol, static_cast<int>(conn.qps.size()));
  const uint32_t imm = htonl(static_cast<uint32_t>(bytes) | (protocol == Protocol::kLL ? kLLBit : 0));
  for (int j = 0; j < parts; ++j) {
    size_t begin = 0, end = 0;
    stripe(bytes, protocol, static_cast<int>(conn.qps.size()), j, &begin, &end);
    ibv_sge sge{reinterpret_cast<uint64_t>(source + begin), static_cast<uint32_t>(end - begin), conn.fifoMr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wrId(kWrData, j, conn.id);
    wr.sg_list = end > begin ? &sge : nullptr;
    wr.num_sge = end > begin ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = imm;
    wr.wr.rdma.remote_addr = cts.address + begin;
    wr.wr.rdma.rkey = cts.rkey;
    ibv_send_wr* bad = nullptr;
    if (int error = verbs_->postSend(conn.qps[static_cast<size_t>(j)], &wr, &bad)) {
      fail(conn, "could not post an RDMA write", error);
      return true;
    }
  }
  conn.partsPending = parts;
  conn.inFrame = true;
  ++conn.messages;
  return true;
}

// Receiving side: clear every free slot, and post every message whose parts have all arrived.
bool IbComm::pumpIn(IbConn& conn) {
  bool progressed = false;
  const uint64_t depth = static_cast<uint64_t>(conn.shape.depth);
  if (!conn.ready && readControl(conn)) progressed = true;  // its "ready" comes once, right after connecting
  if (conn.closed) return true;
  if (conn.ready) {
    const uint64_t tail = conn.fifo.view().header->tail.load(std::memory_order_acquire);
    while (conn.ctsIssued < tail + depth) {
      const uint64_t m = conn.ctsIssued;
      auto* entry = static_cast<CtsEntry*>(conn.cts.data()) + m % depth;
      *entry = {reinterpret_cast<uint64_t>(conn.slotSimple(m)), conn.fifoMr->rkey,
                static_cast<uint32_t>(conn.shape.slotBytes), m + 1, 0};
      ibv_sge sge{reinterpret_cast<uint64_t>(entry), sizeof(CtsEntry), conn.ctsMr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = wrId(kWrCts, 0, conn.id);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = htonl(static_cast<uint32_t>(m));
      wr.wr.rdma.remote_addr = conn.remoteCts + (m % depth) * sizeof(CtsEntry);
      wr.wr.rdma.rkey = conn.remoteCtsRkey;
      ibv_send_wr* bad = nullptr;
      if (int error = verbs_->postSend(conn.qps[0], &wr, &bad)) {
        fail(conn, "could not post a clear-to-send", error);
        return true;
      }
      ++conn.ctsIssued;
      progressed = true;
    }
  }
  while (!conn.arrived[0].empty()) {
    const uint32_t imm = conn.arrived[0].front();
    const size_t bytes = imm & ~kLLBit;
    const Protocol protocol = (imm & kLLBit) ? Protocol::kLL : Protocol::kSimple;
    const int parts = stripeCount(bytes, protocol, static_cast<int>(conn.qps.size()));
    bool whole = true;
    for (int j = 1; j < parts; ++j) whole &= !conn.arrived[static_cast<size_t>(j)].empty();
    if (!whole) break;
    for (int j = 0; j < parts; ++j) conn.arrived[static_cast<size_t>(j)].pop_front();
    std::byte* landed = conn.slotSimple(conn.messages);
    void* slot = conn.fill->reserve(protocol);
    if (slot == nullptr || (protocol == Protocol::kSimple && slot != landed) ||
        bytes > fifoPayloadBytes(conn.shape, protocol)) {
      fail(conn, "received a message it had not cleared");
      return true;
    }
    if (protocol == Protocol::kLL) std::memcpy(slot, landed, bytes);
    corruptInTransit(slot, bytes);  // the fault hook (LOOM_FAULT_CORRUPT), as the message lands
    conn.fill->post(protocol, bytes);
    ++conn.messages;
    ++received_;
    progressed = true;
  }
  if (conn.messages == conn.byeCount) {
    peerClosed(conn);  // the sender finished and everything it sent is in the FIFO
    return true;
  }
  return progressed;
}

// Reads what the control socket carries; whether anything came.
bool IbComm::readControl(IbConn& conn) {
  bool any = false;
  while (!conn.closed && conn.control.valid()) {
    // "Bye" and an abort notice carry 8 bytes after their kind (the message count; the failure behind the abort).
    const bool withWord = conn.controlDone > 0 && (conn.controlIn[0] == kBye || conn.controlIn[0] == kAbort);
    size_t want = withWord ? 9 : 1;
    ssize_t n = recv(conn.control.get(), conn.controlIn + conn.controlDone, want - conn.controlDone, MSG_DONTWAIT);
    if (n == 0) {
      // Closed first: controlClosed runs pumpIn, which reads the control socket again while no "ready" has come,
      // and an end of file read again would recurse until the stack ran out (a peer killed right after connecting).
      conn.control.reset();
      controlClosed(conn);
      return true;
    }
    if (n < 0) {
      if (wouldBlock(errno)) return any;
      fail(conn, "lost its control connection", errno);
      return true;
    }
    any = true;
    conn.controlDone += static_cast<size_t>(n);
    if ((conn.controlIn[0] == kBye || conn.controlIn[0] == kAbort) && conn.controlDone < 9) continue;
    conn.controlDone = 0;
    switch (conn.controlIn[0]) {
      case kReady:
        conn.ready = true;
        break;
      case kAbort:
        peerGaveUp(conn, getU64(conn.controlIn + 1));
        return true;
      case kBye:
        conn.byeCount = getU64(conn.controlIn + 1);
        pumpIn(conn);
        break;
      default:
        fail(conn, "got an unknown control message");
        return true;
    }
  }
  return any;
}

// The peer's end of the control socket closed: a finished receiver, or a peer that exited.
void IbComm::controlClosed(IbConn& conn) {
  // First what the network finished before the peer went: writes it received (which settle the message in flight
  // of a sender), writes it sent (which a receiver delivers).
  pollCompletions();
  if (!conn.closed && !conn.sends) pumpIn(conn);
  if (conn.closed) return;
  if (!conn.sends && conn.byeCount != UINT64_MAX) {
    // A sender that said bye finished: its last writes' completions may still be on their way here (the network
    // acknowledges a write before the completion lands); pumpIn closes once the count is reached.
    return;
  }
  peerClosed(conn);
}

// Appends a pollfd for each open control socket to *fds, and its connection to *polled.
void IbComm::addControls(std::vector<pollfd>* fds, std::vector<IbConn*>* polled) {
  for (auto& base : conns_) {
    auto& conn = static_cast<IbConn&>(*base);
    if (conn.closed || !conn.control.valid()) continue;
    fds->push_back({conn.control.get(), POLLIN, 0});
    polled->push_back(&conn);
  }
}

bool IbComm::watchControls(int timeoutMs) {
  std::vector<pollfd> fds;
  std::vector<IbConn*> polled;
  addControls(&fds, &polled);
  if (fds.empty() || poll(fds.data(), fds.size(), timeoutMs) <= 0) return false;
  bool any = false;
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i].revents != 0) any |= readControl(*polled[i]);
  return any;
}

void IbComm::notifyGaveUp(ProxyConn& base) {
  auto& conn = static_cast<IbConn&>(base);
  uint8_t notice[9] = {kAbort};
  putU64(notice + 1, conn.localOrigin());
  if (conn.control.valid() && send(conn.control.get(), notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    // The peer learns of it from the socket closing instead.
  }
}

void IbComm::shutNetwork(ProxyConn& base, bool graceful) {
  auto& conn = static_cast<IbConn&>(base);
  if (graceful && conn.sends && conn.control.valid()) {
    uint8_t bye[9] = {kBye};
    putU64(bye + 1, conn.messages);
    if (send(conn.control.get(), bye, sizeof(bye), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(bye)) {
      // The receiver then sees the socket close without it, and holds what arrived.
    }
  }
  if (conn.control.valid()) shutdown(conn.control.get(), graceful ? SHUT_WR : SHUT_RDWR);
  conn.control.reset();
  // Destroyed rather than moved to the error state, which would flush every posted receive into the shared
  // completion queue at once (a burst that overruns it when a communicator with many connections closes).
  // Completions already queued find no connection of theirs and are dropped.
  for (ibv_qp* qp : conn.qps) verbs_->destroyQp(qp);
  conn.qps.clear();
}

// Sleeps until a completion, a control socket or the doorbell needs the proxy, or `micros` pass (0: only looks).
void IbComm::sleep(int64_t micros) {
  if (micros > 0) {
    // Arm, then look once more: a completion that came before the arming would raise no event.
    if (!armed_) {
      if (verbs_->reqNotifyCq(cq_, 0) != 0) {
        micros = std::min<int64_t>(micros, 1000);  // cannot arm: look again soon instead
      } else {
        armed_ = true;
      }
    }
    if (pollCompletions()) return;
  }
  std::vector<pollfd> fds{{doorbell(), POLLIN, 0}, {channel_->fd, POLLIN, 0}};
  std::vector<IbConn*> polled;
  addControls(&fds, &polled);
  // A sender's socket waits for its receiving end: the proxy wakes when the sender's description arrives for a
  // connection that exists, and otherwise only when the socket hangs up (then dropped).
  const size_t firstWaiting = fds.size();
  for (const Arrival& arrival : waiting_) {
    bool wanted = std::any_of(conns_.begin(), conns_.end(), [&](const auto& conn) {
      return !conn->sends && !conn->closed && !conn->connected && conn->peer == arrival.peer &&
             conn->channel == arrival.channel;
    });
    fds.push_back({arrival.fd.get(), static_cast<short>(wanted ? POLLIN : 0), 0});
  }
  timespec timeout{0, static_cast<long>(micros * 1000)};
  if (ppoll(fds.data(), fds.size(), &timeout, nullptr) <= 0) return;
  for (size_t i = waiting_.size(); i-- > 0;) {
    if ((fds[firstWaiting + i].revents & (POLLHUP | POLLERR)) == 0 || fds[firstWaiting + i].events != 0) continue;
    LOOM_INFO(NET, "ib: rank %d closed its connection on channel %d before this rank made its end",
              waiting_[i].peer, waiting_[i].channel);
    waiting_.erase(waiting_.begin() + static_cast<long>(i));
  }
  if (fds[0].revents & POLLIN) drainDoorbell();
  if (fds[1].revents & POLLIN) {
    ibv_cq* cq = nullptr;
    void* cqContext = nullptr;
    if (verbs_->getCqEvent(channel_, &cq, &cqContext) == 0) {
      verbs_->ackCqEvents(cq, 1);
      armed_ = false;
    }
  }
  for (size_t i = 0; i < polled.size(); ++i)
    if (fds[2 + i].revents != 0) readControl(*polled[i]);
}

}  // namespace loom::ib
