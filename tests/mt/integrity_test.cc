// mt suite: LOOM_CHECKSUM over loopback (ranks as threads of one process, each writing its peers' FIFOs itself):
// exact results, and a bit flipped in transit (LOOM_FAULT_CORRUPT) fails a call on every rank (that call, or the
// next for a rank whose part had ended; the sender's own call, as it waits for its receiver's check), the rank that
// found it naming the link. The processes' view of the same, over shm, tcp, ucx and ib: tests/mp/integrity_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "loom/loom.h"
#include "src/base/integrity.h"
#include "src/core/comm.h"
#include "tests/common/matrix.h"
#include "tests/mt/thread_ranks.h"

namespace {

constexpr int kRanks = 4;

TEST(IntegrityLoopback, CollectivesAreExactUnderTheChecksum) {
  loomtest::ScopedEnv transports("LOOM_TRANSPORTS", "loopback"), checksum("LOOM_CHECKSUM", "1");
  for (const char* channels : {"1", "3"}) {
    loomtest::ScopedEnv nchannels("LOOM_NCHANNELS", channels);
    loomtest::runRanks(kRanks, [](loomComm_t comm, int rank) {
      for (size_t count : {size_t{1}, size_t{999}, size_t{1} << 20}) {
        std::vector<double> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = rank + 0.25 * static_cast<double>(i % 13);
        ASSERT_EQ(loomAllReduce(data.data(), data.data(), count, loomFloat64, loomSum, comm, nullptr), loomSuccess)
            << loomGetLastError(comm);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], 6 + kRanks * 0.25 * static_cast<double>(i % 13)) << i;
        std::vector<double> gathered(count * kRanks);
        ASSERT_EQ(loomAllGather(data.data(), gathered.data(), count, loomFloat64, comm, nullptr), loomSuccess);
        ASSERT_EQ(gathered[count * kRanks - 1], data[count - 1]);
      }
    });
  }
}

TEST(IntegrityLoopback, ABitFlippedInTransitFailsACallOnEveryRank) {
  loomtest::ScopedEnv transports("LOOM_TRANSPORTS", "loopback"), checksum("LOOM_CHECKSUM", "1"),
      fault("LOOM_FAULT_CORRUPT", "200:32030");
  loom::rearmCorruption();
  std::vector<int> failedAt(kRanks, 0);
  std::vector<std::string> errors(kRanks);
  loomtest::runRanks(kRanks, [&](loomComm_t comm, int rank) {
    std::vector<float> data(size_t{1} << 18, 1.0f);
    for (int call = 1; call <= 40; ++call) {
      std::fill(data.begin(), data.end(), 1.0f);
      if (loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comm, nullptr) != loomSuccess) {
        failedAt[rank] = call;
        errors[rank] = loomGetLastError(comm);
        return;
      }
      for (float value : data) ASSERT_EQ(value, kRanks) << "call " << call << " took a corrupted message";
    }
  });
  loomtest::ScopedEnv off("LOOM_FAULT_CORRUPT", "");
  loom::rearmCorruption();
  int finders = 0, failedCall = 0, sender = -1;
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::string lead = "AllReduce #" + std::to_string(failedAt[rank]) + ": a message from rank ";
    if (const size_t at = errors[rank].find(lead); at != std::string::npos) {
      failedCall = failedAt[rank];
      sender = std::atoi(errors[rank].c_str() + at + lead.size());
    }
  }
  ASSERT_GT(failedCall, 0);
  for (int rank = 0; rank < kRanks; ++rank)
    EXPECT_TRUE(failedAt[rank] == failedCall || (rank != sender && failedAt[rank] == failedCall + 1)) << rank;
  for (int rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + errors[rank]);
    EXPECT_GT(failedAt[rank], 1);
    if (errors[rank].find("to rank " + std::to_string(rank) + " on channel 0 failed its checksum (LOOM_CHECKSUM)") !=
        std::string::npos) {
      ++finders;
      EXPECT_NE(errors[rank].find("AllReduce #" + std::to_string(failedAt[rank]) + ": a message from rank "),
                std::string::npos);
    } else {
      EXPECT_NE(errors[rank].find("that failed its checksum"), std::string::npos);
    }
  }
  EXPECT_EQ(finders, 1);
}

// LOOM_CHECKSUM=2: the same flip in calls of 1 MiB (Simple), and one of the 3rd message in calls of 7 floats (LL),
// are caught and the messages sent again; every call on every rank ends exact. Over loopback the sending executor
// writes the message again; over tcp, 3 sockets a connection, the sending proxy sends it again.
void expectFlipsSentAgain(const char* transport) {
  loomtest::ScopedEnv transports("LOOM_TRANSPORTS", transport), checksum("LOOM_CHECKSUM", "2"),
      sockets("LOOM_NSOCKS", "3");
  const std::pair<const char*, size_t> cases[] = {{"200:32030", size_t{1} << 18}, {"3", 7}};
  for (const auto& [at, count] : cases) {
    SCOPED_TRACE(std::string("LOOM_FAULT_CORRUPT=") + at);
    loomtest::ScopedEnv fault("LOOM_FAULT_CORRUPT", at);
    loom::rearmCorruption();
    loomtest::runRanks(kRanks, [&, count = count](loomComm_t comm, int rank) {
      std::vector<float> data(count);
      for (int call = 1; call <= 40; ++call) {
        for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + static_cast<int>(i % 5));
        ASSERT_EQ(loomAllReduce(data.data(), data.data(), count, loomFloat32, loomSum, comm, nullptr), loomSuccess)
            << loomGetLastError(comm);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], 6 + kRanks * static_cast<float>(i % 5)) << call;
      }
    });
  }
  loomtest::ScopedEnv off("LOOM_FAULT_CORRUPT", "");
  loom::rearmCorruption();
}

TEST(IntegrityLoopback, UnderResendAFlippedMessageIsSentAgain) { expectFlipsSentAgain("loopback"); }
TEST(IntegrityTcp, UnderResendAFlippedMessageIsSentAgain) { expectFlipsSentAgain("tcp"); }

// Runs the matrix of `counts` on `nranks` threads with buffers of `memory`; returns the fewest direct (zero-copy)
// messages a rank sent.
uint64_t runExactMatrix(int nranks, const std::vector<size_t>& counts, loomtest::Memory memory) {
  const std::vector<loomtest::Case> cases = loomtest::matrix(nranks, counts);
  std::vector<uint64_t> direct(nranks, 0);
  loomtest::runRanks(nranks, [&](loomComm_t comm, int rank) {
    for (const loomtest::Case& c : cases) {
      const std::string error = loomtest::runCase(c, comm, rank, memory);
      ASSERT_TRUE(error.empty()) << error;
    }
    direct[rank] = comm->directMessages;
  });
  return *std::min_element(direct.begin(), direct.end());
}

// Zero-copy messages under the checksum (ranks as threads over shm, buffers from loomMemAlloc that peers read in
// place, what a step forwards in place too): every collective, type and op of the matrix exact, with messages
// whose payload is summed block by block as it is reduced or copied, on both sides.
TEST(IntegrityZeroCopy, CollectivesAreExactUnderTheChecksum) {
  loomtest::ScopedEnv checksum("LOOM_CHECKSUM", "1"), forward("LOOM_DIRECT_FORWARD_BYTES", "0");
  EXPECT_GT(runExactMatrix(3, {70000}, loomtest::Memory::kLoomAlloc), 0u);
}

// Over tcp the proxy sends a message from the caller's memory under the checksum too, the checksum after the
// descriptor following it on the wire, also where a message is cut over three sockets: every case exact.
TEST(IntegrityZeroCopy, TheTcpProxySendsFromTheCallersMemoryUnderTheChecksum) {
  loomtest::ScopedEnv transports("LOOM_TRANSPORTS", "tcp"), checksum("LOOM_CHECKSUM", "1"), sockets("LOOM_NSOCKS", "3");
  EXPECT_GT(runExactMatrix(3, {7, 70000}, loomtest::Memory::kPlain), 0u);
}

// Under LOOM_CHECKSUM=2 over tcp the proxies keep what they sent until the receiver checked it, zero-copy messages
// sent from the caller's memory included: every case of the matrix exact.
TEST(IntegrityTcp, CollectivesAreExactWhileTheProxiesKeepWhatTheySent) {
  loomtest::ScopedEnv transports("LOOM_TRANSPORTS", "tcp"), checksum("LOOM_CHECKSUM", "2"), sockets("LOOM_NSOCKS", "3");
  EXPECT_GT(runExactMatrix(3, {7, 70000}, loomtest::Memory::kPlain), 0u);
}

}  // namespace
