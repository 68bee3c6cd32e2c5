// sendrecv_perf: nccl-tests' sendrecv_perf over loom. Each rank sends its buffer to rank+1 and receives rank-1's,
// both in one group. Sending and receiving through one buffer would race, so there is no in-place form.
#include "perf/check_data.h"
#include "perf/common.h"

namespace {

perf::CallSizes sizes(size_t count, size_t, int) { return perf::CallSizes{count, count, count, 0, 0}; }

loomResult_t run(const perf::CallArgs& a) {
  loomGroupStart();
  loomResult_t sent = loomSend(a.send, a.count, a.type, (a.rank + 1) % a.nranks, a.comm, a.stream);
  loomResult_t received = loomRecv(a.recv, a.count, a.type, (a.rank + a.nranks - 1) % a.nranks, a.comm, a.stream);
  loomResult_t ended = loomGroupEnd();
  return sent != loomSuccess ? sent : received != loomSuccess ? received : ended;
}

void fillInput(void* send, const perf::CheckArgs& a) { perf::fillData(send, a.sizes.sendCount, a.type, a.rank, 0); }

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  perf::fillData(expected, a.sizes.recvCount, a.type, (a.rank + a.nranks - 1) % a.nranks, 0);
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"SendRecv",
                                    perf::Collective::kSendRecv,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/false,
                                    /*hasInPlace=*/false,
                                    sizes,
                                    run,
                                    fillInput,
                                    fillExpected};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
