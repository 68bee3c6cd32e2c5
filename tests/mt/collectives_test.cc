// Every collective x datatype x op x layout x count {0, 1, 7, 1000, 1M+3} at ranks 1 to 8 (1M+3 not at 6, 7), as
// threads of one process over shm; the same matrix at small counts over the loopback transport, over tcp, with two
// channels, forced LL and forced Simple, with the alternative algorithms, and with zero-copy buffers; host streams
// and barriers. By default (CI) 1M+3 runs at 1 to 4 ranks (70000 at 5 and 8), and the transports' variants and zero-copy
// buffers at 2, 3 and 4 ranks (each transport's own matrix still at 1 to 8); LOOM_TEST_FULL=1 runs them all
// (loomtest::fullMatrix).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "src/base/socket.h"
#include "src/core/comm.h"
#include "tests/common/matrix.h"
#include "tests/common/test_level.h"
#include "tests/mt/thread_ranks.h"
#include "transports/transport.h"

namespace {

using loomtest::Case;

// Runs all `cases` on one communicator of `nranks` threads; fails on the first wrong case. Returns how many
// direct (zero-copy) messages rank 0 sent.
uint64_t runMatrix(int nranks, const std::vector<size_t>& counts, loomtest::Memory memory = loomtest::Memory::kPlain) {
  std::vector<Case> cases = loomtest::matrix(nranks, counts);
  std::atomic<bool> failed{false};
  uint64_t direct = 0;
  loomtest::runRanks(nranks, [&](loomComm_t comm, int rank) {
    if (rank == 0) direct = 0;
    for (const Case& c : cases) {
      std::string error = loomtest::runCase(c, comm, rank, memory);
      if (rank == 0) direct = comm->directMessages;
      if (!error.empty()) {
        ADD_FAILURE() << error;
        failed = true;
      }
      // Ranks stop together: a rank that went on alone would wait for peers that gave up.
      int stop = failed ? 1 : 0, anyStop = 0;
      ASSERT_EQ(loomAllReduce(&stop, &anyStop, 1, loomInt32, loomMax, comm, nullptr), loomSuccess);
      if (anyStop) return;
    }
  });
  return direct;
}

class Collectives : public testing::TestWithParam<int> {};

// The rank counts at which the variants of a transport's matrix run: a pair, an odd count and a power of two with
// a tree of two levels, or all with LOOM_TEST_FULL=1. Eight ranks as threads of one process, each with a proxy
// thread, take five times as long as four on two cores: the transports' own matrices cover them.
bool variantsAt(int nranks) { return loomtest::fullMatrix() || nranks == 2 || nranks == 3 || nranks == 4; }

// The largest count at 6 and 7 ranks too would double the suite's time for little: 5 and 8 cover the shapes.
TEST_P(Collectives, FullMatrixOverShm) {
  int n = GetParam();
  if (n == 6 || n == 7) {
    runMatrix(n, {0, 1, 7, 1000});
  } else if (n <= 4 || loomtest::fullMatrix()) {
    runMatrix(n, {0, 1, 7, 1000, 1000003});
  } else {
    runMatrix(n, {0, 1, 7, 1000, 70000});
  }
}

TEST_P(Collectives, SmallCountsOverLoopback) {
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "loopback");
  runMatrix(GetParam(), {1, 7, 1000});
}

// Every rank a thread, every connection a TCP socket through the proxy threads: both protocols, two channels,
// messages of one slot and of many, striped over three sockets. The proxies send Simple messages from the
// callers' buffers (DirectDescriptors to the proxy), with LOOM_DIRECT=0 through the FIFO slots. Waiting callers
// move the messages themselves, or with LOOM_TCP_CALLER_PROGRESS=0 the proxy threads alone.
TEST_P(Collectives, MatrixOverTcp) {
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "tcp");
  uint64_t direct = runMatrix(GetParam(), {1, 7, 1000, 70000});
  if (GetParam() > 1) {
    EXPECT_GT(direct, 0u) << "no message left from the caller's buffer";
  }
  if (!variantsAt(GetParam())) return;
  {
    loomtest::ScopedEnv copies("LOOM_DIRECT", "0");
    EXPECT_EQ(runMatrix(GetParam(), {7, 70000}), 0u);
  }
  {
    loomtest::ScopedEnv proxyAlone("LOOM_TCP_CALLER_PROGRESS", "0");
    runMatrix(GetParam(), {7, 70000});
  }
  loomtest::ScopedEnv channels("LOOM_NCHANNELS", "2");
  loomtest::ScopedEnv sockets("LOOM_NSOCKS", "3");
  for (const char* proto : {"LL", "Simple"}) {
    loomtest::ScopedEnv force("LOOM_PROTO", proto);
    runMatrix(GetParam(), {7, 70000});
  }
}

// Over UCX (when libucp loads): UCX picks its wires (here shared memory and tcp); both protocols, two channels.
TEST_P(Collectives, MatrixOverUcx) {
  std::string why;
  if (!loom::transportAvailable("ucx", &why)) GTEST_SKIP() << "ucx: " << why;
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "ucx");
  runMatrix(GetParam(), {1, 7, 1000, 70000});
  if (!variantsAt(GetParam())) return;
  {
    // The put path, over UCX's tcp, where it is off by default (its RMA is emulated).
    loomtest::ScopedEnv puts("LOOM_UCX_PUT_EMULATED", "1");
    runMatrix(GetParam(), {70000});
  }
  loomtest::ScopedEnv channels("LOOM_NCHANNELS", "2");
  for (const char* proto : {"LL", "Simple"}) {
    loomtest::ScopedEnv force("LOOM_PROTO", proto);
    runMatrix(GetParam(), {7, 70000});
  }
}

// Over ib on the software verbs device: both protocols, two channels, messages of one slot and of many, striped
// over three queue pairs per connection. softib is slower per message than tcp here (each message is an RDMA
// write and a clear-to-send, each through its completion queue): the variants run where variantsAt says.
TEST_P(Collectives, MatrixOverIb) {
  loomtest::ScopedEnv provider("LOOM_IB_PROVIDER", "softib");
  std::string why;
  if (!loom::transportAvailable("ib", &why) && why == "not built into this library") GTEST_SKIP() << "ib: " << why;
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "ib");
  const int n = GetParam();
  runMatrix(n, {1, 7, 1000, 70000});
  if (n == 3) {
    // With tcp open beside it, each transport's handoff connections still reach its own handler.
    loomtest::ScopedEnv both("LOOM_TRANSPORTS", "ib,tcp");
    runMatrix(n, {7, 70000});
  }
  if (!variantsAt(n)) return;
  loomtest::ScopedEnv channels("LOOM_NCHANNELS", "2");
  loomtest::ScopedEnv qps("LOOM_IB_QPS_PER_CONNECTION", "3");
  for (const char* proto : {"LL", "Simple"}) {
    loomtest::ScopedEnv force("LOOM_PROTO", proto);
    runMatrix(n, {7, 70000});
  }
}

// The same over IPv6: the unique id's root and every rank listen on ::1, and the tcp sockets follow.
TEST(Collectives, TcpOverIpv6) {
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "tcp");
  loomtest::ScopedEnv family("LOOM_SOCKET_FAMILY", "AF_INET6");
  loomtest::ScopedEnv interface("LOOM_SOCKET_IFNAME", "lo");
  loom::SocketAddress address;
  if (loom::chooseListenAddress(&address) != loomSuccess) GTEST_SKIP() << "no IPv6 on loopback here";
  ASSERT_EQ(address.storage.ss_family, AF_INET6);
  runMatrix(3, {7, 70000});
}

TEST_P(Collectives, TwoChannelsForcedProtocols) {
  loomtest::ScopedEnv channels("LOOM_NCHANNELS", "2");
  for (const char* proto : {"LL", "Simple"}) {
    loomtest::ScopedEnv force("LOOM_PROTO", proto);
    runMatrix(GetParam(), {7, 5000});
  }
}

TEST_P(Collectives, EveryAlternativeAlgorithm) {
  // Every algorithm that is not some collective's default, forced with LOOM_ALGO: it applies where the collective
  // has such an algorithm and is ignored elsewhere.
  std::set<std::string> alternatives;
  for (int c = 0; c <= static_cast<int>(loom::Collective::kBarrier); ++c) {
    std::vector<std::string> names = loom::algorithmsFor(static_cast<loom::Collective>(c));
    if (!names.empty()) alternatives.insert(names.begin() + 1, names.end());
  }
  ASSERT_FALSE(alternatives.empty());
  for (const std::string& name : alternatives) {
    SCOPED_TRACE("LOOM_ALGO=" + name);
    loomtest::ScopedEnv algorithm("LOOM_ALGO", name.c_str());
    runMatrix(GetParam(), {7, 5000});
  }
}

TEST_P(Collectives, ZeroCopyFromRegisteredAndLoomMemory) {
  // Large enough for Simple messages; every collective, type and op with buffers peers read in place: what a
  // step forwards in place too (LOOM_DIRECT_FORWARD_BYTES=0), and through the slots (the default at this size).
  if (!variantsAt(GetParam())) GTEST_SKIP() << "runs at 2, 3 and 4 ranks (all with LOOM_TEST_FULL=1)";
  for (const char* forward : {"0", "16777216"}) {
    loomtest::ScopedEnv forwardBytes("LOOM_DIRECT_FORWARD_BYTES", forward);
    for (loomtest::Memory memory : {loomtest::Memory::kLoomAlloc, loomtest::Memory::kRegistered}) {
      uint64_t direct = runMatrix(GetParam(), {70000}, memory);
      if (GetParam() > 1) {
        EXPECT_GT(direct, 0u) << "no message went out as a direct read";
      }
    }
  }
  EXPECT_EQ(runMatrix(GetParam(), {20000}), 0u) << "plain memory must never be read in place";
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, testing::Range(1, 9),
                         [](const testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

// The torus algorithms on shapes given with LOOM_TORUS_DIMS: 3-D, and 2-D with the long side first.
TEST(Collectives, TorusShapesFromTheEnvironment) {
  loomtest::ScopedEnv algorithm("LOOM_ALGO", "torus");
  {
    loomtest::ScopedEnv dims("LOOM_TORUS_DIMS", "2x2x2");
    runMatrix(8, {7, 5000});
  }
  loomtest::ScopedEnv dims("LOOM_TORUS_DIMS", "3X2");
  runMatrix(6, {7, 5000});
}

// Bad shapes fail init with a message naming the variable and the problem.
// Each bad value of the variable fails a one-rank init with loomInvalidArgument and a message naming it.
void expectInitRefuses(const char* variable, std::initializer_list<const char*> values) {
  for (const char* bad : values) {
    loomtest::ScopedEnv setting(variable, bad);
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
    loomComm_t comm = nullptr;
    EXPECT_EQ(loomCommInitRank(&comm, 1, id, 0), loomInvalidArgument) << bad;
    EXPECT_NE(std::string(loomGetLastError(nullptr)).find(variable), std::string::npos)
        << bad << ": " << loomGetLastError(nullptr);
    if (comm != nullptr) loomCommDestroy(comm);
  }
}

TEST(Collectives, BadTorusDimsFailInit) {
  expectInitRefuses("LOOM_TORUS_DIMS", {"2x2", "3x", "x3", "0x1", "1x1x1x1x1", "two"});
}

// Chunks smaller than a slot, as the tuner may choose them, under every algorithm: LOOM_CHUNK_BYTES fixes them.
TEST(Collectives, SmallChunksUnderEveryAlgorithm) {
  std::set<std::string> names;
  for (int c = 0; c <= static_cast<int>(loom::Collective::kBarrier); ++c) {
    std::vector<std::string> some = loom::algorithmsFor(static_cast<loom::Collective>(c));
    names.insert(some.begin(), some.end());
  }
  loomtest::ScopedEnv simple("LOOM_PROTO", "Simple");
  loomtest::ScopedEnv chunk("LOOM_CHUNK_BYTES", "1024");
  for (const std::string& name : names) {
    SCOPED_TRACE("LOOM_ALGO=" + name);
    loomtest::ScopedEnv algorithm("LOOM_ALGO", name.c_str());
    runMatrix(5, {5000});
  }
}

// Settings as NCCL reads them: a malformed integer or a word a setting does not accept fails init, naming the
// variable; words in any case and out-of-range integers (clamped) do not.
TEST(Collectives, BadSettingsFailInit) {
  expectInitRefuses("LOOM_CHUNK_BYTES", {"5x", "lots"});
  expectInitRefuses("LOOM_FIFO_DEPTH", {"eight"});
  expectInitRefuses("LOOM_PROTO", {"fast", "LL128"});
  expectInitRefuses("LOOM_TRANSPORTS", {"carrier-pigeon", "shm,nvlink"});
  expectInitRefuses("LOOM_DEBUG", {"garbage"});
  expectInitRefuses("LOOM_DEBUG_SUBSYS", {"INIT,NOPE"});
}

TEST(Collectives, SettingsInAnyCaseAndClampedValuesInit) {
  const std::pair<const char*, const char*> accepted[] = {
      {"LOOM_PROTO", "simple"},  {"LOOM_TRANSPORTS", "SHM,Tcp"}, {"LOOM_DEBUG", "warn"},
      {"LOOM_NET", "TCP"},       {"LOOM_CHUNK_BYTES", "5"},      {"LOOM_FIFO_DEPTH", "0"},
      {"LOOM_NCHANNELS", "1000"}, {"LOOM_SIMPLE_SLOT_BYTES", "1"}};
  for (const auto& [variable, value] : accepted) {
    loomtest::ScopedEnv setting(variable, value);
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
    loomComm_t comm = nullptr;
    EXPECT_EQ(loomCommInitRank(&comm, 1, id, 0), loomSuccess) << variable << "=" << value << ": " << loomGetLastError(nullptr);
    if (comm != nullptr) loomCommDestroy(comm);
  }
}

TEST(Collectives, BadNetFailsInit) { expectInitRefuses("LOOM_NET", {"carrier-pigeon", "shm"}); }

// ib's port choice and the topology's record of it. softib shows two devices: without LOOM_IB_HCA rank r takes
// device r mod 2; LOOM_IB_HCA keeps one ("=softib1", or all but "^softib0"); a filter that keeps none, or a GID
// index past the table, fails init naming the variable. Every rank knows every rank's device (Topology::
// rankNicDevice); over tcp it is the interface of the rank's listener.
TEST(Collectives, IbPortChoiceIsRecordedInTheTopology) {
  loomtest::ScopedEnv provider("LOOM_IB_PROVIDER", "softib");
  std::string why;
  if (!loom::transportAvailable("ib", &why) && why == "not built into this library") GTEST_SKIP() << "ib: " << why;
  loomtest::ScopedEnv devices("LOOM_SOFTIB_DEVICES", "softib0,softib1");
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "ib");
  auto expectDevices = [](const char* hca, std::vector<std::string> expected) {
    loomtest::ScopedEnv filter("LOOM_IB_HCA", hca);
    const int nranks = static_cast<int>(expected.size());
    loomtest::runRanks(nranks, [&](loomComm_t comm, int rank) {
      for (int r = 0; r < nranks; ++r)
        EXPECT_EQ(comm->topology.rankNicDevice(r), expected[r]) << "LOOM_IB_HCA=" << hca << ", as rank " << rank;
      int value = rank + 1, sum = 0;
      EXPECT_EQ(loomAllReduce(&value, &sum, 1, loomInt32, loomSum, comm, nullptr), loomSuccess);
      EXPECT_EQ(sum, nranks * (nranks + 1) / 2);
    });
  };
  expectDevices("", {"softib0", "softib1", "softib0"});
  expectDevices("=softib1", {"softib1", "softib1"});
  expectDevices("^softib0", {"softib1", "softib1"});
  expectDevices("softib1:1", {"softib1", "softib1"});
  expectInitRefuses("LOOM_IB_HCA", {"mlx5", "softib0:2", "^softib"});
  expectInitRefuses("LOOM_IB_GID_INDEX", {"2", "-2"});
}

TEST(Collectives, TcpRecordsTheListenersInterface) {
  loomtest::ScopedEnv transport("LOOM_TRANSPORTS", "tcp");
  loomtest::ScopedEnv interface("LOOM_SOCKET_IFNAME", "lo");
  loomtest::runRanks(2, [&](loomComm_t comm, int) {
    EXPECT_EQ(comm->topology.rankNicDevice(0), "lo");
    EXPECT_EQ(comm->topology.rankNicDevice(1), "lo");
  });
}

TEST(Collectives, StreamsQueueInOrder) {
  loomtest::runRanks(4, [](loomComm_t comm, int rank) {
    loomStream_t stream = nullptr;
    ASSERT_EQ(loomStreamCreate(&stream), loomSuccess);
    std::vector<std::vector<float>> data(10, std::vector<float>(100000, float(rank + 1)));
    // Each call doubles the previous result's input: in-order execution gives 10 * sum(1..4) only if each
    // AllReduce ran after the one before it on the same buffer.
    for (auto& buffer : data)
      ASSERT_EQ(loomAllReduce(buffer.data(), buffer.data(), buffer.size(), loomFloat32, loomSum, comm, stream),
                loomSuccess);
    float total = 0;
    ASSERT_EQ(loomAllReduce(data[0].data(), data[0].data(), data[0].size(), loomFloat32, loomSum, comm, stream),
              loomSuccess);
    ASSERT_EQ(loomStreamSynchronize(stream), loomSuccess);
    total = data[0][99999];
    EXPECT_EQ(total, 40.0f);  // 10 after the first, 40 after the second AllReduce on data[0]
    EXPECT_EQ(data[9][0], 10.0f);
    EXPECT_EQ(loomStreamDestroy(stream), loomSuccess);
  });
}

TEST(Collectives, DeadlineBoundsWaitingNotWork) {
  // A call that keeps moving data runs past its timeout: the deadline restarts on progress. Small slots make
  // the call long without making any single wait long. The ranks allocate, then meet and connect before the
  // timed call, so that no rank waits on another's allocation.
  loomtest::ScopedEnv slots("LOOM_SIMPLE_SLOT_BYTES", "4096");
  const int kTimeoutMs = 1000, nranks = 4;
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  std::atomic<long> slowestMs{0};
  std::barrier allocated(nranks);
  loomtest::runRanks(
      nranks,
      [&](loomComm_t comm, int rank) {
        std::vector<float> data(size_t{128} << 20, float(rank));
        allocated.arrive_and_wait();
        float one = 1, ranks = 0;
        ASSERT_EQ(loomAllReduce(&one, &ranks, 1, loomFloat32, loomSum, comm, nullptr), loomSuccess);
        auto start = std::chrono::steady_clock::now();
        ASSERT_EQ(loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comm, nullptr),
                  loomSuccess)
            << loomGetLastError(comm);
        long ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        slowestMs = std::max(slowestMs.load(), ms);
        EXPECT_EQ(data.back(), 6.0f);
      },
      &config);
  if (slowestMs < kTimeoutMs)
    GTEST_SKIP() << "the call took " << slowestMs << " ms, under its " << kTimeoutMs << " ms timeout: nothing shown";
}

TEST(Collectives, OneThreadDrivesEveryRankThroughAGroup) {
  // NCCL's single-process, multi-device pattern: one thread owns all ranks. Non-blocking init lets it create
  // them; a group runs one AllReduce per rank together (alone, each would wait forever for the others).
  const int nranks = 3;
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess);
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<loomComm_t> comms(nranks, nullptr);
  for (int rank = 0; rank < nranks; ++rank) {
    loomResult_t result = loomCommInitRankConfig(&comms[rank], nranks, id, rank, &config);
    ASSERT_TRUE(result == loomSuccess || result == loomInProgress) << loomGetLastError(nullptr);
  }
  for (loomComm_t comm : comms) {
    loomResult_t state = loomInProgress;
    while (state == loomInProgress) ASSERT_EQ(loomCommGetAsyncError(comm, &state), loomSuccess);
    ASSERT_EQ(state, loomSuccess) << loomGetLastError(comm);
  }
  std::vector<std::vector<double>> data(nranks);
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  for (int rank = 0; rank < nranks; ++rank) {
    data[rank].assign(300000, rank + 1.0);
    ASSERT_EQ(loomAllReduce(data[rank].data(), data[rank].data(), data[rank].size(), loomFloat64, loomSum, comms[rank],
                            nullptr),
              loomSuccess);
  }
  ASSERT_EQ(loomGroupEnd(), loomSuccess);
  for (int rank = 0; rank < nranks; ++rank) {
    EXPECT_EQ(data[rank][0], 6.0);
    EXPECT_EQ(data[rank][299999], 6.0);
    EXPECT_EQ(loomCommDestroy(comms[rank]), loomSuccess);
  }
}

TEST(Collectives, BarrierAtEveryRankCount) {
  for (int n = 1; n <= 8; ++n) {
    std::atomic<int> entered{0};
    loomtest::runRanks(n, [&](loomComm_t comm, int) {
      for (int round = 1; round <= 5; ++round) {
        entered.fetch_add(1);
        ASSERT_EQ(loomBarrier(comm, nullptr), loomSuccess);
        // No rank may leave round k before all n entered it.
        EXPECT_GE(entered.load(), round * n);
        ASSERT_EQ(loomBarrier(comm, nullptr), loomSuccess);
      }
    });
  }
}

}  // namespace
