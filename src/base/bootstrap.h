// Bootstrap: how the ranks of a new communicator find each other and exchange setup data out of band.
//
// loomGetUniqueId opens a rendezvous listener (the "root") in a background thread of the calling process and
// packs its address with a fresh 128-bit secret into the id. Each rank opens its own listener, connects to the
// root, proves it knows the secret (challenge-response with SipHash keyed by the secret) and sends its rank and
// listener address; the root answers every rank with the table of all addresses and exits. Ranks then keep a
// ring of authenticated TCP connections (to rank+1, from rank-1) for allGather/barrier, and open authenticated
// point-to-point connections on demand for send/recv. A handoff connection is authenticated the same way and
// then given, socket and all, to whoever asked for it (the tcp transport's data connections). Every read has the caller's deadline and abort flag.
// Nothing here knows about transports or collectives.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "loom/loom.h"
#include "src/base/socket.h"
#include "src/base/wait.h"

namespace loom {

constexpr size_t kSecretBytes = 16;
// What the opener of a handoff connection tells its new owner on the accepting side.
constexpr size_t kHandoffHelloBytes = 16;

// The kind of a handoff connection: the first 4 bytes of its hello, little-endian.
inline uint32_t handoffKind(const uint8_t* hello) {
  return static_cast<uint32_t>(hello[0]) | static_cast<uint32_t>(hello[1]) << 8 | static_cast<uint32_t>(hello[2]) << 16 |
         static_cast<uint32_t>(hello[3]) << 24;
}

// What a loomUniqueId holds (it is packed into loomUniqueId::internal).
struct UniqueIdInfo {
  std::string rootAddress;  // "host:port" or "[v6]:port" of the root listener
  uint8_t secret[kSecretBytes];
};

loomResult_t packUniqueId(const UniqueIdInfo& info, loomUniqueId* id);
loomResult_t unpackUniqueId(const loomUniqueId& id, UniqueIdInfo* info);

// loomGetUniqueId: picks the listen address (LOOM_SOCKET_IFNAME), draws the secret from getrandom(), starts the
// root thread and fills *id.
loomResult_t createUniqueId(loomUniqueId* id);
// For loomCommInitFromEnv on rank 0: starts the root thread listening on `address` ("host:port") with `secret`.
loomResult_t startRoot(const UniqueIdInfo& info);

class Bootstrap {
 public:
  // Joins the rendezvous named by `id` as rank `rank` of `nranks`. Fails with loomTimeout past `deadline`,
  // (abortFlag, which may be null, is kept: every later call checks it too)
  // loomRemoteError when *abortFlag turns true, or a clear message when the root rejects the rank.
  static loomResult_t create(const loomUniqueId& id, int rank, int nranks, const Deadline& deadline,
                             const std::atomic<bool>* abortFlag, std::unique_ptr<Bootstrap>* out);
  ~Bootstrap();

  int rank() const;
  int nranks() const;
  // Where this rank's listener listens ("10.0.0.1:5000"), which its peers reach it at.
  std::string listenAddress() const;
  // 64 bits derived from the secret: the same on every rank of the communicator, unguessable by others. Used
  // to name shared-memory segments.
  uint64_t commHash() const;

  // Every rank contributes `bytesPerRank` bytes at data + rank*bytesPerRank; on return all slots are filled.
  loomResult_t allGather(void* data, size_t bytesPerRank, int64_t timeoutMs);
  loomResult_t barrier(int64_t timeoutMs);
  // Point-to-point messages matched by (peer, tag), in order per (peer, tag). A recv of a message of another
  // size fails with loomInternalError.
  loomResult_t send(int peer, int tag, const void* data, size_t bytes, int64_t timeoutMs);
  loomResult_t recv(int peer, int tag, void* data, size_t bytes, int64_t timeoutMs);

  // Opens a new authenticated connection to `peer`'s listener and sends `hello`; the socket is then the caller's.
  loomResult_t connectHandoff(int peer, const uint8_t hello[kHandoffHelloBytes], int64_t timeoutMs, UniqueFd* out);
  // Handoff connections whose hello starts with `kind` (handoffKind: each transport has its own) that reach this
  // rank go to `handler` (called on the listener's thread; it must not block), those that came before it was set
  // first. An empty handler keeps later ones of that kind waiting for the next. Once this returns, the handler it
  // replaced is no longer running.
  using HandoffFn = std::function<void(int peer, const uint8_t* hello, UniqueFd fd)>;
  void setHandoffHandler(uint32_t kind, HandoffFn handler);

  // "; this rank's bootstrap listener could not accept a connection: <why>" for the first time it could not, or ""
  // while it always could: a peer's connection may then be waiting unanswered, so errors that follow add it.
  std::string listenerNote() const;

 private:
  struct Impl;
  explicit Bootstrap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom
