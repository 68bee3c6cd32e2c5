// Hierarchical algorithms: ranks grouped by host (CollArgs::hostOf), fast links within a host, the network
// between hosts. A rank's local rank is its index among its host's ranks (in rank order).
//
// AllReduce, ReduceScatter, AllGather and Broadcast are the grid algorithms (grid.cc) on the grid whose level 0
// is the local rank and level 1 the host:
// - AllReduce: intra-host reduce-scatter, then an inter-host ring all-reduce of its 1/L share by the ranks of
//   each local rank (one ring per local rank: per NIC on a rail-optimised network), then an intra-host
//   all-gather. Across hosts each rank sends 2 (H-1)/H of 1/L of the data, where a flat ring sends 2 (n-1)/n
//   of all of it through each host's single ring edge.
// - ReduceScatter and AllGather: the same halves, over the per-rank blocks.
// - Broadcast: the root scatters over its host, each local rank runs a chain across hosts, hosts all-gather.
// These need every host to have the same number of ranks L; otherwise they run one bidirectional ring over all
// ranks (level 0 of size 1).
//
// AllToAll (as DeepEP's node-grouped dispatch): first, within each host, rank (h, l) gives each local peer
// (h, m) the blocks it has for every rank with local rank m, on any host; the peer keeps those for its own host
// and stores the others in scratch by (destination host, source local rank). Then rank (h, m) sends each other
// host g, in one message, the L blocks that host g's rank m gets from host h, so each pair of hosts exchanges L
// messages of L blocks (one per local rank, on its own rail) instead of L*L single blocks. Steps: L-1 rounds of
// H blocks within the host, H-1 messages between hosts. When a host's ranks are not numbered consecutively, or
// with several channels, the host-to-host messages go block by block (the receiver's blocks are not contiguous).
// Unequal hosts: pairwise exchange (pairwise.cc's order) over all ranks.
#include <vector>

#include "algorithms/grid.h"
#include "algorithms/hosts.h"

namespace loom {
namespace {

int mod(int value, int n) { return ((value % n) + n) % n; }

// Level 0: local rank; level 1: host. Hosts of unequal size: one ring over all ranks as level 1.
Grid hostGrid(const CollArgs& args) {
  Hosts hosts = hostsOf(args.hostOf, args.nranks);
  std::vector<int> coords;
  if (hosts.perHost == 0) {
    for (int r = 0; r < args.nranks; ++r) coords.insert(coords.end(), {0, r});
    return Grid({1, args.nranks}, coords);
  }
  for (int r = 0; r < args.nranks; ++r) coords.insert(coords.end(), {hosts.local[r], hosts.host[r]});
  return Grid({hosts.perHost, hosts.count}, coords);
}

}  // namespace

RankPlan buildHierarchicalAllReduce(const CollArgs& args) {
  return gridAllReduce(args, hostGrid(args), "hierarchical");
}
RankPlan buildHierarchicalReduceScatter(const CollArgs& args) {
  return gridReduceScatter(args, hostGrid(args), "hierarchical");
}
RankPlan buildHierarchicalAllGather(const CollArgs& args) {
  return gridAllGather(args, hostGrid(args), "hierarchical");
}
RankPlan buildHierarchicalBroadcast(const CollArgs& args) {
  return gridBroadcast(args, hostGrid(args), "hierarchical");
}

RankPlan buildHierarchicalAllToAll(const CollArgs& args) {
  Hosts hosts = hostsOf(args.hostOf, args.nranks);
  if (hosts.perHost == 0) {
    RankPlan plan = buildPairwiseAllToAll(args);
    plan.algorithm = "hierarchical";
    return plan;
  }
  RankPlan plan = planShell(args, "hierarchical");
  int rank = args.rank, h = hosts.host[rank], l = hosts.local[rank];
  int nHosts = hosts.count, perHost = hosts.perHost;
  const std::vector<std::vector<int>>& members = hosts.members;
  // Scratch: the block for rank (g, l) from local rank m of this host, at (g * perHost + m) * count.
  plan.scratchCount = static_cast<size_t>(nHosts) * perHost * args.count;
  bool aggregate = hosts.consecutive && args.nChannels == 1;
  for (int c = 0; c < args.nChannels; ++c) {
    if (partCount(args.count, args.nChannels, c) == 0) continue;
    auto block = [&](Buffer buffer, size_t index) {
      return blockPart(buffer, args.count, args.nChannels, c, static_cast<int>(index));
    };
    auto staged = [&](int g, int m) { return block(Buffer::kScratch, static_cast<size_t>(g) * perHost + m); };
    Lane lane{c, {}};
    // Within the host: at step t send to local rank l + t the blocks for its rail, take those of l - t.
    lane.steps.push_back(copy(block(Buffer::kInput, rank), block(Buffer::kOutput, rank)));
    for (int g = 0; g < nHosts; ++g)
      if (g != h) lane.steps.push_back(copy(block(Buffer::kInput, members[g][l]), staged(g, l)));
    for (int t = 1; t < perHost; ++t) {
      int to = members[h][mod(l + t, perHost)], from = members[h][mod(l - t, perHost)];
      int m = mod(l - t, perHost);
      for (int g = 0; g < nHosts; ++g) {
        lane.steps.push_back(send(to, block(Buffer::kInput, members[g][mod(l + t, perHost)])));
        lane.steps.push_back(recv(from, g == h ? block(Buffer::kOutput, from) : staged(g, m)));
      }
    }
    // Between hosts, on this local rank's rail: at step t send host h + t its blocks, take those of h - t.
    if (nHosts > 1) lane.startPhase();
    for (int t = 1; t < nHosts; ++t) {
      int g = mod(h + t, nHosts), f = mod(h - t, nHosts);
      int to = members[g][l], from = members[f][l];
      if (aggregate) {
        Region out = staged(g, 0), in = block(Buffer::kOutput, members[f][0]);
        out.count = in.count = static_cast<size_t>(perHost) * args.count;
        lane.steps.push_back(send(to, out));
        lane.steps.push_back(recv(from, in));
      } else {
        for (int m = 0; m < perHost; ++m) {
          lane.steps.push_back(send(to, staged(g, m)));
          lane.steps.push_back(recv(from, block(Buffer::kOutput, members[f][m])));
        }
      }
    }
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

}  // namespace loom
