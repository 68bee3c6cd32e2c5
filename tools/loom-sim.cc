// loom-sim: times loom's plans on a topology far larger than any machine here, and prints nccl-tests' table
// (size, count, type, redop, algorithm, time, algbw, busbw) for a sweep of sizes and every algorithm of a
// collective. The model and its validation are in docs/SIMULATION.md; the engine is tools/sim. It builds plans
// and times them; it never runs a collective.
#include <malloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/plan_text.h"
#include "algorithms/verifier.h"
#include "perf/cli.h"
#include "src/base/dtype.h"
#include "src/base/params.h"
#include "src/topology/presets.h"
#include "src/topology/xml.h"
#include "src/tuner/tuner.h"
#include "tools/sim/sim.h"

namespace loom {
namespace {

using perf::UsageError;

struct Options {
  std::string topo;
  Collective collective = Collective::kAllReduce;
  std::vector<std::string> algorithms;  // empty: all of the collective's
  size_t minBytes = 8, maxBytes = 128u << 20, stepBytes = 1u << 20;
  int stepFactor = 2;
  loomDataType_t type = loomFloat32;
  loomRedOp_t op = loomSum;
  int root = 0;
  int channels = 1;
  int nranks = 0;  // 0: every rank of the topology
  sim::Mode mode = sim::Mode::kAuto;
  bool timing = false;
  sim::Params params;
  std::string planFile;  // --plan: time this file's plans instead of loom's algorithms
  std::string dumpPlan;  // --dump-plan: write the plans of one algorithm at -b bytes, then exit
  // What the command line set; the rest follows the tuner (contextFor, HostCosts, Tuner::choose per row).
  bool channelsGiven = false, sliceGiven = false, thresholdGiven = false, llOverheadGiven = false,
       simpleOverheadGiven = false, copyGiven = false, efficiencyGiven = false;
};

const Collective kCollectives[] = {Collective::kAllReduce, Collective::kBroadcast,     Collective::kReduce,
                                   Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll,
                                   Collective::kGather,    Collective::kScatter};

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The collectives loom-sim times, as --help lists them.
std::string collectiveNames() {
  std::string names;
  for (Collective collective : kCollectives) names += (names.empty() ? "" : ", ") + collectiveHelpName(collective);
  return names;
}

void usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: loom-sim --topo SPEC|FILE [--collective NAME] [--algorithm NAME[,NAME...]]\n"
      "                [-b MINBYTES] [-e MAXBYTES] [-f FACTOR | -i STEPBYTES] [-d TYPE] [-o OP] [-r ROOT]\n"
      "                [--channels C] [--nranks N] [--mode auto|fast|exact] [--timing]\n"
      "                [--ll-overhead US] [--simple-overhead US] [--copy-bw GBPS] [--efficiency KIND=F,...]\n"
      "                [--slice-bytes B] [--ll-slot-bytes B] [--ll-threshold B] [--fifo-depth D]\n"
      "                [--build-all] [--max-steps N] [--threads N] [--plan FILE | --dump-plan FILE]\n"
      "Times every algorithm of a collective (or those named) on a topology, for sizes from -b to -e\n"
      "(default 8 to 128M, times -f 2), and prints nccl-tests' table. docs/SIMULATION.md has the model.\n"
      "  --topo          a preset (below) or a topology XML file (docs/TOPOLOGY.md)\n"
      "  --collective    %s; default allreduce, any case\n"
      "  --nranks        the first N ranks of the topology take part (default: all)\n"
      "  --channels      channels per call (default: the tuner's choice per row, 1 or LOOM_NCHANNELS (%lld);\n"
      "                  where every rank is a GPU, 1 or LOOM_CUDA_NCHANNELS)\n"
      "  --mode          auto (default: exact where the call is small enough, as the tuner times it; else\n"
      "                  fast), fast (runs of steps, extrapolated rounds) or exact (every slice an event)\n"
      "  --timing        add the wall time each row took to simulate\n"
      "  --ll-overhead, --simple-overhead  software cost of one message per protocol, us (default: the\n"
      "                  tuner's, loom-tune --show-costs: 1, 3 on GPU ranks; 0.09, 0.78 on host ranks)\n"
      "  --copy-bw       bandwidth of local copy and reduce steps, GB/s (default: the tuner's, 1000 on GPU\n"
      "                  ranks, 19.4 on host ranks)\n"
      "  --efficiency    payload share of link bandwidth per kind (nvlink, pcie, shm, smp, network),\n"
      "                  default nvlink=0.824,pcie=0.76,shm=1,smp=1,network=0.96\n"
      "  --slice-bytes, --ll-slot-bytes, --ll-threshold, --fifo-depth  the executor's slicing (defaults:\n"
      "                  the tuner's chunk for the row, LOOM_LL_SLOT_BYTES, LOOM_LL_THRESHOLD, LOOM_FIFO_DEPTH)\n"
      "  --build-all     build every rank's plan even when a sample shows them alike up to a shift\n"
      "  --max-steps     refuse algorithms whose plans hold more steps over all ranks (default 2^27)\n"
      "  --plan          prove the plans of a plan file (its call: collective, ranks, count) with the verifier\n"
      "                  and time them with the exact engine; one row\n"
      "  --dump-plan     write every rank's plan of one algorithm for a call of -b bytes to a plan file\n"
      "Presets:\n",
      collectiveNames().c_str(), static_cast<long long>(params::nChannels()));
  for (const std::string& line : presetUsage()) std::fprintf(out, "  %s\n", line.c_str());
}

double parseDoubleArg(const char* text, const char* name, double min, double max) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0' || !(value >= min && value <= max))
    throw UsageError(std::string("invalid value '") + text + "' for " + name + " (expected a number from " +
                     perf::formatCell(min, 1) + " to " + perf::formatCell(max, 1) + ")");
  return value;
}

Collective parseCollective(const char* text) {
  Collective collective;
  if (parseCollectiveName(text, &collective) &&
      std::find(std::begin(kCollectives), std::end(kCollectives), collective) != std::end(kCollectives))
    return collective;
  throw UsageError(std::string("invalid value '") + text + "' for --collective (" + collectiveNames() + ")");
}

void parseEfficiency(const char* text, sim::Params* params) {
  std::string list = text;
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    size_t equals = item.find('=');
    LinkKind kind;
    if (equals == std::string::npos || !parseLinkKind(item.substr(0, equals), &kind))
      throw UsageError("invalid value '" + item +
                       "' for --efficiency (expected KIND=FRACTION, KIND one of nvlink, "
                       "pcie, shm, smp, network)");
    params->efficiency[static_cast<int>(kind)] = parseDoubleArg(item.c_str() + equals + 1, "--efficiency", 1e-6, 1);
    start = end + 1;
  }
}

Options parseOptions(int argc, char** argv) {
  Options options;
  options.params = sim::loomParams();
  options.channels = static_cast<int>(std::max<int64_t>(1, params::nChannels()));
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (flag == "--timing") {
      options.timing = true;
      continue;
    }
    if (flag == "--build-all") {
      options.params.buildAll = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    const char* value = argv[++i];
    const char* name = flag.c_str();
    if (flag == "--topo") {
      options.topo = value;
    } else if (flag == "--collective") {
      options.collective = parseCollective(value);
    } else if (flag == "--algorithm") {
      options.algorithms.clear();
      std::string list = value;
      for (size_t start = 0; start <= list.size();) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        if (end > start) options.algorithms.push_back(lower(list.substr(start, end - start)));
        start = end + 1;
      }
    } else if (flag == "-b" || flag == "--minbytes") {
      options.minBytes = perf::parseSizeArg(value, name);
    } else if (flag == "-e" || flag == "--maxbytes") {
      options.maxBytes = perf::parseSizeArg(value, name);
    } else if (flag == "-f" || flag == "--stepfactor") {
      options.stepFactor = perf::parseIntArg(value, name, 1, 1 << 20);
    } else if (flag == "-i" || flag == "--stepbytes") {
      options.stepBytes = perf::parseSizeArg(value, name);
      options.stepFactor = 1;
      if (options.stepBytes == 0) throw UsageError("invalid value '0' for -i (expected a positive size)");
    } else if (flag == "-d" || flag == "--datatype") {
      auto type = perf::findName(value, perf::kTypeNames, loomNumTypes);
      if (!type)
        throw UsageError(std::string("invalid value '") + value + "' for " + flag +
                         " (int8, uint8, int32, "
                         "uint32, int64, uint64, half, float, double, bfloat16)");
      options.type = static_cast<loomDataType_t>(*type);
    } else if (flag == "-o" || flag == "--op") {
      auto op = perf::findName(value, perf::kOpNames, loomNumOps);
      if (!op)
        throw UsageError(std::string("invalid value '") + value + "' for " + flag + " (sum, prod, max, min, avg)");
      options.op = static_cast<loomRedOp_t>(*op);
    } else if (flag == "-r" || flag == "--root") {
      options.root = perf::parseIntArg(value, name, 0, 1 << 24);
    } else if (flag == "--channels") {
      options.channels = perf::parseIntArg(value, name, 1, 1024);
      options.channelsGiven = true;
    } else if (flag == "--nranks") {
      options.nranks = perf::parseIntArg(value, name, 1, 1 << 24);
    } else if (flag == "--mode") {
      if (std::strcmp(value, "fast") == 0)
        options.mode = sim::Mode::kFast;
      else if (std::strcmp(value, "exact") == 0)
        options.mode = sim::Mode::kExact;
      else if (std::strcmp(value, "auto") == 0)
        options.mode = sim::Mode::kAuto;
      else
        throw UsageError(std::string("invalid value '") + value + "' for --mode (auto, fast or exact)");
    } else if (flag == "--ll-overhead") {
      options.params.llOverheadUs = parseDoubleArg(value, name, 0, 1e6), options.llOverheadGiven = true;
    } else if (flag == "--simple-overhead") {
      options.params.simpleOverheadUs = parseDoubleArg(value, name, 0, 1e6), options.simpleOverheadGiven = true;
    } else if (flag == "--copy-bw") {
      options.params.copyBandwidth = parseDoubleArg(value, name, 1e-3, 1e9), options.copyGiven = true;
    } else if (flag == "--efficiency") {
      parseEfficiency(value, &options.params);
      options.efficiencyGiven = true;
    } else if (flag == "--slice-bytes") {
      options.params.simpleSliceBytes = perf::parseSizeArg(value, name);
      options.sliceGiven = true;
      if (options.params.simpleSliceBytes == 0) throw UsageError("invalid value '0' for --slice-bytes");
    } else if (flag == "--ll-slot-bytes") {
      options.params.llSlotBytes = perf::parseSizeArg(value, name);
      if (options.params.llSlotBytes < 16)
        throw UsageError(std::string("invalid value '") + value + "' for --ll-slot-bytes (at least 16)");
    } else if (flag == "--ll-threshold") {
      options.params.llThresholdBytes = perf::parseSizeArg(value, name);
      options.thresholdGiven = true;
    } else if (flag == "--fifo-depth") {
      options.params.fifoDepth = perf::parseIntArg(value, name, 1, 1 << 16);
    } else if (flag == "--max-steps") {
      options.params.maxSteps = perf::parseSizeArg(value, name);
    } else if (flag == "--plan") {
      options.planFile = value;
    } else if (flag == "--dump-plan") {
      options.dumpPlan = value;
    } else if (flag == "--threads") {
      options.params.threads = perf::parseIntArg(value, name, 1, 1024);
    } else {
      throw UsageError("unknown option " + flag + " (see --help)");
    }
  }
  if (options.topo.empty()) throw UsageError("--topo is required: a preset such as fattree:2, or an XML file");
  if (options.minBytes > options.maxBytes) throw UsageError("-b is larger than -e");
  if (!options.planFile.empty() && !options.dumpPlan.empty()) throw UsageError("--plan and --dump-plan together");
  if (!options.dumpPlan.empty() && options.algorithms.size() > 1)
    throw UsageError("--dump-plan writes the plans of one algorithm; --algorithm names several");
  return options;
}

Topology loadTopology(const std::string& spec) {
  Topology topo;
  std::string error;
  if (!loadTopologySpec(spec, &topo, &error)) throw UsageError("--topo " + spec + ": " + error);
  return topo;
}

std::string describeParams(const sim::Params& p) {
  char text[512];
  std::snprintf(
      text, sizeof(text),
      "# model: %g us per LL message, %g us per Simple message; slices of %zu B (Simple), %zu B (LL, "
      "steps up to %zu B); FIFO depth %d\n"
      "#        payload share of links: nvlink %g, pcie %g, shm %g, smp %g, network %g; local copies %g GB/s\n",
      p.llOverheadUs, p.simpleOverheadUs, p.simpleSliceBytes, (p.llSlotBytes - 8) / 2, p.llThresholdBytes, p.fifoDepth,
      p.efficiency[0], p.efficiency[1], p.efficiency[2], p.efficiency[3], p.efficiency[4], p.copyBandwidth);
  return text;
}

std::string readText(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw UsageError(std::string(flag) + " " + path + ": cannot read it: " + std::strerror(errno));
  return text.str();
}

// --plan: the file's plans, parsed and proven correct for its call.
PlanFile loadPlanFile(const std::string& path) {
  PlanFile file;
  std::string error;
  if (!parsePlanFile(readText(path, "--plan"), &file, &error)) throw UsageError("--plan " + path + ": " + error);
  std::vector<CollArgs> perRank;
  for (int r = 0; r < file.nranks; ++r) perRank.push_back(file.argsFor(r));
  const std::string wrong = verifyPlan(
      perRank, [&file](const CollArgs& args) { return file.plans[args.rank]; }, VerifyOptions{});
  if (!wrong.empty()) {
    throw UsageError("--plan " + path + ": the verifier rejects its " + collectiveName(file.collective) + ": " + wrong);
  }
  return file;
}

// --dump-plan: every rank's plan of `algorithm` for one call, written as a plan file.
void dumpPlans(const Options& options, const Topology& topo, int nranks, int root, const std::string& algorithm) {
  PlanFile file;
  file.collective = options.collective;
  file.nranks = nranks;
  file.count = sim::callCountFor(options.collective, options.minBytes, dtypeSize(options.type), nranks);
  file.root = root;
  file.nChannels = options.channels;
  file.algorithm = algorithm;
  std::vector<int> hostOf, hosts;
  for (int r = 0; r < nranks; ++r) {
    auto known = std::find(hosts.begin(), hosts.end(), topo.rankHost(r));
    hostOf.push_back(static_cast<int>(known - hosts.begin()));
    if (known == hosts.end()) hosts.push_back(topo.rankHost(r));
  }
  file.plans.resize(nranks);
  for (int r = 0; r < nranks; ++r) {
    CollArgs args = file.argsFor(r);
    args.hostOf = hostOf;
    if (!buildPlan(args, algorithm, &file.plans[r]))
      throw UsageError("--dump-plan: " + algorithm + " has no plan for this call on rank " + std::to_string(r));
  }
  std::ofstream out(options.dumpPlan, std::ios::binary | std::ios::trunc);
  out << formatPlanFile(file);
  out.close();
  if (!out) throw UsageError("--dump-plan " + options.dumpPlan + ": cannot write it: " + std::strerror(errno));
  std::printf("# loom-sim: wrote the %s plans of %d ranks for %s of %zu elements to %s\n", algorithm.c_str(), nranks,
              collectiveName(file.collective), file.count, options.dumpPlan.c_str());
}

int run(const Options& given) {
  Options options = given;
  PlanFile planFile;
  if (!options.planFile.empty()) {
    // The file's call replaces the command line's: one row, for its collective, ranks and count.
    planFile = loadPlanFile(options.planFile);
    options.collective = planFile.collective;
    options.nranks = planFile.nranks;
    options.root = planFile.root;
    options.channels = planFile.nChannels;
    options.mode = sim::Mode::kExact;
  }
  const bool fromFile = !options.planFile.empty();
  Topology topo = loadTopology(options.topo);
  int nranks = options.nranks > 0 ? options.nranks : topo.rankCount();
  if (nranks > topo.rankCount())
    throw UsageError("--nranks " + std::to_string(nranks) + ": the topology has " + std::to_string(topo.rankCount()) +
                     " ranks");
  if (options.root >= nranks)
    throw UsageError("-r " + std::to_string(options.root) + ": the root must be below " + std::to_string(nranks));
  std::vector<std::string> known = algorithmsFor(options.collective);
  std::vector<std::string> algorithms = options.algorithms.empty() ? known : options.algorithms;
  if (!options.dumpPlan.empty()) algorithms.resize(1);  // the one named, or the collective's default
  for (const std::string& name : fromFile ? std::vector<std::string>{} : algorithms) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw UsageError("--algorithm " + name + ": " + collectiveName(options.collective) + " has " + list);
    }
  }
  std::vector<int> hosts;
  for (int r = 0; r < nranks; ++r)
    if (std::find(hosts.begin(), hosts.end(), topo.rankHost(r)) == hosts.end()) hosts.push_back(topo.rankHost(r));
  size_t elementBytes = dtypeSize(options.type);
  bool hasOp = options.collective == Collective::kAllReduce || options.collective == Collective::kReduce ||
               options.collective == Collective::kReduceScatter;
  bool hasRoot = options.collective == Collective::kBroadcast || options.collective == Collective::kReduce ||
                 options.collective == Collective::kGather || options.collective == Collective::kScatter;
  if (!options.dumpPlan.empty()) {
    dumpPlans(options, topo, nranks, hasRoot ? options.root : 0, algorithms[0]);
    return 0;
  }
  if (fromFile) {
    algorithms = {planFile.algorithm};
    options.minBytes = options.maxBytes = sim::rowBytesFor(options.collective, planFile.count, elementBytes, nranks);
  }

  // One cost model with loom-tune: unless the command line says otherwise, the costs are the tuner's (HostCosts:
  // the GPU executor's where every rank is a GPU, the host executor's elsewhere), and each row's channels and
  // slicing are what the tuner chooses for that algorithm and size on this topology (contextFor).
  const TuneContext context = contextFor(topo, nranks, options.channelsGiven ? options.channels : 0);
  const HostCosts costs;
  const bool gpus = isGpuContext(context);
  sim::Params& p = options.params;
  if (!options.llOverheadGiven) p.llOverheadUs = gpus ? costs.deviceLlSliceUs : costs.llSliceUs;
  if (!options.simpleOverheadGiven) p.simpleOverheadUs = gpus ? costs.deviceSimpleSliceUs : costs.simpleSliceUs;
  if (!options.copyGiven) p.copyBandwidth = gpus ? costs.deviceCopyGBps : costs.copyGBps;
  if (!options.efficiencyGiven)
    for (int kind = 0; kind < kLinkKinds; ++kind) p.efficiency[kind] = linkShare(costs, static_cast<LinkKind>(kind));
  if (!options.sliceGiven) p.simpleSliceBytes = context.simpleSliceBytes;
  if (!options.thresholdGiven) p.llThresholdBytes = context.llThresholdBytes;
  const bool followTuner = !fromFile && (!options.channelsGiven || !options.sliceGiven || !options.thresholdGiven);
  // One tuner per algorithm, restricted to it as LOOM_ALGO=<name> would (a tuner remembers one choice per size).
  std::map<std::string, Tuner> tuners;

  std::printf("# loom-sim: %s on %s: %d ranks on %zu host%s, %s\n", collectiveName(options.collective),
              options.topo.c_str(), nranks, hosts.size(), hosts.size() == 1 ? "" : "s",
              options.mode == sim::Mode::kFast    ? "fast engine"
              : options.mode == sim::Mode::kExact ? "exact engine"
                                                  : "exact engine where the call is small enough (as the tuner's), else fast");
  std::printf("# channels and chunks: %s (up to %d channels, %zu KiB slots: %s)\n",
              followTuner ? "the tuner's choice for each row, as loom-tune's" : "as given", context.nChannels,
              context.simpleSliceBytes >> 10,
              gpus ? "the GPU executor's, LOOM_CUDA_NCHANNELS and LOOM_CUDA_SLOT_BYTES"
                   : "LOOM_NCHANNELS and LOOM_SIMPLE_SLOT_BYTES");
  std::fputs(describeParams(options.params).c_str(), stdout);
  std::printf("#\n# %10s  %12s  %8s  %6s  %6s  %13s  %9s  %7s  %7s  %4s  %6s%s\n", "size", "count", "type", "redop",
              "root", "algorithm", "time", "algbw", "busbw", "ch", "chunk", options.timing ? "  sim(s)" : "");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %13s  %9s  %7s  %7s  %4s  %6s%s\n", "(B)", "(elements)", "", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(KiB)", options.timing ? "        " : "");
  std::fflush(stdout);

  sim::Simulator simulator(topo, options.params);
  int failures = 0, printed = 0;
  for (const std::string& algorithm : algorithms) {
    double busSum = 0;
    int rows = 0;
    for (size_t size = options.minBytes; size <= options.maxBytes;) {
      sim::Call call;
      call.collective = options.collective;
      call.elementBytes = elementBytes;
      call.count = fromFile ? planFile.count : sim::callCountFor(options.collective, size, elementBytes, nranks);
      call.root = hasRoot ? options.root : 0;
      call.nChannels = options.channels;
      call.nranks = nranks;
      call.algorithm = fromFile ? "" : algorithm;
      call.plans = fromFile ? &planFile.plans : nullptr;
      if (followTuner) {
        AlgorithmRules only;
        only.allowed[static_cast<int>(options.collective)] = {algorithm};
        auto [entry, added] = tuners.try_emplace(algorithm);
        if (added) entry->second.configure(context, costs);
        const TuneEstimate& choice = entry->second.choose(options.collective, call.count * elementBytes, only);
        if (choice.algorithm == algorithm) {
          if (!options.channelsGiven) call.nChannels = choice.nChannels;
          if (!options.sliceGiven) call.simpleSliceBytes = choice.slicing.simpleSliceBytes;
          if (!options.thresholdGiven) call.llThresholdBytes = choice.slicing.llThresholdBytes;
        }
      }
      const size_t chunkBytes = call.simpleSliceBytes > 0 ? call.simpleSliceBytes : p.simpleSliceBytes;
      auto started = std::chrono::steady_clock::now();
      sim::Result result = simulator.run(call, options.mode);
      double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      size_t next =
          options.stepFactor > 1 ? (size == 0 ? elementBytes : size * options.stepFactor) : size + options.stepBytes;
      bool last = next <= size || next > options.maxBytes;
      if (!result.ok) {
        std::printf("# %s, %zu B: not simulated: %s\n", algorithm.c_str(), size, result.error.c_str());
        ++failures;
        if (last) break;
        size = next;
        continue;
      }
      size_t bytes = sim::rowBytesFor(options.collective, call.count, elementBytes, nranks);
      double algbw = result.timeUs > 0 ? static_cast<double>(bytes) / 1e3 / result.timeUs : 0;
      double busbw = algbw * sim::busBandwidthFactor(options.collective, nranks);
      std::printf("  %10zu  %12zu  %8s  %6s  %6d  %13s  %s  %s  %s", bytes, call.count, perf::kTypeNames[options.type],
                  hasOp ? perf::kOpNames[options.op] : "none", hasRoot ? options.root : -1, algorithm.c_str(),
                  perf::formatCell(result.timeUs, 9).c_str(), perf::formatCell(algbw, 7).c_str(),
                  perf::formatCell(busbw, 7).c_str());
      std::printf("  %4d  %6zu", call.nChannels, chunkBytes >> 10);
      if (options.timing) std::printf("  %6.2f", wall);
      if (options.mode == sim::Mode::kAuto && !result.exact) std::printf("  (fast engine)");
      if (!result.converged) std::printf("  (times had not settled)");
      std::printf("\n");
      std::fflush(stdout);
      busSum += busbw;
      ++rows;
      ++printed;
      if (last) break;
      size = next;
    }
    if (rows > 0) std::printf("# %s: average busbw %.2f GB/s over %d sizes\n", algorithm.c_str(), busSum / rows, rows);
  }
  return failures > 0 && printed == 0 ? 1 : 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  // Plans are built and dropped by the thousand: keep freed memory in the process rather than returning it to the
  // kernel and faulting it back in for the next plan (half the time of building a ring's plans otherwise).
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  try {
    return loom::run(loom::parseOptions(argc, argv));
  } catch (const perf::UsageError& error) {
    std::fprintf(stderr, "loom-sim: %s\n", error.what());
    return 2;
  }
}
