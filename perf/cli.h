// perf/cli.h — what loom's programs share in reading their command line: the perf programs and the peer programs
// (perf/peers/) read the same flags the same way and print identical cells; they and the tools (loom-train,
// loom-tune, loom-sim, ...) check output paths before they work and say a refused command line once per job.
#ifndef LOOM_PERF_CLI_H_
#define LOOM_PERF_CLI_H_

#include <loom/loom.h>

#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

namespace perf {

// Names of types and operators as -d, -o and the table spell them (nccl-tests' names).
extern const char* const kTypeNames[loomNumTypes];
extern const char* const kOpNames[loomNumOps];

// A command line that cannot run: what() says which flag or value was wrong.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The value of flag `name`: an integer in [min, max] (decimal, 0x hex or 0 octal). Throws UsageError otherwise.
int parseIntArg(const char* text, const char* name, int min, int max);
// A flag that sets one int within [min, max].
struct IntFlag {
  char letter;
  int* value;
  int min, max;
};
// Sets the flag of `letter` among `flags` from `text` (throwing UsageError for a bad value); false when `letter`
// is none of them.
bool setIntFlag(std::span<const IntFlag> flags, int letter, const char* text);

// "64", "1.5K", "256M", "2G": a byte count with an optional binary suffix. Throws UsageError when malformed.
size_t parseSizeArg(const char* text, const char* name);
// Whether two collective names are the same one: case, "_" and "-" aside ("all_reduce", "AllReduce", "allreduce"),
// as loom's tools read them (algorithms/plan.h, parseCollectiveName).
bool sameCollectiveName(const char* a, const char* b);
// The index of `text` in names[0..count), or nothing.
std::optional<int> findName(const char* text, const char* const* names, int count);

// This process's rank under a launcher (loomrun, torchrun, Open MPI, MPICH, Slurm), read from the launcher's
// variables before any communicator exists; 0 without one.
int launcherRank();
// Whether a launcher started this process as one rank of many.
bool underLauncher();

// Whether `path` can be written as an output file: it is not a directory, its folder exists and is writable, and
// an existing file there is writable. Nothing is created. False with *why naming the path and the reason.
bool checkOutputPath(const std::string& path, std::string* why);

// "program: message" on stderr, from the job's rank 0 only (every rank of a job reads the same command line and
// would say the same), then exit(status).
[[noreturn]] void exitOnce(const char* program, const std::string& message, int status = 2);

// nccl-tests' number cells: as many decimals as fit in `width`, then exponent notation.
std::string formatCell(double value, int width);

}  // namespace perf

#endif  // LOOM_PERF_CLI_H_
