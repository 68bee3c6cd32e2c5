// Host reduction kernels, one template per element type and operator, chosen through a table once per call.
// The loops are plain C++ shaped for GCC's auto-vectoriser; half and bfloat16 are widened to fp32 a block at a
// time so that the conversions vectorise too. Left out: threading, non-temporal stores, and run-time CPU
// dispatch (wider vectors and F16C come from the compiler flags the library is built with).
#include "src/exec/reduce.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/base/dtype.h"

namespace loom {

namespace {

// At -O2 GCC's "very cheap" vectoriser cost model only vectorises a loop whose trip count is a known multiple
// of the vector width. So the bulk of every loop runs in chunks of kChunk elements (a multiple of any vector
// width in elements, AVX-512 int8 included) and only the tail of fewer than kChunk elements is scalar.
constexpr size_t kChunk = 64;

template <typename Body>
[[gnu::always_inline]] inline void forEachIndex(size_t count, Body body) {
  size_t i = 0;
  for (; i + kChunk <= count; i += kChunk) {
    for (size_t j = 0; j < kChunk; ++j) body(i + j);
  }
  for (; i < count; ++i) body(i);
}

// Integer sum and product in the unsigned type, where overflow wraps instead of being undefined. (int8 and
// uint8 are promoted to int, where 255 * 255 still fits.)
template <typename T, bool = std::is_integral_v<T>>
struct ArithOf {
  using Type = T;
};
template <typename T>
struct ArithOf<T, true> {
  using Type = std::make_unsigned_t<T>;
};
template <typename T>
using Arith = typename ArithOf<T>::Type;

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(static_cast<Arith<T>>(a) + static_cast<Arith<T>>(b));
  }
};

struct Prod {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(static_cast<Arith<T>>(a) * static_cast<Arith<T>>(b));
  }
};

// fmax semantics written as compare-and-select, which vectorises where a call to std::fmax does not. The
// NaN test is on b only: if a is NaN, `a > b` is false and b is chosen anyway. Equal operands (+0 and -0)
// give b.
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return ((a > b) | std::isnan(b)) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

struct Min {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return ((a < b) | std::isnan(b)) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

// One loop per aliasing case, so that every pointer can be __restrict__ without lying to the compiler: writing
// through dst while reading the same element through a would break a restrict promise even though the loop
// itself is harmless. noinline because GCC 12 loses the restrict information when these are inlined into
// reduceNative, and at -O2 it does not vectorise a loop that would need a run-time alias check.
template <typename T, typename Op>
[[gnu::noinline]] void combineInto(T* __restrict__ dst, const T* __restrict__ a, const T* __restrict__ b,
                                   size_t count) {
  forEachIndex(count, [=](size_t i) { dst[i] = Op::apply(a[i], b[i]); });
}

// acc[i] = acc[i] op other[i] (kAccIsA) or other[i] op acc[i]: keeps the operand order of the out-of-place
// loop, which matters for float max/min of +0 and -0 and for which NaN a float sum returns.
template <typename T, typename Op, bool kAccIsA>
[[gnu::noinline]] void combineInPlace(T* __restrict__ acc, const T* __restrict__ other, size_t count) {
  forEachIndex(count, [=](size_t i) { acc[i] = kAccIsA ? Op::apply(acc[i], other[i]) : Op::apply(other[i], acc[i]); });
}

template <typename T, typename Op>
[[gnu::noinline]] void combineWithSelf(T* data, size_t count) {
  forEachIndex(count, [=](size_t i) { data[i] = Op::apply(data[i], data[i]); });
}

template <typename T, typename Op>
void reduceNative(void* dst, const void* a, const void* b, size_t count) {
  T* out = static_cast<T*>(dst);
  const T* inA = static_cast<const T*>(a);
  const T* inB = static_cast<const T*>(b);
  if (dst == a && dst == b) {
    combineWithSelf<T, Op>(out, count);
  } else if (dst == a) {
    combineInPlace<T, Op, true>(out, inB, count);
  } else if (dst == b) {
    combineInPlace<T, Op, false>(out, inA, count);
  } else {
    combineInto<T, Op>(out, inA, inB, count);
  }
}

// 16-bit float formats are widened to fp32 in blocks of kBlock elements held on the stack (2 KiB for both
// inputs), small enough to stay in L1 next to the streams being reduced.
constexpr size_t kBlock = 256;

struct HalfFormat {
  static void widen(const uint16_t* __restrict__ src, float* __restrict__ dst, size_t n) {
#ifdef __F16C__
    size_t i = 0;
    // GCC does not vectorise a loop of scalar F16C conversions, so use the 8-wide instruction directly.
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
    for (; i < n; ++i) dst[i] = halfToFloat(src[i]);
#else
    forEachIndex(n, [=](size_t j) { dst[j] = halfToFloat(src[j]); });
#endif
  }
  static void narrow(const float* __restrict__ src, uint16_t* __restrict__ dst, size_t n) {
#ifdef __F16C__
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) dst[i] = floatToHalf(src[i]);
#else
    forEachIndex(n, [=](size_t j) { dst[j] = floatToHalf(src[j]); });
#endif
  }
};

struct Bf16Format {
  static void widen(const uint16_t* __restrict__ src, float* __restrict__ dst, size_t n) {
    forEachIndex(n, [=](size_t i) { dst[i] = bf16ToFloat(src[i]); });
  }
  static void narrow(const float* __restrict__ src, uint16_t* __restrict__ dst, size_t n) {
    forEachIndex(n, [=](size_t i) { dst[i] = floatToBf16(src[i]); });
  }
};

// Any exact aliasing of dst with a or b is safe here: a block of both inputs is widened before the same block
// of dst is written. Rounding the fp32 result once more gives the correctly rounded 16-bit sum or product: fp32
// has at least twice the precision of either format plus two bits, which makes the double rounding harmless.
template <typename Format, typename Op>
void reduceSixteenBit(void* dst, const void* a, const void* b, size_t count) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  const uint16_t* inA = static_cast<const uint16_t*>(a);
  const uint16_t* inB = static_cast<const uint16_t*>(b);
  float wideA[kBlock];
  float wideB[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    Format::widen(inA + start, wideA, n);
    Format::widen(inB + start, wideB, n);
    forEachIndex(n, [&](size_t i) { wideA[i] = Op::apply(wideA[i], wideB[i]); });
    Format::narrow(wideA, out + start, n);
  }
}

// Operands and results that are either 16-bit elements or fp32 partials (the *Wide flags): a block of each
// operand is read as fp32 before the same block of dst is written, so dst may be exactly a or b.
template <typename Format>
[[gnu::always_inline]] inline const float* widenBlock(const void* src, bool wide, size_t start, size_t n,
                                                      float* block) {
  if (wide) return static_cast<const float*>(src) + start;
  Format::widen(static_cast<const uint16_t*>(src) + start, block, n);
  return block;
}

template <typename Format>
[[gnu::always_inline]] inline void storeBlock(const float* block, void* dst, bool wide, size_t start, size_t n) {
  if (wide) {
    std::memmove(static_cast<float*>(dst) + start, block, n * sizeof(float));
  } else {
    Format::narrow(block, static_cast<uint16_t*>(dst) + start, n);
  }
}

template <typename Format, typename Op>
void reduceWide(void* dst, bool dstWide, const void* a, bool aWide, const void* b, bool bWide, size_t count) {
  float blockA[kBlock];
  float blockB[kBlock];
  float result[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    const float* x = widenBlock<Format>(a, aWide, start, n, blockA);
    const float* y = widenBlock<Format>(b, bWide, start, n, blockB);
    forEachIndex(n, [&](size_t i) { result[i] = Op::apply(x[i], y[i]); });
    storeBlock<Format>(result, dst, dstWide, start, n);
  }
}

template <typename Format>
void convertWide(void* dst, bool dstWide, const void* src, bool srcWide, size_t count) {
  float block[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    storeBlock<Format>(widenBlock<Format>(src, srcWide, start, n, block), dst, dstWide, start, n);
  }
}

template <typename Op>
constexpr std::array<WideReduceFn, 2> wideKernelsFor() {
  return {reduceWide<HalfFormat, Op>, reduceWide<Bf16Format, Op>};
}
constexpr std::array<WideReduceFn, 2> kWideKernels[] = {
    wideKernelsFor<Sum>(), wideKernelsFor<Prod>(), wideKernelsFor<Max>(), wideKernelsFor<Min>(), wideKernelsFor<Sum>(),
};
static_assert(sizeof(kWideKernels) / sizeof(kWideKernels[0]) == loomNumOps, "kWideKernels: one row per loomRedOp_t");

template <typename Op>
constexpr std::array<ReduceFn, loomNumTypes> kernelsFor() {
  return {
      reduceNative<int8_t, Op>,         reduceNative<uint8_t, Op>, reduceNative<int32_t, Op>,
      reduceNative<uint32_t, Op>,       reduceNative<int64_t, Op>, reduceNative<uint64_t, Op>,
      reduceSixteenBit<HalfFormat, Op>, reduceNative<float, Op>,   reduceNative<double, Op>,
      reduceSixteenBit<Bf16Format, Op>,
  };
}

// Indexed [loomRedOp_t][loomDataType_t]; avg reuses the sum kernels.
constexpr std::array<ReduceFn, loomNumTypes> kKernels[] = {
    kernelsFor<Sum>(), kernelsFor<Prod>(), kernelsFor<Max>(), kernelsFor<Min>(), kernelsFor<Sum>(),
};
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == loomNumOps, "kKernels needs one row per loomRedOp_t");
static_assert(loomInt8 == 0 && loomUint8 == 1 && loomInt32 == 2 && loomUint32 == 3 && loomInt64 == 4 &&
                  loomUint64 == 5 && loomFloat16 == 6 && loomFloat32 == 7 && loomFloat64 == 8 && loomBfloat16 == 9,
              "kernelsFor lists the types in enum order");

// Division happens in T promoted with int, so int8 / uint8 divide as int (a divisor above 127 is then
// representable) and the quotient, never larger in magnitude than the dividend, converts back exactly.
template <typename T>
void divideNative(T* __restrict__ data, size_t count, int divisor) {
  using Wide = std::common_type_t<T, int>;
  const Wide wideDivisor = static_cast<Wide>(divisor);
  forEachIndex(count, [=](size_t i) { data[i] = static_cast<T>(static_cast<Wide>(data[i]) / wideDivisor); });
}

template <typename Format>
void divideSixteenBit(uint16_t* data, size_t count, int divisor) {
  const float floatDivisor = static_cast<float>(divisor);
  float wide[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    Format::widen(data + start, wide, n);
    forEachIndex(n, [&](size_t i) { wide[i] /= floatDivisor; });
    Format::narrow(wide, data + start, n);
  }
}

template <typename Format>
void accumulateSixteenBit(const uint16_t* src, size_t count, float weight, float* __restrict__ acc) {
  float wide[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t n = std::min(kBlock, count - start);
    Format::widen(src + start, wide, n);
    float* out = acc + start;
    forEachIndex(n, [&](size_t i) { out[i] += weight * wide[i]; });
  }
}

}  // namespace

void accumulateWeighted(loomDataType_t type, const void* src, size_t count, float weight, float* acc) {
  switch (type) {
    case loomFloat32: {
      const float* __restrict__ in = static_cast<const float*>(src);
      forEachIndex(count, [=](size_t i) { acc[i] += weight * in[i]; });
      return;
    }
    case loomFloat16:
      return accumulateSixteenBit<HalfFormat>(static_cast<const uint16_t*>(src), count, weight, acc);
    case loomBfloat16:
      return accumulateSixteenBit<Bf16Format>(static_cast<const uint16_t*>(src), count, weight, acc);
    default:
      return;
  }
}

void storeFromFloat(loomDataType_t type, const float* src, size_t count, void* dst) {
  switch (type) {
    case loomFloat32:
      std::copy(src, src + count, static_cast<float*>(dst));
      return;
    case loomFloat16:
      return HalfFormat::narrow(src, static_cast<uint16_t*>(dst), count);
    case loomBfloat16:
      return Bf16Format::narrow(src, static_cast<uint16_t*>(dst), count);
    default:
      return;
  }
}

ReduceFn reduceFunction(loomDataType_t type, loomRedOp_t op) {
  if (!dtypeValid(type) || !opValid(op)) return nullptr;
  return kKernels[op][type];
}

WideReduceFn wideReduceFunction(loomDataType_t type, loomRedOp_t op) {
  if (!opValid(op) || !dtypeHasWiderPartials(type)) return nullptr;
  return kWideKernels[op][type == loomFloat16 ? 0 : 1];
}

void convertPartials(loomDataType_t type, void* dst, bool dstWide, const void* src, bool srcWide, size_t count) {
  if (dstWide == srcWide) {
    const size_t bytes = count * (dstWide ? dtypePartialSize(type) : dtypeSize(type));
    if (dst != src) std::memmove(dst, src, bytes);
    return;
  }
  if (type == loomFloat16) return convertWide<HalfFormat>(dst, dstWide, src, srcWide, count);
  if (type == loomBfloat16) return convertWide<Bf16Format>(dst, dstWide, src, srcWide, count);
}

void divideInPlace(void* data, size_t count, loomDataType_t type, int divisor) {
  // Below 2 the divide is the identity, and skipping it keeps a bad divisor (0, or -1 on INT_MIN) from trapping.
  if (divisor < 2) return;
  switch (type) {
    case loomInt8:
      return divideNative(static_cast<int8_t*>(data), count, divisor);
    case loomUint8:
      return divideNative(static_cast<uint8_t*>(data), count, divisor);
    case loomInt32:
      return divideNative(static_cast<int32_t*>(data), count, divisor);
    case loomUint32:
      return divideNative(static_cast<uint32_t*>(data), count, divisor);
    case loomInt64:
      return divideNative(static_cast<int64_t*>(data), count, divisor);
    case loomUint64:
      return divideNative(static_cast<uint64_t*>(data), count, divisor);
    case loomFloat16:
      return divideSixteenBit<HalfFormat>(static_cast<uint16_t*>(data), count, divisor);
    case loomFloat32:
      return divideNative(static_cast<float*>(data), count, divisor);
    case loomFloat64:
      return divideNative(static_cast<double*>(data), count, divisor);
    case loomBfloat16:
      return divideSixteenBit<Bf16Format>(static_cast<uint16_t*>(data), count, divisor);
    case loomNumTypes:
      return;
  }
}

}  // namespace loom
