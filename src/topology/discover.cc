// Discovery of the local host (discover.h). With hwloc: NUMA nodes and their cores, then every PCI device hwloc
// calls important that is a GPU (or other accelerator) or a NIC, attached through the PCI switches above it. A
// bridge counts as a switch only where the tree fans out (two or more of its children lead to devices kept
// here), so root ports and single-device chains collapse into one PCIe link, as they carry no shared traffic.
// Link rates come from hwloc's PCIe link speed and the NIC's sysfs speed; inter-socket rates are not visible and
// take figures::kSmpDefault. Without hwloc: one NUMA node holding every online CPU.
#include "src/topology/discover.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#ifndef LOOM_HAVE_HWLOC
#define LOOM_HAVE_HWLOC 0
#endif
#if LOOM_HAVE_HWLOC
#include <hwloc.h>
#endif

#include "src/base/check.h"
#include "src/base/params.h"
#include "src/base/siphash.h"
#include "src/topology/figures.h"
#include "src/topology/xml.h"

namespace loom {
namespace {

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string firstLine(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// The NUMA node of the CPU this thread runs on (sysfs lists it as cpuN/nodeM), or -1.
int currentNumaOsIndex() {
  int cpu = sched_getcpu();
  if (cpu < 0) return -1;
  std::string path = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return -1;
  int node = -1;
  while (dirent* entry = readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name.substr(0, 4) != "node") continue;
    int value = -1;
    auto [end, error] = std::from_chars(name.data() + 4, name.data() + name.size(), value);
    if (error == std::errc() && end == name.data() + name.size()) node = value;
  }
  closedir(dir);
  return node;
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// "1b:00.0" and "0000:1B:00.0" both become "0000:1b:00.0".
std::string normalBusId(const std::string& busId) {
  std::string lower = lowercase(busId);
  if (std::count(lower.begin(), lower.end(), ':') == 1) lower = "0000:" + lower;
  return lower;
}

int addNumaNode(Topology* topo, int osIndex, Attributes attrs) {
  Attributes all{{"os_index", std::to_string(osIndex)}};
  all.insert(all.end(), attrs.begin(), attrs.end());
  int numa = topo->addNode(NodeKind::kNuma, "host0/numa" + std::to_string(osIndex), 0, std::move(all));
  topo->addLink(LinkKind::kSmp, topo->hostNode(0), numa, figures::kSmpDefault, figures::kSmpLatency);
  topo->addLink(LinkKind::kSharedMemory, numa, numa, figures::kSharedMemoryCopy, figures::kSharedMemoryLatency);
  return numa;
}

loomResult_t discoverMinimal(Topology* topo) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1) return LOOM_FAIL(loomSystemError, TOPO, "sysconf(_SC_NPROCESSORS_ONLN) failed: %m");
  std::string count = std::to_string(cpus);
  Topology found;
  found.addHost("host0", {{"hostname", hostName()}, {"cores", count}, {"pus", count}});
  addNumaNode(&found, 0, {{"cores", count}, {"pus", count}});
  setAttribute(&found.attributes(), "source", "discovered (sysconf)");
  *topo = std::move(found);
  return loomSuccess;
}

#if LOOM_HAVE_HWLOC

// The leading number of a sysfs value ("400 Gb/sec (4X NDR)", "10000"), or -1.
double leadingNumber(const std::string& text) {
  double value = -1;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

// A NIC's port speed in Gb/s from sysfs, or -1 when the driver does not say (virtual NICs report -1).
double nicSpeedGbps(const std::vector<std::string>& hcas, const std::vector<std::string>& netdevs) {
  for (const std::string& hca : hcas) {
    double rate = leadingNumber(firstLine("/sys/class/infiniband/" + hca + "/ports/1/rate"));
    if (rate > 0) return rate;
  }
  for (const std::string& netdev : netdevs) {
    double megabits = leadingNumber(firstLine("/sys/class/net/" + netdev + "/speed"));
    if (megabits > 0) return megabits / 1000;
  }
  return -1;
}

std::string busIdOf(hwloc_obj_t pci) {
  char text[32];
  std::snprintf(text, sizeof(text), "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return text;
}

// hwloc's PCIe rate in GB/s (a float), to the MB/s; unknown (0) for virtual devices, which get Gen3 x16.
double linkRate(float gigabytes) {
  return gigabytes > 0 ? std::round(static_cast<double>(gigabytes) * 1000) / 1000 : figures::kPcieGen3x16;
}

bool startsWith(const char* text, const char* prefix) {
  return text != nullptr && std::string_view(text).substr(0, std::strlen(prefix)) == prefix;
}

class HwlocDiscovery {
 public:
  // `live`: hw describes this host, so sysfs may be asked for NIC speeds.
  HwlocDiscovery(hwloc_topology_t hw, bool live) : hw_(hw), live_(live) {}

  loomResult_t run(Topology* topo) {
    hwloc_obj_t root = hwloc_get_root_obj(hw_);
    // An export names its machine only if it recorded the HostName.
    const char* recorded = hwloc_obj_get_info_by_name(root, "HostName");
    Attributes hostAttrs;
    if (live_ || recorded != nullptr) hostAttrs.emplace_back("hostname", live_ ? hostName() : recorded);
    hostAttrs.emplace_back("cores", std::to_string(hwloc_get_nbobjs_by_type(hw_, HWLOC_OBJ_CORE)));
    hostAttrs.emplace_back("pus", std::to_string(hwloc_get_nbobjs_by_type(hw_, HWLOC_OBJ_PU)));
    if (const char* product = hwloc_obj_get_info_by_name(root, "DMIProductName"))
      hostAttrs.emplace_back("model", product);
    topo_.addHost("host0", std::move(hostAttrs));
    for (hwloc_obj_t numa = nullptr; (numa = hwloc_get_next_obj_by_type(hw_, HWLOC_OBJ_NUMANODE, numa)) != nullptr;) {
      Attributes attrs{
          {"cores", std::to_string(hwloc_get_nbobjs_inside_cpuset_by_type(hw_, numa->cpuset, HWLOC_OBJ_CORE))},
          {"pus", std::to_string(hwloc_get_nbobjs_inside_cpuset_by_type(hw_, numa->cpuset, HWLOC_OBJ_PU))},
          {"memory", std::to_string(numa->attr->numanode.local_memory)}};
      numaByOs_[numa->os_index] = addNumaNode(&topo_, static_cast<int>(numa->os_index), std::move(attrs));
    }
    if (numaByOs_.empty()) return LOOM_FAIL(loomSystemError, TOPO, "hwloc found no NUMA node on this host");
    collectDevices();
    int gpus = 0, nics = 0;
    for (Device& device : devices_) {
      Attributes attrs;
      std::string local;
      if (device.gpu) {
        local = "gpu" + std::to_string(gpus);
        attrs.emplace_back("index", std::to_string(gpus++));
      } else {
        local = "nic" + std::to_string(nics);
        attrs.emplace_back("index", std::to_string(nics++));
      }
      attrs.emplace_back("busid", busIdOf(device.pci));
      char pciId[16];
      std::snprintf(pciId, sizeof(pciId), "%04x:%04x", device.pci->attr->pcidev.vendor_id,
                    device.pci->attr->pcidev.device_id);
      attrs.emplace_back("pciid", pciId);
      if (const char* model = hwloc_obj_get_info_by_name(device.pci, "PCIDevice")) attrs.emplace_back("model", model);
      if (device.gpu) {
        if (!device.osdevs.empty()) attrs.emplace_back("osdev", join(device.osdevs));
      } else {
        double speed = live_ ? nicSpeedGbps(device.hcas, device.netdevs) : -1;
        if (speed > 0) {
          char text[32];
          std::snprintf(text, sizeof(text), "%g", speed);
          attrs.emplace_back("speed", text);
        }
        attrs.emplace_back("fabric", device.hcas.empty() ? "ethernet" : "ib");
        if (!device.netdevs.empty()) attrs.emplace_back("netdev", join(device.netdevs));
        if (!device.hcas.empty()) attrs.emplace_back("hca", join(device.hcas));
      }
      int id = topo_.addNode(device.gpu ? NodeKind::kGpu : NodeKind::kNic, "host0/" + local, 0, std::move(attrs));
      topo_.addLink(LinkKind::kPcie, attachAbove(device.pci), id, linkRate(device.pci->attr->pcidev.linkspeed),
                    figures::kPcieLatency);
    }
    setAttribute(&topo_.attributes(), "source", live_ ? "discovered (hwloc)" : "hwloc export");
    *topo = std::move(topo_);
    return loomSuccess;
  }

 private:
  struct Device {
    hwloc_obj_t pci = nullptr;
    bool gpu = false;
    std::vector<std::string> osdevs, netdevs, hcas;
  };

  static std::string join(const std::vector<std::string>& names) {
    std::string joined;
    for (const std::string& name : names) joined += (joined.empty() ? "" : ",") + name;
    return joined;
  }

  // GPUs (and other accelerators) and NICs, in PCI order, and which bridges their paths fan out at.
  void collectDevices() {
    std::map<hwloc_obj_t, Device> found;
    for (hwloc_obj_t osdev = nullptr; (osdev = hwloc_get_next_osdev(hw_, osdev)) != nullptr;) {
      hwloc_obj_t parent = osdev->parent;
      if (parent == nullptr || parent->type != HWLOC_OBJ_PCI_DEVICE || osdev->name == nullptr) continue;
      Device& device = found[parent];
      device.pci = parent;
      switch (osdev->attr->osdev.type) {
        case HWLOC_OBJ_OSDEV_NETWORK:
          device.netdevs.push_back(osdev->name);
          break;
        case HWLOC_OBJ_OSDEV_OPENFABRICS:
          device.hcas.push_back(osdev->name);
          break;
        case HWLOC_OBJ_OSDEV_GPU:
        case HWLOC_OBJ_OSDEV_COPROC:
          // Compute devices only: DRM nodes (card0, renderD128) exist for any display adapter.
          for (const char* prefix : {"cuda", "nvml", "opencl", "rsmi", "ze"}) {
            if (startsWith(osdev->name, prefix)) {
              device.osdevs.push_back(osdev->name);
              device.gpu = true;
            }
          }
          break;
        default:
          break;
      }
    }
    for (hwloc_obj_t pci = nullptr; (pci = hwloc_get_next_pcidev(hw_, pci)) != nullptr;) {
      unsigned cls = pci->attr->pcidev.class_id, vendor = pci->attr->pcidev.vendor_id;
      bool gpuVendor = vendor == 0x10de || vendor == 0x1002;  // NVIDIA, AMD
      auto it = found.find(pci);
      Device device;
      if (it != found.end()) device = it->second;
      device.pci = pci;
      device.gpu = device.gpu || ((cls == 0x0300 || cls == 0x0302 || cls == 0x0380) && gpuVendor) || (cls >> 8) == 0x12;
      bool nic = !device.netdevs.empty() || !device.hcas.empty() || (cls >> 8) == 0x02 || cls == 0x0c06;
      if (!device.gpu && !nic) continue;
      devices_.push_back(device);
      for (hwloc_obj_t child = pci; child->parent != nullptr && child->parent->type == HWLOC_OBJ_BRIDGE;
           child = child->parent)
        usefulChildren_[child->parent].insert(child);
    }
  }

  int numaFor(hwloc_obj_t obj) {
    hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(hw_, obj);
    if (ancestor != nullptr && ancestor->nodeset != nullptr) {
      auto found = numaByOs_.find(static_cast<unsigned>(hwloc_bitmap_first(ancestor->nodeset)));
      if (found != numaByOs_.end()) return found->second;
    }
    return numaByOs_.begin()->second;
  }

  // The node `obj` hangs from: the nearest fan-out bridge above it (a PCI switch), else its NUMA node.
  int attachAbove(hwloc_obj_t obj) {
    for (hwloc_obj_t bridge = obj->parent; bridge != nullptr && bridge->type == HWLOC_OBJ_BRIDGE;
         bridge = bridge->parent) {
      if (bridge->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) break;
      if (usefulChildren_[bridge].size() >= 2) return switchFor(bridge);
    }
    return numaFor(obj);
  }

  int switchFor(hwloc_obj_t bridge) {
    auto known = switches_.find(bridge);
    if (known != switches_.end()) return known->second;
    int id = topo_.addNode(NodeKind::kPciSwitch, "host0/pci" + std::to_string(switches_.size()), 0,
                           {{"busid", busIdOf(bridge)}});
    switches_[bridge] = id;
    topo_.addLink(LinkKind::kPcie, attachAbove(bridge), id, linkRate(bridge->attr->bridge.upstream.pci.linkspeed),
                  figures::kPcieLatency);
    return id;
  }

  hwloc_topology_t hw_;
  bool live_;
  Topology topo_;
  std::map<unsigned, int> numaByOs_;
  std::vector<Device> devices_;
  std::map<hwloc_obj_t, std::set<hwloc_obj_t>> usefulChildren_;
  std::map<hwloc_obj_t, int> switches_;
};

// Why the file at `path` is no hwloc XML export, said before hwloc reports only "Invalid argument": it cannot be
// read, it is loom's own topology XML (whose root element is also <topology>), or it holds no hwloc object.
// Empty when it looks like one.
std::string notAnHwlocExport(const char* path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::string("cannot open ") + path + ": " + std::strerror(errno);
  std::string head(64 * 1024, '\0');
  file.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(file.gcount()));
  if (head.empty()) return std::string(path) + " is empty";
  if (head.find("<object") != std::string::npos) return "";
  if (head.find("loom topology") != std::string::npos || head.find("<node") != std::string::npos)
    return std::string(path) +
           " is loom's topology XML, not an hwloc export: read it with loom-topo --file (or LOOM_TOPO_FILE)";
  return std::string(path) + " is not an hwloc XML export (lstopo --of xml writes one): it has no <object> element";
}

// This host, or the machine an hwloc XML export describes when `xmlPath` is not null.
loomResult_t discoverHwloc(const char* xmlPath, Topology* topo) {
  if (xmlPath != nullptr) {
    const std::string why = notAnHwlocExport(xmlPath);
    if (!why.empty()) return LOOM_FAIL(loomInvalidUsage, TOPO, "%s", why.c_str());
  }
  hwloc_topology_t hw;
  if (hwloc_topology_init(&hw) != 0) return LOOM_FAIL(loomSystemError, TOPO, "hwloc_topology_init failed: %m");
  hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (xmlPath != nullptr && hwloc_topology_set_xml(hw, xmlPath) != 0) {
    hwloc_topology_destroy(hw);
    return LOOM_FAIL(loomInvalidUsage, TOPO, "hwloc cannot read %s as an hwloc XML export: %m", xmlPath);
  }
  if (hwloc_topology_load(hw) != 0) {
    hwloc_topology_destroy(hw);
    if (xmlPath != nullptr)
      return LOOM_FAIL(loomInvalidUsage, TOPO, "hwloc cannot load %s as an hwloc XML export: %m", xmlPath);
    return LOOM_FAIL(loomSystemError, TOPO, "hwloc_topology_load failed: %m");
  }
  loomResult_t result = HwlocDiscovery(hw, xmlPath == nullptr).run(topo);
  hwloc_topology_destroy(hw);
  return result;
}

#endif  // LOOM_HAVE_HWLOC

std::string expandDumpPath(const std::string& pattern, int rank) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      path += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'h':
        path += hostName();
        break;
      case 'p':
        path += std::to_string(getpid());
        break;
      case 'r':
        path += std::to_string(rank);
        break;
      case '%':
        path += '%';
        break;
      default:
        path += pattern.substr(i - 1, 2);
    }
  }
  return path;
}

}  // namespace

bool discoveryUsesHwloc() { return LOOM_HAVE_HWLOC != 0; }

// The machine does not change while the process runs: discovered once, then copied (every communicator of every
// thread needs it at init).
loomResult_t discoverLocalTopology(Topology* topo) {
  static std::mutex mutex;
  static std::optional<Topology> discovered;
  std::lock_guard<std::mutex> lock(mutex);
  if (!discovered) {
    Topology fresh;
#if LOOM_HAVE_HWLOC
    if (discoverHwloc(nullptr, &fresh) != loomSuccess) {
      LOOM_WARN(TOPO, "hwloc discovery failed; describing this host as one NUMA node with its online CPUs");
      LOOM_CHECK(discoverMinimal(&fresh));
    }
#else
    LOOM_CHECK(discoverMinimal(&fresh));
#endif
    discovered = std::move(fresh);
  }
  *topo = *discovered;
  return loomSuccess;
}

loomResult_t discoverFromHwlocXml(const std::string& path, Topology* topo) {
#if LOOM_HAVE_HWLOC
  return discoverHwloc(path.c_str(), topo);
#else
  (void)topo;
  return LOOM_FAIL(loomInvalidUsage, TOPO, "cannot read the hwloc export %s: loom was built without hwloc",
                   path.c_str());
#endif
}

loomResult_t placeLocalRank(const LocalPlacement& self, Topology* topo) {
  if (topo->hostCount() != 1) {
    return LOOM_FAIL(loomInvalidUsage, TOPO, "cannot place rank %d: its local view has %d hosts, expected 1", self.rank,
                     topo->hostCount());
  }
  if (!self.gpuBusId.empty()) {
    std::string wanted = normalBusId(self.gpuBusId), known;
    for (int id = 0; id < topo->nodeCount(); ++id) {
      const TopoNode& node = topo->node(id);
      if (node.kind != NodeKind::kGpu) continue;
      std::string busId = normalBusId(attributeOr(node.attrs, "busid", ""));
      if (busId == wanted) {
        topo->mapRank(self.rank, id);
        return loomSuccess;
      }
      known += (known.empty() ? "" : ", ") + (busId.empty() ? node.name + " (no busid)" : busId);
    }
    return LOOM_FAIL(loomInvalidUsage, TOPO, "rank %d: no GPU with PCI address %s in the local topology (GPUs: %s)",
                     self.rank, wanted.c_str(), known.empty() ? "none" : known.c_str());
  }
  int osIndex = currentNumaOsIndex(), first = -1;
  for (int id = 0; id < topo->nodeCount(); ++id) {
    const TopoNode& node = topo->node(id);
    if (node.kind != NodeKind::kNuma) continue;
    if (first < 0) first = id;
    if (osIndex >= 0 && intAttribute(node.attrs, "os_index", -1) == osIndex) {
      topo->mapRank(self.rank, id);
      return loomSuccess;
    }
  }
  if (first < 0) return LOOM_FAIL(loomInvalidUsage, TOPO, "rank %d: the local topology has no NUMA node", self.rank);
  topo->mapRank(self.rank, first);
  return loomSuccess;
}

loomResult_t loadLocalTopology(const LocalPlacement& self, Topology* topo) {
  std::string file = params::topoFile();
  Topology local;
  if (!file.empty()) {
    std::string error;
    if (!readTopologyFile(file, &local, &error))
      return LOOM_FAIL(loomInvalidUsage, TOPO, "LOOM_TOPO_FILE: %s", error.c_str());
  } else {
    LOOM_CHECK(discoverLocalTopology(&local));
  }
  if (local.rankNode(self.rank) < 0) LOOM_CHECK(placeLocalRank(self, &local));
  std::string dump = params::topoDumpFile();
  if (!dump.empty()) {
    std::string path = expandDumpPath(dump, self.rank), error;
    if (!writeTopologyFile(path, local, &error))
      return LOOM_FAIL(loomSystemError, TOPO, "LOOM_TOPO_DUMP_FILE: %s", error.c_str());
  }
  LOOM_INFO(TOPO, "local topology from %s: %d nodes, %d links; rank %d on %s",
            file.empty() ? (LOOM_HAVE_HWLOC ? "hwloc" : "sysconf") : file.c_str(), local.nodeCount(), local.linkCount(),
            self.rank, local.node(local.rankNode(self.rank)).name.c_str());
  *topo = std::move(local);
  return loomSuccess;
}

uint64_t hostHashOf(std::string_view identity) {
  static const uint8_t kKey[kSipHashKeyBytes] = {'l', 'o', 'o', 'm', '-', 'h', 'o', 's',
                                                 't', '-', 'h', 'a', 's', 'h', '-', '1'};
  return sipHash24(kKey, identity.data(), identity.size());
}

uint64_t machineHash() { return hostHashOf(hostName() + "/" + firstLine("/proc/sys/kernel/random/boot_id")); }

uint64_t localHostHash() {
  std::string identity = params::hostId();
  return identity.empty() ? machineHash() : hostHashOf(identity);
}

}  // namespace loom
