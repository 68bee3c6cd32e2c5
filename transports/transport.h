// The one interface every transport implements (shm, loopback, tcp, ucx, ibverbs, and cuda_ipc for the GPU executor).
//
// A connection carries messages from one rank to another on one channel through a FIFO of slots (fifo.h).
// The receiver owns the FIFO memory and creates it; the sender attaches to it. How the memory is shared is the
// transport's business: a file in LOOM_SHM_DIR for shm, a process-local table for loopback, a FIFO at each end
// with a proxy thread moving messages between them over sockets for tcp. The executor sees only the FIFO.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/base/wait.h"
#include "transports/fifo.h"

namespace loom {

// What ranks tell each other about themselves at init (exchanged through the bootstrap, fixed size).
struct PeerInfo {
  int rank;
  int pid;
  uint64_t hostHash;     // the host as loom treats it: LOOM_HOSTID's when set (emulated hosts), else machineHash
  uint64_t machineHash;  // hash of the host name and boot id: equal means "same machine, same kernel"
};

class Bootstrap;

// What a transport keeps per communicator, if anything (tcp: its connections and proxy thread).
class TransportComm {
 public:
  virtual ~TransportComm() = default;
  // What failed on the last connection with `peer` this transport lost ("RDMA write ...: transport retry counter
  // exceeded"), for the caller's error message; empty when none was lost or the transport cannot tell. A
  // negative `peer`: the last connection lost with any peer.
  virtual std::string lostReason(int peer) const {
    (void)peer;
    return {};
  }
  // The network device this rank's connections to other hosts leave through ("mlx5_0", "eth0"): for the
  // topology's record of each rank's NIC. Empty for transports within a host, or when it cannot tell.
  virtual std::string netDevice() const { return {}; }

  // Progress from the threads that wait on this transport's connections (tcp): a thread that is about to wait
  // calls attachCaller() once, progressFromCaller() whenever it finds nothing else to do (whether anything
  // moved), and detachCaller() when its call ends. While a thread is attached, the transport's own thread leaves
  // the network to it, so the two do not take turns on the cores. Only where progressesFromCaller() says so.
  virtual bool progressesFromCaller() const { return false; }
  virtual void attachCaller() {}
  virtual bool progressFromCaller() { return false; }
  virtual void detachCaller() {}
};

// A communicator as its transports see it at init.
struct TransportCommContext {
  uint64_t commHash;
  int rank;
  int nranks;
  Bootstrap* bootstrap;  // out-of-band connections to peers; outlives every TransportComm made with it
  const std::atomic<bool>* abortFlag;
  int64_t timeoutMs;
  // LOOM_CHECKSUM=2: a transport whose traits say proxyResends keeps each message until the receiver has checked it
  // and sends it again when asked.
  bool checksumResend = false;
};

// Names one connection: messages from `sender` to `receiver` on `channel` of the communicator `commHash`.
struct ConnectionKey {
  uint64_t commHash;
  int sender;
  int receiver;
  int channel;
  std::string name() const;  // "loom-<commHash>-<sender>-<receiver>-<channel>"
};

// What a transport's connections are like, where the communicator's choices depend on it.
struct TransportTraits {
  // A Simple message may be a DirectDescriptor: the receiver reads the payload from the sender's memory itself
  // (same machine; shm and loopback).
  bool carriesDirect = false;
  // Its FIFOs lie in CUDA device memory (cuda_ipc), which only the GPU executor reads and writes: such a transport
  // is never in transportsInPriorityOrder(), and its endpoints' fifo() addresses are the device's.
  bool deviceMemory = false;
  // A thread of the transport's own moves the messages (tcp's proxy), which then needs a core too.
  bool movesByProxy = false;
  // That proxy can send a message straight from the caller's memory (a DirectDescriptor of this process,
  // Links::proxySends): tcp and ucx can; ib needs registered memory, so its messages come through the FIFO.
  bool proxySendsFromCallerMemory = false;
  // ... under LOOM_CHECKSUM too, the message's checksum (in the slot, after the descriptor) following the payload on
  // the wire (ProxyConn::trailer): tcp. Without it the checksum's messages come through the FIFO.
  bool proxySendsChecksumAfterCallerMemory = false;
  // Under LOOM_CHECKSUM=2 its proxies send a message that failed the receiver's check again (tcp); without it such a
  // mismatch fails the call at once. Transports without a proxy always can (the sender's executor does it).
  bool proxyResends = false;
  // The Simple slot bytes it asks for in a communicator whose every connection is a network one (no two ranks
  // share memory); 0: LOOM_SIMPLE_SLOT_BYTES. Ranks with the same transports decide alike.
  size_t networkSlotBytes = 0;
};

// One end of a connection. It keeps the FIFO memory mapped for as long as it lives.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual FifoMemory fifo() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Whether this transport can connect `self` to `peer`; when not, *why says why (for the error message).
  virtual bool canConnect(const PeerInfo& self, const PeerInfo& peer, std::string* why) const = 0;
  // What its connections are like (TransportTraits). The communicator reads them at init, in one place
  // (comm.cc), and keeps what it needs per peer.
  virtual TransportTraits traits() const { return {}; }
  // Removes what the transport left on this machine for communicator `commHash` that no one else will remove,
  // when rank `self` leaves it: what ranks that died (`dead(rank)`) made before a peer could take it over, and
  // what peers made for `self` to take over, which it never will now (shm: a segment a receiver created and no
  // sender attached to, whose receiver is dead or whose sender is `self`; a stopped receiver cannot unlink its
  // own). Called by destroy and abort of a communicator that failed or lost a peer.
  virtual void removeLeftovers(uint64_t commHash, int self, const std::function<bool(int rank)>& dead) const {
    (void)commHash, (void)self, (void)dead;
  }
  // Made once per communicator at init, before any connection; passed back to createReceiver and attachSender.
  // Transports that keep nothing per communicator leave *out empty.
  virtual loomResult_t openComm(const TransportCommContext& context, std::unique_ptr<TransportComm>* out) {
    (void)context;
    out->reset();
    return loomSuccess;
  }
  // Receiver side: creates the FIFO for `key` with `shape`. Never waits for the sender.
  virtual loomResult_t createReceiver(TransportComm* comm, const ConnectionKey& key, const FifoShape& shape,
                                      std::unique_ptr<Endpoint>* out) = 0;
  // Sender side: attaches to the FIFO the receiver created, waiting for it while `check` allows (the caller's
  // deadline, abort flag and peer liveness).
  virtual loomResult_t attachSender(TransportComm* comm, const ConnectionKey& key, const FifoShape& shape,
                                    const WaitCheck& check, std::unique_ptr<Endpoint>* out) = 0;
};

// The transports in priority order, filtered by LOOM_TRANSPORTS. Only transports/registry.cc names them.
std::vector<Transport*> transportsInPriorityOrder();
// The transport of the GPU executor's connections between ranks of one machine (cuda_ipc), or null in a build
// without CUDA.
Transport* deviceTransport();
// Whether the transport named `name` is built into this library and can run here (ucx: libucp loads); *why says
// why not.
bool transportAvailable(const std::string& name, std::string* why);
// Whether LOOM_NET names no transport that can run here; *why says what is wrong.
bool netChoiceError(std::string* why);

}  // namespace loom
