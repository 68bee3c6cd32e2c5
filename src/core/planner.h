// The planner: the one place a call becomes a plan. It holds the tuner (algorithm, channels and slicing per size
// class, within LOOM_ALGO's rules) and the plans built so far, by call shape, with the last one found kept in
// front so that a loop of identical calls skips the search.
//
// Host calls use the communicator's planner (loomComm::planner, under its run lock). The GPU executor holds a copy
// made when it starts, so that a launch never waits for the staged path's worker, which holds that lock. The two
// differ only in what they keep beside each cached plan (`Extra`): the host whether the plan's connections exist,
// the GPU executor the plan's flat copy in device memory.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "algorithms/plan.h"
#include "loom/loom.h"
#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/core/enqueue.h"
#include "src/tuner/tuner.h"

namespace loom {

// The key of a cached plan: collective, count, root, channels, algorithm.
using PlanKey = std::tuple<int, size_t, int, int, std::string>;
// Looks a plan up without building a string: PlanKey's algorithm as a view.
using PlanKeyView = std::tuple<int, size_t, int, int, std::string_view>;

// Whether a call's plan depends on its shape alone (collective, count, root): AllToAllv's depends on its counts,
// Send/Recv's on its peers, so theirs are built per call.
bool planCacheable(Collective collective);
// Builds the plan of `call` as the tuner's `choice` says (Send/Recv's on the p2p channels). Fails, naming the
// collective, when no builder has the algorithm.
loomResult_t buildCallPlan(const Call& call, const TuneEstimate& choice, RankPlan* plan);

// The rules `comm` was configured with (LOOM_ALGO).
const AlgorithmRules& algorithmRulesOf(const loomComm* comm);

// A call's plan and the tuner's choice it follows.
struct PlannedCall {
  const TuneEstimate* choice = nullptr;
  const RankPlan* plan = nullptr;
};

template <typename Extra>
class Planner {
 public:
  struct Entry {
    RankPlan plan;
    Extra extra{};
  };

  Planner() = default;
  explicit Planner(const Tuner& tuner) : tuner_(tuner) {}
  Tuner& tuner() { return tuner_; }
  const Tuner& tuner() const { return tuner_; }

  // The plan of `call`: cached by shape (*entry set), or, for a call planCacheable refuses, built into `scratch`
  // (*entry null; a null `scratch` makes such a call an error). Pointers stay valid until clear().
  loomResult_t plan(const Call& call, RankPlan* scratch, PlannedCall* out, Entry** entry) {
    const TuneEstimate& choice =
        tuner_.choose(call.collective, call.count * dtypeSize(call.datatype), algorithmRulesOf(call.comm));
    out->choice = &choice;
    *entry = nullptr;
    if (!planCacheable(call.collective)) {
      if (scratch == nullptr)
        return LOOM_FAIL(loomInternalError, COLL, "%s: its plan cannot be cached", collectiveName(call.collective));
      LOOM_CHECK(buildCallPlan(call, choice, scratch));
      out->plan = scratch;
      return loomSuccess;
    }
    const PlanKeyView key{static_cast<int>(call.collective), call.count, call.root, choice.nChannels,
                          choice.algorithm};
    Entry* found = find(key);
    if (found == nullptr) {
      Entry built;
      LOOM_CHECK(buildCallPlan(call, choice, &built.plan));
      PlanKey owned{std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), choice.algorithm};
      found = &plans_.insert_or_assign(std::move(owned), std::move(built)).first->second;
    }
    out->plan = &found->plan;
    *entry = found;
    return loomSuccess;
  }

  size_t size() const { return plans_.size(); }
  // Drops every cached plan, each handed to `release` first (its Extra may hold memory to free).
  template <typename Release>
  loomResult_t clear(Release&& release) {
    loomResult_t result = loomSuccess;
    for (auto& [key, entry] : plans_)
      if (result == loomSuccess) result = release(entry);
    plans_.clear();
    last_ = nullptr;
    return result;
  }
  void clear() {
    clear([](Entry&) { return loomSuccess; });
  }
  template <typename Each>
  void forEach(Each&& each) {
    for (auto& [key, entry] : plans_) each(entry);
  }

 private:
  Entry* find(const PlanKeyView& key) {
    if (last_ != nullptr && key == lastKey_) return last_;
    auto found = plans_.find(key);
    if (found == plans_.end()) return nullptr;
    const PlanKey& stored = found->first;
    lastKey_ = {std::get<0>(stored), std::get<1>(stored), std::get<2>(stored), std::get<3>(stored),
                std::get<4>(stored)};
    last_ = &found->second;
    return last_;
  }

  Tuner tuner_;
  std::map<PlanKey, Entry, std::less<>> plans_;
  PlanKeyView lastKey_;  // its algorithm views the map's key
  Entry* last_ = nullptr;
};

}  // namespace loom
