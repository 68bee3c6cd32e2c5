// The local host's topology and identity: discovery through hwloc (a minimal host from sysconf when loom is built
// without it), the LOOM_TOPO_FILE / LOOM_TOPO_DUMP_FILE handling that gives a rank its local view, and the host
// hash by which ranks learn which of them share a machine. Fusing the ranks' views is fuse.h's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/loom.h"
#include "src/topology/topology.h"

namespace loom {

// Where a rank runs, to place it in its local view.
struct LocalPlacement {
  int rank = 0;
  std::string gpuBusId;  // PCI address of the rank's GPU ("0000:1b:00.0"); empty for a CPU rank
};

// Whether discovery uses hwloc (loom built with libhwloc) or the minimal fallback.
bool discoveryUsesHwloc();

// Replaces *topo with this host as host 0: NUMA nodes with their cores, the PCI tree down to GPUs and NICs
// (PCI switches where the tree fans out), NVLink is not visible to hwloc and is left out. No rank is placed.
loomResult_t discoverLocalTopology(Topology* topo);

// The same from an hwloc XML export (`lstopo --of xml`) of another machine, so that discovery can be checked on
// machines no one here has; NIC speeds, which come from this host's sysfs, are left out. Needs hwloc.
loomResult_t discoverFromHwlocXml(const std::string& path, Topology* topo);

// Places self.rank in *topo, which must describe one host: on the GPU whose busid matches self.gpuBusId, or for
// a CPU rank on the NUMA node the calling thread runs on (the first NUMA node when that is unknown).
loomResult_t placeLocalRank(const LocalPlacement& self, Topology* topo);

// A rank's local view: read from LOOM_TOPO_FILE when set (a file that already places self.rank is used as is),
// discovered otherwise; self.rank placed; then written to LOOM_TOPO_DUMP_FILE when set, where %h, %p and %r
// expand to the host name, the process id and the rank.
loomResult_t loadLocalTopology(const LocalPlacement& self, Topology* topo);

// The machine's own identity, whatever LOOM_HOSTID says: the hash of the host name and the kernel's boot id.
// Transports compare it to know which peers share memory with this process.
uint64_t machineHash();
// This machine's identity: the hash of LOOM_HOSTID when set, else of the host name and the kernel's boot id
// (so that containers sharing a host name on different machines differ).
uint64_t localHostHash();
uint64_t hostHashOf(std::string_view identity);

}  // namespace loom
