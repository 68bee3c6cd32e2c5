// Plans as the simulator reads them. A call is set up once (CollArgs for every rank, with the torus and the
// hosts the topology gives), its plans are built with buildPlan, and for the fast engine each rank's plan is
// compressed into runs: consecutive steps of a phase with the same action, peers, protocol and slice count, and
// sizes within one element (the ring's n-2 recvReduceSend steps are one run). A ring over 16,384 ranks is then
// five runs per lane instead of 32,766 steps.
//
// Plans too large to build on every rank (the ring's steps grow with the square of the ranks) are built for a
// sample of ranks; when every sampled plan is the same once its peers are written relative to its rank (a
// shift of ranks, of torus coordinates, or of (host, local rank)), the others are taken to be the same too.
// Channels whose lanes are copies of channel 0's are folded into it with a multiplicity, since they load the
// network alike and take the same time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.h"
#include "src/exec/lane_walker.h"
#include "tools/sim/sim.h"

namespace loom::sim {

// The executors' slicing of a call, their own rule (src/exec/lane_walker.h): steps of at most llThresholdBytes
// go as LL messages of up to llSliceElems elements, others as Simple messages of up to simpleSliceElems.
struct Slicing : SliceRule {
  size_t llPayloadBytes = 8220;  // LL payload per slot

  Slicing() : SliceRule{4, 8192, 1, 1, -1} {}
  Slicing(const Params& params, size_t elementBytes);
  bool isLL(size_t count) const { return protocolFor(count) == Protocol::kLL; }
  size_t sliceElems(size_t count) const { return SliceRule::sliceElems(protocolFor(count)); }
  size_t slicesOf(size_t count) const { return SliceRule::slicesOf(count); }
  // Bytes on the wire for a slice of `elements`: LL sends 8-byte lines of 4 data bytes and a flag, plus a size
  // word; Simple sends the data.
  double wireBytes(size_t elements, bool ll) const;
};

// Everything needed to build any rank's plan for one call.
struct CallSetup {
  CollArgs base;  // rank 0's arguments; argsFor() sets the rank and points hostOf at `hostOf`
  std::vector<int> hostOf;
  std::string algorithm;
  Slicing slicing;
  // Coordinate systems the ranks may be shifted in (products of the sizes = nranks), tried in order for
  // symmetry: the torus (row-major, last fastest), hosts x local ranks, and one ring of all ranks.
  std::vector<std::vector<int>> symmetries;
  std::vector<std::string> symmetryNames;

  CollArgs argsFor(int rank) const;
};

// Sets up `call` on `topo`, or returns false with *error (unplaced ranks, unknown algorithm).
bool setUpCall(const Topology& topo, const Call& call, const Params& params, CallSetup* setup, std::string* error);

// A connection (the FIFO from one rank to another on one channel) as a key: ranks below 2^24, channels below 2^16.
inline uint64_t connectionKey(int from, int to, int channel) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 40) |
         (static_cast<uint64_t>(static_cast<uint32_t>(to)) << 16) | static_cast<uint16_t>(channel);
}

enum RunFlags : uint8_t { kReceives = 1, kSends = 2 };  // neither: a local step (copy, reduce)

struct Run {
  uint8_t flags = 0;
  bool ll = false;
  int recvPeer = -1, sendPeer = -1;
  uint32_t steps = 0;     // alike steps in a row
  uint32_t slices = 0;    // slices of each
  uint64_t elements = 0;  // elements of each (the run's mean)
  // The first step's place among the rank's receives from recvPeer (sends to sendPeer) on the lane's channel:
  // the n-th send on a connection meets the n-th receive.
  uint32_t inOrdinal = 0, outOrdinal = 0;
};

struct PhaseShape {
  uint32_t firstRun = 0, runCount = 0;
  uint32_t rounds = 0;  // the most slices of any of its steps
};

struct LaneShape {
  int channel = 0;
  int multiplicity = 1;  // lanes of other channels folded into this one
  std::vector<Run> runs;
  std::vector<PhaseShape> phases;  // phases with at least one slice
};

struct RankShape {
  std::vector<LaneShape> lanes;
  size_t steps = 0;  // steps of the plan it came from
};

RankShape compressPlan(const RankPlan& plan, const Slicing& slicing);

struct ShapeSet {
  std::vector<RankShape> ranks;
  size_t steps = 0;
  std::string symmetry;  // "" when every plan was built
  int folded = 1;        // channels per lane after folding
};

// Builds every rank's plan for `setup` and compresses it (in parallel), or extends a sample by symmetry (see
// above), folds channels and numbers the steps on each connection. False with *error when the plans would hold
// more than params.maxSteps steps.
bool buildShapes(const CallSetup& setup, const Params& params, ShapeSet* shapes, std::string* error);

// Every rank's plan as built, for the exact engine.
std::vector<RankPlan> buildPlans(const CallSetup& setup);

}  // namespace loom::sim
