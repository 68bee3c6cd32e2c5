// fuseViews (fuse.h): one host subgraph per distinct host hash, ranks placed by node name, hosts joined by one
// network switch. It models the network as a single non-blocking switch because that is all the ranks can see of
// it; a LOOM_TOPO_FILE describing the real fabric (a fat tree, rails) takes precedence as a whole-cluster view.
#include "src/topology/fuse.h"

#include <string>
#include <unordered_map>
#include <vector>

#include "src/base/check.h"
#include "src/topology/figures.h"

namespace loom {
namespace {

// "host0/gpu3" of a view whose host is "host0" becomes "host2/gpu3" as host 2.
std::string renamed(const std::string& name, const std::string& oldHost, const std::string& newHost) {
  if (name == oldHost) return newHost;
  if (name.size() > oldHost.size() && name.compare(0, oldHost.size(), oldHost) == 0 && name[oldHost.size()] == '/')
    return newHost + name.substr(oldHost.size());
  return newHost + "/" + name;
}

loomResult_t fuseCluster(std::span<const Topology> views, Topology* fused) {
  for (size_t rank = 1; rank < views.size(); ++rank) {
    if (!(views[rank] == views[0])) {
      return LOOM_FAIL(loomInvalidUsage, TOPO,
                       "rank %zu's topology differs from rank 0's; a topology spanning several hosts (%d in rank 0's) "
                       "must be the same file on every rank",
                       rank, views[0].hostCount());
    }
  }
  for (int rank = 0; rank < static_cast<int>(views.size()); ++rank) {
    if (views[0].rankNode(rank) < 0)
      return LOOM_FAIL(loomInvalidUsage, TOPO, "the topology spanning %d hosts does not place rank %d",
                       views[0].hostCount(), rank);
  }
  *fused = views[0];
  return loomSuccess;
}

}  // namespace

loomResult_t fuseViews(std::span<const Topology> views, std::span<const uint64_t> hostHashOfRank, Topology* fused) {
  int nranks = static_cast<int>(views.size());
  if (nranks == 0 || hostHashOfRank.size() != views.size()) {
    return LOOM_FAIL(loomInvalidArgument, TOPO,
                     "fuseViews: %zu views and %zu host hashes; expected one of each per rank", views.size(),
                     hostHashOfRank.size());
  }
  bool cluster = false;
  for (int rank = 0; rank < nranks; ++rank) {
    std::string problem = views[rank].validate();
    if (!problem.empty())
      return LOOM_FAIL(loomInvalidUsage, TOPO, "rank %d's topology is invalid: %s", rank, problem.c_str());
    cluster = cluster || views[rank].hostCount() > 1 || views[rank].countNodes(NodeKind::kNetSwitch) > 0;
  }
  if (cluster) return fuseCluster(views, fused);

  // Hosts numbered by their lowest rank.
  std::unordered_map<uint64_t, int> hostOfHash;
  std::vector<int> firstRank, hostOfRank(nranks);
  for (int rank = 0; rank < nranks; ++rank) {
    auto [entry, added] = hostOfHash.emplace(hostHashOfRank[rank], static_cast<int>(firstRank.size()));
    if (added) firstRank.push_back(rank);
    hostOfRank[rank] = entry->second;
  }
  int hosts = static_cast<int>(firstRank.size());
  Topology out;
  std::vector<std::vector<int>> newIds(hosts);  // per host: the fused id of each node of its source view
  for (int host = 0; host < hosts; ++host) {
    const Topology& view = views[firstRank[host]];
    if (view.hostCount() != 1) {
      return LOOM_FAIL(loomInvalidUsage, TOPO, "rank %d's topology has %d hosts, expected 1", firstRank[host],
                       view.hostCount());
    }
    std::string oldName = view.node(view.hostNode(0)).name, newName = "host" + std::to_string(host);
    std::vector<int>& ids = newIds[host];
    ids.resize(view.nodeCount());
    for (int id = 0; id < view.nodeCount(); ++id) {
      const TopoNode& node = view.node(id);
      if (node.kind == NodeKind::kHost) {
        ids[id] = out.hostNode(out.addHost(newName, node.attrs));
        continue;
      }
      ids[id] = out.addNode(node.kind, renamed(node.name, oldName, newName), node.host < 0 ? -1 : host, node.attrs);
      if (ids[id] < 0) {
        return LOOM_FAIL(loomInvalidUsage, TOPO, "rank %d's topology: node \"%s\" clashes with another node's name",
                         firstRank[host], node.name.c_str());
      }
    }
    for (const TopoLink& link : view.links())
      out.addLink(link.kind, ids[link.a], ids[link.b], link.bandwidth, link.latency);
  }
  for (int rank = 0; rank < nranks; ++rank) {
    const Topology& own = views[rank];
    if (own.rankNode(rank) < 0)
      return LOOM_FAIL(loomInvalidUsage, TOPO, "rank %d's topology does not place rank %d", rank, rank);
    const std::string& name = own.node(own.rankNode(rank)).name;
    int host = hostOfRank[rank];
    int inBase = views[firstRank[host]].findNode(name);
    if (inBase < 0) {
      return LOOM_FAIL(loomInvalidUsage, TOPO,
                       "rank %d is placed on \"%s\", which rank %d's topology of the same host does not have", rank,
                       name.c_str(), firstRank[host]);
    }
    out.mapRank(rank, newIds[host][inBase]);
  }
  if (hosts > 1) {
    int network = out.addNode(NodeKind::kNetSwitch, "net0", -1, {{"model", "one switch joining the hosts"}});
    for (int host = 0; host < hosts; ++host) {
      bool linked = false;
      for (int id : newIds[host]) {
        const TopoNode& node = out.node(id);
        if (node.kind != NodeKind::kNic) continue;
        double gbps = doubleAttribute(node.attrs, "speed", figures::kUnknownNicGbps);
        bool verbs = attributeOr(node.attrs, "fabric", "") == "ib";
        out.addLink(LinkKind::kNetwork, id, network, gbps / 8,
                    verbs ? figures::kNicLatencyIb : figures::kNicLatencyEthernet);
        linked = true;
      }
      if (!linked) {
        out.addLink(LinkKind::kNetwork, out.hostNode(host), network, figures::kPlainNetwork,
                    figures::kPlainNetworkLatency);
      }
    }
  }
  setAttribute(&out.attributes(), "source",
               "fused from " + std::to_string(nranks) + " ranks on " + std::to_string(hosts) + " hosts");
  std::string problem = out.validate();
  if (!problem.empty()) return LOOM_FAIL(loomInternalError, TOPO, "fused topology is invalid: %s", problem.c_str());
  *fused = std::move(out);
  return loomSuccess;
}

}  // namespace loom
