// copyOut (see copy.h): SSE2 streaming stores, which every x86-64 CPU has; memcpy elsewhere.
#include "src/exec/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace loom {

void copyOut(void* dst, const void* src, size_t bytes, bool streaming) {
#if defined(__x86_64__)
  constexpr size_t kMinStreamingBytes = 4096;  // below a page, the fence costs more than the stores save
  if (streaming && bytes >= kMinStreamingBytes) {
    auto* to = static_cast<std::byte*>(dst);
    auto* from = static_cast<const std::byte*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(to) & 15)) & 15;  // align the stores, not the loads
    std::memcpy(to, from, head);
    to += head, from += head, bytes -= head;
    size_t blocks = bytes / 64;
    for (size_t i = 0; i < blocks; ++i, to += 64, from += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 32));
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(to), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(to + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(to + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(to + 48), d);
    }
    std::memcpy(to, from, bytes % 64);
    _mm_sfence();
    return;
  }
#else
  (void)streaming;
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace loom
