// loom's plan simulator: how long one collective call takes when every rank runs its plan (algorithms/) on a
// topology (src/topology/), from a few ranks to tens of thousands. docs/SIMULATION.md describes the model, its
// approximations and its validation; this header is the interface that tools/loom-sim and the tests use.
//
// The model, in short. Every rank runs its plan as the executor does (src/exec/host_executor.cc): steps cut
// into slices of one FIFO slot, a lane going round by round (round k = slice k of each step of a phase, phases
// one after another), lanes of a rank concurrently. A slice that crosses to another rank is a message: the unit
// that sends it costs the protocol's software overhead, then the message crosses its route at a max-min fair
// share of every link it uses (flows that share a link divide its bandwidth) and arrives after the route's
// latency. Local steps (copy, reduce) cost their bytes at a local copy bandwidth. Two engines evaluate it:
// kExact runs every slice as an event with rates recomputed whenever a transfer starts or ends; kFast works on
// runs of alike steps, simulates a few rounds of each phase and extrapolates the rest, with rates computed once
// per pattern of flows (fast.cc says how).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "algorithms/plan.h"
#include "src/topology/topology.h"
#include "src/tuner/event_timer.h"

namespace loom::sim {

struct Params {
  double llOverheadUs = 1.0;      // software cost of one LL message (store with flags, poll)
  double simpleOverheadUs = 3.0;  // software cost of one Simple message (copy, fence, counter, poll)
  double copyBandwidth = 1500;    // GB/s of a local copy or reduce step
  // Share of a link's nominal bandwidth that carries payload, by LinkKind (nvlink, pcie, shm, smp, network):
  // NCCL's own figures (20.6 of 25 GB/s per NVLink 4 link, 12 of 15.75 GB/s for PCIe, 12 of 12.5 GB/s per
  // 100 Gb/s of network); 1 for memory.
  double efficiency[kLinkKinds] = {0.824, 0.76, 1.0, 1.0, 0.96};
  // The executor's slicing (LOOM_SIMPLE_SLOT_BYTES, LOOM_LL_SLOT_BYTES, LOOM_LL_THRESHOLD, LOOM_FIFO_DEPTH).
  size_t simpleSliceBytes = 131072;
  size_t llSlotBytes = 16448;
  size_t llThresholdBytes = 8192;
  int fifoDepth = 8;
  // Plans of more steps than this over all ranks are built for a sample of ranks and, when the sample shows
  // the plan is the same on every rank up to a shift of ranks (or of torus / host coordinates), extended to
  // the others (kFast only; buildAll turns it off).
  size_t symmetryMinSteps = size_t{1} << 22;
  bool buildAll = false;
  // An algorithm whose plans hold more steps than this over all ranks (after the symmetry above) is refused.
  size_t maxSteps = size_t{1} << 27;
  size_t maxExactSlices = 2000000;  // kExact refuses calls of more slices over all ranks (about a minute)
  // kAuto takes the exact engine for calls of at most this many ranks and this much of its work (eventWork in
  // src/tuner/event_timer.h), the fast one for the others: by default, where the tuner stops timing by events.
  int autoExactMaxRanks = 512;
  double autoExactWork = kEventWorkLimit;
  int threads = 0;                  // plan building; 0: the machine's cores
};

// Params with the slicing taken from loom's tunables (the LOOM_* environment, as the executor reads it).
Params loomParams();

// kAuto: the exact engine where the call is small enough (autoExactWork), which is where the tuner times calls
// the same way; the fast engine beyond.
enum class Mode { kFast, kExact, kAuto };

struct Call {
  Collective collective = Collective::kAllReduce;
  size_t count = 0;  // the API's count argument (per rank for AllGather, per peer for AllToAll, ...)
  size_t elementBytes = 4;
  int root = 0;
  int nChannels = 1;
  int nranks = 0;         // the topology's ranks 0 .. nranks-1 take part
  std::string algorithm;  // a registry name; "" = the default
  // Plans given rather than built (a plan file: one per rank, for this call): timed with the exact engine.
  const std::vector<RankPlan>* plans = nullptr;
  // This call's slicing, as the tuner chose it (loom-sim's rows): 0 and SIZE_MAX keep the Params'.
  size_t simpleSliceBytes = 0;
  size_t llThresholdBytes = SIZE_MAX;
};

struct Result {
  bool ok = false;
  std::string error;       // why not, when !ok
  double timeUs = 0;       // the call's completion: the last lane's last slice on any rank
  size_t steps = 0;        // steps of all ranks' plans (as built, or as extended by symmetry)
  size_t runs = 0;         // kFast: runs of alike steps simulated
  size_t evaluations = 0;  // kFast: rounds evaluated until the times settled; kExact: events
  std::string symmetry;    // kFast: "" (every plan built) or how plans were extended ("shift", "torus", "hosts")
  bool converged = true;
  bool exact = false;      // the exact engine timed it (kExact, kAuto on a small call, a plan file)
};

// Times calls on one topology. Keeps what carries over between calls (routes, fair shares of flow patterns),
// so a sweep of sizes pays for them once. Not thread safe.
class Simulator {
 public:
  Simulator(const Topology& topo, const Params& params);
  ~Simulator();
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  Result run(const Call& call, Mode mode);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// nccl-tests' conventions for a row of `bytes`: the count argument of the call and the bytes the row reports
// (AllGather, Gather: the gathered buffer; ReduceScatter, Scatter, AllToAll: the scattered one, blocks rounded
// down to 16 bytes), and the bus bandwidth factor (AllReduce 2(n-1)/n; AllGather, ReduceScatter, AllToAll,
// Gather, Scatter (n-1)/n; Broadcast, Reduce 1).
size_t callCountFor(Collective collective, size_t bytes, size_t elementBytes, int nranks);
size_t rowBytesFor(Collective collective, size_t count, size_t elementBytes, int nranks);
double busBandwidthFactor(Collective collective, int nranks);

}  // namespace loom::sim
