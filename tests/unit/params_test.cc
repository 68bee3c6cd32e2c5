// The params table: docs/ENVIRONMENT.md is exactly what gen_env_doc prints, accessors read the environment with
// their defaults, and a malformed integer falls back to the default.
#include "src/base/params.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {

std::string runCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  size_t got = 0;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  pclose(pipe);
  return output;
}

TEST(Params, EnvironmentPageIsCurrent) {
  std::ifstream page(std::string(LOOM_SOURCE_ROOT) + "/docs/ENVIRONMENT.md");
  std::stringstream committed;
  committed << page.rdbuf();
  std::string generated = runCommand(GEN_ENV_DOC);
  ASSERT_FALSE(generated.empty());
  EXPECT_EQ(committed.str(), generated)
      << "docs/ENVIRONMENT.md is stale: run build/tools/gen_env_doc > docs/ENVIRONMENT.md";
}

TEST(Params, EveryRowIsDocumented) {
  for (const loom::params::ParamInfo& param : loom::params::all()) {
    EXPECT_NE(std::string(param.doc), "") << param.env;
    EXPECT_TRUE(std::string(param.env).find(' ') == std::string::npos) << param.env;
  }
}

TEST(Params, AccessorsReadTheEnvironment) {
  unsetenv("LOOM_FIFO_DEPTH");
  EXPECT_EQ(loom::params::fifoDepth(), 8);
  setenv("LOOM_FIFO_DEPTH", "16", 1);
  EXPECT_EQ(loom::params::fifoDepth(), 16);
  setenv("LOOM_FIFO_DEPTH", "16x", 1);
  EXPECT_EQ(loom::params::fifoDepth(), 8) << "malformed integers fall back to the default";
  unsetenv("LOOM_FIFO_DEPTH");
  setenv("LOOM_SHM_DIR", "/tmp", 1);
  EXPECT_EQ(loom::params::shmDir(), "/tmp");
  unsetenv("LOOM_SHM_DIR");
  EXPECT_EQ(loom::params::shmDir(), "/dev/shm");
}

}  // namespace
