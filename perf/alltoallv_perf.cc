// alltoallv_perf: AllToAllv over loom, in nccl-tests' table. Rank s sends rank t a block of c elements when
// (t - s) mod n is even and c/2 when it is odd (c = the per-rank count of the row), packed in peer order, so
// every rank sends and receives the same total and the blocks sit at uneven displacements. The size column is
// that total; busbw uses AllToAll's factor (n-1)/n. No in-place form.
#include <vector>

#include "perf/check_data.h"
#include "perf/common.h"

namespace {

// Elements rank `from` sends to rank `to` when the row's per-rank count is `block`.
size_t pairCount(size_t block, int from, int to, int nranks) {
  return ((to - from + nranks) % nranks) % 2 == 0 ? block : block / 2;
}

// Where each peer's block starts in `rank`'s send (sending) or receive buffer: packed in peer order.
std::vector<size_t> displacements(size_t block, int rank, int nranks, bool sending) {
  std::vector<size_t> at(nranks);
  size_t next = 0;
  for (int p = 0; p < nranks; ++p) {
    at[p] = next;
    next += sending ? pairCount(block, rank, p, nranks) : pairCount(block, p, rank, nranks);
  }
  return at;
}

perf::CallSizes sizes(size_t count, size_t eltSize, int nranks) {
  size_t block = perf::perRankCount(count, eltSize, nranks), total = 0;
  for (int p = 0; p < nranks; ++p) total += pairCount(block, 0, p, nranks);
  return perf::CallSizes{total, total, block, 0, 0};
}

loomResult_t run(const perf::CallArgs& a) {
  std::vector<size_t> sendCounts(a.nranks), recvCounts(a.nranks);
  for (int p = 0; p < a.nranks; ++p) {
    sendCounts[p] = pairCount(a.count, a.rank, p, a.nranks);
    recvCounts[p] = pairCount(a.count, p, a.rank, a.nranks);
  }
  std::vector<size_t> sendDispls = displacements(a.count, a.rank, a.nranks, true);
  std::vector<size_t> recvDispls = displacements(a.count, a.rank, a.nranks, false);
  return loomAllToAllv(a.send, sendCounts.data(), sendDispls.data(), a.recv, recvCounts.data(), recvDispls.data(),
                       a.type, a.comm, a.stream);
}

void fillInput(void* send, const perf::CheckArgs& a) { perf::fillData(send, a.sizes.sendCount, a.type, a.rank, 0); }

size_t fillExpected(void* expected, const perf::CheckArgs& a) {
  size_t block = a.sizes.paramCount, eltSize = perf::typeSize(a.type);
  std::vector<size_t> recvDispls = displacements(block, a.rank, a.nranks, false);
  for (int p = 0; p < a.nranks; ++p) {
    size_t from = displacements(block, p, a.nranks, true)[a.rank];  // where rank p keeps our block
    perf::fillData(static_cast<char*>(expected) + recvDispls[p] * eltSize, pairCount(block, p, a.rank, a.nranks),
                   a.type, p, from);
  }
  return a.sizes.recvCount;
}

const perf::CollectiveTest kTest = {"AllToAllv",
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
