// flatten(): a RankPlan as three arrays (flat_plan.h).
#include "algorithms/flat_plan.h"

#include <type_traits>

namespace loom {

static_assert(std::is_trivially_copyable_v<Step>, "a flat plan's steps are copied to a device as bytes");
static_assert(std::is_trivially_copyable_v<FlatLane>, "a flat plan's lanes are copied to a device as bytes");

FlatPlan flatten(const RankPlan& plan) {
  FlatPlan flat;
  flat.inputCount = plan.inputCount;
  flat.outputCount = plan.outputCount;
  flat.scratchCount = plan.scratchCount;
  flat.reducedOutput = plan.reducedOutput;
  for (const Lane& lane : plan.lanes) {
    flat.lanes.push_back(FlatLane{lane.channel, static_cast<uint32_t>(flat.steps.size()),
                                  static_cast<uint32_t>(lane.steps.size()),
                                  static_cast<uint32_t>(flat.phaseStarts.size()),
                                  static_cast<uint32_t>(lane.phaseStarts.size())});
    flat.steps.insert(flat.steps.end(), lane.steps.begin(), lane.steps.end());
    flat.phaseStarts.insert(flat.phaseStarts.end(), lane.phaseStarts.begin(), lane.phaseStarts.end());
  }
  return flat;
}

}  // namespace loom
