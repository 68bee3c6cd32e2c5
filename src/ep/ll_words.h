// The LL flag protocol over a buffer of 64-bit words (transports/fifo.h describes it for FIFO slots): each word
// carries 4 bytes of data in its low half and the writer's flag in its high half, stored as one 64-bit store, so a
// reader that finds every word of a record carrying the flag it expects has the whole record, with no fence and
// no counter. Writers and readers may run at the same time on the same words; each word is stored and loaded
// whole (aligned 8 bytes; on x86 the 16-byte vector accesses below are never torn within an aligned 8 bytes).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace loom::ep {

// Writes `count` 32-bit words from `src` (any alignment) as LL words at `dst` (8-byte aligned) with `flag`.
inline void llPut(uint64_t* dst, const void* src, size_t count, uint32_t flag) {
  const auto* from = static_cast<const std::byte*>(src);
  size_t i = 0;
#if defined(__x86_64__)
  const __m128i flags = _mm_set1_epi32(static_cast<int>(flag));
  for (; i + 4 <= count; i += 4) {
    __m128i data = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 4 * i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_unpacklo_epi32(data, flags));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 2), _mm_unpackhi_epi32(data, flags));
  }
#endif
  for (; i < count; ++i) {
    uint32_t data;
    std::memcpy(&data, from + 4 * i, 4);
    reinterpret_cast<std::atomic<uint64_t>*>(dst + i)->store(data | uint64_t{flag} << 32, std::memory_order_relaxed);
  }
}

// Whether the last of `count` LL words at `src` carries `flag`: a cheap look before reading a record whole.
inline bool llLastReady(const uint64_t* src, size_t count, uint32_t flag) {
  uint64_t word = reinterpret_cast<const std::atomic<uint64_t>*>(src + count - 1)->load(std::memory_order_relaxed);
  return static_cast<uint32_t>(word >> 32) == flag;
}

// Reads `count` LL words at `src` into 32-bit words at `dst` (any alignment). False when any word does not carry
// `flag` yet (dst then holds a mix: read again later).
inline bool llGet(void* dst, const uint64_t* src, size_t count, uint32_t flag) {
  auto* to = static_cast<std::byte*>(dst);
  size_t i = 0;
  bool complete = true;
#if defined(__x86_64__)
  const __m128 flags = _mm_castsi128_ps(_mm_set1_epi32(static_cast<int>(flag)));
  __m128i all = _mm_set1_epi32(-1);
  for (; i + 4 <= count; i += 4) {
    __m128 a = _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    __m128 b = _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 2)));
    __m128 data = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    __m128 seen = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    all = _mm_and_si128(all, _mm_cmpeq_epi32(_mm_castps_si128(seen), _mm_castps_si128(flags)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 4 * i), _mm_castps_si128(data));
  }
  complete = _mm_movemask_epi8(all) == 0xffff;
#endif
  for (; i < count; ++i) {
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
