// The fast engine: the executor's timing at the granularity of runs of alike steps, for thousands of ranks.
//
// Rounds. A lane-phase (one phase of one lane of one rank) runs rounds 0 .. K-1, round k holding slice k of
// every step that has one. Its rounds fall into segments within which the same runs are present (a run of S
// slices drops out after round S-1). Of each segment, the first three rounds and the last are simulated; the
// rounds between take the period measured from the second simulated round to the third (segments of up to four
// rounds are simulated whole). Within a round, a run of m alike steps is described by the times of its first
// and last step, and the steps between are taken to lie on the line between them (a ring's relay steps do, one
// hop apart; across a fat tree's slower hops the line averages the staircase).
//
// Times. A unit (one slice of one step) starts when its lane is free and, if it receives, when its message has
// arrived; it occupies the lane for its cost (unitCost). A message departs when its unit's cost is paid and its
// connection has finished sending the one before, takes its wire bytes over its fair rate, and arrives after its
// route's latency. The fair rate of a connection is its max-min fair share when every connection of the same
// phase index (over all ranks and lanes) sends at once: the set of (source, destination) pairs of a phase is
// its pattern, solved once and cached across phases and calls. Message n of a connection meets receive n.
//
// Solving. The times are the least fixed point of these max-plus equations, found by evaluating simulated
// rounds from a work list (solve() says in which order) until no time moves by more than a part in 1e7. Rings
// converge by a constant factor per lap of the ring; phases in sequence, trees and butterflies in a few passes.
//
// What it leaves out: FIFO credits (a sender waits for a free slot; kExact models them), and the partial
// overlap of flows in time (every flow of a phase is taken to send at once; kExact shares links only between
// transfers in progress). docs/SIMULATION.md compares the two.
#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <tuple>

#include "tools/sim/engines.h"

namespace loom::sim {
namespace {

constexpr double kNever = -std::numeric_limits<double>::infinity();
constexpr size_t kMaxSegments = 16;  // beyond this, segments merge (runs then drop out inside a segment)

struct Unit {  // one lane-phase
  int rank, lane, phase;
  uint32_t firstRun, runCount;
  uint32_t firstItem, itemCount;  // its simulated rounds
  uint64_t schedule;              // a hash of which rounds are simulated: equal for lane-phases that align
  int previous;                   // the lane's previous phase, or -1
};

struct Item {  // one simulated round of a lane-phase
  uint32_t round;
  uint32_t skipped = 0;  // rounds between the item before and this one, taken at `period` each
  double period = 0;
  double end = 0;  // when the lane finishes the round
};

struct FastRun {
  Run run;
  int unit;
  int channel;
  uint32_t departures;                    // index of its (first, last) departure times for its unit's first item
  double latency = 0;                     // of the route to sendPeer
  double tauFull = 0, tauLast = 0;        // wire time of a full slice and of the step's last slice
  double costFull = 0, costLast = 0;      // lane time of a unit
  int slot = -1;                          // sends: the connection's index among its lane-phase's peers
  int firstSender = -1, lastSender = -1;  // receives: the send runs that hold its first and last message
};

// A send run on a connection, for the lookup of message departures: sorted by (connection, first ordinal).
struct SendEntry {
  uint64_t connection;
  uint32_t ordinal;
  int run;
  bool operator<(const SendEntry& other) const {
    return connection != other.connection ? connection < other.connection : ordinal < other.ordinal;
  }
};

// The rounds to simulate of a lane-phase whose runs have these slice counts: per segment between two slice
// counts, its first three rounds and its last.
std::vector<Item> scheduleOf(std::vector<uint32_t> slices) {
  std::sort(slices.begin(), slices.end());
  slices.erase(std::unique(slices.begin(), slices.end()), slices.end());
  if (slices.size() > kMaxSegments) {  // keep evenly spaced boundaries, always the last
    std::vector<uint32_t> kept;
    for (size_t i = 1; i <= kMaxSegments; ++i) kept.push_back(slices[i * slices.size() / kMaxSegments - 1]);
    slices = kept;
  }
  std::vector<Item> items;
  uint32_t low = 0;
  for (uint32_t high : slices) {
    for (uint32_t k = low; k < high && k < low + 3; ++k) items.push_back({k});
    if (high > low + 3) items.push_back({high - 1, high - 1 - (low + 3)});
    low = high;
  }
  return items;
}

class FastEngine {
 public:
  FastEngine(const CallSetup& setup, const ShapeSet& shapes, Network& network, FairShareCache& cache,
             const Params& params)
      : setup_(setup), shapes_(shapes), network_(network), cache_(cache), params_(params) {}

  Result run() {
    Result result;
    layOut();
    if (!computeRates(&result.error)) return result;
    linkConsumers();
    solve();
    result.ok = true;
    result.steps = shapes_.steps;
    result.runs = runs_.size();
    result.symmetry = shapes_.symmetry;
    result.evaluations = evaluations_;
    result.converged = converged_;
    for (double end : end_) result.timeUs = std::max(result.timeUs, end);
    return result;
  }

 private:
  void layOut() {
    const Slicing& slicing = setup_.slicing;
    uint32_t departures = 0;
    for (int rank = 0; rank < static_cast<int>(shapes_.ranks.size()); ++rank) {
      const RankShape& shape = shapes_.ranks[rank];
      for (int l = 0; l < static_cast<int>(shape.lanes.size()); ++l) {
        const LaneShape& lane = shape.lanes[l];
        for (int p = 0; p < static_cast<int>(lane.phases.size()); ++p) {
          const PhaseShape& phase = lane.phases[p];
          int u = static_cast<int>(units_.size());
          std::vector<uint32_t> slices;
          for (uint32_t i = 0; i < phase.runCount; ++i) slices.push_back(lane.runs[phase.firstRun + i].slices);
          std::vector<Item> schedule = scheduleOf(std::move(slices));
          uint64_t signature = schedule.size();
          for (const Item& item : schedule) signature = mixHash(signature ^ item.round);
          units_.push_back({rank, l, p, static_cast<uint32_t>(runs_.size()), phase.runCount,
                            static_cast<uint32_t>(items_.size()), static_cast<uint32_t>(schedule.size()), signature,
                            p == 0 ? -1 : u - 1});
          for (size_t s = 0; s < schedule.size(); ++s) itemUnit_.push_back(u);
          items_.insert(items_.end(), schedule.begin(), schedule.end());
          peerStart_.push_back(static_cast<uint32_t>(peers_.size()));
          for (uint32_t i = 0; i < phase.runCount; ++i) {
            const Run& run = lane.runs[phase.firstRun + i];
            FastRun fast{run, u, lane.channel, departures};
            departures += 2 * static_cast<uint32_t>(schedule.size());
            if (run.flags & kSends) {
              auto begin = peers_.begin() + peerStart_.back();
              fast.slot = static_cast<int>(std::find(begin, peers_.end(), run.sendPeer) - begin);
              if (begin + fast.slot == peers_.end()) peers_.push_back(run.sendPeer);
            }
            size_t slice = run.ll ? slicing.llSliceElems : slicing.simpleSliceElems;
            bool communicates = (run.flags & (kReceives | kSends)) != 0;
            fast.costFull =
                unitCost(communicates, run.ll, std::min<size_t>(slice, run.elements), slicing.elementBytes, params_);
            fast.costLast = unitCost(communicates, run.ll, lastSliceOf(run), slicing.elementBytes, params_);
            if (run.flags & kSends)
              sends_.push_back(
                  {connectionKey(rank, run.sendPeer, lane.channel), run.outOrdinal, static_cast<int>(runs_.size())});
            runs_.push_back(fast);
          }
        }
      }
    }
    peerStart_.push_back(static_cast<uint32_t>(peers_.size()));
    std::sort(sends_.begin(), sends_.end());
    end_.assign(units_.size(), 0);
    departures_.assign(departures, 0);
  }

  size_t lastSliceOf(const Run& run) const {
    size_t slice = run.ll ? setup_.slicing.llSliceElems : setup_.slicing.simpleSliceElems;
    return run.elements > (run.slices - 1) * slice ? run.elements - (run.slices - 1) * slice : 1;
  }

  int nodeOf(int rank) const { return network_.topology().rankNode(rank); }

  // Fair rates per phase index, and from them every send run's wire times and latency.
  bool computeRates(std::string* error) {
    const Slicing& slicing = setup_.slicing;
    std::vector<std::vector<int>> unitsOfPhase;
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      if (units_[u].phase >= static_cast<int>(unitsOfPhase.size())) unitsOfPhase.resize(units_[u].phase + 1);
      unitsOfPhase[units_[u].phase].push_back(u);
    }
    auto byEnds = [](const auto& a, const auto& b) { return a.from != b.from ? a.from < b.from : a.to < b.to; };
    for (const std::vector<int>& members : unitsOfPhase) {
      // One flow per connection (a lane-phase's distinct peers), identical flows merged.
      std::vector<FairShareCache::Flow> pattern;
      for (int u : members) {
        const Unit& unit = units_[u];
        double multiplicity = shapes_.ranks[unit.rank].lanes[unit.lane].multiplicity;
        for (uint32_t p = peerStart_[u]; p < peerStart_[u + 1]; ++p) {
          if (!network_.rankRoute(unit.rank, peers_[p]).reachable) {
            *error = "rank " + std::to_string(unit.rank) + " sends to rank " + std::to_string(peers_[p]) +
                     ", which the topology gives it no route to";
            return false;
          }
          pattern.push_back({nodeOf(unit.rank), nodeOf(peers_[p]), multiplicity});
        }
      }
      std::sort(pattern.begin(), pattern.end(), byEnds);
      std::vector<FairShareCache::Flow> merged;
      for (const auto& flow : pattern) {
        if (!merged.empty() && merged.back().from == flow.from && merged.back().to == flow.to)
          merged.back().multiplicity += flow.multiplicity;
        else
          merged.push_back(flow);
      }
      if (merged.empty()) continue;
      const std::vector<double>& rates = cache_.rates(merged, network_);
      for (int u : members) {
        const Unit& unit = units_[u];
        for (uint32_t i = 0; i < unit.runCount; ++i) {
          FastRun& fast = runs_[unit.firstRun + i];
          if (!(fast.run.flags & kSends)) continue;
          FairShareCache::Flow key{nodeOf(unit.rank), nodeOf(fast.run.sendPeer), 0};
          double rate = rates[std::lower_bound(merged.begin(), merged.end(), key, byEnds) - merged.begin()];
          const Run& run = fast.run;
          size_t slice = run.ll ? slicing.llSliceElems : slicing.simpleSliceElems;
          double perUs = rate * 1e3;  // GB/s = 1e3 bytes per microsecond
          fast.tauFull =
              std::isinf(rate) ? 0 : slicing.wireBytes(std::min<size_t>(slice, run.elements), run.ll) / perUs;
          fast.tauLast = std::isinf(rate) ? 0 : slicing.wireBytes(lastSliceOf(run), run.ll) / perUs;
          fast.latency = network_.route(key.from, key.to).latencyUs;
        }
      }
    }
    return true;
  }

  // Calls visit(run) for the send runs of `connection` that hold ordinals [first, first + count).
  template <typename Visit>
  void forSenders(uint64_t connection, uint32_t first, uint32_t count, Visit visit) const {
    auto at = std::upper_bound(sends_.begin(), sends_.end(), SendEntry{connection, first, 0});
    if (at != sends_.begin()) --at;
    for (; at != sends_.end() && at->connection == connection && at->ordinal < first + count; ++at)
      if (at->ordinal + runs_[at->run].run.steps > first) visit(at->run);
  }

  // Which lane-phases read each lane-phase's messages, and which send runs each receive run reads.
  void linkConsumers() {
    std::vector<std::pair<int, int>> edges;  // (sender's unit, receiver's unit)
    for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
      const Unit& unit = units_[u];
      for (uint32_t i = 0; i < unit.runCount; ++i) {
        FastRun& fast = runs_[unit.firstRun + i];
        if (!(fast.run.flags & kReceives)) continue;
        uint64_t connection = connectionKey(fast.run.recvPeer, unit.rank, fast.channel);
        uint32_t last = fast.run.inOrdinal + fast.run.steps - 1;
        forSenders(connection, fast.run.inOrdinal, fast.run.steps, [&](int sender) {
          edges.push_back({runs_[sender].unit, u});
        });
        forSenders(connection, fast.run.inOrdinal, 1, [&](int sender) { fast.firstSender = sender; });
        forSenders(connection, last, 1, [&](int sender) { fast.lastSender = sender; });
      }
    }
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    consumerStart_.assign(units_.size() + 1, 0);
    for (const auto& edge : edges) ++consumerStart_[edge.first + 1];
    for (size_t u = 0; u < units_.size(); ++u) consumerStart_[u + 1] += consumerStart_[u];
    consumers_.resize(edges.size());
    for (size_t e = 0; e < edges.size(); ++e) consumers_[e] = edges[e].second;  // edges are sorted by sender
  }

  double& departure(const FastRun& fast, uint32_t item, int end) {
    return departures_[fast.departures + 2 * item + end];
  }

  // When message `ordinal` of its connection, which send run `sender` holds, arrives in round k, and when the
  // sender's lane started round k (*sent); kNever when no run holds it.
  double arrival(int sender, uint32_t ordinal, uint32_t k, double* roundBegan) {
    *roundBegan = kNever;
    if (sender < 0) return kNever;
    const FastRun& fast = runs_[sender];
    if (k >= fast.run.slices) return kNever;
    const Unit& unit = units_[fast.unit];
    // The last simulated round at or before k; rounds after it (up to the next) go at the next one's period.
    const Item* first = &items_[unit.firstItem];
    const Item* found = std::upper_bound(first, first + unit.itemCount, k,
                                         [](uint32_t round, const Item& item) { return round < item.round; }) -
                        1;
    uint32_t s = static_cast<uint32_t>(found - first);
    double shift = found->round < k ? (k - found->round) * found[1].period : 0;
    *roundBegan = roundStart(fast.unit, s) + shift;
    double start = departure(fast, s, 0), end = departure(fast, s, 1);
    uint32_t offset = ordinal - fast.run.outOrdinal;
    double at = fast.run.steps > 1 ? start + (end - start) * offset / (fast.run.steps - 1) : start;
    double tau = k + 1 == fast.run.slices ? fast.tauLast : fast.tauFull;
    return at + shift + tau + fast.latency;
  }

  // When simulated round s of lane-phase u may start: the end of the round before and of the rounds skipped
  // since, or of the lane's previous phase.
  double roundStart(int u, uint32_t s) const {
    const Unit& unit = units_[u];
    if (s == 0) return unit.previous >= 0 ? end_[unit.previous] : 0;
    const Item& item = items_[unit.firstItem + s];
    return items_[unit.firstItem + s - 1].end + item.skipped * item.period;
  }

  // Evaluates simulated round s of lane-phase u; true when any of its departures, its end, the period of the
  // rounds skipped after it, or the lane-phase's end moved.
  //
  // The period of skipped rounds is what one round takes once the rounds repeat. The length of the round just
  // simulated measures it, unless that round waited for a sender that started late (the previous phase ended
  // later on some ranks): such a wait happens once, and taken as periodic it would grow from phase to phase.
  // So the measure is capped by the round's length had every sender started its round with this one (its
  // arrivals taken relative to their senders' round starts), which is the period of a cycle of ranks waiting
  // on each other, and an upper bound otherwise; and it is at least the lane's own work in a round.
  bool evaluate(int u, uint32_t s) {
    const Unit& unit = units_[u];
    Item& item = items_[unit.firstItem + s];
    uint32_t k = item.round;
    double laneFree = roundStart(u, s);
    // The connections this lane-phase sends on: last departure and its wire time, from the round before.
    uint32_t peers = peerStart_[u + 1] - peerStart_[u];
    spacing_.assign(peers, {kNever, 0});
    if (s > 0) {
      uint32_t before = items_[unit.firstItem + s - 1].round;
      double shift = item.skipped * item.period;
      for (uint32_t i = 0; i < unit.runCount; ++i) {
        FastRun& fast = runs_[unit.firstRun + i];
        if (!(fast.run.flags & kSends) || before >= fast.run.slices) continue;
        spacing_[fast.slot] = {departure(fast, s - 1, 1) + shift,
                               before + 1 == fast.run.slices ? fast.tauLast : fast.tauFull};
      }
    }
    bool moved = false;
    auto update = [&](double& slot, double value) {
      if (std::abs(value - slot) > 1e-7 * std::max(1.0, std::abs(slot))) moved = true;
      slot = value;
    };
    // The round relative to its start with every sender in step; the lane's own work, and each connection's.
    double synchronized = 0, work = 0;
    busy_.assign(peers, 0);
    for (uint32_t i = 0; i < unit.runCount; ++i) {
      FastRun& fast = runs_[unit.firstRun + i];
      const Run& run = fast.run;
      if (k >= run.slices) continue;
      bool lastSlice = k + 1 == run.slices;
      double cost = lastSlice ? fast.costLast : fast.costFull;
      double tau = lastSlice ? fast.tauLast : fast.tauFull;
      double steps = run.steps;
      double firstArrival = kNever, lastArrival = kNever, firstRelative = kNever, lastRelative = kNever;
      if (run.flags & kReceives) {
        double began = kNever;
        firstArrival = arrival(fast.firstSender, run.inOrdinal, k, &began);
        firstRelative = firstArrival - began;
        lastArrival = firstArrival;
        lastRelative = firstRelative;
        if (run.steps > 1) {
          lastArrival = arrival(fast.lastSender, run.inOrdinal + run.steps - 1, k, &began);
          lastRelative = lastArrival - began;
        }
      }
      // Step i starts at max(the step before + cost, arrival i); with arrivals on a line, the last step's start
      // is the largest of these three.
      double firstStart = std::max(laneFree, firstArrival);
      double lastStart = firstStart;
      double relativeFirst = std::max(synchronized, firstRelative), relativeLast = relativeFirst;
      if (run.steps > 1) {
        lastStart = std::max({firstStart + (steps - 1) * cost, lastArrival, firstArrival + (steps - 1) * cost});
        relativeLast = std::max({relativeFirst + (steps - 1) * cost, lastRelative, firstRelative + (steps - 1) * cost});
      }
      if (run.flags & kSends) {
        Spacing& connection = spacing_[fast.slot];
        double first = std::max(firstStart + cost, connection.departed + connection.tau);
        double last = run.steps > 1 ? std::max(lastStart + cost, first + (steps - 1) * tau) : first;
        connection = {last, tau};
        update(departure(fast, s, 0), first);
        update(departure(fast, s, 1), last);
        busy_[fast.slot] += steps * tau;
      }
      laneFree = lastStart + cost;
      synchronized = relativeLast + cost;
      work += steps * cost;
    }
    update(item.end, laneFree);
    if (s > 0 && s + 1 < unit.itemCount && items_[unit.firstItem + s + 1].skipped > 0) {
      double measured = item.end - items_[unit.firstItem + s - 1].end;
      for (double connection : busy_) work = std::max(work, connection);
      update(items_[unit.firstItem + s + 1].period, std::max(work, std::min(measured, synchronized)));
    }
    if (s + 1 == unit.itemCount) update(end_[u], laneFree);
    return moved;
  }

  // Evaluates simulated rounds from a work list. A round enters the list once the round before it in its lane
  // has been evaluated (round 0 of a lane's first phase at once), so the list follows time. The list is ordered
  // by phase index, then simulated round, then start, then the order rounds entered it: the first entries as
  // given, later ones latest first, so that a change runs along a chain of dependent rounds at once, whichever
  // way the chain goes (the two directions of a bidirectional ring). A round whose results moved puts back
  // the rounds that read them: its lane's next round (or next phase), the same round of its receivers, and
  // every round of a receiver whose rounds are simulated on another schedule.
  void solve() {
    using Entry = std::tuple<int, uint32_t, double, int64_t, uint32_t>;  // (phase, round, start, order, item)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
    std::vector<char> queued(items_.size(), 0), seen(items_.size(), 0);
    int64_t sequence = 0;
    bool initial = true;
    auto enqueue = [&](int u, uint32_t s) {
      uint32_t item = units_[u].firstItem + s;
      if (queued[item]) return;
      queued[item] = 1;
      ++sequence;
      queue.push({units_[u].phase, s, roundStart(u, s), initial ? sequence : -sequence, item});
    };
    for (int u = 0; u < static_cast<int>(units_.size()); ++u)
      if (units_[u].previous < 0 && units_[u].itemCount > 0) enqueue(u, 0);
    initial = false;
    size_t limit = 1000 * items_.size() + 1000000;
    while (!queue.empty()) {
      uint32_t item = std::get<4>(queue.top());
      queue.pop();
      queued[item] = 0;
      int u = itemUnit_[item];
      const Unit& unit = units_[u];
      uint32_t s = item - unit.firstItem;
      ++evaluations_;
      bool moved = evaluate(u, s);
      bool first = !seen[item];
      seen[item] = 1;
      if (!moved && !first) continue;
      if (s + 1 < unit.itemCount) enqueue(u, s + 1);
      if (s + 1 == unit.itemCount && u + 1 < static_cast<int>(units_.size()) && units_[u + 1].previous == u)
        enqueue(u + 1, 0);
      if (!moved) continue;
      for (int e = consumerStart_[u]; e < consumerStart_[u + 1]; ++e) {
        int consumer = consumers_[e];
        const Unit& reader = units_[consumer];
        if (reader.schedule == unit.schedule && reader.itemCount == unit.itemCount) {
          if (seen[reader.firstItem + s]) enqueue(consumer, s);
          continue;
        }
        for (uint32_t t = 0; t < reader.itemCount; ++t)
          if (seen[reader.firstItem + t]) enqueue(consumer, t);
      }
      if (evaluations_ > limit) {
        converged_ = false;
        return;
      }
    }
  }

  const CallSetup& setup_;
  const ShapeSet& shapes_;
  Network& network_;
  FairShareCache& cache_;
  const Params& params_;
  std::vector<Unit> units_;
  std::vector<Item> items_;
  std::vector<int> itemUnit_;
  std::vector<FastRun> runs_;
  std::vector<SendEntry> sends_;
  std::vector<uint32_t> peerStart_;  // per unit: its peers (by slot) are peers_[peerStart_[u] ..]
  std::vector<int> peers_;
  struct Spacing {
    double departed, tau;
  };
  std::vector<Spacing> spacing_;
  std::vector<double> busy_;
  std::vector<int> consumerStart_, consumers_;
  std::vector<double> end_, departures_;
  size_t evaluations_ = 0;
  bool converged_ = true;
};

}  // namespace

const std::vector<double>& FairShareCache::rates(const std::vector<Flow>& pattern, Network& network) {
  uint64_t hash = pattern.size();
  for (const Flow& flow : pattern)
    hash = mixHash(hash ^ (static_cast<uint64_t>(flow.from) << 32 | static_cast<uint32_t>(flow.to)) ^
                   static_cast<uint64_t>(flow.multiplicity * 1024));
  std::vector<Entry>& bucket = entries_[hash];
  for (const Entry& entry : bucket)
    if (entry.pattern == pattern) return entry.rates;
  std::vector<FlowDemand> demands;
  demands.reserve(pattern.size());
  for (const Flow& flow : pattern) demands.push_back({&network.route(flow.from, flow.to), flow.multiplicity});
  Entry entry{pattern, {}};
  network.fairRates(demands, &entry.rates);
  bucket.push_back(std::move(entry));
  return bucket.back().rates;
}

Result runFast(const CallSetup& setup, const ShapeSet& shapes, Network& network, FairShareCache& cache,
               const Params& params) {
  return FastEngine(setup, shapes, network, cache, params).run();
}

}  // namespace loom::sim
