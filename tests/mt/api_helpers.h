// Helpers shared by the mt suite's API tests (api_test.cc, api_comms_test.cc, api_args_test.cc): the ApiTest
// fixture that runs a test once per transport, the sentinel and deadline the tests use, and expectCommUsable,
// which shows that a communicator still works after a rejected or failed call. No tests here.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "tests/mt/thread_ranks.h"

namespace loomtest {

constexpr float kSentinel = -12345.0f;
// Deadline of the communicators of most tests: a library bug becomes a failure, not a hang.
constexpr int kTestTimeoutMs = 20000;

loomConfig_t configWithTimeout(int timeoutMs);

bool contains(const std::string& text, const std::string& part);

// Index of the first element of `values` that is not `expected`, or -1.
template <typename T>
long firstDifferent(const std::vector<T>& values, T expected) {
  auto found = std::find_if(values.begin(), values.end(), [&](T v) { return v != expected; });
  return found == values.end() ? -1 : static_cast<long>(found - values.begin());
}

// A valid AllReduce and a grouped ring exchange of Send/Recv every rank makes after a rejected call: both must
// run and give the right data, which shows the rejected call left nothing behind (queued work, half-sent
// messages on the collective or the point-to-point connections, a pending error).
void expectCommUsable(loomComm_t comm, int rank, int nranks, const std::string& after);

// Every test that moves data runs once per transport: the fixture restricts LOOM_TRANSPORTS for its lifetime.
// Each test file instantiates it (INSTANTIATE_TEST_SUITE_P) over the transports. ib runs on the software device
// (LOOM_IB_PROVIDER=softib).
class ApiTest : public ::testing::TestWithParam<const char*> {
 protected:
  ApiTest() : transport_("LOOM_TRANSPORTS", GetParam()), provider_("LOOM_IB_PROVIDER", "softib") {}
  ScopedEnv transport_;
  ScopedEnv provider_;
};

// shm, loopback and tcp, and ib where the library has it.
std::vector<const char*> dataTransports();

}  // namespace loomtest
