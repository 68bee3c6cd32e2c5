// all_gather_perf: nccl-tests' all_gather_perf over loom. The size column is the receive buffer; block r of
// every rank's output is rank r's input. In place: sendbuff == recvbuff + rank*sendcount.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

loomResult_t run(const perf::CallArgs& a) { return loomAllGather(a.send, a.recv, a.count, a.type, a.comm, a.stream); }

const perf::CollectiveTest kTest = {
    "AllGather",         perf::Collective::kAllGather,
    /*hasOp=*/false,
    /*hasRoot=*/false,
    /*hasInPlace=*/true, perf::gatheredSizes,          run, perf::fillGatheredInput, perf::fillGatheredExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
