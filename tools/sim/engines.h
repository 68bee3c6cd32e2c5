// The two engines behind Simulator::run, and the fair-share cache the fast one keeps across calls. Internal to
// tools/sim.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "src/topology/network.h"
#include "tools/sim/shapes.h"
#include "tools/sim/sim.h"

namespace loom::sim {

// Max-min fair rates of flow patterns already solved: a pattern is the set of (source node, destination node,
// flows) of one phase of a call, and every sweep point of an algorithm (and every phase with the same partners)
// repeats it.
class FairShareCache {
 public:
  struct Flow {
    int from, to;  // nodes
    double multiplicity;
    bool operator==(const Flow&) const = default;
  };
  // Rates (GB/s per flow) for `pattern`, sorted by (from, to) with no repeats; computed once per pattern.
  const std::vector<double>& rates(const std::vector<Flow>& pattern, Network& network);

 private:
  struct Entry {
    std::vector<Flow> pattern;
    std::vector<double> rates;
  };
  std::unordered_map<uint64_t, std::vector<Entry>> entries_;
};

Result runFast(const CallSetup& setup, const ShapeSet& shapes, Network& network, FairShareCache& cache,
               const Params& params);
Result runExact(const CallSetup& setup, const std::vector<RankPlan>& plans, Network& network, const Params& params);

// A unit's software cost in microseconds: the protocol's overhead when it sends or receives, else (a copy or a
// reduce) its bytes at the local copy bandwidth.
inline double unitCost(bool communicates, bool ll, size_t elements, size_t elementBytes, const Params& params) {
  if (communicates) return ll ? params.llOverheadUs : params.simpleOverheadUs;
  return static_cast<double>(elements * elementBytes) / (params.copyBandwidth * 1e3);
}

}  // namespace loom::sim
