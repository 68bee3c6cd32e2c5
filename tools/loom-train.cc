// loom-train: trains the reference GPT with data parallelism (DDP, or ZeRO stage 1, 2 or 3) on loom, on the CPU
// (fp32) or on CUDA devices (--device cuda: bf16 with fp32 master weights, or fp32).
//
//   loomrun -n 2 build/tools/loom-train --model gpt-tiny --dp 2 --zero 2 --steps 300 --data synthetic
//
// Under a launcher each process is a rank (loomCommInitFromEnv); without one it runs as one rank. It prints a header
// (model, parallel layout, memory per rank, data), a progress line every --log-every steps, and a final summary;
// rank 0 writes the metrics (--metrics FILE.csv or FILE.json), a PNG of the loss curve (--plot FILE.png, through
// gnuplot) and checkpoints (--save FILE, every --save-every steps and at the end, atomically). --resume FILE
// continues a run from its checkpoint: the same batches follow, so the losses are bit for bit those of a run that
// never stopped. On the CPU each rank computes on one thread (OPENBLAS_NUM_THREADS, when set, gives its GEMMs more);
// on CUDA, local rank r uses device r modulo the devices it sees, over a CUDA communicator.
#include <cblas.h>
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "parallel/check.h"
#include "parallel/kernels/ops.h"
#include "parallel/mesh/mesh.h"
#include "parallel/model/checkpoint.h"
#include "parallel/model/gpt.h"
#include "parallel/strategies/ddp.h"
#include "parallel/strategies/zero.h"
#include "parallel/train/data.h"
#ifdef LOOM_PARALLEL_CUDA
#include "parallel/kernels/cuda/ops.h"
#endif

namespace {

using namespace loom::parallel;

struct Options {
  std::string model = "gpt-tiny";
  std::string device = "cpu";
  std::string dtype;  // "": fp32 on the CPU, bf16 on CUDA
  int dp = 0;         // 0: the world size over tp
  int tp = 1;
  bool sequenceParallel = false;
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

[[noreturn]] void usage(const char* problem) {
  if (problem != nullptr) std::fprintf(stderr, "loom-train: %s\n", problem);
  std::fprintf(stderr,
               "usage: loom-train [--model gpt-tiny|gpt2-124m] [--device cpu|cuda] [--dtype fp32|bf16]\n"
               "                  [--tp N] [--sp] [--dp N] [--zero 0|1|2|3] [--steps N] [--batch B]\n"
               "                  [--seq T] [--accumulation K] [--lr X] [--seed S] [--data synthetic|FILE]\n"
               "                  [--tokenizer byte|char] [--log-every N] [--metrics FILE.csv|FILE.json]\n"
               "                  [--plot FILE.png] [--save FILE] [--save-every N] [--resume FILE]\n"
               "                  [--eval-every N] [--eval-batches K]\n");
  std::exit(problem != nullptr ? 2 : 0);
}

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

Options parse(int argc, char** argv) {
  Options o;
  static const option longOptions[] = {{"model", required_argument, nullptr, 'm'},
                                       {"device", required_argument, nullptr, 'G'},
                                       {"dtype", required_argument, nullptr, 'y'},
                                       {"dp", required_argument, nullptr, 'd'},
                                       {"tp", required_argument, nullptr, 'P'},
                                       {"sp", no_argument, nullptr, 'Q'},
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
                                       {"help", no_argument, nullptr, 'h'},
                                       {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longOptions, nullptr)) != -1;) {
    switch (c) {
      case 'm':
        o.model = optarg;
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
  return o;
}

std::string humanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", bytes, units[unit]);
  return text;
}

std::string duration(double seconds) {
  char text[32];
  const long whole = std::lround(seconds);
  if (whole >= 3600)
    std::snprintf(text, sizeof(text), "%ldh%02ldm", whole / 3600, whole / 60 % 60);
  else
    std::snprintf(text, sizeof(text), "%ldm%02lds", whole / 60, whole % 60);
  return text;
}

struct Metric {
  int step;
  float loss;
  double milliseconds, tokensPerSecond;
  float validationLoss;  // NaN: not evaluated at this step
};

void writeMetrics(const std::string& path, const std::vector<Metric>& metrics) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    std::fprintf(stderr, "loom-train: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return;
  }
  const bool json = path.ends_with(".json");
  if (json)
    std::fprintf(file, "[\n");
  else
    std::fprintf(file, "step,loss,ms_per_step,tokens_per_s,val_loss\n");
  for (size_t i = 0; i < metrics.size(); ++i) {
    const Metric& m = metrics[i];
    char validation[32] = "";
    if (!std::isnan(m.validationLoss)) std::snprintf(validation, sizeof(validation), "%.9g", m.validationLoss);
    if (json)
      std::fprintf(file,
                   "  {\"step\": %d, \"loss\": %.9g, \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, "
                   "\"val_loss\": %s}%s\n",
                   m.step, m.loss, m.milliseconds, m.tokensPerSecond, validation[0] ? validation : "null",
                   i + 1 < metrics.size() ? "," : "");
    else
      std::fprintf(file, "%d,%.9g,%.3f,%.1f,%s\n", m.step, m.loss, m.milliseconds, m.tokensPerSecond, validation);
  }
  if (json) std::fprintf(file, "]\n");
  std::fclose(file);
}

void plotLoss(const std::string& path, const std::vector<Metric>& metrics, double floor) {
  const std::string data = path + ".dat", validation = path + ".val.dat";
  FILE* file = std::fopen(data.c_str(), "w");
  FILE* validationFile = std::fopen(validation.c_str(), "w");
  if (file == nullptr || validationFile == nullptr) {
    if (file != nullptr) std::fclose(file);
    if (validationFile != nullptr) std::fclose(validationFile);
    std::fprintf(stderr, "loom-train: cannot write the plot's data beside %s\n", path.c_str());
    return;
  }
  bool anyValidation = false;
  for (const Metric& m : metrics) {
    std::fprintf(file, "%d %.9g\n", m.step, m.loss);
    if (!std::isnan(m.validationLoss)) {
      std::fprintf(validationFile, "%d %.9g\n", m.step, m.validationLoss);
      anyValidation = true;
    }
  }
  std::fclose(file);
  std::fclose(validationFile);
  std::string script = "set terminal pngcairo size 800,500; set output '" + path +
                       "'; set xlabel 'step'; set ylabel 'loss (nats)'; set grid; plot '" + data +
                       "' with lines title 'training loss'";
  if (anyValidation) script += ", '" + validation + "' with linespoints title 'validation loss'";
  if (floor > 0) script += ", " + std::to_string(floor) + " with lines dashtype 2 title 'entropy rate'";
  const std::string command = "gnuplot -e \"" + script + "\" 2>&1";
  if (std::system(command.c_str()) != 0)
    std::fprintf(stderr, "loom-train: gnuplot could not draw %s (is gnuplot installed?)\n", path.c_str());
  std::remove(data.c_str());
  std::remove(validation.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // One thread per rank for the GEMMs (the kernels' own rule): ranks are processes, one per core.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(1);
  GptConfig config;
  if (!GptConfig::preset(o.model, &config)) usage(("--model " + o.model + ": gpt-tiny or gpt2-124m").c_str());

  // The world: under a launcher from its variables, else one rank in this process.
  loomComm_t comm = nullptr;
  if (std::getenv("LOOM_RANK") != nullptr || std::getenv("RANK") != nullptr ||
      std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    LOOM_PAR_CHECK(comm, loomCommInitFromEnv(&comm));
  } else {
    loomUniqueId id;
    LOOM_PAR_CHECK(comm, loomGetUniqueId(&id));
    LOOM_PAR_CHECK(comm, loomCommInitRank(&comm, 1, id, 0));
  }
  int rank = 0, nranks = 1;
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);
  // The mesh: tensor-parallel groups of consecutive ranks, data parallelism across them.
  Mesh mesh;
  std::string meshError;
  if (nranks % o.tp != 0 || (o.dp != 0 && o.dp * o.tp != nranks) ||
      !Mesh::make("tp-dp", {{"tp", o.tp}, {"dp", nranks / o.tp}}, nranks, &mesh, &meshError)) {
    if (rank == 0)
      std::fprintf(stderr, "loom-train: --tp %d%s does not lay out the job's %d ranks%s%s\n", o.tp,
                   o.dp != 0 ? (" x --dp " + std::to_string(o.dp)).c_str() : "", nranks, meshError.empty() ? "" : ": ",
                   meshError.c_str());
    return 2;
  }
  const int dpSize = nranks / o.tp, dpRank = mesh.coordinate(rank, "dp");

  // Data: the synthetic source, or a text file's tokens.
  std::unique_ptr<MarkovSource> synthetic;
  std::unique_ptr<TextData> text;
  std::string dataLine;
  if (o.data == "synthetic") {
    synthetic = std::make_unique<MarkovSource>(config.vocab, 4, o.seed);
    char line[160];
    std::snprintf(line, sizeof(line), "synthetic Markov source, V=%d, 4 successors per symbol: entropy rate %.4f nats",
                  config.vocab, synthetic->entropyRate());
    dataLine = line;
  } else {
    std::string content, error;
    if (!readFile(o.data, &content, &error)) {
      if (rank == 0) std::fprintf(stderr, "loom-train: --data: %s\n", error.c_str());
      return 2;
    }
    std::vector<int32_t> tokens;
    if (o.tokenizer == "char") {
      CharTokenizer chars(content);
      chars.encode(content, &tokens);
      config.vocab = chars.vocab();
    } else {
      tokens = ByteTokenizer().encode(content);
    }
    text = std::make_unique<TextData>(std::move(tokens), o.seed);
    dataLine = o.data + ", " + o.tokenizer + " tokens: " + std::to_string(text->trainTokens()) + " to train, " +
               std::to_string(text->validationTokens()) + " to validate";
  }
  const int T = o.seq > 0 ? o.seq : config.maxT;
  if (T > config.maxT)
    usage(("--seq " + std::to_string(T) + " is longer than the model's " + std::to_string(config.maxT)).c_str());

  // Where the model runs: the CPU's Ops and the world communicator, or a CUDA device's and a CUDA communicator over
  // the same ranks.
  Ops* ops = &cpuOps();
  std::unique_ptr<Ops> deviceOps;
  loomComm_t trainComm = comm;
  // Destroys the world's communicators last, after everything declared below that uses them.
  struct Communicators {
    loomComm_t world, train;
    ~Communicators() {
      if (train != world) loomCommDestroy(train);
      loomCommDestroy(world);
    }
  } communicators{comm, comm};
  if (o.device == "cuda") {
#ifdef LOOM_PARALLEL_CUDA
    const char* localRank = std::getenv("LOOM_LOCAL_RANK");
    const int devices = loom::parallel::cuda::deviceCount();
    const int device = devices > 0 ? (localRank != nullptr ? std::atoi(localRank) : rank) % devices : 0;
    std::string error;
    deviceOps = loom::parallel::cuda::makeOps(device, o.dtype == "bf16" ? DType::kBfloat16 : DType::kFloat32, &error);
    if (!deviceOps) {
      std::fprintf(stderr, "loom-train: rank %d: --device cuda: %s\n", rank, error.c_str());
      return 2;
    }
    ops = deviceOps.get();
    loomConfig_t cudaConfig = LOOM_CONFIG_INITIALIZER;
    cudaConfig.device = loomDeviceCuda;
    cudaConfig.cudaDevice = device;
    LOOM_PAR_CHECK(comm, loomCommSplit(comm, 0, rank, &trainComm, &cudaConfig));
    communicators.train = trainComm;
#else
    if (rank == 0)
      std::fprintf(stderr, "loom-train: --device cuda: this build has no CUDA kernels (nvcc and cuBLAS)\n");
    return 2;
#endif
  }

  // The groups' communicators, of the model's kind; and a host one for the tensor-parallel checkpoint gathers.
  auto groups = std::make_unique<MeshComms>(trainComm, mesh, std::vector<std::string>{"tp", "dp"});
  std::unique_ptr<MeshComms> hostGroups;
  if (o.tp > 1) hostGroups = std::make_unique<MeshComms>(comm, mesh, std::vector<std::string>{"tp"});
  Gpt model(config, *ops, o.tp > 1 ? groups->get("tp") : nullptr, o.sequenceParallel);
  model.initialise(o.seed);
  const GptLayout whole = GptLayout::of(config);
  AdamWOptions adamw;
  adamw.learningRate = o.learningRate;
  std::unique_ptr<Trainer> trainer;
  if (o.zero == 0) {
    DdpOptions options;
    options.adamw = adamw;
    trainer = std::make_unique<DdpTrainer>(model, groups->get("dp"), options);
  } else {
    ZeroOptions options;
    options.stage = o.zero;
    options.adamw = adamw;
    trainer = std::make_unique<ZeroTrainer>(model, groups->get("dp"), options);
  }

  int firstStep = 0;
  if (!o.resume.empty()) {
    Checkpoint checkpoint;
    std::string error;
    if (!readCheckpoint(o.resume, &checkpoint, &error)) {
      if (rank == 0) std::fprintf(stderr, "loom-train: --resume: %s\n", error.c_str());
      return 2;
    }
    if (checkpoint.config.channels != config.channels || checkpoint.config.layers != config.layers ||
        checkpoint.config.vocab != config.vocab || checkpoint.m.empty()) {
      if (rank == 0)
        std::fprintf(stderr, "loom-train: --resume %s holds another model, or no optimizer state\n", o.resume.c_str());
      return 2;
    }
    if (o.tp > 1) {  // this rank's part of the whole model's state
      const int part = model.tensorParallelRank();
      for (std::vector<float>* values : {&checkpoint.params, &checkpoint.m, &checkpoint.v}) {
        std::vector<float> local(model.layout().total);
        model.layout().shard(whole, values->data(), part, local.data());
        *values = std::move(local);
      }
    }
    trainer->importState(checkpoint.params, checkpoint.m, checkpoint.v, static_cast<int>(checkpoint.step));
    firstStep = static_cast<int>(checkpoint.dataPosition);
  }

  auto save = [&](int stepsDone) {
    Checkpoint checkpoint;
    checkpoint.config = config;
    trainer->exportState(&checkpoint.params, &checkpoint.m, &checkpoint.v);
    if (o.tp > 1) {  // every tensor-parallel rank's part, gathered over the host, into the whole model's layout
      const size_t n = model.layout().total;
      for (std::vector<float>* values : {&checkpoint.params, &checkpoint.m, &checkpoint.v}) {
        std::vector<float> parts(n * o.tp), full(whole.total);
        LOOM_PAR_CHECK(comm,
                       loomAllGather(values->data(), parts.data(), n, loomFloat32, hostGroups->get("tp"), nullptr));
        for (int part = 0; part < o.tp; ++part)
          model.layout().unshard(whole, parts.data() + part * n, part, full.data());
        *values = std::move(full);
      }
    }
    checkpoint.step = static_cast<uint64_t>(trainer->steps());
    checkpoint.dataPosition = static_cast<uint64_t>(stepsDone);
    std::string error;
    if (rank == 0 && !writeCheckpoint(o.save, checkpoint, &error))
      std::fprintf(stderr, "loom-train: --save: %s\n", error.c_str());
  };

  const MemoryReport memory = trainer->memory();
  const size_t tokensPerStep = static_cast<size_t>(dpSize) * o.batch * o.accumulation * T;
  if (rank == 0) {
    std::printf("# loom-train: %s, %zu parameters (L=%d H=%d C=%d T=%d V=%d)", o.model.c_str(), whole.total,
                config.layers, config.heads, config.channels, config.maxT, config.vocab);
    if (o.tp > 1) std::printf(", %zu on each tensor-parallel rank", model.layout().total);
    std::printf("\n");
    std::printf(
        "# layout: tp=%d%s dp=%d, %s; %d x %d sequences of %d tokens per data-parallel rank and step (%zu "
        "tokens per step)\n",
        o.tp, o.sequenceParallel ? " sp" : "", dpSize, o.zero == 0 ? "DDP" : ("ZeRO-" + std::to_string(o.zero)).c_str(),
        o.accumulation, o.batch, T, tokensPerStep);
    std::printf("# device: %s%s\n", ops->describe().c_str(),
                ops->dtype() == DType::kBfloat16 ? " (AdamW on fp32 master weights)" : "");
    std::printf("# memory per rank: parameters %s, gradients %s, optimizer %s, total %s (%.2f bytes per parameter)\n",
                humanBytes(memory.paramBytes).c_str(), humanBytes(memory.gradBytes).c_str(),
                humanBytes(memory.optimizerBytes).c_str(), humanBytes(memory.total()).c_str(),
                static_cast<double>(memory.total()) / model.layout().total);
    std::printf("# data: %s\n", dataLine.c_str());
    if (firstStep > 0) std::printf("# resumed from %s at step %d\n", o.resume.c_str(), firstStep);
    std::fflush(stdout);
  }

  if (o.evalEvery > 0 && !text && rank == 0)
    std::fprintf(stderr,
                 "loom-train: --eval-every needs text data (--data FILE); the synthetic source has its "
                 "entropy rate instead\n");
  loomStream_t evalStream = nullptr;
  LOOM_PAR_CHECK(comm, loomStreamCreate(&evalStream));
  // The mean loss over --eval-batches validation batches, averaged across ranks.
  auto validationLoss = [&]() {
    double sum = 0;
    for (int i = 0; i < o.evalBatches; ++i) {
      const Batch batch = text->batch(static_cast<uint64_t>(i), dpRank, dpSize, o.batch, T, true);
      sum += model.forward(batch.inputs.data(), batch.targets.data(), o.batch, T);
    }
    float mean = static_cast<float>(sum / o.evalBatches);
    LOOM_PAR_CHECK(comm, loomAllReduce(&mean, &mean, 1, loomFloat32, loomAvg, comm, evalStream));
    LOOM_PAR_CHECK(comm, loomStreamSynchronize(evalStream));
    return mean;
  };

  std::vector<Metric> metrics;
  double computeSeconds = 0, exposedSeconds = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int step = firstStep; step < o.steps; ++step) {
    std::vector<Batch> batches;
    for (int k = 0; k < o.accumulation; ++k) {
      const uint64_t index = static_cast<uint64_t>(step) * o.accumulation + k;
      batches.push_back(synthetic ? synthetic->batch(index, dpRank, dpSize, o.batch, T)
                                  : text->batch(index, dpRank, dpSize, o.batch, T, false));
    }
    std::vector<const int32_t*> inputs, targets;
    for (const Batch& batch : batches) {
      inputs.push_back(batch.inputs.data());
      targets.push_back(batch.targets.data());
    }
    const StepReport report = trainer->step(inputs, targets, o.batch, T);
    computeSeconds += report.seconds - report.exposedSeconds;
    exposedSeconds += report.exposedSeconds;
    const bool last = step + 1 == o.steps;
    float validation = std::nanf("");
    if (text && o.evalEvery > 0 && ((step + 1) % o.evalEvery == 0 || last)) validation = validationLoss();
    metrics.push_back(Metric{step + 1, report.loss, report.seconds * 1e3, tokensPerStep / report.seconds, validation});
    if (rank == 0 && ((step + 1) % o.logEvery == 0 || last)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double perStep = elapsed / (step + 1 - firstStep);
      char validationText[32] = "";
      if (!std::isnan(validation)) std::snprintf(validationText, sizeof(validationText), " | val %.4f", validation);
      std::printf("step %6d/%d | loss %.4f%s | %9.0f tok/s | %8.2f ms/step | ETA %s\n", step + 1, o.steps, report.loss,
                  validationText, tokensPerStep / report.seconds, report.seconds * 1e3,
                  duration(perStep * (o.steps - step - 1)).c_str());
      std::fflush(stdout);
    }
    if (!o.save.empty() && ((o.saveEvery > 0 && (step + 1) % o.saveEvery == 0) || last)) save(step + 1);
  }
  // The step's communication run alone, for the breakdown: what of it backward hid.
  const int stepsRun = o.steps - firstStep;
  double alone = 0;
  if (dpSize > 1 && stepsRun > 0) {
    trainer->communicationAlone();  // warm-up
    constexpr int kRepeats = 5;
    for (int i = 0; i < kRepeats; ++i) alone += trainer->communicationAlone() / kRepeats;
  }
  if (rank == 0) {
    const double total = computeSeconds + exposedSeconds;
    if (total > 0)
      std::printf("# time: %.2f s computing, %.2f s waiting for communication (%.1f%% exposed)\n", computeSeconds,
                  exposedSeconds, 100.0 * exposedSeconds / total);
    // The wait also holds the time spent for the slowest rank to arrive; what exceeds the communication's own time
    // can only be that.
    const double exposedPerStep = stepsRun > 0 ? exposedSeconds / stepsRun : 0;
    if (alone > 0 && exposedPerStep < alone)
      std::printf("# communication alone: %.2f ms per step; at least %.0f%% of it hidden under computation\n",
                  alone * 1e3, 100.0 * (1.0 - exposedPerStep / alone));
    else if (alone > 0)
      std::printf(
          "# communication alone: %.2f ms per step; of the %.2f ms per step waited, at least %.2f ms is for "
          "the slowest rank to arrive\n",
          alone * 1e3, exposedPerStep * 1e3, (exposedPerStep - alone) * 1e3);
    if (stepsRun > 0)
      std::printf("# activations per rank: %s kept for backward, %s of buffers for their gradients\n",
                  humanBytes(model.activationBytes()).c_str(), humanBytes(model.activationGradientBytes()).c_str());
    if (!o.metrics.empty()) writeMetrics(o.metrics, metrics);
    if (!o.plot.empty()) plotLoss(o.plot, metrics, synthetic ? synthetic->entropyRate() : 0.0);
  }
  loomStreamDestroy(evalStream);
  return 0;  // the trainer, the model, the groups' communicators, then the world's, in that order
}
