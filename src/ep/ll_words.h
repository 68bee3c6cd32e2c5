// The LL flag protocol over a buffer of 64-bit words (transports/fifo.h describes it for FIFO slots): each word
// carries 4 bytes of data in its low half and the writer's flag in its high half, stored as one 64-bit store, so a
// reader that finds every word of a record carrying the flag it expects has the whole record, with no fence and
// no counter. Writers and readers may run at the same time on the same words; each word is stored and loaded
// whole (aligned 8 bytes, atomically).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loom::ep {

// Writes `count` 32-bit words from `src` (any alignment) as LL words at `dst` (8-byte aligned) with `flag`. Each
// word is one relaxed 64-bit atomic store: the headers this carries are a few words per peer.
inline void llPut(uint64_t* dst, const void* src, size_t count, uint32_t flag) {
  const auto* from = static_cast<const std::byte*>(src);
  for (size_t i = 0; i < count; ++i) {
    uint32_t data;
    std::memcpy(&data, from + 4 * i, 4);
    reinterpret_cast<std::atomic<uint64_t>*>(dst + i)->store(data | uint64_t{flag} << 32, std::memory_order_relaxed);
  }
}

// Whether the last of `count` LL words at `src` carries `flag`: a cheap look before reading them all.
inline bool llLastReady(const uint64_t* src, size_t count, uint32_t flag) {
  uint64_t word = reinterpret_cast<const std::atomic<uint64_t>*>(src + count - 1)->load(std::memory_order_relaxed);
  return static_cast<uint32_t>(word >> 32) == flag;
}

// Reads `count` LL words at `src` into 32-bit words at `dst` (any alignment). False when any word does not carry
// `flag` yet (dst then holds a mix: read again later).
inline bool llGet(void* dst, const uint64_t* src, size_t count, uint32_t flag) {
  auto* to = static_cast<std::byte*>(dst);
  bool complete = true;
  for (size_t i = 0; i < count; ++i) {
    uint64_t word = reinterpret_cast<const std::atomic<uint64_t>*>(src + i)->load(std::memory_order_relaxed);
    complete &= static_cast<uint32_t>(word >> 32) == flag;
    uint32_t data = static_cast<uint32_t>(word);
    std::memcpy(to + 4 * i, &data, 4);
  }
  return complete;
}

// A flagged slot: payload words, then one flag word stored with release after them; a reader that loads the flag
// (acquire) and finds the call's value may read the payload. Half the bytes of LL words for bulk rows, at the
// cost of one ordered store per slot; the reader never looks at the payload before the flag.
inline void slotPublish(uint64_t* flagWord, uint32_t flag) {
  reinterpret_cast<std::atomic<uint64_t>*>(flagWord)->store(flag, std::memory_order_release);
}
inline bool slotReady(const uint64_t* flagWord, uint32_t flag) {
  return reinterpret_cast<const std::atomic<uint64_t>*>(flagWord)->load(std::memory_order_acquire) == flag;
}

}  // namespace loom::ep
