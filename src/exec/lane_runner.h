// One lane of a flat plan run over FIFOs, written once for the host and for a CUDA device (LOOM_HOST_DEVICE): the
// GPU executor's core, which runs a lane per CTA, and which the host runs in CI (unit/lane_runner_test.cc, ranks
// as threads) against the collectives' reference results. It walks the lane as the host executor does
// (BasicLaneCursor, sliceBounds), moves messages with the FIFO's own arithmetic (fifo_protocol.h) in fifo.h's
// layout, so either end of a connection may be a host FifoSender or FifoReceiver, and combines elements with the
// CUDA kernels' arithmetic (element_ops.h).
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
#include "src/core/host_device.h"
#include "src/exec/cuda/element_ops.h"
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

enum class LaneStatus : uint8_t { kRan, kWaiting, kDone, kPeerAborted, kBadMessage };

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

template <loomDataType_t kType, class Op>
class LaneRunner {
  using Access = MemoryAccess;
  using Format = device::FormatOf<kType>;
  using Element = typename Format::Storage;

 public:
  // `recvFrom[p]` and `sendTo[p]`: the ends of the lane's channel for peer p. `llStaging`: llSlotBytes / 8 words.
  LOOM_HOST_DEVICE void start(const FlatLaneView& lane, const LaneCall& call, const FifoWords& words,
                              PortableEnd* recvFrom, PortableEnd* sendTo, uint32_t* llStaging) {
    lane_ = lane;
    call_ = call;
    words_ = words;
    recvFrom_ = recvFrom;
    sendTo_ = sendTo;
    staging_ = llStaging;
    cursor_.start(lane_, SlicesOf{this});
  }
  LOOM_HOST_DEVICE bool done() const { return cursor_.done(); }

  // One slice as prepare() finds it ready: what apply() does and what finish() posts and releases. Plain data, so
  // that a kernel can keep it in shared memory for every thread of a CTA.
  struct Slice {
    Action action;
    Protocol protocol;
    size_t n;      // elements (0: an empty slice, nothing to move)
    size_t bytes;  // of its message
    Element* dst;
    const Element* src;
    const Element* src2;
    const Element* incoming;  // the received message (LL: decoded into the staging buffer)
    Element* slot;            // where the message to send goes (LL: the staging buffer)
    PortableEnd* in;
    PortableEnd* out;
  };

  // Whether the next slice can run (kRan: *slice says what it does), and if not, why.
  LOOM_HOST_DEVICE LaneStatus prepare(Slice* slice) {
    if (cursor_.done()) return LaneStatus::kDone;
    const Step& step = lane_.stepAt(cursor_.step());
    const size_t count = step.count();
    const Protocol protocol = protocolFor(count);
    size_t lo = 0, hi = 0;
    sliceBounds(count, sliceElems(protocol), cursor_.round(), &lo, &hi);
    *slice = Slice{step.action, protocol, hi - lo, (hi - lo) * sizeof(Element), nullptr, nullptr, nullptr, nullptr,
                   nullptr,     nullptr,  nullptr};
    if (lo == hi) return LaneStatus::kRan;
    PortableEnd* in = actionReceives(step.action) ? &recvFrom_[step.recvPeer] : nullptr;
    PortableEnd* out = actionSends(step.action) ? &sendTo_[step.sendPeer] : nullptr;
    if (in != nullptr) {
      LaneStatus arrived = receive(in, protocol, slice->bytes, &slice->incoming);
      if (arrived != LaneStatus::kRan) return arrived;
    }
    if (out != nullptr) {
      if (aborted(out)) return LaneStatus::kPeerAborted;
      if (!fifo::hasCredit(out->count, Access::loadAcquire(word(out, words_.tail)), out->depth))
        return LaneStatus::kWaiting;
      slice->slot = protocol == Protocol::kSimple
                        ? reinterpret_cast<Element*>(slots(out) + fifo::simpleSlotOffset(out->slot, out->slotBytes))
                        : reinterpret_cast<Element*>(staging_);
    }
    slice->in = in;
    slice->out = out;
    slice->dst = at(step.dst, lo);
    slice->src = at(step.src, lo);
    slice->src2 = at(step.src2, lo);
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
  LOOM_HOST_DEVICE void finish(const Slice& slice) {
    if (slice.out != nullptr) post(slice.out, slice.protocol, slice.bytes);
    if (slice.in != nullptr) release(slice.in);
    cursor_.next(SlicesOf{this});
  }

 private:
  struct SlicesOf {
    const LaneRunner* runner;
    LOOM_HOST_DEVICE size_t operator()(const Step& step) const {
      return sliceCount(step.count(), runner->sliceElems(runner->protocolFor(step.count())));
    }
  };

  LOOM_HOST_DEVICE Protocol protocolFor(size_t count) const {
    if (call_.forcedProtocol >= 0) return static_cast<Protocol>(call_.forcedProtocol);
    return count * sizeof(Element) <= call_.llThresholdBytes ? Protocol::kLL : Protocol::kSimple;
  }
  LOOM_HOST_DEVICE size_t sliceElems(Protocol protocol) const {
    return protocol == Protocol::kLL ? call_.llSliceElems : call_.simpleSliceElems;
  }

  LOOM_HOST_DEVICE uint64_t* word(const PortableEnd* end, uint32_t offset) const {
    return reinterpret_cast<uint64_t*>(end->fifo + offset);
  }
  LOOM_HOST_DEVICE unsigned char* slots(const PortableEnd* end) const { return end->fifo + words_.slots; }
  LOOM_HOST_DEVICE bool aborted(const PortableEnd* end) const {
    return Access::loadRelaxed32(reinterpret_cast<uint32_t*>(end->fifo + words_.aborted)) != 0;
  }

  LOOM_HOST_DEVICE LaneStatus receive(PortableEnd* in, Protocol protocol, size_t bytes, const Element** incoming) {
    if (protocol == Protocol::kSimple) {
      if (Access::loadAcquire(word(in, words_.head)) <= in->count)
        return aborted(in) ? LaneStatus::kPeerAborted : LaneStatus::kWaiting;
      uint64_t size = Access::loadRelaxed(word(in, words_.sizes) + in->slot);
      if (fifo::simpleSizeDirect(size) || fifo::simpleSizeBytes(size) != bytes) return LaneStatus::kBadMessage;
      *incoming = reinterpret_cast<const Element*>(slots(in) + fifo::simpleSlotOffset(in->slot, in->slotBytes));
      return LaneStatus::kRan;
    }
    const uint32_t flag = fifo::llFlag(in->count);
    const uint64_t* lines = reinterpret_cast<const uint64_t*>(
        slots(in) + fifo::llSlotOffset(in->slot, in->depth, in->slotBytes, in->llSlotBytes));
    const uint64_t first = Access::loadRelaxed(lines);
    if (fifo::llWordFlag(first) != flag) return aborted(in) ? LaneStatus::kPeerAborted : LaneStatus::kWaiting;
    if (fifo::llWordData(first) != bytes) return LaneStatus::kBadMessage;
    for (size_t i = 0; i < fifo::llDataWords(bytes); ++i) {
      uint64_t line = Access::loadRelaxed(lines + 1 + i);
      if (fifo::llWordFlag(line) != flag) return LaneStatus::kWaiting;  // not all there yet
      staging_[i] = fifo::llWordData(line);
    }
    *incoming = reinterpret_cast<const Element*>(staging_);
    return LaneStatus::kRan;
  }

  LOOM_HOST_DEVICE void post(PortableEnd* out, Protocol protocol, size_t bytes) {
    if (protocol == Protocol::kSimple) {
      Access::storeRelaxed(word(out, words_.sizes) + out->slot, fifo::simpleSizeWord(bytes, false));
    } else {
      const uint32_t flag = fifo::llFlag(out->count);
      uint64_t* lines = reinterpret_cast<uint64_t*>(
          slots(out) + fifo::llSlotOffset(out->slot, out->depth, out->slotBytes, out->llSlotBytes));
      const size_t dataWords = fifo::llDataWords(bytes);
      if (bytes % 4 != 0) {  // the last word's bytes past the message are zero, as the host sender makes them
        unsigned char* tail = reinterpret_cast<unsigned char*>(staging_) + bytes;
        for (size_t b = bytes % 4; b < 4; ++b) *tail++ = 0;
      }
      for (size_t i = 0; i < dataWords; ++i) Access::storeRelaxed(lines + 1 + i, fifo::llWord(staging_[i], flag));
      Access::storeRelease(lines, fifo::llWord(static_cast<uint32_t>(bytes), flag));
    }
    out->slot = fifo::nextSlot(out->slot, out->depth);
    Access::storeRelease(word(out, words_.head), ++out->count);
  }

  LOOM_HOST_DEVICE void release(PortableEnd* in) {
    in->slot = fifo::nextSlot(in->slot, in->depth);
    Access::storeRelease(word(in, words_.tail), ++in->count);
  }

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
  FifoWords words_{};
  PortableEnd* recvFrom_ = nullptr;
  PortableEnd* sendTo_ = nullptr;
  uint32_t* staging_ = nullptr;
  BasicLaneCursor<FlatLaneView> cursor_;
};

}  // namespace loom
