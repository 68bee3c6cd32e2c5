// ucx: connections over UCX's tagged messages (UCP), for ranks on different hosts (or any ranks, when
// LOOM_TRANSPORTS or LOOM_NET asks for it). UCX picks its own wires: InfiniBand, RoCE, TCP, shared memory; it
// honours UCX_TLS and UCX_NET_DEVICES. libucp is loaded with dlopen when a communicator first needs it, so
// libloom runs where UCX is not installed and says why ucx is unavailable.
//
// A proxied transport (proxy.h): each end keeps a FIFO in its own memory, and the communicator's proxy thread moves
// the messages. A communicator has one UCP context and worker; the worker addresses are exchanged at init through
// the bootstrap; an endpoint is made per peer the first time a connection needs it (either direction: the
// endpoint's error handler is how a dead peer is seen). Each FIFO message is one tagged send, received straight
// into the receiving FIFO's next Simple slot (an LL message is then copied into its LL slot), and the proxy keeps
// one send and one receive in flight per connection.
//
// Tags: bits 63-60 the kind (0 Simple, 1 LL, 2 abort notice), bit 59 set for a notice going back from a
// receiver to its sender, bits 58-40 the message's sequence number on its connection (modulo 2^19), bits 39-24
// the channel, bits 23-0 the rank that sent the tagged message. A receiving connection matches its next message
// exactly, whatever its kind, so each message lands in the slot posted for it. A sending connection listens for the
// notice back. An executor that gives up has the proxy send an abort notice to the peer (kAbortedByPeer there); an
// endpoint error marks every connection with that peer kConnectionLost.
#include "transports/proxy.h"

#include <dlfcn.h>
#include <poll.h>
#include <ucp/api/ucp.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/check.h"
#include "src/core/log.h"

namespace loom {
namespace {

constexpr uint64_t kKindSimple = 0, kKindLL = 1, kKindAbort = 2;
constexpr uint64_t kBackward = uint64_t{1} << 59;
constexpr uint64_t kSequenceMask = (uint64_t{1} << 19) - 1;
constexpr uint64_t kMatchAllButKind = ~(uint64_t{0xf} << 60);
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
    load(a.statusString, ucs, "ucs_status_string");
    return a;
  }();
  return api;
}

const char* statusText(ucs_status_t status) { return ucx().statusString ? ucx().statusString(status) : "?"; }

struct UcxConn : ProxyConn {
  using ProxyConn::ProxyConn;
  void* request = nullptr;  // the send or receive in flight (nullptr: none)
  uint64_t sequence = 0;    // of the next message sent or received
  bool receiving = false;   // a receive was posted and has not been delivered
  bool received = false;    // ... and it has ended, with recvStatus and info
  ucs_status_t recvStatus = UCS_OK;
  ucp_tag_recv_info_t info{};
  void* notice = nullptr;  // a sending connection's receive of the abort notice back
  bool noticed = false;    // ... which has ended
};

// Receive completions, called from ucp_worker_progress on the proxy thread.
void onReceived(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* conn = static_cast<UcxConn*>(user);
  conn->received = true;
  conn->recvStatus = status;
  if (info != nullptr) conn->info = *info;
}
void onNoticed(void*, ucs_status_t, const ucp_tag_recv_info_t*, void* user) { static_cast<UcxConn*>(user)->noticed = true; }

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
    closeAll();
  }

  loomResult_t start();
  loomResult_t open(ucp_address_t** address, size_t* length);

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
    return moved;
  }
  bool pump(ProxyConn& conn) override;
  void notifyGaveUp(ProxyConn& conn) override;
  void shutNetwork(ProxyConn& conn, bool graceful) override;
  void sleep(int64_t micros) override;

  bool pumpOut(UcxConn& conn);
  bool pumpIn(UcxConn& conn);
  ucp_ep_h endpoint(int peer);
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void closeAll();

  ucp_context_h ucpContext_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int workerFd_ = -1;
  std::vector<std::vector<uint8_t>> addresses_;  // every rank's worker address
  std::map<int, ucp_ep_h> endpoints_;            // the proxy thread's
  std::map<int, PeerRef> refs_;
  // Requests of closed connections, freed once they end; each keeps its connection (and the FIFO slot a receive
  // may still write into) alive until then.
  struct Orphan {
    void* request;
    std::shared_ptr<ProxyConn> conn;
  };
  std::vector<Orphan> orphans_;
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
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
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

// Sending side: one tagged send in flight; the next once it has ended, as the FIFO's next message.
bool UcxComm::pumpOut(UcxConn& conn) {
  bool progressed = false;
  if (conn.notice == nullptr) {
    void* request = postReceive(worker_, nullptr, 0, tagOf(kKindAbort, true, 0, conn.channel, conn.peer), kMatchAll,
                                &conn, onNoticed);
    if (UCS_PTR_IS_ERR(request)) {
      fail(conn, std::string("cannot listen for notices: ") + statusText(UCS_PTR_STATUS(request)));
      return true;
    }
    conn.notice = request;
  } else if (conn.noticed) {
    ucx().requestFree(conn.notice);
    conn.notice = nullptr;
    peerGaveUp(conn);
    return true;
  }
  for (;;) {
    if (conn.request != nullptr) {
      ucs_status_t status = ucx().requestCheckStatus(conn.request);
      if (status == UCS_INPROGRESS) return progressed;
      ucx().requestFree(conn.request);
      conn.request = nullptr;
      if (status != UCS_OK) {
        fail(conn, std::string("could not send: ") + statusText(status));
        return true;
      }
      conn.drain->release();
      conn.inFrame = false;
      ++sent_;
      progressed = true;
    }
    bool bad = false;
    if (!nextOutgoing(conn, &bad)) {
      if (bad) fail(conn, "was given a direct message that is not in this process's memory");
      return progressed || bad;
    }
    uint64_t kind = conn.protocol == Protocol::kLL ? kKindLL : kKindSimple;
    ucp_request_param_t param{};
    void* request = ucx().tagSendNbx(endpoint(conn.peer), conn.payload, conn.payloadBytes,
                                     tagOf(kind, false, conn.sequence++, conn.channel, context().rank), &param);
    if (UCS_PTR_IS_ERR(request)) {
      fail(conn, std::string("could not send: ") + statusText(UCS_PTR_STATUS(request)));
      return true;
    }
    conn.inFrame = true;
    progressed = true;
    if (request != nullptr) {
      conn.request = request;
      return progressed;
    }
    conn.drain->release();  // sent at once
    conn.inFrame = false;
    ++sent_;
  }
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
      void* request = postReceive(worker_, slot, fifoPayloadBytes(conn.shape, Protocol::kSimple),
                                  tagOf(0, false, conn.sequence++, conn.channel, conn.peer), kMatchAllButKind, &conn,
                                  onReceived);
      if (UCS_PTR_IS_ERR(request)) {
        fail(conn, std::string("could not receive: ") + statusText(UCS_PTR_STATUS(request)));
        return true;
      }
      conn.receiving = true;
      conn.request = request;
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
      peerGaveUp(conn);
      return true;
    }
    if (kind == kKindLL) {
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
  uint64_t sequence = conn.sends ? static_cast<UcxConn&>(conn).sequence : 0;
  void* request =
      ucx().tagSendNbx(ep, nullptr, 0, tagOf(kKindAbort, !conn.sends, sequence, conn.channel, context().rank), &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) orphans_.push_back({request, nullptr});
}

// The requests of a closed connection go on by themselves: receives are cancelled, and both are freed once they
// end (progress()).
void UcxComm::shutNetwork(ProxyConn& base, bool) {
  auto& conn = static_cast<UcxConn&>(base);
  std::shared_ptr<ProxyConn> keep;
  for (auto& held : conns_)
    if (held.get() == &base) keep = held;
  for (void** request : {&conn.request, &conn.notice}) {
    if (*request == nullptr) continue;
    if (!conn.sends || request == &conn.notice) ucx().requestCancel(worker_, *request);
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
  std::vector<Orphan> closing;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (auto& [peer, ep] : endpoints_) {
    void* request = api.epCloseNbx(ep, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back({request, nullptr});
  }
  for (const Orphan& orphan : orphans_) api.requestCancel(worker_, orphan.request);
  Deadline deadline(kCloseWaitMs);
  while ((!closing.empty() || !orphans_.empty()) && !deadline.expired()) {
    api.workerProgress(worker_);
    for (auto* list : {&closing, &orphans_}) {
      std::erase_if(*list, [&](const Orphan& orphan) {
        if (api.requestCheckStatus(orphan.request) == UCS_INPROGRESS) return false;
        api.requestFree(orphan.request);
        return true;
      });
    }
  }
  if (!orphans_.empty())
    LOOM_WARN(NET, "ucx: rank %d: %zu request(s) had not ended after %lld ms; leaving them", context().rank,
              orphans_.size(), static_cast<long long>(kCloseWaitMs));
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
    auto conn = std::make_shared<UcxConn>(sends, peer, channel, shape, comm->doorbell());
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
