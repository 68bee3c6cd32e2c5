// perf/common.h — the harness shared by loom's perf programs (all_reduce_perf, ...), which take the flags and
// print the table of NVIDIA's nccl-tests so that results and scripts carry over. A program describes one
// collective in a CollectiveTest (buffer sizes, the call, its input and expected output) and hands it to
// runPerfTest, which parses the command line, creates the communicators, times, checks and reports.
// Uses only the public API <loom/loom.h>. Host buffers only: the CUDA-only flags (-G, -g > 1) are refused.
#ifndef LOOM_PERF_COMMON_H_
#define LOOM_PERF_COMMON_H_

#include <loom/loom.h>

#include <cstddef>
#include <cstdint>

namespace perf {

// The collectives of the suite; each has its bus bandwidth factor in busBandwidthFactor.
enum class Collective {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,
  kGather,
  kScatter
};

// busbw = algbw * factor: the share of the data each rank must move over its busiest link, so that a busbw
// figure can be compared with the hardware's link bandwidth whatever the rank count (nccl-tests' PERFORMANCE.md).
double busBandwidthFactor(Collective collective, int nranks);

// Elements of one call for a row of the table whose size is `count` elements of the chosen type.
struct CallSizes {
  size_t sendCount;          // elements this rank's send buffer holds
  size_t recvCount;          // elements this rank's receive buffer holds
  size_t paramCount;         // the count argument of the call
  size_t sendInPlaceOffset;  // in place: send = recv + sendInPlaceOffset * rank
  size_t recvInPlaceOffset;  // in place: recv = recv buffer + recvInPlaceOffset * rank
};

// The per-rank count of collectives that split `count` over the ranks, rounded down to 16 bytes as nccl-tests
// does, so the same -b/-e give the same rows.
size_t perRankCount(size_t count, size_t eltSize, int nranks);

// Sizes of the two shapes most collectives share, for a row of `count` elements split over `nranks` blocks:
// gathered (each rank sends a block, receives all n; in place at block `rank`: AllGather, Gather) and
// scattered (each rank sends n blocks, receives one; in place at block `rank`: ReduceScatter, Scatter).
CallSizes gatheredSizes(size_t count, size_t eltSize, int nranks);
CallSizes scatteredSizes(size_t count, size_t eltSize, int nranks);

// Everything one call needs.
struct CallArgs {
  const void* send;
  void* recv;
  size_t count;  // CallSizes::paramCount
  loomDataType_t type;
  loomRedOp_t op;
  int root;
  int rank;
  int nranks;
  loomComm_t comm;
  loomStream_t stream;
};

// Where check data comes from: the input of `rank` and the output the collective must produce on `rank`.
struct CheckArgs {
  const CallSizes& sizes;
  loomDataType_t type;
  loomRedOp_t op;
  int root;
  int rank;
  int nranks;
};

struct CollectiveTest {
  const char* name;  // e.g. "AllReduce", for messages
  Collective collective;
  bool hasOp;       // takes a reduction operator: -o applies, "all" loops over them; otherwise redop "none"
  bool hasRoot;     // has a root: -r applies, -r -1 loops over all roots; otherwise root -1
  bool hasInPlace;  // has an in-place form (loomAllToAll does not)
  CallSizes (*sizes)(size_t count, size_t eltSize, int nranks);
  loomResult_t (*run)(const CallArgs& args);
  // Writes this rank's sendCount input elements at `send` (with the fill functions of perf/check_data.h).
  void (*fillInput)(void* send, const CheckArgs& args);
  // Writes the expected recv buffer at `expected`; returns how many elements to compare (0: recv is unused).
  size_t (*fillExpected)(void* expected, const CheckArgs& args);
  // The call is itself several groups in order (hypercube_perf's rounds): -m > 1 would merge them into the
  // harness's group and time a different, unordered pattern, so it is refused.
  bool ordersItsGroups = false;
};

// Check data of the gathered shape (AllGather, Hypercube, Gather): rank r's input is block r of the whole, which
// every rank (Gather: the root) must end up holding in rank order.
void fillGatheredInput(void* send, const CheckArgs& args);
size_t fillGatheredExpected(void* expected, const CheckArgs& args);

// Runs the whole program: call it from main. Returns the process exit code.
int runPerfTest(int argc, char** argv, const CollectiveTest& test);

}  // namespace perf

#endif  // LOOM_PERF_COMMON_H_
