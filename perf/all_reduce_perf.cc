// all_reduce_perf: nccl-tests' all_reduce_perf over loom. Every rank ends with the element-wise reduction of
// all ranks' buffers; the harness (common.h) does the rest. In place: recvbuff == sendbuff.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

perf::CallSizes allReduceSizes(size_t count, size_t /*eltSize*/, int /*nranks*/) {
  return perf::CallSizes{count, count, count, 0, 0};
}

loomResult_t runAllReduce(const perf::CallArgs& a) {
  return loomAllReduce(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
}

void fillAllReduceInput(void* send, const perf::CheckArgs& a) {
  perf::fillReduceInput(send, a.sizes.sendCount, a.type, a.op, a.rank, a.nranks, 0);
}

size_t fillAllReduceExpected(void* expected, const perf::CheckArgs& a) {
  perf::fillReduceResult(expected, a.sizes.recvCount, a.type, a.op, a.nranks, 0);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kAllReduceTest = {
    "AllReduce",       perf::Collective::kAllReduce, /*hasOp=*/true,
    /*hasRoot=*/false, /*hasInPlace=*/true,          allReduceSizes,
    runAllReduce,      fillAllReduceInput,           fillAllReduceExpected,
};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kAllReduceTest); }
