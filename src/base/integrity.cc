// CRC32C and the corruption hook (integrity.h).
#include "src/base/integrity.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "src/base/log.h"
#include "src/base/params.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom {
namespace {

// CRC32C, bit-reflected: the polynomial 0x1edc6f41 reversed.
constexpr uint32_t kPolynomial = 0x82f63b78;

// Slicing by 8: table[k][b] is the CRC state of byte b followed by k zero bytes.
struct Tables {
  uint32_t table[8][256];
  constexpr Tables() : table() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
      table[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
  }
};
constexpr Tables kTables;

// The raw state (no inversions) after `bytes` more bytes.
uint32_t updatePortable(uint32_t crc, const unsigned char* p, size_t bytes) {
  const auto& t = kTables.table;
  while (bytes >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;  // little-endian: the state meets the first four bytes
    crc = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^ t[4][(word >> 24) & 0xff] ^
          t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^ t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
    p += 8;
    bytes -= 8;
  }
  while (bytes-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// The hardware path runs three streams of kStreamBytes each and joins them: the CRC is linear, so the state after
// A then B is shift(state after A) ^ (B's state from 0), where shift(s) is s followed by kStreamBytes zero bytes.
// shift is linear too: four tables of 256, built once from the portable update.
constexpr size_t kStreamBytes = 1024;

struct Shift {
  uint32_t table[4][256];
  Shift() {
    uint32_t basis[32];
    static const unsigned char zeros[kStreamBytes] = {};
    for (int bit = 0; bit < 32; ++bit) basis[bit] = updatePortable(uint32_t{1} << bit, zeros, kStreamBytes);
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t value = 0;
        for (int bit = 0; bit < 8; ++bit)
          if (b & (1u << bit)) value ^= basis[8 * k + bit];
        table[k][b] = value;
      }
  }
  uint32_t operator()(uint32_t s) const {
    return table[0][s & 0xff] ^ table[1][(s >> 8) & 0xff] ^ table[2][(s >> 16) & 0xff] ^ table[3][s >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t updateHardware(uint32_t crc, const unsigned char* p, size_t bytes) {
  static const Shift shift;
  uint64_t a = crc;
  while (bytes >= 3 * kStreamBytes) {
    uint64_t b = 0, c = 0;
    const unsigned char* q = p + kStreamBytes;
    const unsigned char* r = p + 2 * kStreamBytes;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t x, y, z;
      std::memcpy(&x, p + i, 8);
      std::memcpy(&y, q + i, 8);
      std::memcpy(&z, r + i, 8);
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      c = _mm_crc32_u64(c, z);
    }
    a = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
    p += 3 * kStreamBytes;
    bytes -= 3 * kStreamBytes;
  }
  while (bytes >= 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    a = _mm_crc32_u64(a, x);
    p += 8;
    bytes -= 8;
  }
  uint32_t state = static_cast<uint32_t>(a);
  while (bytes-- > 0) state = _mm_crc32_u8(state, *p++);
  return state;
}

// Where the processor has AVX-512 with VPCLMULQDQ, longer runs fold instead: four 512-bit accumulators, each 16
// bytes of it a polynomial V (bit i of the 128 bits the coefficient of x^(127-i), as the reflected CRC reads the
// message), are carried 256 bytes forward per step by carry-less multiplication and added to the next 256 bytes:
// V x^N = L x^(N+64) + H x^N for V's low and high 64 bits L and H, and since a carry-less product of two reflected
// 64-bit values is x times their product, L and H are multiplied by x^(N+63) and x^(N-1) mod P. The accumulators are
// then folded into one 16-byte value congruent to everything read so far, whose CRC the crc32 instruction takes.
// The state of the CRC enters as the first 4 bytes' XOR, as in the table's loop.
struct FoldConstants {
  // x^e mod P, as the low 32 bits of a polynomial (bit d: the coefficient of x^d).
  static uint64_t powerModP(unsigned e) {
    uint64_t r = 1;
    for (unsigned i = 0; i < e; ++i) {
      r <<= 1;
      if (r & (uint64_t{1} << 32)) r ^= 0x11edc6f41ull;
    }
    return r;
  }
  // A polynomial of degree < 64 in the reflected 64-bit form: the coefficient of x^d in bit 63 - d.
  static uint64_t reflected(uint64_t polynomial) {
    uint64_t out = 0;
    for (int d = 0; d < 64; ++d)
      if (polynomial & (uint64_t{1} << d)) out |= uint64_t{1} << (63 - d);
    return out;
  }
  // The pair that carries 16 bytes N bits forward: (for L, for H).
  static std::array<uint64_t, 2> by(unsigned bits) {
    return {reflected(powerModP(bits + 63)), reflected(powerModP(bits - 1))};
  }
  std::array<uint64_t, 2> k2048 = by(2048), k1024 = by(1024), k896 = by(896), k768 = by(768), k640 = by(640),
                          k512 = by(512), k384 = by(384), k256 = by(256), k128 = by(128);
};

#define LOOM_FOLDING_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))

LOOM_FOLDING_TARGET inline __m512i wideConstant(const std::array<uint64_t, 2>& pair) {
  const auto low = static_cast<long long>(pair[0]), high = static_cast<long long>(pair[1]);
  return _mm512_set_epi64(high, low, high, low, high, low, high, low);
}
// x carried forward by `constant`'s distance, added to `next`.
LOOM_FOLDING_TARGET inline __m512i fold(__m512i x, __m512i constant, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, constant, 0x00),
                                   _mm512_clmulepi64_epi128(x, constant, 0x11), next, 0x96);
}
LOOM_FOLDING_TARGET inline __m128i fold16(__m128i x, const std::array<uint64_t, 2>& pair) {
  const __m128i constant = _mm_set_epi64x(static_cast<long long>(pair[1]), static_cast<long long>(pair[0]));
  return _mm_xor_si128(_mm_clmulepi64_si128(x, constant, 0x00), _mm_clmulepi64_si128(x, constant, 0x11));
}

LOOM_FOLDING_TARGET uint32_t updateFolding(uint32_t crc, const unsigned char* p, size_t bytes) {
  constexpr size_t kWindow = 256;
  if (bytes < 2 * kWindow) return updateHardware(crc, p, bytes);
  static const FoldConstants k;
  __m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128),
          x3 = _mm512_loadu_si512(p + 192);
  x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  p += kWindow;
  bytes -= kWindow;
  const __m512i forward = wideConstant(k.k2048);
  while (bytes >= kWindow) {
    x0 = fold(x0, forward, _mm512_loadu_si512(p));
    x1 = fold(x1, forward, _mm512_loadu_si512(p + 64));
    x2 = fold(x2, forward, _mm512_loadu_si512(p + 128));
    x3 = fold(x3, forward, _mm512_loadu_si512(p + 192));
    p += kWindow;
    bytes -= kWindow;
  }
  const __m512i by64 = wideConstant(k.k512);
  x1 = fold(x0, by64, x1);
  x2 = fold(x1, by64, x2);
  x3 = fold(x2, by64, x3);
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, x3);
  __m128i v = lanes[3];
  v = _mm_xor_si128(v, fold16(lanes[0], k.k384));
  v = _mm_xor_si128(v, fold16(lanes[1], k.k256));
  v = _mm_xor_si128(v, fold16(lanes[2], k.k128));
  uint64_t state = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(v)));
  state = _mm_crc32_u64(state, static_cast<uint64_t>(_mm_extract_epi64(v, 1)));
  return updateHardware(static_cast<uint32_t>(state), p, bytes);
}

// Without AVX-512, the same folding 16 bytes at a time with PCLMULQDQ: eight accumulators (128 bytes) carried 1024
// bits a step, enough of them in flight to cover the multiplication's latency. Processors whose crc32 instruction
// is slow (AMD Zen 2: one every three cycles, about 7 GB/s here) fold 1.6 times faster than they take crc32.
#define LOOM_FOLDING16_TARGET __attribute__((target("pclmul,sse4.2")))

LOOM_FOLDING16_TARGET inline __m128i pairConstant(const std::array<uint64_t, 2>& pair) {
  return _mm_set_epi64x(static_cast<long long>(pair[1]), static_cast<long long>(pair[0]));
}
LOOM_FOLDING16_TARGET inline __m128i fold128(__m128i x, __m128i constant, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, constant, 0x00), _mm_clmulepi64_si128(x, constant, 0x11)),
                       next);
}

// The state after the bytes that eight accumulators of 16 bytes stand for: lane i lies 128 (7 - i) bits before the
// last, so is carried there and added; the crc32 instruction takes the 16 bytes left.
LOOM_FOLDING16_TARGET inline uint32_t foldedState(const __m128i* x, const FoldConstants& k) {
  const std::array<uint64_t, 2>* to[7] = {&k.k896, &k.k768, &k.k640, &k.k512, &k.k384, &k.k256, &k.k128};
  __m128i v = x[7];
  for (int i = 0; i < 7; ++i) v = fold128(x[i], pairConstant(*to[i]), v);
  uint64_t state = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(v)));
  return static_cast<uint32_t>(_mm_crc32_u64(state, static_cast<uint64_t>(_mm_extract_epi64(v, 1))));
}

LOOM_FOLDING16_TARGET uint32_t updateFolding16(uint32_t crc, const unsigned char* p, size_t bytes) {
  constexpr size_t kWindow = 128;
  constexpr int kLanes = 8;
  if (bytes < 2 * kWindow) return updateHardware(crc, p, bytes);
  static const FoldConstants k;
  __m128i x[kLanes];
  for (int i = 0; i < kLanes; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i));
  x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128(static_cast<int>(crc)));
  p += kWindow;
  bytes -= kWindow;
  const __m128i forward = pairConstant(k.k1024);
  while (bytes >= kWindow) {
    for (int i = 0; i < kLanes; ++i)
      x[i] = fold128(x[i], forward, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
    p += kWindow;
    bytes -= kWindow;
  }
  return updateHardware(foldedState(x, k), p, bytes);
}

enum class Path { kTable, kCrc32, kFolding16, kFolding };
Path detectPath() {
  if (!__builtin_cpu_supports("sse4.2")) return Path::kTable;
  if (!__builtin_cpu_supports("pclmul")) return Path::kCrc32;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq"))
    return Path::kFolding;
  return Path::kFolding16;
}
#else
enum class Path { kTable, kCrc32, kFolding16, kFolding };
Path detectPath() { return Path::kTable; }
uint32_t updateHardware(uint32_t crc, const unsigned char* p, size_t bytes) { return updatePortable(crc, p, bytes); }
uint32_t updateFolding(uint32_t crc, const unsigned char* p, size_t bytes) { return updatePortable(crc, p, bytes); }
uint32_t updateFolding16(uint32_t crc, const unsigned char* p, size_t bytes) { return updatePortable(crc, p, bytes); }
#endif

const Path kPath = detectPath();
const bool kHardware = kPath != Path::kTable;

// LOOM_FAULT_CORRUPT: the message to corrupt (0: none) and the bit (-1: the middle one).
struct CorruptSpec {
  uint64_t message = 0;
  int64_t bit = -1;
  bool onward = false;  // "N+": the N-th and every later message
  CorruptSpec() {
    const std::string text = params::faultCorrupt();
    if (text.empty()) return;
    char* end = nullptr;
    const long long n = std::strtoll(text.c_str(), &end, 10);
    long long b = -1;
    bool good = n >= 1 && end != text.c_str();
    const bool plus = good && *end == '+';
    if (plus) ++end;
    if (good && *end == ':') {
      const char* start = end + 1;
      b = std::strtoll(start, &end, 10);
      good = end != start && b >= 0;
    }
    if (!good || *end != '\0') {
      LOOM_WARN(COLL, "LOOM_FAULT_CORRUPT=\"%s\" ignored: expected N, N+, N:BIT or N+:BIT with N >= 1 and BIT >= 0",
                text.c_str());
      return;
    }
    message = static_cast<uint64_t>(n);
    bit = b;
    onward = plus;
  }
};

}  // namespace

uint32_t crc32cPortable(const void* data, size_t bytes, uint32_t previous) {
  return ~updatePortable(~previous, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t previous) {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (kPath) {
    case Path::kFolding:
      return ~updateFolding(~previous, p, bytes);
    case Path::kFolding16:
      return ~updateFolding16(~previous, p, bytes);
    case Path::kCrc32:
      return ~updateHardware(~previous, p, bytes);
    case Path::kTable:
      break;
  }
  return crc32cPortable(data, bytes, previous);
}

uint32_t crc32cWithoutFolding(const void* data, size_t bytes, uint32_t previous) {
  if (kPath == Path::kTable) return crc32cPortable(data, bytes, previous);
  return ~updateHardware(~previous, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32cFolding16(const void* data, size_t bytes, uint32_t previous) {
  if (kPath == Path::kFolding || kPath == Path::kFolding16)
    return ~updateFolding16(~previous, static_cast<const unsigned char*>(data), bytes);
  return crc32cWithoutFolding(data, bytes, previous);
}

const char* crc32cMethod() {
  switch (kPath) {
    case Path::kFolding:
      return "AVX-512 folding (VPCLMULQDQ), crc32 below 512 bytes";
    case Path::kFolding16:
      return "PCLMULQDQ folding, crc32 below 256 bytes";
    case Path::kCrc32:
      return "the crc32 instruction (SSE4.2)";
    case Path::kTable:
      break;
  }
  return "a table (no SSE4.2)";
}

bool crc32cInHardware() { return kHardware; }

namespace {

// The hook's state: read from the environment at the first message, again at each rearmCorruption().
struct CorruptState {
  std::atomic<uint64_t> message{0};
  std::atomic<int64_t> bit{-1};
  std::atomic<uint64_t> seen{0};
  std::atomic<bool> onward{false};
  void arm() {
    const CorruptSpec spec;
    bit.store(spec.bit, std::memory_order_relaxed);
    onward.store(spec.onward, std::memory_order_relaxed);
    seen.store(0, std::memory_order_relaxed);
    message.store(spec.message, std::memory_order_release);
  }
};
CorruptState& corruptState() {
  static CorruptState* state = [] {
    auto* fresh = new CorruptState();
    fresh->arm();
    return fresh;
  }();
  return *state;
}

}  // namespace

void rearmCorruption() { corruptState().arm(); }

bool corruptionArmed() { return corruptState().message.load(std::memory_order_relaxed) != 0; }

bool corruptInTransit(void* data, size_t bytes) {
  CorruptState& state = corruptState();
  const uint64_t message = state.message.load(std::memory_order_acquire);
  if (message == 0 || bytes == 0) return false;
  const uint64_t count = state.seen.fetch_add(1, std::memory_order_relaxed) + 1;
  if (count < message || (count > message && !state.onward.load(std::memory_order_relaxed))) return false;
  const int64_t chosen = state.bit.load(std::memory_order_relaxed);
  const uint64_t bits = static_cast<uint64_t>(bytes) * 8;
  const uint64_t bit = chosen < 0 ? bits / 2 : static_cast<uint64_t>(chosen) % bits;
  static_cast<unsigned char*>(data)[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  LOOM_WARN(COLL, "LOOM_FAULT_CORRUPT: flipped bit %llu of a message of %zu bytes in transit (message %llu of this "
            "process)", static_cast<unsigned long long>(bit), bytes, static_cast<unsigned long long>(count));
  return true;
}

}  // namespace loom
