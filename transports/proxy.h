// What the network transports (tcp, ucx) share: a FIFO at each end of a connection, in the memory of the process
// that holds that end, and one proxy thread per communicator that moves messages between those FIFOs and the
// network. The executor sees only its FIFO, as with shm. Each transport says how a message crosses the network
// (pump, sleep, shut); this file keeps the rest:
// - the thread, started with the communicator's first connection, and its waiting: it spins through the
//   connections while anything moves; idle, it yields for LOOM_YIELD_US, then marks every FIFO `sleeping`, looks
//   once more, and sleeps until the network or the FIFOs' doorbell (fifo.h) wakes it;
// - the connections' life: added by the executor's side, released by its endpoints, and, when the communicator
//   is destroyed, first flushed of what the executor posted (a call may return before its last messages left),
//   within LOOM_TIMEOUT_MS;
// - progress from the waiting threads, where a transport allows it (tcp): an executor with nothing else to do
//   runs a pass over the connections itself, and while one is attached the proxy thread sleeps on the doorbell;
// - failure: an executor that gives up marks its FIFO aborted, and the proxy tells the peer (notifyGaveUp) and
//   shuts the connection; a connection that fails marks its FIFO kConnectionLost, one whose peer gave up
//   kAbortedByPeer (fifo.h), and the executor's error names the peer.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "src/base/integrity.h"
#include "src/base/socket.h"
#include "transports/fifo.h"
#include "transports/transport.h"

namespace loom {

// Page-aligned memory mapped for its own (mmap), not the heap's, for memory that peers write into directly (ucx's
// RMA puts, carried out by this process's UCX worker or by process_vm_writev; ib's RDMA writes): a write from a
// peer that was cleared to send can land after the memory is given up. quarantine() says so: the pages are then
// given back to the system but the addresses stay mapped, writable and never reused, so that such a write lands in
// zero pages of its own instead of memory this process has since handed out. The cost is address space only.
class Pages {
 public:
  explicit Pages(size_t bytes);  // rounded up to whole pages; zeroed
  ~Pages();
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  bool valid() const { return base_ != nullptr; }
  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  void quarantine() { quarantined_ = true; }

 private:
  size_t bytes_;
  void* base_;
  bool quarantined_ = false;
};

// A FIFO in this process's memory (Pages), with the proxy's eventfd as its doorbell.
class LocalFifo {
 public:
  LocalFifo(const FifoShape& shape, int doorbell);
  bool valid() const { return pages_.valid(); }
  size_t bytes() const { return pages_.bytes(); }
  FifoMemory view() const { return fifoView(pages_.data()); }
  void quarantine() { pages_.quarantine(); }

 private:
  Pages pages_;
};

// One direction of one channel between this rank and `peer`. A transport derives its own.
struct ProxyConn {
  ProxyConn(bool sends, int peer, int channel, const FifoShape& shape, int doorbell)
      : sends(sends), peer(peer), channel(channel), shape(shape), fifo(shape, doorbell) {}
  virtual ~ProxyConn() = default;

  const bool sends;  // this rank sends: the proxy drains `fifo` into the network; else it fills `fifo`
  const int peer;
  const int channel;
  const FifoShape shape;
  LocalFifo fifo;
  std::atomic<bool> released{false};  // the executor's endpoint is gone

  // Once added, touched only by the thread that holds the comm's passMutex_ (the proxy thread or a caller).
  std::unique_ptr<FifoReceiver> drain;  // sending side
  std::unique_ptr<FifoSender> fill;     // receiving side
  bool connected = false;               // the network side is up (the transport says when)
  bool closed = false;                  // the network side is shut: nothing more moves
  bool closedIdle = false;              // ... by a peer that finished, with nothing of ours pending (sending side)
  bool inFrame = false;                 // a message is on its way
  bool wantSlot = false;                // a message waits for the executor to free a slot
  Protocol protocol = Protocol::kSimple;
  std::byte* payload = nullptr;  // where the message comes from (sending) or goes (receiving)
  size_t payloadBytes = 0;       // all its bytes on the wire, the trailer's included
  // Sending a DirectDescriptor's message under LOOM_CHECKSUM: its last trailerBytes on the wire come from here (the
  // checksum, in the slot after the descriptor), not from after `payload` (outgoingPieces).
  const std::byte* trailer = nullptr;
  size_t trailerBytes = 0;
  // LOOM_CHECKSUM=2 over a transport that sends again (TransportTraits::proxyResends, tcp): the sending side keeps
  // each message in its FIFO, unreleased, until the receiving side says its executor released (checked) it, and
  // sends one again when the receiving side asks (see tcp/transport.cc).
  bool holds = false;
  uint64_t nextToSend = 0;    // sending side, holding: the number of the next message to go out
  uint64_t againWanted = 0;   // ... the number, plus one, of a message asked for again (0: none)
  bool sendingAgain = false;  // the message on its way is one sent again (either side)

  std::string name() const;  // "to rank 3 on channel 0"
  // Whether the receiving side still owes the sending side a notice (a holding connection's releases and
  // requests): the connection is not finished before it went.
  virtual bool owesPeer() const { return false; }
  void markAborted(uint32_t code, uint64_t origin = 0) { markFifoAborted(fifo.view().header, code, origin); }
  // The failure behind this rank's own abort mark, for the notice to the peer (packOrigin; 0: not known).
  uint64_t localOrigin() const { return fifo.view().header->origin.load(std::memory_order_relaxed); }
};

// How a network transport cuts a Simple message of kStripeMinBytes or more over `parts` sockets or queue pairs
// (LOOM_NSOCKS, LOOM_IB_QPS_PER_CONNECTION): part `index` is [*begin, *end) of the payload. Anything smaller, and
// every LL message, travels whole as part 0. Both ends cut a message the same way from its size alone.
constexpr size_t kStripeMinBytes = 65536;
void stripe(size_t bytes, Protocol protocol, int parts, int index, size_t* begin, size_t* end);
// How many of the parts above carry bytes (all of them, or only part 0).
int stripeCount(size_t bytes, Protocol protocol, int parts);

// Integers on the network transports' wires: little-endian, whatever the host.
inline void putU32(uint8_t* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
inline uint32_t getU32(const uint8_t* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}
inline void putU64(uint8_t* out, uint64_t value) {
  putU32(out, static_cast<uint32_t>(value));
  putU32(out + 4, static_cast<uint32_t>(value >> 32));
}
inline uint64_t getU64(const uint8_t* in) { return getU32(in) | static_cast<uint64_t>(getU32(in + 4)) << 32; }
// Whether a non-blocking socket call failed only for now.
inline bool wouldBlock(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

// The next message the executor posted on a sending connection, as conn.payload, conn.payloadBytes and
// conn.protocol: in the FIFO's slot, or where a DirectDescriptor of this process points (Links::proxySends), with
// the checksum after the descriptor as conn.trailer under LOOM_CHECKSUM. On a holding connection (conn.holds) the
// message asked for again, if one is, else the next one not yet sent (conn.sendingAgain says which). False when
// none is posted; *bad then says whether the message cannot be sent (a descriptor of another process's memory, or
// of a size that does not fit).
bool nextOutgoing(ProxyConn& conn, bool* bad);
// Bytes [begin, end) of the outgoing message on the wire, as at most two pieces: of the payload, then of the
// trailer. Returns how many.
int outgoingPieces(const ProxyConn& conn, size_t begin, size_t end, iovec pieces[2]);

class ProxyComm : public TransportComm {
 public:
  // `transport` names it in messages ("tcp").
  ProxyComm(const TransportCommContext& context, const char* transport);
  ~ProxyComm() override;

  // Makes the eventfd the FIFOs' doorbell; call once before add().
  loomResult_t openDoorbell();
  const TransportCommContext& context() const { return context_; }
  int doorbell() const { return wake_.get(); }
  const char* transport() const { return transport_; }
  std::string lostReason(int peer) const override;
  // Hands a new connection to the proxy (starting the thread with the first) and gives the executor its end;
  // fails when the connection's FIFO could not be allocated.
  loomResult_t attach(std::shared_ptr<ProxyConn> conn, std::unique_ptr<Endpoint>* out);
  // Rings the proxy awake (new work from another thread, a released endpoint).
  void wake();
  // Progress from waiting threads (TransportComm), for transports whose progressesFromCaller() says so: one
  // thread at a time runs a pass over the connections, the proxy thread's or a caller's (passMutex_).
  void attachCaller() override;
  bool progressFromCaller() override;
  void detachCaller() override;
  // An executor's endpoint is gone: marks the connection released and hands its reference to the next pass, so
  // that the connection (its network resources) is always freed by the thread that runs the connections.
  void release(std::shared_ptr<ProxyConn> conn);

 protected:
  // Derived destructors call this first: the thread runs the virtual hooks below.
  void stopProxy();

  // The hooks, on the proxy thread or an attached caller, always under passMutex_.
  // Takes over what other threads handed the transport besides connections; whether there was anything.
  virtual bool adoptExtra() { return false; }
  // Progresses the network itself once a round, before the connections are pumped; whether anything happened.
  virtual bool progress() { return false; }
  // Moves what can move on a connected, open connection; whether anything moved.
  virtual bool pump(ProxyConn& conn) = 0;
  // The executor gave up on the connection: tell the peer if the network allows (best effort), with the failure
  // behind it (conn.localOrigin()).
  virtual void notifyGaveUp(ProxyConn& conn) { (void)conn; }
  // Closes the connection's network side; `graceful`: its messages are all out, let the peer see an orderly end.
  virtual void shutNetwork(ProxyConn& conn, bool graceful) = 0;
  // Sleeps until the network needs the proxy, the doorbell rings (then call drainDoorbell) or `micros` pass.
  virtual void sleep(int64_t micros) = 0;

  void drainDoorbell();
  // Ends the connection: marks its FIFO (`code`, when not 0) and shuts its network side.
  void shut(ProxyConn& conn, uint32_t code, uint64_t origin = 0);
  // A connection failed: WARNs with the transport, the connection and `what` (and errno's text for `error`).
  void fail(ProxyConn& conn, const std::string& what, int error = 0);
  void peerClosed(ProxyConn& conn);
  // The peer gave up on the connection; `origin`: the failure its notice carried (packOrigin; 0: none).
  void peerGaveUp(ProxyConn& conn, uint64_t origin);

  std::vector<std::shared_ptr<ProxyConn>> conns_;  // under passMutex_
  uint64_t sent_ = 0;                              // messages, for the log line at the end
  uint64_t received_ = 0;

 private:
  void run();
  bool adopt();
  bool pass();
  bool watchLocal(ProxyConn& conn);
  bool finished(const ProxyConn& conn) const;
  void setSleeping(bool sleeping);
  // Whether the proxy has work a detaching caller leaves it (under passMutex_): a message the executor posted
  // and not yet sent, a FIFO it marked aborted (the peer must hear), a connection attached or released.
  bool needsProxy();
  // While callers are attached: sleeps on the doorbell alone, until it rings or `micros` pass.
  void waitDoorbell(int64_t micros);

  TransportCommContext context_;
  const char* transport_;
  UniqueFd wake_;
  std::thread thread_;
  // Held by whichever thread runs the connections' hooks (pass, sleep): the proxy thread or an attached caller.
  // What the header calls the proxy thread's is that holder's.
  std::mutex passMutex_;
  std::atomic<int> callers_{0};           // threads attached (attachCaller)
  std::atomic<bool> proxyAsleep_{false};  // the proxy thread sleeps on the network, holding passMutex_
  uint64_t proxyPasses_ = 0;              // passes that moved anything, by the proxy thread and by callers
  uint64_t callerPasses_ = 0;
  uint64_t idleCallerPasses_ = 0;  // callers' passes in a row that moved nothing
  std::mutex mutex_;  // guards what other threads hand the proxy
  std::vector<std::shared_ptr<ProxyConn>> added_;
  std::vector<std::shared_ptr<ProxyConn>> retired_;  // released endpoints' references (release())
  bool stopping_ = false;
  mutable std::mutex lostMutex_;
  std::vector<std::pair<int, std::string>> lost_;  // (peer, what failed), most recent last
};

// An executor's end of a proxied connection: the FIFO, kept until the proxy is done with it too.
class ProxyEndpoint : public Endpoint {
 public:
  ProxyEndpoint(ProxyComm* comm, std::shared_ptr<ProxyConn> conn) : comm_(comm), conn_(std::move(conn)) {}
  ~ProxyEndpoint() override;
  FifoMemory fifo() override { return conn_->fifo.view(); }

 private:
  ProxyComm* comm_;
  std::shared_ptr<ProxyConn> conn_;
};

}  // namespace loom
