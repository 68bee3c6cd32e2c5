// scatter_perf: nccl-tests' scatter_perf over loom. The size column is root's send buffer; rank r receives
// block r of it. In place (on root): recvbuff == sendbuff + root*recvcount.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

loomResult_t run(const perf::CallArgs& a) {
  return loomScatter(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
}

void fillInput(void* send, const perf::CheckArgs& a) { perf::fillData(send, a.sizes.sendCount, a.type, a.rank, 0); }

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  perf::fillData(expected, a.sizes.recvCount, a.type, a.root, a.rank * a.sizes.recvCount);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"Scatter",           perf::Collective::kScatter,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/true,
                                    /*hasInPlace=*/true, perf::scatteredSizes,       run, fillInput, fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
