// loom-train: trains the reference GPT with data parallelism (DDP, or ZeRO stage 1, 2 or 3), tensor and sequence
// parallelism (--tp, --sp) and pipeline parallelism (--pp, --pp-schedule) on loom, on the CPU (fp32) or on CUDA
// devices (--device cuda: bf16 with fp32 master weights, or fp32).
//
//   loomrun -n 2 build/tools/loom-train --model gpt-tiny --dp 2 --zero 2 --steps 300 --data synthetic
//   loomrun -n 4 build/tools/loom-train --pp 2 --pp-schedule zb-h1 --accumulation 8 --pp-timeline tl.png
//
// The ranks form Megatron's mesh, tp fastest, then dp, then pp. With a pipeline the step's --accumulation
// micro-batches are the schedule's; the last step is timed action by action, and rank 0 prints its timeline with
// the measured bubble beside the formula's (and draws it: --pp-timeline FILE.png, or FILE.txt for the text).
//
// Under a launcher each process is a rank (loomCommInitFromEnv); without one it runs as one rank. It prints a header
// (model, parallel layout, memory per rank, data), a progress line every --log-every steps, and a final summary;
// rank 0 writes the metrics (--metrics FILE.csv or FILE.json), a PNG of the loss curve (--plot FILE.png, through
// gnuplot) and checkpoints (--save FILE, every --save-every steps and at the end, atomically). --resume FILE
// continues a run from its checkpoint: the same batches follow, so the losses are bit for bit those of a run that
// never stopped. On the CPU each rank computes on one thread (OPENBLAS_NUM_THREADS, when set, gives its GEMMs more);
// on CUDA, local rank r uses device r modulo the devices it sees, over a CUDA communicator.
//
// Its command line is tools/train/options.cc; its text, metrics and plots tools/train/report.cc.
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "parallel/check.h"
#include "parallel/kernels/ops.h"
#include "parallel/mesh/mesh.h"
#include "parallel/model/checkpoint.h"
#include "parallel/model/gpt.h"
#include "parallel/pipeline/executor.h"
#include "parallel/plan/accounting.h"
#include "parallel/strategies/ddp.h"
#include "parallel/strategies/zero.h"
#include "parallel/train/data.h"
#include "tools/train/options.h"
#include "tools/train/report.h"
#ifdef LOOM_PARALLEL_CUDA
#include "parallel/kernels/cuda/ops.h"
#endif

using namespace loom::parallel;
using namespace loom::train;

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // One thread per rank for the GEMMs (the kernels' own rule): ranks are processes, one per core.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);
  GptConfig config;
  if (!GptConfig::preset(o.model, &config)) usage(("--model " + o.model + ": gpt-tiny, gpt2-124m or moe-tiny").c_str());
  if (o.layers > 0) config.layers = o.layers;
  if (config.experts == 0 && (o.ep > 1 || o.capacityFactor >= 0 || !o.dropPolicy.empty() || !o.epDispatch.empty()))
    usage("--ep, --capacity-factor, --drop-policy and --ep-dispatch are for a mixture of experts (--model moe-tiny)");
  if (!o.epDispatch.empty() && !parseExpertDispatch(o.epDispatch, &config.expertDispatch))
    usage("--ep-dispatch: expected alltoallv, ep-normal or ep-low-latency");
  if (config.expertDispatch != ExpertDispatch::kAllToAllv && o.device != "cpu")
    usage("--ep-dispatch ep-normal and ep-low-latency take host memory: --device cpu");
  if (config.experts > 0 && o.tp > 1) usage("--tp: experts do not combine with tensor parallelism; use --ep");
  if (o.capacityFactor >= 0) config.capacityFactor = o.capacityFactor;
  if (!o.dropPolicy.empty())
    config.dropPolicy = o.dropPolicy == "position" ? DropPolicy::kPosition : DropPolicy::kProbability;

  // The world: under a launcher from its variables, else one rank in this process.
  loomComm_t comm = nullptr;
  if (std::getenv("LOOM_RANK") != nullptr || std::getenv("RANK") != nullptr ||
      std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    LOOM_PAR_CHECK(comm, loomCommInitFromEnv(&comm));
  } else {
    loomUniqueId id;
    LOOM_PAR_CHECK(comm, loomGetUniqueId(&id));
    LOOM_PAR_CHECK(comm, loomCommInitRank(&comm, 1, id, 0));
  }
  int rank = 0, nranks = 1;
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);
  // --deterministic: the world again, reducing in rank order (loomConfig_t.deterministic); every communicator
  // below is split from it and keeps the setting, so every gradient's sum has the same bits whatever loom's
  // algorithm, channels or protocol (docs/RELIABILITY.md).
  loomComm_t launched = comm;
  if (o.deterministic) {
    loomConfig_t exact = LOOM_CONFIG_INITIALIZER;
    exact.deterministic = 1;
    LOOM_PAR_CHECK(launched, loomCommSplit(launched, 0, rank, &comm, &exact));
  }
  // The meshes (Megatron's order): tensor-parallel groups of consecutive ranks, data parallelism across them,
  // pipeline stages slowest; the experts' expert-parallel groups of consecutive data-parallel ranks, and the ranks
  // holding the same experts across those.
  ParallelMeshes meshes;
  std::string meshError;
  const int modelParallel = o.tp * o.pp;
  ParallelSizes sizes;
  sizes.tp = o.tp;
  sizes.pp = o.pp;
  sizes.dp = nranks % modelParallel == 0 ? nranks / modelParallel : 0;
  sizes.ep = o.ep;
  if (nranks % modelParallel != 0 || (o.dp != 0 && o.dp * modelParallel != nranks) || sizes.dp % o.ep != 0 ||
      !ParallelMeshes::make(sizes, nranks, &meshes, &meshError)) {
    if (rank == 0)
      std::fprintf(stderr, "loom-train: --tp %d%s x --pp %d%s does not lay out the job's %d ranks%s%s\n", o.tp,
                   o.dp != 0 ? (" x --dp " + std::to_string(o.dp)).c_str() : "", o.pp,
                   o.ep > 1 ? (" with --ep " + std::to_string(o.ep) + " within data parallelism").c_str() : "", nranks,
                   meshError.empty() ? "" : ": ", meshError.c_str());
    return 2;
  }
  const Mesh& mesh = meshes.dense;
  const int dpSize = nranks / modelParallel, dpRank = mesh.coordinate(rank, "dp");
  plan::Schedule schedule = plan::Schedule::k1F1B;
  plan::parseSchedule(o.ppSchedule, &schedule);
  pipeline::Plan plan;
  if (o.pp > 1) {
    std::string error = PipelineStage{o.pp, 0, o.ppChunks}.check(config.layers);
    if (error.empty()) pipeline::makePlan(schedule, o.pp, o.accumulation, o.ppChunks, &plan, &error);
    if (!error.empty()) {
      if (rank == 0) std::fprintf(stderr, "loom-train: --pp %d: %s\n", o.pp, error.c_str());
      return 2;
    }
  }

  const int T = o.seq > 0 ? o.seq : config.maxT;
  if (T > config.maxT)
    usage(("--seq " + std::to_string(T) + " is longer than the model's " + std::to_string(config.maxT)).c_str());

  // Data: the synthetic source, or a text file's tokens.
  std::unique_ptr<MarkovSource> synthetic;
  std::unique_ptr<TextData> text;
  std::string dataLine;
  if (o.data == "synthetic") {
    synthetic = std::make_unique<MarkovSource>(config.vocab, 4, o.seed);
    char line[160];
    std::snprintf(line, sizeof(line), "synthetic Markov source, V=%d, 4 successors per symbol: entropy rate %.4f nats",
                  config.vocab, synthetic->entropyRate());
    dataLine = line;
  } else {
    std::string content, error;
    if (!readFile(o.data, &content, &error)) {
      if (rank == 0) std::fprintf(stderr, "loom-train: --data: %s\n", error.c_str());
      return 2;
    }
    std::vector<int32_t> tokens;
    if (o.tokenizer == "char") {
      CharTokenizer chars(content);
      chars.encode(content, &tokens);
      config.vocab = chars.vocab();
    } else {
      tokens = ByteTokenizer().encode(content);
    }
    text = std::make_unique<TextData>(std::move(tokens), o.seed);
    // A sequence is T inputs and their T next tokens: fewer would train on padding, over and over.
    const size_t needed = static_cast<size_t>(T) + 1;
    if (text->trainTokens() < needed || (o.evalEvery > 0 && text->validationTokens() < needed)) {
      if (rank == 0)
        std::fprintf(stderr,
                     "loom-train: --data %s: %zu tokens to train and %zu to validate (the last tenth), but a sequence "
                     "needs %zu (--seq %d, plus its next token)%s\n",
                     o.data.c_str(), text->trainTokens(), text->validationTokens(), needed, T,
                     o.evalEvery > 0 ? " in each" : "; use a longer file or a shorter --seq");
      return 2;
    }
    dataLine = o.data + ", " + o.tokenizer + " tokens: " + std::to_string(text->trainTokens()) + " to train, " +
               std::to_string(text->validationTokens()) + " to validate";
  }

  // Where the model runs: the CPU's Ops and the world communicator, or a CUDA device's and a CUDA communicator over
  // the same ranks.
  Ops* ops = &cpuOps();
  std::unique_ptr<Ops> deviceOps;
  loomComm_t trainComm = comm;
  // Destroys the world's communicators last, after everything declared below that uses them, the latest first.
  struct Communicators {
    std::vector<loomComm_t> owned;
    ~Communicators() {
      for (auto it = owned.rbegin(); it != owned.rend(); ++it) loomCommDestroy(*it);
    }
  } communicators{{launched}};
  if (comm != launched) communicators.owned.push_back(comm);
  if (o.device == "cuda") {
#ifdef LOOM_PARALLEL_CUDA
    const char* localRank = std::getenv("LOOM_LOCAL_RANK");
    const int devices = loom::parallel::cuda::deviceCount();
    const int device = devices > 0 ? (localRank != nullptr ? std::atoi(localRank) : rank) % devices : 0;
    std::string error;
    deviceOps = loom::parallel::cuda::makeOps(device, o.dtype == "bf16" ? DType::kBfloat16 : DType::kFloat32, &error);
    if (!deviceOps) {
      std::fprintf(stderr, "loom-train: rank %d: --device cuda: %s\n", rank, error.c_str());
      return 2;
    }
    ops = deviceOps.get();
    loomConfig_t cudaConfig = LOOM_CONFIG_INITIALIZER;
    cudaConfig.device = loomDeviceCuda;
    cudaConfig.cudaDevice = device;
    LOOM_PAR_CHECK(comm, loomCommSplit(comm, 0, rank, &trainComm, &cudaConfig));
    communicators.owned.push_back(trainComm);
#else
    if (rank == 0)
      std::fprintf(stderr, "loom-train: --device cuda: this build has no CUDA kernels (nvcc and cuBLAS)\n");
    return 2;
#endif
  }

  // The groups' communicators, of the model's kind; and a host one over the ranks whose parts make up the model
  // (tensor, pipeline and expert parallel: the expert mesh's groups but data parallelism) for the checkpoints'
  // gathers.
  auto groups = std::make_unique<MeshComms>(trainComm, mesh, std::vector<std::string>{"tp", "dp", "pp"});
  std::unique_ptr<MeshComms> expertGroups, hostGroups;
  if (o.ep > 1)
    expertGroups = std::make_unique<MeshComms>(trainComm, meshes.expert, std::vector<std::string>{"ep", "dp"});
  const int parts = modelParallel * o.ep;
  if (parts > 1) hostGroups = std::make_unique<MeshComms>(comm, meshes.expert, std::vector<std::string>{"tp-ep-pp"});
  Gpt model(config, *ops, o.tp > 1 ? groups->get("tp") : nullptr, o.sequenceParallel,
            o.pp > 1 ? groups->get("pp") : nullptr, o.ppChunks, o.ep > 1 ? expertGroups->get("ep") : nullptr);
  model.initialise(o.seed);
  const GptLayout whole = GptLayout::of(config);
  std::unique_ptr<pipeline::Executor> executor;
  if (o.pp > 1) executor = std::make_unique<pipeline::Executor>(model, groups->get("pp"), plan);
  AdamWOptions adamw;
  adamw.learningRate = o.learningRate;
  std::unique_ptr<Trainer> trainer;
  if (o.zero == 0) {
    DdpOptions options;
    options.adamw = adamw;
    options.pipeline = executor.get();
    options.expertComm = o.ep > 1 ? expertGroups->get("dp") : nullptr;
    trainer = std::make_unique<DdpTrainer>(model, groups->get("dp"), options);
  } else {
    ZeroOptions options;
    options.stage = o.zero;
    options.adamw = adamw;
    options.pipeline = executor.get();
    trainer = std::make_unique<ZeroTrainer>(model, groups->get("dp"), options);
  }

  int firstStep = 0;
  if (!o.resume.empty()) {
    Checkpoint checkpoint;
    std::string error;
    if (!readCheckpoint(o.resume, &checkpoint, &error)) {
      if (rank == 0) std::fprintf(stderr, "loom-train: --resume: %s\n", error.c_str());
      return 2;
    }
    if (checkpoint.config.channels != config.channels || checkpoint.config.layers != config.layers ||
        checkpoint.config.vocab != config.vocab || checkpoint.config.experts != config.experts ||
        checkpoint.config.hidden() != config.hidden() || checkpoint.m.empty()) {
      if (rank == 0)
        std::fprintf(stderr, "loom-train: --resume %s holds another model, or no optimizer state\n", o.resume.c_str());
      return 2;
    }
    if (parts > 1) {  // this rank's part of the whole model's state
      const int part = model.tensorParallelRank();
      for (std::vector<float>* values : {&checkpoint.params, &checkpoint.m, &checkpoint.v}) {
        std::vector<float> local(model.layout().total);
        model.layout().shard(whole, values->data(), part, local.data());
        *values = std::move(local);
      }
    }
    if (checkpoint.dataPosition >= static_cast<uint64_t>(o.steps)) {
      if (rank == 0)
        std::fprintf(stderr,
                     "loom-train: --resume %s is at step %llu, and --steps %d leaves nothing to train: give --steps "
                     "more than %llu\n",
                     o.resume.c_str(), static_cast<unsigned long long>(checkpoint.dataPosition), o.steps,
                     static_cast<unsigned long long>(checkpoint.dataPosition));
      return 2;
    }
    trainer->importState(checkpoint.params, checkpoint.m, checkpoint.v, static_cast<int>(checkpoint.step));
    firstStep = static_cast<int>(checkpoint.dataPosition);
  }

  bool outputsFailed = false;  // a checkpoint, metrics, plot or timeline that could not be written: exit status 1
  auto save = [&](int stepsDone) {
    Checkpoint checkpoint;
    checkpoint.config = config;
    trainer->exportState(&checkpoint.params, &checkpoint.m, &checkpoint.v);
    if (parts > 1) {
      // Every part (tp rank t, experts e, stage s is part t + tp (e + ep s)), padded to the largest, gathered over
      // the host into the whole model's layout.
      std::vector<GptLayout> layouts;
      size_t largest = 0;
      for (int part = 0; part < parts; ++part) {
        layouts.push_back(GptLayout::of(config, o.tp, PipelineStage{o.pp, part / (o.tp * o.ep), o.ppChunks}, o.ep,
                                        part / o.tp % o.ep));
        largest = std::max(largest, layouts.back().total);
      }
      for (std::vector<float>* values : {&checkpoint.params, &checkpoint.m, &checkpoint.v}) {
        std::vector<float> gathered(largest * parts), full(whole.total);
        values->resize(largest);
        LOOM_PAR_CHECK(comm, loomAllGather(values->data(), gathered.data(), largest, loomFloat32,
                                           hostGroups->get("tp-ep-pp"), nullptr));
        for (int part = 0; part < parts; ++part)
          layouts[part].unshard(whole, gathered.data() + part * largest, part % o.tp, full.data());
        *values = std::move(full);
      }
    }
    checkpoint.step = static_cast<uint64_t>(trainer->steps());
    checkpoint.dataPosition = static_cast<uint64_t>(stepsDone);
    std::string error;
    if (rank == 0 && !writeCheckpoint(o.save, checkpoint, &error)) {
      std::fprintf(stderr, "loom-train: --save: %s\n", error.c_str());
      outputsFailed = true;
    }
  };

  const MemoryReport memory = trainer->memory();
  const size_t tokensPerStep = static_cast<size_t>(dpSize) * o.batch * o.accumulation * T;
  if (rank == 0) {
    std::printf("# loom-train: %s, %zu parameters (L=%d H=%d C=%d T=%d V=%d)", o.model.c_str(), whole.total,
                config.layers, config.heads, config.channels, config.maxT, config.vocab);
    if (parts > 1) std::printf(", %zu on rank 0", model.layout().total);
    if (config.experts > 0)
      std::printf("; %d experts of %d hidden units, top-%d, capacity factor %g (%s drops)%s", config.experts,
                  config.hidden(), config.topk, config.capacityFactor, dropPolicyName(config.dropPolicy),
                  o.ep > 1 ? (", over ep=" + std::to_string(o.ep) + " (" + expertDispatchName(config.expertDispatch) +
                              " dispatch)")
                                 .c_str()
                           : "");
    std::printf("\n");
    std::string pipelineText;
    if (o.pp > 1)
      pipelineText = " pp=" + std::to_string(o.pp) + " (" + plan::scheduleName(schedule) +
                     (o.ppChunks > 1 ? ", " + std::to_string(o.ppChunks) + " chunks per stage" : "") + ")";
    std::printf(
        "# layout: tp=%d%s dp=%d%s, %s; %d x %d sequences of %d tokens per data-parallel rank and step (%zu "
        "tokens per step)\n",
        o.tp, o.sequenceParallel ? " sp" : "", dpSize, pipelineText.c_str(),
        o.zero == 0 ? "DDP" : ("ZeRO-" + std::to_string(o.zero)).c_str(), o.accumulation, o.batch, T, tokensPerStep);
    std::printf("# device: %s%s\n", ops->describe().c_str(),
                ops->dtype() == DType::kBfloat16 ? " (AdamW on fp32 master weights)" : "");
    std::printf("# memory per rank: parameters %s, gradients %s, optimizer %s, total %s (%.2f bytes per parameter)\n",
                humanBytes(memory.paramBytes).c_str(), humanBytes(memory.gradBytes).c_str(),
                humanBytes(memory.optimizerBytes).c_str(), humanBytes(memory.total()).c_str(),
                static_cast<double>(memory.total()) / model.layout().total);
    std::printf("# data: %s\n", dataLine.c_str());
    if (firstStep > 0) std::printf("# resumed from %s at step %d\n", o.resume.c_str(), firstStep);
    std::fflush(stdout);
  }

  if (o.evalEvery > 0 && !text && rank == 0)
    std::fprintf(stderr,
                 "loom-train: --eval-every needs text data (--data FILE); the synthetic source has its "
                 "entropy rate instead\n");
  loomStream_t evalStream = nullptr;
  LOOM_PAR_CHECK(comm, loomStreamCreate(&evalStream));
  // The mean loss over --eval-batches validation batches, averaged across ranks.
  auto validationLoss = [&]() {
    double sum = 0;
    for (int i = 0; i < o.evalBatches; ++i) {
      const Batch batch = text->batch(static_cast<uint64_t>(i), dpRank, dpSize, o.batch, T, true);
      sum += model.forward(batch.inputs.data(), batch.targets.data(), o.batch, T);
    }
    float mean = static_cast<float>(sum / o.evalBatches);
    LOOM_PAR_CHECK(comm, loomAllReduce(&mean, &mean, 1, loomFloat32, loomAvg, comm, evalStream));
    LOOM_PAR_CHECK(comm, loomStreamSynchronize(evalStream));
    return mean;
  };

  std::vector<Metric> metrics;
  double computeSeconds = 0, exposedSeconds = 0;
  // A pipeline's last steps are timed action by action: the last one's timeline, and each one's bubble.
  constexpr int kTimedSteps = 5;
  pipeline::Timeline timeline;
  std::vector<double> bubbles;
  const auto started = std::chrono::steady_clock::now();
  for (int step = firstStep; step < o.steps; ++step) {
    std::vector<Batch> batches;
    for (int k = 0; k < o.accumulation; ++k) {
      const uint64_t index = static_cast<uint64_t>(step) * o.accumulation + k;
      batches.push_back(synthetic ? synthetic->batch(index, dpRank, dpSize, o.batch, T)
                                  : text->batch(index, dpRank, dpSize, o.batch, T, false));
    }
    std::vector<const int32_t*> inputs, targets;
    for (const Batch& batch : batches) {
      inputs.push_back(batch.inputs.data());
      targets.push_back(batch.targets.data());
    }
    if (executor) executor->setTiming(step + kTimedSteps >= o.steps);  // the last steps, action by action
    const StepReport report = trainer->step(inputs, targets, o.batch, T);
    computeSeconds += report.seconds - report.exposedSeconds;
    exposedSeconds += report.exposedSeconds;
    const bool last = step + 1 == o.steps;
    if (executor && step + kTimedSteps >= o.steps) {  // every stage at once
      timeline = executor->gatherTimeline();
      bubbles.push_back(timeline.bubble());
    }
    float validation = std::nanf("");
    if (text && o.evalEvery > 0 && ((step + 1) % o.evalEvery == 0 || last)) validation = validationLoss();
    metrics.push_back(Metric{step + 1, report.loss, report.seconds * 1e3, tokensPerStep / report.seconds, validation});
    if (rank == 0 && ((step + 1) % o.logEvery == 0 || last)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double perStep = elapsed / (step + 1 - firstStep);
      char validationText[32] = "";
      if (!std::isnan(validation)) std::snprintf(validationText, sizeof(validationText), " | val %.4f", validation);
      std::printf("step %6d/%d | loss %.4f%s | %9.0f tok/s | %8.2f ms/step | ETA %s\n", step + 1, o.steps, report.loss,
                  validationText, tokensPerStep / report.seconds, report.seconds * 1e3,
                  duration(perStep * (o.steps - step - 1)).c_str());
      std::fflush(stdout);
    }
    if (!o.save.empty() && ((o.saveEvery > 0 && (step + 1) % o.saveEvery == 0) || last)) save(step + 1);
  }
  // The step's communication run alone, for the breakdown: what of it backward hid.
  const int stepsRun = o.steps - firstStep;
  double alone = 0;
  if (dpSize > 1 && stepsRun > 0) {
    trainer->communicationAlone();  // warm-up
    constexpr int kRepeats = 5;
    for (int i = 0; i < kRepeats; ++i) alone += trainer->communicationAlone() / kRepeats;
  }
  if (rank == 0) {
    const double total = computeSeconds + exposedSeconds;
    if (total > 0)
      std::printf("# time: %.2f s computing, %.2f s waiting for communication (%.1f%% exposed)\n", computeSeconds,
                  exposedSeconds, 100.0 * exposedSeconds / total);
    // The wait also holds the time spent for the slowest rank to arrive; what exceeds the communication's own time
    // can only be that.
    const double exposedPerStep = stepsRun > 0 ? exposedSeconds / stepsRun : 0;
    if (alone > 0 && exposedPerStep < alone)
      std::printf("# communication alone: %.2f ms per step; at least %.0f%% of it hidden under computation\n",
                  alone * 1e3, 100.0 * (1.0 - exposedPerStep / alone));
    else if (alone > 0)
      std::printf(
          "# communication alone: %.2f ms per step; of the %.2f ms per step waited, at least %.2f ms is for "
          "the slowest rank to arrive\n",
          alone * 1e3, exposedPerStep * 1e3, (exposedPerStep - alone) * 1e3);
    if (stepsRun > 0)
      std::printf("# activations per rank: %s kept for backward, %s of buffers for their gradients\n",
                  humanBytes(model.activationBytes()).c_str(), humanBytes(model.activationGradientBytes()).c_str());
    if (config.experts > 0 && model.assignmentsRouted() > 0)
      std::printf(
          "# experts: rank 0 dropped %.2f%% of its %lld token assignments over capacity; load-balancing "
          "loss %.4f in its last forward (%.4f when balanced)\n",
          100.0 * static_cast<double>(model.assignmentsDropped()) / model.assignmentsRouted(),
          static_cast<long long>(model.assignmentsRouted()), model.lastAuxLoss(),
          config.auxLossCoefficient * config.layers / o.pp);
    if (executor && stepsRun > 0) {
      const double formula = plan::bubbleFraction(schedule, o.pp, o.accumulation, o.ppChunks);
      std::sort(bubbles.begin(), bubbles.end());
      const double measured = bubbles[bubbles.size() / 2];
      // The plan replayed with the measured mean cost of F, B and W, without the messages' waits and the noise.
      const pipeline::Costs costs = timeline.meanCosts();
      pipeline::Timeline replay;
      std::string error;
      const double simulated = pipeline::simulate(plan, costs, &replay, &error) ? replay.bubble() : -1;
      std::printf("# pipeline: stage 0 held %d micro-batches' activations at once; the last step, measured:\n",
                  executor->peakInFlight());
      std::printf("%s", timeline.render(1, timeline.makespan / 120).c_str());
      std::printf("# mean action: F %.3f ms, B %.3f ms, W %.3f ms\n", costs.forward * 1e3, costs.backward * 1e3,
                  costs.weight * 1e3);
      std::printf(
          "# bubble (idle over busy time): %.3f measured (median of the last %zu steps), %.3f the plan replayed with "
          "these costs, %.3f by the formula for %s at p=%d m=%d%s\n",
          measured, bubbles.size(), simulated, formula, plan::scheduleName(schedule), o.pp, o.accumulation,
          o.ppChunks > 1 ? (" v=" + std::to_string(o.ppChunks)).c_str() : "");
      if (o.ppTimeline.ends_with(".png") &&
          !plotTimeline(o.ppTimeline, timeline,
                     std::string(plan::scheduleName(schedule)) + ", p=" + std::to_string(o.pp) +
                         ", m=" + std::to_string(o.accumulation) + ": bubble " + fixed(timeline.bubble(), 3) +
                         " measured in this step, " + fixed(formula, 3) + " by the formula"))
        outputsFailed = true;
      if (o.ppTimeline.ends_with(".txt") && !writeText(o.ppTimeline, timeline.render(1, timeline.makespan / 120)))
        outputsFailed = true;
    }
    if (!o.metrics.empty() && !writeMetrics(o.metrics, metrics)) outputsFailed = true;
    if (!o.plot.empty() && !plotLoss(o.plot, metrics, synthetic ? synthetic->entropyRate() : 0.0))
      outputsFailed = true;
  }
  loomStreamDestroy(evalStream);
  return outputsFailed ? 1 : 0;  // the trainer, the model, the groups' communicators, then the world's, in that order
}
