// The topology module, across hosts and at scale: fusion of per-host views, discovery of this machine, and routes
// of a ring and a tree over 16,384 ranks. Presets, XML and routes on each kind of machine: topology_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/builders.h"
#include "src/base/check.h"
#include "src/topology/describe.h"
#include "src/topology/discover.h"
#include "src/topology/fuse.h"
#include "src/topology/presets.h"
#include "src/topology/xml.h"
#include "tests/unit/topology_test_util.h"

namespace loom {
namespace {

using namespace loom::topology_test;

// --- Fusion.

// A host's local view as one rank sees it: two GPUs and, optionally, one NIC; `rank` placed on GPU rank % 2.
Topology localView(int rank, bool withNic) {
  Topology topo;
  int host = topo.addHost("host0", {{"hostname", "node"}});
  int numa = topo.addNode(NodeKind::kNuma, "host0/numa0", host, {{"os_index", "0"}});
  topo.addLink(LinkKind::kSmp, topo.hostNode(host), numa, 40, 0.1);
  topo.addLink(LinkKind::kSharedMemory, numa, numa, 20, 0.5);
  for (int g = 0; g < 2; ++g) {
    int gpu = topo.addNode(NodeKind::kGpu, "host0/gpu" + std::to_string(g), host, {{"index", std::to_string(g)}});
    topo.addLink(LinkKind::kPcie, numa, gpu, 31.5, 0.15);
    if (g == rank % 2) topo.mapRank(rank, gpu);
  }
  if (withNic) {
    int nic = topo.addNode(NodeKind::kNic, "host0/nic0", host,
                           {{"speed", "100"}, {"fabric", "ib"}, {"hca", "mlx5_0"}, {"netdev", "ib0,ib1"}});
    topo.addLink(LinkKind::kPcie, numa, nic, 31.5, 0.15);
  }
  return topo;
}

TEST(TopologyFusion, TwoHostsAreJoinedByTheNetwork) {
  std::vector<Topology> views;
  for (int rank = 0; rank < 4; ++rank) views.push_back(localView(rank, true));
  const std::vector<uint64_t> hashes = {hostHashOf("a"), hostHashOf("a"), hostHashOf("b"), hostHashOf("b")};
  Topology fused;
  ASSERT_EQ(fuseViews(views, hashes, &fused), loomSuccess) << threadLastError();
  EXPECT_EQ(fused.validate(), "");
  EXPECT_EQ(fused.hostCount(), 2);
  EXPECT_EQ(fused.countNodes(NodeKind::kGpu), 4) << "each host's subgraph once";
  EXPECT_EQ(fused.countNodes(NodeKind::kNetSwitch), 1);
  EXPECT_EQ(fused.countLinks(LinkKind::kNetwork), 2);
  EXPECT_EQ(fused.rankHost(0), 0);
  EXPECT_EQ(fused.rankHost(1), 0);
  EXPECT_EQ(fused.rankHost(2), 1);
  EXPECT_EQ(fused.rankHost(3), 1);
  EXPECT_EQ(fused.node(fused.rankNode(3)).name, "host1/gpu1");
  PathInfo across = fused.path(1, 2);
  EXPECT_EQ(across.slowest, LinkKind::kNetwork);
  EXPECT_DOUBLE_EQ(across.bandwidth, 12.5) << "100 Gb/s NICs";
  EXPECT_TRUE(routeVisits(fused, 1, routeBetween(fused, 1, 2), "net0"));
  EXPECT_EQ(fused.path(0, 1).slowest, LinkKind::kPcie) << "both GPUs hang from one NUMA node";
  // The fused view is a valid wire message too.
  Topology parsed;
  std::string error;
  ASSERT_TRUE(parseTopologyXml(topologyToXml(fused), &parsed, &error)) << error;
  EXPECT_TRUE(parsed == fused);
}

// Each rank's network device (as its transport chose it) is recorded and found among its host's NICs by the
// names they list (hca, netdev); the record survives the XML.
TEST(TopologyFusion, RanksNicsAreRecorded) {
  std::vector<Topology> views;
  for (int rank = 0; rank < 4; ++rank) views.push_back(localView(rank, true));
  const std::vector<uint64_t> hashes = {hostHashOf("a"), hostHashOf("a"), hostHashOf("b"), hostHashOf("b")};
  Topology fused;
  ASSERT_EQ(fuseViews(views, hashes, &fused), loomSuccess) << threadLastError();
  fused.setRankNic(0, "mlx5_0");
  fused.setRankNic(1, "ib1");
  fused.setRankNic(2, "mlx5_1");  // not a NIC of its host
  EXPECT_EQ(fused.rankNicDevice(0), "mlx5_0");
  EXPECT_EQ(fused.node(fused.rankNic(0)).name, "host0/nic0");
  EXPECT_EQ(fused.node(fused.rankNic(1)).name, "host0/nic0") << "found by its netdev";
  EXPECT_EQ(fused.rankNic(2), -1);
  EXPECT_EQ(fused.rankNicDevice(3), "");
  EXPECT_EQ(fused.rankNic(3), -1);
  EXPECT_EQ(fused.nicOf(1, "mlx5_0"), fused.findNode("host1/nic0"));
  EXPECT_EQ(fused.nicOf(1, "mlx5"), -1) << "whole names only";
  Topology parsed;
  std::string error;
  ASSERT_TRUE(parseTopologyXml(topologyToXml(fused), &parsed, &error)) << error;
  EXPECT_TRUE(parsed == fused);
  EXPECT_EQ(parsed.rankNicDevice(1), "ib1");
}

TEST(TopologyFusion, HostsWithoutNicsGetAPlainNetworkLink) {
  std::vector<Topology> views = {localView(0, false), localView(1, false), localView(2, false)};
  const std::vector<uint64_t> hashes = {1, 2, 3};
  Topology fused;
  ASSERT_EQ(fuseViews(views, hashes, &fused), loomSuccess) << threadLastError();
  EXPECT_EQ(fused.hostCount(), 3);
  EXPECT_EQ(fused.countLinks(LinkKind::kNetwork), 3);
  PathInfo across = fused.path(0, 2);
  EXPECT_TRUE(across.reachable);
  EXPECT_EQ(across.slowest, LinkKind::kNetwork);
  EXPECT_DOUBLE_EQ(across.bandwidth, 1.25);
}

TEST(TopologyFusion, OneHostNeedsNoNetwork) {
  std::vector<Topology> views = {localView(0, true), localView(1, true)};
  Topology fused;
  ASSERT_EQ(fuseViews(views, std::vector<uint64_t>{7, 7}, &fused), loomSuccess);
  EXPECT_EQ(fused.hostCount(), 1);
  EXPECT_EQ(fused.countNodes(NodeKind::kNetSwitch), 0);
  EXPECT_EQ(fused.path(0, 1).hops, 2);
}

TEST(TopologyFusion, AClusterFileIsUsedAsItIs) {
  Topology cluster = preset("fattree:2");
  std::vector<Topology> views(16, cluster);
  Topology fused;
  ASSERT_EQ(fuseViews(views, std::vector<uint64_t>(16, 1), &fused), loomSuccess) << threadLastError();
  EXPECT_TRUE(fused == cluster);
  std::vector<Topology> more(17, cluster);
  EXPECT_EQ(fuseViews(more, std::vector<uint64_t>(17, 1), &fused), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("does not place rank 16"), std::string::npos) << threadLastError();
  views[5] = preset("fattree:3");
  EXPECT_EQ(fuseViews(views, std::vector<uint64_t>(16, 1), &fused), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("rank 5's topology differs from rank 0's"), std::string::npos) << threadLastError();
}

TEST(TopologyFusion, MismatchesNameTheRank) {
  Topology fused;
  std::vector<Topology> views = {localView(0, true), localView(1, true)};
  EXPECT_EQ(fuseViews(views, std::vector<uint64_t>{1}, &fused), loomInvalidArgument);
  EXPECT_NE(threadLastError().find("2 views and 1 host hashes"), std::string::npos) << threadLastError();
  views[1] = localView(0, true);  // places rank 0, not rank 1
  EXPECT_EQ(fuseViews(views, std::vector<uint64_t>{1, 1}, &fused), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("rank 1's topology does not place rank 1"), std::string::npos) << threadLastError();
  views[1] = preset("pcie-8gpu");  // rank 1 on "host0/gpu1", which rank 0's view of the same host has
  EXPECT_EQ(fuseViews(views, std::vector<uint64_t>{1, 1}, &fused), loomSuccess);
  Topology odd;
  odd.addHost("host0");
  int numa = odd.addNode(NodeKind::kNuma, "host0/other", 0);
  odd.mapRank(1, numa);
  views[1] = odd;
  EXPECT_EQ(fuseViews(views, std::vector<uint64_t>{1, 1}, &fused), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("rank 1 is placed on \"host0/other\", which rank 0's topology"), std::string::npos)
      << threadLastError();
}

TEST(TopologyFusion, HostIdentityComesFromLoomHostId) {
  setenv("LOOM_HOSTID", "emulated-a", 1);
  uint64_t a = localHostHash();
  setenv("LOOM_HOSTID", "emulated-b", 1);
  uint64_t b = localHostHash();
  unsetenv("LOOM_HOSTID");
  uint64_t real = localHostHash();
  EXPECT_EQ(a, hostHashOf("emulated-a"));
  EXPECT_NE(a, b);
  EXPECT_NE(real, a);
  EXPECT_EQ(real, localHostHash()) << "stable";

  // Two processes' discovered views, emulated as two hosts, fuse into two hosts joined by the network.
  std::vector<Topology> views(2);
  std::vector<uint64_t> hashes;
  for (int rank = 0; rank < 2; ++rank) {
    setenv("LOOM_HOSTID", rank == 0 ? "emulated-a" : "emulated-b", 1);
    ASSERT_EQ(loadLocalTopology({rank, ""}, &views[rank]), loomSuccess) << threadLastError();
    hashes.push_back(localHostHash());
  }
  unsetenv("LOOM_HOSTID");
  Topology fused;
  ASSERT_EQ(fuseViews(views, hashes, &fused), loomSuccess) << threadLastError();
  EXPECT_EQ(fused.hostCount(), 2);
  EXPECT_EQ(fused.countNodes(NodeKind::kNetSwitch), 1);
  EXPECT_EQ(fused.path(0, 1).slowest, LinkKind::kNetwork);
}

// --- Discovery and the local view.

TEST(TopologyDiscovery, FindsThisMachinesNumaNodesAndCores) {
  Topology topo;
  ASSERT_EQ(discoverLocalTopology(&topo), loomSuccess) << threadLastError();
  EXPECT_EQ(topo.validate(), "");
  EXPECT_EQ(topo.hostCount(), 1);
  EXPECT_GE(topo.countNodes(NodeKind::kNuma), 1);
  int64_t pus = 0, cores = 0;
  for (const TopoNode& node : topo.nodes()) {
    if (node.kind != NodeKind::kNuma) continue;
    pus += intAttribute(node.attrs, "pus", 0);
    cores += intAttribute(node.attrs, "cores", 0);
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_EQ(pus, online);
  EXPECT_EQ(intAttribute(topo.node(topo.hostNode(0)).attrs, "pus", 0), online);
  // Physical cores, counted from sysfs as (package, core) pairs of the online CPUs.
  std::set<std::pair<std::string, std::string>> physical;
  for (int cpu = 0; cpu < 4096; ++cpu) {
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string package = readText(base + "physical_package_id"), core = readText(base + "core_id");
    if (!core.empty()) physical.emplace(package, core);
  }
  int64_t expectedCores = discoveryUsesHwloc() && !physical.empty() ? static_cast<int64_t>(physical.size()) : online;
  EXPECT_EQ(cores, expectedCores);
  EXPECT_EQ(intAttribute(topo.node(topo.hostNode(0)).attrs, "cores", 0), expectedCores);
  EXPECT_NE(describeTopology(topo).find("numa"), std::string::npos);
  Topology parsed;
  std::string error;
  ASSERT_TRUE(parseTopologyXml(topologyToXml(topo), &parsed, &error)) << error;
  EXPECT_TRUE(parsed == topo);
}

// tests/fixtures/topo/hwloc-2socket.xml is an hwloc export of a made-up two-socket server. Socket 0: a PCIe
// switch (upstream port 01:00.0 behind root port 00:01.0) with a GPU (CUDA and NVML devices) and an InfiniBand
// HCA on two downstream ports; a second GPU alone behind root port 00:02.0; a BMC display adapter that is no GPU.
// Socket 1: a GPU seen only through OpenCL and an Ethernet NIC, straight on its root complex.
TEST(TopologyDiscovery, ReadsTheBusOfAnHwlocExport) {
  if (!discoveryUsesHwloc()) GTEST_SKIP() << "built without hwloc";
  Topology topo;
  ASSERT_EQ(discoverFromHwlocXml(fixturePath("hwloc-2socket"), &topo), loomSuccess) << threadLastError();
  EXPECT_EQ(topo.validate(), "");
  EXPECT_EQ(topo.countNodes(NodeKind::kNuma), 2);
  EXPECT_EQ(topo.countNodes(NodeKind::kGpu), 3) << "the BMC's display adapter is no GPU";
  EXPECT_EQ(topo.countNodes(NodeKind::kNic), 2);
  EXPECT_EQ(topo.countNodes(NodeKind::kPciSwitch), 1) << "root ports and single-device chains collapse";
  const Attributes& host = topo.node(topo.hostNode(0)).attrs;
  EXPECT_EQ(attributeOr(host, "model", ""), "Test Server 2S");
  EXPECT_EQ(intAttribute(host, "cores", 0), 4);
  EXPECT_EQ(intAttribute(host, "pus", 0), 8);
  const Attributes& numa0 = topo.node(topo.findNode("host0/numa0")).attrs;
  EXPECT_EQ(intAttribute(numa0, "cores", 0), 2);
  EXPECT_EQ(intAttribute(numa0, "pus", 0), 4);
  EXPECT_EQ(intAttribute(numa0, "memory", 0), 68719476736);
  struct Device {
    const char* name;
    const char* busId;
    const char* attached;  // the node its PCIe link goes to
    std::pair<const char*, const char*> attr;
  };
  const Device kDevices[] = {
      {"host0/gpu0", "0000:03:00.0", "host0/pci0", {"osdev", "cuda0,nvml0"}},
      {"host0/gpu1", "0000:05:00.0", "host0/numa0", {"index", "1"}},
      {"host0/gpu2", "0000:80:00.0", "host0/numa1", {"osdev", "opencl0d0"}},
      {"host0/nic0", "0000:04:00.0", "host0/pci0", {"hca", "mlx5_0"}},
      {"host0/nic1", "0000:80:01.0", "host0/numa1", {"fabric", "ethernet"}},
      {"host0/pci0", "0000:01:00.0", "host0/numa0", {"busid", "0000:01:00.0"}},
  };
  for (const Device& device : kDevices) {
    int id = topo.findNode(device.name);
    ASSERT_GE(id, 0) << device.name;
    const TopoNode& node = topo.node(id);
    EXPECT_EQ(attributeOr(node.attrs, "busid", ""), device.busId) << device.name;
    EXPECT_EQ(attributeOr(node.attrs, device.attr.first, ""), device.attr.second) << device.name;
    PathInfo up = topo.pathBetween(id, topo.findNode(device.attached));
    EXPECT_EQ(up.hops, 1) << device.name << " hangs from " << device.attached;
    EXPECT_EQ(up.slowest, LinkKind::kPcie) << device.name;
  }
  EXPECT_EQ(attributeOr(topo.node(topo.findNode("host0/nic0")).attrs, "netdev", ""), "ib0");
  EXPECT_EQ(findAttribute(topo.node(topo.findNode("host0/nic0")).attrs, "speed"), nullptr)
      << "an export says nothing of port speeds";
  EXPECT_NEAR(topo.pathBetween(topo.findNode("host0/gpu1"), topo.findNode("host0/numa0")).bandwidth, 15.75, 0.01)
      << "hwloc's link speed";
  PathInfo gpuToNic = topo.pathBetween(topo.findNode("host0/gpu0"), topo.findNode("host0/nic0"));
  EXPECT_EQ(gpuToNic.hops, 2) << "GPU and HCA share the switch";
  EXPECT_EQ(topo.pathBetween(topo.findNode("host0/gpu0"), topo.findNode("host0/gpu2")).slowest, LinkKind::kSmp);
  ASSERT_EQ(placeLocalRank({1, "80:00.0"}, &topo), loomSuccess) << threadLastError();
  EXPECT_EQ(topo.node(topo.rankNode(1)).name, "host0/gpu2");
  EXPECT_EQ(discoverFromHwlocXml(fixturePath("no-such-export"), &topo), loomInvalidUsage);
}

TEST(TopologyDiscovery, LocalViewPlacesACpuRankOnANumaNode) {
  unsetenv("LOOM_TOPO_FILE");
  unsetenv("LOOM_TOPO_DUMP_FILE");
  Topology topo;
  ASSERT_EQ(loadLocalTopology({5, ""}, &topo), loomSuccess) << threadLastError();
  EXPECT_EQ(topo.rankCount(), 6);
  ASSERT_GE(topo.rankNode(5), 0);
  EXPECT_EQ(topo.node(topo.rankNode(5)).kind, NodeKind::kNuma);
  EXPECT_EQ(topo.rankNode(0), -1);
  PathInfo self = topo.path(5, 5);
  EXPECT_EQ(self.slowest, LinkKind::kSharedMemory);
}

TEST(TopologyDiscovery, TopoFileAndDumpFile) {
  std::string dir = testing::TempDir();
  std::string dumpPattern = dir + "/loom-topo-dump-%r.xml";
  setenv("LOOM_TOPO_FILE", fixturePath("dgx-h100").c_str(), 1);
  setenv("LOOM_TOPO_DUMP_FILE", dumpPattern.c_str(), 1);
  Topology topo;
  ASSERT_EQ(loadLocalTopology({3, ""}, &topo), loomSuccess) << threadLastError();
  EXPECT_EQ(topo.node(topo.rankNode(3)).name, "host0/gpu3") << "the file places rank 3";
  Topology dumped;
  std::string error;
  ASSERT_TRUE(readTopologyFile(dir + "/loom-topo-dump-3.xml", &dumped, &error)) << error;
  EXPECT_TRUE(dumped == topo);
  std::remove((dir + "/loom-topo-dump-3.xml").c_str());

  setenv("LOOM_TOPO_FILE", (dir + "/no-such-topology.xml").c_str(), 1);
  unsetenv("LOOM_TOPO_DUMP_FILE");
  EXPECT_EQ(loadLocalTopology({0, ""}, &topo), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("LOOM_TOPO_FILE: " + dir + "/no-such-topology.xml: cannot open"), std::string::npos)
      << threadLastError();
  setenv("LOOM_TOPO_FILE", fixturePath("fattree-2").c_str(), 1);
  EXPECT_EQ(loadLocalTopology({16, ""}, &topo), loomInvalidUsage) << "a cluster file must place the rank";
  EXPECT_NE(threadLastError().find("has 2 hosts, expected 1"), std::string::npos) << threadLastError();
  unsetenv("LOOM_TOPO_FILE");
}

TEST(TopologyDiscovery, GpuRanksArePlacedByBusId) {
  Topology topo;
  int host = topo.addHost("host0");
  int numa = topo.addNode(NodeKind::kNuma, "host0/numa0", host, {{"os_index", "0"}});
  int gpu0 = topo.addNode(NodeKind::kGpu, "host0/gpu0", host, {{"busid", "0000:1b:00.0"}});
  int gpu1 = topo.addNode(NodeKind::kGpu, "host0/gpu1", host, {{"busid", "0000:9a:00.0"}});
  topo.addLink(LinkKind::kPcie, numa, gpu0, 31.5, 0.15);
  topo.addLink(LinkKind::kPcie, numa, gpu1, 31.5, 0.15);
  ASSERT_EQ(placeLocalRank({2, "9A:00.0"}, &topo), loomSuccess) << threadLastError();
  EXPECT_EQ(topo.rankNode(2), gpu1);
  EXPECT_EQ(placeLocalRank({3, "0000:3b:00.0"}, &topo), loomInvalidUsage);
  EXPECT_NE(threadLastError().find("no GPU with PCI address 0000:3b:00.0"), std::string::npos) << threadLastError();
  EXPECT_NE(threadLastError().find("0000:1b:00.0, 0000:9a:00.0"), std::string::npos) << threadLastError();
}

// --- Scale: routes a simulator asks for on 16,384 ranks.

void routeRingAndTree(const Topology& topo, const std::function<void(int, int, const std::vector<int>&)>& check) {
  int n = topo.rankCount();
  for (int rank = 0; rank < n; ++rank) {
    int next = (rank + 1) % n;
    std::vector<int> links = topo.route(topo.rankNode(rank), topo.rankNode(next));
    check(rank, next, links);
    int parent = binaryTreeNode(n, rank).parent;
    if (parent >= 0) check(rank, parent, topo.route(topo.rankNode(rank), topo.rankNode(parent)));
  }
}

TEST(TopologyScale, RingAndTreeOverFatTree2048) {
  Topology topo = preset("fattree:2048");
  ASSERT_EQ(topo.rankCount(), 16384);
  int64_t checked = 0;
  routeRingAndTree(topo, [&](int a, int b, const std::vector<int>& links) {
    std::string what = "rank " + std::to_string(a) + " -> " + std::to_string(b);
    expectChain(topo, topo.rankNode(a), topo.rankNode(b), links, what);
    size_t expected = a / 8 == b / 8 ? 2 : (a % 8 == b % 8 && a / 256 == b / 256) ? 6 : 8;
    ASSERT_EQ(links.size(), expected) << what;
    ++checked;
  });
  EXPECT_EQ(checked, 2 * 16384 - 1);
}

TEST(TopologyScale, RingAndTreeOverTorus3d) {
  Topology topo = preset("torus3d:32x32x16");
  ASSERT_EQ(topo.rankCount(), 16384);
  const std::vector<int> dims = {32, 32, 16};
  routeRingAndTree(topo, [&](int a, int b, const std::vector<int>& links) {
    std::string what = "rank " + std::to_string(a) + " -> " + std::to_string(b);
    expectChain(topo, topo.rankNode(a), topo.rankNode(b), links, what);
    ASSERT_EQ(static_cast<int>(links.size()), torusDistance(dims, a, b)) << what;
  });
}

}  // namespace
}  // namespace loom
