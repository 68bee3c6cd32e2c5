// The shared-memory transport's promises: segments vanish from LOOM_SHM_DIR as soon as both sides have mapped
// them, and a directory too small for a connection gives an error naming the bytes needed and LOOM_SHM_DIR
// (tested on a tiny tmpfs this test mounts; skipped where it may not mount).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/mt/thread_ranks.h"

namespace {

size_t entries(const std::string& dir) {
  size_t count = 0;
  if (DIR* handle = opendir(dir.c_str())) {
    while (dirent* entry = readdir(handle))
      if (entry->d_name[0] != '.') ++count;
    closedir(handle);
  }
  return count;
}

TEST(Shm, SegmentsAreUnlinkedOnceMapped) {
  char dir[] = "/dev/shm/loomtest-shm-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  {
    loomtest::ScopedEnv shmDir("LOOM_SHM_DIR", dir);
    loomtest::ScopedEnv transports("LOOM_TRANSPORTS", "shm");
    loomtest::runRanks(4, [&](loomComm_t comm, int rank) {
      std::vector<float> data(100000, float(rank));
      ASSERT_EQ(loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comm, nullptr), loomSuccess);
      EXPECT_EQ(data[5], 6.0f);
      ASSERT_EQ(loomBarrier(comm, nullptr), loomSuccess);
      // Every connection of the AllReduce and the barrier is up: nothing may remain in the directory.
      EXPECT_EQ(entries(dir), 0u) << "segments left in " << dir << " while the communicator is alive";
    });
  }
  EXPECT_EQ(rmdir(dir), 0);
}

TEST(Shm, FullDirectoryNamesBytesAndSetting) {
  char dir[] = "/tmp/loomtest-tinyshm-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
    rmdir(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << strerror(errno);
  }
  {
    loomtest::ScopedEnv shmDir("LOOM_SHM_DIR", dir);
    loomtest::ScopedEnv transports("LOOM_TRANSPORTS", "shm");
    loomConfig_t config = LOOM_CONFIG_INITIALIZER;
    config.timeoutMs = 3000;
    loomtest::runRanks(
        2,
        [&](loomComm_t comm, int rank) {
          std::vector<float> data(1000, float(rank));
          loomResult_t result =
              loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comm, nullptr);
          EXPECT_NE(result, loomSuccess);
          std::string message = loomGetLastError(comm);
          // The rank whose segment did not fit says why; its peer learns that the peer failed, or times out.
          if (result == loomSystemError) {
            EXPECT_NE(message.find("bytes"), std::string::npos) << message;
            EXPECT_NE(message.find("LOOM_SHM_DIR"), std::string::npos) << message;
          }
        },
        &config);
  }
  EXPECT_EQ(entries(dir), 0u) << "a failed setup must not leave segments behind";
  umount(dir);
  rmdir(dir);
}

}  // namespace
