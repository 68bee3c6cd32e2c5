// The element-wise arithmetic of the CUDA kernels, written once for the host and the device: `dst = a op b` per
// element type and operator, with the host reduction kernels' semantics (exec/reduce.h). Integer sum and prod
// wrap; half and bfloat16 are widened to fp32, combined there and rounded once to nearest even; float max and min
// follow fmax / fmin (a NaN loses to a number). Compiled by nvcc for the kernels (kernels.cu) and by the host
// compiler for the unit test that holds it to the host kernels, so the arithmetic is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "loom/loom.h"
#include "src/base/dtype.h"  // the host's 16-bit conversions, for the host side of every function here

#include "src/base/host_device.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace loom::device {

// Storage and compute types of one element type: T as stored, Compute as combined, and the conversions.
template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  LOOM_HOST_DEVICE static Compute load(Storage value) { return value; }
  LOOM_HOST_DEVICE static Storage store(Compute value) { return value; }
};

struct HalfBits {
  using Storage = uint16_t;
  using Compute = float;
  LOOM_HOST_DEVICE static float load(uint16_t bits) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(bits));
#else
    return halfToFloat(bits);
#endif
  }
  LOOM_HOST_DEVICE static uint16_t store(float value) {
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(value));
#else
    return floatToHalf(value);
#endif
  }
};

struct Bf16Bits {
  using Storage = uint16_t;
  using Compute = float;
  LOOM_HOST_DEVICE static float load(uint16_t bits) {
#ifdef __CUDA_ARCH__
    return __bfloat162float(__ushort_as_bfloat16(bits));
#else
    return bf16ToFloat(bits);
#endif
  }
  LOOM_HOST_DEVICE static uint16_t store(float value) {
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
#else
    return floatToBf16(value);
#endif
  }
};

// The format of each loomDataType_t.
template <loomDataType_t kType>
struct FormatOf;
template <>
struct FormatOf<loomInt8> : Native<int8_t> {};
template <>
struct FormatOf<loomUint8> : Native<uint8_t> {};
template <>
struct FormatOf<loomInt32> : Native<int32_t> {};
template <>
struct FormatOf<loomUint32> : Native<uint32_t> {};
template <>
struct FormatOf<loomInt64> : Native<int64_t> {};
template <>
struct FormatOf<loomUint64> : Native<uint64_t> {};
template <>
struct FormatOf<loomFloat16> : HalfBits {};
template <>
struct FormatOf<loomFloat32> : Native<float> {};
template <>
struct FormatOf<loomFloat64> : Native<double> {};
template <>
struct FormatOf<loomBfloat16> : Bf16Bits {};

// Integer arithmetic in the unsigned type of the same width, where overflow wraps.
template <typename T>
struct Unsigned {
  using Type = T;
};
template <>
struct Unsigned<int8_t> {
  using Type = uint8_t;
};
template <>
struct Unsigned<int32_t> {
  using Type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using Type = uint64_t;
};

struct SumOp {
  template <typename T>
  LOOM_HOST_DEVICE static T apply(T a, T b) {
    using U = typename Unsigned<T>::Type;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
};

struct ProdOp {
  template <typename T>
  LOOM_HOST_DEVICE static T apply(T a, T b) {
    using U = typename Unsigned<T>::Type;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  }
};

// As the host's: a NaN in b picks a (a number, or NaN when both are); equal operands (+0, -0) give b.
struct MaxOp {
  template <typename T>
  LOOM_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return (a > b || b != b) ? a : b;
    return a > b ? a : b;
  }
};

struct MinOp {
  template <typename T>
  LOOM_HOST_DEVICE static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return (a < b || b != b) ? a : b;
    return a < b ? a : b;
  }
};

// One element of `dst = a op b`.
template <loomDataType_t kType, typename Op>
LOOM_HOST_DEVICE typename FormatOf<kType>::Storage combine(typename FormatOf<kType>::Storage a,
                                                           typename FormatOf<kType>::Storage b) {
  using Format = FormatOf<kType>;
  return Format::store(Op::apply(Format::load(a), Format::load(b)));
}

// One element of avg's final divide: integers truncate toward zero, floats divide (16-bit ones in fp32), each
// in the common type of the element and int, as the host does.
template <loomDataType_t kType>
LOOM_HOST_DEVICE typename FormatOf<kType>::Storage divide(typename FormatOf<kType>::Storage value, int divisor) {
  using Format = FormatOf<kType>;
  using Compute = typename Format::Compute;
  using Wide = std::common_type_t<Compute, int>;
  return Format::store(static_cast<Compute>(static_cast<Wide>(Format::load(value)) / static_cast<Wide>(divisor)));
}

}  // namespace loom::device
