// mp suite: LOOM_CHECKSUM, the integrity of the data in flight (docs/RELIABILITY.md), every rank a forked process,
// over each host transport that runs here: shm, tcp, ucx and ib (softib, the software device).
// - Under LOOM_CHECKSUM the collectives give exact results, LL and Simple sizes, odd counts, several channels.
// - LOOM_FAULT_CORRUPT flips one bit of one message in transit: after the sender's checksum, where the message
//   lands (the sender's write into the receiver's FIFO for shm, the receiving proxy for the network transports).
//   With the checksum, the receiver's call fails naming the link (sender, receiver, channel, the call's number,
//   the byte offset), every other rank's call fails naming the rank that found it, and no rank ever accepts a wrong
//   result. Without it, the same flip is accepted silently: some rank ends a call with a wrong sum.
// - Under LOOM_CHECKSUM=2 the receiver asks for a message that failed its check again: over shm (the sender writes
//   the receiver's FIFO) and tcp (the proxies keep what they sent until the receiver checked it) one flip costs
//   nothing but the resend, every result exact, LL, Simple and zero-copy messages alike; a message flipped again
//   when it is sent again fails the call saying so; over ucx and ib, which do not resend, the call fails at once,
//   the error saying it was not sent again.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "tests/common/children.h"
#include "transports/transport.h"

namespace {

using namespace loomtest;

constexpr double kHardBoundSeconds = 60;
constexpr int kRanks = 4;
constexpr int kLoopCalls = 16;

struct Setup {
  const char* transport;  // LOOM_TRANSPORTS
  int checksum;           // LOOM_CHECKSUM: 0, 1, or 2 (and resend)
  int faultyRank;         // the rank whose process runs the fault hook (-1: none)
  const char* corruptAt;  // its LOOM_FAULT_CORRUPT
};

// A rank: the environment of `setup`, then init from the parent's id.
int join(const ChildPipes& pipes, int rank, const std::string& shmDir, const Setup& setup, loomComm_t* comm) {
  setenv("LOOM_SHM_DIR", shmDir.c_str(), 1);
  setenv("LOOM_TRANSPORTS", setup.transport, 1);
  setenv("LOOM_CHECKSUM", std::to_string(setup.checksum).c_str(), 1);
  if (rank == setup.faultyRank) setenv("LOOM_FAULT_CORRUPT", setup.corruptAt, 1);
  loomUniqueId id;
  if (!receiveId(pipes.fromParent, &id)) {
    tell(pipes.toParent, "no unique id from the parent");
    return kChildCheckFailed;
  }
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = 20000;
  if (loomResult_t result = loomCommInitRankConfig(comm, kRanks, id, rank, &config); result != loomSuccess) {
    tell(pipes.toParent, std::string("init: ") + loomGetLastError(nullptr));
    return kInitFailed + result;
  }
  return 0;
}

// Exact results under the checksum: AllReduce, AllGather, ReduceScatter, Broadcast and AllToAll of integers held in
// floats (sums exact), at LL and Simple sizes and odd counts. Says "R" when all held.
int collectivesHold(const ChildPipes& pipes, int rank, const std::string& shmDir, const Setup& setup) {
  loomComm_t comm = nullptr;
  if (int failed = join(pipes, rank, shmDir, setup, &comm); failed != 0) return failed;
  auto fail = [&](const std::string& what) {
    tell(pipes.toParent, what + ": " + loomGetLastError(comm));
    loomCommDestroy(comm);
    return kChildCheckFailed;
  };
  auto value = [](int r, size_t i) { return static_cast<float>((r + 1) * 3 + static_cast<int>(i % 101)); };
  for (size_t count : {size_t{1}, size_t{1000}, size_t{70001}, size_t{1} << 20}) {
    const std::string at = " of " + std::to_string(count);
    std::vector<float> send(count), recv(count, -1.0f);
    for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);
    if (loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr) != loomSuccess)
      return fail("AllReduce" + at);
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int r = 0; r < kRanks; ++r) sum += value(r, i);
      if (recv[i] != sum) return fail("AllReduce" + at + " wrong at " + std::to_string(i));
    }
    std::vector<float> gathered(count * kRanks, -1.0f);
    if (loomAllGather(send.data(), gathered.data(), count, loomFloat32, comm, nullptr) != loomSuccess)
      return fail("AllGather" + at);
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < count; ++i)
        if (gathered[r * count + i] != value(r, i)) return fail("AllGather" + at + " wrong");
    std::vector<float> blocks(count * kRanks), mine(count, -1.0f);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = value(rank, i);
    if (loomReduceScatter(blocks.data(), mine.data(), count, loomFloat32, loomSum, comm, nullptr) != loomSuccess)
      return fail("ReduceScatter" + at);
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int r = 0; r < kRanks; ++r) sum += value(r, rank * count + i);
      if (mine[i] != sum) return fail("ReduceScatter" + at + " wrong");
    }
    std::vector<float> cast(count);
    for (size_t i = 0; i < count; ++i) cast[i] = rank == 1 ? value(1, i) : -1.0f;
    if (loomBroadcast(cast.data(), cast.data(), count, loomFloat32, 1, comm, nullptr) != loomSuccess)
      return fail("Broadcast" + at);
    for (size_t i = 0; i < count; ++i)
      if (cast[i] != value(1, i)) return fail("Broadcast" + at + " wrong");
    std::vector<float> all(count * kRanks), got(count * kRanks, -1.0f);
    for (size_t i = 0; i < all.size(); ++i) all[i] = value(rank, i);
    if (loomAllToAll(all.data(), got.data(), count, loomFloat32, comm, nullptr) != loomSuccess)
      return fail("AllToAll" + at);
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < count; ++i)
        if (got[r * count + i] != value(r, rank * count + i)) return fail("AllToAll" + at + " wrong");
  }
  tell(pipes.toParent, "R");
  loomCommDestroy(comm);
  return 0;
}

// AllReduce calls of 256K floats (1 MiB), each result checked whole. Says "R" after the first, then "wrong #k" for
// a call whose result was wrong, and "failed #k: <error>" for the first that failed (which it returns).
int allReduceLoop(const ChildPipes& pipes, int rank, const std::string& shmDir, const Setup& setup) {
  loomComm_t comm = nullptr;
  if (int failed = join(pipes, rank, shmDir, setup, &comm); failed != 0) return failed;
  constexpr size_t kCount = size_t{256} << 10;
  std::vector<float> send(kCount), recv(kCount);
  for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
  loomResult_t result = loomSuccess;
  for (int call = 1; call <= kLoopCalls; ++call) {
    result = loomAllReduce(send.data(), recv.data(), kCount, loomFloat32, loomSum, comm, nullptr);
    if (result != loomSuccess) {
      tell(pipes.toParent, " failed #" + std::to_string(call) + ": " + loomGetLastError(comm));
      break;
    }
    bool right = true;
    for (size_t i = 0; i < kCount && right; ++i)
      right = recv[i] == static_cast<float>(kRanks * (kRanks + 1) / 2 + kRanks * static_cast<int>(i % 7));
    if (!right) tell(pipes.toParent, " wrong #" + std::to_string(call));
    if (call == 1) tell(pipes.toParent, "R");
  }
  loomCommDestroy(comm);
  return result;
}

// Broadcast calls from rank 0 of 1M floats in loomMemAlloc memory, which peers on the host read in place: the root's
// messages are zero-copy descriptors, their checksum after them. Says "R" after the first call, "wrong #k", and
// "failed #k: <error>" as allReduceLoop does.
int zeroCopyBroadcastLoop(const ChildPipes& pipes, int rank, const std::string& shmDir, const Setup& setup) {
  loomComm_t comm = nullptr;
  if (int failed = join(pipes, rank, shmDir, setup, &comm); failed != 0) return failed;
  constexpr size_t kCount = size_t{1} << 20;
  float *send = nullptr, *recv = nullptr;  // out of place: an input that overlaps an output is never read in place
  if (loomMemAlloc(reinterpret_cast<void**>(&send), kCount * sizeof(float)) != loomSuccess ||
      loomMemAlloc(reinterpret_cast<void**>(&recv), kCount * sizeof(float)) != loomSuccess) {
    tell(pipes.toParent, std::string("loomMemAlloc: ") + loomGetLastError(nullptr));
    return kChildCheckFailed;
  }
  loomResult_t result = loomSuccess;
  for (int call = 1; call <= kLoopCalls; ++call) {
    for (size_t i = 0; i < kCount; ++i) {
      send[i] = static_cast<float>(call + static_cast<int>(i % 5));
      recv[i] = -1;
    }
    result = loomBroadcast(send, recv, kCount, loomFloat32, 0, comm, nullptr);
    if (result != loomSuccess) {
      tell(pipes.toParent, " failed #" + std::to_string(call) + ": " + loomGetLastError(comm));
      break;
    }
    bool right = true;
    for (size_t i = 0; i < kCount && right; ++i) right = recv[i] == send[i];
    if (!right) tell(pipes.toParent, " wrong #" + std::to_string(call));
    if (call == 1) tell(pipes.toParent, "R");
  }
  loomMemFree(send);
  loomMemFree(recv);
  loomCommDestroy(comm);
  return result;
}

// Runs kRanks children of `body`; returns whether they started, leaving them reaped in `children`.
void runRanks(Children& children, const std::string& shmDir, const Setup& setup,
              int (*body)(const ChildPipes&, int, const std::string&, const Setup&)) {
  for (int r = 0; r < kRanks; ++r)
    ASSERT_TRUE(children.spawn([&, r](const ChildPipes& pipes) { return body(pipes, r, shmDir, setup); }))
        << "fork: " << strerror(errno);
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
  ASSERT_TRUE(children.sendToAll(&id, sizeof(id)));
  ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << "ranks still running:" << children.report();
}

// Whether `transport` runs here (ib on the software device, which the children inherit); *why when not.
bool available(const std::string& transport, std::string* why) {
  if (transport == "ib") setenv("LOOM_IB_PROVIDER", "softib", 1);
  return transport == "shm" || transport == "tcp" || loom::transportAvailable(transport, why);
}

class IntegrityTest : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    if (!available(GetParam(), &why)) GTEST_SKIP() << GetParam() << ": " << why;
  }
  void TearDown() override { unsetenv("LOOM_IB_PROVIDER"); }
};

TEST_P(IntegrityTest, CollectivesAreExactUnderTheChecksum) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  for (const char* channels : {"1", "3"}) {
    SCOPED_TRACE(std::string("LOOM_NCHANNELS=") + channels);
    setenv("LOOM_NCHANNELS", channels, 1);
    Children children;
    ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), true, -1, ""}, collectivesHold));
    const std::string report = children.report();
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(WIFEXITED(children[r].status) && WEXITSTATUS(children[r].status) == 0) << "rank " << r << report;
      EXPECT_EQ(children[r].said, "R") << "rank " << r << report;
    }
  }
  unsetenv("LOOM_NCHANNELS");
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

// Rank 1's process flips a bit of its 40th message in transit (a Simple slice of a call in the middle of the loop).
TEST_P(IntegrityTest, ABitFlippedInTransitFailsTheCallOnEveryRankNamingTheLink) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  Children children;
  ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), true, 1, "40:32030"}, allReduceLoop));
  const std::string report = children.report();
  // The rank that found it names the link; the others name that rank. No rank accepted a wrong sum.
  const std::regex found(
      "failed #([0-9]+): .*AllReduce #([0-9]+): a message from rank ([0-9]) to rank ([0-9]) on channel ([0-9]+) "
      "failed its checksum \\(LOOM_CHECKSUM\\): [0-9]+ bytes at byte offset [0-9]+ of the step's [0-9]+");
  int finders = 0, failedCall = 0, sender = -1;
  std::smatch match;
  for (int r = 0; r < kRanks; ++r) {
    const std::string& said = children[r].said;
    EXPECT_TRUE(WIFEXITED(children[r].status) && WEXITSTATUS(children[r].status) == loomRemoteError)
        << "rank " << r << report;
    EXPECT_EQ(said.find("wrong"), std::string::npos) << "rank " << r << " accepted a wrong result:" << report;
    if (std::regex_search(said, match, found)) {
      ++finders;
      EXPECT_EQ(std::stoi(match[4]), r) << report;  // the receiver is the rank that found it
      sender = std::stoi(match[3]);
      EXPECT_NE(sender, r) << report;
      failedCall = std::stoi(match[1]);
      EXPECT_EQ(std::stoi(match[2]), failedCall) << report;  // the communicator's own number of the call
    } else {
      EXPECT_NE(said.find("that failed its checksum (LOOM_CHECKSUM"), std::string::npos)
          << "rank " << r << " does not name the corrupted message:" << report;
    }
  }
  EXPECT_EQ(finders, 1) << report;
  EXPECT_GT(failedCall, 1) << report;
  // A rank still in the call fails it; one whose part had ended fails its next. Over shm the sender of the
  // corrupted message is still in it: a sender ends a call only once its receivers checked what it sent.
  const bool senderWaits = std::string(GetParam()) == "shm";
  for (int r = 0; r < kRanks; ++r) {
    const size_t at = children[r].said.find("failed #");
    ASSERT_NE(at, std::string::npos) << report;
    const int call = std::atoi(children[r].said.c_str() + at + 8);
    EXPECT_TRUE(call == failedCall || call == failedCall + 1) << "rank " << r << report;
    if (senderWaits && r == sender) {
      EXPECT_EQ(call, failedCall) << "the sender, rank " << r << report;
    }
  }
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

// The control: the same flip without the checksum is taken for data, and some rank ends a call with a wrong sum.
// The bit is a float's top exponent bit (bit 6 of byte 4003): a flip of a low mantissa bit could round away in the
// sums that follow.
TEST_P(IntegrityTest, WithoutTheChecksumTheSameFlipGoesUnseen) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  Children children;
  ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), false, 1, "40:32030"}, allReduceLoop));
  const std::string report = children.report();
  int wrong = 0;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(WIFEXITED(children[r].status) && WEXITSTATUS(children[r].status) == 0) << "rank " << r << report;
    if (children[r].said.find("wrong") != std::string::npos) ++wrong;
  }
  EXPECT_GE(wrong, 1) << "the fault hook flipped nothing:" << report;
}

// Every rank failed with loomRemoteError and took no wrong result; a rank whose error names a message from `sender`
// (-1: any rank) to itself (a finder) says `detail` too, the others name the failed checksum as the first failure.
// Returns how many ranks found it.
int expectFailedOnEveryRank(const Children& children, int sender, const std::string& detail) {
  const std::string report = children.report();
  int finders = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::string& said = children[r].said;
    EXPECT_TRUE(WIFEXITED(children[r].status) && WEXITSTATUS(children[r].status) == loomRemoteError)
        << "rank " << r << report;
    EXPECT_EQ(said.find("wrong"), std::string::npos) << "rank " << r << report;
    const std::regex link("a message from rank " + (sender < 0 ? std::string("[0-9]+") : std::to_string(sender)) +
                          " to rank " + std::to_string(r) + " ");
    if (std::regex_search(said, link)) {
      ++finders;
      EXPECT_NE(said.find(detail), std::string::npos) << report;
    } else {
      EXPECT_NE(said.find("that failed its checksum (LOOM_CHECKSUM"), std::string::npos) << "rank " << r << report;
    }
  }
  return finders;
}

// Zero-copy messages within a host (shm): rank 0, the root, flips a bit of its 40th message, a descriptor's carried
// checksum (its payload is the caller's buffer). The peer that reads it fails naming a zero-copy message; every
// rank fails; none accepts a wrong result.
TEST(IntegrityZeroCopy, AFlippedChecksumOfAZeroCopyMessageFailsTheCall) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  Children children;
  ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {"shm", true, 0, "40"}, zeroCopyBroadcastLoop));
  EXPECT_EQ(expectFailedOnEveryRank(children, 0, "(a zero-copy message;"), 1) << children.report();
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

// Whether every rank ended every call (exit 0) with exact results ("R" alone).
void expectAllExact(const Children& children) {
  const std::string report = children.report();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(WIFEXITED(children[r].status) && WEXITSTATUS(children[r].status) == 0) << "rank " << r << report;
    EXPECT_EQ(children[r].said, "R") << "rank " << r << report;
  }
}

// Whether LOOM_CHECKSUM=2 sends a message again over `transport`.
bool resendsOver(const std::string& transport) { return transport == "shm" || transport == "tcp"; }

// LOOM_CHECKSUM=2 and the flip of ABitFlippedInTransit...: over shm and tcp the message is sent again, and every
// call of every rank ends exact; also for an LL message (rank 1's 3rd, of the first AllReduce of one float), with
// the whole matrix of collectivesHold exact under the switch. ucx and ib fail the call instead, the receiver's
// error saying the message was not sent again.
TEST_P(IntegrityTest, UnderResendAFlippedMessageIsSentAgain) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  const bool resends = resendsOver(GetParam());
  {
    Children children;
    ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), 2, 1, "40:32030"}, allReduceLoop));
    if (resends) {
      expectAllExact(children);
    } else {
      const std::string report = children.report();
      int finders = 0;
      for (int r = 0; r < kRanks; ++r) {
        EXPECT_EQ(children[r].said.find("wrong"), std::string::npos) << "rank " << r << report;
        EXPECT_TRUE(WIFEXITED(children[r].status) && WEXITSTATUS(children[r].status) == loomRemoteError) << report;
        if (children[r].said.find("(not sent again: LOOM_CHECKSUM=2 resends only over shared memory and tcp") !=
            std::string::npos)
          ++finders;
      }
      EXPECT_EQ(finders, 1) << report;
    }
  }
  if (resends) {
    Children children;
    ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), 2, 1, "3"}, collectivesHold));
    expectAllExact(children);
  }
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

class IntegrityResend : public testing::TestWithParam<const char*> {};

// LOOM_CHECKSUM=2: rank 1 flips a bit of its 40th message and of every later one (over tcp, messages it receives),
// so the message is flipped again when it is sent again: the receiver fails the call saying so, every rank fails,
// none accepts a wrong sum.
TEST_P(IntegrityResend, AMessageFlippedAgainWhenSentAgainFailsTheCall) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  Children children;
  ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), 2, 1, "40+:32030"}, allReduceLoop));
  EXPECT_GE(expectFailedOnEveryRank(children, -1, ", and again when it was sent a second time"), 1)
      << children.report();
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

// LOOM_CHECKSUM=2, zero-copy messages. Over shm: the root's flipped descriptor checksum (as in
// AFlippedChecksumOfAZeroCopyMessage...) is sent again, and the peer reads the payload again. Over tcp: the root's
// proxy sends from the root's buffer, and the flip of a message rank 1's proxy takes off the network is sent again
// from that buffer, which the root's call keeps until its receivers checked it. Every Broadcast exact.
TEST_P(IntegrityResend, AFlippedZeroCopyMessageIsSentAgain) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  Children children;
  const bool tcp = std::string(GetParam()) == "tcp";
  ASSERT_NO_FATAL_FAILURE(runRanks(children, shm.path(), {GetParam(), 2, tcp ? 1 : 0, "40"}, zeroCopyBroadcastLoop));
  expectAllExact(children);
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

INSTANTIATE_TEST_SUITE_P(Transports, IntegrityTest, testing::Values("shm", "tcp", "ucx", "ib"),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });
INSTANTIATE_TEST_SUITE_P(Transports, IntegrityResend, testing::Values("shm", "tcp"),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
