// The plan verifier: builds every rank's plan for a call and executes them together symbolically, proving that
// each output element ends up holding exactly the contributions the collective's definition requires: for
// AllReduce, element i of every rank = op over all ranks of their element i, each rank counted once.
//
// No data moves. Memory is a list of segments; a segment says "position begin+k holds op over ranks S of input
// element base+k of those ranks" (with VerifyOptions::rankOrder, also in which grouping). Messages carry segments
// through per-connection FIFOs, so the verifier also proves that sends and receives match one to one with equal
// sizes and that the plan cannot deadlock (with the FIFO depth given, or unbounded). It can replay the executor's
// order exactly (slices in rounds) and the in-place layouts of the public API, where input and output share
// memory.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "algorithms/plan.h"

namespace loom {

struct VerifyOptions {
  bool inPlace = false;   // alias input and output as the public API's in-place layout does
  size_t sliceElems = 0;  // 0: whole steps; otherwise run lanes in rounds of slices, as the executor does
  int fifoDepth = 0;      // 0: unbounded; otherwise a send waits while its connection holds this many messages
  // Also prove that every reduced output element (AllReduce, ReduceScatter, Reduce) is combined in rank order,
  // ((x0 op x1) op x2) ... op x(n-1): the one grouping LOOM_DETERMINISTIC promises (docs/RELIABILITY.md). The
  // verifier then tracks each element's reduction as a tree; two operands combine alike in either order, since
  // IEEE addition and multiplication are commutative (only their grouping changes the bits).
  bool rankOrder = false;
};

// The CollArgs of every rank for a call whose arguments are the same on all ranks (all but AllToAllv, SendRecv).
std::vector<CollArgs> argsForAllRanks(const CollArgs& args);

// Builds and checks the plan of `algorithm` ("" = default) for the call described by `perRank` (one entry per
// rank). Returns "" when the plan is proven correct, else what is wrong, naming rank, lane and step.
std::string verifyPlan(const std::vector<CollArgs>& perRank, const std::string& algorithm,
                       const VerifyOptions& options);
// The same for plans from any builder (tests use it to show that broken plans are caught).
using PlanBuilder = std::function<RankPlan(const CollArgs&)>;
std::string verifyPlan(const std::vector<CollArgs>& perRank, const PlanBuilder& build, const VerifyOptions& options);

}  // namespace loom
