// mt suite: the public API's contract, every rank a thread of this process. Aborting a blocked call from
// another thread, deadlines, host streams, groups (ring exchanges larger than a FIFO, sends to self, a bad call
// inside a group) and non-blocking init. Cases that move data run over shm, over loopback and over tcp.
// Not here: loomCommSplit and loomCommShrink, LOOM_CHECK_COLL, memory and registration helpers and the small
// queries, see tests/mt/api_comms_test.cc; argument checks, count-0 calls and the accepted buffer layouts, see
// tests/mt/api_args_test.cc; loomCommInitFromEnv and dead processes (the environment and liveness are per
// process), see tests/mp/failure_test.cc; collective results over many sizes and types, see
// tests/mt/collectives_test.cc.
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

using Clock = std::chrono::steady_clock;
using loomtest::ApiTest;
using loomtest::configWithTimeout;
using loomtest::contains;
using loomtest::expectCommUsable;
using loomtest::firstDifferent;
using loomtest::kSentinel;
using loomtest::kTestTimeoutMs;
using loomtest::runRanks;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Creates one communicator per rank concurrently, rank r with configs[r] (so ranks may differ in timeoutMs).
std::vector<loomComm_t> initComms(std::vector<loomConfig_t> configs) {
  const int nranks = static_cast<int>(configs.size());
  std::vector<loomComm_t> comms(nranks, nullptr);
  loomUniqueId id;
  EXPECT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      EXPECT_EQ(loomCommInitRankConfig(&comms[rank], nranks, id, rank, &configs[rank]), loomSuccess)
          << "init of rank " << rank << ": " << loomGetLastError(nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return comms;
}

// ---- Groups ----

TEST(ApiGroupTest, GroupEndWithoutGroupStartIsInvalidUsage) {
  EXPECT_EQ(loomGroupEnd(), loomInvalidUsage);
  EXPECT_TRUE(contains(loomGetLastError(nullptr), "loomGroupStart")) << loomGetLastError(nullptr);
  // Nested groups: only the outermost end runs anything; an extra end is an error again.
  EXPECT_EQ(loomGroupStart(), loomSuccess);
  EXPECT_EQ(loomGroupStart(), loomSuccess);
  EXPECT_EQ(loomGroupEnd(), loomSuccess);
  EXPECT_EQ(loomGroupEnd(), loomSuccess);
  EXPECT_EQ(loomGroupEnd(), loomInvalidUsage);
}

// loomGroupSimulateEnd ends a group without running it and reports the tuner's estimate: more for more bytes,
// nothing written; bad arguments and groups it cannot estimate are refused and change nothing.
TEST_P(ApiTest, GroupSimulateEndEstimatesWithoutRunning) {
  const int nranks = 3;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::vector<float> in(1 << 20, 1.0f), out(1 << 20, kSentinel);
        auto estimate = [&](size_t count) {
          loomSimInfo_t info = LOOM_SIM_INFO_INITIALIZER;
          EXPECT_EQ(loomGroupStart(), loomSuccess);
          EXPECT_EQ(loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr), loomSuccess);
          EXPECT_EQ(loomGroupSimulateEnd(&info), loomSuccess) << loomGetLastError(nullptr);
          return info.estimatedTime;
        };
        float small = estimate(8), large = estimate(in.size());
        EXPECT_GT(small, 0.0f);
        EXPECT_GT(large, 10 * small) << "rank " << rank;
        EXPECT_EQ(firstDifferent(out, kSentinel), -1) << "a simulated call wrote its output, rank " << rank;

        EXPECT_EQ(loomGroupSimulateEnd(nullptr), loomInvalidArgument);
        loomSimInfo_t info = LOOM_SIM_INFO_INITIALIZER;
        EXPECT_EQ(loomGroupSimulateEnd(&info), loomInvalidUsage);  // no group open
        loomSimInfo_t wrongSize = {3, 0.0f};
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomGroupSimulateEnd(&wrongSize), loomInvalidArgument);
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "LOOM_SIM_INFO_INITIALIZER")) << loomGetLastError(nullptr);
        // Send/Recv cannot be estimated: refused, and the group stays open for loomGroupEnd to run.
        int peer = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
        float token = static_cast<float>(rank), got = -1;
        EXPECT_EQ(loomSend(&token, 1, loomFloat32, peer, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomRecv(&got, 1, loomFloat32, from, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomGroupSimulateEnd(&info), loomInvalidUsage);
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "Send/Recv")) << loomGetLastError(nullptr);
        ASSERT_EQ(loomGroupEnd(), loomSuccess) << loomGetLastError(comm);
        EXPECT_EQ(got, static_cast<float>(from));
        expectCommUsable(comm, rank, nranks, "after simulated groups");
      },
      &config);
}

// A bad call inside a group is rejected at once and not queued; the group's valid calls still run at its end.
TEST_P(ApiTest, BadCallInsideAGroupIsRejectedAndTheRestRuns) {
  const int nranks = 3;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::vector<int32_t> send(100, rank + 1), recv(100, -1), untouched(100, -1);
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomAllReduce(send.data(), recv.data(), 100, loomInt32, loomSum, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomAllReduce(send.data(), nullptr, 100, loomInt32, loomSum, comm, nullptr), loomInvalidArgument)
            << "grouped AllReduce with NULL recvbuff, rank " << rank;
        EXPECT_TRUE(contains(loomGetLastError(comm), "recvbuff")) << loomGetLastError(comm);
        EXPECT_EQ(loomSend(send.data(), 100, loomInt32, nranks, comm, nullptr), loomInvalidArgument)
            << "grouped Send to peer nranks, rank " << rank;
        EXPECT_EQ(loomRecv(untouched.data(), 100, loomInt32, -1, comm, nullptr), loomInvalidArgument)
            << "grouped Recv from peer -1, rank " << rank;
        EXPECT_EQ(loomGroupEnd(), loomSuccess) << "rank " << rank << ": " << loomGetLastError(comm);
        EXPECT_EQ(firstDifferent(recv, nranks * (nranks + 1) / 2), -1) << "grouped AllReduce, rank " << rank;
        EXPECT_EQ(firstDifferent(untouched, -1), -1) << "rejected grouped Recv wrote, rank " << rank;
        expectCommUsable(comm, rank, nranks, "a group with rejected calls");
      },
      &config);
}

// Each rank sends to rank+1 and receives from rank-1 in one group. Messages of 8 MB exceed a FIFO (8 slots of
// 128 KB by default, of 512 KB where every connection is tcp), so without the group every rank would block in
// its send.
TEST_P(ApiTest, RingExchangeInAGroupLargerThanTheFifo) {
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  for (int nranks : {2, 3}) {
    runRanks(
        nranks,
        [&](loomComm_t comm, int rank) {
          const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
          for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 21}) {
            std::vector<int32_t> send(count), recv(count, -1);
            for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(rank * 10000000 + i);
            std::string where = "ring exchange of " + std::to_string(count) + " int32, rank " + std::to_string(rank) +
                                " of " + std::to_string(nranks) + ", " + GetParam();
            ASSERT_EQ(loomGroupStart(), loomSuccess);
            ASSERT_EQ(loomSend(send.data(), count, loomInt32, next, comm, nullptr), loomSuccess) << where;
            ASSERT_EQ(loomRecv(recv.data(), count, loomInt32, prev, comm, nullptr), loomSuccess) << where;
            ASSERT_EQ(loomGroupEnd(), loomSuccess) << where << ": " << loomGetLastError(comm);
            for (size_t i = 0; i < count; ++i) {
              if (recv[i] != static_cast<int32_t>(prev * 10000000 + i)) {
                ADD_FAILURE() << where << ": element " << i << " is " << recv[i];
                break;
              }
            }
          }
        },
        &config);
  }
}

// Sends to self pair with receives from self of the same count, in order; a mismatch is invalid usage and
// runs nothing of the group.
TEST_P(ApiTest, SendToSelfInAGroup) {
  const int nranks = 2;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::vector<float> a(300000), b(7), outA(300000, kSentinel), outB(7, kSentinel);
        for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 1000) + rank;
        for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i) - rank;
        std::string where = std::string("self send/recv, rank ") + std::to_string(rank) + ", " + GetParam();
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomSend(a.data(), a.size(), loomFloat32, rank, comm, nullptr), loomSuccess) << where;
        EXPECT_EQ(loomSend(b.data(), b.size(), loomFloat32, rank, comm, nullptr), loomSuccess) << where;
        EXPECT_EQ(loomRecv(outA.data(), a.size(), loomFloat32, rank, comm, nullptr), loomSuccess) << where;
        EXPECT_EQ(loomRecv(outB.data(), b.size(), loomFloat32, rank, comm, nullptr), loomSuccess) << where;
        ASSERT_EQ(loomGroupEnd(), loomSuccess) << where << ": " << loomGetLastError(comm);
        EXPECT_EQ(outA, a) << where;
        EXPECT_EQ(outB, b) << where;

        std::fill(outB.begin(), outB.end(), kSentinel);
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomSend(b.data(), 7, loomFloat32, rank, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomRecv(outB.data(), 6, loomFloat32, rank, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomGroupEnd(), loomInvalidUsage) << "mismatched self counts 7/6, rank " << rank;
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "itself")) << loomGetLastError(nullptr);
        EXPECT_EQ(firstDifferent(outB, kSentinel), -1) << "mismatched self counts wrote, rank " << rank;

        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomSend(b.data(), 7, loomFloat32, rank, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomGroupEnd(), loomInvalidUsage) << "send to self without a receive, rank " << rank;
        expectCommUsable(comm, rank, nranks, "rejected self sends");
      },
      &config);
}

// Calls of one group on different streams (NULL and a host stream) are invalid usage; none of them runs.
TEST_P(ApiTest, GroupMixingStreamsIsInvalidUsage) {
  const int nranks = 2;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        loomStream_t stream = nullptr;
        ASSERT_EQ(loomStreamCreate(&stream), loomSuccess);
        std::vector<float> send(10, 1.0f), recvA(10, kSentinel), recvB(10, kSentinel);
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomAllReduce(send.data(), recvA.data(), 10, loomFloat32, loomSum, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomAllReduce(send.data(), recvB.data(), 10, loomFloat32, loomSum, comm, stream), loomSuccess);
        EXPECT_EQ(loomGroupEnd(), loomInvalidUsage) << "group on two streams, rank " << rank;
        EXPECT_TRUE(contains(loomGetLastError(nullptr), "stream")) << loomGetLastError(nullptr);
        EXPECT_EQ(loomStreamSynchronize(stream), loomSuccess);
        EXPECT_EQ(firstDifferent(recvA, kSentinel), -1) << "rank " << rank;
        EXPECT_EQ(firstDifferent(recvB, kSentinel), -1) << "rank " << rank;
        EXPECT_EQ(loomStreamDestroy(stream), loomSuccess);
        expectCommUsable(comm, rank, nranks, "a group on two streams");
      },
      &config);
}

// ---- Streams ----

// Calls queued on a host stream return before the peers have even started theirs; synchronize then shows the
// results. A group (ring exchange) on a stream too. A destroyed stream is no longer a stream.
TEST_P(ApiTest, StreamQueuesCallsAndSynchronizeShowsResults) {
  const int nranks = 2;
  constexpr int kCalls = 4;
  constexpr size_t kCount = 100000;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  std::atomic<bool> rank0Queued{false};
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        loomStream_t stream = nullptr;
        ASSERT_EQ(loomStreamCreate(&stream), loomSuccess);
        ASSERT_NE(stream, nullptr);
        // Rank 1 queues only after rank 0 has queued all its calls: were queuing blocking, rank 0 would wait for
        // rank 1 here until its deadline.
        if (rank == 1) {
          auto start = Clock::now();
          while (!rank0Queued.load() && secondsSince(start) < 15)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          EXPECT_TRUE(rank0Queued.load()) << "rank 0's queued AllReduce calls did not return before rank 1 joined";
        }
        std::vector<std::vector<float>> send(kCalls, std::vector<float>(kCount)),
            recv(kCalls, std::vector<float>(kCount, kSentinel));
        for (int c = 0; c < kCalls; ++c)
          for (size_t i = 0; i < kCount; ++i) send[c][i] = static_cast<float>((rank + 1) * (c + 1) + i % 5);
        for (int c = 0; c < kCalls; ++c)
          ASSERT_EQ(loomAllReduce(send[c].data(), recv[c].data(), kCount, loomFloat32, loomSum, comm, stream),
                    loomSuccess)
              << "queued AllReduce " << c << ", rank " << rank;
        if (rank == 0) rank0Queued = true;
        ASSERT_EQ(loomStreamSynchronize(stream), loomSuccess) << "rank " << rank << ": " << loomGetLastError(comm);
        for (int c = 0; c < kCalls; ++c) {
          for (size_t i = 0; i < kCount; ++i) {
            float expected = static_cast<float>(3 * (c + 1) + 2 * (i % 5));
            if (recv[c][i] != expected) {
              ADD_FAILURE() << "streamed AllReduce " << c << ", rank " << rank << ", " << GetParam() << ": element "
                            << i << " is " << recv[c][i] << ", expected " << expected;
              break;
            }
          }
        }
        // A grouped ring exchange larger than a FIFO, on the stream.
        std::vector<int32_t> out(1 << 20, rank), in(1 << 20, -1);
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomSend(out.data(), out.size(), loomInt32, 1 - rank, comm, stream), loomSuccess);
        EXPECT_EQ(loomRecv(in.data(), in.size(), loomInt32, 1 - rank, comm, stream), loomSuccess);
        ASSERT_EQ(loomGroupEnd(), loomSuccess) << "grouped exchange on a stream, rank " << rank;
        ASSERT_EQ(loomStreamSynchronize(stream), loomSuccess) << "rank " << rank << ": " << loomGetLastError(comm);
        EXPECT_EQ(firstDifferent(in, 1 - rank), -1) << "grouped exchange on a stream, rank " << rank;
        EXPECT_EQ(loomStreamDestroy(stream), loomSuccess);
        // The stream is gone: using it is an argument error, not a crash.
        EXPECT_EQ(loomStreamSynchronize(stream), loomInvalidArgument);
        EXPECT_EQ(loomAllReduce(send[0].data(), recv[0].data(), kCount, loomFloat32, loomSum, comm, stream),
                  loomInvalidArgument);
        expectCommUsable(comm, rank, nranks, "a destroyed stream");
      },
      &config);
}

TEST(ApiStreamTest, StreamArgumentErrors) {
  EXPECT_EQ(loomStreamCreate(nullptr), loomInvalidArgument);
  int notAStream = 0;
  EXPECT_EQ(loomStreamSynchronize(&notAStream), loomInvalidArgument);
  EXPECT_EQ(loomStreamDestroy(&notAStream), loomInvalidArgument);
  EXPECT_EQ(loomStreamSynchronize(nullptr), loomInvalidArgument);
}

// An error inside a stream (a Recv whose peer never sends, past a 300 ms deadline) comes back from
// loomStreamSynchronize and stays as the communicator's async error.
TEST_P(ApiTest, ErrorInsideAStreamComesBackFromSynchronize) {
  std::vector<loomComm_t> comms = initComms({configWithTimeout(300), configWithTimeout(kTestTimeoutMs)});
  ASSERT_TRUE(comms[0] && comms[1]);
  loomStream_t stream = nullptr;
  ASSERT_EQ(loomStreamCreate(&stream), loomSuccess);
  std::vector<float> recv(1000, kSentinel);
  auto start = Clock::now();
  EXPECT_EQ(loomRecv(recv.data(), recv.size(), loomFloat32, 1, comms[0], stream), loomSuccess);
  EXPECT_EQ(loomStreamSynchronize(stream), loomTimeout) << GetParam();
  EXPECT_LT(secondsSince(start), 10.0) << "streamed Recv with timeoutMs 300 on " << GetParam();
  loomResult_t asyncError = loomSuccess;
  EXPECT_EQ(loomCommGetAsyncError(comms[0], &asyncError), loomSuccess);
  EXPECT_EQ(asyncError, loomTimeout) << GetParam();
  EXPECT_TRUE(contains(loomGetLastError(comms[0]), "Recv")) << loomGetLastError(comms[0]);
  // The first error was reported; the drained stream is clean again.
  EXPECT_EQ(loomStreamSynchronize(stream), loomSuccess);
  EXPECT_EQ(loomStreamDestroy(stream), loomSuccess);
  EXPECT_EQ(loomCommDestroy(comms[0]), loomSuccess);
  EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess);
}

// ---- Deadlines and abort ----

// Rank 0 receives from rank 1, which never sends: loomTimeout after timeoutMs (300), a message naming the
// operation and the deadline, the error kept as the async error, and later calls refused as invalid usage.
TEST_P(ApiTest, RecvFromASilentPeerTimesOut) {
  std::vector<loomComm_t> comms = initComms({configWithTimeout(300), configWithTimeout(kTestTimeoutMs)});
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> recv(1000, kSentinel);
  auto start = Clock::now();
  EXPECT_EQ(loomRecv(recv.data(), recv.size(), loomFloat32, 1, comms[0], nullptr), loomTimeout) << GetParam();
  double seconds = secondsSince(start);
  EXPECT_GE(seconds, 0.29) << "Recv with timeoutMs 300 gave up early on " << GetParam();
  EXPECT_LT(seconds, 10.0) << "Recv with timeoutMs 300 on " << GetParam();
  std::string message = loomGetLastError(comms[0]);
  EXPECT_TRUE(contains(message, "Recv")) << message;
  EXPECT_TRUE(contains(message, "300 ms")) << message;
  loomResult_t asyncError = loomSuccess;
  EXPECT_EQ(loomCommGetAsyncError(comms[0], &asyncError), loomSuccess);
  EXPECT_EQ(asyncError, loomTimeout);
  EXPECT_EQ(firstDifferent(recv, kSentinel), -1);
  // The communicator is no longer trusted: calls are refused, naming the pending error.
  EXPECT_EQ(loomAllReduce(recv.data(), recv.data(), 10, loomFloat32, loomSum, comms[0], nullptr), loomInvalidUsage);
  EXPECT_TRUE(contains(loomGetLastError(comms[0]), "pending error")) << loomGetLastError(comms[0]);
  EXPECT_EQ(loomCommDestroy(comms[0]), loomSuccess);
  EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess);
}

// As above for a collective whose peer never joins: rank 0 waits either to connect to rank 1 or for its data.
TEST_P(ApiTest, AllReduceWithoutItsPeerTimesOut) {
  std::vector<loomComm_t> comms = initComms({configWithTimeout(300), configWithTimeout(kTestTimeoutMs)});
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> data(1000, 1.0f);
  auto start = Clock::now();
  EXPECT_EQ(loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comms[0], nullptr), loomTimeout)
      << GetParam();
  EXPECT_LT(secondsSince(start), 10.0) << "AllReduce with timeoutMs 300 on " << GetParam();
  std::string message = loomGetLastError(comms[0]);
  EXPECT_TRUE(contains(message, "rank 1")) << message;
  EXPECT_TRUE(contains(message, "300 ms")) << message;
  loomResult_t asyncError = loomSuccess;
  EXPECT_EQ(loomCommGetAsyncError(comms[0], &asyncError), loomSuccess);
  EXPECT_EQ(asyncError, loomTimeout);
  EXPECT_EQ(loomCommDestroy(comms[0]), loomSuccess);
  EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess);
}

// A deadline that passes while rank 0 still waits to connect to rank 1 (which never calls) names the operation:
// connection setup waits under the same watch as the call itself.
TEST_P(ApiTest, TimeoutWhileConnectingNamesTheOperation) {
  std::vector<loomComm_t> comms = initComms({configWithTimeout(300), configWithTimeout(kTestTimeoutMs)});
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<float> data(1000, 1.0f);
  EXPECT_EQ(loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comms[0], nullptr), loomTimeout);
  EXPECT_TRUE(contains(loomGetLastError(comms[0]), "AllReduce")) << loomGetLastError(comms[0]);
  EXPECT_EQ(loomCommDestroy(comms[0]), loomSuccess);
  EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess);
}

// Rank 0 blocks in a Recv from rank 1 that never sends (as a plain call, then inside a group); another thread
// aborts rank 0's communicator. With a 60 s deadline, the Recv must return loomRemoteError within seconds.
// Rank 1, meanwhile waiting for a message from rank 0, shares no FIFO with it in that direction and learns of
// the abort only from its own 1.5 s deadline: loomRemoteError or loomTimeout are both right, a hang is not.
TEST_P(ApiTest, AbortFromAnotherThreadEndsABlockedRecv) {
  for (bool inGroup : {false, true}) {
    const std::string what = std::string(inGroup ? "grouped" : "plain") + " Recv on " + GetParam();
    std::vector<loomComm_t> comms = initComms({configWithTimeout(60000), configWithTimeout(1500)});
    ASSERT_TRUE(comms[0] && comms[1]) << what;
    std::atomic<bool> entering{false}, aborted{false};
    loomResult_t result0 = loomSuccess, result1 = loomSuccess, abortResult = loomInternalError;
    double seconds0 = 0, seconds1 = 0;
    std::string message0;
    std::vector<float> recv0(1024, kSentinel), recv1(1024, kSentinel);
    Clock::time_point abortAt, returnedAt;
    std::thread rank0([&] {
      entering = true;
      if (inGroup) {
        loomGroupStart();
        loomRecv(recv0.data(), recv0.size(), loomFloat32, 1, comms[0], nullptr);
        result0 = loomGroupEnd();
      } else {
        result0 = loomRecv(recv0.data(), recv0.size(), loomFloat32, 1, comms[0], nullptr);
      }
      returnedAt = Clock::now();
      message0 = loomGetLastError(nullptr);  // the comm itself is freed by the abort
    });
    std::thread rank1([&] {
      auto start = Clock::now();
      result1 = loomRecv(recv1.data(), recv1.size(), loomFloat32, 0, comms[1], nullptr);
      seconds1 = secondsSince(start);
    });
    std::thread aborter([&] {
      while (!entering.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      abortAt = Clock::now();
      abortResult = loomCommAbort(comms[0]);
      aborted = true;
    });
    aborter.join();
    rank0.join();
    rank1.join();
    seconds0 = std::chrono::duration<double>(returnedAt - abortAt).count();
    EXPECT_EQ(abortResult, loomSuccess) << what;
    EXPECT_EQ(result0, loomRemoteError) << what << ": " << message0;
    EXPECT_LT(seconds0, 5.0) << what << ": the aborted call took this long to return";
    EXPECT_TRUE(contains(message0, "abort")) << what << ": " << message0;
    EXPECT_TRUE(result1 == loomRemoteError || result1 == loomTimeout)
        << what << ", rank 1: " << loomGetErrorString(result1) << ": " << loomGetLastError(comms[1]);
    EXPECT_LT(seconds1, 1.5 + 5.0) << what << ", rank 1 waited this long";
    EXPECT_EQ(firstDifferent(recv0, kSentinel), -1) << what;
    EXPECT_EQ(firstDifferent(recv1, kSentinel), -1) << what;
    EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess) << what;
  }
}

// Two ranks that share FIFOs (a first AllReduce of `data` connected them), each blocked: rank 0 in a Recv from
// rank 1, which never sends, and rank 1 in an AllReduce that rank 0 never joins. `end(comms[0])` runs 200 ms
// into the wait; each rank's result, and how long after `end` it returned.
struct BlockedPair {
  loomResult_t results[2] = {loomSuccess, loomSuccess};
  double seconds[2] = {0, 0};
};
BlockedPair blockBothThenEnd(const std::vector<loomComm_t>& comms, std::vector<std::vector<float>>& data,
                             const std::function<loomResult_t(loomComm_t)>& end) {
  std::vector<std::thread> warmUp;
  for (int rank = 0; rank < 2; ++rank)
    warmUp.emplace_back([&, rank] {
      EXPECT_EQ(loomAllReduce(data[rank].data(), data[rank].data(), data[rank].size(), loomFloat32, loomSum,
                              comms[rank], nullptr),
                loomSuccess);
    });
  for (std::thread& thread : warmUp) thread.join();
  std::atomic<int> entering{0};
  BlockedPair pair;
  std::vector<float> recv0(16, kSentinel);
  Clock::time_point endAt, returned[2];
  std::thread rank0([&] {
    ++entering;
    pair.results[0] = loomRecv(recv0.data(), recv0.size(), loomFloat32, 1, comms[0], nullptr);
    returned[0] = Clock::now();
  });
  std::thread rank1([&] {
    ++entering;
    pair.results[1] =
        loomAllReduce(data[1].data(), data[1].data(), data[1].size(), loomFloat32, loomSum, comms[1], nullptr);
    returned[1] = Clock::now();
  });
  while (entering.load() < 2) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  endAt = Clock::now();
  EXPECT_EQ(end(comms[0]), loomSuccess);
  rank0.join();
  rank1.join();
  for (int rank = 0; rank < 2; ++rank)
    pair.seconds[rank] = std::chrono::duration<double>(returned[rank] - endAt).count();
  return pair;
}

// Where the peer does share FIFOs with the aborted rank (after a first AllReduce connected them), the abort
// reaches it at once: rank 1 blocked in an AllReduce that rank 0 never joins returns loomRemoteError long
// before its 60 s deadline, with a message naming rank 0.
TEST_P(ApiTest, AbortReachesAPeerThroughSharedConnections) {
  std::vector<loomComm_t> comms = initComms({configWithTimeout(60000), configWithTimeout(60000)});
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<std::vector<float>> data(2, std::vector<float>(50000, 1.0f));
  const BlockedPair pair = blockBothThenEnd(comms, data, loomCommAbort);
  EXPECT_EQ(pair.results[0], loomRemoteError) << GetParam();
  EXPECT_LT(pair.seconds[0], 5.0) << GetParam();
  EXPECT_EQ(pair.results[1], loomRemoteError)
      << "rank 1's AllReduce on " << GetParam() << ": " << loomGetLastError(comms[1]);
  EXPECT_LT(pair.seconds[1], 5.0) << "rank 1's AllReduce on " << GetParam() << " returned this long after the abort";
  EXPECT_TRUE(contains(loomGetLastError(comms[1]), "rank 0")) << loomGetLastError(comms[1]);
  loomResult_t asyncError = loomSuccess;
  EXPECT_EQ(loomCommGetAsyncError(comms[1], &asyncError), loomSuccess);
  EXPECT_EQ(asyncError, loomRemoteError);
  EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess);
}

// Revoke is abort without the free: rank 0's blocked Recv returns within seconds of loomCommRevoke from another
// thread, rank 1's AllReduce over FIFOs they share fails naming rank 0, a later call on the revoked communicator
// fails at once (loomInvalidUsage, "revoked") instead of waiting for its 60 s deadline, and destroy still frees it.
TEST_P(ApiTest, RevokeEndsCallsAndLaterOnesButLeavesTheCommunicator) {
  std::vector<loomComm_t> comms = initComms({configWithTimeout(60000), configWithTimeout(60000)});
  ASSERT_TRUE(comms[0] && comms[1]);
  std::vector<std::vector<float>> data(2, std::vector<float>(50000, 1.0f));
  const BlockedPair pair = blockBothThenEnd(comms, data, loomCommRevoke);
  EXPECT_EQ(pair.results[0], loomRemoteError) << GetParam();
  EXPECT_LT(pair.seconds[0], 5.0) << GetParam();
  EXPECT_EQ(pair.results[1], loomRemoteError) << GetParam() << ": " << loomGetLastError(comms[1]);
  EXPECT_LT(pair.seconds[1], 5.0) << GetParam();
  EXPECT_TRUE(contains(loomGetLastError(comms[1]), "rank 0")) << loomGetLastError(comms[1]);
  const auto later = Clock::now();
  EXPECT_EQ(loomAllReduce(data[0].data(), data[0].data(), data[0].size(), loomFloat32, loomSum, comms[0], nullptr),
            loomInvalidUsage);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - later).count(), 5.0) << GetParam();
  EXPECT_TRUE(contains(loomGetLastError(comms[0]), "revoked")) << loomGetLastError(comms[0]);
  EXPECT_EQ(loomCommRevoke(nullptr), loomInvalidArgument);
  EXPECT_EQ(loomCommDestroy(comms[0]), loomSuccess);
  EXPECT_EQ(loomCommDestroy(comms[1]), loomSuccess);
}

// ---- Init ----

// Non-blocking init returns loomInProgress while its peer has not joined; a call then is invalid usage; once
// the peer joins, polling loomCommGetAsyncError reaches loomSuccess and collectives work.
TEST_P(ApiTest, NonBlockingInit) {
  const int nranks = 2;
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  config.blocking = 0;
  std::vector<loomComm_t> comms(nranks, nullptr);
  // Rank 0 alone: it cannot be ready before rank 1 calls init.
  ASSERT_EQ(loomCommInitRankConfig(&comms[0], nranks, id, 0, &config), loomInProgress) << loomGetLastError(nullptr);
  ASSERT_NE(comms[0], nullptr);
  loomResult_t state = loomInternalError;
  EXPECT_EQ(loomCommGetAsyncError(comms[0], &state), loomSuccess);
  EXPECT_EQ(state, loomInProgress);
  float x = 1.0f;
  EXPECT_EQ(loomAllReduce(&x, &x, 1, loomFloat32, loomSum, comms[0], nullptr), loomInvalidUsage);
  EXPECT_TRUE(contains(loomGetLastError(comms[0]), "initialising")) << loomGetLastError(comms[0]);

  loomResult_t init1 = loomCommInitRankConfig(&comms[1], nranks, id, 1, &config);
  EXPECT_TRUE(init1 == loomInProgress || init1 == loomSuccess) << loomGetErrorString(init1);
  for (int rank = 0; rank < nranks; ++rank) {
    auto start = Clock::now();
    do {
      ASSERT_EQ(loomCommGetAsyncError(comms[rank], &state), loomSuccess);
      if (state == loomInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } while (state == loomInProgress && secondsSince(start) < 15);
    ASSERT_EQ(state, loomSuccess) << "non-blocking init of rank " << rank << ": " << loomGetLastError(comms[rank]);
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank)
    threads.emplace_back([&, rank] { expectCommUsable(comms[rank], rank, nranks, "non-blocking init"); });
  for (std::thread& thread : threads) thread.join();
  for (loomComm_t comm : comms) EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
}

// Init arguments are checked before anything is created or contacted; *comm is left alone.
TEST(ApiInitTest, BadInitArguments) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  int marker = 0;
  const loomComm_t kUntouched = reinterpret_cast<loomComm_t>(&marker);
  struct InitCase {
    const char* name;
    int nranks, rank;
    loomResult_t expected;
    const char* mentions;
  };
  for (const InitCase& c : {InitCase{"nranks 0", 0, 0, loomInvalidArgument, "nranks 0"},
                            InitCase{"nranks -3", -3, 0, loomInvalidArgument, "nranks -3"},
                            InitCase{"rank -1 of 2", 2, -1, loomInvalidArgument, "rank -1"},
                            InitCase{"rank 2 of 2", 2, 2, loomInvalidArgument, "rank 2"}}) {
    loomComm_t comm = kUntouched;
    EXPECT_EQ(loomCommInitRank(&comm, c.nranks, id, c.rank), c.expected) << c.name;
    EXPECT_TRUE(contains(loomGetLastError(nullptr), c.mentions)) << c.name << ": " << loomGetLastError(nullptr);
    EXPECT_EQ(comm, kUntouched) << c.name;
  }
  EXPECT_EQ(loomCommInitRank(nullptr, 1, id, 0), loomInvalidArgument);

  // A config not made with LOOM_CONFIG_INITIALIZER: zeroed, or with a wrong magic.
  loomConfig_t zeroed;
  std::memset(&zeroed, 0, sizeof(zeroed));
  loomConfig_t wrongMagic = LOOM_CONFIG_INITIALIZER;
  wrongMagic.magic = 0x12345678u;
  for (loomConfig_t* config : {&zeroed, &wrongMagic}) {
    loomComm_t comm = kUntouched;
    EXPECT_EQ(loomCommInitRankConfig(&comm, 1, id, 0, config), loomInvalidArgument);
    EXPECT_TRUE(contains(loomGetLastError(nullptr), "LOOM_CONFIG_INITIALIZER")) << loomGetLastError(nullptr);
    EXPECT_EQ(comm, kUntouched);
  }
  // A device that is neither host nor cuda; a CUDA device that is not there (whether the build has CUDA, the
  // machine a device, or neither); an id not made by loomGetUniqueId.
  loomConfig_t badDevice = LOOM_CONFIG_INITIALIZER;
  badDevice.device = 7;
  loomComm_t comm = kUntouched;
  EXPECT_EQ(loomCommInitRankConfig(&comm, 1, id, 0, &badDevice), loomInvalidArgument) << loomGetLastError(nullptr);
  EXPECT_TRUE(contains(loomGetLastError(nullptr), "config device 7")) << loomGetLastError(nullptr);
  EXPECT_EQ(comm, kUntouched);
  loomConfig_t cuda = LOOM_CONFIG_INITIALIZER;
  cuda.device = loomDeviceCuda;
  cuda.cudaDevice = 1000;
  EXPECT_EQ(loomCommInitRankConfig(&comm, 1, id, 0, &cuda), loomInvalidArgument) << loomGetLastError(nullptr);
  EXPECT_TRUE(contains(loomGetLastError(nullptr), "cuda")) << loomGetLastError(nullptr);
  EXPECT_EQ(comm, kUntouched);
  loomUniqueId garbage;
  std::memset(&garbage, 0x5a, sizeof(garbage));
  EXPECT_EQ(loomCommInitRank(&comm, 1, garbage, 0), loomInvalidArgument);
  EXPECT_TRUE(contains(loomGetLastError(nullptr), "unique id")) << loomGetLastError(nullptr);
  EXPECT_EQ(comm, kUntouched);
  EXPECT_EQ(loomGetUniqueId(nullptr), loomInvalidArgument);
  // The id is still good for a real communicator of one rank.
  ASSERT_EQ(loomCommInitRank(&comm, 1, id, 0), loomSuccess) << loomGetLastError(nullptr);
  expectCommUsable(comm, 0, 1, "rejected inits");
  EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
}

// A finalized communicator refuses new calls as invalid usage.
TEST_P(ApiTest, FinalizedCommunicatorRefusesCalls) {
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      2,
      [&](loomComm_t comm, int rank) {
        expectCommUsable(comm, rank, 2, "nothing");
        EXPECT_EQ(loomCommFinalize(comm), loomSuccess);
        float x = 1.0f;
        EXPECT_EQ(loomAllReduce(&x, &x, 1, loomFloat32, loomSum, comm, nullptr), loomInvalidUsage);
        EXPECT_TRUE(contains(loomGetLastError(comm), "finalized")) << loomGetLastError(comm);
      },
      &config);
}

INSTANTIATE_TEST_SUITE_P(Transports, ApiTest, ::testing::ValuesIn(loomtest::dataTransports()),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
