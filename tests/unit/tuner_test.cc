// The tuner's cost model and choice: latency terms from dependent steps, bandwidth terms from bytes, shared
// links and cores, LOOM_ALGO's rules, and decisions that every rank makes alike.
#include "src/tuner/tuner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/topology/presets.h"
#include "transports/fifo.h"

namespace loom {
namespace {

// n ranks on one host of `cores` cores.
struct OneHost {
  Topology topology;
  TuneContext context;
  OneHost(int n, int cores) {
    int host = topology.addHost("host0", {{"cores", std::to_string(cores)}});
    int numa = topology.addNode(NodeKind::kNuma, "numa0", host);
    topology.addLink(LinkKind::kSmp, topology.hostNode(host), numa, 40, 0.1);
    topology.addLink(LinkKind::kSharedMemory, numa, numa, 20, 0.2);
    for (int r = 0; r < n; ++r) topology.mapRank(r, numa);
    context.topology = &topology;
    context.nranks = n;
    context.hostOf.assign(n, 0);
  }
  double estimate(const std::string& algorithm, size_t bytes, Collective collective = Collective::kAllReduce) const {
    return estimateCall(context, HostCosts{}, collective, bytes / 4, 4, 0, algorithm, 1);
  }
};

TEST(Tuner, LatencyFollowsDependentSteps) {
  OneHost host(8, 8);
  // 8 bytes: the ring's 2(n-1) = 14 dependent messages against recursive halving's 2 log2(n) = 6 and the
  // one-shot's 1.
  double ring = host.estimate("ring", 8), halving = host.estimate("rabenseifner", 8), direct = host.estimate("direct", 8);
  EXPECT_GT(ring, halving);
  EXPECT_GT(halving, direct);
  // A tree is deeper on more ranks.
  OneHost big(64, 64);
  EXPECT_GT(big.estimate("tree", 8), host.estimate("tree", 8));
}

TEST(Tuner, BandwidthFollowsBytesPerRank) {
  OneHost host(8, 8);
  // 64 MiB: the one-shot sends n-1 copies of the buffer from every rank, the ring 2(n-1)/n of it.
  double ring = host.estimate("ring", 64 << 20), direct = host.estimate("direct", 64 << 20);
  EXPECT_GT(direct, 3 * ring);
  // Twice the bytes, about twice the time, once latency no longer matters.
  double twice = host.estimate("ring", 128 << 20);
  EXPECT_NEAR(twice / ring, 2.0, 0.1);
  EXPECT_LT(host.estimate("ring", 1 << 20), ring);
}

TEST(Tuner, RanksBeyondTheCoresShareThem) {
  OneHost dedicated(8, 8), shared(8, 2);
  // Four ranks per core: at least four times slower (more, with the waits that find a rank descheduled).
  double ratio = shared.estimate("ring", 64 << 20) / dedicated.estimate("ring", 64 << 20);
  EXPECT_GT(ratio, 3.9);
  EXPECT_LT(ratio, 6.0);
}

TEST(Tuner, NetworkBandwidthIsSharedByTheRanksOfANic) {
  // Two DGX nodes: 16 ranks, 8 NICs per node, one per GPU. A ring crosses between the hosts on two edges; the
  // hierarchical AllReduce sends 1/8 of the data across on each of the 8 rails, so it must be predicted faster
  // for large messages.
  Topology topology;
  std::string error;
  ASSERT_TRUE(makePreset("fattree:2", &topology, &error)) << error;
  TuneContext context;
  context.topology = &topology;
  context.nranks = topology.rankCount();
  for (int r = 0; r < context.nranks; ++r) context.hostOf.push_back(topology.rankHost(r));
  double ring = estimateCall(context, HostCosts{}, Collective::kAllReduce, 64 << 20, 4, 0, "ring", 1);
  double hierarchical = estimateCall(context, HostCosts{}, Collective::kAllReduce, 64 << 20, 4, 0, "hierarchical", 1);
  EXPECT_GT(ring, 0);
  EXPECT_GT(hierarchical, 0);
  EXPECT_LT(hierarchical, ring);
}

TEST(Tuner, ChoosesByCostWithinTheRules) {
  OneHost host(8, 8);
  Tuner tuner;
  tuner.configure(host.context);
  AlgorithmRules none;
  const TuneEstimate& small = tuner.choose(Collective::kAllReduce, 8, none);
  const TuneEstimate& large = tuner.choose(Collective::kAllReduce, size_t{64} << 20, none);
  EXPECT_NE(small.algorithm, "ring");
  std::vector<TuneEstimate> ranked = tuner.rank(Collective::kAllReduce, size_t{64} << 20, none);
  ASSERT_FALSE(ranked.empty());
  // The pick is the cheapest, or an algorithm earlier in the registry within 10% of it.
  double pickUs = -1;
  for (const TuneEstimate& estimate : ranked)
    if (estimate.algorithm == large.algorithm && estimate.nChannels == large.nChannels) pickUs = estimate.us;
  EXPECT_GE(pickUs, ranked.front().us);
  EXPECT_LE(pickUs, ranked.front().us * 1.1 + 1e-9);
  // Every size in a power-of-two class gets the same decision; every rank's tuner makes the same.
  EXPECT_EQ(tuner.choose(Collective::kAllReduce, 5, none).algorithm, small.algorithm);
  Tuner other;
  other.configure(host.context);
  EXPECT_EQ(other.choose(Collective::kAllReduce, size_t{64} << 20, none).algorithm, large.algorithm);
  // LOOM_ALGO's rules bound the choice.
  AlgorithmRules rules;
  std::string error;
  ASSERT_TRUE(parseAlgorithmRules("allreduce:ring", &rules, &error)) << error;
  Tuner forced;
  forced.configure(host.context);
  EXPECT_EQ(forced.choose(Collective::kAllReduce, 8, rules).algorithm, "ring");
  ASSERT_TRUE(parseAlgorithmRules("^direct,twoshot", &rules, &error)) << error;
  Tuner excluded;
  excluded.configure(host.context);
  std::string chosen = excluded.choose(Collective::kAllReduce, 8, rules).algorithm;
  EXPECT_NE(chosen, "direct");
  EXPECT_NE(chosen, "twoshot");
  // Collectives with one algorithm, or per-rank counts, are not timed.
  EXPECT_EQ(tuner.choose(Collective::kAllToAllv, 1000, none).algorithm, "pairwise");
}

TEST(Tuner, ChoosesProtocolAndChunkPerCall) {
  OneHost host(4, 4);
  AlgorithmRules none;
  Tuner tuner;
  tuner.configure(host.context);
  Slicing defaults = defaultSlicing(host.context);
  for (size_t bytes = 8; bytes <= (size_t{256} << 20); bytes *= 4) {
    SCOPED_TRACE(bytes);
    const TuneEstimate& chosen = tuner.choose(Collective::kAllReduce, bytes, none);
    // LL where the default allows it, or Simple only; a slot, or a half, quarter or eighth of one, never below
    // 16 KiB.
    EXPECT_TRUE(chosen.slicing.llThresholdBytes == defaults.llThresholdBytes || chosen.slicing.llThresholdBytes == 0);
    size_t chunk = chosen.slicing.simpleSliceBytes;
    EXPECT_TRUE(chunk == defaults.simpleSliceBytes || chunk == defaults.simpleSliceBytes / 2 ||
                chunk == defaults.simpleSliceBytes / 4 || chunk == defaults.simpleSliceBytes / 8)
        << chunk;
    EXPECT_GE(chunk, size_t{16384});
    // A changed slicing is one the model predicts clearly faster than the default for the same algorithm.
    double plain = estimateCall(host.context, HostCosts{}, Collective::kAllReduce, bytes / 4, 4, 0, chosen.algorithm,
                                chosen.nChannels, nullptr, kTunedCalls);
    double tuned = estimateCall(host.context, HostCosts{}, Collective::kAllReduce, bytes / 4, 4, 0, chosen.algorithm,
                                chosen.nChannels, &chosen.slicing, kTunedCalls);
    EXPECT_DOUBLE_EQ(tuned, chosen.us);
    if (chosen.slicing.llThresholdBytes != defaults.llThresholdBytes ||
        chosen.slicing.simpleSliceBytes != defaults.simpleSliceBytes) {
      EXPECT_LT(tuned, plain * 0.9);
    }
  }
  // LOOM_PROTO and LOOM_CHUNK_BYTES fix what they name.
  TuneContext fixed = host.context;
  fixed.forcedProtocol = static_cast<int>(Protocol::kSimple);
  fixed.forcedChunkBytes = 4096;
  Tuner forced;
  forced.configure(fixed);
  for (size_t bytes = 8; bytes <= (size_t{64} << 20); bytes *= 16) {
    const TuneEstimate& chosen = forced.choose(Collective::kAllReduce, bytes, none);
    EXPECT_EQ(chosen.slicing.simpleSliceBytes, 4096u);
    EXPECT_EQ(chosen.slicing.llThresholdBytes, defaults.llThresholdBytes);
  }
  // A chunk larger than a slot is a slot.
  fixed.forcedChunkBytes = size_t{1} << 30;
  EXPECT_EQ(defaultSlicing(fixed).simpleSliceBytes, host.context.simpleSliceBytes);
}

TEST(Tuner, HostCostsFromText) {
  HostCosts costs;
  std::string error;
  ASSERT_TRUE(parseHostCosts("copyGBps=12.5,switchUs=0", &costs, &error)) << error;
  EXPECT_EQ(costs.copyGBps, 12.5);
  EXPECT_EQ(costs.switchUs, 0.0);
  EXPECT_EQ(costs.callUs, HostCosts{}.callUs);
  // What describeHostCosts prints reads back the same.
  HostCosts again;
  ASSERT_TRUE(parseHostCosts(describeHostCosts(costs), &again, &error)) << error;
  EXPECT_EQ(describeHostCosts(again), describeHostCosts(costs));
  // Bad text names what is wrong and changes nothing.
  for (const char* bad : {"copyGBps", "speed=3", "copyGBps=fast", "copyGBps=-1", "copyGBps=1,llSliceUs=x"}) {
    HostCosts unchanged = costs;
    EXPECT_FALSE(parseHostCosts(bad, &unchanged, &error)) << bad;
    EXPECT_NE(error.find('"'), std::string::npos) << error;
    EXPECT_EQ(describeHostCosts(unchanged), describeHostCosts(costs)) << bad;
  }
}

TEST(Tuner, LanesSpareSwitchesWhenRanksOutnumberCores) {
  // Four ranks on two cores: a wait finds the sender descheduled half the time. The torus's bidirectional lanes
  // (two per rank on a 2 x 2 grid) have work for the rank where the ring's one lane waits, so at 64 MiB the
  // torus is predicted faster though it moves the ring's bytes; with a core per rank it is not.
  OneHost shared(4, 2), dedicated(4, 4);
  double sharedRatio = shared.estimate("torus", 64 << 20) / shared.estimate("ring", 64 << 20);
  double dedicatedRatio = dedicated.estimate("torus", 64 << 20) / dedicated.estimate("ring", 64 << 20);
  EXPECT_LT(sharedRatio, 0.95);
  EXPECT_GT(dedicatedRatio, 1.0);
}

TEST(Tuner, UnknownAlgorithmHasNoEstimate) {
  OneHost host(4, 4);
  EXPECT_LT(host.estimate("nonesuch", 1024), 0);
  EXPECT_LT(host.estimate("tree", 1024, Collective::kAllGather), 0);
}

}  // namespace
}  // namespace loom
