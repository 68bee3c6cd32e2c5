// The network as loom-sim and the tuner's model of the GPU executor see it: resources (one direction of a link, or a
// group of twin links that a transfer is striped over), routes between nodes as the resources they load, and
// max-min fair rates for a set of flows that all want to send at once.
//
// A route is Topology::route's links. Where it crosses a switch with twins (the four NVSwitches of a DGX, the
// spines of a fat tree: Topology::pathBetween's rule), the transfer is striped over the twins in proportion to
// what each offers, min(bandwidth to the previous node, to the next one). When that proportion is the links'
// own bandwidth ratio, the links on each side form one group resource with their summed bandwidth (exact when
// every flow through them stripes the same way, as in the presets, and it keeps a fat-tree route at a dozen
// resources instead of one per spine); otherwise each link is its own resource, used with a weight below 1.
// A resource's capacity is its nominal bandwidth times the efficiency of its link kind. Nothing here knows
// about plans or time.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "src/topology/topology.h"

namespace loom {

// splitmix64's finaliser: the hash that the network's, the routes' and the simulator's tables mix keys with.
inline uint64_t mixHash(uint64_t value) {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

struct ResourceUse {
  int resource;
  double weight;  // bytes on the resource per byte of the flow
};

struct NetRoute {
  bool reachable = false;
  std::vector<ResourceUse> uses;  // empty: the two ends share a node with no link (infinitely fast)
  double latencyUs = 0;           // the links' latencies summed
  double soloRate = 0;            // GB/s with the route to itself: min over uses of capacity / weight
};

// One flow of a fair-share problem: `multiplicity` identical flows along `route`.
struct FlowDemand {
  const NetRoute* route;
  double multiplicity = 1;
};

class Network {
 public:
  Network(const Topology& topo, const double efficiency[kLinkKinds]);

  const Topology& topology() const { return topo_; }
  // The route from node `from` to node `to`, computed once and kept (the reference stays valid).
  const NetRoute& route(int from, int to);
  const NetRoute& rankRoute(int fromRank, int toRank) {
    return route(topo_.rankNode(fromRank), topo_.rankNode(toRank));
  }

  int resourceCount() const { return static_cast<int>(capacity_.size()); }
  double capacity(int resource) const { return capacity_[resource]; }

  // Max-min fair rates (GB/s of each single flow) when every flow sends at once and no flow is limited but by
  // the network: progressive filling, all flows' rates rising together until a resource is full, whose flows
  // then stay at that rate. A flow with no resources gets +infinity.
  void fairRates(std::span<const FlowDemand> flows, std::vector<double>* rates);

 private:
  NetRoute computeRoute(int from, int to);
  int linkResource(int link, int fromNode) const;
  int groupResource(std::vector<int> links, int sideNode, bool toward);
  int adjacentCount(int node) const { return adjacentStart_[node + 1] - adjacentStart_[node]; }
  void addStripedStage(const std::vector<int>& nodes, const std::vector<int>& links, size_t k, NetRoute* out,
                       std::vector<bool>* covered);

  const Topology& topo_;
  double efficiency_[kLinkKinds];
  std::vector<double> capacity_;  // per resource: 2 per link (a -> b, b -> a), then groups
  std::unordered_map<uint64_t, std::vector<std::pair<std::vector<int>, int>>> groups_;  // by hash: (key, id)
  std::unordered_map<uint64_t, NetRoute> routes_;
  std::vector<int> adjacentStart_, adjacentLinks_;  // links of each node, in compressed rows
  // fairRates: which resources the current problem touched (stamp) and their index in it.
  std::vector<int> mark_, local_;
  int stamp_ = 0;
};

}  // namespace loom
