// ib: connections over RDMA (InfiniBand or RoCE) with reliable-connected queue pairs, for ranks on different hosts
// (or any ranks, when LOOM_TRANSPORTS or LOOM_NET asks for it). Every verbs call goes through the table of
// verbs.h: libibverbs, loaded with dlopen, or the software device softib that tests use.
//
// A proxied transport (proxy.h): each end keeps a FIFO in its own memory, and the communicator's proxy thread moves
// the messages. A communicator opens one port (LOOM_IB_HCA), with one protection domain, completion queue and
// completion channel; a connection is LOOM_IB_QPS_PER_CONNECTION queue pairs and a control socket.
//
// The data path. The receiver registers its FIFO and, for every slot the executor has freed, writes a
// clear-to-send (CTS) entry into the sender's CTS array by RDMA: where the slot's Simple area lies and its key.
// The write carries an immediate (the message's sequence number), so the sender learns of it from a completion
// and its proxy can sleep meanwhile. The sender RDMA-writes the message into that slot, with WRITE_WITH_IMM: the
// immediate holds the size and protocol, and its completion on the receiver says the bytes are there. A Simple
// message of 64 KiB or more is striped over the queue pairs (stripe() in proxy.h), each part with its own
// immediate; the receiver posts the message to its FIFO once every part arrived. An LL message lands in the
// slot's Simple area too, and the receiving proxy copies it into the FIFO as LL (flags and all). One message is
// in flight per connection; the sender's FIFO slot is released once its writes completed.
//
// The control socket is the bootstrap handoff connection (authenticated with the communicator's secret) that
// carried the queue pairs' addresses. It stays open for what RDMA cannot say: the sender's "ready" (its queue
// pairs are up and can take CTS writes), an abort notice from an executor that gave up (with the failure behind
// it), and "bye" with the count of messages a finished sender sent. A socket that closes without "bye" means the
// peer exited: its connections are lost at once, without waiting for the queue pairs' retries (LOOM_IB_TIMEOUT,
// LOOM_IB_RETRY_CNT) to run out.
// A completion with an error shuts the connection with the verbs status in the message.
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
#include "transports/ibverbs/verbs.h"
#include "transports/proxy.h"

namespace loom {
namespace {

constexpr uint32_t kHelloMagic = 0x6c696276;  // opens the hello of an ib connection
constexpr int kMaxQps = 8;
constexpr size_t kInfoBytes = 96;  // a queue-pair description on the control socket
constexpr uint8_t kReady = 'R', kAbort = 'A', kBye = 'B';
constexpr uint32_t kLLBit = 0x80000000u;  // in a data immediate: the message is LL

// What a work request was for, in the top bits of its wr_id; the connection's id below.
enum WrKind : uint64_t { kWrData = 1, kWrCts = 2, kWrRecv = 3 };
uint64_t wrId(WrKind kind, int qp, uint32_t conn) {
  return static_cast<uint64_t>(kind) << 56 | static_cast<uint64_t>(qp) << 48 | conn;
}
WrKind wrKind(uint64_t id) { return static_cast<WrKind>(id >> 56); }
int wrQp(uint64_t id) { return static_cast<int>((id >> 48) & 0xff); }
uint32_t wrConn(uint64_t id) { return static_cast<uint32_t>(id); }

// One entry of a sender's CTS array, written by the receiver.
struct CtsEntry {
  uint64_t address;  // the slot's Simple area in the receiver's FIFO
  uint32_t rkey;
  uint32_t capacity;  // bytes the slot takes
  uint64_t sequence;  // the message it is for, plus one
  uint64_t unused;
};

// One end's queue pairs as the other needs them: on the control socket, kInfoBytes.
struct QpInfo {
  uint32_t status = 0;  // from a receiver: 0, or errno of why it could not set up its end
  uint32_t count = 0;
  uint32_t qpn[kMaxQps] = {};
  uint32_t psn = 0;
  ibv_gid gid{};
  uint16_t lid = 0;
  uint8_t mtu = 0;  // ibv_mtu
  uint64_t ctsAddress = 0;  // from a sender: its CTS array
  uint32_t ctsRkey = 0;

  void write(uint8_t* out) const {
    std::memset(out, 0, kInfoBytes);
    putU32(out, status);
    putU32(out + 4, count);
    for (int i = 0; i < kMaxQps; ++i) putU32(out + 8 + 4 * i, qpn[i]);
    putU32(out + 40, psn);
    std::memcpy(out + 44, gid.raw, 16);
    out[60] = static_cast<uint8_t>(lid);
    out[61] = static_cast<uint8_t>(lid >> 8);
    out[62] = mtu;
    putU64(out + 64, ctsAddress);
    putU32(out + 72, ctsRkey);
  }
  void read(const uint8_t* in) {
    status = getU32(in);
    count = std::min<uint32_t>(getU32(in + 4), kMaxQps);
    for (int i = 0; i < kMaxQps; ++i) qpn[i] = getU32(in + 8 + 4 * i);
    psn = getU32(in + 40);
    std::memcpy(gid.raw, in + 44, 16);
    lid = static_cast<uint16_t>(in[60] | in[61] << 8);
    mtu = in[62];
    ctsAddress = getU64(in + 64);
    ctsRkey = getU32(in + 72);
  }
};

// Deregisters `mr`, the registration of `memory` (Pages or a LocalFifo). A region that cannot be deregistered
// (EBUSY: a write into it may still be landing) may still be written, so its memory is quarantined rather than
// given back to be reused.
template <typename Memory>
void deregister(const VerbsApi* verbs, ibv_mr* mr, Memory& memory, const char* what, const std::string& conn) {
  if (mr == nullptr) return;
  if (int error = verbs->deregMr(mr)) {
    memory.quarantine();
    LOOM_INFO(NET, "ib: the %s of connection %s could not be deregistered (%s): its pages stay mapped", what,
              conn.c_str(), std::strerror(error));
  }
}

// Whether LOOM_IB_HCA allows port `port` of device `name`: LOOM_SOCKET_IFNAME's syntax (socket.h), each entry
// a device name or "name:port".
bool hcaAllowed(const std::string& spec, const std::string& name, int port) {
  if (spec.empty()) return true;
  const InterfaceFilter filter = parseInterfaceFilter(spec);
  bool listed = std::any_of(filter.names.begin(), filter.names.end(), [&](std::string entry) {
    int wantPort = -1;
    if (size_t colon = entry.find(':'); colon != std::string::npos) {
      wantPort = std::atoi(entry.c_str() + colon + 1);
      entry.resize(colon);
    }
    return interfaceMatches({false, filter.exact, {entry}}, name) && (wantPort < 0 || wantPort == port);
  });
  return listed != filter.exclude;
}

// An active port of a device in a provider's list.
struct ActivePort {
  ibv_device* device;
  std::string name;
  int port;
};

// The active ports of the devices in `list` that LOOM_IB_HCA's `spec` allows, in the list's order.
std::vector<ActivePort> activePorts(const VerbsApi* verbs, ibv_device** list, int count, const std::string& spec) {
  std::vector<ActivePort> ports;
  for (int d = 0; d < count; ++d) {
    std::string name = verbs->getDeviceName(list[d]);
    ibv_context* probe = verbs->openDevice(list[d]);
    if (probe == nullptr) continue;
    ibv_device_attr attr{};
    if (verbs->queryDevice(probe, &attr) == 0) {
      for (int port = 1; port <= attr.phys_port_cnt; ++port) {
        ibv_port_attr portAttr{};
        if (verbs->queryPort(probe, static_cast<uint8_t>(port), &portAttr) != 0) continue;
        if (portAttr.state == IBV_PORT_ACTIVE && hcaAllowed(spec, name, port)) ports.push_back({list[d], name, port});
      }
    }
    verbs->closeDevice(probe);
  }
  return ports;
}

class IbComm;

struct IbConn : ProxyConn {
  IbConn(bool sends, int peer, int channel, const FifoShape& shape, int doorbell, uint32_t id, const VerbsApi* verbs)
      : ProxyConn(sends, peer, channel, shape, doorbell), id(id), verbs(verbs) {}
  ~IbConn() override {
    for (ibv_qp* qp : qps) verbs->destroyQp(qp);
    deregister(verbs, fifoMr, fifo, "FIFO", name());
    deregister(verbs, ctsMr, cts, "clear-to-send array", name());
  }

  const uint32_t id;  // in the wr_ids of its work requests
  const VerbsApi* verbs;
  std::vector<ibv_qp*> qps;
  ibv_mr* fifoMr = nullptr;  // the FIFO: a sender's source, a receiver's landing area
  Pages cts{static_cast<size_t>(shape.depth) * sizeof(CtsEntry)};  // sender: the CTS array the receiver writes;
                                                                    // receiver: the entries it writes from
  ibv_mr* ctsMr = nullptr;
  uint64_t remoteCts = 0;    // receiver: the sender's CTS array
  uint32_t remoteCtsRkey = 0;
  UniqueFd control;
  uint8_t controlIn[9] = {};  // a control message being read
  size_t controlDone = 0;
  bool ready = false;          // receiver: the sender's queue pairs are up (its "ready" came)
  bool recvsPosted = false;    // sender: the receives for CTS immediates are posted and "ready" sent
  uint64_t messages = 0;       // messages sent (sender, counting the one in flight) or delivered (receiver)
  uint64_t granted = 0;        // sender: messages the receiver has cleared to send
  uint64_t ctsIssued = 0;      // receiver: messages it has cleared
  uint64_t byeCount = UINT64_MAX;  // receiver: how many the finished sender sent
  int partsPending = 0;            // sender: write completions the message in flight awaits
  std::vector<std::deque<uint32_t>> arrived;  // receiver: data immediates per queue pair, in order

  std::byte* slotSimple(uint64_t message) const {
    return fifo.view().slots + (message % static_cast<uint64_t>(shape.depth)) * shape.slotBytes;
  }
};

// A sender's socket that arrived before its receiving end existed.
struct Arrival {
  int peer;
  int channel;
  int qps;
  UniqueFd fd;
};

class IbComm : public ProxyComm {
 public:
  IbComm(const TransportCommContext& context, const VerbsApi* verbs) : ProxyComm(context, "ib"), verbs_(verbs) {}

  ~IbComm() override {
    context().bootstrap->setHandoffHandler(kHelloMagic, nullptr);
    stopProxy();
    if (cq_ != nullptr) verbs_->destroyCq(cq_);
    if (channel_ != nullptr) verbs_->destroyCompChannel(channel_);
    if (pd_ != nullptr) verbs_->deallocPd(pd_);
    if (device_ != nullptr) verbs_->closeDevice(device_);
  }

  loomResult_t start();
  std::string netDevice() const override { return deviceName_; }
  loomResult_t newSender(const ConnectionKey& key, const FifoShape& shape, const WaitCheck& check,
                         std::unique_ptr<Endpoint>* out);
  loomResult_t newReceiver(const ConnectionKey& key, const FifoShape& shape, std::unique_ptr<Endpoint>* out);

 private:
  bool adoptExtra() override;
  bool progress() override;
  bool pump(ProxyConn& conn) override;
  void notifyGaveUp(ProxyConn& conn) override;
  void shutNetwork(ProxyConn& conn, bool graceful) override;
  void sleep(int64_t micros) override;

  uint32_t newPsn() {
    std::lock_guard<std::mutex> lock(idMutex_);
    return random_() & 0xffffff;
  }
  loomResult_t newConn(bool sends, int peer, int channel, const FifoShape& shape, std::shared_ptr<IbConn>* out);
  int chooseGid();
  loomResult_t createQps(IbConn& conn, int count);
  int connectQps(IbConn& conn, const QpInfo& remote, uint32_t psn);
  QpInfo localInfo(const IbConn& conn, uint32_t psn) const;
  bool postRecv(IbConn& conn, int qp);
  bool acceptSender(IbConn& conn, Arrival& arrival);
  bool pumpOut(IbConn& conn);
  bool pumpIn(IbConn& conn);
  bool readControl(IbConn& conn);
  void controlClosed(IbConn& conn);
  bool pollCompletions();
  void complete(const ibv_wc& wc);
  IbConn* byId(uint32_t id);
  bool watchControls(int timeoutMs);
  void addControls(std::vector<pollfd>* fds, std::vector<IbConn*>* polled);

  const VerbsApi* verbs_;
  ibv_context* device_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool armed_ = false;
  std::string deviceName_;
  int port_ = 1;
  ibv_port_attr portAttr_{};
  ibv_gid gid_{};
  int gidIndex_ = 0;
  int qpsPerConnection_ = 1;
  std::mutex idMutex_;  // guards nextId_ and random_ (the caller's thread and the proxy's both draw)
  std::mt19937 random_{std::random_device{}()};
  uint32_t nextId_ = 1;
  std::mutex arrivedMutex_;
  std::vector<Arrival> arrivedQueue_;  // from the bootstrap listener's thread
  std::vector<Arrival> waiting_;       // the proxy thread's: arrived before their receiving end
  uint64_t rounds_ = 0;
};

loomResult_t IbComm::start() {
  const int rank = context().rank;
  int count = 0;
  ibv_device** list = verbs_->getDeviceList(&count);
  if (list == nullptr || count == 0) {
    if (list != nullptr) verbs_->freeDeviceList(list);
    return LOOM_FAIL(loomSystemError, NET, "ib: rank %d: %s lists no RDMA device", rank, verbs_->provider);
  }
  // Every allowed active port, in the device list's order; rank r takes port r % count of them.
  const std::string spec = params::ibHca();
  const std::vector<ActivePort> candidates = activePorts(verbs_, list, count, spec);
  if (candidates.empty()) {
    verbs_->freeDeviceList(list);
    if (!spec.empty())
      return LOOM_FAIL(loomInvalidArgument, NET, "LOOM_IB_HCA=\"%s\" allows no active port of the %d RDMA device(s) of %s",
                       spec.c_str(), count, verbs_->provider);
    return LOOM_FAIL(loomSystemError, NET, "ib: rank %d: no active port on the %d RDMA device(s) of %s", rank, count,
                     verbs_->provider);
  }
  const ActivePort& chosen = candidates[static_cast<size_t>(rank) % candidates.size()];
  deviceName_ = chosen.name;
  port_ = chosen.port;
  device_ = verbs_->openDevice(chosen.device);
  verbs_->freeDeviceList(list);
  if (device_ == nullptr)
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot open %s: %s", deviceName_.c_str(), std::strerror(errno));
  if (verbs_->queryPort(device_, static_cast<uint8_t>(port_), &portAttr_) != 0)
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot query %s port %d", deviceName_.c_str(), port_);
  gidIndex_ = static_cast<int>(params::ibGidIndex());
  if (gidIndex_ == -1) gidIndex_ = chooseGid();
  if (gidIndex_ < 0 || gidIndex_ >= portAttr_.gid_tbl_len)
    return LOOM_FAIL(loomInvalidArgument, NET, "LOOM_IB_GID_INDEX=%d: %s port %d has GIDs 0 to %d", gidIndex_,
                     deviceName_.c_str(), port_, portAttr_.gid_tbl_len - 1);
  if (verbs_->queryGid(device_, static_cast<uint8_t>(port_), gidIndex_, &gid_) != 0)
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot read GID %d of %s port %d", gidIndex_, deviceName_.c_str(),
                     port_);
  if (portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET && gid_.global.subnet_prefix == 0 &&
      gid_.global.interface_id == 0)
    return LOOM_FAIL(loomInvalidArgument, NET, "LOOM_IB_GID_INDEX=%d: that GID of %s port %d is empty", gidIndex_,
                     deviceName_.c_str(), port_);
  pd_ = verbs_->allocPd(device_);
  channel_ = pd_ ? verbs_->createCompChannel(device_) : nullptr;
  ibv_device_attr attr{};
  int entries = 4096;
  if (verbs_->queryDevice(device_, &attr) == 0 && attr.max_cqe > 0) entries = std::min(entries, attr.max_cqe);
  cq_ = channel_ ? verbs_->createCq(device_, entries, nullptr, channel_, 0) : nullptr;
  if (cq_ == nullptr)
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot set up %s port %d (protection domain, completion queue): %s",
                     deviceName_.c_str(), port_, std::strerror(errno));
  int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot make the completion channel non-blocking: %m");
  qpsPerConnection_ = static_cast<int>(std::clamp<int64_t>(params::ibQpsPerConnection(), 1, kMaxQps));
  LOOM_CHECK(openDoorbell());
  LOOM_INFO(NET, "ib: rank %d uses %s port %d (%s, GID index %d) through %s", rank, deviceName_.c_str(), port_,
            portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", gidIndex_, verbs_->provider);
  context().bootstrap->setHandoffHandler(kHelloMagic, [this](int peer, const uint8_t* hello, UniqueFd socket) {
    uint32_t magic = getU32(hello), channel = getU32(hello + 4), receiver = getU32(hello + 8);
    int qps = hello[12];
    if (magic != kHelloMagic || receiver != static_cast<uint32_t>(context().rank) || qps < 1 || qps > kMaxQps) {
      LOOM_WARN(NET, "ib: dropped a connection from rank %d: its hello (magic %08x, for rank %u, %d queue pairs) is "
                "not an ib connection to this rank", peer, magic, receiver, qps);
      return;
    }
    std::lock_guard<std::mutex> lock(arrivedMutex_);
    arrivedQueue_.push_back({peer, static_cast<int>(channel), qps, std::move(socket)});
    wake();
  });
  return loomSuccess;
}

// LOOM_IB_GID_INDEX=-1: on a RoCE port the first GID that holds an IPv4 address (::ffff:a.b.c.d, RoCE v2's,
// routable across subnets), else GID 0 (InfiniBand's, and a RoCE port's link-local one).
int IbComm::chooseGid() {
  if (portAttr_.link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
  for (int index = 0; index < portAttr_.gid_tbl_len; ++index) {
    ibv_gid gid{};
    if (verbs_->queryGid(device_, static_cast<uint8_t>(port_), index, &gid) != 0) continue;
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(gid.raw, kMapped, sizeof(kMapped)) == 0 && (gid.raw[12] | gid.raw[13] | gid.raw[14] | gid.raw[15]))
      return index;
  }
  return 0;
}

// Creates `count` RC queue pairs on the communicator's completion queue and takes them to INIT.
loomResult_t IbComm::createQps(IbConn& conn, int count) {
  for (int j = 0; j < count; ++j) {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = static_cast<uint32_t>(2 * conn.shape.depth + 8);
    init.cap.max_recv_wr = static_cast<uint32_t>(conn.shape.depth + 8);
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = verbs_->createQp(pd_, &init);
    if (qp == nullptr)
      return LOOM_FAIL(loomSystemError, NET, "ib: cannot create a queue pair on %s for the connection %s: %s",
                       deviceName_.c_str(), conn.name().c_str(), std::strerror(errno));
    conn.qps.push_back(qp);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = static_cast<uint8_t>(port_);
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (int error = verbs_->modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return LOOM_FAIL(loomSystemError, NET, "ib: cannot take a queue pair of %s to INIT: %s", conn.name().c_str(),
                       std::strerror(error));
  }
  conn.arrived.resize(static_cast<size_t>(count));
  return loomSuccess;
}

QpInfo IbComm::localInfo(const IbConn& conn, uint32_t psn) const {
  QpInfo info;
  info.count = static_cast<uint32_t>(conn.qps.size());
  for (size_t j = 0; j < conn.qps.size(); ++j) info.qpn[j] = conn.qps[j]->qp_num;
  info.psn = psn;
  info.gid = gid_;
  info.lid = portAttr_.lid;
  info.mtu = static_cast<uint8_t>(portAttr_.active_mtu);
  return info;
}

// Takes the queue pairs to RTR, aimed at `remote`'s, then to RTS. 0, or the errno of the step that failed.
int IbComm::connectQps(IbConn& conn, const QpInfo& remote, uint32_t psn) {
  if (remote.count != conn.qps.size()) return EPROTO;
  for (size_t j = 0; j < conn.qps.size(); ++j) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(portAttr_.active_mtu, remote.mtu));
    attr.dest_qp_num = remote.qpn[j];
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.port_num = static_cast<uint8_t>(port_);
    if (portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET || remote.lid == 0) {
      attr.ah_attr.is_global = 1;
      attr.ah_attr.grh.dgid = remote.gid;
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex_);
      attr.ah_attr.grh.hop_limit = 255;
    }
    int error = verbs_->modifyQp(conn.qps[j], &attr,
                                 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (error != 0) return error;
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = static_cast<uint8_t>(std::clamp<int64_t>(params::ibTimeout(), 1, 31));
    attr.retry_cnt = static_cast<uint8_t>(std::clamp<int64_t>(params::ibRetryCnt(), 0, 7));
    attr.rnr_retry = 7;  // a receiver is never not ready for long: its proxy reposts at once
    attr.sq_psn = psn;
    attr.max_rd_atomic = 1;
    error = verbs_->modifyQp(conn.qps[j], &attr,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC);
    if (error != 0) return error;
  }
  return 0;
}

bool IbComm::postRecv(IbConn& conn, int qp) {
  ibv_recv_wr wr{};
  wr.wr_id = wrId(kWrRecv, qp, conn.id);
  ibv_recv_wr* bad = nullptr;
  return verbs_->postRecv(conn.qps[static_cast<size_t>(qp)], &wr, &bad) == 0;
}

// A new connection's FIFO and CTS array, registered: a sender's FIFO is the source of its writes and its CTS
// array the receiver's target; a receiver's FIFO is the sender's target and its CTS array the source of its own.
loomResult_t IbComm::newConn(bool sends, int peer, int channel, const FifoShape& shape,
                             std::shared_ptr<IbConn>* out) {
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(idMutex_);
    id = nextId_++;
  }
  auto conn = std::make_shared<IbConn>(sends, peer, channel, shape, doorbell(), id, verbs_);
  if (!conn->fifo.valid())
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot allocate the FIFO %s", conn->name().c_str());
  const int local = IBV_ACCESS_LOCAL_WRITE, remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  conn->fifoMr = verbs_->regMr(pd_, conn->fifo.view().header, conn->fifo.bytes(), sends ? local : remote);
  if (conn->cts.valid()) conn->ctsMr = verbs_->regMr(pd_, conn->cts.data(), conn->cts.bytes(), sends ? remote : local);
  if (conn->fifoMr == nullptr || conn->ctsMr == nullptr)
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot register the memory of the connection %s: %s",
                     conn->name().c_str(), std::strerror(errno));
  *out = std::move(conn);
  return loomSuccess;
}

// Sender side, on the caller's thread: the queue pairs, the CTS array, and the exchange with the receiver.
loomResult_t IbComm::newSender(const ConnectionKey& key, const FifoShape& shape, const WaitCheck& check,
                               std::unique_ptr<Endpoint>* out) {
  LOOM_CHECK(check());
  std::shared_ptr<IbConn> conn;
  LOOM_CHECK(newConn(true, key.receiver, key.channel, shape, &conn));
  const uint32_t psn = newPsn();
  LOOM_CHECK(createQps(*conn, qpsPerConnection_));

  uint8_t hello[kHandoffHelloBytes] = {};
  putU32(hello, kHelloMagic);
  putU32(hello + 4, static_cast<uint32_t>(key.channel));
  putU32(hello + 8, static_cast<uint32_t>(key.receiver));
  hello[12] = static_cast<uint8_t>(qpsPerConnection_);
  LOOM_CHECK(context().bootstrap->connectHandoff(key.receiver, hello, context().timeoutMs, &conn->control));
  QpInfo mine = localInfo(*conn, psn);
  mine.ctsAddress = reinterpret_cast<uint64_t>(conn->cts.data());
  mine.ctsRkey = conn->ctsMr->rkey;
  uint8_t info[kInfoBytes];
  mine.write(info);
  const std::string peer = "rank " + std::to_string(key.receiver);
  IoWait wait{Deadline(context().timeoutMs), context().abortFlag, "ib connection setup"};
  LOOM_CHECK(writeExact(conn->control.get(), info, kInfoBytes, peer, wait));
  // The answer comes once the receiver has made its end: wait under the caller's watch (its deadline names the
  // call, its abort and peer checks end the wait early), as shm waits for its peer's FIFO.
  for (size_t done = 0; done < kInfoBytes;) {
    pollfd readable{conn->control.get(), POLLIN, 0};
    if (poll(&readable, 1, 10) > 0) {
      ssize_t n = recv(conn->control.get(), info + done, kInfoBytes - done, MSG_DONTWAIT);
      if (n == 0)
        return LOOM_FAIL(loomRemoteError, NET, "ib: rank %d closed the connection %s while it was being set up",
                         key.receiver, conn->name().c_str());
      if (n < 0 && !wouldBlock(errno))
        return LOOM_FAIL(loomRemoteError, NET, "ib: setting up the connection %s: %s", conn->name().c_str(),
                         std::strerror(errno));
      if (n > 0) done += static_cast<size_t>(n);
      continue;
    }
    LOOM_CHECK(check());
  }
  QpInfo theirs;
  theirs.read(info);
  if (theirs.status != 0)
    return LOOM_FAIL(loomRemoteError, NET, "ib: rank %d could not set up its end of the connection %s: %s",
                     key.receiver, conn->name().c_str(), std::strerror(static_cast<int>(theirs.status)));
  if (int error = connectQps(*conn, theirs, psn))
    return LOOM_FAIL(loomSystemError, NET, "ib: cannot connect the queue pairs of %s to rank %d's: %s",
                     conn->name().c_str(), key.receiver, std::strerror(error));
  int flags = fcntl(conn->control.get(), F_GETFL);
  if (flags < 0 || fcntl(conn->control.get(), F_SETFL, flags | O_NONBLOCK) < 0)
    return LOOM_FAIL(loomSystemError, NET, "ib: fcntl(O_NONBLOCK) on the control socket: %m");
  conn->connected = true;
  return attach(std::move(conn), out);
}

loomResult_t IbComm::newReceiver(const ConnectionKey& key, const FifoShape& shape, std::unique_ptr<Endpoint>* out) {
  std::shared_ptr<IbConn> conn;
  LOOM_CHECK(newConn(false, key.sender, key.channel, shape, &conn));
  return attach(std::move(conn), out);
}

// Receiver side, on the proxy thread: a sender's socket met its receiving end. Reads the sender's description
// (it follows the hello at once), sets up and connects the queue pairs, answers. False when it must wait for the
// description to arrive.
bool IbComm::acceptSender(IbConn& conn, Arrival& arrival) {
  uint8_t info[kInfoBytes];
  ssize_t n = recv(arrival.fd.get(), info, kInfoBytes, MSG_DONTWAIT | MSG_PEEK);
  if (n >= 0 && n < static_cast<ssize_t>(kInfoBytes) && n != 0) return false;  // not all there yet
  if (n <= 0) {
    if (n < 0 && wouldBlock(errno)) return false;
    conn.control = std::move(arrival.fd);
    fail(conn, "was closed by the sender while connecting", n < 0 ? errno : 0);
    return true;
  }
  if (recv(arrival.fd.get(), info, kInfoBytes, MSG_DONTWAIT) != static_cast<ssize_t>(kInfoBytes)) return false;
  conn.control = std::move(arrival.fd);
  QpInfo theirs;
  theirs.read(info);
  const uint32_t psn = newPsn();
  int error = 0;
  if (theirs.count != static_cast<uint32_t>(arrival.qps)) error = EPROTO;
  if (error == 0 && createQps(conn, arrival.qps) != loomSuccess) error = errno != 0 ? errno : ENOMEM;
  if (error == 0) error = connectQps(conn, theirs, psn);
  for (int j = 0; error == 0 && j < arrival.qps; ++j)
    for (int k = 0; error == 0 && k < conn.shape.depth; ++k)
      if (!postRecv(conn, j)) error = ENOMEM;
  QpInfo mine = error == 0 ? localInfo(conn, psn) : QpInfo{};
  mine.status = static_cast<uint32_t>(error);
  mine.write(info);
  if (send(conn.control.get(), info, kInfoBytes, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(kInfoBytes)) {
    fail(conn, "could not answer the sender", errno);
    return true;
  }
  if (error != 0) {
    fail(conn, "could not set up its queue pairs", error);
    return true;
  }
  conn.remoteCts = theirs.ctsAddress;
  conn.remoteCtsRkey = theirs.ctsRkey;
  conn.connected = true;
  LOOM_TRACE(NET, "ib: connected %s over %d queue pair(s)", conn.name().c_str(), arrival.qps);
  return true;
}

// New sockets meet their receiving ends; new senders post their receives and say they are ready.
bool IbComm::adoptExtra() {
  bool progressed = false;
  {
    std::lock_guard<std::mutex> lock(arrivedMutex_);
    for (Arrival& arrival : arrivedQueue_) waiting_.push_back(std::move(arrival));
    progressed = !arrivedQueue_.empty();
    arrivedQueue_.clear();
  }
  for (auto& base : conns_) {
    auto& conn = static_cast<IbConn&>(*base);
    if (conn.closed) continue;
    if (conn.sends && conn.connected && !conn.recvsPosted) {
      conn.recvsPosted = true;
      progressed = true;
      for (int k = 0; k < conn.shape.depth; ++k) {
        if (!postRecv(conn, 0)) {
          fail(conn, "could not post its receives");
          break;
        }
      }
      if (!conn.closed && send(conn.control.get(), &kReady, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1)
        fail(conn, "could not tell the receiver it is ready", errno);
    }
    if (conn.sends || conn.connected || conn.control.valid()) continue;
    auto found = std::find_if(waiting_.begin(), waiting_.end(), [&](const Arrival& arrival) {
      return arrival.peer == conn.peer && arrival.channel == conn.channel;
    });
    if (found == waiting_.end()) continue;
    if (acceptSender(conn, *found)) {
      waiting_.erase(found);
      progressed = true;
    }
  }
  return progressed;
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

// Whether `verbs` lists a device with an active port; each provider is asked once per process.
bool activePortExists(const VerbsApi* verbs) {
  static std::mutex mutex;
  static std::map<const VerbsApi*, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(verbs);
  if (found != known.end()) return found->second;
  int count = 0;
  ibv_device** list = verbs->getDeviceList(&count);
  const bool active = list != nullptr && !activePorts(verbs, list, count, "").empty();
  if (list != nullptr) verbs->freeDeviceList(list);
  known[verbs] = active;
  return active;
}

class IbTransport : public Transport {
 public:
  const char* name() const override { return "ib"; }

  bool canConnect(const PeerInfo&, const PeerInfo&, std::string* why) const override {
    const VerbsApi* verbs = verbsApi(why);
    if (verbs == nullptr) return false;
    if (activePortExists(verbs)) return true;
    *why = std::string(verbs->provider) + " lists no RDMA device with an active port";
    return false;
  }
  bool movesByProxy() const override { return true; }
  bool proxySendsFromCallerMemory() const override { return false; }

  loomResult_t openComm(const TransportCommContext& context, std::unique_ptr<TransportComm>* out) override {
    std::string why;
    PeerInfo anyone{0, 0, 0, 0};
    if (!canConnect(anyone, anyone, &why)) {
      out->reset();  // no peer will be given to ib here (canConnect says so to each), so it keeps nothing
      return loomSuccess;
    }
    const VerbsApi* verbs = verbsApi(&why);
    auto comm = std::make_unique<IbComm>(context, verbs);
    LOOM_CHECK(comm->start());
    *out = std::move(comm);
    return loomSuccess;
  }

  loomResult_t createReceiver(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                              std::unique_ptr<Endpoint>* out) override {
    return static_cast<IbComm*>(state)->newReceiver(key, shape, out);
  }

  loomResult_t attachSender(TransportComm* state, const ConnectionKey& key, const FifoShape& shape,
                            const WaitCheck& check, std::unique_ptr<Endpoint>* out) override {
    return static_cast<IbComm*>(state)->newSender(key, shape, check, out);
  }
};

}  // namespace

Transport* ibTransport() {
  static IbTransport transport;
  return &transport;
}

// Whether LOOM_NET's automatic choice should take ib: libibverbs lists an active port here.
bool rdmaPortActive() {
  std::string why;
  const VerbsApi* verbs = libibverbsApi(&why);
  return verbs != nullptr && activePortExists(verbs);
}

}  // namespace loom
