// The verbs calls the ib transport makes, as one table of functions with libibverbs' own signatures and structs.
//
// Two providers fill it:
//  - libibverbs, loaded with dlopen (libibverbs.so.1) when a communicator first asks for ib; the calls that
//    verbs.h defines inline (post_send, post_recv, poll_cq, req_notify_cq) go through the device's ops as they
//    would in a program linked against it;
//  - softib (softib.cc): a software device that emulates RC queue pairs, memory regions with keys, completion
//    queues and completion channels across the processes of one machine, in shared memory, moving RDMA writes
//    with process_vm_writev. It is for tests on machines without an HCA; LOOM_IB_PROVIDER=softib selects it.
// The transport never calls an ibv_* function directly, only this table.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace loom {

struct VerbsApi {
  const char* provider;  // "libibverbs" or "softib", for messages

  ibv_device** (*getDeviceList)(int* count);
  void (*freeDeviceList)(ibv_device** list);
  const char* (*getDeviceName)(ibv_device* device);
  ibv_context* (*openDevice)(ibv_device* device);
  int (*closeDevice)(ibv_context* context);
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr);
  int (*queryPort)(ibv_context* context, uint8_t port, ibv_port_attr* attr);
  int (*queryGid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid);

  ibv_pd* (*allocPd)(ibv_context* context);
  int (*deallocPd)(ibv_pd* pd);
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*deregMr)(ibv_mr* mr);

  ibv_comp_channel* (*createCompChannel)(ibv_context* context);
  int (*destroyCompChannel)(ibv_comp_channel* channel);
  ibv_cq* (*createCq)(ibv_context* context, int entries, void* cqContext, ibv_comp_channel* channel, int vector);
  int (*destroyCq)(ibv_cq* cq);
  int (*reqNotifyCq)(ibv_cq* cq, int solicitedOnly);
  int (*getCqEvent)(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext);
  void (*ackCqEvents)(ibv_cq* cq, unsigned int count);
  int (*pollCq)(ibv_cq* cq, int entries, ibv_wc* wc);

  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroyQp)(ibv_qp* qp);
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);

  const char* (*wcStatusStr)(ibv_wc_status status);
};

// The provider LOOM_IB_PROVIDER names (libibverbs by default), loaded once; nullptr with *why when it cannot
// load.
const VerbsApi* verbsApi(std::string* why);
// Each provider on its own (verbs.cc, softib.cc).
const VerbsApi* libibverbsApi(std::string* why);
const VerbsApi* softibApi(std::string* why);

}  // namespace loom
