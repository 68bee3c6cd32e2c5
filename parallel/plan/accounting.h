// The arithmetic of training a GPT-style transformer at scale, before anyone buys hardware: parameters, the model
// states each GPU holds under ZeRO, the activations of a layer under tensor and sequence parallelism and
// recomputation, the bytes each parallelism moves per step, and the pipeline bubble. tools/loom-plan prints them;
// tests/parallel/plan_test.cc holds them to the published figures. Sizes are bytes (1 GB = 1e9 bytes).
//
// Sources of the formulas:
//  - model states: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
//    (2020): (2 + 2 + K) psi bytes with K = 12 for mixed-precision Adam, divided as each stage shards;
//  - activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), per
//    layer with 16-bit activations and dropout masks: sbh(34 + 5as/h) without parallelism, and the forms for
//    tensor parallel (t), sequence parallel and selective or full recomputation;
//  - pipeline bubbles: (p - 1) / m for GPipe and 1F1B, (p - 1) / (v m) interleaved over v chunks, and about a
//    third of 1F1B's for ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023);
//  - communication: ring collectives, a rank sending (n - 1)/n of the data per reduce-scatter or all-gather.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom::parallel::plan {

// A decoder-only transformer as the reference GPT builds it (parallel/model/gpt.h): token and learned position
// embeddings, the head tied to the token embedding, pre-norm blocks of attention and an MLP of `ffn` hidden units
// (0: 4 x hidden), or, with experts > 0, a mixture of `experts` such MLPs routed top-`topk` by a linear router.
struct ModelSpec {
  std::string name;
  int layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  int ffn = 0;
  int experts = 0, topk = 0;
  int ffnHidden() const { return ffn > 0 ? ffn : 4 * hidden; }
  // "gpt-tiny", "gpt2-124m", "gpt2-1.5b", "gpt3-175b", "moe-tiny"; false for another name.
  static bool preset(const std::string& name, ModelSpec* out);
  static std::vector<std::string> presetNames();
  // Empty, or what is wrong ("heads 5 does not divide hidden 768").
  std::string check() const;
};

struct ParameterCount {
  double embeddings = 0;  // token and position tables
  double attention = 0;   // per layer: layernorms, QKV and output projections
  double mlp = 0;         // per layer: the MLP, or every expert's and the router
  double finalNorm = 0;
  double total = 0;
  double activePerToken = 0;  // what one token's forward reads: top-k experts instead of all
};
ParameterCount countParameters(const ModelSpec& model);

// Bytes per parameter of the model states: parameters, gradients and the optimizer's K.
struct Precision {
  double param = 2, grad = 2, optimizer = 12;  // bf16 with fp32 master weights and Adam moments
  static Precision mixed() { return {}; }
  static Precision fp32() { return {4, 4, 8}; }
};

struct ModelStates {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
// What each of `nd` data-parallel ranks holds of `psi` parameters at ZeRO `stage` (0: none, 1: optimizer states
// sharded, 2: also gradients, 3: also parameters).
ModelStates zeroModelStates(double psi, int nd, int stage, Precision precision = Precision::mixed());

enum class Recompute { kNone, kSelective, kFull };
const char* recomputeName(Recompute recompute);

// Activation bytes one transformer layer keeps for backward (Korthikanti et al.): sequence s, micro-batch b, hidden
// h, heads a, tensor-parallel size t (1: none), sequence parallelism on or off (only with t > 1).
double activationBytesPerLayer(double s, double b, double h, double a, int t, bool sequenceParallel,
                               Recompute recompute);

enum class Schedule { kGpipe, k1F1B, kInterleaved, kZbH1 };
const char* scheduleName(Schedule schedule);
bool parseSchedule(const std::string& text, Schedule* out);  // gpipe, 1f1b, interleaved, zb-h1
// Idle time over useful time of a pipeline of p stages and m micro-batches (v chunks per stage, interleaved); ZB-H1's
// third of 1F1B's assumes F, B and W of equal cost and m >= p (parallel/pipeline/schedule.h measures it).
double bubbleFraction(Schedule schedule, int p, int m, int v = 1);
// The most micro-batches whose activations a stage holds at once: the first stage's, which bounds memory
// (GPipe: all m; 1F1B and ZB-H1: p; interleaved: p (1 + (p - 1) / (p v)), Korthikanti et al.'s factor).
double microBatchesInFlight(Schedule schedule, int p, int m, int v = 1);

// A parallel layout: tensor (t), sequence parallelism with it, context (cp), pipeline (p) over m micro-batches of
// b sequences, data (d) with a ZeRO stage, expert (ep); the global batch is b x m x d sequences.
struct Layout {
  int tp = 1, cp = 1, pp = 1, dp = 1, ep = 1;
  bool sequenceParallel = false;
  int zero = 0;
  int microBatch = 1, microBatches = 1;
  int chunks = 1;  // interleaved 1F1B: model chunks per stage
  Schedule schedule = Schedule::k1F1B;
  Recompute recompute = Recompute::kNone;
  int gpus() const { return tp * cp * pp * dp; }
  std::string describe() const;  // "tp=8 sp pp=4 dp=16 zero-1 mb=1 x 64 1f1b"
};

// Bytes each GPU sends per training step, by parallelism (ring collectives; 16-bit activations and gradients
// unless the precision says otherwise).
struct Communication {
  double dataParallel = 0;    // gradient all-reduce, or ZeRO's reduce-scatter and all-gathers
  double tensorParallel = 0;  // the per-layer all-reduces (or all-gathers and reduce-scatters with SP)
  double pipeline = 0;        // activations and their gradients between stages
  double expert = 0;          // the MoE layers' dispatch and combine all-to-alls
  double total() const { return dataParallel + tensorParallel + pipeline + expert; }
};

// A step's data-parallel traffic in passes over a GPU's parameters ((d - 1)/d of them each): 2 for DDP and ZeRO-1,
// m + 1 for ZeRO-2 (a reduce-scatter per micro-batch, one all-gather), 3m for ZeRO-3 (two gathers and a
// reduce-scatter per micro-batch).
double dataParallelPasses(const Layout& layout);
// A step's tensor-parallel traffic per layer and micro-batch, in all-reduces of one micro-batch's activations
// (with sequence parallelism an all-gather or reduce-scatter counts half), the embedding's and head's spread over
// the stage's layers.
double tensorParallelAllReduces(const Layout& layout, int layers);

// Everything one GPU of a layout holds and does, for one model.
struct Estimate {
  ParameterCount parameters;
  double paramsPerGpu = 0;  // after tensor, pipeline and expert sharding, before ZeRO
  ModelStates states;
  double activationsPerLayer = 0;
  double activations = 0;  // the first stage's layers times the micro-batches in flight
  double memory = 0;       // states + activations
  Communication communication;
  double bubble = 0;
  std::string problem;  // empty, or why the layout does not fit the model
};
Estimate estimate(const ModelSpec& model, const Layout& layout, Precision precision = Precision::mixed());

}  // namespace loom::parallel::plan
