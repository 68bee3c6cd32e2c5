// The verifier proves every plan of every algorithm for 1..64 ranks, counts {0, 1, 7, 1000, 1M+3} and every
// root; in-place layouts and the executor's sliced order (with tight FIFOs) at smaller sizes; and it catches
// broken plans: double counting, size mismatches, deadlocks, writes to the input, lost messages, wrong results.
#include "algorithms/verifier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <random>
#include <vector>

#include "algorithms/builders.h"
#include "tests/common/test_level.h"
#include "src/topology/presets.h"

namespace loom {
namespace {

const size_t kCounts[] = {0, 1, 7, 1000, 1000003};
const Collective kUniform[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                               Collective::kBroadcast, Collective::kReduce,        Collective::kGather,
                               Collective::kScatter,   Collective::kAllToAll,      Collective::kBarrier};

bool rooted(Collective c) {
  return c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kGather ||
         c == Collective::kScatter;
}

bool hasInPlace(Collective c) { return c != Collective::kAllToAll && c != Collective::kBarrier; }

CollArgs uniformArgs(Collective collective, int nranks, size_t count, int root, int channels) {
  CollArgs args;
  args.collective = collective;
  args.nranks = nranks;
  args.rank = 0;
  args.root = root;
  args.count = collective == Collective::kBarrier ? 1 : count;
  args.nChannels = channels;
  return args;
}

void expectProven(const CollArgs& args, const std::string& algorithm, const VerifyOptions& options) {
  std::string error = verifyPlan(argsForAllRanks(args), algorithm, options);
  ASSERT_EQ(error, "") << collectiveName(args.collective) << " algorithm " << algorithm << " ranks " << args.nranks
                       << " count " << args.count << " root " << args.root << " channels " << args.nChannels
                       << (options.inPlace ? " in place" : "") << " slice " << options.sliceElems;
}

TEST(Verifier, EveryAlgorithmEveryRankCountAndRoot) {
  for (Collective collective : kUniform) {
    for (const std::string& algorithm : algorithmsFor(collective)) {
      for (int n = 1; n <= 64; ++n) {
        for (size_t count : kCounts) {
          // Every root for the rooted collectives; where the root is irrelevant, root 0.
          for (int root = 0; root < (rooted(collective) ? n : 1); ++root) {
            expectProven(uniformArgs(collective, n, count, root, 1), algorithm, {});
            if (HasFatalFailure()) return;
          }
        }
        expectProven(uniformArgs(collective, n, 1000, n / 2, 3), algorithm, {});  // several channels
        if (HasFatalFailure()) return;
      }
    }
  }
}

// At cluster scale, symbolically: every algorithm at 1000 ranks (not a power of two) and, with LOOM_TEST_FULL=1, at
// 1024, with a count that gives every rank data of its own.
TEST(Verifier, EveryAlgorithmAtAThousandRanks) {
  for (Collective collective : kUniform) {
    for (const std::string& algorithm : algorithmsFor(collective)) {
      for (int n : {1000, 1024}) {
        if (n == 1024 && !loomtest::fullMatrix()) continue;  // a power of two as well, with LOOM_TEST_FULL=1
        size_t count = collective == Collective::kAllReduce ? static_cast<size_t>(n) + 3 : 2;
        expectProven(uniformArgs(collective, n, count, n / 3, 1), algorithm, {});
        if (HasFatalFailure()) return;
      }
    }
  }
}

// A tree over n ranks given by nodeOf(rank): it spans every rank once (parents and children agree, one root, no
// cycle) and its depth is about log2(n). Returns the root.
int expectTree(int n, const std::function<TreeNode(int)>& nodeOf, const std::string& what) {
  std::vector<TreeNode> nodes;
  for (int r = 0; r < n; ++r) nodes.push_back(nodeOf(r));
  int roots = 0, root = -1, maxDepth = 0;
  for (int r = 0; r < n; ++r) {
    const TreeNode& node = nodes[r];
    if (node.parent < 0) roots++, root = r;
    for (int i = 0; i < node.nChildren; ++i) {
      int child = node.children[i];
      EXPECT_TRUE(child >= 0 && child < n && child != r) << what << " rank " << r;
      if (child < 0 || child >= n) return -1;
      EXPECT_EQ(nodes[child].parent, r) << what << " child " << child;
    }
    if (node.parent >= 0) {
      const TreeNode& parent = nodes[node.parent];
      int found = 0;
      for (int i = 0; i < parent.nChildren; ++i) found += parent.children[i] == r;
      EXPECT_EQ(found, 1) << what << " rank " << r << " parent " << node.parent;
    }
    int depth = 0;
    for (int up = r; nodes[up].parent >= 0 && depth <= n; up = nodes[up].parent) ++depth;
    EXPECT_LE(depth, n) << what << ": a cycle through rank " << r;
    maxDepth = std::max(maxDepth, depth);
  }
  EXPECT_EQ(roots, 1) << what;
  int log2n = 0;
  while ((1 << log2n) < n) ++log2n;
  EXPECT_LE(maxDepth, log2n + 1) << what;
  return root;
}

// The double binary tree's shapes, to 1024 ranks: AllReduce's pair, where for even n no rank is an inner node
// of both trees, and Broadcast/Reduce's pair rooted at any rank, where only the root is inner in both.
TEST(Verifier, DoubleBinaryTreeShape) {
  for (int n = 1; n <= 1024; n += n < 80 ? 1 : 97) {
    for (int tree = 0; tree < 2; ++tree) {
      std::string what = "n " + std::to_string(n) + " tree " + std::to_string(tree);
      expectTree(n, [&](int r) { return doubleTreeNode(n, r, tree); }, what);
      for (int root : {0, n / 2, n - 1}) {
        int found = expectTree(n, [&](int r) { return rootedTreeNode(n, r, root, tree); },
                               what + " rooted at " + std::to_string(root));
        EXPECT_EQ(found, root) << what;
      }
    }
    if (HasFailure()) return;
    for (int r = 0; r < n; ++r) {
      if (n % 2 == 0) {
        EXPECT_TRUE(doubleTreeNode(n, r, 0).nChildren == 0 || doubleTreeNode(n, r, 1).nChildren == 0)
            << "n " << n << ": rank " << r << " is an inner node of both trees";
      }
      int root = n / 2;
      if (r != root) {
        EXPECT_TRUE(rootedTreeNode(n, r, root, 0).nChildren == 0 || rootedTreeNode(n, r, root, 1).nChildren == 0)
            << "n " << n << " rooted at " << root << ": rank " << r << " is an inner node of both trees";
      }
    }
  }
}

TEST(Verifier, InPlaceAndSlicedAsTheExecutorRuns) {
  for (Collective collective : kUniform) {
    for (const std::string& algorithm : algorithmsFor(collective)) {
      for (int n : {1, 2, 3, 4, 5, 8, 13}) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{100}}) {
          for (int channels : {1, 2}) {
            for (int root : {0, n - 1}) {
              CollArgs args = uniformArgs(collective, n, count, root, channels);
              VerifyOptions sliced{false, 3, 2};
              expectProven(args, algorithm, sliced);
              if (hasInPlace(collective)) {
                expectProven(args, algorithm, {true, 0, 0});
                expectProven(args, algorithm, {true, 3, 2});
              }
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// AllToAllv with random counts (some zero) and shuffled displacements, counts agreeing pairwise.
std::vector<CollArgs> randomAllToAllv(int n, std::mt19937& rng, std::vector<std::vector<size_t>>* storage) {
  std::vector<std::vector<size_t>> counts(n, std::vector<size_t>(n));
  for (auto& row : counts)
    for (size_t& c : row) c = rng() % 4 == 0 ? 0 : rng() % 50;
  storage->assign(4 * n, {});
  std::vector<CollArgs> all;
  for (int r = 0; r < n; ++r) {
    auto& sendCounts = (*storage)[4 * r];
    auto& sendDispls = (*storage)[4 * r + 1];
    auto& recvCounts = (*storage)[4 * r + 2];
    auto& recvDispls = (*storage)[4 * r + 3];
    std::vector<int> order(n);
    for (int p = 0; p < n; ++p) order[p] = p;
    std::shuffle(order.begin(), order.end(), rng);
    sendCounts.resize(n), sendDispls.resize(n), recvCounts.resize(n), recvDispls.resize(n);
    size_t sendAt = 0, recvAt = 0;
    for (int p : order) {
      sendCounts[p] = counts[r][p];
      sendDispls[p] = sendAt;
      sendAt += counts[r][p] + rng() % 3;  // gaps between blocks
      recvCounts[p] = counts[p][r];
      recvDispls[p] = recvAt;
      recvAt += counts[p][r] + rng() % 3;
    }
  }
  for (int r = 0; r < n; ++r) {
    CollArgs args;
    args.collective = Collective::kAllToAllv;
    args.nranks = n;
    args.rank = r;
    args.sendCounts = (*storage)[4 * r];
    args.sendDispls = (*storage)[4 * r + 1];
    args.recvCounts = (*storage)[4 * r + 2];
    args.recvDispls = (*storage)[4 * r + 3];
    all.push_back(args);
  }
  return all;
}

TEST(Verifier, AllToAllvRandomCounts) {
  std::mt19937 rng(7);
  for (int n = 1; n <= 64; ++n) {
    std::vector<std::vector<size_t>> storage;
    std::vector<CollArgs> all = randomAllToAllv(n, rng, &storage);
    for (VerifyOptions options : {VerifyOptions{}, VerifyOptions{false, 7, 2}})
      ASSERT_EQ(verifyPlan(all, "", options), "") << "AllToAllv ranks " << n;
  }
}

TEST(Verifier, SendRecvGroups) {
  std::mt19937 rng(11);
  for (int n = 1; n <= 16; ++n) {
    // Every rank sends to a few random peers (self included); receivers mirror the sends in order.
    std::vector<std::vector<P2POp>> ops(n);
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < 3; ++k) {
        int peer = static_cast<int>(rng() % n);
        size_t count = rng() % 3000;
        ops[r].push_back({true, peer, count});
        ops[peer].push_back({false, r, count});
      }
    }
    std::vector<CollArgs> all;
    for (int r = 0; r < n; ++r) {
      CollArgs args;
      args.collective = Collective::kSendRecv;
      args.nranks = n;
      args.rank = r;
      args.p2p = ops[r];
      all.push_back(args);
    }
    for (VerifyOptions options : {VerifyOptions{}, VerifyOptions{false, 500, 2}})
      ASSERT_EQ(verifyPlan(all, "", options), "") << "SendRecv ranks " << n;
  }
}

// Broken plans: each is a ring AllReduce (or a two-rank exchange) with one thing wrong.
std::string verifyBroken(int n, size_t count, const PlanBuilder& build, VerifyOptions options = {}) {
  return verifyPlan(argsForAllRanks(uniformArgs(Collective::kAllReduce, n, count, 0, 1)), build, options);
}

// The torus algorithms on explicit shapes: 2-D, 3-D, with dimensions of size 1, and a ring (1-D).
TEST(Verifier, TorusShapes) {
  const std::vector<std::vector<int>> shapes = {{2, 3}, {2, 2, 2}, {3, 1, 4}, {5}, {1, 1, 7}, {2, 2, 3, 2}};
  for (const std::vector<int>& shape : shapes) {
    int n = 1;
    for (int size : shape) n *= size;
    for (Collective collective : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather}) {
      for (size_t count : {size_t{1}, size_t{10}, size_t{1000}}) {
        for (int channels : {1, 2}) {
          CollArgs args = uniformArgs(collective, n, count, 0, channels);
          args.torusDimCount = static_cast<int>(shape.size());
          std::copy(shape.begin(), shape.end(), args.torusDims);
          expectProven(args, "torus", {});
          expectProven(args, "torus", {false, 7, 2});
          expectProven(args, "torus", {true, 7, 2});
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The hierarchical algorithms over several hosts: hosts of consecutive ranks, interleaved hosts, one rank per
// host, and hosts of unequal size (one ring instead).
TEST(Verifier, HierarchicalHostLayouts) {
  const std::vector<std::vector<int>> layouts = {{0, 0, 1, 1},          {0, 1, 0, 1},       {0, 0, 0, 1, 1, 1, 2, 2, 2},
                                                 {0, 1, 2, 3},          {0, 0, 1},          {1, 1, 0, 0, 2, 2},
                                                 {0, 0, 0, 0, 1, 1, 1, 1}};
  for (const std::vector<int>& hostOf : layouts) {
    int n = static_cast<int>(hostOf.size());
    for (Collective collective : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                                  Collective::kBroadcast, Collective::kAllToAll}) {
      for (size_t count : {size_t{1}, size_t{10}, size_t{1000}}) {
        for (int channels : {1, 2}) {
          for (int root = 0; root < (collective == Collective::kBroadcast ? n : 1); ++root) {
            CollArgs args = uniformArgs(collective, n, count, root, channels);
            args.hostOf = hostOf;
            expectProven(args, "hierarchical", {});
            expectProven(args, "hierarchical", {false, 7, 2});
            if (hasInPlace(collective)) expectProven(args, "hierarchical", {true, 7, 2});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// A large AllReduce over two or more levels runs as a pipeline of pieces (grid.cc): stages of different pieces
// share a phase. Proven whole, sliced as the executor runs it with tight FIFOs, and in place, for piece counts
// from 2 to the most (16), over hosts and tori; a single host keeps one piece.
TEST(Verifier, PipelinedGridAllReduce) {
  constexpr size_t kChunk = size_t{1} << 16;  // the smallest chunk a piece must keep (grid.cc)
  struct Shape {
    std::vector<int> hostOf, torus;
    int points;
  };
  const std::vector<Shape> shapes = {{{0, 0, 1, 1}, {}, 4}, {{0, 1, 0, 1}, {}, 4}, {{0, 0, 0, 1, 1, 1, 2, 2, 2}, {}, 9},
                                     {{}, {2, 2}, 4},       {{}, {2, 3, 2}, 12}};
  for (const Shape& shape : shapes) {
    for (size_t pieces : {size_t{2}, size_t{3}, size_t{16}, size_t{19}}) {
      for (int channels : {1, 2}) {
        size_t count = 2 * channels * pieces * shape.points * kChunk + 5;
        CollArgs args = uniformArgs(Collective::kAllReduce, static_cast<int>(shape.points), count, 0, channels);
        args.hostOf = shape.hostOf;
        args.torusDimCount = static_cast<int>(shape.torus.size());
        std::copy(shape.torus.begin(), shape.torus.end(), args.torusDims);
        const char* algorithm = shape.torus.empty() ? "hierarchical" : "torus";
        RankPlan plan;
        ASSERT_TRUE(buildPlan(args, algorithm, &plan));
        size_t stages = 2 * (shape.torus.empty() ? 2 : shape.torus.size());
        for (const Lane& lane : plan.lanes)
          EXPECT_EQ(lane.phaseCount(), std::min<size_t>(pieces, 16) + stages - 1) << algorithm << " count " << count;
        expectProven(args, algorithm, {});
        expectProven(args, algorithm, {false, kChunk / 3, 2});
        expectProven(args, algorithm, {true, kChunk / 3, 2});
        if (HasFatalFailure()) return;
      }
    }
  }
  // One host: one level, one piece.
  CollArgs args = uniformArgs(Collective::kAllReduce, 4, 64 * 4 * kChunk, 0, 1);
  args.hostOf = std::vector<int>{0, 0, 0, 0};
  RankPlan plan;
  ASSERT_TRUE(buildPlan(args, "hierarchical", &plan));
  for (const Lane& lane : plan.lanes) EXPECT_EQ(lane.phaseCount(), 2u);
}

// Every algorithm on the rank layouts of the topology presets: their hosts (hierarchical) and tori (torus).
TEST(Verifier, EveryAlgorithmOnThePresets) {
  for (const char* spec : {"dgx-h100", "pcie-8gpu", "torus2d:4x4", "torus3d:4x4x4", "fattree:2", "fullmesh:8"}) {
    Topology topology;
    std::string error;
    ASSERT_TRUE(makePreset(spec, &topology, &error)) << spec << ": " << error;
    int n = topology.rankCount();
    std::vector<int> hostOf;
    for (int r = 0; r < n; ++r) hostOf.push_back(topology.rankHost(r));
    std::vector<int> dims = topology.torusDims();
    if (std::string(spec).rfind("torus", 0) == 0) {
      EXPECT_FALSE(dims.empty()) << spec;
    }
    for (Collective collective : kUniform) {
      for (const std::string& algorithm : algorithmsFor(collective)) {
        CollArgs args = uniformArgs(collective, n, 100, n - 1, 1);
        args.hostOf = hostOf;
        args.torusDimCount = static_cast<int>(dims.size());
        std::copy(dims.begin(), dims.end(), args.torusDims);
        SCOPED_TRACE(spec);
        expectProven(args, algorithm, {false, 7, 2});
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Recursive halving reads, in each phase, what the phase before wrote at other offsets: sliced without its phase
// boundaries it reads partial sums too early, which the verifier must see; with them it is proven.
TEST(Verifier, CatchesMissingPhaseBoundary) {
  auto withoutPhases = [](const CollArgs& args) {
    RankPlan plan = buildRabenseifnerAllReduce(args);
    for (Lane& lane : plan.lanes) lane.phaseStarts.clear();
    return plan;
  };
  VerifyOptions sliced{false, 3, 0};
  EXPECT_NE(verifyBroken(4, 100, withoutPhases, sliced), "");
  EXPECT_EQ(verifyBroken(4, 100, buildRabenseifnerAllReduce, sliced), "");
  std::string bad = verifyBroken(2, 10, [](const CollArgs& args) {
    RankPlan plan = buildRabenseifnerAllReduce(args);
    plan.lanes[0].phaseStarts = {0};
    return plan;
  });
  EXPECT_NE(bad.find("phase starts"), std::string::npos) << bad;
}

TEST(Verifier, CatchesDoubleCounting) {
  std::string error = verifyBroken(3, 9, [](const CollArgs& args) {
    RankPlan plan = buildRingAllReduce(args);
    // Reduce the own input into the output once more at the end.
    plan.lanes[0].steps.push_back({Action::kReduce, -1, -1, input(0, 9), output(0, 9), output(0, 9)});
    return plan;
  });
  EXPECT_NE(error.find("twice"), std::string::npos) << error;
}

TEST(Verifier, CatchesSizeMismatch) {
  std::string error = verifyBroken(2, 10, [](const CollArgs& args) {
    RankPlan plan = planShell(args, "broken");
    int peer = 1 - args.rank;
    plan.lanes.push_back({0, {send(peer, input(0, args.rank == 0 ? 10 : 5)), recv(peer, output(0, 10))}});
    return plan;
  });
  EXPECT_NE(error.find("expects"), std::string::npos) << error;
}

TEST(Verifier, CatchesDeadlock) {
  std::string error = verifyBroken(2, 10, [](const CollArgs& args) {
    RankPlan plan = planShell(args, "broken");
    int peer = 1 - args.rank;
    plan.lanes.push_back({0, {recv(peer, output(0, 10)), send(peer, input(0, 10))}});  // both wait first
    return plan;
  });
  EXPECT_NE(error.find("can never run"), std::string::npos) << error;
}

TEST(Verifier, CatchesBoundedFifoDeadlock) {
  // Both ranks send three slices before receiving: fine with unbounded FIFOs, stuck when a FIFO holds two.
  auto build = [](const CollArgs& args) {
    RankPlan plan = planShell(args, "broken");
    int peer = 1 - args.rank;
    plan.lanes.push_back({0,
                          {send(peer, input(0, 3)), send(peer, input(3, 3)), send(peer, input(6, 3)),
                           recv(peer, output(0, 3)), recv(peer, output(3, 3)), recv(peer, output(6, 3))}});
    return plan;
  };
  EXPECT_EQ(verifyBroken(2, 9, build, {false, 0, 0}).find("can never run"), std::string::npos);
  EXPECT_NE(verifyBroken(2, 9, build, {false, 0, 2}).find("can never run"), std::string::npos);
}

TEST(Verifier, CatchesWriteToInput) {
  std::string error = verifyBroken(1, 4, [](const CollArgs& args) {
    RankPlan plan = planShell(args, "broken");
    plan.lanes.push_back({0, {copy(output(0, 4), input(0, 4))}});
    return plan;
  });
  EXPECT_NE(error.find("writes to the input"), std::string::npos) << error;
}

// A plan whose scratch holds wider partials (fp32 for fp16 and bf16) may not send them: messages carry the type.
TEST(Verifier, CatchesSendOfWiderPartials) {
  auto build = [](bool wide) {
    return [wide](const CollArgs& args) {
      RankPlan plan = planShell(args, "broken");
      int peer = 1 - args.rank;
      plan.scratchCount = 4;
      plan.wideScratch = wide;
      plan.lanes.push_back({0, {copy(input(0, 4), scratch(0, 4)), send(peer, scratch(0, 4)), recv(peer, output(0, 4)),
                                reduce(output(0, 4), input(0, 4), output(0, 4))}});
      return plan;
    };
  };
  EXPECT_EQ(verifyBroken(2, 4, build(false)), "");
  std::string error = verifyBroken(2, 4, build(true));
  EXPECT_NE(error.find("sends from scratch, which holds wider partials"), std::string::npos) << error;
}

TEST(Verifier, CatchesLostMessageAndWrongResult) {
  std::string lost = verifyBroken(2, 4, [](const CollArgs& args) {
    RankPlan plan = buildRingAllReduce(args);
    plan.lanes[0].steps.push_back(send(1 - args.rank, input(0, 4)));
    return plan;
  });
  EXPECT_NE(lost.find("never received"), std::string::npos) << lost;
  std::string wrong = verifyBroken(2, 4, [](const CollArgs& args) {
    RankPlan plan = planShell(args, "broken");
    plan.lanes.push_back({0, {copy(input(0, 4), output(0, 4))}});  // no communication at all
    return plan;
  });
  EXPECT_NE(wrong.find("expected op over ranks {0,1}"), std::string::npos) << wrong;
}

TEST(Verifier, CatchesInPlaceHazard) {
  // An AllGather that parks the peer's block in its own slot before moving it: correct out of place, but in
  // place its own slot is its input, which it overwrites before the last copy reads it.
  auto build = [](const CollArgs& args) {
    RankPlan plan = planShell(args, "broken");
    int peer = 1 - args.rank;
    size_t c = args.count, mine = args.rank * c, theirs = peer * c;
    plan.lanes.push_back({0,
                          {send(peer, input(0, c)), recv(peer, output(mine, c)),
                           copy(output(mine, c), output(theirs, c)), copy(input(0, c), output(mine, c))}});
    return plan;
  };
  auto args = argsForAllRanks(uniformArgs(Collective::kAllGather, 2, 5, 0, 1));
  EXPECT_EQ(verifyPlan(args, build, {false, 0, 0}), "");
  EXPECT_NE(verifyPlan(args, build, {true, 0, 0}), "");
}

const Collective kReducing[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kReduce};

// LOOM_DETERMINISTIC's promise, proven: every algorithm the registry marks as reducing in rank order combines every
// output element as ((x0 op x1) op x2) ... at 1..64 ranks, any count, channels and root, sliced with tight FIFOs,
// in place, and at 1000 ranks (1024 with LOOM_TEST_FULL=1).
TEST(Verifier, RankOrderAlgorithmsCombineInRankOrder) {
  VerifyOptions order;
  order.rankOrder = true;
  for (Collective collective : kReducing) {
    const std::vector<std::string> all = algorithmsFor(collective);
    const int marked = static_cast<int>(
        std::count_if(all.begin(), all.end(), [&](const std::string& a) { return reducesInRankOrder(collective, a); }));
    EXPECT_GE(marked, 1) << collectiveName(collective) << " has no algorithm for LOOM_DETERMINISTIC";
    for (const std::string& algorithm : all) {
      if (!reducesInRankOrder(collective, algorithm)) continue;
      for (int n = 1; n <= 64; ++n) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
          for (int channels : {1, 3}) {
            for (int root : {0, n / 2, n - 1}) {
              if (root != 0 && !rooted(collective)) break;
              expectProven(uniformArgs(collective, n, count, root, channels), algorithm, order);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
      for (int n : {2, 3, 5, 8, 13}) {
        for (int root : {0, n - 1}) {
          CollArgs args = uniformArgs(collective, n, 100, root, 2);
          VerifyOptions sliced = order, inPlace = order;
          sliced.sliceElems = 3, sliced.fifoDepth = 2;
          inPlace.inPlace = true, inPlace.sliceElems = 3, inPlace.fifoDepth = 2;
          expectProven(args, algorithm, sliced);
          expectProven(args, algorithm, inPlace);
          if (HasFatalFailure()) return;
        }
      }
      for (int n : {1000, 1024}) {
        if (n == 1024 && !loomtest::fullMatrix()) continue;
        expectProven(uniformArgs(collective, n, collective == Collective::kReduceScatter ? 2 : n + 3, n / 3, 1),
                     algorithm, order);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// ... and the check has teeth: every other reducing algorithm groups some element otherwise at 8 ranks, which is
// why LOOM_DETERMINISTIC leaves it out; the verifier names the grouping it found. At two ranks every algorithm
// combines x0 and x1 once, in rank order (so the switch leaves two ranks' rules alone).
TEST(Verifier, OtherReducingAlgorithmsAreNotInRankOrder) {
  VerifyOptions order;
  order.rankOrder = true;
  for (Collective collective : kReducing) {
    for (const std::string& algorithm : algorithmsFor(collective)) {
      for (int channels : {1, 3})
        expectProven(uniformArgs(collective, 2, 1000, 1, channels), algorithm, order);
      if (reducesInRankOrder(collective, algorithm)) continue;
      CollArgs args = uniformArgs(collective, 8, 1000, 3, 1);
      std::string error = verifyPlan(argsForAllRanks(args), algorithm, order);
      EXPECT_NE(error.find("not in rank order (((((((0+1)+2)+3)+4)+5)+6)+7)"), std::string::npos)
          << collectiveName(collective) << " " << algorithm << ": " << error;
      EXPECT_EQ(verifyPlan(argsForAllRanks(args), algorithm, {}), "") << collectiveName(collective) << " " << algorithm;
    }
  }
}

// LOOM_DETERMINISTIC's rules: the rank-order algorithms of each reducing collective, within LOOM_ALGO's, or an
// error naming the collective and what it could use.
TEST(AlgorithmRules, RestrictToRankOrder) {
  AlgorithmRules rules;
  std::string error;
  ASSERT_TRUE(parseAlgorithmRules("", &rules, &error));
  ASSERT_TRUE(restrictToRankOrder(&rules, 8, &error)) << error;
  EXPECT_EQ(rules.allowed[static_cast<int>(Collective::kAllReduce)], (std::vector<std::string>{"direct", "twoshot"}));
  EXPECT_EQ(rules.allowed[static_cast<int>(Collective::kReduceScatter)], (std::vector<std::string>{"direct"}));
  EXPECT_EQ(rules.allowed[static_cast<int>(Collective::kReduce)], (std::vector<std::string>{"direct"}));
  EXPECT_TRUE(rules.allowed[static_cast<int>(Collective::kAllGather)].empty());  // not a reduction: any
  EXPECT_EQ(rankOrderAlgorithms(Collective::kAllReduce), "direct,twoshot");

  ASSERT_TRUE(parseAlgorithmRules("allreduce:^direct", &rules, &error)) << error;
  ASSERT_TRUE(restrictToRankOrder(&rules, 8, &error)) << error;
  EXPECT_EQ(rules.allowed[static_cast<int>(Collective::kAllReduce)], (std::vector<std::string>{"twoshot"}));

  // At two ranks (and one) any algorithm will do: the rules stay, even one naming the ring alone.
  ASSERT_TRUE(parseAlgorithmRules("allreduce:ring", &rules, &error)) << error;
  for (int n : {1, 2}) {
    ASSERT_TRUE(restrictToRankOrder(&rules, n, &error)) << error;
    EXPECT_EQ(rules.allowed[static_cast<int>(Collective::kAllReduce)], (std::vector<std::string>{"ring"}));
  }

  for (const char* spec : {"allreduce:ring", "tree", "reducescatter:ring,bruck"}) {
    ASSERT_TRUE(parseAlgorithmRules(spec, &rules, &error)) << spec << ": " << error;
    AlgorithmRules before = rules;
    error.clear();
    EXPECT_FALSE(restrictToRankOrder(&rules, 8, &error)) << spec;
    EXPECT_NE(error.find("no algorithm that reduces in rank order"), std::string::npos) << spec << ": " << error;
    EXPECT_EQ(rules.allowed[static_cast<int>(Collective::kAllReduce)],
              before.allowed[static_cast<int>(Collective::kAllReduce)])
        << "a refused restriction changed the rules";
  }
}

// LOOM_ALGO's NCCL syntax: lists, exclusions, per-collective clauses, and clear errors for bad input.
TEST(AlgorithmRules, ParseAndChoose) {
  AlgorithmRules rules;
  std::string error;
  ASSERT_TRUE(parseAlgorithmRules("", &rules, &error));
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllReduce, "direct"), "direct");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllReduce, ""), "");

  ASSERT_TRUE(parseAlgorithmRules("Tree", &rules, &error)) << error;
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllReduce, "direct"), "tree");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kBroadcast, ""), "tree");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllGather, ""), "");  // no tree there: left alone

  ASSERT_TRUE(parseAlgorithmRules("allreduce:^tree;broadcast:ring", &rules, &error)) << error;
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllReduce, ""), "ring");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllReduce, "direct"), "direct");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kBroadcast, "direct"), "ring");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kReduce, ""), "");

  // A clause for one collective wins over the list for all.
  ASSERT_TRUE(parseAlgorithmRules("ring, tree ; allreduce : direct", &rules, &error)) << error;
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kAllReduce, ""), "direct");
  EXPECT_EQ(chooseAlgorithm(rules, Collective::kBroadcast, "direct"), "ring");

  std::string excludeAll = "allreduce:^";
  for (const std::string& name : algorithmsFor(Collective::kAllReduce)) excludeAll += name + ",";
  excludeAll.pop_back();
  for (const std::string& bad : {std::string("rung"), std::string("allreduse:ring"), std::string("allgather:tree"),
                                 excludeAll}) {
    error.clear();
    EXPECT_FALSE(parseAlgorithmRules(bad, &rules, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  EXPECT_FALSE(parseAlgorithmRules("rung", &rules, &error));
  EXPECT_NE(error.find("unknown algorithm \"rung\""), std::string::npos) << error;
}

}  // namespace
}  // namespace loom
