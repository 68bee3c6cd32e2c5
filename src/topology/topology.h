// The topology graph: the hardware that ranks run on, as nodes (hosts, NUMA nodes, PCI switches, GPUs,
// NVSwitches, NICs, network switches) joined by typed links, each with a bandwidth and a latency, plus where each
// rank lives. It answers two questions for the tuner and the simulator: which links a transfer between two nodes
// crosses (route) and what that costs (path).
//
// The model keeps what those questions need and no more: no caches, no memory sizes per level, no PCI functions
// that carry no traffic. It is built by presets.cc, xml.cc, discover.cc and fuse.cc; docs/TOPOLOGY.md describes
// it for users.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom {

enum class NodeKind : uint8_t { kHost, kNuma, kPciSwitch, kGpu, kNvSwitch, kNic, kNetSwitch };
constexpr int kNodeKinds = 7;

// Link kinds in the order of how far they reach: a path's class is the largest kind on it (NVLink-only paths
// are kNvLink, any path that leaves the host is kNetwork). kNvLink stands for every direct accelerator fabric
// (NVLink, TPU ICI, Ascend HCCS). A kSharedMemory link joins a NUMA node to itself: the memory through which two
// processes bound to that node exchange data.
enum class LinkKind : uint8_t { kNvLink, kPcie, kSharedMemory, kSmp, kNetwork };
constexpr int kLinkKinds = 5;

// Names used in the XML dialect and in messages: "host", "numa", "pciswitch", "gpu", "nvswitch", "nic",
// "netswitch"; "nvlink", "pcie", "shm", "smp", "network".
const char* nodeKindName(NodeKind kind);
const char* linkKindName(LinkKind kind);
bool parseNodeKind(std::string_view name, NodeKind* kind);
bool parseLinkKind(std::string_view name, LinkKind* kind);

// A node's attributes, in the order they were set (the XML keeps that order). Keys loom reads:
//   busid      PCI address "dddd:bb:dd.f" (GPUs, NICs, PCI switches)
//   index      the device's index among its kind on its host (GPUs, NICs)
//   os_index   the operating system's NUMA node number
//   cores, pus physical cores and hardware threads (NUMA nodes and hosts)
//   speed      NIC port speed in Gb/s
//   fabric     NIC fabric: "ib" (InfiniBand or RoCE HCA) or "ethernet"
//   hostname   the machine's name (hosts)
//   model      free text: the product modelled or found
using Attributes = std::vector<std::pair<std::string, std::string>>;
const std::string* findAttribute(const Attributes& attrs, std::string_view key);
std::string attributeOr(const Attributes& attrs, std::string_view key, std::string_view fallback);
// The attribute as a number, or `fallback` when it is absent or not a number.
int64_t intAttribute(const Attributes& attrs, std::string_view key, int64_t fallback);
double doubleAttribute(const Attributes& attrs, std::string_view key, double fallback);
// Sets `key` (replacing its value when present).
void setAttribute(Attributes* attrs, std::string_view key, std::string value);

struct TopoNode {
  NodeKind kind;
  std::string name;  // unique in the topology, "host0/gpu3" for the members of host0
  int host;          // the host's index; -1 for network switches (and NVSwitches shared by several hosts)
  Attributes attrs;
  bool operator==(const TopoNode&) const = default;
};

// Links are full duplex: `bandwidth` is available in each direction at once.
struct TopoLink {
  LinkKind kind;
  int a, b;          // node ids; equal only for a kSharedMemory link
  double bandwidth;  // GB/s (1e9 bytes per second) in each direction
  double latency;    // microseconds, one way
  int other(int node) const { return node == a ? b : a; }
  bool operator==(const TopoLink&) const = default;
};

// What a transfer between two nodes (or ranks) meets on its route.
struct PathInfo {
  bool reachable = false;
  // The bottleneck in GB/s per direction. Where the route crosses a switch that has parallel twins joining the
  // same two neighbours (the four NVSwitches of a DGX, the spines of a fat tree), the twins' share is added, as
  // the hardware stripes a transfer over them. Infinite between two ranks on one node with no shared-memory link.
  double bandwidth = 0;
  double latency = 0;                          // microseconds: the links' latencies summed
  int hops = 0;                                // links crossed
  LinkKind slowest = LinkKind::kSharedMemory;  // the largest link kind on the route (see LinkKind)
};

// One switch a route crosses, with the twins that share its stage (PathInfo::bandwidth).
struct PathStage {
  int hop = 0;           // the switch is the node after the route's link `hop` (from 0)
  int twins = 1;         // switches of the stage, this one included
  double bandwidth = 0;  // GB/s the stage offers over all its twins
};

class Topology {
 public:
  Topology();
  Topology(const Topology& other);
  Topology(Topology&& other) noexcept;
  Topology& operator=(const Topology& other);
  Topology& operator=(Topology&& other) noexcept;
  ~Topology();

  // --- Building. Building is not thread safe; queries on a topology no one changes are.
  // Adds a host node; returns its host index (0, 1, ...). Its node id is hostNode(index).
  int addHost(std::string name, Attributes attrs = {});
  // Adds a node and returns its id, or -1 when `name` is already taken or `kind` is kHost (use addHost).
  int addNode(NodeKind kind, std::string name, int host, Attributes attrs = {});
  // Adds a link and returns its id, or -1 when an endpoint does not exist or a = b outside kSharedMemory.
  int addLink(LinkKind kind, int a, int b, double bandwidth, double latency);
  // Places `rank` on `node` (the GPU it drives, or for a CPU rank the NUMA node it is bound to).
  void mapRank(int rank, int node);
  // Records the network device `rank`'s connections to other hosts leave through ("mlx5_0", "eth0"), as its
  // network transport chose it, and the NIC node of its host that device belongs to (nicOf), if any.
  void setRankNic(int rank, const std::string& device);
  // Free-form attributes of the whole topology ("source": where it came from).
  Attributes& attributes() { return attrs_; }
  const Attributes& attributes() const { return attrs_; }

  // --- Reading.
  int nodeCount() const { return static_cast<int>(nodes_.size()); }
  int linkCount() const { return static_cast<int>(links_.size()); }
  const TopoNode& node(int id) const { return nodes_[id]; }
  const TopoLink& link(int id) const { return links_[id]; }
  std::span<const TopoNode> nodes() const { return nodes_; }
  std::span<const TopoLink> links() const { return links_; }
  int findNode(std::string_view name) const;  // -1 when absent
  int countNodes(NodeKind kind) const;
  int countLinks(LinkKind kind) const;
  int hostCount() const { return static_cast<int>(hostNodes_.size()); }
  int hostNode(int host) const { return hostNodes_[host]; }
  // Ranks 0 .. rankCount()-1; rankNode is -1 for a rank this view does not place (a rank's local view places
  // only itself).
  int rankCount() const { return static_cast<int>(rankNodes_.size()); }
  int rankNode(int rank) const;
  int rankHost(int rank) const;
  // The device setRankNic recorded ("" when none), and its NIC node (-1 when none, or the topology has none).
  const std::string& rankNicDevice(int rank) const;
  int rankNic(int rank) const;
  // The NIC node of `host` whose "hca" or "netdev" attribute lists `device`; -1 when none does.
  int nicOf(int host, const std::string& device) const;
  // The torus the ranks form, from their nodes' "coords" attributes ("x,y,z", the first coordinate varying
  // fastest with the rank, as the torus presets lay chips out): sizes listed slowest first, as
  // LOOM_TORUS_DIMS takes them. Empty when some rank has no coordinates or the ranks are not in that order.
  std::vector<int> torusDims() const;
  // The links of `node` (a shared-memory link once).
  std::vector<int> linksOf(int node) const;
  // The first problem that makes this graph unusable (names, host numbering, links, rank placement), or "".
  std::string validate() const;
  bool operator==(const Topology& other) const;

  // --- Routes. Deterministic, and cheap enough to call for every flow of a plan on 16k ranks.
  // The link ids from `from` to `to`, in order. Shortest in hops, widest on ties, and among equals a pick spread
  // by a hash of the two ends (as ECMP spreads flows). Preferences, in order: GPUs in one NVLink fabric stay on
  // it (GPU -> NVSwitch -> GPU); nodes of one host stay in the host; nodes of different hosts leave through the
  // egress of each (egressOf) and cross the network switches between them. Empty when from == to (unless the
  // node has a shared-memory link, then that link) or when `to` cannot be reached.
  std::vector<int> route(int from, int to) const;
  // The nodes a route visits, `from` first.
  std::vector<int> nodesAlong(int from, std::span<const int> links) const;
  PathInfo pathBetween(int from, int to) const;
  PathInfo path(int rankA, int rankB) const;
  // The switch stages of the route from rank A to rank B, in route order (for loom-topo --path).
  std::vector<PathStage> pathStages(int rankA, int rankB) const;
  // Where `node`'s traffic to other hosts leaves its host: the nearest NIC with a network link (fewest hops,
  // then widest; ties spread over the host's nodes of one kind), or the host node when only it has one. -1 when
  // the host has no way out.
  int egressOf(int node) const;

  struct Index;  // adjacency and per-node routing facts, built on first query (route.cc)

 private:
  const Index& index() const;
  void invalidate();

  std::vector<TopoNode> nodes_;
  std::vector<TopoLink> links_;
  std::vector<int> hostNodes_;
  std::vector<int> rankNodes_;
  std::vector<std::string> rankNics_;  // by rank: setRankNic's device
  Attributes attrs_;
  std::unordered_map<std::string, int> byName_;
  mutable std::mutex indexMutex_;
  mutable std::atomic<const Index*> indexReady_{nullptr};
  mutable std::unique_ptr<Index> index_;
};

}  // namespace loom
