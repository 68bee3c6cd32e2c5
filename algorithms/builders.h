// The plan builders, one per algorithm, and the registry that picks one for a call. Builders are pure: same
// CollArgs, same plan. Only registry.cc knows which builders exist for which collective.
#pragma once

#include <string>

#include "algorithms/plan.h"

namespace loom {

// A RankPlan with the buffer sizes of the call filled in and no lanes.
RankPlan planShell(const CollArgs& args, const char* algorithm);

RankPlan buildRingAllReduce(const CollArgs& args);
RankPlan buildRingReduceScatter(const CollArgs& args);
RankPlan buildRingAllGather(const CollArgs& args);
RankPlan buildRingBroadcast(const CollArgs& args);
RankPlan buildRingReduce(const CollArgs& args);
RankPlan buildDirectGather(const CollArgs& args);
RankPlan buildDirectScatter(const CollArgs& args);
RankPlan buildDirectBroadcast(const CollArgs& args);
RankPlan buildDirectAllReduce(const CollArgs& args);
RankPlan buildTreeAllReduce(const CollArgs& args);
RankPlan buildTreeBroadcast(const CollArgs& args);
RankPlan buildTreeReduce(const CollArgs& args);
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
// Builds the plan of args.rank with `algorithm` ("" = the default). Returns false when the algorithm does not
// exist for that collective.
bool buildPlan(const CollArgs& args, const std::string& algorithm, RankPlan* plan);

}  // namespace loom
