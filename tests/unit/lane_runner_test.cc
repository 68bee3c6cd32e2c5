// The GPU executor's core run on the host (src/exec/lane_runner.h): ranks as threads, every lane of every rank's
// flat plan driven by a LaneRunner over FIFOs in fifo.h's layout, for every algorithm of AllReduce, ReduceScatter,
// AllGather, Broadcast and Reduce, at 2 to 4 ranks, 1 and 2 channels, both protocols, against the collectives'
// reference results. Small slots make every step many slices.
#include "src/exec/lane_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithms/builders.h"
#include "transports/fifo.h"

namespace loom {
namespace {

constexpr FifoShape kShape{4, 4096, 1040};  // 4 slots: 4 KiB Simple, 516 bytes of LL payload

struct FreeDeleter {
  void operator()(void* memory) const { std::free(memory); }
};

template <class T>
T inputValue(int rank, size_t i) {
  return static_cast<T>((rank + 1) * 3 + static_cast<int>(i % 7));
}

// Runs one call on `nranks` threads; returns "" or what went wrong.
template <loomDataType_t kType, class Op, class T>
std::string runCall(Collective collective, const std::string& algorithm, int nranks, int nChannels, size_t count,
                    int forcedProtocol, bool* planned) {
  std::vector<FlatPlan> plans(nranks);
  int channels = 0;
  for (int rank = 0; rank < nranks; ++rank) {
    CollArgs args;
    args.collective = collective;
    args.nranks = nranks;
    args.rank = rank;
    args.root = nranks - 1;
    args.count = count;
    args.nChannels = nChannels;
    RankPlan plan;
    if (!buildPlan(args, algorithm, &plan)) {
      *planned = false;
      return "";
    }
    for (const Lane& lane : plan.lanes) channels = std::max(channels, lane.channel + 1);
    plans[rank] = flatten(plan);
  }
  *planned = true;
  // One FIFO per (sender, receiver, channel), and each end's counters.
  std::map<std::tuple<int, int, int>, std::unique_ptr<void, FreeDeleter>> fifos;
  auto fifo = [&](int from, int to, int channel) {
    auto& memory = fifos[{from, to, channel}];
    if (!memory) {
      memory.reset(std::aligned_alloc(4096, (fifoBytes(kShape) + 4095) / 4096 * 4096));  // a multiple of the alignment
      fifoInit(memory.get(), kShape);
    }
    return static_cast<unsigned char*>(memory.get());
  };
  auto end = [&](int from, int to, int channel) {
    PortableEnd e;
    e.fifo = fifo(from, to, channel);
    e.depth = kShape.depth;
    e.slotBytes = kShape.slotBytes;
    e.llSlotBytes = kShape.llSlotBytes;
    return e;
  };
  // ends[rank][channel][peer]
  std::vector<std::vector<std::vector<PortableEnd>>> recvEnds(nranks), sendEnds(nranks);
  for (int r = 0; r < nranks; ++r) {
    recvEnds[r].resize(channels);
    sendEnds[r].resize(channels);
    for (int c = 0; c < channels; ++c)
      for (int p = 0; p < nranks; ++p) {
        recvEnds[r][c].push_back(p == r ? PortableEnd{} : end(p, r, c));
        sendEnds[r][c].push_back(p == r ? PortableEnd{} : end(r, p, c));
      }
  }
  std::vector<std::vector<T>> inputs(nranks), outputs(nranks), scratch(nranks);
  for (int r = 0; r < nranks; ++r) {
    inputs[r].resize(std::max<size_t>(plans[r].inputCount, 1));
    for (size_t i = 0; i < inputs[r].size(); ++i) inputs[r][i] = inputValue<T>(r, i);
    outputs[r].assign(std::max<size_t>(plans[r].outputCount, 1), T{});
    scratch[r].assign(std::max<size_t>(plans[r].scratchCount, 1), T{});
  }
  const FifoWords words = fifoWords();
  std::vector<std::string> errors(nranks);
  auto rankMain = [&](int r) {
    FlatPlanView view = plans[r].view();
    LaneCall call{reinterpret_cast<unsigned char*>(inputs[r].data()),
                  reinterpret_cast<unsigned char*>(outputs[r].data()),
                  reinterpret_cast<unsigned char*>(scratch[r].data()),
                  kShape.slotBytes / sizeof(T),
                  fifo::llPayloadBytes(kShape.llSlotBytes) / sizeof(T),
                  1024,
                  forcedProtocol};
    std::vector<LaneRunner<kType, Op>> runners(view.laneCount);
    std::vector<std::vector<uint32_t>> staging(view.laneCount, std::vector<uint32_t>(kShape.llSlotBytes / 8));
    for (uint32_t l = 0; l < view.laneCount; ++l) {
      FlatLaneView lane = view.lane(l);
      runners[l].start(lane, call, words, recvEnds[r][lane.channel].data(), sendEnds[r][lane.channel].data(),
                       staging[l].data());
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (bool all = false; !all;) {
      all = true;
      bool progress = false;
      for (auto& runner : runners) {
        // As a kernel runs it: the slice's data split among workers (here one after another), then the post.
        typename LaneRunner<kType, Op>::Slice slice;
        LaneStatus status = runner.prepare(&slice);
        if (status == LaneStatus::kRan) {
          constexpr size_t kWorkers = 3;
          for (size_t worker = 0; worker < kWorkers; ++worker) LaneRunner<kType, Op>::apply(slice, worker, kWorkers);
          runner.finish(slice);
        }
        if (status == LaneStatus::kPeerAborted || status == LaneStatus::kBadMessage) {
          errors[r] = status == LaneStatus::kBadMessage ? "a message of the wrong size" : "a peer aborted";
          return;
        }
        progress |= status == LaneStatus::kRan;
        all &= runner.done();
      }
      if (!progress && !all) {
        if (std::chrono::steady_clock::now() > deadline) {
          errors[r] = "no progress for 60 s";
          return;
        }
        std::this_thread::yield();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back(rankMain, r);
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < nranks; ++r)
    if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];

  // The reference.
  auto reduced = [&](size_t i) {
    T value = inputValue<T>(0, i);
    for (int r = 1; r < nranks; ++r) value = Op::apply(value, inputValue<T>(r, i));
    return value;
  };
  for (int r = 0; r < nranks; ++r) {
    for (size_t i = 0; i < plans[r].outputCount; ++i) {
      T want{};
      switch (collective) {
        case Collective::kAllReduce:
        case Collective::kReduce:
          want = reduced(i);
          break;
        case Collective::kReduceScatter:
          want = reduced(r * count + i);
          break;
        case Collective::kAllGather:
          want = inputValue<T>(static_cast<int>(i / count), i % count);
          break;
        case Collective::kBroadcast:
          want = inputValue<T>(nranks - 1, i);
          break;
        default:
          return "no reference for this collective";
      }
      if (outputs[r][i] != want)
        return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
               std::to_string(static_cast<double>(outputs[r][i])) + ", expected " +
               std::to_string(static_cast<double>(want));
    }
  }
  return "";
}

TEST(LaneRunner, EveryAlgorithmMatchesTheReferenceOnHostThreads) {
  int calls = 0;
  for (Collective collective : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                                Collective::kBroadcast, Collective::kReduce})
    for (const std::string& algorithm : algorithmsFor(collective))
      for (int nranks : {2, 3, 4})
        for (int nChannels : {1, 2})
          for (size_t count : {size_t{1}, size_t{300}, size_t{5003}})
            for (int protocol : {-1, static_cast<int>(Protocol::kLL)}) {
              if (protocol >= 0 && count > 300) continue;  // forced LL on big counts adds time, not coverage
              bool planned = false;
              std::string where = std::string(collectiveName(collective)) + " " + algorithm + " ranks " +
                                  std::to_string(nranks) + " channels " + std::to_string(nChannels) + " count " +
                                  std::to_string(count) + " protocol " + std::to_string(protocol);
              std::string error = runCall<loomFloat32, device::SumOp, float>(collective, algorithm, nranks, nChannels,
                                                                             count, protocol, &planned);
              ASSERT_EQ(error, "") << where << " (float sum)";
              if (!planned) continue;
              ++calls;
              if (collective == Collective::kAllReduce || collective == Collective::kReduce) {
                error = runCall<loomInt32, device::MaxOp, int32_t>(collective, algorithm, nranks, nChannels, count,
                                                                   protocol, &planned);
                ASSERT_EQ(error, "") << where << " (int32 max)";
              }
            }
  EXPECT_GT(calls, 100);
}

}  // namespace
}  // namespace loom
