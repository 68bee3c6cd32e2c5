// mt suite: the public API's argument checks, every rank a thread of this process. Each bad call returns
// loomInvalidArgument or loomInvalidUsage with a message naming the problem, touches no buffer and leaves the
// communicator usable; count-0 calls are no-ops; the in-place and root-only layouts the API allows are accepted
// and give the right result. Cases run over shm, over loopback and over tcp.
// Not here: a bad call inside a group and the rest of the API's contract (groups, streams, deadlines, abort,
// split, init, memory), see tests/mt/api_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/loom.h"
#include "tests/mt/api_helpers.h"
#include "tests/mt/thread_ranks.h"

namespace {

using loomtest::ApiTest;
using loomtest::configWithTimeout;
using loomtest::contains;
using loomtest::expectCommUsable;
using loomtest::firstDifferent;
using loomtest::kSentinel;
using loomtest::kTestTimeoutMs;
using loomtest::runRanks;

// ---- Rejected calls ----

// One call that must be rejected. `who` limits it to the ranks where it is wrong: a NULL recvbuff is fine on a
// non-root of Reduce, so there the call would run and wait for its peers. Roots are nranks - 1 (not 0).
struct BadCall {
  using CallFn = std::function<loomResult_t(loomComm_t comm, int rank, int nranks, float* send, float* recv)>;
  using WhoFn = std::function<bool(int rank, int nranks)>;
  BadCall(std::string name, loomResult_t expected, std::vector<std::string> mentions, CallFn call, WhoFn who = {})
      : name(std::move(name)),
        expected(expected),
        mentions(std::move(mentions)),
        call(std::move(call)),
        who(std::move(who)) {}
  std::string name;
  loomResult_t expected;
  std::vector<std::string> mentions;  // parts the error message must contain
  CallFn call;
  WhoFn who;  // empty: every rank
};

constexpr size_t kN = 16;  // elements per rank of the bad calls

std::vector<BadCall> badCalls() {
  const size_t n = kN;
  const size_t huge = SIZE_MAX / 2;  // x 4 bytes of float overflows
  const loomDataType_t f32 = loomFloat32;
  const auto typeNum = static_cast<loomDataType_t>(loomNumTypes);
  const auto typeNeg = static_cast<loomDataType_t>(-1);
  const auto opNum = static_cast<loomRedOp_t>(loomNumOps);
  const auto opNeg = static_cast<loomRedOp_t>(-1);
  static int notAStream;
  loomStream_t fake = &notAStream;
  auto rootOnly = [](int rank, int nranks) { return rank == nranks - 1; };
  const loomResult_t kArg = loomInvalidArgument;
  using C = loomComm_t;
  static const size_t zeros[64] = {};
  // AllToAllv arguments: kN elements to and from every peer, packed.
  auto counts = [](int nranks) { return std::vector<size_t>(nranks, kN); };
  auto displs = [](int nranks) {
    std::vector<size_t> d(nranks);
    for (int p = 0; p < nranks; ++p) d[p] = p * kN;
    return d;
  };
  // clang-format off
  return {
      // NULL communicator.
      {"AllReduce NULL comm", kArg, {"AllReduce", "comm is NULL"},
       [=](C, int, int, float* s, float* r) { return loomAllReduce(s, r, n, f32, loomSum, nullptr, nullptr); }},
      {"Broadcast NULL comm", kArg, {"Broadcast", "comm is NULL"},
       [=](C, int, int, float* s, float* r) { return loomBroadcast(s, r, n, f32, 0, nullptr, nullptr); }},
      {"Send NULL comm", kArg, {"Send", "comm is NULL"},
       [=](C, int, int, float* s, float*) { return loomSend(s, n, f32, 0, nullptr, nullptr); }},
      {"Barrier NULL comm", kArg, {"Barrier", "comm is NULL"},
       [=](C, int, int, float*, float*) { return loomBarrier(nullptr, nullptr); }},
      // A stream that is not a loom stream.
      {"AllReduce foreign stream", kArg, {"AllReduce", "stream"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, n, f32, loomSum, c, fake); }},
      {"Barrier foreign stream", kArg, {"Barrier", "stream"},
       [=](C c, int, int, float*, float*) { return loomBarrier(c, fake); }},
      // AllReduce.
      {"AllReduce NULL sendbuff", kArg, {"AllReduce", "sendbuff is NULL"},
       [=](C c, int, int, float*, float* r) { return loomAllReduce(nullptr, r, n, f32, loomSum, c, nullptr); }},
      {"AllReduce NULL recvbuff", kArg, {"AllReduce", "recvbuff is NULL"},
       [=](C c, int, int, float* s, float*) { return loomAllReduce(s, nullptr, n, f32, loomSum, c, nullptr); }},
      {"AllReduce count SIZE_MAX/2 float", kArg, {"AllReduce", "overflows"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, huge, f32, loomSum, c, nullptr); }},
      {"AllReduce datatype loomNumTypes", kArg, {"AllReduce", "datatype"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, n, typeNum, loomSum, c, nullptr); }},
      {"AllReduce datatype -1", kArg, {"AllReduce", "datatype"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, n, typeNeg, loomSum, c, nullptr); }},
      {"AllReduce datatype -1 count 0", kArg, {"AllReduce", "datatype"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, 0, typeNeg, loomSum, c, nullptr); }},
      {"AllReduce op loomNumOps", kArg, {"AllReduce", "reduction op"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, n, f32, opNum, c, nullptr); }},
      {"AllReduce op -1", kArg, {"AllReduce", "reduction op"},
       [=](C c, int, int, float* s, float* r) { return loomAllReduce(s, r, n, f32, opNeg, c, nullptr); }},
      {"AllReduce recvbuff = sendbuff + 1", kArg, {"AllReduce", "overlap"},
       [=](C c, int, int, float* s, float*) { return loomAllReduce(s, s + 1, n, f32, loomSum, c, nullptr); }},
      {"AllReduce sendbuff = recvbuff + 1", kArg, {"AllReduce", "overlap"},
       [=](C c, int, int, float*, float* r) { return loomAllReduce(r + 1, r, n, f32, loomSum, c, nullptr); }},
      // Broadcast.
      {"Broadcast NULL sendbuff on root", kArg, {"Broadcast", "sendbuff (on root) is NULL"},
       [=](C c, int, int k, float*, float* r) { return loomBroadcast(nullptr, r, n, f32, k - 1, c, nullptr); },
       rootOnly},
      {"Broadcast NULL recvbuff", kArg, {"Broadcast", "recvbuff is NULL"},
       [=](C c, int, int k, float* s, float*) { return loomBroadcast(s, nullptr, n, f32, k - 1, c, nullptr); }},
      {"Broadcast root -1", kArg, {"Broadcast", "root -1"},
       [=](C c, int, int, float* s, float* r) { return loomBroadcast(s, r, n, f32, -1, c, nullptr); }},
      {"Broadcast root nranks", kArg, {"Broadcast", "root"},
       [=](C c, int, int k, float* s, float* r) { return loomBroadcast(s, r, n, f32, k, c, nullptr); }},
      {"Broadcast count SIZE_MAX/2 float", kArg, {"Broadcast", "overflows"},
       [=](C c, int, int k, float* s, float* r) { return loomBroadcast(s, r, huge, f32, k - 1, c, nullptr); }},
      {"Broadcast datatype loomNumTypes", kArg, {"Broadcast", "datatype"},
       [=](C c, int, int k, float* s, float* r) { return loomBroadcast(s, r, n, typeNum, k - 1, c, nullptr); }},
      {"Broadcast recvbuff = sendbuff + 1 on root", kArg, {"Broadcast", "overlap"},
       [=](C c, int, int k, float* s, float*) { return loomBroadcast(s, s + 1, n, f32, k - 1, c, nullptr); },
       rootOnly},
      // Reduce.
      {"Reduce NULL sendbuff", kArg, {"Reduce", "sendbuff is NULL"},
       [=](C c, int, int k, float*, float* r) { return loomReduce(nullptr, r, n, f32, loomSum, k - 1, c, nullptr); }},
      {"Reduce NULL recvbuff on root", kArg, {"Reduce", "recvbuff (on root) is NULL"},
       [=](C c, int, int k, float* s, float*) { return loomReduce(s, nullptr, n, f32, loomSum, k - 1, c, nullptr); },
       rootOnly},
      {"Reduce root -1", kArg, {"Reduce", "root -1"},
       [=](C c, int, int, float* s, float* r) { return loomReduce(s, r, n, f32, loomSum, -1, c, nullptr); }},
      {"Reduce root nranks", kArg, {"Reduce", "root"},
       [=](C c, int, int k, float* s, float* r) { return loomReduce(s, r, n, f32, loomSum, k, c, nullptr); }},
      {"Reduce op loomNumOps", kArg, {"Reduce", "reduction op"},
       [=](C c, int, int k, float* s, float* r) { return loomReduce(s, r, n, f32, opNum, k - 1, c, nullptr); }},
      {"Reduce datatype -1", kArg, {"Reduce", "datatype"},
       [=](C c, int, int k, float* s, float* r) { return loomReduce(s, r, n, typeNeg, loomSum, k - 1, c, nullptr); }},
      {"Reduce count SIZE_MAX/2 float", kArg, {"Reduce", "overflows"},
       [=](C c, int, int k, float* s, float* r) { return loomReduce(s, r, huge, f32, loomSum, k - 1, c, nullptr); }},
      {"Reduce recvbuff = sendbuff + 1 on root", kArg, {"Reduce", "overlap"},
       [=](C c, int, int k, float* s, float*) { return loomReduce(s, s + 1, n, f32, loomSum, k - 1, c, nullptr); },
       rootOnly},
      // AllGather.
      {"AllGather NULL sendbuff", kArg, {"AllGather", "sendbuff is NULL"},
       [=](C c, int, int, float*, float* r) { return loomAllGather(nullptr, r, n, f32, c, nullptr); }},
      {"AllGather NULL recvbuff", kArg, {"AllGather", "recvbuff is NULL"},
       [=](C c, int, int, float* s, float*) { return loomAllGather(s, nullptr, n, f32, c, nullptr); }},
      {"AllGather sendcount SIZE_MAX/2 float", kArg, {"AllGather", "overflows"},
       [=](C c, int, int, float* s, float* r) { return loomAllGather(s, r, huge, f32, c, nullptr); }},
      {"AllGather sendcount*nranks overflows (int8)", kArg, {"AllGather", "overflows"},
       [=](C c, int, int, float* s, float* r) { return loomAllGather(s, r, SIZE_MAX / 2, loomInt8, c, nullptr); }},
      {"AllGather datatype loomNumTypes", kArg, {"AllGather", "datatype"},
       [=](C c, int, int, float* s, float* r) { return loomAllGather(s, r, n, typeNum, c, nullptr); }},
      {"AllGather sendbuff = recvbuff + rank*count + 1", kArg, {"AllGather", "overlap"},
       [=](C c, int rank, int, float*, float* r) { return loomAllGather(r + rank * n + 1, r, n, f32, c, nullptr); }},
      {"AllGather sendbuff = recvbuff + (rank+1)*count wrapped", kArg, {"AllGather", "overlap"},
       [=](C c, int rank, int k, float*, float* r) {
         return loomAllGather(r + ((rank + 1) % k) * n, r, n, f32, c, nullptr);
       }},
      // ReduceScatter.
      {"ReduceScatter NULL sendbuff", kArg, {"ReduceScatter", "sendbuff is NULL"},
       [=](C c, int, int, float*, float* r) { return loomReduceScatter(nullptr, r, n, f32, loomSum, c, nullptr); }},
      {"ReduceScatter NULL recvbuff", kArg, {"ReduceScatter", "recvbuff is NULL"},
       [=](C c, int, int, float* s, float*) { return loomReduceScatter(s, nullptr, n, f32, loomSum, c, nullptr); }},
      {"ReduceScatter recvcount SIZE_MAX/2 float", kArg, {"ReduceScatter", "overflows"},
       [=](C c, int, int, float* s, float* r) { return loomReduceScatter(s, r, huge, f32, loomSum, c, nullptr); }},
      {"ReduceScatter op -1", kArg, {"ReduceScatter", "reduction op"},
       [=](C c, int, int, float* s, float* r) { return loomReduceScatter(s, r, n, f32, opNeg, c, nullptr); }},
      {"ReduceScatter recvbuff = sendbuff + rank*count + 1", kArg, {"ReduceScatter", "overlap"},
       [=](C c, int rank, int, float* s, float*) {
         return loomReduceScatter(s, s + rank * n + 1, n, f32, loomSum, c, nullptr);
       }},
      {"ReduceScatter recvbuff = sendbuff", kArg, {"ReduceScatter", "overlap"},
       [=](C c, int, int, float* s, float*) { return loomReduceScatter(s, s, n, f32, loomSum, c, nullptr); },
       [](int rank, int) { return rank != 0; }},
      // AllToAll.
      {"AllToAll NULL sendbuff", kArg, {"AllToAll", "sendbuff is NULL"},
       [=](C c, int, int, float*, float* r) { return loomAllToAll(nullptr, r, n, f32, c, nullptr); }},
      {"AllToAll NULL recvbuff", kArg, {"AllToAll", "recvbuff is NULL"},
       [=](C c, int, int, float* s, float*) { return loomAllToAll(s, nullptr, n, f32, c, nullptr); }},
      {"AllToAll count SIZE_MAX/2 float", kArg, {"AllToAll", "overflows"},
       [=](C c, int, int, float* s, float* r) { return loomAllToAll(s, r, huge, f32, c, nullptr); }},
      {"AllToAll sendbuff == recvbuff", kArg, {"AllToAll", "overlap"},
       [=](C c, int, int, float* s, float*) { return loomAllToAll(s, s, n, f32, c, nullptr); }},
      {"AllToAll recvbuff = sendbuff + 1", kArg, {"AllToAll", "overlap"},
       [=](C c, int, int, float* s, float*) { return loomAllToAll(s, s + 1, n, f32, c, nullptr); }},
      // AllToAllv.
      {"AllToAllv NULL sendcounts", kArg, {"AllToAllv", "must not be NULL"},
       [=](C c, int, int k, float* s, float* r) {
         auto d = displs(k), cnt = counts(k);
         return loomAllToAllv(s, nullptr, d.data(), r, cnt.data(), d.data(), f32, c, nullptr);
       }},
      {"AllToAllv NULL sdispls", kArg, {"AllToAllv", "must not be NULL"},
       [=](C c, int, int k, float* s, float* r) {
         auto d = displs(k), cnt = counts(k);
         return loomAllToAllv(s, cnt.data(), nullptr, r, cnt.data(), d.data(), f32, c, nullptr);
       }},
      {"AllToAllv NULL recvcounts", kArg, {"AllToAllv", "must not be NULL"},
       [=](C c, int, int k, float* s, float* r) {
         auto d = displs(k), cnt = counts(k);
         return loomAllToAllv(s, cnt.data(), d.data(), r, nullptr, d.data(), f32, c, nullptr);
       }},
      {"AllToAllv NULL rdispls", kArg, {"AllToAllv", "must not be NULL"},
       [=](C c, int, int k, float* s, float* r) {
         auto d = displs(k), cnt = counts(k);
         return loomAllToAllv(s, cnt.data(), d.data(), r, cnt.data(), nullptr, f32, c, nullptr);
       }},
      {"AllToAllv NULL sendbuff", kArg, {"AllToAllv", "sendbuff is NULL"},
       [=](C c, int, int k, float*, float* r) {
         auto d = displs(k), cnt = counts(k);
         return loomAllToAllv(nullptr, cnt.data(), d.data(), r, cnt.data(), d.data(), f32, c, nullptr);
       }},
      {"AllToAllv recvbuff = sendbuff + 1", kArg, {"AllToAllv", "overlap"},
       [=](C c, int, int k, float* s, float*) {
         auto d = displs(k), cnt = counts(k);
         return loomAllToAllv(s, cnt.data(), d.data(), s + 1, cnt.data(), d.data(), f32, c, nullptr);
       }},
      {"AllToAllv sdispls + sendcounts overflows", kArg, {"AllToAllv", "overflows"},
       [=](C c, int, int k, float* s, float* r) {
         auto d = displs(k), cnt = counts(k), bad = displs(k);
         bad[k - 1] = SIZE_MAX - 1;
         return loomAllToAllv(s, cnt.data(), bad.data(), r, cnt.data(), d.data(), f32, c, nullptr);
       }},
      {"AllToAllv self send and receive counts differ", kArg, {"AllToAllv", "itself"},
       [=](C c, int rank, int k, float* s, float* r) {
         auto d = displs(k), cnt = counts(k), fewer = counts(k);
         fewer[rank] = kN - 1;
         return loomAllToAllv(s, cnt.data(), d.data(), r, fewer.data(), d.data(), f32, c, nullptr);
       }},
      {"AllToAllv datatype loomNumTypes", kArg, {"AllToAllv", "datatype"},
       [=](C c, int, int, float* s, float* r) {
         return loomAllToAllv(s, zeros, zeros, r, zeros, zeros, typeNum, c, nullptr);
       }},
      // Gather.
      {"Gather NULL sendbuff", kArg, {"Gather", "sendbuff is NULL"},
       [=](C c, int, int k, float*, float* r) { return loomGather(nullptr, r, n, f32, k - 1, c, nullptr); }},
      {"Gather NULL recvbuff on root", kArg, {"Gather", "recvbuff (on root) is NULL"},
       [=](C c, int, int k, float* s, float*) { return loomGather(s, nullptr, n, f32, k - 1, c, nullptr); },
       rootOnly},
      {"Gather root -1", kArg, {"Gather", "root -1"},
       [=](C c, int, int, float* s, float* r) { return loomGather(s, r, n, f32, -1, c, nullptr); }},
      {"Gather root nranks", kArg, {"Gather", "root"},
       [=](C c, int, int k, float* s, float* r) { return loomGather(s, r, n, f32, k, c, nullptr); }},
      {"Gather sendcount SIZE_MAX/2 float", kArg, {"Gather", "overflows"},
       [=](C c, int, int k, float* s, float* r) { return loomGather(s, r, huge, f32, k - 1, c, nullptr); }},
      {"Gather sendbuff = recvbuff + 1 on root", kArg, {"Gather", "overlap"},
       [=](C c, int, int k, float*, float* r) { return loomGather(r + 1, r, n, f32, k - 1, c, nullptr); },
       rootOnly},
      // Scatter.
      {"Scatter NULL sendbuff on root", kArg, {"Scatter", "sendbuff (on root) is NULL"},
       [=](C c, int, int k, float*, float* r) { return loomScatter(nullptr, r, n, f32, k - 1, c, nullptr); },
       rootOnly},
      {"Scatter NULL recvbuff", kArg, {"Scatter", "recvbuff is NULL"},
       [=](C c, int, int k, float* s, float*) { return loomScatter(s, nullptr, n, f32, k - 1, c, nullptr); }},
      {"Scatter root -1", kArg, {"Scatter", "root -1"},
       [=](C c, int, int, float* s, float* r) { return loomScatter(s, r, n, f32, -1, c, nullptr); }},
      {"Scatter root nranks", kArg, {"Scatter", "root"},
       [=](C c, int, int k, float* s, float* r) { return loomScatter(s, r, n, f32, k, c, nullptr); }},
      {"Scatter datatype loomNumTypes", kArg, {"Scatter", "datatype"},
       [=](C c, int, int k, float* s, float* r) { return loomScatter(s, r, n, typeNum, k - 1, c, nullptr); }},
      {"Scatter recvbuff = sendbuff + 1 on root", kArg, {"Scatter", "overlap"},
       [=](C c, int, int k, float* s, float*) { return loomScatter(s, s + 1, n, f32, k - 1, c, nullptr); },
       rootOnly},
      // Send and Recv.
      {"Send NULL sendbuff", kArg, {"Send", "sendbuff is NULL"},
       [=](C c, int rank, int k, float*, float*) { return loomSend(nullptr, n, f32, (rank + 1) % k, c, nullptr); }},
      {"Send peer -1", kArg, {"Send", "peer -1"},
       [=](C c, int, int, float* s, float*) { return loomSend(s, n, f32, -1, c, nullptr); }},
      {"Send peer nranks", kArg, {"Send", "peer"},
       [=](C c, int, int k, float* s, float*) { return loomSend(s, n, f32, k, c, nullptr); }},
      {"Send datatype -1", kArg, {"Send", "datatype"},
       [=](C c, int rank, int k, float* s, float*) { return loomSend(s, n, typeNeg, (rank + 1) % k, c, nullptr); }},
      {"Send count SIZE_MAX/2 float", kArg, {"Send", "overflows"},
       [=](C c, int rank, int k, float* s, float*) { return loomSend(s, huge, f32, (rank + 1) % k, c, nullptr); }},
      {"Send to self outside a group", loomInvalidUsage, {"Send", "self", "group"},
       [=](C c, int rank, int, float* s, float*) { return loomSend(s, n, f32, rank, c, nullptr); }},
      {"Recv NULL recvbuff", kArg, {"Recv", "recvbuff is NULL"},
       [=](C c, int rank, int k, float*, float*) { return loomRecv(nullptr, n, f32, (rank + 1) % k, c, nullptr); }},
      {"Recv peer -1", kArg, {"Recv", "peer -1"},
       [=](C c, int, int, float*, float* r) { return loomRecv(r, n, f32, -1, c, nullptr); }},
      {"Recv peer nranks", kArg, {"Recv", "peer"},
       [=](C c, int, int k, float*, float* r) { return loomRecv(r, n, f32, k, c, nullptr); }},
      {"Recv foreign stream", kArg, {"Recv", "stream"},
       [=](C c, int rank, int k, float*, float* r) { return loomRecv(r, n, f32, (rank + 1) % k, c, fake); }},
      {"Recv from self outside a group", loomInvalidUsage, {"Recv", "self", "group"},
       [=](C c, int rank, int, float*, float* r) { return loomRecv(r, n, f32, rank, c, nullptr); }},
  };
  // clang-format on
}

// Each bad call on the ranks where it is wrong: the expected code, a message on the thread and on the
// communicator, both buffers untouched, no async error; then a valid exchange and AllReduce on every rank.
TEST_P(ApiTest, BadArgumentsAreRejectedAndChangeNothing) {
  const int nranks = 3;  // AllGather's sendcount*nranks overflow needs 3 ranks for int8
  const std::vector<BadCall> cases = badCalls();
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::vector<float> arena(8 * nranks * kN);
        float* send = arena.data();
        float* recv = arena.data() + 4 * nranks * kN;
        for (const BadCall& bad : cases) {
          std::string where =
              bad.name + " (" + GetParam() + ", rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ")";
          std::fill(arena.begin(), arena.end(), kSentinel);
          if (!bad.who || bad.who(rank, nranks)) {
            loomResult_t result = bad.call(comm, rank, nranks, send, recv);
            EXPECT_EQ(result, bad.expected) << where << ": " << loomGetLastError(comm);
            std::string threadMessage = loomGetLastError(nullptr);
            for (const std::string& part : bad.mentions)
              EXPECT_TRUE(contains(threadMessage, part))
                  << where << ": message \"" << threadMessage << "\" does not mention \"" << part << "\"";
            if (!contains(bad.name, "NULL comm")) {
              EXPECT_EQ(std::string(loomGetLastError(comm)), threadMessage) << where << ": comm's last error";
            }
          }
          long touched = firstDifferent(arena, kSentinel);
          EXPECT_EQ(touched, -1) << where << ": a rejected call wrote element " << touched;
          expectCommUsable(comm, rank, nranks, where);
          loomResult_t pending = loomInternalError;
          EXPECT_EQ(loomCommGetAsyncError(comm, &pending), loomSuccess);
          EXPECT_EQ(pending, loomSuccess) << where << ": a rejected call left an async error";
        }
      },
      &config);
}

// ---- Calls that must be accepted ----

// Zero-count calls succeed, with NULL buffers or with real ones, and touch nothing; AllToAllv with all counts 0
// likewise. Checks still come first: a count-0 call with a bad type is rejected (in BadArguments above).
TEST_P(ApiTest, ZeroCountCallsSucceedAndTouchNothing) {
  const int nranks = 3;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::vector<float> send(64, kSentinel), recv(64, kSentinel);
        const std::vector<size_t> zeros(nranks, 0);
        for (bool nullBuffers : {true, false}) {
          float* s = nullBuffers ? nullptr : send.data();
          float* r = nullBuffers ? nullptr : recv.data();
          std::string where =
              std::string(nullBuffers ? "NULL" : "real") + " buffers, " + GetParam() + ", rank " + std::to_string(rank);
          const int root = nranks - 1;
          EXPECT_EQ(loomAllReduce(s, r, 0, loomFloat32, loomSum, comm, nullptr), loomSuccess) << "AllReduce " << where;
          EXPECT_EQ(loomBroadcast(s, r, 0, loomFloat32, root, comm, nullptr), loomSuccess) << "Broadcast " << where;
          EXPECT_EQ(loomReduce(s, r, 0, loomFloat32, loomMax, root, comm, nullptr), loomSuccess) << "Reduce " << where;
          EXPECT_EQ(loomAllGather(s, r, 0, loomFloat32, comm, nullptr), loomSuccess) << "AllGather " << where;
          EXPECT_EQ(loomReduceScatter(s, r, 0, loomFloat32, loomSum, comm, nullptr), loomSuccess)
              << "ReduceScatter " << where;
          EXPECT_EQ(loomAllToAll(s, r, 0, loomFloat32, comm, nullptr), loomSuccess) << "AllToAll " << where;
          EXPECT_EQ(
              loomAllToAllv(s, zeros.data(), zeros.data(), r, zeros.data(), zeros.data(), loomFloat32, comm, nullptr),
              loomSuccess)
              << "AllToAllv " << where;
          EXPECT_EQ(loomGather(s, r, 0, loomFloat32, root, comm, nullptr), loomSuccess) << "Gather " << where;
          EXPECT_EQ(loomScatter(s, r, 0, loomFloat32, root, comm, nullptr), loomSuccess) << "Scatter " << where;
          // Matched zero-count Send/Recv pairs around the ring, in one group.
          EXPECT_EQ(loomGroupStart(), loomSuccess);
          EXPECT_EQ(loomSend(s, 0, loomFloat32, (rank + 1) % nranks, comm, nullptr), loomSuccess) << "Send " << where;
          EXPECT_EQ(loomRecv(r, 0, loomFloat32, (rank + nranks - 1) % nranks, comm, nullptr), loomSuccess)
              << "Recv " << where;
          EXPECT_EQ(loomGroupEnd(), loomSuccess)
              << "grouped Send/Recv of 0 " << where << ": " << loomGetLastError(comm);
          // Unmatched ones too: a count-0 Send waits for no receiver.
          EXPECT_EQ(loomSend(s, 0, loomFloat32, (rank + 1) % nranks, comm, nullptr), loomSuccess) << "Send " << where;
          EXPECT_EQ(loomRecv(r, 0, loomFloat32, (rank + 1) % nranks, comm, nullptr), loomSuccess) << "Recv " << where;
          EXPECT_EQ(firstDifferent(send, kSentinel), -1) << where;
          EXPECT_EQ(firstDifferent(recv, kSentinel), -1) << where;
        }
        // Nothing was left in the Send/Recv connections: a real exchange gets exactly its own message.
        int32_t out = 100 + rank, in = -1;
        ASSERT_EQ(loomGroupStart(), loomSuccess);
        EXPECT_EQ(loomSend(&out, 1, loomInt32, (rank + 1) % nranks, comm, nullptr), loomSuccess);
        EXPECT_EQ(loomRecv(&in, 1, loomInt32, (rank + nranks - 1) % nranks, comm, nullptr), loomSuccess);
        ASSERT_EQ(loomGroupEnd(), loomSuccess)
            << "exchange after count-0 Send/Recv, rank " << rank << ": " << loomGetLastError(comm);
        EXPECT_EQ(in, 100 + (rank + nranks - 1) % nranks) << "exchange after count-0 Send/Recv, rank " << rank;
        expectCommUsable(comm, rank, nranks, "count-0 calls");
      },
      &config);
}

// The layouts the checks must accept: in place exactly where the API says (AllReduce, Broadcast and Reduce at
// sendbuff == recvbuff, AllGather and Gather at recvbuff + rank*count, ReduceScatter and Scatter at
// sendbuff + rank*count), and NULL for a buffer a rank does not use (sendbuff off the root of Broadcast and
// Scatter, recvbuff off the root of Reduce and Gather). Each gives the right result.
TEST_P(ApiTest, InPlaceAndRootOnlyLayoutsAreAccepted) {
  const int nranks = 3, root = 1;
  constexpr size_t n = 1000;
  loomConfig_t config = configWithTimeout(kTestTimeoutMs);
  runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        const std::string where = std::string(" in place, rank ") + std::to_string(rank) + ", " + GetParam();
        const bool isRoot = rank == root;
        auto value = [](int r, size_t i) { return static_cast<int32_t>(r * 1000000 + i); };
        std::vector<int32_t> buffer(nranks * n);

        for (size_t i = 0; i < n; ++i) buffer[i] = value(rank, i);
        ASSERT_EQ(loomAllReduce(buffer.data(), buffer.data(), n, loomInt32, loomSum, comm, nullptr), loomSuccess)
            << "AllReduce" << where << ": " << loomGetLastError(comm);
        EXPECT_EQ(buffer[n - 1], value(0, n - 1) + value(1, n - 1) + value(2, n - 1)) << "AllReduce" << where;

        for (size_t i = 0; i < n; ++i) buffer[rank * n + i] = value(rank, i);
        ASSERT_EQ(loomAllGather(buffer.data() + rank * n, buffer.data(), n, loomInt32, comm, nullptr), loomSuccess)
            << "AllGather" << where << ": " << loomGetLastError(comm);
        for (int r = 0; r < nranks; ++r) EXPECT_EQ(buffer[r * n + 7], value(r, 7)) << "AllGather" << where;

        for (int r = 0; r < nranks; ++r)
          for (size_t i = 0; i < n; ++i) buffer[r * n + i] = value(rank, i) + r;
        ASSERT_EQ(loomReduceScatter(buffer.data(), buffer.data() + rank * n, n, loomInt32, loomSum, comm, nullptr),
                  loomSuccess)
            << "ReduceScatter" << where << ": " << loomGetLastError(comm);
        EXPECT_EQ(buffer[rank * n + 5], value(0, 5) + value(1, 5) + value(2, 5) + 3 * rank) << "ReduceScatter" << where;

        for (size_t i = 0; i < n; ++i) buffer[i] = isRoot ? value(root, i) : -1;
        ASSERT_EQ(loomBroadcast(isRoot ? buffer.data() : nullptr, buffer.data(), n, loomInt32, root, comm, nullptr),
                  loomSuccess)
            << "Broadcast (NULL sendbuff off the root)" << where << ": " << loomGetLastError(comm);
        EXPECT_EQ(buffer[n - 1], value(root, n - 1)) << "Broadcast" << where;

        for (size_t i = 0; i < n; ++i) buffer[i] = value(rank, i);
        ASSERT_EQ(
            loomReduce(buffer.data(), isRoot ? buffer.data() : nullptr, n, loomInt32, loomMax, root, comm, nullptr),
            loomSuccess)
            << "Reduce (NULL recvbuff off the root)" << where << ": " << loomGetLastError(comm);
        if (isRoot) {
          EXPECT_EQ(buffer[3], value(nranks - 1, 3)) << "Reduce" << where;
        }

        std::vector<int32_t> mine(n);
        for (size_t i = 0; i < n; ++i) buffer[rank * n + i] = mine[i] = value(rank, i);
        const int32_t* gatherSend = isRoot ? buffer.data() + root * n : mine.data();
        ASSERT_EQ(loomGather(gatherSend, isRoot ? buffer.data() : nullptr, n, loomInt32, root, comm, nullptr),
                  loomSuccess)
            << "Gather (NULL recvbuff off the root)" << where << ": " << loomGetLastError(comm);
        for (int r = 0; isRoot && r < nranks; ++r) EXPECT_EQ(buffer[r * n + 9], value(r, 9)) << "Gather" << where;

        for (int r = 0; r < nranks; ++r)
          for (size_t i = 0; i < n; ++i) buffer[r * n + i] = value(r, i) + 7;
        int32_t* scatterRecv = isRoot ? buffer.data() + root * n : mine.data();
        ASSERT_EQ(loomScatter(isRoot ? buffer.data() : nullptr, scatterRecv, n, loomInt32, root, comm, nullptr),
                  loomSuccess)
            << "Scatter (NULL sendbuff off the root)" << where << ": " << loomGetLastError(comm);
        EXPECT_EQ(scatterRecv[11], value(rank, 11) + 7) << "Scatter" << where;
      },
      &config);
}

INSTANTIATE_TEST_SUITE_P(Transports, ApiTest, ::testing::Values("shm", "loopback", "tcp"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
