// loom-train's command line (options.h).
#include "tools/train/options.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "parallel/plan/accounting.h"
#include "perf/cli.h"

namespace loom::train {

using namespace loom::parallel;

[[noreturn]] void usage(const char* problem) {
  if (problem != nullptr) perf::exitOnce("loom-train", std::string(problem) + " (see --help)");
  std::fprintf(
      stderr,
      "usage: loom-train [--model gpt-tiny|gpt2-124m|moe-tiny] [--layers L] [--device cpu|cuda]\n"
      "                  [--dtype fp32|bf16] [--ep N] [--capacity-factor X] [--drop-policy position|probability]\n"
      "                  [--ep-dispatch alltoallv|ep-normal|ep-low-latency]\n"
      "                  [--tp N] [--sp] [--dp N] [--zero 0|1|2|3]\n"
      "                  [--pp N] [--pp-schedule gpipe|1f1b|interleaved|zb-h1] [--pp-chunks V]\n"
      "                  [--pp-timeline FILE.png|FILE.txt] [--steps N] [--batch B]\n"
      "                  [--seq T] [--accumulation K] [--lr X] [--seed S] [--data synthetic|FILE]\n"
      "                  [--tokenizer byte|char] [--log-every N] [--metrics FILE.csv|FILE.json]\n"
      "                  [--plot FILE.png|FILE.svg] [--save FILE] [--save-every N] [--resume FILE]\n"
      "                  [--eval-every N] [--eval-batches K] [--deterministic]\n");
  std::exit(0);
}

namespace {

int intArg(const char* text, const char* name, int min, int max) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min || value > max) {
    std::string message = std::string("--") + name + " " + text + ": expected an integer from " + std::to_string(min) +
                          " to " + std::to_string(max);
    usage(message.c_str());
  }
  return static_cast<int>(value);
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  static const option longOptions[] = {{"model", required_argument, nullptr, 'm'},
                                       {"layers", required_argument, nullptr, 'n'},
                                       {"ep", required_argument, nullptr, 'E'},
                                       {"capacity-factor", required_argument, nullptr, 'c'},
                                       {"drop-policy", required_argument, nullptr, 'x'},
                                       {"ep-dispatch", required_argument, nullptr, 'X'},
                                       {"device", required_argument, nullptr, 'G'},
                                       {"dtype", required_argument, nullptr, 'y'},
                                       {"dp", required_argument, nullptr, 'd'},
                                       {"tp", required_argument, nullptr, 'P'},
                                       {"sp", no_argument, nullptr, 'Q'},
                                       {"pp", required_argument, nullptr, 'Y'},
                                       {"pp-schedule", required_argument, nullptr, 'H'},
                                       {"pp-chunks", required_argument, nullptr, 'C'},
                                       {"pp-timeline", required_argument, nullptr, 'I'},
                                       {"zero", required_argument, nullptr, 'z'},
                                       {"steps", required_argument, nullptr, 's'},
                                       {"batch", required_argument, nullptr, 'b'},
                                       {"seq", required_argument, nullptr, 't'},
                                       {"accumulation", required_argument, nullptr, 'a'},
                                       {"lr", required_argument, nullptr, 'l'},
                                       {"seed", required_argument, nullptr, 'S'},
                                       {"data", required_argument, nullptr, 'D'},
                                       {"tokenizer", required_argument, nullptr, 'k'},
                                       {"log-every", required_argument, nullptr, 'L'},
                                       {"metrics", required_argument, nullptr, 'M'},
                                       {"plot", required_argument, nullptr, 'p'},
                                       {"save", required_argument, nullptr, 'o'},
                                       {"save-every", required_argument, nullptr, 'e'},
                                       {"resume", required_argument, nullptr, 'r'},
                                       {"eval-every", required_argument, nullptr, 'v'},
                                       {"eval-batches", required_argument, nullptr, 'V'},
                                       {"deterministic", no_argument, nullptr, 'R'},
                                       {"help", no_argument, nullptr, 'h'},
                                       {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longOptions, nullptr)) != -1;) {
    switch (c) {
      case 'm':
        o.model = optarg;
        break;
      case 'n':
        o.layers = intArg(optarg, "layers", 1, 1 << 12);
        break;
      case 'E':
        o.ep = intArg(optarg, "ep", 1, 1 << 12);
        break;
      case 'c': {
        char* end = nullptr;
        o.capacityFactor = std::strtof(optarg, &end);
        if (end == optarg || *end != '\0' || !(o.capacityFactor >= 0))
          usage("--capacity-factor: expected a number, 0 or more (0: no capacity)");
        break;
      }
      case 'x':
        o.dropPolicy = optarg;
        if (o.dropPolicy != "position" && o.dropPolicy != "probability")
          usage("--drop-policy: position or probability");
        break;
      case 'X':
        o.epDispatch = optarg;
        break;
      case 'G':
        o.device = optarg;
        break;
      case 'y':
        o.dtype = optarg;
        break;
      case 'd':
        o.dp = intArg(optarg, "dp", 1, 1 << 16);
        break;
      case 'P':
        o.tp = intArg(optarg, "tp", 1, 1 << 16);
        break;
      case 'Q':
        o.sequenceParallel = true;
        break;
      case 'R':
        o.deterministic = true;
        break;
      case 'Y':
        o.pp = intArg(optarg, "pp", 1, 1 << 16);
        break;
      case 'H':
        o.ppSchedule = optarg;
        break;
      case 'C':
        o.ppChunks = intArg(optarg, "pp-chunks", 1, 1 << 10);
        break;
      case 'I':
        o.ppTimeline = optarg;
        break;
      case 'z':
        o.zero = intArg(optarg, "zero", 0, 3);
        break;
      case 's':
        o.steps = intArg(optarg, "steps", 1, 1 << 30);
        break;
      case 'b':
        o.batch = intArg(optarg, "batch", 1, 1 << 16);
        break;
      case 't':
        o.seq = intArg(optarg, "seq", 1, 1 << 20);
        break;
      case 'a':
        o.accumulation = intArg(optarg, "accumulation", 1, 1 << 16);
        break;
      case 'l': {
        char* end = nullptr;
        o.learningRate = std::strtof(optarg, &end);
        if (end == optarg || *end != '\0' || !(o.learningRate > 0)) usage("--lr: expected a positive number");
        break;
      }
      case 'S':
        o.seed = static_cast<uint64_t>(intArg(optarg, "seed", 0, 1 << 30));
        break;
      case 'D':
        o.data = optarg;
        break;
      case 'k':
        o.tokenizer = optarg;
        break;
      case 'L':
        o.logEvery = intArg(optarg, "log-every", 1, 1 << 30);
        break;
      case 'M':
        o.metrics = optarg;
        break;
      case 'p':
        o.plot = optarg;
        break;
      case 'o':
        o.save = optarg;
        break;
      case 'e':
        o.saveEvery = intArg(optarg, "save-every", 1, 1 << 30);
        break;
      case 'v':
        o.evalEvery = intArg(optarg, "eval-every", 1, 1 << 30);
        break;
      case 'V':
        o.evalBatches = intArg(optarg, "eval-batches", 1, 1 << 20);
        break;
      case 'r':
        o.resume = optarg;
        break;
      case 'h':
        usage(nullptr);
      default:
        usage("unknown option");
    }
  }
  if (optind < argc) usage((std::string("unexpected argument ") + argv[optind]).c_str());
  if (o.tokenizer != "byte" && o.tokenizer != "char") usage("--tokenizer: byte or char");
  if (o.device != "cpu" && o.device != "cuda") usage("--device: cpu or cuda");
  if (o.dtype.empty()) o.dtype = o.device == "cuda" ? "bf16" : "fp32";
  if (o.dtype != "fp32" && o.dtype != "bf16") usage("--dtype: fp32 or bf16");
  if (o.sequenceParallel && o.tp == 1)
    usage("--sp: sequence parallelism goes with tensor parallelism (--tp 2 or more)");
  if (o.device == "cpu" && o.dtype != "fp32")
    usage("--dtype bf16: the CPU kernels compute in fp32 (bf16 is for --device cuda)");
  if (!o.metrics.empty() && !o.metrics.ends_with(".csv") && !o.metrics.ends_with(".json"))
    usage("--metrics: a file name ending in .csv or .json");
  plan::Schedule schedule;
  if (!plan::parseSchedule(o.ppSchedule, &schedule)) usage("--pp-schedule: gpipe, 1f1b, interleaved or zb-h1");
  if (o.ppChunks == 0) o.ppChunks = schedule == plan::Schedule::kInterleaved ? 2 : 1;
  if (o.pp > 1 && o.zero >= 2)
    usage(
        "--zero 2 and 3 shard gradients unit by unit as backward releases them, which a pipeline's interleaved "
        "micro-batches do not allow: with --pp use --zero 0 or 1");
  if (o.ep > 1 && o.zero != 0) usage("--ep: experts spread over expert-parallel ranks train with DDP (--zero 0)");
  if (o.pp > 1 && o.evalEvery > 0) usage("--eval-every runs the whole model on each rank: not with --pp");
  if (!o.ppTimeline.empty() && (o.pp == 1 || (!o.ppTimeline.ends_with(".png") && !o.ppTimeline.ends_with(".txt"))))
    usage("--pp-timeline: a file name ending in .png or .txt, with --pp 2 or more");
  if (!o.plot.empty() && !o.plot.ends_with(".png") && !o.plot.ends_with(".svg"))
    usage("--plot: a file name ending in .png or .svg");
  // Every output is checked before the run, not found unwritable at its end.
  const std::pair<const char*, const std::string*> outputs[] = {
      {"--metrics", &o.metrics}, {"--plot", &o.plot}, {"--save", &o.save}, {"--pp-timeline", &o.ppTimeline}};
  for (const auto& [flag, path] : outputs) {
    std::string why;
    if (!path->empty() && !perf::checkOutputPath(*path, &why)) usage((std::string(flag) + " " + why).c_str());
  }
  if (o.saveEvery > 0 && o.save.empty()) usage("--save-every: with --save FILE");
  return o;
}

}  // namespace loom::train
