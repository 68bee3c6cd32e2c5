// Unit tests of base/dtype and exec/reduce: every type x op x count x aliasing against a naive scalar reference,
// the fp16 / bf16 conversions against a reference built from frexp / ldexp / nearbyint in double (exhaustive
// where the input space allows), and the avg divide. Multi-rank avg is tested with the collectives, not here.
#include "src/exec/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "src/base/dtype.h"

namespace loom {
namespace {

// ---- Reference fp16 / bf16 codec, independent of dtype.h: exact arithmetic in double. ----

struct Format {
  int mantissaBits;
  int exponentBits;
  int bias() const { return (1 << (exponentBits - 1)) - 1; }
  uint32_t infBits() const { return ((1u << exponentBits) - 1) << mantissaBits; }
  uint32_t signBit() const { return 1u << (mantissaBits + exponentBits); }
  bool isNan(uint16_t bits) const {
    return (bits & infBits()) == infBits() && (bits & ((1u << mantissaBits) - 1)) != 0;
  }
};
constexpr Format kHalf{10, 5};
constexpr Format kBf16{7, 8};

double decodeReference(uint16_t bits, Format format) {
  const bool negative = bits & format.signBit();
  const uint32_t exponent = (bits & format.infBits()) >> format.mantissaBits;
  const uint32_t mantissa = bits & ((1u << format.mantissaBits) - 1);
  double magnitude;
  if (exponent == (1u << format.exponentBits) - 1) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, 1 - format.bias() - format.mantissaBits);
  } else {
    magnitude = std::ldexp(mantissa + (1u << format.mantissaBits),
                           static_cast<int>(exponent) - format.bias() - format.mantissaBits);
  }
  return negative ? -magnitude : magnitude;
}

// Nearest representable value, ties to even (nearbyint in the default rounding mode). NaN gives the canonical
// quiet NaN; callers compare NaN-ness only.
uint16_t encodeReference(double x, Format format) {
  if (std::isnan(x)) return static_cast<uint16_t>(format.infBits() | (1u << (format.mantissaBits - 1)));
  const uint32_t sign = std::signbit(x) ? format.signBit() : 0;
  const double magnitude = std::fabs(x);
  if (magnitude == 0) return static_cast<uint16_t>(sign);
  if (std::isinf(magnitude)) return static_cast<uint16_t>(sign | format.infBits());
  int exponent;
  std::frexp(magnitude, &exponent);
  exponent = std::max(exponent - 1, 1 - format.bias());  // magnitude in [2^exponent, 2^(exponent+1)) or subnormal
  const double significand = std::nearbyint(std::ldexp(magnitude, format.mantissaBits - exponent));
  // For a subnormal exponent == 1 - bias and this reduces to `significand`; a carry to 2^(mantissaBits+1)
  // moves into the exponent field, as it should.
  const double bits =
      std::ldexp(exponent + format.bias(), format.mantissaBits) + significand - std::ldexp(1, format.mantissaBits);
  return static_cast<uint16_t>(sign | std::min<uint32_t>(static_cast<uint32_t>(bits), format.infBits()));
}

float floatOf(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::string hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%04x", value);
  return text;
}

// ---- Names ----

TEST(Dtype, SizesAndNames) {
  const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"};
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  for (int t = 0; t < loomNumTypes; ++t) {
    EXPECT_TRUE(dtypeValid(t));
    EXPECT_STREQ(dtypeName(static_cast<loomDataType_t>(t)), names[t]);
    EXPECT_EQ(dtypeSize(static_cast<loomDataType_t>(t)), sizes[t]) << names[t];
  }
  const char* ops[] = {"sum", "prod", "max", "min", "avg"};
  for (int op = 0; op < loomNumOps; ++op) {
    EXPECT_TRUE(opValid(op));
    EXPECT_STREQ(opName(static_cast<loomRedOp_t>(op)), ops[op]);
  }
  EXPECT_FALSE(dtypeValid(-1));
  EXPECT_FALSE(dtypeValid(loomNumTypes));
  EXPECT_FALSE(opValid(-1));
  EXPECT_FALSE(opValid(loomNumOps));
  EXPECT_EQ(dtypeSize(loomNumTypes), 0u);
  EXPECT_STREQ(dtypeName(loomNumTypes), "unknown");
  EXPECT_STREQ(opName(loomNumOps), "unknown");
  EXPECT_EQ(sizeof(Half), 2u);
  EXPECT_EQ(sizeof(Bfloat16), 2u);
}

// ---- fp16 ----

TEST(HalfConversion, ExhaustiveToFloatAndBack) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = halfToFloat(bits);
    const double expected = decodeReference(bits, kHalf);
    if (kHalf.isNan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << hex(h);
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << hex(h);
      // NaN comes back quiet, with its sign and payload.
      ASSERT_EQ(floatToHalf(f), bits | 0x0200) << hex(h);
    } else {
      ASSERT_EQ(static_cast<double>(f), expected) << hex(h);
      ASSERT_EQ(std::signbit(f), std::signbit(expected)) << hex(h);
      ASSERT_EQ(floatToHalf(f), bits) << hex(h);
    }
  }
}

// Every rounding boundary: for each adjacent pair of halves, the exact midpoint (a tie) and the floats one ulp
// either side of it.
TEST(HalfConversion, RoundsEveryMidpointToNearestEven) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double low = decodeReference(static_cast<uint16_t>(h), kHalf);
    const double high = h + 1 < 0x7c00 ? decodeReference(static_cast<uint16_t>(h + 1), kHalf) : 65536.0;
    const float midpoint = static_cast<float>((low + high) / 2);
    ASSERT_EQ(static_cast<double>(midpoint), (low + high) / 2) << "midpoint not exact in fp32 at " << hex(h);
    for (const float f : {midpoint, std::nextafter(midpoint, 0.0f), std::nextafter(midpoint, INFINITY)}) {
      for (const float signedF : {f, -f}) {
        ASSERT_EQ(floatToHalf(signedF), encodeReference(signedF, kHalf))
            << "float " << hex(bitsOf(signedF)) << " between halves " << hex(h) << " and " << hex(h + 1);
      }
    }
  }
}

TEST(HalfConversion, MatchesReferenceOnSpreadOfFloats) {
  // An odd stride visits every exponent and a spread of mantissas of all 2^32 patterns.
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) {
    const float f = floatOf(static_cast<uint32_t>(u));
    const uint16_t h = floatToHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(kHalf.isNan(h)) << hex(static_cast<uint32_t>(u));
      ASSERT_TRUE(h & 0x0200) << "not quiet: " << hex(static_cast<uint32_t>(u));
      ASSERT_EQ((h & 0x8000) != 0, std::signbit(f));
    } else {
      ASSERT_EQ(h, encodeReference(f, kHalf)) << "float " << hex(static_cast<uint32_t>(u));
    }
  }
}

TEST(HalfConversion, HandPickedCases) {
  struct Case {
    float input;
    uint16_t expected;
    const char* what;
  };
  const Case cases[] = {
      {1.0f, 0x3c00, "one"},
      {1.0f + 0x1.0p-11f, 0x3c00, "1 + 2^-11 ties to even (down)"},
      {1.0f + 3 * 0x1.0p-11f, 0x3c02, "1 + 3*2^-11 ties to even (up)"},
      {1.0f + 0x1.0p-11f + 0x1.0p-20f, 0x3c01, "just above a tie rounds up"},
      {1.0f + 0x1.0p-11f - 0x1.0p-20f, 0x3c00, "just below a tie rounds down"},
      {-2.0f, 0xc000, "minus two"},
      {-0.0f, 0x8000, "negative zero"},
      {65504.0f, 0x7bff, "largest half"},
      {65519.0f, 0x7bff, "below the overflow threshold"},
      {65520.0f, 0x7c00, "overflow threshold ties up to inf"},
      {1e10f, 0x7c00, "far overflow"},
      {-1e10f, 0xfc00, "negative overflow"},
      {INFINITY, 0x7c00, "inf"},
      {-INFINITY, 0xfc00, "-inf"},
      {0x1.0p-14f, 0x0400, "smallest normal"},
      {0x1.0p-24f, 0x0001, "smallest subnormal"},
      {0x1.0p-25f, 0x0000, "half the smallest subnormal ties to zero"},
      {0x1.0p-25f + 0x1.0p-40f, 0x0001, "above that rounds up"},
      {3 * 0x1.0p-25f, 0x0002, "1.5 subnormal steps ties to even (2)"},
      {0x1.0p-14f - 0x1.0p-25f, 0x0400, "largest subnormal + half a step ties up to the smallest normal"},
      {-0x1.0p-24f, 0x8001, "negative subnormal"},
      {1e-10f, 0x0000, "underflow to zero"},
      {-1e-10f, 0x8000, "underflow to negative zero"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(floatToHalf(c.input), c.expected) << c.what << ": got " << hex(floatToHalf(c.input));
  }
  // NaN stays NaN: a signalling NaN with payload only in bits that do not survive must not become inf.
  for (const uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fa5a5a5u}) {
    const uint16_t h = floatToHalf(floatOf(nan));
    EXPECT_TRUE(kHalf.isNan(h)) << hex(nan) << " -> " << hex(h);
    EXPECT_TRUE(h & 0x0200) << hex(nan) << " -> " << hex(h) << " is not quiet";
    EXPECT_EQ((h & 0x8000) != 0, (nan & 0x80000000u) != 0);
  }
}

// ---- bf16 ----

TEST(Bf16Conversion, ExhaustiveToFloatAndBack) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = bf16ToFloat(bits);
    ASSERT_EQ(bitsOf(f), b << 16);
    if (kBf16.isNan(bits)) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_EQ(floatToBf16(f), bits | 0x0040) << hex(b);
    } else {
      ASSERT_EQ(static_cast<double>(f), decodeReference(bits, kBf16)) << hex(b);
      ASSERT_EQ(floatToBf16(f), bits) << hex(b);
    }
  }
}

TEST(Bf16Conversion, RoundsEveryMidpointToNearestEven) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    // Midpoint and its neighbours directly in fp32 bits: the bf16 value with 0x8000 appended.
    const uint32_t midpoint = (b << 16) | 0x8000u;
    for (const uint32_t u : {midpoint, midpoint - 1, midpoint + 1}) {
      for (const uint32_t signedU : {u, u | 0x80000000u}) {
        const float f = floatOf(signedU);
        ASSERT_EQ(floatToBf16(f), encodeReference(f, kBf16)) << "float " << hex(signedU);
      }
    }
  }
}

TEST(Bf16Conversion, HandPickedCases) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 0x1.0p-8f), 0x3f80) << "tie to even (down)";
  EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1.0p-8f), 0x3f82) << "tie to even (up)";
  EXPECT_EQ(floatToBf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81) << "above a tie";
  EXPECT_EQ(floatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBf16(floatOf(0x7f7fffffu)), 0x7f80) << "largest float rounds to inf";
  EXPECT_EQ(floatToBf16(floatOf(0x7f7f7fffu)), 0x7f7f) << "just below the overflow threshold";
  EXPECT_EQ(floatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(floatToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(floatToBf16(floatOf(0x00008000u)), 0x0000) << "subnormal tie to even (zero)";
  EXPECT_EQ(floatToBf16(floatOf(0x00018000u)), 0x0002) << "subnormal tie to even (up)";
  EXPECT_EQ(floatToBf16(floatOf(0x00008001u)), 0x0001) << "subnormal above a tie";
  for (const uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t b = floatToBf16(floatOf(nan));
    EXPECT_TRUE(kBf16.isNan(b)) << hex(nan) << " -> " << hex(b);
    EXPECT_TRUE(b & 0x0040) << hex(nan) << " -> " << hex(b) << " is not quiet";
    EXPECT_EQ((b & 0x8000) != 0, (nan & 0x80000000u) != 0);
  }
}

// ---- Reductions ----

// Element traits: random inputs that reach the interesting cases, the naive reference, and comparison.
template <typename T>
struct Elem {
  static T random(std::mt19937_64& rng) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(rng());  // the full range, so sums and products wrap
    } else {
      // Mostly ordinary values, sometimes the special ones.
      const uint64_t r = rng();
      switch (r % 64) {
        case 0:
          return std::numeric_limits<T>::quiet_NaN();
        case 1:
          return std::numeric_limits<T>::infinity();
        case 2:
          return -std::numeric_limits<T>::infinity();
        case 3:
          return T(0);
        case 4:
          return -T(0);
        case 5:
          return std::numeric_limits<T>::denorm_min() * static_cast<T>(r % 1000);
        case 6:
          return std::numeric_limits<T>::max();
        default:
          return std::ldexp(static_cast<T>(static_cast<int64_t>(r >> 11) % 2000001 - 1000000), -10);
      }
    }
  }
  static T reference(loomRedOp_t op, T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      switch (op) {
        case loomSum:
          return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
        case loomProd:
          return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
        case loomMax:
          return a > b ? a : b;
        case loomMin:
          return a < b ? a : b;
        default:
          return T(0);
      }
    } else {
      switch (op) {
        case loomSum:
          return a + b;
        case loomProd:
          return a * b;
        // fmax / fmin: a NaN loses to a number; equal operands give b.
        case loomMax:
          return std::isnan(a) ? b : std::isnan(b) ? a : (a > b ? a : b);
        case loomMin:
          return std::isnan(a) ? b : std::isnan(b) ? a : (a < b ? a : b);
        default:
          return T(0);
      }
    }
  }
  static bool same(T expected, T actual) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(expected)) return std::isnan(actual);
    }
    return std::memcmp(&expected, &actual, sizeof(T)) == 0;  // bitwise, so that +0 and -0 differ
  }
  static std::string show(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::to_string(value);
    } else {
      return std::to_string(static_cast<long long>(value)) + " (" +
             std::to_string(static_cast<unsigned long long>(value)) + ")";
    }
  }
};

template <typename Bits, Format kFormat>
struct SixteenBitElem {
  static Bits random(std::mt19937_64& rng) {
    uint64_t r = rng();
    uint32_t bits = static_cast<uint32_t>(r & 0xffff);
    // Half the time keep the exponent within 2^-3 .. 2^3 so that sums and products stay finite.
    if ((r >> 16) & 1) {
      const uint32_t exponent = static_cast<uint32_t>(kFormat.bias() - 3 + (r >> 17) % 7);
      bits = (bits & ~kFormat.infBits()) | (exponent << kFormat.mantissaBits);
    }
    return Bits{static_cast<uint16_t>(bits)};
  }
  static Bits reference(loomRedOp_t op, Bits a, Bits b) {
    const double x = decodeReference(a.bits, kFormat);
    const double y = decodeReference(b.bits, kFormat);
    double r = 0;
    switch (op) {
      case loomSum:
        r = x + y;
        break;  // exact or innocuously rounded in double; rounded once below
      case loomProd:
        r = x * y;
        break;
      case loomMax:
        r = std::isnan(x) ? y : std::isnan(y) ? x : (x > y ? x : y);
        break;
      case loomMin:
        r = std::isnan(x) ? y : std::isnan(y) ? x : (x < y ? x : y);
        break;
      default:
        break;
    }
    return Bits{encodeReference(r, kFormat)};
  }
  static bool same(Bits expected, Bits actual) {
    if (kFormat.isNan(expected.bits)) return kFormat.isNan(actual.bits);
    return expected.bits == actual.bits;
  }
  static std::string show(Bits value) {
    return hex(value.bits) + " = " + std::to_string(decodeReference(value.bits, kFormat));
  }
};

template <>
struct Elem<Half> : SixteenBitElem<Half, kHalf> {};
template <>
struct Elem<Bfloat16> : SixteenBitElem<Bfloat16, kBf16> {};

enum class Alias { kNone, kDstIsA, kDstIsB, kDstIsBoth };
const char* aliasName(Alias alias) {
  switch (alias) {
    case Alias::kNone:
      return "out of place";
    case Alias::kDstIsA:
      return "dst == a";
    case Alias::kDstIsB:
      return "dst == b";
    case Alias::kDstIsBoth:
      return "dst == a == b";
  }
  return "?";
}

// Runs the kernel in every aliasing arrangement and compares every element. The buffers start one element in,
// so that vector loops see addresses that are not vector-aligned and a write before dst would show.
template <typename T>
void checkReduce(loomDataType_t type, loomRedOp_t op, size_t count) {
  std::mt19937_64 rng(count * 131 + static_cast<size_t>(type) * 17 + static_cast<size_t>(op));
  std::vector<T> a(count + 1), b(count + 1);
  for (size_t i = 0; i <= count; ++i) {
    a[i] = Elem<T>::random(rng);
    b[i] = Elem<T>::random(rng);
  }
  const ReduceFn fn = reduceFunction(type, op);
  ASSERT_NE(fn, nullptr) << dtypeName(type) << " " << opName(op);
  std::vector<T> dst(count + 1);
  for (const Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB, Alias::kDstIsBoth}) {
    const std::string what =
        std::string(dtypeName(type)) + " " + opName(op) + " count " + std::to_string(count) + " " + aliasName(alias);
    const std::vector<T>& second = alias == Alias::kDstIsBoth ? a : b;
    T* out = dst.data() + 1;
    // dst[0] sits just before the range; it must still hold `guard` afterwards.
    const std::vector<T>& initial = alias == Alias::kDstIsB ? b : a;
    if (alias == Alias::kNone) {
      std::fill(dst.begin(), dst.end(), Elem<T>::random(rng));
    } else {
      std::copy(initial.begin(), initial.end(), dst.begin());
    }
    const T guard = dst[0];
    switch (alias) {
      case Alias::kNone:
        fn(out, a.data() + 1, b.data() + 1, count);
        break;
      case Alias::kDstIsA:
        fn(out, out, b.data() + 1, count);
        break;
      case Alias::kDstIsB:
        fn(out, a.data() + 1, out, count);
        break;
      case Alias::kDstIsBoth:
        fn(out, out, out, count);
        break;
    }
    ASSERT_TRUE(Elem<T>::same(guard, dst[0])) << what << ": wrote before dst";
    size_t mismatches = 0;
    for (size_t i = 0; i < count && mismatches < 5; ++i) {
      const T expected = Elem<T>::reference(op, a[i + 1], second[i + 1]);
      if (!Elem<T>::same(expected, out[i])) {
        ++mismatches;
        ADD_FAILURE() << what << " [" << i << "]: " << Elem<T>::show(a[i + 1]) << " " << opName(op) << " "
                      << Elem<T>::show(second[i + 1]) << " expected " << Elem<T>::show(expected) << " got "
                      << Elem<T>::show(out[i]);
      }
    }
  }
}

template <typename Fn>
void withType(loomDataType_t type, Fn&& fn) {
  switch (type) {
    case loomInt8:
      return fn(int8_t{});
    case loomUint8:
      return fn(uint8_t{});
    case loomInt32:
      return fn(int32_t{});
    case loomUint32:
      return fn(uint32_t{});
    case loomInt64:
      return fn(int64_t{});
    case loomUint64:
      return fn(uint64_t{});
    case loomFloat16:
      return fn(Half{});
    case loomFloat32:
      return fn(float{});
    case loomFloat64:
      return fn(double{});
    case loomBfloat16:
      return fn(Bfloat16{});
    default:
      FAIL() << "no such type " << type;
  }
}

class ReduceTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ReduceTest, MatchesScalarReference) {
  const auto type = static_cast<loomDataType_t>(std::get<0>(GetParam()));
  const auto op = static_cast<loomRedOp_t>(std::get<1>(GetParam()));
  for (const size_t count : {0ul, 1ul, 7ul, 1000ul, 1000003ul}) {
    withType(type, [&](auto tag) { checkReduce<decltype(tag)>(type, op, count); });
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceTest,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(loomNumTypes)),
                                            ::testing::Values(loomSum, loomProd, loomMax, loomMin)),
                         [](const auto& info) {
                           return std::string(dtypeName(static_cast<loomDataType_t>(std::get<0>(info.param)))) + "_" +
                                  opName(static_cast<loomRedOp_t>(std::get<1>(info.param)));
                         });

TEST(Reduce, AvgUsesSumKernelAndInvalidArgumentsGiveNull) {
  for (int t = 0; t < loomNumTypes; ++t) {
    const auto type = static_cast<loomDataType_t>(t);
    EXPECT_EQ(reduceFunction(type, loomAvg), reduceFunction(type, loomSum)) << dtypeName(type);
  }
  EXPECT_EQ(reduceFunction(loomNumTypes, loomSum), nullptr);
  EXPECT_EQ(reduceFunction(loomFloat32, loomNumOps), nullptr);
  EXPECT_EQ(reduceFunction(static_cast<loomDataType_t>(-1), loomSum), nullptr);
}

TEST(Reduce, FloatMaxMinNanAndSignedZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float a[] = {nan, 1.0f, nan, -0.0f, 0.0f, -INFINITY};
  const float b[] = {2.0f, nan, nan, 0.0f, -0.0f, 3.0f};
  float out[6];
  reduceFunction(loomFloat32, loomMax)(out, a, b, 6);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_FALSE(std::signbit(out[3])) << "equal operands give b";
  EXPECT_TRUE(std::signbit(out[4])) << "equal operands give b";
  EXPECT_EQ(out[5], 3.0f);
  reduceFunction(loomFloat32, loomMin)(out, a, b, 6);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[5], -INFINITY);
}

TEST(Reduce, IntegerWrapAround) {
  const int32_t a[] = {INT32_MAX, INT32_MIN, 65536};
  const int32_t b[] = {1, -1, 65536};
  int32_t out[3];
  reduceFunction(loomInt32, loomSum)(out, a, b, 2);
  EXPECT_EQ(out[0], INT32_MIN);
  EXPECT_EQ(out[1], INT32_MAX);
  reduceFunction(loomInt32, loomProd)(out, a + 2, b + 2, 1);
  EXPECT_EQ(out[0], 0);
  const int8_t c[] = {127, -128, 16};
  const int8_t d[] = {1, -1, 16};
  int8_t out8[3];
  reduceFunction(loomInt8, loomSum)(out8, c, d, 2);
  EXPECT_EQ(out8[0], -128);
  EXPECT_EQ(out8[1], 127);
  reduceFunction(loomInt8, loomProd)(out8, c + 2, d + 2, 1);
  EXPECT_EQ(out8[0], 0);
}

// ---- divideInPlace ----

template <typename T>
void checkIntegerDivide(loomDataType_t type, std::vector<T> values, int divisor) {
  std::vector<T> data = values;
  divideInPlace(data.data(), data.size(), type, divisor);
  for (size_t i = 0; i < values.size(); ++i) {
    // C division truncates toward zero; computed here in a type wide enough for every input.
    const T expected = static_cast<T>(
        std::is_signed_v<T> ? static_cast<T>(static_cast<int64_t>(values[i]) / divisor)
                            : static_cast<T>(static_cast<uint64_t>(values[i]) / static_cast<uint64_t>(divisor)));
    EXPECT_EQ(data[i], expected) << dtypeName(type) << " " << Elem<T>::show(values[i]) << " / " << divisor;
  }
}

TEST(DivideInPlace, IntegersTruncateTowardZero) {
  for (const int divisor : {2, 3, 7, 200, 1000}) {
    checkIntegerDivide<int8_t>(loomInt8, {-7, 7, -128, 127, -1, 0, -100}, divisor);
    checkIntegerDivide<uint8_t>(loomUint8, {7, 255, 0, 200, 1}, divisor);
    checkIntegerDivide<int32_t>(loomInt32, {-7, 7, INT32_MIN, INT32_MAX, -1, -999999}, divisor);
    checkIntegerDivide<uint32_t>(loomUint32, {7, UINT32_MAX, 0, 0x80000000u}, divisor);
    checkIntegerDivide<int64_t>(loomInt64, {-7, 7, INT64_MIN, INT64_MAX, -1, -123456789012345}, divisor);
    checkIntegerDivide<uint64_t>(loomUint64, {7, UINT64_MAX, 0, 1ull << 63}, divisor);
  }
  int32_t negative[] = {-7, -8, -9};
  divideInPlace(negative, 3, loomInt32, 4);
  EXPECT_EQ(negative[0], -1);  // not -2: truncation, not floor
  EXPECT_EQ(negative[1], -2);
  EXPECT_EQ(negative[2], -2);
  // Long enough to run the chunked loop and its tail.
  std::vector<int64_t> many(1000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = -static_cast<int64_t>(i);
  divideInPlace(many.data(), many.size(), loomInt64, 3);
  for (size_t i = 0; i < many.size(); ++i) ASSERT_EQ(many[i], -static_cast<int64_t>(i) / 3) << i;
}

TEST(DivideInPlace, FloatAndDouble) {
  std::vector<float> f(1000);
  std::vector<double> d(1000);
  for (size_t i = 0; i < f.size(); ++i) {
    d[i] = static_cast<double>(i) - 500.25;
    f[i] = static_cast<float>(d[i]);
  }
  divideInPlace(f.data(), f.size(), loomFloat32, 3);
  divideInPlace(d.data(), d.size(), loomFloat64, 3);
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(f[i], (static_cast<float>(i) - 500.25f) / 3.0f) << i;
    ASSERT_EQ(d[i], (static_cast<double>(i) - 500.25) / 3.0) << i;
  }
}

// Exhaustive over every bit pattern. For divisors representable in the format, fp32 division followed by one
// rounding equals the correctly rounded quotient, which the reference computes in double.
TEST(DivideInPlace, HalfAndBf16Exhaustive) {
  for (const auto& [type, format] : {std::pair{loomFloat16, kHalf}, std::pair{loomBfloat16, kBf16}}) {
    for (const int divisor : {2, 3, 7, 1000}) {
      std::vector<uint16_t> data(65536);
      for (uint32_t i = 0; i < 65536; ++i) data[i] = static_cast<uint16_t>(i);
      divideInPlace(data.data(), data.size(), type, divisor);
      for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t expected = encodeReference(decodeReference(static_cast<uint16_t>(i), format) / divisor, format);
        if (format.isNan(expected)) {
          ASSERT_TRUE(format.isNan(data[i])) << dtypeName(type) << " " << hex(i) << " / " << divisor;
        } else {
          ASSERT_EQ(data[i], expected) << dtypeName(type) << " " << hex(i) << " / " << divisor << " got "
                                       << hex(data[i]);
        }
      }
    }
  }
}

TEST(DivideInPlace, DivisorBelowTwoLeavesDataAlone) {
  int32_t data[] = {INT32_MIN, 5};
  for (const int divisor : {1, 0, -1}) {
    divideInPlace(data, 2, loomInt32, divisor);
    EXPECT_EQ(data[0], INT32_MIN);
    EXPECT_EQ(data[1], 5);
  }
  divideInPlace(nullptr, 0, loomFloat16, 4);  // count 0 touches nothing
}

// avg over three "ranks" is sum, sum, then one divide.
TEST(DivideInPlace, AvgIsSumThenDivide) {
  const int32_t r0[] = {1, -5, 10};
  const int32_t r1[] = {2, -5, 10};
  const int32_t r2[] = {4, -6, 11};
  int32_t acc[3];
  ReduceFn sum = reduceFunction(loomInt32, loomAvg);
  sum(acc, r0, r1, 3);
  sum(acc, acc, r2, 3);
  divideInPlace(acc, 3, loomInt32, 3);
  EXPECT_EQ(acc[0], 2);   // 7 / 3
  EXPECT_EQ(acc[1], -5);  // -16 / 3 truncates toward zero
  EXPECT_EQ(acc[2], 10);  // 31 / 3
  const uint16_t h0[] = {floatToHalf(1.0f), floatToHalf(0.1f)};
  const uint16_t h1[] = {floatToHalf(2.0f), floatToHalf(0.2f)};
  uint16_t h[2];
  reduceFunction(loomFloat16, loomAvg)(h, h0, h1, 2);
  divideInPlace(h, 2, loomFloat16, 2);
  EXPECT_EQ(halfToFloat(h[0]), 1.5f);
  EXPECT_EQ(h[1], floatToHalf((halfToFloat(floatToHalf(halfToFloat(h0[1]) + halfToFloat(h1[1])))) / 2));
}

// Wider partials (RankPlan::wideScratch): every combination of narrow and fp32 operands and result, for every op,
// at counts around the kernels' blocks, against the scalar reference: widen exactly, combine in fp32, round only
// a narrow result. In place too. Summing n fp16 values through fp32 partials rounds once: it differs from
// rounding after each combination where the inputs say so, and equals the reference everywhere.
TEST(WideReduce, EveryMixOfNarrowAndWideAgainstReference) {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> spread(-300.0f, 300.0f);
  for (const loomDataType_t type : {loomFloat16, loomBfloat16}) {
    const bool half = type == loomFloat16;
    auto widen = [&](uint16_t x) { return half ? halfToFloat(x) : bf16ToFloat(x); };
    auto narrow = [&](float x) { return half ? floatToHalf(x) : floatToBf16(x); };
    for (const loomRedOp_t op : {loomSum, loomProd, loomMax, loomMin, loomAvg}) {
      WideReduceFn kernel = wideReduceFunction(type, op);
      ASSERT_NE(kernel, nullptr);
      auto apply = [&](float a, float b) {
        switch (op) {
          case loomProd: return a * b;
          case loomMax: return std::fmax(a, b);
          case loomMin: return std::fmin(a, b);
          default: return a + b;
        }
      };
      for (const size_t count : {size_t{1}, size_t{255}, size_t{256}, size_t{700}}) {
        std::vector<float> wa(count), wb(count);
        std::vector<uint16_t> na(count), nb(count);
        for (size_t i = 0; i < count; ++i) {
          wa[i] = spread(random), wb[i] = spread(random);
          na[i] = narrow(spread(random)), nb[i] = narrow(spread(random));
        }
        for (int mix = 0; mix < 8; ++mix) {
          const bool dstWide = mix & 1, aWide = mix & 2, bWide = mix & 4;
          const void* a = aWide ? static_cast<const void*>(wa.data()) : na.data();
          const void* b = bWide ? static_cast<const void*>(wb.data()) : nb.data();
          std::vector<float> wout(count);
          std::vector<uint16_t> nout(count);
          kernel(dstWide ? static_cast<void*>(wout.data()) : nout.data(), dstWide, a, aWide, b, bWide, count);
          for (size_t i = 0; i < count; ++i) {
            const float want = apply(aWide ? wa[i] : widen(na[i]), bWide ? wb[i] : widen(nb[i]));
            if (dstWide) {
              ASSERT_EQ(floatBits(wout[i]), floatBits(want)) << dtypeName(type) << " " << opName(op) << " " << mix;
            } else {
              ASSERT_EQ(nout[i], narrow(want)) << dtypeName(type) << " " << opName(op) << " mix " << mix;
            }
          }
        }
        // In place: a wide partial combined with a narrow operand into itself.
        std::vector<float> acc = wa;
        kernel(acc.data(), true, acc.data(), true, nb.data(), false, count);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(floatBits(acc[i]), floatBits(apply(wa[i], widen(nb[i]))));
      }
    }
    EXPECT_EQ(wideReduceFunction(loomFloat32, loomSum), nullptr);
    EXPECT_EQ(wideReduceFunction(type, static_cast<loomRedOp_t>(99)), nullptr);

    // Conversions both ways, and a copy where both sides are alike.
    std::vector<uint16_t> all(65536), back(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> wide(65536);
    convertPartials(type, wide.data(), true, all.data(), false, all.size());
    convertPartials(type, back.data(), false, wide.data(), true, all.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      if (std::isnan(wide[i])) continue;
      ASSERT_EQ(floatBits(wide[i]), floatBits(widen(all[i])));
      ASSERT_EQ(back[i], all[i]) << hex(i);
    }

    // Three ranks' fp16 operands: one rounding of the fp32 sum, not two.
    const uint16_t x0 = narrow(1.0f), x1 = narrow(half ? 0.00048828125f : 0.00390625f), x2 = x1;
    WideReduceFn sum = wideReduceFunction(type, loomSum);
    float partial = 0;
    sum(&partial, true, &x0, false, &x1, false, 1);
    uint16_t once = 0, twice = 0;
    sum(&once, false, &partial, true, &x2, false, 1);
    ReduceFn stepwise = reduceFunction(type, loomSum);
    stepwise(&twice, &x0, &x1, 1);
    stepwise(&twice, &twice, &x2, 1);
    EXPECT_EQ(once, narrow(widen(x0) + widen(x1) + widen(x2)));
    EXPECT_NE(once, twice) << "x1 is half an ulp of 1: each rounding alone ties to even, back to 1";
  }
}

}  // namespace
}  // namespace loom
