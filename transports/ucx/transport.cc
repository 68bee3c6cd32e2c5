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
// every connection with that peer kConnectionLost.
#include "transports/proxy.h"

#include <dlfcn.h>
#include <poll.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "src/base/bootstrap.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "transports/ucx/lanes.h"

namespace loom {
namespace {

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

uint64_t tagOf(uint64_t kind, bool backward, uint64_t sequence, int channel, int sender) {
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

const UcxApi& ucx() {
  static const UcxApi api = [] {
    UcxApi a;
    void* ucp = dlopen("libucp.so.0", RTLD_NOW | RTLD_GLOBAL);
    void* ucs = dlopen("libucs.so.0", RTLD_NOW | RTLD_GLOBAL);
    if (ucp == nullptr || ucs == nullptr) {
      a.why = std::string("cannot load UCX: ") + dlerror() + " (install libucx0)";
      return a;
    }
    bool missing = false;
    auto load = [&](auto& fn, void* lib, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && !missing) {
        missing = true;
        a.why = std::string("UCX lacks ") + name;
      }
    };
    load(a.configRead, ucp, "ucp_config_read");
    load(a.configRelease, ucp, "ucp_config_release");
    load(a.initVersion, ucp, "ucp_init_version");
    load(a.cleanup, ucp, "ucp_cleanup");
    load(a.workerCreate, ucp, "ucp_worker_create");
    load(a.workerDestroy, ucp, "ucp_worker_destroy");
    load(a.workerGetAddress, ucp, "ucp_worker_get_address");
    load(a.workerReleaseAddress, ucp, "ucp_worker_release_address");
    load(a.workerProgress, ucp, "ucp_worker_progress");
    load(a.workerGetEfd, ucp, "ucp_worker_get_efd");
    load(a.workerArm, ucp, "ucp_worker_arm");
    load(a.epCreate, ucp, "ucp_ep_create");
    load(a.epCloseNbx, ucp, "ucp_ep_close_nbx");
    load(a.tagSendNbx, ucp, "ucp_tag_send_nbx");
    load(a.tagRecvNbx, ucp, "ucp_tag_recv_nbx");
    load(a.tagRecvRequestTest, ucp, "ucp_tag_recv_request_test");
    load(a.requestCheckStatus, ucp, "ucp_request_check_status");
    load(a.requestCancel, ucp, "ucp_request_cancel");
    load(a.requestFree, ucp, "ucp_request_free");
    load(a.memMap, ucp, "ucp_mem_map");
    load(a.memUnmap, ucp, "ucp_mem_unmap");
    load(a.rkeyPack, ucp, "ucp_rkey_pack");
    load(a.rkeyBufferRelease, ucp, "ucp_rkey_buffer_release");
    load(a.epRkeyUnpack, ucp, "ucp_ep_rkey_unpack");
    load(a.rkeyDestroy, ucp, "ucp_rkey_destroy");
    load(a.putNbx, ucp, "ucp_put_nbx");
    load(a.epFlushNbx, ucp, "ucp_ep_flush_nbx");
    load(a.tagProbeNb, ucp, "ucp_tag_probe_nb");
    load(a.tagMsgRecvNbx, ucp, "ucp_tag_msg_recv_nbx");
    load(a.epPrintInfo, ucp, "ucp_ep_print_info");
    load(a.statusString, ucs, "ucs_status_string");
    return a;
  }();
  return api;
}

const char* statusText(ucs_status_t status) { return ucx().statusString ? ucx().statusString(status) : "?"; }

// Whether `ep` has a lane with native RMA (lanes.h), from what ucp_ep_print_info says of it; false (tagged sends,
// always right) when the text cannot be had.
bool hasNativeRma(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return false;
  ucx().epPrintInfo(ep, stream);
  std::fclose(stream);
  const bool native = text != nullptr && lanesHaveNativeRma(std::string_view(text, size));
  std::free(text);
  return native;
}

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

loomResult_t UcxComm::start() {
  ucp_address_t* address = nullptr;
  size_t length = 0;
  loomResult_t local = open(&address, &length);
  // Every rank's address, through the bootstrap: the lengths, then the addresses padded to the longest. A rank
  // whose UCX did not start takes part with none, so the others fail at once rather than at the deadline.
  const TransportCommContext& ctx = context();
  std::vector<uint64_t> lengths(ctx.nranks);
  lengths[ctx.rank] = local == loomSuccess ? length : 0;
  loomResult_t result = ctx.bootstrap->allGather(lengths.data(), sizeof(uint64_t), ctx.timeoutMs);
  size_t widest = result == loomSuccess ? *std::max_element(lengths.begin(), lengths.end()) : 0;
  std::vector<uint8_t> all(widest * ctx.nranks);
  if (result == loomSuccess && widest > 0) {
    if (local == loomSuccess) std::memcpy(all.data() + widest * ctx.rank, address, length);
    result = ctx.bootstrap->allGather(all.data(), widest, ctx.timeoutMs);
  }
  if (address != nullptr) ucx().workerReleaseAddress(worker_, address);
  if (local != loomSuccess) return local;
  LOOM_CHECK(result);
  for (int r = 0; r < ctx.nranks; ++r) {
    if (lengths[r] == 0)
      return LOOM_FAIL(loomRemoteError, NET, "ucx: rank %d could not start UCX (its log says why)", r);
    const uint8_t* begin = all.data() + widest * r;
    addresses_.emplace_back(begin, begin + lengths[r]);
  }
  return loomSuccess;
}

// This rank's context, worker and address.
loomResult_t UcxComm::open(ucp_address_t** address, size_t* length) {
  const UcxApi& api = ucx();
  if (!api.why.empty()) return LOOM_FAIL(loomSystemError, NET, "ucx: %s", api.why.c_str());
  LOOM_CHECK(openDoorbell());
  ucp_config_t* config = nullptr;
  ucs_status_t status = api.configRead(nullptr, nullptr, &config);
  if (status != UCS_OK) return LOOM_FAIL(loomSystemError, NET, "ucx: ucp_config_read: %s", statusText(status));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  status = api.initVersion(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &ucpContext_);
  api.configRelease(config);
  if (status != UCS_OK) return LOOM_FAIL(loomSystemError, NET, "ucx: ucp_init: %s (UCX_TLS?)", statusText(status));
  ucp_worker_params_t workerParams{};
  workerParams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  workerParams.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // this thread now, the proxy thread from then on
  status = api.workerCreate(ucpContext_, &workerParams, &worker_);
  if (status != UCS_OK) return LOOM_FAIL(loomSystemError, NET, "ucx: ucp_worker_create: %s", statusText(status));
  status = api.workerGetEfd(worker_, &workerFd_);
  if (status != UCS_OK) return LOOM_FAIL(loomSystemError, NET, "ucx: ucp_worker_get_efd: %s", statusText(status));
  status = api.workerGetAddress(worker_, address, length);
  if (status != UCS_OK) return LOOM_FAIL(loomSystemError, NET, "ucx: ucp_worker_get_address: %s", statusText(status));
  return loomSuccess;
}

void UcxComm::onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* ref = static_cast<PeerRef*>(arg);
  std::lock_guard<std::mutex> lock(ref->comm->failedMutex_);
  ref->comm->failed_.emplace_back(ref->peer, status);
}

ucp_ep_h UcxComm::endpoint(int peer) {
  auto found = endpoints_.find(peer);
  if (found != endpoints_.end()) return found->second;
  if (addresses_[peer].empty()) return nullptr;
  PeerRef& ref = refs_[peer];
  ref = {this, peer};
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(addresses_[peer].data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxComm::onEndpointError;
  params.err_handler.arg = &ref;
  ucp_ep_h ep = nullptr;
  ucs_status_t status = ucx().epCreate(worker_, &params, &ep);
  if (status == UCS_ERR_UNREACHABLE) {
    // Some wires (UCX's shared memory) cannot report a peer's failure: without it, a dead peer is seen through the
    // deadline (or, on this host, the watch of peer processes).
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucx().epCreate(worker_, &params, &ep);
    if (status == UCS_OK)
      LOOM_INFO(NET, "ucx: rank %d: the endpoint to rank %d cannot report the peer's failure", context().rank, peer);
  }
  if (status != UCS_OK) {
    LOOM_WARN(NET, "ucx: rank %d: no endpoint to rank %d: %s", context().rank, peer, statusText(status));
    return nullptr;
  }
  endpoints_[peer] = ep;
  nativeRma_[peer] = hasNativeRma(ep) || putEmulated_;
  LOOM_INFO(NET, "ucx: rank %d: the endpoint to rank %d %s", context().rank, peer,
            nativeRma_[peer] ? "puts large messages (native RMA, or LOOM_UCX_PUT_EMULATED)"
                             : "emulates RMA: every message goes tagged");
  return ep;
}

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
      conn.fill->post(Protocol::kSimple, bytes);
    } else if (kind == kKindLL) {
      if (bytes > fifoPayloadBytes(conn.shape, Protocol::kLL)) {
        fail(conn, "received an LL message larger than an LL slot");
        return true;
      }
      void* staged = conn.fill->reserve(Protocol::kLL);
      std::memcpy(staged, conn.payload, bytes);
      conn.fill->post(Protocol::kLL, bytes);
    } else {
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

// After the proxy has stopped: cancels and frees what is left, closes the endpoints, frees the worker.
void UcxComm::closeAll() {
  if (worker_ == nullptr) {
    if (ucpContext_ != nullptr) ucx().cleanup(ucpContext_);
    return;
  }
  const UcxApi& api = ucx();
  Deadline deadline(kCloseWaitMs);
  auto settle = [&](std::vector<Orphan>* list, const Deadline& until) {
    while (!list->empty() && !until.expired()) {
      api.workerProgress(worker_);
      std::erase_if(*list, [&](const Orphan& orphan) {
        if (api.requestCheckStatus(orphan.request) == UCS_INPROGRESS) return false;
        api.requestFree(orphan.request);
        return true;
      });
    }
  };
  // Receives are cancelled; sends get a moment to end by themselves. Then the keys of the connections still held
  // go (before their endpoints), the endpoints close, which ends what is left, and everything settles.
  for (const Orphan& orphan : orphans_) api.requestCancel(worker_, orphan.request);
  std::vector<Orphan> requests = std::move(orphans_);
  orphans_.clear();
  for (auto& [request, buffer] : sending_) requests.push_back({request, nullptr});
  settle(&requests, Deadline(std::min<int64_t>(200, kCloseWaitMs)));
  for (const Orphan& orphan : requests) {
    auto* conn = static_cast<UcxConn*>(orphan.conn.get());
    if (conn != nullptr && conn->rkey != nullptr) api.rkeyDestroy(conn->rkey);
    if (conn != nullptr) conn->rkey = nullptr;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (auto& [peer, ep] : endpoints_) {
    void* request = api.epCloseNbx(ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) requests.push_back({request, nullptr});
  }
  settle(&requests, deadline);
  // Messages no receive will take: the CTS for the message that never came after a connection's last, an abort
  // notice too late. Taken here, or UCX complains of them when the worker goes.
  std::vector<uint8_t> scratch;
  for (ucp_tag_recv_info_t info{}; !deadline.expired();) {
    ucp_tag_message_h message = api.tagProbeNb(worker_, 0, 0, 1, &info);
    if (message == nullptr) break;
    scratch.resize(std::max<size_t>(info.length, 1));
    ucp_request_param_t take{};
    void* request = api.tagMsgRecvNbx(worker_, scratch.data(), info.length, message, &take);
    if (UCS_PTR_IS_ERR(request)) break;
    std::vector<Orphan> one;
    if (request != nullptr) one.push_back({request, nullptr});
    settle(&one, deadline);
  }
  if (!requests.empty()) {
    // UCX may still write into a connection's FIFO or read a CTS buffer: those are never freed.
    LOOM_WARN(NET, "ucx: rank %d: %zu request(s) had not ended after %lld ms; leaving them", context().rank,
              requests.size(), static_cast<long long>(kCloseWaitMs));
    for (auto& [request, buffer] : sending_) (void)buffer.release();
    for (Orphan& orphan : requests)
      if (orphan.conn != nullptr) new std::shared_ptr<ProxyConn>(std::move(orphan.conn));
  }
  sending_.clear();
  api.workerDestroy(worker_);
  api.cleanup(ucpContext_);
}

class UcxTransport : public Transport {
 public:
  const char* name() const override { return "ucx"; }

  bool canConnect(const PeerInfo&, const PeerInfo&, std::string* why) const override {
    if (ucx().why.empty()) return true;
    *why = ucx().why;
    return false;
  }
  bool movesByProxy() const override { return true; }

  loomResult_t openComm(const TransportCommContext& context, std::unique_ptr<TransportComm>* out) override {
    auto comm = std::make_unique<UcxComm>(context);
    LOOM_CHECK(comm->start());
    *out = std::move(comm);
    return loomSuccess;
  }

  loomResult_t createReceiver(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                              std::unique_ptr<Endpoint>* out) override {
    return open(static_cast<UcxComm*>(state), false, key.sender, key.channel, shape, out);
  }

  loomResult_t attachSender(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                            const WaitCheck& check, std::unique_ptr<Endpoint>* out) override {
    LOOM_CHECK(check());
    return open(static_cast<UcxComm*>(state), true, key.receiver, key.channel, shape, out);
  }

 private:
  // Either end: UCX connects on the first message, so both are ready at once.
  static loomResult_t open(UcxComm* comm, bool sends, int peer, int channel, const FifoShape& shape,
                           std::unique_ptr<Endpoint>* out) {
    auto conn = std::make_shared<UcxConn>(sends, peer, channel, shape, comm->doorbell(), comm->ucpContext());
    conn->connected = true;
    return comm->attach(std::move(conn), out);
  }
};

}  // namespace

Transport* ucxTransport() {
  static UcxTransport transport;
  return &transport;
}

}  // namespace loom
