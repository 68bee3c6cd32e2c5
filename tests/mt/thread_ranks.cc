// The mt suite's rank-per-thread harness (see thread_ranks.h).
#include "tests/mt/thread_ranks.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

namespace loomtest {

void runRanks(int nranks, const std::function<void(loomComm_t, int)>& body, loomConfig_t* config) {
  loomUniqueId id;
  ASSERT_EQ(loomGetUniqueId(&id), loomSuccess) << loomGetLastError(nullptr);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank]() {
      loomComm_t comm = nullptr;
      loomResult_t result = loomCommInitRankConfig(&comm, nranks, id, rank, config);
      EXPECT_EQ(result, loomSuccess) << "rank " << rank << ": " << loomGetLastError(nullptr);
      if (result != loomSuccess) return;
      body(comm, rank);
      EXPECT_EQ(loomCommDestroy(comm), loomSuccess);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* old = std::getenv(name);
  hadValue_ = old != nullptr;
  if (hadValue_) saved_ = old;
  setenv(name, value, 1);
}

ScopedEnv::~ScopedEnv() {
  if (hadValue_) {
    setenv(name_.c_str(), saved_.c_str(), 1);
  } else {
    unsetenv(name_.c_str());
  }
}

}  // namespace loomtest
