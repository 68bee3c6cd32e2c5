// A communicator's connections, by (peer, channel), made on first use.
//
// ConnectionTable holds the endpoints and makes the ones a plan lacks in two phases: receivers first (that never
// waits), then senders, which attach to their peers' receivers (that waits, as long as the caller's check
// allows). A caller with several plans (a group, perhaps over several communicators driven by one thread)
// creates all receivers before attaching any sender, so that no rank waits for a receiver only it could create.
// Its owner says which transport reaches a peer, what shape a channel's FIFOs have, and what becomes of each new
// endpoint. There are two owners:
//  - Connections, for host calls: the executor's FifoSender and FifoReceiver wrap each endpoint, and it is the
//    executor's Links (lookup by (peer, channel), failure notes, direct messages, network progress);
//  - the device path of CUDA communicators (cuda_device.cc), which hands each endpoint to the GPU executor
//    (src/exec/cuda/device_executor.h), whose kernels get it as a PortableEnd in device memory.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/plan.h"
#include "loom/loom.h"
#include "src/base/wait.h"
#include "src/core/peer_watch.h"
#include "src/exec/host_executor.h"
#include "src/exec/peer_memory.h"
#include "transports/transport.h"

struct loomComm;

namespace loom {

// Channel numbers of Send/Recv connections: apart from the collectives' so the two never share a FIFO.
constexpr int kP2PChannel = 1024;
constexpr int kMaxChannels = 32;  // collective channels a communicator may use (LOOM_NCHANNELS, config)

class ConnectionTable {
 public:
  // The transport that reaches a peer, and its state for the communicator (null for transports that keep none).
  struct Route {
    Transport* transport = nullptr;
    TransportComm* state = nullptr;
  };
  class Owner {
   public:
    virtual loomResult_t route(int peer, Route* out) = 0;
    virtual const FifoShape& shapeOf(int channel) = 0;
    // A new endpoint, kept by the table from now on.
    virtual loomResult_t made(bool sender, int peer, int channel, Endpoint& endpoint) = 0;
    // A sender that could not attach (the transport's message is the thread's last error): the error to return.
    virtual loomResult_t attachFailed(int peer, int channel, const Route& route, loomResult_t result) {
      (void)peer, (void)channel, (void)route;
      return result;
    }

   protected:
    ~Owner() = default;
  };

  // Set before the first connection: `owner` outlives the table's use.
  void bind(Owner* owner, uint64_t commHash, int rank) {
    owner_ = owner;
    commHash_ = commHash;
    rank_ = rank;
  }
  // Every receiver / sender `plan` uses that does not exist yet.
  loomResult_t createReceivers(const RankPlan& plan);
  loomResult_t attachSenders(const RankPlan& plan, const WaitCheck& check);
  // One of each, where it does not exist yet.
  loomResult_t createReceiver(int peer, int channel);
  loomResult_t attachSender(int peer, int channel, const WaitCheck& check);
  Endpoint* receiverOf(int peer, int channel) const { return find(receivers_, peer, channel); }
  Endpoint* senderOf(int peer, int channel) const { return find(senders_, peer, channel); }
  // Closes every endpoint / lets go of every endpoint without closing it (for a teardown that cannot wait for
  // its peers: closing may touch memory still in use).
  void clear() {
    senders_.clear();
    receivers_.clear();
  }
  void abandon() {
    for (auto& [key, endpoint] : senders_) (void)endpoint.release();
    for (auto& [key, endpoint] : receivers_) (void)endpoint.release();
    clear();
  }

 private:
  using Endpoints = std::map<std::pair<int, int>, std::unique_ptr<Endpoint>>;
  static Endpoint* find(const Endpoints& endpoints, int peer, int channel) {
    auto found = endpoints.find({peer, channel});
    return found == endpoints.end() ? nullptr : found->second.get();
  }

  Owner* owner_ = nullptr;
  uint64_t commHash_ = 0;
  int rank_ = 0;
  Endpoints receivers_, senders_;
};

// Every connection of a host communicator. Implements the executor's Links.
class Connections : public Links, private ConnectionTable::Owner {
 public:
  FifoSender* sender(int peer, int channel) override;
  FifoReceiver* receiver(int peer, int channel) override;
  bool directTo(int peer) override { return peer < static_cast<int>(directTo_.size()) && directTo_[peer]; }
  bool proxySends(int peer) override { return peer < static_cast<int>(proxyTo_.size()) && proxyTo_[peer]; }
  bool movesByProxy(int peer) override {
    return peer < static_cast<int>(traitsTo_.size()) && traitsTo_[peer].movesByProxy;
  }
  bool sendsAgain(int peer) override {
    return peer < static_cast<int>(traitsTo_.size()) && (!traitsTo_[peer].movesByProxy || traitsTo_[peer].proxyResends);
  }
  bool anyProxySends() const { return std::find(proxyTo_.begin(), proxyTo_.end(), true) != proxyTo_.end(); }
  const void* mapDirect(const DirectDescriptor& message) override { return peerMappings_.resolve(message); }
  // directTo[p]: whether peer p can read this process's memory (probed at init; LOOM_DIRECT=0 clears it).
  void setDirectPeers(std::vector<bool> directTo) { directTo_ = std::move(directTo); }
  // proxyTo[p]: whether a proxy thread of this process moves the messages to peer p.
  void setProxyPeers(std::vector<bool> proxyTo) { proxyTo_ = std::move(proxyTo); }
  // traitsTo[p]: what peer p's transport is like (its proxy: TransportTraits::movesByProxy, proxyResends).
  void setPeerTraits(std::vector<TransportTraits> traitsTo) { traitsTo_ = std::move(traitsTo); }
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
  // Make sure every connection `plan` uses exists, in ConnectionTable's two phases, over the transports `comm`
  // picked at init.
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
  // ConnectionTable::Owner
  loomResult_t route(int peer, ConnectionTable::Route* out) override;
  const FifoShape& shapeOf(int channel) override;
  loomResult_t made(bool sender, int peer, int channel, Endpoint& endpoint) override;
  loomResult_t attachFailed(int peer, int channel, const ConnectionTable::Route& route, loomResult_t result) override;
  void bindTo(loomComm* comm);
  // Where (peer, channel) sits in the lookup tables: collective channels, then the p2p channels, by peer.
  size_t tableIndex(int peer, int channel) const;
  template <typename End>
  static void remember(std::vector<End*>& table, size_t index, End* end);

  loomComm* comm_ = nullptr;
  int nranks_ = 0;
  // Declared before the ends that wrap its endpoints, so that the ends go first.
  ConnectionTable table_;
  std::map<std::pair<int, int>, std::unique_ptr<FifoSender>> senders_;
  std::map<std::pair<int, int>, std::unique_ptr<FifoReceiver>> receivers_;
  // The same ends by tableIndex, for the executor's lookup on every message (null: none yet).
  std::vector<FifoSender*> senderTable_;
  std::vector<FifoReceiver*> receiverTable_;
  std::vector<bool> directTo_;
  std::vector<bool> proxyTo_;
  std::vector<TransportTraits> traitsTo_;
  std::function<std::string(int)> whyLost_;
  std::vector<TransportComm*> callerProgress_;
  PeerMappings peerMappings_;
  const PeerWatch* peerWatch_ = nullptr;
  std::function<uint64_t(int)> askPeer_;
};

}  // namespace loom
