// A rank's plan flattened into three arrays, the form a CUDA kernel walks: a device has no std::vector, and one
// copy of three arrays is all it takes to move a plan into device memory. Steps are the plan's own (plain data);
// each lane names its range of them and of the phase starts. FlatLaneView is the LaneView of BasicLaneCursor
// (plan.h), so a device walks a lane in exactly the host executor's order; unit/flat_plan_test.cc holds the two
// to the same walk for every algorithm.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/plan.h"

namespace loom {

struct FlatLane {
  int32_t channel;
  uint32_t firstStep, stepCount;              // into the steps
  uint32_t firstPhaseStart, phaseStartCount;  // into the phase starts (lane-relative step indices)
};

// One lane of a flat plan, wherever its arrays live.
struct FlatLaneView {
  const Step* steps;
  uint32_t stepCount;
  const uint32_t* phaseStarts;
  uint32_t phaseStartCount;
  int32_t channel;

  LOOM_HOST_DEVICE size_t phaseCount() const { return phaseStartCount + size_t{1}; }
  LOOM_HOST_DEVICE size_t phaseBegin(size_t phase) const { return phase == 0 ? 0 : phaseStarts[phase - 1]; }
  LOOM_HOST_DEVICE size_t phaseEnd(size_t phase) const {
    return phase < phaseStartCount ? phaseStarts[phase] : stepCount;
  }
  LOOM_HOST_DEVICE const Step& stepAt(size_t index) const { return steps[index]; }
};

// The three arrays, and the plan's sizes.
struct FlatPlanView {
  const FlatLane* lanes;
  uint32_t laneCount;
  const Step* steps;
  const uint32_t* phaseStarts;
  size_t inputCount, outputCount, scratchCount;
  Region reducedOutput;

  LOOM_HOST_DEVICE FlatLaneView lane(uint32_t index) const {
    const FlatLane& l = lanes[index];
    return FlatLaneView{steps + l.firstStep, l.stepCount, phaseStarts + l.firstPhaseStart, l.phaseStartCount,
                        l.channel};
  }
};

// The host's copy: owns the arrays.
struct FlatPlan {
  std::vector<FlatLane> lanes;
  std::vector<Step> steps;
  std::vector<uint32_t> phaseStarts;
  size_t inputCount = 0, outputCount = 0, scratchCount = 0;
  Region reducedOutput{Buffer::kOutput, 0, 0};

  FlatPlanView view() const {
    return FlatPlanView{lanes.data(),     static_cast<uint32_t>(lanes.size()), steps.data(), phaseStarts.data(),
                        inputCount,       outputCount,                         scratchCount, reducedOutput};
  }
};

FlatPlan flatten(const RankPlan& plan);

}  // namespace loom
