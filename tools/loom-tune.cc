// loom-tune: prints the tuner's predicted time of every algorithm of a collective across sizes, and the one it
// picks, for N ranks on this host or on a topology (preset or XML file). Each algorithm's time is the tuner's
// for a call that LOOM_ALGO restricts to it (channels, protocol and chunk chosen as for such a call). It builds
// and times plans only; it never runs a collective. docs/TUNING.md sets these predictions beside measured times.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "perf/cli.h"
#include "src/base/params.h"
#include "src/topology/discover.h"
#include "src/topology/presets.h"
#include "src/topology/xml.h"
#include "src/tuner/tuner.h"
#include "transports/fifo.h"

namespace loom {
namespace {

// The collectives the tuner chooses for, as --help lists them.
std::string tunableNames() {
  std::string names;
  for (int c = 0; c <= static_cast<int>(Collective::kBarrier); ++c) {
    if (!tunable(static_cast<Collective>(c))) continue;
    names += (names.empty() ? "" : ", ") + collectiveHelpName(static_cast<Collective>(c));
  }
  return names;
}

[[noreturn]] void usage(const std::string& error) {
  if (!error.empty()) perf::exitOnce("loom-tune", error + " (see --help)");
  std::printf(
      "usage: loom-tune -n NRANKS [-c COLLECTIVE] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR]\n"
      "                 [--topo PRESET|FILE.xml] [--channels C] [--algo LOOM_ALGO-rules]\n"
      "                 [--costs NAME=VALUE,...] [--show-costs] [--deterministic]\n"
      "  -c              %s (default allreduce); any case\n"
      "  Without --topo the ranks share this host, as discovered. --costs changes the executor's costs\n"
      "  (docs/TUNING.md names them); --show-costs prints them all. --deterministic: the algorithms\n"
      "  LOOM_DETERMINISTIC=1 leaves (reductions in rank order; docs/RELIABILITY.md).\n",
      tunableNames().c_str());
  std::exit(0);
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
  if (!loadTopologySpec(spec, &topo, &error)) usage("--topo " + spec + ": " + error);
  if (nranks != topo.rankCount())
    usage("-n " + std::to_string(nranks) + " does not match the " + std::to_string(topo.rankCount()) +
          " ranks of --topo " + spec);
  return topo;
}

int run(int argc, char** argv) {
  int nranks = -1, channels = 0;
  bool channelsGiven = false;
  size_t minBytes = 8, maxBytes = size_t{256} << 20, factor = 2;
  std::string collectiveText = "allreduce", topoSpec, rulesText, costsText;
  bool showCosts = false, deterministic = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string flag = argv[i];
      if (flag == "-h" || flag == "--help") usage("");
      if (flag == "--show-costs") {
        showCosts = true;
        continue;
      }
      if (flag == "--deterministic") {
        deterministic = true;
        continue;
      }
      if (i + 1 >= argc) usage(flag + " needs a value");
      const char* value = argv[++i];
      if (flag == "-n")
        nranks = perf::parseIntArg(value, "-n", 1, 1 << 20);
      else if (flag == "-c")
        collectiveText = value;
      else if (flag == "-b")
        minBytes = perf::parseSizeArg(value, "-b");
      else if (flag == "-e")
        maxBytes = perf::parseSizeArg(value, "-e");
      else if (flag == "-f")
        factor = static_cast<size_t>(perf::parseIntArg(value, "-f", 2, 1 << 20));
      else if (flag == "--topo")
        topoSpec = value;
      else if (flag == "--channels")
        channels = perf::parseIntArg(value, "--channels", 1, 32), channelsGiven = true;
      else if (flag == "--algo")
        rulesText = value;
      else if (flag == "--costs")
        costsText = value;
      else
        usage("unknown flag " + flag);
    }
  } catch (const perf::UsageError& error) {
    usage(error.what());
  }
  HostCosts costs;
  std::string costError;
  if (!parseHostCosts(costsText, &costs, &costError)) usage("--costs: " + costError);
  if (showCosts) {
    std::printf("%s\n", describeHostCosts(costs).c_str());
    return 0;
  }
  if (nranks < 1) usage("-n NRANKS is required");
  if (minBytes > maxBytes) usage("-b is larger than -e");
  Collective collective;
  if (!parseCollectiveName(collectiveText, &collective))
    usage("-c " + collectiveText + ": expected one of " + tunableNames());
  if (!tunable(collective))
    usage("-c " + collectiveText + ": the tuner does not choose for " + collectiveName(collective) +
          " (one algorithm, or plans that depend on each rank's counts); it chooses for " + tunableNames());
  AlgorithmRules rules;
  std::string error;
  if (!parseAlgorithmRules(rulesText, &rules, &error)) usage("--algo \"" + rulesText + "\": " + error);
  if (deterministic && !restrictToRankOrder(&rules, nranks, &error)) usage("--deterministic: " + error);

  Topology topo = topologyFor(topoSpec, nranks);
  TuneContext context = contextFor(topo, nranks, channelsGiven ? channels : 0);
  Tuner tuner;
  tuner.configure(context, costs);

  std::vector<std::string> names = rules.allowed[static_cast<int>(collective)];
  if (names.empty()) names = algorithmsFor(collective);
  // One tuner per algorithm, restricted to it as LOOM_ALGO=<name> would.
  std::vector<Tuner> alone(names.size());
  std::vector<AlgorithmRules> aloneRules(names.size(), rules);
  for (size_t a = 0; a < names.size(); ++a) {
    alone[a].configure(context, costs);
    aloneRules[a].allowed[static_cast<int>(collective)] = {names[a]};
  }
  std::printf("# loom-tune: %s on %d ranks, %s%s; predicted time of one call in us\n", collectiveName(collective),
              nranks, topoSpec.empty() ? "this host" : topoSpec.c_str(),
              deterministic ? ", as LOOM_DETERMINISTIC=1 restricts it" : "");
  std::printf("# up to %d channel(s), %zu KiB Simple slots, LL up to %zu B (%s); loom-sim takes the same\n",
              context.nChannels, context.simpleSliceBytes >> 10, context.llThresholdBytes,
              isGpuContext(context) ? "the GPU executor's: LOOM_CUDA_NCHANNELS, LOOM_CUDA_SLOT_BYTES"
                                    : "LOOM_NCHANNELS, LOOM_SIMPLE_SLOT_BYTES");
  std::printf("%12s", "bytes");
  for (const std::string& name : names) std::printf(" %13s", name.c_str());
  std::printf("  %s\n", "pick");
  bool keptEarlier = false;
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    std::printf("%12zu", bytes);
    double fastest = -1;
    for (size_t a = 0; a < names.size(); ++a) {
      const TuneEstimate& estimate = alone[a].choose(collective, bytes, aloneRules[a]);
      if (estimate.algorithm == names[a] && estimate.us > 0) {
        // The column: one call, as loom-sim and a single timed call see it. The tuner ranks by a stream of
        // kTunedCalls back-to-back calls (estimate.us), in which calls that end unevenly overlap.
        const size_t elementBytes = bytes >= 4 ? 4 : 1;
        std::printf(" %13.2f", estimateCall(context, costs, collective, bytes / elementBytes, elementBytes, 0, names[a],
                                            estimate.nChannels, &estimate.slicing, 1));
        if (fastest < 0 || estimate.us < fastest) fastest = estimate.us;
      } else {
        std::printf(" %13s", "-");  // no plan for this call
      }
    }
    const TuneEstimate& pick = tuner.choose(collective, bytes, rules);
    // The pick is the fastest column, or an algorithm earlier in the registry's order within the model's error.
    const bool notFastest = fastest > 0 && pick.us > fastest * (1 + 1e-9);
    keptEarlier |= notFastest;
    std::printf("  %s%s\n", pick.algorithm.c_str(), notFastest ? "*" : "");
    if (bytes > maxBytes / factor) break;
  }
  std::printf("# columns: one call's predicted time with the channels and chunk the tuner takes for that algorithm (as "
              "loom-sim times it); the pick is the fastest of a stream of %d back-to-back calls, where calls that end "
              "unevenly overlap\n",
              kTunedCalls);
  if (keptEarlier)
    std::printf("# *: within %.0f%% of the fastest prediction, so the algorithm earlier in the registry's order (the "
                "ring first) keeps the call: the model's errors are about that size (docs/TUNING.md)\n",
                kPreferEarlierWithin * 100);
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::run(argc, argv); }
