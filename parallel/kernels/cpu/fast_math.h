// What the CPU kernels' loops are built from so that they vectorize: a dispatch attribute that compiles a hot loop for
// the CPU it runs on, a vectorizable e^x (glibc's expf is a call, which keeps a loop scalar), and double sums kept in
// vector lanes. Internal to parallel/kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

// A function marked LOOM_CPU_DISPATCH is compiled three times, for baseline x86-64 (SSE2), x86-64-v3 (AVX2) and
// x86-64-v4 (AVX-512), and the loader picks the one the CPU supports (GCC's target_clones, an ifunc), as PyTorch
// dispatches its CPU kernels. The library is built with -ffp-contract=off, so every version rounds each operation
// the same way and gives the same bits: only the width of the vectors differs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_CPU_DISPATCH __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define LOOM_CPU_DISPATCH
#endif

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

// The sum of term(i) for i < n in double, kept in eight partial sums (lane j takes the i with i % 8 == j) that are
// added in a fixed order at the end: a plain running sum is a chain the vectorizer may not reorder, and this order
// is the same on every CPU.
template <typename Term>
inline double laneSum(size_t n, Term term) {
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += term(i + j);
  for (; i < n; ++i) lanes[i % kLanes] += term(i);
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace loom::parallel::cpu
