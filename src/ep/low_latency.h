// The low-latency mode (loom_ep.h): every rank owns one receive window, made at create time, that holds for each
// source rank a fixed region per phase (dispatch, combine) and per buffer (two, used by alternate calls):
//
//   window = control words | dispatch[2][nranks] | combine[2][nranks]
//   dispatch region of source s = header (1 + L words: tokens, then tokens per local expert) | maxTokens records
//   combine region of source s  = header (1 word: rows) | maxTokens rows
//
// The header is LL words (ll_words.h): each count travels with its flag in one store. Each record or row is a
// flagged slot: its payload, then a flag word stored with release. Every flag is derived from the call's sequence
// number (llFlag), so a region is read as it is written, with no count exchange and no barrier, and stale data
// from two calls before never matches. (A slot's one flag word instead of a flag in every word halves the bytes
// that LL words would write for the rows, which is what the host's time goes to.) A sender writes its regions straight
// into the peer's window where it can map it (a peer on the same machine, over shm or in the same process); for any
// other peer it writes the region's image locally and sends it, in pieces that name their place, through the
// communicator's connections (the network transports' proxy); the receiver copies each piece into its window and
// reads it there like the rest.
//
// Why two buffers need no barrier: every rank writes a header into every rank's region in every call, and a call
// ends on a rank only when it has read every header of that call. So a rank that starts call n + 2 has finished
// call n + 1, which means every peer had started n + 1, so had finished call n, the last user of the buffer that
// call n + 2 writes. (Dispatch and combine have separate windows and counters; the same holds for each.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "loom/loom.h"
#include "src/ep/ep.h"
#include "src/exec/peer_memory.h"

struct loomComm;

namespace loom::ep {

class LowLatency {
 public:
  // Collective: makes this rank's window, maps its peers' and connects the rest. `id` (equal on every rank)
  // tells this object's messages from those of an earlier object that used the same channel. The caller holds the
  // communicator's runMutex.
  static loomResult_t create(loomComm* comm, const Shape& shape, uint32_t id, int channel,
                             std::unique_ptr<LowLatency>* out);
  ~LowLatency();

  loomResult_t dispatch(const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights, void* recvX,
                        int* counts, Routing* routing, uint64_t* bytesSent, uint64_t* dropped);
  loomResult_t combine(const void* expertOut, const Routing& routing, int numTokens, void* out, uint64_t* bytesSent);
  size_t windowBytes() const { return windowBytes_; }

 private:
  enum Phase : uint32_t { kDispatch = 1, kCombine = 2 };
  struct Piece;  // the header of a region's piece sent through a connection
  struct Outbound {
    int peer;
    const uint64_t* words;
    size_t total, sent;
    Phase phase;
    uint64_t sequence;
  };

  LowLatency(loomComm* comm, const Shape& shape, uint32_t id, int channel);
  loomResult_t connect();
  size_t dispatchHeaderWords() const { return 1 + static_cast<size_t>(shape_.localExperts); }
  // Words of one record's (dispatch) or row's (combine) slot: its payload in whole words, then its flag word.
  size_t slotWords(Phase phase) const {
    size_t payloadBytes = (phase == kDispatch ? shape_.metaWords() * 4 : 0) + shape_.rowBytes();
    return (payloadBytes + 7) / 8 + 1;
  }
  size_t regionWords(Phase phase) const { return phase == kDispatch ? dispatchRegionWords_ : combineRegionWords_; }
  // Word offset, in any rank's window, of source `source`'s region of `phase` for call `sequence`.
  size_t regionOffset(Phase phase, uint64_t sequence, int source) const;
  // Where this rank writes its region of `phase` in `peer`'s window: there, or in a local image to send.
  uint64_t* target(int peer, Phase phase, uint64_t sequence);
  uint64_t* own(Phase phase, uint64_t sequence, int source) { return window_ + regionOffset(phase, sequence, source); }
  // Moves what it can: this call's pieces out, any peer's pieces in. Whether anything moved.
  loomResult_t pushPieces(bool* moved);
  // A connection found closed or given up once drained is noted in closed_: an error only if the call still awaits
  // that peer once what arrived has been read (a peer that finished may close it as soon as its last piece left).
  loomResult_t pullPieces(bool* moved);
  // LOOM_CHECKSUM: the CRC32C after a piece's `bytes` at `message` from `sender`; a mismatch fails the call naming
  // the link, and is noted as corrupted data, which the abort marks carry to every rank.
  loomResult_t checkPiece(const void* message, size_t bytes, int sender);
  // Runs the call's loop: pieces in and out, then `consume` (which reports progress and completion) until done,
  // within the communicator's deadline and abort rules. `awaited[peer]`: whether the call still reads from the peer
  // (the peers it still has pieces for count as needed too).
  template <typename Consume>
  loomResult_t progress(const char* what, Phase phase, uint64_t sequence, Consume consume,
                        const std::vector<char>& awaited);
  // Whether `source`'s region of the call has arrived whole (its header, and the last word its header implies):
  // for a peer whose connection closed, which the call may not have read yet.
  bool regionArrived(Phase phase, uint64_t sequence, int source);
  // Marks every peer's window (and connection) so that peers waiting on this rank stop, and the communicator with
  // `result` (its calls fail from now on, as after any collective's failure).
  void giveUp(loomResult_t result);

  loomComm* comm_;
  Shape shape_;
  uint32_t id_;
  int channel_;
  size_t dispatchRegionWords_ = 0, combineRegionWords_ = 0;
  void* allocation_ = nullptr;
  uint64_t* window_ = nullptr;
  size_t windowBytes_ = 0;
  PeerMappings mappings_{true};
  std::vector<void*> sameProcessMappings_;     // windows of ranks of this process, mapped again here
  std::vector<uint64_t*> peerWindow_;          // by rank: its window as mapped here; null: reached through connections
  std::vector<char> piecesFrom_;               // by rank: its regions reach this rank as pieces
  std::vector<uint32_t> closed_;               // by rank: the AbortCode of its drained connection (0: open)
  std::vector<std::vector<uint64_t>> images_;  // by rank reached through connections: the region to send
  std::vector<Outbound> outbound_;
  size_t pieceWords_ = 0;  // region words one piece carries
  uint64_t dispatchSequence_ = 0, combineSequence_ = 0;
  // Scratch reused across calls.
  std::vector<Outgoing> outgoing_;
  std::vector<uint32_t> meta_;
  std::vector<float> acc_;
};

}  // namespace loom::ep
