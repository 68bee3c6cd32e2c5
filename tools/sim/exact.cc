// The exact engine: every slice of every step of every lane as the executor runs it, as discrete events, with the
// links' max-min fair shares recomputed whenever a transfer starts or ends. It is the tuner's event timer
// (src/tuner/event_timer.h) with loom-sim's parameters, so loom-sim and loom-tune time such calls by one
// function; the fast engine is checked against it.
#include "src/tuner/event_timer.h"
#include "tools/sim/engines.h"

namespace loom::sim {

Result runExact(const CallSetup& setup, const std::vector<RankPlan>& plans, Network& network, const Params& params) {
  EventCosts costs;
  costs.llOverheadUs = params.llOverheadUs;
  costs.simpleOverheadUs = params.simpleOverheadUs;
  costs.copyGBps = params.copyBandwidth;
  costs.fifoDepth = params.fifoDepth;
  EventTiming timing = timeByEvents(plans, setup.base.nChannels, network, setup.slicing, costs);
  Result result;
  result.ok = timing.ok;
  result.error = timing.error;
  result.timeUs = timing.timeUs;
  result.evaluations = timing.events;
  for (const RankPlan& plan : plans)
    for (const Lane& lane : plan.lanes) result.steps += lane.steps.size();
  return result;
}

}  // namespace loom::sim
