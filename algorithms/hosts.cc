#include "algorithms/hosts.h"

namespace loom {

Hosts hostsOf(std::span<const int> hostOf, int n) {
  Hosts hosts;
  hosts.host.assign(n, 0);
  if (static_cast<int>(hostOf.size()) == n) hosts.host.assign(hostOf.begin(), hostOf.end());
  for (int r = 0; r < n; ++r) {
    if (hosts.host[r] >= static_cast<int>(hosts.members.size())) hosts.members.resize(hosts.host[r] + 1);
    hosts.local.push_back(static_cast<int>(hosts.members[hosts.host[r]].size()));
    hosts.members[hosts.host[r]].push_back(r);
  }
  hosts.count = static_cast<int>(hosts.members.size());
  hosts.perHost = static_cast<int>(hosts.members[0].size());
  for (const std::vector<int>& ranks : hosts.members) {
    if (static_cast<int>(ranks.size()) != hosts.perHost) hosts.perHost = 0;
    if (!ranks.empty() && ranks.back() - ranks.front() + 1 != static_cast<int>(ranks.size())) hosts.consecutive = false;
  }
  return hosts;
}

}  // namespace loom
