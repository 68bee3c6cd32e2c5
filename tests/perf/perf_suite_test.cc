// The perf programs as a test: every *_perf runs under loomrun at 1, 2, 3, 4 and 8 ranks on small sizes, with
// checking on, and must exit 0 with "Out of bounds values : 0 OK" (every element of every size exact); ep_perf
// likewise in a small shape.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>

namespace {

const char* kPrograms[] = {"all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf",
                           "reduce_perf",     "alltoall_perf",   "alltoallv_perf",      "sendrecv_perf",
                           "gather_perf",     "scatter_perf",    "hypercube_perf"};

class PerfSuite : public testing::TestWithParam<std::tuple<const char*, int>> {};

// Runs `command` (stderr with stdout); its output, and its wait status in *status.
std::string output(const std::string& command, int* status) {
  std::string text;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return text;
  }
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) text.append(buffer, got);
  *status = pclose(pipe);
  return text;
}

TEST_P(PerfSuite, ExactTableUnderLoomrun) {
  const char* loomrun = std::getenv("LOOMRUN");
  const char* perfDir = std::getenv("PERF_DIR");
  ASSERT_TRUE(loomrun && perfDir) << "LOOMRUN and PERF_DIR must name the built launcher and perf/";
  auto [program, nranks] = GetParam();
  // Every root for the rooted collectives; sizes from 8 B to 256 KiB.
  std::string command = std::string(loomrun) + " -n " + std::to_string(nranks) + " --timeout 300 " + perfDir + "/" +
                        program + " -b 8 -e 256K -f 8 -n 2 -w 1 -c 1 -r -1 2>&1";
  int status = 0;
  std::string text = output(command, &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << text;
  EXPECT_NE(text.find("# Out of bounds values : 0 OK"), std::string::npos) << command << "\n" << text;
}

// ep_perf (expert dispatch and combine) in a small shape at 1, 2, 3 and 4 ranks: exit 0 (no wrong element in any
// combine) and both modes' rows in the table.
TEST(EpPerf, ExactTableUnderLoomrun) {
  const char* loomrun = std::getenv("LOOMRUN");
  const char* perfDir = std::getenv("PERF_DIR");
  ASSERT_TRUE(loomrun && perfDir) << "LOOMRUN and PERF_DIR must name the built launcher and perf/";
  for (int nranks : {1, 2, 3, 4}) {
    std::string command = std::string(loomrun) + " -n " + std::to_string(nranks) + " --timeout 300 " + perfDir +
                          "/ep_perf --tokens 16 --hidden 200 --topk 3 --experts 12 -n 3 -w 1 --copy-mib 8 2>&1";
    int status = 0;
    std::string text = output(command, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << text;
    EXPECT_NE(text.find("  low-latency    dispatch"), std::string::npos) << text;
    EXPECT_NE(text.find("  normal         combine"), std::string::npos) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, PerfSuite,
                         testing::Combine(testing::ValuesIn(kPrograms), testing::Values(1, 2, 3, 4, 8)),
                         [](const testing::TestParamInfo<PerfSuite::ParamType>& info) {
                           return std::string(std::get<0>(info.param)) + "_" + std::to_string(std::get<1>(info.param)) +
                                  "ranks";
                         });

}  // namespace
