// The rank grid and its communicators (mesh.h).
#include "parallel/mesh/mesh.h"

#include <algorithm>
#include <sstream>

#include "parallel/check.h"

namespace loom::parallel {
namespace {

std::vector<std::string> split(const std::string& dims) {
  std::vector<std::string> names;
  std::stringstream stream(dims);
  for (std::string name; std::getline(stream, name, '-');) names.push_back(name);
  return names;
}

}  // namespace

bool Mesh::make(const std::string& order, const std::map<std::string, int>& sizes, int world, Mesh* out,
                std::string* error) {
  Mesh mesh;
  mesh.names_ = split(order);
  if (mesh.names_.empty()) {
    *error = "the order \"" + order + "\" names no dimension";
    return false;
  }
  for (size_t i = 0; i < mesh.names_.size(); ++i) {
    const std::string& name = mesh.names_[i];
    if (name.empty() || std::count(mesh.names_.begin(), mesh.names_.end(), name) > 1) {
      *error = "the order \"" + order + "\" has an empty or repeated dimension";
      return false;
    }
  }
  for (const auto& [name, size] : sizes) {
    // A dimension the order does not name may only be 1 (Megatron's generator leaves such ones out).
    if (std::find(mesh.names_.begin(), mesh.names_.end(), name) == mesh.names_.end() && size != 1) {
      *error = "size given for \"" + name + "\", which the order \"" + order + "\" does not name";
      return false;
    }
    if (size < 1) {
      *error = name + " " + std::to_string(size) + " is below 1";
      return false;
    }
  }
  long long product = 1, stride = 1;
  for (const std::string& name : mesh.names_) {
    const auto found = sizes.find(name);
    const int size = found == sizes.end() ? 1 : found->second;
    mesh.sizes_.push_back(size);
    mesh.strides_.push_back(static_cast<int>(stride));
    stride *= size;
    product *= size;
  }
  if (product != world) {
    std::string text;
    for (size_t i = 0; i < mesh.names_.size(); ++i)
      text += (i ? " x " : "") + mesh.names_[i] + "=" + std::to_string(mesh.sizes_[i]);
    *error = text + " is " + std::to_string(product) + " ranks, not the world's " + std::to_string(world);
    return false;
  }
  mesh.world_ = world;
  *out = std::move(mesh);
  return true;
}

int Mesh::size(const std::string& dim) const {
  const auto at = std::find(names_.begin(), names_.end(), dim);
  return at == names_.end() ? 1 : sizes_[at - names_.begin()];
}

int Mesh::coordinate(int rank, const std::string& dim) const {
  const auto at = std::find(names_.begin(), names_.end(), dim);
  if (at == names_.end()) return 0;
  const size_t i = at - names_.begin();
  return rank / strides_[i] % sizes_[i];
}

bool Mesh::knows(const std::string& dims, std::string* error) const {
  for (const std::string& name : split(dims))
    if (std::find(names_.begin(), names_.end(), name) == names_.end()) {
      *error = "\"" + name + "\" is not a dimension of the mesh";
      return false;
    }
  return true;
}

std::vector<bool> Mesh::selected(const std::string& dims) const {
  std::vector<bool> in(names_.size(), false);
  for (const std::string& name : split(dims)) {
    const auto at = std::find(names_.begin(), names_.end(), name);
    if (at != names_.end()) in[at - names_.begin()] = true;
  }
  return in;
}

std::vector<int> Mesh::group(const std::string& dims, int rank) const {
  const std::vector<bool> in = selected(dims);
  // The rank with the selected coordinates zeroed, then every combination of them, first dimension fastest.
  int base = rank;
  for (size_t i = 0; i < names_.size(); ++i)
    if (in[i]) base -= coordinate(rank, names_[i]) * strides_[i];
  std::vector<int> members{base};
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!in[i]) continue;
    const size_t before = members.size();
    for (int k = 1; k < sizes_[i]; ++k)
      for (size_t j = 0; j < before; ++j) members.push_back(members[j] + k * strides_[i]);
  }
  std::sort(members.begin(), members.end());
  return members;
}

int Mesh::groupIndex(const std::string& dims, int rank) const {
  const std::vector<bool> in = selected(dims);
  int index = 0, scale = 1;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (in[i]) continue;
    index += coordinate(rank, names_[i]) * scale;
    scale *= sizes_[i];
  }
  return index;
}

std::vector<std::vector<int>> Mesh::groups(const std::string& dims) const {
  std::vector<std::vector<int>> all;
  for (int rank = 0; rank < world_; ++rank)
    if (group(dims, rank).front() == rank) all.push_back(group(dims, rank));
  std::sort(all.begin(), all.end(), [&](const std::vector<int>& a, const std::vector<int>& b) {
    return groupIndex(dims, a.front()) < groupIndex(dims, b.front());
  });
  return all;
}

bool ParallelMeshes::make(const ParallelSizes& sizes, int world, ParallelMeshes* out, std::string* error) {
  const int etp = sizes.etp > 0 ? sizes.etp : sizes.tp;
  ParallelMeshes meshes;
  if (!Mesh::make(sizes.order, {{"tp", sizes.tp}, {"cp", sizes.cp}, {"dp", sizes.dp}, {"pp", sizes.pp}}, world,
                  &meshes.dense, error))
    return false;
  if (meshes.dense.order().back() != "pp") {
    *error = "the order \"" + sizes.order + "\" must end with pp, which the expert mesh shares";
    return false;
  }
  const long long folded = static_cast<long long>(etp) * sizes.ep * sizes.pp;
  if (sizes.ep < 1 || etp < 1 || world % folded != 0) {
    *error = "etp x ep x pp = " + std::to_string(folded) + " does not divide the world's " + std::to_string(world) +
             " ranks";
    return false;
  }
  const int edp = static_cast<int>(world / folded);
  if (!Mesh::make(sizes.order, {{"tp", etp}, {"ep", sizes.ep}, {"dp", edp}, {"pp", sizes.pp}}, world, &meshes.expert,
                  error))
    return false;
  *out = std::move(meshes);
  return true;
}

MeshComms::MeshComms(loomComm_t world, const Mesh& mesh, const std::vector<std::string>& dimSets) {
  int rank = 0;
  loomCommUserRank(world, &rank);
  for (const std::string& dims : dimSets) {
    const std::vector<int> members = mesh.group(dims, rank);
    const int key = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    loomComm_t comm = nullptr;
    LOOM_PAR_CHECK(world, loomCommSplit(world, mesh.groupIndex(dims, rank), key, &comm, nullptr));
    comms_[dims] = comm;
  }
}

MeshComms::~MeshComms() {
  for (auto& [dims, comm] : comms_) loomCommDestroy(comm);
}

loomComm_t MeshComms::get(const std::string& dims) const {
  const auto found = comms_.find(dims);
  return found == comms_.end() ? nullptr : found->second;
}

}  // namespace loom::parallel
