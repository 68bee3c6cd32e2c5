// Fuzz target: the bootstrap's wire parsers (src/base/bootstrap_wire.h), which read what a peer sent before it is
// trusted. The first byte picks the message; the rest is the message:
//   0 a registration body (rank -> root)
//   1 a reply body (root -> rank), for a rank of 1 + (second byte % 16) ranks
//   2 a connection's hello, for rank (second byte % 9) of 1 + (third byte % 8) ranks
//   3 a p2p frame header
//   4 a unique id (zero-padded or cut to its 128 bytes)
// What a parser accepts must be encoded back to the bytes it came from (the hello's and the reply's fields, the
// unique id's fields, where the bytes may carry what the parser ignores).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "src/base/bootstrap_wire.h"
#include "tests/fuzz/fuzz_common.h"

namespace bw = loom::bootwire;

namespace {

// The body of an encoder's output, without its u32 length.
std::vector<uint8_t> bodyOf(const std::vector<uint8_t>& message) {
  return std::vector<uint8_t>(message.begin() + 4, message.end());
}

void registration(std::span<const uint8_t> body) {
  bw::Registration parsed;
  bool kindOk = false;
  const std::string error = bw::parseRegistration(body, &parsed, &kindOk);
  loomfuzz::verdict(error);
  if (!error.empty()) return;
  FUZZ_CHECK(kindOk);
  FUZZ_CHECK(parsed.rank >= 0 && parsed.rank < parsed.nranks && parsed.nranks <= bw::kMaxRanks);
  const std::vector<uint8_t> encoded = bodyOf(bw::encodeRegistration(parsed));
  FUZZ_CHECK(std::equal(encoded.begin(), encoded.end(), body.begin(), body.end()));
}

void reply(std::span<const uint8_t> body, int nranks) {
  bw::RootReply parsed;
  const std::string error = bw::parseRootReply(body, nranks, &parsed);
  loomfuzz::verdict(error);
  if (!error.empty()) return;
  if (parsed.rejected) {
    FUZZ_CHECK(parsed.reason.size() + 4 == body.size());
    for (char c : parsed.reason) FUZZ_CHECK(c >= 0x20 && c <= 0x7e);
    return;
  }
  FUZZ_CHECK(parsed.addresses.size() == static_cast<size_t>(nranks));
  for (const std::string& address : parsed.addresses) FUZZ_CHECK(bw::plausibleAddress(address));
  const std::vector<uint8_t> encoded = bodyOf(bw::encodeTable(parsed.addresses));
  FUZZ_CHECK(std::equal(encoded.begin(), encoded.end(), body.begin(), body.end()));
}

void hello(std::span<const uint8_t> bytes, int self, int nranks) {
  if (bytes.size() < bw::kHelloBytes) return;
  uint32_t kind = 0;
  int from = -1;
  const std::string error = bw::parseHello(std::span<const uint8_t, bw::kHelloBytes>(bytes.data(), bw::kHelloBytes),
                                           self, nranks, &kind, &from);
  loomfuzz::verdict(error);
  if (!error.empty()) return;
  FUZZ_CHECK(from >= 0 && from < nranks && from != self);
  const std::vector<uint8_t> encoded = bw::encodeHello(static_cast<bw::ConnKind>(kind), from);
  FUZZ_CHECK(std::equal(encoded.begin(), encoded.end(), bytes.begin(), bytes.begin() + bw::kHelloBytes));
}

void frameHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < bw::kFrameHeaderBytes) return;
  int tag = 0;
  uint64_t length = 0;
  const std::string error = bw::parseFrameHeader(
      std::span<const uint8_t, bw::kFrameHeaderBytes>(bytes.data(), bw::kFrameHeaderBytes), &tag, &length);
  loomfuzz::verdict(error);
  if (!error.empty()) return;
  FUZZ_CHECK(length <= bw::kMaxP2pBytes);
  const std::vector<uint8_t> encoded = bw::encodeFrameHeader(tag, length);
  FUZZ_CHECK(std::equal(encoded.begin(), encoded.end(), bytes.begin(), bytes.begin() + bw::kFrameHeaderBytes));
}

void uniqueId(std::span<const uint8_t> bytes) {
  uint8_t id[LOOM_UNIQUE_ID_BYTES] = {};
  std::memcpy(id, bytes.data(), std::min(bytes.size(), sizeof(id)));
  loom::UniqueIdInfo info;
  const std::string error = bw::parseUniqueId(id, &info);
  loomfuzz::verdict(error);
  if (!error.empty()) return;
  FUZZ_CHECK(bw::plausibleAddress(info.rootAddress));
  const std::vector<uint8_t> encoded = bw::encodeUniqueId(info);
  loom::UniqueIdInfo again;
  FUZZ_CHECK(
      bw::parseUniqueId(std::span<const uint8_t, LOOM_UNIQUE_ID_BYTES>(encoded.data(), LOOM_UNIQUE_ID_BYTES), &again)
          .empty());
  FUZZ_CHECK(again.rootAddress == info.rootAddress);
  FUZZ_CHECK(std::memcmp(again.secret, info.secret, loom::kSecretBytes) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      registration(rest);
      break;
    case 1:
      if (!rest.empty()) reply(rest.subspan(1), 1 + rest[0] % 16);
      break;
    case 2:
      if (rest.size() >= 2) hello(rest.subspan(2), rest[0] % 9, 1 + rest[1] % 8);
      break;
    case 3:
      frameHeader(rest);
      break;
    case 4:
      uniqueId(rest);
      break;
  }
  return 0;
}
