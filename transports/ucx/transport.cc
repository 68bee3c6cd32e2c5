// ucx, the data path: clear-to-send, tagged sends and puts of messages, receives into the FIFO's slots, abort
// notices, and the proxy's sleep on the worker's event fd (ucx_comm.h describes the design).
#include "transports/ucx/ucx_comm.h"

#include <dlfcn.h>
#include <poll.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "src/base/bootstrap.h"
#include "src/base/integrity.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "transports/ucx/lanes.h"

namespace loom::ucxnet {

namespace {

// Receive completions, called from ucp_worker_progress on the proxy thread.
void onReceived(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* conn = static_cast<UcxConn*>(user);
  conn->received = true;
  conn->recvStatus = status;
  if (info != nullptr) conn->info = *info;
}
void onBack(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* conn = static_cast<UcxConn*>(user);
  conn->backDone = true;
  conn->backStatus = status;
  if (info != nullptr) conn->backInfo = *info;
}

// A tagged receive that always reports its end through `callback`: UCX 1.13 was seen to leave the receive
// information unfilled when a receive completed at once.
void* postReceive(ucp_worker_h worker, void* buffer, size_t bytes, uint64_t tag, uint64_t mask, UcxConn* conn,
                  ucp_tag_recv_nbx_callback_t callback) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = callback;
  param.user_data = conn;
  return ucx().tagRecvNbx(worker, buffer, bytes, tag, mask, &param);
}

}  // namespace

bool UcxComm::pump(ProxyConn& base) {
  auto& conn = static_cast<UcxConn&>(base);
  if (endpoint(conn.peer) == nullptr) {
    fail(conn, "has no UCX endpoint to its peer");
    return true;
  }
  return conn.sends ? pumpOut(conn) : pumpIn(conn);
}

// Sending side: what came back (CTS, abort notice), then one message in flight, the next once it has ended.
bool UcxComm::pumpOut(UcxConn& conn) {
  bool progressed = false;
  if (conn.back == nullptr) {
    if (conn.backBuffer.empty()) {
      conn.backBuffer.resize(kBackBytes);
      conn.cts.resize(static_cast<size_t>(conn.shape.depth));
    }
    conn.backDone = false;
    void* request = postReceive(worker_, conn.backBuffer.data(), kBackBytes, tagOf(0, true, 0, conn.channel, conn.peer),
                                kMatchBackward, &conn, onBack);
    if (UCS_PTR_IS_ERR(request)) {
      fail(conn, std::string("cannot listen for what its receiver sends back: ") + statusText(UCS_PTR_STATUS(request)));
      return true;
    }
    conn.back = request;
  } else if (conn.backDone) {
    ucx().requestFree(conn.back);
    conn.back = nullptr;
    progressed = true;
    if (conn.backStatus != UCS_OK) {
      fail(conn, std::string("could not receive from its receiver: ") + statusText(conn.backStatus));
      return true;
    }
    if (conn.backInfo.sender_tag >> 60 == kKindAbort) {
      peerGaveUp(conn, conn.backInfo.length == kNoticeBytes ? getU64(conn.backBuffer.data()) : 0);
      return true;
    }
    if (!takeCts(conn)) return true;
    return pumpOut(conn);  // listen again at once
  }
  for (;;) {
    if (conn.request != nullptr) {
      ucs_status_t status = ucx().requestCheckStatus(conn.request);
      if (status == UCS_INPROGRESS) return progressed;
      ucx().requestFree(conn.request);
      conn.request = nullptr;
      if (status != UCS_OK) {
        fail(conn, std::string(conn.putting && !conn.flushed ? "could not put: " : "could not send: ") +
                       statusText(status));
        return true;
      }
      progressed = true;
      if (conn.putting && !conn.flushed) {
        conn.flushed = true;
        if (!sendPutNotice(conn)) return true;
        if (conn.request != nullptr) return progressed;
      }
      finishMessage(conn);
    }
    bool bad = false;
    if (!nextOutgoing(conn, &bad)) {
      if (bad) fail(conn, "was given a direct message that is not in this process's memory");
      return progressed || bad;
    }
    if (conn.trailerBytes != 0) {  // not offered (TransportTraits::proxySendsChecksumAfterCallerMemory)
      fail(conn, "was given a direct message with its checksum after it, which ucx does not send");
      return true;
    }
    conn.inFrame = true;
    progressed = true;
    const uint64_t sequence = conn.sequence++;
    const UcxConn::Cts& cleared = conn.cts[sequence % conn.cts.size()];
    if (conn.protocol == Protocol::kSimple && putBytes_ > 0 && conn.payloadBytes >= putBytes_ &&
        conn.rkey != nullptr && cleared.sequence == sequence && nativeRma_[conn.peer]) {
      if (!startPut(conn, cleared, sequence)) return true;
      if (conn.request != nullptr) return progressed;
      continue;  // flushed at once: the notice went out too, or is on its way
    }
    uint64_t kind = conn.protocol == Protocol::kLL ? kKindLL : kKindSimple;
    ucp_request_param_t param{};
    void* request = ucx().tagSendNbx(endpoint(conn.peer), conn.payload, conn.payloadBytes,
                                     tagOf(kind, false, sequence, conn.channel, context().rank), &param);
    if (UCS_PTR_IS_ERR(request)) {
      fail(conn, std::string("could not send: ") + statusText(UCS_PTR_STATUS(request)));
      return true;
    }
    if (request != nullptr) {
      conn.request = request;
      return progressed;
    }
    finishMessage(conn);  // sent at once
  }
}

// A CTS came back: where the message it names may be put, and, the first time, the key of the receiver's FIFO.
bool UcxComm::takeCts(UcxConn& conn) {
  const uint8_t* in = conn.backBuffer.data();
  const size_t length = conn.backInfo.length;
  if (length < kCtsBytes) {
    fail(conn, "got a clear-to-send too short to read");
    return false;
  }
  UcxConn::Cts cts;
  std::memcpy(&cts.slot, in, 8);
  std::memcpy(&cts.size, in + 8, 8);
  std::memcpy(&cts.sequence, in + 16, 8);
  if (length > kCtsBytes && conn.rkey == nullptr) {
    ucs_status_t status = ucx().epRkeyUnpack(endpoint(conn.peer), in + kCtsBytes, &conn.rkey);
    if (status != UCS_OK) {
      // Without the key every message goes as a tagged send, which is still right.
      LOOM_INFO(NET, "ucx: connection %s cannot use its receiver's key (%s): tagged sends only", conn.name().c_str(),
                statusText(status));
      conn.rkey = nullptr;
    }
  }
  conn.cts[cts.sequence % conn.cts.size()] = cts;
  return true;
}

// Puts the message and its size into the receiver's FIFO, then flushes the endpoint: `request` is the flush.
bool UcxComm::startPut(UcxConn& conn, const UcxConn::Cts& cleared, uint64_t sequence) {
  ucp_ep_h ep = endpoint(conn.peer);
  conn.putting = true;
  conn.flushed = false;
  conn.putSize = conn.payloadBytes;
  conn.putSequence = sequence;
  const std::pair<const void*, std::pair<size_t, uint64_t>> puts[] = {
      {conn.payload, {conn.payloadBytes, cleared.slot}}, {&conn.putSize, {sizeof(conn.putSize), cleared.size}}};
  for (const auto& [from, where] : puts) {
    ucp_request_param_t param{};
    void* request = ucx().putNbx(ep, from, where.first, where.second, conn.rkey, &param);
    if (UCS_PTR_IS_ERR(request)) {
      fail(conn, std::string("could not put: ") + statusText(UCS_PTR_STATUS(request)));
      return false;
    }
    if (request != nullptr) orphans_.push_back({request, held(conn)});  // the flush covers it; freed when done
  }
  ucp_request_param_t param{};
  void* flush = ucx().epFlushNbx(ep, &param);
  if (UCS_PTR_IS_ERR(flush)) {
    fail(conn, std::string("could not flush its puts: ") + statusText(UCS_PTR_STATUS(flush)));
    return false;
  }
  conn.request = flush;
  if (flush != nullptr) return true;
  conn.flushed = true;
  if (!sendPutNotice(conn)) return false;
  if (conn.request == nullptr) finishMessage(conn);
  return true;
}

// The puts are complete at the receiver: the zero-length notice on the message's own tag hands it over.
bool UcxComm::sendPutNotice(UcxConn& conn) {
  ucp_request_param_t param{};
  void* request = ucx().tagSendNbx(endpoint(conn.peer), nullptr, 0,
                                   tagOf(kKindPut, false, conn.putSequence, conn.channel, context().rank), &param);
  if (UCS_PTR_IS_ERR(request)) {
    fail(conn, std::string("could not send: ") + statusText(UCS_PTR_STATUS(request)));
    return false;
  }
  conn.request = request;
  return true;
}

void UcxComm::finishMessage(UcxConn& conn) {
  if (conn.putting) ++puts_;
  conn.putting = false;
  conn.flushed = false;
  conn.drain->release();
  conn.inFrame = false;
  ++sent_;
}

// Receiving side: the FIFO's next Simple slot is free: a receive posted into it, and a CTS back for it.
bool UcxComm::clearToSend(UcxConn& conn, uint64_t sequence) {
  if (conn.memh == nullptr && conn.packedKey.empty()) {
    // First: map the FIFO (header and slots) so that the sender can put into it, and pack its key.
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = conn.fifo.view().header;
    params.length = conn.fifo.bytes();
    void* packed = nullptr;
    size_t packedBytes = 0;
    ucs_status_t status = ucx().memMap(ucpContext_, &params, &conn.memh);
    if (status == UCS_OK) status = ucx().rkeyPack(ucpContext_, conn.memh, &packed, &packedBytes);
    if (status == UCS_OK && packedBytes <= kBackBytes - kCtsBytes) {
      conn.packedKey.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packedBytes);
    } else {
      LOOM_INFO(NET, "ucx: connection %s takes tagged sends only (mapping its FIFO: %s)", conn.name().c_str(),
                status == UCS_OK ? "its key is too large" : statusText(status));
      conn.packedKey.assign(1, 0);  // looked at once; the CTS carries no key
      if (conn.memh != nullptr) ucx().memUnmap(ucpContext_, conn.memh);
      conn.memh = nullptr;
    }
    if (packed != nullptr) ucx().rkeyBufferRelease(packed);
  }
  const size_t index = sequence % static_cast<uint64_t>(conn.shape.depth);
  const bool withKey = sequence == 0 && conn.memh != nullptr;
  auto buffer = std::make_unique<uint8_t[]>(kCtsBytes + (withKey ? conn.packedKey.size() : 0));
  uint64_t fields[3] = {reinterpret_cast<uint64_t>(conn.payload),
                        reinterpret_cast<uint64_t>(&conn.fifo.view().header->sizes[index]), sequence};
  std::memcpy(buffer.get(), fields, kCtsBytes);
  if (withKey) std::memcpy(buffer.get() + kCtsBytes, conn.packedKey.data(), conn.packedKey.size());
  ucp_request_param_t param{};
  void* request = ucx().tagSendNbx(endpoint(conn.peer), buffer.get(), kCtsBytes + (withKey ? conn.packedKey.size() : 0),
                                   tagOf(kKindCts, true, sequence, conn.channel, context().rank), &param);
  if (UCS_PTR_IS_ERR(request)) {
    fail(conn, std::string("could not clear its sender to send: ") + statusText(UCS_PTR_STATUS(request)));
    return false;
  }
  if (request != nullptr) sending_.push_back({request, std::move(buffer)});
  return true;
}

// Receiving side: one tagged receive in flight, straight into the FIFO's next Simple slot.
bool UcxComm::pumpIn(UcxConn& conn) {
  bool progressed = false;
  for (;;) {
    if (!conn.receiving) {
      void* slot = conn.fill->reserve(Protocol::kSimple);
      conn.wantSlot = slot == nullptr;
      if (conn.wantSlot) return progressed;
      conn.payload = static_cast<std::byte*>(slot);
      conn.received = false;
      const uint64_t sequence = conn.sequence++;
      void* request = postReceive(worker_, slot, fifoPayloadBytes(conn.shape, Protocol::kSimple),
                                  tagOf(0, false, sequence, conn.channel, conn.peer), kMatchAllButKind, &conn,
                                  onReceived);
      if (UCS_PTR_IS_ERR(request)) {
        fail(conn, std::string("could not receive: ") + statusText(UCS_PTR_STATUS(request)));
        return true;
      }
      conn.receiving = true;
      conn.request = request;
      if (!clearToSend(conn, sequence)) return true;
    }
    if (!conn.received) return progressed;
    if (conn.request != nullptr) ucx().requestFree(conn.request);
    conn.request = nullptr;
    conn.receiving = false;
    progressed = true;
    ucs_status_t status = conn.recvStatus;
    if (status != UCS_OK) {
      fail(conn, std::string("could not receive: ") + statusText(status));
      return true;
    }
    uint64_t kind = conn.info.sender_tag >> 60;
    size_t bytes = conn.info.length;
    if (kind == kKindAbort) {
      peerGaveUp(conn, bytes == kNoticeBytes ? getU64(reinterpret_cast<const uint8_t*>(conn.payload)) : 0);
      return true;
    }
    if (kind == kKindPut) {
      // The sender put the payload into this slot and its size into the FIFO's size of the slot.
      const size_t index = (conn.sequence - 1) % static_cast<uint64_t>(conn.shape.depth);
      bytes = conn.fifo.view().header->sizes[index].load(std::memory_order_acquire);
      if (bytes > fifoPayloadBytes(conn.shape, Protocol::kSimple)) {
        fail(conn, "was put a message larger than a slot");
        return true;
      }
      corruptInTransit(conn.payload, bytes);  // the fault hook (LOOM_FAULT_CORRUPT), as the message lands
      conn.fill->post(Protocol::kSimple, bytes);
    } else if (kind == kKindLL) {
      if (bytes > fifoPayloadBytes(conn.shape, Protocol::kLL)) {
        fail(conn, "received an LL message larger than an LL slot");
        return true;
      }
      void* staged = conn.fill->reserve(Protocol::kLL);
      std::memcpy(staged, conn.payload, bytes);
      corruptInTransit(staged, bytes);
      conn.fill->post(Protocol::kLL, bytes);
    } else {
      corruptInTransit(conn.payload, bytes);
      conn.fill->post(Protocol::kSimple, bytes);
    }
    ++received_;
  }
}

void UcxComm::notifyGaveUp(ProxyConn& conn) {
  ucp_ep_h ep = endpoint(conn.peer);
  if (ep == nullptr) return;
  ucp_request_param_t param{};
  // Forward on a sending connection; back to the sender on a receiving one.
  // A forward notice takes the next message's place, so the receiver's exact match finds it.
  // (A message whose puts are still being flushed never gets its notice: the abort takes its place.)
  auto& ucxConn = static_cast<UcxConn&>(conn);
  uint64_t sequence = !conn.sends ? 0 : ucxConn.putting && !ucxConn.flushed ? ucxConn.putSequence : ucxConn.sequence;
  // The notice carries the failure behind it; the connection, held by the request, keeps its bytes.
  putU64(ucxConn.notice, conn.localOrigin());
  void* request = ucx().tagSendNbx(ep, ucxConn.notice, kNoticeBytes,
                                   tagOf(kKindAbort, !conn.sends, sequence, conn.channel, context().rank), &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) orphans_.push_back({request, held(conn)});
}

// The requests of a closed connection go on by themselves: receives are cancelled, and both are freed once they
// end (progress()).
void UcxComm::shutNetwork(ProxyConn& base, bool) {
  auto& conn = static_cast<UcxConn&>(base);
  std::shared_ptr<ProxyConn> keep = held(base);
  // A receive in flight means a CTS is out: the sender may yet put into the slot, even after this rank has let go
  // of the FIFO (a peer that has not heard of a failure yet, whose put this worker carries out while it closes).
  // LocalFifo then keeps the FIFO's addresses mapped.
  if (!conn.sends && conn.receiving && conn.memh != nullptr) conn.fifo.quarantine();
  for (void** request : {&conn.request, &conn.back}) {
    if (*request == nullptr) continue;
    if (!conn.sends || request == &conn.back) ucx().requestCancel(worker_, *request);
    orphans_.push_back({*request, keep});
    *request = nullptr;
  }
}

// Sleeps until the worker, the doorbell or `micros` wakes the proxy; arming the worker fails while it has
// events to progress, and then the proxy does not sleep.
void UcxComm::sleep(int64_t micros) {
  if (micros == 0 || ucx().workerArm(worker_) != UCS_OK) return;
  pollfd fds[2] = {{doorbell(), POLLIN, 0}, {workerFd_, POLLIN, 0}};
  timespec timeout{0, static_cast<long>(micros * 1000)};
  if (ppoll(fds, 2, &timeout, nullptr) > 0 && (fds[0].revents & POLLIN)) drainDoorbell();
}

}  // namespace loom::ucxnet
