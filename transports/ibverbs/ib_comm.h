// The ib transport's connection state, shared by its two halves: set-up (ib_setup.cc: the port, queue pairs,
// connections and the Transport itself) and the data path (transport.cc: completions, CTS and data writes, the
// control sockets, the proxy's sleep). The design of both is described here.
//
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
#pragma once

#include <poll.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "src/base/socket.h"
#include "transports/ibverbs/verbs.h"
#include "transports/proxy.h"

namespace loom::ib {

constexpr uint32_t kHelloMagic = 0x6c696276;  // opens the hello of an ib connection
constexpr int kMaxQps = 8;
constexpr size_t kInfoBytes = 96;  // a queue-pair description on the control socket
constexpr uint8_t kReady = 'R', kAbort = 'A', kBye = 'B';
constexpr uint32_t kLLBit = 0x80000000u;  // in a data immediate: the message is LL

// What a work request was for, in the top bits of its wr_id; the connection's id below.
enum WrKind : uint64_t { kWrData = 1, kWrCts = 2, kWrRecv = 3 };
inline uint64_t wrId(WrKind kind, int qp, uint32_t conn) {
  return static_cast<uint64_t>(kind) << 56 | static_cast<uint64_t>(qp) << 48 | conn;
}
inline WrKind wrKind(uint64_t id) { return static_cast<WrKind>(id >> 56); }
inline int wrQp(uint64_t id) { return static_cast<int>((id >> 48) & 0xff); }
inline uint32_t wrConn(uint64_t id) { return static_cast<uint32_t>(id); }

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
// An active port of a device in a provider's list.
struct ActivePort {
  ibv_device* device;
  std::string name;
  int port;
};


// The active ports of the devices in `list` that LOOM_IB_HCA's `spec` allows, in the list's order.
std::vector<ActivePort> activePorts(const VerbsApi* verbs, ibv_device** list, int count, const std::string& spec);


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

}  // namespace loom::ib
