// perf/cli: the output-path check every program runs on its command line before it works. Every rank of a job
// checks the same path at the same moment, so one rank's probe (a file made, then removed) must not make another
// rank's check fail.
#include "perf/cli.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string makeTempDir() {
  char dir[] = "/tmp/loom-cli-test-XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

TEST(CheckOutputPath, NewFileIsWritableAndNotLeftBehind) {
  const std::string dir = makeTempDir();
  std::string why;
  EXPECT_TRUE(perf::checkOutputPath(dir + "/out.csv", &why)) << why;
  struct stat info {};
  EXPECT_NE(stat((dir + "/out.csv").c_str(), &info), 0) << "the probe was left behind";
  rmdir(dir.c_str());
}

TEST(CheckOutputPath, RefusalsNameThePath) {
  const std::string dir = makeTempDir();
  std::string why;
  EXPECT_FALSE(perf::checkOutputPath(dir, &why));
  EXPECT_NE(why.find("is a directory"), std::string::npos) << why;
  EXPECT_FALSE(perf::checkOutputPath(dir + "/none/out.csv", &why));
  EXPECT_NE(why.find(dir + "/none does not exist"), std::string::npos) << why;
  EXPECT_FALSE(perf::checkOutputPath("", &why));
  rmdir(dir.c_str());
}

// Ranks as threads, each round released at once onto a path that does not exist yet: every check must pass (one
// rank's O_EXCL probe made the other's fail with "File exists").
TEST(CheckOutputPath, RanksCheckingOnePathAtOnceAllPass) {
  const std::string dir = makeTempDir();
  constexpr int kRanks = 4;
  constexpr int kRounds = 3000;
  std::atomic<int> arrived{0};
  std::atomic<int> failures{0};
  std::string firstFailure;
  std::atomic<bool> recorded{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; r++) {
    ranks.emplace_back([&] {
      for (int round = 0; round < kRounds; round++) {
        // A barrier per round: all ranks start the same round's check together.
        arrived.fetch_add(1);
        while (arrived.load() < (round + 1) * kRanks) std::this_thread::yield();
        std::string why;
        const std::string path = dir + "/metrics-" + std::to_string(round) + ".csv";
        if (!perf::checkOutputPath(path, &why)) {
          failures.fetch_add(1);
          if (!recorded.exchange(true)) firstFailure = why;
        }
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(failures.load(), 0) << "first: " << firstFailure;
  for (int round = 0; round < kRounds; round++) unlink((dir + "/metrics-" + std::to_string(round) + ".csv").c_str());
  rmdir(dir.c_str());
}

}  // namespace
