// alltoall_perf: nccl-tests' alltoall_perf over loom. Block p of rank r's output is block r of rank p's input.
// loomAllToAll has no in-place form, so the in-place columns are empty.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

perf::CallSizes sizes(size_t count, size_t eltSize, int nranks) {
  size_t block = perf::perRankCount(count, eltSize, nranks);
  return perf::CallSizes{block * nranks, block * nranks, block, 0, 0};
}

loomResult_t run(const perf::CallArgs& a) { return loomAllToAll(a.send, a.recv, a.count, a.type, a.comm, a.stream); }

void fillInput(void* send, const perf::CheckArgs& a) { perf::fillData(send, a.sizes.sendCount, a.type, a.rank, 0); }

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  size_t block = a.sizes.paramCount;
  for (int p = 0; p < a.nranks; ++p)
    perf::fillData(static_cast<char*>(expected) + p * block * perf::typeSize(a.type), block, a.type, p, a.rank * block);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"AllToAll",
                                    perf::Collective::kAllToAll,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/false,
                                    /*hasInPlace=*/false,
                                    sizes,
                                    run,
                                    fillInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
