// The topology module: every preset's shape, exact XML round trips and the committed fixtures, errors that name
// the problem (bad XML, bad preset specs), and routes and paths on each kind of machine (NVSwitch, PCIe, rails of
// a fat tree, tori with wrap-around, a full mesh). Fusion, discovery and routes at scale: topology_cluster_test.cc.
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

const char* const kPresets[] = {"dgx-h100",      "pcie-8gpu", "torus2d:4x4", "torus3d:4x4x4", "torus2d:2x3:100",
                                "torus3d:1x5x3", "fattree:2", "fattree:40",  "fullmesh:8",    "fullmesh:20"};

// The sum of a node's link bandwidths of one kind.
double bandwidthOf(const Topology& topo, int node, LinkKind kind) {
  double total = 0;
  for (int link : topo.linksOf(node))
    if (topo.link(link).kind == kind) total += topo.link(link).bandwidth;
  return total;
}

// --- Presets.

TEST(TopologyPresets, EveryPresetIsValidAndPlacesEveryRankOnAnAccelerator) {
  for (const char* spec : kPresets) {
    Topology topo = preset(spec);
    EXPECT_EQ(topo.validate(), "") << spec;
    EXPECT_EQ(topo.rankCount(), topo.countNodes(NodeKind::kGpu)) << spec;
    for (int rank = 0; rank < topo.rankCount(); ++rank) {
      ASSERT_GE(topo.rankNode(rank), 0) << spec << " rank " << rank;
      EXPECT_EQ(topo.node(topo.rankNode(rank)).kind, NodeKind::kGpu) << spec << " rank " << rank;
      EXPECT_EQ(topo.rankHost(rank), topo.node(topo.rankNode(rank)).host) << spec << " rank " << rank;
    }
  }
}

TEST(TopologyPresets, SingleHostPresetsHoldTheirParts) {
  struct Shape {
    const char* spec;
    int ranks, gpus, nics, nvswitches, pciSwitches, numaNodes, nodes, links, nvlinks;
  };
  const Shape kShapes[] = {
      // spec         ranks gpus nics nvsw pcisw numa nodes links nvlinks
      {"dgx-h100", 8, 8, 8, 4, 8, 2, 31, 60, 32},
      {"pcie-8gpu", 8, 8, 2, 0, 4, 2, 17, 18, 0},
  };
  for (const Shape& shape : kShapes) {
    Topology topo = preset(shape.spec);
    EXPECT_EQ(topo.hostCount(), 1) << shape.spec;
    EXPECT_EQ(topo.rankCount(), shape.ranks) << shape.spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kGpu), shape.gpus) << shape.spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kNic), shape.nics) << shape.spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kNvSwitch), shape.nvswitches) << shape.spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kPciSwitch), shape.pciSwitches) << shape.spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kNuma), shape.numaNodes) << shape.spec;
    EXPECT_EQ(topo.nodeCount(), shape.nodes) << shape.spec;
    EXPECT_EQ(topo.linkCount(), shape.links) << shape.spec;
    EXPECT_EQ(topo.countLinks(LinkKind::kNvLink), shape.nvlinks) << shape.spec;
  }
}

TEST(TopologyPresets, DgxH100GpusHave450GBpsOfNvLinkToFourNvSwitches) {
  Topology topo = preset("dgx-h100");
  for (int rank = 0; rank < 8; ++rank) {
    int gpu = topo.rankNode(rank);
    EXPECT_DOUBLE_EQ(bandwidthOf(topo, gpu, LinkKind::kNvLink), 450.0) << "GPU " << rank;
    int nvswitches = 0;
    for (int link : topo.linksOf(gpu)) nvswitches += topo.node(topo.link(link).other(gpu)).kind == NodeKind::kNvSwitch;
    EXPECT_EQ(nvswitches, 4) << "GPU " << rank << " links to every NVSwitch";
  }
  for (int id = 0; id < topo.nodeCount(); ++id) {
    if (topo.node(id).kind != NodeKind::kNic) continue;
    EXPECT_EQ(attributeOr(topo.node(id).attrs, "speed", ""), "400") << topo.node(id).name;
  }
}

TEST(TopologyPresets, ToriLinkEveryChipToItsNeighbours) {
  struct Case {
    const char* spec;
    int chips, hosts, links, perChip;
    double bandwidth;
  };
  const Case kCases[] = {
      {"torus2d:4x4", 16, 4, 32, 4, 50},
      {"torus3d:4x4x4", 64, 16, 192, 6, 50},
      {"torus2d:2x3:100", 6, 2, 9, -1, 100},  // a ring of 2 is one link
      {"torus3d:1x5x3", 15, 4, 30, 4, 50},    // a ring of 1 none
      {"torus3d:8x8x4:45.5", 256, 64, 768, 6, 45.5},
  };
  for (const Case& c : kCases) {
    Topology topo = preset(c.spec);
    EXPECT_EQ(topo.rankCount(), c.chips) << c.spec;
    EXPECT_EQ(topo.hostCount(), c.hosts) << c.spec;
    EXPECT_EQ(topo.countLinks(LinkKind::kNvLink), c.links) << c.spec;
    for (int rank = 0; rank < topo.rankCount(); ++rank) {
      int chip = topo.rankNode(rank);
      int fabric = 0;
      for (int link : topo.linksOf(chip)) {
        if (topo.link(link).kind != LinkKind::kNvLink) continue;
        ++fabric;
        EXPECT_EQ(topo.link(link).bandwidth, c.bandwidth) << c.spec;
      }
      if (c.perChip >= 0) {
        EXPECT_EQ(fabric, c.perChip) << c.spec << " chip " << rank;
      }
    }
  }
}

TEST(TopologyPresets, FatTreeIsRailOptimisedAndNonBlocking) {
  for (int nodes : {1, 2, 40, 64}) {
    std::string spec = "fattree:" + std::to_string(nodes);
    Topology topo = preset(spec);
    EXPECT_EQ(topo.rankCount(), 8 * nodes) << spec;
    EXPECT_EQ(topo.hostCount(), nodes) << spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kNic), 8 * nodes) << spec;
    EXPECT_EQ(topo.countNodes(NodeKind::kGpu), 8 * nodes) << spec;
    int perLeaf = std::min(nodes, 32), leaves = 8 * ((nodes + perLeaf - 1) / perLeaf);
    EXPECT_EQ(topo.countNodes(NodeKind::kNetSwitch), leaves + perLeaf) << spec;
    EXPECT_EQ(topo.countLinks(LinkKind::kNetwork), 8 * nodes + leaves * perLeaf) << spec;
    EXPECT_EQ(topo.linkCount(), 60 * nodes + 8 * nodes + leaves * perLeaf) << spec;
    // NIC i of every node sits on a leaf of rail i; every leaf has as much bandwidth up as it can take down.
    for (int id = 0; id < topo.nodeCount(); ++id) {
      const TopoNode& node = topo.node(id);
      if (node.kind == NodeKind::kNic) {
        std::vector<int> links = topo.linksOf(id);
        int leaf = -1;
        for (int link : links)
          if (topo.link(link).kind == LinkKind::kNetwork) leaf = topo.link(link).other(id);
        ASSERT_GE(leaf, 0) << node.name;
        std::string rail = "rail" + attributeOr(node.attrs, "index", "?") + "-";
        EXPECT_EQ(topo.node(leaf).name.rfind(rail, 0), 0u) << node.name << " is on " << topo.node(leaf).name;
      }
      if (node.kind == NodeKind::kNetSwitch && node.name.find("leaf") != std::string::npos) {
        double down = 0, up = 0;
        for (int link : topo.linksOf(id)) {
          NodeKind peer = topo.node(topo.link(link).other(id)).kind;
          (peer == NodeKind::kNic ? down : up) += topo.link(link).bandwidth;
        }
        EXPECT_GE(up, down) << node.name;
      }
    }
  }
}

TEST(TopologyPresets, FullMeshLinksEveryPair) {
  for (int npus : {8, 20}) {
    Topology topo = preset("fullmesh:" + std::to_string(npus));
    EXPECT_EQ(topo.rankCount(), npus);
    EXPECT_EQ(topo.hostCount(), (npus + 7) / 8);
    EXPECT_EQ(topo.countLinks(LinkKind::kNvLink), npus * (npus - 1) / 2);
    for (int a = 0; a < npus; ++a) {
      for (int b = 0; b < npus; ++b) {
        if (a == b) continue;
        PathInfo info = topo.path(a, b);
        EXPECT_EQ(info.hops, 1) << a << " -> " << b;
        EXPECT_EQ(info.bandwidth, 56.0) << a << " -> " << b;
      }
    }
  }
}

TEST(TopologyPresets, BadSpecsNameTheProblem) {
  const std::pair<const char*, const char*> kBad[] = {
      {"dgx-a100", "unknown preset \"dgx-a100\""},
      {"", "unknown preset \"\""},
      {"dgx-h100:2", "takes no parameters, found \"2\""},
      {"torus2d:4", "needs 2 dimensions, found 1"},
      {"torus3d:4x4", "needs 3 dimensions, found 2"},
      {"torus2d:4x0", "dimension \"0\" is not a positive integer"},
      {"torus2d:4xfour", "dimension \"four\" is not a positive integer"},
      {"torus2d:4x4:-5", "link bandwidth \"-5\" is not a positive number"},
      {"torus2d:4x4:", "link bandwidth \"\" is not a positive number"},
      {"torus3d:1024x1024x4", "more than 1048576 chips"},
      {"fattree:0", "node count \"0\" is not an integer from 1 to 16384"},
      {"fattree:abc", "node count \"abc\""},
      {"fattree", "node count \"\""},
      {"fullmesh:2000", "NPU count \"2000\" is not an integer from 1 to 1024"},
  };
  for (const auto& [spec, expected] : kBad) {
    Topology topo;
    std::string error;
    EXPECT_FALSE(makePreset(spec, &topo, &error)) << spec;
    EXPECT_NE(error.find(expected), std::string::npos) << spec << ": " << error;
    EXPECT_EQ(topo.nodeCount(), 0) << spec;
  }
}

// --- XML.

TEST(TopologyXml, EveryPresetRoundTripsExactly) {
  for (const char* spec : kPresets) {
    Topology topo = preset(spec);
    std::string xml = topologyToXml(topo);
    Topology parsed;
    std::string error;
    ASSERT_TRUE(parseTopologyXml(xml, &parsed, &error)) << spec << ": " << error;
    EXPECT_TRUE(parsed == topo) << spec;
    EXPECT_EQ(topologyToXml(parsed), xml) << spec;
  }
}

TEST(TopologyXml, FixturesAreThePresets) {
  const std::pair<const char*, const char*> kFixtures[] = {
      {"dgx-h100", "dgx-h100"},           {"pcie-8gpu", "pcie-8gpu"}, {"torus2d-4x4", "torus2d:4x4"},
      {"torus3d-4x4x4", "torus3d:4x4x4"}, {"fattree-2", "fattree:2"}, {"fullmesh-8", "fullmesh:8"}};
  for (const auto& [file, spec] : kFixtures) {
    Topology fromFile;
    std::string error;
    ASSERT_TRUE(readTopologyFile(fixturePath(file), &fromFile, &error)) << error;
    Topology built = preset(spec);
    EXPECT_TRUE(fromFile == built) << file << " differs from preset " << spec << " (regenerate: loom-topo --preset "
                                   << spec << " --xml)";
    EXPECT_EQ(readText(fixturePath(file)), topologyToXml(built)) << file;
  }
}

TEST(TopologyXml, ValuesWithMarkupCharactersRoundTrip) {
  Topology topo;
  int host = topo.addHost("host0", {{"model", "A<B & \"C\" 'D' >\tE\nF"}});
  int numa = topo.addNode(NodeKind::kNuma, "host0/numa0", host, {{"os_index", "0"}});
  topo.addLink(LinkKind::kSmp, topo.hostNode(host), numa, 0.1 + 0.2, 1e-3);
  topo.addLink(LinkKind::kSharedMemory, numa, numa, 1.0 / 3.0, 123456.789);
  topo.mapRank(2, numa);
  setAttribute(&topo.attributes(), "note", "x&y");
  std::string xml = topologyToXml(topo);
  Topology parsed;
  std::string error;
  ASSERT_TRUE(parseTopologyXml(xml, &parsed, &error)) << error;
  EXPECT_TRUE(parsed == topo) << xml;
  EXPECT_EQ(parsed.rankCount(), 3);
  EXPECT_EQ(parsed.rankNode(0), -1);
  EXPECT_EQ(parsed.link(0).bandwidth, 0.1 + 0.2) << "doubles are written exactly";
}

TEST(TopologyXml, ReadsCommentsDeclarationsAndSingleQuotes) {
  const char* text =
      "\xEF\xBB\xBF<?xml version='1.0'?>\n<!-- a comment -->\n<topology version='1'>\n"
      "  <!-- another --><node name='h' kind='host' host='0'></node>\n"
      "  <node name=\"h/n\" kind=\"numa\" host=\"0\" cores = \"4\" />\n"
      "  <link kind=\"smp\" from=\"h\" to=\"h/n\" bw=\"10\" lat=\"0\"/>\n  <rank id=\"0\" "
      "node=\"h/n\"/>\n</topology>\n";
  Topology topo;
  std::string error;
  ASSERT_TRUE(parseTopologyXml(text, &topo, &error)) << error;
  EXPECT_EQ(topo.nodeCount(), 2);
  EXPECT_EQ(intAttribute(topo.node(1).attrs, "cores", 0), 4);
  EXPECT_EQ(topo.rankNode(0), 1);
}

TEST(TopologyXml, BadInputNamesTheProblemAndTheLine) {
  const std::string head = "<topology version=\"1\">\n<node name=\"h\" kind=\"host\" host=\"0\"/>\n";
  const std::pair<std::string, std::string> kBad[] = {
      {"", "line 1: expected an element, found the end of the input"},
      {"hello", "line 1: expected an element, found text"},
      {"<topology version=\"1\">\n<node name=\"h\" kind=\"host\" host=\"0\">\n</topology>",
       "line 3: </topology> closes <node> opened on line 2"},
      {head, "line 3: <topology> (line 1) is not closed"},
      {head + "<node name=\"x\" kind=\"cpu\" host=\"0\"/>\n</topology>", "line 3: node \"x\" has unknown kind \"cpu\""},
      {head + "<node name=\"h\" kind=\"numa\" host=\"0\"/>\n</topology>",
       "line 3: node name \"h\" is used twice (first on line 2)"},
      {head + "<node name=\"n\" kind=\"numa\"/>\n</topology>", "line 3: <node> has no host attribute"},
      {head + "<node name=\"n\" kind=\"numa\" host=\"zero\"/>\n</topology>",
       "line 3: <node> host=\"zero\" is not an integer"},
      {head + "<node name=\"n\" kind=\"numa\" host=\"3\"/>\n</topology>",
       "line 3: node \"n\" has host=\"3\", but the file has 1 host nodes"},
      {head + "<node name=\"n\" kind=\"gpu\" host=\"-1\"/>\n</topology>",
       "line 3: node \"n\" of kind gpu needs a host (only switches may have host=\"-1\")"},
      {head + "<node name=\"s\" kind=\"netswitch\" host=\"0\"/>\n</topology>",
       "line 3: network switch \"s\" must have host=\"-1\""},
      {head + "<node name=\"g\" kind=\"host\" host=\"5\"/>\n</topology>",
       "line 3: host node \"g\" has host=\"5\"; host nodes must be numbered 0, 1, ... in file order (expected 1)"},
      {head + "<link kind=\"smp\" from=\"h\" to=\"nowhere\" bw=\"1\" lat=\"0\"/>\n</topology>",
       "line 3: <link> to=\"nowhere\" names no node"},
      {head + "<link kind=\"smp\" from=\"h\" to=\"h\" bw=\"fast\" lat=\"0\"/>\n</topology>",
       "line 3: <link> bw=\"fast\" is not a number"},
      {head + "<link kind=\"smp\" from=\"h\" to=\"h\" bw=\"-1\" lat=\"0\"/>\n</topology>",
       "line 3: link bw=\"-1\" is not a positive bandwidth"},
      {head + "<link kind=\"shm\" from=\"h\" to=\"h\" bw=\"inf\" lat=\"0\"/>\n</topology>",
       "line 3: link bw=\"inf\" is not a positive bandwidth"},
      {head + "<link kind=\"shm\" from=\"h\" to=\"h\" bw=\"1\" lat=\"nan\"/>\n</topology>",
       "line 3: link lat=\"nan\" is not a latency >= 0"},
      {head + "<link kind=\"smp\" from=\"h\" to=\"h\" bw=\"1\" lat=\"0\"/>\n</topology>",
       "line 3: a smp link joins \"h\" to itself"},
      {head + "<node name=\"n\" kind=\"numa\" host=\"0\"/>\n<link kind=\"shm\" from=\"h\" to=\"n\" bw=\"1\" "
              "lat=\"0\"/>\n</topology>",
       "line 4: an shm link must join a node to itself"},
      {head + "<link kind=\"ethernet\" from=\"h\" to=\"h\" bw=\"1\" lat=\"0\"/>\n</topology>",
       "line 3: link has unknown kind \"ethernet\""},
      {head + "<link kind=\"shm\" from=\"h\" to=\"h\" bw=\"1\" lat=\"0\" width=\"2\"/>\n</topology>",
       "line 3: <link> has an unknown attribute width"},
      {head + "<rank id=\"0\" node=\"h\"/>\n<rank id=\"0\" node=\"h\"/>\n</topology>",
       "line 4: rank 0 is placed twice"},
      {head + "<rank id=\"-1\" node=\"h\"/>\n</topology>", "line 3: rank id -1 is out of range"},
      {head + "<gpu name=\"g\"/>\n</topology>", "line 3: unknown element <gpu> (expected node, link or rank)"},
      {"<topology version=\"2\"/>", "line 1: <topology> version \"2\" is not supported"},
      {"<topology/>", "line 1: <topology> has no version attribute"},
      {"<graph version=\"1\"/>", "line 1: the root element is <graph>, expected <topology>"},
      {"\n\n<!-- never closed\n<topology version=\"1\"/>", "line 3: comment is not closed with -->"},
      {"<topology version=\"1\" a=\"1\" a=\"2\"/>", "line 1: attribute a appears twice in <topology>"},
      {"<topology version=\"1\" a=\"&nbsp;\"/>", "line 1: unknown entity &nbsp;"},
      {"<topology version=\"1\" a=\"x<y\"/>", "line 1: '<' inside an attribute value"},
      {"<topology version=\"1\" a=1/>", "line 1: expected a quoted value"},
      {"<topology version=\"1\">\n  stray words\n</topology>",
       "line 2: unexpected text \"stray words\" inside <topology>"},
      {"<topology version=\"1\"/>\n<topology version=\"1\"/>",
       "line 2: unexpected content after the closing </topology>"},
      {"<!DOCTYPE topology>\n<topology version=\"1\"/>", "line 1: DOCTYPE and CDATA sections are not supported"},
      {head +
           "<node name=\"n\" kind=\"numa\" host=\"0\"><node name=\"m\" kind=\"numa\" host=\"0\"/></node>\n</topology>",
       "line 3: <node> may not contain <node>"},
  };
  for (const auto& [text, expected] : kBad) {
    Topology topo;
    std::string error;
    EXPECT_FALSE(parseTopologyXml(text, &topo, &error)) << text;
    EXPECT_NE(error.find(expected), std::string::npos) << "input:\n"
                                                       << text << "\nerror: " << error << "\nexpected: " << expected;
  }
}

TEST(TopologyXml, DeepNestingIsRefused) {
  std::string text = "<topology version=\"1\">";
  for (int i = 0; i < 100; ++i) text += "<node>";
  Topology topo;
  std::string error;
  EXPECT_FALSE(parseTopologyXml(text, &topo, &error));
  EXPECT_NE(error.find("nest deeper than"), std::string::npos) << error;
}

TEST(TopologyXml, MissingFileNamesThePath) {
  Topology topo;
  std::string error;
  EXPECT_FALSE(readTopologyFile("/nonexistent/topo.xml", &topo, &error));
  EXPECT_NE(error.find("/nonexistent/topo.xml: cannot open"), std::string::npos) << error;
}

// --- Routes and paths.

TEST(TopologyRoutes, DgxH100GpusMeetThroughAnNvSwitchAtFullNvLinkBandwidth) {
  Topology topo = preset("dgx-h100");
  std::vector<int> links = routeBetween(topo, 0, 5);
  ASSERT_EQ(links.size(), 2u);
  std::vector<int> nodes = topo.nodesAlong(topo.rankNode(0), links);
  EXPECT_EQ(topo.node(nodes[1]).kind, NodeKind::kNvSwitch);
  PathInfo info = topo.path(0, 5);
  EXPECT_TRUE(info.reachable);
  EXPECT_DOUBLE_EQ(info.bandwidth, 450.0) << "the four NVSwitches carry a transfer together";
  EXPECT_EQ(info.hops, 2);
  EXPECT_EQ(info.slowest, LinkKind::kNvLink);
  EXPECT_NEAR(info.latency, 0.7, 1e-9);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      EXPECT_EQ(topo.path(a, b).hops, 2) << a << " -> " << b;
      EXPECT_EQ(topo.route(topo.rankNode(a), topo.rankNode(b)), routeBetween(topo, a, b)) << "deterministic";
    }
  }
}

TEST(TopologyRoutes, DgxH100HostPaths) {
  Topology topo = preset("dgx-h100");
  int gpu0 = topo.findNode("host0/gpu0"), nic0 = topo.findNode("host0/nic0");
  int numa0 = topo.findNode("host0/numa0"), numa1 = topo.findNode("host0/numa1");
  PathInfo toNic = topo.pathBetween(gpu0, nic0);
  EXPECT_EQ(toNic.hops, 2) << "GPU and NIC share a PCIe switch";
  EXPECT_EQ(toNic.slowest, LinkKind::kPcie);
  EXPECT_DOUBLE_EQ(toNic.bandwidth, 63.0);
  PathInfo sockets = topo.pathBetween(numa0, numa1);
  EXPECT_EQ(sockets.hops, 2);
  EXPECT_EQ(sockets.slowest, LinkKind::kSmp);
  PathInfo local = topo.pathBetween(numa0, numa0);
  EXPECT_EQ(local.hops, 1) << "two processes on one socket meet in its shared memory";
  EXPECT_EQ(local.slowest, LinkKind::kSharedMemory);
  EXPECT_EQ(topo.egressOf(gpu0), -1) << "a lone DGX has no network";
}

TEST(TopologyRoutes, PcieBoxCrossesSocketsOverSmp) {
  Topology topo = preset("pcie-8gpu");
  PathInfo sameSwitch = topo.path(0, 1);
  EXPECT_EQ(sameSwitch.hops, 2);
  EXPECT_EQ(sameSwitch.slowest, LinkKind::kPcie);
  EXPECT_DOUBLE_EQ(sameSwitch.bandwidth, 31.5);
  PathInfo sameSocket = topo.path(0, 2);
  EXPECT_EQ(sameSocket.hops, 4);
  EXPECT_EQ(sameSocket.slowest, LinkKind::kPcie);
  PathInfo crossSocket = topo.path(0, 7);
  EXPECT_EQ(crossSocket.hops, 6);
  EXPECT_EQ(crossSocket.slowest, LinkKind::kSmp);
  EXPECT_TRUE(routeVisits(topo, 0, routeBetween(topo, 0, 7), "host0"));
}

TEST(TopologyRoutes, FatTreeCrossesNodesOnTheGpusRail) {
  Topology topo = preset("fattree:2");
  // GPU 3 of node 0 to GPU 3 of node 1: NIC 3, the rail-3 leaf, NIC 3.
  std::vector<int> links = routeBetween(topo, 3, 11);
  EXPECT_EQ(links.size(), 6u);
  EXPECT_TRUE(routeVisits(topo, 3, links, "host0/nic3"));
  EXPECT_TRUE(routeVisits(topo, 3, links, "rail3-leaf0"));
  EXPECT_TRUE(routeVisits(topo, 3, links, "host1/nic3"));
  PathInfo info = topo.path(3, 11);
  EXPECT_DOUBLE_EQ(info.bandwidth, 50.0);
  EXPECT_EQ(info.slowest, LinkKind::kNetwork);
  EXPECT_GE(info.latency, 2.0);
  EXPECT_LE(info.latency, 5.0);
  // Across rails: out through the source GPU's NIC, over a spine, in through the destination GPU's NIC.
  links = routeBetween(topo, 3, 13);
  EXPECT_EQ(links.size(), 8u);
  EXPECT_TRUE(routeVisits(topo, 3, links, "host0/nic3"));
  EXPECT_TRUE(routeVisits(topo, 3, links, "host1/nic5"));
  EXPECT_DOUBLE_EQ(topo.path(3, 13).bandwidth, 50.0);
  for (int rank = 0; rank < 16; ++rank) {
    std::string expected = "host" + std::to_string(rank / 8) + "/nic" + std::to_string(rank % 8);
    EXPECT_EQ(topo.node(topo.egressOf(topo.rankNode(rank))).name, expected) << "rank " << rank;
  }
  // Within a node the GPUs stay on NVLink.
  EXPECT_EQ(topo.path(8, 13).slowest, LinkKind::kNvLink);
}

TEST(TopologyRoutes, FatTreeLeavesMeetAtTheSpines) {
  Topology topo = preset("fattree:64");  // two leaves per rail
  int far = 8 * 40 + 3;                  // GPU 3 of node 40, on the second rail-3 leaf
  std::vector<int> links = routeBetween(topo, 3, far);
  EXPECT_EQ(links.size(), 8u);
  EXPECT_TRUE(routeVisits(topo, 3, links, "rail3-leaf0"));
  EXPECT_TRUE(routeVisits(topo, 3, links, "rail3-leaf1"));
  EXPECT_DOUBLE_EQ(topo.path(3, far).bandwidth, 50.0);
  // Flows between different pairs of leaves spread over the spines.
  std::set<int> spines;
  for (int src = 0; src < 32; ++src) {
    std::vector<int> route = routeBetween(topo, 8 * src + 3, 8 * (32 + src) + 3);
    std::vector<int> nodes = topo.nodesAlong(topo.rankNode(8 * src + 3), route);
    spines.insert(nodes[4]);
  }
  EXPECT_GT(spines.size(), 8u);
}

TEST(TopologyRoutes, TorusHopsCountTheWrapAround) {
  for (const char* spec : {"torus2d:4x4", "torus3d:4x4x4", "torus2d:5x3", "torus3d:2x3x4"}) {
    Topology topo = preset(spec);
    std::vector<int> dims;
    std::string shape = std::string(spec).substr(8);
    for (size_t start = 0; start < shape.size();) {
      size_t x = shape.find('x', start);
      dims.push_back(std::stoi(shape.substr(start, x - start)));
      start = x == std::string::npos ? shape.size() : x + 1;
    }
    for (int a = 0; a < topo.rankCount(); ++a) {
      for (int b = 0; b < topo.rankCount(); ++b) {
        if (a == b) continue;
        std::vector<int> links = routeBetween(topo, a, b);
        EXPECT_EQ(static_cast<int>(links.size()), torusDistance(dims, a, b)) << spec << " " << a << " -> " << b;
        PathInfo info = topo.path(a, b);
        EXPECT_EQ(info.slowest, LinkKind::kNvLink) << spec;
        EXPECT_EQ(info.bandwidth, 50.0) << spec;
      }
    }
  }
  Topology torus = preset("torus2d:4x4");
  EXPECT_EQ(torus.path(0, 1).hops, 1);
  EXPECT_EQ(torus.path(0, 3).hops, 1) << "x wraps around";
  EXPECT_EQ(torus.path(0, 12).hops, 1) << "y wraps around";
  EXPECT_EQ(torus.path(0, 10).hops, 4) << "(0,0) to (2,2)";
  EXPECT_EQ(torus.path(0, 15).hops, 2) << "(0,0) to (3,3) wraps both ways";
}

TEST(TopologyRoutes, UnreachableAndInvalidNodes) {
  Topology topo;
  topo.addHost("a");
  topo.addHost("b");
  EXPECT_TRUE(topo.route(0, 1).empty());
  EXPECT_FALSE(topo.pathBetween(0, 1).reachable);
  EXPECT_FALSE(topo.pathBetween(0, 7).reachable);
  EXPECT_FALSE(topo.path(0, 1).reachable) << "ranks not placed";
  PathInfo self = topo.pathBetween(0, 0);
  EXPECT_TRUE(self.reachable);
  EXPECT_EQ(self.hops, 0);
}

TEST(TopologyRoutes, RouteOfAHandWrittenGraphWithoutHostsStructure) {
  // Two hosts joined directly by their NUMA nodes over a network link: the structured search finds no egress
  // and the route falls back to a plain shortest path.
  Topology topo;
  int a = topo.addHost("a"), b = topo.addHost("b");
  int numaA = topo.addNode(NodeKind::kNuma, "a/numa0", a), numaB = topo.addNode(NodeKind::kNuma, "b/numa0", b);
  topo.addLink(LinkKind::kSmp, topo.hostNode(a), numaA, 10, 0.1);
  topo.addLink(LinkKind::kSmp, topo.hostNode(b), numaB, 10, 0.1);
  topo.addLink(LinkKind::kNetwork, numaA, numaB, 5, 3);
  ASSERT_EQ(topo.validate(), "");
  PathInfo info = topo.pathBetween(topo.hostNode(a), topo.hostNode(b));
  EXPECT_TRUE(info.reachable);
  EXPECT_EQ(info.hops, 3);
  EXPECT_EQ(info.bandwidth, 5);
  EXPECT_NEAR(info.latency, 3.2, 1e-9);
}

TEST(TopologyRoutes, ConcurrentQueriesAgreeWithSerialOnes) {
  Topology topo = preset("fattree:4");
  int n = topo.rankCount();
  std::vector<std::vector<int>> serial;
  {
    Topology copy = topo;  // its own index, built here
    for (int rank = 0; rank < n; ++rank) serial.push_back(copy.route(copy.rankNode(rank), copy.rankNode(n - 1 - rank)));
  }
  std::vector<std::vector<std::vector<int>>> found(4, std::vector<std::vector<int>>(n));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {  // the first queries race to build the index
      for (int i = 0; i < n; ++i) {
        int rank = (i + t * 7) % n;
        found[t][rank] = topo.route(topo.rankNode(rank), topo.rankNode(n - 1 - rank));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t)
    for (int rank = 0; rank < n; ++rank) EXPECT_EQ(found[t][rank], serial[rank]) << "thread " << t << " rank " << rank;
}

}  // namespace
}  // namespace loom
