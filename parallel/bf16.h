// bfloat16 on the host: the storage type of bf16 tensors (the top half of an IEEE float), and the conversions,
// rounding to nearest even as CUDA's __float2bfloat16 does. The CUDA kernels read the same bits as __nv_bfloat16.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom::parallel {

struct Bf16 {
  uint16_t bits;
};
static_assert(sizeof(Bf16) == 2);

inline float fromBf16(Bf16 value) {
  const uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

inline Bf16 toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)  // NaN stays a (quiet) NaN
    return Bf16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round half to even
  return Bf16{static_cast<uint16_t>(bits >> 16)};
}

}  // namespace loom::parallel
