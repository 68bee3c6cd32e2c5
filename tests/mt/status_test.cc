// The status report (src/core/status.h), in a process of its own so that its settings (read once per process)
// are this test's: 2 ranks as threads; rank 0 waits in an AllReduce that rank 1 has not called yet. The report
// names each communicator's calls, the call running, how long it has waited and for which peer; SIGUSR1 and a
// touched LOOM_STATUS_FILE each put it in the log.
#include "src/core/status.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"
#include "src/base/log.h"
#include "tests/mt/thread_ranks.h"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t occurrences(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// Polls `ready` every 20 ms for up to `seconds`.
bool eventually(double seconds, const std::function<bool()>& ready) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST(StatusTest, ReportNamesTheCallAndThePeerItWaitsFor) {
  char dir[] = "/tmp/loom-status-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string trigger = std::string(dir) + "/trigger", log = std::string(dir) + "/log";
  setenv("LOOM_STATUS_FILE", trigger.c_str(), 1);
  setenv("LOOM_DEBUG_FILE", log.c_str(), 1);
  loom::reloadLogSettings();
  EXPECT_EQ(loom::statusReport(), "  no communicator");
  const std::string header = "status of this process's communicators";
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = 30000;
  config.commName = "status-test";
  loomtest::runRanks(
      2,
      [&](loomComm_t comm, int rank) {
        std::vector<float> data(1000, 1.0f);
        ASSERT_EQ(loomAllReduce(data.data(), data.data(), 1000, loomFloat32, loomSum, comm, nullptr), loomSuccess);
        if (rank == 1) {
          // Rank 0 is in its second AllReduce, waiting for this rank.
          std::string report;
          EXPECT_TRUE(eventually(10, [&] {
            report = loom::statusReport();
            return contains(report, ", waiting ");
          })) << report;
          EXPECT_TRUE(contains(report, "comm \"status-test\"")) << report;
          EXPECT_TRUE(contains(report,
                               "rank 0 of 2: 2 calls started, 1 finished; running AllReduce of 1000 float "
                               "(sum), waiting "))
              << report;
          EXPECT_TRUE(contains(report, " for a message from rank 1") || contains(report, " to send to rank 1"))
              << report;
          EXPECT_TRUE(contains(report, "rank 1 of 2: 1 calls started, 1 finished; no call running")) << report;
          // SIGUSR1 puts it in the log; so does touching the status file.
          ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
          EXPECT_TRUE(eventually(5, [&] { return occurrences(readFile(log), header) == 1; })) << readFile(log);
          std::ofstream(trigger) << "report\n";
          EXPECT_TRUE(eventually(5, [&] { return occurrences(readFile(log), header) == 2; })) << readFile(log);
          EXPECT_TRUE(contains(readFile(log), "running AllReduce of 1000 float (sum), waiting")) << readFile(log);
        }
        ASSERT_EQ(loomAllReduce(data.data(), data.data(), 1000, loomFloat32, loomSum, comm, nullptr), loomSuccess);
        EXPECT_EQ(data[999], 4.0f);
      },
      &config);
  EXPECT_EQ(loom::statusReport(), "  no communicator");
  unsetenv("LOOM_DEBUG_FILE");
  loom::reloadLogSettings();
  unlink(trigger.c_str());
  unlink(log.c_str());
  rmdir(dir);
}

}  // namespace
