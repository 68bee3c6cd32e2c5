// gather_perf: nccl-tests' gather_perf over loom. The size column is root's receive buffer; block r of it is
// rank r's input. In place (on root): sendbuff == recvbuff + root*sendcount.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

loomResult_t run(const perf::CallArgs& a) {
  return loomGather(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
}

void fillInput(void* send, const perf::CheckArgs& a) {
  perf::fillData(send, a.sizes.sendCount, a.type, a.rank, a.rank * a.sizes.sendCount);
}

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  if (a.rank != a.root) return 0;
  perf::fillGathered(expected, a.sizes.sendCount, a.type, a.nranks);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"Gather",
                                    perf::Collective::kGather,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/true,
                                    /*hasInPlace=*/true,
                                    perf::gatheredSizes,
                                    run,
                                    fillInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
