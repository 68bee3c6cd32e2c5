// The planner's non-template half (planner.h): which calls are cached, and how a call's plan is built.
#include "src/core/planner.h"

#include "algorithms/builders.h"
#include "src/base/log.h"
#include "src/core/comm.h"

namespace loom {

bool planCacheable(Collective collective) {
  return collective != Collective::kAllToAllv && collective != Collective::kSendRecv;
}

const AlgorithmRules& algorithmRulesOf(const loomComm* comm) { return comm->settings.algorithmRules; }

loomResult_t buildCallPlan(const Call& call, const TuneEstimate& choice, RankPlan* plan) {
  if (!buildPlan(collArgsOf(call, choice.nChannels), choice.algorithm, plan))
    return LOOM_FAIL(loomInternalError, COLL, "no algorithm %s for %s", choice.algorithm.c_str(),
                     collectiveName(call.collective));
  // Send/Recv's lanes move onto the p2p channels, away from the collectives' connections.
  if (call.collective == Collective::kSendRecv)
    for (Lane& lane : plan->lanes) lane.channel += kP2PChannel;
  if (planCacheable(call.collective) && logEnabled(LogLevel::kTrace, Subsys::COLL))
    logMessage(LogLevel::kTrace, Subsys::COLL, "%s count %zu root %d: %s", collectiveName(call.collective),
               call.count, call.root, describe(*plan).c_str());
  return loomSuccess;
}

}  // namespace loom
