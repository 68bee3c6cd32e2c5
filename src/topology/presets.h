// Built-in topologies of systems no one here has, one rank per accelerator. docs/TOPOLOGY.md gives each one's
// figures and where they come from (src/topology/figures.h holds them).
//
//   dgx-h100              8 H100 on 4 NVSwitches, 2 sockets, 8 PCIe Gen5 switches each with a GPU and a 400G NIC
//   pcie-8gpu             8 GPUs on 4 PCIe Gen4 switches under 2 sockets, 2 x 100G NICs, no NVLink
//   torus2d:AxB[:GBps]    A*B chips, each linked to its +-1 neighbours in both dimensions with wrap-around
//   torus3d:AxBxC[:GBps]  the same in three dimensions (TPU-style); 4 chips per host
//   fattree:N             N dgx-h100 nodes on a rail-optimised, non-blocking two-level fat tree
//   fullmesh:N            N NPUs, every pair directly linked (Ascend-style super node); 8 NPUs per host
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/topology/topology.h"

namespace loom {

// Replaces *topo with the preset `spec`. On a spec that names no preset or has bad parameters, returns false with
// *error saying what was wrong and leaves *topo alone.
bool makePreset(std::string_view spec, Topology* topo, std::string* error);

// A preset's name, or the path of a topology XML file (one that exists, holds a '/' or ends in ".xml"): what the
// tools' --topo takes. False with *error on either's failure.
bool loadTopologySpec(const std::string& spec, Topology* topo, std::string* error);

// One line per preset: its syntax and what it builds (for usage messages).
std::vector<std::string> presetUsage();

}  // namespace loom
