// perf/check_data.h — the data the perf harness checks collectives with: inputs and expected outputs that are
// exact in every loom type (half and bfloat16 included, converted here on the host), and the comparison that
// counts wrong elements. Values are chosen so that no partial result of any order overflows or rounds; the one
// tolerance is for avg of floating types. Host buffers only; uses only the public API <loom/loom.h>.
#ifndef LOOM_PERF_CHECK_DATA_H_
#define LOOM_PERF_CHECK_DATA_H_

#include <loom/loom.h>

#include <cstddef>
#include <cstdint>

namespace perf {

size_t typeSize(loomDataType_t type);

// Check data, exact in every type. `offset` is the index of buf[0] in the logical array, so that a part of an
// array (a rank's block) can be written on its own. fillData: values for collectives that only move data,
// different for every (rank, index). fillReduceInput / fillReduceResult: the input of `rank` and the result of
// `op` over all `nranks` inputs, chosen so that no partial result of any order overflows or rounds.
void fillData(void* buf, size_t count, loomDataType_t type, int rank, size_t offset);
void fillReduceInput(void* buf, size_t count, loomDataType_t type, loomRedOp_t op, int rank, int nranks, size_t offset);
void fillReduceResult(void* buf, size_t count, loomDataType_t type, loomRedOp_t op, int nranks, size_t offset);

// The gathered data of all ranks: block r (of `block` elements) is what fillData gives rank r at offset r*block.
void fillGathered(void* buf, size_t block, loomDataType_t type, int nranks);
// Writes `count` elements of `type` at `buf` with a value that no check input or result takes, so that an
// element the collective leaves unwritten counts as wrong.
void fillPoison(void* buf, size_t count, loomDataType_t type);

// The relative tolerance for the result of `op` over `nranks` ranks: 0 (exact) except for avg of floating
// types, where a library may divide before summing (as NCCL does), a few roundings away.
double reduceTolerance(loomDataType_t type, loomRedOp_t op, int nranks);

// Elements of `got` that differ from `expected` by more than tolerance * max(1, |expected|); NaN is wrong.
int64_t countWrong(const void* got, const void* expected, size_t count, loomDataType_t type, double tolerance);

}  // namespace perf

#endif  // LOOM_PERF_CHECK_DATA_H_
