// The data-parallel strategies (DDP, ZeRO-1, 2 and 3: parallel/strategies) against one rank: the same model, seed and
// global batch, trained 20 steps with 2 and 4 ranks as threads of this process, must give the same loss at every
// step and the same final parameters, within fp32 relative error 1e-5 (ARCHITECTURE.md, section 4); DDP also with
// two accumulated micro-batches per step, and with small buckets, so that many all-reduces overlap backward; ZeRO-2
// and 3 also with two micro-batches. And what each rank holds at 4 ranks: a quarter of what its stage shards.
#include <gtest/gtest.h>

#include <string>

#include "tests/parallel/training.h"

namespace loom::parallel {
namespace {

using runs::smallConfig;
using runs::Strategy;
using runs::Training;

// CPU ranks: `nranks` threads, `micro` micro-batches per step.
Training train(int nranks, int micro, size_t bucketBytes, Strategy strategy = Strategy::kDdp) {
  runs::Run run;
  run.nranks = nranks;
  run.micro = micro;
  run.bucketBytes = bucketBytes;
  run.strategy = strategy;
  return runs::train(run);
}

void expectSameTraining(const Training& run, const Training& single, const std::string& what) {
  runs::expectSameTraining(run, single, 1e-5, what);
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
  EXPECT_EQ(zero1.memory.gradBytes, whole) << "ZeRO-1's reduce-scatters land in its whole gradients";
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

// Timing a step's communication alone (loom-train's breakdown) between steps leaves the training as it was.
TEST(DataParallel, TimingTheCommunicationAloneChangesNothing) {
  for (Strategy strategy : {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    runs::Run run;
    run.nranks = 2;
    run.steps = 4;
    run.strategy = strategy;
    const Training plain = runs::train(run);
    run.timeCommunication = true;
    const Training timed = runs::train(run);
    EXPECT_EQ(timed.losses, plain.losses) << "strategy " << static_cast<int>(strategy);
    EXPECT_EQ(timed.params, plain.params) << "strategy " << static_cast<int>(strategy);
  }
}

// Tensor parallelism (heads, MLP units and vocabulary cut over 2 and 4 ranks) follows one rank, alone and combined
// with data parallelism (DDP, ZeRO-1 and ZeRO-3 over the tensor-parallel parts).
TEST(TensorParallel, MatchesOneRank) {
  const Training single = train(1, 1, size_t{25} << 20);
  for (int tp : {2, 4}) {
    runs::Run run;
    run.nranks = tp;
    run.tp = tp;
    expectSameTraining(runs::train(run), single, "tp " + std::to_string(tp));
  }
  for (Strategy strategy : {Strategy::kDdp, Strategy::kZero1, Strategy::kZero3}) {
    runs::Run run;
    run.nranks = 4;
    run.tp = 2;
    run.strategy = strategy;
    expectSameTraining(runs::train(run), single, "tp 2 x dp 2, strategy " + std::to_string(static_cast<int>(strategy)));
  }
}

// Sequence parallelism with TP 2: alone, with two accumulated micro-batches (its layernorm gradients are summed over
// the ranks per micro-batch), and under ZeRO-3 with data parallelism.
TEST(SequenceParallel, MatchesOneRank) {
  const Training single = train(1, 1, size_t{25} << 20);
  struct Case {
    int nranks, micro;
    Strategy strategy;
  };
  for (const Case& c : {Case{2, 1, Strategy::kDdp}, Case{2, 2, Strategy::kDdp}, Case{4, 1, Strategy::kZero3}}) {
    runs::Run run;
    run.nranks = c.nranks;
    run.tp = 2;
    run.sequenceParallel = true;
    run.micro = c.micro;
    run.strategy = c.strategy;
    expectSameTraining(runs::train(run), single,
                       "tp 2 + sp, " + std::to_string(c.nranks) + " ranks, " + std::to_string(c.micro) +
                           " micro-batches, strategy " + std::to_string(static_cast<int>(c.strategy)));
  }
}

// Units whose sizes the ranks do not divide (odd sizes at 2 ranks) are padded: every stage still matches one rank,
// stage 1's in-place reduce-scatter going through a padded copy.
TEST(Zero, PaddedUnitsMatchOneRank) {
  runs::Run run;
  run.config = GptConfig{2, 3, 129, runs::kT, 255};  // the embeddings' unit and each block have odd sizes
  const Training single = runs::train(run);
  run.nranks = 2;
  for (Strategy strategy : {Strategy::kZero1, Strategy::kZero2, Strategy::kZero3}) {
    run.strategy = strategy;
    expectSameTraining(runs::train(run), single, "padded units, ZeRO-" + std::to_string(static_cast<int>(strategy)));
  }
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
