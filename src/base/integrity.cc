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

bool detectHardware() { return __builtin_cpu_supports("sse4.2"); }
#else
bool detectHardware() { return false; }
uint32_t updateHardware(uint32_t crc, const unsigned char* p, size_t bytes) { return updatePortable(crc, p, bytes); }
#endif

const bool kHardware = detectHardware();

// LOOM_FAULT_CORRUPT: the message to corrupt (0: none) and the bit (-1: the middle one).
struct CorruptSpec {
  uint64_t message = 0;
  int64_t bit = -1;
  CorruptSpec() {
    const std::string text = params::faultCorrupt();
    if (text.empty()) return;
    char* end = nullptr;
    const long long n = std::strtoll(text.c_str(), &end, 10);
    long long b = -1;
    bool good = n >= 1 && end != text.c_str();
    if (good && *end == ':') {
      const char* start = end + 1;
      b = std::strtoll(start, &end, 10);
      good = end != start && b >= 0;
    }
    if (!good || *end != '\0') {
      LOOM_WARN(COLL, "LOOM_FAULT_CORRUPT=\"%s\" ignored: expected N or N:BIT with N >= 1 and BIT >= 0", text.c_str());
      return;
    }
    message = static_cast<uint64_t>(n);
    bit = b;
  }
};

}  // namespace

uint32_t crc32cPortable(const void* data, size_t bytes, uint32_t previous) {
  return ~updatePortable(~previous, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t previous) {
  if (!kHardware) return crc32cPortable(data, bytes, previous);
  return ~updateHardware(~previous, static_cast<const unsigned char*>(data), bytes);
}

bool crc32cInHardware() { return kHardware; }

namespace {

// The hook's state: read from the environment at the first message, again at each rearmCorruption().
struct CorruptState {
  std::atomic<uint64_t> message{0};
  std::atomic<int64_t> bit{-1};
  std::atomic<uint64_t> seen{0};
  void arm() {
    const CorruptSpec spec;
    bit.store(spec.bit, std::memory_order_relaxed);
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

bool corruptInTransit(void* data, size_t bytes) {
  CorruptState& state = corruptState();
  const uint64_t message = state.message.load(std::memory_order_acquire);
  if (message == 0 || bytes == 0) return false;
  if (state.seen.fetch_add(1, std::memory_order_relaxed) + 1 != message) return false;
  const int64_t chosen = state.bit.load(std::memory_order_relaxed);
  const uint64_t bits = static_cast<uint64_t>(bytes) * 8;
  const uint64_t bit = chosen < 0 ? bits / 2 : static_cast<uint64_t>(chosen) % bits;
  static_cast<unsigned char*>(data)[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  LOOM_WARN(COLL, "LOOM_FAULT_CORRUPT: flipped bit %llu of a message of %zu bytes in transit (message %llu of this "
            "process)", static_cast<unsigned long long>(bit), bytes, static_cast<unsigned long long>(message));
  return true;
}


}  // namespace loom
