// perf/options.h — the perf programs' command line: nccl-tests' flags, parsed into Options (options.cc).
#pragma once

#include <cstddef>
#include <string>

#include "loom/loom.h"

namespace perf {

// What the command line asked for.
struct Options {
  int nThreads = 1;
  size_t minBytes = 32 << 20, maxBytes = 32 << 20, stepBytes = 1 << 20;
  int stepFactor = 1;
  int iters = 20, warmupIters = 1, aggIters = 1, runCycles = 1, check = 1;
  int type = loomFloat32, op = loomSum, root = 0;  // -1: all
  int parallelInit = 0, blocking = 0, streamNull = 0, timeoutSeconds = 0, reportCpuTime = 0;
  int average = 1;  // the time reported: 0 rank 0's, 1 the mean over ranks, 2 the minimum, 3 the maximum
  int localRegister = 0;
  int unalign = 0;        // -u: shift buffers off their alignment by this many elements (send) and 3x (recv)
  int perIterTiming = 0;  // -I: time each iteration alone; report the median and the spread
  int memoryReport = 0;   // -M: print the memory the run used
  bool cuda = false;      // -D cuda: device buffers on a CUDA communicator
  std::string jsonFile;   // -J: also write the results as JSON here
  std::string commandLine;
};

// The options of `argv`; a bad flag or value ends the program with a message naming it (usageError), -h with
// the usage text.
Options parseOptions(int argc, char** argv);

// Ends the program with `message` and a pointer to -h (exit status 2), said by the job's rank 0 only.
[[noreturn]] void usageError(const std::string& message);

}  // namespace perf
