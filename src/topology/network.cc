// Routes as resource loads, and max-min fair rates (see network.h).
#include "src/topology/network.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

namespace loom {
namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();

bool isSwitch(NodeKind kind) { return kind == NodeKind::kNvSwitch || kind == NodeKind::kNetSwitch; }

// A switch stage's twins: switches of the center's kind joined to the node before and the node after the center
// by links of the route's kinds there.
struct Twin {
  int node;
  std::vector<int> beforeLinks, afterLinks;
  double beforeBandwidth = 0, afterBandwidth = 0;
};

}  // namespace

Network::Network(const Topology& topo, const double efficiency[kLinkKinds]) : topo_(topo) {
  std::copy(efficiency, efficiency + kLinkKinds, efficiency_);
  capacity_.resize(2 * static_cast<size_t>(topo.linkCount()));
  for (int id = 0; id < topo.linkCount(); ++id) {
    const TopoLink& link = topo.link(id);
    capacity_[2 * id] = capacity_[2 * id + 1] = link.bandwidth * efficiency_[static_cast<int>(link.kind)];
  }
  // Adjacency in compressed rows, for the twin search (Topology keeps its own private).
  adjacentStart_.assign(topo.nodeCount() + 1, 0);
  for (const TopoLink& link : topo.links()) {
    if (link.a == link.b) continue;
    ++adjacentStart_[link.a + 1];
    ++adjacentStart_[link.b + 1];
  }
  for (int n = 0; n < topo.nodeCount(); ++n) adjacentStart_[n + 1] += adjacentStart_[n];
  adjacentLinks_.resize(adjacentStart_.back());
  std::vector<int> fill(adjacentStart_.begin(), adjacentStart_.end() - 1);
  for (int id = 0; id < topo.linkCount(); ++id) {
    const TopoLink& link = topo.link(id);
    if (link.a == link.b) continue;
    adjacentLinks_[fill[link.a]++] = id;
    adjacentLinks_[fill[link.b]++] = id;
  }
}

int Network::linkResource(int link, int fromNode) const { return 2 * link + (topo_.link(link).a == fromNode ? 0 : 1); }

// One resource for `links` crossed away from `fromSideNode` (toward it when `toward`).
int Network::groupResource(std::vector<int> links, int sideNode, bool toward) {
  std::sort(links.begin(), links.end());
  std::vector<int> key = links;
  key.push_back(sideNode);
  key.push_back(toward ? 1 : 0);
  uint64_t hash = 0;
  for (int value : key) hash = mixHash(hash ^ static_cast<uint64_t>(static_cast<uint32_t>(value)));
  std::vector<std::pair<std::vector<int>, int>>& bucket = groups_[hash];
  for (const auto& [known, id] : bucket)
    if (known == key) return id;
  double total = 0;
  for (int link : links) total += topo_.link(link).bandwidth * efficiency_[static_cast<int>(topo_.link(link).kind)];
  int id = static_cast<int>(capacity_.size());
  capacity_.push_back(total);
  bucket.emplace_back(std::move(key), id);
  return id;
}

void Network::addStripedStage(const std::vector<int>& nodes, const std::vector<int>& links, size_t k, NetRoute* out,
                              std::vector<bool>* covered) {
  int before = nodes[k - 1], center = nodes[k], after = nodes[k + 1];
  LinkKind kindBefore = topo_.link(links[k - 1]).kind, kindAfter = topo_.link(links[k]).kind;
  NodeKind kind = topo_.node(center).kind;
  std::vector<Twin> twins;
  auto find = [&](int node) {
    return std::find_if(twins.begin(), twins.end(), [&](const Twin& twin) { return twin.node == node; });
  };
  // Candidates from the side with fewer links (a NIC's one leaf rather than a spine's hundreds of leaves).
  bool fromBefore = adjacentCount(before) <= adjacentCount(after);
  int nearNode = fromBefore ? before : after, farNode = fromBefore ? after : before;
  LinkKind nearKind = fromBefore ? kindBefore : kindAfter, farKind = fromBefore ? kindAfter : kindBefore;
  for (int a = adjacentStart_[nearNode]; a < adjacentStart_[nearNode + 1]; ++a) {
    const TopoLink& link = topo_.link(adjacentLinks_[a]);
    int other = link.other(nearNode);
    if (link.kind != nearKind || topo_.node(other).kind != kind) continue;
    auto twin = find(other);
    if (twin == twins.end()) twin = twins.insert(twins.end(), Twin{other, {}, {}, 0, 0});
    (fromBefore ? twin->beforeLinks : twin->afterLinks).push_back(adjacentLinks_[a]);
    (fromBefore ? twin->beforeBandwidth : twin->afterBandwidth) += link.bandwidth;
  }
  for (int a = adjacentStart_[farNode]; a < adjacentStart_[farNode + 1]; ++a) {
    const TopoLink& link = topo_.link(adjacentLinks_[a]);
    if (link.kind != farKind) continue;
    auto twin = find(link.other(farNode));
    if (twin == twins.end()) continue;
    (fromBefore ? twin->afterLinks : twin->beforeLinks).push_back(adjacentLinks_[a]);
    (fromBefore ? twin->afterBandwidth : twin->beforeBandwidth) += link.bandwidth;
  }
  std::erase_if(twins, [](const Twin& twin) { return twin.beforeLinks.empty() || twin.afterLinks.empty(); });
  if (twins.size() < 2) return;
  double total = 0, beforeTotal = 0, afterTotal = 0;
  for (const Twin& twin : twins) {
    total += std::min(twin.beforeBandwidth, twin.afterBandwidth);
    beforeTotal += twin.beforeBandwidth;
    afterTotal += twin.afterBandwidth;
  }
  // Striping in proportion to the links' own bandwidths loads them all alike: one group resource per side.
  auto proportional = [&](bool beforeSide) {
    for (const Twin& twin : twins) {
      double share = std::min(twin.beforeBandwidth, twin.afterBandwidth) / total;
      double own = beforeSide ? twin.beforeBandwidth / beforeTotal : twin.afterBandwidth / afterTotal;
      if (std::abs(share - own) > 1e-9) return false;
    }
    return true;
  };
  for (int side = 0; side < 2; ++side) {
    bool beforeSide = side == 0;
    if (proportional(beforeSide)) {
      std::vector<int> group;
      for (const Twin& twin : twins)
        for (int link : beforeSide ? twin.beforeLinks : twin.afterLinks) group.push_back(link);
      out->uses.push_back({groupResource(std::move(group), beforeSide ? before : after, !beforeSide), 1.0});
      continue;
    }
    for (const Twin& twin : twins) {
      double share = std::min(twin.beforeBandwidth, twin.afterBandwidth) / total;
      double sideBandwidth = beforeSide ? twin.beforeBandwidth : twin.afterBandwidth;
      for (int link : beforeSide ? twin.beforeLinks : twin.afterLinks) {
        double weight = share * topo_.link(link).bandwidth / sideBandwidth;
        out->uses.push_back({linkResource(link, beforeSide ? before : twin.node), weight});
      }
    }
  }
  (*covered)[k - 1] = (*covered)[k] = true;
}

NetRoute Network::computeRoute(int from, int to) {
  NetRoute out;
  if (from < 0 || to < 0) return out;
  std::vector<int> links = topo_.route(from, to);
  if (links.empty()) {
    if (from != to) return out;
    out.reachable = true;
    out.soloRate = kInfinite;
    return out;
  }
  out.reachable = true;
  std::vector<int> nodes = topo_.nodesAlong(from, links);
  std::vector<bool> covered(links.size(), false);
  for (size_t k = 1; k + 1 < nodes.size(); ++k)
    if (isSwitch(topo_.node(nodes[k]).kind) && !covered[k - 1] && !covered[k])
      addStripedStage(nodes, links, k, &out, &covered);
  for (size_t k = 0; k < links.size(); ++k) {
    out.latencyUs += topo_.link(links[k]).latency;
    if (!covered[k]) out.uses.push_back({linkResource(links[k], nodes[k]), 1.0});
  }
  out.soloRate = kInfinite;
  for (const ResourceUse& use : out.uses) out.soloRate = std::min(out.soloRate, capacity_[use.resource] / use.weight);
  return out;
}

const NetRoute& Network::route(int from, int to) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 32) | static_cast<uint32_t>(to);
  auto found = routes_.find(key);
  if (found != routes_.end()) return found->second;
  return routes_.emplace(key, computeRoute(from, to)).first->second;
}

void Network::fairRates(std::span<const FlowDemand> flows, std::vector<double>* rates) {
  size_t resources = capacity_.size();
  if (mark_.size() < resources) {
    mark_.resize(resources, 0);
    local_.resize(resources);
  }
  if (++stamp_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    stamp_ = 1;
  }
  rates->assign(flows.size(), kInfinite);
  // Local state of the resources the flows touch: remaining capacity, weight and count of unfrozen flows.
  std::vector<int> touched;
  std::vector<double> remaining, weight;
  std::vector<int> unfrozen, start;
  for (const FlowDemand& flow : flows) {
    for (const ResourceUse& use : flow.route->uses) {
      int r = use.resource;
      if (mark_[r] != stamp_) {
        mark_[r] = stamp_;
        local_[r] = static_cast<int>(touched.size());
        touched.push_back(r);
        remaining.push_back(capacity_[r]);
        weight.push_back(0);
        unfrozen.push_back(0);
      }
      weight[local_[r]] += flow.multiplicity * use.weight;
      ++unfrozen[local_[r]];
    }
  }
  // Flows of each resource, in compressed rows.
  start.assign(touched.size() + 1, 0);
  for (int i = 0; i < static_cast<int>(touched.size()); ++i) start[i + 1] = start[i] + unfrozen[i];
  std::vector<int> flowsOf(start.back());
  std::vector<int> fill(start.begin(), start.end() - 1);
  for (size_t f = 0; f < flows.size(); ++f)
    for (const ResourceUse& use : flows[f].route->uses) flowsOf[fill[local_[use.resource]]++] = static_cast<int>(f);
  using Entry = std::pair<double, int>;  // (level at which the resource fills, local index)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto level = [&](int i) { return std::max(0.0, remaining[i]) / weight[i]; };
  for (int i = 0; i < static_cast<int>(touched.size()); ++i) heap.push({level(i), i});
  std::vector<char> frozen(flows.size(), 0);
  while (!heap.empty()) {
    auto [popped, i] = heap.top();
    heap.pop();
    if (unfrozen[i] == 0) continue;
    double now = level(i);
    if (now > popped * (1 + 1e-12) + 1e-15) {  // stale: the resource's level rose since
      heap.push({now, i});
      continue;
    }
    for (int k = start[i]; k < start[i + 1]; ++k) {
      int f = flowsOf[k];
      if (frozen[f]) continue;
      frozen[f] = 1;
      (*rates)[f] = now;
      for (const ResourceUse& use : flows[f].route->uses) {
        int j = local_[use.resource];
        remaining[j] -= flows[f].multiplicity * use.weight * now;
        weight[j] -= flows[f].multiplicity * use.weight;
        if (--unfrozen[j] > 0) heap.push({level(j), j});
      }
    }
  }
}

}  // namespace loom
