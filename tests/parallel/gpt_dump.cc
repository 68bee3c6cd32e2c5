// The loom side of the PyTorch check (torch_reference.py): writes into DIR a model, a batch and what loom computes
// from them, for PyTorch to recompute from the same checkpoint.
//   gpt_dump DIR
// Files: model.ckpt (gpt-tiny with T=32, seed 3, as a loom checkpoint), inputs.bin and targets.bin (int32, 4 x 32,
// from the synthetic source), logits.bin (fp32, 4 x 32 x V), loss.txt, grads.bin (fp32, the model's layout), and
// losses.txt: the loss before each of 10 AdamW steps (learning rate 1e-3, betas 0.9 and 0.95, eps 1e-8, weight
// decay 0.1 on matrices, gradients clipped to norm 1) on that batch.
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/kernels/cpu/kernels.h"
#include "parallel/model/checkpoint.h"
#include "parallel/model/gpt.h"
#include "parallel/strategies/optimizer.h"
#include "parallel/train/data.h"

namespace {

bool writeBinary(const std::string& path, const void* data, size_t bytes) {
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return false;
  const bool ok = std::fwrite(data, 1, bytes, file) == bytes;
  return std::fclose(file) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom::parallel;
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_dump DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  GptConfig config;
  GptConfig::preset("gpt-tiny", &config);
  config.maxT = 32;
  Gpt model(config);
  model.initialise(3);
  const size_t n = model.layout().total;

  Checkpoint checkpoint;
  checkpoint.config = config;
  checkpoint.params.assign(model.params().f32(), model.params().f32() + n);
  std::string error;
  if (!writeCheckpoint(dir + "/model.ckpt", checkpoint, &error)) {
    std::fprintf(stderr, "gpt_dump: %s\n", error.c_str());
    return 1;
  }
  const int B = 4, T = 32;
  const Batch batch = MarkovSource(config.vocab, 4, 5).batch(0, 0, 1, B, T);
  bool ok = writeBinary(dir + "/inputs.bin", batch.inputs.data(), batch.inputs.size() * sizeof(int32_t)) &&
            writeBinary(dir + "/targets.bin", batch.targets.data(), batch.targets.size() * sizeof(int32_t));

  model.zeroGrads();
  const float loss = model.forward(batch.inputs.data(), batch.targets.data(), B, T);
  model.backward();
  ok = ok && writeBinary(dir + "/logits.bin", model.logits().f32(), sizeof(float) * B * T * config.vocab) &&
       writeBinary(dir + "/grads.bin", model.grads().f32(), n * sizeof(float));
  FILE* lossFile = std::fopen((dir + "/loss.txt").c_str(), "w");
  ok = ok && lossFile != nullptr;
  if (lossFile != nullptr) {
    std::fprintf(lossFile, "%.9g\n", loss);
    std::fclose(lossFile);
  }

  AdamWOptions options;
  options.learningRate = 1e-3f;
  options.beta1 = 0.9f;
  options.beta2 = 0.95f;
  options.eps = 1e-8f;
  options.weightDecay = 0.1f;
  options.clipNorm = 1.0f;
  AdamW adamw(model.layout(), options, 0, n);
  FILE* lossesFile = std::fopen((dir + "/losses.txt").c_str(), "w");
  ok = ok && lossesFile != nullptr;
  for (int step = 0; step < 10 && lossesFile != nullptr; ++step) {
    model.zeroGrads();
    const float stepLoss = model.forward(batch.inputs.data(), batch.targets.data(), B, T);
    model.backward();
    std::fprintf(lossesFile, "%.9g\n", stepLoss);
    const float clip = cpu::clipFactor(cpu::sumOfSquares(model.grads().f32(), n), options.clipNorm);
    adamw.step(model.params().f32(), 0, model.grads().f32(), 0, clip);
  }
  if (lossesFile != nullptr) std::fclose(lossesFile);
  if (!ok) {
    std::fprintf(stderr, "gpt_dump: cannot write into %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
