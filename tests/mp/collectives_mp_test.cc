// The collective matrix with ranks as processes: loomrun starts collective_check at 2, 4 and 8 ranks over shm,
// and with every algorithm that is not a default (forced with LOOM_ALGO) at every rank count from 1 to 8.
// Also checks that a finished job leaves no segment behind in /dev/shm.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "tests/common/test_level.h"
#include "transports/transport.h"

namespace {

std::set<std::string> loomSegments() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir))
      if (std::string(entry->d_name).rfind("loom-", 0) == 0) names.insert(entry->d_name);
    closedir(dir);
  }
  return names;
}

// Runs collective_check (or the program `programEnv` names) with `args` on `nranks` processes; expects success and
// no segment left behind. Returns what the job printed.
// `hostId`, when given, is a shell expression of $LOOM_RANK that sets each rank's LOOM_HOSTID.
std::string runCheck(int nranks, const std::string& args, const std::string& hostId = "",
                     const char* programEnv = "MP_CHECK") {
  const char* loomrun = std::getenv("LOOMRUN");
  const char* check = std::getenv(programEnv);
  if (!loomrun || !check) {
    ADD_FAILURE() << "LOOMRUN and " << programEnv << " must name the built programs";
    return "";
  }
  std::set<std::string> before = loomSegments();
  std::string program = std::string(check) + " " + args;
  if (!hostId.empty()) program = "sh -c 'LOOM_HOSTID=" + hostId + " exec " + program + "'";
  std::string command = std::string(loomrun) + " -n " + std::to_string(nranks) + " --timeout 900 " + program;
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return output;
  }
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, got);
  int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << output;
  std::set<std::string> after = loomSegments();
  for (const std::string& name : after) EXPECT_TRUE(before.count(name)) << "left behind: /dev/shm/" << name;
  return output;
}

// The number in the "N direct (zero-copy) messages sent" line that rank 0 logs at INFO when it is destroyed.
long directMessages(const std::string& output) {
  size_t at = output.find("INFO SHM rank 0: ");
  if (at == std::string::npos) return -1;
  return std::atol(output.c_str() + at + std::strlen("INFO SHM rank 0: "));
}

// The first number in the "N messages sent and M received over tcp" line that rank 0 logs at INFO (NET).
long tcpMessages(const std::string& output) {
  size_t at = output.find("INFO NET rank 0: ");
  if (at == std::string::npos) return -1;
  return std::atol(output.c_str() + at + std::strlen("INFO NET rank 0: "));
}

// In the same line: how many of the passes that moved messages ran on waiting callers (LOOM_TCP_CALLER_PROGRESS).
long callerPasses(const std::string& output) {
  size_t at = output.find("INFO NET rank 0: ");
  if (at == std::string::npos) return -1;
  std::string line = output.substr(at, output.find('\n', at) - at);
  const char* lead = " passes of the proxy and ";
  size_t count = line.find(lead);
  return count == std::string::npos ? -1 : std::atol(line.c_str() + count + std::strlen(lead));
}

class CollectivesMp : public testing::TestWithParam<int> {};

TEST_P(CollectivesMp, MatrixUnderLoomrun) { runCheck(GetParam(), ""); }

// Buffers from loomMemAlloc and registered buffers: peers in other processes read them with CMA.
TEST(CollectivesMpZeroCopy, LoomMemAllocAndRegistered) {
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "SHM", 1);
  EXPECT_GT(directMessages(runCheck(4, "7,70000 1000003 alloc")), 0);
  EXPECT_GT(directMessages(runCheck(3, "7,70000 1000003 registered")), 0);
  EXPECT_EQ(directMessages(runCheck(2, "70000 0 plain")), 0) << "plain memory is never read in place";
  setenv("LOOM_DEBUG", "WARN", 1);
}

// Processes connected by tcp only, at 3 and 4 ranks; the proxies send Simple messages from the callers' buffers.
// Waiting callers move messages themselves, or with LOOM_TCP_CALLER_PROGRESS=0 the proxy threads alone.
TEST(CollectivesMpTcp, MatrixUnderLoomrun) {
  setenv("LOOM_TRANSPORTS", "tcp", 1);
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "NET,SHM", 1);
  std::string output = runCheck(4, "7,70000 1000003 alloc");
  EXPECT_GT(tcpMessages(output), 0) << output;
  EXPECT_GT(directMessages(output), 0) << output;
  EXPECT_GT(callerPasses(output), 0) << "no waiting caller moved a message itself\n" << output;
  // The proxy threads alone.
  setenv("LOOM_TCP_CALLER_PROGRESS", "0", 1);
  output = runCheck(3, "7,5000 70000 plain");
  unsetenv("LOOM_TCP_CALLER_PROGRESS");
  EXPECT_GT(tcpMessages(output), 0) << output;
  EXPECT_EQ(callerPasses(output), 0) << output;
  setenv("LOOM_DEBUG", "WARN", 1);
  unsetenv("LOOM_DEBUG_SUBSYS");
  unsetenv("LOOM_TRANSPORTS");
}

// Every algorithm that is not some collective's default, forced with LOOM_ALGO (the environment loomrun passes
// on): it applies where the collective has it and is ignored elsewhere.
class AlternativeAlgorithmsMp : public testing::TestWithParam<int> {};

TEST_P(AlternativeAlgorithmsMp, MatrixUnderLoomrun) {
  const int n = GetParam();
  // 1, 2, 3 and 5 ranks in CI (every count threads take: tests/mt/collectives_test.cc).
  if (!loomtest::fullMatrix() && (n == 4 || n >= 6)) GTEST_SKIP() << "runs with LOOM_TEST_FULL=1";
  std::set<std::string> alternatives;
  for (int c = 0; c <= static_cast<int>(loom::Collective::kBarrier); ++c) {
    std::vector<std::string> names = loom::algorithmsFor(static_cast<loom::Collective>(c));
    if (!names.empty()) alternatives.insert(names.begin() + 1, names.end());
  }
  for (const std::string& name : alternatives) {
    SCOPED_TRACE("LOOM_ALGO=" + name);
    setenv("LOOM_ALGO", name.c_str(), 1);
    runCheck(GetParam(), "7,5000 70000 plain");
  }
  unsetenv("LOOM_ALGO");
}

// The hierarchical algorithms over hosts emulated with LOOM_HOSTID: 2 hosts of 2 ranks, 3 of 2, 2 hosts whose
// ranks interleave, and hosts of unequal size (one ring instead). Ranks on one emulated host talk over shm,
// across hosts over tcp.
TEST(HierarchicalMp, EmulatedHosts) {
  setenv("LOOM_ALGO", "hierarchical", 1);
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "INIT,NET", 1);
  std::string output = runCheck(4, "7,5000 70000 plain", "host$((LOOM_RANK / 2))");
  EXPECT_NE(output.find("ready on 2 host(s)"), std::string::npos);
  EXPECT_GT(tcpMessages(output), 0) << output;
  // Hosts of two ranks keep LOOM_SIMPLE_SLOT_BYTES; with one rank per host every connection is tcp, and the
  // communicator takes its 512 KiB slots (LOOM_TCP_SLOT_BYTES).
  EXPECT_NE(output.find("FIFO 8 x 131072 bytes"), std::string::npos) << output;
  output = runCheck(2, "7,5000 70000 plain", "host$LOOM_RANK");
  EXPECT_NE(output.find("ready on 2 host(s)"), std::string::npos) << output;
  EXPECT_NE(output.find("FIFO 8 x 524288 bytes"), std::string::npos) << output;
  EXPECT_NE(runCheck(6, "7,5000 70000 plain", "host$((LOOM_RANK / 2))").find("ready on 3 host(s)"), std::string::npos);
  // An AllReduce large enough to run as a pipeline of pieces (two per lane here, algorithms/grid.cc).
  runCheck(4, "7 1100001 plain", "host$((LOOM_RANK / 2))");
  EXPECT_NE(runCheck(6, "7,5000 70000 plain", "host$((LOOM_RANK % 2))").find("ready on 2 host(s)"), std::string::npos);
  EXPECT_NE(runCheck(5, "7,5000 70000 plain", "host$((LOOM_RANK / 2))").find("ready on 3 host(s)"), std::string::npos);
  // The same between hosts over ucx (LOOM_NET), where libucp loads.
  std::string why;
  if (loom::transportAvailable("ucx", &why)) {
    setenv("LOOM_NET", "ucx", 1);
    output = runCheck(4, "7,5000 70000 plain", "host$((LOOM_RANK / 2))");
    EXPECT_NE(output.find("over ucx"), std::string::npos) << output;
    unsetenv("LOOM_NET");
  }
  // And over ib on the software verbs device, where the library has ib.
  setenv("LOOM_IB_PROVIDER", "softib", 1);
  if (loom::transportAvailable("ib", &why) || why != "not built into this library") {
    setenv("LOOM_NET", "ib", 1);
    output = runCheck(4, "7,5000 70000 plain", "host$((LOOM_RANK / 2))");
    EXPECT_NE(output.find("received over ib"), std::string::npos) << output;
    unsetenv("LOOM_NET");
  }
  unsetenv("LOOM_IB_PROVIDER");
  setenv("LOOM_DEBUG", "WARN", 1);
  unsetenv("LOOM_DEBUG_SUBSYS");
  unsetenv("LOOM_ALGO");
}

// Expert dispatch and combine (loom_ep.h) with ranks as processes: the low-latency windows mapped between
// processes over shm, the pieces over tcp, and the normal mode's hierarchical hops over emulated hosts, whose
// low-latency puts cross hosts through the network proxy (tcp, and ucx and ib where the library has them).
TEST(EpMp, ShmTcpAndEmulatedHosts) {
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "COLL,NET", 1);
  auto ep = [](int nranks, const std::string& args, const std::string& hostId = "") {
    std::string output = runCheck(nranks, args, hostId, "MP_EP_CHECK");
    EXPECT_NE(output.find(", 0 failed on rank 0"), std::string::npos) << output;
    return output;
  };
  for (int nranks : {2, 4, 8}) {
    std::string output = ep(nranks, "both");
    EXPECT_NE(output.find(std::to_string(nranks - 1) + " peer window(s) directly and 0 through connections"),
              std::string::npos)
        << output;
  }
  setenv("LOOM_TRANSPORTS", "tcp", 1);
  EXPECT_NE(ep(3, "both 40").find("0 peer window(s) directly and 2 through connections"), std::string::npos);
  unsetenv("LOOM_TRANSPORTS");
  std::string output = ep(4, "both", "host$((LOOM_RANK / 2))");
  EXPECT_NE(output.find("normal mode (hierarchical)"), std::string::npos) << output;
  EXPECT_NE(output.find("1 peer window(s) directly and 2 through connections"), std::string::npos) << output;
  ep(6, "both 16 1 2", "host$((LOOM_RANK % 3))");
  ep(5, "both 16 2 3", "host$((LOOM_RANK / 2))");
  std::string why;
  if (loom::transportAvailable("ucx", &why)) {
    setenv("LOOM_NET", "ucx", 1);
    EXPECT_NE(ep(4, "both", "host$((LOOM_RANK / 2))").find("received over ucx"), std::string::npos);
    unsetenv("LOOM_NET");
  }
  setenv("LOOM_IB_PROVIDER", "softib", 1);
  if (loom::transportAvailable("ib", &why) || why != "not built into this library") {
    setenv("LOOM_NET", "ib", 1);
    EXPECT_NE(ep(4, "both", "host$((LOOM_RANK / 2))").find("received over ib"), std::string::npos);
    unsetenv("LOOM_NET");
  }
  unsetenv("LOOM_IB_PROVIDER");
  setenv("LOOM_DEBUG", "WARN", 1);
  unsetenv("LOOM_DEBUG_SUBSYS");
}

INSTANTIATE_TEST_SUITE_P(Ranks, AlternativeAlgorithmsMp, testing::Range(1, 9),
                         [](const testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesMp, testing::Values(2, 4, 8),
                         [](const testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
