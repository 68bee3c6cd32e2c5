// The algorithm registry: which builders can run which collective, and the default for each. The tuner (a later
// layer) will choose among them by cost; until then the first listed is the default and LOOM_ALGO overrides.
#include <algorithm>

#include "algorithms/builders.h"

namespace loom {
namespace {

struct Entry {
  Collective collective;
  const char* name;
  RankPlan (*build)(const CollArgs&);
};

constexpr Entry kAlgorithms[] = {
    {Collective::kAllReduce, "ring", buildRingAllReduce},
    {Collective::kAllReduce, "direct", buildDirectAllReduce},
    {Collective::kAllReduce, "tree", buildTreeAllReduce},
    {Collective::kReduceScatter, "ring", buildRingReduceScatter},
    {Collective::kAllGather, "ring", buildRingAllGather},
    {Collective::kBroadcast, "ring", buildRingBroadcast},
    {Collective::kBroadcast, "direct", buildDirectBroadcast},
    {Collective::kBroadcast, "tree", buildTreeBroadcast},
    {Collective::kReduce, "ring", buildRingReduce},
    {Collective::kReduce, "tree", buildTreeReduce},
    {Collective::kGather, "direct", buildDirectGather},
    {Collective::kScatter, "direct", buildDirectScatter},
    {Collective::kAllToAll, "pairwise", buildPairwiseAllToAll},
    {Collective::kAllToAllv, "pairwise", buildPairwiseAllToAllv},
    {Collective::kSendRecv, "p2p", buildSendRecv},
    {Collective::kBarrier, "dissemination", buildDisseminationBarrier},
};

}  // namespace

RankPlan planShell(const CollArgs& args, const char* algorithm) {
  RankPlan plan;
  plan.algorithm = algorithm;
  plan.inputCount = inputCountOf(args);
  plan.outputCount = outputCountOf(args);
  return plan;
}

std::vector<std::string> algorithmsFor(Collective collective) {
  std::vector<std::string> names;
  for (const Entry& entry : kAlgorithms)
    if (entry.collective == collective) names.push_back(entry.name);
  return names;
}

bool buildPlan(const CollArgs& args, const std::string& algorithm, RankPlan* plan) {
  for (const Entry& entry : kAlgorithms) {
    if (entry.collective != args.collective) continue;
    if (!algorithm.empty() && algorithm != entry.name) continue;
    *plan = entry.build(args);
    return true;
  }
  return false;
}

}  // namespace loom
