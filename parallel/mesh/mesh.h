// The rank grid of a parallel layout (Megatron's RankGenerator): the world's ranks laid out over named dimensions in
// an order whose first dimension varies fastest (default "tp-cp-ep-dp-pp"), so that rank = tp + TP (cp + CP (ep +
// EP (dp + DP pp))). A group along some dimensions is the ranks that differ only in those; groups are numbered by
// the other dimensions, first fastest, as Megatron numbers them. With tp=2, dp=3, pp=4: dp group 0 is [0, 2, 4] and
// dp group 7 is [19, 21, 23].
//
// Expert layers may fold the same ranks differently (Megatron's parallel folding): an expert mesh of (etp, ep,
// edp, pp) over the world, sharing the dense mesh's pipeline groups (pp is the slowest dimension of both), so that
// attention can use tp x dp while the experts use etp x ep x edp on the same stage's ranks.
//
// MeshComms makes the communicators of the groups a rank belongs to, with loomCommSplit.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace loom::parallel {

class Mesh {
 public:
  Mesh() = default;
  // The mesh of `world` ranks with the dimensions of `order` ("tp-cp-ep-dp-pp": names separated by '-', first
  // fastest), each of the size `sizes` gives it (1 when absent; a name the order leaves out may be given size 1).
  // False, with *error naming the problem, for a size other than 1 of a name the order lacks, a repeated name, a
  // size below 1, or sizes whose product is not the world.
  static bool make(const std::string& order, const std::map<std::string, int>& sizes, int world, Mesh* out,
                   std::string* error);

  int world() const { return world_; }
  const std::vector<std::string>& order() const { return names_; }
  int size(const std::string& dim) const;  // 1 for a name not in the order
  int coordinate(int rank, const std::string& dim) const;
  // The ranks of `rank`'s group along `dims` ("dp", or "tp-pp" for several), ascending.
  std::vector<int> group(const std::string& dims, int rank) const;
  // The number of `rank`'s group along `dims` among groups(dims).
  int groupIndex(const std::string& dims, int rank) const;
  // Every group along `dims`, numbered by the other dimensions (first fastest).
  std::vector<std::vector<int>> groups(const std::string& dims) const;
  // Whether every name of `dims` is a dimension of this mesh; *error says which is not.
  bool knows(const std::string& dims, std::string* error) const;

 private:
  std::vector<bool> selected(const std::string& dims) const;  // by dimension: whether `dims` names it
  std::vector<std::string> names_;
  std::vector<int> sizes_, strides_;
  int world_ = 0;
};

// A layout's sizes. etp 0 means the expert layers use tp; edp follows from the world.
struct ParallelSizes {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int ep = 1, etp = 0;
  std::string order = "tp-cp-ep-dp-pp";
};

// The dense mesh (tp, cp, dp, pp) and the expert mesh (etp, ep, edp, pp) of one world.
struct ParallelMeshes {
  Mesh dense, expert;
  static bool make(const ParallelSizes& sizes, int world, ParallelMeshes* out, std::string* error);
};

// The communicators of a rank's groups in a mesh, one per dimension set, split from `world` (collective over it:
// every rank asks for the same sets in the same order). Destroys them with itself.
class MeshComms {
 public:
  MeshComms(loomComm_t world, const Mesh& mesh, const std::vector<std::string>& dimSets);
  ~MeshComms();
  MeshComms(const MeshComms&) = delete;
  MeshComms& operator=(const MeshComms&) = delete;
  // The communicator of `dims` (one of the sets given); null for another.
  loomComm_t get(const std::string& dims) const;

 private:
  std::map<std::string, loomComm_t> comms_;
};

}  // namespace loom::parallel
