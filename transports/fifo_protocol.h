// The FIFO protocol's arithmetic, shared by the host's FifoSender and FifoReceiver (fifo.cc) and compiled for a
// CUDA device too (LOOM_HOST_DEVICE), so that a kernel writing or reading a FIFO follows exactly the host's
// rules: where a slot lies, when the sender has credit, how a Simple message's size word marks a direct message,
// and how an LL word carries 4 bytes of payload beside the flag of its message. The loads and stores themselves
// (std::atomic on the host, volatile or atomic_ref on a device) stay with each side. fifo.h describes the FIFO.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/base/host_device.h"

namespace loom {

enum class Protocol : uint8_t { kSimple = 0, kLL = 1 };

// Why a FIFO was marked aborted (0: it was not).
enum AbortCode : uint32_t {
  kAbortedByPeer = 1,   // an executor at either end gave up on the operation
  kConnectionLost = 2,  // a network transport lost the connection: the peer died or the network failed
};

// The first failure behind an abort, as abort marks carry it from rank to rank (a FIFO's header, the network
// transports' abort notices), so that a chain of ranks that gave up ends at the cause on every survivor.
enum class FailureCause : uint8_t {
  kUnknown = 0,         // a rank gave up and did not say why (a device kernel's mark, an older peer)
  kExited = 1,          // the process ended; detail: its exit status where known
  kKilled = 2,          // the process was killed; detail: the signal
  kStopped = 3,         // the process is stopped (SIGSTOP, a debugger) and does not move
  kConnectionLost = 4,  // a network connection to the rank failed: it died, or the network did
  kDeadline = 5,        // the rank waited past its deadline with every peer in the call
  kUserAbort = 6,       // the rank's communicator was aborted (loomCommAbort, loomCommRevoke)
  kLate = 7,            // the rank had not entered the collective the others waited in when their deadline passed
  kNoAnswer = 8,        // past a deadline, the rank did not answer a status query (stopped, hung, or unreachable)
  kError = 9,           // the rank failed of an error of its own (out of memory, a malformed message, ...)
  kGone = 10,           // the process ended, and how is not known (its parent reaped it already)
  kCorrupted = 11,      // the rank received a message that failed its checksum (LOOM_CHECKSUM); detail: the
                        // sender's rank plus one (0: not known)
};

// Who failed first and how. Packed into 64 bits (0: none known): the rank plus one in bits 0-23 (ranks past 2^24
// - 2 read as unknown), the cause in 24-31, its detail in 32-47. Only the low 48 bits travel on every wire.
struct FailureOrigin {
  int rank = -1;
  FailureCause cause = FailureCause::kUnknown;
  uint16_t detail = 0;
};

constexpr uint32_t kMaxOriginRank = (1u << 24) - 2;
inline uint64_t packOrigin(const FailureOrigin& origin) {
  uint64_t rank = origin.rank < 0 || static_cast<uint32_t>(origin.rank) > kMaxOriginRank
                      ? 0
                      : static_cast<uint64_t>(origin.rank) + 1;
  return rank | static_cast<uint64_t>(origin.cause) << 24 | static_cast<uint64_t>(origin.detail) << 32;
}
// `rank` received a message from `sender` that failed its checksum (kCorrupted; a sender past 0xfffd reads as
// unknown), packed.
inline uint64_t corruptedOrigin(int rank, int sender) {
  const uint16_t detail = static_cast<uint16_t>(sender >= 0 && sender < 0xfffe ? sender + 1 : 0);
  return packOrigin({rank, FailureCause::kCorrupted, detail});
}
inline FailureOrigin unpackOrigin(uint64_t packed) {
  FailureOrigin origin;
  origin.rank = static_cast<int>(packed & 0xffffff) - 1;
  origin.cause = static_cast<FailureCause>((packed >> 24) & 0xff);
  origin.detail = static_cast<uint16_t>((packed >> 32) & 0xffff);
  return origin;
}

// Where a FIFO's words lie from its start, in fifo.h's layout (fifoWords() in fifo.cc measures them on the host),
// for code that reaches them without FifoHeader's std::atomic members: a device's.
struct FifoWords {
  uint32_t head, tail, aborted, sizes, slots;
};

}  // namespace loom

namespace loom::fifo {

// The protocol rule, the one every executor, the tuner and the simulator follow: a step of at most
// llThresholdBytes goes as LL messages, a larger one as Simple; forcedProtocol >= 0 (LOOM_PROTO) overrides both.
// It depends on the step's size alone, which both ends of a connection agree on, so they always agree on the
// protocol and on how the step is cut (lane_walker.h's SliceRule).
LOOM_HOST_DEVICE inline Protocol protocolFor(size_t stepBytes, size_t llThresholdBytes, int forcedProtocol) {
  if (forcedProtocol >= 0) return static_cast<Protocol>(forcedProtocol);
  return stepBytes <= llThresholdBytes ? Protocol::kLL : Protocol::kSimple;
}

// A Simple message's size word: its bytes, and the top bit when the slot holds a DirectDescriptor.
constexpr uint64_t kDirectBit = uint64_t{1} << 63;
LOOM_HOST_DEVICE inline uint64_t simpleSizeWord(uint64_t bytes, bool direct) {
  return bytes | (direct ? kDirectBit : 0);
}
LOOM_HOST_DEVICE inline uint64_t simpleSizeBytes(uint64_t word) { return word & ~kDirectBit; }
LOOM_HOST_DEVICE inline bool simpleSizeDirect(uint64_t word) { return (word & kDirectBit) != 0; }

// The sender may post message `posted` while fewer than `depth` messages wait for the receiver to release them.
LOOM_HOST_DEVICE inline bool hasCredit(uint64_t posted, uint64_t released, uint32_t depth) {
  return posted - released < depth;
}
LOOM_HOST_DEVICE inline uint32_t nextSlot(uint32_t index, uint32_t depth) { return index + 1 == depth ? 0 : index + 1; }

// Byte offsets of slot `index` from the start of the slots: every Simple slot, then every LL slot.
LOOM_HOST_DEVICE inline size_t simpleSlotOffset(uint32_t index, size_t slotBytes) { return index * slotBytes; }
LOOM_HOST_DEVICE inline size_t llSlotOffset(uint32_t index, uint32_t depth, size_t slotBytes, size_t llSlotBytes) {
  return depth * slotBytes + index * llSlotBytes;
}

// LL: the flag of message `sequence`, never 0, so zeroed memory is never mistaken for a posted word.
LOOM_HOST_DEVICE inline uint32_t llFlag(uint64_t sequence) { return static_cast<uint32_t>(sequence % 0xffffffffu) + 1; }
// Word 0 of an LL slot holds the message's size, words 1.. its payload, 4 bytes each.
LOOM_HOST_DEVICE inline size_t llPayloadBytes(size_t llSlotBytes) { return (llSlotBytes / 8 - 1) * 4; }
LOOM_HOST_DEVICE inline size_t llDataWords(size_t bytes) { return (bytes + 3) / 4; }
LOOM_HOST_DEVICE inline uint64_t llWord(uint32_t data, uint32_t flag) {
  return static_cast<uint64_t>(data) | static_cast<uint64_t>(flag) << 32;
}
LOOM_HOST_DEVICE inline uint32_t llWordFlag(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
LOOM_HOST_DEVICE inline uint32_t llWordData(uint64_t word) { return static_cast<uint32_t>(word); }

}  // namespace loom::fifo
