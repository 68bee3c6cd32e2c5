// perf/check_data.cc — check data for the perf harness: the values each rank sends and the results it must
// receive, stored through one type switch (withType) that also converts to and from half and bfloat16, and the
// comparison that counts wrong elements. Integers small enough to be exact in every type; no random data.
#include "perf/check_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace perf {
namespace {

// ---- types and their host conversions ----

bool isFloating(loomDataType_t type) {
  return type == loomFloat16 || type == loomFloat32 || type == loomFloat64 || type == loomBfloat16;
}
// Stored fraction bits of a floating type: its unit roundoff is 2^-fractionBits.
int fractionBits(loomDataType_t type) {
  return type == loomFloat16 ? 10 : type == loomBfloat16 ? 7 : type == loomFloat32 ? 23 : 52;
}
bool isUnsigned(loomDataType_t type) { return type == loomUint8 || type == loomUint32 || type == loomUint64; }

uint16_t floatToHalf(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u);
  int exponent = static_cast<int>(magnitude >> 23) - 127 + 15;
  uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent >= 31) return sign | 0x7c00u;
  uint32_t shift = 13, result;
  if (exponent <= 0) {  // subnormal half: shift the (now explicit) leading one into the fraction
    if (exponent < -10) return sign;
    mantissa |= 0x800000u;
    shift = 14 - exponent;
    result = mantissa >> shift;
  } else {
    result = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> shift);
  }
  uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (result & 1))) result++;  // a carry may reach infinity: correct
  return static_cast<uint16_t>(sign | result);
}

float halfToFloat(uint16_t half) {
  uint32_t sign = (half & 0x8000u) << 16, exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ffu;
  if (exponent == 0) {
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  uint32_t bits =
      sign | (exponent == 0x1f ? 0x7f800000u | (mantissa << 13) : ((exponent + 112) << 23) | (mantissa << 13));
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

uint16_t floatToBfloat16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // keep NaN a NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

float bfloat16ToFloat(uint16_t value) {
  uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result;
  memcpy(&result, &bits, 4);
  return result;
}

// Calls fn(pointer to the buffer as its storage type, store, load) for `type`; store and load convert from and
// to double, exactly for the small integers the check uses.
template <typename Fn>
void withType(loomDataType_t type, Fn fn) {
  auto plain = [&](auto* pointer) {
    using T = std::remove_pointer_t<decltype(pointer)>;
    fn(
        pointer, [](double v) { return static_cast<T>(v); }, [](T v) { return static_cast<double>(v); });
  };
  switch (type) {
    case loomInt8:
      return plain(static_cast<int8_t*>(nullptr));
    case loomUint8:
      return plain(static_cast<uint8_t*>(nullptr));
    case loomInt32:
      return plain(static_cast<int32_t*>(nullptr));
    case loomUint32:
      return plain(static_cast<uint32_t*>(nullptr));
    case loomInt64:
      return plain(static_cast<int64_t*>(nullptr));
    case loomUint64:
      return plain(static_cast<uint64_t*>(nullptr));
    case loomFloat32:
      return plain(static_cast<float*>(nullptr));
    case loomFloat64:
      return plain(static_cast<double*>(nullptr));
    case loomFloat16:
      return fn(
          static_cast<uint16_t*>(nullptr), [](double v) { return floatToHalf(static_cast<float>(v)); },
          [](uint16_t v) { return static_cast<double>(halfToFloat(v)); });
    default:
      return fn(
          static_cast<uint16_t*>(nullptr), [](double v) { return floatToBfloat16(static_cast<float>(v)); },
          [](uint16_t v) { return static_cast<double>(bfloat16ToFloat(v)); });
  }
}

template <typename ValueAt>
void storeValues(void* buf, size_t count, loomDataType_t type, ValueAt valueAt) {
  withType(type, [&](auto* typed, auto store, auto) {
    auto* out = reinterpret_cast<decltype(typed)>(buf);
    for (size_t i = 0; i < count; i++) out[i] = store(valueAt(i));
  });
}

// ---- the values ----

// Largest data value + 1: every value below it is exact in the type (bf16 holds integers up to 256 exactly).
uint64_t dataModulus(loomDataType_t type) {
  switch (type) {
    case loomInt8:
      return 127;
    case loomUint8:
    case loomBfloat16:
      return 251;
    case loomFloat16:
      return 2039;
    default:
      return 1000003;
  }
}

// Sum, prod and avg take non-neutral values from at most kActiveRanks ranks per element (which ranks rotates
// with the index, so every rank is checked), keeping results within int8 at any rank count.
constexpr uint64_t kActiveRanks = 8;
// Max and min values cycle with period 41 in the rank, so 41 ranks show every value.
constexpr uint64_t kMaxMinPeriod = 41;

double reduceInputValue(loomDataType_t type, loomRedOp_t op, uint64_t rank, uint64_t nranks, uint64_t index) {
  bool negatives = !isUnsigned(type);
  uint64_t distance = (rank + nranks - index % nranks) % nranks;  // 0 for the element's first contributor
  switch (op) {
    case loomProd:
      if (distance < 3 && (index + rank) % 2 == 0) return 2;
      return distance == 3 && negatives && index % 3 == 0 ? -1 : 1;
    case loomMax:
    case loomMin:
      return static_cast<double>((rank * 7 + index * 13) % kMaxMinPeriod) - (negatives ? 20.0 : 0.0);
    default:  // sum, avg: avg keeps to non-negative values so integer division has one meaning
      if (distance >= kActiveRanks) return 0;
      return static_cast<double>((index + rank) % 5) - (op == loomSum && negatives ? 2.0 : 0.0);
  }
}

double reduceResultValue(loomDataType_t type, loomRedOp_t op, uint64_t nranks, uint64_t index) {
  if (op == loomMax || op == loomMin) {
    double result = reduceInputValue(type, op, 0, nranks, index);
    for (uint64_t rank = 1; rank < std::min(nranks, kMaxMinPeriod); rank++) {
      double v = reduceInputValue(type, op, rank, nranks, index);
      result = op == loomMax ? std::max(result, v) : std::min(result, v);
    }
    return result;
  }
  double result = op == loomProd ? 1 : 0;
  for (uint64_t distance = 0; distance < std::min(nranks, kActiveRanks); distance++) {
    double v = reduceInputValue(type, op, (index + distance) % nranks, nranks, index);
    result = op == loomProd ? result * v : result + v;
  }
  if (op == loomAvg) result = isFloating(type) ? result / nranks : std::trunc(result / nranks);
  return result;
}

}  // namespace

size_t typeSize(loomDataType_t type) {
  static const size_t kSizes[loomNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return kSizes[type];
}

void fillData(void* buf, size_t count, loomDataType_t type, int rank, size_t offset) {
  const uint64_t modulus = dataModulus(type);
  storeValues(buf, count, type, [&](size_t i) {
    return static_cast<double>((static_cast<uint64_t>(rank) * 131 + (offset + i) * 7 + 3) % modulus);
  });
}

void fillGathered(void* buf, size_t block, loomDataType_t type, int nranks) {
  for (int r = 0; r < nranks; ++r)
    fillData(static_cast<char*>(buf) + r * block * typeSize(type), block, type, r, r * block);
}

void fillReduceInput(void* buf, size_t count, loomDataType_t type, loomRedOp_t op, int rank, int nranks,
                     size_t offset) {
  storeValues(buf, count, type, [&](size_t i) { return reduceInputValue(type, op, rank, nranks, offset + i); });
}

void fillReduceResult(void* buf, size_t count, loomDataType_t type, loomRedOp_t op, int nranks, size_t offset) {
  storeValues(buf, count, type, [&](size_t i) { return reduceResultValue(type, op, nranks, offset + i); });
}

void fillPoison(void* buf, size_t count, loomDataType_t type) {
  memset(buf, type == loomUint8 ? 0xff : 0x7f, count * typeSize(type));
}

double reduceTolerance(loomDataType_t type, loomRedOp_t op, int nranks) {
  if (op != loomAvg || !isFloating(type)) return 0;
  double epsilon = std::ldexp(1.0, -fractionBits(type));
  return epsilon * static_cast<double>(std::min<uint64_t>(nranks, kActiveRanks) + 1);
}

int64_t countWrong(const void* got, const void* expected, size_t count, loomDataType_t type, double tolerance) {
  int64_t wrong = 0;
  withType(type, [&](auto* typed, auto, auto load) {
    auto* g = reinterpret_cast<const std::remove_pointer_t<decltype(typed)>*>(got);
    auto* e = reinterpret_cast<const std::remove_pointer_t<decltype(typed)>*>(expected);
    for (size_t i = 0; i < count; i++) {
      double want = load(e[i]), have = load(g[i]);
      if (!(std::fabs(have - want) <= tolerance * std::max(1.0, std::fabs(want)))) wrong++;  // NaN is wrong
    }
  });
  return wrong;
}

}  // namespace perf
