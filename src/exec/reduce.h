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

// The last step of avg: data[i] = data[i] / divisor. Integers divide as C does (truncating toward zero, as NCCL
// does for integer avg); float and double divide; half and bfloat16 divide in fp32 and round to nearest even.
// divisor is the rank count; a divisor below 2 leaves data unchanged.
void divideInPlace(void* data, size_t count, loomDataType_t type, int divisor);

// A weighted sum in fp32 of rows of float, half or bfloat16 (the expert combine, src/ep): acc[i] += weight * src[i]
// (each element widened exactly), and the sum stored as the type, rounded to nearest even. Other types: nothing.
void accumulateWeighted(loomDataType_t type, const void* src, size_t count, float weight, float* acc);
void storeFromFloat(loomDataType_t type, const float* src, size_t count, void* dst);

}  // namespace loom
