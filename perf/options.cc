// perf/options.cc — the perf programs' command line (options.h): every flag of nccl-tests, those loom has parsed
// and checked, the CUDA-only ones it has not refused by name.
#include "perf/options.h"

#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "perf/cli.h"
#include "perf/cuda_buffers.h"

namespace perf {

[[noreturn]] void usageError(const std::string& message) {
  exitOnce(program_invocation_short_name, message + " (see -h)");  // glibc: the program's name
}

namespace {


const char kUsage[] =
    "usage: %s [options]   (nccl-tests flags; sizes take K, M or G)\n"
    "  -t,--nthreads <n>          ranks as threads of this process (only without a launcher)\n"
    "  -g,--ngpus <1>             devices per thread: 1 on host\n"
    "  -b,--minbytes <size>       smallest size (default 32M)\n"
    "  -e,--maxbytes <size>       largest size (default 32M)\n"
    "  -i,--stepbytes <size>      size increment (default 1M)\n"
    "  -f,--stepfactor <n>        size multiplier; overrides -i when > 1\n"
    "  -n,--iters <n>             timed iterations (default 20)\n"
    "  -m,--agg_iters <n>         calls fused in one group per iteration (default 1)\n"
    "  -w,--warmup_iters <n>      warm-up iterations (default 1)\n"
    "  -N,--run_cycles <n>        run the size sweep n times (0: forever; default 1)\n"
    "  -p,--parallel_init <0/1>   ranks initialise concurrently (always so here)\n"
    "  -c,--check <n>             check the result n times per size (default 1; 0: off)\n"
    "  -o,--op <sum/prod/max/min/avg/all>\n"
    "  -d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/all>\n"
    "  -r,--root <root>           -1: every root in turn\n"
    "  -z,--blocking <0/1/2/3>    1: wait and barrier after each call, 2: wait only, 3: barrier after each\n"
    "                             iteration, excluded from the time\n"
    "  -y,--stream_null <0/1>     1: blocking calls (NULL stream) instead of a host stream\n"
    "  -T,--timeout <s>           end the program when one size runs longer than s seconds\n"
    "  -C,--report_cputime <0/1>  report the time to issue the calls instead of the time to complete them\n"
    "  -a,--average <0/1/2/3>     time reported: 0 rank 0's, 1 mean over ranks, 2 minimum, 3 maximum\n"
    "  -R,--local_register <0/1>  register the buffers with loomCommRegister\n"
    "  -u,--unalign <n>           shift the send buffer n elements and the receive buffer 3n elements off their\n"
    "                             alignment (default 0)\n"
    "  -I,--per_iter_timing <0/1> time every iteration on its own: the row shows the median, a comment line the\n"
    "                             minimum, median and maximum (and -J all of them)\n"
    "  -M,--memory <0/1>          report the memory used: buffers, the process's resident and peak sizes\n"
    "  -J,--output_file <file>    also write every row as JSON to <file> (rank 0)\n"
    "  -D,--device <host/cuda>    where the buffers live (host; cuda needs a CUDA build and a device)\n"
    "  -h,--help\n"
    "Not available on host: -G (CUDA graphs), -g > 1, -R 2, -S, -x, -V, -K.\n";

// A name from `names`, or -1 for "all".
int parseName(const char* text, const char* const* names, int count, const char* what) {
  if (std::optional<int> index = findName(text, names, count)) return *index;
  if (strcmp(text, "all") == 0) return -1;
  usageError(std::string("invalid ") + what + " '" + text + "'");
}

// Every flag of nccl-tests, with its long name; those parseOptions does not handle are refused by name.
struct Flag {
  char letter;
  const char* name;
};
// clang-format off
constexpr Flag kFlags[] = {
    {'t', "nthreads"},     {'g', "ngpus"},          {'b', "minbytes"},      {'e', "maxbytes"},
    {'i', "stepbytes"},    {'f', "stepfactor"},     {'n', "iters"},         {'m', "agg_iters"},
    {'w', "warmup_iters"}, {'N', "run_cycles"},     {'p', "parallel_init"}, {'c', "check"},
    {'o', "op"},           {'d', "datatype"},       {'r', "root"},          {'z', "blocking"},
    {'y', "stream_null"},  {'T', "timeout"},        {'G', "cudagraph"},     {'C', "report_cputime"},
    {'a', "average"},      {'R', "local_register"}, {'J', "output_file"},   {'S', "report_timestamps"},
    {'x', "cta_policy"},   {'D', "device"}, {'V', "device_cta_count"}, {'M', "memory"},
    {'u', "unalign"},      {'I', "per_iter_timing"}, {'K', "per_iter_skip"}};
// clang-format on

}  // namespace

Options parseOptions(int argc, char** argv) {
  std::vector<option> longOptions;
  std::string shortOptions = "h";
  for (const Flag& flag : kFlags) {
    longOptions.push_back(option{flag.name, required_argument, nullptr, flag.letter});
    shortOptions += std::string(1, flag.letter) + ":";
  }
  longOptions.push_back(option{"help", no_argument, nullptr, 'h'});
  longOptions.push_back(option{nullptr, 0, nullptr, 0});

  Options o;
  constexpr int kBig = 1 << 30;
  const IntFlag kIntFlags[] = {
      {'t', &o.nThreads, 1, 1024},   {'f', &o.stepFactor, 0, kBig},  {'n', &o.iters, 1, kBig},
      {'m', &o.aggIters, 1, kBig},   {'w', &o.warmupIters, 0, kBig}, {'N', &o.runCycles, 0, kBig},
      {'p', &o.parallelInit, 0, 1},  {'c', &o.check, 0, kBig},       {'r', &o.root, -1, kBig},
      {'z', &o.blocking, 0, 3},      {'y', &o.streamNull, 0, 1},     {'T', &o.timeoutSeconds, 0, kBig},
      {'C', &o.reportCpuTime, 0, 1}, {'a', &o.average, 0, 3},        {'R', &o.localRegister, 0, 2},
      {'u', &o.unalign, 0, 4096},    {'I', &o.perIterTiming, 0, 1},  {'M', &o.memoryReport, 0, 1}};
  for (int c; (c = getopt_long(argc, argv, shortOptions.c_str(), longOptions.data(), nullptr)) != -1;) {
    if (setIntFlag(kIntFlags, c, optarg)) continue;
    std::string flagName = std::string("-") + static_cast<char>(c);
    if (c == 'b' || c == 'e' || c == 'i') {
      (c == 'b' ? o.minBytes : c == 'e' ? o.maxBytes : o.stepBytes) = parseSizeArg(optarg, flagName.c_str());
    } else if (c == 'o') {
      if (strcmp(optarg, "mulsum") == 0) usageError("-o mulsum: loom has no pre-multiplied sum operator");
      o.op = parseName(optarg, kOpNames, loomNumOps, "op");
    } else if (c == 'd') {
      o.type = parseName(optarg, kTypeNames, loomNumTypes, "datatype");
    } else if (c == 'g') {
      parseIntArg(optarg, "-g (host ranks have one device each)", 1, 1);
    } else if (c == 'G') {
      if (parseIntArg(optarg, "-G", 0, kBig) > 0)
        usageError("-G: CUDA graphs need a CUDA communicator; host runs take -G 0");
    } else if (c == 'J') {
      std::string why;
      if (!checkOutputPath(optarg, &why)) usageError("-J " + std::string(optarg) + ": " + why);
      o.jsonFile = optarg;
    } else if (c == 'D') {
      std::string why;
      if (strcmp(optarg, "cuda") == 0 && !cuda::available(&why)) usageError("-D cuda: " + why + "; run with -D host");
      if (strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0)
        usageError(std::string("invalid device '") + optarg + "' (host or cuda)");
      o.cuda = strcmp(optarg, "cuda") == 0;
    } else if (c == 'h') {
      printf(kUsage, argv[0]);
      exit(0);
    } else if (c == '?') {
      usageError("invalid option");  // getopt has said which
    } else {
      usageError("option " + flagName + " is not supported by loom's perf tests");
    }
  }
  if (o.localRegister == 2) usageError("-R 2: symmetric registration needs CUDA");
  if (o.localRegister && o.cuda) usageError("-R with -D cuda: loom registers host memory only, for now");
  if (optind < argc) usageError(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.minBytes > o.maxBytes) {
    usageError("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(o.minBytes) + " > " +
               std::to_string(o.maxBytes));
  }
  if (o.stepFactor <= 1 && o.stepBytes == 0) usageError("-i 0 with no -f > 1 would never reach -e");
  for (int i = 0; i < argc; i++) o.commandLine += (i ? " " : "") + std::string(argv[i]);
  return o;
}

}  // namespace perf
