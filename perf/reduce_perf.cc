// reduce_perf: nccl-tests' reduce_perf over loom. Root ends with the element-wise reduction of all ranks'
// buffers; other ranks' outputs are not checked. In place: sendbuff == recvbuff.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

perf::CallSizes sizes(size_t count, size_t, int) { return perf::CallSizes{count, count, count, 0, 0}; }

loomResult_t run(const perf::CallArgs& a) {
  return loomReduce(a.send, a.recv, a.count, a.type, a.op, a.root, a.comm, a.stream);
}

void fillInput(void* send, const perf::CheckArgs& a) {
  perf::fillReduceInput(send, a.sizes.sendCount, a.type, a.op, a.rank, a.nranks, 0);
}

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  if (a.rank != a.root) return 0;
  perf::fillReduceResult(expected, a.sizes.recvCount, a.type, a.op, a.nranks, 0);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"Reduce",
                                    perf::Collective::kReduce,
                                    /*hasOp=*/true,
                                    /*hasRoot=*/true,
                                    /*hasInPlace=*/true,
                                    sizes,
                                    run,
                                    fillInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
