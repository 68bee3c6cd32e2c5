// The collective test matrix shared by the mt suite (ranks as threads) and the mp suite (ranks as processes
// under loomrun): every collective x datatype x op x layout x count, each checked exactly against a naive
// reference. Inputs are small integers, exactly representable in every type (int8 and fp16 included), chosen
// so that sums, products, maxima and averages are exact whatever the order of reduction. Uses only loom.h.
#pragma once

#include <string>
#include <vector>

#include "loom/loom.h"

namespace loomtest {

enum class Coll {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllToAllv,
  Gather,
  Scatter,
  SendRecv
};

struct Case {
  Coll coll;
  loomDataType_t type;
  loomRedOp_t op;  // loomSum for collectives without reduction
  size_t count;
  int nranks;
  int root;
  bool inPlace;
};

const char* collName(Coll coll);
bool reduces(Coll coll);
bool hasInPlace(Coll coll);
std::string describe(const Case& c);

// Every case for `nranks` ranks and the given counts: all collectives, all types, all ops where the collective
// reduces, in place and out of place where the collective has an in-place form. Roots rotate with the count.
std::vector<Case> matrix(int nranks, const std::vector<size_t>& counts);

// Where a case's buffers live: ordinary memory, loomMemAlloc, ordinary memory registered with loomCommRegister
// (these two let peers read the buffers in place), or device memory of a CUDA communicator, through `Device`.
enum class Memory { kPlain, kLoomAlloc, kRegistered, kDevice };

// How a case reaches device memory (Memory::kDevice): a program built with CUDA fills this in, so the matrix
// itself needs only loom.h. Each function returns false on failure.
struct Device {
  void* (*allocate)(size_t bytes);
  void (*release)(void* pointer);
  bool (*copy)(void* dst, const void* src, size_t bytes);  // either direction; returns when done
  bool (*synchronize)(loomStream_t stream);
  loomStream_t stream;  // the calls' stream
};

// Runs one case as `rank` on `comm` (every rank must run the same case) and checks the result. Returns "" on
// success, else what went wrong, naming the case, the rank and the first wrong element. `device` is needed with
// Memory::kDevice only.
std::string runCase(const Case& c, loomComm_t comm, int rank, Memory memory = Memory::kPlain,
                    const Device* device = nullptr);

}  // namespace loomtest
