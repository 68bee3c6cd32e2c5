// The log: a line that repeats, alone or alternating with a few others (a failure every queued call meets again),
// is printed once, then counted at each power of ten and said in all when it stops.
#include "src/base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> logLines(const std::string& path) {
  std::ifstream file(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(line);
  return lines;
}

int countContaining(const std::vector<std::string>& lines, const std::string& text) {
  int n = 0;
  for (const std::string& line : lines) n += line.find(text) != std::string::npos;
  return n;
}

TEST(Log, RepeatedLinesAreCounted) {
  char path[] = "/tmp/loom-log-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  setenv("LOOM_DEBUG_FILE", path, 1);
  setenv("LOOM_DEBUG", "WARN", 1);
  loom::reloadLogSettings();
  // Two lines, alternating, 1234 times each: what a failed stream's queued calls said, one pair per call.
  for (int call = 0; call < 1234; ++call) {
    LOOM_WARN(COLL, "rank 0: first failure: rank 1 is stopped");
    LOOM_WARN(COLL, "AllReduce: rank 1 gave up on the operation");
  }
  LOOM_WARN(COLL, "something else 1");  // the window of recent lines moves on: the counts are said in all
  LOOM_WARN(COLL, "something else 2");
  LOOM_WARN(COLL, "something else 3");
  LOOM_WARN(COLL, "something else 4");
  unsetenv("LOOM_DEBUG_FILE");
  loom::reloadLogSettings();
  const std::vector<std::string> lines = logLines(path);
  unlink(path);
  EXPECT_EQ(countContaining(lines, "first failure: rank 1 is stopped"), 5)
      << "once, then at 10, 100 and 1000 repeats, then in all";
  EXPECT_EQ(countContaining(lines, "repeated 10 times so far: rank 0: first failure"), 1);
  EXPECT_EQ(countContaining(lines, "repeated 1000 times so far: AllReduce"), 1);
  EXPECT_EQ(countContaining(lines, "repeated 1233 times in all: rank 0: first failure"), 1);
  EXPECT_EQ(countContaining(lines, "repeated 1233 times in all: AllReduce"), 1);
  EXPECT_LE(lines.size(), 14u);
  EXPECT_EQ(countContaining(lines, "something else"), 4);
}

}  // namespace
