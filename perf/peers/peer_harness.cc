// perf/peers/peer_harness.cc — the sweep, timing, check and table of the peer perf programs. It follows loom's
// harness (perf/common.cc) step for step where the two are compared: every size is warmed up first, a row is
// one untimed call, a barrier, `-n` timed calls walking through the buffers (so small sizes are not timed from
// a cache a real application would not have warmed), the mean over ranks of each rank's time per call (loom's
// `-a 1`), then `-c` checks against perf/check_data.h's exact data. Cells and busbw factors are loom's.
#include "perf/peers/peer_harness.h"

#include <getopt.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "perf/check_data.h"
#include "perf/cli.h"

namespace perf {
namespace {

// ---- the collectives, as loom's perf programs describe them ----

// Sizes, input and expected output of one collective: the same shapes and check data as its loom program
// (all_reduce_perf.cc, ...), so that rows of the same -b/-e have the same sizes and values.
struct PeerCollective {
  const char* flagName;  // what -C takes
  const char* name;
  Collective collective;
  bool hasOp;
  bool hasRoot;
  CallSizes (*sizes)(size_t count, size_t eltSize, int nranks);
  void (*fillInput)(void* send, const CheckArgs& args);
  void (*fillExpected)(void* expected, const CheckArgs& args);  // all recvCount elements
};

CallSizes wholeBufferSizes(size_t count, size_t, int) { return CallSizes{count, count, count, 0, 0}; }

CallSizes allToAllSizes(size_t count, size_t eltSize, int nranks) {
  size_t block = perRankCount(count, eltSize, nranks);
  return CallSizes{block * nranks, block * nranks, block, 0, 0};
}

void reduceInput(void* send, const CheckArgs& a) {
  fillReduceInput(send, a.sizes.sendCount, a.type, a.op, a.rank, a.nranks, 0);
}
void dataInput(void* send, const CheckArgs& a) { fillData(send, a.sizes.sendCount, a.type, a.rank, 0); }
void gatheredInput(void* send, const CheckArgs& a) {
  fillData(send, a.sizes.sendCount, a.type, a.rank, a.rank * a.sizes.sendCount);
}

void allReduceExpected(void* expected, const CheckArgs& a) {
  fillReduceResult(expected, a.sizes.recvCount, a.type, a.op, a.nranks, 0);
}
void reduceScatterExpected(void* expected, const CheckArgs& a) {
  fillReduceResult(expected, a.sizes.recvCount, a.type, a.op, a.nranks, a.rank * a.sizes.recvCount);
}
void allGatherExpected(void* expected, const CheckArgs& a) {
  fillGathered(expected, a.sizes.sendCount, a.type, a.nranks);
}
void broadcastExpected(void* expected, const CheckArgs& a) { fillData(expected, a.sizes.recvCount, a.type, a.root, 0); }
// Block p of this rank's output is block `rank` of rank p's input.
void allToAllExpected(void* expected, const CheckArgs& a) {
  size_t block = a.sizes.paramCount;
  for (int p = 0; p < a.nranks; ++p) {
    fillData(static_cast<char*>(expected) + p * block * typeSize(a.type), block, a.type, p, a.rank * block);
  }
}

// clang-format off
const PeerCollective kCollectives[] = {
    {"all_reduce", "AllReduce", Collective::kAllReduce, true, false, wholeBufferSizes, reduceInput,
     allReduceExpected},
    {"reduce_scatter", "ReduceScatter", Collective::kReduceScatter, true, false, scatteredSizes, reduceInput,
     reduceScatterExpected},
    {"all_gather", "AllGather", Collective::kAllGather, false, false, gatheredSizes, gatheredInput,
     allGatherExpected},
    {"broadcast", "Broadcast", Collective::kBroadcast, false, true, wholeBufferSizes, dataInput, broadcastExpected},
    {"alltoall", "AllToAll", Collective::kAllToAll, false, false, allToAllSizes, dataInput, allToAllExpected},
};
// clang-format on

// The names -d, -o and the table use: loom's perf programs' spelling.

// ---- options ----

struct PeerOptions {
  const PeerCollective* collective = &kCollectives[0];
  size_t minBytes = 32 << 20, maxBytes = 32 << 20, stepBytes = 1 << 20;
  int stepFactor = 1, iters = 20, warmupIters = 1, check = 1, root = 0;
  loomDataType_t type = loomFloat32;
  loomRedOp_t op = loomSum;
};

const char kUsage[] =
    "usage: %s [options]   (a subset of nccl-tests' flags; sizes take K, M or G)\n"
    "  -C,--collective <all_reduce/reduce_scatter/all_gather/broadcast/alltoall>  (default all_reduce; allreduce,\n"
    "                  AllReduce, ... too)\n"
    "  -b,--minbytes <size>       smallest size (default 32M)\n"
    "  -e,--maxbytes <size>       largest size (default 32M)\n"
    "  -i,--stepbytes <size>      size increment (default 1M)\n"
    "  -f,--stepfactor <n>        size multiplier; overrides -i when > 1\n"
    "  -n,--iters <n>             timed iterations (default 20)\n"
    "  -w,--warmup_iters <n>      warm-up iterations (default 1)\n"
    "  -c,--check <n>             check the result n times per size (default 1; 0: off)\n"
    "  -d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16>  (default float)\n"
    "  -o,--op <sum/prod/max/min>  (default sum)\n"
    "  -r,--root <root>           Broadcast's root (default 0)\n"
    "  -h,--help\n"
    "Times blocking out-of-place calls, the mean over ranks of each rank's time (loom's -a 1).\n";

template <typename Enum>
Enum parseName(const char* text, const char* const* names, int count, const char* what) {
  if (std::optional<int> index = findName(text, names, count)) return static_cast<Enum>(*index);
  throw UsageError(std::string("invalid ") + what + " '" + text + "'" +
                   (strcmp(text, "all") == 0 ? ": the peer programs take one at a time" : ""));
}

PeerOptions parseOptions(int argc, char** argv) {
  const option longOptions[] = {{"collective", required_argument, nullptr, 'C'},
                                {"minbytes", required_argument, nullptr, 'b'},
                                {"maxbytes", required_argument, nullptr, 'e'},
                                {"stepbytes", required_argument, nullptr, 'i'},
                                {"stepfactor", required_argument, nullptr, 'f'},
                                {"iters", required_argument, nullptr, 'n'},
                                {"warmup_iters", required_argument, nullptr, 'w'},
                                {"check", required_argument, nullptr, 'c'},
                                {"datatype", required_argument, nullptr, 'd'},
                                {"op", required_argument, nullptr, 'o'},
                                {"root", required_argument, nullptr, 'r'},
                                {"help", no_argument, nullptr, 'h'},
                                {nullptr, 0, nullptr, 0}};
  // nccl-tests' other flags take an argument too: read them, so the refusal names the flag.
  const char kOtherNcclTestsFlags[] = "tgmNpzyTGaRJSxDVMuIK";
  std::string shortOptions = "hC:b:e:i:f:n:w:c:d:o:r:";
  for (const char* flag = kOtherNcclTestsFlags; *flag; flag++) shortOptions += std::string(1, *flag) + ":";

  PeerOptions o;
  constexpr int kBig = 1 << 30;
  const IntFlag kIntFlags[] = {{'f', &o.stepFactor, 0, kBig},
                               {'n', &o.iters, 1, kBig},
                               {'w', &o.warmupIters, 0, kBig},
                               {'c', &o.check, 0, kBig},
                               {'r', &o.root, 0, kBig}};
  optind = 1;
  for (int c; (c = getopt_long(argc, argv, shortOptions.c_str(), longOptions, nullptr)) != -1;) {
    std::string flag = std::string("-") + static_cast<char>(c);
    if (setIntFlag(kIntFlags, c, optarg)) continue;
    switch (c) {
      case 'C': {
        auto found = std::find_if(std::begin(kCollectives), std::end(kCollectives),
                                  [](const PeerCollective& p) { return sameCollectiveName(p.flagName, optarg); });
        if (found == std::end(kCollectives))
          throw UsageError(std::string("invalid collective '") + optarg +
                           "' (all_reduce, reduce_scatter, all_gather, broadcast or alltoall; any case, with or "
                           "without _)");
        o.collective = found;
        break;
      }
      case 'b':
      case 'e':
      case 'i':
        (c == 'b' ? o.minBytes : c == 'e' ? o.maxBytes : o.stepBytes) = parseSizeArg(optarg, flag.c_str());
        break;
      case 'd':
        o.type = parseName<loomDataType_t>(optarg, kTypeNames, loomNumTypes, "datatype");
        break;
      case 'o':
        o.op = parseName<loomRedOp_t>(optarg, kOpNames, loomNumOps, "op");
        break;
      case 'h':
        throw UsageError("");  // the caller prints the usage
      case '?':
        throw UsageError("invalid option");  // getopt has said which
      default:
        throw UsageError("option " + flag + " is not supported by the peer perf programs");
    }
  }
  if (optind < argc) throw UsageError(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.minBytes > o.maxBytes) {
    throw UsageError("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(o.minBytes) + " > " +
                     std::to_string(o.maxBytes));
  }
  if (o.stepFactor <= 1 && o.stepBytes == 0) throw UsageError("-i 0 with no -f > 1 would never reach -e");
  return o;
}

// ---- one rank ----

double secondsNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct FreeDeleter {
  void operator()(char* p) const { free(p); }
};
using Buffer = std::unique_ptr<char, FreeDeleter>;

// Page-aligned and touched, as loom's loomMemAlloc buffers are: no library is timed on first-touch faults or
// penalised for an unaligned buffer.
Buffer allocatePages(size_t bytes) {
  constexpr size_t kPage = 4096;
  size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  char* p = static_cast<char*>(aligned_alloc(kPage, rounded));
  if (!p) {
    fprintf(stderr, "peer perf: cannot allocate %zu bytes\n", rounded);
    exit(1);
  }
  memset(p, 0, rounded);
  return Buffer(p);
}

class PeerRunner {
 public:
  PeerRunner(const PeerOptions& options, PeerBackend& backend)
      : o_(options), test_(*options.collective), backend_(backend), rank_(backend.rank()), nranks_(backend.nranks()) {}

  // Runs every row; returns the number of rows whose check failed on some rank.
  int64_t run(const char* programName);

 private:
  struct Row {
    CallSizes sizes;
    size_t eltSize;
    size_t bytes() const { return std::max(sizes.sendCount, sizes.recvCount) * eltSize; }
  };

  Row rowFor(size_t bytes) const {
    size_t eltSize = typeSize(o_.type);
    return Row{test_.sizes(bytes / eltSize, eltSize, nranks_), eltSize};
  }
  size_t nextSize(size_t size, int factor) const {
    if (factor <= 1) return size + o_.stepBytes;
    return size == 0 ? typeSize(o_.type) : size * factor;
  }
  // The call of iteration `iter`: successive iterations walk through the buffers, as loom's harness does.
  PeerCall callAt(const Row& row, int iter) const;
  void call(const Row& row, int iter) { backend_.run(callAt(row, iter)); }
  int64_t checkOnce(const Row& row);
  std::string measure(const Row& row);
  void printHeader(const char* programName) const;

  const PeerOptions& o_;
  const PeerCollective& test_;
  PeerBackend& backend_;
  const int rank_, nranks_;
  Buffer send_, recv_, expected_;
  int64_t failedRows_ = 0;
  double busBwSum_ = 0;
  int busBwCount_ = 0;
};

PeerCall PeerRunner::callAt(const Row& row, int iter) const {
  size_t bytes = row.bytes();
  size_t steps = bytes ? std::max<size_t>(o_.maxBytes / bytes, 1) : 1;
  size_t shift = bytes * (iter % steps);
  return PeerCall{test_.collective,
                  send_.get() + shift,
                  recv_.get() + shift,
                  row.sizes.sendCount,
                  row.sizes.recvCount,
                  row.sizes.paramCount,
                  o_.type,
                  o_.op,
                  o_.root};
}

int64_t PeerRunner::checkOnce(const Row& row) {
  fillPoison(recv_.get(), row.sizes.recvCount, o_.type);  // an element left unwritten counts as wrong
  CheckArgs args{row.sizes, o_.type, o_.op, o_.root, rank_, nranks_};
  test_.fillInput(send_.get(), args);
  test_.fillExpected(expected_.get(), args);
  call(row, 0);
  double tolerance = test_.hasOp ? reduceTolerance(o_.type, o_.op, nranks_) : 0;
  return countWrong(recv_.get(), expected_.get(), row.sizes.recvCount, o_.type, tolerance);
}

std::string PeerRunner::measure(const Row& row) {
  if (o_.check > 0) {  // defined input for the timed calls too: no denormals, no NaN
    CheckArgs args{row.sizes, o_.type, o_.op, o_.root, rank_, nranks_};
    test_.fillInput(send_.get(), args);
  }
  for (int iter = 0; iter < o_.iters; iter++) backend_.prepare(callAt(row, iter));
  call(row, 0);
  backend_.barrier();
  double start = secondsNow();
  for (int iter = 0; iter < o_.iters; iter++) call(row, iter);
  double seconds = backend_.sumOverRanks((secondsNow() - start) / o_.iters) / nranks_;
  double algBw = seconds > 0 ? static_cast<double>(row.bytes()) / 1e9 / seconds : 0;
  double busBw = algBw * busBandwidthFactor(test_.collective, nranks_);
  backend_.barrier();

  double wrong = 0;
  for (int c = 0; c < o_.check && wrong == 0; c++) {
    int64_t mine = checkOnce(row);
    if (mine) failedRows_++;
    wrong = backend_.sumOverRanks(static_cast<double>(mine));
  }
  busBwSum_ += busBw;
  busBwCount_++;
  char wrongCell[32] = "   N/A";
  if (o_.check > 0) snprintf(wrongCell, sizeof(wrongCell), "%6g", wrong);
  return "  " + formatCell(seconds * 1e6, 7) + "  " + formatCell(algBw, 6) + "  " + formatCell(busBw, 6) + "  " +
         wrongCell;
}

void PeerRunner::printHeader(const char* programName) const {
  printf("# loom peer perf (perf/peers): %s\n", backend_.description().c_str());
  printf("# Collective test starting: %s -C %s (%s)\n", programName, test_.flagName, test_.name);
  printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: 1 "
      "validation: %d graph: 0\n",
      o_.minBytes, o_.maxBytes, o_.stepFactor > 1 ? static_cast<size_t>(o_.stepFactor) : o_.stepBytes,
      o_.stepFactor > 1 ? "factor" : "bytes", o_.warmupIters, o_.iters, o_.check);
  printf("# nRanks %d, blocking out-of-place calls, time: mean over ranks\n", nranks_);
  printf("#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "",
         "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
         "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
         "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

int64_t PeerRunner::run(const char* programName) {
  size_t bufferBytes = std::max<size_t>(o_.maxBytes, 64);
  send_ = allocatePages(bufferBytes);
  recv_ = allocatePages(bufferBytes);
  if (o_.check > 0) expected_ = allocatePages(bufferBytes);
  if (rank_ == 0) printHeader(programName);

  backend_.barrier();
  for (size_t size = o_.minBytes; size <= o_.maxBytes; size = nextSize(size, 2)) {  // warm every size up
    Row row = rowFor(size);
    backend_.startRow();
    for (int iter = 0; iter < o_.warmupIters; iter++) call(row, iter);
  }
  for (size_t size = o_.minBytes; size <= o_.maxBytes; size = nextSize(size, o_.stepFactor)) {
    Row row = rowFor(size);
    backend_.startRow();
    char preamble[128];
    snprintf(preamble, sizeof(preamble), "%12zu  %12zu  %8s  %6s  %6d", row.bytes(), row.sizes.paramCount,
             kTypeNames[o_.type], test_.hasOp ? kOpNames[o_.op] : "none", test_.hasRoot ? o_.root : -1);
    std::string line = preamble + measure(row) + "      N/A     N/A     N/A     N/A";
    if (rank_ == 0) printf("%s\n", line.c_str());
  }
  backend_.startRow();
  int64_t failed = static_cast<int64_t>(backend_.sumOverRanks(static_cast<double>(failedRows_)));
  if (rank_ == 0) {
    printf("# %-20s : %lld %s\n", "Out of bounds values", static_cast<long long>(failed), failed ? "FAILED" : "OK");
    printf("# %-20s : %g \n", "Avg bus bandwidth", busBwCount_ ? busBwSum_ / busBwCount_ : 0);
    printf("#\n# Collective test concluded: %s -C %s\n#\n", programName, test_.flagName);
  }
  return failed;
}

}  // namespace

int runPeerTest(int argc, char** argv, PeerBackend& backend) {
  setlinebuf(stdout);
  const char* slash = strrchr(argv[0], '/');
  const char* programName = slash ? slash + 1 : argv[0];
  PeerOptions options;
  try {
    options = parseOptions(argc, argv);
    if (options.collective->hasRoot && options.root >= backend.nranks()) {
      throw UsageError("invalid root " + std::to_string(options.root) + " for " + std::to_string(backend.nranks()) +
                       " ranks");
    }
    std::string why = backend.unsupported(options.collective->collective, options.type, options.op);
    if (!why.empty()) throw UsageError(why);
  } catch (const UsageError& error) {
    // Every rank sees the same command line; one message is enough.
    if (backend.rank() == 0) {
      if (*error.what()) {
        fprintf(stderr, "%s: %s (see -h)\n", programName, error.what());
      } else {
        printf(kUsage, programName);
      }
    }
    return *error.what() ? 2 : 0;
  }
  PeerRunner runner(options, backend);
  return runner.run(programName) ? 1 : 0;
}

}  // namespace perf
