// describeTopology (describe.h). The tree of a host follows its SMP and PCIe links from the host node, children
// in node order; the links the tree does not use are listed under their node, grouped by kind, with long lists
// (a torus chip's or a spine's) summarised.
#include "src/topology/describe.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

namespace loom {
namespace {

std::string format(const char* fmt, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), fmt, value);
  return text;
}

std::string rate(double gigabytes) { return format("%g", gigabytes) + " GB/s"; }

class Describer {
 public:
  Describer(const Topology& topo, const DescribeOptions& options)
      : topo_(topo),
        options_(options),
        ranksOf_(topo.nodeCount()),
        membersOf_(topo.hostCount()),
        linksOf_(topo.nodeCount()),
        inTree_(topo.linkCount(), false),
        visited_(topo.nodeCount(), false) {
    for (int id = 0; id < topo.nodeCount(); ++id)
      if (topo.node(id).host >= 0) membersOf_[topo.node(id).host].push_back(id);
    for (int rank = 0; rank < topo.rankCount(); ++rank)
      if (topo.rankNode(rank) >= 0) ranksOf_[topo.rankNode(rank)].push_back(rank);
    for (int id = 0; id < topo.linkCount(); ++id) {
      linksOf_[topo.link(id).a].push_back(id);
      if (topo.link(id).b != topo.link(id).a) linksOf_[topo.link(id).b].push_back(id);
    }
  }

  std::string run() {
    std::string source = attributeOr(topo_.attributes(), "source", "");
    out_ += "topology" + (source.empty() ? "" : " (" + source + ")") + ": " + std::to_string(topo_.hostCount()) +
            (topo_.hostCount() == 1 ? " host, " : " hosts, ") + std::to_string(topo_.nodeCount()) + " nodes, " +
            std::to_string(topo_.linkCount()) + " links, " + std::to_string(placedRanks()) +
            (placedRanks() == 1 ? " rank\n" : " ranks\n");
    int hosts = topo_.hostCount();
    int shown = options_.maxHosts > 0 ? std::min(hosts, options_.maxHosts) : hosts;
    for (int host = 0; host < shown; ++host) describeHost(host);
    if (shown < hosts) out_ += "(" + std::to_string(hosts - shown) + " more hosts)\n";
    std::vector<int> switches;
    for (int id = 0; id < topo_.nodeCount(); ++id)
      if (topo_.node(id).host < 0) switches.push_back(id);
    if (!switches.empty()) {
      out_ += "network: " + std::to_string(switches.size()) + " switches\n";
      int limit = options_.maxSwitches > 0 ? std::min<int>(switches.size(), options_.maxSwitches) : switches.size();
      for (int i = 0; i < limit; ++i) {
        line(1, switches[i], -1);
        otherLinks(1, switches[i]);
      }
      if (limit < static_cast<int>(switches.size()))
        out_ += "  (" + std::to_string(switches.size() - limit) + " more switches)\n";
    }
    return out_;
  }

 private:
  int placedRanks() const {
    int placed = 0;
    for (int rank = 0; rank < topo_.rankCount(); ++rank) placed += topo_.rankNode(rank) >= 0;
    return placed;
  }

  // The node's name without its host's prefix when printed inside that host.
  std::string shortName(int id, int host) const {
    const std::string& name = topo_.node(id).name;
    if (host < 0) return name;
    const std::string& prefix = topo_.node(topo_.hostNode(host)).name;
    if (name.size() > prefix.size() + 1 && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '/')
      return name.substr(prefix.size() + 1);
    return name;
  }

  void line(int depth, int id, int viaLink) {
    const TopoNode& node = topo_.node(id);
    out_ += std::string(2 * depth, ' ') + shortName(id, node.host) + " (" + nodeKindName(node.kind) + ")";
    for (const auto& [key, value] : node.attrs) out_ += " " + key + "=" + value;
    if (viaLink >= 0) {
      const TopoLink& link = topo_.link(viaLink);
      out_ += "  [" + std::string(linkKindName(link.kind)) + " " + rate(link.bandwidth) + ", " +
              format("%g", link.latency) + " us]";
    }
    const std::vector<int>& ranks = ranksOf_[id];
    if (!ranks.empty()) {
      out_ += ranks.size() == 1 ? "  rank " : "  ranks ";
      for (size_t i = 0; i < ranks.size() && i < 8; ++i) out_ += (i > 0 ? "," : "") + std::to_string(ranks[i]);
      if (ranks.size() > 8) out_ += ",... (" + std::to_string(ranks.size()) + ")";
    }
    out_ += "\n";
  }

  // Links of `id` that the tree does not show, one line per kind.
  void otherLinks(int depth, int id) {
    std::map<LinkKind, std::vector<int>> byKind;
    for (int link : linksOf_[id])
      if (!inTree_[link]) byKind[topo_.link(link).kind].push_back(link);
    int host = topo_.node(id).host;
    for (const auto& [kind, links] : byKind) {
      out_ += std::string(2 * depth + 4, ' ') + linkKindName(kind) + ": ";
      if (links.size() <= 6) {
        for (size_t i = 0; i < links.size(); ++i) {
          const TopoLink& link = topo_.link(links[i]);
          std::string peer = link.a == link.b ? "self" : shortName(link.other(id), host);
          out_ += (i > 0 ? ", " : "") + peer + " " + rate(link.bandwidth);
        }
      } else {
        double total = 0;
        for (int link : links) total += topo_.link(link).bandwidth;
        out_ += std::to_string(links.size()) + " links (" + shortName(topo_.link(links[0]).other(id), host) +
                ", ...), " + rate(total) + " in all";
      }
      out_ += "\n";
    }
  }

  void tree(int depth, int id, int viaLink, int host) {
    visited_[id] = true;
    line(depth, id, viaLink);
    std::vector<std::pair<int, int>> children;  // (node, link)
    for (int link : linksOf_[id]) {
      const TopoLink& l = topo_.link(link);
      if (l.kind != LinkKind::kSmp && l.kind != LinkKind::kPcie) continue;
      int peer = l.other(id);
      if (visited_[peer] || topo_.node(peer).host != host) continue;
      visited_[peer] = true;
      inTree_[link] = true;
      children.emplace_back(peer, link);
    }
    otherLinks(depth, id);
    std::sort(children.begin(), children.end());
    for (const auto& [child, link] : children) tree(depth + 1, child, link, host);
  }

  void describeHost(int host) {
    tree(0, topo_.hostNode(host), -1, host);
    for (int id : membersOf_[host])
      if (!visited_[id]) tree(1, id, -1, host);
  }

  const Topology& topo_;
  DescribeOptions options_;
  std::vector<std::vector<int>> ranksOf_;
  std::vector<std::vector<int>> membersOf_;  // nodes of each host
  std::vector<std::vector<int>> linksOf_;
  std::vector<bool> inTree_;
  std::vector<bool> visited_;
  std::string out_;
};

}  // namespace

std::string describeTopology(const Topology& topo, const DescribeOptions& options) {
  return Describer(topo, options).run();
}

}  // namespace loom
