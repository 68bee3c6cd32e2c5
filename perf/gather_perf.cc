// gather_perf: nccl-tests' gather_perf over loom. The size column is root's receive buffer; block r of it is
// rank r's input. In place (on root): sendbuff == recvbuff + root*sendcount.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

loomResult_t run(const perf::CallArgs& a) {
  return loomGather(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
}

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  return a.rank == a.root ? perf::fillGatheredExpected(expected, a) : 0;
}

const perf::CollectiveTest kTest = {"Gather",
                                    perf::Collective::kGather,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/true,
                                    /*hasInPlace=*/true,
                                    perf::gatheredSizes,
                                    run,
                                    perf::fillGatheredInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
