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

namespace {

// The lanes of one rank for one tree over `part` (a region of the input and the same region of the output).
void treeAllReduceLanes(const TreeNode& node, int channel, size_t offset, size_t count, RankPlan* plan) {
  Region in = input(offset, count), out = output(offset, count);
  Lane up{channel, {}};
  if (node.parent < 0) {
    // The root: combine every child's subtree into the output, then send the result down.
    Region sum = in;
    for (int i = 0; i < node.nChildren; ++i) {
      up.steps.push_back(recvReduce(node.children[i], sum, out));
      sum = out;
    }
    if (node.nChildren == 0) up.steps.push_back(copy(in, out));
    for (int i = 0; i < node.nChildren; ++i) up.steps.push_back(send(node.children[i], out));
    plan->lanes.push_back(std::move(up));
    return;
  }
  // Up: the last combination goes straight to the parent.
  Region sum = in;
  for (int i = 0; i + 1 < node.nChildren; ++i) {
    up.steps.push_back(recvReduce(node.children[i], sum, out));
    sum = out;
  }
  if (node.nChildren == 0) {
    up.steps.push_back(send(node.parent, in));
  } else {
    up.steps.push_back(recvReduceSend(node.children[node.nChildren - 1], sum, node.parent));
  }
  plan->lanes.push_back(std::move(up));
  // Down: keep the result and pass it on.
  Lane down{channel, {}};
  if (node.nChildren == 0) {
    down.steps.push_back(recv(node.parent, out));
  } else {
    down.steps.push_back(recvCopySend(node.parent, out, node.children[0]));
    for (int i = 1; i < node.nChildren; ++i) down.steps.push_back(send(node.children[i], out));
  }
  plan->lanes.push_back(std::move(down));
}

}  // namespace

RankPlan buildTreeAllReduce(const CollArgs& args) {
  RankPlan plan = planShell(args, "tree");
  int n = args.nranks;
  for (int c = 0; c < args.nChannels; ++c) {
    size_t offset = partOffset(args.count, args.nChannels, c), part = partCount(args.count, args.nChannels, c);
    for (int tree = 0; tree < 2; ++tree) {
      size_t half = partCount(part, 2, tree);
      if (half == 0) continue;
      treeAllReduceLanes(doubleTreeNode(n, args.rank, tree), c + tree * args.nChannels,
                         offset + partOffset(part, 2, tree), half, &plan);
    }
  }
  plan.reducedOutput = output(0, args.count);
  return plan;
}

}  // namespace loom
