// One rank of a failure test on hosts made of network namespaces (netns_test.sh). Joins with
// loomCommInitFromEnv, then calls AllReduce on COUNT floats until a call fails or SECONDS pass. After the first
// call, whose sum it checks, it writes "ready" to stdout; at the end "result CODE at SECONDS: MESSAGE", SECONDS
// being the wall clock (since the epoch) when the loop ended, for the script to set beside its fault's time.
//   allreduce_loop COUNT SECONDS
// Exit status: the failing call's loomResult_t (0 when none failed in time), 100 + code when init failed, 120
// on a wrong sum.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "loom/loom.h"

using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: allreduce_loop COUNT SECONDS\n");
    return 2;
  }
  const size_t count = std::strtoull(argv[1], nullptr, 10);
  const double seconds = std::atof(argv[2]);
  loomComm_t comm = nullptr;
  loomResult_t result = loomCommInitFromEnv(&comm);
  if (result != loomSuccess) {
    std::printf("result %d at 0: init: %s\n", result, loomGetLastError(nullptr));
    return 100 + result;
  }
  int rank = 0, nranks = 1;
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);
  std::vector<float> send(count, static_cast<float>(rank + 1)), recv(count, 0.0f);
  const Clock::time_point start = Clock::now();
  for (long call = 0; std::chrono::duration<double>(Clock::now() - start).count() < seconds; ++call) {
    result = loomAllReduce(send.data(), recv.data(), count, loomFloat32, loomSum, comm, nullptr);
    if (result != loomSuccess) break;
    if (call == 0) {
      const float expected = nranks * (nranks + 1) / 2.0f;
      if (recv[0] != expected || recv[count - 1] != expected) {
        std::printf("result 120 at 0: the first AllReduce gave %g, expected %g\n", recv[0], expected);
        return 120;
      }
      std::printf("ready\n");
      std::fflush(stdout);
    }
  }
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::printf("result %d at %.3f: %s\n", result, now, result == loomSuccess ? "" : loomGetLastError(comm));
  std::fflush(stdout);
  if (result == loomSuccess) {
    loomCommDestroy(comm);
  } else {
    loomCommAbort(comm);
  }
  return result;
}
