// The event timer: the time of one collective call (or of a stream of them) when every rank runs its plan as the
// GPU executor does, every slice of every step of every lane a discrete event, over the routes of a Network whose
// links carry the flows in flight at their max-min fair shares. The one model of the GPU executor's time: the
// tuner prices calls of GPU ranks with it (tuner.cc), and loom-sim's exact engine is this function
// (docs/SIMULATION.md).
//
// A lane walks its steps with LaneCursor, the executor's own order. A unit (one slice) starts when its lane is
// free, its incoming message has arrived (receives) and its connection has a free FIFO slot (sends: at most
// fifoDepth messages posted and not yet released by the receiver, whose release reaches the sender after the
// reverse route's latency). It occupies the lane for its cost: the protocol's overhead when it sends or receives,
// else its bytes at the copy rate (times memoryFactor). Then it releases its incoming slot and posts its message.
// A connection sends its messages one at a time, in order; a message in flight is a flow along its route, and the
// rates of all flows in flight are their max-min fair shares, recomputed whenever a flow starts or ends. A message
// arrives its route's latency after its last byte left. A call ends with its last unit.
//
// Channels whose lanes are copies of their channel set's first (the same actions, peers and slices, counts within
// one element), on every rank, are folded into it: one lane stands for nChannels alike lanes, and each of its
// messages for as many alike flows. That is exact for such plans (the copies start together and share every link
// alike) and divides the work by the channel count.
#pragma once

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/plan.h"
#include "src/exec/lane_walker.h"
#include "src/topology/network.h"

namespace loom {

// Bytes each kind of step moves through its rank's memory per byte of payload: a forwarding step copies in and
// out, a reduction reads two operands and writes one.
double memoryFactor(Action action);

// Bytes on the wire for a slice of `bytes` of payload: LL sends 8-byte lines of 4 data bytes and a flag, plus a
// size word; Simple sends the data.
inline double wireBytes(double bytes, bool ll) { return ll ? 2 * 4 * std::ceil(bytes / 4) + 8 : bytes; }

struct EventCosts {
  double llOverheadUs = 1.0;      // a unit that sends or receives an LL message
  double simpleOverheadUs = 3.0;  // ... a Simple message
  double copyGBps = 1000;         // local copies and reductions, per byte of memoryFactor
  int fifoDepth = 8;              // messages a connection may have posted and not yet released
  double callUs = 0;              // each call's fixed cost on a rank, before its first unit
};

struct EventTiming {
  bool ok = false;
  std::string error;   // why not: an unreachable peer, a deadlock (naming the rank and channel)
  double timeUs = 0;   // one call: its last unit; calls > 1: per call, as estimateCall defines it
  size_t events = 0;
  int folded = 1;      // lanes each simulated lane stands for
};

// The timer's work for these plans, without running them: the units (slices) it would simulate after folding
// times the connections, since every flow's start and end recomputes the fair shares of the flows in flight. For
// choosing whether a call is cheap enough to time this way (about 10 ns per unit of work, per call timed).
double eventWork(const std::vector<RankPlan>& plans, const SliceRule& rule, int nChannels);

// The most work per call the tuner times this way (a few milliseconds per call timed); it takes turns on each
// link beyond (tuner.cc), and loom-sim's default engine switches to its fast one at the same point.
constexpr double kEventWorkLimit = 1e6;

// Times `calls` back-to-back calls of `plans` (one per rank; nChannels as they were built with): each rank starts
// its next call callUs after it finished its last unit of the one before. With calls > 1, timeUs is the time per
// call from when the last rank finished its first call to when the last finished its last.
EventTiming timeByEvents(const std::vector<RankPlan>& plans, int nChannels, Network& network, const SliceRule& rule,
                         const EventCosts& costs, int calls = 1);

}  // namespace loom
