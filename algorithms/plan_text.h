// Plan files: every rank's plan for one collective call, as text that loom writes and reads back. A plan file lets
// an algorithm be written by hand or by another tool, proven by the verifier and timed by the simulator without a
// line of C++ (`loom-sim --plan FILE`; `loom-sim --dump-plan FILE` writes one of loom's own as a start). The
// format (docs/SIMULATION.md, "Plan files"):
//
//   loom-plan 1
//   call AllReduce ranks 2 count 8 root 0 channels 1 algorithm ring
//   rank 0 input 8 output 8 scratch 0 reduced out[0+8]
//   lane channel 0
//   send to 1 src in[4+4]
//   recvReduceCopySend from 1 src in[0+4] dst out[0+4] to 1
//   phase
//   recv from 1 dst out[4+4]
//   rank 1 ...
//
// One step per line in describeStep's form (plan.h), fields in any order; "phase" starts a new phase of the lane;
// '#' starts a comment. The reader checks everything a builder guarantees and the verifier assumes: every rank
// once and in order, peers and channels in range, each region inside its buffer, a step's regions of one size,
// and buffers no larger than the call's; it bounds the ranks, lanes and steps, so no input makes it allocate
// without limit. Whether the plan computes its collective is the verifier's question, not the reader's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "algorithms/plan.h"

namespace loom {

struct PlanFile {
  Collective collective = Collective::kAllReduce;
  int nranks = 1;
  size_t count = 0;
  int root = 0;
  int nChannels = 1;
  std::string algorithm;        // a name, for tables: no spaces
  std::vector<RankPlan> plans;  // one per rank; their `algorithm` points at nothing useful: use the field above

  CollArgs argsFor(int rank) const;
};

// The limits the reader holds a file to.
constexpr int kPlanFileMaxRanks = 1 << 16;
constexpr size_t kPlanFileMaxSteps = size_t{1} << 24;  // over all ranks
constexpr size_t kPlanFileMaxCount = size_t{1} << 40;

std::string formatPlanFile(const PlanFile& file);
// Replaces *file with the plans in `text`, or returns false with *error ("line 12: ...") and leaves *file alone.
bool parsePlanFile(std::string_view text, PlanFile* file, std::string* error);

}  // namespace loom
