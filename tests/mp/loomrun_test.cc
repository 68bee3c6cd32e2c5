// Tests of the loomrun launcher with shell commands as ranks: the environment each rank gets, tagged output,
// how a failing, killed or slow rank ends the job, signal forwarding and argument errors. The binary under test
// comes from the LOOMRUN environment variable (set by tests/meson.build). No loom library is involved.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct RunResult {
  int exitCode = -1;  // 128+signal when loomrun itself died by a signal
  std::string out;
  std::string err;
  double seconds = 0;
};

const char* loomrunPath() {
  const char* path = getenv("LOOMRUN");
  return path && *path ? path : nullptr;
}

// Starts loomrun with `args`; its stdout and stderr go to the returned pipes.
pid_t startLoomrun(const std::vector<std::string>& args, int* outFd, int* errFd) {
  int outPipe[2], errPipe[2];
  if (pipe2(outPipe, O_CLOEXEC) != 0 || pipe2(errPipe, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(outPipe[1], STDOUT_FILENO);
    dup2(errPipe[1], STDERR_FILENO);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(loomrunPath()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(126);
  }
  close(outPipe[1]);
  close(errPipe[1]);
  *outFd = outPipe[0];
  *errFd = errPipe[0];
  return pid;
}

// Reads both pipes to their end, then reaps loomrun.
RunResult finishLoomrun(pid_t pid, int outFd, int errFd, std::chrono::steady_clock::time_point start) {
  RunResult result;
  pollfd fds[2] = {{outFd, POLLIN, 0}, {errFd, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open = 2;
  while (open > 0 && poll(fds, 2, -1) >= 0) {
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        open--;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

RunResult runLoomrun(const std::vector<std::string>& args) {
  auto start = std::chrono::steady_clock::now();
  int outFd, errFd;
  pid_t pid = startLoomrun(args, &outFd, &errFd);
  if (pid < 0) return RunResult{};
  return finishLoomrun(pid, outFd, errFd, start);
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) result.push_back(line);
  return result;
}

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exitCode) + "\n--- stdout:\n" + r.out + "--- stderr:\n" + r.err;
}

class LoomrunTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(loomrunPath(), nullptr) << "set LOOMRUN to the path of the loomrun binary"; }
};

TEST_F(LoomrunTest, EveryRankSeesItsEnvironment) {
  const int kRanks = 4;
  RunResult r = runLoomrun({"-n", std::to_string(kRanks), "--tag-output", "sh", "-c",
                            "echo \"$LOOM_RANK $LOOM_NRANKS $LOOM_LOCAL_RANK $LOOM_LOCAL_NRANKS $LOOM_ROOT_ADDR "
                            "$LOOM_SECRET\""});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::regex pattern(R"(\[(\d+)\] (\d+) (\d+) (\d+) (\d+) 127\.0\.0\.1:(\d+) ([0-9a-f]{32}))");
  std::set<int> ranksSeen;
  std::set<std::string> addresses, secrets;
  for (const std::string& line : lines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << "unexpected line '" << line << "'\n" << describe(r);
    int tag = std::stoi(m[1]), rank = std::stoi(m[2]), port = std::stoi(m[6]);
    EXPECT_EQ(tag, rank) << line;
    EXPECT_EQ(std::stoi(m[3]), kRanks) << line;
    EXPECT_EQ(std::stoi(m[4]), rank) << "LOOM_LOCAL_RANK: " << line;
    EXPECT_EQ(std::stoi(m[5]), kRanks) << "LOOM_LOCAL_NRANKS: " << line;
    EXPECT_GT(port, 0);
    EXPECT_LT(port, 65536);
    ranksSeen.insert(rank);
    addresses.insert(m[6]);
    secrets.insert(m[7]);
  }
  EXPECT_EQ(ranksSeen, (std::set<int>{0, 1, 2, 3})) << describe(r);
  EXPECT_EQ(addresses.size(), 1u) << "all ranks must share one root address";
  EXPECT_EQ(secrets.size(), 1u) << "all ranks must share one secret";
}

TEST_F(LoomrunTest, EachJobGetsItsOwnSecret) {
  RunResult a = runLoomrun({"-n", "1", "sh", "-c", "echo $LOOM_SECRET"});
  RunResult b = runLoomrun({"-n", "1", "sh", "-c", "echo $LOOM_SECRET"});
  ASSERT_EQ(a.exitCode, 0) << describe(a);
  ASSERT_EQ(b.exitCode, 0) << describe(b);
  EXPECT_NE(a.out, b.out);
}

TEST_F(LoomrunTest, TaggedOutputKeepsLinesAndStreams) {
  RunResult r =
      runLoomrun({"-n", "2", "--tag-output", "sh", "-c", "printf 'first\\nsecond\\npartial'; printf 'oops\\n' >&2"});
  ASSERT_EQ(r.exitCode, 0) << describe(r);
  std::map<std::string, int> outCounts, errCounts;
  for (const std::string& line : lines(r.out)) outCounts[line]++;
  for (const std::string& line : lines(r.err)) errCounts[line]++;
  for (const char* rank : {"[0] ", "[1] "}) {
    for (const char* text : {"first", "second", "partial"}) {
      EXPECT_EQ(outCounts[std::string(rank) + text], 1) << rank << text << "\n" << describe(r);
    }
    EXPECT_EQ(errCounts[std::string(rank) + "oops"], 1) << describe(r);
  }
  EXPECT_EQ(lines(r.out).size(), 6u) << describe(r);
}

TEST_F(LoomrunTest, FailingRankStopsTheJob) {
  RunResult r = runLoomrun({"-n", "3", "sh", "-c", "if [ \"$LOOM_RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60"});
  EXPECT_EQ(r.exitCode, 3) << describe(r);
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << describe(r);
  EXPECT_LT(r.seconds, 10.0) << "the sleeping ranks were not stopped promptly";
}

TEST_F(LoomrunTest, RankKilledBySignalStopsTheJob) {
  RunResult r = runLoomrun({"-n", "2", "sh", "-c", "if [ \"$LOOM_RANK\" = 0 ]; then kill -9 $$; fi; sleep 60"});
  EXPECT_EQ(r.exitCode, 128 + SIGKILL) << describe(r);
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("killed by signal 9"), std::string::npos) << describe(r);
  EXPECT_LT(r.seconds, 10.0);
}

TEST_F(LoomrunTest, RankIgnoringSigtermIsKilledAfterGrace) {
  // Rank 1 fails only once rank 0 ignores SIGTERM (it says so through a file), so only SIGKILL can end rank 0.
  char dir[] = "/tmp/loomrun_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string marker = std::string(dir) + "/ignoring";
  RunResult r = runLoomrun({"-n", "2", "sh", "-c",
                            "if [ \"$LOOM_RANK\" = 1 ]; then while [ ! -e " + marker +
                                " ]; do sleep 0.01; done; exit 5; fi; trap '' TERM; touch " + marker + "; sleep 60"});
  unlink(marker.c_str());
  rmdir(dir);
  EXPECT_EQ(r.exitCode, 5) << describe(r);
  EXPECT_GE(r.seconds, 1.0) << "rank 0 ignores SIGTERM, so it should have lasted the grace period";
  EXPECT_LT(r.seconds, 10.0) << "SIGKILL did not follow the grace period";
}

TEST_F(LoomrunTest, TimeoutStopsTheJob) {
  RunResult r = runLoomrun({"-n", "2", "--timeout", "0.5", "sleep", "60"});
  EXPECT_EQ(r.exitCode, 124) << describe(r);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << describe(r);
  EXPECT_GE(r.seconds, 0.4);
  EXPECT_LT(r.seconds, 10.0);
}

TEST_F(LoomrunTest, JobWithinTimeoutSucceeds) {
  RunResult r = runLoomrun({"-n", "3", "--timeout", "30", "true"});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_EQ(r.err, "");
}

TEST_F(LoomrunTest, SigtermIsForwardedToRanks) {
  // Each rank records its pid, then sleeps; after loomrun is told to stop, none of them may be left.
  char dir[] = "/tmp/loomrun_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string script = std::string("echo $$ > ") + dir + "/rank$LOOM_RANK; exec sleep 60";
  auto start = std::chrono::steady_clock::now();
  int outFd, errFd;
  pid_t pid = startLoomrun({"-n", "3", "sh", "-c", script}, &outFd, &errFd);
  ASSERT_GT(pid, 0);
  std::vector<pid_t> rankPids;
  for (int attempt = 0; attempt < 500 && rankPids.size() < 3; attempt++) {
    rankPids.clear();
    for (int rank = 0; rank < 3; rank++) {
      std::ifstream file(std::string(dir) + "/rank" + std::to_string(rank));
      pid_t rankPid = 0;
      if (file >> rankPid) rankPids.push_back(rankPid);
    }
    if (rankPids.size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(rankPids.size(), 3u) << "ranks did not start";
  kill(pid, SIGTERM);
  RunResult r = finishLoomrun(pid, outFd, errFd, start);
  EXPECT_EQ(r.exitCode, 128 + SIGTERM) << describe(r);
  EXPECT_LT(r.seconds, 10.0);
  for (pid_t rankPid : rankPids) {
    EXPECT_NE(kill(rankPid, 0), 0) << "rank pid " << rankPid << " outlived loomrun";
  }
  for (int rank = 0; rank < 3; rank++) unlink((std::string(dir) + "/rank" + std::to_string(rank)).c_str());
  rmdir(dir);
}

TEST_F(LoomrunTest, ProgramThatCannotRunFails) {
  RunResult r = runLoomrun({"-n", "2", "/nonexistent/program"});
  EXPECT_NE(r.exitCode, 0) << describe(r);
  EXPECT_NE(r.err.find("cannot run"), std::string::npos) << describe(r);
}

TEST_F(LoomrunTest, BadArgumentsExitWithUsageError) {
  const std::vector<std::vector<std::string>> cases = {
      {"true"},                        // no -n
      {"-n", "0", "true"},             // too few ranks
      {"-n", "1025", "true"},          // too many ranks
      {"-n", "two", "true"},           // not a number
      {"-n"},                          // missing value
      {"-n", "2"},                     // no program
      {"-n", "2", "--bogus", "true"},  // unknown option
      {"-n", "2", "--timeout", "-1", "true"},
      {"-n", "2", "--timeout", "soon", "true"},
  };
  for (const auto& args : cases) {
    RunResult r = runLoomrun(args);
    std::string joined;
    for (const std::string& a : args) joined += a + " ";
    EXPECT_EQ(r.exitCode, 2) << "loomrun " << joined << "\n" << describe(r);
    EXPECT_NE(r.err.find("loomrun: "), std::string::npos) << "no message for: loomrun " << joined;
  }
}

TEST_F(LoomrunTest, HelpExitsZero) {
  RunResult r = runLoomrun({"--help"});
  EXPECT_EQ(r.exitCode, 0) << describe(r);
  EXPECT_NE(r.out.find("usage: loomrun"), std::string::npos) << describe(r);
}

}  // namespace
