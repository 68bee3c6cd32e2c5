#include "tests/common/ep_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

namespace loomtest {
namespace {

struct RankInputs {
  int numTokens = 0;
  std::vector<float> x;  // [numTokens, hidden], multiples of 1/8 in [-4, 4]: exact in every datatype
  std::vector<int32_t> idx;
  std::vector<float> w;  // multiples of 1/16 in (0, 1]
};

RankInputs inputsOf(const EpCase& c, int nranks, int rank, int iteration) {
  std::mt19937 g(c.seed * 7919u + static_cast<uint32_t>(iteration) * 104729u + static_cast<uint32_t>(rank) * 31u + 1);
  const int experts = c.expertsPerRank * nranks;
  RankInputs in;
  // Uneven: between half and all of maxTokens; the first iteration full, the last rank empty in the second.
  in.numTokens = c.maxTokens / 2 + static_cast<int>(g() % static_cast<uint32_t>(c.maxTokens - c.maxTokens / 2 + 1));
  if (iteration == 0) in.numTokens = c.maxTokens;
  if (iteration == 1 && rank == nranks - 1 && nranks > 1) in.numTokens = 0;
  in.x.resize(static_cast<size_t>(in.numTokens) * c.hidden);
  for (float& v : in.x) v = static_cast<float>(static_cast<int>(g() % 65) - 32) / 8.0f;
  in.idx.assign(static_cast<size_t>(in.numTokens) * c.topk, -1);
  in.w.assign(in.idx.size(), 0.0f);
  const int hot = std::min(experts, c.topk + 1);
  for (int t = 0; t < in.numTokens; ++t) {
    int32_t* idx = in.idx.data() + static_cast<size_t>(t) * c.topk;
    auto taken = [&](int e, int upTo) { return std::find(idx, idx + upTo, e) != idx + upTo; };
    for (int j = 0; j < c.topk; ++j) {
      int e = -1;
      if (c.routing == EpRouting::kSelf) {
        e = j < c.expertsPerRank ? rank * c.expertsPerRank + j : -1;
      } else {
        for (int attempt = 0; attempt < 64 && (e < 0 || taken(e, j)); ++attempt)
          e = c.routing == EpRouting::kSkewed && g() % 4 != 0 ? static_cast<int>(g() % hot)
                                                              : static_cast<int>(g() % experts);
        for (int f = 0; taken(e, j); ++f) e = f;  // rare: the first expert not yet taken
        if (g() % 8 == 0) e = -1;                 // a masked choice
      }
      idx[j] = e;
      in.w[static_cast<size_t>(t) * c.topk + j] = static_cast<float>(1 + g() % 16) / 16.0f;
    }
  }
  return in;
}

// A row of the datatype, from values exact in it.
uint16_t toHalf(float f) {
  if (f == 0.0f) return std::signbit(f) ? 0x8000 : 0;
  int exponent;
  float mantissa = std::frexp(std::fabs(f), &exponent);  // f = mantissa * 2^exponent, mantissa in [0.5, 1)
  uint16_t sign = f < 0 ? 0x8000 : 0;
  int biased = exponent - 1 + 15;
  uint16_t fraction = static_cast<uint16_t>(std::lround((mantissa * 2.0f - 1.0f) * 1024.0f));
  return static_cast<uint16_t>(sign | (biased << 10) | fraction);
}
float fromHalf(uint16_t h) {
  int exponent = (h >> 10) & 0x1f, fraction = h & 0x3ff;
  float value = exponent == 0 ? std::ldexp(static_cast<float>(fraction), -24)
                              : std::ldexp(1.0f + static_cast<float>(fraction) / 1024.0f, exponent - 15);
  return (h & 0x8000) ? -value : value;
}

size_t sizeOf(loomDataType_t type) { return type == loomFloat32 ? 4 : 2; }

std::vector<unsigned char> encode(loomDataType_t type, const std::vector<float>& values) {
  std::vector<unsigned char> bytes(values.size() * sizeOf(type));
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == loomFloat32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &values[i], 4);
      uint16_t h = type == loomBfloat16 ? static_cast<uint16_t>(bits >> 16) : toHalf(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

float decode(loomDataType_t type, const unsigned char* at) {
  if (type == loomFloat32) {
    float f;
    std::memcpy(&f, at, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, at, 2);
  if (type == loomFloat16) return fromHalf(h);
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One row a local expert receives: its token and weight.
struct Arrival {
  int source, token;
  float weight;
};

// Every expert's arrivals, in the order loom_ep.h promises (source rank, then token).
std::vector<std::vector<Arrival>> arrivalsOf(const EpCase& c, const std::vector<RankInputs>& all) {
  const int nranks = static_cast<int>(all.size());
  std::vector<std::vector<Arrival>> lists(static_cast<size_t>(c.expertsPerRank) * nranks);
  for (int s = 0; s < nranks; ++s)
    for (int t = 0; t < all[s].numTokens; ++t)
      for (int j = 0; j < c.topk; ++j) {
        int e = all[s].idx[static_cast<size_t>(t) * c.topk + j];
        if (e >= 0) lists[e].push_back({s, t, all[s].w[static_cast<size_t>(t) * c.topk + j]});
      }
  return lists;
}

}  // namespace

const char* epRoutingName(EpRouting routing) {
  return routing == EpRouting::kUniform ? "uniform" : routing == EpRouting::kSkewed ? "skewed" : "self";
}

std::string runEpCase(loomComm_t comm, const EpCase& c) {
  int nranks = 0, rank = 0;
  loomCommCount(comm, &nranks);
  loomCommUserRank(comm, &rank);
  std::ostringstream fail;
  fail << "rank " << rank << " of " << nranks << " (" << (c.mode == loomEpLowLatency ? "low-latency" : "normal")
       << ", datatype " << c.datatype << ", " << epRoutingName(c.routing) << "): ";
  const int L = c.expertsPerRank;
  // Every rank's inputs of every iteration, and the largest load any expert sees (for expertCapacity < 0).
  std::vector<std::vector<RankInputs>> inputs(c.iterations);
  size_t maxLoad = 0;
  for (int i = 0; i < c.iterations; ++i) {
    for (int r = 0; r < nranks; ++r) inputs[i].push_back(inputsOf(c, nranks, r, i));
    for (const auto& list : arrivalsOf(c, inputs[i])) maxLoad = std::max(maxLoad, list.size());
  }
  int capacity = c.expertCapacity > 0    ? c.expertCapacity
                 : c.expertCapacity == 0 ? nranks * c.maxTokens
                                         : std::max(1, static_cast<int>(maxLoad) + c.expertCapacity + 1);
  loomEpConfig_t config = LOOM_EP_CONFIG_INITIALIZER;
  config.maxTokensPerRank = c.maxTokens;
  config.hidden = c.hidden;
  config.numExperts = L * nranks;
  config.topk = c.topk;
  config.datatype = c.datatype;
  config.mode = c.mode;
  config.expertCapacity = c.expertCapacity == 0 ? 0 : capacity;
  config.dropOverflow = c.dropOverflow;
  loomEp_t ep = nullptr;
  if (loomEpCreate(comm, &config, &ep) != loomSuccess) return fail.str() + "create: " + loomGetLastError(comm);
  const size_t rowBytes = static_cast<size_t>(c.hidden) * sizeOf(c.datatype);
  const double tolerance = c.datatype == loomFloat32 ? 0.0 : c.datatype == loomBfloat16 ? 1.0 / 64 : 1.0 / 512;
  std::vector<unsigned char> recvX(static_cast<size_t>(L) * capacity * rowBytes);
  std::vector<int> counts(L);
  std::string error;
  for (int i = 0; i < c.iterations && error.empty(); ++i) {
    const RankInputs& mine = inputs[i][rank];
    std::vector<std::vector<Arrival>> lists = arrivalsOf(c, inputs[i]);
    bool overflowAnywhere = false, overflowHere = false;
    uint64_t droppedHere = 0;
    for (size_t e = 0; e < lists.size(); ++e)
      if (lists[e].size() > static_cast<size_t>(capacity)) {
        overflowAnywhere = true;
        if (static_cast<int>(e) / L == rank) {
          overflowHere = true;
          droppedHere += lists[e].size() - capacity;
        }
      }
    std::vector<unsigned char> x = encode(c.datatype, mine.x);
    std::fill(recvX.begin(), recvX.end(), 0xee);
    loomEpHandle_t handle = nullptr;
    loomResult_t result = loomEpDispatch(ep, x.data(), mine.numTokens, mine.idx.data(), mine.w.data(), recvX.data(),
                                         counts.data(), &handle, nullptr);
    std::ostringstream at;
    at << "iteration " << i << ": ";
    if (overflowAnywhere && !c.dropOverflow) {
      loomResult_t expected = overflowHere ? loomInvalidArgument : loomSuccess;
      if (result != expected)
        error = at.str() + "dispatch returned " + std::to_string(result) + " (" + loomGetLastError(comm) +
                "), expected " + std::to_string(expected);
      else if (overflowHere && std::string(loomGetLastError(comm)).find("capacity") == std::string::npos)
        error = at.str() + "the overflow's message does not name the capacity: " + loomGetLastError(comm);
      loomEpHandleFree(handle);
      continue;  // no rank combines after an overflow
    }
    if (result != loomSuccess) {
      error = at.str() + "dispatch: " + loomGetLastError(comm);
      break;
    }
    loomEpStats_t stats;
    loomEpGetStats(ep, &stats);
    if (stats.lastDroppedRows != droppedHere)
      error = at.str() + "dropped " + std::to_string(stats.lastDroppedRows) + " rows, expected " +
              std::to_string(droppedHere);
    for (int e = 0; e < L && error.empty(); ++e) {
      const std::vector<Arrival>& list = lists[static_cast<size_t>(rank) * L + e];
      int expected = static_cast<int>(std::min(list.size(), static_cast<size_t>(capacity)));
      if (counts[e] != expected) {
        error = at.str() + "local expert " + std::to_string(e) + " counted " + std::to_string(counts[e]) +
                " rows, expected " + std::to_string(expected);
        break;
      }
      for (int row = 0; row < expected; ++row) {
        const Arrival& a = list[row];
        std::vector<unsigned char> want =
            encode(c.datatype,
                   std::vector<float>(inputs[i][a.source].x.begin() + static_cast<size_t>(a.token) * c.hidden,
                                      inputs[i][a.source].x.begin() + static_cast<size_t>(a.token + 1) * c.hidden));
        if (std::memcmp(want.data(), recvX.data() + (static_cast<size_t>(e) * capacity + row) * rowBytes, rowBytes)) {
          error = at.str() + "local expert " + std::to_string(e) + " row " + std::to_string(row) + " is not token " +
                  std::to_string(a.token) + " of rank " + std::to_string(a.source);
          break;
        }
      }
    }
    // Identity experts: the combine must give x * (sum of the weights of the rows that were kept).
    std::vector<unsigned char> out(static_cast<size_t>(mine.numTokens) * rowBytes + 1, 0xcc);
    if (error.empty() && loomEpCombine(ep, recvX.data(), handle, out.data(), nullptr) != loomSuccess)
      error = at.str() + "combine: " + loomGetLastError(comm);
    std::vector<float> weightSum(mine.numTokens, 0.0f);
    for (size_t e = 0; e < lists.size(); ++e)
      for (size_t row = 0; row < lists[e].size() && row < static_cast<size_t>(capacity); ++row)
        if (lists[e][row].source == rank) weightSum[lists[e][row].token] += lists[e][row].weight;
    for (int t = 0; t < mine.numTokens && error.empty(); ++t)
      for (int h = 0; h < c.hidden; ++h) {
        double want = static_cast<double>(mine.x[static_cast<size_t>(t) * c.hidden + h]) * weightSum[t];
        double got = decode(c.datatype, out.data() + (static_cast<size_t>(t) * c.hidden + h) * sizeOf(c.datatype));
        if (std::fabs(got - want) > tolerance * (std::fabs(want) + 0.125)) {
          std::ostringstream o;
          o << at.str() << "out[" << t << "][" << h << "] = " << got << ", expected " << want;
          error = o.str();
          break;
        }
      }
    loomEpHandleFree(handle);
  }
  loomEpDestroy(ep);
  return error.empty() ? "" : fail.str() + error;
}

}  // namespace loomtest
