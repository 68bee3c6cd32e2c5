// The tuner: predicts how long each algorithm takes for a call and picks the fastest the rules allow, with the
// number of channels, the protocol and the chunk size to use.
//
// The cost model times the plans themselves rather than per-algorithm formulas: every rank's plan is built and
// walked as the executors run it (lanes, phases, rounds of slices), each slice costing its rank's executor an
// overhead per message (by protocol) plus its bytes over the host's copy rate (by action: a forwarding step
// copies twice, a reduction reads two operands), and each message reaching its receiver after the latency of
// the route between the two ranks, plus its bytes over the route's bandwidth when a NIC or NVLink moves it
// rather than the CPUs. Ranks that outnumber their host's cores share them: their executors run
// ranks/cores times slower. A route's bandwidth is shared by the ranks that leave their host through the same
// NIC. So the latency terms come from the plan's dependent steps, the bandwidth terms from its bytes per rank,
// both per hop class of the topology, and the tree's depth, the ring's 2(n-1) steps or recursive halving's
// log2(n) fall out of the plans. Calls of GPU ranks under the GPU executor are timed instead by the event timer
// (event_timer.h: every slice an event, links shared by max-min fairness), the function loom-sim's exact engine
// is. docs/TUNING.md has the constants and the measured check.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "src/topology/topology.h"

namespace loom {

// What the model knows of a communicator.
struct TuneContext {
  const Topology* topology = nullptr;  // fused; when it does not place every rank, all share one host
  int nranks = 1;
  std::vector<int> hostOf;  // per rank (empty: one host)
  int torusDims[kMaxTorusDims] = {};
  int torusDimCount = 0;
  int nChannels = 1;            // the most a call may use
  int forcedProtocol = -1;      // LOOM_PROTO: -1 lets the tuner choose, else a Protocol
  size_t llThresholdBytes = 8192;  // LOOM_LL_THRESHOLD: the largest message that may use LL
  size_t llSliceBytes = 8192;      // an LL slot's payload
  size_t simpleSliceBytes = 131072;  // a Simple slot's payload: the largest chunk
  size_t forcedChunkBytes = 0;     // LOOM_CHUNK_BYTES: 0 lets the tuner choose
  int fifoDepth = 8;               // LOOM_FIFO_DEPTH: messages a connection may have in flight (the event timer)
  // The GPU executor runs the calls (the device path, LOOM_CUDA_PATH=device): a GPU rank's lanes run side by
  // side (a CTA each), its messages cost deviceLlSliceUs or deviceSimpleSliceUs and cross their routes (NVLink,
  // PCIe, a NIC) sharing every link by max-min fairness (the event timer, event_timer.h; beyond its work limit,
  // taking turns on each link). Otherwise a GPU rank's calls are staged through the host
  // executor: one thread, copies at deviceCopyGBps.
  bool deviceExecutor = false;
};

// How a call's messages are cut into FIFO slots: decided per call with the algorithm, alike on every rank, since
// both ends of a message must agree on its protocol and slices without talking.
struct Slicing {
  size_t llThresholdBytes = 8192;    // messages of at most this many bytes use LL; 0: Simple only
  size_t simpleSliceBytes = 131072;  // the chunk: a Simple message carries at most this much
};

// The slicing a call gets when nothing is tuned: LL up to the threshold (or as LOOM_PROTO forces), whole slots.
Slicing defaultSlicing(const TuneContext& context);

// The executor's costs on a host, in microseconds and GB/s. The defaults were measured on the reference VM
// (docs/TUNING.md).
struct HostCosts {
  double callUs = 0.15;         // a call's fixed cost: plan lookup, task set-up, completion
  double llSliceUs = 0.09;      // per LL message handled (poll, flags)
  double simpleSliceUs = 0.78;  // per Simple message handled (credits, head and tail counters)
  double localSliceUs = 0.17;   // per local copy or reduce slice
  double copyGBps = 19.4;       // one core's memcpy rate from and to memory
  double cachedCopyGBps = 58.8; // ... when the call's buffers fit in the caches
  double cacheBytes = 1 << 20;  // what "fit" means: a core's share of the caches
  // GPU ranks. Under the GPU executor (TuneContext::deviceExecutor; compiled, never run on a GPU, so NCCL-class
  // figures until its own are measured) a message between GPU ranks goes over its route (NVLink, PCIe, a NIC),
  // written by the sender's kernel into the peer's FIFO: it costs its sender the protocol's overhead, and its
  // bytes the route's payload rate, every link of the route shared fairly (TuneContext::deviceExecutor). loom-sim
  // takes these same figures.
  double deviceCopyGBps = 1000; // local copies and reductions (HBM-class)
  double deviceLlSliceUs = 1.0;     // per LL message handled by a GPU rank
  double deviceSimpleSliceUs = 3.0; // per Simple message handled by a GPU rank
  double nvlinkShare = 0.824;   // payload share of a link's bandwidth: NCCL's own figures (20.6 of 25 GB/s per
  double pcieShare = 0.76;      // NVLink 4 link, 12 of 15.75 GB/s for PCIe, 12 of 12.5 GB/s per 100 Gb/s of
  double networkShare = 0.96;   // network); 1 for memory
  double llCopyFactor = 8.4;    // LL moves flags with the payload
  double inputSendFactor = 0.28; // a Simple send of the call's input, per byte: 1 copies it into the slot; 0 is
                                // a peer reading it in place (LOOM_DIRECT with loomMemAlloc or registered
                                // buffers). Fitted between the two: the tuner cannot know a call's buffers
                                // alike on every rank, so it prices the measured mix
  double shmLatencyUs = 0.59;   // a message between two cores of one host
  double switchUs = 20.0;       // a wait that finds the sender off its core, on a host with more ranks than
                                // cores: paid per message received, times (1 - cores/ranks) to the power of
                                // the receiver's active lanes (one of them with work spares the switch)
};

// The payload share of `kind`'s bandwidth (nvlinkShare, pcieShare, networkShare; 1 for memory).
double linkShare(const HostCosts& costs, LinkKind kind);

// The tuner's context for ranks 0..nranks-1 of a topology, as a communicator over them would configure it from
// loom's settings (LOOM_NCHANNELS, the FIFO's slots, LOOM_LL_THRESHOLD, LOOM_PROTO, LOOM_CHUNK_BYTES); where every
// rank is a GPU, the GPU executor's (LOOM_CUDA_NCHANNELS, LOOM_CUDA_SLOT_BYTES). For loom-tune and loom-sim, which
// time calls on topologies no one here has; `channels` > 0 replaces the channel count.
TuneContext contextFor(const Topology& topo, int nranks, int channels = 0);
// LOOM_PROTO as TuneContext::forcedProtocol takes it: -1 lets the tuner choose, else a Protocol.
int forcedProtocolSetting();
// Whether every rank of the context is a GPU (contextFor then took the GPU executor's settings).
bool isGpuContext(const TuneContext& context);

// Sets the costs named in `text` ("copyGBps=12,switchUs=30"; names as in HostCosts), leaving the others. On a
// bad name or value returns false with *error set and changes nothing.
bool parseHostCosts(const std::string& text, HostCosts* costs, std::string* error);

// Every cost as parseHostCosts reads them.
std::string describeHostCosts(const HostCosts& costs);

struct TuneEstimate {
  std::string algorithm;
  int nChannels = 1;
  double us = 0;  // predicted time of the call
  Slicing slicing;
};

// Predicted time of `algorithm` for one call (count elements of elementBytes each; root for rooted
// collectives) on `nChannels` channels, cut as `slicing` says (null: defaultSlicing). With calls > 1, the time
// per call of that many identical calls issued back to back: a rank starts the next when it has finished the
// one before, so calls that do not end on every rank at once (a Broadcast's chain) overlap. Negative when the
// algorithm does not exist for the collective.
double estimateCall(const TuneContext& context, const HostCosts& costs, Collective collective, size_t count,
                    size_t elementBytes, int root, const std::string& algorithm, int nChannels,
                    const Slicing* slicing = nullptr, int calls = 1);

// The tuner prices a call as one of a stream of this many: training steps and benchmarks issue calls back to
// back, and a call's cost then includes how well it overlaps its neighbours.
constexpr int kTunedCalls = 3;

// Collectives the tuner chooses for: the others have one algorithm, or plans that depend on per-rank counts.
bool tunable(Collective collective);

// The model's errors are about this size (docs/TUNING.md): an algorithm earlier in the registry's order (the ring
// first) predicted within this share of the cheapest keeps the call, and a finer slicing must be predicted this
// much faster to be taken.
constexpr double kPreferEarlierWithin = 0.10;

class Tuner {
 public:
  void configure(TuneContext context, HostCosts costs = {});
  const TuneContext& context() const { return context_; }
  const HostCosts& costs() const { return costs_; }

  // The algorithm, channels and slicing for a call of `bytes` bytes, decided once per size class (bytes rounded
  // up to a power of two, so every rank decides alike):
  //  1. the cheapest algorithm and channel count that `rules` allow, with the default slicing, except that an
  //     algorithm earlier in the registry's order (the ring first) predicted within 10% of the cheapest is kept;
  //  2. for it, Simple instead of LL for the small messages (unless LOOM_PROTO forces a protocol), then chunks
  //     of a half, a quarter or an eighth of a slot (unless LOOM_CHUNK_BYTES fixes them), each kept only when
  //     predicted more than 10% faster.
  // Not thread safe.
  const TuneEstimate& choose(Collective collective, size_t bytes, const AlgorithmRules& rules);

  // Every allowed algorithm's estimate for a call of `bytes` with the default slicing, cheapest first (what
  // LOOM_DEBUG_SUBSYS=TUNE prints).
  std::vector<TuneEstimate> rank(Collective collective, size_t bytes, const AlgorithmRules& rules) const;

 private:
  void refineSlicing(Collective collective, size_t bytes, TuneEstimate* chosen) const;

  static constexpr int kClasses = 64;
  TuneContext context_;
  HostCosts costs_;
  std::vector<std::array<TuneEstimate, kClasses>> chosen_;  // by collective, then size class
  std::vector<std::array<bool, kClasses>> known_;
};

// A table of `estimates` for the logs: "ring 12.3 us | tree 15.0 us (2 ch) | ...".
std::string describeEstimates(const std::vector<TuneEstimate>& estimates);

// How a call is cut, for the logs: "LL up to 8 KiB, 128 KiB chunks".
std::string describeSlicing(const Slicing& slicing, int forcedProtocol);

}  // namespace loom
