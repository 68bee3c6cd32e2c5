// The normal (throughput) mode: each hop first tells every peer how many records it will get (loomAllToAll of
// the counts), then moves the records as one grouped loomAllToAllv, so the rows travel by the communicator's
// all-to-all algorithms and transports.
//
// Flat (one host, or every host with one rank): one hop, from each token's rank straight to its experts' ranks.
//
// Hierarchical (ranks on several hosts): two hops, as node-grouped dispatch does. On the first a token crosses to
// each host that holds any of its experts once, to its forwarder there: the rank whose place on that host is the
// sender's place on its own (modulo the host's size). On the second the forwarder hands it to the ranks of its
// experts on its host. Records keep their source rank and token index, so the receiving rank orders them as
// the flat mode does. The combine goes back the same way: each expert rank returns one partial sum per record,
// the forwarder adds the partials of its host's ranks (fp32, in rank order) and returns one row per token and
// host, and the source adds those (fp32, in rank order of the forwarders).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "src/base/check.h"
#include "src/core/comm.h"
#include "src/ep/ep.h"
#include "src/exec/reduce.h"

namespace loom::ep {
namespace {

// Moves items of `itemWords` 32-bit words: sendCounts[p] items to each peer p from `send` (peer after peer);
// fills `recv` with what each peer sent, peer after peer. recvCounts: filled by a count exchange first unless
// `countsKnown`.
loomResult_t exchange(loomComm* comm, const std::vector<uint32_t>& send, const std::vector<uint64_t>& sendCounts,
                      size_t itemWords, std::vector<uint32_t>* recv, std::vector<uint64_t>* recvCounts,
                      bool countsKnown) {
  const int nranks = comm->nranks;
  if (!countsKnown) {
    recvCounts->assign(nranks, 0);
    LOOM_CHECK(loomAllToAll(sendCounts.data(), recvCounts->data(), 1, loomUint64, comm, nullptr));
  }
  std::vector<size_t> sendBytes(nranks), sendDispls(nranks), recvBytes(nranks), recvDispls(nranks);
  size_t sendTotal = 0, recvTotal = 0;
  for (int p = 0; p < nranks; ++p) {
    sendBytes[p] = sendCounts[p] * itemWords * 4;
    sendDispls[p] = sendTotal;
    sendTotal += sendBytes[p];
    recvBytes[p] = (*recvCounts)[p] * itemWords * 4;
    recvDispls[p] = recvTotal;
    recvTotal += recvBytes[p];
  }
  recv->resize(std::max<size_t>(recvTotal / 4, 1));
  const uint32_t empty = 0;
  return loomAllToAllv(send.empty() ? &empty : send.data(), sendBytes.data(), sendDispls.data(), recv->data(),
                       recvBytes.data(), recvDispls.data(), loomUint8, comm, nullptr);
}

std::vector<uint64_t> sizesOf(const std::vector<Outgoing>& out) {
  std::vector<uint64_t> counts(out.size());
  for (size_t p = 0; p < out.size(); ++p) counts[p] = out[p].size();
  return counts;
}

std::vector<uint64_t> countsFromOffsets(const std::vector<uint32_t>& start) {
  std::vector<uint64_t> counts(start.size() - 1);
  for (size_t p = 0; p + 1 < start.size(); ++p) counts[p] = start[p + 1] - start[p];
  return counts;
}

std::vector<uint32_t> offsetsOf(const std::vector<uint64_t>& counts) {
  std::vector<uint32_t> start(1, 0);
  for (uint64_t c : counts) start.push_back(start.back() + static_cast<uint32_t>(c));
  return start;
}

// Records from `out` (one destination after another) as words, into `words`.
const std::vector<uint32_t>& packRecords(const Shape& shape, const std::vector<Outgoing>& out, const void* x,
                                         std::vector<uint32_t>* words) {
  size_t total = 0;
  for (const Outgoing& o : out) total += o.size();
  words->resize(total * shape.recordWords());
  uint32_t* at = words->data();
  for (const Outgoing& o : out)
    for (size_t i = 0; i < o.size(); ++i, at += shape.recordWords()) encodeRecord(shape, shape.rank, o, i, x, at);
  return *words;
}

// Reads the `count` records at `words`; fails on a malformed one.
loomResult_t readRecords(const Shape& shape, const std::vector<uint32_t>& words, size_t count,
                         std::vector<RecordView>* views) {
  views->resize(count);
  std::string why;
  for (size_t i = 0; i < count; ++i)
    if (!readRecord(shape, words.data() + i * shape.recordWords(), &(*views)[i], &why))
      return LOOM_FAIL(loomInternalError, COLL, "EP dispatch on rank %d: %s", shape.rank, why.c_str());
  return loomSuccess;
}

// Places the records received on the last hop (arrival order, `recvCounts` per peer) in recvX: rows of each local
// expert by (source, token). Fills the routing's receiving side.
loomResult_t placeRecords(const Shape& shape, const std::vector<RecordView>& views,
                          const std::vector<uint64_t>& recvCounts, void* recvX, int* counts, Routing* routing,
                          uint64_t* dropped) {
  const int localExperts = shape.localExperts;
  std::vector<int32_t> perExpert(static_cast<size_t>(shape.nranks) * localExperts, 0);
  for (const RecordView& v : views)
    for (int k = 0; k < v.picks; ++k) {
      int local = shape.localExpertOf(v.expert(k));
      if (local < 0)
        return LOOM_FAIL(loomInternalError, COLL, "EP dispatch on rank %d: expert %d of another rank arrived here",
                         shape.rank, v.expert(k));
      ++perExpert[static_cast<size_t>(v.source) * localExperts + local];
    }
  Placement placement;
  placement.start(shape, perExpert);
  std::vector<uint32_t> order(views.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return views[a].source != views[b].source ? views[a].source < views[b].source : views[a].token < views[b].token;
  });
  std::vector<std::vector<Destination>> destsOf(views.size());
  const size_t rowBytes = shape.rowBytes();
  for (uint32_t i : order) {
    const RecordView& v = views[i];
    for (int k = 0; k < v.picks; ++k) {
      int local = shape.localExpertOf(v.expert(k));
      int32_t row = placement.next(v.source, local);
      destsOf[i].push_back({local, row, v.weight(k)});
      if (row >= 0)
        std::memcpy(static_cast<std::byte*>(recvX) + (static_cast<size_t>(local) * shape.capacity + row) * rowBytes,
                    v.row, rowBytes);
    }
  }
  routing->recvStart = offsetsOf(recvCounts);
  routing->destStart.assign(1, 0);
  routing->dests.clear();
  for (const std::vector<Destination>& d : destsOf) {
    routing->destStart.push_back(routing->destStart.back() + static_cast<uint32_t>(d.size()));
    routing->dests.insert(routing->dests.end(), d.begin(), d.end());
  }
  return placement.finish(shape, counts, dropped);
  return loomSuccess;
}

// Adds `rows` (rowWords words each, arriving for targets[i] in order) into acc (hidden floats per target).
void addRows(const Shape& shape, const std::vector<uint32_t>& rows, const uint32_t* targets, size_t count, float* acc) {
  for (size_t i = 0; i < count; ++i)
    accumulateWeighted(shape.datatype, rows.data() + i * shape.rowWords(), shape.hidden, 1.0f,
                       acc + static_cast<size_t>(targets[i]) * shape.hidden);
}

}  // namespace

loomResult_t normalDispatch(loomEp* ep, const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                            void* recvX, int* counts, Routing* routing) {
  const Shape& shape = ep->shape;
  loomComm* comm = ep->comm;
  const int nranks = shape.nranks, rank = shape.rank;
  // First hop: to the experts' ranks (flat), or to each host's forwarder (hierarchical).
  auto firstHop = [&](int expert) {
    int owner = shape.rankOfExpert(expert);
    if (!ep->hierarchical) return owner;
    const std::vector<int>& there = ep->hosts.members[ep->hosts.host[owner]];
    return there[ep->hosts.local[rank] % there.size()];
  };
  std::vector<Outgoing> out;
  route(shape, numTokens, topkIdx, topkWeights, nranks, firstHop, false, &out);
  routing->sentTokens.assign(nranks, {});
  for (int p = 0; p < nranks; ++p) {
    routing->sentTokens[p] = out[p].tokens;
    if (p != rank) ep->stats.bytesSent += out[p].size() * shape.rowBytes();
  }
  loomEp::Scratch& scratch = ep->scratch;
  std::vector<uint32_t>& received = scratch.received;
  std::vector<uint64_t> recvCounts;
  LOOM_CHECK(exchange(comm, packRecords(shape, out, x, &scratch.send), sizesOf(out), shape.recordWords(), &received,
                      &recvCounts, false));
  size_t total = std::accumulate(recvCounts.begin(), recvCounts.end(), uint64_t{0});
  std::vector<RecordView> views;
  LOOM_CHECK(readRecords(shape, received, total, &views));
  routing->hierarchical = ep->hierarchical;
  if (!ep->hierarchical)
    return placeRecords(shape, views, recvCounts, recvX, counts, routing, &ep->stats.lastDroppedRows);

  // Second hop, on the forwarder: each first-hop record to the ranks of its experts on this host, in arrival order.
  routing->firstHopStart = offsetsOf(recvCounts);
  std::vector<Outgoing> forward(nranks);
  std::vector<std::vector<uint32_t>> fromOf(nranks);
  std::vector<uint32_t>& words = scratch.send;
  words.clear();
  const size_t recordWords = shape.recordWords(), metaWords = shape.metaWords();
  std::vector<uint32_t> meta(metaWords);
  std::vector<std::vector<uint32_t>> recordsTo(nranks);
  for (uint32_t i = 0; i < views.size(); ++i) {
    const RecordView& v = views[i];
    for (int k = 0; k < v.picks; ++k) {
      int owner = shape.rankOfExpert(v.expert(k));
      if (ep->hosts.host[owner] != ep->hosts.host[rank])
        return LOOM_FAIL(loomInternalError, COLL, "EP dispatch on rank %d: expert %d of another host arrived here",
                         rank, v.expert(k));
      std::vector<uint32_t>& to = recordsTo[owner];
      if (fromOf[owner].empty() || fromOf[owner].back() != i) {
        fromOf[owner].push_back(i);
        // The record as received, its picks narrowed to this owner's experts below.
        const uint32_t* src = received.data() + i * recordWords;
        to.insert(to.end(), src, src + recordWords);
        uint32_t* copy = to.data() + to.size() - recordWords;
        copy[2] = 0;
        std::fill(copy + kMetaWords, copy + metaWords, 0u);
      }
      uint32_t* copy = to.data() + to.size() - recordWords;
      copy[kMetaWords + 2 * copy[2]] = static_cast<uint32_t>(v.expert(k));
      copy[kMetaWords + 2 * copy[2] + 1] = v.pairs[2 * k + 1];
      ++copy[2];
    }
  }
  std::vector<uint64_t> forwardCounts(nranks);
  routing->forwardedStart.assign(1, 0);
  routing->forwardedFrom.clear();
  for (int r = 0; r < nranks; ++r) {
    forwardCounts[r] = fromOf[r].size();
    words.insert(words.end(), recordsTo[r].begin(), recordsTo[r].end());
    routing->forwardedFrom.insert(routing->forwardedFrom.end(), fromOf[r].begin(), fromOf[r].end());
    routing->forwardedStart.push_back(static_cast<uint32_t>(routing->forwardedFrom.size()));
    if (r != rank) ep->stats.bytesSent += fromOf[r].size() * shape.rowBytes();
  }
  std::vector<uint32_t>& finalWords = scratch.forwarded;
  std::vector<uint64_t> finalCounts;
  LOOM_CHECK(exchange(comm, words, forwardCounts, recordWords, &finalWords, &finalCounts, false));
  total = std::accumulate(finalCounts.begin(), finalCounts.end(), uint64_t{0});
  LOOM_CHECK(readRecords(shape, finalWords, total, &views));
  return placeRecords(shape, views, finalCounts, recvX, counts, routing, &ep->stats.lastDroppedRows);
}

loomResult_t normalCombine(loomEp* ep, const void* expertOut, const loomEpHandle& handle, void* out) {
  const Shape& shape = ep->shape;
  const Routing& routing = handle.routing;
  const int nranks = shape.nranks, rank = shape.rank;
  const size_t rowWords = shape.rowWords(), hidden = shape.hidden;
  // Last hop back: one partial sum per record received.
  const size_t records = routing.recvStart.back();
  loomEp::Scratch& scratch = ep->scratch;
  std::vector<uint32_t>& partials = scratch.partials;
  partials.resize(std::max<size_t>(records * rowWords, 1));
  scratch.row.resize(hidden);
  for (size_t i = 0; i < records; ++i) {
    partials[(i + 1) * rowWords - 1] = 0;  // the padding of a row whose bytes are not a multiple of 4
    partialRow(shape, expertOut, routing.dests.data() + routing.destStart[i],
               routing.destStart[i + 1] - routing.destStart[i], scratch.row.data(), partials.data() + i * rowWords);
  }
  for (int p = 0; p < nranks; ++p)
    if (p != rank) ep->stats.bytesSent += routing.recordsFrom(p) * shape.rowBytes();
  std::vector<uint64_t> backCounts = countsFromOffsets(routing.recvStart);
  std::vector<uint32_t>& rows = scratch.rows;
  std::vector<uint64_t> rowCounts;
  if (routing.hierarchical) {
    // On the forwarder: the partials of its host's ranks, summed per first-hop record, back to the sources.
    rowCounts = countsFromOffsets(routing.forwardedStart);
    LOOM_CHECK(exchange(ep->comm, partials, backCounts, rowWords, &rows, &rowCounts, true));
    const size_t firstHop = routing.firstHopStart.back();
    std::vector<float>& acc = scratch.acc;
    acc.assign(firstHop * hidden, 0.0f);
    addRows(shape, rows, routing.forwardedFrom.data(), routing.forwardedFrom.size(), acc.data());
    partials.assign(std::max<size_t>(firstHop * rowWords, 1), 0);
    for (size_t i = 0; i < firstHop; ++i)
      storeFromFloat(shape.datatype, acc.data() + i * hidden, hidden, partials.data() + i * rowWords);
    backCounts = countsFromOffsets(routing.firstHopStart);
    for (int p = 0; p < nranks; ++p)
      if (p != rank) ep->stats.bytesSent += backCounts[p] * shape.rowBytes();
  }
  rowCounts.assign(nranks, 0);
  std::vector<uint32_t> tokens;
  for (int p = 0; p < nranks; ++p) {
    rowCounts[p] = routing.sentTokens[p].size();
    for (int32_t t : routing.sentTokens[p]) tokens.push_back(static_cast<uint32_t>(t));
  }
  LOOM_CHECK(exchange(ep->comm, partials, backCounts, rowWords, &rows, &rowCounts, true));
  std::vector<float>& acc = scratch.acc;
  acc.assign(static_cast<size_t>(handle.numTokens) * hidden, 0.0f);
  addRows(shape, rows, tokens.data(), tokens.size(), acc.data());
  for (int t = 0; t < handle.numTokens; ++t)
    storeFromFloat(shape.datatype, acc.data() + static_cast<size_t>(t) * hidden, hidden,
                   static_cast<std::byte*>(out) + static_cast<size_t>(t) * shape.rowBytes());
  return loomSuccess;
}

}  // namespace loom::ep
