// The EP dispatch/combine check (loom_ep.h), run by one rank: seeded inputs that every rank can regenerate for
// every other, so each rank computes exactly what it must receive (recvX, counts, drops) and, with identity
// experts, what the combine must return (x * the sum of the weights of its rows that were not dropped). Used by
// the mt suite (ranks as threads) and by mp_ep_check (ranks as processes, under loomrun).
#pragma once

#include <cstdint>
#include <string>

#include "loom/loom.h"
#include "loom/loom_ep.h"

namespace loomtest {

enum class EpRouting {
  kUniform,  // top-k distinct experts drawn uniformly
  kSkewed,   // most choices fall on a few hot experts (rank 0's), the rest uniform
  kSelf,     // every token chooses experts of its own rank where it can
};

struct EpCase {
  loomEpMode_t mode = loomEpNormal;
  loomDataType_t datatype = loomFloat32;
  EpRouting routing = EpRouting::kUniform;
  int expertsPerRank = 2;
  int topk = 2;
  int hidden = 33;
  int maxTokens = 24;
  int expertCapacity = 0;  // 0: the full capacity; < 0: the largest load any expert gets, plus this + 1 (-1
                           // fits it exactly, -2 is one row short)
  int dropOverflow = 0;
  int iterations = 3;  // dispatch/combine pairs, back to back, each with new inputs
  uint32_t seed = 1;
};

// Runs `c` on this rank of `comm`; "" when every result was exact (rows and counts bitwise, combine within the
// datatype's rounding), else what differed first.
std::string runEpCase(loomComm_t comm, const EpCase& c);

const char* epRoutingName(EpRouting routing);

}  // namespace loomtest
