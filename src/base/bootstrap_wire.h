// The bootstrap's messages as bytes (the wire format is in bootstrap.cc's opening comment): an encoder and a parser
// for each. The parsers take the bytes a peer sent and check every length and value against them before use; they
// do no I/O and no logging, so they are fuzzed on their own (tests/fuzz/bootstrap_fuzz.cc). What depends on the
// state of a conversation (a rank registered twice, nranks that disagree) stays with the servers in bootstrap.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/bootstrap.h"

namespace loom::bootwire {

// The 128-byte unique id: u32 magic, u16 version, u16 zero, the secret, then the NUL-terminated root address.
constexpr uint32_t kIdMagic = 0x4d4f4f4c;  // "LOOM" in memory
constexpr uint16_t kIdVersion = 1;
constexpr size_t kIdSecretOffset = 8;
constexpr size_t kIdAddressOffset = kIdSecretOffset + kSecretBytes;
constexpr size_t kMaxAddressBytes = LOOM_UNIQUE_ID_BYTES - kIdAddressOffset - 1;  // 103, without the NUL

enum MessageKind : uint32_t { kRegister = 1, kTable = 2, kReject = 3 };
enum ConnKind : uint32_t { kRingConn = 1, kP2pConn = 2, kHandoffConn = 3 };
constexpr size_t kRegisterHeaderBytes = 12;
constexpr size_t kMaxRegisterBytes = kRegisterHeaderBytes + kMaxAddressBytes;
constexpr size_t kMaxRejectBytes = 400;
constexpr int kMaxRanks = 1 << 20;
constexpr size_t kHelloBytes = 8;
constexpr size_t kFrameHeaderBytes = 16;
// Bootstrap messages are setup data (addresses, topology graphs): anything larger is a bug, not a use.
constexpr uint64_t kMaxP2pBytes = uint64_t{1} << 32;

void putU32(std::vector<uint8_t>* out, uint32_t v);
void putU64(std::vector<uint8_t>* out, uint64_t v);
void putBytes(std::vector<uint8_t>* out, const void* data, size_t bytes);
// `body` prefixed with its u32 length: how registrations and the root's replies travel.
std::vector<uint8_t> lengthPrefixed(const std::vector<uint8_t>& body);

// Bounds-checked little-endian reads of received bytes: each returns false, reading nothing, past the end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : data_(bytes.data()), left_(bytes.size()) {}
  bool u16(uint16_t* v) { return little(v, 2); }
  bool u32(uint32_t* v) { return little(v, 4); }
  bool u64(uint64_t* v) { return little(v, 8); }
  bool text(size_t bytes, std::string* out);
  size_t left() const { return left_; }

 private:
  template <typename T>
  bool little(T* v, size_t bytes) {
    if (bytes > left_) return false;
    *v = 0;
    for (size_t i = 0; i < bytes; ++i) *v |= static_cast<T>(static_cast<T>(data_[i]) << (8 * i));
    data_ += bytes, left_ -= bytes;
    return true;
  }
  const uint8_t* data_;
  size_t left_;
};

// Whether a peer's address may be used: printable, at most kMaxAddressBytes, of the form host:port, port not 0.
bool plausibleAddress(const std::string& text);
// `text` with every byte outside printable ASCII replaced by '?', for messages that quote what a peer sent.
std::string printable(std::string text);

// The unique id. parseUniqueId returns "" or what is wrong with the id.
std::vector<uint8_t> encodeUniqueId(const UniqueIdInfo& info);  // LOOM_UNIQUE_ID_BYTES; the address must fit
std::string parseUniqueId(std::span<const uint8_t, LOOM_UNIQUE_ID_BYTES> bytes, UniqueIdInfo* info);

// rank -> root. The body is what follows the u32 length, which must lie in kRegisterHeaderBytes..kMaxRegisterBytes.
struct Registration {
  int rank = 0;
  int nranks = 0;
  std::string address;  // the rank's listener
};
std::vector<uint8_t> encodeRegistration(const Registration& registration);  // with its length
// "" or what is wrong. *kindOk says whether the body was a registration at all (a stranger is dropped unanswered;
// a bad registration is answered with a rejection).
std::string parseRegistration(std::span<const uint8_t> body, Registration* registration, bool* kindOk);

// root -> rank: every rank's address, or the reason the rank was rejected.
struct RootReply {
  bool rejected = false;
  std::string reason;                  // printable, when rejected
  std::vector<std::string> addresses;  // nranks plausible addresses, otherwise
};
std::vector<uint8_t> encodeTable(const std::vector<std::string>& addresses);  // with its length
std::vector<uint8_t> encodeReject(std::string_view reason);                   // with its length
// The largest reply body a rank of `nranks` accepts.
size_t maxRootReplyBytes(int nranks);
// "" or what is wrong with a reply body for a rank of `nranks`.
std::string parseRootReply(std::span<const uint8_t> body, int nranks, RootReply* reply);

// rank -> rank: the first 8 bytes of every connection, then on p2p connections 16-byte frame headers.
std::vector<uint8_t> encodeHello(ConnKind kind, int from);
// "" or what is wrong, for a rank `self` of `nranks` (an unknown kind is wrong; the kind is set either way).
std::string parseHello(std::span<const uint8_t, kHelloBytes> bytes, int self, int nranks, uint32_t* kind, int* from);
std::vector<uint8_t> encodeFrameHeader(int tag, uint64_t bytes);
std::string parseFrameHeader(std::span<const uint8_t, kFrameHeaderBytes> header, int* tag, uint64_t* bytes);

}  // namespace loom::bootwire
