// Runs the EP dispatch/combine check (tests/common/ep_check.h) as one rank of a job started by loomrun, and exits
// 0 only if every case passed on this rank:
//   ep_check [normal|ll|both] [hidden] [experts per rank] [topk]
// Each mode runs float32, bfloat16 and float16 over uniform, skewed and self routing, three calls each, then a
// skewed case whose capacity is one row short (the overflowing rank's error) and the same with drops.
#include "tests/common/ep_check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "loom/loom.h"
#include "loom/loom_ep.h"

int main(int argc, char** argv) {
  std::string modes = argc > 1 ? argv[1] : "both";
  loomtest::EpCase base;
  if (argc > 2) base.hidden = std::atoi(argv[2]);
  if (argc > 3) base.expertsPerRank = std::atoi(argv[3]);
  if (argc > 4) base.topk = std::atoi(argv[4]);
  loomComm_t comm = nullptr;
  if (loomCommInitFromEnv(&comm) != loomSuccess) {
    std::fprintf(stderr, "ep_check: init: %s\n", loomGetLastError(nullptr));
    return 1;
  }
  int failures = 0, cases = 0;
  auto run = [&](const loomtest::EpCase& c) {
    std::string error = loomtest::runEpCase(comm, c);
    ++cases;
    if (!error.empty()) {
      std::fprintf(stderr, "ep_check: %s\n", error.c_str());
      ++failures;
    }
  };
  for (loomEpMode_t mode : {loomEpNormal, loomEpLowLatency}) {
    if ((mode == loomEpNormal && modes == "ll") || (mode == loomEpLowLatency && modes == "normal")) continue;
    int variant = 0;
    for (loomDataType_t datatype : {loomFloat32, loomBfloat16, loomFloat16})
      for (loomtest::EpRouting routing :
           {loomtest::EpRouting::kUniform, loomtest::EpRouting::kSkewed, loomtest::EpRouting::kSelf}) {
        loomtest::EpCase c = base;
        c.mode = mode;
        c.datatype = datatype;
        c.routing = routing;
        c.seed = static_cast<uint32_t>(++variant);
        run(c);
      }
    loomtest::EpCase c = base;
    c.mode = mode;
    c.routing = loomtest::EpRouting::kSkewed;
    c.expertCapacity = -2;
    run(c);
    c.dropOverflow = 1;
    run(c);
  }
  int rank = 0;
  loomCommUserRank(comm, &rank);
  if (rank == 0) std::printf("ep_check: %d cases, %d failed on rank 0\n", cases, failures);
  loomCommDestroy(comm);
  return failures == 0 ? 0 : 1;
}
