// The plan builders, one per algorithm, and the registry that picks one for a call. Builders are pure: same
// CollArgs, same plan. Only registry.cc knows which builders exist for which collective.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "algorithms/plan.h"

namespace loom {

// A RankPlan with the buffer sizes of the call filled in and no lanes.
RankPlan planShell(const CollArgs& args, const char* algorithm);

// Channel `channel`'s part of block q of a buffer made of blocks of `count` elements (the per-rank blocks of
// AllGather's output and ReduceScatter's input).
Region blockPart(Buffer buffer, size_t count, int nChannels, int channel, int q);

RankPlan buildRingAllReduce(const CollArgs& args);
RankPlan buildRingReduceScatter(const CollArgs& args);
RankPlan buildRingAllGather(const CollArgs& args);
RankPlan buildRingBroadcast(const CollArgs& args);
RankPlan buildRingReduce(const CollArgs& args);
RankPlan buildDirectGather(const CollArgs& args);
RankPlan buildDirectScatter(const CollArgs& args);
RankPlan buildDirectBroadcast(const CollArgs& args);
RankPlan buildDirectAllReduce(const CollArgs& args);
RankPlan buildTwoShotAllReduce(const CollArgs& args);
RankPlan buildDirectReduceScatter(const CollArgs& args);
RankPlan buildDirectReduce(const CollArgs& args);
RankPlan buildTreeAllReduce(const CollArgs& args);
RankPlan buildTreeBroadcast(const CollArgs& args);
RankPlan buildTreeReduce(const CollArgs& args);
RankPlan buildRabenseifnerAllReduce(const CollArgs& args);
RankPlan buildBruckAllGather(const CollArgs& args);
RankPlan buildBruckReduceScatter(const CollArgs& args);
RankPlan buildTorusAllReduce(const CollArgs& args);
RankPlan buildTorusReduceScatter(const CollArgs& args);
RankPlan buildTorusAllGather(const CollArgs& args);
RankPlan buildHierarchicalAllReduce(const CollArgs& args);
RankPlan buildHierarchicalReduceScatter(const CollArgs& args);
RankPlan buildHierarchicalAllGather(const CollArgs& args);
RankPlan buildHierarchicalBroadcast(const CollArgs& args);
RankPlan buildHierarchicalAllToAll(const CollArgs& args);
RankPlan buildPairwiseAllToAll(const CollArgs& args);
RankPlan buildPairwiseAllToAllv(const CollArgs& args);
RankPlan buildSendRecv(const CollArgs& args);
RankPlan buildDisseminationBarrier(const CollArgs& args);

// A rank's place in a tree: its parent (-1 at the root) and up to two children.
struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};
  int nChildren = 0;
};
// Tree 0 of the double binary tree over n ranks (rooted at rank 0; odd ranks are leaves), and tree `tree` (0 or
// 1) of the pair (tree.cc has the construction).
TreeNode binaryTreeNode(int n, int rank);
TreeNode doubleTreeNode(int n, int rank, int tree);
// Tree `tree` (0 or 1) of the pair rooted at `root` that Broadcast and Reduce use.
TreeNode rootedTreeNode(int n, int rank, int root, int tree);

// The algorithms that can run `collective` (first is the default), e.g. {"ring", "direct"} for Broadcast.
std::vector<std::string> algorithmsFor(Collective collective);
// LOOM_ALGO in NCCL's syntax: a comma-separated list of algorithms to allow ("ring,tree"), or to exclude when it
// starts with '^' ("^tree"); optionally per collective, clauses separated by ';' ("allreduce:^tree;broadcast:ring").
// A clause without a collective applies to every collective without a clause of its own, and only where it
// leaves that collective an algorithm (so "direct" forces Broadcast's and AllReduce's and leaves the others
// alone). Names are not case sensitive.
struct AlgorithmRules {
  std::vector<std::string> allowed[static_cast<int>(Collective::kBarrier) + 1];  // registry order; empty: no rule
};
// Parses `spec` ("" = no rules). On a name no collective has, an unknown collective, or a clause that leaves its
// collective no algorithm, returns false with *error saying which.
bool parseAlgorithmRules(const std::string& spec, AlgorithmRules* rules, std::string* error);
// The algorithm for a call: `preferred` ("" = the registry's first) when the rules allow it, else the first they
// allow.
std::string_view chooseAlgorithm(const AlgorithmRules& rules, Collective collective, std::string_view preferred);

// Whether AllReduce, ReduceScatter or Reduce (the collectives that reduce elements) is `collective`.
bool reducesElements(Collective collective);
// Whether `algorithm` combines every element it reduces in rank order, ((x0 op x1) op x2) ... op x(n-1), whatever
// the call's count, channels and slicing, so that its bits depend on the inputs alone (LOOM_DETERMINISTIC).
bool reducesInRankOrder(Collective collective, std::string_view algorithm);
// Those algorithms of `collective`, comma-separated ("direct,twoshot").
std::string rankOrderAlgorithms(Collective collective);
// Keeps, for each collective that reduces elements, only the algorithms `rules` allow that reduce in rank order
// (LOOM_DETERMINISTIC), on `nranks` ranks: at one or two ranks every algorithm does (x0 op x1 is x1 op x0), and
// `rules` stay as they are. False with *error, `rules` unchanged, when LOOM_ALGO's rules leave one of them none.
bool restrictToRankOrder(AlgorithmRules* rules, int nranks, std::string* error);

// LOOM_TORUS_DIMS: sizes separated by 'x' ("4x4x2"), at most kMaxTorusDims, multiplying to nranks. On bad
// text returns false with *error saying what is wrong.
bool parseTorusDims(const std::string& text, int nranks, int dims[kMaxTorusDims], int* count, std::string* error);

// Builds the plan of args.rank with `algorithm` ("" = the default). Returns false when the algorithm does not
// exist for that collective.
bool buildPlan(const CollArgs& args, const std::string& algorithm, RankPlan* plan);

}  // namespace loom
