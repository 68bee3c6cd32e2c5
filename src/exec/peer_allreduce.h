// One-shot and two-shot AllReduce between ranks that map each other's memory (CUDA IPC), written once for the host
// and for a CUDA device (LOOM_HOST_DEVICE): the GPU executor's kernels call these phases, and the host runs them in
// CI (unit/peer_allreduce_test.cc, ranks as threads) against the reference results.
//
// Both push: a rank writes into its peers' memory and reads only its own. Every ordered pair of ranks has a
// mailbox, owned by the receiver: a FIFO in fifo.h's layout with two Simple slots, one for even calls and one for
// odd ones, whose `head` word is the flag a sender raises when its data is in.
//  - One-shot (small messages, one barrier): each rank pushes its whole input into every peer's mailbox, raises
//    the flags, waits for its own mailboxes' flags, and reduces the nranks inputs into its output.
//  - Two-shot (medium messages, two barriers): the buffer is cut into nranks chunks. Each rank pushes chunk p of
//    its input to rank p (a reduce-scatter), waits, reduces its own chunk from the nranks pieces and pushes the
//    result to every peer (an all-gather), waits, and copies the peers' chunks into its output. The first half of
//    a slot holds the scattered pieces, the second half the gathered results.
// Every rank reduces in rank order, accumulating in the element's compute type (fp32 for fp16 and bf16), so all
// ranks end with the same bits.
//
// Why two slots suffice without credits: a rank that writes slot (call % 2) of a peer's mailbox has passed the
// barrier of the call before, which the peer raised only after it had finished reading the call before that, the
// last to use that slot. Flags are barrier counts, ever growing: `epoch` names this call's first barrier.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/host_device.h"
#include "src/exec/cuda/element_ops.h"
#include "src/exec/lane_runner.h"
#include "transports/fifo_protocol.h"

namespace loom {

constexpr int kMaxPeerRanks = 16;  // ranks a one-shot or two-shot call may span (an NVLink domain's GPUs)

// One rank's share of a call.
struct PeerCall {
  int rank = 0;
  int nranks = 0;
  const unsigned char* input = nullptr;
  unsigned char* output = nullptr;
  size_t count = 0;
  unsigned char* inbox[kMaxPeerRanks] = {};   // this rank's mailbox from rank p, in its own memory ([rank]: unused)
  unsigned char* outbox[kMaxPeerRanks] = {};  // rank p's mailbox from this rank, mapped ([rank]: unused)
  size_t slotBytes = 0;                       // of each mailbox slot
  FifoWords words{};                          // where a mailbox's head word and slots lie
  uint32_t parity = 0;                        // the slot of this call: calls so far, modulo 2
  uint64_t epoch = 0;                         // flag value of this call's first barrier (its second: epoch + 1)
};

// Elements of the two-shot chunk of rank `index`: chunks are whole 16-byte vectors but the last.
LOOM_HOST_DEVICE inline void peerChunk(size_t count, size_t elementBytes, int nranks, int index, size_t* lo,
                                       size_t* hi) {
  const size_t perVector = 16 / elementBytes;
  const size_t vectors = (count + perVector - 1) / perVector;
  const size_t chunk = (vectors + nranks - 1) / nranks * perVector;
  *lo = chunk * index < count ? chunk * index : count;
  *hi = *lo + chunk < count ? *lo + chunk : count;
}
// The largest two-shot chunk of a call, in bytes: what half a slot must hold.
LOOM_HOST_DEVICE inline size_t peerChunkBytes(size_t count, size_t elementBytes, int nranks) {
  size_t lo = 0, hi = 0;
  peerChunk(count, elementBytes, nranks, 0, &lo, &hi);
  return (hi - lo) * elementBytes;
}

template <loomDataType_t kType, class Op>
class PeerAllReduce {
  using Access = MemoryAccess;
  using Format = device::FormatOf<kType>;
  using Element = typename Format::Storage;
  using Compute = typename Format::Compute;

 public:
  // The phases, each run by `workers` threads at once (worker 0 to workers - 1), with a barrier between phases.
  // The data phases split their elements among the workers; signal and arrived are one thread's each.

  // One-shot, phase 1: the input into every peer's mailbox.
  LOOM_HOST_DEVICE static void oneShotPush(const PeerCall& call, size_t worker, size_t workers) {
    for (int p = 0; p < call.nranks; ++p)
      if (p != call.rank)
        copy(slot(call, call.outbox[p]), reinterpret_cast<const Element*>(call.input), call.count, worker, workers);
  }
  // One-shot, phase 2 (after the barrier epoch): the output from the nranks inputs.
  LOOM_HOST_DEVICE static void oneShotReduce(const PeerCall& call, size_t worker, size_t workers) {
    const Element* pieces[kMaxPeerRanks];
    for (int p = 0; p < call.nranks; ++p)
      pieces[p] = p == call.rank ? reinterpret_cast<const Element*>(call.input) : slot(call, call.inbox[p]);
    reduce(reinterpret_cast<Element*>(call.output), pieces, call.nranks, call.rank, call.count, worker, workers,
           nullptr);
  }

  // Two-shot, phase 1: chunk p of the input into rank p's mailbox.
  LOOM_HOST_DEVICE static void twoShotScatter(const PeerCall& call, size_t worker, size_t workers) {
    for (int p = 0; p < call.nranks; ++p) {
      if (p == call.rank) continue;
      size_t lo = 0, hi = 0;
      peerChunk(call.count, sizeof(Element), call.nranks, p, &lo, &hi);
      copy(slot(call, call.outbox[p]), reinterpret_cast<const Element*>(call.input) + lo, hi - lo, worker, workers);
    }
  }
  // Two-shot, phase 2 (after barrier epoch): this rank's chunk, reduced, into its output and every peer's
  // mailbox.
  LOOM_HOST_DEVICE static void twoShotReduce(const PeerCall& call, size_t worker, size_t workers) {
    size_t lo = 0, hi = 0;
    peerChunk(call.count, sizeof(Element), call.nranks, call.rank, &lo, &hi);
    const Element* pieces[kMaxPeerRanks];
    Element* results[kMaxPeerRanks];
    for (int p = 0; p < call.nranks; ++p) {
      pieces[p] = p == call.rank ? reinterpret_cast<const Element*>(call.input) + lo : slot(call, call.inbox[p]);
      results[p] = p == call.rank ? nullptr : gathered(call, call.outbox[p]);
    }
    reduce(reinterpret_cast<Element*>(call.output) + lo, pieces, call.nranks, call.rank, hi - lo, worker, workers,
           results);
  }
  // Two-shot, phase 3 (after barrier epoch + 1): the peers' chunks into the output.
  LOOM_HOST_DEVICE static void twoShotGather(const PeerCall& call, size_t worker, size_t workers) {
    for (int p = 0; p < call.nranks; ++p) {
      if (p == call.rank) continue;
      size_t lo = 0, hi = 0;
      peerChunk(call.count, sizeof(Element), call.nranks, p, &lo, &hi);
      copy(reinterpret_cast<Element*>(call.output) + lo, gathered(call, call.inbox[p]), hi - lo, worker, workers);
    }
  }

  // A barrier's two halves: raise flag `epoch` in peer p's mailbox from this rank (after this rank's writes to it),
  // and whether rank p has raised it in this rank's mailbox (its writes are then visible).
  LOOM_HOST_DEVICE static void signal(const PeerCall& call, int p, uint64_t epoch) {
    Access::storeRelease(reinterpret_cast<uint64_t*>(call.outbox[p] + call.words.head), epoch);
  }
  LOOM_HOST_DEVICE static bool arrived(const PeerCall& call, int p, uint64_t epoch) {
    return Access::loadAcquire(reinterpret_cast<const uint64_t*>(call.inbox[p] + call.words.head)) >= epoch;
  }
  // Whether rank p has given up on the call (its mailbox to this rank is marked aborted).
  LOOM_HOST_DEVICE static bool peerAborted(const PeerCall& call, int p) {
    return Access::loadRelaxed32(reinterpret_cast<const uint32_t*>(call.inbox[p] + call.words.aborted)) != 0;
  }

 private:
  LOOM_HOST_DEVICE static Element* slot(const PeerCall& call, unsigned char* mailbox) {
    return reinterpret_cast<Element*>(mailbox + call.words.slots + fifo::simpleSlotOffset(call.parity, call.slotBytes));
  }
  LOOM_HOST_DEVICE static Element* gathered(const PeerCall& call, unsigned char* mailbox) {
    return reinterpret_cast<Element*>(reinterpret_cast<unsigned char*>(slot(call, mailbox)) + call.slotBytes / 2);
  }

  LOOM_HOST_DEVICE static void copy(Element* to, const Element* from, size_t n, size_t worker, size_t workers) {
    for (size_t i = worker; i < n; i += workers) to[i] = from[i];
  }
  // to[i] (and results[p][i] for each non-null one) = pieces[0][i] op ... op pieces[n-1][i], in rank order. Pieces
  // of other ranks are read past the cache (a peer wrote them since this rank last looked).
  LOOM_HOST_DEVICE static void reduce(Element* to, const Element* const* pieces, int n, int own, size_t count,
                                      size_t worker, size_t workers, Element* const* results) {
    for (size_t i = worker; i < count; i += workers) {
      Compute acc = Format::load(load(pieces[0], i, own == 0));
      for (int p = 1; p < n; ++p) acc = Op::apply(acc, Format::load(load(pieces[p], i, own == p)));
      const Element value = Format::store(acc);
      to[i] = value;
      if (results != nullptr)
        for (int p = 0; p < n; ++p)
          if (results[p] != nullptr) results[p][i] = value;
    }
  }
  LOOM_HOST_DEVICE static Element load(const Element* piece, size_t i, bool own) {
    return own ? piece[i] : Access::read(piece + i);
  }
};

}  // namespace loom
