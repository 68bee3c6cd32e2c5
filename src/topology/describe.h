// A topology as indented text, for people: each host as a tree of its SMP and PCIe links (host, NUMA nodes,
// PCI switches, devices), with every other link (NVLink, network, shared memory) listed under its node, then the
// network switches. Used by tools/loom-topo and by INFO logs.
#pragma once

#include <string>

#include "src/topology/topology.h"

namespace loom {

struct DescribeOptions {
  int maxHosts = 4;      // hosts printed in full; the rest are counted (0: all)
  int maxSwitches = 16;  // network switches printed; the rest are counted (0: all)
};

std::string describeTopology(const Topology& topo, const DescribeOptions& options = {});

}  // namespace loom
