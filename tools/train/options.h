// loom-train's command line (loom-train.cc describes the program): its flags, parsed into Options (options.cc).
#pragma once

#include <cstdint>
#include <string>

namespace loom::train {

struct Options {
  std::string model = "gpt-tiny";
  bool deterministic = false;  // communicators that reduce in rank order (LOOM_DETERMINISTIC)
  int layers = 0;  // 0: the preset's
  std::string device = "cpu";
  std::string dtype;  // "": fp32 on the CPU, bf16 on CUDA
  int dp = 0;         // 0: the world size over tp
  int tp = 1;
  bool sequenceParallel = false;
  int pp = 1;
  int ep = 1;
  float capacityFactor = -1;  // below 0: the model's
  std::string dropPolicy;     // "": the model's
  std::string epDispatch;     // "": alltoallv
  std::string ppSchedule = "1f1b";
  int ppChunks = 0;  // 0: 2 for the interleaved schedule, else 1
  std::string ppTimeline;
  int zero = 0;
  int steps = 100;
  int batch = 4;  // sequences per rank per micro-batch
  int seq = 0;    // 0: the model's maxT
  int accumulation = 1;
  float learningRate = 1e-3f;
  uint64_t seed = 1;
  std::string data = "synthetic";
  std::string tokenizer = "byte";
  int logEvery = 10;
  std::string metrics, plot, save, resume;
  int saveEvery = 0;
  int evalEvery = 0;  // text data: the validation loss every N steps (0: never)
  int evalBatches = 8;
};

// `problem` on stderr (from the job's rank 0 only) and exit status 2; without one the usage text and status 0.
[[noreturn]] void usage(const char* problem);

// The options of `argv`; a bad flag or value ends the program with a message naming it (usage).
Options parse(int argc, char** argv);

}  // namespace loom::train
