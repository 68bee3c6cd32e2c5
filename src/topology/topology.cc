// The topology graph's data: kinds, attributes, building, validation and comparison. Routing lives in route.cc.
#include "src/topology/topology.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace loom {
namespace {

constexpr const char* kNodeKindNames[kNodeKinds] = {"host", "numa", "pciswitch", "gpu", "nvswitch", "nic", "netswitch"};
constexpr const char* kLinkKindNames[kLinkKinds] = {"nvlink", "pcie", "shm", "smp", "network"};

// Attribute keys become XML attribute names: a letter or '_' first, then letters, digits, '_', '-', '.'.
bool isAttributeName(std::string_view key) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (key.empty() || !letter(key[0])) return false;
  for (char c : key)
    if (!letter(c) && !(c >= '0' && c <= '9') && c != '-' && c != '.') return false;
  return true;
}

}  // namespace

const char* nodeKindName(NodeKind kind) { return kNodeKindNames[static_cast<int>(kind)]; }
const char* linkKindName(LinkKind kind) { return kLinkKindNames[static_cast<int>(kind)]; }

bool parseNodeKind(std::string_view name, NodeKind* kind) {
  for (int k = 0; k < kNodeKinds; ++k) {
    if (name == kNodeKindNames[k]) {
      *kind = static_cast<NodeKind>(k);
      return true;
    }
  }
  return false;
}

bool parseLinkKind(std::string_view name, LinkKind* kind) {
  for (int k = 0; k < kLinkKinds; ++k) {
    if (name == kLinkKindNames[k]) {
      *kind = static_cast<LinkKind>(k);
      return true;
    }
  }
  return false;
}

const std::string* findAttribute(const Attributes& attrs, std::string_view key) {
  for (const auto& [name, value] : attrs)
    if (name == key) return &value;
  return nullptr;
}

std::string attributeOr(const Attributes& attrs, std::string_view key, std::string_view fallback) {
  const std::string* value = findAttribute(attrs, key);
  return value != nullptr ? *value : std::string(fallback);
}

namespace {

template <typename Number>
Number numericAttribute(const Attributes& attrs, std::string_view key, Number fallback) {
  const std::string* text = findAttribute(attrs, key);
  if (text == nullptr) return fallback;
  Number value{};
  auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  return error == std::errc() && end == text->data() + text->size() ? value : fallback;
}

}  // namespace

int64_t intAttribute(const Attributes& attrs, std::string_view key, int64_t fallback) {
  return numericAttribute(attrs, key, fallback);
}

double doubleAttribute(const Attributes& attrs, std::string_view key, double fallback) {
  return numericAttribute(attrs, key, fallback);
}

void setAttribute(Attributes* attrs, std::string_view key, std::string value) {
  for (auto& [name, old] : *attrs) {
    if (name == key) {
      old = std::move(value);
      return;
    }
  }
  attrs->emplace_back(std::string(key), std::move(value));
}

int Topology::addHost(std::string name, Attributes attrs) {
  if (byName_.count(name) != 0) return -1;
  invalidate();
  int host = hostCount();
  int id = nodeCount();
  byName_.emplace(name, id);
  nodes_.push_back({NodeKind::kHost, std::move(name), host, std::move(attrs)});
  hostNodes_.push_back(id);
  return host;
}

int Topology::addNode(NodeKind kind, std::string name, int host, Attributes attrs) {
  if (kind == NodeKind::kHost || byName_.count(name) != 0) return -1;
  invalidate();
  int id = nodeCount();
  byName_.emplace(name, id);
  nodes_.push_back({kind, std::move(name), host, std::move(attrs)});
  return id;
}

int Topology::addLink(LinkKind kind, int a, int b, double bandwidth, double latency) {
  if (a < 0 || b < 0 || a >= nodeCount() || b >= nodeCount()) return -1;
  if ((a == b) != (kind == LinkKind::kSharedMemory)) return -1;
  invalidate();
  links_.push_back({kind, a, b, bandwidth, latency});
  return linkCount() - 1;
}

void Topology::mapRank(int rank, int node) {
  if (rank < 0) return;
  if (rank >= rankCount()) rankNodes_.resize(rank + 1, -1);
  rankNodes_[rank] = node;
}

int Topology::findNode(std::string_view name) const {
  auto found = byName_.find(std::string(name));
  return found == byName_.end() ? -1 : found->second;
}

int Topology::countNodes(NodeKind kind) const {
  int count = 0;
  for (const TopoNode& node : nodes_) count += node.kind == kind;
  return count;
}

int Topology::countLinks(LinkKind kind) const {
  int count = 0;
  for (const TopoLink& link : links_) count += link.kind == kind;
  return count;
}

int Topology::rankNode(int rank) const { return rank >= 0 && rank < rankCount() ? rankNodes_[rank] : -1; }

void Topology::setRankNic(int rank, const std::string& device) {
  if (rank < 0) return;
  if (rank >= static_cast<int>(rankNics_.size())) rankNics_.resize(rank + 1);
  rankNics_[rank] = device;
}

const std::string& Topology::rankNicDevice(int rank) const {
  static const std::string none;
  return rank >= 0 && rank < static_cast<int>(rankNics_.size()) ? rankNics_[rank] : none;
}

int Topology::rankNic(int rank) const {
  const std::string& device = rankNicDevice(rank);
  return device.empty() || rankHost(rank) < 0 ? -1 : nicOf(rankHost(rank), device);
}

int Topology::nicOf(int host, const std::string& device) const {
  for (int id = 0; id < nodeCount(); ++id) {
    const TopoNode& node = nodes_[id];
    if (node.kind != NodeKind::kNic || node.host != host) continue;
    for (const char* key : {"hca", "netdev"}) {
      std::string list = "," + attributeOr(node.attrs, key, "") + ",";
      if (list.find("," + device + ",") != std::string::npos) return id;
    }
  }
  return -1;
}

int Topology::rankHost(int rank) const {
  int node = rankNode(rank);
  return node < 0 ? -1 : nodes_[node].host;
}

std::vector<int> Topology::torusDims() const {
  std::vector<std::vector<int>> coords;
  std::vector<int> sizes;
  for (int r = 0; r < rankCount(); ++r) {
    int node = rankNode(r);
    const std::string* text = node < 0 ? nullptr : findAttribute(nodes_[node].attrs, "coords");
    if (text == nullptr) return {};
    std::vector<int> point;
    for (size_t start = 0; start <= text->size();) {
      size_t end = std::min(text->find(',', start), text->size());
      point.push_back(std::atoi(text->substr(start, end - start).c_str()));
      start = end + 1;
    }
    if (r > 0 && point.size() != sizes.size()) return {};
    sizes.resize(point.size(), 1);
    for (size_t d = 0; d < point.size(); ++d) sizes[d] = std::max(sizes[d], point[d] + 1);
    coords.push_back(std::move(point));
  }
  long points = 1;
  for (int size : sizes) points *= size;
  if (sizes.empty() || points != rankCount()) return {};
  for (int r = 0; r < rankCount(); ++r) {  // rank r must sit at index r, the first coordinate fastest
    long index = 0, stride = 1;
    for (size_t d = 0; d < sizes.size(); stride *= sizes[d], ++d) index += coords[r][d] * stride;
    if (index != r) return {};
  }
  return std::vector<int>(sizes.rbegin(), sizes.rend());
}

std::vector<int> Topology::linksOf(int node) const {
  std::vector<int> found;
  for (int id = 0; id < linkCount(); ++id)
    if (links_[id].a == node || links_[id].b == node) found.push_back(id);
  return found;
}

std::string Topology::validate() const {
  for (const auto& [key, value] : attrs_) {
    if (key == "version" || !isAttributeName(key))
      return "the topology has an attribute named \"" + key + "\", which is reserved or not an XML name";
  }
  for (int host = 0; host < hostCount(); ++host) {
    const TopoNode& node = nodes_[hostNodes_[host]];
    if (node.host != host) return "host node \"" + node.name + "\" has host index " + std::to_string(node.host);
  }
  for (const TopoNode& node : nodes_) {
    if (node.name.empty()) return "a node has an empty name";
    if (node.host < -1 || node.host >= hostCount()) {
      return "node \"" + node.name + "\" belongs to host " + std::to_string(node.host) + ", but there are " +
             std::to_string(hostCount()) + " hosts";
    }
    if (node.host == -1 && node.kind != NodeKind::kNetSwitch && node.kind != NodeKind::kNvSwitch) {
      return "node \"" + node.name + "\" of kind " + nodeKindName(node.kind) +
             " must belong to a host (only network switches and NVSwitches may have host -1)";
    }
    if (node.kind == NodeKind::kNetSwitch && node.host != -1)
      return "network switch \"" + node.name + "\" must have host -1";
    for (const auto& [key, value] : node.attrs) {
      if (key == "name" || key == "kind" || key == "host")
        return "node \"" + node.name + "\" has an attribute named \"" + key + "\", which is reserved";
      if (!isAttributeName(key))
        return "node \"" + node.name + "\" has an attribute named \"" + key + "\", which is not an XML name";
    }
  }
  for (const TopoLink& link : links_) {
    if (link.a < 0 || link.b < 0 || link.a >= nodeCount() || link.b >= nodeCount())
      return "a " + std::string(linkKindName(link.kind)) + " link joins a node that does not exist";
    std::string what =
        std::string(linkKindName(link.kind)) + " link " + nodes_[link.a].name + " - " + nodes_[link.b].name;
    if (!(link.bandwidth > 0) || !std::isfinite(link.bandwidth))
      return what + " has a bandwidth that is not a positive number";
    if (!(link.latency >= 0) || !std::isfinite(link.latency)) return what + " has a latency that is not a number >= 0";
    if ((link.a == link.b) != (link.kind == LinkKind::kSharedMemory))
      return what + ": only shared-memory links join a node to itself, and they join nothing else";
    if (link.kind != LinkKind::kNetwork && nodes_[link.a].host != nodes_[link.b].host &&
        link.kind != LinkKind::kNvLink) {
      return what + " crosses hosts; only network and NVLink-class links may";
    }
  }
  for (int rank = 0; rank < rankCount(); ++rank) {
    int node = rankNodes_[rank];
    if (node < -1 || node >= nodeCount()) return "rank " + std::to_string(rank) + " is placed on no valid node";
  }
  return "";
}

bool Topology::operator==(const Topology& other) const {
  // Ranks without a device and ranks never given one are alike (the XML writes neither).
  for (size_t r = 0; r < std::max(rankNics_.size(), other.rankNics_.size()); ++r)
    if (rankNicDevice(static_cast<int>(r)) != other.rankNicDevice(static_cast<int>(r))) return false;
  return nodes_ == other.nodes_ && links_ == other.links_ && rankNodes_ == other.rankNodes_ && attrs_ == other.attrs_;
}

}  // namespace loom
