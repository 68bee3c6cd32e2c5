// Simulator::run and the helpers of sim.h: a call's setup, then one of the two engines.
#include "tools/sim/sim.h"

#include "algorithms/builders.h"
#include "src/base/params.h"
#include "src/tuner/event_timer.h"
#include "tools/sim/engines.h"

namespace loom::sim {

struct Simulator::State {
  State(const Topology& topo, const Params& params) : topo(topo), params(params), network(topo, params.efficiency) {}
  const Topology& topo;
  Params params;
  Network network;
  FairShareCache cache;
};

Simulator::Simulator(const Topology& topo, const Params& params) : state_(std::make_unique<State>(topo, params)) {}
Simulator::~Simulator() = default;

Result Simulator::run(const Call& call, Mode mode) {
  Params params = state_->params;
  if (call.simpleSliceBytes > 0) params.simpleSliceBytes = call.simpleSliceBytes;
  if (call.llThresholdBytes != SIZE_MAX) params.llThresholdBytes = call.llThresholdBytes;
  Result result;
  CallSetup setup;
  if (!setUpCall(state_->topo, call, params, &setup, &result.error)) return result;
  if (call.plans != nullptr) {
    if (call.plans->size() != static_cast<size_t>(call.nranks)) {
      result.error = std::to_string(call.plans->size()) + " plans for " + std::to_string(call.nranks) + " ranks";
      return result;
    }
    result = runExact(setup, *call.plans, state_->network, params);
    result.exact = true;
    return result;
  }
  if (mode == Mode::kAuto && call.nranks <= params.autoExactMaxRanks) {
    std::vector<RankPlan> plans = buildPlans(setup);
    if (eventWork(plans, setup.slicing, setup.base.nChannels) <= params.autoExactWork) {
      result = runExact(setup, plans, state_->network, params);
      result.exact = true;
      return result;
    }
  }
  if (mode == Mode::kExact) {
    // Every slice is an event: refuse calls that would take minutes, judged by rank 0's plan.
    RankPlan first;
    buildPlan(setup.argsFor(0), setup.algorithm, &first);
    double slices = 0;
    for (const Lane& lane : first.lanes)
      for (const Step& step : lane.steps) slices += static_cast<double>(setup.slicing.slicesOf(step.count()));
    if (slices * call.nranks > static_cast<double>(params.maxExactSlices)) {
      result.error = "about " + std::to_string(static_cast<uint64_t>(slices * call.nranks)) +
                     " slices, more than the exact engine's limit of " + std::to_string(params.maxExactSlices) +
                     " (use the fast engine)";
      return result;
    }
    result = runExact(setup, buildPlans(setup), state_->network, params);
    result.exact = true;
    return result;
  }
  ShapeSet shapes;
  if (!buildShapes(setup, params, &shapes, &result.error)) return result;
  return runFast(setup, shapes, state_->network, state_->cache, params);
}

Params loomParams() {
  Params params;
  params.simpleSliceBytes = static_cast<size_t>(std::max<int64_t>(1, params::simpleSlotBytes()));
  params.llSlotBytes = static_cast<size_t>(std::max<int64_t>(16, params::llSlotBytes()));
  params.llThresholdBytes = static_cast<size_t>(std::max<int64_t>(0, params::llThreshold()));
  params.fifoDepth = static_cast<int>(std::max<int64_t>(1, params::fifoDepth()));
  return params;
}

namespace {

bool splitsOverRanks(Collective collective) {
  return collective == Collective::kAllGather || collective == Collective::kGather ||
         collective == Collective::kReduceScatter || collective == Collective::kScatter ||
         collective == Collective::kAllToAll;
}

}  // namespace

size_t callCountFor(Collective collective, size_t bytes, size_t elementBytes, int nranks) {
  size_t count = bytes / elementBytes;
  if (!splitsOverRanks(collective)) return count;
  size_t mask = elementBytes >= 16 ? 0 : 16 / elementBytes - 1;  // blocks rounded down to 16 bytes
  return (count / static_cast<size_t>(nranks)) & ~mask;
}

size_t rowBytesFor(Collective collective, size_t count, size_t elementBytes, int nranks) {
  return count * elementBytes * (splitsOverRanks(collective) ? static_cast<size_t>(nranks) : 1);
}

double busBandwidthFactor(Collective collective, int nranks) {
  double n = nranks;
  switch (collective) {
    case Collective::kAllReduce:
      return 2 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
    case Collective::kGather:
    case Collective::kScatter:
      return (n - 1) / n;
    default:
      return 1;
  }
}

}  // namespace loom::sim
