// The communicator: one rank's membership in a group, with its bootstrap, its peers, its connections and the
// state every wait consults (deadline, abort flag, peer liveness).
#pragma once

#include <atomic>
#include <cstdlib>
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
#include "src/base/integrity.h"
#include "src/base/wait.h"
#include "src/core/connections.h"
#include "src/core/cuda_calls.h"
#include "src/core/peer_watch.h"
#include "src/core/planner.h"
#include "src/core/status.h"
#include "src/exec/host_executor.h"
#include "src/exec/peer_memory.h"
#include "src/topology/topology.h"
#include "src/tuner/tuner.h"
#include "transports/transport.h"

namespace loom {

// State that a layer built on the communicator keeps on it: the EP objects' registry (src/ep), a CUDA
// communicator's staged calls and GPU executor (cuda_calls.h). One object per kind (loomComm::extension), attached
// when the layer first needs it and destroyed first thing when the communicator goes, newest first, while
// everything else of the communicator is still there.
class CommExtension {
 public:
  virtual ~CommExtension() = default;
};

// What a communicator was set up with: read at init from its config and the environment (commConfigure,
// commConnect), checked equal on every rank where both ends of a message must agree, and fixed once init returns.
struct CommSettings {
  std::string name;
  int64_t timeoutMs = 0;
  int nChannels = 1;
  loomDevice_t device = loomDeviceHost;
  int cudaDevice = -1;  // a CUDA communicator's device ordinal
  FifoShape fifoShape{};
  std::string algorithm;               // LOOM_ALGO as given
  AlgorithmRules algorithmRules;       // ... parsed
  std::string torusText;               // LOOM_TORUS_DIMS as given
  int torusDims[kMaxTorusDims] = {};   // ... parsed (torusDimCount 0: the builders' default grid)
  int torusDimCount = 0;
  int forcedProtocol = -1;             // LOOM_PROTO: -1 by size, else a Protocol
  size_t llThresholdBytes = 0;         // LOOM_LL_THRESHOLD
  size_t chunkBytes = 0;               // LOOM_CHUNK_BYTES (0: the tuner chooses)
  int64_t peerCheckMs = 50;            // LOOM_PEER_CHECK_MS
  size_t directForwardBytes = 0;       // LOOM_DIRECT_FORWARD_BYTES
  size_t streamingBytes = 0;           // outputs of at least this many bytes use streaming stores (0: never)
  int64_t spinPolls = kSpinPollsShared;  // polls a collective spins before yielding (see Backoff)
  bool checkCalls = false;             // LOOM_CHECK_COLL (coll_check.h)
  bool deterministic = false;          // LOOM_DETERMINISTIC: algorithmRules keep reductions in rank order
  bool checksum = false;               // LOOM_CHECKSUM: every message carries a CRC32C (src/base/integrity.h)
  bool checksumResend = false;         // LOOM_CHECKSUM=2: and a message that fails it is sent again once
};

// The payload of one message of `protocol`, the bytes a slice may move: a slot's, less the checksum after it under
// LOOM_CHECKSUM, and then whole cache lines, so that slices start where they would without the switch (a payload 4
// bytes short of the slot would put every slice but the first off its line, and slow each copy and reduction of
// it). Every rank slices alike, as the settings match.
inline size_t slicePayloadBytes(const CommSettings& settings, Protocol protocol) {
  const size_t slot = fifoPayloadBytes(settings.fifoShape, protocol);
  if (!settings.checksum) return slot;
  constexpr size_t kLine = 64;
  const size_t payload = slot - kChecksumBytes;
  return payload >= 2 * kLine ? payload / kLine * kLine : payload;
}

// What the host keeps beside each cached plan.
struct HostPlanState {
  bool connected = false;  // every connection the plan uses exists: later calls skip the check
};
using HostPlanner = Planner<HostPlanState>;

}  // namespace loom

struct loomComm {
  int rank = 0;
  int nranks = 0;
  loom::CommSettings settings;  // what init agreed on: fixed once init returns
  // Everything below is what the communicator learns and keeps while it runs.
  bool everyRankCuda = false;  // every rank's communicator is a CUDA one (known once connected)
  uint64_t commHash = 0;
  std::unique_ptr<loom::Bootstrap> bootstrap;
  // The same, for threads other than the one initializing: set once the bootstrap is up (setLastError reads it).
  std::atomic<loom::Bootstrap*> bootstrapUp{nullptr};
  std::vector<loom::PeerInfo> peers;
  std::vector<std::string> hostNames;  // by rank: gethostname() of each, for error messages
  loom::PeerWatch peerWatch;
  std::vector<int> hostOf;                // host index of every rank, by LOOM_HOSTID or the machine's identity
  loom::Topology topology;                // the ranks' local views, fused at init
  loom::HostPlanner planner;              // the tuner and the cached plans of host calls (under runMutex)
  loom::Clock::time_point nextPeerCheck;  // when a wait next checks peer processes (calls share it: under runMutex)
  // Each transport's state for this communicator (null for those that keep none), made at init. Declared before
  // `connections`, whose endpoints may refer to it, so that it is destroyed after them.
  std::vector<std::pair<loom::Transport*, std::unique_ptr<loom::TransportComm>>> transportComms;
  std::vector<loom::Transport*> transportTo;  // by peer: the first transport that connects it (null: none, or self)
  std::vector<loom::TransportTraits> traitsTo;  // by peer: what that transport is like (none: all false)
  loom::Connections connections;
  std::vector<std::byte> scratch;
  uint64_t directMessages = 0;  // DirectDescriptors sent so far (statistics, tests)

  std::atomic<bool> abortFlag{false};
  std::atomic<int> asyncError{loomSuccess};
  std::atomic<int> activeCalls{0};  // calls inside the library right now; Abort waits for them to leave
  bool finalized = false;
  std::atomic<bool> revoked{false};  // loomCommRevoke: every later call fails at its check
  std::mutex runMutex;        // one operation at a time on a communicator (streams and callers may race)
  uint64_t checkedCalls = 0;  // submissions checked so far (under checkMutex)
  std::mutex checkMutex;
  std::mutex errorMutex;
  std::string lastError;
  std::thread initThread;                               // a non-blocking init runs here (config blocking = 0)
  std::vector<std::pair<void*, size_t>> registrations;  // loomCommRegister: regions peers may access
  // The state of layers built on the communicator (CommExtension), oldest first: the first `extensionCount` slots.
  // Attached under runMutex, or by init before it returns, and looked up without a lock (a slot is filled before
  // the count that shows it); destroyed newest first, first thing in the destructor.
  static constexpr int kMaxExtensions = 4;
  std::unique_ptr<loom::CommExtension> extensions[kMaxExtensions];
  std::atomic<int> extensionCount{0};
  loom::CommStatus status;      // what the status report says of it (status.h)
  loom::StatusListing listing;  // last: out of the report's list before anything else goes

  // The extension of kind T (null: none attached).
  template <typename T>
  T* extension() const {
    const int count = extensionCount.load(std::memory_order_acquire);
    for (int i = 0; i < count; ++i)
      if (auto* found = dynamic_cast<T*>(extensions[i].get())) return found;
    return nullptr;
  }
  // Attaches `extension` (at most one per kind; kMaxExtensions kinds in all).
  template <typename T>
  T& attach(std::unique_ptr<T> extension) {
    const int count = extensionCount.load(std::memory_order_relaxed);
    if (count >= kMaxExtensions || this->extension<T>() != nullptr) std::abort();  // kinds are fixed in the code
    T& attached = *extension;
    extensions[count] = std::move(extension);
    extensionCount.store(count + 1, std::memory_order_release);
    return attached;
  }

  void setLastError(const std::string& message);
  ~loomComm();
};

namespace loom {

// The transport init picked to reach `peer`, and its state for the communicator; an error saying, transport by
// transport, why none can.
loomResult_t routeTo(const loomComm* comm, int peer, ConnectionTable::Route* out);
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
