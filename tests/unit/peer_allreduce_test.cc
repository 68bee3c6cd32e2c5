// The GPU executor's one-shot and two-shot AllReduce (src/exec/peer_allreduce.h) run on the host: ranks as threads,
// mailboxes in fifo.h's layout in host memory, several calls in a row (both slots, growing flags), every element
// type and operator, 2 to 8 ranks, each phase split over several workers. Inputs are small integers, so every
// type's exact result is known whatever the order of reduction; every rank must end with it.
#include "src/exec/peer_allreduce.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transports/fifo.h"

namespace loom {
namespace {

struct FreeDeleter {
  void operator()(void* memory) const { std::free(memory); }
};

// The integer rank r contributes to element i of call `call` (1 or 2 for prod, so no type overflows).
int64_t contribution(int r, size_t i, int call, bool prod) {
  if (prod) return 1 + static_cast<int64_t>((r + i + call) % 2);
  return static_cast<int64_t>((r * 3 + i % 7 + call) % 11) - 3;
}

template <loomDataType_t kType>
typename device::FormatOf<kType>::Storage fromInteger(int64_t value, bool isUnsigned) {
  using Format = device::FormatOf<kType>;
  using Compute = typename Format::Compute;
  if (isUnsigned && value < 0) value = -value;
  return Format::store(static_cast<Compute>(value));
}

template <class Op>
int64_t referenceOf(int nranks, size_t i, int call, bool isUnsigned) {
  constexpr bool prod = std::is_same_v<Op, device::ProdOp>;
  auto value = [&](int r) {
    int64_t v = contribution(r, i, call, prod);
    return isUnsigned && v < 0 ? -v : v;
  };
  int64_t result = value(0);
  for (int r = 1; r < nranks; ++r) {
    int64_t v = value(r);
    if constexpr (std::is_same_v<Op, device::SumOp>) result += v;
    if constexpr (std::is_same_v<Op, device::ProdOp>) result *= v;
    if constexpr (std::is_same_v<Op, device::MaxOp>) result = std::max(result, v);
    if constexpr (std::is_same_v<Op, device::MinOp>) result = std::min(result, v);
  }
  return result;
}

// Runs `calls` AllReduce calls of `count` elements one after another on `nranks` threads, one-shot or two-shot;
// returns "" or what went wrong.
template <loomDataType_t kType, class Op>
std::string runCalls(int nranks, size_t count, bool twoShot, int calls) {
  using Element = typename device::FormatOf<kType>::Storage;
  using Runner = PeerAllReduce<kType, Op>;
  constexpr bool isUnsigned = kType == loomUint8 || kType == loomUint32 || kType == loomUint64;
  constexpr bool prod = std::is_same_v<Op, device::ProdOp>;
  const size_t slotBytes =
      twoShot ? 2 * (peerChunkBytes(count, sizeof(Element), nranks) + 64) : count * sizeof(Element) + 64;
  const FifoShape shape{2, slotBytes, 64};
  // mailbox[to][from]
  std::vector<std::vector<std::unique_ptr<void, FreeDeleter>>> mailbox(nranks);
  for (int to = 0; to < nranks; ++to)
    for (int from = 0; from < nranks; ++from) {
      mailbox[to].emplace_back(std::aligned_alloc(4096, (fifoBytes(shape) + 4095) / 4096 * 4096));
      fifoInit(mailbox[to].back().get(), shape);
    }
  const FifoWords words = fifoWords();
  std::vector<std::string> errors(nranks);
  std::vector<std::vector<Element>> outputs(nranks, std::vector<Element>(count));

  auto rankMain = [&](int r) {
    std::vector<Element> input(count);
    uint64_t epoch = 1;
    auto barrier = [&](const PeerCall& call, uint64_t flag) {
      for (int p = 0; p < nranks; ++p)
        if (p != r) Runner::signal(call, p, flag);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (int p = 0; p < nranks; ++p)
        while (p != r && !Runner::arrived(call, p, flag)) {
          if (std::chrono::steady_clock::now() > deadline) return false;
          std::this_thread::yield();
        }
      return true;
    };
    constexpr size_t kWorkers = 3;  // each phase's share, run one after another
    auto phase = [&](void (*run)(const PeerCall&, size_t, size_t), const PeerCall& call) {
      for (size_t worker = 0; worker < kWorkers; ++worker) run(call, worker, kWorkers);
    };
    for (int c = 0; c < calls; ++c) {
      for (size_t i = 0; i < count; ++i) input[i] = fromInteger<kType>(contribution(r, i, c, prod), isUnsigned);
      PeerCall call;
      call.rank = r;
      call.nranks = nranks;
      call.input = reinterpret_cast<const unsigned char*>(input.data());
      call.output = reinterpret_cast<unsigned char*>(outputs[r].data());
      call.count = count;
      for (int p = 0; p < nranks; ++p) {
        call.inbox[p] = static_cast<unsigned char*>(mailbox[r][p].get());
        call.outbox[p] = static_cast<unsigned char*>(mailbox[p][r].get());
      }
      call.slotBytes = slotBytes;
      call.words = words;
      call.parity = static_cast<uint32_t>(c % 2);
      call.epoch = epoch;
      bool ok = true;
      if (twoShot) {
        phase(Runner::twoShotScatter, call);
        ok = barrier(call, epoch);
        if (ok) phase(Runner::twoShotReduce, call);
        ok = ok && barrier(call, epoch + 1);
        if (ok) phase(Runner::twoShotGather, call);
        epoch += 2;
      } else {
        phase(Runner::oneShotPush, call);
        ok = barrier(call, epoch);
        if (ok) phase(Runner::oneShotReduce, call);
        epoch += 1;
      }
      if (!ok) {
        errors[r] = "call " + std::to_string(c) + ": a barrier waited 60 s";
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        Element want = fromInteger<kType>(referenceOf<Op>(nranks, i, c, isUnsigned), false);
        if (outputs[r][i] != want) {
          errors[r] = "call " + std::to_string(c) + " element " + std::to_string(i) + ": bits " +
                      std::to_string(static_cast<double>(outputs[r][i])) + ", expected " +
                      std::to_string(static_cast<double>(want));
          return;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back(rankMain, r);
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < nranks; ++r)
    if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
  return "";
}

template <loomDataType_t kType>
void runEveryOp(const char* type) {
  for (bool twoShot : {false, true})
    for (int nranks : {2, 3, 8})
      for (size_t count : {size_t{1}, size_t{9}, size_t{1000}}) {
        std::string where = std::string(type) + (twoShot ? " two-shot" : " one-shot") + " ranks " +
                            std::to_string(nranks) + " count " + std::to_string(count);
        EXPECT_EQ((runCalls<kType, device::SumOp>(nranks, count, twoShot, 3)), "") << where << " sum";
        EXPECT_EQ((runCalls<kType, device::ProdOp>(nranks, count, twoShot, 3)), "") << where << " prod";
        EXPECT_EQ((runCalls<kType, device::MaxOp>(nranks, count, twoShot, 3)), "") << where << " max";
        EXPECT_EQ((runCalls<kType, device::MinOp>(nranks, count, twoShot, 3)), "") << where << " min";
      }
}

TEST(PeerAllReduce, ChunksCoverTheBufferInWholeVectors) {
  for (size_t elementBytes : {1, 2, 4, 8})
    for (int nranks : {1, 2, 3, 8, 16})
      for (size_t count : {0, 1, 7, 64, 1000, 4099}) {
        size_t next = 0;
        for (int r = 0; r < nranks; ++r) {
          size_t lo = 0, hi = 0;
          peerChunk(count, elementBytes, nranks, r, &lo, &hi);
          EXPECT_EQ(lo, next) << elementBytes << " " << nranks << " " << count << " rank " << r;
          EXPECT_LE(lo, hi);
          if (hi < count) {
            EXPECT_EQ((hi - lo) * elementBytes % 16, 0u) << "only the last chunk may end mid-vector";
          }
          EXPECT_LE((hi - lo) * elementBytes, peerChunkBytes(count, elementBytes, nranks));
          next = hi;
        }
        EXPECT_EQ(next, count) << elementBytes << " " << nranks << " " << count;
      }
}

TEST(PeerAllReduce, EveryTypeAndOpMatchesTheReference) {
  runEveryOp<loomInt8>("int8");
  runEveryOp<loomUint8>("uint8");
  runEveryOp<loomInt32>("int32");
  runEveryOp<loomUint32>("uint32");
  runEveryOp<loomInt64>("int64");
  runEveryOp<loomUint64>("uint64");
  runEveryOp<loomFloat16>("float16");
  runEveryOp<loomBfloat16>("bfloat16");
  runEveryOp<loomFloat32>("float32");
  runEveryOp<loomFloat64>("float64");
}

TEST(PeerAllReduce, ManyCallsReuseTheTwoSlots) {
  EXPECT_EQ((runCalls<loomFloat32, device::SumOp>(4, 4099, false, 40)), "");
  EXPECT_EQ((runCalls<loomFloat32, device::SumOp>(4, 4099, true, 40)), "");
}

}  // namespace
}  // namespace loom
