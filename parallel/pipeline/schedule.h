// Pipeline schedules as data: for each of p stages, the list of actions it performs in order for one training step
// of m micro-batches: forward (F), backward (B: the input's gradient, and with it the weights' unless the schedule
// splits them off), the weights' gradient (W, ZB-H1 only), and the sends and receives between neighbouring stages.
// One executor runs any of them; `simulate` runs one on a model of costs, to check it (every receive matched by a
// send, no stage waiting forever) and to measure its bubble against the formulas of parallel/plan/accounting.h.
//
// The schedules:
//  - GPipe: every forward, then every backward (m micro-batches in flight).
//  - 1F1B: p - s - 1 forwards to fill the pipeline, then one forward and one backward in turn, then the remaining
//    backwards (at most p in flight on stage 0).
//  - Interleaved 1F1B (Narayanan et al., 2021): each stage holds v model chunks (virtual stage c p + s); micro-batches
//    go in groups of p through chunk 0, then chunk 1, ...; (p - s - 1) 2 + (v - 1) p forwards fill the pipeline.
//    m must be a multiple of p.
//  - ZB-H1 (Qi et al., 2023): 1F1B's forwards and backwards with the backward split into B and W; each stage defers
//    its first p - s - 1 W's and runs them where 1F1B would idle at the end, in the same memory as 1F1B.
#pragma once

#include <string>
#include <vector>

#include "parallel/plan/accounting.h"

namespace loom::parallel::pipeline {

using plan::Schedule;

enum class Op { kForward, kBackward, kWeight, kSendActivation, kReceiveActivation, kSendGradient, kReceiveGradient };
const char* opName(Op op);

struct Action {
  Op op;
  int microBatch;
  int chunk;  // the model chunk on this stage (0 unless interleaved)
  bool operator==(const Action&) const = default;
};

struct Plan {
  Schedule schedule = Schedule::k1F1B;
  int stages = 1, microBatches = 1, chunks = 1;
  bool splitBackward = false;  // B computes only the input's gradient; W the weights'
  std::vector<std::vector<Action>> perStage;
  // The stage that holds virtual stage `virtualStage` (chunk c of stage s is virtual stage c p + s).
  int stageOf(int virtualStage) const { return virtualStage % stages; }
};

// The plan of `schedule` for p stages, m micro-batches and v chunks (interleaved only). False, with *error, when
// the shape does not suit it (m not a multiple of p for interleaved, v > 1 for another).
bool makePlan(Schedule schedule, int p, int m, int v, Plan* out, std::string* error);

// What each action costs in the simulation (time units); sends and receives are free, a receive waiting for its
// send.
struct Costs {
  double forward = 1, backward = 2, weight = 0;  // an unsplit backward costs backward + weight
};

struct Span {
  int stage;
  Action action;
  double start, end;
};

struct Timeline {
  std::vector<Span> spans;  // compute actions only, in order of start
  double makespan = 0;
  double busy = 0;  // summed compute time over all stages
  // Idle time over busy time: the pipeline bubble.
  double bubble() const;
  // The mean time of each kind of action (for a measured timeline: what simulate() needs to replay its plan with
  // these costs, apart from the waits for messages and the noise of the machine).
  Costs meanCosts() const;
  // A text chart, one row per stage: F, B and W by micro-batch along the time axis, '.' idle; `columnsPerUnit`
  // columns for each `unit` of time (a measured timeline's seconds: unit = makespan / 120 for 120 columns).
  std::string render(int columnsPerUnit = 1, double unit = 1) const;
};

// Runs `plan`: each stage in its order, a compute action taking its cost, a receive starting when its send is
// done. False, with *error naming the stuck actions, when some stage waits forever or an action is unmatched.
// Sends are taken as buffered (they never wait for their receiver), so an executor must not block in a send before
// it posts the receives that come after it in its plan: it posts sends on streams of their own, one per
// direction, or groups each send with the receive beside it (Megatron's send_forward_recv_backward).
bool simulate(const Plan& plan, const Costs& costs, Timeline* out, std::string* error);

}  // namespace loom::parallel::pipeline
