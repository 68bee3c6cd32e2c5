// One lane of a flat plan run over FIFOs, written once for the host and for a CUDA device (LOOM_HOST_DEVICE): the
// GPU executor's core, which runs a lane per CTA, and which the host runs in CI (unit/lane_runner_test.cc, ranks
// as threads) against the collectives' reference results. It walks the lane with the host executor's own walker
// (LaneWalker, lane_walker.h: the steps, the slicing, the protocol rule), moves messages with the FIFO's own
// arithmetic (fifo_protocol.h) in fifo.h's layout, so either end of a connection may be a host FifoSender or
// FifoReceiver, and combines elements with the CUDA kernels' arithmetic (element_ops.h). What is the device's
// alone: its memory primitives (MemoryAccess, PortableEnds) and the workers' share of the data (apply).
//
// The loads and stores that order memory between ranks are MemoryAccess's: GCC's atomic builtins on the host,
// volatile accesses with system-scope fences on a device (a peer may be another GPU or the host). What it leaves
// to its caller: the FIFOs' memory, each connection's counters (kept from call to call, as FifoSender and
// FifoReceiver keep theirs), and a staging buffer for LL messages. It sends no direct (zero-copy) messages and
// refuses any it receives, and runs calls whose regions all name buffer 0 (collectives, not Send/Recv groups).
// Each slice goes in three steps, so that a kernel can give its data to a whole CTA: prepare() (one thread: has
// the message arrived, is there credit), apply() (every thread its share: 16-byte vectors where aligned), finish()
// (one thread, once every share is visible: post and release).
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/flat_plan.h"
#include "src/base/host_device.h"
#include "src/exec/cuda/element_ops.h"
#include "src/exec/lane_walker.h"
#include "transports/fifo_protocol.h"

namespace loom {

// One end of a connection: its FIFO and the messages it has posted (a sender) or consumed (a receiver) so far.
struct PortableEnd {
  unsigned char* fifo = nullptr;  // null: no connection
  uint32_t depth = 1;
  size_t slotBytes = 0, llSlotBytes = 0;
  uint64_t count = 0;
  uint32_t slot = 0;  // count % depth
};

// What a lane runner needs of the call.
struct LaneCall {
  unsigned char* input;
  unsigned char* output;
  unsigned char* scratch;
  size_t simpleSliceElems, llSliceElems;
  size_t llThresholdBytes;
  int forcedProtocol;  // -1: by size, else a Protocol
};

// Why a lane stopped before its end, as a kernel reports it (0: it did not).
enum LaneFailure : uint32_t {
  kLaneOk = 0,
  kLanePeerAborted = 1,  // a FIFO of the lane was marked aborted
  kLaneBadMessage = 2,   // a message of the wrong size, or a direct one
  kLaneAborted = 3,      // the communicator's abort flag
  kLaneTimedOut = 4,     // no progress within the deadline
};

// 16 bytes of elements, moved as one.
struct alignas(16) Vec16 {
  uint32_t words[4];
};

struct MemoryAccess {
  // 16 bytes at a 16-byte aligned address, past the SM's L1 as read() is.
  LOOM_HOST_DEVICE static Vec16 read16(const void* p) {
#ifdef __CUDA_ARCH__
    // __ldcv reads global memory only; the LL staging buffer is the CTA's shared memory.
    const uint4 v = __isGlobal(p) ? __ldcv(reinterpret_cast<const uint4*>(p)) : *reinterpret_cast<const uint4*>(p);
    return Vec16{{v.x, v.y, v.z, v.w}};
#else
    return *static_cast<const Vec16*>(p);
#endif
  }
  // An element of a message or a buffer. On a device, past the SM's own L1 cache, which does not see a peer's
  // later writes to a FIFO slot it has read before.
  template <class T>
  LOOM_HOST_DEVICE static T read(const T* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const volatile T*>(p);
#else
    return *p;
#endif
  }
  LOOM_HOST_DEVICE static uint64_t loadAcquire(const uint64_t* p) {
#ifdef __CUDA_ARCH__
    uint64_t value = *reinterpret_cast<const volatile uint64_t*>(p);
    __threadfence_system();
    return value;
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
  }
  LOOM_HOST_DEVICE static uint64_t loadRelaxed(const uint64_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const volatile uint64_t*>(p);
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
  }
  LOOM_HOST_DEVICE static uint32_t loadRelaxed32(const uint32_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const volatile uint32_t*>(p);
#else
    return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
  }
  LOOM_HOST_DEVICE static void storeRelaxed(uint64_t* p, uint64_t value) {
#ifdef __CUDA_ARCH__
    *reinterpret_cast<volatile uint64_t*>(p) = value;
#else
    __atomic_store_n(p, value, __ATOMIC_RELAXED);
#endif
  }
  LOOM_HOST_DEVICE static void storeRelease(uint64_t* p, uint64_t value) {
#ifdef __CUDA_ARCH__
    __threadfence_system();
    *reinterpret_cast<volatile uint64_t*>(p) = value;
#else
    __atomic_store_n(p, value, __ATOMIC_RELEASE);
#endif
  }
};

// The ends of a lane's channel as a device reaches them (LaneWalker's Ports): each end's FIFO through
// fifo_protocol.h's arithmetic and MemoryAccess's loads and stores. An LL message is decoded into, and encoded
// from, the staging buffer. Direct (zero-copy) messages are refused.
struct PortableEnds {
  using In = PortableEnd;
  using Out = PortableEnd;
  FifoWords words;
  PortableEnd* recvFrom;  // by peer
  PortableEnd* sendTo;
  uint32_t* staging;  // llSlotBytes / 8 words

  LOOM_HOST_DEVICE PortableEnd* receiver(int peer) const { return &recvFrom[peer]; }
  LOOM_HOST_DEVICE PortableEnd* sender(int peer) const { return &sendTo[peer]; }

  LOOM_HOST_DEVICE LaneStatus receive(PortableEnd* in, Protocol protocol, size_t bytes, Arrival* arrival) const {
    using Access = MemoryAccess;
    if (protocol == Protocol::kSimple) {
      if (Access::loadAcquire(word(in, words.head)) <= in->count)
        return aborted(in) ? LaneStatus::kPeerAborted : LaneStatus::kWaiting;
      const uint64_t size = Access::loadRelaxed(word(in, words.sizes) + in->slot);
      if (fifo::simpleSizeDirect(size)) return LaneStatus::kBadMessage;
      *arrival = Arrival{slots(in) + fifo::simpleSlotOffset(in->slot, in->slotBytes), fifo::simpleSizeBytes(size), false};
      return LaneStatus::kRan;
    }
    const uint32_t flag = fifo::llFlag(in->count);
    const uint64_t* lines = reinterpret_cast<const uint64_t*>(
        slots(in) + fifo::llSlotOffset(in->slot, in->depth, in->slotBytes, in->llSlotBytes));
    const uint64_t first = Access::loadRelaxed(lines);
    if (fifo::llWordFlag(first) != flag) return aborted(in) ? LaneStatus::kPeerAborted : LaneStatus::kWaiting;
    *arrival = Arrival{staging, fifo::llWordData(first), false};
    if (arrival->bytes != bytes) return LaneStatus::kRan;  // the walker refuses it; its data stays unread
    for (size_t i = 0; i < fifo::llDataWords(bytes); ++i) {
      const uint64_t line = Access::loadRelaxed(lines + 1 + i);
      if (fifo::llWordFlag(line) != flag) return LaneStatus::kWaiting;  // not all there yet
      staging[i] = fifo::llWordData(line);
    }
    return LaneStatus::kRan;
  }

  LOOM_HOST_DEVICE LaneStatus reserve(PortableEnd* out, Protocol protocol, void** slot) const {
    if (aborted(out)) return LaneStatus::kPeerAborted;
    if (!fifo::hasCredit(out->count, MemoryAccess::loadAcquire(word(out, words.tail)), out->depth))
      return LaneStatus::kWaiting;
    *slot = protocol == Protocol::kSimple
                ? static_cast<void*>(slots(out) + fifo::simpleSlotOffset(out->slot, out->slotBytes))
                : static_cast<void*>(staging);
    return LaneStatus::kRan;
  }

  LOOM_HOST_DEVICE void post(PortableEnd* out, Protocol protocol, size_t bytes, bool direct) const {
    using Access = MemoryAccess;
    (void)direct;  // never: this end sends no direct messages
    if (protocol == Protocol::kSimple) {
      Access::storeRelaxed(word(out, words.sizes) + out->slot, fifo::simpleSizeWord(bytes, false));
    } else {
      const uint32_t flag = fifo::llFlag(out->count);
      uint64_t* lines = reinterpret_cast<uint64_t*>(
          slots(out) + fifo::llSlotOffset(out->slot, out->depth, out->slotBytes, out->llSlotBytes));
      const size_t dataWords = fifo::llDataWords(bytes);
      if (bytes % 4 != 0) {  // the last word's bytes past the message are zero, as the host sender makes them
        unsigned char* tail = reinterpret_cast<unsigned char*>(staging) + bytes;
        for (size_t b = bytes % 4; b < 4; ++b) *tail++ = 0;
      }
      for (size_t i = 0; i < dataWords; ++i) Access::storeRelaxed(lines + 1 + i, fifo::llWord(staging[i], flag));
      Access::storeRelease(lines, fifo::llWord(static_cast<uint32_t>(bytes), flag));
    }
    out->slot = fifo::nextSlot(out->slot, out->depth);
    Access::storeRelease(word(out, words.head), ++out->count);
  }

  LOOM_HOST_DEVICE void release(PortableEnd* in) const {
    in->slot = fifo::nextSlot(in->slot, in->depth);
    MemoryAccess::storeRelease(word(in, words.tail), ++in->count);
  }

 private:
  LOOM_HOST_DEVICE static uint64_t* word(const PortableEnd* end, uint32_t offset) {
    return reinterpret_cast<uint64_t*>(end->fifo + offset);
  }
  LOOM_HOST_DEVICE unsigned char* slots(const PortableEnd* end) const { return end->fifo + words.slots; }
  LOOM_HOST_DEVICE bool aborted(const PortableEnd* end) const {
    return MemoryAccess::loadRelaxed32(reinterpret_cast<uint32_t*>(end->fifo + words.aborted)) != 0;
  }
};

// A lane walked by LaneWalker over PortableEnds, its data moved by every worker of a CTA (apply).
template <loomDataType_t kType, class Op>
class LaneRunner {
  using Access = MemoryAccess;
  using Format = device::FormatOf<kType>;
  using Element = typename Format::Storage;
  using Walker = LaneWalker<FlatLaneView, PortableEnds>;

 public:
  // `recvFrom[p]` and `sendTo[p]`: the ends of the lane's channel for peer p. `llStaging`: llSlotBytes / 8 words.
  LOOM_HOST_DEVICE void start(const FlatLaneView& lane, const LaneCall& call, const FifoWords& words,
                              PortableEnd* recvFrom, PortableEnd* sendTo, uint32_t* llStaging) {
    lane_ = lane;
    call_ = call;
    ends_ = PortableEnds{words, recvFrom, sendTo, llStaging};
    walker_.start(lane_, SliceRule{sizeof(Element), call.llThresholdBytes, call.llSliceElems, call.simpleSliceElems,
                                   call.forcedProtocol});
  }
  LOOM_HOST_DEVICE bool done() const { return walker_.done(); }

  // One slice as prepare() finds it ready: what apply() does and what finish() posts and releases. Plain data, so
  // that a kernel can keep it in shared memory for every thread of a CTA.
  struct Slice {
    typename Walker::Slice walk;
    Action action;
    size_t n;  // elements (0: an empty slice, nothing to move)
    Element* dst;
    const Element* src;
    const Element* src2;
    const Element* incoming;  // the received message (LL: decoded into the staging buffer)
    Element* slot;            // where the message to send goes (LL: the staging buffer)
  };

  // Whether the next slice can run (kRan: *slice says what it does), and if not, why.
  LOOM_HOST_DEVICE LaneStatus prepare(Slice* slice) {
    const LaneStatus status = walker_.prepare(ends_, &slice->walk);
    if (status != LaneStatus::kRan) return status;
    const typename Walker::Slice& walk = slice->walk;
    const Step& step = *walk.step;
    slice->action = step.action;
    slice->n = walk.count();
    slice->dst = at(step.dst, walk.lo);
    slice->src = at(step.src, walk.lo);
    slice->src2 = at(step.src2, walk.lo);
    slice->incoming = static_cast<const Element*>(walk.arrival.data);
    slice->slot = static_cast<Element*>(walk.slot);
    return LaneStatus::kRan;
  }

  // The slice's copies and reductions, shared by `workers` threads (this one is `worker`); a slice whose copy
  // overlaps itself within a buffer is worker 0's alone.
  LOOM_HOST_DEVICE static void apply(const Slice& s, size_t worker, size_t workers) {
    const size_t n = s.n;
    if (n == 0) return;
    switch (s.action) {
      case Action::kSend:
        copy(s.slot, s.src, n, worker, workers);
        break;
      case Action::kRecv:
        copy(s.dst, s.incoming, n, worker, workers);
        break;
      case Action::kRecvReduce:
        reduce(s.dst, s.src, s.incoming, n, worker, workers);
        break;
      case Action::kRecvReduceSend:
        reduce(s.slot, s.src, s.incoming, n, worker, workers);
        break;
      case Action::kRecvReduceCopySend:
        reduceTwice(s.dst, s.slot, s.src, s.incoming, n, worker, workers);
        break;
      case Action::kRecvCopySend:
        copyTwice(s.dst, s.slot, s.incoming, n, worker, workers);
        break;
      case Action::kCopy:
        copy(s.dst, s.src, n, worker, workers);
        break;
      case Action::kReduce:
        reduce(s.dst, s.src, s.src2, n, worker, workers);
        break;
    }
  }

  // After apply() (every worker's part visible): posts the message, releases the one received, moves on.
  LOOM_HOST_DEVICE void finish(const Slice& slice) { walker_.finish(ends_, slice.walk); }

 private:
  LOOM_HOST_DEVICE Element* at(const Region& region, size_t lo) const {
    unsigned char* base = region.buffer == Buffer::kInput    ? call_.input
                          : region.buffer == Buffer::kOutput ? call_.output
                                                             : call_.scratch;
    return reinterpret_cast<Element*>(base) + region.offset + lo;
  }

  static constexpr size_t kPerVector = sizeof(Vec16) / sizeof(Element);
  LOOM_HOST_DEVICE static bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(Vec16) == 0; }
  union Lanes {
    Vec16 raw;
    Element elements[kPerVector];
  };
  LOOM_HOST_DEVICE static Lanes load16(const Element* p) {
    Lanes lanes;
    lanes.raw = Access::read16(p);
    return lanes;
  }
  LOOM_HOST_DEVICE static void store16(Element* p, const Lanes& lanes) { *reinterpret_cast<Vec16*>(p) = lanes.raw; }

  // to[i] = from[i]: whole 16-byte vectors where both are aligned, then elements, split among the workers.
  LOOM_HOST_DEVICE static void copy(Element* to, const Element* from, size_t n, size_t worker, size_t workers) {
    if (to == from) return;
    if (to < from + n && from < to + n) {  // overlapping, within a buffer: one worker, in the safe direction
      if (worker != 0) return;
      if (to > from) {
        for (size_t i = n; i-- > 0;) to[i] = Access::read(from + i);
      } else {
        for (size_t i = 0; i < n; ++i) to[i] = Access::read(from + i);
      }
      return;
    }
    size_t done = 0;
    if (aligned(to) && aligned(from)) {
      const size_t vectors = n / kPerVector;
      for (size_t v = worker; v < vectors; v += workers) store16(to + v * kPerVector, load16(from + v * kPerVector));
      done = vectors * kPerVector;
    }
    for (size_t i = done + worker; i < n; i += workers) to[i] = Access::read(from + i);
  }
  // to[i] = second[i] = from[i].
  LOOM_HOST_DEVICE static void copyTwice(Element* to, Element* second, const Element* from, size_t n, size_t worker,
                                         size_t workers) {
    copy(to, from, n, worker, workers);
    copy(second, from, n, worker, workers);
  }
  // to[i] = a[i] op b[i]: element i depends on element i alone, so `to` may be a or b.
  LOOM_HOST_DEVICE static void reduce(Element* to, const Element* a, const Element* b, size_t n, size_t worker,
                                      size_t workers) {
    reduceTwice(to, nullptr, a, b, n, worker, workers);
  }
  // to[i] = a[i] op b[i], and second[i] too unless second is null.
  LOOM_HOST_DEVICE static void reduceTwice(Element* to, Element* second, const Element* a, const Element* b, size_t n,
                                           size_t worker, size_t workers) {
    size_t done = 0;
    if (aligned(to) && aligned(a) && aligned(b) && (second == nullptr || aligned(second))) {
      const size_t vectors = n / kPerVector;
      for (size_t v = worker; v < vectors; v += workers) {
        const size_t i = v * kPerVector;
        const Lanes x = load16(a + i), y = load16(b + i);
        Lanes z;
        for (size_t j = 0; j < kPerVector; ++j)
          z.elements[j] = device::combine<kType, Op>(x.elements[j], y.elements[j]);
        store16(to + i, z);
        if (second != nullptr) store16(second + i, z);
      }
      done = vectors * kPerVector;
    }
    for (size_t i = done + worker; i < n; i += workers) {
      const Element value = device::combine<kType, Op>(Access::read(a + i), Access::read(b + i));
      to[i] = value;
      if (second != nullptr) second[i] = value;
    }
  }

  FlatLaneView lane_{};
  LaneCall call_{};
  PortableEnds ends_{};
  Walker walker_;
};

}  // namespace loom
