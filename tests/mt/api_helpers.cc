// The helpers of api_helpers.h, shared by the mt suite's API tests: a config with a deadline, a substring
// test, and the exchange and AllReduce of expectCommUsable.
#include "tests/mt/api_helpers.h"

#include <cstdint>

#include "transports/transport.h"

namespace loomtest {

loomConfig_t configWithTimeout(int timeoutMs) {
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.timeoutMs = timeoutMs;
  return config;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<const char*> dataTransports() {
  std::vector<const char*> names{"shm", "loopback", "tcp"};
  ScopedEnv provider("LOOM_IB_PROVIDER", "softib");
  std::string why;
  // Built in, ib must work on softib: a failure to start then fails its tests instead of hiding them.
  if (loom::transportAvailable("ib", &why) || why != "not built into this library") names.push_back("ib");
  return names;
}

void expectCommUsable(loomComm_t comm, int rank, int nranks, const std::string& after) {
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  std::vector<int32_t> out(300, rank), in(300, -1);
  ASSERT_EQ(loomGroupStart(), loomSuccess);
  EXPECT_EQ(loomSend(out.data(), out.size(), loomInt32, next, comm, nullptr), loomSuccess) << after;
  EXPECT_EQ(loomRecv(in.data(), in.size(), loomInt32, prev, comm, nullptr), loomSuccess) << after;
  ASSERT_EQ(loomGroupEnd(), loomSuccess) << "ring Send/Recv after " << after << ", rank " << rank << " of " << nranks
                                         << ": " << loomGetLastError(comm);
  EXPECT_EQ(firstDifferent(in, prev), -1) << "ring Send/Recv after " << after << ", rank " << rank;

  constexpr size_t kCount = 1000;
  std::vector<float> send(kCount), recv(kCount, kSentinel);
  for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
  ASSERT_EQ(loomAllReduce(send.data(), recv.data(), kCount, loomFloat32, loomSum, comm, nullptr), loomSuccess)
      << "AllReduce after " << after << ", rank " << rank << " of " << nranks << ": " << loomGetLastError(comm);
  const float ranksSum = nranks * (nranks + 1) / 2.0f;
  for (size_t i = 0; i < kCount; ++i) {
    if (recv[i] != ranksSum * (i % 7 + 1)) {
      ADD_FAILURE() << "AllReduce after " << after << ", rank " << rank << " of " << nranks << ": element " << i
                    << " is " << recv[i] << ", expected " << ranksSum * (i % 7 + 1);
      return;
    }
  }
}

}  // namespace loomtest
