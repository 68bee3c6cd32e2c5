// The data-parallel strategies (DDP, ZeRO-1, 2 and 3: parallel/strategies) against one rank: the same model, seed and
// global batch, trained 20 steps with 2 and 4 ranks as threads of this process, must give the same loss at every
// step and the same final parameters, within fp32 relative error 1e-5 (ARCHITECTURE.md, section 4); DDP also with
// two accumulated micro-batches per step, and with small buckets, so that many all-reduces overlap backward; ZeRO-2
// and 3 also with two micro-batches. And what each rank holds at 4 ranks: a quarter of what its stage shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/check.h"
#include "parallel/strategies/ddp.h"
#include "parallel/strategies/zero.h"

namespace loom::parallel {
namespace {

constexpr int kSteps = 20;
constexpr int kGlobalBatch = 8;  // sequences per step, over all ranks and micro-batches
constexpr int kT = 16;

GptConfig smallConfig() {
  GptConfig config;
  GptConfig::preset("gpt-tiny", &config);
  config.maxT = kT;
  return config;
}

// Sequence `index` of step `step`: kT + 1 tokens of a learnable source (each token a fixed function of the one
// before, from a random start), so that the loss falls.
std::vector<int32_t> sequenceOf(int step, int index, int vocab) {
  std::vector<int32_t> tokens(kT + 1);
  uint32_t state = 2654435761u * static_cast<uint32_t>(step * 1000 + index + 1);
  state ^= state >> 15;
  tokens[0] = static_cast<int32_t>(state % static_cast<uint32_t>(vocab));
  for (int i = 1; i <= kT; ++i) tokens[i] = (tokens[i - 1] * 5 + 3) % vocab;
  return tokens;
}

struct Training {
  std::vector<float> losses;
  std::vector<float> params;
  size_t buckets = 0;
  MemoryReport memory;
};

enum class Strategy { kDdp, kZero1, kZero2, kZero3 };

// Trains on `nranks` threads, each taking kGlobalBatch / nranks sequences per step in `micro` micro-batches.
Training train(int nranks, int micro, size_t bucketBytes, Strategy strategy = Strategy::kDdp) {
  loomUniqueId id;
  EXPECT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<Training> runs(nranks);
  auto rankMain = [&](int rank) {
    loomComm_t comm = nullptr;
    LOOM_PAR_CHECK(comm, loomCommInitRank(&comm, nranks, id, rank));
    Gpt model(smallConfig());
    model.initialise(42);
    AdamWOptions adamw;
    adamw.learningRate = 3e-3f;
    // The attention's key bias has an exact gradient of zero (softmax ignores a shift shared by a query's scores),
    // so in fp32 it is rounding noise, which differs with the order of summation; with eps 1e-8 AdamW turns that
    // noise into steps of up to the learning rate. eps 1e-6 keeps such steps a thousandth of that, and is still far
    // below every real gradient's root mean square.
    adamw.eps = 1e-6f;
    std::unique_ptr<Trainer> trainer;
    DdpTrainer* ddp = nullptr;
    ZeroTrainer* zero = nullptr;
    if (strategy == Strategy::kDdp) {
      DdpOptions options;
      options.bucketBytes = bucketBytes;
      options.adamw = adamw;
      trainer = std::make_unique<DdpTrainer>(model, comm, options);
      ddp = static_cast<DdpTrainer*>(trainer.get());
    } else {
      ZeroOptions options;
      options.stage = strategy == Strategy::kZero1 ? 1 : strategy == Strategy::kZero2 ? 2 : 3;
      options.adamw = adamw;
      trainer = std::make_unique<ZeroTrainer>(model, comm, options);
      zero = static_cast<ZeroTrainer*>(trainer.get());
    }
    const int perRank = kGlobalBatch / nranks, perMicro = perRank / micro;
    for (int step = 0; step < kSteps; ++step) {
      // Micro-batch k: perMicro sequences of B x (T + 1) tokens, laid out so inputs and targets are B x T each.
      std::vector<std::vector<int32_t>> inputs(micro), targets(micro);
      for (int k = 0; k < micro; ++k)
        for (int s = 0; s < perMicro; ++s) {
          std::vector<int32_t> tokens = sequenceOf(step, rank * perRank + k * perMicro + s, model.config().vocab);
          inputs[k].insert(inputs[k].end(), tokens.begin(), tokens.end() - 1);
          targets[k].insert(targets[k].end(), tokens.begin() + 1, tokens.end());
        }
      std::vector<const int32_t*> in, out;
      for (int k = 0; k < micro; ++k) {
        in.push_back(inputs[k].data());
        out.push_back(targets[k].data());
      }
      runs[rank].losses.push_back(trainer->step(in, out, perMicro, kT).loss);
    }
    runs[rank].params = zero != nullptr
                            ? zero->gatherParams()
                            : std::vector<float>(model.params().f32(), model.params().f32() + model.layout().total);
    if (ddp != nullptr) runs[rank].buckets = ddp->buckets().buckets().size();
    runs[rank].memory = trainer->memory();
    trainer.reset();
    loomCommDestroy(comm);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back(rankMain, r);
  for (auto& thread : threads) thread.join();
  for (int r = 1; r < nranks; ++r) {
    EXPECT_EQ(runs[r].losses, runs[0].losses) << "rank " << r << " reports another loss than rank 0";
    EXPECT_EQ(runs[r].params, runs[0].params) << "rank " << r << " ends with other parameters than rank 0";
  }
  return runs[0];
}

// max |a - b| / max |b|
double relativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

void expectSameTraining(const Training& run, const Training& single, const std::string& what) {
  ASSERT_EQ(run.losses.size(), single.losses.size());
  for (size_t step = 0; step < single.losses.size(); ++step)
    EXPECT_NEAR(run.losses[step], single.losses[step], 1e-5 * std::fabs(single.losses[step]))
        << what << " step " << step;
  EXPECT_LE(relativeError(run.params, single.params), 1e-5) << what << ": final parameters";
  EXPECT_LT(single.losses.back(), single.losses.front()) << "the run did not learn";
}

TEST(Ddp, MatchesOneRankWithTwoAndFourRanks) {
  const Training single = train(1, 1, size_t{25} << 20);
  for (int nranks : {2, 4})
    expectSameTraining(train(nranks, 1, size_t{25} << 20), single, std::to_string(nranks) + " ranks");
}

TEST(Ddp, MatchesOneRankWithAccumulationAndSmallBuckets) {
  const Training single = train(1, 1, size_t{25} << 20);
  expectSameTraining(train(2, 2, size_t{25} << 20), single, "2 ranks, 2 micro-batches");
  const Training small = train(2, 1, 64 << 10);
  EXPECT_GT(small.buckets, 10u);
  expectSameTraining(small, single, "2 ranks, 64 KiB buckets");
}

TEST(Zero, EveryStageMatchesOneRankWithTwoAndFourRanks) {
  const Training single = train(1, 1, 0);
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2, Strategy::kZero3})
    for (int nranks : {2, 4})
      expectSameTraining(
          train(nranks, 1, 0, strategy), single,
          "ZeRO-" + std::to_string(static_cast<int>(strategy)) + ", " + std::to_string(nranks) + " ranks");
}

TEST(Zero, Stages2And3MatchOneRankWithAccumulation) {
  const Training single = train(1, 1, 0);
  for (Strategy strategy : {Strategy::kZero2, Strategy::kZero3})
    expectSameTraining(train(2, 2, 0, strategy), single,
                       "ZeRO-" + std::to_string(static_cast<int>(strategy)) + ", 2 ranks, 2 micro-batches");
}

// With the same reduction order, ZeRO and DDP compute the same bits. At 2 ranks every order is the same (a + b is
// b + a in IEEE arithmetic), so there every stage must match DDP exactly, loss and parameters.
TEST(Zero, EveryStageAgreesWithDdpBitwiseAtTwoRanks) {
  const Training ddp = train(2, 1, size_t{25} << 20, Strategy::kDdp);
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    const Training zero = train(2, 1, 0, strategy);
    EXPECT_EQ(zero.losses, ddp.losses) << "ZeRO-" << static_cast<int>(strategy);
    EXPECT_EQ(zero.params, ddp.params) << "ZeRO-" << static_cast<int>(strategy);
  }
}

// At 4 ranks each stage holds a quarter of what it shards, up to each unit's padding to a multiple of 4 (rank 0
// owns whole slices): stage 1 the optimizer state, stage 2 also the gradients, stage 3 also the parameters.
TEST(Zero, EachStageHoldsAQuarterOfWhatItShardsAtFourRanks) {
  const GptLayout layout = GptLayout::of(smallConfig());
  const size_t whole = layout.total * sizeof(float);
  const size_t padding = (layout.unitBegin.size() - 1) * 4 * sizeof(float);
  auto quarter = [&](size_t bytes, size_t of, const char* what) {
    EXPECT_GE(bytes * 4, of) << what;
    EXPECT_LE(bytes * 4, of + padding) << what;
  };
  const Training ddp = train(4, 1, size_t{25} << 20, Strategy::kDdp);
  EXPECT_EQ(ddp.memory.paramBytes, whole);
  EXPECT_EQ(ddp.memory.gradBytes, whole);
  EXPECT_EQ(ddp.memory.optimizerBytes, 2 * whole);
  const Training zero1 = train(4, 1, 0, Strategy::kZero1);
  quarter(zero1.memory.optimizerBytes, 2 * whole, "ZeRO-1 optimizer state");
  EXPECT_EQ(zero1.memory.paramBytes, whole);
  const Training zero2 = train(4, 1, 0, Strategy::kZero2);
  quarter(zero2.memory.optimizerBytes, 2 * whole, "ZeRO-2 optimizer state");
  quarter(zero2.memory.gradBytes, whole, "ZeRO-2 gradients");
  EXPECT_EQ(zero2.memory.paramBytes, whole);
  EXPECT_LT(zero2.memory.peakTransientBytes, whole) << "ZeRO-2 held every unit's gradients at once";
  const Training zero3 = train(4, 1, 0, Strategy::kZero3);
  quarter(zero3.memory.optimizerBytes, 2 * whole, "ZeRO-3 optimizer state");
  quarter(zero3.memory.gradBytes, whole, "ZeRO-3 gradients");
  quarter(zero3.memory.paramBytes, whole, "ZeRO-3 parameters");
  EXPECT_LT(zero3.memory.peakTransientBytes, 2 * whole) << "ZeRO-3 held every unit at once";
}

TEST(Ddp, BucketsCoverTheBufferFromTheEnd) {
  const GptLayout layout = GptLayout::of(smallConfig());
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomComm_t comm = nullptr;
  ASSERT_EQ(loomCommInitRank(&comm, 1, id, 0), loomSuccess);
  for (size_t bytes : {size_t{4}, size_t{4000}, size_t{1} << 20, size_t{1} << 30}) {
    BucketedAllReduce buckets(comm, cpuOps(), layout, bytes);
    size_t end = layout.total;
    for (const auto& [begin, bucketEnd] : buckets.buckets()) {
      EXPECT_EQ(bucketEnd, end) << bytes;
      EXPECT_LT(begin, bucketEnd) << bytes;
      EXPECT_LE((bucketEnd - begin) * sizeof(float), std::max<size_t>(bytes, sizeof(float))) << bytes;
      end = begin;
    }
    EXPECT_EQ(end, 0u) << bytes;
  }
  loomCommDestroy(comm);
}

}  // namespace
}  // namespace loom::parallel
