// The lane walker: how every executor runs one lane of a plan, written once for the host executor
// (host_executor.cc: threads, host memory, FifoSender and FifoReceiver) and for the GPU executor (lane_runner.h:
// a CTA per lane, device memory, the FIFOs reached through fifo_protocol.h's arithmetic). It decodes the steps,
// cuts them into slices with the one protocol rule (SliceRule, fifo::protocolFor), walks the slices in the plan's
// order (BasicLaneCursor), and for each slice takes the message it receives, checks its size, reserves the slot
// it sends into, and after the caller has moved the data posts, releases and moves on. The tuner's cost walk and
// the simulator cut steps with the same SliceRule.
//
// What it leaves to its Ports (one connection end per peer of the lane's channel) is the memory: how a message
// is polled, how a slot is reserved, posted and released. What it leaves to its caller is the data: the copies and
// reductions of a slice (apply), which a CTA shares among its threads and the host runs with its SIMD kernels.
//
//   struct Ports {
//     using In = ...; using Out = ...;               // a receiving and a sending end
//     In* receiver(int peer); Out* sender(int peer);  // the lane channel's ends for `peer`
//     // The next message on `in`, for a slice of `bytes` (some ends need the size to read it): kRan with
//     // *arrival set, kWaiting, kPeerAborted (its FIFO marked and empty) or kBadMessage (one it cannot take).
//     LaneStatus receive(In* in, Protocol protocol, size_t bytes, Arrival* arrival);
//     // Room for the next message on `out`: kRan with *slot, kWaiting, or kPeerAborted.
//     LaneStatus reserve(Out* out, Protocol protocol, void** slot);
//     void post(Out* out, Protocol protocol, size_t bytes, bool direct);
//     void release(In* in);
//   };
//
// LOOM_HOST_DEVICE code: no standard library beyond fixed-width integers, so that nvcc compiles it for a device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/plan.h"
#include "src/base/host_device.h"
#include "transports/fifo_protocol.h"

namespace loom {

// How the steps of a call are cut into slices: the protocol of each step (fifo::protocolFor) and the elements
// of one slot per protocol. Sender and receiver of every connection use the same rule on the same step sizes.
struct SliceRule {
  size_t elementBytes;
  size_t llThresholdBytes;  // steps of at most this many bytes go as LL messages
  size_t llSliceElems;      // elements of one LL slot, of one Simple slot (at least 1)
  size_t simpleSliceElems;
  int forcedProtocol;  // -1: by size, else a Protocol

  // The rule for slots of `llSliceBytes` and `simpleSliceBytes` of payload, in whole elements.
  LOOM_HOST_DEVICE static SliceRule of(size_t elementBytes, size_t llThresholdBytes, size_t llSliceBytes,
                                       size_t simpleSliceBytes, int forcedProtocol) {
    const size_t ll = llSliceBytes / elementBytes, simple = simpleSliceBytes / elementBytes;
    return SliceRule{elementBytes, llThresholdBytes, ll > 0 ? ll : 1, simple > 0 ? simple : 1, forcedProtocol};
  }
  LOOM_HOST_DEVICE Protocol protocolFor(size_t count) const {
    return fifo::protocolFor(count * elementBytes, llThresholdBytes, forcedProtocol);
  }
  LOOM_HOST_DEVICE size_t sliceElems(Protocol protocol) const {
    return protocol == Protocol::kLL ? llSliceElems : simpleSliceElems;
  }
  // How many slices a step of `count` elements has.
  LOOM_HOST_DEVICE size_t slicesOf(size_t count) const { return sliceCount(count, sliceElems(protocolFor(count))); }
};

enum class LaneStatus : uint8_t { kRan, kWaiting, kDone, kPeerAborted, kBadMessage };

// A message as a receiving end gives it: where its payload is (a DirectDescriptor when `direct`), its size.
struct Arrival {
  const void* data;
  size_t bytes;
  bool direct;
};

template <class LaneView, class Ports>
class LaneWalker {
 public:
  using In = typename Ports::In;
  using Out = typename Ports::Out;

  // One slice as prepare() finds it ready. Plain data (a kernel keeps it in shared memory for a whole CTA).
  struct Slice {
    const Step* step;
    Protocol protocol;
    size_t lo, hi;  // its elements of the step (lo == hi: an empty slice, nothing to move)
    size_t bytes;   // of its message
    In* in;         // the end it receives from, and what arrived (null: it receives nothing)
    Arrival arrival;
    Out* out;  // the end it sends to, and the slot reserved there (null: it sends nothing)
    void* slot;
    LOOM_HOST_DEVICE size_t count() const { return hi - lo; }
  };

  // `lane` must outlive the walk.
  LOOM_HOST_DEVICE void start(const LaneView& lane, const SliceRule& rule) {
    rule_ = rule;
    cursor_.start(lane, SlicesOf{&rule_});
    lane_ = &lane;
  }
  LOOM_HOST_DEVICE bool done() const { return cursor_.done(); }
  LOOM_HOST_DEVICE const LaneView& lane() const { return *lane_; }
  // The step of the slice to run next (while not done).
  LOOM_HOST_DEVICE const Step& step() const { return lane_->stepAt(cursor_.step()); }
  LOOM_HOST_DEVICE size_t round() const { return cursor_.round(); }
  LOOM_HOST_DEVICE const SliceRule& rule() const { return rule_; }

  // Whether the next slice can run (kRan: *slice says what it moves), and if not, why. A slice that receives
  // a message of another size than its own is kBadMessage, with the message in slice->arrival.
  LOOM_HOST_DEVICE LaneStatus prepare(Ports& ports, Slice* slice) const {
    if (cursor_.done()) return LaneStatus::kDone;
    const Step& current = step();
    const size_t count = current.count();
    const Protocol protocol = rule_.protocolFor(count);
    size_t lo = 0, hi = 0;
    sliceBounds(count, rule_.sliceElems(protocol), cursor_.round(), &lo, &hi);
    *slice = Slice{&current, protocol, lo, hi, (hi - lo) * rule_.elementBytes, nullptr, Arrival{nullptr, 0, false},
                   nullptr,  nullptr};
    if (lo == hi) return LaneStatus::kRan;
    if (actionReceives(current.action)) {
      slice->in = ports.receiver(current.recvPeer);
      const LaneStatus arrived = ports.receive(slice->in, protocol, slice->bytes, &slice->arrival);
      if (arrived != LaneStatus::kRan) return arrived;
      if (slice->arrival.bytes != slice->bytes) return LaneStatus::kBadMessage;
    }
    if (actionSends(current.action)) {
      slice->out = ports.sender(current.sendPeer);
      const LaneStatus room = ports.reserve(slice->out, protocol, &slice->slot);
      if (room != LaneStatus::kRan) return room;
    }
    return LaneStatus::kRan;
  }

  // Once the slice's data is in place (in its slot; every worker's share visible): posts its message (`direct`:
  // the slot holds a DirectDescriptor), releases the one it received, moves to the next slice.
  LOOM_HOST_DEVICE void finish(Ports& ports, const Slice& slice, bool direct = false) {
    if (slice.out != nullptr) ports.post(slice.out, slice.protocol, slice.bytes, direct);
    if (slice.in != nullptr) ports.release(slice.in);
    cursor_.next(SlicesOf{&rule_});
  }

 private:
  struct SlicesOf {
    const SliceRule* rule;
    LOOM_HOST_DEVICE size_t operator()(const Step& step) const { return rule->slicesOf(step.count()); }
  };

  const LaneView* lane_;
  SliceRule rule_;
  BasicLaneCursor<LaneView> cursor_;
};

}  // namespace loom
