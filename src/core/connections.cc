// A communicator's connections (connections.h): the table's two-phase walk of a plan, and the host's ends.
#include "src/core/connections.h"

#include <signal.h>

#include <chrono>
#include <thread>

#include "src/base/check.h"
#include "src/base/log.h"
#include "src/core/comm.h"
#include "src/core/failure.h"

namespace loom {

loomResult_t ConnectionTable::createReceiver(int peer, int channel) {
  if (receivers_.count({peer, channel})) return loomSuccess;
  Route route;
  LOOM_CHECK(owner_->route(peer, &route));
  std::unique_ptr<Endpoint> endpoint;
  const ConnectionKey key{commHash_, peer, rank_, channel};
  LOOM_CHECK(route.transport->createReceiver(route.state, key, owner_->shapeOf(channel), &endpoint));
  Endpoint& made = *(receivers_[{peer, channel}] = std::move(endpoint));
  loomResult_t result = owner_->made(false, peer, channel, made);
  if (result != loomSuccess) receivers_.erase({peer, channel});
  return result;
}

loomResult_t ConnectionTable::attachSender(int peer, int channel, const WaitCheck& check) {
  if (senders_.count({peer, channel})) return loomSuccess;
  Route route;
  LOOM_CHECK(owner_->route(peer, &route));
  std::unique_ptr<Endpoint> endpoint;
  const ConnectionKey key{commHash_, rank_, peer, channel};
  loomResult_t result = route.transport->attachSender(route.state, key, owner_->shapeOf(channel), check, &endpoint);
  if (result != loomSuccess) return owner_->attachFailed(peer, channel, route, result);
  LOOM_TRACE(INIT, "connected to rank %d on channel %d via %s", peer, channel, route.transport->name());
  Endpoint& made = *(senders_[{peer, channel}] = std::move(endpoint));
  result = owner_->made(true, peer, channel, made);
  if (result != loomSuccess) senders_.erase({peer, channel});
  return result;
}

loomResult_t ConnectionTable::createReceivers(const RankPlan& plan) {
  for (const Lane& lane : plan.lanes)
    for (const Step& step : lane.steps)
      if (actionReceives(step.action)) LOOM_CHECK(createReceiver(step.recvPeer, lane.channel));
  return loomSuccess;
}

loomResult_t ConnectionTable::attachSenders(const RankPlan& plan, const WaitCheck& check) {
  for (const Lane& lane : plan.lanes)
    for (const Step& step : lane.steps)
      if (actionSends(step.action)) LOOM_CHECK(attachSender(step.sendPeer, lane.channel, check));
  return loomSuccess;
}

void Connections::bindTo(loomComm* comm) {
  if (comm_ == comm) return;
  comm_ = comm;
  nranks_ = comm->nranks;
  table_.bind(this, comm->commHash, comm->rank);
}

loomResult_t Connections::createReceivers(loomComm* comm, const RankPlan& plan) {
  bindTo(comm);
  return table_.createReceivers(plan);
}

loomResult_t Connections::attachSenders(loomComm* comm, const RankPlan& plan, const WaitCheck& check) {
  bindTo(comm);
  return table_.attachSenders(plan, check);
}

loomResult_t Connections::route(int peer, ConnectionTable::Route* out) { return routeTo(comm_, peer, out); }

const FifoShape& Connections::shapeOf(int channel) {
  (void)channel;
  return comm_->settings.fifoShape;
}

loomResult_t Connections::made(bool sender, int peer, int channel, Endpoint& endpoint) {
  if (sender) {
    auto& end = senders_[{peer, channel}] = std::make_unique<FifoSender>(endpoint.fifo());
    remember(senderTable_, tableIndex(peer, channel), end.get());
  } else {
    auto& end = receivers_[{peer, channel}] = std::make_unique<FifoReceiver>(endpoint.fifo());
    remember(receiverTable_, tableIndex(peer, channel), end.get());
  }
  return loomSuccess;
}

loomResult_t Connections::attachFailed(int peer, int channel, const ConnectionTable::Route& route,
                                       loomResult_t result) {
  std::string why = threadLastError();
  // The peer never set up its end: it has not entered the call, or it is stopped or gone (noteFailure refines
  // that), or its connection failed.
  if (result == loomTimeout || result == loomRemoteError || result == loomSystemError) {
    // A peer that closed on us mid-setup may have failed first of something else: its marks (or those of the
    // ranks that failed with it) get their moment to arrive, as in a run (no run moves them here).
    bool mayCome = false;
    uint64_t marked = marksAfterLoss(peer, &mayCome);
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(kMarkGraceMs);
    while (marked == 0 && mayCome && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      marked = marksAfterLoss(peer, &mayCome);
    }
    noteFailure(marked != 0 ? marked
                            : packOrigin({peer,
                                          result == loomTimeout ? FailureCause::kLate : FailureCause::kConnectionLost,
                                          0}));
  }
  return LOOM_FAIL(result, INIT, "%s; waiting for rank %d to set up its end of channel %d (%s)", why.c_str(), peer,
                   channel, route.transport->name());
}

size_t Connections::tableIndex(int peer, int channel) const {
  constexpr int kCollectiveChannels = kMaxChannels * kChannelSets;
  size_t slot = channel < kP2PChannel ? static_cast<size_t>(channel) : kCollectiveChannels + (channel - kP2PChannel);
  return slot * static_cast<size_t>(nranks_) + static_cast<size_t>(peer);
}

template <typename End>
void Connections::remember(std::vector<End*>& table, size_t index, End* end) {
  if (table.size() <= index) table.resize(index + 1, nullptr);
  table[index] = end;
}

FifoSender* Connections::sender(int peer, int channel) {
  size_t index = tableIndex(peer, channel);
  return index < senderTable_.size() ? senderTable_[index] : nullptr;
}

FifoReceiver* Connections::receiver(int peer, int channel) {
  size_t index = tableIndex(peer, channel);
  return index < receiverTable_.size() ? receiverTable_[index] : nullptr;
}

void Connections::abortAll() {
  const uint64_t origin = failure();
  for (auto& [key, end] : senders_) end->abort(origin);
  for (auto& [key, end] : receivers_) end->abort(origin);
}

int Connections::firstGaveUp(uint64_t* origin) const {
  auto firstIn = [origin](const auto& ends) {
    for (const auto& [key, end] : ends) {
      if (end->abortCode() != kAbortedByPeer) continue;
      *origin = end->abortOrigin();
      return key.first;
    }
    return -1;
  };
  const int sender = firstIn(senders_);
  return sender >= 0 ? sender : firstIn(receivers_);
}

uint64_t Connections::marksAfterLoss(int peer, bool* mayCome) {
  uint64_t origin = 0;
  firstGaveUp(&origin);
  // No failing process sends itself SIGKILL: a peer that ended so failed first, and no mark of its is coming.
  int detail = 0;
  *mayCome = !(peerWatch_ != nullptr && peerWatch_->state(peer, &detail) == PeerWatch::State::kKilled &&
               detail == SIGKILL);
  return origin;
}

uint64_t Connections::noteFailure(uint64_t packed) {
  FailureOrigin origin = unpackOrigin(packed);
  // Only what another rank saw from afar is refined: a rank's own account (its deadline, its error, its abort)
  // stays, even if its process has ended since.
  const bool seenFromAfar = origin.cause == FailureCause::kUnknown || origin.cause == FailureCause::kConnectionLost ||
                            origin.cause == FailureCause::kNoAnswer || origin.cause == FailureCause::kLate ||
                            origin.cause == FailureCause::kGone;
  if (peerWatch_ != nullptr && origin.rank >= 0 && seenFromAfar) {
    int detail = 0;
    switch (peerWatch_->state(origin.rank, &detail)) {
      case PeerWatch::State::kRunning:
        // A peer that gave up without its notice getting through (a tcp sender in the middle of a message) looks
        // like a lost connection: it says why itself while it is still there.
        if ((origin.cause == FailureCause::kConnectionLost || origin.cause == FailureCause::kUnknown) && askPeer_) {
          const uint64_t told = askPeer_(origin.rank);
          if (told != 0) return Links::noteFailure(told);
        }
        break;
      case PeerWatch::State::kStopped:
        origin.cause = FailureCause::kStopped;
        origin.detail = 0;
        break;
      case PeerWatch::State::kExited:
        origin.cause = FailureCause::kExited;
        origin.detail = static_cast<uint8_t>(detail);
        break;
      case PeerWatch::State::kKilled:
        origin.cause = FailureCause::kKilled;
        origin.detail = static_cast<uint8_t>(detail);
        break;
      case PeerWatch::State::kGone:
        // Said more precisely by whoever saw it end, if anyone did.
        if (origin.cause != FailureCause::kExited && origin.cause != FailureCause::kKilled)
          origin.cause = FailureCause::kGone;
        break;
    }
  }
  return Links::noteFailure(packOrigin(origin));
}


}  // namespace loom
