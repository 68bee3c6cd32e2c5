// loom-topo: shows a topology (a preset, an XML file, or this host as discovered) as an indented tree, as loom's
// XML, or as a Graphviz drawing with the edges a collective's plan uses drawn over it. It also answers route
// questions between two ranks. It reads and builds plans only; it never runs a collective.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/builders.h"
#include "src/base/check.h"
#include "src/topology/describe.h"
#include "src/topology/discover.h"
#include "src/topology/presets.h"
#include "src/topology/xml.h"

extern char** environ;

namespace loom {
namespace {

struct Options {
  std::string preset, file, hwlocExport;
  enum class Output { kTree, kXml, kDot } output = Output::kTree;
  std::string dotPath;
  std::string collective, algorithm;
  int nranks = -1;
  int channels = 1;
  bool all = false;
  int pathFrom = -1, pathTo = -1;
};

[[noreturn]] void usage(int status) {
  std::FILE* out = status == 0 ? stdout : stderr;
  std::fprintf(
      out,
      "usage: loom-topo [--preset SPEC | --file TOPO.xml | --hwloc EXPORT.xml]\n"
      "                 [--tree | --xml | --dot OUT.{dot,svg,png}]\n"
      "                 [--collective NAME [--algorithm NAME] [--nranks N] [--channels C]]\n"
      "                 [--path RANK RANK] [--all]\n"
      "The topology: a preset, loom's XML (--file), what discovery makes of an hwloc export of any machine\n"
      "(--hwloc, from lstopo --of xml), or by default this host as discovered. --tree (the default) prints\n"
      "it as an indented tree (--all: every host and switch), --xml as loom's topology XML, --dot as a\n"
      "Graphviz drawing (rendered with dot when OUT ends in .svg or .png and dot is installed) with the\n"
      "sends of --collective's plan on every rank drawn over it, one colour per channel. --path prints the\n"
      "route between two ranks and what it costs.\n"
      "Collectives: allreduce, broadcast, reduce, allgather, reducescatter, alltoall, gather, scatter, barrier\n"
      "Presets:\n");
  for (const std::string& line : presetUsage()) std::fprintf(out, "  %s\n", line.c_str());
  std::exit(status);
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "loom-topo: %s\n", message.c_str());
  std::exit(1);
}

int parsePositive(const char* flag, const char* text, int minimum) {
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < minimum || value > (1 << 24))
    die(std::string(flag) + " \"" + text + "\" is not an integer >= " + std::to_string(minimum));
  return static_cast<int>(value);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--preset")
      options.preset = value();
    else if (flag == "--file")
      options.file = value();
    else if (flag == "--hwloc")
      options.hwlocExport = value();
    else if (flag == "--tree")
      options.output = Options::Output::kTree;
    else if (flag == "--xml")
      options.output = Options::Output::kXml;
    else if (flag == "--dot") {
      options.output = Options::Output::kDot;
      options.dotPath = value();
    } else if (flag == "--collective")
      options.collective = value();
    else if (flag == "--algorithm")
      options.algorithm = value();
    else if (flag == "--nranks")
      options.nranks = parsePositive("--nranks", value(), 1);
    else if (flag == "--channels")
      options.channels = parsePositive("--channels", value(), 1);
    else if (flag == "--all")
      options.all = true;
    else if (flag == "--path") {
      options.pathFrom = parsePositive("--path", value(), 0);
      options.pathTo = parsePositive("--path", value(), 0);
    } else if (flag == "-h" || flag == "--help")
      usage(0);
    else {
      std::fprintf(stderr, "loom-topo: unknown option %s\n", flag.c_str());
      usage(2);
    }
  }
  if (!options.preset.empty() + !options.file.empty() + !options.hwlocExport.empty() > 1)
    die("give one of --preset, --file and --hwloc");
  if (!options.collective.empty() && options.output != Options::Output::kDot)
    die("--collective draws over a Graphviz drawing: add --dot OUT.svg");
  return options;
}

Topology loadTopology(const Options& options) {
  Topology topo;
  std::string error;
  if (!options.preset.empty()) {
    if (!makePreset(options.preset, &topo, &error)) die(error);
  } else if (!options.file.empty()) {
    if (!readTopologyFile(options.file, &topo, &error)) die(error);
  } else if (!options.hwlocExport.empty()) {
    if (discoverFromHwlocXml(options.hwlocExport, &topo) != loomSuccess) die(threadLastError());
  } else {
    if (discoverLocalTopology(&topo) != loomSuccess) die("discovery failed (run with LOOM_DEBUG=INFO for details)");
    if (placeLocalRank({}, &topo) != loomSuccess) die("cannot place rank 0 on this host");
  }
  return topo;
}

Collective parseCollective(const std::string& name) {
  const Collective kDrawable[] = {Collective::kAllReduce, Collective::kBroadcast,     Collective::kReduce,
                                  Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll,
                                  Collective::kGather,    Collective::kScatter,       Collective::kBarrier};
  std::string wanted;
  for (char c : name) wanted += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (Collective collective : kDrawable) {
    std::string known;
    for (const char* c = collectiveName(collective); *c != '\0'; ++c)
      known += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    if (known == wanted) return collective;
  }
  die("unknown collective \"" + name +
      "\" (allreduce, broadcast, reduce, allgather, reducescatter, alltoall, "
      "gather, scatter, barrier)");
}

// Every distinct (rank, peer, channel) that some step of the collective's plan sends over.
std::set<std::tuple<int, int, int>> planSends(const Options& options, int nranks) {
  Collective collective = parseCollective(options.collective);
  std::set<std::tuple<int, int, int>> sends;
  for (int rank = 0; rank < nranks; ++rank) {
    CollArgs args;
    args.collective = collective;
    args.nranks = nranks;
    args.rank = rank;
    args.count = collective == Collective::kBarrier ? 1 : static_cast<size_t>(nranks) * 64 * options.channels;
    args.nChannels = options.channels;
    RankPlan plan;
    if (!buildPlan(args, options.algorithm, &plan)) {
      std::string known;
      for (const std::string& algorithm : algorithmsFor(collective)) known += (known.empty() ? "" : ", ") + algorithm;
      die("no algorithm \"" + options.algorithm + "\" for " + options.collective + " (" + known + ")");
    }
    for (const Lane& lane : plan.lanes)
      for (const Step& step : lane.steps)
        if (actionSends(step.action)) sends.emplace(rank, step.sendPeer, lane.channel);
  }
  return sends;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string dotText(const Topology& topo, const Options& options) {
  static const char* kShapes[kNodeKinds] = {"house", "box", "diamond", "box3d", "hexagon", "ellipse", "octagon"};
  static const char* kLinkColours[kLinkKinds] = {"forestgreen", "royalblue", "gray50", "darkorange", "black"};
  static const char* kChannelColours[] = {"red", "magenta", "cyan3", "gold3", "purple", "brown", "deeppink", "teal"};
  std::string out =
      "graph loom {\n  graph [fontname=Helvetica, overlap=false];\n"
      "  node [fontname=Helvetica, fontsize=10];\n  edge [fontname=Helvetica, fontsize=8];\n";
  std::vector<std::string> ranksOf(topo.nodeCount());
  for (int rank = 0; rank < topo.rankCount(); ++rank) {
    int node = topo.rankNode(rank);
    if (node >= 0) ranksOf[node] += (ranksOf[node].empty() ? ", rank " : ",") + std::to_string(rank);
  }
  // Inside a host's box, a node is labelled without the host's prefix.
  auto nodeLine = [&](int id, const char* indent) {
    const TopoNode& node = topo.node(id);
    std::string label = node.name;
    if (node.host >= 0) {
      const std::string& prefix = topo.node(topo.hostNode(node.host)).name + "/";
      if (label.compare(0, prefix.size(), prefix) == 0 && label.size() > prefix.size())
        label = label.substr(prefix.size());
    }
    out += std::string(indent) + "n" + std::to_string(id) +
           " [label=" + quoted(label + "\n" + nodeKindName(node.kind) + ranksOf[id]) +
           ", shape=" + kShapes[static_cast<int>(node.kind)] + "];\n";
  };
  std::vector<std::vector<int>> members(topo.hostCount());
  for (int id = 0; id < topo.nodeCount(); ++id) {
    if (topo.node(id).host >= 0)
      members[topo.node(id).host].push_back(id);
    else
      nodeLine(id, "  ");
  }
  for (int host = 0; host < topo.hostCount(); ++host) {
    out += "  subgraph cluster_host" + std::to_string(host) +
           " {\n    label=" + quoted(topo.node(topo.hostNode(host)).name) + ";\n";
    for (int id : members[host]) nodeLine(id, "    ");
    out += "  }\n";
  }
  for (const TopoLink& link : topo.links()) {
    char label[64];
    std::snprintf(label, sizeof(label), "%s %g", linkKindName(link.kind), link.bandwidth);
    out += "  n" + std::to_string(link.a) + " -- n" + std::to_string(link.b) + " [label=" + quoted(label) +
           ", color=" + kLinkColours[static_cast<int>(link.kind)] + "];\n";
  }
  if (!options.collective.empty()) {
    int placed = 0;
    while (placed < topo.rankCount() && topo.rankNode(placed) >= 0) ++placed;
    int nranks = options.nranks > 0 ? options.nranks : placed;
    if (nranks < 1 || nranks > placed) {
      die("the topology places ranks 0.." + std::to_string(placed - 1) + ", so --nranks must be 1 to " +
          std::to_string(placed));
    }
    for (const auto& [rank, peer, channel] : planSends(options, nranks)) {
      out += "  n" + std::to_string(topo.rankNode(rank)) + " -- n" + std::to_string(topo.rankNode(peer)) +
             " [dir=forward, constraint=false, penwidth=2, color=" +
             kChannelColours[channel % (sizeof(kChannelColours) / sizeof(kChannelColours[0]))] +
             ", label=" + quoted("r" + std::to_string(rank) + " ch" + std::to_string(channel)) + "];\n";
    }
    std::string title = options.collective + " " +
                        (options.algorithm.empty() ? "(default algorithm)" : options.algorithm) + " over " +
                        std::to_string(nranks) + " ranks";
    out += "  label=" + quoted(title) + ";\n";
  }
  return out + "}\n";
}

bool onPath(const char* program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

void writeDot(const Topology& topo, const Options& options) {
  const std::string& target = options.dotPath;
  size_t dot = target.rfind('.');
  std::string extension = dot == std::string::npos ? "" : target.substr(dot + 1);
  if (extension != "dot" && extension != "svg" && extension != "png")
    die("--dot " + target + ": the file must end in .dot, .svg or .png");
  std::string source = extension == "dot" ? target : target.substr(0, dot) + ".dot";
  std::ofstream file(source);
  file << dotText(topo, options);
  file.close();
  if (!file) die(source + ": cannot write");
  if (extension == "dot") {
    std::printf("wrote %s\n", source.c_str());
    return;
  }
  if (!onPath("dot")) {
    std::printf("wrote %s; dot (graphviz) is not installed, so %s was not rendered: dot -T%s -o %s %s\n",
                source.c_str(), target.c_str(), extension.c_str(), target.c_str(), source.c_str());
    return;
  }
  std::string format = "-T" + extension;
  std::vector<std::string> words = {"dot", format, "-o", target, source};
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  int status = 0;
  if (posix_spawnp(&child, "dot", nullptr, nullptr, argv.data(), environ) != 0 || waitpid(child, &status, 0) < 0 ||
      !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    die("dot failed to render " + target + " from " + source);
  std::printf("wrote %s (and its source %s)\n", target.c_str(), source.c_str());
}

void printPath(const Topology& topo, int from, int to) {
  if (topo.rankNode(from) < 0 || topo.rankNode(to) < 0)
    die("--path: the topology places ranks 0.." + std::to_string(topo.rankCount() - 1));
  std::vector<int> links = topo.route(topo.rankNode(from), topo.rankNode(to));
  PathInfo info = topo.path(from, to);
  if (!info.reachable) die("rank " + std::to_string(to) + " cannot be reached from rank " + std::to_string(from));
  std::printf("rank %d -> rank %d: %d hops, %g GB/s, %g us, slowest link class %s\n", from, to, info.hops,
              info.bandwidth, info.latency, linkKindName(info.slowest));
  std::vector<int> nodes = topo.nodesAlong(topo.rankNode(from), links);
  std::printf("  %s\n", topo.node(nodes[0]).name.c_str());
  for (size_t i = 0; i < links.size(); ++i) {
    const TopoLink& link = topo.link(links[i]);
    std::printf("  -[%s %g GB/s %g us]-> %s\n", linkKindName(link.kind), link.bandwidth, link.latency,
                topo.node(nodes[i + 1]).name.c_str());
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  using namespace loom;
  Options options = parseOptions(argc, argv);
  Topology topo = loadTopology(options);
  if (options.pathFrom >= 0) {
    printPath(topo, options.pathFrom, options.pathTo);
    return 0;
  }
  switch (options.output) {
    case Options::Output::kTree: {
      DescribeOptions describe;
      if (options.all) describe.maxHosts = describe.maxSwitches = 0;
      std::fputs(describeTopology(topo, describe).c_str(), stdout);
      break;
    }
    case Options::Output::kXml:
      std::fputs(topologyToXml(topo).c_str(), stdout);
      break;
    case Options::Output::kDot:
      writeDot(topo, options);
      break;
  }
  return 0;
}
