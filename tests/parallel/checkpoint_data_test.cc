// Checkpoints (parallel/model/checkpoint.h) and data (parallel/train/data.h): a checkpoint reads back bit for bit,
// and every way a file can be wrong is refused with a message saying which; the Markov source is deterministic,
// gives each rank its own part of the global batch, and its sequences show the entropy rate it claims; text data
// splits and tokenizes as documented.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "parallel/model/checkpoint.h"
#include "parallel/train/data.h"

namespace loom::parallel {
namespace {

std::string temporaryPath(const char* name) {
  return std::string(::testing::TempDir()) + "/loom-" + name + "-" + std::to_string(getpid());
}

Checkpoint smallCheckpoint(bool moments) {
  Checkpoint checkpoint;
  checkpoint.config = GptConfig{1, 2, 8, 4, 16};
  Gpt model(checkpoint.config);
  model.initialise(9);
  const float* params = model.params().f32();
  checkpoint.params.assign(params, params + model.layout().total);
  if (moments) {
    checkpoint.m.assign(checkpoint.params.size(), 0.25f);
    checkpoint.v.assign(checkpoint.params.size(), 0.5f);
  }
  checkpoint.step = 17;
  checkpoint.dataPosition = 1234;
  return checkpoint;
}

TEST(Checkpoint, ReadsBackWhatWasWritten) {
  for (bool moments : {false, true}) {
    const std::string path = temporaryPath("checkpoint");
    const Checkpoint written = smallCheckpoint(moments);
    std::string error;
    ASSERT_TRUE(writeCheckpoint(path, written, &error)) << error;
    Checkpoint read;
    ASSERT_TRUE(readCheckpoint(path, &read, &error)) << error;
    EXPECT_EQ(read.config.channels, written.config.channels);
    EXPECT_EQ(read.config.vocab, written.config.vocab);
    EXPECT_EQ(read.step, 17u);
    EXPECT_EQ(read.dataPosition, 1234u);
    EXPECT_EQ(read.params, written.params);
    EXPECT_EQ(read.m, written.m);
    EXPECT_EQ(read.v, written.v);
    std::remove(path.c_str());
  }
}

TEST(Checkpoint, KeepsAMixtureOfExpertsConfiguration) {
  const std::string path = temporaryPath("moe");
  Checkpoint written;
  ASSERT_TRUE(GptConfig::preset("moe-tiny", &written.config));
  written.config.dropPolicy = DropPolicy::kProbability;
  written.params.assign(GptLayout::of(written.config).total, 0.5f);
  std::string error;
  ASSERT_TRUE(writeCheckpoint(path, written, &error)) << error;
  Checkpoint read;
  ASSERT_TRUE(readCheckpoint(path, &read, &error)) << error;
  EXPECT_EQ(read.config.experts, 4);
  EXPECT_EQ(read.config.topk, 2);
  EXPECT_EQ(read.config.hidden(), 256);
  EXPECT_EQ(read.config.capacityFactor, 1.25f);
  EXPECT_EQ(read.config.dropPolicy, DropPolicy::kProbability);
  EXPECT_EQ(read.config.auxLossCoefficient, written.config.auxLossCoefficient);
  EXPECT_EQ(read.params, written.params);
  std::remove(path.c_str());
}

TEST(Checkpoint, RefusesBadFilesByName) {
  const std::string path = temporaryPath("bad");
  std::string error;
  Checkpoint read;
  EXPECT_FALSE(readCheckpoint(path + "-missing", &read, &error));
  EXPECT_NE(error.find("cannot open"), std::string::npos) << error;

  ASSERT_TRUE(writeCheckpoint(path, smallCheckpoint(true), &error)) << error;
  std::string bytes;
  ASSERT_TRUE(readFile(path, &bytes, &error));
  auto rewrite = [&](const std::string& content) { std::ofstream(path, std::ios::binary) << content; };
  auto refused = [&](const char* expected) {
    EXPECT_FALSE(readCheckpoint(path, &read, &error)) << expected;
    EXPECT_NE(error.find(expected), std::string::npos) << error;
  };
  rewrite("not a checkpoint at all, but long enough to have a header of sixty-four bytes and more.....");
  refused("not a loom checkpoint");
  std::string other = bytes;
  other[8] = 3;  // version 3
  rewrite(other);
  refused("version 3");
  rewrite(bytes.substr(0, bytes.size() - 100));
  refused("truncated");
  std::string flipped = bytes;
  flipped[100] ^= 1;
  rewrite(flipped);
  refused("checksum");
  // A header claiming a model far larger than the file is refused before the model's layout is computed: 2^30 layers
  // of 2^20 channels would otherwise ask for more memory than any machine has.
  std::string huge = bytes;
  const int32_t layers = 1 << 30, channels = 1 << 20;
  std::memcpy(huge.data() + 16, &layers, 4);
  std::memcpy(huge.data() + 20, &channels, 4);  // heads, dividing channels
  std::memcpy(huge.data() + 24, &channels, 4);
  rewrite(huge);
  refused("too few for its model");
  // A wrong count for the model is refused before anything is read.
  Checkpoint wrong = smallCheckpoint(false);
  wrong.params.pop_back();
  EXPECT_FALSE(writeCheckpoint(path, wrong, &error));
  EXPECT_NE(error.find("parameters for a model of"), std::string::npos) << error;
  std::remove(path.c_str());
}

TEST(Data, MarkovSourceIsDeterministicAndSplitsTheGlobalBatch) {
  const MarkovSource source(64, 4, 7);
  const Batch whole = source.batch(3, 0, 1, 4, 16);
  const Batch again = source.batch(3, 0, 1, 4, 16);
  EXPECT_EQ(whole.inputs, again.inputs);
  EXPECT_EQ(whole.targets, again.targets);
  // Rank r of 2 with B = 2 gets sequences 2r and 2r + 1 of the global batch of 4.
  for (int rank = 0; rank < 2; ++rank) {
    const Batch part = source.batch(3, rank, 2, 2, 16);
    EXPECT_TRUE(std::equal(part.inputs.begin(), part.inputs.end(), whole.inputs.begin() + rank * 2 * 16));
  }
  for (size_t i = 0; i + 1 < 16; ++i) EXPECT_EQ(whole.targets[i], whole.inputs[i + 1]) << "targets follow inputs";
  EXPECT_NE(source.batch(4, 0, 1, 4, 16).inputs, whole.inputs);
}

TEST(Data, MarkovSequencesShowTheEntropyRate) {
  const MarkovSource source(32, 4, 11);
  const double profile = -(12.0 / 25 * std::log(12.0 / 25) + 6.0 / 25 * std::log(6.0 / 25) +
                           4.0 / 25 * std::log(4.0 / 25) + 3.0 / 25 * std::log(3.0 / 25));
  EXPECT_NEAR(source.entropyRate(), profile, 1e-12);
  // The empirical conditional entropy of next given last over many transitions.
  std::map<std::pair<int, int>, double> pairs;
  std::map<int, double> firsts;
  double transitions = 0;
  for (uint64_t index = 0; index < 200; ++index) {
    const Batch batch = source.batch(index, 0, 1, 8, 64);
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      pairs[{batch.inputs[i], batch.targets[i]}] += 1;
      firsts[batch.inputs[i]] += 1;
      transitions += 1;
    }
  }
  double conditional = 0;
  for (const auto& [pair, count] : pairs) conditional -= count / transitions * std::log(count / firsts[pair.first]);
  EXPECT_NEAR(conditional, source.entropyRate(), 0.02);
}

TEST(Data, TextSplitsAndTokenizes) {
  const std::string text = "to be, or not to be: that is the question";
  const CharTokenizer chars(text);
  std::vector<int32_t> tokens;
  ASSERT_TRUE(chars.encode(text, &tokens));
  EXPECT_EQ(chars.decode(tokens), text);
  EXPECT_EQ(chars.vocab(), 15);  // " ,:abehinoqrstu"
  EXPECT_FALSE(chars.encode("xyz", &tokens)) << "characters it has not seen";
  const ByteTokenizer bytes;
  EXPECT_EQ(bytes.decode(bytes.encode(text)), text);
  TextData data(bytes.encode(text), 5);
  EXPECT_EQ(data.trainTokens() + data.validationTokens(), text.size());
  EXPECT_EQ(data.validationTokens(), text.size() - static_cast<size_t>(text.size() * 0.9));
  const Batch batch = data.batch(0, 0, 1, 2, 8, false);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t + 1 < 8; ++t) EXPECT_EQ(batch.targets[b * 8 + t], batch.inputs[b * 8 + t + 1]);
}

}  // namespace
}  // namespace loom::parallel
