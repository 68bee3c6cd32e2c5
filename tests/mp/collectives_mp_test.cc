// The collective matrix with ranks as processes: loomrun starts collective_check at 2, 4 and 8 ranks over shm.
// Also checks that a finished job leaves no segment behind in /dev/shm.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <set>
#include <string>

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

class CollectivesMp : public testing::TestWithParam<int> {};

TEST_P(CollectivesMp, MatrixUnderLoomrun) {
  const char* loomrun = std::getenv("LOOMRUN");
  const char* check = std::getenv("MP_CHECK");
  ASSERT_TRUE(loomrun && check) << "LOOMRUN and MP_CHECK must name the built programs";
  std::set<std::string> before = loomSegments();
  std::string command = std::string(loomrun) + " -n " + std::to_string(GetParam()) + " --timeout 900 " + check;
  int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << command;
  EXPECT_EQ(WEXITSTATUS(status), 0) << command;
  std::set<std::string> after = loomSegments();
  for (const std::string& name : after) EXPECT_TRUE(before.count(name)) << "left behind: /dev/shm/" << name;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesMp, testing::Values(2, 4, 8),
                         [](const testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
