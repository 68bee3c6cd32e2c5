// ib, set up: the port a communicator opens, queue pairs and their addresses, a connection's two ends meeting
// over its control socket, and the Transport (ib_comm.h describes the design).
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

namespace {


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
  TransportTraits traits() const override {
    TransportTraits traits;
    traits.movesByProxy = true;  // from registered memory only: through the FIFO
    return traits;
  }

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

}  // namespace loom::ib

namespace loom {

Transport* ibTransport() {
  static ib::IbTransport transport;
  return &transport;
}

// Whether LOOM_NET's automatic choice should take ib: libibverbs lists an active port here.
bool rdmaPortActive() {
  std::string why;
  const VerbsApi* verbs = libibverbsApi(&why);
  return verbs != nullptr && ib::activePortExists(verbs);
}

}  // namespace loom
