// The event timer (event_timer.h).
#include "src/tuner/event_timer.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <queue>
#include <unordered_map>

namespace loom {
namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();

uint64_t connectionKey(int from, int to, int channel) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 40) |
         (static_cast<uint64_t>(static_cast<uint32_t>(to)) << 16) | static_cast<uint16_t>(channel);
}

struct SlicesOf {
  const SliceRule* rule;
  size_t operator()(const Step& step) const { return rule->slicesOf(step.count()); }
};

bool sameSteps(const Lane& a, const Lane& b, const SliceRule& rule) {
  if (a.steps.size() != b.steps.size() || a.phaseStarts != b.phaseStarts) return false;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const Step &x = a.steps[i], &y = b.steps[i];
    const size_t cx = x.count(), cy = y.count();
    if (x.action != y.action || x.recvPeer != y.recvPeer || x.sendPeer != y.sendPeer ||
        (cx > cy ? cx - cy : cy - cx) > 1 || rule.protocolFor(cx) != rule.protocolFor(cy) ||
        rule.slicesOf(cx) != rule.slicesOf(cy))
      return false;
  }
  return true;
}

// nChannels when on every rank each channel's lanes are copies of its channel set's first channel's, else 1.
int foldFactor(const std::vector<RankPlan>& plans, const SliceRule& rule, int nChannels) {
  if (nChannels <= 1) return 1;
  std::vector<std::vector<const Lane*>> byChannel(static_cast<size_t>(kChannelSets) * nChannels);
  for (const RankPlan& plan : plans) {
    for (auto& lanes : byChannel) lanes.clear();
    for (const Lane& lane : plan.lanes) {
      if (lane.channel < 0 || lane.channel >= kChannelSets * nChannels) return 1;
      byChannel[lane.channel].push_back(&lane);
    }
    for (int set = 0; set < kChannelSets; ++set) {
      const auto& first = byChannel[set * nChannels];
      for (int c = 1; c < nChannels; ++c) {
        const auto& other = byChannel[set * nChannels + c];
        if (other.size() != first.size()) return 1;
        for (size_t i = 0; i < first.size(); ++i)
          if (!sameSteps(*first[i], *other[i], rule)) return 1;
      }
    }
  }
  return nChannels;
}

class EventEngine {
 public:
  EventEngine(const std::vector<RankPlan>& plans, int nChannels, Network& network, const SliceRule& rule,
              const EventCosts& costs, int calls)
      : network_(network), rule_(rule), costs_(costs), calls_(std::max(1, calls)) {
    folded_ = foldFactor(plans, rule, nChannels);
    ranks_.resize(plans.size());
    for (int rank = 0; rank < static_cast<int>(plans.size()); ++rank)
      for (const Lane& lane : plans[rank].lanes)
        if (folded_ == 1 || lane.channel % nChannels == 0) {
          ranks_[rank].lanes.push_back(static_cast<int>(lanes_.size()));
          lanes_.push_back({rank, &lane});
        }
  }

  EventTiming run() {
    for (int rank = 0; rank < static_cast<int>(ranks_.size()); ++rank) push(Event::kStart, costs_.callUs, rank);
    while (!events_.empty() && error_.empty()) {
      Event event = events_.top();
      events_.pop();
      ++processed_;
      switch (event.kind) {
        case Event::kStart:
          startCall(event.id, event.time);
          break;
        case Event::kUnitDone:
          unitDone(event.id, event.time);
          break;
        case Event::kArrival:
          arrived(event.id, event.index, event.time);
          break;
        case Event::kCredit:
          credited(event.id, event.time);
          break;
        case Event::kNetwork:
          if (event.index == networkVersion_) networkStep(event.time);
          break;
      }
      // The fair shares change once for all the flows that start or end at one instant: symmetric plans start
      // and end many at once.
      if (ratesStale_ && (events_.empty() || events_.top().time > event.time)) reschedule(event.time);
    }
    EventTiming result;
    result.events = processed_;
    result.folded = folded_;
    if (!error_.empty()) {
      result.error = error_;
      return result;
    }
    for (int rank = 0; rank < static_cast<int>(ranks_.size()); ++rank) {
      const RankState& state = ranks_[rank];
      if (state.call < calls_) {
        int channel = -1;
        for (int l : state.lanes)
          if (!lanes_[l].cursor.done()) channel = lanes_[l].lane->channel;
        result.error = "the plan deadlocks: rank " + std::to_string(rank) + " waits forever" +
                       (channel >= 0 ? " on channel " + std::to_string(channel) : std::string());
        return result;
      }
    }
    double first = 0, last = 0;
    for (const RankState& state : ranks_) {
      first = std::max(first, state.firstDone);
      last = std::max(last, state.lastDone);
    }
    result.ok = true;
    result.timeUs = calls_ > 1 ? (last - first) / (calls_ - 1) : last;
    return result;
  }

 private:
  struct LaneState {
    int rank;
    const Lane* lane;
    LaneCursor cursor{};
    int inConnection = -1, outConnection = -1;  // of the unit in progress
    double outWire = 0;
  };
  struct RankState {
    std::vector<int> lanes;
    int call = 0;        // calls finished
    int running = 0;     // lanes of the current call not yet done
    double firstDone = 0, lastDone = 0;
  };
  struct Connection {
    const NetRoute* route;
    double latencyBack;
    std::vector<double> wire;  // bytes of each posted message
    std::vector<char> arrivedFlags;
    size_t transmitted = 0, consumed = 0, credits = 0;
    bool sending = false;
    int waitingReceiver = -1, waitingSender = -1;
  };
  struct Flow {
    int connection;
    double remaining, rate;
  };
  struct Event {
    enum Kind { kStart, kUnitDone, kArrival, kCredit, kNetwork } kind;
    double time;
    uint64_t sequence;
    int id;
    size_t index;
    bool operator>(const Event& other) const {
      return time != other.time ? time > other.time : sequence > other.sequence;
    }
  };

  void push(Event::Kind kind, double time, int id, size_t index = 0) {
    events_.push({kind, time, sequence_++, id, index});
  }

  int connection(int from, int to, int channel) {
    uint64_t key = connectionKey(from, to, channel);
    auto found = connectionIndex_.find(key);
    if (found != connectionIndex_.end()) return found->second;
    const NetRoute& route = network_.rankRoute(from, to);
    if (!route.reachable && error_.empty())
      error_ = "rank " + std::to_string(from) + " sends to rank " + std::to_string(to) +
               ", which the topology gives it no route to";
    connections_.push_back({&route, network_.rankRoute(to, from).latencyUs, {}, {}});
    return connectionIndex_[key] = static_cast<int>(connections_.size()) - 1;
  }

  void startCall(int rank, double now) {
    RankState& state = ranks_[rank];
    state.running = static_cast<int>(state.lanes.size());
    for (int l : state.lanes) lanes_[l].cursor.start(*lanes_[l].lane, SlicesOf{&rule_});
    if (state.lanes.empty()) callDone(rank, now);
    for (int l : state.lanes) tryLane(l, now);
  }

  void callDone(int rank, double now) {
    RankState& state = ranks_[rank];
    if (state.call++ == 0) state.firstDone = now;
    state.lastDone = now;
    if (state.call < calls_) push(Event::kStart, now + costs_.callUs, rank);
  }

  // Starts the lane's next unit if it can; otherwise leaves it waiting on what it lacks.
  void tryLane(int l, double now) {
    LaneState& lane = lanes_[l];
    while (!lane.cursor.done()) {
      const Step& step = lane.lane->steps[lane.cursor.step()];
      const size_t count = step.count();
      const Protocol protocol = rule_.protocolFor(count);
      const size_t slice = rule_.sliceElems(protocol);
      const size_t lo = std::min(count, lane.cursor.round() * slice), hi = std::min(count, lo + slice);
      if (lo == hi) {  // this step has no slice in this round
        lane.cursor.next(SlicesOf{&rule_});
        continue;
      }
      const bool receives = actionReceives(step.action), sends = actionSends(step.action);
      const int in = receives ? connection(step.recvPeer, lane.rank, lane.lane->channel) : -1;
      const int out = sends ? connection(lane.rank, step.sendPeer, lane.lane->channel) : -1;
      if (in >= 0) {
        Connection& c = connections_[in];
        if (c.consumed >= c.arrivedFlags.size() || !c.arrivedFlags[c.consumed]) {
          c.waitingReceiver = l;
          return;
        }
      }
      if (out >= 0) {
        Connection& c = connections_[out];
        if (c.wire.size() - c.credits >= static_cast<size_t>(std::max(1, costs_.fifoDepth))) {
          c.waitingSender = l;
          return;
        }
      }
      const bool ll = protocol == Protocol::kLL;
      const double bytes = static_cast<double>((hi - lo) * rule_.elementBytes);
      lane.inConnection = in;
      lane.outConnection = out;
      lane.outWire = wireBytes(bytes, ll);
      const double cost = receives || sends ? (ll ? costs_.llOverheadUs : costs_.simpleOverheadUs)
                                            : bytes * memoryFactor(step.action) / (costs_.copyGBps * 1e3);
      push(Event::kUnitDone, now + cost, l);
      return;
    }
    if (--ranks_[lane.rank].running == 0) callDone(lane.rank, now);
  }

  void unitDone(int l, double now) {
    LaneState& lane = lanes_[l];
    if (lane.inConnection >= 0) {
      Connection& c = connections_[lane.inConnection];
      ++c.consumed;
      push(Event::kCredit, now + c.latencyBack, lane.inConnection);
    }
    if (lane.outConnection >= 0) {
      Connection& c = connections_[lane.outConnection];
      c.wire.push_back(lane.outWire);
      c.arrivedFlags.push_back(0);
      if (!c.sending) startSending(lane.outConnection, now);
    }
    lane.cursor.next(SlicesOf{&rule_});
    tryLane(l, now);
  }

  void arrived(int id, size_t index, double now) {
    Connection& c = connections_[id];
    c.arrivedFlags[index] = 1;
    if (c.waitingReceiver >= 0 && c.consumed == index) {
      int l = c.waitingReceiver;
      c.waitingReceiver = -1;
      tryLane(l, now);
    }
  }

  void credited(int id, double now) {
    Connection& c = connections_[id];
    ++c.credits;
    if (c.waitingSender >= 0) {
      int l = c.waitingSender;
      c.waitingSender = -1;
      tryLane(l, now);
    }
  }

  void startSending(int id, double now) {
    advanceFlows(now);
    Connection& c = connections_[id];
    c.sending = true;
    flows_.push_back({id, c.wire[c.transmitted], 0});
    ratesStale_ = true;
  }

  void advanceFlows(double now) {
    double elapsed = now - flowClock_;
    if (elapsed > 0)
      for (Flow& flow : flows_)
        if (!std::isinf(flow.rate)) flow.remaining -= flow.rate * 1e3 * elapsed;
    flowClock_ = now;
  }

  // New fair rates for the flows in flight (each folded flow standing for `folded_` alike ones), and an event at
  // the next time one of them ends.
  void reschedule(double now) {
    ratesStale_ = false;
    demands_.clear();
    for (const Flow& flow : flows_) demands_.push_back({connections_[flow.connection].route, double(folded_)});
    network_.fairRates(demands_, &rates_);
    double next = kInfinite;
    for (size_t f = 0; f < flows_.size(); ++f) {
      flows_[f].rate = rates_[f];
      double left = std::isinf(rates_[f]) ? 0 : std::max(0.0, flows_[f].remaining) / (rates_[f] * 1e3);
      next = std::min(next, now + left);
    }
    ++networkVersion_;
    if (!flows_.empty()) push(Event::kNetwork, next, 0, networkVersion_);
  }

  void networkStep(double now) {
    advanceFlows(now);
    std::vector<Flow> running;
    std::vector<int> finished;
    for (const Flow& flow : flows_) {
      double wire = connections_[flow.connection].wire[connections_[flow.connection].transmitted];
      // Done, or so nearly that the time left does not move the clock (it would never pass).
      if (std::isinf(flow.rate) || flow.remaining <= 1e-9 * wire + 1e-9 ||
          (flow.rate > 0 && now + flow.remaining / (flow.rate * 1e3) <= now))
        finished.push_back(flow.connection);
      else
        running.push_back(flow);
    }
    flows_ = std::move(running);
    for (int id : finished) {
      Connection& c = connections_[id];
      push(Event::kArrival, now + c.route->latencyUs, id, c.transmitted);
      ++c.transmitted;
      c.sending = c.transmitted < c.wire.size();
      if (c.sending) flows_.push_back({id, c.wire[c.transmitted], 0});
    }
    ratesStale_ = true;
  }

  Network& network_;
  const SliceRule& rule_;
  const EventCosts& costs_;
  const int calls_;
  int folded_ = 1;
  std::vector<LaneState> lanes_;
  std::vector<RankState> ranks_;
  std::vector<Connection> connections_;
  std::unordered_map<uint64_t, int> connectionIndex_;
  std::vector<Flow> flows_;
  std::vector<FlowDemand> demands_;
  std::vector<double> rates_;
  double flowClock_ = 0;
  size_t networkVersion_ = 0;
  bool ratesStale_ = false;  // flows started or ended since the rates were last computed
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t sequence_ = 0;
  size_t processed_ = 0;
  std::string error_;
};

}  // namespace

double memoryFactor(Action action) {
  switch (action) {
    case Action::kSend:
    case Action::kRecv:
    case Action::kCopy:
      return 1.0;
    case Action::kRecvReduce:
    case Action::kRecvReduceSend:
    case Action::kReduce:
      return 1.5;
    case Action::kRecvCopySend:
      return 2.0;
    case Action::kRecvReduceCopySend:
      return 2.5;
  }
  return 1.0;
}

double eventWork(const std::vector<RankPlan>& plans, const SliceRule& rule, int nChannels) {
  const int folded = foldFactor(plans, rule, nChannels);
  double units = 0;
  std::vector<uint64_t> connections;
  for (int rank = 0; rank < static_cast<int>(plans.size()); ++rank)
    for (const Lane& lane : plans[rank].lanes) {
      if (folded > 1 && lane.channel % nChannels != 0) continue;
      for (const Step& step : lane.steps) {
        units += static_cast<double>(rule.slicesOf(step.count()));
        if (actionSends(step.action)) connections.push_back(connectionKey(rank, step.sendPeer, lane.channel));
      }
    }
  std::sort(connections.begin(), connections.end());
  const auto distinct = std::unique(connections.begin(), connections.end()) - connections.begin();
  return units * static_cast<double>(std::max<ptrdiff_t>(1, distinct));
}

EventTiming timeByEvents(const std::vector<RankPlan>& plans, int nChannels, Network& network, const SliceRule& rule,
                         const EventCosts& costs, int calls) {
  return EventEngine(plans, nChannels, network, rule, costs, calls).run();
}

}  // namespace loom
