// The plan simulator (tools/sim): times worked out by hand on small graphs, links shared by flows, max-min fair
// rates, routes striped over twin switches, the fast engine against the exact one on small topologies, and a
// ring over 16,384 ranks that completes with a sane bus bandwidth. No timing claims: these are the model's
// own results (docs/SIMULATION.md).
#include "tools/sim/sim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "src/topology/presets.h"
#include "src/topology/network.h"
#include "src/tuner/event_timer.h"
#include "src/tuner/tuner.h"
#include "tools/sim/shapes.h"

namespace loom::sim {
namespace {

// No software overheads, links at their nominal bandwidth, free local copies: what is left is the network.
Params networkOnly() {
  Params params;
  params.llOverheadUs = params.simpleOverheadUs = 0;
  for (double& efficiency : params.efficiency) efficiency = 1;
  params.copyBandwidth = 1e12;
  return params;
}

Topology preset(const std::string& spec) {
  Topology topo;
  std::string error;
  EXPECT_TRUE(makePreset(spec, &topo, &error)) << error;
  return topo;
}

// GPUs of one host, all joined to one switch by links of `bandwidth` GB/s and `latency` us each (or, for two GPUs
// and `direct`, joined by one such link).
Topology gpusOnSwitch(int gpus, double bandwidth, double latency, bool direct = false) {
  Topology topo;
  topo.addHost("host0");
  std::vector<int> nodes;
  for (int g = 0; g < gpus; ++g) {
    nodes.push_back(topo.addNode(NodeKind::kGpu, "host0/gpu" + std::to_string(g), 0));
    topo.mapRank(g, nodes.back());
  }
  if (direct) {
    topo.addLink(LinkKind::kNvLink, nodes[0], nodes[1], bandwidth, latency);
    return topo;
  }
  int hub = topo.addNode(NodeKind::kNvSwitch, "host0/nvswitch0", 0);
  for (int node : nodes) topo.addLink(LinkKind::kNvLink, node, hub, bandwidth, latency);
  return topo;
}

Result simulate(const Topology& topo, const Params& params, Call call, Mode mode) {
  Simulator simulator(topo, params);
  if (call.nranks == 0) call.nranks = topo.rankCount();
  Result result = simulator.run(call, mode);
  EXPECT_TRUE(result.ok) << result.error;
  return result;
}

std::string describe(const Call& call, Mode mode) {
  return std::string(collectiveName(call.collective)) + " " + (call.algorithm.empty() ? "default" : call.algorithm) +
         " count " + std::to_string(call.count) + " channels " + std::to_string(call.nChannels) + " ranks " +
         std::to_string(call.nranks) + (mode == Mode::kFast ? " (fast)" : " (exact)");
}

// Two ranks, one link: a Broadcast takes the link's latency plus the bytes at its bandwidth, in one slice or in
// many (the slices stream back to back), and with overheads one message costs the sender's and the receiver's.
TEST(SimTime, TwoRanksOneLink) {
  const double bandwidth = 10, latency = 2;  // GB/s, us
  Topology topo = gpusOnSwitch(2, bandwidth, latency, /*direct=*/true);
  for (Mode mode : {Mode::kExact, Mode::kFast}) {
    for (size_t bytes : {size_t{65536}, size_t{8} << 20}) {
      Call call;
      call.collective = Collective::kBroadcast;
      call.algorithm = "ring";
      call.count = bytes / 4;
      call.nranks = 2;
      double expected = latency + static_cast<double>(bytes) / (bandwidth * 1e3);
      EXPECT_NEAR(simulate(topo, networkOnly(), call, mode).timeUs, expected, 1e-6 * expected) << describe(call, mode);
    }
    Params overheads = networkOnly();
    overheads.simpleOverheadUs = 2.5;
    Call call;
    call.collective = Collective::kBroadcast;
    call.algorithm = "ring";
    call.count = 65536 / 4;
    call.nranks = 2;
    double expected = 2 * 2.5 + latency + 65536 / (bandwidth * 1e3);
    EXPECT_NEAR(simulate(topo, overheads, call, mode).timeUs, expected, 1e-6 * expected) << describe(call, mode);
  }
}

// A ring AllReduce on a uniform full mesh (every pair of NPUs linked) takes 2(n-1) hops of alpha + S/(n beta)
// when each step is one slice (alpha: the message overhead and the link latency), plus the overhead of the last
// receive. With K slices per step the executor runs K such rounds one after another (a round is slice k of
// every step, a chain around the ring twice), so alpha counts K times.
TEST(SimTime, RingOnFullMeshMatchesAnalytic) {
  Topology topo = preset("fullmesh:8");
  const int n = 8;
  const double beta = 56, latency = 0.6;  // HCCS link, per figures.h
  for (double overhead : {0.0, 3.0}) {
    for (size_t slicesPerStep : {size_t{1}, size_t{16}}) {
      Params params = networkOnly();
      params.simpleOverheadUs = overhead;
      Call call;
      call.algorithm = "ring";
      call.count = n * slicesPerStep * (params.simpleSliceBytes / 4);
      double slice = static_cast<double>(params.simpleSliceBytes);
      double alpha = overhead + latency;
      double expected = slicesPerStep * (2.0 * (n - 1) * (alpha + slice / (beta * 1e3)) + overhead);
      for (Mode mode : {Mode::kExact, Mode::kFast}) {
        double time = simulate(topo, params, call, mode).timeUs;
        EXPECT_NEAR(time, expected, 0.01 * expected) << describe(call, mode) << " overhead " << overhead;
      }
    }
  }
}

// Twoshot on a full mesh with no overheads, one slice per chunk: each phase moves every rank's chunks to all its
// peers at once, over distinct links, so the call takes two transfers. (With its all-gather's receives between the
// sends, each rank's send to a later peer waited on its receive from an earlier one: a chain of up to n - 1.)
TEST(SimTime, TwoshotOnFullMeshTakesTwoTransfers) {
  Topology topo = preset("fullmesh:8");
  const int n = 8;
  const double beta = 56, latency = 0.6;
  Params params = networkOnly();
  Call call;
  call.algorithm = "twoshot";
  call.count = n * (params.simpleSliceBytes / 4);
  double expected = 2 * (latency + static_cast<double>(params.simpleSliceBytes) / (beta * 1e3));
  for (Mode mode : {Mode::kExact, Mode::kFast}) {
    double time = simulate(topo, params, call, mode).timeUs;
    EXPECT_NEAR(time, expected, 0.01 * expected) << describe(call, mode);
  }
}

// Two flows into one GPU share its link: a Gather from two ranks takes twice as long on the wire as from one.
TEST(SimTime, LinkSharedByTwoFlowsHalvesTheirBandwidth) {
  const double bandwidth = 100, latency = 0.5;
  Topology topo = gpusOnSwitch(3, bandwidth, latency);
  const size_t block = 4 << 20;
  for (Mode mode : {Mode::kExact, Mode::kFast}) {
    Call call;
    call.collective = Collective::kGather;
    call.algorithm = "direct";
    call.count = block / 4;
    call.root = 1;
    call.nranks = 2;  // rank 0 alone sends to root 1
    double alone = simulate(topo, networkOnly(), call, mode).timeUs;
    EXPECT_NEAR(alone, 2 * latency + block / (bandwidth * 1e3), 1e-3) << describe(call, mode);
    call.nranks = 3;  // ranks 0 and 2 both send to root 1 through the switch's link to it
    double shared = simulate(topo, networkOnly(), call, mode).timeUs;
    EXPECT_NEAR(shared, 2 * latency + 2 * block / (bandwidth * 1e3), 1e-3) << describe(call, mode);
  }
}

// Max-min fairness: on a chain a - b - c with links of 10 and 4 GB/s, flows a->b, a->c and b->c. The 4 GB/s link
// fills first (a->c and b->c at 2 each); a->b then takes the rest of its link, 8.
TEST(SimNetwork, MaxMinFairRates) {
  Topology topo;
  topo.addHost("host0");
  int a = topo.addNode(NodeKind::kGpu, "host0/gpu0", 0);
  int b = topo.addNode(NodeKind::kGpu, "host0/gpu1", 0);
  int c = topo.addNode(NodeKind::kGpu, "host0/gpu2", 0);
  topo.addLink(LinkKind::kNvLink, a, b, 10, 1);
  topo.addLink(LinkKind::kNvLink, b, c, 4, 1);
  double efficiency[kLinkKinds] = {1, 1, 1, 1, 1};
  Network network(topo, efficiency);
  std::vector<FlowDemand> flows = {{&network.route(a, b), 1}, {&network.route(a, c), 1}, {&network.route(b, c), 1}};
  std::vector<double> rates;
  network.fairRates(flows, &rates);
  EXPECT_NEAR(rates[0], 8, 1e-9);
  EXPECT_NEAR(rates[1], 2, 1e-9);
  EXPECT_NEAR(rates[2], 2, 1e-9);
  // Three copies of a->c: the 4 GB/s link splits four ways, and a->b gets 10 - 3.
  flows[1].multiplicity = 3;
  network.fairRates(flows, &rates);
  EXPECT_NEAR(rates[1], 1, 1e-9);
  EXPECT_NEAR(rates[2], 1, 1e-9);
  EXPECT_NEAR(rates[0], 7, 1e-9);
  // Opposite directions of a link do not share it.
  std::vector<FlowDemand> both = {{&network.route(a, b), 1}, {&network.route(b, a), 1}};
  network.fairRates(both, &rates);
  EXPECT_NEAR(rates[0], 10, 1e-9);
  EXPECT_NEAR(rates[1], 10, 1e-9);
}

// Routes through twin switches stripe over all of them, as Topology::path counts them: the four NVSwitches of
// a DGX give 450 GB/s, and a fat-tree route crosses the spines as one group resource, limited by its NICs.
TEST(SimNetwork, StripedRoutesMatchPathBandwidth) {
  double nominal[kLinkKinds] = {1, 1, 1, 1, 1};
  for (const char* spec : {"dgx-h100", "fattree:64"}) {
    Topology topo = preset(spec);
    Network network(topo, nominal);
    for (auto [from, to] : {std::pair{0, 5}, std::pair{3, 13}, std::pair{7, 8 * 40 + 2}}) {
      if (to >= topo.rankCount()) continue;
      const NetRoute& route = network.rankRoute(from, to);
      PathInfo path = topo.path(from, to);
      EXPECT_TRUE(route.reachable);
      EXPECT_NEAR(route.soloRate, path.bandwidth, 1e-9) << spec << " " << from << " -> " << to;
      EXPECT_NEAR(route.latencyUs, path.latency, 1e-9) << spec << " " << from << " -> " << to;
      EXPECT_LE(route.uses.size(), 12u) << spec << " " << from << " -> " << to;
    }
  }
}

// A call on a torus preset gets the torus its chips form, as CollArgs wants it (the preset numbers chips with the
// first coordinate fastest, CollArgs lists the slowest first); part of a torus, or no torus, gets none.
TEST(SimSetup, TorusAndHostsFromTheTopology) {
  Topology torus = preset("torus3d:4x2x3");
  Call call;
  call.algorithm = "torus";
  call.count = 1024;
  call.nranks = 24;
  CallSetup setup;
  std::string error;
  ASSERT_TRUE(setUpCall(torus, call, Params{}, &setup, &error)) << error;
  ASSERT_EQ(setup.base.torusDimCount, 3);
  EXPECT_EQ(setup.base.torusDims[0], 3);
  EXPECT_EQ(setup.base.torusDims[1], 2);
  EXPECT_EQ(setup.base.torusDims[2], 4);
  EXPECT_EQ(setup.hostOf[5], 1);  // 4 chips per host
  call.nranks = 12;
  ASSERT_TRUE(setUpCall(torus, call, Params{}, &setup, &error)) << error;
  EXPECT_EQ(setup.base.torusDimCount, 0);
  call.nranks = 16;
  ASSERT_TRUE(setUpCall(preset("fattree:2"), call, Params{}, &setup, &error)) << error;
  EXPECT_EQ(setup.base.torusDimCount, 0);
  EXPECT_EQ(setup.hostOf[7], 0);
  EXPECT_EQ(setup.hostOf[8], 1);
}

// The fast engine against the exact one. Most plans agree within a few percent; where a lane alternates between
// peers or a pipeline fills (trees, chains, two-shot, AllToAll), the fast engine's "every flow of a phase sends
// at once" makes it slower, never faster by more than a few percent (docs/SIMULATION.md has the table).
TEST(SimEngines, FastAgreesWithExact) {
  struct Bound {
    const char* algorithm;
    double most;  // fast / exact at most
  };
  const Collective kCollectives[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                     Collective::kBroadcast, Collective::kReduce,    Collective::kAllToAll,
                                     Collective::kGather,    Collective::kScatter};
  auto boundFor = [](Collective collective, const std::string& algorithm) {
    if (algorithm == "twoshot" || collective == Collective::kAllToAll) return 3.5;
    if (algorithm == "tree" || collective == Collective::kBroadcast || collective == Collective::kReduce) return 1.8;
    if (algorithm == "direct" && (collective == Collective::kAllReduce || collective == Collective::kReduceScatter))
      return 1.5;
    return 1.15;
  };
  for (const char* spec : {"fullmesh:8", "dgx-h100", "fattree:2", "torus2d:4x4"}) {
    Topology topo = preset(spec);
    Simulator simulator(topo, Params{});
    for (Collective collective : kCollectives) {
      for (const std::string& algorithm : algorithmsFor(collective)) {
        for (size_t bytes : {size_t{4096}, size_t{1} << 20, size_t{16} << 20}) {
          for (int channels : {1, 2}) {
            Call call;
            call.collective = collective;
            call.algorithm = algorithm;
            call.nranks = topo.rankCount();
            call.count = callCountFor(collective, bytes, 4, call.nranks);
            call.nChannels = channels;
            call.root = 1;
            Result exact = simulator.run(call, Mode::kExact), fast = simulator.run(call, Mode::kFast);
            ASSERT_TRUE(exact.ok && fast.ok) << spec << " " << describe(call, Mode::kFast) << exact.error << fast.error;
            ASSERT_GT(exact.timeUs, 0) << spec << " " << describe(call, Mode::kExact);
            double ratio = fast.timeUs / exact.timeUs;
            EXPECT_GE(ratio, 0.9) << spec << " " << describe(call, Mode::kFast) << ": fast " << fast.timeUs
                                  << " us, exact " << exact.timeUs << " us";
            EXPECT_LE(ratio, boundFor(collective, algorithm)) << spec << " " << describe(call, Mode::kFast) << ": fast "
                                                              << fast.timeUs << " us, exact " << exact.timeUs << " us";
          }
        }
      }
    }
  }
}

// Plans extended from a sample by symmetry, and channels folded into one, time as the plans built on every rank.
TEST(SimEngines, SymmetryAndFoldingKeepTheTime) {
  Topology topo = preset("fattree:4");
  for (const char* algorithm : {"ring", "torus", "hierarchical"}) {
    Call call;
    call.algorithm = algorithm;
    call.nranks = topo.rankCount();
    call.count = 8 << 20;
    call.nChannels = 4;
    Params sampled;
    sampled.symmetryMinSteps = 0;  // always try
    Params built;
    built.buildAll = true;
    Result extended = simulate(topo, sampled, call, Mode::kFast);
    Result full = simulate(topo, built, call, Mode::kFast);
    EXPECT_EQ(extended.steps, full.steps) << algorithm;
    EXPECT_NEAR(extended.timeUs, full.timeUs, 1e-3 * full.timeUs) << algorithm << " (" << extended.symmetry << ")";
    EXPECT_FALSE(extended.symmetry.empty()) << algorithm;
    EXPECT_TRUE(full.symmetry.empty()) << algorithm;
  }
}

// 16,384 ranks on a 2,048-node fat tree: a ring AllReduce point completes, its plans taken by symmetry, with a
// bus bandwidth above zero and below a NIC's (each ring crosses one NIC per host).
TEST(SimScale, RingOver16384Ranks) {
  Topology topo = preset("fattree:2048");
  ASSERT_EQ(topo.rankCount(), 16384);
  Call call;
  call.algorithm = "ring";
  call.nranks = topo.rankCount();
  call.count = size_t{256} << 20;
  Params params;
  Result result = simulate(topo, params, call, Mode::kFast);
  ASSERT_TRUE(result.ok);
  EXPECT_EQ(result.steps, size_t{16384} * (2 * 16383 + 1));
  EXPECT_EQ(result.symmetry, "shift");
  EXPECT_TRUE(result.converged);
  double bytes = static_cast<double>(call.count) * 4;
  double busBandwidth = bytes / 1e3 / result.timeUs * busBandwidthFactor(Collective::kAllReduce, call.nranks);
  EXPECT_GT(busBandwidth, 0.1);
  EXPECT_LT(busBandwidth, 50 * params.efficiency[static_cast<int>(LinkKind::kNetwork)]);
}

// The event timer (src/tuner/event_timer.h), which is both the exact engine and the tuner's model of the GPU
// executor.
// Four GPUs on a switch at nominal bandwidth, Simple slices of 128 KiB, and a ring AllReduce's plans there.
struct FourGpus {
  Topology topo = gpusOnSwitch(4, 100, 1);
  Network network{topo, networkOnly().efficiency};
  SliceRule rule = SliceRule::of(4, 0, 8192, 131072, -1);

  std::vector<RankPlan> ringPlans(size_t count, int channels) {
    Call call;
    call.count = count;
    call.nChannels = channels;
    call.nranks = 4;
    call.algorithm = "ring";
    CallSetup setup;
    std::string error;
    EXPECT_TRUE(setUpCall(topo, call, Params{}, &setup, &error)) << error;
    return buildPlans(setup);
  }
};

TEST(EventTimer, FoldedChannelsTimeAsTheLanesTheyStandFor) {
  FourGpus gpus;
  std::vector<RankPlan> plans = gpus.ringPlans(size_t{1} << 20, 4);
  EventTiming folded = timeByEvents(plans, 4, gpus.network, gpus.rule, EventCosts{});
  ASSERT_TRUE(folded.ok) << folded.error;
  EXPECT_EQ(folded.folded, 4);
  // Channel 1 two elements shorter per step on every rank (as many slices): no longer copies of channel 0, so every
  // lane is timed.
  for (RankPlan& plan : plans)
    for (Lane& lane : plan.lanes)
      if (lane.channel == 1)
        for (Step& step : lane.steps)
          for (Region* region : {&step.src, &step.src2, &step.dst})
            if (region->count > 2) region->count -= 2;
  EventTiming unfolded = timeByEvents(plans, 4, gpus.network, gpus.rule, EventCosts{});
  ASSERT_TRUE(unfolded.ok) << unfolded.error;
  EXPECT_EQ(unfolded.folded, 1);
  EXPECT_GT(unfolded.events, 3 * folded.events);
  EXPECT_NEAR(unfolded.timeUs / folded.timeUs, 1.0, 1e-3) << folded.timeUs << " folded, " << unfolded.timeUs;
}

TEST(EventTimer, AStreamOfEvenCallsTakesOneCallEach) {
  FourGpus gpus;
  std::vector<RankPlan> plans = gpus.ringPlans(size_t{1} << 18, 2);
  EventCosts costs;
  costs.callUs = 0.5;
  EventTiming one = timeByEvents(plans, 2, gpus.network, gpus.rule, costs, 1);
  EventTiming stream = timeByEvents(plans, 2, gpus.network, gpus.rule, costs, 3);
  ASSERT_TRUE(one.ok && stream.ok) << one.error << stream.error;
  // Every rank of a ring ends together, so each call after the first starts callUs after the one before ended.
  EXPECT_NEAR(stream.timeUs, one.timeUs, 1e-9 * one.timeUs);
  EXPECT_GT(one.timeUs, costs.callUs);
}

TEST(EventTimer, EndsWhenAFlowsTimeLeftIsBelowTheClocksResolution) {
  // This call once spun forever: a flow whose remaining time, added to the clock, left it unchanged.
  Topology topo = preset("fattree:4");
  TuneContext context = contextFor(topo, 32, 1);
  HostCosts costs;
  loom::Slicing slicing = defaultSlicing(context);
  double us = estimateCall(context, costs, Collective::kAllReduce, 32, 4, 0, "hierarchical", 1, &slicing, 3);
  EXPECT_GT(us, 0);
}

TEST(SimSetup, ErrorsNameTheProblem) {
  Topology topo = preset("dgx-h100");
  Simulator simulator(topo, Params{});
  Call call;
  call.nranks = 8;
  call.count = 1024;
  call.algorithm = "nosuch";
  Result result = simulator.run(call, Mode::kFast);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("no algorithm \"nosuch\" for AllReduce"), std::string::npos) << result.error;
  call.algorithm = "ring";
  call.nranks = 9;
  result = simulator.run(call, Mode::kFast);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("8 ranks"), std::string::npos) << result.error;
}

}  // namespace
}  // namespace loom::sim
