#include "src/ep/low_latency.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "algorithms/plan.h"
#include "src/base/check.h"
#include "src/base/integrity.h"
#include "src/base/log.h"
#include "src/core/comm.h"
#include "src/core/mem.h"
#include "src/ep/ll_words.h"
#include "src/exec/reduce.h"
#include "transports/fifo_protocol.h"

namespace loom::ep {
namespace {

// The window's first words: control, then the regions.
constexpr size_t kControlWords = 8;
// Control word 0: 1 + the rank that gave up on this object's calls (0: none did).
std::atomic<uint64_t>* gaveUpWord(uint64_t* window) { return reinterpret_cast<std::atomic<uint64_t>*>(window); }

// What ranks tell each other about their windows at create time.
struct WindowInfo {
  int32_t pid;
  int32_t unused;
  uint64_t base;
  uint64_t bytes;
  SharedRegion region;
};

}  // namespace

// A piece of a region sent through a connection: where it goes in the receiver's window, then its words.
struct LowLatency::Piece {
  uint32_t id;
  uint32_t phase;
  uint64_t sequence;
  uint64_t offset;  // words from the region's start
  uint64_t words;
};

LowLatency::LowLatency(loomComm* comm, const Shape& shape, uint32_t id, int channel)
    : comm_(comm), shape_(shape), id_(id), channel_(channel) {
  dispatchRegionWords_ = dispatchHeaderWords() + static_cast<size_t>(shape.maxTokens) * slotWords(kDispatch);
  combineRegionWords_ = 1 + static_cast<size_t>(shape.maxTokens) * slotWords(kCombine);
  windowBytes_ =
      8 * (kControlWords + 2 * static_cast<size_t>(shape.nranks) * (dispatchRegionWords_ + combineRegionWords_));
}

LowLatency::~LowLatency() {
  for (void* mapped : sameProcessMappings_) munmap(mapped, windowBytes_);
  if (allocation_ != nullptr) loomMemFree(allocation_);
}

size_t LowLatency::regionOffset(Phase phase, uint64_t sequence, int source) const {
  size_t buffer = sequence & 1;
  size_t dispatchWords = 2 * static_cast<size_t>(shape_.nranks) * dispatchRegionWords_;
  size_t base = kControlWords + (phase == kDispatch ? 0 : dispatchWords);
  return base + (buffer * shape_.nranks + source) * regionWords(phase);
}

loomResult_t LowLatency::create(loomComm* comm, const Shape& shape, uint32_t id, int channel,
                                std::unique_ptr<LowLatency>* out) {
  std::unique_ptr<LowLatency> ll(new LowLatency(comm, shape, id, channel));
  if (loomMemAlloc(&ll->allocation_, ll->windowBytes_) != loomSuccess)
    return LOOM_FAIL(loomSystemError, COLL, "loomEpCreate: cannot allocate the %zu-byte receive window (%s)",
                     ll->windowBytes_, threadLastError().c_str());
  ll->window_ = static_cast<uint64_t*>(ll->allocation_);
  LOOM_CHECK(ll->connect());
  *out = std::move(ll);
  return loomSuccess;
}

loomResult_t LowLatency::connect() {
  const int nranks = shape_.nranks, rank = shape_.rank;
  std::vector<WindowInfo> infos(nranks);
  infos[rank] = {static_cast<int32_t>(getpid()), 0, reinterpret_cast<uint64_t>(window_), windowBytes_,
                 sharedRegionOf(window_, windowBytes_)};
  LOOM_CHECK(comm_->bootstrap->allGather(infos.data(), sizeof(WindowInfo), comm_->settings.timeoutMs));
  // Map the windows of the peers whose memory this rank shares (the transport between them says so).
  peerWindow_.assign(nranks, nullptr);
  peerWindow_[rank] = window_;
  for (int p = 0; p < nranks; ++p) {
    if (p == rank || !comm_->traitsTo[p].carriesDirect) continue;
    if (infos[p].pid == infos[rank].pid) {
      // A rank of this process: a mapping of its own, so that the window outlives that rank's EP object (which may
      // be destroyed while this rank still writes into it, as after a failure).
      if (infos[p].region.fd < 0) continue;
      void* mapped = mmap(nullptr, infos[p].bytes, PROT_READ | PROT_WRITE, MAP_SHARED, infos[p].region.fd, 0);
      if (mapped == MAP_FAILED) continue;
      sameProcessMappings_.push_back(mapped);
      peerWindow_[p] = static_cast<uint64_t*>(mapped);
      continue;
    }
    DirectDescriptor descriptor{infos[p].base, infos[p].bytes, infos[p].pid, infos[p].region};
    peerWindow_[p] = static_cast<uint64_t*>(const_cast<void*>(mappings_.resolve(descriptor)));
  }
  // Which writer reaches which window directly: each rank's row of the matrix, gathered.
  std::vector<char> mapped(static_cast<size_t>(nranks) * nranks);
  for (int p = 0; p < nranks; ++p) mapped[static_cast<size_t>(rank) * nranks + p] = peerWindow_[p] != nullptr;
  LOOM_CHECK(comm_->bootstrap->allGather(mapped.data(), nranks, comm_->settings.timeoutMs));
  piecesFrom_.assign(nranks, 0);
  closed_.assign(nranks, 0);
  images_.assign(nranks, {});
  RankPlan plan;
  plan.lanes.emplace_back();
  plan.lanes[0].channel = channel_;
  for (int p = 0; p < nranks; ++p) {
    if (!mapped[static_cast<size_t>(p) * nranks + rank]) {
      piecesFrom_[p] = 1;
      Step step{};
      step.action = Action::kRecv;
      step.recvPeer = p;
      plan.lanes[0].steps.push_back(step);
    }
    if (peerWindow_[p] == nullptr) {
      Step step{};
      step.action = Action::kSend;
      step.sendPeer = p;
      plan.lanes[0].steps.push_back(step);
    }
  }
  // Under LOOM_CHECKSUM a piece's CRC32C follows it in the slot.
  size_t payload = fifoPayloadBytes(comm_->settings.fifoShape, Protocol::kSimple) -
                   (comm_->settings.checksum ? kChecksumBytes : 0);
  pieceWords_ = payload > sizeof(Piece) ? (payload - sizeof(Piece)) / 8 : 0;
  if (!plan.lanes[0].steps.empty() && pieceWords_ == 0)
    return LOOM_FAIL(loomInvalidUsage, COLL, "loomEpCreate: FIFO slots of %zu bytes cannot carry a window piece",
                     payload);
  LOOM_CHECK(comm_->connections.createReceivers(comm_, plan));
  CommWatch watch(comm_, "loomEpCreate");
  LOOM_CHECK(comm_->connections.attachSenders(comm_, plan, [&] { return watch(false); }));
  int direct = 0;
  for (int p = 0; p < nranks; ++p) direct += peerWindow_[p] != nullptr && p != rank;
  LOOM_INFO(COLL, "EP low-latency window %zu bytes; this rank writes %d peer window(s) directly and %d through "
            "connections", windowBytes_, direct, nranks - 1 - direct);
  return loomSuccess;
}

uint64_t* LowLatency::target(int peer, Phase phase, uint64_t sequence) {
  if (peerWindow_[peer] != nullptr) return peerWindow_[peer] + regionOffset(phase, sequence, shape_.rank);
  std::vector<uint64_t>& image = images_[peer];
  image.resize(regionWords(phase));
  return image.data();
}

loomResult_t LowLatency::pushPieces(bool* moved) {
  for (Outbound& o : outbound_) {
    while (o.sent < o.total) {
      FifoSender* sender = comm_->connections.sender(o.peer, channel_);
      if (sender->aborted())
        return LOOM_FAIL(loomRemoteError, COLL, "EP %s on rank %d: the connection to rank %d was %s",
                         o.phase == kDispatch ? "dispatch" : "combine", shape_.rank, o.peer,
                         sender->abortCode() == kConnectionLost ? "lost" : "given up by the peer");
      void* slot = sender->reserve(Protocol::kSimple);
      if (slot == nullptr) break;
      size_t words = std::min(pieceWords_, o.total - o.sent);
      Piece piece{id_, o.phase, o.sequence, o.sent, words};
      std::memcpy(slot, &piece, sizeof(piece));
      std::memcpy(static_cast<std::byte*>(slot) + sizeof(piece), o.words + o.sent, words * 8);
      size_t bytes = sizeof(piece) + words * 8;
      if (comm_->settings.checksum) {
        // The piece's CRC32C after it (LOOM_CHECKSUM), checked by pullPieces. The fault hook flips a bit of what
        // lands: here where this rank writes the receiver's FIFO itself, else in the receiving proxy.
        const uint32_t sum = crc32c(slot, bytes);
        std::memcpy(static_cast<std::byte*>(slot) + bytes, &sum, kChecksumBytes);
        bytes += kChecksumBytes;
        if (!comm_->connections.movesByProxy(o.peer)) corruptInTransit(slot, bytes);
      }
      sender->post(Protocol::kSimple, bytes);
      o.sent += words;
      *moved = true;
    }
  }
  return loomSuccess;
}

loomResult_t LowLatency::pullPieces(bool* moved) {
  for (int p = 0; p < shape_.nranks; ++p) {
    if (!piecesFrom_[p]) continue;
    FifoReceiver* receiver = comm_->connections.receiver(p, channel_);
    for (;;) {
      size_t bytes = 0;
      bool direct = false;
      const void* message = receiver->poll(Protocol::kSimple, &bytes, &direct);
      if (message == nullptr) {
        if (receiver->aborted() && receiver->empty()) closed_[p] = receiver->abortCode();
        break;
      }
      Piece piece;
      const size_t trailer = comm_->settings.checksum ? kChecksumBytes : 0;
      if (direct || bytes < sizeof(piece) + trailer)
        return LOOM_FAIL(loomInternalError, COLL, "EP on rank %d: a malformed message from rank %d", shape_.rank, p);
      bytes -= trailer;
      if (trailer != 0) LOOM_CHECK(checkPiece(message, bytes, p));
      std::memcpy(&piece, message, sizeof(piece));
      // Pieces of an earlier EP object on this channel are left over from its last calls: dropped.
      if (piece.id == id_) {
        Phase phase = piece.phase == kDispatch ? kDispatch : kCombine;
        if ((piece.phase != kDispatch && piece.phase != kCombine) || piece.words * 8 + sizeof(piece) != bytes ||
            piece.offset > regionWords(phase) || piece.words > regionWords(phase) - piece.offset)
          return LOOM_FAIL(loomInternalError, COLL, "EP on rank %d: a malformed piece from rank %d", shape_.rank, p);
        std::memcpy(own(phase, piece.sequence, p) + piece.offset,
                    static_cast<const std::byte*>(message) + sizeof(piece), piece.words * 8);
      }
      receiver->release();
      *moved = true;
    }
  }
  return loomSuccess;
}

loomResult_t LowLatency::checkPiece(const void* message, size_t bytes, int sender) {
  uint32_t carried = 0;
  std::memcpy(&carried, static_cast<const std::byte*>(message) + bytes, kChecksumBytes);
  const uint32_t computed = crc32c(message, bytes);
  if (computed == carried) return loomSuccess;
  comm_->connections.noteFailure(corruptedOrigin(shape_.rank, sender));
  return LOOM_FAIL(loomRemoteError, COLL,
                   "EP low-latency on rank %d: a piece from rank %d to rank %d on channel %d failed its checksum "
                   "(LOOM_CHECKSUM): %zu bytes (CRC32C %08x computed, %08x carried): the data was corrupted on its way",
                   shape_.rank, sender, shape_.rank, channel_, bytes, computed, carried);
}

void LowLatency::giveUp(loomResult_t result) {
  for (int p = 0; p < shape_.nranks; ++p)
    if (peerWindow_[p] != nullptr && p != shape_.rank)
      gaveUpWord(peerWindow_[p])->store(static_cast<uint64_t>(shape_.rank) + 1, std::memory_order_relaxed);
  int expected = loomSuccess;
  comm_->asyncError.compare_exchange_strong(expected, result);
  comm_->connections.abortAll();
}

bool LowLatency::regionArrived(Phase phase, uint64_t sequence, int source) {
  const uint64_t* region = own(phase, sequence, source);
  const uint32_t flag = fifo::llFlag(sequence);
  size_t headerWords = phase == kDispatch ? dispatchHeaderWords() : 1;
  uint32_t count = 0;
  if (!llLastReady(region, headerWords, flag) || !llGet(&count, region, 1, flag) ||
      count > static_cast<uint32_t>(shape_.maxTokens))
    return false;
  return count == 0 || slotReady(region + headerWords + count * slotWords(phase) - 1, flag);
}

template <typename Consume>
loomResult_t LowLatency::progress(const char* what, Phase phase, uint64_t sequence, Consume consume,
                                  const std::vector<char>& awaited) {
  CommWatch watch(comm_, what);
  Backoff backoff(comm_->settings.spinPolls);
  // A peer that gave up before this call was made stays given up: the call fails at once.
  if (uint64_t who = gaveUpWord(window_)->load(std::memory_order_relaxed); who != 0) {
    outbound_.clear();
    return LOOM_FAIL(loomRemoteError, COLL, "%s on rank %d: rank %d gave up on an earlier EP call", what, shape_.rank,
                     static_cast<int>(who - 1));
  }
  bool network = !outbound_.empty() || std::find(piecesFrom_.begin(), piecesFrom_.end(), 1) != piecesFrom_.end();
  if (network) network = comm_->connections.beginNetworkProgress();
  loomResult_t result = loomSuccess;
  for (;;) {
    bool moved = false;
    result = pushPieces(&moved);
    if (result == loomSuccess) result = pullPieces(&moved);
    bool done = false;
    if (result == loomSuccess) result = consume(&moved, &done);
    for (int p = 0; p < shape_.nranks && result == loomSuccess; ++p)
      if (closed_[p] != 0 && awaited[p] && !regionArrived(phase, sequence, p))
        result = LOOM_FAIL(loomRemoteError, COLL, "%s on rank %d: the connection from rank %d was %s", what,
                           shape_.rank, p, closed_[p] == kConnectionLost ? "lost" : "given up by the peer");
    if (result != loomSuccess) break;
    bool sent = std::all_of(outbound_.begin(), outbound_.end(), [](const Outbound& o) { return o.sent == o.total; });
    if (done && sent) break;
    if (!moved && network) moved = comm_->connections.progressNetwork();
    if (uint64_t who = gaveUpWord(window_)->load(std::memory_order_relaxed); who != 0) {
      result = LOOM_FAIL(loomRemoteError, COLL, "%s on rank %d: rank %d gave up on an EP call", what, shape_.rank,
                         static_cast<int>(who - 1));
      break;
    }
    // A peer the call still reads from, or still has pieces for.
    result = watch(moved, [&](int peer) {
      return (awaited[peer] && !regionArrived(phase, sequence, peer)) ||
             std::any_of(outbound_.begin(), outbound_.end(),
                         [&](const Outbound& o) { return o.peer == peer && o.sent < o.total; });
    });
    if (result != loomSuccess) break;
    if (moved)
      backoff.reset();
    else
      backoff.pause();
  }
  if (network) comm_->connections.endNetworkProgress();
  outbound_.clear();
  if (result != loomSuccess && result != loomInvalidArgument) giveUp(result);
  return result;
}

loomResult_t LowLatency::dispatch(const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                                  void* recvX, int* counts, Routing* routing, uint64_t* bytesSent, uint64_t* dropped) {
  const int nranks = shape_.nranks, rank = shape_.rank, localExperts = shape_.localExperts;
  const uint64_t sequence = ++dispatchSequence_;
  const uint32_t flag = fifo::llFlag(sequence);
  const size_t headerWords = dispatchHeaderWords(), recordWords = slotWords(kDispatch);
  const size_t metaWords = shape_.metaWords(), rowBytes = shape_.rowBytes();
  route(
      shape_, numTokens, topkIdx, topkWeights, nranks, [&](int expert) { return shape_.rankOfExpert(expert); }, true,
      &outgoing_);
  routing->sentTokens.assign(nranks, {});
  meta_.resize(std::max(metaWords, headerWords));
  // Puts: every peer's region, this rank's own last: each record's meta and row, then its flag; the header (LL
  // words) last.
  for (int k = 1; k <= nranks; ++k) {
    int peer = (rank + k) % nranks;
    const Outgoing& o = outgoing_[peer];
    uint64_t* region = target(peer, kDispatch, sequence);
    for (size_t i = 0; i < o.size(); ++i) {
      auto* record = reinterpret_cast<std::byte*>(region + headerWords + i * recordWords);
      encodeMeta(shape_, rank, o, i, meta_.data());
      std::memcpy(record, meta_.data(), metaWords * 4);
      std::memcpy(record + metaWords * 4,
                  static_cast<const std::byte*>(x) + static_cast<size_t>(o.tokens[i]) * rowBytes, rowBytes);
      slotPublish(region + headerWords + (i + 1) * recordWords - 1, flag);
    }
    meta_[0] = static_cast<uint32_t>(o.size());
    for (int e = 0; e < localExperts; ++e) meta_[1 + e] = static_cast<uint32_t>(o.perLocalExpert[e]);
    llPut(region, meta_.data(), headerWords, flag);
    if (peer != rank) *bytesSent += o.size() * rowBytes;
    if (peerWindow_[peer] == nullptr)
      outbound_.push_back({peer, images_[peer].data(), headerWords + o.size() * recordWords, 0, kDispatch, sequence});
    routing->sentTokens[peer] = o.tokens;
  }
  // Reads: every source's header, then (offsets known) its records as they complete, in order per source.
  std::vector<int32_t> tokensFrom(nranks, -1), perExpert(static_cast<size_t>(nranks) * localExperts);
  std::vector<uint32_t> next(nranks, 0);
  std::vector<char> awaited(nranks, 1);
  std::vector<std::vector<Destination>> destsFrom(nranks);
  std::vector<std::vector<uint32_t>> destCounts(nranks);
  std::vector<uint32_t> header(headerWords);
  std::vector<uint32_t> meta(metaWords);
  Placement placement;
  int headersMissing = nranks;
  std::string malformed;
  auto consume = [&](bool* moved, bool* done) -> loomResult_t {
    for (int s = 0; s < nranks && headersMissing > 0; ++s) {
      if (tokensFrom[s] >= 0) continue;
      const uint64_t* region = own(kDispatch, sequence, s);
      if (!llLastReady(region, headerWords, flag) || !llGet(header.data(), region, headerWords, flag)) continue;
      int64_t sum = 0;
      for (int e = 0; e < localExperts; ++e) sum += header[1 + e];
      if (header[0] > static_cast<uint32_t>(shape_.maxTokens) || sum > int64_t{header[0]} * shape_.topk)
        return LOOM_FAIL(loomInternalError, COLL, "EP dispatch on rank %d: a malformed header from rank %d", rank, s);
      tokensFrom[s] = static_cast<int32_t>(header[0]);
      std::copy(header.begin() + 1, header.end(), perExpert.begin() + static_cast<size_t>(s) * localExperts);
      --headersMissing;
      *moved = true;
      if (headersMissing == 0) placement.start(shape_, perExpert);
    }
    if (headersMissing > 0) return loomSuccess;
    bool all = true;
    for (int s = 0; s < nranks; ++s) {
      const uint64_t* region = own(kDispatch, sequence, s);
      for (; next[s] < static_cast<uint32_t>(tokensFrom[s]); ++next[s]) {
        const uint64_t* slot = region + headerWords + next[s] * recordWords;
        if (!slotReady(slot + recordWords - 1, flag)) break;
        const auto* record = reinterpret_cast<const std::byte*>(slot);
        std::memcpy(meta.data(), record, metaWords * 4);
        RecordView view;
        if (!readRecord(shape_, meta.data(), &view, &malformed) || view.source != s)
          return LOOM_FAIL(loomInternalError, COLL, "EP dispatch on rank %d: %s (from rank %d)", rank,
                           malformed.empty() ? "a record names another source" : malformed.c_str(), s);
        for (int k = 0; k < view.picks; ++k) {
          int local = shape_.localExpertOf(view.expert(k));
          if (local < 0)
            return LOOM_FAIL(loomInternalError, COLL, "EP dispatch on rank %d: rank %d sent expert %d here", rank, s,
                             view.expert(k));
          int32_t row = placement.next(s, local);
          destsFrom[s].push_back({local, row, view.weight(k)});
          if (row >= 0)
            std::memcpy(
                static_cast<std::byte*>(recvX) + (static_cast<size_t>(local) * shape_.capacity + row) * rowBytes,
                record + metaWords * 4, rowBytes);
        }
        destCounts[s].push_back(static_cast<uint32_t>(view.picks));
        *moved = true;
      }
      awaited[s] = next[s] < static_cast<uint32_t>(tokensFrom[s]);
      all &= !awaited[s];
    }
    *done = all;
    return loomSuccess;
  };
  LOOM_CHECK(progress("loomEpDispatch", kDispatch, sequence, consume, awaited));
  routing->recvStart.assign(1, 0);
  routing->destStart.assign(1, 0);
  routing->dests.clear();
  for (int s = 0; s < nranks; ++s) {
    routing->recvStart.push_back(routing->recvStart.back() + static_cast<uint32_t>(destCounts[s].size()));
    for (uint32_t c : destCounts[s]) routing->destStart.push_back(routing->destStart.back() + c);
    routing->dests.insert(routing->dests.end(), destsFrom[s].begin(), destsFrom[s].end());
  }
  return placement.finish(shape_, counts, dropped);
  return loomSuccess;
}

loomResult_t LowLatency::combine(const void* expertOut, const Routing& routing, int numTokens, void* out,
                                 uint64_t* bytesSent) {
  const int nranks = shape_.nranks, rank = shape_.rank;
  const uint64_t sequence = ++combineSequence_;
  const uint32_t flag = fifo::llFlag(sequence);
  const size_t slot = slotWords(kCombine), rowBytes = shape_.rowBytes(), hidden = shape_.hidden;
  std::vector<float> partial(hidden);
  for (int k = 1; k <= nranks; ++k) {
    int peer = (rank + k) % nranks;
    uint64_t* region = target(peer, kCombine, sequence);
    uint32_t rows = routing.recordsFrom(peer);
    for (uint32_t i = 0; i < rows; ++i) {
      uint32_t record = routing.recvStart[peer] + i;
      const Destination* dests = routing.dests.data() + routing.destStart[record];
      partialRow(shape_, expertOut, dests, routing.destStart[record + 1] - routing.destStart[record], partial.data(),
                 region + 1 + i * slot);
      slotPublish(region + 1 + (i + 1) * slot - 1, flag);
    }
    llPut(region, &rows, 1, flag);
    if (peer != rank) *bytesSent += rows * rowBytes;
    if (peerWindow_[peer] == nullptr)
      outbound_.push_back({peer, images_[peer].data(), 1 + rows * slot, 0, kCombine, sequence});
  }
  // Sum in rank order, then row order: the same result whatever order the rows arrive in.
  acc_.assign(static_cast<size_t>(numTokens) * hidden, 0.0f);
  int source = 0;
  uint32_t nextRow = 0;
  int64_t rowsFrom = -1;
  std::vector<char> awaited(nranks, 1);
  auto consume = [&](bool* moved, bool* done) -> loomResult_t {
    while (source < nranks) {
      const uint64_t* region = own(kCombine, sequence, source);
      const std::vector<int32_t>& tokens = routing.sentTokens[source];
      if (rowsFrom < 0) {
        uint32_t rows;
        if (!llGet(&rows, region, 1, flag)) break;
        if (rows != tokens.size())
          return LOOM_FAIL(loomInternalError, COLL,
                           "EP combine on rank %d: rank %d returned %u rows for the %zu tokens sent to it", rank,
                           source, rows, tokens.size());
        rowsFrom = rows;
      }
      for (; nextRow < rowsFrom; ++nextRow) {
        const uint64_t* row = region + 1 + nextRow * slot;
        if (!slotReady(row + slot - 1, flag)) break;
        accumulateWeighted(shape_.datatype, row, hidden, 1.0f,
                           acc_.data() + static_cast<size_t>(tokens[nextRow]) * hidden);
        *moved = true;
      }
      if (nextRow < rowsFrom) break;
      awaited[source] = 0;
      ++source;
      nextRow = 0;
      rowsFrom = -1;
    }
    *done = source == nranks;
    return loomSuccess;
  };
  LOOM_CHECK(progress("loomEpCombine", kCombine, sequence, consume, awaited));
  for (int t = 0; t < numTokens; ++t)
    storeFromFloat(shape_.datatype, acc_.data() + static_cast<size_t>(t) * hidden, hidden,
                   static_cast<std::byte*>(out) + static_cast<size_t>(t) * rowBytes);
  return loomSuccess;
}

}  // namespace loom::ep
