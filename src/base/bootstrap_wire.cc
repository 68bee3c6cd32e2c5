// The bootstrap's messages as bytes (bootstrap_wire.h).
#include "src/base/bootstrap_wire.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "src/base/socket.h"

namespace loom::bootwire {
namespace {

// printf into a std::string, for the parsers' messages.
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char text[256];
  std::snprintf(text, sizeof(text), fmt, args...);
  return text;
}

}  // namespace

void putU32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putU64(std::vector<uint8_t>* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
// resize and memcpy, not insert of a pointer range: GCC 12 at -O3 reports a stringop-overread, false, in the range
// insert's inlined copy.
void putBytes(std::vector<uint8_t>* out, const void* data, size_t bytes) {
  if (bytes == 0) return;
  const size_t at = out->size();
  out->resize(at + bytes);
  std::memcpy(out->data() + at, data, bytes);
}
std::vector<uint8_t> lengthPrefixed(const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out;
  putU32(&out, static_cast<uint32_t>(body.size()));
  putBytes(&out, body.data(), body.size());
  return out;
}

bool Reader::text(size_t bytes, std::string* out) {
  if (bytes > left_) return false;
  out->assign(reinterpret_cast<const char*>(data_), bytes);
  data_ += bytes, left_ -= bytes;
  return true;
}

bool plausibleAddress(const std::string& text) {
  std::string host;
  int port;
  if (text.empty() || text.size() > kMaxAddressBytes) return false;
  for (char c : text)
    if (c < 0x21 || c > 0x7e) return false;
  return splitHostPort(text, &host, &port) && port != 0;
}

std::string printable(std::string text) {
  for (char& c : text)
    if (c < 0x20 || c > 0x7e) c = '?';
  return text;
}

std::vector<uint8_t> encodeUniqueId(const UniqueIdInfo& info) {
  std::vector<uint8_t> bytes;
  putU32(&bytes, kIdMagic);
  bytes.push_back(static_cast<uint8_t>(kIdVersion));
  bytes.push_back(static_cast<uint8_t>(kIdVersion >> 8));
  bytes.resize(kIdSecretOffset, 0);
  putBytes(&bytes, info.secret, kSecretBytes);
  putBytes(&bytes, info.rootAddress.data(), std::min(info.rootAddress.size(), kMaxAddressBytes));
  bytes.resize(LOOM_UNIQUE_ID_BYTES, 0);
  return bytes;
}

std::string parseUniqueId(std::span<const uint8_t, LOOM_UNIQUE_ID_BYTES> bytes, UniqueIdInfo* info) {
  Reader in(bytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  in.u32(&magic), in.u16(&version);
  if (magic != kIdMagic) {
    return format("unique id starts with 0x%08x, expected 0x%08x: it is not from loomGetUniqueId or was corrupted",
                  magic, kIdMagic);
  }
  if (version != kIdVersion) {
    return format("unique id has format version %u, this library reads version %u", version, kIdVersion);
  }
  const uint8_t* address = bytes.data() + kIdAddressOffset;
  const void* nul = std::memchr(address, '\0', kMaxAddressBytes + 1);
  if (nul == nullptr) {
    return format("unique id's root address is not NUL-terminated within %zu bytes", kMaxAddressBytes + 1);
  }
  std::string text(reinterpret_cast<const char*>(address), static_cast<const char*>(nul));
  if (!plausibleAddress(text)) {
    return "unique id's root address \"" + printable(text) + "\" is not of the form host:port";
  }
  info->rootAddress = text;
  std::memcpy(info->secret, bytes.data() + kIdSecretOffset, kSecretBytes);
  return "";
}

std::vector<uint8_t> encodeRegistration(const Registration& registration) {
  std::vector<uint8_t> body;
  putU32(&body, kRegister);
  putU32(&body, static_cast<uint32_t>(registration.rank));
  putU32(&body, static_cast<uint32_t>(registration.nranks));
  putBytes(&body, registration.address.data(), registration.address.size());
  return lengthPrefixed(body);
}

std::string parseRegistration(std::span<const uint8_t> body, Registration* registration, bool* kindOk) {
  Reader in(body);
  uint32_t kind = 0, rank = 0, nranks = 0;
  std::string address;
  *kindOk = in.u32(&kind) && kind == kRegister;
  if (!*kindOk) return format("message kind %u where a registration (%u) was expected", kind, kRegister);
  if (!in.u32(&rank) || !in.u32(&nranks)) return format("a registration of %zu bytes, too short", body.size());
  in.text(in.left(), &address);
  const int r = static_cast<int>(rank), n = static_cast<int>(nranks);
  if (!plausibleAddress(address)) return "its listener address is not a printable host:port";
  if (n < 1 || n > kMaxRanks) return format("nranks %d is outside 1..%d", n, kMaxRanks);
  if (r < 0 || r >= n) return format("rank %d is outside 0..%d", r, n - 1);
  *registration = Registration{r, n, address};
  return "";
}

std::vector<uint8_t> encodeTable(const std::vector<std::string>& addresses) {
  std::vector<uint8_t> body;
  putU32(&body, kTable);
  putU32(&body, static_cast<uint32_t>(addresses.size()));
  for (const std::string& address : addresses) {
    body.push_back(static_cast<uint8_t>(address.size()));
    body.push_back(static_cast<uint8_t>(address.size() >> 8));
    putBytes(&body, address.data(), address.size());
  }
  return lengthPrefixed(body);
}

std::vector<uint8_t> encodeReject(std::string_view reason) {
  std::vector<uint8_t> body;
  putU32(&body, kReject);
  putBytes(&body, reason.data(), std::min(reason.size(), kMaxRejectBytes));
  return lengthPrefixed(body);
}

size_t maxRootReplyBytes(int nranks) {
  return std::max(8 + static_cast<size_t>(nranks) * (2 + kMaxAddressBytes), 4 + kMaxRejectBytes);
}

std::string parseRootReply(std::span<const uint8_t> body, int nranks, RootReply* reply) {
  if (body.size() < 4 || body.size() > maxRootReplyBytes(nranks)) {
    return format("a %zu-byte reply; expected 4 to %zu bytes", body.size(), maxRootReplyBytes(nranks));
  }
  Reader in(body);
  uint32_t kind = 0, count = 0;
  in.u32(&kind);
  RootReply result;
  if (kind == kReject) {
    result.rejected = true;
    in.text(in.left(), &result.reason);
    result.reason = printable(std::move(result.reason));
    *reply = std::move(result);
    return "";
  }
  in.u32(&count);
  if (kind != kTable || count != static_cast<uint32_t>(nranks)) {
    return format("a reply of kind %u for %u ranks; expected a table (%u) of %d", kind, count, kTable, nranks);
  }
  result.addresses.resize(nranks);
  for (int r = 0; r < nranks; ++r) {
    uint16_t size = 0;
    if (!in.u16(&size) || !in.text(size, &result.addresses[r]) || !plausibleAddress(result.addresses[r])) {
      return format("a table with no valid address for rank %d", r);
    }
  }
  if (in.left() != 0) return format("a table with %zu bytes after its last address", in.left());
  *reply = std::move(result);
  return "";
}

std::vector<uint8_t> encodeHello(ConnKind kind, int from) {
  std::vector<uint8_t> hello;
  putU32(&hello, kind);
  putU32(&hello, static_cast<uint32_t>(from));
  return hello;
}

std::string parseHello(std::span<const uint8_t, kHelloBytes> bytes, int self, int nranks, uint32_t* kind, int* from) {
  Reader in(bytes);
  uint32_t peer = 0;
  in.u32(kind), in.u32(&peer);
  *from = static_cast<int>(peer);
  if (*from < 0 || *from >= nranks || *from == self) return format("hello from invalid rank %d", *from);
  if (*kind != kRingConn && *kind != kP2pConn && *kind != kHandoffConn) {
    return format("hello of unknown kind %u from rank %d", *kind, *from);
  }
  return "";
}

std::vector<uint8_t> encodeFrameHeader(int tag, uint64_t bytes) {
  std::vector<uint8_t> header;
  putU32(&header, static_cast<uint32_t>(tag));
  putU32(&header, 0);
  putU64(&header, bytes);
  return header;
}

std::string parseFrameHeader(std::span<const uint8_t, kFrameHeaderBytes> header, int* tag, uint64_t* bytes) {
  Reader in(header);
  uint32_t rawTag = 0, zero = 0;
  in.u32(&rawTag), in.u32(&zero), in.u64(bytes);
  *tag = static_cast<int>(rawTag);
  if (zero != 0) return format("a frame header whose reserved word is %u, not 0", zero);
  if (*bytes > kMaxP2pBytes) return format("it declared a %llu-byte message", (unsigned long long)*bytes);
  return "";
}

}  // namespace loom::bootwire
