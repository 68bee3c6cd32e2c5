// A vectorizable e^x for the CPU kernels' loops (GELU, softmax): glibc's expf is a call, which keeps a loop scalar.
// Internal to parallel/kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom::parallel::cpu {

// e^x without a library call, so that the loops below vectorize: x = n ln2 + r with |r| <= ln2/2 (ln2 split in
// two for an exact product), e^r by its Taylor polynomial to r^7 (error under 2e-8 relative), 2^n put into the
// exponent bits. Inputs are clamped to [-87, 88], where e^x is a normal float.
inline float vectorExp(float x) {
  x = x > 88.0f ? 88.0f : x;  // ternaries, which become min and max instructions (std::min keeps a branch)
  x = x < -87.0f ? -87.0f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (no library call; the compiler keeps the order).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace loom::parallel::cpu
