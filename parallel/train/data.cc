// Tokenizers and data sources (data.h).
#include "parallel/train/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace loom::parallel {
namespace {

// splitmix64: the seeded stream every source draws from.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double unit(uint64_t bits) { return static_cast<double>(bits >> 11) / 9007199254740992.0; }

}  // namespace

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) text[i] = static_cast<char>(tokens[i] & 0xff);
  return text;
}

CharTokenizer::CharTokenizer(const std::string& text) {
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  std::fill(index_, index_ + 256, -1);
  for (int c = 0; c < 256; ++c)
    if (seen[c]) {
      index_[c] = static_cast<int32_t>(symbols_.size());
      symbols_.push_back(static_cast<char>(c));
    }
}

bool CharTokenizer::encode(const std::string& text, std::vector<int32_t>* tokens) const {
  tokens->resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t token = index_[static_cast<unsigned char>(text[i])];
    if (token < 0) return false;
    (*tokens)[i] = token;
  }
  return true;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  for (int32_t token : tokens) text.push_back(symbols_.at(static_cast<size_t>(token)));
  return text;
}

MarkovSource::MarkovSource(int vocab, int branching, uint64_t seed)
    : vocab_(vocab), branching_(std::clamp(branching, 1, vocab)), seed_(seed) {
  // The profile: probabilities proportional to 1, 1/2, 1/3, ... (Zipf), normalised.
  double total = 0;
  for (int k = 0; k < branching_; ++k) total += 1.0 / (k + 1);
  for (int k = 0; k < branching_; ++k) profile_.push_back(1.0 / (k + 1) / total);
  // Each symbol's successors: distinct symbols drawn from the seed.
  successors_.resize(static_cast<size_t>(vocab_) * branching_);
  uint64_t state = seed;
  for (int s = 0; s < vocab_; ++s) {
    int32_t* row = successors_.data() + static_cast<size_t>(s) * branching_;
    for (int k = 0; k < branching_;) {
      state = mix(state);
      const int32_t candidate = static_cast<int32_t>(state % static_cast<uint64_t>(vocab_));
      if (std::find(row, row + k, candidate) == row + k) row[k++] = candidate;
    }
  }
  // Every row has the same profile, so the entropy of the next symbol given the last is the profile's entropy,
  // whatever the stationary distribution.
  for (double p : profile_) entropyRate_ -= p * std::log(p);
}

Batch MarkovSource::batch(uint64_t index, int rank, int nranks, int B, int T) const {
  Batch batch;
  batch.B = B;
  batch.T = T;
  batch.inputs.resize(static_cast<size_t>(B) * T);
  batch.targets.resize(static_cast<size_t>(B) * T);
  for (int b = 0; b < B; ++b) {
    const uint64_t sequence = index * static_cast<uint64_t>(nranks) * B + static_cast<uint64_t>(rank) * B + b;
    uint64_t state = mix(seed_ ^ mix(sequence + 1));
    int32_t symbol = static_cast<int32_t>(state % static_cast<uint64_t>(vocab_));
    for (int t = 0; t <= T; ++t) {
      if (t < T) batch.inputs[static_cast<size_t>(b) * T + t] = symbol;
      if (t > 0) batch.targets[static_cast<size_t>(b) * T + t - 1] = symbol;
      state = mix(state);
      double draw = unit(state);
      int k = 0;
      while (k + 1 < branching_ && draw >= profile_[k]) draw -= profile_[k++];
      symbol = successors_[static_cast<size_t>(symbol) * branching_ + k];
    }
  }
  return batch;
}

TextData::TextData(std::vector<int32_t> tokens, uint64_t seed, double validationShare)
    : tokens_(std::move(tokens)), seed_(seed) {
  split_ = static_cast<size_t>(static_cast<double>(tokens_.size()) * (1.0 - validationShare));
}

Batch TextData::batch(uint64_t index, int rank, int nranks, int B, int T, bool validation) const {
  const size_t begin = validation ? split_ : 0, end = validation ? tokens_.size() : split_;
  Batch batch;
  batch.B = B;
  batch.T = T;
  batch.inputs.resize(static_cast<size_t>(B) * T);
  batch.targets.resize(static_cast<size_t>(B) * T);
  const size_t windows = end - begin > static_cast<size_t>(T) ? end - begin - T : 1;
  for (int b = 0; b < B; ++b) {
    const uint64_t sequence = index * static_cast<uint64_t>(nranks) * B + static_cast<uint64_t>(rank) * B + b;
    const size_t start = begin + mix(seed_ ^ mix(sequence + (validation ? 0x5eed : 0) + 1)) % windows;
    for (int t = 0; t < T; ++t) {
      batch.inputs[static_cast<size_t>(b) * T + t] = tokens_[std::min(start + t, tokens_.size() - 1)];
      batch.targets[static_cast<size_t>(b) * T + t] = tokens_[std::min(start + t + 1, tokens_.size() - 1)];
    }
  }
  return batch;
}

bool readFile(const std::string& path, std::string* content, std::string* error) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  if (!S_ISREG(info.st_mode)) {
    *error = path + " is " + (S_ISDIR(info.st_mode) ? "a directory" : "not a regular file");
    return false;
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  std::ostringstream buffer;
  buffer << file.rdbuf();
  if (file.bad()) {
    *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  *content = buffer.str();
  if (content->empty()) {
    *error = path + " is empty";
    return false;
  }
  return true;
}

}  // namespace loom::parallel
