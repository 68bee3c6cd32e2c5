// Test data for element-wise kernels: random bit patterns of any type (for the float types that covers NaNs with
// every payload, infinities, subnormals and both zeros), and a comparison that takes any two NaNs as equal.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "loom/loom.h"
#include "src/base/dtype.h"

namespace loomtest {

inline std::vector<unsigned char> randomBytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<unsigned char> data(bytes);
  for (auto& byte : data) byte = static_cast<unsigned char>(random());
  return data;
}

// Writes every pair of special values into the first elements of a and b (as many as fit): zeros of both signs,
// infinities, NaN, ones, the smallest subnormal and the largest finite value, where a random bit pattern would
// rarely bring +0 against -0 or a number against NaN.
inline void plantSpecials(loomDataType_t type, std::vector<unsigned char>& a, std::vector<unsigned char>& b) {
  const double inf = INFINITY, nan = NAN;
  const double specials[] = {0.0, -0.0, inf, -inf, nan, 1.0, -1.0, 5.9604644775390625e-08, 65504.0, -2.0};
  const size_t size = loom::dtypeSize(type), count = sizeof(specials) / sizeof(specials[0]);
  auto encode = [&](double value, unsigned char* out) {
    switch (type) {
      case loomFloat16: {
        uint16_t bits = loom::floatToHalf(static_cast<float>(value));
        std::memcpy(out, &bits, 2);
        return;
      }
      case loomBfloat16: {
        uint16_t bits = loom::floatToBf16(static_cast<float>(value));
        std::memcpy(out, &bits, 2);
        return;
      }
      case loomFloat32: {
        float single = static_cast<float>(value);
        std::memcpy(out, &single, 4);
        return;
      }
      case loomFloat64:
        std::memcpy(out, &value, 8);
        return;
      default: {  // integers: 0, 0, -1 (all ones), 0, 0, 1, -1, 0, 65504 truncated, -2
        int64_t integer = std::isfinite(value) ? static_cast<int64_t>(value) : (std::isnan(value) ? 0 : -1);
        std::memcpy(out, &integer, size);  // little-endian: the low bytes
        return;
      }
    }
  };
  size_t index = 0;
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = 0; j < count; ++j, ++index) {
      if ((index + 1) * size > a.size() || (index + 1) * size > b.size()) return;
      encode(specials[i], &a[index * size]);
      encode(specials[j], &b[index * size]);
    }
  }
}

// Whether element `index` of x and y is the same value: equal bits, or both NaN.
inline bool sameElement(loomDataType_t type, const void* x, const void* y, size_t index) {
  const size_t size = loom::dtypeSize(type);
  const auto* a = static_cast<const unsigned char*>(x) + index * size;
  const auto* b = static_cast<const unsigned char*>(y) + index * size;
  if (std::memcmp(a, b, size) == 0) return true;
  auto bothNan = [&](auto decode) { return std::isnan(decode(a)) && std::isnan(decode(b)); };
  switch (type) {
    case loomFloat16:
      return bothNan([](const unsigned char* p) {
        uint16_t bits;
        std::memcpy(&bits, p, 2);
        return loom::halfToFloat(bits);
      });
    case loomBfloat16:
      return bothNan([](const unsigned char* p) {
        uint16_t bits;
        std::memcpy(&bits, p, 2);
        return loom::bf16ToFloat(bits);
      });
    case loomFloat32:
      return bothNan([](const unsigned char* p) {
        float value;
        std::memcpy(&value, p, 4);
        return value;
      });
    case loomFloat64:
      return bothNan([](const unsigned char* p) {
        double value;
        std::memcpy(&value, p, 8);
        return value;
      });
    default:
      return false;
  }
}

}  // namespace loomtest
