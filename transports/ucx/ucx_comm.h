// The ucx transport's connection state, shared by its two halves: set-up (ucx_setup.cc: libucp, the worker,
// endpoints, the Transport) and the data path (transport.cc: CTS, tagged sends, puts, receives, notices). The
// design of both is described here.
//
// ucx: connections over UCX's tagged messages (UCP), for ranks on different hosts (or any ranks, when
// LOOM_TRANSPORTS or LOOM_NET asks for it). UCX picks its own wires: InfiniBand, RoCE, TCP, shared memory; it
// honours UCX_TLS and UCX_NET_DEVICES. libucp is loaded with dlopen when a communicator first needs it, so
// libloom runs where UCX is not installed and says why ucx is unavailable.
//
// A proxied transport (proxy.h): each end keeps a FIFO in its own memory, and the communicator's proxy thread moves
// the messages. A communicator has one UCP context and worker; the worker addresses are exchanged at init through
// the bootstrap; an endpoint is made per peer the first time a connection needs it (either direction: the
// endpoint's error handler is how a dead peer is seen). The proxy keeps one message and one receive in flight per
// connection.
//
// Messages. The receiving proxy posts a tagged receive for each message straight into the FIFO's next Simple slot,
// and tells the sender that slot is free with a clear-to-send (CTS) back: the slot's address, where the FIFO keeps
// its size, and, in the first one, the key of the FIFO, which the receiver maps with ucp_mem_map. A Simple
// message of LOOM_UCX_PUT_BYTES or more whose CTS has come goes by RMA, where the endpoint has a wire with native
// RMA (InfiniBand, RoCE, CMA between processes of a host): put into the slot, its size put beside it, the endpoint
// flushed (the puts are then complete at the receiver), and a zero-length "put" notice sent on the message's tag.
// Anything else is one tagged send of the payload, received in the slot as it is (an LL message is then copied
// into its LL slot). Either way the receive posted for the message takes it. Where UCX would emulate RMA with
// active messages (its tcp), a put is an active message plus an acknowledgement, slower than the tagged send
// (docs/PERFORMANCE.md), and UCX 1.13 aborts the target whose acknowledgement finds its endpoint failed (a rank
// resumed after its peers died): such endpoints send tagged.
//
// Tags: bits 63-60 the kind (0 Simple, 1 LL, 2 abort notice, 3 put notice, 4 CTS), bit 59 set for what goes back
// from a receiver to its sender, bits 58-40 the message's sequence number on its connection (modulo 2^19), bits
// 39-24 the channel, bits 23-0 the rank that sent the tagged message. A receiving connection matches its next
// message exactly, whatever its kind, so each message lands in the slot posted for it. A sending connection
// listens for anything back (CTS, abort notice), in order. An executor that gives up has the proxy send an abort
// notice to the peer (kAbortedByPeer there, with the failure behind it as its 8 bytes); an endpoint error marks
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/base/log.h"
#include "src/base/params.h"
#include "transports/proxy.h"

namespace loom::ucxnet {

constexpr uint64_t kKindSimple = 0, kKindLL = 1, kKindAbort = 2, kKindPut = 3, kKindCts = 4;
constexpr size_t kNoticeBytes = 8;      // an abort notice's payload: the failure behind it (packOrigin)
constexpr size_t kBackBytes = 4096;      // a sending connection's buffer for what comes back (a CTS with keys)
constexpr size_t kCtsBytes = 24;         // a CTS without keys: slot address, size address, sequence
constexpr uint64_t kBackward = uint64_t{1} << 59;
constexpr uint64_t kSequenceMask = (uint64_t{1} << 19) - 1;
constexpr uint64_t kMatchAllButKind = ~(uint64_t{0xf} << 60);
constexpr uint64_t kMatchBackward = ~(uint64_t{0xf} << 60 | kSequenceMask << 40);  // any kind, any sequence
constexpr uint64_t kMatchAll = ~uint64_t{0};
constexpr int64_t kCloseWaitMs = 2000;  // endpoints and requests at destruction

inline uint64_t tagOf(uint64_t kind, bool backward, uint64_t sequence, int channel, int sender) {
  return kind << 60 | (backward ? kBackward : 0) | (sequence & kSequenceMask) << 40 |
         (static_cast<uint64_t>(channel) & 0xffff) << 24 | (static_cast<uint64_t>(sender) & 0xffffff);
}

// The UCP functions loom calls, from libucp.so.0 (and libucs.so.0 for status strings).
struct UcxApi {
  decltype(&ucp_config_read) configRead = nullptr;
  decltype(&ucp_config_release) configRelease = nullptr;
  decltype(&ucp_init_version) initVersion = nullptr;
  decltype(&ucp_cleanup) cleanup = nullptr;
  decltype(&ucp_worker_create) workerCreate = nullptr;
  decltype(&ucp_worker_destroy) workerDestroy = nullptr;
  decltype(&ucp_worker_get_address) workerGetAddress = nullptr;
  decltype(&ucp_worker_release_address) workerReleaseAddress = nullptr;
  decltype(&ucp_worker_progress) workerProgress = nullptr;
  decltype(&ucp_worker_get_efd) workerGetEfd = nullptr;
  decltype(&ucp_worker_arm) workerArm = nullptr;
  decltype(&ucp_ep_create) epCreate = nullptr;
  decltype(&ucp_ep_close_nbx) epCloseNbx = nullptr;
  decltype(&ucp_tag_send_nbx) tagSendNbx = nullptr;
  decltype(&ucp_tag_recv_nbx) tagRecvNbx = nullptr;
  decltype(&ucp_tag_recv_request_test) tagRecvRequestTest = nullptr;
  decltype(&ucp_request_check_status) requestCheckStatus = nullptr;
  decltype(&ucp_request_cancel) requestCancel = nullptr;
  decltype(&ucp_request_free) requestFree = nullptr;
  decltype(&ucp_mem_map) memMap = nullptr;
  decltype(&ucp_mem_unmap) memUnmap = nullptr;
  decltype(&ucp_rkey_pack) rkeyPack = nullptr;
  decltype(&ucp_rkey_buffer_release) rkeyBufferRelease = nullptr;
  decltype(&ucp_ep_rkey_unpack) epRkeyUnpack = nullptr;
  decltype(&ucp_rkey_destroy) rkeyDestroy = nullptr;
  decltype(&ucp_put_nbx) putNbx = nullptr;
  decltype(&ucp_ep_flush_nbx) epFlushNbx = nullptr;
  decltype(&ucp_tag_probe_nb) tagProbeNb = nullptr;
  decltype(&ucp_tag_msg_recv_nbx) tagMsgRecvNbx = nullptr;
  decltype(&ucp_ep_print_info) epPrintInfo = nullptr;
  decltype(&ucs_status_string) statusString = nullptr;
  std::string why;  // empty once loaded
};

// The UCP functions, loaded once per process (why says what failed, if anything did).
const UcxApi& ucx();
// UCS's text for `status`.
const char* statusText(ucs_status_t status);


struct UcxConn : ProxyConn {
  UcxConn(bool sends, int peer, int channel, const FifoShape& shape, int doorbell, ucp_context_h context)
      : ProxyConn(sends, peer, channel, shape, doorbell), context(context) {}
  ~UcxConn() override {
    if (rkey != nullptr) ucx().rkeyDestroy(rkey);
    if (memh != nullptr) ucx().memUnmap(context, memh);
  }

  const ucp_context_h context;
  void* request = nullptr;  // the send, flush or receive in flight (nullptr: none)
  uint64_t sequence = 0;    // of the next message sent or received
  bool receiving = false;   // a receive was posted and has not been delivered
  bool received = false;    // ... and it has ended, with recvStatus and info
  ucs_status_t recvStatus = UCS_OK;
  ucp_tag_recv_info_t info{};
  // Receiving side: the FIFO mapped for puts, and its key, packed, for the first CTS.
  ucp_mem_h memh = nullptr;
  std::vector<uint8_t> packedKey;
  // Sending side: the receive of what comes back (CTS, abort notice), its buffer, and what came.
  void* back = nullptr;
  bool backDone = false;
  ucs_status_t backStatus = UCS_OK;
  ucp_tag_recv_info_t backInfo{};
  uint8_t notice[kNoticeBytes] = {};  // the abort notice this end sends, while it is on its way
  std::vector<uint8_t> backBuffer;
  ucp_rkey_h rkey = nullptr;  // the receiver's FIFO
  struct Cts {
    uint64_t slot = 0;  // where message `sequence` may be put, and its size
    uint64_t size = 0;
    uint64_t sequence = UINT64_MAX;
  };
  std::vector<Cts> cts;        // by sequence modulo the FIFO's depth
  bool putting = false;        // the message in flight went by RMA: `request` is the flush, then the notice
  bool flushed = false;        // ... and the flush has ended: `request` is the notice
  uint64_t putSize = 0;        // the size put beside the slot (alive until the flush ends)
  uint64_t putSequence = 0;
};

class UcxComm;

// An endpoint's error handler's argument: which peer it reaches.
struct PeerRef {
  UcxComm* comm;
  int peer;
};

class UcxComm : public ProxyComm {
 public:
  explicit UcxComm(const TransportCommContext& context) : ProxyComm(context, "ucx") {}
  // UCX picks its devices itself: only UCX_NET_DEVICES names one ("mlx5_0:1" gives mlx5_0).
  std::string netDevice() const override {
    const char* devices = std::getenv("UCX_NET_DEVICES");
    if (devices == nullptr || std::strcmp(devices, "all") == 0) return {};
    std::string first(devices, std::strcspn(devices, ",:"));
    return first;
  }

  ~UcxComm() override {
    stopProxy();
    if (puts_ > 0)
      LOOM_INFO(NET, "rank %d: %llu messages went by RMA put over ucx", context().rank,
                static_cast<unsigned long long>(puts_));
    closeAll();
  }

  loomResult_t start();
  loomResult_t open(ucp_address_t** address, size_t* length);
  ucp_context_h ucpContext() const { return ucpContext_; }

 private:
  bool progress() override {
    bool moved = ucx().workerProgress(worker_) != 0;
    std::vector<std::pair<int, ucs_status_t>> failed;
    {
      std::lock_guard<std::mutex> lock(failedMutex_);
      failed.swap(failed_);
    }
    // A peer that finished and destroyed its communicator looks the same as one that died: its endpoint fails.
    // Only a connection caught with a message on its way is a failure to report; the others are closed, and
    // the executor finds out whether it still needed them (as over tcp).
    for (auto [peer, status] : failed) {
      for (auto& conn : conns_) {
        if (conn->peer != peer || conn->closed) continue;
        bool busy = conn->sends && (conn->inFrame || !conn->drain->empty());
        if (busy) {
          fail(*conn, std::string("lost its endpoint: ") + statusText(status));
        } else {
          peerClosed(*conn);
        }
      }
      moved = true;
    }
    std::erase_if(orphans_, [](const Orphan& orphan) {
      if (ucx().requestCheckStatus(orphan.request) == UCS_INPROGRESS) return false;
      ucx().requestFree(orphan.request);
      return true;
    });
    std::erase_if(sending_, [](const auto& send) {
      if (ucx().requestCheckStatus(send.first) == UCS_INPROGRESS) return false;
      ucx().requestFree(send.first);
      return true;
    });
    return moved;
  }
  bool pump(ProxyConn& conn) override;
  void notifyGaveUp(ProxyConn& conn) override;
  void shutNetwork(ProxyConn& conn, bool graceful) override;
  void sleep(int64_t micros) override;

  bool pumpOut(UcxConn& conn);
  bool pumpIn(UcxConn& conn);
  bool takeCts(UcxConn& conn);
  std::shared_ptr<ProxyConn> held(const ProxyConn& conn) const {
    for (const auto& kept : conns_)
      if (kept.get() == &conn) return kept;
    return nullptr;
  }
  bool startPut(UcxConn& conn, const UcxConn::Cts& cleared, uint64_t sequence);
  bool sendPutNotice(UcxConn& conn);
  void finishMessage(UcxConn& conn);
  bool clearToSend(UcxConn& conn, uint64_t sequence);
  ucp_ep_h endpoint(int peer);
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void closeAll();

  ucp_context_h ucpContext_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int workerFd_ = -1;
  std::vector<std::vector<uint8_t>> addresses_;  // every rank's worker address
  std::map<int, ucp_ep_h> endpoints_;            // the proxy thread's
  std::map<int, bool> nativeRma_;  // by peer: its endpoint has native RMA, or LOOM_UCX_PUT_EMULATED (puts go)
  std::map<int, PeerRef> refs_;
  // Requests of closed connections, freed once they end; each keeps its connection (and the FIFO slot a receive
  // may still write into) alive until then.
  struct Orphan {
    void* request;
    std::shared_ptr<ProxyConn> conn;
  };
  std::vector<Orphan> orphans_;
  // CTS sends on their way, with their buffers.
  std::vector<std::pair<void*, std::unique_ptr<uint8_t[]>>> sending_;
  uint64_t puts_ = 0;  // messages sent by RMA, for the log line at the end
  const size_t putBytes_ = static_cast<size_t>(std::max<int64_t>(0, params::ucxPutBytes()));  // 0: never
  const bool putEmulated_ = params::ucxPutEmulated() != 0;
  std::mutex failedMutex_;
  std::vector<std::pair<int, ucs_status_t>> failed_;  // peers whose endpoint failed, and why (the error handler)
};

}  // namespace loom::ucxnet
