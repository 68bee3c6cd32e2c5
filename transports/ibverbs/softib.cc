// softib: a software verbs device (verbs.h, LOOM_IB_PROVIDER=softib) that emulates an RC-capable HCA across the
// processes and threads of one machine, so that the ib transport's connection setup, flow control, completions
// and error paths run in tests on machines without one.
//
// Devices are the names in LOOM_SOFTIB_DEVICES, each with one active RoCE-style port: addressing by GID, lid 0.
// GID 0 is fe80::/64 with a hash of the host name and device name (processes in another UTS namespace look like
// another host), GID 1 the IPv4-mapped address of the first up interface other than loopback. Queue pairs,
// memory regions and completion queues are entries in the fabric's shared tables (softib_fabric.h), so a peer in
// another process finds them, checks keys and pushes receive completions; RDMA writes move with
// process_vm_writev into the owner of the remote region (memcpy within a process), under the fabric's lock, and
// announced to deregMr, so that a region is never written once its owner's deregMr has returned. Only writes take
// the lock; a process stopped while it holds it blocks no other thread (softib_fabric.h).
//
// Work requests are carried out as a real RC QP would: in order, checking the local keys, the responder (it
// exists, is alive, is in RTR or RTS, is connected back to this QP, answers to the destination GID), the remote
// key and access, and for a write with immediate a posted receive. Packets that reach no responder are retried
// until the transport timeout (4.096 us x 2^timeout x (retry_cnt + 1)) ends in IBV_WC_RETRY_EXC_ERR; a missing
// receive is an RNR NAK, retried after the responder's min_rnr_timer, rnr_retry times (7: for ever). A failed work
// request takes its QP to the error state, which flushes everything else outstanding; the peer QP is not touched.
//
// There is no background thread: a QP's send work requests progress only while the process that owns it calls
// postSend on it or pollCq on its send CQ. An owner asleep on that CQ's channel gets an event (with no completion)
// when the responder its write waits for posts a receive or reaches RTR, and the write is tried again at once; a
// write that can only time out (its peer died) fails at the owner's next poll after the timeout. Receives need
// nothing of their owner: the sender pushes their completions. Left out: sends, reads and atomics, SRQs, UC and
// UD, memory windows, address handles and asynchronous events.
#include "transports/ibverbs/softib.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/siphash.h"
#include "transports/ibverbs/verbs.h"

namespace loom::softib {
namespace {

// A new object for a verbs call, or nullptr with errno ENOMEM, as libibverbs reports it. Callers release it once
// nothing can fail any more.
template <typename T>
std::unique_ptr<T> newObject() {
  std::unique_ptr<T> object(new (std::nothrow) T{});
  if (object == nullptr) errno = ENOMEM;
  return object;
}

// ---- Devices and ports ----

// ibv_device objects live as long as the process, as libibverbs' do; a name seen once keeps its device.
std::mutex devicesMutex;
std::deque<SoftDevice>* knownDevices = new std::deque<SoftDevice>;

ibv_device** getDeviceList(int* count) {
  std::vector<ibv_device*> found;
  std::string names = params::softibDevices();
  std::lock_guard<std::mutex> lock(devicesMutex);
  for (size_t begin = 0; begin <= names.size();) {
    size_t end = std::min(names.find(',', begin), names.size());
    std::string name = names.substr(begin, end - begin);
    begin = end + 1;
    if (name.empty()) continue;
    if (name.size() >= IBV_SYSFS_NAME_MAX) {
      LOOM_WARN(IB, "softib: device name \"%s\" in LOOM_SOFTIB_DEVICES is too long (at most %d characters)",
                name.c_str(), IBV_SYSFS_NAME_MAX - 1);
      continue;
    }
    auto known = std::find_if(knownDevices->begin(), knownDevices->end(),
                              [&](const SoftDevice& device) { return name == device.device.name; });
    if (known == knownDevices->end()) {
      SoftDevice& device = knownDevices->emplace_back();
      device.device.node_type = IBV_NODE_CA;
      device.device.transport_type = IBV_TRANSPORT_IB;
      std::snprintf(device.device.name, sizeof(device.device.name), "%s", name.c_str());
      std::snprintf(device.device.dev_name, sizeof(device.device.dev_name), "uverbs%zu", knownDevices->size() - 1);
      known = knownDevices->end() - 1;
    }
    if (std::find(found.begin(), found.end(), &known->device) == found.end()) found.push_back(&known->device);
  }
  auto** list = static_cast<ibv_device**>(std::calloc(found.size() + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  std::copy(found.begin(), found.end(), list);
  if (count != nullptr) *count = static_cast<int>(found.size());
  return list;
}

void freeDeviceList(ibv_device** list) { std::free(list); }

const char* getDeviceName(ibv_device* device) { return device->name; }

// The identity of this host (its UTS name, which tests change per network namespace) and a device.
uint64_t hostDeviceGuid(const char* deviceName) {
  static const uint8_t kKey[kSipHashKeyBytes] = {'l', 'o', 'o', 'm', '-', 's', 'o', 'f',
                                                 't', 'i', 'b', '-', 'g', 'i', 'd', 0};
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string text = std::string(host) + "/" + deviceName;
  return sipHash24(kKey, text.data(), text.size());
}

// ::ffff:a.b.c.d of the first up IPv4 interface other than loopback; all zeros when there is none.
ibv_gid ipv4MappedGid() {
  ibv_gid gid{};
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return gid;
  for (ifaddrs* it = interfaces; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0) continue;
    gid.raw[10] = 0xff;
    gid.raw[11] = 0xff;
    std::memcpy(&gid.raw[12], &reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr, 4);
    break;
  }
  freeifaddrs(interfaces);
  return gid;
}

int reqNotifyCq(ibv_cq* cq, int solicitedOnly);

ibv_context* openDevice(ibv_device* device) {
  auto soft = newObject<SoftContext>();
  if (soft == nullptr) return nullptr;
  ibv_context& context = soft->context;
  context.device = device;
  context.cmd_fd = -1;
  context.async_fd = -1;
  context.num_comp_vectors = 1;
  pthread_mutex_init(&context.mutex, nullptr);
  // The calls libibverbs defines inline in verbs.h reach the provider through these.
  context.ops.poll_cq = pollCq;
  context.ops.req_notify_cq = reqNotifyCq;
  context.ops.post_send = postSend;
  context.ops.post_recv = postRecv;
  // Peers write into this process with process_vm_writev, which Yama (ptrace_scope 1) allows only to a process's
  // ancestors unless it names its tracers; a process with a softib device lets any of its user's processes in,
  // as it would let an HCA. Without Yama the call fails and changes nothing.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  soft->guid = hostDeviceGuid(device->name);
  soft->gids[0].global.subnet_prefix = htobe64(0xfe80000000000000);
  soft->gids[0].global.interface_id = htobe64(soft->guid);
  soft->gids[1] = ipv4MappedGid();
  LOOM_TRACE(IB, "softib: opened %s", device->name);
  return &soft.release()->context;
}

int closeDevice(ibv_context* context) {
  pthread_mutex_destroy(&context->mutex);
  delete asContext(context);
  return 0;
}

int queryDevice(ibv_context* context, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof(attr->fw_ver), "softib 1");
  attr->node_guid = htobe64(asContext(context)->guid);
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = uint64_t{1} << 46;
  attr->page_size_cap = 4096;
  attr->hw_ver = 1;
  attr->max_qp = kMaxQps;
  attr->max_qp_wr = kMaxWr;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
  attr->max_sge = kMaxSge;
  attr->max_cq = kMaxCqs;
  attr->max_cqe = kMaxCqe;
  attr->max_mr = kMaxMrs;
  attr->max_pd = 1 << 20;
  attr->max_qp_rd_atom = kMaxRdAtomic;
  attr->max_qp_init_rd_atom = kMaxRdAtomic;
  attr->max_res_rd_atom = kMaxRdAtomic * kMaxQps;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->local_ca_ack_delay = 15;
  attr->phys_port_cnt = 1;
  return 0;
}

int queryPort(ibv_context*, uint8_t port, ibv_port_attr* attr) {
  if (port != kPort) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = kGidCount;
  attr->max_msg_sz = kMaxMessageBytes;
  attr->pkey_tbl_len = 1;
  attr->max_vl_num = 1;
  attr->active_width = 2;   // 4x
  attr->active_speed = 32;  // EDR
  attr->phys_state = 5;     // LinkUp
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int queryGid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  if (port != kPort || index < 0 || index >= kGidCount) {
    errno = EINVAL;
    return -1;
  }
  *gid = asContext(context)->gids[index];
  return 0;
}

// ---- Protection domains and memory regions ----

ibv_pd* allocPd(ibv_context* context) {
  auto pd = newObject<SoftPd>();
  if (pd == nullptr) return nullptr;
  pd->pd.context = context;
  pd->id = std::atomic_ref<uint64_t>(fabric().tables().header.nextPdId).fetch_add(1);
  pd->pd.handle = static_cast<uint32_t>(pd->id);
  return &pd.release()->pd;
}

int deallocPd(ibv_pd* pd) {
  if (asPd(pd)->users.load() > 0) return EBUSY;
  delete asPd(pd);
  return 0;
}

ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) {
  const int remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  if ((access & remote) != 0 && (access & IBV_ACCESS_LOCAL_WRITE) == 0) {
    errno = EINVAL;  // as on hardware: a region peers may write must be writable locally
    return nullptr;
  }
  auto mr = newObject<SoftMr>();
  if (mr == nullptr) return nullptr;
  {
    int slot = fabric().claimMr();
    if (slot < 0) return nullptr;  // errno ENOMEM
    MrSlot& shared = fabric().tables().mrs[slot];
    const uint32_t lkey = fabric().newId(static_cast<uint32_t>(slot), kMrSlotBits, 31);
    atomicStore(shared.lkey, lkey, kRelaxed);
    atomicStore(shared.rkey, lkey | kRkeyBit, kRelaxed);
    shared.access = static_cast<uint32_t>(access);
    shared.pdId = asPd(pd)->id;
    shared.addr = reinterpret_cast<uint64_t>(addr);
    shared.length = length;
    Fabric::publish(shared);
    mr->mr.lkey = lkey;
    mr->mr.rkey = lkey | kRkeyBit;
  }
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.handle = mr->mr.lkey;
  mr->pd = asPd(pd);
  mr->pd->users++;
  return &mr.release()->mr;
}

// No new write finds the region once it is released; the one that may be landing in it now (the fabric lock's
// holder's) is waited for. EBUSY, the region still registered as far as the caller knows, when that writer is
// stopped: the caller must not free the memory (a later deregMr of it succeeds once the write is done).
int deregMr(ibv_mr* mr) {
  if (MrSlot* shared = fabric().mrByLkey(mr->lkey)) fabric().release(*shared);
  if (!fabric().waitForWritesInto(mr->rkey)) {
    LOOM_INFO(IB, "softib: memory region %u is being written by a stopped process; not deregistered", mr->lkey);
    return EBUSY;
  }
  asMr(mr)->pd->users--;
  delete asMr(mr);
  return 0;
}

// ---- Completion channels and queues ----

ibv_comp_channel* createCompChannel(ibv_context* context) {
  auto channel = newObject<SoftChannel>();
  if (channel == nullptr) return nullptr;
  const int slot = fabric().claimChannel();
  if (slot < 0) return nullptr;  // errno ENOMEM
  ChannelSlot& shared = fabric().tables().channels[slot];
  channel->id = fabric().newId(static_cast<uint32_t>(slot), kChannelSlotBits, 31);
  atomicStore(shared.id, channel->id, kRelaxed);
  Fabric::publish(shared);
  // A FIFO that any process can open and write an event into; the owner keeps it open for reading and writing,
  // so it never reads an end of file and writers find a reader for as long as the channel lives.
  std::string path = fabric().channelPath(channel->id);
  unlink(path.c_str());
  int fd = -1;
  if (mkfifo(path.c_str(), 0600) == 0) fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    LOOM_WARN(IB, "softib: cannot make the completion channel %s: %m", path.c_str());
    unlink(path.c_str());
    fabric().release(shared);
    errno = error;
    return nullptr;
  }
  channel->channel.context = context;
  channel->channel.fd = fd;
  return &channel.release()->channel;
}

int destroyCompChannel(ibv_comp_channel* ibChannel) {
  SoftChannel* channel = asChannel(ibChannel);
  {
    std::lock_guard<std::mutex> lock(channel->mutex);
    if (!channel->cqs.empty()) return EBUSY;
  }
  unlink(fabric().channelPath(channel->id).c_str());
  close(channel->channel.fd);
  ChannelSlot& shared = fabric().tables().channels[channel->id & (kMaxChannels - 1)];
  if (atomicLoad(shared.id, kRelaxed) == channel->id && atomicLoad(shared.pid, kOrdered) == getpid())
    fabric().release(shared);
  delete channel;
  return 0;
}

ibv_cq* createCq(ibv_context* context, int entries, void* cqContext, ibv_comp_channel* ibChannel, int vector) {
  if (entries < 1 || entries > static_cast<int>(kMaxCqe) || vector < 0 || vector >= context->num_comp_vectors ||
      (ibChannel != nullptr && ibChannel->context != context)) {
    errno = EINVAL;
    return nullptr;
  }
  auto cq = newObject<SoftCq>();
  if (cq == nullptr) return nullptr;
  SoftChannel* channel = ibChannel != nullptr ? asChannel(ibChannel) : nullptr;
  {
    int slot = fabric().claimCq();
    if (slot < 0) return nullptr;  // errno ENOMEM
    cq->id = fabric().newId(static_cast<uint32_t>(slot), kCqSlotBits, 31);
    cq->slot = &fabric().tables().cqs[slot];
    atomicStore(cq->slot->id, cq->id, kRelaxed);
    atomicStore(cq->slot->capacity, static_cast<uint32_t>(entries), kRelaxed);
    atomicStore(cq->slot->channelId, channel != nullptr ? channel->id : 0u, kRelaxed);
    Fabric::publish(*cq->slot);
  }
  cq->cq.context = context;
  cq->cq.channel = ibChannel;
  cq->cq.cq_context = cqContext;
  cq->cq.cqe = entries;
  cq->cq.handle = cq->id;
  cq->channel = channel;
  if (channel != nullptr) {
    std::lock_guard<std::mutex> lock(channel->mutex);
    channel->cqs[cq->id] = cq.get();
    ++channel->channel.refcnt;
  }
  return &cq.release()->cq;
}

int destroyCq(ibv_cq* ibCq) {
  SoftCq* cq = asCq(ibCq);
  if (cq->qpUses.load() > 0) return EBUSY;
  if (cq->channel != nullptr) {
    std::lock_guard<std::mutex> lock(cq->channel->mutex);
    cq->channel->cqs.erase(cq->id);
    --cq->channel->channel.refcnt;
  }
  if (fabric().cq(cq->id) == cq->slot) fabric().release(*cq->slot);
  delete cq;
  return 0;
}

// Without the mutex: the caller polls after arming, and a pusher looks at the arming after it published
// (CqSlot::armed).
int reqNotifyCq(ibv_cq* ibCq, int solicitedOnly) {
  SoftCq* cq = asCq(ibCq);
  atomicStore(cq->slot->armed, solicitedOnly != 0 ? kArmedSolicited : kArmedAll, kRelaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return 0;
}

int getCqEvent(ibv_comp_channel* ibChannel, ibv_cq** cqOut, void** cqContext) {
  SoftChannel* channel = asChannel(ibChannel);
  for (;;) {
    uint32_t cqId = 0;
    ssize_t got = read(ibChannel->fd, &cqId, sizeof(cqId));  // blocks unless the caller made fd non-blocking
    if (got != static_cast<ssize_t>(sizeof(cqId))) {
      if (got >= 0) errno = EIO;
      return -1;
    }
    std::lock_guard<std::mutex> lock(channel->mutex);
    auto found = channel->cqs.find(cqId);
    if (found == channel->cqs.end()) continue;  // an event of a CQ destroyed since: nobody waits for it
    *cqOut = &found->second->cq;
    *cqContext = found->second->cq.cq_context;
    return 0;
  }
}

void ackCqEvents(ibv_cq* cq, unsigned int count) {
  std::atomic_ref<uint32_t>(cq->comp_events_completed).fetch_add(count);
}

// ---- Queue pairs: state machine ----

// Attribute masks of the RC transitions, as the verbs specification requires them.
constexpr int kInitRequired = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kInitOptional = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrRequired = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtrOptional = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
constexpr int kRtsRequired =
    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
constexpr int kRtsOptional =
    IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE;

// The masks a transition from `from` to `to` needs and allows; false when RC QPs cannot make it.
bool transitionMasks(ibv_qp_state from, ibv_qp_state to, int* required, int* optional) {
  *optional = 0;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
    *required = IBV_QP_STATE;
    return true;
  }
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    *required = kInitRequired;
    return true;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
    *required = 0;
    *optional = IBV_QP_STATE | kInitOptional;
    return true;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    *required = kRtrRequired;
    *optional = kRtrOptional;
    return true;
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    *required = kRtsRequired;
    *optional = kRtsOptional;
    return true;
  }
  if (from == IBV_QPS_RTS && to == IBV_QPS_RTS) {
    *required = 0;
    *optional = IBV_QP_STATE | kRtsOptional;
    return true;
  }
  return false;
}

// The values of the attributes `mask` names are ones this port accepts.
bool attributesValid(const SoftQp* qp, const ibv_qp_attr& attr, int mask) {
  const int knownAccess =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if ((mask & IBV_QP_PORT) && attr.port_num != kPort) return false;
  if ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) return false;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~knownAccess) != 0) return false;
  if ((mask & IBV_QP_PATH_MTU) && (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > IBV_MTU_4096)) return false;
  if ((mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > 0xffffff) return false;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > kMaxRdAtomic) return false;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > kMaxRdAtomic) return false;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) return false;
  if ((mask & IBV_QP_TIMEOUT) && attr.timeout > 31) return false;
  if ((mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) return false;
  if ((mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > 7) return false;
  if (mask & IBV_QP_AV) {
    // The port is Ethernet: peers are addressed by GID, so the address vector must carry a global route, from a
    // GID this port has.
    const ibv_ah_attr& ah = attr.ah_attr;
    if (!ah.is_global || (ah.port_num != 0 && ah.port_num != kPort) || ah.grh.sgid_index >= kGidCount) return false;
    const auto* context = reinterpret_cast<const SoftContext*>(qp->qp.context);
    if (isZero(context->gids[ah.grh.sgid_index])) return false;
  }
  return true;
}

int modifyQp(ibv_qp* ibQp, ibv_qp_attr* attr, int mask) {
  SoftQp* qp = asQp(ibQp);
  std::lock_guard<std::mutex> sendLock(qp->sendMutex);
  const ibv_qp_state from = qp->qp.state;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != from) return EINVAL;
  const ibv_qp_state to = (mask & IBV_QP_STATE) ? attr->qp_state : from;
  int required = 0, optional = 0;
  if (!transitionMasks(from, to, &required, &optional)) return EINVAL;
  if ((mask & required) != required || (mask & ~(required | optional)) != 0) return EINVAL;
  if (!attributesValid(qp, *attr, mask)) return EINVAL;

  QpSlot& shared = *qp->slot;
  // Into the error state and back to reset, the QP's queues change as requesters may take from them: under the
  // mutex, which a stopped process may hold (EAGAIN then). The connecting transitions change only words a
  // requester reads after the state, published last.
  if (to == IBV_QPS_ERR || to == IBV_QPS_RESET) {
    FabricLock lock(fabric());
    if (!lock.held()) return EAGAIN;
    if (to == IBV_QPS_ERR && from != IBV_QPS_ERR) {
      flushAll(lock, qp);
    } else if (to == IBV_QPS_RESET) {
      // Reset discards every work request without a completion and forgets the connection.
      qp->sendCq->queued -= static_cast<int>(qp->sendQueue.size());
      qp->sendQueue.clear();
      qp->unsignaled = 0;
      qp->sqUsed = 0;
      qp->destQpNum = 0;
      qp->dgid = ibv_gid{};
      atomicStore(shared.destQpNum, 0u, kRelaxed);
      shared.dgid = shared.sgid = ibv_gid{};
      std::lock_guard<std::mutex> receives(qp->recvMutex);
      atomicStore(shared.recvHead, atomicLoad(shared.recvTail, kAcquire), kRelease);
      atomicStore(shared.waiting, 0u, kRelaxed);
    }
    atomicStore(shared.state, static_cast<uint32_t>(to), kOrdered);
    qp->qp.state = to;
  } else {
    if (mask & IBV_QP_ACCESS_FLAGS)
      atomicStore(shared.accessFlags, static_cast<uint32_t>(attr->qp_access_flags), kRelaxed);
    if (mask & IBV_QP_MIN_RNR_TIMER) atomicStore(shared.minRnrTimer, attr->min_rnr_timer, kRelaxed);
    if (mask & IBV_QP_DEST_QPN) {
      qp->destQpNum = attr->dest_qp_num;
      atomicStore(shared.destQpNum, attr->dest_qp_num, kRelaxed);
    }
    if (mask & IBV_QP_AV) {
      qp->dgid = shared.dgid = attr->ah_attr.grh.dgid;
      shared.sgid = reinterpret_cast<SoftContext*>(qp->qp.context)->gids[attr->ah_attr.grh.sgid_index];
    }
    atomicStore(shared.state, static_cast<uint32_t>(to), kOrdered);
    qp->qp.state = to;
    if (to == IBV_QPS_RTR && from != IBV_QPS_RTR) {
      ChannelSignals signals(fabric());
      wakeRequester(signals, shared);
    }
  }
  if (mask & IBV_QP_TIMEOUT) qp->timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) qp->retryCnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) qp->rnrRetry = attr->rnr_retry;
  if (from != to) LOOM_TRACE(IB, "softib: qp %u: state %d -> %d (peer qp %u)", qp->qp.qp_num, from, to, qp->destQpNum);
  return 0;
}

// ---- Queue pairs: creation ----

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (attr->qp_type != IBV_QPT_RC) {
    errno = (attr->qp_type == IBV_QPT_UC || attr->qp_type == IBV_QPT_UD) ? EOPNOTSUPP : EINVAL;
    return nullptr;
  }
  const ibv_qp_cap& cap = attr->cap;
  if (attr->send_cq == nullptr || attr->recv_cq == nullptr || attr->send_cq->context != pd->context ||
      attr->recv_cq->context != pd->context || attr->srq != nullptr || cap.max_send_wr > kMaxWr ||
      cap.max_recv_wr > kMaxWr || cap.max_send_sge > kMaxSge || cap.max_recv_sge > kMaxSge ||
      cap.max_inline_data > kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  auto qp = newObject<SoftQp>();
  if (qp == nullptr) return nullptr;
  const SoftContext* context = asContext(pd->context);
  qp->pd = asPd(pd);
  qp->sendCq = asCq(attr->send_cq);
  qp->recvCq = asCq(attr->recv_cq);
  qp->cap = cap;
  qp->signalAll = attr->sq_sig_all != 0;
  {
    int slot = fabric().claimQp();
    if (slot < 0) return nullptr;  // errno ENOMEM
    qp->slot = &fabric().tables().qps[slot];
    qp->qp.qp_num = fabric().newId(static_cast<uint32_t>(slot), kQpSlotBits, 24);
    QpSlot& shared = *qp->slot;
    atomicStore(shared.qpNum, qp->qp.qp_num, kRelaxed);
    shared.pdId = qp->pd->id;
    atomicStore(shared.state, static_cast<uint32_t>(IBV_QPS_RESET), kRelaxed);
    atomicStore(shared.sendCqId, qp->sendCq->id, kRelaxed);
    atomicStore(shared.recvCqId, qp->recvCq->id, kRelaxed);
    atomicStore(shared.maxRecvWr, cap.max_recv_wr, kRelaxed);
    std::copy(std::begin(context->gids), std::end(context->gids), shared.portGids);
    Fabric::publish(shared);
  }
  qp->qp.context = pd->context;
  qp->qp.qp_context = attr->qp_context;
  qp->qp.pd = pd;
  qp->qp.send_cq = attr->send_cq;
  qp->qp.recv_cq = attr->recv_cq;
  qp->qp.handle = qp->qp.qp_num;
  qp->qp.state = IBV_QPS_RESET;
  qp->qp.qp_type = IBV_QPT_RC;
  qp->pd->users++;
  qp->sendCq->qpUses++;
  qp->recvCq->qpUses++;
  {
    std::lock_guard<std::mutex> lock(qp->sendCq->qpsMutex);
    qp->sendCq->sendQps.push_back(qp.get());
  }
  LOOM_TRACE(IB, "softib: created qp %u", qp->qp.qp_num);
  return &qp.release()->qp;
}

int destroyQp(ibv_qp* ibQp) {
  SoftQp* qp = asQp(ibQp);
  {
    std::lock_guard<std::mutex> lock(qp->sendCq->qpsMutex);
    auto& qps = qp->sendCq->sendQps;
    qps.erase(std::remove(qps.begin(), qps.end(), qp), qps.end());
  }
  {
    std::lock_guard<std::mutex> sendLock(qp->sendMutex);
    qp->sendCq->queued -= static_cast<int>(qp->sendQueue.size());
    qp->sendQueue.clear();
    if (fabric().qp(qp->qp.qp_num) == qp->slot) fabric().release(*qp->slot);
  }
  qp->sendCq->qpUses--;
  qp->recvCq->qpUses--;
  qp->pd->users--;
  delete qp;
  return 0;
}

}  // namespace
}  // namespace loom::softib

namespace loom {

const VerbsApi* softibApi(std::string* why) {
  if (softib::Fabric::get(why) == nullptr) return nullptr;
  static const VerbsApi api = [] {
    VerbsApi a{};
    a.provider = "softib";
    a.getDeviceList = softib::getDeviceList;
    a.freeDeviceList = softib::freeDeviceList;
    a.getDeviceName = softib::getDeviceName;
    a.openDevice = softib::openDevice;
    a.closeDevice = softib::closeDevice;
    a.queryDevice = softib::queryDevice;
    a.queryPort = softib::queryPort;
    a.queryGid = softib::queryGid;
    a.allocPd = softib::allocPd;
    a.deallocPd = softib::deallocPd;
    a.regMr = softib::regMr;
    a.deregMr = softib::deregMr;
    a.createCompChannel = softib::createCompChannel;
    a.destroyCompChannel = softib::destroyCompChannel;
    a.createCq = softib::createCq;
    a.destroyCq = softib::destroyCq;
    a.reqNotifyCq = softib::reqNotifyCq;
    a.getCqEvent = softib::getCqEvent;
    a.ackCqEvents = softib::ackCqEvents;
    a.pollCq = softib::pollCq;
    a.createQp = softib::createQp;
    a.modifyQp = softib::modifyQp;
    a.destroyQp = softib::destroyQp;
    a.postSend = softib::postSend;
    a.postRecv = softib::postRecv;
    a.wcStatusStr = softib::wcStatusStr;
    return a;
  }();
  return &api;
}

}  // namespace loom