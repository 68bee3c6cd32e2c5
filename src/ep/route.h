// What both EP modes share (loom_ep.h describes the API): the shape, the routing of a dispatch, the record a
// token travels as, where received rows land in recvX, and the fp32 sums of the combine. Pure functions over
// host memory: no communicator, no waiting.
//
// A token crosses to each rank that holds any of its experts once, as one record of fixed size:
//   meta (kMetaWords + 2 * topk 32-bit words): source rank, token index, number of picks m, then m pairs of
//   (global expert, weight as fp32 bits), unused pairs zero; then the token's row, padded to 4 bytes.
// On the receiving rank the rows of local expert e are ordered by source rank, then token index: records from
// source s for expert e start at the sum of the counts of sources before s (Placement).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "loom/loom_ep.h"

namespace loom::ep {

constexpr int kMaxTopk = 64;
constexpr size_t kMetaWords = 3;  // source rank, token, picks

struct Shape {
  int nranks = 0, rank = 0;
  int maxTokens = 0, hidden = 0, numExperts = 0, topk = 0;
  int localExperts = 0;  // numExperts / nranks
  int capacity = 0;      // rows per local expert in recvX
  bool dropOverflow = false;
  loomDataType_t datatype = loomFloat32;
  size_t elementBytes = 0;

  size_t rowBytes() const { return static_cast<size_t>(hidden) * elementBytes; }
  size_t rowWords() const { return (rowBytes() + 3) / 4; }
  size_t metaWords() const { return kMetaWords + 2 * static_cast<size_t>(topk); }
  size_t recordWords() const { return metaWords() + rowWords(); }
  int rankOfExpert(int expert) const { return expert / localExperts; }
  // Expert's index among this rank's experts, or -1 when another rank holds it.
  int localExpertOf(int expert) const { return rankOfExpert(expert) == rank ? expert - rank * localExperts : -1; }
};

// Checks `config` for communicator of `nranks` ranks and fills *shape; *why names what is wrong.
bool makeShape(const loomEpConfig_t& config, int nranks, int rank, Shape* shape, std::string* why);

// Checks one dispatch's routing: every index in [-1, numExperts), no expert twice for a token, finite weights.
bool checkRouting(const Shape& shape, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                  std::string* why);

// One expert a token goes to: global expert index and weight.
struct Pick {
  int32_t expert;
  float weight;
};

// The tokens going to one destination (a rank, or in the hierarchical mode a host's forwarder), in token order:
// token tokens[i] with picks[pickStart[i] .. pickStart[i + 1]).
struct Outgoing {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> pickStart{0};
  std::vector<Pick> picks;
  std::vector<int32_t> perLocalExpert;  // for a rank destination: its tokens per local expert (low-latency header)

  size_t size() const { return tokens.size(); }
  void clear() {
    tokens.clear();
    pickStart.assign(1, 0);
    picks.clear();
    perLocalExpert.clear();
  }
};

// Routes this rank's tokens: (*out)[d] gets the tokens with any expert whose destination destOf(expert) is d, in
// token order, with those experts as picks. `destinations` outgoing lists; perLocalExpert filled when
// `countLocalExperts` (destinations are ranks).
template <typename DestOf>
void route(const Shape& shape, int numTokens, const int32_t* topkIdx, const float* topkWeights, int destinations,
           DestOf destOf, bool countLocalExperts, std::vector<Outgoing>* out) {
  out->resize(destinations);
  for (Outgoing& o : *out) {
    o.clear();
    if (countLocalExperts) o.perLocalExpert.assign(shape.localExperts, 0);
  }
  for (int t = 0; t < numTokens; ++t) {
    for (int j = 0; j < shape.topk; ++j) {
      int32_t expert = topkIdx[static_cast<size_t>(t) * shape.topk + j];
      if (expert < 0) continue;
      Outgoing& o = (*out)[destOf(expert)];
      if (o.tokens.empty() || o.tokens.back() != t) {
        o.tokens.push_back(t);
        o.pickStart.push_back(o.pickStart.back());
      }
      o.picks.push_back({expert, topkWeights[static_cast<size_t>(t) * shape.topk + j]});
      ++o.pickStart.back();
      if (countLocalExperts) ++o.perLocalExpert[expert % shape.localExperts];
    }
  }
}

// Writes the meta of record i of `o` (from source `source`) as 32-bit words at `words` (metaWords()).
void encodeMeta(const Shape& shape, int source, const Outgoing& o, size_t i, uint32_t* words);
// Writes record i of `o` (from source `source`, row from x) as 32-bit words at `words` (recordWords()).
void encodeRecord(const Shape& shape, int source, const Outgoing& o, size_t i, const void* x, uint32_t* words);

// A record as read back: its meta decoded, its row where it lies.
struct RecordView {
  int32_t source, token, picks;
  const uint32_t* pairs;  // picks pairs of (expert, weight bits)
  const void* row;
  int32_t expert(int k) const { return static_cast<int32_t>(pairs[2 * k]); }
  float weight(int k) const;
};
// Reads the record at `words`; false when its meta is malformed (*why says how).
bool readRecord(const Shape& shape, const uint32_t* words, RecordView* view, std::string* why);

// Where received rows land: per (source, local expert), rows start after all earlier sources' rows.
class Placement {
 public:
  // counts[s * localExperts + e]: rows source s sends local expert e.
  void start(const Shape& shape, const std::vector<int32_t>& counts);
  // The row of the next record of `source` for local expert e, or -1 when it is past the capacity (dropped, or
  // an overflow when the shape does not drop).
  int32_t next(int source, int localExpert);
  // Rows each local expert received, capped at the capacity.
  void countsOut(int* counts) const;
  // The end of a dispatch: the counts out, the rows past the capacity in *dropped, and loomInvalidArgument naming
  // the first expert that overflowed unless the shape drops them.
  loomResult_t finish(const Shape& shape, int* counts, uint64_t* dropped) const;
  int64_t overflowRows() const { return overflow_; }
  // The first local expert that overflowed and its rows, for the message.
  int firstOverflowExpert() const { return firstOverflow_; }

 private:
  int localExperts_ = 0, capacity_ = 0;
  std::vector<int64_t> cursor_;  // by (source, expert): the next row
  std::vector<int64_t> totals_;  // by expert
  int64_t overflow_ = 0;
  int firstOverflow_ = -1;
};

// What the combine must do for one received record: its rows in recvX and their weights.
struct Destination {
  int32_t localExpert;
  int32_t row;  // -1: dropped
  float weight;
};

// The combine's partial sum for one received record: sum of weight * expertOut row over its destinations, into
// `dst` as datatype (zeros when every row was dropped). `acc`: hidden floats of scratch.
void partialRow(const Shape& shape, const void* expertOut, const Destination* dests, size_t count, float* acc,
                void* dst);

}  // namespace loom::ep
