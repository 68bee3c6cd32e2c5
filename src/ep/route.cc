#include "src/ep/route.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/exec/reduce.h"

namespace loom::ep {

bool makeShape(const loomEpConfig_t& config, int nranks, int rank, Shape* shape, std::string* why) {
  auto bad = [&](const std::string& message) {
    *why = message;
    return false;
  };
  if (config.maxTokensPerRank < 1) return bad("maxTokensPerRank must be at least 1");
  if (config.hidden < 1) return bad("hidden must be at least 1");
  if (config.numExperts < 1) return bad("numExperts must be at least 1");
  if (config.numExperts % nranks != 0)
    return bad("numExperts (" + std::to_string(config.numExperts) + ") must be a multiple of the rank count (" +
               std::to_string(nranks) + ")");
  if (config.topk < 1 || config.topk > kMaxTopk || config.topk > config.numExperts)
    return bad("topk (" + std::to_string(config.topk) + ") must be in 1.." +
               std::to_string(std::min(kMaxTopk, config.numExperts)));
  // Read through memcpy: a C caller may pass any int, and loading an enum outside its values is undefined in C++.
  int type = 0, mode = 0;
  static_assert(sizeof(config.datatype) == sizeof(int) && sizeof(config.mode) == sizeof(int));
  std::memcpy(&type, &config.datatype, sizeof(int));
  std::memcpy(&mode, &config.mode, sizeof(int));
  if (type != loomFloat32 && type != loomBfloat16 && type != loomFloat16)
    return bad("datatype " + std::to_string(type) + " is not a floating type EP combines (float32, bfloat16, float16)");
  if (mode != loomEpNormal && mode != loomEpLowLatency)
    return bad("mode " + std::to_string(mode) + " is neither loomEpNormal (0) nor loomEpLowLatency (1)");
  if (config.expertCapacity < 0) return bad("expertCapacity must not be negative");
  if (config.dropOverflow != 0 && config.dropOverflow != 1) return bad("dropOverflow must be 0 or 1");
  int64_t full = static_cast<int64_t>(nranks) * config.maxTokensPerRank;
  if (full > INT32_MAX) return bad("nranks * maxTokensPerRank exceeds 2^31 rows");
  Shape s;
  s.nranks = nranks;
  s.rank = rank;
  s.maxTokens = config.maxTokensPerRank;
  s.hidden = config.hidden;
  s.numExperts = config.numExperts;
  s.topk = config.topk;
  s.localExperts = config.numExperts / nranks;
  s.capacity = config.expertCapacity == 0 ? static_cast<int>(full) : config.expertCapacity;
  s.dropOverflow = config.dropOverflow == 1;
  s.datatype = static_cast<loomDataType_t>(type);
  s.elementBytes = dtypeSize(s.datatype);
  *shape = s;
  return true;
}

bool checkRouting(const Shape& shape, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                  std::string* why) {
  for (int t = 0; t < numTokens; ++t) {
    const int32_t* idx = topkIdx + static_cast<size_t>(t) * shape.topk;
    const float* w = topkWeights + static_cast<size_t>(t) * shape.topk;
    for (int j = 0; j < shape.topk; ++j) {
      if (idx[j] < -1 || idx[j] >= shape.numExperts) {
        *why = "topkIdx[" + std::to_string(t) + "][" + std::to_string(j) + "] = " + std::to_string(idx[j]) +
               " is not an expert (0.." + std::to_string(shape.numExperts - 1) + ", or -1 for none)";
        return false;
      }
      if (idx[j] < 0) continue;
      if (!std::isfinite(w[j])) {
        *why = "topkWeights[" + std::to_string(t) + "][" + std::to_string(j) + "] is not finite";
        return false;
      }
      for (int k = 0; k < j; ++k)
        if (idx[k] == idx[j]) {
          *why = "token " + std::to_string(t) + " chooses expert " + std::to_string(idx[j]) + " twice (topkIdx[" +
                 std::to_string(t) + "][" + std::to_string(k) + "] and [" + std::to_string(j) + "])";
          return false;
        }
    }
  }
  return true;
}

void encodeMeta(const Shape& shape, int source, const Outgoing& o, size_t i, uint32_t* words) {
  int32_t token = o.tokens[i];
  uint32_t first = o.pickStart[i], last = o.pickStart[i + 1];
  words[0] = static_cast<uint32_t>(source);
  words[1] = static_cast<uint32_t>(token);
  words[2] = last - first;
  uint32_t* pairs = words + kMetaWords;
  for (uint32_t k = first; k < last; ++k) {
    pairs[2 * (k - first)] = static_cast<uint32_t>(o.picks[k].expert);
    std::memcpy(&pairs[2 * (k - first) + 1], &o.picks[k].weight, 4);
  }
  std::memset(pairs + 2 * (last - first), 0, 4 * (2 * static_cast<size_t>(shape.topk) - 2 * (last - first)));
}

void encodeRecord(const Shape& shape, int source, const Outgoing& o, size_t i, const void* x, uint32_t* words) {
  encodeMeta(shape, source, o, i, words);
  int32_t token = o.tokens[i];
  uint32_t* row = words + shape.metaWords();
  size_t bytes = shape.rowBytes();
  row[shape.rowWords() - 1] = 0;  // the padding of a row whose bytes are not a multiple of 4
  std::memcpy(row, static_cast<const std::byte*>(x) + static_cast<size_t>(token) * bytes, bytes);
}

float RecordView::weight(int k) const {
  float w;
  std::memcpy(&w, &pairs[2 * k + 1], 4);
  return w;
}

bool readRecord(const Shape& shape, const uint32_t* words, RecordView* view, std::string* why) {
  view->source = static_cast<int32_t>(words[0]);
  view->token = static_cast<int32_t>(words[1]);
  view->picks = static_cast<int32_t>(words[2]);
  view->pairs = words + kMetaWords;
  view->row = words + shape.metaWords();
  if (view->source < 0 || view->source >= shape.nranks || view->token < 0 || view->token >= shape.maxTokens ||
      view->picks < 1 || view->picks > shape.topk) {
    *why = "a received record names source " + std::to_string(view->source) + ", token " + std::to_string(view->token) +
           " and " + std::to_string(view->picks) + " experts";
    return false;
  }
  for (int k = 0; k < view->picks; ++k)
    if (view->expert(k) < 0 || view->expert(k) >= shape.numExperts) {
      *why = "a received record names expert " + std::to_string(view->expert(k));
      return false;
    }
  return true;
}

void Placement::start(const Shape& shape, const std::vector<int32_t>& counts) {
  localExperts_ = shape.localExperts;
  capacity_ = shape.capacity;
  cursor_.assign(counts.size(), 0);
  totals_.assign(localExperts_, 0);
  overflow_ = 0;
  firstOverflow_ = -1;
  for (size_t s = 0; s * localExperts_ < counts.size(); ++s)
    for (int e = 0; e < localExperts_; ++e) {
      cursor_[s * localExperts_ + e] = totals_[e];
      totals_[e] += counts[s * localExperts_ + e];
    }
  for (int e = 0; e < localExperts_; ++e)
    if (totals_[e] > capacity_) {
      overflow_ += totals_[e] - capacity_;
      if (firstOverflow_ < 0) firstOverflow_ = e;
    }
}

int32_t Placement::next(int source, int localExpert) {
  int64_t row = cursor_[static_cast<size_t>(source) * localExperts_ + localExpert]++;
  return row < capacity_ ? static_cast<int32_t>(row) : -1;
}

loomResult_t Placement::finish(const Shape& shape, int* counts, uint64_t* dropped) const {
  countsOut(counts);
  *dropped = static_cast<uint64_t>(overflow_);
  if (overflow_ == 0 || shape.dropOverflow) return loomSuccess;
  int e = firstOverflow_;
  return LOOM_FAIL(loomInvalidArgument, COLL,
                   "loomEpDispatch on rank %d: local expert %d (expert %d) received %lld rows, past its capacity of %d "
                   "(expertCapacity; dropOverflow = 1 drops and counts them instead); %lld rows did not fit",
                   shape.rank, e, shape.rank * localExperts_ + e, static_cast<long long>(totals_[e]), capacity_,
                   static_cast<long long>(overflow_));
}

void Placement::countsOut(int* counts) const {
  for (int e = 0; e < localExperts_; ++e) counts[e] = static_cast<int>(std::min<int64_t>(totals_[e], capacity_));
}

void partialRow(const Shape& shape, const void* expertOut, const Destination* dests, size_t count, float* acc,
                void* dst) {
  std::fill(acc, acc + shape.hidden, 0.0f);
  size_t rowBytes = shape.rowBytes();
  for (size_t k = 0; k < count; ++k) {
    if (dests[k].row < 0) continue;
    size_t index = static_cast<size_t>(dests[k].localExpert) * shape.capacity + dests[k].row;
    accumulateWeighted(shape.datatype, static_cast<const std::byte*>(expertOut) + index * rowBytes, shape.hidden,
                       dests[k].weight, acc);
  }
  storeFromFloat(shape.datatype, acc, shape.hidden, dst);
}

}  // namespace loom::ep
