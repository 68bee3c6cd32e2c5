// The plan IR: what one collective call does, as data.
//
// A plan gives one rank, per lane, an ordered list of steps. A step names an action and the regions it touches,
// in elements of the call's datatype. Lanes of one rank run concurrently; the steps of a lane run in order. A
// lane's `channel` picks the connections it uses: a message sent by rank a to rank b on channel c is received by
// the next receive from a on channel c at b (FIFO order per connection). Builders produce the plan of one rank
// from that rank's view of the call (CollArgs), so calls whose counts differ per rank (AllToAllv, Send/Recv)
// are planned locally; the verifier builds every rank's plan and executes them symbolically.
//
// Executors split every step into slices of at most one FIFO slot and run a lane in rounds: round k runs slice
// k of each step in order, so a ring pipelines chunks through the FIFOs as NCCL's loops do. A lane may be cut
// into phases: a phase starts only when every step of the phases before it has run all its slices, for
// algorithms whose later steps read what earlier steps wrote at other offsets (recursive halving, Bruck, a
// torus's dimensions one after another). LaneCursor is that order, shared by the executors and the verifier;
// BasicLaneCursor and the slice arithmetic below also compile for a CUDA device (LOOM_HOST_DEVICE), where a
// kernel walks a plan flattened into arrays (flat_plan.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/loom.h"
#include "src/base/host_device.h"

namespace loom {

enum class Collective : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllv,
  kGather,
  kScatter,
  kSendRecv,  // the Send/Recv calls of one group
  kBarrier,
};
const char* collectiveName(Collective collective);
// The collective named `name`: loom's name in any case, with or without "_" or "-" between its words
// ("AllReduce", "allreduce", "all_reduce" as nccl-tests spells it). False when there is none.
bool parseCollectiveName(std::string_view name, Collective* collective);
// The names every tool lists in its --help: "allreduce (all_reduce)", lower case, with nccl-tests' spelling beside
// where it differs.
std::string collectiveHelpName(Collective collective);

enum class Buffer : uint8_t { kInput, kOutput, kScratch };

struct Region {
  Buffer buffer = Buffer::kInput;
  size_t offset = 0;
  size_t count = 0;
  uint32_t bufferIndex = 0;  // which buffer of that kind: 0 for collectives; the op's index for Send/Recv groups
};

enum class Action : uint8_t {
  kSend,                // send(sendPeer, src)
  kRecv,                // recv(recvPeer, dst)
  kRecvReduce,          // dst = src (op) incoming from recvPeer
  kRecvReduceSend,      // send src (op) incoming to sendPeer
  kRecvReduceCopySend,  // dst = src (op) incoming; send dst to sendPeer
  kRecvCopySend,        // dst = incoming; send it on to sendPeer
  kCopy,                // dst = src
  kReduce,              // dst = src (op) src2
};
const char* actionName(Action action);
LOOM_HOST_DEVICE inline bool actionReceives(Action action) {
  return action == Action::kRecv || action == Action::kRecvReduce || action == Action::kRecvReduceSend ||
         action == Action::kRecvReduceCopySend || action == Action::kRecvCopySend;
}
LOOM_HOST_DEVICE inline bool actionSends(Action action) {
  return action == Action::kSend || action == Action::kRecvReduceSend || action == Action::kRecvReduceCopySend ||
         action == Action::kRecvCopySend;
}

struct Step {
  Action action;
  int recvPeer = -1;
  int sendPeer = -1;
  Region src;            // data sent, local operand, or copy source
  Region src2;           // second operand of kReduce
  Region dst;            // where the step writes
  // Elements the step moves (all of its regions have this count).
  LOOM_HOST_DEVICE size_t count() const {
    return action == Action::kSend || action == Action::kRecvReduceSend ? src.count : dst.count;
  }
};

struct Lane {
  int channel = 0;
  std::vector<Step> steps;
  std::vector<uint32_t> phaseStarts{};  // indices of the steps that start phases 1, 2, ... (ascending)

  // The steps pushed from now on form a new phase (an empty one, when none follow, is skipped).
  void startPhase() {
    uint32_t at = static_cast<uint32_t>(steps.size());
    if (at > 0 && (phaseStarts.empty() || phaseStarts.back() != at)) phaseStarts.push_back(at);
  }
  size_t phaseCount() const { return phaseStarts.size() + 1; }
  size_t phaseBegin(size_t phase) const { return phase == 0 ? 0 : phaseStarts[phase - 1]; }
  size_t phaseEnd(size_t phase) const { return phase < phaseStarts.size() ? phaseStarts[phase] : steps.size(); }
  const Step& stepAt(size_t index) const { return steps[index]; }
};

// The slices of a step of `count` elements cut at `sliceElems` (at least 1), and the elements [*lo, *hi) of
// slice `round` (empty past the last one): how every executor cuts a step.
LOOM_HOST_DEVICE inline size_t sliceCount(size_t count, size_t sliceElems) {
  return (count + sliceElems - 1) / sliceElems;
}
LOOM_HOST_DEVICE inline void sliceBounds(size_t count, size_t sliceElems, size_t round, size_t* lo, size_t* hi) {
  const size_t start = round * sliceElems;
  *lo = start < count ? start : count;
  *hi = count - *lo < sliceElems ? count : *lo + sliceElems;
}

// Walks the slices of a lane in the order executors run them: phase by phase, and within a phase in rounds
// (round k runs slice k of each step, in order). `slicesOf(step)` says how many slices a step has; a phase
// whose steps have none is skipped. LaneView gives phaseCount(), phaseBegin(p), phaseEnd(p) and stepAt(i): a Lane
// on the host, a FlatLaneView (flat_plan.h) on a device.
template <class LaneView>
class BasicLaneCursor {
 public:
  template <class SlicesOf>
  LOOM_HOST_DEVICE void start(const LaneView& lane, SlicesOf&& slicesOf) {
    lane_ = &lane;
    enterPhase(0, slicesOf);
  }
  LOOM_HOST_DEVICE bool done() const { return phase_ >= lane_->phaseCount(); }
  LOOM_HOST_DEVICE size_t step() const { return step_; }
  LOOM_HOST_DEVICE size_t round() const { return round_; }
  // Moves to the next slice, once the current one has run.
  template <class SlicesOf>
  LOOM_HOST_DEVICE void next(SlicesOf&& slicesOf) {
    if (++step_ < end_) return;
    step_ = begin_;
    if (++round_ == rounds_) enterPhase(phase_ + 1, slicesOf);
  }

 private:
  template <class SlicesOf>
  LOOM_HOST_DEVICE void enterPhase(size_t phase, SlicesOf& slicesOf) {
    for (phase_ = phase; phase_ < lane_->phaseCount(); ++phase_) {
      begin_ = step_ = lane_->phaseBegin(phase_);
      end_ = lane_->phaseEnd(phase_);
      round_ = rounds_ = 0;
      for (size_t s = begin_; s < end_; ++s) {
        size_t slices = slicesOf(lane_->stepAt(s));
        if (slices > rounds_) rounds_ = slices;
      }
      if (rounds_ > 0) return;
    }
  }

  const LaneView* lane_ = nullptr;
  size_t phase_ = 0, begin_ = 0, end_ = 0, step_ = 0, round_ = 0, rounds_ = 0;
};
using LaneCursor = BasicLaneCursor<Lane>;

// One rank's share of a call.
struct RankPlan {
  std::vector<Lane> lanes;
  size_t inputCount = 0;                        // elements of the input buffer the plan may read
  size_t outputCount = 0;                       // elements of the output buffer it may write
  size_t scratchCount = 0;                      // elements of scratch the executor must provide
  // Scratch holds partial results in the type's partial type (dtypePartialSize: fp32 for fp16 and bf16), so that
  // a combination of n operands is rounded to the type once, where it is written outside scratch. Such a plan
  // sends nothing that lies in scratch (the verifier holds it to that): messages carry the call's type.
  bool wideScratch = false;
  Region reducedOutput{Buffer::kOutput, 0, 0};  // where loomAvg's final divide applies (count 0: none)
  const char* algorithm = "";
};

// One Send or Recv of a group, as its rank sees it. Op i reads input buffer i (a send) or writes output
// buffer i (a recv): its regions carry bufferIndex i.
struct P2POp {
  bool isSend;
  int peer;
  size_t count;
};

// Channel sets a plan may use: channel c of a call is c, c + nChannels, ... up to kChannelSets sets, so that an
// algorithm with two independent flows per channel (the double binary tree) never shares a FIFO between them.
constexpr int kChannelSets = 2;

constexpr int kMaxTorusDims = 4;

// The ranks a walk over all ranks' plans (the verifier, the tuner's timer) should visit next: every rank at
// first, then those woken because a message was sent to them or taken from them, so that the work grows with
// the messages rather than with ranks times passes.
class ReadyRanks {
 public:
  explicit ReadyRanks(int n) : queued_(n, 1) {
    for (int r = 0; r < n; ++r) ready_.push_back(r);
  }
  bool pop(int* rank) {
    if (ready_.empty()) return false;
    *rank = ready_.front();
    ready_.pop_front();
    queued_[*rank] = 0;
    return true;
  }
  void wake(int rank) {
    if (!queued_[rank]) queued_[rank] = 1, ready_.push_back(rank);
  }

 private:
  std::deque<int> ready_;
  std::vector<char> queued_;
};

// A rank's view of one call: what every builder takes.
struct CollArgs {
  Collective collective;
  int nranks;
  int rank;
  int root = 0;
  size_t count = 0;  // per the public API: AllGather sendcount, ReduceScatter recvcount, AllToAll per peer...
  int nChannels = 1;  // a plan's lanes use channels 0 .. kChannelSets * nChannels - 1
  // AllToAllv: this rank's vectors, nranks entries each.
  std::span<const size_t> sendCounts, sendDispls, recvCounts, recvDispls;
  // SendRecv: this rank's ops in call order.
  std::span<const P2POp> p2p;
  // The torus the ranks form (row-major: the last dimension varies fastest), for the torus algorithms; with no
  // dimensions given they use a near-square 2-D grid of nranks.
  int torusDims[kMaxTorusDims] = {};
  int torusDimCount = 0;
  // The host of every rank (nranks entries, hosts numbered from 0), for the hierarchical algorithms; empty: one
  // host.
  std::span<const int> hostOf;
};

// Element counts of the input and output buffers of a call, as the public API defines them.
size_t inputCountOf(const CollArgs& args);
size_t outputCountOf(const CollArgs& args);

// Splits [0, count) into `parts` near-equal pieces: piece i starts at partOffset and holds partCount elements.
size_t partOffset(size_t count, int parts, int index);
size_t partCount(size_t count, int parts, int index);

// Small builders for step lists, named after the IR's actions.
Step send(int peer, Region src);
Step recv(int peer, Region dst);
Step recvReduce(int peer, Region local, Region dst);
Step recvReduceSend(int peerIn, Region local, int peerOut);
Step recvReduceCopySend(int peerIn, Region local, Region dst, int peerOut);
Step recvCopySend(int peerIn, Region dst, int peerOut);
Step copy(Region src, Region dst);
Step reduce(Region src, Region src2, Region dst);
inline Region input(size_t offset, size_t count) { return {Buffer::kInput, offset, count}; }
inline Region output(size_t offset, size_t count) { return {Buffer::kOutput, offset, count}; }
inline Region scratch(size_t offset, size_t count) { return {Buffer::kScratch, offset, count}; }

// Human-readable dump of a plan, for errors and LOOM_DEBUG=TRACE. A step reads "recvReduceSend from 3 to 1 src
// in[0+250]"; plan files (plan_text.h) use the same form.
std::string describe(const RankPlan& plan);
std::string describeStep(const Step& step);
std::string describeRegion(const Region& region);

}  // namespace loom
