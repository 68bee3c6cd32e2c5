// mp suite: rank failures, every rank a forked process. A rank killed with SIGKILL in the middle of large
// AllReduce calls, and a rank that exits right after init, must become loomRemoteError (or, at worst,
// loomTimeout) on every survivor: never a hang, and no shared-memory segment left behind. Also
// loomCommInitFromEnv with loomrun's variables and with torchrun's, which needs a process per rank because the
// environment is per process. The children and their pipes: tests/common/children.h.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "loom/loom_ep.h"
#include "tests/common/children.h"
#include "transports/transport.h"

namespace {

using namespace loomtest;

constexpr int kTimeoutMs = 10000;  // the communicators' deadline in the failure tests
constexpr double kHardBoundSeconds = 30;

// No child of this process is left, zombie or running.
void expectNoChildrenLeft(const char* test) {
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << test << ": a child process is left";
  EXPECT_EQ(errno, ECHILD) << test;
}

// What a rank of a failure test does once a call failed, instead of leaving: gets the communicator and the pipe to
// the parent, returns the child's exit code.
using AfterError = std::function<int(loomComm_t comm, int toParent)>;

// A rank of a failure test joins: the unique id from the parent, then init with a 10 s deadline and, with
// `transports`, only those (LOOM_TRANSPORTS). 0, or the child's exit code when it could not.
int joinFromParent(const ChildPipes& pipes, int rank, int nranks, const std::string& shmDir, const char* transports,
                   loomComm_t* comm) {
  setenv("LOOM_SHM_DIR", shmDir.c_str(), 1);
  if (transports != nullptr) setenv("LOOM_TRANSPORTS", transports, 1);
  loomUniqueId id;
  if (!receiveId(pipes.fromParent, &id)) {
    tell(pipes.toParent, "no unique id from the parent");
    return kChildCheckFailed;
  }
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  loomResult_t result = loomCommInitRankConfig(comm, nranks, id, rank, &config);
  if (result != loomSuccess) {
    tell(pipes.toParent, std::string("init: ") + loomGetLastError(nullptr));
    return kInitFailed + result;
  }
  return 0;
}

// A rank of a failure test: joins and calls AllReduce on 4M floats (16 MB, 16 FIFOs' worth) until one fails; says
// "R" after the first, whose result it checks. Returns the failing call's result, or what `afterError` returns.
int allReduceUntilError(const ChildPipes& pipes, int rank, int nranks, const std::string& shmDir,
                        const char* transports = nullptr, const AfterError& afterError = nullptr) {
  const int toParent = pipes.toParent;
  loomComm_t comm = nullptr;
  if (int failed = joinFromParent(pipes, rank, nranks, shmDir, transports, &comm); failed != 0) return failed;
  loomResult_t result;
  constexpr size_t kCount = size_t{4} << 20;
  std::vector<float> send(kCount, static_cast<float>(rank + 1)), recv(kCount, 0.0f);
  for (long call = 0;; ++call) {
    result = loomAllReduce(send.data(), recv.data(), kCount, loomFloat32, loomSum, comm, nullptr);
    if (result != loomSuccess) break;
    if (call == 0) {
      const float expected = nranks * (nranks + 1) / 2.0f;
      if (recv[0] != expected || recv[kCount - 1] != expected) {
        tell(toParent, "first AllReduce gave a wrong sum");
        return kChildCheckFailed;
      }
      tell(toParent, "R");
    }
  }
  tell(toParent, loomGetLastError(comm));
  if (afterError) result = static_cast<loomResult_t>(afterError(comm, toParent));
  loomCommDestroy(comm);
  return result;
}

// Forks `nranks` children running rank(pipes, r), then gives them a fresh unique id (whose root runs in this
// process) and waits until each has said it finished a first AllReduce.
void startRanks(Children& children, int nranks, const std::function<int(const ChildPipes&, int)>& rank) {
  for (int r = 0; r < nranks; ++r)
    ASSERT_TRUE(children.spawn([&, r](const ChildPipes& pipes) { return rank(pipes, r); }))
        << "fork: " << strerror(errno);
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
  ASSERT_TRUE(children.sendToAll(&id, sizeof(id)));
  ASSERT_TRUE(children.waitReady(kHardBoundSeconds))
      << "ranks did not all finish a first AllReduce:" << (children.waitAll(5), children.report());
}

// ---- A rank killed with SIGKILL in the middle of AllReduce calls ----

// 4 ranks loop 16 MB AllReduce calls; rank 2 is killed with SIGKILL about 1 s into the loop. Every survivor
// must end with loomRemoteError (the watch of peer processes, a neighbour's aborted FIFO, or a socket that
// closed) well within the 10 s deadline, or with loomTimeout; none may hang. No segment is left in the
// shared-memory directory. `transports`: LOOM_TRANSPORTS for the ranks (null: the default).
void sigkillMidAllReduce(const char* transports) {
  const int nranks = 4, victim = 2;
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
  {
    Children children;
    ASSERT_NO_FATAL_FAILURE(startRanks(children, nranks, [&](const ChildPipes& pipes, int rank) {
      return allReduceUntilError(pipes, rank, nranks, shm.path(), transports);
    }));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const Clock::time_point killedAt = Clock::now();
    children.signal(victim, SIGKILL);
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds))
        << "survivors still running " << kHardBoundSeconds << " s after rank " << victim
        << " was killed:" << children.report();
    const std::string report = children.report();
    EXPECT_TRUE(WIFSIGNALED(children[victim].status) && WTERMSIG(children[victim].status) == SIGKILL) << report;
    for (int rank = 0; rank < nranks; ++rank) {
      if (rank == victim) continue;
      const int status = children[rank].status;
      ASSERT_TRUE(WIFEXITED(status)) << "rank " << rank << report;
      const int code = WEXITSTATUS(status);
      EXPECT_TRUE(code == loomRemoteError || code == loomTimeout)
          << "rank " << rank << " after rank " << victim << " was killed mid-AllReduce:" << report;
      const double seconds = secondsBetween(killedAt, children[rank].endedAt);
      if (code == loomRemoteError) {
        EXPECT_LT(seconds, 5.0) << "rank " << rank << " took this long to see rank " << victim << " die:" << report;
      }
    }
  }
  EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << ":" << joined(shm.entries());
  expectNoChildrenLeft("SigkillInTheMiddleOfAllReduce");
}

TEST(FailureTest, SigkillInTheMiddleOfAllReduce) { sigkillMidAllReduce(nullptr); }

// ---- A rank killed in the middle of expert dispatch and combine (loom_ep.h) ----

// A rank of the EP failure test: loops dispatch and combine (64 tokens of 1024 floats, top-2 of 2 experts per rank,
// identity experts) until one fails; says "R" after the first pair. Returns the failing call's result.
int expertCallsUntilError(const ChildPipes& pipes, int rank, int nranks, const std::string& shmDir, loomEpMode_t mode) {
  const int toParent = pipes.toParent;
  loomComm_t comm = nullptr;
  if (int failed = joinFromParent(pipes, rank, nranks, shmDir, nullptr, &comm); failed != 0) return failed;
  loomResult_t result;
  constexpr int kTokens = 64, kHidden = 1024, kTopk = 2;
  loomEpConfig_t ep = LOOM_EP_CONFIG_INITIALIZER;
  ep.maxTokensPerRank = kTokens;
  ep.hidden = kHidden;
  ep.numExperts = 2 * nranks;
  ep.topk = kTopk;
  ep.datatype = loomFloat32;
  ep.mode = mode;
  loomEp_t object = nullptr;
  if ((result = loomEpCreate(comm, &ep, &object)) != loomSuccess) {
    tell(toParent, std::string("loomEpCreate: ") + loomGetLastError(comm));
    return kChildCheckFailed;
  }
  std::vector<float> x(kTokens * kHidden, 1.0f), out(x.size());
  std::vector<float> recv(static_cast<size_t>(2) * nranks * kTokens * kHidden);
  std::vector<int32_t> idx(kTokens * kTopk);
  std::vector<float> weights(idx.size(), 0.5f);
  for (int t = 0; t < kTokens; ++t) {
    idx[t * kTopk] = (t + rank) % ep.numExperts;
    idx[t * kTopk + 1] = (t + rank + 1 + t % 3) % ep.numExperts;
  }
  int counts[2];
  for (long call = 0;; ++call) {
    loomEpHandle_t handle = nullptr;
    result =
        loomEpDispatch(object, x.data(), kTokens, idx.data(), weights.data(), recv.data(), counts, &handle, nullptr);
    if (result == loomSuccess) result = loomEpCombine(object, recv.data(), handle, out.data(), nullptr);
    loomEpHandleFree(handle);
    if (result != loomSuccess) break;
    if (call == 0) {
      if (out[0] != 1.0f || out.back() != 1.0f) {
        tell(toParent, "the first combine gave a wrong sum");
        return kChildCheckFailed;
      }
      tell(toParent, "R");
    }
  }
  tell(toParent, loomGetLastError(comm));
  loomEpDestroy(object);
  loomCommDestroy(comm);
  return result;
}

// 4 ranks loop dispatch and combine; rank 2 is killed about 1 s in. Every survivor ends with loomRemoteError within
// 5 s of the kill (or loomTimeout), in both modes; none hangs, and nothing is left in the shared-memory directory.
TEST(FailureTest, SigkillInTheMiddleOfExpertDispatch) {
  for (loomEpMode_t mode : {loomEpLowLatency, loomEpNormal}) {
    SCOPED_TRACE(mode == loomEpLowLatency ? "low-latency" : "normal");
    const int nranks = 4, victim = 2;
    ShmDir shm;
    ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
    {
      Children children;
      ASSERT_NO_FATAL_FAILURE(startRanks(children, nranks, [&](const ChildPipes& pipes, int rank) {
        return expertCallsUntilError(pipes, rank, nranks, shm.path(), mode);
      }));
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const Clock::time_point killedAt = Clock::now();
      children.signal(victim, SIGKILL);
      ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << "survivors still running:" << children.report();
      const std::string report = children.report();
      for (int rank = 0; rank < nranks; ++rank) {
        if (rank == victim) continue;
        const int status = children[rank].status;
        ASSERT_TRUE(WIFEXITED(status)) << "rank " << rank << report;
        const int code = WEXITSTATUS(status);
        EXPECT_TRUE(code == loomRemoteError || code == loomTimeout) << "rank " << rank << report;
        if (code == loomRemoteError) {
          EXPECT_LT(secondsBetween(killedAt, children[rank].endedAt), 5.0) << "rank " << rank << report;
        }
      }
    }
    EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << ":" << joined(shm.entries());
  }
  expectNoChildrenLeft("SigkillInTheMiddleOfExpertDispatch");
}

// After rank 2 of 4 is killed mid-AllReduce and the survivors' calls fail, they shrink it away (with
// LOOM_SHRINK_ABORT, as a program that caught the error on one thread would) and run a correct AllReduce on the
// three that remain. Every survivor exits 0; nothing is left in the shared-memory directory.
TEST(FailureTest, SurvivorsShrinkAfterASigkillAndAllReduceCorrectly) {
  const int nranks = 4, victim = 2;
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
  auto shrinkAndCheck = [&](int rank) {
    return [rank, victim](loomComm_t comm, int toParent) {
      const int excluded[] = {victim};
      loomComm_t kept = nullptr;
      if (loomCommShrink(comm, excluded, 1, &kept, nullptr, LOOM_SHRINK_ABORT) != loomSuccess) {
        tell(toParent, std::string(" | shrink: ") + loomGetLastError(nullptr));
        return kChildCheckFailed;
      }
      int count = 0, newRank = -1;
      loomCommCount(kept, &count);
      loomCommUserRank(kept, &newRank);
      constexpr size_t kCount = size_t{1} << 20;
      std::vector<float> data(kCount, static_cast<float>(rank + 1));
      loomResult_t result = loomAllReduce(data.data(), data.data(), kCount, loomFloat32, loomSum, kept, nullptr);
      const float expected = 1 + 2 + 4;  // ranks 0, 1 and 3
      bool right = result == loomSuccess && count == 3 && newRank == (rank < victim ? rank : rank - 1) &&
                   data[0] == expected && data[kCount - 1] == expected;
      if (!right) tell(toParent, std::string(" | after the shrink: ") + loomGetLastError(kept));
      loomCommDestroy(kept);
      return right ? 0 : kChildCheckFailed;
    };
  };
  {
    Children children;
    ASSERT_NO_FATAL_FAILURE(startRanks(children, nranks, [&](const ChildPipes& pipes, int rank) {
      return allReduceUntilError(pipes, rank, nranks, shm.path(), nullptr, shrinkAndCheck(rank));
    }));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    children.signal(victim, SIGKILL);
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << "survivors still running:" << children.report();
    const std::string report = children.report();
    for (int rank = 0; rank < nranks; ++rank) {
      if (rank == victim) continue;
      EXPECT_TRUE(WIFEXITED(children[rank].status) && WEXITSTATUS(children[rank].status) == 0)
          << "rank " << rank << ":" << report;
    }
  }
  EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << ":" << joined(shm.entries());
  expectNoChildrenLeft("SurvivorsShrinkAfterASigkillAndAllReduceCorrectly");
}

// The same over tcp, with the watch of peer processes looking only once a minute: the survivors learn of the
// death from their sockets alone, as they would across hosts.
TEST(FailureTest, SigkillInTheMiddleOfAllReduceOverTcp) {
  setenv("LOOM_PEER_CHECK_MS", "60000", 1);  // children inherit it
  sigkillMidAllReduce("tcp");
  unsetenv("LOOM_PEER_CHECK_MS");
}

// Whether ib runs here on the software device (LOOM_IB_PROVIDER=softib, which the children inherit); *why when not.
bool softibReady(std::string* why) {
  setenv("LOOM_IB_PROVIDER", "softib", 1);
  return loom::transportAvailable("ib", why);
}

// The same over ib (the software device), the watch of peer processes again looking once a minute: the survivors
// learn of the death from the connections' control sockets, long before the queue pairs' retries would run out.
TEST(FailureTest, SigkillInTheMiddleOfAllReduceOverIb) {
  std::string why;
  if (!softibReady(&why)) GTEST_SKIP() << "ib: " << why;
  setenv("LOOM_PEER_CHECK_MS", "60000", 1);
  sigkillMidAllReduce("ib");
  unsetenv("LOOM_PEER_CHECK_MS");
  unsetenv("LOOM_IB_PROVIDER");
}

// A queue pair of rank 1 fails in the middle of AllReduce calls over ib, as one whose link died would (softib's
// qp_error fault, a few calls after the first): rank 1 returns loomRemoteError with the verbs status of the failed
// write, and every other rank loomRemoteError (rank 1 gave up, or its connection was lost) within the deadline.
TEST(FailureTest, QpErrorInTheMiddleOfAllReduceOverIb) {
  std::string why;
  if (!softibReady(&why)) GTEST_SKIP() << "ib: " << why;
  const int nranks = 4, faulty = 1;
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
  {
    Children children;
    ASSERT_NO_FATAL_FAILURE(startRanks(children, nranks, [&](const ChildPipes& pipes, int rank) {
      if (rank == faulty) setenv("LOOM_SOFTIB_FAULT", "qp_error:2000", 1);
      return allReduceUntilError(pipes, rank, nranks, shm.path(), "ib");
    }));
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds))
        << "ranks still running " << kHardBoundSeconds << " s into the loop:" << children.report();
    const std::string report = children.report();
    for (int rank = 0; rank < nranks; ++rank) {
      const int status = children[rank].status;
      ASSERT_TRUE(WIFEXITED(status)) << "rank " << rank << report;
      EXPECT_EQ(WEXITSTATUS(status), loomRemoteError) << "rank " << rank << report;
    }
    EXPECT_NE(children[faulty].said.find("transport retry counter exceeded"), std::string::npos) << report;
  }
  unsetenv("LOOM_IB_PROVIDER");
  EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << ":" << joined(shm.entries());
  expectNoChildrenLeft("QpErrorInTheMiddleOfAllReduceOverIb");
}

// Ranks that would use different transports (here LOOM_TRANSPORTS; without it, the automatic choice between
// hosts can differ from machine to machine) fail init at once with loomInvalidUsage naming LOOM_NET, instead of
// waiting for connections that never meet.
TEST(FailureTest, RanksDisagreeingOnTransportsFailInit) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
  {
    Children children;
    for (int rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(children.spawn([&, rank](const ChildPipes& pipes) {
        return allReduceUntilError(pipes, rank, 2, shm.path(), rank == 0 ? "shm,tcp" : "shm");
      })) << "fork: "
          << strerror(errno);
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
    ASSERT_TRUE(children.sendToAll(&id, sizeof(id)));
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << children.report();
    const std::string report = children.report();
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(WIFEXITED(children[rank].status)) << report;
      EXPECT_EQ(WEXITSTATUS(children[rank].status), kInitFailed + loomInvalidUsage) << "rank " << rank << report;
      EXPECT_NE(children[rank].said.find("LOOM_NET"), std::string::npos) << report;
    }
  }
  expectNoChildrenLeft("RanksDisagreeingOnTransportsFailInit");
}

// ---- A rank that leaves right after init ----

// Rank 3 joins, then _exits (status 0) 300 ms later, while ranks 0-2 are already in an AllReduce that needs it
// and may not have connected yet. No survivor may hang: each must end with loomRemoteError within 5 s (what the
// peer watch is for), well before the 10 s deadline.
void exitRightAfterInit() {
  const int nranks = 4, leaver = 3;
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
  {
    Children children;
    for (int rank = 0; rank < nranks; ++rank) {
      ASSERT_TRUE(children.spawn([&, rank](const ChildPipes& pipes) {
        if (rank != leaver) return allReduceUntilError(pipes, rank, nranks, shm.path());
        setenv("LOOM_SHM_DIR", shm.path().c_str(), 1);
        loomUniqueId id;
        if (!receiveId(pipes.fromParent, &id)) return kChildCheckFailed;
        loomConfig_t config = LOOM_CONFIG_INITIALIZER;
        config.timeoutMs = kTimeoutMs;
        loomComm_t comm = nullptr;
        loomResult_t result = loomCommInitRankConfig(&comm, nranks, id, rank, &config);
        if (result != loomSuccess) return kInitFailed + result;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        _exit(0);
      })) << "fork: "
          << strerror(errno);
    }
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
    ASSERT_TRUE(children.sendToAll(&id, sizeof(id)));
    const Clock::time_point start = Clock::now();
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds))
        << "ranks still running " << kHardBoundSeconds << " s after start:" << children.report();
    const std::string report = children.report();
    EXPECT_TRUE(WIFEXITED(children[leaver].status) && WEXITSTATUS(children[leaver].status) == 0) << report;
    for (int rank = 0; rank < nranks; ++rank) {
      if (rank == leaver) continue;
      const int status = children[rank].status;
      ASSERT_TRUE(WIFEXITED(status)) << "rank " << rank << report;
      const int code = WEXITSTATUS(status);
      const double seconds = secondsBetween(start, children[rank].endedAt);
      EXPECT_EQ(code, loomRemoteError) << "rank " << rank << " after rank " << leaver << " exited:" << report;
      EXPECT_LT(seconds, 5.0) << "rank " << rank << report;
    }
  }
  EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << ":" << joined(shm.entries());
  expectNoChildrenLeft("exitRightAfterInit");
}

// ---- A receiver stopped (SIGSTOP) after it made its segment ----

// Rank 1 posts a Recv from rank 0, which makes the segment rank 0 would attach to, and is stopped there. Rank 0
// never attaches (it waits for rank 1 instead, and times out): when it destroys its communicator, it removes the
// segment made for it, which the stopped receiver cannot. Resumed, rank 1 finds rank 0 gone and fails on its own.
TEST(FailureTest, AStoppedReceiverLeavesNoSegment) {
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty()) << "mkdtemp in /dev/shm: " << strerror(errno);
  constexpr int kShortTimeoutMs = 1000;
  {
    Children children;
    for (int r = 0; r < 2; ++r)
      ASSERT_TRUE(children.spawn([&, r](const ChildPipes& pipes) {
        setenv("LOOM_SHM_DIR", shm.path().c_str(), 1);
        setenv("LOOM_TRANSPORTS", "shm", 1);
        loomUniqueId id;
        if (!receiveId(pipes.fromParent, &id)) return kChildCheckFailed;
        loomConfig_t config = LOOM_CONFIG_INITIALIZER;
        config.timeoutMs = r == 0 ? kShortTimeoutMs : kTimeoutMs;
        loomComm_t comm = nullptr;
        if (loomCommInitRankConfig(&comm, 2, id, r, &config) != loomSuccess) {
          tell(pipes.toParent, std::string("init: ") + loomGetLastError(nullptr));
          return kInitFailed;
        }
        tell(pipes.toParent, "R");
        std::vector<float> buffer(1000);
        if (r == 0) {
          char go = 0;  // once rank 1 is stopped
          if (read(pipes.fromParent, &go, 1) != 1) return kChildCheckFailed;
        }
        loomResult_t result = loomRecv(buffer.data(), buffer.size(), loomFloat32, 1 - r, comm, nullptr);
        tell(pipes.toParent, loomGetLastError(comm));
        loomCommDestroy(comm);
        return static_cast<int>(result);
      })) << "fork: "
          << strerror(errno);
    loomUniqueId id;
    ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
    ASSERT_TRUE(children.sendToAll(&id, sizeof(id)));
    ASSERT_TRUE(children.waitReady(kHardBoundSeconds)) << (children.waitAll(5), children.report());
    // Rank 1's segment for rank 0 (loom-<comm>-0-1-<channel>) appears once its Recv connects.
    const Clock::time_point start = Clock::now();
    auto segmentFor0 = [&] {
      for (const std::string& name : shm.entries())
        if (name.find("-0-1-") != std::string::npos) return true;
      return false;
    };
    while (!segmentFor0() && secondsBetween(start, Clock::now()) < kHardBoundSeconds)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(segmentFor0()) << "rank 1 made no segment for rank 0:" << joined(shm.entries());
    children.signal(1, SIGSTOP);
    const char go = 'g';
    ASSERT_EQ(write(children[0].toChild, &go, 1), 1);
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds, 1)) << "rank 0 did not end:" << children.report();
    EXPECT_TRUE(WIFEXITED(children[0].status) && WEXITSTATUS(children[0].status) == loomTimeout)
        << children.report();
    EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << " while rank 1 is stopped:"
                                       << joined(shm.entries());
    const Clock::time_point resumedAt = Clock::now();
    children.signal(1, SIGCONT);
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << "rank 1 did not end once resumed:" << children.report();
    EXPECT_TRUE(WIFEXITED(children[1].status) && WEXITSTATUS(children[1].status) == loomRemoteError)
        << children.report();
    EXPECT_LT(secondsBetween(resumedAt, children[1].endedAt), 5.0) << children.report();
  }
  EXPECT_TRUE(shm.entries().empty()) << "left in " << shm.path() << ":" << joined(shm.entries());
  expectNoChildrenLeft("AStoppedReceiverLeavesNoSegment");
}

// Every survivor sees loomRemoteError at once, including ranks still connecting: rank 2, whose ring successor is
// the rank that left, waits for a segment that will never be created, and that wait watches peer processes too.
TEST(FailureTest, RankExitsRightAfterInitEverySurvivorSeesRemoteError) { exitRightAfterInit(); }

// ---- loomCommInitFromEnv ----


// A child of the init-from-env tests: joins the world its environment describes, checks its size and rank, and
// checks an AllReduce. 0 when all is well.
int joinFromEnvAndAllReduce(const ChildPipes& pipes, int rank, int nranks) {
  const int toParent = pipes.toParent;
  loomComm_t comm = nullptr;
  loomResult_t result = loomCommInitFromEnv(&comm);
  if (result != loomSuccess) {
    tell(toParent, std::string("init: ") + loomGetLastError(nullptr));
    return kInitFailed + result;
  }
  int count = -1, userRank = -1;
  loomCommCount(comm, &count);
  loomCommUserRank(comm, &userRank);
  if (count != nranks || userRank != rank) {
    tell(toParent, "rank " + std::to_string(userRank) + " of " + std::to_string(count));
    return kChildCheckFailed;
  }
  std::vector<int32_t> send(100000, rank + 1), recv(100000, -1);
  result = loomAllReduce(send.data(), recv.data(), send.size(), loomInt32, loomSum, comm, nullptr);
  if (result != loomSuccess) {
    tell(toParent, std::string("AllReduce: ") + loomGetLastError(comm));
    return result;
  }
  for (int32_t value : recv) {
    if (value != nranks * (nranks + 1) / 2) {
      tell(toParent, "AllReduce gave " + std::to_string(value));
      return kChildCheckFailed;
    }
  }
  return loomCommDestroy(comm);
}

// Runs `nranks` children that set their environment with setEnv(rank), then join and AllReduce.
void runWorldFromEnv(const char* launcher, int nranks, const std::function<void(int rank)>& setEnv) {
  {
    Children children;
    for (int rank = 0; rank < nranks; ++rank) {
      ASSERT_TRUE(children.spawn([&, rank](const ChildPipes& pipes) {
        clearLauncherEnv();
        setEnv(rank);
        return joinFromEnvAndAllReduce(pipes, rank, nranks);
      })) << "fork: "
          << strerror(errno);
    }
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << launcher << " world did not finish:" << children.report();
    for (int rank = 0; rank < nranks; ++rank)
      EXPECT_TRUE(WIFEXITED(children[rank].status) && WEXITSTATUS(children[rank].status) == 0)
          << launcher << " variables, rank " << rank << " of " << nranks << ":" << children.report();
  }
  expectNoChildrenLeft(launcher);
}

TEST(InitFromEnvTest, LoomrunVariables) {
  const int port = freePort();
  ASSERT_GT(port, 0);
  const std::string root = "127.0.0.1:" + std::to_string(port);
  runWorldFromEnv("loomrun", 3, [&](int rank) {
    setenv("LOOM_RANK", std::to_string(rank).c_str(), 1);
    setenv("LOOM_NRANKS", "3", 1);
    setenv("LOOM_ROOT_ADDR", root.c_str(), 1);
    setenv("LOOM_SECRET", "00112233445566778899aabbccddeeff", 1);
  });
}

// torchrun's variables and no LOOM_SECRET: loom's root listens on MASTER_PORT + LOOM_PORT_OFFSET (default 1).
TEST(InitFromEnvTest, TorchrunVariables) {
  const int port = freePort();
  ASSERT_GT(port, 1);
  runWorldFromEnv("torchrun", 3, [&](int rank) {
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port - 1).c_str(), 1);
  });
}

// Open MPI's variables on one host: the root defaults to 127.0.0.1 with a port derived from the job's namespace.
TEST(InitFromEnvTest, OpenMpiVariablesOnOneHost) {
  const std::string job = "loomtest-" + std::to_string(getpid());
  runWorldFromEnv("Open MPI", 3, [&](int rank) {
    setenv("OMPI_COMM_WORLD_RANK", std::to_string(rank).c_str(), 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
    setenv("PMIX_NAMESPACE", job.c_str(), 1);
  });
}

// MPICH (Hydra) variables give rank and size but no root: LOOM_ROOT_ADDR names it.
TEST(InitFromEnvTest, MpichVariablesWithRootAddress) {
  const int port = freePort();
  ASSERT_GT(port, 0);
  const std::string root = "127.0.0.1:" + std::to_string(port);
  runWorldFromEnv("MPICH", 3, [&](int rank) {
    setenv("PMI_RANK", std::to_string(rank).c_str(), 1);
    setenv("PMI_SIZE", "3", 1);
    setenv("LOOM_ROOT_ADDR", root.c_str(), 1);
  });
}

// Slurm's variables: the root is the first node of the step ("localhost" here) at a port derived from the job.
TEST(InitFromEnvTest, SlurmVariables) {
  const std::string job = std::to_string(getpid());
  runWorldFromEnv("Slurm", 2, [&](int rank) {
    setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_STEP_NODELIST", "localhost", 1);
    setenv("SLURM_JOB_ID", job.c_str(), 1);
    setenv("SLURM_STEP_ID", "0", 1);
  });
}

// Environments loomCommInitFromEnv must refuse at once, each in a child (the environment is per process): no
// launcher at all, a rank outside the world, a malformed LOOM_SECRET, a NULL comm pointer.
TEST(InitFromEnvTest, BadEnvironmentsAreRefused) {
  struct Case {
    const char* name;
    std::vector<std::pair<const char*, const char*>> env;
    loomResult_t expected;
    const char* mentions;
  };
  const std::vector<Case> cases = {
      {"no launcher", {}, loomInvalidUsage, "no launcher"},
      {"LOOM_RANK 3 of 2",
       {{"LOOM_RANK", "3"}, {"LOOM_NRANKS", "2"}, {"LOOM_ROOT_ADDR", "127.0.0.1:1"}},
       loomInvalidUsage,
       "rank 3 of 2"},
      {"LOOM_SECRET of 6 characters",
       {{"LOOM_RANK", "1"}, {"LOOM_NRANKS", "2"}, {"LOOM_ROOT_ADDR", "127.0.0.1:1"}, {"LOOM_SECRET", "abcdef"}},
       loomInvalidArgument,
       "LOOM_SECRET"},
  };
  for (const Case& c : cases) {
    Children children;
    ASSERT_TRUE(children.spawn([&](const ChildPipes& pipes) {
      const int out = pipes.toParent;
      clearLauncherEnv();
      for (const auto& [name, value] : c.env) setenv(name, value, 1);
      loomComm_t comm = nullptr;
      loomResult_t result = loomCommInitFromEnv(&comm);
      tell(out, loomGetLastError(nullptr));
      if (result == c.expected && std::string(loomGetLastError(nullptr)).find(c.mentions) == std::string::npos)
        return kChildCheckFailed;
      if (result == loomSuccess) loomCommDestroy(comm);
      return result == loomSuccess ? kChildCheckFailed : static_cast<int>(result);
    }));
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << c.name << ":" << children.report();
    EXPECT_TRUE(WIFEXITED(children[0].status) && WEXITSTATUS(children[0].status) == c.expected)
        << c.name << ": expected " << loomGetErrorString(c.expected) << " mentioning \"" << c.mentions
        << "\":" << children.report();
  }
  EXPECT_EQ(loomCommInitFromEnv(nullptr), loomInvalidArgument);
  expectNoChildrenLeft("BadEnvironmentsAreRefused");
}

}  // namespace
