// The presets of presets.h. Each builder adds hosts in rank order and places rank r on the r-th accelerator.
// Node names follow one pattern: "host<h>/<kind><i>" inside host h ("host0/gpu3"), bare names for network
// switches ("rail3-leaf0", "spine5").
#include "src/topology/presets.h"

#include <sys/stat.h>

#include <charconv>

#include "src/topology/figures.h"
#include "src/topology/xml.h"

namespace loom {
namespace {

using namespace figures;

constexpr int kMaxFatTreeNodes = 16384;
constexpr int kMaxTorusChips = 1 << 20;
constexpr int kMaxMeshNpus = 1024;

// Adds nodes to one host, naming them "<host name>/<local name>".
class HostBuilder {
 public:
  HostBuilder(Topology* topo, int index, Attributes attrs) : topo_(topo), prefix_("host" + std::to_string(index)) {
    host_ = topo->addHost(prefix_, std::move(attrs));
    prefix_ += '/';
  }
  int host() const { return host_; }
  int hostNode() const { return topo_->hostNode(host_); }
  int add(NodeKind kind, const std::string& local, Attributes attrs = {}) {
    return topo_->addNode(kind, prefix_ + local, host_, std::move(attrs));
  }
  // A CPU socket: its NUMA node, joined to the host by the inter-socket fabric, with its shared memory. A core
  // count of 0 leaves the count out.
  int addSocket(int socket, int cores, double smpBandwidth, const std::string& model) {
    Attributes attrs{{"os_index", std::to_string(socket)}};
    if (cores > 0) attrs.emplace_back("cores", std::to_string(cores));
    attrs.emplace_back("model", model);
    int numa = add(NodeKind::kNuma, "numa" + std::to_string(socket), std::move(attrs));
    topo_->addLink(LinkKind::kSmp, hostNode(), numa, smpBandwidth, kSmpLatency);
    topo_->addLink(LinkKind::kSharedMemory, numa, numa, kSharedMemoryCopy, kSharedMemoryLatency);
    return numa;
  }

 private:
  Topology* topo_;
  std::string prefix_;
  int host_;
};

// One DGX H100 as host `index`, its GPUs placed as ranks rankBase..rankBase+7; returns its NICs in index order.
std::vector<int> addDgxH100(Topology* topo, int index, int rankBase) {
  HostBuilder host(topo, index, {{"model", "DGX H100"}});
  int sockets[2];
  for (int s = 0; s < 2; ++s) sockets[s] = host.addSocket(s, 56, kSmpSapphireRapids, "Xeon Platinum 8480C");
  std::vector<int> gpus, nics;
  for (int i = 0; i < 8; ++i) {
    std::string n = std::to_string(i);
    int pci = host.add(NodeKind::kPciSwitch, "pci" + n, {{"model", "PCIe Gen5 switch"}});
    topo->addLink(LinkKind::kPcie, sockets[i / 4], pci, kPcieGen5x16, kPcieLatency);
    int gpu = host.add(NodeKind::kGpu, "gpu" + n, {{"index", n}, {"model", "H100 SXM5"}});
    topo->addLink(LinkKind::kPcie, pci, gpu, kPcieGen5x16, kPcieLatency);
    int nic = host.add(NodeKind::kNic, "nic" + n,
                       {{"index", n}, {"speed", "400"}, {"fabric", "ib"}, {"model", "ConnectX-7"}});
    topo->addLink(LinkKind::kPcie, pci, nic, kPcieGen5x16, kPcieLatency);
    gpus.push_back(gpu);
    nics.push_back(nic);
    topo->mapRank(rankBase + i, gpu);
  }
  // Each GPU's 18 NVLinks split 5, 4, 4, 5 over the four NVSwitch chips.
  const int kLinksToSwitch[4] = {5, 4, 4, 5};
  for (int k = 0; k < 4; ++k) {
    int nvswitch = host.add(NodeKind::kNvSwitch, "nvswitch" + std::to_string(k), {{"index", std::to_string(k)}});
    for (int gpu : gpus)
      topo->addLink(LinkKind::kNvLink, gpu, nvswitch, kLinksToSwitch[k] * kNvLink4Link, kNvLinkLatency);
  }
  return nics;
}

void buildDgxH100(Topology* topo) { addDgxH100(topo, 0, 0); }

void buildPcie8Gpu(Topology* topo) {
  HostBuilder host(topo, 0, {{"model", "8-GPU PCIe server"}});
  int sockets[2];
  for (int s = 0; s < 2; ++s) sockets[s] = host.addSocket(s, 32, kSmpIceLake, "Xeon Gold 6338");
  for (int p = 0; p < 4; ++p) {
    int pci = host.add(NodeKind::kPciSwitch, "pci" + std::to_string(p), {{"model", "PCIe Gen4 switch"}});
    topo->addLink(LinkKind::kPcie, sockets[p / 2], pci, kPcieGen4x16, kPcieLatency);
    for (int g = 2 * p; g < 2 * p + 2; ++g) {
      int gpu = host.add(NodeKind::kGpu, "gpu" + std::to_string(g), {{"index", std::to_string(g)}, {"model", "L40S"}});
      topo->addLink(LinkKind::kPcie, pci, gpu, kPcieGen4x16, kPcieLatency);
      topo->mapRank(g, gpu);
    }
    if (p % 2 == 0) {
      std::string n = std::to_string(p / 2);
      int nic = host.add(NodeKind::kNic, "nic" + n,
                         {{"index", n}, {"speed", "100"}, {"fabric", "ib"}, {"model", "ConnectX-6"}});
      topo->addLink(LinkKind::kPcie, pci, nic, kPcieGen4x16, kPcieLatency);
    }
  }
}

// Hosts of `perHost` accelerators (the last may hold fewer), each with one socket linked to its accelerators
// over PCIe; returns the accelerators in rank order. `coords` (empty, or one per accelerator) become their
// "coords" attributes.
std::vector<int> addAcceleratorHosts(Topology* topo, int count, int perHost, const std::string& hostModel,
                                     const std::string& chipModel, const std::vector<std::string>& coords) {
  std::vector<int> chips;
  for (int first = 0, index = 0; first < count; first += perHost, ++index) {
    HostBuilder host(topo, index, {{"model", hostModel}});
    int numa = host.addSocket(0, 0, kSmpDefault, "host CPU");
    for (int local = 0; local < perHost && first + local < count; ++local) {
      Attributes attrs{{"index", std::to_string(local)}, {"model", chipModel}};
      if (!coords.empty()) attrs.emplace_back("coords", coords[first + local]);
      int chip = host.add(NodeKind::kGpu, "gpu" + std::to_string(local), std::move(attrs));
      topo->addLink(LinkKind::kPcie, numa, chip, kPcieGen4x16, kPcieLatency);
      topo->mapRank(first + local, chip);
      chips.push_back(chip);
    }
  }
  return chips;
}

void buildTorus(Topology* topo, const std::vector<int>& dims, double bandwidth) {
  int count = 1;
  for (int size : dims) count *= size;
  // Chip c has coordinates (c mod A, c / A mod B, ...): the first dimension varies fastest.
  std::vector<std::string> coords(count);
  for (int c = 0; c < count; ++c) {
    for (int d = 0, rest = c; d < static_cast<int>(dims.size()); rest /= dims[d], ++d)
      coords[c] += (d > 0 ? "," : "") + std::to_string(rest % dims[d]);
  }
  std::vector<int> chips = addAcceleratorHosts(topo, count, kChipsPerTorusHost, "TPU-style host", "torus chip", coords);
  for (int c = 0; c < count; ++c) {
    for (int d = 0, stride = 1; d < static_cast<int>(dims.size()); stride *= dims[d], ++d) {
      int size = dims[d], coord = c / stride % size;
      // A ring of 2 is one link, and a ring of 1 none.
      if (size == 1 || (size == 2 && coord == 1)) continue;
      int neighbour = c + ((coord + 1) % size - coord) * stride;
      topo->addLink(LinkKind::kNvLink, chips[c], chips[neighbour], bandwidth, kTorusLatency);
    }
  }
}

void buildFullMesh(Topology* topo, int count) {
  std::vector<int> npus = addAcceleratorHosts(topo, count, kNpusPerMeshHost, "Ascend-style server", "NPU", {});
  for (int i = 0; i < count; ++i)
    for (int j = i + 1; j < count; ++j) topo->addLink(LinkKind::kNvLink, npus[i], npus[j], kHccsLink, kHccsLatency);
}

// Rail-optimised two-level fat tree: NIC r of every node goes to a leaf of rail r, each leaf serves up to 32
// nodes and has as many uplinks as downlinks, one to each spine, so the tree is non-blocking.
void buildFatTree(Topology* topo, int nodes) {
  std::vector<std::vector<int>> nics;
  for (int h = 0; h < nodes; ++h) nics.push_back(addDgxH100(topo, h, 8 * h));
  int perLeaf = std::min(nodes, 32);
  int leavesPerRail = (nodes + perLeaf - 1) / perLeaf;
  int spines = perLeaf;
  std::vector<int> leaves;  // rail-major
  for (int rail = 0; rail < 8; ++rail) {
    for (int l = 0; l < leavesPerRail; ++l) {
      leaves.push_back(topo->addNode(NodeKind::kNetSwitch, "rail" + std::to_string(rail) + "-leaf" + std::to_string(l),
                                     -1, {{"model", "Quantum-2 leaf"}}));
    }
  }
  std::vector<int> spineNodes;
  for (int s = 0; s < spines; ++s)
    spineNodes.push_back(
        topo->addNode(NodeKind::kNetSwitch, "spine" + std::to_string(s), -1, {{"model", "Quantum-2 spine"}}));
  for (int h = 0; h < nodes; ++h)
    for (int rail = 0; rail < 8; ++rail)
      topo->addLink(LinkKind::kNetwork, nics[h][rail], leaves[rail * leavesPerRail + h / perLeaf], kNdr400,
                    kNicLatencyIb);
  for (int leaf : leaves)
    for (int spine : spineNodes) topo->addLink(LinkKind::kNetwork, leaf, spine, kNdr400, kSwitchLatency);
}

bool parseInt(std::string_view text, int* value) {
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size() && !text.empty();
}

// "AxB" or "AxBxC" (dims dimensions) with an optional ":GBps".
bool parseTorusSpec(std::string_view spec, std::string_view params, size_t dims, std::vector<int>* sizes,
                    double* bandwidth, std::string* error) {
  std::string example = dims == 2 ? "torus2d:4x4 or torus2d:4x4:100" : "torus3d:4x4x4 or torus3d:4x4x4:100";
  size_t colon = params.find(':');
  std::string_view shape = params.substr(0, colon);
  if (colon != std::string_view::npos) {
    std::string_view rate = params.substr(colon + 1);
    auto [end, parseError] = std::from_chars(rate.data(), rate.data() + rate.size(), *bandwidth);
    if (parseError != std::errc() || end != rate.data() + rate.size() || rate.empty() || !(*bandwidth > 0)) {
      *error = "preset \"" + std::string(spec) + "\": link bandwidth \"" + std::string(rate) +
               "\" is not a positive number of GB/s (e.g. " + example + ")";
      return false;
    }
  }
  sizes->clear();
  int64_t total = 1;
  while (true) {
    size_t x = shape.find('x');
    int size = 0;
    if (!parseInt(shape.substr(0, x), &size) || size < 1) {
      *error = "preset \"" + std::string(spec) + "\": dimension \"" + std::string(shape.substr(0, x)) +
               "\" is not a positive integer (e.g. " + example + ")";
      return false;
    }
    sizes->push_back(size);
    total *= size;
    if (total > kMaxTorusChips) {
      *error = "preset \"" + std::string(spec) + "\" has more than " + std::to_string(kMaxTorusChips) + " chips";
      return false;
    }
    if (x == std::string_view::npos) break;
    shape = shape.substr(x + 1);
  }
  if (sizes->size() != dims) {
    *error = "preset \"" + std::string(spec) + "\" needs " + std::to_string(dims) + " dimensions, found " +
             std::to_string(sizes->size()) + " (e.g. " + example + ")";
    return false;
  }
  return true;
}

bool parseCount(std::string_view spec, std::string_view params, int max, const char* what, int* count,
                std::string* error) {
  if (!parseInt(params, count) || *count < 1 || *count > max) {
    *error = "preset \"" + std::string(spec) + "\": " + what + " \"" + std::string(params) +
             "\" is not an integer from 1 to " + std::to_string(max);
    return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> presetUsage() {
  return {
      "dgx-h100              8 H100 GPUs on 4 NVSwitches, 2 sockets, 8 x 400 Gb/s NICs",
      "pcie-8gpu             8 GPUs on PCIe Gen4 switches under 2 sockets, 2 x 100 Gb/s NICs",
      "torus2d:AxB[:GBps]    2D torus of A*B chips (TPU-style), optional per-link bandwidth",
      "torus3d:AxBxC[:GBps]  3D torus of A*B*C chips",
      "fattree:N             N dgx-h100 nodes on a rail-optimised non-blocking fat tree",
      "fullmesh:N            N NPUs, every pair directly linked (Ascend-style super node)",
  };
}

bool makePreset(std::string_view spec, Topology* topo, std::string* error) {
  size_t colon = spec.find(':');
  std::string_view name = spec.substr(0, colon);
  std::string_view params = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  bool hasParams = colon != std::string_view::npos;
  Topology built;
  if (name == "dgx-h100" || name == "pcie-8gpu") {
    if (hasParams) {
      *error = "preset \"" + std::string(name) + "\" takes no parameters, found \"" + std::string(params) + "\"";
      return false;
    }
    if (name == "dgx-h100")
      buildDgxH100(&built);
    else
      buildPcie8Gpu(&built);
  } else if (name == "torus2d" || name == "torus3d") {
    std::vector<int> sizes;
    double bandwidth = kTorusLink;
    if (!parseTorusSpec(spec, params, name == "torus2d" ? 2 : 3, &sizes, &bandwidth, error)) return false;
    buildTorus(&built, sizes, bandwidth);
  } else if (name == "fattree" || name == "fullmesh") {
    bool fatTree = name == "fattree";
    int count = 0;
    if (!parseCount(spec, params, fatTree ? kMaxFatTreeNodes : kMaxMeshNpus, fatTree ? "node count" : "NPU count",
                    &count, error))
      return false;
    if (fatTree)
      buildFatTree(&built, count);
    else
      buildFullMesh(&built, count);
  } else {
    *error = "unknown preset \"" + std::string(spec) +
             "\"; presets: dgx-h100, pcie-8gpu, torus2d:AxB[:GBps], torus3d:AxBxC[:GBps], fattree:N, fullmesh:N";
    return false;
  }
  setAttribute(&built.attributes(), "source", "preset " + std::string(spec));
  *topo = std::move(built);
  return true;
}

bool loadTopologySpec(const std::string& spec, Topology* topo, std::string* error) {
  struct stat info {};
  const bool isFile = stat(spec.c_str(), &info) == 0 || spec.find('/') != std::string::npos || spec.ends_with(".xml");
  return isFile ? readTopologyFile(spec, topo, error) : makePreset(spec, topo, error);
}

}  // namespace loom
