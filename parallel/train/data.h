// Training data for the reference GPT: tokenizers, a synthetic source whose best achievable loss is known, and
// text files split into training and validation parts. Every source is deterministic from its seed, so that ranks
// agree and a resumed run sees the same batches as an uninterrupted one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel {

// Bytes as tokens: V = 256, every text encodes.
struct ByteTokenizer {
  static constexpr int kVocab = 256;
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& tokens) const;
};

// The distinct characters (bytes) of a text, in byte order: V = their count.
class CharTokenizer {
 public:
  explicit CharTokenizer(const std::string& text);
  int vocab() const { return static_cast<int>(symbols_.size()); }
  // False when the text holds a character the tokenizer has not seen.
  bool encode(const std::string& text, std::vector<int32_t>* tokens) const;
  std::string decode(const std::vector<int32_t>& tokens) const;

 private:
  std::string symbols_;
  int32_t index_[256];
};

// A batch: B sequences of T inputs, and the T targets that follow each (the inputs shifted by one).
struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;  // B x T each
};

// A first-order Markov source over `vocab` symbols: from each symbol, `branching` distinct successors (drawn from
// the seed) with the probabilities 1, 1/2, ..., 1/branching, normalised. Every row has that profile, so the
// entropy rate, the lowest mean cross-entropy any model can reach on it (targets always follow a symbol), is the
// profile's entropy.
class MarkovSource {
 public:
  MarkovSource(int vocab, int branching, uint64_t seed);
  int vocab() const { return vocab_; }
  double entropyRate() const { return entropyRate_; }  // nats per token
  // Batch number `index` for `rank` of `nranks`: each rank's B sequences of the global batch of nranks x B.
  Batch batch(uint64_t index, int rank, int nranks, int B, int T) const;

 private:
  int vocab_, branching_;
  std::vector<int32_t> successors_;  // vocab x branching
  std::vector<double> profile_;      // branching probabilities, decreasing, summing to 1
  double entropyRate_ = 0;
  uint64_t seed_;
};

// Tokens of a text, split into a training part (the first 90%) and a validation part (the rest). Batches are
// windows at offsets drawn from the seed and the batch index.
class TextData {
 public:
  TextData(std::vector<int32_t> tokens, uint64_t seed, double validationShare = 0.1);
  size_t trainTokens() const { return split_; }
  size_t validationTokens() const { return tokens_.size() - split_; }
  Batch batch(uint64_t index, int rank, int nranks, int B, int T, bool validation) const;

 private:
  std::vector<int32_t> tokens_;
  size_t split_;
  uint64_t seed_;
};

// The whole content of a regular file; false with *error when it cannot be read, is not a file or is empty.
bool readFile(const std::string& path, std::string* content, std::string* error);

}  // namespace loom::parallel
