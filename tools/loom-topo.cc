// loom-topo: shows a topology (a preset, an XML file, or this host as discovered) as an indented tree, as loom's
// XML, or as a Graphviz drawing with the edges a collective's plan uses drawn over it. It also answers route
// questions between two ranks. It reads and builds plans only; it never runs a collective.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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
      "Collectives: allreduce (all_reduce), broadcast, reduce, allgather (all_gather), reducescatter\n"
      "(reduce_scatter), alltoall, gather, scatter, barrier; any case\n"
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
  Collective named;
  if (parseCollectiveName(name, &named) && std::find(std::begin(kDrawable), std::end(kDrawable), named) != std::end(kDrawable))
    return named;
  std::string known;
  for (Collective collective : kDrawable) known += (known.empty() ? "" : ", ") + collectiveHelpName(collective);
  die("unknown collective \"" + name + "\" (" + known + ")");
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

// What a drawing shows: each topology node is drawn as one box (of[node]; -1: left out), and boxes may stand for
// many nodes. Links between two boxes are drawn once per kind and bandwidth, with their count.
struct Box {
  std::string label;
  NodeKind kind = NodeKind::kHost;
  int cluster = -1;  // the host box it is drawn in; -1: none
  std::string pos;   // pinned position ("x,y!"), for a grid
  bool many = false; // it stands for several nodes: the links among them are not drawn
};
struct View {
  std::vector<int> of;
  std::vector<Box> boxes;
  std::vector<std::string> clusters;  // host boxes' titles
  std::string note;                   // what the drawing leaves out or sums up
  bool pinned = false;
};

// A node's label inside its host's box: its name without the host's prefix, its kind, its ranks.
std::string nodeLabel(const Topology& topo, int id, const std::vector<std::string>& ranksOf) {
  const TopoNode& node = topo.node(id);
  std::string label = node.name;
  if (node.host >= 0) {
    const std::string& prefix = topo.node(topo.hostNode(node.host)).name + "/";
    if (label.compare(0, prefix.size(), prefix) == 0 && label.size() > prefix.size()) label = label.substr(prefix.size());
  }
  return label + "\n" + nodeKindName(node.kind) + ranksOf[id];
}

std::vector<std::string> ranksOfNodes(const Topology& topo) {
  std::vector<std::string> ranksOf(topo.nodeCount());
  for (int rank = 0; rank < topo.rankCount(); ++rank) {
    int node = topo.rankNode(rank);
    if (node >= 0) ranksOf[node] += (ranksOf[node].empty() ? ", rank " : ",") + std::to_string(rank);
  }
  return ranksOf;
}

// Every node as it is, in its host's box: one machine.
View fullView(const Topology& topo) {
  View view;
  const std::vector<std::string> ranksOf = ranksOfNodes(topo);
  for (int host = 0; host < topo.hostCount(); ++host) view.clusters.push_back(topo.node(topo.hostNode(host)).name);
  for (int id = 0; id < topo.nodeCount(); ++id) {
    view.of.push_back(static_cast<int>(view.boxes.size()));
    view.boxes.push_back({nodeLabel(topo, id, ranksOf), topo.node(id).kind, topo.node(id).host, ""});
  }
  return view;
}

// A torus: its chips on a grid by their coordinates (a 3-D torus as its planes side by side), wrap-around links
// included; the hosts' CPUs and PCIe are left out. Empty when some rank's node has no 2- or 3-D "coords".
View torusView(const Topology& topo) {
  View view;
  view.of.assign(topo.nodeCount(), -1);
  int width = 0;
  std::vector<std::pair<int, std::vector<int>>> chips;
  const std::vector<std::string> ranksOf = ranksOfNodes(topo);
  for (int rank = 0; rank < topo.rankCount(); ++rank) {
    const int id = topo.rankNode(rank);
    if (id < 0) return {};
    std::vector<int> coords;
    std::string text = attributeOr(topo.node(id).attrs, "coords", "");
    for (size_t start = 0; !text.empty() && start <= text.size();) {
      size_t comma = text.find(',', start);
      coords.push_back(std::atoi(text.substr(start, comma - start).c_str()));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (coords.size() < 2 || coords.size() > 3) return {};
    width = std::max(width, coords[0] + 1);
    chips.emplace_back(id, coords);
  }
  for (const auto& [id, coords] : chips) {
    const int plane = coords.size() == 3 ? coords[2] : 0;
    char pos[64];
    std::snprintf(pos, sizeof(pos), "%.2f,%.2f!", 1.6 * (coords[0] + plane * (width + 1)), -1.2 * coords[1]);
    const TopoNode& node = topo.node(id);
    std::string where = "(" + attributeOr(node.attrs, "coords", "") + ")";
    view.of[id] = static_cast<int>(view.boxes.size());
    view.boxes.push_back({where + "\n" + topo.node(topo.hostNode(node.host)).name + ranksOf[id], node.kind, -1,
                          pos});
  }
  view.pinned = true;
  view.note = "chips at their torus coordinates" +
              std::string(chips.front().second.size() == 3 ? ", one plane of the third dimension beside the next" : "") +
              "; the hosts' CPUs and PCIe are left out";
  return view;
}

// Many machines: the first host in full, the others as one box, and the switches outside the hosts summed up by
// their level (hops from the hosts: a fat tree's leaves, then its spines).
View summaryView(const Topology& topo) {
  View view;
  view.of.assign(topo.nodeCount(), -1);
  const std::vector<std::string> ranksOf = ranksOfNodes(topo);
  view.clusters.push_back(topo.node(topo.hostNode(0)).name);
  for (int id = 0; id < topo.nodeCount(); ++id) {
    if (topo.node(id).host != 0) continue;
    view.of[id] = static_cast<int>(view.boxes.size());
    view.boxes.push_back({nodeLabel(topo, id, ranksOf), topo.node(id).kind, 0, ""});
  }
  const int others = static_cast<int>(view.boxes.size());
  view.boxes.push_back({std::to_string(topo.hostCount() - 1) + (topo.hostCount() == 2 ? " more host\n" : " more hosts\n") +
                            topo.node(topo.hostNode(1)).name + " ... " +
                            topo.node(topo.hostNode(topo.hostCount() - 1)).name + ", each like " + view.clusters[0],
                        NodeKind::kHost, -1, "", true});
  for (int id = 0; id < topo.nodeCount(); ++id)
    if (topo.node(id).host > 0) view.of[id] = others;
  // Levels of the nodes outside every host: breadth first from the hosts' members.
  std::vector<int> level(topo.nodeCount(), -1), frontier;
  for (int id = 0; id < topo.nodeCount(); ++id)
    if (topo.node(id).host >= 0) level[id] = 0, frontier.push_back(id);
  for (int depth = 1; !frontier.empty(); ++depth) {
    std::vector<int> next;
    for (const TopoLink& link : topo.links())
      for (int end : {link.a, link.b}) {
        const int other = link.other(end);
        if (level[end] == depth - 1 && level[other] < 0) level[other] = depth, next.push_back(other);
      }
    frontier = std::move(next);
  }
  std::map<std::pair<int, int>, std::vector<int>> byLevel;  // (level, kind) -> nodes
  for (int id = 0; id < topo.nodeCount(); ++id)
    if (topo.node(id).host < 0) byLevel[{level[id], static_cast<int>(topo.node(id).kind)}].push_back(id);
  for (const auto& [key, members] : byLevel) {
    const int box = static_cast<int>(view.boxes.size());
    std::string label = members.size() == 1 ? topo.node(members[0]).name
                                            : std::to_string(members.size()) + " x " +
                                                  nodeKindName(static_cast<NodeKind>(key.second)) + "\n" +
                                                  topo.node(members.front()).name + " ... " +
                                                  topo.node(members.back()).name;
    view.boxes.push_back({label + (key.first > 0 ? "\nlevel " + std::to_string(key.first) : ""),
                          static_cast<NodeKind>(key.second), -1, "", members.size() > 1});
    for (int id : members) view.of[id] = box;
  }
  view.note = "the first host in full; the other " + std::to_string(topo.hostCount() - 1) +
              " as one box, and the switches between hosts by level; a line's count is its links";
  return view;
}

View viewFor(const Topology& topo) {
  View torus = torusView(topo);
  if (!torus.boxes.empty()) return torus;
  return topo.hostCount() > 1 ? summaryView(topo) : fullView(topo);
}

// A pinned box's grid position ("x,y!") as numbers.
std::pair<double, double> pinnedAt(const Box& box) {
  double x = 0, y = 0;
  std::sscanf(box.pos.c_str(), "%lf,%lf", &x, &y);
  return {x, y};
}

// Non-empty when the link between pinned boxes a and b spans more than one grid cell: a wrap-around link.
std::string wrapStub(const View& view, int a, int b) {
  const auto [ax, ay] = pinnedAt(view.boxes[a]);
  const auto [bx, by] = pinnedAt(view.boxes[b]);
  return std::fabs(ax - bx) > 1.7 || std::fabs(ay - by) > 1.3 ? "wrap" : "";
}

// Where the stub of a wrap-around link from box `from` ends: half a cell outside the grid, away from `to`.
std::string stubPosition(const View& view, int from, int to) {
  const auto [fx, fy] = pinnedAt(view.boxes[from]);
  const auto [tx, ty] = pinnedAt(view.boxes[to]);
  char pos[64];
  const double dx = std::fabs(fx - tx) > 1.7 ? (fx < tx ? -0.8 : 0.8) : 0;
  const double dy = std::fabs(fy - ty) > 1.3 ? (fy < ty ? -0.6 : 0.6) : 0;
  std::snprintf(pos, sizeof(pos), "%.2f,%.2f!", fx + dx, fy + dy);
  return pos;
}

std::string dotText(const Topology& topo, const Options& options) {
  static const char* kShapes[kNodeKinds] = {"house", "box", "diamond", "box3d", "hexagon", "ellipse", "octagon"};
  static const char* kLinkColours[kLinkKinds] = {"forestgreen", "royalblue", "gray50", "darkorange", "black"};
  static const char* kChannelColours[] = {"red", "magenta", "cyan3", "gold3", "purple", "brown", "deeppink", "teal"};
  const View view = viewFor(topo);
  std::string out = "graph loom {\n  graph [fontname=Helvetica, overlap=false" +
                    std::string(view.pinned ? ", layout=neato" : "") +
                    "];\n  node [fontname=Helvetica, fontsize=10];\n  edge [fontname=Helvetica, fontsize=8];\n";
  auto boxLine = [&](int box, const char* indent) {
    const Box& b = view.boxes[box];
    out += std::string(indent) + "b" + std::to_string(box) + " [label=" + quoted(b.label) +
           ", shape=" + kShapes[static_cast<int>(b.kind)] + (b.pos.empty() ? "" : ", pos=" + quoted(b.pos)) + "];\n";
  };
  for (int box = 0; box < static_cast<int>(view.boxes.size()); ++box)
    if (view.boxes[box].cluster < 0) boxLine(box, "  ");
  for (int cluster = 0; cluster < static_cast<int>(view.clusters.size()); ++cluster) {
    out += "  subgraph cluster_host" + std::to_string(cluster) + " {\n    label=" + quoted(view.clusters[cluster]) +
           ";\n";
    for (int box = 0; box < static_cast<int>(view.boxes.size()); ++box)
      if (view.boxes[box].cluster == cluster) boxLine(box, "    ");
    out += "  }\n";
  }
  // Links between two boxes, by kind and bandwidth, with how many there are.
  std::map<std::tuple<int, int, int, double>, int> lines;
  for (const TopoLink& link : topo.links()) {
    int a = view.of[link.a], b = view.of[link.b];
    if (a < 0 || b < 0 || (a == b && (link.a != link.b || view.boxes[a].many))) continue;
    lines[{std::min(a, b), std::max(a, b), static_cast<int>(link.kind), link.bandwidth}]++;
  }
  // Where every line is the same (a torus, a full mesh), it is said once under the drawing, not on each line.
  const bool alike = !lines.empty() && std::all_of(lines.begin(), lines.end(), [&](const auto& line) {
    return std::get<2>(line.first) == std::get<2>(lines.begin()->first) &&
           std::get<3>(line.first) == std::get<3>(lines.begin()->first) && line.second == 1;
  });
  std::string title = view.note;
  if (alike) {
    char every[80];
    std::snprintf(every, sizeof(every), "every link: %s %g GB/s",
                  linkKindName(static_cast<LinkKind>(std::get<2>(lines.begin()->first))),
                  std::get<3>(lines.begin()->first));
    title += (title.empty() ? "" : "; ") + std::string(every);
  }
  int stubs = 0;
  for (const auto& [key, count] : lines) {
    const auto& [a, b, kind, bandwidth] = key;
    char label[80];
    std::snprintf(label, sizeof(label), "%s%s %g", count > 1 ? (std::to_string(count) + " x ").c_str() : "",
                  linkKindName(static_cast<LinkKind>(kind)), bandwidth);
    const std::string attrs = (alike ? std::string("") : "label=" + quoted(label) + ", ") + "color=" +
                              kLinkColours[kind] + (count > 1 ? ", penwidth=2" : "");
    // On a grid, a wrap-around link (more than one cell long) is two stubs pointing out of the grid, each
    // saying where it goes, rather than a line across the chips between.
    const std::string wrap = view.pinned ? wrapStub(view, a, b) : "";
    if (!wrap.empty()) {
      for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
        const std::string stub = "w" + std::to_string(stubs++);
        out += "  " + stub + " [shape=point, width=0.01, label=\"\", pos=" + quoted(stubPosition(view, from, to)) +
               "];\n  b" + std::to_string(from) + " -- " + stub + " [" + attrs + ", style=dashed, headlabel=" +
               quoted("to " + view.boxes[to].label.substr(0, view.boxes[to].label.find('\n'))) +
               ", labelfontsize=7];\n";
      }
      continue;
    }
    out += "  b" + std::to_string(a) + " -- b" + std::to_string(b) + " [" + attrs + "];\n";
  }
  if (!options.collective.empty()) {
    int placed = 0;
    while (placed < topo.rankCount() && topo.rankNode(placed) >= 0) ++placed;
    int nranks = options.nranks > 0 ? options.nranks : placed;
    if (nranks < 1 || nranks > placed) {
      die("the topology places ranks 0.." + std::to_string(placed - 1) + ", so --nranks must be 1 to " +
          std::to_string(placed));
    }
    std::set<std::tuple<int, int, int>> drawn;  // (box, box, channel): sends that boxes sum up, drawn once
    for (const auto& [rank, peer, channel] : planSends(options, nranks)) {
      int from = view.of[topo.rankNode(rank)], to = view.of[topo.rankNode(peer)];
      if (from < 0 || to < 0 || !drawn.emplace(from, to, channel).second) continue;
      out += "  b" + std::to_string(from) + " -- b" + std::to_string(to) +
             " [dir=forward, constraint=false, penwidth=2, color=" +
             kChannelColours[channel % (sizeof(kChannelColours) / sizeof(kChannelColours[0]))] +
             ", label=" + quoted("r" + std::to_string(rank) + " ch" + std::to_string(channel)) + "];\n";
    }
    title = options.collective + " " + (options.algorithm.empty() ? "(default algorithm)" : options.algorithm) +
            " over " + std::to_string(nranks) + " ranks" + (title.empty() ? "" : "\n" + title);
  }
  if (!title.empty()) out += "  label=" + quoted(title) + ";\n";
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
  const std::vector<PathStage> stages = topo.pathStages(from, to);
  bool striped = false;
  std::printf("  %s\n", topo.node(nodes[0]).name.c_str());
  for (size_t i = 0; i < links.size(); ++i) {
    const TopoLink& link = topo.link(links[i]);
    std::printf("  -[%s %g GB/s %g us]-> %s", linkKindName(link.kind), link.bandwidth, link.latency,
                topo.node(nodes[i + 1]).name.c_str());
    for (const PathStage& stage : stages)
      if (stage.hop == static_cast<int>(i) && stage.twins > 1) {
        std::printf("   (1 of %d switches in parallel: %g GB/s through them all)", stage.twins, stage.bandwidth);
        striped = true;
      }
    std::printf("\n");
  }
  if (striped)
    std::printf("  The route shows one switch of each stage; a transfer is striped over the stage's parallel switches, "
                "so the path's %g GB/s is the narrowest stage over all of them.\n",
                info.bandwidth);
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
