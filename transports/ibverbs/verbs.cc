// The verbs table filled from libibverbs.so.1, loaded with dlopen (verbs.h), and the choice of provider.
#include "transports/ibverbs/verbs.h"

#include <dlfcn.h>

#include <mutex>
#include <type_traits>

#include "src/base/params.h"

namespace loom {
namespace {

// The calls verbs.h defines inline reach the provider through the context's ops, as in a linked program.
int postSendOps(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return qp->context->ops.post_send(qp, wr, bad); }
int postRecvOps(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return qp->context->ops.post_recv(qp, wr, bad); }
int pollCqOps(ibv_cq* cq, int entries, ibv_wc* wc) { return cq->context->ops.poll_cq(cq, entries, wc); }
int reqNotifyOps(ibv_cq* cq, int solicitedOnly) { return cq->context->ops.req_notify_cq(cq, solicitedOnly); }

// ibv_query_port as verbs.h defines it: the extended op where the provider has one, else the exported symbol,
// which fills the older (shorter) struct.
using CompatQueryPort = int (*)(ibv_context*, uint8_t, _compat_ibv_port_attr*);
CompatQueryPort compatQueryPort = nullptr;
int queryPortOps(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  if (verbs_context* extended = verbs_get_ctx_op(context, query_port))
    return extended->query_port(context, port, attr, sizeof(*attr));
  *attr = ibv_port_attr{};
  return compatQueryPort(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

struct Loaded {
  VerbsApi api{};
  std::string why;  // empty once loaded
};

Loaded loadLibibverbs() {
  Loaded loaded;
  VerbsApi& a = loaded.api;
  a.provider = "libibverbs";
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    loaded.why = std::string("cannot load libibverbs: ") + dlerror() + " (install ibverbs-providers and libibverbs1)";
    return loaded;
  }
  auto load = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr && loaded.why.empty()) loaded.why = std::string("libibverbs lacks ") + name;
  };
  load(a.getDeviceList, "ibv_get_device_list");
  load(a.freeDeviceList, "ibv_free_device_list");
  load(a.getDeviceName, "ibv_get_device_name");
  load(a.openDevice, "ibv_open_device");
  load(a.closeDevice, "ibv_close_device");
  load(a.queryDevice, "ibv_query_device");
  load(compatQueryPort, "ibv_query_port");
  a.queryPort = queryPortOps;
  load(a.queryGid, "ibv_query_gid");
  load(a.allocPd, "ibv_alloc_pd");
  load(a.deallocPd, "ibv_dealloc_pd");
  load(a.regMr, "ibv_reg_mr");
  load(a.deregMr, "ibv_dereg_mr");
  load(a.createCompChannel, "ibv_create_comp_channel");
  load(a.destroyCompChannel, "ibv_destroy_comp_channel");
  load(a.createCq, "ibv_create_cq");
  load(a.destroyCq, "ibv_destroy_cq");
  load(a.getCqEvent, "ibv_get_cq_event");
  load(a.ackCqEvents, "ibv_ack_cq_events");
  load(a.createQp, "ibv_create_qp");
  load(a.modifyQp, "ibv_modify_qp");
  load(a.destroyQp, "ibv_destroy_qp");
  load(a.wcStatusStr, "ibv_wc_status_str");
  a.postSend = postSendOps;
  a.postRecv = postRecvOps;
  a.pollCq = pollCqOps;
  a.reqNotifyCq = reqNotifyOps;
  return loaded;
}

}  // namespace

const VerbsApi* libibverbsApi(std::string* why) {
  static const Loaded loaded = loadLibibverbs();
  if (!loaded.why.empty()) {
    *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

const VerbsApi* verbsApi(std::string* why) {
  const std::string provider = params::ibProvider();
  if (provider == "softib") return softibApi(why);
  if (provider == "libibverbs" || provider.empty()) return libibverbsApi(why);
  *why = "LOOM_IB_PROVIDER=\"" + provider + "\": expected libibverbs or softib";
  return nullptr;
}

}  // namespace loom
