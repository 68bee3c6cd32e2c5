// Training runs for the tests: the same model, seed and global batch trained with a data-parallel strategy (DDP,
// ZeRO-1, 2 or 3), tensor (and sequence) parallelism and a pipeline on ranks that are threads of this process, each
// with its own Ops (the CPU's, or a CUDA device's). Used by tests/parallel/data_parallel_test.cc,
// tests/parallel/pipeline_test.cc and tests/gpu/parallel_train_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/check.h"
#include "parallel/kernels/ops.h"
#include "parallel/pipeline/executor.h"
#include "parallel/strategies/ddp.h"
#include "parallel/strategies/zero.h"

namespace loom::parallel::runs {

constexpr int kGlobalBatch = 8;  // sequences per step, over all ranks and micro-batches
constexpr int kT = 16;

inline GptConfig smallConfig() {
  GptConfig config;
  GptConfig::preset("gpt-tiny", &config);
  config.maxT = kT;
  return config;
}

// Sequence `index` of step `step`: kT + 1 tokens of a learnable source (each token a fixed function of the one
// before, from a random start), so that the loss falls.
inline std::vector<int32_t> sequenceOf(int step, int index, int vocab) {
  std::vector<int32_t> tokens(kT + 1);
  uint32_t state = 2654435761u * static_cast<uint32_t>(step * 1000 + index + 1);
  state ^= state >> 15;
  tokens[0] = static_cast<int32_t>(state % static_cast<uint32_t>(vocab));
  for (int i = 1; i <= kT; ++i) tokens[i] = (tokens[i - 1] * 5 + 3) % vocab;
  return tokens;
}

struct Training {
  std::vector<float> losses;
  std::vector<float> params;  // fp32 (the master weights where the model computes in bf16)
  size_t buckets = 0;
  MemoryReport memory;
  int inFlight = 0;                 // pipeline stage 0: the most micro-batches it held at once
  int64_t routed = 0, dropped = 0;  // rank 0's expert assignments, and those dropped over capacity
  size_t activationBytes = 0;       // stage 0's model: every activation slot it kept
  pipeline::Timeline timeline;      // the last step's, measured (with Run::timeline)
};

enum class Strategy { kDdp, kZero1, kZero2, kZero3 };

struct Run {
  int nranks = 1;
  // Tensor-parallel and pipeline ranks in Megatron's order (rank = tp + TP (dp + DP pp)); the data-parallel size is
  // nranks / (tp pp).
  int tp = 1;
  int pp = 1;
  plan::Schedule schedule = plan::Schedule::k1F1B;
  int chunks = 1;         // per stage (the interleaved schedule)
  int ep = 1;             // expert-parallel ranks, consecutive data-parallel ranks (with DDP)
  bool timeline = false;  // time the pipeline's actions
  bool sequenceParallel = false;
  int micro = 1;  // micro-batches per step
  size_t bucketBytes = size_t{25} << 20;
  Strategy strategy = Strategy::kDdp;
  int steps = 20;
  bool timeCommunication = false;  // run Trainer::communicationAlone() after every step
  GptConfig config = smallConfig();
  // Rank r's Ops (null: the CPU's), and the kind of communicator they need.
  std::function<std::unique_ptr<Ops>(int rank)> makeOps;
  int loomDevice = loomDeviceHost;
};

// Trains on `run.nranks` threads, each data-parallel rank taking kGlobalBatch / (nranks / tp) sequences per step in
// `run.micro` micro-batches. The parameters it returns are the whole model's, assembled from the tensor-parallel
// ranks' parts.
inline Training train(const Run& run) {
  loomUniqueId id;
  EXPECT_EQ(loomGetUniqueId(&id), loomSuccess);
  const int nranks = run.nranks, micro = run.micro;
  std::vector<Training> runs(nranks);
  auto rankMain = [&](int rank) {
    std::unique_ptr<Ops> ownOps = run.makeOps ? run.makeOps(rank) : nullptr;
    Ops& ops = ownOps ? *ownOps : cpuOps();
    loomConfig_t config = LOOM_CONFIG_INITIALIZER;
    config.device = run.loomDevice;
    loomComm_t world = nullptr;
    LOOM_PAR_CHECK(world, loomCommInitRankConfig(&world, nranks, id, rank, &config));
    const int tp = run.tp, dp = nranks / (run.tp * run.pp), tpRank = rank % tp, dataRank = rank / tp % dp,
              stage = rank / (tp * dp), ep = run.ep;
    // Data-parallel, tensor-parallel, pipeline, expert-parallel and expert-data-parallel groups.
    loomComm_t comm = world, tensor = nullptr, pipe = nullptr, experts = nullptr, expertData = nullptr;
    if (run.tp > 1 || run.pp > 1) {
      LOOM_PAR_CHECK(world, loomCommSplit(world, rank / tp, tpRank, &tensor, nullptr));
      LOOM_PAR_CHECK(world, loomCommSplit(world, tpRank + tp * stage, dataRank, &comm, nullptr));
      LOOM_PAR_CHECK(world, loomCommSplit(world, rank % (tp * dp), stage, &pipe, nullptr));
    }
    if (ep > 1) {
      LOOM_PAR_CHECK(world, loomCommSplit(world, rank / (tp * ep), dataRank % ep, &experts, nullptr));
      LOOM_PAR_CHECK(
          world, loomCommSplit(world, tpRank + tp * (dataRank % ep + ep * stage), dataRank / ep, &expertData, nullptr));
    }
    Gpt model(run.config, ops, tensor, run.sequenceParallel, pipe, run.chunks, experts);
    model.initialise(42);
    std::unique_ptr<pipeline::Executor> executor;
    if (run.pp > 1) {
      pipeline::Plan plan;
      std::string error;
      EXPECT_TRUE(pipeline::makePlan(run.schedule, run.pp, micro, run.chunks, &plan, &error)) << error;
      executor = std::make_unique<pipeline::Executor>(model, pipe, plan);
      executor->setTiming(run.timeline);
    }
    AdamWOptions adamw;
    adamw.learningRate = 3e-3f;
    // The attention's key bias has an exact gradient of zero (softmax ignores a shift shared by a query's scores),
    // so in fp32 it is rounding noise, which differs with the order of summation; with eps 1e-8 AdamW turns that
    // noise into steps of up to the learning rate. eps 1e-6 keeps such steps a thousandth of that, and is still far
    // below every real gradient's root mean square.
    adamw.eps = 1e-6f;
    std::unique_ptr<Trainer> trainer;
    DdpTrainer* ddp = nullptr;
    if (run.strategy == Strategy::kDdp) {
      DdpOptions options;
      options.bucketBytes = run.bucketBytes;
      options.adamw = adamw;
      options.pipeline = executor.get();
      options.expertComm = expertData;
      trainer = std::make_unique<DdpTrainer>(model, comm, options);
      ddp = static_cast<DdpTrainer*>(trainer.get());
    } else {
      ZeroOptions options;
      options.stage = run.strategy == Strategy::kZero1 ? 1 : run.strategy == Strategy::kZero2 ? 2 : 3;
      options.adamw = adamw;
      options.pipeline = executor.get();
      trainer = std::make_unique<ZeroTrainer>(model, comm, options);
    }
    const int perRank = kGlobalBatch / dp, perMicro = perRank / micro;
    for (int step = 0; step < run.steps; ++step) {
      // Micro-batch k: perMicro sequences of B x (T + 1) tokens, laid out so inputs and targets are B x T each.
      std::vector<std::vector<int32_t>> inputs(micro), targets(micro);
      for (int k = 0; k < micro; ++k)
        for (int s = 0; s < perMicro; ++s) {
          std::vector<int32_t> tokens = sequenceOf(step, dataRank * perRank + k * perMicro + s, model.config().vocab);
          inputs[k].insert(inputs[k].end(), tokens.begin(), tokens.end() - 1);
          targets[k].insert(targets[k].end(), tokens.begin() + 1, tokens.end());
        }
      std::vector<const int32_t*> in, out;
      for (int k = 0; k < micro; ++k) {
        in.push_back(inputs[k].data());
        out.push_back(targets[k].data());
      }
      runs[rank].losses.push_back(trainer->step(in, out, perMicro, kT).loss);
      if (run.timeCommunication) {
        EXPECT_GT(trainer->communicationAlone(), 0.0);
      }
    }
    std::vector<float> m, v;
    trainer->exportState(&runs[rank].params, &m, &v);
    if (ddp != nullptr) runs[rank].buckets = ddp->buckets().buckets().size();
    runs[rank].memory = trainer->memory();
    runs[rank].activationBytes = model.activationBytes();
    runs[rank].routed = model.assignmentsRouted();
    runs[rank].dropped = model.assignmentsDropped();
    if (executor) {
      runs[rank].inFlight = executor->peakInFlight();
      if (run.timeline) runs[rank].timeline = executor->gatherTimeline();
    }
    trainer.reset();
    executor.reset();
    if (run.tp > 1 || run.pp > 1) {
      loomCommDestroy(tensor);
      loomCommDestroy(comm);
      loomCommDestroy(pipe);
    }
    if (ep > 1) {
      loomCommDestroy(experts);
      loomCommDestroy(expertData);
    }
    loomCommDestroy(world);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back(rankMain, r);
  for (auto& thread : threads) thread.join();
  const int tp = run.tp, dp = nranks / (run.tp * run.pp), ep = run.ep;
  // The rank of the same tensor-parallel rank, stage and experts in expert-data-parallel group 0.
  auto peerInGroup0 = [&](int r) { return r % tp + tp * (r / tp % dp % ep) + tp * dp * (r / (tp * dp)); };
  for (int r = 1; r < nranks; ++r) {
    EXPECT_EQ(runs[r].losses, runs[0].losses) << "rank " << r << " reports another loss than rank 0";
    EXPECT_EQ(runs[r].params, runs[peerInGroup0(r)].params)
        << "rank " << r << " ends with other parameters than its peer in data-parallel group 0";
  }
  if (run.tp > 1 || run.pp > 1 || ep > 1) {  // the whole model from the parts of every stage, tp rank and experts
    const GptLayout whole = GptLayout::of(run.config);
    std::vector<float> params(whole.total);
    for (int stage = 0; stage < run.pp; ++stage)
      for (int e = 0; e < ep; ++e) {
        const GptLayout part = GptLayout::of(run.config, tp, PipelineStage{run.pp, stage, run.chunks}, ep, e);
        for (int t = 0; t < tp; ++t)
          part.unshard(whole, runs[t + tp * e + tp * dp * stage].params.data(), t, params.data());
      }
    for (int t = 0; t < tp && run.pp > 1; ++t) {  // the tied head's copy of the token embedding stayed equal
      const GptLayout firstStage = GptLayout::of(run.config, tp, PipelineStage{run.pp, 0, run.chunks}, ep, 0),
                      lastStage = GptLayout::of(run.config, tp, PipelineStage{run.pp, run.pp - 1, run.chunks}, ep, 0);
      const ParamRange* embedding = firstStage.find("wte.weight");
      const ParamRange* head = lastStage.find("wte.weight");
      EXPECT_TRUE(head->tiedCopy);
      const float* first = runs[t].params.data() + embedding->offset;
      const float* last = runs[t + tp * dp * (run.pp - 1)].params.data() + head->offset;
      EXPECT_TRUE(std::equal(first, first + embedding->numel(), last)) << "the head's token embedding drifted";
    }
    runs[0].params = std::move(params);
  }
  return runs[0];
}

// max |a - b| / max |b|
inline double relativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

// The loss at every step within `tolerance` relative, and the final parameters within `tolerance` of the largest.
inline void expectSameTraining(const Training& run, const Training& single, double tolerance, const std::string& what) {
  ASSERT_EQ(run.losses.size(), single.losses.size());
  for (size_t step = 0; step < single.losses.size(); ++step)
    EXPECT_NEAR(run.losses[step], single.losses[step], tolerance * std::fabs(single.losses[step]))
        << what << " step " << step;
  EXPECT_LE(relativeError(run.params, single.params), tolerance) << what << ": final parameters";
  EXPECT_LT(single.losses.back(), single.losses.front()) << "the run did not learn";
}

}  // namespace loom::parallel::runs
