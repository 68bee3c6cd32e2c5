// mp suite: failures name their root cause (src/core/failure.h). Ranks started without a launcher, with
// torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), loop AllReduce calls; one rank, drawn at
// random, is killed (SIGKILL) or stopped (SIGSTOP) in the middle, at 4 and 8 ranks, over shm and over tcp. Every
// survivor's loomGetLastError must name that rank, its pid and host, and why: "killed by signal 9 (SIGKILL)" or
// "is stopped". And a rank that does not enter a collective is named by every rank that waited in it, with the
// call's sequence number ("AllReduce #3: rank 2 has not entered it; last seen in #2").
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "tests/common/children.h"

namespace {

using namespace loomtest;

constexpr double kHardBoundSeconds = 40;

std::string hostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// How a rank is named in every survivor's error: "rank 3 (pid 4242 on host node1)".
std::string named(int rank, pid_t pid) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + " on host " + hostName() + ")";
}

// The environment torchrun gives a rank, and the test's own settings; `timeoutMs` becomes LOOM_TIMEOUT_MS.
void setRankEnv(int rank, int nranks, int port, const std::string& shmDir, const char* transports, int timeoutMs) {
  clearLauncherEnv();
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(nranks).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port - 1).c_str(), 1);  // loom's root listens on MASTER_PORT + 1
  setenv("LOOM_SHM_DIR", shmDir.c_str(), 1);
  setenv("LOOM_TRANSPORTS", transports, 1);
  setenv("LOOM_TIMEOUT_MS", std::to_string(timeoutMs).c_str(), 1);
}

// A rank: joins from its environment and calls AllReduce on 256K floats until one fails; says "R" after the
// first, whose sum it checks, and then the error of the one that failed. Returns that call's result.
int allReduceUntilError(const ChildPipes& pipes, int rank, int nranks) {
  loomComm_t comm = nullptr;
  if (loomResult_t result = loomCommInitFromEnv(&comm); result != loomSuccess) {
    tell(pipes.toParent, std::string("init: ") + loomGetLastError(nullptr));
    return kInitFailed + result;
  }
  constexpr size_t kCount = size_t{256} << 10;
  std::vector<float> send(kCount, static_cast<float>(rank + 1)), recv(kCount, 0.0f);
  loomResult_t result;
  for (long call = 0;; ++call) {
    result = loomAllReduce(send.data(), recv.data(), kCount, loomFloat32, loomSum, comm, nullptr);
    if (result != loomSuccess) break;
    if (call == 0) {
      if (recv[kCount - 1] != nranks * (nranks + 1) / 2.0f) {
        tell(pipes.toParent, "first AllReduce gave a wrong sum");
        return kChildCheckFailed;
      }
      tell(pipes.toParent, "R");
    }
  }
  tell(pipes.toParent, loomGetLastError(comm));
  loomCommDestroy(comm);
  return result;
}

struct Case {
  int nranks;
  const char* transport;
  int signal;
};

std::string caseName(const testing::TestParamInfo<Case>& info) {
  return std::to_string(info.param.nranks) + "Ranks" + (std::string(info.param.transport) == "shm" ? "Shm" : "Tcp") +
         (info.param.signal == SIGKILL ? "Sigkill" : "Sigstop");
}

class RootCauseTest : public testing::TestWithParam<Case> {};

// A random rank is killed or stopped half a second into the loop. A stopped rank is found at the deadline
// (2 s): the survivors wait that long, then see its state on this machine. The victim is reaped (or killed and
// reaped, when stopped) only once every survivor has ended, so that a killed one's status can still be read.
TEST_P(RootCauseTest, EverySurvivorNamesTheRankAndWhy) {
  const Case c = GetParam();
  std::random_device device;
  const int victim = static_cast<int>(device() % static_cast<unsigned>(c.nranks));
  SCOPED_TRACE("victim: rank " + std::to_string(victim));
  const int port = freePort();
  ASSERT_GT(port, 1);
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  {
    Children children;
    for (int rank = 0; rank < c.nranks; ++rank) {
      ASSERT_TRUE(children.spawn([&, rank](const ChildPipes& pipes) {
        setRankEnv(rank, c.nranks, port, shm.path(), c.transport, 2000);
        return allReduceUntilError(pipes, rank, c.nranks);
      }));
    }
    ASSERT_TRUE(children.waitReady(kHardBoundSeconds)) << (children.waitAll(5), children.report());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    children.signal(victim, c.signal);
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds, victim)) << "survivors still running:" << children.report();
    if (c.signal == SIGSTOP) children.signal(victim, SIGKILL);
    ASSERT_TRUE(children.waitAll(kHardBoundSeconds));
    const std::string report = children.report();
    const std::string who = named(victim, children[victim].pid);
    const std::string why = c.signal == SIGKILL ? who + " was killed by signal 9 (SIGKILL)" : who + " is stopped";
    for (int rank = 0; rank < c.nranks; ++rank) {
      if (rank == victim) continue;
      const int status = children[rank].status;
      EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == loomRemoteError || WEXITSTATUS(status) == loomTimeout))
          << "rank " << rank << report;
      EXPECT_NE(children[rank].said.find(why), std::string::npos)
          << "rank " << rank << " does not say \"" << why << "\":" << report;
    }
  }
  EXPECT_TRUE(shm.entries().empty()) << joined(shm.entries());
}

INSTANTIATE_TEST_SUITE_P(Ranks, RootCauseTest,
                         testing::Values(Case{4, "shm", SIGKILL}, Case{4, "shm", SIGSTOP}, Case{4, "tcp", SIGKILL},
                                         Case{4, "tcp", SIGSTOP}, Case{8, "shm", SIGKILL}, Case{8, "shm", SIGSTOP},
                                         Case{8, "tcp", SIGKILL}, Case{8, "tcp", SIGSTOP}),
                         caseName);

// 4 ranks call AllReduce; rank 2 takes 3 s (the deadline is 1 s) before its third. Every other rank fails with
// its deadline or of the first that did, and names rank 2 with the call's number and where rank 2 was last:
// found at its own deadline, or learned from the first that found it.
TEST(LateRankTest, EveryWaitingRankNamesTheRankThatHasNotEnteredTheCall) {
  const int nranks = 4, late = 2;
  const int port = freePort();
  ASSERT_GT(port, 1);
  ShmDir shm;
  ASSERT_FALSE(shm.path().empty());
  Children children;
  for (int rank = 0; rank < nranks; ++rank) {
    ASSERT_TRUE(children.spawn([&, rank](const ChildPipes& pipes) {
      setRankEnv(rank, nranks, port, shm.path(), "shm", 1000);
      loomComm_t comm = nullptr;
      if (loomResult_t result = loomCommInitFromEnv(&comm); result != loomSuccess) {
        tell(pipes.toParent, std::string("init: ") + loomGetLastError(nullptr));
        return kInitFailed + result;
      }
      tell(pipes.toParent, "R");
      std::vector<float> send(1024, 1.0f), recv(1024);
      loomResult_t result = loomSuccess;
      for (int call = 1; call <= 3 && result == loomSuccess; ++call) {
        if (call == 3 && rank == late) std::this_thread::sleep_for(std::chrono::seconds(3));
        result = loomAllReduce(send.data(), recv.data(), send.size(), loomFloat32, loomSum, comm, nullptr);
      }
      if (result != loomSuccess) tell(pipes.toParent, loomGetLastError(comm));
      loomCommDestroy(comm);
      return static_cast<int>(result);
    }));
  }
  ASSERT_TRUE(children.waitReady(kHardBoundSeconds)) << (children.waitAll(5), children.report());
  ASSERT_TRUE(children.waitAll(kHardBoundSeconds)) << children.report();
  const std::string report = children.report();
  const std::string lateText = named(late, children[late].pid) + " has not entered AllReduce #3; last seen in #2";
  const std::string foundText = "AllReduce #3: " + named(late, children[late].pid) + " has not entered it; last seen in #2";
  for (int rank = 0; rank < nranks; ++rank) {
    // The late rank's call may even succeed: what its peers posted before they gave up is all it needs.
    if (rank == late) continue;
    const int status = children[rank].status;
    EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == loomRemoteError || WEXITSTATUS(status) == loomTimeout))
        << "rank " << rank << report;
    const std::string& said = children[rank].said;
    EXPECT_TRUE(said.find(lateText) != std::string::npos || said.find(foundText) != std::string::npos)
        << "rank " << rank << " names neither \"" << lateText << "\" nor \"" << foundText << "\":" << report;
  }
}

}  // namespace
