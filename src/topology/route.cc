// Routes and paths. A route is found by a bidirectional breadth-first search that keeps, per node, the widest
// of its shortest paths; the two searches stop at the level where they meet, so a route costs what the two balls
// around its ends hold, not the whole graph. The search is scoped by the structure of the machine: an NVLink
// fabric, one host, or the network between two egress points, which keeps cross-host routes from wandering
// through other hosts and keeps the balls small (a fat-tree route meets at the spines after a few hundred nodes).
//
// Nothing here caches routes: the per-node facts (adjacency, fabric, egress) are computed once per topology, and
// each search reuses per-thread scratch arrays stamped per search, so no search clears or allocates O(nodes).
#include <algorithm>
#include <cstring>
#include <limits>

#include "src/topology/network.h"
#include "src/topology/topology.h"

namespace loom {

struct Topology::Index {
  struct Adjacent {
    int node;
    int link;
  };
  std::vector<int> adjacentStart;  // adjacency in compressed rows: node n's are [start[n], start[n+1])
  std::vector<Adjacent> adjacent;  // shared-memory links excluded
  std::vector<int> selfLink;       // a node's shared-memory link, or -1
  std::vector<int> fabric;         // NVLink fabric (component over kNvLink links) of each node, or -1
  std::vector<int> egress;         // egressOf() of each node
  std::span<const Adjacent> of(int node) const {
    return {adjacent.data() + adjacentStart[node], adjacent.data() + adjacentStart[node + 1]};
  }
};

namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();

using Adjacent = Topology::Index::Adjacent;

// Which nodes and links a search may use.
struct Scope {
  enum Kind { kAll, kFabric, kHost, kNetwork } kind = kAll;
  int value = -1;            // the fabric or host
  int endA = -1, endB = -1;  // kNetwork: the two egress points (every other member of a host is out of scope)

  bool allows(const TopoNode& node, int id, int fabricOf) const {
    switch (kind) {
      case kAll:
        return true;
      case kFabric:
        return fabricOf == value;
      case kHost:
        return node.host == value;
      case kNetwork:
        return node.host == -1 || id == endA || id == endB;
    }
    return false;
  }
  bool allows(LinkKind link) const {
    switch (kind) {
      case kAll:
        return true;
      case kFabric:
        return link == LinkKind::kNvLink;
      case kHost:
        return link != LinkKind::kNetwork;
      case kNetwork:
        return link == LinkKind::kNetwork;
    }
    return false;
  }
};

// Per-thread search state. A node is "seen" by side s of the current search when seen[s][n] == stamp.
struct Scratch {
  uint32_t stamp = 0;
  std::vector<uint32_t> seen[2];
  std::vector<int> depth[2];
  std::vector<double> width[2];
  std::vector<int> parentLink[2];
  std::vector<int> frontier[2];
  std::vector<int> next;

  void begin(int nodes) {
    for (int side = 0; side < 2; ++side) {
      if (static_cast<int>(seen[side].size()) < nodes) {
        seen[side].resize(nodes, 0);
        depth[side].resize(nodes);
        width[side].resize(nodes);
        parentLink[side].resize(nodes);
      }
    }
    if (++stamp == 0) {  // wrapped: forget every old stamp
      for (auto& marks : seen) std::fill(marks.begin(), marks.end(), 0);
      stamp = 1;
    }
  }
  void visit(int side, int node, int level, double wide, int link) {
    seen[side][node] = stamp;
    depth[side][node] = level;
    width[side][node] = wide;
    parentLink[side][node] = link;
  }
  bool seenBy(int side, int node) const { return seen[side][node] == stamp; }
};

Scratch& scratch() {
  thread_local Scratch state;
  return state;
}

class Searcher {
 public:
  Searcher(const Topology& topo, const Topology::Index& index) : topo_(topo), index_(index) {}

  // Appends the links of the widest shortest route from `from` to `to` within `scope`; false when none.
  bool route(int from, int to, const Scope& scope, std::vector<int>* links) const {
    if (from == to) return true;
    Scratch& state = scratch();
    state.begin(topo_.nodeCount());
    state.visit(0, from, 0, kInfinite, -1);
    state.visit(1, to, 0, kInfinite, -1);
    state.frontier[0].assign(1, from);
    state.frontier[1].assign(1, to);
    struct Meeting {
      int near, link, far;  // near: on the expanding side; far: seen by the other side
      double width;
    };
    std::vector<Meeting> meetings;
    int level[2] = {0, 0};
    while (!state.frontier[0].empty() && !state.frontier[1].empty()) {
      int side = state.frontier[1].size() < state.frontier[0].size() ? 1 : 0;
      int other = 1 - side;
      state.next.clear();
      for (int near : state.frontier[side]) {
        double nearWidth = state.width[side][near];
        for (const Adjacent& step : index_.of(near)) {
          const TopoLink& link = topo_.link(step.link);
          if (!scope.allows(link.kind) || !scope.allows(topo_.node(step.node), step.node, index_.fabric[step.node]))
            continue;
          double wide = std::min(nearWidth, link.bandwidth);
          if (state.seenBy(other, step.node)) {
            meetings.push_back({near, step.link, step.node, std::min(wide, state.width[other][step.node])});
          }
          if (!state.seenBy(side, step.node)) {
            state.visit(side, step.node, level[side] + 1, wide, step.link);
            state.next.push_back(step.node);
          } else if (state.depth[side][step.node] == level[side] + 1 && wide > state.width[side][step.node]) {
            state.width[side][step.node] = wide;
            state.parentLink[side][step.node] = step.link;
          }
        }
      }
      ++level[side];
      if (!meetings.empty()) {
        // Every meeting found in this level closes a shortest route (no earlier level met): take the widest,
        // and spread ties by the ends' hash.
        double best = 0;
        for (const Meeting& meeting : meetings) best = std::max(best, meeting.width);
        std::vector<const Meeting*> widest;
        for (const Meeting& meeting : meetings)
          if (meeting.width == best) widest.push_back(&meeting);
        uint64_t hash = mixHash((static_cast<uint64_t>(from) << 32) ^ static_cast<uint64_t>(to));
        const Meeting& chosen = *widest[hash % widest.size()];
        int fromSide = side == 0 ? chosen.near : chosen.far;  // the meeting's node on the `from` side
        int toSide = side == 0 ? chosen.far : chosen.near;
        size_t start = links->size();
        for (int node = fromSide; node != from;) {
          int link = state.parentLink[0][node];
          links->push_back(link);
          node = topo_.link(link).other(node);
        }
        std::reverse(links->begin() + static_cast<std::ptrdiff_t>(start), links->end());
        links->push_back(chosen.link);
        for (int node = toSide; node != to;) {
          int link = state.parentLink[1][node];
          links->push_back(link);
          node = topo_.link(link).other(node);
        }
        return true;
      }
      state.frontier[side].swap(state.next);
    }
    return false;
  }

  // Hop counts and widths from `source` to every node of `scope` reachable from it, left in side 0 of scratch().
  void flood(int source, const Scope& scope) const {
    Scratch& state = scratch();
    state.begin(topo_.nodeCount());
    state.visit(0, source, 0, kInfinite, -1);
    state.frontier[0].assign(1, source);
    for (int level = 0; !state.frontier[0].empty(); ++level) {
      state.next.clear();
      for (int near : state.frontier[0]) {
        for (const Adjacent& step : index_.of(near)) {
          const TopoLink& link = topo_.link(step.link);
          if (!scope.allows(link.kind) || !scope.allows(topo_.node(step.node), step.node, index_.fabric[step.node]))
            continue;
          double wide = std::min(state.width[0][near], link.bandwidth);
          if (!state.seenBy(0, step.node)) {
            state.visit(0, step.node, level + 1, wide, step.link);
            state.next.push_back(step.node);
          } else if (state.depth[0][step.node] == level + 1 && wide > state.width[0][step.node]) {
            state.width[0][step.node] = wide;
          }
        }
      }
      state.frontier[0].swap(state.next);
    }
  }

 private:
  const Topology& topo_;
  const Topology::Index& index_;
};

int findRoot(std::vector<int>& parent, int node) {
  while (parent[node] != node) node = parent[node] = parent[parent[node]];
  return node;
}

// The egress of every node of every host (see Topology::egressOf).
void computeEgress(const Topology& topo, Topology::Index* index) {
  int nodes = topo.nodeCount();
  index->egress.assign(nodes, -1);
  std::vector<std::vector<int>> members(topo.hostCount());
  std::vector<int> rankInKind(nodes, 0);  // the node's position among its host's nodes of its kind
  std::vector<std::vector<int>> kindCount(topo.hostCount(), std::vector<int>(kNodeKinds, 0));
  for (int id = 0; id < nodes; ++id) {
    const TopoNode& node = topo.node(id);
    if (node.host < 0) continue;
    members[node.host].push_back(id);
    rankInKind[id] = kindCount[node.host][static_cast<int>(node.kind)]++;
  }
  auto hasNetworkLink = [&](int id) {
    for (const Adjacent& step : index->of(id))
      if (topo.link(step.link).kind == LinkKind::kNetwork) return true;
    return false;
  };
  Searcher searcher(topo, *index);
  for (int host = 0; host < topo.hostCount(); ++host) {
    std::vector<int> exits;
    for (int id : members[host])
      if (topo.node(id).kind == NodeKind::kNic && hasNetworkLink(id)) exits.push_back(id);
    if (exits.empty() && hasNetworkLink(topo.hostNode(host))) exits.push_back(topo.hostNode(host));
    if (exits.empty()) continue;
    // distance[e][m], width[e][m] for exit e and member m of the host.
    std::vector<std::vector<int>> distance(exits.size(), std::vector<int>(members[host].size(), -1));
    std::vector<std::vector<double>> width(exits.size(), std::vector<double>(members[host].size(), 0));
    for (size_t e = 0; e < exits.size(); ++e) {
      searcher.flood(exits[e], Scope{Scope::kHost, host});
      const Scratch& state = scratch();
      for (size_t m = 0; m < members[host].size(); ++m) {
        int id = members[host][m];
        if (!state.seenBy(0, id)) continue;
        distance[e][m] = state.depth[0][id];
        width[e][m] = state.width[0][id];
      }
    }
    std::vector<int> tied;
    for (size_t m = 0; m < members[host].size(); ++m) {
      tied.clear();
      for (size_t e = 0; e < exits.size(); ++e) {
        if (distance[e][m] < 0) continue;
        if (tied.empty()) {
          tied.push_back(static_cast<int>(e));
          continue;
        }
        int best = tied.front();
        bool closer =
            distance[e][m] < distance[best][m] || (distance[e][m] == distance[best][m] && width[e][m] > width[best][m]);
        if (closer)
          tied.assign(1, static_cast<int>(e));
        else if (distance[e][m] == distance[best][m] && width[e][m] == width[best][m])
          tied.push_back(static_cast<int>(e));
      }
      if (tied.empty()) continue;
      int id = members[host][m];
      index->egress[id] = exits[tied[rankInKind[id] % tied.size()]];
    }
  }
}

}  // namespace

// The index is a cache of the graph: copies and moves rebuild it on their first query.
Topology::Topology() = default;

Topology::Topology(const Topology& other)
    : nodes_(other.nodes_),
      links_(other.links_),
      hostNodes_(other.hostNodes_),
      rankNodes_(other.rankNodes_),
      rankNics_(other.rankNics_),
      attrs_(other.attrs_),
      byName_(other.byName_) {}

Topology::Topology(Topology&& other) noexcept
    : nodes_(std::move(other.nodes_)),
      links_(std::move(other.links_)),
      hostNodes_(std::move(other.hostNodes_)),
      rankNodes_(std::move(other.rankNodes_)),
      rankNics_(std::move(other.rankNics_)),
      attrs_(std::move(other.attrs_)),
      byName_(std::move(other.byName_)) {
  other.invalidate();
}

Topology& Topology::operator=(const Topology& other) {
  if (this == &other) return *this;
  invalidate();
  nodes_ = other.nodes_;
  links_ = other.links_;
  hostNodes_ = other.hostNodes_;
  rankNodes_ = other.rankNodes_;
  rankNics_ = other.rankNics_;
  attrs_ = other.attrs_;
  byName_ = other.byName_;
  return *this;
}

Topology& Topology::operator=(Topology&& other) noexcept {
  if (this == &other) return *this;
  invalidate();
  other.invalidate();
  nodes_ = std::move(other.nodes_);
  links_ = std::move(other.links_);
  hostNodes_ = std::move(other.hostNodes_);
  rankNodes_ = std::move(other.rankNodes_);
  rankNics_ = std::move(other.rankNics_);
  attrs_ = std::move(other.attrs_);
  byName_ = std::move(other.byName_);
  return *this;
}

Topology::~Topology() = default;

void Topology::invalidate() {
  std::lock_guard<std::mutex> lock(indexMutex_);
  indexReady_.store(nullptr, std::memory_order_release);
  index_.reset();
}

const Topology::Index& Topology::index() const {
  if (const Index* ready = indexReady_.load(std::memory_order_acquire)) return *ready;
  std::lock_guard<std::mutex> lock(indexMutex_);
  if (const Index* ready = indexReady_.load(std::memory_order_relaxed)) return *ready;
  auto built = std::make_unique<Index>();
  int nodes = nodeCount();
  built->adjacentStart.assign(nodes + 1, 0);
  built->selfLink.assign(nodes, -1);
  for (const TopoLink& link : links_) {
    if (link.a == link.b) continue;
    ++built->adjacentStart[link.a + 1];
    ++built->adjacentStart[link.b + 1];
  }
  for (int n = 0; n < nodes; ++n) built->adjacentStart[n + 1] += built->adjacentStart[n];
  built->adjacent.resize(built->adjacentStart[nodes]);
  std::vector<int> fill(built->adjacentStart.begin(), built->adjacentStart.end() - 1);
  std::vector<int> parent(nodes);
  for (int n = 0; n < nodes; ++n) parent[n] = n;
  std::vector<bool> onFabric(nodes, false);
  for (int id = 0; id < linkCount(); ++id) {
    const TopoLink& link = links_[id];
    if (link.a == link.b) {
      if (built->selfLink[link.a] < 0) built->selfLink[link.a] = id;
      continue;
    }
    built->adjacent[fill[link.a]++] = {link.b, id};
    built->adjacent[fill[link.b]++] = {link.a, id};
    if (link.kind == LinkKind::kNvLink) {
      onFabric[link.a] = onFabric[link.b] = true;
      parent[findRoot(parent, link.a)] = findRoot(parent, link.b);
    }
  }
  built->fabric.assign(nodes, -1);
  for (int n = 0; n < nodes; ++n)
    if (onFabric[n]) built->fabric[n] = findRoot(parent, n);
  computeEgress(*this, built.get());
  index_ = std::move(built);
  indexReady_.store(index_.get(), std::memory_order_release);
  return *index_;
}

int Topology::egressOf(int node) const { return index().egress[node]; }

std::vector<int> Topology::route(int from, int to) const {
  std::vector<int> links;
  if (from < 0 || to < 0 || from >= nodeCount() || to >= nodeCount()) return links;
  const Index& idx = index();
  if (from == to) {
    if (idx.selfLink[from] >= 0) links.push_back(idx.selfLink[from]);
    return links;
  }
  Searcher searcher(*this, idx);
  if (idx.fabric[from] >= 0 && idx.fabric[from] == idx.fabric[to] &&
      searcher.route(from, to, Scope{Scope::kFabric, idx.fabric[from]}, &links))
    return links;
  int hostFrom = nodes_[from].host, hostTo = nodes_[to].host;
  if (hostFrom >= 0 && hostFrom == hostTo) {
    if (searcher.route(from, to, Scope{Scope::kHost, hostFrom}, &links)) return links;
  } else if (hostFrom >= 0 && hostTo >= 0) {
    int exitFrom = idx.egress[from], exitTo = idx.egress[to];
    if (exitFrom >= 0 && exitTo >= 0 && searcher.route(from, exitFrom, Scope{Scope::kHost, hostFrom}, &links) &&
        searcher.route(exitFrom, exitTo, Scope{Scope::kNetwork, -1, exitFrom, exitTo}, &links) &&
        searcher.route(exitTo, to, Scope{Scope::kHost, hostTo}, &links))
      return links;
  }
  // The machine's structure gave no route (a hand-written graph, a host without a NIC): any shortest one will do.
  links.clear();
  searcher.route(from, to, Scope{}, &links);
  return links;
}

std::vector<int> Topology::nodesAlong(int from, std::span<const int> links) const {
  std::vector<int> visited{from};
  for (int link : links) visited.push_back(links_[link].other(visited.back()));
  return visited;
}

namespace {

bool isSwitch(NodeKind kind) { return kind == NodeKind::kNvSwitch || kind == NodeKind::kNetSwitch; }

// The bandwidth a route's stage through switch `center` offers when its twins (switches of the same kind joined
// to both neighbours by links of the same kinds) carry their share: sum over the twins of the narrower side.
// Candidates come from the neighbour with fewer links (a NIC's one leaf, not a spine's hundreds of leaves).
double stageBandwidth(const Topology& topo, const Topology::Index& index, int before, int center, int after,
                      LinkKind kindBefore, LinkKind kindAfter, int* twinCount = nullptr) {
  struct Twin {
    int node;
    double near, far;  // bandwidth to the neighbour the candidates came from, and to the other one
  };
  NodeKind kind = topo.node(center).kind;
  bool fromBefore = index.of(before).size() <= index.of(after).size();
  int nearNode = fromBefore ? before : after, farNode = fromBefore ? after : before;
  LinkKind nearKind = fromBefore ? kindBefore : kindAfter, farKind = fromBefore ? kindAfter : kindBefore;
  std::vector<Twin> twins;
  for (const Adjacent& step : index.of(nearNode)) {
    const TopoLink& link = topo.link(step.link);
    if (topo.node(step.node).kind != kind || link.kind != nearKind) continue;
    auto found = std::find_if(twins.begin(), twins.end(), [&](const Twin& t) { return t.node == step.node; });
    if (found == twins.end())
      twins.push_back({step.node, link.bandwidth, 0});
    else
      found->near += link.bandwidth;
  }
  for (const Adjacent& step : index.of(farNode)) {
    const TopoLink& link = topo.link(step.link);
    if (link.kind != farKind || topo.node(step.node).kind != kind) continue;
    auto found = std::find_if(twins.begin(), twins.end(), [&](const Twin& t) { return t.node == step.node; });
    if (found != twins.end()) found->far += link.bandwidth;
  }
  double total = 0;
  int joined = 0;
  for (const Twin& twin : twins)
    if (twin.far > 0) total += std::min(twin.near, twin.far), ++joined;
  if (twinCount != nullptr) *twinCount = joined;
  return total;
}

}  // namespace

PathInfo Topology::pathBetween(int from, int to) const {
  PathInfo info;
  if (from < 0 || to < 0 || from >= nodeCount() || to >= nodeCount()) return info;
  std::vector<int> links = route(from, to);
  if (from == to && links.empty()) {
    info.reachable = true;
    info.bandwidth = kInfinite;
    return info;
  }
  if (links.empty()) return info;
  const Index& idx = index();
  std::vector<int> visited = nodesAlong(from, links);
  info.reachable = true;
  info.hops = static_cast<int>(links.size());
  info.bandwidth = kInfinite;
  std::vector<bool> covered(links.size(), false);  // links whose bandwidth a switch stage accounts for
  for (size_t k = 1; k + 1 < visited.size(); ++k) {
    if (!isSwitch(nodes_[visited[k]].kind)) continue;
    covered[k - 1] = covered[k] = true;
    info.bandwidth = std::min(info.bandwidth, stageBandwidth(*this, idx, visited[k - 1], visited[k], visited[k + 1],
                                                             links_[links[k - 1]].kind, links_[links[k]].kind));
  }
  for (size_t k = 0; k < links.size(); ++k) {
    const TopoLink& link = links_[links[k]];
    info.latency += link.latency;
    if (!covered[k]) info.bandwidth = std::min(info.bandwidth, link.bandwidth);
    if (k == 0 || link.kind > info.slowest) info.slowest = link.kind;
  }
  return info;
}

PathInfo Topology::path(int rankA, int rankB) const {
  int from = rankNode(rankA), to = rankNode(rankB);
  if (from < 0 || to < 0) return PathInfo{};
  return pathBetween(from, to);
}

std::vector<PathStage> Topology::pathStages(int rankA, int rankB) const {
  std::vector<PathStage> stages;
  int from = rankNode(rankA), to = rankNode(rankB);
  if (from < 0 || to < 0) return stages;
  std::vector<int> links = route(from, to);
  std::vector<int> visited = nodesAlong(from, links);
  const Index& idx = index();
  for (size_t k = 1; k + 1 < visited.size(); ++k) {
    if (!isSwitch(nodes_[visited[k]].kind)) continue;
    PathStage stage;
    stage.hop = static_cast<int>(k - 1);
    stage.bandwidth = stageBandwidth(*this, idx, visited[k - 1], visited[k], visited[k + 1], links_[links[k - 1]].kind,
                                     links_[links[k]].kind, &stage.twins);
    stages.push_back(stage);
  }
  return stages;
}

}  // namespace loom
