// Runs the collective test matrix as one rank of a job started by loomrun (or any launcher that
// loomCommInitFromEnv understands), and exits 0 only if every case passed on this rank and its peers.
//   collective_check [small counts, comma separated] [big count] [plain|alloc|registered]
// Every type and op at the small counts; float and int32 (sum, avg, max) at the big count. The last argument
// puts the buffers in loomMemAlloc memory or registers them, so peers read them in place.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "tests/common/matrix.h"

int main(int argc, char** argv) {
  std::vector<size_t> small = {0, 1, 7, 1000};
  size_t big = 1000003;
  if (argc > 1) {
    small.clear();
    std::stringstream list(argv[1]);
    for (std::string item; std::getline(list, item, ',');) small.push_back(std::stoul(item));
  }
  if (argc > 2) big = std::stoul(argv[2]);
  loomtest::Memory memory = loomtest::Memory::kPlain;
  if (argc > 3)
    memory = std::string(argv[3]) == "alloc"        ? loomtest::Memory::kLoomAlloc
             : std::string(argv[3]) == "registered" ? loomtest::Memory::kRegistered
                                                    : loomtest::Memory::kPlain;

  loomComm_t comm = nullptr;
  if (loomCommInitFromEnv(&comm) != loomSuccess) {
    std::fprintf(stderr, "collective_check: init failed: %s\n", loomGetLastError(nullptr));
    return 2;
  }
  int rank = 0, nranks = 0;
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);
  std::vector<loomtest::Case> cases = loomtest::matrix(nranks, small);
  for (const loomtest::Case& c : loomtest::matrix(nranks, {big})) {
    bool typeKept = c.type == loomFloat32 || c.type == loomInt32;
    bool opKept = c.op == loomSum || c.op == loomAvg || c.op == loomMax;
    if (typeKept && opKept) cases.push_back(c);
  }
  int failures = 0;
  for (const loomtest::Case& c : cases) {
    std::string error = loomtest::runCase(c, comm, rank, memory);
    int mine = error.empty() ? 0 : 1, any = 0;
    if (!error.empty()) std::fprintf(stderr, "rank %d: FAILED %s\n", rank, error.c_str());
    if (loomAllReduce(&mine, &any, 1, loomInt32, loomMax, comm, nullptr) != loomSuccess || any) {
      failures = 1;
      break;
    }
  }
  if (rank == 0)
    std::printf("collective_check: %zu cases on %d ranks: %s\n", cases.size(), nranks, failures ? "FAILED" : "passed");
  loomCommDestroy(comm);
  return failures;
}
