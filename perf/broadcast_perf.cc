// broadcast_perf: nccl-tests' broadcast_perf over loom. Every rank ends with root's buffer. In place:
// sendbuff == recvbuff.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

perf::CallSizes sizes(size_t count, size_t, int) { return perf::CallSizes{count, count, count, 0, 0}; }

loomResult_t run(const perf::CallArgs& a) {
  return loomBroadcast(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
}

void fillInput(void* send, const perf::CheckArgs& a) { perf::fillData(send, a.sizes.sendCount, a.type, a.rank, 0); }

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  perf::fillData(expected, a.sizes.recvCount, a.type, a.root, 0);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"Broadcast",
                                    perf::Collective::kBroadcast,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/true,
                                    /*hasInPlace=*/true,
                                    sizes,
                                    run,
                                    fillInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
