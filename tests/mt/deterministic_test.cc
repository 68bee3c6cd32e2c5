// LOOM_DETERMINISTIC (docs/RELIABILITY.md): AllReduce, ReduceScatter and Reduce give the bits of one order of
// reduction, ((x0 op x1) op x2) ... op x(n-1), whatever algorithm the rules leave, the channels, the protocol, the
// count of the call and in place or not. Checked bit for bit against that order computed here, on random inputs
// whose sums depend on the order (values over six decades, both signs): fp32, fp64, fp16 and bf16 (which round
// each combination, as the executor's kernels do), sum, prod and avg. The control: without the switch the ring's
// bits differ from that order on the same inputs, so the inputs can tell orders apart.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "src/base/dtype.h"
#include "src/exec/reduce.h"
#include "tests/common/test_level.h"
#include "tests/mt/thread_ranks.h"

namespace {

// Element i of rank r's input, the same for every count (so a short call's elements are a long call's prefix).
double inputValue(int rank, size_t i) {
  uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  const double mantissa = 1.0 + static_cast<double>(x % 1000003) / 1000003.0;
  const int decade = static_cast<int>((x >> 24) % 7) - 3;
  return ((x >> 40) & 1 ? -1.0 : 1.0) * mantissa * std::pow(10.0, decade);
}

size_t typeBytes(loomDataType_t type) { return type == loomFloat64 ? 8 : type == loomFloat32 ? 4 : 2; }

// `value` in `type`, rounded to nearest, at out.
void store(loomDataType_t type, double value, unsigned char* out) {
  if (type == loomFloat64) {
    std::memcpy(out, &value, 8);
  } else if (type == loomFloat32) {
    const float f = static_cast<float>(value);
    std::memcpy(out, &f, 4);
  } else {
    const uint16_t h = type == loomFloat16 ? loom::floatToHalf(static_cast<float>(value))
                                           : loom::floatToBf16(static_cast<float>(value));
    std::memcpy(out, &h, 2);
  }
}

std::vector<unsigned char> inputs(int rank, size_t count, loomDataType_t type) {
  std::vector<unsigned char> data(count * typeBytes(type));
  for (size_t i = 0; i < count; ++i) store(type, inputValue(rank, i), data.data() + i * typeBytes(type));
  return data;
}

double load(loomDataType_t type, const unsigned char* in) {
  if (type == loomFloat64) {
    double x;
    std::memcpy(&x, in, 8);
    return x;
  }
  if (type == loomFloat32) {
    float x;
    std::memcpy(&x, in, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, in, 2);
  return type == loomFloat16 ? loom::halfToFloat(h) : loom::bf16ToFloat(h);
}

// Elements [first, first + count) of the reduction in rank order, then avg's divide: each rank's operand in the
// type, combined in the type, but fp16 and bf16 in fp32 and rounded to the type once, at the end.
std::vector<unsigned char> rankOrder(int nranks, size_t first, size_t count, loomDataType_t type, loomRedOp_t op) {
  const size_t bytes = typeBytes(type);
  const bool prod = op == loomProd;
  std::vector<unsigned char> sum(count * bytes), operand(bytes);
  for (size_t i = 0; i < count; ++i) {
    store(type, inputValue(0, first + i), operand.data());
    double acc = load(type, operand.data());
    float wide = static_cast<float>(acc);  // fp32 arithmetic for fp32, fp16 and bf16
    for (int r = 1; r < nranks; ++r) {
      store(type, inputValue(r, first + i), operand.data());
      const double x = load(type, operand.data());
      acc = prod ? acc * x : acc + x;
      wide = prod ? wide * static_cast<float>(x) : wide + static_cast<float>(x);
    }
    store(type, type == loomFloat64 ? acc : wide, sum.data() + i * bytes);
  }
  if (op == loomAvg) loom::divideInPlace(sum.data(), count, type, nranks);
  return sum;
}

// "" when `got` holds `want`'s bits, else the first element that differs.
std::string compareBits(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want, size_t bytes,
                        const std::string& what) {
  for (size_t i = 0; i * bytes < want.size(); ++i) {
    if (std::memcmp(got.data() + i * bytes, want.data() + i * bytes, bytes) == 0) continue;
    uint64_t g = 0, w = 0;
    std::memcpy(&g, got.data() + i * bytes, bytes), std::memcpy(&w, want.data() + i * bytes, bytes);
    char text[160];
    snprintf(text, sizeof(text), ": element %zu is 0x%llx, rank order gives 0x%llx", i, (unsigned long long)g,
             (unsigned long long)w);
    return what + text;
  }
  return "";
}

const loomDataType_t kTypes[] = {loomFloat32, loomFloat64, loomFloat16, loomBfloat16};
const char* typeName(loomDataType_t type) {
  return type == loomFloat32 ? "fp32" : type == loomFloat64 ? "fp64" : type == loomFloat16 ? "fp16" : "bf16";
}

// What one call of each kind must give on `nranks` ranks: inputs and rank-order results, worked out once before
// the ranks start (the threads share the cores with the ranks' own work).
struct Expected {
  loomDataType_t type;
  loomRedOp_t op;
  size_t count;
  std::vector<std::vector<unsigned char>> input;  // per rank: count elements (AllReduce, Reduce)
  std::vector<std::vector<unsigned char>> whole;  // per rank: nranks * count elements (ReduceScatter)
  std::vector<unsigned char> reduced;             // AllReduce's and Reduce's result
  std::vector<unsigned char> scattered;           // ReduceScatter's, all ranks' blocks in order
};

std::vector<Expected> expectations(int nranks, const std::vector<size_t>& counts) {
  std::vector<Expected> all;
  for (loomDataType_t type : kTypes) {
    for (loomRedOp_t op : {loomSum, loomProd, loomAvg}) {
      for (size_t count : counts) {
        Expected e{type, op, count, {}, {}, rankOrder(nranks, 0, count, type, op),
                   rankOrder(nranks, 0, count * nranks, type, op)};
        for (int r = 0; r < nranks; ++r) {
          e.whole.push_back(inputs(r, count * nranks, type));
          e.input.emplace_back(e.whole.back().begin(), e.whole.back().begin() + count * typeBytes(type));
        }
        all.push_back(std::move(e));
      }
    }
  }
  return all;
}

// Every reducing collective on `comm` against rank order; returns the first mismatch ("" when none). Every rank
// runs the same calls.
std::string checkCalls(loomComm_t comm, int rank, int nranks, const std::vector<Expected>& cases) {
  for (const Expected& e : cases) {
    const size_t bytes = typeBytes(e.type), count = e.count;
    const std::string what = std::string(typeName(e.type)) + " op " + std::to_string(e.op) + " count " +
                             std::to_string(count) + " on " + std::to_string(nranks) + " ranks, rank " +
                             std::to_string(rank);
    // AllReduce, out of place and in place.
    std::vector<unsigned char> mine = e.input[rank], out(count * bytes);
    if (loomAllReduce(mine.data(), out.data(), count, e.type, e.op, comm, nullptr) != loomSuccess)
      return "AllReduce " + what + ": " + loomGetLastError(comm);
    std::string error = compareBits(out, e.reduced, bytes, "AllReduce " + what);
    if (!error.empty()) return error;
    if (loomAllReduce(mine.data(), mine.data(), count, e.type, e.op, comm, nullptr) != loomSuccess)
      return "AllReduce in place " + what + ": " + loomGetLastError(comm);
    error = compareBits(mine, e.reduced, bytes, "AllReduce in place " + what);
    if (!error.empty()) return error;
    // ReduceScatter: rank r gets elements [r * count, (r + 1) * count) of the whole.
    std::vector<unsigned char> block(count * bytes);
    if (loomReduceScatter(e.whole[rank].data(), block.data(), count, e.type, e.op, comm, nullptr) != loomSuccess)
      return "ReduceScatter " + what + ": " + loomGetLastError(comm);
    const std::vector<unsigned char> wantBlock(e.scattered.begin() + rank * count * bytes,
                                               e.scattered.begin() + (rank + 1) * count * bytes);
    error = compareBits(block, wantBlock, bytes, "ReduceScatter " + what);
    if (!error.empty()) return error;
    // Reduce to the last rank.
    std::vector<unsigned char> reduced(count * bytes);
    if (loomReduce(e.input[rank].data(), reduced.data(), count, e.type, e.op, nranks - 1, comm, nullptr) !=
        loomSuccess)
      return "Reduce " + what + ": " + loomGetLastError(comm);
    if (rank == nranks - 1) {
      error = compareBits(reduced, e.reduced, bytes, "Reduce " + what);
      if (!error.empty()) return error;
    }
  }
  return "";
}

// Runs checkCalls on a communicator of `nranks` threads made under the environment the caller set.
void expectRankOrder(int nranks, const std::vector<Expected>& cases, const std::string& setting,
                     loomConfig_t* config = nullptr) {
  loomtest::runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::string error = checkCalls(comm, rank, nranks, cases);
        if (!error.empty()) ADD_FAILURE() << setting << ": " << error;
      },
      config);
}

std::vector<int> rankCounts() {
  return loomtest::fullMatrix() ? std::vector<int>{2, 3, 4, 5, 8} : std::vector<int>{3, 8};
}

// The same bits under every algorithm the rules leave, channels, protocol, and at counts whose slicing and
// partition differ (1 element, a few LL messages, many Simple chunks).
TEST(Deterministic, RankOrderWhateverTheChoices) {
  loomtest::ScopedEnv on("LOOM_DETERMINISTIC", "1");
  for (int n : rankCounts()) {
    const std::vector<Expected> cases = expectations(n, {1, 1000, 70001});
    // The last: rules that allow the ring too, which the switch must set aside.
    for (const char* algo : {"", "allreduce:direct", "allreduce:twoshot",
                             "allreduce:ring,twoshot;reducescatter:ring,direct;reduce:ring,direct"}) {
      for (const char* channels : {"1", "4"}) {
        for (const char* proto : {"", "LL", "Simple"}) {
          loomtest::ScopedEnv a("LOOM_ALGO", algo), c("LOOM_NCHANNELS", channels), p("LOOM_PROTO", proto);
          expectRankOrder(n, cases,
                          std::string("LOOM_ALGO=") + algo + " LOOM_NCHANNELS=" + channels + " LOOM_PROTO=" + proto);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// Over the network transport too (tcp between the threads), and from the config field instead of the environment.
TEST(Deterministic, OverTcpAndFromTheConfig) {
  loomtest::ScopedEnv tcp("LOOM_TRANSPORTS", "tcp");
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.deterministic = 1;
  expectRankOrder(3, expectations(3, {1, 1000, 70001}), "tcp, config.deterministic = 1", &config);
}

// The control: without the switch the ring groups the sums otherwise, and these inputs show it.
TEST(Deterministic, WithoutTheSwitchTheRingDiffers) {
  loomtest::ScopedEnv ring("LOOM_ALGO", "allreduce:ring");
  const int n = 8;
  const size_t count = 70001;
  std::atomic<bool> differs{false};
  loomtest::runRanks(n, [&](loomComm_t comm, int rank) {
    std::vector<unsigned char> mine = inputs(rank, count, loomFloat32), out(count * 4);
    ASSERT_EQ(loomAllReduce(mine.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr), loomSuccess);
    if (rank == 0) differs = !compareBits(out, rankOrder(n, 0, count, loomFloat32, loomSum), 4, "").empty();
  });
  EXPECT_TRUE(differs) << "the ring's sums equal rank order's bit for bit: the inputs cannot tell orders apart";
}

// Bad input: a config value other than 0 or 1, and LOOM_ALGO rules that leave a reduction no rank-order algorithm,
// fail init with a message naming them.
TEST(Deterministic, BadSettingsFailInit) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.deterministic = 5;
  loomComm_t comm = nullptr;
  EXPECT_EQ(loomCommInitRankConfig(&comm, 1, id, 0, &config), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError(nullptr)).find("deterministic 5"), std::string::npos)
      << loomGetLastError(nullptr);

  // At 3 ranks (at 1 and 2 every algorithm sums in rank order, and the rules stand).
  loomtest::ScopedEnv on("LOOM_DETERMINISTIC", "1"), ring("LOOM_ALGO", "allreduce:ring");
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  std::vector<std::thread> ranks;
  std::vector<std::string> errors(3);
  std::vector<loomResult_t> results(3, loomSuccess);
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      loomComm_t mine = nullptr;
      results[r] = loomCommInitRank(&mine, 3, id, r);
      errors[r] = loomGetLastError(nullptr);
      if (results[r] == loomSuccess) loomCommDestroy(mine);
    });
  for (std::thread& rank : ranks) rank.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r], loomInvalidArgument) << "rank " << r;
    EXPECT_NE(errors[r].find("LOOM_ALGO"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("AllReduce no algorithm that reduces in rank order"), std::string::npos) << errors[r];
  }
  loomtest::runRanks(2, [](loomComm_t, int) {});  // two ranks: taken
}

}  // namespace
