// The FIFO of slots every connection carries its messages through, and the two protocols that write it.
//
// The receiver owns the memory: a header with head/tail counters, then `depth` slots of `slotBytes`. The sender
// may post a message into slot (posted % depth) once the receiver has released it (credit flow control:
// posted - tail < depth). Two protocols share the memory:
//  - Simple: the message is copied into the slot, its size stored, then `head` is published with a release
//    store. For bandwidth: one plain copy in, one out, a fence per slot.
//  - LL (low latency): each 8-byte word carries 4 bytes of data and a 4-byte flag derived from the slot's
//    sequence number, written with one 64-bit store, so the receiver needs no fence and no counter read: it
//    polls the words themselves. Word 0 carries the message size. Half of every slot is flags.
// Each message is at most one slot. A Simple message may instead be a DirectDescriptor: where the payload lies
// in the sender's registered memory, for the receiver to read itself (one copy instead of two). Both ends keep
// the abort flag in the header, so an error on either side is seen by the other at its next poll.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transports/fifo_protocol.h"

namespace loom {

const char* protocolName(Protocol protocol);

constexpr uint32_t kFifoMagic = 0x6c6d6669;  // "lmfi"
constexpr int kMaxFifoDepth = 64;

struct FifoShape {
  int depth;
  size_t slotBytes;  // Simple slot size; LL uses the first llSlotBytes of each slot
  size_t llSlotBytes;
};

struct alignas(64) FifoHeader {
  std::atomic<uint32_t> magic;  // stored last by the receiver, with release: the FIFO is ready
  uint32_t depth;
  uint64_t slotBytes;
  uint64_t llSlotBytes;
  alignas(64) std::atomic<uint64_t> head;  // messages posted by the sender
  alignas(64) std::atomic<uint64_t> tail;  // messages released by the receiver
  alignas(64) std::atomic<uint32_t> senderAttached;
  std::atomic<uint32_t> aborted;  // an AbortCode, set by either side when it gives up on the connection
  std::atomic<uint64_t> origin;   // the first failure behind the abort (packOrigin; 0: not known), set before it
  alignas(64) std::atomic<uint64_t> sizes[kMaxFifoDepth];  // bytes of each posted Simple message
  // A FIFO that a proxy thread of this process serves (network transports) has a doorbell, an eventfd: while
  // the proxy sleeps (`sleeping` set), post(), release() and abort() ring it. Shared-memory FIFOs have none (-1)
  // and pay one comparison for it.
  alignas(64) std::atomic<uint32_t> sleeping;
  int32_t doorbell;
  // LOOM_CHECKSUM=2, a message sent again (FifoReceiver::askResend, FifoSender::rewrite): the number, plus one, of
  // the message the receiver asks for again (it keeps the slot meanwhile), and of the last one the sender rewrote.
  alignas(64) std::atomic<uint64_t> resendWanted;
  std::atomic<uint64_t> resent;
};

// Rings `header`'s doorbell if its proxy sleeps; call after the store the proxy must see. The fence pairs with
// the proxy's between setting `sleeping` and looking at the FIFO again: one of the two sees the other's store.
void ringDoorbell(FifoHeader* header);
inline void ringIfProxied(FifoHeader* header) {
  if (header->doorbell >= 0) ringDoorbell(header);
}

// Stores `code` (an AbortCode) in `header`, and `origin` before it unless an origin is there already: the first
// failure known on a connection stays, whichever end marks it later.
inline void markFifoAborted(FifoHeader* header, uint32_t code, uint64_t origin) {
  uint64_t none = 0;
  if (origin != 0) header->origin.compare_exchange_strong(none, origin, std::memory_order_relaxed);
  header->aborted.store(code, std::memory_order_release);
}

// Bytes of FIFO memory for `shape` (header plus slots, page aligned).
size_t fifoBytes(const FifoShape& shape);
// Initialises fresh memory as an empty FIFO; publishes the magic last.
void fifoInit(void* memory, const FifoShape& shape);
// For memory the host cannot initialise in place (a CUDA device's): the FIFO's first fifoHeaderBytes(), as
// fifoInit leaves them, written into `header`; the caller zeroes the rest of the FIFO and copies this over it.
size_t fifoHeaderBytes();
void fifoHeaderImage(void* header, const FifoShape& shape);
// Largest payload of one message for a protocol.
size_t fifoPayloadBytes(const FifoShape& shape, Protocol protocol);

// A shareable allocation (a memfd) that holds a payload: file descriptor `fd` in the sender's process, mapped
// there at `base` for `bytes`; `inode` tells a reused descriptor number from the file it named. fd < 0: none.
struct SharedRegion {
  int32_t fd = -1;
  uint64_t base = 0;
  uint64_t bytes = 0;
  uint64_t inode = 0;
};

// The payload of a direct message: `bytes` at `address` in process `pid`, readable until the receiver releases
// the message. When `region` names the memfd holding it, the receiver may map that file and read with plain
// loads; otherwise it copies with process_vm_readv.
struct DirectDescriptor {
  uint64_t address;
  uint64_t bytes;
  int32_t pid;
  SharedRegion region;
};

// A FIFO as one end sees it in its own address space.
struct FifoMemory {
  FifoHeader* header = nullptr;
  std::byte* slots = nullptr;
};

// The FIFO whose memory starts at `base` (as laid out by fifoInit).
FifoMemory fifoView(void* base);
// Where the header's words and the slots lie from the FIFO's start.
FifoWords fifoWords();

class FifoSender {
 public:
  explicit FifoSender(FifoMemory memory);
  // Where to write the next message (up to fifoPayloadBytes), or nullptr while the FIFO is full.
  void* reserve(Protocol protocol);
  // Publishes the message written at the pointer reserve() returned. `direct`: it is a DirectDescriptor for a
  // payload of `bytes` (Simple only).
  void post(Protocol protocol, size_t bytes, bool direct = false);
  // LOOM_CHECKSUM=2: keeps a copy of the message about to be posted, `bytes` of it as written at the pointer
  // reserve() returned, until the receiver releases it, so that it can be written again. Call before post().
  void retain(Protocol protocol, size_t bytes);
  // Where the receiver asked for a retained message again (askResend): copies it back into its slot (Simple) or
  // this sender's LL staging and returns where it lies (*bytes as retained), for the caller to look at (the fault
  // hook) and then republish with repost(); *direct: it is a DirectDescriptor (and its checksum). nullptr: no
  // request waits.
  void* rewrite(size_t* bytes, bool* direct);
  // For a proxy that takes the message asked for again off the network (tcp under LOOM_CHECKSUM=2): where to write
  // message number `message`, `bytes` of `protocol`, again (its slot, or this sender's LL staging), to republish
  // with repost(). nullptr: the receiver is not waiting for that message, or it does not fit.
  void* rewriteAt(uint64_t message, Protocol protocol, size_t bytes);
  void repost();
  // Whether the receiver has released every message posted so far.
  bool drained() const { return memory_.header->tail.load(std::memory_order_acquire) >= posted_; }
  bool aborted() const { return memory_.header->aborted.load(std::memory_order_relaxed) != 0; }
  uint32_t abortCode() const { return memory_.header->aborted.load(std::memory_order_acquire); }
  // The failure behind the abort mark, once abortCode() has seen it (0: not known).
  uint64_t abortOrigin() const { return memory_.header->origin.load(std::memory_order_relaxed); }
  // Marks the FIFO given up, with the failure behind it (packOrigin; 0: not known).
  void abort(uint64_t origin = 0) {
    markFifoAborted(memory_.header, kAbortedByPeer, origin);
    ringIfProxied(memory_.header);
  }

 private:
  FifoMemory memory_;
  uint64_t posted_ = 0;
  uint32_t depth_ = 1;             // the header's, read once
  uint32_t slot_ = 0;              // posted_ % depth_, kept without dividing
  uint64_t tailSeen_ = 0;          // the receiver's tail when last read: credit known without reading it again
  std::vector<uint32_t> staging_;  // LL: the message before it is spread over flagged words
  // retain(): a copy of each slot's message (slotBytes apiece, made on first use), its size, protocol and number;
  // and the message being rewritten (rewrite, repost).
  std::vector<std::byte> kept_;
  std::vector<uint32_t> keptBytes_;
  std::vector<Protocol> keptProtocol_;
  std::vector<uint64_t> keptMessage_;  // the number, plus one, of the message each slot's copy is
  uint64_t rewriting_ = 0;  // the message's number plus one (0: none), its protocol and size
  Protocol rewriteProtocol_ = Protocol::kSimple;
  size_t rewriteBytes_ = 0;
  size_t keptRoom() const {
    const FifoHeader* header = memory_.header;
    return header->slotBytes > header->llSlotBytes ? header->slotBytes : header->llSlotBytes;
  }
};

class FifoReceiver {
 public:
  explicit FifoReceiver(FifoMemory memory);
  // The next message, or nullptr when it has not fully arrived. *bytes receives its payload size; *direct
  // whether the message is a DirectDescriptor rather than the payload.
  const void* poll(Protocol protocol, size_t* bytes, bool* direct);
  // For a proxy that forwards whatever was posted (tcp): the next message as poll() gives it, with its protocol,
  // which an LL message's flag in its slot tells apart (a Simple message leaves that slot's older flags).
  const void* pollAny(size_t* bytes, Protocol* protocol, bool* direct);
  // Gives the slot of the message poll() returned back to the sender.
  void release();
  // For a proxy that keeps each message it sent until the far end has checked it (tcp under LOOM_CHECKSUM=2),
  // instead of poll() and release(): message number `message`, posted and not yet released, as pollAny() gives
  // the next one (nullptr: not posted yet); and the release of every message before number `count`.
  const void* peekAny(uint64_t message, size_t* bytes, Protocol* protocol, bool* direct);
  void releaseThrough(uint64_t count);
  uint64_t released() const { return consumed_; }
  // LOOM_CHECKSUM=2: asks the sender to write the message poll() returned again, keeping its slot; poll() returns
  // nothing until the sender has rewritten it.
  void askResend();
  // Whether the message poll() returns now is one the sender wrote again (a second failure is final).
  bool resent() const { return resentMessage_ == consumed_ + 1; }
  bool aborted() const { return memory_.header->aborted.load(std::memory_order_relaxed) != 0; }
  uint32_t abortCode() const { return memory_.header->aborted.load(std::memory_order_acquire); }
  // The failure behind the abort mark, once abortCode() has seen it (0: not known).
  uint64_t abortOrigin() const { return memory_.header->origin.load(std::memory_order_relaxed); }
  // Marks the FIFO given up, with the failure behind it (packOrigin; 0: not known).
  void abort(uint64_t origin = 0) {
    markFifoAborted(memory_.header, kAbortedByPeer, origin);
    ringIfProxied(memory_.header);
  }
  // Whether every message posted so far has been consumed, or the one waited for is being sent again (askResend):
  // an aborted FIFO may still hold messages that were posted before the abort (a peer that finished and closed its
  // end), but a message that failed its check is no good.
  bool empty() const {
    return awaiting_ != 0 || memory_.header->head.load(std::memory_order_acquire) <= consumed_;
  }

 private:
  FifoMemory memory_;
  uint64_t consumed_ = 0;
  uint32_t depth_ = 1;  // the header's, read once
  uint32_t slot_ = 0;   // consumed_ % depth_, kept without dividing: poll runs it on every spin
  std::vector<uint32_t> staging_;  // LL: the decoded message
  uint64_t awaiting_ = 0;       // askResend: the message's number plus one, until the sender has rewritten it
  uint64_t resentMessage_ = 0;  // the last message rewritten, its number plus one
  // poll() at message number `message`, in slot `slot`, without the resend's wait.
  const void* pollAt(uint64_t message, uint32_t slot, Protocol protocol, size_t* bytes, bool* direct);
  Protocol protocolAt(uint64_t message, uint32_t slot) const;
};

}  // namespace loom
