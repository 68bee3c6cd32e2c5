// FIFO layout and the Simple and LL protocols (see fifo.h).
#include "transports/fifo.h"

#include <unistd.h>

#include <cstring>
#include <new>

namespace loom {
namespace {

constexpr size_t kPage = 4096;

size_t headerBytes() { return (sizeof(FifoHeader) + kPage - 1) / kPage * kPage; }

inline std::atomic<uint64_t>* llWords(std::byte* slot) { return reinterpret_cast<std::atomic<uint64_t>*>(slot); }

}  // namespace

void ringDoorbell(FifoHeader* header) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header->sleeping.load(std::memory_order_relaxed) == 0) return;
  uint64_t one = 1;
  if (write(header->doorbell, &one, sizeof(one)) < 0) {
    // The counter is full: the proxy has a wake-up pending already.
  }
}

const char* protocolName(Protocol protocol) { return protocol == Protocol::kLL ? "LL" : "Simple"; }

// Simple slots, then LL slots: LL memory only ever holds flagged words, so stale Simple data can never look
// like a valid LL flag.
size_t fifoBytes(const FifoShape& shape) {
  return headerBytes() + static_cast<size_t>(shape.depth) * (shape.slotBytes + shape.llSlotBytes);
}

// Slot `index` (a sequence number modulo depth) of each protocol.
static std::byte* simpleSlot(const FifoMemory& memory, uint32_t index) {
  return memory.slots + fifo::simpleSlotOffset(index, memory.header->slotBytes);
}
static std::byte* llSlot(const FifoMemory& memory, uint32_t index) {
  const FifoHeader* header = memory.header;
  return memory.slots + fifo::llSlotOffset(index, header->depth, header->slotBytes, header->llSlotBytes);
}

size_t fifoPayloadBytes(const FifoShape& shape, Protocol protocol) {
  if (protocol == Protocol::kSimple) return shape.slotBytes;
  return fifo::llPayloadBytes(shape.llSlotBytes);
}

FifoMemory fifoView(void* base) {
  return {static_cast<FifoHeader*>(base), static_cast<std::byte*>(base) + headerBytes()};
}

FifoWords fifoWords() {
  alignas(FifoHeader) static unsigned char probe[sizeof(FifoHeader)];
  auto* header = reinterpret_cast<FifoHeader*>(probe);
  auto offset = [&](const void* field) {
    return static_cast<uint32_t>(static_cast<const unsigned char*>(field) - probe);
  };
  return FifoWords{offset(&header->head), offset(&header->tail), offset(&header->aborted), offset(&header->sizes[0]),
                   static_cast<uint32_t>(headerBytes())};
}

size_t fifoHeaderBytes() { return headerBytes(); }

void fifoHeaderImage(void* memory, const FifoShape& shape) {
  auto* header = new (memory) FifoHeader();
  header->depth = static_cast<uint32_t>(shape.depth);
  header->slotBytes = shape.slotBytes;
  header->llSlotBytes = shape.llSlotBytes;
  header->head.store(0, std::memory_order_relaxed);
  header->tail.store(0, std::memory_order_relaxed);
  header->senderAttached.store(0, std::memory_order_relaxed);
  header->aborted.store(0, std::memory_order_relaxed);
  header->origin.store(0, std::memory_order_relaxed);
  for (auto& size : header->sizes) size.store(0, std::memory_order_relaxed);
  header->sleeping.store(0, std::memory_order_relaxed);
  header->doorbell = -1;
  header->resendWanted.store(0, std::memory_order_relaxed);
  header->resent.store(0, std::memory_order_relaxed);
  std::memset(static_cast<std::byte*>(memory) + sizeof(FifoHeader), 0, headerBytes() - sizeof(FifoHeader));
  header->magic.store(kFifoMagic, std::memory_order_relaxed);
}

void fifoInit(void* memory, const FifoShape& shape) {
  fifoHeaderImage(memory, shape);
  auto* header = static_cast<FifoHeader*>(memory);
  header->magic.store(0, std::memory_order_relaxed);
  std::memset(static_cast<std::byte*>(memory) + headerBytes(), 0, fifoBytes(shape) - headerBytes());
  header->magic.store(kFifoMagic, std::memory_order_release);
}

// Writes `bytes` of LL payload staged in `staging` into slot `index` as message `sequence`'s flagged words: data
// first, the size word last.
static void spreadLL(const FifoMemory& memory, uint32_t index, uint64_t sequence, std::vector<uint32_t>& staging,
                     size_t bytes) {
  uint32_t flag = fifo::llFlag(sequence);
  std::atomic<uint64_t>* words = llWords(llSlot(memory, index));
  size_t dataWords = fifo::llDataWords(bytes);
  if (bytes % 4 != 0) std::memset(reinterpret_cast<std::byte*>(staging.data()) + bytes, 0, 4 - bytes % 4);
  for (size_t i = 0; i < dataWords; ++i) words[i + 1].store(fifo::llWord(staging[i], flag), std::memory_order_relaxed);
  words[0].store(fifo::llWord(static_cast<uint32_t>(bytes), flag), std::memory_order_relaxed);
}

FifoSender::FifoSender(FifoMemory memory) : memory_(memory) {
  posted_ = memory_.header->head.load(std::memory_order_acquire);
  depth_ = memory_.header->depth;
  slot_ = static_cast<uint32_t>(posted_ % depth_);
  tailSeen_ = memory_.header->tail.load(std::memory_order_acquire);
}

void* FifoSender::reserve(Protocol protocol) {
  FifoHeader* header = memory_.header;
  // Read the receiver's counter only when the credit last seen is used up: the counter's cache line lives in
  // the receiver's core, and fetching it on every message would put a core-to-core transfer on every send.
  if (!fifo::hasCredit(posted_, tailSeen_, depth_)) {
    tailSeen_ = header->tail.load(std::memory_order_acquire);
    if (!fifo::hasCredit(posted_, tailSeen_, depth_)) return nullptr;
  }
  if (protocol == Protocol::kSimple) return simpleSlot(memory_, slot_);
  staging_.resize(header->llSlotBytes / 8);
  return staging_.data();
}

void FifoSender::post(Protocol protocol, size_t bytes, bool direct) {
  FifoHeader* header = memory_.header;
  if (protocol == Protocol::kSimple) {
    header->sizes[slot_].store(fifo::simpleSizeWord(bytes, direct), std::memory_order_relaxed);
  } else {
    spreadLL(memory_, slot_, posted_, staging_, bytes);
  }
  // Simple needs the release for the data; LL keeps head current so a later Simple call finds it consistent.
  slot_ = fifo::nextSlot(slot_, depth_);
  header->head.store(++posted_, std::memory_order_release);
  ringIfProxied(header);
  // The credit just ran out: fetch the receiver's counter now, while the message travels and the caller would
  // wait for its answer anyway, rather than in the next reserve(), where the fetch would delay that message.
  if (!fifo::hasCredit(posted_, tailSeen_, depth_)) tailSeen_ = header->tail.load(std::memory_order_acquire);
}

void FifoSender::retain(Protocol protocol, size_t bytes) {
  const size_t room = keptRoom();
  if (kept_.empty()) {
    kept_.resize(depth_ * room);
    keptBytes_.assign(depth_, 0);
    keptProtocol_.assign(depth_, Protocol::kSimple);
    keptMessage_.assign(depth_, 0);
  }
  const void* message = protocol == Protocol::kSimple ? static_cast<const void*>(simpleSlot(memory_, slot_))
                                                      : static_cast<const void*>(staging_.data());
  std::memcpy(kept_.data() + slot_ * room, message, bytes);
  keptBytes_[slot_] = static_cast<uint32_t>(bytes);
  keptProtocol_[slot_] = protocol;
  keptMessage_[slot_] = posted_ + 1;
}

void* FifoSender::rewrite(size_t* bytes, bool* direct) {
  FifoHeader* header = memory_.header;
  const uint64_t wanted = header->resendWanted.load(std::memory_order_acquire);
  if (wanted == 0 || wanted <= header->resent.load(std::memory_order_relaxed) || wanted > posted_ ||
      posted_ - wanted >= depth_ || kept_.empty())
    return nullptr;
  const uint32_t index = static_cast<uint32_t>((wanted - 1) % depth_);
  if (keptMessage_[index] != wanted) return nullptr;  // not retained: the receiver's deadline ends its wait
  *bytes = keptBytes_[index];
  *direct = keptProtocol_[index] == Protocol::kSimple &&
            fifo::simpleSizeDirect(header->sizes[index].load(std::memory_order_relaxed));
  rewriting_ = wanted;
  rewriteProtocol_ = keptProtocol_[index];
  rewriteBytes_ = *bytes;
  const std::byte* kept = kept_.data() + index * keptRoom();
  if (keptProtocol_[index] == Protocol::kSimple) {
    std::byte* slot = simpleSlot(memory_, index);
    std::memcpy(slot, kept, *bytes);
    return slot;
  }
  staging_.resize(header->llSlotBytes / 8);
  std::memcpy(staging_.data(), kept, *bytes);
  return staging_.data();
}

void* FifoSender::rewriteAt(uint64_t message, Protocol protocol, size_t bytes) {
  FifoHeader* header = memory_.header;
  const uint64_t wanted = header->resendWanted.load(std::memory_order_acquire);
  const size_t room = protocol == Protocol::kSimple ? header->slotBytes : fifo::llPayloadBytes(header->llSlotBytes);
  if (wanted != message + 1 || wanted <= header->resent.load(std::memory_order_relaxed) || wanted > posted_ ||
      posted_ - wanted >= depth_ || bytes > room)
    return nullptr;
  rewriting_ = wanted;
  rewriteProtocol_ = protocol;
  rewriteBytes_ = bytes;
  const uint32_t index = static_cast<uint32_t>(message % depth_);
  if (protocol == Protocol::kSimple) {
    header->sizes[index].store(fifo::simpleSizeWord(bytes, false), std::memory_order_relaxed);
    return simpleSlot(memory_, index);
  }
  staging_.resize(header->llSlotBytes / 8);
  return staging_.data();
}

void FifoSender::repost() {
  FifoHeader* header = memory_.header;
  const uint32_t index = static_cast<uint32_t>((rewriting_ - 1) % depth_);
  if (rewriteProtocol_ == Protocol::kLL) spreadLL(memory_, index, rewriting_ - 1, staging_, rewriteBytes_);
  header->resent.store(rewriting_, std::memory_order_release);
  ringIfProxied(header);
  rewriting_ = 0;
}

FifoReceiver::FifoReceiver(FifoMemory memory) : memory_(memory) {
  consumed_ = memory_.header->tail.load(std::memory_order_acquire);
  depth_ = memory_.header->depth;
  slot_ = static_cast<uint32_t>(consumed_ % depth_);
}

const void* FifoReceiver::poll(Protocol protocol, size_t* bytes, bool* direct) {
  FifoHeader* header = memory_.header;
  *direct = false;
  if (awaiting_ != 0) [[unlikely]] {
    if (header->resent.load(std::memory_order_acquire) < awaiting_) return nullptr;
    resentMessage_ = awaiting_;
    awaiting_ = 0;
  }
  return pollAt(consumed_, slot_, protocol, bytes, direct);
}

const void* FifoReceiver::pollAt(uint64_t message, uint32_t slot, Protocol protocol, size_t* bytes,
                                 bool* direct) {
  FifoHeader* header = memory_.header;
  if (protocol == Protocol::kSimple) {
    if (header->head.load(std::memory_order_acquire) <= message) return nullptr;
    uint64_t size = header->sizes[slot].load(std::memory_order_relaxed);
    *direct = fifo::simpleSizeDirect(size);
    *bytes = fifo::simpleSizeBytes(size);
    return simpleSlot(memory_, slot);
  }
  uint32_t flag = fifo::llFlag(message);
  std::atomic<uint64_t>* words = llWords(llSlot(memory_, slot));
  uint64_t first = words[0].load(std::memory_order_relaxed);
  if (fifo::llWordFlag(first) != flag) return nullptr;
  size_t size = fifo::llWordData(first);
  size_t dataWords = fifo::llDataWords(size);
  staging_.resize(header->llSlotBytes / 8);
  for (size_t i = 0; i < dataWords; ++i) {
    uint64_t word = words[i + 1].load(std::memory_order_relaxed);
    if (fifo::llWordFlag(word) != flag) return nullptr;  // not all there yet: poll again later
    staging_[i] = fifo::llWordData(word);
  }
  *bytes = size;
  return staging_.data();
}

// The head is stored after an LL message's words (fifo.h), so once it counts the message its flag is visible.
Protocol FifoReceiver::protocolAt(uint64_t message, uint32_t slot) const {
  uint64_t first = llWords(llSlot(memory_, slot))[0].load(std::memory_order_relaxed);
  return fifo::llWordFlag(first) == fifo::llFlag(message) ? Protocol::kLL : Protocol::kSimple;
}

const void* FifoReceiver::pollAny(size_t* bytes, Protocol* protocol, bool* direct) {
  if (memory_.header->head.load(std::memory_order_acquire) <= consumed_) return nullptr;
  *protocol = protocolAt(consumed_, slot_);
  return poll(*protocol, bytes, direct);
}

const void* FifoReceiver::peekAny(uint64_t message, size_t* bytes, Protocol* protocol, bool* direct) {
  if (memory_.header->head.load(std::memory_order_acquire) <= message || message < consumed_) return nullptr;
  const uint32_t slot = static_cast<uint32_t>(message % depth_);
  *protocol = protocolAt(message, slot);
  *direct = false;
  return pollAt(message, slot, *protocol, bytes, direct);
}

void FifoReceiver::releaseThrough(uint64_t count) {
  const uint64_t head = memory_.header->head.load(std::memory_order_acquire);
  if (count > head) count = head;
  if (count <= consumed_) return;
  consumed_ = count;
  slot_ = static_cast<uint32_t>(consumed_ % depth_);
  memory_.header->tail.store(consumed_, std::memory_order_release);
  ringIfProxied(memory_.header);
}

void FifoReceiver::askResend() {
  awaiting_ = consumed_ + 1;
  memory_.header->resendWanted.store(awaiting_, std::memory_order_release);
  ringIfProxied(memory_.header);
}

void FifoReceiver::release() {
  slot_ = fifo::nextSlot(slot_, depth_);
  memory_.header->tail.store(++consumed_, std::memory_order_release);
  ringIfProxied(memory_.header);
}

}  // namespace loom
