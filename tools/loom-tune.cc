// loom-tune: prints the tuner's predicted time of every algorithm of a collective across sizes, and the one it
// picks, for N ranks on this host or on a topology (preset or XML file). It builds and times plans only; it
// never runs a collective. docs/TUNING.md sets these predictions beside measured times.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "perf/cli.h"
#include "src/core/params.h"
#include "src/topology/discover.h"
#include "src/topology/presets.h"
#include "src/topology/xml.h"
#include "src/tuner/tuner.h"
#include "transports/fifo.h"

namespace loom {
namespace {

[[noreturn]] void usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "loom-tune: %s\n", error.c_str());
  std::fprintf(stderr,
               "usage: loom-tune -n NRANKS [-c COLLECTIVE] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR]\n"
               "                 [--topo PRESET|FILE.xml] [--channels C] [--algo LOOM_ALGO-rules]\n"
               "  Without --topo the ranks share this host, as discovered.\n");
  std::exit(error.empty() ? 0 : 2);
}

// This host as discovered, with ranks 0..n-1 on its first NUMA node; or a preset or XML file as given.
Topology topologyFor(const std::string& spec, int nranks) {
  Topology topo;
  std::string error;
  if (spec.empty()) {
    if (discoverLocalTopology(&topo) != loomSuccess) usage("cannot discover this host's topology");
    int numa = -1;
    for (int id = 0; id < topo.nodeCount() && numa < 0; ++id)
      if (topo.node(id).kind == NodeKind::kNuma) numa = id;
    for (int r = 0; r < nranks; ++r) topo.mapRank(r, numa >= 0 ? numa : topo.hostNode(0));
    return topo;
  }
  bool ok = spec.find(".xml") != std::string::npos ? readTopologyFile(spec, &topo, &error)
                                                    : makePreset(spec, &topo, &error);
  if (!ok) usage("--topo " + spec + ": " + error);
  if (nranks != topo.rankCount())
    usage("-n " + std::to_string(nranks) + " does not match the " + std::to_string(topo.rankCount()) +
          " ranks of --topo " + spec);
  return topo;
}

int run(int argc, char** argv) {
  int nranks = -1, channels = 1;
  size_t minBytes = 8, maxBytes = size_t{256} << 20, factor = 2;
  std::string collectiveText = "allreduce", topoSpec, rulesText;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string flag = argv[i];
      if (flag == "-h" || flag == "--help") usage("");
      if (i + 1 >= argc) usage(flag + " needs a value");
      const char* value = argv[++i];
      if (flag == "-n") nranks = perf::parseIntArg(value, "-n", 1, 1 << 20);
      else if (flag == "-c") collectiveText = value;
      else if (flag == "-b") minBytes = perf::parseSizeArg(value, "-b");
      else if (flag == "-e") maxBytes = perf::parseSizeArg(value, "-e");
      else if (flag == "-f") factor = static_cast<size_t>(perf::parseIntArg(value, "-f", 2, 1 << 20));
      else if (flag == "--topo") topoSpec = value;
      else if (flag == "--channels") channels = perf::parseIntArg(value, "--channels", 1, 32);
      else if (flag == "--algo") rulesText = value;
      else usage("unknown flag " + flag);
    }
  } catch (const perf::UsageError& error) {
    usage(error.what());
  }
  if (nranks < 1) usage("-n NRANKS is required");
  if (minBytes > maxBytes) usage("-b is larger than -e");
  Collective collective;
  if (!parseCollectiveName(collectiveText, &collective)) usage("unknown collective \"" + collectiveText + "\"");
  AlgorithmRules rules;
  std::string error;
  if (!parseAlgorithmRules(rulesText, &rules, &error)) usage("--algo \"" + rulesText + "\": " + error);

  Topology topo = topologyFor(topoSpec, nranks);
  TuneContext context;
  context.topology = &topo;
  context.nranks = nranks;
  for (int r = 0; r < nranks; ++r) context.hostOf.push_back(topo.rankHost(r));
  context.nChannels = channels;
  context.llThresholdBytes = static_cast<size_t>(params::llThreshold());
  FifoShape shape{static_cast<int>(params::fifoDepth()), static_cast<size_t>(params::simpleSlotBytes()),
                  static_cast<size_t>(params::llSlotBytes())};
  context.llSliceBytes = fifoPayloadBytes(shape, Protocol::kLL);
  context.simpleSliceBytes = fifoPayloadBytes(shape, Protocol::kSimple);
  Tuner tuner;
  tuner.configure(context);

  std::vector<std::string> names = rules.allowed[static_cast<int>(collective)];
  if (names.empty()) names = algorithmsFor(collective);
  std::printf("# loom-tune: %s on %d ranks, %s; predicted time of one call in us\n", collectiveName(collective),
              nranks, topoSpec.empty() ? "this host" : topoSpec.c_str());
  std::printf("%12s", "bytes");
  for (const std::string& name : names) std::printf(" %13s", name.c_str());
  std::printf("  %s\n", "pick");
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    std::vector<TuneEstimate> ranked = tuner.rank(collective, bytes, rules);
    std::printf("%12zu", bytes);
    for (const std::string& name : names) {
      double best = -1;
      for (const TuneEstimate& estimate : ranked)
        if (estimate.algorithm == name && (best < 0 || estimate.us < best)) best = estimate.us;
      std::printf(" %13.2f", best);
    }
    std::printf("  %s\n", tuner.choose(collective, bytes, rules).algorithm.c_str());
    if (bytes > maxBytes / factor) break;
  }
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::run(argc, argv); }
