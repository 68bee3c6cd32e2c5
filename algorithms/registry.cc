// The algorithm registry: which builders can run which collective, and the default for each. The tuner (a later
// layer) will choose among them by cost; until then the first listed is the default and LOOM_ALGO overrides.
#include <algorithm>
#include <cctype>

#include "algorithms/builders.h"

namespace loom {
namespace {

struct Entry {
  Collective collective;
  const char* name;
  RankPlan (*build)(const CollArgs&);
  // Every element it reduces is combined in rank order, whatever the count, channels and slicing (proven by the
  // verifier's rankOrder in tests/unit/verifier_test.cc, which also shows every other reducing algorithm is not).
  bool rankOrder = false;
};

constexpr Entry kAlgorithms[] = {
    {Collective::kAllReduce, "ring", buildRingAllReduce},
    {Collective::kAllReduce, "direct", buildDirectAllReduce, true},
    {Collective::kAllReduce, "twoshot", buildTwoShotAllReduce, true},
    {Collective::kAllReduce, "tree", buildTreeAllReduce},
    {Collective::kAllReduce, "rabenseifner", buildRabenseifnerAllReduce},
    {Collective::kAllReduce, "torus", buildTorusAllReduce},
    {Collective::kAllReduce, "hierarchical", buildHierarchicalAllReduce},
    {Collective::kReduceScatter, "ring", buildRingReduceScatter},
    {Collective::kReduceScatter, "bruck", buildBruckReduceScatter},
    {Collective::kReduceScatter, "torus", buildTorusReduceScatter},
    {Collective::kReduceScatter, "hierarchical", buildHierarchicalReduceScatter},
    {Collective::kReduceScatter, "direct", buildDirectReduceScatter, true},
    {Collective::kAllGather, "ring", buildRingAllGather},
    {Collective::kAllGather, "bruck", buildBruckAllGather},
    {Collective::kAllGather, "torus", buildTorusAllGather},
    {Collective::kAllGather, "hierarchical", buildHierarchicalAllGather},
    {Collective::kBroadcast, "ring", buildRingBroadcast},
    {Collective::kBroadcast, "direct", buildDirectBroadcast},
    {Collective::kBroadcast, "tree", buildTreeBroadcast},
    {Collective::kBroadcast, "hierarchical", buildHierarchicalBroadcast},
    {Collective::kReduce, "ring", buildRingReduce},
    {Collective::kReduce, "tree", buildTreeReduce},
    {Collective::kReduce, "direct", buildDirectReduce, true},
    {Collective::kGather, "direct", buildDirectGather},
    {Collective::kScatter, "direct", buildDirectScatter},
    {Collective::kAllToAll, "pairwise", buildPairwiseAllToAll},
    {Collective::kAllToAll, "hierarchical", buildHierarchicalAllToAll},
    {Collective::kAllToAllv, "pairwise", buildPairwiseAllToAllv},
    {Collective::kSendRecv, "p2p", buildSendRecv},
    {Collective::kBarrier, "dissemination", buildDisseminationBarrier},
};

}  // namespace

Region blockPart(Buffer buffer, size_t count, int nChannels, int channel, int q) {
  return {buffer, static_cast<size_t>(q) * count + partOffset(count, nChannels, channel),
          partCount(count, nChannels, channel)};
}

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

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view text) {
  size_t begin = text.find_first_not_of(" \t"), end = text.find_last_not_of(" \t");
  return begin == std::string_view::npos ? "" : std::string(text.substr(begin, end - begin + 1));
}

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t end = text.find(separator, start);
    parts.push_back(trim(text.substr(start, end == std::string_view::npos ? end : end - start)));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

constexpr int kCollectives = static_cast<int>(Collective::kBarrier) + 1;

// The registry's algorithms for `collective` that a list allows: the listed ones, or all but them with '^'.
std::vector<std::string> filtered(Collective collective, const std::vector<std::string>& names, bool exclude) {
  std::vector<std::string> kept;
  for (const std::string& algorithm : algorithmsFor(collective)) {
    bool listed = std::find(names.begin(), names.end(), algorithm) != names.end();
    if (listed != exclude) kept.push_back(algorithm);
  }
  return kept;
}

}  // namespace

bool parseAlgorithmRules(const std::string& spec, AlgorithmRules* rules, std::string* error) {
  AlgorithmRules parsed;
  bool hasClause[kCollectives] = {};
  std::vector<std::string> global;
  bool globalExclude = false, hasGlobal = false;
  for (const std::string& clause : split(spec, ';')) {
    if (clause.empty()) continue;
    size_t colon = clause.find(':');
    int target = -1;  // -1: every collective
    std::string list = clause;
    if (colon != std::string::npos) {
      std::string name = lower(trim(std::string_view(clause).substr(0, colon)));
      Collective named;
      if (parseCollectiveName(name, &named)) target = static_cast<int>(named);
      if (target < 0) {
        *error = "unknown collective \"" + name + "\" in \"" + clause + "\"";
        return false;
      }
      list = trim(std::string_view(clause).substr(colon + 1));
    }
    bool exclude = !list.empty() && list[0] == '^';
    std::vector<std::string> names;
    for (const std::string& name : split(exclude ? std::string_view(list).substr(1) : std::string_view(list), ','))
      if (!name.empty()) names.push_back(lower(name));
    for (const std::string& name : names) {
      bool known = false;
      for (const Entry& entry : kAlgorithms) known |= name == entry.name;
      if (!known) {
        *error = "unknown algorithm \"" + name + "\" in \"" + clause + "\"";
        return false;
      }
    }
    if (target < 0) {
      global = names, globalExclude = exclude, hasGlobal = true;
      continue;
    }
    Collective collective = static_cast<Collective>(target);
    parsed.allowed[target] = filtered(collective, names, exclude);
    hasClause[target] = true;
    if (parsed.allowed[target].empty()) {
      *error = std::string("\"") + clause + "\" leaves " + collectiveName(collective) + " no algorithm";
      return false;
    }
  }
  for (int c = 0; c < kCollectives && hasGlobal; ++c)
    if (!hasClause[c]) parsed.allowed[c] = filtered(static_cast<Collective>(c), global, globalExclude);
  *rules = std::move(parsed);
  return true;
}

bool reducesInRankOrder(Collective collective, std::string_view algorithm) {
  for (const Entry& entry : kAlgorithms)
    if (entry.collective == collective && algorithm == entry.name) return entry.rankOrder;
  return false;
}

bool reducesElements(Collective collective) {
  return collective == Collective::kAllReduce || collective == Collective::kReduceScatter ||
         collective == Collective::kReduce;
}

bool restrictToRankOrder(AlgorithmRules* rules, int nranks, std::string* error) {
  if (nranks <= 2) return true;  // one combination at most: the same bits in either order
  AlgorithmRules restricted = *rules;
  for (int c = 0; c < kCollectives; ++c) {
    const Collective collective = static_cast<Collective>(c);
    if (!reducesElements(collective)) continue;
    std::vector<std::string>& allowed = restricted.allowed[c];
    const bool ruled = !allowed.empty();
    std::vector<std::string> kept;
    for (const std::string& algorithm : ruled ? allowed : algorithmsFor(collective))
      if (reducesInRankOrder(collective, algorithm)) kept.push_back(algorithm);
    if (kept.empty()) {
      *error = std::string("LOOM_ALGO leaves ") + collectiveName(collective) +
               " no algorithm that reduces in rank order (under LOOM_DETERMINISTIC it may use: " +
               rankOrderAlgorithms(collective) + ")";
      return false;
    }
    allowed = std::move(kept);
  }
  *rules = std::move(restricted);
  return true;
}

std::string rankOrderAlgorithms(Collective collective) {
  std::string names;
  for (const Entry& entry : kAlgorithms)
    if (entry.collective == collective && entry.rankOrder) names += (names.empty() ? "" : ",") + std::string(entry.name);
  return names;
}

std::string_view chooseAlgorithm(const AlgorithmRules& rules, Collective collective, std::string_view preferred) {
  const std::vector<std::string>& allowed = rules.allowed[static_cast<int>(collective)];
  if (allowed.empty()) return preferred;
  if (preferred.empty()) return allowed.front();  // the registry's first that the rules allow
  for (const std::string& algorithm : allowed)
    if (algorithm == preferred) return algorithm;
  return allowed.front();
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
