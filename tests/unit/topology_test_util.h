// What the topology tests share (topology_test.cc, topology_cluster_test.cc): presets made as an expectation, the
// fixtures' paths and text, and the checks of routes. No tests here.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/topology/presets.h"
#include "src/topology/topology.h"

namespace loom::topology_test {

inline Topology preset(const std::string& spec) {
  Topology topo;
  std::string error;
  EXPECT_TRUE(makePreset(spec, &topo, &error)) << spec << ": " << error;
  return topo;
}

inline std::string fixturePath(const std::string& name) {
  return std::string(LOOM_SOURCE_ROOT) + "/tests/fixtures/topo/" + name + ".xml";
}

inline std::string readText(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The route is a chain of links from `from` to `to` that visits no node twice.
inline void expectChain(const Topology& topo, int from, int to, const std::vector<int>& links,
                        const std::string& what) {
  ASSERT_FALSE(links.empty()) << what << ": no route";
  std::vector<int> nodes = topo.nodesAlong(from, links);
  std::set<int> distinct(nodes.begin(), nodes.end());
  EXPECT_EQ(distinct.size(), nodes.size()) << what << ": the route visits a node twice";
  for (size_t i = 0; i < links.size(); ++i) {
    const TopoLink& link = topo.link(links[i]);
    ASSERT_TRUE(link.a == nodes[i] || link.b == nodes[i]) << what << ": link " << i << " does not continue the route";
  }
  EXPECT_EQ(nodes.back(), to) << what << ": the route ends at " << topo.node(nodes.back()).name;
}

inline std::vector<int> routeBetween(const Topology& topo, int rankA, int rankB) {
  std::vector<int> links = topo.route(topo.rankNode(rankA), topo.rankNode(rankB));
  expectChain(topo, topo.rankNode(rankA), topo.rankNode(rankB), links,
              "rank " + std::to_string(rankA) + " -> " + std::to_string(rankB));
  return links;
}

inline bool routeVisits(const Topology& topo, int rankA, const std::vector<int>& links, const std::string& name) {
  for (int node : topo.nodesAlong(topo.rankNode(rankA), links))
    if (topo.node(node).name == name) return true;
  return false;
}

// Hops between chips a and b of a torus with wrap-around.
inline int torusDistance(const std::vector<int>& dims, int a, int b) {
  int hops = 0;
  for (int size : dims) {
    int delta = std::abs(a % size - b % size);
    hops += std::min(delta, size - delta);
    a /= size;
    b /= size;
  }
  return hops;
}

}  // namespace loom::topology_test
