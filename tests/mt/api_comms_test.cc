// mt suite: the public API's contract, continued (tests/mt/api_test.cc has groups, streams, deadlines, abort and
// init), every rank a thread of this process: communicators made from others (loomCommSplit, loomCommShrink),
// LOOM_CHECK_COLL, memory and registration helpers and the small queries. Cases that move data run over shm,
// over loopback and over tcp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "tests/mt/api_helpers.h"
#include "tests/mt/thread_ranks.h"

namespace {

using loomtest::ApiTest;
using loomtest::configWithTimeout;
using loomtest::contains;
using loomtest::expectCommUsable;
using loomtest::kTestTimeoutMs;
using loomtest::runRanks;

// ---- Split ----

// 6 ranks split by parity with key -rank: two communicators of 3 whose ranks run in reverse order. An AllReduce
// and an AllGather of the old ranks on each show membership and order. LOOM_SPLIT_NOCOLOR gives NULL.
TEST_P(ApiTest, SplitByParityInReverseOrder) {
  const int nranks = 6;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        const std::string where = "split of rank " + std::to_string(rank) + " on " + GetParam();
        loomComm_t half = nullptr;
        ASSERT_EQ(loomCommSplit(comm, rank % 2, -rank, &half, nullptr), loomSuccess)
            << where << ": " << loomGetLastError(nullptr);
        ASSERT_NE(half, nullptr) << where;
        int count = 0, newRank = -1;
        EXPECT_EQ(loomCommCount(half, &count), loomSuccess);
        EXPECT_EQ(loomCommUserRank(half, &newRank), loomSuccess);
        EXPECT_EQ(count, 3) << where;
        // Members of a parity in reverse order: old rank 4 (or 5) first.
        EXPECT_EQ(newRank, (4 + rank % 2 - rank) / 2) << where;
        int32_t mine = rank + 1, sum = 0;
        ASSERT_EQ(loomAllReduce(&mine, &sum, 1, loomInt32, loomSum, half, nullptr), loomSuccess) << where;
        EXPECT_EQ(sum, rank % 2 == 0 ? 1 + 3 + 5 : 2 + 4 + 6) << where;
        int32_t oldRank = rank;
        std::vector<int32_t> order(3, -1);
        ASSERT_EQ(loomAllGather(&oldRank, order.data(), 1, loomInt32, half, nullptr), loomSuccess) << where;
        std::vector<int32_t> expected = rank % 2 == 0 ? std::vector<int32_t>{4, 2, 0} : std::vector<int32_t>{5, 3, 1};
        EXPECT_EQ(order, expected) << where;
        EXPECT_EQ(loomCommDestroy(half), loomSuccess);

        // Ranks 1, 3 and 5 opt out; a config with its own deadline is accepted.
        loomConfig_t subConfig = configWithTimeout(kTestTimeoutMs);
        loomComm_t evens = reinterpret_cast<loomComm_t>(&subConfig);  // must be overwritten with NULL
        ASSERT_EQ(loomCommSplit(comm, rank % 2 == 0 ? 7 : LOOM_SPLIT_NOCOLOR, 0, &evens, &subConfig), loomSuccess)
            << where;
        if (rank % 2 == 1) {
          EXPECT_EQ(evens, nullptr) << where << ": LOOM_SPLIT_NOCOLOR must give NULL";
        } else {
          ASSERT_NE(evens, nullptr);
          EXPECT_EQ(loomCommCount(evens, &count), loomSuccess);
          EXPECT_EQ(count, 3) << where;
          EXPECT_EQ(loomCommUserRank(evens, &newRank), loomSuccess);
          EXPECT_EQ(newRank, rank / 2) << where;
          EXPECT_EQ(loomBarrier(evens, nullptr), loomSuccess) << where;
          EXPECT_EQ(loomCommDestroy(evens), loomSuccess);
        }
        // Bad arguments, made by every rank (the call returns before talking to anyone).
        loomComm_t untouched = nullptr;
        EXPECT_EQ(loomCommSplit(comm, -5, 0, &untouched, nullptr), loomInvalidArgument) << where;
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "color")) << loomGetLastError(nullptr);
        EXPECT_EQ(loomCommSplit(comm, 0, 0, nullptr, nullptr), loomInvalidArgument) << where;
        loomConfig_t wrong;
        std::memset(&wrong, 0, sizeof(wrong));
        EXPECT_EQ(loomCommSplit(comm, 0, 0, &untouched, &wrong), loomInvalidArgument) << where;
        EXPECT_EQ(untouched, nullptr);
        // A config the new communicator's init refuses (every rank alike): the reason is on the parent too.
        loomConfig_t refused = LOOM_CONFIG_INITIALIZER;
        refused.deterministic = 7;
        EXPECT_EQ(loomCommSplit(comm, 0, 0, &untouched, &refused), loomInvalidArgument) << where;
        EXPECT_TRUE(contains(loomGetLastError(comm), "deterministic 7")) << loomGetLastError(comm);
        EXPECT_EQ(untouched, nullptr);
        expectCommUsable(comm, rank, nranks, "splits");
      },
      &config);
}

// ---- Shrink ----

// 5 ranks; ranks 1 and 3 are excluded and do not call loomCommShrink. The others form a communicator of 3 in their
// old order, with the parent's settings or a config of their own. Bad arguments are refused by every caller
// before it talks to anyone, and leave the parent usable.
TEST_P(ApiTest, ShrinkExcludesRanksThatDoNotCall) {
  const int nranks = 5;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        const std::string where = "shrink of rank " + std::to_string(rank) + " on " + GetParam();
        const int excluded[] = {3, 1};
        loomComm_t untouched = nullptr;
        const int self[] = {rank};
        EXPECT_EQ(loomCommShrink(comm, self, 1, &untouched, nullptr, LOOM_SHRINK_DEFAULT), loomInvalidArgument);
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "own exclude list")) << loomGetLastError(nullptr);
        const int twice[] = {(rank + 1) % nranks, (rank + 1) % nranks};
        EXPECT_EQ(loomCommShrink(comm, twice, 2, &untouched, nullptr, LOOM_SHRINK_DEFAULT), loomInvalidArgument);
        const int outside[] = {nranks};
        EXPECT_EQ(loomCommShrink(comm, outside, 1, &untouched, nullptr, LOOM_SHRINK_DEFAULT), loomInvalidArgument);
        EXPECT_EQ(loomCommShrink(comm, excluded, 2, &untouched, nullptr, 0x4), loomInvalidArgument);
        EXPECT_EQ(loomCommShrink(comm, excluded, -1, &untouched, nullptr, LOOM_SHRINK_DEFAULT), loomInvalidArgument);
        EXPECT_EQ(untouched, nullptr);
        expectCommUsable(comm, rank, nranks, "refused shrinks");
        if (rank == 1 || rank == 3) return;
        for (bool ownConfig : {false, true}) {
          loomConfig_t subConfig = configWithTimeout(kTestTimeoutMs);
          loomComm_t kept = nullptr;
          ASSERT_EQ(loomCommShrink(comm, excluded, 2, &kept, ownConfig ? &subConfig : nullptr, LOOM_SHRINK_DEFAULT),
                    loomSuccess)
              << where << ": " << loomGetLastError(nullptr);
          int count = 0, newRank = -1;
          EXPECT_EQ(loomCommCount(kept, &count), loomSuccess);
          EXPECT_EQ(loomCommUserRank(kept, &newRank), loomSuccess);
          EXPECT_EQ(count, 3) << where;
          EXPECT_EQ(newRank, rank / 2) << where;
          int32_t oldRank = rank;
          std::vector<int32_t> order(3, -1);
          ASSERT_EQ(loomAllGather(&oldRank, order.data(), 1, loomInt32, kept, nullptr), loomSuccess) << where;
          EXPECT_EQ(order, (std::vector<int32_t>{0, 2, 4})) << where;
          EXPECT_EQ(loomCommDestroy(kept), loomSuccess);
        }
      },
      &config);
}

// Survivors that pass different lists all get loomInvalidUsage naming the rank that differs, and no communicator.
TEST_P(ApiTest, ShrinkWithDisagreeingListsFailsOnEveryCaller) {
  const int nranks = 4;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        if (rank == 3) return;  // excluded by all
        std::vector<int> excluded = rank == 2 ? std::vector<int>{3, 1} : std::vector<int>{3};
        loomComm_t kept = nullptr;
        EXPECT_EQ(loomCommShrink(comm, excluded.data(), static_cast<int>(excluded.size()), &kept, nullptr,
                                 LOOM_SHRINK_DEFAULT),
                  loomInvalidUsage)
            << "rank " << rank << ": " << loomGetLastError(nullptr);
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "rank 2 passed another exclude list than rank 0"))
            << loomGetLastError(nullptr);
        EXPECT_EQ(kept, nullptr);
      },
      &config);
}

// ---- LOOM_CHECK_COLL ----

// With LOOM_CHECK_COLL=1, 3 ranks: matching calls run (single, count 0, a group with Send/Recv beside two
// collectives); a rank passing another count, another collective, an empty call or one call more in a group makes
// every rank fail with loomInvalidUsage naming each rank's call; after each, the communicator still works.
TEST(ApiCheckCollTest, MismatchedCallsFailOnEveryRankAndNameThem) {
  loomtest::ScopedEnv check("LOOM_CHECK_COLL", "1");
  const int nranks = 3;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        const std::string where = "rank " + std::to_string(rank);
        std::vector<float> a(101, 1.0f), b(101, 0.0f);
        ASSERT_EQ(loomAllReduce(a.data(), b.data(), 101, loomFloat32, loomSum, comm, nullptr), loomSuccess) << where;
        EXPECT_EQ(b[100], 3.0f);
        EXPECT_EQ(loomAllReduce(a.data(), b.data(), 0, loomFloat32, loomSum, comm, nullptr), loomSuccess) << where;
        std::vector<int32_t> out(8, rank), in(8, -1);
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        loomSend(out.data(), 8, loomInt32, (rank + 1) % nranks, comm, nullptr);
        loomBroadcast(a.data(), b.data(), 101, loomFloat32, 2, comm, nullptr);
        loomRecv(in.data(), 8, loomInt32, (rank + nranks - 1) % nranks, comm, nullptr);
        loomAllReduce(a.data(), a.data(), 101, loomFloat32, loomMax, comm, nullptr);
        ASSERT_EQ(loomGroupEnd(), loomSuccess) << where << ": " << loomGetLastError(nullptr);
        EXPECT_EQ(in[0], (rank + nranks - 1) % nranks);

        // Rank 1 passes another count: every rank is told, with each rank's call.
        size_t count = rank == 1 ? 100 : 101;
        EXPECT_EQ(loomAllReduce(a.data(), b.data(), count, loomFloat32, loomSum, comm, nullptr), loomInvalidUsage);
        std::string message = loomGetLastError(nullptr);
        EXPECT_TRUE(contains(message.c_str(), "ranks 0, 2: call #4: AllReduce of 101 float (sum)")) << message;
        EXPECT_TRUE(contains(message.c_str(), "rank 1: call #4: AllReduce of 100 float (sum)")) << message;
        // Rank 2 calls Broadcast where the others call AllReduce; rank 0's call has count 0.
        loomResult_t result =
            rank == 2 ? loomBroadcast(a.data(), b.data(), 101, loomFloat32, 1, comm, nullptr)
                      : loomAllReduce(a.data(), b.data(), rank == 0 ? 0 : 101, loomFloat32, loomSum, comm, nullptr);
        EXPECT_EQ(result, loomInvalidUsage) << where;
        message = loomGetLastError(nullptr);
        EXPECT_TRUE(contains(message.c_str(), "rank 2: call #5: Broadcast of 101 float, root 1")) << message;
        EXPECT_TRUE(contains(message.c_str(), "rank 0: call #5: AllReduce of 0 float (sum)")) << message;
        // Rank 0's group holds one collective more.
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        loomAllReduce(a.data(), b.data(), 101, loomFloat32, loomSum, comm, nullptr);
        if (rank == 0) loomAllGather(a.data(), b.data(), 10, loomFloat32, comm, nullptr);
        EXPECT_EQ(loomGroupEnd(), loomInvalidUsage) << where;
        message = loomGetLastError(nullptr);
        EXPECT_TRUE(contains(message.c_str(), "rank 0: call #6: a group of 2 collectives")) << message;
        expectCommUsable(comm, rank, nranks, "mismatched calls under LOOM_CHECK_COLL");
      },
      &config);
}

// Ranks that disagree on LOOM_CHECK_COLL fail init, naming both settings.
TEST(ApiCheckCollTest, RanksMustAgreeOnTheSetting) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  config.blocking = 0;
  loomComm_t checking = nullptr, plain = nullptr;
  {
    loomtest::ScopedEnv check("LOOM_CHECK_COLL", "1");  // read when init starts, on this thread
    ASSERT_EQ(loomCommInitRankConfig(&checking, 2, id, 0, &config), loomInProgress);
  }
  config.blocking = 1;
  EXPECT_EQ(loomCommInitRankConfig(&plain, 2, id, 1, &config), loomInvalidUsage);
  EXPECT_TRUE(contains(loomGetLastError(nullptr), "LOOM_CHECK_COLL")) << loomGetLastError(nullptr);
  loomResult_t state = loomInProgress;
  while (state == loomInProgress) ASSERT_EQ(loomCommGetAsyncError(checking, &state), loomSuccess);
  EXPECT_EQ(state, loomInvalidUsage);
  EXPECT_EQ(loomCommDestroy(checking), loomSuccess);
}

// ---- Memory, registration and queries ----

TEST(ApiMemTest, MemAllocAndFree) {
  void* ptr = nullptr;
  ASSERT_EQ(loomMemAlloc(&ptr, 1 << 20), loomSuccess) << loomGetLastError(nullptr);
  ASSERT_NE(ptr, nullptr);
  std::memset(ptr, 0x7f, 1 << 20);
  EXPECT_EQ(static_cast<unsigned char*>(ptr)[(1 << 20) - 1], 0x7f);
  int onStack = 0;
  EXPECT_EQ(loomMemFree(&onStack), loomInvalidArgument);
  EXPECT_TRUE(contains(loomGetLastError(nullptr), "loomMemAlloc")) << loomGetLastError(nullptr);
  EXPECT_EQ(loomMemFree(static_cast<char*>(ptr) + 64), loomInvalidArgument) << "pointer inside an allocation";
  EXPECT_EQ(loomMemFree(ptr), loomSuccess);
  EXPECT_EQ(loomMemFree(ptr), loomInvalidArgument) << "double free";
  EXPECT_EQ(loomMemFree(nullptr), loomSuccess);
  EXPECT_EQ(loomMemAlloc(nullptr, 64), loomInvalidArgument);
  void* none = &onStack;
  EXPECT_EQ(loomMemAlloc(&none, 0), loomInvalidArgument);
  EXPECT_EQ(none, &onStack);
}

// Collectives on loomMemAlloc memory, and registration: a good handle deregisters once, a bad one is an error.
TEST_P(ApiTest, RegisteredMemoryAndHandles) {
  const int nranks = 2;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        constexpr size_t kCount = 300000;
        void* memory = nullptr;
        ASSERT_EQ(loomMemAlloc(&memory, kCount * sizeof(float)), loomSuccess);
        auto* values = static_cast<float*>(memory);
        std::fill(values, values + kCount, static_cast<float>(rank + 1));
        void* handle = nullptr;
        ASSERT_EQ(loomCommRegister(comm, memory, kCount * sizeof(float), &handle), loomSuccess);
        ASSERT_EQ(loomAllReduce(values, values, kCount, loomFloat32, loomSum, comm, nullptr), loomSuccess);
        EXPECT_EQ(std::count(values, values + kCount, 3.0f), static_cast<long>(kCount)) << "rank " << rank;
        int bogus = 0;
        EXPECT_EQ(loomCommDeregister(comm, &bogus), loomInvalidArgument);
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "loomCommDeregister")) << loomGetLastError(nullptr);
        EXPECT_EQ(loomCommDeregister(nullptr, handle), loomInvalidArgument);
        EXPECT_EQ(loomCommDeregister(comm, handle), loomSuccess);
        EXPECT_EQ(loomCommDeregister(comm, handle), loomInvalidArgument) << "deregistered twice";
        void* h = nullptr;
        EXPECT_EQ(loomCommRegister(comm, nullptr, 64, &h), loomInvalidArgument);
        EXPECT_EQ(loomCommRegister(comm, memory, 0, &h), loomInvalidArgument);
        EXPECT_EQ(loomCommRegister(comm, memory, 64, nullptr), loomInvalidArgument);
        EXPECT_EQ(loomCommRegister(nullptr, memory, 64, &h), loomInvalidArgument);
        EXPECT_EQ(loomMemFree(memory), loomSuccess);
        expectCommUsable(comm, rank, nranks, "registration calls");
      },
      &config);
}

TEST(ApiQueryTest, VersionAndErrorStrings) {
  int version = -1;
  EXPECT_EQ(loomGetVersion(&version), loomSuccess);
  EXPECT_EQ(version, LOOM_VERSION_CODE);
  EXPECT_EQ(loomGetVersion(nullptr), loomInvalidArgument);
  std::set<std::string> seen;
  for (int code = loomSuccess; code < loomNumResults; ++code) {
    const char* text = loomGetErrorString(static_cast<loomResult_t>(code));
    ASSERT_NE(text, nullptr) << "code " << code;
    EXPECT_GT(std::strlen(text), 0u) << "code " << code;
    EXPECT_TRUE(seen.insert(text).second) << "code " << code << " shares its string \"" << text << "\"";
  }
  for (int code : {static_cast<int>(loomNumResults), -1, 1000}) {
    const char* text = loomGetErrorString(static_cast<loomResult_t>(code));
    ASSERT_NE(text, nullptr);
    EXPECT_GT(std::strlen(text), 0u);
    EXPECT_EQ(seen.count(text), 0u) << "out-of-range code " << code << " reads as a real one";
  }
}

TEST_P(ApiTest, CountRankAndLastError) {
  const int nranks = 3;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        int count = -1, userRank = -1;
        EXPECT_EQ(loomCommCount(comm, &count), loomSuccess);
        EXPECT_EQ(loomCommUserRank(comm, &userRank), loomSuccess);
        EXPECT_EQ(count, nranks);
        EXPECT_EQ(userRank, rank);
        EXPECT_EQ(loomCommCount(comm, nullptr), loomInvalidArgument);
        EXPECT_EQ(loomCommUserRank(comm, nullptr), loomInvalidArgument);
        EXPECT_EQ(loomCommCount(nullptr, &count), loomInvalidArgument);
        EXPECT_EQ(loomCommUserRank(nullptr, &userRank), loomInvalidArgument);
        loomResult_t asyncError = loomInternalError;
        EXPECT_EQ(loomCommGetAsyncError(comm, &asyncError), loomSuccess);
        EXPECT_EQ(asyncError, loomSuccess);
        EXPECT_EQ(loomCommGetAsyncError(comm, nullptr), loomInvalidArgument);
        EXPECT_EQ(loomCommGetAsyncError(nullptr, &asyncError), loomInvalidArgument);
        EXPECT_STREQ(loomGetLastError(comm), "") << "a fresh communicator has no last error";
        EXPECT_EQ(loomBarrier(comm, nullptr), loomSuccess) << loomGetLastError(comm);
        // One rank's error is its own: the others' messages stay empty.
        if (rank == 1) {
          EXPECT_EQ(loomBarrier(comm, &count), loomInvalidArgument);
        }
        EXPECT_EQ(loomBarrier(comm, nullptr), loomSuccess);
        EXPECT_EQ(std::string(loomGetLastError(comm)).empty(), rank != 1) << "rank " << rank;
      },
      &config);
}

INSTANTIATE_TEST_SUITE_P(Transports, ApiTest, ::testing::ValuesIn(loomtest::dataTransports()),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
