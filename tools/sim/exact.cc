// The exact engine: every slice of every step of every lane as the executor runs it, as discrete events. The
// reference the fast engine is checked against, on calls of up to a few hundred ranks.
//
// A lane walks its steps with LaneCursor, the executor's own order. A unit (one slice) starts when its lane is
// free, its incoming message has arrived (receives) and its connection has a free FIFO slot (sends: at most
// fifoDepth messages posted and not yet released by the receiver, whose release reaches the sender after the
// reverse route's latency). It occupies the lane for unitCost; then it releases its incoming slot and posts its
// message. A connection sends its messages one at a time, in order; a message in flight is a flow along its
// route, and the rates of all flows in flight are their max-min fair shares, recomputed whenever a flow starts or
// ends. A message arrives its route's latency after its last byte left. The call ends with the last unit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <unordered_map>

#include "tools/sim/engines.h"

namespace loom::sim {
namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();

class ExactEngine {
 public:
  ExactEngine(const CallSetup& setup, const std::vector<RankPlan>& plans, Network& network, const Params& params)
      : setup_(setup), network_(network), params_(params) {
    for (int rank = 0; rank < static_cast<int>(plans.size()); ++rank)
      for (const Lane& lane : plans[rank].lanes) lanes_.push_back({rank, &lane});
  }

  Result run() {
    for (LaneState& lane : lanes_) lane.cursor.start(*lane.lane, SlicesOf{&setup_.slicing});
    for (int l = 0; l < static_cast<int>(lanes_.size()); ++l) tryLane(l, 0);
    while (!events_.empty()) {
      Event event = events_.top();
      events_.pop();
      ++processed_;
      switch (event.kind) {
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
    }
    Result result;
    if (!error_.empty()) {
      result.error = error_;
      return result;
    }
    result.ok = true;
    for (const LaneState& lane : lanes_) {
      if (!lane.cursor.done()) {
        result.ok = false;
        result.error = "the plan deadlocks: rank " + std::to_string(lane.rank) + " waits forever on channel " +
                       std::to_string(lane.lane->channel);
        return result;
      }
    }
    for (const LaneState& lane : lanes_) result.steps += lane.lane->steps.size();
    result.timeUs = end_;
    result.evaluations = processed_;
    return result;
  }

 private:
  struct SlicesOf {
    const Slicing* slicing;
    size_t operator()(const Step& step) const { return slicing->slicesOf(step.count()); }
  };
  struct LaneState {
    int rank;
    const Lane* lane;
    LaneCursor cursor{};
    bool busy = false;
    int inConnection = -1, outConnection = -1;  // of the unit in progress
    double outWire = 0;
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
    enum Kind { kUnitDone, kArrival, kCredit, kNetwork } kind;
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

  // Starts the lane's next unit if it can; otherwise leaves it waiting on what it lacks.
  void tryLane(int l, double now) {
    LaneState& lane = lanes_[l];
    const Slicing& slicing = setup_.slicing;
    while (!lane.cursor.done()) {
      const Step& step = lane.lane->steps[lane.cursor.step()];
      size_t count = step.count(), slice = slicing.sliceElems(count);
      size_t lo = std::min(count, lane.cursor.round() * slice), hi = std::min(count, lo + slice);
      if (lo == hi) {  // this step has no slice in this round
        lane.cursor.next(SlicesOf{&slicing});
        continue;
      }
      bool receives = actionReceives(step.action), sends = actionSends(step.action);
      int in = receives ? connection(step.recvPeer, lane.rank, lane.lane->channel) : -1;
      int out = sends ? connection(lane.rank, step.sendPeer, lane.lane->channel) : -1;
      if (in >= 0) {
        Connection& c = connections_[in];
        if (c.consumed >= c.arrivedFlags.size() || !c.arrivedFlags[c.consumed]) {
          c.waitingReceiver = l;
          return;
        }
      }
      if (out >= 0) {
        Connection& c = connections_[out];
        if (c.wire.size() - c.credits >= static_cast<size_t>(params_.fifoDepth)) {
          c.waitingSender = l;
          return;
        }
      }
      lane.busy = true;
      lane.inConnection = in;
      lane.outConnection = out;
      lane.outWire = slicing.wireBytes(hi - lo, slicing.isLL(count));
      push(Event::kUnitDone,
           now + unitCost(receives || sends, slicing.isLL(count), hi - lo, slicing.elementBytes, params_), l);
      return;
    }
  }

  void unitDone(int l, double now) {
    LaneState& lane = lanes_[l];
    end_ = std::max(end_, now);
    lane.busy = false;
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
    lane.cursor.next(SlicesOf{&setup_.slicing});
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
    reschedule(now);
  }

  void advanceFlows(double now) {
    double elapsed = now - flowClock_;
    if (elapsed > 0)
      for (Flow& flow : flows_)
        if (!std::isinf(flow.rate)) flow.remaining -= flow.rate * 1e3 * elapsed;
    flowClock_ = now;
  }

  // New fair rates for the flows in flight, and an event at the next time one of them ends.
  void reschedule(double now) {
    std::vector<FlowDemand> demands;
    for (const Flow& flow : flows_) demands.push_back({connections_[flow.connection].route, 1});
    network_.fairRates(demands, &rates_);
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
      if (std::isinf(flow.rate) || flow.remaining <= 1e-9 * wire + 1e-9)
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
    reschedule(now);
  }

  const CallSetup& setup_;
  Network& network_;
  const Params& params_;
  std::vector<LaneState> lanes_;
  std::vector<Connection> connections_;
  std::unordered_map<uint64_t, int> connectionIndex_;
  std::vector<Flow> flows_;
  std::vector<double> rates_;
  double flowClock_ = 0;
  size_t networkVersion_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t sequence_ = 0;
  size_t processed_ = 0;
  double end_ = 0;
  std::string error_;
};

}  // namespace

Result runExact(const CallSetup& setup, const std::vector<RankPlan>& plans, Network& network, const Params& params) {
  return ExactEngine(setup, plans, network, params).run();
}

}  // namespace loom::sim
