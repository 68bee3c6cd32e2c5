// The params table: docs/ENVIRONMENT.md is exactly what gen_env_doc prints, accessors read the environment with
// their defaults, integers are clamped to their accepted ranges (said once), words are matched in any case, and
// check() names each bad variable with what it accepts.
#include "src/base/params.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "src/base/log.h"

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
  setenv("LOOM_FIFO_DEPTH", "0", 1);
  EXPECT_EQ(loom::params::fifoDepth(), 2) << "out-of-range integers are clamped to the nearest accepted value";
  setenv("LOOM_FIFO_DEPTH", "1000", 1);
  EXPECT_EQ(loom::params::fifoDepth(), 64);
  unsetenv("LOOM_FIFO_DEPTH");
  setenv("LOOM_SHM_DIR", "/tmp", 1);
  EXPECT_EQ(loom::params::shmDir(), "/tmp");
  unsetenv("LOOM_SHM_DIR");
  EXPECT_EQ(loom::params::shmDir(), "/dev/shm");
}

TEST(Params, WordsInAnyCaseReadAsTheTableSpellsThem) {
  setenv("LOOM_PROTO", "simple", 1);
  EXPECT_EQ(loom::params::proto(), "Simple");
  setenv("LOOM_PROTO", "ll", 1);
  EXPECT_EQ(loom::params::proto(), "LL");
  unsetenv("LOOM_PROTO");
  setenv("LOOM_TRANSPORTS", "SHM,Tcp", 1);
  EXPECT_EQ(loom::params::transports(), "shm,tcp");
  unsetenv("LOOM_TRANSPORTS");
  setenv("LOOM_DEBUG_SUBSYS", "^init,net", 1);
  EXPECT_EQ(loom::params::debugSubsys(), "^INIT,NET");
  unsetenv("LOOM_DEBUG_SUBSYS");
  setenv("LOOM_DEBUG", "info", 1);
  EXPECT_EQ(loom::params::debug(), "INFO");
  unsetenv("LOOM_DEBUG");
}

TEST(Params, ClampsAndDefaultsOfIntegers) {
  setenv("LOOM_CHUNK_BYTES", "5", 1);
  EXPECT_EQ(loom::params::chunkBytes(), 1024) << "0 (the tuner chooses) or 1024 or more: 5 is clamped to 1024";
  setenv("LOOM_CHUNK_BYTES", "-1", 1);
  EXPECT_EQ(loom::params::chunkBytes(), 1024) << "0 is taken only when given";
  setenv("LOOM_CHUNK_BYTES", "0", 1);
  EXPECT_EQ(loom::params::chunkBytes(), 0);
  setenv("LOOM_CHUNK_BYTES", "4096", 1);
  EXPECT_EQ(loom::params::chunkBytes(), 4096);
  unsetenv("LOOM_CHUNK_BYTES");
  setenv("LOOM_NCHANNELS", "1000", 1);
  EXPECT_EQ(loom::params::nChannels(), 32);
  unsetenv("LOOM_NCHANNELS");
}

TEST(Params, CheckNamesEachBadVariableAndWhatItAccepts) {
  std::string why;
  EXPECT_TRUE(loom::params::check(&why)) << why;
  setenv("LOOM_PROTO", "fast", 1);
  setenv("LOOM_FIFO_DEPTH", "eight", 1);
  setenv("LOOM_TRANSPORTS", "shm,pigeon", 1);
  setenv("LOOM_NCHANNELS", "1000", 1);  // clamped, not an error
  EXPECT_FALSE(loom::params::check(&why));
  EXPECT_NE(why.find("LOOM_PROTO=\"fast\""), std::string::npos) << why;
  EXPECT_NE(why.find("Simple or LL"), std::string::npos) << why;
  EXPECT_NE(why.find("LOOM_FIFO_DEPTH=\"eight\" is not an integer: expected 2 to 64"), std::string::npos) << why;
  EXPECT_NE(why.find("\"pigeon\""), std::string::npos) << why;
  EXPECT_EQ(why.find("LOOM_NCHANNELS"), std::string::npos) << why;
  for (const char* name : {"LOOM_PROTO", "LOOM_FIFO_DEPTH", "LOOM_TRANSPORTS", "LOOM_NCHANNELS"}) unsetenv(name);
  EXPECT_TRUE(loom::params::check(&why)) << why;
}

TEST(Params, AClampIsSaidOnceAtWarn) {
  char path[] = "/tmp/loom-params-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  setenv("LOOM_DEBUG_FILE", path, 1);
  loom::reloadLogSettings();
  setenv("LOOM_LL_SLOT_BYTES", "17", 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(loom::params::llSlotBytes(), 256);
  unsetenv("LOOM_LL_SLOT_BYTES");
  unsetenv("LOOM_DEBUG_FILE");
  loom::reloadLogSettings();
  std::ifstream log(path);
  std::string line;
  int lines = 0;
  while (std::getline(log, line))
    if (line.find("LOOM_LL_SLOT_BYTES=17 is outside 256 to 1048576: using 256") != std::string::npos) ++lines;
  EXPECT_EQ(lines, 1);
  unlink(path);
}

}  // namespace
