// Ranks grouped by host (CollArgs::hostOf, loomComm::hostOf): each host's ranks in order and each rank's place
// among them. The hierarchical algorithms and the expert dispatch's per-host forwarding both start from it.
#pragma once

#include <span>
#include <vector>

namespace loom {

struct Hosts {
  int count = 1;                          // H
  int perHost = 0;                        // L, when every host has the same number of ranks; else 0
  std::vector<int> host, local;           // per rank: its host, and its place among that host's ranks
  std::vector<std::vector<int>> members;  // per host, its ranks in order
  bool consecutive = true;                // every host's ranks are consecutive numbers
};

// `hostOf` per rank (any other size: one host of `nranks` ranks).
Hosts hostsOf(std::span<const int> hostOf, int nranks);

}  // namespace loom
