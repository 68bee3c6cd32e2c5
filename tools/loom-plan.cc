// loom-plan: the arithmetic of training a transformer on a cluster, before anyone buys it. For a model (a preset or
// its shape), a global batch, a cluster topology and a parallel layout it prints what each GPU holds (parameters,
// gradients and optimizer states at every ZeRO stage; activations by Korthikanti et al. with and without tensor
// and sequence parallelism and recomputation), the bytes each parallelism moves per step, and the pipeline bubble
// of every schedule. With --recommend it applies Megatron's rule of thumb (tensor or expert parallelism within the
// NVLink domain, at most 8; pipeline parallelism across nodes; data parallelism for the rest; gradient
// accumulation when a GPU's share of the batch is more than one micro-batch) and predicts each candidate's step
// time, its collectives timed by loom's simulator (tools/sim) on the topology's own links. Without --topo the
// cluster is a fat tree of DGX H100 nodes sized to the layout (fattree:4 for --recommend).
//
//   loom-plan --model gpt3-175b --topo fattree:128 --batch 1536 --recommend
//   loom-plan --model gpt2-124m --tp 4 --sp --pp 2 --dp 4 --zero 1 --batch 64 --recompute selective
//
// The formulas are parallel/plan/accounting.h's; docs/PLANNING.md explains the step-time model.
#include <getopt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "parallel/plan/accounting.h"
#include "src/topology/presets.h"
#include "tools/sim/sim.h"

namespace {

using namespace loom::parallel::plan;
using loom::Topology;

struct Options {
  ModelSpec model;
  std::map<std::string, int> shape;  // --layers and friends, over the preset
  Layout layout;
  bool layoutGiven = false;
  int batch = 0;  // global batch in sequences; 0: one micro-batch per data-parallel rank
  std::string topo;  // "": sized from the layout (fattree of 8-GPU nodes), or fattree:4 for --recommend
  Precision precision = Precision::mixed();
  bool recommend = false;
  double gpuMemoryGB = 80;  // H100 SXM
  double gpuTflops = 989;   // H100 SXM dense bf16
  double efficiency = 0.5;  // the share of that peak the model's kernels reach
  int channels = 8;
};

[[noreturn]] void usage(const std::string& problem) {
  if (!problem.empty()) std::fprintf(stderr, "loom-plan: %s\n", problem.c_str());
  std::string models;
  for (const std::string& name : ModelSpec::presetNames()) models += (models.empty() ? "" : "|") + name;
  std::fprintf(stderr,
               "usage: loom-plan [--model %s] [--layers L] [--hidden H] [--heads A] [--seq S]\n"
               "                 [--vocab V] [--ffn F] [--experts E] [--topk K] [--batch GLOBAL_SEQUENCES]\n"
               "                 [--topo PRESET|FILE] [--tp T] [--sp] [--pp P] [--dp D] [--ep E] [--cp C]\n"
               "                 [--zero 0-3] [--micro-batch B] [--schedule gpipe|1f1b|interleaved|zb-h1]\n"
               "                 [--chunks V] [--recompute none|selective|full] [--precision bf16|fp32]\n"
               "                 [--gpu-memory GB] [--gpu-tflops TF] [--efficiency F] [--channels C] [--recommend]\n",
               models.c_str());
  std::exit(problem.empty() ? 0 : 2);
}

int intArg(const char* text, const char* name, int min) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min || value > (1 << 30))
    usage(std::string("--") + name + " " + text + ": expected an integer of at least " + std::to_string(min));
  return static_cast<int>(value);
}

double doubleArg(const char* text, const char* name) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value > 0))
    usage(std::string("--") + name + " " + text + ": expected a number above 0");
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  ModelSpec::preset("gpt2-124m", &o.model);
  static const option longOptions[] = {{"model", required_argument, nullptr, 'm'},
                                       {"layers", required_argument, nullptr, 'L'},
                                       {"hidden", required_argument, nullptr, 'H'},
                                       {"heads", required_argument, nullptr, 'A'},
                                       {"seq", required_argument, nullptr, 'S'},
                                       {"vocab", required_argument, nullptr, 'V'},
                                       {"ffn", required_argument, nullptr, 'F'},
                                       {"experts", required_argument, nullptr, 'E'},
                                       {"topk", required_argument, nullptr, 'K'},
                                       {"batch", required_argument, nullptr, 'b'},
                                       {"topo", required_argument, nullptr, 'T'},
                                       {"tp", required_argument, nullptr, 't'},
                                       {"sp", no_argument, nullptr, 's'},
                                       {"pp", required_argument, nullptr, 'p'},
                                       {"dp", required_argument, nullptr, 'd'},
                                       {"ep", required_argument, nullptr, 'e'},
                                       {"cp", required_argument, nullptr, 'c'},
                                       {"zero", required_argument, nullptr, 'z'},
                                       {"micro-batch", required_argument, nullptr, 'u'},
                                       {"schedule", required_argument, nullptr, 'k'},
                                       {"chunks", required_argument, nullptr, 'v'},
                                       {"recompute", required_argument, nullptr, 'r'},
                                       {"precision", required_argument, nullptr, 'P'},
                                       {"gpu-memory", required_argument, nullptr, 'G'},
                                       {"gpu-tflops", required_argument, nullptr, 'f'},
                                       {"efficiency", required_argument, nullptr, 'y'},
                                       {"channels", required_argument, nullptr, 'C'},
                                       {"recommend", no_argument, nullptr, 'R'},
                                       {"help", no_argument, nullptr, 'h'},
                                       {nullptr, 0, nullptr, 0}};
  const std::map<char, const char*> shapeNames = {{'L', "layers"}, {'H', "hidden"}, {'A', "heads"},   {'S', "seq"},
                                                  {'V', "vocab"},  {'F', "ffn"},    {'E', "experts"}, {'K', "topk"}};
  for (int c; (c = getopt_long(argc, argv, "h", longOptions, nullptr)) != -1;) {
    if (shapeNames.count(static_cast<char>(c))) {
      const char* name = shapeNames.at(static_cast<char>(c));
      o.shape[name] = intArg(optarg, name, 0);
      continue;
    }
    Layout& l = o.layout;
    switch (c) {
      case 'm':
        if (!ModelSpec::preset(optarg, &o.model)) usage(std::string("--model ") + optarg + ": not a preset");
        break;
      case 'b':
        o.batch = intArg(optarg, "batch", 1);
        break;
      case 'T':
        o.topo = optarg;
        break;
      case 't':
        l.tp = intArg(optarg, "tp", 1), o.layoutGiven = true;
        break;
      case 's':
        l.sequenceParallel = true;
        break;
      case 'p':
        l.pp = intArg(optarg, "pp", 1), o.layoutGiven = true;
        break;
      case 'd':
        l.dp = intArg(optarg, "dp", 1), o.layoutGiven = true;
        break;
      case 'e':
        l.ep = intArg(optarg, "ep", 1), o.layoutGiven = true;
        break;
      case 'c':
        l.cp = intArg(optarg, "cp", 1), o.layoutGiven = true;
        break;
      case 'z':
        l.zero = intArg(optarg, "zero", 0);
        if (l.zero > 3) usage("--zero: 0 to 3");
        break;
      case 'u':
        l.microBatch = intArg(optarg, "micro-batch", 1);
        break;
      case 'k':
        if (!parseSchedule(optarg, &l.schedule))
          usage(std::string("--schedule ") + optarg + ": gpipe, 1f1b, interleaved or zb-h1");
        break;
      case 'v':
        l.chunks = intArg(optarg, "chunks", 1);
        break;
      case 'r': {
        const std::string text = optarg;
        if (text == "none")
          l.recompute = Recompute::kNone;
        else if (text == "selective")
          l.recompute = Recompute::kSelective;
        else if (text == "full")
          l.recompute = Recompute::kFull;
        else
          usage("--recompute " + text + ": none, selective or full");
        break;
      }
      case 'P': {
        const std::string text = optarg;
        if (text == "bf16")
          o.precision = Precision::mixed();
        else if (text == "fp32")
          o.precision = Precision::fp32();
        else
          usage("--precision " + text + ": bf16 or fp32");
        break;
      }
      case 'G':
        o.gpuMemoryGB = doubleArg(optarg, "gpu-memory");
        break;
      case 'f':
        o.gpuTflops = doubleArg(optarg, "gpu-tflops");
        break;
      case 'y':
        o.efficiency = doubleArg(optarg, "efficiency");
        if (o.efficiency > 1) usage("--efficiency: a share of the peak, at most 1");
        break;
      case 'C':
        o.channels = intArg(optarg, "channels", 1);
        break;
      case 'R':
        o.recommend = true;
        break;
      case 'h':
        usage("");
      default:
        usage("unknown option");
    }
  }
  if (optind < argc) usage(std::string("unexpected argument ") + argv[optind]);
  ModelSpec& m = o.model;
  for (const auto& [name, value] : o.shape) {
    int* field = name == "layers"    ? &m.layers
                 : name == "hidden"  ? &m.hidden
                 : name == "heads"   ? &m.heads
                 : name == "seq"     ? &m.seq
                 : name == "vocab"   ? &m.vocab
                 : name == "ffn"     ? &m.ffn
                 : name == "experts" ? &m.experts
                                     : &m.topk;
    *field = value;
  }
  if (!o.shape.empty()) m.name += " (modified)";
  const std::string problem = m.check();
  if (!problem.empty()) usage("the model: " + problem);
  if (o.recommend && o.layoutGiven) usage("--recommend chooses tp, pp, dp and ep itself: give one or the other");
  return o;
}

std::string gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text),
                bytes >= 1e9   ? "%.1f GB"
                : bytes >= 1e6 ? "%.1f MB"
                               : "%.1f kB",
                bytes >= 1e9   ? bytes / 1e9
                : bytes >= 1e6 ? bytes / 1e6
                               : bytes / 1e3);
  return text;
}

// The cluster: its topology and how its GPUs group into nodes.
struct Cluster {
  Topology topo;
  int gpus = 0, gpusPerNode = 0;
};

// How long collectives take on the cluster's links: a group's ranks are placed on the GPUs of the topology's
// ranks they stand for (rank r of a layout runs on the topology's rank r), and the simulator times the call.
class Timing {
 public:
  Timing(const Cluster& cluster, int channels) : cluster_(cluster), channels_(channels) {}

  // Microseconds of `collective` over `group` (topology ranks), `bytes` as nccl-tests counts them.
  double us(loom::Collective collective, const std::vector<int>& group, double bytes) {
    if (group.size() < 2 || bytes <= 0) return 0;
    Topology placed = cluster_.topo;
    for (size_t i = 0; i < group.size(); ++i) {
      placed.mapRank(static_cast<int>(i), cluster_.topo.rankNode(group[i]));
      placed.setRankNic(static_cast<int>(i), cluster_.topo.rankNicDevice(group[i]));
    }
    loom::sim::Simulator simulator(placed, loom::sim::loomParams());
    loom::sim::Call call;
    call.collective = collective;
    call.elementBytes = 2;
    call.count = loom::sim::callCountFor(collective, static_cast<size_t>(bytes), 2, static_cast<int>(group.size()));
    call.nranks = static_cast<int>(group.size());
    call.nChannels = channels_;
    const loom::sim::Result result = simulator.run(call, loom::sim::Mode::kFast);
    if (!result.ok) {
      std::fprintf(stderr, "loom-plan: the simulator could not time a call: %s\n", result.error.c_str());
      return 0;
    }
    return result.timeUs;
  }

 private:
  const Cluster& cluster_;
  int channels_;
};

// A candidate layout's predicted step, in seconds.
struct StepTime {
  double compute = 0, bubble = 0, tensor = 0, pipeline = 0, expert = 0, dataExposed = 0, data = 0;
  double total() const { return compute + bubble + tensor + pipeline + expert + dataExposed; }
};

// The ranks of a layout's group through `rank` along one dimension, with the order tp-cp-ep-dp-pp (tp fastest).
std::vector<int> groupOf(const Layout& l, const std::string& dim, int rank) {
  const int stride = dim == "tp" ? 1 : dim == "dp" ? l.tp * l.cp : dim == "pp" ? l.tp * l.cp * l.dp : 1;
  const int size = dim == "tp" ? l.tp : dim == "dp" ? l.dp : dim == "pp" ? l.pp : 1;
  std::vector<int> ranks;
  const int base = rank - (rank / stride % size) * stride;
  for (int k = 0; k < size; ++k) ranks.push_back(base + k * stride);
  return ranks;
}

StepTime predict(const ModelSpec& model, const Layout& l, const Estimate& e, Timing& timing, const Options& o) {
  StepTime t;
  const double tokensPerStep = static_cast<double>(l.microBatch) * l.microBatches * l.dp * model.seq;
  // 6 FLOPs per parameter and token (forward 2, backward 4) plus the attention scores' 12 L h s per token; a
  // full recomputation runs the forward once more.
  double flops = tokensPerStep * (6 * e.parameters.activePerToken + 12.0 * model.layers * model.hidden * model.seq);
  if (l.recompute == Recompute::kFull) flops *= 4.0 / 3;
  t.compute = flops / (l.gpus() * o.gpuTflops * 1e12 * o.efficiency);
  t.bubble = t.compute * e.bubble;
  const double activation = static_cast<double>(model.seq) / l.cp * l.microBatch * model.hidden * 2;
  const double layersHere = static_cast<double>(model.layers) / l.pp, m = l.microBatches;
  if (l.tp > 1)
    t.tensor = tensorParallelAllReduces(l, model.layers) * layersHere * m *
               timing.us(loom::Collective::kAllReduce, groupOf(l, "tp", 0), activation) * 1e-6;
  if (l.pp > 1) {  // each micro-batch's activations forward and gradients back, a broadcast between two stages
    const std::vector<int> stages = groupOf(l, "pp", 0);
    t.pipeline =
        2 * m * l.chunks *
        timing.us(loom::Collective::kBroadcast, {stages[0], stages[1]}, activation / (l.sequenceParallel ? l.tp : 1)) *
        1e-6;
  }
  if (l.ep > 1) {  // the expert mesh puts an expert group on consecutive ranks (within a node)
    std::vector<int> experts(l.ep);
    for (int r = 0; r < l.ep; ++r) experts[r] = r;
    t.expert = 4 * layersHere * m * timing.us(loom::Collective::kAllToAll, experts, activation * model.topk) * 1e-6;
  }
  if (l.dp > 1) {
    // The gradients' all-reduce (or ZeRO's reduce-scatter and gathers) overlaps the backward, about two thirds of
    // the computation; what is longer is exposed.
    const double gradients = e.paramsPerGpu * o.precision.grad;
    t.data = timing.us(loom::Collective::kAllReduce, groupOf(l, "dp", 0), gradients) * 1e-6 * dataParallelPasses(l) / 2;
    t.dataExposed = std::max(0.0, t.data - t.compute * 2 / 3);
  }
  return t;
}

void printModel(const Options& o, const Estimate& e) {
  const ModelSpec& m = o.model;
  std::printf("# model: %s: L=%d h=%d a=%d s=%d V=%d", m.name.c_str(), m.layers, m.hidden, m.heads, m.seq, m.vocab);
  if (m.experts > 0) std::printf(" experts=%d top-%d ffn=%d", m.experts, m.topk, m.ffnHidden());
  std::printf("\n# parameters: %.0f (%.3g B); per layer %.0f", e.parameters.total, e.parameters.total / 1e9,
              e.parameters.attention + e.parameters.mlp);
  if (m.experts > 0) std::printf("; active per token %.0f", e.parameters.activePerToken);
  std::printf("\n");
}

void printLayout(const Options& o, const Layout& l, const Estimate& e) {
  std::printf("\n## layout: %s on %d GPUs\n", l.describe().c_str(), l.gpus());
  if (!e.problem.empty()) {
    std::printf("does not fit the model: %s\n", e.problem.c_str());
    return;
  }
  std::printf("parameters per GPU (before ZeRO): %.0f\n\n", e.paramsPerGpu);
  std::printf("model states per GPU, %g + %g + %g bytes per parameter, over dp=%d:\n", o.precision.param,
              o.precision.grad, o.precision.optimizer, l.dp);
  std::printf("  %-14s %12s %12s %12s %12s\n", "ZeRO stage", "parameters", "gradients", "optimizer", "total");
  for (int stage = 0; stage <= 3; ++stage) {
    const ModelStates s = zeroModelStates(e.paramsPerGpu, l.dp, stage, o.precision);
    std::printf("  %-14s %12s %12s %12s %12s%s\n", (std::to_string(stage) + (stage == 0 ? " (DDP)" : "")).c_str(),
                gb(s.params).c_str(), gb(s.grads).c_str(), gb(s.optimizer).c_str(), gb(s.total()).c_str(),
                stage == l.zero ? "  <- this layout" : "");
  }
  const ModelSpec& m = o.model;
  const double s = static_cast<double>(m.seq) / l.cp, layers = static_cast<double>(m.layers) / l.pp;
  const double inFlight = microBatchesInFlight(l.schedule, l.pp, l.microBatches, l.chunks);
  std::printf("\nactivations (Korthikanti et al.), micro-batch %d, %g layers x %g micro-batches in flight:\n",
              l.microBatch, layers, inFlight);
  std::printf("  %-36s %14s %14s\n", "", "per layer", "per GPU");
  struct Row {
    const char* name;
    int t;
    bool sp;
    Recompute recompute;
  } rows[] = {{"no tensor parallelism", 1, false, Recompute::kNone},
              {"tensor parallel (t = tp)", l.tp, false, Recompute::kNone},
              {"tensor + sequence parallel", l.tp, true, Recompute::kNone},
              {"tensor + sequence + selective", l.tp, true, Recompute::kSelective},
              {"full recomputation (with sp)", l.tp, true, Recompute::kFull},
              {"this layout", l.tp, l.sequenceParallel, l.recompute}};
  for (const Row& row : rows) {
    const double perLayer = activationBytesPerLayer(s, l.microBatch, m.hidden, m.heads, row.t, row.sp, row.recompute);
    std::printf("  %-36s %14s %14s\n", row.name, gb(perLayer).c_str(), gb(perLayer * layers * inFlight).c_str());
  }
  const bool fits = e.memory <= o.gpuMemoryGB * 1e9;
  std::printf("\nper GPU: %s of model states + %s of activations = %s (of %g GB: %s)\n", gb(e.states.total()).c_str(),
              gb(e.activations).c_str(), gb(e.memory).c_str(), o.gpuMemoryGB,
              fits ? "fits" : "DOES NOT FIT");
  const Communication& c = e.communication;
  std::printf("\ncommunication per GPU per step: data parallel %s, tensor parallel %s, pipeline %s, expert %s\n",
              gb(c.dataParallel).c_str(), gb(c.tensorParallel).c_str(), gb(c.pipeline).c_str(), gb(c.expert).c_str());
  if (l.pp > 1) {
    std::printf("pipeline bubble (p=%d, m=%d):", l.pp, l.microBatches);
    for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1})
      std::printf("  %s %.1f%%", scheduleName(schedule),
                  100 * bubbleFraction(schedule, l.pp, l.microBatches, std::max(2, l.chunks)));
    std::printf("  (interleaved with v=%d)\n", std::max(2, l.chunks));
  }
}

void printStep(const StepTime& t) {
  std::printf(
      "predicted step: %.3f s = compute %.3f + bubble %.3f + tensor %.3f + pipeline %.3f + expert %.3f + "
      "data %.3f exposed (%.3f in all, overlapping backward)\n",
      t.total(), t.compute, t.bubble, t.tensor, t.pipeline, t.expert, t.dataExposed, t.data);
}

// Micro-batches per step so that b x m x d sequences make the global batch; 0 when they cannot.
int microBatchesFor(int batch, int microBatch, int dp) {
  const int perStep = microBatch * dp;
  return batch % perStep == 0 ? batch / perStep : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::string topoNote;
  if (o.topo.empty() && o.recommend) {
    o.topo = "fattree:4";
    topoNote = " (the default for --recommend; --topo names another)";
  } else if (o.topo.empty()) {  // the layout's GPUs on 8-GPU nodes
    o.topo = "fattree:" + std::to_string(std::max(1, (o.layout.gpus() + 7) / 8));
    topoNote = " (sized to the layout; --topo names another)";
  }
  Cluster cluster;
  std::string error;
  if (!loom::loadTopologySpec(o.topo, &cluster.topo, &error)) usage("--topo " + o.topo + ": " + error);
  cluster.gpus = cluster.topo.rankCount();
  for (int r = 0; r < cluster.gpus; ++r) cluster.gpusPerNode += cluster.topo.rankHost(r) == cluster.topo.rankHost(0);
  Timing timing(cluster, o.channels);
  printModel(o, estimate(o.model, o.layout, o.precision));
  std::printf("# cluster: %s%s: %d GPUs, %d per node; %g GB and %g TFLOP/s per GPU at %.0f%% of peak\n",
              o.topo.c_str(), topoNote.c_str(), cluster.gpus, cluster.gpusPerNode, o.gpuMemoryGB, o.gpuTflops, 100 * o.efficiency);

  if (!o.recommend) {
    Layout& l = o.layout;
    if (l.gpus() > cluster.gpus)
      usage("the layout needs " + std::to_string(l.gpus()) + " GPUs; --topo " + o.topo + " has " +
            std::to_string(cluster.gpus));
    const int batch = o.batch > 0 ? o.batch : l.microBatch * l.dp * std::max(1, l.microBatches);
    l.microBatches = microBatchesFor(batch, l.microBatch, l.dp);
    if (l.microBatches == 0)
      usage("--batch " + std::to_string(batch) + " is not a multiple of micro-batch x dp (" +
            std::to_string(l.microBatch * l.dp) + ")");
    const Estimate e = estimate(o.model, l, o.precision);
    std::printf("# global batch: %d sequences of %d tokens\n", batch, o.model.seq);
    printLayout(o, l, e);
    if (!e.problem.empty()) return 1;
    if (e.memory > o.gpuMemoryGB * 1e9) {
      std::printf(
          "\ndoes not fit: %s per GPU is more than its %g GB. More model parallelism (--tp, --pp), a higher "
          "--zero stage, a smaller --micro-batch or --recompute full would lower it; --recommend finds a layout "
          "that fits\n",
          gb(e.memory).c_str(), o.gpuMemoryGB);
      return 1;
    }
    printStep(predict(o.model, l, e, timing, o));
    return 0;
  }

  // --recommend: tensor (or expert) parallel within a node, at most 8; pipeline stages across nodes, as few as
  // make it fit; data parallel for the rest; ZeRO-1, sequence parallelism and selective recomputation on.
  const int batch = o.batch > 0 ? o.batch : cluster.gpus;
  std::printf("# global batch: %d sequences of %d tokens\n", batch, o.model.seq);
  std::printf(
      "# the rule (Megatron-LM's, docs/PLANNING.md): tensor%s parallelism within a node, at most 8; pipeline stages "
      "across nodes, as few as make the model fit; data parallelism for the rest; ZeRO-1, sequence parallelism and "
      "selective recomputation on. Of the layouts that fit, the one with the least model parallelism is "
      "recommended: it moves the fewest bytes outside data parallelism\n",
      o.model.experts > 0 ? " (and expert)" : "");
  struct Candidate {
    Layout layout;
    Estimate estimate;
    StepTime step;
  };
  std::vector<Candidate> fits;
  for (int tp = 1; tp <= std::min(8, cluster.gpusPerNode); tp *= 2)
    for (int pp = 1; pp <= cluster.gpus / tp; ++pp) {
      if (cluster.gpus % (tp * pp) != 0 || o.model.layers % pp != 0) continue;
      Layout l;
      l.tp = tp;
      l.pp = pp;
      l.dp = cluster.gpus / (tp * pp);
      l.sequenceParallel = tp > 1;
      l.zero = l.dp > 1 ? 1 : 0;
      l.recompute = Recompute::kSelective;
      l.microBatch = 1;
      l.microBatches = microBatchesFor(batch, 1, l.dp);
      if (l.microBatches == 0) continue;
      if (o.model.experts > 0) {  // experts within the node too, as many as divide them
        l.ep = 1;
        while (l.ep * 2 <= std::min(8, cluster.gpusPerNode) && o.model.experts % (l.ep * 2) == 0 &&
               (l.tp * l.dp) % (l.ep * 2) == 0)
          l.ep *= 2;
      }
      const Estimate e = estimate(o.model, l, o.precision);
      if (!e.problem.empty() || e.memory > o.gpuMemoryGB * 1e9) continue;
      fits.push_back({l, e, StepTime{}});
    }
  if (fits.empty()) {
    std::printf(
        "\nno layout fits %g GB per GPU on %d GPUs: more GPUs, or full recomputation (--recompute full with "
        "a layout)\n",
        o.gpuMemoryGB, cluster.gpus);
    return 1;
  }
  // The rule's pick: the least model parallelism that fits (tensor before pipeline), then the fastest of those.
  std::sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
    return a.layout.tp * a.layout.pp != b.layout.tp * b.layout.pp
               ? a.layout.tp * a.layout.pp < b.layout.tp * b.layout.pp
               : a.layout.pp < b.layout.pp;
  });
  const size_t shown = std::min<size_t>(fits.size(), 6);
  std::printf("\n## layouts that fit, least model parallelism first\n");
  std::printf("  %-64s %10s %8s %9s\n", "layout", "memory", "bubble", "step (s)");
  for (size_t i = 0; i < shown; ++i) {
    Candidate& c = fits[i];
    c.step = predict(o.model, c.layout, c.estimate, timing, o);
    std::printf("  %-64s %10s %7.1f%% %9.3f\n", c.layout.describe().c_str(), gb(c.estimate.memory).c_str(),
                100 * c.estimate.bubble, c.step.total());
  }
  const auto fastest = std::min_element(fits.begin(), fits.begin() + shown, [](const Candidate& a, const Candidate& b) {
    return a.step.total() < b.step.total();
  });
  if (fastest != fits.begin())
    std::printf("  (the fastest of these: %s, %.3f s a step, with more model parallelism than the rule's pick)\n",
                fastest->layout.describe().c_str(), fastest->step.total());
  const Candidate& chosen = fits.front();
  std::printf("\n## recommended\n");
  printLayout(o, chosen.layout, chosen.estimate);
  printStep(chosen.step);
  if (chosen.layout.microBatches > 1 && chosen.layout.pp == 1)
    std::printf("gradient accumulation: %d micro-batches of %d per step on each GPU\n", chosen.layout.microBatches,
                chosen.layout.microBatch);
  return 0;
}
