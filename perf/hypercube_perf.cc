// hypercube_perf: nccl-tests' hypercube_perf over loom: an AllGather made of point-to-point exchanges in
// log2(n) rounds, each round one group, each moving twice the data of the round before. With a power-of-two
// rank count a rank exchanges with rank ^ d in round d (the hypercube); otherwise it sends to rank - d and
// receives from rank + d (mod n), the dissemination pattern, so that every rank count gets an exact AllGather.
// Sizes, data and busbw are those of all_gather_perf. In place: sendbuff == recvbuff + rank*sendcount.
#include <algorithm>

#include "perf/check_data.h"
#include "perf/common.h"

namespace {

// Collects the first error of a round's calls, so that the group is always closed.
struct Round {
  loomResult_t result = loomSuccess;
  void keep(loomResult_t r) {
    if (result == loomSuccess) result = r;
  }
};

char* blockAt(const perf::CallArgs& a, int block) {
  return static_cast<char*>(a.recv) + static_cast<size_t>(block) * a.count * perf::typeSize(a.type);
}

// Sends (or receives) blocks first, first+1, ... (count of them, modulo n): one call per contiguous run, in the
// same order on both sides, so that each send meets its receive.
void moveBlocks(const perf::CallArgs& a, bool send, int first, int count, int peer, Round* round) {
  while (count > 0) {
    int run = std::min(count, a.nranks - first);
    size_t elements = static_cast<size_t>(run) * a.count;
    round->keep(send ? loomSend(blockAt(a, first), elements, a.type, peer, a.comm, a.stream)
                     : loomRecv(blockAt(a, first), elements, a.type, peer, a.comm, a.stream));
    count -= run;
    first = 0;
  }
}

loomResult_t run(const perf::CallArgs& a) {
  const int n = a.nranks, r = a.rank;
  Round round;
  if (a.send != blockAt(a, r)) {  // out of place: the rank's own block into place first, a copy to itself
    loomGroupStart();
    round.keep(loomSend(a.send, a.count, a.type, r, a.comm, a.stream));
    round.keep(loomRecv(blockAt(a, r), a.count, a.type, r, a.comm, a.stream));
    round.keep(loomGroupEnd());
  }
  const bool hypercube = (n & (n - 1)) == 0;
  for (int have = 1; have < n && round.result == loomSuccess; have *= 2) {
    loomGroupStart();
    if (hypercube) {  // holds the `have` blocks from r & ~(have-1); the partner holds the next or previous ones
      int partner = r ^ have;
      moveBlocks(a, true, r & ~(have - 1), have, partner, &round);
      moveBlocks(a, false, partner & ~(have - 1), have, partner, &round);
    } else {  // holds blocks r .. r+have-1; gets the next ones from the rank that holds them
      int count = std::min(have, n - have);
      moveBlocks(a, true, r, count, (r - have + n) % n, &round);
      moveBlocks(a, false, (r + have) % n, count, (r + have) % n, &round);
    }
    round.keep(loomGroupEnd());
  }
  return round.result;
}

const perf::CollectiveTest kTest = {"Hypercube",
                                    perf::Collective::kAllGather,
                                    /*hasOp=*/false,
                                    /*hasRoot=*/false,
                                    /*hasInPlace=*/true,
                                    perf::gatheredSizes,
                                    run,
                                    perf::fillGatheredInput,
                                    perf::fillGatheredExpected,
                                    /*ordersItsGroups=*/true};

}  // namespace

int main(int argc, char** argv) { return perf::runPerfTest(argc, argv, kTest); }
