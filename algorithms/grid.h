// Ranks as the points of a grid, and the collectives that run as rings along one grid level at a time: what the
// torus and the hierarchical (host, then across hosts) algorithms share. grid.cc has the algorithms in prose.
#pragma once

#include <vector>

#include "algorithms/builders.h"

namespace loom {

// Every rank has one coordinate per level; levels are listed in the order the reduce-scatters run (a torus:
// dimension 0 first; hierarchical: the position on the host first, then the host). A rank's ring at level i is
// the ranks that share all its other coordinates, its position there its coordinate i. Every combination of
// coordinates must be some rank.
class Grid {
 public:
  // coords: nranks rows of sizes.size() coordinates, row r for rank r.
  Grid(std::vector<int> sizes, std::vector<int> coords);
  int levels() const { return static_cast<int>(sizes_.size()); }
  int size(int level) const { return sizes_[level]; }
  int coord(int rank, int level) const { return coords_[static_cast<size_t>(rank) * sizes_.size() + level]; }
  // The rank at `position` of `rank`'s ring at `level` (taken mod the ring's size).
  int rankAt(int rank, int level, int position) const;
  // The ranks whose coordinates before `level` are `rank`'s and whose coordinate `level` is `position`, in an
  // order every such rank computes alike: the blocks chunk `position` holds when the reduce-scatter of `level`
  // starts (and when the all-gather of `level` ends).
  std::vector<int> chunkRanks(int rank, int level, int position) const;

 private:
  int rankOfCoords(const std::vector<int>& coords) const;

  std::vector<int> sizes_;
  std::vector<int> coords_;
  std::vector<int> rankTable_;  // by mixed-radix index of the coordinates (level 0 slowest)
};

// The grid algorithms, named `name` in the plan. Levels of size 1 are skipped.
RankPlan gridAllReduce(const CollArgs& args, const Grid& grid, const char* name);
RankPlan gridReduceScatter(const CollArgs& args, const Grid& grid, const char* name);
RankPlan gridAllGather(const CollArgs& args, const Grid& grid, const char* name);
// Two levels only: a scatter over the root's level-0 ring, chains along level 1, an all-gather along level 0.
RankPlan gridBroadcast(const CollArgs& args, const Grid& grid, const char* name);

}  // namespace loom
