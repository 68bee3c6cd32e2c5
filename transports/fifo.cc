// FIFO layout and the Simple and LL protocols (see fifo.h).
#include "transports/fifo.h"

#include <cstring>
#include <new>

namespace loom {
namespace {

constexpr size_t kPage = 4096;

size_t headerBytes() { return (sizeof(FifoHeader) + kPage - 1) / kPage * kPage; }

// Marks a Simple message whose slot holds a DirectDescriptor.
constexpr uint64_t kDirectBit = uint64_t{1} << 63;

// An LL flag is never 0, so zeroed memory is never mistaken for a posted word.
inline uint32_t llFlag(uint64_t sequence) { return static_cast<uint32_t>(sequence % 0xffffffffu) + 1; }

inline std::atomic<uint64_t>* llWords(std::byte* slot) { return reinterpret_cast<std::atomic<uint64_t>*>(slot); }

}  // namespace

const char* protocolName(Protocol protocol) { return protocol == Protocol::kLL ? "LL" : "Simple"; }

// Simple slots, then LL slots: LL memory only ever holds flagged words, so stale Simple data can never look
// like a valid LL flag.
size_t fifoBytes(const FifoShape& shape) {
  return headerBytes() + static_cast<size_t>(shape.depth) * (shape.slotBytes + shape.llSlotBytes);
}

static std::byte* llSlot(const FifoMemory& memory, uint64_t sequence) {
  const FifoHeader* header = memory.header;
  return memory.slots + header->depth * header->slotBytes + (sequence % header->depth) * header->llSlotBytes;
}

size_t fifoPayloadBytes(const FifoShape& shape, Protocol protocol) {
  if (protocol == Protocol::kSimple) return shape.slotBytes;
  return (shape.llSlotBytes / 8 - 1) * 4;  // word 0 holds the size
}

FifoMemory fifoView(void* base) {
  return {static_cast<FifoHeader*>(base), static_cast<std::byte*>(base) + headerBytes()};
}

void fifoInit(void* memory, const FifoShape& shape) {
  auto* header = new (memory) FifoHeader();
  header->depth = static_cast<uint32_t>(shape.depth);
  header->slotBytes = shape.slotBytes;
  header->llSlotBytes = shape.llSlotBytes;
  header->head.store(0, std::memory_order_relaxed);
  header->tail.store(0, std::memory_order_relaxed);
  header->senderAttached.store(0, std::memory_order_relaxed);
  header->aborted.store(0, std::memory_order_relaxed);
  for (auto& size : header->sizes) size.store(0, std::memory_order_relaxed);
  std::memset(static_cast<std::byte*>(memory) + headerBytes(), 0, fifoBytes(shape) - headerBytes());
  header->magic.store(kFifoMagic, std::memory_order_release);
}

FifoSender::FifoSender(FifoMemory memory) : memory_(memory) {
  posted_ = memory_.header->head.load(std::memory_order_acquire);
  tailSeen_ = memory_.header->tail.load(std::memory_order_acquire);
}

void* FifoSender::reserve(Protocol protocol) {
  FifoHeader* header = memory_.header;
  // Read the receiver's counter only when the credit last seen is used up: the counter's cache line lives in
  // the receiver's core, and fetching it on every message would put a core-to-core transfer on every send.
  if (posted_ - tailSeen_ >= header->depth) {
    tailSeen_ = header->tail.load(std::memory_order_acquire);
    if (posted_ - tailSeen_ >= header->depth) return nullptr;
  }
  if (protocol == Protocol::kSimple) return memory_.slots + (posted_ % header->depth) * header->slotBytes;
  staging_.resize(header->llSlotBytes / 8);
  return staging_.data();
}

void FifoSender::post(Protocol protocol, size_t bytes, bool direct) {
  FifoHeader* header = memory_.header;
  if (protocol == Protocol::kSimple) {
    header->sizes[posted_ % header->depth].store(bytes | (direct ? kDirectBit : 0), std::memory_order_relaxed);
  } else {
    // Spread the staged payload over flagged words; data first, the size word last.
    uint64_t flag = llFlag(posted_);
    std::atomic<uint64_t>* words = llWords(llSlot(memory_, posted_));
    size_t dataWords = (bytes + 3) / 4;
    if (bytes % 4 != 0) std::memset(reinterpret_cast<std::byte*>(staging_.data()) + bytes, 0, 4 - bytes % 4);
    for (size_t i = 0; i < dataWords; ++i)
      words[i + 1].store(static_cast<uint64_t>(staging_[i]) | flag << 32, std::memory_order_relaxed);
    words[0].store(static_cast<uint64_t>(bytes) | flag << 32, std::memory_order_relaxed);
  }
  // Simple needs the release for the data; LL keeps head current so a later Simple call finds it consistent.
  header->head.store(++posted_, std::memory_order_release);
}

FifoReceiver::FifoReceiver(FifoMemory memory) : memory_(memory) {
  consumed_ = memory_.header->tail.load(std::memory_order_acquire);
}

const void* FifoReceiver::poll(Protocol protocol, size_t* bytes, bool* direct) {
  FifoHeader* header = memory_.header;
  *direct = false;
  if (protocol == Protocol::kSimple) {
    if (header->head.load(std::memory_order_acquire) <= consumed_) return nullptr;
    uint64_t size = header->sizes[consumed_ % header->depth].load(std::memory_order_relaxed);
    *direct = (size & kDirectBit) != 0;
    *bytes = size & ~kDirectBit;
    return memory_.slots + (consumed_ % header->depth) * header->slotBytes;
  }
  uint32_t flag = llFlag(consumed_);
  std::atomic<uint64_t>* words = llWords(llSlot(memory_, consumed_));
  uint64_t first = words[0].load(std::memory_order_relaxed);
  if (static_cast<uint32_t>(first >> 32) != flag) return nullptr;
  size_t size = static_cast<uint32_t>(first);
  size_t dataWords = (size + 3) / 4;
  staging_.resize(header->llSlotBytes / 8);
  for (size_t i = 0; i < dataWords; ++i) {
    uint64_t word = words[i + 1].load(std::memory_order_relaxed);
    if (static_cast<uint32_t>(word >> 32) != flag) return nullptr;  // not all there yet: poll again later
    staging_[i] = static_cast<uint32_t>(word);
  }
  *bytes = size;
  return staging_.data();
}

void FifoReceiver::release() { memory_.header->tail.store(++consumed_, std::memory_order_release); }

}  // namespace loom
