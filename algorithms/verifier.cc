// Symbolic execution of plans (see verifier.h).
#include "algorithms/verifier.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>
#include <unordered_map>

#include "algorithms/builders.h"

namespace loom {
namespace {

class RankSet {
 public:
  RankSet() = default;
  explicit RankSet(int nranks) : words_((nranks + 63) / 64, 0) {}
  static RankSet single(int nranks, int rank) {
    RankSet set(nranks);
    set.words_[rank / 64] |= uint64_t{1} << (rank % 64);
    return set;
  }
  static RankSet all(int nranks) {
    RankSet set(nranks);
    for (int r = 0; r < nranks; ++r) set.words_[r / 64] |= uint64_t{1} << (r % 64);
    return set;
  }
  // The lowest rank in both sets, or -1.
  int firstCommon(const RankSet& other) const {
    for (size_t w = 0; w < words_.size(); ++w)
      if (uint64_t both = words_[w] & other.words_[w]) return static_cast<int>(w * 64 + __builtin_ctzll(both));
    return -1;
  }
  RankSet united(const RankSet& other) const {
    RankSet set = *this;
    for (size_t w = 0; w < words_.size(); ++w) set.words_[w] |= other.words_[w];
    return set;
  }
  bool operator==(const RankSet& other) const { return words_ == other.words_; }
  std::string text() const {
    std::string out = "{";
    for (size_t w = 0; w < words_.size(); ++w)
      for (int b = 0; b < 64; ++b)
        if (words_[w] >> b & 1) out += (out.size() > 1 ? "," : "") + std::to_string(w * 64 + b);
    return out + "}";
  }

 private:
  std::vector<uint64_t> words_;
};

// Position begin+k of a segment holds op over `ranks` of element base+k of their input buffer `inputIndex`,
// combined as reduction tree `tree` (ReductionTrees; tracked only under VerifyOptions::rankOrder).
struct Value {
  bool defined = false;
  uint32_t inputIndex = 0;
  size_t base = 0;
  RankSet ranks;
  uint32_t tree = 0;
  Value advanced(size_t delta) const {
    Value value = *this;
    if (defined) value.base += delta;
    return value;
  }
  bool sameAs(const Value& other) const {
    if (!defined || !other.defined) return defined == other.defined;
    return inputIndex == other.inputIndex && base == other.base && ranks == other.ranks;
  }
  std::string text() const {
    if (!defined) return "nothing";
    return "op over ranks " + ranks.text() + " of input" + (inputIndex ? "#" + std::to_string(inputIndex) : "") + "[" +
           std::to_string(base) + "]";
  }
};

struct Segment {
  size_t begin, end;
  Value value;
};
using Data = std::vector<Segment>;  // positions relative to the region read, covering [0, count)

// A buffer's contents as segments keyed by where they begin, so that reads and writes cost the log of the
// segments held plus those touched: an AllGather's output at a thousand ranks holds a thousand.
class Memory {
 public:
  explicit Memory(size_t size = 0) : size_(size) {
    if (size > 0) segments_.emplace(0, Segment{0, size, Value{}});
  }
  size_t size() const { return size_; }

  Data read(size_t offset, size_t count) const {
    Data data;
    auto it = segments_.upper_bound(offset);
    if (it != segments_.begin()) --it;
    for (; it != segments_.end() && it->second.begin < offset + count; ++it) {
      const Segment& seg = it->second;
      size_t lo = std::max(seg.begin, offset), hi = std::min(seg.end, offset + count);
      if (lo < hi) data.push_back({lo - offset, hi - offset, seg.value.advanced(lo - seg.begin)});
    }
    return data;
  }

  void write(size_t offset, const Data& data) {
    size_t count = data.empty() ? 0 : data.back().end;
    if (count == 0) return;
    splitAt(offset);
    splitAt(offset + count);
    segments_.erase(segments_.lower_bound(offset), segments_.lower_bound(offset + count));
    for (const Segment& seg : data)
      segments_.emplace_hint(segments_.end(), seg.begin + offset, Segment{seg.begin + offset, seg.end + offset, seg.value});
  }

 private:
  // Makes `at` the beginning of a segment (when it lies inside one).
  void splitAt(size_t at) {
    auto it = segments_.upper_bound(at);
    if (it == segments_.begin()) return;
    --it;
    Segment& seg = it->second;
    if (seg.begin == at || seg.end <= at) return;
    Segment tail{at, seg.end, seg.value.advanced(at - seg.begin)};
    seg.end = at;
    segments_.emplace_hint(std::next(it), at, std::move(tail));
  }

  size_t size_;
  std::map<size_t, Segment> segments_;
};

// The reduction trees of a call, interned: node r < n is rank r's own operand, every other node the combination
// of two nodes, one node whichever operand came first (op is commutative for every loomRedOp; only the grouping
// changes a floating-point result). So two elements hold the same bits exactly when their nodes are equal.
class ReductionTrees {
 public:
  explicit ReductionTrees(int nranks) : n_(static_cast<uint32_t>(nranks)) {}
  uint32_t leaf(int rank) const { return static_cast<uint32_t>(rank); }
  uint32_t combine(uint32_t a, uint32_t b) {
    if (a > b) std::swap(a, b);
    const uint64_t key = uint64_t{a} << 32 | b;
    auto [it, added] = ids_.emplace(key, n_ + static_cast<uint32_t>(nodes_.size()));
    if (added) nodes_.push_back({a, b, std::min(lowest(a), lowest(b))});
    return it->second;
  }
  // ((x0 op x1) op x2) ... op x(n-1).
  uint32_t rankOrder() {
    uint32_t tree = leaf(0);
    for (int r = 1; r < static_cast<int>(n_); ++r) tree = combine(tree, leaf(r));
    return tree;
  }
  // "((0+1)+2)", shortened past about `limit` characters; of two operands, the one holding the lower rank first.
  std::string text(uint32_t tree, size_t limit = 120) const {
    std::string out;
    write(tree, limit, &out);
    return out;
  }

 private:
  void write(uint32_t tree, size_t limit, std::string* out) const {
    if (out->size() > limit) {
      if (!out->ends_with("...")) *out += "...";
      return;
    }
    if (tree < n_) {
      *out += std::to_string(tree);
      return;
    }
    const Node& node = nodes_[tree - n_];
    const bool aFirst = lowest(node.a) < lowest(node.b);
    *out += '(';
    write(aFirst ? node.a : node.b, limit, out);
    *out += '+';
    write(aFirst ? node.b : node.a, limit, out);
    *out += ')';
  }
  // The lowest rank a tree holds.
  uint32_t lowest(uint32_t tree) const { return tree < n_ ? tree : nodes_[tree - n_].lowest; }

  struct Node {
    uint32_t a, b, lowest;
  };
  uint32_t n_;
  std::vector<Node> nodes_;  // node n_ + i combines nodes_[i].a and .b
  std::unordered_map<uint64_t, uint32_t> ids_;
};

// Walks two Data of equal length over their common boundaries.
template <typename Fn>
void forEachPiece(const Data& a, const Data& b, Fn fn) {
  size_t i = 0, j = 0, pos = 0;
  while (i < a.size() && j < b.size()) {
    size_t end = std::min(a[i].end, b[j].end);
    fn(pos, end, a[i].value.advanced(pos - a[i].begin), b[j].value.advanced(pos - b[j].begin));
    pos = end;
    if (a[i].end == end) ++i;
    if (b[j].end == end) ++j;
  }
}

// Elementwise op of two operands; overlapping contributions are an error unless the op is idempotent. With
// `trees`, the result's reduction tree is the combination of the operands'.
bool reduceData(const Data& a, const Data& b, bool idempotent, ReductionTrees* trees, Data* out, std::string* error) {
  out->clear();
  bool ok = true;
  forEachPiece(a, b, [&](size_t lo, size_t hi, const Value& x, const Value& y) {
    if (!ok) return;
    if (!x.defined || !y.defined || x.inputIndex != y.inputIndex || x.base != y.base) {
      *error = "reduces " + x.text() + " with " + y.text() + " at element " + std::to_string(lo);
      ok = false;
      return;
    }
    int twice = x.ranks.firstCommon(y.ranks);
    if (twice >= 0 && !idempotent) {
      *error = "counts rank " + std::to_string(twice) + " twice at element " + std::to_string(lo);
      ok = false;
      return;
    }
    Value value = x;
    value.ranks = x.ranks.united(y.ranks);
    if (trees) value.tree = trees->combine(x.tree, y.tree);
    out->push_back({lo, hi, value});
  });
  return ok;
}

struct Message {
  Data data;
  size_t count;
  int lane;
  size_t step;
};

// A connection's messages in flight. Cheaper than a deque to create: an AllToAll at a thousand ranks has a
// million connections.
class Fifo {
 public:
  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  const Message& front() const { return items_[head_]; }
  void push(Message message) { items_.push_back(std::move(message)); }
  void pop() {
    items_[head_++].data.clear();
    if (empty()) items_.clear(), head_ = 0;
  }

 private:
  std::vector<Message> items_;
  size_t head_ = 0;
};

// How the public API's in-place layout aliases one buffer inside another.
struct Alias {
  bool active = false;
  Buffer inner, outer;
  size_t offset;
};

Alias inPlaceAlias(const CollArgs& args) {
  size_t r = static_cast<size_t>(args.rank), c = args.count;
  switch (args.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kReduce:
      return {true, Buffer::kInput, Buffer::kOutput, 0};
    case Collective::kAllGather:
      return {true, Buffer::kInput, Buffer::kOutput, r * c};
    case Collective::kReduceScatter:
      return {true, Buffer::kOutput, Buffer::kInput, r * c};
    case Collective::kGather:
      if (args.rank == args.root) return {true, Buffer::kInput, Buffer::kOutput, r * c};
      return {};
    case Collective::kScatter:
      if (args.rank == args.root) return {true, Buffer::kOutput, Buffer::kInput, r * c};
      return {};
    default:
      return {};
  }
}

using StoreKey = std::pair<int, uint32_t>;  // (Buffer, bufferIndex)

class Verifier {
 public:
  Verifier(const std::vector<CollArgs>& perRank, const VerifyOptions& options)
      : args_(perRank), options_(options), n_(static_cast<int>(perRank.size())), trees_(n_) {}

  std::string run(const PlanBuilder& build) {
    plans_.resize(n_);
    stores_.resize(n_);
    aliases_.resize(n_);
    for (int r = 0; r < n_; ++r) {
      plans_[r] = build(args_[r]);
      std::string error = checkShape(r);
      if (!error.empty()) return error;
      initMemory(r);
    }
    std::string error = simulate();
    if (!error.empty()) return error;
    for (int r = 0; r < n_ && error.empty(); ++r) error = checkResult(r);
    return error;
  }

 private:
  bool idempotent() const { return args_[0].collective == Collective::kBarrier; }
  // The trees rankOrder checks, for calls whose output holds reductions (none otherwise).
  ReductionTrees* trackedTrees() {
    return options_.rankOrder && reducesElements(args_[0].collective) ? &trees_ : nullptr;
  }

  size_t bufferSize(int rank, Buffer buffer, uint32_t index) const {
    const CollArgs& args = args_[rank];
    if (buffer == Buffer::kScratch) return plans_[rank].scratchCount;
    if (args.collective == Collective::kSendRecv) {
      if (index >= args.p2p.size() || args.p2p[index].isSend != (buffer == Buffer::kInput)) return 0;
      return args.p2p[index].count;
    }
    if (index != 0) return 0;
    return buffer == Buffer::kInput ? plans_[rank].inputCount : plans_[rank].outputCount;
  }

  std::string where(int rank, size_t lane, size_t step) const {
    return std::string(collectiveName(args_[rank].collective)) + " (" + plans_[rank].algorithm + ", " +
           std::to_string(n_) + " ranks, count " + std::to_string(args_[rank].count) + "): rank " +
           std::to_string(rank) + " lane " + std::to_string(lane) + " step " + std::to_string(step);
  }

  std::string checkShape(int rank) {
    const RankPlan& plan = plans_[rank];
    for (size_t l = 0; l < plan.lanes.size(); ++l) {
      const std::vector<uint32_t>& starts = plan.lanes[l].phaseStarts;
      for (size_t p = 0; p < starts.size(); ++p)
        if (starts[p] == 0 || starts[p] > plan.lanes[l].steps.size() || (p > 0 && starts[p] <= starts[p - 1]))
          return where(rank, l, starts[p]) + ": phase starts must be steps after the first, in ascending order";
      for (size_t s = 0; s < plan.lanes[l].steps.size(); ++s) {
        const Step& step = plan.lanes[l].steps[s];
        size_t count = step.count();
        std::vector<const Region*> regions;
        if (step.action != Action::kRecv && step.action != Action::kRecvCopySend) regions.push_back(&step.src);
        if (step.action == Action::kReduce) regions.push_back(&step.src2);
        if (step.action != Action::kSend && step.action != Action::kRecvReduceSend) {
          if (step.dst.buffer == Buffer::kInput) return where(rank, l, s) + ": writes to the input buffer";
          regions.push_back(&step.dst);
        }
        for (const Region* region : regions) {
          if (region->count != count) return where(rank, l, s) + ": regions of different sizes";
          if (region->offset + region->count > bufferSize(rank, region->buffer, region->bufferIndex))
            return where(rank, l, s) + ": region [" + std::to_string(region->offset) + ", +" +
                   std::to_string(region->count) + ") is outside its buffer of " +
                   std::to_string(bufferSize(rank, region->buffer, region->bufferIndex)) + " elements";
        }
        // A message carries the call's type: a plan whose scratch holds wider partials sends none of them.
        if (plan.wideScratch && actionSends(step.action) &&
            (step.src.buffer == Buffer::kScratch ||
             (step.action == Action::kRecvReduceCopySend && step.dst.buffer == Buffer::kScratch)))
          return where(rank, l, s) + ": sends from scratch, which holds wider partials (wideScratch)";
        bool badIn = actionReceives(step.action) && (step.recvPeer < 0 || step.recvPeer >= n_ || step.recvPeer == rank);
        bool badOut = actionSends(step.action) && (step.sendPeer < 0 || step.sendPeer >= n_ || step.sendPeer == rank);
        if (badIn || badOut)
          return where(rank, l, s) + ": peer " + std::to_string(badIn ? step.recvPeer : step.sendPeer) +
                 " is out of range or this rank itself";
      }
    }
    return "";
  }

  std::pair<StoreKey, size_t> resolve(int rank, const Region& region) const {
    const Alias& alias = aliases_[rank];
    if (alias.active && region.buffer == alias.inner)
      return {{static_cast<int>(alias.outer), 0}, region.offset + alias.offset};
    return {{static_cast<int>(region.buffer), region.bufferIndex}, region.offset};
  }

  Memory& store(int rank, const StoreKey& key) {
    auto& stores = stores_[rank];
    auto found = stores.find(key);
    if (found == stores.end())
      found = stores.emplace(key, Memory(bufferSize(rank, static_cast<Buffer>(key.first), key.second))).first;
    return found->second;
  }

  Data read(int rank, const Region& region) {
    auto [key, offset] = resolve(rank, region);
    return store(rank, key).read(offset, region.count);
  }
  void write(int rank, const Region& region, const Data& data) {
    auto [key, offset] = resolve(rank, region);
    store(rank, key).write(offset, data);
  }

  void initMemory(int rank) {
    const CollArgs& args = args_[rank];
    if (options_.inPlace) aliases_[rank] = inPlaceAlias(args);
    auto initInput = [&](uint32_t index, size_t count) {
      if (count == 0) return;
      Value value{true, index, 0, RankSet::single(n_, rank), trees_.leaf(rank)};
      write(rank, Region{Buffer::kInput, 0, count, index}, Data{{0, count, value}});
    };
    if (args.collective == Collective::kSendRecv) {
      for (uint32_t i = 0; i < args.p2p.size(); ++i)
        if (args.p2p[i].isSend) initInput(i, args.p2p[i].count);
    } else if (args.collective == Collective::kBarrier) {
      write(rank, scratch(0, 1), Data{{0, 1, Value{true, 0, 0, RankSet::single(n_, rank)}}});
    } else {
      initInput(0, plans_[rank].inputCount);
    }
  }

  std::pair<size_t, size_t> slice(const Step& step, size_t round) const {
    size_t count = step.count();
    if (options_.sliceElems == 0) return {0, round == 0 ? count : 0};
    size_t lo = std::min(count, round * options_.sliceElems);
    return {lo, std::min(count, lo + options_.sliceElems)};
  }

  // How many slices a step has: what LaneCursor walks.
  auto slicesOf() const {
    return [this](const Step& step) -> size_t {
      if (step.count() == 0) return 0;
      return options_.sliceElems == 0 ? 1 : (step.count() + options_.sliceElems - 1) / options_.sliceElems;
    };
  }

  static Region sub(const Region& region, size_t lo, size_t hi) {
    return {region.buffer, region.offset + lo, hi - lo, region.bufferIndex};
  }

  // Runs one unit (a slice of a step) if its message is there and its FIFO has room. "" = ran or blocked.
  std::string tryUnit(int rank, size_t l, const LaneCursor& cursor, bool* ran) {
    const Lane& lane = plans_[rank].lanes[l];
    const Step& step = lane.steps[cursor.step()];
    auto [lo, hi] = slice(step, cursor.round());
    *ran = false;
    if (lo == hi) {
      *ran = true;
      return "";
    }
    Fifo* in = nullptr;
    Fifo* out = nullptr;
    if (actionReceives(step.action)) {
      in = &fifos_[{step.recvPeer, rank, lane.channel}];
      if (in->empty()) return "";
      if (in->front().count != hi - lo)
        return where(rank, l, cursor.step()) + " (" + actionName(step.action) + ") expects " + std::to_string(hi - lo) +
               " elements from rank " + std::to_string(step.recvPeer) + " on channel " + std::to_string(lane.channel) +
               ", but the next message holds " + std::to_string(in->front().count) + " (rank " +
               std::to_string(step.recvPeer) + " lane " + std::to_string(in->front().lane) + " step " +
               std::to_string(in->front().step) + ")";
    }
    if (actionSends(step.action)) {
      out = &fifos_[{rank, step.sendPeer, lane.channel}];
      if (options_.fifoDepth > 0 && static_cast<int>(out->size()) >= options_.fifoDepth) return "";
    }
    Data incoming = in ? in->front().data : Data{};
    Data result;
    std::string error;
    switch (step.action) {
      case Action::kSend:
        result = read(rank, sub(step.src, lo, hi));
        break;
      case Action::kRecv:
        write(rank, sub(step.dst, lo, hi), incoming);
        break;
      case Action::kRecvCopySend:
        write(rank, sub(step.dst, lo, hi), incoming);
        result = incoming;
        break;
      case Action::kCopy:
        write(rank, sub(step.dst, lo, hi), read(rank, sub(step.src, lo, hi)));
        break;
      case Action::kReduce:
      case Action::kRecvReduce:
      case Action::kRecvReduceSend:
      case Action::kRecvReduceCopySend: {
        Data other = step.action == Action::kReduce ? read(rank, sub(step.src2, lo, hi)) : incoming;
        if (!reduceData(read(rank, sub(step.src, lo, hi)), other, idempotent(), trackedTrees(), &result, &error))
          return where(rank, l, cursor.step()) + " (" + actionName(step.action) + ") " + error;
        if (step.action != Action::kRecvReduceSend) write(rank, sub(step.dst, lo, hi), result);
        break;
      }
    }
    if (in) in->pop();
    if (out) out->push({std::move(result), hi - lo, static_cast<int>(l), cursor.step()});
    *ran = true;
    return "";
  }

  std::string simulate() {
    std::vector<std::vector<LaneCursor>> cursors(n_);
    for (int r = 0; r < n_; ++r) {
      for (const Lane& lane : plans_[r].lanes) {
        cursors[r].emplace_back();
        cursors[r].back().start(lane, slicesOf());
      }
    }
    // A rank taking a message makes room in a bounded FIFO: its sender is woken too.
    ReadyRanks ready(n_);
    for (int r; ready.pop(&r);) {
      for (size_t l = 0; l < cursors[r].size(); ++l) {
        LaneCursor& cursor = cursors[r][l];
        while (!cursor.done()) {
          bool ran = false;
          std::string error = tryUnit(r, l, cursor, &ran);
          if (!error.empty()) return error;
          if (!ran) break;
          const Step& step = plans_[r].lanes[l].steps[cursor.step()];
          if (actionSends(step.action)) ready.wake(step.sendPeer);
          if (actionReceives(step.action)) ready.wake(step.recvPeer);
          cursor.next(slicesOf());
        }
      }
    }
    for (int r = 0; r < n_; ++r) {
      for (size_t l = 0; l < cursors[r].size(); ++l) {
        const LaneCursor& cursor = cursors[r][l];
        if (cursor.done()) continue;
        const Step& step = plans_[r].lanes[l].steps[cursor.step()];
        return where(r, l, cursor.step()) + " (" + actionName(step.action) + ", round " + std::to_string(cursor.round()) +
               ") can never run: deadlock or a message that is never sent";
      }
    }
    for (const auto& [key, queue] : fifos_)
      if (!queue.empty())
        return std::string(collectiveName(args_[0].collective)) + ": " + std::to_string(queue.size()) +
               " message(s) from rank " + std::to_string(std::get<0>(key)) + " to rank " +
               std::to_string(std::get<1>(key)) + " on channel " + std::to_string(std::get<2>(key)) +
               " are never received";
    return "";
  }

  // What output element i of `rank` must hold, as Data over the whole output (or per recv op for SendRecv).
  std::vector<std::pair<Region, Data>> expected(int rank) const {
    const CollArgs& args = args_[rank];
    size_t c = args.count, r = static_cast<size_t>(rank);
    std::vector<std::pair<Region, Data>> out;
    auto block = [&](size_t at, size_t count, int from, size_t base, bool all) -> Segment {
      return {at, at + count, Value{true, 0, base, all ? RankSet::all(n_) : RankSet::single(n_, from)}};
    };
    Data data;
    switch (args.collective) {
      case Collective::kAllReduce:
        data.push_back(block(0, c, 0, 0, true));
        break;
      case Collective::kReduceScatter:
        data.push_back(block(0, c, 0, r * c, true));
        break;
      case Collective::kBroadcast:
        data.push_back(block(0, c, args.root, 0, false));
        break;
      case Collective::kScatter:
        data.push_back(block(0, c, args.root, r * c, false));
        break;
      case Collective::kReduce:
        if (rank == args.root) data.push_back(block(0, c, 0, 0, true));
        break;
      case Collective::kAllGather:
      case Collective::kGather:
        if (args.collective == Collective::kGather && rank != args.root) break;
        for (int p = 0; p < n_; ++p) data.push_back(block(p * c, c, p, 0, false));
        break;
      case Collective::kAllToAll:
        for (int p = 0; p < n_; ++p) data.push_back(block(p * c, c, p, r * c, false));
        break;
      case Collective::kAllToAllv: {
        // Blocks may come in any order in the buffer; gaps must stay untouched.
        std::vector<int> order(n_);
        for (int p = 0; p < n_; ++p) order[p] = p;
        std::sort(order.begin(), order.end(), [&](int a, int b) { return args.recvDispls[a] < args.recvDispls[b]; });
        size_t at = 0;
        for (int p : order) {
          if (args.recvCounts[p] == 0) continue;
          if (args.recvDispls[p] > at) data.push_back({at, args.recvDispls[p], Value{}});
          data.push_back(block(args.recvDispls[p], args.recvCounts[p], p, args_[p].sendDispls[rank], false));
          at = args.recvDispls[p] + args.recvCounts[p];
        }
        if (at < plans_[rank].outputCount) data.push_back({at, plans_[rank].outputCount, Value{}});
        break;
      }
      case Collective::kSendRecv: {
        std::map<int, std::vector<uint32_t>> sendsTo;  // sender's ops to this rank, in order
        std::map<int, size_t> nextFrom;
        for (uint32_t i = 0; i < args.p2p.size(); ++i) {
          const P2POp& op = args.p2p[i];
          if (op.isSend || op.count == 0) continue;
          const auto& peerOps = args_[op.peer].p2p;
          size_t& k = nextFrom[op.peer];
          uint32_t match = 0;
          for (size_t seen = 0, j = 0; j < peerOps.size(); ++j) {
            if (!peerOps[j].isSend || peerOps[j].peer != rank || peerOps[j].count == 0) continue;
            if (seen++ == k) {
              match = static_cast<uint32_t>(j);
              break;
            }
          }
          ++k;
          out.push_back({Region{Buffer::kOutput, 0, op.count, i},
                         Data{{0, op.count, Value{true, match, 0, RankSet::single(n_, op.peer)}}}});
        }
        return out;
      }
      case Collective::kBarrier:
        return {{scratch(0, 1), Data{block(0, 1, 0, 0, true)}}};
    }
    if (!data.empty()) out.push_back({output(0, plans_[rank].outputCount), data});
    return out;
  }

  std::string checkResult(int rank) {
    const bool checkOrder = trackedTrees() != nullptr && n_ > 1;
    const uint32_t inRankOrder = checkOrder ? trees_.rankOrder() : 0;
    for (const auto& [region, want] : expected(rank)) {
      Data got = read(rank, region);
      std::string error;
      auto call = [&] {
        return std::string(collectiveName(args_[rank].collective)) + " (" + plans_[rank].algorithm + ", " +
               std::to_string(n_) + " ranks, count " + std::to_string(args_[rank].count) +
               (options_.inPlace ? ", in place" : "") + "): rank " + std::to_string(rank);
      };
      forEachPiece(got, want, [&](size_t lo, size_t, const Value& x, const Value& y) {
        if (!error.empty()) return;
        if (!x.sameAs(y))
          error = call() + " element " + std::to_string(lo) + " holds " + x.text() + ", expected " + y.text();
        else if (checkOrder && x.tree != inRankOrder)
          error = call() + " element " + std::to_string(lo) + " combines the ranks as " + trees_.text(x.tree) +
                  ", not in rank order " + trees_.text(inRankOrder);
      });
      if (!error.empty()) return error;
    }
    return "";
  }

  const std::vector<CollArgs>& args_;
  VerifyOptions options_;
  int n_;
  std::vector<RankPlan> plans_;
  std::vector<std::map<StoreKey, Memory>> stores_;
  std::vector<Alias> aliases_;
  std::map<std::tuple<int, int, int>, Fifo> fifos_;
  ReductionTrees trees_;
};

}  // namespace

std::vector<CollArgs> argsForAllRanks(const CollArgs& args) {
  std::vector<CollArgs> all(args.nranks, args);
  for (int r = 0; r < args.nranks; ++r) all[r].rank = r;
  return all;
}

std::string verifyPlan(const std::vector<CollArgs>& perRank, const std::string& algorithm,
                       const VerifyOptions& options) {
  if (perRank.empty()) return "no ranks";
  RankPlan probe;
  if (!buildPlan(perRank[0], algorithm, &probe))
    return "no algorithm '" + algorithm + "' for " + collectiveName(perRank[0].collective);
  return verifyPlan(
      perRank,
      [&](const CollArgs& args) {
        RankPlan plan;
        buildPlan(args, algorithm, &plan);
        return plan;
      },
      options);
}

std::string verifyPlan(const std::vector<CollArgs>& perRank, const PlanBuilder& build, const VerifyOptions& options) {
  if (perRank.empty()) return "no ranks";
  Verifier verifier(perRank, options);
  return verifier.run(build);
}

}  // namespace loom
