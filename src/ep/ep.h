// The EP object and its handles (loom_ep.h), and the two modes behind them: normal.cc (counts, then grouped
// all-to-alls, hierarchical across hosts) and low_latency.cc (puts into fixed receive buffers, LL flags).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loom/loom.h"
#include "loom/loom_ep.h"
#include "algorithms/hosts.h"
#include "src/ep/route.h"

namespace loom::ep {

class LowLatency;

// Channels of the low-latency mode's connections (its network peers): apart from the collectives' and Send/Recv's.
// One per EP object alive on a communicator, so two objects never share a FIFO.
constexpr int kEpChannel = 2048;
constexpr int kMaxEpObjects = 4;

// What a dispatch received and sent, in the order the combine goes through it.
struct Routing {
  // Sending side: per first-hop peer, the tokens sent to it in order (their rows come back in that order).
  std::vector<std::vector<int32_t>> sentTokens;
  // Receiving side: per last-hop peer, records [recvStart[p], recvStart[p + 1]) in arrival order; record i goes to
  // dests[destStart[i] .. destStart[i + 1]).
  std::vector<uint32_t> recvStart;
  std::vector<uint32_t> destStart{0};
  std::vector<Destination> dests;
  // Hierarchical mode, on the forwarding rank: records received from each source on the first hop (per peer
  // counts), and for each record forwarded on the second hop (per destination rank, in order) the first-hop
  // record it came from.
  bool hierarchical = false;
  std::vector<uint32_t> firstHopStart;   // by peer: first-hop records received, as offsets (nranks + 1)
  std::vector<uint32_t> forwardedStart;  // by destination rank: forwarded records, as offsets (nranks + 1)
  std::vector<uint32_t> forwardedFrom;   // by forwarded record: its first-hop record

  uint32_t recordsFrom(int peer) const { return recvStart[peer + 1] - recvStart[peer]; }
};

}  // namespace loom::ep

struct loomEp {
  static constexpr uint64_t kMagic = 0x6c6f6f6d2d657031ull;  // "loom-ep1"
  uint64_t magic = kMagic;
  loomComm* comm = nullptr;
  loom::ep::Shape shape;
  loomEpMode_t mode = loomEpNormal;
  int slot = -1;  // which of the communicator's EP slots (its low-latency channel)
  std::unique_ptr<loom::ep::LowLatency> lowLatency;
  loomEpStats_t stats{};
  bool hierarchical = false;   // normal mode across hosts
  loom::Hosts hosts;           // the normal mode's ranks by host
  // The normal mode's buffers, kept from call to call: fresh ones would cost a page fault per page each call.
  struct Scratch {
    std::vector<uint32_t> send, received, forwarded, rows, partials;
    std::vector<float> acc, row;
  } scratch;
  loomEp();
  ~loomEp();
};

struct loomEpHandle {
  static constexpr uint64_t kMagic = 0x6c6f6f6d2d656868ull;
  uint64_t magic = kMagic;
  const loomEp* ep = nullptr;
  int numTokens = 0;
  loom::ep::Routing routing;
};

namespace loom::ep {

// Normal mode (normal.cc). The caller holds no communicator lock: these make loom calls of their own.
loomResult_t normalDispatch(loomEp* ep, const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                            void* recvX, int* counts, Routing* routing);
loomResult_t normalCombine(loomEp* ep, const void* expertOut, const loomEpHandle& handle, void* out);

}  // namespace loom::ep
