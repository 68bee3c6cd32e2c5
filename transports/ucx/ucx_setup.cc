// ucx, set up: libucp loaded at run time, the context and worker, worker addresses through the bootstrap,
// endpoints made on first use and their error handlers, the teardown, and the Transport (ucx_comm.h describes
// the design).
#include "transports/ucx/ucx_comm.h"

#include <dlfcn.h>
#include <poll.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "src/base/bootstrap.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "transports/ucx/lanes.h"

namespace loom::ucxnet {

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

namespace {

class UcxTransport : public Transport {
 public:
  const char* name() const override { return "ucx"; }

  bool canConnect(const PeerInfo&, const PeerInfo&, std::string* why) const override {
    if (ucx().why.empty()) return true;
    *why = ucx().why;
    return false;
  }
  TransportTraits traits() const override {
    TransportTraits traits;
    traits.movesByProxy = traits.proxySendsFromCallerMemory = true;
    return traits;
  }

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

}  // namespace loom::ucxnet

namespace loom {

Transport* ucxTransport() {
  static ucxnet::UcxTransport transport;
  return &transport;
}

}  // namespace loom
