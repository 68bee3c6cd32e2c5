// Host reduction kernels: the element-wise `dst = a op b` that the host executor applies to received data, and
// the final divide of avg. One call reduces one contiguous range on the calling thread; splitting large buffers
// across threads, and device (CUDA) reductions, are the executor's business.
#pragma once

#include <cstddef>

#include "loom/loom.h"

namespace loom {

// dst[i] = a[i] op b[i] for i < count. dst may be exactly a or b (in place), or both; it must not partially
// overlap either. Integer sum and prod wrap around. half and bfloat16 are computed in fp32 and rounded to
// nearest even, which gives the correctly rounded half / bf16 result. Float max and min follow fmax / fmin,
// as NCCL does: a NaN operand loses to a number, and the result is NaN only when both operands are.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// The kernel for `type` and `op`; look it up once per call, not per element. loomAvg gets the sum kernel:
// avg is a sum followed by divideInPlace. nullptr when type or op is outside its enum.
ReduceFn reduceFunction(loomDataType_t type, loomRedOp_t op);

// The same combination where any of dst, a and b may hold wider partials of the type (its *Wide flag: fp32 for
// fp16 and bf16, RankPlan::wideScratch): the operands are widened exactly, combined in fp32, and rounded to the
// type only where dst is not wide. Aliasing as for ReduceFn. nullptr for a type without wider partials
// (dtypeHasWiderPartials) or a value outside the enums.
using WideReduceFn = void (*)(void* dst, bool dstWide, const void* a, bool aWide, const void* b, bool bWide,
                              size_t count);
WideReduceFn wideReduceFunction(loomDataType_t type, loomRedOp_t op);
// dst[i] = src[i] between the type and its wider partials: widened exactly, or rounded to nearest even. Both
// narrow or both wide: a copy. dst must not partially overlap src.
void convertPartials(loomDataType_t type, void* dst, bool dstWide, const void* src, bool srcWide, size_t count);

// The last step of avg: data[i] = data[i] / divisor. Integers divide as C does (truncating toward zero, as NCCL
// does for integer avg); float and double divide; half and bfloat16 divide in fp32 and round to nearest even.
// divisor is the rank count; a divisor below 2 leaves data unchanged.
void divideInPlace(void* data, size_t count, loomDataType_t type, int divisor);

// A weighted sum in fp32 of rows of float, half or bfloat16 (the expert combine, src/ep): acc[i] += weight * src[i]
// (each element widened exactly), and the sum stored as the type, rounded to nearest even. Other types: nothing.
void accumulateWeighted(loomDataType_t type, const void* src, size_t count, float weight, float* acc);
void storeFromFloat(loomDataType_t type, const float* src, size_t count, void* dst);

}  // namespace loom
