// SipHash-2-4: two compression rounds per 8-byte block, four finalisation rounds, 64-bit output.
#include "src/base/siphash.h"

namespace loom {
namespace {

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline uint64_t loadLittle64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct SipState {
  uint64_t v0, v1, v2, v3;

  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }

  void absorb(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

}  // namespace

uint64_t sipHash24(const uint8_t key[kSipHashKeyBytes], const void* data, size_t bytes) {
  const uint64_t k0 = loadLittle64(key);
  const uint64_t k1 = loadLittle64(key + 8);
  // The constants spell "somepseudorandomlygeneratedbytes".
  SipState s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
             k1 ^ 0x7465646279746573ULL};
  const uint8_t* in = static_cast<const uint8_t*>(data);
  const size_t fullBlocks = bytes / 8;
  for (size_t i = 0; i < fullBlocks; ++i) s.absorb(loadLittle64(in + 8 * i));

  // The last block holds the 0..7 remaining bytes and the message length modulo 256 in its top byte.
  uint64_t last = static_cast<uint64_t>(bytes & 0xff) << 56;
  const uint8_t* tail = in + 8 * fullBlocks;
  for (size_t i = 0; i < bytes % 8; ++i) last |= static_cast<uint64_t>(tail[i]) << (8 * i);
  s.absorb(last);

  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

bool timingSafeEqual(const void* a, const void* b, size_t bytes) {
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < bytes; ++i) diff |= x[i] ^ y[i];
  return diff == 0;
}

}  // namespace loom
