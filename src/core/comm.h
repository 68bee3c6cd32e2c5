// The communicator: one rank's membership in a group, with its bootstrap, its peers, its connections and the
// state every wait consults (deadline, abort flag, peer liveness).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/plan.h"
#include "loom/loom.h"
#include "src/base/bootstrap.h"
#include "src/base/wait.h"
#include "src/core/cuda_calls.h"
#include "src/core/peer_watch.h"
#include "src/core/status.h"
#include "src/exec/host_executor.h"
#include "src/exec/peer_memory.h"
#include "src/topology/topology.h"
#include "src/tuner/tuner.h"
#include "transports/transport.h"

namespace loom {

// Channel numbers of Send/Recv connections: apart from the collectives' so the two never share a FIFO.
constexpr int kP2PChannel = 1024;
constexpr int kMaxChannels = 32;  // collective channels a communicator may use (LOOM_NCHANNELS, config)

// Every connection of a communicator, made on first use. Implements the executor's Links.
class Connections : public Links {
 public:
  FifoSender* sender(int peer, int channel) override;
  FifoReceiver* receiver(int peer, int channel) override;
  bool directTo(int peer) override { return peer < static_cast<int>(directTo_.size()) && directTo_[peer]; }
  bool proxySends(int peer) override { return peer < static_cast<int>(proxyTo_.size()) && proxyTo_[peer]; }
  bool anyProxySends() const { return std::find(proxyTo_.begin(), proxyTo_.end(), true) != proxyTo_.end(); }
  const void* mapDirect(const DirectDescriptor& message) override { return peerMappings_.resolve(message); }
  // directTo[p]: whether peer p can read this process's memory (probed at init; LOOM_DIRECT=0 clears it).
  void setDirectPeers(std::vector<bool> directTo) { directTo_ = std::move(directTo); }
  // proxyTo[p]: whether a proxy thread of this process moves the messages to peer p.
  void setProxyPeers(std::vector<bool> proxyTo) { proxyTo_ = std::move(proxyTo); }
  std::string whyLost(int peer) override { return whyLost_ ? whyLost_(peer) : std::string(); }
  void setWhyLost(std::function<std::string(int)> whyLost) { whyLost_ = std::move(whyLost); }
  // The transports whose connections a waiting executor moves itself (TransportComm::progressesFromCaller).
  void setCallerProgress(std::vector<TransportComm*> comms) { callerProgress_ = std::move(comms); }
  bool beginNetworkProgress() override {
    for (TransportComm* comm : callerProgress_) comm->attachCaller();
    return !callerProgress_.empty();
  }
  bool progressNetwork() override {
    bool moved = false;
    for (TransportComm* comm : callerProgress_) moved |= comm->progressFromCaller();
    return moved;
  }
  void endNetworkProgress() override {
    for (TransportComm* comm : callerProgress_) comm->detachCaller();
  }
  // Make sure every connection `plan` uses exists, in two phases: receivers first (that never waits), then
  // senders, which attach to their peers' receivers (that waits, as long as `check` allows). A caller with
  // several plans (a group, perhaps over several communicators driven by one thread) creates all receivers
  // before attaching any sender, so that no rank waits for a receiver that only it could create.
  loomResult_t createReceivers(loomComm* comm, const RankPlan& plan);
  loomResult_t attachSenders(loomComm* comm, const RankPlan& plan, const WaitCheck& check);
  // Marks every FIFO aborted, with the failure noted (failure()), so that peers waiting on this rank stop at once
  // and learn why.
  void abortAll();
  // A peer that marked one of its connections with this rank aborted (it gave up: its call failed, or it aborted
  // its communicator), or -1; *origin: the failure its mark carried (0: not known). Whatever this rank waits for,
  // the communicator cannot complete a collective then.
  int firstGaveUp(uint64_t* origin) const;
  // Refines a failure of a peer before noting it: with what `watch` sees of its process (ended, killed,
  // stopped), else, for a peer that closed its connections without saying why, with the failure `ask(peer)`
  // gets from the peer itself (its status query; 0: no answer).
  void watchPeersWith(const PeerWatch* watch, std::function<uint64_t(int peer)> ask) {
    peerWatch_ = watch;
    askPeer_ = std::move(ask);
  }
  uint64_t noteFailure(uint64_t origin) override;
  uint64_t marksAfterLoss(int peer, bool* mayCome) override;

 private:
  template <typename End>
  struct Link {
    std::unique_ptr<Endpoint> endpoint;
    std::unique_ptr<End> end;
  };
  loomResult_t pickTransport(loomComm* comm, int peer, Transport** transport);
  // Where (peer, channel) sits in the lookup tables: collective channels, then the p2p channels, by peer.
  size_t tableIndex(int peer, int channel) const;
  template <typename End>
  static void remember(std::vector<End*>& table, size_t index, End* end);
  int nranks_ = 0;
  std::map<std::pair<int, int>, Link<FifoSender>> senders_;
  std::map<std::pair<int, int>, Link<FifoReceiver>> receivers_;
  // The same ends by tableIndex, for the executor's lookup on every message (null: none yet).
  std::vector<FifoSender*> senderTable_;
  std::vector<FifoReceiver*> receiverTable_;
  std::vector<bool> directTo_;
  std::vector<bool> proxyTo_;
  std::function<std::string(int)> whyLost_;
  std::vector<TransportComm*> callerProgress_;
  PeerMappings peerMappings_;
  const PeerWatch* peerWatch_ = nullptr;
  std::function<uint64_t(int)> askPeer_;
};

// The key of a cached plan.
using PlanKey = std::tuple<int, size_t, int, int, std::string>;  // collective, count, root, channels, algorithm
// Looks a plan up without building a string: PlanKey's algorithm as a view.
using PlanKeyView = std::tuple<int, size_t, int, int, std::string_view>;

struct CachedPlan {
  RankPlan plan;
  bool connected = false;  // every connection the plan uses exists: later calls skip the check
};

// Plans by call shape, with the last one found kept in front: a loop of identical calls skips the search.
class PlanCache {
 public:
  CachedPlan* find(const PlanKeyView& key);
  CachedPlan* insert(PlanKey key, RankPlan plan);
  size_t size() const { return plans_.size(); }
  void clear() {
    plans_.clear();
    last_ = nullptr;
  }

 private:
  std::map<PlanKey, CachedPlan, std::less<>> plans_;
  PlanKeyView lastKey_;  // its algorithm views the map's key
  CachedPlan* last_ = nullptr;
};

}  // namespace loom

struct loomComm {
  int rank = 0;
  int nranks = 0;
  std::string name;
  int64_t timeoutMs = 0;
  int nChannels = 1;
  loomDevice_t device = loomDeviceHost;
  int cudaDevice = -1;         // a CUDA communicator's device ordinal
  bool everyRankCuda = false;  // every rank's communicator is a CUDA one (known once connected)
  uint64_t commHash = 0;
  std::unique_ptr<loom::Bootstrap> bootstrap;
  // The same, for threads other than the one initializing: set once the bootstrap is up (setLastError reads it).
  std::atomic<loom::Bootstrap*> bootstrapUp{nullptr};
  std::vector<loom::PeerInfo> peers;
  std::vector<std::string> hostNames;  // by rank: gethostname() of each, for error messages
  loom::PeerWatch peerWatch;
  loom::FifoShape fifoShape{};
  // Read once at init (and checked equal on every rank where both ends of a message must agree).
  std::string algorithm;                    // LOOM_ALGO as given
  loom::AlgorithmRules algorithmRules;      // ... parsed
  std::string torusText;                    // LOOM_TORUS_DIMS as given
  int torusDims[loom::kMaxTorusDims] = {};  // ... parsed (torusDimCount 0: the builders' default grid)
  int torusDimCount = 0;
  std::vector<int> hostOf;                // host index of every rank, by LOOM_HOSTID or the machine's identity
  loom::Topology topology;                // the ranks' local views, fused at init
  loom::Tuner tuner;                      // algorithm and channels per call (under runMutex)
  int forcedProtocol = -1;                // LOOM_PROTO: -1 by size, else a loom::Protocol
  size_t llThresholdBytes = 0;            // LOOM_LL_THRESHOLD
  size_t chunkBytes = 0;                  // LOOM_CHUNK_BYTES (0: the tuner chooses)
  int64_t peerCheckMs = 50;               // LOOM_PEER_CHECK_MS
  loom::Clock::time_point nextPeerCheck;  // when a wait next checks peer processes (calls share it: under runMutex)
  size_t directForwardBytes = 0;          // LOOM_DIRECT_FORWARD_BYTES
  size_t streamingBytes = 0;  // outputs of at least this many bytes are written with streaming stores (0: never)
  int64_t spinPolls = loom::kSpinPollsShared;  // polls a collective spins before yielding (see Backoff)
  // Each transport's state for this communicator (null for those that keep none), made at init. Declared before
  // `connections`, whose endpoints may refer to it, so that it is destroyed after them.
  std::vector<std::pair<loom::Transport*, std::unique_ptr<loom::TransportComm>>> transportComms;
  std::vector<loom::Transport*> transportTo;  // by peer: the first transport that connects it (null: none, or self)
  loom::Connections connections;
  loom::PlanCache planCache;
  std::vector<std::byte> scratch;
  uint64_t directMessages = 0;  // DirectDescriptors sent so far (statistics, tests)

  std::atomic<bool> abortFlag{false};
  std::atomic<int> asyncError{loomSuccess};
  std::atomic<int> activeCalls{0};  // calls inside the library right now; Abort waits for them to leave
  bool finalized = false;
  std::atomic<bool> revoked{false};  // loomCommRevoke: every later call fails at its check
  std::mutex runMutex;        // one operation at a time on a communicator (streams and callers may race)
  bool checkCalls = false;    // LOOM_CHECK_COLL (coll_check.h)
  uint64_t checkedCalls = 0;  // submissions checked so far (under checkMutex)
  std::mutex checkMutex;
  std::mutex errorMutex;
  std::string lastError;
  std::thread initThread;                               // a non-blocking init runs here (config blocking = 0)
  std::vector<std::pair<void*, size_t>> registrations;  // loomCommRegister: regions peers may access
  uint32_t epSlotsInUse = 0;                            // loom_ep.h: a bit per EP object alive (under runMutex)
  uint32_t epObjectsMade = 0;                           // ... and how many were made (each one's id)
  // Objects made on this communicator that must let go of it when it goes (loom_ep.h's), by address: each one's
  // detach runs first thing in the destructor. Added and removed under runMutex.
  std::map<const void*, std::function<void()>> dependents;
  // A CUDA communicator's queue of staged calls and its worker (cuda_calls.h). Last: destroyed first, while
  // everything its worker uses is still there.
  loom::CudaCallsPtr cuda;
  loom::CommStatus status;      // what the status report says of it (status.h)
  loom::StatusListing listing;  // last: out of the report's list before anything else goes

  void setLastError(const std::string& message);
  ~loomComm();
};

namespace loom {

// Reads `config` (may be null) into a fresh communicator: the part of init that cannot fail on peers.
loomResult_t commConfigure(loomComm* comm, int nranks, int rank, const loomConfig_t* config);
// Joins the group: bootstrap and peer exchange. May wait (deadline, abort flag).
loomResult_t commConnect(loomComm* comm, const loomUniqueId& id);
// Waits until no call is inside the library on `comm` (each ends by its own deadline).
void waitForIdle(loomComm* comm);
// What a waiting rank checks each time it finds nothing to do: abort flag, deadline, dead peers.
class CommWatch {
 public:
  // `sequence`: the number of the run's first collective on `comm` (CommStatus::enterCollectives; 0: none), by
  // which a deadline names the ranks that have not entered it.
  CommWatch(loomComm* comm, const char* what, uint64_t sequence = 0);
  // After progress only the abort flag is checked, and the deadline restarts: it bounds a wait, not a call.
  // The clock starts at the first check that finds nothing moved, so a call that never waits never reads it.
  // A peer that has exited is an error only when `needsPeer` says the operation still waits on it (none: every
  // peer counts, as while connecting); one that left after its part in the operation was done is not.
  loomResult_t operator()(bool progressed, const std::function<bool(int)>& needsPeer = nullptr);
  const char* what() const { return what_; }
  uint64_t sequence() const { return sequence_; }

 private:
  std::string label() const;  // "AllReduce #12", for messages (built only when one is)

  loomComm* comm_;
  const char* what_;
  uint64_t sequence_;
  Deadline deadline_;
  bool waiting_ = false;  // deadline_ runs from the first idle check after the last progress
  // A peer seen ended, waiting for its marks (what it failed of first) to arrive: since when.
  bool deadSeen_ = false;
  Clock::time_point deadSeenAt_;
};

}  // namespace loom
