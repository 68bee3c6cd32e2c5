// reduce_scatter_perf: nccl-tests' reduce_scatter_perf over loom. The size column is the send buffer; each rank
// ends with its block of the element-wise reduction. In place: recvbuff == sendbuff + rank*recvcount.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

loomResult_t run(const perf::CallArgs& a) {
  return loomReduceScatter(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
}

void fillInput(void* send, const perf::CheckArgs& a) {
  perf::fillReduceInput(send, a.sizes.sendCount, a.type, a.op, a.rank, a.nranks, 0);
}

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  perf::fillReduceResult(expected, a.sizes.recvCount, a.type, a.op, a.nranks, a.rank * a.sizes.recvCount);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"ReduceScatter",
                                    perf::Collective::kReduceScatter,
                                    /*hasOp=*/true,
                                    /*hasRoot=*/false,
                                    /*hasInPlace=*/true,
                                    perf::scatteredSizes,
                                    run,
                                    fillInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
