// Element types: sizes and names of loomDataType_t and loomRedOp_t, and fp16 / bf16 as 16-bit patterns with
// their fp32 conversions. The conversions are inline because the reduction kernels call them per element and
// need them branch-free to vectorise. Arithmetic on Half / Bfloat16 is deliberately absent: loom computes in
// fp32 and rounds once (exec/reduce.cc). Every conversion assumes the default FP environment (round to nearest
// even, no flush-to-zero); loom never changes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "loom/loom.h"

namespace loom {

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits.
struct Half {
  uint16_t bits;
};
// The top half of an IEEE 754 binary32: 1 sign, 8 exponent, 7 mantissa bits.
struct Bfloat16 {
  uint16_t bits;
};

// Bytes per element; 0 for a value outside the enum.
size_t dtypeSize(loomDataType_t type);
// Whether partial results of `type` are kept wider than it (fp16 and bf16: in fp32), and the bytes of one such
// partial: the element's own size for every other type.
inline bool dtypeHasWiderPartials(loomDataType_t type) { return type == loomFloat16 || type == loomBfloat16; }
inline size_t dtypePartialSize(loomDataType_t type) { return dtypeHasWiderPartials(type) ? 4 : dtypeSize(type); }
// The nccl-tests name ("int8" ... "half", "float", "double", "bfloat16"); "unknown" outside the enum.
const char* dtypeName(loomDataType_t type);
// "sum", "prod", "max", "min", "avg"; "unknown" outside the enum.
const char* opName(loomRedOp_t op);
// Whether an int taken from a caller names a data type / reduction operator.
bool dtypeValid(int type);
bool opValid(int op);

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float floatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// `condition ? ifTrue : ifFalse` computed with masks. A plain ?: lets GCC move the arm's fp32 arithmetic under
// a branch, and it will not speculate fp arithmetic back out (-ftrapping-math), so the loop stops vectorising.
inline uint32_t selectBits(bool condition, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

// Exact. NaN keeps its sign and payload (F16C quiets a signalling NaN; the portable path leaves it as is).
inline float halfToFloat(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  // Moving exponent and mantissa to their fp32 places and rebiasing the exponent (127 - 15) is exact for
  // normal numbers. Inf/NaN need the exponent pushed on to 255. A subnormal m * 2^-24 is built as the normal
  // 2^-14 * (1 + m * 2^-10) and 2^-14 subtracted, which is exact and avoids fp32 denormal arithmetic.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t rebiased = shifted + ((127u - 15u) << 23);
  const uint32_t infOrNan = rebiased + ((128u - 16u) << 23);
  const float subnormal = floatFromBits(rebiased + (1u << 23)) - floatFromBits(113u << 23);
  const uint32_t normal = exponent == 0x0f800000u ? infOrNan : rebiased;
  const uint32_t magnitude = selectBits(exponent == 0, floatBits(subnormal), normal);
  return floatFromBits(sign | magnitude);
#endif
}

// Round to nearest, ties to even; values at or beyond 65520 become inf; subnormal results are rounded
// correctly. NaN stays NaN: made quiet, with its sign and the top 10 bits of its payload.
inline uint16_t floatToHalf(float f) {
#ifdef __F16C__
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  // The fp32 adder does the rounding. For |f| in [2^e, 2^(e+1)), half keeps multiples of 2^(e-10); adding
  // 2^(e+13) leaves fp32 exactly that resolution, so the sum is |f| rounded to half precision with ties to
  // even. The exponent is clamped at e = -14, which gives the fixed 2^-24 step of half subnormals. |f| is
  // scaled by 4 (and the magic number to 2^(e+15)) after a detour through 2^112, which turns anything
  // >= 2^16 into inf without a branch; 2^(e+15) is then an fp32 whose exponent field already carries the
  // half bias. Its low 12 bits hold the rounded 11-bit significand with its leading one; adding that to the
  // exponent field moves the exponent up by one, cancelling the leading one's extra 2^(e+15) (mod 32), and
  // lets a significand that rounded up to 2^11 carry into the exponent, up to inf.
  const uint32_t bits = floatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t absBits = bits & 0x7fffffffu;
  const float scaled = (floatFromBits(absBits) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t exponent = absBits & 0x7f800000u;
  exponent = exponent < (113u << 23) ? (113u << 23) : exponent;
  const float rounded = floatFromBits(exponent + (15u << 23)) + scaled;
  const uint32_t roundedBits = floatBits(rounded);
  const uint32_t finite = ((roundedBits >> 13) & 0x7c00u) + (roundedBits & 0x0fffu);
  const uint32_t nan = 0x7e00u | ((absBits >> 13) & 0x03ffu);
  return static_cast<uint16_t>(sign | selectBits(absBits > 0x7f800000u, nan, finite));
#endif
}

// Exact: bf16 is the top half of an fp32.
inline float bf16ToFloat(uint16_t b) { return floatFromBits(static_cast<uint32_t>(b) << 16); }

// Round to nearest, ties to even; overflow rounds to inf. NaN stays NaN: made quiet, with its sign and the top
// 7 bits of its payload (rounding or truncating a NaN whose payload is all in the low bits would give inf).
inline uint16_t floatToBf16(float f) {
  const uint32_t bits = floatBits(f);
  // Adding 0x7fff rounds up above the halfway point; the extra 1 when the kept lsb is odd makes a tie round
  // up to even. The carry propagates into the exponent, so the largest floats round to inf.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace loom
