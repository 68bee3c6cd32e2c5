// mt suite: expert dispatch and combine (loom_ep.h), every rank a thread of this process. Both modes at 1 to 8
// ranks with uniform, skewed (hot experts) and self routing, uneven token counts and masked choices, three
// back-to-back calls each (the low-latency buffers alternate); capacities that fit exactly, overflow (an error on
// the rank that overflows) and drop (counted); the low-latency puts through the network proxy (tcp) as well as
// into mapped windows; several EP objects on one communicator; argument errors. The checks are runEpCase's
// (tests/common/ep_check.h): rows and counts bitwise, the combine within the datatype's rounding.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "loom/loom_ep.h"
#include "src/base/integrity.h"
#include "tests/common/ep_check.h"
#include "tests/mt/api_helpers.h"
#include "tests/mt/thread_ranks.h"

namespace {

using loomtest::contains;
using loomtest::EpCase;
using loomtest::EpRouting;
using loomtest::runRanks;
using loomtest::ScopedEnv;

void runCase(int nranks, const EpCase& c) {
  loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
  runRanks(
      nranks, [&](loomComm_t comm, int) { EXPECT_EQ(loomtest::runEpCase(comm, c), ""); }, &config);
}

class EpModeTest : public ::testing::TestWithParam<loomEpMode_t> {};

TEST_P(EpModeTest, EveryRankCountAndRouting) {
  const loomDataType_t types[] = {loomFloat32, loomBfloat16, loomFloat16};
  int variant = 0;
  for (int nranks : {1, 2, 3, 4, 5, 8})
    for (EpRouting routing : {EpRouting::kUniform, EpRouting::kSkewed, EpRouting::kSelf}) {
      EpCase c;
      c.mode = GetParam();
      c.routing = routing;
      c.datatype = types[variant % 3];
      c.expertsPerRank = 1 + variant % 3;
      c.topk = std::min(c.expertsPerRank * nranks, 1 + variant % 4);
      c.hidden = variant % 2 ? 33 : 64;
      c.seed = static_cast<uint32_t>(variant);
      ++variant;
      SCOPED_TRACE(std::to_string(nranks) + " ranks, " + loomtest::epRoutingName(routing));
      runCase(nranks, c);
    }
}

TEST_P(EpModeTest, DeepEpLikeShapeAtTwoAndEightRanks) {
  for (int nranks : {2, 8}) {
    EpCase c;
    c.mode = GetParam();
    c.datatype = loomBfloat16;
    c.expertsPerRank = 32 / nranks;
    c.topk = 8;
    c.hidden = 1024;
    c.maxTokens = 32;
    c.iterations = 2;
    runCase(nranks, c);
  }
}

TEST_P(EpModeTest, CapacityFitsOverflowsAndDrops) {
  EpCase c;
  c.mode = GetParam();
  c.routing = EpRouting::kSkewed;
  c.expertsPerRank = 2;
  c.topk = 3;
  c.expertCapacity = -1;  // exactly the largest load: fits
  runCase(4, c);
  c.expertCapacity = -2;  // one row short: the overflowing rank's dispatch fails, naming the capacity
  runCase(4, c);
  c.dropOverflow = 1;  // ... or drops and counts the rows past it
  runCase(4, c);
  c.expertCapacity = -5;
  runCase(3, c);
}

TEST_P(EpModeTest, OverTcp) {
  ScopedEnv transports("LOOM_TRANSPORTS", "tcp");
  for (int nranks : {2, 3}) {
    EpCase c;
    c.mode = GetParam();
    c.datatype = loomBfloat16;
    c.hidden = 300;
    c.topk = 2;
    c.iterations = 4;
    runCase(nranks, c);
  }
}

// Under LOOM_CHECKSUM the low-latency pieces that go through the tcp proxy carry a CRC32C: every call exact, and
// with a bit flipped in every message that lands from some point on, the calls fail on both ranks, a receiver
// naming the link; no rank accepts a wrong row.
TEST(EpTest, LowLatencyPiecesOverTcpCarryTheChecksum) {
  ScopedEnv transports("LOOM_TRANSPORTS", "tcp"), checksum("LOOM_CHECKSUM", "1");
  EpCase c;
  c.mode = loomEpLowLatency;
  c.datatype = loomBfloat16;
  c.hidden = 300;
  c.topk = 2;
  c.iterations = 4;
  runCase(2, c);
  std::vector<std::string> errors(2);
  {
    ScopedEnv fault("LOOM_FAULT_CORRUPT", "1+");
    loom::rearmCorruption();
    loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
    runRanks(
        2, [&](loomComm_t comm, int rank) { errors[rank] = loomtest::runEpCase(comm, c); }, &config);
  }
  loom::rearmCorruption();
  int finders = 0;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + errors[rank]);
    EXPECT_FALSE(errors[rank].empty());
    EXPECT_FALSE(contains(errors[rank], "out[") || contains(errors[rank], " counted ")) << "a corrupted piece was taken";
    const std::string link = "a piece from rank " + std::to_string(1 - rank) + " to rank " + std::to_string(rank) +
                             " on channel ";
    if (contains(errors[rank], link) && contains(errors[rank], "failed its checksum (LOOM_CHECKSUM)")) ++finders;
  }
  EXPECT_GE(finders, 1);
}

INSTANTIATE_TEST_SUITE_P(Modes, EpModeTest, ::testing::Values(loomEpNormal, loomEpLowLatency),
                         [](const ::testing::TestParamInfo<loomEpMode_t>& info) {
                           return info.param == loomEpNormal ? std::string("Normal") : std::string("LowLatency");
                         });

// Two low-latency objects and a normal one on one communicator, their calls interleaved.
TEST(EpTest, SeveralObjectsOnOneCommunicator) {
  loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
  runRanks(
      3,
      [&](loomComm_t comm, int) {
        EpCase a, b, n;
        a.mode = b.mode = loomEpLowLatency;
        b.hidden = 8;
        b.seed = 7;
        n.seed = 9;
        for (int round = 0; round < 2; ++round) {
          EXPECT_EQ(loomtest::runEpCase(comm, a), "");
          EXPECT_EQ(loomtest::runEpCase(comm, n), "");
          EXPECT_EQ(loomtest::runEpCase(comm, b), "");
        }
      },
      &config);
}

loomEpConfig_t smallConfig(int nranks, loomEpMode_t mode);

// A rank that does not make the matching call: the other's dispatch ends at its deadline with loomTimeout naming
// the call; the late rank's dispatch then fails at once (its peer gave up) instead of waiting out its own.
TEST(EpTest, MissingPeerTimesOutAndTheLateRankFailsFast) {
  loomConfig_t config = loomtest::configWithTimeout(1500);
  for (loomEpMode_t mode : {loomEpNormal, loomEpLowLatency}) {
    std::atomic<bool> firstDone{false};
    runRanks(
        2,
        [&](loomComm_t comm, int rank) {
          loomEpConfig_t c = smallConfig(2, mode);
          loomEp_t ep = nullptr;
          ASSERT_EQ(loomEpCreate(comm, &c, &ep), loomSuccess) << loomGetLastError(comm);
          std::vector<float> x(4 * 8, 1.0f), recv(2 * 8 * 8);
          std::vector<int32_t> idx = {0, 1, 2, 3, 1, 2, 0, 3};
          std::vector<float> w(8, 0.5f);
          int counts[2];
          loomEpHandle_t handle = nullptr;
          auto start = std::chrono::steady_clock::now();
          if (rank == 1)
            while (!firstDone.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          loomResult_t result =
              loomEpDispatch(ep, x.data(), 4, idx.data(), w.data(), recv.data(), counts, &handle, nullptr);
          double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (rank == 0) {
            EXPECT_EQ(result, loomTimeout) << loomGetLastError(comm);
            EXPECT_TRUE(contains(loomGetLastError(comm), "made no progress")) << loomGetLastError(comm);
            EXPECT_LT(seconds, 10.0);
            firstDone = true;
          } else {
            EXPECT_NE(result, loomSuccess);
            EXPECT_LT(seconds, 10.0) << loomGetLastError(comm);
          }
          EXPECT_EQ(handle, nullptr);
          loomEpDestroy(ep);
        },
        &config);
  }
}

loomEpConfig_t smallConfig(int nranks, loomEpMode_t mode) {
  loomEpConfig_t c = LOOM_EP_CONFIG_INITIALIZER;
  c.maxTokensPerRank = 4;
  c.hidden = 8;
  c.numExperts = 2 * nranks;
  c.topk = 2;
  c.datatype = loomFloat32;
  c.mode = mode;
  return c;
}

TEST(EpTest, BadConfigsAreInvalidArguments) {
  loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
  runRanks(
      2,
      [&](loomComm_t comm, int) {
        loomEp_t ep = reinterpret_cast<loomEp_t>(1);
        auto expectRefused = [&](loomEpConfig_t c, const char* words) {
          EXPECT_EQ(loomEpCreate(comm, &c, &ep), loomInvalidArgument) << words;
          EXPECT_EQ(ep, nullptr);
          EXPECT_TRUE(contains(loomGetLastError(comm), words)) << loomGetLastError(comm);
        };
        loomEpConfig_t c = smallConfig(2, loomEpLowLatency);
        c.numExperts = 3;
        expectRefused(c, "multiple of the rank count");
        c = smallConfig(2, loomEpNormal);
        c.topk = 5;
        expectRefused(c, "topk");
        c = smallConfig(2, loomEpNormal);
        c.datatype = loomInt32;
        expectRefused(c, "floating");
        c = smallConfig(2, loomEpNormal);
        c.mode = static_cast<loomEpMode_t>(7);
        expectRefused(c, "mode 7");
        c = smallConfig(2, loomEpNormal);
        c.maxTokensPerRank = 0;
        expectRefused(c, "maxTokensPerRank");
        c = smallConfig(2, loomEpNormal);
        c.size = 8;
        expectRefused(c, "LOOM_EP_CONFIG_INITIALIZER");
        EXPECT_EQ(loomEpCreate(comm, nullptr, &ep), loomInvalidArgument);
        // A config that differs between ranks fails on every rank.
        int rank = 0;
        loomCommUserRank(comm, &rank);
        c = smallConfig(2, loomEpNormal);
        c.hidden = 8 + rank;
        expectRefused(c, "differs");
        // The communicator is still usable.
        c = smallConfig(2, loomEpNormal);
        ASSERT_EQ(loomEpCreate(comm, &c, &ep), loomSuccess) << loomGetLastError(comm);
        EXPECT_EQ(loomEpDestroy(ep), loomSuccess);
      },
      &config);
}

TEST(EpTest, BadCallsAreInvalidArgumentsAndChangeNothing) {
  loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
  for (loomEpMode_t mode : {loomEpNormal, loomEpLowLatency})
    runRanks(
        2,
        [&](loomComm_t comm, int rank) {
          loomEpConfig_t c = smallConfig(2, mode);
          loomEp_t ep = nullptr, other = nullptr;
          ASSERT_EQ(loomEpCreate(comm, &c, &ep), loomSuccess) << loomGetLastError(comm);
          ASSERT_EQ(loomEpCreate(comm, &c, &other), loomSuccess) << loomGetLastError(comm);
          std::vector<float> x(4 * 8, 1.0f), recv(2 * 8 * 8), out(4 * 8);
          std::vector<int32_t> idx = {0, 1, 2, 3, 1, 2, 0, 3};
          std::vector<float> w(8, 0.5f);
          int counts[2];
          loomEpHandle_t handle = reinterpret_cast<loomEpHandle_t>(1);
          auto expectRefused = [&](std::vector<int32_t> badIdx, int tokens, const char* words) {
            EXPECT_EQ(
                loomEpDispatch(ep, x.data(), tokens, badIdx.data(), w.data(), recv.data(), counts, &handle, nullptr),
                loomInvalidArgument)
                << words;
            EXPECT_EQ(handle, nullptr);
            EXPECT_TRUE(contains(loomGetLastError(comm), words)) << loomGetLastError(comm);
          };
          expectRefused({0, 4, 2, 3, 1, 2, 0, 3}, 4, "is not an expert");
          expectRefused({0, -2, 2, 3, 1, 2, 0, 3}, 4, "is not an expert");
          expectRefused({0, 0, 2, 3, 1, 2, 0, 3}, 4, "twice");
          expectRefused(idx, 5, "maxTokensPerRank");
          EXPECT_EQ(loomEpDispatch(ep, x.data(), 4, idx.data(), w.data(), recv.data(), counts, nullptr, nullptr),
                    loomInvalidArgument);
          EXPECT_EQ(loomEpDispatch(nullptr, x.data(), 4, idx.data(), w.data(), recv.data(), counts, &handle, nullptr),
                    loomInvalidArgument);
          // After the refusals the object works: a real call, and a combine with another object's handle refused.
          ASSERT_EQ(loomEpDispatch(ep, x.data(), 4, idx.data(), w.data(), recv.data(), counts, &handle, nullptr),
                    loomSuccess)
              << loomGetLastError(comm);
          EXPECT_EQ(loomEpCombine(other, recv.data(), handle, out.data(), nullptr), loomInvalidArgument);
          EXPECT_TRUE(contains(loomGetLastError(comm), "not a handle of this EP object")) << loomGetLastError(comm);
          ASSERT_EQ(loomEpCombine(ep, recv.data(), handle, out.data(), nullptr), loomSuccess) << loomGetLastError(comm);
          // Each token chose two experts with weight 0.5: identity experts give x back.
          for (float v : out) EXPECT_EQ(v, 1.0f) << "rank " << rank;
          EXPECT_EQ(loomEpHandleFree(handle), loomSuccess);
          EXPECT_EQ(loomEpDestroy(other), loomSuccess);
          EXPECT_EQ(loomEpDestroy(ep), loomSuccess);
        },
        &config);
}

TEST(EpTest, AtMostFourObjectsPerCommunicator) {
  loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
  runRanks(
      1,
      [&](loomComm_t comm, int) {
        loomEpConfig_t c = smallConfig(1, loomEpLowLatency);
        std::vector<loomEp_t> eps(4, nullptr);
        for (loomEp_t& ep : eps) ASSERT_EQ(loomEpCreate(comm, &c, &ep), loomSuccess) << loomGetLastError(comm);
        loomEp_t fifth = nullptr;
        EXPECT_EQ(loomEpCreate(comm, &c, &fifth), loomInvalidUsage);
        EXPECT_TRUE(contains(loomGetLastError(comm), "already has 4 EP objects")) << loomGetLastError(comm);
        EXPECT_EQ(loomEpDestroy(eps[1]), loomSuccess);
        EXPECT_EQ(loomEpCreate(comm, &c, &eps[1]), loomSuccess) << loomGetLastError(comm);
        for (loomEp_t ep : eps) EXPECT_EQ(loomEpDestroy(ep), loomSuccess);
      },
      &config);
}

// A layer that owns an EP object is often destroyed after its communicator: the object lets go of it then.
TEST(EpTest, ObjectOutlivesItsCommunicator) {
  for (loomEpMode_t mode : {loomEpNormal, loomEpLowLatency}) {
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
    loomComm_t comm = nullptr;
    ASSERT_EQ(loomCommInitRank(&comm, 1, id, 0), loomSuccess) << loomGetLastError(nullptr);
    loomEpConfig_t c = smallConfig(1, mode);
    loomEp_t ep = nullptr;
    ASSERT_EQ(loomEpCreate(comm, &c, &ep), loomSuccess) << loomGetLastError(comm);
    ASSERT_EQ(loomCommDestroy(comm), loomSuccess);
    std::vector<float> x(4 * 8, 1.0f), recv(2 * 4 * 8);
    std::vector<int32_t> idx = {0, 1, 1, 0, 0, 1, 1, 0};
    std::vector<float> w(8, 0.5f);
    int counts[2];
    loomEpHandle_t handle = nullptr;
    EXPECT_EQ(loomEpDispatch(ep, x.data(), 4, idx.data(), w.data(), recv.data(), counts, &handle, nullptr),
              loomInvalidUsage);
    EXPECT_TRUE(contains(loomGetLastError(nullptr), "communicator was destroyed")) << loomGetLastError(nullptr);
    loomEpStats_t stats;
    EXPECT_EQ(loomEpGetStats(ep, &stats), loomSuccess);
    EXPECT_EQ(loomEpDestroy(ep), loomSuccess);
  }
}

TEST(EpTest, HostStreamIsSynchronisedFirst) {
  loomConfig_t config = loomtest::configWithTimeout(loomtest::kTestTimeoutMs);
  runRanks(
      2,
      [&](loomComm_t comm, int) {
        loomStream_t stream = nullptr;
        ASSERT_EQ(loomStreamCreate(&stream), loomSuccess);
        // Create runs on the calling thread (before anything is queued on the stream); then an all-reduce queued on
        // the stream, and a dispatch on it: the dispatch reads the all-reduce's result.
        loomEpConfig_t c = smallConfig(2, loomEpLowLatency);
        loomEp_t ep = nullptr;
        ASSERT_EQ(loomEpCreate(comm, &c, &ep), loomSuccess) << loomGetLastError(comm);
        std::vector<float> x(4 * 8, 0.5f), recv(2 * 8 * 8), out(4 * 8);
        ASSERT_EQ(loomAllReduce(x.data(), x.data(), x.size(), loomFloat32, loomSum, comm, stream), loomSuccess);
        std::vector<int32_t> idx = {0, 1, 2, 3, 1, 2, 0, 3};
        std::vector<float> w(8, 0.25f);
        int counts[2];
        loomEpHandle_t handle = nullptr;
        ASSERT_EQ(loomEpDispatch(ep, x.data(), 4, idx.data(), w.data(), recv.data(), counts, &handle, stream),
                  loomSuccess)
            << loomGetLastError(comm);
        ASSERT_EQ(loomEpCombine(ep, recv.data(), handle, out.data(), stream), loomSuccess) << loomGetLastError(comm);
        for (float v : out) EXPECT_EQ(v, 0.5f);  // (0.5 + 0.5) * (0.25 + 0.25)
        loomEpHandleFree(handle);
        loomEpDestroy(ep);
        loomStreamDestroy(stream);
      },
      &config);
}

}  // namespace
