// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash, used by the bootstrap as a MAC so that a
// connection proves it knows the communicator's 128-bit secret. Written from the published algorithm; it is
// not a general-purpose hash table hasher and makes no attempt at SIMD speed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

constexpr size_t kSipHashKeyBytes = 16;

// SipHash-2-4 of `bytes` bytes at `data` under the 16-byte `key` (read as two little-endian 64-bit words).
uint64_t sipHash24(const uint8_t key[kSipHashKeyBytes], const void* data, size_t bytes);

// Compares without an early exit, so the time taken does not tell an attacker how many leading bytes matched.
bool timingSafeEqual(const void* a, const void* b, size_t bytes);

}  // namespace loom
