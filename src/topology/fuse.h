// Fusion: the communicator's topology from the local views its ranks exchange at init.
#pragma once

#include <cstdint>
#include <span>

#include "loom/loom.h"
#include "src/topology/topology.h"

namespace loom {

// Builds *fused from views[r], rank r's local view (which places rank r), and hostHashOfRank[r], its host's
// identity (localHostHash()). Ranks with one hash share one host: the view of the lowest of them supplies the
// host's subgraph once, renamed "host<k>/..." with hosts numbered by their lowest rank, and each rank goes to the
// node of its own view with the same name. With several hosts, one network switch "net0" joins them: every NIC
// of a host links to it at its port speed, and a host with no NIC links its host node to it with a plain link
// (figures::kPlainNetwork).
//
// A view that already spans several hosts (a whole-cluster LOOM_TOPO_FILE) is used as it is; every rank must then
// hold the same one and it must place every rank. Mismatches fail with loomInvalidUsage, naming the rank.
loomResult_t fuseViews(std::span<const Topology> views, std::span<const uint64_t> hostHashOfRank, Topology* fused);

}  // namespace loom
