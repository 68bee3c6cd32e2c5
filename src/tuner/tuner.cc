// The tuner's cost model and choice (tuner.h).
#include "src/tuner/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

#include "src/base/log.h"
#include "src/base/params.h"
#include "src/exec/lane_walker.h"
#include "src/topology/network.h"
#include "src/tuner/event_timer.h"
#include "transports/fifo.h"

namespace loom {
namespace {

// How a message between two ranks travels, in the eager chain below (host ranks, and GPU calls beyond the event
// timer's work limit).
struct Hop {
  bool byCpu = true;      // the executors copy it (shared memory); else a NIC or NVLink moves it
  double latencyUs = 0;   // per message
  double bandwidth = 0;   // GB/s available to this rank's flow (shared by the NIC's ranks), when !byCpu
  // Between GPU ranks under the GPU executor: the route's resources (Network: a direction of a link, or a group of
  // twin links a transfer is striped over), each a server that messages take in turns, busy for the bytes it
  // carries over its capacity.
  const NetRoute* route = nullptr;
};

// Times every rank's plan of one call, as tuner.h describes.
class PlanTimer {
 public:
  PlanTimer(const TuneContext& context, const HostCosts& costs, const Slicing& slicing, size_t elementBytes)
      : context_(context),
        costs_(costs),
        rule_(SliceRule::of(elementBytes, slicing.llThresholdBytes, context.llSliceBytes, slicing.simpleSliceBytes,
                            context.forcedProtocol)),
        elementBytes_(elementBytes),
        n_(context.nranks) {
    const Topology* topo = context.topology;
    placed_ = topo != nullptr && topo->rankCount() == n_;
    for (int r = 0; r < n_; ++r) hostOf_.push_back(static_cast<int>(context.hostOf.size()) == n_ ? context.hostOf[r] : 0);
    // Ranks beyond their host's cores share them.
    std::map<int, int> ranksOnHost;
    for (int host : hostOf_) ranksOnHost[host]++;
    for (int r = 0; r < n_; ++r) {
      double cores = 0;
      if (placed_) cores = static_cast<double>(intAttribute(topo->node(topo->hostNode(topo->rankHost(r))).attrs, "cores", 0));
      if (cores <= 0 || (placed_ && topo->node(topo->rankNode(r)).kind == NodeKind::kGpu))
        cores = ranksOnHost[hostOf_[r]];  // GPU ranks do not share the host's cores
      slowdown_.push_back(std::max(1.0, ranksOnHost[hostOf_[r]] / cores));
      offCore_.push_back(std::max(0.0, 1.0 - cores / ranksOnHost[hostOf_[r]]));
      onDevice_.push_back(placed_ && topo->node(topo->rankNode(r)).kind == NodeKind::kGpu);
      gpuExecutor_.push_back(onDevice_.back() && context.deviceExecutor);
    }
    // Units per step: enough slices to show pipelining, few enough that large jobs stay cheap to time. A unit
    // pays one message's latency for all its slices, so too few of them favour plans of few large steps: at 64
    // per step a 16-rank AllReduce of 256 MiB cut into pipelined pieces was predicted slower than in one piece.
    maxUnits_ = n_ <= 16 ? 128 : n_ <= 128 ? 8 : 2;
  }

  // The call's buffers on a rank (input, output, scratch), for the copy rate.
  void setFootprint(double bytes) {
    copyGBps_ = bytes <= costs_.cacheBytes ? costs_.cachedCopyGBps : costs_.copyGBps;
  }

  // The time of a call, or with calls > 1 the time per call of that many issued back to back (every rank
  // starts its next call when it has finished the one before, as its executor does): so a call that does not
  // need every rank to finish together, like a chain's Broadcast, overlaps the next one.
  double time(const std::vector<RankPlan>& plans, int nChannels, int calls) {
    // GPU ranks under the GPU executor: the event timer, links shared by fair shares as loom-sim's exact engine
    // shares them (the same function), where the call is small enough to take every slice as an event; larger
    // ones below, messages taking turns on each link.
    if (placed_ && std::all_of(gpuExecutor_.begin(), gpuExecutor_.end(), [](bool gpu) { return gpu; }) &&
        eventWork(plans, rule_, nChannels) <= kEventWorkLimit) {
      EventCosts costs;
      costs.llOverheadUs = costs_.deviceLlSliceUs;
      costs.simpleOverheadUs = costs_.deviceSimpleSliceUs;
      costs.copyGBps = costs_.deviceCopyGBps;
      costs.fifoDepth = context_.fifoDepth;
      costs.callUs = costs_.callUs;
      EventTiming timing = timeByEvents(plans, nChannels, network(), rule_, costs, calls);
      if (timing.ok) return timing.timeUs;
    }
    struct LaneState {
      LaneCursor cursor;
      double ready = 0;
    };
    linkFree_.clear();
    std::vector<std::vector<LaneState>> lanes(n_);
    std::vector<double> busy(n_, 0.0);
    std::vector<int> callOf(n_, 0);
    std::vector<double> firstDone(n_, 0.0);  // when each rank finished its first call
    auto startCall = [&](int r) {
      busy[r] += costs_.callUs;
      lanes[r].clear();
      for (const Lane& lane : plans[r].lanes) {
        lanes[r].push_back({});
        lanes[r].back().cursor.start(lane, slicesOf());
        lanes[r].back().ready = busy[r];
      }
    };
    for (int r = 0; r < n_; ++r) startCall(r);
    // Arrival times of the messages in flight, per (sender, receiver, channel).
    std::map<std::tuple<int, int, int>, std::deque<double>> inFlight;
    ReadyRanks ready(n_);
    for (int r; ready.pop(&r);) {
      for (size_t l = 0; l < lanes[r].size(); ++l) {
        LaneState& state = lanes[r][l];
        const Lane& lane = plans[r].lanes[l];
        while (!state.cursor.done()) {
          const Step& step = lane.steps[state.cursor.step()];
          double bytes = unitBytes(step, state.cursor.round());
          if (bytes <= 0) {  // past this step's last slice: nothing moves (as in the executors)
            state.cursor.next(slicesOf());
            continue;
          }
          // A host rank's executor is one thread: its lanes take turns. A GPU rank runs each lane on a CTA of
          // its own: they proceed side by side.
          double start = gpuExecutor_[r] ? state.ready : std::max(busy[r], state.ready);
          if (actionReceives(step.action)) {
            std::deque<double>& in = inFlight[{step.recvPeer, r, lane.channel}];
            if (in.empty()) break;
            // Where a host has more ranks than cores, a wait finds the sender off its core in the share of waits
            // 1 - cores/ranks, and then costs a switch unless another lane of this rank, whose peer may be on a
            // core, has work: the chance that every active lane waits falls with their number.
            int active = 0;
            for (const LaneState& other : lanes[r]) active += !other.cursor.done();
            double waits = std::pow(offCore_[r], active) * slicesIn(step, state.cursor.round());
            start = std::max(start, in.front() + costs_.switchUs * waits);
            in.pop_front();
          }
          double end = start + unitCost(step, bytes, state.cursor.round(), r) * slowdown_[r];
          busy[r] = gpuExecutor_[r] ? std::max(busy[r], end) : end;
          state.ready = end;
          if (actionSends(step.action)) {
            const Hop& hop = hopBetween(r, step.sendPeer);
            double arrival = end + hop.latencyUs + (hop.byCpu ? 0.0 : bytes / (hop.bandwidth * 1e3));
            if (hop.route != nullptr) {
              double moving = end;
              for (const ResourceUse& use : hop.route->uses) moving = std::max(moving, linkFree_[use.resource]);
              for (const ResourceUse& use : hop.route->uses)
                linkFree_[use.resource] = moving + bytes * use.weight / (network_->capacity(use.resource) * 1e3);
              arrival = moving + bytes / (hop.bandwidth * 1e3) + hop.latencyUs;
            }
            inFlight[{r, step.sendPeer, lane.channel}].push_back(arrival);
            ready.wake(step.sendPeer);
          }
          state.cursor.next(slicesOf());
        }
      }
      bool finished = std::all_of(lanes[r].begin(), lanes[r].end(), [](const LaneState& l) { return l.cursor.done(); });
      if (finished && callOf[r] + 1 < calls) {
        if (callOf[r]++ == 0) firstDone[r] = busy[r];
        startCall(r);
        ready.wake(r);
      }
    }
    double first = 0, last = 0;
    for (int r = 0; r < n_; ++r) {
      first = std::max(first, calls > 1 ? firstDone[r] : busy[r]);
      last = std::max(last, busy[r]);
    }
    return calls > 1 ? (last - first) / (calls - 1) : last;
  }

 private:
  // The executors' own rule (lane_walker.h): the protocol of a step and its slices.
  bool isLL(const Step& step) const { return rule_.protocolFor(step.count()) == Protocol::kLL; }
  size_t realSlices(const Step& step) const { return rule_.slicesOf(step.count()); }

  struct SlicesOf {
    const PlanTimer* timer;
    size_t operator()(const Step& step) const { return std::min(timer->realSlices(step), timer->maxUnits_); }
  };
  SlicesOf slicesOf() const { return SlicesOf{this}; }

  double unitBytes(const Step& step, size_t round) const {
    size_t units = std::min(realSlices(step), maxUnits_);
    if (units == 0 || round >= units) return 0;
    return static_cast<double>(step.count() * elementBytes_) / static_cast<double>(units);
  }

  // How many slices unit `round` of a step stands for.
  double slicesIn(const Step& step, size_t round) const {
    size_t slices = realSlices(step), units = std::min(slices, maxUnits_);
    return units == 0 ? 0.0 : static_cast<double>((round + 1) * slices / units - round * slices / units);
  }

  // A unit stands for one slice or more (at most maxUnits_ per step): it pays the overhead of each.
  double unitCost(const Step& step, double bytes, size_t round, int rank) const {
    if (bytes <= 0) return 0;
    double slicesInUnit = slicesIn(step, round);
    bool communicates = actionSends(step.action) || actionReceives(step.action);
    const bool onDevice = onDevice_[rank];
    // The GPU executor's message: the protocol's overhead; its bytes cross the route (hopBetween), not the rank's
    // memory.
    if (gpuExecutor_[rank] && communicates)
      return slicesInUnit * (isLL(step) ? costs_.deviceLlSliceUs : costs_.deviceSimpleSliceUs);
    if (gpuExecutor_[rank]) return bytes * memoryFactor(step.action) / (costs_.deviceCopyGBps * 1e3);
    double overhead = slicesInUnit *
                      (!communicates ? costs_.localSliceUs : isLL(step) ? costs_.llSliceUs : costs_.simpleSliceUs);
    double factor = communicates && isLL(step) ? memoryFactor(step.action) * costs_.llCopyFactor
                    : step.action == Action::kSend && step.src.buffer == Buffer::kInput ? costs_.inputSendFactor
                                                                                         : memoryFactor(step.action);
    return overhead + bytes * factor / ((onDevice ? costs_.deviceCopyGBps : copyGBps_) * 1e3);
  }

  Network& network() {
    if (!network_) {
      double efficiency[kLinkKinds];
      for (int kind = 0; kind < kLinkKinds; ++kind) efficiency[kind] = linkShare(costs_, static_cast<LinkKind>(kind));
      network_.emplace(*context_.topology, efficiency);
    }
    return *network_;
  }

  const Hop& hopBetween(int from, int to) {
    auto [it, added] = hops_.try_emplace({from, to});
    if (!added) return it->second;
    Hop& hop = it->second;
    hop.latencyUs = costs_.shmLatencyUs;
    const bool devices = placed_ && gpuExecutor_[from] && gpuExecutor_[to];
    if (!placed_ || (hostOf_[from] == hostOf_[to] && !devices)) return hop;
    const Topology& topo = *context_.topology;
    PathInfo path = topo.path(from, to);
    if (!path.reachable || path.slowest == LinkKind::kSharedMemory || path.slowest == LinkKind::kSmp) return hop;
    if (devices) {
      // The message crosses every link of its route, and each link (or group of twins) carries the messages of
      // the call that cross it one after another at its payload rate: a GPU's own links, a PCIe switch's uplink,
      // a torus's middle hops and a fat tree's spines are shared alike, as loom-sim shares them.
      hop.route = &network().rankRoute(from, to);
      hop.byCpu = false;
      hop.latencyUs = path.latency;
      hop.bandwidth = hop.route->soloRate;
      return hop;
    }
    // The ranks of this host that leave it through the same NIC share its bandwidth.
    int egress = topo.egressOf(topo.rankNode(from)), sharing = 0;
    for (int r = 0; r < n_; ++r)
      if (hostOf_[r] == hostOf_[from] && topo.egressOf(topo.rankNode(r)) == egress) ++sharing;
    hop.byCpu = false;
    hop.latencyUs = path.latency;
    hop.bandwidth = path.bandwidth / std::max(1, sharing);
    return hop;
  }

  const TuneContext& context_;
  const HostCosts& costs_;
  std::optional<Network> network_;  // the routes of GPU ranks' messages, built on the first
  std::map<int, double> linkFree_;  // per resource of network_: when it is next free
  SliceRule rule_;
  size_t elementBytes_;
  int n_;
  bool placed_ = false;
  std::vector<int> hostOf_;
  std::vector<double> slowdown_;
  std::vector<double> offCore_;  // per rank: the share of waits that find a peer of its host off its core
  std::vector<bool> onDevice_;    // per rank: a GPU rank, whose copies run at the device's rate
  std::vector<bool> gpuExecutor_; // ... whose calls the GPU executor runs (TuneContext::deviceExecutor)
  size_t maxUnits_ = 64;
  double copyGBps_ = 11.0;
  std::map<std::pair<int, int>, Hop> hops_;
};

constexpr size_t kMinChunkBytes = 16384;  // smaller Simple chunks cost more in overhead than they pipeline

// The element size a call of `bytes` is estimated with: plans depend on counts, costs on bytes, so 4-byte
// elements (1-byte ones below 4 bytes).
size_t estimateElementBytes(size_t bytes) { return bytes >= 4 ? 4 : 1; }

std::string sizeText(size_t bytes) {
  char text[32];
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0)
    std::snprintf(text, sizeof(text), "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(text, sizeof(text), "%zu KiB", bytes >> 10);
  else
    std::snprintf(text, sizeof(text), "%zu B", bytes);
  return text;
}

}  // namespace

double linkShare(const HostCosts& costs, LinkKind kind) {
  switch (kind) {
    case LinkKind::kNvLink:
      return costs.nvlinkShare;
    case LinkKind::kPcie:
      return costs.pcieShare;
    case LinkKind::kNetwork:
      return costs.networkShare;
    default:
      return 1.0;
  }
}

int forcedProtocolSetting() {
  const std::string proto = params::proto();
  return proto == "LL" ? static_cast<int>(Protocol::kLL) : proto == "Simple" ? static_cast<int>(Protocol::kSimple) : -1;
}

bool isGpuContext(const TuneContext& context) {
  const Topology* topo = context.topology;
  if (topo == nullptr || context.nranks < 1 || topo->rankCount() < context.nranks) return false;
  for (int r = 0; r < context.nranks; ++r)
    if (topo->rankNode(r) < 0 || topo->node(topo->rankNode(r)).kind != NodeKind::kGpu) return false;
  return true;
}

TuneContext contextFor(const Topology& topo, int nranks, int channels) {
  TuneContext context;
  context.topology = &topo;
  context.nranks = nranks;
  for (int r = 0; r < nranks; ++r) context.hostOf.push_back(topo.rankHost(r));
  const bool allGpus = isGpuContext(context);
  const int64_t slot = allGpus ? params::cudaSlotBytes() : params::simpleSlotBytes();
  const FifoShape shape{static_cast<int>(params::fifoDepth()), static_cast<size_t>(slot) / 64 * 64,
                        static_cast<size_t>(params::llSlotBytes()) / 64 * 64};
  context.nChannels = channels > 0 ? channels : static_cast<int>(allGpus ? params::cudaNChannels() : params::nChannels());
  context.forcedProtocol = forcedProtocolSetting();
  context.llThresholdBytes = static_cast<size_t>(params::llThreshold());
  context.forcedChunkBytes = static_cast<size_t>(params::chunkBytes());
  context.fifoDepth = shape.depth;
  context.llSliceBytes = fifoPayloadBytes(shape, Protocol::kLL);
  context.simpleSliceBytes = fifoPayloadBytes(shape, Protocol::kSimple);
  context.deviceExecutor = allGpus;
  return context;
}

bool tunable(Collective collective) {
  return collective != Collective::kAllToAllv && collective != Collective::kSendRecv &&
         collective != Collective::kBarrier;
}

Slicing defaultSlicing(const TuneContext& context) {
  Slicing slicing{context.llThresholdBytes, context.simpleSliceBytes};
  if (context.forcedChunkBytes > 0) slicing.simpleSliceBytes = std::min(context.forcedChunkBytes, context.simpleSliceBytes);
  return slicing;
}

double estimateCall(const TuneContext& context, const HostCosts& costs, Collective collective, size_t count,
                    size_t elementBytes, int root, const std::string& algorithm, int nChannels,
                    const Slicing* slicing, int calls) {
  std::vector<RankPlan> plans(context.nranks);
  for (int r = 0; r < context.nranks; ++r) {
    CollArgs args;
    args.collective = collective;
    args.nranks = context.nranks;
    args.rank = r;
    args.root = root;
    args.count = count;
    args.nChannels = nChannels;
    args.torusDimCount = context.torusDimCount;
    std::copy(context.torusDims, context.torusDims + context.torusDimCount, args.torusDims);
    args.hostOf = context.hostOf;
    if (!buildPlan(args, algorithm, &plans[r])) return -1;
  }
  PlanTimer timer(context, costs, slicing ? *slicing : defaultSlicing(context), elementBytes);
  const RankPlan& first = plans.front();
  timer.setFootprint(static_cast<double>(first.inputCount + first.outputCount + first.scratchCount) * elementBytes);
  return timer.time(plans, nChannels, std::max(1, calls));
}

void Tuner::configure(TuneContext context, HostCosts costs) {
  context_ = std::move(context);
  costs_ = costs;
  int collectives = static_cast<int>(Collective::kBarrier) + 1;
  chosen_.assign(collectives, {});
  known_.assign(collectives, {});
}

std::vector<TuneEstimate> Tuner::rank(Collective collective, size_t bytes, const AlgorithmRules& rules) const {
  std::vector<std::string> names = rules.allowed[static_cast<int>(collective)];
  if (names.empty()) names = algorithmsFor(collective);
  size_t elementBytes = estimateElementBytes(bytes), count = bytes / elementBytes;
  std::vector<int> channelChoices{1};
  if (context_.nChannels > 1) channelChoices.push_back(context_.nChannels);
  std::vector<TuneEstimate> estimates;
  for (const std::string& name : names) {
    for (int channels : channelChoices) {
      double us = estimateCall(context_, costs_, collective, count, elementBytes, 0, name, channels, nullptr,
                               kTunedCalls);
      if (us >= 0) estimates.push_back({name, channels, us, defaultSlicing(context_)});
    }
  }
  std::stable_sort(estimates.begin(), estimates.end(),
                   [](const TuneEstimate& a, const TuneEstimate& b) { return a.us < b.us; });
  return estimates;
}

const TuneEstimate& Tuner::choose(Collective collective, size_t bytes, const AlgorithmRules& rules) {
  int sizeClass = bytes <= 1 ? 0 : 64 - __builtin_clzll(static_cast<unsigned long long>(bytes - 1));
  int c = static_cast<int>(collective);
  TuneEstimate& chosen = chosen_[c][sizeClass];
  if (known_[c][sizeClass]) return chosen;
  known_[c][sizeClass] = true;
  const std::vector<std::string>& allowed = rules.allowed[c];
  std::vector<std::string> names = allowed.empty() ? algorithmsFor(collective) : allowed;
  if (!tunable(collective)) {
    chosen = {names.front(), context_.nChannels, 0, defaultSlicing(context_)};
    return chosen;
  }
  size_t classBytes = size_t{1} << sizeClass;
  std::vector<TuneEstimate> estimates = rank(collective, classBytes, rules);
  chosen = estimates.empty() ? TuneEstimate{names.front(), context_.nChannels, 0, defaultSlicing(context_)}
                             : estimates.front();
  // The model's errors are about this size (docs/TUNING.md): an algorithm earlier in the registry's order (the
  // ring first) keeps the call unless another is predicted clearly faster.
  for (const std::string& name : names) {
    auto near = std::find_if(estimates.begin(), estimates.end(), [&](const TuneEstimate& estimate) {
      return estimate.algorithm == name && estimate.us <= chosen.us * (1 + kPreferEarlierWithin);
    });
    if (near != estimates.end()) {
      chosen = *near;
      break;
    }
  }
  if (!estimates.empty()) refineSlicing(collective, classBytes, &chosen);
  if (logEnabled(LogLevel::kInfo, Subsys::TUNE))
    logMessage(LogLevel::kInfo, Subsys::TUNE, "%s up to %s on %d ranks: %s -> %s%s, %s (%.2f us)",
               collectiveName(collective), sizeText(classBytes).c_str(), context_.nranks,
               describeEstimates(estimates).c_str(), chosen.algorithm.c_str(),
               chosen.nChannels > 1 ? (" on " + std::to_string(chosen.nChannels) + " channels").c_str() : "",
               describeSlicing(chosen.slicing, context_.forcedProtocol).c_str(), chosen.us);
  return chosen;
}

void Tuner::refineSlicing(Collective collective, size_t bytes, TuneEstimate* chosen) const {
  size_t elementBytes = estimateElementBytes(bytes), count = bytes / elementBytes;
  auto tryOut = [&](Slicing slicing) {
    double us = estimateCall(context_, costs_, collective, count, elementBytes, 0, chosen->algorithm,
                             chosen->nChannels, &slicing, kTunedCalls);
    if (us >= 0 && us < chosen->us * (1 - kPreferEarlierWithin)) {
      chosen->us = us;
      chosen->slicing = slicing;
    }
  };
  // The protocol: LL's flags double the bytes but spare the Simple protocol's counters per message.
  if (context_.forcedProtocol < 0 && chosen->slicing.llThresholdBytes > 0)
    tryOut(Slicing{0, chosen->slicing.simpleSliceBytes});
  // The chunk: smaller ones fill a pipeline (a tree's depth, a ring's neighbours) sooner, at more overhead each.
  if (context_.forcedChunkBytes == 0) {
    Slicing base = chosen->slicing;
    for (size_t divisor = 2; divisor <= 8 && base.simpleSliceBytes / divisor >= kMinChunkBytes; divisor *= 2)
      tryOut(Slicing{base.llThresholdBytes, base.simpleSliceBytes / divisor});
  }
}

std::string describeEstimates(const std::vector<TuneEstimate>& estimates) {
  std::string text;
  for (const TuneEstimate& estimate : estimates) {
    char item[96];
    std::snprintf(item, sizeof(item), "%s%s %.2f us%s", text.empty() ? "" : " | ", estimate.algorithm.c_str(),
                  estimate.us, estimate.nChannels > 1 ? (" (" + std::to_string(estimate.nChannels) + " ch)").c_str() : "");
    text += item;
  }
  return text;
}

namespace {

struct CostField {
  const char* name;
  double HostCosts::*field;
};
constexpr CostField kCostFields[] = {
    {"callUs", &HostCosts::callUs},           {"llSliceUs", &HostCosts::llSliceUs},
    {"simpleSliceUs", &HostCosts::simpleSliceUs}, {"localSliceUs", &HostCosts::localSliceUs},
    {"copyGBps", &HostCosts::copyGBps},       {"cachedCopyGBps", &HostCosts::cachedCopyGBps},
    {"cacheBytes", &HostCosts::cacheBytes},   {"deviceCopyGBps", &HostCosts::deviceCopyGBps},
    {"llCopyFactor", &HostCosts::llCopyFactor}, {"shmLatencyUs", &HostCosts::shmLatencyUs},
    {"switchUs", &HostCosts::switchUs},       {"inputSendFactor", &HostCosts::inputSendFactor},
    {"deviceLlSliceUs", &HostCosts::deviceLlSliceUs}, {"deviceSimpleSliceUs", &HostCosts::deviceSimpleSliceUs},
    {"nvlinkShare", &HostCosts::nvlinkShare}, {"pcieShare", &HostCosts::pcieShare},
    {"networkShare", &HostCosts::networkShare},
};

}  // namespace

bool parseHostCosts(const std::string& text, HostCosts* costs, std::string* error) {
  HostCosts parsed = *costs;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    size_t equals = item.find('=');
    std::string name = item.substr(0, equals);
    const CostField* field = nullptr;
    for (const CostField& candidate : kCostFields)
      if (name == candidate.name) field = &candidate;
    if (field == nullptr || equals == std::string::npos) {
      *error = "\"" + item + "\" is not NAME=VALUE with a cost's name (callUs, llSliceUs, ...)";
      return false;
    }
    char* rest = nullptr;
    double value = std::strtod(item.c_str() + equals + 1, &rest);
    bool rate = name.find("GBps") != std::string::npos || name == "cacheBytes";
    if (rest == item.c_str() + equals + 1 || *rest != '\0' || !std::isfinite(value) || value < 0 ||
        (rate && value == 0)) {
      *error = "\"" + item + "\": the value must be a number of at least 0 (more than 0 for a rate or size)";
      return false;
    }
    parsed.*(field->field) = value;
  }
  *costs = parsed;
  return true;
}

std::string describeHostCosts(const HostCosts& costs) {
  std::string text;
  for (const CostField& field : kCostFields) {
    char item[64];
    std::snprintf(item, sizeof(item), "%s%s=%.10g", text.empty() ? "" : ",", field.name, costs.*(field.field));
    text += item;
  }
  return text;
}

std::string describeSlicing(const Slicing& slicing, int forcedProtocol) {
  std::string text = forcedProtocol == static_cast<int>(Protocol::kLL)       ? "LL (LOOM_PROTO)"
                     : forcedProtocol == static_cast<int>(Protocol::kSimple) ? "Simple (LOOM_PROTO)"
                     : slicing.llThresholdBytes > 0 ? "LL up to " + sizeText(slicing.llThresholdBytes)
                                                    : "Simple only";
  return text + ", " + sizeText(slicing.simpleSliceBytes) + " chunks";
}

}  // namespace loom
