// mp suite: running out of a resource. Each case gives its ranks (forked processes) a machine that lacks
// something: a full shared-memory directory, too few file descriptors, the root's port taken by someone else, a
// root no one answers at. Every rank must come back, within its deadline plus 2 s, with an error whose message
// names the resource (what to change), never hang; and nothing may be left in the shared-memory directory.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "tests/common/children.h"

namespace {

using namespace loomtest;

constexpr int kDeadlineMs = 3000;        // the ranks' LOOM_TIMEOUT_MS
constexpr double kBoundSeconds = 3 + 2;  // what a rank may take to fail: its deadline plus 2 s

// What a rank ended with, as it told the parent: "<code>|<seconds>|<message>".
struct Outcome {
  int code = -1;
  double seconds = 0;
  std::string message;
};

Outcome outcomeOf(const Children& children, size_t i) {
  Outcome outcome;
  const std::string& said = children[i].said;
  size_t bar = said.find('|'), second = said.find('|', bar + 1);
  if (bar == std::string::npos || second == std::string::npos) {
    outcome.message = "(nothing reported) " + said;
    return outcome;
  }
  outcome.code = std::stoi(said.substr(0, bar));
  outcome.seconds = std::stod(said.substr(bar + 1, second - bar - 1));
  outcome.message = said.substr(second + 1);
  return outcome;
}

// A rank: joins the world loomCommInitFromEnv describes and runs one 1 MB AllReduce; reports the first error (or
// success), how long it took from the start, and the message.
int joinAndAllReduce(const ChildPipes& pipes, int rank, int nranks, const std::string& rootAddress) {
  setenv("LOOM_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOOM_NRANKS", std::to_string(nranks).c_str(), 1);
  setenv("LOOM_ROOT_ADDR", rootAddress.c_str(), 1);
  setenv("LOOM_TIMEOUT_MS", std::to_string(kDeadlineMs).c_str(), 1);
  setenv("LOOM_DEBUG", "NONE", 1);
  const auto start = Clock::now();
  auto report = [&](loomResult_t result, const char* message) {
    tell(pipes.toParent, std::to_string(static_cast<int>(result)) + "|" +
                             std::to_string(secondsBetween(start, Clock::now())) + "|" + message);
    return static_cast<int>(result);
  };
  loomComm_t comm = nullptr;
  loomResult_t result = loomCommInitFromEnv(&comm);
  if (result != loomSuccess) return report(result, loomGetLastError(nullptr));
  std::vector<float> data(1 << 18, 1.0f);
  result = loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comm, nullptr);
  std::string message = result == loomSuccess ? "" : loomGetLastError(comm);
  loomCommDestroy(comm);
  return report(result, message.c_str());
}

// Runs `nranks` ranks with `setup(rank)` called first in each; returns each rank's outcome.
std::vector<Outcome> runRanks(int nranks, const std::string& rootAddress, const std::function<void(int)>& setup) {
  Children children;
  for (int rank = 0; rank < nranks; ++rank)
    EXPECT_TRUE(children.spawn([&, rank](const ChildPipes& pipes) {
      setup(rank);
      return joinAndAllReduce(pipes, rank, nranks, rootAddress);
    }));
  EXPECT_TRUE(children.waitAll(kBoundSeconds + 10)) << "ranks still running:" << children.report();
  std::vector<Outcome> outcomes;
  for (int rank = 0; rank < nranks; ++rank) outcomes.push_back(outcomeOf(children, rank));
  return outcomes;
}

std::string loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// LOOM_SHM_DIR on a 256 KiB tmpfs: the first segment cannot be reserved.
TEST(ResourceTest, SharedMemoryDirectoryFull) {
  char dir[] = "/tmp/loom-tiny-shm-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=256k") != 0) {
    rmdir(dir);
    GTEST_SKIP() << "mounting a small tmpfs needs root: " << strerror(errno);
  }
  int port = freePort();
  std::vector<Outcome> outcomes = runRanks(2, loopback(port), [&](int) {
    setenv("LOOM_SHM_DIR", dir, 1);
    setenv("LOOM_TRANSPORTS", "shm", 1);
  });
  bool named = false;
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const Outcome& outcome = outcomes[rank];
    EXPECT_NE(outcome.code, loomSuccess) << "rank " << rank;
    EXPECT_LT(outcome.seconds, kBoundSeconds) << "rank " << rank << ": " << outcome.message;
    named |= outcome.code == loomSystemError && contains(outcome.message, "No space left on device") &&
             contains(outcome.message, "LOOM_SHM_DIR");
  }
  EXPECT_TRUE(named) << "no rank named the full directory: " << outcomes[0].message << " / " << outcomes[1].message;
  std::vector<std::string> left;
  if (DIR* listing = opendir(dir)) {
    while (dirent* entry = readdir(listing))
      if (entry->d_name[0] != '.') left.push_back(entry->d_name);
    closedir(listing);
  }
  EXPECT_TRUE(left.empty()) << "left in " << dir << ":" << joined(left);
  umount(dir);
  rmdir(dir);
}

// A rank whose file descriptor limit is too low for its connections. Its message names the limit to raise, whether
// its own thread ran out or its bootstrap listener's (an accept that fails leaves a peer's connection unanswered,
// and the wait that then times out names the listener's failure). Here, at 16 descriptors the rank's own thread
// runs out first, at 10 its listener's.
TEST(ResourceTest, TooManyOpenFiles) {
  for (rlim_t descriptors : {16, 10}) {
    SCOPED_TRACE("ulimit -n " + std::to_string(descriptors));
    int port = freePort();
    std::vector<Outcome> outcomes = runRanks(4, loopback(port), [&](int rank) {
      setenv("LOOM_TRANSPORTS", "tcp", 1);
      if (rank == 2) {
        rlimit limit{descriptors, descriptors};
        setrlimit(RLIMIT_NOFILE, &limit);
      }
    });
    const Outcome& starved = outcomes[2];
    EXPECT_NE(starved.code, loomSuccess);
    EXPECT_TRUE(contains(starved.message, "Too many open files") && contains(starved.message, "ulimit -n"))
        << starved.message;
    for (size_t rank = 0; rank < outcomes.size(); ++rank) {
      EXPECT_NE(outcomes[rank].code, loomSuccess) << "rank " << rank;
      EXPECT_LT(outcomes[rank].seconds, kBoundSeconds) << "rank " << rank << ": " << outcomes[rank].message;
    }
  }
}

// The root's address is taken by another program, which accepts connections and never answers.
TEST(ResourceTest, RootPortInUse) {
  int squatter = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(squatter, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(squatter, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(squatter, 16), 0);
  ASSERT_EQ(getsockname(squatter, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string root = loopback(ntohs(address.sin_port));
  std::vector<Outcome> outcomes = runRanks(2, root, [](int) {});
  close(squatter);
  EXPECT_NE(outcomes[0].code, loomSuccess);
  EXPECT_TRUE(contains(outcomes[0].message, root) && contains(outcomes[0].message, "in use")) << outcomes[0].message;
  EXPECT_LT(outcomes[0].seconds, 2.0) << outcomes[0].message;
  EXPECT_NE(outcomes[1].code, loomSuccess);
  EXPECT_LT(outcomes[1].seconds, kBoundSeconds) << outcomes[1].message;
  EXPECT_TRUE(contains(outcomes[1].message, root)) << outcomes[1].message;
}

// Rank 1 of 2 alone, its root nowhere: a port nothing listens on, and an address nothing answers from.
TEST(ResourceTest, UnreachableRoot) {
  for (const std::string& root : {loopback(freePort()), std::string("192.0.2.1:29500")}) {
    Children children;
    ASSERT_TRUE(children.spawn([&](const ChildPipes& pipes) { return joinAndAllReduce(pipes, 1, 2, root); }));
    ASSERT_TRUE(children.waitAll(kBoundSeconds + 10)) << "still running:" << children.report();
    Outcome outcome = outcomeOf(children, 0);
    EXPECT_EQ(outcome.code, loomTimeout) << root << ": " << outcome.message;
    EXPECT_TRUE(contains(outcome.message, root)) << outcome.message;
    EXPECT_LT(outcome.seconds, kBoundSeconds) << outcome.message;
  }
}

}  // namespace
