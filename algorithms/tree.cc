// Double binary tree AllReduce: half of every channel's part is reduced up one binary tree and broadcast back
// down it; the other half uses a second tree in which the first tree's leaves are the inner nodes. Each rank then
// sends and receives about the whole buffer once, as in the ring, but a slice crosses 2 log2(n) hops instead of
// 2(n-1), which is what makes the tree the better choice for mid-sized messages at many ranks.
//
// Tree 0 is an in-order binary tree over ranks. A rank's height is its lowest set bit b: its children are
// rank - b/2 and rank + b/2 (or, past the last rank, the largest rank + b/4, rank + b/8, ... that exists), and its
// parent is the rank whose lowest bit is 2b among (rank ^ b) | 2b and rank ^ b. Rank 0 is the root and has one
// child: the largest power of two below n. Odd ranks are leaves.
// Tree 1 mirrors tree 0 (rank r plays n-1-r) when n is even, and shifts it by one (r plays r-1) when n is odd:
// for even n, the leaves of one tree are the inner nodes of the other.
//
// Each tree has its own channel (c and c + nChannels), so no FIFO carries both trees' messages. On a rank, one
// lane runs the reduction up the tree (receive from the children, combine with the input, send to the parent)
// and a second lane the broadcast down (receive from the parent, keep it, pass it to the children); the root does
// both in one lane. The partial sum of an inner node lives in the output: its final value arrives from the parent
// only after the partial has been sent up, so the two lanes never touch the same slice at the same time. All
// ranks take the root's result, so all hold the same bits.
//
// Broadcast and Reduce use the pair of trees rooted at the call's root (ranks renumbered so the root is 0):
// tree 0 as above, and tree 1 in which the root feeds rank 1, the root of a binary tree over ranks 1..n-1 whose
// inner nodes are tree 0's leaves. Each rank then forwards (Broadcast) or combines (Reduce) about one copy of
// the data, and the root sends or receives half of it per tree. Broadcast is the down half of the AllReduce,
// Reduce the up half, its partial sums in scratch (only the root has an output).
#include "algorithms/builders.h"

namespace loom {

TreeNode binaryTreeNode(int n, int rank) {
  TreeNode node;
  if (rank == 0) {
    int top = 1;
    while (top * 2 < n) top *= 2;
    if (n > 1) node.children[node.nChildren++] = top;
    return node;
  }
  int bit = rank & -rank;
  node.parent = (rank ^ bit) | (bit << 1);
  if (node.parent >= n) node.parent = rank ^ bit;
  if (bit > 1) {
    node.children[node.nChildren++] = rank - bit / 2;
    int low = bit / 2;
    while (low > 0 && rank + low >= n) low /= 2;
    if (low > 0) node.children[node.nChildren++] = rank + low;
  }
  return node;
}

TreeNode doubleTreeNode(int n, int rank, int tree) {
  if (tree == 0) return binaryTreeNode(n, rank);
  // Mirror for even n, shift by one for odd n: map rank into tree 0's numbering, and the neighbours back.
  bool mirror = n % 2 == 0;
  auto into = [&](int r) { return mirror ? n - 1 - r : (r - 1 + n) % n; };
  auto back = [&](int r) { return r < 0 ? -1 : mirror ? n - 1 - r : (r + 1) % n; };
  TreeNode node = binaryTreeNode(n, into(rank));
  node.parent = back(node.parent);
  for (int i = 0; i < node.nChildren; ++i) node.children[i] = back(node.children[i]);
  return node;
}

TreeNode rootedTreeNode(int n, int rank, int root, int tree) {
  int v = (rank - root + n) % n;  // 0 at the root
  auto real = [&](int u) { return u < 0 ? -1 : (u + root) % n; };
  TreeNode node;
  if (tree == 0) {
    node = binaryTreeNode(n, v);
  } else if (v == 0) {
    if (n > 1) node.children[node.nChildren++] = 1;
  } else {
    // A binary tree over virtual ranks 1..n-1 (numbered from 0), hung below the root.
    node = binaryTreeNode(n - 1, v - 1);
    node.parent = node.parent < 0 ? 0 : node.parent + 1;
    for (int i = 0; i < node.nChildren; ++i) node.children[i] += 1;
  }
  node.parent = real(node.parent);
  for (int i = 0; i < node.nChildren; ++i) node.children[i] = real(node.children[i]);
  return node;
}

namespace {

// Reduction up the tree: combine the children's messages with `in` (partial results in `partial`) and send the
// result to the parent; at the root, write it to `out`.
Lane upLane(const TreeNode& node, int channel, Region in, Region partial, Region out) {
  Lane up{channel, {}};
  bool root = node.parent < 0;
  int combined = root ? node.nChildren : node.nChildren - 1;  // a non-root's last child goes on to the parent
  Region sum = in;
  for (int i = 0; i < combined; ++i) {
    Region to = root ? out : partial;
    up.steps.push_back(recvReduce(node.children[i], sum, to));
    sum = to;
  }
  if (root && node.nChildren == 0) up.steps.push_back(copy(in, out));
  if (!root && node.nChildren == 0) up.steps.push_back(send(node.parent, in));
  if (!root && node.nChildren > 0)
    up.steps.push_back(recvReduceSend(node.children[node.nChildren - 1], sum, node.parent));
  return up;
}

// Broadcast down the tree: receive `out` from the parent, keep it and pass it to the children. The root sends
// `from` (the data it holds) to its children.
void downSteps(const TreeNode& node, Region from, Region out, Lane* lane) {
  if (node.parent < 0) {
    for (int i = 0; i < node.nChildren; ++i) lane->steps.push_back(send(node.children[i], from));
    return;
  }
  if (node.nChildren == 0) {
    lane->steps.push_back(recv(node.parent, out));
    return;
  }
  lane->steps.push_back(recvCopySend(node.parent, out, node.children[0]));
  for (int i = 1; i < node.nChildren; ++i) lane->steps.push_back(send(node.children[i], out));
}

// Calls lanes(node, channel, offset, count) for each channel and tree, with the part of the data it carries:
// half of each channel's part per tree, the second tree on the second channel set.
template <typename TreeOf, typename Lanes>
void forEachTreePart(const CollArgs& args, TreeOf treeOf, Lanes lanes) {
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), part = partCount(args.count, args.nChannels, c);
    for (int tree = 0; tree < 2; ++tree) {
      size_t half = partCount(part, 2, tree);
      if (half > 0) lanes(treeOf(tree), c + tree * args.nChannels, offset + partOffset(part, 2, tree), half);
    }
  }
}

}  // namespace

RankPlan buildTreeAllReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "tree");
  auto treeOf = [&](int tree) { return doubleTreeNode(args.nranks, args.rank, tree); };
  forEachTreePart(args, treeOf, [&](const TreeNode& node, int channel, size_t offset, size_t count) {
    Region in = input(offset, count), out = output(offset, count);
    // An inner node's partial sum lives in the output (see above); the root goes on down in the same lane.
    Lane up = upLane(node, channel, in, out, out);
    if (node.parent < 0) {
      downSteps(node, out, out, &up);
      plan.lanes.push_back(std::move(up));
      return;
    }
    plan.lanes.push_back(std::move(up));
    Lane down{channel, {}};
    downSteps(node, out, out, &down);
    plan.lanes.push_back(std::move(down));
  });
  plan.reducedOutput = output(0, args.count);
  return plan;
}

RankPlan buildTreeBroadcast(const CollArgs& args) {
  RankPlan plan = planShell(args, "tree");
  auto treeOf = [&](int tree) { return rootedTreeNode(args.nranks, args.rank, args.root, tree); };
  forEachTreePart(args, treeOf, [&](const TreeNode& node, int channel, size_t offset, size_t count) {
    Lane down{channel, {}};
    downSteps(node, input(offset, count), output(offset, count), &down);
    if (node.parent < 0) down.steps.push_back(copy(input(offset, count), output(offset, count)));
    plan.lanes.push_back(std::move(down));
  });
  return plan;
}

RankPlan buildTreeReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "tree");
  auto treeOf = [&](int tree) { return rootedTreeNode(args.nranks, args.rank, args.root, tree); };
  forEachTreePart(args, treeOf, [&](const TreeNode& node, int channel, size_t offset, size_t count) {
    plan.lanes.push_back(upLane(node, channel, input(offset, count), scratch(offset, count), output(offset, count)));
  });
  plan.scratchCount = args.rank == args.root ? 0 : args.count;
  if (args.rank == args.root) plan.reducedOutput = output(0, args.count);
  return plan;
}

}  // namespace loom
